/* The writer's staging memory is a bounded ring (KVBRIDGE_CUDA_STAGE_RING,
 * whole KVBRIDGE_CUDA_STAGE_CHUNKs), against the driver-API test double over
 * the tcp transport (the staging lane): transfers of many times the ring's
 * size, device to device and mixed with host sources in blocks that do not
 * fall on chunk boundaries, land byte for byte in a forked target's device
 * memory, while the writer's pinned memory (the double's cuMemHostAlloc
 * total) never exceeds the ring. A ring the size of the transfer, as before,
 * fails the check. */
#include "cuda/cuda_test.h"
#include "kvb_test_engine.h"

#define LEN (24u << 20)
#define RING (4u << 20)
#define ODD ((3u << 20) + 123) /* a block length off every chunk boundary */

int main(void)
{
    setenv("KVBRIDGE_CUDA_STAGE_CHUNK", "1048576", 1);
    setenv("KVBRIDGE_CUDA_STAGE_RING", "4194304", 1);
    setenv("KVBRIDGE_AM_CHUNK", "1048576", 1);   /* several messages per ring */
    tgt_t t = tgt_start(KVB_TRANSPORT_TCP, LEN); /* first: fork before any thread */
    kvb_engine_h w = kvb_test_engine(KVB_TRANSPORT_TCP, 2);
    uint8_t *sd = cuda_test_alloc(0, LEN), *sh = malloc(LEN), *want = malloc(LEN);
    CHECK(sh != NULL && want != NULL);
    cuda_test_fill(sd, LEN, 7);
    for (size_t i = 0; i < LEN; i++) {
        sh[i] = cuda_test_byte(8, i);
        want[i] = cuda_test_byte(7, i);
    }
    CHECK_EQ(kvb_engine_register(w, sd, LEN, KVB_MEM_CUDA), KVB_OK);
    CHECK_EQ(kvb_engine_register(w, sh, LEN, KVB_MEM_HOST), KVB_OK);
    kvb_cuda_double_stats_t s0, s1;
    bool dbl = ct_stats(&s0);

    kvb_block_t b = {(uint64_t)(uintptr_t)sd, t.dev_addr, LEN};
    CHECK_EQ(kvb_engine_write(w, t.sid, &b, 1, 30.0), KVB_OK);
    tgt_expect(&t, t.dev_addr, want, LEN, "24 MiB device to device through a 4 MiB ring");

    /* odd-sized blocks, device and host sources alternating, in reverse
     * order of their places (the ring's stream is the transfer's order) */
    size_t nb = LEN / ODD;
    kvb_block_t *v = calloc(nb, sizeof(*v));
    CHECK(v != NULL);
    for (size_t i = 0; i < nb; i++) {
        size_t k = nb - 1 - i, off = k * ODD;
        uint8_t *src = (k % 2 ? sh : sd) + LEN - off - ODD;
        v[i] = (kvb_block_t){(uint64_t)(uintptr_t)src, t.dev_addr + off, ODD};
        for (size_t q = 0; q < ODD; q++)
            want[off + q] =
                k % 2 ? sh[LEN - off - ODD + q] : cuda_test_byte(7, LEN - off - ODD + q);
    }
    CHECK_EQ(kvb_engine_write(w, t.sid, v, nb, 30.0), KVB_OK);
    tgt_expect(&t, t.dev_addr, want, LEN, "odd blocks, device and host sources");

    ct_stats(&s1);
    fprintf(stderr,
            "staged %llu bytes device to host; pinned memory at most %llu bytes (ring %u)\n",
            (unsigned long long)(s1.bytes - s0.bytes), (unsigned long long)s1.pinned_peak, RING);
    CHECK(!dbl || (s1.bytes - s0.bytes >= LEN + LEN / 2 && s1.pinned_peak <= RING));
    kvb_engine_destroy(w);
    tgt_stop(&t);
    ct_free(sd);
    free(sh);
    free(want);
    free(v);
    TEST_PASS("staging memory bounded by the ring");
    return 0;
}
