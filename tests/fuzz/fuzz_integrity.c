/* Fuzz harness for the KV integrity digest a prefill sends on its status
 * (src/conn/integrity.h, kvb__integ_add_wire; docs/integrity.md "Wire"),
 * which a decode with integrity on parses from every kvbridge peer.
 *
 * Input: the kv_digest= value (version 1, or 2 with its pattern table).
 * Invariants (abort on violation): a refused value leaves the accumulator
 * empty (no buffer, no page, no pattern, no sum) and says why; an accepted
 * one has exactly the length its counts give, names only buffers below ours
 * and pages below the pool, its entries sorted and unique by (page,
 * pattern), every pattern inside one page; the recomputation over a small
 * arena of those pages then runs within it (ASan would see a read
 * outside). */
#include "conn/integrity.h"
#include "fuzz_assert.h"

#include <string.h>

#define NB 4
#define POOL 64
#define ITEM 64

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static uint8_t arena[NB][POOL * ITEM];

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    kvb__integ_t a;
    char why[256] = "";
    uint64_t ptrs[NB];
    for (int b = 0; b < NB; b++)
        ptrs[b] = (uint64_t)(uintptr_t)arena[b];
    if (kvb__integ_init(&a, NB) != KVB_OK)
        return 0;
    kvb_status_t st = kvb__integ_add_wire(&a, data, size, POOL, ITEM, why, sizeof(why));
    if (st != KVB_OK) {
        FUZZ_ASSERT(st == KVB_ERR_PROTO || st == KVB_ERR_NOMEM);
        FUZZ_ASSERT(st != KVB_ERR_PROTO || why[0] != '\0');
        FUZZ_ASSERT(st != KVB_ERR_PROTO || (a.n_pages == 0 && a.n_pats == 1));
        for (int b = 0; st == KVB_ERR_PROTO && b < NB; b++)
            FUZZ_ASSERT(a.buf_seen[b] == 0 && a.buf_sum[b] == 0);
        kvb__integ_free(&a);
        return 0;
    }
    uint32_t ver, nb, np, nt;
    FUZZ_ASSERT(size >= 16);
    memcpy(&ver, data, 4);
    memcpy(&nb, data + 4, 4);
    memcpy(&np, data + 8, 4);
    memcpy(&nt, data + 12, 4);
    FUZZ_ASSERT(ver == 1 || ver == 2);
    size_t want = ver == 1 ? 16 + 16 * ((size_t)nb + np)
                           : 16 + 16 * (size_t)nb + 32 * (size_t)nt + 24 * (size_t)np;
    FUZZ_ASSERT(size == want);
    FUZZ_ASSERT(nb <= NB && a.n_pages <= np && a.n_pats <= 1 + (size_t)nt);
    for (size_t i = 0; i < a.n_pages; i++) {
        const kvb__integ_ent_t *e = &a.pages[i], *f = &a.pages[i - (i > 0)];
        FUZZ_ASSERT(e->page < POOL && e->pat < a.n_pats);
        FUZZ_ASSERT(i == 0 || e->page > f->page || (e->page == f->page && e->pat > f->pat));
    }
    for (size_t t = 1; t < a.n_pats; t++) {
        const kvb__integ_pat_t *x = &a.pats[t];
        FUZZ_ASSERT(x->len > 0 && x->count > 0 && x->count <= ITEM && x->len <= ITEM);
        FUZZ_ASSERT(x->off + (x->count - 1) * x->stride + x->len <= ITEM);
    }
    (void)kvb__integ_check(&a, ptrs, ITEM, why, sizeof(why));
    kvb__integ_free(&a);
    return 0;
}
