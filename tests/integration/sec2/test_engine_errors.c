/* Review finding 1.9: kvb_engine_last_error was one text per engine, so a
 * thread reading the reason of its failed call could get another thread's
 * (the connector's queue workers share one engine). Two threads fail
 * differently on one engine, many times; each must always read its own
 * reason. */
#include "kvb_test.h"

#include <kvbridge/engine.h>
#include <pthread.h>
#include <stdio.h>

#define ROUNDS 100000

static kvb_engine_h g_a;
static char g_sid[128];
static uint8_t g_dst[4096];
static pthread_barrier_t g_go;

static void *bad_source(void *arg)
{
    long *wrong = arg;
    static uint8_t unregistered[64];
    kvb_block_t b = {(uint64_t)(uintptr_t)unregistered, (uint64_t)(uintptr_t)g_dst, 64};
    pthread_barrier_wait(&g_go);
    for (int i = 0; i < ROUNDS; i++) {
        if (kvb_engine_write(g_a, g_sid, &b, 1, 5.0) != KVB_ERR_BOUNDS)
            (*wrong)++;
        else if (strstr(kvb_engine_last_error(g_a), "local source") == NULL)
            (*wrong)++;
    }
    return NULL;
}

static void *bad_session(void *arg)
{
    long *wrong = arg;
    kvb_block_t b = {0, 0, 0};
    pthread_barrier_wait(&g_go);
    for (int i = 0; i < ROUNDS; i++) {
        char sid[32];
        snprintf(sid, sizeof(sid), "no-port-%d", i % 8);
        if (kvb_engine_write(g_a, sid, &b, 1, 5.0) != KVB_ERR_INVALID)
            (*wrong)++;
        else if (strstr(kvb_engine_last_error(g_a), "is not host:port") == NULL)
            (*wrong)++;
    }
    return NULL;
}

int main(void)
{
    kvb_engine_params_t prm = {0};
    kvb_engine_h b = NULL;
    static uint8_t src[4096];
    CHECK_EQ(kvb_engine_create(&prm, &g_a), KVB_OK);
    CHECK_EQ(kvb_engine_create(&prm, &b), KVB_OK);
    CHECK_EQ(kvb_engine_register(g_a, src, sizeof(src), KVB_MEM_HOST), KVB_OK);
    CHECK_EQ(kvb_engine_register(b, g_dst, sizeof(g_dst), KVB_MEM_HOST), KVB_OK);
    snprintf(g_sid, sizeof(g_sid), "%s", kvb_engine_session_id(b));
    kvb_block_t ok = {(uint64_t)(uintptr_t)src, (uint64_t)(uintptr_t)g_dst, 64};
    CHECK_EQ(kvb_engine_write(g_a, g_sid, &ok, 1, 5.0), KVB_OK); /* connected */
    long wrong1 = 0, wrong2 = 0;
    pthread_t t1, t2;
    pthread_barrier_init(&g_go, NULL, 2);
    double t0 = kvb_test_now_s();
    pthread_create(&t1, NULL, bad_source, &wrong1);
    pthread_create(&t2, NULL, bad_session, &wrong2);
    pthread_join(t1, NULL);
    pthread_join(t2, NULL);
    fprintf(stderr, "%d failing calls per thread in %.2f s: %ld and %ld read another reason\n",
            ROUNDS, kvb_test_now_s() - t0, wrong1, wrong2);
    CHECK_EQ(wrong1, 0);
    CHECK_EQ(wrong2, 0);
    kvb_engine_destroy(g_a);
    kvb_engine_destroy(b);
    TEST_PASS("test_engine_errors");
    return 0;
}
