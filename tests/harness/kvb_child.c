/* Child processes of the cluster harness: this executable run with --child,
 * driven by lines on its stdin, answering on its stdout. The children:
 *
 *  prefill            bootstrap server + prefill rank: "boot ADDR"
 *  bprefill BOOT      prefill rank registered with BOOT: "prefill ENDPOINT"
 *     commands of both: "rooms FIRST COUNT N" (a sender per room, pages
 *     filled, the first half sent; "sent"), "full FIRST COUNT N" (every page;
 *     "sent"), "rest" (the second halves of the last command's rooms, then
 *     "rest S..." with each sender's outcome), "later DELAY" (a thread sends
 *     them after DELAY s: "armed", then "late S..."). At EOF bprefill
 *     destroys everything and answers "destroyed SECONDS" (the manager's
 *     destroy); prefill just exits.
 *  decode BOOT MEMFD FIRST COUNT N   decode rank (arena in MEMFD, -1 malloc)
 *     with receivers for rooms FIRST..: "ready SESSION", then "room R STATUS
 *     reason" as each ends and "done" (all ended, 60 s, or EOF); exits at EOF.
 *  bootsrv PORT       a bootstrap server alone: "boot ADDR"; exits at EOF.
 *
 *  prefill and bprefill also answer "lane SID" with "lane D" (D:
 *  kvb_engine_session_direct towards the engine at SID: which lane it took).
 *
 * Geometry: KVBH_CHILD_GEOM, or what the parent set with kvbh_child_geom_set
 * before the spawn (KVBH_GEOM in the environment). Pages: kvbh_src_page /
 * kvbh_dst_page of it, aux kvbh_room_aux. */
#include "kvb_cluster.h"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

const kvbh_geom_t KVBH_CHILD_GEOM = {2, 2, 32, 4, 256, 0, 0};

void kvbh_child_geom_set(const kvbh_geom_t *g)
{
    char v[128];
    snprintf(v, sizeof(v), "%d,%d,%d,%d,%llu", g->layers, g->heads, g->head_bytes, g->page,
             (unsigned long long)g->pool_pages);
    setenv("KVBH_GEOM", v, 1);
}

kvbh_geom_t kvbh_child_geom(void)
{
    kvbh_geom_t g = KVBH_CHILD_GEOM;
    const char *v = getenv("KVBH_GEOM");
    unsigned long long pool;
    if (v != NULL &&
        sscanf(v, "%d,%d,%d,%d,%llu", &g.layers, &g.heads, &g.head_bytes, &g.page, &pool) == 5)
        g.pool_pages = pool;
    return g;
}

static const char *g_self;

/* ---- process plumbing ---- */

int kvbh_main_init(int argc, char **argv)
{
    char pid[24];
    if (argc >= 2 && strcmp(argv[1], "--child") == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        /* the parent died before prctl: do not live on as an orphan */
        const char *parent = getenv("KVBH_PARENT");
        if (parent != NULL && getppid() != (pid_t)atol(parent))
            exit(9);
        return 1;
    }
    g_self = argv[0];
    signal(SIGPIPE, SIG_IGN);
    /* UCX logs to stdout unless told otherwise (read when its library
     * loads, so for the children): there the children answer the test, and
     * an endpoint error once took the place of a reply (test_fault8_netcut
     * in CI, 2026-12-02). */
    setenv("UCX_LOG_FILE", "/dev/stderr", 0);
    snprintf(pid, sizeof(pid), "%ld", (long)getpid());
    setenv("KVBH_PARENT", pid, 1);
    return 0;
}

int kvbh_child_spawn(kvbh_child_t *c, char *const args[])
{
    int in[2], out[2];
    char *argv[32];
    int n = 0;
    argv[n++] = (char *)g_self;
    argv[n++] = "--child";
    for (int i = 0; args[i] != NULL && n < 31; i++)
        argv[n++] = args[i];
    argv[n] = NULL;
    if (g_self == NULL || pipe2(in, O_CLOEXEC) != 0)
        return -1;
    if (pipe2(out, O_CLOEXEC) != 0) {
        close(in[0]);
        close(in[1]);
        return -1;
    }
    c->pid = fork();
    if (c->pid < 0)
        return -1;
    if (c->pid == 0) {
        dup2(in[0], 0);
        dup2(out[1], 1);
        execv(g_self, argv);
        _exit(127);
    }
    close(in[0]);
    close(out[1]);
    c->to = in[1];
    c->from = out[0];
    return 0;
}

int kvbh_child_line(kvbh_child_t *c, char *buf, size_t cap, double timeout_s)
{
    size_t n = 0;
    double end = kvbh_now() + timeout_s;
    while (n + 1 < cap) {
        struct pollfd pf = {c->from, POLLIN, 0};
        int ms = (int)((end - kvbh_now()) * 1000);
        if (ms <= 0 || poll(&pf, 1, ms) <= 0)
            return -1;
        if (read(c->from, buf + n, 1) != 1)
            return -1;
        if (buf[n] == '\n')
            break;
        n++;
    }
    buf[n] = '\0';
    return 0;
}

int kvbh_child_ask(kvbh_child_t *c, const char *cmd, const char *want, double timeout_s)
{
    char line[512];
    dprintf(c->to, "%s\n", cmd);
    if (kvbh_child_line(c, line, sizeof(line), timeout_s) != 0) {
        fprintf(stderr, "child: no answer to \"%s\"\n", cmd);
        return -1;
    }
    if (strcmp(line, want) != 0) {
        fprintf(stderr, "child answered \"%s\" to \"%s\"\n", line, cmd);
        return -1;
    }
    return 0;
}

void kvbh_child_kill(kvbh_child_t *c)
{
    if (c->pid > 0) {
        kill(c->pid, SIGKILL);
        waitpid(c->pid, NULL, 0);
        c->pid = 0;
        close(c->to);
        close(c->from);
    }
}

void kvbh_child_close(kvbh_child_t *c)
{
    if (c->pid > 0) {
        if (c->to >= 0)
            close(c->to); /* EOF on its stdin: it exits */
        double end = kvbh_now() + 10;
        while (waitpid(c->pid, NULL, WNOHANG) == 0 && kvbh_now() < end)
            kvbh_sleep(0.01);
        if (waitpid(c->pid, NULL, WNOHANG) == 0) {
            kill(c->pid, SIGKILL);
            waitpid(c->pid, NULL, 0);
        }
        c->pid = 0;
        close(c->from);
    }
}

/* Spawn args and read its first line "WORD VALUE" into val within 20 s. */
static int spawn_word(kvbh_child_t *c, char *const args[], const char *word, char *val, size_t cap)
{
    char line[256], fmt[48];
    snprintf(fmt, sizeof(fmt), "%s %%%zus", word, cap - 1);
    if (kvbh_child_spawn(c, args) != 0)
        return -1;
    if (kvbh_child_line(c, line, sizeof(line), 20) == 0 && sscanf(line, fmt, val) == 1)
        return 0;
    kvbh_child_kill(c);
    return -1;
}

int kvbh_spawn_prefill(kvbh_child_t *c, char *addr, size_t cap)
{
    char *args[] = {"prefill", NULL};
    return spawn_word(c, args, "boot", addr, cap);
}

int kvbh_spawn_bprefill(kvbh_child_t *c, const char *boot, char *ep, size_t cap)
{
    char *args[] = {"bprefill", (char *)boot, NULL};
    return spawn_word(c, args, "prefill", ep, cap);
}

int kvbh_spawn_decode(kvbh_child_t *c, const char *boot, int memfd, uint64_t first, int count,
                      int n)
{
    char fd[16], f[32], cnt[16], np[16], sid[128];
    char *args[] = {"decode", (char *)boot, fd, f, cnt, np, NULL};
    snprintf(fd, sizeof(fd), "%d", memfd);
    snprintf(f, sizeof(f), "%llu", (unsigned long long)first);
    snprintf(cnt, sizeof(cnt), "%d", count);
    snprintf(np, sizeof(np), "%d", n);
    return spawn_word(c, args, "ready", sid, sizeof(sid));
}

int kvbh_spawn_boot(kvbh_child_t *c, unsigned port, char *addr, size_t cap)
{
    char ps[16];
    char *args[] = {"bootsrv", ps, NULL};
    snprintf(ps, sizeof(ps), "%u", port);
    for (int tries = 0; tries < 30; tries++) {
        if (spawn_word(c, args, "boot", addr, cap) == 0)
            return 0;
        kvbh_sleep(0.1);
    }
    return -1;
}

void kvbh_wait_stopped(pid_t pid)
{
    char path[64], buf[512];
    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    for (int i = 0; i < 2000; i++) {
        FILE *f = fopen(path, "r");
        size_t n = f != NULL ? fread(buf, 1, sizeof(buf) - 1, f) : 0;
        if (f != NULL)
            fclose(f);
        buf[n] = '\0';
        const char *rp = strrchr(buf, ')');
        if (rp != NULL && (rp[2] == 'T' || rp[2] == 't'))
            return;
        usleep(1000);
    }
}

long kvbh_rss_kib(pid_t pid)
{
    char path[64], line[256];
    long v = -1;
    snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return -1;
    while (fgets(line, sizeof(line), f) != NULL)
        if (sscanf(line, "VmRSS: %ld", &v) == 1)
            break;
    fclose(f);
    return v;
}

int kvbh_count_fds(void)
{
    int n = 0;
    DIR *d = opendir("/proc/self/fd");
    if (d == NULL)
        return -1;
    while (readdir(d) != NULL)
        n++;
    closedir(d);
    return n;
}

/* ---- the prefill children ---- */

/* The rooms of one "rooms"/"full" command. */
typedef struct batch {
    int b, e;       /* their senders */
    uint64_t first; /* the first room */
    int n;          /* pages per room */
} batch_t;

typedef struct pchild {
    kvbh_rank_t p;
    kvb_sender_h snd[KVBH_MAX_ROOMS];
    int ns;       /* senders created */
    batch_t last; /* the last command's rooms */
} pchild_t;

/* "later": the thread's own copy of the batch, so the command loop may go on. */
typedef struct later {
    pchild_t *pc;
    batch_t bt;
    double delay;
} later_t;

static void say_outcomes(pchild_t *pc, const batch_t *bt, const char *word, double wait_s)
{
    printf("%s", word);
    for (int j = bt->b; j < bt->e; j++)
        printf(" %s", kvb_poll_string(kvbh_wait_sender(pc->snd[j], wait_s)));
    printf("\n");
    fflush(stdout);
}

/* The second halves of the batch's rooms. */
static void second_halves(pchild_t *pc, const batch_t *bt)
{
    for (int j = bt->b; j < bt->e; j++) {
        int32_t src[KVBH_MAX_PAGES];
        kvbh_room_pages(&pc->p.g, bt->first + (uint64_t)(j - bt->b), bt->n, src, NULL);
        if (pc->snd[j] != NULL)
            kvb_sender_send(pc->snd[j], src + bt->n / 2, (size_t)(bt->n - bt->n / 2));
    }
}

static void *later_main(void *arg)
{
    later_t *l = arg;
    kvbh_sleep(l->delay); /* CLOCK_MONOTONIC runs on while the process is stopped */
    second_halves(l->pc, &l->bt);
    say_outcomes(l->pc, &l->bt, "late", 5);
    return NULL;
}

/* A sender for room: pages filled, ready, the first half (or all) sent. */
static void one_room(pchild_t *pc, uint64_t room, int n, int whole)
{
    int32_t src[KVBH_MAX_PAGES];
    kvb_sender_h *s = &pc->snd[pc->ns++];
    kvbh_room_pages(&pc->p.g, room, n, src, NULL);
    kvbh_fill(&pc->p, room, src, n, kvbh_room_aux(room));
    if (kvb_sender_create(pc->p.mgr, "x", room, s) != KVB_OK ||
        kvbh_wait_sender_ready(*s, 10) != 0) {
        printf("error room %llu not ready\n", (unsigned long long)room);
        fflush(stdout);
        return;
    }
    kvb_sender_init(*s, (uint64_t)n, kvbh_room_aux(room));
    kvb_sender_send(*s, src, (size_t)(whole ? n : n / 2));
}

static void rooms_cmd(pchild_t *pc, const char *line)
{
    char cmd[32];
    unsigned long long first;
    int count, n;
    if (sscanf(line, "%31s %llu %d %d", cmd, &first, &count, &n) != 4 || n < 1 ||
        n > KVBH_MAX_PAGES || count < 0 || count > KVBH_MAX_ROOMS - pc->ns)
        return;
    pc->last.b = pc->ns;
    pc->last.first = first;
    pc->last.n = n;
    for (int j = 0; j < count; j++)
        one_room(pc, first + (uint64_t)j, n, strcmp(cmd, "full") == 0);
    pc->last.e = pc->ns;
    printf("sent\n");
    fflush(stdout);
}

static void prefill_loop(pchild_t *pc)
{
    char line[256];
    pthread_t thr;
    static later_t l;
    int have_thr = 0;
    while (fgets(line, sizeof(line), stdin) != NULL) {
        char sid[128];
        if (sscanf(line, "lane %127s", sid) == 1) {
            printf("lane %d\n", kvb_engine_session_direct(pc->p.eng, sid));
            fflush(stdout);
        } else if (strncmp(line, "rest", 4) == 0) {
            second_halves(pc, &pc->last);
            say_outcomes(pc, &pc->last, "rest", 10);
        } else if (!have_thr && sscanf(line, "later %lf", &l.delay) == 1) {
            l.pc = pc;
            l.bt = pc->last;
            have_thr = pthread_create(&thr, NULL, later_main, &l) == 0;
            printf("armed\n");
            fflush(stdout);
        } else {
            rooms_cmd(pc, line);
        }
    }
    if (have_thr)
        pthread_join(thr, NULL);
}

static int child_prefill(void)
{
    static pchild_t pc;
    kvbh_boot_t boot;
    if (kvbh_boot_start(&boot, 0, NULL) != 0)
        return 3;
    kvbh_geom_t g = kvbh_child_geom();
    if (kvbh_rank_start(&pc.p, &g, KVB_MODE_PREFILL, boot.addr, KVBH_MEM_MALLOC, NULL) != KVB_OK)
        return 4;
    printf("boot %s\n", boot.addr);
    fflush(stdout);
    prefill_loop(&pc);
    return 0;
}

static int child_bprefill(const char *boot)
{
    static pchild_t pc;
    kvbh_geom_t g = kvbh_child_geom();
    if (kvbh_rank_start(&pc.p, &g, KVB_MODE_PREFILL, boot, KVBH_MEM_MALLOC, NULL) != KVB_OK)
        return 4;
    printf("prefill %s\n", kvb_manager_endpoint(pc.p.mgr));
    fflush(stdout);
    prefill_loop(&pc);
    for (int j = 0; j < pc.ns; j++)
        kvb_sender_destroy(pc.snd[j]);
    double t0 = kvbh_now();
    kvb_manager_destroy(pc.p.mgr);
    pc.p.mgr = NULL;
    printf("destroyed %.3f\n", kvbh_now() - t0);
    fflush(stdout);
    kvbh_rank_stop(&pc.p);
    return 0;
}

/* ---- the decode child ---- */

static bool stdin_closed(void)
{
    struct pollfd pf = {0, POLLIN, 0};
    char c;
    return poll(&pf, 1, 0) == 1 && read(0, &c, 1) <= 0;
}

/* "room R STATUS reason" for each receiver as it ends; "done" at the end. */
static void report_rooms(kvb_receiver_h *rc, uint64_t first, int count)
{
    int done[KVBH_MAX_ROOMS] = {0}, left = count;
    double end = kvbh_now() + 60;
    while (left > 0 && kvbh_now() < end && !stdin_closed()) {
        for (int j = 0; j < count; j++) {
            kvb_poll_t p;
            char why[512] = "";
            if (done[j] ||
                ((p = kvb_receiver_poll(rc[j])) != KVB_POLL_SUCCESS && p != KVB_POLL_FAILED))
                continue;
            if (p == KVB_POLL_FAILED)
                kvb_receiver_failure(rc[j], why, sizeof(why));
            printf("room %llu %d %s\n", (unsigned long long)(first + (uint64_t)j), (int)p, why);
            fflush(stdout);
            done[j] = 1;
            left--;
        }
        kvbh_sleep(0.002);
    }
    printf("done\n");
    fflush(stdout);
}

static int child_decode(char **argv)
{
    const char *boot = argv[0];
    int memfd = atoi(argv[1]);
    uint64_t first = strtoull(argv[2], NULL, 10);
    int count = atoi(argv[3]), n = atoi(argv[4]);
    kvb_receiver_h rc[KVBH_MAX_ROOMS];
    kvbh_rank_t d;
    kvbh_geom_t g = kvbh_child_geom();
    char c;
    if (count < 0 || count > KVBH_MAX_ROOMS || n > KVBH_MAX_PAGES ||
        kvbh_rank_start(&d, &g, KVB_MODE_DECODE, NULL, memfd, NULL) != KVB_OK)
        return 3;
    if (kvbh_receivers(&d, boot, first, count, n, rc) != 0)
        return 4;
    printf("ready %s\n", kvb_engine_session_id(d.eng));
    fflush(stdout);
    report_rooms(rc, first, count);
    while (read(0, &c, 1) > 0)
        ;
    for (int j = 0; j < count; j++)
        kvb_receiver_destroy(rc[j]);
    kvbh_rank_stop(&d);
    return 0;
}

static int child_bootsrv(const char *port)
{
    kvbh_boot_t b;
    char c;
    if (kvbh_boot_start(&b, (unsigned)atoi(port), NULL) != 0)
        return 3;
    printf("boot %s\n", b.addr);
    fflush(stdout);
    while (read(0, &c, 1) > 0)
        ;
    kvbh_boot_stop(&b);
    return 0;
}

int kvbh_child_main(int argc, char **argv)
{
    if (argc >= 4 && strcmp(argv[2], "bootsrv") == 0)
        return child_bootsrv(argv[3]);
    if (argc >= 4 && strcmp(argv[2], "bprefill") == 0)
        return child_bprefill(argv[3]);
    if (argc >= 3 && strcmp(argv[2], "prefill") == 0)
        return child_prefill();
    if (argc >= 8 && strcmp(argv[2], "decode") == 0)
        return child_decode(argv + 3);
    return -1;
}
