/* Run-time loaded CUDA driver API (cuda_drv.h): the symbol table, contexts,
 * batched copies on per-thread streams and the pinned staging cache. */
#include "engine/cuda_drv.h"
#include "core/core.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_DEVICES 64

static kvb__cuda_api_t g_api;
static const kvb__cuda_api_t *g_ok;
static char g_why[512];
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static pthread_mutex_t g_ctx_mu = PTHREAD_MUTEX_INITIALIZER;
static kvb_CUcontext g_ctx[MAX_DEVICES];

typedef struct sym {
    const char *name;
    size_t off;
    bool optional;
} sym_t;

#define S(field, name)                                                                             \
    {                                                                                              \
        name, offsetof(kvb__cuda_api_t, field), false                                              \
    }
#define O(field)                                                                                   \
    {                                                                                              \
#field, offsetof(kvb__cuda_api_t, field), true                                             \
    }
static const sym_t g_syms[] = {
    S(cuInit, "cuInit"),
    S(cuDriverGetVersion, "cuDriverGetVersion"),
    S(cuGetErrorString, "cuGetErrorString"),
    S(cuDeviceGetCount, "cuDeviceGetCount"),
    S(cuDeviceGet, "cuDeviceGet"),
    S(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain"),
    S(cuCtxSetCurrent, "cuCtxSetCurrent"),
    S(cuCtxGetCurrent, "cuCtxGetCurrent"),
    S(cuPointerGetAttribute, "cuPointerGetAttribute"),
    S(cuMemAlloc, "cuMemAlloc_v2"),
    S(cuMemFree, "cuMemFree_v2"),
    S(cuMemHostAlloc, "cuMemHostAlloc"),
    S(cuMemFreeHost, "cuMemFreeHost"),
    S(cuMemcpy, "cuMemcpy"),
    S(cuMemcpyAsync, "cuMemcpyAsync"),
    S(cuMemcpy2DAsync, "cuMemcpy2DAsync_v2"),
    S(cuIpcGetMemHandle, "cuIpcGetMemHandle"),
    S(cuIpcOpenMemHandle, "cuIpcOpenMemHandle_v2"),
    S(cuIpcCloseMemHandle, "cuIpcCloseMemHandle"),
    S(cuStreamCreate, "cuStreamCreate"),
    S(cuStreamDestroy, "cuStreamDestroy_v2"),
    S(cuStreamSynchronize, "cuStreamSynchronize"),
    {"cuMemcpyBatchAsync_v2", offsetof(kvb__cuda_api_t, cuMemcpyBatchAsync), true},
    O(cuMemRetainAllocationHandle),
    O(cuMemRelease),
    O(cuMemExportToShareableHandle),
    O(cuMemImportFromShareableHandle),
    O(cuMemAddressReserve),
    O(cuMemAddressFree),
    O(cuMemMap),
    O(cuMemUnmap),
    O(cuMemSetAccess),
};
#undef S
#undef O

static void load(void)
{
    const char *path = getenv("KVBRIDGE_CUDA_LIB");
    if (path == NULL || path[0] == '\0')
        path = "libcuda.so.1";
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (h == NULL) {
        snprintf(g_why, sizeof(g_why), "no CUDA driver: cannot load %s (%s)", path, dlerror());
        return;
    }
    for (size_t i = 0; i < sizeof(g_syms) / sizeof(g_syms[0]); i++) {
        void *f = dlsym(h, g_syms[i].name);
        if (f == NULL && !g_syms[i].optional) {
            snprintf(g_why, sizeof(g_why), "CUDA driver %s lacks %s (driver too old?)", path,
                     g_syms[i].name);
            return; /* the handle stays open: harmless, and dlclose may run destructors */
        }
        memcpy((char *)&g_api + g_syms[i].off, &f, sizeof(f));
    }
    kvb_CUresult r = g_api.cuInit(0);
    int n = 0;
    if (r == KVB_CUDA_SUCCESS)
        r = g_api.cuDeviceGetCount(&n);
    if (r != KVB_CUDA_SUCCESS || n <= 0) {
        snprintf(g_why, sizeof(g_why), "CUDA driver %s: %s", path,
                 r != KVB_CUDA_SUCCESS ? "cuInit failed" : "no CUDA device");
        if (r != KVB_CUDA_SUCCESS) {
            const char *s = NULL;
            if (g_api.cuGetErrorString(r, &s) == KVB_CUDA_SUCCESS && s != NULL)
                snprintf(g_why + strlen(g_why), sizeof(g_why) - strlen(g_why), " (%s)", s);
        }
        return;
    }
    KVB_LOGD("CUDA driver %s loaded: %d device(s)", path, n);
    g_ok = &g_api;
}

const kvb__cuda_api_t *kvb__cuda(void)
{
    pthread_once(&g_once, load);
    return g_ok;
}

bool kvb__cuda_has_vmm(void)
{
    const kvb__cuda_api_t *cu = kvb__cuda();
    return cu != NULL && cu->cuMemRetainAllocationHandle != NULL && cu->cuMemRelease != NULL &&
           cu->cuMemExportToShareableHandle != NULL && cu->cuMemImportFromShareableHandle != NULL &&
           cu->cuMemAddressReserve != NULL && cu->cuMemAddressFree != NULL &&
           cu->cuMemMap != NULL && cu->cuMemUnmap != NULL && cu->cuMemSetAccess != NULL;
}

const char *kvb__cuda_why(void)
{
    return kvb__cuda() != NULL ? "" : g_why;
}

const char *kvb__cuda_errstr(kvb_CUresult r)
{
    const char *s = NULL;
    if (kvb__cuda() == NULL || g_api.cuGetErrorString(r, &s) != KVB_CUDA_SUCCESS || s == NULL)
        return "unknown CUDA error";
    return s;
}

static kvb_status_t bind(int device, char *why, size_t wl)
{
    const kvb__cuda_api_t *cu = kvb__cuda();
    if (cu == NULL) {
        snprintf(why, wl, "%s", g_why);
        return KVB_ERR_UNSUPPORTED;
    }
    if (device < 0 || device >= MAX_DEVICES) {
        snprintf(why, wl, "CUDA device %d out of range", device);
        return KVB_ERR_INVALID;
    }
    kvb_CUresult r = KVB_CUDA_SUCCESS;
    pthread_mutex_lock(&g_ctx_mu);
    if (g_ctx[device] == NULL) {
        kvb_CUdevice d;
        r = cu->cuDeviceGet(&d, device);
        if (r == KVB_CUDA_SUCCESS)
            r = cu->cuDevicePrimaryCtxRetain(&g_ctx[device], d);
    }
    kvb_CUcontext ctx = g_ctx[device];
    pthread_mutex_unlock(&g_ctx_mu);
    if (r == KVB_CUDA_SUCCESS)
        r = cu->cuCtxSetCurrent(ctx);
    if (r != KVB_CUDA_SUCCESS) {
        snprintf(why, wl, "CUDA device %d: no context: %s", device, kvb__cuda_errstr(r));
        return KVB_ERR_IO;
    }
    return KVB_OK;
}

kvb_status_t kvb__cuda_enter(int device, kvb__cuda_scope_t *s, char *why, size_t wl)
{
    s->entered = false;
    s->prev = NULL;
    if (kvb__cuda() != NULL && g_api.cuCtxGetCurrent(&s->prev) != KVB_CUDA_SUCCESS)
        s->prev = NULL;
    kvb_status_t st = bind(device, why, wl);
    s->entered = st == KVB_OK;
    return st;
}

void kvb__cuda_leave(kvb__cuda_scope_t *s)
{
    if (s->entered)
        g_api.cuCtxSetCurrent(s->prev); /* NULL: none, as before */
    s->entered = false;
}

int kvb__cuda_classify(uint64_t addr, int *device_p, uint64_t *base_p, uint64_t *size_p, char *why,
                       size_t wl)
{
    const kvb__cuda_api_t *cu = kvb__cuda();
    unsigned int type = 0;
    int dev = 0;
    kvb_CUdeviceptr base = 0;
    size_t size = 0;
    if (cu == NULL)
        return 0;
    /* Host memory CUDA never saw answers CUDA_ERROR_INVALID_VALUE. A thread
     * without a current context may be refused: ask again inside one. */
    kvb_CUresult r = cu->cuPointerGetAttribute(&type, KVB_CU_POINTER_ATTRIBUTE_MEMORY_TYPE, addr);
    if (r == KVB_CUDA_ERROR_INVALID_CONTEXT) {
        kvb__cuda_scope_t sc = {NULL, false};
        if (kvb__cuda_enter(0, &sc, why, wl) == KVB_OK)
            r = cu->cuPointerGetAttribute(&type, KVB_CU_POINTER_ATTRIBUTE_MEMORY_TYPE, addr);
        kvb__cuda_leave(&sc);
    }
    if (r == KVB_CUDA_ERROR_INVALID_VALUE ||
        (r == KVB_CUDA_SUCCESS && type != KVB_CU_MEMORYTYPE_DEVICE))
        return 0;
    if (r == KVB_CUDA_SUCCESS)
        r = cu->cuPointerGetAttribute(&dev, KVB_CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, addr);
    if (r == KVB_CUDA_SUCCESS)
        r = cu->cuPointerGetAttribute(&base, KVB_CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, addr);
    if (r == KVB_CUDA_SUCCESS)
        r = cu->cuPointerGetAttribute(&size, KVB_CU_POINTER_ATTRIBUTE_RANGE_SIZE, addr);
    if (r != KVB_CUDA_SUCCESS) {
        snprintf(why, wl, "cuPointerGetAttribute(0x%llx) failed: %s", (unsigned long long)addr,
                 kvb__cuda_errstr(r));
        return -1;
    }
    *device_p = dev;
    *base_p = base;
    *size_p = size;
    return 1;
}

/* ---- batched copies ---- */

typedef struct tl_stream {
    kvb_CUstream s[MAX_DEVICES];
} tl_stream_t;

static pthread_key_t g_stream_key;
static pthread_once_t g_stream_once = PTHREAD_ONCE_INIT;

static void stream_free(void *p)
{
    tl_stream_t *t = p;
    for (int i = 0; i < MAX_DEVICES; i++)
        if (t->s[i] != NULL)
            g_api.cuStreamDestroy(t->s[i]);
    free(t);
}

static void stream_key(void)
{
    pthread_key_create(&g_stream_key, stream_free);
}

/* This thread's stream in device's context (bound). */
static kvb_CUstream thread_stream(int device, char *why, size_t wl)
{
    pthread_once(&g_stream_once, stream_key);
    tl_stream_t *t = pthread_getspecific(g_stream_key);
    if (t == NULL) {
        t = calloc(1, sizeof(*t));
        if (t == NULL || pthread_setspecific(g_stream_key, t) != 0) {
            free(t);
            snprintf(why, wl, "out of memory");
            return NULL;
        }
    }
    if (t->s[device] == NULL) {
        kvb_CUresult r = g_api.cuStreamCreate(&t->s[device], KVB_CU_STREAM_NON_BLOCKING);
        if (r != KVB_CUDA_SUCCESS) {
            t->s[device] = NULL;
            snprintf(why, wl, "cuStreamCreate failed: %s", kvb__cuda_errstr(r));
        }
    }
    return t->s[device];
}

/* Length of the run of copies starting at v[i] with v[i]'s length and
 * constant strides on both sides (>= the length: the rows never overlap). */
static size_t run_len(const kvb__cuda_copy_t *v, size_t i, size_t n)
{
    if (i + 1 >= n || v[i + 1].len != v[i].len || v[i + 1].src <= v[i].src ||
        v[i + 1].dst <= v[i].dst)
        return 1;
    uint64_t ss = v[i + 1].src - v[i].src, ds = v[i + 1].dst - v[i].dst;
    /* the driver's pitch limit is 2^31-1 on current GPUs */
    if (ss < v[i].len || ds < v[i].len || ss >= (1ull << 31) || ds >= (1ull << 31))
        return 1;
    size_t k = i + 1;
    while (k + 1 < n && v[k + 1].len == v[i].len && v[k + 1].src - v[k].src == ss &&
           v[k + 1].dst - v[k].dst == ds && v[k + 1].src > v[k].src && v[k + 1].dst > v[k].dst)
        k++;
    return k - i + 1;
}

static kvb_CUresult copy_2d(const kvb__cuda_copy_t *v, size_t rows, kvb_CUstream s)
{
    kvb_CUDA_MEMCPY2D m = {0};
    m.srcMemoryType = m.dstMemoryType = KVB_CU_MEMORYTYPE_UNIFIED;
    m.srcDevice = v[0].src;
    m.dstDevice = v[0].dst;
    m.srcPitch = rows > 1 ? v[1].src - v[0].src : v[0].len;
    m.dstPitch = rows > 1 ? v[1].dst - v[0].dst : v[0].len;
    m.WidthInBytes = v[0].len;
    m.Height = rows;
    return g_api.cuMemcpy2DAsync(&m, s);
}

/* The allocation the last span was found in (one per side of a batch). */
typedef struct alloc_range {
    uint64_t base, size;
} alloc_range_t;

static bool in_range(const alloc_range_t *a, uint64_t p, uint64_t n)
{
    return a->size > 0 && p >= a->base && p - a->base <= a->size && n <= a->size - (p - a->base);
}

/* Does [p, p+n) lie inside one device allocation, or (both ends) in memory
 * the driver does not know (host memory)? A 2-D copy's rows must: equally
 * spaced rows can run from one layer's buffer into the next one's, which
 * the driver would refuse as one copy. */
static bool one_alloc(alloc_range_t *a, uint64_t p, uint64_t n)
{
    kvb_CUdeviceptr base = 0;
    size_t size = 0;
    if (in_range(a, p, n))
        return true;
    kvb_CUresult r =
        g_api.cuPointerGetAttribute(&base, KVB_CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, p);
    if (r == KVB_CUDA_ERROR_INVALID_VALUE)
        return g_api.cuPointerGetAttribute(&base, KVB_CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
                                           p + n - 1) == KVB_CUDA_ERROR_INVALID_VALUE;
    if (r != KVB_CUDA_SUCCESS ||
        g_api.cuPointerGetAttribute(&size, KVB_CU_POINTER_ATTRIBUTE_RANGE_SIZE, p) !=
            KVB_CUDA_SUCCESS)
        return false;
    *a = (alloc_range_t){base, size};
    return in_range(a, p, n);
}

/* Rows v[0..k) as one 2-D copy when both spans lie in one allocation each;
 * false: copy them one by one. */
static bool run_ok(alloc_range_t sides[2], const kvb__cuda_copy_t *v, size_t k)
{
    uint64_t ss = v[1].src - v[0].src, ds = v[1].dst - v[0].dst;
    return one_alloc(&sides[0], v[0].src, ss * (k - 1) + v[0].len) &&
           one_alloc(&sides[1], v[0].dst, ds * (k - 1) + v[0].len);
}

#define BATCH_MAX 1024 /* copies per cuMemcpyBatchAsync call */

/* Single copies v[0..n): one batched call per BATCH_MAX where the driver
 * has it (a driver refusing it falls back to one call each). */
static kvb_CUresult copy_singles(const kvb__cuda_copy_t *v, size_t n, kvb_CUstream s)
{
    kvb_CUresult r = KVB_CUDA_SUCCESS;
    if (n >= 2 && g_api.cuMemcpyBatchAsync != NULL) {
        kvb_CUdeviceptr d[BATCH_MAX], src[BATCH_MAX];
        size_t len[BATCH_MAX], idx = 0;
        kvb_CUmemcpyAttributes a = {.srcAccessOrder = KVB_CU_MEMCPY_SRC_ACCESS_ORDER_STREAM};
        size_t done = 0;
        while (done < n && r == KVB_CUDA_SUCCESS) {
            size_t k = n - done < BATCH_MAX ? n - done : BATCH_MAX;
            for (size_t i = 0; i < k; i++) {
                d[i] = v[done + i].dst;
                src[i] = v[done + i].src;
                len[i] = v[done + i].len;
            }
            r = g_api.cuMemcpyBatchAsync(d, src, len, k, &a, &idx, 1, s);
            if (r == KVB_CUDA_SUCCESS)
                done += k;
        }
        if (r == KVB_CUDA_SUCCESS)
            return r;
        v += done, n -= done;
        r = KVB_CUDA_SUCCESS;
    }
    for (size_t i = 0; i < n && r == KVB_CUDA_SUCCESS; i++)
        r = g_api.cuMemcpyAsync(v[i].dst, v[i].src, v[i].len, s);
    return r;
}

kvb_status_t kvb__cuda_copy_batch(int device, const kvb__cuda_copy_t *v, size_t n, char *why,
                                  size_t wl)
{
    kvb__cuda_scope_t sc = {NULL, false};
    kvb_status_t st = kvb__cuda_enter(device, &sc, why, wl);
    kvb_CUstream s = st == KVB_OK ? thread_stream(device, why, wl) : NULL;
    if (s == NULL) {
        kvb__cuda_leave(&sc);
        return st != KVB_OK ? st : KVB_ERR_IO;
    }
    kvb_CUresult r = KVB_CUDA_SUCCESS;
    size_t i = 0, singles = 0;
    alloc_range_t sides[2] = {{0, 0}, {0, 0}};
    while (i < n && r == KVB_CUDA_SUCCESS) {
        size_t k = run_len(v, i, n);
        if (k < 4 || !run_ok(sides, v + i, k)) { /* short, or across allocations */
            i += k, singles += k;
            continue;
        }
        r = copy_singles(v + i - singles, singles, s);
        /* a driver refusing the 2-D form: the rows one by one */
        if (r == KVB_CUDA_SUCCESS && copy_2d(v + i, k, s) != KVB_CUDA_SUCCESS)
            r = copy_singles(v + i, k, s);
        singles = 0;
        i += k;
    }
    if (r == KVB_CUDA_SUCCESS)
        r = copy_singles(v + n - singles, singles, s);
    /* Wait even after a failure: copies already queued read the sources. */
    kvb_CUresult r2 = g_api.cuStreamSynchronize(s);
    kvb__cuda_leave(&sc);
    if (r == KVB_CUDA_SUCCESS)
        r = r2;
    if (r != KVB_CUDA_SUCCESS) {
        snprintf(why, wl, "CUDA copy on device %d failed: %s", device, kvb__cuda_errstr(r));
        return KVB_ERR_IO;
    }
    return KVB_OK;
}

kvb_status_t kvb__mem_copy(void *dst, const void *src, size_t n)
{
    char why[300] = "";
    int dd = -1, ds = -1;
    uint64_t b, s;
    int kd = kvb__cuda_classify((uint64_t)(uintptr_t)dst, &dd, &b, &s, why, sizeof(why));
    int ks = kvb__cuda_classify((uint64_t)(uintptr_t)src, &ds, &b, &s, why, sizeof(why));
    if (kd == 0 && ks == 0) {
        memcpy(dst, src, n);
        return KVB_OK;
    }
    kvb__cuda_copy_t c = {(uint64_t)(uintptr_t)dst, (uint64_t)(uintptr_t)src, n};
    kvb_status_t st = kd < 0 || ks < 0
                          ? KVB_ERR_IO
                          : kvb__cuda_copy_batch(kd > 0 ? dd : ds, &c, 1, why, sizeof(why));
    if (st != KVB_OK)
        KVB_LOGW("copy of %zu bytes %p -> %p: %s", n, src, dst, why);
    return st;
}

/* ---- pinned staging cache ---- */

#define STAGE_MIN (1u << 20)
#define STAGE_CLASSES 48

static pthread_mutex_t g_stage_mu = PTHREAD_MUTEX_INITIALIZER;
static void **g_stage_free[STAGE_CLASSES]; /* per size class: a stack */
static size_t g_stage_n[STAGE_CLASSES], g_stage_cap[STAGE_CLASSES];
static uint64_t g_stage_cached, g_stage_max = UINT64_MAX;

static unsigned stage_class(size_t len)
{
    unsigned c = 0;
    while (((size_t)STAGE_MIN << c) < len && c + 1 < STAGE_CLASSES)
        c++;
    return c;
}

void *kvb__cuda_stage_get(size_t len)
{
    unsigned c = stage_class(len);
    void *p = NULL;
    pthread_mutex_lock(&g_stage_mu);
    if (g_stage_max == UINT64_MAX)
        g_stage_max =
            (uint64_t)kvb__env_int("KVBRIDGE_CUDA_STAGING_CACHE", NULL, 256ll << 20, 0, INT64_MAX);
    if (g_stage_n[c] > 0) {
        p = g_stage_free[c][--g_stage_n[c]];
        g_stage_cached -= (uint64_t)STAGE_MIN << c;
    }
    pthread_mutex_unlock(&g_stage_mu);
    char why[8];
    kvb__cuda_scope_t sc = {NULL, false};
    /* Portable: pinned for every context, whichever device copies from it. */
    if (p == NULL && kvb__cuda_enter(0, &sc, why, sizeof(why)) == KVB_OK &&
        g_api.cuMemHostAlloc(&p, (size_t)STAGE_MIN << c, KVB_CU_MEMHOSTALLOC_PORTABLE) !=
            KVB_CUDA_SUCCESS)
        p = NULL;
    kvb__cuda_leave(&sc);
    return p;
}

void kvb__cuda_stage_put(void *buf, size_t len)
{
    unsigned c = stage_class(len);
    uint64_t sz = (uint64_t)STAGE_MIN << c;
    if (buf == NULL)
        return;
    pthread_mutex_lock(&g_stage_mu);
    if (g_stage_cached + sz <= g_stage_max && g_stage_n[c] == g_stage_cap[c]) {
        size_t cap = g_stage_cap[c] ? g_stage_cap[c] * 2 : 4;
        void **v = realloc(g_stage_free[c], cap * sizeof(*v));
        if (v != NULL) {
            g_stage_free[c] = v;
            g_stage_cap[c] = cap;
        }
    }
    if (g_stage_cached + sz <= g_stage_max && g_stage_n[c] < g_stage_cap[c]) {
        g_stage_free[c][g_stage_n[c]++] = buf;
        g_stage_cached += sz;
        buf = NULL;
    }
    pthread_mutex_unlock(&g_stage_mu);
    if (buf != NULL)
        g_api.cuMemFreeHost(buf);
}
