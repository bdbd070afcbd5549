/* Sorted table of non-overlapping memory segments [addr, addr+len), used for
 * both the local registrations and a peer's advertised ones. Pure data
 * structure: no locking (callers lock), no I/O. */
#ifndef KVB_ENGINE_SEGTAB_H
#define KVB_ENGINE_SEGTAB_H

#include "engine/shmem.h"

#include <kvbridge/common.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct kvb__seg {
    uint64_t addr;
    uint64_t len;
    void *handle;   /* local: ucp_mem_h; remote: ucp_rkey_h (may be NULL) */
    void *rkey_buf; /* local: packed remote key (owned by the UCX context) */
    size_t rkey_len;
    uint32_t pins; /* local: incoming message-lane writes in progress */
    bool shared;   /* local: inside a kvb_mem_alloc file (ref describes it) */
    kvb__shm_ref_t ref;
    uint8_t *direct;            /* remote: where addr is mapped here (direct lane, or a CUDA IPC
                                   import), or NULL */
    struct kvb__cuda_seg *cuda; /* CUDA device memory (mem_cuda.c), or NULL: host */
} kvb__seg_t;

typedef struct kvb__segtab {
    kvb__seg_t *v;
    size_t n;
    size_t cap;
} kvb__segtab_t;

/* Index of the segment that wholly contains [addr, addr+len), or -1 (also
 * when len is 0 or addr+len wraps). O(log n). */
long kvb__segtab_find(const kvb__segtab_t *t, uint64_t addr, uint64_t len);

/* Insert keeping order. KVB_ERR_OVERLAP if it overlaps an entry,
 * KVB_ERR_INVALID for len 0 or a wrapping range, KVB_ERR_NOMEM. */
kvb_status_t kvb__segtab_insert(kvb__segtab_t *t, const kvb__seg_t *seg);

/* Does [addr, addr+len) overlap an entry? (len 0 or wrapping: false.) */
bool kvb__segtab_overlaps(const kvb__segtab_t *t, uint64_t addr, uint64_t len);

/* Index of the entry starting exactly at addr, or -1. */
long kvb__segtab_find_start(const kvb__segtab_t *t, uint64_t addr);
/* The entry starting exactly at addr, or NULL (a lane attaching what a
 * handshake reply says of some segments finds the conn's entry so). */
kvb__seg_t *kvb__segtab_at(kvb__segtab_t *t, uint64_t addr);

/* Remove entry idx (0 <= idx < n), copying it to *seg_p when not NULL. */
void kvb__segtab_remove(kvb__segtab_t *t, size_t idx, kvb__seg_t *seg_p);

void kvb__segtab_free(kvb__segtab_t *t);

#endif
