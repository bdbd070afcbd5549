/* Shared by the engine's write-group tests (test_engine_group.c,
 * test_engine_strided.c): a source arena, direct-lane targets with guard
 * bytes, and the TP1->TP2 split of source pages (member r gets the r-th
 * 1 KiB half of every 2 KiB row; destination pages permuted). */
#ifndef KVB_TEST_TP2_COMMON_H
#define KVB_TEST_TP2_COMMON_H

#include "kvb_test.h"
#include "kvb_test_engine.h"

#include <kvbridge/engine.h>

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define KiB 1024u
#define MiB (1024u * KiB)
#define PAGE (32u * KiB) /* source page: 16 rows of 2 KiB */
#define ROW (2u * KiB)
#define HALF (1u * KiB)
#define GUARD MiB /* untouched bytes around each target's written range */
#define TAG 0x2e1bu
#define GUARD_FILL 0xee

static uint8_t *g_src;
static size_t g_src_len;

typedef struct target {
    kvb_test_end_t end;
    uint8_t *base; /* end.buf + GUARD: where the member writes */
    size_t len;    /* bytes it is written */
    uint64_t epoch;
} target_t;

static inline target_t target_new(bool shared, size_t len)
{
    target_t t = {0};
    t.end =
        kvb_test_end(kvb_test_engine(KVB_TRANSPORT_AUTO, 2), len + 2 * GUARD, GUARD_FILL, shared);
    t.base = t.end.buf + GUARD;
    t.len = len;
    CHECK_EQ(kvb_engine_grant_writer(t.end.eng, TAG, &t.epoch), KVB_OK);
    return t;
}

static inline const char *sid_of(const target_t *t)
{
    return kvb_engine_session_id(t->end.eng);
}

/* A member with plain blocks under grant *wp (NULL: none). */
static inline kvb_write_member_t member(const char *sid, const kvb_block_t *b, size_t n,
                                        const kvb_write_params_t *wp)
{
    return (kvb_write_member_t){.field_mask = wp != NULL ? KVB_WRITE_MEMBER_PARAMS : 0,
                                .session_id = sid,
                                .blocks = b,
                                .count = n,
                                .params = wp};
}

/* Source page p lands at destination page perm(p) (a permutation: npages a
 * power of two, the factor odd). */
static inline size_t perm(size_t p, size_t npages)
{
    return (p * 7919u) % npages;
}

/* Member r of a TP1->TP2 split of the first npages source pages: the r-th
 * half of every row, rows of a page contiguous at the destination. */
static inline kvb_block_t *tp2_blocks(const target_t *t, int r, size_t npages, size_t *n_p)
{
    size_t rows = PAGE / ROW, n = npages * rows;
    kvb_block_t *b = malloc(n * sizeof(*b));
    CHECK(b != NULL);
    for (size_t p = 0; p < npages; p++)
        for (size_t i = 0; i < rows; i++) {
            size_t k = p * rows + i;
            b[k].src = (uint64_t)(uintptr_t)(g_src + p * PAGE + i * ROW + (size_t)r * HALF);
            b[k].dst = (uint64_t)(uintptr_t)(t->base + perm(p, npages) * (PAGE / 2) + i * HALF);
            b[k].len = HALF;
        }
    *n_p = n;
    return b;
}

/* Does t hold member r's halves of npages pages, and its guards untouched? */
static inline bool tp2_exact(const target_t *t, int r, size_t npages)
{
    for (size_t p = 0; p < npages; p++)
        for (size_t i = 0; i < PAGE / ROW; i++)
            if (memcmp(t->base + perm(p, npages) * (PAGE / 2) + i * HALF,
                       g_src + p * PAGE + i * ROW + (size_t)r * HALF, HALF) != 0)
                return false;
    return kvb_test_all(t->end.buf, GUARD, GUARD_FILL) &&
           kvb_test_all(t->base + npages * (PAGE / 2), GUARD, GUARD_FILL);
}

static inline void fill_source(uint64_t seed)
{
    uint64_t s = seed;
    uint64_t *w = (uint64_t *)g_src;
    for (size_t i = 0; i < g_src_len / 8; i++)
        w[i] = kvb_test_xorshift(&s);
}

static inline void targets_free(target_t *t0, target_t *t1)
{
    kvb_test_end_free(&t0->end);
    kvb_test_end_free(&t1->end);
}

/* A writer engine with the source arena registered and our tag. */
static inline kvb_engine_h writer(void)
{
    kvb_engine_h w = kvb_test_engine(KVB_TRANSPORT_AUTO, 2);
    CHECK_EQ(kvb_engine_register(w, g_src, g_src_len, KVB_MEM_HOST), KVB_OK);
    kvb_engine_set_writer_tag(w, TAG);
    return w;
}

#endif
