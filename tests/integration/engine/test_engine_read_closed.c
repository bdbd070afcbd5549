/* A tcp target closes a stuck reader's reply endpoint (the read caps'
 * tick, docs/engine.md "Read caps") and the reader resumes afterwards
 * (docs/testing.md "Known issues"). Each round runs the target in a child
 * process (argv "--round"), so a crash of the target is counted, not
 * fatal to the count: the target answers a reader process (argv
 * "--reader") 256 reads of 8 MiB straight out of its memory (or from
 * copies: KVBRIDGE_READ_ANSWER_DIRECT=0), the reader is SIGSTOPped once
 * answers are in flight, kept stopped past the target's peer time-out
 * (1 s) until the tick closed its endpoint, then SIGCONTed. The target
 * must live on: the resumed reader's read fails (it must not succeed:
 * its answers were cut), a new reader reads exact bytes, the target's
 * memory unregisters, and the engine is destroyed; each round logs the
 * timings that prove the window (answers in flight, stopped at, closed
 * at, resumed at). With UCX 1.13's zero-copy sends (KVBRIDGE_TCP_ZCOPY=1,
 * the code before engine.c's tcp_no_zcopy) the target died in 6 and 8 of
 * 12 rounds (straight, copies): UCX's TCP progress used the endpoint it
 * had just freed on the resumed reader's close (docs/testing.md). */
#include "kvb_test.h"
#include "kvb_test_engine.h"

#include <kvbridge/engine.h>

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#define MiB (1u << 20)
#define TGT (8u * MiB)
#define TAG 0x5eadu
#define PEER_TIMEOUT_S 1.0
#define ROUND_BOUND_S 60.0

static uint8_t pattern(size_t i)
{
    return (uint8_t)(i * 2654435761u >> 13);
}

/* "--reader SID ADDR LEN EPOCH": one read of 256 times [ADDR, +LEN) into
 * one buffer; "r" on stdout once under way, then "<status> <clean>" when
 * it ended (clean: the buffer holds the target's pattern). */
static int child_reader(char **argv)
{
    enum { N = 256 };
    size_t len = strtoull(argv[4], NULL, 10);
    uint8_t *loc = malloc(len);
    kvb_block_t b[N];
    CHECK(loc != NULL);
    memset(loc, 0xEE, len);
    kvb_engine_params_t p = {.field_mask =
                                 KVB_ENGINE_PARAM_TRANSPORT | KVB_ENGINE_PARAM_PEER_TIMEOUT,
                             .transport = KVB_TRANSPORT_TCP,
                             .peer_timeout_s = 2.0};
    kvb_engine_h e;
    CHECK_EQ(kvb_engine_create(&p, &e), KVB_OK);
    CHECK_EQ(kvb_engine_register(e, loc, len, KVB_MEM_HOST), KVB_OK);
    kvb_engine_set_writer_tag(e, TAG);
    kvb_write_params_t wp = {.field_mask = KVB_WRITE_PARAM_EPOCH,
                             .epoch = strtoull(argv[5], NULL, 10)};
    for (size_t i = 0; i < N; i++)
        b[i] = (kvb_block_t){strtoull(argv[3], NULL, 10), (uint64_t)(uintptr_t)loc, len};
    kvb_xfer_h x;
    CHECK_EQ(kvb_engine_read_async_ex(e, argv[2], b, N, &wp, &x), KVB_OK);
    CHECK_EQ(write(1, "r", 1), 1);
    kvb_status_t st = kvb_xfer_wait(x, 20);
    bool clean = true;
    for (size_t i = 0; i < len && clean; i++)
        clean = loc[i] == pattern(i);
    printf("%d %d\n", (int)st, clean ? 1 : 0);
    fflush(stdout);
    kvb_xfer_free(x);
    kvb_engine_destroy(e);
    _exit(0);
}

/* Up to len-1 bytes from fd into buf within bound_s; the count (0: none). */
static ssize_t read_bounded(int fd, char *buf, size_t len, double bound_s)
{
    size_t n = 0;
    double end = kvb_test_now_s() + bound_s;
    while (n + 1 < len && kvb_test_now_s() < end) {
        struct pollfd pf = {.fd = fd, .events = POLLIN};
        if (poll(&pf, 1, 100) <= 0)
            continue;
        ssize_t r = read(fd, buf + n, len - 1 - n);
        if (r <= 0)
            break;
        n += (size_t)r;
        if (memchr(buf, '\n', n) != NULL || (n == 1 && buf[0] == 'r'))
            break;
    }
    buf[n] = '\0';
    return (ssize_t)n;
}

static uint64_t conns_closed(kvb_engine_h e, uint64_t *answers)
{
    kvb_engine_limits_t l = {.field_mask = KVB_ENGINE_LIMITS_READS};
    kvb_engine_limits(e, &l);
    if (answers != NULL)
        *answers = l.read_answers;
    return l.read_conns_closed;
}

static pid_t spawn_reader(const char *self, const char *sid, uint8_t *buf, uint64_t epoch,
                          int *out_fd)
{
    int pfd[2];
    char addr[32], len[32], ep[32];
    snprintf(addr, sizeof(addr), "%llu", (unsigned long long)(uintptr_t)buf);
    snprintf(len, sizeof(len), "%u", TGT);
    snprintf(ep, sizeof(ep), "%llu", (unsigned long long)epoch);
    CHECK_EQ(pipe(pfd), 0);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* never left stopped behind us */
        dup2(pfd[1], 1);
        execl(self, self, "--reader", sid, addr, len, ep, (char *)NULL);
        _exit(127);
    }
    close(pfd[1]);
    *out_fd = pfd[0];
    return pid;
}

/* A new reader (this process) reads 1 MiB at an odd offset: exact bytes. */
static void read_after(kvb_engine_h t, const uint8_t *tbuf, uint64_t epoch)
{
    kvb_engine_h r = kvb_test_engine(KVB_TRANSPORT_TCP, 0);
    uint8_t *loc = malloc(MiB);
    CHECK(loc != NULL);
    memset(loc, 0xEE, MiB);
    CHECK_EQ(kvb_engine_register(r, loc, MiB, KVB_MEM_HOST), KVB_OK);
    kvb_engine_set_writer_tag(r, TAG);
    kvb_write_params_t wp = {.field_mask = KVB_WRITE_PARAM_EPOCH, .epoch = epoch};
    kvb_block_t b = {(uint64_t)(uintptr_t)tbuf + 4099, (uint64_t)(uintptr_t)loc, MiB};
    kvb_xfer_h x;
    CHECK_EQ(kvb_engine_read_async_ex(r, kvb_engine_session_id(t), &b, 1, &wp, &x), KVB_OK);
    CHECK_EQ(kvb_xfer_wait(x, 10), KVB_OK);
    kvb_xfer_free(x);
    CHECK(memcmp(loc, tbuf + 4099, MiB) == 0);
    kvb_engine_destroy(r);
    free(loc);
}

/* "--round N": one target, one stuck reader closed and resumed. */
static int round_main(const char *self, int round)
{
    kvb_engine_params_t tp = {.field_mask =
                                  KVB_ENGINE_PARAM_TRANSPORT | KVB_ENGINE_PARAM_PEER_TIMEOUT,
                              .transport = KVB_TRANSPORT_TCP,
                              .peer_timeout_s = PEER_TIMEOUT_S};
    kvb_engine_h te;
    uint64_t epoch, answers = 0;
    char line[64] = "";
    CHECK_EQ(kvb_engine_create(&tp, &te), KVB_OK);
    kvb_test_end_t t = kvb_test_end(te, TGT, 0, false);
    for (size_t i = 0; i < TGT; i++)
        t.buf[i] = pattern(i);
    CHECK_EQ(kvb_engine_grant_writer(te, TAG, &epoch), KVB_OK);
    uint64_t closed0 = conns_closed(te, NULL);
    int fd;
    pid_t pid = spawn_reader(self, kvb_engine_session_id(te), t.buf, epoch, &fd);
    CHECK(read_bounded(fd, line, 2, 10.0) == 1 && line[0] == 'r');
    for (int i = 0; i < 5000 && answers == 0; i++) { /* its requests are answered */
        conns_closed(te, &answers);
        if (answers == 0)
            usleep(1000);
    }
    CHECK(answers > 0);
    double t0 = kvb_test_now_s();
    CHECK_EQ(kill(pid, SIGSTOP), 0);
    usleep(300000); /* the target's sends fill the reader's socket and stall */
    conns_closed(te, &answers);
    CHECK(answers > 0); /* the window: answers in flight to the stopped reader */
    double t_closed = -1;
    while (kvb_test_now_s() - t0 < 6 * PEER_TIMEOUT_S + 2) {
        if (conns_closed(te, NULL) > closed0) {
            t_closed = kvb_test_now_s() - t0;
            break;
        }
        usleep(5000);
    }
    usleep(200000); /* the close's aftermath runs while the reader still sleeps */
    double t_cont = kvb_test_now_s() - t0;
    CHECK_EQ(kill(pid, SIGCONT), 0);
    ssize_t n = read_bounded(fd, line, sizeof(line), 30.0);
    int st = -1, clean = -1;
    if (n > 0)
        sscanf(line, "%d %d", &st, &clean);
    int ws = 0;
    CHECK_EQ(waitpid(pid, &ws, 0), pid);
    close(fd);
    double t_end = kvb_test_now_s() - t0;
    fprintf(stderr,
            "round %d: %llu answers in flight to the reader stopped at 0; its connection closed by "
            "the target at %.3f s (peer time-out %.1f s), resumed at %.3f s; its read ended "
            "%s (clean %d) by %.3f s\n",
            round, (unsigned long long)answers, t_closed, PEER_TIMEOUT_S, t_cont,
            n > 0 ? kvb_status_string((kvb_status_t)st) : "(no answer)", clean, t_end);
    /* The window: closed while the reader was stopped, by the tick's bound
     * (counted from the last answer that left: up to the SIGSTOP, and the
     * reader was taking answers until then, so a little before t0). */
    CHECK(t_closed >= 0.8 * PEER_TIMEOUT_S && t_closed < t_cont);
    CHECK(WIFEXITED(ws) && WEXITSTATUS(ws) == 0);
    CHECK(n > 0 && st != KVB_OK); /* its answers were cut: the read fails */
    read_after(te, t.buf, epoch); /* the target serves on */
    CHECK_EQ(kvb_engine_revoke_writer(te, TAG, epoch, 5.0), KVB_OK);
    CHECK_EQ(kvb_engine_unregister(te, t.buf), KVB_OK);
    CHECK_EQ(kvb_engine_register(te, t.buf, TGT, KVB_MEM_HOST), KVB_OK);
    kvb_test_end_free(&t);
    fprintf(stderr, "round %d: target lived on, destroyed at %.3f s\n", round,
            kvb_test_now_s() - t0);
    return 0;
}

/* Run one round in a child; its wait status (bounded: killed past the bound). */
static int run_round(const char *self, int round, double *took)
{
    char r[16];
    snprintf(r, sizeof(r), "%d", round);
    double t0 = kvb_test_now_s();
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        execl(self, self, "--round", r, (char *)NULL);
        _exit(127);
    }
    int ws = 0;
    for (;;) {
        pid_t w = waitpid(pid, &ws, WNOHANG);
        if (w == pid)
            break;
        CHECK(w == 0 || errno == EINTR);
        if (kvb_test_now_s() - t0 > ROUND_BOUND_S) {
            kill(pid, SIGKILL);
            CHECK_EQ(waitpid(pid, &ws, 0), pid);
            fprintf(stderr, "round %d: hung past %.0f s, killed\n", round, ROUND_BOUND_S);
            break;
        }
        usleep(20000);
    }
    *took = kvb_test_now_s() - t0;
    return ws;
}

int main(int argc, char **argv)
{
    signal(SIGPIPE, SIG_IGN);
    if (argc > 5 && strcmp(argv[1], "--reader") == 0)
        return child_reader(argv);
    char self[4096];
    ssize_t sn = readlink("/proc/self/exe", self, sizeof(self) - 1);
    CHECK(sn > 0);
    self[sn] = '\0';
    if (argc > 2 && strcmp(argv[1], "--round") == 0)
        return round_main(self, atoi(argv[2]));
    int rounds = argc > 1 ? atoi(argv[1]) : 4;
    CHECK(rounds > 0 && rounds <= 1000);
    int died = 0, failed = 0;
    for (int i = 0; i < rounds; i++) {
        double took = 0;
        int ws = run_round(self, i, &took);
        if (WIFSIGNALED(ws)) {
            died++;
            fprintf(stderr, "round %d: target died of signal %d (%s) after %.3f s\n", i,
                    WTERMSIG(ws), strsignal(WTERMSIG(ws)), took);
        } else if (!WIFEXITED(ws) || WEXITSTATUS(ws) != 0) {
            failed++;
            fprintf(stderr, "round %d: target failed (exit %d) after %.3f s\n", i,
                    WIFEXITED(ws) ? WEXITSTATUS(ws) : -1, took);
        }
    }
    fprintf(stderr, "stuck reader closed and resumed: %d rounds, target died in %d, failed in %d\n",
            rounds, died, failed);
    CHECK_EQ(died, 0);
    CHECK_EQ(failed, 0);
    TEST_PASS("a stuck reader's endpoint closed by the tick, the reader resumed: the target "
              "lives on, serves and unregisters");
    return 0;
}
