/* Destination page indices are checked against the decode's KV pool (review
 * 2.5): on the decode at kvb_receiver_init, and on the prefill from the
 * decode's "kv_lens=" registration extension. An out-of-range page fails
 * the room with a clear reason and writes nothing: the first page of the
 * next layer buffer (adjacent registered memory: a packed harness arena)
 * keeps its bytes, and a good room still verifies afterwards. */
#include <stdio.h>
#include <string.h>

#include "harness/kvb_cluster.h"
#include "kvb_test.h"
#include "dialect/sglang2025/frames.h"

#define POOL 8    /* pages per KV buffer */
#define AUX 4     /* the rooms' aux item (items 0-3 lie right after layer 1's pool) */
#define FILL 0xA5 /* the decode's pages before any write */

/* MLA, two layer buffers of 8 pages of 256 bytes side by side: page 8 of
 * layer 0 is layer 1's first page, page 8 of layer 1 the aux buffer's start. */
static const kvbh_geom_t G = {
    .layers = 2, .heads = 1, .head_bytes = 64, .page = 4, .pool_pages = POOL, .mla = 1};

static uint64_t changed(const uint8_t *p, uint64_t len)
{
    uint64_t n = 0;
    for (uint64_t i = 0; i < len; i++)
        n += p[i] != FILL;
    return n;
}

/* The bytes right after each layer's pool: layer 1's first page, aux items 0-3. */
static uint64_t next_to_pool(const kvbh_pair_t *p)
{
    return changed(p->dec.kv[1], p->dec.item_len) + changed(p->dec.aux, p->dec.item_len);
}

static void fill_decode(kvbh_pair_t *p)
{
    const int32_t all[POOL] = {0, 1, 2, 3, 4, 5, 6, 7};
    kvbh_guard_fill(&p->dec, all, POOL, -1, FILL);
    memset(p->dec.aux, FILL, KVBH_AUX_ITEM * KVBH_AUX_ITEMS);
}

static void test_decode_side(kvbh_pair_t *p)
{
    const int32_t src[2] = {0, 1}, dst[2] = {3, POOL};
    kvb_sender_h s;
    kvb_receiver_h rc;
    char why[512];
    kvbh_fill(&p->pre, 2, src, 2, AUX);
    CHECK_EQ(kvb_sender_create(p->pre.mgr, p->boot.addr, 2, &s), KVB_OK);
    CHECK_EQ(kvb_receiver_create(p->dec.mgr, p->boot.addr, 2, -1, &rc), KVB_OK);
    CHECK_EQ(kvb_sender_init(s, 2, AUX), KVB_OK);
    CHECK_EQ(kvb_receiver_init(rc, dst, 2, AUX, NULL), KVB_ERR_INVALID);
    CHECK_EQ(kvb_receiver_poll(rc), KVB_POLL_FAILED);
    kvb_receiver_failure(rc, why, sizeof(why));
    CHECK_STR_CONTAINS(why, "destination page index 8 (entry 1) is outside this decode rank's KV "
                            "pool of 8 pages");
    /* Nothing was sent: the prefill never gets a transfer info. */
    kvbh_sleep(0.2);
    CHECK_EQ(kvb_sender_poll(s), KVB_POLL_BOOTSTRAPPING);
    kvb_receiver_destroy(rc);
    kvb_sender_destroy(s);
    CHECK_EQ(next_to_pool(p), 0);
    TEST_PASS("decode refuses an out-of-range page at init");
}

/* A transfer info as the decode would send it, pages unchecked. */
static void forged_transfer(kvbh_pair_t *p, uint64_t room, const int32_t *pages, size_t n)
{
    kvb__frames_buf_t b;
    kvbh_push_t z;
    kvb__frames_buf_init(&b);
    CHECK_EQ(kvbh_xfer_frames(&b, room, kvb_engine_session_id(p->dec.eng),
                              kvb_manager_endpoint(p->dec.mgr), pages, n, AUX),
             KVB_OK);
    CHECK_EQ(kvbh_push_open(&z, kvb_manager_endpoint(p->pre.mgr), NULL), 0);
    CHECK_EQ(kvbh_push_send(&z, &b), 0);
    kvbh_push_close(&z);
    kvb__frames_buf_free(&b);
}

static void test_prefill_side(kvbh_pair_t *p)
{
    const int32_t src[2] = {0, 1}, dst[2] = {3, POOL};
    kvb_sender_h s;
    char why[512];
    kvbh_fill(&p->pre, 3, src, 2, AUX);
    CHECK_EQ(kvb_sender_create(p->pre.mgr, p->boot.addr, 3, &s), KVB_OK);
    CHECK_EQ(kvb_sender_init(s, 2, AUX), KVB_OK);
    forged_transfer(p, 3, dst, 2);
    CHECK_EQ(kvbh_wait_sender_ready(s, 5), 0);
    CHECK_EQ(kvb_sender_poll(s), KVB_POLL_WAITING_FOR_INPUT);
    CHECK_EQ(kvb_sender_send(s, src, 2), KVB_OK);
    CHECK_EQ(kvbh_wait_sender(s, 5), KVB_POLL_FAILED);
    kvb_sender_failure(s, why, sizeof(why));
    CHECK_STR_CONTAINS(why, "destination page index 8 (entry 1) is outside decode");
    CHECK_STR_CONTAINS(why, "KV pool of 8 pages; nothing written");
    kvb_sender_destroy(s);
    CHECK_EQ(next_to_pool(p), 0);
    CHECK_EQ(changed(p->dec.kv[0] + 3 * p->dec.item_len, p->dec.item_len), 0);
    TEST_PASS("prefill refuses a transfer info past the decode's kv_lens");
}

/* argv[1] "decode" or "prefill": that half only (to see each fail alone). */
/* Review 2, finding 8: destination state slots are checked at init too,
 * against the smallest state buffer (KVBH_STATE_ITEMS items of a geometry
 * with state). */
static void test_decode_state(void)
{
    kvbh_geom_t gs = G;
    gs.state_bytes = 32;
    kvbh_pair_t p;
    kvb_receiver_h rc;
    char why[512];
    const int32_t dst[2] = {1, 2}, ok_state[1] = {KVBH_STATE_ITEMS - 1},
                  bad_state[2] = {0, KVBH_STATE_ITEMS};
    CHECK_EQ(kvbh_pair_start(&p, &gs, KVBH_MEM_PACKED, NULL, NULL), KVB_OK);
    kvb_receiver_init_t ex = {.field_mask = KVB_RECV_INIT_STATE};
    ex.state_indices = bad_state;
    ex.num_state_indices = 2;
    CHECK_EQ(kvb_receiver_create(p.dec.mgr, p.boot.addr, 5, -1, &rc), KVB_OK);
    CHECK_EQ(kvb_receiver_init(rc, dst, 2, AUX, &ex), KVB_ERR_INVALID);
    CHECK_EQ(kvb_receiver_poll(rc), KVB_POLL_FAILED);
    kvb_receiver_failure(rc, why, sizeof(why));
    CHECK_STR_CONTAINS(why, "destination state index 64 (entry 1) is outside this decode rank's "
                            "state pool of 64 states");
    kvb_receiver_destroy(rc);
    ex.state_indices = ok_state; /* the last slot is in */
    ex.num_state_indices = 1;
    CHECK_EQ(kvb_receiver_create(p.dec.mgr, p.boot.addr, 6, -1, &rc), KVB_OK);
    CHECK_EQ(kvb_receiver_init(rc, dst, 2, AUX, &ex), KVB_OK);
    kvb_receiver_destroy(rc);
    kvbh_pair_stop(&p);
    TEST_PASS("decode refuses an out-of-range state slot at init");
}

int main(int argc, char **argv)
{
    const char *only = argc > 1 ? argv[1] : "";
    kvbh_pair_t p;
    const int32_t src[2] = {0, 1}, good[2] = {1, 2}, good2[2] = {4, 7};
    CHECK_EQ(kvbh_pair_start(&p, &G, KVBH_MEM_PACKED, NULL, NULL), KVB_OK);
    fill_decode(&p);
    /* registers the decode */
    CHECK_EQ(kvbh_run_room_pages(&p.pre, &p.dec, p.boot.addr, 1, src, good, 2, AUX), 0);
    if (strcmp(only, "prefill") != 0)
        test_decode_side(&p);
    if (strcmp(only, "decode") != 0)
        test_prefill_side(&p);
    if (strcmp(only, "prefill") != 0)
        test_decode_state();
    /* still served */
    CHECK_EQ(kvbh_run_room_pages(&p.pre, &p.dec, p.boot.addr, 4, src, good2, 2, AUX), 0);
    CHECK(kvbh_canaries_ok(&p.dec, "decode")); /* nothing before or after its buffers */
    kvbh_pair_stop(&p);
    return 0;
}
