/* The abort fence under the fault the review (2026-12, 1.1/1.2) says was
 * never tested: a prefill SIGSTOPped mid-transfer with rooms in flight, the
 * bootstrap server gone at the same moment (so the decode's heartbeat
 * declares the prefill lost), the bootstrap server restarted on the same
 * port, new receivers resolving the same prefill again (a new route), the
 * old rooms' pages refilled with a guard pattern as soon as the decode says
 * they are safe, then SIGCONT. After the prefill has finished everything it
 * had queued (the old rooms' second halves, then whole new rooms), every
 * guard byte must be intact and the new rooms must verify.
 *
 * One case per lane, the argument: "direct" (decode pool from kvb_mem_alloc:
 * the prefill's copy threads write straight in), "shm" (plain decode pool:
 * the UCX message lane over shared memory), "tcp" (KVBRIDGE_TRANSPORT=tcp).
 * Before the grant fence, resolving the route again lifted the prefill's
 * tag fence, and the resumed prefill's writes for the old rooms landed in
 * the refilled pages (the issue measured 336-608 MiB on every lane).
 * Built on the cluster harness (tests/harness); its own child (fprefill)
 * is this executable run with --child. */
#include "../bootstrap/boot_test_util.h"
#include "harness/kvb_cluster.h"
#include "kvb_test.h"

#include <kvbridge/bootstrap.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* 16 KiB per page and buffer, 8 buffers: a room of 16 pages is 2 MiB. */
static const kvbh_geom_t G = {4, 8, 128, 16, 1024, 0, 0};

#define NR 28 /* old rooms, in flight at SIGSTOP */
#define NN 4  /* new rooms, after the route is resolved again */
#define NP 16 /* pages per room */
#define GUARD 0x5A
#define FENCE_WAIT 0.3 /* KVBRIDGE_FENCE_WAIT: how long a revoke waits before "unsafe" */
#define FENCE_WAIT_S "0.3"
_Static_assert(NR + NN <= KVBH_AUX_ITEMS, "one aux item per room");
#define R0 1000ull
#define RN 2000ull

/* "-nokey" cases (review 2, finding 1): the prefill's route carries no
 * "kvbridge" key (a kvbridge prefill behind SGLang's bootstrap server), so
 * no writer grant reaches it and its writes carry epoch 0. */
static int g_nokey;
/* "-ts" cases: the route is registered in TokenSpeed's shape (PUT /route of
 * PROTOCOL-TOKENSPEED.md 3.1), so the decode speaks TokenSpeed's dialect to
 * the kvbridge prefill: no grant (the dialect has no field for it), no
 * abort message; its statuses are the fence. */
static int g_ts;

static int32_t dst_page(uint64_t room, int i)
{
    uint64_t slot = room >= RN ? NR + (room - RN) : room - R0;
    return (int32_t)(slot * NP + (uint64_t)i);
}

static int32_t src_page(uint64_t room, int i)
{
    return dst_page(room, NP - 1 - i);
}

static int aux_of(uint64_t room)
{
    return dst_page(room, 0) / NP; /* one aux item per room, old and new */
}

/* ---- child: a prefill rank registered with the bootstrap server ---- */

/* Senders for rooms [first, first + count) made ready first, then every
 * send issued back to back, so the writes are in flight together. */
static int send_rooms(kvbh_rank_t *p, kvb_sender_h *s, uint64_t first, int count, int whole)
{
    int32_t src[NR][NP];
    for (int j = 0; j < count; j++) {
        uint64_t room = first + (uint64_t)j;
        for (int i = 0; i < NP; i++)
            src[j][i] = src_page(room, i);
        kvbh_fill(p, room, src[j], NP, aux_of(room));
        if (kvb_sender_create(p->mgr, "x", room, &s[j]) != KVB_OK ||
            kvbh_wait_sender_ready(s[j], 10) != 0)
            return -1;
        kvb_sender_init(s[j], NP, aux_of(room));
    }
    for (int j = 0; j < count; j++)
        kvb_sender_send(s[j], src[j], whole ? NP : NP / 2);
    return 0;
}

static void send_rest(kvb_sender_h *s, uint64_t first, int count)
{
    for (int j = 0; j < count; j++) {
        int32_t src[NP];
        for (int i = 0; i < NP; i++)
            src[i] = src_page(first + (uint64_t)j, i);
        kvb_sender_send(s[j], src + NP / 2, NP - NP / 2);
    }
}

/* "prefill ENDPOINT", then commands: "old" (first halves of the old rooms,
 * answers "sent"), "rest" (their second halves), "new" (whole new rooms),
 * "report" (waits for every sender's end: "report OLD_OK OLD_FAILED NEW_OK
 * NEW_FAILED"), "lane SID" ("lane D": kvb_engine_session_direct). */
static int child_prefill(const char *boot)
{
    kvbh_rank_t p;
    kvb_sender_h old[NR] = {0}, nw[NN] = {0};
    char line[256], sid[128];
    if (kvbh_rank_start(&p, &G, KVB_MODE_PREFILL, boot, KVBH_MEM_MALLOC, NULL) != KVB_OK)
        return 4;
    printf("prefill %s\n", kvb_manager_endpoint(p.mgr));
    fflush(stdout);
    while (fgets(line, sizeof(line), stdin) != NULL) {
        if (strncmp(line, "old", 3) == 0)
            printf(send_rooms(&p, old, R0, NR, 0) == 0 ? "sent\n" : "error\n");
        else if (strncmp(line, "rest", 4) == 0)
            send_rest(old, R0, NR);
        else if (strncmp(line, "new", 3) == 0)
            printf(send_rooms(&p, nw, RN, NN, 1) == 0 ? "sent\n" : "error\n");
        else if (sscanf(line, "lane %127s", sid) == 1)
            printf("lane %d\n", kvb_engine_session_direct(p.eng, sid));
        else if (strncmp(line, "report", 6) == 0) {
            int c[4] = {0};
            for (int j = 0; j < NR && old[j] != NULL; j++)
                c[kvbh_wait_sender(old[j], 20) == KVB_POLL_SUCCESS ? 0 : 1]++;
            for (int j = 0; j < NN && nw[j] != NULL; j++)
                c[kvbh_wait_sender(nw[j], 20) == KVB_POLL_SUCCESS ? 2 : 3]++;
            printf("report %d %d %d %d\n", c[0], c[1], c[2], c[3]);
        }
        fflush(stdout);
    }
    for (int j = 0; j < NR; j++)
        kvb_sender_destroy(old[j]);
    for (int j = 0; j < NN; j++)
        kvb_sender_destroy(nw[j]);
    kvbh_rank_stop(&p);
    return 0;
}

/* ---- the test ---- */

/* PUT /route for the prefill at ep on the restarted server, as its own
 * refresh would once resumed (it is still stopped). */
static void reregister(const char *boot, const char *ep, const kvb_bootstrap_parallel_info_t *pi)
{
    kvb_bootstrap_client_params_t cp = {0};
    kvb_bootstrap_client_h c;
    kvb_bootstrap_registration_t reg = {0};
    char ip[64];
    const char *colon = strrchr(ep, ':');
    CHECK(colon != NULL && (size_t)(colon - ep) < sizeof(ip));
    snprintf(ip, sizeof(ip), "%.*s", (int)(colon - ep), ep);
    reg.field_mask = KVB_BOOTSTRAP_REG_KV_ITEM_LENS | KVB_BOOTSTRAP_REG_KV_UNIT_LENS;
    reg.attn_tp_size = reg.attn_dp_size = reg.pp_size = reg.system_dp_size = 1;
    reg.rank_ip = ip;
    reg.rank_port = (uint16_t)atoi(colon + 1);
    reg.kv_item_lens = pi->kv_item_lens;
    reg.kv_unit_lens = pi->kv_unit_lens;
    CHECK_EQ(kvb_bootstrap_client_create(boot, &cp, &c), KVB_OK);
    CHECK_EQ(kvb_bootstrap_client_register(c, &reg, 5), KVB_OK);
    kvb_bootstrap_client_destroy(c);
}

static void json_lens(char *out, size_t cap, const kvb_bootstrap_lens_t *l)
{
    size_t n = (size_t)snprintf(out, cap, "[");
    for (size_t i = 0; i < l->count && n < cap; i++)
        n += (size_t)snprintf(out + n, cap - n, "%s%llu", i ? "," : "",
                              (unsigned long long)l->values[i]);
    if (n < cap)
        snprintf(out + n, cap - n, "]");
}

/* The same route in TokenSpeed's shape (it marks the ranks as TokenSpeed's
 * on kvbridge's server: docs/tokenspeed-fields.md). */
static void reregister_ts(const char *boot, const char *ep, const kvb_bootstrap_parallel_info_t *pi)
{
    char url[256], body[4096], items[1536], units[1536];
    const char *colon = strrchr(ep, ':');
    http_resp_t r;
    CHECK(colon != NULL);
    json_lens(items, sizeof(items), &pi->kv_item_lens);
    json_lens(units, sizeof(units), &pi->kv_unit_lens);
    snprintf(url, sizeof(url), "http://%s/route", boot);
    snprintf(body, sizeof(body),
             "{\"role\":\"Prefill\",\"world_size\":1,\"dp_size\":1,\"rank_ip\":\"%.*s\","
             "\"rank_port\":%s,\"engine_rank\":0,\"enable_mla_l1_5_cache\":false,"
             "\"kv_item_lens\":%s,\"kv_unit_lens\":%s}",
             (int)(colon - ep), ep, colon + 1, items, units);
    http_req("PUT", url, body, strlen(body), NULL, &r);
    if (r.code != 200)
        fprintf(stderr, "TokenSpeed PUT /route: %ld %s\n", r.code, r.body);
    CHECK_EQ(r.code, 200);
    http_resp_free(&r);
}

static void parallel_info(const char *boot, kvb_bootstrap_parallel_info_t *pi)
{
    kvb_bootstrap_client_params_t cp = {0};
    kvb_bootstrap_client_h c;
    CHECK_EQ(kvb_bootstrap_client_create(boot, &cp, &c), KVB_OK);
    CHECK_EQ(kvb_bootstrap_client_parallel_info(c, 5, pi), KVB_OK);
    kvb_bootstrap_client_destroy(c);
}

/* Bytes of the room's first half that had arrived. */
static uint64_t arrived(const kvbh_rank_t *d, uint64_t room)
{
    uint64_t ok = 0;
    for (int b = 0; b < d->n_kv; b++)
        for (int i = 0; i < NP / 2; i++) {
            const uint8_t *p = d->kv[b] + (uint64_t)dst_page(room, i) * d->item_len;
            for (uint64_t k = 0; k < d->item_len; k++)
                ok += p[k] == kvbh_pat(room, b, (uint64_t)i, k);
        }
    return ok;
}

static void room_dst(uint64_t room, int32_t *dst)
{
    for (int i = 0; i < NP; i++)
        dst[i] = dst_page(room, i);
}

static void guard_room(kvbh_rank_t *d, uint64_t room)
{
    int32_t dst[NP];
    room_dst(room, dst);
    kvbh_guard_fill(d, dst, NP, aux_of(room), GUARD);
}

static uint64_t guard_broken(const kvbh_rank_t *d, uint64_t room)
{
    int32_t dst[NP];
    room_dst(room, dst);
    return kvbh_guard_bad(d, dst, NP, aux_of(room), GUARD);
}

static void receivers(kvbh_rank_t *d, const char *boot, uint64_t first, int count,
                      kvb_receiver_h *rc)
{
    for (int j = 0; j < count; j++) {
        uint64_t room = first + (uint64_t)j;
        int32_t dst[NP];
        for (int i = 0; i < NP; i++)
            dst[i] = dst_page(room, i);
        CHECK_EQ(kvb_receiver_create(d->mgr, boot, room, -1, &rc[j]), KVB_OK);
        kvb_receiver_init(rc[j], dst, NP, aux_of(room), NULL);
    }
}

static void expect(kvbh_child_t *ch, const char *want, char *line, size_t cap, double t)
{
    CHECK_EQ(kvbh_child_line(ch, line, cap, t), 0);
    if (strncmp(line, want, strlen(want)) != 0)
        fprintf(stderr, "prefill answered \"%s\", expected \"%s...\"\n", line, want);
    CHECK(strncmp(line, want, strlen(want)) == 0);
}

/* A bootstrap server, the fprefill child registered with it (boot and ep:
 * 128 bytes each), the decode rank d on memory mem, receivers for the old
 * rooms. */
static void start_scene(kvbh_boot_t *bs, kvbh_child_t *ch, char *boot, char *ep, kvbh_rank_t *d,
                        int mem, const kvbh_knobs_t *k, kvb_receiver_h *rc)
{
    char line[256];
    CHECK_EQ(kvbh_boot_start(bs, 0, NULL), 0);
    snprintf(boot, 128, "%s", bs->addr);
    char *args[] = {"fprefill", boot, NULL};
    CHECK_EQ(kvbh_child_spawn(ch, args), 0);
    expect(ch, "prefill ", line, sizeof(line), 20);
    CHECK_EQ(sscanf(line, "prefill %127s", ep), 1);
    if (g_nokey || g_ts) { /* the same route, without the key (its refresh is off) */
        kvb_bootstrap_parallel_info_t pi;
        parallel_info(boot, &pi);
        if (g_ts)
            reregister_ts(boot, ep, &pi);
        else
            reregister(boot, ep, &pi);
        kvb_bootstrap_parallel_info_free(&pi);
    }
    CHECK_EQ(kvbh_rank_start(d, &G, KVB_MODE_DECODE, NULL, mem, k), KVB_OK);
    receivers(d, boot, R0, NR, rc);
}

/* Wait (bounded) for the old rooms to end: a room poll() reports Failed
 * must be safe (its grant revoked and drained), and its pages are guarded
 * at once; a room whose writes have not ended (a unit stopped mid-copy)
 * must be held: Transferring, pages unsafe. Returns how many were held. */
static int fail_and_guard(kvbh_rank_t *d, kvb_receiver_h *rc, int *guarded, double t0, double bound)
{
    int left = NR;
    double t_last = 0;
    uint64_t got = 0;
    while (left > 0 && kvbh_now() < t0 + bound) {
        for (int j = 0; j < NR; j++) {
            if (rc[j] == NULL || kvb_receiver_poll(rc[j]) != KVB_POLL_FAILED)
                continue;
            got += arrived(d, R0 + (uint64_t)j);
            CHECK(kvb_receiver_pages_safe(rc[j])); /* Failed within the bound: safe */
            guard_room(d, R0 + (uint64_t)j);
            guarded[j] = 1;
            char why[512];
            kvb_receiver_failure(rc[j], why, sizeof(why));
            CHECK_STR_CONTAINS(why, "Losing connection with prefill instance");
            kvb_receiver_destroy(rc[j]);
            rc[j] = NULL;
            left--;
            t_last = kvbh_now() - t0;
        }
        kvbh_sleep(0.002);
    }
    for (int j = 0; j < NR; j++)
        if (rc[j] != NULL) { /* held: its writes may still land */
            got += arrived(d, R0 + (uint64_t)j);
            CHECK_EQ(kvb_receiver_poll(rc[j]), KVB_POLL_TRANSFERRING);
            CHECK_EQ(kvb_receiver_pages_safe(rc[j]), 0);
        }
    fprintf(stderr,
            "fence: %d rooms Failed and safe, the last %.3f s after the fault (bound %.2f s), %d "
            "held unsafe; %.1f of %.1f MiB of the first halves had arrived\n",
            NR - left, t_last, bound, left, (double)got / (1 << 20),
            (double)NR * NP / 2 * d->item_len * d->n_kv / (1 << 20));
    CHECK(t_last <= bound);
    return left;
}

static void test_fence(const char *lane)
{
    const double interval = 0.2;
    const int misses = 2;
    kvbh_knobs_t k = {.hb_interval = interval, .hb_misses = misses};
    int mem = strcmp(lane, "direct") == 0 ? KVBH_MEM_SHARED : KVBH_MEM_MALLOC;
    kvb_receiver_h rc[NR], rn[NN];
    int guarded[NR] = {0};
    char line[512], ep[128], boot[128];
    kvbh_child_t ch;
    kvbh_rank_t d;
    kvb_bootstrap_parallel_info_t pi;
    if (strcmp(lane, "tcp") == 0)
        setenv("KVBRIDGE_TRANSPORT", "tcp", 1);
    kvbh_boot_t bs;
    start_scene(&bs, &ch, boot, ep, &d, mem, &k, rc);
    parallel_info(boot, &pi);
    dprintf(ch.to, "old\n");
    expect(&ch, "sent", line, sizeof(line), 30);
    /* The fault, mid-transfer: once a quarter of the rooms' bytes started to
     * land, the rest queued or being copied. */
    const uint8_t *probe = d.kv[0] + (uint64_t)dst_page(R0 + NR / 4, 0) * d.item_len;
    double t_probe = kvbh_now();
    while (probe[d.item_len - 1] != kvbh_pat(R0 + NR / 4, 0, 0, d.item_len - 1) &&
           kvbh_now() < t_probe + 10)
        ;
    double t0 = kvbh_now();
    CHECK_EQ(kill(ch.pid, SIGSTOP), 0);
    kvbh_boot_stop(&bs);
    fprintf(stderr,
            "fence[%s]: prefill stopped and bootstrap server down; %d rooms x %d of %d "
            "pages (%.0f MiB) were queued\n",
            lane, NR, NP / 2, NP, (double)NR * NP / 2 * d.item_len * d.n_kv / (1 << 20));
    /* Heartbeat bound (interval x misses + 1 s), the fence wait, and 1.5 s
     * for sanitizer builds on 2 loaded cores (TSan measured 2.6-3.3 s with
     * a 1 s fence wait). */
    int unsafe = fail_and_guard(&d, rc, guarded, t0, interval * misses + 1.0 + FENCE_WAIT + 1.5);
    /* The bootstrap server comes back on the same port; the decode resolves
     * the same prefill again for new rooms (a new route, a new grant). */
    CHECK_EQ(kvbh_boot_restart(&bs), 0);
    if (g_ts)
        reregister_ts(boot, ep, &pi);
    else
        reregister(boot, ep, &pi);
    receivers(&d, boot, RN, NN, rn);
    /* Queued while stopped, run once resumed: the old rooms' second halves
     * first, then the new rooms. */
    dprintf(ch.to, "rest\nnew\n");
    double t_cont = kvbh_now();
    CHECK_EQ(kill(ch.pid, SIGCONT), 0);
    fprintf(stderr, "fence[%s]: SIGCONT %.2f s after the fault\n", lane, t_cont - t0);
    expect(&ch, "sent", line, sizeof(line), 30);
    /* Rooms that were unsafe: their pages are reusable once the decode says
     * so (the resumed writer's units in flight have ended). */
    while (unsafe > 0 && kvbh_now() < t_cont + 10) {
        for (int j = 0; j < NR; j++)
            if (rc[j] != NULL && kvb_receiver_pages_safe(rc[j])) {
                guard_room(&d, R0 + (uint64_t)j);
                guarded[j] = 1;
                kvb_receiver_destroy(rc[j]);
                rc[j] = NULL;
                unsafe--;
            }
        kvbh_sleep(0.002);
    }
    fprintf(stderr, "fence[%s]: unsafe rooms left %.3f s after SIGCONT: %d\n", lane,
            kvbh_now() - t_cont, unsafe);
    CHECK_EQ(unsafe, 0);
    for (int j = 0; j < NN; j++) {
        int32_t dst[NP];
        for (int i = 0; i < NP; i++)
            dst[i] = dst_page(RN + (uint64_t)j, i);
        CHECK_EQ(kvbh_wait_receiver(rn[j], 20), KVB_POLL_SUCCESS);
        /* TokenSpeed's dialect carries no aux bytes (its first token rides
         * in the status): the KV pages only */
        int aux = g_ts ? -1 : aux_of(RN + (uint64_t)j);
        CHECK_EQ(kvbh_verify(&d, RN + (uint64_t)j, dst, NP, aux), (uint64_t)0);
        kvb_receiver_destroy(rn[j]);
    }
    if (strcmp(lane, "direct") == 0) {
        dprintf(ch.to, "lane %s\n", kvb_engine_session_id(d.eng));
        expect(&ch, "lane 1", line, sizeof(line), 10);
    }
    /* Everything the prefill had queued has ended: the old rooms failed
     * (their writes fenced), the new ones succeeded. */
    dprintf(ch.to, "report\n");
    expect(&ch, "report ", line, sizeof(line), 60);
    fprintf(stderr, "fence[%s]: prefill %s (old ok/failed, new ok/failed), %.2f s after SIGCONT\n",
            lane, line, kvbh_now() - t_cont);
    int ok_old, bad_old, ok_new, bad_new;
    CHECK_EQ(sscanf(line, "report %d %d %d %d", &ok_old, &bad_old, &ok_new, &bad_new), 4);
    kvbh_sleep(0.2);
    uint64_t broken = 0;
    for (int j = 0; j < NR; j++) {
        uint64_t n = guard_broken(&d, R0 + (uint64_t)j);
        if (n != 0)
            fprintf(stderr, "room %llu: %llu guard bytes overwritten after it was reported safe\n",
                    (unsigned long long)(R0 + (uint64_t)j), (unsigned long long)n);
        broken += n;
    }
    fprintf(stderr, "fence[%s]: %llu guard bytes overwritten in %d refilled rooms\n", lane,
            (unsigned long long)broken, NR);
    CHECK_EQ(broken, (uint64_t)0);
    if (!g_nokey && !g_ts)
        CHECK_EQ(ok_old, 0); /* their writes were refused: never Success */
    CHECK_EQ(ok_new, NN);
    CHECK(kvbh_canaries_ok(&d, "decode"));
    kvb_bootstrap_parallel_info_free(&pi);
    kvbh_child_close(&ch);
    kvbh_rank_stop(&d);
    kvbh_boot_stop(&bs);
    TEST_PASS("fence: stopped prefill + bootstrap restart + re-resolve: no stale byte landed");
}

/* A prefill rank stopped behind a healthy bootstrap server: the decode
 * aborts its rooms and revokes their grants; a room whose grant drains
 * (none of its units was mid-copy at the stop) is Failed and safe at once,
 * one with a unit stopped mid-copy is held by poll() until
 * KVBRIDGE_ABORT_ACK_TIMEOUT, then ends Failed with its pages unsafe
 * (bounded, not forever), and becomes safe once the resumed unit ends; the
 * pages, guarded only when safe, never change. Direct lane. */
static void test_abort_unconfirmed(void)
{
    const double ack_to = 0.5;
    kvbh_knobs_t k = {.hb_interval = 0.2, .hb_misses = 2};
    kvb_receiver_h rc[NR];
    int guarded[NR] = {0}, n_guarded = 0;
    double ended_at[NR] = {0};
    char line[512], ep[128], boot[128], why[512];
    kvbh_child_t ch;
    kvbh_rank_t d;
    setenv("KVBRIDGE_ABORT_ACK_TIMEOUT", "0.5", 1);
    kvbh_boot_t bs;
    start_scene(&bs, &ch, boot, ep, &d, KVBH_MEM_SHARED, &k, rc);
    dprintf(ch.to, "old\n");
    expect(&ch, "sent", line, sizeof(line), 30);
    CHECK_EQ(kill(ch.pid, SIGSTOP), 0);
    double t0 = kvbh_now();
    for (int j = 0; j < NR; j++)
        kvb_receiver_abort(rc[j]);
    /* A room whose grant drained (nothing of it was being copied at the
     * stop) is Failed and safe at once; one with a unit stopped mid-copy is
     * held (Transferring) until the bound, then Failed and NOT safe. */
    int ended = 0, held = 0;
    double t_end = 0, t_safe = 0;
    while (ended < NR && kvbh_now() < t0 + ack_to + 5) {
        for (int j = 0; j < NR; j++) {
            if (guarded[j] || ended_at[j] > 0 || kvb_receiver_poll(rc[j]) != KVB_POLL_FAILED)
                continue;
            ended_at[j] = kvbh_now() - t0;
            ended++;
            kvb_receiver_failure(rc[j], why, sizeof(why));
            CHECK_STR_CONTAINS(why, "Aborted by AbortReq.");
            if (kvb_receiver_pages_safe(rc[j])) {
                guard_room(&d, R0 + (uint64_t)j);
                guarded[j] = 1;
                n_guarded++;
                t_safe = ended_at[j] > t_safe ? ended_at[j] : t_safe;
            } else {
                held++;
                CHECK(ended_at[j] >= ack_to && ended_at[j] < ack_to + 2.0);
                CHECK_STR_CONTAINS(why, "NOT safe to reuse");
                t_end = ended_at[j] > t_end ? ended_at[j] : t_end;
            }
        }
    }
    fprintf(stderr,
            "abort: %d rooms Failed: %d safe at once (last %.3f s after the abort), %d held "
            "unsafe until %.3f s (ack time-out %.1f s)\n",
            ended, n_guarded, t_safe, held, t_end, ack_to);
    CHECK_EQ(ended, NR);
    CHECK(t_safe < ack_to);
    dprintf(ch.to, "rest\n");
    double t_cont = kvbh_now();
    CHECK_EQ(kill(ch.pid, SIGCONT), 0);
    while (n_guarded < NR && kvbh_now() < t_cont + 10)
        for (int j = 0; j < NR; j++)
            if (!guarded[j] && kvb_receiver_pages_safe(rc[j])) {
                guard_room(&d, R0 + (uint64_t)j);
                guarded[j] = 1;
                n_guarded++;
            }
    fprintf(stderr, "abort: %d rooms safe %.3f s after SIGCONT\n", n_guarded, kvbh_now() - t_cont);
    CHECK_EQ(n_guarded, NR);
    dprintf(ch.to, "report\n");
    expect(&ch, "report ", line, sizeof(line), 60);
    kvbh_sleep(0.2);
    uint64_t broken = 0;
    for (int j = 0; j < NR; j++) {
        broken += guard_broken(&d, R0 + (uint64_t)j);
        kvb_receiver_destroy(rc[j]);
    }
    fprintf(stderr, "abort: prefill %s; %llu guard bytes overwritten\n", line,
            (unsigned long long)broken);
    CHECK_EQ(broken, (uint64_t)0);
    CHECK(strncmp(line, "report 0 ", 9) == 0); /* no aborted room ended Success */
    kvbh_child_close(&ch);
    kvbh_rank_stop(&d);
    kvbh_boot_stop(&bs);
    TEST_PASS("abort unconfirmed by a stopped prefill: bounded Failed, unsafe until confirmed");
}

int main(int argc, char **argv)
{
    setenv("KVBRIDGE_HEARTBEAT_FLOOR", "0.2", 1);
    setenv("KVBRIDGE_FENCE_WAIT", FENCE_WAIT_S, 1);
    if (kvbh_main_init(argc, argv))
        return argc >= 4 && strcmp(argv[2], "fprefill") == 0 ? child_prefill(argv[3]) : 2;
    if (argc >= 2 && strcmp(argv[1], "abort") == 0) {
        test_abort_unconfirmed();
        return 0;
    }
    char lane[16];
    if (argc < 2 || sscanf(argv[1], "%15[a-z]", lane) != 1 ||
        (strcmp(lane, "direct") && strcmp(lane, "shm") && strcmp(lane, "tcp")))
        return 2;
    g_nokey = strstr(argv[1], "-nokey") != NULL;
    g_ts = strstr(argv[1], "-ts") != NULL;
    if (g_nokey || g_ts) /* the prefill must not put its own route back */
        setenv("KVBRIDGE_BOOTSTRAP_REFRESH", "0", 1);
    test_fence(lane);
    return 0;
}
