/* A peer sends UCX stream data to a target (tcp). The target watches every
 * reply endpoint it keeps with a stream receive (lane/msg/target.c,
 * peer_watch; docs/engine.md, "reply endpoint"); no kvbridge peer sends
 * stream data, but any peer that learnt the worker address can. The peer
 * is a raw UCX process (a child forked before any UCX state exists: an
 * unauthenticated handshake, its own worker and endpoint):
 *   1. STREAM_BEFORE bytes of stream data before its first message (queued
 *      by UCX: the watch drains them when it is posted),
 *   2. a 4 KiB write (acknowledged, its bytes land),
 *   3. STREAM_AFTER bytes of stream data (each piece ends the watch with
 *      UCS_OK; it is posted again),
 *   4. a second 4 KiB write: acknowledged, its bytes land.
 * Both acks KVB_OK and both writes' bytes verified, and then a genuine
 * kvbridge writer's write is acknowledged and lands: the stream bytes
 * changed nothing a peer sees. */
#include "kvb_test.h"
#include "kvb_test_raw_peer.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#define PIECE 4096
#define STREAM_BEFORE (16u << 10)
#define STREAM_AFTER (1u << 20)
#define STREAM_SEND (64u << 10)

typedef struct report {
    int acks;
    int32_t status[2];
} report_t;

static report_t g_rep;

static ucs_status_t ack_cb(void *arg, const void *header, size_t hlen, void *data, size_t length,
                           const ucp_am_recv_param_t *param)
{
    int32_t st;
    uint64_t xid, mid;
    const uint8_t *why;
    uint32_t rl;
    (void)arg, (void)data, (void)length, (void)param;
    if (kvb__am_parse_ack(header, hlen, &st, &xid, &mid, &why, &rl) && g_rep.acks < 2)
        g_rep.status[g_rep.acks++] = st;
    return UCS_OK;
}

/* Progress w until req (a send) ended, at most 5 s; false: it did not. */
static bool wait_req(ucp_worker_h w, void *req)
{
    if (!UCS_PTR_IS_PTR(req))
        return !UCS_PTR_IS_ERR(req);
    double t0 = kvb_test_now_s();
    ucs_status_t st;
    while ((st = ucp_request_check_status(req)) == UCS_INPROGRESS && kvb_test_now_s() - t0 < 5.0)
        ucp_worker_progress(w);
    ucp_request_free(req);
    return st == UCS_OK;
}

/* n bytes of stream data, at most STREAM_SEND per send. */
static bool stream_send(ucp_worker_h w, ucp_ep_h ep, size_t n)
{
    static uint8_t junk[STREAM_SEND];
    memset(junk, 0xa5, sizeof(junk));
    for (size_t off = 0; off < n; off += STREAM_SEND) {
        ucp_request_param_t p = {0};
        size_t k = n - off < STREAM_SEND ? n - off : STREAM_SEND;
        if (!wait_req(w, ucp_stream_send_nbx(ep, junk, k, &p)))
            return false;
    }
    return true;
}

/* A 4 KiB write of byte fill to addr, sequence seq; waits (5 s at most)
 * for its ack. */
static bool write_4k(ucp_worker_h w, ucp_ep_h ep, uint64_t addr, uint32_t seq, uint8_t fill)
{
    static uint8_t h[AM_HDR_FIXED + AM_DESC], payload[PIECE];
    memset(payload, fill, sizeof(payload));
    kvb_test_raw_am_header(h, AM_MAGIC_WRITE, 2000 + seq, seq, addr, PIECE);
    ucp_request_param_t p = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
                             .flags = UCP_AM_SEND_FLAG_REPLY};
    int want = g_rep.acks + 1;
    if (!wait_req(w, ucp_am_send_nbx(ep, KVB_AM_WRITE, h, sizeof(h), payload, PIECE, &p)))
        return false;
    double t0 = kvb_test_now_s();
    while (g_rep.acks < want && kvb_test_now_s() - t0 < 5.0)
        ucp_worker_progress(w);
    return g_rep.acks == want;
}

static void peer(int report_fd, uint16_t port, uint64_t addr)
{
    kvb__hs_reply_t r;
    ucp_worker_h w;
    ucp_ep_h ep;
    if (kvb_test_raw_hs_reply(port, &r) < 0)
        _exit(10);
    if (!kvb_test_raw_ucx(&r, UCP_FEATURE_AM | UCP_FEATURE_STREAM, UCP_ERR_HANDLING_MODE_PEER,
                          ack_cb, &w, &ep))
        _exit(11);
    if (!stream_send(w, ep, STREAM_BEFORE))
        _exit(13);
    if (!write_4k(w, ep, addr, 1, 0x11))
        _exit(14);
    if (!stream_send(w, ep, STREAM_AFTER))
        _exit(15);
    if (!write_4k(w, ep, addr + PIECE, 2, 0x22))
        _exit(16);
    if (write(report_fd, &g_rep, sizeof(g_rep)) != (ssize_t)sizeof(g_rep))
        _exit(17);
    for (;;)
        pause(); /* killed by the parent */
}

static pid_t g_peer;

static void kill_peer(void) /* every exit of the parent, a failed CHECK's too */
{
    if (g_peer > 0) {
        kill(g_peer, SIGKILL);
        waitpid(g_peer, NULL, 0);
        g_peer = 0;
    }
}

int main(void)
{
    kvb_test_raw_target_t m;
    int go, rep;
    pid_t a = kvb_test_raw_fork(&m, &go, &rep);
    if (a == 0) {
        peer(rep, m.port, m.addr);
        _exit(0);
    }
    g_peer = a;
    atexit(kill_peer);
    kvb_engine_params_t p = {.field_mask = KVB_ENGINE_PARAM_TRANSPORT,
                             .transport = KVB_TRANSPORT_TCP};
    kvb_engine_h tgt = NULL, wr = NULL;
    CHECK_EQ(kvb_engine_create(&p, &tgt), KVB_OK);
    uint8_t *pool = calloc(1, 4 * PIECE), *mine = malloc(PIECE);
    CHECK(pool != NULL && mine != NULL);
    CHECK_EQ(kvb_engine_register(tgt, pool, 4 * PIECE, KVB_MEM_HOST), KVB_OK);
    const char *sid = kvb_engine_session_id(tgt);
    kvb_test_raw_go(go, sid, pool);
    report_t r;
    ssize_t n = read(rep, &r, sizeof(r));
    int ws = 0;
    if (n != (ssize_t)sizeof(r) && waitpid(a, &ws, WNOHANG) == a)
        fprintf(stderr, "stream: the peer exited %d\n", WIFEXITED(ws) ? WEXITSTATUS(ws) : -1);
    CHECK_EQ(n, (ssize_t)sizeof(r));
    fprintf(stderr,
            "stream: %u bytes of stream data, a write -> %s, %u bytes more, a write -> %s\n",
            STREAM_BEFORE, kvb_status_string(r.status[0]), STREAM_AFTER,
            kvb_status_string(r.status[1]));
    CHECK_EQ(r.acks, 2);
    CHECK_EQ(r.status[0], KVB_OK);
    CHECK_EQ(r.status[1], KVB_OK);
    for (size_t i = 0; i < PIECE; i++) {
        CHECK_EQ(pool[i], 0x11);
        CHECK_EQ(pool[PIECE + i], 0x22);
    }
    /* a genuine writer afterwards */
    p.field_mask = KVB_ENGINE_PARAM_TRANSPORT;
    CHECK_EQ(kvb_engine_create(&p, &wr), KVB_OK);
    memset(mine, 0x33, PIECE);
    CHECK_EQ(kvb_engine_register(wr, mine, PIECE, KVB_MEM_HOST), KVB_OK);
    kvb_block_t b = {(uint64_t)(uintptr_t)mine, (uint64_t)(uintptr_t)(pool + 2 * PIECE), PIECE};
    CHECK_EQ(kvb_engine_write(wr, sid, &b, 1, 10.0), KVB_OK);
    CHECK(memcmp(pool + 2 * PIECE, mine, PIECE) == 0);
    kill_peer();
    kvb_engine_destroy(wr);
    kvb_engine_destroy(tgt);
    free(pool);
    free(mine);
    TEST_PASS("stream data to the target's reply endpoints changes nothing a peer sees");
    return 0;
}
