/* The direct lane's own state and declarations (direct.c, warm.c): on one
 * host the writer maps the peer's kvb_mem_alloc files and its copy threads
 * write the blocks straight in. The CUDA IPC lane (lane/cuda_ipc/) hands
 * its writes to the same copy threads through this lane's record. */
#ifndef KVB_ENGINE_LANE_DIRECT_H
#define KVB_ENGINE_LANE_DIRECT_H

#include "engine/engine_int.h"

typedef struct kvb__map { /* a peer's shared file mapped here */
    uint8_t *base;
    uint64_t size, dev, ino;
} kvb__map_t;

/* A connection's mappings (c->direct), made by kvb__direct_attach. */
typedef struct kvb__direct_conn {
    kvb__map_t *maps; /* the peer's files mapped here */
    size_t nmaps, cap_maps;
    uint64_t populated; /* bytes of maps prefaulted (KVBRIDGE_DIRECT_POPULATE_MAX) */
} kvb__direct_conn_t;

typedef struct kvb__dgroup kvb__dgroup_t; /* writes queued together (direct.c) */

/* The engine's direct lane (eng->direct), made by the lane's init. */
typedef struct kvb__direct {
    /* writer copy threads (dmu) */
    pthread_mutex_t dmu;
    pthread_cond_t dcv;
    struct kvb__dgroup *dq_head, *dq_tail; /* groups with units left (round robin) */
    pthread_t *dthr;
    size_t n_dthr;
    int dstop;
    bool stream_copy;              /* AVX2 streaming stores available */
    struct kvb__warm *warm;        /* background warmer of new mappings (warm.c), NULL when off */
    int warm_pct;                  /* KVBRIDGE_DIRECT_WARM_CPU: % of one core it may use; 0 = off */
    uint64_t refused, unpopulated; /* atomic: peer files not mapped / not prefaulted */
    uint64_t slack, populate_max;  /* KVBRIDGE_DIRECT_MAP_SLACK / _POPULATE_MAX */
} kvb__direct_t;

/* direct.c */
void kvb__direct_attach(kvb_engine_h eng, kvb__conn_t *c, const kvb__hs_reply_t *r);
void kvb__direct_detach(kvb__conn_t *c);
/* Every block's destination mapped and our tag not fenced? */
bool kvb__direct_usable(kvb_engine_h eng, const kvb__conn_t *c, uint64_t epoch, const long *dst_seg,
                        const kvb__wblocks_t *w);
/* Queue xs[0..n) (n <= KVB_WRITE_GROUP_MAX, each prepared for the direct
 * lane (runs), none CUDA unless n is 1) as one group under one dmu hold:
 * the copy threads take its units in zip order (row r of run i of every
 * member, then row r + 1, then run i + 1). false: nothing queued (engine
 * stopping, no copy thread, no memory): use UCX. */
bool kvb__direct_submit(kvb_engine_h eng, struct kvb_xfer *const *xs, size_t n);
void kvb__direct_stop(kvb_engine_h eng);

/* warm.c: warming a peer's newly mapped files off the copy threads' path */
int kvb__warm_cpu_pct(void);           /* KVBRIDGE_DIRECT_WARM_CPU (default 50) */
void kvb__warm_init(kvb_engine_h eng); /* at the lane's init (no memory: warmer off) */
/* Queue [base, base + size) of c's mappings (takes a reference to c). */
void kvb__warm_add(kvb_engine_h eng, kvb__conn_t *c, uint8_t *base, uint64_t size);
void kvb__warm_stop(kvb_engine_h eng);      /* joins the thread, drops the jobs */
uint64_t kvb__warm_pages(kvb_engine_h eng); /* pages warmed so far */

#endif
