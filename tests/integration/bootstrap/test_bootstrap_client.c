/* The bootstrap client against raw-socket servers that misbehave: one that
 * accepts and never answers (time-outs, bounded), refused and reset
 * connections, bad statuses and bodies; and keep-alive reuse (ten health
 * checks, one TCP connection). */
#include <kvbridge/bootstrap.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "kvb_test.h"

enum mode { SILENT, CANNED, RESET };

struct raw_server {
    int lfd;
    uint16_t port;
    enum mode mode;
    const char *canned; /* answer to every request (CANNED) */
    size_t canned_len;
    int stop; /* atomic */
    int accepts;
    int held[64];
    int nheld;
    pthread_t thr;
};

/* Serve one connection in CANNED mode: answer each request (headers end at an
 * empty line) until the peer closes. */
static void serve_canned(struct raw_server *rs, int fd)
{
    char buf[8192];
    size_t have = 0;
    for (;;) {
        struct pollfd p = {fd, POLLIN, 0};
        if (__atomic_load_n(&rs->stop, __ATOMIC_ACQUIRE))
            return;
        if (poll(&p, 1, 50) <= 0)
            continue;
        ssize_t n = recv(fd, buf + have, sizeof(buf) - 1 - have, 0);
        if (n <= 0)
            return;
        have += (size_t)n;
        buf[have] = '\0';
        char *end;
        while ((end = strstr(buf, "\r\n\r\n")) != NULL) {
            size_t used = (size_t)(end + 4 - buf);
            size_t off = 0;
            while (off < rs->canned_len) {
                ssize_t w = send(fd, rs->canned + off, rs->canned_len - off, MSG_NOSIGNAL);
                if (w <= 0)
                    return;
                off += (size_t)w;
            }
            memmove(buf, buf + used, have - used);
            have -= used;
            buf[have] = '\0';
        }
    }
}

static void *raw_thread(void *arg)
{
    struct raw_server *rs = arg;
    while (!__atomic_load_n(&rs->stop, __ATOMIC_ACQUIRE)) {
        struct pollfd p = {rs->lfd, POLLIN, 0};
        if (poll(&p, 1, 50) <= 0)
            continue;
        int fd = accept(rs->lfd, NULL, NULL);
        if (fd < 0)
            continue;
        rs->accepts++;
        if (rs->mode == SILENT && rs->nheld < 64) {
            rs->held[rs->nheld++] = fd; /* accepted, never answered */
        } else if (rs->mode == RESET) {
            struct linger lg = {1, 0};
            setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
            close(fd);
        } else {
            serve_canned(rs, fd);
            close(fd);
        }
    }
    return NULL;
}

static void raw_start(struct raw_server *rs, enum mode mode, const char *canned)
{
    struct sockaddr_in a;
    socklen_t al = sizeof(a);
    int one = 1;
    memset(rs, 0, sizeof(*rs));
    rs->mode = mode;
    rs->canned = canned;
    rs->canned_len = canned != NULL ? strlen(canned) : 0;
    rs->lfd = socket(AF_INET, SOCK_STREAM, 0);
    CHECK(rs->lfd >= 0);
    setsockopt(rs->lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    memset(&a, 0, sizeof(a));
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    CHECK(bind(rs->lfd, (struct sockaddr *)&a, sizeof(a)) == 0);
    CHECK(listen(rs->lfd, 16) == 0);
    CHECK(getsockname(rs->lfd, (struct sockaddr *)&a, &al) == 0);
    rs->port = ntohs(a.sin_port);
    CHECK(pthread_create(&rs->thr, NULL, raw_thread, rs) == 0);
}

static void raw_stop(struct raw_server *rs)
{
    __atomic_store_n(&rs->stop, 1, __ATOMIC_RELEASE);
    pthread_join(rs->thr, NULL);
    for (int i = 0; i < rs->nheld; i++)
        close(rs->held[i]);
    close(rs->lfd);
}

static kvb_bootstrap_client_h client_for(uint16_t port, double timeout_s)
{
    char addr[64];
    kvb_bootstrap_client_h c = NULL;
    kvb_bootstrap_client_params_t p = {.field_mask = KVB_BOOTSTRAP_CLIENT_PARAM_TIMEOUT,
                                       .timeout_s = timeout_s};
    snprintf(addr, sizeof(addr), "127.0.0.1:%u", (unsigned)port);
    CHECK_EQ(kvb_bootstrap_client_create(addr, &p, &c), KVB_OK);
    return c;
}

static void test_timeouts(void)
{
    struct raw_server rs;
    kvb_bootstrap_client_h c;
    kvb_bootstrap_parallel_info_t info;
    kvb_bootstrap_rank_addr_t a;
    double t0, dt;

    raw_start(&rs, SILENT, NULL);
    c = client_for(rs.port, 0.4); /* the client's default bound */
    t0 = kvb_test_now_s();
    CHECK_EQ(kvb_bootstrap_client_health(c, 0), KVB_ERR_TIMEOUT);
    dt = kvb_test_now_s() - t0;
    fprintf(stderr, "health timed out after %.3f s (bound 0.4 s)\n", dt);
    CHECK(dt >= 0.35 && dt < 2.0);
    CHECK_STR_CONTAINS(kvb_bootstrap_client_last_error(c), "/health");
    CHECK_STR_CONTAINS(kvb_bootstrap_client_last_error(c), "no answer within");

    /* A per-call bound wins over the default. */
    t0 = kvb_test_now_s();
    CHECK_EQ(kvb_bootstrap_client_parallel_info(c, 0.2, &info), KVB_ERR_TIMEOUT);
    dt = kvb_test_now_s() - t0;
    CHECK(dt >= 0.15 && dt < 1.5);
    CHECK_STR_CONTAINS(kvb_bootstrap_client_last_error(c), "engine_rank=-1");
    t0 = kvb_test_now_s();
    CHECK_EQ(kvb_bootstrap_client_lookup(c, 0, 0, 0, 0.2, &a), KVB_ERR_TIMEOUT);
    CHECK(kvb_test_now_s() - t0 < 1.5);
    kvb_bootstrap_registration_t reg = {.attn_tp_size = 1,
                                        .attn_dp_size = 1,
                                        .pp_size = 1,
                                        .system_dp_size = 1,
                                        .rank_ip = "127.0.0.1",
                                        .rank_port = 1};
    t0 = kvb_test_now_s();
    CHECK_EQ(kvb_bootstrap_client_register(c, &reg, 0.2), KVB_ERR_TIMEOUT);
    CHECK(kvb_test_now_s() - t0 < 1.5);
    CHECK_STR_CONTAINS(kvb_bootstrap_client_last_error(c), "PUT http://127.0.0.1:");
    kvb_bootstrap_client_destroy(c);
    raw_stop(&rs);
    CHECK(rs.accepts >= 1);
    TEST_PASS("time-outs against a server that accepts and never answers");
}

static void test_refused_and_reset(void)
{
    struct raw_server rs;
    kvb_bootstrap_client_h c;
    uint16_t port;

    /* A port nobody listens on: take one, then close it. */
    raw_start(&rs, RESET, NULL);
    port = rs.port;
    c = client_for(port, 2.0);
    CHECK_EQ(kvb_bootstrap_client_health(c, 0), KVB_ERR_PEER);
    CHECK_STR_CONTAINS(kvb_bootstrap_client_last_error(c), "/health");
    kvb_bootstrap_client_destroy(c);
    raw_stop(&rs);
    c = client_for(port, 2.0);
    CHECK_EQ(kvb_bootstrap_client_health(c, 0), KVB_ERR_PEER);
    fprintf(stderr, "refused: %s\n", kvb_bootstrap_client_last_error(c));
    kvb_bootstrap_client_destroy(c);
    TEST_PASS("refused and reset connections are KVB_ERR_PEER");
}

static void expect_proto(const char *resp, int which, const char *msg_part)
{
    struct raw_server rs;
    kvb_bootstrap_client_h c;
    kvb_bootstrap_parallel_info_t info;
    kvb_bootstrap_rank_addr_t a;
    kvb_status_t st;
    raw_start(&rs, CANNED, resp);
    c = client_for(rs.port, 2.0);
    if (which == 0)
        st = kvb_bootstrap_client_parallel_info(c, 0, &info);
    else if (which == 1)
        st = kvb_bootstrap_client_lookup(c, 0, 0, 0, 0, &a);
    else
        st = kvb_bootstrap_client_health(c, 0);
    if (st != KVB_ERR_PROTO || strstr(kvb_bootstrap_client_last_error(c), msg_part) == NULL) {
        fprintf(stderr, "answer %.60s: got %s \"%s\", want PROTO naming \"%s\"\n", resp,
                kvb_status_string(st), kvb_bootstrap_client_last_error(c), msg_part);
        exit(1);
    }
    CHECK_STR_CONTAINS(kvb_bootstrap_client_last_error(c), "http://127.0.0.1:");
    kvb_bootstrap_client_destroy(c);
    raw_stop(&rs);
}

/* A full HTTP answer with a correct Content-Length; the caller frees it. */
static char *answer(const char *status, const char *body)
{
    char *s = NULL;
    CHECK(asprintf(&s, "HTTP/1.1 %s\r\nContent-Length: %zu\r\n\r\n%s", status, strlen(body), body) >
          0);
    return s;
}

static void expect_proto_free(char *resp, int which, const char *msg_part)
{
    expect_proto(resp, which, msg_part);
    free(resp);
}

static void test_bad_answers(void)
{
    expect_proto_free(answer("200 OK", "hello"), 0, "not valid JSON");
    expect_proto_free(answer("200 OK", "[]"), 0, "not a JSON object");
    expect_proto_free(answer("200 OK", "{\"prefill_attn_tp_size\": 2}"), 0, "prefill_dp_size");
    expect_proto_free(answer("200 OK", "{\"prefill_attn_tp_size\": 2, \"prefill_dp_size\": 1, "
                                       "\"prefill_pp_size\": 1, \"kv_item_lens\": [0]}"),
                      0, "kv_item_lens");
    expect_proto_free(answer("200 OK", "{\"prefill_attn_tp_size\": null, \"prefill_dp_size\": 1, "
                                       "\"prefill_pp_size\": 1}"),
                      0, "prefill_attn_tp_size");
    expect_proto_free(answer("200 OK", "{\"rank_ip\":\"1.2.3.4\",\"rank_port\":0}"), 1,
                      "rank_port");
    expect_proto_free(answer("200 OK", "{\"rank_ip\":\"1.2 3.4\",\"rank_port\":80}"), 1, "rank_ip");
    expect_proto_free(answer("500 Internal Server Error", "oops\n"), 1, "HTTP 500: oops");
    expect_proto_free(answer("503 Busy", ""), 2, "HTTP 503");
    expect_proto_free(answer("404 Not Found", ""), 2, "HTTP 404");
    expect_proto("this is not http\r\n\r\n", 2, "/health");
    /* An answer over the 1 MiB limit. */
    {
        size_t n = KVB_BOOTSTRAP_MAX_BODY + 1000;
        char *big = malloc(n + 128);
        int h = snprintf(big, 128, "HTTP/1.1 200 OK\r\nContent-Length: %zu\r\n\r\n", n);
        memset(big + h, 'x', n);
        big[h + n] = '\0';
        expect_proto(big, 0, "larger than 1048576");
        free(big);
    }
    TEST_PASS("bad statuses and bodies are KVB_ERR_PROTO naming the URL");
}

static void test_keepalive(void)
{
    struct raw_server rs;
    kvb_bootstrap_client_h c;
    raw_start(&rs, CANNED, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nOK");
    c = client_for(rs.port, 2.0);
    for (int i = 0; i < 10; i++)
        CHECK_EQ(kvb_bootstrap_client_health(c, 0), KVB_OK);
    kvb_bootstrap_client_destroy(c);
    raw_stop(&rs);
    CHECK_EQ(rs.accepts, 1);
    TEST_PASS("keep-alive: 10 health checks over one connection");
}

int main(void)
{
    unsetenv("KVBRIDGE_BOOTSTRAP_TOKEN");
    test_timeouts();
    test_refused_and_reset();
    test_bad_answers();
    test_keepalive();
    return 0;
}
