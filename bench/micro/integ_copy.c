/* Microbenchmark behind bench/results/integrity.md (issue 35 §2, the
 * 2026-12-06 set): what KV integrity's hashing costs one core next to the
 * direct lane's copy, per 256 MiB room of 32 KiB pages (llama3-8b's item).
 * Four passes, alternating, REPS rounds:
 *   copy        the copy threads' loop (streaming stores), page by page
 *   copy+hash   the same, each page's source hashed right after its copy
 *               (KVB_WRITE_PARAM_DIGEST: the direct lane's copy threads)
 *   hash src    the source hashed in a pass of its own (what the prefill's
 *               worker did before: a second read of every source byte)
 *   hash dst    the destination hashed (the decode's check: its pages were
 *               written with streaming stores, so they come from memory)
 * XXH3 through libxxhash's x86 dispatch, as src/core/hash.c. First, one
 * 32 KiB page in cache hashed 100,000 times through the library's default
 * entry point (Debian builds it for SSE2) and through its dispatch.
 *   gcc -O2 -Wall bench/micro/integ_copy.c -o /tmp/integ_copy -lxxhash && /tmp/integ_copy [reps]
 * Not built by CMake: a measurement aid, not part of kvbridge. */
#include "copy_loop.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <xxhash.h>

/* libxxhash's own default entry point, before the dispatch header maps the
 * name to the dispatching one */
static uint64_t hash_default(const void *p, size_t n, uint64_t seed)
{
    return XXH3_64bits_withSeed(p, n, seed);
}

#include <xxh_x86dispatch.h>

#define ROOM ((size_t)256 << 20)
#define ITEM ((size_t)32 << 10)

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static uint64_t sink;

static double pass(int kind, uint8_t *d, const uint8_t *s)
{
    double t0 = now();
    uint64_t acc = 0;
    for (size_t o = 0; o < ROOM; o += ITEM) {
        if (kind <= 1)
            cs(d + o, s + o, ITEM);
        if (kind == 1 || kind == 2)
            acc += XXH3_64bits_withSeed(s + o, ITEM, (uint64_t)(uintptr_t)(d + o));
        if (kind == 3)
            acc += XXH3_64bits_withSeed(d + o, ITEM, (uint64_t)(uintptr_t)(d + o));
    }
    _mm_sfence();
    sink += acc;
    return now() - t0;
}

int main(int argc, char **argv)
{
    static const char *name[] = {"copy", "copy+hash", "hash src", "hash dst"};
    int reps = argc > 1 ? atoi(argv[1]) : 3;
    uint8_t *s = aligned_alloc(4096, ROOM), *d = aligned_alloc(4096, ROOM);
    if (s == NULL || d == NULL || !__builtin_cpu_supports("avx2"))
        return fprintf(stderr, "no memory or no AVX2\n"), 1;
    for (size_t i = 0; i < ROOM; i++)
        s[i] = (uint8_t)(i * 131 + (i >> 12));
    memset(d, 0, ROOM);
    for (int way = 0; way < 2; way++) {
        double t0 = now();
        for (uint64_t r = 0; r < 100000; r++)
            sink += way ? XXH3_64bits_withSeed(s, ITEM, r) : hash_default(s, ITEM, r);
        printf("page in cache, %-8s %5.1f GB/s\n", way ? "dispatch" : "default",
               100000.0 * ITEM / (now() - t0) / 1e9);
    }
    for (int r = 0; r < reps; r++)
        for (int k = 0; k < 4; k++) {
            double t = pass(k, d, s);
            printf("round %d %-10s %6.1f ms  %5.2f GB/s\n", r + 1, name[k], t * 1e3,
                   (double)ROOM / t / 1e9);
        }
    return sink == 42; /* keep the hashes */
}
