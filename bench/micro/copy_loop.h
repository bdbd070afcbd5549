/* The direct lane's streaming-store copy loop (src/engine/direct.c,
 * copy_stream) for the microbenchmarks in this folder: 32-byte-align the
 * destination with memcpy, 128 bytes per turn in AVX2 loads and
 * non-temporal stores, the tail with memcpy. Callers issue _mm_sfence. */
#ifndef KVB_BENCH_MICRO_COPY_LOOP_H
#define KVB_BENCH_MICRO_COPY_LOOP_H
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

__attribute__((target("avx2"))) static void cs(uint8_t *d, const uint8_t *s, size_t n)
{
    size_t head = (32 - ((uintptr_t)d & 31)) & 31;
    if (head) {
        memcpy(d, s, head);
        d += head, s += head, n -= head;
    }
    for (; n >= 128; n -= 128, d += 128, s += 128) {
        __m256i a = _mm256_loadu_si256((const __m256i *)s);
        __m256i b = _mm256_loadu_si256((const __m256i *)(s + 32));
        __m256i e = _mm256_loadu_si256((const __m256i *)(s + 64));
        __m256i f = _mm256_loadu_si256((const __m256i *)(s + 96));
        _mm256_stream_si256((__m256i *)d, a);
        _mm256_stream_si256((__m256i *)(d + 32), b);
        _mm256_stream_si256((__m256i *)(d + 64), e);
        _mm256_stream_si256((__m256i *)(d + 96), f);
    }
    if (n)
        memcpy(d, s, n);
}
#endif
