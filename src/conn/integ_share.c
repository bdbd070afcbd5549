/* KV integrity over parts of pages (integrity.h kvb__integ_add_parts,
 * docs/integrity.md "What the digest is"): a plan that writes part of a
 * destination page (heterogeneous TP head slices, page-size conversion, a
 * decode prefix ending mid-page, NHD <-> HND) digests each (buffer, page)'s
 * share: the pieces of the blocks that land in it, sorted by destination,
 * which must form one strided pattern (offset, len, stride, count) so the
 * decode can walk the same bytes; else the destination stays uncovered.
 * The share's hash streams its source pieces in destination order, seeded
 * with the page's destination address: for a whole page it equals the
 * one-shot item hash. */
#include "conn/integrity.h"

#include "core/hash.h"

#include <stdio.h>
#include <stdlib.h>

typedef struct piece {
    uint64_t buf, page, off, len, src;
} piece_t;

typedef struct pieces {
    piece_t *p;
    size_t n, cap;
} pieces_t;

static int piece_cmp(const void *x, const void *y)
{
    const piece_t *a = x, *b = y;
    if (a->buf != b->buf)
        return a->buf < b->buf ? -1 : 1;
    if (a->page != b->page)
        return a->page < b->page ? -1 : 1;
    return a->off < b->off ? -1 : a->off > b->off;
}

static kvb_status_t push(pieces_t *ps, piece_t x)
{
    if (ps->n == ps->cap) {
        size_t cap = ps->cap ? 2 * ps->cap : 64;
        piece_t *p = realloc(ps->p, cap * sizeof(*p));
        if (p == NULL)
            return KVB_ERR_NOMEM;
        ps->p = p;
        ps->cap = cap;
    }
    ps->p[ps->n++] = x;
    return KVB_OK;
}

/* The destination buffer holding addr: the nearest base at or below it. */
static bool buffer_of(const uint64_t *ptrs, size_t n, uint64_t addr, size_t *b_p)
{
    bool found = false;
    for (size_t i = 0; i < n; i++)
        if (ptrs[i] <= addr && (!found || ptrs[i] > ptrs[*b_p])) {
            *b_p = i;
            found = true;
        }
    return found;
}

/* Block x's rows cut at page boundaries into pieces of buffer buf; a piece
 * past a->dst_pool marks a uncovered. */
static kvb_status_t cut_block(kvb__integ_t *a, pieces_t *ps, const kvb_strided_block_t *x,
                              size_t buf, uint64_t base, uint64_t item_len)
{
    for (uint64_t k = 0; k < x->count; k++) {
        uint64_t src = x->src + k * x->src_stride, rel = x->dst + k * x->dst_stride - base;
        for (uint64_t left = x->len; left > 0;) {
            uint64_t off = rel % item_len, take = item_len - off < left ? item_len - off : left;
            if (rel / item_len >= a->dst_pool) { /* not this KV buffer's pages: a state block */
                kvb__integ_uncover(a, "a block outside the destination's KV pages (state, or "
                                      "their count unknown): not covered");
                return KVB_OK;
            }
            if (push(ps, (piece_t){buf, rel / item_len, off, take, src}) != KVB_OK)
                return KVB_ERR_NOMEM;
            src += take;
            rel += take;
            left -= take;
        }
    }
    return KVB_OK;
}

/* The one strided pattern of a page's sorted pieces p[n] (adjacent ones
 * joined into runs): false when they overlap or their runs differ in
 * length or spacing. */
static bool pattern_of(const piece_t *p, size_t n, kvb__integ_pat_t *t)
{
    uint64_t run_off = p[0].off, run_len = p[0].len;
    *t = (kvb__integ_pat_t){p[0].off, 0, 0, 0};
    for (size_t i = 1; i <= n; i++) {
        if (i < n && p[i].off < run_off + run_len)
            return false; /* overlapping pieces */
        if (i < n && p[i].off == run_off + run_len) {
            run_len += p[i].len;
            continue;
        }
        if (t->count == 1)
            t->stride = run_off - t->off; /* the second run fixes the spacing */
        if (t->count == 0)
            t->len = run_len;
        else if (run_len != t->len || run_off - t->off != t->count * t->stride)
            return false;
        t->count++;
        if (i < n) {
            run_off = p[i].off;
            run_len = p[i].len;
        }
    }
    if (t->count == 1)
        t->stride = t->len;
    return true;
}

/* One (buffer, page)'s pieces p[n]: its share's hash added under its
 * pattern, or a uncovered. hp: room for n pieces. */
static kvb_status_t add_share(kvb__integ_t *a, const piece_t *p, size_t n, kvb__hpiece_t *hp,
                              uint64_t seed)
{
    kvb__integ_pat_t t;
    if (!pattern_of(p, n, &t)) {
        char why[sizeof(a->why)];
        snprintf(why, sizeof(why),
                 "buffer %llu page %llu: the parts written into it form no single strided "
                 "pattern: not covered",
                 (unsigned long long)p[0].buf, (unsigned long long)p[0].page);
        kvb__integ_uncover(a, why);
        return KVB_OK;
    }
    long pat = kvb__integ_pat_index(a, &t);
    if (pat < 0) {
        kvb__integ_uncover(a, "more share patterns than a digest carries: not covered");
        return KVB_OK;
    }
    for (size_t i = 0; i < n; i++)
        hp[i] = (kvb__hpiece_t){(const void *)(uintptr_t)p[i].src, (size_t)p[i].len};
    uint64_t h = kvb__pieces_hash(hp, n, seed);
    a->buf_sum[p[0].buf] += h;
    a->buf_seen[p[0].buf] = 1;
    return kvb__integ_page_add(a, p[0].page, (uint32_t)pat, h, 1);
}

static kvb_status_t cut_all(kvb__integ_t *a, pieces_t *ps, const kvb_strided_block_t *b, size_t n,
                            const uint64_t *dst_ptrs, size_t n_dst, uint64_t item_len)
{
    for (size_t i = 0; i < n && !a->uncovered; i++) {
        size_t buf = 0;
        if (b[i].len == 0)
            continue;
        if (n_dst > a->n_buf || !buffer_of(dst_ptrs, n_dst, b[i].dst, &buf)) {
            kvb__integ_uncover(a, "a block outside the destination's KV buffers: not covered");
            return KVB_OK;
        }
        if (cut_block(a, ps, &b[i], buf, dst_ptrs[buf], item_len) != KVB_OK)
            return KVB_ERR_NOMEM;
    }
    return KVB_OK;
}

kvb_status_t kvb__integ_add_parts(kvb__integ_t *a, const kvb_strided_block_t *b, size_t n,
                                  const uint64_t *dst_ptrs, size_t n_dst, uint64_t item_len)
{
    pieces_t ps = {NULL, 0, 0};
    kvb__hpiece_t *hp = NULL;
    kvb_status_t st = cut_all(a, &ps, b, n, dst_ptrs, n_dst, item_len);
    if (st == KVB_OK && ps.n > 0 && !a->uncovered && (hp = malloc(ps.n * sizeof(*hp))) == NULL)
        st = KVB_ERR_NOMEM;
    if (st == KVB_OK && ps.n > 0 && !a->uncovered)
        qsort(ps.p, ps.n, sizeof(*ps.p), piece_cmp);
    for (size_t i = 0, j; st == KVB_OK && !a->uncovered && i < ps.n; i = j) {
        for (j = i + 1; j < ps.n && ps.p[j].buf == ps.p[i].buf && ps.p[j].page == ps.p[i].page;)
            j++;
        st = add_share(a, &ps.p[i], j - i, hp, dst_ptrs[ps.p[i].buf] + ps.p[i].page * item_len);
    }
    free(hp);
    free(ps.p);
    return st;
}
