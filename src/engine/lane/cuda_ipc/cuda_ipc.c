/* The CUDA IPC/VMM lane (docs/engine.md "CUDA device memory"): on one
 * host, device memory the target exports (a legacy IPC handle of the
 * allocation, or its VMM allocations as file descriptors: vmm.c, passed
 * over the descriptor socket: fdsrv.c) is imported by the writer, and the
 * direct lane's copy threads copy into it through the driver (a unit is one
 * batch of driver copies), fenced by the target's fence page. Target side:
 * the export at registration and the handles in the handshake reply;
 * writer side: the imports, one per allocation and process. */
#include "engine/lane/cuda_ipc/cuda_ipc.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- target: the export at registration, the handles in the reply ---- */

/* Make the allocation(s) holding r (the first one [base, +size))
 * importable by same-host writers: VMM allocations as file descriptors
 * (vmm.c), cuMemAlloc memory as a legacy IPC handle. Refused: writers
 * stage it. KVB_ERR_INVALID (why) when r cannot be registered at all. */
static kvb_status_t export_region(kvb_engine_h eng, const kvb_mem_region_ex_t *r,
                                  kvb__cuda_seg_t *cs, uint64_t base, uint64_t size, char *why,
                                  size_t wl)
{
    kvb_CUipcMemHandle h;
    kvb_CUresult cr = KVB_CUDA_SUCCESS;
    uint64_t end = (uint64_t)(uintptr_t)r->addr + r->length;
    int v = kvb__cuda_vmm_export(cs->device, base, size, end, cs, why, wl);
    if (v == -2)
        return KVB_ERR_INVALID;
    if (v > 0) {
        kvb__fdsrv_ensure(eng);
        return KVB_OK;
    }
    if (v == 0) {
        kvb__cuda_scope_t sc = {NULL, false};
        kvb_status_t bst = kvb__cuda_enter(cs->device, &sc, why, wl);
        if (bst == KVB_OK)
            cr = kvb__cuda()->cuIpcGetMemHandle(&h, base);
        kvb__cuda_leave(&sc);
        if (bst == KVB_OK && cr == KVB_CUDA_SUCCESS) {
            memcpy(cs->handle, &h, sizeof(cs->handle));
            cs->ipc = true;
            return KVB_OK;
        }
        if (bst == KVB_OK)
            snprintf(why, wl, "cuIpcGetMemHandle: %s", kvb__cuda_errstr(cr));
    }
    KVB_LOGI("engine %s: %p+%zu (CUDA device %d) cannot be exported (%s): writers on this "
             "host stage it through host memory",
             eng->sid, r->addr, r->length, cs->device, why);
    return KVB_OK;
}

/* The parts table of r's VMM entries (their descriptors and sizes). */
static kvb_status_t reply_parts(kvb_engine_h eng, kvb__hs_reply_t *r)
{
    uint64_t n = 0;
    for (uint32_t i = 0; i < r->ncuda; i++)
        if (r->cuda[i].flags == KVB_HS_CUDA_VMM_PARTS)
            n += r->cuda[i].nparts;
    if (n == 0)
        return KVB_OK;
    if (n > KVB_HS_MAX_VMM_PARTS) {
        KVB_LOGW("engine %s: %llu VMM allocations registered, more than a handshake carries "
                 "(%u): writers stage device memory",
                 eng->sid, (unsigned long long)n, KVB_HS_MAX_VMM_PARTS);
        for (uint32_t i = 0; i < r->ncuda; i++)
            if (r->cuda[i].flags == KVB_HS_CUDA_VMM_PARTS)
                r->cuda[i].flags = 0;
        return KVB_OK;
    }
    r->nparts = (uint32_t)n;
    r->parts = calloc(r->nparts, sizeof(*r->parts));
    if (r->parts == NULL)
        return KVB_ERR_NOMEM;
    kvb__fdsrv_ticket(eng, r->fdsock, r->ticket); /* none: writers use pidfd_getfd */
    for (uint32_t i = 0; i < r->ncuda; i++) {
        const kvb__hs_cuda_t *e = &r->cuda[i];
        const kvb__cuda_seg_t *cs = eng->segs.v[e->seg].cuda;
        for (uint32_t k = 0; e->flags == KVB_HS_CUDA_VMM_PARTS && k < e->nparts; k++)
            r->parts[e->part0 + k] =
                (kvb__hs_vmm_part_t){(uint32_t)cs->vmm_fds[k], cs->vmm_sizes[k]};
    }
    return KVB_OK;
}

/* The device-memory table (mem_cuda.c) gains, for a writer on this host,
 * each entry's IPC handle or VMM parts; then the parts table. */
static kvb_status_t ipc_advertise(kvb_engine_h eng, kvb__hs_reply_t *r, bool local, uint32_t caps)
{
    uint64_t part = 0;
    for (uint32_t i = 0; local && i < r->ncuda; i++) {
        kvb__hs_cuda_t *e = &r->cuda[i];
        const kvb__cuda_seg_t *cs = eng->segs.v[e->seg].cuda;
        if (cs->ipc) {
            e->flags = KVB_HS_CUDA_IPC;
            e->alloc_off = cs->alloc_off;
            memcpy(e->handle, cs->handle, sizeof(e->handle));
        } else if (cs->vmm && (caps & KVB_HS_CAP_VMM_PARTS)) {
            /* a writer without the cap would refuse the flag: it stages */
            e->flags = KVB_HS_CUDA_VMM_PARTS;
            e->alloc_off = cs->alloc_off;
            e->part0 = (uint32_t)part; /* too many in all: reply_parts drops them */
            e->nparts = cs->vmm_n;
            e->vmm_size = cs->vmm_size;
            part += cs->vmm_n;
        }
    }
    return reply_parts(eng, r);
}

static uint32_t ipc_request_caps(void)
{
    if (kvb__env_int("KVBRIDGE_CUDA_VMM", NULL, 1, 0, 1) == 0 || !kvb__cuda_has_vmm())
        return 0;
    return KVB_HS_CAP_VMM_PARTS;
}

/* ---- writer: IPC imports, one per allocation and process ----
 * The driver maps one exported allocation once per process (a second
 * cuIpcOpenMemHandle of the same handle fails on some drivers), while
 * several connections (to one peer, old and new) may use it: counted. */

typedef struct ipc_import {
    uint8_t handle[KVB_HS_CUDA_HANDLE];
    kvb_CUdeviceptr base;
    uint64_t size;
    int refs;
    struct ipc_import *next;
} ipc_import_t;

static pthread_mutex_t g_ipc_mu = PTHREAD_MUTEX_INITIALIZER;
static ipc_import_t *g_ipc;

/* A connection's imports (c->cuda_ipc). */
struct kvb__cuda_ipc_conn {
    ipc_import_t **imports;    /* one per entry of the peer's table (NULL: not imported) */
    kvb__cuda_vmm_map_t *vmms; /* one per entry (size 0: not mapped) */
    uint32_t n;
};

static ipc_import_t *ipc_open(int device, const uint8_t *handle, char *why, size_t wl)
{
    const kvb__cuda_api_t *cu = kvb__cuda();
    ipc_import_t *m;
    pthread_mutex_lock(&g_ipc_mu);
    for (m = g_ipc; m != NULL; m = m->next)
        if (memcmp(m->handle, handle, KVB_HS_CUDA_HANDLE) == 0)
            break;
    if (m != NULL) {
        m->refs++;
        pthread_mutex_unlock(&g_ipc_mu);
        return m;
    }
    kvb_CUipcMemHandle h;
    kvb_CUdeviceptr p = 0;
    size_t size = 0;
    memcpy(&h, handle, sizeof(h));
    kvb_CUresult r = KVB_CUDA_ERROR_NOT_SUPPORTED;
    kvb__cuda_scope_t sc = {NULL, false};
    if (kvb__cuda_enter(device, &sc, why, wl) == KVB_OK) {
        r = cu->cuIpcOpenMemHandle(&p, h, KVB_CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
        if (r == KVB_CUDA_SUCCESS)
            r = cu->cuPointerGetAttribute(&size, KVB_CU_POINTER_ATTRIBUTE_RANGE_SIZE, p);
        if (r != KVB_CUDA_SUCCESS)
            snprintf(why, wl, "cuIpcOpenMemHandle: %s", kvb__cuda_errstr(r));
    }
    kvb__cuda_leave(&sc);
    m = r == KVB_CUDA_SUCCESS ? calloc(1, sizeof(*m)) : NULL;
    if (m != NULL) {
        memcpy(m->handle, handle, KVB_HS_CUDA_HANDLE);
        m->base = p;
        m->size = size;
        m->refs = 1;
        m->next = g_ipc;
        g_ipc = m;
    } else if (r == KVB_CUDA_SUCCESS) {
        cu->cuIpcCloseMemHandle(p);
        snprintf(why, wl, "out of memory");
    }
    pthread_mutex_unlock(&g_ipc_mu);
    return m;
}

static void ipc_close(ipc_import_t *m)
{
    pthread_mutex_lock(&g_ipc_mu);
    if (--m->refs == 0) {
        ipc_import_t **pp = &g_ipc;
        while (*pp != m)
            pp = &(*pp)->next;
        *pp = m->next;
        kvb__cuda()->cuIpcCloseMemHandle(m->base);
        free(m);
    }
    pthread_mutex_unlock(&g_ipc_mu);
}

/* Import entry e: the mapping must hold the segment (the offset and length
 * came from the peer). Sets the segment's direct address. */
static void import_one(kvb_engine_h eng, kvb__conn_t *c, uint32_t i, const kvb__hs_cuda_t *e,
                       kvb__seg_t *s)
{
    char why[300] = "";
    int dev = __atomic_load_n(&eng->cuda_device, __ATOMIC_RELAXED);
    ipc_import_t *m = ipc_open(dev < 0 ? 0 : dev, e->handle, why, sizeof(why));
    if (m != NULL && (e->alloc_off > m->size || s->len > m->size - e->alloc_off)) {
        snprintf(why, sizeof(why), "segment [+%llu, %llu bytes) outside the allocation (%llu)",
                 (unsigned long long)e->alloc_off, (unsigned long long)s->len,
                 (unsigned long long)m->size);
        ipc_close(m);
        m = NULL;
    }
    if (m == NULL) {
        KVB_LOGI("engine %s: session %s: device segment 0x%llx not imported (%s): staged "
                 "through host memory",
                 eng->sid, c->sess->sid, (unsigned long long)s->addr, why);
        return;
    }
    c->cuda_ipc->imports[i] = m;
    s->direct = (uint8_t *)(uintptr_t)(m->base + e->alloc_off);
}

/* Map entry e's VMM allocations (listener pid's descriptors); sets the
 * segment's direct address. */
static void vmm_one(kvb_engine_h eng, kvb__conn_t *c, const kvb__hs_reply_t *r, uint32_t i,
                    const kvb__hs_cuda_t *e, kvb__seg_t *s)
{
    char why[300] = "";
    int dev = __atomic_load_n(&eng->cuda_device, __ATOMIC_RELAXED);
    kvb__cuda_vmm_map_t *m = &c->cuda_ipc->vmms[i];
    if (!kvb__cuda_vmm_import(dev < 0 ? 0 : dev, r->pid, r, e, s->len, m, why, sizeof(why))) {
        KVB_LOGI("engine %s: session %s: device segment 0x%llx (VMM) not mapped (%s): staged "
                 "through host memory",
                 eng->sid, c->sess->sid, (unsigned long long)s->addr, why);
        return;
    }
    s->direct = (uint8_t *)(uintptr_t)(m->va + e->alloc_off);
}

static void ipc_detach(kvb__conn_t *c)
{
    kvb__cuda_ipc_conn_t *cc = c->cuda_ipc;
    if (cc == NULL)
        return;
    for (uint32_t i = 0; i < cc->n && cc->imports != NULL; i++)
        if (cc->imports[i] != NULL)
            ipc_close(cc->imports[i]);
    for (uint32_t i = 0; i < cc->n && cc->vmms != NULL; i++)
        kvb__cuda_vmm_unmap(&cc->vmms[i]);
    free(cc->vmms);
    free(cc->imports);
    free(cc);
    c->cuda_ipc = NULL;
}

static kvb_status_t ipc_conn_alloc(kvb__conn_t *c, const kvb__hs_reply_t *r)
{
    if (r->ncuda == 0)
        return KVB_OK;
    kvb__cuda_ipc_conn_t *cc = calloc(1, sizeof(*cc));
    if (cc != NULL) {
        cc->imports = calloc(r->ncuda, sizeof(*cc->imports));
        cc->vmms = calloc(r->ncuda, sizeof(*cc->vmms));
    }
    c->cuda_ipc = cc;
    if (cc == NULL || cc->imports == NULL || cc->vmms == NULL) {
        ipc_detach(c);
        return KVB_ERR_NOMEM;
    }
    return KVB_OK;
}

/* Import the peer's device segments where the direct lane mapped its fence
 * page (same host, proven): the page fences these units too. Marked device
 * memory (mem_cuda.c), a segment is written only where imported. */
static void ipc_attach(kvb_engine_h eng, kvb__conn_t *c, const kvb__hs_reply_t *r)
{
    kvb__cuda_ipc_conn_t *cc = c->cuda_ipc;
    bool import = c->fence != NULL;
    if (cc == NULL)
        return;
    uint32_t imported = 0, vmms = 0;
    for (uint32_t i = 0; i < r->ncuda; i++) {
        const kvb__hs_cuda_t *e = &r->cuda[i];
        kvb__seg_t *s = kvb__segtab_at(&c->segs, r->segs[e->seg].addr);
        if (s == NULL)
            continue; /* cannot be: the conn's table is the reply's */
        cc->n = i + 1;
        s->direct = NULL; /* never written as host memory */
        if (import && kvb__cuda() != NULL && (e->flags & KVB_HS_CUDA_IPC)) {
            import_one(eng, c, i, e, s);
            imported += s->direct != NULL;
        } else if (import && kvb__cuda() != NULL && e->flags == KVB_HS_CUDA_VMM_PARTS) {
            vmm_one(eng, c, r, i, e, s);
            vmms += s->direct != NULL;
        }
    }
    KVB_LOGI("engine %s: session %s: %u device segment(s), %u imported over CUDA IPC, %u VMM "
             "allocation(s) mapped",
             eng->sid, c->sess->sid, r->ncuda, imported, vmms);
}

/* ---- the lane ---- */

extern const kvb__lane_t kvb__lane_direct;

/* Where the direct lane may write (every destination mapped or imported,
 * the grant not fenced): the same copy threads, which copy a CUDA write's
 * units through the driver. */
static bool ipc_usable(kvb_engine_h eng, const kvb__conn_t *c, const struct kvb_xfer *x,
                       const long *dst_seg, const kvb__wblocks_t *w)
{
    return kvb__lane_direct.usable(eng, c, x, dst_seg, w);
}

/* Alone in its group: a unit is one batch of driver copies. Reads too:
 * out of the peer's imported device memory (or its mapped host memory into
 * device memory here). */
static kvb_status_t ipc_submit(kvb_engine_h eng, struct kvb_xfer *const *xs, size_t n)
{
    return kvb__lane_direct.submit(eng, xs, n);
}

const kvb__lane_t kvb__lane_cuda_ipc = {
    .name = "cuda-ipc",
    .pairs = KVB__PAIRS_DEVICE,
    .caps = KVB__LANE_RUNS,
    .fence = KVB__LANE_FENCE_PAGE,
    .fini = kvb__fdsrv_stop, /* its thread reads the segments */
    .export_device = export_region,
    .unexport_device = kvb__cuda_vmm_unexport,
    .advertise = ipc_advertise,
    .request_caps = ipc_request_caps,
    .attach_prepare = ipc_conn_alloc,
    .attach = ipc_attach,
    .detach = ipc_detach,
    .usable = ipc_usable,
    .submit = ipc_submit,
    .read = ipc_submit, /* the copy threads copy a read's units the other way */
};
