/* Concurrency: 32 clients x 200 requests (registrations, rank lookups,
 * parallel info) against one server, then the table must hold exactly each
 * client's last registration and the counters must add up. Then: stopping a
 * server while clients are connected (busy keep-alive clients, idle sockets, a
 * half-sent request) is prompt and clean. */
#include <kvbridge/bootstrap.h>

#include <arpa/inet.h>
#include <errno.h>
#include <stdint.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "boot_test_util.h"

#define NCLIENTS 32
#define NREQ 200
#define TP 8
#define DP 4

static const char *g_addr;
static atomic_int g_failures;
static atomic_int g_stop;

static int port_of(int t, int k)
{
    return 10000 + t * 300 + k;
}

static void *client_thread(void *arg)
{
    int t = (int)(intptr_t)arg;
    kvb_bootstrap_client_h c;
    kvb_bootstrap_registration_t reg = {.attn_tp_size = TP,
                                        .attn_tp_rank = t % TP,
                                        .attn_dp_size = 1,
                                        .attn_dp_rank = 0,
                                        .pp_size = 1,
                                        .pp_rank = 0,
                                        .system_dp_size = DP,
                                        .system_dp_rank = t / TP,
                                        .rank_ip = "127.0.0.1"};
    int last = -1;
    if (kvb_bootstrap_client_create(g_addr, NULL, &c) != KVB_OK) {
        atomic_fetch_add(&g_failures, 1);
        return NULL;
    }
    for (int i = 0; i < NREQ; i++) {
        kvb_status_t st;
        if (i % 2 == 0) {
            reg.rank_port = (uint16_t)port_of(t, i / 2);
            st = kvb_bootstrap_client_register(c, &reg, 0);
            if (st == KVB_OK)
                last = reg.rank_port;
        } else if (i % 4 == 1) {
            kvb_bootstrap_rank_addr_t a;
            st = kvb_bootstrap_client_lookup(c, t / TP, t % TP, 0, 0, &a);
            /* Only this thread writes this rank: it reads its own last write. */
            if (st == KVB_OK && (a.rank_port != last || strcmp(a.rank_ip, "127.0.0.1") != 0)) {
                fprintf(stderr, "client %d: lookup gave port %u, last registered %d\n", t,
                        (unsigned)a.rank_port, last);
                atomic_fetch_add(&g_failures, 1);
            }
        } else {
            kvb_bootstrap_parallel_info_t info;
            st = kvb_bootstrap_client_parallel_info(c, 0, &info);
            if (st == KVB_OK) {
                if (info.attn_tp_size != TP || info.dp_size != DP || info.pp_size != 1) {
                    fprintf(stderr, "client %d: parallel info %d/%d/%d\n", t, info.attn_tp_size,
                            info.dp_size, info.pp_size);
                    atomic_fetch_add(&g_failures, 1);
                }
                kvb_bootstrap_parallel_info_free(&info);
            }
        }
        if (st != KVB_OK) {
            fprintf(stderr, "client %d request %d: %s: %s\n", t, i, kvb_status_string(st),
                    kvb_bootstrap_client_last_error(c));
            atomic_fetch_add(&g_failures, 1);
        }
    }
    kvb_bootstrap_client_destroy(c);
    return NULL;
}

static double metric(const char *text, const char *name)
{
    const char *p = strstr(text, name);
    size_t n = strlen(name);
    while (p != NULL && (p[n] != ' ' || (p != text && p[-1] != '\n')))
        p = strstr(p + n, name);
    return p != NULL ? atof(p + n + 1) : -1;
}

static void test_concurrent(void)
{
    kvb_bootstrap_server_h s = start_server("127.0.0.1", NULL, 0);
    pthread_t thr[NCLIENTS];
    kvb_bootstrap_client_h c;
    char url[256];
    http_resp_t r;
    double t0 = kvb_test_now_s();

    g_addr = kvb_bootstrap_server_address(s);
    for (int t = 0; t < NCLIENTS; t++)
        CHECK(pthread_create(&thr[t], NULL, client_thread, (void *)(intptr_t)t) == 0);
    for (int t = 0; t < NCLIENTS; t++)
        pthread_join(thr[t], NULL);
    fprintf(stderr, "%d clients x %d requests in %.2f s\n", NCLIENTS, NREQ, kvb_test_now_s() - t0);
    CHECK_EQ(atomic_load(&g_failures), 0);

    /* The table: every rank once, holding its client's last registration. */
    CHECK_EQ(kvb_bootstrap_server_num_ranks(s), NCLIENTS);
    CHECK_EQ(kvb_bootstrap_client_create(g_addr, NULL, &c), KVB_OK);
    for (int t = 0; t < NCLIENTS; t++) {
        kvb_bootstrap_rank_addr_t a;
        CHECK_EQ(kvb_bootstrap_client_lookup(c, t / TP, t % TP, 0, 0, &a), KVB_OK);
        CHECK_EQ(a.rank_port, port_of(t, NREQ / 2 - 1));
    }
    kvb_bootstrap_client_destroy(c);
    snprintf(url, sizeof(url), "http://%s/metrics", g_addr);
    http_req("GET", url, NULL, 0, NULL, &r);
    CHECK_EQ(r.code, 200);
    CHECK(metric(r.body, "kvbridge_bootstrap_registrations_total") == NCLIENTS * NREQ / 2);
    CHECK(metric(r.body, "kvbridge_bootstrap_lookups_total{kind=\"rank\"}") ==
          NCLIENTS * NREQ / 4 + NCLIENTS);
    CHECK(metric(r.body, "kvbridge_bootstrap_lookups_total{kind=\"parallel_info\"}") ==
          NCLIENTS * NREQ / 4);
    CHECK(metric(r.body, "kvbridge_bootstrap_registered_ranks") == NCLIENTS);
    CHECK(metric(r.body, "kvbridge_bootstrap_errors_total{code=\"400\"}") == 0);
    http_resp_free(&r);
    kvb_bootstrap_server_stop(s);
    TEST_PASS("32 concurrent clients x 200 requests, consistent table");
}

static atomic_int g_ok, g_peer, g_other;

static void *busy_thread(void *arg)
{
    kvb_bootstrap_client_h c;
    int after_stop = 0;
    (void)arg;
    CHECK_EQ(kvb_bootstrap_client_create(g_addr, NULL, &c), KVB_OK);
    /* Keep requesting until the server is gone, then a few more. */
    while (after_stop < 5) {
        kvb_bootstrap_rank_addr_t a;
        /* Read before the request: one that began before the stop may still
         * succeed, and must not count as one made after it. */
        bool stopped = atomic_load(&g_stop);
        kvb_status_t st = kvb_bootstrap_client_lookup(c, 0, 0, 0, 2.0, &a);
        if (st == KVB_OK || st == KVB_ERR_NOT_FOUND)
            atomic_fetch_add(&g_ok, 1);
        else if (st == KVB_ERR_PEER)
            atomic_fetch_add(&g_peer, 1);
        else {
            fprintf(stderr, "during stop: %s: %s\n", kvb_status_string(st),
                    kvb_bootstrap_client_last_error(c));
            atomic_fetch_add(&g_other, 1);
        }
        if (stopped)
            after_stop++;
    }
    kvb_bootstrap_client_destroy(c);
    return NULL;
}

static int raw_connect(uint16_t port)
{
    struct sockaddr_in a;
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    CHECK(fd >= 0);
    memset(&a, 0, sizeof(a));
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    CHECK(connect(fd, (struct sockaddr *)&a, sizeof(a)) == 0);
    return fd;
}

static void test_stop_with_clients(void)
{
    kvb_bootstrap_server_h s = start_server("127.0.0.1", NULL, 0);
    pthread_t thr[8];
    int idle[4];
    uint16_t port = kvb_bootstrap_server_port(s);
    char addr[64];
    double t0;

    snprintf(addr, sizeof(addr), "%s", kvb_bootstrap_server_address(s));
    g_addr = addr;
    char *p = seed_payload(1, 0, 1, 0, 1, 0, 1, 0, "127.0.0.1", 5555);
    char url[128];
    snprintf(url, sizeof(url), "http://%s/route", addr);
    expect_http("PUT", url, p, NULL, 200, "OK");
    free(p);
    for (int i = 0; i < 4; i++)
        idle[i] = raw_connect(port);
    /* One request that never finishes its headers, one body that never ends. */
    const char *half = "GET /health HTTP/1.1\r\nHost: x\r\n";
    CHECK(send(idle[0], half, strlen(half), MSG_NOSIGNAL) > 0);
    const char *put = "PUT /route HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"ro";
    CHECK(send(idle[1], put, strlen(put), MSG_NOSIGNAL) > 0);
    for (int i = 0; i < 8; i++)
        CHECK(pthread_create(&thr[i], NULL, busy_thread, NULL) == 0);
    usleep(300 * 1000);
    t0 = kvb_test_now_s();
    kvb_bootstrap_server_stop(s);
    double dt = kvb_test_now_s() - t0;
    atomic_store(&g_stop, 1);
    fprintf(stderr, "stop with clients connected took %.3f s\n", dt);
    CHECK(dt < 3.0);
    for (int i = 0; i < 8; i++)
        pthread_join(thr[i], NULL);
    fprintf(stderr, "requests ok %d, peer errors %d, other %d\n", atomic_load(&g_ok),
            atomic_load(&g_peer), atomic_load(&g_other));
    CHECK(atomic_load(&g_ok) > 0);
    CHECK(atomic_load(&g_peer) >= 8 * 5);
    CHECK_EQ(atomic_load(&g_other), 0);
    /* The idle sockets were closed by the server: reads see EOF or reset. */
    for (int i = 0; i < 4; i++) {
        char b[256];
        ssize_t n;
        struct timeval tv = {2, 0};
        setsockopt(idle[i], SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
        do
            n = recv(idle[i], b, sizeof(b), 0);
        while (n > 0);
        CHECK(n == 0 || errno == ECONNRESET);
        close(idle[i]);
    }
    TEST_PASS("stop while clients are connected");
}

int main(void)
{
    curl_global_init(CURL_GLOBAL_DEFAULT);
    unsetenv("KVBRIDGE_BOOTSTRAP_TOKEN");
    test_concurrent();
    test_stop_with_clients();
    curl_global_cleanup();
    return 0;
}
