/* Review 2.3: a status names the prefill rank it comes from, and the decode
 * counted Success from any rank toward the room's required responses, even
 * one that is not a source of the room. A peer that reaches the decode's
 * PULL socket then made a room Success before its bytes landed (the
 * framework reads garbage KV). Now a status from a rank that is not one of
 * the room's sources is ignored (logged): the room stays open, and the
 * genuine transfer still ends Success with every byte verified. */
#include "harness/kvb_cluster.h"
#include "kvb_test.h"
#include "dialect/sglang2025/frames.h"

static const kvbh_geom_t G = {2, 2, 32, 4, 64, 0, 0};

int main(void)
{
    kvbh_pair_t pr;
    kvb_receiver_h rc;
    kvb_sender_h s;
    const uint64_t room = 7;
    int32_t src[8], dst[8];
    CHECK_EQ(kvbh_pair_start(&pr, &G, KVBH_MEM_MALLOC, NULL, NULL), KVB_OK);
    kvbh_rank_t *p = &pr.pre, *d = &pr.dec;
    const char *boot = pr.boot.addr;
    kvbh_room_pages(&G, room, 8, src, dst);
    CHECK_EQ(kvb_receiver_create(d->mgr, boot, room, -1, &rc), KVB_OK);
    CHECK_EQ(kvb_receiver_init(rc, dst, 8, kvbh_room_aux(room), NULL), KVB_OK);

    /* Success for the room from rank 3: the room's only source is rank 0. */
    kvbh_push_t push;
    kvb__frames_buf_t f;
    kvb__frames_err_t e;
    kvb__status_msg_t forged = {room, KVB_POLL_SUCCESS, 3, NULL, 0};
    CHECK_EQ(kvbh_push_open(&push, kvb_manager_endpoint(d->mgr), NULL), 0);
    kvb__frames_buf_init(&f);
    CHECK_EQ(kvb__frames_encode_status(&forged, &e, &f), KVB_OK);
    CHECK_EQ(kvbh_push_send(&push, &f), 0);
    kvbh_sleep(0.3);
    kvb_poll_t st = kvb_receiver_poll(rc);
    fprintf(stderr, "forged Success from a non-source rank: room %s\n", kvb_poll_string(st));
    CHECK(st == KVB_POLL_WAITING_FOR_INPUT);

    /* The genuine transfer ends Success, bytes verified. */
    kvbh_fill(p, room, src, 8, kvbh_room_aux(room));
    CHECK_EQ(kvb_sender_create(p->mgr, boot, room, &s), KVB_OK);
    CHECK_EQ(kvbh_wait_sender_ready(s, 10), 0);
    CHECK_EQ(kvb_sender_init(s, 8, kvbh_room_aux(room)), KVB_OK);
    CHECK_EQ(kvb_sender_send(s, src, 8), KVB_OK);
    CHECK_EQ(kvbh_wait_receiver(rc, 10), KVB_POLL_SUCCESS);
    CHECK_EQ(kvbh_verify(d, room, dst, 8, kvbh_room_aux(room)), (uint64_t)0);
    kvb_sender_destroy(s);
    kvb_receiver_destroy(rc);
    kvb__frames_buf_free(&f);
    kvbh_push_close(&push);
    kvbh_pair_stop(&pr);
    TEST_PASS("a status from a rank that is no source of the room is ignored");
    return 0;
}
