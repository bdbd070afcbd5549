/* The hang matrix (issue 32 §2): every room reaches a terminal state within
 * a documented bound whatever the peer does. Each cell puts a real kvbridge
 * rank (in this process) against a hostile or silent peer (a raw ZeroMQ
 * socket, a TCP listener that never answers, a SIGSTOPped kvbridge process,
 * a bare engine that unregisters its memory or drops every write), with the
 * time-outs set small through their environment variables (main), and
 * asserts: the room ends (Failed, or Success where the peer's silence cannot
 * matter) within the bound of the state it sat in plus SLACK, the reason
 * names what happened, nothing landed where it must not, and the rank then
 * serves a healthy room (bytes verified). One row of the table per cell on
 * stdout: time from the room's creation (receiver or sender create) to its
 * terminal poll. docs/testing.md, "The hang matrix", has the measured table;
 * docs/architecture.md, "Time bounds", which variable bounds which state.
 *
 *   ./test_hangs [CELL]   one cell, or all of them (the whole table)
 *
 * Decode cells (kvbridge decode against):
 *   dec_silent        a raw prefill (registered with the "kvbridge" key) that reads
 *                     the KV args and the transfer info and never sends a byte
 *   dec_silent_nokey  the same registered without the key: no writer grant
 *                     reaches it, so the fence waits for its answer
 *   dec_unread        a ZeroMQ PULL socket that is never read (drops all)
 *   dec_blackhole     a TCP listener that never speaks ZeroMQ
 *   dec_prefill_stop  a kvbridge prefill SIGSTOPped after the KV args landed
 *                     (a whole room went through), bootstrap server up
 *   dec_prefill_lost  the same with its bootstrap server stopped too (heartbeat)
 *   dec_boot_silent   a bootstrap "server" that accepts and never answers
 * Prefill cells (kvbridge prefill against):
 *   pre_no_xfer       a raw decode that registers and never sends transfer info
 *   pre_decode_stop   a kvbridge decode SIGSTOPped after its transfer info
 *                     (session warm: its engine stops acknowledging)
 *   pre_decodes_stop  3 such decodes at once, one transfer queue
 *   pre_destroy_stalled  the same, senders and manager destroyed meanwhile
 *   pre_raw_session   a raw decode whose engine session is a TCP listener
 *                     that never answers the handshake
 *   pre_unregistered  a raw decode (bare engine) that unregisters its memory
 *                     after its transfer info
 *   pre_drop_writes   a raw decode whose engine drops every write unanswered
 *                     (test hook target_drop_writes)
 *   pre_status_unread a raw decode that never reads its statuses */
#include "engine/engine_int.h"
#include "harness/kvb_cluster.h"
#include "proto/frames.h"
#include "kvb_test.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include <zmq.h>

#define G KVBH_CHILD_GEOM /* every rank here and in the children */
#define NP 8              /* pages per room */

/* The time-outs, set through their variables in main. */
#define T_WAIT 1.0    /* KVBRIDGE_WAITING_TIMEOUT */
#define T_BOOT 1.0    /* KVBRIDGE_BOOTSTRAP_TIMEOUT */
#define T_XFER 1.0    /* KVBRIDGE_TRANSFER_TIMEOUT */
#define T_ACK 1.0     /* KVBRIDGE_ABORT_ACK_TIMEOUT */
#define T_CONNECT 1.0 /* KVBRIDGE_CONNECT_TIMEOUT */
#define T_ASIDE 0.5   /* KVBRIDGE_STALL_ASIDE */
#define T_PEER 0.5    /* KVBRIDGE_PEER_TIMEOUT */
#define T_LOOKUP 5.0  /* a decode's bootstrap look-up: fixed, no variable */
#define T_HB 0.3      /* KVBRIDGE_HEARTBEAT_INTERVAL (dec_prefill_lost only) */
#define HB_MISSES 2   /* KVBRIDGE_HEARTBEAT_MAX_FAILURE (dec_prefill_lost only) */
#define SLACK 1.0     /* 2 loaded cores, sanitizer builds */

/* A chunk whose writes never settle: its time-out from the issue (the aside
 * thread takes it at max(STALL_ASIDE, TRANSFER)), cancelled and given one
 * more time-out, then its session closed, which ends it. */
#define STALLED_BOUND ((T_ASIDE > T_XFER ? T_ASIDE : T_XFER) + T_XFER)

/* ---- one row of the table ---- */

typedef struct row {
    const char *cell, *side, *peer, *state, *bound_expr;
    double bound, took;
    kvb_poll_t end;
    char reason[512];
} row_t;

static void row_header(void)
{
    printf("| cell | side | peer | state it sat in | bound | terminal after | end | reason |\n");
    printf("|---|---|---|---|---|---|---|---|\n");
}

static void row_print(const row_t *r)
{
    printf("| `%s` | %s | %s | %s | %s = %.1f s | %.3f s | %s | %s |\n", r->cell, r->side, r->peer,
           r->state, r->bound_expr, r->bound, r->took, kvb_poll_string(r->end), r->reason);
    fflush(stdout);
}

/* The row's own assertions: terminal as expected within bound + SLACK, the
 * reason holding want (NULL: no reason, a Success). */
static void row_check(const row_t *r, kvb_poll_t want_end, const char *want)
{
    fprintf(stderr, "%s: %s after %.3f s (bound %.1f + %.1f s): %s\n", r->cell,
            kvb_poll_string(r->end), r->took, r->bound, SLACK, r->reason);
    CHECK_EQ(r->end, want_end);
    CHECK(r->took <= r->bound + SLACK);
    if (want != NULL && strstr(r->reason, want) == NULL)
        fprintf(stderr, "%s: the reason lacks \"%s\"\n", r->cell, want);
    CHECK(want == NULL || strstr(r->reason, want) != NULL);
}

/* The room's timeline (docs/observe.md) under the cell: where it sat and
 * for how long, as an operator would read it. On stderr: stdout holds the
 * table. */
static void timeline_print(const char *side, kvb_status_t st, kvb_timeline_t *tl)
{
    CHECK_EQ(st, KVB_OK);
    CHECK(tl != NULL);
    fprintf(stderr, "  %s timeline of room %llu (%zu events, %llu dropped, age %.3f s):\n", side,
            (unsigned long long)tl->room, tl->n, (unsigned long long)tl->dropped, tl->age_s);
    for (size_t i = 0; i < tl->n; i++)
        fprintf(stderr, "    %8.3f s  %s%s%s\n", tl->events[i].t_s,
                kvb_event_name(tl->events[i].event), tl->events[i].detail[0] ? ": " : "",
                tl->events[i].detail);
    CHECK(tl->n > 0);
    kvb_timeline_free(tl);
}

/* Poll until terminal or t0 + limit; the poll value, the time since t0. */
static kvb_poll_t recv_end(kvb_receiver_h rc, double t0, double limit, double *took)
{
    kvb_poll_t p = kvb_receiver_poll(rc);
    while (p != KVB_POLL_FAILED && p != KVB_POLL_SUCCESS && kvbh_now() < t0 + limit) {
        kvbh_sleep(0.005);
        p = kvb_receiver_poll(rc);
    }
    *took = kvbh_now() - t0;
    kvb_timeline_t *tl = NULL;
    kvb_status_t st = kvb_receiver_timeline(rc, &tl);
    timeline_print("receiver", st, tl);
    return p;
}

static kvb_poll_t send_end(kvb_sender_h s, double t0, double limit, double *took)
{
    kvb_poll_t p = kvb_sender_poll(s);
    while (p != KVB_POLL_FAILED && p != KVB_POLL_SUCCESS && kvbh_now() < t0 + limit) {
        kvbh_sleep(0.005);
        p = kvb_sender_poll(s);
    }
    *took = kvbh_now() - t0;
    kvb_timeline_t *tl = NULL;
    kvb_status_t st = kvb_sender_timeline(s, &tl);
    timeline_print("sender", st, tl);
    return p;
}

/* ---- a raw ZeroMQ PULL endpoint (a raw prefill's control socket, or a raw
 * decode's status socket), read by a thread of its own or never ---- */

#define RAW_MSGS 16

typedef struct raw_pull {
    void *ctx, *sock;
    char ep[64]; /* "127.0.0.1:port" */
    uint16_t port;
    pthread_t thr;
    int reading, stop;
    pthread_mutex_t mu;
    int n;                    /* messages received */
    int frames[RAW_MSGS];     /* frames of each */
    char first[RAW_MSGS][48]; /* its frame 0, printable */
    double at[RAW_MSGS];      /* when */
} raw_pull_t;

static void *pull_main(void *arg)
{
    raw_pull_t *r = arg;
    while (!__atomic_load_n(&r->stop, __ATOMIC_ACQUIRE)) {
        zmq_pollitem_t it = {r->sock, 0, ZMQ_POLLIN, 0};
        if (zmq_poll(&it, 1, 20) <= 0)
            continue;
        int more = 1, nf = 0;
        char first[48] = "";
        while (more) {
            zmq_msg_t m;
            zmq_msg_init(&m);
            if (zmq_msg_recv(&m, r->sock, ZMQ_DONTWAIT) < 0) {
                zmq_msg_close(&m);
                break;
            }
            if (nf++ == 0) {
                size_t len =
                    zmq_msg_size(&m) < sizeof(first) - 1 ? zmq_msg_size(&m) : sizeof(first) - 1;
                const char *d = zmq_msg_data(&m);
                for (size_t i = 0; i < len; i++)
                    first[i] = d[i] >= 0x20 && d[i] < 0x7f ? d[i] : '.';
                first[len] = '\0';
            }
            more = zmq_msg_more(&m);
            zmq_msg_close(&m);
        }
        pthread_mutex_lock(&r->mu);
        if (r->n < RAW_MSGS) {
            r->frames[r->n] = nf;
            snprintf(r->first[r->n], sizeof(r->first[0]), "%s", first);
            r->at[r->n] = kvbh_now();
        }
        r->n++;
        pthread_mutex_unlock(&r->mu);
    }
    return NULL;
}

static void pull_open(raw_pull_t *r, int reading)
{
    char last[128];
    size_t len = sizeof(last);
    int zero = 0;
    memset(r, 0, sizeof(*r));
    pthread_mutex_init(&r->mu, NULL);
    r->ctx = zmq_ctx_new();
    r->sock = zmq_socket(r->ctx, ZMQ_PULL);
    CHECK(r->sock != NULL);
    zmq_setsockopt(r->sock, ZMQ_LINGER, &zero, sizeof(zero));
    CHECK_EQ(zmq_bind(r->sock, "tcp://127.0.0.1:*"), 0);
    CHECK_EQ(zmq_getsockopt(r->sock, ZMQ_LAST_ENDPOINT, last, &len), 0);
    const char *colon = strrchr(last, ':');
    CHECK(colon != NULL);
    r->port = (uint16_t)atoi(colon + 1);
    snprintf(r->ep, sizeof(r->ep), "127.0.0.1:%u", r->port);
    r->reading = reading;
    if (reading)
        CHECK_EQ(pthread_create(&r->thr, NULL, pull_main, r), 0);
}

static int pull_count(raw_pull_t *r)
{
    pthread_mutex_lock(&r->mu);
    int n = r->n;
    pthread_mutex_unlock(&r->mu);
    return n;
}

/* Wait (bounded) until r has read n messages; their count. */
static int pull_wait(raw_pull_t *r, int n, double timeout_s)
{
    double end = kvbh_now() + timeout_s;
    while (pull_count(r) < n && kvbh_now() < end)
        kvbh_sleep(0.005);
    return pull_count(r);
}

/* Messages that waited unread in the socket (a never-read PULL). */
static int pull_drain(raw_pull_t *r)
{
    int n = 0;
    for (int guard = 0; guard < 10000; guard++) {
        zmq_msg_t m;
        zmq_msg_init(&m);
        int got = zmq_msg_recv(&m, r->sock, ZMQ_DONTWAIT);
        int more = got >= 0 && zmq_msg_more(&m);
        zmq_msg_close(&m);
        if (got < 0)
            break;
        n += !more;
    }
    return n;
}

static void pull_close(raw_pull_t *r)
{
    if (r->reading) {
        __atomic_store_n(&r->stop, 1, __ATOMIC_RELEASE);
        pthread_join(r->thr, NULL);
    }
    zmq_close(r->sock);
    zmq_ctx_term(r->ctx);
    pthread_mutex_destroy(&r->mu);
}

/* ---- a TCP listener that accepts, reads and discards, and never sends ---- */

#define HOLE_CONNS 32

typedef struct hole {
    int lfd;
    uint16_t port;
    pthread_t thr;
    int stop;
    long bytes, conns; /* what peers sent it, connections accepted */
} hole_t;

static void *hole_main(void *arg)
{
    hole_t *h = arg;
    struct pollfd pf[HOLE_CONNS + 1];
    int n = 1;
    pf[0] = (struct pollfd){h->lfd, POLLIN, 0};
    while (!__atomic_load_n(&h->stop, __ATOMIC_ACQUIRE)) {
        if (poll(pf, (nfds_t)n, 20) <= 0)
            continue;
        if ((pf[0].revents & POLLIN) && n <= HOLE_CONNS) {
            int fd = accept(h->lfd, NULL, NULL);
            if (fd >= 0) {
                pf[n++] = (struct pollfd){fd, POLLIN, 0};
                __atomic_add_fetch(&h->conns, 1, __ATOMIC_RELAXED);
            }
        }
        for (int i = 1; i < n; i++) {
            char buf[4096];
            if (!(pf[i].revents & (POLLIN | POLLHUP | POLLERR)))
                continue;
            ssize_t got = read(pf[i].fd, buf, sizeof(buf));
            if (got > 0) {
                __atomic_add_fetch(&h->bytes, (long)got, __ATOMIC_RELAXED);
                continue;
            }
            close(pf[i].fd); /* the peer went away: forget it */
            pf[i--] = pf[--n];
        }
    }
    for (int i = 0; i < n; i++)
        close(pf[i].fd);
    return NULL;
}

static void hole_open(hole_t *h)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t al = sizeof(a);
    memset(h, 0, sizeof(*h));
    h->lfd = socket(AF_INET, SOCK_STREAM, 0);
    CHECK(h->lfd >= 0);
    CHECK_EQ(bind(h->lfd, (struct sockaddr *)&a, sizeof(a)), 0);
    CHECK_EQ(listen(h->lfd, 64), 0);
    CHECK_EQ(getsockname(h->lfd, (struct sockaddr *)&a, &al), 0);
    h->port = ntohs(a.sin_port);
    CHECK_EQ(pthread_create(&h->thr, NULL, hole_main, h), 0);
}

static long hole_bytes(hole_t *h)
{
    return __atomic_load_n(&h->bytes, __ATOMIC_RELAXED);
}

static long hole_conns(hole_t *h)
{
    return __atomic_load_n(&h->conns, __ATOMIC_RELAXED);
}

static void hole_close(hole_t *h)
{
    __atomic_store_n(&h->stop, 1, __ATOMIC_RELEASE);
    pthread_join(h->thr, NULL);
}

/* ---- pieces of the cells ---- */

/* PUT /route for a raw prefill rank at ip:port with d's geometry (one rank,
 * TP 1), with or without the "kvbridge" key. */
static void raw_register(const char *boot, uint16_t port, const kvbh_rank_t *d, int kvbridge)
{
    kvb_bootstrap_client_h c;
    uint64_t item[KVBH_MAX_KV], unit[KVBH_MAX_KV];
    for (int i = 0; i < d->n_kv; i++) {
        item[i] = d->item_len;
        unit[i] = d->item_len / (uint64_t)G.page / (uint64_t)G.heads;
    }
    kvb_bootstrap_registration_t reg = {0};
    reg.field_mask = KVB_BOOTSTRAP_REG_KV_ITEM_LENS | KVB_BOOTSTRAP_REG_KV_UNIT_LENS |
                     KVB_BOOTSTRAP_REG_PAGE_SIZE | (kvbridge ? KVB_BOOTSTRAP_REG_KVBRIDGE : 0);
    reg.attn_tp_size = reg.attn_dp_size = reg.pp_size = reg.system_dp_size = 1;
    reg.rank_ip = "127.0.0.1";
    reg.rank_port = port;
    reg.kv_item_lens = (kvb_bootstrap_lens_t){item, (size_t)d->n_kv};
    reg.kv_unit_lens = (kvb_bootstrap_lens_t){unit, (size_t)d->n_kv};
    reg.page_size = G.page;
    CHECK_EQ(kvb_bootstrap_client_create(boot, NULL, &c), KVB_OK);
    CHECK_EQ(kvb_bootstrap_client_register(c, &reg, 5.0), KVB_OK);
    kvb_bootstrap_client_destroy(c);
}

/* A healthy room from a fresh kvbridge prefill (its own bootstrap server) to
 * decode d, bytes verified: the decode still serves. */
static void healthy_decode(kvbh_rank_t *d, uint64_t room)
{
    kvbh_boot_t b;
    kvbh_rank_t p;
    CHECK_EQ(kvbh_boot_start(&b, 0, NULL), 0);
    CHECK_EQ(kvbh_rank_start(&p, &G, KVB_MODE_PREFILL, b.addr, KVBH_MEM_MALLOC, NULL), KVB_OK);
    CHECK_EQ(kvbh_run_room(&p, d, b.addr, room, NP, 0, 120, 1), 0);
    fprintf(stderr, "healthy room %llu to the same decode: Success, bytes verified\n",
            (unsigned long long)room);
    kvbh_rank_stop(&p);
    kvbh_boot_stop(&b);
}

/* A healthy room from prefill p (registered with boot) to a fresh kvbridge
 * decode, bytes verified: the prefill still serves. */
static void healthy_prefill(kvbh_rank_t *p, const char *boot, uint64_t room)
{
    kvbh_rank_t d;
    KVB__HOOK_SET(target_drop_writes, 0);
    CHECK_EQ(kvbh_rank_start(&d, &G, KVB_MODE_DECODE, NULL, KVBH_MEM_MALLOC, NULL), KVB_OK);
    CHECK_EQ(kvbh_run_room(p, &d, boot, room, NP, 0, 120, 1), 0);
    CHECK(kvbh_canaries_ok(&d, "healthy decode"));
    fprintf(stderr, "healthy room %llu from the same prefill: Success, bytes verified\n",
            (unsigned long long)room);
    kvbh_rank_stop(&d);
}

static void set_knobs(void);

/* ---- decode cells ---- */

enum { RAW_READ, RAW_UNREAD, RAW_HOLE };

/* A kvbridge decode against a raw prefill rank registered with a bootstrap
 * server: mode says what sits at its control endpoint. */
static void dec_raw(row_t *row, int mode, int key)
{
    const uint64_t room = 700 + (uint64_t)mode * 10 + (uint64_t)key;
    kvbh_boot_t b;
    kvbh_rank_t d;
    raw_pull_t rp;
    hole_t h;
    kvb_receiver_h rc;
    int32_t dst[NP];
    CHECK_EQ(kvbh_boot_start(&b, 0, NULL), 0);
    CHECK_EQ(kvbh_rank_start(&d, &G, KVB_MODE_DECODE, NULL, KVBH_MEM_MALLOC, NULL), KVB_OK);
    if (mode == RAW_HOLE)
        hole_open(&h);
    else
        pull_open(&rp, mode == RAW_READ);
    raw_register(b.addr, mode == RAW_HOLE ? h.port : rp.port, &d, key);
    kvbh_room_pages(&G, room, NP, NULL, dst);
    double t0 = kvbh_now();
    CHECK_EQ(kvb_receiver_create(d.mgr, b.addr, room, -1, &rc), KVB_OK);
    CHECK_EQ(kvb_receiver_init(rc, dst, NP, kvbh_room_aux(room), NULL), KVB_OK);
    CHECK_EQ(kvb_receiver_poll(rc), KVB_POLL_WAITING_FOR_INPUT);
    /* The fault window: the peer has what it needs and stays silent. */
    if (mode == RAW_READ) {
        CHECK(pull_wait(&rp, 2, 2.0) >= 2);
        char want[32];
        snprintf(want, sizeof(want), "%llu", (unsigned long long)room);
        fprintf(stderr,
                "raw prefill read the KV args (%d frames) at %.3f s and the transfer "
                "info (%d frames, frame 0 \"%s\") at %.3f s; it says nothing\n",
                rp.frames[0], rp.at[0] - t0, rp.frames[1], rp.first[1], rp.at[1] - t0);
        CHECK(strcmp(rp.first[1], want) == 0);
    } else if (mode == RAW_HOLE) {
        for (int i = 0; i < 400 && hole_bytes(&h) == 0; i++)
            kvbh_sleep(0.005);
        fprintf(stderr, "the listener got %ld bytes on %ld connection(s) and answers none\n",
                hole_bytes(&h), hole_conns(&h));
        CHECK(hole_bytes(&h) > 0);
    }
    row->state = "WaitingForInput";
    row->bound = key ? T_WAIT : T_WAIT + T_ACK;
    row->bound_expr = key ? "WAITING" : "WAITING + ABORT_ACK";
    row->end = recv_end(rc, t0, row->bound + SLACK + 5, &row->took);
    kvb_receiver_failure(rc, row->reason, sizeof(row->reason));
    row_check(row, KVB_POLL_FAILED, "KVPoll.WaitingForInput");
    /* A source a grant reached cannot write once it is revoked: safe at
     * once. One no grant reached never confirmed: reported past the
     * abort-ack bound, its pages quarantined. */
    CHECK_EQ(kvb_receiver_pages_safe(rc), key ? 1 : 0);
    CHECK(key || strstr(row->reason, "NOT safe to reuse") != NULL);
    if (mode == RAW_READ)
        fprintf(stderr, "raw prefill got %d message(s) in all (an abort after the failure)\n",
                pull_count(&rp));
    if (mode == RAW_UNREAD) {
        int waiting = pull_drain(&rp);
        fprintf(stderr, "%d message(s) waited unread in the peer's socket\n", waiting);
        CHECK(waiting >= 2); /* KV args and transfer info reached it */
    }
    kvb_receiver_destroy(rc);
    healthy_decode(&d, room + 1000);
    if (mode == RAW_HOLE)
        hole_close(&h);
    else
        pull_close(&rp);
    kvbh_rank_stop(&d);
    kvbh_boot_stop(&b);
}

static void cell_dec_silent(row_t *r)
{
    r->side = "decode";
    r->peer = "raw prefill: reads KV args and transfer info, never a byte nor a status";
    dec_raw(r, RAW_READ, 1);
}

static void cell_dec_silent_nokey(row_t *r)
{
    r->side = "decode";
    r->peer = "the same, registered without `\"kvbridge\": 1` (no writer grant reaches it)";
    dec_raw(r, RAW_READ, 0);
}

static void cell_dec_unread(row_t *r)
{
    r->side = "decode";
    r->peer = "a ZeroMQ PULL socket never read (drops every frame)";
    dec_raw(r, RAW_UNREAD, 1);
}

static void cell_dec_blackhole(row_t *r)
{
    r->side = "decode";
    r->peer = "a TCP listener that never speaks ZeroMQ";
    dec_raw(r, RAW_HOLE, 1);
}

/* A kvbridge prefill process SIGSTOPped after our KV args landed there (a
 * whole room went through), its bootstrap server (here) up: the heartbeat
 * sees nothing wrong; the transfer info goes into a stopped process. */
static void cell_dec_prefill_stop(row_t *row)
{
    const uint64_t R0 = 800, R1 = 801, R2 = 802;
    kvbh_boot_t b;
    kvbh_child_t ch;
    kvbh_rank_t d;
    kvb_receiver_h rc0, rc1, rc2;
    char ep[128], cmd[64];
    int32_t dst[NP];
    row->side = "decode";
    row->peer = "kvbridge prefill SIGSTOPped after the KV args (bootstrap server up)";
    CHECK_EQ(kvbh_boot_start(&b, 0, NULL), 0);
    CHECK_EQ(kvbh_spawn_bprefill(&ch, b.addr, ep, sizeof(ep)), 0);
    CHECK_EQ(kvbh_rank_start(&d, &G, KVB_MODE_DECODE, NULL, KVBH_MEM_MALLOC, NULL), KVB_OK);
    CHECK_EQ(kvbh_receivers(&d, b.addr, R0, 1, NP, &rc0), 0);
    snprintf(cmd, sizeof(cmd), "full %llu 1 %d", (unsigned long long)R0, NP);
    CHECK_EQ(kvbh_child_ask(&ch, cmd, "sent", 20), 0);
    CHECK_EQ(kvbh_wait_receiver(rc0, 10), KVB_POLL_SUCCESS);
    kvbh_room_pages(&G, R0, NP, NULL, dst);
    CHECK_EQ(kvbh_verify(&d, R0, dst, NP, kvbh_room_aux(R0)), (uint64_t)0);
    kvb_receiver_destroy(rc0);
    /* The window: the route and KV args are in place, the prefill stops. */
    double t0 = kvbh_now();
    CHECK_EQ(kvb_receiver_create(d.mgr, b.addr, R1, -1, &rc1), KVB_OK);
    CHECK_EQ(kill(ch.pid, SIGSTOP), 0);
    kvbh_wait_stopped(ch.pid);
    fprintf(stderr, "prefill %d stopped %.3f s after the receiver's creation\n", (int)ch.pid,
            kvbh_now() - t0);
    kvbh_room_pages(&G, R1, NP, NULL, dst);
    CHECK_EQ(kvb_receiver_init(rc1, dst, NP, kvbh_room_aux(R1), NULL), KVB_OK);
    row->state = "WaitingForInput";
    row->bound = T_WAIT;
    row->bound_expr = "WAITING";
    row->end = recv_end(rc1, t0, row->bound + SLACK + 5, &row->took);
    kvb_receiver_failure(rc1, row->reason, sizeof(row->reason));
    kill(ch.pid, SIGCONT);
    row_check(row, KVB_POLL_FAILED, "KVPoll.WaitingForInput");
    CHECK_EQ(kvb_receiver_pages_safe(rc1), 1);
    kvb_receiver_destroy(rc1);
    /* Resumed, the same prefill serves the same decode. */
    CHECK_EQ(kvbh_receivers(&d, b.addr, R2, 1, NP, &rc2), 0);
    snprintf(cmd, sizeof(cmd), "full %llu 1 %d", (unsigned long long)R2, NP);
    CHECK_EQ(kvbh_child_ask(&ch, cmd, "sent", 20), 0);
    CHECK_EQ(kvbh_wait_receiver(rc2, 10), KVB_POLL_SUCCESS);
    kvbh_room_pages(&G, R2, NP, NULL, dst);
    CHECK_EQ(kvbh_verify(&d, R2, dst, NP, kvbh_room_aux(R2)), (uint64_t)0);
    fprintf(stderr, "healthy room %llu after SIGCONT: Success, bytes verified\n",
            (unsigned long long)R2);
    kvb_receiver_destroy(rc2);
    kvbh_child_close(&ch);
    kvbh_rank_stop(&d);
    kvbh_boot_stop(&b);
}

/* The prefill process and its bootstrap server (one child) SIGSTOPped after
 * our KV args landed: the heartbeat ends the room, whatever its state. The
 * heartbeat knobs are this cell's alone (a loaded machine must not make the
 * other cells' decodes lose their servers). */
static void cell_dec_prefill_lost(row_t *row)
{
    const uint64_t R0 = 820, R1 = 821, R2 = 822;
    kvbh_child_t ch;
    kvbh_rank_t d;
    kvb_receiver_h rc0, rc1, rc2;
    char boot[128], cmd[64], expect[256], v[16];
    int32_t dst[NP];
    row->side = "decode";
    row->peer = "kvbridge prefill and its bootstrap server SIGSTOPped after the KV args";
    snprintf(v, sizeof(v), "%g", T_HB);
    setenv("KVBRIDGE_HEARTBEAT_INTERVAL", v, 1);
    setenv("KVBRIDGE_HEARTBEAT_FLOOR", v, 1);
    snprintf(v, sizeof(v), "%d", HB_MISSES);
    setenv("KVBRIDGE_HEARTBEAT_MAX_FAILURE", v, 1);
    setenv("KVBRIDGE_WAITING_TIMEOUT", "5", 1); /* the heartbeat must be what ends it */
    CHECK_EQ(kvbh_rank_start(&d, &G, KVB_MODE_DECODE, NULL, KVBH_MEM_MALLOC, NULL), KVB_OK);
    unsetenv("KVBRIDGE_HEARTBEAT_INTERVAL");
    unsetenv("KVBRIDGE_HEARTBEAT_FLOOR");
    unsetenv("KVBRIDGE_HEARTBEAT_MAX_FAILURE");
    set_knobs();
    CHECK_EQ(kvbh_spawn_prefill(&ch, boot, sizeof(boot)), 0);
    CHECK_EQ(kvbh_receivers(&d, boot, R0, 1, NP, &rc0), 0);
    snprintf(cmd, sizeof(cmd), "full %llu 1 %d", (unsigned long long)R0, NP);
    CHECK_EQ(kvbh_child_ask(&ch, cmd, "sent", 20), 0);
    CHECK_EQ(kvbh_wait_receiver(rc0, 10), KVB_POLL_SUCCESS);
    kvb_receiver_destroy(rc0);
    double t0 = kvbh_now();
    CHECK_EQ(kvb_receiver_create(d.mgr, boot, R1, -1, &rc1), KVB_OK); /* the route is cached */
    CHECK_EQ(kill(ch.pid, SIGSTOP), 0);
    kvbh_wait_stopped(ch.pid);
    double t_stop = kvbh_now() - t0;
    kvbh_room_pages(&G, R1, NP, NULL, dst);
    CHECK_EQ(kvb_receiver_init(rc1, dst, NP, kvbh_room_aux(R1), NULL), KVB_OK);
    row->state = "WaitingForInput";
    /* each miss: up to an interval until the probe, then its own time-out,
     * min(interval, 3 s) (the next round is due an interval after a failed
     * probe ends) */
    row->bound = t_stop + HB_MISSES * (T_HB + (T_HB < 3 ? T_HB : 3));
    row->bound_expr = "MAX_FAILURE x (HEARTBEAT_INTERVAL + min(INTERVAL, 3 s))";
    row->end = recv_end(rc1, t0, row->bound + SLACK + 5, &row->took);
    kvb_receiver_failure(rc1, row->reason, sizeof(row->reason));
    kill(ch.pid, SIGCONT);
    snprintf(expect, sizeof(expect), "Losing connection with prefill instance (bootstrap_addr: %s)",
             boot);
    row_check(row, KVB_POLL_FAILED, expect);
    CHECK_EQ(kvb_receiver_pages_safe(rc1), 1);
    kvb_receiver_destroy(rc1);
    /* Resumed: the route is resolved again and the same prefill serves. */
    CHECK_EQ(kvbh_receivers(&d, boot, R2, 1, NP, &rc2), 0);
    snprintf(cmd, sizeof(cmd), "full %llu 1 %d", (unsigned long long)R2, NP);
    CHECK_EQ(kvbh_child_ask(&ch, cmd, "sent", 20), 0);
    CHECK_EQ(kvbh_wait_receiver(rc2, 10), KVB_POLL_SUCCESS);
    kvbh_room_pages(&G, R2, NP, NULL, dst);
    CHECK_EQ(kvbh_verify(&d, R2, dst, NP, kvbh_room_aux(R2)), (uint64_t)0);
    fprintf(stderr, "healthy room %llu after SIGCONT: Success, bytes verified\n",
            (unsigned long long)R2);
    kvb_receiver_destroy(rc2);
    kvbh_child_close(&ch);
    kvbh_rank_stop(&d);
}

/* The bootstrap address is a listener that never answers HTTP: the
 * receiver's creation (which resolves the route synchronously) ends within
 * the look-up's fixed bound, the room Failed. */
static void cell_dec_boot_silent(row_t *row)
{
    const uint64_t room = 850;
    kvbh_rank_t d;
    hole_t h;
    kvb_receiver_h rc;
    char addr[64];
    row->side = "decode";
    row->peer = "a bootstrap server that accepts and never answers";
    CHECK_EQ(kvbh_rank_start(&d, &G, KVB_MODE_DECODE, NULL, KVBH_MEM_MALLOC, NULL), KVB_OK);
    hole_open(&h);
    snprintf(addr, sizeof(addr), "127.0.0.1:%u", h.port);
    double t0 = kvbh_now();
    CHECK_EQ(kvb_receiver_create(d.mgr, addr, room, -1, &rc), KVB_OK);
    fprintf(stderr, "kvb_receiver_create returned after %.3f s; the listener got %ld bytes\n",
            kvbh_now() - t0, hole_bytes(&h));
    CHECK(hole_bytes(&h) > 0);
    row->state = "Bootstrapping (inside kvb_receiver_create)";
    row->bound = T_LOOKUP;
    row->bound_expr = "the look-up's fixed 5 s";
    row->end = recv_end(rc, t0, row->bound + SLACK + 5, &row->took);
    kvb_receiver_failure(rc, row->reason, sizeof(row->reason));
    row_check(row, KVB_POLL_FAILED, "Could not fetch prefill parallel info from bootstrap_addr");
    CHECK(row->took >= T_LOOKUP - 0.1); /* the window: it did wait for an answer */
    kvb_receiver_destroy(rc);
    healthy_decode(&d, room + 1000);
    hole_close(&h);
    kvbh_rank_stop(&d);
}

/* ---- prefill cells ---- */

/* A raw decode: a bare engine with one registered arena laid out as a
 * decode rank's KV buffers and aux items, and a PULL socket for statuses. */
typedef struct raw_decode {
    kvb_engine_h eng;
    uint8_t *arena;
    size_t len;
    uint64_t buf_len, item_len;
    int n_kv;
    raw_pull_t st;
    kvbh_push_t push;
    kvb__frames_buf_t fb;
} raw_decode_t;

/* sid: the engine session the registration names (NULL: the bare engine's). */
static void raw_decode_open(raw_decode_t *rd, const kvbh_rank_t *p, const char *sid,
                            int read_statuses)
{
    memset(rd, 0, sizeof(*rd));
    rd->n_kv = p->n_kv;
    rd->item_len = p->item_len;
    rd->buf_len = p->buf_len;
    rd->len = (size_t)rd->n_kv * rd->buf_len + KVBH_AUX_ITEM * KVBH_AUX_ITEMS;
    rd->arena = calloc(1, rd->len);
    CHECK(rd->arena != NULL);
    CHECK_EQ(kvb_engine_create(NULL, &rd->eng), KVB_OK);
    CHECK_EQ(kvb_engine_register(rd->eng, rd->arena, rd->len, KVB_MEM_HOST), KVB_OK);
    pull_open(&rd->st, read_statuses);
    kvb__frames_buf_init(&rd->fb);
    CHECK_EQ(kvbh_push_open(&rd->push, kvb_manager_endpoint(p->mgr), NULL), 0);
    const char *s = sid != NULL ? sid : kvb_engine_session_id(rd->eng);
    CHECK_EQ(kvbh_reg_frames(&rd->fb, s, rd->st.ep, (uint64_t)(uintptr_t)rd->arena, rd->buf_len,
                             (size_t)rd->n_kv,
                             (uint64_t)(uintptr_t)(rd->arena + (size_t)rd->n_kv * rd->buf_len),
                             rd->item_len),
             KVB_OK);
    CHECK_EQ(kvbh_push_send(&rd->push, &rd->fb), 0);
}

static void raw_decode_xfer(raw_decode_t *rd, uint64_t room, const int32_t *dst, const char *sid)
{
    const char *s = sid != NULL ? sid : kvb_engine_session_id(rd->eng);
    CHECK_EQ(kvbh_xfer_frames(&rd->fb, room, s, rd->st.ep, dst, NP, kvbh_room_aux(room)), KVB_OK);
    CHECK_EQ(kvbh_push_send(&rd->push, &rd->fb), 0);
}

/* Bytes of rd's KV pages dst[0..n) that are not zero. */
static uint64_t raw_decode_nonzero(const raw_decode_t *rd, const int32_t *dst, int n)
{
    uint64_t bad = 0;
    for (int b = 0; b < rd->n_kv; b++)
        for (int i = 0; i < n; i++) {
            const uint8_t *q =
                rd->arena + (uint64_t)b * rd->buf_len + (uint64_t)dst[i] * rd->item_len;
            for (uint64_t k = 0; k < rd->item_len; k++)
                bad += q[k] != 0;
        }
    return bad;
}

/* Wrong bytes of rd's pages dst against p's pages src (KV buffers). */
static uint64_t raw_decode_wrong(const raw_decode_t *rd, const kvbh_rank_t *p, const int32_t *src,
                                 const int32_t *dst, int n)
{
    uint64_t bad = 0;
    for (int b = 0; b < rd->n_kv; b++)
        for (int i = 0; i < n; i++) {
            const uint8_t *q =
                rd->arena + (uint64_t)b * rd->buf_len + (uint64_t)dst[i] * rd->item_len;
            const uint8_t *s = p->kv[b] + (uint64_t)src[i] * p->item_len;
            for (uint64_t k = 0; k < rd->item_len; k++)
                bad += q[k] != s[k];
        }
    return bad;
}

static void raw_decode_close(raw_decode_t *rd)
{
    kvbh_push_close(&rd->push);
    kvb__frames_buf_free(&rd->fb);
    pull_close(&rd->st);
    kvb_engine_unregister(rd->eng, rd->arena); /* may be gone already */
    kvb_engine_destroy(rd->eng);
    free(rd->arena);
}

/* A sender for room on p, ready (the transfer info arrived), pages filled. */
static kvb_sender_h ready_sender(kvbh_rank_t *p, uint64_t room, int32_t *src)
{
    kvb_sender_h s;
    kvbh_room_pages(&G, room, NP, src, NULL);
    kvbh_fill(p, room, src, NP, kvbh_room_aux(room));
    CHECK_EQ(kvb_sender_create(p->mgr, "x", room, &s), KVB_OK);
    CHECK_EQ(kvbh_wait_sender_ready(s, 10), 0);
    return s;
}

/* The whole room through s: init, every page sent. */
static void send_all(kvb_sender_h s, uint64_t room, const int32_t *src)
{
    CHECK_EQ(kvb_sender_init(s, NP, kvbh_room_aux(room)), KVB_OK);
    CHECK_EQ(kvb_sender_send(s, src, NP), KVB_OK);
}

/* The raw decode's status socket got a message for room (frame 0) after
 * the prefill's room ended: the decode was told. */
static void told(raw_decode_t *rd, uint64_t room, double timeout_s)
{
    char want[32];
    snprintf(want, sizeof(want), "%llu", (unsigned long long)room);
    double end = kvbh_now() + timeout_s;
    for (;;) {
        pthread_mutex_lock(&rd->st.mu);
        int n = rd->st.n < RAW_MSGS ? rd->st.n : RAW_MSGS, hit = 0;
        for (int i = 0; i < n; i++)
            hit |= strcmp(rd->st.first[i], want) == 0;
        pthread_mutex_unlock(&rd->st.mu);
        if (hit) {
            fprintf(stderr, "the raw decode was told (a status for room %s)\n", want);
            return;
        }
        CHECK(kvbh_now() < end);
        kvbh_sleep(0.005);
    }
}

static void cell_pre_no_xfer(row_t *row)
{
    const uint64_t room = 900;
    kvbh_boot_t b;
    kvbh_rank_t p;
    raw_decode_t rd;
    kvb_sender_h s;
    kvb_manager_stats_t st;
    row->side = "prefill";
    row->peer = "raw decode: registers its KV args, never sends the transfer info";
    CHECK_EQ(kvbh_boot_start(&b, 0, NULL), 0);
    CHECK_EQ(kvbh_rank_start(&p, &G, KVB_MODE_PREFILL, b.addr, KVBH_MEM_MALLOC, NULL), KVB_OK);
    raw_decode_open(&rd, &p, NULL, 1);
    for (int i = 0; i < 400; i++) { /* the window: the registration is held */
        kvb_manager_stats(p.mgr, &st);
        if (st.registrations > 0)
            break;
        kvbh_sleep(0.005);
    }
    CHECK_EQ(st.registrations, 1);
    double t0 = kvbh_now();
    CHECK_EQ(kvb_sender_create(p.mgr, "x", room, &s), KVB_OK);
    CHECK_EQ(kvb_sender_poll(s), KVB_POLL_BOOTSTRAPPING);
    row->state = "Bootstrapping";
    row->bound = T_BOOT;
    row->bound_expr = "BOOTSTRAP";
    row->end = send_end(s, t0, row->bound + SLACK + 5, &row->took);
    kvb_sender_failure(s, row->reason, sizeof(row->reason));
    row_check(row, KVB_POLL_FAILED, "KVPoll.Bootstrapping");
    kvb_sender_destroy(s);
    healthy_prefill(&p, b.addr, room + 1000);
    raw_decode_close(&rd);
    kvbh_rank_stop(&p);
    kvbh_boot_stop(&b);
}

/* A kvbridge decode process (message lane: malloc arena) whose transfer
 * infos reached the prefill, SIGSTOPped once a first room went through
 * (the session is up): the second room's writes are never acknowledged. */
static void cell_pre_decode_stop(row_t *row)
{
    const uint64_t R0 = 950;
    kvbh_boot_t b;
    kvbh_rank_t p;
    kvbh_child_t ch;
    kvb_sender_h s0, s1;
    int32_t src[NP];
    row->side = "prefill";
    row->peer = "kvbridge decode SIGSTOPped after its transfer info (its engine stops acking)";
    CHECK_EQ(kvbh_boot_start(&b, 0, NULL), 0);
    CHECK_EQ(kvbh_rank_start(&p, &G, KVB_MODE_PREFILL, b.addr, KVBH_MEM_MALLOC, NULL), KVB_OK);
    CHECK_EQ(kvbh_spawn_decode(&ch, b.addr, KVBH_MEM_MALLOC, R0, 2, NP), 0);
    s0 = ready_sender(&p, R0, src);
    send_all(s0, R0, src);
    CHECK_EQ(kvbh_wait_sender(s0, 10), KVB_POLL_SUCCESS);
    kvb_sender_destroy(s0);
    double t0 = kvbh_now();
    s1 = ready_sender(&p, R0 + 1, src);
    CHECK_EQ(kill(ch.pid, SIGSTOP), 0);
    kvbh_wait_stopped(ch.pid);
    fprintf(stderr, "decode %d stopped %.3f s after the sender's creation\n", (int)ch.pid,
            kvbh_now() - t0);
    send_all(s1, R0 + 1, src);
    row->state = "Transferring";
    row->bound = STALLED_BOUND;
    row->bound_expr = "2 x TRANSFER";
    row->end = send_end(s1, t0, row->bound + SLACK + 5, &row->took);
    kvb_sender_failure(s1, row->reason, sizeof(row->reason));
    row_check(row, KVB_POLL_FAILED, "did not finish within");
    kvb_sender_destroy(s1);
    kvbh_child_kill(&ch);
    healthy_prefill(&p, b.addr, R0 + 1000);
    kvbh_rank_stop(&p);
    kvbh_boot_stop(&b);
}

/* NDEC kvbridge decode processes (a session each) SIGSTOPped after their
 * transfer infos, one room to each, all through one transfer queue (the
 * worker and the aside thread settle them). */
#define NDEC 3

typedef struct stalled {
    kvbh_boot_t b;
    kvbh_rank_t p;
    kvbh_child_t ch[NDEC];
    kvb_sender_h s[NDEC];
    double t0; /* the senders' creation */
} stalled_t;

static void stalled_start(stalled_t *st, uint64_t R0)
{
    kvb_sender_h s0;
    int32_t src[NP];
    CHECK_EQ(kvbh_boot_start(&st->b, 0, NULL), 0);
    setenv("KVBRIDGE_QUEUE_SIZE", "1", 1);
    CHECK_EQ(kvbh_rank_start(&st->p, &G, KVB_MODE_PREFILL, st->b.addr, KVBH_MEM_MALLOC, NULL),
             KVB_OK);
    unsetenv("KVBRIDGE_QUEUE_SIZE");
    for (int i = 0; i < NDEC; i++) { /* a whole room each: the sessions are up */
        uint64_t r = R0 + 10 * (uint64_t)i;
        CHECK_EQ(kvbh_spawn_decode(&st->ch[i], st->b.addr, KVBH_MEM_MALLOC, r, 2, NP), 0);
        s0 = ready_sender(&st->p, r, src);
        send_all(s0, r, src);
        CHECK_EQ(kvbh_wait_sender(s0, 10), KVB_POLL_SUCCESS);
        kvb_sender_destroy(s0);
    }
    st->t0 = kvbh_now();
    for (int i = 0; i < NDEC; i++)
        st->s[i] = ready_sender(&st->p, R0 + 10 * (uint64_t)i + 1, src);
    for (int i = 0; i < NDEC; i++) {
        CHECK_EQ(kill(st->ch[i].pid, SIGSTOP), 0);
        kvbh_wait_stopped(st->ch[i].pid);
    }
    for (int i = 0; i < NDEC; i++) {
        kvbh_room_pages(&G, R0 + 10 * (uint64_t)i + 1, NP, src, NULL);
        send_all(st->s[i], R0 + 10 * (uint64_t)i + 1, src);
    }
}

static void stalled_stop(stalled_t *st)
{
    for (int i = 0; i < NDEC; i++)
        kvbh_child_kill(&st->ch[i]);
    kvbh_rank_stop(&st->p);
    kvbh_boot_stop(&st->b);
}

/* Each room ends within the same bound as one, not one transfer time-out
 * later per stalled session. */
static void cell_pre_decodes_stop(row_t *row)
{
    const uint64_t R0 = 1100;
    stalled_t st;
    double took[NDEC];
    kvb_poll_t end[NDEC];
    row->side = "prefill";
    row->peer = "3 kvbridge decodes SIGSTOPped after their transfer infos, one queue";
    stalled_start(&st, R0);
    /* the one queue's worker issues a chunk, then settles the one before
     * (STALL_ASIDE at most): chunk k leaves k - 1 windows after the first */
    row->state = "Transferring";
    row->bound = STALLED_BOUND + (NDEC - 2) * T_ASIDE;
    row->bound_expr = "2 x TRANSFER + STALL_ASIDE";
    row->took = 0;
    int left = NDEC;
    for (int i = 0; i < NDEC; i++)
        end[i] = KVB_POLL_TRANSFERRING;
    while (left > 0 && kvbh_now() < st.t0 + row->bound + SLACK + 5 * NDEC) {
        for (int i = 0; i < NDEC; i++) {
            if (end[i] == KVB_POLL_FAILED || end[i] == KVB_POLL_SUCCESS)
                continue;
            end[i] = kvb_sender_poll(st.s[i]);
            took[i] = kvbh_now() - st.t0;
            left -= end[i] == KVB_POLL_FAILED || end[i] == KVB_POLL_SUCCESS;
        }
        kvbh_sleep(0.005);
    }
    for (int i = 0; i < NDEC; i++) {
        fprintf(stderr, "room to stopped decode %d: %s after %.3f s\n", i, kvb_poll_string(end[i]),
                took[i]);
        row->took = took[i] > row->took ? took[i] : row->took;
        kvb_sender_failure(st.s[i], row->reason, sizeof(row->reason));
        CHECK_EQ(end[i], KVB_POLL_FAILED);
    }
    row->end = KVB_POLL_FAILED;
    row_check(row, KVB_POLL_FAILED, "did not finish within");
    for (int i = 0; i < NDEC; i++)
        kvb_sender_destroy(st.s[i]);
    healthy_prefill(&st.p, st.b.addr, R0 + 1000);
    stalled_stop(&st);
}

/* The same, and the framework gives up: it destroys the senders (each
 * aborts its room) and the manager at once. The destroy must return within
 * the rooms' own bound: every stalled write ended, none left behind. */
static void cell_pre_destroy_stalled(row_t *row)
{
    stalled_t st;
    row->side = "prefill";
    row->peer = "the same; senders and manager destroyed while the writes stall";
    stalled_start(&st, 1200);
    /* The window: every chunk issued and stalled (set aside) before the
     * destroy, not dropped from its queue unissued. */
    double d = st.t0 + T_ASIDE + 0.3 - kvbh_now();
    if (d > 0)
        kvbh_sleep(d);
    for (int i = 0; i < NDEC; i++)
        CHECK_EQ(kvb_sender_poll(st.s[i]), KVB_POLL_TRANSFERRING);
    double t1 = kvbh_now();
    for (int i = 0; i < NDEC; i++)
        kvb_sender_destroy(st.s[i]);
    double t_senders = kvbh_now() - t1;
    kvb_manager_destroy(st.p.mgr);
    st.p.mgr = NULL;
    row->took = kvbh_now() - st.t0;
    fprintf(stderr,
            "stalled at %.3f s; senders destroyed in %.3f s, the manager %.3f s after the "
            "senders' creation\n",
            t1 - st.t0, t_senders, row->took);
    row->state = "Transferring (kvb_manager_destroy)";
    row->bound = STALLED_BOUND + (NDEC - 2) * T_ASIDE;
    row->bound_expr = "2 x TRANSFER + STALL_ASIDE";
    row->end = KVB_POLL_FAILED; /* aborted; destroy returned */
    snprintf(row->reason, sizeof(row->reason),
             "(destroy returned: Aborted: sender destroyed "
             "before the end)");
    row_check(row, KVB_POLL_FAILED, NULL);
    stalled_stop(&st);
}

/* The decode's registration names an engine session at a listener that
 * accepts and never answers the handshake. */
static void cell_pre_raw_session(row_t *row)
{
    const uint64_t room = 960;
    kvbh_boot_t b;
    kvbh_rank_t p;
    raw_decode_t rd;
    hole_t h;
    kvb_sender_h s;
    int32_t src[NP], dst[NP];
    char sid[64];
    row->side = "prefill";
    row->peer = "raw decode whose engine session never answers the handshake";
    CHECK_EQ(kvbh_boot_start(&b, 0, NULL), 0);
    CHECK_EQ(kvbh_rank_start(&p, &G, KVB_MODE_PREFILL, b.addr, KVBH_MEM_MALLOC, NULL), KVB_OK);
    hole_open(&h);
    snprintf(sid, sizeof(sid), "127.0.0.1:%u", h.port);
    raw_decode_open(&rd, &p, sid, 1);
    kvbh_room_pages(&G, room, NP, NULL, dst);
    raw_decode_xfer(&rd, room, dst, sid);
    double t0 = kvbh_now();
    s = ready_sender(&p, room, src);
    send_all(s, room, src);
    row->state = "Transferring (the engine's handshake)";
    row->bound = T_CONNECT;
    row->bound_expr = "CONNECT";
    row->end = send_end(s, t0, row->bound + SLACK + 5, &row->took);
    kvb_sender_failure(s, row->reason, sizeof(row->reason));
    fprintf(stderr, "the listener got %ld bytes on %ld connection(s)\n", hole_bytes(&h),
            hole_conns(&h));
    CHECK(hole_bytes(&h) > 0); /* the window: a handshake was sent and never answered */
    row_check(row, KVB_POLL_FAILED, sid);
    told(&rd, room, 2.0);
    kvb_sender_destroy(s);
    healthy_prefill(&p, b.addr, room + 1000);
    raw_decode_close(&rd);
    hole_close(&h);
    kvbh_rank_stop(&p);
    kvbh_boot_stop(&b);
}

/* A bare-engine decode: a first room lands (the session is up), then it
 * unregisters its memory (drop) or its engine drops every write unanswered
 * (hook target_drop_writes); the second room must end and land nothing. */
static void pre_rejects(row_t *row, int drop)
{
    const uint64_t R0 = drop ? 980 : 970;
    kvbh_boot_t b;
    kvbh_rank_t p;
    raw_decode_t rd;
    kvb_sender_h s0, s1;
    int32_t src[NP], dst[NP];
    CHECK_EQ(kvbh_boot_start(&b, 0, NULL), 0);
    CHECK_EQ(kvbh_rank_start(&p, &G, KVB_MODE_PREFILL, b.addr, KVBH_MEM_MALLOC, NULL), KVB_OK);
    raw_decode_open(&rd, &p, NULL, 1);
    kvbh_room_pages(&G, R0, NP, NULL, dst);
    raw_decode_xfer(&rd, R0, dst, NULL);
    s0 = ready_sender(&p, R0, src);
    send_all(s0, R0, src);
    CHECK_EQ(kvbh_wait_sender(s0, 10), KVB_POLL_SUCCESS);
    CHECK_EQ(raw_decode_wrong(&rd, &p, src, dst, NP), (uint64_t)0);
    kvb_sender_destroy(s0);
    kvbh_room_pages(&G, R0 + 1, NP, NULL, dst);
    raw_decode_xfer(&rd, R0 + 1, dst, NULL);
    double t0 = kvbh_now();
    s1 = ready_sender(&p, R0 + 1, src);
    if (drop) {
        KVB__HOOK_SET(target_drop_writes, 1);
        row->state = "Transferring";
        row->bound = STALLED_BOUND;
        row->bound_expr = "2 x TRANSFER";
    } else {
        CHECK_EQ(kvb_engine_unregister(rd.eng, rd.arena), KVB_OK);
        row->state = "Transferring";
        row->bound = T_XFER;
        row->bound_expr = "TRANSFER (a refusal: at once)";
    }
    send_all(s1, R0 + 1, src);
    row->end = send_end(s1, t0, row->bound + SLACK + 5, &row->took);
    kvb_sender_failure(s1, row->reason, sizeof(row->reason));
    KVB__HOOK_SET(target_drop_writes, 0);
    row_check(row, KVB_POLL_FAILED, drop ? "did not finish within" : "Failed to send kv chunk");
    told(&rd, R0 + 1, 2.0);
    kvbh_sleep(0.2);
    CHECK_EQ(raw_decode_nonzero(&rd, dst, NP), (uint64_t)0); /* nothing landed */
    kvb_sender_destroy(s1);
    healthy_prefill(&p, b.addr, R0 + 1000);
    raw_decode_close(&rd);
    kvbh_rank_stop(&p);
    kvbh_boot_stop(&b);
}

static void cell_pre_unregistered(row_t *r)
{
    r->side = "prefill";
    r->peer = "raw decode that unregisters its memory after its transfer info";
    pre_rejects(r, 0);
}

static void cell_pre_drop_writes(row_t *r)
{
    r->side = "prefill";
    r->peer = "raw decode whose engine drops every write unanswered";
    pre_rejects(r, 1);
}

/* A raw decode that never reads its status socket: nothing the prefill
 * waits for; the room ends Success, every byte there. */
static void cell_pre_status_unread(row_t *row)
{
    const uint64_t room = 990;
    kvbh_boot_t b;
    kvbh_rank_t p;
    raw_decode_t rd;
    kvb_sender_h s;
    int32_t src[NP], dst[NP];
    row->side = "prefill";
    row->peer = "raw decode that never reads its statuses";
    CHECK_EQ(kvbh_boot_start(&b, 0, NULL), 0);
    CHECK_EQ(kvbh_rank_start(&p, &G, KVB_MODE_PREFILL, b.addr, KVBH_MEM_MALLOC, NULL), KVB_OK);
    raw_decode_open(&rd, &p, NULL, 0);
    kvbh_room_pages(&G, room, NP, NULL, dst);
    raw_decode_xfer(&rd, room, dst, NULL);
    double t0 = kvbh_now();
    s = ready_sender(&p, room, src);
    send_all(s, room, src);
    row->state = "Transferring";
    row->bound = T_XFER;
    row->bound_expr = "TRANSFER";
    row->end = send_end(s, t0, row->bound + SLACK + 5, &row->took);
    snprintf(row->reason, sizeof(row->reason), "(Success: every byte landed)");
    row_check(row, KVB_POLL_SUCCESS, NULL);
    CHECK_EQ(raw_decode_wrong(&rd, &p, src, dst, NP), (uint64_t)0);
    kvbh_sleep(0.1);
    int waiting = pull_drain(&rd.st);
    fprintf(stderr, "%d status message(s) waited unread\n", waiting);
    CHECK(waiting >= 1);
    kvb_sender_destroy(s);
    healthy_prefill(&p, b.addr, room + 1000);
    raw_decode_close(&rd);
    kvbh_rank_stop(&p);
    kvbh_boot_stop(&b);
}

/* ---- main ---- */

static const struct {
    const char *name;
    void (*fn)(row_t *);
} CELLS[] = {
    {"dec_silent", cell_dec_silent},
    {"dec_silent_nokey", cell_dec_silent_nokey},
    {"dec_unread", cell_dec_unread},
    {"dec_blackhole", cell_dec_blackhole},
    {"dec_prefill_stop", cell_dec_prefill_stop},
    {"dec_prefill_lost", cell_dec_prefill_lost},
    {"dec_boot_silent", cell_dec_boot_silent},
    {"pre_no_xfer", cell_pre_no_xfer},
    {"pre_decode_stop", cell_pre_decode_stop},
    {"pre_decodes_stop", cell_pre_decodes_stop},
    {"pre_destroy_stalled", cell_pre_destroy_stalled},
    {"pre_raw_session", cell_pre_raw_session},
    {"pre_unregistered", cell_pre_unregistered},
    {"pre_drop_writes", cell_pre_drop_writes},
    {"pre_status_unread", cell_pre_status_unread},
};

#define N_CELLS (sizeof(CELLS) / sizeof(CELLS[0]))

static void set_knobs(void)
{
    char v[32];
    static const struct {
        const char *name;
        double v;
    } K[] = {{"KVBRIDGE_WAITING_TIMEOUT", T_WAIT},    {"KVBRIDGE_BOOTSTRAP_TIMEOUT", T_BOOT},
             {"KVBRIDGE_TRANSFER_TIMEOUT", T_XFER},   {"KVBRIDGE_ABORT_ACK_TIMEOUT", T_ACK},
             {"KVBRIDGE_CONNECT_TIMEOUT", T_CONNECT}, {"KVBRIDGE_STALL_ASIDE", T_ASIDE},
             {"KVBRIDGE_PEER_TIMEOUT", T_PEER}};
    for (size_t i = 0; i < sizeof(K) / sizeof(K[0]); i++) {
        snprintf(v, sizeof(v), "%g", K[i].v);
        setenv(K[i].name, v, 1); /* the children inherit them */
    }
}

int main(int argc, char **argv)
{
    if (kvbh_main_init(argc, argv)) {
        int rc = kvbh_child_main(argc, argv);
        return rc < 0 ? 2 : rc;
    }
    const char *only = argc > 1 ? argv[1] : NULL;
    row_t rows[N_CELLS];
    size_t n = 0;
    set_knobs();
    for (size_t i = 0; i < N_CELLS; i++) {
        if (only != NULL && strcmp(only, CELLS[i].name) != 0)
            continue;
        memset(&rows[n], 0, sizeof(rows[n]));
        rows[n].cell = CELLS[i].name;
        fprintf(stderr, "---- %s\n", CELLS[i].name);
        CELLS[i].fn(&rows[n]);
        if (only != NULL)
            row_header();
        row_print(&rows[n]);
        n++;
    }
    CHECK(n > 0); /* an unknown cell name runs nothing: fail */
    if (only == NULL) {
        printf("\n");
        row_header();
        for (size_t i = 0; i < n; i++)
            row_print(&rows[i]);
    }
    TEST_PASS("every cell reached its terminal state within its bound");
    return 0;
}
