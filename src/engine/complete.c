/* A write's completion, and the progress thread's list of the writes the
 * UCX lanes issue there: what the lanes call below the core. A write ends
 * once (kvb__xfer_publish: its status, its waiters woken, the engine's
 * reference dropped); the progress thread starts each queued write
 * (CMD_XFER), lets its lane issue more (lane.h, `progress`), fails it with
 * its connection and finishes it once nothing of it is in flight. */
#include "engine/engine_int.h"
#include "core/metrics.h"
#include "engine/bufpool.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void kvb__xfer_release(struct kvb_xfer *x)
{
    if (__atomic_sub_fetch(&x->refs, 1, __ATOMIC_ACQ_REL) != 0)
        return;
    kvb__conn_put(x->conn);
    if (x->stage != NULL)
        kvb__cuda_stage_put(x->stage, x->stage_len);
    free(x->staged);
    for (size_t i = 0; i < KVB__AM_WINDOW; i++) /* reads: requests never answered */
        free(x->am_iov[i]);
    kvb__bufpool_put(x->blocks, x->blocks_cap);
    kvb__bufpool_put(x->runs, x->runs_cap);
    free(x->notif);
    free(x->dg);
    free(x->dg_run0);
    pthread_mutex_destroy(&x->mu);
    pthread_cond_destroy(&x->cv);
    free(x);
}

/* A succeeded transfer with a notification: the progress thread sends it
 * (notif.c) and publishes then. False when it cannot take it (the engine
 * is stopping): the transfer ends CANCELED. */
static bool notif_defer(struct kvb_xfer *x)
{
    x->notif_sending = true;
    kvb__cmd_t *cmd = calloc(1, sizeof(*cmd));
    if (cmd != NULL) {
        cmd->kind = CMD_NOTIF;
        cmd->xfer = x;
        if (kvb__engine_submit(x->eng, cmd, false) == KVB_OK)
            return true;
    }
    free(cmd);
    snprintf(x->err, sizeof(x->err), "transfer done, notification not sent: engine stopping");
    return false;
}

/* The metrics of x's end: one call per transfer, relaxed adds. */
static void count_end(const struct kvb_xfer *x, kvb_status_t st)
{
    unsigned lane = x->lane_ix;
    unsigned out = st == KVB_OK             ? KVB__M_OK
                   : st == KVB_ERR_CANCELED ? KVB__M_CANCELED
                                            : KVB__M_FAILED;
    kvb__m_add(KVB__M_XFERS, kvb__m_lane_op_out(lane, x->read, out), 1);
    if (st != KVB_OK)
        return;
    size_t slot = kvb__m_lane_op(lane, x->read);
    uint64_t ns = kvb__now_ns() - x->t0_ns;
    kvb__m_add(KVB__M_XFER_BYTES, slot, x->bytes);
    if (x->bytes > 0)
        kvb__m_observe(KVB__M_XFER_SPEED, slot,
                       (uint64_t)((double)x->bytes * 1e9 / (double)(ns ? ns : 1)));
}

void kvb__xfer_publish(struct kvb_xfer *x, kvb_status_t st)
{
    if (st == KVB_OK && x->notif != NULL && !x->notif_sending) {
        if (notif_defer(x))
            return;
        st = KVB_ERR_CANCELED;
    }
    if (x->t0_ns != 0)
        count_end(x, st);
    pthread_mutex_lock(&x->mu);
    if (st != KVB_OK && x->err[0] == '\0')
        snprintf(x->err, sizeof(x->err), "%s", kvb_status_string(st));
    __atomic_store_n(&x->status, (int)st, __ATOMIC_RELEASE);
    pthread_cond_broadcast(&x->cv);
    pthread_mutex_unlock(&x->mu);
    kvb__xfer_release(x);
}

void kvb__xfer_fail(struct kvb_xfer *x, kvb_status_t st, const char *fmt, const char *a,
                    const char *b)
{
    if (x->failed)
        return;
    x->failed = 1;
    x->fail_status = st;
    pthread_mutex_lock(&x->mu);
    snprintf(x->err, sizeof(x->err), fmt, a, b);
    pthread_mutex_unlock(&x->mu);
}

/* rx_stopped: the worker is never progressed again, so a read's answers
 * still being received into its pieces cannot write any more (UCX writes
 * them only inside ucp_worker_progress: lane/msg/read.c). */
static void finish(kvb_engine_h eng, struct kvb_xfer *x, kvb_status_t st, bool rx_stopped)
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
    /* Ops still in flight are given up: what they carried may yet land
     * (a stopped peer resumes), so the transfer is not provably drained;
     * unless it is a read its lane gates (its answers are dropped now), and
     * none of its answers is still being received into its pieces (a read
     * waited for them, rx_waiting, up to the peer time-out). A message
     * whose send failed after UCX took it may have landed as well
     * (x->send_err, lane/msg/msg.c). */
    bool gated = x->read && (x->lane->caps & KVB__LANE_READ_GATED);
    for (size_t i = 0; x->read && i < x->inflight && i < KVB__AM_WINDOW; i++)
        if (x->am_len[i] > 0) { /* message-lane requests: out of the conn's count */
            x->conn->am_reads_out--;
            x->conn->am_read_out -= x->am_len[i];
        }
    x->unsettled = ((x->inflight > 0 || x->send_err) && !gated) || (x->am_rx > 0 && !rx_stopped);
    x->abandoned = 1; /* callbacks of ops still outstanding leave it alone */
    kvb__xfer_publish(x, st);
}

void kvb__xfer_start(kvb_engine_h eng, struct kvb_xfer *x)
{
    x->id = ++eng->next_xfer_id;
    x->next_active = eng->active;
    eng->active = x;
    if (__atomic_load_n(&x->conn->dead, __ATOMIC_ACQUIRE)) {
        kvb__xfer_fail(x, KVB_ERR_PEER, "session %s: %s", x->conn->sess->sid, x->conn->why);
        x->abandoned = 1;
    }
}

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

/* x was abandoned while answers were still being received into its pieces
 * (read.c): it ends once UCX ended those receives (closing its
 * connection's endpoint, close_dead_eps, purges them; from then on none
 * writes), or, should UCX not end them, after the peer time-out, not
 * drained. */
static bool rx_waiting(kvb_engine_h eng, const struct kvb_xfer *x)
{
    return x->abandoned && x->am_rx > 0 &&
           kvb__now_ns() - x->abandoned_ns < (uint64_t)(eng->params.peer_timeout_s * 1e9);
}

static bool progress_one(kvb_engine_h eng, struct kvb_xfer *x)
{
    if (x->stage != NULL)
        stage_release(eng, x);
    if (__atomic_load_n(&x->stage_status, __ATOMIC_ACQUIRE) != KVB_OK)
        kvb__xfer_fail(x, (kvb_status_t)x->stage_status, "session %s: %s", x->conn->sess->sid,
                       x->stage_why);
    bool stop = x->failed || __atomic_load_n(&x->cancel, __ATOMIC_ACQUIRE);
    if (rx_waiting(eng, x))
        return false;
    if (x->abandoned || ((stop || x->next == x->n) && x->inflight == 0)) {
        kvb_status_t st = x->failed ? x->fail_status : stop ? KVB_ERR_CANCELED : KVB_OK;
        if (st == KVB_ERR_CANCELED)
            snprintf(x->err, sizeof(x->err), "canceled");
        finish(eng, x, st, false);
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
        kvb__xfer_fail(x, KVB_ERR_PEER, "session %s: %s", c->sess->sid, why);
        x->abandoned = 1;
        x->abandoned_ns = kvb__now_ns();
        if (x->am_rx == 0)
            finish(eng, x, KVB_ERR_PEER, false);
        else /* progress_one ends it (rx_waiting) */
            __atomic_fetch_add(&kvb__test_hooks.read_rx_waited, 1, __ATOMIC_RELAXED);
    }
}

void kvb__xfer_cancel_all(kvb_engine_h eng, bool last)
{
    struct kvb_xfer *x = eng->active, *next;
    for (; x != NULL; x = next) {
        next = x->next_active;
        x->abandoned = 1;
        snprintf(x->err, sizeof(x->err), "engine destroyed");
        if (last || x->am_rx == 0)
            finish(eng, x, KVB_ERR_CANCELED, last);
    }
}

struct kvb_xfer *kvb__xfer_find(kvb_engine_h eng, uint64_t id)
{
    for (struct kvb_xfer *x = eng->active; x != NULL; x = x->next_active)
        if (x->id == id)
            return x;
    return NULL;
}
