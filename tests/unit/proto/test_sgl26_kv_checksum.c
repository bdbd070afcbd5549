/* SGLang 0.5.23's KV checksum over host pages (src/dialect/sglang2026/
 * kv_checksum.c, docs/integrity.md "With SGLang's own checksum"): the
 * Adler-32 of every buffer's items in page order equals (1) the serial
 * Adler-32 written here from its definition over the concatenation, and
 * (2) what SGLang's GPU kernel computes: per-item (A, B, len) states, each
 * item's B from its weighted byte sum, folded with Adler-32's combine rule
 * in any grouping (a block-wise tree, as the kernel reduces). The order of
 * pages and of buffers matters; a changed byte changes the value. */
#include "dialect/sglang2026/kv_checksum.h"
#include "kvb_test.h"

#include <stdlib.h>
#include <string.h>

#define MOD 65521u
#define NB 3
#define POOL 6
#define ITEM 8200 /* past zlib's 5552-byte reduction run, not a multiple of 16 */

static uint8_t kv[NB][POOL * ITEM];
static uint64_t ptrs[NB];

/* Adler-32 from its definition: A = 1 + sum, B = sum of the running A's. */
static uint32_t adler_serial(uint32_t start, const uint8_t *p, size_t n)
{
    uint32_t a = start & 0xffff, b = start >> 16;
    for (size_t i = 0; i < n; i++) {
        a = (a + p[i]) % MOD;
        b = (b + a) % MOD;
    }
    return (b << 16) | a;
}

typedef struct {
    uint64_t a, b, len;
} st_t;

/* One item's state as the kernel forms it: A = 1 + sum x, B = n + sum (n - i) x_i. */
static st_t item_state(const uint8_t *p, uint64_t n)
{
    uint64_t sum = 0, w = 0;
    for (uint64_t i = 0; i < n; i++) {
        sum += p[i];
        w = (w + (n - i) % MOD * p[i]) % MOD;
    }
    return (st_t){(1 + sum) % MOD, (n % MOD + w) % MOD, n};
}

/* Adler-32's combine of left || right. */
static st_t combine(st_t l, st_t r)
{
    st_t o;
    o.a = (l.a + r.a + MOD - 1) % MOD;
    o.b = (l.b + r.b + (r.len % MOD) * ((l.a + MOD - 1) % MOD)) % MOD;
    o.len = l.len + r.len;
    return o;
}

/* Pairwise tree over states s[lo, hi) (the kernel's grouping differs only in
 * where it splits; the combine is associative). */
static st_t tree(const st_t *s, size_t lo, size_t hi)
{
    if (hi - lo == 1)
        return s[lo];
    size_t mid = lo + (hi - lo + 1) / 2;
    return combine(tree(s, lo, mid), tree(s, mid, hi));
}

static uint32_t reference(const int32_t *pages, size_t n)
{
    uint32_t a = 1;
    for (int b = 0; b < NB; b++)
        for (size_t i = 0; i < n; i++)
            a = adler_serial(a, &kv[b][(size_t)pages[i] * ITEM], ITEM);
    return a;
}

static uint32_t kernel_model(const int32_t *pages, size_t n)
{
    st_t s[NB * POOL];
    size_t k = 0;
    for (int b = 0; b < NB; b++)
        for (size_t i = 0; i < n; i++)
            s[k++] = item_state(&kv[b][(size_t)pages[i] * ITEM], ITEM);
    st_t t = tree(s, 0, k);
    return (uint32_t)((t.b << 16) | t.a);
}

int main(void)
{
    srand(35);
    for (int b = 0; b < NB; b++) {
        for (size_t i = 0; i < sizeof(kv[b]); i++)
            kv[b][i] = (uint8_t)(rand() >> 7);
        ptrs[b] = (uint64_t)(uintptr_t)kv[b];
    }
    /* Known value and the empty digest (SGLang's kernel answers 1). */
    const char *w = "Wikipedia";
    CHECK_EQ(adler_serial(1, (const uint8_t *)w, strlen(w)), 0x11E60398u);
    CHECK_EQ(kvb__sgl26_adler_items(ptrs, NB, ITEM, NULL, 0), 1u);

    int32_t pages[] = {4, 0, 5, 2};
    uint32_t d = kvb__sgl26_adler_items(ptrs, NB, ITEM, pages, 4);
    CHECK_EQ(d, reference(pages, 4));
    CHECK_EQ(d, kernel_model(pages, 4));
    int32_t one[] = {3};
    CHECK_EQ(kvb__sgl26_adler_items(ptrs, NB, ITEM, one, 1), kernel_model(one, 1));

    /* Page order and buffer order are part of the digest. */
    int32_t swapped[] = {0, 4, 5, 2};
    CHECK(kvb__sgl26_adler_items(ptrs, NB, ITEM, swapped, 4) != d);
    uint64_t rev[NB] = {ptrs[2], ptrs[1], ptrs[0]};
    CHECK(kvb__sgl26_adler_items(rev, NB, ITEM, pages, 4) != d);

    /* One byte changed anywhere in a digested item changes it; outside, not. */
    kv[1][5 * ITEM + 4097] ^= 0x20;
    CHECK(kvb__sgl26_adler_items(ptrs, NB, ITEM, pages, 4) != d);
    kv[1][5 * ITEM + 4097] ^= 0x20;
    kv[1][1 * ITEM + 10] ^= 0x20; /* page 1: not in the request */
    CHECK_EQ(kvb__sgl26_adler_items(ptrs, NB, ITEM, pages, 4), d);
    TEST_PASS("SGLang KV checksum: Adler-32 by definition and by the kernel's combine, "
              "order-bound, a changed byte seen");
    return 0;
}
