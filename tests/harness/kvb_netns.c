/* Two network namespaces joined by a veth pair (kvb_netns.h). */
#include "harness/kvb_netns.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

kvbh_netns_t kvbh_ns;
static char g_tag[8];
static kvbh_child_t *const *g_children;
static size_t g_nchildren;
static volatile sig_atomic_t g_made, g_cleaning;

int kvbh_sh(const char *fmt, ...)
{
    char cmd[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof(cmd), fmt, ap);
    va_end(ap);
    int rc = system(cmd);
    return rc == -1 ? -1 : WIFEXITED(rc) ? WEXITSTATUS(rc) : 128;
}

int kvbh_netns_join(const char *who, const char *name)
{
    char path[256];
    snprintf(path, sizeof(path), "/var/run/netns/%s", name);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0 || setns(fd, CLONE_NEWNET) != 0) {
        fprintf(stderr, "%s: setns %s: %s\n", who, path, strerror(errno));
        return -1;
    }
    close(fd);
    if (unshare(CLONE_NEWNS) != 0 || mount("", "/", NULL, MS_SLAVE | MS_REC, NULL) != 0 ||
        umount2("/sys", MNT_DETACH) != 0 || mount(name, "/sys", "sysfs", 0, NULL) != 0) {
        fprintf(stderr, "%s: remounting /sys: %s\n", who, strerror(errno));
        return -1;
    }
    return 0;
}

void kvbh_netns_cleanup(void)
{
    if (g_cleaning)
        return;
    g_cleaning = 1;
    for (size_t i = 0; i < g_nchildren; i++)
        if (g_children[i]->pid > 0)
            kvbh_child_kill(g_children[i]);
    if (g_made) {
        kvbh_sh("ip netns del %s 2>/dev/null", kvbh_ns.nsA);
        kvbh_sh("ip netns del %s 2>/dev/null", kvbh_ns.nsB);
        kvbh_sh("ip link del %s 2>/dev/null", kvbh_ns.vA); /* if left in the root namespace */
        g_made = 0;
    }
}

static void on_signal(int sig)
{
    kvbh_netns_cleanup();
    signal(sig, SIG_DFL);
    raise(sig);
    _exit(128 + sig);
}

void kvbh_netns_skip(const char *who, const char *why)
{
    fprintf(stderr, "%s: SKIPPED: %s\n", who, why);
    kvbh_netns_cleanup();
    exit(77);
}

/* Namespaces <tag>A_<pid> / <tag>B_<pid> of test processes that are gone. */
static void remove_stale(void)
{
    DIR *d = opendir("/var/run/netns");
    struct dirent *e;
    char fa[32], fb[32];
    snprintf(fa, sizeof(fa), "%sA_%%d%%c", g_tag);
    snprintf(fb, sizeof(fb), "%sB_%%d%%c", g_tag);
    if (d == NULL)
        return;
    while ((e = readdir(d)) != NULL) {
        int pid;
        char c;
        if ((sscanf(e->d_name, fa, &pid, &c) == 1 || sscanf(e->d_name, fb, &pid, &c) == 1) &&
            pid != getpid() && kill(pid, 0) != 0 && errno == ESRCH)
            kvbh_sh("ip netns del %s 2>/dev/null", e->d_name);
    }
    closedir(d);
}

int kvbh_netns_wait_carrier(double timeout_s)
{
    double end = kvbh_now() + timeout_s;
    while (kvbh_now() < end) {
        if (kvbh_sh("ip -n %s -o link show %s | grep -q 'state UP'", kvbh_ns.nsA, kvbh_ns.vA) ==
                0 &&
            kvbh_sh("ip -n %s -o link show %s | grep -q 'state UP'", kvbh_ns.nsB, kvbh_ns.vB) == 0)
            return 0;
        kvbh_sleep(0.02);
    }
    return -1;
}

static void names(const char *tag)
{
    int pid = (int)getpid();
    snprintf(g_tag, sizeof(g_tag), "%.5s", tag);
    snprintf(kvbh_ns.nsA, sizeof(kvbh_ns.nsA), "%sA_%d", g_tag, pid);
    snprintf(kvbh_ns.nsB, sizeof(kvbh_ns.nsB), "%sB_%d", g_tag, pid);
    snprintf(kvbh_ns.vA, sizeof(kvbh_ns.vA), "%sa%d", g_tag, pid);
    snprintf(kvbh_ns.vB, sizeof(kvbh_ns.vB), "%sb%d", g_tag, pid);
}

void kvbh_netns_make(const char *who, const char *tag, const char *ipA, const char *ipB,
                     unsigned watchdog_s, kvbh_child_t *const *children, size_t n)
{
    const kvbh_netns_t *ns = &kvbh_ns;
    g_children = children;
    g_nchildren = n;
    if (geteuid() != 0)
        kvbh_netns_skip(who, "not root (network namespaces need CAP_SYS_ADMIN and CAP_NET_ADMIN)");
    if (kvbh_sh("ip -V >/dev/null 2>&1") != 0)
        kvbh_netns_skip(who, "iproute2 ('ip') not found");
    names(tag);
    atexit(kvbh_netns_cleanup);
    int sigs[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGALRM, SIGSEGV, SIGABRT, SIGBUS};
    for (size_t i = 0; i < sizeof(sigs) / sizeof(sigs[0]); i++)
        signal(sigs[i], on_signal);
    alarm(watchdog_s);
    remove_stale();
    if (kvbh_sh("ip netns add %s", ns->nsA) != 0)
        kvbh_netns_skip(who, "'ip netns add' failed (no CAP_SYS_ADMIN / CAP_NET_ADMIN, or "
                             "/var/run/netns not writable)");
    g_made = 1;
    if (kvbh_sh("ip netns add %s", ns->nsB) != 0)
        kvbh_netns_skip(who, "'ip netns add' failed for the second namespace");
    if (kvbh_sh("ip link add %s netns %s type veth peer name %s netns %s 2>/dev/null", ns->vA,
                ns->nsA, ns->vB, ns->nsB) != 0 &&
        (kvbh_sh("ip link add %s type veth peer name %s", ns->vA, ns->vB) != 0 ||
         kvbh_sh("ip link set %s netns %s", ns->vA, ns->nsA) != 0 ||
         kvbh_sh("ip link set %s netns %s", ns->vB, ns->nsB) != 0))
        kvbh_netns_skip(who, "no veth pair (kernel without veth, or no CAP_NET_ADMIN)");
    if (kvbh_sh("ip -n %s link set lo up && ip -n %s link set lo up", ns->nsA, ns->nsB) != 0 ||
        kvbh_sh("ip -n %s addr add %s/24 dev %s && ip -n %s link set %s up", ns->nsA, ipA, ns->vA,
                ns->nsA, ns->vA) != 0 ||
        kvbh_sh("ip -n %s addr add %s/24 dev %s && ip -n %s link set %s up", ns->nsB, ipB, ns->vB,
                ns->nsB, ns->vB) != 0)
        kvbh_netns_skip(who, "could not configure the namespaces' links");
}
