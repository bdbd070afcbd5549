/* The CUDA driver-API test double (cuda_double.c): its call counters. Tests
 * reach the driver, double or real, through cuda_test.h. */
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
    uint64_t bytes;                     /* copied, all kinds */
    uint64_t vmm_exports, vmm_imports;  /* shareable handles (POSIX fds) */
    uint64_t vmm_maps, vmm_unmaps;      /* cuMemMap, cuMemUnmap calls that succeeded */
    uint64_t pinned_bytes, pinned_peak; /* cuMemHostAlloc'ed, not yet freed: now, at most */
} kvb_cuda_double_stats_t;

/* Exported by the double only (tests find it with dlsym). */
void kvb_cuda_double_stats(kvb_cuda_double_stats_t *out);

#endif
