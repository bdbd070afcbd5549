/* CUDA device memory in the engine (docs/engine.md "CUDA device memory"):
 * registrations (kind, device, the IPC handle of the allocation), the
 * handshake's device-memory table, the writer's IPC imports (the direct lane
 * then copies device to device through the driver), staging of device
 * sources for the message lane, and the public queries. The target side of
 * staging is in amtarget.c (receive into pinned memory, then host to device).
 * Without a driver nothing here runs but the classification, which answers
 * "host". */
#include "engine/engine_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define STAGE_CHUNK_DEFAULT (8ull << 20) /* bytes staged per step (writer) */
#define STAGE_RING_DEFAULT (64ull << 20) /* pinned bytes one transfer stages through */

/* ---- registration (target and writer) ---- */

static kvb_status_t region_error(kvb_engine_h eng, kvb_status_t st, const kvb_mem_region_ex_t *r,
                                 const char *why)
{
    return kvb__err_set(&eng->err, st, "register %p+%zu: %s", r->addr, r->length, why);
}

/* Make the allocation(s) holding r (the first one [base, +size))
 * importable by same-host writers: VMM allocations as file descriptors
 * (cuda_vmm.c), cuMemAlloc memory as a legacy IPC handle. Refused: writers
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

kvb_status_t kvb__cuda_map_region(kvb_engine_h eng, const kvb_mem_region_ex_t *r, kvb__seg_t *seg,
                                  bool *cuda_p)
{
    char why[300] = "";
    int dev = -1;
    uint64_t base = 0, size = 0, a = (uint64_t)(uintptr_t)r->addr;
    *cuda_p = false;
    if (r->mem_type == KVB_MEM_HOST)
        return KVB_OK;
    if (r->mem_type != KVB_MEM_CUDA && r->mem_type != KVB_MEM_AUTO)
        return region_error(eng, KVB_ERR_INVALID, r, "unknown memory type");
    if (r->mem_type == KVB_MEM_CUDA && kvb__cuda() == NULL) {
        snprintf(why, sizeof(why),
                 "CUDA device memory needs the CUDA driver: %s "
                 "(set KVBRIDGE_CUDA_LIB to the driver library)",
                 kvb__cuda_why());
        return region_error(eng, KVB_ERR_UNSUPPORTED, r, why);
    }
    int k = kvb__cuda_classify(a, &dev, &base, &size, why, sizeof(why));
    if (k < 0)
        return region_error(eng, KVB_ERR_IO, r, why);
    if (k == 0 && r->mem_type == KVB_MEM_CUDA)
        return region_error(eng, KVB_ERR_INVALID, r, "not CUDA device memory");
    if (k == 0)
        return KVB_OK; /* AUTO: host */
    if (a - base >= size || r->length > UINT64_MAX - a) {
        snprintf(why, sizeof(why), "outside its CUDA allocation [0x%llx, +%llu)",
                 (unsigned long long)base, (unsigned long long)size);
        return region_error(eng, KVB_ERR_INVALID, r, why);
    }
    if ((r->field_mask & KVB_MEM_REGION_FIELD_DEVICE) && r->device != dev) {
        snprintf(why, sizeof(why), "on CUDA device %d, not %d", dev, r->device);
        return region_error(eng, KVB_ERR_INVALID, r, why);
    }
    kvb__cuda_seg_t *cs = calloc(1, sizeof(*cs));
    if (cs == NULL)
        return region_error(eng, KVB_ERR_NOMEM, r, "out of memory");
    cs->device = dev;
    cs->alloc_off = a - base;
    if (export_region(eng, r, cs, base, size, why, sizeof(why)) != KVB_OK) {
        free(cs);
        return region_error(eng, KVB_ERR_INVALID, r, why);
    }
    memset(seg, 0, sizeof(*seg));
    seg->addr = a;
    seg->len = r->length;
    seg->cuda = cs;
    int none = -1;
    __atomic_compare_exchange_n(&eng->cuda_device, &none, dev, false, __ATOMIC_RELAXED,
                                __ATOMIC_RELAXED);
    eng->n_cuda_segs++;
    *cuda_p = true;
    return KVB_OK;
}

void kvb__cuda_unmap_seg(kvb_engine_h eng, kvb__seg_t *seg)
{
    kvb__cuda_vmm_unexport(seg->cuda);
    free(seg->cuda);
    seg->cuda = NULL;
    eng->n_cuda_segs--;
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

kvb_status_t kvb__cuda_reply(kvb_engine_h eng, kvb__hs_reply_t *r, bool local, uint32_t caps)
{
    uint64_t part = 0;
    if (eng->n_cuda_segs == 0)
        return KVB_OK;
    r->cuda = calloc(eng->n_cuda_segs, sizeof(*r->cuda));
    if (r->cuda == NULL)
        return KVB_ERR_NOMEM;
    for (size_t i = 0; i < eng->segs.n; i++) {
        const kvb__cuda_seg_t *cs = eng->segs.v[i].cuda;
        if (cs == NULL)
            continue;
        kvb__hs_cuda_t *e = &r->cuda[r->ncuda++];
        e->seg = (uint32_t)i;
        e->device = cs->device;
        if (!local)
            continue;
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

uint32_t kvb__cuda_caps(void)
{
    if (kvb__env_int("KVBRIDGE_CUDA_VMM", NULL, 1, 0, 1) == 0 || !kvb__cuda_has_vmm())
        return 0;
    return KVB_HS_CAP_VMM_PARTS;
}

kvb_status_t kvb_mem_query(const void *addr, kvb_mem_type_t *type_p, int *device_p)
{
    char why[200];
    int dev = -1;
    uint64_t base, size;
    if (addr == NULL || type_p == NULL || device_p == NULL)
        return KVB_ERR_INVALID;
    int k = kvb__cuda_classify((uint64_t)(uintptr_t)addr, &dev, &base, &size, why, sizeof(why));
    if (k < 0) {
        KVB_LOGW("kvb_mem_query: %s", why);
        return KVB_ERR_IO;
    }
    *type_p = k ? KVB_MEM_CUDA : KVB_MEM_HOST;
    *device_p = k ? dev : -1;
    return KVB_OK;
}

int kvb_cuda_available(const char **why_p)
{
    int ok = kvb__cuda() != NULL;
    if (why_p != NULL)
        *why_p = kvb__cuda_why();
    return ok;
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

typedef struct kvb__cuda_conn kvb__cuda_conn_t;
struct kvb__cuda_conn {
    ipc_import_t **imports;    /* one per entry of the peer's table (NULL: not imported) */
    kvb__cuda_vmm_map_t *vmms; /* one per entry (size 0: not mapped) */
    kvb__cuda_seg_t *segs;     /* one per entry; c->segs.v[k].cuda points here */
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
    c->cuda->imports[i] = m;
    s->direct = (uint8_t *)(uintptr_t)(m->base + e->alloc_off);
}

/* Map entry e's VMM allocations (listener pid's descriptors); sets the
 * segment's direct address. */
static void vmm_one(kvb_engine_h eng, kvb__conn_t *c, const kvb__hs_reply_t *r, uint32_t i,
                    const kvb__hs_cuda_t *e, kvb__seg_t *s)
{
    char why[300] = "";
    int dev = __atomic_load_n(&eng->cuda_device, __ATOMIC_RELAXED);
    kvb__cuda_vmm_map_t *m = &c->cuda->vmms[i];
    if (!kvb__cuda_vmm_import(dev < 0 ? 0 : dev, r->pid, r, e, s->len, m, why, sizeof(why))) {
        KVB_LOGI("engine %s: session %s: device segment 0x%llx (VMM) not mapped (%s): staged "
                 "through host memory",
                 eng->sid, c->sess->sid, (unsigned long long)s->addr, why);
        return;
    }
    s->direct = (uint8_t *)(uintptr_t)(m->va + e->alloc_off);
}

kvb_status_t kvb__cuda_conn_alloc(kvb__conn_t *c, const kvb__hs_reply_t *r)
{
    if (r->ncuda == 0)
        return KVB_OK;
    kvb__cuda_conn_t *cc = calloc(1, sizeof(*cc));
    if (cc != NULL) {
        cc->imports = calloc(r->ncuda, sizeof(*cc->imports));
        cc->segs = calloc(r->ncuda, sizeof(*cc->segs));
        cc->vmms = calloc(r->ncuda, sizeof(*cc->vmms));
    }
    c->cuda = cc;
    if (cc == NULL || cc->imports == NULL || cc->segs == NULL || cc->vmms == NULL) {
        kvb__cuda_detach(c);
        return KVB_ERR_NOMEM;
    }
    return KVB_OK;
}

void kvb__cuda_attach(kvb_engine_h eng, kvb__conn_t *c, const kvb__hs_reply_t *r, bool import)
{
    kvb__cuda_conn_t *cc = c->cuda;
    if (cc == NULL)
        return;
    uint32_t imported = 0, vmms = 0;
    for (uint32_t i = 0; i < r->ncuda; i++) {
        const kvb__hs_cuda_t *e = &r->cuda[i];
        long k = kvb__segtab_find_start(&c->segs, r->segs[e->seg].addr);
        if (k < 0)
            continue; /* cannot be: the conn's table is the reply's */
        kvb__seg_t *s = &c->segs.v[k];
        cc->n = i + 1;
        cc->segs[i].device = e->device;
        s->cuda = &cc->segs[i];
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

void kvb__cuda_detach(kvb__conn_t *c)
{
    kvb__cuda_conn_t *cc = c->cuda;
    if (cc == NULL)
        return;
    for (uint32_t i = 0; i < cc->n && cc->imports != NULL; i++)
        if (cc->imports[i] != NULL)
            ipc_close(cc->imports[i]);
    for (uint32_t i = 0; i < cc->n && cc->vmms != NULL; i++)
        kvb__cuda_vmm_unmap(&cc->vmms[i]);
    free(cc->vmms);
    free(cc->imports);
    free(cc->segs);
    free(cc);
    c->cuda = NULL;
}

/* ---- transfers ---- */

void kvb__mem_kinds(kvb_engine_h eng, const kvb__conn_t *c, const long *dst_seg,
                    const kvb__wblocks_t *w, kvb__mem_kind_t *src_p, kvb__mem_kind_t *dst_p)
{
    bool src = false, dst = false;
    long last = -1;
    size_t n = w->n;
    if (c->cuda != NULL)
        for (size_t i = 0; i < n && !dst; i++)
            dst = dst_seg[i] >= 0 && c->segs.v[dst_seg[i]].cuda != NULL;
    pthread_mutex_lock(&eng->seg_mu);
    for (size_t i = 0; i < n && !src && eng->n_cuda_segs > 0; i++) {
        /* a strided block's rows share its first row's segment (checked) */
        kvb_strided_block_t b = kvb__wb_at(w, i);
        if (b.len == 0)
            continue;
        if (last < 0 || b.src < eng->segs.v[last].addr ||
            b.src - eng->segs.v[last].addr >= eng->segs.v[last].len)
            last = kvb__segtab_find(&eng->segs, b.src, b.len);
        src = last >= 0 && eng->segs.v[last].cuda != NULL;
    }
    pthread_mutex_unlock(&eng->seg_mu);
    *src_p = src ? KVB__MEM_CUDA : KVB__MEM_HOST;
    *dst_p = dst ? KVB__MEM_CUDA : KVB__MEM_HOST;
}

/* x's blocks whose source is device memory, and their bytes (seg_mu held). */
static uint64_t device_sources(kvb_engine_h eng, const struct kvb_xfer *x, bool *dev)
{
    uint64_t total = 0;
    for (size_t i = 0; i < x->n; i++) {
        long s = kvb__segtab_find(&eng->segs, x->blocks[i].src, x->blocks[i].len);
        dev[i] = s >= 0 && eng->segs.v[s].cuda != NULL;
        total += dev[i] ? x->blocks[i].len : 0;
    }
    return total;
}

/* ---- writer: pipelined staging of device sources through a ring ----
 * The copies device to pinned host memory run on the device-copy worker,
 * chunk by chunk, in the transfer's order; after each chunk the transfer's
 * staged mark (x->stage_ready: bytes of its blocks, in order, whose sources
 * are readable) moves on and the progress thread sends what it covers, so
 * the copy of chunk k+1 overlaps the send of chunk k. The staged bytes go
 * through a ring of KVBRIDGE_CUDA_STAGE_RING bytes (whole chunks; smaller
 * when the transfer is): a chunk is copied into its slot only once the
 * messages that carried the slot's previous bytes are acknowledged
 * (x->stage_free), so a transfer of any size pins at most the ring. */

typedef struct stage_job {
    kvb__job_t job; /* first */
    kvb_engine_h eng;
    struct kvb_xfer *x;  /* a reference, dropped by done/drop */
    kvb__cuda_copy_t *v; /* device pieces, in the transfer's order, each in one slot */
    uint64_t *at;        /* v[i]'s first byte's position in the transfer */
    uint64_t *soff;      /* v[i]'s offset in the stream of staged bytes */
    size_t nv, i;        /* pieces, next one to copy */
    size_t r;            /* pieces before it whose ring space is free again */
    uint64_t freed;      /* staged bytes whose ring space is free again */
    uint64_t total;      /* the transfer's bytes */
    uint64_t chunk;      /* bytes per step */
    int device;
} stage_job_t;

static void stage_job_free(stage_job_t *j)
{
    kvb__xfer_release(j->x);
    free(j->v);
    free(j->at);
    free(j->soff);
    free(j);
}

/* Pieces from j->i on that fit a step and whose ring slot is free. */
static size_t stage_fit(stage_job_t *j)
{
    struct kvb_xfer *x = j->x;
    uint64_t free_pos = __atomic_load_n(&x->stage_free, __ATOMIC_ACQUIRE);
    while (j->r < j->i && j->at[j->r] + j->v[j->r].len <= free_pos) {
        j->freed = j->soff[j->r] + j->v[j->r].len;
        j->r++;
    }
    size_t k = 0;
    uint64_t bytes = 0;
    while (j->i + k < j->nv && (k == 0 || bytes + j->v[j->i + k].len <= j->chunk) &&
           j->soff[j->i + k] + j->v[j->i + k].len <= j->freed + x->stage_len)
        bytes += j->v[j->i + k++].len;
    return k;
}

static int stage_step(kvb__job_t *jb) /* device-copy worker */
{
    stage_job_t *j = (stage_job_t *)jb;
    struct kvb_xfer *x = j->x;
    char why[300] = "";
    if (__atomic_load_n(&x->status, __ATOMIC_ACQUIRE) != KVB_ERR_INPROGRESS)
        return KVB__JOB_DONE; /* over (failed, canceled): nobody reads the rest */
    size_t k = stage_fit(j);
    if (k == 0)
        return KVB__JOB_BLOCKED; /* the ring is full of bytes not yet acknowledged */
    uint64_t t0 = kvb__now_ns(), bytes = 0;
    for (size_t q = 0; q < k; q++)
        bytes += j->v[j->i + q].len;
    kvb_status_t st = kvb__cuda_copy_batch(j->device, j->v + j->i, k, why, sizeof(why));
    if (st != KVB_OK) {
        snprintf(x->stage_why, sizeof(x->stage_why), "staging device sources: %s", why);
        __atomic_store_n(&x->stage_status, (int)st, __ATOMIC_RELEASE);
        kvb__jobs_wake(j->eng);
        return KVB__JOB_DONE;
    }
    j->i += k;
    uint64_t ready = j->i < j->nv ? j->at[j->i] : UINT64_MAX;
    KVB_LOGD("session %s: staged %llu bytes in %.3f ms, %llu of %llu ready", x->conn->sess->sid,
             (unsigned long long)bytes, (kvb__now_ns() - t0) / 1e6,
             (unsigned long long)(ready == UINT64_MAX ? j->total : ready),
             (unsigned long long)j->total);
    __atomic_store_n(&x->stage_ready, ready, __ATOMIC_RELEASE);
    kvb__jobs_wake(j->eng);
    return j->i < j->nv ? KVB__JOB_MORE : KVB__JOB_DONE;
}

static void stage_done(kvb_engine_h eng, kvb__job_t *jb)
{
    stage_job_free((stage_job_t *)jb);
}

/* Split x's device sources into pieces that each lie in one chunk of the
 * staged stream (so in one slot of the ring: the ring is whole chunks), and
 * mark the blocks staged (their src: an offset in that stream). */
static kvb_status_t stage_plan(stage_job_t *j, const bool *dev, uint64_t total)
{
    struct kvb_xfer *x = j->x;
    /* a piece per device block, and one more at each chunk boundary */
    size_t cap = (size_t)(total / j->chunk) + x->n + 1;
    j->v = malloc((cap ? cap : 1) * sizeof(*j->v));
    j->at = malloc((cap ? cap : 1) * sizeof(*j->at));
    j->soff = malloc((cap ? cap : 1) * sizeof(*j->soff));
    x->staged = calloc(x->n ? x->n : 1, sizeof(*x->staged));
    if (j->v == NULL || j->at == NULL || j->soff == NULL || x->staged == NULL)
        return KVB_ERR_NOMEM;
    uint64_t off = 0, pos = 0;
    for (size_t i = 0; i < x->n; i++) {
        kvb_block_t *b = &x->blocks[i];
        for (uint64_t o = 0; dev[i] && o < b->len;) {
            uint64_t room = j->chunk - (off + o) % j->chunk; /* to the chunk's end */
            uint64_t len = b->len - o < room ? b->len - o : room;
            uint64_t to = (uint64_t)(uintptr_t)x->stage + (off + o) % x->stage_len;
            j->at[j->nv] = pos + o;
            j->soff[j->nv] = off + o;
            j->v[j->nv++] = (kvb__cuda_copy_t){to, b->src + o, len};
            o += len;
        }
        if (dev[i]) {
            b->src = off;
            x->staged[i] = true;
            off += b->len;
        }
        pos += b->len;
    }
    j->total = pos;
    return KVB_OK;
}

static stage_job_t *stage_job_new(kvb_engine_h eng, struct kvb_xfer *x)
{
    stage_job_t *j = calloc(1, sizeof(*j));
    if (j == NULL)
        return NULL;
    j->job = (kvb__job_t){NULL, stage_step, stage_done, stage_done, false};
    j->eng = eng;
    j->x = x;
    __atomic_add_fetch(&x->refs, 1, __ATOMIC_RELAXED);
    int d = __atomic_load_n(&eng->cuda_device, __ATOMIC_RELAXED);
    j->device = d < 0 ? 0 : d;
    j->chunk = (uint64_t)kvb__env_int("KVBRIDGE_CUDA_STAGE_CHUNK", NULL,
                                      (int64_t)STAGE_CHUNK_DEFAULT, 4096, (int64_t)1 << 40);
    return j;
}

/* The ring for total staged bytes: whole chunks, at most
 * KVBRIDGE_CUDA_STAGE_RING (at least one chunk), no more than the bytes. */
static uint64_t stage_ring_len(uint64_t total, uint64_t chunk)
{
    uint64_t ring = (uint64_t)kvb__env_int("KVBRIDGE_CUDA_STAGE_RING", NULL,
                                           (int64_t)STAGE_RING_DEFAULT, 4096, (int64_t)1 << 40);
    ring = ring / chunk * chunk;
    if (ring < chunk)
        ring = chunk;
    uint64_t whole = (total + chunk - 1) / chunk * chunk;
    return whole < ring ? whole : ring;
}

kvb_status_t kvb__cuda_stage_sources(kvb_engine_h eng, struct kvb_xfer *x)
{
    bool *dev = calloc(x->n ? x->n : 1, sizeof(*dev));
    if (dev == NULL)
        return KVB_ERR_NOMEM;
    pthread_mutex_lock(&eng->seg_mu);
    uint64_t total = device_sources(eng, x, dev);
    pthread_mutex_unlock(&eng->seg_mu);
    kvb_status_t st = KVB_OK;
    stage_job_t *j = NULL;
    if (total == 0)
        goto out;
    j = stage_job_new(eng, x);
    if (j == NULL) {
        st = kvb__err_set(&eng->err, KVB_ERR_NOMEM, "session %s: out of memory staging",
                          x->conn->sess->sid);
        goto out;
    }
    uint64_t ring = stage_ring_len(total, j->chunk);
    x->stage = kvb__cuda_stage_get(ring);
    if (x->stage == NULL) {
        st = kvb__err_set(&eng->err, KVB_ERR_NOMEM,
                          "session %s: no %llu bytes of pinned memory "
                          "to stage device sources",
                          x->conn->sess->sid, (unsigned long long)ring);
        goto out;
    }
    x->stage_len = ring;
    st = stage_plan(j, dev, total);
    if (st != KVB_OK) {
        kvb__err_set(&eng->err, st, "session %s: out of memory staging device sources",
                     x->conn->sess->sid);
        goto out;
    }
    x->stage_ready = 0; /* nothing readable before the first chunk */
    x->stage_job = j;
    j = NULL;
out:
    if (j != NULL)
        stage_job_free(j);
    free(dev);
    return st;
}

void kvb__cuda_stage_start(kvb_engine_h eng, struct kvb_xfer *x)
{
    stage_job_t *j = x->stage_job;
    x->stage_job = NULL;
    if (j == NULL || kvb__jobs_push(eng, &j->job))
        return;
    /* no worker (the engine is stopping): here, as far as the ring allows
     * (nothing is sent now: the transfer fails with the engine) */
    while (stage_step(&j->job) == KVB__JOB_MORE)
        ;
    stage_job_free(j);
}

void kvb__cuda_stage_abandon(struct kvb_xfer *x)
{
    if (x->stage_job != NULL)
        stage_job_free(x->stage_job);
    x->stage_job = NULL;
}

/* ---- the lanes: CUDA IPC/VMM (same host), CUDA staging (anywhere) ---- */

extern const kvb__lane_t kvb__lane_direct;

static kvb_status_t ipc_advertise(kvb_engine_h eng, kvb__hs_reply_t *r, bool local, uint32_t caps)
{
    return kvb__cuda_reply(eng, r, local, caps);
}

/* Import where the direct lane mapped the peer's fence page (same host,
 * proven): the page fences these units too. */
static void ipc_attach(kvb_engine_h eng, kvb__conn_t *c, const kvb__hs_reply_t *r)
{
    kvb__cuda_attach(eng, c, r, c->fence != NULL);
}

/* Where the direct lane may write (every destination mapped or imported,
 * the grant not fenced): the same copy threads, which copy a CUDA write's
 * units through the driver. */
static bool ipc_usable(kvb_engine_h eng, const kvb__conn_t *c, const struct kvb_xfer *x,
                       const long *dst_seg, const kvb__wblocks_t *w)
{
    return kvb__lane_direct.usable(eng, c, x, dst_seg, w);
}

/* Alone in its group: a unit is one batch of driver copies. */
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
    .advertise = ipc_advertise,
    .request_caps = kvb__cuda_caps,
    .attach_prepare = kvb__cuda_conn_alloc,
    .attach = ipc_attach,
    .detach = kvb__cuda_detach,
    .usable = ipc_usable,
    .submit = ipc_submit,
};

extern const kvb__lane_t kvb__lane_msg;

/* Stage x's device sources through a pinned ring (the device-copy worker
 * copies them, chunk by chunk) and send it on the message lane; the target
 * stages device destinations itself. */
static kvb_status_t stage_submit(kvb_engine_h eng, struct kvb_xfer *const *xs, size_t n)
{
    struct kvb_xfer *x = xs[0];
    kvb_status_t st = kvb__cuda_stage_sources(eng, x);
    if (st == KVB_OK)
        st = kvb__lane_msg.submit(eng, xs, n);
    if (st != KVB_OK) {
        kvb__cuda_stage_abandon(x); /* drops the plan's reference */
        return st;
    }
    kvb__cuda_stage_start(eng, x); /* staged sources: the copies begin */
    return KVB_OK;
}

/* Sent as the message lane sends, as far as it is staged. */
static void stage_progress(kvb_engine_h eng, struct kvb_xfer *x)
{
    kvb__lane_msg.progress(eng, x);
}

const kvb__lane_t kvb__lane_cuda_stage = {
    .name = "cuda-staging",
    .pairs = KVB__PAIRS_DEVICE,
    .fence = KVB__LANE_FENCE_TARGET,
    .submit = stage_submit,
    .progress = stage_progress,
};
