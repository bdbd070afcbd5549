/* `kvbridge bench` child processes: the bootstrap server and one prefill or
 * decode rank (engine, KV pool registered once by its manager, senders or
 * receivers), each driven over stdin/stdout (protocol in bench_common.h). */
#include "bench_common.h"
#include "engine/cuda_drv.h"

#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "tools.h"

/* R_HOLDING: a --hold sender until it is WaitingForInput; R_HELD: then,
 * until the driver's "send" (not polled: it has nothing to do). R_COMPUTE:
 * --layerwise, queued for or in its simulated forward pass (not polled:
 * nothing can conclude before its last piece; checked after it). */
enum {
    R_FREE,
    R_FILLED,
    R_BOOT,
    R_SENDING,
    R_RECV,
    R_DONE_OK,
    R_DONE_FAIL,
    R_HOLDING,
    R_HELD,
    R_COMPUTE
};

typedef struct rroom {
    uint64_t id;
    int32_t *pages;
    uint32_t n;
    int64_t aux;
    int state;
    bool warm;   /* a warm-up room ("sweep") */
    bool queued; /* POLL_CHANGED: in this wake's poll list already */
    kvb_sender_h snd;
    kvb_receiver_h rcv;
    double deadline, t_first;
    /* --layerwise: when it was queued for the compute, when its compute
     * ended (its last piece queued), the next of its steps (one step: one
     * layer, or a final room's whole chunk) */
    double t_ready, t_end;
    uint64_t step;
} rroom_t;

typedef struct linebuf {
    char buf[4096];
    size_t len;
    bool eof;
} linebuf_t;

typedef struct rank {
    const bench_opts_t *o;
    bool prefill;
    bench_pool_t pool;
    kvb_engine_h eng;
    kvb_manager_h mgr;
    rroom_t *rooms; /* nwave slots for wave rooms, then nhold for --hold rooms */
    size_t nrooms, nwave, nhold;
    bool corrupted;
    /* step_all's batch: active rooms, their handles, their polls */
    rroom_t **act;
    void **handles;
    kvb_poll_t *polls;
    /* POLL_CHANGED: rooms a command touched since the last poll (each at
     * most once per wave: <= nrooms), and kvb_manager_changed's buffer */
    rroom_t **fresh;
    size_t nfresh;
    uint64_t *chg;
    /* --layerwise: rooms waiting for the simulated compute, a FIFO ring;
     * one forward pass at a time, as one GPU runs them. An entry whose room
     * was released meanwhile (id or state changed) is skipped. */
    rroom_t **cq;
    uint64_t *cq_id;
    size_t cq_cap, cq_head, cq_len;
    double cq_free; /* when the last forward pass ended */
} rank_t;

/* How a rank polls its active rooms (KVBRIDGE_BENCH_POLL, to compare in one
 * build): "single" = kvb_*_poll room by room every ~50 us while any room is
 * active (the bench before the batched poll); "many" = one kvb_*_poll_many
 * per pass, same pace; "event" = sleep on the managers' event fds
 * (kvb_manager_event_fd) and stdin, one kvb_*_poll_many pass over every
 * active room per wake, and at least every 100 ms for the time-outs;
 * "changed" (default) = the same wakes, but a wake polls only the rooms
 * kvb_manager_changed names and those a command touched, plus a pass over
 * every active room once a second (time-outs): O(changes) per wake instead
 * of O(rooms in flight). */
enum { POLL_SINGLE, POLL_MANY, POLL_EVENT, POLL_CHANGED };

#define CHG_CAP 1024 /* ids per kvb_manager_changed call */

static int poll_mode(void)
{
    static int v = -1;
    if (v < 0) {
        const char *e = getenv("KVBRIDGE_BENCH_POLL");
        v = e == NULL                  ? POLL_CHANGED
            : strcmp(e, "single") == 0 ? POLL_SINGLE
            : strcmp(e, "many") == 0   ? POLL_MANY
            : strcmp(e, "event") == 0  ? POLL_EVENT
                                       : POLL_CHANGED;
    }
    return v;
}

const char *bench_poll_name(void)
{
    static const char *names[] = {"single", "many", "event", "changed"};
    return names[poll_mode()];
}

/* POLL_CHANGED: every active room is polled at least this often, for the
 * bench's own per-room deadline (--timeout): the library lists rooms whose
 * time-outs passed in kvb_manager_changed itself. KVBRIDGE_BENCH_FULL_PASS_MS,
 * default 10000 (every 100 ms cost 4x the CPU per room at 64 x 64 with 10k
 * rooms held, bench/results/scale.md). */
static double full_pass_s(void)
{
    static double v = -1;
    if (v < 0) {
        const char *e = getenv("KVBRIDGE_BENCH_FULL_PASS_MS");
        long ms = e != NULL ? strtol(e, NULL, 10) : 10000;
        v = (ms >= 1 && ms <= 60000 ? (double)ms : 10000.0) / 1e3;
    }
    return v;
}

static bool waits_on_events(void)
{
    return poll_mode() == POLL_EVENT || poll_mode() == POLL_CHANGED;
}

static bool poll_single(void)
{
    return poll_mode() == POLL_SINGLE;
}

static volatile sig_atomic_t g_stop;

static void on_stop(int sig)
{
    (void)sig;
    g_stop = 1;
}

void bench_say(const char *fmt, ...)
{
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof(line) - 1, fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    if ((size_t)n > sizeof(line) - 2)
        n = (int)sizeof(line) - 2;
    for (int i = 0; i < n; i++)
        if (line[i] == '\n' || line[i] == '\r')
            line[i] = ' ';
    line[n++] = '\n';
    for (int off = 0; off < n;) {
        ssize_t w = write(1, line + off, (size_t)(n - off));
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return;
        off += (int)w;
    }
}

static void child_setup(const bench_opts_t *o)
{
    signal(SIGPIPE, SIG_IGN);
    signal(SIGTERM, on_stop);
    if (o->child) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() == 1)
            exit(1);
        signal(SIGINT, SIG_IGN); /* the driver stops us and reports */
    } else {
        signal(SIGINT, on_stop);
    }
}

/* Wait up to timeout_ns for input and append it; sets eof. */
static void read_input(linebuf_t *lb, long timeout_ns)
{
    struct pollfd pfd = {.fd = 0, .events = POLLIN};
    struct timespec ts = {timeout_ns / 1000000000L, timeout_ns % 1000000000L};
    if (lb->eof || ppoll(&pfd, 1, &ts, NULL) <= 0)
        return;
    if (lb->len == sizeof(lb->buf)) {
        lb->len = 0; /* a line longer than the buffer: drop it */
        return;
    }
    ssize_t r = read(0, lb->buf + lb->len, sizeof(lb->buf) - lb->len);
    if (r == 0 || (r < 0 && errno != EINTR && errno != EAGAIN))
        lb->eof = true;
    else if (r > 0)
        lb->len += (size_t)r;
}

/* POLL_EVENT: wait up to timeout_ns for input (appended, as read_input) or
 * a room change on one of the managers' event fds (reset here, before the
 * caller polls, so no change is missed). */
static void wait_input_or_event(linebuf_t *lb, const int *efd, int n, long timeout_ns)
{
    struct pollfd pf[1 + BENCH_MAX_RANKS_PER_PROC];
    struct timespec ts = {timeout_ns / 1000000000L, timeout_ns % 1000000000L};
    int k = 0;
    if (!lb->eof)
        pf[k++] = (struct pollfd){.fd = 0, .events = POLLIN};
    for (int i = 0; i < n && i < BENCH_MAX_RANKS_PER_PROC; i++)
        pf[k++] = (struct pollfd){.fd = efd[i], .events = POLLIN};
    if (ppoll(pf, (nfds_t)k, &ts, NULL) <= 0)
        return;
    uint64_t v;
    for (int i = lb->eof ? 0 : 1; i < k; i++)
        if (pf[i].revents & POLLIN)
            (void)!read(pf[i].fd, &v, sizeof(v));
    if (!lb->eof && (pf[0].revents & (POLLIN | POLLHUP)))
        read_input(lb, 0);
}

static bool next_line(linebuf_t *lb, char *line, size_t cap)
{
    char *nl = memchr(lb->buf, '\n', lb->len);
    if (nl == NULL)
        return false;
    size_t n = (size_t)(nl - lb->buf);
    size_t k = n < cap - 1 ? n : cap - 1;
    memcpy(line, lb->buf, k);
    line[k] = '\0';
    lb->len -= n + 1;
    memmove(lb->buf, nl + 1, lb->len);
    return true;
}

/* ------------------------------------------------------------ bootstrap */

static bool split_hostport(const char *addr, char *host, size_t cap, uint16_t *port_p)
{
    const char *colon = strrchr(addr, ':');
    long long port = 0;
    if (colon == NULL || !kvb_tool_parse_int("--bootstrap", colon + 1, 0, 65535, &port))
        return false;
    size_t n = (size_t)(colon - addr);
    if (n >= 2 && addr[0] == '[' && addr[n - 1] == ']') {
        addr++;
        n -= 2;
    }
    if (n == 0 || n >= cap)
        return false;
    memcpy(host, addr, n);
    host[n] = '\0';
    *port_p = (uint16_t)port;
    return true;
}

int bench_run_bootstrap(const bench_opts_t *o, bool child)
{
    kvb_bootstrap_server_params_t bp = {0};
    kvb_bootstrap_server_h srv;
    char host[128] = "127.0.0.1", line[128];
    uint16_t port = child ? 0 : 8998;
    struct stat st;
    linebuf_t lb = {.len = 0};
    child_setup(o);
    if (o->bootstrap[0] != '\0' && !split_hostport(o->bootstrap, host, sizeof(host), &port)) {
        fprintf(stderr, "kvbridge: --bootstrap: '%s' is not HOST:PORT\n", o->bootstrap);
        return 2;
    }
    bp.field_mask = KVB_BOOTSTRAP_SERVER_PARAM_HOST | KVB_BOOTSTRAP_SERVER_PARAM_PORT;
    bp.host = host;
    bp.port = port;
    if (kvb_bootstrap_server_start(&bp, &srv) != KVB_OK) {
        bench_say("error bootstrap server on %s:%u did not start", host, (unsigned)port);
        return 1;
    }
    bench_say("ready %s", kvb_bootstrap_server_address(srv));
    if (!child)
        fprintf(stderr, "kvbridge bench: bootstrap server on %s (Ctrl-C stops it)\n",
                kvb_bootstrap_server_address(srv));
    bool eof_stops = child || (fstat(0, &st) == 0 && S_ISFIFO(st.st_mode));
    while (!g_stop && !(lb.eof && eof_stops)) {
        read_input(&lb, lb.eof ? 200000000L : 200000000L);
        if (lb.eof && !eof_stops)
            usleep(200000);
        while (next_line(&lb, line, sizeof(line)))
            if (strcmp(line, "quit") == 0)
                g_stop = 1;
    }
    kvb_bootstrap_server_stop(srv);
    return 0;
}

/* ------------------------------------------------------------------ rank */

static bool rank_manager(rank_t *r)
{
    const bench_opts_t *o = r->o;
    const bench_rank_geom_t *g = &r->pool.g;
    uint64_t aux_ptr = (uint64_t)(uintptr_t)r->pool.aux;
    uint64_t aux_len = r->pool.aux_items * BENCH_AUX_ITEM, aux_item = BENCH_AUX_ITEM;
    kvb_kv_args_t a = {.kv_data_ptrs = r->pool.kv_ptrs,
                       .kv_data_lens = r->pool.kv_lens,
                       .num_kv = (uint32_t)g->n_kv,
                       .kv_item_len = g->item_len,
                       .aux_data_ptrs = &aux_ptr,
                       .aux_data_lens = &aux_len,
                       .aux_item_lens = &aux_item,
                       .num_aux = 1,
                       .page_size = (uint32_t)g->page,
                       .kv_order = (uint32_t)g->order,
                       .kv_head_num = (uint32_t)g->local_heads,
                       .engine_rank = g->tp,
                       .prefill_start_layer = (uint32_t)g->first_layer,
                       .num_layers_total = (uint32_t)o->m.layers};
    kvb_manager_params_t mp = {0};
    mp.field_mask = KVB_MANAGER_PARAM_BOOTSTRAP_ADDR | KVB_MANAGER_PARAM_HOST;
    mp.mode = r->prefill ? KVB_MODE_PREFILL : KVB_MODE_DECODE;
    mp.kv_args = &a;
    mp.engine = r->eng;
    mp.attn_tp_size = g->tp_size;
    mp.attn_tp_rank = g->tp;
    mp.attn_dp_size = r->prefill ? o->dp : 1;
    mp.attn_dp_rank = r->prefill ? o->dp_rank : 0;
    mp.pp_size = g->pp_size;
    mp.pp_rank = g->pp;
    mp.system_dp_size = 1;
    mp.is_mla = o->m.mla;
    mp.bootstrap_addr = o->bootstrap;
    mp.host = o->host;
    if (kvb_manager_create(&mp, &r->mgr) != KVB_OK) {
        bench_say("error manager: %s", kvb_manager_last_error(NULL));
        return false;
    }
    return true;
}

static bool rank_start(rank_t *r)
{
    const bench_opts_t *o = r->o;
    bench_rank_geom_t g;
    kvb_engine_params_t ep = {0};
    if (r->prefill)
        bench_rank_geom(o, o->tp_rank, o->ptp, o->pp_rank, o->ppp, &g);
    else
        bench_decode_geom(o, o->tp_rank, o->dtp, &g);
    /* the decode's pool holds the prefill pool's tokens in its own pages,
     * plus a part-filled last page per request in flight */
    uint64_t pool = (uint64_t)o->pool_pages;
    if (!r->prefill && o->dpage != o->page)
        pool = (pool * (uint64_t)o->page + (uint64_t)o->dpage - 1) / (uint64_t)o->dpage +
               (uint64_t)(o->wave + o->hold) + 8;
    r->nwave = (size_t)o->wave + 4;
    r->nhold = (size_t)o->hold;
    r->nrooms = r->nwave + r->nhold;
    r->rooms = calloc(r->nrooms, sizeof(*r->rooms));
    r->act = calloc(r->nrooms, sizeof(*r->act));
    r->handles = calloc(r->nrooms, sizeof(*r->handles));
    r->polls = calloc(r->nrooms, sizeof(*r->polls));
    r->fresh = calloc(r->nrooms, sizeof(*r->fresh));
    r->chg = calloc(CHG_CAP, sizeof(*r->chg));
    /* twice the rooms: entries of released rooms linger until they reach
     * the head */
    r->cq_cap = o->layerwise_ms >= 0 && r->prefill ? 2 * r->nrooms : 0;
    r->cq = calloc(r->cq_cap + 1, sizeof(*r->cq));
    r->cq_id = calloc(r->cq_cap + 1, sizeof(*r->cq_id));
    if (r->rooms == NULL || r->act == NULL || r->handles == NULL || r->polls == NULL ||
        r->fresh == NULL || r->chg == NULL || r->cq == NULL || r->cq_id == NULL ||
        !bench_pool_init(&r->pool, &g, pool, (uint64_t)(o->wave + o->hold),
                         (uint64_t)o->seed * 7919 + (r->prefill ? 0 : 1) + (uint64_t)o->dp_rank)) {
        bench_say("error cannot allocate a KV pool of %llu pages", (unsigned long long)pool);
        return false;
    }
    if (!r->prefill) /* the rows that reach it (page sizes may differ) */
        r->pool.verify_rows = bench_rows_sent(o);
    char why[300];
    if (o->cuda && !bench_pool_cuda(&r->pool, o->cuda_device, why, sizeof(why))) {
        bench_say("error --memory cuda: %s", why);
        return false;
    }
    /* DP groups sweep the shared decode pool from evenly spaced starts: they
     * advance alike, so one wave's runs never overlap. */
    for (int dp = 0; dp < o->dp && dp < BENCH_MAX_DP; dp++)
        r->pool.sweep[dp] = (uint64_t)dp * r->pool.pages / (uint64_t)o->dp;
    ep.field_mask = KVB_ENGINE_PARAM_HOST | KVB_ENGINE_PARAM_TRANSPORT;
    ep.host = o->host;
    ep.transport = o->transport;
    if (kvb_engine_create(&ep, &r->eng) != KVB_OK) {
        bench_say("error engine on %s did not start", o->host);
        return false;
    }
    return rank_manager(r);
}

/* A room's slot is id mod the slot count: the rooms alive at once are one
 * wave's (consecutive ids, at most wave of them, all released before the
 * next wave starts), so they never share a slot; lookups are O(1) (a scan
 * made --scale runs with 10k rooms quadratic in the bench itself). The
 * --hold rooms (consecutive ids, nhold of them, alive across the waves)
 * have slots of their own after the wave's. A free room's slot: hold says
 * which part. */
static rroom_t *slot_of(rank_t *r, uint64_t id, bool hold)
{
    return hold && r->nhold > 0 ? &r->rooms[r->nwave + id % r->nhold] : &r->rooms[id % r->nwave];
}

static rroom_t *room_slot(rank_t *r, uint64_t id)
{
    rroom_t *w = slot_of(r, id, false), *h;
    if (w->id == id || r->nhold == 0)
        return w;
    h = slot_of(r, id, true);
    return h->id == id && h->state != R_FREE ? h : w;
}

static rroom_t *room_find(rank_t *r, uint64_t id, int state)
{
    rroom_t *rm = room_slot(r, id);
    return rm->state == state && (state == R_FREE || rm->id == id) ? rm : NULL;
}

/* POLL_CHANGED: rm's first state must be polled (no change lists it). */
static void note_fresh(rank_t *r, rroom_t *rm)
{
    if (r->nfresh < r->nrooms)
        r->fresh[r->nfresh++] = rm;
}

static void room_release(rank_t *r, rroom_t *rm)
{
    if (rm->snd != NULL)
        kvb_sender_destroy(rm->snd);
    if (rm->rcv != NULL)
        kvb_receiver_destroy(rm->rcv);
    bench_pages_give(&r->pool, rm->pages, rm->n);
    free(rm->pages);
    memset(rm, 0, sizeof(*rm));
}

static void say_timeline(const rank_t *r, const rroom_t *rm, bool ok, const char *why);

static void room_fail(rank_t *r, rroom_t *rm, const char *why)
{
    say_timeline(r, rm, false, why);
    bench_say("fail %" PRIu64 " %s", rm->id, why);
    if (r->prefill)
        room_release(r, rm);
    else
        rm->state = R_DONE_FAIL;
}

/* "fill"/"recv": take pages for a new room (sweep: the next pages of the
 * warm-up sweep of the room's DP group instead of random ones). */
static rroom_t *room_new(rank_t *r, uint64_t id, uint32_t n, int64_t aux, bool sweep, bool hold)
{
    rroom_t *rm = slot_of(r, id, hold);
    if (rm->state != R_FREE || (rm->pages = malloc((size_t)n * sizeof(int32_t))) == NULL) {
        bench_say("fail %" PRIu64 " no free room slot", id);
        return NULL;
    }
    rm->id = id;
    rm->n = n;
    rm->aux = aux;
    int dp = (int)(id % (uint64_t)r->o->dp);
    if (!(sweep ? bench_pages_take_sweep(&r->pool, dp, rm->pages, n)
                : bench_pages_take(&r->pool, rm->pages, n))) {
        free(rm->pages);
        memset(rm, 0, sizeof(*rm));
        bench_say("fail %" PRIu64 " KV pool exhausted", id);
        return NULL;
    }
    return rm;
}

static void send_chunks(rank_t *r, rroom_t *rm);

/* "send", or with hold "hold": create the room's sender; "send" of a held
 * room sends its pages now. */
static void cmd_send(rank_t *r, uint64_t id, bool hold)
{
    rroom_t *rm = room_find(r, id, R_FILLED);
    char why[160];
    if (rm == NULL && !hold && (rm = room_find(r, id, R_HELD)) != NULL) {
        rm->deadline = kvb_tool_now() + r->o->timeout_s;
        send_chunks(r, rm);
        note_fresh(r, rm);
        return;
    }
    if (rm == NULL) {
        bench_say("fail %" PRIu64 " send of a room that was not filled", id);
        return;
    }
    kvb_status_t st = kvb_sender_create(r->mgr, r->o->bootstrap, id, &rm->snd);
    rm->deadline = kvb_tool_now() + r->o->timeout_s;
    rm->state = hold ? R_HOLDING : R_BOOT;
    note_fresh(r, rm);
    if (st != KVB_OK) {
        snprintf(why, sizeof(why), "sender_create: %s", kvb_status_string(st));
        rm->snd = NULL;
        room_fail(r, rm, why);
    }
}

/* --abort-rate: this rank is the one that aborts room (rank 0 of its side). */
static bool aborts_here(const rank_t *r, uint64_t id)
{
    int side = bench_abort_side(r->o, id);
    bool first = r->o->tp_rank == 0 && r->o->pp_rank == 0;
    return first && side == (r->prefill ? BENCH_ABORT_PREFILL : BENCH_ABORT_DECODE);
}

static void cmd_recv(rank_t *r, uint64_t id, uint32_t n, int64_t aux, bool sweep, bool hold)
{
    rroom_t *rm = room_new(r, id, n, aux, sweep, hold);
    char why[160];
    if (rm == NULL)
        return;
    rm->warm = sweep;
    double t = kvb_tool_now();
    kvb_status_t st = kvb_receiver_create(r->mgr, r->o->bootstrap, id, -1, &rm->rcv);
    if (st == KVB_OK)
        st = kvb_receiver_init(rm->rcv, rm->pages, n, aux, NULL);
    if (st == KVB_OK && aborts_here(r, id))
        kvb_receiver_abort(rm->rcv); /* its poll must end Failed */
    /* held: no bench time-out until it is sent (the library's waiting
     * time-out, KVBRIDGE_WAITING_TIMEOUT, still applies) */
    rm->deadline = hold ? 1e300 : t + r->o->timeout_s;
    rm->state = R_RECV;
    note_fresh(r, rm);
    bench_say("inited %" PRIu64 " %.9f", id, t);
    if (st != KVB_OK) {
        snprintf(why, sizeof(why), "receiver create/init: %s", kvb_status_string(st));
        room_fail(r, rm, why);
    }
}

static void cmd_verify(rank_t *r, uint64_t id)
{
    rroom_t *rm = room_find(r, id, R_DONE_OK);
    if (rm == NULL) {
        rm = room_find(r, id, R_DONE_FAIL);
        bench_say("verified %" PRIu64 " -1", id);
        if (rm != NULL)
            room_release(r, rm);
        return;
    }
    if (r->o->corrupt && r->o->tp_rank == 0 && !r->corrupted && rm->n > 0 && !rm->warm) {
        /* test hook: one flipped byte must make this (timed) request fail */
        uint8_t *p =
            (uint8_t *)(uintptr_t)r->pool.kv_ptrs[0] + (uint64_t)rm->pages[0] * r->pool.g.item_len;
        uint8_t v; /* through the driver when the pool is device memory */
        kvb__mem_copy(&v, p, 1);
        v ^= 0x5a;
        kvb__mem_copy(p, &v, 1);
        r->corrupted = true;
    }
    uint64_t bad = bench_verify(&r->pool, r->pool.g.page, id, rm->pages, rm->n, rm->aux);
    bench_say("verified %" PRIu64 " %" PRIu64, id, bad);
    room_release(r, rm);
}

/* The driver gave up on a room (failed elsewhere): abort and free it. */
static void cmd_drop(rank_t *r, uint64_t id)
{
    rroom_t *rm = room_slot(r, id);
    if (rm->state == R_FREE || rm->id != id)
        return;
    if (rm->state != R_DONE_OK && rm->state != R_DONE_FAIL)
        say_timeline(r, rm, false, "dropped here: the room failed on another rank");
    if (rm->snd != NULL &&
        (rm->state == R_BOOT || rm->state == R_SENDING || rm->state == R_HOLDING ||
         rm->state == R_HELD || rm->state == R_COMPUTE))
        kvb_sender_abort(rm->snd);
    room_release(r, rm);
}

/* "traffic": this rank's kvb_manager_traffic, in BENCH_TR_* order. */
static void cmd_traffic(rank_t *r)
{
    kvb_manager_traffic_t t = {.field_mask = KVB_MANAGER_TRAFFIC_CONTROL |
                                             KVB_MANAGER_TRAFFIC_BOOTSTRAP |
                                             KVB_MANAGER_TRAFFIC_HEARTBEAT};
    kvb_manager_traffic(r->mgr, &t);
    bench_say("traffic %s %" PRIu64 " %" PRIu64 " %" PRIu64 " %" PRIu64 " %" PRIu64 " %" PRIu64
              " %" PRIu64,
              r->prefill ? "prefill" : "decode", t.control_sent, t.control_send_failed,
              t.control_received, t.bootstrap_requests, t.bootstrap_failed, t.heartbeat_requests,
              t.heartbeat_failed);
}

/* "integrity": this rank's integrity counters (kvb_manager_traffic). */
static void cmd_integrity(rank_t *r)
{
    kvb_manager_traffic_t t = {.field_mask = KVB_MANAGER_TRAFFIC_INTEGRITY};
    kvb_manager_traffic(r->mgr, &t);
    bench_say("integrity %s %" PRIu64 " %" PRIu64 " %" PRIu64 " %" PRIu64,
              r->prefill ? "prefill" : "decode", t.integrity_sent, t.integrity_checked,
              t.integrity_mismatches, t.integrity_unchecked);
}

static bool handle(rank_t *r, const char *line)
{
    uint64_t id = 0;
    unsigned n = 0;
    long long aux = 0;
    if (strcmp(line, "quit") == 0)
        return false;
    if (strcmp(line, "integrity") == 0) {
        cmd_integrity(r);
        return true;
    }
    if (strcmp(line, "traffic") == 0) {
        cmd_traffic(r);
        return true;
    }
    bool hold = strstr(line, " hold") != NULL;
    if (sscanf(line, "fill %" SCNu64 " %u %lld", &id, &n, &aux) == 3 && r->prefill) {
        rroom_t *rm = room_new(r, id, n, aux, false, hold);
        if (rm != NULL) {
            bench_fill(&r->pool, r->pool.g.page, id, rm->pages, n, aux);
            rm->state = R_FILLED;
            bench_say("filled %" PRIu64, id);
        }
    } else if (sscanf(line, "send %" SCNu64, &id) == 1 && r->prefill) {
        cmd_send(r, id, false);
    } else if (sscanf(line, "hold %" SCNu64, &id) == 1 && r->prefill) {
        cmd_send(r, id, true);
    } else if (sscanf(line, "drop %" SCNu64, &id) == 1 && r->prefill) {
        cmd_drop(r, id);
    } else if (sscanf(line, "recv %" SCNu64 " %u %lld", &id, &n, &aux) == 3 && !r->prefill) {
        cmd_recv(r, id, n, aux, strstr(line, " sweep") != NULL, hold);
    } else if (sscanf(line, "verify %" SCNu64, &id) == 1 && !r->prefill) {
        cmd_verify(r, id);
    } else {
        bench_say("error unknown command '%.100s'", line);
    }
    return true;
}

/* A room's chunks: pages per send, how many, and how many are sent before
 * an --abort-rate abort. */
typedef struct chunking {
    uint64_t per, chunks, stop;
} chunking_t;

static chunking_t chunking_of(const rank_t *r, const rroom_t *rm)
{
    chunking_t k;
    k.per = bench_chunk_pages(r->o, rm->id, rm->n);
    k.chunks = (rm->n + k.per - 1) / k.per;
    k.stop = aborts_here(r, rm->id) ? bench_abort_after(r->o, rm->id, k.chunks) : k.chunks;
    return k;
}

/* Every chunk (or the planned abort) queued: the room waits for Success. */
static void chunks_queued(rroom_t *rm, const chunking_t *k)
{
    if (k->stop < k->chunks)
        kvb_sender_abort(rm->snd); /* its poll must end Failed */
    rm->state = R_SENDING;
}

static void compute_queue(rank_t *r, rroom_t *rm);

static void send_chunks(rank_t *r, rroom_t *rm)
{
    chunking_t k = chunking_of(r, rm);
    char why[160];
    kvb_sender_init(rm->snd, rm->n, rm->aux);
    if (r->o->layerwise_ms >= 0) {
        compute_queue(r, rm);
        return;
    }
    rm->t_first = rm->t_end = kvb_tool_now();
    for (uint64_t c = 0, cur = 0; c < k.stop && cur < rm->n; c++, cur += k.per) {
        uint64_t len = rm->n - cur < k.per ? rm->n - cur : k.per;
        kvb_status_t st = kvb_sender_send(rm->snd, rm->pages + cur, (size_t)len);
        if (st != KVB_OK) {
            snprintf(why, sizeof(why), "sender_send: %s", kvb_status_string(st));
            room_fail(r, rm, why);
            return;
        }
    }
    chunks_queued(rm, &k);
}

/* ------------------------------------------------- --layerwise compute */

/* A room's forward pass is a run of steps: one per layer of each chunk for
 * a layerwise room, one per chunk (all its layers) for a final one. Each
 * step's compute is its layers x --layerwise ms; its send follows it. */
static uint32_t room_layers(const rroom_t *rm)
{
    uint32_t L = kvb_sender_num_layers(rm->snd);
    return L > 0 ? L : 1;
}

static uint64_t steps_per_chunk(const rank_t *r, const rroom_t *rm)
{
    return bench_room_layerwise(r->o, rm->id) ? room_layers(rm) : 1;
}

/* When step s's compute ends: counted from the forward's start, so a late
 * wake-up delays one send, not every one after it. */
static double step_due(const rank_t *r, const rroom_t *rm, uint64_t s)
{
    double layers = bench_room_layerwise(r->o, rm->id) ? 1.0 : (double)room_layers(rm);
    return rm->t_first + (double)(s + 1) * layers * r->o->layerwise_ms / 1e3;
}

static void compute_queue(rank_t *r, rroom_t *rm)
{
    rm->state = R_COMPUTE;
    rm->t_ready = kvb_tool_now();
    rm->t_first = 0; /* set when its forward starts */
    rm->step = 0;
    if (r->cq_len == r->cq_cap) {
        room_fail(r, rm, "--layerwise compute queue full");
        return;
    }
    size_t i = (r->cq_head + r->cq_len++) % r->cq_cap;
    r->cq[i] = rm;
    r->cq_id[i] = rm->id;
}

static void compute_pop(rank_t *r)
{
    r->cq_head = (r->cq_head + 1) % r->cq_cap;
    r->cq_len--;
}

/* The room in its forward pass now, started if it was waiting (when it
 * became ready, or when the previous forward ended if later); NULL when
 * none. Entries of rooms released meanwhile are dropped. */
static rroom_t *compute_head(rank_t *r)
{
    while (r->cq_len > 0) {
        rroom_t *rm = r->cq[r->cq_head];
        if (rm->state == R_COMPUTE && rm->id == r->cq_id[r->cq_head]) {
            if (rm->t_first == 0)
                rm->t_first = rm->t_ready > r->cq_free ? rm->t_ready : r->cq_free;
            return rm;
        }
        compute_pop(r);
    }
    return NULL;
}

/* Send step rm->step: a one-layer piece, or a final room's whole chunk.
 * false: the send failed (room released). */
static bool compute_step(rank_t *r, rroom_t *rm, const chunking_t *k)
{
    uint64_t spc = steps_per_chunk(r, rm), cur = rm->step / spc * k->per;
    uint64_t len = rm->n - cur < k->per ? rm->n - cur : k->per;
    uint32_t l = (uint32_t)(rm->step % spc);
    bool lw = bench_room_layerwise(r->o, rm->id);
    kvb_status_t st = lw ? kvb_sender_send_layers(rm->snd, rm->pages + cur, (size_t)len, l, l + 1)
                         : kvb_sender_send(rm->snd, rm->pages + cur, (size_t)len);
    char why[200];
    rm->step++;
    if (st == KVB_OK)
        return true;
    snprintf(why, sizeof(why), "%s: %s", lw ? "sender_send_layers" : "sender_send",
             kvb_status_string(st));
    room_fail(r, rm, why);
    return false;
}

/* Its last piece queued at now: the forward ended; the room is polled
 * again, with the bench's time-out counted from here. */
static void compute_done(rank_t *r, rroom_t *rm, const chunking_t *k, double now)
{
    rm->t_end = now;
    rm->deadline = now + r->o->timeout_s;
    r->cq_free = now;
    compute_pop(r);
    chunks_queued(rm, k);
    note_fresh(r, rm);
}

/* Send every step whose compute has ended; seconds until the next one
 * ends, -1 when no room is computing. */
static double compute_run(rank_t *r)
{
    rroom_t *rm;
    while ((rm = compute_head(r)) != NULL) {
        chunking_t k = chunking_of(r, rm);
        uint64_t steps = k.stop * steps_per_chunk(r, rm);
        double now = kvb_tool_now();
        if (rm->step < steps && now < step_due(r, rm, rm->step))
            return step_due(r, rm, rm->step) - now;
        if (rm->step < steps && !compute_step(r, rm, &k)) {
            r->cq_free = now; /* released: the next room's forward may start */
            continue;
        }
        if (rm->step >= steps)
            compute_done(r, rm, &k, now);
    }
    return -1;
}

static void failure_of(rroom_t *rm, kvb_poll_t p, bool timed_out, char *why, size_t cap)
{
    char text[128] = "";
    if (timed_out)
        snprintf(why, cap, "timed out in %s", kvb_poll_string(p));
    else if (rm->snd != NULL)
        kvb_sender_failure(rm->snd, text, sizeof(text));
    else
        kvb_receiver_failure(rm->rcv, text, sizeof(text));
    if (!timed_out)
        snprintf(why, cap, "%s: %s", rm->snd != NULL ? "sender" : "receiver", text);
}

/* Time of ev's first (or last) occurrence in t; -1: none. */
static double tl_at(const kvb_timeline_t *t, kvb_event_t ev, bool last)
{
    double at = -1;
    for (size_t i = 0; i < t->n; i++)
        if (t->events[i].event == ev && (at < 0 || last))
            at = t->events[i].t_s;
    return at;
}

static double tl_span(const kvb_timeline_t *t, kvb_event_t a, bool a_last, kvb_event_t b,
                      bool b_last)
{
    double x = tl_at(t, a, a_last), y = tl_at(t, b, b_last);
    return x >= 0 && y >= x ? y - x : -1;
}

void bench_stages(const kvb_timeline_t *t, double *st)
{
    st[BENCH_ST_BOOT] = tl_span(t, KVB_EV_CREATED, false, KVB_EV_BOOTSTRAP_ANSWERED, false);
    st[BENCH_ST_DXFER] = tl_span(t, KVB_EV_TRANSFER_INFO_SENT, false, KVB_EV_STATUS_RECEIVED, true);
    st[BENCH_ST_TOTAL] = tl_span(t, KVB_EV_CREATED, false, KVB_EV_TERMINAL, false);
    st[BENCH_ST_WAIT] = tl_span(t, KVB_EV_CREATED, false, KVB_EV_TRANSFER_INFO_RECEIVED, true);
    st[BENCH_ST_WRITE] = tl_span(t, KVB_EV_FIRST_WRITE_POSTED, false, KVB_EV_LAST_WRITE_DONE, true);
}

/* The stage slices a "tl" line carries, as docs/observe.md's trace spans
 * name them: an event's first (or last) occurrence to another's. */
typedef struct tl_stage {
    const char *name;
    kvb_event_t a, b;
    bool a_last, b_last, prefill;
} tl_stage_t;

static const tl_stage_t tl_stages[] = {
    {"wait_decode", KVB_EV_CREATED, KVB_EV_TRANSFER_INFO_RECEIVED, false, true, true},
    {"transfer", KVB_EV_FIRST_WRITE_POSTED, KVB_EV_LAST_WRITE_DONE, false, true, true},
    {"notify", KVB_EV_TERMINAL, KVB_EV_STATUS_SENT, false, true, true},
    {"bootstrap", KVB_EV_CREATED, KVB_EV_BOOTSTRAP_ANSWERED, false, false, false},
    {"wait_prefill", KVB_EV_TRANSFER_INFO_SENT, KVB_EV_STATUS_RECEIVED, false, true, false},
    {"fence_hold", KVB_EV_FENCE_HOLD, KVB_EV_FENCE_RELEASE, false, true, false},
};

/* --timelines: the room's stages on this rank in absolute CLOCK_MONOTONIC
 * seconds (the creation is the snapshot's time less its age), so the driver
 * draws every rank on one time axis (bench_view.c). A room without a handle
 * or a timeline still gets a line: created = terminal = now, no stages. */
static void say_timeline(const rank_t *r, const rroom_t *rm, bool ok, const char *why)
{
    if (!r->o->timelines)
        return;
    kvb_timeline_t *t = NULL;
    int rc = rm->snd != NULL   ? kvb_sender_timeline(rm->snd, &t)
             : rm->rcv != NULL ? kvb_receiver_timeline(rm->rcv, &t)
                               : KVB_ERR_INVALID;
    double now = kvb_tool_now(), t0 = now, term = now, last = now;
    char st[400] = "";
    size_t off = 0;
    int n = 0;
    if (rc == KVB_OK && t != NULL) {
        t0 = now - t->age_s;
        last = t0;
        for (size_t i = 0; i < t->n; i++)
            last = t0 + t->events[i].t_s > last ? t0 + t->events[i].t_s : last;
        double te = tl_at(t, KVB_EV_TERMINAL, false);
        term = te >= 0 ? t0 + te : now;
        for (size_t k = 0; k < sizeof(tl_stages) / sizeof(tl_stages[0]); k++) {
            const tl_stage_t *s = &tl_stages[k];
            double a = tl_at(t, s->a, s->a_last), b = tl_at(t, s->b, s->b_last);
            if (s->prefill != r->prefill || a < 0 || b < a || off >= sizeof(st))
                continue;
            off += (size_t)snprintf(st + off, sizeof(st) - off, " %s %.9f %.9f", s->name, t0 + a,
                                    t0 + b);
            n++;
        }
    }
    kvb_timeline_free(t);
    bench_say("tl %" PRIu64 " %d %d %.9f %.9f %.9f %d%s %.150s", rm->id, r->o->tp_rank, ok ? 1 : 0,
              t0, term, last, n, st, why != NULL && why[0] ? why : "-");
}

/* The stages of a sender's or a receiver's room (all -1 when timelines are off). */
static void room_stages(kvb_sender_h s, kvb_receiver_h rc, double *st)
{
    kvb_timeline_t *t = NULL;
    for (int k = 0; k < BENCH_ST_N; k++)
        st[k] = -1;
    if ((s != NULL ? kvb_sender_timeline(s, &t) : kvb_receiver_timeline(rc, &t)) == KVB_OK)
        bench_stages(t, st);
    kvb_timeline_free(t);
}

static void step_room(rank_t *r, rroom_t *rm, double now, kvb_poll_t p)
{
    char why[200];
    bool timed_out = now > rm->deadline;
    if (rm->state == R_HOLDING && p == KVB_POLL_WAITING_FOR_INPUT) {
        bench_say("held %" PRIu64, rm->id);
        rm->state = R_HELD;
    } else if (rm->state == R_BOOT &&
               (p == KVB_POLL_WAITING_FOR_INPUT || p == KVB_POLL_TRANSFERRING)) {
        send_chunks(r, rm);
    } else if (p == KVB_POLL_SUCCESS && rm->state == R_SENDING) {
        double st[BENCH_ST_N];
        room_stages(rm->snd, NULL, st);
        say_timeline(r, rm, true, NULL);
        bench_say("sent %" PRIu64 " %.9f %.9f %.9f %.9f", rm->id, rm->t_first, rm->t_end,
                  st[BENCH_ST_WAIT], st[BENCH_ST_WRITE]);
        /* The sender lives until the driver's "drop" at the end of the wave:
         * destroying it right at Success can lose the decode's Success status
         * (library race, see docs/bench.md); KVBRIDGE_BENCH_EARLY_DESTROY=1
         * destroys at once to reproduce it. */
        if (getenv("KVBRIDGE_BENCH_EARLY_DESTROY") != NULL)
            room_release(r, rm);
        else
            rm->state = R_DONE_OK;
    } else if (p == KVB_POLL_SUCCESS && rm->state == R_RECV) {
        double st[BENCH_ST_N];
        room_stages(NULL, rm->rcv, st);
        say_timeline(r, rm, true, NULL);
        bench_say("ok %" PRIu64 " %.9f %.9f %.9f %.9f", rm->id, now, st[BENCH_ST_BOOT],
                  st[BENCH_ST_DXFER], st[BENCH_ST_TOTAL]);
        rm->state = R_DONE_OK;
    } else if (p == KVB_POLL_FAILED || timed_out) {
        failure_of(rm, p, timed_out, why, sizeof(why));
        if (timed_out && rm->snd != NULL)
            kvb_sender_abort(rm->snd);
        else if (timed_out)
            kvb_receiver_abort(rm->rcv);
        room_fail(r, rm, why);
    }
}

static bool active(const rroom_t *rm)
{
    return rm->state == R_BOOT || rm->state == R_SENDING || rm->state == R_RECV ||
           rm->state == R_HOLDING;
}

/* Poll the rooms r->act[0..n) (one kvb_*_poll_many call, or room by room
 * under KVBRIDGE_BENCH_POLL=single) and step each; true when one of them is
 * still active. */
static bool poll_act(rank_t *r, size_t n)
{
    double now = kvb_tool_now();
    for (size_t i = 0; i < n; i++) {
        rroom_t *rm = r->act[i];
        r->handles[i] = rm->snd != NULL ? (void *)rm->snd : (void *)rm->rcv;
    }
    if (n > 0 && !poll_single()) {
        if (r->prefill)
            kvb_sender_poll_many((kvb_sender_h *)r->handles, n, r->polls);
        else
            kvb_receiver_poll_many((kvb_receiver_h *)r->handles, n, r->polls);
    }
    bool busy = false;
    for (size_t i = 0; i < n; i++) {
        rroom_t *rm = r->act[i];
        kvb_poll_t p = !poll_single()    ? r->polls[i]
                       : rm->snd != NULL ? kvb_sender_poll(rm->snd)
                                         : kvb_receiver_poll(rm->rcv);
        step_room(r, rm, now, p);
        busy = busy || active(rm);
    }
    return busy;
}

/* Drain kvb_manager_changed; with take, queue the active rooms it names
 * (each once) after r->act[0..n); returns the new count. */
static size_t take_changed(rank_t *r, size_t n, bool take)
{
    size_t got = 0;
    do {
        if (kvb_manager_changed(r->mgr, r->chg, CHG_CAP, &got) != KVB_OK)
            return n;
        for (size_t i = 0; take && i < got; i++) {
            rroom_t *rm = room_slot(r, r->chg[i]);
            if (rm->id == r->chg[i] && active(rm) && !rm->queued) {
                rm->queued = true;
                r->act[n++] = rm;
            }
        }
    } while (got == CHG_CAP);
    return n;
}

/* Poll every active room; true when some room is still active. Under
 * POLL_CHANGED the changes so far are covered by this pass: dropped. */
static bool step_all(rank_t *r)
{
    size_t n = 0;
    if (poll_mode() == POLL_CHANGED)
        take_changed(r, 0, false);
    r->nfresh = 0;
    for (size_t i = 0; i < r->nrooms; i++)
        if (active(&r->rooms[i]))
            r->act[n++] = &r->rooms[i];
    return poll_act(r, n);
}

/* POLL_CHANGED, one wake: poll the rooms a command touched and those
 * kvb_manager_changed names (the event fd was reset before this). */
static void step_changed(rank_t *r)
{
    size_t n = 0;
    for (size_t i = 0; i < r->nfresh; i++) {
        rroom_t *rm = r->fresh[i];
        if (active(rm) && !rm->queued) {
            rm->queued = true;
            r->act[n++] = rm;
        }
    }
    r->nfresh = 0;
    n = take_changed(r, n, true);
    for (size_t i = 0; i < n; i++)
        r->act[i]->queued = false;
    poll_act(r, n);
}

static void rank_stop(rank_t *r)
{
    /* peers leaving at the end of a run is expected: no "session lost" noise */
    if (getenv("KVBRIDGE_LOG") == NULL)
        kvb_log_set_level(KVB_LOG_ERROR);
    for (size_t i = 0; r->rooms != NULL && i < r->nrooms; i++)
        if (r->rooms[i].state != R_FREE)
            room_release(r, &r->rooms[i]);
    if (r->mgr != NULL)
        kvb_manager_destroy(r->mgr);
    if (r->eng != NULL)
        kvb_engine_destroy(r->eng);
    bench_pool_free(&r->pool);
    free(r->rooms);
    free(r->act);
    free(r->handles);
    free(r->polls);
    free(r->fresh);
    free(r->chg);
    free(r->cq);
    free(r->cq_id);
}

/* A wait of ns nanoseconds, cut to end when the next --layerwise step's
 * compute does (wait_s; < 0: none). */
static long cap_ns(long ns, double wait_s)
{
    if (wait_s < 0)
        return ns;
    long w = (long)(wait_s * 1e9) + 1;
    return w < ns ? w : ns;
}

/* --layerwise: every hosted rank's due steps sent; seconds until the next
 * one is due (0: a room just ended its forward and is to be polled now, as
 * the rooms a command touched are), -1 when none computes. */
static double computes_run(rank_t *r, int n)
{
    double wait = -1;
    if (n == 0 || r[0].o->layerwise_ms < 0)
        return -1;
    for (int i = 0; i < n; i++) {
        double w = compute_run(&r[i]);
        if (w >= 0 && (wait < 0 || w < wait))
            wait = w;
        if (r[i].nfresh > 0)
            wait = 0;
    }
    return wait;
}

/* One rank process hosts o->rpp ranks (at least 1): TP ranks tp_rank ..
 * tp_rank + rpp - 1 of one side, each with its own options copy, pool,
 * engine and manager; every command goes to each of them and each answers
 * for itself (the driver counts answers per rank). */
int bench_run_rank(const bench_opts_t *o)
{
    int n = o->rpp > 0 ? (int)o->rpp : 1;
    rank_t *r = calloc((size_t)n, sizeof(*r));
    bench_opts_t *oc = calloc((size_t)n, sizeof(*oc));
    static linebuf_t lb;
    char line[512];
    bool busy = false, run = true, ok = r != NULL && oc != NULL;
    child_setup(o);
    if (o->layerwise_ms >= 0) /* the default 50 us slack is 25% of a 0.2 ms layer */
        prctl(PR_SET_TIMERSLACK, 1000UL);
    if (o->pool_pages <= 0 || o->wave <= 0 || o->bootstrap[0] == '\0') {
        bench_say("error rank processes are started by `kvbridge bench`");
        free(r);
        free(oc);
        return 2;
    }
    for (int i = 0; ok && i < n; i++) {
        oc[i] = *o;
        oc[i].tp_rank = o->tp_rank + i;
        r[i] = (rank_t){.o = &oc[i], .prefill = o->role == BENCH_ROLE_PREFILL_RANK};
        ok = rank_start(&r[i]);
    }
    if (ok)
        bench_say("ready %s", kvb_manager_endpoint(r[0].mgr));
    int *efd = calloc((size_t)n, sizeof(int));
    for (int i = 0; ok && i < n && waits_on_events(); i++)
        if (efd == NULL || kvb_manager_event_fd(r[i].mgr, &efd[i]) != KVB_OK)
            ok = false;
    double next_full = 0, cwait = -1;
    while (ok && run && !g_stop && !lb.eof) {
        double now = kvb_tool_now();
        if (poll_mode() == POLL_CHANGED) /* sleep at most until the next full pass */
            wait_input_or_event(
                &lb, efd, n,
                cap_ns(now >= next_full ? 0 : (long)((next_full - now) * 1e9) + 1, cwait));
        else if (poll_mode() == POLL_EVENT)
            wait_input_or_event(&lb, efd, n, cap_ns(busy ? 100000000L : 200000000L, cwait));
        else
            read_input(&lb, cap_ns(busy ? 50000L : 200000000L, cwait));
        while (run && next_line(&lb, line, sizeof(line)))
            for (int i = 0; i < n && run; i++)
                run = handle(&r[i], line);
        busy = false;
        bool full = poll_mode() != POLL_CHANGED || (now = kvb_tool_now()) >= next_full;
        if (full && poll_mode() == POLL_CHANGED)
            next_full = now + full_pass_s();
        for (int i = 0; i < n; i++)
            if (full)
                busy |= step_all(&r[i]);
            else
                step_changed(&r[i]);
        cwait = computes_run(r, n);
    }
    for (int i = 0; r != NULL && i < n; i++)
        if (r[i].o != NULL)
            rank_stop(&r[i]);
    free(efd);
    free(r);
    free(oc);
    return ok ? 0 : 1;
}
