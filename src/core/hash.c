/* kvb__item_hash (hash.h): XXH3 from libxxhash (Debian's libxxhash-dev),
 * memory-bound, faster per core than memcpy. */
#include "core/hash.h"

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
