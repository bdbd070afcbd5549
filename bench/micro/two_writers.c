/* Microbenchmark behind bench/results/bench.md "Session 6" (issue 16 §2):
 * two copy threads (the direct lane's default on this 2-core VM) move the
 * same 256 MiB of KV pages (32 KiB = 16 token rows of 2 KiB) in the patterns
 * of the heterogeneous-TP bars, with nothing else running:
 *   page       TP1->TP1: each thread copies whole pages (half the pages each);
 *   rows       TP2->TP1: thread h stores 1 KiB half h of every 2 KiB row from
 *              its own contiguous source (two prefill ranks, one decode page);
 *   srcstrided TP1->TP2 as separate writes: thread h reads half h of every
 *              source row (one transfer per decode rank);
 *   zip        TP1->TP2 as one write group: each thread takes half the pages
 *              and copies both halves of each row back to back.
 * Streaming-store loop as the direct lane's; random source and destination
 * pages; wall clock of both threads, best of 3, 3 rounds. Any argument:
 * madvise(MADV_HUGEPAGE) on the buffers (transparent huge pages, to rule TLB
 * misses in or out).
 *   gcc -O2 -mavx2 -pthread bench/micro/two_writers.c -o /tmp/two_writers
 *   /tmp/two_writers [huge]
 * Not built by CMake: a measurement aid, not part of kvbridge. */
#include <immintrin.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/mman.h>

#include "copy_loop.h"
#define PAGE 32768
static size_t pool = 1ul << 30, npg = (256ul << 20) / PAGE, np;
static uint8_t *src, *src2, *dst;
static int *perm, mode;
static pthread_barrier_t bar;
static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}
static void run(int h)
{
    for (size_t i = 0; i < npg; i++) {
        uint8_t *sp = src + (size_t)perm[(i * 7) % np] * PAGE;
        uint8_t *d = dst + (size_t)perm[i] * PAGE;
        uint8_t *d1 = dst + ((size_t)perm[i] * PAGE + pool / 2) % pool;
        if (mode == 0 && (i & 1) == (size_t)h)
            cs(d, sp, PAGE);
        else if (mode == 1) { /* own source: prefill rank h's pool holds 1 KiB rows */
            uint8_t *s = (h ? src2 : src) + (size_t)perm[(i * 7) % np] * (PAGE / 2);
            for (int r = 0; r < 16; r++)
                cs(d + r * 2048 + h * 1024, s + r * 1024, 1024);
        } else if (mode == 2) {
            for (int r = 0; r < 16; r++)
                cs((h ? d1 : d) + r * 1024, sp + h * 1024 + r * 2048, 1024);
        } else if (mode == 3 && (i & 1) == (size_t)h) {
            for (int r = 0; r < 16; r++)
                for (int k = 0; k < 2; k++)
                    cs((k ? d1 : d) + r * 1024, sp + k * 1024 + r * 2048, 1024);
        }
    }
    _mm_sfence();
}
static void *thr(void *a)
{
    int h = (int)(intptr_t)a;
    for (;;) {
        pthread_barrier_wait(&bar);
        if (mode < 0)
            return NULL;
        run(h);
        pthread_barrier_wait(&bar);
    }
}
int main(int argc, char **argv)
{
    (void)argv;
    np = pool / PAGE;
    src = mmap(0, pool, 3, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    src2 = mmap(0, pool / 2, 3, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    dst = mmap(0, pool, 3, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (argc > 1)
        madvise(src, pool, MADV_HUGEPAGE), madvise(src2, pool / 2, MADV_HUGEPAGE),
            madvise(dst, pool, MADV_HUGEPAGE);
    memset(src, 1, pool), memset(src2, 3, pool / 2), memset(dst, 2, pool);
    perm = malloc(np * sizeof(int));
    for (size_t i = 0; i < np; i++)
        perm[i] = (int)i;
    srand(1);
    for (size_t i = np - 1; i > 0; i--) {
        size_t j = (size_t)rand() % (i + 1);
        int t = perm[i];
        perm[i] = perm[j], perm[j] = t;
    }
    pthread_t t[2];
    pthread_barrier_init(&bar, NULL, 3);
    for (int i = 0; i < 2; i++)
        pthread_create(&t[i], NULL, thr, (void *)(intptr_t)i);
    const char *names[] = {"page(TP1->TP1)", "rows(TP2->TP1)", "srcstrided(TP1->TP2)",
                           "zip(TP1->TP2)"};
    for (int round = 0; round < 3; round++) {
        double g[4];
        for (int m = 0; m < 4; m++) {
            double best = 1e9;
            for (int it = 0; it < 3; it++) {
                mode = m;
                double t0 = now();
                pthread_barrier_wait(&bar);
                pthread_barrier_wait(&bar);
                double dt = now() - t0;
                best = dt < best ? dt : best;
            }
            g[m] = (double)(npg * PAGE) / best / 1e9;
        }
        printf("%s %.2f  %s %.2f (%.2fx)  %s %.2f (%.2fx)  %s %.2f (%.2fx) GB/s\n", names[0], g[0],
               names[1], g[1], g[1] / g[0], names[2], g[2], g[2] / g[0], names[3], g[3],
               g[3] / g[0]);
    }
    mode = -1;
    pthread_barrier_wait(&bar);
    return 0;
}
