/* The direct lane's streaming-store copy loop for the microbenchmarks in
 * this folder: the engine's own (src/engine/lane/direct/copy_stream.h), so they measure
 * exactly what the copy threads run. Callers issue _mm_sfence. */
#ifndef KVB_BENCH_MICRO_COPY_LOOP_H
#define KVB_BENCH_MICRO_COPY_LOOP_H
#include "../../src/engine/lane/direct/copy_stream.h"

__attribute__((target("avx2"))) static void cs(uint8_t *d, const uint8_t *s, size_t n)
{
    kvb__copy_stream(d, s, n);
}

#endif
