/* The message lane's one-sided reads, reader side. A read request's local
 * pieces wait in its window slot (x->am_iov); the target's answer carries
 * exactly the bytes asked for. An eager answer is placed in the callback. A
 * rendezvous answer is received into a buffer of ours, not into the
 * caller's memory: UCX may still complete a receive after the read failed
 * or its connection was closed, and once the read's end is published no
 * byte of it may land; so the bytes are copied in when the receive ends,
 * and only while the read still runs and still waits for that request
 * (its slot stays in the window until then, so a cancelled read ends only
 * after it). The buffer is bounded by what we asked for (at most
 * AM_READ_MAX per request, AM_WINDOW requests per read) and comes from the
 * buffer pool: a fresh mmap'd buffer per answer costs its page faults.
 * A read the CUDA staging lane submitted (x->read_device: a local
 * destination is device memory) is received into pinned host memory
 * instead and placed with the driver, synchronously, so its bytes are in
 * before the request leaves the window as any other read's. */
#include "engine/lane/msg/read.h"
#include "engine/bufpool.h"
#include "engine/lane/msg/amwire.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct read_rx {
    kvb__op_t op; /* first: the receive is the op */
    kvb_engine_h eng;
    uint64_t xid; /* the read, looked up again when the receive ends */
    uint32_t seq;
    ucp_dt_iov_t *iov; /* its pieces, taken from the slot */
    size_t niov;
    uint8_t *buf;
    size_t cap;  /* buf's capacity (kvb__bufpool_put) */
    bool pinned; /* buf is pinned staging memory (kvb__cuda_stage_put) */
    /* inside ucp_am_recv_data_nbx: UCX may complete the receive from within
     * it (an endpoint being failed purges its requests) and still return
     * the request; the callback then only records the end */
    bool starting, ended;
    ucs_status_t status;
} read_rx_t;

long kvb__am_win_find(const struct kvb_xfer *x, uint32_t seq)
{
    for (size_t i = 0; i < x->inflight && i < KVB__AM_WINDOW; i++)
        if (x->am_win[i] == seq)
            return (long)i;
    return -1;
}

void kvb__am_win_drop(struct kvb_xfer *x, size_t i)
{
    size_t last = --x->inflight;
    free(x->am_iov[i]);
    x->am_win[i] = x->am_win[last];
    x->am_pos[i] = x->am_pos[last];
    x->am_iov[i] = x->am_iov[last];
    x->am_niov[i] = x->am_niov[last];
    x->am_len[i] = x->am_len[last];
    x->am_iov[last] = NULL;
}

void kvb__am_read_slot(struct kvb_xfer *x, size_t i, ucp_dt_iov_t *iov, size_t n, uint64_t bytes)
{
    x->am_iov[i] = iov;
    x->am_niov[i] = n;
    x->am_len[i] = bytes;
}

void kvb__am_scatter(const ucp_dt_iov_t *iov, size_t n, const uint8_t *data)
{
    for (size_t i = 0; i < n; i++) {
        memcpy(iov[i].buffer, data, iov[i].length);
        data += iov[i].length;
    }
}

kvb_status_t kvb__am_cuda_copy(int device, const ucp_dt_iov_t *iov, size_t n, void *data, bool in,
                               char *why, size_t wl)
{
    kvb__cuda_copy_t *v = malloc((n ? n : 1) * sizeof(*v));
    if (v == NULL) {
        snprintf(why, wl, "out of memory");
        return KVB_ERR_NOMEM;
    }
    uint64_t host = (uint64_t)(uintptr_t)data;
    for (size_t i = 0; i < n; host += iov[i].length, i++) {
        uint64_t piece = (uint64_t)(uintptr_t)iov[i].buffer;
        v[i] = in ? (kvb__cuda_copy_t){piece, host, iov[i].length}
                  : (kvb__cuda_copy_t){host, piece, iov[i].length};
    }
    kvb_status_t st = kvb__cuda_copy_batch(device, v, n, why, wl);
    free(v);
    return st;
}

/* An answer's bytes into x's pieces iov[0..n): memcpy, or the driver when a
 * destination is device memory; a failed copy fails x. */
static void place(struct kvb_xfer *x, const ucp_dt_iov_t *iov, size_t n, const void *data)
{
    char why[300];
    if (x->read_device < 0) {
        kvb__am_scatter(iov, n, data);
        return;
    }
    kvb_status_t st =
        kvb__am_cuda_copy(x->read_device, iov, n, (void *)data, true, why, sizeof(why));
    if (st != KVB_OK)
        kvb__xfer_fail(x, st, "session %s: placing a read's bytes into device memory: %s",
                       x->conn->sess->sid, why);
}

static void rx_free(read_rx_t *rx)
{
    free(rx->iov);
    if (rx->pinned)
        kvb__cuda_stage_put(rx->buf, rx->cap);
    else
        kvb__bufpool_put(rx->buf, rx->cap);
    free(rx);
}

static void rx_release(kvb__op_t *op)
{
    rx_free((read_rx_t *)op);
}

/* The receive of rx ended: its bytes go in only if its read still runs and
 * waits for it (else the read is final: drop them). */
static void rx_done(read_rx_t *rx, ucs_status_t status)
{
    struct kvb_xfer *x = kvb__xfer_find(rx->eng, rx->xid);
    long i = x != NULL && !x->abandoned ? kvb__am_win_find(x, rx->seq) : -1;
    if (i >= 0 && x->am_iov[i] == NULL) {
        if (status == UCS_OK)
            place(x, rx->iov, rx->niov, rx->buf);
        else
            kvb__xfer_fail(x, KVB_ERR_PEER, "session %s: receiving a read's bytes failed: %s",
                           x->conn->sess->sid, ucs_status_string(status));
        kvb__am_win_drop(x, (size_t)i);
    }
    rx_free(rx);
}

static void rx_cb(void *req, ucs_status_t status, size_t length, void *user)
{
    read_rx_t *rx = user;
    kvb__op_untrack(rx->eng, &rx->op);
    if (rx->starting) {
        rx->ended = true;
        rx->status = status;
    } else {
        rx_done(rx, status);
    }
    ucp_request_free(req);
}

/* A buffer of ours for rx's length bytes: pinned when they go on into
 * device memory (the driver copies from it). */
static bool rx_buf(read_rx_t *rx, const struct kvb_xfer *x, size_t length)
{
    rx->pinned = x->read_device >= 0;
    rx->cap = length;
    rx->buf = rx->pinned ? kvb__cuda_stage_get(length) : kvb__bufpool_get(length, &rx->cap);
    return rx->buf != NULL;
}

/* Start receiving the rendezvous answer of slot i into a buffer of ours. */
static void rx_start(kvb_engine_h eng, struct kvb_xfer *x, size_t i, void *data, size_t length)
{
    read_rx_t *rx = calloc(1, sizeof(*rx));
    if (rx == NULL || !rx_buf(rx, x, length)) {
        free(rx);
        kvb__xfer_fail(x, KVB_ERR_NOMEM, "%s%s", "out of memory receiving a read's bytes", "");
        kvb__am_win_drop(x, i);
        return;
    }
    rx->eng = eng;
    rx->xid = x->id;
    rx->seq = x->am_win[i];
    rx->op.release = rx_release;
    rx->iov = x->am_iov[i]; /* the slot now waits for rx (its pieces NULL) */
    rx->niov = x->am_niov[i];
    x->am_iov[i] = NULL;
    ucp_request_param_t p = {0};
    p.op_attr_mask =
        UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_DATATYPE;
    p.cb.recv_am = rx_cb;
    p.user_data = rx;
    p.datatype = ucp_dt_make_contig(1);
    rx->starting = true;
    void *r = ucp_am_recv_data_nbx(eng->worker, data, rx->buf, length, &p);
    rx->starting = false;
    if (rx->ended) /* completed from within the call (its request freed) */
        rx_done(rx, rx->status);
    else if (UCS_PTR_IS_PTR(r))
        kvb__op_track(eng, &rx->op);
    else
        rx_done(rx, UCS_PTR_STATUS(r));
}

ucs_status_t kvb__am_read_answer(kvb_engine_h eng, struct kvb_xfer *x, uint32_t seq, void *data,
                                 size_t length, const ucp_am_recv_param_t *param)
{
    long i = kvb__am_win_find(x, seq);
    if (i < 0 || x->am_iov[i] == NULL) { /* unknown, or its bytes already coming */
        eng->acks_ignored++;
        return UCS_OK;
    }
    x->msgs_acked++;
    if (length != x->am_len[i]) {
        kvb__xfer_fail(x, KVB_ERR_PEER, "session %s: %s", x->conn->sess->sid,
                       "the peer answered a read with another number of bytes than asked");
        kvb__am_win_drop(x, (size_t)i);
    } else if (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) {
        rx_start(eng, x, (size_t)i, data, length);
    } else {
        place(x, x->am_iov[i], x->am_niov[i], data);
        kvb__am_win_drop(x, (size_t)i);
    }
    return UCS_OK;
}
