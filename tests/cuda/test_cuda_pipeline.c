/* Staging through host memory off the progress thread, against the
 * driver-API test double with slow stream synchronisation
 * (KVB_CUDA_DOUBLE_SLOW_MS: each batch of copies takes that long), over the
 * tcp transport (the staging lane). A forked target holds device memory.
 * argv[1]:
 *   overlap    a device-to-device transfer of CHUNKS staging chunks
 *              (KVBRIDGE_CUDA_STAGE_CHUNK): its first bytes are on the
 *              target's device while the writer is still staging later
 *              chunks (device to host of chunk k+1 overlaps the send of
 *              chunk k); every byte verified; the timeline is printed.
 *   unstalled  a host-to-device transfer of 8 messages, each a slow device
 *              copy at the target, then a small host-to-host write to the
 *              same target: the small write completes while most of the
 *              device messages are still to be copied in (the target's
 *              progress thread does not wait for device copies), both
 *              verified.
 *   read_unstalled  the same with a one-sided read of the target's device
 *              memory (8 requests, each a slow gather at the target) in
 *              place of the device write: the small write completes while
 *              the read is still in progress (the target gathers on its
 *              device-copy worker), every byte of both verified.
 * Orderings are asserted, never speeds. */
#include "cuda/cuda_test.h"
#include "kvb_test_engine.h"

#include <time.h>

#define CHUNK (1u << 20)
#define CHUNKS 16
#define LEN (CHUNKS * CHUNK)
#define SMALL (64u << 10)

static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static uint8_t *pattern(size_t n, uint64_t seed)
{
    uint8_t *h = malloc(n);
    CHECK(h != NULL);
    for (size_t i = 0; i < n; i++)
        h[i] = cuda_test_byte(seed, i);
    return h;
}

/* Does the target's device hold want's first 4 KiB at addr? */
static bool landed(const tgt_t *t, uint64_t addr, const uint8_t *want)
{
    uint8_t *got = tgt_read(t, addr, 4096);
    bool ok = memcmp(got, want, 4096) == 0;
    free(got);
    return ok;
}

static void overlap(const tgt_t *t, kvb_engine_h w)
{
    uint8_t *src = cuda_test_alloc(0, LEN), *want = pattern(LEN, 5);
    cuda_test_fill(src, LEN, 5);
    CHECK_EQ(kvb_engine_register(w, src, LEN, KVB_MEM_CUDA), KVB_OK);
    kvb_cuda_double_stats_t s0, s1;
    CHECK(ct_stats(&s0)); /* the double only: its syncs count the staging steps */
    kvb_block_t b = {(uint64_t)(uintptr_t)src, t->dev_addr, LEN};
    kvb_xfer_h x;
    double t0 = kvb_test_now_s(), first = -1;
    CHECK_EQ(kvb_engine_write_async(w, t->sid, &b, 1, &x), KVB_OK);
    uint64_t staged_at_first = 0;
    for (int i = 0; i < 1000 && first < 0; i++) { /* bounded: 1000 x ~5 ms */
        if (landed(t, t->dev_addr, want)) {
            ct_stats(&s1);
            first = kvb_test_now_s() - t0;
            staged_at_first = s1.syncs - s0.syncs;
            CHECK_EQ(kvb_xfer_test(x), KVB_ERR_INPROGRESS);
        } else {
            sleep_ms(5);
        }
    }
    CHECK(first >= 0);
    CHECK_EQ(kvb_xfer_wait(x, 30.0), KVB_OK);
    double total = kvb_test_now_s() - t0;
    kvb_xfer_free(x);
    ct_stats(&s1);
    const char *ms = getenv("KVB_CUDA_DOUBLE_SLOW_MS");
    fprintf(stderr,
            "timeline: first bytes on the target's device after %.3f s with %llu of %u chunks "
            "staged; transfer done after %.3f s; %llu staging steps of %s ms each (staging "
            "alone: %.3f s, then the target's copies)\n",
            first, (unsigned long long)staged_at_first, CHUNKS, total,
            (unsigned long long)(s1.syncs - s0.syncs), ms != NULL ? ms : "?",
            CHUNKS * (ms != NULL ? atof(ms) : 0) / 1000);
    /* the window: the target had chunk 0 while chunks were still being staged */
    CHECK(staged_at_first < CHUNKS);
    CHECK(s1.syncs - s0.syncs >= CHUNKS); /* one step per chunk at least */
    tgt_expect(t, t->dev_addr, want, LEN, "pipelined staging: every byte");
    free(want);
}

typedef struct beside {
    kvb_xfer_h slow, small;
    double t0, th;       /* start; the small write's end, since t0 */
    kvb_status_t during; /* the slow transfer's state then */
} beside_t;

/* The slow transfer b (a write, or a read) started, then 50 ms later (its
 * messages reach the target first) a write of small (SMALL bytes, host) to
 * the target's host region, waited for. */
static beside_t small_beside(const tgt_t *t, kvb_engine_h w, const kvb_block_t *b, bool read,
                             const uint8_t *small)
{
    beside_t r;
    kvb_block_t bh = {(uint64_t)(uintptr_t)small, t->host_addr, SMALL};
    r.t0 = kvb_test_now_s();
    CHECK_EQ(read ? kvb_engine_read_async(w, t->sid, b, 1, &r.slow)
                  : kvb_engine_write_async(w, t->sid, b, 1, &r.slow),
             KVB_OK);
    sleep_ms(50);
    CHECK_EQ(kvb_engine_write_async(w, t->sid, &bh, 1, &r.small), KVB_OK);
    CHECK_EQ(kvb_xfer_wait(r.small, 30.0), KVB_OK);
    r.th = kvb_test_now_s() - r.t0;
    r.during = kvb_xfer_test(r.slow);
    return r;
}

static void unstalled(const tgt_t *t, kvb_engine_h w)
{
    uint8_t *big = pattern(LEN / 2, 6), *small = pattern(SMALL, 7);
    CHECK_EQ(kvb_engine_register(w, big, LEN / 2, KVB_MEM_HOST), KVB_OK);
    CHECK_EQ(kvb_engine_register(w, small, SMALL, KVB_MEM_HOST), KVB_OK);
    kvb_block_t bd = {(uint64_t)(uintptr_t)big, t->dev_addr, LEN / 2};
    beside_t r = small_beside(t, w, &bd, false, small);
    kvb_xfer_h xd = r.slow, xh = r.small;
    double t0 = r.t0, th = r.th;
    kvb_status_t during = r.during;
    /* the device write's messages (1 MiB each) copied in by then */
    uint8_t *got = tgt_read(t, t->dev_addr, LEN / 2);
    unsigned in = 0;
    for (size_t c = 0; c < LEN / 2 / CHUNK; c++)
        in += memcmp(got + c * CHUNK, big + c * CHUNK, CHUNK) == 0;
    free(got);
    CHECK_EQ(kvb_xfer_wait(xd, 30.0), KVB_OK);
    double td = kvb_test_now_s() - t0;
    fprintf(stderr,
            "host write done after %.3f s, the device write still %s then, %u of its %u "
            "messages copied in; device write done after %.3f s\n",
            th, kvb_status_string(during), in, LEN / 2 / CHUNK, td);
    /* The host write did not wait behind the device copies: its message
     * came after all of theirs (window 8), yet it was placed while most of
     * them were still to be copied in (one at a time, each held slow). */
    CHECK_EQ(during, KVB_ERR_INPROGRESS);
    CHECK(in < LEN / 2 / CHUNK / 2);
    kvb_xfer_free(xh);
    kvb_xfer_free(xd);
    tgt_expect(t, t->host_addr, small, SMALL, "host write beside slow device copies");
    tgt_expect(t, t->dev_addr, big, LEN / 2, "device write: every byte");
    free(big);
    free(small);
}

static void read_unstalled(const tgt_t *t, kvb_engine_h w)
{
    uint8_t *want = pattern(LEN / 2, 6), *small = pattern(SMALL, 7), *back = calloc(1, LEN / 2);
    CHECK(back != NULL);
    CHECK_EQ(kvb_engine_register(w, want, LEN / 2, KVB_MEM_HOST), KVB_OK);
    CHECK_EQ(kvb_engine_register(w, small, SMALL, KVB_MEM_HOST), KVB_OK);
    CHECK_EQ(kvb_engine_register(w, back, LEN / 2, KVB_MEM_HOST), KVB_OK);
    kvb_block_t b = {(uint64_t)(uintptr_t)want, t->dev_addr, LEN / 2};
    CHECK_EQ(kvb_engine_write(w, t->sid, &b, 1, 30.0), KVB_OK);
    kvb_block_t rb = {t->dev_addr, (uint64_t)(uintptr_t)back, LEN / 2};
    beside_t r = small_beside(t, w, &rb, true, small);
    kvb_xfer_h xr = r.slow, xh = r.small;
    double t0 = r.t0, th = r.th;
    kvb_status_t during = r.during;
    CHECK_EQ(kvb_xfer_wait(xr, 30.0), KVB_OK);
    double tr = kvb_test_now_s() - t0;
    fprintf(stderr,
            "host write done after %.3f s, the read still %s then; read done after %.3f s\n", th,
            kvb_status_string(during), tr);
    /* The write's message came after the 8 requests, yet it was placed while
     * more than 2 of their gathers (250 ms each, one at a time) were still
     * to run; with the gathers on the target's progress thread it waits
     * behind all 8 and ends with the read (measured: 2.004 s, 2.018 s). */
    CHECK_EQ(during, KVB_ERR_INPROGRESS);
    CHECK(tr - th > 0.5);
    CHECK(memcmp(back, want, LEN / 2) == 0);
    tgt_expect(t, t->host_addr, small, SMALL, "host write beside slow device gathers");
    kvb_xfer_free(xh);
    kvb_xfer_free(xr);
    free(want);
    free(small);
    free(back);
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "overlap";
    tgt_t t = tgt_start(KVB_TRANSPORT_TCP, LEN); /* first: fork before any thread */
    kvb_engine_h w = kvb_test_engine(KVB_TRANSPORT_TCP, 1);
    if (strcmp(mode, "overlap") == 0)
        overlap(&t, w);
    else if (strcmp(mode, "read_unstalled") == 0)
        read_unstalled(&t, w);
    else
        unstalled(&t, w);
    kvb_engine_destroy(w);
    tgt_stop(&t);
    TEST_PASS(mode);
    return 0;
}
