/* Review 2, finding 10: a prefill write that does not end even after its
 * session was closed (a stuck copy thread or device) must not be reported
 * to the decode as "nothing more lands": no Failed status, no ABORT_ACK.
 * Before the fix wait_xfer's last resort failed the room "without it" and
 * told the decode Failed while the copy was still running.
 *
 * One process (kvbh_pair, direct lane: decode pool from kvb_mem_alloc): the
 * prefill's transfer time-out is 0.3 s; its first direct-lane unit stalls
 * inside the fence for STALL_MS (test hook direct_stall_ms), longer than the
 * prefill's three waits (time-out, cancel, close_session). Asserted: the
 * sender ends Failed; while the unit is still stalled the decode's room is
 * not Failed (no status claimed the pages safe) and its pages are not safe;
 * after the stall the decode's own waiting time-out fails the room, its
 * revoked grant drains, the pages are guarded and no byte changes. */
#include "engine/engine_int.h"
#include "harness/kvb_cluster.h"
#include "kvb_test.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const kvbh_geom_t G = {4, 8, 128, 16, 1024, 0, 0};
#define NP 16
#define ROOM 91ull
#define GUARD 0x5A
#define STALL_MS 5000

int main(void)
{
    kvbh_pair_t pr;
    kvb_receiver_h rc;
    kvb_sender_h s;
    int32_t src[NP], dst[NP];
    char why[512];
    setenv("KVBRIDGE_TRANSFER_TIMEOUT", "0.3", 1);
    kvbh_knobs_t dk = {.wait_timeout = 7.0};
    CHECK_EQ(kvbh_pair_start(&pr, &G, KVBH_MEM_SHARED, NULL, &dk), KVB_OK);
    for (int i = 0; i < NP; i++) {
        src[i] = i;
        dst[i] = 100 + i;
    }
    CHECK_EQ(kvbh_pair_room(&pr, ROOM, src, dst, NP, &rc, &s), KVB_OK);
    KVB__HOOK_SET(direct_stall_ms, STALL_MS);
    double t0 = kvbh_now();
    kvb_sender_send(s, src, NP);
    kvb_poll_t ps = kvbh_wait_sender(s, 10);
    double t_sender = kvbh_now() - t0;
    kvb_sender_failure(s, why, sizeof(why));
    fprintf(stderr, "stuck: sender %s after %.3f s: %s\n", kvb_poll_string(ps), t_sender, why);
    CHECK_EQ(ps, KVB_POLL_FAILED);
    CHECK(t_sender < STALL_MS / 1000.0 - 0.5); /* the unit is still stalled */
    /* What a Failed status would have done by now (it travels in ms). */
    kvbh_sleep(0.5);
    kvb_poll_t pd = kvb_receiver_poll(rc);
    int safe = kvb_receiver_pages_safe(rc);
    double t_check = kvbh_now() - t0;
    fprintf(stderr,
            "stuck: decode room %s, pages_safe %d at %.3f s (the unit stalls until %.1f s)\n",
            kvb_poll_string(pd), safe, t_check, STALL_MS / 1000.0);
    CHECK(t_check < STALL_MS / 1000.0);
    CHECK(pd != KVB_POLL_FAILED && pd != KVB_POLL_SUCCESS);
    CHECK_EQ(safe, 0);
    /* After the stall: the decode's own time-out ends the room once the
     * grant drained; reuse at once, nothing may change after. */
    kvb_poll_t pend = kvbh_wait_receiver(rc, 15);
    double t_end = kvbh_now() - t0;
    CHECK_EQ(pend, KVB_POLL_FAILED);
    CHECK(kvb_receiver_pages_safe(rc));
    kvb_receiver_failure(rc, why, sizeof(why));
    fprintf(stderr, "stuck: decode room Failed and safe at %.3f s: %s\n", t_end, why);
    CHECK(t_end >= STALL_MS / 1000.0);
    kvbh_guard_fill(&pr.dec, dst, NP, -1, GUARD);
    kvbh_sleep(0.5);
    CHECK_EQ(kvbh_guard_bad(&pr.dec, dst, NP, -1, GUARD), (uint64_t)0);
    kvb_sender_destroy(s);
    kvb_receiver_destroy(rc);
    kvbh_pair_stop(&pr);
    TEST_PASS("a write stuck past its session's close: the decode is never told Failed");
    return 0;
}
