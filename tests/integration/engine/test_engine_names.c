/* Issue 33 (Mooncake's own transfer-engine tests on the drop-in):
 * - a listen host given as a name ("localhost") is resolved, the session id
 *   names the bound numeric address, and a writer reaches the engine by the
 *   name too; a name that does not resolve fails the creation;
 * - kvb_engine_peer_regions: a peer's table as its handshake says (sorted by
 *   address, cap, NULL arrays), a registration made since seen on the next
 *   call, the own session id answered from the local table (local-only
 *   regions left out), an unreachable peer failing within its bound. */
#include "kvb_test_engine.h"

#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define LEN 65536u

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static kvb_engine_h engine_on(const char *host, kvb_status_t *st_p)
{
    kvb_engine_params_t p = {.field_mask = KVB_ENGINE_PARAM_HOST, .host = host};
    kvb_engine_h e = NULL;
    *st_p = kvb_engine_create(&p, &e);
    return e;
}

static void host_names(void)
{
    kvb_status_t st;
    kvb_engine_h t = engine_on("localhost", &st);
    CHECK_EQ(st, KVB_OK);
    const char *sid = kvb_engine_session_id(t);
    CHECK(strncmp(sid, "127.0.0.1:", 10) == 0 || strncmp(sid, "[::1]:", 6) == 0);
    uint8_t *dst = calloc(1, LEN), *src = malloc(LEN);
    CHECK(dst != NULL && src != NULL);
    for (unsigned i = 0; i < LEN; i++)
        src[i] = (uint8_t)(i * 37 + 11);
    CHECK_EQ(kvb_engine_register(t, dst, LEN, KVB_MEM_HOST), KVB_OK);
    kvb_engine_h w = kvb_test_engine(KVB_TRANSPORT_TCP, 0);
    CHECK_EQ(kvb_engine_register(w, src, LEN, KVB_MEM_HOST), KVB_OK);
    char by_name[64];
    snprintf(by_name, sizeof(by_name), "localhost:%s", strrchr(sid, ':') + 1);
    kvb_block_t b = {(uint64_t)(uintptr_t)src, (uint64_t)(uintptr_t)dst, LEN};
    CHECK_EQ(kvb_engine_write(w, by_name, &b, 1, 10), KVB_OK);
    CHECK(memcmp(dst, src, LEN) == 0);
    kvb_engine_destroy(w);
    kvb_engine_destroy(t);
    free(src);
    free(dst);

    CHECK(engine_on("no-such-host.invalid", &st) == NULL);
    CHECK_EQ(st, KVB_ERR_INVALID);
    TEST_PASS("a listen host name resolves; one that does not fails KVB_ERR_INVALID");
}

/* Waits (bounded) until sid's table, as w sees it, has want entries. */
static size_t count_until(kvb_engine_h w, const char *sid, size_t want)
{
    size_t n = 0;
    for (int i = 0; i < 200; i++) {
        CHECK_EQ(kvb_engine_peer_regions(w, sid, 5, NULL, NULL, 0, &n), KVB_OK);
        if (n == want)
            break;
        usleep(10000);
    }
    return n;
}

static void peer_regions(void)
{
    kvb_engine_h t = kvb_test_engine(KVB_TRANSPORT_AUTO, 0);
    kvb_engine_h w = kvb_test_engine(KVB_TRANSPORT_AUTO, 0);
    const char *sid = kvb_engine_session_id(t);
    uint8_t *mem = malloc(8 * LEN);
    CHECK(mem != NULL);
    uint64_t base = (uint64_t)(uintptr_t)mem;
    /* Registered highest first: the answer is sorted by address anyway. */
    CHECK_EQ(kvb_engine_register(t, mem + 4 * LEN, 2 * LEN, KVB_MEM_HOST), KVB_OK);
    CHECK_EQ(kvb_engine_register(t, mem + LEN, LEN, KVB_MEM_HOST), KVB_OK);
    kvb_mem_region_ex_t lo = {.field_mask = KVB_MEM_REGION_FIELD_LOCAL_ONLY,
                              .addr = mem + 7 * LEN,
                              .length = LEN,
                              .mem_type = KVB_MEM_HOST,
                              .local_only = 1};
    CHECK_EQ(kvb_engine_register_ex(t, &lo, 1, sizeof(lo)), KVB_OK);

    uint64_t addrs[4] = {0}, lens[4] = {0};
    size_t n = 99;
    CHECK_EQ(kvb_engine_peer_regions(w, sid, 5, addrs, lens, 4, &n), KVB_OK);
    CHECK_EQ(n, 2);
    CHECK_EQ(addrs[0], base + LEN);
    CHECK_EQ(lens[0], LEN);
    CHECK_EQ(addrs[1], base + 4 * LEN);
    CHECK_EQ(lens[1], 2 * LEN);
    CHECK_EQ(addrs[2], 0); /* past the count: untouched */

    /* cap 1: the first only, the count still says 2. */
    memset(addrs, 0, sizeof(addrs));
    CHECK_EQ(kvb_engine_peer_regions(w, sid, 5, addrs, NULL, 1, &n), KVB_OK);
    CHECK_EQ(n, 2);
    CHECK_EQ(addrs[0], base + LEN);
    CHECK_EQ(addrs[1], 0);

    /* A registration made since the handshake: seen once its notice came. */
    CHECK_EQ(kvb_engine_register(t, mem, LEN / 2, KVB_MEM_HOST), KVB_OK);
    CHECK_EQ(count_until(w, sid, 3), 3);
    CHECK_EQ(kvb_engine_peer_regions(w, sid, 5, addrs, lens, 4, &n), KVB_OK);
    CHECK_EQ(addrs[0], base);
    CHECK_EQ(lens[0], LEN / 2);
    CHECK_EQ(kvb_engine_unregister(t, mem), KVB_OK);
    CHECK_EQ(count_until(w, sid, 2), 2);

    /* The own session id: the local table, without connecting. */
    CHECK_EQ(kvb_engine_peer_regions(t, sid, 5, addrs, lens, 4, &n), KVB_OK);
    CHECK_EQ(n, 2);
    CHECK_EQ(addrs[0], base + LEN);
    CHECK_EQ(addrs[1], base + 4 * LEN);
    CHECK_EQ(kvb_engine_peer_regions(w, kvb_engine_session_id(w), 5, addrs, lens, 4, &n), KVB_OK);
    CHECK_EQ(n, 0);

    /* Nobody listening, a name that does not resolve: KVB_ERR_PEER, fast. */
    double t0 = now_s();
    CHECK_EQ(kvb_engine_peer_regions(w, "127.0.0.1:1", 5, addrs, lens, 4, &n), KVB_ERR_PEER);
    CHECK_EQ(n, 0);
    CHECK_EQ(kvb_engine_peer_regions(w, "no-such-host.invalid:9", 5, addrs, lens, 4, &n),
             KVB_ERR_PEER);
    CHECK_STR_CONTAINS(kvb_engine_last_error(w), "no-such-host.invalid");
    CHECK(now_s() - t0 < 5.0);
    CHECK_EQ(kvb_engine_peer_regions(NULL, sid, 5, addrs, lens, 4, &n), KVB_ERR_INVALID);
    CHECK_EQ(kvb_engine_peer_regions(w, NULL, 5, addrs, lens, 4, &n), KVB_ERR_INVALID);
    CHECK_EQ(kvb_engine_peer_regions(w, sid, 5, addrs, lens, 4, NULL), KVB_ERR_INVALID);

    kvb_engine_destroy(w);
    kvb_engine_destroy(t);
    free(mem);
    TEST_PASS("kvb_engine_peer_regions: sorted, capped, refreshed, own table, errors");
}

int main(void)
{
    host_names();
    peer_regions();
    return 0;
}
