/* Engine-level microbenchmark behind bench/results/hotpath.md (issue 16 §2,
 * session 6): one writer engine (copy threads as KVBRIDGE_COPY_THREADS, 2)
 * writes a TP1->TP2 split of 256 MiB of 32 KiB source pages (16 rows of
 * 2 KiB) to two target engines of this process over the direct lane
 * (kvb_mem_alloc pools, destination pages permuted): member r gets the r-th
 * 1 KiB half of every row. Two ways, alternating: "separate" (two
 * kvb_engine_write_async_ex, as the connector did before) and "group" (one
 * kvb_engine_write_group_async: zipped copies), and "strided" (the group
 * with one kvb_strided_block_t per member and page instead of one block per
 * row: session 7). Also "page" (TP1->TP1: each
 * page whole to one target, 32 KiB blocks) as the yardstick. Per round and
 * way: wall GB/s of useful bytes from submission to the last completion, and
 * process CPU seconds (every thread: the caller's validation and the copy
 * threads) per GB. Bytes are checked once per way.
 *   cmake --build build --target kvbridge
 *   gcc -O2 bench/micro/group_copy.c -Iinclude -Lbuild -lkvbridge \
 *       -Wl,-rpath,$PWD/build -o /tmp/group_copy && /tmp/group_copy [rounds]
 * Not built by CMake: a measurement aid, not part of kvbridge. */
#include <kvbridge/engine.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define KiB 1024ull
#define MiB (1024 * KiB)
#define PAGE (32 * KiB)
#define ROW (2 * KiB)
#define NPAGES 8192ull /* 256 MiB */
#define TAG 0x6b1du

static double now_s(clockid_t c)
{
    struct timespec t;
    clock_gettime(c, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static kvb_engine_h engine(void)
{
    kvb_engine_params_t p = {0};
    kvb_engine_h e;
    p.field_mask = KVB_ENGINE_PARAM_TRANSPORT;
    p.transport = KVB_TRANSPORT_AUTO;
    if (kvb_engine_create(&p, &e) != KVB_OK)
        exit(1);
    return e;
}

static size_t perm(size_t p)
{
    return (p * 7919u) % NPAGES;
}

int main(int argc, char **argv)
{
    int rounds = argc > 1 ? atoi(argv[1]) : 5;
    size_t rows = PAGE / ROW;
    uint8_t *src = aligned_alloc(4096, NPAGES * PAGE), *dst[2];
    kvb_engine_h w = engine(), t[2] = {engine(), engine()};
    uint64_t ep[2];
    const char *sid[2];
    for (size_t i = 0; i < NPAGES * PAGE; i++)
        src[i] = (uint8_t)(i * 131 + (i >> 12));
    kvb_engine_register(w, src, NPAGES * PAGE, KVB_MEM_HOST);
    kvb_engine_set_writer_tag(w, TAG);
    for (int r = 0; r < 2; r++) {
        if (kvb_mem_alloc(NPAGES * PAGE, (void **)&dst[r]) != KVB_OK)
            return 1;
        memset(dst[r], 0, NPAGES * PAGE);
        kvb_engine_register(t[r], dst[r], NPAGES * PAGE, KVB_MEM_HOST);
        kvb_engine_grant_writer(t[r], TAG, &ep[r]);
        sid[r] = kvb_engine_session_id(t[r]);
    }
    /* halves: member r, row-major over (page, row) */
    kvb_block_t *hb[2], *pb[2];
    kvb_strided_block_t *sb[2];
    size_t nh = NPAGES * rows, np = NPAGES / 2;
    for (int r = 0; r < 2; r++) {
        hb[r] = malloc(nh * sizeof(kvb_block_t));
        pb[r] = malloc(np * sizeof(kvb_block_t));
        sb[r] = malloc(NPAGES * sizeof(kvb_strided_block_t));
        for (size_t p = 0; p < NPAGES; p++)
            sb[r][p] =
                (kvb_strided_block_t){(uint64_t)(uintptr_t)(src + p * PAGE + (size_t)r * KiB),
                                      (uint64_t)(uintptr_t)(dst[r] + perm(p) * (PAGE / 2)),
                                      KiB,
                                      ROW,
                                      KiB,
                                      rows};
        for (size_t p = 0; p < NPAGES; p++)
            for (size_t i = 0; i < rows; i++)
                hb[r][p * rows + i] = (kvb_block_t){
                    (uint64_t)(uintptr_t)(src + p * PAGE + i * ROW + (size_t)r * KiB),
                    (uint64_t)(uintptr_t)(dst[r] + perm(p) * (PAGE / 2) + i * KiB), KiB};
        /* page: target r gets pages r, r + 2, ... whole */
        for (size_t k = 0; k < np; k++)
            pb[r][k] = (kvb_block_t){(uint64_t)(uintptr_t)(src + (2 * k + (size_t)r) * PAGE),
                                     (uint64_t)(uintptr_t)(dst[r] + perm(k) * PAGE), PAGE};
    }
    kvb_write_params_t wp[2] = {{KVB_WRITE_PARAM_EPOCH, ep[0]}, {KVB_WRITE_PARAM_EPOCH, ep[1]}};
    static const char *names[] = {"separate", "group", "page", "strided"};
    printf("way       round  GB/s  CPU-s/GB\n");
    for (int round = 0; round <= rounds; round++) /* round 0: warm-up */
        for (int way = 0; way < 4; way++) {
            kvb_xfer_h x[2];
            kvb_status_t st[2];
            kvb_block_t *b[2] = {way == 2 ? pb[0] : hb[0], way == 2 ? pb[1] : hb[1]};
            size_t n = way == 2 ? np : nh;
            kvb_write_member_t mb[2];
            for (int k = 0; k < 2; k++)
                mb[k] = (kvb_write_member_t){.field_mask = KVB_WRITE_MEMBER_PARAMS,
                                             .session_id = sid[k],
                                             .blocks = b[k],
                                             .count = n,
                                             .params = &wp[k]};
            if (way == 3)
                for (int k = 0; k < 2; k++) {
                    mb[k].field_mask |= KVB_WRITE_MEMBER_STRIDED;
                    mb[k].blocks = NULL;
                    mb[k].count = 0;
                    mb[k].strided = sb[k];
                    mb[k].strided_count = NPAGES;
                }
            double c0 = now_s(CLOCK_PROCESS_CPUTIME_ID), t0 = now_s(CLOCK_MONOTONIC);
            if (way == 1 || way == 3)
                kvb_engine_write_group_async(w, mb, 2, sizeof(mb[0]), st, x);
            else
                for (int r = 0; r < 2; r++)
                    st[r] = kvb_engine_write_async_ex(w, sid[r], b[r], n, &wp[r], &x[r]);
            for (int r = 0; r < 2; r++)
                if (st[r] != KVB_OK || kvb_xfer_wait(x[r], 60) != KVB_OK)
                    return fprintf(stderr, "%s: write failed\n", names[way]), 1;
            double dt = now_s(CLOCK_MONOTONIC) - t0, dc = now_s(CLOCK_PROCESS_CPUTIME_ID) - c0;
            for (int r = 0; r < 2; r++)
                kvb_xfer_free(x[r]);
            double gb = (double)(NPAGES * PAGE) / 1e9;
            if (round > 0)
                printf("%-9s %5d %5.2f %8.3f\n", names[way], round, gb / dt, dc / gb);
            if (round == 0 && way != 2) /* bytes exact */
                for (size_t p = 0; p < NPAGES; p++)
                    for (size_t i = 0; i < rows; i++)
                        for (int r = 0; r < 2; r++)
                            if (memcmp(dst[r] + perm(p) * (PAGE / 2) + i * KiB,
                                       src + p * PAGE + i * ROW + (size_t)r * KiB, KiB) != 0)
                                return fprintf(stderr, "%s: bytes differ\n", names[way]), 1;
            if (round == 0 && way != 2)
                for (int r = 0; r < 2; r++)
                    memset(dst[r], 0, NPAGES * PAGE);
        }
    kvb_engine_destroy(w);
    for (int r = 0; r < 2; r++) {
        kvb_engine_destroy(t[r]);
        kvb_mem_free(dst[r]);
        free(hb[r]);
        free(pb[r]);
        free(sb[r]);
    }
    free(src);
    return 0;
}
