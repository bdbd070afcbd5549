/* What a peer registered, from the handshake's segment table:
 * kvb__engine_peer_region (peer_region.h) and kvb_engine_peer_regions
 * (engine.h). */
#include "engine/peer_region.h"

#include "engine/engine_int.h"

#include <string.h>

static kvb_status_t lookup(kvb_engine_h eng, kvb__conn_t *c, uint64_t addr, uint64_t *base_p,
                           uint64_t *len_p)
{
    kvb_status_t st = KVB_ERR_BOUNDS;
    pthread_mutex_lock(&eng->seg_mu);
    long i = kvb__segtab_find(&c->segs, addr, 1);
    if (i >= 0) {
        *base_p = c->segs.v[i].addr;
        *len_p = c->segs.v[i].len;
        st = KVB_OK;
    }
    pthread_mutex_unlock(&eng->seg_mu);
    return st;
}

kvb_status_t kvb__engine_peer_region(kvb_engine_h eng, const char *sid, uint64_t addr,
                                     double timeout_s, uint64_t *base_p, uint64_t *len_p)
{
    uint64_t deadline = kvb__now_ns() + (uint64_t)(timeout_s > 0 ? timeout_s * 1e9 : 0);
    kvb__conn_t *c = NULL;
    kvb_status_t st = kvb__session_acquire_by(eng, sid, false, deadline, &c);
    if (st == KVB_OK)
        st = lookup(eng, c, addr, base_p, len_p);
    if (c != NULL)
        kvb__conn_put(c);
    if (st != KVB_ERR_BOUNDS)
        return st;
    /* The peer may have registered more since our handshake: look again. */
    c = NULL;
    st = kvb__session_acquire_by(eng, sid, true, deadline, &c);
    if (st == KVB_OK)
        st = lookup(eng, c, addr, base_p, len_p);
    if (c != NULL)
        kvb__conn_put(c);
    return st;
}

/* Copy t's first cap entries (seg_mu held). */
static void copy_table(const kvb__segtab_t *t, uint64_t *addrs, uint64_t *lens, size_t cap,
                       size_t *count_p)
{
    for (size_t i = 0; i < t->n && i < cap; i++) {
        if (addrs != NULL)
            addrs[i] = t->v[i].addr;
        if (lens != NULL)
            lens[i] = t->v[i].len;
    }
    *count_p = t->n;
}

kvb_status_t kvb_engine_peer_regions(kvb_engine_h eng, const char *sid, double timeout_s,
                                     uint64_t *addrs, uint64_t *lens, size_t cap, size_t *count_p)
{
    if (eng == NULL || sid == NULL || count_p == NULL)
        return KVB_ERR_INVALID;
    *count_p = 0;
    kvb__conn_t *c = NULL;
    if (strcmp(sid, eng->sid) != 0) {
        kvb_status_t st =
            timeout_s > 0 ? kvb__session_acquire_by(eng, sid, false,
                                                    kvb__now_ns() + (uint64_t)(timeout_s * 1e9), &c)
                          : kvb__session_acquire(eng, sid, false, &c);
        if (st != KVB_OK)
            return st;
    }
    pthread_mutex_lock(&eng->seg_mu);
    copy_table(c != NULL ? &c->segs : &eng->segs, addrs, lens, cap, count_p);
    pthread_mutex_unlock(&eng->seg_mu);
    if (c != NULL)
        kvb__conn_put(c);
    return KVB_OK;
}
