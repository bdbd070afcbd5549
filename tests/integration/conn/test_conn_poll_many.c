/* kvb_sender_poll_many / kvb_receiver_poll_many and kvb_manager_event_fd:
 * 24 rooms from two prefill ranks to two decode ranks (TP 2 -> TP 2; the
 * handles of both managers of a side interleaved in one array, so runs of
 * one manager alternate), polled only in batches. Checks: each batch answer
 * is a valid state no later than the single poll right after it; every room
 * ends Success on both sides with every byte right; a decode's event fd
 * turns readable when its rooms change (and nothing is polled until it
 * does); an aborted room ends Failed through the batch as through
 * kvb_receiver_poll; bad arguments are refused without polling. */
#include "harness/kvb_cluster.h"
#include "kvb_test.h"

#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#define ROOMS 24
#define PAGES 4
#define FIRST 9100000ull

static kvb_receiver_h rc[2 * ROOMS];
static kvb_sender_h snd[2 * ROOMS];

/* Wait up to timeout_s for fd to be readable, then reset it; 1 if it was. */
static int event_wait(int fd, double timeout_s)
{
    struct pollfd p = {fd, POLLIN, 0};
    uint64_t v;
    int got = poll(&p, 1, (int)(timeout_s * 1000)) == 1;
    if (got)
        CHECK_EQ(read(fd, &v, sizeof(v)), (ssize_t)sizeof(v));
    return got;
}

/* Batch-poll n receivers until all are terminal (10 s), sleeping on the
 * event fds between passes; returns the number of Success. */
static int receivers_until_done(const int *efd, kvb_poll_t *pl)
{
    double end = kvbh_now() + 10;
    int done = 0, ok = 0, wakes = 0;
    while (done < 2 * ROOMS && kvbh_now() < end) {
        CHECK_EQ(kvb_receiver_poll_many(rc, 2 * ROOMS, pl), KVB_OK);
        done = ok = 0;
        for (int i = 0; i < 2 * ROOMS; i++) {
            CHECK(pl[i] >= KVB_POLL_FAILED && pl[i] <= KVB_POLL_SUCCESS);
            kvb_poll_t single = kvb_receiver_poll(rc[i]);
            CHECK(single >= pl[i] || single == KVB_POLL_FAILED); /* states only advance */
            done += pl[i] == KVB_POLL_SUCCESS || pl[i] == KVB_POLL_FAILED;
            ok += pl[i] == KVB_POLL_SUCCESS;
        }
        if (done < 2 * ROOMS)
            wakes += event_wait(efd[0], 0.05) + event_wait(efd[1], 0.05);
    }
    fprintf(stderr, "receivers: %d/%d Success after %d event-fd wakes\n", ok, 2 * ROOMS, wakes);
    return ok;
}

static void bad_arguments(void)
{
    kvb_poll_t pl[2];
    kvb_receiver_h one[2] = {rc[0], NULL};
    int fd = -1;
    pl[0] = pl[1] = (kvb_poll_t)77;
    CHECK_EQ(kvb_receiver_poll_many(NULL, 1, pl), KVB_ERR_INVALID);
    CHECK_EQ(kvb_receiver_poll_many(rc, 1, NULL), KVB_ERR_INVALID);
    CHECK_EQ(kvb_receiver_poll_many(one, 2, pl), KVB_ERR_INVALID);
    CHECK_EQ(kvb_sender_poll_many(NULL, 3, pl), KVB_ERR_INVALID);
    CHECK_EQ((int)pl[0], 77); /* nothing polled */
    CHECK_EQ(kvb_receiver_poll_many(NULL, 0, NULL), KVB_OK);
    CHECK_EQ(kvb_sender_poll_many(NULL, 0, NULL), KVB_OK);
    CHECK_EQ(kvb_manager_event_fd(NULL, &fd), KVB_ERR_INVALID);
}

int main(void)
{
    const kvbh_cluster_cfg_t cfg = {
        .g = {2, 2, 16, 4, 512, 0, 0}, .ptp = 2, .ppp = 1, .pdp = 1, .dtp = 2};
    kvbh_cluster_t c;
    kvb_poll_t pl[2 * ROOMS];
    int efd[2], again = -1;
    CHECK_EQ(kvbh_cluster_start(&c, &cfg), KVB_OK);
    kvbh_rank_t *p[2] = {kvbh_cluster_prefill(&c, 0, 0, 0), kvbh_cluster_prefill(&c, 0, 1, 0)};
    for (int k = 0; k < 2; k++) {
        CHECK_EQ(kvb_manager_event_fd(c.dec[k].mgr, &efd[k]), KVB_OK);
        CHECK(efd[k] >= 0);
    }
    CHECK_EQ(kvb_manager_event_fd(c.dec[0].mgr, &again), KVB_OK);
    CHECK_EQ(again, efd[0]); /* the same fd each time */
    while (event_wait(efd[0], 0) || event_wait(efd[1], 0))
        ;
    for (int j = 0; j < ROOMS; j++) { /* interleaved: d0 r0, d1 r0, d0 r1, ... */
        int32_t dst[PAGES];
        uint64_t room = FIRST + (uint64_t)j;
        kvbh_room_pages(&c.g, room, PAGES, NULL, dst);
        for (int k = 0; k < 2; k++) {
            CHECK_EQ(kvb_receiver_create(c.dec[k].mgr, c.boot_addr, room, -1, &rc[2 * j + k]),
                     KVB_OK);
            CHECK_EQ(kvb_receiver_init(rc[2 * j + k], dst, PAGES, kvbh_room_aux(room), NULL),
                     KVB_OK);
        }
    }
    bad_arguments();
    /* Senders: batch-poll until every one can take its pages. */
    int32_t src[ROOMS][PAGES];
    for (int j = 0; j < ROOMS; j++) {
        uint64_t room = FIRST + (uint64_t)j;
        kvbh_room_pages(&c.g, room, PAGES, src[j], NULL);
        for (int k = 0; k < 2; k++) {
            kvbh_fill(p[k], room, src[j], PAGES, kvbh_room_aux(room));
            CHECK_EQ(kvb_sender_create(p[k]->mgr, c.boot_addr, room, &snd[2 * j + k]), KVB_OK);
        }
    }
    int ready = 0;
    for (double end = kvbh_now() + 10; ready < 2 * ROOMS && kvbh_now() < end; kvbh_sleep(0.005)) {
        CHECK_EQ(kvb_sender_poll_many(snd, 2 * ROOMS, pl), KVB_OK);
        ready = 0;
        for (int j = 0; j < 2 * ROOMS; j++)
            ready += pl[j] == KVB_POLL_WAITING_FOR_INPUT;
    }
    CHECK_EQ(ready, 2 * ROOMS);
    /* Quiet decode managers: no event until the pages move. */
    while (event_wait(efd[0], 0.2) || event_wait(efd[1], 0))
        ;
    CHECK_EQ(event_wait(efd[0], 0.1), 0);
    for (int j = 0; j < ROOMS - 1; j++) { /* the last room is aborted instead */
        uint64_t room = FIRST + (uint64_t)j;
        for (int k = 0; k < 2; k++) {
            CHECK_EQ(kvb_sender_init(snd[2 * j + k], PAGES, kvbh_room_aux(room)), KVB_OK);
            CHECK_EQ(kvb_sender_send(snd[2 * j + k], src[j], PAGES), KVB_OK);
        }
    }
    CHECK_EQ(event_wait(efd[0], 5), 1); /* a change woke the decode */
    kvb_receiver_abort(rc[2 * (ROOMS - 1)]);
    kvb_receiver_abort(rc[2 * (ROOMS - 1) + 1]);
    CHECK_EQ(receivers_until_done(efd, pl), 2 * (ROOMS - 1));
    for (int k = 0; k < 2; k++) {
        CHECK_EQ(pl[2 * (ROOMS - 1) + k], KVB_POLL_FAILED);
        CHECK_EQ(kvb_receiver_poll(rc[2 * (ROOMS - 1) + k]), KVB_POLL_FAILED);
        char why[256] = "";
        kvb_receiver_failure(rc[2 * (ROOMS - 1) + k], why, sizeof(why));
        CHECK(strstr(why, "Aborted by AbortReq.") != NULL);
    }
    for (int j = 0; j < ROOMS - 1; j++) { /* every byte, on both decode ranks */
        int32_t dst[PAGES];
        uint64_t room = FIRST + (uint64_t)j;
        kvbh_room_pages(&c.g, room, PAGES, NULL, dst);
        for (int k = 0; k < 2; k++)
            CHECK_EQ(kvbh_verify(&c.dec[k], room, dst, PAGES, kvbh_room_aux(room)), 0);
    }
    int succ = 0;
    for (double end = kvbh_now() + 10; succ < 2 * (ROOMS - 1) && kvbh_now() < end;
         kvbh_sleep(0.005)) {
        CHECK_EQ(kvb_sender_poll_many(snd, 2 * (ROOMS - 1), pl), KVB_OK);
        succ = 0;
        for (int j = 0; j < 2 * (ROOMS - 1); j++)
            succ += pl[j] == KVB_POLL_SUCCESS;
    }
    CHECK_EQ(succ, 2 * (ROOMS - 1));
    CHECK_EQ(kvb_sender_poll_many(snd, 2 * (ROOMS - 1), pl), KVB_OK); /* terminal stays */
    for (int j = 0; j < 2 * (ROOMS - 1); j++)
        CHECK_EQ(pl[j], KVB_POLL_SUCCESS);
    for (int k = 0; k < 2; k++) /* the decode's abort reaches both prefill ranks */
        CHECK_EQ(kvbh_wait_sender(snd[2 * (ROOMS - 1) + k], 10), KVB_POLL_FAILED);
    for (int j = 0; j < 2 * ROOMS; j++)
        kvb_sender_destroy(snd[j]);
    for (int i = 0; i < 2 * ROOMS; i++)
        kvb_receiver_destroy(rc[i]);
    kvbh_cluster_stop(&c);
    TEST_PASS("batched polls agree with single polls; event fds wake on room changes");
    return 0;
}
