/* Fault injection and hostile peers of issue 8 (§3, §4):
 *  sigstop  a prefill process stopped past the heartbeat bound, then resumed:
 *           the decode declares it lost within interval x misses + 1 s; the
 *           pages of the lost rooms must not change any more (abort fence);
 *           the resumed prefill serves a new room (bytes verified);
 *  hostile  raw TCP peers against an engine's handshake listener (garbage,
 *           truncated headers, huge lengths, slow-loris, many connections):
 *           a well-formed writer is still served, fds and memory bounded;
 *  slowpeer a decode process stopped (its control socket unread) while the
 *           prefill keeps sending: prefill queues/memory bounded, rooms fail;
 *  netns    prefill and decode in two network namespaces joined by a veth
 *           pair; the link is taken down mid-transfer (skipped, exit 77,
 *           where namespaces cannot be created).
 * Child processes are this executable run with --child. */
#include "../conn_fault/fault_util.h"
#include "kvb_test.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

static const fgeom_t G = {2, 2, 32, 4, 256};
static const char *g_self;

#define LOST_FMT "Losing connection with prefill instance (bootstrap_addr: %s)"

static int32_t dst_page(uint64_t room, int i)
{
    return (int32_t)(((room % 16) * 16 + (uint64_t)i) % G.pool_pages);
}

static int32_t src_page(uint64_t room, int i)
{
    return (int32_t)(((room % 16) * 16 + 15 - (uint64_t)i) % G.pool_pages);
}

/* ---- child: prefill with its bootstrap server ---- */

#define MAXR 64

struct late {
    kvb_sender_h *snd;
    uint64_t first;
    int count, n;
    double delay;
};

static void *late_main(void *arg)
{
    struct late *l = arg;
    fsleep(l->delay); /* CLOCK_MONOTONIC runs on while the process is stopped */
    for (int j = 0; j < l->count; j++) {
        int32_t src[16];
        uint64_t room = l->first + (uint64_t)j;
        for (int i = 0; i < l->n; i++)
            src[i] = src_page(room, i);
        kvb_sender_send(l->snd[j], src + l->n / 2, (size_t)(l->n - l->n / 2));
    }
    printf("late");
    for (int j = 0; j < l->count; j++)
        printf(" %s", kvb_poll_string(fwait_sender(l->snd[j], 5)));
    printf("\n");
    fflush(stdout);
    return NULL;
}

/* Commands on stdin: "rooms FIRST COUNT N" (sender per room, first half of
 * the pages sent; answers "sent"), "later DELAY" (a thread sends the second
 * halves after DELAY s; answers "armed", then "late S..." once done),
 * "full FIRST COUNT N" (whole rooms; answers "sent"). */
static int child_prefill(void)
{
    kvb_bootstrap_server_params_t bp = {KVB_BOOTSTRAP_SERVER_PARAM_PORT, NULL, 0, NULL, 0, 0, 0};
    kvb_bootstrap_server_h boot;
    frank_t p;
    char line[256], cmd[32];
    unsigned long long first = 0;
    int count = 0, n = 0;
    kvb_sender_h snd[MAXR] = {0};
    struct late l = {snd, 0, 0, 0, 0};
    pthread_t thr;
    int have_thr = 0;
    if (kvb_bootstrap_server_start(&bp, &boot) != KVB_OK)
        return 3;
    if (frank_start(&p, &G, KVB_MODE_PREFILL, kvb_bootstrap_server_address(boot), -1, NULL) != 0)
        return 4;
    printf("boot %s\n", kvb_bootstrap_server_address(boot));
    fflush(stdout);
    while (fgets(line, sizeof(line), stdin) != NULL) {
        double delay;
        if (sscanf(line, "later %lf", &delay) == 1 && !have_thr) {
            l.first = first;
            l.count = count;
            l.n = n;
            l.delay = delay;
            have_thr = pthread_create(&thr, NULL, late_main, &l) == 0;
            printf("armed\n");
            fflush(stdout);
            continue;
        }
        if (sscanf(line, "%31s %llu %d %d", cmd, &first, &count, &n) != 4 || count > MAXR || n > 16)
            continue;
        for (int j = 0; j < count; j++) {
            uint64_t room = first + (uint64_t)j;
            int32_t src[16];
            for (int i = 0; i < n; i++)
                src[i] = src_page(room, i);
            ffill(&p, room, src, n, (int)(room % FR_AUX_ITEMS));
            if (kvb_sender_create(p.mgr, "x", room, &snd[j]) != KVB_OK ||
                fwait_sender_ready(snd[j], 10) != 0) {
                printf("error room %llu not ready\n", (unsigned long long)room);
                fflush(stdout);
                continue;
            }
            kvb_sender_init(snd[j], (uint64_t)n, (int64_t)(room % FR_AUX_ITEMS));
            kvb_sender_send(snd[j], src, (size_t)(strcmp(cmd, "full") == 0 ? n : n / 2));
        }
        printf("sent\n");
        fflush(stdout);
    }
    if (have_thr)
        pthread_join(thr, NULL);
    return 0;
}

static int child_main(int argc, char **argv)
{
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (argc >= 3 && strcmp(argv[2], "prefill") == 0)
        return child_prefill();
    return 2;
}

/* ---- 1. SIGSTOP of a prefill past the heartbeat bound ---- */

static void test_sigstop(void)
{
    const double interval = 0.2, stop_s = 2.5;
    const int misses = 2, NR = 4, NP = 8;
    const uint64_t R0 = 100;
    fknobs_t k = {interval, misses, 0, 0};
    fchild_t ch;
    frank_t d;
    char line[512], boot[128], expect[256], why[512];
    kvb_receiver_h rc[4];
    char *args[] = {"--child", "prefill", NULL};
    CHECK_EQ(fchild_spawn(&ch, g_self, args), 0);
    CHECK_EQ(fchild_line(&ch, line, sizeof(line), 20), 0);
    CHECK_EQ(sscanf(line, "boot %127s", boot), 1);
    CHECK_EQ(frank_start(&d, &G, KVB_MODE_DECODE, NULL, -1, &k), 0);
    for (int j = 0; j < NR; j++) {
        int32_t dst[8];
        for (int i = 0; i < NP; i++)
            dst[i] = dst_page(R0 + (uint64_t)j, i);
        CHECK_EQ(kvb_receiver_create(d.mgr, boot, R0 + (uint64_t)j, -1, &rc[j]), KVB_OK);
        kvb_receiver_init(rc[j], dst, (size_t)NP, (int64_t)((R0 + (uint64_t)j) % FR_AUX_ITEMS),
                          NULL);
    }
    dprintf(ch.to, "rooms %llu %d %d\n", (unsigned long long)R0, NR, NP);
    CHECK_EQ(fchild_line(&ch, line, sizeof(line), 20), 0);
    CHECK(strcmp(line, "sent") == 0);
    fsleep(0.2); /* first halves land; nothing terminal */
    for (int j = 0; j < NR; j++)
        CHECK_EQ(kvb_receiver_poll(rc[j]), KVB_POLL_WAITING_FOR_INPUT);
    /* the second halves are sent 0.3 s from now, i.e. right after SIGCONT */
    dprintf(ch.to, "later 0.3\n");
    CHECK_EQ(fchild_line(&ch, line, sizeof(line), 10), 0);
    CHECK(strcmp(line, "armed") == 0);
    double t0 = fnow(), t_last = 0;
    CHECK_EQ(kill(ch.pid, SIGSTOP), 0);
    int left = NR, done[4] = {0};
    while (left > 0 && fnow() < t0 + stop_s) {
        for (int j = 0; j < NR; j++) {
            kvb_poll_t p = kvb_receiver_poll(rc[j]);
            if (done[j] || p == KVB_POLL_WAITING_FOR_INPUT || p == KVB_POLL_TRANSFERRING)
                continue;
            CHECK_EQ(p, KVB_POLL_FAILED);
            done[j] = 1;
            left--;
            t_last = fnow() - t0;
        }
        fsleep(0.002);
    }
    if (left != 0)
        kill(ch.pid, SIGCONT);
    CHECK_EQ(left, 0);
    snprintf(expect, sizeof(expect), LOST_FMT, boot);
    for (int j = 0; j < NR; j++) {
        kvb_receiver_failure(rc[j], why, sizeof(why));
        if (strcmp(why, expect) != 0)
            fprintf(stderr, "room %llu failed with: %s\n", (unsigned long long)R0 + j, why);
        CHECK(strcmp(why, expect) == 0);
    }
    fprintf(stderr, "sigstop: rooms Failed %.3f s after SIGSTOP (bound %.3f s)\n", t_last,
            interval * misses + 1.0);
    CHECK(t_last <= interval * misses + 1.0);
    /* The scheduler frees the rooms and may hand their pages to new requests
     * at once: mark them as reused, snapshot the whole arena. */
    for (int j = 0; j < NR; j++) {
        uint64_t room = R0 + (uint64_t)j;
        kvb_receiver_destroy(rc[j]);
        for (int b = 0; b < d.n_kv; b++)
            for (int i = 0; i < NP; i++)
                memset(d.kv[b] + (uint64_t)dst_page(room, i) * d.item_len, 0x3C, d.item_len);
        memset(d.aux + (room % FR_AUX_ITEMS) * FR_AUX_ITEM, 0x3C, FR_AUX_ITEM);
    }
    uint8_t *snap = malloc(d.arena_len);
    CHECK(snap != NULL);
    memcpy(snap, d.arena, d.arena_len);
    while (fnow() < t0 + stop_s)
        fsleep(0.01);
    CHECK_EQ(kill(ch.pid, SIGCONT), 0);
    fprintf(stderr, "sigstop: prefill stopped %.2f s, resumed\n", fnow() - t0);
    /* the resumed prefill sends the second halves; wait for its report */
    CHECK_EQ(fchild_line(&ch, line, sizeof(line), 15), 0);
    fprintf(stderr, "sigstop: resumed prefill's late sends ended: %s\n", line);
    fsleep(0.3);
    /* The resumed prefill serves a new room (other pages). */
    kvb_receiver_h r2;
    int32_t dst[8];
    const uint64_t RN = 120;
    for (int i = 0; i < NP; i++)
        dst[i] = dst_page(RN, i);
    CHECK_EQ(kvb_receiver_create(d.mgr, boot, RN, -1, &r2), KVB_OK);
    kvb_receiver_init(r2, dst, (size_t)NP, (int64_t)(RN % FR_AUX_ITEMS), NULL);
    dprintf(ch.to, "full %llu 1 %d\n", (unsigned long long)RN, NP);
    CHECK_EQ(fchild_line(&ch, line, sizeof(line), 20), 0);
    CHECK(strcmp(line, "sent") == 0);
    CHECK_EQ(fwait_receiver(r2, 10), KVB_POLL_SUCCESS);
    CHECK_EQ(fverify(&d, RN, dst, NP, (int)(RN % FR_AUX_ITEMS)), (uint64_t)0);
    kvb_receiver_destroy(r2);
    CHECK(fcanaries_ok(&d, "decode"));
    fprintf(stderr, "sigstop: the resumed prefill served room %llu (bytes verified)\n",
            (unsigned long long)RN);
    /* Last: the abort fence. The pages (and aux items) of the rooms reported
     * Failed must not have changed since. */
    size_t changed = 0;
    for (int j = 0; j < NR; j++) {
        uint64_t room = R0 + (uint64_t)j;
        size_t n = 0;
        for (int b = 0; b < d.n_kv; b++)
            for (int i = 0; i < NP; i++) {
                size_t o = (size_t)(d.kv[b] - d.arena) + (uint64_t)dst_page(room, i) * d.item_len;
                for (uint64_t q = 0; q < d.item_len; q++)
                    n += snap[o + q] != d.arena[o + q];
            }
        size_t o = (size_t)(d.aux - d.arena) + (room % FR_AUX_ITEMS) * FR_AUX_ITEM;
        for (uint64_t q = 0; q < FR_AUX_ITEM; q++)
            n += snap[o + q] != d.arena[o + q];
        if (n != 0)
            fprintf(stderr, "room %llu: %zu bytes of its reused pages/aux changed\n",
                    (unsigned long long)room, n);
        changed += n;
    }
    if (changed != 0)
        fprintf(stderr,
                "FENCE BUG: %zu bytes changed in the pages of rooms %llu..%llu after the decode "
                "declared the prefill lost and reported them Failed: the resumed prefill's "
                "writes landed in pages the decode had reused\n",
                changed, (unsigned long long)R0, (unsigned long long)R0 + NR - 1);
    CHECK_EQ(changed, (size_t)0);
    free(snap);
    fchild_close(&ch);
    frank_stop(&d);
    TEST_PASS("SIGSTOP of a prefill: lost within the bound, fence held, resumed prefill serves");
}

int main(int argc, char **argv)
{
    g_self = argv[0];
    setenv("KVBRIDGE_HEARTBEAT_FLOOR", "0.2", 1);
    if (argc >= 2 && strcmp(argv[1], "--child") == 0)
        return child_main(argc, argv);
    signal(SIGPIPE, SIG_IGN);
    const char *which = argc >= 2 ? argv[1] : "sigstop";
    if (strcmp(which, "sigstop") == 0)
        test_sigstop();
    else
        return 2;
    return 0;
}
