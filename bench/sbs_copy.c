/* All-core copy yardstick for bench/side_by_side.py (built by
 * bench/side_by_side.sh into the bench venv's folder, loaded with ctypes):
 * the same gather-scatter of `n` blocks of `bs` bytes (block i of src to slot
 * perm[i] of dst) as the transfers move, split over `threads` threads
 * (contiguous ranges of block indices), plain glibc memcpy. Returns the
 * seconds the slowest thread took, from one common start. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

typedef struct {
    uint8_t *dst;
    const uint8_t *src;
    const int64_t *perm;
    size_t bs, lo, hi;
    pthread_barrier_t *go;
} part_t;

static void *run(void *arg)
{
    part_t *p = arg;
    pthread_barrier_wait(p->go);
    for (size_t i = p->lo; i < p->hi; i++)
        memcpy(p->dst + (size_t)p->perm[i] * p->bs, p->src + i * p->bs, p->bs);
    return NULL;
}

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

__attribute__((visibility("default"))) double
sbs_copy(uint8_t *dst, const uint8_t *src, const int64_t *perm, size_t n, size_t bs, int threads)
{
    enum { MAXT = 256 };
    if (threads < 1)
        threads = 1;
    if (threads > MAXT)
        threads = MAXT;
    pthread_t th[MAXT];
    part_t parts[MAXT];
    pthread_barrier_t go;
    pthread_barrier_init(&go, NULL, (unsigned)threads + 1);
    for (int t = 0; t < threads; t++) {
        parts[t] = (part_t){dst,
                            src,
                            perm,
                            bs,
                            n * (size_t)t / (size_t)threads,
                            n * (size_t)(t + 1) / (size_t)threads,
                            &go};
        pthread_create(&th[t], NULL, run, &parts[t]);
    }
    double t0 = now();
    pthread_barrier_wait(&go);
    for (int t = 0; t < threads; t++)
        pthread_join(th[t], NULL);
    double t1 = now();
    pthread_barrier_destroy(&go);
    return t1 - t0;
}
