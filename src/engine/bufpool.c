#include "engine/bufpool.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>

/* Small arrays are cheap to malloc (glibc's heap, pages already touched):
 * keep only those worth it. */
#define MIN_KEEP ((size_t)64 << 10)

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static struct {
    void *p;
    size_t cap;
} g_v[KVB__BUFPOOL_SLOTS];
static size_t g_n, g_bytes;

void *kvb__bufpool_get(size_t bytes, size_t *cap_p)
{
    void *p = NULL;
    size_t best = SIZE_MAX, at = 0;
    pthread_mutex_lock(&g_mu);
    /* The smallest kept array that fits: large ones stay for large writes. */
    for (size_t i = 0; i < g_n; i++)
        if (g_v[i].cap >= bytes && g_v[i].cap < best) {
            best = g_v[i].cap;
            at = i;
        }
    if (best != SIZE_MAX) {
        p = g_v[at].p;
        g_bytes -= best;
        g_v[at] = g_v[--g_n];
    }
    pthread_mutex_unlock(&g_mu);
    if (p != NULL) {
        *cap_p = best;
        return p;
    }
    *cap_p = bytes;
    return malloc(bytes);
}

void kvb__bufpool_put(void *p, size_t cap)
{
    if (p == NULL)
        return;
    bool kept = false;
    pthread_mutex_lock(&g_mu);
    if (cap >= MIN_KEEP && g_n < KVB__BUFPOOL_SLOTS && cap <= KVB__BUFPOOL_MAX_BYTES - g_bytes) {
        g_v[g_n].p = p;
        g_v[g_n].cap = cap;
        g_n++;
        g_bytes += cap;
        kept = true;
    }
    pthread_mutex_unlock(&g_mu);
    if (!kept)
        free(p);
}

void kvb__bufpool_drain(void)
{
    pthread_mutex_lock(&g_mu);
    for (size_t i = 0; i < g_n; i++)
        free(g_v[i].p);
    g_n = g_bytes = 0;
    pthread_mutex_unlock(&g_mu);
}

size_t kvb__bufpool_kept(size_t *bytes_p)
{
    pthread_mutex_lock(&g_mu);
    size_t n = g_n;
    if (bytes_p != NULL)
        *bytes_p = g_bytes;
    pthread_mutex_unlock(&g_mu);
    return n;
}
