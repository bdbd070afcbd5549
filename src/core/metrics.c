/* The metrics table's storage and its Prometheus exposition. Counters and
 * histograms are relaxed atomic adds into one array (no lock on any hot
 * path); a scrape copies the array, lets the collectors add the gauges that
 * need a lock, and writes every row of metrics.def. */
#include "core/metrics.h"
#include "core/core.h"

#include <kvbridge/metrics.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

uint64_t kvb__mv[KVB__MO_TOTAL];
const uint32_t kvb__moff[KVB__M_COUNT] = {
#define KVB_METRIC(id, name, type, dims, bk, help) KVB__MO_##id,
#include "core/metrics.def"
#undef KVB_METRIC
};

typedef enum { T_COUNTER, T_GAUGE, T_HISTOGRAM } mtype_t;
typedef enum {
    D_NONE,
    D_LANE_OP,
    D_LANE_OP_OUTCOME,
    D_ROLE,
    D_ROLE_OUTCOME,
    D_ROLE_REASON,
    D_ROLE_STAGE
} mdim_t;
typedef enum { B_NONE, B_SECONDS, B_SPEED } mbk_t;

typedef struct {
    const char *name, *help;
    mtype_t type;
    mdim_t dims;
    mbk_t bk;
    uint32_t slots;
} mdesc_t;

static const mdesc_t descs[KVB__M_COUNT] = {
#define KVB_METRIC(id, name, type, dims, bk, help)                                                 \
    {name, help, T_##type, D_##dims, B_##bk, KVB__DN_##dims},
#include "core/metrics.def"
#undef KVB_METRIC
};

/* Upper bounds, in the base unit (ns; bytes per second). */
static const uint64_t b_seconds[KVB__BN_SECONDS] = {
    100000,     250000,     500000,     1000000,     2500000,     5000000,
    10000000,   25000000,   50000000,   100000000,   250000000,   500000000,
    1000000000, 2500000000, 5000000000, 10000000000, 30000000000, 60000000000};
static const uint64_t b_speed[KVB__BN_SPEED] = {1000000ull,     10000000ull,     100000000ull,
                                                500000000ull,   1000000000ull,   2500000000ull,
                                                5000000000ull,  10000000000ull,  25000000000ull,
                                                50000000000ull, 100000000000ull, 200000000000ull};

static const uint64_t *bounds(mbk_t bk, size_t *n_p)
{
    *n_p = bk == B_SECONDS ? KVB__BN_SECONDS : bk == B_SPEED ? KVB__BN_SPEED : 0;
    return bk == B_SECONDS ? b_seconds : bk == B_SPEED ? b_speed : NULL;
}

static size_t width(const mdesc_t *d)
{
    size_t nb;
    bounds(d->bk, &nb);
    return d->type == T_HISTOGRAM ? nb + 2 : 1;
}

void kvb__m_observe(kvb__mid_t id, size_t slot, uint64_t v)
{
    const mdesc_t *d = &descs[id];
    size_t nb, i = 0;
    const uint64_t *b = bounds(d->bk, &nb);
    while (i < nb && v > b[i])
        i++;
    uint64_t *base = &kvb__mv[kvb__moff[id] + slot * (nb + 2)];
    if (i < nb)
        __atomic_add_fetch(&base[i], 1, __ATOMIC_RELAXED);
    __atomic_add_fetch(&base[nb], 1, __ATOMIC_RELAXED);
    __atomic_add_fetch(&base[nb + 1], v, __ATOMIC_RELAXED);
}

static const char *const reason_names[] = {
#define KVB__REASON_NAME_(id, name) name,
    KVB__REASON_MAP(KVB__REASON_NAME_)
#undef KVB__REASON_NAME_
};

const char *kvb__reason_name(kvb__reason_t r)
{
    return (unsigned)r < KVB__R_COUNT ? reason_names[r] : "other";
}

bool kvb__observe_on(void)
{
    static int state; /* 0: not read yet, 1 on, 2 off (benign race: same answer) */
    int v = __atomic_load_n(&state, __ATOMIC_RELAXED);
    if (v == 0) {
        v = kvb__env_int("KVBRIDGE_TIMELINE", NULL, 1, 0, 1) ? 1 : 2;
        __atomic_store_n(&state, v, __ATOMIC_RELAXED);
    }
    return v == 1;
}

/* ---- label values ---- */

static const char *lane_names[KVB__M_LANES];
static int64_t role_ranks[KVB__M_ROLES] = {-1, -1};

void kvb__metrics_lane_name(unsigned lane, const char *name)
{
    if (lane < KVB__M_LANES)
        __atomic_store_n(&lane_names[lane], name, __ATOMIC_RELEASE);
}

void kvb__metrics_role_rank(int role, int64_t rank)
{
    __atomic_store_n(&role_ranks[role != 0], rank, __ATOMIC_RELAXED);
}

static const char *const role_names[KVB__M_ROLES] = {"prefill", "decode"};
static const char *const op_names[KVB__M_OPS] = {"write", "read"};
static const char *const out_names[KVB__M_OUTCOMES] = {"ok", "failed", "canceled"};
static const char *const room_out_names[KVB__M_ROOM_OUTCOMES] = {"success", "failed"};
static const char *const stage_names[KVB__STAGES] = {"bootstrap", "wait_decode", "transfer",
                                                     "total"};

/* The labels of slot k of d ("" for none, false: a slot never used). */
static bool labels(const mdesc_t *d, size_t k, char *out, size_t len)
{
    size_t per_role = d->slots / KVB__M_ROLES;
    int role = per_role ? (int)(k / per_role) : 0;
    size_t sub = per_role ? k % per_role : 0;
    char rl[64];
    snprintf(rl, sizeof(rl), "role=\"%s\",rank=\"%lld\"", role_names[role],
             (long long)__atomic_load_n(&role_ranks[role], __ATOMIC_RELAXED));
    out[0] = '\0';
    switch (d->dims) {
    case D_NONE:
        return true;
    case D_LANE_OP:
    case D_LANE_OP_OUTCOME: {
        size_t lo = d->dims == D_LANE_OP ? k : k / KVB__M_OUTCOMES;
        const char *lane = __atomic_load_n(&lane_names[lo / KVB__M_OPS], __ATOMIC_ACQUIRE);
        if (lane == NULL)
            return false;
        int n = snprintf(out, len, "lane=\"%s\",op=\"%s\"", lane, op_names[lo % KVB__M_OPS]);
        if (d->dims == D_LANE_OP_OUTCOME && n > 0 && (size_t)n < len)
            snprintf(out + n, len - (size_t)n, ",outcome=\"%s\"", out_names[k % KVB__M_OUTCOMES]);
        return true;
    }
    case D_ROLE:
        snprintf(out, len, "%s", rl);
        return true;
    case D_ROLE_OUTCOME:
        snprintf(out, len, "%s,outcome=\"%s\"", rl, room_out_names[sub]);
        return true;
    case D_ROLE_REASON:
        snprintf(out, len, "%s,reason=\"%s\"", rl, kvb__reason_name((kvb__reason_t)sub));
        return true;
    case D_ROLE_STAGE:
        snprintf(out, len, "%s,stage=\"%s\"", rl, stage_names[sub]);
        return true;
    }
    return false;
}

/* ---- collectors ---- */

#define MAX_COLLECTORS 64
static pthread_mutex_t col_mu = PTHREAD_MUTEX_INITIALIZER;
static struct {
    kvb__mcollect_fn fn;
    void *arg;
} cols[MAX_COLLECTORS];

struct kvb__msnap {
    uint64_t v[KVB__MO_TOTAL];
};

void kvb__metrics_collector_add(kvb__mcollect_fn fn, void *arg)
{
    pthread_mutex_lock(&col_mu);
    size_t i = 0;
    while (i < MAX_COLLECTORS && cols[i].fn != NULL)
        i++;
    if (i < MAX_COLLECTORS) {
        cols[i].fn = fn;
        cols[i].arg = arg;
    } else {
        KVB_LOGW("metrics: more than %d engines in this process; the gauges of the later ones "
                 "are not exported",
                 MAX_COLLECTORS);
    }
    pthread_mutex_unlock(&col_mu);
}

void kvb__metrics_collector_remove(kvb__mcollect_fn fn, void *arg)
{
    pthread_mutex_lock(&col_mu);
    for (size_t i = 0; i < MAX_COLLECTORS; i++)
        if (cols[i].fn == fn && cols[i].arg == arg)
            cols[i].fn = NULL;
    pthread_mutex_unlock(&col_mu);
}

void kvb__metrics_put(kvb__msnap_t *s, kvb__mid_t id, size_t slot, uint64_t v)
{
    if (slot < descs[id].slots && descs[id].type == T_GAUGE)
        s->v[kvb__moff[id] + slot] += v;
}

/* ---- exposition ---- */

static void write_metric(FILE *f, const mdesc_t *d, const uint64_t *v)
{
    static const char *const tn[] = {"counter", "gauge", "histogram"};
    char lb[192];
    size_t nb;
    const uint64_t *b = bounds(d->bk, &nb);
    fprintf(f, "# HELP %s %s.\n# TYPE %s %s\n", d->name, d->help, d->name, tn[d->type]);
    for (size_t k = 0; k < d->slots; k++) {
        const uint64_t *x = v + k * width(d);
        if (!labels(d, k, lb, sizeof(lb)))
            continue;
        if (d->type != T_HISTOGRAM) {
            fprintf(f, "%s%s%s%s %llu\n", d->name, lb[0] ? "{" : "", lb, lb[0] ? "}" : "",
                    (unsigned long long)x[0]);
            continue;
        }
        double scale = d->bk == B_SECONDS ? 1e-9 : 1.0;
        const char *sep = lb[0] ? "," : "";
        uint64_t cum = 0;
        for (size_t i = 0; i < nb; i++) {
            cum += x[i];
            fprintf(f, "%s_bucket{%s%sle=\"%.9g\"} %llu\n", d->name, lb, sep, (double)b[i] * scale,
                    (unsigned long long)cum);
        }
        fprintf(f, "%s_bucket{%s%sle=\"+Inf\"} %llu\n", d->name, lb, sep,
                (unsigned long long)x[nb]);
        fprintf(f, "%s_sum%s%s%s %.9g\n", d->name, lb[0] ? "{" : "", lb, lb[0] ? "}" : "",
                (double)x[nb + 1] * scale);
        fprintf(f, "%s_count%s%s%s %llu\n", d->name, lb[0] ? "{" : "", lb, lb[0] ? "}" : "",
                (unsigned long long)x[nb]);
    }
}

char *kvb__metrics_text(size_t *len_p)
{
    kvb__msnap_t *s = malloc(sizeof(*s));
    char *buf = NULL;
    size_t len = 0;
    if (s == NULL)
        return NULL;
    for (size_t i = 0; i < KVB__MO_TOTAL; i++)
        s->v[i] = __atomic_load_n(&kvb__mv[i], __ATOMIC_RELAXED);
    pthread_mutex_lock(&col_mu);
    for (size_t i = 0; i < MAX_COLLECTORS; i++)
        if (cols[i].fn != NULL)
            cols[i].fn(cols[i].arg, s);
    pthread_mutex_unlock(&col_mu);
    FILE *f = open_memstream(&buf, &len);
    if (f != NULL) {
        for (size_t id = 0; id < KVB__M_COUNT; id++)
            write_metric(f, &descs[id], s->v + kvb__moff[id]);
        if (fclose(f) != 0) {
            free(buf);
            buf = NULL;
        }
    }
    free(s);
    if (len_p != NULL)
        *len_p = buf != NULL ? len : 0;
    return buf;
}

/* ---- the public snapshot ---- */

kvb_status_t kvb_metrics_snapshot(kvb_metrics_t **s_p)
{
    if (s_p == NULL)
        return KVB_ERR_INVALID;
    kvb_metrics_t *s = calloc(1, sizeof(*s));
    if (s == NULL || (s->text = kvb__metrics_text(&s->len)) == NULL) {
        free(s);
        return KVB_ERR_NOMEM;
    }
    *s_p = s;
    return KVB_OK;
}

void kvb_metrics_free(kvb_metrics_t *s)
{
    if (s == NULL)
        return;
    free(s->text);
    free(s);
}
