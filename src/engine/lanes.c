/* The lane registry (lane.h): every lane the engine has, in the order lane
 * choice tries them, and the loops the core runs over them. A new lane is
 * one folder under src/engine/lane/ and one line in kvb__lanes. */
#include "engine/lane.h"

#include "core/metrics.h"
#include "engine/engine_int.h"

extern const kvb__lane_t kvb__lane_direct, kvb__lane_cuda_ipc, kvb__lane_put, kvb__lane_msg,
    kvb__lane_cuda_stage;

const kvb__lane_t *const kvb__lanes[] = {
    &kvb__lane_direct,     /* one host, the peer's kvb_mem_alloc files mapped: copy threads */
    &kvb__lane_cuda_ipc,   /* one host, device memory imported (CUDA IPC/VMM): copy threads */
    &kvb__lane_put,        /* UCX one-sided puts (--transport shm, KVBRIDGE_LANE=put) */
    &kvb__lane_msg,        /* UCX active messages the target places (shm or tcp) */
    &kvb__lane_cuda_stage, /* device memory through pinned host memory, on messages */
    NULL,
};

unsigned kvb__lane_index(const kvb__lane_t *lane)
{
    unsigned i = 0;
    while (kvb__lanes[i] != NULL && kvb__lanes[i] != lane)
        i++;
    return i;
}

kvb_status_t kvb__lanes_init(kvb_engine_h eng)
{
    for (const kvb__lane_t *const *l = kvb__lanes; *l != NULL; l++) {
        kvb__metrics_lane_name(kvb__lane_index(*l), (*l)->name);
        kvb_status_t st = (*l)->init != NULL ? (*l)->init(eng) : KVB_OK;
        if (st != KVB_OK)
            return st;
    }
    return KVB_OK;
}

void kvb__lanes_stop(kvb_engine_h eng)
{
    for (const kvb__lane_t *const *l = kvb__lanes; *l != NULL; l++)
        if ((*l)->stop != NULL)
            (*l)->stop(eng);
}

void kvb__lanes_fini(kvb_engine_h eng)
{
    for (const kvb__lane_t *const *l = kvb__lanes; *l != NULL; l++)
        if ((*l)->fini != NULL)
            (*l)->fini(eng);
}

kvb_status_t kvb__lanes_export_device(kvb_engine_h eng, const kvb_mem_region_ex_t *r,
                                      struct kvb__cuda_seg *cs, uint64_t base, uint64_t size,
                                      char *why, size_t wl)
{
    for (const kvb__lane_t *const *l = kvb__lanes; *l != NULL; l++) {
        kvb_status_t st = (*l)->export_device != NULL
                              ? (*l)->export_device(eng, r, cs, base, size, why, wl)
                              : KVB_OK;
        if (st != KVB_OK)
            return st;
    }
    return KVB_OK;
}

void kvb__lanes_unexport_device(struct kvb__cuda_seg *cs)
{
    for (const kvb__lane_t *const *l = kvb__lanes; *l != NULL; l++)
        if ((*l)->unexport_device != NULL)
            (*l)->unexport_device(cs);
}

kvb_status_t kvb__lanes_advertise(kvb_engine_h eng, kvb__hs_reply_t *r, bool local, uint32_t caps)
{
    for (const kvb__lane_t *const *l = kvb__lanes; *l != NULL; l++) {
        kvb_status_t st = (*l)->advertise != NULL ? (*l)->advertise(eng, r, local, caps) : KVB_OK;
        if (st != KVB_OK)
            return st;
    }
    return KVB_OK;
}

uint32_t kvb__lanes_request_caps(void)
{
    uint32_t caps = 0;
    for (const kvb__lane_t *const *l = kvb__lanes; *l != NULL; l++)
        if ((*l)->request_caps != NULL)
            caps |= (*l)->request_caps();
    return caps;
}

kvb_status_t kvb__lanes_attach_prepare(kvb__conn_t *c, const kvb__hs_reply_t *r)
{
    for (const kvb__lane_t *const *l = kvb__lanes; *l != NULL; l++) {
        kvb_status_t st = (*l)->attach_prepare != NULL ? (*l)->attach_prepare(c, r) : KVB_OK;
        if (st != KVB_OK)
            return st;
    }
    return KVB_OK;
}

void kvb__lanes_attach(kvb_engine_h eng, kvb__conn_t *c, const kvb__hs_reply_t *r)
{
    for (const kvb__lane_t *const *l = kvb__lanes; *l != NULL; l++)
        if ((*l)->attach != NULL)
            (*l)->attach(eng, c, r);
}

void kvb__lanes_detach(kvb__conn_t *c)
{
    for (const kvb__lane_t *const *l = kvb__lanes; *l != NULL; l++)
        if ((*l)->detach != NULL)
            (*l)->detach(c);
}

void kvb__lanes_choose(kvb_engine_h eng, struct kvb_xfer *x, kvb__mem_kind_t src,
                       kvb__mem_kind_t dst, const long *dst_seg, const kvb__wblocks_t *w)
{
    x->lane = x->lane_next = NULL;
    for (const kvb__lane_t *const *l = kvb__lanes; *l != NULL; l++) {
        if (!((*l)->pairs & KVB__PAIR(src, dst)) || (x->read && (*l)->read == NULL) ||
            ((*l)->usable != NULL && !(*l)->usable(eng, x->conn, x, dst_seg, w)))
            continue;
        if (x->lane != NULL) {
            x->lane_next = *l;
            return;
        }
        x->lane = *l;
    }
}

void kvb__lanes_stats(kvb_engine_h eng, kvb_engine_limits_t *lim)
{
    for (const kvb__lane_t *const *l = kvb__lanes; *l != NULL; l++)
        if ((*l)->stats != NULL)
            (*l)->stats(eng, lim);
}

void kvb__lanes_tick(kvb_engine_h eng)
{
    for (const kvb__lane_t *const *l = kvb__lanes; *l != NULL; l++)
        if ((*l)->tick != NULL)
            (*l)->tick(eng);
}
