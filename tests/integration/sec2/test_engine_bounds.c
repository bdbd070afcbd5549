/* Review finding 1.10: waits that ignored the caller's time-out.
 *  - kvb_engine_write(timeout_s) did not bound the handshake: only the
 *    connect time-out did;
 *  - a writer finding another thread's handshake with the same session in
 *    progress waited for it without bound (and then ran its own).
 * The peer is a listener that accepts TCP (kernel backlog) and never
 * answers, so every handshake with it lasts the whole connect time-out. */
#include "kvb_test.h"
#include "kvb_test_engine.h"

#include <arpa/inet.h>
#include <kvbridge/engine.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sys/socket.h>
#include <unistd.h>

#define CONNECT_S 3.0

static kvb_engine_h g_a;
static char g_sid[64];
static kvb_block_t g_blk;

static int silent_listener(char *sid, size_t len)
{
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t sl = sizeof(sa);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    CHECK(fd >= 0);
    CHECK_EQ(bind(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    CHECK_EQ(listen(fd, 16), 0);
    CHECK_EQ(getsockname(fd, (struct sockaddr *)&sa, &sl), 0);
    snprintf(sid, len, "127.0.0.1:%u", ntohs(sa.sin_port));
    return fd;
}

static void *slow_writer(void *arg)
{
    kvb_status_t *st = arg;
    *st = kvb_engine_write(g_a, g_sid, &g_blk, 1, 30.0); /* handshake: CONNECT_S */
    return NULL;
}

int main(void)
{
    kvb_engine_params_t prm = {0};
    static uint8_t src[4096];
    prm.field_mask = KVB_ENGINE_PARAM_CONNECT_TIMEOUT;
    prm.connect_timeout_s = CONNECT_S;
    CHECK_EQ(kvb_engine_create(&prm, &g_a), KVB_OK);
    CHECK_EQ(kvb_engine_register(g_a, src, sizeof(src), KVB_MEM_HOST), KVB_OK);
    g_blk = (kvb_block_t){(uint64_t)(uintptr_t)src, 4096, 64};
    int lfd = silent_listener(g_sid, sizeof(g_sid));

    /* 1: our own handshake, bounded by timeout_s */
    double took, t0;
    kvb_status_t st =
        kvb_test_write_timed(g_a, g_sid, &g_blk, 1, 0.3, "write(0.3 s) to a silent peer", &took);
    CHECK_EQ(st, KVB_ERR_TIMEOUT);
    CHECK(took >= 0.25 && took < 1.0);

    /* 2: another thread's handshake in progress: bounded by our timeout_s */
    kvb_status_t slow_st = KVB_OK;
    pthread_t t;
    t0 = kvb_test_now_s();
    pthread_create(&t, NULL, slow_writer, &slow_st);
    usleep(200 * 1000);
    st = kvb_test_write_timed(g_a, g_sid, &g_blk, 1, 0.3,
                              "write(0.3 s) behind another thread's handshake", &took);
    CHECK_EQ(st, KVB_ERR_TIMEOUT);
    CHECK(took >= 0.25 && took < 1.0);
    CHECK_STR_CONTAINS(kvb_engine_last_error(g_a), "another thread's handshake");
    pthread_join(t, NULL);
    double slow = kvb_test_now_s() - t0;
    fprintf(stderr, "the other thread: %s after %.3f s\n", kvb_status_string(slow_st), slow);
    CHECK_EQ(slow_st, KVB_ERR_TIMEOUT);
    CHECK(slow >= CONNECT_S - 0.1 && slow < CONNECT_S + 1.5); /* the connect time-out */
    close(lfd);
    kvb_engine_destroy(g_a);
    TEST_PASS("test_engine_bounds");
    return 0;
}
