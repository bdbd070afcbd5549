/* The CUDA staging lane: a write with device memory on either side that
 * the CUDA IPC lane cannot take (another host, --transport tcp, an import
 * the driver refused) travels on the message lane. Its device sources are
 * staged here through a bounded pinned ring by the device-copy worker
 * (jobs.c); the target receives a message into device memory in pinned
 * memory and copies it in itself (lane/msg/target.c). A one-sided read
 * travels on the message lane's read requests: the target gathers device
 * sources with the driver (target.c), and answers for local device
 * destinations are received into pinned memory and copied in by the
 * driver (lane/msg/read.c) once this lane has marked the read so. */
#include "engine/engine_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define STAGE_CHUNK_DEFAULT (8ull << 20) /* bytes staged per step (writer) */
#define STAGE_RING_DEFAULT (64ull << 20) /* pinned bytes one transfer stages through */

extern const kvb__lane_t kvb__lane_msg;

/* The device memory holding block i's local side (its src), or NULL: host
 * memory (seg_mu held). */
static const struct kvb__cuda_seg *local_cuda(kvb_engine_h eng, const struct kvb_xfer *x, size_t i)
{
    long s = kvb__segtab_find(&eng->segs, x->blocks[i].src, x->blocks[i].len);
    return s >= 0 ? eng->segs.v[s].cuda : NULL;
}

/* x's blocks whose source is device memory, and their bytes (seg_mu held). */
static uint64_t device_sources(kvb_engine_h eng, const struct kvb_xfer *x, bool *dev)
{
    uint64_t total = 0;
    for (size_t i = 0; i < x->n; i++) {
        dev[i] = local_cuda(eng, x, i) != NULL;
        total += dev[i] ? x->blocks[i].len : 0;
    }
    return total;
}

/* ---- writer: pipelined staging of device sources through a ring ----
 * The copies device to pinned host memory run on the device-copy worker,
 * chunk by chunk, in the transfer's order; after each chunk the transfer's
 * staged mark (x->stage_ready: bytes of its blocks, in order, whose sources
 * are readable) moves on and the progress thread sends what it covers, so
 * the copy of chunk k+1 overlaps the send of chunk k. The staged bytes go
 * through a ring of KVBRIDGE_CUDA_STAGE_RING bytes (whole chunks; smaller
 * when the transfer is): a chunk is copied into its slot only once the
 * messages that carried the slot's previous bytes are acknowledged
 * (x->stage_free), so a transfer of any size pins at most the ring. */

typedef struct stage_job {
    kvb__job_t job; /* first */
    kvb_engine_h eng;
    struct kvb_xfer *x;  /* a reference, dropped by done/drop */
    kvb__cuda_copy_t *v; /* device pieces, in the transfer's order, each in one slot */
    uint64_t *at;        /* v[i]'s first byte's position in the transfer */
    uint64_t *soff;      /* v[i]'s offset in the stream of staged bytes */
    size_t nv, i;        /* pieces, next one to copy */
    size_t r;            /* pieces before it whose ring space is free again */
    uint64_t freed;      /* staged bytes whose ring space is free again */
    uint64_t total;      /* the transfer's bytes */
    uint64_t chunk;      /* bytes per step */
    int device;
} stage_job_t;

static void stage_job_free(stage_job_t *j)
{
    kvb__xfer_release(j->x);
    free(j->v);
    free(j->at);
    free(j->soff);
    free(j);
}

/* Pieces from j->i on that fit a step and whose ring slot is free. */
static size_t stage_fit(stage_job_t *j)
{
    struct kvb_xfer *x = j->x;
    uint64_t free_pos = __atomic_load_n(&x->stage_free, __ATOMIC_ACQUIRE);
    while (j->r < j->i && j->at[j->r] + j->v[j->r].len <= free_pos) {
        j->freed = j->soff[j->r] + j->v[j->r].len;
        j->r++;
    }
    size_t k = 0;
    uint64_t bytes = 0;
    while (j->i + k < j->nv && (k == 0 || bytes + j->v[j->i + k].len <= j->chunk) &&
           j->soff[j->i + k] + j->v[j->i + k].len <= j->freed + x->stage_len)
        bytes += j->v[j->i + k++].len;
    return k;
}

static int stage_step(kvb__job_t *jb) /* device-copy worker */
{
    stage_job_t *j = (stage_job_t *)jb;
    struct kvb_xfer *x = j->x;
    char why[300] = "";
    if (__atomic_load_n(&x->status, __ATOMIC_ACQUIRE) != KVB_ERR_INPROGRESS)
        return KVB__JOB_DONE; /* over (failed, canceled): nobody reads the rest */
    size_t k = stage_fit(j);
    if (k == 0)
        return KVB__JOB_BLOCKED; /* the ring is full of bytes not yet acknowledged */
    uint64_t t0 = kvb__now_ns(), bytes = 0;
    for (size_t q = 0; q < k; q++)
        bytes += j->v[j->i + q].len;
    kvb_status_t st = kvb__cuda_copy_batch(j->device, j->v + j->i, k, why, sizeof(why));
    if (st != KVB_OK) {
        snprintf(x->stage_why, sizeof(x->stage_why), "staging device sources: %s", why);
        __atomic_store_n(&x->stage_status, (int)st, __ATOMIC_RELEASE);
        kvb__jobs_wake(j->eng);
        return KVB__JOB_DONE;
    }
    j->i += k;
    uint64_t ready = j->i < j->nv ? j->at[j->i] : UINT64_MAX;
    KVB_LOGD("session %s: staged %llu bytes in %.3f ms, %llu of %llu ready", x->conn->sess->sid,
             (unsigned long long)bytes, (kvb__now_ns() - t0) / 1e6,
             (unsigned long long)(ready == UINT64_MAX ? j->total : ready),
             (unsigned long long)j->total);
    __atomic_store_n(&x->stage_ready, ready, __ATOMIC_RELEASE);
    kvb__jobs_wake(j->eng);
    return j->i < j->nv ? KVB__JOB_MORE : KVB__JOB_DONE;
}

static void stage_done(kvb_engine_h eng, kvb__job_t *jb)
{
    stage_job_free((stage_job_t *)jb);
}

/* Split x's device sources into pieces that each lie in one chunk of the
 * staged stream (so in one slot of the ring: the ring is whole chunks), and
 * mark the blocks staged (their src: an offset in that stream). */
static kvb_status_t stage_plan(stage_job_t *j, const bool *dev, uint64_t total)
{
    struct kvb_xfer *x = j->x;
    /* a piece per device block, and one more at each chunk boundary */
    size_t cap = (size_t)(total / j->chunk) + x->n + 1;
    j->v = malloc((cap ? cap : 1) * sizeof(*j->v));
    j->at = malloc((cap ? cap : 1) * sizeof(*j->at));
    j->soff = malloc((cap ? cap : 1) * sizeof(*j->soff));
    x->staged = calloc(x->n ? x->n : 1, sizeof(*x->staged));
    if (j->v == NULL || j->at == NULL || j->soff == NULL || x->staged == NULL)
        return KVB_ERR_NOMEM;
    uint64_t off = 0, pos = 0;
    for (size_t i = 0; i < x->n; i++) {
        kvb_block_t *b = &x->blocks[i];
        for (uint64_t o = 0; dev[i] && o < b->len;) {
            uint64_t room = j->chunk - (off + o) % j->chunk; /* to the chunk's end */
            uint64_t len = b->len - o < room ? b->len - o : room;
            uint64_t to = (uint64_t)(uintptr_t)x->stage + (off + o) % x->stage_len;
            j->at[j->nv] = pos + o;
            j->soff[j->nv] = off + o;
            j->v[j->nv++] = (kvb__cuda_copy_t){to, b->src + o, len};
            o += len;
        }
        if (dev[i]) {
            b->src = off;
            x->staged[i] = true;
            off += b->len;
        }
        pos += b->len;
    }
    j->total = pos;
    return KVB_OK;
}

static stage_job_t *stage_job_new(kvb_engine_h eng, struct kvb_xfer *x)
{
    stage_job_t *j = calloc(1, sizeof(*j));
    if (j == NULL)
        return NULL;
    j->job = (kvb__job_t){NULL, stage_step, stage_done, stage_done, false};
    j->eng = eng;
    j->x = x;
    __atomic_add_fetch(&x->refs, 1, __ATOMIC_RELAXED);
    int d = __atomic_load_n(&eng->cuda_device, __ATOMIC_RELAXED);
    j->device = d < 0 ? 0 : d;
    j->chunk = (uint64_t)kvb__env_int("KVBRIDGE_CUDA_STAGE_CHUNK", NULL,
                                      (int64_t)STAGE_CHUNK_DEFAULT, 4096, (int64_t)1 << 40);
    return j;
}

/* The ring for total staged bytes: whole chunks, at most
 * KVBRIDGE_CUDA_STAGE_RING (at least one chunk), no more than the bytes. */
static uint64_t stage_ring_len(uint64_t total, uint64_t chunk)
{
    uint64_t ring = (uint64_t)kvb__env_int("KVBRIDGE_CUDA_STAGE_RING", NULL,
                                           (int64_t)STAGE_RING_DEFAULT, 4096, (int64_t)1 << 40);
    ring = ring / chunk * chunk;
    if (ring < chunk)
        ring = chunk;
    uint64_t whole = (total + chunk - 1) / chunk * chunk;
    return whole < ring ? whole : ring;
}

static kvb_status_t stage_sources(kvb_engine_h eng, struct kvb_xfer *x)
{
    bool *dev = calloc(x->n ? x->n : 1, sizeof(*dev));
    if (dev == NULL)
        return KVB_ERR_NOMEM;
    pthread_mutex_lock(&eng->seg_mu);
    uint64_t total = device_sources(eng, x, dev);
    pthread_mutex_unlock(&eng->seg_mu);
    kvb_status_t st = KVB_OK;
    stage_job_t *j = NULL;
    if (total == 0)
        goto out;
    j = stage_job_new(eng, x);
    if (j == NULL) {
        st = kvb__err_set(&eng->err, KVB_ERR_NOMEM, "session %s: out of memory staging",
                          x->conn->sess->sid);
        goto out;
    }
    uint64_t ring = stage_ring_len(total, j->chunk);
    x->stage = kvb__cuda_stage_get(ring);
    if (x->stage == NULL) {
        st = kvb__err_set(&eng->err, KVB_ERR_NOMEM,
                          "session %s: no %llu bytes of pinned memory "
                          "to stage device sources",
                          x->conn->sess->sid, (unsigned long long)ring);
        goto out;
    }
    x->stage_len = ring;
    st = stage_plan(j, dev, total);
    if (st != KVB_OK) {
        kvb__err_set(&eng->err, st, "session %s: out of memory staging device sources",
                     x->conn->sess->sid);
        goto out;
    }
    x->stage_ready = 0; /* nothing readable before the first chunk */
    x->stage_job = j;
    j = NULL;
out:
    if (j != NULL)
        stage_job_free(j);
    free(dev);
    return st;
}

static void stage_start(kvb_engine_h eng, struct kvb_xfer *x)
{
    stage_job_t *j = x->stage_job;
    x->stage_job = NULL;
    if (j == NULL || kvb__jobs_push(eng, &j->job))
        return;
    /* no worker (the engine is stopping): here, as far as the ring allows
     * (nothing is sent now: the transfer fails with the engine) */
    while (stage_step(&j->job) == KVB__JOB_MORE)
        ;
    stage_job_free(j);
}

static void stage_abandon(struct kvb_xfer *x)
{
    if (x->stage_job != NULL)
        stage_job_free(x->stage_job);
    x->stage_job = NULL;
}

/* Stage x's device sources through a pinned ring (the device-copy worker
 * copies them, chunk by chunk) and send it on the message lane; the target
 * stages device destinations itself. */
static kvb_status_t stage_submit(kvb_engine_h eng, struct kvb_xfer *const *xs, size_t n)
{
    struct kvb_xfer *x = xs[0];
    kvb_status_t st = stage_sources(eng, x);
    if (st == KVB_OK)
        st = kvb__lane_msg.submit(eng, xs, n);
    if (st != KVB_OK) {
        stage_abandon(x); /* drops the plan's reference */
        return st;
    }
    stage_start(eng, x); /* staged sources: the copies begin */
    return KVB_OK;
}

/* A read of the peer's memory with device memory on either side: the
 * message lane's read, its answers placed with the driver when a local
 * destination (a read's src, the engine's form) is device memory. */
static kvb_status_t stage_read(kvb_engine_h eng, struct kvb_xfer *const *xs, size_t n)
{
    struct kvb_xfer *x = xs[0];
    pthread_mutex_lock(&eng->seg_mu);
    for (size_t i = 0; i < x->n && x->read_device < 0; i++) {
        const struct kvb__cuda_seg *cs = local_cuda(eng, x, i);
        x->read_device = cs != NULL ? cs->device : -1;
    }
    pthread_mutex_unlock(&eng->seg_mu);
    return kvb__lane_msg.read(eng, xs, n);
}

/* Sent as the message lane sends, as far as it is staged. */
static void stage_progress(kvb_engine_h eng, struct kvb_xfer *x)
{
    kvb__lane_msg.progress(eng, x);
}

const kvb__lane_t kvb__lane_cuda_stage = {
    .name = "cuda-staging",
    .pairs = KVB__PAIRS_DEVICE,
    .caps = KVB__LANE_READ_GATED, /* its reads are the message lane's */
    .fence = KVB__LANE_FENCE_TARGET,
    .submit = stage_submit,
    .read = stage_read,
    .progress = stage_progress,
};
