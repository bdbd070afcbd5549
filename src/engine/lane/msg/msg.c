/* The message lane, writer side: a write's blocks aggregated into UCX
 * active messages of up to am_chunk_bytes, destination descriptors in the
 * header (amwire.h), the bytes as an IOV payload, at most AM_WINDOW
 * unacknowledged per write; the target (target.c) validates every range,
 * places the bytes and acknowledges. Sources staged by the CUDA staging
 * lane are read from its ring as far as they are staged (x->stage_ready).
 * A one-sided read is built the same way into read requests (the
 * descriptors name the target's ranges, no payload; our pieces kept in the
 * window slot) and the target's answer carries the bytes, which are placed
 * here on the progress thread, or received straight into our pieces, only
 * while the read is still running (read.c): nothing lands after its end is
 * published, unless the read reports itself not drained. */
#include "engine/engine_int.h"
#include "engine/lane/msg/amwire.h"
#include "engine/lane/msg/msg.h"
#include "engine/lane/msg/read.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define AM_WINDOW KVB__AM_WINDOW
#define AM_MAX_IOV 4096 /* source pieces gathered into one message */

typedef struct am_msg {
    kvb__op_t op; /* first: the op is the message */
    struct kvb_xfer *x;
    size_t ndesc; /* destination descriptors in the header */
    uint32_t seq; /* low half of the message id */
    uint8_t *hdr;
    ucp_dt_iov_t *iov;
    /* inside ucp_am_send_nbx: UCX may complete the send from within it (an
     * endpoint being failed purges its requests) and still return the
     * request; the callback then only records the end (read.c does the
     * same for its receives) */
    bool starting, ended;
    ucs_status_t status;
    uint8_t *flipped; /* test hook flip_in_flight: the first piece's copy, one byte flipped */
} am_msg_t;

static void am_msg_free(am_msg_t *m)
{
    kvb__op_untrack(m->x->eng, &m->op);
    kvb__xfer_release(m->x);
    free(m->hdr);
    free(m->iov);
    free(m->flipped);
    free(m);
}

/* Test hook flip_in_flight: send a copy of the first piece with its first
 * byte flipped (the source stays as it was). */
static void am_flip(am_msg_t *m, size_t niov)
{
    if (niov == 0 || m->iov[0].length < KVB__FLIP_MIN ||
        !kvb__hook_take(&kvb__test_hooks.flip_in_flight) ||
        (m->flipped = malloc(m->iov[0].length)) == NULL)
        return;
    memcpy(m->flipped, m->iov[0].buffer, m->iov[0].length);
    m->flipped[0] ^= 0x01;
    m->iov[0].buffer = m->flipped;
}

static void am_msg_release(kvb__op_t *op)
{
    am_msg_free((am_msg_t *)op);
}

/* Take message seq out of x's window; false when it is not in it (acked
 * already, or the ack of a message whose send failed). */
static bool win_take(struct kvb_xfer *x, uint32_t seq)
{
    long i = kvb__am_win_find(x, seq);
    if (i >= 0)
        kvb__am_win_drop(x, (size_t)i);
    return i >= 0;
}

/* The order of failed sends and the connection's failure, for tests. */
static void send_err_note(const struct kvb_xfer *x, ucs_status_t status)
{
    __atomic_add_fetch(x->abandoned ? &kvb__test_hooks.am_send_err_after
                                    : &kvb__test_hooks.am_send_err_live,
                       1, __ATOMIC_RELAXED);
    int zero = 0;
    __atomic_compare_exchange_n(&kvb__test_hooks.am_send_err_first, &zero, (int)status, false,
                                __ATOMIC_RELAXED, __ATOMIC_RELAXED);
}

/* A message's send completed (inline, by callback, or with an immediate
 * error: refused, the call itself returned it before anything left). A
 * failed send gets no ack, so it leaves the window here, or the transfer
 * would wait for it until its connection dies; unless refused, it may
 * have reached the target (x->send_err: not drained). Which UCX errors
 * complete a send without failing the endpoint depends on the transport
 * (same-host endpoints run without peer-failure handling, where no error
 * callback follows); tests inject one through kvb__test_hooks. */
static void am_send_done(am_msg_t *m, ucs_status_t status, bool refused)
{
    struct kvb_xfer *x = m->x;
    if (status == UCS_OK && KVB__HOOK(am_send_status) != 0)
        status = (ucs_status_t)KVB__HOOK(am_send_status);
    if (status != UCS_OK)
        send_err_note(x, status);
    if (status != UCS_OK && !x->abandoned) { /* else the conn failed: x is final */
        win_take(x, m->seq);
        x->send_err |= !refused;
        kvb__xfer_fail(x, KVB_ERR_PEER, "session %s: message send failed: %s", x->conn->sess->sid,
                       ucs_status_string(status));
    }
    am_msg_free(m);
}

static void am_send_cb(void *req, ucs_status_t status, void *user)
{
    am_msg_t *m = user;
    if (m->starting) {
        m->ended = true;
        m->status = status;
    } else {
        am_send_done(m, status, false);
    }
    ucp_request_free(req);
}

/* Can piece (dst, len) extend descriptor d? Contiguous after a single run
 * (the run grows) or the next step of an equal-length stride (count grows);
 * either way the whole span must stay inside one peer registration (two
 * registrations may be adjacent, and the target checks each descriptor
 * against a single one). */
static bool desc_extend(const kvb__segtab_t *segs, kvb__am_desc_t *d, uint64_t dst, uint64_t len)
{
    kvb__am_desc_t e = *d;
    uint64_t span;
    if (d->count == 1 && dst == d->dst + d->len) {
        e.len += len;
    } else if (len == d->len && dst > d->dst &&
               (d->count == 1 ? dst - d->dst >= d->len : dst - d->dst == d->stride * d->count)) {
        e.stride = d->count == 1 ? dst - d->dst : d->stride;
        e.count++;
    } else {
        return false;
    }
    if (!kvb__am_desc_span(&e, &span) || kvb__segtab_find(segs, e.dst, span) < 0)
        return false;
    *d = e;
    return true;
}

typedef struct am_fill {
    kvb__am_desc_t d; /* the descriptor being grown (index k - 1) */
    size_t k, niov;
    uint32_t pieces;
    uint64_t total;
} am_fill_t;

/* Add one piece to message m; false when it does not fit (caller sends). */
static bool am_add_piece(struct kvb_xfer *x, am_msg_t *m, am_fill_t *f, size_t max_desc,
                         uint64_t src, uint64_t dst, uint64_t piece)
{
    uint8_t *h = m->hdr + (x->conn->am_auth ? KVB_HS_TOKEN_LEN : 0);
    bool smerge =
        f->niov > 0 && (uintptr_t)m->iov[f->niov - 1].buffer + m->iov[f->niov - 1].length == src;
    kvb__am_desc_t d = f->d;
    bool dmerge = f->k > 0 && desc_extend(&x->conn->segs, &d, dst, piece);
    uint32_t more = dmerge ? d.count - f->d.count : 1; /* destination pieces added */
    if ((!dmerge && f->k == max_desc) || (!smerge && f->niov == AM_MAX_IOV) ||
        more > AM_MAX_PIECES - f->pieces)
        return false;
    if (!dmerge) {
        d = (kvb__am_desc_t){.dst = dst, .len = piece, .stride = 0, .count = 1};
        f->k++;
    }
    f->pieces += more;
    f->d = d;
    kvb__am_put_desc(h, (uint32_t)(f->k - 1), &d);
    if (smerge) {
        m->iov[f->niov - 1].length += piece;
    } else {
        m->iov[f->niov].buffer = (void *)(uintptr_t)src;
        m->iov[f->niov++].length = piece;
    }
    f->total += piece;
    return true;
}

static am_msg_t *am_alloc(struct kvb_xfer *x, size_t max_desc)
{
    size_t pre = x->conn->am_auth ? KVB_HS_TOKEN_LEN : 0;
    am_msg_t *m = calloc(1, sizeof(*m));
    if (m == NULL || (m->hdr = malloc(pre + AM_HDR_FIXED + max_desc * AM_DESC)) == NULL ||
        (m->iov = malloc(AM_MAX_IOV * sizeof(*m->iov))) == NULL) {
        if (m != NULL) {
            free(m->hdr);
            free(m);
        }
        return NULL;
    }
    /* Engine secret: the peer's token goes first (KVB_AM_WRITE_AUTH). */
    if (pre > 0)
        memcpy(m->hdr, x->conn->am_token, KVB_HS_TOKEN_LEN);
    return m;
}

/* Gather the next pieces of x into one message, bounded by bytes, source
 * pieces, destination descriptors and destination pieces. Pieces contiguous
 * at the source share one IOV entry; at the destination, contiguous pieces
 * share one descriptor and equally spaced equal pieces one strided
 * descriptor, so head slices (strided on either side) travel in full size
 * messages. Returns NULL on allocation failure. */
static am_msg_t *am_build(kvb_engine_h eng, struct kvb_xfer *x, size_t *niov_p, uint64_t *bytes_p)
{
    size_t pre = x->conn->am_auth ? KVB_HS_TOKEN_LEN : 0;
    size_t max_desc = (eng->max_am_header - pre - AM_HDR_FIXED) / AM_DESC;
    uint64_t chunk = eng->params.am_chunk_bytes;
    if (x->read && chunk > AM_READ_MAX) /* what a target answers at most */
        chunk = AM_READ_MAX;
    if (max_desc > AM_MAX_PIECES) /* every descriptor names at least one piece */
        max_desc = AM_MAX_PIECES;
    am_msg_t *m = am_alloc(x, max_desc);
    am_fill_t f = {0};
    if (m == NULL)
        return NULL;
    uint64_t ready = __atomic_load_n(&x->stage_ready, __ATOMIC_ACQUIRE);
    while (x->next < x->n && f.total < chunk && x->pos < ready) {
        const kvb_block_t *b = &x->blocks[x->next];
        uint64_t piece = b->len - x->off;
        if (piece > chunk - f.total)
            piece = chunk - f.total;
        if (piece > ready - x->pos) /* staging: only what is staged */
            piece = ready - x->pos;
        uint64_t src = b->src + x->off;
        if (x->staged != NULL && x->staged[x->next]) { /* in the ring, up to its end */
            uint64_t at = src % x->stage_len;
            if (piece > x->stage_len - at)
                piece = x->stage_len - at;
            src = (uint64_t)(uintptr_t)x->stage + at;
        }
        if (!am_add_piece(x, m, &f, max_desc, src, b->dst + x->off, piece))
            break;
        x->off += piece;
        x->pos += piece;
        if (x->off == b->len) {
            x->next++;
            x->off = 0;
        }
    }
    uint8_t *h = m->hdr + pre;
    uint32_t magic = x->read ? AM_MAGIC_READ : AM_MAGIC_WRITE, nd = (uint32_t)f.k;
    memcpy(h, &magic, 4);
    memcpy(h + 4, &nd, 4);
    kvb__am_put_u64(h + 8, x->id);
    /* msg id: writer tag in the high half (writer fencing), sequence low. */
    kvb__am_put_u64(h + 16, (uint64_t)__atomic_load_n(&eng->writer_tag, __ATOMIC_RELAXED) << 32 |
                                (x->msgs_sent & 0xffffffffu));
    kvb__am_put_u64(h + 24, f.total);
    kvb__am_put_u64(h + 32, x->epoch); /* the writer grant (fence.c) */
    m->ndesc = f.k;
    *niov_p = f.niov;
    *bytes_p = f.total;
    return m;
}

/* Room on c for one more read request of up to chunk bytes? A target
 * answers one connection at most AM_READS_CONN_MAX requests of at most
 * AM_READ_CONN_BYTES_MAX bytes at once and refuses more as busy
 * (amwire.h), so our reads on c wait for room instead. Counted: the
 * requests of c's running reads (c->am_reads_out); those of a read that
 * ended are not, the target drops them as soon as their answers reach us. */
static bool conn_read_room(const kvb__conn_t *c, uint64_t chunk)
{
    return c->am_reads_out < AM_READS_CONN_MAX && c->am_read_out + chunk <= AM_READ_CONN_BYTES_MAX;
}

static void am_issue(kvb_engine_h eng, struct kvb_xfer *x)
{
    uint64_t chunk =
        eng->params.am_chunk_bytes < AM_READ_MAX ? eng->params.am_chunk_bytes : AM_READ_MAX;
    while (x->next < x->n && x->inflight < AM_WINDOW && !x->failed && !x->abandoned &&
           x->pos < __atomic_load_n(&x->stage_ready, __ATOMIC_ACQUIRE) &&
           (!x->read || KVB__HOOK(read_share_ignored) || conn_read_room(x->conn, chunk))) {
        size_t niov;
        uint64_t bytes;
        am_msg_t *m = am_build(eng, x, &niov, &bytes);
        if (m == NULL) {
            kvb__xfer_fail(x, KVB_ERR_NOMEM, "%s%s", "out of memory building a message", "");
            return;
        }
        ucp_request_param_t p = {0};
        p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                         UCP_OP_ATTR_FIELD_DATATYPE | UCP_OP_ATTR_FIELD_FLAGS;
        p.cb.send = am_send_cb;
        p.user_data = m;
        p.flags = UCP_AM_SEND_FLAG_REPLY;
        /* One host: always IOV (UCX pipelines it through shared memory; a
         * single contiguous rendezvous measured 35% slower). TCP: a single
         * piece goes contiguous (zero-copy rendezvous, measured faster). */
        bool contig = niov == 1 && !x->conn->local;
        p.datatype = contig ? ucp_dt_make_contig(1) : UCP_DATATYPE_IOV;
        m->x = x;
        m->op.release = am_msg_release;
        m->seq = (uint32_t)x->msgs_sent;
        if (KVB__HOOK(am_send_status) != 0)
            p.flags = 0; /* the target drops it unanswered */
        __atomic_add_fetch(&x->refs, 1, __ATOMIC_RELAXED);
        x->msgs_sent++;
        x->am_pos[x->inflight] = x->pos - bytes;
        x->am_win[x->inflight++] = m->seq;
        if (!x->read)
            am_flip(m, niov);
        void *buf = contig ? m->iov[0].buffer : (void *)m->iov;
        size_t cnt = contig ? m->iov[0].length : niov;
        if (x->read) { /* a request: our pieces wait in the slot for the answer */
            kvb__am_read_slot(x, x->inflight - 1, m->iov, niov, bytes);
            m->iov = NULL;
            p.datatype = ucp_dt_make_contig(1);
            buf = NULL;
            cnt = 0;
        }
        size_t pre = x->conn->am_auth ? KVB_HS_TOKEN_LEN : 0;
        m->starting = true;
        void *r = ucp_am_send_nbx(x->conn->ep, pre > 0 ? KVB_AM_WRITE_AUTH : KVB_AM_WRITE, m->hdr,
                                  pre + AM_HDR_FIXED + m->ndesc * AM_DESC, buf, cnt, &p);
        m->starting = false;
        if (m->ended) /* completed from within the call (its request freed) */
            am_send_done(m, m->status, false);
        else if (UCS_PTR_IS_ERR(r) || r == NULL) /* UCX refused it, or it completed */
            am_send_done(m, UCS_PTR_STATUS(r), UCS_PTR_IS_ERR(r));
        else
            kvb__op_track(eng, &m->op);
    }
}

/* Did this ack come over x's own endpoint? A target answers only for the
 * writes it received; which message it names is checked by win_take. */
static bool ack_from_conn(const struct kvb_xfer *x, const ucp_am_recv_param_t *param)
{
    return (param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) && param->reply_ep == x->conn->ep;
}

static void ack_ignored(kvb_engine_h eng, uint64_t xid, uint64_t mid, const struct kvb_xfer *x)
{
    uint64_t n = ++eng->acks_ignored;
    if ((n & (n - 1)) == 0) /* 1st, 2nd, 4th, ...: no log flood */
        KVB_LOGW("engine %s: ignored an ack for transfer %llu message %llx: %s (%llu so far)",
                 eng->sid, (unsigned long long)xid, (unsigned long long)mid,
                 x == NULL ? "no such transfer in flight"
                           : "not from the transfer's connection, or no such message awaits one",
                 (unsigned long long)n);
}

/* An ack (or a refused read) of x: its message out of the window, a
 * refusal failing x. */
static ucs_status_t ack_one(kvb_engine_h eng, struct kvb_xfer *x, uint64_t xid, uint64_t mid,
                            int32_t st, const uint8_t *why, uint32_t rl)
{
    if (!win_take(x, (uint32_t)mid)) {
        ack_ignored(eng, xid, mid, x); /* not a message of ours in flight */
        return UCS_OK;
    }
    x->msgs_acked++;
    if (st != KVB_OK) {
        char reason[404];
        memcpy(reason, why, rl < 400 ? rl : 400);
        reason[rl < 400 ? rl : 400] = '\0';
        kvb__xfer_fail(x,
                       st == KVB_ERR_BOUNDS || st == KVB_ERR_AUTH || st == KVB_ERR_FENCED ||
                               st == KVB_ERR_UNSUPPORTED /* a target serving no reads */ ||
                               st == KVB_ERR_BUSY /* its read caps: try again */
                           ? (kvb_status_t)st
                           : KVB_ERR_PEER,
                       x->read ? "session %s: peer refused the read: %s"
                               : "session %s: peer refused the write: %s",
                       x->conn->sess->sid, reason);
    }
    return UCS_OK;
}

static ucs_status_t am_ack_cb(void *arg, const void *header, size_t hlen, void *data, size_t length,
                              const ucp_am_recv_param_t *param)
{
    kvb_engine_h eng = arg;
    const uint8_t *why;
    uint32_t rl;
    int32_t st;
    uint64_t xid, mid;
    if (!kvb__am_parse_ack(header, hlen, &st, &xid, &mid, &why, &rl))
        return UCS_OK;
    struct kvb_xfer *x = kvb__xfer_find(eng, xid);
    if (x == NULL || x->abandoned || !ack_from_conn(x, param)) {
        ack_ignored(eng, xid, mid, x); /* not a transfer of ours in flight */
        return UCS_OK;
    }
    /* A read's answer: its bytes placed (or their receive started) first. */
    if (x->read && st == KVB_OK)
        return kvb__am_read_answer(eng, x, (uint32_t)mid, data, length, param);
    return ack_one(eng, x, xid, mid, st, why, rl);
}

static kvb_status_t msg_init(kvb_engine_h eng)
{
    ucp_am_handler_param_t p = {0};
    p.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                   UCP_AM_HANDLER_PARAM_FIELD_ARG;
    p.arg = eng;
    kvb__am_read_direct_init(eng);
    if (kvb__am_target_register(eng) != KVB_OK)
        return kvb__err_set(&eng->err, KVB_ERR_IO, "cannot set the write message handlers");
    p.id = KVB_AM_ACK;
    p.cb = am_ack_cb;
    if (ucp_worker_set_am_recv_handler(eng->worker, &p) != UCS_OK)
        return kvb__err_set(&eng->err, KVB_ERR_IO, "cannot set the ack message handler");
    return KVB_OK;
}

const kvb__lane_t kvb__lane_msg = {
    .name = "message",
    .pairs = KVB__PAIR(KVB__MEM_HOST, KVB__MEM_HOST),
    .caps = KVB__LANE_READ_GATED,
    .fence = KVB__LANE_FENCE_TARGET,
    .init = msg_init,
    .submit = kvb__xfer_queue,
    .read = kvb__xfer_queue, /* am_issue sends a read's requests instead */
    .progress = am_issue,
    .tick = kvb__am_target_tick,
    .fini = kvb__am_target_fini,
    .stats = kvb__am_target_stats,
};
