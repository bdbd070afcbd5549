/* Connector failure tests (issue 5 §3): a prefill rank killed mid-transfer, a
 * decode rank killed (others unaffected, a restarted one served), bootstrap
 * and waiting time-outs, aborts on either side with the write fence checked
 * on the destination pages, and malformed frames of every kind from a raw
 * ZeroMQ peer. Child processes are this executable run with --child. */
#include "harness/kvb_cluster.h"
#include "kvb_test.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <unistd.h>
#include <zmq.h>

#define G_SMALL KVBH_CHILD_GEOM /* the children's ranks (shared memfd layout) */
static const kvbh_geom_t G_BIG = {2, 2, 2048, 4, 1024, 0, 0};

#define FAIL_FROM_PREFILL "Failed to get kvcache from prefill instance, it might be dead"

/* ---- 1. prefill rank killed mid-transfer ---- */

static void test_prefill_killed(void)
{
    const double interval = 0.2;
    const int misses = 2;
    kvbh_knobs_t k = {.hb_interval = interval, .hb_misses = misses};
    kvbh_child_t ch;
    kvbh_rank_t d;
    char line[512], boot[128], expect[256], why[512];
    kvb_receiver_h rc[4];
    CHECK_EQ(kvbh_spawn_prefill(&ch, boot, sizeof(boot)), 0);
    CHECK_EQ(kvbh_rank_start(&d, &G_SMALL, KVB_MODE_DECODE, NULL, KVBH_MEM_MALLOC, &k), 0);
    for (int j = 0; j < 4; j++) {
        int32_t dst[8];
        for (int i = 0; i < 8; i++)
            dst[i] = kvbh_dst_page(&G_SMALL, 100 + (uint64_t)j, i);
        CHECK_EQ(kvb_receiver_create(d.mgr, boot, 100 + (uint64_t)j, -1, &rc[j]), KVB_OK);
        kvb_receiver_init(rc[j], dst, 8, j, NULL);
    }
    dprintf(ch.to, "rooms 100 4 8\n");
    CHECK_EQ(kvbh_child_line(&ch, line, sizeof(line), 20), 0);
    CHECK(strcmp(line, "sent") == 0);
    kvbh_sleep(0.1); /* the first chunks land; no room is terminal */
    for (int j = 0; j < 4; j++)
        CHECK_EQ(kvb_receiver_poll(rc[j]), KVB_POLL_WAITING_FOR_INPUT);
    double t0 = kvbh_now(), t_last = 0;
    kvbh_child_kill(&ch);
    int other, left = kvbh_wait_receivers_fail(rc, 4, t0, 10, &other, &t_last);
    CHECK_EQ(other, 0); /* every ended room Failed */
    CHECK_EQ(left, 0);
    snprintf(expect, sizeof(expect), "Losing connection with prefill instance (bootstrap_addr: %s)",
             boot);
    for (int j = 0; j < 4; j++) {
        kvb_receiver_failure(rc[j], why, sizeof(why));
        CHECK(strcmp(why, expect) == 0);
        kvb_receiver_destroy(rc[j]);
    }
    fprintf(stderr, "prefill killed: rooms Failed %.3f s after SIGKILL (bound %.3f s)\n", t_last,
            interval * misses + 1.0);
    CHECK(t_last <= interval * misses + 1.0);
    /* The decode rank still serves another prefill instance. */
    kvbh_boot_t b2;
    kvbh_rank_t p2;
    CHECK_EQ(kvbh_boot_start(&b2, 0, NULL), 0);
    CHECK_EQ(kvbh_rank_start(&p2, &G_SMALL, KVB_MODE_PREFILL, b2.addr, KVBH_MEM_MALLOC, NULL), 0);
    CHECK_EQ(kvbh_run_room(&p2, &d, b2.addr, 110, 9, 3, 40, 2), 0);
    CHECK(kvbh_canaries_ok(&d, "decode"));
    kvbh_rank_stop(&p2);
    kvbh_boot_stop(&b2);
    kvbh_rank_stop(&d);
    TEST_PASS("prefill rank killed mid-transfer");
}

/* ---- 2. decode rank killed ---- */

static void test_decode_killed(void)
{
    kvbh_boot_t b;
    CHECK_EQ(kvbh_boot_start(&b, 0, NULL), 0);
    const char *boot = b.addr;
    kvbh_rank_t p, a;
    kvbh_child_t dead, again;
    kvb_sender_h snd[4];
    char line[512], why[512];
    int memfd = memfd_create("kvb-fault-decode", 0);
    size_t len = kvbh_arena_len(&G_SMALL, NULL);
    CHECK(memfd >= 0 && ftruncate(memfd, (off_t)len) == 0);
    CHECK_EQ(kvbh_rank_start(&p, &G_SMALL, KVB_MODE_PREFILL, boot, KVBH_MEM_MALLOC, NULL), 0);
    CHECK_EQ(kvbh_rank_start(&a, &G_SMALL, KVB_MODE_DECODE, NULL, KVBH_MEM_MALLOC, NULL), 0);
    CHECK_EQ(kvbh_spawn_decode(&dead, boot, memfd, 200, 4, 8), 0);
    for (int j = 0; j < 4; j++) {
        uint64_t room = 200 + (uint64_t)j;
        int32_t src[8];
        for (int i = 0; i < 8; i++)
            src[i] = kvbh_src_page(&G_SMALL, room, i);
        kvbh_fill(&p, room, src, 8, (int)(room % KVBH_AUX_ITEMS));
        CHECK_EQ(kvb_sender_create(p.mgr, boot, room, &snd[j]), KVB_OK);
        CHECK_EQ(kvbh_wait_sender_ready(snd[j], 10), 0);
        kvb_sender_init(snd[j], 8, (int64_t)(room % KVBH_AUX_ITEMS));
        if (j < 2) /* rooms 200, 201: first half written before the kill */
            CHECK_EQ(kvb_sender_send(snd[j], src, 4), KVB_OK);
    }
    kvbh_sleep(0.2);
    double t0 = kvbh_now();
    kvbh_child_kill(&dead);
    for (int j = 0; j < 4; j++) {
        uint64_t room = 200 + (uint64_t)j;
        int32_t src[8];
        for (int i = 0; i < 8; i++)
            src[i] = kvbh_src_page(&G_SMALL, room, i);
        if (j < 2)
            kvb_sender_send(snd[j], src + 4, 4);
        else
            kvb_sender_send(snd[j], src, 8);
    }
    double t_last = 0;
    for (int j = 0; j < 4; j++) {
        kvb_poll_t st = kvbh_wait_sender(snd[j], 30);
        t_last = kvbh_now() - t0;
        kvb_sender_failure(snd[j], why, sizeof(why));
        fprintf(stderr, "room %d to the killed decode: %s: %s\n", 200 + j, kvb_poll_string(st),
                why);
        CHECK_EQ(st, KVB_POLL_FAILED);
        CHECK(why[0] != '\0' && strstr(why, "unknown reason") == NULL);
        kvb_sender_destroy(snd[j]);
    }
    fprintf(stderr, "decode killed: its rooms Failed on the prefill within %.3f s\n", t_last);
    /* Another decode rank of the same prefill is unaffected. */
    for (int j = 0; j < 3; j++)
        CHECK_EQ(kvbh_run_room(&p, &a, boot, 300 + (uint64_t)j, 8, 100 + 10 * j, 20 + 10 * j, j),
                 0);
    kvb_manager_stats_t st;
    kvb_manager_stats(p.mgr, &st);
    CHECK(st.transfers_failed >= 1);
    /* A restarted decode (new process, new session) is served. */
    CHECK_EQ(kvbh_spawn_decode(&again, boot, memfd, 400, 4, 8), 0);
    for (int j = 0; j < 4; j++) {
        uint64_t room = 400 + (uint64_t)j;
        int32_t src[8];
        for (int i = 0; i < 8; i++)
            src[i] = kvbh_src_page(&G_SMALL, room, i);
        kvbh_fill(&p, room, src, 8, (int)(room % KVBH_AUX_ITEMS));
        CHECK_EQ(kvb_sender_create(p.mgr, boot, room, &snd[j]), KVB_OK);
        CHECK_EQ(kvbh_wait_sender_ready(snd[j], 10), 0);
        kvb_sender_init(snd[j], 8, (int64_t)(room % KVBH_AUX_ITEMS));
        kvb_sender_send(snd[j], src, 3);
        kvb_sender_send(snd[j], src + 3, 5);
    }
    for (int j = 0; j < 4; j++) {
        CHECK_EQ(kvbh_wait_sender(snd[j], 20), KVB_POLL_SUCCESS);
        kvb_sender_destroy(snd[j]);
    }
    int ok = 0;
    for (int j = 0; j < 5; j++) {
        unsigned long long room;
        int s;
        CHECK_EQ(kvbh_child_line(&again, line, sizeof(line), 20), 0);
        if (strcmp(line, "done") == 0)
            break;
        CHECK_EQ(sscanf(line, "room %llu %d", &room, &s), 2);
        if (s != KVB_POLL_SUCCESS)
            fprintf(stderr, "restarted decode: %s\n", line);
        CHECK_EQ(s, KVB_POLL_SUCCESS);
        ok++;
    }
    CHECK_EQ(ok, 4);
    kvbh_rank_t view;
    uint8_t *arena = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0);
    CHECK(arena != MAP_FAILED);
    kvbh_layout(&view, &G_SMALL, NULL, arena, 0);
    for (int j = 0; j < 4; j++) {
        uint64_t room = 400 + (uint64_t)j;
        int32_t dst[8];
        for (int i = 0; i < 8; i++)
            dst[i] = kvbh_dst_page(&G_SMALL, room, i);
        CHECK_EQ(kvbh_verify(&view, room, dst, 8, (int)(room % KVBH_AUX_ITEMS)), 0);
    }
    CHECK(kvbh_canaries_ok(&view, "restarted decode"));
    munmap(arena, len);
    kvbh_child_close(&again);
    CHECK(kvbh_canaries_ok(&a, "decode A"));
    kvbh_rank_stop(&a);
    kvbh_rank_stop(&p);
    kvbh_boot_stop(&b);
    close(memfd);
    TEST_PASS("decode rank killed; others unaffected; restarted decode served");
}

/* ---- 3. time-outs ---- */

static void check_timeout_reason(const char *why, uint64_t room, const char *state, double lo,
                                 double hi)
{
    unsigned long long r;
    double x;
    char tail[64];
    CHECK_EQ(sscanf(why, "Request %llu timed out after %lfs in %63s", &r, &x, tail), 3);
    CHECK_EQ(r, room);
    CHECK(strcmp(tail, state) == 0);
    CHECK(x >= lo - 0.05 && x <= hi);
    char again[256];
    snprintf(again, sizeof(again), "Request %llu timed out after %.1fs in %s", r, x, state);
    CHECK(strcmp(again, why) == 0); /* exactly the seeds' format */
}

static void test_timeouts(void)
{
    const double to = 0.5;
    kvbh_knobs_t k = {.boot_timeout = to, .wait_timeout = to};
    kvbh_boot_t b;
    CHECK_EQ(kvbh_boot_start(&b, 0, NULL), 0);
    const char *boot = b.addr;
    kvbh_rank_t p, d;
    kvb_sender_h s;
    kvb_receiver_h rc;
    char why[512];
    CHECK_EQ(kvbh_rank_start(&p, &G_SMALL, KVB_MODE_PREFILL, boot, KVBH_MEM_MALLOC, &k), 0);
    CHECK_EQ(kvbh_rank_start(&d, &G_SMALL, KVB_MODE_DECODE, NULL, KVBH_MEM_MALLOC, &k), 0);
    /* Bootstrap time-out: a sender no decode ever sends transfer info to. */
    double t0 = kvbh_now();
    CHECK_EQ(kvb_sender_create(p.mgr, boot, 500, &s), KVB_OK);
    CHECK_EQ(kvb_sender_poll(s), KVB_POLL_BOOTSTRAPPING);
    CHECK_EQ(kvbh_wait_sender(s, 5), KVB_POLL_FAILED);
    double t = kvbh_now() - t0;
    kvb_sender_failure(s, why, sizeof(why));
    fprintf(stderr, "bootstrap time-out %.1f s: Failed after %.3f s: %s\n", to, t, why);
    CHECK(t >= to && t <= to + 0.5);
    check_timeout_reason(why, 500, "KVPoll.Bootstrapping", to, to + 0.5);
    kvb_sender_destroy(s);
    /* Waiting time-out: receiver init'ed, the prefill never sends. */
    int32_t dst[4] = {1, 2, 3, 4};
    CHECK_EQ(kvb_receiver_create(d.mgr, boot, 501, -1, &rc), KVB_OK);
    t0 = kvbh_now();
    kvb_receiver_init(rc, dst, 4, 0, NULL);
    CHECK_EQ(kvb_receiver_poll(rc), KVB_POLL_WAITING_FOR_INPUT);
    CHECK_EQ(kvbh_wait_receiver(rc, 5), KVB_POLL_FAILED);
    t = kvbh_now() - t0;
    kvb_receiver_failure(rc, why, sizeof(why));
    fprintf(stderr, "waiting time-out %.1f s: Failed after %.3f s: %s\n", to, t, why);
    CHECK(t >= to && t <= to + 1.0);
    check_timeout_reason(why, 501, "KVPoll.WaitingForInput", to, to + 1.0);
    kvb_receiver_destroy(rc);
    /* The prefill was told: a sender created for the room now fails. */
    CHECK_EQ(kvb_sender_create(p.mgr, boot, 501, &s), KVB_OK);
    CHECK_EQ(kvbh_wait_sender(s, 2), KVB_POLL_FAILED);
    kvb_sender_destroy(s);
    CHECK_EQ(kvbh_run_room(&p, &d, boot, 502, 6, 10, 10, 1), 0);
    kvbh_rank_stop(&d);
    kvbh_rank_stop(&p);
    kvbh_boot_stop(&b);
    TEST_PASS("bootstrap and waiting time-outs");
}

/* ---- 4. aborts and the fence ---- */

/* Destination bytes of the room's pages in every buffer, concatenated. */
static uint8_t *snapshot(const kvbh_rank_t *d, const int32_t *dst, int n)
{
    uint8_t *s = malloc((size_t)d->n_kv * (size_t)n * d->item_len + KVBH_AUX_ITEM * KVBH_AUX_ITEMS);
    size_t o = 0;
    for (int b = 0; b < d->n_kv; b++)
        for (int i = 0; i < n; i++, o += d->item_len)
            memcpy(s + o, d->kv[b] + (uint64_t)dst[i] * d->item_len, d->item_len);
    memcpy(s + o, d->aux, KVBH_AUX_ITEM * KVBH_AUX_ITEMS);
    return s;
}

static size_t snapshot_len(const kvbh_rank_t *d, int n)
{
    return (size_t)d->n_kv * (size_t)n * d->item_len + KVBH_AUX_ITEM * KVBH_AUX_ITEMS;
}

/* One abort race: a large room, chunks queued, abort by the sender
 * (by_sender) or the receiver after delay_s; then the receiver must poll
 * Failed and the pages must not change after that. Returns bytes of the
 * room that had landed when the poll said Failed. */
static uint64_t abort_race(kvbh_rank_t *p, kvbh_rank_t *d, const char *boot, uint64_t room,
                           int by_sender, double delay_s)
{
    enum { N = 512, CH = 64 };
    static int32_t src[N], dst[N];
    kvb_receiver_h rc;
    kvb_sender_h s;
    char why[512];
    for (int i = 0; i < N; i++) {
        src[i] = i;
        dst[i] = (int32_t)(G_BIG.pool_pages - 1 - (uint64_t)i);
    }
    for (int b = 0; b < d->n_kv; b++)
        memset(d->kv[b], 0, d->buf_len);
    memset(d->aux, 0, KVBH_AUX_ITEM * KVBH_AUX_ITEMS);
    kvbh_fill(p, room, src, N, 3);
    CHECK_EQ(kvb_receiver_create(d->mgr, boot, room, -1, &rc), KVB_OK);
    kvb_receiver_init(rc, dst, N, 3, NULL);
    CHECK_EQ(kvb_sender_create(p->mgr, boot, room, &s), KVB_OK);
    CHECK_EQ(kvbh_wait_sender_ready(s, 10), 0);
    kvb_sender_init(s, N, 3);
    for (int c = 0; c < N / CH; c++)
        CHECK_EQ(kvb_sender_send(s, src + c * CH, CH), KVB_OK);
    if (delay_s > 0)
        kvbh_sleep(delay_s);
    if (by_sender)
        kvb_sender_abort(s);
    else
        kvb_receiver_abort(rc);
    double t0 = kvbh_now();
    kvb_poll_t pr = kvbh_wait_receiver(rc, 30);
    double t_term = kvbh_now() - t0;
    uint8_t *before = snapshot(d, dst, N);
    kvb_poll_t ps = kvbh_wait_sender(s, 10);
    kvbh_sleep(0.3);
    uint8_t *after = snapshot(d, dst, N);
    size_t len = snapshot_len(d, N);
    uint64_t landed = 0, changed = 0;
    for (size_t i = 0; i < len; i++) {
        landed += before[i] != 0;
        changed += before[i] != after[i];
    }
    if (pr == KVB_POLL_SUCCESS) {
        /* The transfer won the race entirely: legal, all bytes must be right. */
        CHECK_EQ(kvbh_verify(d, room, dst, N, 3), 0);
    } else {
        CHECK_EQ(pr, KVB_POLL_FAILED);
        kvb_receiver_failure(rc, why, sizeof(why));
        CHECK(strcmp(why, by_sender ? FAIL_FROM_PREFILL : "Aborted by AbortReq.") == 0);
        CHECK_EQ(ps, KVB_POLL_FAILED);
        kvb_sender_failure(s, why, sizeof(why));
        /* A receiver abort revokes the room's writer grant at once: the
         * prefill learns it from the decode's ABORT, or first from a write
         * the decode's engine refused. */
        CHECK(by_sender ? strcmp(why, "Aborted by AbortReq.") == 0
                        : strcmp(why, "Aborted by the decode instance") == 0 ||
                              strstr(why, "writer fenced") != NULL);
        /* After abort the sender accepts and drops chunks. */
        CHECK_EQ(kvb_sender_send(s, src, 0), KVB_OK);
    }
    if (changed != 0)
        fprintf(stderr,
                "FENCE BROKEN: room %llu (%s abort): %llu bytes changed after poll "
                "said %s\n",
                (unsigned long long)room, by_sender ? "sender" : "receiver",
                (unsigned long long)changed, kvb_poll_string(pr));
    CHECK_EQ(changed, 0);
    fprintf(stderr, "  %s abort after %.0f ms: receiver %s %.1f ms after abort, %.1f%% landed\n",
            by_sender ? "sender" : "receiver", delay_s * 1000, kvb_poll_string(pr), t_term * 1000,
            100.0 * (double)landed / (double)len);
    free(before);
    free(after);
    kvb_sender_destroy(s);
    kvb_receiver_destroy(rc);
    return landed;
}

static void test_aborts(void)
{
    kvbh_boot_t b;
    CHECK_EQ(kvbh_boot_start(&b, 0, NULL), 0);
    const char *boot = b.addr;
    kvbh_rank_t p, d;
    CHECK_EQ(kvbh_rank_start(&p, &G_BIG, KVB_MODE_PREFILL, boot, KVBH_MEM_MALLOC, NULL), 0);
    CHECK_EQ(kvbh_rank_start(&d, &G_BIG, KVB_MODE_DECODE, NULL, KVBH_MEM_MALLOC, NULL), 0);
    static const double delays[] = {0, 0.001, 0.003, 0.008, 0.02};
    uint64_t room = 600;
    int partial = 0;
    for (int side = 0; side < 2; side++)
        for (size_t i = 0; i < sizeof(delays) / sizeof(delays[0]); i++) {
            uint64_t landed = abort_race(&p, &d, boot, room++, side == 0, delays[i]);
            partial += landed > 0;
        }
    fprintf(stderr, "abort races with bytes landed before terminal: %d of 10\n", partial);
    CHECK(kvbh_canaries_ok(&d, "decode"));
    CHECK(kvbh_canaries_ok(&p, "prefill"));
    /* Both ranks serve a clean room afterwards. */
    CHECK_EQ(kvbh_run_room(&p, &d, boot, 700, 16, 0, 0, 5), 0);
    kvbh_rank_stop(&d);
    kvbh_rank_stop(&p);
    kvbh_boot_stop(&b);
    TEST_PASS("aborts on each side; fence holds");
}

/* ---- 5. malformed frames from a raw ZeroMQ peer ---- */

typedef struct rawmsg {
    const void *f[80];
    size_t len[80];
    int n;
} rawmsg_t;

static void raw_add(rawmsg_t *m, const void *p, size_t len)
{
    m->f[m->n] = p;
    m->len[m->n++] = len;
}

static void raw_adds(rawmsg_t *m, const char *s)
{
    raw_add(m, s, strlen(s));
}

static void raw_send(kvbh_push_t *z, const rawmsg_t *m)
{
    CHECK_EQ(kvbh_push_frames(z, m->f, m->len, m->n), 0);
}

static uint64_t bad_count(kvb_manager_h m)
{
    kvb_manager_stats_t st;
    kvb_manager_stats(m, &st);
    return st.bad_messages;
}

static void wait_bad(kvb_manager_h m, uint64_t want, const char *what)
{
    double end = kvbh_now() + 5;
    while (bad_count(m) < want && kvbh_now() < end)
        kvbh_sleep(0.001);
    if (bad_count(m) != want) {
        fprintf(stderr, "malformed %s: bad_messages %llu, expected %llu\n", what,
                (unsigned long long)bad_count(m), (unsigned long long)want);
        exit(1);
    }
}

/* A valid registration or transfer info, with frame `bad` replaced. */
typedef struct mut {
    int frame;       /* frame to replace, -1 none */
    const void *val; /* NULL = drop the frame */
    size_t len;
    int extra_frames; /* frames appended */
    const char *what;
} mut_t;

static void build(rawmsg_t *m, const char *base[], const size_t base_len[], int n, const mut_t *u)
{
    m->n = 0;
    for (int i = 0; i < n; i++) {
        if (i == u->frame) {
            if (u->val != NULL)
                raw_add(m, u->val, u->len);
        } else {
            raw_add(m, base[i], base_len[i]);
        }
    }
    for (int i = 0; i < u->extra_frames; i++)
        raw_adds(m, u->extra_frames == 1 ? "no-equals-sign" : "x=1");
}

#define S(x) x, sizeof(x) - 1

static void test_malformed(void)
{
    kvbh_boot_t b;
    CHECK_EQ(kvbh_boot_start(&b, 0, NULL), 0);
    const char *boot = b.addr;
    kvbh_rank_t p, d;
    char why[512];
    CHECK_EQ(kvbh_rank_start(&p, &G_SMALL, KVB_MODE_PREFILL, boot, KVBH_MEM_MALLOC, NULL), 0);
    CHECK_EQ(kvbh_rank_start(&d, &G_SMALL, KVB_MODE_DECODE, NULL, KVBH_MEM_MALLOC, NULL), 0);
    /* A good room first (the decode registers its KV args with the prefill). */
    CHECK_EQ(kvbh_run_room(&p, &d, boot, 800, 8, 0, 0, 0), 0);
    kvbh_push_t to_p, to_d;
    CHECK_EQ(kvbh_push_open(&to_p, kvb_manager_endpoint(p.mgr), NULL), 0);
    CHECK_EQ(kvbh_push_open(&to_d, kvb_manager_endpoint(d.mgr), NULL), 0);
    const char *d_ep = kvb_manager_endpoint(d.mgr);
    char d_ip[64], d_port[16];
    CHECK_EQ(sscanf(d_ep, "%63[^:]:%15s", d_ip, d_port), 2);
    const char *d_sid = kvb_engine_session_id(d.eng);
    uint64_t expect_p = 0, expect_d = 0;
    uint64_t kvp[4], auxp[1] = {0x1000}, zero4[4] = {0};
    for (int i = 0; i < 4; i++)
        kvp[i] = 0x100000 + (uint64_t)i * 0x10000;
    uint8_t seven[7] = {0};
    char huge[64], longsid[400], big_digits[40];
    memset(huge, '9', sizeof(huge) - 1);
    huge[sizeof(huge) - 1] = '\0';
    memset(longsid, 'h', sizeof(longsid) - 7);
    memcpy(longsid + sizeof(longsid) - 7, ":12345", 7);
    snprintf(big_digits, sizeof(big_digits), "18446744073709551616");

    /* Registration: frame 0 "None" + 8 frames. */
    const char *reg[9] = {
        "None", "127.0.0.1", "5555", "127.0.0.1:1", (const char *)kvp, (const char *)auxp,
        "0",    "1",         "256"};
    const size_t reg_len[9] = {4, 9, 4, 11, sizeof(kvp), sizeof(auxp), 1, 1, 3};
    const mut_t reg_bad[] = {
        {8, NULL, 0, 0, "8 frames"},
        {1, S(""), 0, "empty ip"},
        {2, S("55a5"), 0, "non-digit port"},
        {2, S("0"), 0, "port 0"},
        {2, S("70000"), 0, "port 70000"},
        {2, huge, sizeof(huge) - 1, 0, "huge port"},
        {3, longsid, sizeof(longsid) - 1, 0, "session id 399 bytes"},
        {4, seven, 7, 0, "kv ptrs 7 bytes"},
        {4, S(""), 0, "no kv ptrs"},
        {4, zero4, sizeof(zero4), 0, "zero kv ptrs"},
        {5, seven, 7, 0, "aux ptrs 7 bytes"},
        {6, S("-1"), 0, "tp rank -1"},
        {6, S("1x"), 0, "tp rank 1x"},
        {7, S("0"), 0, "tp size 0"},
        {7, big_digits, strlen(big_digits), 0, "tp size 2^64"},
        {8, S("0"), 0, "item len 0"},
        {8, huge, sizeof(huge) - 1, 0, "item len huge"},
        {-1, NULL, 0, 70, "70 extension frames"},
        {-1, NULL, 0, 200 - 9, "200 frames"},
    };
    rawmsg_t *m = calloc(1, sizeof(rawmsg_t) + 0);
    rawmsg_t *mbig = calloc(1, sizeof(*mbig) * 1);
    (void)mbig;
    for (size_t i = 0; i < sizeof(reg_bad) / sizeof(reg_bad[0]); i++) {
        if (reg_bad[i].extra_frames > 70) {
            /* more frames than any message has: sent by hand */
            for (int f = 0; f < 200; f++)
                CHECK(zmq_send(to_p.sock, "None", 4, f + 1 < 200 ? ZMQ_SNDMORE : 0) >= 0);
        } else {
            build(m, reg, reg_len, 9, &reg_bad[i]);
            raw_send(&to_p, m);
        }
        wait_bad(p.mgr, ++expect_p, reg_bad[i].what);
    }

    /* Transfer info naming a room that has a sender: the room fails. */
    int32_t pages[4] = {1, 2, 3, 4}, neg[2] = {1, -1};
    uint8_t mask_short[3] = {1, 1, 1};
    char page_mask_ext[16];
    snprintf(page_mask_ext, sizeof(page_mask_ext), "page_mask=%c%c", 1, 1);
    const mut_t xfer_bad[] = {
        {4, seven, 7, 0, "pages 7 bytes"},
        {4, neg, sizeof(neg), 0, "negative page index"},
        {5, S("abc"), 0, "aux index abc"},
        {5, S("-5"), 0, "aux index -5"},
        {5, huge, sizeof(huge) - 1, 0, "aux index huge"},
        {5, S(""), 0, "aux index empty with pages"},
        {6, S("0"), 0, "required_dst_info_num 0"},
        {6, S("x"), 0, "required_dst_info_num x"},
        {2, S("70000"), 0, "port 70000"},
        {3, S(""), 0, "empty session id"},
        {-1, NULL, 0, 1, "extension frame without key=value"},
        {-1, NULL, 0, 70, "70 extension frames"},
    };
    (void)mask_short;
    kvb_sender_h snd[32];
    size_t nx = sizeof(xfer_bad) / sizeof(xfer_bad[0]);
    for (size_t i = 0; i < nx; i++) {
        uint64_t room = 900 + i;
        char room_s[24];
        snprintf(room_s, sizeof(room_s), "%llu", (unsigned long long)room);
        const char *xf[7] = {room_s, d_ip, d_port, d_sid, (const char *)pages, "3", "1"};
        const size_t xl[7] = {
            strlen(room_s), strlen(d_ip), strlen(d_port), strlen(d_sid), sizeof(pages), 1, 1};
        CHECK_EQ(kvb_sender_create(p.mgr, boot, room, &snd[i]), KVB_OK);
        build(m, xf, xl, 7, &xfer_bad[i]);
        raw_send(&to_p, m);
        wait_bad(p.mgr, ++expect_p, xfer_bad[i].what);
    }
    for (size_t i = 0; i < nx; i++) {
        char want[64];
        snprintf(want, sizeof(want), "Malformed control message for room %llu",
                 (unsigned long long)(900 + i));
        kvb_poll_t st = kvbh_wait_sender(snd[i], 2);
        kvb_sender_failure(snd[i], why, sizeof(why));
        if (st != KVB_POLL_FAILED || strstr(why, want) == NULL)
            fprintf(stderr, "transfer info \"%s\": sender %s: %s\n", xfer_bad[i].what,
                    kvb_poll_string(st), why);
        CHECK_EQ(st, KVB_POLL_FAILED);
        CHECK_STR_CONTAINS(why, want);
        kvb_sender_destroy(snd[i]);
    }
    /* Room frames that do not parse: counted, no room to fail. */
    const char *bad_rooms[] = {"12a", "", "-5", big_digits, huge};
    for (size_t i = 0; i < sizeof(bad_rooms) / sizeof(bad_rooms[0]); i++) {
        m->n = 0;
        raw_adds(m, bad_rooms[i]);
        for (int f = 1; f < 7; f++)
            raw_adds(m, "1");
        raw_send(&to_p, m);
        wait_bad(p.mgr, ++expect_p, bad_rooms[i]);
    }
    /* Wrong frame counts of a room message: 1, 2, 4, 5, 6 frames. */
    static const int counts[] = {1, 2, 4, 5, 6};
    for (size_t i = 0; i < sizeof(counts) / sizeof(counts[0]); i++) {
        m->n = 0;
        for (int f = 0; f < counts[i]; f++)
            raw_adds(m, "7");
        raw_send(&to_p, m);
        wait_bad(p.mgr, ++expect_p, "frame count");
    }
    /* A status or aux message is not for a prefill rank. */
    m->n = 0;
    raw_adds(m, "5");
    raw_adds(m, "4");
    raw_adds(m, "0");
    raw_send(&to_p, m);
    wait_bad(p.mgr, ++expect_p, "status to a prefill");

    /* Well-formed transfer info whose pages lie outside the decode's pool:
     * the write is refused, the room fails, nothing lands outside. */
    {
        uint64_t room = 950;
        char room_s[24];
        int32_t out_pages[2] = {(int32_t)G_SMALL.pool_pages, (int32_t)G_SMALL.pool_pages + 3};
        int32_t src[2] = {5, 6};
        kvb_sender_h s;
        snprintf(room_s, sizeof(room_s), "%llu", (unsigned long long)room);
        CHECK_EQ(kvb_sender_create(p.mgr, boot, room, &s), KVB_OK);
        m->n = 0;
        raw_adds(m, room_s);
        raw_adds(m, d_ip);
        raw_adds(m, d_port);
        raw_adds(m, d_sid);
        raw_add(m, out_pages, sizeof(out_pages));
        raw_adds(m, "1");
        raw_adds(m, "1");
        raw_send(&to_p, m);
        CHECK_EQ(kvbh_wait_sender_ready(s, 5), 0);
        kvb_sender_init(s, 2, 1);
        kvb_sender_send(s, src, 2);
        kvb_poll_t st = kvbh_wait_sender(s, 5);
        kvb_sender_failure(s, why, sizeof(why));
        fprintf(stderr, "pages outside the decode pool: sender %s: %s\n", kvb_poll_string(st), why);
        CHECK_EQ(st, KVB_POLL_FAILED);
        CHECK(strlen(why) > 0);
        kvb_sender_destroy(s);
        /* Aux index outside the decode's aux buffer, forged over a real
         * receiver's transfer info: the aux write cannot land, the prefill
         * falls back to inline aux, the decode rejects it and fails the
         * room; no aux byte is written. */
        uint8_t aux_snap[KVBH_AUX_ITEM * KVBH_AUX_ITEMS];
        memcpy(aux_snap, d.aux, sizeof(aux_snap));
        room = 951;
        snprintf(room_s, sizeof(room_s), "%llu", (unsigned long long)room);
        int32_t in_pages[2] = {7, 8};
        kvb_receiver_h rc;
        CHECK_EQ(kvb_receiver_create(d.mgr, boot, room, -1, &rc), KVB_OK);
        kvb_receiver_init(rc, in_pages, 2, 1, NULL);
        CHECK_EQ(kvb_sender_create(p.mgr, boot, room, &s), KVB_OK);
        CHECK_EQ(kvbh_wait_sender_ready(s, 5), 0);
        m->n = 0;
        raw_adds(m, room_s);
        raw_adds(m, d_ip);
        raw_adds(m, d_port);
        raw_adds(m, d_sid);
        raw_add(m, in_pages, sizeof(in_pages));
        raw_adds(m, "100000");
        raw_adds(m, "1");
        raw_send(&to_p, m);
        kvbh_sleep(0.1); /* the forged info replaced the receiver's */
        kvb_sender_init(s, 2, 1);
        kvb_sender_send(s, src, 2);
        st = kvbh_wait_sender(s, 5);
        char swhy[512] = "";
        if (st == KVB_POLL_FAILED)
            kvb_sender_failure(s, swhy, sizeof(swhy));
        kvb_poll_t pr = kvbh_wait_receiver(rc, 5);
        kvb_receiver_failure(rc, why, sizeof(why));
        fprintf(stderr,
                "aux index outside the decode's aux buffer: sender %s (%s), receiver %s: %s\n",
                kvb_poll_string(st), swhy, kvb_poll_string(pr), why);
        CHECK_EQ(pr, KVB_POLL_FAILED);
        if (st == KVB_POLL_SUCCESS) { /* inline aux, rejected by the decode */
            wait_bad(d.mgr, ++expect_d, "inline aux with the forged aux index");
            CHECK_STR_CONTAINS(why, "Malformed control message for room 951");
        } else {
            CHECK_EQ(st, KVB_POLL_FAILED);
            CHECK(swhy[0] != '\0');
        }
        CHECK(memcmp(aux_snap, d.aux, sizeof(aux_snap)) == 0);
        kvb_receiver_destroy(rc);
        kvb_sender_destroy(s);
        CHECK(kvbh_canaries_ok(&d, "decode"));
    }

    /* Decode side: statuses and aux data naming a room with a receiver. */
    uint8_t aux_before[KVBH_AUX_ITEM * KVBH_AUX_ITEMS];
    memcpy(aux_before, d.aux, sizeof(aux_before));
    uint8_t payload[KVBH_AUX_ITEM + 1],
        len_be[4] = {0, 0, 0, KVBH_AUX_ITEM}, len_be_short[4] = {0, 0, 0, KVBH_AUX_ITEM - 1},
        len_3[3] = {0, 0, KVBH_AUX_ITEM}, len_huge[4] = {0xff, 0xff, 0xff, 0xff},
        len_65[4] = {0, 0, 0, KVBH_AUX_ITEM + 1};
    memset(payload, 0x5c, sizeof(payload));
    typedef struct dmut {
        int kind; /* 0 status, 1 aux */
        int frame;
        const void *val;
        size_t len;
        int extra;
        const char *what;
        int names_room;
    } dmut_t;
    const dmut_t dec_bad[] = {
        {0, 1, S("9"), 0, "status 9", 1},
        {0, 1, S("x"), 0, "status x", 1},
        {0, 1, S(""), 0, "status empty", 1},
        {0, 2, S("-1"), 0, "prefill rank -1", 1},
        {0, 2, S("r"), 0, "prefill rank r", 1},
        {0, 2, huge, sizeof(huge) - 1, 0, "prefill rank huge", 1},
        {1, 2, S("1"), 0, "aux buffer index out of range", 1},
        {1, 2, S("b"), 0, "aux buffer index b", 1},
        {1, 3, S("32"), 0, "aux index out of range", 1},
        {1, 3, huge, sizeof(huge) - 1, 0, "aux index huge", 1},
        {1, 4, len_be_short, 4, 0, "aux length 63, payload 64", 1},
        {1, 4, len_3, 3, 0, "aux length frame 3 bytes", 1},
        {1, 4, len_huge, 4, 0, "aux length 2^32-1", 1},
        {1, 4, len_65, 4, 0, "aux length 65 (item 64), payload 65", 1},
        {1, 5, NULL, 0, 0, "aux 5 frames", 1},
        {1, -1, NULL, 0, 1, "aux 7 frames", 1},
    };
    size_t nd = sizeof(dec_bad) / sizeof(dec_bad[0]);
    kvb_receiver_h rcv[32];
    for (size_t i = 0; i < nd; i++) {
        uint64_t room = 1000 + i;
        char room_s[24];
        int32_t dst[2] = {(int32_t)(100 + 2 * i), (int32_t)(101 + 2 * i)};
        snprintf(room_s, sizeof(room_s), "%llu", (unsigned long long)room);
        CHECK_EQ(kvb_receiver_create(d.mgr, boot, room, -1, &rcv[i]), KVB_OK);
        kvb_receiver_init(rcv[i], dst, 2, 1, NULL);
        const char *st3[3] = {room_s, "4", "0"};
        const size_t st3l[3] = {strlen(room_s), 1, 1};
        const char *ax[6] = {"AUX_DATA",           room_s, "0", "1", (const char *)len_be,
                             (const char *)payload};
        size_t axl[6] = {8, strlen(room_s), 1, 1, 4, KVBH_AUX_ITEM};
        if (dec_bad[i].frame == 4 && dec_bad[i].val == len_65)
            axl[5] = KVBH_AUX_ITEM + 1;
        mut_t u = {dec_bad[i].frame, dec_bad[i].val, dec_bad[i].len, dec_bad[i].extra, ""};
        if (dec_bad[i].kind == 0)
            build(m, st3, st3l, 3, &u);
        else
            build(m, ax, axl, 6, &u);
        raw_send(&to_d, m);
        wait_bad(d.mgr, ++expect_d, dec_bad[i].what);
    }
    for (size_t i = 0; i < nd; i++) {
        char want[64];
        snprintf(want, sizeof(want), "Malformed control message for room %llu",
                 (unsigned long long)(1000 + i));
        kvb_poll_t st = kvbh_wait_receiver(rcv[i], 3);
        kvb_receiver_failure(rcv[i], why, sizeof(why));
        if (st != KVB_POLL_FAILED || strstr(why, want) == NULL)
            fprintf(stderr, "decode \"%s\": receiver %s: %s\n", dec_bad[i].what,
                    kvb_poll_string(st), why);
        CHECK_EQ(st, KVB_POLL_FAILED);
        CHECK_STR_CONTAINS(why, want);
        kvb_receiver_destroy(rcv[i]);
        /* Fence: the prefill was told to stop (a sender for it fails now). */
        kvb_sender_h s;
        CHECK_EQ(kvb_sender_create(p.mgr, boot, 1000 + i, &s), KVB_OK);
        st = kvbh_wait_sender(s, 2);
        if (st != KVB_POLL_FAILED)
            fprintf(stderr, "decode \"%s\": the prefill was not told (sender %s)\n",
                    dec_bad[i].what, kvb_poll_string(st));
        CHECK_EQ(st, KVB_POLL_FAILED);
        kvb_sender_destroy(s);
    }
    CHECK(memcmp(aux_before, d.aux, sizeof(aux_before)) == 0);
    /* Unparsable room frames and wrong counts to the decode. */
    const char *dec_rooms[] = {"12a", big_digits, ""};
    for (size_t i = 0; i < 3; i++) {
        m->n = 0;
        raw_adds(m, dec_rooms[i]);
        raw_adds(m, "4");
        raw_adds(m, "0");
        raw_send(&to_d, m);
        wait_bad(d.mgr, ++expect_d, "decode room frame");
    }
    for (size_t i = 0; i < sizeof(counts) / sizeof(counts[0]); i++) {
        m->n = 0;
        for (int f = 0; f < counts[i]; f++)
            raw_adds(m, "7");
        if (counts[i] == 3)
            continue;
        raw_send(&to_d, m);
        wait_bad(d.mgr, ++expect_d, "decode frame count");
    }
    /* A registration is not for a decode rank. */
    build(m, reg, reg_len, 9, &(mut_t){-1, NULL, 0, 0, ""});
    raw_send(&to_d, m);
    wait_bad(d.mgr, ++expect_d, "registration to a decode");
    /* A huge frame (4 MiB of page indices, beyond the pool). */
    {
        size_t hn = 1u << 20;
        int32_t *hp = malloc(hn * 4);
        for (size_t i = 0; i < hn; i++)
            hp[i] = (int32_t)i;
        kvb_sender_h s;
        CHECK_EQ(kvb_sender_create(p.mgr, boot, 960, &s), KVB_OK);
        m->n = 0;
        raw_adds(m, "960");
        raw_adds(m, d_ip);
        raw_adds(m, d_port);
        raw_adds(m, d_sid);
        raw_add(m, hp, hn * 4);
        raw_adds(m, "1");
        raw_adds(m, "1");
        raw_send(&to_p, m);
        CHECK_EQ(kvbh_wait_sender_ready(s, 5), 0);
        kvb_sender_init(s, hn, 1);
        int32_t *src = calloc(hn, 4);
        kvb_sender_send(s, src, hn);
        kvb_poll_t st = kvbh_wait_sender(s, 10);
        kvb_sender_failure(s, why, sizeof(why));
        fprintf(stderr, "1M page indices beyond the pool: sender %s: %.200s\n", kvb_poll_string(st),
                why);
        CHECK_EQ(st, KVB_POLL_FAILED);
        kvb_sender_destroy(s);
        free(src);
        free(hp);
    }

    /* Registration flood: distinct bogus sessions, more than the table holds
     * (KVBRIDGE_MAX_REGISTRATIONS=256 in main): they displace each other,
     * never the decode that serves rooms. */
    {
        enum { FLOOD = 2000 };
        char sid[64];
        double t0 = kvbh_now();
        kvb_manager_stats_t st0, st1;
        kvb_manager_stats(p.mgr, &st0);
        for (int i = 0; i < FLOOD; i++) {
            snprintf(sid, sizeof(sid), "10.0.%d.%d:%d", i / 250, i % 250, 1000 + i);
            const char *r2[9] = {
                "None", "127.0.0.1", "5555", sid, (const char *)kvp, (const char *)auxp,
                "0",    "1",         "256"};
            size_t r2l[9] = {4, 9, 4, strlen(sid), sizeof(kvp), sizeof(auxp), 1, 1, 3};
            build(m, r2, r2l, 9, &(mut_t){-1, NULL, 0, 0, ""});
            raw_send(&to_p, m);
        }
        /* and garbage to the decode */
        for (int i = 0; i < FLOOD; i++) {
            m->n = 0;
            raw_adds(m, "garbage");
            raw_send(&to_d, m);
        }
        expect_d += FLOOD;
        wait_bad(d.mgr, expect_d, "decode garbage flood");
        /* one bad message behind the flood on the same pipe: once counted,
         * every registration before it was handled */
        m->n = 0;
        raw_adds(m, "garbage");
        raw_send(&to_p, m);
        wait_bad(p.mgr, ++expect_p, "after the registration flood");
        kvb_manager_stats(p.mgr, &st1);
        CHECK_EQ(st1.registrations, 256);
        CHECK_EQ(st1.registrations_evicted, st0.registrations + FLOOD - 256);
        CHECK_EQ(st1.registrations_refused, 0);
        /* the prefill is still serving: a well-formed room through it */
        CHECK_EQ(kvbh_run_room(&p, &d, boot, 990, 12, 20, 150, 4), 0);
        fprintf(stderr,
                "flood of %d registrations + %d garbage messages, then a good room: "
                "%.3f s\n",
                FLOOD, FLOOD, kvbh_now() - t0);
    }
    CHECK_EQ(bad_count(p.mgr), expect_p);
    CHECK_EQ(bad_count(d.mgr), expect_d);
    fprintf(stderr, "malformed: prefill counted %llu, decode counted %llu\n",
            (unsigned long long)expect_p, (unsigned long long)expect_d);
    /* Still serving after everything; nothing written outside the pools. */
    CHECK_EQ(kvbh_run_room(&p, &d, boot, 991, 10, 40, 200, 6), 0);
    CHECK(kvbh_canaries_ok(&d, "decode"));
    CHECK(kvbh_canaries_ok(&p, "prefill"));
    free(m);
    free(mbig);
    kvbh_push_close(&to_p);
    kvbh_push_close(&to_d);
    kvbh_rank_stop(&d);
    kvbh_rank_stop(&p);
    kvbh_boot_stop(&b);
    TEST_PASS("malformed frames from a raw ZeroMQ peer");
}

int main(int argc, char **argv)
{
    if (kvbh_main_init(argc, argv)) {
        int rc = kvbh_child_main(argc, argv);
        return rc < 0 ? 2 : rc;
    }
    setenv("KVBRIDGE_HEARTBEAT_FLOOR", "0.2", 1);
    setenv("KVBRIDGE_TRANSFER_TIMEOUT", "5", 1);
    setenv("KVBRIDGE_MAX_REGISTRATIONS", "256", 1);
    const char *only = argc > 1 ? argv[1] : "";
    if (!*only || strcmp(only, "prefill_killed") == 0)
        test_prefill_killed();
    if (!*only || strcmp(only, "decode_killed") == 0)
        test_decode_killed();
    if (!*only || strcmp(only, "timeouts") == 0)
        test_timeouts();
    if (!*only || strcmp(only, "aborts") == 0)
        test_aborts();
    if (!*only || strcmp(only, "malformed") == 0)
        test_malformed();
    return 0;
}
