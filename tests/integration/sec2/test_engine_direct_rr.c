/* Review finding 1.11: the direct lane's copy threads worked only on the
 * head of one queue, so a large transfer held up every other transfer (to
 * any session), and a cancel of a queued one was seen only when it reached
 * the head. Now the head gives one unit and goes to the back: a small
 * transfer queued behind a large one ends while the large one still runs,
 * and so does a cancelled one. One copy thread, in-process targets on
 * kvb_mem_alloc memory. */
#include "kvb_test.h"
#include "kvb_test_engine.h"

#include <kvbridge/engine.h>
#include <stdbool.h>
#include <stdlib.h>

#define MiB (1u << 20)
#define BIG (128u * MiB)

static uint8_t *target(kvb_engine_h t, size_t len)
{
    void *m = NULL;
    CHECK_EQ(kvb_mem_alloc(len, &m), KVB_OK);
    CHECK_EQ(kvb_engine_register(t, m, len, KVB_MEM_HOST), KVB_OK);
    return m;
}

/* Start big, then x behind it; when x ends, is big still running? */
static void behind_big(kvb_engine_h w, uint8_t *src, const char *sid1, uint8_t *d1,
                       const char *sid2, uint8_t *d2, kvb_block_t *small, bool cancel)
{
    kvb_block_t big = {(uint64_t)(uintptr_t)src, (uint64_t)(uintptr_t)d1, BIG};
    kvb_xfer_h xb = NULL, xs = NULL;
    (void)d2;
    CHECK_EQ(kvb_engine_write_async(w, sid1, &big, 1, &xb), KVB_OK);
    CHECK_EQ(kvb_engine_write_async(w, sid2, small, 1, &xs), KVB_OK);
    if (cancel)
        kvb_xfer_cancel(xs);
    double t0 = kvb_test_now_s();
    kvb_status_t ss = kvb_xfer_wait(xs, 10.0);
    double t_small = kvb_test_now_s() - t0;
    kvb_status_t sb_then = kvb_xfer_test(xb);
    kvb_status_t sb = kvb_xfer_wait(xb, 10.0);
    double t_big = kvb_test_now_s() - t0;
    fprintf(stderr,
            "%s transfer behind a %u MiB one: %s after %.3f s (the big one then %s, "
            "done after %.3f s)\n",
            cancel ? "cancelled" : "64 KiB", BIG / MiB, kvb_status_string(ss), t_small,
            kvb_status_string(sb_then), t_big);
    CHECK_EQ(ss, cancel ? KVB_ERR_CANCELED : KVB_OK);
    CHECK_EQ(sb, KVB_OK);
    CHECK_EQ(sb_then, KVB_ERR_INPROGRESS);
    kvb_xfer_free(xs);
    kvb_xfer_free(xb);
}

int main(void)
{
    kvb_engine_h w = kvb_test_engine(KVB_TRANSPORT_AUTO, 1),
                 t1 = kvb_test_engine(KVB_TRANSPORT_AUTO, 0),
                 t2 = kvb_test_engine(KVB_TRANSPORT_AUTO, 0);
    uint8_t *src = malloc(BIG);
    CHECK(src != NULL);
    memset(src, 0x6b, BIG);
    CHECK_EQ(kvb_engine_register(w, src, BIG, KVB_MEM_HOST), KVB_OK);
    uint8_t *d1 = target(t1, BIG), *d2 = target(t2, 4 * MiB);
    char sid1[64], sid2[64];
    snprintf(sid1, sizeof(sid1), "%s", kvb_engine_session_id(t1));
    snprintf(sid2, sizeof(sid2), "%s", kvb_engine_session_id(t2));
    kvb_block_t small = {(uint64_t)(uintptr_t)src, (uint64_t)(uintptr_t)d2, 64 * 1024};
    kvb_block_t first = {(uint64_t)(uintptr_t)src, (uint64_t)(uintptr_t)d1, 4096};
    CHECK_EQ(kvb_engine_write(w, sid1, &first, 1, 5.0), KVB_OK);
    CHECK_EQ(kvb_engine_write(w, sid2, &small, 1, 5.0), KVB_OK);
    if (kvb_engine_session_direct(w, sid1) != 1 || kvb_engine_session_direct(w, sid2) != 1) {
        fprintf(stderr, "skip: no direct lane here\n");
        return 77;
    }
    behind_big(w, src, sid1, d1, sid2, d2, &small, false);
    CHECK_EQ(d2[64 * 1024 - 1], 0x6b);
    CHECK_EQ(d1[BIG - 1], 0x6b);
    memset(d2, 0, 4 * MiB);
    small.dst += MiB;
    behind_big(w, src, sid1, d1, sid2, d2, &small, true);
    kvb_engine_destroy(w);
    kvb_engine_destroy(t1);
    kvb_engine_destroy(t2);
    free(src);
    TEST_PASS("test_engine_direct_rr");
    return 0;
}
