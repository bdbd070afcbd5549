/* CUDA device memory between two processes, against the driver-API test
 * double (KVBRIDGE_CUDA_LIB): a forked target registers two regions at
 * offsets inside one device allocation; this process writes into them from
 * device and host memory. argv[1] picks the lane:
 *   ipc        same host: the target's IPC handles imported (once for the
 *              allocation), copies device to device by the copy threads;
 *   stage_shm  same host, imports refused (KVB_CUDA_DOUBLE_FAIL=ipc_open):
 *              staged through pinned host memory over the message lane;
 *   stage_tcp  the tcp transport (as across hosts): staged;
 *   vmm        same host, every allocation VMM memory (cuMemCreate/cuMemMap,
 *              as PyTorch's expandable segments): the target exports its
 *              allocation as a file descriptor, this process fetches it,
 *              imports and maps it; copies device to device;
 *   vmm_refused  VMM memory whose export is refused
 *              (KVB_CUDA_DOUBLE_FAIL=vmm_export): staged;
 *   vmm_parts  as vmm, every allocation made of 2 MiB cuMemCreate handles
 *              mapped back to back (KVB_CUDA_TEST_VMM_PART, as an expandable
 *              segment that grew): one region spans several handles, the
 *              writer maps them back to back, blocks straddle the seams;
 *   vmm_old_writer  as vmm, this writer announcing no VMM support
 *              (KVBRIDGE_CUDA_VMM=0, as a writer before it): the target
 *              sends it no VMM entries, so it stages;
 *   stage_msg_max  tcp, the target staging at most 1 MiB per message
 *              (KVBRIDGE_CUDA_STAGE_MSG_MAX): reads and writes of device
 *              memory past it refused (stage_msg_max() below), nothing
 *              else.
 * Every write is verified byte for byte by reading the target's device
 * memory back in the target; head slices (1 KiB every 2 KiB) go in few
 * batched copies; a revoked grant fences the device lane; a block past a
 * region is refused with nothing written. One-sided reads of the target's
 * device and host memory into device and host memory here, byte-exact on
 * every lane (staged ones included), refused out of bounds and under a
 * revoked grant with nothing read. */
#include "cuda/cuda_test.h"
#include "kvb_test_engine.h"

#define LEN (4u << 20)
#define ROWS 1024

static void pattern(uint8_t *h, size_t n, uint64_t seed)
{
    for (size_t i = 0; i < n; i++)
        h[i] = cuda_test_byte(seed, i);
}

/* A write (or a read) of b[0..n) under a writer grant. */
static kvb_status_t xfer_epoch(kvb_engine_h w, const char *sid, const kvb_block_t *b, size_t n,
                               uint64_t epoch, bool read)
{
    kvb_write_params_t p = {.field_mask = KVB_WRITE_PARAM_EPOCH, .epoch = epoch};
    kvb_xfer_h x;
    kvb_status_t st = read ? kvb_engine_read_async_ex(w, sid, b, n, &p, &x)
                           : kvb_engine_write_async_ex(w, sid, b, n, &p, &x);
    if (st != KVB_OK)
        return st;
    st = kvb_xfer_wait(x, 10.0);
    fprintf(stderr, "%s under epoch %llu: %s (%s)\n", read ? "read" : "write",
            (unsigned long long)epoch, kvb_status_string(st), kvb_xfer_error(x));
    kvb_xfer_free(x);
    return st;
}

/* Is the device memory dev[0..n) exactly want? */
static bool dev_is(const uint8_t *dev, const uint8_t *want, size_t n)
{
    uint8_t *got = malloc(n);
    CHECK(got != NULL);
    ct_dtoh(got, dev, n);
    bool same = memcmp(got, want, n) == 0;
    free(got);
    return same;
}

/* One-sided reads of the target's memory; want: its device region. Every
 * lane reads every kind (the staging lanes: the target gathers device
 * sources with the driver into pinned memory; answers for device memory
 * here are received into pinned memory and copied in by the driver):
 * device to host at odd offsets, device to device (one 4 MiB answer,
 * rendezvous), host to device, and small pieces of both kinds of the
 * target's memory into device memory (eager answers) in one read. sd, sh:
 * local device and host buffers of LEN bytes, left as seeds 1 and 2. */
static void reads(kvb_engine_h w, const tgt_t *t, uint8_t *sd, uint8_t *sh, const uint8_t *want)
{
    uint8_t *exp = malloc(LEN), *hp = sh; /* registered: a write's source */
    CHECK(exp != NULL);
    memset(sh, 0, LEN);
    kvb_block_t rb = {t->dev_addr + 1, (uint64_t)(uintptr_t)sh + 3, LEN - 7};
    CHECK_EQ(kvb_engine_read(w, t->sid, &rb, 1, 10.0), KVB_OK);
    CHECK(memcmp(sh + 3, want + 1, LEN - 7) == 0 && sh[2] == 0 && sh[LEN - 4] == 0);

    rb = (kvb_block_t){t->dev_addr, (uint64_t)(uintptr_t)sd, LEN};
    cuda_test_fill(sd, LEN, 9);
    CHECK_EQ(kvb_engine_read(w, t->sid, &rb, 1, 10.0), KVB_OK);
    CHECK(dev_is(sd, want, LEN));

    /* the target's host region: written first (seed 5), then read */
    pattern(hp, TGT_HOST_LEN, 5);
    kvb_block_t b = {(uint64_t)(uintptr_t)hp, t->host_addr, TGT_HOST_LEN};
    CHECK_EQ(kvb_engine_write(w, t->sid, &b, 1, 10.0), KVB_OK);
    cuda_test_fill(sd, LEN, 9);
    pattern(exp, LEN, 9);
    rb = (kvb_block_t){t->host_addr + 5, (uint64_t)(uintptr_t)sd + 4097, TGT_HOST_LEN - 10};
    CHECK_EQ(kvb_engine_read(w, t->sid, &rb, 1, 10.0), KVB_OK);
    memcpy(exp + 4097, hp + 5, TGT_HOST_LEN - 10);
    CHECK(dev_is(sd, exp, LEN));

    kvb_block_t small[2] = {{t->dev_addr + 100, (uint64_t)(uintptr_t)sd + 7, 64},
                            {t->host_addr + 10, (uint64_t)(uintptr_t)sd + 200, 30}};
    CHECK_EQ(kvb_engine_read(w, t->sid, small, 2, 10.0), KVB_OK);
    memcpy(exp + 7, want + 100, 64);
    memcpy(exp + 200, hp + 10, 30);
    CHECK(dev_is(sd, exp, LEN));
    cuda_test_fill(sd, LEN, 1);
    pattern(sh, LEN, 2); /* last: hp is sh */
    free(exp);
}

/* Reads refused with nothing read into device memory: one block past the
 * target's region (bounds, the whole batch), and under grant ep revoked
 * (fenced). sd: LEN bytes of local device memory. */
static void reads_refused(kvb_engine_h w, const tgt_t *t, uint8_t *sd, uint64_t ep)
{
    uint8_t *exp = malloc(LEN);
    CHECK(exp != NULL);
    cuda_test_fill(sd, LEN, 6);
    pattern(exp, LEN, 6);
    kvb_block_t bad[2] = {{t->dev_addr, (uint64_t)(uintptr_t)sd, 4096},
                          {t->dev_addr + LEN - 100, (uint64_t)(uintptr_t)sd + 8192, 200}};
    CHECK_EQ(kvb_engine_read(w, t->sid, bad, 2, 10.0), KVB_ERR_BOUNDS);
    CHECK_STR_CONTAINS(kvb_engine_last_error(w), "not inside a region the peer registered");
    CHECK_EQ(xfer_epoch(w, t->sid, bad, 1, ep, true), KVB_ERR_FENCED);
    CHECK(dev_is(sd, exp, LEN));
    cuda_test_fill(sd, LEN, 1);
    free(exp);
}

/* stage_msg_max: the target stages at most 1 MiB per message
 * (KVBRIDGE_CUDA_STAGE_MSG_MAX, both processes), this reader asks 2 MiB per
 * request (KVBRIDGE_AM_CHUNK, this process): a 1 MiB read of device memory
 * is exact, a 2 MiB one refused by the target with nothing read, as a
 * 2 MiB message into device memory is. */
static void stage_msg_max(kvb_engine_h w, const tgt_t *t, uint8_t *sd, uint8_t *sh)
{
    uint8_t *exp = malloc(LEN);
    CHECK(exp != NULL);
    pattern(sh, LEN, 3);
    kvb_block_t b = {(uint64_t)(uintptr_t)sh, t->dev_addr, 1u << 20};
    CHECK_EQ(kvb_engine_write(w, t->sid, &b, 1, 10.0), KVB_OK);
    cuda_test_fill(sd, LEN, 4);
    pattern(exp, LEN, 4);
    kvb_block_t rb = {t->dev_addr, (uint64_t)(uintptr_t)sd, 1u << 20};
    CHECK_EQ(kvb_engine_read(w, t->sid, &rb, 1, 10.0), KVB_OK);
    memcpy(exp, sh, 1u << 20);
    CHECK(dev_is(sd, exp, LEN));
    cuda_test_fill(sd, LEN, 4);
    pattern(exp, LEN, 4);
    rb.len = 2u << 20;
    CHECK_EQ(kvb_engine_read(w, t->sid, &rb, 1, 10.0), KVB_ERR_PEER);
    CHECK_STR_CONTAINS(kvb_engine_last_error(w), "a read of device memory of 2097152 bytes "
                                                 "exceeds KVBRIDGE_CUDA_STAGE_MSG_MAX");
    CHECK(dev_is(sd, exp, LEN));
    b.len = 2u << 20;
    CHECK_EQ(kvb_engine_write(w, t->sid, &b, 1, 10.0), KVB_ERR_PEER);
    CHECK_STR_CONTAINS(kvb_engine_last_error(w), "a write into device memory of 2097152 bytes "
                                                 "exceeds KVBRIDGE_CUDA_STAGE_MSG_MAX");
    free(exp);
}

int main(int argc, char **argv)
{
    const char *lane = argc > 1 ? argv[1] : "ipc";
    bool vmm = strncmp(lane, "vmm", 3) == 0;
    bool parts = strcmp(lane, "vmm_parts") == 0;
    bool ipc = strcmp(lane, "ipc") == 0 || strcmp(lane, "vmm") == 0 || parts; /* the device lane */
    kvb_transport_t tr = strcmp(lane, "stage_tcp") == 0 || strcmp(lane, "stage_msg_max") == 0
                             ? KVB_TRANSPORT_TCP
                             : KVB_TRANSPORT_AUTO;
    if (vmm)
        setenv("KVB_CUDA_TEST_VMM", "1", 1);
    if (parts)
        setenv("KVB_CUDA_TEST_VMM_PART", "2097152", 1);
    tgt_t t = tgt_start(tr, LEN); /* first: fork before any thread */
    if (strcmp(lane, "vmm_old_writer") == 0)
        setenv("KVBRIDGE_CUDA_VMM", "0", 1); /* this process only */
    if (strcmp(lane, "stage_msg_max") == 0)
        setenv("KVBRIDGE_AM_CHUNK", "2097152", 1); /* this process only */

    kvb_engine_h w = kvb_test_engine(tr, 2);
    uint8_t *sd = vmm ? cuda_test_alloc_vmm(0, LEN) : cuda_test_alloc(0, LEN);
    uint8_t *sh = malloc(LEN), *want = malloc(LEN);
    CHECK(sh != NULL && want != NULL);
    cuda_test_fill(sd, LEN, 1);
    pattern(sh, LEN, 2);
    kvb_mem_type_t mt;
    int dev;
    CHECK_EQ(kvb_mem_query(sd, &mt, &dev), KVB_OK);
    CHECK(mt == KVB_MEM_CUDA && dev == ct_device(0));
    CHECK_EQ(kvb_mem_query(sh, &mt, &dev), KVB_OK);
    CHECK(mt == KVB_MEM_HOST && dev == -1);
    CHECK_EQ(kvb_engine_register(w, sd, LEN, KVB_MEM_AUTO), KVB_OK);
    CHECK_EQ(kvb_engine_register(w, sh, LEN, KVB_MEM_AUTO), KVB_OK);
    if (strcmp(lane, "stage_msg_max") == 0) {
        stage_msg_max(w, &t, sd, sh);
        kvb_engine_destroy(w);
        tgt_stop(&t);
        ct_free(sd);
        free(sh);
        free(want);
        TEST_PASS(lane);
        return 0;
    }

    /* device -> device, the whole first region */
    kvb_block_t b = {(uint64_t)(uintptr_t)sd, t.dev_addr, LEN};
    CHECK_EQ(kvb_engine_write(w, t.sid, &b, 1, 10.0), KVB_OK);
    CHECK_EQ(kvb_engine_session_direct(w, t.sid), ipc ? 1 : 0);
    kvb_cuda_double_stats_t s0, s1;
    /* both regions share one allocation: imported once (the double, like
     * some drivers, refuses to open one handle twice in a process) */
    bool dbl = ct_stats(&s0);
    /* parts: the first region [4 KiB, +4 MiB) spans 2 MiB handles 0-2, the
     * second one handle 2 */
    uint64_t imports = parts ? 4 : 2;
    if (dbl && vmm) /* each region maps its allocations; legacy IPC never tried */
        CHECK(s0.ipc_opens == 0 && s0.vmm_imports == (ipc ? imports : 0) &&
              s0.vmm_maps >= (ipc ? imports + 1 : 1));
    else if (dbl)
        CHECK_EQ(s0.ipc_opens, ipc ? 1 : tr == KVB_TRANSPORT_AUTO ? 2 /* both refused */ : 0);
    pattern(want, LEN, 1);
    tgt_expect(&t, t.dev_addr, want, LEN, "device to device");

    reads(w, &t, sd, sh, want);

    /* host -> device, the second region of the same allocation */
    b = (kvb_block_t){(uint64_t)(uintptr_t)sh + 4096, t.dev2_addr, t.dev2_len};
    CHECK_EQ(kvb_engine_write(w, t.sid, &b, 1, 10.0), KVB_OK);
    tgt_expect(&t, t.dev2_addr, sh + 4096, t.dev2_len, "host to device at an offset");

    /* head slices: row i's first KiB of the device source into the second
     * KiB of row i of the target, one block each */
    ct_stats(&s0);
    kvb_block_t *rows = calloc(ROWS, sizeof(*rows));
    for (size_t i = 0; i < ROWS; i++) {
        rows[i] =
            (kvb_block_t){(uint64_t)(uintptr_t)sd + i * 2048, t.dev_addr + i * 2048 + 1024, 1024};
        memcpy(want + i * 2048 + 1024, want + i * 2048, 1024); /* source: seed 1 pattern */
    }
    CHECK_EQ(kvb_engine_write(w, t.sid, rows, ROWS, 10.0), KVB_OK);
    ct_stats(&s1);
    fprintf(stderr, "head slices: %llu single copies, %llu 2-D, %llu batched calls here\n",
            (unsigned long long)(s1.copies - s0.copies),
            (unsigned long long)(s1.copies_2d - s0.copies_2d),
            (unsigned long long)(s1.copies_batch - s0.copies_batch));
    /* one 2-D copy for the strided rows (device lane: device to device;
     * staging: device to pinned host), not one call per row; rows across
     * a seam between handles: batched calls instead */
    CHECK(!dbl ||
          (s1.copies_2d - s0.copies_2d + (parts ? s1.copies_batch - s0.copies_batch : 0) >= 1 &&
           s1.copies - s0.copies < 8));
    tgt_expect(&t, t.dev_addr, want, LEN, "head slices");

    /* blocks straddling the 2 MiB seams (handle boundaries in vmm_parts) on
     * both sides, device and host sources */
    uint64_t seam = 2 * 1048576 - 4096; /* the target region starts 4 KiB in */
    kvb_block_t st[3] = {
        {(uint64_t)(uintptr_t)sd + 2 * 1048576 - 3000, t.dev_addr + seam - 777, 5000},
        {(uint64_t)(uintptr_t)sh + 100, t.dev_addr + 2 * seam - 1, 2},
        {(uint64_t)(uintptr_t)sd + 4 * 1048576 - 1, t.dev_addr + 3 * 1048576, 1}};
    CHECK_EQ(kvb_engine_write(w, t.sid, st, 3, 10.0), KVB_OK);
    pattern(want + seam - 777, 5000, 1);
    for (size_t i = 0; i < 5000; i++) /* the source bytes at their positions */
        want[seam - 777 + i] = cuda_test_byte(1, 2 * 1048576 - 3000 + i);
    memcpy(want + 2 * seam - 1, sh + 100, 2);
    want[3 * 1048576] = cuda_test_byte(1, 4 * 1048576 - 1);
    tgt_expect(&t, t.dev_addr, want, LEN, "blocks across the seams");

    /* the fence: admitted under a live grant, refused once revoked */
    kvb_engine_set_writer_tag(w, 7);
    uint64_t ep = tgt_grant(&t, 7);
    pattern(sh, LEN, 3);
    b = (kvb_block_t){(uint64_t)(uintptr_t)sh, t.dev_addr, LEN};
    CHECK_EQ(xfer_epoch(w, t.sid, &b, 1, ep, false), KVB_OK);
    tgt_expect(&t, t.dev_addr, sh, LEN, "written under a live grant");
    memcpy(want, sh, LEN);
    /* and read back under it into device memory */
    kvb_block_t rb = {t.dev_addr, (uint64_t)(uintptr_t)sd, LEN};
    cuda_test_fill(sd, LEN, 8);
    CHECK_EQ(xfer_epoch(w, t.sid, &rb, 1, ep, true), KVB_OK);
    CHECK(dev_is(sd, want, LEN));
    cuda_test_fill(sd, LEN, 1);
    CHECK_EQ(tgt_revoke(&t, 7, ep), KVB_OK);
    pattern(sh, LEN, 4);
    CHECK_EQ(xfer_epoch(w, t.sid, &b, 1, ep, false), KVB_ERR_FENCED);
    tgt_expect(&t, t.dev_addr, want, LEN, "nothing lands under a revoked grant");
    reads_refused(w, &t, sd, ep);

    /* bounds: one block past the region's end fails the whole batch */
    kvb_block_t bad[2] = {{(uint64_t)(uintptr_t)sd, t.dev_addr, 4096},
                          {(uint64_t)(uintptr_t)sd, t.dev_addr + LEN - 100, 200}};
    CHECK_EQ(kvb_engine_write(w, t.sid, bad, 2, 10.0), KVB_ERR_BOUNDS);
    CHECK_STR_CONTAINS(kvb_engine_last_error(w), "not inside a region the peer registered");
    tgt_expect(&t, t.dev_addr, want, LEN, "nothing of a refused batch lands");

    kvb_engine_destroy(w);
    ct_stats(&s1);
    fprintf(stderr, "IPC imports: %llu opened, %llu closed; VMM: %llu imported, %llu unmapped\n",
            (unsigned long long)s1.ipc_opens, (unsigned long long)s1.ipc_closes,
            (unsigned long long)s1.vmm_imports, (unsigned long long)s1.vmm_unmaps);
    if (!dbl) /* a real driver: no counters */
        ;
    else if (vmm) /* mapped per connection, unmapped with it: nothing left mapped */
        CHECK(s1.ipc_opens == 0 && (ipc ? s1.vmm_imports >= 2 : s1.vmm_imports == 0) &&
              s1.vmm_unmaps == s1.vmm_imports);
    else if (ipc) /* every import closed with its last connection */
        CHECK(s1.ipc_opens >= 1 && s1.ipc_closes == s1.ipc_opens);
    else if (tr == KVB_TRANSPORT_AUTO)
        CHECK(s1.ipc_opens >= 1 && s1.ipc_closes == 0); /* refused by the double */
    else
        CHECK(s1.ipc_opens == 0); /* tcp: no handles offered */
    tgt_stop(&t);
    if (!vmm)
        ct_free(sd);
    free(sh);
    free(want);
    free(rows);
    TEST_PASS(lane);
    return 0;
}
