/* kvbridge's CUDA driver types (src/engine/cuda_drv.h, written without the
 * toolkit) against the toolkit's cuda.h: constants, structure layouts and
 * the handle size must match, or the run-time loaded driver would read
 * garbage. Built only where cuda.h is found (CMake: CUDAToolkit headers). */
#include <cuda.h>
#include <stddef.h>

#include "engine/cuda_drv.h"
#include "kvb_test.h"

#define SAME_OFFSET(a, b, f) _Static_assert(offsetof(a, f) == offsetof(b, f), #f)
/* enums of two types: compare as int */
#define SAME(a, b) _Static_assert((int)(a) == (int)(b), #a)

SAME(KVB_CUDA_SUCCESS, CUDA_SUCCESS);
SAME(KVB_CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_INVALID_VALUE);
SAME(KVB_CUDA_ERROR_NOT_SUPPORTED, CUDA_ERROR_NOT_SUPPORTED);
SAME(KVB_CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_MEMORY_TYPE);
SAME(KVB_CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL);
SAME(KVB_CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR);
SAME(KVB_CU_POINTER_ATTRIBUTE_RANGE_SIZE, CU_POINTER_ATTRIBUTE_RANGE_SIZE);
SAME(KVB_CU_MEMORYTYPE_HOST, CU_MEMORYTYPE_HOST);
SAME(KVB_CU_MEMORYTYPE_DEVICE, CU_MEMORYTYPE_DEVICE);
SAME(KVB_CU_MEMORYTYPE_UNIFIED, CU_MEMORYTYPE_UNIFIED);
SAME(KVB_CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
SAME(KVB_CU_STREAM_NON_BLOCKING, CU_STREAM_NON_BLOCKING);
SAME(KVB_CU_MEMHOSTALLOC_PORTABLE, CU_MEMHOSTALLOC_PORTABLE);
SAME(KVB_CU_MEMCPY_SRC_ACCESS_ORDER_STREAM, CU_MEMCPY_SRC_ACCESS_ORDER_STREAM);
SAME(KVB_CU_IPC_HANDLE_SIZE, CU_IPC_HANDLE_SIZE);
SAME(KVB_CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
SAME(KVB_CU_MEM_LOCATION_TYPE_DEVICE, CU_MEM_LOCATION_TYPE_DEVICE);
SAME(KVB_CU_MEM_ACCESS_FLAGS_PROT_READWRITE, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
_Static_assert(sizeof(kvb_CUmemAccessDesc) == sizeof(CUmemAccessDesc), "access desc");
SAME_OFFSET(kvb_CUmemAccessDesc, CUmemAccessDesc, flags);
_Static_assert(sizeof(kvb_CUmemGenericAllocationHandle) == sizeof(CUmemGenericAllocationHandle),
               "generic handle");
_Static_assert(sizeof(kvb_CUipcMemHandle) == sizeof(CUipcMemHandle), "handle");
_Static_assert(sizeof(kvb_CUdeviceptr) == sizeof(CUdeviceptr), "deviceptr");
_Static_assert(sizeof(kvb_CUDA_MEMCPY2D) == sizeof(CUDA_MEMCPY2D), "memcpy2d");
SAME_OFFSET(kvb_CUDA_MEMCPY2D, CUDA_MEMCPY2D, srcMemoryType);
SAME_OFFSET(kvb_CUDA_MEMCPY2D, CUDA_MEMCPY2D, srcDevice);
SAME_OFFSET(kvb_CUDA_MEMCPY2D, CUDA_MEMCPY2D, srcPitch);
SAME_OFFSET(kvb_CUDA_MEMCPY2D, CUDA_MEMCPY2D, dstMemoryType);
SAME_OFFSET(kvb_CUDA_MEMCPY2D, CUDA_MEMCPY2D, dstDevice);
SAME_OFFSET(kvb_CUDA_MEMCPY2D, CUDA_MEMCPY2D, dstPitch);
SAME_OFFSET(kvb_CUDA_MEMCPY2D, CUDA_MEMCPY2D, WidthInBytes);
SAME_OFFSET(kvb_CUDA_MEMCPY2D, CUDA_MEMCPY2D, Height);
_Static_assert(sizeof(kvb_CUmemcpyAttributes) == sizeof(CUmemcpyAttributes), "attrs");
SAME_OFFSET(kvb_CUmemcpyAttributes, CUmemcpyAttributes, srcLocHint);
SAME_OFFSET(kvb_CUmemcpyAttributes, CUmemcpyAttributes, dstLocHint);
SAME_OFFSET(kvb_CUmemcpyAttributes, CUmemcpyAttributes, flags);

int main(void)
{
    /* The checks are the static assertions above; this names the header. */
    fprintf(stderr, "cuda.h version %d matches kvbridge's CUDA types\n", CUDA_VERSION);
    TEST_PASS("cuda abi");
    return 0;
}
