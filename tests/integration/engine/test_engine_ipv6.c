/* Engine over IPv6: session ids are "[addr]:port" and writes work on ::1.
 * Exits 77 (skipped) when ::1 cannot be bound here. */
#include "kvb_test.h"

#include <arpa/inet.h>
#include <kvbridge/engine.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

static int have_ipv6_loopback(void)
{
    struct sockaddr_in6 a = {.sin6_family = AF_INET6, .sin6_addr = IN6ADDR_LOOPBACK_INIT};
    int s = socket(AF_INET6, SOCK_STREAM, 0), ok;
    if (s < 0)
        return 0;
    ok = bind(s, (struct sockaddr *)&a, sizeof(a)) == 0;
    close(s);
    return ok;
}

int main(void)
{
    kvb_engine_params_t p = {.field_mask = KVB_ENGINE_PARAM_HOST, .host = "::1"};
    kvb_engine_h target, writer;
    enum { N = 1 << 20 };
    uint8_t *dst = calloc(1, N), *src = malloc(N);
    if (!have_ipv6_loopback()) {
        fprintf(stderr, "skip: ::1 cannot be bound on this machine\n");
        return 77;
    }
    for (int i = 0; i < N; i++)
        src[i] = (uint8_t)(i * 131 + 7);
    CHECK_EQ(kvb_engine_create(&p, &target), KVB_OK);
    CHECK_EQ(kvb_engine_create(&p, &writer), KVB_OK);
    const char *sid = kvb_engine_session_id(target);
    CHECK(strncmp(sid, "[::1]:", 6) == 0);
    CHECK_EQ(kvb_engine_register(target, dst, N, KVB_MEM_HOST), KVB_OK);
    CHECK_EQ(kvb_engine_register(writer, src, N, KVB_MEM_HOST), KVB_OK);
    kvb_block_t b[2] = {
        {(uint64_t)(uintptr_t)src, (uint64_t)(uintptr_t)(dst + 4096), 65536},
        {(uint64_t)(uintptr_t)(src + 65536), (uint64_t)(uintptr_t)dst + N / 2, N / 2}};
    CHECK_EQ(kvb_engine_write(writer, sid, b, 2, 10), KVB_OK);
    CHECK(memcmp(dst + 4096, src, 65536) == 0);
    CHECK(memcmp(dst + N / 2, src + 65536, N / 2) == 0);
    kvb_engine_destroy(writer);
    kvb_engine_destroy(target);
    free(src);
    free(dst);
    TEST_PASS("engine over IPv6 ([::1]:port session ids)");
    return 0;
}
