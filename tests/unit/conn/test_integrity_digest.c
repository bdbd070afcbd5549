/* KV integrity digests (src/conn/integrity.c, docs/integrity.md), pure:
 * the prefill's sums over its blocks equal the decode's recomputation over
 * the same bytes in its pages, whatever the blocks' order and split; a wrong
 * byte and a right page in the wrong place are both caught and located; a
 * partial-page block is refused as uncovered; a peer's value is checked
 * before anything is kept (every bad length, version, buffer, page). The
 * decode's check split in 1..5 parts run in any order (its check workers)
 * gives the same verdict and reason; item hashes handed over in walk order
 * (the direct lane's copy threads) give the same digest, a count that does
 * not match is uncovered. */
#include "conn/integrity.h"
#include "core/hash.h"
#include "kvb_test.h"

#include <stdlib.h>
#include <string.h>

#define NB 3
#define POOL 8
#define ITEM 256

static uint8_t src[NB][POOL * ITEM], dst[NB][POOL * ITEM];
static uint64_t dptr[NB];

/* The prefill's digest of pages src_pages -> dst_pages (n) over every
 * buffer, as one block per (buffer, page) taken in the order given by
 * reverse (a later chunk's blocks first), or one strided block per buffer. */
static void digest(kvb__integ_t *a, const int *sp, const int *dp, int n, int strided)
{
    CHECK_EQ(kvb__integ_init(a, NB), KVB_OK);
    for (int b = NB - 1; b >= 0; b--) {
        if (strided) { /* pages i -> i + 1 stepping evenly on both sides */
            kvb_strided_block_t x = {(uint64_t)(uintptr_t)&src[b][sp[0] * ITEM],
                                     dptr[b] + (uint64_t)dp[0] * ITEM,
                                     ITEM,
                                     ITEM,
                                     ITEM,
                                     (uint64_t)n};
            CHECK_EQ(kvb__integ_add_blocks(a, &x, 1, dptr, NB, ITEM), KVB_OK);
            continue;
        }
        for (int i = n - 1; i >= 0; i--) {
            kvb_strided_block_t x = {(uint64_t)(uintptr_t)&src[b][sp[i] * ITEM],
                                     dptr[b] + (uint64_t)dp[i] * ITEM,
                                     ITEM,
                                     0,
                                     0,
                                     1};
            kvb__integ_t one;
            CHECK_EQ(kvb__integ_init(&one, NB), KVB_OK);
            CHECK_EQ(kvb__integ_add_blocks(&one, &x, 1, dptr, NB, ITEM), KVB_OK);
            CHECK_EQ(kvb__integ_merge(a, &one), KVB_OK); /* chunks merged in any order */
            kvb__integ_free(&one);
        }
    }
    CHECK(!a->uncovered);
}

/* The decode's side: a's value over the wire into a fresh accumulator,
 * checked against dst. */
static bool verify(const kvb__integ_t *a, char *why, size_t wl)
{
    uint8_t *v;
    size_t len;
    kvb__integ_t d;
    CHECK_EQ(kvb__integ_encode(a, &v, &len), KVB_OK);
    CHECK_EQ(kvb__integ_init(&d, NB), KVB_OK);
    CHECK_EQ(kvb__integ_add_wire(&d, v, len, POOL, why, wl), KVB_OK);
    bool ok = kvb__integ_check(&d, dptr, ITEM, why, wl);
    kvb__integ_free(&d);
    free(v);
    return ok;
}

/* verify's check in 1..5 parts, run last to first (workers end in any
 * order): the same verdict and reason every time. */
static bool verify_parts(const kvb__integ_t *a, char *why, size_t wl)
{
    bool ok = verify(a, why, wl);
    uint8_t *v;
    size_t len;
    kvb__integ_t d;
    CHECK_EQ(kvb__integ_encode(a, &v, &len), KVB_OK);
    CHECK_EQ(kvb__integ_init(&d, NB), KVB_OK);
    CHECK_EQ(kvb__integ_add_wire(&d, v, len, POOL, why, wl), KVB_OK);
    for (size_t n = 1; n <= 5; n++) {
        kvb__integ_run_t r;
        char w2[320] = "";
        CHECK_EQ(kvb__integ_run_init(&d, &r), KVB_OK);
        for (size_t part = n; part-- > 0;)
            kvb__integ_run_part(&d, &r, dptr, ITEM, part, n);
        CHECK_EQ(kvb__integ_run_verdict(&d, &r, w2, sizeof(w2)), ok);
        CHECK(ok || strcmp(w2, why) == 0);
        kvb__integ_run_free(&r);
    }
    kvb__integ_free(&d);
    free(v);
    return ok;
}

static void copy_pages(const int *sp, const int *dp, int n)
{
    for (int b = 0; b < NB; b++)
        for (int i = 0; i < n; i++)
            memcpy(&dst[b][dp[i] * ITEM], &src[b][sp[i] * ITEM], ITEM);
}

static void refused(const uint8_t *v, size_t len, const char *needle)
{
    kvb__integ_t d;
    char why[256] = "";
    CHECK_EQ(kvb__integ_init(&d, NB), KVB_OK);
    CHECK_EQ(kvb__integ_add_wire(&d, v, len, POOL, why, sizeof(why)), KVB_ERR_PROTO);
    CHECK_STR_CONTAINS(why, needle);
    CHECK_EQ(d.n_pages, (size_t)0); /* nothing kept */
    for (int b = 0; b < NB; b++)
        CHECK_EQ(d.buf_seen[b], 0);
    kvb__integ_free(&d);
}

int main(void)
{
    uint64_t seed = 7;
    char why[320];
    for (int b = 0; b < NB; b++) {
        dptr[b] = (uint64_t)(uintptr_t)dst[b];
        for (size_t k = 0; k < sizeof(src[b]); k++)
            src[b][k] = (uint8_t)kvb_test_splitmix(&seed);
    }
    int sp[3] = {5, 6, 7}, dp[3] = {1, 2, 3};
    copy_pages(sp, dp, 3);

    /* per-block and strided digests of the same bytes agree, and match */
    kvb__integ_t a, s;
    digest(&a, sp, dp, 3, 0);
    digest(&s, sp, dp, 3, 1);
    CHECK_EQ(a.n_pages, (size_t)3);
    CHECK_EQ(s.n_pages, (size_t)3);
    CHECK(memcmp(a.pages, s.pages, 3 * 16) == 0);
    CHECK(memcmp(a.buf_sum, s.buf_sum, NB * 8) == 0);
    CHECK(verify(&a, why, sizeof(why)));
    /* pages contiguous on both sides, coalesced into one row per buffer
     * (as the planner writes a run): the same digest */
    kvb__integ_t c;
    CHECK_EQ(kvb__integ_init(&c, NB), KVB_OK);
    for (int b = 0; b < NB; b++) {
        kvb_strided_block_t row = {
            (uint64_t)(uintptr_t)&src[b][5 * ITEM], dptr[b] + 1 * ITEM, 3 * ITEM, 0, 0, 1};
        CHECK_EQ(kvb__integ_add_blocks(&c, &row, 1, dptr, NB, ITEM), KVB_OK);
    }
    CHECK(!c.uncovered);
    CHECK(c.n_pages == 3 && memcmp(a.pages, c.pages, 3 * 16) == 0);
    CHECK(memcmp(a.buf_sum, c.buf_sum, NB * 8) == 0);
    kvb__integ_free(&c);
    /* the same rows with their item hashes handed over in walk order (the
     * direct lane's copy threads hashed them): the same digest; one hash
     * short or one too many: uncovered */
    kvb_strided_block_t rows[NB];
    uint64_t h[NB * 3 + 1];
    for (int b = 0; b < NB; b++) {
        rows[b] = (kvb_strided_block_t){
            (uint64_t)(uintptr_t)&src[b][5 * ITEM], dptr[b] + 1 * ITEM, 3 * ITEM, 0, 0, 1};
        for (int i = 0; i < 3; i++)
            h[b * 3 + i] = kvb__item_hash(&src[b][(5 + i) * ITEM], ITEM, dptr[b] + (1 + i) * ITEM);
    }
    for (int extra = -1; extra <= 1; extra++) {
        CHECK_EQ(kvb__integ_init(&c, NB), KVB_OK);
        CHECK_EQ(kvb__integ_add_hashes(&c, rows, NB, dptr, NB, ITEM, h, (size_t)(NB * 3 + extra)),
                 KVB_OK);
        CHECK_EQ(c.uncovered, extra != 0);
        if (extra == 0) {
            CHECK(c.n_pages == 3 && memcmp(a.pages, c.pages, 3 * 16) == 0);
            CHECK(memcmp(a.buf_sum, c.buf_sum, NB * 8) == 0);
        }
        kvb__integ_free(&c);
    }

    /* a wrong byte: buffer 2, page 3 */
    dst[2][3 * ITEM + 17] ^= 0x40;
    CHECK(!verify_parts(&a, why, sizeof(why)));
    CHECK_STR_CONTAINS(why, "buffer 2 page 3 ");
    dst[2][3 * ITEM + 17] ^= 0x40;
    CHECK(verify(&a, why, sizeof(why)));

    /* right bytes in the wrong place: pages 1 and 2 of buffer 0 swapped */
    uint8_t tmp[ITEM];
    memcpy(tmp, &dst[0][1 * ITEM], ITEM);
    memcpy(&dst[0][1 * ITEM], &dst[0][2 * ITEM], ITEM);
    memcpy(&dst[0][2 * ITEM], tmp, ITEM);
    CHECK(!verify_parts(&a, why, sizeof(why)));
    CHECK_STR_CONTAINS(why, "buffer 0 page 1 ");
    memcpy(&dst[0][2 * ITEM], &dst[0][1 * ITEM], ITEM);
    memcpy(&dst[0][1 * ITEM], tmp, ITEM);
    CHECK(verify_parts(&a, why, sizeof(why)));

    /* a block that writes part of a page is not covered */
    kvb__integ_t p;
    CHECK_EQ(kvb__integ_init(&p, NB), KVB_OK);
    kvb_strided_block_t half = {(uint64_t)(uintptr_t)src[0], dptr[0], ITEM / 2, ITEM, ITEM, 2};
    CHECK_EQ(kvb__integ_add_blocks(&p, &half, 1, dptr, NB, ITEM), KVB_OK);
    CHECK(p.uncovered);
    CHECK_STR_CONTAINS(p.why, "part of a destination page");
    kvb__integ_free(&p);

    /* hostile values */
    uint8_t *v;
    size_t len;
    CHECK_EQ(kvb__integ_encode(&a, &v, &len), KVB_OK);
    CHECK_EQ(len, (size_t)(16 + 16 * NB + 16 * 3));
    refused(v, 8, "not a version-1 digest");
    refused(v, len - 1, "in ");
    uint8_t *w = malloc(len);
    memcpy(w, v, len);
    w[0] = 2; /* version */
    refused(w, len, "not a version-1 digest");
    memcpy(w, v, len);
    uint64_t big = NB; /* buffer index past ours */
    memcpy(w + 16, &big, 8);
    refused(w, len, "names buffer 3");
    memcpy(w, v, len);
    uint64_t far = POOL; /* page past the pool */
    memcpy(w + 16 + 16 * NB, &far, 8);
    refused(w, len, "names page 8");
    memcpy(w, v, len);
    uint32_t many = (1u << 20) + 1; /* past the page cap */
    memcpy(w + 8, &many, 4);
    refused(w, len, "at most");
    free(w);
    free(v);
    kvb__integ_free(&a);
    kvb__integ_free(&s);
    TEST_PASS("integrity digests: order-free, wrong byte and wrong place located (in one check "
              "and in parts), handed-over item hashes the same, partial pages uncovered, hostile "
              "values refused");
    return 0;
}
