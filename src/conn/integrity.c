/* KV integrity digests (integrity.h, docs/integrity.md). The item hash is
 * core/hash.h's, shared with the direct lane's copy threads. */
#include "conn/integrity.h"

#include "core/core.h"
#include "core/hash.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define HDR_BYTES 16 /* u32 version, u32 buffers, u32 pages, u32 patterns (version 1: 0) */

int kvb__integ_env(void)
{
    const char *v = kvb__env_get("KVBRIDGE_INTEGRITY", NULL);
    if (v == NULL || v[0] == '\0' || strcmp(v, "off") == 0)
        return 0;
    if (strcmp(v, "check") == 0)
        return 1;
    KVB_LOGW("KVBRIDGE_INTEGRITY=%s: expected off or check; integrity off", v);
    return 0;
}

kvb_status_t kvb__integ_init(kvb__integ_t *a, size_t n_buf)
{
    memset(a, 0, sizeof(*a));
    a->n_buf = n_buf;
    a->buf_sum = calloc(n_buf ? n_buf : 1, sizeof(*a->buf_sum));
    a->buf_seen = calloc(n_buf ? n_buf : 1, 1);
    a->pats = calloc(1, sizeof(*a->pats)); /* [0]: the whole page */
    a->n_pats = 1;
    if (a->buf_sum == NULL || a->buf_seen == NULL || a->pats == NULL) {
        kvb__integ_free(a);
        return KVB_ERR_NOMEM;
    }
    return KVB_OK;
}

void kvb__integ_free(kvb__integ_t *a)
{
    free(a->buf_sum);
    free(a->buf_seen);
    free(a->pages);
    free(a->pats);
    memset(a, 0, sizeof(*a));
}

static uint64_t item_hash(uint64_t src, uint64_t dst_addr, uint64_t len)
{
    return kvb__item_hash((const void *)(uintptr_t)src, (size_t)len, dst_addr);
}

static int ent_cmp(const void *x, const void *y)
{
    const kvb__integ_ent_t *a = x, *b = y;
    if (a->page != b->page)
        return a->page < b->page ? -1 : 1;
    return a->pat < b->pat ? -1 : a->pat > b->pat;
}

/* Sort the entries by (page, pattern) and add up those of one. */
static void pages_compact(kvb__integ_t *a)
{
    if (a->n_pages < 2)
        return;
    qsort(a->pages, a->n_pages, sizeof(*a->pages), ent_cmp);
    size_t o = 0;
    for (size_t i = 1; i < a->n_pages; i++) {
        if (ent_cmp(&a->pages[i], &a->pages[o]) == 0) {
            a->pages[o].sum += a->pages[i].sum;
            a->pages[o].nbuf += a->pages[i].nbuf;
        } else {
            a->pages[++o] = a->pages[i];
        }
    }
    a->n_pages = o + 1;
}

/* The destination buffer holding addr at an item boundary: the nearest base
 * below it. n_dst is small (layers × 2): a scan per block, not per row. */
static bool buffer_at(const uint64_t *ptrs, size_t n, uint64_t addr, uint64_t item_len, size_t *b_p)
{
    bool found = false;
    for (size_t i = 0; i < n; i++)
        if (ptrs[i] <= addr && (!found || ptrs[i] > ptrs[*b_p])) {
            *b_p = i;
            found = true;
        }
    return found && (addr - ptrs[*b_p]) % item_len == 0;
}

/* The items' hashes: computed from the source bytes, or handed over in
 * walk order (the engine's copy threads computed them: kvb_xfer_digests). */
typedef struct hsrc {
    const uint64_t *given; /* NULL: compute */
    size_t n, next;
} hsrc_t;

/* One row of whole items (the planner coalesces a run of pages contiguous
 * on both sides into one row): each item hashed on its own. */
static kvb_status_t add_row(kvb__integ_t *a, size_t buf, uint64_t src, uint64_t dst, uint64_t page,
                            uint64_t len, uint64_t item_len, hsrc_t *hs)
{
    for (uint64_t off = 0; off < len; off += item_len, page++) {
        if (hs->given != NULL && hs->next == hs->n) {
            kvb__integ_uncover(a, "the engine's item hashes do not match the blocks: not covered");
            return KVB_OK;
        }
        uint64_t h =
            hs->given != NULL ? hs->given[hs->next++] : item_hash(src + off, dst + off, item_len);
        a->buf_sum[buf] += h;
        if (kvb__integ_page_add(a, page, 0, h, 1) != KVB_OK)
            return KVB_ERR_NOMEM;
    }
    return KVB_OK;
}

/* Whether block x writes whole destination pages (rows of whole items) of
 * one of dst_ptrs[n_dst] (*buf_p), below a->dst_pool where it is known (a
 * block past it is a state buffer's, not KV); an empty block does. */
static bool block_whole(const kvb__integ_t *a, const kvb_strided_block_t *x,
                        const uint64_t *dst_ptrs, size_t n_dst, uint64_t item_len, size_t *buf_p)
{
    if (x->len == 0)
        return true;
    if (x->len % item_len != 0 || (x->count > 1 && x->dst_stride % item_len != 0) ||
        n_dst > a->n_buf || !buffer_at(dst_ptrs, n_dst, x->dst, item_len, buf_p))
        return false;
    uint64_t end = x->dst - dst_ptrs[*buf_p] + (x->count ? x->count - 1 : 0) * x->dst_stride +
                   x->len; /* past its last page's end */
    return a->dst_pool == 0 || end <= a->dst_pool * item_len;
}

/* Every item of b[n] (whole pages), in block, row, item order: its hash
 * added to a. */
static kvb_status_t add_walk(kvb__integ_t *a, const kvb_strided_block_t *b, size_t n,
                             const uint64_t *dst_ptrs, size_t n_dst, uint64_t item_len, hsrc_t *hs)
{
    for (size_t i = 0; i < n && !a->uncovered; i++) {
        const kvb_strided_block_t *x = &b[i];
        size_t buf = 0;
        if (x->len == 0)
            continue; /* writes nothing (and the engine skips it: no item) */
        (void)buffer_at(dst_ptrs, n_dst, x->dst, item_len, &buf); /* add_any checked it */
        uint64_t page0 = (x->dst - dst_ptrs[buf]) / item_len, step = x->dst_stride / item_len;
        a->buf_seen[buf] = 1;
        for (uint64_t k = 0; k < x->count && !a->uncovered; k++)
            if (add_row(a, buf, x->src + k * x->src_stride, x->dst + k * x->dst_stride,
                        page0 + k * step, x->len, item_len, hs) != KVB_OK)
                return KVB_ERR_NOMEM;
    }
    if (hs->given != NULL && hs->next != hs->n)
        kvb__integ_uncover(a, "the engine's item hashes do not match the blocks: not covered");
    pages_compact(a);
    return KVB_OK;
}

/* Whether block x lands outside every destination buffer's KV pages (below
 * all of them, or at or past a->dst_pool pages of the nearest one below): a
 * state buffer's block, not hashed (docs/integrity.md). Known only with
 * a->dst_pool. */
static bool not_kv(const kvb__integ_t *a, const kvb_strided_block_t *x, const uint64_t *dst_ptrs,
                   size_t n_dst, uint64_t item_len)
{
    uint64_t base = 0;
    bool found = false;
    if (a->dst_pool == 0 || x->len == 0)
        return false;
    for (size_t i = 0; i < n_dst; i++)
        if (dst_ptrs[i] <= x->dst && (!found || dst_ptrs[i] > base)) {
            base = dst_ptrs[i];
            found = true;
        }
    return !found || (x->dst - base) / item_len >= a->dst_pool;
}

/* The KV blocks of b[n] (state blocks left out): whole pages walked item by
 * item (hashes given or computed; computed when a block was left out, the
 * engine's count it too); any part of a page: every block through
 * integ_share.c's patterns, from the sources. */
static kvb_status_t add_any(kvb__integ_t *a, const kvb_strided_block_t *b, size_t n,
                            const uint64_t *dst_ptrs, size_t n_dst, uint64_t item_len, hsrc_t *hs)
{
    size_t buf = 0, m = 0;
    bool whole = true;
    if (item_len == 0 || (a->item_len != 0 && a->item_len != item_len)) {
        kvb__integ_uncover(a, "blocks of another page size: not covered");
        return KVB_OK;
    }
    a->item_len = item_len;
    kvb_strided_block_t *kv = malloc((n ? n : 1) * sizeof(*kv));
    if (kv == NULL)
        return KVB_ERR_NOMEM;
    for (size_t i = 0; i < n; i++)
        if (!not_kv(a, &b[i], dst_ptrs, n_dst, item_len)) {
            kv[m] = b[i];
            if (!block_whole(a, &kv[m], dst_ptrs, n_dst, item_len, &buf))
                whole = false;
            m++;
        }
    if (m < n)
        hs->given = NULL;
    kvb_status_t st = whole ? add_walk(a, kv, m, dst_ptrs, n_dst, item_len, hs)
                            : kvb__integ_add_parts(a, kv, m, dst_ptrs, n_dst, item_len);
    pages_compact(a);
    free(kv);
    return st;
}

kvb_status_t kvb__integ_add_blocks(kvb__integ_t *a, const kvb_strided_block_t *b, size_t n,
                                   const uint64_t *dst_ptrs, size_t n_dst, uint64_t item_len)
{
    hsrc_t hs = {NULL, 0, 0};
    return add_any(a, b, n, dst_ptrs, n_dst, item_len, &hs);
}

kvb_status_t kvb__integ_add_hashes(kvb__integ_t *a, const kvb_strided_block_t *b, size_t n,
                                   const uint64_t *dst_ptrs, size_t n_dst, uint64_t item_len,
                                   const uint64_t *h, size_t nh)
{
    hsrc_t hs = {h, nh, 0};
    return add_any(a, b, n, dst_ptrs, n_dst, item_len, &hs);
}

kvb_status_t kvb__integ_merge(kvb__integ_t *into, const kvb__integ_t *from)
{
    if (from->uncovered)
        kvb__integ_uncover(into, from->why);
    if (into->item_len == 0)
        into->item_len = from->item_len;
    else if (from->item_len != 0 && from->item_len != into->item_len)
        kvb__integ_uncover(into, "digests of another page size: not covered");
    for (size_t b = 0; b < into->n_buf && b < from->n_buf; b++) {
        into->buf_sum[b] += from->buf_sum[b];
        into->buf_seen[b] |= from->buf_seen[b];
    }
    for (size_t i = 0; i < from->n_pages; i++) {
        const kvb__integ_ent_t *e = &from->pages[i];
        long pat = kvb__integ_pat_index(into, &from->pats[e->pat]);
        if (pat < 0) {
            kvb__integ_uncover(into, "more share patterns than a digest carries: not covered");
            break;
        }
        if (kvb__integ_page_add(into, e->page, (uint32_t)pat, e->sum, e->nbuf) != KVB_OK)
            return KVB_ERR_NOMEM;
    }
    pages_compact(into);
    return KVB_OK;
}

static void put32(uint8_t **p, uint32_t v)
{
    memcpy(*p, &v, 4);
    *p += 4;
}
static void put64(uint8_t **p, uint64_t v)
{
    memcpy(*p, &v, 8);
    *p += 8;
}
static uint32_t get32(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}
static uint64_t get64(const uint8_t *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

static size_t bufs_named(const kvb__integ_t *a)
{
    size_t nb = 0;
    for (size_t b = 0; b < a->n_buf; b++)
        nb += a->buf_seen[b];
    return nb;
}

/* Version 1 when every entry is a whole page (today's value), else 2. */
static uint32_t wire_version(const kvb__integ_t *a)
{
    for (size_t i = 0; i < a->n_pages; i++)
        if (a->pages[i].pat != 0)
            return 2;
    return 1;
}

bool kvb__integ_sendable(kvb__integ_t *a)
{
    if (a->uncovered || wire_version(a) == 1)
        return !a->uncovered;
    if (!a->peer_v2) {
        kvb__integ_uncover(a, "parts of pages, and the decode reads no version-2 digest (it sent "
                              "no kv_digest=2): not covered");
        return false;
    }
    /* the decode recomputes each (page, pattern) in every buffer named */
    size_t nb = bufs_named(a);
    for (size_t i = 0; i < a->n_pages; i++)
        if (a->pages[i].nbuf != nb) {
            snprintf(a->why, sizeof(a->why),
                     "page %llu: a share written in %u of the %zu buffers: not covered",
                     (unsigned long long)a->pages[i].page, a->pages[i].nbuf, nb);
            a->uncovered = 1;
            return false;
        }
    return true;
}

kvb_status_t kvb__integ_encode(const kvb__integ_t *a, uint8_t **buf_p, size_t *len_p)
{
    size_t nb = bufs_named(a), np = a->n_pages;
    uint32_t v = wire_version(a), nt = v == 2 ? (uint32_t)(a->n_pats - 1) : 0;
    size_t len = HDR_BYTES + nb * 16 + (v == 2 ? nt * 32 + np * 24 : np * 16);
    uint8_t *buf = malloc(len), *p = buf;
    if (buf == NULL)
        return KVB_ERR_NOMEM;
    put32(&p, v);
    put32(&p, (uint32_t)nb);
    put32(&p, (uint32_t)np);
    put32(&p, nt);
    for (size_t b = 0; b < a->n_buf; b++)
        if (a->buf_seen[b]) {
            put64(&p, b);
            put64(&p, a->buf_sum[b]);
        }
    for (size_t t = 1; t <= nt; t++) {
        put64(&p, a->pats[t].off);
        put64(&p, a->pats[t].len);
        put64(&p, a->pats[t].stride);
        put64(&p, a->pats[t].count);
    }
    for (size_t i = 0; i < np; i++) {
        put64(&p, a->pages[i].page);
        put64(&p, a->pages[i].sum);
        if (v == 2) {
            put32(&p, a->pages[i].pat);
            put32(&p, 0);
        }
    }
    *buf_p = buf;
    *len_p = len;
    return KVB_OK;
}

/* A peer's pattern: pieces in order, inside the page, no overflow. */
static bool pat_valid(const kvb__integ_pat_t *t, uint64_t item_len)
{
    if (t->len == 0 || t->count == 0 || t->len > item_len || t->count > item_len ||
        (t->count > 1 && t->stride < t->len) || t->off > item_len)
        return false;
    uint64_t span = t->count - 1; /* (count - 1) * stride + len, overflow-checked */
    if (span != 0 && t->stride > (item_len - t->len) / span)
        return false;
    return t->off + span * t->stride + t->len <= item_len;
}

typedef struct wire {
    uint32_t v;
    uint64_t nb, np, nt;
    const uint8_t *bufs, *pats, *ents;
    size_t ent_bytes;
} wire_t;

/* The value's layout (docs/integrity.md "Wire") checked: sizes, counts. */
static bool wire_layout(const uint8_t *v, size_t len, uint64_t item_len, const kvb__integ_t *a,
                        wire_t *w, char *why, size_t wl)
{
    w->v = len >= HDR_BYTES ? get32(v) : 0;
    if (len < HDR_BYTES || w->v < 1 || w->v > KVB__INTEG_WIRE_MAX ||
        (w->v == 1 && get32(v + 12) != 0)) {
        snprintf(why, wl, "%s= of %zu bytes: not a version-1 or -2 digest", KVB__INTEG_EXT_KEY,
                 len);
        return false;
    }
    w->nb = get32(v + 4), w->np = get32(v + 8), w->nt = w->v == 2 ? get32(v + 12) : 0;
    w->ent_bytes = w->v == 2 ? 24 : 16;
    if (w->nb > a->n_buf || w->np > KVB__INTEG_MAX_PAGES || w->nt > KVB__INTEG_MAX_PATS ||
        len != HDR_BYTES + 16 * w->nb + 32 * w->nt + w->ent_bytes * w->np) {
        snprintf(why, wl,
                 "%s= names %llu buffers (we hold %zu), %llu pages (at most %u) and %llu "
                 "patterns (at most %u) in %zu bytes",
                 KVB__INTEG_EXT_KEY, (unsigned long long)w->nb, a->n_buf, (unsigned long long)w->np,
                 KVB__INTEG_MAX_PAGES, (unsigned long long)w->nt, KVB__INTEG_MAX_PATS, len);
        return false;
    }
    w->bufs = v + HDR_BYTES;
    w->pats = w->bufs + 16 * w->nb;
    w->ents = w->pats + 32 * w->nt;
    if (w->nt > 0 && item_len == 0) {
        snprintf(why, wl, "%s=: patterns, and our page size is unknown", KVB__INTEG_EXT_KEY);
        return false;
    }
    return true;
}

static kvb__integ_pat_t pat_at(const wire_t *w, uint64_t t)
{
    const uint8_t *p = w->pats + 32 * t;
    return (kvb__integ_pat_t){get64(p), get64(p + 8), get64(p + 16), get64(p + 24)};
}

/* Every buffer, pattern and entry of w checked before anything is kept. */
static bool wire_valid(const wire_t *w, const kvb__integ_t *a, uint64_t pool, uint64_t item_len,
                       char *why, size_t wl)
{
    for (uint64_t i = 0; i < w->nb; i++)
        if (get64(w->bufs + 16 * i) >= a->n_buf) {
            snprintf(why, wl, "%s= names buffer %llu, we hold %zu", KVB__INTEG_EXT_KEY,
                     (unsigned long long)get64(w->bufs + 16 * i), a->n_buf);
            return false;
        }
    for (uint64_t t = 0; t < w->nt; t++) {
        kvb__integ_pat_t x = pat_at(w, t);
        if (!pat_valid(&x, item_len)) {
            snprintf(why, wl,
                     "%s= pattern %llu (offset %llu, %llu bytes every %llu, %llu times) is not "
                     "inside a page of %llu bytes",
                     KVB__INTEG_EXT_KEY, (unsigned long long)t + 1, (unsigned long long)x.off,
                     (unsigned long long)x.len, (unsigned long long)x.stride,
                     (unsigned long long)x.count, (unsigned long long)item_len);
            return false;
        }
    }
    for (uint64_t i = 0; i < w->np; i++) {
        const uint8_t *e = w->ents + w->ent_bytes * i;
        if (get64(e) >= pool) {
            snprintf(why, wl, "%s= names page %llu, our buffers hold %llu", KVB__INTEG_EXT_KEY,
                     (unsigned long long)get64(e), (unsigned long long)pool);
            return false;
        }
        if (w->v == 2 && (get32(e + 16) > w->nt || get32(e + 20) != 0)) {
            snprintf(why, wl, "%s= page %llu names pattern %u of %llu", KVB__INTEG_EXT_KEY,
                     (unsigned long long)get64(e), get32(e + 16), (unsigned long long)w->nt);
            return false;
        }
    }
    if (a->n_pages + w->np > KVB__INTEG_MAX_PAGES || a->n_pats + w->nt > KVB__INTEG_MAX_PATS + 1) {
        snprintf(why, wl, "%s=: more than %u pages or %u patterns in the room's digests",
                 KVB__INTEG_EXT_KEY, KVB__INTEG_MAX_PAGES, KVB__INTEG_MAX_PATS);
        return false;
    }
    return true;
}

kvb_status_t kvb__integ_add_wire(kvb__integ_t *a, const uint8_t *v, size_t len, uint64_t pool,
                                 uint64_t item_len, char *why, size_t wl)
{
    wire_t w;
    uint32_t map[KVB__INTEG_MAX_PATS + 1] = {0}; /* the value's pattern t: a->pats[map[t]] */
    if (!wire_layout(v, len, item_len, a, &w, why, wl) ||
        !wire_valid(&w, a, pool, item_len, why, wl))
        return KVB_ERR_PROTO;
    a->item_len = item_len;
    for (uint64_t t = 0; t < w.nt; t++) {
        kvb__integ_pat_t x = pat_at(&w, t);
        long k = kvb__integ_pat_index(a, &x); /* room checked above */
        if (k < 0)
            return KVB_ERR_NOMEM;
        map[t + 1] = (uint32_t)k;
    }
    for (uint64_t i = 0; i < w.nb; i++) {
        a->buf_sum[get64(w.bufs + 16 * i)] += get64(w.bufs + 16 * i + 8);
        a->buf_seen[get64(w.bufs + 16 * i)] = 1;
    }
    for (uint64_t i = 0; i < w.np; i++) {
        const uint8_t *e = w.ents + w.ent_bytes * i;
        uint32_t pat = w.v == 2 ? map[get32(e + 16)] : 0;
        if (kvb__integ_page_add(a, get64(e), pat, get64(e + 8), 1) != KVB_OK)
            return KVB_ERR_NOMEM;
    }
    pages_compact(a);
    return KVB_OK;
}

kvb_status_t kvb__integ_run_init(const kvb__integ_t *a, kvb__integ_run_t *r)
{
    memset(r, 0, sizeof(*r));
    r->bufs = calloc(a->n_buf ? a->n_buf : 1, sizeof(*r->bufs));
    r->bs = calloc(a->n_buf ? a->n_buf : 1, sizeof(*r->bs));
    r->ps = calloc(a->n_pages ? a->n_pages : 1, sizeof(*r->ps));
    if (r->bufs == NULL || r->bs == NULL || r->ps == NULL) {
        kvb__integ_run_free(r);
        return KVB_ERR_NOMEM;
    }
    for (size_t b = 0; b < a->n_buf; b++)
        if (a->buf_seen[b])
            r->bufs[r->nb++] = b;
    r->n_items = a->n_pages * r->nb;
    return KVB_OK;
}

void kvb__integ_run_free(kvb__integ_run_t *r)
{
    free(r->bufs);
    free(r->bs);
    free(r->ps);
    memset(r, 0, sizeof(*r));
}

/* Items [from, to) in entry-major order (item t: the share of entry t / nb
 * in buffer bufs[t % nb]: the whole page, or its pattern's pieces); with several parts the sums go
 * in with atomic adds: two parts share the page at their boundary, and every buffer. */
void kvb__integ_run_part(const kvb__integ_t *a, kvb__integ_run_t *r, const uint64_t *kv_ptrs,
                         uint64_t item_len, size_t part, size_t n_parts)
{
    size_t from =
        r->n_items / n_parts * part + (part < r->n_items % n_parts ? part : r->n_items % n_parts);
    size_t to = from + r->n_items / n_parts + (part < r->n_items % n_parts);
    for (size_t t = from; t < to; t++) {
        size_t i = t / r->nb, b = r->bufs[t % r->nb];
        uint64_t at = kv_ptrs[b] + a->pages[i].page * item_len;
        const kvb__integ_pat_t *x = &a->pats[a->pages[i].pat];
        uint64_t h = a->pages[i].pat == 0 ? item_hash(at, at, item_len)
                                          : kvb__strided_hash((const char *)(uintptr_t)at + x->off,
                                                              x->len, x->stride, x->count, at);
        if (n_parts == 1) { /* alone: no other part adds */
            r->bs[b] += h;
            r->ps[i] += h;
        } else {
            __atomic_add_fetch(&r->bs[b], h, __ATOMIC_RELAXED);
            __atomic_add_fetch(&r->ps[i], h, __ATOMIC_RELAXED);
        }
    }
}

bool kvb__integ_run_verdict(const kvb__integ_t *a, const kvb__integ_run_t *r, char *why, size_t wl)
{
    long long bad_page = -1, bad_buf = -1;
    for (size_t i = 0; i < a->n_pages && bad_page < 0; i++)
        if (r->ps[i] != a->pages[i].sum)
            bad_page = (long long)a->pages[i].page;
    for (size_t b = 0; b < a->n_buf && bad_buf < 0; b++)
        if (a->buf_seen[b] && r->bs[b] != a->buf_sum[b])
            bad_buf = (long long)b;
    if (bad_page < 0 && bad_buf < 0)
        return true;
    size_t pages = 0; /* distinct pages: sources' shares of one page are entries of it */
    for (size_t i = 0; i < a->n_pages; i++)
        pages += i == 0 || a->pages[i].page != a->pages[i - 1].page;
    snprintf(why, wl,
             "KV integrity check failed: buffer %lld page %lld differs from what the prefill "
             "sent (XXH3 digest over %zu pages; -1: that view matched)",
             bad_buf, bad_page, pages);
    return false;
}

bool kvb__integ_check(const kvb__integ_t *a, const uint64_t *kv_ptrs, uint64_t item_len, char *why,
                      size_t wl)
{
    kvb__integ_run_t r;
    if (kvb__integ_run_init(a, &r) != KVB_OK) {
        snprintf(why, wl, "KV integrity: out of memory while checking");
        return false;
    }
    kvb__integ_run_part(a, &r, kv_ptrs, item_len, 0, 1);
    bool ok = kvb__integ_run_verdict(a, &r, why, wl);
    kvb__integ_run_free(&r);
    return ok;
}
