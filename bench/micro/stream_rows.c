/* Microbenchmark behind bench/results/hotpath.md (issue 16 §2, session 5):
 * one thread copies 256 MiB between 1 GiB pools with the direct lane's
 * streaming-store loop in four patterns: 32 KiB pages to random pages
 * (TP1->TP1); 1 KiB rows from a contiguous source into every other 1 KiB of
 * the destination (TP2->TP1, "rows-NT"); 1 KiB rows read at a 2 KiB source
 * stride into contiguous destination rows (TP1->TP2, one half then the
 * other: "srcstrided-NT"); the same with both halves of each page copied
 * back to back ("srcstrided-interleaved-NT"). Min of 3 per round, 5 rounds.
 *   gcc -O2 bench/micro/stream_rows.c -o /tmp/stream_rows && /tmp/stream_rows
 * Not built by CMake: a measurement aid, not part of kvbridge. */
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/mman.h>

#include "copy_loop.h"
static double now()
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}
int main()
{
    size_t pool = 1 << 30, page = 32768, np = pool / page;
    size_t moved = 256 << 20;
    size_t npg = moved / page;
    uint8_t *src = mmap(0, pool, 3, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    uint8_t *dst = mmap(0, pool, 3, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    memset(src, 1, pool);
    memset(dst, 2, pool);
    int *perm = malloc(np * sizeof(int));
    for (size_t i = 0; i < np; i++)
        perm[i] = i;
    srand(1);
    for (size_t i = np - 1; i > 0; i--) {
        size_t j = rand() % (i + 1);
        int t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    for (int rep = 0; rep < 5; rep++) {
        double best[4] = {1e9, 1e9, 1e9, 1e9};
        for (int it = 0; it < 3; it++) {
            double t = now();
            for (size_t i = 0; i < npg; i++)
                cs(dst + (size_t)perm[i] * page, src + i * page, page);
            _mm_sfence();
            t = now() - t;
            if (t < best[0])
                best[0] = t;
            // half rows: 1 KiB rows stride 2048 dst, contiguous src; two halves (like two ranks
            // sequentially)
            t = now();
            for (int h = 0; h < 2; h++)
                for (size_t i = 0; i < npg; i++) {
                    uint8_t *d = dst + (size_t)perm[i] * page + h * 1024;
                    const uint8_t *s = src + (h * npg + i) * (page / 2) % pool;
                    for (int r = 0; r < 16; r++)
                        cs(d + r * 2048, s + r * 1024, 1024);
                }
            _mm_sfence();
            t = now() - t;
            if (t < best[1])
                best[1] = t;
            t = now();
            for (size_t i = 0; i < npg; i++)
                for (int h = 0; h < 2; h++) {
                    uint8_t *d = dst + ((size_t)perm[i] * page + (size_t)h * (pool / 2)) % pool;
                    const uint8_t *s = src + i * page + h * 1024;
                    for (int r = 0; r < 16; r++)
                        cs(d + r * 1024, s + r * 2048, 1024);
                }
            _mm_sfence();
            t = now() - t;
            if (t < best[2])
                best[2] = t;
            t = now();
            for (int h = 0; h < 2; h++)
                for (size_t i = 0; i < npg; i++) {
                    uint8_t *d = dst + ((size_t)perm[i] * page + (size_t)h * (pool / 2)) % pool;
                    const uint8_t *s = src + i * page + h * 1024;
                    for (int r = 0; r < 16; r++)
                        cs(d + r * 1024, s + r * 2048, 1024);
                }
            _mm_sfence();
            t = now() - t;
            if (t < best[3])
                best[3] = t;
        }
        printf(
            "page-NT %.2f  rows-NT %.2f  srcstrided-interleaved-NT %.2f  srcstrided-NT %.2f GB/s\n",
            moved / best[0] / 1e9, moved / best[1] / 1e9, moved / best[2] / 1e9,
            moved / best[3] / 1e9);
    }
}
