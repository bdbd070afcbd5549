/* CUDA registrations refused with a clear reason (against the driver-API
 * test double, in one process): host memory called device memory, a range
 * past its allocation, the wrong device, a driver that fails; the region
 * array's stride; AUTO detection both ways; IPC refused within one process
 * (as the driver does) falls back to staging, bytes verified; a copy that
 * fails fails the write, and a staged read on either side, with the
 * driver's reason; a region across several
 * VMM allocations mapped back to back registers, one running past the last
 * is refused. */
#include "cuda/cuda_test.h"
#include "kvb_test_engine.h"

#define N (1u << 20)

static void expect_reg(kvb_engine_h e, const kvb_mem_region_ex_t *r, size_t size, kvb_status_t st,
                       const char *text)
{
    CHECK_EQ(kvb_engine_register_ex(e, r, 1, size), st);
    if (text != NULL)
        CHECK_STR_CONTAINS(kvb_engine_last_error(e), text);
    fprintf(stderr, "register %p+%zu: %s (%s)\n", r->addr, r->length, kvb_status_string(st),
            st == KVB_OK ? "" : kvb_engine_last_error(e));
}

static void registrations(kvb_engine_h e, uint8_t *dev, uint8_t *host)
{
    const char *why = NULL;
    CHECK_EQ(kvb_cuda_available(&why), 1);
    CHECK_EQ(strcmp(why, ""), 0);
    kvb_mem_region_ex_t r = {0, host, N, KVB_MEM_CUDA, 0, 0};
    expect_reg(e, &r, sizeof(r), KVB_ERR_INVALID, "not CUDA device memory");
    r = (kvb_mem_region_ex_t){0, dev + 4096, N, KVB_MEM_CUDA, 0, 0};
    expect_reg(e, &r, sizeof(r), KVB_ERR_INVALID, "extends past its CUDA allocation");
    r = (kvb_mem_region_ex_t){KVB_MEM_REGION_FIELD_DEVICE, dev, N, KVB_MEM_CUDA, 1, 0};
    expect_reg(e, &r, sizeof(r), KVB_ERR_INVALID, "on CUDA device 0, not 1");
    r = (kvb_mem_region_ex_t){0, dev, N, (kvb_mem_type_t)7, 0, 0};
    expect_reg(e, &r, sizeof(r), KVB_ERR_INVALID, "unknown memory type");
    /* a struct too short to hold mem_type */
    expect_reg(e, &r, offsetof(kvb_mem_region_ex_t, mem_type), KVB_ERR_INVALID, "region_size");
    /* an older caller's struct ending before device: that field is not read */
    r = (kvb_mem_region_ex_t){KVB_MEM_REGION_FIELD_DEVICE, dev, N, KVB_MEM_AUTO, 1, 0};
    expect_reg(e, &r, offsetof(kvb_mem_region_ex_t, device), KVB_OK, NULL);
    kvb_mem_region_t o = {dev + 100, 10, KVB_MEM_HOST};
    CHECK_EQ(kvb_engine_register_batch(e, &o, 1), KVB_ERR_OVERLAP);
    CHECK_EQ(kvb_engine_unregister(e, dev), KVB_OK);
    kvb_mem_type_t mt;
    int d;
    CHECK_EQ(kvb_mem_query(dev + 5, &mt, &d), KVB_OK);
    CHECK(mt == KVB_MEM_CUDA && d == 0);
    CHECK_EQ(kvb_mem_query(host, &mt, &d), KVB_OK);
    CHECK(mt == KVB_MEM_HOST && d == -1);
    CHECK_EQ(kvb_mem_query(NULL, &mt, &d), KVB_ERR_INVALID);
    setenv("KVB_CUDA_DOUBLE_FAIL", "attr", 1);
    r = (kvb_mem_region_ex_t){0, dev, N, KVB_MEM_AUTO, 0, 0};
    expect_reg(e, &r, sizeof(r), KVB_ERR_IO, "cuPointerGetAttribute");
    unsetenv("KVB_CUDA_DOUBLE_FAIL");
    TEST_PASS("registrations refused with their reason");
}

/* 64 blocks of 4 KiB at shuffled places (no strided runs): the staging copies
 * go as batched calls (cuMemcpyBatchAsync), and where the driver refuses
 * those (KVB_CUDA_DOUBLE_FAIL=batch) one copy each; bytes verified both times. */
static void scattered(kvb_engine_h w, kvb_engine_h t, uint8_t *src, uint8_t *dev, uint8_t *back)
{
    enum { NB = 64, BS = 4096 };
    kvb_block_t b[NB];
    for (int pass = 0; pass < 2; pass++) {
        kvb_cuda_double_stats_t s0, s1;
        cuda_test_fill(src, N, 20 + (uint64_t)pass);
        for (int i = 0; i < NB; i++) /* source slot i to destination slot (i * 37) % NB */
            b[i] = (kvb_block_t){(uint64_t)(uintptr_t)src + (uint64_t)i * 2 * BS,
                                 (uint64_t)(uintptr_t)dev + (uint64_t)((i * 37) % NB) * BS, BS};
        if (pass == 1)
            setenv("KVB_CUDA_DOUBLE_FAIL", "batch", 1);
        ct_stats(&s0);
        CHECK_EQ(kvb_engine_write(w, kvb_engine_session_id(t), b, NB, 10.0), KVB_OK);
        ct_stats(&s1);
        unsetenv("KVB_CUDA_DOUBLE_FAIL");
        fprintf(stderr, "scattered (batch %s): %llu batched calls, %llu single copies\n",
                pass ? "refused" : "offered",
                (unsigned long long)(s1.copies_batch - s0.copies_batch),
                (unsigned long long)(s1.copies - s0.copies));
        CHECK(s1.copies_batch - s0.copies_batch >= 1);
        CHECK(pass == 0 ? s1.copies - s0.copies < 8 : s1.copies - s0.copies >= NB);
        ct_dtoh(back, dev, NB * BS);
        for (int i = 0; i < NB; i++)
            for (size_t k = 0; k < BS; k++)
                CHECK_EQ(back[(size_t)((i * 37) % NB) * BS + k],
                         cuda_test_byte(20 + (uint64_t)pass, (uint64_t)i * 2 * BS + k));
    }
    TEST_PASS("scattered blocks: batched copies, and one each where batching is refused");
}

static int cmp_ptr(const void *a, const void *b)
{
    uintptr_t x = *(const uintptr_t *)a, y = *(const uintptr_t *)b;
    return x < y ? -1 : x > y;
}

/* Rows at a constant stride that run through four device allocations (one
 * row each, e.g. one page of four equally spaced layer buffers): never one
 * 2-D copy (the double, like a driver may, refuses a 2-D span across
 * allocations), the bytes arrive. */
static void across_allocations(kvb_engine_h w, kvb_engine_h t, uint8_t *dev, uint8_t *back)
{
    enum { NA = 24, AS = 64 << 10, L = 1024 };
    uintptr_t a[NA];
    for (int i = 0; i < NA; i++)
        a[i] = (uintptr_t)cuda_test_alloc(0, AS);
    qsort(a, NA, sizeof(a[0]), cmp_ptr);
    int at = -1;
    for (int i = 0; i + 3 < NA && at < 0; i++)
        if (a[i + 1] - a[i] == a[i + 2] - a[i + 1] && a[i + 2] - a[i + 1] == a[i + 3] - a[i + 2])
            at = i;
    CHECK(at >= 0); /* the double maps allocations at a regular spacing */
    kvb_block_t b[4];
    for (int j = 0; j < 4; j++) {
        uint8_t *p = (uint8_t *)a[at + j];
        cuda_test_fill(p, AS, 40 + (uint64_t)j);
        CHECK_EQ(kvb_engine_register(w, p, AS, KVB_MEM_CUDA), KVB_OK);
        b[j] =
            (kvb_block_t){(uint64_t)(uintptr_t)p + 512, (uint64_t)(uintptr_t)dev + 8192 + j * L, L};
    }
    kvb_cuda_double_stats_t s0, s1;
    ct_stats(&s0);
    CHECK_EQ(kvb_engine_write(w, kvb_engine_session_id(t), b, 4, 10.0), KVB_OK);
    ct_stats(&s1);
    CHECK_EQ(s1.copies_2d - s0.copies_2d, 0); /* not even tried */
    ct_dtoh(back, dev + 8192, 4 * L);
    for (int j = 0; j < 4; j++)
        for (size_t k = 0; k < L; k++)
            CHECK_EQ(back[(size_t)j * L + k], cuda_test_byte(40 + (uint64_t)j, 512 + k));
    for (int i = 0; i < NA; i++) {
        kvb_engine_unregister(w, (void *)a[i]); /* the four registered ones */
        ct_free((void *)a[i]);
    }
    TEST_PASS("rows through four allocations copied one by one");
}

/* The staging lane's reads with every copy failing (KVB_CUDA_DOUBLE_FAIL
 * =copy, set): t's device memory dev into host memory here (the target's
 * gather fails: KVB_ERR_PEER with its reason, the host buffer untouched),
 * and t's host memory into device memory src here (this side's copy in
 * fails: KVB_ERR_IO; the caller checks src once copies work again). */
static void failed_reads(kvb_engine_h w, kvb_engine_h t, uint8_t *dev, uint8_t *src, uint8_t *host)
{
    const char *sid = kvb_engine_session_id(t);
    uint8_t *th = calloc(1, 4096);
    CHECK(th != NULL);
    CHECK_EQ(kvb_engine_register(t, th, 4096, KVB_MEM_HOST), KVB_OK);
    memset(host, 0x5a, N);
    kvb_block_t rb = {(uint64_t)(uintptr_t)dev, (uint64_t)(uintptr_t)host, 4096};
    CHECK_EQ(kvb_engine_read(w, sid, &rb, 1, 10.0), KVB_ERR_PEER);
    CHECK_STR_CONTAINS(kvb_engine_last_error(w), "peer refused the read");
    CHECK_STR_CONTAINS(kvb_engine_last_error(w), "CUDA copy");
    CHECK(kvb_test_all(host, N, 0x5a));
    rb = (kvb_block_t){(uint64_t)(uintptr_t)th, (uint64_t)(uintptr_t)src, 4096};
    CHECK_EQ(kvb_engine_read(w, sid, &rb, 1, 10.0), KVB_ERR_IO);
    CHECK_STR_CONTAINS(kvb_engine_last_error(w), "placing a read's bytes into device memory");
    fprintf(stderr, "read copy failed: %s\n", kvb_engine_last_error(w));
    CHECK_EQ(kvb_engine_unregister(t, th), KVB_OK);
    free(th);
}

/* Two engines of this process: the driver refuses a process's own IPC
 * handles, so device memory is staged; then a failing copy fails the write. */
static void in_process(kvb_engine_h t, uint8_t *dev, uint8_t *host)
{
    kvb_engine_h w = kvb_test_engine(KVB_TRANSPORT_AUTO, 2);
    uint8_t *src = cuda_test_alloc(0, N), *back = malloc(N), *want = malloc(N);
    CHECK(back != NULL && want != NULL);
    cuda_test_fill(src, N, 5);
    for (size_t i = 0; i < N; i++)
        want[i] = cuda_test_byte(5, i);
    CHECK_EQ(kvb_engine_register(t, dev, N, KVB_MEM_CUDA), KVB_OK);
    CHECK_EQ(kvb_engine_register(w, src, N, KVB_MEM_AUTO), KVB_OK);
    CHECK_EQ(kvb_engine_register(w, host, N, KVB_MEM_HOST), KVB_OK);
    kvb_block_t b = {(uint64_t)(uintptr_t)src, (uint64_t)(uintptr_t)dev, N};
    CHECK_EQ(kvb_engine_write(w, kvb_engine_session_id(t), &b, 1, 10.0), KVB_OK);
    CHECK_EQ(kvb_engine_session_direct(w, kvb_engine_session_id(t)), 0);
    ct_dtoh(back, dev, N);
    CHECK(memcmp(back, want, N) == 0);
    TEST_PASS("own-process IPC refused: staged, bytes verified");

    scattered(w, t, src, dev, back);
    across_allocations(w, t, dev, back);

    ct_dtoh(want, src, N); /* as src is now */
    setenv("KVB_CUDA_DOUBLE_FAIL", "copy", 1);
    CHECK_EQ(kvb_engine_write(w, kvb_engine_session_id(t), &b, 1, 10.0), KVB_ERR_IO);
    CHECK_STR_CONTAINS(kvb_engine_last_error(w), "staging device sources");
    CHECK_STR_CONTAINS(kvb_engine_last_error(w), "illegal memory access");
    /* host source: the target's host-to-device copy fails; the writer's
     * transfer fails as refused by the peer, with the target's reason */
    b.src = (uint64_t)(uintptr_t)host;
    kvb_xfer_h x;
    CHECK_EQ(kvb_engine_write_async(w, kvb_engine_session_id(t), &b, 1, &x), KVB_OK);
    CHECK_EQ(kvb_xfer_wait(x, 10.0), KVB_ERR_PEER);
    CHECK_STR_CONTAINS(kvb_xfer_error(x), "CUDA copy");
    fprintf(stderr, "target copy failed: %s\n", kvb_xfer_error(x));
    kvb_xfer_free(x);
    failed_reads(w, t, dev, src, host);
    unsetenv("KVB_CUDA_DOUBLE_FAIL");
    ct_dtoh(back, src, N); /* the failed read left src as it was */
    CHECK(memcmp(back, want, N) == 0);
    TEST_PASS("failed copies fail the write and the read with the driver's reason");
    kvb_engine_destroy(w);
    ct_free(src);
    free(back);
    free(want);
}

/* The caller's current context (PyTorch's device) is its own: registering
 * and writing device memory of another device leave it as it was. */
static void caller_context(kvb_engine_h t)
{
    uint8_t *mine = cuda_test_alloc(1, N); /* this thread now in device 1's context */
    void *before = NULL, *after = NULL, *ctx0;
    int d;
    unsigned long long p;
    CHECK_EQ(ct()->CtxGetCurrent(&before), 0);
    CHECK_EQ(ct()->DeviceGet(&d, 0), 0);
    CHECK_EQ(ct()->PrimaryCtxRetain(&ctx0, d), 0);
    CHECK_EQ(ct()->CtxSetCurrent(ctx0), 0);
    CHECK_EQ(ct()->MemAlloc(&p, N), 0);
    uint8_t *dev0 = (uint8_t *)(uintptr_t)p;
    CHECK_EQ(ct()->CtxSetCurrent(before), 0); /* back in device 1's */
    kvb_engine_h w = kvb_test_engine(KVB_TRANSPORT_AUTO, 2);
    CHECK_EQ(kvb_engine_register(w, dev0, N, KVB_MEM_CUDA), KVB_OK);
    CHECK_EQ(kvb_engine_register(t, mine, N, KVB_MEM_AUTO), KVB_OK);
    kvb_block_t b = {(uint64_t)(uintptr_t)dev0, (uint64_t)(uintptr_t)mine, N};
    CHECK_EQ(kvb_engine_write(w, kvb_engine_session_id(t), &b, 1, 10.0), KVB_OK);
    kvb_mem_type_t mt;
    CHECK_EQ(kvb_mem_query(dev0, &mt, &d), KVB_OK);
    CHECK(mt == KVB_MEM_CUDA && d == 0);
    CHECK_EQ(ct()->CtxGetCurrent(&after), 0);
    CHECK(after == before);
    kvb_engine_destroy(w);
    CHECK_EQ(kvb_engine_unregister(t, mine), KVB_OK);
    ct_free(dev0);
    ct_free(mine);
    TEST_PASS("the caller's current context is left as it was");
}

/* Two 2 MiB cuMemCreate allocations back to back: a region across the seam
 * registers (both exported), one running past the second is refused. */
static void vmm_parts(kvb_engine_h t)
{
    kvb_cuda_double_stats_t s0, s1;
    setenv("KVB_CUDA_TEST_VMM_PART", "2097152", 1);
    uint8_t *va = cuda_test_alloc_vmm(0, 4u << 20);
    unsetenv("KVB_CUDA_TEST_VMM_PART");
    bool dbl = ct_stats(&s0);
    kvb_mem_region_ex_t r = {0, va + (1u << 20), 5u << 20, KVB_MEM_AUTO, 0, 0};
    expect_reg(t, &r, sizeof(r), KVB_ERR_INVALID, "extends past its CUDA allocation");
    r.length = 3u << 20;
    expect_reg(t, &r, sizeof(r), KVB_OK, NULL);
    ct_stats(&s1);
    /* the refused one exported both before finding the end (and closed them) */
    CHECK(!dbl || s1.vmm_exports - s0.vmm_exports == 4);
    CHECK_EQ(kvb_engine_unregister(t, va + (1u << 20)), KVB_OK);
    TEST_PASS("a region across two VMM allocations; one past them refused");
}

int main(void)
{
    kvb_engine_h t = kvb_test_engine(KVB_TRANSPORT_AUTO, 2);
    uint8_t *dev = cuda_test_alloc(0, N), *host = calloc(1, N);
    CHECK(host != NULL);
    registrations(t, dev, host);
    in_process(t, dev, host);
    caller_context(t);
    vmm_parts(t);
    kvb_engine_destroy(t);
    ct_free(dev);
    free(host);
    return 0;
}
