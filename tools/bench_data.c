/* `kvbridge bench` data: the byte pattern of (request, layer, kind, token,
 * head, byte) and the rank's KV pool with its fragmented free list.
 *
 * Every head row of every token gets its own 64-bit seed; its bytes are
 * words of a counter-based hash of that seed, so a row written to the wrong
 * page, token, head, layer or request differs in almost every byte. Fill and
 * verification regenerate a row into a scratch buffer (memcpy / memcmp),
 * which keeps them at memory speed. */
#include "bench_common.h"

#include <stdlib.h>
#include <string.h>

#include "eb_util.h"

static inline uint64_t mix64(uint64_t x)
{
    x ^= x >> 30;
    x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 27;
    x *= 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

static uint64_t layer_seed(uint64_t room, int layer, int kind)
{
    return mix64(mix64(room + 0x6b766272ull) ^ ((uint64_t)layer << 8 | (uint64_t)kind));
}

static inline uint64_t row_seed(uint64_t ls, uint64_t token, int head)
{
    return mix64(ls ^ (token << 16 | (uint64_t)head));
}

/* Pattern bytes of one seed into out (len bytes; out has room for len
 * rounded up to 8). */
static void gen(uint8_t *out, uint64_t seed, uint64_t len)
{
    uint64_t words = (len + 7) / 8;
    for (uint64_t i = 0; i < words; i++) {
        uint64_t w = mix64(seed + (i + 1) * 0x9E3779B97F4A7C15ull);
        memcpy(out + i * 8, &w, 8);
    }
}

bool bench_pool_init(bench_pool_t *p, const bench_rank_geom_t *g, uint64_t pages,
                     uint64_t aux_items, uint64_t seed)
{
    uint64_t kv_bytes = pages * g->item_len;
    memset(p, 0, sizeof(*p));
    p->g = *g;
    p->pages = pages;
    p->aux_items = aux_items;
    p->bytes = (size_t)(kv_bytes * (uint64_t)g->n_kv + aux_items * BENCH_AUX_ITEM);
    p->base = kvb_eb_alloc_shared(p->bytes); /* writers on this host map it (direct lane) */
    p->kv_ptrs = calloc((size_t)g->n_kv, sizeof(uint64_t));
    p->kv_lens = calloc((size_t)g->n_kv, sizeof(uint64_t));
    p->free_pages = calloc((size_t)pages, sizeof(int32_t));
    p->free_pos = calloc((size_t)pages, sizeof(int32_t));
    p->scratch = malloc((size_t)g->head_bytes + 8);
    if (p->base == NULL || !p->kv_ptrs || !p->kv_lens || !p->free_pages || !p->free_pos ||
        !p->scratch) {
        bench_pool_free(p);
        return false;
    }
    for (int b = 0; b < g->n_kv; b++) {
        p->kv_ptrs[b] = (uint64_t)(uintptr_t)(p->base + (uint64_t)b * kv_bytes);
        p->kv_lens[b] = kv_bytes;
    }
    p->aux = p->base + kv_bytes * (uint64_t)g->n_kv;
    for (uint64_t i = 0; i < pages; i++)
        p->free_pages[i] = p->free_pos[i] = (int32_t)i;
    p->nfree = pages;
    p->rng = seed * 0x9E3779B97F4A7C15ull + (uint64_t)g->tp * 131 + (uint64_t)g->pp;
    return true;
}

void bench_pool_free(bench_pool_t *p)
{
    bench_pool_cuda_free(p);
    kvb_eb_free_shared(p->base);
    free(p->kv_ptrs);
    free(p->kv_lens);
    free(p->free_pages);
    free(p->free_pos);
    free(p->scratch);
    memset(p, 0, sizeof(*p));
}

/* Remove free-list entry j (the last entry moves into its place). */
static int32_t take_at(bench_pool_t *p, uint64_t j)
{
    int32_t page = p->free_pages[j], last = p->free_pages[--p->nfree];
    p->free_pages[j] = last;
    p->free_pos[last] = (int32_t)j;
    p->free_pos[page] = -1;
    return page;
}

bool bench_pages_take(bench_pool_t *p, int32_t *pages, uint32_t n)
{
    if (n > p->nfree)
        return false;
    for (uint32_t i = 0; i < n; i++)
        pages[i] = take_at(p, mix64(++p->rng) % p->nfree);
    return true;
}

bool bench_pages_take_sweep(bench_pool_t *p, int dp, int32_t *pages, uint32_t n)
{
    uint64_t *cur = &p->sweep[dp >= 0 && dp < BENCH_MAX_DP ? dp : 0];
    if (n > p->nfree) /* also keeps the run from wrapping onto itself */
        return false;
    for (uint32_t i = 0; i < n; i++)
        if (p->free_pos[(*cur + i) % p->pages] < 0)
            return false;
    for (uint32_t i = 0; i < n; i++)
        pages[i] = take_at(p, (uint64_t)p->free_pos[(*cur + i) % p->pages]);
    *cur = (*cur + n) % p->pages;
    return true;
}

void bench_pages_give(bench_pool_t *p, const int32_t *pages, uint32_t n)
{
    for (uint32_t i = 0; i < n && p->nfree < p->pages; i++) {
        p->free_pos[pages[i]] = (int32_t)p->nfree;
        p->free_pages[p->nfree++] = pages[i];
    }
}

/* Head lh of token row s of pool page `page` of buffer b, in the side's
 * order: NHD (token, head) or HND (head, token). */
static uint8_t *cell(const bench_pool_t *p, int b, int32_t page, int s, int lh)
{
    const bench_rank_geom_t *g = &p->g;
    const uint64_t *ptrs = p->host_ptrs != NULL ? p->host_ptrs : p->kv_ptrs; /* mirror */
    uint8_t *item = (uint8_t *)(uintptr_t)ptrs[b] + (uint64_t)page * g->item_len;
    if (g->order == KVB_PLAN_ORDER_HND)
        return item + ((uint64_t)lh * (uint64_t)g->page + (uint64_t)s) * g->head_bytes;
    return item + (uint64_t)s * g->row_bytes + (uint64_t)lh * g->head_bytes;
}

static uint64_t count_diff(const uint8_t *a, const uint8_t *b, uint64_t len)
{
    uint64_t bad = 0;
    for (uint64_t i = 0; i < len; i++)
        bad += a[i] != b[i];
    return bad;
}

/* Fill (verify = false) or count wrong bytes of (verify = true) one page of
 * buffer b holding request page i (verify: its rows below verify_rows). */
static uint64_t page_pass(bench_pool_t *p, int page, uint64_t ls, int b, int32_t at, uint32_t i,
                          bool verify)
{
    const bench_rank_geom_t *g = &p->g;
    uint64_t bad = 0, first = (uint64_t)i * (uint64_t)page;
    int rows = page;
    if (verify && p->verify_rows > 0)
        rows = p->verify_rows <= first                   ? 0
               : p->verify_rows - first < (uint64_t)page ? (int)(p->verify_rows - first)
                                                         : page;
    for (int s = 0; s < rows; s++)
        for (int lh = 0; lh < g->local_heads; lh++) {
            uint8_t *c = cell(p, b, at, s, lh);
            gen(p->scratch,
                row_seed(ls, (uint64_t)i * (uint64_t)page + (uint64_t)s, g->first_head + lh),
                g->head_bytes);
            if (!verify)
                memcpy(c, p->scratch, g->head_bytes);
            else if (memcmp(c, p->scratch, g->head_bytes) != 0)
                bad += count_diff(c, p->scratch, g->head_bytes);
        }
    return bad;
}

static uint64_t pass(bench_pool_t *p, int page, uint64_t room, const int32_t *pages, uint32_t n,
                     int64_t aux, bool verify)
{
    const bench_rank_geom_t *g = &p->g;
    uint8_t want[BENCH_AUX_ITEM];
    uint64_t bad = 0;
    for (int b = 0; b < g->n_kv; b++) {
        uint64_t ls = layer_seed(room, g->first_layer + b % g->n_layers, b / g->n_layers);
        for (uint32_t i = 0; i < n; i++)
            bad += page_pass(p, page, ls, b, pages[i], i, verify);
    }
    if (aux < 0 || (uint64_t)aux >= p->aux_items)
        return bad;
    gen(want, layer_seed(room, 0xffff, 3), BENCH_AUX_ITEM);
    if (!verify)
        memcpy(p->aux + (uint64_t)aux * BENCH_AUX_ITEM, want, BENCH_AUX_ITEM);
    else
        bad += count_diff(p->aux + (uint64_t)aux * BENCH_AUX_ITEM, want, BENCH_AUX_ITEM);
    return bad;
}

void bench_fill(bench_pool_t *p, int page, uint64_t room, const int32_t *pages, uint32_t n,
                int64_t aux)
{
    pass(p, page, room, pages, n, aux, false);
    if (p->host_ptrs != NULL)
        bench_pool_cuda_sync(p, pages, n, true);
}

uint64_t bench_verify(bench_pool_t *p, int page, uint64_t room, const int32_t *pages, uint32_t n,
                      int64_t aux)
{
    if (p->host_ptrs != NULL && !bench_pool_cuda_sync(p, pages, n, false))
        return UINT64_MAX;
    return pass(p, page, room, pages, n, aux, true);
}
