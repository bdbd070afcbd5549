/* Review 3, F8: a message-lane send that completes with an error leaves the
 * window as "never placed". If UCX completes a failed endpoint's sends
 * before it calls the endpoint's error handler, a write whose messages
 * were all in flight at a transport failure would end "drained"
 * (kvb_xfer_drained 1) although the target may hold their bytes.
 *
 * The fault, made for real: a writer engine in network namespace A, a
 * target engine in B, joined by a veth pair (10.214.x.1/24, 10.214.x.2/24,
 * only inside the namespaces), UCX over TCP with peer-failure handling. A's
 * egress is throttled with tc tbf (100 mbit/s) so a 64 MiB write is in
 * flight (about 5 s) when, CUT_AFTER_S in, the test
 * - reset: kills A's UCX TCP sockets (`ss -K`, all but the control
 *   connection): UCX sees the transport fail and fails the endpoint itself
 *   (ucp_ep_set_failed, its error handler);
 * - linkdown: takes A's veth down: the control connection's time-out finds
 *   the peer lost first (the engine fails the connection, then closes the
 *   endpoint).
 * The writer child reports the order it observed (kvb__test_hooks: sends
 * that completed with an error while their transfer was still live, i.e.
 * before the connection's failure reached it, and after), the first such
 * UCX status, and the write's status and kvb_xfer_drained; the target
 * child how many bytes of the write landed. Asserted: the write fails
 * KVB_ERR_PEER within its bound, bytes landed and not all of them (the cut
 * came mid-write), and it is reported not drained (0).
 *
 * Children are this executable run with --child; each joins its namespace
 * before it creates any socket or UCX object. The namespaces are deleted in
 * every exit path (atexit, signals, a watchdog alarm); stale ones of dead
 * test processes are removed at start. Where namespaces cannot be created
 * (not root, no iproute2 or ss, no CAP_NET_ADMIN) the test says why and
 * exits 77 (skipped). */
#include "engine/engine_int.h"
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

#define LEN (64u << 20)
static const double PEER_TO = 0.5, CUT_AFTER_S = 0.5, END_BOUND_S = 15.0;

static uint8_t pattern(size_t i)
{
    return (uint8_t)(0x5a ^ (i * 131 + (i >> 16)));
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

static kvb_engine_h ns_engine(const char *ip)
{
    kvb_engine_params_t p = {.field_mask = KVB_ENGINE_PARAM_HOST | KVB_ENGINE_PARAM_TRANSPORT |
                                           KVB_ENGINE_PARAM_PEER_TIMEOUT |
                                           KVB_ENGINE_PARAM_COPY_THREADS,
                             .host = ip,
                             .transport = KVB_TRANSPORT_TCP,
                             .peer_timeout_s = PEER_TO,
                             .copy_threads = 0};
    kvb_engine_h e = NULL;
    return kvb_engine_create(&p, &e) == KVB_OK ? e : NULL;
}

/* argv: NS IP VETH. "up SID ADDR"; "landed" -> "landed N" (bytes of the
 * write in place). */
static int child_target(char **argv)
{
    char line[256];
    if (kvbh_netns_join("sendorder child", argv[0]) != 0)
        return 5;
    setenv("UCX_NET_DEVICES", argv[2], 1);
    kvb_engine_h e = ns_engine(argv[1]);
    uint8_t *dst = calloc(1, LEN);
    if (e == NULL || dst == NULL || kvb_engine_register(e, dst, LEN, KVB_MEM_HOST) != KVB_OK)
        return 4;
    say("up %s %llu\n", kvb_engine_session_id(e), (unsigned long long)(uintptr_t)dst);
    while (fgets(line, sizeof(line), stdin) != NULL) {
        if (strncmp(line, "landed", 6) == 0) {
            size_t n = 0;
            for (size_t i = 0; i < LEN; i++)
                n += dst[i] == pattern(i);
            say("landed %zu\n", n);
        }
    }
    _exit(0); /* no clean shut-down across a cut link: not what is tested */
}

/* argv: NS IP VETH. "up"; "write SID ADDR" -> "started"; "wait T" -> "end
 * STATUS DRAINED LIVE AFTER FIRST T_END | reason". */
static int child_writer(char **argv)
{
    char line[512], sid[256];
    unsigned long long addr;
    kvb_xfer_h x = NULL;
    if (kvbh_netns_join("sendorder child", argv[0]) != 0)
        return 5;
    setenv("UCX_NET_DEVICES", argv[2], 1);
    kvb_engine_h e = ns_engine(argv[1]);
    uint8_t *src = malloc(LEN);
    if (e == NULL || src == NULL)
        return 4;
    for (size_t i = 0; i < LEN; i++)
        src[i] = pattern(i);
    if (kvb_engine_register(e, src, LEN, KVB_MEM_HOST) != KVB_OK)
        return 4;
    say("up\n");
    while (fgets(line, sizeof(line), stdin) != NULL) {
        double t;
        if (sscanf(line, "write %255s %llu", sid, &addr) == 2) {
            kvb_block_t b = {(uint64_t)(uintptr_t)src, addr, LEN};
            kvb_status_t st = kvb_engine_write_async(e, sid, &b, 1, &x);
            say("started %s\n", kvb_status_string(st));
        } else if (sscanf(line, "wait %lf", &t) == 1 && x != NULL) {
            kvb_status_t st = kvb_xfer_wait(x, t);
            double t_end = kvbh_now();
            kvbh_sleep(0.5); /* the sends the engine's own close of the endpoint ends, counted */
            say("end %d %d %d %d %d %.6f | %s\n", (int)st, kvb_xfer_drained(x),
                __atomic_load_n(&kvb__test_hooks.am_send_err_live, __ATOMIC_RELAXED),
                __atomic_load_n(&kvb__test_hooks.am_send_err_after, __ATOMIC_RELAXED),
                __atomic_load_n(&kvb__test_hooks.am_send_err_first, __ATOMIC_RELAXED), t_end,
                kvb_xfer_error(x));
        }
    }
    _exit(0);
}

/* ---- parent: namespaces, veth, clean-up in every exit path ---- */

static kvbh_child_t g_chW, g_chT;

/* Two namespaces joined by a veth pair, A's egress throttled; skips the
 * test where that cannot be made. */
static void make_netns(const char *ipA, const char *ipB)
{
    static kvbh_child_t *const children[] = {&g_chW, &g_chT};
    kvbh_netns_make("sendorder", "kvbs", ipA, ipB, 50, children, 2);
    if (kvbh_sh("ss -V >/dev/null 2>&1") != 0)
        kvbh_netns_skip("sendorder", "iproute2's 'ss' not found");
    if (kvbh_sh("ip netns exec %s tc qdisc add dev %s root tbf rate 100mbit burst 64kb latency "
                "100ms 2>/dev/null",
                kvbh_ns.nsA, kvbh_ns.vA) != 0)
        kvbh_netns_skip("sendorder", "tc tbf not available: the write would not be in flight at "
                                     "the cut");
    if (kvbh_netns_wait_carrier(10) != 0)
        kvbh_netns_skip("sendorder", "the veth pair got no carrier within 10 s");
}

/* The cut: A's UCX sockets reset (all of A's TCP connections but the
 * control connection to B's listener), or A's link down. */
static void cut(const char *how, const char *ipB, int ctrl_port)
{
    if (strcmp(how, "reset") == 0)
        CHECK_EQ(kvbh_sh("ip netns exec %s ss -K -t state established dst %s '( dport != :%d )' "
                         ">/dev/null",
                         kvbh_ns.nsA, ipB, ctrl_port),
                 0);
    else
        CHECK_EQ(kvbh_sh("ip -n %s link set %s down", kvbh_ns.nsA, kvbh_ns.vA), 0);
}

static void test_sendorder(const char *how)
{
    char line[512], sid[256], ipA[32], ipB[32];
    unsigned long long addr;
    int sub = (int)(getpid() % 250) + 1;
    snprintf(ipA, sizeof(ipA), "10.214.%d.1", sub);
    snprintf(ipB, sizeof(ipB), "10.214.%d.2", sub);
    make_netns(ipA, ipB);
    setenv("KVBRIDGE_TRANSFER_TIMEOUT", "30", 1);
    setenv("UCX_LOG_FILE", "/dev/stderr", 1); /* UCX logs to stdout, the children's replies */

    char *targs[] = {"nstarget", kvbh_ns.nsB, ipB, kvbh_ns.vB, NULL};
    CHECK_EQ(kvbh_child_spawn(&g_chT, targs), 0);
    fcntl(g_chT.to, F_SETFD, FD_CLOEXEC); /* the writer must not hold the target's pipes */
    fcntl(g_chT.from, F_SETFD, FD_CLOEXEC);
    CHECK_EQ(kvbh_child_line(&g_chT, line, sizeof(line), 20), 0);
    CHECK_EQ(sscanf(line, "up %255s %llu", sid, &addr), 2);
    char *wargs[] = {"nswriter", kvbh_ns.nsA, ipA, kvbh_ns.vA, NULL};
    CHECK_EQ(kvbh_child_spawn(&g_chW, wargs), 0);
    CHECK_EQ(kvbh_child_line(&g_chW, line, sizeof(line), 20), 0);
    CHECK(strcmp(line, "up") == 0);
    int ctrl = atoi(strrchr(sid, ':') + 1);
    fprintf(stderr, "sendorder: %s: %s %s/%s -> %s %s (control port %d), tbf 100 mbit/s\n", how,
            kvbh_ns.nsA, kvbh_ns.vA, ipA, kvbh_ns.nsB, sid, ctrl);

    dprintf(g_chW.to, "write %s %llu\n", sid, addr);
    CHECK_EQ(kvbh_child_line(&g_chW, line, sizeof(line), 20), 0);
    double t0 = kvbh_now();
    CHECK(strcmp(line, "started ok") == 0);
    kvbh_sleep(CUT_AFTER_S);
    double t_cut = kvbh_now();
    cut(how, ipB, ctrl);
    fprintf(stderr, "sendorder: cut (%s) %.3f s after the write started, %.3f s to run\n", how,
            t_cut - t0, kvbh_now() - t_cut);

    dprintf(g_chW.to, "wait %.1f\n", END_BOUND_S);
    CHECK_EQ(kvbh_child_line(&g_chW, line, sizeof(line), END_BOUND_S + 10), 0);
    fprintf(stderr, "sendorder: writer: %s\n", line);
    int st, drained, live, after, first;
    char why[400] = "";
    double t_end;
    CHECK_EQ(sscanf(line, "end %d %d %d %d %d %lf | %399[^\n]", &st, &drained, &live, &after,
                    &first, &t_end, why) >= 6,
             1);
    dprintf(g_chT.to, "landed\n");
    char lt[128];
    size_t landed = 0;
    CHECK_EQ(kvbh_child_line(&g_chT, lt, sizeof(lt), 20), 0);
    CHECK_EQ(sscanf(lt, "landed %zu", &landed), 1);
    fprintf(stderr,
            "sendorder: %s: write ended %s %.3f s after the cut, drained %d; sends ended with an "
            "error: %d before the connection's failure reached the write, %d after; first UCX "
            "status: %s; target holds %zu of %u bytes; reason: %s\n",
            how, kvb_status_string((kvb_status_t)st), t_end - t_cut, drained, live, after,
            ucs_status_string((ucs_status_t)first), landed, LEN, why);
    CHECK_EQ(st, KVB_ERR_PEER);
    CHECK(t_end - t_cut < END_BOUND_S);
    CHECK(landed > 0 && landed < LEN); /* the cut came mid-write */
    CHECK_EQ(drained, 0);
    kvbh_netns_cleanup();
    TEST_PASS("send order at a transport failure: the write is reported not drained");
}

int main(int argc, char **argv)
{
    if (kvbh_main_init(argc, argv)) {
        if (argc >= 6 && strcmp(argv[2], "nstarget") == 0)
            return child_target(argv + 3);
        if (argc >= 6 && strcmp(argv[2], "nswriter") == 0)
            return child_writer(argv + 3);
        return 2;
    }
    CHECK(argc >= 2 && (strcmp(argv[1], "reset") == 0 || strcmp(argv[1], "linkdown") == 0));
    test_sendorder(argv[1]);
    return 0;
}
