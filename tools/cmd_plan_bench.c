/* `kvbridge plan-bench`: planner speed against memcpy of the same bytes.
 *
 * One 32K-token request of llama3-70b, page size 16: the blocks prefill rank
 * 0 writes into all of its destination decode ranks, with random destination
 * pages (and, for TP4→TP4, also contiguous ones, where everything must merge
 * into layers × 2 blocks). Planning touches no KV memory, so the buffers'
 * base addresses are synthetic; memcpy copies the same byte count between
 * two real 64 MiB buffers in the same run. Each case is planned twice: by
 * kvb_plan_blocks (one block per row of a head slice) and by
 * kvb_plan_strided_blocks (one strided block per buffer and page run); both
 * must move the same bytes. */
#include <kvbridge/plan.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tools.h"

#define BENCH_TOKENS 32768u
#define BENCH_PAGE 16u
#define MEMCPY_BUF (64u << 20)

typedef struct bench_case {
    const char *name;
    uint32_t ptp, dtp;
    int contiguous;
    int whole; /* plan the request in one call instead of chunk by chunk */
} bench_case_t;

typedef struct bench_result {
    double plan_us, memcpy_us;
    size_t blocks;
    uint64_t bytes;
    double strided_us;     /* kvb_plan_strided_blocks for the same request */
    size_t strided_blocks; /* its descriptors */
} bench_result_t;

/* One request's planning: what both planners are timed on. */
typedef struct bench_req {
    const bench_case_t *bc;
    kvb_plan_h plan;
    const kvb_plan_route_t *routes;
    kvb_plan_buffers_t sb, db;
    const int32_t *sp, *dp;
    uint32_t pages, step;
    int iters;
} bench_req_t;

/* Both planners' outputs, reused from chunk to chunk. */
typedef struct bench_out {
    kvb_plan_blocks_t plain;
    kvb_plan_strided_t strided;
} bench_out_t;

static uint64_t g_bench_rng = 0x1234567;
static uint64_t bench_rnd(void)
{
    uint64_t z = (g_bench_rng += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static double time_memcpy(uint64_t bytes, uint8_t *a, uint8_t *b)
{
    double best = 0;
    for (int rep = 0; rep < 3; rep++) {
        double t0 = kvb_tool_now();
        for (uint64_t done = 0; done < bytes;) {
            size_t n = bytes - done < MEMCPY_BUF ? (size_t)(bytes - done) : MEMCPY_BUF;
            memcpy((rep & 1) ? a : b, (rep & 1) ? b : a, n);
            done += n;
        }
        double t = kvb_tool_now() - t0;
        if (rep == 0 || t < best)
            best = t;
    }
    return best * 1e6;
}

/* Prefill rank 0 really serves decode rank d. */
static int serves(const kvb_plan_route_t *r)
{
    for (uint32_t k = 0; k < r->num_sources; k++)
        if (r->sources[k].prefill_rank == 0 && !r->sources[k].dummy)
            return 1;
    return 0;
}

/* One chunk for every decode rank prefill rank 0 serves, into a reset
 * output; adds its descriptors and bytes. */
static int plan_chunk(const bench_req_t *q, const kvb_plan_chunk_t *ch, int strided, bench_out_t *o,
                      size_t *blocks_p, uint64_t *bytes_p)
{
    o->plain.count = o->strided.count = 0;
    o->plain.bytes = o->strided.bytes = 0;
    for (uint32_t d = 0; d < q->bc->dtp; d++) {
        if (!serves(&q->routes[d]))
            continue;
        kvb_status_t st =
            strided ? kvb_plan_strided_blocks(q->plan, 0, d, &q->sb, &q->db, ch, &o->strided)
                    : kvb_plan_blocks(q->plan, 0, d, &q->sb, &q->db, ch, &o->plain);
        if (st != KVB_OK) {
            fprintf(stderr, "plan-bench %s: %s\n", q->bc->name, kvb_plan_last_error());
            return -1;
        }
    }
    *blocks_p += strided ? o->strided.count : o->plain.count;
    *bytes_p += strided ? o->strided.bytes : o->plain.bytes;
    return 0;
}

/* Best time of q->iters runs over the request (one more first, which grows
 * the arrays), in µs; the sender plans each chunk as it is ready and hands
 * its blocks to the engine, reusing the array. */
static int time_planner(const bench_req_t *q, int strided, bench_out_t *o, double *us_p,
                        size_t *blocks_p, uint64_t *bytes_p)
{
    kvb_plan_chunk_t ch;
    memset(&ch, 0, sizeof(ch));
    double best = 0;
    for (int it = 0; it < q->iters + 1; it++) {
        *blocks_p = 0;
        *bytes_p = 0;
        double t0 = kvb_tool_now();
        for (uint32_t first = 0; first < q->pages; first += q->step) {
            ch.src_pages = q->sp + first;
            ch.dst_pages = q->dp + first;
            ch.num_pages = q->pages - first < q->step ? q->pages - first : q->step;
            if (plan_chunk(q, &ch, strided, o, blocks_p, bytes_p) != 0)
                return -1;
        }
        double t = kvb_tool_now() - t0;
        if (it == 1 || (it > 1 && t < best))
            best = t;
    }
    *us_p = best * 1e6;
    return 0;
}

/* Source pages 0.., destination pages random distinct out of the pool (or
 * 0.. when contiguous); synthetic, non-adjacent buffer bases (1 TiB apart). */
static void bench_pages(const bench_case_t *bc, int32_t *sp, int32_t *dp, uint32_t pages,
                        uint32_t pool, uint64_t *sa, uint64_t *da, uint32_t nkv)
{
    for (uint32_t i = 0; i < pages; i++)
        sp[i] = (int32_t)i;
    for (uint32_t i = 0; i < pool; i++)
        dp[i] = (int32_t)i;
    if (!bc->contiguous)
        for (uint32_t i = 0; i < pages; i++) {
            uint32_t j = i + (uint32_t)(bench_rnd() % (pool - i));
            int32_t x = dp[i];
            dp[i] = dp[j];
            dp[j] = x;
        }
    for (uint32_t i = 0; i < nkv; i++) {
        sa[i] = (1ull << 44) + (uint64_t)i * (1ull << 40);
        da[i] = (1ull << 46) + (uint64_t)i * (1ull << 40);
    }
}

/* Both planners on the request, then memcpy of its bytes. */
static int time_both(const bench_req_t *q, uint8_t *ma, uint8_t *mb, bench_result_t *res_p)
{
    bench_out_t o;
    kvb_plan_blocks_init(&o.plain);
    kvb_plan_strided_init(&o.strided);
    uint64_t sbytes = 0;
    int rc = time_planner(q, 0, &o, &res_p->plan_us, &res_p->blocks, &res_p->bytes);
    if (rc == 0)
        rc = time_planner(q, 1, &o, &res_p->strided_us, &res_p->strided_blocks, &sbytes);
    kvb_plan_blocks_free(&o.plain);
    kvb_plan_strided_free(&o.strided);
    if (rc == 0 && sbytes != res_p->bytes) {
        fprintf(stderr, "plan-bench %s: strided planner moves %llu bytes, plain %llu\n",
                q->bc->name, (unsigned long long)sbytes, (unsigned long long)res_p->bytes);
        rc = -1;
    }
    if (rc == 0)
        res_p->memcpy_us = time_memcpy(res_p->bytes, ma, mb);
    return rc;
}

static int run_case(const bench_case_t *bc, const kvb_plan_model_t *model, int iters,
                    uint32_t chunk_pages, uint8_t *ma, uint8_t *mb, bench_result_t *res_p)
{
    uint32_t pages = BENCH_TOKENS / BENCH_PAGE, pool = 4 * pages;
    uint32_t nkv = 2 * model->num_layers;
    kvb_plan_layout_t pl, dl;
    kvb_plan_layout_from_model(model, bc->ptp, 0, 1, 0, BENCH_PAGE, &pl);
    kvb_plan_layout_from_model(model, bc->dtp, 0, 1, 0, BENCH_PAGE, &dl);
    pl.field_mask |= KVB_PLAN_LAYOUT_POOL;
    dl.field_mask |= KVB_PLAN_LAYOUT_POOL;
    pl.kv_pool_pages = dl.kv_pool_pages = pool;
    kvb_plan_h plan;
    if (kvb_plan_create(&pl, &dl, &plan) != KVB_OK) {
        fprintf(stderr, "plan-bench %s: %s\n", bc->name, kvb_plan_last_error());
        return -1;
    }
    int32_t *sp = malloc(pages * sizeof(int32_t)), *dp = malloc(pool * sizeof(int32_t));
    uint64_t *sa = malloc(nkv * sizeof(uint64_t)), *da = malloc(nkv * sizeof(uint64_t));
    kvb_plan_route_t routes[KVB_PLAN_MAX_TP];
    int rc = -1;
    if (!sp || !dp || !sa || !da)
        goto out;
    bench_pages(bc, sp, dp, pages, pool, sa, da, nkv);
    for (uint32_t d = 0; d < bc->dtp; d++)
        if (kvb_plan_route(plan, d, &routes[d]) != KVB_OK)
            goto out;
    bench_req_t q = {
        bc,   plan, routes, {.kv = sa}, {.kv = da}, sp, dp, pages, bc->whole ? pages : chunk_pages,
        iters};
    rc = time_both(&q, ma, mb, res_p);
out:
    free(sp);
    free(dp);
    free(sa);
    free(da);
    kvb_plan_destroy(plan);
    return rc;
}

static int write_json(const char *json, const bench_case_t *cases, const bench_result_t *res,
                      size_t n)
{
    FILE *f = strcmp(json, "-") == 0 ? stdout : fopen(json, "w");
    if (f == NULL) {
        fprintf(stderr, "kvbridge plan-bench: cannot write %s\n", json);
        return -1;
    }
    fprintf(f, "[");
    for (size_t i = 0; i < n; i++) {
        const bench_result_t *r = &res[i];
        fprintf(f,
                "%s\n  {\"case\": \"%s\", \"plan_us\": %.1f, \"blocks\": %zu, \"memcpy_us\": "
                "%.1f, \"ratio\": %.4f, \"strided_plan_us\": %.1f, \"strided_blocks\": %zu, "
                "\"strided_ratio\": %.5f}",
                i ? "," : "", cases[i].name, r->plan_us, r->blocks, r->memcpy_us,
                r->plan_us / r->memcpy_us, r->strided_us, r->strided_blocks,
                r->strided_us / r->memcpy_us);
    }
    fprintf(f, "\n]\n");
    if (f != stdout)
        fclose(f);
    return 0;
}

int kvb_cmd_plan_bench(int argc, char **argv)
{
    const char *json = NULL;
    long long iters = 5, chunk_tokens = 1024;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            printf("usage: kvbridge plan-bench [--json FILE] [--iters N] [--chunk-tokens T]\n\n"
                   "Plans the blocks prefill rank 0 writes for one %u-token llama3-70b request\n"
                   "(page size %u, random destination pages) for TP4→TP4, TP8→TP2, TP2→TP8,\n"
                   "chunk by chunk (T tokens, default 1024, the array reused per chunk), and\n"
                   "'-whole' in one call; TP4→TP4 with contiguous pages in one call. Prints the\n"
                   "best planning time of N runs (default 5) and the block count of\n"
                   "kvb_plan_blocks, memcpy's time for the same bytes (64 MiB copies), and\n"
                   "the same for kvb_plan_strided_blocks (strided_us, s_blocks, s_ratio).\n",
                   BENCH_TOKENS, BENCH_PAGE);
            return 0;
        } else if (strcmp(argv[i], "--json") == 0 && i + 1 < argc) {
            json = argv[++i];
        } else if (strcmp(argv[i], "--chunk-tokens") == 0 && i + 1 < argc) {
            if (!kvb_tool_parse_int("--chunk-tokens", argv[++i], BENCH_PAGE, BENCH_TOKENS,
                                    &chunk_tokens))
                return 2;
            if (chunk_tokens % BENCH_PAGE != 0) {
                fprintf(stderr, "kvbridge plan-bench: --chunk-tokens must be a multiple of %u\n",
                        BENCH_PAGE);
                return 2;
            }
        } else if (strcmp(argv[i], "--iters") == 0 && i + 1 < argc) {
            if (!kvb_tool_parse_int("--iters", argv[++i], 1, 1000, &iters))
                return 2;
        } else {
            fprintf(stderr, "kvbridge plan-bench: unknown option %s\n", argv[i]);
            return 2;
        }
    }
    kvb_plan_model_t model;
    if (kvb_plan_model_preset("llama3-70b", &model) != KVB_OK)
        return 1;
    static const bench_case_t cases[] = {
        {"tp4-tp4", 4, 4, 0, 0},       {"tp8-tp2", 8, 2, 0, 0},
        {"tp2-tp8", 2, 8, 0, 0},       {"tp4-tp4-contiguous", 4, 4, 1, 1},
        {"tp4-tp4-whole", 4, 4, 0, 1}, {"tp8-tp2-whole", 8, 2, 0, 1},
        {"tp2-tp8-whole", 2, 8, 0, 1},
    };
    enum { NCASES = sizeof(cases) / sizeof(cases[0]) };
    bench_result_t res[NCASES];
    uint8_t *ma = malloc(MEMCPY_BUF), *mb = malloc(MEMCPY_BUF);
    if (ma == NULL || mb == NULL) {
        free(ma);
        free(mb);
        fprintf(stderr, "kvbridge plan-bench: out of memory\n");
        return 1;
    }
    memset(ma, 1, MEMCPY_BUF);
    memset(mb, 2, MEMCPY_BUF);
    int rc = 0;
    printf("%-20s %12s %10s %14s %12s %8s %11s %9s %8s\n", "case", "plan_us", "blocks", "bytes",
           "memcpy_us", "ratio", "strided_us", "s_blocks", "s_ratio");
    for (size_t i = 0; i < NCASES; i++) {
        if (run_case(&cases[i], &model, (int)iters, (uint32_t)(chunk_tokens / BENCH_PAGE), ma, mb,
                     &res[i]) != 0) {
            rc = 1;
            break;
        }
        const bench_result_t *r = &res[i];
        printf("%-20s %12.1f %10zu %14llu %12.1f %7.2f%% %11.1f %9zu %7.3f%%\n", cases[i].name,
               r->plan_us, r->blocks, (unsigned long long)r->bytes, r->memcpy_us,
               100.0 * r->plan_us / r->memcpy_us, r->strided_us, r->strided_blocks,
               100.0 * r->strided_us / r->memcpy_us);
        fflush(stdout);
    }
    free(ma);
    free(mb);
    if (rc != 0)
        return rc;
    if (res[3].blocks != 2u * model.num_layers || res[3].strided_blocks != 2u * model.num_layers) {
        fprintf(stderr,
                "plan-bench: contiguous TP4→TP4 gave %zu blocks, %zu strided, want layers × 2 "
                "= %u\n",
                res[3].blocks, res[3].strided_blocks, 2u * model.num_layers);
        rc = 1;
    }
    if (json != NULL && write_json(json, cases, res, NCASES) != 0)
        return 1;
    return rc;
}
