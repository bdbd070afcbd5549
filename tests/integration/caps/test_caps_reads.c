/* Review 3, F2: one reader that never takes its read answers held the
 * target's engine-wide read caps (256 answers / 256 MiB) for as long as it
 * lived, and every other reader was refused as "peer unreachable or dead".
 *
 * The attacker is a child forked before any UCX state exists: exactly what
 * any TCP peer can do (an unauthenticated raw handshake, its own UCX worker
 * and endpoint, sixteen 16 MiB "KVBR" read requests at epoch 0). It takes
 * the refusals (small eager acks) until every request has its reply (at
 * most ATTACK_REPLIES_S), holds the rendezvous answers without receiving
 * them (UCS_INPROGRESS), reports what it got through a pipe, and then never
 * progresses its worker again.
 *
 * Asserted, against a target with a small peer time-out (PEER_TO):
 * - the attacker is answered at most its share (2 x 16 MiB held) and the
 *   rest is refused KVB_ERR_BUSY "... try again", not KVB_ERR_PEER;
 * - while it holds its share, a genuine engine's 4 KiB reads succeed
 *   (bytes verified);
 * - its answers end no earlier than PEER_TO after they began and within
 *   PEER_TO + 2 s: the target's answer count and bytes return to 0 and it
 *   reports one reader connection closed, the attacker still alive;
 * - a genuine reader keeps within its share by itself (a 64 MiB read in
 *   16 MiB requests, and eight concurrent 8 MiB reads, succeed, none
 *   refused); told to ignore it (test hook), its read is refused with
 *   KVB_ERR_BUSY and "target busy ... try again", and reads again after.
 * With argument "none" the attacker's endpoint asks for no peer-failure
 * handling: UCX refuses to force-close the target's side of it, so the
 * attacker keeps its share past the peer time-out (and past its death:
 * such an endpoint learns of none), asserted, and genuine reads still
 * succeed. */
#include "kvb_test.h"
#include "kvb_test_raw_peer.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#define NREQ 16
#define EACH (16u << 20)
#define POOL (64u << 20)
static const double PEER_TO = 3.0, ATTACK_REPLIES_S = 2.0;

/* ---- the attacker (child) ---- */

typedef struct attack_report {
    int held, busy, other; /* answers held (rendezvous), busy refusals, other acks */
    int first_status;      /* the first refusal's status */
    char first_why[200];   /* and its reason */
    double t_sent;         /* CLOCK_MONOTONIC when the requests were sent */
} attack_report_t;

static attack_report_t g_rep;

static ucs_status_t attacker_ack_cb(void *arg, const void *header, size_t hlen, void *data,
                                    size_t length, const ucp_am_recv_param_t *param)
{
    int32_t st;
    uint64_t xid, mid;
    const uint8_t *why;
    uint32_t rl;
    (void)arg, (void)data, (void)length;
    if (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) {
        g_rep.held++;
        return UCS_INPROGRESS; /* kept, never received: the target's send stays open */
    }
    if (!kvb__am_parse_ack(header, hlen, &st, &xid, &mid, &why, &rl)) {
        g_rep.other++;
        return UCS_OK;
    }
    if (st == KVB_ERR_BUSY)
        g_rep.busy++;
    else
        g_rep.other++;
    if (g_rep.busy + g_rep.other == 1) {
        g_rep.first_status = st;
        snprintf(g_rep.first_why, sizeof(g_rep.first_why), "%.*s",
                 (int)(rl < sizeof(g_rep.first_why) - 1 ? rl : sizeof(g_rep.first_why) - 1),
                 (const char *)why);
    }
    return UCS_OK;
}

static void attacker(int report_fd, uint16_t port, uint64_t addr, ucp_err_handling_mode_t mode)
{
    kvb__hs_reply_t r;
    ucp_worker_h w;
    ucp_ep_h ep;
    if (kvb_test_raw_hs_reply(port, &r) < 0)
        _exit(10);
    if (!kvb_test_raw_ucx(&r, UCP_FEATURE_AM, mode, attacker_ack_cb, &w, &ep))
        _exit(11);
    static uint8_t hdr[NREQ][AM_HDR_FIXED + AM_DESC];
    void *sends[NREQ];
    for (unsigned i = 0; i < NREQ; i++) {
        uint8_t *h = hdr[i];
        kvb_test_raw_am_header(h, AM_MAGIC_READ, 1000 + i, i, addr, EACH);
        ucp_request_param_t p = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
                                 .flags = UCP_AM_SEND_FLAG_REPLY};
        sends[i] = ucp_am_send_nbx(ep, KVB_AM_WRITE, h, sizeof(hdr[i]), NULL, 0, &p);
    }
    g_rep.t_sent = kvb_test_now_s();
    while (g_rep.held + g_rep.busy + g_rep.other < NREQ &&
           kvb_test_now_s() - g_rep.t_sent < ATTACK_REPLIES_S)
        ucp_worker_progress(w);
    (void)sends;
    if (write(report_fd, &g_rep, sizeof(g_rep)) != (ssize_t)sizeof(g_rep))
        _exit(13);
    for (;;)
        pause(); /* alive, TCP up, never takes an answer */
}

/* ---- the genuine side (parent) ---- */

static kvb_engine_limits_t limits(kvb_engine_h e)
{
    kvb_engine_limits_t l = {.field_mask = KVB_ENGINE_LIMITS_READS};
    kvb_engine_limits(e, &l);
    return l;
}

/* A 4 KiB read at offset off of the pool into mine; the bytes checked. */
static void read_4k(kvb_engine_h rd, const char *sid, uint8_t *mine, const uint8_t *pool,
                    size_t off, const char *when)
{
    memset(mine, 0, 4096);
    kvb_block_t b = {(uint64_t)(uintptr_t)(pool + off), (uint64_t)(uintptr_t)mine, 4096};
    kvb_status_t st = kvb_engine_read(rd, sid, &b, 1, 5.0);
    fprintf(stderr, "reads: %s: genuine 4 KiB read -> %s %s\n", when, kvb_status_string(st),
            st == KVB_OK ? "" : kvb_engine_last_error(rd));
    CHECK_EQ(st, KVB_OK);
    CHECK(memcmp(mine, pool + off, 4096) == 0);
}

static kvb_engine_h engine(double peer_to, size_t chunk)
{
    kvb_engine_params_t p = {.field_mask = KVB_ENGINE_PARAM_TRANSPORT |
                                           KVB_ENGINE_PARAM_PEER_TIMEOUT |
                                           KVB_ENGINE_PARAM_AM_CHUNK,
                             .transport = KVB_TRANSPORT_TCP,
                             .peer_timeout_s = peer_to,
                             .am_chunk_bytes = chunk};
    kvb_engine_h e = NULL;
    CHECK_EQ(kvb_engine_create(&p, &e), KVB_OK);
    return e;
}

/* A 64 MiB read in 16 MiB requests (the whole share in two). */
static kvb_status_t read_big(kvb_engine_h rd, const char *sid, uint8_t *big, const uint8_t *pool)
{
    memset(big, 0, POOL);
    kvb_block_t b = {(uint64_t)(uintptr_t)pool, (uint64_t)(uintptr_t)big, POOL};
    return kvb_engine_read(rd, sid, &b, 1, 10.0);
}

static void share_kept_or_busy(kvb_engine_h tgt, const char *sid, const uint8_t *pool)
{
    kvb_engine_h rd = engine(2.0, 16u << 20);
    uint8_t *big = malloc(POOL);
    CHECK(big != NULL);
    CHECK_EQ(kvb_engine_register(rd, big, POOL, KVB_MEM_HOST), KVB_OK);
    kvb_status_t st = read_big(rd, sid, big, pool);
    fprintf(stderr, "reads: 64 MiB read in 16 MiB requests, within the share -> %s\n",
            kvb_status_string(st));
    CHECK_EQ(st, KVB_OK);
    CHECK(memcmp(big, pool, POOL) == 0);
    /* eight reads of 8 MiB at once (4 times the share in 16 MiB requests):
     * they queue on the connection's share, none is refused */
    uint64_t busy0 = limits(tgt).reads_refused_busy;
    kvb_xfer_h xs[8];
    memset(big, 0, POOL);
    for (int k = 0; k < 8; k++) {
        kvb_block_t b = {(uint64_t)(uintptr_t)pool + (uint64_t)k * (POOL / 8),
                         (uint64_t)(uintptr_t)big + (uint64_t)k * (POOL / 8), POOL / 8};
        CHECK_EQ(kvb_engine_read_async(rd, sid, &b, 1, &xs[k]), KVB_OK);
    }
    for (int k = 0; k < 8; k++) {
        CHECK_EQ(kvb_xfer_wait(xs[k], 20.0), KVB_OK);
        kvb_xfer_free(xs[k]);
    }
    CHECK(memcmp(big, pool, POOL) == 0);
    CHECK_EQ(limits(tgt).reads_refused_busy, busy0);
    fprintf(stderr, "reads: 8 concurrent 8 MiB reads on one connection -> ok, none refused\n");
    KVB__HOOK_SET(read_share_ignored, 1);
    st = read_big(rd, sid, big, pool);
    KVB__HOOK_SET(read_share_ignored, 0);
    fprintf(stderr,
            "reads: the same read ignoring the share -> %s (%s); target busy refusals +%llu\n",
            kvb_status_string(st), st == KVB_OK ? "" : kvb_engine_last_error(rd),
            (unsigned long long)(limits(tgt).reads_refused_busy - busy0));
    CHECK_EQ(st, KVB_ERR_BUSY);
    CHECK_STR_CONTAINS(kvb_engine_last_error(rd), "target busy");
    CHECK_STR_CONTAINS(kvb_engine_last_error(rd), "try again");
    CHECK(limits(tgt).reads_refused_busy > busy0);
    /* the refused read's requests left the connection's count: it reads again */
    st = read_big(rd, sid, big, pool);
    fprintf(stderr, "reads: the 64 MiB read again, within the share -> %s\n",
            kvb_status_string(st));
    CHECK_EQ(st, KVB_OK);
    CHECK(memcmp(big, pool, POOL) == 0);
    kvb_engine_destroy(rd);
    free(big);
}

static pid_t g_attacker;

static void kill_attacker(void) /* every exit of the parent, a failed CHECK's too */
{
    if (g_attacker > 0) {
        kill(g_attacker, SIGKILL);
        waitpid(g_attacker, NULL, 0);
        g_attacker = 0;
    }
}

int main(int argc, char **argv)
{
    /* "none": the attacker's endpoint asks for no peer-failure handling,
     * which UCX lets the target neither detect nor force-close */
    bool peer_mode = argc < 2 || strcmp(argv[1], "none") != 0;
    kvb_test_raw_target_t m;
    int go, rep;
    pid_t a = kvb_test_raw_fork(&m, &go, &rep);
    if (a == 0) {
        attacker(rep, m.port, m.addr,
                 peer_mode ? UCP_ERR_HANDLING_MODE_PEER : UCP_ERR_HANDLING_MODE_NONE);
        _exit(0);
    }
    g_attacker = a;
    atexit(kill_attacker);
    kvb_engine_h tgt = engine(PEER_TO, 4u << 20), rd = engine(2.0, 4u << 20);
    uint8_t *pool = malloc(POOL), *mine = malloc(1 << 20);
    CHECK(pool != NULL && mine != NULL);
    for (size_t i = 0; i < POOL; i++)
        pool[i] = (uint8_t)(i * 131 + (i >> 12));
    CHECK_EQ(kvb_engine_register(tgt, pool, POOL, KVB_MEM_HOST), KVB_OK);
    CHECK_EQ(kvb_engine_register(rd, mine, 1 << 20, KVB_MEM_HOST), KVB_OK);
    const char *sid = kvb_engine_session_id(tgt);
    read_4k(rd, sid, mine, pool, 0, "before the attacker");

    kvb_test_raw_go(go, sid, pool);
    attack_report_t r;
    CHECK_EQ(read(rep, &r, sizeof(r)), (ssize_t)sizeof(r));
    kvb_engine_limits_t l = limits(tgt);
    fprintf(stderr,
            "reads: attacker (pid %d): %d answers held, %d refused busy, %d other; first "
            "refusal %d \"%s\"; target: %llu answers (%llu bytes) in flight, %.3f s after the "
            "requests\n",
            (int)a, r.held, r.busy, r.other, r.first_status, r.first_why,
            (unsigned long long)l.read_answers, (unsigned long long)l.read_answer_bytes,
            kvb_test_now_s() - r.t_sent);
    CHECK_EQ(r.held, 2); /* its share: 32 MiB */
    CHECK_EQ(r.busy, NREQ - 2);
    CHECK_EQ(r.other, 0);
    CHECK_EQ(r.first_status, KVB_ERR_BUSY);
    CHECK_STR_CONTAINS(r.first_why, "try again");
    CHECK_EQ(l.read_answers, 2);
    CHECK_EQ(l.read_answer_bytes, 2ull * EACH);
    /* while the attacker holds its share: other readers are served */
    read_4k(rd, sid, mine, pool, 12345, "while the attacker holds its share");
    double t_in = kvb_test_now_s() - r.t_sent;
    CHECK(t_in < PEER_TO); /* that read really ran inside the hold */

    /* its answers end at the peer time-out: connection closed, copies freed */
    double t_end = r.t_sent + PEER_TO + 2.0, t_freed = -1;
    while (kvb_test_now_s() < t_end) {
        l = limits(tgt);
        if (l.read_answers == 0 && l.read_answer_bytes == 0) {
            t_freed = kvb_test_now_s() - r.t_sent;
            break;
        }
        usleep(10000);
    }
    fprintf(stderr,
            "reads: attacker's answers freed %.3f s after its requests (peer time-out %.1f s); "
            "reader connections closed: %llu; attacker alive: %s\n",
            t_freed, PEER_TO, (unsigned long long)l.read_conns_closed,
            kill(a, 0) == 0 ? "yes" : "no");
    CHECK_EQ(kill(a, 0), 0);
    if (!peer_mode) { /* UCX refuses the forced close: it keeps its share, no more */
        CHECK(t_freed < 0);
        CHECK_EQ(l.read_conns_closed, 0);
        CHECK_EQ(l.read_answer_bytes, 2ull * EACH);
        read_4k(rd, sid, mine, pool, 4096 * 7, "the attacker still holding its share");
        kill_attacker();
        l = limits(tgt);
        fprintf(stderr, "reads: attacker killed: %llu answers (%llu bytes) in flight\n",
                (unsigned long long)l.read_answers, (unsigned long long)l.read_answer_bytes);
        read_4k(rd, sid, mine, pool, 4096 * 9, "after the attacker was killed");
        kvb_engine_destroy(rd);
        kvb_engine_destroy(tgt);
        free(pool);
        free(mine);
        TEST_PASS("read caps: a stuck reader without peer-failure handling holds its share only");
        return 0;
    }
    CHECK(t_freed >= PEER_TO - 0.05);
    CHECK_EQ(l.read_conns_closed, 1);
    read_4k(rd, sid, mine, pool, 4096 * 7, "after the attacker's connection was closed");

    share_kept_or_busy(tgt, sid, pool);

    kill_attacker();
    kvb_engine_destroy(rd);
    kvb_engine_destroy(tgt);
    free(pool);
    free(mine);
    TEST_PASS("read caps: a stuck reader holds only its share, for the peer time-out; busy "
              "refusals say so");
    return 0;
}
