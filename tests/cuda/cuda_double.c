/* libkvb_cuda_double.so: a CUDA driver-API test double, loaded by kvbridge
 * through KVBRIDGE_CUDA_LIB in place of libcuda.so.1. It proves plumbing, not
 * GPU speed: every entry point kvbridge resolves (cuda_drv.c) works on host
 * memory with the driver's contracts that matter to kvbridge:
 *
 * - "Device memory" (cuMemAlloc) is a memfd mapped twice: the address handed
 *   out is mapped PROT_NONE, so host code that touches device memory as if it
 *   were host memory (a memcpy, UCX) crashes as it would on a GPU; the double
 *   copies through a second, writable mapping.
 * - IPC handles (cuIpcGetMemHandle) name the allocating process and its memfd;
 *   cuIpcOpenMemHandle in another process opens /proc/<pid>/fd/<fd> and maps
 *   it the same way (at another address). Opening a handle in its own
 *   process, or twice in one process, fails as the driver can.
 * - Copies (plain, async, 2-D, batched) run at once; streams and events are
 *   tokens. Every range a copy names must lie wholly inside one allocation or
 *   outside all of them.
 * - Failures on demand: KVB_CUDA_DOUBLE_FAIL, a comma list of init (cuInit
 *   fails), ipc_get (export refused, as for VMM memory), ipc_open (import
 *   refused), batch (cuMemcpyBatchAsync unsupported), copy (copies fail),
 *   attr (cuPointerGetAttribute fails for device memory).
 * - KVB_CUDA_DOUBLE_DEVICES: device count (2); KVB_CUDA_DOUBLE_SLOW_MS: each
 *   cuStreamSynchronize takes that long (copies in flight, for fence tests).
 * - VMM mappings back to back in one reservation are one range to copies
 *   (several cuMemCreate handles, as an expandable segment maps them).
 * - kvb_cuda_double_stats(): calls counted, for tests that check batching;
 *   pinned host memory live and its peak. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cuda/cuda_double.h"

#define API __attribute__((visibility("default")))

typedef int CUresult;
typedef unsigned long long CUdeviceptr;

enum {
    OK = 0,
    E_INVALID_VALUE = 1,
    E_OUT_OF_MEMORY = 2,
    E_NOT_INITIALIZED = 3,
    E_NO_DEVICE = 100,
    E_INVALID_DEVICE = 101,
    E_INVALID_CONTEXT = 201,
    E_MAP_FAILED = 205,
    E_ALREADY_MAPPED = 208,
    E_INVALID_HANDLE = 400,
    E_ILLEGAL_ADDRESS = 700,
    E_NOT_SUPPORTED = 801,
    E_UNKNOWN = 999,
};

enum kind { K_ALLOC = 1, K_IPC, K_HOST, K_VMM };

/* A VMM physical allocation (cuMemCreate, or imported from a shareable
 * handle): a memfd; the handle value is this object's address. Counted:
 * the handle and each mapping hold it. */
typedef struct vmm {
    int fd, device, exportable;
    size_t size;
    int refs; /* g_mu */
} vmm_t;

typedef struct entry {
    enum kind kind;
    uint8_t *dev;   /* the address handed out (PROT_NONE for device memory) */
    uint8_t *alias; /* where the bytes are reachable */
    size_t size;
    int device, fd;
    uint64_t id; /* K_ALLOC: unique in the process; K_IPC: the exporter's */
    pid_t owner; /* K_IPC: exporting process */
    vmm_t *vmm;  /* K_VMM: the physical allocation mapped here */
    int access;  /* K_VMM: cuMemSetAccess granted read-write */
    struct entry *next;
} entry_t;

typedef struct ipc_handle { /* fits CU_IPC_HANDLE_SIZE (64) */
    char magic[8];
    int32_t pid, fd, device, pad;
    uint64_t size, id;
} ipc_handle_t;

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static entry_t *g_entries;
static uint64_t g_next_id = 1;
static int g_init;
static __thread int t_dev = -1; /* current context's device */
static kvb_cuda_double_stats_t g_stats;

static int fail(const char *what)
{
    const char *f = getenv("KVB_CUDA_DOUBLE_FAIL");
    size_t n = strlen(what);
    for (const char *p = f; p != NULL && *p != '\0';) {
        if (strncmp(p, what, n) == 0 && (p[n] == '\0' || p[n] == ','))
            return 1;
        p = strchr(p, ',');
        p = p != NULL ? p + 1 : NULL;
    }
    return 0;
}

static int ndevices(void)
{
    const char *s = getenv("KVB_CUDA_DOUBLE_DEVICES");
    int n = s != NULL ? atoi(s) : 2;
    return n < 0 ? 0 : n;
}

#define COUNT(field) __atomic_add_fetch(&g_stats.field, 1, __ATOMIC_RELAXED)

/* g_mu held. */
static entry_t *find(const void *p)
{
    for (entry_t *e = g_entries; e != NULL; e = e->next)
        if ((const uint8_t *)p >= e->dev && (const uint8_t *)p < e->dev + e->size)
            return e;
    return NULL;
}

/* The bytes of [p, p+n): an alias inside an allocation, p itself outside all
 * of them; NULL when the range straddles an allocation's end. */
static uint8_t *resolve(CUdeviceptr p, size_t n)
{
    uint8_t *a = (uint8_t *)(uintptr_t)p, *r = a;
    pthread_mutex_lock(&g_mu);
    entry_t *e = find(a);
    if (e != NULL && e->kind == K_VMM && !e->access)
        r = NULL; /* mapped but never made accessible: the GPU faults */
    else if (e != NULL)
        r = (size_t)(a - e->dev) + n <= e->size ? e->alias + (a - e->dev) : NULL;
    else
        for (entry_t *o = g_entries; o != NULL && r != NULL; o = o->next)
            if (o->dev > a && o->dev < a + n)
                r = NULL;
    pthread_mutex_unlock(&g_mu);
    return r;
}

/* The bytes of [p, p+n) up to the end of the mapping p lies in (*k bytes):
 * VMM mappings back to back in one reservation (several cuMemCreate handles,
 * as PyTorch's expandable segments map them) are one range of addresses to
 * a copy, as on a GPU; any other allocation's end is not. NULL: illegal. */
static uint8_t *resolve_part(CUdeviceptr p, size_t n, size_t *k)
{
    uint8_t *a = (uint8_t *)(uintptr_t)p;
    *k = n;
    pthread_mutex_lock(&g_mu);
    entry_t *e = find(a), *next = NULL;
    size_t left = e != NULL ? e->size - (size_t)(a - e->dev) : n;
    if (e != NULL && e->kind == K_VMM && left < n)
        next = find(e->dev + e->size);
    if (next != NULL && next->kind == K_VMM && next->dev == e->dev + e->size)
        *k = left; /* continued in the next mapping */
    pthread_mutex_unlock(&g_mu);
    return resolve(p, *k);
}

static CUresult copy(CUdeviceptr dst, CUdeviceptr src, size_t n)
{
    if (fail("copy"))
        return E_ILLEGAL_ADDRESS;
    while (n > 0) {
        size_t kd = 0, ks = 0;
        uint8_t *d = resolve_part(dst, n, &kd), *s = resolve_part(src, n, &ks);
        if (d == NULL || s == NULL)
            return E_ILLEGAL_ADDRESS;
        size_t k = kd < ks ? kd : ks;
        memmove(d, s, k);
        __atomic_add_fetch(&g_stats.bytes, k, __ATOMIC_RELAXED);
        dst += k, src += k, n -= k;
    }
    return OK;
}

static int is_device(CUdeviceptr p)
{
    pthread_mutex_lock(&g_mu);
    entry_t *e = find((void *)(uintptr_t)p);
    int d = e != NULL && e->kind != K_HOST;
    pthread_mutex_unlock(&g_mu);
    return d;
}

/* ---- init, devices, contexts ---- */

API CUresult cuInit(unsigned int flags)
{
    if (fail("init") || flags != 0)
        return fail("init") ? E_NO_DEVICE : E_INVALID_VALUE;
    g_init = 1;
    return OK;
}

API CUresult cuDriverGetVersion(int *v)
{
    *v = 13000;
    return OK;
}

API CUresult cuGetErrorString(CUresult r, const char **s)
{
    switch (r) {
    case OK:
        *s = "no error (double)";
        break;
    case E_INVALID_VALUE:
        *s = "invalid argument (double)";
        break;
    case E_NO_DEVICE:
        *s = "no CUDA-capable device is detected (double)";
        break;
    case E_INVALID_CONTEXT:
        *s = "invalid device context (double)";
        break;
    case E_ALREADY_MAPPED:
        *s = "resource already mapped (double)";
        break;
    case E_INVALID_HANDLE:
        *s = "invalid resource handle (double)";
        break;
    case E_ILLEGAL_ADDRESS:
        *s = "an illegal memory access was encountered (double)";
        break;
    case E_NOT_SUPPORTED:
        *s = "operation not supported (double)";
        break;
    default:
        *s = "unknown error (double)";
        break;
    }
    return OK;
}

API CUresult cuGetErrorName(CUresult r, const char **s)
{
    return cuGetErrorString(r, s);
}

API CUresult cuDeviceGetCount(int *n)
{
    if (!g_init)
        return E_NOT_INITIALIZED;
    *n = ndevices();
    return OK;
}

API CUresult cuDeviceGet(int *d, int ordinal)
{
    if (!g_init)
        return E_NOT_INITIALIZED;
    if (ordinal < 0 || ordinal >= ndevices())
        return E_INVALID_DEVICE;
    *d = ordinal;
    return OK;
}

API CUresult cuDevicePrimaryCtxRetain(void **ctx, int dev)
{
    if (dev < 0 || dev >= ndevices())
        return E_INVALID_DEVICE;
    *ctx = (void *)(uintptr_t)(0x1000 + dev);
    return OK;
}

API CUresult cuDevicePrimaryCtxRelease_v2(int dev)
{
    return dev < 0 || dev >= ndevices() ? E_INVALID_DEVICE : OK;
}

API CUresult cuCtxSetCurrent(void *ctx)
{
    uintptr_t c = (uintptr_t)ctx;
    if (c != 0 && (c < 0x1000 || c >= 0x1000 + (uintptr_t)ndevices()))
        return E_INVALID_CONTEXT;
    t_dev = c == 0 ? -1 : (int)(c - 0x1000);
    return OK;
}

API CUresult cuCtxGetCurrent(void **ctx)
{
    *ctx = t_dev < 0 ? NULL : (void *)(uintptr_t)(0x1000 + t_dev);
    return OK;
}

API CUresult cuCtxSynchronize(void)
{
    return OK;
}

/* ---- memory ---- */

/* Map fd's size bytes twice: PROT_NONE (handed out) and read-write. */
static entry_t *map_twice(int fd, size_t size, enum kind kind)
{
    entry_t *e = calloc(1, sizeof(*e));
    if (e == NULL)
        return NULL;
    e->dev = mmap(NULL, size, PROT_NONE, MAP_SHARED, fd, 0);
    e->alias = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (e->dev == MAP_FAILED || e->alias == MAP_FAILED) {
        if (e->dev != MAP_FAILED)
            munmap(e->dev, size);
        if (e->alias != MAP_FAILED)
            munmap(e->alias, size);
        free(e);
        return NULL;
    }
    e->kind = kind;
    e->size = size;
    e->fd = fd;
    e->device = t_dev;
    return e;
}

static void add(entry_t *e)
{
    pthread_mutex_lock(&g_mu);
    e->next = g_entries;
    g_entries = e;
    pthread_mutex_unlock(&g_mu);
}

/* Take the entry of kind k starting at p off the list. */
static entry_t *take(const void *p, enum kind k)
{
    pthread_mutex_lock(&g_mu);
    entry_t **pp = &g_entries;
    while (*pp != NULL && ((*pp)->dev != p || (*pp)->kind != k))
        pp = &(*pp)->next;
    entry_t *e = *pp;
    if (e != NULL)
        *pp = e->next;
    pthread_mutex_unlock(&g_mu);
    return e;
}

static void unmap(entry_t *e)
{
    munmap(e->dev, e->size);
    munmap(e->alias, e->size);
    if (e->fd >= 0)
        close(e->fd);
    free(e);
}

API CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n)
{
    if (t_dev < 0)
        return E_INVALID_CONTEXT;
    if (n == 0)
        return E_INVALID_VALUE;
    size_t size = (n + 4095) & ~(size_t)4095;
    int fd = memfd_create("kvb-cuda-double", MFD_CLOEXEC);
    if (fd < 0 || ftruncate(fd, (off_t)size) != 0) {
        if (fd >= 0)
            close(fd);
        return E_OUT_OF_MEMORY;
    }
    entry_t *e = map_twice(fd, size, K_ALLOC);
    if (e == NULL) {
        close(fd);
        return E_OUT_OF_MEMORY;
    }
    pthread_mutex_lock(&g_mu);
    e->id = g_next_id++;
    pthread_mutex_unlock(&g_mu);
    add(e);
    *p = (CUdeviceptr)(uintptr_t)e->dev;
    return OK;
}

API CUresult cuMemFree_v2(CUdeviceptr p)
{
    entry_t *e = take((void *)(uintptr_t)p, K_ALLOC);
    if (e == NULL)
        return E_INVALID_VALUE;
    unmap(e);
    return OK;
}

API CUresult cuMemHostAlloc(void **p, size_t n, unsigned int flags)
{
    entry_t *e = calloc(1, sizeof(*e));
    size_t size = (n + 4095) & ~(size_t)4095;
    if (e == NULL || posix_memalign((void **)&e->dev, 4096, size ? size : 4096) != 0) {
        free(e);
        return E_OUT_OF_MEMORY;
    }
    e->alias = e->dev;
    e->size = size;
    e->kind = K_HOST;
    e->fd = -1;
    e->device = t_dev;
    add(e);
    uint64_t now = __atomic_add_fetch(&g_stats.pinned_bytes, size, __ATOMIC_RELAXED);
    uint64_t peak = __atomic_load_n(&g_stats.pinned_peak, __ATOMIC_RELAXED);
    while (now > peak && !__atomic_compare_exchange_n(&g_stats.pinned_peak, &peak, now, 0,
                                                      __ATOMIC_RELAXED, __ATOMIC_RELAXED))
        ;
    *p = e->dev;
    return OK;
}

API CUresult cuMemAllocHost_v2(void **p, size_t n)
{
    return cuMemHostAlloc(p, n, 0);
}

API CUresult cuMemFreeHost(void *p)
{
    entry_t *e = take(p, K_HOST);
    if (e == NULL)
        return E_INVALID_VALUE;
    __atomic_sub_fetch(&g_stats.pinned_bytes, e->size, __ATOMIC_RELAXED);
    free(e->dev);
    free(e);
    return OK;
}

API CUresult cuPointerGetAttribute(void *data, int attr, CUdeviceptr p)
{
    pthread_mutex_lock(&g_mu);
    entry_t *e = find((void *)(uintptr_t)p);
    entry_t c = e != NULL ? *e : (entry_t){0};
    pthread_mutex_unlock(&g_mu);
    if (e == NULL)
        return E_INVALID_VALUE; /* memory the driver never saw */
    if (c.kind != K_HOST && fail("attr"))
        return E_UNKNOWN;
    switch (attr) {
    case 1: /* CONTEXT */
        *(void **)data = (void *)(uintptr_t)(0x1000 + (c.device < 0 ? 0 : c.device));
        return OK;
    case 2: /* MEMORY_TYPE */
        *(unsigned int *)data = c.kind == K_HOST ? 1 : 2;
        return OK;
    case 9: /* DEVICE_ORDINAL */
        *(int *)data = c.device < 0 ? 0 : c.device;
        return OK;
    case 11: /* RANGE_START_ADDR */
        *(CUdeviceptr *)data = (CUdeviceptr)(uintptr_t)c.dev;
        return OK;
    case 12: /* RANGE_SIZE */
        *(size_t *)data = c.size;
        return OK;
    default:
        return E_INVALID_VALUE;
    }
}

API CUresult cuPointerGetAttributes(unsigned int n, int *attrs, void **data, CUdeviceptr p)
{
    for (unsigned int i = 0; i < n; i++) {
        CUresult r = cuPointerGetAttribute(data[i], attrs[i], p);
        if (r != OK)
            return r;
    }
    return OK;
}

/* ---- IPC ---- */

API CUresult cuIpcGetMemHandle(void *handle, CUdeviceptr p)
{
    if (fail("ipc_get"))
        return E_NOT_SUPPORTED;
    pthread_mutex_lock(&g_mu);
    entry_t *e = find((void *)(uintptr_t)p);
    ipc_handle_t h = {{'K', 'V', 'B', 'D', 'B', 'L', 'I', 'P'}, 0, 0, 0, 0, 0, 0};
    CUresult r =
        e == NULL || e->kind != K_ALLOC || e->dev != (uint8_t *)(uintptr_t)p ? E_INVALID_VALUE : OK;
    if (r == OK) {
        h.pid = (int32_t)getpid();
        h.fd = e->fd;
        h.device = e->device;
        h.size = e->size;
        h.id = e->id;
    }
    pthread_mutex_unlock(&g_mu);
    if (r == OK) {
        memset(handle, 0, 64);
        memcpy(handle, &h, sizeof(h));
    }
    return r;
}

/* The handle is passed by value (64 bytes on the stack, as the real ABI). */
typedef struct {
    char reserved[64];
} handle64_t;

API CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *p, handle64_t handle, unsigned int flags)
{
    ipc_handle_t h;
    char path[64];
    struct stat st;
    memcpy(&h, handle.reserved, sizeof(h));
    COUNT(ipc_opens);
    if (fail("ipc_open"))
        return E_INVALID_HANDLE;
    if (t_dev < 0)
        return E_INVALID_CONTEXT;
    if (memcmp(h.magic, "KVBDBLIP", 8) != 0 || h.size == 0)
        return E_INVALID_VALUE;
    if (h.pid == (int32_t)getpid())
        return E_INVALID_CONTEXT; /* the driver refuses its own process's handles */
    pthread_mutex_lock(&g_mu);
    int twice = 0;
    for (entry_t *e = g_entries; e != NULL; e = e->next)
        twice |= e->kind == K_IPC && e->owner == h.pid && e->id == h.id;
    pthread_mutex_unlock(&g_mu);
    if (twice)
        return E_ALREADY_MAPPED;
    snprintf(path, sizeof(path), "/proc/%d/fd/%d", h.pid, h.fd);
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0)
        return E_INVALID_HANDLE;
    if (fstat(fd, &st) != 0 || (uint64_t)st.st_size != h.size) {
        close(fd);
        return E_INVALID_HANDLE;
    }
    entry_t *e = map_twice(fd, h.size, K_IPC);
    if (e == NULL) {
        close(fd);
        return E_MAP_FAILED;
    }
    e->owner = h.pid;
    e->id = h.id;
    add(e);
    *p = (CUdeviceptr)(uintptr_t)e->dev;
    return OK;
}

API CUresult cuIpcCloseMemHandle(CUdeviceptr p)
{
    entry_t *e = take((void *)(uintptr_t)p, K_IPC);
    if (e == NULL)
        return E_INVALID_VALUE;
    unmap(e);
    COUNT(ipc_closes);
    return OK;
}

/* ---- VMM: physical allocations, reservations, mappings ---- */

#define VMM_GRANULARITY (2u << 20)
#define H_POSIX_FD 1 /* CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR */

typedef struct alloc_prop { /* CUmemAllocationProp */
    int type, requestedHandleTypes;
    int location[2]; /* CUmemLocation {type, id} */
    void *win32HandleMetaData;
    unsigned char allocFlags[8];
} alloc_prop_t;

typedef struct access_desc { /* CUmemAccessDesc */
    int location[2];
    int flags;
} access_desc_t;

typedef struct reservation {
    uint8_t *va;
    size_t size;
    struct reservation *next;
} reservation_t;

static reservation_t *g_reserved; /* g_mu */

static vmm_t *vmm_new(int fd, size_t size, int device, int exportable)
{
    vmm_t *v = calloc(1, sizeof(*v));
    if (v == NULL)
        return NULL;
    *v = (vmm_t){fd, device, exportable, size, 1};
    return v;
}

static void vmm_put(vmm_t *v)
{
    pthread_mutex_lock(&g_mu);
    int last = --v->refs == 0;
    pthread_mutex_unlock(&g_mu);
    if (last) {
        close(v->fd);
        free(v);
    }
}

API CUresult cuMemGetAllocationGranularity(size_t *g, const alloc_prop_t *prop, int option)
{
    if (g == NULL || prop == NULL)
        return E_INVALID_VALUE;
    *g = VMM_GRANULARITY;
    return OK;
}

API CUresult cuMemCreate(unsigned long long *h, size_t size, const alloc_prop_t *prop,
                         unsigned long long flags)
{
    if (prop == NULL || prop->type != 1 || prop->location[0] != 1 || size == 0 ||
        size % VMM_GRANULARITY != 0)
        return E_INVALID_VALUE;
    if (prop->location[1] < 0 || prop->location[1] >= ndevices())
        return E_INVALID_DEVICE;
    int fd = memfd_create("kvb-cuda-double-vmm", MFD_CLOEXEC);
    if (fd < 0 || ftruncate(fd, (off_t)size) != 0) {
        if (fd >= 0)
            close(fd);
        return E_OUT_OF_MEMORY;
    }
    vmm_t *v = vmm_new(fd, size, prop->location[1], prop->requestedHandleTypes & H_POSIX_FD);
    if (v == NULL) {
        close(fd);
        return E_OUT_OF_MEMORY;
    }
    *h = (unsigned long long)(uintptr_t)v;
    return OK;
}

API CUresult cuMemRelease(unsigned long long h)
{
    if (h == 0)
        return E_INVALID_VALUE;
    vmm_put((vmm_t *)(uintptr_t)h);
    return OK;
}

API CUresult cuMemAddressReserve(CUdeviceptr *p, size_t size, size_t align, CUdeviceptr addr,
                                 unsigned long long flags)
{
    reservation_t *r = calloc(1, sizeof(*r));
    if (r == NULL || size == 0 || size % VMM_GRANULARITY != 0) {
        free(r);
        return r == NULL ? E_OUT_OF_MEMORY : E_INVALID_VALUE;
    }
    r->va = mmap(NULL, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (r->va == MAP_FAILED) {
        free(r);
        return E_OUT_OF_MEMORY;
    }
    r->size = size;
    pthread_mutex_lock(&g_mu);
    r->next = g_reserved;
    g_reserved = r;
    pthread_mutex_unlock(&g_mu);
    *p = (CUdeviceptr)(uintptr_t)r->va;
    return OK;
}

API CUresult cuMemAddressFree(CUdeviceptr p, size_t size)
{
    pthread_mutex_lock(&g_mu);
    reservation_t **pp = &g_reserved;
    while (*pp != NULL && ((*pp)->va != (uint8_t *)(uintptr_t)p || (*pp)->size != size))
        pp = &(*pp)->next;
    reservation_t *r = *pp;
    int busy = 0;
    for (entry_t *e = g_entries; r != NULL && e != NULL; e = e->next)
        busy |= e->dev >= r->va && e->dev < r->va + r->size;
    if (r != NULL && !busy)
        *pp = r->next;
    pthread_mutex_unlock(&g_mu);
    if (r == NULL || busy)
        return E_INVALID_VALUE; /* unknown, or still mapped */
    munmap(r->va, r->size);
    free(r);
    return OK;
}

API CUresult cuMemMap(CUdeviceptr p, size_t size, size_t offset, unsigned long long h,
                      unsigned long long flags)
{
    vmm_t *v = (vmm_t *)(uintptr_t)h;
    uint8_t *a = (uint8_t *)(uintptr_t)p;
    if (v == NULL || offset != 0 || size != v->size)
        return E_INVALID_VALUE;
    pthread_mutex_lock(&g_mu);
    int inside = 0;
    for (reservation_t *r = g_reserved; r != NULL; r = r->next)
        inside |= a >= r->va && size <= r->size && (size_t)(a - r->va) <= r->size - size;
    int used = 0;
    for (entry_t *e = g_entries; e != NULL; e = e->next)
        used |= e->dev < a + size && a < e->dev + e->size;
    pthread_mutex_unlock(&g_mu);
    if (!inside || used)
        return !inside ? E_INVALID_VALUE : E_ALREADY_MAPPED;
    entry_t *e = calloc(1, sizeof(*e));
    if (e == NULL)
        return E_OUT_OF_MEMORY;
    e->dev = mmap(a, size, PROT_NONE, MAP_SHARED | MAP_FIXED, v->fd, 0);
    e->alias = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, v->fd, 0);
    if (e->dev == MAP_FAILED || e->alias == MAP_FAILED) {
        if (e->alias != MAP_FAILED)
            munmap(e->alias, size);
        free(e);
        return E_MAP_FAILED; /* the reservation may be gone: the double's limit */
    }
    e->kind = K_VMM;
    e->size = size;
    e->fd = -1;
    e->device = v->device;
    e->vmm = v;
    pthread_mutex_lock(&g_mu);
    v->refs++;
    pthread_mutex_unlock(&g_mu);
    add(e);
    COUNT(vmm_maps);
    return OK;
}

API CUresult cuMemUnmap(CUdeviceptr p, size_t size)
{
    entry_t *e = take((void *)(uintptr_t)p, K_VMM);
    if (e == NULL)
        return E_INVALID_VALUE;
    /* the range stays reserved */
    mmap(e->dev, e->size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1,
         0);
    munmap(e->alias, e->size);
    vmm_put(e->vmm);
    free(e);
    COUNT(vmm_unmaps);
    return OK;
}

API CUresult cuMemSetAccess(CUdeviceptr p, size_t size, const access_desc_t *desc, size_t count)
{
    uint8_t *a = (uint8_t *)(uintptr_t)p;
    if (desc == NULL || count == 0 || desc[0].location[0] != 1 || desc[0].flags != 3)
        return E_INVALID_VALUE; /* kvbridge asks for read-write on a device */
    CUresult r = E_INVALID_VALUE;
    pthread_mutex_lock(&g_mu);
    for (entry_t *e = g_entries; e != NULL; e = e->next)
        if (e->kind == K_VMM && e->dev >= a && e->dev + e->size <= a + size) {
            e->access = 1;
            r = OK;
        }
    pthread_mutex_unlock(&g_mu);
    return r;
}

API CUresult cuMemRetainAllocationHandle(unsigned long long *h, void *addr)
{
    CUresult r = E_INVALID_VALUE; /* not VMM memory */
    pthread_mutex_lock(&g_mu);
    entry_t *e = find(addr);
    if (e != NULL && e->kind == K_VMM) {
        e->vmm->refs++;
        *h = (unsigned long long)(uintptr_t)e->vmm;
        r = OK;
    }
    pthread_mutex_unlock(&g_mu);
    return r;
}

API CUresult cuMemExportToShareableHandle(void *out, unsigned long long h, int type,
                                          unsigned long long flags)
{
    vmm_t *v = (vmm_t *)(uintptr_t)h;
    if (fail("vmm_export"))
        return E_NOT_SUPPORTED;
    if (v == NULL || out == NULL || type != H_POSIX_FD || !v->exportable)
        return E_INVALID_VALUE; /* the allocation was not created exportable */
    int fd = fcntl(v->fd, F_DUPFD_CLOEXEC, 0);
    if (fd < 0)
        return E_OUT_OF_MEMORY;
    *(int *)out = fd;
    COUNT(vmm_exports);
    return OK;
}

API CUresult cuMemImportFromShareableHandle(unsigned long long *h, void *os_handle, int type)
{
    struct stat st;
    int fd = (int)(intptr_t)os_handle;
    if (fail("vmm_import"))
        return E_INVALID_HANDLE;
    if (type != H_POSIX_FD || fstat(fd, &st) != 0 || st.st_size <= 0 ||
        st.st_size % VMM_GRANULARITY != 0)
        return E_INVALID_HANDLE;
    int own = fcntl(fd, F_DUPFD_CLOEXEC, 0); /* the caller keeps its descriptor */
    vmm_t *v = own >= 0 ? vmm_new(own, (size_t)st.st_size, t_dev < 0 ? 0 : t_dev, 1) : NULL;
    if (v == NULL) {
        if (own >= 0)
            close(own);
        return E_OUT_OF_MEMORY;
    }
    *h = (unsigned long long)(uintptr_t)v;
    COUNT(vmm_imports);
    return OK;
}

/* ---- streams and events: copies complete at once ---- */

API CUresult cuStreamCreate(void **s, unsigned int flags)
{
    *s = malloc(1);
    return *s != NULL ? OK : E_OUT_OF_MEMORY;
}

API CUresult cuStreamDestroy_v2(void *s)
{
    free(s);
    return OK;
}

API CUresult cuStreamSynchronize(void *s)
{
    const char *ms = getenv("KVB_CUDA_DOUBLE_SLOW_MS");
    COUNT(syncs);
    if (ms != NULL && atoi(ms) > 0) /* a slow device: the copies "finish" now */
        usleep((useconds_t)atoi(ms) * 1000);
    return OK;
}

API CUresult cuEventCreate(void **e, unsigned int flags)
{
    *e = malloc(1);
    return *e != NULL ? OK : E_OUT_OF_MEMORY;
}

API CUresult cuEventRecord(void *e, void *s)
{
    return OK;
}

API CUresult cuEventSynchronize(void *e)
{
    return OK;
}

API CUresult cuEventQuery(void *e)
{
    return OK;
}

API CUresult cuEventDestroy_v2(void *e)
{
    free(e);
    return OK;
}

/* ---- copies ---- */

API CUresult cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t n)
{
    COUNT(copies);
    return copy(dst, src, n);
}

API CUresult cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t n, void *s)
{
    COUNT(copies);
    return copy(dst, src, n);
}

API CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t n)
{
    COUNT(copies);
    return is_device(dst) && !is_device((CUdeviceptr)(uintptr_t)src)
               ? copy(dst, (CUdeviceptr)(uintptr_t)src, n)
               : E_INVALID_VALUE;
}

API CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n)
{
    COUNT(copies);
    return is_device(src) && !is_device((CUdeviceptr)(uintptr_t)dst)
               ? copy((CUdeviceptr)(uintptr_t)dst, src, n)
               : E_INVALID_VALUE;
}

API CUresult cuMemcpyDtoD_v2(CUdeviceptr dst, CUdeviceptr src, size_t n)
{
    COUNT(copies);
    return is_device(dst) && is_device(src) ? copy(dst, src, n) : E_INVALID_VALUE;
}

API CUresult cuMemsetD8_v2(CUdeviceptr dst, unsigned char v, size_t n)
{
    uint8_t *d = resolve(dst, n);
    if (d == NULL || !is_device(dst))
        return E_INVALID_VALUE;
    memset(d, v, n);
    return OK;
}

typedef struct memcpy2d { /* CUDA_MEMCPY2D_v2 */
    size_t srcXInBytes, srcY;
    int srcMemoryType;
    const void *srcHost;
    CUdeviceptr srcDevice;
    void *srcArray;
    size_t srcPitch;
    size_t dstXInBytes, dstY;
    int dstMemoryType;
    void *dstHost;
    CUdeviceptr dstDevice;
    void *dstArray;
    size_t dstPitch;
    size_t WidthInBytes, Height;
} memcpy2d_t;

static CUdeviceptr side(int type, const void *host, CUdeviceptr dev)
{
    return type == 1 ? (CUdeviceptr)(uintptr_t)host : dev; /* HOST, else DEVICE/UNIFIED */
}

API CUresult cuMemcpy2DAsync_v2(const memcpy2d_t *m, void *s)
{
    COUNT(copies_2d);
    if (m->srcArray != NULL || m->dstArray != NULL || m->srcPitch < m->WidthInBytes ||
        m->dstPitch < m->WidthInBytes)
        return E_INVALID_VALUE;
    CUdeviceptr src =
        side(m->srcMemoryType, m->srcHost, m->srcDevice) + m->srcXInBytes + m->srcY * m->srcPitch;
    CUdeviceptr dst =
        side(m->dstMemoryType, m->dstHost, m->dstDevice) + m->dstXInBytes + m->dstY * m->dstPitch;
    /* Strict, as a driver may be: each side's whole span (all rows and the
     * gaps between them) in one allocation, or outside all of them. */
    if (m->Height > 0 && (resolve(src, (m->Height - 1) * m->srcPitch + m->WidthInBytes) == NULL ||
                          resolve(dst, (m->Height - 1) * m->dstPitch + m->WidthInBytes) == NULL))
        return E_INVALID_VALUE;
    for (size_t r = 0; r < m->Height; r++) {
        CUresult e = copy(dst + r * m->dstPitch, src + r * m->srcPitch, m->WidthInBytes);
        if (e != OK)
            return e;
    }
    return OK;
}

API CUresult cuMemcpy2D_v2(const memcpy2d_t *m)
{
    return cuMemcpy2DAsync_v2(m, NULL);
}

API CUresult cuMemcpyBatchAsync_v2(CUdeviceptr *dsts, CUdeviceptr *srcs, size_t *sizes,
                                   size_t count, void *attrs, size_t *attr_idx, size_t nattrs,
                                   void *s)
{
    COUNT(copies_batch);
    if (fail("batch"))
        return E_NOT_SUPPORTED;
    if (count == 0 || attrs == NULL || nattrs == 0 || attr_idx == NULL || attr_idx[0] != 0)
        return E_INVALID_VALUE;
    for (size_t i = 0; i < count; i++) {
        CUresult r = copy(dsts[i], srcs[i], sizes[i]);
        if (r != OK)
            return r;
    }
    return OK;
}

API void kvb_cuda_double_stats(kvb_cuda_double_stats_t *out)
{
    out->copies = __atomic_load_n(&g_stats.copies, __ATOMIC_RELAXED);
    out->copies_2d = __atomic_load_n(&g_stats.copies_2d, __ATOMIC_RELAXED);
    out->copies_batch = __atomic_load_n(&g_stats.copies_batch, __ATOMIC_RELAXED);
    out->syncs = __atomic_load_n(&g_stats.syncs, __ATOMIC_RELAXED);
    out->ipc_opens = __atomic_load_n(&g_stats.ipc_opens, __ATOMIC_RELAXED);
    out->ipc_closes = __atomic_load_n(&g_stats.ipc_closes, __ATOMIC_RELAXED);
    out->bytes = __atomic_load_n(&g_stats.bytes, __ATOMIC_RELAXED);
    out->vmm_exports = __atomic_load_n(&g_stats.vmm_exports, __ATOMIC_RELAXED);
    out->vmm_imports = __atomic_load_n(&g_stats.vmm_imports, __ATOMIC_RELAXED);
    out->vmm_maps = __atomic_load_n(&g_stats.vmm_maps, __ATOMIC_RELAXED);
    out->vmm_unmaps = __atomic_load_n(&g_stats.vmm_unmaps, __ATOMIC_RELAXED);
    out->pinned_bytes = __atomic_load_n(&g_stats.pinned_bytes, __ATOMIC_RELAXED);
    out->pinned_peak = __atomic_load_n(&g_stats.pinned_peak, __ATOMIC_RELAXED);
}
