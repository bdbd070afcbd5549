/* Pieces of the CUDA tests (tests/cuda): device memory from the driver-API
 * test double, and a target process (forked) that holds device memory in an
 * engine and answers commands over pipes, so handles cross a process
 * boundary as they do between a prefill and a decode. */
#ifndef KVB_CUDA_TEST_H
#define KVB_CUDA_TEST_H

#include <kvbridge/engine.h>
#include <dlfcn.h>
#include <signal.h>
#include <stdbool.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cuda/cuda_double.h"
#include "kvb_test.h"

/* The driver the library loads (KVBRIDGE_CUDA_LIB, else libcuda.so.1),
 * opened here too: dlopen of one file gives one instance, so the test's
 * allocations are the ones the library sees. Against the test double the
 * stats entry point exists; against a real driver it does not (checks that
 * need it are skipped: scripts/gpu-check.sh). */
typedef struct cuda_test_api {
    int (*Init)(unsigned int);
    int (*DeviceGet)(int *, int);
    int (*DeviceGetCount)(int *);
    int (*PrimaryCtxRetain)(void **, int);
    int (*CtxSetCurrent)(void *);
    int (*CtxGetCurrent)(void **);
    int (*MemAlloc)(unsigned long long *, size_t);
    int (*MemFree)(unsigned long long);
    int (*HtoD)(unsigned long long, const void *, size_t);
    int (*DtoH)(void *, unsigned long long, size_t);
    void (*stats)(kvb_cuda_double_stats_t *);
    /* VMM (cuMemCreate and friends) */
    int (*MemCreate)(unsigned long long *, size_t, const void *, unsigned long long);
    int (*MemRelease)(unsigned long long);
    int (*AddressReserve)(unsigned long long *, size_t, size_t, unsigned long long,
                          unsigned long long);
    int (*MemMap)(unsigned long long, size_t, size_t, unsigned long long, unsigned long long);
    int (*SetAccess)(unsigned long long, size_t, const void *, size_t);
    int (*Granularity)(size_t *, const void *, int);
} cuda_test_api_t;

static inline const cuda_test_api_t *ct(void)
{
    static cuda_test_api_t a;
    static int loaded;
    if (!loaded) {
        const char *lib = getenv("KVBRIDGE_CUDA_LIB");
        void *h = dlopen(lib != NULL && lib[0] ? lib : "libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
        CHECK(h != NULL);
        *(void **)&a.Init = dlsym(h, "cuInit");
        *(void **)&a.DeviceGet = dlsym(h, "cuDeviceGet");
        *(void **)&a.DeviceGetCount = dlsym(h, "cuDeviceGetCount");
        *(void **)&a.PrimaryCtxRetain = dlsym(h, "cuDevicePrimaryCtxRetain");
        *(void **)&a.CtxSetCurrent = dlsym(h, "cuCtxSetCurrent");
        *(void **)&a.CtxGetCurrent = dlsym(h, "cuCtxGetCurrent");
        *(void **)&a.MemAlloc = dlsym(h, "cuMemAlloc_v2");
        *(void **)&a.MemFree = dlsym(h, "cuMemFree_v2");
        *(void **)&a.HtoD = dlsym(h, "cuMemcpyHtoD_v2");
        *(void **)&a.DtoH = dlsym(h, "cuMemcpyDtoH_v2");
        *(void **)&a.stats = dlsym(h, "kvb_cuda_double_stats"); /* NULL: a real driver */
        *(void **)&a.MemCreate = dlsym(h, "cuMemCreate");
        *(void **)&a.MemRelease = dlsym(h, "cuMemRelease");
        *(void **)&a.AddressReserve = dlsym(h, "cuMemAddressReserve");
        *(void **)&a.MemMap = dlsym(h, "cuMemMap");
        *(void **)&a.SetAccess = dlsym(h, "cuMemSetAccess");
        *(void **)&a.Granularity = dlsym(h, "cuMemGetAllocationGranularity");
        CHECK(a.Init && a.DeviceGet && a.DeviceGetCount && a.PrimaryCtxRetain && a.CtxSetCurrent &&
              a.CtxGetCurrent && a.MemAlloc && a.MemFree && a.HtoD && a.DtoH);
        loaded = 1;
    }
    return &a;
}

/* The double's counters; false against a real driver. */
static inline bool ct_stats(kvb_cuda_double_stats_t *s)
{
    memset(s, 0, sizeof(*s));
    if (ct()->stats == NULL)
        return false;
    ct()->stats(s);
    return true;
}

/* Device ordinal want, or 0 where the machine has fewer devices. */
static inline int ct_device(int want)
{
    int n = 0;
    CHECK_EQ(ct()->Init(0), 0);
    CHECK_EQ(ct()->DeviceGetCount(&n), 0);
    return want < n ? want : 0;
}

static inline void ct_htod(void *dev, const void *h, size_t n)
{
    CHECK_EQ(ct()->HtoD((unsigned long long)(uintptr_t)dev, h, n), 0);
}

static inline void ct_dtoh(void *h, const void *dev, size_t n)
{
    CHECK_EQ(ct()->DtoH(h, (unsigned long long)(uintptr_t)dev, n), 0);
}

static inline void ct_free(void *dev)
{
    CHECK_EQ(ct()->MemFree((unsigned long long)(uintptr_t)dev), 0);
}

/* Make device dev's primary context current here; the ordinal used. */
static inline int ct_ctx(int dev)
{
    void *ctx;
    int d;
    dev = ct_device(dev);
    CHECK_EQ(ct()->DeviceGet(&d, dev), 0);
    CHECK_EQ(ct()->PrimaryCtxRetain(&ctx, d), 0);
    CHECK_EQ(ct()->CtxSetCurrent(ctx), 0);
    return dev;
}

/* n bytes of device memory on device dev (its primary context made current). */
static inline uint8_t *cuda_test_alloc(int dev, size_t n)
{
    unsigned long long p = 0;
    ct_ctx(dev);
    CHECK_EQ(ct()->MemAlloc(&p, n), 0);
    return (uint8_t *)(uintptr_t)p;
}

/* n bytes (rounded up to the granularity) of VMM device memory on device
 * dev, as PyTorch's expandable segments make it: cuMemCreate asking for a
 * POSIX file descriptor handle, reserved, mapped, read-write on dev. With
 * KVB_CUDA_TEST_VMM_PART set (bytes, a multiple of the granularity), one
 * allocation of that size per part, mapped back to back in the one
 * reservation (a segment that grew). The address range stays reserved until
 * the process ends. */
static inline uint8_t *cuda_test_alloc_vmm(int dev, size_t n)
{
    struct {
        int type, handle_types, location[2];
        void *win32;
        unsigned char flags[8];
    } prop = {1 /* PINNED */, 1 /* POSIX fd */, {1 /* DEVICE */, 0}, NULL, {0}};
    struct {
        int location[2], flags;
    } acc = {{1, 0}, 3 /* READWRITE */};
    size_t g = 0;
    unsigned long long h = 0, va = 0;
    dev = ct_ctx(dev);
    prop.location[1] = acc.location[1] = dev;
    CHECK(ct()->MemCreate && ct()->MemRelease && ct()->AddressReserve && ct()->MemMap &&
          ct()->SetAccess && ct()->Granularity);
    CHECK_EQ(ct()->Granularity(&g, &prop, 0), 0);
    n = (n + g - 1) / g * g;
    const char *ps = getenv("KVB_CUDA_TEST_VMM_PART");
    size_t part = ps != NULL ? strtoull(ps, NULL, 10) : n;
    CHECK(part > 0 && part % g == 0);
    n = (n + part - 1) / part * part;
    CHECK_EQ(ct()->AddressReserve(&va, n, 0, 0, 0), 0);
    for (size_t off = 0; off < n; off += part) {
        CHECK_EQ(ct()->MemCreate(&h, part, &prop, 0), 0);
        CHECK_EQ(ct()->MemMap(va + off, part, 0, h, 0), 0);
        CHECK_EQ(ct()->MemRelease(h), 0);
    }
    CHECK_EQ(ct()->SetAccess(va, n, &acc, 1), 0);
    return (uint8_t *)(uintptr_t)va;
}

/* Pattern byte i of a buffer seeded s (distinct per seed and position). */
static inline uint8_t cuda_test_byte(uint64_t s, uint64_t i)
{
    return (uint8_t)((i * 131 + s * 17 + (i >> 12)) & 0xff);
}

static inline void cuda_test_fill(uint8_t *dev, size_t n, uint64_t seed)
{
    uint8_t *h = malloc(n);
    CHECK(h != NULL);
    for (size_t i = 0; i < n; i++)
        h[i] = cuda_test_byte(seed, i);
    ct_htod(dev, h, n);
    free(h);
}

/* ---- the target process ---- */

enum { TGT_READ = 1, TGT_GRANT, TGT_REVOKE, TGT_QUIT };

typedef struct tgt_cmd {
    int op;
    uint64_t a, b;
} tgt_cmd_t;

typedef struct tgt {
    pid_t pid;
    int to, from; /* pipes: commands, answers */
    char sid[128];
    uint64_t dev_addr; /* its registered device region (in its address space) */
    uint64_t dev_len;
    uint64_t dev2_addr; /* a second region in the same allocation */
    uint64_t dev2_len;
    uint64_t host_addr; /* a region in host memory (TGT_HOST_LEN bytes) */
} tgt_t;

#define TGT_HOST_LEN (1u << 20)

static inline void tgt_io(int fd, void *p, size_t n, bool rd)
{
    uint8_t *b = p;
    while (n > 0) {
        ssize_t k = rd ? read(fd, b, n) : write(fd, b, n);
        CHECK(k > 0);
        b += k, n -= (size_t)k;
    }
}

/* Child: an engine on tr with a host region (host_addr) and an 8 MiB
 * device allocation on device 1 (0 if the machine has one; VMM memory when
 * KVB_CUDA_TEST_VMM is set),
 * registered as [alloc+4096, +len) and [alloc+len+8192, +1 MiB) (offsets
 * inside one allocation), zeroed; then serve commands. */
static inline void tgt_main(kvb_transport_t tr, size_t len, int in, int out)
{
    kvb_engine_params_t p = {0};
    kvb_engine_h e;
    p.field_mask = KVB_ENGINE_PARAM_TRANSPORT;
    p.transport = tr;
    CHECK_EQ(kvb_engine_create(&p, &e), KVB_OK);
    bool vmm = getenv("KVB_CUDA_TEST_VMM") != NULL;
    uint8_t *a = vmm ? cuda_test_alloc_vmm(1, len + 8192 + (1u << 20))
                     : cuda_test_alloc(1, len + 8192 + (1u << 20));
    uint8_t *zero = calloc(1, len + 8192 + (1u << 20));
    ct_htod(a, zero, len + 8192 + (1u << 20));
    free(zero);
    kvb_mem_region_ex_t r[2] = {
        {KVB_MEM_REGION_FIELD_DEVICE, a + 4096, len, KVB_MEM_CUDA, ct_device(1), 0},
        {0, a + len + 8192, 1u << 20, KVB_MEM_AUTO, 0, 0},
    };
    CHECK_EQ(kvb_engine_register_ex(e, r, 2, sizeof(r[0])), KVB_OK);
    uint8_t *host = calloc(1, TGT_HOST_LEN);
    CHECK(host != NULL);
    CHECK_EQ(kvb_engine_register(e, host, TGT_HOST_LEN, KVB_MEM_HOST), KVB_OK);
    tgt_t t = {0};
    t.host_addr = (uint64_t)(uintptr_t)host;
    snprintf(t.sid, sizeof(t.sid), "%s", kvb_engine_session_id(e));
    t.dev_addr = (uint64_t)(uintptr_t)(a + 4096);
    t.dev_len = len;
    t.dev2_addr = (uint64_t)(uintptr_t)(a + len + 8192);
    t.dev2_len = 1u << 20;
    tgt_io(out, &t, sizeof(t), false);
    for (;;) {
        tgt_cmd_t c;
        tgt_io(in, &c, sizeof(c), true);
        if (c.op == TGT_READ) { /* device to host, then the bytes to the parent */
            uint8_t *h = malloc(c.b);
            CHECK(h != NULL);
            if (c.a >= t.host_addr && c.a - t.host_addr < TGT_HOST_LEN)
                memcpy(h, (const void *)(uintptr_t)c.a, c.b);
            else
                ct_dtoh(h, (const void *)(uintptr_t)c.a, c.b);
            tgt_io(out, h, c.b, false);
            free(h);
        } else if (c.op == TGT_GRANT) {
            uint64_t ep = 0;
            CHECK_EQ(kvb_engine_grant_writer(e, (uint32_t)c.a, &ep), KVB_OK);
            tgt_io(out, &ep, sizeof(ep), false);
        } else if (c.op == TGT_REVOKE) {
            int st = kvb_engine_revoke_writer(e, (uint32_t)c.a, c.b, 5.0);
            tgt_io(out, &st, sizeof(st), false);
        } else {
            break;
        }
    }
    kvb_engine_destroy(e);
    _exit(0);
}

static inline tgt_t tgt_start(kvb_transport_t tr, size_t len)
{
    int a[2], b[2];
    CHECK(pipe(a) == 0 && pipe(b) == 0);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        close(a[1]);
        close(b[0]);
        alarm(60); /* never outlive a stuck parent */
        tgt_main(tr, len, a[0], b[1]);
    }
    close(a[0]);
    close(b[1]);
    tgt_t t;
    tgt_io(b[0], &t, sizeof(t), true);
    t.pid = pid;
    t.to = a[1];
    t.from = b[0];
    return t;
}

/* The target's bytes [addr, addr+n) (its addresses), read on its device. */
static inline uint8_t *tgt_read(const tgt_t *t, uint64_t addr, size_t n)
{
    tgt_cmd_t c = {TGT_READ, addr, n};
    uint8_t *h = malloc(n);
    CHECK(h != NULL);
    tgt_io(t->to, &c, sizeof(c), false);
    tgt_io(t->from, h, n, true);
    return h;
}

/* The target's bytes [addr, addr+n) are want's, else exit(1) naming the
 * first wrong byte; what passed. */
static inline void tgt_expect(const tgt_t *t, uint64_t addr, const uint8_t *want, size_t n,
                              const char *what)
{
    uint8_t *got = tgt_read(t, addr, n);
    for (size_t i = 0; i < n; i++)
        if (got[i] != want[i]) {
            fprintf(stderr, "%s: byte %zu is %u, want %u\n", what, i, got[i], want[i]);
            exit(1);
        }
    free(got);
    TEST_PASS(what);
}

static inline uint64_t tgt_grant(const tgt_t *t, uint32_t tag)
{
    tgt_cmd_t c = {TGT_GRANT, tag, 0};
    uint64_t ep;
    tgt_io(t->to, &c, sizeof(c), false);
    tgt_io(t->from, &ep, sizeof(ep), true);
    return ep;
}

static inline int tgt_revoke(const tgt_t *t, uint32_t tag, uint64_t epoch)
{
    tgt_cmd_t c = {TGT_REVOKE, tag, epoch};
    int st;
    tgt_io(t->to, &c, sizeof(c), false);
    tgt_io(t->from, &st, sizeof(st), true);
    return st;
}

static inline void tgt_stop(tgt_t *t)
{
    tgt_cmd_t c = {TGT_QUIT, 0, 0};
    int status = 0;
    tgt_io(t->to, &c, sizeof(c), false);
    CHECK(waitpid(t->pid, &status, 0) == t->pid);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    close(t->to);
    close(t->from);
}

#endif
