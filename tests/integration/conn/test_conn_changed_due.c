/* kvb_manager_changed lists rooms whose time-out passed, without a poll:
 * the manager's once-a-second sweep finds them, so a caller that polls only
 * what changed still sees them fail. Real managers (a bootstrap server, one
 * prefill and one decode rank in this process), time-outs of 1 s:
 * - decode: a receiver inited and never sent to (WaitingForInput), never
 *   polled, is listed within the time-out + 2 sweeps, and its poll then
 *   fails it (Failed once its writer grant drained) with the waiting
 *   time-out's reason;
 * - prefill: a sender whose decode never sends transfer info
 *   (Bootstrapping) likewise, with the bootstrap time-out's reason;
 * - a room not yet due is not listed before its time-out. */
#include "harness/kvb_cluster.h"
#include "kvb_test.h"

#include <stdio.h>
#include <string.h>

#define TIMEOUT_S 1.0
#define ROOM_WAIT 9400001ull /* decode side: inited, never sent */
#define ROOM_BOOT 9400002ull /* prefill side: no decode ever names it */

/* Everything the list holds now. */
static size_t drain(kvb_manager_h m, uint64_t *ids, size_t cap)
{
    size_t n = 0;
    CHECK_EQ(kvb_manager_changed(m, ids, cap, &n), KVB_OK);
    return n;
}

/* Is room among what the list holds now? */
static bool listed_now(kvb_manager_h m, uint64_t room)
{
    uint64_t ids[16];
    size_t n = drain(m, ids, 16);
    for (size_t i = 0; i < n; i++)
        if (ids[i] == room)
            return true;
    return false;
}

/* Wait (bounded) until room is listed; the seconds it took, or -1. */
static double wait_listed(kvb_manager_h m, uint64_t room, double bound_s)
{
    uint64_t ids[16];
    double t0 = kvbh_now();
    while (kvbh_now() - t0 < bound_s) {
        size_t n = drain(m, ids, 16);
        for (size_t i = 0; i < n; i++)
            if (ids[i] == room)
                return kvbh_now() - t0;
        kvbh_sleep(0.05);
    }
    return -1;
}

static void decode_waiting(kvbh_cluster_t *c)
{
    int32_t src[2], dst[2];
    kvb_receiver_h rc;
    uint64_t ids[16];
    char why[256];
    kvbh_room_pages(&c->g, ROOM_WAIT, 2, src, dst);
    CHECK_EQ(kvb_receiver_create(c->dec[0].mgr, c->boot_addr, ROOM_WAIT, -1, &rc), KVB_OK);
    CHECK_EQ(kvb_receiver_init(rc, dst, 2, kvbh_room_aux(ROOM_WAIT), NULL), KVB_OK);
    double t_init = kvbh_now();
    drain(c->dec[0].mgr, ids, 16); /* its own first states */
    kvbh_sleep(TIMEOUT_S / 2);
    CHECK(!listed_now(c->dec[0].mgr, ROOM_WAIT)); /* not due yet */
    double at = wait_listed(c->dec[0].mgr, ROOM_WAIT, TIMEOUT_S + 5);
    double since = at < 0 ? -1 : kvbh_now() - t_init;
    printf("# decode: listed %.2f s after init (time-out %.1f s, sweep 1 s)\n", since, TIMEOUT_S);
    CHECK(at >= 0);
    CHECK(since >= TIMEOUT_S);
    /* the poll fails the room; it reads Transferring until nothing more
     * of it can land (its writer grant revoked and drained), then Failed */
    CHECK(kvb_receiver_poll(rc) != KVB_POLL_WAITING_FOR_INPUT);
    CHECK_EQ(kvbh_wait_receiver(rc, 10), KVB_POLL_FAILED);
    kvb_receiver_failure(rc, why, sizeof(why));
    CHECK(strstr(why, "timed out after") != NULL && strstr(why, "WaitingForInput") != NULL);
    kvb_receiver_destroy(rc);
}

static void prefill_bootstrapping(kvbh_cluster_t *c)
{
    kvbh_rank_t *p = kvbh_cluster_prefill(c, 0, 0, 0);
    kvb_sender_h s;
    uint64_t ids[16];
    char why[256];
    CHECK_EQ(kvb_sender_create(p->mgr, c->boot_addr, ROOM_BOOT, &s), KVB_OK);
    double t0 = kvbh_now();
    drain(p->mgr, ids, 16); /* its own first state */
    kvbh_sleep(TIMEOUT_S / 2);
    /* not due yet (the decode's abort of ROOM_WAIT may still be landing) */
    CHECK(!listed_now(p->mgr, ROOM_BOOT));
    double at = wait_listed(p->mgr, ROOM_BOOT, TIMEOUT_S + 5);
    double since = at < 0 ? -1 : kvbh_now() - t0;
    printf("# prefill: listed %.2f s after create (time-out %.1f s)\n", since, TIMEOUT_S);
    CHECK(at >= 0);
    CHECK(since >= TIMEOUT_S);
    CHECK_EQ(kvb_sender_poll(s), KVB_POLL_FAILED);
    kvb_sender_failure(s, why, sizeof(why));
    CHECK(strstr(why, "timed out after") != NULL && strstr(why, "Bootstrapping") != NULL);
    kvb_sender_destroy(s);
}

int main(void)
{
    kvbh_cluster_cfg_t cfg = {
        .g = {2, 2, 16, 4, 512, 0, 0}, .ptp = 1, .ppp = 1, .pdp = 1, .dtp = 1};
    cfg.pre.boot_timeout = TIMEOUT_S;
    cfg.dec.wait_timeout = TIMEOUT_S;
    kvbh_cluster_t c;
    CHECK_EQ(kvbh_cluster_start(&c, &cfg), KVB_OK);
    decode_waiting(&c);
    prefill_bootstrapping(&c);
    kvbh_cluster_stop(&c);
    TEST_PASS("kvb_manager_changed lists rooms whose time-out passed, unpolled");
    return 0;
}
