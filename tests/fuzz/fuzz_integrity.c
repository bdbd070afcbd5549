/* Fuzz harness for the KV integrity digest a prefill sends on its status
 * (src/conn/integrity.h, kvb__integ_add_wire; docs/integrity.md "Wire"),
 * which a decode with integrity on parses from every kvbridge peer.
 *
 * Input: the kv_digest= value. Invariants (abort on violation): a refused
 * value leaves the accumulator empty (no buffer, no page, no sum) and says
 * why; an accepted one has exactly the length its counts give, names only
 * buffers below ours and pages below the pool, its pages sorted and
 * unique; the recomputation over a small arena of those pages then runs
 * within it (ASan would see a read outside). */
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
    kvb_status_t st = kvb__integ_add_wire(&a, data, size, POOL, why, sizeof(why));
    if (st != KVB_OK) {
        FUZZ_ASSERT(st == KVB_ERR_PROTO || st == KVB_ERR_NOMEM);
        FUZZ_ASSERT(st != KVB_ERR_PROTO || why[0] != '\0');
        FUZZ_ASSERT(st != KVB_ERR_PROTO || a.n_pages == 0);
        for (int b = 0; st == KVB_ERR_PROTO && b < NB; b++)
            FUZZ_ASSERT(a.buf_seen[b] == 0 && a.buf_sum[b] == 0);
        kvb__integ_free(&a);
        return 0;
    }
    uint32_t nb, np;
    FUZZ_ASSERT(size >= 16);
    memcpy(&nb, data + 4, 4);
    memcpy(&np, data + 8, 4);
    FUZZ_ASSERT(size == 16 + 16 * ((size_t)nb + np));
    FUZZ_ASSERT(nb <= NB && a.n_pages <= np);
    for (size_t i = 0; i < a.n_pages; i++) {
        FUZZ_ASSERT(a.pages[2 * i] < POOL);
        FUZZ_ASSERT(i == 0 || a.pages[2 * i] > a.pages[2 * (i - 1)]);
    }
    (void)kvb__integ_check(&a, ptrs, ITEM, why, sizeof(why));
    kvb__integ_free(&a);
    return 0;
}
