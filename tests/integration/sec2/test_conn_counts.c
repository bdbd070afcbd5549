/* Review finding 2.6: API-side counts whose byte sizes or running sums
 * wrap. kvb_sender_send checked cur + count > num_kv_indices, which wraps
 * for a huge count once a chunk was sent (the copy size wrapped too);
 * kvb_engine_write_async multiplied count by the element size unchecked.
 * Both now refuse with a clear status before allocating. */
#include "harness/kvb_cluster.h"
#include "kvb_test.h"

#include <stdint.h>

static const kvbh_geom_t G = {2, 2, 32, 4, 64, 0, 0};

int main(void)
{
    kvbh_pair_t pr;
    CHECK_EQ(kvbh_pair_start(&pr, &G, KVBH_MEM_MALLOC, NULL, NULL), KVB_OK);
    kvbh_rank_t *p = &pr.pre, *d = &pr.dec;
    const char *boot = pr.boot.addr;

    int32_t src[4] = {1, 2, 3, 4}, dst[4] = {5, 6, 7, 8};
    kvb_receiver_h rc = NULL;
    kvb_sender_h s = NULL;
    CHECK_EQ(kvb_receiver_create(d->mgr, boot, 3, -1, &rc), KVB_OK);
    CHECK_EQ(kvb_receiver_init(rc, dst, 4, 0, NULL), KVB_OK);
    CHECK_EQ(kvb_sender_create(p->mgr, boot, 3, &s), KVB_OK);
    CHECK_EQ(kvbh_wait_sender_ready(s, 10), 0);
    CHECK_EQ(kvb_sender_init(s, 4, 0), KVB_OK);
    CHECK_EQ(kvb_sender_send(s, src, 1), KVB_OK);
    /* 1 + SIZE_MAX wraps to 0 */
    kvb_status_t st = kvb_sender_send(s, src, SIZE_MAX);
    fprintf(stderr, "send of SIZE_MAX indices at 1 of 4: %s (%s)\n", kvb_status_string(st),
            kvb_manager_last_error(p->mgr));
    CHECK_EQ(st, KVB_ERR_STATE);
    CHECK_STR_CONTAINS(kvb_manager_last_error(p->mgr), "past num_kv_indices");
    CHECK_EQ(kvb_sender_send(s, src + 1, 3), KVB_OK); /* the room goes on */
    CHECK_EQ(kvbh_wait_sender(s, 10), KVB_POLL_SUCCESS);
    CHECK_EQ(kvbh_wait_receiver(rc, 10), KVB_POLL_SUCCESS);
    kvb_sender_destroy(s);
    kvb_receiver_destroy(rc);

    kvb_block_t blk = {0, 0, 0};
    kvb_xfer_h x = NULL;
    st = kvb_engine_write_async(p->eng, kvb_engine_session_id(d->eng), &blk,
                                SIZE_MAX / sizeof(long) + 2, &x);
    fprintf(stderr, "write_async of SIZE_MAX/8+2 blocks: %s (%s)\n", kvb_status_string(st),
            kvb_engine_last_error(p->eng));
    CHECK_EQ(st, KVB_ERR_INVALID);
    CHECK_STR_CONTAINS(kvb_engine_last_error(p->eng), "too many");
    kvbh_pair_stop(&pr);
    TEST_PASS("test_conn_counts");
    return 0;
}
