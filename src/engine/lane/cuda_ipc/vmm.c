/* VMM device memory on the same-host lane (docs/engine.md "CUDA device
 * memory"): allocations made with cuMemCreate and mapped with cuMemMap
 * (PyTorch's expandable segments) refuse legacy IPC handles. A registered
 * region may span several such allocations mapped back to back in one
 * reserved range (an expandable segment maps one handle per granule or
 * segment as it grows): at registration the target walks the region mapping
 * by mapping (the driver's range at each address must start where the
 * previous one ended), exports each allocation as a POSIX file descriptor
 * (cuMemExportToShareableHandle; possible only where it was created asking
 * for that handle type) and keeps them open while the region is registered;
 * the handshake names the descriptors and sizes (the parts table) to a
 * writer that announced it maps them. A writer on the same host (the
 * same-host proof passed, the fence page mapped) gets a duplicate of each
 * over the target's descriptor socket (fdsrv.c: SCM_RIGHTS, no ptrace
 * rights needed; else pidfd_getfd or /proc/<pid>/fd), imports it, reserves one range for
 * all of them, maps them back to back (so the segment's addresses translate
 * with one offset, as in the target) and makes the range readable and
 * writable on its device; the direct lane then copies device to device into
 * it. Anything refused: the segment is staged through host memory. */
#include "engine/lane/cuda_ipc/cuda_ipc.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

/* One region's allocations: each costs the target a descriptor while the
 * region is registered, and the writer one mapping per connection. */
#define VMM_REGION_PARTS_MAX 4096u

/* Is addr VMM memory (a mapping cuMemMap made)? Inside a context. */
static bool is_vmm(uint64_t addr)
{
    kvb_CUmemGenericAllocationHandle h = 0;
    if (kvb__cuda()->cuMemRetainAllocationHandle(&h, (void *)(uintptr_t)addr) != KVB_CUDA_SUCCESS)
        return false;
    kvb__cuda()->cuMemRelease(h);
    return true;
}

/* Export the allocation mapped at addr as a descriptor (-1: refused, why). */
static int export_one(uint64_t addr, char *why, size_t wl)
{
    const kvb__cuda_api_t *cu = kvb__cuda();
    kvb_CUmemGenericAllocationHandle h = 0;
    int fd = -1;
    kvb_CUresult r = cu->cuMemRetainAllocationHandle(&h, (void *)(uintptr_t)addr);
    if (r == KVB_CUDA_SUCCESS) {
        r = cu->cuMemExportToShareableHandle(&fd, h, KVB_CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                                             0);
        cu->cuMemRelease(h); /* the mapping keeps the allocation */
    }
    if (r != KVB_CUDA_SUCCESS || fd < 0) {
        snprintf(why, wl,
                 "VMM allocation not exportable as a file descriptor (created without "
                 "CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR?): cuMemExportToShareableHandle: %s",
                 kvb__cuda_errstr(r));
        return -1;
    }
    return fd;
}

static void close_parts(kvb__cuda_seg_t *cs)
{
    for (uint32_t i = 0; i < cs->vmm_n && cs->vmm_fds != NULL; i++)
        if (cs->vmm_fds[i] >= 0)
            close(cs->vmm_fds[i]);
    free(cs->vmm_fds);
    free(cs->vmm_sizes);
    cs->vmm_fds = NULL;
    cs->vmm_sizes = NULL;
    cs->vmm_n = 0;
    cs->vmm = false;
}

/* Record the part [base, +size) at index cs->vmm_n (growing the arrays). */
static bool add_part(kvb__cuda_seg_t *cs, uint32_t *cap, int fd, uint64_t size)
{
    if (cs->vmm_n == *cap) {
        uint32_t n = *cap ? *cap * 2 : 4;
        int *f = realloc(cs->vmm_fds, n * sizeof(*f));
        if (f != NULL)
            cs->vmm_fds = f;
        uint64_t *s = f != NULL ? realloc(cs->vmm_sizes, n * sizeof(*s)) : NULL;
        if (s == NULL)
            return false;
        cs->vmm_sizes = s;
        *cap = n;
    }
    cs->vmm_fds[cs->vmm_n] = fd;
    cs->vmm_sizes[cs->vmm_n++] = size;
    return true;
}

/* The mappings covering [base, end), walked from the first one [base, +size):
 * each next one must start where the last ended, on the same device, and be
 * VMM memory. Exported as they are walked (export false after a refusal:
 * only checked). */
static int walk(int dev, uint64_t base, uint64_t size, uint64_t end, kvb__cuda_seg_t *cs, char *why,
                size_t wl)
{
    uint32_t cap = 0;
    bool exporting = true;
    char ewhy[300] = "";
    for (uint64_t at = base, len = size;;) {
        if (cs->vmm_n == VMM_REGION_PARTS_MAX) {
            snprintf(why, wl, "spans more than %u VMM allocations", VMM_REGION_PARTS_MAX);
            return -2;
        }
        int fd = exporting ? export_one(at, ewhy, sizeof(ewhy)) : -1;
        exporting = fd >= 0;
        if (!add_part(cs, &cap, fd, len)) {
            if (fd >= 0)
                close(fd);
            snprintf(why, wl, "out of memory");
            return -2;
        }
        if (len >= end - at)
            break;
        int d = -1;
        uint64_t nb = 0, ns = 0, next = at + len;
        int k = kvb__cuda_classify(next, &d, &nb, &ns, why, wl);
        if (k < 0)
            return -2;
        if (k == 0 || nb != next || d != dev || ns == 0) {
            snprintf(why, wl, "extends past its CUDA allocation [0x%llx, +%llu)",
                     (unsigned long long)at, (unsigned long long)len);
            return -2;
        }
        if (!is_vmm(next)) {
            snprintf(why, wl,
                     "spans VMM memory and memory from cuMemAlloc (at 0x%llx): register "
                     "them as separate regions",
                     (unsigned long long)next);
            return -2;
        }
        at = next;
        len = ns;
    }
    if (!exporting) {
        snprintf(why, wl, "%s", ewhy);
        return -1;
    }
    return 1;
}

int kvb__cuda_vmm_export(int dev, uint64_t base, uint64_t size, uint64_t end, kvb__cuda_seg_t *cs,
                         char *why, size_t wl)
{
    if (!kvb__cuda_has_vmm() && end - base > size)
        snprintf(why, wl, "extends past its CUDA allocation [0x%llx, +%llu)",
                 (unsigned long long)base, (unsigned long long)size);
    if (!kvb__cuda_has_vmm())
        return end - base > size ? -2 : 0;
    kvb__cuda_scope_t sc = {NULL, false};
    if (kvb__cuda_enter(dev, &sc, why, wl) != KVB_OK)
        return -2; /* nothing can be checked */
    int v = 0;
    if (!is_vmm(base)) {
        /* cuMemAlloc memory: one allocation; say so if VMM memory follows */
        if (end - base > size) {
            v = -2;
            if (kvb__cuda_classify(base + size, &(int){0}, &(uint64_t){0}, &(uint64_t){0}, why,
                                   wl) > 0 &&
                is_vmm(base + size))
                snprintf(why, wl,
                         "spans memory from cuMemAlloc and VMM memory (at 0x%llx): register "
                         "them as separate regions",
                         (unsigned long long)(base + size));
            else
                snprintf(why, wl, "extends past its CUDA allocation [0x%llx, +%llu)",
                         (unsigned long long)base, (unsigned long long)size);
        }
    } else {
        v = walk(dev, base, size, end, cs, why, wl);
    }
    kvb__cuda_leave(&sc);
    if (v == 1) {
        cs->vmm = true;
        for (uint32_t i = 0; i < cs->vmm_n; i++)
            cs->vmm_size += cs->vmm_sizes[i];
    } else {
        close_parts(cs);
    }
    return v;
}

void kvb__cuda_vmm_unexport(kvb__cuda_seg_t *cs)
{
    close_parts(cs);
}

/* A duplicate of pid's descriptor fdn: pidfd_getfd (the file itself, as the
 * driver's descriptors need; ptrace rights on pid), else reopening
 * /proc/<pid>/fd/<fdn> (enough for files that can be reopened). Neither
 * with KVBRIDGE_CUDA_PIDFD=0 (only the target's descriptor socket). */
static int fetch_fd(uint32_t pid, uint32_t fdn, char *why, size_t wl)
{
    int fd = -1;
    if (kvb__env_int("KVBRIDGE_CUDA_PIDFD", NULL, 1, 0, 1) == 0) {
        snprintf(why, wl,
                 "no descriptor socket, and fetching the peer's descriptors from its "
                 "process is off (KVBRIDGE_CUDA_PIDFD=0)");
        return -1;
    }
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

/* Descriptors of parts p[0..n) (n <= KVB_FDSRV_MAX_FDS) into fds: over the
 * target's descriptor socket *c where there is one (closed and -1 once it
 * fails: the rest go the other way), else fetched from its process. false:
 * none held (why). */
static bool fetch_batch(const kvb__hs_reply_t *rep, int *c, const kvb__hs_vmm_part_t *p, uint32_t n,
                        int *fds, char *why, size_t wl)
{
    uint32_t fdn[KVB_FDSRV_MAX_FDS];
    for (uint32_t i = 0; i < n; i++)
        fdn[i] = p[i].fd;
    if (*c >= 0 && kvb__fdsrv_fetch(*c, rep->ticket, fdn, n, fds, why, wl))
        return true;
    if (*c >= 0) {
        KVB_LOGI("VMM descriptors: %s: trying pidfd_getfd", why);
        close(*c);
        *c = -1;
    }
    for (uint32_t i = 0; i < n; i++) {
        fds[i] = fetch_fd(rep->pid, fdn[i], why, wl);
        if (fds[i] < 0) {
            while (i > 0)
                close(fds[--i]);
            return false;
        }
    }
    return true;
}

/* Import the descriptor and map it at va (size bytes, inside our
 * reservation). */
static kvb_CUresult map_part(int fd, kvb_CUdeviceptr va, uint64_t size)
{
    const kvb__cuda_api_t *cu = kvb__cuda();
    kvb_CUmemGenericAllocationHandle h = 0;
    kvb_CUresult r = cu->cuMemImportFromShareableHandle(
        &h, (void *)(intptr_t)fd, KVB_CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    if (r != KVB_CUDA_SUCCESS)
        return r;
    r = cu->cuMemMap(va, size, 0, h, 0);
    cu->cuMemRelease(h); /* mapped or not: the mapping holds what it needs */
    return r;
}

/* Map the batch's parts (descriptors fds, closed here) from m->n on at off. */
static bool map_batch(kvb__cuda_vmm_map_t *m, const kvb__hs_vmm_part_t *p, int *fds, uint32_t k,
                      uint64_t *off, char *why, size_t wl)
{
    kvb_CUresult r = KVB_CUDA_SUCCESS;
    for (uint32_t i = 0; i < k; i++) {
        if (r == KVB_CUDA_SUCCESS) {
            r = map_part(fds[i], m->va + *off, p[m->n].size);
            if (r == KVB_CUDA_SUCCESS)
                *off += p[m->n++].size;
            else
                snprintf(why, wl, "importing VMM allocation %u of %u (%llu bytes): %s", m->n + 1,
                         m->parts, (unsigned long long)p[m->n].size, kvb__cuda_errstr(r));
        }
        close(fds[i]); /* imported (or not): the driver holds what it needs */
    }
    return r == KVB_CUDA_SUCCESS;
}

/* Reserve, map every part back to back, grant access on dev (m->n: parts
 * mapped so far, for the caller to unmap on failure). */
static bool map_parts(int dev, const kvb__hs_reply_t *rep, const kvb__hs_vmm_part_t *p,
                      kvb__cuda_vmm_map_t *m, char *why, size_t wl)
{
    const kvb__cuda_api_t *cu = kvb__cuda();
    kvb_CUresult r = cu->cuMemAddressReserve(&m->va, m->size, 0, 0, 0);
    if (r != KVB_CUDA_SUCCESS) {
        snprintf(why, wl, "reserving %llu bytes of addresses: %s", (unsigned long long)m->size,
                 kvb__cuda_errstr(r));
        return false;
    }
    m->reserved = true;
    int c = rep->fdsock[0] != 0 ? kvb__fdsrv_connect(rep->fdsock, why, wl) : -1;
    int fds[KVB_FDSRV_MAX_FDS];
    uint64_t off = 0;
    bool ok = true;
    while (ok && m->n < m->parts) {
        uint32_t k = m->parts - m->n < KVB_FDSRV_MAX_FDS ? m->parts - m->n : KVB_FDSRV_MAX_FDS;
        ok = fetch_batch(rep, &c, p + m->n, k, fds, why, wl) &&
             map_batch(m, p, fds, k, &off, why, wl);
    }
    if (c >= 0)
        close(c);
    if (!ok)
        return false;
    kvb_CUmemAccessDesc d = {{KVB_CU_MEM_LOCATION_TYPE_DEVICE, dev},
                             KVB_CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    r = cu->cuMemSetAccess(m->va, m->size, &d, 1);
    if (r != KVB_CUDA_SUCCESS)
        snprintf(why, wl, "cuMemSetAccess: %s", kvb__cuda_errstr(r));
    return r == KVB_CUDA_SUCCESS;
}

bool kvb__cuda_vmm_import(int dev, uint32_t pid, const kvb__hs_reply_t *rep,
                          const kvb__hs_cuda_t *e, uint64_t seg_len, kvb__cuda_vmm_map_t *m,
                          char *why, size_t wl)
{
    if (!kvb__cuda_has_vmm()) {
        snprintf(why, wl, "the CUDA driver lacks the VMM entry points");
        return false;
    }
    /* the decoder checked the parts exist and add up to vmm_size */
    if (pid == 0 || e->alloc_off > e->vmm_size || seg_len > e->vmm_size - e->alloc_off) {
        snprintf(why, wl, "VMM allocations (%u, %llu bytes, segment at +%llu, %llu bytes) invalid",
                 e->nparts, (unsigned long long)e->vmm_size, (unsigned long long)e->alloc_off,
                 (unsigned long long)seg_len);
        return false;
    }
    const kvb__hs_vmm_part_t *p = rep->parts + e->part0;
    *m = (kvb__cuda_vmm_map_t){0};
    m->size = e->vmm_size;
    m->parts = e->nparts;
    m->sizes = malloc(e->nparts * sizeof(*m->sizes));
    if (m->sizes == NULL) {
        snprintf(why, wl, "out of memory");
        m->size = 0;
        return false;
    }
    for (uint32_t i = 0; i < e->nparts; i++)
        m->sizes[i] = p[i].size;
    kvb__cuda_scope_t sc = {NULL, false};
    bool ok = kvb__cuda_enter(dev, &sc, why, wl) == KVB_OK && map_parts(dev, rep, p, m, why, wl);
    if (!ok)
        kvb__cuda_vmm_unmap(m);
    kvb__cuda_leave(&sc);
    return ok;
}

void kvb__cuda_vmm_unmap(kvb__cuda_vmm_map_t *m)
{
    uint64_t off = 0;
    for (uint32_t i = 0; i < m->n; off += m->sizes[i++])
        kvb__cuda()->cuMemUnmap(m->va + off, m->sizes[i]);
    if (m->reserved)
        kvb__cuda()->cuMemAddressFree(m->va, m->size);
    free(m->sizes);
    *m = (kvb__cuda_vmm_map_t){0};
}
