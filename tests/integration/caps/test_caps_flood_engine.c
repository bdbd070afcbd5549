/* Floods of an engine (review 2.4), each against a small cap set through its
 * environment knob; the cap holds, kvb_engine_limits counts it, and a good
 * writer's write still lands during or right after the flood:
 *   - control connections: handshakes from 127.0.0.2 held open
 *     (KVBRIDGE_MAX_CONTROL_CONNS); the genuine writer on 127.0.0.1 keeps
 *     its connection; a peer that sends bytes is closed;
 *   - the same from 127.0.0.1 (the genuine writer's own address) while its
 *     256 MiB write is in flight: the write ends KVB_OK, newcomers past the
 *     cap are refused, and a new writer connects once the flood closes;
 *   - sessions to many peers (KVBRIDGE_MAX_SESSIONS): idle ones are freed;
 *   - a peer file far larger than the segments advertised in it is not
 *     mapped (KVBRIDGE_DIRECT_MAP_SLACK), and one past the prefault budget
 *     (KVBRIDGE_DIRECT_POPULATE_MAX) is mapped without MAP_POPULATE: the
 *     writer's shared-memory RSS does not grow by the file's size. */
#include <arpa/inet.h>
#include <kvbridge/engine.h>
#include <netinet/in.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "engine/handshake.h"
#include "kvb_test.h"
#include "kvb_test_raw_hs.h"

#define MiB (1u << 20)
#define CONN_CAP 16
#define CONN_FLOOD 60
#define SESS_CAP 4
#define SESS_FLOOD 40
#define BIG (64u * MiB)
#define EVICT_CAP 4
#define EVICT_FLOOD 6
#define EVICT_BIG (256u * MiB)

static uint8_t g_src[1 << 16];

static bool kvb_test_all_v(const uint8_t *p, size_t n, uint8_t v)
{
    for (size_t i = 0; i < n; i++)
        if (p[i] != v)
            return false;
    return true;
}

static kvb_engine_limits_t limits(kvb_engine_h e)
{
    kvb_engine_limits_t l = {.field_mask = KVB_ENGINE_LIMITS_CONTROL | KVB_ENGINE_LIMITS_SESSIONS |
                                           KVB_ENGINE_LIMITS_DIRECT};
    kvb_engine_limits(e, &l);
    return l;
}

static kvb_engine_h make_engine(void)
{
    kvb_engine_h e;
    CHECK_EQ(kvb_engine_create(NULL, &e), KVB_OK);
    return e;
}

/* One write of len bytes of pattern seed into dst; KVB_OK and the bytes
 * there, or the status. */
static kvb_status_t write_check(kvb_engine_h w, kvb_engine_h t, uint8_t *dst, size_t len, int seed)
{
    for (size_t i = 0; i < len; i++)
        g_src[i] = (uint8_t)(i * 31 + (size_t)seed);
    kvb_block_t b = {(uint64_t)(uintptr_t)g_src, (uint64_t)(uintptr_t)dst, len};
    kvb_status_t st = kvb_engine_write(w, kvb_engine_session_id(t), &b, 1, 10);
    if (st == KVB_OK)
        CHECK(memcmp(dst, g_src, len) == 0);
    return st;
}

static int raw_handshake(uint16_t port)
{
    int fd = kvb_test_raw_handshake(port, true);
    CHECK(fd >= 0);
    return fd;
}

static uint16_t port_of(kvb_engine_h e)
{
    const char *sid = kvb_engine_session_id(e);
    return (uint16_t)atoi(strrchr(sid, ':') + 1);
}

static void test_control_conns(void)
{
    kvb_engine_h t = make_engine(), w = make_engine();
    uint8_t *dst = calloc(1, 1 << 16);
    int fds[CONN_FLOOD];
    CHECK_EQ(kvb_engine_register(t, dst, 1 << 16, KVB_MEM_HOST), KVB_OK);
    CHECK_EQ(kvb_engine_register(w, g_src, sizeof(g_src), KVB_MEM_HOST), KVB_OK);
    CHECK_EQ(write_check(w, t, dst, 4096, 1), KVB_OK); /* the genuine writer, first */
    for (int i = 0; i < CONN_FLOOD; i++)
        fds[i] = raw_handshake(port_of(t));
    double end = kvb_test_now_s() + 5;
    kvb_engine_limits_t l = limits(t);
    while (l.control_conns + l.control_conns_evicted < CONN_FLOOD + 1 && kvb_test_now_s() < end) {
        usleep(2000);
        l = limits(t);
    }
    CHECK_EQ(l.control_conns, CONN_CAP);
    CHECK_EQ(l.control_conns_evicted, CONN_FLOOD + 1 - CONN_CAP);
    /* The genuine writer kept its connection: same session, write lands. */
    CHECK_EQ(write_check(w, t, dst, 4096, 2), KVB_OK);
    CHECK_EQ(limits(w).sessions, 1);
    /* A peer that sends bytes is closed (it no longer spins the listener). */
    int last = fds[CONN_FLOOD - 1];
    CHECK_EQ(write(last, "xyz", 3), 3);
    end = kvb_test_now_s() + 5;
    while (limits(t).control_conns_misbehaved == 0 && kvb_test_now_s() < end)
        usleep(2000);
    CHECK_EQ(limits(t).control_conns_misbehaved, 1);
    char b;
    CHECK_EQ(read(last, &b, 1), 0); /* closed by the listener */
    for (int i = 0; i < CONN_FLOOD; i++)
        close(fds[i]);
    kvb_engine_destroy(w);
    kvb_engine_destroy(t);
    free(dst);
    TEST_PASS("control connections capped; genuine writer kept; byte-sender closed");
}

/* Review 2, finding 4: handshakes from the genuine writer's own address
 * (127.0.0.1) while its large write is in flight, with a cap of 4. The old
 * policy closed the oldest connection of the busiest address, the writer's,
 * and its write failed "peer closed its control connection". Now a
 * connection that wrote (or, without a secret, any that existed when a
 * write came) is never closed for a newcomer: the write ends KVB_OK, every
 * byte right; newcomers past the cap are refused. A new genuine writer is
 * refused too while the cap is held by connections that may have written
 * (no secret: nothing tells a flooder from a writer), and connects once
 * they close. */
static void test_control_in_flight(void)
{
    char v[32];
    snprintf(v, sizeof(v), "%d", EVICT_CAP);
    setenv("KVBRIDGE_MAX_CONTROL_CONNS", v, 1);
    kvb_engine_h t = make_engine(), w = make_engine(), w2 = make_engine();
    snprintf(v, sizeof(v), "%d", CONN_CAP);
    setenv("KVBRIDGE_MAX_CONTROL_CONNS", v, 1);
    uint8_t *src = malloc(EVICT_BIG), *dst = calloc(1, EVICT_BIG);
    int fds[EVICT_FLOOD];
    CHECK(src != NULL && dst != NULL);
    for (size_t i = 0; i < EVICT_BIG; i++)
        src[i] = (uint8_t)(i * 131 + 7 + (i >> 20));
    CHECK_EQ(kvb_engine_register(t, dst, EVICT_BIG, KVB_MEM_HOST), KVB_OK);
    CHECK_EQ(kvb_engine_register(w, src, EVICT_BIG, KVB_MEM_HOST), KVB_OK);
    CHECK_EQ(kvb_engine_register(w2, g_src, sizeof(g_src), KVB_MEM_HOST), KVB_OK);
    const char *sid = kvb_engine_session_id(t);
    /* warm-up (the last 4 KiB; dst[0] stays 0 until the big write lands) */
    kvb_block_t warm = {(uint64_t)(uintptr_t)(src + EVICT_BIG - 4096),
                        (uint64_t)(uintptr_t)(dst + EVICT_BIG - 4096), 4096};
    CHECK_EQ(kvb_engine_write(w, sid, &warm, 1, 10), KVB_OK);

    kvb_block_t big = {(uint64_t)(uintptr_t)src, (uint64_t)(uintptr_t)dst, EVICT_BIG};
    kvb_xfer_h x;
    double t0 = kvb_test_now_s();
    CHECK_EQ(kvb_engine_write_async(w, sid, &big, 1, &x), KVB_OK);
    while (__atomic_load_n(&dst[0], __ATOMIC_ACQUIRE) != src[0] && kvb_test_now_s() < t0 + 10)
        ;
    double t_first = kvb_test_now_s();
    CHECK_EQ(dst[0], src[0]);
    int accepted = 0, refused = 0;
    for (int i = 0; i < EVICT_FLOOD; i++) {
        fds[i] = kvb_test_raw_handshake(port_of(t), false);
        fds[i] >= 0 ? accepted++ : refused++;
    }
    double t_flood = kvb_test_now_s();
    kvb_status_t during = kvb_xfer_test(x);
    kvb_status_t st = kvb_xfer_wait(x, 60);
    double t_done = kvb_test_now_s();
    kvb_engine_limits_t l = limits(t);
    fprintf(stderr,
            "in-flight flood: %u MiB write; first byte in T at +%.1f ms, %d handshakes from "
            "127.0.0.1 done at +%.1f ms (%d answered, %d refused), write %s then, ended %s at "
            "+%.1f ms (%s); T holds %llu, evicted %llu, refused %llu\n",
            EVICT_BIG / MiB, (t_first - t0) * 1e3, EVICT_FLOOD, (t_flood - t0) * 1e3, accepted,
            refused, during == KVB_ERR_INPROGRESS ? "still in flight" : "already over",
            kvb_status_string(st), (t_done - t0) * 1e3, st == KVB_OK ? "ok" : kvb_xfer_error(x),
            (unsigned long long)l.control_conns, (unsigned long long)l.control_conns_evicted,
            (unsigned long long)l.handshakes_refused);
    CHECK_EQ(during, KVB_ERR_INPROGRESS); /* the flood happened while it was in flight */
    CHECK_EQ(st, KVB_OK);
    CHECK(memcmp(dst, src, EVICT_BIG) == 0);
    kvb_xfer_free(x);
    CHECK(l.control_conns <= EVICT_CAP);
    CHECK(refused >= EVICT_FLOOD + 1 - EVICT_CAP - (int)l.control_conns_evicted);
    /* The genuine writer kept its connection. */
    CHECK_EQ(kvb_engine_write(w, sid, &warm, 1, 10), KVB_OK);
    CHECK_EQ(limits(w).sessions, 1);

    /* A new writer while the cap is held by connections that existed when
     * writes came: refused at the handshake, with a reason, nothing evicted. */
    uint64_t evicted = limits(t).control_conns_evicted, ref0 = limits(t).handshakes_refused;
    kvb_block_t b2 = {(uint64_t)(uintptr_t)g_src, (uint64_t)(uintptr_t)dst, 4096};
    memset(g_src, 0x3c, 4096);
    st = kvb_engine_write(w2, sid, &b2, 1, 5);
    fprintf(stderr, "new writer at the cap: %s (%s)\n", kvb_status_string(st),
            kvb_engine_last_error(w2));
    CHECK(st != KVB_OK);
    CHECK_EQ(limits(t).control_conns_evicted, evicted);
    CHECK(limits(t).handshakes_refused > ref0);
    CHECK_EQ(kvb_engine_write(w, sid, &warm, 1, 10), KVB_OK);
    /* The flood connections close: the new writer connects. */
    for (int i = 0; i < EVICT_FLOOD; i++)
        if (fds[i] >= 0)
            close(fds[i]);
    double end = kvb_test_now_s() + 5;
    while (limits(t).control_conns > 1 && kvb_test_now_s() < end)
        usleep(2000);
    CHECK_EQ(limits(t).control_conns, 1);
    CHECK_EQ(kvb_engine_write(w2, sid, &b2, 1, 10), KVB_OK);
    CHECK(kvb_test_all_v(dst, 4096, 0x3c));
    CHECK_EQ(kvb_engine_write(w, sid, &warm, 1, 10), KVB_OK);
    kvb_engine_destroy(w2);
    kvb_engine_destroy(w);
    kvb_engine_destroy(t);
    free(src);
    free(dst);
    TEST_PASS("flood from the writer's own address during its write: write kept, newcomers "
              "refused until the flood closes");
}

static void test_sessions(void)
{
    kvb_engine_h t = make_engine(), w = make_engine();
    uint8_t *dst = calloc(1, 1 << 16);
    char sid[64];
    CHECK_EQ(kvb_engine_register(t, dst, 1 << 16, KVB_MEM_HOST), KVB_OK);
    CHECK_EQ(kvb_engine_register(w, g_src, sizeof(g_src), KVB_MEM_HOST), KVB_OK);
    kvb_block_t b = {(uint64_t)(uintptr_t)g_src, 4096, 64};
    for (int i = 0; i < SESS_FLOOD; i++) { /* nobody listens there: refused at once */
        snprintf(sid, sizeof(sid), "127.0.0.1:%d", 1 + i);
        CHECK(kvb_engine_write(w, sid, &b, 1, 5) != KVB_OK);
        CHECK(limits(w).sessions <= SESS_CAP);
    }
    kvb_engine_limits_t l = limits(w);
    CHECK_EQ(l.sessions, SESS_CAP);
    CHECK_EQ(l.sessions_evicted, SESS_FLOOD - SESS_CAP);
    CHECK_EQ(write_check(w, t, dst, 4096, 3), KVB_OK);
    CHECK_EQ(limits(w).sessions, SESS_CAP);
    /* Live peers past the cap: idle sessions with a connection are freed
     * (their connection retired), and a write to one of them again
     * re-handshakes and lands. */
    kvb_engine_h more[SESS_CAP + 1];
    uint8_t *mdst[SESS_CAP + 1];
    for (int i = 0; i <= SESS_CAP; i++) {
        more[i] = make_engine();
        mdst[i] = calloc(1, 1 << 16);
        CHECK_EQ(kvb_engine_register(more[i], mdst[i], 1 << 16, KVB_MEM_HOST), KVB_OK);
        CHECK_EQ(write_check(w, more[i], mdst[i], 4096, 10 + i), KVB_OK);
        CHECK(limits(w).sessions <= SESS_CAP);
    }
    CHECK_EQ(write_check(w, t, dst, 4096, 4), KVB_OK); /* t was evicted: new handshake */
    CHECK_EQ(write_check(w, more[0], mdst[0], 4096, 5), KVB_OK);
    CHECK_EQ(limits(w).sessions, SESS_CAP);
    kvb_engine_destroy(w);
    kvb_engine_destroy(t);
    for (int i = 0; i <= SESS_CAP; i++) {
        kvb_engine_destroy(more[i]);
        free(mdst[i]);
    }
    free(dst);
    TEST_PASS("sessions capped (idle ones evicted); a good write lands");
}

static uint64_t rss_shmem_kib(void)
{
    char line[256];
    uint64_t v = 0;
    FILE *f = fopen("/proc/self/status", "r");
    while (f != NULL && fgets(line, sizeof(line), f) != NULL)
        if (sscanf(line, "RssShmem: %lu kB", &v) == 1)
            break;
    if (f != NULL)
        fclose(f);
    return v;
}

static void test_direct_file(void)
{
    kvb_engine_h t = make_engine(), w = make_engine();
    void *part, *whole;
    CHECK_EQ(kvb_engine_register(w, g_src, sizeof(g_src), KVB_MEM_HOST), KVB_OK);
    /* A file of 64 MiB of which 1 MiB is advertised: not mapped. */
    CHECK_EQ(kvb_mem_alloc(BIG, &part), KVB_OK);
    CHECK_EQ(kvb_engine_register(t, part, MiB, KVB_MEM_HOST), KVB_OK);
    CHECK_EQ(write_check(w, t, part, 4096, 4), KVB_OK);
    CHECK_EQ(limits(w).direct_files_refused, 1);
    CHECK_EQ(kvb_engine_session_direct(w, kvb_engine_session_id(t)), 0);
    CHECK_EQ(kvb_engine_unregister(t, part), KVB_OK);
    /* All of it advertised, past the prefault budget: mapped, not populated. */
    CHECK_EQ(kvb_mem_alloc(BIG, &whole), KVB_OK);
    uint64_t before = rss_shmem_kib();
    CHECK_EQ(kvb_engine_register(t, whole, BIG, KVB_MEM_HOST), KVB_OK);
    CHECK_EQ(write_check(w, t, (uint8_t *)whole + BIG / 2, 4096, 5), KVB_OK);
    CHECK_EQ(kvb_engine_session_direct(w, kvb_engine_session_id(t)), 1);
    uint64_t grew = rss_shmem_kib() - before;
    fprintf(stderr, "RssShmem grew by %llu KiB\n", (unsigned long long)grew);
    CHECK(grew < BIG / 1024 / 4);
    CHECK(limits(w).direct_files_unpopulated >= 1);
    kvb_engine_destroy(w);
    kvb_engine_destroy(t);
    CHECK_EQ(kvb_mem_free(part), KVB_OK);
    CHECK_EQ(kvb_mem_free(whole), KVB_OK);
    TEST_PASS("peer file capped against its segments; no prefault past the budget");
}

/* argv[1] "control", "inflight", "sessions" or "direct": that part only. */
int main(int argc, char **argv)
{
    const char *only = argc > 1 ? argv[1] : NULL;
    char v[32];
    snprintf(v, sizeof(v), "%d", CONN_CAP);
    setenv("KVBRIDGE_MAX_CONTROL_CONNS", v, 1);
    snprintf(v, sizeof(v), "%d", SESS_CAP);
    setenv("KVBRIDGE_MAX_SESSIONS", v, 1);
    setenv("KVBRIDGE_DIRECT_MAP_SLACK", "0", 1);
    snprintf(v, sizeof(v), "%u", 16 * MiB);
    setenv("KVBRIDGE_DIRECT_POPULATE_MAX", v, 1);
    if (only == NULL || strcmp(only, "control") == 0)
        test_control_conns();
    if (only == NULL || strcmp(only, "inflight") == 0)
        test_control_in_flight();
    if (only == NULL || strcmp(only, "sessions") == 0)
        test_sessions();
    if (only == NULL || strcmp(only, "direct") == 0)
        test_direct_file();
    return 0;
}
