/* The CUDA driver-API test double (cuda_double.c): the entry points tests
 * call directly (they link the double; kvbridge loads the same file through
 * KVBRIDGE_CUDA_LIB, so both see one instance) and its call counters. */
#ifndef KVB_CUDA_DOUBLE_H
#define KVB_CUDA_DOUBLE_H

#include <stddef.h>
#include <stdint.h>

typedef struct kvb_cuda_double_stats {
    uint64_t copies;       /* cuMemcpy, cuMemcpyAsync, HtoD/DtoH/DtoD */
    uint64_t copies_2d;    /* cuMemcpy2DAsync_v2 calls */
    uint64_t copies_batch; /* cuMemcpyBatchAsync_v2 calls */
    uint64_t syncs;        /* cuStreamSynchronize */
    uint64_t ipc_opens, ipc_closes;
    uint64_t bytes; /* copied, all kinds */
} kvb_cuda_double_stats_t;

void kvb_cuda_double_stats(kvb_cuda_double_stats_t *out);

int cuInit(unsigned int flags);
int cuDeviceGet(int *dev, int ordinal);
int cuDevicePrimaryCtxRetain(void **ctx, int dev);
int cuCtxSetCurrent(void *ctx);
int cuMemAlloc_v2(unsigned long long *p, size_t n);
int cuMemFree_v2(unsigned long long p);
int cuMemcpyHtoD_v2(unsigned long long dst, const void *src, size_t n);
int cuMemcpyDtoH_v2(void *dst, unsigned long long src, size_t n);

#endif
