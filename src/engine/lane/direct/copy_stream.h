/* The direct lane's streaming-store copy loop, in a header so that the
 * microbenchmarks in bench/micro measure exactly this loop (copy_loop.h).
 * x86-64 with AVX2 only (callers check __builtin_cpu_supports("avx2")):
 * the destination 32-byte-aligned with memcpy, 128 bytes per turn in AVX2
 * loads and non-temporal stores, the tail with memcpy. The stores are
 * weakly ordered: callers issue _mm_sfence before publishing the bytes. */
#ifndef KVB_ENGINE_COPY_STREAM_H
#define KVB_ENGINE_COPY_STREAM_H

#if defined(__x86_64__)
#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

__attribute__((target("avx2"))) static inline void kvb__copy_stream(uint8_t *d, const uint8_t *s,
                                                                    size_t n)
{
    size_t head = (32 - ((uintptr_t)d & 31)) & 31;
    if (head > n)
        head = n;
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

#endif
