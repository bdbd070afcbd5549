/* Microbenchmark behind bench/results/bench.md, session 3 ("the copy of such
 * slices is not slower in isolation"): one thread copies 256 MiB from a
 * 1 GiB pool into random 64 KiB slots of a 4 GiB pool, as 32 KiB runs with
 * AVX2 streaming stores, as 1 KiB head slices at a 2 KiB destination stride
 * with streaming stores (what the direct lane does for TP2->TP1), and the
 * same slices with memcpy. Three repetitions.
 *   gcc -O2 -Wall bench/micro/stream_pieces.c -o /tmp/stream_pieces
 *   /tmp/stream_pieces
 * Not built by CMake: a measurement aid, not part of kvbridge. */
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* The direct lane's copy loop (src/engine/direct.c, copy_stream). */
__attribute__((target("avx2"), noinline)) static void stream(uint8_t *d, const uint8_t *s, size_t n)
{
    size_t head = (32 - ((uintptr_t)d & 31)) & 31;
    memcpy(d, s, head);
    d += head, s += head, n -= head;
    for (; n >= 128; n -= 128, d += 128, s += 128)
        for (int k = 0; k < 4; k++)
            _mm256_stream_si256((__m256i *)(d + 32 * k),
                                _mm256_loadu_si256((const __m256i *)(s + 32 * k)));
    memcpy(d, s, n);
}

static uint8_t *pool(size_t n, int fill)
{
    uint8_t *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        perror("mmap");
        exit(1);
    }
    memset(p, fill, n);
    return p;
}

int main(void)
{
    size_t ns = 1ull << 30, nd = 4ull << 30, vol = 256u << 20, npg = vol / 32768;
    uint8_t *S = pool(ns, 1), *D = pool(nd, 2);
    uint32_t *ss = malloc(4 * npg), *ds = malloc(4 * npg);
    srand(1);
    for (size_t i = 0; i < npg; i++) {
        ss[i] = (uint32_t)(rand() % (int)(ns / 32768));
        ds[i] = (uint32_t)(rand() % (int)(nd / 65536));
    }
    for (int rep = 0; rep < 3; rep++) {
        double t0 = now(), r[3];
        for (size_t i = 0; i < npg; i++)
            stream(D + (size_t)ds[i] * 65536, S + (size_t)ss[i] * 32768, 32768);
        _mm_sfence();
        r[0] = (double)vol / (now() - t0) / 1e9;
        for (int mode = 1; mode <= 2; mode++) {
            t0 = now();
            for (size_t i = 0; i < npg; i++)
                for (int j = 0; j < 32; j++) {
                    uint8_t *d = D + (size_t)ds[i] * 65536 + (size_t)j * 2048;
                    const uint8_t *s = S + (size_t)ss[i] * 32768 + (size_t)j * 1024;
                    if (mode == 1)
                        stream(d, s, 1024);
                    else
                        memcpy(d, s, 1024);
                }
            _mm_sfence();
            r[mode] = (double)vol / (now() - t0) / 1e9;
        }
        printf("32 KiB runs, streaming %.2f GB/s  1 KiB slices, streaming %.2f  1 KiB slices, "
               "memcpy %.2f\n",
               r[0], r[1], r[2]);
    }
    return 0;
}
