/* KV integrity (issue 35 §2, docs/integrity.md) on one lane (argv[1]:
 * "direct": decode pool from kvb_mem_alloc, the prefill's copy threads;
 * "shm": the message lane over UCX shared memory; "tcp": the message lane
 * over TCP). For integrity check and off, ROOMS rooms each of:
 *
 * - clean: every room Success, its bytes exact; with check every room is
 *   counted checked, none mismatched or unchecked;
 * - flip: a byte flipped in flight (engine hook flip_in_flight: the first
 *   piece of the room's KV write lands with its first byte XORed, the
 *   prefill's source untouched). check: the room fails, the reason names
 *   the buffer and page holding the wrong byte; off: Success with the wrong
 *   byte in the pages (what the check adds);
 * - stale: a page written twice. The room's first chunk is sent and waited
 *   for until its first page has landed in the decode's memory; then a
 *   stale writer (the prefill's engine, the same session and lane) writes
 *   another room's bytes over that page and waits for the write to end;
 *   only then is the last chunk sent, after which the prefill sends the
 *   status. check: Failed naming buffer 0 and that page; off: Success with
 *   the page holding the other room's bytes.
 *
 * With check, a room whose check is slow does not hold another room's
 * Success (the decode's check workers): slow_check.
 *
 * On the direct lane with check the prefill's pages are hashed by its copy
 * threads as they copy them (every page of every room; none elsewhere).
 *
 * Single process: a bootstrap server, one prefill and one decode rank. */
#include "conn/conn_int.h"
#include "engine/engine_int.h"
#include "harness/kvb_cluster.h"
#include "kvb_test.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NP 4
#define ROOMS 5
#define BOUND_S 10.0
#define STALE_ROOM 900 /* the room whose bytes the stale writer holds */
#define STALL_MS 600   /* the slow check (hook kvb__icheck_stall_ms) */

/* item_len 4 tokens x 2 heads x 128 bytes = 1 KiB, 4 KV buffers */
static const kvbh_geom_t G = {2, 2, 128, 4, 64, 0, 0};

typedef struct counts {
    uint64_t sent, checked, mismatches, unchecked;
} counts_t;

static counts_t counts(kvbh_pair_t *pr)
{
    kvb_manager_traffic_t a = {.field_mask = KVB_MANAGER_TRAFFIC_INTEGRITY};
    kvb_manager_traffic_t b = {.field_mask = KVB_MANAGER_TRAFFIC_INTEGRITY};
    kvb_manager_traffic(pr->pre.mgr, &a);
    kvb_manager_traffic(pr->dec.mgr, &b);
    return (counts_t){a.integrity_sent, b.integrity_checked, b.integrity_mismatches,
                      b.integrity_unchecked};
}

/* The first KV byte of the room that is not its pattern: buffer and page
 * (its index in the pool); false when every byte is right. */
static bool first_wrong(const kvbh_rank_t *d, uint64_t room, const int32_t *dst, int *b_p,
                        int32_t *page_p)
{
    for (int b = 0; b < d->n_kv; b++)
        for (int i = 0; i < NP; i++) {
            const uint8_t *p = d->kv[b] + (uint64_t)dst[i] * d->item_len;
            for (uint64_t k = 0; k < d->item_len; k++)
                if (p[k] != kvbh_pat(room, b, (uint64_t)i, k)) {
                    *b_p = b;
                    *page_p = dst[i];
                    return true;
                }
        }
    return false;
}

/* The stale writer: another room's bytes (prefill page spare) over decode
 * page dst0 of buffer 0, through the prefill's engine to the decode's
 * session, waited for. */
static void stale_write(kvbh_pair_t *pr, int32_t spare, int32_t dst0)
{
    uint8_t *from = pr->pre.kv[0] + (uint64_t)spare * pr->pre.item_len;
    for (uint64_t k = 0; k < pr->pre.item_len; k++)
        from[k] = kvbh_pat(STALE_ROOM, 0, 0, k);
    kvb_block_t blk = {(uint64_t)(uintptr_t)from,
                       (uint64_t)(uintptr_t)(pr->dec.kv[0] + (uint64_t)dst0 * pr->dec.item_len),
                       pr->dec.item_len};
    CHECK_EQ(kvb_engine_write(pr->pre.eng, kvb_engine_session_id(pr->dec.eng), &blk, 1, 5.0),
             KVB_OK);
}

/* One room with fault ("clean", "flip", "stale"); returns the final poll. */
static kvb_poll_t one_room(kvbh_pair_t *pr, const char *lane, const char *fault, int check,
                           uint64_t room, int slot)
{
    kvb_receiver_h rc;
    kvb_sender_h s;
    int32_t src[NP], dst[NP];
    char why[512] = "";
    for (int i = 0; i < NP; i++) {
        src[i] = 63 - slot * NP - i; /* backwards from the top, as the harness's rooms */
        dst[i] = slot * NP + i;
    }
    CHECK_EQ(kvbh_pair_room(pr, room, src, dst, NP, &rc, &s), KVB_OK);
    double t0 = kvbh_now(), t_landed = 0, t_stale = 0;
    if (strcmp(fault, "flip") == 0)
        KVB__HOOK_SET(flip_in_flight, 1);
    if (strcmp(fault, "stale") == 0) {
        /* first chunk: pages 0..NP-2; wait until its first page landed */
        CHECK_EQ(kvb_sender_send(s, src, NP - 1), KVB_OK);
        while (kvbh_verify_buf(&pr->dec, room, 0, dst, 1) != 0 && kvbh_now() < t0 + BOUND_S)
            kvbh_sleep(0.0005);
        CHECK_EQ(kvbh_verify_buf(&pr->dec, room, 0, dst, 1), (uint64_t)0);
        t_landed = kvbh_now();
        stale_write(pr, 63 - 8 * NP, dst[0]);
        t_stale = kvbh_now();
        CHECK(kvb_receiver_poll(rc) != KVB_POLL_SUCCESS); /* the status is not out yet */
        CHECK_EQ(kvb_sender_send(s, src + NP - 1, 1), KVB_OK);
    } else {
        CHECK_EQ(kvb_sender_send(s, src, NP), KVB_OK);
    }
    kvb_poll_t p = kvbh_wait_receiver(rc, BOUND_S);
    CHECK(kvbh_wait_sender(s, BOUND_S) == KVB_POLL_SUCCESS);
    if (p == KVB_POLL_FAILED)
        kvb_receiver_failure(rc, why, sizeof(why));
    int wb = -1;
    int32_t wp = -1;
    bool wrong = first_wrong(&pr->dec, room, dst, &wb, &wp);
    fprintf(stderr,
            "integrity[%s] %s check=%d room %llu: %s after %.3f s (first page landed %.3f s, "
            "stale write done %.3f s); first wrong byte: buffer %d page %d; reason: %s\n",
            lane, fault, check, (unsigned long long)room, kvb_poll_string(p), kvbh_now() - t0,
            t_landed ? t_landed - t0 : -1, t_stale ? t_stale - t0 : -1, wb, (int)wp, why);
    if (strcmp(fault, "clean") == 0) {
        CHECK_EQ(p, KVB_POLL_SUCCESS);
        CHECK(!wrong);
    } else {
        CHECK(wrong); /* the fault happened: the pages hold a wrong byte */
        if (strcmp(fault, "stale") == 0) {
            CHECK_EQ(wb, 0);
            CHECK_EQ(wp, dst[0]);
        }
        if (check) {
            char want[64];
            CHECK_EQ(p, KVB_POLL_FAILED);
            CHECK_STR_CONTAINS(why, "KV integrity check failed");
            snprintf(want, sizeof(want), "buffer %d page %d ", wb, (int)wp);
            CHECK_STR_CONTAINS(why, want);
        } else {
            CHECK_EQ(p, KVB_POLL_SUCCESS); /* unnoticed without the check */
        }
    }
    CHECK_EQ(KVB__HOOK(flip_in_flight), 0); /* the hook was taken by this room */
    kvb_sender_destroy(s);
    kvb_receiver_destroy(rc);
    return p;
}

/* Check workers (docs/integrity.md): room A's check is slow (hook
 * kvb__icheck_stall_ms: it holds STALL_MS before it recomputes); room B,
 * sent once A's check is under way, ends Success while A has not ended,
 * and A ends Success after its check. With the checks on the
 * control thread (KVBRIDGE_INTEGRITY_THREADS=0) B's status would wait
 * behind A's check and this fails. Slots 5 and 6: pages the other rooms
 * and the stale writer's spare page do not use. */
static void slow_check(kvbh_pair_t *pr, const char *lane, uint64_t room)
{
    kvb_receiver_h rc[2];
    kvb_sender_h s[2];
    int32_t src[2][NP], dst[2][NP];
    for (int k = 0; k < 2; k++) {
        for (int i = 0; i < NP; i++) {
            src[k][i] = 63 - (5 + k) * NP - i;
            dst[k][i] = (5 + k) * NP + i;
        }
        CHECK_EQ(kvbh_pair_room(pr, room + (uint64_t)k, src[k], dst[k], NP, &rc[k], &s[k]), KVB_OK);
    }
    __atomic_store_n(&kvb__icheck_stall_ms, STALL_MS, __ATOMIC_RELAXED);
    double t0 = kvbh_now();
    CHECK_EQ(kvb_sender_send(s[0], src[0], NP), KVB_OK);
    while (__atomic_load_n(&kvb__icheck_stall_ms, __ATOMIC_RELAXED) != 0 &&
           kvbh_now() < t0 + BOUND_S)
        kvbh_sleep(0.0005);
    CHECK_EQ(__atomic_load_n(&kvb__icheck_stall_ms, __ATOMIC_RELAXED), 0); /* A's check holds */
    double t_stall = kvbh_now();
    CHECK_EQ(kvb_sender_send(s[1], src[1], NP), KVB_OK);
    kvb_poll_t pb = kvbh_wait_receiver(rc[1], BOUND_S);
    double t_b = kvbh_now();
    kvb_poll_t pa_at_b = kvb_receiver_poll(rc[0]);
    kvb_poll_t pa = kvbh_wait_receiver(rc[0], BOUND_S);
    double t_a = kvbh_now();
    fprintf(stderr,
            "integrity[%s] slow check: A's check holding from %.3f s (%d ms); B %s at %.3f s "
            "(A then %s); A %s at %.3f s\n",
            lane, t_stall - t0, STALL_MS, kvb_poll_string(pb), t_b - t0, kvb_poll_string(pa_at_b),
            kvb_poll_string(pa), t_a - t0);
    CHECK_EQ(pb, KVB_POLL_SUCCESS);
    /* B did not wait for A's check: A had not ended (its poll answers as
     * while its bytes move) */
    CHECK(pa_at_b == KVB_POLL_WAITING_FOR_INPUT || pa_at_b == KVB_POLL_TRANSFERRING);
    CHECK_EQ(pa, KVB_POLL_SUCCESS);
    for (int k = 0; k < 2; k++) {
        int wb = -1;
        int32_t wp = -1;
        CHECK(!first_wrong(&pr->dec, room + (uint64_t)k, dst[k], &wb, &wp));
        CHECK(kvbh_wait_sender(s[k], BOUND_S) == KVB_POLL_SUCCESS);
        kvb_sender_destroy(s[k]);
        kvb_receiver_destroy(rc[k]);
    }
}

/* part: KVBRIDGE_INTEGRITY_PART for the decode's check workers (NULL: the
 * default 1 MiB, a room here, 16 KiB, is one part; "4096": each room's
 * check split in two parts, one per worker, the verdict from both) */
static void run(const char *lane, int check, const char *part)
{
    kvbh_pair_t pr;
    static const char *faults[] = {"clean", "flip", "stale"};
    setenv("KVBRIDGE_INTEGRITY", check ? "check" : "off", 1);
    if (part != NULL)
        setenv("KVBRIDGE_INTEGRITY_PART", part, 1);
    else
        unsetenv("KVBRIDGE_INTEGRITY_PART");
    fprintf(stderr, "integrity[%s] check=%d, parts of %s bytes\n", lane, check,
            part != NULL ? part : "1 Mi");
    int mem = strcmp(lane, "direct") == 0 ? KVBH_MEM_SHARED : KVBH_MEM_MALLOC;
    CHECK_EQ(kvbh_pair_start(&pr, &G, mem, NULL, NULL), KVB_OK);
    uint64_t room = !check ? 2000 : part != NULL ? 3000 : 1000;
    for (int f = 0; f < 3; f++) {
        counts_t c0 = counts(&pr);
        unsigned items0 = KVB__HOOK(digest_items);
        int failed = 0;
        for (int k = 0; k < ROOMS; k++)
            failed += one_room(&pr, lane, faults[f], check, room++, k) == KVB_POLL_FAILED;
        counts_t c1 = counts(&pr);
        /* who hashed the prefill's pages: on the direct lane its copy
         * threads, each page as they copied it (the stale writer asks for
         * none); elsewhere the prefill's worker */
        unsigned items = KVB__HOOK(digest_items) - items0;
        bool in_copy = check && strcmp(lane, "direct") == 0;
        fprintf(stderr, "integrity[%s] %s check=%d: %u pages hashed in the copy\n", lane, faults[f],
                check, items);
        CHECK_EQ(items, in_copy ? (unsigned)(ROOMS * NP * pr.dec.n_kv) : 0u);
        /* the lane the rooms took */
        CHECK_EQ(kvb_engine_session_direct(pr.pre.eng, kvb_engine_session_id(pr.dec.eng)),
                 strcmp(lane, "direct") == 0);
        uint64_t n = ROOMS, bad = f == 0 ? 0 : n;
        fprintf(stderr,
                "integrity[%s] %s check=%d: %d of %d rooms failed; digests sent %llu, checked "
                "%llu, mismatches %llu, unchecked %llu\n",
                lane, faults[f], check, failed, ROOMS, (unsigned long long)(c1.sent - c0.sent),
                (unsigned long long)(c1.checked - c0.checked),
                (unsigned long long)(c1.mismatches - c0.mismatches),
                (unsigned long long)(c1.unchecked - c0.unchecked));
        CHECK_EQ(c1.sent - c0.sent, check ? n : 0);
        CHECK_EQ(c1.checked - c0.checked, check ? n : 0);
        CHECK_EQ(c1.mismatches - c0.mismatches, check ? bad : 0);
        CHECK_EQ(c1.unchecked - c0.unchecked, (uint64_t)0);
        CHECK_EQ((uint64_t)failed, check ? bad : 0);
    }
    if (check)
        slow_check(&pr, lane, room);
    CHECK(kvbh_canaries_ok(&pr.dec, "decode"));
    kvbh_pair_stop(&pr);
}

int main(int argc, char **argv)
{
    if (kvbh_main_init(argc, argv))
        return kvbh_child_main(argc, argv);
    if (argc < 2 || (strcmp(argv[1], "direct") && strcmp(argv[1], "shm") && strcmp(argv[1], "tcp")))
        return fprintf(stderr, "usage: %s direct|shm|tcp\n", argv[0]), 2;
    if (strcmp(argv[1], "tcp") == 0)
        setenv("KVBRIDGE_TRANSPORT", "tcp", 1);
    run(argv[1], 1, NULL);
    run(argv[1], 1, "4096");
    run(argv[1], 0, NULL);
    TEST_PASS("a byte flipped in flight and a page written twice by a stale writer fail the room "
              "with integrity check (naming buffer and page), pass unnoticed with it off; clean "
              "rooms all checked; a slow check holds no other room's Success");
    return 0;
}
