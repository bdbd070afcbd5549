/* The KV integrity item hash (docs/integrity.md, "What the digest is"), in
 * one place for the two layers that compute it: the connector (a worker's
 * pass over a chunk's sources, the decode's recomputation) and the engine's
 * direct lane (each item hashed by the copy thread right after it copied
 * it, while the source is in cache). Pure; any thread. */
#ifndef KVB_CORE_HASH_H
#define KVB_CORE_HASH_H

#include <stddef.h>
#include <stdint.h>

/* XXH3-64 of len bytes at p, seeded with seed (the item's destination
 * address), through libxxhash's x86 run-time dispatch where there is one. */
uint64_t kvb__item_hash(const void *p, size_t len, uint64_t seed);

/* One piece of a share's bytes (kvb__pieces_hash). */
typedef struct kvb__hpiece {
    const void *p;
    size_t len;
} kvb__hpiece_t;
/* XXH3-64 streamed over pc[n] in order, seeded: equal to kvb__item_hash of
 * their bytes laid end to end (a share of a page, docs/integrity.md). */
uint64_t kvb__pieces_hash(const kvb__hpiece_t *pc, size_t n, uint64_t seed);
/* The same over count pieces of len bytes, one every stride from base. */
uint64_t kvb__strided_hash(const void *base, size_t len, size_t stride, size_t count,
                           uint64_t seed);

#endif
