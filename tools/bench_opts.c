/* `kvbridge bench` options, model geometry and pool sizing. */
#include "bench_common.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tools.h"

#define BENCH_MAX_TP 64
#define BENCH_MAX_RANKS 128 /* 64 x 64 */

typedef struct overrides {
    long long layers, kv_heads, head_dim, dtype_bytes;
    int mla;
    const char *model;
} overrides_t;

static void usage(FILE *out)
{
    fprintf(out,
            "usage: kvbridge bench [options]\n\n"
            "Verified prefill/decode KV transfer on real processes: a bootstrap server,\n"
            "prefill rank processes and decode rank processes, every KV and aux byte\n"
            "checked on the decode side. See docs/bench.md.\n\n"
            "model:\n"
            "  --model NAME          llama3-8b (default), llama3-70b, qwen2.5-7b, deepseek-v3\n"
            "  --layers N --kv-heads N --head-dim N --dtype-bytes N --mla\n"
            "                        override the preset's fields (or describe a model)\n"
            "topology:\n"
            "  --prefill-tp N --prefill-pp K --dp D   prefill ranks: D x N x K (default 1 1 1)\n"
            "  --decode-tp M                          decode ranks (default 1)\n"
            "  --ranks-per-process K  ranks (managers, engines) per rank process (default:\n"
            "                        1, or the fewest that keep 64 rank processes at most)\n"
            "workload:\n"
            "  --requests R          requests in total (default 16)\n"
            "  --concurrency C       requests in flight at once (default 4)\n"
            "  --prompt-len L        tokens per request (default 2048)\n"
            "  --page-size P         tokens per page (default 16)\n"
            "  --decode-page-size P  the decode's tokens per page (default: --page-size)\n"
            "  --decode-layout nhd|hnd  the decode's page order (default nhd; the prefill\n"
            "                        is nhd): rows are mapped, not pages (docs/planner.md)\n"
            "  --chunk T             tokens per sender_send (default: whole prompt)\n"
            "  --transport auto|tcp|shm   engine lane (default auto)\n"
            "  --integrity off|check KV integrity digests between the ranks (default:\n"
            "                        KVBRIDGE_INTEGRITY, else off; docs/integrity.md)\n"
            "  --memory host|cuda    KV pools in host or CUDA device memory (default host;\n"
            "                        cuda: adds cuda_memcpy_gbps, a device-to-device yardstick)\n"
            "  --device N            CUDA device of every rank (default 0)\n"
            "  --scale               control-plane scale mode: 1-layer MLA, 16-element rows,\n"
            "                        one-token pages and requests (later options override);\n"
            "                        reports CPU and memory per room (docs/bench.md)\n"
            "  --hold N              (--scale) N more rooms held in flight on every rank\n"
            "                        during the timed requests (no KV sent until after\n"
            "                        them; then sent and verified): latency with N in flight\n"
            "  --warmup N            untimed passes over the pools first (default 1; the\n"
            "                        first pass is reported as the cold figures; 0 = the\n"
            "                        timed requests start cold)\n"
            "  --seed S              rooms, page choice and pattern seed (default 1)\n"
            "  --layerwise MS        simulate the prefill's forward pass, MS milliseconds per\n"
            "                        layer of each chunk (a float >= 0): half of the rooms\n"
            "                        send each layer as it ends, half the whole chunk after\n"
            "                        its last layer; reports the transfer time left exposed\n"
            "                        after the compute, per mode, and the share layerwise hides\n"
            "output:\n"
            "  --json FILE           also write the report as one JSON object\n"
            "  --trace FILE          also write the run as Chrome trace events (Perfetto,\n"
            "                        chrome://tracing): a track per rank, a slice per room stage\n"
            "  --report FILE         also write one self-contained HTML page: summary table and\n"
            "                        an SVG timeline of every room on every rank\n"
            "  --no-progress         no progress output on stderr\n"
            "two machines:\n"
            "  --role bootstrap|prefill|decode  run one side only\n"
            "  --bootstrap HOST:PORT            bootstrap server (listen address for\n"
            "                                   --role bootstrap)\n"
            "  --host ADDR                      address this host's ranks listen on\n"
            "                                   (default 127.0.0.1)\n\n"
            "Exit status: 0 when every request was verified, 1 otherwise, 2 on bad options,\n"
            "130 when interrupted (the partial report is printed).\n");
}

static void defaults(bench_opts_t *o, overrides_t *v)
{
    memset(o, 0, sizeof(*o));
    memset(v, 0, sizeof(*v));
    v->layers = v->kv_heads = v->head_dim = v->dtype_bytes = -1;
    o->page = 16;
    o->ptp = o->dtp = o->ppp = o->dp = 1;
    o->requests = 16;
    o->conc = 4;
    o->prompt_len = 2048;
    o->seed = 1;
    o->warmup = 1;
    o->transport = KVB_TRANSPORT_AUTO;
    o->progress = true;
    o->host = "127.0.0.1";
    o->timeout_s = 120;
    o->layerwise_ms = -1;
}

const char *bench_transport_name(kvb_transport_t t)
{
    return t == KVB_TRANSPORT_TCP ? "tcp" : t == KVB_TRANSPORT_SHM ? "shm" : "auto";
}

static bool parse_transport(const char *v, kvb_transport_t *t_p)
{
    static const kvb_transport_t all[] = {KVB_TRANSPORT_AUTO, KVB_TRANSPORT_TCP, KVB_TRANSPORT_SHM};
    for (size_t i = 0; v != NULL && i < 3; i++)
        if (strcmp(v, bench_transport_name(all[i])) == 0) {
            *t_p = all[i];
            return true;
        }
    fprintf(stderr, "kvbridge: --transport: '%s' is not one of auto, tcp, shm\n", v ? v : "");
    return false;
}

static bool parse_role(const char *v, bench_opts_t *o)
{
    static const char *names[] = {"all",    "bootstrap",    "prefill",
                                  "decode", "prefill-rank", "decode-rank"};
    for (int i = 0; v != NULL && i < 6; i++)
        if (strcmp(v, names[i]) == 0) {
            o->role = (bench_role_t)i;
            return true;
        }
    fprintf(stderr, "kvbridge: --role: '%s' is not one of bootstrap, prefill, decode\n",
            v ? v : "");
    return false;
}

static bool parse_text(const char *opt, const char *v, size_t max)
{
    if (v == NULL || v[0] == '\0' || strlen(v) > max) {
        fprintf(stderr, "kvbridge: %s needs a value (at most %zu characters)\n", opt, max);
        return false;
    }
    return true;
}

static bool parse_rate(const char *v, double *rate_p)
{
    char *end = NULL;
    double x = v != NULL ? strtod(v, &end) : -1;
    if (v == NULL || end == v || *end != '\0' || !(x >= 0 && x <= 1)) {
        fprintf(stderr, "kvbridge: --abort-rate: '%s' is not a probability in [0, 1]\n",
                v ? v : "");
        return false;
    }
    *rate_p = x;
    return true;
}

/* --layerwise MS: at most 10 s a layer (a typo, not a model). */
static bool parse_layer_ms(const char *v, double *ms_p)
{
    char *end = NULL;
    double x = v != NULL ? strtod(v, &end) : -1;
    if (v == NULL || end == v || *end != '\0' || !(x >= 0 && x <= 10000)) {
        fprintf(stderr, "kvbridge: --layerwise: '%s' is not milliseconds in [0, 10000]\n",
                v ? v : "");
        return false;
    }
    *ms_p = x;
    return true;
}

static bool parse_int_opt(const char *a, const char *v, bench_opts_t *o, overrides_t *w, bool *ok)
{
    long long page = o->page, dpage = o->dpage, ptp = o->ptp, dtp = o->dtp, ppp = o->ppp,
              dp = o->dp;
    long long tpr = o->tp_rank, ppr = o->pp_rank, dpr = o->dp_rank, tmo = (long long)o->timeout_s;
    long long cdev = o->cuda_device;
    const struct {
        const char *name;
        long long min, max, *dst;
    } t[] = {{"--prefill-tp", 1, BENCH_MAX_TP, &ptp},
             {"--decode-tp", 1, BENCH_MAX_TP, &dtp},
             {"--prefill-pp", 1, 16, &ppp},
             {"--dp", 1, 16, &dp},
             {"--requests", 1, 1000000, &o->requests},
             {"--concurrency", 1, 100000, &o->conc},
             {"--hold", 0, 100000, &o->hold},
             {"--prompt-len", 1, 1 << 20, &o->prompt_len},
             {"--page-size", 1, 4096, &page},
             {"--decode-page-size", 1, 4096, &dpage},
             {"--chunk", 0, 1 << 20, &o->chunk},
             {"--seed", 0, 1000000, &o->seed},
             {"--warmup", 0, 100, &o->warmup},
             {"--layers", 1, 1024, &w->layers},
             {"--kv-heads", 1, 1024, &w->kv_heads},
             {"--head-dim", 1, 65536, &w->head_dim},
             {"--dtype-bytes", 1, 8, &w->dtype_bytes},
             {"--tp-rank", 0, BENCH_MAX_TP, &tpr},
             {"--pp-rank", 0, 16, &ppr},
             {"--dp-rank", 0, 16, &dpr},
             {"--pool-pages", 1, 1LL << 30, &o->pool_pages},
             {"--wave", 1, 1000000, &o->wave},
             {"--timeout", 1, 86400, &tmo},
             {"--device", 0, 63, &cdev},
             {"--ranks-per-process", 0, BENCH_MAX_RANKS_PER_PROC, &o->rpp}};
    size_t i = 0, n = sizeof(t) / sizeof(t[0]);
    while (i < n && strcmp(a, t[i].name) != 0)
        i++;
    if (i == n)
        return false;
    *ok = kvb_tool_parse_int(a, v, t[i].min, t[i].max, t[i].dst);
    o->page = (int)page;
    o->dpage = (int)dpage;
    o->ptp = (int)ptp;
    o->dtp = (int)dtp;
    o->ppp = (int)ppp;
    o->dp = (int)dp;
    o->tp_rank = (int)tpr;
    o->pp_rank = (int)ppr;
    o->dp_rank = (int)dpr;
    o->timeout_s = (double)tmo;
    o->cuda_device = (int)cdev;
    return true;
}

/* --scale: control dominates. One layer of MLA with 16-element rows, one
 * token per page, one-page requests; options after it override. */
static void scale_preset(bench_opts_t *o, overrides_t *w)
{
    o->scale = true;
    w->layers = 1;
    w->head_dim = 16;
    w->mla = 1;
    o->page = 1;
    o->prompt_len = 1;
}

static bool parse_flag(const char *a, bench_opts_t *o, overrides_t *w)
{
    if (strcmp(a, "--no-progress") == 0)
        o->progress = false;
    else if (strcmp(a, "--mla") == 0)
        w->mla = 1;
    else if (strcmp(a, "--child") == 0)
        o->child = true;
    else if (strcmp(a, "--corrupt-one-byte") == 0)
        o->corrupt = true;
    else if (strcmp(a, "--random-chunks") == 0)
        o->random_chunks = true;
    else if (strcmp(a, "--resource-report") == 0)
        o->resource_report = true;
    else if (strcmp(a, "--scale") == 0)
        scale_preset(o, w);
    else if (strcmp(a, "--timelines") == 0)
        o->timelines = true;
    else
        return false;
    return true;
}

/* One option; *i advances past its value. 0 ok, 1 help, 2 error. */
static int parse_one(bench_opts_t *o, overrides_t *w, int argc, char **argv, int *i)
{
    const char *a = argv[*i], *v = *i + 1 < argc ? argv[*i + 1] : NULL;
    bool ok = true;
    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0)
        return 1;
    if (parse_flag(a, o, w))
        return 0;
    (*i)++;
    if (parse_int_opt(a, v, o, w, &ok))
        return ok ? 0 : 2;
    if (strcmp(a, "--transport") == 0)
        return parse_transport(v, &o->transport) ? 0 : 2;
    if (strcmp(a, "--integrity") == 0) { /* the ranks read it at manager creation */
        if (v == NULL || (strcmp(v, "off") != 0 && strcmp(v, "check") != 0)) {
            fprintf(stderr, "kvbridge: --integrity must be off or check\n");
            return 2;
        }
        setenv("KVBRIDGE_INTEGRITY", v, 1);
        return 0;
    }
    if (strcmp(a, "--memory") == 0) {
        if (v == NULL || (strcmp(v, "host") != 0 && strcmp(v, "cuda") != 0)) {
            fprintf(stderr, "kvbridge: --memory must be host or cuda\n");
            return 2;
        }
        o->cuda = strcmp(v, "cuda") == 0;
        return 0;
    }
    if (strcmp(a, "--role") == 0)
        return parse_role(v, o) ? 0 : 2;
    if (strcmp(a, "--decode-layout") == 0) {
        kvb_plan_order_t ord;
        if (kvb_plan_order_parse(v, &ord) != KVB_OK) {
            fprintf(stderr, "kvbridge: --decode-layout must be nhd or hnd\n");
            return 2;
        }
        o->dorder = (int)ord;
        return 0;
    }
    if (strcmp(a, "--abort-rate") == 0)
        return parse_rate(v, &o->abort_rate) ? 0 : 2;
    if (strcmp(a, "--layerwise") == 0)
        return parse_layer_ms(v, &o->layerwise_ms) ? 0 : 2;
    if (strcmp(a, "--bootstrap") == 0) {
        if (!parse_text(a, v, sizeof(o->bootstrap) - 1))
            return 2;
        snprintf(o->bootstrap, sizeof(o->bootstrap), "%s", v);
        return 0;
    }
    if (strcmp(a, "--trace") == 0 || strcmp(a, "--report") == 0) {
        if (!parse_text(a, v, 4000))
            return 2;
        *(a[2] == 't' ? &o->trace : &o->report) = v;
        return 0;
    }
    if (strcmp(a, "--json") == 0 || strcmp(a, "--host") == 0 || strcmp(a, "--model") == 0) {
        if (!parse_text(a, v, 200))
            return 2;
        *(a[2] == 'j' ? &o->json : a[2] == 'h' ? &o->host : &w->model) = v;
        return 0;
    }
    fprintf(stderr, "kvbridge: bench: unknown option '%s' (see --help)\n", a);
    return 2;
}

static bool resolve_model(bench_opts_t *o, const overrides_t *w)
{
    kvb_plan_model_t pm;
    bool custom = w->layers > 0 || w->kv_heads > 0 || w->head_dim > 0;
    const char *name = w->model != NULL ? w->model : custom ? NULL : "llama3-8b";
    memset(&pm, 0, sizeof(pm));
    pm.dtype_bytes = 2;
    if (name != NULL && kvb_plan_model_preset(name, &pm) != KVB_OK) {
        fprintf(stderr, "kvbridge: --model: unknown preset '%s'\n", name);
        return false;
    }
    snprintf(o->m.name, sizeof(o->m.name), "%s%s", name ? name : "custom",
             name && (custom || w->dtype_bytes > 0 || w->mla) ? "+custom" : "");
    o->m.layers = w->layers > 0 ? (int)w->layers : (int)pm.num_layers;
    o->m.kv_heads = w->kv_heads > 0 ? (int)w->kv_heads : (int)pm.kv_heads;
    o->m.head_dim = w->head_dim > 0 ? (int)w->head_dim : (int)pm.head_dim;
    o->m.dtype_bytes = w->dtype_bytes > 0 ? (int)w->dtype_bytes : (int)pm.dtype_bytes;
    o->m.mla = w->mla || pm.attn == KVB_PLAN_MLA;
    if (o->m.mla)
        o->m.kv_heads = 1;
    if (o->m.layers <= 0 || o->m.head_dim <= 0 || o->m.kv_heads <= 0) {
        fprintf(stderr, "kvbridge: a custom model needs --layers, --head-dim and (MHA) "
                        "--kv-heads\n");
        return false;
    }
    return true;
}

static bool tp_fits(const bench_opts_t *o, int tp, const char *opt)
{
    int h = o->m.kv_heads;
    if (o->m.mla || (tp <= h && h % tp == 0) || (tp > h && tp % h == 0))
        return true;
    fprintf(stderr, "kvbridge: %s %d does not divide (or is not a multiple of) %d KV heads\n", opt,
            tp, h);
    return false;
}

int bench_ranks_per_proc(const bench_opts_t *o)
{
    if (o->rpp > 0)
        return (int)o->rpp;
    int ranks = o->ptp * o->ppp * o->dp + o->dtp;
    return (ranks + BENCH_MAX_PROCS - 1) / BENCH_MAX_PROCS;
}

static bool check(bench_opts_t *o)
{
    if (!tp_fits(o, o->ptp, "--prefill-tp") || !tp_fits(o, o->dtp, "--decode-tp"))
        return false;
    if (o->m.layers % o->ppp != 0) {
        fprintf(stderr, "kvbridge: --prefill-pp %d does not divide %d layers\n", o->ppp,
                o->m.layers);
        return false;
    }
    if (o->ptp * o->ppp * o->dp + o->dtp > BENCH_MAX_RANKS) {
        fprintf(stderr, "kvbridge: at most %d ranks\n", BENCH_MAX_RANKS);
        return false;
    }
    int k = bench_ranks_per_proc(o),
        procs = (o->ptp + k - 1) / k * o->ppp * o->dp + (o->dtp + k - 1) / k;
    if (o->role == BENCH_ROLE_ALL && procs > BENCH_MAX_PROCS) {
        fprintf(stderr, "kvbridge: %d rank processes at --ranks-per-process %d: at most %d\n",
                procs, k, BENCH_MAX_PROCS);
        return false;
    }
    bool side = o->role == BENCH_ROLE_PREFILL || o->role == BENCH_ROLE_DECODE;
    if (side && o->bootstrap[0] == '\0') {
        fprintf(stderr, "kvbridge: --role prefill|decode needs --bootstrap HOST:PORT\n");
        return false;
    }
    if (o->hold > 0 && !o->child && (!o->scale || o->abort_rate > 0)) {
        fprintf(stderr, "kvbridge: --hold is for --scale runs (without --abort-rate)\n");
        return false;
    }
    /* exposed time compares the two sides' clock stamps: one host only */
    if (o->layerwise_ms >= 0 && (side || o->role == BENCH_ROLE_BOOTSTRAP)) {
        fprintf(stderr, "kvbridge: --layerwise needs both sides on this host (no --role)\n");
        return false;
    }
    if (o->conc > o->requests)
        o->conc = o->requests;
    if (o->dpage == 0)
        o->dpage = o->page;
    return true;
}

int bench_parse(bench_opts_t *o, int argc, char **argv)
{
    overrides_t w;
    defaults(o, &w);
    for (int i = 1; i < argc; i++) {
        int rc = parse_one(o, &w, argc, argv, &i);
        if (rc == 1)
            usage(stdout);
        if (rc != 0)
            return rc;
    }
    return resolve_model(o, &w) && check(o) ? 0 : 2;
}

void bench_rank_geom(const bench_opts_t *o, int tp, int tp_size, int pp, int pp_size,
                     bench_rank_geom_t *g)
{
    const bench_model_t *m = &o->m;
    memset(g, 0, sizeof(*g));
    g->tp = tp;
    g->tp_size = tp_size;
    g->pp = pp;
    g->pp_size = pp_size;
    if (m->mla) {
        g->local_heads = 1;
    } else if (tp_size <= m->kv_heads) {
        g->local_heads = m->kv_heads / tp_size;
        g->first_head = tp * g->local_heads;
    } else {
        g->local_heads = 1;
        g->first_head = tp * m->kv_heads / tp_size;
    }
    g->n_layers = m->layers / pp_size;
    g->first_layer = pp * g->n_layers;
    g->n_kv = m->mla ? g->n_layers : 2 * g->n_layers;
    g->head_bytes = (uint64_t)m->head_dim * (uint64_t)m->dtype_bytes;
    g->row_bytes = g->head_bytes * (uint64_t)g->local_heads;
    g->item_len = g->row_bytes * (uint64_t)o->page;
    g->page = o->page;
    g->order = KVB_PLAN_ORDER_NHD;
}

void bench_decode_geom(const bench_opts_t *o, int tp, int tp_size, bench_rank_geom_t *g)
{
    bench_rank_geom(o, tp, tp_size, 0, 1, g);
    g->page = o->dpage;
    g->order = o->dorder;
    g->item_len = g->row_bytes * (uint64_t)o->dpage;
}

uint64_t bench_pages_per_request(const bench_opts_t *o)
{
    return (uint64_t)((o->prompt_len + o->page - 1) / o->page);
}

uint64_t bench_decode_pages_per_request(const bench_opts_t *o)
{
    return (uint64_t)((o->prompt_len + o->dpage - 1) / o->dpage);
}

uint64_t bench_rows_sent(const bench_opts_t *o)
{
    uint64_t p = bench_pages_per_request(o) * (uint64_t)o->page;
    uint64_t d = bench_decode_pages_per_request(o) * (uint64_t)o->dpage;
    return p < d ? p : d;
}

static uint64_t side_bytes_per_page(const bench_opts_t *o, bool prefill)
{
    uint64_t sum = 0;
    int tps = prefill ? o->ptp : o->dtp, pps = prefill ? o->ppp : 1;
    for (int t = 0; t < tps; t++)
        for (int p = 0; p < pps; p++) {
            bench_rank_geom_t g;
            bench_rank_geom(o, t, tps, p, pps, &g);
            sum += g.item_len * (uint64_t)g.n_kv;
        }
    return prefill ? sum * (uint64_t)o->dp : sum;
}

uint64_t bench_request_bytes(const bench_opts_t *o)
{
    /* per token row: the decode's page bytes over its page size */
    return bench_rows_sent(o) * (side_bytes_per_page(o, false) / (uint64_t)o->page) +
           (uint64_t)o->dtp * BENCH_AUX_ITEM;
}

/* Pages for a wave plus the --hold rooms, with slack for fragmentation. */
static uint64_t pool_pages_for(const bench_opts_t *o, long long wave)
{
    uint64_t need = (uint64_t)(wave + o->hold) * bench_pages_per_request(o);
    return need + need / 8 + 8;
}

long long bench_wave(const bench_opts_t *o)
{
    long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
    double budget = 0.5 * (double)pages * (double)psz;
    double per_page = (double)(side_bytes_per_page(o, true) + side_bytes_per_page(o, false));
    long long lo = o->conc < o->requests ? o->conc : o->requests;
    long long w = 2 * o->conc < o->requests ? 2 * o->conc : o->requests;
    while (w > lo && (double)pool_pages_for(o, w) * per_page > budget)
        w--;
    if ((double)pool_pages_for(o, w) * per_page > budget) {
        fprintf(stderr,
                "kvbridge: bench: %lld requests in flight need %.1f GB of KV pools, more "
                "than half of this machine's memory; lower --concurrency or --prompt-len\n",
                w, (double)pool_pages_for(o, w) * per_page / 1e9);
        return 0;
    }
    return w;
}

long long bench_pool_pages(const bench_opts_t *o, long long wave)
{
    return (long long)pool_pages_for(o, wave);
}

long long bench_warmup_requests(const bench_opts_t *o, long long pool_pages)
{
    long long n = (long long)bench_pages_per_request(o);
    return o->warmup * o->dp * ((pool_pages + n - 1) / n);
}

/* ------------------------------------------------------------ soak hooks */

static uint64_t room_hash(const bench_opts_t *o, uint64_t room, uint64_t salt)
{
    uint64_t z = room * 0x9e3779b97f4a7c15ull ^ ((uint64_t)o->seed << 32) ^ salt;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

int bench_abort_side(const bench_opts_t *o, uint64_t room)
{
    double u = (double)(room_hash(o, room, 1) >> 11) / 9007199254740992.0; /* [0, 1) */
    if (u >= o->abort_rate)
        return BENCH_ABORT_NONE;
    return room_hash(o, room, 2) & 1 ? BENCH_ABORT_PREFILL : BENCH_ABORT_DECODE;
}

uint64_t bench_abort_after(const bench_opts_t *o, uint64_t room, uint64_t chunks)
{
    return chunks > 0 ? room_hash(o, room, 3) % chunks : 0;
}

/* room / dp counts a DP group's rooms (room r goes to group r % dp): every
 * group alternates, rather than one group sending layerwise and the other
 * final. */
bool bench_room_layerwise(const bench_opts_t *o, uint64_t room)
{
    return (room / (uint64_t)(o->dp > 0 ? o->dp : 1)) % 2 == 0;
}

uint64_t bench_chunk_pages(const bench_opts_t *o, uint64_t room, uint64_t pages)
{
    uint64_t per;
    if (o->random_chunks)
        per = pages > 0 ? 1 + room_hash(o, room, 4) % pages : 1;
    else
        per = o->chunk > 0 ? (uint64_t)(o->chunk + o->page - 1) / (uint64_t)o->page : pages;
    return per > 0 ? per : 1;
}
