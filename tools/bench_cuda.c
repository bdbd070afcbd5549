/* `kvbridge bench --memory cuda`: rank pools in CUDA device memory and the
 * device-to-device copy yardstick. The pattern is generated and checked in a
 * host mirror of the pool, copied to the device after a fill and back before
 * a verify (pages only), so the byte check is the host run's. The driver is
 * the library's run-time loaded one (KVBRIDGE_CUDA_LIB or libcuda.so.1);
 * against the test double the figures prove plumbing, not GPU speed. */
#include "bench_common.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/cuda_drv.h"

#define YARD_MAX (1ull << 30) /* bytes of the yardstick copy */

const char *bench_cuda_driver(void)
{
    const char *lib = getenv("KVBRIDGE_CUDA_LIB");
    return lib != NULL && lib[0] != '\0' ? lib : "libcuda.so.1";
}

bool bench_cuda_is_double(void)
{
    return strstr(bench_cuda_driver(), "double") != NULL;
}

bool bench_pool_cuda(bench_pool_t *p, int device, char *why, size_t wl)
{
    const kvb__cuda_api_t *cu = kvb__cuda();
    uint64_t kv_bytes = p->pages * p->g.item_len, total = kv_bytes * (uint64_t)p->g.n_kv;
    kvb_CUdeviceptr d = 0;
    if (cu == NULL) {
        snprintf(why, wl, "%s", kvb__cuda_why());
        return false;
    }
    kvb__cuda_scope_t sc = {NULL, false}; /* a rank process: its context may stay */
    if (kvb__cuda_enter(device, &sc, why, wl) != KVB_OK)
        return false;
    kvb_CUresult r = cu->cuMemAlloc(&d, total ? total : 1);
    p->host_ptrs = calloc((size_t)p->g.n_kv, sizeof(uint64_t));
    if (r != KVB_CUDA_SUCCESS || p->host_ptrs == NULL) {
        snprintf(why, wl, "cuMemAlloc(%llu) on device %d: %s", (unsigned long long)total, device,
                 r != KVB_CUDA_SUCCESS ? kvb__cuda_errstr(r) : "out of host memory");
        if (r == KVB_CUDA_SUCCESS)
            cu->cuMemFree(d);
        free(p->host_ptrs);
        p->host_ptrs = NULL;
        return false;
    }
    p->dev = d;
    p->device = device;
    for (int b = 0; b < p->g.n_kv; b++) {
        p->host_ptrs[b] = p->kv_ptrs[b];
        p->kv_ptrs[b] = d + (uint64_t)b * kv_bytes;
    }
    return true;
}

void bench_pool_cuda_free(bench_pool_t *p)
{
    if (p->dev != 0 && kvb__cuda() != NULL)
        kvb__cuda()->cuMemFree(p->dev);
    free(p->host_ptrs);
    p->dev = 0;
    p->host_ptrs = NULL;
}

bool bench_pool_cuda_sync(bench_pool_t *p, const int32_t *pages, uint32_t n, bool to_device)
{
    char why[300];
    size_t nv = (size_t)n * (size_t)p->g.n_kv, k = 0;
    kvb__cuda_copy_t *v = malloc((nv ? nv : 1) * sizeof(*v));
    if (v == NULL)
        return false;
    for (int b = 0; b < p->g.n_kv; b++)
        for (uint32_t i = 0; i < n; i++) {
            uint64_t off = (uint64_t)pages[i] * p->g.item_len;
            uint64_t h = p->host_ptrs[b] + off, d = p->kv_ptrs[b] + off;
            v[k++] = (kvb__cuda_copy_t){to_device ? d : h, to_device ? h : d, p->g.item_len};
        }
    kvb_status_t st = kvb__cuda_copy_batch(p->device, v, k, why, sizeof(why));
    free(v);
    if (st != KVB_OK)
        fprintf(stderr, "kvbridge: bench: %s\n", why);
    return st == KVB_OK;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Device to device, one request's volume (at most YARD_MAX) in page runs
 * between shuffled slots, the best of three: what the lanes are held to. */
double bench_cuda_memcpy_gbps(const bench_opts_t *o, uint64_t item_len)
{
    const kvb__cuda_api_t *cu = kvb__cuda();
    char why[300];
    uint64_t vol = bench_request_bytes(o);
    vol = vol < YARD_MAX ? vol : YARD_MAX;
    size_t n = item_len > 0 ? (size_t)(vol / item_len) : 0;
    kvb_CUdeviceptr a = 0, b = 0;
    double best = 0;
    kvb__cuda_scope_t sc = {NULL, false};
    if (cu == NULL || n == 0 || kvb__cuda_enter(o->cuda_device, &sc, why, sizeof(why)) != KVB_OK ||
        cu->cuMemAlloc(&a, n * item_len) != KVB_CUDA_SUCCESS ||
        cu->cuMemAlloc(&b, n * item_len) != KVB_CUDA_SUCCESS) {
        fprintf(stderr, "kvbridge: bench: no device-to-device yardstick (%s)\n",
                cu == NULL ? kvb__cuda_why() : "no device memory");
        n = 0;
    }
    kvb__cuda_copy_t *v = n ? malloc(n * sizeof(*v)) : NULL;
    for (size_t i = 0; v != NULL && i < n; i++) /* slot i to slot (i * 7919) mod n */
        v[i] = (kvb__cuda_copy_t){b + ((i * 7919) % n) * item_len, a + i * item_len, item_len};
    for (int rep = 0; v != NULL && rep < 3; rep++) {
        double t0 = now_s();
        if (kvb__cuda_copy_batch(o->cuda_device, v, n, why, sizeof(why)) != KVB_OK)
            break;
        double g = (double)(n * item_len) / (now_s() - t0) / 1e9;
        best = g > best ? g : best;
    }
    free(v);
    if (a != 0)
        cu->cuMemFree(a);
    if (b != 0)
        cu->cuMemFree(b);
    return best;
}
