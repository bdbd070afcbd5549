/* kvb_manager_changed: the ids of rooms whose poll answer may have changed,
 * on real managers (a bootstrap server, one prefill and one decode rank in
 * this process). Checks: exact ids, oldest change first, each room at most
 * once however often it changed, cap respected with the rest kept for the
 * next call, nothing when nothing changed, a room freed while listed never
 * returned, bad arguments refused. */
#include "harness/kvb_cluster.h"
#include "kvb_test.h"

#include <stdio.h>
#include <string.h>

#define ROOMS 8
#define PAGES 2
#define FIRST 9300000ull
#define MAXIDS 64

static kvb_receiver_h rc[ROOMS];
static kvb_sender_h snd[ROOMS];
static int32_t src[ROOMS][PAGES], dst[ROOMS][PAGES];

/* Every id listed now, cap at a time (3: the caps split the list); checks
 * that no call passes its cap and that no id comes twice. */
static size_t drain(kvb_manager_h m, uint64_t *ids)
{
    size_t total = 0, n = 0;
    do {
        uint64_t got[4] = {0, 0, 0, 0};
        CHECK_EQ(kvb_manager_changed(m, got, 3, &n), KVB_OK);
        CHECK(n <= 3);
        CHECK_EQ(got[3], 0); /* nothing past the cap */
        for (size_t i = 0; i < n; i++) {
            for (size_t k = 0; k < total; k++)
                CHECK(ids[k] != got[i]); /* each room once */
            CHECK(total < MAXIDS);
            ids[total++] = got[i];
        }
    } while (n == 3);
    return total;
}

static bool listed(const uint64_t *ids, size_t n, uint64_t id)
{
    for (size_t i = 0; i < n; i++)
        if (ids[i] == id)
            return true;
    return false;
}

static void bad_arguments(kvb_manager_h m)
{
    uint64_t ids[2];
    size_t n = 77;
    CHECK_EQ(kvb_manager_changed(NULL, ids, 2, &n), KVB_ERR_INVALID);
    CHECK_EQ(kvb_manager_changed(m, NULL, 2, &n), KVB_ERR_INVALID);
    CHECK_EQ(kvb_manager_changed(m, ids, 2, NULL), KVB_ERR_INVALID);
    CHECK_EQ(n, 77);
    CHECK_EQ(kvb_manager_changed(m, NULL, 0, &n), KVB_OK); /* cap 0: takes nothing */
    CHECK_EQ(n, 0);
}

/* Receivers of every room, created and inited in order: each changed twice
 * (Bootstrapping, WaitingForInput), listed once, in creation order. */
static void receivers_in_order(kvbh_cluster_t *c)
{
    uint64_t ids[MAXIDS], got[3];
    size_t n = 0;
    for (int j = 0; j < ROOMS; j++) {
        uint64_t room = FIRST + (uint64_t)j;
        kvbh_room_pages(&c->g, room, PAGES, src[j], dst[j]);
        CHECK_EQ(kvb_receiver_create(c->dec[0].mgr, c->boot_addr, room, -1, &rc[j]), KVB_OK);
        CHECK_EQ(kvb_receiver_init(rc[j], dst[j], PAGES, kvbh_room_aux(room), NULL), KVB_OK);
    }
    /* cap 3 three times: 3 + 3 + 2, oldest first, the rest kept between */
    for (int call = 0, at = 0; call < 3; call++) {
        CHECK_EQ(kvb_manager_changed(c->dec[0].mgr, got, 3, &n), KVB_OK);
        CHECK_EQ(n, call < 2 ? 3 : 2);
        for (size_t i = 0; i < n; i++, at++)
            CHECK_EQ(got[i], FIRST + (uint64_t)at);
    }
    CHECK_EQ(drain(c->dec[0].mgr, ids), 0); /* nothing changed since */
}

/* Send rooms one at a time in the order 3, 1, 0, 2, each to Success before
 * the next: the decode lists exactly those, in that order. */
static void sends_in_order(kvbh_cluster_t *c)
{
    static const int order[4] = {3, 1, 0, 2};
    uint64_t ids[MAXIDS];
    for (int k = 0; k < 4; k++) {
        int j = order[k];
        uint64_t room = FIRST + (uint64_t)j;
        CHECK_EQ(kvb_sender_init(snd[j], PAGES, kvbh_room_aux(room)), KVB_OK);
        CHECK_EQ(kvb_sender_send(snd[j], src[j], PAGES), KVB_OK);
        CHECK_EQ(kvbh_wait_receiver(rc[j], 10), KVB_POLL_SUCCESS);
        CHECK_EQ(kvbh_verify(&c->dec[0], room, dst[j], PAGES, kvbh_room_aux(room)), 0);
    }
    CHECK_EQ(drain(c->dec[0].mgr, ids), 4);
    for (int k = 0; k < 4; k++)
        CHECK_EQ(ids[k], FIRST + (uint64_t)order[k]);
    for (int k = 0; k < 4; k++)
        CHECK_EQ(kvbh_wait_sender(snd[order[k]], 10), KVB_POLL_SUCCESS);
    size_t n = drain(c->pre[0].mgr, ids); /* the prefill: those four, once each */
    CHECK_EQ(n, 4);
    for (int k = 0; k < 4; k++)
        CHECK(listed(ids, n, FIRST + (uint64_t)order[k]));
}

/* Rooms 4 and 5 aborted by the decode (both listed), 4's receiver then
 * destroyed (its room freed while listed): only 5 comes back. */
static void freed_not_listed(kvbh_cluster_t *c)
{
    uint64_t ids[MAXIDS];
    kvb_receiver_abort(rc[4]);
    kvb_receiver_abort(rc[5]);
    kvb_receiver_destroy(rc[4]);
    rc[4] = NULL;
    /* 5 ends Failed once its source confirmed the abort (a further change) */
    CHECK_EQ(kvbh_wait_receiver(rc[5], 10), KVB_POLL_FAILED);
    kvbh_sleep(0.2); /* the prefill's answer for the freed room 4, if any */
    size_t n = drain(c->dec[0].mgr, ids);
    CHECK_EQ(n, 1);
    CHECK_EQ(ids[0], FIRST + 5);
    CHECK_EQ(kvbh_wait_sender(snd[5], 10), KVB_POLL_FAILED); /* the abort reached it */
}

int main(void)
{
    const kvbh_cluster_cfg_t cfg = {
        .g = {2, 2, 16, 4, 512, 0, 0}, .ptp = 1, .ppp = 1, .pdp = 1, .dtp = 1};
    kvbh_cluster_t c;
    uint64_t ids[MAXIDS];
    CHECK_EQ(kvbh_cluster_start(&c, &cfg), KVB_OK);
    kvbh_rank_t *p = kvbh_cluster_prefill(&c, 0, 0, 0);
    bad_arguments(c.dec[0].mgr);
    CHECK_EQ(drain(c.dec[0].mgr, ids), 0); /* no room yet */
    CHECK_EQ(drain(p->mgr, ids), 0);
    receivers_in_order(&c);
    for (int j = 0; j < ROOMS; j++) {
        uint64_t room = FIRST + (uint64_t)j;
        kvbh_fill(p, room, src[j], PAGES, kvbh_room_aux(room));
        CHECK_EQ(kvb_sender_create(p->mgr, c.boot_addr, room, &snd[j]), KVB_OK);
        CHECK_EQ(kvbh_wait_sender_ready(snd[j], 10), 0);
    }
    /* the prefill: every room once (transfer info, sender), whatever order */
    size_t n = drain(p->mgr, ids);
    CHECK_EQ(n, ROOMS);
    for (int j = 0; j < ROOMS; j++)
        CHECK(listed(ids, n, FIRST + (uint64_t)j));
    CHECK_EQ(drain(c.dec[0].mgr, ids), 0); /* the decode saw no change */
    sends_in_order(&c);
    freed_not_listed(&c);
    for (int j = 0; j < ROOMS; j++) {
        kvb_sender_destroy(snd[j]); /* 6 and 7 end aborted: listed at the stop */
        kvb_receiver_destroy(rc[j]);
    }
    kvbh_cluster_stop(&c);
    TEST_PASS("kvb_manager_changed lists each changed room once, oldest first, within cap");
    return 0;
}
