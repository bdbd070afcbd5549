/* Notifications (engine.h, "Notifications") on one lane, argv[1]: "direct"
 * (the target's memory from kvb_mem_alloc: the copy threads write into the
 * mapping), "tcp" (the message lane over TCP) or "shm" (the put lane).
 * What a caller sees: a transfer's notification arrives only once every
 * byte of the transfer is in the target's memory (write) or the reader's
 * (read), checked by a thread polling the queue and comparing the bytes
 * the moment it arrives; the sender's name; order; a failed transfer sends
 * none; the receiver's caps (dropped, counted, still serving); malformed
 * notifications refused and counted; the sender's length rules; the
 * engine secret's token. */
#include "engine/engine_int.h"
#include "kvb_test.h"
#include "kvb_test_engine.h"

#include <kvbridge/engine.h>

#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MiB (1u << 20)
#define LEN (16u * MiB)
#define BLK (64u * 1024)

static const char *g_mode;
static kvb_transport_t g_tr;
static bool g_direct;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static uint8_t pattern(size_t i, unsigned seed)
{
    return (uint8_t)((i * 2654435761u >> 13) + seed);
}

/* Wait up to timeout_s for one notification on e; *n its count (0 or 1). */
static size_t take_one(kvb_engine_h e, kvb_notif_t *out, double timeout_s)
{
    double end = now_s() + timeout_s;
    size_t n = 0;
    while (n == 0 && now_s() < end) {
        CHECK_EQ(kvb_engine_get_notifs(e, out, 1, &n), KVB_OK);
        if (n == 0)
            usleep(200);
    }
    return n;
}

/* The watcher: polls eng's queue and, the moment a notification arrives,
 * compares mem with the expected pattern (the bytes must all be there). */
typedef struct watch {
    kvb_engine_h eng;
    const uint8_t *mem;
    size_t len;
    unsigned seed;
    size_t mismatched; /* bytes not yet in place when the notification came */
    double at;         /* arrival, monotonic s */
    char msg[64], sender[KVB_NOTIF_NAME_MAX + 1];
    int got;
} watch_t;

static void *watch_main(void *arg)
{
    watch_t *w = arg;
    kvb_notif_t nt;
    if (take_one(w->eng, &nt, 20) == 0)
        return NULL;
    w->at = now_s();
    for (size_t i = 0; i < w->len; i++)
        w->mismatched += w->mem[i] != pattern(i, w->seed);
    snprintf(w->msg, sizeof(w->msg), "%.*s", (int)nt.len, (const char *)nt.msg);
    snprintf(w->sender, sizeof(w->sender), "%s", nt.sender);
    w->got = 1;
    kvb_notifs_free(&nt, 1);
    return NULL;
}

static kvb_engine_h engine_named(const char *name, const char *secret)
{
    kvb_engine_params_t p = {0};
    kvb_engine_h e;
    p.field_mask = KVB_ENGINE_PARAM_TRANSPORT | KVB_ENGINE_PARAM_COPY_THREADS;
    p.transport = g_tr;
    p.copy_threads = 2;
    if (name != NULL) {
        p.field_mask |= KVB_ENGINE_PARAM_NAME;
        p.name = name;
    }
    if (secret != NULL) {
        p.field_mask |= KVB_ENGINE_PARAM_SECRET;
        p.secret = secret;
    }
    CHECK_EQ(kvb_engine_create(&p, &e), KVB_OK);
    return e;
}

/* LEN bytes in BLK blocks from src's buffer to dst's (a write, or, read,
 * the reader dst pulling from src), with a notification to the peer that
 * the watcher on the peer's side checks against the destination. */
static void test_transfer(bool read, unsigned seed)
{
    kvb_test_end_t src = kvb_test_end(engine_named("src-agent", NULL), LEN, 0, g_direct && read);
    kvb_test_end_t dst = kvb_test_end(engine_named("dst-agent", NULL), LEN, 0, g_direct && !read);
    for (size_t i = 0; i < LEN; i++)
        src.buf[i] = pattern(i, seed);
    /* the writer's peer is dst; the reader's is src */
    kvb_engine_h actor = read ? dst.eng : src.eng, peer = read ? src.eng : dst.eng;
    const char *peer_sid = kvb_engine_session_id(peer);
    size_t n = LEN / BLK;
    kvb_block_t *b = calloc(n, sizeof(*b));
    for (size_t i = 0; i < n; i++) /* every other block first, then the rest: no coalescing */
        b[i] =
            (kvb_block_t){(uint64_t)(uintptr_t)src.buf + ((i * 2) % n + (i * 2 >= n)) * BLK,
                          (uint64_t)(uintptr_t)dst.buf + ((i * 2) % n + (i * 2 >= n)) * BLK, BLK};
    watch_t w = {.eng = peer, .mem = dst.buf, .len = LEN, .seed = seed};
    pthread_t th;
    pthread_create(&th, NULL, watch_main, &w);
    const char *msg = read ? "req-read:1" : "req-write:2";
    kvb_write_params_t wp = {
        .field_mask = KVB_WRITE_PARAM_NOTIF, .notif = msg, .notif_len = strlen(msg)};
    if (g_direct && !read) /* a copy unit stalls inside the fence: the window an early
                              notification would fall into */
        KVB__HOOK_SET(direct_stall_ms, 300);
    double t0 = now_s();
    kvb_xfer_h x;
    CHECK_EQ(read ? kvb_engine_read_async_ex(actor, peer_sid, b, n, &wp, &x)
                  : kvb_engine_write_async_ex(actor, peer_sid, b, n, &wp, &x),
             KVB_OK);
    CHECK_EQ(kvb_xfer_wait(x, 30), KVB_OK);
    double t_done = now_s();
    CHECK_EQ(kvb_xfer_drained(x), 1);
    kvb_xfer_free(x);
    pthread_join(th, NULL);
    CHECK_EQ(w.got, 1);
    fprintf(stderr,
            "%s %s: %zu blocks, done after %.3f s, notification after %.3f s, %zu bytes "
            "missing then\n",
            g_mode, read ? "read" : "write", n, t_done - t0, w.at - t0, w.mismatched);
    CHECK_EQ(w.mismatched, 0);
    CHECK(strcmp(w.msg, msg) == 0);
    CHECK(strcmp(w.sender, read ? "dst-agent" : "src-agent") == 0);
    if (g_direct) {
        CHECK_EQ(kvb_engine_session_direct(actor, peer_sid), 1);
        if (!read)
            CHECK(w.at - t0 >= 0.3); /* it waited for the stalled unit */
    }
    /* exactly one notification */
    kvb_notif_t nt;
    CHECK_EQ(take_one(peer, &nt, 0.2), 0);
    free(b);
    kvb_test_end_free(&src);
    kvb_test_end_free(&dst);
    TEST_PASS(read ? "read: notification after the answers were placed"
                   : "write: notification after every byte was placed");
}

/* Standalone notifications: the default name (session id), order, empty
 * and maximal messages, the sender's length rules. */
static void test_alone(void)
{
    kvb_test_end_t a = kvb_test_end(engine_named(NULL, NULL), 4096, 0, false);
    kvb_test_end_t r = kvb_test_end(engine_named(NULL, NULL), 4096, 0, false);
    const char *sid = kvb_engine_session_id(r.eng);
    char m[32];
    for (int i = 0; i < 100; i++) {
        int len = snprintf(m, sizeof(m), "n%03d", i);
        CHECK_EQ(kvb_engine_notify(a.eng, sid, m, (size_t)len, 5), KVB_OK);
    }
    CHECK_EQ(kvb_engine_notify(a.eng, sid, NULL, 0, 5), KVB_OK);
    uint8_t *big = malloc(KVB_NOTIF_MAX_LEN + 1);
    for (size_t i = 0; i <= KVB_NOTIF_MAX_LEN; i++)
        big[i] = pattern(i, 7);
    CHECK_EQ(kvb_engine_notify(a.eng, sid, big, KVB_NOTIF_MAX_LEN, 5), KVB_OK);
    CHECK_EQ(kvb_engine_notify(a.eng, sid, big, KVB_NOTIF_MAX_LEN + 1, 5), KVB_ERR_INVALID);
    kvb_write_params_t wp = {
        .field_mask = KVB_WRITE_PARAM_NOTIF, .notif = big, .notif_len = KVB_NOTIF_MAX_LEN + 1};
    kvb_block_t b = {(uint64_t)(uintptr_t)a.buf, (uint64_t)(uintptr_t)r.buf, 16};
    kvb_xfer_h x;
    CHECK_EQ(kvb_engine_write_async_ex(a.eng, sid, &b, 1, &wp, &x), KVB_ERR_INVALID);
    CHECK_STR_CONTAINS(kvb_engine_last_error(a.eng), "notification of 65537 bytes");
    kvb_notif_t nt[128];
    size_t n = 0, got;
    double end = now_s() + 10;
    while (n < 102 && now_s() < end) {
        CHECK_EQ(kvb_engine_get_notifs(r.eng, nt + n, 128 - n, &got), KVB_OK);
        n += got;
        if (got == 0)
            usleep(500);
    }
    CHECK_EQ(n, 102);
    for (int i = 0; i < 100; i++) {
        int len = snprintf(m, sizeof(m), "n%03d", i);
        CHECK_EQ(nt[i].len, len);
        CHECK(memcmp(nt[i].msg, m, (size_t)len) == 0);
        CHECK(strcmp(nt[i].sender, kvb_engine_session_id(a.eng)) == 0);
    }
    CHECK_EQ(nt[100].len, 0);
    CHECK_EQ(nt[101].len, KVB_NOTIF_MAX_LEN);
    CHECK(memcmp(nt[101].msg, big, KVB_NOTIF_MAX_LEN) == 0);
    kvb_notifs_free(nt, n);
    CHECK(nt[0].sender == NULL);
    CHECK_EQ(kvb_engine_get_notifs(r.eng, nt, 128, &got), KVB_OK);
    CHECK_EQ(got, 0);
    CHECK_EQ(kvb_engine_get_notifs(r.eng, NULL, 1, &got), KVB_ERR_INVALID);
    /* a name over the limit, or empty, refuses the engine */
    char longname[KVB_NOTIF_NAME_MAX + 2];
    memset(longname, 'a', sizeof(longname) - 1);
    longname[sizeof(longname) - 1] = '\0';
    kvb_engine_params_t p = {.field_mask = KVB_ENGINE_PARAM_NAME, .name = longname};
    kvb_engine_h e;
    CHECK_EQ(kvb_engine_create(&p, &e), KVB_ERR_INVALID);
    p.name = "";
    CHECK_EQ(kvb_engine_create(&p, &e), KVB_ERR_INVALID);
    free(big);
    kvb_test_end_free(&a);
    kvb_test_end_free(&r);
    TEST_PASS("standalone notifications: order, names, lengths");
}

/* A transfer that fails sends no notification: a write past the peer's
 * registration is refused before anything moves; a write the target
 * refuses (fenced grant) ends KVB_ERR_FENCED without one. */
static void test_failed(void)
{
    kvb_test_end_t a = kvb_test_end(engine_named(NULL, NULL), 4096, 1, false);
    kvb_test_end_t r = kvb_test_end(engine_named(NULL, NULL), 4096, 0, g_direct);
    const char *sid = kvb_engine_session_id(r.eng);
    kvb_write_params_t wp = {.field_mask = KVB_WRITE_PARAM_NOTIF | KVB_WRITE_PARAM_EPOCH,
                             .notif = "x",
                             .notif_len = 1,
                             .epoch = 12345};
    kvb_block_t b = {(uint64_t)(uintptr_t)a.buf, (uint64_t)(uintptr_t)r.buf + 4000, 200};
    kvb_xfer_h x;
    CHECK_EQ(kvb_engine_write_async_ex(a.eng, sid, &b, 1, &wp, &x), KVB_ERR_BOUNDS);
    if (g_tr != KVB_TRANSPORT_SHM) { /* the put lane is not fenced by the target */
        kvb_engine_set_writer_tag(a.eng, 77);
        b.dst = (uint64_t)(uintptr_t)r.buf;
        CHECK_EQ(kvb_engine_write_async_ex(a.eng, sid, &b, 1, &wp, &x), KVB_OK);
        CHECK_EQ(kvb_xfer_wait(x, 10), KVB_ERR_FENCED);
        kvb_xfer_free(x);
        CHECK(kvb_test_all(r.buf, 4096, 0));
    }
    kvb_notif_t nt;
    CHECK_EQ(take_one(r.eng, &nt, 0.3), 0);
    kvb_test_end_free(&a);
    kvb_test_end_free(&r);
    TEST_PASS("a failed transfer sends no notification");
}

/* The receiver's cap: past KVBRIDGE_NOTIF_QUEUE_MAX notifications are
 * dropped and counted; once taken, new ones are queued again. */
static void test_caps(void)
{
    setenv("KVBRIDGE_NOTIF_QUEUE_MAX", "4", 1);
    kvb_engine_h r = engine_named(NULL, NULL);
    unsetenv("KVBRIDGE_NOTIF_QUEUE_MAX");
    kvb_engine_h a = engine_named("capper", NULL);
    const char *sid = kvb_engine_session_id(r);
    for (int i = 0; i < 10; i++)
        CHECK_EQ(kvb_engine_notify(a, sid, "0123456789", 10, 5), KVB_OK);
    kvb_engine_limits_t l = {.field_mask = KVB_ENGINE_LIMITS_NOTIFS};
    double end = now_s() + 5;
    do {
        kvb_engine_limits(r, &l);
    } while (l.notifs_queued + l.notifs_dropped < 10 && now_s() < end && usleep(500) == 0);
    CHECK_EQ(l.notifs_queued, 4);
    CHECK_EQ(l.notifs_queued_bytes, 4 * (6 + 10));
    CHECK_EQ(l.notifs_dropped, 6);
    kvb_notif_t nt[8];
    size_t got;
    CHECK_EQ(kvb_engine_get_notifs(r, nt, 8, &got), KVB_OK);
    CHECK_EQ(got, 4);
    kvb_notifs_free(nt, got);
    CHECK_EQ(kvb_engine_notify(a, sid, "again", 5, 5), KVB_OK);
    CHECK_EQ(take_one(r, nt, 5), 1);
    CHECK(nt[0].len == 5 && memcmp(nt[0].msg, "again", 5) == 0);
    kvb_notifs_free(nt, 1);
    kvb_engine_destroy(a);
    kvb_engine_destroy(r);
    TEST_PASS("receiver queue capped: dropped and counted, then serving again");
}

/* Malformed notifications (test hook: short data, too long a message, a
 * bad magic, a NUL in the name) are refused and counted, nothing queued;
 * the next good one arrives. */
static void test_malformed(void)
{
    kvb_engine_h r = engine_named(NULL, NULL), a = engine_named("bad-sender", NULL);
    const char *sid = kvb_engine_session_id(r);
    kvb_engine_limits_t l = {.field_mask = KVB_ENGINE_LIMITS_NOTIFS};
    for (int f = 1; f <= 4; f++) {
        KVB__HOOK_SET(notif_wire_fault, f);
        CHECK_EQ(kvb_engine_notify(a, sid, "bad", 3, 5), KVB_OK); /* sent: the receiver refuses */
        double end = now_s() + 5;
        do {
            kvb_engine_limits(r, &l);
        } while (l.notifs_refused < (uint64_t)f && now_s() < end && usleep(500) == 0);
        CHECK_EQ(l.notifs_refused, f);
    }
    KVB__HOOK_SET(notif_wire_fault, 0);
    kvb_notif_t nt;
    CHECK_EQ(kvb_engine_notify(a, sid, "good", 4, 5), KVB_OK);
    CHECK_EQ(take_one(r, &nt, 5), 1);
    CHECK(nt.len == 4 && memcmp(nt.msg, "good", 4) == 0 && strcmp(nt.sender, "bad-sender") == 0);
    kvb_notifs_free(&nt, 1);
    kvb_engine_limits(r, &l);
    CHECK_EQ(l.notifs_queued, 0);
    CHECK_EQ(l.notifs_dropped, 0);
    kvb_engine_destroy(a);
    kvb_engine_destroy(r);
    TEST_PASS("malformed notifications refused and counted");
}

/* Engine secret: a notification carries the connection's token and is
 * heard (a missing token is one of the malformed cases' kin: refused). */
static void test_secret(void)
{
    kvb_engine_h r = engine_named(NULL, "s3cret"), a = engine_named("authed", "s3cret");
    const char *sid = kvb_engine_session_id(r);
    kvb_notif_t nt;
    CHECK_EQ(kvb_engine_notify(a, sid, "hi", 2, 5), KVB_OK);
    CHECK_EQ(take_one(r, &nt, 5), 1);
    CHECK(nt.len == 2 && strcmp(nt.sender, "authed") == 0);
    kvb_notifs_free(&nt, 1);
    kvb_engine_destroy(a);
    kvb_engine_destroy(r);
    TEST_PASS("notification under the engine secret");
}

/* The sender destroyed while transfers with notifications run or send
 * them: each handle ends (done, or cancelled with its reason) and is freed;
 * a sanitizer build sees no use of freed memory (the engine's sessions go
 * before the notification sends still listed are released). */
static void test_destroy_midway(void)
{
    kvb_test_end_t r = kvb_test_end(engine_named(NULL, NULL), 4 * MiB, 0, g_direct);
    const char *sid = kvb_engine_session_id(r.eng);
    int ended_ok = 0, cancelled = 0;
    for (int i = 0; i < 20; i++) {
        kvb_test_end_t a = kvb_test_end(engine_named(NULL, NULL), 4 * MiB, 1, false);
        kvb_block_t b = {(uint64_t)(uintptr_t)a.buf, (uint64_t)(uintptr_t)r.buf, 4 * MiB};
        kvb_write_params_t wp = {
            .field_mask = KVB_WRITE_PARAM_NOTIF, .notif = "bye", .notif_len = 3};
        kvb_xfer_h x[4];
        for (int k = 0; k < 4; k++)
            CHECK_EQ(kvb_engine_write_async_ex(a.eng, sid, &b, 1, &wp, &x[k]), KVB_OK);
        usleep((useconds_t)(i * 150));
        kvb_engine_destroy(a.eng);
        for (int k = 0; k < 4; k++) {
            kvb_status_t st = kvb_xfer_test(x[k]);
            CHECK(st == KVB_OK || st == KVB_ERR_CANCELED || st == KVB_ERR_PEER);
            ended_ok += st == KVB_OK;
            cancelled += st != KVB_OK;
            if (st != KVB_OK)
                CHECK(kvb_xfer_error(x[k])[0] != '\0');
            kvb_xfer_free(x[k]);
        }
        free(a.buf);
    }
    kvb_notif_t nt[128];
    size_t n = 0;
    usleep(100000);
    CHECK_EQ(kvb_engine_get_notifs(r.eng, nt, 128, &n), KVB_OK);
    fprintf(stderr,
            "%s: senders destroyed midway: %d transfers done, %d ended otherwise, %zu "
            "notifications arrived\n",
            g_mode, ended_ok, cancelled, n);
    CHECK(n <= 80); /* one per transfer at most (a cancelled one's may have left already) */
    kvb_notifs_free(nt, n);
    kvb_test_end_free(&r);
    TEST_PASS("sender destroyed midway: every handle ends");
}

int main(int argc, char **argv)
{
    signal(SIGPIPE, SIG_IGN);
    g_mode = argc > 1 ? argv[1] : "direct";
    g_direct = strcmp(g_mode, "direct") == 0;
    g_tr = strcmp(g_mode, "tcp") == 0   ? KVB_TRANSPORT_TCP
           : strcmp(g_mode, "shm") == 0 ? KVB_TRANSPORT_SHM
                                        : KVB_TRANSPORT_AUTO;
    test_transfer(false, 1);
    test_transfer(true, 2);
    test_alone();
    test_failed();
    test_caps();
    test_malformed();
    if (g_tr != KVB_TRANSPORT_SHM)
        test_secret();
    /* Not over TCP: destroying a writer engine whose endpoints are still
     * being wired up trips UCX 1.13's assertion "ucp_request.c:684 ... got
     * REP message" there, with or without notifications (kvbridge's destroy
     * path, not this feature). On the put lane (shm) a sanitizer build runs
     * it (the notification sends ended inside ucp_worker_destroy); the plain
     * build skips it there: about 1 run in 3 segfaults in
     * ucp_worker_destroy purging pending puts (ucp_mem_rereg_mds), with or
     * without notifications. */
    if (g_direct || (g_tr == KVB_TRANSPORT_SHM && getenv("KVB_TEST_DESTROY_MIDWAY") != NULL))
        test_destroy_midway();
    fprintf(stderr, "ok: notifications on lane %s\n", g_mode);
    return 0;
}
