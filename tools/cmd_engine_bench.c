/* `kvbridge engine-bench`: transfer-engine throughput against memcpy of the
 * same blocks and (tcp lane) a raw TCP stream of the same bytes, every
 * destination byte verified; --op read measures one-sided reads of the
 * target's memory instead (kvb_engine_read: the same blocks the other way,
 * every byte read compared with the target's pattern). `kvbridge
 * engine-target` is its target process, driven over stdin/stdout with a
 * line protocol:
 *   target → "ready <session> <dst_base_hex> <bytes> <tcp_sink_port>" | "error <text>"
 *   "sum <off> <len>" → "sum <hex>"   checksum of the target's [off, off+len)
 *   "tcp <len>"       → "tcp ok"       after one raw TCP stream into its buffer
 *   "fill <seed>"     → "fill ok"      its buffer filled with kvb_eb_fill(seed)
 *   "quit"            → exits
 * The target dies with the writer (PR_SET_PDEATHSIG) and is reaped on every
 * exit path of the writer. */
#include <kvbridge/engine.h>
#include <kvbridge/kvbridge.h>

#include <inttypes.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

#include "eb_util.h"
#include "tools.h"

#define EB_MAX_SIZES 16
#define EB_MAX_LANES 4
#define EB_BATCH_MAX 100000
#define EB_MIN_BLOCK 64
#define EB_WRITE_TIMEOUT_S 120.0
#define EB_READY_TIMEOUT_S 60.0
#define EB_REPLY_TIMEOUT_S 120.0
#define EB_FULL_BYTES ((size_t)512 << 20)
#define EB_QUICK_BYTES ((size_t)128 << 20)

/* What is measured: auto = the message lane (the target's memory is plain
 * anonymous memory, so no direct lane); direct = the same engines with the
 * target's memory from kvb_mem_alloc (one host: the writer maps it and its
 * copy threads write); tcp; shm = UCX put. */
typedef enum eb_lane { EB_AUTO, EB_DIRECT, EB_TCP, EB_SHM } eb_lane_t;

typedef struct eb_opts {
    eb_lane_t lanes[EB_MAX_LANES];
    size_t nlanes;
    size_t sizes[EB_MAX_SIZES];
    size_t nsizes;
    size_t ws;
    long long reps;
    bool verbose;
    bool read; /* --op read: kvb_engine_read of the target's memory */
    const char *json;
    const char *host;
} eb_opts_t;

typedef struct eb_row {
    eb_lane_t lane;
    bool read;
    size_t block_size, bytes;
    double seconds, gbps, memcpy_gbps, tcp_gbps, ratio;
    /* a fresh target per row: open_ms = the first one-block write (handshake,
     * mapping), cold = the first pass over the target's memory after it */
    double open_ms, cold_seconds, cold_gbps;
    bool verified;
    char error[320];
} eb_row_t;

typedef struct eb_target {
    kvb_eb_chan_t ch;
    char session[128];
    uint64_t dst_base;
    size_t bytes;
    uint16_t tcp_port;
} eb_target_t;

typedef struct eb_ctx {
    const eb_opts_t *o;
    char *src;   /* registered with the writer's engine */
    char *local; /* memcpy baseline destination */
    kvb_block_t *blocks;
    uint32_t *perm;
    double memcpy_gbps[EB_MAX_SIZES];
    eb_row_t rows[EB_MAX_LANES * EB_MAX_SIZES];
    size_t nrows;
} eb_ctx_t;

/* ------------------------------------------------------------------ options */

static void usage(FILE *out)
{
    fprintf(out,
            "usage: kvbridge engine-bench [options]\n\n"
            "Writes a working set as blocks at random, non-overlapping destination offsets\n"
            "from this process into a target process (kvb_engine_write), verifies every\n"
            "destination byte by checksum, and compares with memcpy of the same blocks and\n"
            "(tcp lane) a raw single-stream TCP transfer of the same bytes.\n\n"
            "options:\n"
            "  --transport L[,L...]|all      lanes to measure: auto (message lane), direct\n"
            "                                (target memory from kvb_mem_alloc), tcp, shm\n"
            "                                (default auto)\n"
            "  --quick                       128 MiB working set instead of 512 MiB\n"
            "  --sizes N,N,...               block sizes in bytes, multiples of 8, >= %d\n"
            "                                (default 4096,32768,262144,4194304)\n"
            "  --reps N                      timed repetitions per size, median kept "
            "(default 3)\n"
            "  --op write|read               what is timed: writes into the target (default) or\n"
            "                                one-sided reads of its memory (kvb_engine_read)\n"
            "  --verbose                     print every repetition's time on stderr\n"
            "  --json FILE                   also write the results as a JSON array\n"
            "  --host ADDR                   loopback address to use (default 127.0.0.1)\n"
            "  --help                        this text\n\n"
            "Exit status: 0 when every size of every lane verified, 1 otherwise, 2 on bad "
            "options.\n",
            EB_MIN_BLOCK);
}

static const char *lane_name(eb_lane_t l)
{
    static const char *names[] = {"auto", "direct", "tcp", "shm"};
    return names[l];
}

static kvb_transport_t lane_transport(eb_lane_t l)
{
    return l == EB_TCP ? KVB_TRANSPORT_TCP : l == EB_SHM ? KVB_TRANSPORT_SHM : KVB_TRANSPORT_AUTO;
}

static bool parse_lane(const char *v, eb_lane_t *l_p)
{
    for (int i = EB_AUTO; i <= EB_SHM; i++)
        if (strcmp(v, lane_name((eb_lane_t)i)) == 0) {
            *l_p = (eb_lane_t)i;
            return true;
        }
    return false;
}

static bool parse_transport(eb_opts_t *o, const char *v)
{
    char buf[64], *save = NULL;
    o->nlanes = 0;
    if (v != NULL && strcmp(v, "all") == 0)
        v = "auto,direct,tcp,shm";
    if (v == NULL || strlen(v) >= sizeof(buf)) {
        fprintf(stderr, "kvbridge: --transport needs a list of lanes\n");
        return false;
    }
    strcpy(buf, v);
    for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save))
        if (o->nlanes == EB_MAX_LANES || !parse_lane(tok, &o->lanes[o->nlanes++])) {
            fprintf(stderr,
                    "kvbridge: --transport: '%s' is not a list of auto, direct, tcp, shm (or "
                    "all)\n",
                    v);
            return false;
        }
    return o->nlanes > 0;
}

static bool parse_sizes(eb_opts_t *o, const char *v)
{
    char buf[512], *save = NULL;
    if (v == NULL || strlen(v) >= sizeof(buf) || v[0] == '\0') {
        fprintf(stderr, "kvbridge: --sizes needs a comma-separated list of byte counts\n");
        return false;
    }
    strcpy(buf, v);
    o->nsizes = 0;
    for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        long long s;
        if (o->nsizes == EB_MAX_SIZES) {
            fprintf(stderr, "kvbridge: --sizes: at most %d sizes\n", EB_MAX_SIZES);
            return false;
        }
        if (!kvb_tool_parse_int("--sizes", tok, EB_MIN_BLOCK, EB_FULL_BYTES, &s))
            return false;
        if (s % 8 != 0) {
            fprintf(stderr, "kvbridge: --sizes: %lld is not a multiple of 8\n", s);
            return false;
        }
        o->sizes[o->nsizes++] = (size_t)s;
    }
    return o->nsizes > 0;
}

static bool check_sizes(const eb_opts_t *o)
{
    for (size_t i = 0; i < o->nsizes; i++)
        if (o->sizes[i] > o->ws) {
            fprintf(stderr, "kvbridge: --sizes: %zu exceeds the working set (%zu bytes)\n",
                    o->sizes[i], o->ws);
            return false;
        }
    return true;
}

static void defaults(eb_opts_t *o)
{
    static const size_t def[] = {4096, 32768, 262144, 4194304};
    memset(o, 0, sizeof(*o));
    o->lanes[0] = EB_AUTO;
    o->nlanes = 1;
    for (size_t i = 0; i < 4; i++)
        o->sizes[i] = def[i];
    o->nsizes = 4;
    o->ws = EB_FULL_BYTES;
    o->reps = 3;
    o->host = "127.0.0.1";
}

/* One option; *i advances past its value. Returns 0 ok, 1 help, 2 error. */
static int parse_one(eb_opts_t *o, int argc, char **argv, int *i)
{
    const char *a = argv[*i];
    const char *v = *i + 1 < argc ? argv[*i + 1] : NULL;
    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0)
        return 1;
    if (strcmp(a, "--quick") == 0)
        o->ws = EB_QUICK_BYTES;
    if (strcmp(a, "--verbose") == 0)
        o->verbose = true;
    if (strcmp(a, "--quick") == 0 || strcmp(a, "--verbose") == 0)
        return 0;
    (*i)++;
    if (strcmp(a, "--transport") == 0)
        return parse_transport(o, v) ? 0 : 2;
    if (strcmp(a, "--sizes") == 0)
        return parse_sizes(o, v) ? 0 : 2;
    if (strcmp(a, "--reps") == 0)
        return kvb_tool_parse_int("--reps", v, 1, 100, &o->reps) ? 0 : 2;
    if (strcmp(a, "--op") == 0 && v != NULL && (!strcmp(v, "read") || !strcmp(v, "write"))) {
        o->read = strcmp(v, "read") == 0;
        return 0;
    }
    if (strcmp(a, "--op") == 0) {
        fprintf(stderr, "kvbridge: --op needs write or read\n");
        return 2;
    }
    if (strcmp(a, "--json") == 0 || strcmp(a, "--host") == 0) {
        if (v == NULL || v[0] == '\0' || strlen(v) > 100) {
            fprintf(stderr, "kvbridge: %s needs a value (at most 100 characters)\n", a);
            return 2;
        }
        *(a[2] == 'j' ? &o->json : &o->host) = v;
        return 0;
    }
    fprintf(stderr, "kvbridge: engine-bench: unknown option '%s' (see --help)\n", a);
    return 2;
}

static int parse_opts(eb_opts_t *o, int argc, char **argv)
{
    defaults(o);
    for (int i = 1; i < argc; i++) {
        int rc = parse_one(o, argc, argv, &i);
        if (rc != 0)
            return rc;
    }
    return check_sizes(o) ? 0 : 2;
}

/* ------------------------------------------------------------- block lists */

static uint64_t pattern_seed(size_t si, long long rep)
{
    return (uint64_t)si * 1000 + (uint64_t)rep + 1;
}

/* Blocks of size bs: local side sequential (c->src), the target's side a
 * seeded permutation of the slots of its working set; reads name them the
 * other way (src = the target's). Returns the block count. */
static size_t build_blocks(eb_ctx_t *c, size_t bs, uint64_t dst_base)
{
    size_t n = c->o->ws / bs;
    kvb_eb_permute(c->perm, n, 0x6b76627269646765ull ^ bs);
    for (size_t i = 0; i < n; i++) {
        uint64_t local = (uint64_t)(uintptr_t)(c->src + i * bs);
        uint64_t remote = dst_base + (uint64_t)c->perm[i] * bs;
        c->blocks[i].src = c->o->read ? remote : local;
        c->blocks[i].dst = c->o->read ? local : remote;
        c->blocks[i].len = bs;
    }
    return n;
}

/* Checksum the destination must have after the blocks of the last build. */
static uint64_t expected_sum(const eb_ctx_t *c, size_t n, size_t bs)
{
    uint64_t sum = 0;
    for (size_t i = 0; i < n; i++)
        sum += kvb_eb_cksum(c->src + i * bs, bs, (uint64_t)c->perm[i] * bs / 8);
    return sum;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, size_t n)
{
    qsort(v, n, sizeof(*v), cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static double gbps(size_t bytes, double seconds)
{
    return seconds > 0 ? (double)bytes / seconds / 1e9 : 0;
}

/* ---------------------------------------------------------- memcpy baseline */

static double memcpy_once(eb_ctx_t *c, size_t n)
{
    double t0 = kvb_tool_now();
    for (size_t i = 0; i < n; i++)
        memcpy((void *)(uintptr_t)c->blocks[i].dst, (const void *)(uintptr_t)c->blocks[i].src,
               c->blocks[i].len);
    return kvb_tool_now() - t0;
}

/* memcpy of the same blocks into a local buffer; also checks the tool's own
 * checksum bookkeeping (a mismatch here is a bug of this tool). */
static bool run_memcpy(eb_ctx_t *c, size_t si)
{
    size_t bs = c->o->sizes[si];
    size_t n = build_blocks(c, bs, (uint64_t)(uintptr_t)c->local);
    double t[100];
    kvb_eb_fill(c->src, n * bs, pattern_seed(si, 0));
    for (long long r = 0; r < c->o->reps; r++)
        t[r] = memcpy_once(c, n);
    c->memcpy_gbps[si] = gbps(n * bs, median(t, (size_t)c->o->reps));
    if (kvb_eb_cksum(c->local, n * bs, 0) != expected_sum(c, n, bs)) {
        fprintf(stderr, "kvbridge: engine-bench: internal checksum self-test failed\n");
        return false;
    }
    return true;
}

/* ------------------------------------------------------------- target side */

static bool target_sum(kvb_eb_chan_t *ch, size_t off, size_t len, uint64_t *sum_p, char *err,
                       size_t cap)
{
    char line[128];
    if (!kvb_eb_send(ch, "sum %zu %zu", off, len) ||
        !kvb_eb_recv(ch, line, sizeof(line), EB_REPLY_TIMEOUT_S)) {
        snprintf(err, cap, "checksum request: %s", ch->wfd < 0 ? "no target" : line);
        return false;
    }
    if (sscanf(line, "sum %" SCNx64, sum_p) != 1) {
        snprintf(err, cap, "checksum request: target said '%s'", line);
        return false;
    }
    return true;
}

static bool target_ready(eb_target_t *t, char *err, size_t cap)
{
    char line[256];
    unsigned port;
    if (!kvb_eb_recv(&t->ch, line, sizeof(line), EB_READY_TIMEOUT_S)) {
        snprintf(err, cap, "target did not start: %s", line);
        return false;
    }
    if (sscanf(line, "ready %127s %" SCNx64 " %zu %u", t->session, &t->dst_base, &t->bytes,
               &port) != 4 ||
        port > 65535) {
        snprintf(err, cap, "target: %s", line);
        return false;
    }
    t->tcp_port = (uint16_t)port;
    return true;
}

static bool target_start(const eb_opts_t *o, eb_lane_t lane, eb_target_t *t, char *err, size_t cap)
{
    char ws[32], ppid[32];
    snprintf(ws, sizeof(ws), "%zu", o->ws);
    snprintf(ppid, sizeof(ppid), "%ld", (long)getpid());
    char *argv[] = {"kvbridge",
                    "engine-target",
                    "--transport",
                    (char *)lane_name(lane),
                    "--host",
                    (char *)o->host,
                    "--bytes",
                    ws,
                    "--parent-pid",
                    ppid,
                    NULL};
    if (!kvb_eb_spawn(&t->ch, "/proc/self/exe", argv)) {
        snprintf(err, cap, "cannot start the target process");
        return false;
    }
    return target_ready(t, err, cap);
}

/* -------------------------------------------------------------- engine lane */

static kvb_engine_h engine_open(const eb_opts_t *o, eb_lane_t lane, void *buf, char *err,
                                size_t cap)
{
    kvb_engine_params_t p;
    kvb_engine_h e = NULL;
    memset(&p, 0, sizeof(p));
    p.field_mask = KVB_ENGINE_PARAM_TRANSPORT | KVB_ENGINE_PARAM_HOST | KVB_ENGINE_PARAM_PORT;
    p.transport = lane_transport(lane);
    p.host = o->host;
    p.port = 0;
    kvb_status_t st = kvb_engine_create(&p, &e);
    if (st != KVB_OK) {
        snprintf(err, cap, "kvb_engine_create: %s", kvb_status_string(st));
        return NULL;
    }
    st = kvb_engine_register(e, buf, o->ws, KVB_MEM_HOST);
    if (st != KVB_OK) {
        snprintf(err, cap, "kvb_engine_register: %s: %s", kvb_status_string(st),
                 kvb_engine_last_error(e));
        kvb_engine_destroy(e);
        return NULL;
    }
    return e;
}

/* Every block written (read: read) in batches of at most EB_BATCH_MAX. */
static bool write_all(kvb_engine_h e, const char *sid, const kvb_block_t *b, size_t n, bool read,
                      char *err, size_t cap)
{
    for (size_t off = 0; off < n; off += EB_BATCH_MAX) {
        size_t cnt = n - off < EB_BATCH_MAX ? n - off : EB_BATCH_MAX;
        kvb_status_t st = read ? kvb_engine_read(e, sid, b + off, cnt, EB_WRITE_TIMEOUT_S)
                               : kvb_engine_write(e, sid, b + off, cnt, EB_WRITE_TIMEOUT_S);
        if (st != KVB_OK) {
            snprintf(err, cap, "kvb_engine_%s: %s: %s", read ? "read" : "write",
                     kvb_status_string(st), kvb_engine_last_error(e));
            return false;
        }
    }
    return true;
}

/* The bytes of a pass with this seed: a write's in our source, a read's in
 * the target's memory (filled by the target, untimed). */
static bool pass_fill(eb_ctx_t *c, eb_target_t *t, size_t bytes, uint64_t seed, eb_row_t *row)
{
    char line[128];
    if (!c->o->read) {
        kvb_eb_fill(c->src, bytes, seed);
        return true;
    }
    if (!kvb_eb_send(&t->ch, "fill %" PRIu64, seed) ||
        !kvb_eb_recv(&t->ch, line, sizeof(line), EB_REPLY_TIMEOUT_S) ||
        strcmp(line, "fill ok") != 0) {
        snprintf(row->error, sizeof(row->error), "target fill: %s", line);
        return false;
    }
    return true;
}

/* Timed engine writes of size index si; leaves the median in row. */
static bool time_writes(eb_ctx_t *c, kvb_engine_h e, eb_target_t *t, size_t si, eb_row_t *row)
{
    size_t bs = c->o->sizes[si];
    size_t n = build_blocks(c, bs, t->dst_base);
    double tm[100];
    for (long long r = 0; r < c->o->reps; r++) {
        /* A fresh pattern each repetition: a repetition that moves nothing
         * leaves the previous pattern, and verification catches it. */
        if (!pass_fill(c, t, c->o->read ? c->o->ws : n * bs, pattern_seed(si, r), row))
            return false;
        double t0 = kvb_tool_now();
        if (!write_all(e, t->session, c->blocks, n, c->o->read, row->error, sizeof(row->error)))
            return false;
        tm[r] = kvb_tool_now() - t0;
        if (c->o->verbose)
            fprintf(stderr, "engine-bench: %s %zu B rep %lld: %.4f s, %.3f GB/s\n",
                    lane_name(row->lane), bs, r, tm[r], gbps(n * bs, tm[r]));
    }
    row->bytes = n * bs;
    row->seconds = median(tm, (size_t)c->o->reps);
    row->gbps = gbps(row->bytes, row->seconds);
    return true;
}

/* Expected checksum of destination slots [a, b); inv maps slot → block. */
static uint64_t expected_slots(const eb_ctx_t *c, const uint32_t *inv, size_t a, size_t b,
                               size_t bs)
{
    uint64_t sum = 0;
    for (size_t s = a; s < b; s++)
        sum += kvb_eb_cksum(c->src + (size_t)inv[s] * bs, bs, (uint64_t)s * bs / 8);
    return sum;
}

/* After a mismatch: bisect over destination slots for the first bad block,
 * so the report names a range the engine's authors can look at. */
static void locate_bad(const eb_ctx_t *c, eb_target_t *t, size_t n, size_t bs, eb_row_t *row)
{
    uint32_t *inv = malloc(n * sizeof(*inv));
    size_t lo = 0, hi = n, len = strlen(row->error);
    char err[200]; /* holds a target reply (128) and its prefix */
    uint64_t got;
    if (inv == NULL)
        return;
    for (size_t i = 0; i < n; i++)
        inv[c->perm[i]] = (uint32_t)i;
    while (hi - lo > 1) {
        size_t mid = lo + (hi - lo) / 2;
        if (!target_sum(&t->ch, lo * bs, (mid - lo) * bs, &got, err, sizeof(err)))
            break;
        if (got != expected_slots(c, inv, lo, mid, bs))
            hi = mid;
        else
            lo = mid;
    }
    if (hi - lo == 1)
        snprintf(row->error + len, sizeof(row->error) - len,
                 "; first bad block: destination offset %zu (source block %u, offset %zu)", lo * bs,
                 inv[lo], (size_t)inv[lo] * bs);
    free(inv);
}

/* A read pass of the last repetition's pattern: block i here is slot
 * perm[i] of the target's memory, which c->local now holds as the target
 * does. */
static bool verify_read(eb_ctx_t *c, size_t si, size_t bs, eb_row_t *row)
{
    size_t n = c->o->ws / bs;
    kvb_eb_fill(c->local, c->o->ws, pattern_seed(si, c->o->reps - 1));
    for (size_t i = 0; i < n; i++)
        if (memcmp(c->src + i * bs, c->local + (size_t)c->perm[i] * bs, bs) != 0) {
            snprintf(row->error, sizeof(row->error),
                     "read block %zu (target offset %zu, %zu bytes) differs from the target's", i,
                     (size_t)c->perm[i] * bs, bs);
            return false;
        }
    return true;
}

static bool verify(eb_ctx_t *c, eb_target_t *t, size_t bs, eb_row_t *row)
{
    size_t n = c->o->ws / bs;
    uint64_t want = expected_sum(c, n, bs), got = 0;
    if (!target_sum(&t->ch, 0, n * bs, &got, row->error, sizeof(row->error)))
        return false;
    if (got != want) {
        snprintf(row->error, sizeof(row->error),
                 "destination checksum mismatch over %zu blocks of %zu bytes: expected "
                 "%016" PRIx64 ", target has %016" PRIx64,
                 n, bs, want, got);
        locate_bad(c, t, n, bs, row);
        return false;
    }
    return true;
}

/* Raw single-stream TCP of the same byte count into the target's buffer. */
static bool time_tcp(eb_ctx_t *c, eb_target_t *t, eb_row_t *row)
{
    double tm[101];
    char line[128];
    /* One untimed stream first: a fresh process's first stream runs at about
     * half speed (socket buffer memory), which would flatter the engine. */
    for (long long r = 0; r <= c->o->reps; r++) {
        if (!kvb_eb_send(&t->ch, "tcp %zu", row->bytes) ||
            !kvb_eb_send_stream(c->o->host, t->tcp_port, c->src, row->bytes, &tm[r]) ||
            !kvb_eb_recv(&t->ch, line, sizeof(line), EB_REPLY_TIMEOUT_S) ||
            strcmp(line, "tcp ok") != 0) {
            snprintf(row->error, sizeof(row->error), "raw TCP baseline failed (target stopped)");
            kvb_eb_stop(&t->ch, 0); /* it may sit in accept(); later steps fail fast */
            return false;
        }
    }
    row->tcp_gbps = gbps(row->bytes, median(tm + 1, (size_t)c->o->reps));
    return true;
}

/* The first pass over a fresh target's memory (after the session opened),
 * timed on its own: on the direct lane every destination page is written
 * for the first time through the writer's new mapping. */
static bool time_cold(eb_ctx_t *c, kvb_engine_h e, eb_target_t *t, size_t si, eb_row_t *row)
{
    size_t bs = c->o->sizes[si];
    size_t n = build_blocks(c, bs, t->dst_base);
    if (!pass_fill(c, t, c->o->read ? c->o->ws : n * bs, pattern_seed(si, 1000), row))
        return false;
    double t0 = kvb_tool_now();
    if (!write_all(e, t->session, c->blocks, n, c->o->read, row->error, sizeof(row->error)))
        return false;
    row->cold_seconds = kvb_tool_now() - t0;
    row->cold_gbps = gbps(n * bs, row->cold_seconds);
    return true;
}

static void run_size(eb_ctx_t *c, kvb_engine_h e, eb_target_t *t, size_t si, eb_row_t *row)
{
    if (!time_cold(c, e, t, si, row) || !time_writes(c, e, t, si, row))
        return;
    if (c->o->read ? !verify_read(c, si, row->block_size, row)
                   : !verify(c, t, row->block_size, row))
        return;
    row->verified = true;
    if (row->lane == EB_TCP)
        time_tcp(c, t, row); /* a failure leaves verified but sets error */
}

/* ------------------------------------------------------------------ output */

static void fmt_size(size_t b, char *out, size_t cap)
{
    if (b >= (1u << 20) && b % (1u << 20) == 0)
        snprintf(out, cap, "%zu MiB", b >> 20);
    else if (b >= 1024 && b % 1024 == 0)
        snprintf(out, cap, "%zu KiB", b >> 10);
    else
        snprintf(out, cap, "%zu B", b);
}

static void print_header(const eb_opts_t *o)
{
    char ws[32];
    fmt_size(o->ws, ws, sizeof(ws));
    printf("engine-bench: %s, working set %s, %lld repetitions (median), host %s, GB = 1e9 B\n\n",
           o->read ? "one-sided reads" : "writes", ws, o->reps, o->host);
    printf("%-9s %8s %9s %12s %9s %7s %9s %8s %s\n", "transport", "block", "GB/s", "memcpy GB/s",
           "tcp GB/s", "ratio", "cold GB/s", "open ms", "verified");
    fflush(stdout);
}

static void print_row(const eb_row_t *r)
{
    char bs[32], tcp[32];
    fmt_size(r->block_size, bs, sizeof(bs));
    if (r->lane == EB_TCP)
        snprintf(tcp, sizeof(tcp), "%.3f", r->tcp_gbps);
    else
        snprintf(tcp, sizeof(tcp), "-");
    printf("%-9s %8s %9.3f %12.3f %9s %7.3f %9.3f %8.1f %s\n", lane_name(r->lane), bs, r->gbps,
           r->memcpy_gbps, tcp, r->ratio, r->cold_gbps, r->open_ms, r->verified ? "yes" : "NO");
    if (r->error[0])
        printf("    %s\n", r->error);
    fflush(stdout);
}

static void json_str(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\')
            fprintf(f, "\\%c", ch);
        else if (ch < 0x20)
            fprintf(f, "\\u%04x", ch);
        else
            fputc(ch, f);
    }
    fputc('"', f);
}

static void json_row(FILE *f, const eb_row_t *r, bool last)
{
    fprintf(f, "  {\"transport\": \"%s\", \"op\": \"%s\", \"block_size\": %zu, \"bytes\": %zu, ",
            lane_name(r->lane), r->read ? "read" : "write", r->block_size, r->bytes);
    fprintf(f, "\"seconds\": %.6f, \"gbps\": %.4f, \"memcpy_gbps\": %.4f, ", r->seconds, r->gbps,
            r->memcpy_gbps);
    if (r->lane == EB_TCP)
        fprintf(f, "\"tcp_gbps\": %.4f, ", r->tcp_gbps);
    fprintf(f, "\"cold_seconds\": %.6f, \"cold_gbps\": %.4f, \"open_ms\": %.3f, ", r->cold_seconds,
            r->cold_gbps, r->open_ms);
    fprintf(f, "\"ratio\": %.4f, \"verified\": %s", r->ratio, r->verified ? "true" : "false");
    if (r->error[0]) {
        fprintf(f, ", \"error\": ");
        json_str(f, r->error);
    }
    fprintf(f, "}%s\n", last ? "" : ",");
}

static bool write_json(const eb_ctx_t *c, const char *path)
{
    FILE *f = fopen(path, "w");
    if (f == NULL) {
        perror(path);
        return false;
    }
    fprintf(f, "[\n");
    for (size_t i = 0; i < c->nrows; i++)
        json_row(f, &c->rows[i], i + 1 == c->nrows);
    fprintf(f, "]\n");
    bool ok = !ferror(f);
    if (fclose(f) != 0 || !ok) {
        fprintf(stderr, "kvbridge: writing %s failed\n", path);
        return false;
    }
    return true;
}

/* ------------------------------------------------------------------ driver */

static void finish_row(eb_ctx_t *c, eb_row_t *row, size_t si)
{
    double base = row->lane == EB_TCP ? row->tcp_gbps : c->memcpy_gbps[si];
    row->memcpy_gbps = c->memcpy_gbps[si];
    row->ratio = base > 0 ? row->gbps / base : 0;
    if (!row->verified && row->error[0] == '\0')
        snprintf(row->error, sizeof(row->error), "not verified");
    print_row(row);
}

static eb_row_t *new_row(eb_ctx_t *c, eb_lane_t lane, size_t si)
{
    eb_row_t *row = &c->rows[c->nrows++];
    memset(row, 0, sizeof(*row));
    row->lane = lane;
    row->read = c->o->read;
    row->block_size = c->o->sizes[si];
    row->bytes = c->o->ws / row->block_size * row->block_size;
    return row;
}

/* Open the session with one small block, outside the timed passes (the
 * handshake and, on the direct lane, mapping the target's memory): open_ms. */
static bool open_session(eb_ctx_t *c, kvb_engine_h e, const eb_target_t *t, eb_row_t *row)
{
    kvb_block_t b = {(uint64_t)(uintptr_t)c->src, t->dst_base, EB_MIN_BLOCK};
    if (c->o->read)
        b = (kvb_block_t){t->dst_base, (uint64_t)(uintptr_t)c->src, EB_MIN_BLOCK};
    double t0 = kvb_tool_now();
    bool ok = write_all(e, t->session, &b, 1, c->o->read, row->error, sizeof(row->error));
    row->open_ms = (kvb_tool_now() - t0) * 1e3;
    /* The other lanes' targets hold plain memory: never direct. */
    if (ok && (kvb_engine_session_direct(e, t->session) == 1) != (row->lane == EB_DIRECT)) {
        snprintf(row->error, sizeof(row->error), "the session %s the direct lane",
                 row->lane == EB_DIRECT ? "does not use" : "unexpectedly uses");
        return false;
    }
    return ok;
}

/* One row: a fresh target (fresh memory, new session), so every row has its
 * own cold first pass. */
static void run_row(eb_ctx_t *c, kvb_engine_h e, size_t si, eb_row_t *row)
{
    eb_target_t t;
    bool ok = target_start(c->o, row->lane, &t, row->error, sizeof(row->error));
    if (ok && t.bytes < c->o->ws) {
        snprintf(row->error, sizeof(row->error), "target registered %zu bytes, want %zu", t.bytes,
                 c->o->ws);
        ok = false;
    }
    if (ok && open_session(c, e, &t, row))
        run_size(c, e, &t, si, row);
    kvb_eb_stop(&t.ch, 5.0);
}

static void run_lane(eb_ctx_t *c, eb_lane_t lane)
{
    char err[320] = "";
    kvb_engine_h e = engine_open(c->o, lane, c->src, err, sizeof(err));
    for (size_t si = 0; si < c->o->nsizes; si++) {
        eb_row_t *row = new_row(c, lane, si);
        if (e != NULL)
            run_row(c, e, si, row);
        else
            snprintf(row->error, sizeof(row->error), "%s", err);
        finish_row(c, row, si);
    }
    if (e != NULL)
        kvb_engine_destroy(e);
}

static bool ctx_init(eb_ctx_t *c, const eb_opts_t *o)
{
    size_t min = o->sizes[0];
    for (size_t i = 1; i < o->nsizes; i++)
        min = o->sizes[i] < min ? o->sizes[i] : min;
    memset(c, 0, sizeof(*c));
    c->o = o;
    c->src = kvb_eb_alloc(o->ws);
    c->local = kvb_eb_alloc(o->ws);
    c->blocks = calloc(o->ws / min, sizeof(*c->blocks));
    c->perm = calloc(o->ws / min, sizeof(*c->perm));
    if (c->src == NULL || c->local == NULL || c->blocks == NULL || c->perm == NULL) {
        fprintf(stderr, "kvbridge: engine-bench: out of memory for %zu-byte buffers\n", o->ws);
        return false;
    }
    return true;
}

static void ctx_free(eb_ctx_t *c)
{
    kvb_eb_free(c->src, c->o->ws);
    kvb_eb_free(c->local, c->o->ws);
    free(c->blocks);
    free(c->perm);
}

static int report(const eb_ctx_t *c)
{
    size_t bad = 0;
    for (size_t i = 0; i < c->nrows; i++)
        bad += !c->rows[i].verified || c->rows[i].error[0] != '\0';
    if (c->o->json != NULL && !write_json(c, c->o->json))
        return 1;
    if (bad != 0)
        fprintf(stderr, "kvbridge: engine-bench: %zu of %zu results failed\n", bad, c->nrows);
    return bad == 0 ? 0 : 1;
}

int kvb_cmd_engine_bench(int argc, char **argv)
{
    eb_ctx_t ctx;
    eb_opts_t o;
    int rc = parse_opts(&o, argc, argv);
    if (rc != 0) {
        if (rc == 1)
            usage(stdout);
        return rc == 1 ? 0 : 2;
    }
    signal(SIGPIPE, SIG_IGN);
    /* Every row's target leaves when the row is done: no "session lost"
     * noise (a failure inside a row is reported with the row). */
    if (getenv("KVBRIDGE_LOG") == NULL)
        kvb_log_set_level(KVB_LOG_ERROR);
    rc = 1;
    if (!ctx_init(&ctx, &o))
        goto free_ctx;
    for (size_t si = 0; si < o.nsizes; si++)
        if (!run_memcpy(&ctx, si))
            goto free_ctx;
    print_header(&o);
    for (size_t li = 0; li < o.nlanes; li++)
        run_lane(&ctx, o.lanes[li]);
    rc = report(&ctx);
free_ctx:
    ctx_free(&ctx);
    return rc;
}

/* ========================================================== target process */

typedef struct eb_tgt {
    eb_lane_t lane;
    const char *host;
    long long bytes, parent;
    FILE *out; /* the protocol pipe; stdout itself goes to stderr */
    kvb_engine_h engine;
    char *buf;
    int lfd;
} eb_tgt_t;

static bool tgt_opt(eb_tgt_t *t, const char *a, const char *v)
{
    if (strcmp(a, "--transport") == 0)
        return parse_lane(v, &t->lane);
    if (strcmp(a, "--bytes") == 0)
        return kvb_tool_parse_int(a, v, 8, 1LL << 40, &t->bytes);
    if (strcmp(a, "--parent-pid") == 0)
        return kvb_tool_parse_int(a, v, 1, 1LL << 31, &t->parent);
    if (strcmp(a, "--host") == 0)
        t->host = v;
    return strcmp(a, "--host") == 0;
}

static bool tgt_opts(eb_tgt_t *t, int argc, char **argv)
{
    t->lane = EB_AUTO;
    t->host = "127.0.0.1";
    t->bytes = (long long)EB_QUICK_BYTES;
    for (int i = 1; i < argc; i += 2)
        if (i + 1 >= argc || !tgt_opt(t, argv[i], argv[i + 1])) {
            fprintf(stderr,
                    "kvbridge: engine-target: bad option '%s' (internal command of "
                    "engine-bench)\n",
                    argv[i]);
            return false;
        }
    return true;
}

static bool tgt_open(eb_tgt_t *t, char *err, size_t cap)
{
    eb_opts_t o;
    defaults(&o);
    o.host = t->host;
    o.ws = (size_t)t->bytes;
    t->buf = t->lane == EB_DIRECT ? kvb_eb_alloc_shared(o.ws) : kvb_eb_alloc(o.ws);
    if (t->buf == NULL) {
        snprintf(err, cap, "cannot allocate %zu bytes", o.ws);
        return false;
    }
    t->engine = engine_open(&o, t->lane, t->buf, err, cap);
    return t->engine != NULL;
}

static void tgt_close(eb_tgt_t *t)
{
    if (t->lfd >= 0)
        close(t->lfd);
    if (t->engine != NULL)
        kvb_engine_destroy(t->engine);
    if (t->lane == EB_DIRECT)
        kvb_eb_free_shared(t->buf);
    else
        kvb_eb_free(t->buf, (size_t)t->bytes);
}

static void tgt_sum(eb_tgt_t *t, const char *line)
{
    unsigned long long off, len;
    size_t size = (size_t)t->bytes;
    if (sscanf(line, "sum %llu %llu", &off, &len) != 2 || off % 8 || len % 8 || off > size ||
        len > size - off) {
        fprintf(t->out, "error bad sum request\n");
        return;
    }
    fprintf(t->out, "sum %" PRIx64 "\n", kvb_eb_cksum(t->buf + off, len, off / 8));
}

static void tgt_tcp(eb_tgt_t *t, const char *line)
{
    unsigned long long len;
    if (sscanf(line, "tcp %llu", &len) != 1 || len > (unsigned long long)t->bytes) {
        fprintf(t->out, "error bad tcp request\n");
        return;
    }
    fprintf(t->out, kvb_eb_sink_one(t->lfd, t->buf, len) ? "tcp ok\n" : "tcp failed\n");
}

static void tgt_fill(eb_tgt_t *t, const char *line)
{
    unsigned long long seed;
    if (sscanf(line, "fill %llu", &seed) != 1) {
        fprintf(t->out, "error bad fill request\n");
        return;
    }
    kvb_eb_fill(t->buf, (size_t)t->bytes, seed);
    fprintf(t->out, "fill ok\n");
}

static void tgt_loop(eb_tgt_t *t)
{
    char line[256];
    while (fgets(line, sizeof(line), stdin) != NULL) {
        line[strcspn(line, "\n")] = '\0';
        if (strcmp(line, "quit") == 0)
            break;
        if (strncmp(line, "sum ", 4) == 0)
            tgt_sum(t, line);
        else if (strncmp(line, "tcp ", 4) == 0)
            tgt_tcp(t, line);
        else if (strncmp(line, "fill ", 5) == 0)
            tgt_fill(t, line);
        else
            fprintf(t->out, "error unknown request\n");
        fflush(t->out);
    }
}

static FILE *tgt_protocol_out(void)
{
    int fd = dup(1);
    FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
    /* Anything else written to stdout (a library's chatter) must not land on
     * the protocol pipe. */
    if (f != NULL && dup2(2, 1) < 0) {
        fclose(f);
        f = NULL;
    }
    return f;
}

int kvb_cmd_engine_target(int argc, char **argv)
{
    eb_tgt_t t;
    char err[320] = "";
    uint16_t port = 0;
    memset(&t, 0, sizeof(t));
    t.lfd = -1;
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (!tgt_opts(&t, argc, argv) || (t.parent != 0 && getppid() != (pid_t)t.parent))
        return 2;
    if ((t.out = tgt_protocol_out()) == NULL)
        return 1;
    if (tgt_open(&t, err, sizeof(err)) && (t.lfd = kvb_eb_listen(t.host, &port)) < 0)
        snprintf(err, sizeof(err), "cannot open the tcp sink on %s", t.host);
    if (err[0] == '\0') {
        fprintf(t.out, "ready %s %" PRIx64 " %lld %u\n", kvb_engine_session_id(t.engine),
                (uint64_t)(uintptr_t)t.buf, t.bytes, (unsigned)port);
        fflush(t.out);
        tgt_loop(&t);
    } else {
        fprintf(t.out, "error %s\n", err);
        fflush(t.out);
    }
    tgt_close(&t);
    fclose(t.out);
    return err[0] ? 1 : 0;
}
