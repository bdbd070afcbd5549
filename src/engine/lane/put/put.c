/* The put lane: UCX one-sided puts (ucp_put_nbx) of a write's blocks, a
 * window of PUT_WINDOW at a time, each window closed by ucp_ep_flush_nbx,
 * whose completion is remote completion. For connections set up for puts
 * (--transport shm, KVBRIDGE_LANE=put: the lane RDMA hosts want); host
 * memory only (device memory has no remote key); the target cannot fence
 * it (fence.h). One-sided reads are the same walk with ucp_get_nbx (the
 * flush completes them too), equally unfenced. */
#include "engine/engine_int.h"

#include <stdlib.h>

#define PUT_WINDOW 1024 /* blocks issued before a flush */

typedef struct flush_op {
    kvb__op_t op;
    struct kvb_xfer *x;
    /* inside ucp_ep_flush_nbx: UCX may complete it from within the call (an
     * endpoint being failed purges its requests) and still return the
     * request; the callback then only records the end */
    bool starting, ended;
    ucs_status_t status;
} flush_op_t;

static void flush_op_release(kvb__op_t *op)
{
    kvb__xfer_release(((flush_op_t *)op)->x);
    free(op);
}

static void flush_done(flush_op_t *f, ucs_status_t status)
{
    struct kvb_xfer *x = f->x;
    if (!x->abandoned) {
        x->inflight--;
        if (status != UCS_OK)
            kvb__xfer_fail(x, KVB_ERR_PEER,
                           x->read ? "session %s: read failed: %s" : "session %s: write failed: %s",
                           x->conn->sess->sid, ucs_status_string(status));
    }
    kvb__op_untrack(x->eng, &f->op);
    flush_op_release(&f->op);
}

static void flush_cb(void *req, ucs_status_t status, void *user)
{
    flush_op_t *f = user;
    if (f->starting) {
        f->ended = true;
        f->status = status;
    } else {
        flush_done(f, status);
    }
    ucp_request_free(req);
}

static void issue_put(kvb_engine_h eng, struct kvb_xfer *x)
{
    kvb__conn_t *c = x->conn;
    ucp_request_param_t p = {0};
    size_t end = x->next + PUT_WINDOW < x->n ? x->next + PUT_WINDOW : x->n;
    for (; x->next < end && !x->abandoned; x->next++) {
        const kvb_block_t *b = &x->blocks[x->next];
        long s = kvb__segtab_find(&c->segs, b->dst, b->len);
        ucp_rkey_h rkey = (ucp_rkey_h)c->segs.v[s].handle;
        void *local = (void *)(uintptr_t)b->src; /* the engine's form: src is ours */
        void *r = x->read ? ucp_get_nbx(c->ep, local, b->len, b->dst, rkey, &p)
                          : ucp_put_nbx(c->ep, local, b->len, b->dst, rkey, &p);
        if (UCS_PTR_IS_ERR(r)) {
            kvb__xfer_fail(x, KVB_ERR_PEER,
                           x->read ? "session %s: get failed: %s" : "session %s: put failed: %s",
                           c->sess->sid, ucs_status_string(UCS_PTR_STATUS(r)));
            break;
        }
        if (r != NULL)
            ucp_request_free(r);
    }
    if (x->abandoned)
        return; /* the connection failed inside UCX: x is final */
    flush_op_t *f = calloc(1, sizeof(*f));
    if (f == NULL) {
        kvb__xfer_fail(x, KVB_ERR_NOMEM, "%s%s", "out of memory issuing a flush", "");
        return;
    }
    f->x = x;
    f->op.release = flush_op_release;
    p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    p.cb.send = flush_cb;
    p.user_data = f;
    __atomic_add_fetch(&x->refs, 1, __ATOMIC_RELAXED);
    f->starting = true;
    void *r = ucp_ep_flush_nbx(c->ep, &p);
    f->starting = false;
    if (UCS_PTR_IS_PTR(r)) {
        x->inflight++;
        if (f->ended) /* completed from within the call (its request freed) */
            flush_done(f, f->status);
        else
            kvb__op_track(eng, &f->op);
        return;
    }
    if (UCS_PTR_IS_ERR(r))
        kvb__xfer_fail(x, KVB_ERR_PEER, "session %s: flush failed: %s", c->sess->sid,
                       ucs_status_string(UCS_PTR_STATUS(r)));
    flush_op_release(&f->op);
}

/* Connections set up for puts (--transport shm, KVBRIDGE_LANE=put). */
static bool put_usable(kvb_engine_h eng, const kvb__conn_t *c, const struct kvb_xfer *x,
                       const long *dst_seg, const kvb__wblocks_t *w)
{
    return c->lane == LANE_PUT;
}

static void put_progress(kvb_engine_h eng, struct kvb_xfer *x)
{
    if (x->inflight == 0)
        issue_put(eng, x);
}

const kvb__lane_t kvb__lane_put = {
    .name = "put",
    .pairs = KVB__PAIR(KVB__MEM_HOST, KVB__MEM_HOST), /* device memory has no remote key */
    .fence = KVB__LANE_FENCE_NONE,
    .usable = put_usable,
    .submit = kvb__xfer_queue,
    .read = kvb__xfer_queue, /* issue_put gets a read's blocks */
    .progress = put_progress,
};
