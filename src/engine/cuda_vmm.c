/* VMM device memory on the same-host lane (docs/engine.md "CUDA device
 * memory"): allocations made with cuMemCreate and mapped with cuMemMap
 * (PyTorch's expandable segments) refuse legacy IPC handles. The target
 * exports the allocation holding a registered region as a POSIX file
 * descriptor (cuMemExportToShareableHandle; possible only where the
 * allocation was created asking for that handle type) and keeps it open
 * while the region is registered; the handshake names the descriptor and
 * the allocation's size. A writer on the same host (the same-host proof
 * passed, the fence page mapped) fetches a duplicate of it (pidfd_getfd,
 * else /proc/<pid>/fd), imports it, reserves address space, maps it whole
 * and makes it readable and writable on its device; the direct lane then
 * copies device to device into it. Anything refused: the segment is staged
 * through host memory, as before. */
#include "engine/engine_int.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#define VMM_SIZE_MAX (1ull << 48) /* an advertised allocation larger than this is refused */

static void put_le32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void put_le64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint64_t get_le(const uint8_t *p, int n)
{
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

int kvb__cuda_vmm_export(int dev, uint64_t base, uint64_t size, kvb__cuda_seg_t *cs, char *why,
                         size_t wl)
{
    const kvb__cuda_api_t *cu = kvb__cuda();
    kvb_CUmemGenericAllocationHandle h = 0;
    int fd = -1;
    if (!kvb__cuda_has_vmm())
        return 0;
    kvb__cuda_scope_t sc = {NULL, false};
    if (kvb__cuda_enter(dev, &sc, why, wl) != KVB_OK)
        return -1;
    /* Succeeds only for memory cuMemMap mapped: cuMemAlloc memory is not VMM. */
    kvb_CUresult r = cu->cuMemRetainAllocationHandle(&h, (void *)(uintptr_t)base);
    if (r != KVB_CUDA_SUCCESS) {
        kvb__cuda_leave(&sc);
        return 0;
    }
    r = cu->cuMemExportToShareableHandle(&fd, h, KVB_CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
    cu->cuMemRelease(h); /* the mapping keeps the allocation */
    kvb__cuda_leave(&sc);
    if (r != KVB_CUDA_SUCCESS || fd < 0) {
        snprintf(why, wl,
                 "VMM allocation not exportable as a file descriptor (created without "
                 "CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR?): cuMemExportToShareableHandle: %s",
                 kvb__cuda_errstr(r));
        return -1;
    }
    cs->vmm = true;
    cs->vmm_fd = fd;
    memset(cs->handle, 0, sizeof(cs->handle));
    put_le32(cs->handle, (uint32_t)fd);
    put_le64(cs->handle + 8, size);
    return 1;
}

void kvb__cuda_vmm_unexport(kvb__cuda_seg_t *cs)
{
    if (cs->vmm && cs->vmm_fd >= 0)
        close(cs->vmm_fd);
    cs->vmm = false;
    cs->vmm_fd = -1;
}

/* A duplicate of pid's descriptor fdn: pidfd_getfd (the file itself, as the
 * driver's descriptors need; ptrace rights on pid), else reopening
 * /proc/<pid>/fd/<fdn> (enough for files that can be reopened). */
static int fetch_fd(uint32_t pid, uint32_t fdn, char *why, size_t wl)
{
    int fd = -1;
#if defined(SYS_pidfd_open) && defined(SYS_pidfd_getfd)
    int pfd = (int)syscall(SYS_pidfd_open, (pid_t)pid, 0);
    if (pfd >= 0) {
        fd = (int)syscall(SYS_pidfd_getfd, pfd, (int)fdn, 0);
        close(pfd);
    }
#endif
    if (fd < 0) {
        char path[64];
        snprintf(path, sizeof(path), "/proc/%u/fd/%u", pid, fdn);
        fd = open(path, O_RDWR | O_CLOEXEC);
        if (fd < 0)
            snprintf(why, wl, "cannot fetch the peer's descriptor %u (pidfd_getfd, %s): %s", fdn,
                     path, strerror(errno));
    }
    return fd;
}

/* Import the descriptor, reserve, map and grant access on dev. */
static kvb_CUresult map_fd(int dev, int fd, uint64_t size, kvb_CUdeviceptr *va_p)
{
    const kvb__cuda_api_t *cu = kvb__cuda();
    kvb_CUmemGenericAllocationHandle h = 0;
    kvb_CUdeviceptr va = 0;
    kvb_CUresult r = cu->cuMemImportFromShareableHandle(
        &h, (void *)(intptr_t)fd, KVB_CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    if (r != KVB_CUDA_SUCCESS)
        return r;
    r = cu->cuMemAddressReserve(&va, size, 0, 0, 0);
    if (r == KVB_CUDA_SUCCESS) {
        r = cu->cuMemMap(va, size, 0, h, 0);
        if (r != KVB_CUDA_SUCCESS)
            cu->cuMemAddressFree(va, size);
    }
    cu->cuMemRelease(h); /* mapped or not: the mapping holds what it needs */
    if (r != KVB_CUDA_SUCCESS)
        return r;
    kvb_CUmemAccessDesc d = {{KVB_CU_MEM_LOCATION_TYPE_DEVICE, dev},
                             KVB_CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    r = cu->cuMemSetAccess(va, size, &d, 1);
    if (r != KVB_CUDA_SUCCESS) {
        cu->cuMemUnmap(va, size);
        cu->cuMemAddressFree(va, size);
        return r;
    }
    *va_p = va;
    return KVB_CUDA_SUCCESS;
}

bool kvb__cuda_vmm_import(int dev, uint32_t pid, const kvb__hs_cuda_t *e, uint64_t seg_len,
                          kvb__cuda_vmm_map_t *m, char *why, size_t wl)
{
    uint32_t fdn = (uint32_t)get_le(e->handle, 4);
    uint64_t size = get_le(e->handle + 8, 8);
    if (!kvb__cuda_has_vmm()) {
        snprintf(why, wl, "the CUDA driver lacks the VMM entry points");
        return false;
    }
    if (pid == 0 || get_le(e->handle + 4, 4) != 0 || size == 0 || size > VMM_SIZE_MAX ||
        e->alloc_off > size || seg_len > size - e->alloc_off) {
        snprintf(why, wl,
                 "VMM allocation (fd %u, %llu bytes, segment at +%llu, %llu bytes) "
                 "invalid",
                 fdn, (unsigned long long)size, (unsigned long long)e->alloc_off,
                 (unsigned long long)seg_len);
        return false;
    }
    int fd = fetch_fd(pid, fdn, why, wl);
    if (fd < 0)
        return false;
    kvb__cuda_scope_t sc = {NULL, false};
    kvb_CUdeviceptr va = 0;
    kvb_CUresult r = KVB_CUDA_ERROR_NOT_SUPPORTED;
    if (kvb__cuda_enter(dev, &sc, why, wl) == KVB_OK) {
        r = map_fd(dev, fd, size, &va);
        if (r != KVB_CUDA_SUCCESS)
            snprintf(why, wl, "importing the VMM allocation: %s", kvb__cuda_errstr(r));
    }
    kvb__cuda_leave(&sc);
    close(fd); /* imported: the driver holds the allocation */
    if (r != KVB_CUDA_SUCCESS)
        return false;
    m->va = va;
    m->size = size;
    return true;
}

void kvb__cuda_vmm_unmap(kvb__cuda_vmm_map_t *m)
{
    if (m->size == 0)
        return;
    kvb__cuda()->cuMemUnmap(m->va, m->size);
    kvb__cuda()->cuMemAddressFree(m->va, m->size);
    m->size = 0;
}
