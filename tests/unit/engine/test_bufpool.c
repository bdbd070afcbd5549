/* The per-write array cache (engine/bufpool.h): reuse, bounds, and
 * concurrent get/put (run it under TSan: make check-tsan). */
#include "engine/bufpool.h"
#include "kvb_test.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>

#define MiB ((size_t)1 << 20)

static void *churn(void *arg)
{
    (void)arg;
    for (int i = 0; i < 2000; i++) {
        size_t cap = 0, want = (size_t)(64 << 10) * (size_t)(1 + i % 7);
        unsigned char *p = kvb__bufpool_get(want, &cap);
        CHECK(p != NULL && cap >= want);
        memset(p, i & 0xff, want); /* the whole asked size is ours */
        kvb__bufpool_put(p, cap);
    }
    return NULL;
}

int main(void)
{
    size_t cap = 0, bytes = 0;
    /* A kept array comes back for a request it fits, with its capacity. */
    void *a = kvb__bufpool_get(6 * MiB, &cap);
    CHECK(a != NULL && cap == 6 * MiB);
    kvb__bufpool_put(a, cap);
    CHECK_EQ(kvb__bufpool_kept(&bytes), 1);
    CHECK_EQ(bytes, 6 * MiB);
    void *b = kvb__bufpool_get(2 * MiB, &cap);
    CHECK(b == a && cap == 6 * MiB);
    CHECK_EQ(kvb__bufpool_kept(NULL), 0);
    /* One that does not fit is a fresh allocation; the smallest fit wins. */
    void *c = kvb__bufpool_get(8 * MiB, &cap);
    CHECK(c != NULL && c != b && cap == 8 * MiB);
    kvb__bufpool_put(c, 8 * MiB);
    kvb__bufpool_put(b, 6 * MiB);
    void *d = kvb__bufpool_get(5 * MiB, &cap);
    CHECK(d == b && cap == 6 * MiB);
    kvb__bufpool_put(d, cap);
    kvb__bufpool_drain();
    CHECK_EQ(kvb__bufpool_kept(&bytes), 0);
    CHECK_EQ(bytes, 0);

    /* Small arrays are not kept (malloc serves them from its heap). */
    void *s = kvb__bufpool_get(4096, &cap);
    kvb__bufpool_put(s, cap);
    CHECK_EQ(kvb__bufpool_kept(NULL), 0);
    kvb__bufpool_put(NULL, 123); /* no-op */

    /* Bounded by bytes: nothing past KVB__BUFPOOL_MAX_BYTES is kept. */
    size_t big = KVB__BUFPOOL_MAX_BYTES / 2 + MiB;
    void *x = kvb__bufpool_get(big, &cap), *y = kvb__bufpool_get(big, &cap);
    CHECK(x != NULL && y != NULL);
    kvb__bufpool_put(x, big);
    kvb__bufpool_put(y, big);
    CHECK_EQ(kvb__bufpool_kept(&bytes), 1);
    CHECK(bytes <= KVB__BUFPOOL_MAX_BYTES);
    kvb__bufpool_drain();

    /* Bounded by count. */
    void *v[KVB__BUFPOOL_SLOTS + 4];
    for (size_t i = 0; i < KVB__BUFPOOL_SLOTS + 4; i++)
        CHECK((v[i] = kvb__bufpool_get(128 << 10, &cap)) != NULL);
    for (size_t i = 0; i < KVB__BUFPOOL_SLOTS + 4; i++)
        kvb__bufpool_put(v[i], 128 << 10);
    CHECK_EQ(kvb__bufpool_kept(NULL), KVB__BUFPOOL_SLOTS);
    kvb__bufpool_drain();

    /* Concurrent users: each array handed to one user at a time (memset of
     * a shared one would race under TSan, and ASan sees any misuse). */
    pthread_t t[4];
    for (int i = 0; i < 4; i++)
        CHECK_EQ(pthread_create(&t[i], NULL, churn, NULL), 0);
    for (int i = 0; i < 4; i++)
        pthread_join(t[i], NULL);
    CHECK(kvb__bufpool_kept(&bytes) <= KVB__BUFPOOL_SLOTS);
    CHECK(bytes <= KVB__BUFPOOL_MAX_BYTES);
    kvb__bufpool_drain();
    TEST_PASS("bufpool");
    return 0;
}
