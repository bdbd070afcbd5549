/* Planner across different page sizes and page orders (docs/planner.md).
 *
 * Every cell of (prefill page size P_p, decode page size P_d) in
 * {1, 3, 16, 64}², orders in {NHD, HND}², TP pairs 1→1, 2→1, 1→2, 4→2, MHA
 * or MLA, a decode prefix of 0, page-aligned (192) or mid-page (197) tokens,
 * one chunk or three, pages shuffled in the pools or consecutive: every
 * prefill rank's buffers hold a value that depends only on (buffer, token,
 * global head, byte); the blocks the planner gives (plain and strided, for
 * every source of every decode rank) are applied with memcpy into a decode
 * image whose every byte counts its writes. The decode must hold, in every
 * row the request owns past the prefix, exactly the reference value written
 * once, and no write anywhere else (the prefix rows and the rest of the last
 * decode page keep what they held). Block counts are checked against the
 * page segments where the layouts let runs coalesce. */
#include <kvbridge/plan.h>

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvb_test.h"

enum { LAYERS = 2, HEADS = 4, UNIT = 4, MLA_UNIT = 6, TOKENS = 331, EXTRA_PAGES = 3 };

typedef struct cell {
    uint32_t pp, pd;
    kvb_plan_order_t op, od;
    uint32_t ptp, dtp;
    int mla, chunked, shuffled;
    uint64_t prefix;
} cell_t;

static const cell_t *g_cell;

static void print_cell(const cell_t *c)
{
    fprintf(stderr,
            "cell P_p=%u P_d=%u order %s->%s tp %u->%u mla=%d prefix=%llu chunked=%d "
            "shuffled=%d\n",
            c->pp, c->pd, kvb_plan_order_name(c->op), kvb_plan_order_name(c->od), c->ptp, c->dtp,
            c->mla, (unsigned long long)c->prefix, c->chunked, c->shuffled);
}

#define FAIL(...)                                                                                  \
    do {                                                                                           \
        print_cell(g_cell);                                                                        \
        fprintf(stderr, __VA_ARGS__);                                                              \
        fprintf(stderr, "\n");                                                                     \
        exit(1);                                                                                   \
    } while (0)

static uint8_t pat(uint32_t buf, uint64_t tok, uint32_t head, uint32_t b)
{
    uint64_t z = ((uint64_t)buf << 48) ^ (tok << 16) ^ ((uint64_t)head << 8) ^ b;
    z = (z ^ (z >> 31)) * 0x7FB5D329728EA185ull;
    z = (z ^ (z >> 27)) * 0x81DADEF4BC2DD44Dull;
    return (uint8_t)(z ^ (z >> 33));
}

/* One rank's paged buffers: nbuf buffers of pool pages, 64 bytes apart (so
 * no block may run from one buffer into the next). */
typedef struct side {
    uint32_t P, heads, head0, nbuf, unit;
    kvb_plan_order_t order;
    uint64_t pool, row, item, stride;
    uint8_t *mem;
    uint8_t *cnt; /* decode: writes per byte */
    uint64_t addr[2 * LAYERS];
    int32_t *pages; /* request page → pool page */
    int64_t *inv;   /* pool page → request page or -1 */
    size_t npages;
} side_t;

static uint64_t off_of(const side_t *s, uint32_t k, uint64_t q, uint64_t r, uint32_t h, uint32_t b)
{
    uint64_t o = k * s->stride + q * s->item + b;
    if (s->order == KVB_PLAN_ORDER_HND)
        return o + (uint64_t)h * s->P * s->unit + r * s->unit;
    return o + r * s->row + (uint64_t)h * s->unit;
}

static uint64_t g_rng = 42;

static void side_init(side_t *s, const cell_t *c, int prefill, uint32_t tp, uint32_t rank)
{
    memset(s, 0, sizeof(*s));
    s->P = prefill ? c->pp : c->pd;
    s->order = prefill ? c->op : c->od;
    s->unit = c->mla ? MLA_UNIT : UNIT;
    s->heads = c->mla ? 1 : (HEADS >= tp ? HEADS / tp : 1);
    s->head0 = c->mla ? 0 : rank * HEADS / tp;
    s->nbuf = c->mla ? LAYERS : 2 * LAYERS;
    s->npages = (TOKENS + s->P - 1) / s->P;
    s->pool = s->npages + EXTRA_PAGES;
    s->row = (uint64_t)s->heads * s->unit;
    s->item = s->row * s->P;
    s->stride = s->pool * s->item + 64;
    s->mem = malloc(s->stride * s->nbuf);
    s->pages = malloc(s->npages * sizeof(int32_t));
    s->inv = malloc(s->pool * sizeof(int64_t));
    CHECK(s->mem != NULL && s->pages != NULL && s->inv != NULL);
    for (uint32_t k = 0; k < s->nbuf; k++)
        s->addr[k] = (uint64_t)(uintptr_t)(s->mem + k * s->stride);
    /* pool pages: a shuffle, or consecutive from page 1 */
    int32_t *perm = malloc(s->pool * sizeof(int32_t));
    for (uint64_t i = 0; i < s->pool; i++)
        perm[i] = (int32_t)i;
    for (uint64_t i = s->pool - 1; c->shuffled && i > 0; i--) {
        uint64_t j = kvb_test_splitmix(&g_rng) % (i + 1);
        int32_t t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    for (uint64_t i = 0; i < s->pool; i++)
        s->inv[i] = -1;
    for (size_t i = 0; i < s->npages; i++) {
        s->pages[i] = c->shuffled ? perm[i] : (int32_t)(i + 1);
        s->inv[s->pages[i]] = (int64_t)i;
    }
    free(perm);
    if (!prefill) {
        memset(s->mem, 0x11, s->stride * s->nbuf);
        s->cnt = calloc(s->stride * s->nbuf, 1);
        CHECK(s->cnt != NULL);
        return;
    }
    /* request rows get the pattern, every other byte a filler */
    memset(s->mem, 0xEE, s->stride * s->nbuf);
    for (uint32_t k = 0; k < s->nbuf; k++)
        for (size_t i = 0; i < s->npages; i++)
            for (uint64_t r = 0; r < s->P && i * s->P + r < TOKENS; r++)
                for (uint32_t h = 0; h < s->heads; h++)
                    for (uint32_t b = 0; b < s->unit; b++)
                        s->mem[off_of(s, k, (uint64_t)s->pages[i], r, h, b)] =
                            pat(k, i * s->P + r, s->head0 + h, b);
}

static void side_free(side_t *s)
{
    free(s->mem);
    free(s->cnt);
    free(s->pages);
    free(s->inv);
}

static void layout(kvb_plan_layout_t *l, const cell_t *c, const side_t *s, int prefill)
{
    memset(l, 0, sizeof(*l));
    l->field_mask = KVB_PLAN_LAYOUT_ORDER | KVB_PLAN_LAYOUT_POOL;
    l->attn = c->mla ? KVB_PLAN_MLA : KVB_PLAN_MHA;
    l->num_layers = LAYERS;
    l->tp_size = prefill ? c->ptp : c->dtp;
    l->page_size = s->P;
    l->kv_heads = c->mla ? 1 : HEADS;
    l->head_bytes = s->unit;
    l->kv_order = s->order;
    l->elem_bytes = 2;
    l->kv_pool_pages = s->pool;
}

/* Which buffer of side s holds address a (the 64-byte gap counts as its
 * buffer's). */
static uint64_t buffer_of(const side_t *s, uint64_t a)
{
    return (a - (uint64_t)(uintptr_t)s->mem) / s->stride;
}

/* Copy n bytes of a block into the decode image, counting writes; both ends
 * must lie inside one buffer of the two ranks. */
static void apply(const side_t *src, side_t *dst, uint64_t s, uint64_t d, uint64_t n)
{
    uint64_t sb = (uint64_t)(uintptr_t)src->mem, db = (uint64_t)(uintptr_t)dst->mem;
    if (s < sb || s + n > sb + src->stride * src->nbuf || d < db ||
        d + n > db + dst->stride * dst->nbuf)
        FAIL("block src=0x%llx dst=0x%llx len=%llu outside the ranks' buffers",
             (unsigned long long)s, (unsigned long long)d, (unsigned long long)n);
    if ((s - sb) / src->stride != (s - sb + n - 1) / src->stride ||
        (d - db) / dst->stride != (d - db + n - 1) / dst->stride)
        FAIL("block src=0x%llx dst=0x%llx len=%llu spans two buffers", (unsigned long long)s,
             (unsigned long long)d, (unsigned long long)n);
    memcpy(dst->mem + (d - db), src->mem + (s - sb), n);
    for (uint64_t i = 0; i < n; i++)
        dst->cnt[d - db + i]++;
}

/* The decode image against the reference, row by row; then reset it. */
static void check_image(side_t *d, const char *how)
{
    for (uint32_t k = 0; k < d->nbuf; k++)
        for (uint64_t q = 0; q < d->pool; q++)
            for (uint64_t r = 0; r < d->P; r++) {
                int64_t i = d->inv[q];
                uint64_t t = i >= 0 ? (uint64_t)i * d->P + r : 0;
                int owned = i >= 0 && t >= g_cell->prefix && t < TOKENS;
                for (uint32_t h = 0; h < d->heads; h++)
                    for (uint32_t b = 0; b < d->unit; b++) {
                        uint64_t o = off_of(d, k, q, r, h, b);
                        if (d->cnt[o] != owned)
                            FAIL("%s: buffer %u pool page %llu row %llu head %u byte %u written "
                                 "%u times, want %d",
                                 how, k, (unsigned long long)q, (unsigned long long)r, d->head0 + h,
                                 b, d->cnt[o], owned);
                        if (owned && d->mem[o] != pat(k, t, d->head0 + h, b))
                            FAIL("%s: buffer %u token %llu head %u byte %u: got %u want %u", how, k,
                                 (unsigned long long)t, d->head0 + h, b, d->mem[o],
                                 pat(k, t, d->head0 + h, b));
                    }
            }
    /* nothing outside the pages either (padding between buffers) */
    for (uint32_t k = 0; k < d->nbuf; k++)
        for (uint64_t o = k * d->stride + d->pool * d->item; o < (k + 1) * d->stride; o++)
            if (d->cnt[o] != 0)
                FAIL("%s: padding byte %llu written", how, (unsigned long long)o);
    memset(d->mem, 0x11, d->stride * d->nbuf);
    memset(d->cnt, 0, d->stride * d->nbuf);
}

/* The chunks a prefill sends: one, or three cut at prefill pages. */
static size_t make_chunks(const side_t *ps, const side_t *ds, kvb_plan_chunk_t *ch)
{
    size_t n = ps->npages, cuts[4] = {0, n, n, n}, nch = 1;
    if (g_cell->chunked) {
        cuts[1] = n / 3;
        cuts[2] = 2 * n / 3;
        nch = 3;
    }
    size_t k = 0;
    for (size_t i = 0; i < nch; i++) {
        if (cuts[i + 1] == cuts[i])
            continue;
        kvb_plan_chunk_t *c = &ch[k++];
        memset(c, 0, sizeof(*c));
        c->field_mask = KVB_PLAN_CHUNK_PREFIX | KVB_PLAN_CHUNK_DST_PAGES | KVB_PLAN_CHUNK_END;
        c->src_pages = ps->pages + cuts[i];
        c->num_pages = cuts[i + 1] - cuts[i];
        c->first_page = cuts[i];
        c->prefix_tokens = g_cell->prefix;
        c->end_tokens = TOKENS;
        if (!g_cell->chunked) { /* the whole decode page list */
            c->dst_pages = ds->pages;
            c->num_dst_pages = ds->npages;
            continue;
        }
        /* exactly the decode pages this chunk's rows reach */
        uint64_t t0 = cuts[i] * ps->P, t1 = cuts[i + 1] * ps->P;
        t0 = t0 > g_cell->prefix ? t0 : g_cell->prefix;
        t1 = t1 < TOKENS ? t1 : TOKENS;
        c->dst_pages = ds->pages;
        if (t0 < t1) {
            c->dst_first_page = t0 / ds->P;
            c->dst_pages = ds->pages + c->dst_first_page;
            c->num_dst_pages = (size_t)((t1 - 1) / ds->P - c->dst_first_page + 1);
        }
    }
    return k;
}

/* Page segments of the rows sent: where either side's page changes. */
static uint64_t segments(uint32_t pp, uint32_t pd)
{
    uint64_t n = 0;
    for (uint64_t t = g_cell->prefix; t < TOKENS; t++)
        n += t == g_cell->prefix || t % pp == 0 || t % pd == 0;
    return n;
}

static size_t g_cells, g_pairs, g_checked_counts;

/* Block counts where runs coalesce: never one block per row unless the
 * bytes of a row are not contiguous on one side (NHD head slices in plain
 * blocks, or NHD <-> HND), and the headline cases exactly. */
static void check_counts(const side_t *ps, const side_t *ds, const kvb_plan_fragment_t *f,
                         size_t plain, size_t strided)
{
    uint64_t segs = segments(ps->P, ds->P), rows = TOKENS - g_cell->prefix, nb = ps->nbuf;
    uint64_t nu = f->bytes / f->unit_bytes, nch = g_cell->chunked ? 3 : 1;
    bool whole = f->bytes == f->src_row_bytes && f->bytes == f->dst_row_bytes;
    bool nhd = ps->order == KVB_PLAN_ORDER_NHD && ds->order == KVB_PLAN_ORDER_NHD;
    bool hnd = ps->order == KVB_PLAN_ORDER_HND && ds->order == KVB_PLAN_ORDER_HND;
    uint64_t pmax, smax;
    if (nhd) {
        pmax = nb * (whole ? segs : rows);
        smax = nb * segs;
    } else if (hnd) {
        pmax = smax = nb * segs * nu;
    } else {
        pmax = nb * rows * nu;
        smax = nb * segs * nu;
    }
    if (plain > pmax || strided > smax)
        FAIL("blocks: plain %zu (bound %llu), strided %zu (bound %llu); segments %llu", plain,
             (unsigned long long)pmax, strided, (unsigned long long)smax, (unsigned long long)segs);
    g_checked_counts++;
    if (g_cell->shuffled) {
        /* NHD whole rows, P_d a multiple of P_p: whole prefill pages into
         * decode pages, at most one block per prefill page sent */
        uint64_t sent = (TOKENS - 1) / ps->P - g_cell->prefix / ps->P + 1;
        if (nhd && whole && ds->P % ps->P == 0 && plain > nb * sent)
            FAIL("P_d multiple of P_p: %zu plain blocks for %llu prefill pages × %llu buffers",
                 plain, (unsigned long long)sent, (unsigned long long)nb);
        return;
    }
    /* consecutive pages on both sides: NHD whole rows are one run per
     * buffer (and chunk), an NHD head slice one strided block; HND whole
     * pages of equal size one run too, plus one block per head for a page
     * the prefix or the request's end cuts */
    if (nhd && whole && plain > nb * nch)
        FAIL("consecutive pages, NHD whole rows: %zu plain blocks, want <= %llu", plain,
             (unsigned long long)(nb * nch));
    if (hnd && whole && ps->P == ds->P && plain > nb * nch * (1 + 2 * nu))
        FAIL("consecutive pages, HND whole pages: %zu plain blocks, want <= %llu", plain,
             (unsigned long long)(nb * nch * (1 + 2 * nu)));
    if (nhd && strided > nb * nch)
        FAIL("consecutive pages, NHD: %zu strided blocks, want <= %llu", strided,
             (unsigned long long)(nb * nch));
}

static void run_pair(kvb_plan_h plan, side_t *ps, side_t *ds, uint32_t p, uint32_t d,
                     const kvb_plan_chunk_t *ch, size_t nch, size_t *plain_p, size_t *strided_p,
                     uint64_t *bytes_p)
{
    kvb_plan_buffers_t sb = {.kv = ps->addr}, db = {.kv = ds->addr};
    kvb_plan_blocks_t out;
    kvb_plan_strided_t so;
    kvb_plan_blocks_init(&out);
    kvb_plan_strided_init(&so);
    for (size_t i = 0; i < nch; i++)
        if (kvb_plan_blocks(plan, p, d, &sb, &db, &ch[i], &out) != KVB_OK ||
            kvb_plan_strided_blocks(plan, p, d, &sb, &db, &ch[i], &so) != KVB_OK)
            FAIL("chunk %zu: %s", i, kvb_plan_last_error());
    if (out.bytes != so.bytes)
        FAIL("plain bytes %llu != strided bytes %llu", (unsigned long long)out.bytes,
             (unsigned long long)so.bytes);
    uint64_t sum = 0;
    for (size_t i = 0; i < out.count; i++) {
        apply(ps, ds, out.blocks[i].src, out.blocks[i].dst, out.blocks[i].len);
        sum += out.blocks[i].len;
    }
    if (sum != out.bytes)
        FAIL("sum of block lengths %llu != bytes %llu", (unsigned long long)sum,
             (unsigned long long)out.bytes);
    *plain_p = out.count;
    *strided_p = so.count;
    *bytes_p = out.bytes;
    kvb_plan_blocks_free(&out);
    kvb_plan_strided_free(&so); /* applied into a second image by the caller */
}

static void run_cell(const cell_t *c)
{
    g_cell = c;
    side_t ps[4], ds[2];
    for (uint32_t p = 0; p < c->ptp; p++) {
        uint64_t saved = g_rng; /* every prefill rank has the same pages */
        side_init(&ps[p], c, 1, c->ptp, p);
        if (p + 1 < c->ptp)
            g_rng = saved;
    }
    for (uint32_t d = 0; d < c->dtp; d++) {
        uint64_t saved = g_rng;
        side_init(&ds[d], c, 0, c->dtp, d);
        if (d + 1 < c->dtp)
            g_rng = saved;
    }
    kvb_plan_layout_t pl, dl;
    layout(&pl, c, &ps[0], 1);
    layout(&dl, c, &ds[0], 0);
    kvb_plan_h plan;
    if (kvb_plan_create(&pl, &dl, &plan) != KVB_OK)
        FAIL("plan: %s", kvb_plan_last_error());
    kvb_plan_chunk_t ch[3];
    size_t nch = make_chunks(&ps[0], &ds[0], ch);
    for (uint32_t d = 0; d < c->dtp; d++) {
        kvb_plan_route_t rt;
        CHECK(kvb_plan_route(plan, d, &rt) == KVB_OK);
        uint64_t total = 0;
        for (uint32_t s = 0; s < rt.num_sources; s++) {
            uint32_t p = rt.sources[s].prefill_rank;
            kvb_plan_fragment_t f[4];
            size_t nf;
            CHECK(kvb_plan_fragments(plan, p, d, f, 4, &nf) == KVB_OK);
            if (rt.sources[s].dummy) {
                if (nf != 0)
                    FAIL("dummy source %u of decode %u has %zu fragments", p, d, nf);
                continue;
            }
            size_t plain, strided;
            uint64_t bytes;
            run_pair(plan, &ps[p], &ds[d], p, d, ch, nch, &plain, &strided, &bytes);
            total += bytes;
            g_pairs++;
            CHECK(nf >= 1);
            if (f[0].dst_rows_per_item != c->pd || f[0].rows_per_item != c->pp ||
                f[0].src_order != c->op || f[0].dst_order != c->od)
                FAIL("fragment page sizes %u/%u orders %d/%d", f[0].rows_per_item,
                     f[0].dst_rows_per_item, (int)f[0].src_order, (int)f[0].dst_order);
            check_counts(&ps[p], &ds[d], &f[0], plain, strided);
        }
        uint64_t want = (TOKENS - c->prefix) * ds[d].row * ds[d].nbuf;
        if (total != want)
            FAIL("decode %u: %llu bytes planned, want %llu", d, (unsigned long long)total,
                 (unsigned long long)want);
        check_image(&ds[d], "plain blocks");
        /* the strided form of the same chunks, row by row */
        for (uint32_t s = 0; s < rt.num_sources; s++) {
            if (rt.sources[s].dummy)
                continue;
            uint32_t p = rt.sources[s].prefill_rank;
            kvb_plan_buffers_t sb = {.kv = ps[p].addr}, db = {.kv = ds[d].addr};
            kvb_plan_strided_t so;
            kvb_plan_strided_init(&so);
            for (size_t i = 0; i < nch; i++)
                CHECK(kvb_plan_strided_blocks(plan, p, d, &sb, &db, &ch[i], &so) == KVB_OK);
            for (size_t i = 0; i < so.count; i++) {
                const kvb_strided_block_t *b = &so.blocks[i];
                if (b->count == 0 || (b->count > 1 && b->dst_stride < b->len))
                    FAIL("strided block %zu: count %llu dst_stride %llu len %llu", i,
                         (unsigned long long)b->count, (unsigned long long)b->dst_stride,
                         (unsigned long long)b->len);
                /* the engine checks a strided block's first and last rows
                 * against one registration (a buffer): its span stays in one */
                uint64_t ls = (b->count - 1) * b->src_stride, ld = (b->count - 1) * b->dst_stride;
                if (buffer_of(&ps[p], b->src) != buffer_of(&ps[p], b->src + ls + b->len - 1) ||
                    buffer_of(&ds[d], b->dst) != buffer_of(&ds[d], b->dst + ld + b->len - 1))
                    FAIL("strided block %zu spans two buffers (count %llu)", i,
                         (unsigned long long)b->count);
                for (uint64_t r = 0; r < b->count; r++)
                    apply(&ps[p], &ds[d], b->src + r * b->src_stride, b->dst + r * b->dst_stride,
                          b->len);
            }
            kvb_plan_strided_free(&so);
        }
        check_image(&ds[d], "strided blocks");
    }
    kvb_plan_destroy(plan);
    for (uint32_t p = 0; p < c->ptp; p++)
        side_free(&ps[p]);
    for (uint32_t d = 0; d < c->dtp; d++)
        side_free(&ds[d]);
    g_cells++;
}

/* Equal page sizes and order: the new chunk fields give today's blocks,
 * byte for byte (whole pages, the last page whole). */
static void test_same_layout_unchanged(void)
{
    static const cell_t c0 = {16, 16, KVB_PLAN_ORDER_NHD, KVB_PLAN_ORDER_NHD, 1, 2, 0, 0, 1, 32};
    g_cell = &c0;
    side_t ps, ds;
    side_init(&ps, &c0, 1, 1, 0);
    side_init(&ds, &c0, 0, 2, 1);
    kvb_plan_layout_t pl, dl;
    layout(&pl, &c0, &ps, 1);
    layout(&dl, &c0, &ds, 0);
    pl.field_mask &= ~(uint64_t)KVB_PLAN_LAYOUT_ORDER; /* the default: NHD */
    kvb_plan_h plan;
    CHECK(kvb_plan_create(&pl, &dl, &plan) == KVB_OK);
    kvb_plan_buffers_t sb = {.kv = ps.addr}, db = {.kv = ds.addr};
    kvb_plan_chunk_t a = {0}, b = {0};
    a.field_mask = KVB_PLAN_CHUNK_PREFIX;
    a.src_pages = ps.pages;
    a.dst_pages = ds.pages;
    a.num_pages = ps.npages;
    a.prefix_tokens = 32;
    b = a;
    b.field_mask |= KVB_PLAN_CHUNK_DST_PAGES | KVB_PLAN_CHUNK_END;
    b.num_dst_pages = ds.npages;
    b.end_tokens = ps.npages * 16;
    kvb_plan_blocks_t oa, ob;
    kvb_plan_strided_t sa, sb2;
    kvb_plan_blocks_init(&oa);
    kvb_plan_blocks_init(&ob);
    kvb_plan_strided_init(&sa);
    kvb_plan_strided_init(&sb2);
    CHECK(kvb_plan_blocks(plan, 0, 1, &sb, &db, &a, &oa) == KVB_OK);
    CHECK(kvb_plan_blocks(plan, 0, 1, &sb, &db, &b, &ob) == KVB_OK);
    CHECK(kvb_plan_strided_blocks(plan, 0, 1, &sb, &db, &a, &sa) == KVB_OK);
    CHECK(kvb_plan_strided_blocks(plan, 0, 1, &sb, &db, &b, &sb2) == KVB_OK);
    CHECK_EQ(oa.count, ob.count);
    CHECK(memcmp(oa.blocks, ob.blocks, oa.count * sizeof(kvb_block_t)) == 0);
    CHECK_EQ(sa.count, sb2.count);
    CHECK(memcmp(sa.blocks, sb2.blocks, sa.count * sizeof(kvb_strided_block_t)) == 0);
    /* a head slice of whole pages: one block per row, as before */
    CHECK_EQ(oa.count, (ps.npages - 2) * 16 * ps.nbuf);
    kvb_plan_blocks_free(&oa);
    kvb_plan_blocks_free(&ob);
    kvb_plan_strided_free(&sa);
    kvb_plan_strided_free(&sb2);

    /* page sizes differ: dst_pages must reach every decode page the rows do */
    kvb_plan_destroy(plan);
    dl.page_size = 64;
    CHECK(kvb_plan_create(&pl, &dl, &plan) == KVB_OK);
    kvb_plan_chunk_t e = {0};
    e.field_mask = KVB_PLAN_CHUNK_DST_PAGES;
    e.src_pages = ps.pages;
    e.num_pages = 8; /* rows [0, 128): decode pages 0 and 1 */
    e.dst_pages = ds.pages;
    e.num_dst_pages = 1;
    kvb_plan_blocks_init(&oa);
    CHECK_EQ(kvb_plan_blocks(plan, 0, 1, &sb, &db, &e, &oa), KVB_ERR_INVALID);
    CHECK_STR_CONTAINS(kvb_plan_last_error(), "rows [0, 128) reach decode pages 0..1");
    CHECK_EQ(oa.count, 0);
    e.num_dst_pages = 2;
    CHECK(kvb_plan_blocks(plan, 0, 1, &sb, &db, &e, &oa) == KVB_OK);
    CHECK_EQ(oa.bytes, 128 * ds.row * ds.nbuf);
    kvb_plan_blocks_free(&oa);
    kvb_plan_destroy(plan);
    side_free(&ps);
    side_free(&ds);
}

int main(void)
{
    static const uint32_t sizes[] = {1, 3, 16, 64};
    static const uint32_t tps[][2] = {{1, 1}, {2, 1}, {1, 2}, {4, 2}};
    static const uint64_t prefixes[] = {0, 192, 197};
    test_same_layout_unchanged();
    for (int a = 0; a < 4; a++)
        for (int b = 0; b < 4; b++)
            for (int o = 0; o < 4; o++)
                for (int t = 0; t < 4; t++)
                    for (int mla = 0; mla < 2; mla++)
                        for (int x = 0; x < 3; x++)
                            for (int chunked = 0; chunked < 2; chunked++)
                                for (int shuffled = 0; shuffled < 2; shuffled++) {
                                    cell_t c = {sizes[a],
                                                sizes[b],
                                                (kvb_plan_order_t)(o >> 1),
                                                (kvb_plan_order_t)(o & 1),
                                                tps[t][0],
                                                tps[t][1],
                                                mla,
                                                chunked,
                                                shuffled,
                                                prefixes[x]};
                                    run_cell(&c);
                                }
    printf("hetero: %zu cells, %zu rank pairs, %zu block counts checked\n", g_cells, g_pairs,
           g_checked_counts);
    TEST_PASS("planner maps token rows across page sizes and orders");
    return 0;
}
