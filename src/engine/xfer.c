/* Transfers: validation and coalescing on the caller's thread; issuing,
 * completion and failure on the progress thread. Two lanes:
 *  - put: ucp_put_nbx per block, then ucp_ep_flush_nbx (remote completion);
 *  - message (AM): blocks aggregated into messages of up to am_chunk_bytes,
 *    descriptors in the AM header, bytes as an IOV payload; the target
 *    (amtarget.c) validates every range, places the bytes and acknowledges;
 *    this file builds and sends the messages and handles the acks. */
#include "engine/engine_int.h"
#include "engine/amwire.h"
#include "engine/bufpool.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define PUT_WINDOW 1024 /* blocks issued before a flush */
#define AM_WINDOW KVB__AM_WINDOW

typedef struct am_msg {
    kvb__op_t op; /* first: the op is the message */
    struct kvb_xfer *x;
    size_t ndesc; /* destination descriptors in the header */
    uint32_t seq; /* low half of the message id */
    uint8_t *hdr;
    ucp_dt_iov_t *iov;
} am_msg_t;

void kvb__xfer_release(struct kvb_xfer *x)
{
    if (__atomic_sub_fetch(&x->refs, 1, __ATOMIC_ACQ_REL) != 0)
        return;
    kvb__conn_put(x->conn);
    if (x->stage != NULL)
        kvb__cuda_stage_put(x->stage, x->stage_len);
    free(x->staged);
    kvb__bufpool_put(x->blocks, x->blocks_cap);
    kvb__bufpool_put(x->runs, x->runs_cap);
    pthread_mutex_destroy(&x->mu);
    pthread_cond_destroy(&x->cv);
    free(x);
}

/* ---- caller side ---- */

/* x's blocks in the form of its lane: runs (KVB__LANE_RUNS: the direct
 * lanes), else plain blocks (strided ones expanded). */
static kvb_status_t build_blocks(struct kvb_xfer *x, const kvb__wblocks_t *w, const long *seg)
{
    bool runs = x->lane->caps & KVB__LANE_RUNS;
    if (!runs && w->strided == NULL)
        return kvb__xfer_blocks(x, w->plain, seg, w->n);
    kvb_status_t st = kvb__runs_build(x, w, seg);
    if (st == KVB_OK && !runs)
        st = kvb__runs_expand(x);
    return st;
}

/* The lane for x (lanes.c): by the memory kinds of its two sides, then
 * what each lane says of x's connection and blocks. */
static kvb_status_t choose_lane(kvb_engine_h eng, struct kvb_xfer *x, const long *seg,
                                const kvb__wblocks_t *w)
{
    kvb__mem_kind_t src, dst;
    kvb__mem_kinds(eng, x->conn, seg, w, &src, &dst);
    x->cuda = src == KVB__MEM_CUDA || dst == KVB__MEM_CUDA;
    kvb__lanes_choose(eng, x, src, dst, seg, w);
    if (x->lane == NULL)
        return kvb__err_set(&eng->err, KVB_ERR_UNSUPPORTED,
                            "session %s: no lane moves %s memory into %s memory",
                            x->conn->sess->sid, src == KVB__MEM_CUDA ? "device" : "host",
                            dst == KVB__MEM_CUDA ? "device" : "host");
    return KVB_OK;
}

static kvb_status_t prepare(kvb_engine_h eng, const char *sid, const kvb__wblocks_t *w,
                            uint64_t deadline, struct kvb_xfer *x)
{
    size_t seg_cap = 0;
    long *seg = kvb__bufpool_get((w->n ? w->n : 1) * sizeof(*seg), &seg_cap);
    bool retry = false;
    kvb_status_t st = seg == NULL ? KVB_ERR_NOMEM : KVB_OK;
    if (st == KVB_OK)
        st = kvb__session_acquire_by(eng, sid, false, deadline, &x->conn);
    if (st == KVB_OK)
        st = kvb__wblocks_check(eng, x->conn, w, seg, &retry);
    if (st == KVB_ERR_BOUNDS && retry) {
        /* The peer may have registered more since our handshake: look again. */
        kvb__conn_put(x->conn);
        x->conn = NULL;
        retry = false;
        st = kvb__session_acquire_by(eng, sid, true, deadline, &x->conn);
        if (st == KVB_OK)
            st = kvb__wblocks_check(eng, x->conn, w, seg, &retry);
    }
    if (st == KVB_OK)
        st = choose_lane(eng, x, seg, w);
    if (st == KVB_OK)
        st = build_blocks(x, w, seg);
    kvb__bufpool_put(seg, seg_cap);
    return st;
}

/* A new transfer under params (NULL: none); refs: the caller's and the
 * engine's. NULL: out of memory. */
static struct kvb_xfer *xfer_new(kvb_engine_h eng, const kvb_write_params_t *params)
{
    struct kvb_xfer *x = calloc(1, sizeof(*x));
    if (x == NULL)
        return NULL;
    pthread_mutex_init(&x->mu, NULL);
    kvb__cond_init_mono(&x->cv);
    x->eng = eng;
    x->refs = 2;
    x->status = KVB_ERR_INPROGRESS;
    x->stage_ready = UINT64_MAX; /* no staging: every source readable */
    if (params != NULL && (params->field_mask & KVB_WRITE_PARAM_EPOCH))
        x->epoch = params->epoch;
    return x;
}

/* The caller's arguments of one write, checked (the engine's error set). */
static kvb_status_t check_args(kvb_engine_h eng, const char *sid, const kvb__wblocks_t *w)
{
    if (sid == NULL || (w->plain == NULL && w->strided == NULL && w->n > 0))
        return kvb__err_set(&eng->err, KVB_ERR_INVALID, "write without a session or blocks");
    if (w->n > SIZE_MAX / sizeof(kvb__run_t)) /* the copies below would wrap */
        return kvb__err_set(&eng->err, KVB_ERR_INVALID, "write of %zu blocks: too many", w->n);
    return KVB_OK;
}

/* x never reached a lane: only the caller's reference is left. */
static void xfer_unsubmitted(struct kvb_xfer *x)
{
    x->refs = 1;
}

/* x refused by its lane: on to its fallback, in the form that one walks
 * (a direct lane's runs become plain blocks for the UCX lanes). None left:
 * KVB_ERR_CANCELED (every lane that refuses does so while stopping). */
static kvb_status_t to_fallback(struct kvb_xfer *x)
{
    x->lane = x->lane_next;
    x->lane_next = NULL;
    if (x->lane == NULL)
        return KVB_ERR_CANCELED;
    if (x->runs != NULL && !(x->lane->caps & KVB__LANE_RUNS))
        return kvb__runs_expand(x);
    return KVB_OK;
}

/* Prepared x on its lane (a group of one), or on its fallback where a lane
 * refuses it (refused: its lane already did). On failure x is unsubmitted
 * (the caller's reference left). */
static kvb_status_t submit_one(kvb_engine_h eng, struct kvb_xfer *x, bool refused)
{
    kvb_status_t st = refused ? KVB__LANE_REFUSED : x->lane->submit(eng, &x, 1);
    while (st == KVB__LANE_REFUSED)
        if ((st = to_fallback(x)) == KVB_OK)
            st = x->lane->submit(eng, &x, 1);
    if (st != KVB_OK)
        xfer_unsubmitted(x);
    return st;
}

/* kvb_engine_write_async of w with a deadline (monotonic ns) for the
 * session set-up: our handshake or waiting for another thread's. */
static kvb_status_t write_start_w(kvb_engine_h eng, const char *sid, const kvb__wblocks_t *w,
                                  const kvb_write_params_t *params, uint64_t deadline,
                                  kvb_xfer_h *xfer_p)
{
    if (eng == NULL || sid == NULL || xfer_p == NULL)
        return KVB_ERR_INVALID;
    kvb_status_t st = check_args(eng, sid, w);
    if (st != KVB_OK)
        return st;
    struct kvb_xfer *x = xfer_new(eng, params);
    if (x == NULL)
        return KVB_ERR_NOMEM;
    st = prepare(eng, sid, w, deadline, x);
    if (st == KVB_OK)
        st = submit_one(eng, x, false);
    else
        xfer_unsubmitted(x);
    if (st != KVB_OK) {
        kvb__xfer_release(x);
        return st;
    }
    *xfer_p = x;
    return KVB_OK;
}

static kvb_status_t write_start(kvb_engine_h eng, const char *sid, const kvb_block_t *blocks,
                                size_t count, const kvb_write_params_t *params, uint64_t deadline,
                                kvb_xfer_h *xfer_p)
{
    if (blocks == NULL && count > 0)
        return KVB_ERR_INVALID;
    kvb__wblocks_t w = {.plain = blocks, .n = count};
    return write_start_w(eng, sid, &w, params, deadline, xfer_p);
}

/* Without a caller's time-out a session set-up gets twice the connect
 * time-out: another thread's handshake (bounded by it) may also be mapping
 * the peer's shared pool (direct lane). */
static uint64_t setup_deadline(kvb_engine_h eng, double timeout_s)
{
    double s = 2 * eng->params.connect_timeout_s;
    if (timeout_s > 0 && timeout_s < s)
        s = timeout_s;
    return kvb__now_ns() + (uint64_t)(s * 1e9);
}

kvb_status_t kvb_engine_write_async(kvb_engine_h eng, const char *sid, const kvb_block_t *blocks,
                                    size_t count, kvb_xfer_h *xfer_p)
{
    if (eng == NULL)
        return KVB_ERR_INVALID;
    return kvb_engine_write_async_ex(eng, sid, blocks, count, NULL, xfer_p);
}

kvb_status_t kvb_engine_write_async_ex(kvb_engine_h eng, const char *sid, const kvb_block_t *blocks,
                                       size_t count, const kvb_write_params_t *params,
                                       kvb_xfer_h *xfer_p)
{
    if (eng == NULL)
        return KVB_ERR_INVALID;
    return write_start(eng, sid, blocks, count, params, setup_deadline(eng, 0), xfer_p);
}

/* ---- groups (kvb_engine_write_group_async) ---- */

/* Failed member x (unsubmitted): final now, with the calling thread's last
 * error on this engine as its reason. */
static void member_failed(kvb_engine_h eng, struct kvb_xfer *x, kvb_status_t st)
{
    const char *why = kvb__err_get(&eng->err);
    snprintf(x->err, sizeof(x->err), "%s", why[0] != '\0' ? why : kvb_status_string(st));
    __atomic_store_n(&x->status, (int)st, __ATOMIC_RELEASE);
}

/* The struct before the strided fields: callers built against it pass its
 * size and never set KVB_WRITE_MEMBER_STRIDED. */
#define MEMBER_V1_SIZE offsetof(kvb_write_member_t, strided)

/* Member i of the caller's array of member_size strides; fields past the
 * caller's struct read as zero. false when its field_mask names one of
 * those. */
static bool member_read(kvb_write_member_t *mb, const kvb_write_member_t *members, size_t i,
                        size_t member_size)
{
    size_t have = member_size < sizeof(*mb) ? member_size : sizeof(*mb);
    memset(mb, 0, sizeof(*mb));
    memcpy(mb, (const char *)members + i * member_size, have);
    return have == sizeof(*mb) || !(mb->field_mask & KVB_WRITE_MEMBER_STRIDED);
}

/* mb's blocks, plain or strided (fits: member_read's answer). */
static kvb_status_t member_blocks(kvb_engine_h eng, const kvb_write_member_t *mb, bool fits,
                                  kvb__wblocks_t *w)
{
    *w = (kvb__wblocks_t){.plain = mb->blocks, .n = mb->count};
    if (!fits)
        return kvb__err_set(&eng->err, KVB_ERR_INVALID,
                            "write member sets KVB_WRITE_MEMBER_STRIDED but member_size does "
                            "not reach its fields");
    if (!(mb->field_mask & KVB_WRITE_MEMBER_STRIDED))
        return KVB_OK;
    if (mb->blocks != NULL || mb->count != 0)
        return kvb__err_set(&eng->err, KVB_ERR_INVALID,
                            "write member with both plain and strided blocks");
    *w = (kvb__wblocks_t){.strided = mb->strided, .n = mb->strided_count};
    return KVB_OK;
}

/* Start member mb: on a lane that takes groups (the direct lane) it is only
 * prepared and added to zip[*nz_p] for the group's one submission; on any
 * other lane now. */
static kvb_status_t member_start(kvb_engine_h eng, const kvb_write_member_t *mb, bool fits,
                                 struct kvb_xfer **zip, size_t *nz_p, kvb_xfer_h *xfer_p)
{
    const kvb_write_params_t *wp = mb->field_mask & KVB_WRITE_MEMBER_PARAMS ? mb->params : NULL;
    struct kvb_xfer *x = xfer_new(eng, wp);
    *xfer_p = x;
    if (x == NULL)
        return KVB_ERR_NOMEM;
    kvb__wblocks_t w;
    kvb_status_t st = member_blocks(eng, mb, fits, &w);
    if (st == KVB_OK)
        st = check_args(eng, mb->session_id, &w);
    if (st == KVB_OK)
        st = prepare(eng, mb->session_id, &w, setup_deadline(eng, 0), x);
    if (st == KVB_OK && (x->lane->caps & KVB__LANE_GROUPS)) {
        zip[(*nz_p)++] = x;
        return KVB_OK;
    }
    if (st == KVB_OK)
        st = submit_one(eng, x, false);
    else
        xfer_unsubmitted(x);
    if (st != KVB_OK)
        member_failed(eng, x, st);
    return st;
}

kvb_status_t kvb_engine_write_group_async(kvb_engine_h eng, const kvb_write_member_t *members,
                                          size_t count, size_t member_size,
                                          kvb_status_t *statuses_p, kvb_xfer_h *xfers_p)
{
    struct kvb_xfer *zip[KVB_WRITE_GROUP_MAX];
    size_t nz = 0, at[KVB_WRITE_GROUP_MAX];
    kvb_status_t first = KVB_OK;
    if (eng == NULL)
        return KVB_ERR_INVALID;
    if ((count > 0 && (members == NULL || statuses_p == NULL || xfers_p == NULL)) ||
        count > KVB_WRITE_GROUP_MAX || member_size < MEMBER_V1_SIZE)
        return kvb__err_set(&eng->err, KVB_ERR_INVALID,
                            "write group of %zu members of %zu bytes: invalid", count, member_size);
    for (size_t i = 0; i < count; i++) {
        kvb_write_member_t mb;
        bool fits = member_read(&mb, members, i, member_size);
        size_t nz0 = nz;
        statuses_p[i] = member_start(eng, &mb, fits, zip, &nz, &xfers_p[i]);
        if (nz > nz0)
            at[nz0] = i;
    }
    /* One submission per lane for its members (the direct lane: one hold of
     * the copy queue for them all); refused (engine stopping): each takes
     * its fallback, as a single write would. */
    for (size_t k0 = 0; k0 < nz; k0++) {
        struct kvb_xfer *g[KVB_WRITE_GROUP_MAX];
        size_t ng = 0, gi[KVB_WRITE_GROUP_MAX];
        const kvb__lane_t *lane = zip[k0] != NULL ? zip[k0]->lane : NULL;
        for (size_t k = k0; lane != NULL && k < nz; k++)
            if (zip[k] != NULL && zip[k]->lane == lane) {
                gi[ng] = at[k];
                g[ng++] = zip[k];
                zip[k] = NULL;
            }
        if (ng == 0 || lane->submit(eng, g, ng) == KVB_OK)
            continue;
        for (size_t k = 0; k < ng; k++)
            if ((statuses_p[gi[k]] = submit_one(eng, g[k], true)) != KVB_OK)
                member_failed(eng, g[k], statuses_p[gi[k]]);
    }
    for (size_t i = 0; i < count && first == KVB_OK; i++)
        first = statuses_p[i];
    return first;
}

kvb_status_t kvb_xfer_test(kvb_xfer_h x)
{
    return x == NULL ? KVB_ERR_INVALID
                     : (kvb_status_t)__atomic_load_n(&x->status, __ATOMIC_ACQUIRE);
}

kvb_status_t kvb_xfer_wait(kvb_xfer_h x, double timeout_s)
{
    kvb_status_t st;
    if (x == NULL)
        return KVB_ERR_INVALID;
    uint64_t deadline = kvb__now_ns() + (uint64_t)(timeout_s > 0 ? timeout_s * 1e9 : 0);
    pthread_mutex_lock(&x->mu);
    while ((st = (kvb_status_t)x->status) == KVB_ERR_INPROGRESS) {
        if (timeout_s <= 0) {
            pthread_cond_wait(&x->cv, &x->mu);
            continue;
        }
        if (!kvb__cond_wait_until(&x->cv, &x->mu, deadline)) {
            st = KVB_ERR_TIMEOUT;
            break;
        }
    }
    pthread_mutex_unlock(&x->mu);
    return st;
}

kvb_status_t kvb_xfer_cancel(kvb_xfer_h x)
{
    if (x == NULL)
        return KVB_ERR_INVALID;
    __atomic_store_n(&x->cancel, 1, __ATOMIC_RELEASE);
    return KVB_OK;
}

const char *kvb_xfer_error(kvb_xfer_h x)
{
    if (x == NULL || __atomic_load_n(&x->status, __ATOMIC_ACQUIRE) == KVB_ERR_INPROGRESS)
        return "";
    return x->err;
}

void kvb_xfer_free(kvb_xfer_h x)
{
    if (x == NULL)
        return;
    kvb_xfer_cancel(x);
    kvb__xfer_release(x);
}

kvb_status_t kvb__write_sync(kvb_engine_h eng, const char *sid, const kvb__wblocks_t *w,
                             double timeout_s)
{
    kvb_xfer_h x;
    uint64_t start = kvb__now_ns();
    kvb_status_t st = write_start_w(eng, sid, w, NULL, setup_deadline(eng, timeout_s), &x);
    if (st != KVB_OK)
        return st;
    /* The session set-up counts against timeout_s. */
    double left = timeout_s - (double)(kvb__now_ns() - start) / 1e9;
    st = kvb_xfer_wait(x, timeout_s > 0 ? (left > 1e-6 ? left : 1e-6) : 0);
    if (st == KVB_ERR_TIMEOUT) {
        /* Settle what was issued before returning: the caller may reuse the
         * source then. A peer that does not settle within its bound is
         * declared lost: the conn's endpoint is closed (UCX lets go of the
         * source) and the transfer fails, within the same bound. */
        kvb_xfer_cancel(x);
        if (kvb_xfer_wait(x, eng->params.peer_timeout_s) == KVB_ERR_TIMEOUT) {
            kvb__conn_kill(eng, x->conn, "a timed-out write did not settle");
            if (kvb_xfer_wait(x, eng->params.peer_timeout_s) == KVB_ERR_TIMEOUT)
                KVB_LOGE("session %s: transfer did not end after its conn was failed", sid);
        }
        kvb__err_set(&eng->err, KVB_ERR_TIMEOUT,
                     "session %s: write of %zu blocks timed out "
                     "after %.3f s",
                     sid, w->n, timeout_s);
        st = KVB_ERR_TIMEOUT;
    } else if (st != KVB_OK) {
        kvb__err_set(&eng->err, st, "%s", x->err);
    }
    kvb_xfer_free(x);
    return st;
}

kvb_status_t kvb_engine_write(kvb_engine_h eng, const char *sid, const kvb_block_t *blocks,
                              size_t count, double timeout_s)
{
    if (eng == NULL || (blocks == NULL && count > 0))
        return KVB_ERR_INVALID;
    kvb__wblocks_t w = {.plain = blocks, .n = count};
    return kvb__write_sync(eng, sid, &w, timeout_s);
}

void kvb_engine_set_writer_tag(kvb_engine_h eng, uint32_t tag)
{
    __atomic_store_n(&eng->writer_tag, tag, __ATOMIC_RELAXED);
}

/* ---- progress thread ---- */

static void finish(kvb_engine_h eng, struct kvb_xfer *x, kvb_status_t st)
{
    KVB_LOGD("engine %s: transfer %llu ends %s (%zu/%zu blocks issued, %zu messages sent, %zu "
             "acknowledged, %zu in flight)",
             eng->sid, (unsigned long long)x->id, kvb_status_string(st), x->next, x->n,
             x->msgs_sent, x->msgs_acked, x->inflight);
    struct kvb_xfer **pp = &eng->active;
    while (*pp != NULL && *pp != x)
        pp = &(*pp)->next_active;
    if (*pp == x)
        *pp = x->next_active;
    x->abandoned = 1; /* callbacks of ops still outstanding leave it alone */
    kvb__xfer_publish(x, st);
}

void kvb__xfer_publish(struct kvb_xfer *x, kvb_status_t st)
{
    pthread_mutex_lock(&x->mu);
    if (st != KVB_OK && x->err[0] == '\0')
        snprintf(x->err, sizeof(x->err), "%s", kvb_status_string(st));
    __atomic_store_n(&x->status, (int)st, __ATOMIC_RELEASE);
    pthread_cond_broadcast(&x->cv);
    pthread_mutex_unlock(&x->mu);
    kvb__xfer_release(x);
}

static void fail(struct kvb_xfer *x, kvb_status_t st, const char *fmt, const char *a, const char *b)
{
    if (x->failed)
        return;
    x->failed = 1;
    x->fail_status = st;
    pthread_mutex_lock(&x->mu);
    snprintf(x->err, sizeof(x->err), fmt, a, b);
    pthread_mutex_unlock(&x->mu);
}

void kvb__xfer_start(kvb_engine_h eng, struct kvb_xfer *x)
{
    x->id = ++eng->next_xfer_id;
    x->next_active = eng->active;
    eng->active = x;
    if (__atomic_load_n(&x->conn->dead, __ATOMIC_ACQUIRE)) {
        fail(x, KVB_ERR_PEER, "session %s: %s", x->conn->sess->sid, x->conn->why);
        x->abandoned = 1;
    }
}

typedef struct flush_op {
    kvb__op_t op;
    struct kvb_xfer *x;
} flush_op_t;

static void flush_op_release(kvb__op_t *op)
{
    kvb__xfer_release(((flush_op_t *)op)->x);
    free(op);
}

static void flush_cb(void *req, ucs_status_t status, void *user)
{
    flush_op_t *f = user;
    struct kvb_xfer *x = f->x;
    if (!x->abandoned) {
        x->inflight--;
        if (status != UCS_OK)
            fail(x, KVB_ERR_PEER, "session %s: write failed: %s", x->conn->sess->sid,
                 ucs_status_string(status));
    }
    kvb__op_untrack(x->eng, &f->op);
    flush_op_release(&f->op);
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
        void *r = ucp_put_nbx(c->ep, (void *)(uintptr_t)b->src, b->len, b->dst,
                              (ucp_rkey_h)c->segs.v[s].handle, &p);
        if (UCS_PTR_IS_ERR(r)) {
            fail(x, KVB_ERR_PEER, "session %s: put failed: %s", c->sess->sid,
                 ucs_status_string(UCS_PTR_STATUS(r)));
            break;
        }
        if (r != NULL)
            ucp_request_free(r);
    }
    if (x->abandoned)
        return; /* the connection failed inside UCX: x is final */
    flush_op_t *f = calloc(1, sizeof(*f));
    if (f == NULL) {
        fail(x, KVB_ERR_NOMEM, "%s%s", "out of memory issuing a flush", "");
        return;
    }
    f->x = x;
    f->op.release = flush_op_release;
    p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    p.cb.send = flush_cb;
    p.user_data = f;
    __atomic_add_fetch(&x->refs, 1, __ATOMIC_RELAXED);
    void *r = ucp_ep_flush_nbx(c->ep, &p);
    if (UCS_PTR_IS_PTR(r)) {
        x->inflight++;
        kvb__op_track(eng, &f->op);
        return;
    }
    if (UCS_PTR_IS_ERR(r))
        fail(x, KVB_ERR_PEER, "session %s: flush failed: %s", c->sess->sid,
             ucs_status_string(UCS_PTR_STATUS(r)));
    flush_op_release(&f->op);
}

static void am_msg_free(am_msg_t *m)
{
    kvb__op_untrack(m->x->eng, &m->op);
    kvb__xfer_release(m->x);
    free(m->hdr);
    free(m->iov);
    free(m);
}

static void am_msg_release(kvb__op_t *op)
{
    am_msg_free((am_msg_t *)op);
}

/* Take message seq out of x's window; false when it is not in it (acked
 * already, or the ack of a message whose send failed). */
static bool win_take(struct kvb_xfer *x, uint32_t seq)
{
    for (size_t i = 0; i < x->inflight && i < AM_WINDOW; i++)
        if (x->am_win[i] == seq) {
            x->am_win[i] = x->am_win[--x->inflight];
            x->am_pos[i] = x->am_pos[x->inflight];
            return true;
        }
    return false;
}

/* A message's send completed (inline, by callback, or with an immediate
 * error). A failed send gets no ack, so it leaves the window here, or the
 * transfer would wait for it until its connection dies. Which UCX errors
 * complete a send without failing the endpoint depends on the transport
 * (same-host endpoints run without peer-failure handling, where no error
 * callback follows); tests inject one through kvb__test_hooks. */
static void am_send_done(am_msg_t *m, ucs_status_t status)
{
    struct kvb_xfer *x = m->x;
    if (status == UCS_OK && KVB__HOOK(am_send_status) != 0)
        status = (ucs_status_t)KVB__HOOK(am_send_status);
    if (status != UCS_OK && !x->abandoned) { /* else the conn failed: x is final */
        win_take(x, m->seq);
        fail(x, KVB_ERR_PEER, "session %s: message send failed: %s", x->conn->sess->sid,
             ucs_status_string(status));
    }
    am_msg_free(m);
}

static void am_send_cb(void *req, ucs_status_t status, void *user)
{
    am_send_done(user, status);
    ucp_request_free(req);
}

#define AM_MAX_IOV 4096 /* source pieces gathered into one message */

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
    uint32_t magic = AM_MAGIC_WRITE, nd = (uint32_t)f.k;
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

void kvb__am_issue(kvb_engine_h eng, struct kvb_xfer *x)
{
    while (x->next < x->n && x->inflight < AM_WINDOW && !x->failed && !x->abandoned &&
           x->pos < __atomic_load_n(&x->stage_ready, __ATOMIC_ACQUIRE)) {
        size_t niov;
        uint64_t bytes;
        am_msg_t *m = am_build(eng, x, &niov, &bytes);
        if (m == NULL) {
            fail(x, KVB_ERR_NOMEM, "%s%s", "out of memory building a message", "");
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
        void *buf = contig ? m->iov[0].buffer : (void *)m->iov;
        size_t cnt = contig ? m->iov[0].length : niov;
        size_t pre = x->conn->am_auth ? KVB_HS_TOKEN_LEN : 0;
        void *r = ucp_am_send_nbx(x->conn->ep, pre > 0 ? KVB_AM_WRITE_AUTH : KVB_AM_WRITE, m->hdr,
                                  pre + AM_HDR_FIXED + m->ndesc * AM_DESC, buf, cnt, &p);
        if (UCS_PTR_IS_ERR(r) || r == NULL)
            am_send_done(m, UCS_PTR_STATUS(r));
        else
            kvb__op_track(eng, &m->op);
    }
}

/* Staged: the ring space of acknowledged messages may be reused (the
 * device-copy worker waits for it). */
static void stage_release(kvb_engine_h eng, struct kvb_xfer *x)
{
    uint64_t lo = x->pos;
    for (size_t i = 0; i < x->inflight; i++)
        lo = x->am_pos[i] < lo ? x->am_pos[i] : lo;
    if (lo > __atomic_load_n(&x->stage_free, __ATOMIC_RELAXED)) {
        __atomic_store_n(&x->stage_free, lo, __ATOMIC_RELEASE);
        kvb__jobs_kick(eng);
    }
}

static bool progress_one(kvb_engine_h eng, struct kvb_xfer *x)
{
    if (x->stage != NULL)
        stage_release(eng, x);
    if (__atomic_load_n(&x->stage_status, __ATOMIC_ACQUIRE) != KVB_OK)
        fail(x, (kvb_status_t)x->stage_status, "session %s: %s", x->conn->sess->sid, x->stage_why);
    bool stop = x->failed || __atomic_load_n(&x->cancel, __ATOMIC_ACQUIRE);
    if (x->abandoned || ((stop || x->next == x->n) && x->inflight == 0)) {
        kvb_status_t st = x->failed ? x->fail_status : stop ? KVB_ERR_CANCELED : KVB_OK;
        if (st == KVB_ERR_CANCELED)
            snprintf(x->err, sizeof(x->err), "canceled");
        finish(eng, x, st);
        return true;
    }
    if (stop || x->next == x->n)
        return false;
    size_t before = x->next;
    /* UCX may report the peer lost inside a send, which finishes x and
     * drops the engine's reference: hold one across the issue. */
    __atomic_add_fetch(&x->refs, 1, __ATOMIC_RELAXED);
    x->lane->progress(eng, x);
    bool moved = x->next != before;
    kvb__xfer_release(x);
    return moved;
}

bool kvb__xfer_progress_all(kvb_engine_h eng)
{
    bool busy = false;
    struct kvb_xfer *x = eng->active, *next;
    for (; x != NULL; x = next) {
        uint64_t failures = eng->conn_failures;
        next = x->next_active;
        busy |= progress_one(eng, x);
        if (eng->conn_failures != failures)
            return true; /* a conn failed inside UCX and finished transfers: next
                            may be gone; the next pass starts over */
    }
    return busy;
}

void kvb__xfer_fail_conn(kvb_engine_h eng, kvb__conn_t *c, const char *why)
{
    struct kvb_xfer *x = eng->active, *next;
    for (; x != NULL; x = next) {
        next = x->next_active;
        if (x->conn != c)
            continue;
        x->failed = 0;
        fail(x, KVB_ERR_PEER, "session %s: %s", c->sess->sid, why);
        x->abandoned = 1;
        finish(eng, x, KVB_ERR_PEER);
    }
}

void kvb__xfer_cancel_all(kvb_engine_h eng)
{
    while (eng->active != NULL) {
        struct kvb_xfer *x = eng->active;
        x->abandoned = 1;
        snprintf(x->err, sizeof(x->err), "engine destroyed");
        finish(eng, x, KVB_ERR_CANCELED);
    }
}

static struct kvb_xfer *find_active(kvb_engine_h eng, uint64_t id)
{
    for (struct kvb_xfer *x = eng->active; x != NULL; x = x->next_active)
        if (x->id == id)
            return x;
    return NULL;
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
    struct kvb_xfer *x = find_active(eng, xid);
    if (x == NULL || x->abandoned || !ack_from_conn(x, param) || !win_take(x, (uint32_t)mid)) {
        ack_ignored(eng, xid, mid, x); /* not a message of ours in flight */
        return UCS_OK;
    }
    x->msgs_acked++;
    if (st != KVB_OK) {
        char reason[404];
        memcpy(reason, why, rl < 400 ? rl : 400);
        reason[rl < 400 ? rl : 400] = '\0';
        fail(x,
             st == KVB_ERR_BOUNDS || st == KVB_ERR_AUTH || st == KVB_ERR_FENCED ? (kvb_status_t)st
                                                                                : KVB_ERR_PEER,
             "session %s: peer refused the write: %s", x->conn->sess->sid, reason);
    }
    return UCS_OK;
}

kvb_status_t kvb__am_register_handlers(kvb_engine_h eng)
{
    ucp_am_handler_param_t p = {0};
    p.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                   UCP_AM_HANDLER_PARAM_FIELD_ARG;
    p.arg = eng;
    if (kvb__am_target_register(eng) != KVB_OK)
        return kvb__err_set(&eng->err, KVB_ERR_IO, "cannot set the write message handlers");
    p.id = KVB_AM_ACK;
    p.cb = am_ack_cb;
    if (ucp_worker_set_am_recv_handler(eng->worker, &p) != UCS_OK)
        return kvb__err_set(&eng->err, KVB_ERR_IO, "cannot set the ack message handler");
    return KVB_OK;
}

/* ---- the UCX lanes ---- */

kvb_status_t kvb__xfer_queue(kvb_engine_h eng, struct kvb_xfer *const *xs, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        kvb__cmd_t *cmd = calloc(1, sizeof(*cmd));
        kvb_status_t st = cmd == NULL ? KVB_ERR_NOMEM : KVB_OK;
        if (st == KVB_OK) {
            cmd->kind = CMD_XFER;
            cmd->xfer = xs[i];
            st = kvb__engine_submit(eng, cmd, false);
        }
        if (st != KVB_OK) {
            free(cmd);
            return st;
        }
    }
    return KVB_OK;
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
    .progress = put_progress,
};

const kvb__lane_t kvb__lane_msg = {
    .name = "message",
    .pairs = KVB__PAIR(KVB__MEM_HOST, KVB__MEM_HOST),
    .fence = KVB__LANE_FENCE_TARGET,
    .init = kvb__am_register_handlers,
    .submit = kvb__xfer_queue,
    .progress = kvb__am_issue,
};
