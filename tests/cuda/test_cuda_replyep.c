/* A peer of the message lane dies (SIGKILL) while the target still owes it
 * an answer from a device copy: the target (this process) holds device
 * memory of the driver-API test double, whose copies each take
 * KVB_CUDA_DOUBLE_SLOW_MS; a forked writer (tcp, so UCX detects its death)
 * writes 1 MiB into that memory (argv[1] "write": the staged copy in, then
 * the ack) or reads 1 MiB of it ("read": the staged gather, then the
 * answer). The writer is killed while the target's device-copy worker is
 * inside that copy, so UCX fails the target's reply endpoint to it (and,
 * as it does with an endpoint never handed to the user, frees it) before
 * the job ends and the target answers. The target must survive that
 * answer (under ASan: no access to the freed endpoint), log that it dropped
 * it, and then serve a second writer: its write is acknowledged and its
 * bytes land. The timings that prove the window are printed: the copy
 * began before the kill, and ended after the target learned of the death. */
#include "cuda/cuda_test.h"
#include "kvb_test_engine.h"

#include <pthread.h>
#include <time.h>

#define LEN (1u << 20)
#define SMALL (64u << 10)

typedef struct info {
    char sid[128];
    uint64_t dev_addr, host_addr;
} info_t;

static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static void pipe_io(int fd, void *p, size_t n, bool rd)
{
    uint8_t *b = p;
    while (n > 0) {
        ssize_t k = rd ? read(fd, b, n) : write(fd, b, n);
        CHECK(k > 0);
        b += k, n -= (size_t)k;
    }
}

/* The target's log lines about dropped answers, with when they came. */
static pthread_mutex_t log_mu = PTHREAD_MUTEX_INITIALIZER;
static double dropped_at = -1;
static char dropped_line[512];

static void on_log(kvb_log_level_t level, const char *line, void *arg)
{
    (void)arg;
    fprintf(stderr, "%s\n", line);
    if (strstr(line, "answers to it were pending") == NULL)
        return;
    pthread_mutex_lock(&log_mu);
    if (dropped_at < 0) {
        dropped_at = kvb_test_now_s();
        snprintf(dropped_line, sizeof(dropped_line), "%s", line);
    }
    pthread_mutex_unlock(&log_mu);
}

/* Child: a writer engine on tcp; once the target's coordinates come on in,
 * writes (or reads) LEN bytes of its device memory, says so on out, and
 * waits to be killed. small: instead, write SMALL bytes (pattern 7) into
 * its host region, and report the status on out. */
static void writer_main(int in, int out, bool read, bool small)
{
    info_t in_info;
    pipe_io(in, &in_info, sizeof(in_info), true);
    kvb_engine_h w = kvb_test_engine(KVB_TRANSPORT_TCP, 1);
    size_t n = small ? SMALL : LEN;
    uint8_t *buf = malloc(n);
    CHECK(buf != NULL);
    for (size_t i = 0; i < n; i++)
        buf[i] = cuda_test_byte(small ? 7 : 5, i);
    CHECK_EQ(kvb_engine_register(w, buf, n, KVB_MEM_HOST), KVB_OK);
    kvb_xfer_h x;
    if (small) {
        kvb_block_t b = {(uint64_t)(uintptr_t)buf, in_info.host_addr, n};
        int st = kvb_engine_write(w, in_info.sid, &b, 1, 20.0);
        pipe_io(out, &st, sizeof(st), false);
        kvb_engine_destroy(w);
        _exit(0);
    }
    kvb_block_t b = read ? (kvb_block_t){in_info.dev_addr, (uint64_t)(uintptr_t)buf, n}
                         : (kvb_block_t){(uint64_t)(uintptr_t)buf, in_info.dev_addr, n};
    CHECK_EQ(read ? kvb_engine_read_async(w, in_info.sid, &b, 1, &x)
                  : kvb_engine_write_async(w, in_info.sid, &b, 1, &x),
             KVB_OK);
    int started = 1;
    pipe_io(out, &started, sizeof(started), false);
    for (;;)
        pause(); /* killed; alarm(60) otherwise */
}

typedef struct child {
    pid_t pid;
    int to, from;
} child_t;

static child_t spawn(bool read, bool small)
{
    int a[2], b[2];
    CHECK(pipe(a) == 0 && pipe(b) == 0);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        close(a[1]);
        close(b[0]);
        alarm(60); /* never outlive a stuck parent */
        writer_main(a[0], b[1], read, small);
    }
    close(a[0]);
    close(b[1]);
    return (child_t){pid, a[1], b[0]};
}

static uint64_t syncs(void)
{
    kvb_cuda_double_stats_t s;
    CHECK(ct_stats(&s)); /* the double only: its syncs mark the copies' start */
    return s.syncs;
}

int main(int argc, char **argv)
{
    bool read = argc > 1 && strcmp(argv[1], "read") == 0;
    const char *slow = getenv("KVB_CUDA_DOUBLE_SLOW_MS");
    CHECK(slow != NULL && atoi(slow) >= 500);
    double slow_s = atoi(slow) / 1000.0;
    /* first: fork before any thread */
    child_t dying = spawn(read, false), later = spawn(false, true);
    kvb_log_set_handler(on_log, NULL);
    kvb_log_set_level(KVB_LOG_INFO);
    kvb_engine_h t = kvb_test_engine(KVB_TRANSPORT_TCP, 1);
    uint8_t *dev = cuda_test_alloc(0, LEN), *host = calloc(1, SMALL);
    CHECK(host != NULL);
    uint8_t *fill = malloc(LEN);
    CHECK(fill != NULL);
    for (size_t i = 0; i < LEN; i++)
        fill[i] = read ? cuda_test_byte(3, i) : 0;
    ct_htod(dev, fill, LEN);
    kvb_mem_region_ex_t r = {KVB_MEM_REGION_FIELD_DEVICE, dev, LEN, KVB_MEM_CUDA, ct_device(0), 0};
    CHECK_EQ(kvb_engine_register_ex(t, &r, 1, sizeof(r)), KVB_OK);
    CHECK_EQ(kvb_engine_register(t, host, SMALL, KVB_MEM_HOST), KVB_OK);
    info_t in = {.dev_addr = (uint64_t)(uintptr_t)dev, .host_addr = (uint64_t)(uintptr_t)host};
    snprintf(in.sid, sizeof(in.sid), "%s", kvb_engine_session_id(t));

    uint64_t s0 = syncs();
    double t0 = kvb_test_now_s();
    pipe_io(dying.to, &in, sizeof(in), false);
    int started = 0;
    pipe_io(dying.from, &started, sizeof(started), true);
    /* the target's device copy for that message began (its sync is held
     * slow_s); bounded: 2000 x 5 ms */
    double copy_began = -1;
    for (int i = 0; i < 2000 && copy_began < 0; i++) {
        if (syncs() > s0)
            copy_began = kvb_test_now_s();
        else
            sleep_ms(5);
    }
    CHECK(copy_began >= 0);
    sleep_ms(100);
    double killed = kvb_test_now_s();
    CHECK(kill(dying.pid, SIGKILL) == 0);
    int ws = 0;
    CHECK(waitpid(dying.pid, &ws, 0) == dying.pid && WIFSIGNALED(ws));
    /* said now: a target that touches the freed endpoint dies before the end */
    fprintf(stderr, "%.3f s: the target's device copy began (held %.3f s); %.3f s: writer killed\n",
            copy_began - t0, slow_s, killed - t0);
    /* the copy ends slow_s after it began; the answer follows it: wait for
     * the target's word on it (bounded) */
    for (int i = 0; i < 400; i++) {
        pthread_mutex_lock(&log_mu);
        double d = dropped_at;
        pthread_mutex_unlock(&log_mu);
        if (d >= 0 && kvb_test_now_s() > copy_began + slow_s + 0.5)
            break;
        sleep_ms(10);
    }
    double copy_ended = copy_began + slow_s; /* at the earliest */
    fprintf(stderr,
            "timeline (s since the %s started): device copy began %.3f, writer killed %.3f "
            "(copy still held until >= %.3f), target learned of the death %.3f\n",
            read ? "read" : "write", copy_began - t0, killed - t0, copy_ended - t0,
            dropped_at - t0);
    /* the window: the copy was in flight when the writer died */
    CHECK(copy_began < killed && killed < copy_ended);
    /* and UCX ended the endpoint (the target learned of it) before the
     * copy ended and the answer was due */
    CHECK(dropped_at > killed && dropped_at < copy_ended);
    CHECK(dropped_line[0] != '\0');
    fprintf(stderr, "dropped: %s\n", dropped_line);
    if (!read) { /* the write's bytes were copied in all the same */
        uint8_t *got = malloc(LEN);
        CHECK(got != NULL);
        ct_dtoh(got, dev, LEN);
        for (size_t i = 0; i < LEN; i++)
            CHECK_EQ(got[i], cuda_test_byte(5, i));
        free(got);
    }
    /* the target serves on: a second writer's write is acknowledged, its
     * bytes land */
    pipe_io(later.to, &in, sizeof(in), false);
    int st = -1;
    pipe_io(later.from, &st, sizeof(st), true);
    CHECK_EQ(st, KVB_OK);
    for (size_t i = 0; i < SMALL; i++)
        CHECK_EQ(host[i], cuda_test_byte(7, i));
    CHECK(waitpid(later.pid, &ws, 0) == later.pid && WIFEXITED(ws) && WEXITSTATUS(ws) == 0);
    kvb_engine_destroy(t);
    kvb_log_set_handler(NULL, NULL);
    free(fill);
    free(host);
    TEST_PASS(read ? "read answer after the reader died" : "write ack after the writer died");
    return 0;
}
