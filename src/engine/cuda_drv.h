/* The CUDA driver API, loaded at run time: kvbridge neither builds nor links
 * against CUDA. The first use dlopen()s KVBRIDGE_CUDA_LIB or "libcuda.so.1"
 * and resolves the entry points below (the versioned names the driver
 * exports); a machine without a driver runs host memory as before and every
 * CUDA request fails with the reason kvb__cuda_why() gives.
 *
 * The types mirror cuda.h (CUDA 12/13 ABI); tests/cuda/test_cuda_abi.c checks
 * them against the toolkit's header where one is installed. Thread-safe:
 * loading happens once (pthread_once); the table is read-only afterwards. */
#ifndef KVB_ENGINE_CUDA_DRV_H
#define KVB_ENGINE_CUDA_DRV_H

#include <kvbridge/common.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef int kvb_CUresult;
typedef unsigned long long kvb_CUdeviceptr;
typedef int kvb_CUdevice;
typedef struct kvb_CUctx_st *kvb_CUcontext;
typedef struct kvb_CUstream_st *kvb_CUstream;
typedef unsigned long long kvb_CUmemGenericAllocationHandle;

#define KVB_CU_IPC_HANDLE_SIZE 64
typedef struct kvb_CUipcMemHandle {
    char reserved[KVB_CU_IPC_HANDLE_SIZE];
} kvb_CUipcMemHandle;

enum {
    KVB_CUDA_SUCCESS = 0,
    KVB_CUDA_ERROR_INVALID_VALUE = 1,
    KVB_CUDA_ERROR_INVALID_CONTEXT = 201,
    KVB_CUDA_ERROR_NOT_SUPPORTED = 801,
    KVB_CU_POINTER_ATTRIBUTE_MEMORY_TYPE = 2,
    KVB_CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL = 9,
    KVB_CU_POINTER_ATTRIBUTE_RANGE_START_ADDR = 11,
    KVB_CU_POINTER_ATTRIBUTE_RANGE_SIZE = 12,
    KVB_CU_MEMORYTYPE_HOST = 1,
    KVB_CU_MEMORYTYPE_DEVICE = 2,
    KVB_CU_MEMORYTYPE_UNIFIED = 4,
    KVB_CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS = 1,
    KVB_CU_STREAM_NON_BLOCKING = 1,
    KVB_CU_MEMHOSTALLOC_PORTABLE = 1,
    KVB_CU_MEMCPY_SRC_ACCESS_ORDER_STREAM = 1,
    KVB_CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR = 1,
    KVB_CU_MEM_LOCATION_TYPE_DEVICE = 1,
    KVB_CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 3,
};

/* CUmemAccessDesc_v1 */
typedef struct kvb_CUmemAccessDesc {
    int location[2]; /* CUmemLocation {type, id} */
    int flags;
} kvb_CUmemAccessDesc;

/* CUDA_MEMCPY2D_v2 */
typedef struct kvb_CUDA_MEMCPY2D {
    size_t srcXInBytes, srcY;
    int srcMemoryType;
    const void *srcHost;
    kvb_CUdeviceptr srcDevice;
    void *srcArray;
    size_t srcPitch;
    size_t dstXInBytes, dstY;
    int dstMemoryType;
    void *dstHost;
    kvb_CUdeviceptr dstDevice;
    void *dstArray;
    size_t dstPitch;
    size_t WidthInBytes, Height;
} kvb_CUDA_MEMCPY2D;

/* CUmemcpyAttributes_v1 */
typedef struct kvb_CUmemcpyAttributes {
    int srcAccessOrder;
    int srcLocHint[2], dstLocHint[2]; /* CUmemLocation {type, id} */
    unsigned int flags;
} kvb_CUmemcpyAttributes;

/* The entry points kvbridge uses. NULL only for the optional ones (marked). */
typedef struct kvb__cuda_api {
    kvb_CUresult (*cuInit)(unsigned int);
    kvb_CUresult (*cuDriverGetVersion)(int *);
    kvb_CUresult (*cuGetErrorString)(kvb_CUresult, const char **);
    kvb_CUresult (*cuDeviceGetCount)(int *);
    kvb_CUresult (*cuDeviceGet)(kvb_CUdevice *, int);
    kvb_CUresult (*cuDevicePrimaryCtxRetain)(kvb_CUcontext *, kvb_CUdevice);
    kvb_CUresult (*cuCtxSetCurrent)(kvb_CUcontext);
    kvb_CUresult (*cuCtxGetCurrent)(kvb_CUcontext *);
    kvb_CUresult (*cuPointerGetAttribute)(void *, int, kvb_CUdeviceptr);
    kvb_CUresult (*cuMemAlloc)(kvb_CUdeviceptr *, size_t); /* _v2 */
    kvb_CUresult (*cuMemFree)(kvb_CUdeviceptr);            /* _v2 */
    kvb_CUresult (*cuMemHostAlloc)(void **, size_t, unsigned int);
    kvb_CUresult (*cuMemFreeHost)(void *);
    kvb_CUresult (*cuMemcpy)(kvb_CUdeviceptr, kvb_CUdeviceptr, size_t); /* unified */
    kvb_CUresult (*cuMemcpyAsync)(kvb_CUdeviceptr, kvb_CUdeviceptr, size_t, kvb_CUstream);
    kvb_CUresult (*cuMemcpy2DAsync)(const kvb_CUDA_MEMCPY2D *, kvb_CUstream); /* _v2 */
    kvb_CUresult (*cuIpcGetMemHandle)(kvb_CUipcMemHandle *, kvb_CUdeviceptr);
    kvb_CUresult (*cuIpcOpenMemHandle)(kvb_CUdeviceptr *, kvb_CUipcMemHandle,
                                       unsigned int); /* _v2 */
    kvb_CUresult (*cuIpcCloseMemHandle)(kvb_CUdeviceptr);
    kvb_CUresult (*cuStreamCreate)(kvb_CUstream *, unsigned int);
    kvb_CUresult (*cuStreamDestroy)(kvb_CUstream); /* _v2 */
    kvb_CUresult (*cuStreamSynchronize)(kvb_CUstream);
    /* optional (CUDA 13: cuMemcpyBatchAsync_v2): many copies in one call */
    kvb_CUresult (*cuMemcpyBatchAsync)(kvb_CUdeviceptr *, kvb_CUdeviceptr *, size_t *, size_t,
                                       kvb_CUmemcpyAttributes *, size_t *, size_t, kvb_CUstream);
    /* optional (CUDA 10.2+; all or none): VMM allocations (cuMemCreate,
     * PyTorch's expandable segments) shared as POSIX file descriptors */
    kvb_CUresult (*cuMemRetainAllocationHandle)(kvb_CUmemGenericAllocationHandle *, void *);
    kvb_CUresult (*cuMemRelease)(kvb_CUmemGenericAllocationHandle);
    kvb_CUresult (*cuMemExportToShareableHandle)(void *, kvb_CUmemGenericAllocationHandle, int,
                                                 unsigned long long);
    kvb_CUresult (*cuMemImportFromShareableHandle)(kvb_CUmemGenericAllocationHandle *, void *, int);
    kvb_CUresult (*cuMemAddressReserve)(kvb_CUdeviceptr *, size_t, size_t, kvb_CUdeviceptr,
                                        unsigned long long);
    kvb_CUresult (*cuMemAddressFree)(kvb_CUdeviceptr, size_t);
    kvb_CUresult (*cuMemMap)(kvb_CUdeviceptr, size_t, size_t, kvb_CUmemGenericAllocationHandle,
                             unsigned long long);
    kvb_CUresult (*cuMemUnmap)(kvb_CUdeviceptr, size_t);
    kvb_CUresult (*cuMemSetAccess)(kvb_CUdeviceptr, size_t, const kvb_CUmemAccessDesc *, size_t);
} kvb__cuda_api_t;

/* Does the loaded driver have the VMM entry points (the table's last
 * nine)? */
bool kvb__cuda_has_vmm(void);

/* The loaded table, or NULL when no driver could be loaded and initialised
 * (then kvb__cuda_why() says why). Loads on first call. */
const kvb__cuda_api_t *kvb__cuda(void);
/* Why kvb__cuda() is NULL ("" when it is not). */
const char *kvb__cuda_why(void);
/* "cuFoo failed: CUDA_ERROR_...": the driver's text for r. */
const char *kvb__cuda_errstr(kvb_CUresult r);

/* Run driver calls in device's primary context (retained once per process,
 * kept) on this thread, then give the thread its previous context back:
 * kvbridge runs on its callers' threads too (register, write, handshake),
 * whose current context (PyTorch's device) it must not change.
 * KVB_ERR_UNSUPPORTED without a driver, KVB_ERR_IO else; on error nothing is
 * changed and leave is a no-op. */
typedef struct kvb__cuda_scope {
    kvb_CUcontext prev;
    bool entered;
} kvb__cuda_scope_t;
kvb_status_t kvb__cuda_enter(int device, kvb__cuda_scope_t *s, char *why, size_t wl);
void kvb__cuda_leave(kvb__cuda_scope_t *s);

/* What addr is: 1 CUDA device memory (then *device_p, and the allocation
 * [*base_p, +*size_p) that holds it), 0 host memory (also without a driver),
 * negative: the driver failed (reason in why). */
int kvb__cuda_classify(uint64_t addr, int *device_p, uint64_t *base_p, uint64_t *size_p, char *why,
                       size_t wl);

/* One copy of a batch: len bytes from src to dst (host or device, unified
 * addresses). */
typedef struct kvb__cuda_copy {
    uint64_t dst, src, len;
} kvb__cuda_copy_t;

/* Copy v[0..n) on this thread's stream in device's context and wait until the
 * copies are done. Runs of equal length and constant strides on both sides
 * (head slices) inside one allocation on each side go as one 2-D copy each
 * (where the driver refuses one: row by row), the remaining ones in one batched
 * call where the driver has it, else one call each. KVB_OK or KVB_ERR_IO
 * (reason in why). */
kvb_status_t kvb__cuda_copy_batch(int device, const kvb__cuda_copy_t *v, size_t n, char *why,
                                  size_t wl);

/* memcpy for pointers that may be CUDA device memory (the connector's inline
 * aux messages): the driver copies when either side is device memory, else
 * memcpy. KVB_ERR_IO when the driver fails (reason logged). */
kvb_status_t kvb__mem_copy(void *dst, const void *src, size_t n);

/* Pinned host staging buffers (cuMemHostAlloc, portable), cached up to
 * KVBRIDGE_CUDA_STAGING_CACHE bytes (default 256 MiB) across the process.
 * NULL when the driver cannot allocate. */
void *kvb__cuda_stage_get(size_t len);
void kvb__cuda_stage_put(void *buf, size_t len);

#endif
