/* Writes and one-sided reads, on the caller's thread: the API
 * (kvb_engine_write*, kvb_engine_read*, groups, kvb_xfer_*), the checks and
 * coalescing (runs.c), the lane choice and the submission to the chosen
 * lane (lanes.c; a lane that refuses passes the transfer to its fallback).
 * A read is a transfer with x->read set, its blocks in the engine's form
 * (local side in src, kvb__wb_at): everything here serves both; only the
 * lane op called differs. Completion: complete.c. */
#include "engine/engine_int.h"
#include "core/metrics.h"
#include "engine/bufpool.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- caller side ---- */

/* x's blocks in the form of its lane: runs (KVB__LANE_RUNS: the direct
 * lanes), else plain blocks (strided ones expanded; a read's through runs,
 * which take the engine's form, kvb__wb_at). */
static kvb_status_t build_blocks(struct kvb_xfer *x, const kvb__wblocks_t *w, const long *seg)
{
    bool runs = x->lane->caps & KVB__LANE_RUNS;
    if (!runs && w->strided == NULL && !w->read)
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
    kvb__mem_kind_t local, remote;
    kvb__mem_kinds(eng, x->conn, seg, w, &local, &remote);
    x->cuda = local == KVB__MEM_CUDA || remote == KVB__MEM_CUDA;
    /* The pair goes the bytes' way: a read's source is the peer's. */
    kvb__mem_kind_t src = x->read ? remote : local, dst = x->read ? local : remote;
    kvb__lanes_choose(eng, x, src, dst, seg, w);
    if (x->lane == NULL)
        return kvb__err_set(&eng->err, KVB_ERR_UNSUPPORTED, "session %s: no lane %s %s memory %s",
                            x->conn->sess->sid, x->read ? "reads the peer's" : "writes local",
                            src == KVB__MEM_CUDA ? "device" : "host",
                            dst == KVB__MEM_CUDA ? "into local device memory"
                            : x->read            ? "into local host memory"
                                                 : "into the peer's host memory");
    return KVB_OK;
}

/* x's bytes in its lane's form (the metrics' count: one pass over the
 * coalesced runs or blocks, once per transfer). */
static uint64_t xfer_bytes(const struct kvb_xfer *x)
{
    uint64_t b = 0;
    for (size_t i = 0; x->runs != NULL && i < x->nruns; i++)
        b += x->runs[i].len * x->runs[i].count;
    for (size_t i = 0; x->runs == NULL && x->blocks != NULL && i < x->n; i++)
        b += x->blocks[i].len;
    return b;
}

static kvb_status_t prepare(kvb_engine_h eng, const char *sid, const kvb__wblocks_t *w,
                            uint64_t deadline, struct kvb_xfer *x)
{
    size_t seg_cap = 0;
    long *seg = kvb__bufpool_get((w->n ? w->n : 1) * sizeof(*seg), &seg_cap);
    bool retry = false;
    x->read = w->read;
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
    if (st == KVB_OK && x->t0_ns != 0) {
        x->bytes = xfer_bytes(x);
        x->lane_ix = kvb__lane_index(x->lane);
    }
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
    x->read_device = -1;         /* answers placed by memcpy */
    if (params != NULL && (params->field_mask & KVB_WRITE_PARAM_EPOCH))
        x->epoch = params->epoch;
    if (params != NULL && (params->field_mask & KVB_WRITE_PARAM_DIGEST))
        x->digest_unit = params->digest_unit; /* the lane decides (kvb_xfer_digests) */
    if (params != NULL && (params->field_mask & KVB_WRITE_PARAM_NOTIF)) {
        /* never NULL, even for an empty message: x->notif says "send one" */
        x->notif = malloc(params->notif_len + 1);
        if (x->notif == NULL) {
            pthread_mutex_destroy(&x->mu);
            pthread_cond_destroy(&x->cv);
            free(x);
            return NULL;
        }
        if (params->notif_len > 0)
            memcpy(x->notif, params->notif, params->notif_len);
        x->notif_len = params->notif_len;
    }
    if (kvb__observe_on())
        x->t0_ns = kvb__now_ns();
    return x;
}

/* A transfer's notification as the caller gave it (the engine's error set). */
static kvb_status_t check_notif(kvb_engine_h eng, const kvb_write_params_t *params)
{
    if (params == NULL || !(params->field_mask & KVB_WRITE_PARAM_NOTIF))
        return KVB_OK;
    if (params->notif_len > KVB_NOTIF_MAX_LEN || (params->notif == NULL && params->notif_len > 0))
        return kvb__err_set(&eng->err, KVB_ERR_INVALID,
                            "notification of %zu bytes: at most %u, and not NULL",
                            params->notif_len, KVB_NOTIF_MAX_LEN);
    return KVB_OK;
}

/* A transfer of no blocks carrying a notification: no lane, it succeeds at
 * once and only its notification goes (complete.c defers the end). */
static kvb_status_t notif_only(struct kvb_xfer *x, const char *sid, uint64_t deadline)
{
    kvb_status_t st = kvb__session_acquire_by(x->eng, sid, false, deadline, &x->conn);
    if (st != KVB_OK)
        return st;
    kvb__xfer_publish(x, KVB_OK); /* takes the engine's reference */
    return KVB_OK;
}

static const char *op_name(bool read)
{
    return read ? "read" : "write";
}

/* The caller's arguments of one transfer, checked (the engine's error set). */
static kvb_status_t check_args(kvb_engine_h eng, const char *sid, const kvb__wblocks_t *w)
{
    if (sid == NULL || (w->plain == NULL && w->strided == NULL && w->n > 0))
        return kvb__err_set(&eng->err, KVB_ERR_INVALID, "%s without a session or blocks",
                            op_name(w->read));
    if (w->n > SIZE_MAX / sizeof(kvb__run_t)) /* the copies below would wrap */
        return kvb__err_set(&eng->err, KVB_ERR_INVALID, "%s of %zu blocks: too many",
                            op_name(w->read), w->n);
    return KVB_OK;
}

/* The op of x's lane that takes it: reads go to `read`, writes to
 * `submit` (lane choice saw to it that the one needed is set). */
static kvb_status_t (*lane_op(const struct kvb_xfer *x))(kvb_engine_h, struct kvb_xfer *const *,
                                                         size_t)
{
    return x->read ? x->lane->read : x->lane->submit;
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
    x->lane_ix = kvb__lane_index(x->lane);
    if (x->runs != NULL && !(x->lane->caps & KVB__LANE_RUNS))
        return kvb__runs_expand(x);
    return KVB_OK;
}

/* Prepared x on its lane (a group of one), or on its fallback where a lane
 * refuses it (refused: its lane already did). On failure x is unsubmitted
 * (the caller's reference left). */
static kvb_status_t submit_one(kvb_engine_h eng, struct kvb_xfer *x, bool refused)
{
    kvb_status_t st = refused ? KVB__LANE_REFUSED : lane_op(x)(eng, &x, 1);
    while (st == KVB__LANE_REFUSED)
        if ((st = to_fallback(x)) == KVB_OK)
            st = lane_op(x)(eng, &x, 1);
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
    if (st == KVB_OK)
        st = check_notif(eng, params);
    if (st != KVB_OK)
        return st;
    struct kvb_xfer *x = xfer_new(eng, params);
    if (x == NULL)
        return KVB_ERR_NOMEM;
    x->read = w->read;
    if (w->n == 0 && x->notif != NULL) {
        if ((st = notif_only(x, sid, deadline)) == KVB_OK) {
            *xfer_p = x;
            return KVB_OK;
        }
        xfer_unsubmitted(x);
        kvb__xfer_release(x);
        return st;
    }
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
                                size_t count, bool read, const kvb_write_params_t *params,
                                uint64_t deadline, kvb_xfer_h *xfer_p)
{
    if (blocks == NULL && count > 0)
        return KVB_ERR_INVALID;
    kvb__wblocks_t w = {.plain = blocks, .n = count, .read = read};
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
    return write_start(eng, sid, blocks, count, false, params, setup_deadline(eng, 0), xfer_p);
}

kvb_status_t kvb_engine_read_async(kvb_engine_h eng, const char *sid, const kvb_block_t *blocks,
                                   size_t count, kvb_xfer_h *xfer_p)
{
    return kvb_engine_read_async_ex(eng, sid, blocks, count, NULL, xfer_p);
}

kvb_status_t kvb_engine_read_async_ex(kvb_engine_h eng, const char *sid, const kvb_block_t *blocks,
                                      size_t count, const kvb_write_params_t *params,
                                      kvb_xfer_h *xfer_p)
{
    if (eng == NULL)
        return KVB_ERR_INVALID;
    return write_start(eng, sid, blocks, count, true, params, setup_deadline(eng, 0), xfer_p);
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
    bool read = mb->field_mask & KVB_WRITE_MEMBER_READ;
    *w = (kvb__wblocks_t){.plain = mb->blocks, .n = mb->count, .read = read};
    if (!fits)
        return kvb__err_set(&eng->err, KVB_ERR_INVALID,
                            "write member sets KVB_WRITE_MEMBER_STRIDED but member_size does "
                            "not reach its fields");
    if (!(mb->field_mask & KVB_WRITE_MEMBER_STRIDED))
        return KVB_OK;
    if (mb->blocks != NULL || mb->count != 0)
        return kvb__err_set(&eng->err, KVB_ERR_INVALID,
                            "write member with both plain and strided blocks");
    *w = (kvb__wblocks_t){.strided = mb->strided, .n = mb->strided_count, .read = read};
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
        st = check_notif(eng, wp);
    if (st == KVB_OK && w.n == 0 && x->notif != NULL)
        st = kvb__err_set(&eng->err, KVB_ERR_INVALID,
                          "write group member with a notification and no blocks");
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
    /* One submission per lane op for its members (the direct lane: one hold
     * of the copy queue for them all, reads and writes alike); refused
     * (engine stopping): each takes its fallback, as a single transfer
     * would. */
    for (size_t k0 = 0; k0 < nz; k0++) {
        struct kvb_xfer *g[KVB_WRITE_GROUP_MAX];
        size_t ng = 0, gi[KVB_WRITE_GROUP_MAX];
        kvb_status_t (*op)(kvb_engine_h, struct kvb_xfer *const *, size_t) =
            zip[k0] != NULL ? lane_op(zip[k0]) : NULL;
        for (size_t k = k0; op != NULL && k < nz; k++)
            if (zip[k] != NULL && lane_op(zip[k]) == op) {
                gi[ng] = at[k];
                g[ng++] = zip[k];
                zip[k] = NULL;
            }
        if (ng == 0 || op(eng, g, ng) == KVB_OK)
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
    if (x == NULL)
        return KVB_ERR_INVALID;
    kvb_status_t st = (kvb_status_t)__atomic_load_n(&x->status, __ATOMIC_ACQUIRE);
    if (st == KVB_ERR_INPROGRESS)
        kvb__poll_idle(x->eng);
    return st;
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

kvb_status_t kvb_xfer_expire(kvb_xfer_h x)
{
    if (x == NULL)
        return KVB_ERR_INVALID;
    kvb_xfer_cancel(x);
    uint64_t none = 0, at = kvb__now_ns() + (uint64_t)(x->eng->params.peer_timeout_s * 1e9);
    __atomic_compare_exchange_n(&x->expire_ns, &none, at ? at : 1, false, __ATOMIC_RELEASE,
                                __ATOMIC_RELAXED);
    return KVB_OK;
}

kvb_status_t kvb_xfer_digests(kvb_xfer_h x, const uint64_t **h_p, size_t *n_p)
{
    if (x == NULL)
        return KVB_ERR_INVALID;
    if (x->dg == NULL) /* set, or not, by the submitting call */
        return KVB_ERR_UNSUPPORTED;
    kvb_status_t st = (kvb_status_t)__atomic_load_n(&x->status, __ATOMIC_ACQUIRE);
    if (st == KVB_OK && h_p != NULL)
        *h_p = x->dg; /* written by the copy threads before the status was published */
    if (st == KVB_OK && n_p != NULL)
        *n_p = x->n_dg;
    return st;
}

const char *kvb_xfer_error(kvb_xfer_h x)
{
    if (x == NULL || __atomic_load_n(&x->status, __ATOMIC_ACQUIRE) == KVB_ERR_INPROGRESS)
        return "";
    return x->err;
}

int kvb_xfer_drained(kvb_xfer_h x)
{
    if (x == NULL || __atomic_load_n(&x->status, __ATOMIC_ACQUIRE) == KVB_ERR_INPROGRESS)
        return 0;
    return !x->unsettled; /* written before the status was published */
}

void kvb_xfer_free(kvb_xfer_h x)
{
    if (x == NULL)
        return;
    kvb_xfer_cancel(x);
    kvb__xfer_release(x);
}

kvb_status_t kvb__xfer_sync(kvb_engine_h eng, const char *sid, const kvb__wblocks_t *w,
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
         * source then. A peer that does not settle within its time-out is
         * declared lost (kvb_xfer_expire: the conn's endpoint is closed, UCX
         * lets go of the source) and the transfer fails. What that peer
         * already received may still be placed should it resume: then the
         * call says so (KVB_ERR_UNSETTLED) instead of a plain time-out. */
        kvb_xfer_expire(x);
        if (kvb_xfer_wait(x, 2 * eng->params.peer_timeout_s + 1) == KVB_ERR_TIMEOUT)
            KVB_LOGE("session %s: transfer did not end after its conn was failed", sid);
        st = kvb_xfer_drained(x) ? KVB_ERR_TIMEOUT : KVB_ERR_UNSETTLED;
        kvb__err_set(&eng->err, st, "session %s: %s of %zu blocks timed out after %.3f s%s", sid,
                     op_name(w->read), w->n, timeout_s,
                     st == KVB_ERR_UNSETTLED ? "; unsettled: the peer stopped answering with "
                                               "bytes of it in flight, which may still be placed"
                                             : "");
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
    return kvb__xfer_sync(eng, sid, &w, timeout_s);
}

kvb_status_t kvb_engine_read(kvb_engine_h eng, const char *sid, const kvb_block_t *blocks,
                             size_t count, double timeout_s)
{
    if (eng == NULL || (blocks == NULL && count > 0))
        return KVB_ERR_INVALID;
    kvb__wblocks_t w = {.plain = blocks, .n = count, .read = true};
    return kvb__xfer_sync(eng, sid, &w, timeout_s);
}

void kvb_engine_set_writer_tag(kvb_engine_h eng, uint32_t tag)
{
    __atomic_store_n(&eng->writer_tag, tag, __ATOMIC_RELAXED);
}

kvb_status_t kvb_engine_notify(kvb_engine_h eng, const char *sid, const void *msg, size_t len,
                               double timeout_s)
{
    if (eng == NULL || sid == NULL || (msg == NULL && len > 0))
        return KVB_ERR_INVALID;
    double bound = timeout_s > 0 ? timeout_s : eng->params.connect_timeout_s;
    kvb_write_params_t p = {
        .field_mask = KVB_WRITE_PARAM_NOTIF, .notif = len > 0 ? msg : "", .notif_len = len};
    kvb__wblocks_t w = {.plain = NULL, .n = 0};
    kvb_xfer_h x;
    uint64_t start = kvb__now_ns();
    kvb_status_t st = write_start_w(eng, sid, &w, &p, setup_deadline(eng, bound), &x);
    if (st != KVB_OK)
        return st;
    double left = bound - (double)(kvb__now_ns() - start) / 1e9;
    st = kvb_xfer_wait(x, left > 1e-3 ? left : 1e-3);
    if (st != KVB_OK)
        kvb__err_set(&eng->err, st, "session %s: notification: %s", sid,
                     st == KVB_ERR_TIMEOUT ? "not sent in time" : x->err);
    /* A send UCX has not completed: the connection is stuck; give it up. */
    if (st == KVB_ERR_TIMEOUT && kvb_xfer_expire(x) == KVB_OK &&
        kvb_xfer_wait(x, 2 * eng->params.peer_timeout_s + 1) == KVB_ERR_TIMEOUT)
        KVB_LOGE("session %s: notification did not end after its conn was failed", sid);
    kvb_xfer_free(x);
    return st;
}
