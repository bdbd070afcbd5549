/* A writer process that exits right after its call returned must not take
 * the target down (issue 33: Mooncake's initiator test, send_probe from a
 * fresh process). UCX 1.13.1 aborts a process whose reply to a wire-up
 * request cannot be sent because the asking process is gone ("got REP
 * message" assertion); before the engine waited for the wire-up inside the
 * handshake, a zero-length write, a write refused for its bounds or a
 * kvb_engine_peer_regions look-up returned with that reply pending, and the
 * writer's exit killed the target here. Each child below is a fresh process
 * (this program re-executed) that does one such call against this
 * process's TCP engine and _exits at once, without destroying its engine;
 * this process must survive every one and still take a write.
 * Then the wait's bound: a listener whose UCX worker never answers the
 * wire-up (created, never progressed) fails the writer's call within the
 * handshake's time, naming the wire-up, and the writer engine still works. */
#include "kvb_test_engine.h"

#include "core/core.h"
#include "engine/handshake.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <spawn.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

extern char **environ;

#define LEN 4096u

/* Child: one call of kind against sid, then _exit (status: 0 when the call
 * answered as expected). */
static int child(const char *kind, const char *sid, const char *addr_s)
{
    kvb_engine_h w = kvb_test_engine(KVB_TRANSPORT_TCP, 0);
    uint64_t dst = strtoull(addr_s, NULL, 0);
    static uint8_t src[LEN];
    CHECK_EQ(kvb_engine_register(w, src, LEN, KVB_MEM_HOST), KVB_OK);
    kvb_block_t b = {(uint64_t)(uintptr_t)src, dst, 0};
    kvb_status_t st, want = KVB_OK;
    if (strcmp(kind, "probe") == 0) {
        st = kvb_engine_write(w, sid, &b, 1, 5);
    } else if (strcmp(kind, "bounds") == 0) {
        b.dst = dst + LEN; /* past the target's region */
        b.len = 16;
        st = kvb_engine_write(w, sid, &b, 1, 5);
        want = KVB_ERR_BOUNDS;
    } else if (strcmp(kind, "regions") == 0) {
        size_t n = 0;
        st = kvb_engine_peer_regions(w, sid, 5, NULL, NULL, 0, &n);
        if (st == KVB_OK && n != 1)
            st = KVB_ERR_INVALID;
    } else {
        memset(src, 0x5a, LEN);
        b.len = LEN;
        st = kvb_engine_write(w, sid, &b, 1, 5);
    }
    _exit(st == want ? 0 : 1);
}

static void run_child(const char *self, const char *kind, const char *sid, const char *addr)
{
    char *argv[] = {(char *)self, (char *)kind, (char *)sid, (char *)addr, NULL};
    pid_t pid;
    int status = 0;
    CHECK_EQ(posix_spawn(&pid, self, NULL, NULL, argv, environ), 0);
    CHECK_EQ(waitpid(pid, &status, 0), pid);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

/* A handshake listener whose reply names a UCX worker nobody progresses. */
typedef struct mute {
    ucp_context_h ctx;
    ucp_worker_h w;
    ucp_address_t *addr;
    size_t alen;
    int lfd, fd;
    uint16_t port;
} mute_t;

static void *mute_serve(void *arg)
{
    mute_t *m = arg;
    uint8_t *req = NULL, *rep = NULL;
    size_t req_len, rep_len;
    char why[256];
    uint64_t dl = kvb__now_ns() + 5000000000ull;
    kvb__hs_reply_t r = {.epoch = 1,
                         .generation = 1,
                         .host = (const uint8_t *)"mute-host",
                         .host_len = 9,
                         .waddr = (const uint8_t *)m->addr,
                         .waddr_len = (uint32_t)m->alen};
    m->fd = accept(m->lfd, NULL, NULL);
    CHECK(m->fd >= 0);
    CHECK_EQ(kvb__sock_read_msg(m->fd, NULL, 4096, dl, &req, &req_len, why, sizeof(why)), KVB_OK);
    CHECK_EQ(kvb__hs_reply_encode(&r, &rep, &rep_len), KVB_OK);
    CHECK_EQ(kvb__sock_write_all(m->fd, rep, rep_len, dl), KVB_OK);
    free(req);
    free(rep);
    return NULL;
}

static void mute_start(mute_t *m)
{
    ucp_config_t *cfg;
    ucp_params_t p = {.field_mask = UCP_PARAM_FIELD_FEATURES, .features = UCP_FEATURE_AM};
    ucp_worker_params_t wp = {0};
    struct sockaddr_in a = {.sin_family = AF_INET};
    socklen_t al = sizeof(a);
    CHECK(ucp_config_read(NULL, NULL, &cfg) == UCS_OK);
    ucp_config_modify(cfg, "TLS", "tcp");
    CHECK(ucp_init(&p, cfg, &m->ctx) == UCS_OK);
    ucp_config_release(cfg);
    CHECK(ucp_worker_create(m->ctx, &wp, &m->w) == UCS_OK);
    CHECK(ucp_worker_get_address(m->w, &m->addr, &m->alen) == UCS_OK);
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    m->lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    CHECK_EQ(bind(m->lfd, (struct sockaddr *)&a, sizeof(a)), 0);
    CHECK_EQ(listen(m->lfd, 4), 0);
    CHECK_EQ(getsockname(m->lfd, (struct sockaddr *)&a, &al), 0);
    m->port = ntohs(a.sin_port);
}

static double mono_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static void wire_up_bounded(void)
{
    mute_t m = {0};
    pthread_t th;
    mute_start(&m);
    CHECK_EQ(pthread_create(&th, NULL, mute_serve, &m), 0);
    kvb_engine_params_t p = {.field_mask =
                                 KVB_ENGINE_PARAM_TRANSPORT | KVB_ENGINE_PARAM_CONNECT_TIMEOUT,
                             .transport = KVB_TRANSPORT_TCP,
                             .connect_timeout_s = 1.0};
    kvb_engine_h w;
    CHECK_EQ(kvb_engine_create(&p, &w), KVB_OK);
    char sid[32];
    snprintf(sid, sizeof(sid), "127.0.0.1:%u", m.port);
    kvb_block_t b = {0, 0, 0};
    double t0 = mono_s();
    kvb_status_t st = kvb_engine_write(w, sid, &b, 1, 10);
    double took = mono_s() - t0;
    fprintf(stderr, "write to a listener whose worker never answers: %s after %.3f s (%s)\n",
            kvb_status_string(st), took, kvb_engine_last_error(w));
    CHECK(st == KVB_ERR_TIMEOUT || st == KVB_ERR_PEER);
    CHECK_STR_CONTAINS(kvb_engine_last_error(w), "wire-up");
    CHECK(took >= 0.5 && took < 3.0); /* the handshake's time (1 s), not the write's (10 s) */
    CHECK_EQ(pthread_join(th, NULL), 0);

    /* The writer engine is fine: a real target takes a write. */
    kvb_engine_h t = kvb_test_engine(KVB_TRANSPORT_TCP, 0);
    static uint8_t src[LEN], dst[LEN];
    memset(src, 0x77, LEN);
    CHECK_EQ(kvb_engine_register(t, dst, LEN, KVB_MEM_HOST), KVB_OK);
    CHECK_EQ(kvb_engine_register(w, src, LEN, KVB_MEM_HOST), KVB_OK);
    kvb_block_t g = {(uint64_t)(uintptr_t)src, (uint64_t)(uintptr_t)dst, LEN};
    CHECK_EQ(kvb_engine_write(w, kvb_engine_session_id(t), &g, 1, 10), KVB_OK);
    CHECK(kvb_test_all(dst, LEN, 0x77));
    kvb_engine_destroy(w);
    kvb_engine_destroy(t);
    close(m.fd);
    close(m.lfd);
    ucp_worker_release_address(m.w, m.addr);
    ucp_worker_destroy(m.w);
    ucp_cleanup(m.ctx);
    TEST_PASS("a wire-up that never completes fails the call within the handshake's time");
}

int main(int argc, char **argv)
{
    if (argc == 4)
        return child(argv[1], argv[2], argv[3]);
    kvb_engine_h t = kvb_test_engine(KVB_TRANSPORT_TCP, 0);
    static uint8_t dst[LEN];
    CHECK_EQ(kvb_engine_register(t, dst, LEN, KVB_MEM_HOST), KVB_OK);
    char addr[32];
    snprintf(addr, sizeof(addr), "%#llx", (unsigned long long)(uintptr_t)dst);
    const char *sid = kvb_engine_session_id(t);
    const char *kinds[] = {"probe", "bounds", "regions"};
    for (int round = 0; round < 3; round++)
        for (int k = 0; k < 3; k++) {
            run_child(argv[0], kinds[k], sid, addr);
            usleep(100000); /* the target's reply to a gone writer fails meanwhile */
        }
    CHECK(kvb_test_all(dst, LEN, 0));
    run_child(argv[0], "write", sid, addr);
    CHECK(kvb_test_all(dst, LEN, 0x5a));
    kvb_engine_destroy(t);
    wire_up_bounded();
    TEST_PASS("writers exiting right after a probe, a refused write or a table look-up: "
              "the target lives and takes the next write");
    return 0;
}
