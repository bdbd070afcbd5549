/* The handshake reply's optional device-memory table (handshake.h): round
 * trip, absent table, and hostile tables refused with a reason; the VMM
 * parts table (a segment in several allocations mapped back to back) and
 * the request's caps. */
#include "engine/handshake.h"
#include "kvb_test.h"

#include <stdlib.h>

#define MiB (1ull << 20)

static kvb__hs_vmm_part_t g_parts[2];

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
    memset(cuda, 0, 3 * sizeof(*cuda));
    cuda[0] = (kvb__hs_cuda_t){.seg = 0, .device = 1, .flags = KVB_HS_CUDA_IPC, .alloc_off = 4096};
    memset(cuda[0].handle, 0xab, sizeof(cuda[0].handle));
    /* two allocations back to back (fds 9, 10: 2 MiB, 4 MiB), the segment
     * 1 MiB into the first */
    cuda[1] = (kvb__hs_cuda_t){.seg = 1,
                               .flags = KVB_HS_CUDA_VMM_PARTS,
                               .alloc_off = MiB,
                               .part0 = 0,
                               .nparts = 2,
                               .vmm_size = 6 * MiB};
    g_parts[0] = (kvb__hs_vmm_part_t){9, 2 * MiB};
    g_parts[1] = (kvb__hs_vmm_part_t){10, 4 * MiB};
    r.nparts = 2;
    r.parts = g_parts;
    /* the previous version's single VMM handle: decoded, never imported */
    cuda[2] = (kvb__hs_cuda_t){.seg = 2, .flags = KVB_HS_CUDA_VMM, .alloc_off = 8192};
    cuda[2].handle[0] = 7; /* fd 7, 2 MiB */
    cuda[2].handle[10] = 0x20;
    r.ncuda = 3;
    r.cuda = cuda;
    return r; /* no descriptor socket (zeros) */
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

static void expect_refused(const kvb__hs_reply_t *r, const char *what, const char *reason)
{
    kvb__hs_reply_t d;
    char why[200] = "";
    CHECK_EQ(roundtrip(r, &d, why, sizeof(why)), KVB_ERR_PROTO);
    CHECK_STR_CONTAINS(why, reason);
    fprintf(stderr, "refused (%s): %s\n", what, why);
}

int main(void)
{
    kvb__hs_seg_t segs[3];
    kvb__hs_cuda_t cuda[3];
    kvb__hs_reply_t r = sample(segs, cuda), d;
    char why[200] = "";
    CHECK_EQ(roundtrip(&r, &d, why, sizeof(why)), KVB_OK);
    CHECK_EQ(d.ncuda, 3);
    CHECK(d.cuda[0].seg == 0 && d.cuda[0].device == 1 && d.cuda[0].flags == KVB_HS_CUDA_IPC);
    CHECK(d.cuda[0].alloc_off == 4096 && d.cuda[0].handle[63] == 0xab);
    CHECK(d.cuda[1].seg == 1 && d.cuda[1].flags == KVB_HS_CUDA_VMM_PARTS);
    CHECK(d.cuda[1].alloc_off == MiB && d.cuda[1].part0 == 0 && d.cuda[1].nparts == 2 &&
          d.cuda[1].vmm_size == 6 * MiB);
    CHECK(d.nparts == 2 && d.parts[0].fd == 9 && d.parts[0].size == 2 * MiB &&
          d.parts[1].fd == 10 && d.parts[1].size == 4 * MiB);
    CHECK(d.cuda[2].seg == 2 && d.cuda[2].flags == KVB_HS_CUDA_VMM);
    CHECK(d.cuda[2].alloc_off == 8192 && d.cuda[2].handle[0] == 7 && d.cuda[2].handle[10] == 0x20);
    kvb__hs_reply_free(&d);
    TEST_PASS("device-memory table round trip");

    r.ncuda = 0; /* host memory only: no table at all, as before */
    r.nparts = 0;
    CHECK_EQ(roundtrip(&r, &d, why, sizeof(why)), KVB_OK);
    CHECK(d.ncuda == 0 && d.cuda == NULL);
    kvb__hs_reply_free(&d);
    TEST_PASS("no table");

    const char *dm = "device-memory";
    r = sample(segs, cuda);
    cuda[2].seg = 3;
    expect_refused(&r, "segment out of range", dm);
    r = sample(segs, cuda);
    cuda[2].seg = 0;
    expect_refused(&r, "unsorted", dm);
    r = sample(segs, cuda);
    cuda[2].flags = 8;
    expect_refused(&r, "unknown flag", dm);
    r = sample(segs, cuda);
    cuda[2].flags = KVB_HS_CUDA_IPC | KVB_HS_CUDA_VMM;
    expect_refused(&r, "both handle kinds", dm);
    r = sample(segs, cuda);
    r.nseg = 1; /* more entries than segments */
    cuda[1].seg = cuda[2].seg = 0;
    expect_refused(&r, "more entries than segments", dm);
    TEST_PASS("hostile tables refused");

    r = sample(segs, cuda);
    cuda[1].vmm_size = 5 * MiB;
    expect_refused(&r, "parts not adding up", "parts of 6291456 bytes, not 5242880");
    r = sample(segs, cuda);
    cuda[1].part0 = 1;
    expect_refused(&r, "parts not following on", dm);
    r = sample(segs, cuda);
    cuda[1].alloc_off = 6 * MiB;
    expect_refused(&r, "segment past its parts", dm);
    r = sample(segs, cuda);
    cuda[1].nparts = 70000; /* more than a reply may carry */
    expect_refused(&r, "too many parts", dm);
    r = sample(segs, cuda);
    r.nparts = 1; /* a table shorter than the entries claim */
    expect_refused(&r, "parts table short", "not the 2 parts claimed");
    r = sample(segs, cuda);
    g_parts[1].size = 0;
    cuda[1].vmm_size = 2 * MiB;
    expect_refused(&r, "empty part", "VMM part 1 invalid");
    r = sample(segs, cuda);
    memcpy(r.fdsock, "kvbridge-fd-12-ab", 17); /* ours: decoded */
    memset(r.ticket, 0x5a, sizeof(r.ticket));
    CHECK_EQ(roundtrip(&r, &d, why, sizeof(why)), KVB_OK);
    CHECK(memcmp(d.fdsock, r.fdsock, sizeof(r.fdsock)) == 0 && d.ticket[31] == 0x5a);
    kvb__hs_reply_free(&d);
    memcpy(r.fdsock, "some-other-sock", 15); /* another abstract socket of the host */
    expect_refused(&r, "foreign socket name", "descriptor socket name invalid");
    memcpy(r.fdsock, "kvbridge-fd-12/x", 16);
    expect_refused(&r, "odd socket name", "descriptor socket name invalid");
    memset(r.fdsock, 0, sizeof(r.fdsock));
    r.fdsock[20] = 'x'; /* not NUL-padded */
    expect_refused(&r, "bytes after the name", "descriptor socket name invalid");
    r = sample(segs, cuda);
    cuda[1].flags = 0; /* parts nobody claims: trailing bytes */
    expect_refused(&r, "unclaimed parts", "trailing bytes");
    TEST_PASS("hostile VMM parts refused");

    /* the request's caps: absent (0) as a writer before them sends it */
    const uint8_t *sid;
    uint32_t sl, caps = 99;
    uint8_t *buf;
    size_t len;
    CHECK_EQ(kvb__hs_request_encode("10.0.0.1:1", 0, &buf, &len), KVB_OK);
    CHECK_EQ(kvb__hs_request_decode(buf, len, &sid, &sl, &caps, why, sizeof(why)), KVB_OK);
    CHECK(caps == 0 && sl == 10);
    free(buf);
    CHECK_EQ(kvb__hs_request_encode("10.0.0.1:1", KVB_HS_CAP_VMM_PARTS | 0x80, &buf, &len), KVB_OK);
    CHECK_EQ(kvb__hs_request_decode(buf, len, &sid, &sl, &caps, why, sizeof(why)), KVB_OK);
    CHECK(caps == (KVB_HS_CAP_VMM_PARTS | 0x80) && sl == 10 && memcmp(sid, "10.0.0.1:1", 10) == 0);
    buf[8] = (uint8_t)(len - 2); /* the total field framing 2 bytes of caps */
    CHECK_EQ(kvb__hs_request_decode(buf, len - 2, &sid, &sl, &caps, why, sizeof(why)),
             KVB_ERR_PROTO);
    free(buf);
    TEST_PASS("request caps");
    TEST_PASS("hostile tables refused");
    return 0;
}
