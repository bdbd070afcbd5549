/* Process-wide cache of the large per-write arrays (kvb_engine_write*: the
 * coalesced copy of the caller's blocks and the per-block segment index).
 * A heterogeneous-TP request is ~262k blocks per rank: a 6 MiB and a 2 MiB
 * array per write, which glibc serves from fresh mmaps; first-touching
 * those pages costs up to ~5 µs per 4 KiB page on some VMs (issue 16), more
 * than validating the blocks. Keeping a few arrays between writes avoids it.
 * Thread-safe (one mutex, held only to pick or keep an entry). Bounded: at
 * most KVB__BUFPOOL_SLOTS arrays and KVB__BUFPOOL_MAX_BYTES kept in all;
 * kept arrays stay reachable (no leak report) until kvb__bufpool_drain. */
#ifndef KVB_ENGINE_BUFPOOL_H
#define KVB_ENGINE_BUFPOOL_H

#include <stddef.h>

#define KVB__BUFPOOL_SLOTS 16
#define KVB__BUFPOOL_MAX_BYTES ((size_t)96 << 20)

/* An array of at least `bytes` (> 0); its capacity in *cap_p, to hand back
 * to kvb__bufpool_put. NULL when out of memory. */
void *kvb__bufpool_get(size_t bytes, size_t *cap_p);

/* Keep p (of capacity cap) for a later get, or free it when the pool is
 * full. p may be NULL (no-op). */
void kvb__bufpool_put(void *p, size_t cap);

/* Free every kept array (tests; the pool refills on use). */
void kvb__bufpool_drain(void);

/* Arrays kept now and their bytes (tests). */
size_t kvb__bufpool_kept(size_t *bytes_p);

#endif
