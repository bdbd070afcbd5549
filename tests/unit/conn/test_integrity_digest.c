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

#include <stdio.h>
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

/* a's value over the wire into a fresh accumulator d (the decode's side). */
static void to_decode(const kvb__integ_t *a, kvb__integ_t *d, char *why, size_t wl)
{
    uint8_t *v;
    size_t len;
    CHECK_EQ(kvb__integ_encode(a, &v, &len), KVB_OK);
    CHECK_EQ(kvb__integ_init(d, NB), KVB_OK);
    CHECK_EQ(kvb__integ_add_wire(d, v, len, POOL, ITEM, why, wl), KVB_OK);
    free(v);
}

/* The decode's side: a's value over the wire, checked against dst. */
static bool verify(const kvb__integ_t *a, char *why, size_t wl)
{
    kvb__integ_t d;
    to_decode(a, &d, why, wl);
    bool ok = kvb__integ_check(&d, dptr, ITEM, why, wl);
    kvb__integ_free(&d);
    return ok;
}

/* verify's check in 1..5 parts, run last to first (workers end in any
 * order): the same verdict and reason every time. */
static bool verify_parts(const kvb__integ_t *a, char *why, size_t wl)
{
    bool ok = verify(a, why, wl);
    kvb__integ_t d;
    to_decode(a, &d, why, wl);
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
    CHECK_EQ(kvb__integ_add_wire(&d, v, len, POOL, ITEM, why, sizeof(why)), KVB_ERR_PROTO);
    CHECK_STR_CONTAINS(why, needle);
    CHECK_EQ(d.n_pages, (size_t)0); /* nothing kept */
    CHECK_EQ(d.n_pats, (size_t)1);
    for (int b = 0; b < NB; b++)
        CHECK_EQ(d.buf_seen[b], 0);
    kvb__integ_free(&d);
}

/* ---- parts of pages (integ_share.c, wire version 2) ----
 * Page geometry of these tests: P rows of H heads of HD bytes = ITEM. */
#define P 4
#define H 4
#define HD 16
#define ROW (H * HD)

/* Streaming over any split of the bytes equals the one-shot item hash, in
 * each of XXH3's length classes: a whole-page share keeps today's digest. */
static void test_stream(void)
{
    static uint8_t buf[4096];
    uint64_t seed = 11;
    for (size_t k = 0; k < sizeof(buf); k++)
        buf[k] = (uint8_t)kvb_test_splitmix(&seed);
    const size_t lens[] = {0, 1, 16, 17, 128, 129, 240, 241, 256, 1024, 1025, 4096};
    for (size_t i = 0; i < sizeof(lens) / sizeof(lens[0]); i++) {
        size_t n = lens[i];
        uint64_t one = kvb__item_hash(buf, n, 0x1000 + i);
        kvb__hpiece_t pc[3] = {
            {buf, n / 3}, {buf + n / 3, n / 2 - n / 3}, {buf + n / 2, n - n / 2}};
        CHECK_EQ(kvb__pieces_hash(pc, 3, 0x1000 + i), one);
        CHECK_EQ(kvb__strided_hash(buf, n, n, 1, 0x1000 + i), one);
        if (n % 4 == 0)
            CHECK_EQ(kvb__strided_hash(buf, n / 4, n / 4, 4, 0x1000 + i), one);
    }
}

/* Whether byte k of a page is source s's (the test's plan, said byte by
 * byte, independently of any pattern). */
typedef bool (*mine_fn)(size_t k, int s);
static bool nhd_heads(size_t k, int s) /* NHD, source s holds heads 2s, 2s+1 */
{
    return (int)((k % ROW) / HD / 2) == s;
}
static bool hnd_rows1(size_t k, int s) /* HND, rows 1.. of every head (a 1-row prefix) */
{
    (void)s;
    return (k % (P * HD)) / HD >= 1;
}

/* The reference: source s's share of page pg summed over the buffers, each
 * gathered byte by byte from the landed page in address order. */
static uint64_t ref_share(uint64_t pg, mine_fn mine, int s)
{
    uint8_t g[ITEM];
    uint64_t sum = 0;
    for (int b = 0; b < NB; b++) {
        size_t n = 0;
        for (size_t k = 0; k < ITEM; k++)
            if (mine(k, s))
                g[n++] = dst[b][pg * ITEM + k];
        sum += kvb__item_hash(g, n, dptr[b] + pg * ITEM);
    }
    return sum;
}

/* The decode's check of the values v[n] (one per source, added in reverse
 * order), in 1..3 parts: the same verdict and reason each time. */
static bool check_values(uint8_t *const *v, const size_t *len, int n, char *why, size_t wl)
{
    kvb__integ_t d;
    bool ok = false;
    CHECK_EQ(kvb__integ_init(&d, NB), KVB_OK);
    for (int i = n; i-- > 0;)
        CHECK_EQ(kvb__integ_add_wire(&d, v[i], len[i], POOL, ITEM, why, wl), KVB_OK);
    for (size_t parts = 1; parts <= 3; parts++) {
        kvb__integ_run_t r;
        char w2[320] = "";
        CHECK_EQ(kvb__integ_run_init(&d, &r), KVB_OK);
        for (size_t part = parts; part-- > 0;)
            kvb__integ_run_part(&d, &r, dptr, ITEM, part, parts);
        bool v2 = kvb__integ_run_verdict(&d, &r, w2, sizeof(w2));
        CHECK(parts == 1 || v2 == ok);
        if (parts == 1) {
            ok = v2;
            snprintf(why, wl, "%s", w2);
        }
        CHECK(ok || strcmp(w2, why) == 0);
        kvb__integ_run_free(&r);
    }
    kvb__integ_free(&d);
    return ok;
}

/* Land and digest blocks b[n] of one source into a (peer reads version 2). */
static void land(kvb__integ_t *a, const kvb_strided_block_t *b, size_t n)
{
    CHECK_EQ(kvb__integ_init(a, NB), KVB_OK);
    a->peer_v2 = 1;
    a->dst_pool = POOL;
    CHECK_EQ(kvb__integ_add_blocks(a, b, n, dptr, NB, ITEM), KVB_OK);
    for (size_t i = 0; i < n; i++)
        for (uint64_t k = 0; k < b[i].count; k++)
            memcpy((void *)(uintptr_t)(b[i].dst + k * b[i].dst_stride),
                   (const void *)(uintptr_t)(b[i].src + k * b[i].src_stride), b[i].len);
}

static void flip_found(uint8_t *const *v, const size_t *len, int n, int b, size_t at,
                       const char *needle)
{
    char why[320];
    dst[b][at] ^= 0x20;
    CHECK(!check_values(v, len, n, why, sizeof(why)));
    CHECK_STR_CONTAINS(why, needle);
    dst[b][at] ^= 0x20;
    CHECK(check_values(v, len, n, why, sizeof(why)));
}

/* Heterogeneous TP 2 -> 1, NHD: source s writes heads 2s, 2s+1 of every row
 * of decode pages 1 and 2 of every buffer (its pages 2 and 3, rows of 2
 * heads). Each share is one pattern, the sum the byte-by-byte reference;
 * both values, checked together, match what landed; a flipped byte in
 * either share is located. */
static void test_hetero_nhd(void)
{
    static uint8_t ssrc[2][NB][POOL * P * 2 * HD];
    uint64_t seed = 21;
    uint8_t *v[2];
    size_t len[2];
    char why[320];
    for (int s = 0; s < 2; s++) {
        for (size_t k = 0; k < sizeof(ssrc[s]); k++)
            ssrc[s][k / sizeof(ssrc[s][0])][k % sizeof(ssrc[s][0])] =
                (uint8_t)kvb_test_splitmix(&seed);
        kvb_strided_block_t x[NB * 2];
        for (int b = 0; b < NB; b++)
            for (int i = 0; i < 2; i++)
                x[b * 2 + i] =
                    (kvb_strided_block_t){(uint64_t)(uintptr_t)&ssrc[s][b][(2 + i) * P * 2 * HD],
                                          dptr[b] + (uint64_t)(1 + i) * ITEM + (uint64_t)s * 2 * HD,
                                          2 * HD,
                                          2 * HD,
                                          ROW,
                                          P};
        kvb__integ_t a;
        land(&a, x, NB * 2);
        CHECK(!a.uncovered);
        CHECK_EQ(a.n_pages, (size_t)2);
        const kvb__integ_pat_t *t = &a.pats[a.pages[0].pat];
        CHECK(t->off == (uint64_t)s * 2 * HD && t->len == 2 * HD && t->stride == ROW &&
              t->count == P);
        CHECK(kvb__integ_sendable(&a));
        CHECK_EQ(kvb__integ_encode(&a, &v[s], &len[s]), KVB_OK);
        CHECK_EQ(v[s][0], 2);
        kvb__integ_free(&a);
    }
    for (int s = 0; s < 2; s++) { /* the sums against the reference, on what landed */
        kvb__integ_t d;
        CHECK_EQ(kvb__integ_init(&d, NB), KVB_OK);
        CHECK_EQ(kvb__integ_add_wire(&d, v[s], len[s], POOL, ITEM, why, sizeof(why)), KVB_OK);
        CHECK(d.n_pages == 2 && d.pages[0].page == 1 && d.pages[1].page == 2);
        CHECK_EQ(d.pages[0].sum, ref_share(1, nhd_heads, s));
        CHECK_EQ(d.pages[1].sum, ref_share(2, nhd_heads, s));
        kvb__integ_free(&d);
    }
    CHECK(check_values(v, len, 2, why, sizeof(why)));
    flip_found(v, len, 2, 1, 2 * ITEM + 2 * ROW + 40, "buffer 1 page 2 "); /* source 1's head 2 */
    flip_found(v, len, 2, 0, 1 * ITEM + 3 * ROW + 5, "buffer 0 page 1 ");  /* source 0's head 0 */
    /* one source's value alone: the other's bytes are outside it */
    dst[2][1 * ITEM + 40] ^= 1;
    CHECK(check_values(v, len, 1, why, sizeof(why)));
    dst[2][1 * ITEM + 40] ^= 1;
    free(v[0]);
    free(v[1]);
}

/* HND with a decode prefix of one row: rows 1..3 of every head of page 3,
 * written as two blocks of two heads each (added last block first): one
 * pattern (16, 48, 64, 4), the reference's sum. NHD rows 1..3 from two
 * blocks (rows 1, then 2..3) join into one run. Two half pages (page size
 * 2 -> 4) join into the whole page: version 1, the one-shot item hash. */
static void test_patterns(void)
{
    char why[320];
    uint8_t *v;
    size_t len;
    kvb__integ_t a;
    kvb_strided_block_t x[2 * NB];
    for (int b = 0; b < NB; b++)
        for (int i = 0; i < 2; i++) /* heads 2i, 2i+1; block 1 first */
            x[b * 2 + 1 - i] = (kvb_strided_block_t){(uint64_t)(uintptr_t)&src[b][i * 2 * P * HD],
                                                     dptr[b] + 3 * ITEM + (2 * i * P + 1) * HD,
                                                     (P - 1) * HD,
                                                     P * HD,
                                                     P * HD,
                                                     2};
    land(&a, x, 2 * NB);
    CHECK(!a.uncovered && a.n_pages == 1 && a.pages[0].page == 3);
    const kvb__integ_pat_t *t = &a.pats[a.pages[0].pat];
    CHECK(t->off == HD && t->len == (P - 1) * HD && t->stride == P * HD && t->count == H);
    CHECK(kvb__integ_sendable(&a));
    CHECK_EQ(kvb__integ_encode(&a, &v, &len), KVB_OK);
    CHECK_EQ(a.pages[0].sum, ref_share(3, hnd_rows1, 0));
    CHECK(check_values(&v, &len, 1, why, sizeof(why)));
    flip_found(&v, &len, 1, 2, 3 * ITEM + 2 * P * HD + HD + 3, "buffer 2 page 3 ");
    dst[1][3 * ITEM + 2] ^= 1; /* in the prefix: not the prefill's bytes */
    CHECK(check_values(&v, &len, 1, why, sizeof(why)));
    dst[1][3 * ITEM + 2] ^= 1;
    free(v);
    kvb__integ_free(&a);

    for (int b = 0; b < NB; b++) { /* NHD rows 1, then 2..3 of page 4 */
        x[2 * b] = (kvb_strided_block_t){
            (uint64_t)(uintptr_t)&src[b][0], dptr[b] + 4 * ITEM + ROW, ROW, 0, 0, 1};
        x[2 * b + 1] = (kvb_strided_block_t){
            (uint64_t)(uintptr_t)&src[b][512], dptr[b] + 4 * ITEM + 2 * ROW, 2 * ROW, 0, 0, 1};
    }
    land(&a, x, 2 * NB);
    t = &a.pats[a.pages[0].pat];
    CHECK(!a.uncovered && t->off == ROW && t->len == 3 * ROW && t->count == 1);
    kvb__integ_free(&a);

    for (int b = 0; b < NB; b++) /* page size 2 -> 4: halves of page 5 from pages 6, 1 */
        for (int i = 0; i < 2; i++)
            x[2 * b + i] = (kvb_strided_block_t){(uint64_t)(uintptr_t)&src[b][(i ? 1 : 6) * ITEM],
                                                 dptr[b] + 5 * ITEM + (uint64_t)i * ITEM / 2,
                                                 ITEM / 2,
                                                 0,
                                                 0,
                                                 1};
    land(&a, x, 2 * NB);
    CHECK(!a.uncovered && a.n_pages == 1 && a.pages[0].pat == 0);
    uint64_t whole = 0;
    for (int b = 0; b < NB; b++)
        whole += kvb__item_hash(&dst[b][5 * ITEM], ITEM, dptr[b] + 5 * ITEM);
    CHECK_EQ(a.pages[0].sum, whole);
    CHECK_EQ(kvb__integ_encode(&a, &v, &len), KVB_OK);
    CHECK_EQ(v[0], 1);
    CHECK(check_values(&v, &len, 1, why, sizeof(why)));
    free(v);
    kvb__integ_free(&a);
}

/* Pieces that are no single pattern, a decode that reads only version 1, a
 * share not in every buffer: uncovered, with the reason, never a digest. */
static void test_uncovered(void)
{
    kvb__integ_t a;
    kvb_strided_block_t half = {(uint64_t)(uintptr_t)src[0], dptr[0], ITEM / 2, ITEM, ITEM, 2};
    kvb_strided_block_t half_page0 = {(uint64_t)(uintptr_t)src[0], dptr[0], ITEM / 2, 0, 0, 1};
    kvb_strided_block_t odd[2] = {{(uint64_t)(uintptr_t)src[0], dptr[0], 32, 0, 0, 1},
                                  {(uint64_t)(uintptr_t)src[0], dptr[0] + 64, 16, 0, 0, 1}};
    CHECK_EQ(kvb__integ_init(&a, NB), KVB_OK);
    a.dst_pool = POOL;
    CHECK_EQ(kvb__integ_add_blocks(&a, odd, 2, dptr, NB, ITEM), KVB_OK);
    CHECK(a.uncovered);
    CHECK_STR_CONTAINS(a.why, "buffer 0 page 0: the parts written into it form no single strided");
    CHECK(!kvb__integ_sendable(&a));
    kvb__integ_free(&a);
    kvb_strided_block_t uneven[3] = {{(uint64_t)(uintptr_t)src[0], dptr[0], 16, 0, 0, 1},
                                     {(uint64_t)(uintptr_t)src[0], dptr[0] + 32, 16, 0, 0, 1},
                                     {(uint64_t)(uintptr_t)src[0], dptr[0] + 96, 16, 0, 0, 1}};
    CHECK_EQ(kvb__integ_init(&a, NB), KVB_OK);
    a.dst_pool = POOL;
    CHECK_EQ(kvb__integ_add_blocks(&a, uneven, 3, dptr, NB, ITEM), KVB_OK);
    CHECK(a.uncovered);
    kvb__integ_free(&a);
    /* parts of pages with the destination's KV page count unknown:
     * uncovered */
    CHECK_EQ(kvb__integ_init(&a, NB), KVB_OK);
    CHECK_EQ(kvb__integ_add_blocks(&a, &half_page0, 1, dptr, NB, ITEM), KVB_OK);
    CHECK(a.uncovered && a.n_pages == 0);
    CHECK_STR_CONTAINS(a.why, "outside the destination's KV pages");
    kvb__integ_free(&a);
    /* state blocks past the KV pages (state buffers laid after them: 96-byte
     * items, whole-item ones) are left out: the digest is the KV's alone,
     * the same as without them (a whole page; then with half a page) */
    kvb_strided_block_t st96 = {
        (uint64_t)(uintptr_t)src[0], dptr[NB - 1] + POOL * ITEM + 8, 96, 0, 0, 1};
    kvb_strided_block_t st256 = {
        (uint64_t)(uintptr_t)src[0], dptr[NB - 1] + POOL * ITEM, ITEM, 0, 0, 1};
    kvb_strided_block_t kv[2] = {
        {(uint64_t)(uintptr_t)src[1], dptr[1] + 2 * ITEM, ITEM, 0, 0, 1},
        {(uint64_t)(uintptr_t)src[1], dptr[1] + 3 * ITEM, ITEM / 2, 0, 0, 1}};
    for (int n_kv = 1; n_kv <= 2; n_kv++) {
        kvb_strided_block_t with[4] = {st96, kv[0], st256, n_kv == 2 ? kv[1] : st96};
        kvb__integ_t w;
        CHECK_EQ(kvb__integ_init(&a, NB), KVB_OK);
        CHECK_EQ(kvb__integ_init(&w, NB), KVB_OK);
        a.dst_pool = w.dst_pool = POOL;
        CHECK_EQ(kvb__integ_add_blocks(&a, with, 4, dptr, NB, ITEM), KVB_OK);
        CHECK_EQ(kvb__integ_add_blocks(&w, kv, (size_t)n_kv, dptr, NB, ITEM), KVB_OK);
        CHECK(!a.uncovered && a.n_pages == (size_t)n_kv && a.n_pages == w.n_pages);
        CHECK(memcmp(a.pages, w.pages, a.n_pages * sizeof(*a.pages)) == 0);
        CHECK(memcmp(a.buf_sum, w.buf_sum, NB * 8) == 0 && a.buf_seen[NB - 1] == 0);
        kvb__integ_free(&a);
        kvb__integ_free(&w);
    }

    CHECK_EQ(kvb__integ_init(&a, NB), KVB_OK);
    a.dst_pool = POOL;
    CHECK_EQ(kvb__integ_add_blocks(&a, &half, 1, dptr, NB, ITEM), KVB_OK);
    CHECK(!a.uncovered);
    CHECK(!kvb__integ_sendable(&a)); /* peer_v2 0: an older decode */
    CHECK_STR_CONTAINS(a.why, "kv_digest=2");
    kvb__integ_free(&a);

    kvb_strided_block_t mixed[2] = {{(uint64_t)(uintptr_t)src[0], dptr[0], ITEM / 2, 0, 0, 1},
                                    {(uint64_t)(uintptr_t)src[1], dptr[1], ITEM, 0, 0, 1}};
    CHECK_EQ(kvb__integ_init(&a, NB), KVB_OK);
    a.peer_v2 = 1;
    a.dst_pool = POOL;
    CHECK_EQ(kvb__integ_add_blocks(&a, mixed, 2, dptr, NB, ITEM), KVB_OK);
    CHECK(!kvb__integ_sendable(&a));
    CHECK_STR_CONTAINS(a.why, "page 0: a share written in 1 of the 2 buffers");
    kvb__integ_free(&a);
}

/* Hostile version-2 values, each refused with its reason, nothing kept. */
static void test_hostile_v2(void)
{
    kvb__integ_t a;
    uint8_t *v;
    size_t len;
    kvb_strided_block_t x = {(uint64_t)(uintptr_t)src[0], dptr[0] + 2 * ITEM + 32, 32, 32, ROW, P};
    CHECK_EQ(kvb__integ_init(&a, NB), KVB_OK);
    a.peer_v2 = 1;
    a.dst_pool = POOL;
    CHECK_EQ(kvb__integ_add_blocks(&a, &x, 1, dptr, NB, ITEM), KVB_OK);
    CHECK(kvb__integ_sendable(&a));
    CHECK_EQ(kvb__integ_encode(&a, &v, &len), KVB_OK);
    CHECK_EQ(len, (size_t)(16 + 16 + 32 + 24)); /* 1 buffer, 1 pattern, 1 page */
    kvb__integ_free(&a);
    const size_t pat = 32, ent = 64; /* offsets of the pattern and the entry */
    uint8_t *w = malloc(len);
    struct {
        size_t at;
        uint64_t val;
        int width;
        const char *needle;
    } cases[] = {
        {pat, ITEM - 8, 8, "is not inside a page of 256 bytes"},    /* offset past the page */
        {pat + 8, 0, 8, "is not inside"},                           /* empty pieces */
        {pat + 16, 8, 8, "is not inside"},                          /* overlapping pieces */
        {pat + 16, 1ull << 62, 8, "is not inside"},                 /* stride x count wraps */
        {pat + 24, 1ull << 62, 8, "is not inside"},                 /* count past the page */
        {pat + 24, 0, 8, "is not inside"},                          /* no pieces */
        {ent, POOL, 8, "names page 8"},                             /* page past the pool */
        {ent + 16, 2, 4, "names pattern 2 of 1"},                   /* no such pattern */
        {ent + 20, 1, 4, "names pattern"},                          /* reserved word */
        {12, KVB__INTEG_MAX_PATS + 1, 4, "patterns (at most 256)"}, /* past the pattern cap */
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        memcpy(w, v, len);
        memcpy(w + cases[i].at, &cases[i].val, (size_t)cases[i].width);
        refused(w, len, cases[i].needle);
    }
    /* a valid one keeps its pattern; 256 patterns in all a room's values hold */
    char why[256];
    CHECK_EQ(kvb__integ_init(&a, NB), KVB_OK);
    CHECK_EQ(kvb__integ_add_wire(&a, v, len, POOL, ITEM, why, sizeof(why)), KVB_OK);
    CHECK(a.n_pats == 2 && a.pats[1].off == 32 && a.pats[1].count == P);
    CHECK_EQ(kvb__integ_add_wire(&a, v, len, POOL, 0, why, sizeof(why)), KVB_ERR_PROTO);
    CHECK_STR_CONTAINS(why, "page size is unknown");
    kvb__integ_free(&a);
    free(w);
    free(v);
}

static void test_shares(void)
{
    test_stream();
    test_hetero_nhd();
    test_patterns();
    test_uncovered();
    test_hostile_v2();
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
    CHECK(memcmp(a.pages, s.pages, 3 * sizeof(*a.pages)) == 0);
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
    CHECK(c.n_pages == 3 && memcmp(a.pages, c.pages, 3 * sizeof(*a.pages)) == 0);
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
            CHECK(c.n_pages == 3 && memcmp(a.pages, c.pages, 3 * sizeof(*a.pages)) == 0);
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

    /* parts of pages (integ_share.c): below, test_shares */
    test_shares();

    /* hostile values */
    uint8_t *v;
    size_t len;
    CHECK_EQ(kvb__integ_encode(&a, &v, &len), KVB_OK);
    CHECK_EQ(len, (size_t)(16 + 16 * NB + 16 * 3));
    CHECK_EQ(v[0], 1); /* whole pages: today's version-1 value */
    refused(v, 8, "not a version-1 or -2 digest");
    refused(v, len - 1, "in ");
    uint8_t *w = malloc(len);
    memcpy(w, v, len);
    w[0] = 3; /* version */
    refused(w, len, "not a version-1 or -2 digest");
    w[0] = 2; /* a version-1 body read as version 2: its length does not add up */
    refused(w, len, "patterns (at most 256) in");
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
              "and in parts), handed-over item hashes the same, partial pages digested by "
              "pattern, hostile values refused");
    return 0;
}
