/* Review 2, finding 6: a registration flood must not break a decode-prefill
 * pair. KVBRIDGE_MAX_REGISTRATIONS=4, bogus KV-args from distinct claimed
 * peers ("10.9.9.i:1") through a raw ZeroMQ PUSH.
 *   flood:   the decode resolved its route (its KV args are at the prefill)
 *            but has sent no transfer info yet when the flood comes; the
 *            flood is refused, not served by evicting it: room 1 and the
 *            rooms after it (no flood) succeed, every byte verified.
 *   recover: with KVBRIDGE_REGISTRATION_GRACE=0 the decode's registration is
 *            evicted by the same flood, and room 11 fails ("never its KV
 *            args"); the decode hears Failed and re-sends its KV args with
 *            its next receiver, so room 12 succeeds. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness/kvb_cluster.h"
#include "kvb_test.h"
#include "dialect/sglang2025/frames.h"

#define FLOOD 8

static const kvbh_geom_t G = {
    .layers = 2, .heads = 1, .head_bytes = 64, .page = 4, .pool_pages = 16, .mla = 1};

static kvb_manager_stats_t stats(kvb_manager_h m)
{
    kvb_manager_stats_t s;
    kvb_manager_stats(m, &s);
    return s;
}

/* FLOOD bogus registrations (sessions and endpoints 10.9.9.i:1), then a
 * malformed message on the same pipe: once it is counted, the prefill has
 * handled the registrations. */
static void flood(kvbh_pair_t *p)
{
    kvbh_push_t z;
    kvb__frames_buf_t b;
    char sid[32];
    const void *f[1] = {"garbage"};
    size_t l[1] = {7};
    uint64_t bad = stats(p->pre.mgr).bad_messages;
    kvb__frames_buf_init(&b);
    CHECK_EQ(kvbh_push_open(&z, kvb_manager_endpoint(p->pre.mgr), NULL), 0);
    for (int i = 0; i < FLOOD; i++) {
        snprintf(sid, sizeof(sid), "10.9.9.%d:1", i);
        CHECK_EQ(kvbh_reg_frames(&b, sid, sid, 0x100000, 4096, 2, 0x200000, 256), KVB_OK);
        CHECK_EQ(kvbh_push_send(&z, &b), 0);
    }
    CHECK_EQ(kvbh_push_frames(&z, f, l, 1), 0);
    double end = kvbh_now() + 5;
    while (stats(p->pre.mgr).bad_messages <= bad && kvbh_now() < end)
        kvbh_sleep(0.002);
    CHECK(stats(p->pre.mgr).bad_messages > bad);
    kvbh_push_close(&z);
    kvb__frames_buf_free(&b);
}

/* Room room of 2 pages, the flood between the receiver's creation (route
 * resolved, KV args sent) and its init; the receiver's final poll, its
 * failure reason into why. */
static kvb_poll_t room_with_flood(kvbh_pair_t *p, uint64_t room, const int32_t *src,
                                  const int32_t *dst, char *why, size_t wl)
{
    kvb_receiver_h rc;
    kvb_sender_h s;
    why[0] = '\0';
    CHECK_EQ(kvb_receiver_create(p->dec.mgr, p->boot.addr, room, -1, &rc), KVB_OK);
    kvbh_sleep(0.3);
    flood(p);
    CHECK_EQ(kvb_receiver_init(rc, dst, 2, 1, NULL), KVB_OK);
    kvbh_fill(&p->pre, room, src, 2, 1);
    CHECK_EQ(kvb_sender_create(p->pre.mgr, p->boot.addr, room, &s), KVB_OK);
    CHECK_EQ(kvbh_wait_sender_ready(s, 5), 0);
    CHECK_EQ(kvb_sender_init(s, 2, 1), KVB_OK);
    CHECK_EQ(kvb_sender_send(s, src, 2), KVB_OK);
    kvb_poll_t ss = kvbh_wait_sender(s, 10), rs = kvbh_wait_receiver(rc, 10);
    if (rs == KVB_POLL_FAILED) {
        kvb_sender_failure(s, why, wl);
        fprintf(stderr, "room %llu: sender %s, receiver %s: %s\n", (unsigned long long)room,
                kvb_poll_string(ss), kvb_poll_string(rs), why);
    }
    CHECK_EQ(ss, rs);
    if (rs == KVB_POLL_SUCCESS)
        CHECK_EQ(kvbh_verify(&p->dec, room, dst, 2, 1), 0);
    kvb_sender_destroy(s);
    kvb_receiver_destroy(rc);
    return rs;
}

static void test_flood(void)
{
    kvbh_pair_t p;
    char why[1024];
    const int32_t src[2] = {0, 1}, dst[2] = {0, 1};
    CHECK_EQ(kvbh_pair_start(&p, &G, KVBH_MEM_PACKED, NULL, NULL), KVB_OK);
    CHECK_EQ(room_with_flood(&p, 1, src, dst, why, sizeof(why)), KVB_POLL_SUCCESS);
    kvb_manager_stats_t s = stats(p.pre.mgr);
    CHECK_EQ(s.registrations, 4);
    CHECK_EQ(s.registrations_evicted, 0);
    CHECK_EQ(s.registrations_refused, FLOOD - 3); /* the decode's and 3 bogus fit */
    const int32_t src2[2] = {2, 3}, dst2[2] = {4, 5}, src3[2] = {4, 5}, dst3[2] = {8, 9};
    CHECK_EQ(kvbh_run_room_pages(&p.pre, &p.dec, p.boot.addr, 2, src2, dst2, 2, 2), 0);
    kvbh_sleep(1.0);
    CHECK_EQ(kvbh_run_room_pages(&p.pre, &p.dec, p.boot.addr, 3, src3, dst3, 2, 3), 0);
    CHECK(kvbh_canaries_ok(&p.dec, "decode"));
    kvbh_pair_stop(&p);
    TEST_PASS("registration flood refused; the decode's rooms are served");
}

static void test_recover(void)
{
    kvbh_pair_t p;
    char why[1024];
    const int32_t src[2] = {0, 1}, dst[2] = {0, 1}, src2[2] = {2, 3}, dst2[2] = {4, 5};
    setenv("KVBRIDGE_REGISTRATION_GRACE", "0", 1);
    CHECK_EQ(kvbh_pair_start(&p, &G, KVBH_MEM_PACKED, NULL, NULL), KVB_OK);
    CHECK_EQ(room_with_flood(&p, 11, src, dst, why, sizeof(why)), KVB_POLL_FAILED);
    CHECK(strstr(why, "never its KV args") != NULL);
    CHECK(stats(p.pre.mgr).registrations_evicted >= 1);
    /* the decode re-sends its KV args with its next receiver */
    CHECK_EQ(kvbh_run_room_pages(&p.pre, &p.dec, p.boot.addr, 12, src2, dst2, 2, 2), 0);
    CHECK(kvbh_canaries_ok(&p.dec, "decode"));
    kvbh_pair_stop(&p);
    unsetenv("KVBRIDGE_REGISTRATION_GRACE");
    TEST_PASS("a decode whose registration was evicted re-registers after the failed room");
}

/* argv[1] "flood" or "recover": that part only. */
int main(int argc, char **argv)
{
    const char *only = argc > 1 ? argv[1] : NULL;
    setenv("KVBRIDGE_MAX_REGISTRATIONS", "4", 1);
    if (only == NULL || strcmp(only, "flood") == 0)
        test_flood();
    if (only == NULL || strcmp(only, "recover") == 0)
        test_recover();
    return 0;
}
