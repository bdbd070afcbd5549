/* Issue 8 §3 "cut link": a prefill (bootstrap server + rank) in network
 * namespace A and a decode rank in namespace B, joined by a veth pair
 * (10.213.x.1/24 and 10.213.x.2/24, only inside the namespaces; the engines
 * use UCX over TCP). The A end is throttled with tc tbf where tc exists, so
 * the first halves of 4 rooms (4 MiB each) are still in flight when the link
 * is taken down (`ip link set <veth> down` in A); the second halves are sent
 * after the cut. Asserted: every room ends Failed on both sides within its
 * bound (decode: heartbeat interval × misses + 1 s; prefill: 2 × (transfer
 * time-out + peer time-out) + 5 s); after the link is back up a new room
 * succeeds (bytes verified); both children exit cleanly.
 *
 * Children are this executable run with --child; each joins its namespace
 * (setns on /var/run/netns/<name>) before it creates any socket or UCX
 * object. Namespaces (and with them the veth pair) are deleted in every exit
 * path: atexit, signal handlers, a watchdog alarm; stale ones of dead test
 * processes are removed at start. Where namespaces cannot be created (not
 * root, no iproute2, no CAP_NET_ADMIN) the test prints why and exits 77. */
#include "harness/kvb_cluster.h"
#include "harness/kvb_netns.h"
#include "kvb_test.h"

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

#define NPG 32  /* pages per room */
#define NROOM 4 /* rooms cut mid-transfer */
#define SLOTS 5 /* + the recovery room */
#define MAXS 16

static const kvbh_geom_t NG = {4, 8, 128, 16, SLOTS *NPG, 0, 0}; /* 16 KiB items, 4 MiB rooms */
static const double HB_INTERVAL = 0.2, XFER_TO = 1.0, PEER_TO = 0.5;
static const int HB_MISSES = 2;

static int32_t dst_page(int slot, int i)
{
    return slot * NPG + i;
}

static int32_t src_page(int slot, int i)
{
    return slot * NPG + NPG - 1 - i;
}

/* ---- a rank bound to a given address, UCX over TCP ---- */

static int nrank_start(kvbh_rank_t *r, kvb_mode_t mode, const char *ip, const char *boot,
                       int with_hb)
{
    kvb_engine_params_t ep = {0};
    kvbh_knobs_t k = {0};
    ep.field_mask = KVB_ENGINE_PARAM_HOST | KVB_ENGINE_PARAM_TRANSPORT |
                    KVB_ENGINE_PARAM_PEER_TIMEOUT | KVB_ENGINE_PARAM_CONNECT_TIMEOUT;
    ep.host = ip;
    ep.transport = KVB_TRANSPORT_TCP;
    ep.peer_timeout_s = PEER_TO;
    ep.connect_timeout_s = 2.0;
    k.engine = &ep;
    k.host = ip;
    if (with_hb) {
        k.hb_interval = HB_INTERVAL;
        k.hb_misses = HB_MISSES;
    }
    if (kvbh_rank_start(r, &NG, mode, boot, KVBH_MEM_MALLOC, &k) != KVB_OK) {
        fprintf(stderr, "netcut: rank start on %s failed\n", ip);
        return -1;
    }
    return 0;
}

/* ---- children ---- */

static void say(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    fflush(stdout);
}

static void slow_step(const char *what, double *t0)
{
    double t = kvbh_now();
    if (t - *t0 > 1.0)
        fprintf(stderr, "netcut: SLOW SHUT-DOWN: %s took %.2f s\n", what, t - *t0);
    *t0 = t;
}

/* One line "end T_LAST NFAIL NSUCC NOPEN reason" once every handle is
 * terminal or timeout_s passed (T_LAST: CLOCK_MONOTONIC of the last end). */
static void report_end(int is_send, void **h, int n, double timeout_s)
{
    double end = kvbh_now() + timeout_s, t_last = 0;
    int done[MAXS] = {0}, nf = 0, ns = 0, left = n;
    char why[400] = "-";
    while (left > 0 && kvbh_now() < end) {
        for (int j = 0; j < n; j++) {
            kvb_poll_t p = is_send ? kvb_sender_poll((kvb_sender_h)h[j]) : kvb_receiver_poll(h[j]);
            if (done[j] || (p != KVB_POLL_FAILED && p != KVB_POLL_SUCCESS))
                continue;
            done[j] = 1;
            left--;
            t_last = kvbh_now();
            if (p == KVB_POLL_SUCCESS) {
                ns++;
                continue;
            }
            if (nf++ == 0) {
                if (is_send)
                    kvb_sender_failure((kvb_sender_h)h[j], why, sizeof(why));
                else
                    kvb_receiver_failure(h[j], why, sizeof(why));
            }
        }
        kvbh_sleep(0.002);
    }
    for (char *c = why; *c; c++)
        if (*c == '\n')
            *c = ' ';
    say("end %.6f %d %d %d %s\n", t_last, nf, ns, left, why);
}

/* argv: NS IP VETH. Commands: "rooms R0 COUNT" (senders, first halves;
 * "sent"), "rest" (second halves; "rest"), "wait T" (report_end), "full R
 * SLOT T" (one whole room; "full STATUS reason"). */
static int child_prefill(char **argv)
{
    if (kvbh_netns_join("netcut child", argv[0]) != 0)
        return 5;
    setenv("UCX_NET_DEVICES", argv[2], 1);
    const char *ip = argv[1];
    kvb_bootstrap_server_params_t bp = {.field_mask = KVB_BOOTSTRAP_SERVER_PARAM_PORT |
                                                      KVB_BOOTSTRAP_SERVER_PARAM_HOST,
                                        .host = ip};
    kvb_bootstrap_server_h boot;
    kvbh_rank_t p;
    kvb_sender_h snd[MAXS] = {0};
    int count = 0;
    unsigned long long r0 = 0;
    char line[256];
    if (kvb_bootstrap_server_start(&bp, &boot) != KVB_OK)
        return 3;
    if (nrank_start(&p, KVB_MODE_PREFILL, ip, kvb_bootstrap_server_address(boot), 0) != 0)
        return 4;
    say("boot %s\n", kvb_bootstrap_server_address(boot));
    while (fgets(line, sizeof(line), stdin) != NULL) {
        unsigned long long r;
        int slot, c;
        double t;
        if (sscanf(line, "rooms %llu %d", &r, &c) == 2 && c <= MAXS) {
            r0 = r;
            count = c;
            for (int j = 0; j < count; j++) {
                int32_t src[NPG];
                for (int i = 0; i < NPG; i++)
                    src[i] = src_page(j, i);
                kvbh_fill(&p, r0 + (uint64_t)j, src, NPG,
                          (int)((r0 + (uint64_t)j) % KVBH_AUX_ITEMS));
                if (kvb_sender_create(p.mgr, "x", r0 + (uint64_t)j, &snd[j]) != KVB_OK ||
                    kvbh_wait_sender_ready(snd[j], 10) != 0) {
                    say("error room %llu not ready\n", r0 + (unsigned long long)j);
                    continue;
                }
                kvb_sender_init(snd[j], NPG, (int64_t)((r0 + (uint64_t)j) % KVBH_AUX_ITEMS));
                kvb_sender_send(snd[j], src, NPG / 2);
            }
            say("sent\n");
        } else if (strncmp(line, "rest", 4) == 0) {
            for (int j = 0; j < count; j++) {
                int32_t src[NPG];
                for (int i = 0; i < NPG; i++)
                    src[i] = src_page(j, i);
                if (snd[j] != NULL)
                    kvb_sender_send(snd[j], src + NPG / 2, NPG - NPG / 2);
            }
            say("rest\n");
        } else if (sscanf(line, "wait %lf", &t) == 1) {
            report_end(1, (void **)snd, count, t);
        } else if (sscanf(line, "full %llu %d %lf", &r, &slot, &t) == 3) {
            int32_t src[NPG];
            kvb_sender_h s = NULL;
            char why[400] = "-";
            kvb_poll_t st = KVB_POLL_FAILED;
            for (int i = 0; i < NPG; i++)
                src[i] = src_page(slot, i);
            kvbh_fill(&p, r, src, NPG, (int)(r % KVBH_AUX_ITEMS));
            if (kvb_sender_create(p.mgr, "x", r, &s) == KVB_OK &&
                kvbh_wait_sender_ready(s, t) == 0) {
                kvb_sender_init(s, NPG, (int64_t)(r % KVBH_AUX_ITEMS));
                kvb_sender_send(s, src, NPG / 2);
                kvb_sender_send(s, src + NPG / 2, NPG - NPG / 2);
                st = kvbh_wait_sender(s, t);
            }
            if (s != NULL && st == KVB_POLL_FAILED)
                kvb_sender_failure(s, why, sizeof(why));
            say("full %s %s\n", kvb_poll_string(st), why);
            kvb_sender_destroy(s);
        }
    }
    /* shut-down steps, each timed (a step over 1 s is reported) */
    double t0 = kvbh_now();
    for (int j = 0; j < count; j++)
        kvb_sender_destroy(snd[j]);
    slow_step("prefill: sender destroy", &t0);
    kvb_manager_destroy(p.mgr);
    p.mgr = NULL;
    slow_step("prefill: manager destroy", &t0);
    kvb_engine_destroy(p.eng);
    p.eng = NULL;
    slow_step("prefill: engine destroy", &t0);
    kvbh_rank_stop(&p);
    kvb_bootstrap_server_stop(boot);
    slow_step("prefill: bootstrap server stop", &t0);
    return 0;
}

/* argv: NS IP VETH BOOT. Commands: "recv R0 COUNT" ("ready"), "wait T"
 * (report_end), "one R SLOT" ("ready"), "wait1 T" ("one STATUS BAD reason"). */
static int child_decode(char **argv)
{
    if (kvbh_netns_join("netcut child", argv[0]) != 0)
        return 5;
    setenv("UCX_NET_DEVICES", argv[2], 1);
    const char *boot = argv[3];
    kvbh_rank_t d;
    kvb_receiver_h rc[MAXS] = {0}, one = NULL;
    int count = 0, one_slot = 0;
    unsigned long long one_room = 0;
    char line[256];
    if (nrank_start(&d, KVB_MODE_DECODE, argv[1], NULL, 1) != 0)
        return 4;
    say("up %s\n", kvb_engine_session_id(d.eng));
    while (fgets(line, sizeof(line), stdin) != NULL) {
        unsigned long long r;
        int c;
        double t;
        if (sscanf(line, "recv %llu %d", &r, &c) == 2 && c <= MAXS) {
            count = c;
            for (int j = 0; j < count; j++) {
                int32_t dst[NPG];
                for (int i = 0; i < NPG; i++)
                    dst[i] = dst_page(j, i);
                if (kvb_receiver_create(d.mgr, boot, r + (uint64_t)j, -1, &rc[j]) != KVB_OK)
                    return 6;
                kvb_receiver_init(rc[j], dst, NPG, (int64_t)((r + (uint64_t)j) % KVBH_AUX_ITEMS),
                                  NULL);
            }
            say("ready\n");
        } else if (strncmp(line, "wait ", 5) == 0 && sscanf(line, "wait %lf", &t) == 1) {
            report_end(0, (void **)rc, count, t);
        } else if (sscanf(line, "one %llu %d", &one_room, &one_slot) == 2) {
            int32_t dst[NPG];
            for (int i = 0; i < NPG; i++)
                dst[i] = dst_page(one_slot, i);
            kvb_receiver_destroy(one); /* the previous single room, if any */
            one = NULL;
            if (kvb_receiver_create(d.mgr, boot, one_room, -1, &one) != KVB_OK)
                return 6;
            kvb_receiver_init(one, dst, NPG, (int64_t)(one_room % KVBH_AUX_ITEMS), NULL);
            say("ready\n");
        } else if (sscanf(line, "wait1 %lf", &t) == 1 && one != NULL) {
            int32_t dst[NPG];
            char why[400] = "-";
            for (int i = 0; i < NPG; i++)
                dst[i] = dst_page(one_slot, i);
            kvb_poll_t st = kvbh_wait_receiver(one, t);
            uint64_t bad = st == KVB_POLL_SUCCESS ? kvbh_verify(&d, one_room, dst, NPG,
                                                                (int)(one_room % KVBH_AUX_ITEMS))
                                                  : 0;
            if (st == KVB_POLL_FAILED)
                kvb_receiver_failure(one, why, sizeof(why));
            say("one %s %llu %d %s\n", kvb_poll_string(st), (unsigned long long)bad,
                kvbh_canaries_ok(&d, "decode") ? 1 : 0, why);
        }
    }
    double t0 = kvbh_now();
    for (int j = 0; j < count; j++)
        kvb_receiver_destroy(rc[j]);
    kvb_receiver_destroy(one);
    slow_step("decode: receiver destroy", &t0);
    kvbh_rank_stop(&d);
    slow_step("decode: manager and engine destroy", &t0);
    return 0;
}

/* ---- parent: namespaces, veth, clean-up in every exit path ---- */

static kvbh_child_t g_chP, g_chD;

static int wait_exit(kvbh_child_t *c, double timeout_s)
{
    int status = -1;
    close(c->to);
    double end = kvbh_now() + timeout_s;
    pid_t w = 0;
    while ((w = waitpid(c->pid, &status, WNOHANG)) == 0 && kvbh_now() < end)
        kvbh_sleep(0.01);
    if (w != c->pid) {
        fprintf(stderr, "netcut: HANG: child %d did not exit within %.0f s of EOF\n", (int)c->pid,
                timeout_s);
        if (getenv("KVB_NETCUT_GDB") != NULL) /* its threads' stacks, for the report */
            kvbh_sh("gdb -p %d -batch -ex 'thread apply all bt' 2>/dev/null | grep -E '^#|^Thread' "
                    ">&2",
                    (int)c->pid);
        kill(c->pid, SIGKILL);
        waitpid(c->pid, NULL, 0);
        status = -1;
    }
    c->pid = 0;
    close(c->from);
    return status;
}

/* A side's "end" report after the cut: every room Failed, the last one
 * within bound seconds of t_cut. */
static void expect_all_failed(kvbh_child_t *ch, const char *side, double t_cut, double bound)
{
    char line[512], why[400];
    double t = 0;
    int nf, ns, no;
    CHECK_EQ(kvbh_child_line(ch, line, sizeof(line), bound + 20), 0);
    CHECK_EQ(sscanf(line, "end %lf %d %d %d %399[^\n]", &t, &nf, &ns, &no, why), 5);
    fprintf(stderr,
            "netcut: %s: %d Failed, %d Success, %d open; last %.3f s after the cut "
            "(bound %.2f s); reason: %s\n",
            side, nf, ns, no, t - t_cut, bound, why);
    CHECK_EQ(nf, NROOM);
    CHECK(t - t_cut <= bound);
}

static void test_netcut(void)
{
    char line[512], boot[128];
    int sub = (int)(getpid() % 250) + 1;
    char ipA[32], ipB[32];
    snprintf(ipA, sizeof(ipA), "10.213.%d.1", sub);
    snprintf(ipB, sizeof(ipB), "10.213.%d.2", sub);
    static kvbh_child_t *const children[] = {&g_chP, &g_chD};
    kvbh_netns_make("netcut", "kvbt", ipA, ipB, 100, children, 2);
    /* Throttle A's egress (the data direction) so the rooms are in flight
     * when the link is cut; optional. */
    int tbf =
        kvbh_sh("ip netns exec %s tc qdisc add dev %s root tbf rate 100mbit burst 64kb latency "
                "100ms 2>/dev/null",
                kvbh_ns.nsA, kvbh_ns.vA) == 0;
    if (kvbh_netns_wait_carrier(10) != 0)
        kvbh_netns_skip("netcut", "the veth pair got no carrier within 10 s");
    fprintf(stderr, "netcut: %s %s/%s <-> %s %s/%s, tbf %s\n", kvbh_ns.nsA, kvbh_ns.vA, ipA,
            kvbh_ns.nsB, kvbh_ns.vB, ipB, tbf ? "100 mbit/s" : "not available (unthrottled)");

    setenv("KVBRIDGE_TRANSFER_TIMEOUT", "1.0", 1);
    setenv("KVBRIDGE_PEER_TIMEOUT", "0.5", 1);
    setenv("KVBRIDGE_SESSION_BACKOFF", "0.5", 1);
    setenv("KVBRIDGE_TRANSPORT", "tcp", 1);
    /* A cut link holds rendezvous receives open: their rooms' grants do not
     * drain, so poll() holds those rooms (Transferring) until the
     * quarantine bound (KVBRIDGE_ABORT_ACK_TIMEOUT) and then reports them
     * Failed with unsafe pages; the others end within the heartbeat bound. */
    setenv("KVBRIDGE_FENCE_WAIT", "0.3", 1);
    setenv("KVBRIDGE_ABORT_ACK_TIMEOUT", "2.0", 1);
    const double dec_bound = HB_INTERVAL * HB_MISSES + 1.0 + 0.3 + 2.0;
    const double pre_bound = 2 * (XFER_TO + PEER_TO) + 5.0;
    const unsigned long long R0 = 700, RR = 800;

    char *pargs[] = {"nsprefill", kvbh_ns.nsA, ipA, kvbh_ns.vA, NULL};
    CHECK_EQ(kvbh_child_spawn(&g_chP, pargs), 0);
    /* the decode child must not inherit the prefill's pipes (else the
     * prefill never sees EOF on its stdin) */
    fcntl(g_chP.to, F_SETFD, FD_CLOEXEC);
    fcntl(g_chP.from, F_SETFD, FD_CLOEXEC);
    CHECK_EQ(kvbh_child_line(&g_chP, line, sizeof(line), 20), 0);
    CHECK_EQ(sscanf(line, "boot %127s", boot), 1);
    char *dargs[] = {"nsdecode", kvbh_ns.nsB, ipB, kvbh_ns.vB, boot, NULL};
    CHECK_EQ(kvbh_child_spawn(&g_chD, dargs), 0);
    CHECK_EQ(kvbh_child_line(&g_chD, line, sizeof(line), 20), 0);
    CHECK(strncmp(line, "up ", 3) == 0);
    fprintf(stderr, "netcut: bootstrap %s, decode engine %s\n", boot, line + 3);

    /* a warm room through the link first: the path works before the cut */
    dprintf(g_chD.to, "one %llu %d\n", RR - 1, NROOM);
    CHECK_EQ(kvbh_child_line(&g_chD, line, sizeof(line), 20), 0);
    CHECK(strcmp(line, "ready") == 0);
    double tw = kvbh_now();
    dprintf(g_chP.to, "full %llu %d 15\n", RR - 1, NROOM);
    dprintf(g_chD.to, "wait1 15\n");
    CHECK_EQ(kvbh_child_line(&g_chP, line, sizeof(line), 25), 0);
    fprintf(stderr, "netcut: warm room prefill: %s\n", line);
    CHECK(strncmp(line, "full Success", 12) == 0);
    CHECK_EQ(kvbh_child_line(&g_chD, line, sizeof(line), 25), 0);
    fprintf(stderr, "netcut: warm room decode: %s (%.3f s, 4 MiB)\n", line, kvbh_now() - tw);
    CHECK(strncmp(line, "one Success 0 1", 15) == 0);

    /* 4 rooms, first halves (2 MiB each) in flight, then the cut */
    dprintf(g_chD.to, "recv %llu %d\n", R0, NROOM);
    CHECK_EQ(kvbh_child_line(&g_chD, line, sizeof(line), 20), 0);
    CHECK(strcmp(line, "ready") == 0);
    dprintf(g_chP.to, "rooms %llu %d\n", R0, NROOM);
    CHECK_EQ(kvbh_child_line(&g_chP, line, sizeof(line), 30), 0);
    CHECK(strcmp(line, "sent") == 0);
    kvbh_sleep(0.15);
    double t_cut0 = kvbh_now();
    CHECK_EQ(kvbh_sh("ip -n %s link set %s down", kvbh_ns.nsA, kvbh_ns.vA), 0);
    double t_cut = kvbh_now();
    fprintf(stderr, "netcut: link %s down (%.3f s to run ip)\n", kvbh_ns.vA, t_cut - t_cut0);
    dprintf(g_chP.to, "rest\n");
    CHECK_EQ(kvbh_child_line(&g_chP, line, sizeof(line), 10), 0);
    CHECK(strcmp(line, "rest") == 0);
    dprintf(g_chD.to, "wait %.1f\n", dec_bound + 10);
    dprintf(g_chP.to, "wait %.1f\n", pre_bound + 10);
    expect_all_failed(&g_chD, "decode", t_cut, dec_bound);
    expect_all_failed(&g_chP, "prefill", t_cut, pre_bound);

    /* link back up: a new room goes through (bytes verified) */
    CHECK_EQ(kvbh_sh("ip -n %s link set %s up", kvbh_ns.nsA, kvbh_ns.vA), 0);
    double t_up = kvbh_now();
    CHECK_EQ(kvbh_netns_wait_carrier(10), 0);
    fprintf(stderr, "netcut: link %s up, carrier after %.3f s\n", kvbh_ns.vA, kvbh_now() - t_up);
    dprintf(g_chD.to, "one %llu %d\n", RR, NROOM);
    CHECK_EQ(kvbh_child_line(&g_chD, line, sizeof(line), 20), 0);
    CHECK(strcmp(line, "ready") == 0);
    dprintf(g_chP.to, "full %llu %d 20\n", RR, NROOM);
    dprintf(g_chD.to, "wait1 20\n");
    char lp[512];
    CHECK_EQ(kvbh_child_line(&g_chP, lp, sizeof(lp), 30), 0);
    CHECK_EQ(kvbh_child_line(&g_chD, line, sizeof(line), 30), 0);
    fprintf(stderr, "netcut: after link up: prefill %s; decode %s (%.3f s after up)\n", lp, line,
            kvbh_now() - t_up);
    CHECK(strncmp(lp, "full Success", 12) == 0);
    CHECK(strncmp(line, "one Success 0 1", 15) == 0);

    /* both children end cleanly on EOF */
    int sp = wait_exit(&g_chP, 10), sd = wait_exit(&g_chD, 10);
    fprintf(stderr, "netcut: children exit: prefill %d, decode %d\n",
            sp >= 0 && WIFEXITED(sp) ? WEXITSTATUS(sp) : -1,
            sd >= 0 && WIFEXITED(sd) ? WEXITSTATUS(sd) : -1);
    CHECK(sp >= 0 && WIFEXITED(sp) && WEXITSTATUS(sp) == 0);
    CHECK(sd >= 0 && WIFEXITED(sd) && WEXITSTATUS(sd) == 0);
    kvbh_netns_cleanup();
    TEST_PASS("cut link: rooms Failed on both sides within the bounds, new room after link up");
}

int main(int argc, char **argv)
{
    setenv("KVBRIDGE_HEARTBEAT_FLOOR", "0.2", 1);
    if (kvbh_main_init(argc, argv)) {
        if (argc >= 6 && strcmp(argv[2], "nsprefill") == 0)
            return child_prefill(argv + 3);
        if (argc >= 7 && strcmp(argv[2], "nsdecode") == 0)
            return child_decode(argv + 3);
        return 2;
    }
    test_netcut();
    return 0;
}
