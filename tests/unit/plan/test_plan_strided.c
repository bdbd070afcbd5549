/* kvb_plan_strided_blocks against kvb_plan_blocks (itself checked against a
 * per-byte reference in test_plan_ref.c).
 *
 * For every layout pair (MHA and MLA, TP 1→2, 2→1, 2→8, 8→2, 4→4 and seeded
 * random ones, with PP, draft, state, aux, prefixes, chunks, page lists with
 * and without consecutive runs), every prefill rank's buffers are real
 * memory filled with a byte pattern; each planner's output is applied with
 * memcpy to its own copy of every decode rank's patterned memory, and the two
 * copies must be identical byte for byte, with equal `bytes` totals. The
 * strided output must obey the engine's strided-block rules and stay within
 * O(buffers × page runs) descriptors: exactly one per buffer and run for a
 * fragment that is part of a row. Errors: the same status and reason as
 * kvb_plan_blocks, with the output unchanged. Fixed seeds; a failing case
 * prints its parameters. */
#include <kvbridge/plan.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvb_test.h"

static uint64_t g_rng;
static uint32_t rin(uint32_t lo, uint32_t hi) /* [lo, hi] */
{
    return kvb_test_range(&g_rng, lo, hi);
}

/* Page lists (the source is always consecutive): destination consecutive
 * too (one run), shuffled (runs by chance), segments of 1..6 consecutive pages
 * at random places (items may repeat: both planners write in the same
 * order), reversed by twos (no run longer than one page). */
enum { PAGES_RUN = 0, PAGES_SHUFFLED = 1, PAGES_SEGMENTS = 2, PAGES_REVERSED = 3 };

typedef struct scase {
    const char *name;
    uint64_t seed;
    int mla;
    uint32_t L, H, hb, ptp, dtp, pp, page, npages, prefix_pages, nchunks, pages_mode, gap;
    uint32_t draftL, draftH, draft_hb;
    uint32_t nstate, C, cb, srep, nsi;
    uint32_t naux, auxlen;
    int64_t want_count; /* named cases: strided descriptors per real (p, d) call, -1 = any */
    uint64_t want_rows; /* and rows (count) in each, 0 = any */
} scase_t;

static const scase_t *g_case;

static void fail_case(const char *msg)
{
    const scase_t *t = g_case;
    fprintf(stderr,
            "case %s seed=%llu mla=%d layers=%u heads=%u head_bytes=%u tp %u->%u pp=%u page=%u "
            "pages=%u prefix=%u chunks=%u mode=%u gap=%u draft=%u/%u/%u state=%u [C=%u cb=%u "
            "rep=%u n=%u] aux=%u/%u\n%s\n",
            t->name, (unsigned long long)t->seed, t->mla, t->L, t->H, t->hb, t->ptp, t->dtp, t->pp,
            t->page, t->npages, t->prefix_pages, t->nchunks, t->pages_mode, t->gap, t->draftL,
            t->draftH, t->draft_hb, t->nstate, t->C, t->cb, t->srep, t->nsi, t->naux, t->auxlen,
            msg);
    exit(1);
}

#define FAILF(...)                                                                                 \
    do {                                                                                           \
        char m_[512];                                                                              \
        snprintf(m_, sizeof(m_), __VA_ARGS__);                                                     \
        fail_case(m_);                                                                             \
    } while (0)

/* Units per rank, SGLang's rule: max(1, H / tp). */
static uint64_t per_rank(uint32_t H, uint32_t tp)
{
    return H >= tp ? H / tp : 1;
}

/* Memory of one rank: one arena, buffers carved in order with `gap` bytes
 * between them. */
typedef struct rmem {
    uint8_t *arena;
    uint64_t size;
    uint64_t kv[128], draft[4], state[2], aux[2];
} rmem_t;

static uint64_t carve(rmem_t *m, uint64_t *used, uint64_t n, uint32_t gap)
{
    uint64_t a = (uint64_t)(uintptr_t)m->arena + *used;
    *used += n + gap;
    return a;
}

/* Two passes: sizing (arena NULL), then carving. */
static uint64_t layout_mem(rmem_t *m, const scase_t *t, uint32_t tp, uint32_t nkv, int extra,
                           uint64_t pool, uint64_t state_pool)
{
    uint64_t used = 0, row = t->mla ? t->hb : per_rank(t->H, tp) * t->hb;
    for (uint32_t i = 0; i < nkv; i++)
        m->kv[i] = carve(m, &used, pool * t->page * row, t->gap);
    if (!extra)
        return used;
    uint64_t drow = t->mla ? t->draft_hb : per_rank(t->draftH, tp) * t->draft_hb;
    for (uint32_t i = 0; i < t->draftL * (t->mla ? 1u : 2u); i++)
        m->draft[i] = carve(m, &used, pool * t->page * drow, t->gap);
    uint64_t srow = (t->srep ? t->C : per_rank(t->C, tp)) * t->cb;
    for (uint32_t i = 0; i < t->nstate; i++)
        m->state[i] = carve(m, &used, state_pool * srow, t->gap);
    for (uint32_t i = 0; i < t->naux; i++)
        m->aux[i] = carve(m, &used, 4ull * t->auxlen, t->gap);
    return used;
}

static void mem_alloc(rmem_t *m, const scase_t *t, uint32_t tp, uint32_t nkv, int extra,
                      uint64_t pool, uint64_t state_pool, uint64_t salt)
{
    memset(m, 0, sizeof(*m));
    m->size = layout_mem(m, t, tp, nkv, extra, pool, state_pool);
    m->arena = malloc(m->size + 1);
    CHECK(m->arena != NULL);
    uint64_t x = salt * 0x9E3779B97F4A7C15ull + 1;
    for (uint64_t i = 0; i < m->size; i++)
        m->arena[i] = (uint8_t)(kvb_test_xorshift(&x) >> 24);
    layout_mem(m, t, tp, nkv, extra, pool, state_pool);
}

static void fill_pages(int32_t *sp, int32_t *dp, const scase_t *t, uint64_t spool, uint64_t dpool)
{
    uint32_t n = t->npages, so = (uint32_t)(spool - n), dof = (uint32_t)(dpool - n);
    for (uint32_t i = 0; i < n; i++) {
        sp[i] = (int32_t)(i + so / 2);
        dp[i] = (int32_t)(t->pages_mode == PAGES_REVERSED ? 2 * (n - 1 - i) : i + dof);
    }
    if (t->pages_mode == PAGES_SHUFFLED) {
        for (uint32_t i = n; i > 1; i--) {
            uint32_t j = rin(0, i - 1);
            int32_t x = dp[i - 1];
            dp[i - 1] = dp[j];
            dp[j] = x;
        }
    } else if (t->pages_mode == PAGES_SEGMENTS) {
        /* rotate the list by segments: each segment keeps its run */
        for (uint32_t i = 0; i < n;) {
            uint32_t len = rin(1, 6);
            len = len > n - i ? n - i : len;
            int32_t base = (int32_t)rin(0, (uint32_t)(dpool - len));
            for (uint32_t k = 0; k < len; k++)
                dp[i + k] = base + (int32_t)k; /* may repeat items: fine for a copy */
            i += len;
        }
    }
}

/* Runs of the list consecutive on both sides. */
static uint64_t count_runs(const int32_t *sp, const int32_t *dp, size_t n)
{
    uint64_t r = n > 0;
    for (size_t i = 1; i < n; i++)
        r += sp[i] != sp[i - 1] + 1 || dp[i] != dp[i - 1] + 1;
    return r;
}

/* Descriptor bounds of one call from the plan's fragments: a fragment that
 * is part of a row gives exactly nbuf × runs strided blocks; whole rows at
 * most that many (they may merge). */
typedef struct call_ctx {
    kvb_plan_h plan;
    uint32_t p, d, stage_layers;
    int last_stage;
    const kvb_plan_chunk_t *ch;
    uint64_t skip;
} call_ctx_t;

static void bounds(const call_ctx_t *c, const scase_t *t, uint64_t *lo_p, uint64_t *hi_p)
{
    kvb_plan_fragment_t fr[16];
    size_t nf = 0;
    CHECK(kvb_plan_fragments(c->plan, c->p, c->d, fr, 16, &nf) == KVB_OK);
    const kvb_plan_chunk_t *ch = c->ch;
    uint64_t pruns =
        count_runs(ch->src_pages + c->skip, ch->dst_pages + c->skip, ch->num_pages - c->skip);
    uint64_t lo = 0, hi = 0;
    for (size_t i = 0; i < nf; i++) {
        uint64_t n = c->stage_layers * pruns;
        if (fr[i].buffer == KVB_PLAN_BUF_DRAFT_K || fr[i].buffer == KVB_PLAN_BUF_DRAFT_V)
            n = c->last_stage ? t->draftL * pruns : 0;
        else if (fr[i].buffer == KVB_PLAN_BUF_STATE)
            n = c->last_stage && (ch->field_mask & KVB_PLAN_CHUNK_STATE)
                    ? count_runs(ch->src_state, ch->dst_state, ch->num_state_indices)
                    : 0;
        else if (fr[i].buffer == KVB_PLAN_BUF_AUX)
            n = c->last_stage && (ch->field_mask & KVB_PLAN_CHUNK_AUX);
        hi += n;
        if (fr[i].bytes != fr[i].src_row_bytes || fr[i].bytes != fr[i].dst_row_bytes)
            lo += n;
    }
    *lo_p = lo;
    *hi_p = hi;
}

static uint64_t g_plain_blocks, g_strided_blocks, g_bytes, g_named;

static void apply_plain(const kvb_plan_blocks_t *o, const rmem_t *s, uint8_t *dst, const rmem_t *d)
{
    uint64_t sa = (uint64_t)(uintptr_t)s->arena, da = (uint64_t)(uintptr_t)d->arena, sum = 0;
    for (size_t k = 0; k < o->count; k++) {
        const kvb_block_t *b = &o->blocks[k];
        if (b->src < sa || b->src - sa + b->len > s->size || b->dst < da ||
            b->dst - da + b->len > d->size)
            FAILF("plain block %zu outside the rank memory", k);
        memcpy(dst + (b->dst - da), s->arena + (b->src - sa), b->len);
        sum += b->len;
    }
    if (sum != o->bytes)
        FAILF("plain: bytes=%llu, blocks sum to %llu", (unsigned long long)o->bytes,
              (unsigned long long)sum);
}

/* Every row of every strided block, checked against the engine's rules. */
static void apply_strided(const kvb_plan_strided_t *o, const rmem_t *s, uint8_t *dst,
                          const rmem_t *d)
{
    uint64_t sa = (uint64_t)(uintptr_t)s->arena, da = (uint64_t)(uintptr_t)d->arena, sum = 0;
    for (size_t k = 0; k < o->count; k++) {
        const kvb_strided_block_t *b = &o->blocks[k];
        if (b->count == 0 || b->len == 0 || (b->count > 1 && b->dst_stride < b->len))
            FAILF("strided block %zu: len=%llu count=%llu dst_stride=%llu breaks the rules", k,
                  (unsigned long long)b->len, (unsigned long long)b->count,
                  (unsigned long long)b->dst_stride);
        uint64_t ls = b->src + (b->count - 1) * b->src_stride,
                 ld = b->dst + (b->count - 1) * b->dst_stride;
        if (b->src < sa || ls - sa + b->len > s->size || b->dst < da || ld - da + b->len > d->size)
            FAILF("strided block %zu outside the rank memory", k);
        for (uint64_t r = 0; r < b->count; r++)
            memcpy(dst + (b->dst + r * b->dst_stride - da),
                   s->arena + (b->src + r * b->src_stride - sa), b->len);
        sum += b->len * b->count;
    }
    if (sum != o->bytes)
        FAILF("strided: bytes=%llu, blocks sum to %llu", (unsigned long long)o->bytes,
              (unsigned long long)sum);
}

/* Both planners for one (stage, p, d, chunk); outputs applied to a and b. */
static void plan_pair(const call_ctx_t *c, const scase_t *t, const rmem_t *s, const rmem_t *d,
                      uint8_t *a, uint8_t *b, kvb_plan_blocks_t *po, kvb_plan_strided_t *so)
{
    kvb_plan_buffers_t sb = {s->kv, s->draft, s->state, s->aux};
    kvb_plan_buffers_t db = {d->kv, d->draft, d->state, d->aux};
    po->count = so->count = 0;
    po->bytes = so->bytes = 0;
    if (kvb_plan_blocks(c->plan, c->p, c->d, &sb, &db, c->ch, po) != KVB_OK)
        FAILF("kvb_plan_blocks(p %u, d %u): %s", c->p, c->d, kvb_plan_last_error());
    if (kvb_plan_strided_blocks(c->plan, c->p, c->d, &sb, &db, c->ch, so) != KVB_OK)
        FAILF("kvb_plan_strided_blocks(p %u, d %u): %s", c->p, c->d, kvb_plan_last_error());
    if (po->bytes != so->bytes)
        FAILF("p %u d %u: plain bytes=%llu strided bytes=%llu", c->p, c->d,
              (unsigned long long)po->bytes, (unsigned long long)so->bytes);
    apply_plain(po, s, a, d);
    apply_strided(so, s, b, d);
    uint64_t lo, hi;
    bounds(c, t, &lo, &hi);
    if (so->count < lo || so->count > hi || so->count > po->count)
        FAILF("p %u d %u: %zu strided blocks, want %llu..%llu and <= %zu plain", c->p, c->d,
              so->count, (unsigned long long)lo, (unsigned long long)hi, po->count);
    if (t->want_count >= 0 && po->count > 0 && so->count != (size_t)t->want_count)
        FAILF("p %u d %u: %zu strided blocks, want %lld", c->p, c->d, so->count,
              (long long)t->want_count);
    for (size_t k = 0; t->want_rows && k < so->count; k++) {
        const kvb_strided_block_t *x = &so->blocks[k];
        if (x->count != t->want_rows)
            FAILF("p %u d %u: strided block %zu has %llu rows, want %llu", c->p, c->d, k,
                  (unsigned long long)x->count, (unsigned long long)t->want_rows);
        if (x->count == 1 && (x->src_stride != x->len || x->dst_stride != x->len))
            FAILF("p %u d %u: plain strided block %zu: strides %llu/%llu, len %llu", c->p, c->d, k,
                  (unsigned long long)x->src_stride, (unsigned long long)x->dst_stride,
                  (unsigned long long)x->len);
    }
    g_plain_blocks += po->count;
    g_strided_blocks += so->count;
    g_bytes += po->bytes;
}

static void make_layout(const scase_t *t, uint32_t tp, kvb_plan_layout_t *l, kvb_plan_geom_t *sg,
                        const uint64_t *auxl, uint64_t pool, uint64_t state_pool)
{
    memset(l, 0, sizeof(*l));
    l->field_mask = KVB_PLAN_LAYOUT_PP | KVB_PLAN_LAYOUT_POOL;
    l->attn = t->mla ? KVB_PLAN_MLA : KVB_PLAN_MHA;
    l->num_layers = t->L;
    l->tp_size = tp;
    l->page_size = t->page;
    l->kv_heads = t->H;
    l->head_bytes = t->hb;
    l->pp_size = 1;
    l->kv_pool_pages = pool;
    l->state_pool_items = state_pool;
    l->aux_pool_items = 4;
    if (t->draftL) {
        l->field_mask |= KVB_PLAN_LAYOUT_DRAFT;
        l->draft_layers = t->draftL;
        l->draft_kv_heads = t->draftH;
        l->draft_head_bytes = t->draft_hb;
    }
    if (t->nstate) {
        for (uint32_t i = 0; i < t->nstate; i++) { /* the state buffers share a geometry */
            memset(&sg[i], 0, sizeof(sg[i]));
            sg[i].unit_len = t->cb;
            sg[i].axis = t->srep ? KVB_PLAN_AXIS_REPLICATED : KVB_PLAN_AXIS_STATE_CHANNEL;
            sg[i].item_len = (t->srep ? t->C : per_rank(t->C, tp)) * t->cb;
            sg[i].global_units = t->srep ? 0 : t->C;
        }
        l->field_mask |= KVB_PLAN_LAYOUT_STATE;
        l->num_state = t->nstate;
        l->state = sg;
    }
    if (t->naux) {
        l->field_mask |= KVB_PLAN_LAYOUT_AUX;
        l->num_aux = t->naux;
        l->aux_item_lens = auxl;
    }
}

/* SGLang's default PP partition (remainder on the stages before the last). */
static void stages(const scase_t *t, uint32_t *start, uint32_t *len)
{
    uint32_t base = t->L / t->pp, rem = t->L % t->pp, acc = 0;
    for (uint32_t s = 0; s < t->pp; s++) {
        len[s] = base + (s < t->pp - 1 && s >= t->pp - 1 - rem);
        start[s] = acc;
        acc += len[s];
    }
}

typedef struct world {
    kvb_plan_h plan[4];
    rmem_t *src;    /* [stage × ptp] */
    rmem_t *dst;    /* [dtp] */
    uint8_t **copy; /* [dtp]: the strided planner's image */
    uint32_t start[4], len[4];
} world_t;

static void world_init(world_t *w, const scase_t *t, uint64_t spool, uint64_t dpool,
                       uint64_t state_pool)
{
    kvb_plan_layout_t pl, dl;
    kvb_plan_geom_t sg[2][2]; /* [side][state buffer] */
    uint64_t auxl[2] = {t->auxlen, t->auxlen};
    make_layout(t, t->ptp, &pl, sg[0], auxl, spool, state_pool);
    make_layout(t, t->dtp, &dl, sg[1], auxl, dpool, state_pool);
    pl.pp_size = t->pp;
    stages(t, w->start, w->len);
    w->src = calloc((size_t)t->pp * t->ptp, sizeof(rmem_t));
    w->dst = calloc(t->dtp, sizeof(rmem_t));
    w->copy = calloc(t->dtp, sizeof(uint8_t *));
    CHECK(w->src && w->dst && w->copy);
    for (uint32_t s = 0; s < t->pp; s++) {
        pl.pp_rank = s;
        if (kvb_plan_create(&pl, &dl, &w->plan[s]) != KVB_OK)
            FAILF("kvb_plan_create(stage %u): %s", s, kvb_plan_last_error());
        uint32_t nkv = (t->mla ? 1 : 2) * w->len[s];
        for (uint32_t p = 0; p < t->ptp; p++)
            mem_alloc(&w->src[s * t->ptp + p], t, t->ptp, nkv, s + 1 == t->pp, spool, state_pool,
                      1000 + s * 64 + p);
    }
    for (uint32_t d = 0; d < t->dtp; d++) {
        mem_alloc(&w->dst[d], t, t->dtp, (t->mla ? 1 : 2) * t->L, 1, dpool, state_pool, 7 + d);
        w->copy[d] = malloc(w->dst[d].size + 1);
        CHECK(w->copy[d] != NULL);
        memcpy(w->copy[d], w->dst[d].arena, w->dst[d].size);
    }
}

static void world_free(world_t *w, const scase_t *t)
{
    for (uint32_t s = 0; s < t->pp; s++) {
        kvb_plan_destroy(w->plan[s]);
        for (uint32_t p = 0; p < t->ptp; p++)
            free(w->src[s * t->ptp + p].arena);
    }
    for (uint32_t d = 0; d < t->dtp; d++) {
        free(w->dst[d].arena);
        free(w->copy[d]);
    }
    free(w->src);
    free(w->dst);
    free(w->copy);
}

/* Every stage and rank pair for one chunk. */
static void run_chunk(world_t *w, const scase_t *t, const kvb_plan_chunk_t *ch,
                      kvb_plan_blocks_t *po, kvb_plan_strided_t *so)
{
    uint64_t prefix = (uint64_t)t->prefix_pages, skip = 0;
    if (prefix > ch->first_page)
        skip = prefix - ch->first_page > ch->num_pages ? ch->num_pages : prefix - ch->first_page;
    for (uint32_t s = 0; s < t->pp; s++)
        for (uint32_t p = 0; p < t->ptp; p++)
            for (uint32_t d = 0; d < t->dtp; d++) {
                call_ctx_t c = {w->plan[s], p, d, w->len[s], s + 1 == t->pp, ch, skip};
                /* plain → the decode's own memory, strided → its copy */
                plan_pair(&c, t, &w->src[s * t->ptp + p], &w->dst[d], w->dst[d].arena, w->copy[d],
                          po, so);
            }
}

static void run_case(const scase_t *t)
{
    g_case = t;
    g_rng = t->seed * 0x2545F4914F6CDD1Dull + 11;
    uint64_t spool = t->npages + rin(0, 3), dpool = 2 * t->npages + 2, state_pool = 8;
    if (t->gap == 0 && t->pages_mode == PAGES_RUN)
        spool = dpool = t->npages; /* whole buffers: adjacent buffers merge too */
    world_t w;
    world_init(&w, t, spool, dpool, state_pool);
    int32_t *sp = malloc(t->npages * sizeof(int32_t)), *dp = malloc(t->npages * sizeof(int32_t));
    int32_t sst[3] = {1, 2, 5}, dst_st[3] = {4, 5, 6};
    CHECK(sp && dp);
    fill_pages(sp, dp, t, spool, dpool);
    kvb_plan_blocks_t po;
    kvb_plan_strided_t so;
    kvb_plan_blocks_init(&po);
    kvb_plan_strided_init(&so);
    uint32_t per = (t->npages + t->nchunks - 1) / t->nchunks;
    for (uint32_t first = 0; first < t->npages; first += per) {
        kvb_plan_chunk_t ch = {.field_mask = KVB_PLAN_CHUNK_PREFIX,
                               .src_pages = sp + first,
                               .dst_pages = dp + first,
                               .num_pages = t->npages - first < per ? t->npages - first : per,
                               .first_page = first,
                               .prefix_tokens = (uint64_t)t->prefix_pages * t->page};
        if (first + per >= t->npages) { /* the last chunk carries state and aux */
            ch.field_mask |= KVB_PLAN_CHUNK_STATE | KVB_PLAN_CHUNK_AUX;
            ch.src_state = sst;
            ch.dst_state = dst_st;
            ch.num_state_indices = t->nsi;
            ch.src_aux_index = 1;
            ch.dst_aux_index = 3;
        }
        run_chunk(&w, t, &ch, &po, &so);
    }
    for (uint32_t d = 0; d < t->dtp; d++)
        for (uint64_t i = 0; i < w.dst[d].size; i++)
            if (w.dst[d].arena[i] != w.copy[d][i])
                FAILF("decode %u byte %llu: plain wrote 0x%02x, strided 0x%02x", d,
                      (unsigned long long)i, w.dst[d].arena[i], w.copy[d][i]);
    kvb_plan_blocks_free(&po);
    kvb_plan_strided_free(&so);
    free(sp);
    free(dp);
    world_free(&w, t);
}

/* A named case: llama-like (8 KV heads) or MLA, small head sizes, page 16,
 * one chunk, no PP or extras; strided descriptors per real (p, d) call
 * `count` (-1: any) of `rows` rows each (0: any). */
static scase_t named(const char *name, int mla, uint32_t L, uint32_t ptp, uint32_t dtp,
                     uint32_t npages, uint32_t mode, uint32_t gap, int64_t count, uint64_t rows)
{
    static uint64_t seed;
    scase_t t = {.name = name,
                 .seed = ++seed,
                 .mla = mla,
                 .L = L,
                 .H = mla ? 1 : 8,
                 .hb = mla ? 24 : 4,
                 .ptp = ptp,
                 .dtp = dtp,
                 .pp = 1,
                 .page = 16,
                 .npages = npages,
                 .nchunks = 1,
                 .pages_mode = mode,
                 .gap = gap,
                 .want_count = count,
                 .want_rows = rows};
    return t;
}

/* PP, draft, state, aux, prefixes and chunks on top of a named case. */
static scase_t with_all(scase_t t, uint32_t pp, uint32_t prefix, uint32_t chunks, uint32_t draftL,
                        uint32_t nstate, uint32_t srep, uint32_t naux)
{
    t.pp = pp;
    t.page = 8;
    t.prefix_pages = prefix;
    t.nchunks = chunks;
    t.draftL = draftL;
    t.draftH = t.mla ? 1 : 8;
    t.draft_hb = 3;
    t.nstate = nstate;
    t.srep = srep;
    t.C = srep ? 3 : 8;
    t.cb = 2;
    t.nsi = 3;
    t.naux = naux;
    t.auxlen = 12;
    return t;
}

static void named_cases(void)
{
    const uint32_t R = PAGES_RUN, G = 16;
    scase_t c[] = {
        /* TP1→TP2, 64 consecutive pages: 2 × layers blocks of 64 × 16 rows */
        named("mha-tp1-tp2-run", 0, 32, 1, 2, 64, R, G, 2 * 32, 64 * 16),
        named("mha-tp2-tp1-run", 0, 32, 2, 1, 64, R, G, 2 * 32, 64 * 16),
        named("mha-tp2-tp8-run", 0, 8, 2, 8, 64, R, G, 2 * 8, 64 * 16),
        named("mha-tp8-tp2-run", 0, 8, 8, 2, 64, R, G, 2 * 8, 64 * 16),
        /* equal TP: whole rows, one plain block per buffer; adjacent
         * buffers: one block in all */
        named("mha-tp4-tp4-run", 0, 8, 4, 4, 64, R, G, 2 * 8, 1),
        named("mha-tp4-tp4-adjacent", 0, 8, 4, 4, 64, R, 0, 1, 1),
        /* MLA: replicated latent, whole rows */
        named("mla-tp1-tp2-run", 1, 8, 1, 2, 64, R, G, 8, 1),
        /* no two pages consecutive: one block per page and buffer */
        named("mha-tp1-tp2-reversed", 0, 4, 1, 2, 24, PAGES_REVERSED, G, 2 * 4 * 24, 16),
        named("mha-tp2-tp8-shuffled", 0, 4, 2, 8, 24, PAGES_SHUFFLED, G, -1, 0),
        with_all(named("mla-tp8-tp2-all", 1, 4, 8, 2, 40, PAGES_SEGMENTS, G, -1, 0), 2, 3, 3, 1, 0,
                 0, 0),
        with_all(named("mha-tp2-tp8-all", 0, 6, 2, 8, 30, PAGES_SEGMENTS, 8, -1, 0), 3, 5, 4, 2, 1,
                 0, 2),
        with_all(named("mha-tp8-tp2-all", 0, 6, 8, 2, 30, PAGES_SHUFFLED, 0, -1, 0), 2, 2, 3, 1, 2,
                 0, 1),
        with_all(named("mha-tp4-tp4-state-rep", 0, 4, 4, 4, 20, R, 0, -1, 0), 2, 0, 2, 1, 1, 1, 2),
    };
    for (size_t i = 0; i < sizeof(c) / sizeof(c[0]); i++)
        run_case(&c[i]);
    g_named = sizeof(c) / sizeof(c[0]);
}

static void gen_case(scase_t *t, uint64_t seed)
{
    static const uint32_t tps[] = {1, 2, 4, 8};
    memset(t, 0, sizeof(*t));
    t->name = "random";
    t->seed = seed;
    g_rng = seed * 0x9E3779B97F4A7C15ull + 3;
    t->mla = rin(0, 4) == 0;
    t->L = rin(1, 5);
    t->pp = rin(1, t->L < 3 ? t->L : 3);
    t->H = t->mla ? 1 : tps[rin(0, 3)] * rin(1, 2);
    t->hb = rin(1, 8);
    t->ptp = tps[rin(0, 3)];
    t->dtp = tps[rin(0, 3)];
    t->page = rin(1, 16);
    t->npages = rin(1, 40);
    t->prefix_pages = rin(0, 2) == 0 ? rin(0, t->npages) : 0;
    t->nchunks = rin(1, 4);
    t->pages_mode = rin(0, 3);
    t->gap = rin(0, 1) ? 0 : rin(1, 64);
    if (rin(0, 2) == 0) {
        t->draftL = rin(1, 2);
        t->draftH = t->mla ? 1 : tps[rin(0, 3)];
        t->draft_hb = rin(1, 5);
    }
    if (rin(0, 2) == 0) {
        t->nstate = rin(1, 2);
        t->srep = rin(0, 2) == 0;
        t->C = t->srep ? rin(1, 8) : tps[rin(0, 3)] * rin(1, 2);
        t->cb = rin(1, 4);
        t->nsi = rin(1, 3);
    }
    if (rin(0, 1) == 0) {
        t->naux = rin(1, 2);
        t->auxlen = rin(1, 24);
    }
    t->want_count = -1;
}

/* ---- errors: same status and reason as kvb_plan_blocks, out unchanged ---- */

typedef struct ecase {
    kvb_plan_h plan;
    kvb_plan_buffers_t sb, db;
    kvb_plan_chunk_t ch;
    kvb_plan_blocks_t po;
    kvb_plan_strided_t so;
} ecase_t;

/* Both planners fail with the same reason (containing want) and leave what
 * an earlier call appended as it was. */
static void expect_same_error(ecase_t *e, uint32_t p, uint32_t d, const char *want)
{
    size_t pc = e->po.count, sc = e->so.count;
    uint64_t pb = e->po.bytes, sbytes = e->so.bytes;
    kvb_block_t p0 = e->po.blocks[pc - 1];
    kvb_strided_block_t s0 = e->so.blocks[sc - 1];
    CHECK_EQ(kvb_plan_blocks(e->plan, p, d, &e->sb, &e->db, &e->ch, &e->po), KVB_ERR_INVALID);
    char plain_err[512];
    snprintf(plain_err, sizeof(plain_err), "%s", kvb_plan_last_error());
    CHECK_STR_CONTAINS(plain_err, want);
    CHECK_EQ(kvb_plan_strided_blocks(e->plan, p, d, &e->sb, &e->db, &e->ch, &e->so),
             KVB_ERR_INVALID);
    CHECK_STR_CONTAINS(kvb_plan_last_error(), plain_err);
    CHECK(e->po.count == pc && e->po.bytes == pb && e->so.count == sc && e->so.bytes == sbytes);
    CHECK(memcmp(&e->po.blocks[pc - 1], &p0, sizeof(p0)) == 0);
    CHECK(memcmp(&e->so.blocks[sc - 1], &s0, sizeof(s0)) == 0);
}

static void error_cases(void)
{
    kvb_plan_model_t m;
    kvb_plan_layout_t pl, dl;
    CHECK(kvb_plan_model_preset("llama3-8b", &m) == KVB_OK);
    kvb_plan_layout_from_model(&m, 1, 0, 1, 0, 16, &pl);
    kvb_plan_layout_from_model(&m, 2, 0, 1, 0, 16, &dl);
    pl.field_mask |= KVB_PLAN_LAYOUT_DRAFT | KVB_PLAN_LAYOUT_POOL;
    pl.draft_layers = 1;
    pl.draft_kv_heads = 8;
    pl.draft_head_bytes = 256;
    pl.kv_pool_pages = 100;
    dl.field_mask = pl.field_mask;
    dl.draft_layers = 1;
    dl.draft_kv_heads = 8;
    dl.draft_head_bytes = 256;
    dl.kv_pool_pages = 100;
    ecase_t e;
    memset(&e, 0, sizeof(e));
    CHECK(kvb_plan_create(&pl, &dl, &e.plan) == KVB_OK);
    uint64_t sa[64], da[64], sdr[2], ddr[2];
    for (int i = 0; i < 64; i++) {
        sa[i] = 0x100000000ull * (i + 1);
        da[i] = 0x10000000000ull * (i + 1);
    }
    sdr[0] = sdr[1] = 0x7000000000ull;
    ddr[0] = ddr[1] = 0x70000000000ull;
    int32_t sp[64], dp[64];
    for (int i = 0; i < 64; i++) {
        sp[i] = i;
        dp[i] = 30 + i;
    }
    e.sb = (kvb_plan_buffers_t){.kv = sa, .draft = sdr};
    e.db = (kvb_plan_buffers_t){.kv = da, .draft = ddr};
    e.ch = (kvb_plan_chunk_t){.src_pages = sp, .dst_pages = dp, .num_pages = 64};
    kvb_plan_blocks_init(&e.po);
    kvb_plan_strided_init(&e.so);
    /* an earlier call's output, which every failing call must leave alone:
     * (32 layers + 1 draft) × K, V, each 64 pages × 16 rows of one head */
    CHECK(kvb_plan_blocks(e.plan, 0, 1, &e.sb, &e.db, &e.ch, &e.po) == KVB_OK);
    CHECK(kvb_plan_strided_blocks(e.plan, 0, 1, &e.sb, &e.db, &e.ch, &e.so) == KVB_OK);
    CHECK_EQ(e.so.count, 2 * 33);
    CHECK_EQ(e.po.count, 2 * 33 * 64 * 16);
    CHECK_EQ(e.so.bytes, e.po.bytes);
    CHECK_EQ(e.so.blocks[0].src, sa[0] + 4 * 256);
    CHECK_EQ(e.so.blocks[0].dst, da[0] + 30 * 16 * 4 * 256);
    CHECK_EQ(e.so.blocks[0].len, 4 * 256);
    CHECK_EQ(e.so.blocks[0].src_stride, 8 * 256);
    CHECK_EQ(e.so.blocks[0].dst_stride, 4 * 256);
    CHECK_EQ(e.so.blocks[0].count, 64 * 16);

    dp[5] = -1;
    expect_same_error(&e, 0, 0, "dst_pages[5]=-1");
    dp[5] = 100;
    expect_same_error(&e, 0, 0, "dst_pages[5]=100 outside the pool of 100");
    dp[5] = 35;
    sp[63] = 100;
    expect_same_error(&e, 0, 0, "src_pages[63]=100");
    sp[63] = 63;
    e.ch.field_mask = KVB_PLAN_CHUNK_PREFIX | KVB_PLAN_CHUNK_DST_PAGES;
    e.ch.prefix_tokens = 8; /* mid-page: fine; the decode pages given are too few */
    e.ch.num_dst_pages = 10;
    expect_same_error(&e, 0, 0, "rows [8, 1024) reach decode pages 0..63; dst_pages hold 10");
    e.ch.field_mask = 0;
    e.ch.prefix_tokens = 0;
    e.ch.src_pages = NULL;
    expect_same_error(&e, 0, 0, "src_pages or dst_pages is NULL");
    e.ch.src_pages = sp;
    e.sb.kv = NULL;
    expect_same_error(&e, 0, 0, "k: prefill base address array is NULL");
    e.sb.kv = sa;
    e.db.draft = NULL; /* fails after K and V were emitted: restored */
    expect_same_error(&e, 0, 0, "draft_k: decode base address array is NULL");
    e.db.draft = ddr;
    sa[3] = UINT64_MAX - 100;
    expect_same_error(&e, 0, 1, "overflows");
    sa[3] = 0x100000000ull * 4;
    expect_same_error(&e, 1, 0, "prefill_rank=1");
    expect_same_error(&e, 0, 2, "decode_rank=2");

    /* NULL arguments: each names its own function */
    CHECK_EQ(kvb_plan_strided_blocks(e.plan, 0, 0, &e.sb, &e.db, &e.ch, NULL), KVB_ERR_INVALID);
    CHECK_STR_CONTAINS(kvb_plan_last_error(), "kvb_plan_strided_blocks: NULL argument");
    CHECK_EQ(kvb_plan_strided_blocks(NULL, 0, 0, &e.sb, &e.db, &e.ch, &e.so), KVB_ERR_INVALID);
    CHECK_EQ(kvb_plan_strided_blocks(e.plan, 0, 0, NULL, &e.db, &e.ch, &e.so), KVB_ERR_INVALID);
    CHECK_EQ(kvb_plan_strided_blocks(e.plan, 0, 0, &e.sb, &e.db, NULL, &e.so), KVB_ERR_INVALID);

    /* fixed arrays: one short of the 66 needed fails and appends nothing;
     * exactly 66 is enough (reserved per run, not per page) */
    kvb_strided_block_t fixed[66];
    kvb_plan_strided_t fx = {.blocks = fixed, .capacity = 65, .fixed = 1};
    CHECK_EQ(kvb_plan_strided_blocks(e.plan, 0, 1, &e.sb, &e.db, &e.ch, &fx), KVB_ERR_INVALID);
    CHECK_STR_CONTAINS(kvb_plan_last_error(), "capacity=65");
    CHECK(fx.count == 0 && fx.bytes == 0);
    fx.capacity = 66;
    CHECK(kvb_plan_strided_blocks(e.plan, 0, 1, &e.sb, &e.db, &e.ch, &fx) == KVB_OK);
    CHECK(fx.count == 66 && memcmp(fixed, e.so.blocks, sizeof(fixed)) == 0);
    kvb_plan_strided_free(&fx); /* a fixed array is not freed, only forgotten */
    CHECK(fx.blocks == NULL && fx.count == 0);

    kvb_plan_blocks_free(&e.po);
    kvb_plan_strided_free(&e.so);
    kvb_plan_strided_free(NULL);
    kvb_plan_destroy(e.plan);
}

int main(int argc, char **argv)
{
    uint64_t nrandom = argc > 1 ? strtoull(argv[1], NULL, 10) : 1500;
    error_cases();
    named_cases();
    for (uint64_t i = 0; i < nrandom; i++) {
        scase_t t;
        gen_case(&t, 100 + i);
        run_case(&t);
    }
    fprintf(stderr,
            "ok: %llu named + %llu random cases, %llu plain blocks, %llu strided blocks, %llu "
            "bytes\n",
            (unsigned long long)g_named, (unsigned long long)nrandom,
            (unsigned long long)g_plain_blocks, (unsigned long long)g_strided_blocks,
            (unsigned long long)g_bytes);
    return 0;
}
