/* `kvbridge bench` driver: spawns the bootstrap server and the rank
 * processes, runs the requests wave by wave (fill, timed transfer, verify)
 * and collects the results. A wave is as many requests as both KV pools
 * hold; pattern fill and verification happen outside the timed phase. */
#include "bench_common.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "eb_util.h"
#include "tools.h"

#define READY_TIMEOUT_S 180.0
#define MAX_PROCS 80
#define MAX_ARGS 96 /* a rank's command line: 70 words with every option on */

enum { K_BOOT, K_PRE, K_DEC };
enum { Q_NEW, Q_FILLED, Q_FLIGHT, Q_DONE };

typedef struct proc {
    kvb_eb_chan_t ch;
    bench_outq_t out; /* commands the child's stdin pipe has not taken yet */
    int kind, dp, tp, pp;
    int nranks; /* ranks it hosts: TP ranks [tp, tp + nranks) */
} proc_t;

typedef struct req {
    uint64_t room;
    uint32_t pages, dpages; /* prefill pages, decode pages (--decode-page-size) */
    int64_t aux;
    int dp, state, pend_fill, pend_init, pend_dec, pend_pre, pend_verify;
    int pend_hold; /* --hold: prefill ranks of its group not yet "held" */
    double t_first, t_init, t_succ, deadline;
    double t_end;          /* the latest end of its prefill ranks' compute (--layerwise) */
    double st[BENCH_ST_N]; /* its timelines' stages (s) + 1, the slowest rank's; 0: none */
    bool failed, sent_to_prefill, aborted;
    bool held, released; /* a --hold room; sent after the timed waves */
    char why[200];
} req_t;

typedef struct drv {
    const bench_opts_t *o;
    proc_t procs[MAX_PROCS];
    int nprocs;
    bool has_pre, has_dec;
    char boot[128];
    req_t *reqs;         /* warm-up requests first, then the timed ones, then --hold's */
    long long nreqs;     /* rep.warm_requests + rep.requests + o->hold */
    long long hold_base; /* the first --hold request: rep.warm_requests + rep.requests */
    long long cold_end;  /* requests [0, cold_end) make the cold first pass */
    uint64_t room_base;
    long long wave, pool_pages, inflight;
    bench_report_t rep;
    double traffic_sign; /* +1 / -1: the traffic collection under way */
    bench_view_t view;   /* --trace / --report: every room on every rank */
    char fatal[240];
} drv_t;

/* Stages s[0..n) (seconds, -1 unknown) of one rank into q's, from first:
 * the slowest rank's. */
static void take_stages(req_t *q, int first, const double *s, int n)
{
    for (int k = 0; k < n; k++)
        if (s[k] >= 0 && s[k] + 1 > q->st[first + k])
            q->st[first + k] = s[k] + 1;
}

typedef struct args {
    char s[MAX_ARGS][64];
    char *v[MAX_ARGS + 1];
    int n;
} args_t;

static volatile sig_atomic_t g_interrupted;

static void on_sigint(int sig)
{
    (void)sig;
    g_interrupted = 1;
}

static bool stopping(const drv_t *d)
{
    return g_interrupted || d->fatal[0] != '\0';
}

/* One command line to p, queued: never blocks (bench_outq.c). A child that
 * is gone or that lets 64 MiB of commands pile up stops the run. */
static void psend(drv_t *d, proc_t *p, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void psend(drv_t *d, proc_t *p, const char *fmt, ...)
{
    char line[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof(line) - 1, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= sizeof(line) - 1 || p->ch.wfd < 0)
        return;
    line[n++] = '\n';
    if (!bench_outq_put(&p->out, p->ch.wfd, line, (size_t)n) && d->fatal[0] == '\0')
        snprintf(d->fatal, sizeof(d->fatal), "a rank stopped taking commands (%zu B queued)",
                 p->out.len - p->out.off);
}

/* ---------------------------------------------------------------- spawn */

static void arg(args_t *a, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void arg(args_t *a, const char *fmt, ...)
{
    va_list ap;
    if (a->n >= MAX_ARGS)
        return;
    va_start(ap, fmt);
    vsnprintf(a->s[a->n], sizeof(a->s[0]), fmt, ap);
    va_end(ap);
    a->v[a->n] = a->s[a->n];
    a->v[++a->n] = NULL;
}

static void rank_args(const drv_t *d, args_t *a, const char *role, int tp, int pp, int dp,
                      int nranks)
{
    const bench_opts_t *o = d->o;
    static const char *names[] = {
        "--layers",           "--kv-heads",   "--head-dim",  "--dtype-bytes", "--page-size",
        "--decode-page-size", "--prefill-tp", "--decode-tp", "--prefill-pp",  "--dp",
        "--tp-rank",          "--pp-rank",    "--dp-rank"};
    const int vals[] = {o->m.layers,
                        o->m.kv_heads,
                        o->m.head_dim,
                        o->m.dtype_bytes,
                        o->page,
                        o->dpage,
                        o->ptp,
                        o->dtp,
                        o->ppp,
                        o->dp,
                        tp,
                        pp,
                        dp};
    arg(a, "kvbridge");
    arg(a, "bench");
    arg(a, "--role");
    arg(a, "%s", role);
    arg(a, "--child");
    arg(a, "--bootstrap");
    arg(a, "%s", d->boot);
    for (size_t i = 0; i < sizeof(vals) / sizeof(vals[0]); i++) {
        arg(a, "%s", names[i]);
        arg(a, "%d", vals[i]);
    }
    const char *lnames[] = {"--chunk",       "--seed",    "--pool-pages",
                            "--wave",        "--timeout", "--requests",
                            "--concurrency", "--hold",    "--prompt-len"};
    const long long lvals[] = {
        o->chunk,    o->seed, d->pool_pages, d->wave,      (long long)o->timeout_s,
        o->requests, o->conc, o->hold,       o->prompt_len};
    for (size_t i = 0; i < sizeof(lvals) / sizeof(lvals[0]); i++) {
        arg(a, "%s", lnames[i]);
        arg(a, "%lld", lvals[i]);
    }
    arg(a, "--transport");
    arg(a, "%s", bench_transport_name(o->transport));
    arg(a, "--decode-layout");
    arg(a, "%s", kvb_plan_order_name((kvb_plan_order_t)o->dorder));
    if (o->cuda) {
        arg(a, "--memory");
        arg(a, "cuda");
        arg(a, "--device");
        arg(a, "%d", o->cuda_device);
    }
    arg(a, "--host");
    arg(a, "%s", o->host);
    if (o->m.mla)
        arg(a, "--mla");
    if (o->corrupt)
        arg(a, "--corrupt-one-byte");
    if (o->abort_rate > 0) {
        arg(a, "--abort-rate");
        arg(a, "%.17g", o->abort_rate);
    }
    if (o->random_chunks)
        arg(a, "--random-chunks");
    if (o->layerwise_ms >= 0) {
        arg(a, "--layerwise");
        arg(a, "%.17g", o->layerwise_ms);
    }
    if (o->trace != NULL || o->report != NULL)
        arg(a, "--timelines");
    arg(a, "--ranks-per-process");
    arg(a, "%d", nranks);
}

static bool spawn(drv_t *d, int kind, int tp, int pp, int dp, int nranks)
{
    static const char *roles[] = {"bootstrap", "prefill-rank", "decode-rank"};
    args_t a = {.n = 0};
    proc_t *p = &d->procs[d->nprocs];
    if (d->nprocs == MAX_PROCS)
        return false;
    if (kind == K_BOOT) {
        const char *v[] = {"kvbridge", "bench",       "--role",  "bootstrap",
                           "--child",  "--bootstrap", d->o->host};
        for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++)
            arg(&a, i == 6 ? "%s:0" : "%s", v[i]);
    } else {
        rank_args(d, &a, roles[kind], tp, pp, dp, nranks);
    }
    *p = (proc_t){.kind = kind, .tp = tp, .pp = pp, .dp = dp, .nranks = nranks};
    if (!kvb_eb_spawn(&p->ch, "/proc/self/exe", a.v))
        return false;
    fcntl(p->ch.wfd, F_SETFL, fcntl(p->ch.wfd, F_GETFL) | O_NONBLOCK);
    d->nprocs++;
    return true;
}

static void proc_name(const proc_t *p, char *buf, size_t cap)
{
    if (p->kind == K_BOOT)
        snprintf(buf, cap, "bootstrap");
    else if (p->kind == K_PRE)
        snprintf(buf, cap, "prefill dp%d tp%d pp%d", p->dp, p->tp, p->pp);
    else
        snprintf(buf, cap, "decode tp%d", p->tp);
}

/* Wait for "ready <text>" from proc i; text copied to out. */
static bool wait_ready(drv_t *d, int i, char *out, size_t cap)
{
    char line[256], name[48];
    proc_name(&d->procs[i], name, sizeof(name));
    if (kvb_eb_recv(&d->procs[i].ch, line, sizeof(line), READY_TIMEOUT_S) &&
        strncmp(line, "ready ", 6) == 0) {
        snprintf(out, cap, "%.120s", line + 6);
        return true;
    }
    snprintf(d->fatal, sizeof(d->fatal), "%.40s did not start: %.180s", name, line);
    return false;
}

static bool start_all(drv_t *d)
{
    const bench_opts_t *o = d->o;
    char text[128];
    if (o->role == BENCH_ROLE_ALL) {
        if (!spawn(d, K_BOOT, 0, 0, 0, 0) || !wait_ready(d, 0, d->boot, sizeof(d->boot)))
            return false;
    } else {
        snprintf(d->boot, sizeof(d->boot), "%s", o->bootstrap);
    }
    int first = d->nprocs, k = bench_ranks_per_proc(o);
    for (int g = 0; d->has_pre && g < o->dp; g++)
        for (int t = 0; t < o->ptp; t += k)
            for (int p = 0; p < o->ppp; p++)
                if (!spawn(d, K_PRE, t, p, g, o->ptp - t < k ? o->ptp - t : k))
                    return false;
    for (int t = 0; d->has_dec && t < o->dtp; t += k)
        if (!spawn(d, K_DEC, t, 0, 0, o->dtp - t < k ? o->dtp - t : k))
            return false;
    for (int i = first; i < d->nprocs; i++)
        if (!wait_ready(d, i, text, sizeof(text)))
            return false;
    return true;
}

static void stop_all(drv_t *d)
{
    double grace = g_interrupted || d->fatal[0] ? 0.5 : 10.0;
    for (int i = d->nprocs - 1; i >= 0; i--) {
        bench_outq_free(&d->procs[i].out); /* unsent commands: moot now */
        kvb_eb_send(&d->procs[i].ch, "quit");
    }
    for (int i = d->nprocs - 1; i >= 0; i--)
        kvb_eb_stop(&d->procs[i].ch, grace);
    d->nprocs = 0;
}

/* ------------------------------------------------------------- messages */

static void fail_req(drv_t *d, req_t *q, const proc_t *p, const char *why)
{
    char name[48] = "driver";
    if (p != NULL)
        proc_name(p, name, sizeof(name));
    if (!q->failed)
        snprintf(q->why, sizeof(q->why), "%s: %s", name, why);
    q->failed = true;
}

static void to_group(drv_t *d, const req_t *q, const char *fmt, uint64_t room)
    __attribute__((format(printf, 3, 0)));
static void to_group(drv_t *d, const req_t *q, const char *fmt, uint64_t room)
{
    for (int i = 0; i < d->nprocs; i++)
        if (d->procs[i].kind == K_PRE && d->procs[i].dp == q->dp)
            psend(d, &d->procs[i], fmt, room);
}

static void maybe_send(drv_t *d, req_t *q)
{
    if (q->state != Q_FLIGHT || q->sent_to_prefill || !d->has_pre)
        return;
    if (q->failed) {
        q->sent_to_prefill = true;
        to_group(d, q, "drop %" PRIu64, q->room);
        q->pend_pre = q->pend_hold = 0;
        return;
    }
    if (q->pend_init > 0)
        return;
    q->sent_to_prefill = true;
    bool hold = (q->held && !q->released) || (d->o->layerwise_ms >= 0 && !q->held);
    to_group(d, q, hold ? "hold %" PRIu64 : "send %" PRIu64, q->room);
}

/* --layerwise: once every prefill rank of its group holds the room's sender
 * in WaitingForInput, start its forward on all of them with one "send"
 * each: the ranks get the rooms in one order and compute them in it, as
 * TP ranks run one forward together (SGLang's agree on a request's poll
 * before it). Their own readiness order would differ from rank to rank. */
static void lockstep_send(drv_t *d, req_t *q)
{
    if (d->o->layerwise_ms >= 0 && !q->held && q->pend_hold == 0 && !q->failed)
        to_group(d, q, "send %" PRIu64, q->room);
}

static void on_fail(drv_t *d, req_t *q, const proc_t *p, const char *why)
{
    fail_req(d, q, p, why);
    if (q->state == Q_NEW && q->pend_fill > 0)
        q->pend_fill--;
    if (q->state != Q_FLIGHT)
        return;
    if (p->kind == K_DEC) {
        q->pend_dec -= q->pend_dec > 0;
        q->pend_init -= q->pend_init > 0;
        maybe_send(d, q);
    } else {
        q->pend_pre -= q->pend_pre > 0;
        q->pend_hold -= q->pend_hold > 0;
    }
}

static req_t *req_of(drv_t *d, uint64_t room)
{
    if (room < d->room_base || room - d->room_base >= (uint64_t)d->nreqs)
        return NULL;
    return &d->reqs[room - d->room_base];
}

/* "traffic prefill|decode a b c ...": one rank's counters, added with the
 * sign of the current collection (d->traffic_sign). */
static void on_traffic(drv_t *d, const char *rest)
{
    unsigned long long v[7];
    char side[16];
    if (sscanf(rest, "%15s %llu %llu %llu %llu %llu %llu %llu", side, &v[0], &v[1], &v[2], &v[3],
               &v[4], &v[5], &v[6]) != 8)
        return;
    bool pre = strcmp(side, "prefill") == 0;
    const int at[7] = {BENCH_TR_CTL_SENT,    BENCH_TR_CTL_FAILED, BENCH_TR_CTL_RECV, 0,
                       BENCH_TR_BOOT_FAILED, BENCH_TR_HB,         BENCH_TR_HB_FAILED};
    for (int i = 0; i < 7; i++) {
        int k = i == 3 ? (pre ? BENCH_TR_BOOT_PRE : BENCH_TR_BOOT_DEC) : at[i];
        d->rep.traffic[k] += d->traffic_sign * (double)v[i];
    }
    if (d->traffic_sign > 0)
        d->rep.hb_total += (double)v[5];
    d->rep.traffic_answers++;
}

/* "integrity prefill|decode sent checked mismatches unchecked". */
static void on_integrity(drv_t *d, const char *rest)
{
    unsigned long long v[4];
    char side[16];
    if (sscanf(rest, "%15s %llu %llu %llu %llu", side, &v[0], &v[1], &v[2], &v[3]) != 5)
        return;
    d->rep.integ_sent += v[0];
    d->rep.integ_checked += v[1];
    d->rep.integ_mismatches += v[2];
    d->rep.integ_unchecked += v[3];
    d->rep.integ_answers++;
}

static void on_line(drv_t *d, proc_t *p, const char *line)
{
    uint64_t room = 0;
    double t = 0;
    long long bad = 0;
    int off = 0;
    char verb[16] = "";
    if (strncmp(line, "error ", 6) == 0) {
        snprintf(d->fatal, sizeof(d->fatal), "%s", line + 6);
        return;
    }
    if (strncmp(line, "integrity ", 10) == 0) {
        on_integrity(d, line + 10);
        return;
    }
    if (strncmp(line, "traffic ", 8) == 0) {
        on_traffic(d, line + 8);
        return;
    }
    if (sscanf(line, "%15s %" SCNu64 " %n", verb, &room, &off) != 2)
        return;
    req_t *q = req_of(d, room);
    if (q == NULL)
        return;
    const char *rest = line + off;
    if (getenv("KVBRIDGE_BENCH_DEBUG") != NULL)
        fprintf(stderr, "bench debug: %.3f %d/%d: %s\n", kvb_tool_now(), p->kind, p->tp, line);
    if (strcmp(verb, "tl") == 0) {
        long long i = q - d->reqs;
        int phase = q->held                    ? BENCH_PHASE_HELD
                    : i < d->rep.warm_requests ? BENCH_PHASE_WARMUP
                                               : BENCH_PHASE_TIMED;
        bench_view_add(&d->view, room, p->kind == K_PRE, p->dp, p->pp, phase, rest);
    } else if (strcmp(verb, "filled") == 0 && q->state == Q_NEW) {
        q->pend_fill -= q->pend_fill > 0;
    } else if (strcmp(verb, "inited") == 0 && q->state == Q_FLIGHT && sscanf(rest, "%lf", &t)) {
        q->t_init = q->t_init == 0 || t < q->t_init ? t : q->t_init;
        q->pend_init -= q->pend_init > 0;
        maybe_send(d, q);
    } else if (strcmp(verb, "ok") == 0 && q->state == Q_FLIGHT && sscanf(rest, "%lf", &t)) {
        double s[3] = {-1, -1, -1}; /* a rank without stages: none */
        sscanf(rest, "%*f %lf %lf %lf", &s[0], &s[1], &s[2]);
        take_stages(q, BENCH_ST_BOOT, s, 3);
        q->t_succ = t > q->t_succ ? t : q->t_succ;
        q->pend_dec -= q->pend_dec > 0;
    } else if (strcmp(verb, "sent") == 0 && q->state == Q_FLIGHT && sscanf(rest, "%lf", &t)) {
        double te = t, s[2] = {-1, -1}; /* a rank without the compute end: none, t_first */
        sscanf(rest, "%*f %lf %lf %lf", &te, &s[0], &s[1]);
        take_stages(q, BENCH_ST_WAIT, s, 2);
        q->t_first = q->t_first == 0 || t < q->t_first ? t : q->t_first;
        q->t_end = te > q->t_end ? te : q->t_end;
        q->pend_pre -= q->pend_pre > 0;
    } else if (strcmp(verb, "held") == 0 && q->state == Q_FLIGHT) {
        q->pend_hold -= q->pend_hold > 0;
        lockstep_send(d, q);
    } else if (strcmp(verb, "fail") == 0) {
        on_fail(d, q, p, rest);
    } else if (strcmp(verb, "verified") == 0 && sscanf(rest, "%lld", &bad) == 1) {
        char why[64];
        q->pend_verify -= q->pend_verify > 0;
        snprintf(why, sizeof(why), "%lld wrong bytes on verification", bad);
        if (bad > 0)
            fail_req(d, q, p, why);
    }
}

static void drain(drv_t *d, proc_t *p)
{
    char line[600];
    while (p->ch.rfd >= 0 && memchr(p->ch.buf, '\n', p->ch.len) != NULL &&
           kvb_eb_recv(&p->ch, line, sizeof(line), 1.0))
        on_line(d, p, line);
}

/* Read whatever the children said within timeout_ms, and write the
 * commands their pipes take. Reading never waits on writing: a child blocked
 * on its full stdout pipe is always read. */
static void pump(drv_t *d, int timeout_ms)
{
    struct pollfd pf[2 * MAX_PROCS];
    char line[600], name[48];
    int n = d->nprocs;
    for (int i = 0; i < n; i++) {
        proc_t *p = &d->procs[i];
        drain(d, p);
        pf[i] = (struct pollfd){.fd = p->ch.rfd, .events = POLLIN};
        bool out = bench_outq_pending(&p->out) && p->ch.wfd >= 0;
        pf[n + i] = (struct pollfd){.fd = out ? p->ch.wfd : -1, .events = POLLOUT};
    }
    if (poll(pf, (nfds_t)(2 * n), timeout_ms) <= 0)
        return;
    for (int i = 0; i < n && d->fatal[0] == '\0'; i++) {
        proc_t *p = &d->procs[i];
        if (pf[n + i].revents != 0 && bench_outq_flush(&p->out, p->ch.wfd) < 0) {
            proc_name(p, name, sizeof(name));
            snprintf(d->fatal, sizeof(d->fatal), "%.40s: its command pipe is closed", name);
            return;
        }
        if (pf[i].revents == 0)
            continue;
        if (!kvb_eb_recv(&p->ch, line, sizeof(line), 2.0)) {
            proc_name(p, name, sizeof(name));
            snprintf(d->fatal, sizeof(d->fatal), "%.40s: %.180s", name, line);
            return;
        }
        on_line(d, p, line);
        drain(d, p);
    }
}

/* Pump until *pend of every request in [a, b) is 0, at most timeout_s. */
static void pump_until(drv_t *d, long long a, long long b, size_t pend_off, const char *what)
{
    double end = kvb_tool_now() + d->o->timeout_s + 30;
    for (long long i = a; i < b && !stopping(d); i++)
        while (*(int *)((char *)&d->reqs[i] + pend_off) > 0 && !stopping(d)) {
            if (kvb_tool_now() > end) {
                snprintf(d->fatal, sizeof(d->fatal), "no %s answer from the ranks within %.0f s",
                         what, d->o->timeout_s + 30);
                return;
            }
            pump(d, 100);
        }
}

/* ---------------------------------------------------------------- waves */

static int group_size(const drv_t *d)
{
    return d->o->ptp * d->o->ppp;
}

/* Between commands to the children: every 32 requests, read what they said
 * and write what their pipes take, so answers (inited → send) flow while a
 * wave is being dispatched. Commands are queued (psend), so this is for
 * latency, not for progress. */
static void breathe(drv_t *d, long long i)
{
    if (i % 32 == 31)
        pump(d, 0);
}

static void fill_phase(drv_t *d, long long a, long long b)
{
    for (long long i = a; d->has_pre && i < b; i++) {
        req_t *q = &d->reqs[i];
        q->pend_fill = group_size(d);
        char cmd[96];
        snprintf(cmd, sizeof(cmd), "fill %" PRIu64 " %u %" PRId64 "%s", q->room, q->pages, q->aux,
                 q->held ? " hold" : "");
        for (int k = 0; k < d->nprocs; k++)
            if (d->procs[k].kind == K_PRE && d->procs[k].dp == q->dp)
                psend(d, &d->procs[k], "%s", cmd);
        breathe(d, i);
    }
    pump_until(d, a, b, offsetof(req_t, pend_fill), "fill");
}

static bool is_warm(const drv_t *d, const req_t *q)
{
    return q - d->reqs < d->rep.warm_requests;
}

static void dispatch(drv_t *d, req_t *q)
{
    if (q->held && q->state == Q_FLIGHT) { /* after the timed waves: send it */
        q->released = true;
        q->sent_to_prefill = false;
        q->deadline = kvb_tool_now() + d->o->timeout_s + 30;
        d->inflight++;
        maybe_send(d, q);
        return;
    }
    if (q->failed) { /* its fill failed */
        q->state = Q_DONE;
        d->rep.done += !q->held;
        to_group(d, q, "drop %" PRIu64, q->room);
        return;
    }
    q->state = Q_FLIGHT;
    q->deadline = kvb_tool_now() + d->o->timeout_s + 30;
    q->pend_pre = q->pend_hold = d->has_pre ? group_size(d) : 0;
    q->pend_dec = q->pend_init = d->has_dec ? d->o->dtp : 0;
    d->inflight++;
    for (int k = 0; d->has_dec && k < d->nprocs; k++)
        if (d->procs[k].kind == K_DEC)
            psend(d, &d->procs[k], "recv %" PRIu64 " %u %" PRId64 "%s", q->room, q->dpages, q->aux,
                  is_warm(d, q) ? " sweep"
                  : q->held     ? " hold"
                                : "");
    maybe_send(d, q);
}

/* --layerwise, a timed request that ended Success: its exposed transfer time
 * (Success after the last prefill rank's compute ended: the transfer the
 * compute did not hide) and its latency (forward start to Success) under
 * its mode. */
static void layerwise_figures(drv_t *d, const req_t *q, double ms)
{
    if (d->o->layerwise_ms < 0 || !d->has_pre || !d->has_dec)
        return;
    int m = bench_room_layerwise(d->o, q->room) ? BENCH_LW_LAYERWISE : BENCH_LW_FINAL;
    bench_phase_t *e = &d->rep.exposed[m], *l = &d->rep.lw_lat[m];
    e->lat_ms[e->nlat++] = (q->t_succ - q->t_end) * 1e3;
    l->lat_ms[l->nlat++] = ms;
}

static void finish(drv_t *d, req_t *q, double now)
{
    if (q->state != Q_FLIGHT)
        return;
    if (now > q->deadline && (q->pend_dec > 0 || q->pend_pre > 0)) {
        fail_req(d, q, NULL, "no answer from the ranks in time");
        q->pend_dec = q->pend_pre = q->pend_init = 0;
    }
    if (q->pend_dec > 0 || q->pend_pre > 0)
        return;
    q->state = Q_DONE;
    d->inflight--;
    if (q->held) /* not a timed room: no figures */
        return;
    d->rep.done++;
    if (q->failed)
        return;
    double from = d->has_pre && d->has_dec ? q->t_first : q->t_init;
    double to = d->has_dec ? q->t_succ : q->t_first;
    double ms = d->has_dec ? (to - from) * 1e3 : 0;
    long long i = q - d->reqs;
    if (i == 0)
        d->rep.first_ms = ms;
    if (i < d->cold_end) {
        d->rep.cold.lat_ms[d->rep.cold.nlat++] = ms;
        d->rep.cold.bytes += bench_request_bytes(d->o);
    }
    if (!is_warm(d, q)) {
        for (int k = 0; k < BENCH_ST_N; k++)
            if (q->st[k] > 0)
                d->rep.stage[k].lat_ms[d->rep.stage[k].nlat++] = (q->st[k] - 1) * 1e3;
        d->rep.steady.lat_ms[d->rep.steady.nlat++] = ms;
        d->rep.steady.bytes += bench_request_bytes(d->o);
        layerwise_figures(d, q, ms);
    }
}

/* --scale: summed CPU seconds / VmRSS KiB of every child. */
static double children_cpu_s(const drv_t *d)
{
    double s = 0;
    for (int i = 0; i < d->nprocs; i++)
        s += bench_proc_cpu_s(d->procs[i].ch.pid);
    return s;
}

static double children_rss_kib(const drv_t *d)
{
    double s = 0;
    for (int i = 0; i < d->nprocs; i++)
        s += (double)bench_proc_rss_kib(d->procs[i].ch.pid);
    return s;
}

/* --scale, timed waves: rooms in flight that every decode rank has inited
 * (their state exists on both sides); at a new most, the children's RSS. */
static void scale_sample(drv_t *d, long long a, long long next)
{
    long long held = 0;
    if (!d->o->scale || a < d->rep.warm_requests || a >= d->hold_base)
        return;
    for (long long i = a; i < next; i++)
        held += d->reqs[i].state == Q_FLIGHT && d->reqs[i].pend_init == 0;
    if (held <= d->rep.max_inflight)
        return;
    d->rep.max_inflight = held;
    double rss = children_rss_kib(d);
    d->rep.rss_peak_kib = rss > d->rep.rss_peak_kib ? rss : d->rep.rss_peak_kib;
}

/* Requests [a, b), at most conc in flight. */
static void transfer_phase(drv_t *d, long long a, long long b, long long conc)
{
    long long next = a, left = b - a;
    double t0 = kvb_tool_now();
    d->inflight = 0;
    while (left > 0 && !stopping(d)) {
        while (next < b && d->inflight < conc) {
            dispatch(d, &d->reqs[next]);
            breathe(d, next++);
        }
        pump(d, 20);
        double now = kvb_tool_now();
        left = 0;
        scale_sample(d, a, next);
        for (long long i = a; i < next; i++)
            finish(d, &d->reqs[i], now);
        for (long long i = a; i < b; i++)
            left += d->reqs[i].state != Q_DONE;
        if (a < d->cold_end) /* waves never straddle cold_end */
            d->rep.cold.seconds += now - t0;
        if (a >= d->rep.warm_requests && a < d->hold_base)
            d->rep.steady.seconds += now - t0;
        t0 = now;
        bench_progress(d->o, &d->rep, false);
    }
}

static void verify_phase(drv_t *d, long long a, long long b)
{
    for (long long i = a; d->has_dec && i < b; i++) {
        req_t *q = &d->reqs[i];
        q->pend_verify = d->o->dtp;
        for (int k = 0; k < d->nprocs; k++)
            if (d->procs[k].kind == K_DEC)
                psend(d, &d->procs[k], "verify %" PRIu64, q->room);
        breathe(d, i);
    }
    pump_until(d, a, b, offsetof(req_t, pend_verify), "verify");
    for (long long i = a; i < b && !stopping(d); i++) {
        req_t *q = &d->reqs[i];
        if (d->has_pre)
            to_group(d, q, "drop %" PRIu64, q->room);
        bool planned = bench_abort_side(d->o, q->room) != BENCH_ABORT_NONE;
        if (planned && !q->failed)
            fail_req(d, q, NULL, "room planned to abort (--abort-rate) ended Success");
        else if (planned)
            q->aborted = true;
        bool warm = is_warm(d, q);
        if (q->held) { /* --hold never aborts (bench_parse) */
            d->rep.held_verified += !q->failed;
            d->rep.held_failed += q->failed;
        } else {
            *(warm ? &d->rep.warm_aborted : &d->rep.aborted) += q->aborted;
            *(warm ? &d->rep.warm_verified : &d->rep.verified) += !q->failed;
            *(warm ? &d->rep.warm_failed : &d->rep.failed) += q->failed && !q->aborted;
        }
        if (q->failed)
            bench_view_room_failed(&d->view, q->room, q->why);
        if (q->failed && !q->aborted && d->rep.nfails < BENCH_MAX_FAIL_SHOWN)
            snprintf(d->rep.fails[d->rep.nfails++], sizeof(d->rep.fails[0]), "room %" PRIu64 ": %s",
                     q->room, q->why);
    }
}

/* ------------------------------------------------------ resource report */

/* VmRSS and fds of the driver and every child, as sample at (0 warm-up, 1 end). */
static void sample(drv_t *d, int at)
{
    bench_report_t *r = &d->rep;
    r->nres = d->nprocs + 1;
    for (int i = 0; i < r->nres; i++) {
        pid_t pid = i == 0 ? getpid() : d->procs[i - 1].ch.pid;
        if (i == 0)
            snprintf(r->res[0].name, sizeof(r->res[0].name), "driver");
        else
            proc_name(&d->procs[i - 1], r->res[i].name, sizeof(r->res[i].name));
        r->res[i].rss_kib[at] = bench_proc_rss_kib(pid);
        r->res[i].fds[at] = bench_proc_fds(pid);
    }
}

/* --scale: every rank's traffic counters, added with sign (-1 before the
 * timed waves, +1 after them); waits for the answers at most 30 s. */
static void collect_traffic(drv_t *d, double sign)
{
    int want = 0, before = d->rep.traffic_answers;
    d->traffic_sign = sign;
    for (int i = 0; i < d->nprocs; i++)
        if (d->procs[i].kind != K_BOOT) {
            psend(d, &d->procs[i], "traffic");
            want += d->procs[i].nranks;
        }
    double end = kvb_tool_now() + 30;
    while (d->rep.traffic_answers - before < want && !stopping(d) && kvb_tool_now() < end)
        pump(d, 100);
    d->rep.traffic_ranks = want;
}

/* The integrity line: every rank's counters once the requests are done
 * (warm-up included); waits for the answers at most 30 s. */
static void collect_integrity(drv_t *d)
{
    int want = 0;
    for (int i = 0; i < d->nprocs; i++)
        if (d->procs[i].kind != K_BOOT) {
            psend(d, &d->procs[i], "integrity");
            want += d->procs[i].nranks;
        }
    double end = kvb_tool_now() + 30;
    while (d->rep.integ_answers < want && !stopping(d) && kvb_tool_now() < end)
        pump(d, 100);
}

/* --resource-report: warm-up sample after the wave that passes 10% of the
 * requests, end sample after the last wave (children idle both times). */
/* --hold: rooms being set up at once. A decode's transfer info that reaches
 * a prefill before its sender exists makes a room there that the prefill
 * caps (KVBRIDGE_MAX_WIRE_ROOMS, 4096: past it the oldest are dropped, and
 * their senders would wait in Bootstrapping for good); a slow prefill rank
 * must not see more than this many ahead of its senders. */
#define HOLD_BATCH 1000

static bool holding(const req_t *q)
{
    return q->state == Q_FLIGHT && !q->failed && (q->pend_init > 0 || q->pend_hold > 0);
}

/* --hold: fill the held rooms, create their receivers (inited) and senders
 * (until WaitingForInput) on every rank, HOLD_BATCH at a time, and wait for
 * every answer; they stay in flight until held_release. */
static void hold_phase(drv_t *d)
{
    long long a = d->hold_base, b = d->nreqs, next = a, lo = a, busy = 0;
    double end = kvb_tool_now() + d->o->timeout_s + 30;
    if (a == b || stopping(d))
        return;
    d->rep.rss_prehold_kib = children_rss_kib(d);
    fill_phase(d, a, b);
    d->inflight = 0;
    while (!stopping(d) && (next < b || busy > 0)) {
        while (lo < next && !holding(&d->reqs[lo]))
            lo++; /* rooms get ready roughly in order: [lo, next) stays short */
        busy = 0;
        for (long long i = lo; i < next; i++)
            busy += holding(&d->reqs[i]);
        for (; next < b && busy < HOLD_BATCH; busy++) {
            dispatch(d, &d->reqs[next]);
            breathe(d, next++);
        }
        if (busy > 0)
            pump(d, 20);
        if (kvb_tool_now() > end) {
            snprintf(d->fatal, sizeof(d->fatal), "--hold: rooms not set up within %.0f s",
                     d->o->timeout_s + 30);
            return;
        }
    }
    d->rep.rss_held_kib = children_rss_kib(d);
}

/* --hold, after the timed waves: send the held rooms (untimed: HOLD_BATCH
 * at a time, or --concurrency if more) and verify them. */
static void held_release(drv_t *d)
{
    if (d->hold_base == d->nreqs || stopping(d))
        return;
    transfer_phase(d, d->hold_base, d->nreqs, d->o->conc > HOLD_BATCH ? d->o->conc : HOLD_BATCH);
    verify_phase(d, d->hold_base, d->nreqs);
}

static void run_waves(drv_t *d)
{
    bool warm = false;
    long long w = d->rep.warm_requests;
    /* Warm-up waves [0, w), then timed waves [w, hold_base): none straddles
     * w; the --hold rooms [hold_base, nreqs) around the timed waves. */
    for (long long a = 0; a < d->hold_base && !stopping(d);) {
        long long end = a < w ? w : d->hold_base;
        if (a == w && d->o->scale) { /* the timed waves start: idle figures */
            hold_phase(d);
            collect_traffic(d, -1);
            d->rep.timed_wall_s = -kvb_tool_now();
            d->rep.cpu_s = -children_cpu_s(d);
            d->rep.rss_idle_kib = children_rss_kib(d);
        }
        long long b = a + d->wave < end ? a + d->wave : end;
        fill_phase(d, a, b);
        transfer_phase(d, a, b, d->o->conc);
        verify_phase(d, a, b);
        a = b;
        if (d->o->resource_report && !warm && (b - w) * 10 >= d->rep.requests && !stopping(d)) {
            sample(d, 0);
            warm = true;
        }
    }
    if (d->o->resource_report && warm)
        sample(d, 1);
    if (d->o->scale) {
        d->rep.cpu_s += children_cpu_s(d);
        d->rep.timed_wall_s += kvb_tool_now();
        collect_traffic(d, +1);
    }
    held_release(d);
    collect_integrity(d);
    d->rep.nprocs = d->nprocs;
}

static bool setup(drv_t *d, const bench_opts_t *o)
{
    memset(d, 0, sizeof(*d));
    d->o = o;
    d->has_pre = o->role == BENCH_ROLE_ALL || o->role == BENCH_ROLE_PREFILL;
    d->has_dec = o->role == BENCH_ROLE_ALL || o->role == BENCH_ROLE_DECODE;
    d->wave = bench_wave(o);
    d->pool_pages = bench_pool_pages(o, d->wave);
    d->rep.requests = o->requests;
    d->rep.warm_requests = bench_warmup_requests(o, d->pool_pages);
    d->rep.first_ms = -1;
    d->hold_base = d->rep.warm_requests + o->requests;
    d->nreqs = d->hold_base + o->hold;
    /* The cold first pass: the warm-up, or without one the first wave. */
    d->cold_end = d->rep.warm_requests > 0 ? d->rep.warm_requests
                  : d->wave < o->requests  ? d->wave
                                           : o->requests;
    d->rep.cold_requests = d->cold_end;
    d->reqs = calloc((size_t)d->nreqs, sizeof(req_t));
    d->rep.steady.lat_ms = calloc((size_t)o->requests, sizeof(double));
    d->rep.cold.lat_ms = calloc((size_t)d->cold_end + 1, sizeof(double));
    for (int k = 0; k < BENCH_ST_N; k++)
        if ((d->rep.stage[k].lat_ms = calloc((size_t)o->requests + 1, sizeof(double))) == NULL)
            return false;
    for (int m = 0; m < 2; m++) { /* --layerwise figures, per mode */
        d->rep.exposed[m].lat_ms = calloc((size_t)o->requests, sizeof(double));
        d->rep.lw_lat[m].lat_ms = calloc((size_t)o->requests, sizeof(double));
        if (d->rep.exposed[m].lat_ms == NULL || d->rep.lw_lat[m].lat_ms == NULL)
            return false;
    }
    d->room_base = (uint64_t)o->seed * 10000000ull + 1;
    if (d->wave <= 0 || d->reqs == NULL || d->rep.steady.lat_ms == NULL ||
        d->rep.cold.lat_ms == NULL)
        return false;
    for (long long i = 0; i < d->nreqs; i++) {
        req_t *q = &d->reqs[i];
        q->room = d->room_base + (uint64_t)i;
        q->pages = (uint32_t)bench_pages_per_request(o);
        q->dpages = (uint32_t)bench_decode_pages_per_request(o);
        q->aux = i % d->wave;
        q->dp = (int)(q->room % (uint64_t)o->dp);
        if (i >= d->hold_base) { /* aux slots of their own, after the wave's */
            q->held = true;
            q->aux = d->wave + (i - d->hold_base);
        }
    }
    return true;
}

int bench_run_driver(const bench_opts_t *o)
{
    drv_t *d = calloc(1, sizeof(*d));
    struct sigaction sa = {.sa_handler = on_sigint}, old_int, old_term;
    int rc = 1;
    if (d == NULL || !setup(d, o))
        goto out;
    signal(SIGPIPE, SIG_IGN);
    sigaction(SIGINT, &sa, &old_int);
    sigaction(SIGTERM, &sa, &old_term);
    bench_baselines(o, &d->rep);
    if (start_all(d) && !g_interrupted) {
        d->rep.run_wall_s = -kvb_tool_now();
        run_waves(d);
        d->rep.run_wall_s += kvb_tool_now();
    }
    stop_all(d);
    sigaction(SIGINT, &old_int, NULL);
    sigaction(SIGTERM, &old_term, NULL);
    d->rep.interrupted = g_interrupted != 0;
    bench_progress(o, &d->rep, true);
    if (d->fatal[0] != '\0')
        fprintf(stderr, "kvbridge bench: stopped: %s\n", d->fatal);
    bool json_ok = bench_report_print(o, &d->rep);
    if (o->trace != NULL)
        json_ok &= bench_view_write_trace(o, &d->view);
    if (o->report != NULL)
        json_ok &= bench_view_write_html(o, &d->rep, &d->view);
    const bench_report_t *r = &d->rep;
    bool all = r->verified + r->aborted == r->requests &&
               r->warm_verified + r->warm_aborted == r->warm_requests &&
               r->held_verified == o->hold;
    rc = g_interrupted ? 130 : d->fatal[0] == '\0' && json_ok && all ? 0 : 1;
out:
    if (d != NULL) {
        free(d->reqs);
        free(d->rep.steady.lat_ms);
        free(d->rep.cold.lat_ms);
        for (int m = 0; m < 2; m++) {
            free(d->rep.exposed[m].lat_ms);
            free(d->rep.lw_lat[m].lat_ms);
        }
        for (int k = 0; k < BENCH_ST_N; k++)
            free(d->rep.stage[k].lat_ms);
        bench_view_free(&d->view);
    }
    free(d);
    return rc;
}
