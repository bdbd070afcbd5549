/* CUDA device memory as a memory kind (docs/engine.md "CUDA device
 * memory"): registrations (kind, device, checked against the allocation;
 * the lanes export it, lane.h `export_device`), the handshake's
 * device-memory table every writer gets, the writer's marks on a peer's
 * device segments (never written as host memory), the kinds of a write's
 * two sides for lane choice, and the public queries. Without a driver
 * nothing here runs but the classification, which answers "host". */
#include "engine/engine_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- registration ---- */

static kvb_status_t region_error(kvb_engine_h eng, kvb_status_t st, const kvb_mem_region_ex_t *r,
                                 const char *why)
{
    return kvb__err_set(&eng->err, st, "register %p+%zu: %s", r->addr, r->length, why);
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
    if (kvb__lanes_export_device(eng, r, cs, base, size, why, sizeof(why)) != KVB_OK) {
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
    kvb__lanes_unexport_device(seg->cuda);
    free(seg->cuda);
    seg->cuda = NULL;
    eng->n_cuda_segs--;
}

/* ---- the handshake ---- */

kvb_status_t kvb__cuda_table(kvb_engine_h eng, kvb__hs_reply_t *r)
{
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
    }
    return KVB_OK;
}

/* The peer's device segments, as its handshake's table names them. */
typedef struct kvb__cuda_conn kvb__cuda_conn_t;
struct kvb__cuda_conn {
    kvb__cuda_seg_t *segs; /* one per entry; c->segs.v[k].cuda points here */
    uint32_t n;
};

kvb_status_t kvb__cuda_conn_alloc(kvb__conn_t *c, const kvb__hs_reply_t *r)
{
    if (r->ncuda == 0)
        return KVB_OK;
    kvb__cuda_conn_t *cc = calloc(1, sizeof(*cc));
    if (cc != NULL)
        cc->segs = calloc(r->ncuda, sizeof(*cc->segs));
    c->cuda = cc;
    if (cc == NULL || cc->segs == NULL) {
        kvb__cuda_conn_free(c);
        return KVB_ERR_NOMEM;
    }
    return KVB_OK;
}

void kvb__cuda_mark(kvb__conn_t *c, const kvb__hs_reply_t *r)
{
    kvb__cuda_conn_t *cc = c->cuda;
    if (cc == NULL)
        return;
    for (uint32_t i = 0; i < r->ncuda; i++) {
        const kvb__hs_cuda_t *e = &r->cuda[i];
        kvb__seg_t *s = kvb__segtab_at(&c->segs, r->segs[e->seg].addr);
        if (s == NULL)
            continue; /* cannot be: the conn's table is the reply's */
        cc->n = i + 1;
        cc->segs[i].device = e->device;
        s->cuda = &cc->segs[i];
    }
}

void kvb__cuda_conn_free(kvb__conn_t *c)
{
    kvb__cuda_conn_t *cc = c->cuda;
    if (cc == NULL)
        return;
    free(cc->segs);
    free(cc);
    c->cuda = NULL;
}

/* ---- writes, and the public queries ---- */

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
