/* Item hashes made in the copy (KVB_WRITE_PARAM_DIGEST, kvb_xfer_digests),
 * engine level, real engines. On the direct lane (target memory from
 * kvb_mem_alloc) every hash equals XXH3-64 of its source unit seeded with
 * its destination address, computed here with libxxhash's own reference
 * call, in block, row, unit order: for a unit that does not divide the copy
 * threads' 1 MiB unit (so their units are cut on hash-unit boundaries),
 * blocks that coalesce into one run, an empty block, a strided block, and a
 * two-member group (zipped copies); the bytes are exact and the guards
 * untouched. Not made (KVB_ERR_UNSUPPORTED, known right after the submit,
 * the bytes still exact): not asked for, a block that is not whole units,
 * the message lane (target memory not shared). */
#include "engine/engine_int.h"
#include "kvb_test.h"
#include "kvb_test_engine.h"

#include <kvbridge/engine.h>

#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "tp2_common.h"

#define UNIT (24u * KiB) /* does not divide the copy threads' 1 MiB */

static uint64_t a64(const void *p)
{
    return (uint64_t)(uintptr_t)p;
}

/* The reference hashes of b[n] (strided) in block, row, unit order. */
static uint64_t *ref_hashes(const kvb_strided_block_t *b, size_t n, uint64_t unit, size_t *n_p)
{
    size_t cnt = 0;
    for (size_t i = 0; i < n; i++)
        cnt += b[i].count * (b[i].len / unit);
    uint64_t *h = malloc((cnt ? cnt : 1) * sizeof(*h));
    CHECK(h != NULL);
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        for (uint64_t r = 0; r < b[i].count; r++)
            for (uint64_t o = 0; o < b[i].len; o += unit) {
                uint64_t s = b[i].src + r * b[i].src_stride + o;
                uint64_t d = b[i].dst + r * b[i].dst_stride + o;
                h[k++] = XXH3_64bits_withSeed((const void *)(uintptr_t)s, unit, d);
            }
    *n_p = cnt;
    return h;
}

/* Are b's bytes at their destinations (the targets' memory is mapped here too)? */
static bool exact(const kvb_strided_block_t *b, size_t n)
{
    for (size_t i = 0; i < n; i++)
        for (uint64_t r = 0; r < b[i].count; r++)
            if (memcmp((const void *)(uintptr_t)(b[i].dst + r * b[i].dst_stride),
                       (const void *)(uintptr_t)(b[i].src + r * b[i].src_stride), b[i].len) != 0)
                return false;
    return true;
}

static kvb_write_member_t smember(const char *sid, const kvb_strided_block_t *b, size_t n,
                                  const kvb_write_params_t *wp)
{
    return (kvb_write_member_t){.field_mask = KVB_WRITE_MEMBER_PARAMS | KVB_WRITE_MEMBER_STRIDED,
                                .session_id = sid,
                                .params = wp,
                                .strided = b,
                                .strided_count = n};
}

/* Start members mb[n], check each says at once whether it hashes (want[k]),
 * wait, check bytes and hashes. */
static void run_group(kvb_engine_h w, kvb_write_member_t *mb, size_t n, const bool *want,
                      const uint64_t *unit)
{
    kvb_status_t st[4];
    kvb_xfer_h x[4];
    CHECK_EQ(kvb_engine_write_group_async(w, mb, n, sizeof(mb[0]), st, x), KVB_OK);
    for (size_t k = 0; k < n; k++) {
        kvb_status_t d = kvb_xfer_digests(x[k], NULL, NULL);
        CHECK(want[k] ? (d == KVB_ERR_INPROGRESS || d == KVB_OK) : d == KVB_ERR_UNSUPPORTED);
    }
    for (size_t k = 0; k < n; k++) {
        const uint64_t *h = NULL;
        size_t nh = 0, nref = 0;
        CHECK_EQ(kvb_xfer_wait(x[k], 20), KVB_OK);
        CHECK(exact(mb[k].strided, mb[k].strided_count));
        if (!want[k]) {
            CHECK_EQ(kvb_xfer_digests(x[k], &h, &nh), KVB_ERR_UNSUPPORTED);
            kvb_xfer_free(x[k]);
            continue;
        }
        CHECK_EQ(kvb_xfer_digests(x[k], &h, &nh), KVB_OK);
        uint64_t *ref = ref_hashes(mb[k].strided, mb[k].strided_count, unit[k], &nref);
        CHECK_EQ(nh, nref);
        size_t diff = 0;
        for (size_t i = 0; i < nh && i < nref; i++)
            diff += h[i] != ref[i];
        fprintf(stderr, "  member %zu: %zu hashes of %llu bytes, %zu differ from XXH3\n", k, nh,
                (unsigned long long)unit[k], diff);
        CHECK_EQ(diff, (size_t)0);
        free(ref);
        kvb_xfer_free(x[k]);
    }
}

static void direct_case(void)
{
    target_t t0 = target_new(true, 8 * MiB), t1 = target_new(true, 8 * MiB);
    kvb_engine_h w = writer();
    fill_source(0x5eed);
    uint8_t *s = g_src, *d = t0.base;
    /* 48 units (1152 KiB, past a 1 MiB copy unit) and one more contiguous on
     * both sides (one run), an empty block, then 10 units elsewhere, then
     * 6 rows of 2 units at strides (src 3 units, dst 5) */
    kvb_strided_block_t b0[4] = {
        {a64(s), a64(d), 48 * UNIT, 48 * UNIT, 48 * UNIT, 1},
        {a64(s + 48 * UNIT), a64(d + 48 * UNIT), UNIT, UNIT, UNIT, 1},
        {a64(s + 3 * MiB), a64(d + 2 * MiB), 10 * UNIT, 10 * UNIT, 10 * UNIT, 1},
        {a64(s + 4 * MiB), a64(d + 3 * MiB), 2 * UNIT, 3 * UNIT, 5 * UNIT, 6},
    };
    kvb_strided_block_t e = {a64(s + 5 * MiB), a64(d + 5 * MiB), 0, 0, 0, 1};
    kvb_strided_block_t b0e[5] = {b0[0], b0[1], e, b0[2], b0[3]};
    /* member 1, to another target, another unit: 4 KiB, one long row */
    kvb_strided_block_t b1[1] = {{a64(s + 6 * MiB), a64(t1.base), 3 * MiB, 3 * MiB, 3 * MiB, 1}};
    kvb_write_params_t wp[2] = {{.field_mask = KVB_WRITE_PARAM_EPOCH | KVB_WRITE_PARAM_DIGEST,
                                 .epoch = t0.epoch,
                                 .digest_unit = UNIT},
                                {.field_mask = KVB_WRITE_PARAM_EPOCH | KVB_WRITE_PARAM_DIGEST,
                                 .epoch = t1.epoch,
                                 .digest_unit = 4 * KiB}};
    kvb_write_member_t mb[2] = {smember(sid_of(&t0), b0e, 5, &wp[0]),
                                smember(sid_of(&t1), b1, 1, &wp[1])};
    bool want[2] = {true, true};
    uint64_t unit[2] = {UNIT, 4 * KiB};
    unsigned items0 = KVB__HOOK(digest_items);
    run_group(w, mb, 2, want, unit);
    CHECK_EQ(KVB__HOOK(digest_items) - items0, 48u + 1 + 10 + 12 + 3 * MiB / (4 * KiB));
    CHECK_EQ(kvb_engine_session_direct(w, sid_of(&t0)), 1);
    CHECK(kvb_test_all(t0.end.buf, GUARD, GUARD_FILL));
    CHECK(kvb_test_all(t1.end.buf, GUARD, GUARD_FILL));
    TEST_PASS("direct lane: every item hash is XXH3 of its source unit seeded with its "
              "destination, in block order (cut units, coalesced run, empty and strided blocks, "
              "a two-member group); bytes exact");

    /* not asked for; a block of 1.5 units: not made, said at once, bytes exact */
    fill_source(0x5eee);
    kvb_strided_block_t odd[1] = {{a64(s), a64(d), UNIT + UNIT / 2, 0, 0, 1}};
    kvb_write_params_t plain = {.field_mask = KVB_WRITE_PARAM_EPOCH, .epoch = t1.epoch};
    kvb_write_member_t mb2[2] = {smember(sid_of(&t0), odd, 1, &wp[0]),
                                 smember(sid_of(&t1), b1, 1, &plain)};
    bool none[2] = {false, false};
    items0 = KVB__HOOK(digest_items);
    run_group(w, mb2, 2, none, unit);
    CHECK_EQ(KVB__HOOK(digest_items) - items0, 0u);
    kvb_engine_destroy(w);
    targets_free(&t0, &t1);
    TEST_PASS("direct lane: not asked for, or a block not whole units: KVB_ERR_UNSUPPORTED at "
              "once, nothing hashed, bytes exact");
}

static void message_case(void)
{
    target_t t = target_new(false, 4 * MiB);
    kvb_engine_h w = writer();
    fill_source(0x77);
    kvb_strided_block_t b[1] = {{a64(g_src), a64(t.base), 8 * UNIT, 8 * UNIT, 8 * UNIT, 1}};
    kvb_write_params_t wp = {.field_mask = KVB_WRITE_PARAM_EPOCH | KVB_WRITE_PARAM_DIGEST,
                             .epoch = t.epoch,
                             .digest_unit = UNIT};
    kvb_write_member_t mb[1] = {smember(sid_of(&t), b, 1, &wp)};
    bool want[1] = {false};
    uint64_t unit[1] = {UNIT};
    unsigned items0 = KVB__HOOK(digest_items);
    run_group(w, mb, 1, want, unit);
    CHECK_EQ(KVB__HOOK(digest_items) - items0, 0u);
    CHECK_EQ(kvb_engine_session_direct(w, sid_of(&t)), 0);
    CHECK_EQ(kvb_xfer_digests(NULL, NULL, NULL), KVB_ERR_INVALID);
    kvb_engine_destroy(w);
    kvb_test_end_free(&t.end);
    TEST_PASS("message lane: item hashes not made (KVB_ERR_UNSUPPORTED at once), bytes exact");
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    g_src_len = 16 * (size_t)MiB;
    CHECK((g_src = aligned_alloc(4096, g_src_len)) != NULL);
    direct_case();
    message_case();
    free(g_src);
    return 0;
}
