/* Strided blocks (kvb_strided_block_t through kvb_write_member_t's strided
 * field), engine level, real engines:
 *  - a TP1->TP2 group with one strided block per member per source page
 *    (the head half of every row) lands exactly what the plain per-row
 *    blocks land, on the direct lane (targets from kvb_mem_alloc) and on
 *    the message lane (plain target memory: the rows are expanded);
 *  - plain blocks folded into one run: that run copied, no stale run of an
 *    earlier write walked;
 *  - members whose runs do not line up (one block of 48 pages against 48
 *    blocks of one page): the zip walks rows, both exact;
 *  - pages consecutive on both sides (their strided blocks fold into one
 *    run), rows longer than a copy unit, contiguous rows (stride = len),
 *    count 1, and a stride leaving gaps: exact, and every gap byte
 *    untouched;
 *  - the rules: count 0, overlapping destination rows, a wrapping span
 *    (KVB_ERR_INVALID), a last row outside either side's registration
 *    (KVB_ERR_BOUNDS, nothing written), plain and strided blocks in one
 *    member, the flag from a caller whose struct lacks the fields; a caller
 *    built against the struct before the strided fields still writes.
 * Every wait is bounded. */
#include "tp2_common.h"

#include <signal.h>
#include <stddef.h>
#include <stdio.h>

/* Member r's strided blocks for npages source pages: one per page. */
static kvb_strided_block_t *tp2_strided(const target_t *t, int r, size_t npages)
{
    kvb_strided_block_t *b = malloc(npages * sizeof(*b));
    CHECK(b != NULL);
    for (size_t p = 0; p < npages; p++)
        b[p] = (kvb_strided_block_t){
            .src = (uint64_t)(uintptr_t)(g_src + p * PAGE + (size_t)r * HALF),
            .dst = (uint64_t)(uintptr_t)(t->base + perm(p, npages) * (PAGE / 2)),
            .len = HALF,
            .src_stride = ROW,
            .dst_stride = HALF,
            .count = PAGE / ROW};
    return b;
}

static kvb_write_member_t smember(const target_t *t, const kvb_strided_block_t *b, size_t n,
                                  const kvb_write_params_t *wp)
{
    return (kvb_write_member_t){.field_mask = KVB_WRITE_MEMBER_PARAMS | KVB_WRITE_MEMBER_STRIDED,
                                .session_id = sid_of(t),
                                .params = wp,
                                .strided = b,
                                .strided_count = n};
}

/* Run a group of n members to the end (bounded); their final statuses. */
static void group_run(kvb_engine_h w, const kvb_write_member_t *mb, size_t n, size_t member_size,
                      kvb_status_t *fin)
{
    kvb_status_t st[4];
    kvb_xfer_h x[4];
    kvb_engine_write_group_async(w, mb, n, member_size, st, x);
    for (size_t k = 0; k < n; k++) {
        fin[k] = st[k] == KVB_OK ? kvb_xfer_wait(x[k], 30) : st[k];
        if (fin[k] != KVB_OK)
            fprintf(stderr, "  member %zu: %s (%s)\n", k, kvb_status_string(fin[k]),
                    kvb_xfer_error(x[k]));
        kvb_xfer_free(x[k]);
    }
}

/* TP1->TP2 as strided blocks to two targets (shared: the direct lane;
 * else the message lane): both exact, guards intact. */
static void tp2_case(bool shared)
{
    size_t npages = 512;
    target_t t[2] = {target_new(shared, npages * PAGE / 2), target_new(shared, npages * PAGE / 2)};
    kvb_engine_h w = writer();
    kvb_write_params_t wp[2];
    kvb_write_member_t mb[2];
    kvb_strided_block_t *b[2];
    kvb_status_t fin[2];
    fill_source(shared ? 0x51 : 0x52);
    for (int r = 0; r < 2; r++) {
        b[r] = tp2_strided(&t[r], r, npages);
        wp[r] = (kvb_write_params_t){.field_mask = KVB_WRITE_PARAM_EPOCH, .epoch = t[r].epoch};
        mb[r] = smember(&t[r], b[r], npages, &wp[r]);
    }
    group_run(w, mb, 2, sizeof(mb[0]), fin);
    for (int r = 0; r < 2; r++) {
        CHECK_EQ(fin[r], KVB_OK);
        CHECK(tp2_exact(&t[r], r, npages));
        free(b[r]);
    }
    kvb_engine_destroy(w);
    targets_free(&t[0], &t[1]);
    TEST_PASS(shared ? "TP1->TP2 strided group, direct lane: both halves exact, guards intact"
                     : "TP1->TP2 strided group, message lane: both halves exact, guards intact");
}

/* Members whose runs do not line up (member 0: 48 pages as one strided
 * block, their destinations consecutive; member 1: the same pages one block
 * each, destinations reversed): the zip walks rows, both exact. */
static void unaligned_case(void)
{
    size_t npages = 48, rows = PAGE / ROW;
    target_t t[2] = {target_new(true, npages * PAGE / 2), target_new(true, npages * PAGE / 2)};
    kvb_engine_h w = writer();
    kvb_write_params_t wp[2] = {{.field_mask = KVB_WRITE_PARAM_EPOCH, .epoch = t[0].epoch},
                                {.field_mask = KVB_WRITE_PARAM_EPOCH, .epoch = t[1].epoch}};
    kvb_strided_block_t one = {
        (uint64_t)(uintptr_t)g_src, (uint64_t)(uintptr_t)t[0].base, HALF, ROW, HALF, npages * rows};
    kvb_strided_block_t *each = malloc(npages * sizeof(*each));
    CHECK(each != NULL);
    for (size_t p = 0; p < npages; p++)
        each[p] =
            (kvb_strided_block_t){(uint64_t)(uintptr_t)(g_src + p * PAGE + HALF),
                                  (uint64_t)(uintptr_t)(t[1].base + (npages - 1 - p) * (PAGE / 2)),
                                  HALF,
                                  ROW,
                                  HALF,
                                  rows};
    kvb_write_member_t mb[2] = {smember(&t[0], &one, 1, &wp[0]),
                                smember(&t[1], each, npages, &wp[1])};
    kvb_status_t fin[2];
    fill_source(0x71);
    group_run(w, mb, 2, sizeof(mb[0]), fin);
    CHECK_EQ(fin[0], KVB_OK);
    CHECK_EQ(fin[1], KVB_OK);
    for (size_t p = 0; p < npages; p++)
        for (size_t i = 0; i < rows; i++) {
            const uint8_t *row = g_src + p * PAGE + i * ROW;
            CHECK(memcmp(t[0].base + (p * rows + i) * HALF, row, HALF) == 0);
            CHECK(memcmp(t[1].base + (npages - 1 - p) * (PAGE / 2) + i * HALF, row + HALF, HALF) ==
                  0);
        }
    CHECK(kvb_test_all(t[0].base + t[0].len, GUARD, GUARD_FILL));
    CHECK(kvb_test_all(t[1].base + t[1].len, GUARD, GUARD_FILL));
    free(each);
    kvb_engine_destroy(w);
    targets_free(&t[0], &t[1]);
    TEST_PASS("members whose runs do not line up: both exact");
}

/* Plain blocks that fold into one run count as its rows only: a write of
 * 64 contiguous blocks (one run of one row) after a write of 64 scattered
 * ones (whose run array the next write gets back from the engine's array
 * cache) copies its run and nothing else. Before the fix the row count was
 * taken before folding, and the copy threads walked the previous write's
 * stale runs: region A below was written again. */
static void folded_case(void)
{
    target_t t = target_new(true, 2 * MiB);
    kvb_engine_h w = writer();
    kvb_block_t b[64];
    const char *sid = sid_of(&t);
    for (int round = 0; round < 4; round++) {
        fill_source(0x80 + (uint64_t)round);
        for (size_t i = 0; i < 64; i++) /* region A: 64 scattered 1 KiB rows */
            b[i] = (kvb_block_t){(uint64_t)(uintptr_t)(g_src + i * 4 * KiB),
                                 (uint64_t)(uintptr_t)(t.base + i * 8 * KiB), KiB};
        CHECK_EQ(kvb_engine_write(w, sid, b, 64, 30), KVB_OK);
        memset(t.base, GUARD_FILL, t.len);
        fill_source(0x90 + (uint64_t)round);
        for (size_t i = 0; i < 64; i++) /* region B: 64 contiguous 4 KiB blocks */
            b[i] = (kvb_block_t){(uint64_t)(uintptr_t)(g_src + MiB + i * 4 * KiB),
                                 (uint64_t)(uintptr_t)(t.base + MiB + i * 4 * KiB), 4 * KiB};
        CHECK_EQ(kvb_engine_write(w, sid, b, 64, 30), KVB_OK);
        CHECK(memcmp(t.base + MiB, g_src + MiB, 256 * KiB) == 0);
        CHECK(kvb_test_all(t.base, MiB, GUARD_FILL));
        CHECK(kvb_test_all(t.base + MiB + 256 * KiB, MiB - 256 * KiB, GUARD_FILL));
    }
    kvb_engine_destroy(w);
    kvb_test_end_free(&t.end);
    TEST_PASS("blocks folded into one run: that run copied, nothing else (no stale runs)");
}

/* Shapes on one target (shared or not), each checked byte by byte: the
 * gaps a stride leaves keep the guard fill. */
typedef struct shape {
    uint64_t src_off, dst_off, len, sstride, dstride, count;
} shape_t;

static const shape_t g_shapes[] = {
    /* pages consecutive on both sides, given per page: one run */
    {0, 0, HALF, ROW, HALF, 16},
    {16 * ROW, 16 * HALF, HALF, ROW, HALF, 16},
    {32 * ROW, 32 * HALF, HALF, ROW, HALF, 16},
    /* gaps at the destination: 100 bytes every 4 KiB */
    {4 * MiB, MiB, 100, 3 * KiB, 4 * KiB, 40},
    /* rows longer than a 1 MiB copy unit */
    {5 * MiB, 2 * MiB, MiB + 4321, MiB + 8192, MiB + 4321 + 512, 3},
    /* contiguous rows (one block) and a single row */
    {9 * MiB, 6 * MiB, 512, 512, 512, 64},
    {10 * MiB, 7 * MiB, 777, 0, 0, 1},
};
#define NSHAPES (sizeof(g_shapes) / sizeof(g_shapes[0]))

static bool shape_exact(const target_t *t, const shape_t *s)
{
    for (uint64_t r = 0; r < s->count; r++) {
        const uint8_t *d = t->base + s->dst_off + r * s->dstride;
        if (memcmp(d, g_src + s->src_off + r * s->sstride, s->len) != 0)
            return false;
        if (r + 1 < s->count && !kvb_test_all(d + s->len, s->dstride - s->len, GUARD_FILL))
            return false;
    }
    return true;
}

static void shapes_case(bool shared)
{
    target_t t = target_new(shared, 8 * MiB);
    kvb_engine_h w = writer();
    kvb_strided_block_t b[NSHAPES];
    kvb_write_params_t wp = {.field_mask = KVB_WRITE_PARAM_EPOCH, .epoch = t.epoch};
    kvb_status_t fin;
    fill_source(shared ? 0x61 : 0x62);
    for (size_t i = 0; i < NSHAPES; i++) {
        const shape_t *s = &g_shapes[i];
        b[i] = (kvb_strided_block_t){(uint64_t)(uintptr_t)(g_src + s->src_off),
                                     (uint64_t)(uintptr_t)(t.base + s->dst_off),
                                     s->len,
                                     s->sstride,
                                     s->dstride,
                                     s->count};
    }
    kvb_write_member_t mb = smember(&t, b, NSHAPES, &wp);
    group_run(w, &mb, 1, sizeof(mb), &fin);
    CHECK_EQ(fin, KVB_OK);
    for (size_t i = 0; i < NSHAPES; i++)
        CHECK(shape_exact(&t, &g_shapes[i]));
    /* the first shapes' 48 rows, each half the page's 1 KiB rows */
    CHECK(kvb_test_all(t.base + 48 * HALF, MiB - 48 * HALF, GUARD_FILL));
    CHECK(kvb_test_all(t.end.buf, GUARD, GUARD_FILL));
    CHECK(kvb_test_all(t.base + t.len, GUARD, GUARD_FILL));
    kvb_engine_destroy(w);
    kvb_test_end_free(&t.end);
    TEST_PASS(shared ? "strided shapes, direct lane: exact, gaps and guards untouched"
                     : "strided shapes, message lane: exact, gaps and guards untouched");
}

/* One member with one strided block b: its start status and reason. */
static kvb_status_t try_one(kvb_engine_h w, const target_t *t, kvb_strided_block_t b,
                            const char *why_part)
{
    kvb_write_member_t mb = smember(t, &b, 1, NULL);
    kvb_status_t st;
    kvb_xfer_h x = NULL;
    kvb_engine_write_group_async(w, &mb, 1, sizeof(mb), &st, &x);
    CHECK(x != NULL);
    CHECK_EQ(kvb_xfer_test(x), st);
    CHECK_STR_CONTAINS(kvb_xfer_error(x), why_part);
    kvb_xfer_free(x);
    return st;
}

static void rules_case(void)
{
    target_t t = target_new(true, MiB);
    kvb_engine_h w = writer();
    uint64_t src = (uint64_t)(uintptr_t)g_src, dst = (uint64_t)(uintptr_t)t.base;
    CHECK_EQ(try_one(w, &t, (kvb_strided_block_t){src, dst, 64, 64, 64, 0}, "count 0"),
             KVB_ERR_INVALID);
    CHECK_EQ(try_one(w, &t, (kvb_strided_block_t){src, dst, 64, 64, 32, 4}, "rows overlap"),
             KVB_ERR_INVALID);
    CHECK_EQ(try_one(w, &t, (kvb_strided_block_t){src, dst, 64, UINT64_MAX / 2, 64, 4}, "wrap"),
             KVB_ERR_INVALID);
    /* first rows inside, the last one past the target's 1 MiB + guard */
    CHECK_EQ(try_one(w, &t, (kvb_strided_block_t){src, dst, 64, 64, 4096, 1024},
                     "not inside a region the peer registered"),
             KVB_ERR_BOUNDS);
    CHECK_EQ(try_one(w, &t, (kvb_strided_block_t){src + g_src_len - 4096, dst, 64, 4096, 64, 2},
                     "local source"),
             KVB_ERR_BOUNDS);
    CHECK(kvb_test_all(t.end.buf, t.len + 2 * GUARD, GUARD_FILL));

    kvb_block_t plain = {src, dst, 64};
    kvb_strided_block_t sb = {src, dst, 64, 64, 64, 1};
    kvb_write_member_t mb = smember(&t, &sb, 1, NULL);
    kvb_status_t st;
    kvb_xfer_h x;
    mb.blocks = &plain;
    mb.count = 1;
    CHECK_EQ(kvb_engine_write_group_async(w, &mb, 1, sizeof(mb), &st, &x), KVB_ERR_INVALID);
    CHECK_STR_CONTAINS(kvb_xfer_error(x), "both plain and strided");
    kvb_xfer_free(x);
    /* a caller whose struct ends before the strided fields */
    size_t v1 = offsetof(kvb_write_member_t, strided);
    mb = smember(&t, &sb, 1, NULL);
    CHECK_EQ(kvb_engine_write_group_async(w, &mb, 1, v1, &st, &x), KVB_ERR_INVALID);
    CHECK_STR_CONTAINS(kvb_xfer_error(x), "member_size does not reach");
    kvb_xfer_free(x);
    mb.field_mask = 0;
    mb.blocks = &plain;
    mb.count = 1;
    CHECK_EQ(kvb_engine_write_group_async(w, &mb, 1, v1, &st, &x), KVB_OK);
    CHECK_EQ(kvb_xfer_wait(x, 30), KVB_OK);
    kvb_xfer_free(x);
    CHECK(memcmp(t.base, g_src, 64) == 0);
    kvb_engine_destroy(w);
    kvb_test_end_free(&t.end);
    TEST_PASS("strided rules: INVALID and BOUNDS with reasons, nothing written; old struct size "
              "still writes");
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    g_src_len = 16 * (size_t)MiB;
    CHECK((g_src = aligned_alloc(4096, g_src_len)) != NULL);
    tp2_case(true);
    tp2_case(false);
    unaligned_case();
    folded_case();
    shapes_case(true);
    shapes_case(false);
    rules_case();
    free(g_src);
    return 0;
}
