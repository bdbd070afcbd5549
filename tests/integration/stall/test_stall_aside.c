/* Prefill queue head-of-line blocking (review §3, issue 16 §4): one prefill
 * rank with ONE transfer queue serves two decode processes, A and B. A is
 * SIGSTOPped (after one room each, so both sessions are connected: a first
 * write's connect to a stopped peer blocks the worker in submit for the
 * connect time-out, a separate limit); then a room for A and a room for B
 * are sent, A's first, so
 * B's chunk waits behind A's in the same queue. A's writes cannot settle (a
 * stopped target never acknowledges). Before the aside thread the worker
 * waited 2 x KVBRIDGE_TRANSFER_TIMEOUT (here 20 s) before B's chunk could
 * run; now A's chunk is set aside after KVBRIDGE_STALL_ASIDE (1 s) and B's
 * room must end Success on both sides within STALL_BOUND_S. After SIGCONT,
 * A's room must end Success too (the aside thread settles it). Timings are
 * logged. Run with KVBRIDGE_STALL_ASIDE=0 to see the old wait (about 20 s
 * or more: the bound then fails). */
#include "harness/kvb_cluster.h"
#include "kvb_test.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define RA 4100ull
#define RB 4200ull
#define NP 4
#define STALL_BOUND_S 4.0 /* 1 s aside bound + slack for 2 loaded cores / sanitizers */

static kvb_sender_h sender_for(kvbh_rank_t *p, uint64_t room, int32_t *src)
{
    kvb_sender_h s = NULL;
    kvbh_room_pages(&p->g, room, NP, src, NULL);
    kvbh_fill(p, room, src, NP, kvbh_room_aux(room));
    CHECK_EQ(kvb_sender_create(p->mgr, "x", room, &s), KVB_OK);
    CHECK_EQ(kvbh_wait_sender_ready(s, 10), 0);
    CHECK_EQ(kvb_sender_init(s, NP, kvbh_room_aux(room)), KVB_OK);
    return s;
}

/* The decode child's "room R STATUS reason" line for its one room. */
static int decode_outcome(kvbh_child_t *c, uint64_t room, double timeout_s)
{
    char line[600], want[64];
    snprintf(want, sizeof(want), "room %llu ", (unsigned long long)room);
    if (kvbh_child_line(c, line, sizeof(line), timeout_s) != 0)
        return -1;
    fprintf(stderr, "decode: %s\n", line);
    return strncmp(line, want, strlen(want)) == 0 ? atoi(line + strlen(want)) : -1;
}

int main(int argc, char **argv)
{
    if (kvbh_main_init(argc, argv))
        return kvbh_child_main(argc, argv);
    setenv("KVBRIDGE_QUEUE_SIZE", "1", 1); /* both decodes share the one queue */
    setenv("KVBRIDGE_TRANSFER_TIMEOUT", "10", 1);
    kvbh_boot_t b;
    kvbh_rank_t p;
    kvbh_child_t da, db;
    int32_t sa[NP], sb[NP];
    const kvbh_geom_t g = kvbh_child_geom();
    CHECK_EQ(kvbh_boot_start(&b, 0, NULL), 0);
    CHECK_EQ(kvbh_rank_start(&p, &g, KVB_MODE_PREFILL, b.addr, KVBH_MEM_MALLOC, NULL), KVB_OK);
    CHECK_EQ(kvbh_spawn_decode(&da, b.addr, -1, RA, 2, NP), 0);
    CHECK_EQ(kvbh_spawn_decode(&db, b.addr, -1, RB, 2, NP), 0);
    kvb_sender_h w[2] = {sender_for(&p, RA, sa), sender_for(&p, RB, sb)};
    CHECK_EQ(kvb_sender_send(w[0], sa, NP), KVB_OK); /* warm: sessions connected */
    CHECK_EQ(kvb_sender_send(w[1], sb, NP), KVB_OK);
    CHECK_EQ(kvbh_wait_sender(w[0], 10), KVB_POLL_SUCCESS);
    CHECK_EQ(kvbh_wait_sender(w[1], 10), KVB_POLL_SUCCESS);
    CHECK_EQ(decode_outcome(&da, RA, 10), KVB_POLL_SUCCESS);
    CHECK_EQ(decode_outcome(&db, RB, 10), KVB_POLL_SUCCESS);
    kvb_sender_h a = sender_for(&p, RA + 1, sa), s = sender_for(&p, RB + 1, sb);
    CHECK_EQ(kill(da.pid, SIGSTOP), 0);
    kvbh_wait_stopped(da.pid);
    double t0 = kvbh_now();
    CHECK_EQ(kvb_sender_send(a, sa, NP), KVB_OK); /* first in the queue: stalls */
    CHECK_EQ(kvb_sender_send(s, sb, NP), KVB_OK);
    kvb_poll_t pb = kvbh_wait_sender(s, 30);
    double t_b = kvbh_now() - t0;
    int db_status = decode_outcome(&db, RB + 1, 10);
    fprintf(stderr,
            "stall: decode A stopped; room of healthy decode B: sender %s after %.2f s (bound "
            "%.1f s; aside after KVBRIDGE_STALL_ASIDE, default 1 s), decode B status %d\n",
            kvb_poll_string(pb), t_b, STALL_BOUND_S, db_status);
    CHECK_EQ(pb, KVB_POLL_SUCCESS);
    CHECK_EQ(db_status, KVB_POLL_SUCCESS);
    CHECK(t_b <= STALL_BOUND_S);
    CHECK(kvb_sender_poll(a) != KVB_POLL_SUCCESS); /* A's room is still open */
    double t_cont = kvbh_now();
    CHECK_EQ(kill(da.pid, SIGCONT), 0);
    kvb_poll_t pa = kvbh_wait_sender(a, 30);
    int da_status = decode_outcome(&da, RA + 1, 10);
    fprintf(stderr,
            "stall: after SIGCONT (%.2f s stopped) room of A: sender %s after %.2f s, "
            "decode A status %d\n",
            t_cont - t0, kvb_poll_string(pa), kvbh_now() - t_cont, da_status);
    CHECK_EQ(pa, KVB_POLL_SUCCESS);
    CHECK_EQ(da_status, KVB_POLL_SUCCESS);
    kvb_sender_destroy(a);
    kvb_sender_destroy(s);
    kvb_sender_destroy(w[0]);
    kvb_sender_destroy(w[1]);
    kvbh_child_close(&da);
    kvbh_child_close(&db);
    kvbh_rank_stop(&p);
    kvbh_boot_stop(&b);
    TEST_PASS("a stopped decode does not hold another decode's room in the shared queue");
    return 0;
}
