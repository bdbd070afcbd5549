/* `kvbridge bench` yardsticks (memcpy, raw TCP, planner cost), progress and
 * the report (table, JSON). */
#include "bench_common.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "eb_util.h"
#include "tools.h"

#define BASE_REPS 3
#define BASE_MAX_BYTES ((size_t)1 << 30)
#define PLAN_SAMPLES 4

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median3(double *v)
{
    qsort(v, BASE_REPS, sizeof(*v), cmp_double);
    return v[BASE_REPS / 2];
}

/* ------------------------------------------------------------ baselines */

static double memcpy_gbps(uint8_t *dst, const uint8_t *src, size_t buf, uint64_t volume)
{
    double t[BASE_REPS];
    for (int r = 0; r < BASE_REPS; r++) {
        double t0 = kvb_tool_now();
        for (uint64_t off = 0; off < volume; off += buf) {
            size_t n = volume - off < buf ? (size_t)(volume - off) : buf;
            memcpy(dst, src, n);
        }
        t[r] = kvb_tool_now() - t0;
    }
    return (double)volume / median3(t) / 1e9;
}

#define PAGES_POOL ((size_t)1 << 30)
#define PAGES_MAX_SLOTS ((size_t)1 << 20)

/* memcpy of `run`-byte runs between random slots of two 1 GiB buffers, the
 * volume of one request: the copy floor of a transfer whose pages lie
 * scattered over the pools (one run = one layer buffer's share of one
 * decode page). Smaller pools than the ranks' (fewer TLB misses), so an
 * upper bound of that floor. 0 when memory is short. */
static double memcpy_pages_gbps(uint64_t run, uint64_t volume)
{
    size_t slots = run > 0 ? PAGES_POOL / run : 0, n = run > 0 ? (size_t)(volume / run) : 0;
    if (slots > PAGES_MAX_SLOTS) /* tiny custom geometries: bound the tables */
        slots = PAGES_MAX_SLOTS;
    size_t pool = slots * run;
    uint8_t *a = kvb_eb_alloc(pool), *b = kvb_eb_alloc(pool);
    uint32_t *ps = malloc(slots * sizeof(uint32_t)), *pd = malloc(slots * sizeof(uint32_t));
    double t[BASE_REPS], gbps = 0;
    if (a != NULL && b != NULL && ps != NULL && pd != NULL && run > 0 && slots > 0 && n > 0) {
        kvb_eb_permute(ps, slots, 11);
        kvb_eb_permute(pd, slots, 12);
        for (int r = 0; r < BASE_REPS; r++) {
            double t0 = kvb_tool_now();
            for (size_t i = 0; i < n; i++)
                memcpy(b + (size_t)pd[i % slots] * run, a + (size_t)ps[(i * 7 + 3) % slots] * run,
                       run);
            t[r] = kvb_tool_now() - t0;
        }
        gbps = (double)n * (double)run / median3(t) / 1e9;
    }
    kvb_eb_free(a, pool);
    kvb_eb_free(b, pool);
    free(ps);
    free(pd);
    return gbps;
}

typedef struct sink_arg {
    int lfd;
    void *buf;
    size_t bytes;
    int reps;
} sink_arg_t;

static void *sink_main(void *p)
{
    sink_arg_t *a = p;
    for (int r = 0; r < a->reps; r++)
        if (!kvb_eb_sink_one(a->lfd, a->buf, a->bytes))
            break;
    return NULL;
}

/* One plain TCP stream of bytes over loopback (the tcp lane's yardstick). */
static double tcp_gbps(const char *host, uint8_t *dst, const uint8_t *src, size_t bytes)
{
    uint16_t port = 0;
    double t[BASE_REPS];
    pthread_t th;
    sink_arg_t a = {.buf = dst, .bytes = bytes, .reps = BASE_REPS};
    a.lfd = kvb_eb_listen(host, &port);
    if (a.lfd < 0 || pthread_create(&th, NULL, sink_main, &a) != 0) {
        if (a.lfd >= 0)
            close(a.lfd);
        return 0;
    }
    bool ok = true;
    for (int r = 0; r < BASE_REPS && ok; r++)
        ok = kvb_eb_send_stream(host, port, src, bytes, &t[r]);
    if (!ok)
        shutdown(a.lfd, 2);
    pthread_join(th, NULL);
    close(a.lfd);
    return ok ? (double)bytes / median3(t) / 1e9 : 0;
}

static void model_of(const bench_opts_t *o, kvb_plan_model_t *pm)
{
    pm->name = o->m.name;
    pm->attn = o->m.mla ? KVB_PLAN_MLA : KVB_PLAN_MHA;
    pm->num_layers = (uint32_t)o->m.layers;
    pm->kv_heads = (uint32_t)o->m.kv_heads;
    pm->head_dim = (uint32_t)o->m.head_dim;
    pm->dtype_bytes = (uint32_t)o->m.dtype_bytes;
}

/* Fake, non-overlapping base addresses (the planner does no I/O). */
static void fake_bases(uint64_t *kv, int n, uint64_t origin)
{
    for (int i = 0; i < n; i++)
        kv[i] = origin + (uint64_t)i * (1ull << 36);
}

/* Blocks of one request for every (prefill rank, decode rank) pair of one
 * PP stage, as the connector plans them (strided blocks); false on a
 * planner error. */
static bool plan_stage(const bench_opts_t *o, int pp, const int32_t *src, const int32_t *dst,
                       uint32_t n, kvb_plan_strided_t *out, double *secs)
{
    kvb_plan_model_t pm;
    kvb_plan_layout_t pl, dl;
    kvb_plan_h plan;
    uint64_t skv[2 * 1024], dkv[2 * 1024];
    model_of(o, &pm);
    kvb_plan_layout_from_model(&pm, (uint32_t)o->ptp, 0, (uint32_t)o->ppp, (uint32_t)pp,
                               (uint32_t)o->page, &pl);
    kvb_plan_layout_from_model(&pm, (uint32_t)o->dtp, 0, 1, 0, (uint32_t)o->dpage, &dl);
    dl.field_mask |= KVB_PLAN_LAYOUT_ORDER;
    dl.kv_order = (kvb_plan_order_t)o->dorder;
    if (kvb_plan_create(&pl, &dl, &plan) != KVB_OK)
        return false;
    fake_bases(skv, 2 * o->m.layers, 1ull << 44);
    fake_bases(dkv, 2 * o->m.layers, 1ull << 46);
    kvb_plan_buffers_t sb = {.kv = skv}, db = {.kv = dkv};
    /* the decode's own pages, rows as the connector sends them */
    kvb_plan_chunk_t ch = {.field_mask = KVB_PLAN_CHUNK_DST_PAGES | KVB_PLAN_CHUNK_END,
                           .src_pages = src,
                           .dst_pages = dst,
                           .num_pages = n,
                           .num_dst_pages = (size_t)bench_decode_pages_per_request(o),
                           .end_tokens = bench_rows_sent(o)};
    bool ok = true;
    double t0 = kvb_tool_now();
    for (int d = 0; d < o->dtp && ok; d++) {
        kvb_plan_route_t rt;
        ok = kvb_plan_route(plan, (uint32_t)d, &rt) == KVB_OK;
        for (uint32_t s = 0; ok && s < rt.num_sources; s++) {
            out->count = 0;
            if (!rt.sources[s].dummy)
                ok = kvb_plan_strided_blocks(plan, rt.sources[s].prefill_rank, (uint32_t)d, &sb,
                                             &db, &ch, out) == KVB_OK;
        }
    }
    *secs += kvb_tool_now() - t0;
    kvb_plan_destroy(plan);
    return ok;
}

static double plan_us(const bench_opts_t *o)
{
    uint32_t n = (uint32_t)bench_pages_per_request(o),
             nd = (uint32_t)bench_decode_pages_per_request(o);
    uint32_t m = n > nd ? n : nd;
    uint32_t *perm = malloc((size_t)m * 4 * sizeof(uint32_t));
    int32_t *src = malloc((size_t)n * sizeof(int32_t)), *dst = malloc((size_t)nd * sizeof(int32_t));
    kvb_plan_strided_t out;
    double secs = 0;
    bool ok = perm && src && dst && o->m.layers <= 1024;
    kvb_plan_strided_init(&out);
    for (int s = 0; ok && s < PLAN_SAMPLES; s++) {
        kvb_eb_permute(perm, (size_t)m * 4, (uint64_t)s + 1);
        for (uint32_t i = 0; i < n; i++)
            src[i] = (int32_t)perm[i];
        for (uint32_t i = 0; i < nd; i++)
            dst[i] = (int32_t)perm[m * 4 - 1 - i];
        for (int p = 0; ok && p < o->ppp; p++)
            ok = plan_stage(o, p, src, dst, n, &out, &secs);
    }
    if (!ok && perm && src && dst)
        fprintf(stderr, "kvbridge: bench: planner: %s\n", kvb_plan_last_error());
    kvb_plan_strided_free(&out);
    free(perm);
    free(src);
    free(dst);
    return ok ? secs / PLAN_SAMPLES * 1e6 : -1;
}

void bench_baselines(const bench_opts_t *o, bench_report_t *rep)
{
    uint64_t volume = bench_request_bytes(o);
    size_t buf = volume < BASE_MAX_BYTES ? (size_t)volume : BASE_MAX_BYTES;
    uint8_t *a = kvb_eb_alloc(buf), *b = kvb_eb_alloc(buf);
    rep->plan_us = plan_us(o);
    if (a == NULL || b == NULL) {
        fprintf(stderr, "kvbridge: bench: no memory for the memcpy baseline\n");
    } else {
        kvb_eb_fill(a, buf & ~(size_t)7, 42);
        rep->memcpy_gbps = memcpy_gbps(b, a, buf, volume);
        bench_rank_geom_t g;
        bench_rank_geom(o, 0, o->dtp, 0, 1, &g);
        rep->memcpy_pages_gbps = memcpy_pages_gbps(g.item_len, volume);
        if (o->transport == KVB_TRANSPORT_TCP && o->role == BENCH_ROLE_ALL)
            rep->tcp_gbps = tcp_gbps(o->host, b, a, buf);
        if (o->cuda)
            rep->cuda_memcpy_gbps = bench_cuda_memcpy_gbps(o, g.item_len);
    }
    kvb_eb_free(a, buf);
    kvb_eb_free(b, buf);
}

/* ------------------------------------------------------------- progress */

static double rate(const bench_phase_t *p)
{
    return p->seconds > 0 ? (double)p->bytes / p->seconds / 1e9 : 0;
}

/* The phase the progress line shows: the warm-up until the timed requests
 * start. */
static const bench_phase_t *shown(const bench_report_t *r)
{
    return r->done < r->warm_requests ? &r->cold : &r->steady;
}

void bench_progress(const bench_opts_t *o, bench_report_t *rep, bool final)
{
    double now = kvb_tool_now();
    bool tty = isatty(2);
    if (!o->progress || (!final && now - rep->last_progress < (tty ? 0.1 : 1.0)))
        return;
    rep->last_progress = now;
    long long total = rep->warm_requests + rep->requests;
    const bench_phase_t *ph = shown(rep);
    const char *what = ph == &rep->cold ? " (warm-up)" : "";
    if (!tty) {
        fprintf(stderr, "bench: %lld/%lld requests, %.2f GB, %.2f GB/s%s\n", rep->done, total,
                (double)ph->bytes / 1e9, rate(ph), what);
        return;
    }
    char bar[31];
    int fill = total > 0 ? (int)(30 * rep->done / total) : 30;
    for (int i = 0; i < 30; i++)
        bar[i] = i < fill ? '#' : '.';
    bar[30] = '\0';
    fprintf(stderr, "\r[%s] %lld/%lld requests  %.2f GB  %.2f GB/s%-10s%s", bar, rep->done, total,
            (double)ph->bytes / 1e9, rate(ph), what, final ? "\n" : "");
}

/* --------------------------------------------------------------- report */

static double pct(const bench_phase_t *r, double p)
{
    if (r->nlat == 0)
        return 0;
    double *v = malloc((size_t)r->nlat * sizeof(double));
    if (v == NULL)
        return 0;
    memcpy(v, r->lat_ms, (size_t)r->nlat * sizeof(double));
    qsort(v, (size_t)r->nlat, sizeof(double), cmp_double);
    size_t i = (size_t)ceil(p / 100.0 * (double)r->nlat);
    double x = v[i > 0 ? i - 1 : 0];
    free(v);
    return x;
}

const char *const bench_stage_names[BENCH_ST_N] = {
    "decode_bootstrap", "decode_transfer", "decode_total", "prefill_wait_decode", "prefill_write"};

/* The timed requests' stages from the rooms' timelines (none when they are
 * off: KVBRIDGE_TIMELINE=0). */
static void print_stages(const bench_report_t *r)
{
    bool any = false;
    for (int k = 0; k < BENCH_ST_N; k++)
        any |= r->stage[k].nlat > 0;
    if (!any)
        return;
    printf("  %-22s", "stages ms p50/p99");
    for (int k = 0; k < BENCH_ST_N; k++)
        if (r->stage[k].nlat > 0)
            printf(" %s %.3f/%.3f", bench_stage_names[k], pct(&r->stage[k], 50),
                   pct(&r->stage[k], 99));
    printf("\n");
}

static void json_stages(FILE *f, const bench_report_t *r)
{
    fprintf(f, "\"stage_ms\": {");
    for (int k = 0, n = 0; k < BENCH_ST_N; k++)
        if (r->stage[k].nlat > 0)
            fprintf(f, "%s\"%s\": {\"p50\": %.4f, \"p99\": %.4f}", n++ ? ", " : "",
                    bench_stage_names[k], pct(&r->stage[k], 50), pct(&r->stage[k], 99));
    fprintf(f, "}, ");
}

/* --scale: per-room figures of the timed requests. */
static double cpu_us_per_room(const bench_report_t *r)
{
    return r->requests > 0 ? r->cpu_s * 1e6 / (double)r->requests : 0;
}

static double bytes_per_room(const bench_report_t *r)
{
    return r->max_inflight > 0
               ? (r->rss_peak_kib - r->rss_idle_kib) * 1024.0 / (double)r->max_inflight
               : 0;
}

/* --hold: (children's VmRSS with the held rooms set up - before) / rooms. */
static double held_bytes_per_room(const bench_opts_t *o, const bench_report_t *r)
{
    return o->hold > 0 ? (r->rss_held_kib - r->rss_prehold_kib) * 1024.0 / (double)o->hold : 0;
}

/* --scale traffic figures: control messages per timed room, and per rank
 * and second of the timed window, heartbeats (decode ranks) and bootstrap
 * requests (all ranks). */
typedef struct scale_traffic {
    double ctl_sent_per_room, ctl_recv_per_room, hb_per_dec_rank_s, boot_per_rank_s;
} scale_traffic_t;

static scale_traffic_t scale_traffic(const bench_opts_t *o, const bench_report_t *r)
{
    scale_traffic_t t = {0, 0, 0, 0};
    double rooms = (double)r->requests, s = r->timed_wall_s > 0 ? r->timed_wall_s : 1;
    int ranks = o->ptp * o->ppp * o->dp + o->dtp;
    if (rooms > 0) {
        t.ctl_sent_per_room = r->traffic[BENCH_TR_CTL_SENT] / rooms;
        t.ctl_recv_per_room = r->traffic[BENCH_TR_CTL_RECV] / rooms;
    }
    t.hb_per_dec_rank_s = r->traffic[BENCH_TR_HB] / o->dtp / s;
    t.boot_per_rank_s = (r->traffic[BENCH_TR_BOOT_PRE] + r->traffic[BENCH_TR_BOOT_DEC]) / ranks / s;
    return t;
}

static void print_scale(const bench_opts_t *o, const bench_report_t *r)
{
    scale_traffic_t t = scale_traffic(o, r);
    int k = bench_ranks_per_proc(o);
    char mode[64] = "one process per rank";
    if (k > 1)
        snprintf(mode, sizeof(mode), "up to %d managers per process", k);
    printf("  %-22s %d prefill + %d decode ranks in %d processes (%s)\n", "scale",
           o->ptp * o->ppp * o->dp, o->dtp, r->nprocs, mode);
    printf("  %-22s %.1f us CPU (all processes), %.0f B RSS (%lld rooms held at most)\n",
           "per room", cpu_us_per_room(r), bytes_per_room(r), r->max_inflight);
    printf("  %-22s %.2f control messages sent, %.2f received (all ranks; %.0f dropped)\n", "",
           t.ctl_sent_per_room, t.ctl_recv_per_room, r->traffic[BENCH_TR_CTL_FAILED]);
    printf("  %-22s %.3f heartbeats/s per decode rank, %.3f bootstrap requests/s per rank "
           "(%.0f prefill + %.0f decode in %.1f s; %d/%d ranks answered)\n",
           "per rank", t.hb_per_dec_rank_s, t.boot_per_rank_s, r->traffic[BENCH_TR_BOOT_PRE],
           r->traffic[BENCH_TR_BOOT_DEC], r->timed_wall_s, r->traffic_answers / 2,
           r->traffic_ranks);
    printf("  %-22s %.3f heartbeats/s per decode rank over the whole run (%.0f in %.1f s)\n", "",
           r->run_wall_s > 0 ? r->hb_total / o->dtp / r->run_wall_s : 0, r->hb_total,
           r->run_wall_s);
    printf("  %-22s %s (KVBRIDGE_BENCH_POLL)\n", "ranks poll", bench_poll_name());
    if (o->hold > 0)
        printf("  %-22s %lld rooms held in flight on every rank during the timed requests "
               "(latency above: with them in flight); after them %lld verified, %lld failed; "
               "%.0f B RSS per held room\n",
               "held", o->hold, r->held_verified, r->held_failed, held_bytes_per_room(o, r));
}

/* --layerwise: the share of the final mode's exposed transfer time that
 * layerwise sends hide, at percentile p; 0 without figures. */
static double hidden_share(const bench_report_t *r, double p)
{
    double fin = pct(&r->exposed[BENCH_LW_FINAL], p), lw = pct(&r->exposed[BENCH_LW_LAYERWISE], p);
    return fin > 0 && r->exposed[BENCH_LW_LAYERWISE].nlat > 0 ? 1 - lw / fin : 0;
}

static void print_layerwise(const bench_opts_t *o, const bench_report_t *r)
{
    static const char *names[2] = {"final", "layerwise"};
    int L = o->m.layers / o->ppp;
    printf("  %-22s %.3g ms per layer x %d layers per chunk, one forward at a time per prefill "
           "rank (the throughput above includes it)\n",
           "layerwise compute", o->layerwise_ms, L);
    printf("  %-22s %lld layerwise (each layer sent as its compute ends), %lld final (each "
           "chunk sent after its last layer), alternating\n",
           "layerwise rooms", r->exposed[BENCH_LW_LAYERWISE].nlat, r->exposed[BENCH_LW_FINAL].nlat);
    for (int m = BENCH_LW_LAYERWISE; m >= BENCH_LW_FINAL; m--) {
        char key[32];
        snprintf(key, sizeof(key), "exposed ms, %s", names[m]);
        printf("  %-22s p50 %.2f  p99 %.2f  (decode Success - end of the prefill's compute; "
               "forward start -> Success: p50 %.2f)\n",
               key, pct(&r->exposed[m], 50), pct(&r->exposed[m], 99), pct(&r->lw_lat[m], 50));
    }
    printf("  %-22s %.1f%% of the final mode's exposed time at p50, %.1f%% at p99 "
           "(1 - layerwise / final)\n",
           "hidden by layerwise", 100 * hidden_share(r, 50), 100 * hidden_share(r, 99));
}

/* KVBRIDGE_INTEGRITY as the ranks read it, and what they counted. */
static void print_integrity(const bench_report_t *r)
{
    const char *v = getenv("KVBRIDGE_INTEGRITY");
    if (v == NULL || strcmp(v, "check") != 0) {
        printf("  %-22s off\n", "integrity");
        return;
    }
    printf("  %-22s check: %llu rooms checked, %llu mismatches, %llu unchecked (%llu digests "
           "sent; %d ranks answered)\n",
           "integrity", r->integ_checked, r->integ_mismatches, r->integ_unchecked, r->integ_sent,
           r->integ_answers);
}

static void print_table(const bench_opts_t *o, const bench_report_t *r)
{
    double g = rate(&r->steady);
    printf("\nkvbridge bench: %s, prefill TP%d PP%d DP%d -> decode TP%d, transport %s%s\n",
           o->m.name, o->ptp, o->ppp, o->dp, o->dtp, bench_transport_name(o->transport),
           r->interrupted ? " (interrupted: partial)" : "");
    printf("  %-22s %lld x %lld tokens (page %d, chunk %lld), %lld in flight\n", "requests",
           r->requests, o->prompt_len, o->page, o->chunk > 0 ? o->chunk : o->prompt_len, o->conc);
    if (o->dpage != o->page || o->dorder != KVB_PLAN_ORDER_NHD)
        printf("  %-22s page %d, %s (prefill: page %d, nhd): rows mapped\n", "decode layout",
               o->dpage, kvb_plan_order_name((kvb_plan_order_t)o->dorder), o->page);
    printf("  %-22s %lld verified, %lld aborted, %lld failed, %lld not run\n", "result",
           r->verified, r->aborted, r->failed, r->requests - r->verified - r->aborted - r->failed);
    printf("  %-22s %.3f GB in %.3f s\n", "bytes moved", (double)r->steady.bytes / 1e9,
           r->steady.seconds);
    printf("  %-22s %.2f GB/s%s\n", "throughput", g,
           r->warm_requests > 0 ? " (steady state, after the warm-up)"
                                : " (from cold, no warm-up)");
    printf("  %-22s %.2f GB/s (ratio %.2f)\n", "memcpy, same volume", r->memcpy_gbps,
           r->memcpy_gbps > 0 ? g / r->memcpy_gbps : 0);
    printf("  %-22s %.2f GB/s (ratio %.2f)\n", "memcpy, page runs", r->memcpy_pages_gbps,
           r->memcpy_pages_gbps > 0 ? g / r->memcpy_pages_gbps : 0);
    if (o->transport == KVB_TRANSPORT_TCP)
        printf("  %-22s %.2f GB/s (ratio %.2f)\n", "raw TCP loopback", r->tcp_gbps,
               r->tcp_gbps > 0 ? g / r->tcp_gbps : 0);
    if (o->cuda)
        printf("  %-22s %.2f GB/s (ratio %.2f), device %d, driver %s%s\n", "CUDA device to device",
               r->cuda_memcpy_gbps, r->cuda_memcpy_gbps > 0 ? g / r->cuda_memcpy_gbps : 0,
               o->cuda_device, bench_cuda_driver(),
               bench_cuda_is_double() ? " (TEST DOUBLE: proves plumbing, not GPU speed)" : "");
    printf("  %-22s p50 %.2f  p90 %.2f  p99 %.2f\n", "latency ms", pct(&r->steady, 50),
           pct(&r->steady, 90), pct(&r->steady, 99));
    print_stages(r);
    printf(
        "  %-22s %.2f GB/s over %lld requests (%s), latency p50 %.2f ms, first request %.2f ms\n",
        "cold first pass", rate(&r->cold), r->cold_requests,
        r->warm_requests > 0 ? "the warm-up" : "the first wave", pct(&r->cold, 50), r->first_ms);
    if (r->warm_requests > 0)
        printf("  %-22s %lld requests, %lld verified, %lld aborted, %lld failed\n", "warm-up",
               r->warm_requests, r->warm_verified, r->warm_aborted, r->warm_failed);
    printf("  %-22s %.1f us per request\n", "planner", r->plan_us);
    print_integrity(r);
    if (o->layerwise_ms >= 0)
        print_layerwise(o, r);
    if (o->scale)
        print_scale(o, r);
    for (int i = 0; i < r->nres; i++)
        printf("  %-22s RSS %ld -> %ld KiB, fds %ld -> %ld\n", r->res[i].name, r->res[i].rss_kib[0],
               r->res[i].rss_kib[1], r->res[i].fds[0], r->res[i].fds[1]);
    fflush(stdout);
}

static void json_str(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s; s++) {
        if (*s == '"' || *s == '\\')
            fprintf(f, "\\%c", *s);
        else if ((unsigned char)*s < 0x20)
            fprintf(f, "\\u%04x", (unsigned)(unsigned char)*s);
        else
            fputc(*s, f);
    }
    fputc('"', f);
}

/* "key": {"process": [warm-up, end], ...}, (--resource-report) */
static void json_res(FILE *f, const bench_report_t *r, const char *key, bool rss)
{
    fprintf(f, "\"%s\": {", key);
    for (int i = 0; i < r->nres; i++) {
        const long *v = rss ? r->res[i].rss_kib : r->res[i].fds;
        fprintf(f, i ? ", " : "");
        json_str(f, r->res[i].name);
        fprintf(f, ": [%ld, %ld]", v[0], v[1]);
    }
    fprintf(f, "}, ");
}

/* "layerwise": {...}, (--layerwise) */
static void json_layerwise(FILE *f, const bench_opts_t *o, const bench_report_t *r)
{
    static const char *names[2] = {"final", "layerwise"};
    fprintf(f, "\"layerwise\": {\"ms_per_layer\": %.6g, \"layers\": %d, ", o->layerwise_ms,
            o->m.layers / o->ppp);
    for (int m = BENCH_LW_LAYERWISE; m >= BENCH_LW_FINAL; m--)
        fprintf(f,
                "\"rooms_%s\": %lld, \"exposed_ms_%s\": {\"p50\": %.4f, \"p99\": %.4f}, "
                "\"latency_ms_%s\": {\"p50\": %.4f, \"p99\": %.4f}, ",
                names[m], r->exposed[m].nlat, names[m], pct(&r->exposed[m], 50),
                pct(&r->exposed[m], 99), names[m], pct(&r->lw_lat[m], 50), pct(&r->lw_lat[m], 99));
    fprintf(f, "\"hidden_share_p50\": %.4f, \"hidden_share_p99\": %.4f}, ", hidden_share(r, 50),
            hidden_share(r, 99));
}

static bool write_json(const bench_opts_t *o, const bench_report_t *r)
{
    FILE *f = fopen(o->json, "w");
    double g = rate(&r->steady);
    if (f == NULL) {
        fprintf(stderr, "kvbridge: bench: cannot write %s\n", o->json);
        return false;
    }
    fprintf(f, "{\"model\": ");
    json_str(f, o->m.name);
    fprintf(f,
            ", \"prefill_tp\": %d, \"decode_tp\": %d, \"prefill_pp\": %d, \"dp\": %d, "
            "\"transport\": \"%s\", \"requests\": %lld, \"verified_requests\": %lld, "
            "\"failed_requests\": %lld, \"aborted\": %lld, \"bytes\": %llu, \"seconds\": %.6f, "
            "\"gbps\": %.4f, "
            "\"memcpy_gbps\": %.4f, \"ratio\": %.4f, \"memcpy_pages_gbps\": %.4f, "
            "\"pages_ratio\": %.4f, ",
            o->ptp, o->dtp, o->ppp, o->dp, bench_transport_name(o->transport), r->requests,
            r->verified, r->failed, r->aborted, (unsigned long long)r->steady.bytes,
            r->steady.seconds, g, r->memcpy_gbps, r->memcpy_gbps > 0 ? g / r->memcpy_gbps : 0,
            r->memcpy_pages_gbps, r->memcpy_pages_gbps > 0 ? g / r->memcpy_pages_gbps : 0);
    if (o->transport == KVB_TRANSPORT_TCP)
        fprintf(f, "\"tcp_gbps\": %.4f, ", r->tcp_gbps);
    if (o->cuda) {
        fprintf(f,
                "\"memory\": \"cuda\", \"cuda_device\": %d, \"cuda_memcpy_gbps\": %.4f, "
                "\"cuda_ratio\": %.4f, \"cuda_test_double\": %s, \"cuda_driver\": ",
                o->cuda_device, r->cuda_memcpy_gbps,
                r->cuda_memcpy_gbps > 0 ? g / r->cuda_memcpy_gbps : 0,
                bench_cuda_is_double() ? "true" : "false");
        json_str(f, bench_cuda_driver());
        fprintf(f, ", ");
    }
    if (o->scale)
        fprintf(f,
                "\"scale\": {\"prefill_ranks\": %d, \"decode_ranks\": %d, \"processes\": %d, "
                "\"cpu_s\": %.3f, \"cpu_us_per_room\": %.2f, \"max_in_flight\": %lld, "
                "\"rss_idle_kib\": %.0f, \"rss_peak_kib\": %.0f, \"rss_bytes_per_room\": %.0f, "
                "\"timed_wall_s\": %.3f, \"control_sent_per_room\": %.3f, "
                "\"control_received_per_room\": %.3f, \"control_dropped\": %.0f, "
                "\"heartbeats_per_decode_rank_s\": %.4f, \"heartbeats_failed\": %.0f, "
                "\"bootstrap_requests_prefill\": %.0f, \"bootstrap_requests_decode\": %.0f, "
                "\"bootstrap_per_rank_s\": %.4f, \"heartbeats_run\": %.0f, \"run_wall_s\": %.3f, "
                "\"poll\": \"%s\", \"hold\": %lld, \"held_verified\": %lld, \"held_failed\": %lld, "
                "\"held_rss_bytes_per_room\": %.0f, \"ranks_per_process\": %d}, ",
                o->ptp * o->ppp * o->dp, o->dtp, r->nprocs, r->cpu_s, cpu_us_per_room(r),
                r->max_inflight, r->rss_idle_kib, r->rss_peak_kib, bytes_per_room(r),
                r->timed_wall_s, scale_traffic(o, r).ctl_sent_per_room,
                scale_traffic(o, r).ctl_recv_per_room, r->traffic[BENCH_TR_CTL_FAILED],
                scale_traffic(o, r).hb_per_dec_rank_s, r->traffic[BENCH_TR_HB_FAILED],
                r->traffic[BENCH_TR_BOOT_PRE], r->traffic[BENCH_TR_BOOT_DEC],
                scale_traffic(o, r).boot_per_rank_s, r->hb_total, r->run_wall_s, bench_poll_name(),
                o->hold, r->held_verified, r->held_failed, held_bytes_per_room(o, r),
                bench_ranks_per_proc(o));
    if (o->layerwise_ms >= 0)
        json_layerwise(f, o, r);
    if (r->nres > 0) {
        json_res(f, r, "rss_kib", true);
        json_res(f, r, "fds", false);
    }
    fprintf(f,
            "\"warmup\": %lld, \"warmup_requests\": %lld, \"warmup_verified\": %lld, "
            "\"warmup_failed\": %lld, \"warmup_aborted\": %lld, \"cold_requests\": %lld, "
            "\"cold_bytes\": %llu, "
            "\"cold_seconds\": %.6f, \"cold_gbps\": %.4f, \"cold_latency_ms\": {\"p50\": %.4f, "
            "\"p99\": %.4f}, \"first_request_ms\": %.4f, ",
            o->warmup, r->warm_requests, r->warm_verified, r->warm_failed, r->warm_aborted,
            r->cold_requests, (unsigned long long)r->cold.bytes, r->cold.seconds, rate(&r->cold),
            pct(&r->cold, 50), pct(&r->cold, 99), r->first_ms);
    json_stages(f, r);
    fprintf(f,
            "\"latency_ms\": {\"p50\": %.4f, \"p90\": %.4f, \"p99\": %.4f}, "
            "\"plan_us_per_request\": %.2f, \"prompt_len\": %lld, \"page_size\": %d, "
            "\"decode_page_size\": %d, \"decode_layout\": \"%s\", "
            "\"concurrency\": %lld, \"interrupted\": %s, \"failures\": [",
            pct(&r->steady, 50), pct(&r->steady, 90), pct(&r->steady, 99), r->plan_us,
            o->prompt_len, o->page, o->dpage, kvb_plan_order_name((kvb_plan_order_t)o->dorder),
            o->conc, r->interrupted ? "true" : "false");
    for (int i = 0; i < r->nfails; i++) {
        fprintf(f, i ? ", " : "");
        json_str(f, r->fails[i]);
    }
    fprintf(f, "]}\n");
    return fclose(f) == 0;
}

bool bench_report_print(const bench_opts_t *o, bench_report_t *rep)
{
    print_table(o, rep);
    for (int i = 0; i < rep->nfails; i++)
        fprintf(stderr, "kvbridge bench: failed: %s\n", rep->fails[i]);
    return o->json == NULL || write_json(o, rep);
}

double bench_pct(const bench_phase_t *r, double p)
{
    return pct(r, p);
}

double bench_rate(const bench_phase_t *p)
{
    return rate(p);
}

void bench_json_str(FILE *f, const char *s)
{
    json_str(f, s);
}
