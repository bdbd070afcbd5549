/* The lane interface: one data path that moves a write's bytes into a
 * peer's memory (docs/architecture.md, "Adding a lane").
 *
 * A lane is one folder under src/engine/lane/ exporting one const
 * kvb__lane_t, and one line in the registry (lanes.c). The engine core
 * (registrations, sessions, the handshake, lane choice, completion) calls a
 * lane only through this record; a lane calls only the primitives below the
 * core (engine_int.h's cmdq.c, complete.c and runs.c parts, fence.h,
 * jobs.c, segtab.h, shmem.h, cuda_drv.h) and other lanes' records (the
 * CUDA IPC lane rides on the direct lane's copy threads, the CUDA staging
 * lane on the message lane's sends), never the core's own files, so the
 * engine's files call each other without a circle
 * (scripts/check-structure.py).
 *
 * Lane choice, per write, on the caller's thread, after its blocks were
 * checked: the registry's lanes in order, the first whose `pairs` holds the
 * write's (source kind, destination kind) and whose `usable` (when set)
 * says yes takes it; the next such lane is kept as its fallback, for a
 * lane that refuses the write at submission (KVB__LANE_REFUSED: the copy
 * threads are stopping). A write's kind on a side is CUDA when any of its
 * blocks is device memory there, else HOST. A read (x->read) is chosen the
 * same way among the lanes whose `read` is set, its pair taken in the
 * bytes' direction (the peer's kind, ours). Every op may be NULL where the
 * lane has nothing to do. */
#ifndef KVB_ENGINE_LANE_H
#define KVB_ENGINE_LANE_H

#include <kvbridge/engine.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/handshake.h"

typedef struct kvb__conn kvb__conn_t;
typedef struct kvb__wblocks kvb__wblocks_t;
struct kvb_xfer;
struct kvb__cuda_seg;

/* The memory kind of one side of a write. */
typedef enum kvb__mem_kind {
    KVB__MEM_HOST = 0, /* host memory */
    KVB__MEM_CUDA = 1, /* CUDA device memory */
    KVB__MEM_KINDS
} kvb__mem_kind_t;

/* One (source kind, destination kind) pair, a bit of kvb__lane_t.pairs. */
#define KVB__PAIR(src, dst) (1u << ((unsigned)(src)*KVB__MEM_KINDS + (unsigned)(dst)))
/* The pairs that touch device memory on either side. */
#define KVB__PAIRS_DEVICE                                                                          \
    (KVB__PAIR(KVB__MEM_HOST, KVB__MEM_CUDA) | KVB__PAIR(KVB__MEM_CUDA, KVB__MEM_HOST) |           \
     KVB__PAIR(KVB__MEM_CUDA, KVB__MEM_CUDA))

/* What a lane can do (kvb__lane_t.caps). */
enum {
    KVB__LANE_RUNS = 1u << 0,   /* walks a write as strided runs (x->runs), not plain blocks */
    KVB__LANE_GROUPS = 1u << 1, /* submit takes a write group's members as one group */
    /* a read's bytes are placed by this engine, and only while the read
     * runs: once it is final nothing of it lands, whatever was in flight
     * (kvb_xfer_drained), except receives straight into its pieces still
     * in flight (x->am_rx, lane/msg/read.c): complete.c waits for them,
     * and reports the read not drained when it gave up waiting */
    KVB__LANE_READ_GATED = 1u << 2
};

/* How a target fences a lane's writes (fence.h). */
typedef enum kvb__lane_fence {
    KVB__LANE_FENCE_NONE = 0, /* not checked by the target (one-sided puts) */
    KVB__LANE_FENCE_TARGET,   /* the target admits each message (kvb__fence_admit/done) */
    KVB__LANE_FENCE_PAGE      /* the writer enters the target's fence page per unit */
} kvb__lane_fence_t;

/* submit: not taken (nothing changed); the write goes to its fallback lane. */
#define KVB__LANE_REFUSED ((kvb_status_t)1)

typedef struct kvb__lane {
    const char *name; /* in logs and docs: "direct", "message", ... */
    uint32_t pairs;   /* KVB__PAIR bits: the writes it serves */
    uint32_t caps;    /* KVB__LANE_* */
    kvb__lane_fence_t fence;

    /* ---- engine lifetime ---- */
    /* kvb_engine_create, once UCX's worker exists (the engine's error set). */
    kvb_status_t (*init)(kvb_engine_h eng);
    /* kvb_engine_destroy, before the progress thread stops: join the
     * lane's own threads (their writes end, published). */
    void (*stop)(kvb_engine_h eng);
    /* When the engine is freed (also after a failed create): what is left. */
    void (*fini)(kvb_engine_h eng);

    /* ---- target side: registrations and the handshake reply ---- */
    /* seg_mu held, registering device memory cs (the first allocation
     * holding r: [base, +size)): make it reachable for this lane's writers.
     * KVB_ERR_INVALID (why): r cannot be registered at all. */
    kvb_status_t (*export_device)(kvb_engine_h eng, const kvb_mem_region_ex_t *r,
                                  struct kvb__cuda_seg *cs, uint64_t base, uint64_t size, char *why,
                                  size_t wl);
    void (*unexport_device)(struct kvb__cuda_seg *cs); /* seg_mu held */
    /* seg_mu held: add what this lane's writers need to reply r (local:
     * the writer proved it runs on this host; caps: what its request
     * announced, KVB_HS_CAP_*). KVB_ERR_NOMEM. */
    kvb_status_t (*advertise)(kvb_engine_h eng, kvb__hs_reply_t *r, bool local, uint32_t caps);

    /* ---- writer side: a peer ---- */
    /* The KVB_HS_CAP_* bits our handshake request announces. */
    uint32_t (*request_caps)(void);
    /* Before the connection is established: room for what attach keeps
     * (KVB_ERR_NOMEM fails the handshake). */
    kvb_status_t (*attach_prepare)(kvb__conn_t *c, const kvb__hs_reply_t *r);
    /* The connection is established, not yet published: map or import what
     * the reply offers (on the handshaking caller's thread; failures leave
     * the segments to the other lanes, logged). Lanes attach in registry
     * order. */
    void (*attach)(kvb_engine_h eng, kvb__conn_t *c, const kvb__hs_reply_t *r);
    /* Undo attach and attach_prepare (also when they did not run). */
    void (*detach)(kvb__conn_t *c);

    /* ---- writes ---- */
    /* May this lane take x to c (its blocks checked; dst_seg[i]: block i's
     * destination segment in c, -1 when empty)? Caller's thread. */
    bool (*usable)(kvb_engine_h eng, const kvb__conn_t *c, const struct kvb_xfer *x,
                   const long *dst_seg, const kvb__wblocks_t *w);
    /* Take xs[0..n) (n > 1 only for KVB__LANE_GROUPS; each prepared in the
     * lane's form): KVB_OK, the lane now holds each one's engine reference
     * and publishes it once (kvb__xfer_publish); KVB__LANE_REFUSED, nothing
     * taken; an error, x not queued (n is 1). */
    kvb_status_t (*submit)(kvb_engine_h eng, struct kvb_xfer *const *xs, size_t n);
    /* One-sided reads of a peer's memory into ours (x->read), as submit;
     * NULL: the lane does not read (lane choice passes it over for reads).
     * A read's pair is (the peer's kind, ours): the bytes' direction. */
    kvb_status_t (*read)(kvb_engine_h eng, struct kvb_xfer *const *xs, size_t n);
    /* Progress thread, for a write this lane submitted there (complete.c's
     * list): issue what x's window allows now. */
    void (*progress)(kvb_engine_h eng, struct kvb_xfer *x);
    /* Progress thread, every pass of its loop: the lane's own time bounds
     * (cheap when there is nothing to bound). */
    void (*tick)(kvb_engine_h eng);
    /* kvb_engine_limits: fill the counters this lane keeps. */
    void (*stats)(kvb_engine_h eng, kvb_engine_limits_t *l);
} kvb__lane_t;

/* ---- lanes.c: the registry, and the loops the core runs over it ---- */

/* Every lane, in the order lane choice tries them; NULL-terminated. */
extern const kvb__lane_t *const kvb__lanes[];

kvb_status_t kvb__lanes_init(kvb_engine_h eng);
/* lane's place in the registry (the metrics' lane label); the count of
 * lanes when it is none of them. */
unsigned kvb__lane_index(const kvb__lane_t *lane);
void kvb__lanes_stop(kvb_engine_h eng);
void kvb__lanes_fini(kvb_engine_h eng);
kvb_status_t kvb__lanes_export_device(kvb_engine_h eng, const kvb_mem_region_ex_t *r,
                                      struct kvb__cuda_seg *cs, uint64_t base, uint64_t size,
                                      char *why, size_t wl);
void kvb__lanes_unexport_device(struct kvb__cuda_seg *cs);
kvb_status_t kvb__lanes_advertise(kvb_engine_h eng, kvb__hs_reply_t *r, bool local, uint32_t caps);
uint32_t kvb__lanes_request_caps(void);
kvb_status_t kvb__lanes_attach_prepare(kvb__conn_t *c, const kvb__hs_reply_t *r);
void kvb__lanes_attach(kvb_engine_h eng, kvb__conn_t *c, const kvb__hs_reply_t *r);
void kvb__lanes_detach(kvb__conn_t *c);
/* x->lane and x->lane_next for x to x->conn, of kinds (src, dst). */
void kvb__lanes_choose(kvb_engine_h eng, struct kvb_xfer *x, kvb__mem_kind_t src,
                       kvb__mem_kind_t dst, const long *dst_seg, const kvb__wblocks_t *w);
void kvb__lanes_stats(kvb_engine_h eng, kvb_engine_limits_t *l);
void kvb__lanes_tick(kvb_engine_h eng);

#endif
