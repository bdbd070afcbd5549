/* Planner vs an independent naive reference mapper.
 *
 * Every prefill rank's buffers are filled byte by byte with a value that
 * depends only on (buffer kind, global layer, request token, global unit,
 * byte within unit). The reference says, per decode rank, layer, token, local
 * unit and byte, which value must land there; the planner's blocks are
 * applied with memcpy and the decode image must match, with every expected
 * byte written exactly once and nothing else touched. Fixed seeds; a failing
 * case prints its parameters. */
#include <kvbridge/plan.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvb_test.h"

static uint64_t g_rng;
static uint64_t rnd(void)
{
    return kvb_test_splitmix(&g_rng);
}
static uint32_t rin(uint32_t lo, uint32_t hi) /* [lo, hi] */
{
    return kvb_test_range(&g_rng, lo, hi);
}

static uint8_t pat(uint32_t kind, uint32_t layer, uint64_t tok, uint64_t gu, uint64_t b)
{
    uint64_t z = ((uint64_t)kind << 56) ^ ((uint64_t)layer << 40) ^ (tok << 20) ^ (gu << 10) ^ b;
    z = (z ^ (z >> 31)) * 0x7FB5D329728EA185ull;
    z = (z ^ (z >> 27)) * 0x81DADEF4BC2DD44Dull;
    return (uint8_t)(z ^ (z >> 33));
}

/* Reference shard rule (SGLang): rank r of tp over H units holds
 * max(1, H / tp) units starting at r * H / tp. */
static void shard(uint32_t H, uint32_t tp, uint32_t r, uint32_t *first, uint32_t *count)
{
    *count = H >= tp ? H / tp : 1;
    *first = (uint32_t)((uint64_t)r * H / tp);
}

static int tp_ok(uint32_t H, uint32_t tp)
{
    return H % tp == 0 || tp % H == 0;
}

enum { K_KV = 0, K_DRAFT = 1, K_STATE = 2, K_AUX = 4 };

typedef struct tcase {
    uint64_t seed;
    int mla, generic;
    uint32_t L, pp, H, hb, ptp, dtp, page, npages, sextra, dextra, prefix_pages, nchunks;
    uint32_t draftL, draftH, draft_hb;
    uint32_t nstate, C[2], cb[2], srep[2], nsi;
    uint32_t naux, auxlen[2];
} tcase_t;

static void print_case(const tcase_t *t)
{
    fprintf(stderr,
            "case seed=%llu mla=%d generic=%d layers=%u pp=%u heads=%u head_bytes=%u "
            "prefill_tp=%u decode_tp=%u page=%u pages=%u prefix_pages=%u chunks=%u draft=%u/%u/%u "
            "state=%u [C=%u,%u cb=%u,%u rep=%u,%u] aux=%u [%u,%u]\n",
            (unsigned long long)t->seed, t->mla, t->generic, t->L, t->pp, t->H, t->hb, t->ptp,
            t->dtp, t->page, t->npages, t->prefix_pages, t->nchunks, t->draftL, t->draftH,
            t->draft_hb, t->nstate, t->C[0], t->C[1], t->cb[0], t->cb[1], t->srep[0], t->srep[1],
            t->naux, t->auxlen[0], t->auxlen[1]);
}

#define FAIL(t, ...)                                                                               \
    do {                                                                                           \
        print_case(t);                                                                             \
        fprintf(stderr, __VA_ARGS__);                                                              \
        fprintf(stderr, "\n");                                                                     \
        exit(1);                                                                                   \
    } while (0)

/* Memory of one rank: one arena carved into per-buffer arrays, so a block's
 * destination maps to a write-count cell at the same offset. */
typedef struct rmem {
    uint8_t *arena;
    uint64_t size, used;
    uint8_t *kv[2 * 8], *draft[4], *state[2], *aux[2];
    uint64_t kv_a[2 * 8], draft_a[4], state_a[2], aux_a[2];
} rmem_t;

static uint8_t *carve(rmem_t *m, uint64_t n, uint64_t *addr_p)
{
    uint8_t *p = m->arena ? m->arena + m->used : NULL;
    if (addr_p)
        *addr_p = (uint64_t)(uintptr_t)p;
    m->used += n;
    return p;
}

/* Two passes: the first (arena NULL) sizes, the second carves. */
static void mem_layout(rmem_t *m, const tcase_t *t, uint32_t tp, uint32_t nkv, uint64_t pool,
                       uint64_t state_pool, uint64_t aux_pool, int with_extra)
{
    uint32_t f, cnt;
    m->used = 0;
    uint64_t row = t->hb;
    if (!t->mla) {
        shard(t->H, tp, 0, &f, &cnt);
        row = (uint64_t)cnt * t->hb;
    }
    for (uint32_t i = 0; i < nkv; i++)
        m->kv[i] = carve(m, pool * t->page * row, &m->kv_a[i]);
    if (!with_extra)
        return;
    uint32_t ndraft = t->draftL * (t->mla ? 1 : 2);
    uint64_t drow = t->draft_hb;
    if (!t->mla) {
        shard(t->draftH, tp, 0, &f, &cnt);
        drow = (uint64_t)cnt * t->draft_hb;
    }
    for (uint32_t i = 0; i < ndraft; i++)
        m->draft[i] = carve(m, pool * t->page * drow, &m->draft_a[i]);
    for (uint32_t i = 0; i < t->nstate; i++) {
        shard(t->C[i], tp, 0, &f, &cnt);
        uint64_t srow = (uint64_t)(t->srep[i] ? t->C[i] : cnt) * t->cb[i];
        m->state[i] = carve(m, state_pool * srow, &m->state_a[i]);
    }
    for (uint32_t i = 0; i < t->naux; i++)
        m->aux[i] = carve(m, aux_pool * t->auxlen[i], &m->aux_a[i]);
}

static void mem_alloc(rmem_t *m, const tcase_t *t, uint32_t tp, uint32_t nkv, uint64_t pool,
                      uint64_t state_pool, uint64_t aux_pool, int with_extra, int fill)
{
    memset(m, 0, sizeof(*m));
    mem_layout(m, t, tp, nkv, pool, state_pool, aux_pool, with_extra);
    m->size = m->used;
    m->arena = malloc(m->size ? m->size : 1);
    CHECK(m->arena != NULL);
    memset(m->arena, fill, m->size);
    mem_layout(m, t, tp, nkv, pool, state_pool, aux_pool, with_extra);
}

static void mem_free(rmem_t *m)
{
    free(m->arena);
}

/* Fill (src) or check (dst) one paged buffer. Unit geometry: H global units
 * of ub bytes, the rank holds [first, first + cnt). mode 0 = fill; mode 1 =
 * check values and write counts. */
typedef struct ctx {
    const tcase_t *t;
    const int32_t *pages; /* request page → pool item */
    uint32_t npages, rows, prefix_pages;
} ctx_t;

static void visit_paged(const ctx_t *c, int mode, uint8_t *buf, const uint8_t *cnt_buf,
                        uint32_t kind, uint32_t layer, uint32_t first, uint32_t count, uint32_t ub,
                        const char *what)
{
    uint64_t row = (uint64_t)count * ub, item = row * c->rows;
    for (uint32_t pg = 0; pg < c->npages; pg++) {
        uint64_t base = (uint64_t)c->pages[pg] * item;
        for (uint32_t r = 0; r < c->rows; r++) {
            uint64_t tok = (uint64_t)pg * c->rows + r;
            for (uint32_t u = 0; u < count; u++) {
                for (uint32_t b = 0; b < ub; b++) {
                    uint64_t off = base + r * row + (uint64_t)u * ub + b;
                    uint8_t want = pat(kind, layer, tok, first + u, b);
                    if (mode == 0) {
                        buf[off] = want;
                        continue;
                    }
                    int expect = pg >= c->prefix_pages;
                    if (cnt_buf[off] != expect)
                        FAIL(c->t,
                             "%s layer %u page %u row %u unit %u byte %u written %u times, "
                             "want %d",
                             what, layer, pg, r, first + u, b, cnt_buf[off], expect);
                    if (expect && buf[off] != want)
                        FAIL(c->t, "%s layer %u page %u row %u unit %u byte %u: got %u want %u",
                             what, layer, pg, r, first + u, b, buf[off], want);
                }
            }
        }
    }
}

static size_t g_cases, g_blocks, g_images;

static void run_case(tcase_t *t)
{
    uint32_t L = t->L, nkv_all = t->mla ? L : 2 * L;
    uint64_t spool = t->npages + t->sextra, dpool = t->npages + t->dextra;
    uint32_t state_pool = t->nsi + 3, aux_pool = 4;
    int32_t *sperm = malloc(spool * sizeof(int32_t)), *dperm = malloc(dpool * sizeof(int32_t));
    for (uint64_t i = 0; i < spool; i++)
        sperm[i] = (int32_t)i;
    for (uint64_t i = 0; i < dpool; i++)
        dperm[i] = (int32_t)i;
    /* mostly shuffled, sometimes contiguous so runs merge */
    int shuffle = rin(0, 3) != 0;
    for (uint64_t i = spool; shuffle && i > 1; i--) {
        uint64_t j = rnd() % i, x = sperm[i - 1];
        sperm[i - 1] = sperm[j];
        sperm[j] = (int32_t)x;
    }
    for (uint64_t i = dpool; shuffle && i > 1; i--) {
        uint64_t j = rnd() % i, x = dperm[i - 1];
        dperm[i - 1] = dperm[j];
        dperm[j] = (int32_t)x;
    }
    int32_t sst[4], dst_st[4];
    for (uint32_t i = 0; i < t->nsi; i++) {
        sst[i] = (int32_t)((i * 2 + 1) % state_pool);
        dst_st[i] = (int32_t)((state_pool - 1 - i) % state_pool);
    }
    int64_t saux = rin(0, aux_pool - 1), daux = rin(0, aux_pool - 1);
    kvb_plan_geom_t sgeom[2][2]; /* [side][state] */

    /* layouts */
    kvb_plan_layout_t pl, dl;
    memset(&pl, 0, sizeof(pl));
    pl.attn = t->mla ? KVB_PLAN_MLA : KVB_PLAN_MHA;
    pl.num_layers = L;
    pl.page_size = t->page;
    pl.kv_heads = t->H;
    pl.head_bytes = t->hb;
    pl.field_mask = KVB_PLAN_LAYOUT_PP | KVB_PLAN_LAYOUT_POOL;
    pl.pp_size = t->pp;
    if (t->draftL) {
        pl.field_mask |= KVB_PLAN_LAYOUT_DRAFT;
        pl.draft_layers = t->draftL;
        pl.draft_kv_heads = t->draftH;
        pl.draft_head_bytes = t->draft_hb;
    }
    if (t->nstate) {
        pl.field_mask |= KVB_PLAN_LAYOUT_STATE;
        pl.num_state = t->nstate;
    }
    uint64_t auxl[2] = {t->auxlen[0], t->auxlen[1]};
    if (t->naux) {
        pl.field_mask |= KVB_PLAN_LAYOUT_AUX;
        pl.num_aux = t->naux;
        pl.aux_item_lens = auxl;
    }
    dl = pl;
    pl.tp_size = t->ptp;
    dl.tp_size = t->dtp;
    dl.pp_size = 1;
    pl.kv_pool_pages = spool;
    dl.kv_pool_pages = dpool;
    pl.state_pool_items = dl.state_pool_items = state_pool;
    pl.aux_pool_items = dl.aux_pool_items = aux_pool;
    for (int side = 0; side < 2; side++) {
        uint32_t tp = side ? t->dtp : t->ptp, f, cnt;
        kvb_plan_layout_t *l = side ? &dl : &pl;
        for (uint32_t i = 0; i < t->nstate; i++) {
            shard(t->C[i], tp, 0, &f, &cnt);
            kvb_plan_geom_t *g = &sgeom[side][i];
            memset(g, 0, sizeof(*g));
            g->unit_len = t->cb[i];
            if (t->srep[i]) {
                g->axis = KVB_PLAN_AXIS_REPLICATED;
                g->item_len = (uint64_t)t->C[i] * t->cb[i];
            } else {
                g->axis = KVB_PLAN_AXIS_STATE_CHANNEL;
                g->item_len = (uint64_t)cnt * t->cb[i];
                g->global_units = t->C[i];
            }
        }
        l->state = sgeom[side];
        if (t->generic && !t->mla) {
            shard(t->H, tp, 0, &f, &cnt);
            l->field_mask |= KVB_PLAN_LAYOUT_KV_GEOM;
            l->kv_geom.item_len = (uint64_t)t->page * cnt * t->hb;
            l->kv_geom.unit_len = t->hb;
            l->kv_geom.axis = KVB_PLAN_AXIS_KV_HEAD;
            /* inference is exact when neither side replicates */
            int infer = t->H >= t->ptp && t->H >= t->dtp && (t->seed & 1);
            l->kv_geom.global_units = infer ? 0 : t->H;
        }
    }

    /* PP stages: explicit random partition on odd seeds, else SGLang's
     * default (layers / pp each, remainder on the stages before the last). */
    uint32_t P = t->ptp, D = t->dtp, sstart[4], slen[4];
    int explicit_stage = (t->seed >> 1) & 1;
    {
        uint32_t base = L / t->pp, rem = L % t->pp, acc = 0;
        for (uint32_t s = 0; s < t->pp; s++) {
            slen[s] = base;
            if (s < t->pp - 1 && s >= t->pp - 1 - rem)
                slen[s]++;
        }
        if (explicit_stage) { /* move layers around, keeping every stage non-empty */
            for (uint32_t s = 0; s + 1 < t->pp; s++) {
                if (slen[s] > 1 && rin(0, 1)) {
                    slen[s]--;
                    slen[s + 1]++;
                }
            }
        }
        for (uint32_t s = 0; s < t->pp; s++) {
            sstart[s] = acc;
            acc += slen[s];
        }
        CHECK(acc == L);
    }
    rmem_t *src = calloc((size_t)P * t->pp, sizeof(rmem_t));
    rmem_t *dst = calloc(D, sizeof(rmem_t)), *cnt = calloc(D, sizeof(rmem_t));
    kvb_plan_h plans[4];
    for (uint32_t s = 0; s < t->pp; s++) {
        pl.pp_rank = s;
        pl.tp_rank = rin(0, P - 1);
        dl.tp_rank = rin(0, D - 1);
        if (explicit_stage) {
            pl.field_mask |= KVB_PLAN_LAYOUT_STAGE;
            pl.start_layer = sstart[s];
            pl.stage_layers = slen[s];
        }
        kvb_status_t st = kvb_plan_create(&pl, &dl, &plans[s]);
        if (st != KVB_OK)
            FAIL(t, "kvb_plan_create(stage %u): %s", s, kvb_plan_last_error());
    }
    for (uint32_t d = 0; d < D; d++) {
        mem_alloc(&dst[d], t, D, nkv_all, dpool, state_pool, aux_pool, 1, 0xEE);
        mem_alloc(&cnt[d], t, D, nkv_all, dpool, state_pool, aux_pool, 1, 0);
    }
    ctx_t sc = {t, sperm, t->npages, t->page, 0};
    for (uint32_t s = 0; s < t->pp; s++) {
        uint32_t start = sstart[s], n = slen[s];
        int last = s + 1 == t->pp;
        for (uint32_t p = 0; p < P; p++) {
            rmem_t *m = &src[(size_t)s * P + p];
            mem_alloc(m, t, P, t->mla ? n : 2 * n, spool, state_pool, aux_pool, last, 0x11);
            uint32_t f, c;
            for (uint32_t l = 0; l < n; l++) {
                if (t->mla) {
                    visit_paged(&sc, 0, m->kv[l], NULL, 0, start + l, 0, 1, t->hb, "latent");
                } else {
                    shard(t->H, P, p, &f, &c);
                    visit_paged(&sc, 0, m->kv[l], NULL, 0, start + l, f, c, t->hb, "k");
                    visit_paged(&sc, 0, m->kv[n + l], NULL, 1, start + l, f, c, t->hb, "v");
                }
            }
            if (!last)
                continue;
            for (uint32_t l = 0; l < t->draftL; l++) {
                if (t->mla) {
                    visit_paged(&sc, 0, m->draft[l], NULL, 2, l, 0, 1, t->draft_hb, "draft");
                } else {
                    shard(t->draftH, P, p, &f, &c);
                    visit_paged(&sc, 0, m->draft[l], NULL, 2, l, f, c, t->draft_hb, "draft_k");
                    visit_paged(&sc, 0, m->draft[t->draftL + l], NULL, 3, l, f, c, t->draft_hb,
                                "draft_v");
                }
            }
            for (uint32_t i = 0; i < t->nstate; i++) {
                ctx_t stc = {t, sst, t->nsi, 1, 0};
                if (t->srep[i]) {
                    f = 0;
                    c = t->C[i];
                } else {
                    shard(t->C[i], P, p, &f, &c);
                }
                visit_paged(&stc, 0, m->state[i], NULL, 10 + i, 0, f, c, t->cb[i], "state");
            }
            for (uint32_t i = 0; i < t->naux; i++) {
                int32_t ai = (int32_t)saux;
                ctx_t ac = {t, &ai, 1, 1, 0};
                visit_paged(&ac, 0, m->aux[i], NULL, 20 + i, 0, 0, 1, t->auxlen[i], "aux");
            }
        }
    }

    /* routes: sources cover all prefill ranks; counts consistent; the same
     * for every PP stage's plan */
    uint32_t *heard = calloc(P, sizeof(uint32_t));
    uint8_t *is_src = calloc((size_t)P * D, 1); /* 1 dummy, 2 real */
    for (uint32_t d = 0; d < D; d++) {
        kvb_plan_route_t r, r2;
        CHECK(kvb_plan_route(plans[0], d, &r) == KVB_OK);
        CHECK(kvb_plan_route(plans[t->pp - 1], d, &r2) == KVB_OK);
        CHECK(r.num_sources == r2.num_sources);
        CHECK(r.decode_rank == d);
        uint32_t real = 0;
        for (uint32_t k = 0; k < r.num_sources; k++) {
            const kvb_plan_source_t *so = &r.sources[k];
            if (so->prefill_rank >= P ||
                (k > 0 && so->prefill_rank <= r.sources[k - 1].prefill_rank))
                FAIL(t, "route of decode %u: bad or unsorted source %u", d, so->prefill_rank);
            heard[so->prefill_rank]++;
            is_src[(size_t)so->prefill_rank * D + d] = so->dummy ? 1 : 2;
            real += !so->dummy;
        }
        if (r.required_prefill_response_num != real * t->pp)
            FAIL(t, "decode %u: required_prefill_response_num=%u, real=%u pp=%u", d,
                 r.required_prefill_response_num, real, t->pp);
        if (real == 0)
            FAIL(t, "decode %u has no real source", d);
    }
    for (uint32_t d = 0; d < D; d++) {
        kvb_plan_route_t r;
        CHECK(kvb_plan_route(plans[0], d, &r) == KVB_OK);
        for (uint32_t k = 0; k < r.num_sources; k++)
            if (r.sources[k].required_dst_info_num != heard[r.sources[k].prefill_rank])
                FAIL(t, "prefill %u: required_dst_info_num=%u but %u decode ranks name it",
                     r.sources[k].prefill_rank, r.sources[k].required_dst_info_num,
                     heard[r.sources[k].prefill_rank]);
    }
    for (uint32_t p = 0; p < P; p++)
        if (heard[p] == 0)
            FAIL(t, "prefill rank %u is in no decode rank's sources", p);
    /* a real source has fragments, a dummy or non-source has none */
    for (uint32_t p = 0; p < P; p++) {
        for (uint32_t d = 0; d < D; d++) {
            kvb_plan_fragment_t fr[16];
            size_t nf = 0;
            CHECK(kvb_plan_max_fragments(plans[0]) <= 16);
            CHECK(kvb_plan_fragments(plans[0], p, d, fr, 16, &nf) == KVB_OK);
            if ((nf > 0) != (is_src[(size_t)p * D + d] == 2))
                FAIL(t, "prefill %u → decode %u: %zu fragments but source mark %u", p, d, nf,
                     is_src[(size_t)p * D + d]);
        }
    }

    /* apply the planner's blocks, chunk by chunk */
    uint32_t cuts[10], nc = 0;
    cuts[nc++] = 0;
    for (uint32_t i = 1; i < t->nchunks; i++)
        cuts[nc++] = rin(0, t->npages);
    cuts[nc++] = t->npages;
    for (uint32_t i = 1; i < nc; i++) /* sort */
        for (uint32_t j = i; j > 0 && cuts[j] < cuts[j - 1]; j--) {
            uint32_t x = cuts[j];
            cuts[j] = cuts[j - 1];
            cuts[j - 1] = x;
        }
    kvb_plan_blocks_t out;
    kvb_plan_blocks_init(&out);
    for (uint32_t ci = 0; ci + 1 < nc; ci++) {
        int lastc = ci + 2 == nc;
        kvb_plan_chunk_t ch;
        memset(&ch, 0, sizeof(ch));
        ch.field_mask = KVB_PLAN_CHUNK_PREFIX;
        ch.src_pages = sperm + cuts[ci];
        ch.dst_pages = dperm + cuts[ci];
        ch.num_pages = cuts[ci + 1] - cuts[ci];
        ch.first_page = cuts[ci];
        ch.prefix_tokens = (uint64_t)t->prefix_pages * t->page;
        if (lastc) {
            ch.field_mask |= KVB_PLAN_CHUNK_STATE | KVB_PLAN_CHUNK_AUX;
            ch.src_state = sst;
            ch.dst_state = dst_st;
            ch.num_state_indices = t->nsi;
            ch.src_aux_index = saux;
            ch.dst_aux_index = daux;
        }
        for (uint32_t s = 0; s < t->pp; s++) {
            for (uint32_t p = 0; p < P; p++) {
                rmem_t *m = &src[(size_t)s * P + p];
                kvb_plan_buffers_t sb = {m->kv_a, m->draft_a, m->state_a, m->aux_a};
                for (uint32_t d = 0; d < D; d++) {
                    rmem_t *dm = &dst[d];
                    kvb_plan_buffers_t db = {dm->kv_a, dm->draft_a, dm->state_a, dm->aux_a};
                    out.count = 0;
                    out.bytes = 0;
                    kvb_status_t st = kvb_plan_blocks(plans[s], p, d, &sb, &db, &ch, &out);
                    if (st != KVB_OK)
                        FAIL(t, "kvb_plan_blocks(stage %u, p %u, d %u): %s", s, p, d,
                             kvb_plan_last_error());
                    if (out.count > 0 && is_src[(size_t)p * D + d] != 2)
                        FAIL(t,
                             "prefill %u sends %zu blocks to decode %u but is not its real "
                             "source",
                             p, out.count, d);
                    uint64_t sum = 0;
                    uint64_t sa = (uint64_t)(uintptr_t)m->arena,
                             da = (uint64_t)(uintptr_t)dm->arena;
                    for (size_t k = 0; k < out.count; k++) {
                        const kvb_block_t *b = &out.blocks[k];
                        if (b->len == 0 || b->src < sa || b->src - sa + b->len > m->size ||
                            b->dst < da || b->dst - da + b->len > dm->size)
                            FAIL(t, "block %zu (p %u → d %u) outside the rank memory", k, p, d);
                        memcpy(dm->arena + (b->dst - da), m->arena + (b->src - sa), b->len);
                        uint8_t *cc = cnt[d].arena + (b->dst - da);
                        for (uint64_t x = 0; x < b->len; x++)
                            cc[x]++;
                        sum += b->len;
                    }
                    if (sum != out.bytes)
                        FAIL(t, "out.bytes=%llu but blocks sum to %llu",
                             (unsigned long long)out.bytes, (unsigned long long)sum);
                    g_blocks += out.count;
                }
            }
        }
    }
    kvb_plan_blocks_free(&out);

    /* reference image of every decode rank */
    ctx_t dc = {t, dperm, t->npages, t->page, t->prefix_pages};
    for (uint32_t d = 0; d < D; d++) {
        rmem_t *m = &dst[d], *c = &cnt[d];
        uint32_t f, n;
        for (uint32_t l = 0; l < L; l++) {
            if (t->mla) {
                visit_paged(&dc, 1, m->kv[l], c->kv[l], 0, l, 0, 1, t->hb, "latent");
            } else {
                shard(t->H, D, d, &f, &n);
                visit_paged(&dc, 1, m->kv[l], c->kv[l], 0, l, f, n, t->hb, "k");
                visit_paged(&dc, 1, m->kv[L + l], c->kv[L + l], 1, l, f, n, t->hb, "v");
            }
        }
        for (uint32_t l = 0; l < t->draftL; l++) {
            if (t->mla) {
                visit_paged(&dc, 1, m->draft[l], c->draft[l], 2, l, 0, 1, t->draft_hb, "draft");
            } else {
                shard(t->draftH, D, d, &f, &n);
                visit_paged(&dc, 1, m->draft[l], c->draft[l], 2, l, f, n, t->draft_hb, "draft_k");
                visit_paged(&dc, 1, m->draft[t->draftL + l], c->draft[t->draftL + l], 3, l, f, n,
                            t->draft_hb, "draft_v");
            }
        }
        for (uint32_t i = 0; i < t->nstate; i++) {
            ctx_t stc = {t, dst_st, t->nsi, 1, 0};
            if (t->srep[i]) {
                f = 0;
                n = t->C[i];
            } else {
                shard(t->C[i], D, d, &f, &n);
            }
            visit_paged(&stc, 1, m->state[i], c->state[i], 10 + i, 0, f, n, t->cb[i], "state");
        }
        for (uint32_t i = 0; i < t->naux; i++) {
            int32_t ai = (int32_t)daux;
            ctx_t ac = {t, &ai, 1, 1, 0};
            visit_paged(&ac, 1, m->aux[i], c->aux[i], 20 + i, 0, 0, 1, t->auxlen[i], "aux");
        }
        /* nothing outside the expected bytes was written: the total of
         * write counts equals the expected byte count */
        uint64_t total = 0;
        for (uint64_t x = 0; x < c->size; x++)
            total += c->arena[x];
        uint64_t want = 0;
        uint32_t live = t->npages - t->prefix_pages;
        uint64_t row = t->mla ? t->hb : 0;
        if (!t->mla) {
            shard(t->H, D, d, &f, &n);
            row = (uint64_t)n * t->hb;
        }
        want += (uint64_t)(t->mla ? L : 2 * L) * live * t->page * row;
        uint64_t drow = t->draft_hb;
        if (!t->mla) {
            shard(t->draftH, D, d, &f, &n);
            drow = (uint64_t)n * t->draft_hb;
        }
        want += (uint64_t)t->draftL * (t->mla ? 1 : 2) * live * t->page * drow;
        for (uint32_t i = 0; i < t->nstate; i++) {
            shard(t->C[i], D, d, &f, &n);
            want += (uint64_t)t->nsi * (t->srep[i] ? t->C[i] : n) * t->cb[i];
        }
        for (uint32_t i = 0; i < t->naux; i++)
            want += t->auxlen[i];
        if (total != want)
            FAIL(t, "decode %u: %llu bytes written, reference expects %llu", d,
                 (unsigned long long)total, (unsigned long long)want);
    }
    g_images += D;

    free(heard);
    free(is_src);
    for (uint32_t s = 0; s < t->pp; s++)
        kvb_plan_destroy(plans[s]);
    for (uint32_t i = 0; i < P * t->pp; i++)
        mem_free(&src[i]);
    for (uint32_t d = 0; d < D; d++) {
        mem_free(&dst[d]);
        mem_free(&cnt[d]);
    }
    free(src);
    free(dst);
    free(cnt);
    free(sperm);
    free(dperm);
    g_cases++;
}

/* Units a TP pair can both serve: divisors or divisor-multiples of each TP. */
static uint32_t pick_units(uint32_t ptp, uint32_t dtp, uint32_t max)
{
    uint32_t c[64], n = 0;
    for (uint32_t h = 1; h <= max && n < 64; h++)
        if (tp_ok(h, ptp) && tp_ok(h, dtp))
            c[n++] = h;
    return n ? c[rin(0, n - 1)] : 0;
}

static void gen_case(tcase_t *t, uint64_t seed)
{
    memset(t, 0, sizeof(*t));
    t->seed = seed;
    g_rng = seed * 0x2545F4914F6CDD1Dull + 7;
    t->mla = rin(0, 5) == 0;
    t->generic = rin(0, 2) == 0;
    t->L = rin(1, 4);
    t->pp = rin(1, t->L < 4 ? t->L : 4);
    /* heads first, then TP sizes each side can split it over */
    static const uint32_t hs[] = {1, 2, 3, 4, 6, 8, 12, 16, 32, 64};
    t->H = rin(0, 3) == 0 ? rin(1, 64) : hs[rin(0, 9)];
    if (t->mla)
        t->H = 1;
    uint32_t cand[16], n = 0;
    for (uint32_t tp = 1; tp <= 16; tp++)
        if (t->mla || tp_ok(t->H, tp))
            cand[n++] = tp;
    t->ptp = cand[rin(0, n - 1)];
    t->dtp = rin(0, 3) == 0 ? t->ptp : cand[rin(0, n - 1)];
    t->hb = rin(1, 6);
    if (t->mla)
        t->hb = rin(1, 24);
    static const uint32_t pages[] = {1, 2, 3, 4, 8, 16, 32, 64};
    t->page = pages[rin(0, 7)];
    uint32_t maxp = 256 / t->page;
    t->npages = rin(1, maxp < 12 ? maxp : 12);
    if ((uint64_t)t->H * t->hb * t->page > 4096 && t->npages > 4)
        t->npages = 4;
    t->sextra = rin(0, 4);
    t->dextra = rin(0, 4);
    t->prefix_pages = rin(0, 2) == 0 ? rin(0, t->npages) : 0;
    t->nchunks = rin(1, 4);
    if (rin(0, 3) == 0) {
        t->draftL = rin(1, 2);
        t->draftH = t->mla ? 1 : pick_units(t->ptp, t->dtp, 16);
        t->draft_hb = rin(1, 5);
    }
    if (rin(0, 2) == 0) {
        t->nstate = rin(1, 2);
        t->nsi = rin(1, 3);
        for (uint32_t i = 0; i < t->nstate; i++) {
            t->srep[i] = rin(0, 2) == 0;
            t->C[i] = t->srep[i] ? rin(1, 8) : pick_units(t->ptp, t->dtp, 32);
            t->cb[i] = rin(1, 4);
        }
    }
    if (rin(0, 1) == 0) {
        t->naux = rin(1, 2);
        for (uint32_t i = 0; i < t->naux; i++)
            t->auxlen[i] = rin(1, 24);
    }
}

int main(int argc, char **argv)
{
    uint64_t ncases = 10000, first = 1;
    if (argc > 1)
        ncases = strtoull(argv[1], NULL, 10);
    if (argc > 2)
        first = strtoull(argv[2], NULL, 10);
    size_t kinds[4] = {0}; /* equal TP, decode larger, decode smaller, GQA replicas */
    for (uint64_t i = 0; i < ncases; i++) {
        tcase_t t;
        gen_case(&t, first + i);
        kinds[t.ptp == t.dtp ? 0 : t.dtp > t.ptp ? 1 : 2]++;
        if (!t.mla && (t.ptp > t.H || t.dtp > t.H))
            kinds[3]++;
        run_case(&t);
    }
    fprintf(stderr,
            "ok: %zu cases (%zu equal TP, %zu decode TP larger, %zu smaller, %zu with GQA "
            "replicas), %zu decode images, %zu blocks\n",
            g_cases, kinds[0], kinds[1], kinds[2], kinds[3], g_images, g_blocks);
    return 0;
}
