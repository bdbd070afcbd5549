/* KV integrity over parts of pages (issue 35 §2, docs/integrity.md "What
 * the digest is"): prefill TP 2 -> decode TP 1, so each prefill rank writes
 * its own head of every row of the decode's pages (a strided share of each
 * page, wire version 2). With integrity check on both sides:
 *
 * - clean rooms (two chunks each; then with a decode prefix of one page)
 *   end Success with every byte exact (kvbh_run_rooms), every room counted
 *   checked, none unchecked, each prefill rank sending one digest per room;
 * - a byte flipped in flight (engine hook flip_in_flight: the first piece
 *   of at least 128 bytes, one head of one row, lands with a byte flipped,
 *   the source untouched) fails the room naming the buffer and page where
 *   the wrong byte is, and is counted a mismatch; the senders end Success.
 *
 * On each lane (argv[1]): direct (the ranks' memory from kvb_mem_alloc:
 * the prefills' copy threads write the shares), shm (malloc memory: the
 * message lane over UCX shared memory), tcp (the message lane over TCP).
 *
 * On main (before version 2) the same rooms were counted unchecked: no
 * digest covered a page written in parts.
 *
 * Single process: a bootstrap server, two prefill ranks, one decode rank. */
#include "engine/engine_int.h"
#include "harness/kvb_cluster.h"
#include "kvb_test.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct counts {
    uint64_t sent, checked, mismatches, unchecked;
} counts_t;

static counts_t counts(kvbh_cluster_t *c)
{
    counts_t n = {0, 0, 0, 0};
    for (int t = 0; t < c->ptp; t++) {
        kvb_manager_traffic_t a = {.field_mask = KVB_MANAGER_TRAFFIC_INTEGRITY};
        kvb_manager_traffic(kvbh_cluster_prefill(c, 0, t, 0)->mgr, &a);
        n.sent += a.integrity_sent;
    }
    kvb_manager_traffic_t b = {.field_mask = KVB_MANAGER_TRAFFIC_INTEGRITY};
    kvb_manager_traffic(c->dec[0].mgr, &b);
    n.checked = b.integrity_checked;
    n.mismatches = b.integrity_mismatches;
    n.unchecked = b.integrity_unchecked;
    return n;
}

static const char *lane = "shm";

/* n rooms with o: none failing its expectation; the counters' steps. */
static void rooms(kvbh_cluster_t *c, int n, uint64_t first, const kvbh_room_opts_t *o,
                  const char *what, uint64_t mismatches)
{
    counts_t c0 = counts(c);
    CHECK_EQ(kvbh_run_rooms(c, n, first, o), 0);
    /* a prefill counts its digest once its status send returned, which may
     * be after the decode acted on it: bounded wait for the count */
    counts_t c1 = counts(c);
    for (double t0 = kvbh_now(); c1.sent - c0.sent < (uint64_t)(2 * n) && kvbh_now() < t0 + 5;
         c1 = counts(c))
        kvbh_sleep(0.001);
    fprintf(stderr,
            "integrity hetero TP 2->1 [%s], %s: %d rooms; digests sent %llu, checked %llu, "
            "mismatches %llu, unchecked %llu\n",
            lane, what, n, (unsigned long long)(c1.sent - c0.sent),
            (unsigned long long)(c1.checked - c0.checked),
            (unsigned long long)(c1.mismatches - c0.mismatches),
            (unsigned long long)(c1.unchecked - c0.unchecked));
    CHECK_EQ(c1.sent - c0.sent, (uint64_t)(2 * n)); /* one per prefill rank and room */
    CHECK_EQ(c1.checked - c0.checked, (uint64_t)n);
    CHECK_EQ(c1.mismatches - c0.mismatches, mismatches);
    CHECK_EQ(c1.unchecked - c0.unchecked, (uint64_t)0);
}

int main(int argc, char **argv)
{
    if (kvbh_main_init(argc, argv))
        return kvbh_child_main(argc, argv);
    if (argc > 1)
        lane = argv[1];
    if (strcmp(lane, "direct") && strcmp(lane, "shm") && strcmp(lane, "tcp"))
        return fprintf(stderr, "usage: %s direct|shm|tcp\n", argv[0]), 2;
    if (strcmp(lane, "tcp") == 0)
        setenv("KVBRIDGE_TRANSPORT", "tcp", 1);
    setenv("KVBRIDGE_INTEGRITY", "check", 1);
    srand(35);
    kvbh_cluster_t c;
    /* 2 layers (4 KV buffers), 2 heads of 128 bytes, 4 tokens a page: a
     * decode item of 1 KiB, each prefill rank's share 4 x 128 bytes */
    kvbh_cluster_cfg_t cfg = {.g = {2, 2, 128, 4, 64, 0, 0},
                              .ptp = 2,
                              .ppp = 1,
                              .pdp = 1,
                              .dtp = 1,
                              .shared = strcmp(lane, "direct") == 0};
    CHECK_EQ(kvbh_cluster_start(&c, &cfg), KVB_OK);
    /* first: the prefix pages must still be zero (kvbh_run_rooms checks) */
    rooms(&c, 2, 200, &(kvbh_room_opts_t){.chunks = 1, .prefix_pages = 1, .dp_rank = -1},
          "clean, a prefix of one page", 0);
    /* the lane the rooms took: the direct lane only where memory is shared */
    CHECK_EQ(kvb_engine_session_direct(kvbh_cluster_prefill(&c, 0, 0, 0)->eng,
                                       kvb_engine_session_id(c.dec[0].eng)),
             strcmp(lane, "direct") == 0);
    rooms(&c, 4, 100, &(kvbh_room_opts_t){.chunks = 2, .dp_rank = -1}, "clean", 0);
    for (int k = 0; k < 2; k++) {
        KVB__HOOK_SET(flip_in_flight, 1);
        rooms(&c, 1, 300 + (uint64_t)k,
              &(kvbh_room_opts_t){.chunks = 1, .dp_rank = -1, .expect_integrity_fail = 1},
              "a byte flipped in flight", 1);
        CHECK_EQ(KVB__HOOK(flip_in_flight), 0); /* the room's write took the hook */
    }
    rooms(&c, 2, 400, &(kvbh_room_opts_t){.chunks = 2, .dp_rank = -1}, "clean after", 0);
    kvbh_cluster_stop(&c);
    TEST_PASS("prefill TP 2 -> decode TP 1 with integrity check: every room checked over each "
              "rank's head slices (none unchecked); a byte flipped in flight fails the room "
              "naming its buffer and page");
    return 0;
}
