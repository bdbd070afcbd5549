/* KV integrity digests (integrity.h, docs/integrity.md). The item hash is
 * core/hash.h's, shared with the direct lane's copy threads. */
#include "conn/integrity.h"

#include "core/core.h"
#include "core/hash.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define WIRE_VERSION 1u
#define HDR_BYTES 16 /* u32 version, u32 buffers, u32 pages, u32 zero */

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
    if (a->buf_sum == NULL || a->buf_seen == NULL) {
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
    memset(a, 0, sizeof(*a));
}

static uint64_t item_hash(uint64_t src, uint64_t dst_addr, uint64_t len)
{
    return kvb__item_hash((const void *)(uintptr_t)src, (size_t)len, dst_addr);
}

static kvb_status_t page_add(kvb__integ_t *a, uint64_t page, uint64_t h)
{
    if (a->n_pages == a->cap_pages) {
        size_t cap = a->cap_pages ? 2 * a->cap_pages : 64;
        uint64_t *p = realloc(a->pages, cap * 2 * sizeof(uint64_t));
        if (p == NULL)
            return KVB_ERR_NOMEM;
        a->pages = p;
        a->cap_pages = cap;
    }
    a->pages[2 * a->n_pages] = page;
    a->pages[2 * a->n_pages + 1] = h;
    a->n_pages++;
    return KVB_OK;
}

static int pair_cmp(const void *x, const void *y)
{
    uint64_t a = *(const uint64_t *)x, b = *(const uint64_t *)y;
    return a < b ? -1 : a > b;
}

/* Sort the pairs by page and add up the entries of one page. */
static void pages_compact(kvb__integ_t *a)
{
    if (a->n_pages < 2)
        return;
    qsort(a->pages, a->n_pages, 2 * sizeof(uint64_t), pair_cmp);
    size_t o = 0;
    for (size_t i = 1; i < a->n_pages; i++) {
        if (a->pages[2 * i] == a->pages[2 * o]) {
            a->pages[2 * o + 1] += a->pages[2 * i + 1];
        } else {
            o++;
            a->pages[2 * o] = a->pages[2 * i];
            a->pages[2 * o + 1] = a->pages[2 * i + 1];
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

static void uncover(kvb__integ_t *a, const char *why)
{
    if (!a->uncovered)
        snprintf(a->why, sizeof(a->why), "%s", why);
    a->uncovered = 1;
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
            uncover(a, "the engine's item hashes do not match the blocks: not covered");
            return KVB_OK;
        }
        uint64_t h =
            hs->given != NULL ? hs->given[hs->next++] : item_hash(src + off, dst + off, item_len);
        a->buf_sum[buf] += h;
        if (page_add(a, page, h) != KVB_OK)
            return KVB_ERR_NOMEM;
    }
    return KVB_OK;
}

/* Every item of b[n], in block, row, item order: its hash added to a. */
static kvb_status_t add_walk(kvb__integ_t *a, const kvb_strided_block_t *b, size_t n,
                             const uint64_t *dst_ptrs, size_t n_dst, uint64_t item_len, hsrc_t *hs)
{
    for (size_t i = 0; i < n && !a->uncovered; i++) {
        const kvb_strided_block_t *x = &b[i];
        size_t buf = 0;
        if (x->len == 0)
            continue; /* writes nothing (and the engine skips it: no item) */
        if (item_len == 0 || x->len % item_len || (x->count > 1 && x->dst_stride % item_len) ||
            n_dst > a->n_buf || !buffer_at(dst_ptrs, n_dst, x->dst, item_len, &buf)) {
            uncover(a, "a block writes part of a destination page (heterogeneous TP or page "
                       "size): not covered");
            break;
        }
        uint64_t page0 = (x->dst - dst_ptrs[buf]) / item_len, step = x->dst_stride / item_len;
        a->buf_seen[buf] = 1;
        for (uint64_t k = 0; k < x->count && !a->uncovered; k++)
            if (add_row(a, buf, x->src + k * x->src_stride, x->dst + k * x->dst_stride,
                        page0 + k * step, x->len, item_len, hs) != KVB_OK)
                return KVB_ERR_NOMEM;
    }
    if (hs->given != NULL && hs->next != hs->n)
        uncover(a, "the engine's item hashes do not match the blocks: not covered");
    pages_compact(a);
    return KVB_OK;
}

kvb_status_t kvb__integ_add_blocks(kvb__integ_t *a, const kvb_strided_block_t *b, size_t n,
                                   const uint64_t *dst_ptrs, size_t n_dst, uint64_t item_len)
{
    hsrc_t hs = {NULL, 0, 0};
    return add_walk(a, b, n, dst_ptrs, n_dst, item_len, &hs);
}

kvb_status_t kvb__integ_add_hashes(kvb__integ_t *a, const kvb_strided_block_t *b, size_t n,
                                   const uint64_t *dst_ptrs, size_t n_dst, uint64_t item_len,
                                   const uint64_t *h, size_t nh)
{
    hsrc_t hs = {h, nh, 0};
    return add_walk(a, b, n, dst_ptrs, n_dst, item_len, &hs);
}

kvb_status_t kvb__integ_merge(kvb__integ_t *into, const kvb__integ_t *from)
{
    if (from->uncovered)
        uncover(into, from->why);
    for (size_t b = 0; b < into->n_buf && b < from->n_buf; b++) {
        into->buf_sum[b] += from->buf_sum[b];
        into->buf_seen[b] |= from->buf_seen[b];
    }
    for (size_t i = 0; i < from->n_pages; i++)
        if (page_add(into, from->pages[2 * i], from->pages[2 * i + 1]) != KVB_OK)
            return KVB_ERR_NOMEM;
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

kvb_status_t kvb__integ_encode(const kvb__integ_t *a, uint8_t **buf_p, size_t *len_p)
{
    size_t nb = 0;
    for (size_t b = 0; b < a->n_buf; b++)
        nb += a->buf_seen[b];
    size_t len = HDR_BYTES + nb * 16 + a->n_pages * 16;
    uint8_t *buf = malloc(len), *p = buf;
    if (buf == NULL)
        return KVB_ERR_NOMEM;
    put32(&p, WIRE_VERSION);
    put32(&p, (uint32_t)nb);
    put32(&p, (uint32_t)a->n_pages);
    put32(&p, 0);
    for (size_t b = 0; b < a->n_buf; b++)
        if (a->buf_seen[b]) {
            put64(&p, b);
            put64(&p, a->buf_sum[b]);
        }
    for (size_t i = 0; i < 2 * a->n_pages; i++)
        put64(&p, a->pages[i]);
    *buf_p = buf;
    *len_p = len;
    return KVB_OK;
}

kvb_status_t kvb__integ_add_wire(kvb__integ_t *a, const uint8_t *v, size_t len, uint64_t pool,
                                 char *why, size_t wl)
{
    if (len < HDR_BYTES || get32(v) != WIRE_VERSION || get32(v + 12) != 0) {
        snprintf(why, wl, "%s= of %zu bytes: not a version-%u digest", KVB__INTEG_EXT_KEY, len,
                 WIRE_VERSION);
        return KVB_ERR_PROTO;
    }
    uint64_t nb = get32(v + 4), np = get32(v + 8);
    if (nb > a->n_buf || np > KVB__INTEG_MAX_PAGES || len != HDR_BYTES + 16 * (nb + np)) {
        snprintf(why, wl,
                 "%s= names %llu buffers (we hold %zu) and %llu pages (at most %u) in %zu bytes",
                 KVB__INTEG_EXT_KEY, (unsigned long long)nb, a->n_buf, (unsigned long long)np,
                 KVB__INTEG_MAX_PAGES, len);
        return KVB_ERR_PROTO;
    }
    const uint8_t *p = v + HDR_BYTES;
    for (uint64_t i = 0; i < nb; i++, p += 16)
        if (get64(p) >= a->n_buf) {
            snprintf(why, wl, "%s= names buffer %llu, we hold %zu", KVB__INTEG_EXT_KEY,
                     (unsigned long long)get64(p), a->n_buf);
            return KVB_ERR_PROTO;
        }
    for (uint64_t i = 0; i < np; i++)
        if (get64(p + 16 * i) >= pool) {
            snprintf(why, wl, "%s= names page %llu, our buffers hold %llu", KVB__INTEG_EXT_KEY,
                     (unsigned long long)get64(p + 16 * i), (unsigned long long)pool);
            return KVB_ERR_PROTO;
        }
    if (a->n_pages + np > KVB__INTEG_MAX_PAGES) {
        snprintf(why, wl, "%s=: more than %u pages in the room's digests", KVB__INTEG_EXT_KEY,
                 KVB__INTEG_MAX_PAGES);
        return KVB_ERR_PROTO;
    }
    for (p = v + HDR_BYTES; nb > 0; nb--, p += 16) {
        a->buf_sum[get64(p)] += get64(p + 8);
        a->buf_seen[get64(p)] = 1;
    }
    for (; np > 0; np--, p += 16)
        if (page_add(a, get64(p), get64(p + 8)) != KVB_OK)
            return KVB_ERR_NOMEM;
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

/* Items [from, to) in page-major order (item t: page t / nb, buffer
 * bufs[t % nb]); with several parts the sums go in with atomic adds: two
 * parts share the page at their boundary, and every buffer. */
void kvb__integ_run_part(const kvb__integ_t *a, kvb__integ_run_t *r, const uint64_t *kv_ptrs,
                         uint64_t item_len, size_t part, size_t n_parts)
{
    size_t from =
        r->n_items / n_parts * part + (part < r->n_items % n_parts ? part : r->n_items % n_parts);
    size_t to = from + r->n_items / n_parts + (part < r->n_items % n_parts);
    for (size_t t = from; t < to; t++) {
        size_t i = t / r->nb, b = r->bufs[t % r->nb];
        uint64_t at = kv_ptrs[b] + a->pages[2 * i] * item_len;
        uint64_t h = item_hash(at, at, item_len);
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
        if (r->ps[i] != a->pages[2 * i + 1])
            bad_page = (long long)a->pages[2 * i];
    for (size_t b = 0; b < a->n_buf && bad_buf < 0; b++)
        if (a->buf_seen[b] && r->bs[b] != a->buf_sum[b])
            bad_buf = (long long)b;
    if (bad_page < 0 && bad_buf < 0)
        return true;
    snprintf(why, wl,
             "KV integrity check failed: buffer %lld page %lld differs from what the prefill "
             "sent (XXH3 digest over %zu pages; -1: that view matched)",
             bad_buf, bad_page, a->n_pages);
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
