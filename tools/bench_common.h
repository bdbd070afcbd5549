/* `kvbridge bench` internals (CLI-only): options, model geometry, the byte
 * pattern, rank pools, the rank processes and the driver.
 *
 * Processes: the driver (the command the user ran) spawns
 *   `kvbridge bench --role bootstrap-child ...`  the bootstrap server,
 *   `kvbridge bench --role prefill-rank ...`     one per prefill (dp, tp, pp),
 *   `kvbridge bench --role decode-rank ...`      one per decode tp rank,
 * and drives them over their stdin/stdout with one-line messages:
 *   child  → "ready <text>" | "error <text>"
 *   prefill: "fill <room> <pages> <aux>" → "filled <room>"
 *            "send <room>"               → "sent <room> <t_first> <t_compute_end> <stages>" |
 *                                          "fail <room> <why>"
 *            "hold <room>"               → "held <room>" (sender in WaitingForInput;
 *                                          a later "send" sends it) | "fail <room> <why>"
 *   decode:  "recv <room> <pages> <aux> [sweep|hold]" → "inited <room> <t_init>", then
 *                                          "ok <room> <t_success> <stages>" |
 *                                          "fail <room> <why>"
 *            "verify <room>"             → "verified <room> <wrong bytes | -1>"
 *   with --timelines (the driver's --trace / --report), before each "sent",
 *   "ok" and "fail": "tl <room> <tp> <ok 0|1> <t_created> <t_terminal>
 *   <t_last> <n> (<stage> <t_a> <t_b>){n} <why>" (bench_view.c)
 *   all:     "quit"
 * ("sweep": a warm-up room; the decode takes the next pages of its sweep
 * over the pool instead of random ones. "hold" (also on "fill"): a --hold
 * room, kept in the rank's hold slots, without the bench's own time-out
 * while held. Under --layerwise every room is sent "hold" first and "send"
 * once all ranks of its group held it, so they compute rooms in one order.)
 * ("sent": t_compute_end is when the rank's simulated forward pass of the
 * room ended, its last piece queued (--layerwise), else t_first; a driver
 * that reads one number still works, and one that reads two takes a
 * missing second as t_first.)
 * Times are CLOCK_MONOTONIC seconds (comparable between processes of one
 * host). Children die with the driver (PR_SET_PDEATHSIG) and on EOF. */
#ifndef KVB_BENCH_COMMON_H
#define KVB_BENCH_COMMON_H

#include <kvbridge/kvbridge.h>
#include <kvbridge/conn.h>
#include <kvbridge/plan.h>

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

#define BENCH_AUX_ITEM 64u
#define BENCH_MAX_FAIL_SHOWN 5
#define BENCH_MAX_PROCS 64 /* rank processes one driver starts */
#define BENCH_MAX_RANKS_PER_PROC 128
#define BENCH_MAX_RES 81 /* driver + bootstrap + rank processes */
#define BENCH_MAX_DP 16

typedef enum bench_role {
    BENCH_ROLE_ALL = 0, /* both sides and the bootstrap server on this host */
    BENCH_ROLE_BOOTSTRAP,
    BENCH_ROLE_PREFILL, /* driver of this host's prefill ranks only */
    BENCH_ROLE_DECODE,  /* driver of this host's decode ranks only */
    BENCH_ROLE_PREFILL_RANK,
    BENCH_ROLE_DECODE_RANK
} bench_role_t;

typedef struct bench_model {
    char name[48];
    int layers, kv_heads, head_dim, dtype_bytes, mla;
} bench_model_t;

typedef struct bench_opts {
    bench_model_t m;
    int page, ptp, dtp, ppp, dp;
    int dpage;  /* --decode-page-size (default: page): the decode's tokens per page */
    int dorder; /* --decode-layout nhd|hnd: the decode's page order (kvb_plan_order_t) */
    long long requests, conc, prompt_len, chunk, seed;
    long long warmup; /* untimed passes over the pools before the timed requests */
    kvb_transport_t transport;
    const char *json;
    bool progress;
    bench_role_t role;
    bool child;   /* spawned by a driver: ignore SIGINT, die with it */
    bool corrupt; /* test hook: decode rank 0 flips one byte before verifying */
    /* soak hooks (hidden): abort that share of rooms, random chunk sizes,
     * VmRSS/fd report of every process */
    double abort_rate;
    bool random_chunks, resource_report;
    bool scale; /* --scale: tiny geometry, per-room CPU and memory */
    char bootstrap[128];
    const char *host;
    double timeout_s;
    /* rank processes (set by the driver) */
    int tp_rank, pp_rank, dp_rank;
    /* --ranks-per-process K: each rank process hosts up to K ranks of one
     * side (consecutive TP ranks), each with its own engine and manager;
     * 0 = as few as fit BENCH_MAX_PROCS (1 up to 64 ranks). In a rank
     * process: how many it hosts, from --tp-rank on. */
    long long rpp;
    long long pool_pages, wave;
    /* --hold N (--scale): N more rooms per rank created before the timed
     * waves and held in flight (decode receivers inited, prefill senders in
     * WaitingForInput, no KV sent) during them, then sent and verified */
    long long hold;
    bool cuda;       /* --memory cuda: pools in device memory (bench_cuda.c) */
    int cuda_device; /* --device N */
    /* --layerwise MS: the prefill ranks simulate each chunk's forward pass,
     * MS milliseconds per layer, and send layer by layer or after the
     * chunk's last layer (bench_room_layerwise); < 0 = off */
    double layerwise_ms;
    /* --trace FILE / --report FILE: the run as Chrome trace events and as
     * one HTML page (bench_view.c, bench_html.c); the driver then starts
     * its ranks with --timelines: each room's stages as a "tl" line */
    const char *trace, *report;
    bool timelines;
} bench_opts_t;

/* What one rank holds. */
typedef struct bench_rank_geom {
    int tp, tp_size, pp, pp_size;
    int first_layer, n_layers, local_heads, first_head, n_kv;
    uint64_t head_bytes, row_bytes, item_len;
    int page, order; /* tokens per page and page order of this side */
} bench_rank_geom_t;

/* ---- options (bench_opts.c) ---- */

/* Parse argv (argv[0] = "bench"). 0 ok, 1 help printed, 2 error printed. */
int bench_parse(bench_opts_t *o, int argc, char **argv);
const char *bench_transport_name(kvb_transport_t t);
/* Geometry of rank (tp of tp_size, pp of pp_size). */
void bench_rank_geom(const bench_opts_t *o, int tp, int tp_size, int pp, int pp_size,
                     bench_rank_geom_t *g_p);
uint64_t bench_pages_per_request(const bench_opts_t *o);
/* The same in the decode's pages (--decode-page-size). */
uint64_t bench_decode_pages_per_request(const bench_opts_t *o);
/* Token rows of a request that reach the decode: its pages' rows on both
 * sides (the prefill's last page is sent as far as the decode's goes). */
uint64_t bench_rows_sent(const bench_opts_t *o);
/* The decode geometry of rank tp of tp_size (its page size and order). */
void bench_decode_geom(const bench_opts_t *o, int tp, int tp_size, bench_rank_geom_t *g_p);
/* Bytes every decode rank together receives for one request (KV + aux). */
uint64_t bench_request_bytes(const bench_opts_t *o);
/* Requests whose pages both pools hold at once (a wave); 0 when even
 * --concurrency requests do not fit in memory (reason printed). */
long long bench_wave(const bench_opts_t *o);
/* Pages of each rank's pool for a wave of that many requests and the
 * --hold rooms. */
long long bench_pool_pages(const bench_opts_t *o, long long wave);
/* Requests of the warm-up passes: enough for each DP group's sweep to
 * cover every decode pool page once per pass. */
long long bench_warmup_requests(const bench_opts_t *o, long long pool_pages);

/* --abort-rate: which side aborts room (deterministic in seed and room, so
 * the driver and every rank agree). */
enum { BENCH_ABORT_NONE, BENCH_ABORT_PREFILL, BENCH_ABORT_DECODE };
int bench_abort_side(const bench_opts_t *o, uint64_t room);
/* Chunks the prefill sends before it aborts: 0 .. chunks - 1. */
uint64_t bench_abort_after(const bench_opts_t *o, uint64_t room, uint64_t chunks);
/* Pages per sender_send of room (--chunk, or random with --random-chunks). */
uint64_t bench_chunk_pages(const bench_opts_t *o, uint64_t room, uint64_t pages);
/* --layerwise: room sends each layer as its compute ends (true) or the
 * whole chunk after its last layer (false). Rooms alternate within each DP
 * group, so both modes run side by side in one run. */
bool bench_room_layerwise(const bench_opts_t *o, uint64_t room);

/* ---- pattern and pools (bench_data.c) ---- */

typedef struct bench_pool {
    bench_rank_geom_t g;
    uint8_t *base;
    size_t bytes;
    uint64_t pages;
    uint64_t *kv_ptrs, *kv_lens; /* g.n_kv entries */
    uint8_t *aux;
    uint64_t aux_items;
    int32_t *free_pages;
    int32_t *free_pos; /* page -> its index in free_pages, -1 when taken */
    uint64_t nfree;
    uint64_t sweep[BENCH_MAX_DP]; /* next page of each DP group's warm-up sweep */
    uint64_t rng;
    uint64_t verify_rows; /* rows of a request verify checks (0: every row of its pages) */
    uint8_t *scratch;
    /* --memory cuda: kv_ptrs are device memory; the pattern lives in the
     * host mirror host_ptrs (else NULL) */
    uint64_t *host_ptrs;
    unsigned long long dev;
    int device;
} bench_pool_t;

bool bench_pool_init(bench_pool_t *p, const bench_rank_geom_t *g, uint64_t pages,
                     uint64_t aux_items, uint64_t seed);
void bench_pool_free(bench_pool_t *p);
/* Take n pages at random from the free list (false when short). */
bool bench_pages_take(bench_pool_t *p, int32_t *pages, uint32_t n);
void bench_pages_give(bench_pool_t *p, const int32_t *pages, uint32_t n);
/* Warm-up: take the next n pages of DP group dp's sweep over the pool (in
 * page order, wrapping), so a warm-up pass touches every page; false when
 * one of them is not free. */
bool bench_pages_take_sweep(bench_pool_t *p, int dp, int32_t *pages, uint32_t n);
/* Write the pattern of room into the request's pages (request page i at
 * pages[i]) and aux item aux. page = tokens per page. */
void bench_fill(bench_pool_t *p, int page, uint64_t room, const int32_t *pages, uint32_t n,
                int64_t aux);
/* Wrong bytes of room in this (decode) rank's pages and aux item. */
uint64_t bench_verify(bench_pool_t *p, int page, uint64_t room, const int32_t *pages, uint32_t n,
                      int64_t aux);

/* ---- CUDA device memory (bench_cuda.c) ---- */

/* Move p's KV buffers to device memory (host memory stays as the mirror). */
bool bench_pool_cuda(bench_pool_t *p, int device, char *why, size_t wl);
void bench_pool_cuda_free(bench_pool_t *p);
/* Pages of every KV buffer: mirror to device (after a fill) or back. */
bool bench_pool_cuda_sync(bench_pool_t *p, const int32_t *pages, uint32_t n, bool to_device);
/* Device-to-device copy of one request's volume in item_len runs, GB/s. */
double bench_cuda_memcpy_gbps(const bench_opts_t *o, uint64_t item_len);
/* The driver library used, and whether it is the test double. */
const char *bench_cuda_driver(void);
bool bench_cuda_is_double(void);

/* How rank processes poll their rooms: KVBRIDGE_BENCH_POLL as they read it
 * (bench_rank.c): "changed" (default), "event", "many" or "single". */
const char *bench_poll_name(void);

/* ---- report (bench_report.c) ---- */

/* --resource-report: one process, after warm-up (0) and at the end (1). */
typedef struct bench_res {
    char name[48];
    long rss_kib[2], fds[2];
} bench_res_t;

/* Transfer figures of a set of requests (the timed ones, or the cold first
 * pass over the pools). */
typedef struct bench_phase {
    uint64_t bytes; /* bytes of completed, successful requests */
    double seconds; /* wall time of their transfer phases */
    double *lat_ms; /* per finished request */
    long long nlat;
} bench_phase_t;

typedef struct bench_report {
    long long requests, done, verified, failed; /* the timed requests */
    long long aborted; /* --abort-rate rooms that ended Failed as planned */
    /* warm-up requests (--warmup passes before the timed ones): asked for,
     * verified, aborted as planned, failed */
    long long warm_requests, warm_verified, warm_aborted, warm_failed;
    bench_phase_t steady; /* the timed requests */
    bench_phase_t cold;   /* the first pass: the warm-up, or with --warmup 0 the first wave */
    long long cold_requests;
    double first_ms;          /* latency of the very first request, -1 unknown */
    double memcpy_gbps;       /* memcpy of one request's bytes */
    double memcpy_pages_gbps; /* the same in page runs between random slots */
    double cuda_memcpy_gbps;  /* --memory cuda: device to device, page runs */
    double tcp_gbps;          /* raw loopback TCP stream (--transport tcp), else 0 */
    double plan_us;           /* planner time per request (all rank pairs), -1 unknown */
    char fails[BENCH_MAX_FAIL_SHOWN][240];
    int nfails;
    bool interrupted;
    double last_progress;
    bench_res_t res[BENCH_MAX_RES];
    int nres;
    /* --scale: CPU seconds of every child during the timed waves, rooms in
     * flight at most (dispatched, inited on every decode rank, not done) and
     * the children's summed VmRSS (KiB) before the timed waves and at that
     * most */
    double cpu_s;
    long long max_inflight;
    double rss_idle_kib, rss_peak_kib;
    int nprocs;
    /* --scale: kvb_manager_traffic of every rank summed, timed waves only
     * (end minus start): BENCH_TR_* below; answers counted; timed seconds
     * (wall, fill and verify included: the window heartbeats ran in) */
    double traffic[8];
    int traffic_answers, traffic_ranks;
    double timed_wall_s;
    /* heartbeats since the ranks started, over the run's wall time since then
     * (a timed window can be shorter than one 5 s heartbeat interval) */
    double hb_total, run_wall_s;
    /* --hold: the held rooms verified / failed after the timed waves, and
     * the children's VmRSS (KiB) before and after they were set up */
    long long held_verified, held_failed;
    double rss_prehold_kib, rss_held_kib;
    /* --layerwise, timed requests, per mode (BENCH_LW_*): exposed transfer
     * time (decode Success minus the latest end of the prefill ranks'
     * compute) in exposed[m].lat_ms, and latency from the forward's start
     * to Success in lw_lat[m].lat_ms */
    bench_phase_t exposed[2], lw_lat[2];
    /* timed requests' stages from the rooms' timelines (BENCH_ST_*, ms; the
     * slowest rank of each side): the "stages" line */
    bench_phase_t stage[5];
    /* the "integrity" line: every rank's counters summed at the end
     * (prefill digests sent; decode rooms checked, mismatches, unchecked) */
    unsigned long long integ_sent, integ_checked, integ_mismatches, integ_unchecked;
    int integ_answers;
} bench_report_t;

/* Stages of a room read from its timelines (docs/observe.md), which "sent"
 * (prefill: BENCH_ST_WAIT, _WRITE) and "ok" (decode: BENCH_ST_BOOT, _DXFER,
 * _TOTAL) carry after their times, in seconds, -1 unknown: decode look-ups
 * (created -> bootstrap_answered), decode transfer (transfer info sent ->
 * last status received), decode total (created -> terminal), prefill wait
 * for the decode (created -> last transfer info), prefill writes (first
 * posted -> last settled). */
enum { BENCH_ST_BOOT, BENCH_ST_DXFER, BENCH_ST_TOTAL, BENCH_ST_WAIT, BENCH_ST_WRITE, BENCH_ST_N };
/* The stages of timeline t (-1: not in it) into st[BENCH_ST_N]. */
void bench_stages(const kvb_timeline_t *t, double *st);

enum { BENCH_LW_FINAL, BENCH_LW_LAYERWISE };

/* kvb_manager_traffic fields as one "traffic" answer of a rank lists them. */
enum {
    BENCH_TR_CTL_SENT,
    BENCH_TR_CTL_FAILED,
    BENCH_TR_CTL_RECV,
    BENCH_TR_BOOT_PRE, /* bootstrap requests of prefill ranks */
    BENCH_TR_BOOT_DEC, /* of decode ranks */
    BENCH_TR_BOOT_FAILED,
    BENCH_TR_HB,
    BENCH_TR_HB_FAILED,
};

/* memcpy (and, for tcp, raw TCP) baselines and planner cost; fills rep. */
void bench_baselines(const bench_opts_t *o, bench_report_t *rep);
/* Progress on stderr (bar on a TTY, plain lines otherwise), rate-limited
 * unless final. */
void bench_progress(const bench_opts_t *o, bench_report_t *rep, bool final);
/* Table on stdout, failure reasons on stderr, JSON file if asked. false when
 * the JSON file could not be written. */
bool bench_report_print(const bench_opts_t *o, bench_report_t *rep);

/* Report helpers shared with the views: percentile p of a phase's
 * latencies, its GB/s, a JSON string literal of s, the stage names. */
double bench_pct(const bench_phase_t *r, double p);
double bench_rate(const bench_phase_t *p);
void bench_json_str(FILE *f, const char *s);
extern const char *const bench_stage_names[BENCH_ST_N];

/* ---- the run's views (bench_view.c, bench_html.c) ---- */

#define BENCH_VIEW_STAGES 4
#define BENCH_VIEW_MAX_RECORDS (1 << 18) /* rooms x ranks kept (~350 B each); more counted */

enum { BENCH_PHASE_WARMUP, BENCH_PHASE_TIMED, BENCH_PHASE_HELD };

/* One room on one rank, from its "tl" line: absolute CLOCK_MONOTONIC
 * seconds; stages in the order the rank listed them. */
typedef struct bench_vstage {
    char name[16];
    double a, b;
} bench_vstage_t;

typedef struct bench_vrec {
    uint64_t room;
    int prefill, dp, tp, pp, phase;
    bool ok;          /* the rank saw the room end Success */
    bool room_failed; /* the driver counted the room failed (any rank, or verification) */
    double t0, t_term, t_last;
    int nst;
    bench_vstage_t st[BENCH_VIEW_STAGES];
    char why[160];
} bench_vrec_t;

typedef struct bench_view {
    bench_vrec_t *v;
    size_t n, cap;
    long long dropped; /* records past BENCH_VIEW_MAX_RECORDS or unparsable lines */
} bench_view_t;

/* A rank's "tl" line (after "tl <room> "): false when malformed (counted). */
bool bench_view_add(bench_view_t *w, uint64_t room, bool prefill, int dp, int pp, int phase,
                    const char *rest);
/* The driver's verdict: room failed for why (every record of it). */
void bench_view_room_failed(bench_view_t *w, uint64_t room, const char *why);
/* The rank's track id (1-based: prefill ranks by dp, tp, pp, then decode). */
int bench_view_pid(const bench_opts_t *o, const bench_vrec_t *r);
void bench_view_rank_name(const bench_vrec_t *r, char *buf, size_t cap);
/* Sort by (track, start) and give each record its lane (thread) on its
 * track: the first lane whose previous room ended before it began.
 * lanes[i] for w->v[i]; the caller frees. NULL on no memory. */
int *bench_view_layout(const bench_opts_t *o, bench_view_t *w);
/* The earliest creation time, 0 when empty. */
double bench_view_origin(const bench_view_t *w);
/* Write o->trace / o->report; false (message printed) when not written. */
bool bench_view_write_trace(const bench_opts_t *o, bench_view_t *w);
bool bench_view_write_html(const bench_opts_t *o, const bench_report_t *rep, bench_view_t *w);
void bench_view_free(bench_view_t *w);

/* ---- /proc of a child (bench_proc.c); -1 when unknown ---- */

long bench_proc_rss_kib(pid_t pid);
long bench_proc_fds(pid_t pid);
double bench_proc_cpu_s(pid_t pid); /* user + system CPU seconds so far */

/* ---- command queue of a child (bench_outq.c) ---- */

typedef struct bench_outq {
    char *buf;
    size_t off, len, cap; /* bytes [off, len) not written yet */
    size_t max_held;      /* the most bytes ever queued at once */
} bench_outq_t;

/* Queue n bytes for fd (non-blocking) and write what the pipe takes now.
 * false: the queue would pass its cap (64 MiB) or the child is gone. */
bool bench_outq_put(bench_outq_t *q, int fd, const char *line, size_t n);
/* Write what the pipe takes: 0 all written, 1 some left (EAGAIN), -1 error. */
int bench_outq_flush(bench_outq_t *q, int fd);
bool bench_outq_pending(const bench_outq_t *q);
void bench_outq_free(bench_outq_t *q);

/* ---- processes (bench_rank.c, bench_driver.c) ---- */

/* Ranks each rank process hosts (--ranks-per-process, or the fewest that
 * keep the rank processes within BENCH_MAX_PROCS). */
int bench_ranks_per_proc(const bench_opts_t *o);

int bench_run_bootstrap(const bench_opts_t *o, bool child);
int bench_run_rank(const bench_opts_t *o);
int bench_run_driver(const bench_opts_t *o);

/* Write one protocol line on stdout in a single write(). */
void bench_say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif
