/* Writer grants (fence.c), engine level, on the direct lane (target memory
 * from kvb_mem_alloc) and the message lane (plain target memory): a write
 * lands only under a live grant of its tag; a revoked grant is refused for
 * good (KVB_ERR_FENCED, not one byte placed) while a new grant of the same
 * writer works; grants never granted are refused; revoked grants drain and
 * are dropped, so granting and revoking without end stays bounded (review
 * 1.12: fenced tags of dead writers accumulated and overflowed the page);
 * a revoke waits for a unit of a stopped writer process and says so
 * (KVB_ERR_INPROGRESS) until it resumes. Every wait is bounded. */
#include "kvb_test.h"
#include "kvb_test_engine.h"

#include <kvbridge/engine.h>

#include <signal.h>
#include <spawn.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MiB (1u << 20)
#define TGT (64u * MiB)
#define TAG 0x7a11c0deu

static uint8_t g_src[4 * MiB];
static const char *g_self;
extern char **environ;

static kvb_status_t write_epoch(kvb_engine_h w, const char *sid, uint8_t *dst, uint64_t epoch,
                                uint8_t fill)
{
    kvb_block_t b = {(uint64_t)(uintptr_t)g_src, (uint64_t)(uintptr_t)dst, sizeof(g_src)};
    kvb_write_params_t wp = {.field_mask = KVB_WRITE_PARAM_EPOCH, .epoch = epoch};
    kvb_xfer_h x;
    memset(g_src, fill, sizeof(g_src));
    kvb_status_t st = kvb_engine_write_async_ex(w, sid, &b, 1, &wp, &x);
    if (st != KVB_OK)
        return st;
    st = kvb_xfer_wait(x, 10);
    kvb_xfer_free(x);
    return st;
}

static void lane_case(bool direct)
{
    uint8_t *mem = NULL;
    kvb_engine_h t = kvb_test_engine(KVB_TRANSPORT_AUTO, 2),
                 w = kvb_test_engine(KVB_TRANSPORT_AUTO, direct ? 2 : 0);
    uint64_t e1, e2;
    if (direct)
        CHECK_EQ(kvb_mem_alloc(TGT, (void **)&mem), KVB_OK);
    else
        CHECK((mem = calloc(1, TGT)) != NULL);
    CHECK_EQ(kvb_engine_register(t, mem, TGT, KVB_MEM_HOST), KVB_OK);
    CHECK_EQ(kvb_engine_register(w, g_src, sizeof(g_src), KVB_MEM_HOST), KVB_OK);
    kvb_engine_set_writer_tag(w, TAG);
    const char *sid = kvb_engine_session_id(t);

    CHECK_EQ(kvb_engine_grant_writer(t, TAG, &e1), KVB_OK);
    CHECK_EQ(write_epoch(w, sid, mem, e1, 0x11), KVB_OK);
    CHECK(kvb_test_all(mem, sizeof(g_src), 0x11));
    CHECK_EQ(kvb_engine_session_direct(w, sid), direct ? 1 : 0);
    CHECK_EQ(kvb_engine_revoke_writer(t, TAG, e1, 1.0), KVB_OK);
    /* revoked: refused for good, nothing placed */
    CHECK_EQ(write_epoch(w, sid, mem, e1, 0x22), KVB_ERR_FENCED);
    CHECK(kvb_test_all(mem, sizeof(g_src), 0x11));
    /* a grant never made, and another tag's grant, are refused too */
    CHECK_EQ(write_epoch(w, sid, mem, e1 + 1000, 0x33), KVB_ERR_FENCED);
    CHECK_EQ(kvb_engine_grant_writer(t, TAG + 1, &e2), KVB_OK);
    CHECK_EQ(write_epoch(w, sid, mem, e2, 0x33), KVB_ERR_FENCED);
    CHECK(kvb_test_all(mem, sizeof(g_src), 0x11));
    CHECK_EQ(kvb_engine_revoke_writer(t, TAG + 1, e2, 0), KVB_OK);
    /* the same writer under a new grant: lands (on the same lane) */
    CHECK_EQ(kvb_engine_grant_writer(t, TAG, &e2), KVB_OK);
    CHECK(e2 > e1);
    CHECK_EQ(write_epoch(w, sid, mem, e2, 0x44), KVB_OK);
    CHECK(kvb_test_all(mem, sizeof(g_src), 0x44));
    CHECK_EQ(kvb_engine_session_direct(w, sid), direct ? 1 : 0);
    CHECK_EQ(write_epoch(w, sid, mem, e1, 0x55), KVB_ERR_FENCED); /* e1 stays refused */
    CHECK(kvb_test_all(mem, sizeof(g_src), 0x44));
    CHECK_EQ(kvb_engine_revoke_writer(t, TAG, e2, 1.0), KVB_OK);

    /* Bounded: 5000 grant/revoke rounds leave nothing behind (4096 live or
     * draining grants at most), and the fence page's slots are reused: the
     * direct lane still serves a new grant. */
    for (int i = 0; i < 5000; i++) {
        uint64_t e;
        CHECK_EQ(kvb_engine_grant_writer(t, TAG + 2 + (uint32_t)i, &e), KVB_OK);
        CHECK_EQ(kvb_engine_revoke_writer(t, TAG + 2 + (uint32_t)i, e, 0), KVB_OK);
    }
    uint64_t *live = calloc(4096, sizeof(*live));
    CHECK(live != NULL);
    for (int i = 0; i < 4096; i++)
        CHECK_EQ(kvb_engine_grant_writer(t, TAG, &live[i]), KVB_OK);
    uint64_t e3;
    CHECK_EQ(kvb_engine_grant_writer(t, TAG, &e3), KVB_ERR_NOMEM);
    for (int i = 0; i < 4096; i++)
        CHECK_EQ(kvb_engine_revoke_writer(t, TAG, live[i], 0), KVB_OK);
    free(live);
    CHECK_EQ(kvb_engine_grant_writer(t, TAG, &e3), KVB_OK);
    CHECK_EQ(write_epoch(w, sid, mem, e3, 0x66), KVB_OK);
    CHECK(kvb_test_all(mem, sizeof(g_src), 0x66));
    CHECK_EQ(kvb_engine_session_direct(w, sid), direct ? 1 : 0);

    kvb_engine_destroy(w);
    kvb_engine_destroy(t);
    if (direct)
        kvb_mem_free(mem);
    else
        free(mem);
    TEST_PASS(direct ? "direct lane: grants admit, revokes refuse for good, bounded"
                     : "message lane: grants admit, revokes refuse for good, bounded");
}

/* ---- a stopped writer process mid-unit: the revoke says so ---- */

/* Run as "--writer SID DST EPOCH" (exec'd, not forked: the parent has
 * threads). Writes 64 MiB to DST again and again; "r" on stdout once the
 * first write is under way. */
static int child_writer(const char *sid, uint64_t dst, uint64_t epoch, int ready_fd)
{
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    static uint8_t src[64 * MiB];
    kvb_engine_h w = kvb_test_engine(KVB_TRANSPORT_AUTO, 2);
    CHECK_EQ(kvb_engine_register(w, src, sizeof(src), KVB_MEM_HOST), KVB_OK);
    kvb_engine_set_writer_tag(w, TAG);
    memset(src, 0x77, sizeof(src));
    kvb_block_t b = {(uint64_t)(uintptr_t)src, dst, sizeof(src)};
    kvb_write_params_t wp = {.field_mask = KVB_WRITE_PARAM_EPOCH, .epoch = epoch};
    for (int round = 0; round < 1000; round++) {
        kvb_xfer_h x;
        if (kvb_engine_write_async_ex(w, sid, &b, 1, &wp, &x) != KVB_OK)
            break;
        if (round == 0 && write(ready_fd, "r", 1) != 1)
            break;
        kvb_status_t st = kvb_xfer_wait(x, 10);
        kvb_xfer_free(x);
        if (st != KVB_OK)
            break; /* fenced */
    }
    _exit(0);
}

static double now(void)
{
    return kvb_test_now_s();
}

static void stopped_writer(void)
{
    uint8_t *mem;
    kvb_engine_h t = kvb_test_engine(KVB_TRANSPORT_AUTO, 2);
    uint64_t e;
    int pfd[2];
    char c;
    CHECK_EQ(kvb_mem_alloc(TGT, (void **)&mem), KVB_OK);
    CHECK_EQ(kvb_engine_register(t, mem, TGT, KVB_MEM_HOST), KVB_OK);
    CHECK_EQ(kvb_engine_grant_writer(t, TAG, &e), KVB_OK);
    CHECK_EQ(pipe(pfd), 0);
    char dst[32], ep[32];
    snprintf(dst, sizeof(dst), "%llu", (unsigned long long)(uintptr_t)mem);
    snprintf(ep, sizeof(ep), "%llu", (unsigned long long)e);
    char *argv[] = {(char *)g_self, "--writer", (char *)kvb_engine_session_id(t), dst, ep, NULL};
    posix_spawn_file_actions_t fa;
    pid_t pid;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, pfd[1], 1);
    posix_spawn_file_actions_addclose(&fa, pfd[0]);
    CHECK_EQ(posix_spawn(&pid, g_self, &fa, NULL, argv, environ), 0);
    posix_spawn_file_actions_destroy(&fa);
    close(pfd[1]);
    CHECK_EQ(read(pfd[0], &c, 1), 1);
    /* Stop it while its two copy threads write 1 MiB units back to back
     * (almost always inside one); the revoke cannot finish then. */
    usleep(5000);
    CHECK_EQ(kill(pid, SIGSTOP), 0);
    usleep(20000); /* the stop has landed */
    int caught = kvb_engine_revoke_writer(t, TAG, e, 0) == KVB_ERR_INPROGRESS;
    fprintf(stderr, "stopped writer: revoke %s while it was stopped\n",
            caught ? "waited (a unit was in flight)" : "drained at once (between units)");
    if (caught) {
        double t0 = now();
        CHECK_EQ(kvb_engine_revoke_writer(t, TAG, e, 0.3), KVB_ERR_INPROGRESS);
        CHECK(now() - t0 >= 0.29 && now() - t0 < 2.0); /* the bound is honoured */
    }
    CHECK_EQ(kill(pid, SIGCONT), 0);
    double t1 = now();
    CHECK_EQ(kvb_engine_revoke_writer(t, TAG, e, 5.0), KVB_OK);
    fprintf(stderr, "stopped writer: quiescent %.3f s after SIGCONT\n", now() - t1);
    /* from then on not one byte may change */
    memset(mem, 0x00, 64 * MiB);
    int status;
    for (int i = 0; i < 100 && waitpid(pid, &status, WNOHANG) == 0; i++)
        usleep(20000);
    usleep(100000);
    CHECK(kvb_test_all(mem, 64 * MiB, 0x00));
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    kvb_engine_destroy(t);
    kvb_mem_free(mem);
    TEST_PASS("a stopped writer's unit in flight: revoke waits (bounded), then quiescent");
}

int main(int argc, char **argv)
{
    g_self = argv[0];
    if (argc == 5 && strcmp(argv[1], "--writer") == 0)
        return child_writer(argv[2], strtoull(argv[3], NULL, 10), strtoull(argv[4], NULL, 10), 1);
    signal(SIGPIPE, SIG_IGN);
    const char *which = argc >= 2 ? argv[1] : "all";
    if (!strcmp(which, "all") || !strcmp(which, "lanes")) {
        lane_case(true);
        lane_case(false);
    }
    if (!strcmp(which, "all") || !strcmp(which, "stopped"))
        stopped_writer();
    return 0;
}
