/* The writer fence on the device lane (CUDA IPC): a 48 MiB device-to-device
 * transfer runs in 16 MiB units on one copy thread, each held in flight for
 * KVB_CUDA_DOUBLE_SLOW_MS by the test double. The target revokes the grant
 * while the first unit is in flight: the revoke returns only once that unit
 * is done (its busy count in the fence page), the transfer ends
 * KVB_ERR_FENCED, the units after the revoke never land, and nothing changes
 * after the revoke returned. With KVB_CUDA_TEST_VMM the target's allocation
 * is VMM memory (exported as a file descriptor, mapped here). */
#include "cuda/cuda_test.h"
#include "kvb_test_engine.h"

#include <time.h>

#define LEN (48u << 20)
#define UNIT (16u << 20)

int main(void)
{
    tgt_t t = tgt_start(KVB_TRANSPORT_AUTO, LEN); /* first: fork before any thread */
    kvb_engine_h w = kvb_test_engine(KVB_TRANSPORT_AUTO, 1);
    uint8_t *src = cuda_test_alloc(0, LEN);
    cuda_test_fill(src, LEN, 9);
    CHECK_EQ(kvb_engine_register(w, src, LEN, KVB_MEM_CUDA), KVB_OK);
    kvb_engine_set_writer_tag(w, 3);
    uint64_t ep = tgt_grant(&t, 3);
    kvb_block_t b = {(uint64_t)(uintptr_t)src, t.dev_addr, LEN};
    kvb_write_params_t p = {.field_mask = KVB_WRITE_PARAM_EPOCH, .epoch = ep};
    kvb_xfer_h x;
    CHECK_EQ(kvb_engine_write_async_ex(w, t.sid, &b, 1, &p, &x), KVB_OK);
    CHECK_EQ(kvb_engine_session_direct(w, t.sid), 1);
    struct timespec ts = {0, 150 * 1000 * 1000};
    nanosleep(&ts, NULL); /* the first unit is in flight (400 ms) */
    double t0 = kvb_test_now_s();
    CHECK_EQ(tgt_revoke(&t, 3, ep), KVB_OK);
    double waited = kvb_test_now_s() - t0;
    fprintf(stderr, "revoke returned after %.3f s\n", waited);
    CHECK(waited > 0.1); /* it waited for the unit in flight */
    CHECK_EQ(kvb_xfer_wait(x, 10.0), KVB_ERR_FENCED);
    CHECK_STR_CONTAINS(kvb_xfer_error(x), "writer fenced");
    kvb_xfer_free(x);
    uint8_t *a = tgt_read(&t, t.dev_addr, LEN);
    nanosleep(&ts, NULL);
    uint8_t *again = tgt_read(&t, t.dev_addr, LEN);
    CHECK(memcmp(a, again, LEN) == 0); /* nothing lands after the revoke */
    for (size_t i = 0; i < UNIT; i++)  /* the unit admitted before the revoke */
        CHECK_EQ(a[i], cuda_test_byte(9, i));
    for (size_t i = UNIT; i < LEN; i++) /* the rest never */
        CHECK_EQ(a[i], 0);
    TEST_PASS("device lane fenced between units");
    free(a);
    free(again);
    kvb_engine_destroy(w);
    tgt_stop(&t);
    return 0;
}
