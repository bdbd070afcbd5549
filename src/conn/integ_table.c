/* The integrity accumulator's tables (integrity.h): page entries, the
 * pattern table and the uncovered mark, shared by the prefill's sums
 * (integrity.c, integ_share.c) and the decode's parser (integrity.c). */
#include "conn/integrity.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

kvb_status_t kvb__integ_page_add(kvb__integ_t *a, uint64_t page, uint32_t pat, uint64_t h,
                                 uint32_t nbuf)
{
    if (a->n_pages == a->cap_pages) {
        size_t cap = a->cap_pages ? 2 * a->cap_pages : 64;
        kvb__integ_ent_t *p = realloc(a->pages, cap * sizeof(*p));
        if (p == NULL)
            return KVB_ERR_NOMEM;
        a->pages = p;
        a->cap_pages = cap;
    }
    a->pages[a->n_pages++] = (kvb__integ_ent_t){page, h, pat, nbuf};
    return KVB_OK;
}

static bool whole_pat(const kvb__integ_pat_t *p, uint64_t item_len)
{
    return p->off == 0 && p->count == 1 && p->len == item_len;
}

long kvb__integ_pat_index(kvb__integ_t *a, const kvb__integ_pat_t *pat)
{
    if (whole_pat(pat, a->item_len) || (pat->len == 0 && pat->count == 0))
        return 0;
    for (size_t i = 1; i < a->n_pats; i++)
        if (memcmp(&a->pats[i], pat, sizeof(*pat)) == 0)
            return (long)i;
    if (a->n_pats > KVB__INTEG_MAX_PATS)
        return -1;
    kvb__integ_pat_t *p = realloc(a->pats, (a->n_pats + 1) * sizeof(*p));
    if (p == NULL)
        return -1;
    a->pats = p;
    a->pats[a->n_pats] = *pat;
    return (long)a->n_pats++;
}

void kvb__integ_uncover(kvb__integ_t *a, const char *why)
{
    if (!a->uncovered)
        snprintf(a->why, sizeof(a->why), "%s", why);
    a->uncovered = 1;
}
