/* Write groups (kvb_engine_write_group_async), engine level, real engines
 * over the direct lane (targets' memory from kvb_mem_alloc): a TP1->TP2
 * shaped group (two targets, each gets alternate 1 KiB halves of 2 KiB
 * source rows, destination pages permuted) places exact bytes in both and
 * nothing outside; members of different lengths and blocks longer than a
 * copy unit zip exactly; one member's grant revoked before or while it is
 * copied fails that member alone (KVB_ERR_FENCED, nothing of it lands after
 * the revoke), one member cancelled or its session closed fails alone; a
 * member on the message lane (plain target memory) and an invalid member
 * (a range outside the target's memory, no session) go their own way; the
 * call's own argument errors write nothing. Every wait is bounded. */
#include "kvb_test.h"
#include "kvb_test_engine.h"

#include <kvbridge/engine.h>

#include <signal.h>
#include <stddef.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tp2_common.h"

typedef struct group {
    kvb_write_member_t mb[2];
    kvb_write_params_t wp[2];
    kvb_status_t st[2];
    kvb_xfer_h x[2];
    kvb_block_t *b[2];
} group_t;

/* Start a two-member TP1->TP2 group of npages pages to t0 and t1. */
static kvb_status_t tp2_start(kvb_engine_h w, group_t *g, const target_t *t0, const target_t *t1,
                              size_t npages)
{
    const target_t *t[2] = {t0, t1};
    for (int r = 0; r < 2; r++) {
        size_t n;
        g->b[r] = tp2_blocks(t[r], r, npages, &n);
        g->wp[r] = (kvb_write_params_t){.field_mask = KVB_WRITE_PARAM_EPOCH, .epoch = t[r]->epoch};
        g->mb[r] = member(sid_of(t[r]), g->b[r], n, &g->wp[r]);
    }
    return kvb_engine_write_group_async(w, g->mb, 2, sizeof(g->mb[0]), g->st, g->x);
}

/* Wait for both members (bounded) into fin[], free the handles. */
static char why0[512]; /* member 0's error text, kept by group_end */

static void group_end(group_t *g, kvb_status_t fin[2])
{
    for (int r = 0; r < 2; r++) {
        fin[r] = g->x[r] != NULL ? kvb_xfer_wait(g->x[r], 20) : g->st[r];
        if (r == 0)
            snprintf(why0, sizeof(why0), "%s", kvb_xfer_error(g->x[r]));
        if (fin[r] != KVB_OK)
            fprintf(stderr, "  member %d: %s (%s)\n", r, kvb_status_string(fin[r]),
                    kvb_xfer_error(g->x[r]));
        kvb_xfer_free(g->x[r]);
        free(g->b[r]);
    }
}

/* One TP1->TP2 group of npages pages of a fresh source: both members end
 * KVB_OK with exact bytes, guards intact. */
static void tp2_round(kvb_engine_h w, const target_t *t0, const target_t *t1, size_t npages,
                      uint64_t seed)
{
    group_t g;
    kvb_status_t fin[2];
    fill_source(seed);
    CHECK_EQ(tp2_start(w, &g, t0, t1, npages), KVB_OK);
    group_end(&g, fin);
    CHECK_EQ(fin[0], KVB_OK);
    CHECK_EQ(fin[1], KVB_OK);
    CHECK(tp2_exact(t0, 0, npages));
    CHECK(tp2_exact(t1, 1, npages));
}

static void tp2_exact_case(void)
{
    size_t npages = 512; /* 16 MiB of source */
    target_t t0 = target_new(true, npages * PAGE / 2), t1 = target_new(true, npages * PAGE / 2);
    kvb_engine_h w = writer();
    for (int round = 0; round < 3; round++)
        tp2_round(w, &t0, &t1, npages, 0x1234 + (uint64_t)round);
    CHECK_EQ(kvb_engine_session_direct(w, sid_of(&t0)), 1);
    CHECK_EQ(kvb_engine_session_direct(w, sid_of(&t1)), 1);
    kvb_engine_destroy(w);
    targets_free(&t0, &t1);
    TEST_PASS("TP1->TP2 group: alternate halves of rows exact in both targets, guards intact");
}

/* Members of different lengths, blocks longer than a 1 MiB unit, a member
 * with no blocks: each exact. */
static void uneven_case(void)
{
    target_t t0 = target_new(true, 8 * MiB), t1 = target_new(true, 8 * MiB);
    kvb_engine_h w = writer();
    fill_source(0x77);
    /* member 0: 3 MiB + 5 small blocks; member 1: one 7 MiB block */
    kvb_block_t b0[6] = {{(uint64_t)(uintptr_t)g_src, (uint64_t)(uintptr_t)t0.base, 3 * MiB}};
    for (int i = 1; i < 6; i++)
        b0[i] = (kvb_block_t){(uint64_t)(uintptr_t)(g_src + 4 * MiB + (size_t)i * 3 * KiB),
                              (uint64_t)(uintptr_t)(t0.base + 4 * MiB + (size_t)i * 4 * KiB), 100};
    kvb_block_t b1 = {(uint64_t)(uintptr_t)(g_src + 9 * MiB), (uint64_t)(uintptr_t)t1.base,
                      7 * MiB};
    kvb_write_params_t wp0 = {.field_mask = KVB_WRITE_PARAM_EPOCH, .epoch = t0.epoch},
                       wp1 = {.field_mask = KVB_WRITE_PARAM_EPOCH, .epoch = t1.epoch};
    kvb_write_member_t mb[3] = {member(sid_of(&t0), b0, 6, &wp0), member(sid_of(&t1), &b1, 1, &wp1),
                                member(sid_of(&t1), NULL, 0, &wp1)};
    kvb_status_t st[3];
    kvb_xfer_h x[3];
    CHECK_EQ(kvb_engine_write_group_async(w, mb, 3, sizeof(mb[0]), st, x), KVB_OK);
    for (int i = 0; i < 3; i++) {
        CHECK_EQ(kvb_xfer_wait(x[i], 20), KVB_OK);
        kvb_xfer_free(x[i]);
    }
    CHECK(memcmp(t0.base, g_src, 3 * MiB) == 0);
    CHECK(kvb_test_all(t0.base + 3 * MiB, MiB, GUARD_FILL));
    for (int i = 1; i < 6; i++) {
        uint8_t *d = t0.base + 4 * MiB + (size_t)i * 4 * KiB;
        CHECK(memcmp(d, g_src + 4 * MiB + (size_t)i * 3 * KiB, 100) == 0);
        CHECK(kvb_test_all(d + 100, 4 * KiB - 100, GUARD_FILL));
    }
    CHECK(memcmp(t1.base, g_src + 9 * MiB, 7 * MiB) == 0);
    CHECK(kvb_test_all(t1.base + 7 * MiB, MiB + GUARD, GUARD_FILL));
    CHECK(kvb_test_all(t1.end.buf, GUARD, GUARD_FILL));
    kvb_engine_destroy(w);
    targets_free(&t0, &t1);
    TEST_PASS("uneven group: long blocks split, short member drops out, empty member ends OK");
}

enum spoil { REVOKE_BEFORE, REVOKE_WHILE, CANCEL, CLOSE_SESSION };

/* Member 0 spoiled one way; member 1 must end exact. */
static void spoil_case(enum spoil how)
{
    size_t npages = 4096; /* 128 MiB of source: copying takes tens of ms */
    static const char *names[] = {"grant revoked before the group", "grant revoked while copying",
                                  "member cancelled", "member's session closed"};
    static const kvb_status_t want[] = {KVB_ERR_FENCED, KVB_ERR_FENCED, KVB_ERR_CANCELED,
                                        KVB_ERR_PEER};
    target_t t0 = target_new(true, npages * PAGE / 2), t1 = target_new(true, npages * PAGE / 2);
    kvb_engine_h w = writer();
    group_t g;
    kvb_status_t fin[2];
    fill_source(0x5151 + (uint64_t)how);
    /* Revoked before: the writer sees it at submission and sends member 0
     * over the message lane, whose target refuses it. While copying: the
     * copy threads' fence check refuses member 0's next unit. */
    if (how == REVOKE_BEFORE)
        CHECK_EQ(kvb_engine_revoke_writer(t0.end.eng, TAG, t0.epoch, 5), KVB_OK);
    CHECK_EQ(tp2_start(w, &g, &t0, &t1, npages), KVB_OK);
    if (how == REVOKE_WHILE) {
        CHECK_EQ(kvb_engine_revoke_writer(t0.end.eng, TAG, t0.epoch, 5), KVB_OK);
        /* from here on not one byte of member 0 may land */
        memset(t0.base, GUARD_FILL, t0.len);
    } else if (how == CANCEL) {
        CHECK_EQ(kvb_xfer_cancel(g.x[0]), KVB_OK);
    } else if (how == CLOSE_SESSION) {
        kvb_engine_close_session(w, sid_of(&t0));
    }
    group_end(&g, fin);
    fprintf(stderr, "%s: member 0 %s, member 1 %s\n", names[how], kvb_status_string(fin[0]),
            kvb_status_string(fin[1]));
    /* Revoked while copying: the copy threads find the grant revoked, or
     * (timing: the target freed the slot between two units) no longer
     * listed; both are FENCED since session 7 (the second was KVB_ERR_PEER,
     * which put the connector's session in back-off). This test does not
     * force the second window; it was hit in some runs before the fix. */
    CHECK_EQ(fin[0], want[how]);
    if (how == REVOKE_BEFORE || how == REVOKE_WHILE)
        CHECK_STR_CONTAINS(why0, "fenced");
    CHECK_EQ(fin[1], KVB_OK);
    CHECK(tp2_exact(&t1, 1, npages));
    if (how == REVOKE_BEFORE || how == REVOKE_WHILE)
        CHECK(kvb_test_all(t0.end.buf, t0.len + 2 * GUARD, GUARD_FILL));
    kvb_engine_destroy(w);
    targets_free(&t0, &t1);
    TEST_PASS(names[how]);
}

/* One member's target in plain memory (the message lane), one invalid
 * member (a range outside its target), one without a session. */
static void mixed_case(void)
{
    size_t npages = 256;
    target_t t0 = target_new(true, npages * PAGE / 2), t1 = target_new(false, npages * PAGE / 2);
    kvb_engine_h w = writer();
    tp2_round(w, &t0, &t1, npages, 0x99);
    CHECK_EQ(kvb_engine_session_direct(w, sid_of(&t0)), 1);
    CHECK_EQ(kvb_engine_session_direct(w, sid_of(&t1)), 0);

    /* member 1 writes past its target's memory; member 2 names no session */
    size_t n;
    kvb_block_t *b0 = tp2_blocks(&t0, 0, npages, &n);
    kvb_block_t bad = {(uint64_t)(uintptr_t)g_src,
                       (uint64_t)(uintptr_t)(t0.end.buf + t0.len + 2 * GUARD - 512), 4096};
    kvb_write_params_t wp = {.field_mask = KVB_WRITE_PARAM_EPOCH, .epoch = t0.epoch};
    kvb_write_member_t mb[3] = {member(sid_of(&t0), b0, n, &wp), member(sid_of(&t0), &bad, 1, &wp),
                                member(NULL, &bad, 1, NULL)};
    kvb_status_t st[3];
    kvb_xfer_h x[3];
    memset(t0.base, GUARD_FILL, t0.len);
    fill_source(0x98);
    CHECK_EQ(kvb_engine_write_group_async(w, mb, 3, sizeof(mb[0]), st, x), KVB_ERR_BOUNDS);
    CHECK_EQ(st[0], KVB_OK);
    CHECK_EQ(st[1], KVB_ERR_BOUNDS);
    CHECK_EQ(st[2], KVB_ERR_INVALID);
    CHECK_EQ(kvb_xfer_test(x[1]), KVB_ERR_BOUNDS);
    CHECK_STR_CONTAINS(kvb_xfer_error(x[1]), "not inside a region the peer registered");
    CHECK_EQ(kvb_xfer_wait(x[2], 1), KVB_ERR_INVALID);
    CHECK_EQ(kvb_xfer_wait(x[0], 20), KVB_OK);
    for (int i = 0; i < 3; i++)
        kvb_xfer_free(x[i]);
    free(b0);
    CHECK(tp2_exact(&t0, 0, npages));

    /* the call's own errors: nothing started, nothing written */
    st[0] = KVB_ERR_IO;
    x[0] = NULL;
    CHECK_EQ(
        kvb_engine_write_group_async(w, mb, 1, offsetof(kvb_write_member_t, strided) - 1, st, x),
        KVB_ERR_INVALID);
    CHECK_EQ(kvb_engine_write_group_async(w, mb, KVB_WRITE_GROUP_MAX + 1, sizeof(mb[0]), st, x),
             KVB_ERR_INVALID);
    CHECK_EQ(kvb_engine_write_group_async(w, mb, 1, sizeof(mb[0]), NULL, x), KVB_ERR_INVALID);
    CHECK(st[0] == KVB_ERR_IO && x[0] == NULL);
    CHECK_EQ(kvb_engine_write_group_async(w, NULL, 0, sizeof(mb[0]), NULL, NULL), KVB_OK);
    kvb_engine_destroy(w);
    targets_free(&t0, &t1);
    TEST_PASS("mixed group: message-lane member exact, invalid members fail alone");
}

int main(int argc, char **argv)
{
    signal(SIGPIPE, SIG_IGN);
    const char *which = argc >= 2 ? argv[1] : "all";
    g_src_len = 4096 * (size_t)PAGE;
    CHECK((g_src = aligned_alloc(4096, g_src_len)) != NULL);
    if (!strcmp(which, "all") || !strcmp(which, "exact")) {
        tp2_exact_case();
        uneven_case();
    }
    if (!strcmp(which, "all") || !strcmp(which, "spoil"))
        for (int how = REVOKE_BEFORE; how <= CLOSE_SESSION; how++)
            spoil_case((enum spoil)how);
    if (!strcmp(which, "all") || !strcmp(which, "mixed"))
        mixed_case();
    free(g_src);
    return 0;
}
