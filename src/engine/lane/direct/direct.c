/* Direct lane: on one host, when the target's memory lives in kvb_mem_alloc
 * files, the writer maps those files and its copy threads write the blocks
 * straight into them: one copy, done by the writer, no work on the target.
 * One-sided reads take the same path the other way: the copy threads copy
 * out of the mapping into local memory, admitted by the same fence.
 * The target still bounds every write (only advertised segments are mapped,
 * every block was checked against them) and still fences writers: each unit
 * is admitted against the target's shared fence page, and counted there
 * while it is copied, so a revoke waits for it (fence.c). */
#include "engine/lane/direct/direct.h"
#include "engine/lane/direct/copy_stream.h"
#include "core/hash.h"

#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/mman.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#define DIRECT_UNIT (1u << 20) /* bytes a copy thread takes at a time */
/* CUDA transfers: a unit is one batch of driver copies and one stream
 * synchronisation (the fence's busy count spans it), so larger. */
#define CUDA_UNIT (16u << 20)
#define DIRECT_MAX_FILES 4096 /* shared files one connection maps */
#define STREAM_MIN 512        /* blocks this long are copied with streaming stores */

/* ---- target side: what the handshake offers a same-host writer ---- */

/* The segments that live in shared files, then the fence page (seg_mu
 * held). None when nothing is shared or the fence page cannot be made. */
static kvb_status_t reply_shared(kvb_engine_h eng, kvb__hs_reply_t *r)
{
    size_t n = eng->n_cuda_segs; /* imported over CUDA IPC: fenced by the page too */
    for (size_t i = 0; i < eng->segs.n; i++)
        n += eng->segs.v[i].shared;
    if (n == 0 || kvb__fence_page_ensure(eng) != KVB_OK)
        return KVB_OK;
    r->shm = calloc(n + 1, sizeof(*r->shm)); /* n: at least the shared ones */
    if (r->shm == NULL)
        return KVB_ERR_NOMEM;
    for (size_t i = 0; i < eng->segs.n; i++)
        if (eng->segs.v[i].shared)
            r->shm[r->nshm++] = (kvb__hs_shm_t){(uint32_t)i, eng->segs.v[i].ref};
    r->shm[r->nshm++] = (kvb__hs_shm_t){KVB_HS_SHM_FENCE, eng->fence.ref};
    r->pid = (uint32_t)getpid();
    return KVB_OK;
}

static kvb_status_t direct_advertise(kvb_engine_h eng, kvb__hs_reply_t *r, bool local,
                                     uint32_t caps)
{
    return local ? reply_shared(eng, r) : KVB_OK;
}

/* ---- writer side: mappings ---- */

/* The largest file the peer may ask us to map for entry e: the end of the
 * last advertised segment that lives in the same file, page-rounded, plus
 * the trailer and KVBRIDGE_DIRECT_MAP_SLACK. A sealed sparse file far larger
 * than what it advertises is refused (the UCX lanes still serve). */
static uint64_t file_cap(kvb_engine_h eng, const kvb__hs_reply_t *r, const kvb__hs_shm_t *e)
{
    uint64_t end = 0;
    for (uint32_t i = 0; i + 1 < r->nshm; i++) {
        const kvb__hs_shm_t *o = &r->shm[i];
        if (o->ref.dev != e->ref.dev || o->ref.ino != e->ref.ino || o->seg >= r->nseg)
            continue;
        uint64_t x = o->ref.file_off + r->segs[o->seg].len;
        end = x > end ? x : end;
    }
    end = (end + KVB_SHM_TRAILER - 1) / KVB_SHM_TRAILER * KVB_SHM_TRAILER;
    return end + KVB_SHM_TRAILER + eng->direct->slack;
}

static uint8_t *map_file(kvb_engine_h eng, kvb__conn_t *c, uint32_t pid, const kvb__shm_ref_t *ref,
                         uint64_t max_size, char *why, size_t wl)
{
    for (size_t i = 0; i < c->direct->nmaps; i++)
        if (c->direct->maps[i].dev == ref->dev && c->direct->maps[i].ino == ref->ino)
            return c->direct->maps[i].size == ref->file_size ? c->direct->maps[i].base : NULL;
    if (c->direct->nmaps == DIRECT_MAX_FILES) {
        snprintf(why, wl, "more than %d shared files", DIRECT_MAX_FILES);
        return NULL;
    }
    if (c->direct->nmaps == c->direct->cap_maps) {
        size_t cap = c->direct->cap_maps ? c->direct->cap_maps * 2 : 8;
        void *v = realloc(c->direct->maps, cap * sizeof(*c->direct->maps));
        if (v == NULL)
            return NULL;
        c->direct->maps = v;
        c->direct->cap_maps = cap;
    }
    if (ref->file_size > max_size) {
        __atomic_add_fetch(&eng->direct->refused, 1, __ATOMIC_RELAXED);
        snprintf(why, wl, "file of %llu bytes for %llu advertised (KVBRIDGE_DIRECT_MAP_SLACK)",
                 (unsigned long long)ref->file_size, (unsigned long long)max_size);
        return NULL;
    }
    /* Prefault only while this connection's total stays bounded: populate
     * allocates every page of a sparse file. With the background warmer on,
     * not here at all: it warms the allocated pages after the attach. */
    bool populate = eng->direct->warm == NULL &&
                    c->direct->populated + ref->file_size <= eng->direct->populate_max;
    if (!populate) /* past the budget, or left to the warmer */
        __atomic_add_fetch(&eng->direct->unpopulated, 1, __ATOMIC_RELAXED);
    uint8_t *m = kvb__shm_map_peer((int32_t)pid, ref, true, populate, why, wl);
    if (m != NULL) {
        c->direct->maps[c->direct->nmaps++] = (kvb__map_t){m, ref->file_size, ref->dev, ref->ino};
        c->direct->populated += populate ? ref->file_size : 0;
    }
    return m;
}

void kvb__direct_attach(kvb_engine_h eng, kvb__conn_t *c, const kvb__hs_reply_t *r)
{
    char why[256] = "no fence page advertised";
    uint32_t mapped = 0;
    uint64_t t0 = kvb__now_ns(), bytes = 0;
    /* Nothing shared or in device memory (or no fence page: writes could not
     * be fenced). Only device memory: the page alone. */
    if (r->nshm < 1 || r->shm[r->nshm - 1].seg != KVB_HS_SHM_FENCE)
        return;
    c->direct = calloc(1, sizeof(*c->direct));
    if (c->direct == NULL) {
        KVB_LOGI("engine %s: session %s: no direct lane (out of memory)", eng->sid, c->sess->sid);
        return;
    }
    /* Writable: a unit in progress is counted in its grant's slot (fence.c). */
    const kvb__shm_ref_t *fref = &r->shm[r->nshm - 1].ref;
    snprintf(why, sizeof(why), "advertised with %llu bytes, not %u",
             (unsigned long long)fref->file_size, KVB_HS_FENCE_FILE);
    c->fence = fref->file_size != KVB_HS_FENCE_FILE
                   ? NULL
                   : kvb__shm_map_peer((int32_t)r->pid, fref, true, true, why, sizeof(why));
    if (c->fence == NULL) {
        KVB_LOGI("engine %s: session %s: no direct lane (fence page: %s)", eng->sid, c->sess->sid,
                 why);
        return;
    }
    for (uint32_t i = 0; i + 1 < r->nshm; i++) {
        const kvb__hs_shm_t *e = &r->shm[i];
        kvb__seg_t *s = kvb__segtab_at(&c->segs, r->segs[e->seg].addr);
        uint8_t *m = s == NULL
                         ? NULL
                         : map_file(eng, c, r->pid, &e->ref, file_cap(eng, r, e), why, sizeof(why));
        if (m == NULL) {
            KVB_LOGD("engine %s: session %s segment %u not mapped: %s", eng->sid, c->sess->sid,
                     e->seg, why);
            continue;
        }
        s->direct = m + e->ref.file_off;
        mapped++;
    }
    for (size_t i = 0; i < c->direct->nmaps; i++) {
        bytes += c->direct->maps[i].size;
        kvb__warm_add(eng, c, c->direct->maps[i].base, c->direct->maps[i].size);
    }
    KVB_LOGI("engine %s: session %s: direct lane for %u of %zu segments (%zu files, %.1f MiB "
             "mapped in %.1f ms)",
             eng->sid, c->sess->sid, mapped, c->segs.n, c->direct->nmaps, (double)bytes / (1 << 20),
             (double)(kvb__now_ns() - t0) / 1e6);
}

void kvb__direct_detach(kvb__conn_t *c)
{
    for (size_t i = 0; c->direct != NULL && i < c->direct->nmaps; i++)
        munmap(c->direct->maps[i].base, c->direct->maps[i].size);
    if (c->direct != NULL)
        free(c->direct->maps);
    free(c->direct);
    c->direct = NULL;
    if (c->fence != NULL)
        munmap((void *)c->fence, KVB_HS_FENCE_FILE);
    c->fence = NULL;
}

bool kvb__direct_usable(kvb_engine_h eng, const kvb__conn_t *c, uint64_t epoch, const long *dst_seg,
                        const kvb__wblocks_t *w)
{
    /* Fenced or unknown: the message lane, whose target decides. */
    if (c->fence == NULL ||
        kvb__fence_check(c, __atomic_load_n(&eng->writer_tag, __ATOMIC_RELAXED), epoch) != FENCE_NO)
        return false;
    for (size_t i = 0; i < w->n; i++) /* empty blocks: -1 */
        if (dst_seg[i] >= 0 && c->segs.v[dst_seg[i]].direct == NULL)
            return false;
    return true;
}

/* ---- copy threads ---- */

static void copy_block(uint8_t *d, const uint8_t *s, size_t n, bool stream)
{
#if defined(__x86_64__)
    if (stream && n >= STREAM_MIN) {
        kvb__copy_stream(d, s, n);
        return;
    }
#endif
    (void)stream;
    memcpy(d, s, n);
}

/* Streaming stores are weakly ordered: drain them before the unit counts
 * as done (the completion is then published under the transfer's mutex). */
static void store_fence(void)
{
#if defined(__x86_64__)
    _mm_sfence();
#endif
}

/* A CUDA unit: copies v[0..n) (one batch of driver copies) and waits for them. */
static kvb_status_t cuda_unit(kvb_engine_h eng, const kvb__cuda_copy_t *v, size_t n, char *why,
                              size_t wl)
{
    int d = __atomic_load_n(&eng->cuda_device, __ATOMIC_RELAXED);
    return kvb__cuda_copy_batch(d < 0 ? 0 : d, v, n, why, wl);
}

/* ---- groups and units ----
 * Every direct-lane submission is a group: a lone write is a group of one;
 * kvb_engine_write_group_async queues several writes as one. A member's
 * bytes are runs (kvb__run_t: rows of len bytes at a stride; a contiguous
 * block is one row), and its rows are numbered through its runs in order.
 * The copy threads take a group's bytes in zip order: row r of member 0,
 * row r of member 1, ..., then row r + 1 (a member with fewer rows drops
 * out; a row longer than a unit's budget is split). Members that read the
 * same source rows in the same order (one prefill page split between
 * decode ranks: member k gets the k-th slice of every row) thereby read
 * the source once, sequentially: reading a 1 KiB half of each 2 KiB row
 * costs as much memory traffic as the whole row, so one write per half
 * copies at half speed (bench/results/hotpath.md). Rows, not runs, are
 * zipped because members' runs need not line up: each decode rank's pages
 * are its own, so where one member's pages happen to be consecutive (one
 * run of 32 rows) another's are not (two runs of 16). */

_Static_assert(KVB_WRITE_GROUP_MAX <= 64, "a group's members are bits of a uint64_t");

typedef struct zpos {
    uint64_t row; /* row of each member */
    size_t k;     /* member */
    uint64_t off; /* bytes of that row before this position */
} zpos_t;

/* Where a member's row is: its run and the row in that run. */
typedef struct mcur {
    size_t run;
    uint64_t row;
} mcur_t;

struct kvb__dgroup {
    struct kvb__dgroup *next; /* the copy queue (dmu) */
    size_t n;                 /* members */
    uint64_t rows;            /* the most rows of any member */
    bool cuda;                /* its one member is a CUDA transfer */
    zpos_t cur;               /* dmu: the next byte to claim */
    /* dmu: members not yet published (bit k). A published member may be
     * freed by its caller at once: nothing reads it after. At 0 the group
     * is freed. */
    uint64_t live;
    mcur_t mc[KVB_WRITE_GROUP_MAX]; /* dmu: member k's row cur.row (or next) */
    struct kvb_xfer *m[];
};

/* A unit: the stretch [from, to) of its group's zip order, copied for the
 * members in mask (queued when it was claimed; each counted busy), whose
 * rows at from are at[k]. */
typedef struct unit {
    kvb__dgroup_t *g;
    zpos_t from, to;
    uint64_t mask;
    size_t pieces; /* rows it touches (a CUDA unit's batch size) */
    mcur_t at[KVB_WRITE_GROUP_MAX];
} unit_t;

static bool zpos_before(const zpos_t *a, const zpos_t *b)
{
    if (a->row != b->row)
        return a->row < b->row;
    return a->k != b->k ? a->k < b->k : a->off < b->off;
}

static void zpos_next(const kvb__dgroup_t *g, zpos_t *p)
{
    p->off = 0;
    if (++p->k == g->n) {
        p->k = 0;
        p->row++;
    }
}

/* Past the row c names in x's runs (x must not be freed meanwhile). */
static void mcur_next(const struct kvb_xfer *x, mcur_t *c)
{
    if (++c->row == x->runs[c->run].count) {
        c->run++;
        c->row = 0;
    }
}

/* Bytes a unit takes: CUDA groups have one member (kvb__direct_submit). */
static uint64_t unit_bytes(const kvb__dgroup_t *g)
{
    return g->cuda ? CUDA_UNIT : DIRECT_UNIT;
}

/* Bytes of a row of which left remain that a unit with budget bytes left
 * takes: the budget, cut to whole hash units where x is hashed (they are
 * hashed whole, by the thread that copies them; at least one). */
static uint64_t unit_cut(const struct kvb_xfer *x, uint64_t budget, uint64_t left)
{
    uint64_t u = x->digest_unit;
    if (x->dg == NULL)
        return budget;
    uint64_t cut = budget >= u ? budget - budget % u : u;
    return cut < left ? cut : left;
}

/* Claim g's next unit (dmu held): up to a unit's bytes of its queued
 * members, from the cursor on, which moves past them. Only live, queued
 * members' cursors move (the others are never claimed again). */
static void claim_unit(kvb__dgroup_t *g, unit_t *u)
{
    uint64_t budget = unit_bytes(g);
    u->g = g;
    u->from = g->cur;
    u->mask = 0;
    u->pieces = 0;
    memcpy(u->at, g->mc, g->n * sizeof(g->mc[0]));
    while (g->cur.row < g->rows && budget > 0) {
        size_t k = g->cur.k;
        const struct kvb_xfer *x = g->m[k];
        if ((g->live >> k & 1) && x->queued && g->cur.row < x->nrows) {
            uint64_t left = x->runs[g->mc[k].run].len - g->cur.off;
            uint64_t take = left > budget ? unit_cut(x, budget, left) : left;
            u->mask |= 1ull << k;
            u->pieces++;
            if (take < left) {
                g->cur.off += take;
                break;
            }
            budget -= take < budget ? take : budget;
            mcur_next(x, &g->mc[k]);
        }
        zpos_next(g, &g->cur);
    }
    u->to = g->cur;
}

/* Has g's cursor passed the last byte of member k? */
static bool member_claimed(const kvb__dgroup_t *g, size_t k)
{
    uint64_t n = g->m[k]->nrows;
    return n == 0 || g->cur.row > n - 1 || (g->cur.row == n - 1 && g->cur.k > k);
}

/* A write's bytes [off, end) of row c (whole hash units where x is hashed:
 * unit_cut): copied to d from src; where x is hashed each unit is hashed
 * from its source right after its copy, while that is in cache, into its
 * own slot (units of one transfer go to several copy threads; the slots
 * are read after the transfer's end is published). */
static void write_piece(const struct kvb_xfer *x, const mcur_t *c, uint8_t *d, uint64_t src,
                        uint64_t off, uint64_t end, bool stream)
{
    const uint8_t *s = (const uint8_t *)(uintptr_t)src;
    if (x->dg == NULL) {
        copy_block(d, s, end - off, stream);
        return;
    }
    const kvb__run_t *r = &x->runs[c->run];
    uint64_t u = x->digest_unit, at = x->dg_run0[c->run] + c->row * (r->len / u) + off / u;
    uint64_t dst = r->dst + c->row * r->dstride + off;
    for (uint64_t o = 0; o < end - off; o += u, at++) {
        copy_block(d + o, s + o, u, stream);
        x->dg[at] = kvb__item_hash(s + o, u, dst + o);
    }
    __atomic_add_fetch(&kvb__test_hooks.digest_items, (unsigned)((end - off) / u),
                       __ATOMIC_RELAXED);
}

/* Copy u's bytes of the members in admitted (a subset of u->mask: busy,
 * so their runs stay). CUDA transfers (a source or destination in device
 * memory, destinations imported over CUDA IPC; always alone in their
 * group) are collected into one batch of driver copies and waited for.
 * Every run was checked to lie in its mapped destination segment at
 * submission. */
static kvb_status_t copy_unit(kvb_engine_h eng, unit_t *u, uint64_t admitted, char *why, size_t wl)
{
    const kvb__dgroup_t *g = u->g;
    kvb__cuda_copy_t *v = NULL;
    size_t nv = 0;
    if (g->cuda && (v = malloc(u->pieces * sizeof(*v))) == NULL) {
        snprintf(why, wl, "out of memory");
        return KVB_ERR_NOMEM;
    }
    int stall_ms = __atomic_exchange_n(&kvb__test_hooks.direct_stall_ms, 0, __ATOMIC_RELAXED);
    if (stall_ms > 0) /* tests only: a copy that does not end for a while */
        usleep((useconds_t)stall_ms * 1000);
    for (zpos_t p = u->from; zpos_before(&p, &u->to); zpos_next(g, &p)) {
        const struct kvb_xfer *x = g->m[p.k];
        if (!(admitted >> p.k & 1) || p.row >= x->nrows)
            continue;
        mcur_t *c = &u->at[p.k];
        const kvb__run_t *r = &x->runs[c->run];
        bool last = p.row == u->to.row && p.k == u->to.k;
        uint64_t end = last ? u->to.off : r->len;
        const kvb__seg_t *s = &x->conn->segs.v[r->seg];
        uint8_t *d = s->direct + (r->dst + c->row * r->dstride - s->addr) + p.off;
        uint64_t src = r->src + c->row * r->sstride + p.off;
        if (v != NULL && x->read) /* runs name the local side src: the bytes go there */
            v[nv++] = (kvb__cuda_copy_t){src, (uint64_t)(uintptr_t)d, end - p.off};
        else if (v != NULL)
            v[nv++] = (kvb__cuda_copy_t){(uint64_t)(uintptr_t)d, src, end - p.off};
        else if (x->read)
            copy_block((uint8_t *)(uintptr_t)src, d, end - p.off, eng->direct->stream_copy);
        else {
            write_piece(x, c, d, src, p.off, end, eng->direct->stream_copy);
            if (end - p.off >= KVB__FLIP_MIN && kvb__hook_take(&kvb__test_hooks.flip_in_flight))
                d[0] ^= 0x01;
        }
        if (!last)
            mcur_next(x, c);
    }
    kvb_status_t st = v != NULL ? cuda_unit(eng, v, nv, why, wl) : KVB_OK;
    free(v);
    store_fence();
    return st;
}

/* The queue (dmu held): groups with units left, linked by next. */
static void dq_push(kvb_engine_h eng, kvb__dgroup_t *g)
{
    g->next = NULL;
    if (eng->direct->dq_tail != NULL)
        eng->direct->dq_tail->next = g;
    else
        eng->direct->dq_head = g;
    eng->direct->dq_tail = g;
}

static void dq_pop(kvb_engine_h eng)
{
    kvb__dgroup_t *g = eng->direct->dq_head;
    eng->direct->dq_head = g->next;
    if (eng->direct->dq_head == NULL)
        eng->direct->dq_tail = NULL;
    g->next = NULL;
}

static void set_failure(struct kvb_xfer *x, kvb_status_t st, const char *why)
{
    if (x->failed)
        return;
    x->failed = 1;
    x->fail_status = st;
    pthread_mutex_lock(&x->mu);
    snprintf(x->err, sizeof(x->err), "session %s: %s", x->conn->sess->sid, why);
    pthread_mutex_unlock(&x->mu);
}

/* Mark x failed when it must stop issuing (dmu held). */
static void check_stop(kvb_engine_h eng, struct kvb_xfer *x)
{
    if (eng->direct->dstop)
        set_failure(x, KVB_ERR_CANCELED, "engine stopping");
    else if (__atomic_load_n(&x->conn->dead, __ATOMIC_ACQUIRE))
        set_failure(x, KVB_ERR_PEER, x->conn->why);
    else if (__atomic_load_n(&x->cancel, __ATOMIC_ACQUIRE))
        set_failure(x, KVB_ERR_CANCELED, "transfer cancelled");
}

/* A member's fence answer at a unit. It was admitted at submission
 * (kvb__direct_usable), and a slot is freed only once revoked and drained
 * and epochs are never reused (fence.c): so a grant the page no longer
 * lists was revoked too. Only the legacy tag list (epoch 0) can be
 * unknown for another reason (it overflowed). */
static void fence_failure(struct kvb_xfer *x, fence_state_t fs)
{
    if (fs == FENCE_YES || (fs == FENCE_UNKNOWN && x->epoch != 0))
        set_failure(x, KVB_ERR_FENCED,
                    "writer fenced: the target revoked this writer's grant (declared it "
                    "lost or ended its rooms)");
    else if (fs == FENCE_UNKNOWN)
        set_failure(x, KVB_ERR_PEER,
                    "the target's fence page cannot say whether this writer's tag is fenced "
                    "(its list overflowed): retry (new writes take the message lane, whose "
                    "target decides)");
}

/* Copy unit u (dmu not held). Every member of the unit enters its target's
 * fence first (the target's revoke waits for units between enter and exit);
 * only the admitted ones are copied, and all of them exit after the store
 * fence. fs[k]: member k's fence answer; returns the copy's status (CUDA). */
static kvb_status_t run_unit(kvb_engine_h eng, unit_t *u, fence_state_t *fs, char *why, size_t wl)
{
    int32_t slot[KVB_WRITE_GROUP_MAX];
    uint64_t admitted = 0;
    uint32_t tag = __atomic_load_n(&eng->writer_tag, __ATOMIC_RELAXED);
    kvb_status_t st = KVB_OK;
    for (size_t k = 0; k < u->g->n; k++) {
        const struct kvb_xfer *x = u->g->m[k];
        if ((u->mask >> k & 1) &&
            (fs[k] = kvb__fence_enter(x->conn, tag, x->epoch, &slot[k])) == FENCE_NO)
            admitted |= 1ull << k;
    }
    if (admitted != 0)
        st = copy_unit(eng, u, admitted, why, wl);
    for (size_t k = 0; k < u->g->n; k++)
        if (admitted >> k & 1)
            kvb__fence_exit(u->g->m[k]->conn, slot[k]);
    return st;
}

/* Publish every member of g that is done (dmu held; dropped around the
 * wake-ups). The last one frees g: no unit of g is in progress then (each
 * counts its members busy) and g is off the queue (no member queued). */
static void publish_done(kvb__dgroup_t *g, kvb_engine_h eng)
{
    struct kvb_xfer *done[KVB_WRITE_GROUP_MAX];
    size_t nd = 0;
    for (size_t k = 0; k < g->n; k++) {
        struct kvb_xfer *x = g->m[k];
        if ((g->live >> k & 1) && !x->queued && x->busy == 0) {
            g->live &= ~(1ull << k);
            done[nd++] = x;
        }
    }
    if (nd == 0)
        return;
    bool last = g->live == 0;
    pthread_mutex_unlock(&eng->direct->dmu);
    for (size_t i = 0; i < nd; i++)
        kvb__xfer_publish(done[i], done[i]->failed ? done[i]->fail_status : KVB_OK);
    if (last)
        free(g);
    pthread_mutex_lock(&eng->direct->dmu);
}

/* One pass of a copy thread with dmu held; false when it should sleep. The
 * head group gives one unit and goes to the back of the queue: groups (to
 * every session) advance in turn, so a large one does not hold up the
 * others, and each member's cancel and dead-connection checks run once per
 * round instead of only when its group reaches the head. */
static bool copy_step(kvb_engine_h eng)
{
    kvb__dgroup_t *g = eng->direct->dq_head;
    unit_t u;
    bool more = false;
    if (g == NULL)
        return false;
    for (size_t k = 0; k < g->n; k++) {
        struct kvb_xfer *x = g->m[k];
        if (!(g->live >> k & 1))
            continue;
        if (x->queued)
            check_stop(eng, x);
        if (x->failed) /* not one more unit of it is claimed */
            x->queued = 0;
    }
    claim_unit(g, &u);
    for (size_t k = 0; k < g->n; k++) {
        struct kvb_xfer *x = g->m[k];
        if (!(g->live >> k & 1))
            continue;
        x->busy += u.mask >> k & 1;
        if (x->failed || member_claimed(g, k))
            x->queued = 0;
        more |= x->queued != 0;
    }
    dq_pop(eng);
    if (more)
        dq_push(eng, g);
    if (u.mask != 0) {
        fence_state_t fs[KVB_WRITE_GROUP_MAX];
        char why[300];
        pthread_mutex_unlock(&eng->direct->dmu);
        kvb_status_t st = run_unit(eng, &u, fs, why, sizeof(why));
        pthread_mutex_lock(&eng->direct->dmu);
        for (size_t k = 0; k < g->n; k++) {
            if (!(u.mask >> k & 1))
                continue;
            g->m[k]->busy--;
            if (st != KVB_OK)
                set_failure(g->m[k], st, why);
            fence_failure(g->m[k], fs[k]);
        }
    }
    publish_done(g, eng);
    return true;
}

static void *copy_main(void *arg)
{
    kvb_engine_h eng = arg;
    pthread_mutex_lock(&eng->direct->dmu);
    while (!(eng->direct->dstop && eng->direct->dq_head == NULL))
        if (!copy_step(eng) && !eng->direct->dstop)
            pthread_cond_wait(&eng->direct->dcv, &eng->direct->dmu);
    pthread_mutex_unlock(&eng->direct->dmu);
    return NULL;
}

/* dmu held. */
static bool start_threads(kvb_engine_h eng)
{
    size_t n = eng->params.copy_threads;
    if (eng->direct->n_dthr > 0)
        return true;
#if defined(__x86_64__)
    eng->direct->stream_copy = __builtin_cpu_supports("avx2");
#endif
    eng->direct->dthr = calloc(n, sizeof(*eng->direct->dthr));
    for (size_t i = 0; eng->direct->dthr != NULL && i < n; i++)
        if (pthread_create(&eng->direct->dthr[eng->direct->n_dthr], NULL, copy_main, eng) == 0)
            eng->direct->n_dthr++;
    return eng->direct->n_dthr > 0;
}

static void digest_drop(struct kvb_xfer *x)
{
    free(x->dg);
    free(x->dg_run0);
    x->dg = x->dg_run0 = NULL;
    x->n_dg = 0;
}

/* A write that asked for item hashes (KVB_WRITE_PARAM_DIGEST) gets a slot
 * per unit when it is host memory and every run is whole units; else none,
 * and kvb_xfer_digests says so (the caller hashes the sources itself). */
static void digest_prepare(struct kvb_xfer *x)
{
    uint64_t u = x->digest_unit, n = 0;
    if (u == 0 || x->read || x->cuda)
        return;
    for (size_t i = 0; i < x->nruns; i++) {
        if (x->runs[i].len % u != 0)
            return;
        n += x->runs[i].count * (x->runs[i].len / u); /* at most the bytes: no wrap */
    }
    x->dg = malloc((n ? n : 1) * sizeof(*x->dg));
    x->dg_run0 = malloc((x->nruns ? x->nruns : 1) * sizeof(*x->dg_run0));
    if (x->dg == NULL || x->dg_run0 == NULL || n > SIZE_MAX / sizeof(*x->dg)) {
        digest_drop(x); /* not hashed: the caller does it */
        return;
    }
    x->n_dg = (size_t)n;
    for (size_t i = 0, at = 0; i < x->nruns; i++) {
        x->dg_run0[i] = at;
        at += x->runs[i].count * (x->runs[i].len / u);
    }
}

bool kvb__direct_submit(kvb_engine_h eng, struct kvb_xfer *const *xs, size_t n)
{
    kvb__dgroup_t *g = malloc(sizeof(*g) + n * sizeof(*xs));
    if (g == NULL || n == 0 || n > KVB_WRITE_GROUP_MAX) {
        free(g);
        return false;
    }
    *g = (kvb__dgroup_t){
        .n = n, .cuda = xs[0]->cuda, .live = n == 64 ? UINT64_MAX : (1ull << n) - 1};
    for (size_t k = 0; k < n; k++) {
        g->m[k] = xs[k];
        g->rows = xs[k]->nrows > g->rows ? xs[k]->nrows : g->rows;
    }
    for (size_t k = 0; k < n; k++)
        digest_prepare(xs[k]);
    pthread_mutex_lock(&eng->direct->dmu);
    bool ok = !eng->direct->dstop && start_threads(eng);
    if (ok) {
        for (size_t k = 0; k < n; k++)
            xs[k]->queued = 1;
        dq_push(eng, g);
        pthread_cond_broadcast(&eng->direct->dcv);
    }
    pthread_mutex_unlock(&eng->direct->dmu);
    for (size_t k = 0; !ok && k < n; k++)
        digest_drop(xs[k]); /* its fallback lane does not hash */
    if (!ok)
        free(g);
    return ok;
}

void kvb__direct_stop(kvb_engine_h eng)
{
    kvb__warm_stop(eng);
    pthread_mutex_lock(&eng->direct->dmu);
    eng->direct->dstop = 1;
    pthread_cond_broadcast(&eng->direct->dcv);
    pthread_mutex_unlock(&eng->direct->dmu);
    for (size_t i = 0; i < eng->direct->n_dthr; i++)
        pthread_join(eng->direct->dthr[i], NULL);
    free(eng->direct->dthr);
    eng->direct->dthr = NULL;
    eng->direct->n_dthr = 0;
}

/* ---- the lane ---- */

static kvb_status_t direct_init(kvb_engine_h eng)
{
    eng->direct = calloc(1, sizeof(*eng->direct));
    if (eng->direct == NULL)
        return kvb__err_set(&eng->err, KVB_ERR_NOMEM, "out of memory");
    pthread_mutex_init(&eng->direct->dmu, NULL);
    pthread_cond_init(&eng->direct->dcv, NULL);
    eng->direct->slack =
        (uint64_t)kvb__env_int("KVBRIDGE_DIRECT_MAP_SLACK", NULL, 64 << 20, 0, (int64_t)1 << 50);
    eng->direct->populate_max = (uint64_t)kvb__env_int("KVBRIDGE_DIRECT_POPULATE_MAX", NULL,
                                                       (int64_t)4 << 30, 0, (int64_t)1 << 50);
    kvb__warm_init(eng);
    return KVB_OK;
}

/* The engine is freed (its copy threads stopped, or never started). */
static void direct_fini(kvb_engine_h eng)
{
    if (eng->direct == NULL)
        return;
    kvb__warm_stop(eng); /* no-op after kvb__direct_stop */
    pthread_mutex_destroy(&eng->direct->dmu);
    pthread_cond_destroy(&eng->direct->dcv);
    free(eng->direct);
    eng->direct = NULL;
}

/* Mapping (and pre-faulting) the peer's files: a writer on the peer's host
 * (proven), on the auto transport, with copy threads. */
static void direct_attach(kvb_engine_h eng, kvb__conn_t *c, const kvb__hs_reply_t *r)
{
    if (c->local && eng->params.transport == KVB_TRANSPORT_AUTO && eng->params.copy_threads > 0)
        kvb__direct_attach(eng, c, r);
}

static bool direct_usable(kvb_engine_h eng, const kvb__conn_t *c, const struct kvb_xfer *x,
                          const long *dst_seg, const kvb__wblocks_t *w)
{
    return eng->params.copy_threads > 0 && kvb__direct_usable(eng, c, x->epoch, dst_seg, w);
}

static kvb_status_t direct_submit(kvb_engine_h eng, struct kvb_xfer *const *xs, size_t n)
{
    return kvb__direct_submit(eng, xs, n) ? KVB_OK : KVB__LANE_REFUSED;
}

static void direct_stats(kvb_engine_h eng, kvb_engine_limits_t *l)
{
    if (l->field_mask & KVB_ENGINE_LIMITS_DIRECT) {
        l->direct_files_refused = __atomic_load_n(&eng->direct->refused, __ATOMIC_RELAXED);
        l->direct_files_unpopulated = __atomic_load_n(&eng->direct->unpopulated, __ATOMIC_RELAXED);
    }
}

const kvb__lane_t kvb__lane_direct = {
    .name = "direct",
    .pairs = KVB__PAIR(KVB__MEM_HOST, KVB__MEM_HOST),
    .caps = KVB__LANE_RUNS | KVB__LANE_GROUPS,
    .fence = KVB__LANE_FENCE_PAGE,
    .init = direct_init,
    .stop = kvb__direct_stop,
    .fini = direct_fini,
    .advertise = direct_advertise,
    .attach = direct_attach,
    .detach = kvb__direct_detach,
    .usable = direct_usable,
    .submit = direct_submit,
    .read = direct_submit, /* copy_unit copies a read's units the other way */
    .stats = direct_stats,
};
