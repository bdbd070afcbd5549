/* The message lane's one-sided reads, reader side. A read request's local
 * pieces wait in its window slot (x->am_iov); the target's answer carries
 * exactly the bytes asked for. An eager answer is placed in the callback.
 * The rule: no byte of a read lands after its end is published, unless
 * the read reports itself not drained (kvb_xfer_drained).
 *
 * A rendezvous answer over a connection with peer-failure handling (not
 * same-host) is received straight into the caller's pieces (an IOV
 * receive). While the read runs this is safe as before: the slot waits for
 * the receive (its pieces NULL) and the read does not end before the slot
 * leaves the window (a cancelled or failed read waits for it). A read
 * abandoned with such receives in flight (its connection failed, or the
 * engine stops) counts them (x->am_rx) and does not end before they did:
 * complete.c. Why that is enough, in UCX 1.13's default protocols: an IOV
 * receive makes the receiver's RTR carry no address, so the target sends
 * the bytes as RNDV_DATA active messages (rndv.c ucp_rndv_rtr_handler: no
 * put without an address; ucp_rndv_receive: no get into a non-contiguous
 * buffer), written by ucp_rndv_data_handler, on our progress thread inside
 * ucp_worker_progress, into the request its RTR request's id names; that id
 * leaves the worker's request map before the receive completes (the last
 * fragment) or when closing or failing the endpoint purges the request
 * (ucp_ep_req_purge: the id released, then the receive completed with an
 * error), and a fragment whose id is gone is dropped. The ids are indirect
 * on endpoints with peer-failure handling (UCX_PROTO_INDIRECT_ID=auto), so
 * a late fragment is looked up, not dereferenced. So once a receive's
 * callback ran, no byte of it lands. Hence the conditions of
 * kvb__am_read_direct_init: UCX 1.13 (the release this was read in),
 * neither UCX_PROTO_ENABLE=y (other protocols) nor
 * UCX_PROTO_INDIRECT_ID=off; KVBRIDGE_READ_DIRECT=0 turns it off.
 *
 * Else (a same-host connection: no peer-failure mode, no purge; or those
 * knobs) the answer is received into a buffer of ours and copied in when
 * the receive ends, only while the read still runs and still waits for
 * that request. The buffer is bounded by what we asked for (at most
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
#include <strings.h>

typedef struct read_rx {
    kvb__op_t op; /* first: the receive is the op */
    kvb_engine_h eng;
    uint64_t xid; /* the read, looked up again when the receive ends */
    uint32_t seq;
    ucp_dt_iov_t *iov; /* its pieces, taken from the slot */
    size_t niov;
    bool direct; /* received straight into iov (counted in x->am_rx), buf NULL */
    uint8_t *buf;
    size_t cap;  /* buf's capacity (kvb__bufpool_put) */
    bool pinned; /* buf is pinned staging memory (kvb__cuda_stage_put) */
    /* inside ucp_am_recv_data_nbx: UCX may complete the receive from within
     * it (an endpoint being failed purges its requests) and still return
     * the request; the callback then only records the end */
    bool starting, ended;
    ucs_status_t status;
} read_rx_t;

/* A UCX boolean knob in the environment, as UCX reads it (y/yes/on/1). */
static bool ucx_env_is(const char *name, bool yes)
{
    const char *v = getenv(name);
    if (v == NULL)
        return false;
    bool on = strcasecmp(v, "y") == 0 || strcasecmp(v, "yes") == 0 || strcasecmp(v, "on") == 0 ||
              strcmp(v, "1") == 0;
    bool off = strcasecmp(v, "n") == 0 || strcasecmp(v, "no") == 0 || strcasecmp(v, "off") == 0 ||
               strcmp(v, "0") == 0;
    return yes ? on : off;
}

/* The UCX the argument of the header was checked against (1.13: Debian
 * 12's; its default protocols). Another release may route a rendezvous
 * another way (1.16 made UCX_PROTO_ENABLE=y the default), so its reads go
 * through the buffer until someone checks it. */
static bool ucx_checked(void)
{
    unsigned major = 0, minor = 0, release = 0;
    ucp_get_version(&major, &minor, &release);
    return major == 1 && minor == 13;
}

void kvb__am_read_direct_init(kvb_engine_h eng)
{
    eng->read_direct = kvb__env_int("KVBRIDGE_READ_DIRECT", NULL, 1, 0, 1) == 1 && ucx_checked() &&
                       !ucx_env_is("UCX_PROTO_ENABLE", true) &&
                       !ucx_env_is("UCX_PROTO_INDIRECT_ID", false);
    KVB_LOGD("message-lane reads receive %s",
             eng->read_direct ? "straight into the caller's memory (peer-failure endpoints)"
                              : "through a buffer of the engine");
}

long kvb__am_win_find(const struct kvb_xfer *x, uint32_t seq)
{
    for (size_t i = 0; i < x->inflight && i < KVB__AM_WINDOW; i++)
        if (x->am_win[i] == seq)
            return (long)i;
    return -1;
}

void kvb__am_win_drop(struct kvb_xfer *x, size_t i)
{
    if (x->read && x->am_len[i] > 0) { /* a read request: out of its connection's count */
        x->conn->am_reads_out--;
        x->conn->am_read_out -= x->am_len[i];
    }
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
    x->conn->am_reads_out++; /* until kvb__am_win_drop, or the read's finish */
    x->conn->am_read_out += bytes;
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
    else if (!rx->direct)
        kvb__bufpool_put(rx->buf, rx->cap);
    free(rx);
}

static void rx_release(kvb__op_t *op)
{
    rx_free((read_rx_t *)op);
}

/* The receive of rx ended: its bytes go in (or, received straight in,
 * count) only if its read still runs and waits for it (else the read is
 * final: drop them). A read abandoned while it received straight in is
 * still listed until its receives ended (complete.c): one less. */
static void rx_done(read_rx_t *rx, ucs_status_t status)
{
    struct kvb_xfer *x = kvb__xfer_find(rx->eng, rx->xid);
    if (x != NULL && rx->direct && !KVB__HOOK(read_rx_unended))
        x->am_rx--;
    long i = x != NULL && !x->abandoned ? kvb__am_win_find(x, rx->seq) : -1;
    if (i >= 0 && x->am_iov[i] == NULL) {
        if (status == UCS_OK && !rx->direct)
            place(x, rx->iov, rx->niov, rx->buf);
        else if (status != UCS_OK)
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

/* Is the answer for x received straight into its pieces? (the header) */
static bool rx_direct(kvb_engine_h eng, const struct kvb_xfer *x)
{
    return eng->read_direct && x->read_device < 0 && !x->conn->local;
}

/* The receive's parameters: straight into rx's pieces, always as an IOV
 * (even one piece: a contiguous receive would let UCX choose a put or get
 * into it, the header's argument then fails), or into rx's buffer. */
static void *rx_target(read_rx_t *rx, size_t length, ucp_request_param_t *p, size_t *count)
{
    p->datatype = rx->direct ? UCP_DATATYPE_IOV : ucp_dt_make_contig(1);
    *count = rx->direct ? rx->niov : length;
    return rx->direct ? (void *)rx->iov : rx->buf;
}

/* Start receiving the rendezvous answer of slot i: into x's pieces, or a
 * buffer of ours (the header). */
static void rx_start(kvb_engine_h eng, struct kvb_xfer *x, size_t i, void *data, size_t length)
{
    read_rx_t *rx = calloc(1, sizeof(*rx));
    if (rx != NULL)
        rx->direct = rx_direct(eng, x);
    if (rx == NULL || (!rx->direct && !rx_buf(rx, x, length))) {
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
    size_t count;
    void *into = rx_target(rx, length, &p, &count);
    if (rx->direct)
        x->am_rx++; /* until rx_done, which may run inside the call */
    rx->starting = true;
    void *r = ucp_am_recv_data_nbx(eng->worker, data, into, count, &p);
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
