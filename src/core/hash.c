/* kvb__item_hash (hash.h): XXH3 from libxxhash (Debian's libxxhash-dev),
 * memory-bound, faster per core than memcpy. */
#include "core/hash.h"

#define XXH_STATIC_LINKING_ONLY /* XXH3_state_t on the stack: no allocation per share */
#include <xxhash.h>
#if defined(__x86_64__)
/* libxxhash's run-time dispatch (AVX2 where the CPU has it): the library is
 * built for the SSE2 baseline, and the dispatch doubles it, measured 10.7
 * against 5.1 GB/s here. Debian's libxxhash0 exports the _dispatch entry
 * points this header maps XXH3_64bits_withSeed to: nothing is vendored. */
#include <xxh_x86dispatch.h>
#endif

uint64_t kvb__item_hash(const void *p, size_t len, uint64_t seed)
{
    return XXH3_64bits_withSeed(p, len, seed);
}

uint64_t kvb__pieces_hash(const kvb__hpiece_t *pc, size_t n, uint64_t seed)
{
    XXH3_state_t st;
    XXH3_INITSTATE(&st);
    XXH3_64bits_reset_withSeed(&st, seed);
    for (size_t i = 0; i < n; i++)
        XXH3_64bits_update(&st, pc[i].p, pc[i].len);
    return XXH3_64bits_digest(&st);
}

uint64_t kvb__strided_hash(const void *base, size_t len, size_t stride, size_t count, uint64_t seed)
{
    XXH3_state_t st;
    XXH3_INITSTATE(&st);
    XXH3_64bits_reset_withSeed(&st, seed);
    for (size_t k = 0; k < count; k++)
        XXH3_64bits_update(&st, (const char *)base + k * stride, len);
    return XXH3_64bits_digest(&st);
}
