#include "engine/segtab.h"
#include "kvb_test.h"

static kvb__seg_t seg(uint64_t a, uint64_t l)
{
    kvb__seg_t s = {0};
    s.addr = a;
    s.len = l;
    return s;
}

int main(void)
{
    kvb__segtab_t t = {0};
    kvb__seg_t s;
    CHECK_EQ(kvb__segtab_insert(&t, (s = seg(1000, 100), &s)), KVB_OK);
    CHECK_EQ(kvb__segtab_insert(&t, (s = seg(3000, 100), &s)), KVB_OK);
    CHECK_EQ(kvb__segtab_insert(&t, (s = seg(2000, 100), &s)), KVB_OK);
    CHECK_EQ(t.n, 3);
    CHECK(t.v[0].addr == 1000 && t.v[1].addr == 2000 && t.v[2].addr == 3000);
    /* overlaps: same start, inside, straddling either end, covering */
    CHECK_EQ(kvb__segtab_insert(&t, (s = seg(1000, 1), &s)), KVB_ERR_OVERLAP);
    CHECK_EQ(kvb__segtab_insert(&t, (s = seg(1050, 10), &s)), KVB_ERR_OVERLAP);
    CHECK_EQ(kvb__segtab_insert(&t, (s = seg(950, 51), &s)), KVB_ERR_OVERLAP);
    CHECK_EQ(kvb__segtab_insert(&t, (s = seg(1099, 10), &s)), KVB_ERR_OVERLAP);
    CHECK_EQ(kvb__segtab_insert(&t, (s = seg(500, 5000), &s)), KVB_ERR_OVERLAP);
    /* adjacent is fine */
    CHECK_EQ(kvb__segtab_insert(&t, (s = seg(1100, 100), &s)), KVB_OK);
    CHECK_EQ(kvb__segtab_insert(&t, (s = seg(900, 100), &s)), KVB_OK);
    /* empty and wrapping ranges */
    CHECK_EQ(kvb__segtab_insert(&t, (s = seg(10, 0), &s)), KVB_ERR_INVALID);
    CHECK_EQ(kvb__segtab_insert(&t, (s = seg(UINT64_MAX - 5, 10), &s)), KVB_ERR_INVALID);
    /* find: inside, exact, edges, across two adjacent segments, overflow */
    CHECK(kvb__segtab_find(&t, 1000, 100) >= 0);
    CHECK(kvb__segtab_find(&t, 1099, 1) >= 0);
    CHECK_EQ(kvb__segtab_find(&t, 1099, 2), -1); /* spans two adjacent segments */
    CHECK_EQ(kvb__segtab_find(&t, 2000, 101), -1);
    CHECK_EQ(kvb__segtab_find(&t, 1999, 2), -1);
    CHECK_EQ(kvb__segtab_find(&t, 899, 1), -1);
    CHECK_EQ(kvb__segtab_find(&t, 3100, 1), -1);
    CHECK_EQ(kvb__segtab_find(&t, 2050, 0), -1);
    CHECK_EQ(kvb__segtab_find(&t, 2050, UINT64_MAX), -1);
    CHECK_EQ(kvb__segtab_find(&t, UINT64_MAX, 2), -1);
    CHECK_EQ(kvb__segtab_find_start(&t, 2000), 3);
    CHECK_EQ(kvb__segtab_find_start(&t, 2001), -1);
    kvb__segtab_remove(&t, 3, &s);
    CHECK(s.addr == 2000);
    CHECK_EQ(kvb__segtab_find(&t, 2000, 1), -1);
    CHECK_EQ(t.n, 4);
    kvb__segtab_free(&t);
    TEST_PASS("segtab");
    return 0;
}
