/* kvb_manager_traffic: control messages, bootstrap requests and heartbeats
 * are counted where they happen, grow with rooms only where they should
 * (control messages) and with time where they should (heartbeats), and only
 * the groups a caller's field_mask names are written. */
#include "harness/kvb_cluster.h"
#include "kvb_test.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SENTINEL 0xfeedfacecafebeefull

static kvb_manager_traffic_t traffic(kvb_manager_h m)
{
    kvb_manager_traffic_t t = {.field_mask = KVB_MANAGER_TRAFFIC_CONTROL |
                                             KVB_MANAGER_TRAFFIC_BOOTSTRAP |
                                             KVB_MANAGER_TRAFFIC_HEARTBEAT};
    kvb_manager_traffic(m, &t);
    return t;
}

static void show(const char *who, const kvb_manager_traffic_t *t)
{
    fprintf(stderr,
            "%s: control sent %llu (failed %llu) received %llu; bootstrap %llu (failed %llu); "
            "heartbeats %llu (failed %llu)\n",
            who, (unsigned long long)t->control_sent, (unsigned long long)t->control_send_failed,
            (unsigned long long)t->control_received, (unsigned long long)t->bootstrap_requests,
            (unsigned long long)t->bootstrap_failed, (unsigned long long)t->heartbeat_requests,
            (unsigned long long)t->heartbeat_failed);
}

/* Only the named groups are written: an older, shorter struct stays intact. */
static void mask_respected(kvb_manager_h m)
{
    kvb_manager_traffic_t t;
    memset(&t, 0xff, sizeof(t));
    for (uint64_t *v = &t.control_sent; v <= &t.heartbeat_failed; v++)
        *v = SENTINEL;
    t.field_mask = KVB_MANAGER_TRAFFIC_HEARTBEAT;
    kvb_manager_traffic(m, &t);
    CHECK_EQ(t.control_sent, SENTINEL);
    CHECK_EQ(t.control_received, SENTINEL);
    CHECK_EQ(t.bootstrap_requests, SENTINEL);
    CHECK(t.heartbeat_requests != SENTINEL);
}

int main(void)
{
    /* Heartbeats every 0.2 s (test floor) so a 1 s window holds several. */
    setenv("KVBRIDGE_HEARTBEAT_FLOOR", "0.1", 1);
    setenv("KVBRIDGE_HEARTBEAT_INTERVAL", "0.2", 1);
    const kvbh_cluster_cfg_t cfg = {
        .g = {2, 2, 16, 4, 512, 0, 0}, .ptp = 1, .ppp = 1, .pdp = 1, .dtp = 1};
    kvbh_room_opts_t o = {1, 0, 0, -1, 0, 0, NULL, 0};
    kvbh_cluster_t c;
    CHECK_EQ(kvbh_cluster_start(&c, &cfg), KVB_OK);
    kvb_manager_h pm = kvbh_cluster_prefill(&c, 0, 0, 0)->mgr, dm = c.dec[0].mgr;
    kvb_manager_traffic_t p0 = traffic(pm), d0 = traffic(dm);
    show("prefill at start", &p0);
    CHECK(p0.bootstrap_requests >= 1);  /* its registration */
    CHECK_EQ(p0.heartbeat_requests, 0); /* only decodes beat */

    CHECK_EQ(kvbh_run_rooms(&c, 10, 7000000, &o), 0); /* warm: routes resolved */
    kvb_manager_traffic_t p1 = traffic(pm), d1 = traffic(dm);
    const int rooms = 200;
    for (int done = 0; done < rooms; done += 20)
        CHECK_EQ(kvbh_run_rooms(&c, 20, 7100000 + (uint64_t)done, &o), 0);
    kvb_manager_traffic_t p2 = traffic(pm), d2 = traffic(dm);
    show("prefill", &p2);
    show("decode", &d2);
    uint64_t d_sent = d2.control_sent - d1.control_sent;
    uint64_t p_recv = p2.control_received - p1.control_received;
    uint64_t p_sent = p2.control_sent - p1.control_sent;
    fprintf(stderr, "per room: decode sent %.2f, prefill received %.2f, prefill sent %.2f\n",
            (double)d_sent / rooms, (double)p_recv / rooms, (double)p_sent / rooms);
    /* Every room costs the decode at least one message (its transfer info),
     * which the prefill receives; nothing was dropped on loopback. */
    CHECK(d_sent >= (uint64_t)rooms);
    CHECK(p_recv >= d_sent);
    CHECK(d_sent <= 4 * (uint64_t)rooms); /* bounded per room */
    CHECK_EQ(d2.control_send_failed, 0);
    CHECK_EQ(p2.control_send_failed, 0);
    /* Warm routes: no bootstrap look-up per room. */
    CHECK(d2.bootstrap_requests - d1.bootstrap_requests < 5);
    CHECK(d0.bootstrap_requests <= d1.bootstrap_requests);

    /* Heartbeats grow with time, not rooms: wait 1 s with no rooms. */
    kvbh_sleep(1.0);
    kvb_manager_traffic_t d3 = traffic(dm);
    show("decode after 1 s idle", &d3);
    CHECK(d3.heartbeat_requests >= d2.heartbeat_requests + 2);
    CHECK(d3.heartbeat_requests <= d2.heartbeat_requests + 12);
    CHECK_EQ(d3.heartbeat_failed, 0);
    CHECK_EQ(d3.control_sent, d2.control_sent);
    mask_respected(dm);
    kvbh_cluster_stop(&c);
    TEST_PASS("traffic counters count what happens and only the named groups");
    return 0;
}
