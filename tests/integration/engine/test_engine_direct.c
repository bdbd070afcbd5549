/* The direct lane: a writer on the same host maps the target's kvb_mem_alloc
 * memory and its copy threads write the blocks in. Two engines in this
 * process on 127.0.0.1, plus a target in a forked child (cross-process
 * mapping, and kill -9 under a write loop). Every wait is bounded. */
#include "kvb_test.h"

#include <kvbridge/engine.h>

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MiB (1u << 20)
#define SRC_BYTES (64u * MiB)
#define TGT_BYTES (64u * MiB)   /* the in-process target's kvb_mem_alloc memory */
#define CHILD_BYTES (32u * MiB) /* the child target's */
#define TAG 0x5eed1234u

static uint8_t *g_src;
static uint64_t g_rng = 0x9e3779b97f4a7c15ull;

static uint64_t rnd(void)
{
    return kvb_test_xorshift(&g_rng);
}

static uint64_t addr(const void *p)
{
    return (uint64_t)(uintptr_t)p;
}

/* copy_threads < 0: the default (or the environment's) */
static kvb_engine_h make_engine(int copy_threads, double peer_timeout)
{
    kvb_engine_params_t p = {0};
    kvb_engine_h e;
    p.field_mask = KVB_ENGINE_PARAM_TRANSPORT | KVB_ENGINE_PARAM_PEER_TIMEOUT;
    p.transport = KVB_TRANSPORT_AUTO;
    p.peer_timeout_s = peer_timeout;
    if (copy_threads >= 0) {
        p.field_mask |= KVB_ENGINE_PARAM_COPY_THREADS;
        p.copy_threads = (unsigned)copy_threads;
    }
    CHECK_EQ(kvb_engine_create(&p, &e), KVB_OK);
    return e;
}

static kvb_engine_h make_writer(int copy_threads)
{
    kvb_engine_h w = make_engine(copy_threads, 2.0);
    CHECK_EQ(kvb_engine_register(w, g_src, SRC_BYTES, KVB_MEM_HOST), KVB_OK);
    return w;
}

/* Word-wise hash of n bytes (n a multiple of 8), identical in both processes. */
static uint64_t hash64(const uint8_t *p, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ull, w;
    for (size_t i = 0; i < n; i += 8) {
        memcpy(&w, p + i, 8);
        h = (h ^ w) * 0x100000001b3ull;
        h ^= h >> 29;
    }
    return h;
}

/* A batch of random-sized blocks at random, non-overlapping places in
 * [dst, dst + dlen): 1 B, 1 KiB, 1 B..8 KiB, 100..200 KiB and a few of
 * 1..4 MiB (longer than a copy unit, odd lengths and offsets); shuffled. */
static size_t random_batch(kvb_block_t *b, size_t cap, uint64_t dst, size_t dlen, int scale)
{
    size_t n = 0, total = 0;
    for (int i = 0; i < 1500 / scale; i++)
        b[n++].len = 1;
    for (int i = 0; i < 1500 / scale; i++)
        b[n++].len = 1024;
    for (int i = 0; i < 500 / scale; i++)
        b[n++].len = 1 + rnd() % 8192;
    for (int i = 0; i < 120 / scale; i++)
        b[n++].len = 100 * 1024 + rnd() % (100 * 1024);
    for (int i = 0; i < 6 / scale + 1; i++)
        b[n++].len = MiB + rnd() % (3 * MiB);
    CHECK(n <= cap);
    for (size_t i = n - 1; i > 0; i--) { /* shuffle the sizes: places are in order */
        size_t j = rnd() % (i + 1);
        kvb_block_t t = b[i];
        b[i] = b[j];
        b[j] = t;
    }
    for (size_t i = 0; i < n; i++)
        total += b[i].len;
    CHECK(total < dlen);
    size_t gap_max = (dlen - total) / n + 1, at = 0;
    for (size_t i = 0; i < n; i++) {
        at += rnd() % gap_max;
        b[i].dst = dst + at;
        b[i].src = addr(g_src) + rnd() % (SRC_BYTES - b[i].len + 1);
        at += b[i].len;
    }
    CHECK(at <= dlen);
    return n;
}

/* expected := what dst should hold after the batch; then compare all of it. */
static void apply(uint8_t *expected, uint64_t base, const kvb_block_t *b, size_t n)
{
    for (size_t i = 0; i < n; i++)
        memcpy(expected + (b[i].dst - base), (const void *)(uintptr_t)b[i].src, b[i].len);
}

static void same_bytes(const uint8_t *got, const uint8_t *want, size_t n, const char *what)
{
    if (memcmp(got, want, n) == 0)
        return;
    size_t i = 0;
    while (got[i] == want[i])
        i++;
    fprintf(stderr, "%s: first difference at +%zu (0x%02x, expected 0x%02x)\n", what, i, got[i],
            want[i]);
    exit(1);
}

/* ---- (h) a target in a forked child ---- */

typedef struct child {
    pid_t pid;
    int cmd_w, rep_r;
    char sid[128];
    uint64_t base;
} child_t;

static void write_full(int fd, const void *p, size_t n)
{
    const uint8_t *b = p;
    while (n > 0) {
        ssize_t w = write(fd, b, n);
        if (w < 0 && errno == EINTR)
            continue;
        CHECK(w > 0);
        b += w;
        n -= (size_t)w;
    }
}

/* Read n bytes within timeout_s; false on EOF, error or time-out. */
static bool read_full(int fd, void *p, size_t n, double timeout_s)
{
    uint8_t *b = p;
    double end = kvb_test_now_s() + timeout_s;
    while (n > 0) {
        struct pollfd pf = {.fd = fd, .events = POLLIN};
        int ms = (int)((end - kvb_test_now_s()) * 1000);
        if (ms <= 0 || poll(&pf, 1, ms) <= 0)
            return false;
        ssize_t r = read(fd, b, n);
        if (r <= 0)
            return false;
        b += r;
        n -= (size_t)r;
    }
    return true;
}

/* Child: a target engine over kvb_mem_alloc memory; answers hash requests
 * (u64 off, u64 len) until its command pipe closes. */
static void child_main(int cmd_r, int rep_w)
{
    kvb_engine_h eng;
    void *mem;
    char hello[128 + 8] = {0};
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (kvb_engine_create(NULL, &eng) != KVB_OK || kvb_mem_alloc(CHILD_BYTES, &mem) != KVB_OK ||
        kvb_engine_register(eng, mem, CHILD_BYTES, KVB_MEM_HOST) != KVB_OK)
        _exit(3);
    snprintf(hello, 128, "%s", kvb_engine_session_id(eng));
    uint64_t base = addr(mem);
    memcpy(hello + 128, &base, 8);
    write_full(rep_w, hello, sizeof(hello));
    uint64_t req[2];
    for (;;) {
        size_t got = 0;
        while (got < sizeof(req)) {
            ssize_t r = read(cmd_r, (uint8_t *)req + got, sizeof(req) - got);
            if (r <= 0)
                goto out;
            got += (size_t)r;
        }
        if (req[0] > CHILD_BYTES || req[1] > CHILD_BYTES - req[0])
            _exit(4);
        uint64_t h = hash64((const uint8_t *)mem + req[0], req[1]);
        write_full(rep_w, &h, sizeof(h));
    }
out:
    kvb_engine_destroy(eng);
    kvb_mem_free(mem);
    _exit(0);
}

/* Forked before this process starts any thread (UCX, engines). */
static void child_start(child_t *c)
{
    int cmd[2], rep[2];
    char hello[128 + 8];
    CHECK(pipe(cmd) == 0 && pipe(rep) == 0);
    c->pid = fork();
    CHECK(c->pid >= 0);
    if (c->pid == 0) {
        close(cmd[1]);
        close(rep[0]);
        child_main(cmd[0], rep[1]);
    }
    close(cmd[0]);
    close(rep[1]);
    c->cmd_w = cmd[1];
    c->rep_r = rep[0];
    CHECK(read_full(c->rep_r, hello, sizeof(hello), 30));
    hello[127] = '\0';
    memcpy(c->sid, hello, 128);
    memcpy(&c->base, hello + 128, 8);
}

static uint64_t child_hash(child_t *c, uint64_t off, uint64_t len)
{
    uint64_t req[2] = {off, len}, h;
    write_full(c->cmd_w, req, sizeof(req));
    CHECK(read_full(c->rep_r, &h, sizeof(h), 30));
    return h;
}

static void test_cross_process(child_t *c)
{
    kvb_engine_h w = make_writer(-1);
    size_t cap = 4000;
    kvb_block_t *b = calloc(cap, sizeof(*b));
    uint8_t *shadow = calloc(1, CHILD_BYTES); /* the child's memory starts zeroed */
    CHECK(b != NULL && shadow != NULL);
    CHECK_EQ(kvb_engine_session_direct(w, c->sid), KVB_ERR_NOT_FOUND);
    CHECK_EQ(child_hash(c, 0, CHILD_BYTES), hash64(shadow, CHILD_BYTES));
    for (int round = 0; round < 2; round++) {
        size_t n = random_batch(b, cap, c->base, CHILD_BYTES, 2);
        CHECK_EQ(kvb_engine_write(w, c->sid, b, n, 20), KVB_OK);
        CHECK_EQ(kvb_engine_session_direct(w, c->sid), 1);
        apply(shadow, c->base, b, n);
        CHECK(child_hash(c, 0, CHILD_BYTES) == hash64(shadow, CHILD_BYTES));
        CHECK(child_hash(c, 4096, 8192) == hash64(shadow + 4096, 8192));
    }
    TEST_PASS("cross-process: random batches land byte-exact in the child (direct lane)");

    /* kill -9 under a loop of 32 MiB writes */
    for (int i = 0; i < 32; i++)
        b[i] = (kvb_block_t){addr(g_src) + (uint64_t)i * MiB, c->base + (uint64_t)i * MiB, MiB};
    double t_kill = 0, t_fail = 0;
    int writes = 0;
    kvb_status_t st = KVB_OK;
    for (double end = kvb_test_now_s() + 20; st == KVB_OK && kvb_test_now_s() < end; writes++) {
        kvb_xfer_h x;
        st = kvb_engine_write_async(w, c->sid, b, 32, &x);
        if (st == KVB_OK) {
            if (writes == 3) {
                t_kill = kvb_test_now_s();
                CHECK(kill(c->pid, SIGKILL) == 0);
            }
            st = kvb_xfer_wait(x, 5);
            CHECK(st != KVB_ERR_TIMEOUT);
            if (st != KVB_OK) {
                CHECK_STR_CONTAINS(kvb_xfer_error(x), c->sid);
            }
            kvb_xfer_free(x);
        }
        if (st != KVB_OK)
            t_fail = kvb_test_now_s();
    }
    CHECK_EQ(st, KVB_ERR_PEER);
    CHECK(t_kill > 0);
    fprintf(stderr, "  first failure %.3f s after kill -9 (%d writes)\n", t_fail - t_kill, writes);
    CHECK(t_fail - t_kill < 2.0); /* the writer's peer_timeout_s */
    /* the next write: no listener any more */
    double t0 = kvb_test_now_s();
    CHECK_EQ(kvb_engine_write(w, c->sid, b, 1, 5), KVB_ERR_PEER);
    CHECK(kvb_test_now_s() - t0 < 5.5);
    CHECK_EQ(kvb_engine_session_direct(w, c->sid) == 1, 0);
    int ws;
    CHECK(waitpid(c->pid, &ws, 0) == c->pid);
    CHECK(WIFSIGNALED(ws) && WTERMSIG(ws) == SIGKILL);
    close(c->cmd_w);
    close(c->rep_r);
    kvb_engine_destroy(w);
    free(shadow);
    free(b);
    TEST_PASS("cross-process: target killed -9 mid-loop: KVB_ERR_PEER within the bound");
}

/* ---- in-process: target t over kvb_mem_alloc memory ---- */

typedef struct target {
    kvb_engine_h eng;
    const char *sid;
    uint8_t *mem;
} target_t;

static void test_random(kvb_engine_h w, target_t *t, uint8_t *expected)
{
    size_t cap = 5000;
    kvb_block_t *b = calloc(cap, sizeof(*b));
    CHECK(b != NULL);
    memset(t->mem, 0xab, TGT_BYTES);
    memcpy(expected, t->mem, TGT_BYTES);
    CHECK_EQ(kvb_engine_session_direct(w, t->sid), KVB_ERR_NOT_FOUND); /* no connection yet */
    size_t n = random_batch(b, cap, addr(t->mem), TGT_BYTES, 1);
    CHECK(n > 3000);
    CHECK_EQ(kvb_engine_write(w, t->sid, b, n, 20), KVB_OK);
    CHECK_EQ(kvb_engine_session_direct(w, t->sid), 1);
    apply(expected, addr(t->mem), b, n);
    same_bytes(t->mem, expected, TGT_BYTES, "sync batch");
    /* the same again, asynchronously, with the caller's array scribbled over */
    n = random_batch(b, cap, addr(t->mem), TGT_BYTES, 1);
    kvb_xfer_h x;
    CHECK_EQ(kvb_engine_write_async(w, t->sid, b, n, &x), KVB_OK);
    apply(expected, addr(t->mem), b, n);
    memset(b, 0, n * sizeof(*b));
    CHECK_EQ(kvb_xfer_wait(x, 20), KVB_OK);
    CHECK(strcmp(kvb_xfer_error(x), "") == 0);
    kvb_xfer_free(x);
    same_bytes(t->mem, expected, TGT_BYTES, "async batch");
    /* an empty batch and zero-length blocks */
    CHECK_EQ(kvb_engine_write(w, t->sid, b, 0, 5), KVB_OK);
    b[0] = (kvb_block_t){addr(g_src), addr(t->mem) + 5, 0};
    CHECK_EQ(kvb_engine_write(w, t->sid, b, 1, 5), KVB_OK);
    same_bytes(t->mem, expected, TGT_BYTES, "empty batches");
    free(b);
    TEST_PASS("(a) thousands of random blocks (1 B .. 4 MiB) byte-exact, session direct");
}

static void test_bounds(kvb_engine_h w, target_t *t, uint8_t *expected)
{
    kvb_block_t b[101];
    kvb_xfer_h x;
    memcpy(expected, t->mem, TGT_BYTES);
    for (int i = 0; i < 101; i++)
        b[i] = (kvb_block_t){addr(g_src) + (uint64_t)i * 8192, addr(t->mem) + (uint64_t)i * 65536,
                             4096};
    b[50].dst = addr(t->mem) + TGT_BYTES - 10; /* crosses the end by 90 bytes */
    b[50].len = 100;
    CHECK_EQ(kvb_engine_write(w, t->sid, b, 101, 10), KVB_ERR_BOUNDS);
    CHECK_STR_CONTAINS(kvb_engine_last_error(w), "destination");
    CHECK_STR_CONTAINS(kvb_engine_last_error(w), t->sid);
    b[50].dst = addr(g_src); /* not the target's at all */
    CHECK_EQ(kvb_engine_write(w, t->sid, b, 101, 10), KVB_ERR_BOUNDS);
    b[50].dst = UINT64_MAX - 10; /* wraps */
    CHECK_EQ(kvb_engine_write(w, t->sid, b, 101, 10), KVB_ERR_BOUNDS);
    b[50].dst = addr(t->mem) - 1; /* one byte before */
    CHECK_EQ(kvb_engine_write_async(w, t->sid, b, 101, &x), KVB_ERR_BOUNDS);
    b[50].dst = addr(t->mem);
    b[50].src = addr(g_src) + SRC_BYTES - 10; /* source past its region */
    CHECK_EQ(kvb_engine_write(w, t->sid, b, 101, 10), KVB_ERR_BOUNDS);
    CHECK_STR_CONTAINS(kvb_engine_last_error(w), "source");
    usleep(20000);
    same_bytes(t->mem, expected, TGT_BYTES, "refused batches wrote");
    /* positive control: the same batch, fixed, lands */
    b[50].src = addr(g_src);
    b[50].dst = addr(t->mem) + TGT_BYTES - 100;
    CHECK_EQ(kvb_engine_write(w, t->sid, b, 101, 10), KVB_OK);
    apply(expected, addr(t->mem), b, 101);
    same_bytes(t->mem, expected, TGT_BYTES, "fixed batch");
    TEST_PASS("(b) a block outside the registration: KVB_ERR_BOUNDS, nothing written");
}

/* n blocks of 1 MiB over the target's first 64 MiB, over and over. */
static kvb_block_t *big_batch(const target_t *t, size_t n)
{
    kvb_block_t *b = malloc(n * sizeof(*b));
    CHECK(b != NULL);
    for (size_t i = 0; i < n; i++)
        b[i] =
            (kvb_block_t){addr(g_src) + (i % 64) * MiB, addr(t->mem) + ((i * 7) % 64) * MiB, MiB};
    return b;
}

/* After a transfer ended, nothing of it may land any more. */
static void settled(const target_t *t, uint8_t *snap, const char *what)
{
    memcpy(snap, t->mem, TGT_BYTES);
    usleep(30000);
    same_bytes(t->mem, snap, TGT_BYTES, what);
}

static void test_fence(kvb_engine_h w, target_t *t, uint8_t *expected)
{
    kvb_block_t b[64];
    kvb_xfer_h x;
    for (int i = 0; i < 64; i++)
        b[i] = (kvb_block_t){addr(g_src) + rnd() % (SRC_BYTES - 70000),
                             addr(t->mem) + (uint64_t)i * MiB + rnd() % 1000, 1 + rnd() % 70000};
    CHECK_EQ(kvb_engine_write(w, t->sid, b, 64, 10), KVB_OK); /* unfenced: fine */
    CHECK_EQ(kvb_engine_session_direct(w, t->sid), 1);

    memset(t->mem, 0x3c, TGT_BYTES);
    memcpy(expected, t->mem, TGT_BYTES);
    kvb_engine_fence_writer(t->eng, TAG, 1);
    CHECK_EQ(kvb_engine_write(w, t->sid, b, 64, 10), KVB_ERR_FENCED);
    CHECK_STR_CONTAINS(kvb_engine_last_error(w), "fenced");
    CHECK_EQ(kvb_engine_write_async(w, t->sid, b, 64, &x), KVB_OK);
    CHECK_EQ(kvb_xfer_wait(x, 10), KVB_ERR_FENCED);
    CHECK_STR_CONTAINS(kvb_xfer_error(x), "fenced");
    kvb_xfer_free(x);
    usleep(20000);
    same_bytes(t->mem, expected, TGT_BYTES, "fenced writer's bytes");
    /* fencing twice, and lifting another tag's fence, change nothing */
    kvb_engine_fence_writer(t->eng, TAG, 1);
    kvb_engine_fence_writer(t->eng, TAG + 1, 0);
    CHECK_EQ(kvb_engine_write(w, t->sid, b, 64, 10), KVB_ERR_FENCED);
    same_bytes(t->mem, expected, TGT_BYTES, "fenced writer's bytes (2)");

    kvb_engine_fence_writer(t->eng, TAG, 0);
    CHECK_EQ(kvb_engine_write(w, t->sid, b, 64, 10), KVB_OK);
    apply(expected, addr(t->mem), b, 64);
    same_bytes(t->mem, expected, TGT_BYTES, "after unfencing");
    CHECK_EQ(kvb_engine_session_direct(w, t->sid), 1);
    /* another writer's tag fenced: ours unaffected */
    kvb_engine_fence_writer(t->eng, TAG + 1, 1);
    for (int i = 0; i < 64; i++)
        b[i].src = addr(g_src) + rnd() % (SRC_BYTES - 70000);
    CHECK_EQ(kvb_engine_write(w, t->sid, b, 64, 10), KVB_OK);
    apply(expected, addr(t->mem), b, 64);
    same_bytes(t->mem, expected, TGT_BYTES, "other tag fenced");

    /* fenced while a 256 MiB direct write runs: it stops (or had finished),
     * and once it reports its end nothing more lands */
    kvb_block_t *big = big_batch(t, 256);
    int stopped = 0;
    for (int round = 0; round < 3; round++) {
        CHECK_EQ(kvb_engine_write_async(w, t->sid, big, 256, &x), KVB_OK);
        usleep((useconds_t)(round * 2000));
        kvb_engine_fence_writer(t->eng, TAG, 1);
        kvb_status_t st = kvb_xfer_wait(x, 5);
        CHECK(st == KVB_OK || st == KVB_ERR_FENCED);
        if (st == KVB_ERR_FENCED) {
            CHECK_STR_CONTAINS(kvb_xfer_error(x), "fenced");
            stopped++;
        }
        settled(t, expected, "bytes landed after the fenced transfer ended");
        kvb_xfer_free(x);
        kvb_engine_fence_writer(t->eng, TAG, 0);
    }
    CHECK(stopped > 0);
    kvb_engine_fence_writer(t->eng, TAG + 1, 0);
    CHECK_EQ(kvb_engine_write(w, t->sid, big, 64, 10), KVB_OK);
    free(big);
    TEST_PASS("(c) fenced writer: KVB_ERR_FENCED \"fenced\", bytes untouched; unfenced: writes");
}

static void test_plain_target(kvb_engine_h w, uint8_t *expected)
{
    kvb_engine_h t = make_engine(-1, 2.0);
    const char *sid = kvb_engine_session_id(t);
    size_t len = 8 * MiB;
    uint8_t *heap = malloc(len);
    uint8_t *anon = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    void *shared;
    CHECK(heap != NULL && anon != MAP_FAILED);
    memset(heap, 0x11, len);
    memset(anon, 0x22, len);
    CHECK_EQ(kvb_engine_register(t, heap, len, KVB_MEM_HOST), KVB_OK);
    CHECK_EQ(kvb_engine_register(t, anon, len, KVB_MEM_HOST), KVB_OK);
    kvb_block_t *b = calloc(5000, sizeof(*b));
    uint8_t *exp2 = expected + len;
    memcpy(expected, heap, len);
    memcpy(exp2, anon, len);
    size_t n1 = random_batch(b, 5000, addr(heap), len, 8);
    size_t n2 = random_batch(b + n1, 5000 - n1, addr(anon), len, 8);
    CHECK_EQ(kvb_engine_write(w, sid, b, n1 + n2, 20), KVB_OK);
    CHECK_EQ(kvb_engine_session_direct(w, sid), 0);
    apply(expected, addr(heap), b, n1);
    apply(exp2, addr(anon), b + n1, n2);
    same_bytes(heap, expected, len, "malloc target");
    same_bytes(anon, exp2, len, "mmap target");
    TEST_PASS("(d) target with malloc/mmap memory: writes land, not direct");

    /* The target adds kvb_mem_alloc memory: the writer picks it up (new
     * table), goes direct for it, and a batch spanning both kinds lands. */
    CHECK_EQ(kvb_mem_alloc(len, &shared), KVB_OK);
    CHECK_EQ(kvb_engine_register(t, shared, len, KVB_MEM_HOST), KVB_OK);
    uint8_t *exp3 = expected + 2 * len;
    memset(exp3, 0, len);
    size_t n3 = random_batch(b, 5000, addr(shared), len, 8);
    CHECK_EQ(kvb_engine_write(w, sid, b, n3, 20), KVB_OK);
    CHECK_EQ(kvb_engine_session_direct(w, sid), 1);
    apply(exp3, addr(shared), b, n3);
    same_bytes(shared, exp3, len, "kvb_mem_alloc region added later");
    n1 = random_batch(b, 5000, addr(heap), len, 8);
    n3 = random_batch(b + n1, 5000 - n1, addr(shared), len, 8);
    CHECK_EQ(kvb_engine_write(w, sid, b, n1 + n3, 20), KVB_OK);
    apply(expected, addr(heap), b, n1);
    apply(exp3, addr(shared), b + n1, n3);
    same_bytes(heap, expected, len, "mixed batch, malloc part");
    same_bytes(shared, exp3, len, "mixed batch, shared part");
    same_bytes(anon, exp2, len, "mixed batch, untouched region");
    kvb_engine_destroy(t);
    CHECK_EQ(kvb_mem_free(shared), KVB_OK);
    munmap(anon, len);
    free(heap);
    free(b);
    TEST_PASS("(d') kvb_mem_alloc memory registered later goes direct; mixed batch exact");
}

static void test_lane_off(target_t *t, uint8_t *expected)
{
    kvb_block_t b[256];
    for (int variant = 0; variant < 2; variant++) {
        kvb_engine_h w0;
        if (variant == 0) {
            w0 = make_writer(0); /* param field */
        } else {
            setenv("KVBRIDGE_COPY_THREADS", "0", 1); /* environment twin */
            w0 = make_writer(-1);
            unsetenv("KVBRIDGE_COPY_THREADS");
        }
        memcpy(expected, t->mem, TGT_BYTES);
        for (int i = 0; i < 256; i++)
            b[i] = (kvb_block_t){addr(g_src) + rnd() % (SRC_BYTES - 65536),
                                 addr(t->mem) + (uint64_t)i * 256 * 1024 + rnd() % 1024,
                                 1 + rnd() % 65536};
        CHECK_EQ(kvb_engine_write(w0, t->sid, b, 256, 20), KVB_OK);
        CHECK_EQ(kvb_engine_session_direct(w0, t->sid), 0);
        apply(expected, addr(t->mem), b, 256);
        same_bytes(t->mem, expected, TGT_BYTES, "copy_threads = 0 writer");
        kvb_engine_destroy(w0);
    }
    TEST_PASS("(e) writer with copy_threads = 0 (param or env): writes land, not direct");
}

static void test_cancel(kvb_engine_h w, target_t *t, uint8_t *snap)
{
    kvb_block_t *big = big_batch(t, 256); /* 256 MiB */
    int canceled = 0;
    for (int round = 0; round < 4; round++) {
        kvb_xfer_h x;
        CHECK_EQ(kvb_engine_write_async(w, t->sid, big, 256, &x), KVB_OK);
        usleep((useconds_t)(round * 1000));
        double t0 = kvb_test_now_s();
        CHECK_EQ(kvb_xfer_cancel(x), KVB_OK);
        kvb_status_t st = kvb_xfer_wait(x, 5);
        CHECK(kvb_test_now_s() - t0 < 5.0);
        CHECK(st == KVB_ERR_CANCELED || st == KVB_OK);
        if (st == KVB_ERR_CANCELED) {
            CHECK_STR_CONTAINS(kvb_xfer_error(x), "cancel");
            canceled++;
        }
        CHECK_EQ(kvb_xfer_test(x), st);
        CHECK_EQ(kvb_xfer_cancel(x), KVB_OK); /* after the end: no-op */
        CHECK_EQ(kvb_xfer_wait(x, 1), st);
        settled(t, snap, "bytes landed after the cancelled transfer ended");
        kvb_xfer_free(x);
    }
    CHECK(canceled > 0);
    /* freed while running: no crash, nothing leaks; the lane still works */
    kvb_xfer_h x;
    CHECK_EQ(kvb_engine_write_async(w, t->sid, big, 256, &x), KVB_OK);
    kvb_xfer_free(x);
    CHECK_EQ(kvb_engine_write(w, t->sid, big, 8, 10), KVB_OK);
    same_bytes(t->mem, g_src, MiB, "first block after a freed transfer");
    free(big);
    TEST_PASS("(f) 256 MiB direct write cancelled: ends CANCELED/OK within 5 s, then quiet");
}

static void test_destroy_in_flight(target_t *t, uint8_t *snap)
{
    kvb_block_t *big = big_batch(t, 256);
    int canceled = 0;
    for (int round = 0; round < 2; round++) {
        kvb_engine_h w = make_writer(-1);
        kvb_xfer_h x;
        CHECK_EQ(kvb_engine_write(w, t->sid, big, 1, 10), KVB_OK);
        CHECK_EQ(kvb_engine_session_direct(w, t->sid), 1);
        CHECK_EQ(kvb_engine_write_async(w, t->sid, big, 256, &x), KVB_OK);
        usleep((useconds_t)(round * 3000));
        double t0 = kvb_test_now_s();
        kvb_engine_destroy(w);
        double dt = kvb_test_now_s() - t0;
        CHECK(dt < 5.0);
        kvb_status_t st = kvb_xfer_test(x);
        CHECK(st == KVB_ERR_CANCELED || st == KVB_OK);
        CHECK_EQ(kvb_xfer_wait(x, 1), st);
        canceled += st == KVB_ERR_CANCELED;
        settled(t, snap, "bytes landed after the writer engine was destroyed");
        kvb_xfer_free(x);
    }
    CHECK(canceled > 0);
    free(big);
    TEST_PASS("(g) writer destroyed under a 256 MiB direct write: bounded, handle CANCELED");
}

int main(void)
{
    child_t child;
    target_t t;
    signal(SIGPIPE, SIG_IGN);
    g_src = malloc(SRC_BYTES);
    CHECK(g_src != NULL);
    for (size_t i = 0; i < SRC_BYTES; i++)
        g_src[i] = (uint8_t)((i * 2654435761u) >> 13);
    child_start(&child); /* before any engine thread exists */
    test_cross_process(&child);

    uint8_t *expected = malloc(TGT_BYTES);
    void *mem;
    CHECK(expected != NULL);
    CHECK_EQ(kvb_mem_alloc(TGT_BYTES, &mem), KVB_OK);
    t.mem = mem;
    t.eng = make_engine(-1, 2.0);
    t.sid = kvb_engine_session_id(t.eng);
    CHECK_EQ(kvb_engine_register(t.eng, t.mem, TGT_BYTES, KVB_MEM_HOST), KVB_OK);
    kvb_engine_h w = make_writer(-1);
    kvb_engine_set_writer_tag(w, TAG); /* before its first write */
    CHECK_EQ(kvb_engine_session_direct(w, "127.0.0.1:1"), KVB_ERR_NOT_FOUND);

    test_random(w, &t, expected);
    test_bounds(w, &t, expected);
    test_fence(w, &t, expected);
    test_plain_target(w, expected);
    test_lane_off(&t, expected);
    test_cancel(w, &t, expected);
    test_destroy_in_flight(&t, expected);

    kvb_engine_destroy(w);
    CHECK_EQ(kvb_engine_unregister(t.eng, t.mem), KVB_OK);
    kvb_engine_destroy(t.eng);
    CHECK_EQ(kvb_mem_free(t.mem), KVB_OK);
    free(expected);
    free(g_src);
    fprintf(stderr, "ok: engine direct lane\n");
    return 0;
}
