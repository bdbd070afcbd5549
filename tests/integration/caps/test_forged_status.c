/* Review 2.3: a status names the prefill rank it comes from, and the decode
 * counted Success from any rank toward the room's required responses, even
 * one that is not a source of the room. A peer that reaches the decode's
 * PULL socket then made a room Success before its bytes landed (the
 * framework reads garbage KV). Now a status from a rank that is not one of
 * the room's sources is ignored (logged): the room stays open, and the
 * genuine transfer still ends Success with every byte verified. */
#include "caps_wire.h"
#include "harness/kvb_cluster.h"
#include "kvb_test.h"

#include <string.h>

static const kvbh_geom_t G = {2, 2, 32, 4, 64, 0, 0};

int main(int argc, char **argv)
{
    kvbh_main_init(argc, argv);
    kvbh_boot_t b;
    kvbh_rank_t p, d;
    kvb_receiver_h rc;
    kvb_sender_h s;
    const uint64_t room = 7;
    int32_t src[8], dst[8];
    CHECK_EQ(kvbh_boot_start(&b, 0, NULL), 0);
    CHECK_EQ(kvbh_rank_start(&p, &G, KVB_MODE_PREFILL, b.addr, KVBH_MEM_MALLOC, NULL), KVB_OK);
    CHECK_EQ(kvbh_rank_start(&d, &G, KVB_MODE_DECODE, NULL, KVBH_MEM_MALLOC, NULL), KVB_OK);
    kvbh_room_pages(&G, room, 8, src, dst);
    CHECK_EQ(kvb_receiver_create(d.mgr, b.addr, room, -1, &rc), KVB_OK);
    CHECK_EQ(kvb_receiver_init(rc, dst, 8, kvbh_room_aux(room), NULL), KVB_OK);

    /* Success for the room from rank 3: the room's only source is rank 0. */
    caps_push_t push;
    kvb__frames_buf_t f;
    kvb__frames_err_t e;
    kvb__status_msg_t forged = {room, KVB_POLL_SUCCESS, 3};
    caps_push_open(&push, d.mgr, NULL, NULL, NULL);
    kvb__frames_buf_init(&f);
    CHECK_EQ(kvb__frames_encode_status(&forged, &e, &f), KVB_OK);
    caps_push_send(&push, &f);
    kvbh_sleep(0.3);
    kvb_poll_t st = kvb_receiver_poll(rc);
    fprintf(stderr, "forged Success from a non-source rank: room %s\n", kvb_poll_string(st));
    CHECK(st == KVB_POLL_WAITING_FOR_INPUT);

    /* The genuine transfer ends Success, bytes verified. */
    kvbh_fill(&p, room, src, 8, kvbh_room_aux(room));
    CHECK_EQ(kvb_sender_create(p.mgr, b.addr, room, &s), KVB_OK);
    CHECK_EQ(kvbh_wait_sender_ready(s, 10), 0);
    CHECK_EQ(kvb_sender_init(s, 8, kvbh_room_aux(room)), KVB_OK);
    CHECK_EQ(kvb_sender_send(s, src, 8), KVB_OK);
    CHECK_EQ(kvbh_wait_receiver(rc, 10), KVB_POLL_SUCCESS);
    CHECK_EQ(kvbh_verify(&d, room, dst, 8, kvbh_room_aux(room)), (uint64_t)0);
    kvb_sender_destroy(s);
    kvb_receiver_destroy(rc);
    kvb__frames_buf_free(&f);
    caps_push_close(&push);
    kvbh_rank_stop(&d);
    kvbh_rank_stop(&p);
    kvbh_boot_stop(&b);
    TEST_PASS("a status from a rank that is no source of the room is ignored");
    return 0;
}
