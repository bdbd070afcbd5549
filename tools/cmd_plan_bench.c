/* `kvbridge plan-bench`: planner speed against memcpy of the same bytes.
 *
 * One 32K-token request of llama3-70b, page size 16: the blocks prefill rank
 * 0 writes into all of its destination decode ranks, with random destination
 * pages (and, for TP4→TP4, also contiguous ones, where everything must merge
 * into layers × 2 blocks). Planning touches no KV memory, so the buffers'
 * base addresses are synthetic; memcpy copies the same byte count between
 * two real 64 MiB buffers in the same run. */
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
} bench_result_t;

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
    int rc = -1;
    if (!sp || !dp || !sa || !da)
        goto out;
    for (uint32_t i = 0; i < pages; i++)
        sp[i] = (int32_t)i;
    for (uint32_t i = 0; i < pool; i++)
        dp[i] = (int32_t)i;
    if (!bc->contiguous) /* random distinct destination pages out of the pool */
        for (uint32_t i = 0; i < pages; i++) {
            uint32_t j = i + (uint32_t)(bench_rnd() % (pool - i));
            int32_t x = dp[i];
            dp[i] = dp[j];
            dp[j] = x;
        }
    /* synthetic, non-adjacent buffer bases (1 TiB apart) */
    for (uint32_t i = 0; i < nkv; i++) {
        sa[i] = (1ull << 44) + (uint64_t)i * (1ull << 40);
        da[i] = (1ull << 46) + (uint64_t)i * (1ull << 40);
    }
    kvb_plan_buffers_t sb = {.kv = sa}, db = {.kv = da};
    kvb_plan_chunk_t ch;
    memset(&ch, 0, sizeof(ch));
    ch.src_pages = sp;
    ch.dst_pages = dp;
    ch.num_pages = pages;
    kvb_plan_route_t routes[KVB_PLAN_MAX_TP];
    kvb_plan_blocks_t out;
    kvb_plan_blocks_init(&out);
    double best = 0;
    for (uint32_t d = 0; d < bc->dtp; d++)
        if (kvb_plan_route(plan, d, &routes[d]) != KVB_OK)
            goto out_blocks;
    uint32_t step = bc->whole ? pages : chunk_pages;
    size_t blocks = 0;
    uint64_t bytes = 0;
    for (int it = 0; it < iters + 1; it++) { /* the first run grows the array */
        blocks = 0;
        bytes = 0;
        double t0 = kvb_tool_now();
        /* The sender plans each chunk as it is ready and hands its blocks to
         * the engine; the array is reused from chunk to chunk. */
        for (uint32_t first = 0; first < pages; first += step) {
            ch.src_pages = sp + first;
            ch.dst_pages = dp + first;
            ch.num_pages = pages - first < step ? pages - first : step;
            out.count = 0;
            out.bytes = 0;
            for (uint32_t d = 0; d < bc->dtp; d++) {
                int real = 0;
                for (uint32_t k = 0; k < routes[d].num_sources; k++)
                    real |= routes[d].sources[k].prefill_rank == 0 && !routes[d].sources[k].dummy;
                if (real && kvb_plan_blocks(plan, 0, d, &sb, &db, &ch, &out) != KVB_OK) {
                    fprintf(stderr, "plan-bench %s: %s\n", bc->name, kvb_plan_last_error());
                    goto out_blocks;
                }
            }
            blocks += out.count;
            bytes += out.bytes;
        }
        double t = kvb_tool_now() - t0;
        if (it == 1 || (it > 1 && t < best))
            best = t;
    }
    res_p->plan_us = best * 1e6;
    res_p->blocks = blocks;
    res_p->bytes = bytes;
    res_p->memcpy_us = time_memcpy(bytes, ma, mb);
    rc = 0;
out_blocks:
    kvb_plan_blocks_free(&out);
out:
    free(sp);
    free(dp);
    free(sa);
    free(da);
    kvb_plan_destroy(plan);
    return rc;
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
                   "best planning time of N runs (default 5), the block count, and memcpy's\n"
                   "time for the same bytes (64 MiB copies).\n",
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
    printf("%-20s %12s %10s %14s %12s %8s\n", "case", "plan_us", "blocks", "bytes", "memcpy_us",
           "ratio");
    for (size_t i = 0; i < NCASES; i++) {
        if (run_case(&cases[i], &model, (int)iters, (uint32_t)(chunk_tokens / BENCH_PAGE), ma, mb,
                     &res[i]) != 0) {
            rc = 1;
            break;
        }
        printf("%-20s %12.1f %10zu %14llu %12.1f %7.2f%%\n", cases[i].name, res[i].plan_us,
               res[i].blocks, (unsigned long long)res[i].bytes, res[i].memcpy_us,
               100.0 * res[i].plan_us / res[i].memcpy_us);
        fflush(stdout);
    }
    free(ma);
    free(mb);
    if (rc != 0)
        return rc;
    if (res[3].blocks != 2u * model.num_layers) {
        fprintf(stderr, "plan-bench: contiguous TP4→TP4 gave %zu blocks, want layers × 2 = %u\n",
                res[3].blocks, 2u * model.num_layers);
        rc = 1;
    }
    if (json != NULL) {
        FILE *f = strcmp(json, "-") == 0 ? stdout : fopen(json, "w");
        if (f == NULL) {
            fprintf(stderr, "kvbridge plan-bench: cannot write %s\n", json);
            return 1;
        }
        fprintf(f, "[");
        for (size_t i = 0; i < NCASES; i++)
            fprintf(f,
                    "%s\n  {\"case\": \"%s\", \"plan_us\": %.1f, \"blocks\": %zu, \"memcpy_us\": "
                    "%.1f, \"ratio\": %.4f}",
                    i ? "," : "", cases[i].name, res[i].plan_us, res[i].blocks, res[i].memcpy_us,
                    res[i].plan_us / res[i].memcpy_us);
        fprintf(f, "\n]\n");
        if (f != stdout)
            fclose(f);
    }
    return rc;
}
