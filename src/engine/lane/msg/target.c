/* Target side of the message lane, on the progress thread: a write
 * message is refused unless authorized (engine secret) and its writer grant
 * live (fence.c, which counts it until its bytes are placed); every destination descriptor must lie
 * inside one local registration, whose segment stays pinned until the bytes are placed (eager copy,
 * or a rendezvous receive straight into the destination IOV); then one acknowledgement carries the
 * status. A message into device memory is received into pinned host memory and copied in by the
 * device-copy worker (jobs.c), not here: a slow device copy must not hold up other writes; its
 * acknowledgement goes once the copy is done. A read request (amwire.h) is
 * admitted the same way (token, grant, every descriptor inside one
 * registration, pinned while its bytes are gathered into a copy) and
 * answered with the copy, or, on a tcp engine, answered straight out of
 * the registration (pinned, the grant counted, until the send ended); at most AM_READS_MAX answers
 * and AM_READ_BYTES_MAX bytes are in flight, each at most AM_READ_MAX bytes, so readers cannot make
 * this side hold more, and of them at most AM_READS_CONN_MAX answers and AM_READ_CONN_BYTES_MAX
 * bytes to one connection (one reply endpoint), so one reader cannot hold them all; past either a
 * request is refused KVB_ERR_BUSY ("try again"). A connection none of whose answers leaves within
 * the peer time-out (a reader that stopped taking them) is closed where UCX allows it (peer failure
 * handling: kvb__am_target_tick): its answers' copies and its share are freed. A request touching
 * device memory is gathered by the driver into pinned host memory (at most
 * KVBRIDGE_CUDA_STAGE_MSG_MAX bytes, as a staged write) on the device-copy
 * worker, as a staged write is placed: counted against the caps from its
 * admission, its segments pinned and its grant counted until gathered,
 * answered then. Every reply endpoint something here answers over later is
 * watched for its end, which UCX does not otherwise tell us of (am_peer_t):
 * nothing is sent over one UCX freed. */
#include "engine/engine_int.h"
#include "engine/bufpool.h"
#include "engine/lane/msg/amwire.h"
#include "engine/lane/msg/msg.h"
#include "engine/lane/msg/read.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define STAGE_MSG_MAX_DEFAULT (256ull << 20)

/* A reply endpoint (a peer's connection, as UCX hands it to us) that
 * something of ours still answers over: an answer being sent, a read
 * request being gathered, a write being received. Everything that answers
 * later holds it, so once it is closed nothing sends over it any more.
 * Its answers count against its share of the read caps; an endpoint with
 * answers being sent none of which left within the peer time-out is
 * closed. Progress thread; freed with its last reference.
 *
 * UCX may free the endpoint by itself: one it created for a peer that
 * connected to us (never returned by ucp_ep_create: "not exposed to a
 * user") is destroyed as soon as UCX sees that peer fail (ucp_ep_set_failed
 * in UCX 1.13: ucp_ep_disconnected(ep, 1)), with no callback to us; one of
 * our own connections' is freed once it is closed. An answer that ends
 * after that (a device copy, on the device-copy worker) must not touch it.
 * So every peer has a failure watch (peer_watch): a stream receive posted
 * on its endpoint, which UCX completes, on our progress thread, before it
 * frees the endpoint; from then on the peer is gone and nothing of ours
 * touches its endpoint. The watch holds a reference: a peer lives as long
 * as its endpoint. */
typedef struct kvb__am_peer {
    struct kvb__am_peer *next;
    kvb_engine_h eng;
    ucp_ep_h ep;
    size_t refs;
    size_t reads;        /* its answers counted against the caps (admitted, not yet left) */
    uint64_t read_bytes; /* and their bytes */
    size_t sending;      /* answers whose send is in progress */
    uint64_t since_ns;   /* sending: when one of them last left, or the first began */
    bool closed;         /* closed by us: nothing more is sent over ep */
    bool unclosable;     /* UCX refused to close it (no peer-failure handling) */
    bool gone;           /* UCX failed or closed ep (its watch ended): never touched again */
    uint8_t sink[64];    /* the watch's receive: stream bytes a peer sends are dropped here */
} am_peer_t;

/* Pieces of stream data queued on an endpoint a watch drops at once before
 * it gives up on the peer. */
#define WATCH_DRAIN_MAX 4096

/* Why a write or read request is refused when its peer cannot be kept. */
#define PEER_GET_FAILED                                                                            \
    "out of memory, or the target cannot watch this connection for its end (its log says which)"

typedef struct read_ans { /* a read's answer (see "read requests" below) */
    kvb__op_t op;         /* first: the send is the op */
    kvb_engine_h eng;
    am_peer_t *pe; /* the reader's connection (a reference) */
    uint8_t *buf;  /* the bytes, gathered (kvb__bufpool, or pinned: device); NULL: straight */
    size_t len, cap;
    bool pinned; /* buf from kvb__cuda_stage_get (gathered by the driver) */
    /* Straight (buf NULL): sent out of the registrations, the pieces iov,
     * their segments (starts in segs) pinned and the grant (tag, epoch)
     * counted until the send ended (ans_free) */
    ucp_dt_iov_t *iov;
    uint32_t np;
    uint64_t *segs;
    size_t nsegs;
    uint32_t tag;
    uint64_t epoch;
    uint8_t hdr[AM_ACK_FIXED];
    bool starting, ended; /* as the reader's receive (read.c): a send that
                             ends from within ucp_am_send_nbx */
} read_ans_t;

static void ans_answer(read_ans_t *a, uint64_t xid, uint64_t mid, kvb_status_t st, const char *why);
static void ans_free(read_ans_t *a);
static void ans_drop(read_ans_t *a);

/* A write's message being placed, or a read request touching device memory
 * being gathered (ans set): the staged copy runs on the device-copy worker
 * with the segments pinned and the grant counted. */
typedef struct am_recv {
    kvb__job_t job; /* first: the staged copy to or from the device (jobs.c) */
    kvb_engine_h eng;
    am_peer_t *pe; /* the writer's (or reader's) connection: a reference */
    uint64_t xfer_id, msg_id;
    uint64_t epoch;   /* the writer grant admitted (counted until placed) */
    uint64_t *pinned; /* segment start addresses pinned, one per descriptor */
    size_t npinned;
    ucp_dt_iov_t *iov;
    uint32_t np;
    int device;  /* a destination is device memory (this one's ordinal), else -1 */
    void *stage; /* then: the payload is received here (pinned) and copied in */
    size_t stage_len;
    kvb_status_t copied; /* the worker's copy: status and reason */
    char why[300];
    read_ans_t *ans; /* a read: its answer, gathered into ans->buf (pinned) */
} am_recv_t;

static void ack_sent_cb(void *req, ucs_status_t status, void *user)
{
    free(user);
    ucp_request_free(req);
}

/* An ack header into h (room for AM_ACK_FIXED + rl bytes). */
static void put_ack(uint8_t *h, uint64_t xfer_id, uint64_t msg_id, kvb_status_t st,
                    const char *reason, size_t rl)
{
    uint32_t magic = AM_MAGIC_ACK, rl32 = (uint32_t)rl;
    int32_t s32 = st;
    memcpy(h, &magic, 4);
    memcpy(h + 4, &s32, 4);
    kvb__am_put_u64(h + 8, xfer_id);
    kvb__am_put_u64(h + 16, msg_id);
    memcpy(h + 24, &rl32, 4);
    if (rl > 0)
        memcpy(h + AM_ACK_FIXED, reason, rl);
}

static void send_ack(kvb_engine_h eng, ucp_ep_h ep, uint64_t xfer_id, uint64_t msg_id,
                     kvb_status_t st, const char *reason)
{
    size_t rl = reason != NULL ? strlen(reason) : 0;
    if (rl > 400)
        rl = 400;
    uint8_t *h = malloc(28 + rl);
    if (h == NULL)
        return;
    put_ack(h, xfer_id, msg_id, st, reason, rl);
    ucp_request_param_t p = {0};
    p.op_attr_mask =
        UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
    p.cb.send = ack_sent_cb;
    p.user_data = h;
    /* REPLY: the writer learns which of its endpoints the ack came over and
     * accepts it only from the transfer's own connection (msg.c). */
    p.flags = UCP_AM_SEND_FLAG_REPLY;
    void *r = ucp_am_send_nbx(ep, KVB_AM_ACK, h, 28 + rl, NULL, 0, &p);
    if (!UCS_PTR_IS_PTR(r))
        free(h);
}

static void peer_put(kvb_engine_h eng, am_peer_t *pe)
{
    if (--pe->refs > 0)
        return;
    am_peer_t **pp = &eng->am_peers;
    while (*pp != pe)
        pp = &(*pp)->next;
    *pp = pe->next;
    free(pe);
}

/* Can something of ours still be sent over pe's endpoint? */
static bool peer_live(const am_peer_t *pe)
{
    return !pe->closed && !pe->gone;
}

static bool peer_watch(am_peer_t *pe);

/* pe's watch ended: UCX is failing, closing or destroying its endpoint
 * (an error status), which it frees after this; or the peer sent stream
 * bytes (UCS_OK: dropped, the watch posted again). */
static void watch_cb(void *req, ucs_status_t status, size_t length, void *user)
{
    am_peer_t *pe = user;
    kvb_engine_h eng = pe->eng;
    (void)length;
    ucp_request_free(req);
    if (status == UCS_OK && peer_live(pe) && peer_watch(pe)) {
        peer_put(eng, pe); /* the new watch took its own */
        return;
    }
    if (peer_live(pe) && pe->refs > 1) /* more than the watch's */
        KVB_LOGW("engine %s: a peer's connection ended (%s) while answers to it were pending: "
                 "they are not sent",
                 eng->sid, status == UCS_OK ? "it sent stream data" : ucs_status_string(status));
    pe->gone = true;
    peer_put(eng, pe);
}

/* Drop the stream bytes queued on pe's endpoint (a peer sent them with no
 * receive posted), a whole received piece at a time. false: more than
 * WATCH_DRAIN_MAX pieces (not all dropped). */
static bool peer_drain(am_peer_t *pe)
{
    for (unsigned n = 0; n < WATCH_DRAIN_MAX; n++) {
        size_t len = 0;
        void *d = ucp_stream_recv_data_nb(pe->ep, &len);
        if (d == NULL || UCS_PTR_IS_ERR(d))
            return true;
        ucp_stream_data_release(pe->ep, d);
    }
    return false;
}

/* Post pe's failure watch (the type's comment): a stream receive on its
 * endpoint; none of our peers sends stream data, so it ends only when UCX
 * ends the endpoint (ucp_stream_ep_cleanup, called by ucp_ep_set_failed
 * and ucp_ep_disconnected before the endpoint is freed, on the thread that
 * progresses the worker: ours). Bytes already queued are dropped first.
 * false: not watched (pe then must not be kept). */
static bool peer_watch(am_peer_t *pe)
{
    size_t len = 0;
    ucp_request_param_t p = {0};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    p.cb.recv_stream = watch_cb;
    p.user_data = pe;
    void *r = UCS_STATUS_PTR(UCS_OK);
    /* UCS_OK: it took bytes queued after all (none should be): again */
    for (unsigned n = 0; n < 4 && r == NULL; n++) /* NULL: UCS_OK */
        r = peer_drain(pe) ? ucp_stream_recv_nbx(pe->ep, pe->sink, sizeof(pe->sink), &len, &p)
                           : UCS_STATUS_PTR(UCS_ERR_EXCEEDS_LIMIT);
    if (UCS_PTR_IS_PTR(r)) {
        pe->refs++; /* the watch's, until watch_cb */
        return true;
    }
    if (r == NULL)
        r = UCS_STATUS_PTR(UCS_ERR_EXCEEDS_LIMIT);
    KVB_LOGW("engine %s: a peer's connection cannot be watched for its end (%s): nothing is "
             "answered over it",
             pe->eng->sid,
             UCS_PTR_STATUS(r) == UCS_ERR_EXCEEDS_LIMIT ? "it keeps sending stream data"
                                                        : ucs_status_string(UCS_PTR_STATUS(r)));
    return false;
}

/* The peer of reply endpoint ep (valid now: inside the callback UCX handed
 * it to), a reference taken; NULL: out of memory, or it cannot be watched.
 * An endpoint we closed or UCX ended is never matched (its address may be
 * reused). */
static am_peer_t *peer_get(kvb_engine_h eng, ucp_ep_h ep)
{
    am_peer_t *pe = eng->am_peers;
    while (pe != NULL && (pe->ep != ep || !peer_live(pe)))
        pe = pe->next;
    if (pe == NULL) {
        pe = calloc(1, sizeof(*pe));
        if (pe == NULL)
            return NULL;
        pe->eng = eng;
        pe->ep = ep;
        if (!peer_watch(pe)) {
            free(pe);
            return NULL;
        }
        pe->next = eng->am_peers;
        eng->am_peers = pe;
    }
    pe->refs++;
    return pe;
}

/* An ack over pe's endpoint, unless we closed it or UCX ended it. */
static void peer_ack(kvb_engine_h eng, am_peer_t *pe, uint64_t xfer_id, uint64_t msg_id,
                     kvb_status_t st, const char *reason)
{
    if (peer_live(pe))
        send_ack(eng, pe->ep, xfer_id, msg_id, st, reason);
}

static void unpin(kvb_engine_h eng, const uint64_t *pinned, size_t n)
{
    pthread_mutex_lock(&eng->seg_mu);
    for (size_t i = 0; i < n; i++) {
        long s = kvb__segtab_find_start(&eng->segs, pinned[i]);
        if (s >= 0 && eng->segs.v[s].pins > 0)
            eng->segs.v[s].pins--;
    }
    pthread_cond_broadcast(&eng->seg_cv);
    pthread_mutex_unlock(&eng->seg_mu);
}

/* Validate every descriptor's span against the local registrations and pin
 * the segments; fills iov with the pieces (as many as the parser counted).
 * what: the ranges' role in the error text ("destination" of a write,
 * "source" of a read). */
static kvb_status_t am_validate(kvb_engine_h eng, const uint8_t *h, uint32_t nd, uint64_t *pinned,
                                ucp_dt_iov_t *iov, int *device_p, const char *what, char *why,
                                size_t wl)
{
    kvb_status_t st = KVB_OK;
    uint32_t i;
    size_t n = 0;
    pthread_mutex_lock(&eng->seg_mu);
    for (i = 0; i < nd; i++) {
        kvb__am_desc_t d;
        uint64_t span = 0;
        kvb__am_write_desc(h, i, &d);
        long s = kvb__am_desc_span(&d, &span) ? kvb__segtab_find(&eng->segs, d.dst, span) : -1;
        if (s < 0) {
            snprintf(why, wl, "%s [0x%llx, +%llu) (%u piece(s)) is not inside a registered region",
                     what, (unsigned long long)d.dst, (unsigned long long)span, d.count);
            st = KVB_ERR_BOUNDS;
            break;
        }
        eng->segs.v[s].pins++;
        pinned[i] = eng->segs.v[s].addr;
        if (eng->segs.v[s].cuda != NULL)
            *device_p = eng->segs.v[s].cuda->device;
        for (uint32_t c = 0; c < d.count; c++, n++) {
            iov[n].buffer = (void *)(uintptr_t)(d.dst + (uint64_t)c * d.stride);
            iov[n].length = d.len;
        }
    }
    pthread_mutex_unlock(&eng->seg_mu);
    if (st != KVB_OK)
        unpin(eng, pinned, i);
    return st;
}

/* The staged copy (one batch, waited for, before the segments are unpinned
 * and the peer answered): a write's payload into its device destinations,
 * or a read's sources gathered into its answer's pinned buffer. */
static kvb_status_t stage_copy(am_recv_t *rc, char *why, size_t wl)
{
    return rc->ans != NULL
               ? kvb__am_cuda_copy(rc->device, rc->iov, rc->np, rc->ans->buf, false, why, wl)
               : kvb__am_cuda_copy(rc->device, rc->iov, rc->np, rc->stage, true, why, wl);
}

/* The bytes are placed or gathered (st: KVB_OK) or not: release the
 * segments and the fence count, answer the peer. */
static void am_recv_finish(am_recv_t *rc, kvb_status_t st, const char *why)
{
    if (st != KVB_OK)
        KVB_LOGW("engine %s: %s: %s", rc->eng->sid,
                 rc->ans != NULL ? "read not gathered" : "write not placed", why);
    KVB_TSAN_RELEASE(); /* the bytes are placed; the acknowledgement follows */
    unpin(rc->eng, rc->pinned, rc->npinned);
    kvb__fence_done(rc->eng, (uint32_t)(rc->msg_id >> 32), rc->epoch);
    if (rc->ans != NULL)
        ans_answer(rc->ans, rc->xfer_id, rc->msg_id, st, why);
    else
        peer_ack(rc->eng, rc->pe, rc->xfer_id, rc->msg_id, st, st == KVB_OK ? NULL : why);
    peer_put(rc->eng, rc->pe);
    if (rc->stage != NULL)
        kvb__cuda_stage_put(rc->stage, rc->stage_len);
    free(rc->pinned);
    free(rc->iov);
    free(rc);
}

static int copy_run(kvb__job_t *j) /* device-copy worker */
{
    am_recv_t *rc = (am_recv_t *)j;
    rc->copied = stage_copy(rc, rc->why, sizeof(rc->why));
    return KVB__JOB_DONE;
}

static void copy_done(kvb_engine_h eng, kvb__job_t *j) /* progress thread */
{
    am_recv_t *rc = (am_recv_t *)j;
    eng->am_pending--;
    am_recv_finish(rc, rc->copied, rc->why);
}

/* The engine stops: nobody to answer (the peer's transfer fails with its
 * connection); the segments and the fence count are released. */
static void copy_drop(kvb_engine_h eng, kvb__job_t *j)
{
    am_recv_t *rc = (am_recv_t *)j;
    unpin(eng, rc->pinned, rc->npinned);
    kvb__fence_done(eng, (uint32_t)(rc->msg_id >> 32), rc->epoch);
    kvb__cuda_stage_put(rc->stage, rc->stage_len);
    if (rc->ans != NULL) /* memory only: the engine's counters go with it */
        ans_drop(rc->ans);
    peer_put(eng, rc->pe);
    free(rc->pinned);
    free(rc->iov);
    free(rc);
}

static void am_recv_done(am_recv_t *rc, ucs_status_t status)
{
    char why[300] = "";
    kvb_status_t st = status == UCS_OK ? KVB_OK : KVB_ERR_IO;
    if (status != UCS_OK) {
        snprintf(why, sizeof(why), "%s", ucs_status_string(status));
    } else if (rc->stage != NULL || rc->ans != NULL) {
        rc->job = (kvb__job_t){NULL, copy_run, copy_done, copy_drop, true};
        if (kvb__jobs_push(rc->eng, &rc->job)) {
            rc->eng->am_pending++; /* until copy_done */
            return;
        }
        st = stage_copy(rc, why, sizeof(why)); /* the queue is full: here */
    }
    am_recv_finish(rc, st, why);
}

static void am_recv_cb(void *req, ucs_status_t status, size_t length, void *user)
{
    am_recv_t *rc = user;
    rc->eng->am_pending--;
    am_recv_done(rc, status);
    ucp_request_free(req);
}

/* The most bytes one message into device memory may carry (staged). */
static uint64_t stage_msg_max(void)
{
    return (uint64_t)kvb__env_int("KVBRIDGE_CUDA_STAGE_MSG_MAX", NULL,
                                  (int64_t)STAGE_MSG_MAX_DEFAULT, 1 << 20, INT64_MAX);
}

/* Bytes on their way into device memory (a write's message) or out of it
 * (a read's answer) pass through pinned host memory: at most
 * KVBRIDGE_CUDA_STAGE_MSG_MAX bytes (the peer chooses the size). what:
 * "a write into", "a read of". NULL (why) when refused. */
static void *stage_alloc(size_t length, const char *what, char *why, size_t wl)
{
    if (length > stage_msg_max()) {
        snprintf(why, wl, "%s device memory of %zu bytes exceeds KVBRIDGE_CUDA_STAGE_MSG_MAX", what,
                 length);
        return NULL;
    }
    void *p = kvb__cuda_stage_get(length ? length : 1);
    if (p == NULL)
        snprintf(why, wl, "no %zu bytes of pinned memory to stage %s device memory", length, what);
    return p;
}

/* ---- read requests ----
 * An answer is sent from a copy: the pieces are gathered into a buffer of
 * the engine when the request is admitted, and the ranges' pins and the
 * grant's count are released right after. A reader that never takes the
 * answer (a dead same-host process: UCX's shared-memory transports have no
 * peer-failure mode, the send never ends) then holds only that buffer, not
 * the target's memory (unregister) nor its grant (a revoke drains).
 *
 * Straight (eng->answer_direct: a tcp engine): the answer is sent out of
 * the registration (an IOV send of the pieces), which saves the gather
 * copy (as much CPU as the socket send itself). UCX reads the ranges until
 * the send ends, so they stay pinned and the grant counted until then
 * (ans_free): a revoke that returned means no byte written after it is
 * sent. What bounds that wait: every reply endpoint of a tcp engine is
 * TCP; a reader that stops taking its answers has its endpoint closed
 * within the peer time-out (kvb__am_target_tick), which ends its sends.
 * An endpoint UCX refuses to close (its peer asked for no peer-failure
 * handling) gets copies from then on (pe->unclosable). */

static void ans_free(read_ans_t *a)
{
    if (a->iov != NULL) { /* straight: UCX reads the ranges no more */
        unpin(a->eng, a->segs, a->nsegs);
        kvb__fence_done(a->eng, a->tag, a->epoch);
        free(a->segs);
        free(a->iov);
    } else if (a->pinned) {
        kvb__cuda_stage_put(a->buf, a->cap);
    } else {
        kvb__bufpool_put(a->buf, a->cap);
    }
    free(a);
}

/* Memory only (the engine stops): a and its reference on its peer. The
 * peers are freed this way, with their last reference, never all at once:
 * UCX may still complete sends while its worker is destroyed, after the
 * lanes' fini. */
static void ans_drop(read_ans_t *a)
{
    kvb_engine_h eng = a->eng;
    am_peer_t *pe = a->pe;
    ans_free(a);
    peer_put(eng, pe);
}

static void ans_release(kvb__op_t *op) /* the engine is freed */
{
    ans_drop((read_ans_t *)op);
}

/* a's count against the caps (the engine's, its peer's share) ends. */
static void ans_uncount(read_ans_t *a)
{
    __atomic_sub_fetch(&a->eng->am_reads, 1, __ATOMIC_RELAXED);
    __atomic_sub_fetch(&a->eng->am_read_bytes, a->len, __ATOMIC_RELAXED);
    a->pe->reads--;
    a->pe->read_bytes -= a->len;
}

/* The answer left (or failed: the reader's read fails with its connection
 * or its time-out; or we closed the connection, kvb__am_target_tick). */
static void ans_done(read_ans_t *a)
{
    kvb_engine_h eng = a->eng;
    am_peer_t *pe = a->pe;
    ans_uncount(a);
    eng->am_pending--;
    pe->sending--;
    pe->since_ns = kvb__now_ns(); /* the next one's bound starts now */
    ans_free(a);
    peer_put(eng, pe);
}

static void ans_sent_cb(void *req, ucs_status_t status, void *user)
{
    read_ans_t *a = user;
    kvb__op_untrack(a->eng, &a->op);
    if (a->starting)
        a->ended = true;
    else
        ans_done(a);
    ucp_request_free(req);
}

/* Send a's header and bytes over its peer's endpoint. */
static void ans_send(read_ans_t *a)
{
    ucp_request_param_t p = {0};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                     UCP_OP_ATTR_FIELD_DATATYPE | UCP_OP_ATTR_FIELD_FLAGS;
    p.cb.send = ans_sent_cb;
    p.user_data = a;
    p.flags = UCP_AM_SEND_FLAG_REPLY; /* the reader checks the endpoint (msg.c) */
    bool iov = a->iov != NULL && a->np > 1;
    p.datatype = iov ? UCP_DATATYPE_IOV : ucp_dt_make_contig(1);
    void *data = iov ? (void *)a->iov : a->iov != NULL ? a->iov[0].buffer : a->buf;
    size_t count = iov ? a->np : a->len;
    a->op.release = ans_release;
    a->eng->am_pending++; /* the progress thread keeps driving it (engine.c) */
    if (a->pe->sending++ == 0)
        a->pe->since_ns = kvb__now_ns();
    if (!peer_live(a->pe)) { /* nobody to send it to */
        ans_done(a);
        return;
    }
    a->starting = true;
    void *r = ucp_am_send_nbx(a->pe->ep, KVB_AM_ACK, a->hdr, AM_ACK_FIXED, data, count, &p);
    a->starting = false;
    if (UCS_PTR_IS_PTR(r) && !a->ended)
        kvb__op_track(a->eng, &a->op);
    else
        ans_done(a);
}

/* Answer a read request: its bytes (st KVB_OK), or a refusal with why (a
 * freed, no longer counted against the caps). */
static void ans_answer(read_ans_t *a, uint64_t xid, uint64_t mid, kvb_status_t st, const char *why)
{
    kvb_engine_h eng = a->eng;
    am_peer_t *pe = a->pe;
    if (st == KVB_OK) {
        put_ack(a->hdr, xid, mid, KVB_OK, NULL, 0);
        ans_send(a);
        return;
    }
    ans_uncount(a);
    ans_free(a);
    peer_ack(eng, pe, xid, mid, st, why);
    peer_put(eng, pe);
}

/* Host sources: the validated pieces iov[0..np) (a->len bytes) copied into
 * a buffer for the answer now. */
static kvb_status_t ans_copy(read_ans_t *a, const ucp_dt_iov_t *iov, uint32_t np, char *why,
                             size_t wl)
{
    a->buf = kvb__bufpool_get(a->len, &a->cap);
    if (a->buf == NULL) {
        snprintf(why, wl, "out of memory");
        return KVB_ERR_NOMEM;
    }
    uint8_t *p = a->buf;
    for (uint32_t i = 0; i < np; p += iov[i].length, i++)
        memcpy(p, iov[i].buffer, iov[i].length);
    return KVB_OK;
}

/* A source in device memory: the pieces are gathered by the device-copy
 * worker into pinned memory (a's buffer), not here: a slow device copy must
 * not hold up other transfers. *rc_p: that job, which keeps pinned and iov
 * (the segments pinned, the grant counted) until am_recv_finish answers. */
static kvb_status_t gather_job(kvb_engine_h eng, const uint8_t *h, uint32_t nd, uint32_t np,
                               uint64_t *pinned, ucp_dt_iov_t *iov, int device, read_ans_t *a,
                               am_recv_t **rc_p, char *why, size_t wl)
{
    am_recv_t *rc = calloc(1, sizeof(*rc));
    a->pinned = true;
    a->cap = a->len;
    a->buf = rc != NULL ? stage_alloc(a->len, "a read of", why, wl) : NULL;
    if (a->buf == NULL) {
        if (rc == NULL)
            snprintf(why, wl, "out of memory");
        free(rc);
        unpin(eng, pinned, nd);
        free(pinned);
        free(iov);
        return KVB_ERR_NOMEM;
    }
    a->pe->refs++; /* the job's, until am_recv_finish */
    *rc = (am_recv_t){.eng = eng,
                      .pe = a->pe,
                      .xfer_id = kvb__am_u64(h + 8),
                      .msg_id = kvb__am_u64(h + 16),
                      .epoch = kvb__am_u64(h + 32),
                      .pinned = pinned,
                      .npinned = nd,
                      .iov = iov,
                      .np = np,
                      .device = device,
                      .ans = a};
    *rc_p = rc;
    return KVB_OK;
}

/* The request's ranges checked (every one inside one registration, pinned
 * meanwhile) and gathered into a->buf (a->len bytes): now from host
 * memory, by a job (*rc_p) when one is device memory. */
static kvb_status_t ans_gather(kvb_engine_h eng, const uint8_t *h, uint32_t nd, uint32_t np,
                               read_ans_t *a, am_recv_t **rc_p, char *why, size_t wl)
{
    uint64_t *pinned = malloc(nd * sizeof(*pinned));
    ucp_dt_iov_t *iov = malloc(np * sizeof(*iov));
    int device = -1;
    kvb_status_t st = KVB_ERR_NOMEM;
    snprintf(why, wl, "out of memory");
    if (pinned != NULL && iov != NULL)
        st = am_validate(eng, h, nd, pinned, iov, &device, "source", why, wl);
    if (st != KVB_OK) { /* nothing left pinned */
        free(pinned);
        free(iov);
        return st;
    }
    if (device >= 0)
        return gather_job(eng, h, nd, np, pinned, iov, device, a, rc_p, why, wl);
    if (eng->answer_direct && !a->pe->unclosable) { /* kept pinned until sent (ans_free) */
        a->iov = iov;
        a->np = np;
        a->segs = pinned;
        a->nsegs = nd;
        return KVB_OK;
    }
    st = ans_copy(a, iov, np, why, wl);
    unpin(eng, pinned, nd);
    free(pinned);
    free(iov);
    return st;
}

/* Room for one more answer of total bytes to pe, within the engine's caps
 * and pe's share of them? Else KVB_ERR_BUSY with why. */
static kvb_status_t read_room(kvb_engine_h eng, const am_peer_t *pe, uint64_t total, char *why,
                              size_t wl)
{
    if (eng->am_reads >= AM_READS_MAX || eng->am_read_bytes + total > AM_READ_BYTES_MAX)
        snprintf(why, wl,
                 "target busy: %zu reads (%zu bytes) in flight at the target (at most %u, %llu "
                 "MiB): try again",
                 eng->am_reads, eng->am_read_bytes, AM_READS_MAX, AM_READ_BYTES_MAX >> 20);
    else if (pe->reads >= AM_READS_CONN_MAX || pe->read_bytes + total > AM_READ_CONN_BYTES_MAX)
        snprintf(why, wl,
                 "target busy: %zu reads (%llu bytes) of this connection in flight at the target "
                 "(its share: %u, %llu MiB): try again",
                 pe->reads, (unsigned long long)pe->read_bytes, AM_READS_CONN_MAX,
                 AM_READ_CONN_BYTES_MAX >> 20);
    else
        return KVB_OK;
    __atomic_add_fetch(&eng->am_reads_busy, 1, __ATOMIC_RELAXED);
    return KVB_ERR_BUSY;
}

/* Admit a read request from pe (parsed: nd descriptors, np pieces, total
 * bytes): refused (with why) past the caps on answers in flight or pe's
 * share of them, unless its grant is live (counted while its bytes are
 * gathered), or with a range outside one registration; else *a_p holds its
 * bytes (and pe's reference), or will once the job *rc_p gathered them, and
 * counts against the caps until answered. */
static kvb_status_t am_read_admit(kvb_engine_h eng, am_peer_t *pe, const uint8_t *h, uint32_t nd,
                                  uint32_t np, uint64_t total, read_ans_t **a_p, am_recv_t **rc_p,
                                  char *why, size_t wl)
{
    uint64_t mid = kvb__am_u64(h + 16), epoch = kvb__am_u64(h + 32);
    if (!eng->params.serve_reads) {
        snprintf(why, wl, "this engine serves no reads (KVBRIDGE_SERVE_READS=0)");
        return KVB_ERR_UNSUPPORTED;
    }
    kvb_status_t busy = read_room(eng, pe, total, why, wl);
    if (busy != KVB_OK)
        return busy;
    const char *fenced = kvb__fence_admit_read(eng, (uint32_t)(mid >> 32), epoch);
    if (fenced != NULL) {
        snprintf(why, wl, "%s", fenced);
        return KVB_ERR_FENCED;
    }
    read_ans_t *a = calloc(1, sizeof(*a));
    kvb_status_t st = KVB_ERR_NOMEM;
    snprintf(why, wl, "out of memory");
    if (a != NULL) {
        a->len = total;
        a->eng = eng;
        a->pe = pe;
        a->tag = (uint32_t)(mid >> 32);
        a->epoch = epoch;
        st = ans_gather(eng, h, nd, np, a, rc_p, why, wl);
    }
    /* nothing more is read (a job: once gathered; straight: once sent) */
    if (*rc_p == NULL && (a == NULL || a->iov == NULL))
        kvb__fence_done(eng, (uint32_t)(mid >> 32), epoch);
    if (st != KVB_OK) {
        if (a != NULL)
            ans_free(a);
        return st;
    }
    /* until the answer left, or the job's refusal (ans_answer) */
    __atomic_add_fetch(&eng->am_reads, 1, __ATOMIC_RELAXED);
    __atomic_add_fetch(&eng->am_read_bytes, total, __ATOMIC_RELAXED);
    pe->reads++;
    pe->read_bytes += total;
    *a_p = a;
    return KVB_OK;
}

/* A read request from ep (authorized; magic "KVBR"): the bytes, or a
 * refusal with its reason (a job's: once it gathered them). */
static void am_read(kvb_engine_h eng, const uint8_t *h, size_t hlen, size_t length, ucp_ep_h ep,
                    uint64_t xid, uint64_t mid)
{
    char why[200] = "malformed read request";
    uint32_t nd = 0, np = 0;
    uint64_t total = 0;
    read_ans_t *a = NULL;
    am_recv_t *rc = NULL;
    kvb_status_t st = KVB_ERR_BOUNDS;
    am_peer_t *pe = peer_get(eng, ep);
    if (pe == NULL) {
        st = KVB_ERR_NOMEM;
        snprintf(why, sizeof(why), "%s", PEER_GET_FAILED);
    } else if (kvb__am_parse_read_header(h, hlen, length, &nd, &np, &total)) {
        st = am_read_admit(eng, pe, h, nd, np, total, &a, &rc, why, sizeof(why));
    }
    if (st != KVB_OK) {
        uint64_t nb = __atomic_load_n(&eng->am_reads_busy, __ATOMIC_RELAXED);
        if (st != KVB_ERR_BUSY || (nb & (nb - 1)) == 0) /* busy: 1st, 2nd, 4th, ... */
            KVB_LOGW("engine %s: refused a read from writer %08x: %s", eng->sid,
                     (unsigned)(mid >> 32), why);
        send_ack(eng, ep, xid, mid, st, why);
        if (pe != NULL)
            peer_put(eng, pe);
    } else if (rc != NULL) {
        am_recv_done(rc, UCS_OK); /* to the worker (or here, its queue full) */
    } else {
        ans_answer(a, xid, mid, KVB_OK, NULL);
    }
}

/* authorized: false when the engine has a secret and the message did not
 * carry its token; refused before any descriptor is looked at. */
static ucs_status_t am_write(kvb_engine_h eng, const uint8_t *h, size_t hlen, void *data,
                             size_t length, const ucp_am_recv_param_t *param, bool authorized)
{
    char why[200] = "malformed write message";
    uint32_t nd = 0, np = 0;
    if (!(param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) || KVB__HOOK(target_drop_writes))
        return UCS_OK; /* cannot answer: drop */
    uint64_t xid = hlen >= 24 ? kvb__am_u64(h + 8) : 0, mid = hlen >= 24 ? kvb__am_u64(h + 16) : 0;
    if (!authorized) {
        KVB_LOGW("engine %s: refused a write without the engine-secret token", eng->sid);
        send_ack(eng, param->reply_ep, xid, mid, KVB_ERR_AUTH,
                 "write not authenticated (engine secret token missing or wrong)");
        return UCS_OK;
    }
    /* A write came (from a connection the control-connection cap cannot
     * tell without a token): connections older than it may have sent it. */
    __atomic_fetch_add(&eng->am_admitted, 1, __ATOMIC_SEQ_CST);
    uint32_t magic = 0;
    if (hlen >= 4)
        memcpy(&magic, h, 4);
    if (magic == AM_MAGIC_READ) {
        am_read(eng, h, hlen, length, param->reply_ep, xid, mid);
        return UCS_OK;
    }
    if (!kvb__am_parse_write_header(h, hlen, length, &nd, &np)) {
        KVB_LOGW("engine %s: refused a write: %s", eng->sid, why);
        send_ack(eng, param->reply_ep, xid, mid, KVB_ERR_BOUNDS, why);
        return UCS_OK;
    }
    /* Admitted writes are counted until placed: a revoke waits for them. */
    uint64_t epoch = kvb__am_u64(h + 32);
    const char *fenced = kvb__fence_admit(eng, (uint32_t)(mid >> 32), epoch);
    if (fenced != NULL) {
        KVB_LOGI("engine %s: refused a write from writer %08x epoch %llu: fenced", eng->sid,
                 (unsigned)(mid >> 32), (unsigned long long)epoch);
        send_ack(eng, param->reply_ep, xid, mid, KVB_ERR_FENCED, fenced);
        return UCS_OK;
    }
    am_recv_t *rc = calloc(1, sizeof(*rc));
    kvb_status_t st = KVB_ERR_BOUNDS;
    int device = -1;
    bool ok = rc != NULL && (rc->pe = peer_get(eng, param->reply_ep)) != NULL &&
              (rc->pinned = malloc(nd * sizeof(uint64_t))) != NULL &&
              (rc->iov = malloc(np * sizeof(ucp_dt_iov_t))) != NULL;
    if (!ok) {
        st = KVB_ERR_NOMEM;
        snprintf(why, sizeof(why), "%s",
                 rc != NULL && rc->pe == NULL ? PEER_GET_FAILED : "out of memory");
    }
    ok = ok && am_validate(eng, h, nd, rc->pinned, rc->iov, &device, "destination", why,
                           sizeof(why)) == KVB_OK;
    if (rc != NULL)
        rc->device = device;
    if (ok && rc->device >= 0 &&
        (rc->stage = stage_alloc(length, "a write into", why, sizeof(why))) == NULL) {
        unpin(eng, rc->pinned, nd);
        st = KVB_ERR_NOMEM;
        ok = false;
    }
    if (!ok) {
        KVB_LOGW("engine %s: refused a write: %s", eng->sid, why);
        kvb__fence_done(eng, (uint32_t)(mid >> 32), epoch);
        send_ack(eng, param->reply_ep, xid, mid, st, why);
        if (rc != NULL) {
            if (rc->pe != NULL)
                peer_put(eng, rc->pe);
            free(rc->pinned);
            free(rc->iov);
            free(rc);
        }
        return UCS_OK;
    }
    rc->eng = eng;
    rc->xfer_id = xid;
    rc->msg_id = mid;
    rc->epoch = epoch;
    rc->npinned = nd;
    rc->np = np;
    rc->stage_len = length ? length : 1;
    if (!(param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV)) {
        if (rc->stage != NULL)
            memcpy(rc->stage, data, length); /* pinned: the driver copies it in */
        else
            kvb__am_scatter(rc->iov, np, data);
        am_recv_done(rc, UCS_OK);
        return UCS_OK;
    }
    ucp_request_param_t p = {0};
    p.op_attr_mask =
        UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_DATATYPE;
    p.cb.recv_am = am_recv_cb;
    p.user_data = rc;
    bool contig = np == 1 || rc->stage != NULL;
    p.datatype = contig ? ucp_dt_make_contig(1) : UCP_DATATYPE_IOV;
    void *r = ucp_am_recv_data_nbx(eng->worker, data,
                                   rc->stage != NULL ? rc->stage
                                   : np == 1         ? rc->iov[0].buffer
                                                     : (void *)rc->iov,
                                   rc->stage != NULL ? length
                                   : np == 1         ? rc->iov[0].length
                                                     : np,
                                   &p);
    if (UCS_PTR_IS_ERR(r))
        am_recv_done(rc, UCS_PTR_STATUS(r));
    else if (r == NULL)
        am_recv_done(rc, UCS_OK);
    else
        eng->am_pending++;
    return UCS_OK;
}

static ucs_status_t am_write_cb(void *arg, const void *header, size_t hlen, void *data,
                                size_t length, const ucp_am_recv_param_t *param)
{
    kvb_engine_h eng = arg;
    return am_write(eng, header, hlen, data, length, param, eng->secret == NULL);
}

/* Token first, then the write header. One 16-byte compare per live
 * connection per message (each up to am_chunk_bytes). Without a secret here
 * the token is ignored. */
static ucs_status_t am_write_auth_cb(void *arg, const void *header, size_t hlen, void *data,
                                     size_t length, const ucp_am_recv_param_t *param)
{
    kvb_engine_h eng = arg;
    const uint8_t *h = header;
    if (hlen < KVB_HS_TOKEN_LEN)
        return am_write(eng, h, hlen, data, length, param, false);
    bool ok = eng->secret == NULL || kvb__am_token_live(eng, h);
    return am_write(eng, h + KVB_HS_TOKEN_LEN, hlen - KVB_HS_TOKEN_LEN, data, length, param, ok);
}

/* Are read answers sent straight out of the registrations ("read
 * requests" above)? Only where every reply endpoint is TCP (the engine's
 * transport: its UCX has no shared-memory transport, whose sends to a dead
 * reader never end) and a stuck one can be closed (am_close_safe);
 * KVBRIDGE_READ_ANSWER_DIRECT=0 keeps the copy. */
static void answer_direct_init(kvb_engine_h eng)
{
    eng->answer_direct = kvb__env_int("KVBRIDGE_READ_ANSWER_DIRECT", NULL, 1, 0, 1) == 1 &&
                         eng->params.transport == KVB_TRANSPORT_TCP && eng->am_close_safe;
    KVB_LOGD("message-lane read answers go %s",
             eng->answer_direct ? "straight out of the registrations" : "from a copy");
}

/* The write handlers (plain, and token-first when the engine has a secret). */
kvb_status_t kvb__am_target_register(kvb_engine_h eng)
{
    answer_direct_init(eng);
    ucp_am_handler_param_t p = {0};
    p.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                   UCP_AM_HANDLER_PARAM_FIELD_ARG;
    p.arg = eng;
    p.id = KVB_AM_WRITE;
    p.cb = am_write_cb;
    if (ucp_worker_set_am_recv_handler(eng->worker, &p) != UCS_OK)
        return KVB_ERR_IO;
    p.id = KVB_AM_WRITE_AUTH;
    p.cb = am_write_auth_cb;
    return ucp_worker_set_am_recv_handler(eng->worker, &p) == UCS_OK ? KVB_OK : KVB_ERR_IO;
}

/* Close pe's endpoint: its answers still being sent end (UCX completes
 * them canceled: ans_done frees their copies and their share), and nothing
 * of ours sends over it again (closed). An endpoint that is also one of
 * our own connections' (UCX made the peer's and ours one) is closed by
 * killing that connection, as a stuck session is (its transfers fail).
 * UCX force-closes only an endpoint with peer-failure handling (it refuses
 * one without: a same-host reader's, or a peer that asked for none): such
 * a reader keeps its share (unclosable). */
static void peer_close(kvb_engine_h eng, am_peer_t *pe, double idle_s)
{
    char why[200];
    snprintf(why, sizeof(why),
             "a reader took none of %zu read answers (%llu bytes) within the peer time-out "
             "(%.1f s): its connection is closed",
             pe->sending, (unsigned long long)pe->read_bytes, idle_s);
    kvb__conn_t *c = eng->conns;
    while (c != NULL && c->ep != pe->ep)
        c = c->next_all;
    pe->refs++;        /* the callbacks below may drop the others */
    pe->closed = true; /* before: they may answer */
    if (c != NULL) {
        kvb__conn_kill(eng, c, why);
    } else {
        ucp_request_param_t p = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
                                 .flags = UCP_EP_CLOSE_FLAG_FORCE};
        void *r = ucp_ep_close_nbx(pe->ep, &p);
        if (UCS_PTR_IS_PTR(r))
            ucp_request_free(r); /* released when it completes */
        if (UCS_PTR_IS_ERR(r)) { /* nothing done */
            pe->closed = false;
            pe->unclosable = true;
            snprintf(why, sizeof(why),
                     "a reader took none of %zu read answers (%llu bytes) within the peer "
                     "time-out; its connection has no peer-failure handling (%s): it keeps "
                     "its share",
                     pe->sending, (unsigned long long)pe->read_bytes,
                     ucs_status_string(UCS_PTR_STATUS(r)));
        }
    }
    KVB_LOGW("engine %s: %s", eng->sid, why);
    if (pe->closed)
        __atomic_add_fetch(&eng->am_peers_closed, 1, __ATOMIC_RELAXED);
    peer_put(eng, pe);
}

void kvb__am_target_tick(kvb_engine_h eng)
{
    /* every peer is listed while its endpoint lives (its watch): only one
     * with an answer counted can have one being sent */
    if (eng->am_peers == NULL || __atomic_load_n(&eng->am_reads, __ATOMIC_RELAXED) == 0)
        return;
    uint64_t now = kvb__now_ns(), bound = (uint64_t)(eng->params.peer_timeout_s * 1e9);
    am_peer_t *pe = eng->am_peers, *next;
    for (; pe != NULL; pe = next) {
        next = pe->next; /* pe may be freed; the others are not touched */
        if (!peer_live(pe) || pe->unclosable || pe->sending == 0 || now - pe->since_ns <= bound)
            continue;
        if (!eng->am_close_safe) { /* only the shares bound it then; said once per bound */
            KVB_LOGW("engine %s: a reader took none of %zu read answers within the peer "
                     "time-out; its connection is not closed (UCX_PROTO_INDIRECT_ID=off)",
                     eng->sid, pe->sending);
            pe->since_ns = now;
            continue;
        }
        peer_close(eng, pe, (double)(now - pe->since_ns) / 1e9);
    }
}

/* The engine is freed (its progress thread gone, its worker not yet
 * destroyed): reply endpoints with answers still being sent (a reader that
 * stopped taking them) are force-closed here, which ends those sends
 * (ans_done: their ranges, grants and shares released), rather than left
 * to ucp_worker_destroy, whose endpoint teardown in UCX 1.13 asserts that
 * no request is still listed on the endpoint (ucp_ep.c:437, proto_reqs)
 * and aborts the process. An endpoint that was one of our connections'
 * was closed when the progress thread stopped, which ended its answers. */
void kvb__am_target_fini(kvb_engine_h eng)
{
    for (size_t n = 0; n < 4096; n++) { /* one endpoint per turn: the list changes */
        am_peer_t *pe = eng->am_peers;
        while (pe != NULL && (pe->sending == 0 || !peer_live(pe) || pe->unclosable))
            pe = pe->next;
        if (pe == NULL || !eng->am_close_safe)
            return;
        ucp_request_param_t p = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
                                 .flags = UCP_EP_CLOSE_FLAG_FORCE};
        pe->refs++;
        pe->closed = true;
        void *r = ucp_ep_close_nbx(pe->ep, &p);
        if (UCS_PTR_IS_PTR(r))
            ucp_request_free(r); /* released when it completes */
        else if (UCS_PTR_IS_ERR(r))
            pe->unclosable = true;
        peer_put(eng, pe);
    }
}

void kvb__am_target_stats(kvb_engine_h eng, kvb_engine_limits_t *l)
{
    if (!(l->field_mask & KVB_ENGINE_LIMITS_READS))
        return;
    l->read_answers = __atomic_load_n(&eng->am_reads, __ATOMIC_RELAXED);
    l->read_answer_bytes = __atomic_load_n(&eng->am_read_bytes, __ATOMIC_RELAXED);
    l->reads_refused_busy = __atomic_load_n(&eng->am_reads_busy, __ATOMIC_RELAXED);
    l->read_conns_closed = __atomic_load_n(&eng->am_peers_closed, __ATOMIC_RELAXED);
}
