/* TokenSpeed's ts_mooncake_* C ABI (include/kvbridge/ts_mooncake.h) between
 * two engines of this process: abi_version, create (rdma only, NULL
 * otherwise), rpc_port, register (overlap, zero length), write and
 * write_pages (several fields and pages, runs that become strided blocks
 * and spans that do not, one batch and batches crossing fields) with the
 * target's bytes checked against an image; a bad fields row, a negative
 * page or stride, an overflowing base: -1 and nothing written; an empty
 * grid: 0; a span outside the target's registration: negative, nothing
 * written; unregister; destroy. */
#include <kvbridge/ts_mooncake.h>

#include "kvb_test.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SRC_LEN (1u << 20)
#define DST_LEN (1u << 20)
#define REGION (256u << 10) /* per field, both sides */

static uint64_t rng = 0x9e3779b97f4a7c15ull;

static void fill(uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        p[i] = (uint8_t)rng;
    }
}

/* What the grid must do, span by span, applied to the image. */
static void apply_pages(uint8_t *img, const uint8_t *src, uint64_t src_addr, uint64_t dst_addr,
                        const int64_t *sp, const int64_t *dp, size_t n, const int64_t *f, size_t nf)
{
    for (size_t r = 0; r < nf; r++)
        for (size_t i = 0; i < n; i++) {
            const int64_t *row = f + 5 * r;
            uint64_t s = (uint64_t)row[0] + (uint64_t)sp[i] * (uint64_t)row[1] - src_addr;
            uint64_t d = (uint64_t)row[2] + (uint64_t)dp[i] * (uint64_t)row[3] - dst_addr;
            memcpy(img + d, src + s, (size_t)row[4]);
        }
}

int main(void)
{
    CHECK(TS_MOONCAKE_ABI_VERSION == 1);
    CHECK(ts_mooncake_abi_version() == 1);

    /* create: rdma only; P2PHANDSHAKE only; NULL arguments */
    CHECK(ts_mooncake_create("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == NULL);
    CHECK(ts_mooncake_create("127.0.0.1", "P2PHANDSHAKE", "RDMA", "") == NULL);
    CHECK(ts_mooncake_create("127.0.0.1", "etcd://127.0.0.1:2379", "rdma", "") == NULL);
    CHECK(ts_mooncake_create(NULL, "P2PHANDSHAKE", "rdma", "") == NULL);
    ts_mooncake_destroy(NULL);

    ts_mooncake_engine_t *a = ts_mooncake_create("127.0.0.1", "P2PHANDSHAKE", "rdma", "");
    ts_mooncake_engine_t *b =
        ts_mooncake_create("127.0.0.1:1234", "P2PHANDSHAKE", "rdma", "mlx5_0,mlx5_1");
    CHECK(a != NULL && b != NULL);
    int pa = ts_mooncake_rpc_port(a), pb = ts_mooncake_rpc_port(b);
    CHECK(pa >= 15000 && pa <= 17000 && pb >= 15000 && pb <= 17000 && pa != pb);
    CHECK(ts_mooncake_rpc_port(NULL) == -1);
    char target[64];
    snprintf(target, sizeof(target), "127.0.0.1:%d", pb);

    uint8_t *src = malloc(SRC_LEN), *dst = calloc(1, DST_LEN), *img = calloc(1, DST_LEN);
    CHECK(src != NULL && dst != NULL && img != NULL);
    fill(src, SRC_LEN);
    CHECK(ts_mooncake_register(a, src, SRC_LEN) == 0);
    CHECK(ts_mooncake_register(b, dst, DST_LEN) == 0);
    CHECK(ts_mooncake_register(b, dst + 4096, 4096) == -7); /* overlap */
    CHECK(ts_mooncake_register(b, img, 0) == -1);           /* zero length */
    uint64_t S = (uint64_t)(uintptr_t)src, D = (uint64_t)(uintptr_t)dst;

    /* write: three spans */
    uint64_t srcs[3] = {S, S + 100000, S + 777}, dsts[3] = {D + 1, D + 500000, D + 900000};
    uint64_t lens[3] = {65536, 12345, 1};
    CHECK(ts_mooncake_write(a, target, srcs, dsts, lens, 3) == 0);
    for (int i = 0; i < 3; i++)
        memcpy(img + (dsts[i] - D), src + (srcs[i] - S), lens[i]);
    CHECK(memcmp(dst, img, DST_LEN) == 0);
    CHECK(ts_mooncake_write(a, target, srcs, dsts, lens, 0) == 0);
    CHECK(ts_mooncake_write(a, NULL, srcs, dsts, lens, 3) == -1);
    uint64_t out_dst[1] = {D + DST_LEN - 10}, out_len[1] = {100};
    CHECK(ts_mooncake_write(a, target, srcs, out_dst, out_len, 1) < 0);
    CHECK(memcmp(dst, img, DST_LEN) == 0);

    /* write_pages: 3 fields x 10 pages. Pages 0-4 -> 5-9 are one run
     * (contiguous on both sides), 10,12,14 -> 20,22,24 one strided run, the
     * last two single spans. Field 2 has a destination stride of 2048 and
     * 24-byte rows. */
    int64_t sp[10] = {0, 1, 2, 3, 4, 10, 12, 14, 40, 7};
    int64_t dp[10] = {5, 6, 7, 8, 9, 20, 22, 24, 1, 50};
    int64_t f[15] = {
        (int64_t)S,
        4096,
        (int64_t)D,
        4096,
        4096,
        (int64_t)(S + REGION),
        4096,
        (int64_t)(D + REGION),
        4096,
        1000,
        (int64_t)(S + 2 * REGION + 3),
        2048,
        (int64_t)(D + 2 * REGION + 5),
        2048,
        24,
    };
    for (int round = 0; round < 3; round++) {
        size_t batch = round == 0 ? 0 : round == 1 ? 7 : 1;
        fill(src, SRC_LEN);
        CHECK(ts_mooncake_write_pages(a, target, sp, dp, 10, f, 3, batch) == 0);
        apply_pages(img, src, S, D, sp, dp, 10, f, 3);
        CHECK(memcmp(dst, img, DST_LEN) == 0);
    }

    /* errors: -1 and nothing written */
    fill(src, SRC_LEN);
    int64_t bad[15];
    memcpy(bad, f, sizeof(bad));
    bad[5 + 4] = 0; /* row 1: zero length */
    CHECK(ts_mooncake_write_pages(a, target, sp, dp, 10, bad, 3, 0) == -1);
    memcpy(bad, f, sizeof(bad));
    bad[5 + 4] = -5; /* negative length */
    CHECK(ts_mooncake_write_pages(a, target, sp, dp, 10, bad, 3, 0) == -1);
    memcpy(bad, f, sizeof(bad));
    bad[10 + 3] = -2048; /* negative destination stride */
    CHECK(ts_mooncake_write_pages(a, target, sp, dp, 10, bad, 3, 0) == -1);
    memcpy(bad, f, sizeof(bad));
    bad[1] = -1; /* negative source stride */
    CHECK(ts_mooncake_write_pages(a, target, sp, dp, 10, bad, 3, 0) == -1);
    memcpy(bad, f, sizeof(bad));
    bad[2] = -4096; /* base 2^64 - 4096: span addresses overflow */
    CHECK(ts_mooncake_write_pages(a, target, sp, dp, 10, bad, 3, 0) == -1);
    int64_t negp[10];
    memcpy(negp, dp, sizeof(negp));
    negp[9] = -1;
    CHECK(ts_mooncake_write_pages(a, target, sp, negp, 10, f, 3, 0) == -1);
    CHECK(ts_mooncake_write_pages(a, NULL, sp, dp, 10, f, 3, 0) == -1);
    /* a destination span past the target's registration: negative, and
     * nothing of that batch written */
    int64_t far[10];
    memcpy(far, dp, sizeof(far));
    far[9] = 1000;
    CHECK(ts_mooncake_write_pages(a, target, sp, far, 10, f, 3, 0) < 0);
    CHECK(memcmp(dst, img, DST_LEN) == 0);

    /* empty grids: 0 before any check (even NULL arrays, a bad row) */
    CHECK(ts_mooncake_write_pages(a, target, NULL, NULL, 0, f, 3, 0) == 0);
    CHECK(ts_mooncake_write_pages(a, target, sp, dp, 10, NULL, 0, 0) == 0);
    memcpy(bad, f, sizeof(bad));
    bad[4] = 0;
    CHECK(ts_mooncake_write_pages(a, target, sp, dp, 0, bad, 3, 0) == 0);
    CHECK(memcmp(dst, img, DST_LEN) == 0);

    /* unregister: 0, then -3; a write from the unregistered source fails */
    CHECK(ts_mooncake_unregister(a, src) == 0);
    CHECK(ts_mooncake_unregister(a, src) == -3);
    CHECK(ts_mooncake_write(a, target, srcs, dsts, lens, 3) < 0);
    CHECK(ts_mooncake_write_pages(a, target, sp, dp, 10, f, 3, 0) < 0);
    CHECK(memcmp(dst, img, DST_LEN) == 0);
    CHECK(ts_mooncake_unregister(b, dst) == 0);

    ts_mooncake_destroy(a);
    ts_mooncake_destroy(b);
    free(src);
    free(dst);
    free(img);
    printf("test_ts_mooncake_abi: ok\n");
    return 0;
}
