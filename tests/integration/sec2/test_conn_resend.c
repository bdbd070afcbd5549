/* Review finding 1.3: a second transfer info from the same decode while the
 * room's chunks are being written. The prefill plans every chunk from the
 * room's destination page arrays without its lock; replacing them then was a
 * use-after-free, and later chunks went to the new pages while the earlier
 * ones sat in the old. Now the re-send is refused once a chunk was queued:
 * every byte lands in the first pre-allocation, the other pages stay zero. */
#include "harness/kvb_cluster.h"
#include "kvb_test.h"

static const kvbh_geom_t G = {2, 2, 32, 4, 256, 0, 0};

/* Bytes of pages dst[0..n) of every KV buffer on d that are not zero. */
static uint64_t nonzero(const kvbh_rank_t *d, const int32_t *dst, int n)
{
    uint64_t bad = 0;
    for (int b = 0; b < d->n_kv; b++)
        for (int i = 0; i < n; i++)
            for (uint64_t k = 0; k < d->item_len; k++)
                bad += d->kv[b][(uint64_t)dst[i] * d->item_len + k] != 0;
    return bad;
}

static void resend_room(kvbh_rank_t *p, kvbh_rank_t *d, const char *boot, uint64_t room)
{
    enum { N = 16 };
    int32_t src[N], first[N], second[N];
    for (int i = 0; i < N; i++) {
        src[i] = 10 + i;
        first[i] = 100 + (N - 1 - i);
        second[i] = 150 + i;
    }
    kvb_receiver_h rc = NULL;
    kvb_sender_h s = NULL;
    CHECK_EQ(kvb_receiver_create(d->mgr, boot, room, -1, &rc), KVB_OK);
    CHECK_EQ(kvb_receiver_init(rc, first, N, 1, NULL), KVB_OK);
    kvbh_fill(p, room, src, N, 1);
    CHECK_EQ(kvb_sender_create(p->mgr, boot, room, &s), KVB_OK);
    CHECK_EQ(kvbh_wait_sender_ready(s, 10), 0);
    CHECK_EQ(kvb_sender_init(s, N, 1), KVB_OK);
    CHECK_EQ(kvb_sender_send(s, src, N / 2), KVB_OK);
    /* The same decode again with another pre-allocation while the first
     * chunk is queued or written; give the control thread time to take it
     * (bounded), then send the rest. */
    CHECK_EQ(kvb_receiver_init(rc, second, N, 1, NULL), KVB_OK);
    kvbh_sleep(0.3);
    CHECK_EQ(kvb_sender_send(s, src + N / 2, N - N / 2), KVB_OK);
    CHECK_EQ(kvbh_wait_sender(s, 10), KVB_POLL_SUCCESS);
    CHECK_EQ(kvbh_wait_receiver(rc, 10), KVB_POLL_SUCCESS);
    uint64_t bad = kvbh_verify(d, room, first, N, 1);
    uint64_t stray = nonzero(d, second, N);
    fprintf(stderr,
            "room %llu: %llu wrong bytes in the first pre-allocation, %llu written into "
            "the refused one\n",
            (unsigned long long)room, (unsigned long long)bad, (unsigned long long)stray);
    CHECK_EQ(bad, 0);
    CHECK_EQ(stray, 0);
    kvb_sender_destroy(s);
    kvb_receiver_destroy(rc);
}

int main(void)
{
    kvbh_pair_t pr;
    CHECK_EQ(kvbh_pair_start(&pr, &G, KVBH_MEM_MALLOC, NULL, NULL), KVB_OK);
    kvbh_rank_t *p = &pr.pre, *d = &pr.dec;
    const char *boot = pr.boot.addr;
    resend_room(p, d, boot, 7);
    /* The manager still serves ordinary rooms afterwards. */
    CHECK_EQ(kvbh_run_room(p, d, boot, 8, 8, 40, 200, 2), 0);
    kvbh_pair_stop(&pr);
    TEST_PASS("test_conn_resend");
    return 0;
}
