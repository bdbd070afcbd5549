/* The direct lane's background warmer (src/engine/lane/direct/warm.c) and huge pages for
 * kvb_mem_alloc (src/engine/hugepage.c). Two engines in this process on
 * 127.0.0.1. Checked: the warmer walks the whole mapping without changing a
 * byte while writes land in it, never fills a page the owner has not
 * allocated (sparse files stay sparse), stays off with
 * KVBRIDGE_DIRECT_WARM_CPU=0; KVBRIDGE_HUGEPAGES picks or falls back. Every
 * wait is bounded. */
#include "kvb_test.h"

#include "engine/lane/direct/direct.h"
#include "engine/shmem.h"

#include <kvbridge/engine.h>

#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#define MiB (1u << 20)
#define SRC_BYTES (8u * MiB)
#define TGT_BYTES (48u * MiB)
#define PAGE 4096u

static uint8_t *g_src;
static uint64_t g_rng = 0x243f6a8885a308d3ull;

static uint64_t addr(const void *p)
{
    return (uint64_t)(uintptr_t)p;
}

static kvb_engine_h make_engine(void)
{
    kvb_engine_params_t p = {0};
    kvb_engine_h e;
    p.field_mask = KVB_ENGINE_PARAM_TRANSPORT;
    p.transport = KVB_TRANSPORT_AUTO;
    CHECK_EQ(kvb_engine_create(&p, &e), KVB_OK);
    return e;
}

/* A target over touched bytes of a TGT_BYTES kvb_mem_alloc region (the rest
 * never touched by anyone: sparse), and a writer with the direct lane up. */
typedef struct pair {
    kvb_engine_h w, t;
    uint8_t *mem;
} pair_t;

static void pair_open(pair_t *p, size_t touched)
{
    void *m;
    CHECK_EQ(kvb_mem_alloc(TGT_BYTES, &m), KVB_OK);
    p->mem = m;
    for (size_t i = 0; i < touched; i++)
        p->mem[i] = (uint8_t)(i * 131 + 7);
    p->t = make_engine();
    CHECK_EQ(kvb_engine_register(p->t, p->mem, TGT_BYTES, KVB_MEM_HOST), KVB_OK);
    p->w = make_engine();
    CHECK_EQ(kvb_engine_register(p->w, g_src, SRC_BYTES, KVB_MEM_HOST), KVB_OK);
    kvb_block_t b = {addr(g_src), addr(p->mem), 8};
    p->mem[0] = g_src[0] ^ 1; /* so the write is seen */
    CHECK_EQ(kvb_engine_write(p->w, kvb_engine_session_id(p->t), &b, 1, 10.0), KVB_OK);
    CHECK_EQ(kvb_engine_session_direct(p->w, kvb_engine_session_id(p->t)), 1);
}

static void pair_close(pair_t *p)
{
    kvb_engine_destroy(p->w);
    kvb_engine_destroy(p->t);
    kvb_mem_free(p->mem);
}

/* Pages of [p, p + n) resident in the owner's mapping. */
static size_t resident(const uint8_t *p, size_t n)
{
    unsigned char *v = malloc(n / PAGE);
    size_t k = 0;
    CHECK(v != NULL && mincore((void *)p, n, v) == 0);
    for (size_t i = 0; i < n / PAGE; i++)
        k += v[i] & 1;
    free(v);
    return k;
}

/* Writes land while the warmer walks the file: afterwards every byte is
 * what the writes and the owner put there, and the warmer covered every
 * resident page of the file. */
static void test_warm_keeps_bytes(void)
{
    pair_t p;
    setenv("KVBRIDGE_DIRECT_WARM_CPU", "5", 1); /* a slow walk: the writes overlap it */
    pair_open(&p, TGT_BYTES);
    unsetenv("KVBRIDGE_DIRECT_WARM_CPU");
    uint8_t *want = malloc(TGT_BYTES);
    CHECK(want != NULL);
    memcpy(want, p.mem, TGT_BYTES);
    const char *sid = kvb_engine_session_id(p.t);
    kvb_block_t b[64];
    uint64_t want_pages = TGT_BYTES / PAGE, warmed = 0;
    double end = kvb_test_now_s() + 20;
    int rounds = 0;
    while (((warmed = kvb__warm_pages(p.w)) < want_pages || rounds < 10) &&
           kvb_test_now_s() < end) {
        for (int i = 0; i < 64; i++) { /* 64 KiB each at distinct slots of this round */
            b[i].len = 64 * 1024;
            b[i].dst = addr(p.mem) + (uint64_t)(i * 11 + rounds % 11) % 700 * b[i].len;
            b[i].src = addr(g_src) + kvb_test_xorshift(&g_rng) % (SRC_BYTES - b[i].len);
        }
        for (int i = 0; i < 64; i++) /* later blocks win on overlap, as the engine's order */
            for (int j = i + 1; j < 64; j++)
                CHECK(b[i].dst != b[j].dst);
        CHECK_EQ(kvb_engine_write(p.w, sid, b, 64, 10.0), KVB_OK);
        for (int i = 0; i < 64; i++)
            memcpy(want + (b[i].dst - addr(p.mem)), (const void *)(uintptr_t)b[i].src, b[i].len);
        rounds++;
    }
    if (warmed < want_pages) {
        fprintf(stderr, "warmer covered %llu of %llu pages in 20 s\n", (unsigned long long)warmed,
                (unsigned long long)want_pages);
        exit(1);
    }
    CHECK(rounds >= 10);
    fprintf(stderr, "test_engine_warm: %d write rounds while the warmer walked\n", rounds);
    CHECK(memcmp(p.mem, want, TGT_BYTES) == 0);
    free(want);
    pair_close(&p);
}

/* The owner touched a quarter of its file: the warmer leaves the rest
 * unallocated (no page appears in the owner's view) and warms only that. */
static void test_warm_sparse(void)
{
    pair_t p;
    pair_open(&p, TGT_BYTES / 4);
    size_t before = resident(p.mem, TGT_BYTES);
    double end = kvb_test_now_s() + 20;
    /* The job ends after one walk of the whole file: wait until it left the
     * queue (the count stops growing) or the time is up. */
    uint64_t last = (uint64_t)-1, now;
    while ((now = kvb__warm_pages(p.w)) != last && kvb_test_now_s() < end) {
        last = now;
        usleep(200 * 1000);
    }
    CHECK(now >= TGT_BYTES / 4 / PAGE);
    CHECK(now <= TGT_BYTES / 4 / PAGE + 2); /* + the written page, rounding */
    CHECK_EQ(resident(p.mem, TGT_BYTES), before);
    pair_close(&p);
}

/* KVBRIDGE_DIRECT_WARM_CPU=0: no warmer (synchronous pre-fault instead). */
static void test_warm_off(void)
{
    setenv("KVBRIDGE_DIRECT_WARM_CPU", "0", 1);
    pair_t p;
    pair_open(&p, TGT_BYTES);
    CHECK(p.w->direct->warm == NULL);
    usleep(100 * 1000);
    CHECK_EQ(kvb__warm_pages(p.w), 0);
    pair_close(&p);
    unsetenv("KVBRIDGE_DIRECT_WARM_CPU");
}

/* KVBRIDGE_HUGEPAGES: off gives 4 KiB pages; hugetlb without enough reserved
 * pages, or thp where shmem THP is off, still allocates (4 KiB pages), and
 * the memory works for the direct lane either way. */
static void test_hugepages(void)
{
    setenv("KVBRIDGE_HUGEPAGES", "off", 1);
    CHECK_EQ(kvb__huge_choose(TGT_BYTES), KVB_HUGE_NONE);
    const char *kinds[] = {"hugetlb", "thp", "auto", "bogus"};
    for (int i = 0; i < 4; i++) {
        setenv("KVBRIDGE_HUGEPAGES", kinds[i], 1);
        kvb__huge_t h = kvb__huge_choose(TGT_BYTES);
        CHECK(i != 0 || h != KVB_HUGE_THP);
        CHECK(i != 1 || h != KVB_HUGE_TLB);
        pair_t p;
        pair_open(&p, TGT_BYTES);
        kvb__shm_ref_t ref;
        CHECK(kvb__shm_lookup(addr(p.mem), TGT_BYTES, &ref));
        CHECK(ref.file_size >= TGT_BYTES + PAGE);
        CHECK(ref.file_size % PAGE == 0);
        pair_close(&p);
    }
    /* A hugetlb file is whole huge pages, the trailer in the last 4 KiB
     * (only where the host has reserved pages free). */
    uint8_t *base;
    kvb__shm_ref_t ref;
    if (kvb__shm_create_ex(3 * MiB, KVB_HUGE_TLB, &base, &ref) == KVB_OK) {
        CHECK_EQ(ref.file_size % KVB_HUGE_PAGE, 0);
        CHECK_EQ(memcmp(base + ref.file_size - PAGE, "KVBSHM01", 8), 0);
        kvb__shm_destroy(base, &ref);
    }
    unsetenv("KVBRIDGE_HUGEPAGES");
}

int main(void)
{
    unsetenv("KVBRIDGE_DIRECT_WARM_CPU");
    g_src = mmap(NULL, SRC_BYTES, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(g_src != MAP_FAILED);
    for (size_t i = 0; i < SRC_BYTES; i += 8) {
        uint64_t x = kvb_test_xorshift(&g_rng);
        memcpy(g_src + i, &x, 8);
    }
    test_warm_keeps_bytes();
    test_warm_sparse();
    test_warm_off();
    test_hugepages();
    munmap(g_src, SRC_BYTES);
    printf("test_engine_warm: ok\n");
    return 0;
}
