/* The handshake reply's optional device-memory table (handshake.h): round
 * trip, absent table, and hostile tables refused with a reason. */
#include "engine/handshake.h"
#include "kvb_test.h"

#include <stdlib.h>

static kvb__hs_reply_t sample(kvb__hs_seg_t *segs, kvb__hs_cuda_t *cuda)
{
    kvb__hs_reply_t r = {0};
    r.epoch = 1;
    r.host = (const uint8_t *)"boot-id";
    r.host_len = 7;
    r.waddr = (const uint8_t *)"W";
    r.waddr_len = 1;
    r.nseg = 3;
    segs[0] = (kvb__hs_seg_t){0x1000, 0x100, NULL, 0};
    segs[1] = (kvb__hs_seg_t){0x2000, 0x100, NULL, 0};
    segs[2] = (kvb__hs_seg_t){0x3000, 0x100, NULL, 0};
    r.segs = segs;
    memset(cuda, 0, 2 * sizeof(*cuda));
    cuda[0] = (kvb__hs_cuda_t){0, 1, KVB_HS_CUDA_IPC, 4096, {0}};
    memset(cuda[0].handle, 0xab, sizeof(cuda[0].handle));
    cuda[1] = (kvb__hs_cuda_t){2, 0, KVB_HS_CUDA_VMM, 8192, {0}};
    cuda[1].handle[0] = 7; /* a VMM handle: fd 7, 2 MiB */
    cuda[1].handle[10] = 0x20;
    r.ncuda = 2;
    r.cuda = cuda;
    return r;
}

static kvb_status_t roundtrip(const kvb__hs_reply_t *r, kvb__hs_reply_t *d, char *why, size_t wl)
{
    uint8_t *buf;
    size_t len;
    CHECK_EQ(kvb__hs_reply_encode(r, &buf, &len), KVB_OK);
    kvb_status_t st = kvb__hs_reply_decode(buf, len, d, why, wl);
    if (st == KVB_OK) /* every truncation refused (the total field frames it) */
        for (size_t cut = 0; cut < len; cut++) {
            kvb__hs_reply_t x;
            CHECK_EQ(kvb__hs_reply_decode(buf, cut, &x, why, wl), KVB_ERR_PROTO);
        }
    free(buf);
    return st;
}

static void expect_refused(const kvb__hs_reply_t *r, const char *what)
{
    kvb__hs_reply_t d;
    char why[200] = "";
    CHECK_EQ(roundtrip(r, &d, why, sizeof(why)), KVB_ERR_PROTO);
    CHECK_STR_CONTAINS(why, "device-memory");
    fprintf(stderr, "refused (%s): %s\n", what, why);
}

int main(void)
{
    kvb__hs_seg_t segs[3];
    kvb__hs_cuda_t cuda[2];
    kvb__hs_reply_t r = sample(segs, cuda), d;
    char why[200] = "";
    CHECK_EQ(roundtrip(&r, &d, why, sizeof(why)), KVB_OK);
    CHECK_EQ(d.ncuda, 2);
    CHECK(d.cuda[0].seg == 0 && d.cuda[0].device == 1 && d.cuda[0].flags == KVB_HS_CUDA_IPC);
    CHECK(d.cuda[0].alloc_off == 4096 && d.cuda[0].handle[63] == 0xab);
    CHECK(d.cuda[1].seg == 2 && d.cuda[1].flags == KVB_HS_CUDA_VMM);
    CHECK(d.cuda[1].alloc_off == 8192 && d.cuda[1].handle[0] == 7 && d.cuda[1].handle[10] == 0x20);
    kvb__hs_reply_free(&d);
    TEST_PASS("device-memory table round trip");

    r.ncuda = 0; /* host memory only: no table at all, as before */
    CHECK_EQ(roundtrip(&r, &d, why, sizeof(why)), KVB_OK);
    CHECK(d.ncuda == 0 && d.cuda == NULL);
    kvb__hs_reply_free(&d);
    TEST_PASS("no table");

    r = sample(segs, cuda);
    cuda[1].seg = 3;
    expect_refused(&r, "segment out of range");
    r = sample(segs, cuda);
    cuda[1].seg = 0;
    expect_refused(&r, "unsorted");
    r = sample(segs, cuda);
    cuda[1].flags = 4;
    expect_refused(&r, "unknown flag");
    r = sample(segs, cuda);
    cuda[1].flags = KVB_HS_CUDA_IPC | KVB_HS_CUDA_VMM;
    expect_refused(&r, "both handle kinds");
    r = sample(segs, cuda);
    r.nseg = 1; /* more entries than segments */
    cuda[1].seg = 0;
    expect_refused(&r, "more entries than segments");
    TEST_PASS("hostile tables refused");
    return 0;
}
