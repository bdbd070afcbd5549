/* The harness's own pieces that the ported tests do not reach: a decode
 * rank over kvb_mem_alloc memory, the guard pattern, an in-process bootstrap
 * server restarted on its port, and a bprefill child registered with it
 * (rooms in two halves, "rest"). Every byte and canary verified. */
#include "harness/kvb_cluster.h"
#include "kvb_test.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

#define G KVBH_CHILD_GEOM
#define GUARD 0x3C

/* A guard over pages 40..47 (and aux 5) holds while a room lands elsewhere;
 * one byte changed in it is counted. */
static void test_guard(kvbh_rank_t *p, kvbh_rank_t *d, const char *boot)
{
    int32_t pages[8];
    for (int i = 0; i < 8; i++)
        pages[i] = 40 + i;
    kvbh_guard_fill(d, pages, 8, 5, GUARD);
    CHECK_EQ(kvbh_run_room(p, d, boot, 7, 8, 0, 100, 6), 0);
    CHECK_EQ(kvbh_guard_bad(d, pages, 8, 5, GUARD), (uint64_t)0);
    d->kv[1][(uint64_t)pages[3] * d->item_len + 17] ^= 1;
    CHECK_EQ(kvbh_guard_bad(d, pages, 8, 5, GUARD), (uint64_t)1);
    d->kv[1][(uint64_t)pages[3] * d->item_len + 17] ^= 1;
}

/* The server restarted on its port: same address, a new prefill registers,
 * rooms run through it (to a decode without a cached route: d's route still
 * names the stopped prefill). */
static void test_restart(kvbh_boot_t *b, kvbh_rank_t *d)
{
    char before[128];
    kvbh_rank_t p2;
    snprintf(before, sizeof(before), "%s", b->addr);
    CHECK_EQ(kvbh_boot_restart(b), 0);
    CHECK(strcmp(before, b->addr) == 0);
    CHECK_EQ(kvbh_rank_start(&p2, &G, KVB_MODE_PREFILL, b->addr, KVBH_MEM_MALLOC, NULL), KVB_OK);
    CHECK_EQ(kvbh_run_room(&p2, d, b->addr, 8, 6, 0, 120, 7), 0);
    kvbh_rank_stop(&p2);
}

/* A bprefill child on the restarted server (in place of the prefill above,
 * so a decode of its own), on a geometry set by the parent: first halves,
 * then "rest"; its lane towards the decode (kvb_mem_alloc memory on this
 * host: the direct lane). */
static void test_child(kvbh_boot_t *b)
{
    static const kvbh_geom_t g2 = {2, 2, 64, 4, 512, 0, 0};
    kvbh_rank_t dr, *d = &dr;
    char cmd[160];
    kvbh_child_t pf;
    kvb_receiver_h rc[3];
    char ep[128], line[256];
    int other;
    double t_last;
    kvbh_child_geom_set(&g2);
    CHECK_EQ(kvbh_spawn_bprefill(&pf, b->addr, ep, sizeof(ep)), 0);
    CHECK_EQ(kvbh_rank_start(d, &g2, KVB_MODE_DECODE, NULL, KVBH_MEM_SHARED, NULL), KVB_OK);
    CHECK_EQ(kvbh_receivers(d, b->addr, 200, 3, 8, rc), 0);
    CHECK_EQ(kvbh_child_ask(&pf, "rooms 200 3 8", "sent", 20), 0);
    CHECK_EQ(kvbh_child_ask(&pf, "rest", "rest Success Success Success", 20), 0);
    CHECK_EQ(kvbh_wait_receivers_fail(rc, 3, kvbh_now(), 10, &other, &t_last), 0);
    CHECK_EQ(other, 3); /* all three ended, none Failed */
    for (int j = 0; j < 3; j++) {
        int32_t dst[8];
        kvbh_room_pages(&g2, 200 + (uint64_t)j, 8, NULL, dst);
        CHECK_EQ(kvb_receiver_poll(rc[j]), KVB_POLL_SUCCESS);
        CHECK_EQ(kvbh_verify(d, 200 + (uint64_t)j, dst, 8, kvbh_room_aux(200 + (uint64_t)j)),
                 (uint64_t)0);
        kvb_receiver_destroy(rc[j]);
    }
    snprintf(cmd, sizeof(cmd), "lane %s", kvb_engine_session_id(d->eng));
    CHECK_EQ(kvbh_child_ask(&pf, cmd, "lane 1", 10), 0);
    close(pf.to); /* EOF: the child destroys its manager and says how long it took */
    pf.to = -1;
    CHECK_EQ(kvbh_child_line(&pf, line, sizeof(line), 10), 0);
    CHECK(strncmp(line, "destroyed ", 10) == 0);
    kvbh_child_close(&pf);
    CHECK(kvbh_canaries_ok(d, "decode 3"));
    kvbh_rank_stop(d);
}

int main(int argc, char **argv)
{
    if (kvbh_main_init(argc, argv)) {
        int rc = kvbh_child_main(argc, argv);
        return rc < 0 ? 2 : rc;
    }
    kvbh_boot_t b;
    kvbh_rank_t p, d, d2;
    CHECK_EQ(kvbh_boot_start(&b, 0, NULL), 0);
    CHECK_EQ(kvbh_rank_start(&p, &G, KVB_MODE_PREFILL, b.addr, KVBH_MEM_MALLOC, NULL), KVB_OK);
    CHECK_EQ(kvbh_rank_start(&d, &G, KVB_MODE_DECODE, NULL, KVBH_MEM_SHARED, NULL), KVB_OK);
    test_guard(&p, &d, b.addr);
    CHECK(kvbh_canaries_ok(&d, "decode"));
    kvbh_rank_stop(&p);
    kvbh_rank_stop(&d);
    CHECK_EQ(kvbh_rank_start(&d2, &G, KVB_MODE_DECODE, NULL, KVBH_MEM_SHARED, NULL), KVB_OK);
    test_restart(&b, &d2);
    CHECK(kvbh_canaries_ok(&d2, "decode 2"));
    kvbh_rank_stop(&d2);
    test_child(&b);
    kvbh_boot_stop(&b);
    TEST_PASS("harness: kvb_mem_alloc arena, guard, bootstrap restart, bprefill child");
    return 0;
}
