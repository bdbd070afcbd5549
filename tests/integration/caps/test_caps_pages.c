/* Destination page indices are checked against the decode's KV pool (review
 * 2.5): on the decode at kvb_receiver_init, and on the prefill from the
 * decode's "kv_lens=" registration extension. An out-of-range page fails
 * the room with a clear reason and writes nothing: the first page of the
 * next layer buffer (adjacent registered memory) keeps its bytes, and a
 * good room still verifies afterwards. */
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include <zmq.h>

#include "caps_util.h"
#include "kvb_test.h"
#include "proto/frames.h"

/* The bytes right after layer 0's pool: layer 1's first page. */
static uint64_t next_to_pool(const caps_pair_t *p)
{
    return caps_changed(&p->dec, CAPS_OFF(1), CAPS_ITEM);
}

static kvb_poll_t wait_ready(kvb_sender_h s)
{
    double end = kvb_test_now_s() + 5;
    kvb_poll_t st = kvb_sender_poll(s);
    while (st == KVB_POLL_BOOTSTRAPPING && kvb_test_now_s() < end) {
        usleep(2000);
        st = kvb_sender_poll(s);
    }
    return st;
}

static void test_decode_side(caps_pair_t *p)
{
    const int32_t src[2] = {0, 1}, dst[2] = {3, CAPS_POOL};
    kvb_sender_h s;
    kvb_receiver_h rc;
    char why[512];
    caps_fill_prefill(&p->pre, 2, src, 2);
    CHECK_EQ(kvb_sender_create(p->pre.mgr, p->boot_addr, 2, &s), KVB_OK);
    CHECK_EQ(kvb_receiver_create(p->dec.mgr, p->boot_addr, 2, -1, &rc), KVB_OK);
    CHECK_EQ(kvb_sender_init(s, 2, 0), KVB_OK);
    CHECK_EQ(kvb_receiver_init(rc, dst, 2, 0, NULL), KVB_ERR_INVALID);
    CHECK_EQ(kvb_receiver_poll(rc), KVB_POLL_FAILED);
    kvb_receiver_failure(rc, why, sizeof(why));
    CHECK_STR_CONTAINS(why, "destination page index 8 (entry 1) is outside this decode rank's KV "
                            "pool of 8 pages");
    /* Nothing was sent: the prefill never gets a transfer info. */
    usleep(200000);
    CHECK_EQ(kvb_sender_poll(s), KVB_POLL_BOOTSTRAPPING);
    kvb_receiver_destroy(rc);
    kvb_sender_destroy(s);
    CHECK_EQ(next_to_pool(p), 0);
    TEST_PASS("decode refuses an out-of-range page at init");
}

/* A transfer info as the decode would send it, pages unchecked. */
static void forged_transfer(caps_pair_t *p, uint64_t room, const int32_t *pages, size_t n)
{
    char ip[64], pip[64], ep[128];
    uint16_t port, pport;
    kvb__xfer_msg_t x = {0};
    kvb__frames_buf_t b;
    const char *sid = kvb_engine_session_id(p->dec.eng);
    caps_endpoint(p->dec.mgr, ip, sizeof(ip), &port);
    caps_endpoint(p->pre.mgr, pip, sizeof(pip), &pport);
    x.room = room;
    x.ip = ip;
    x.ip_len = strlen(ip);
    x.port = port;
    x.session_id = sid;
    x.session_id_len = strlen(sid);
    x.pages = kvb__i32_view_of(pages, n);
    x.aux_index = 0;
    x.required_dst_info_num = 1;
    kvb__frames_buf_init(&b);
    CHECK_EQ(kvb__frames_encode_transfer(&x, NULL, &b), KVB_OK);
    void *zctx = zmq_ctx_new(), *z = zmq_socket(zctx, ZMQ_PUSH);
    int zero = 0;
    zmq_setsockopt(z, ZMQ_LINGER, &zero, sizeof(zero));
    snprintf(ep, sizeof(ep), "tcp://%s:%u", pip, pport);
    CHECK_EQ(zmq_connect(z, ep), 0);
    for (size_t i = 0; i < b.n; i++) {
        kvb__frame_t f = kvb__frames_buf_get(&b, i);
        CHECK(zmq_send(z, f.data, f.len, i + 1 < b.n ? ZMQ_SNDMORE : 0) >= 0);
    }
    usleep(100000); /* linger 0: give the message time to leave */
    zmq_close(z);
    zmq_ctx_term(zctx);
    kvb__frames_buf_free(&b);
}

static void test_prefill_side(caps_pair_t *p)
{
    const int32_t src[2] = {0, 1}, dst[2] = {3, CAPS_POOL};
    kvb_sender_h s;
    char why[512];
    caps_fill_prefill(&p->pre, 3, src, 2);
    CHECK_EQ(kvb_sender_create(p->pre.mgr, p->boot_addr, 3, &s), KVB_OK);
    CHECK_EQ(kvb_sender_init(s, 2, 0), KVB_OK);
    forged_transfer(p, 3, dst, 2);
    CHECK_EQ(wait_ready(s), KVB_POLL_WAITING_FOR_INPUT);
    CHECK_EQ(kvb_sender_send(s, src, 2), KVB_OK);
    CHECK_EQ(caps_wait_send(s, 5), KVB_POLL_FAILED);
    kvb_sender_failure(s, why, sizeof(why));
    CHECK_STR_CONTAINS(why, "destination page index 8 (entry 1) is outside decode");
    CHECK_STR_CONTAINS(why, "KV pool of 8 pages; nothing written");
    kvb_sender_destroy(s);
    CHECK_EQ(next_to_pool(p), 0);
    CHECK_EQ(caps_changed(&p->dec, CAPS_OFF(0) + 3 * CAPS_ITEM, CAPS_ITEM), 0);
    TEST_PASS("prefill refuses a transfer info past the decode's kv_lens");
}

/* argv[1] "decode" or "prefill": that half only (to see each fail alone). */
int main(int argc, char **argv)
{
    const char *only = argc > 1 ? argv[1] : "";
    caps_pair_t p;
    const int32_t src[2] = {0, 1}, good[2] = {1, 2}, good2[2] = {4, 7};
    CHECK_EQ(caps_pair_start(&p, NULL), 0);
    CHECK_EQ(caps_room(&p, 1, src, good, 2, 10), 0); /* registers the decode */
    if (strcmp(only, "prefill") != 0)
        test_decode_side(&p);
    if (strcmp(only, "decode") != 0)
        test_prefill_side(&p);
    CHECK_EQ(caps_room(&p, 4, src, good2, 2, 10), 0); /* still served */
    caps_pair_stop(&p);
    return 0;
}
