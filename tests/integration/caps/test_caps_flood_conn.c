/* Floods of the connector's control channel (review 2.4), each against a
 * small cap set through its environment knob: the cap holds, the refusals
 * are counted in kvb_manager_limits, and a good decode is still served (a
 * room verifies) right after the flood.
 *   - transfer infos for rooms no sender has (KVBRIDGE_MAX_WIRE_ROOMS,
 *     KVBRIDGE_MAX_WIRE_ROOM_BYTES);
 *   - KV-args registrations by bytes (KVBRIDGE_MAX_REGISTRATION_BYTES one,
 *     KVBRIDGE_MAX_REGISTRATIONS_BYTES all);
 *   - PUSH sockets to distinct endpoints (KVBRIDGE_MAX_PUSH_SOCKETS, LRU). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "conn/conn_int.h"
#include "harness/kvb_cluster.h"
#include "kvb_test.h"
#include "dialect/sglang2025/frames.h"

#define WIRE_CAP 50
#define WIRE_FLOOD 400
#define REGS_BYTES_CAP 16384
#define PUSH_CAP 8
#define PUSH_FLOOD 100

static const kvbh_geom_t G = {
    .layers = 2, .heads = 1, .head_bytes = 64, .page = 4, .pool_pages = 8, .mla = 1};

static kvb_manager_limits_t limits(kvb_manager_h m)
{
    kvb_manager_limits_t l = {.field_mask =
                                  KVB_MANAGER_LIMITS_REG_IDENTITY | KVB_MANAGER_LIMITS_REG_BYTES |
                                  KVB_MANAGER_LIMITS_WIRE_ROOMS | KVB_MANAGER_LIMITS_PUSH};
    kvb_manager_limits(m, &l);
    return l;
}

/* WIRE_FLOOD transfer infos for rooms no sender has, from one claimed peer;
 * returns once the prefill has handled them all (bounded). */
static void wire_flood(kvbh_pair_t *p, uint64_t first_room)
{
    kvbh_push_t z;
    kvb__frames_buf_t b;
    int32_t pages[64];
    uint64_t seen0 = limits(p->pre.mgr).wire_rooms_evicted + limits(p->pre.mgr).wire_rooms;
    for (int i = 0; i < 64; i++)
        pages[i] = i % (int)G.pool_pages;
    kvb__frames_buf_init(&b);
    CHECK_EQ(kvbh_push_open(&z, kvb_manager_endpoint(p->pre.mgr), NULL), 0);
    for (int i = 0; i < WIRE_FLOOD; i++) {
        CHECK_EQ(kvbh_xfer_frames(&b, first_room + (uint64_t)i, "10.0.0.1:1", "10.0.0.1:1", pages,
                                  64, 0),
                 KVB_OK);
        CHECK_EQ(kvbh_push_send(&z, &b), 0);
    }
    double end = kvbh_now() + 10;
    kvb_manager_limits_t l = limits(p->pre.mgr);
    while (l.wire_rooms + l.wire_rooms_evicted < seen0 + WIRE_FLOOD && kvbh_now() < end) {
        kvbh_sleep(0.005);
        l = limits(p->pre.mgr);
    }
    kvbh_push_close(&z);
    kvb__frames_buf_free(&b);
}

static void test_wire_rooms(kvbh_pair_t *p)
{
    const int32_t src[2] = {0, 1}, dst[2] = {2, 3};
    wire_flood(p, 1000000);
    kvb_manager_limits_t l = limits(p->pre.mgr);
    CHECK_EQ(l.wire_rooms, WIRE_CAP);
    CHECK_EQ(l.wire_rooms_evicted, WIRE_FLOOD - WIRE_CAP);
    CHECK_EQ(l.wire_rooms_refused, 0);
    CHECK(l.wire_room_bytes > 0);
    kvb_manager_stats_t s;
    kvb_manager_stats(p->pre.mgr, &s);
    CHECK(s.rooms <= WIRE_CAP + 8); /* the good rooms so far, at most */
    /* A genuine decode's transfer info arrives before the prefill has a
     * sender for the room (it then waits as a wire room), and the flood goes
     * on: the flood displaces its own rooms, not the genuine one. */
    kvb_receiver_h rc;
    kvb_sender_h snd;
    kvbh_fill(&p->pre, 2, src, 2, 0);
    CHECK_EQ(kvb_receiver_create(p->dec.mgr, p->boot.addr, 2, -1, &rc), KVB_OK);
    CHECK_EQ(kvb_receiver_init(rc, dst, 2, 0, NULL), KVB_OK);
    double end = kvbh_now() + 5;
    while (limits(p->pre.mgr).wire_rooms_evicted == WIRE_FLOOD - WIRE_CAP && kvbh_now() < end)
        kvbh_sleep(0.002);
    CHECK_EQ(limits(p->pre.mgr).wire_rooms_evicted, WIRE_FLOOD - WIRE_CAP + 1);
    wire_flood(p, 2000000);
    CHECK_EQ(limits(p->pre.mgr).wire_rooms, WIRE_CAP);
    CHECK_EQ(kvb_sender_create(p->pre.mgr, p->boot.addr, 2, &snd), KVB_OK);
    CHECK_EQ(kvb_sender_init(snd, 2, 0), KVB_OK);
    CHECK_EQ(kvbh_wait_sender_ready(snd, 5), 0);
    CHECK_EQ(kvb_sender_poll(snd), KVB_POLL_WAITING_FOR_INPUT); /* its transfer info survived */
    CHECK_EQ(kvb_sender_send(snd, src, 2), KVB_OK);
    CHECK_EQ(kvbh_wait_sender(snd, 10), KVB_POLL_SUCCESS);
    CHECK_EQ(kvbh_wait_receiver(rc, 10), KVB_POLL_SUCCESS);
    CHECK_EQ(kvbh_verify(&p->dec, 2, dst, 2, 0), 0);
    kvb_sender_destroy(snd);
    kvb_receiver_destroy(rc);
    /* A sender's room does not count as a peer's. */
    CHECK_EQ(limits(p->pre.mgr).wire_rooms, WIRE_CAP - 1);
    TEST_PASS("wire rooms capped; a genuine decode's waiting room survives the flood");
}

static void test_registration_bytes(kvbh_pair_t *p)
{
    kvbh_push_t z;
    kvb__frames_buf_t b;
    char sid[64];
    kvb__frames_buf_init(&b);
    CHECK_EQ(kvbh_push_open(&z, kvb_manager_endpoint(p->pre.mgr), NULL), 0);
    /* One registration over the per-registration cap (1 MiB default). */
    CHECK_EQ(kvbh_reg_frames(&b, "10.0.0.2:1", "10.0.0.2:1", 4096, 4096, 200000, 4096, 256),
             KVB_OK);
    CHECK_EQ(kvbh_push_send(&z, &b), 0);
    /* Many small ones over the total cap (each 51 pointers: 408 bytes). */
    for (int i = 0; i < 100; i++) {
        snprintf(sid, sizeof(sid), "10.0.1.%d:%d", i % 250, 1000 + i);
        CHECK_EQ(kvbh_reg_frames(&b, sid, "10.0.0.3:1", 4096, 4096, 50, 4096, 256), KVB_OK);
        CHECK_EQ(kvbh_push_send(&z, &b), 0);
    }
    double end = kvbh_now() + 10;
    kvb_manager_stats_t s = {0};
    kvb_manager_limits_t l = limits(p->pre.mgr);
    while (l.registrations_too_big < 1 && kvbh_now() < end) {
        kvbh_sleep(0.005);
        l = limits(p->pre.mgr);
    }
    /* The last of the small ones has been handled once the count is stable. */
    for (uint64_t last = ~0ull; kvbh_now() < end;) {
        kvbh_sleep(0.05);
        kvb_manager_stats(p->pre.mgr, &s);
        if (s.registrations + s.registrations_evicted == last)
            break;
        last = s.registrations + s.registrations_evicted;
    }
    l = limits(p->pre.mgr);
    CHECK_EQ(l.registrations_too_big, 1);
    CHECK(l.registration_bytes <= REGS_BYTES_CAP);
    CHECK(s.registrations_evicted > 0); /* never-used ones made room */
    kvbh_push_close(&z);
    kvb__frames_buf_free(&b);
    const int32_t src[2] = {0, 1}, dst[2] = {4, 5};
    /* the used registration stayed */
    CHECK_EQ(kvbh_run_room_pages(&p->pre, &p->dec, p->boot.addr, 3, src, dst, 2, 0), 0);
    TEST_PASS("registration bytes capped, good room served");
}

static void test_push_lru(kvbh_pair_t *p)
{
    kvb__zcache_t c;
    kvb__frames_buf_t b;
    uint64_t open_n, evicted;
    void *zctx = zmq_ctx_new(), *pull = zmq_socket(zctx, ZMQ_PULL);
    int zero = 0, timeout = 5000;
    char ep[64];
    size_t el = sizeof(ep);
    (void)p;
    zmq_setsockopt(pull, ZMQ_LINGER, &zero, sizeof(zero));
    zmq_setsockopt(pull, ZMQ_RCVTIMEO, &timeout, sizeof(timeout));
    CHECK_EQ(zmq_bind(pull, "tcp://127.0.0.1:*"), 0);
    CHECK_EQ(zmq_getsockopt(pull, ZMQ_LAST_ENDPOINT, ep, &el), 0);
    uint16_t good = (uint16_t)atoi(strrchr(ep, ':') + 1);
    kvb__zcache_init(&c, zctx);
    kvb__frames_buf_init(&b);
    const int32_t page0 = 0;
    CHECK_EQ(kvbh_xfer_frames(&b, 7, "127.0.0.1:1", "127.0.0.1:1", &page0, 1, 0), KVB_OK);
    for (int i = 0; i < PUSH_FLOOD; i++) /* nobody listens there */
        kvb__zsend(&c, "127.0.0.1", (uint16_t)(1 + i), &b);
    kvb__zcache_stats(&c, &open_n, &evicted);
    CHECK_EQ(open_n, PUSH_CAP);
    CHECK_EQ(evicted, PUSH_FLOOD - PUSH_CAP);
    CHECK_EQ(kvb__zsend(&c, "127.0.0.1", good, &b), KVB_OK);
    char buf[64];
    CHECK(zmq_recv(pull, buf, sizeof(buf), 0) >= 0); /* the good peer is reached */
    kvb__zcache_stats(&c, &open_n, &evicted);
    CHECK_EQ(open_n, PUSH_CAP);
    kvb__frames_buf_free(&b);
    kvb__zcache_free(&c);
    zmq_close(pull);
    zmq_ctx_term(zctx);
    TEST_PASS("PUSH sockets capped (LRU), good peer reached");
}

/* argv[1] "rooms", "regs" or "push": that part only. */
int main(int argc, char **argv)
{
    const char *only = argc > 1 ? argv[1] : NULL;
    kvbh_pair_t p;
    char v[32];
    snprintf(v, sizeof(v), "%d", WIRE_CAP);
    setenv("KVBRIDGE_MAX_WIRE_ROOMS", v, 1);
    snprintf(v, sizeof(v), "%d", REGS_BYTES_CAP);
    setenv("KVBRIDGE_MAX_REGISTRATIONS_BYTES", v, 1);
    snprintf(v, sizeof(v), "%d", PUSH_CAP);
    setenv("KVBRIDGE_MAX_PUSH_SOCKETS", v, 1);
    CHECK_EQ(kvbh_pair_start(&p, &G, KVBH_MEM_PACKED, NULL, NULL), KVB_OK);
    const int32_t src[2] = {0, 1}, dst[2] = {0, 1};
    CHECK_EQ(kvbh_run_room_pages(&p.pre, &p.dec, p.boot.addr, 1, src, dst, 2, 0), 0);
    if (only == NULL || strcmp(only, "rooms") == 0)
        test_wire_rooms(&p);
    if (only == NULL || strcmp(only, "regs") == 0)
        test_registration_bytes(&p);
    if (only == NULL || strcmp(only, "push") == 0)
        test_push_lru(&p);
    kvbh_pair_stop(&p);
    return 0;
}
