/* Local registrations (kvb_engine_register*, kvb_engine_unregister*):
 * host memory is mapped for UCX (a remote key the handshake carries) and
 * looked up in the kvb_mem_alloc files (shareable), device memory goes to
 * mem_cuda.c; every change bumps the generation and notifies the writers'
 * control connections. A region with a receive in progress stays. */
#include "engine/engine_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

static void notify_locked(kvb_engine_h eng)
{
    uint8_t msg[KVB_HS_NOTICE_LEN];
    kvb__hs_notice_encode(eng->generation, msg);
    for (size_t i = 0; i < eng->n_notify; i++)
        if (send(eng->notify[i].fd, msg, sizeof(msg), MSG_DONTWAIT | MSG_NOSIGNAL) < 0)
            KVB_LOGD("segment notice to fd %d failed: %s", eng->notify[i].fd, strerror(errno));
}

static kvb_status_t map_region(kvb_engine_h eng, const kvb_mem_region_ex_t *r, kvb__seg_t *seg)
{
    ucp_mem_map_params_t mp = {0};
    ucp_mem_h memh;
    bool cuda = false;
    memset(seg, 0, sizeof(*seg));
    if (r->addr == NULL || r->length == 0 || (uintptr_t)r->addr + r->length < (uintptr_t)r->addr)
        return kvb__err_set(&eng->err, KVB_ERR_INVALID, "region %p+%zu is empty or wraps", r->addr,
                            r->length);
    /* Device memory is moved by the driver (mem_cuda.c), never by UCX. */
    kvb_status_t st = kvb__cuda_map_region(eng, r, seg, &cuda);
    if (st != KVB_OK || cuda)
        return st;
    mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
    mp.address = r->addr;
    mp.length = r->length;
    ucs_status_t us = ucp_mem_map(eng->ctx, &mp, &memh);
    if (us != UCS_OK)
        return kvb__err_set(&eng->err, KVB_ERR_IO, "ucp_mem_map(%p, %zu) failed: %s", r->addr,
                            r->length, ucs_status_string(us));
    us = ucp_rkey_pack(eng->ctx, memh, &seg->rkey_buf, &seg->rkey_len);
    if (us != UCS_OK) {
        ucp_mem_unmap(eng->ctx, memh);
        return kvb__err_set(&eng->err, KVB_ERR_IO, "ucp_rkey_pack failed: %s",
                            ucs_status_string(us));
    }
    seg->addr = (uint64_t)(uintptr_t)r->addr;
    seg->len = r->length;
    seg->handle = memh;
    seg->shared = kvb__shm_lookup(seg->addr, seg->len, &seg->ref);
    return KVB_OK;
}

void kvb__seg_unmap(kvb_engine_h eng, kvb__seg_t *seg)
{
    if (seg->cuda != NULL) {
        kvb__cuda_unmap_seg(eng, seg);
        return;
    }
    ucp_rkey_buffer_release(seg->rkey_buf);
    ucp_mem_unmap(eng->ctx, (ucp_mem_h)seg->handle);
}

/* Remove the region starting at addr (seg_mu held); waits for pins. A
 * region stays registered while an incoming receive into it is in progress:
 * a stalled writer resumes and UCX completes the rendezvous straight into
 * the destination, i.e. into memory the caller would free. That is also why
 * unpin may find a pinned segment by its start address: a pinned segment is
 * never removed, so no new registration can sit at that address. */
static kvb_status_t unregister_locked(kvb_engine_h eng, void *addr)
{
    long i = kvb__segtab_find_start(&eng->segs, (uint64_t)(uintptr_t)addr);
    long lo = kvb__segtab_find_start(&eng->local_segs, (uint64_t)(uintptr_t)addr);
    kvb__seg_t seg;
    if (lo >= 0) { /* no peer ever saw it: nothing to wait for */
        kvb__segtab_remove(&eng->local_segs, (size_t)lo, NULL);
        return KVB_OK;
    }
    if (i < 0)
        return kvb__err_set(&eng->err, KVB_ERR_NOT_FOUND,
                            "unregister: no registered region starts at %p", addr);
    double wait_s = 2 * eng->params.peer_timeout_s;
    uint64_t deadline = kvb__now_ns() + (uint64_t)(wait_s * 1e9);
    while (eng->segs.v[i].pins > 0) {
        if (kvb__now_ns() >= deadline)
            return kvb__err_set(&eng->err, KVB_ERR_TIMEOUT,
                                "unregister %p: an incoming write into it is still in progress "
                                "after %.1f s; the region stays registered (do not free it; "
                                "retry, or close the writer's session)",
                                addr, wait_s);
        kvb__cond_wait_ns(&eng->seg_cv, &eng->seg_mu, 50000000ull);
        i = kvb__segtab_find_start(&eng->segs, (uint64_t)(uintptr_t)addr);
        if (i < 0)
            return kvb__err_set(&eng->err, KVB_ERR_NOT_FOUND,
                                "unregister: region %p went away while waiting", addr);
    }
    kvb__segtab_remove(&eng->segs, (size_t)i, &seg);
    kvb__seg_unmap(eng, &seg);
    return KVB_OK;
}

/* Region i of an array with stride size (kvb_mem_region_t when legacy),
 * as this version's struct: fields the caller's struct lacks take their
 * defaults. */
static kvb_mem_region_ex_t region_at(const void *regions, size_t i, size_t size, bool legacy)
{
    kvb_mem_region_ex_t r = {0};
    if (legacy) {
        const kvb_mem_region_t *o = (const kvb_mem_region_t *)regions + i;
        r = (kvb_mem_region_ex_t){0, o->addr, o->length, o->mem_type, -1, 0};
    } else {
        memcpy(&r, (const uint8_t *)regions + i * size, size < sizeof(r) ? size : sizeof(r));
        if (size < offsetof(kvb_mem_region_ex_t, device) + sizeof(int))
            r.field_mask &= ~(uint64_t)KVB_MEM_REGION_FIELD_DEVICE;
        if (size < offsetof(kvb_mem_region_ex_t, local_only) + sizeof(int))
            r.field_mask &= ~(uint64_t)KVB_MEM_REGION_FIELD_LOCAL_ONLY;
    }
    return r;
}

static bool is_local_only(const kvb_mem_region_ex_t *r)
{
    return (r->field_mask & KVB_MEM_REGION_FIELD_LOCAL_ONLY) && r->local_only;
}

/* A region refused with st: the engine's error names it. */
static kvb_status_t reg_refused(kvb_engine_h eng, const kvb_mem_region_ex_t *r, kvb_status_t st)
{
    return kvb__err_set(&eng->err, st, "register %p+%zu: %s", r->addr, r->length,
                        st == KVB_ERR_OVERLAP ? "overlaps a registered region"
                                              : kvb_status_string(st));
}

/* Same-host peers of the direct lane map a kvb_mem_alloc file whole and
 * read-write once any part of it is advertised, so a local-only region and
 * an advertised one never share a file. The entry of t that meets
 * [a, +len), or -1; for the advertised table, an entry meets it when its
 * file's mapping [start, +file size) does (seg_mu held). */
static long meets(const kvb__segtab_t *t, bool files, uint64_t a, uint64_t len)
{
    for (size_t i = 0; i < t->n; i++) {
        const kvb__seg_t *s = &t->v[i];
        uint64_t start = files ? s->addr - s->ref.file_off : s->addr;
        uint64_t size = files ? s->ref.file_size : s->len;
        if ((!files || s->shared) && a < start + size && start < a + len)
            return (long)i;
    }
    return -1;
}

/* A local-only region (seg_mu held): no UCX mapping, no remote key, no
 * shared file, so nothing a peer could be handed; only its bounds, for the
 * local-side checks of this engine's own transfers (a write's source, a
 * read's destination). */
static kvb_status_t register_local_only(kvb_engine_h eng, const kvb_mem_region_ex_t *r)
{
    uint64_t a = (uint64_t)(uintptr_t)r->addr;
    kvb_mem_type_t t = KVB_MEM_HOST;
    int dev;
    if (r->addr == NULL || r->length == 0 || a + r->length < a)
        return kvb__err_set(&eng->err, KVB_ERR_INVALID, "region %p+%zu is empty or wraps", r->addr,
                            r->length);
    if (r->mem_type == KVB_MEM_CUDA ||
        (r->mem_type == KVB_MEM_AUTO && kvb_mem_query(r->addr, &t, &dev) == KVB_OK &&
         t == KVB_MEM_CUDA))
        return kvb__err_set(&eng->err, KVB_ERR_INVALID,
                            "register %p+%zu: a local-only region must be host memory", r->addr,
                            r->length);
    kvb__seg_t seg = {.addr = a, .len = r->length};
    if (kvb__segtab_overlaps(&eng->segs, a, r->length))
        return reg_refused(eng, r, KVB_ERR_OVERLAP);
    long f = meets(&eng->segs, true, a, r->length);
    if (f >= 0)
        return kvb__err_set(&eng->err, KVB_ERR_INVALID,
                            "register %p+%zu local-only: it lies in the kvb_mem_alloc allocation "
                            "of the registered region %p, and same-host peers map that whole "
                            "file read-write; put local-only memory in an allocation of its own",
                            r->addr, r->length, (void *)(uintptr_t)eng->segs.v[f].addr);
    kvb_status_t st = kvb__segtab_insert(&eng->local_segs, &seg);
    return st == KVB_OK ? st : reg_refused(eng, r, st);
}

/* A region peers see: mapped for UCX, then in the table the handshake sends. */
static kvb_status_t register_shared(kvb_engine_h eng, const kvb_mem_region_ex_t *r)
{
    kvb__seg_t seg;
    kvb_status_t st = map_region(eng, r, &seg);
    if (st != KVB_OK)
        return st;
    long lo = seg.shared
                  ? meets(&eng->local_segs, false, seg.addr - seg.ref.file_off, seg.ref.file_size)
                  : -1;
    st = kvb__segtab_overlaps(&eng->local_segs, seg.addr, seg.len) ? KVB_ERR_OVERLAP
         : lo >= 0                                                 ? KVB_ERR_INVALID
                   : kvb__segtab_insert(&eng->segs, &seg);
    if (st != KVB_OK) {
        kvb__seg_unmap(eng, &seg);
        if (st == KVB_ERR_INVALID)
            kvb__err_set(&eng->err, st,
                         "register %p+%zu: its kvb_mem_alloc allocation holds the local-only "
                         "region %p+%llu, and same-host peers map that whole file read-write "
                         "once part of it is registered; unregister that region first, or put "
                         "it in an allocation of its own",
                         r->addr, r->length, (void *)(uintptr_t)eng->local_segs.v[lo].addr,
                         (unsigned long long)eng->local_segs.v[lo].len);
        else
            reg_refused(eng, r, st);
    }
    return st;
}

static kvb_status_t register_regions(kvb_engine_h eng, const void *regions, size_t count,
                                     size_t size, bool legacy)
{
    kvb_status_t st = KVB_OK;
    size_t done = 0;
    if (eng == NULL || (regions == NULL && count > 0))
        return KVB_ERR_INVALID;
    if (!legacy && size < offsetof(kvb_mem_region_ex_t, mem_type) + sizeof(kvb_mem_type_t))
        return kvb__err_set(&eng->err, KVB_ERR_INVALID,
                            "register: region_size %zu is shorter than a region", size);
    pthread_mutex_lock(&eng->seg_mu);
    for (; done < count; done++) {
        kvb_mem_region_ex_t r = region_at(regions, done, size, legacy);
        st = is_local_only(&r) ? register_local_only(eng, &r) : register_shared(eng, &r);
        if (st != KVB_OK)
            break;
    }
    if (st != KVB_OK)
        while (done-- > 0)
            unregister_locked(eng, region_at(regions, done, size, legacy).addr);
    else if (count > 0) {
        eng->generation++;
        notify_locked(eng);
    }
    pthread_mutex_unlock(&eng->seg_mu);
    return st;
}

kvb_status_t kvb_engine_register_batch(kvb_engine_h eng, const kvb_mem_region_t *regions,
                                       size_t count)
{
    return register_regions(eng, regions, count, sizeof(*regions), true);
}

kvb_status_t kvb_engine_register_ex(kvb_engine_h eng, const kvb_mem_region_ex_t *regions,
                                    size_t count, size_t region_size)
{
    return register_regions(eng, regions, count, region_size, false);
}

kvb_status_t kvb_engine_register(kvb_engine_h eng, void *addr, size_t length,
                                 kvb_mem_type_t mem_type)
{
    kvb_mem_region_t r = {addr, length, mem_type};
    return kvb_engine_register_batch(eng, &r, 1);
}

kvb_status_t kvb_engine_unregister_batch(kvb_engine_h eng, void *const *addrs, size_t count)
{
    kvb_status_t st = KVB_OK;
    if (eng == NULL || (addrs == NULL && count > 0))
        return KVB_ERR_INVALID;
    pthread_mutex_lock(&eng->seg_mu);
    for (size_t i = 0; i < count; i++) {
        kvb_status_t s = unregister_locked(eng, addrs[i]);
        if (s != KVB_OK)
            st = s;
    }
    eng->generation++;
    notify_locked(eng);
    pthread_mutex_unlock(&eng->seg_mu);
    return st;
}

kvb_status_t kvb_engine_unregister(kvb_engine_h eng, void *addr)
{
    return kvb_engine_unregister_batch(eng, &addr, 1);
}
