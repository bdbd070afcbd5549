/* Review 2, finding 5: a TokenSpeed decode session that re-sends its
 * 8-frame KV-args with fewer pointers between its transfer info and the
 * room's chunk. The transfer info was checked against the first
 * registration; the chunk is planned against the current one, whose pointer
 * arrays are shorter (before the fix: a heap-buffer-overflow read under
 * ASan, a bogus "not in a region" failure without). The room must fail with
 * a reason naming the mismatch, and the rank keep serving: the session
 * re-registers with its real layout and a next room lands byte for byte.
 *
 * A kvbridge prefill rank (2 layers MHA: 4 KV buffers), decode memory
 * registered with a bare kvbridge engine (its session is the decode's), and
 * the decode's messages sent through a raw ZeroMQ PUSH, as ts_helper's
 * Python decode does. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "harness/kvb_cluster.h"
#include "kvb_test.h"
#include "dialect/tokenspeed_seed/frames.h"

static const kvbh_geom_t G = {
    .layers = 2, .heads = 2, .head_bytes = 64, .page = 4, .pool_pages = 32, .mla = 0};

#define NPAGES 4

typedef struct scene {
    kvbh_boot_t boot;
    kvbh_rank_t pre, dec; /* dec: the decode's memory only (no manager) */
    kvb_engine_h deng;
    uint8_t *arena;
    kvbh_push_t z;
    void *zctx, *pull; /* where the prefill's statuses go */
    uint16_t pull_port;
    const char *sid;
} scene_t;

static uint64_t bad_count(kvb_manager_h m)
{
    kvb_manager_stats_t st;
    kvb_manager_stats(m, &st);
    return st.bad_messages;
}

/* Everything pushed so far has been handled: one malformed message behind
 * it on the same pipe is counted. */
static void push_barrier(scene_t *s)
{
    const void *f[1] = {"garbage"};
    size_t l[1] = {7};
    uint64_t want = bad_count(s->pre.mgr) + 1;
    CHECK_EQ(kvbh_push_frames(&s->z, f, l, 1), 0);
    double end = kvbh_now() + 5;
    while (bad_count(s->pre.mgr) < want && kvbh_now() < end)
        kvbh_sleep(0.002);
    CHECK_EQ(bad_count(s->pre.mgr), want);
}

/* TokenSpeed KV-args of the decode session: its first n KV buffers. */
static void push_kv_args(scene_t *s, size_t n)
{
    kvb__frames_buf_t b;
    uint64_t ptrs[KVBH_MAX_KV];
    for (size_t i = 0; i < n; i++)
        ptrs[i] = (uint64_t)(uintptr_t)s->dec.kv[i];
    kvb__regts_msg_t r = {0};
    r.ip = "127.0.0.1";
    r.ip_len = 9;
    r.port = s->pull_port;
    r.session_id = s->sid;
    r.session_id_len = strlen(s->sid);
    r.kv_ptrs = kvb__u64_view_of(ptrs, n);
    kvb__frames_buf_init(&b);
    CHECK_EQ(kvb__frames_encode_registration_ts(&r, NULL, &b), KVB_OK);
    CHECK_EQ(kvbh_push_send(&s->z, &b), 0);
    kvb__frames_buf_free(&b);
}

/* A 12-frame TokenSpeed transfer info for room: pages dst[0..NPAGES). */
static void push_xfer(scene_t *s, uint64_t room, const int32_t *dst)
{
    kvb__frames_buf_t b;
    int64_t pages[NPAGES];
    for (int i = 0; i < NPAGES; i++)
        pages[i] = dst[i];
    kvb__xferts_msg_t x = {0};
    x.room = room;
    x.ip = "127.0.0.1";
    x.ip_len = 9;
    x.port = s->pull_port;
    x.session_id = s->sid;
    x.session_id_len = strlen(s->sid);
    x.pages = (kvb__i64_view_t){(const uint8_t *)pages, NPAGES};
    x.aux_index = 0;
    x.required_dst_info_num = 1;
    kvb__frames_buf_init(&b);
    CHECK_EQ(kvb__frames_encode_transfer_ts(&x, NULL, &b), KVB_OK);
    CHECK_EQ(kvbh_push_send(&s->z, &b), 0);
    kvb__frames_buf_free(&b);
}

/* Wrong KV bytes of room at the decode's pages dst (TokenSpeed carries no
 * aux item: kvbh_verify's aux check does not apply). */
static uint64_t kv_bad(const kvbh_rank_t *r, uint64_t room, const int32_t *dst)
{
    uint64_t bad = 0;
    for (int b = 0; b < r->n_kv; b++)
        for (int i = 0; i < NPAGES; i++) {
            const uint8_t *p = r->kv[b] + (uint64_t)dst[i] * r->item_len;
            for (uint64_t k = 0; k < r->item_len; k++)
                bad += p[k] != kvbh_pat(room, b, (uint64_t)i, k);
        }
    return bad;
}

/* The prefill's side of room: sender, one chunk of NPAGES pages; returns the
 * final poll, the failure reason into why. */
static kvb_poll_t send_room(scene_t *s, uint64_t room, const int32_t *src, char *why, size_t wl)
{
    kvb_sender_h snd;
    why[0] = '\0';
    kvbh_fill(&s->pre, room, src, NPAGES, 0);
    CHECK_EQ(kvb_sender_create(s->pre.mgr, s->boot.addr, room, &snd), KVB_OK);
    CHECK_EQ(kvbh_wait_sender_ready(snd, 5), 0);
    CHECK_EQ(kvb_sender_init(snd, NPAGES, 0), KVB_OK);
    CHECK_EQ(kvb_sender_send(snd, src, NPAGES), KVB_OK);
    kvb_poll_t st = kvbh_wait_sender(snd, 10);
    if (st == KVB_POLL_FAILED)
        kvb_sender_failure(snd, why, wl);
    kvb_sender_destroy(snd);
    return st;
}

static void start(scene_t *s)
{
    kvb_engine_params_t ep = {0};
    int zero = 0;
    char end[64];
    size_t el = sizeof(end);
    memset(s, 0, sizeof(*s));
    CHECK_EQ(kvbh_boot_start(&s->boot, 0, NULL), 0);
    CHECK_EQ(kvbh_rank_start(&s->pre, &G, KVB_MODE_PREFILL, s->boot.addr, KVBH_MEM_MALLOC, NULL),
             KVB_OK);
    CHECK_EQ(s->pre.n_kv, 4);
    s->arena = malloc(kvbh_arena_len(&G, NULL));
    CHECK(s->arena != NULL);
    kvbh_layout(&s->dec, &G, NULL, s->arena, 1);
    CHECK_EQ(kvb_engine_create(&ep, &s->deng), KVB_OK);
    for (int i = 0; i < s->dec.n_kv; i++) /* one region per buffer, as TokenSpeed's decode */
        CHECK_EQ(kvb_engine_register(s->deng, s->dec.kv[i], s->dec.buf_len, KVB_MEM_HOST), KVB_OK);
    s->sid = kvb_engine_session_id(s->deng);
    s->zctx = zmq_ctx_new();
    s->pull = zmq_socket(s->zctx, ZMQ_PULL);
    zmq_setsockopt(s->pull, ZMQ_LINGER, &zero, sizeof(zero));
    CHECK_EQ(zmq_bind(s->pull, "tcp://127.0.0.1:*"), 0);
    CHECK_EQ(zmq_getsockopt(s->pull, ZMQ_LAST_ENDPOINT, end, &el), 0);
    s->pull_port = (uint16_t)atoi(strrchr(end, ':') + 1);
    CHECK_EQ(kvbh_push_open(&s->z, kvb_manager_endpoint(s->pre.mgr), NULL), 0);
}

static void stop(scene_t *s)
{
    kvbh_push_close(&s->z);
    zmq_close(s->pull);
    zmq_ctx_term(s->zctx);
    kvbh_rank_stop(&s->pre);
    kvb_engine_destroy(s->deng);
    free(s->arena);
    kvbh_boot_stop(&s->boot);
}

int main(void)
{
    scene_t s;
    char why[1024];
    const int32_t src1[NPAGES] = {3, 2, 1, 0}, dst1[NPAGES] = {0, 1, 2, 3};
    const int32_t src2[NPAGES] = {7, 6, 5, 4}, dst2[NPAGES] = {8, 9, 10, 11};
    start(&s);

    /* KV-args with 4 pointers, the transfer info (checked against them),
     * then KV-args with 1 pointer before the room's chunk. */
    push_kv_args(&s, 4);
    push_xfer(&s, 77, dst1);
    push_kv_args(&s, 1);
    push_barrier(&s);
    kvb_poll_t st = send_room(&s, 77, src1, why, sizeof(why));
    fprintf(stderr, "room 77: %s: %s\n", kvb_poll_string(st), why);
    CHECK_EQ(st, KVB_POLL_FAILED);
    CHECK(strstr(why, "re-sent its KV args with 1 KV buffers") != NULL);
    CHECK(strstr(why, "this prefill has 4") != NULL);
    CHECK_EQ(kvbh_guard_bad(&s.dec, dst1, NPAGES, -1, 0), 0); /* nothing written */

    /* The rank keeps serving: the session's real layout again, a good room. */
    push_kv_args(&s, 4);
    push_xfer(&s, 78, dst2);
    push_barrier(&s);
    st = send_room(&s, 78, src2, why, sizeof(why));
    if (st != KVB_POLL_SUCCESS)
        fprintf(stderr, "room 78: %s: %s\n", kvb_poll_string(st), why);
    CHECK_EQ(st, KVB_POLL_SUCCESS);
    CHECK_EQ(kv_bad(&s.dec, 78, dst2), 0);
    CHECK(kvbh_canaries_ok(&s.dec, "decode"));
    stop(&s);
    TEST_PASS("TokenSpeed KV args re-sent with fewer pointers: room failed by name, rank serves");
    return 0;
}
