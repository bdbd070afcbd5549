#include "engine/segtab.h"

#include <stdlib.h>
#include <string.h>

/* First index whose addr > key. */
static size_t upper_bound(const kvb__segtab_t *t, uint64_t key)
{
    size_t lo = 0, hi = t->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (t->v[mid].addr <= key)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

long kvb__segtab_find(const kvb__segtab_t *t, uint64_t addr, uint64_t len)
{
    uint64_t end;
    if (len == 0 || __builtin_add_overflow(addr, len, &end))
        return -1;
    size_t i = upper_bound(t, addr);
    if (i == 0)
        return -1;
    const kvb__seg_t *s = &t->v[i - 1];
    /* s->addr <= addr; the segment's own end cannot wrap (checked at insert). */
    if (addr - s->addr > s->len || len > s->len - (addr - s->addr))
        return -1;
    return (long)(i - 1);
}

bool kvb__segtab_overlaps(const kvb__segtab_t *t, uint64_t addr, uint64_t len)
{
    uint64_t end;
    if (len == 0 || __builtin_add_overflow(addr, len, &end))
        return false;
    size_t i = upper_bound(t, addr);
    if (i > 0 && addr - t->v[i - 1].addr < t->v[i - 1].len)
        return true;
    return i < t->n && t->v[i].addr < end;
}

long kvb__segtab_find_start(const kvb__segtab_t *t, uint64_t addr)
{
    size_t i = upper_bound(t, addr);
    if (i == 0 || t->v[i - 1].addr != addr)
        return -1;
    return (long)(i - 1);
}

kvb__seg_t *kvb__segtab_at(kvb__segtab_t *t, uint64_t addr)
{
    long k = kvb__segtab_find_start(t, addr);
    return k < 0 ? NULL : &t->v[k];
}

kvb_status_t kvb__segtab_insert(kvb__segtab_t *t, const kvb__seg_t *seg)
{
    uint64_t end;
    if (seg->len == 0 || __builtin_add_overflow(seg->addr, seg->len, &end))
        return KVB_ERR_INVALID;
    size_t i = upper_bound(t, seg->addr);
    if (i > 0) {
        const kvb__seg_t *prev = &t->v[i - 1];
        if (prev->addr == seg->addr || seg->addr - prev->addr < prev->len)
            return KVB_ERR_OVERLAP;
    }
    if (i < t->n && t->v[i].addr < end)
        return KVB_ERR_OVERLAP;
    if (t->n == t->cap) {
        size_t cap = t->cap ? t->cap * 2 : 16;
        kvb__seg_t *v = realloc(t->v, cap * sizeof(*v));
        if (v == NULL)
            return KVB_ERR_NOMEM;
        t->v = v;
        t->cap = cap;
    }
    memmove(&t->v[i + 1], &t->v[i], (t->n - i) * sizeof(*t->v));
    t->v[i] = *seg;
    t->n++;
    return KVB_OK;
}

void kvb__segtab_remove(kvb__segtab_t *t, size_t idx, kvb__seg_t *seg_p)
{
    if (seg_p != NULL)
        *seg_p = t->v[idx];
    memmove(&t->v[idx], &t->v[idx + 1], (t->n - idx - 1) * sizeof(*t->v));
    t->n--;
}

void kvb__segtab_free(kvb__segtab_t *t)
{
    free(t->v);
    t->v = NULL;
    t->n = t->cap = 0;
}
