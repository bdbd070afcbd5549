/* A kvbridge rank's CachePD contract from the one its framework gave
 * (params cachepd_contract; adapter.h). A TokenSpeed peer accepts a
 * contract only with its model's exact groups, field ids, dtypes, global
 * shapes and partitions (spec 7.1), which kv_args cannot say for a hybrid
 * model (which layers are linear attention, what a state slot holds). So
 * the framework hands TokenSpeed's description of its model (at any TP)
 * and kvbridge keeps its semantics, re-deriving what is this rank's: the
 * rank-local shapes at its attention TP, and the geometry, one plane per
 * field over the kvbridge buffer that holds it (home.c), one page per
 * parent. The plan has as many parents as the larger of the KV page and
 * state slot pools, so a plane may span more than its buffer; but each
 * group's page count is its own pool's (TokenSpeed does not tie the two,
 * spec 5.6), so no page a manifest may name lies outside a buffer. */
#include "dialect/cachepd/adapter.h"
#include "dialect/cachepd/cpd_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

kvb_status_t kvb__cpd_template_parse(const struct kvb_manager *m, kvb__cpd_contract_t *t, char *why,
                                     size_t wl)
{
    kvb__frames_err_t e;
    const char *s = m->cachepd_contract;
    kvb_status_t st = kvb__cpd_contract_parse((const uint8_t *)s, strlen(s), &e, t);
    if (st == KVB_ERR_PROTO)
        snprintf(why, wl, "cachepd_contract: %s", e.reason);
    return st == KVB_ERR_PROTO ? KVB_ERR_INVALID : st;
}

/* One history group as kvbridge's KV buffers hold it (every layer's pages,
 * page_size tokens each), the rest state groups of one slot per request. */
static bool spec_ok(const struct kvb_manager *m, const kvb__cpd_spec_t *sp, char *why, size_t wl)
{
    if (sp->shard_count != 1)
        snprintf(why, wl,
                 "cachepd_contract: group '%s' is sharded (shard_count %u); kvbridge "
                 "holds whole groups",
                 sp->group_id, sp->shard_count);
    else if (sp->family == KVB__CPD_HISTORY &&
             (sp->retention != KVB__CPD_FULL_HISTORY || sp->policy != KVB__CPD_FULL_SUFFIX))
        snprintf(why, wl,
                 "cachepd_contract: group '%s': kvbridge's KV buffers hold full-history "
                 "full_suffix groups only (no sliding window)",
                 sp->group_id);
    else if (sp->family == KVB__CPD_HISTORY && sp->granularity != m->args.page_size)
        snprintf(why, wl,
                 "cachepd_contract: group '%s' has pages of %llu tokens; kv_args' "
                 "page_size is %u",
                 sp->group_id, (unsigned long long)sp->granularity, m->args.page_size);
    else if (sp->family == KVB__CPD_STATE && sp->policy == KVB__CPD_FULL_SUFFIX)
        snprintf(why, wl,
                 "cachepd_contract: state group '%s' is full_suffix; kvbridge holds one "
                 "state slot per request (latest_snapshot)",
                 sp->group_id);
    else
        return true;
    return false;
}

/* Groups as kvbridge holds them, and each buffer of kv_args described once:
 * MHA K and V of the same layers, or MLA latents; as many state fields as
 * state buffers. */
static bool groups_ok(const struct kvb_manager *m, const kvb__cpd_contract_t *t, char *why,
                      size_t wl)
{
    uint32_t hist = 0, nstate = 0, nk = 0, nv = 0, nlat = 0, layer;
    const char *name;
    for (uint32_t s = 0; s < t->nspecs; s++) {
        if (!spec_ok(m, &t->specs[s], why, wl))
            return false;
        if (t->specs[s].nfields == 0) { /* a manifest would name blocks of nothing */
            snprintf(why, wl, "cachepd_contract: group '%s' has no fields", t->specs[s].group_id);
            return false;
        }
        hist += t->specs[s].family == KVB__CPD_HISTORY;
    }
    for (uint32_t f = 0; f < t->nfields; f++) {
        if (!kvb__cpd_field_name(t->fields[f].field_id, &layer, &name)) {
            snprintf(why, wl, "cachepd_contract: field '%s' is not layer.<n>.<name>",
                     t->fields[f].field_id);
            return false;
        }
        bool state = t->specs[t->fields[f].spec].family == KVB__CPD_STATE;
        nstate += state;
        nk += !state && strcmp(name, "k") == 0;
        nv += !state && strcmp(name, "v") == 0;
        nlat += !state && strcmp(name, "latent_kv") == 0;
    }
    bool kv = m->p.is_mla ? nlat == m->args.num_kv && nlat == t->nfields - nstate
                          : nk == nv && nk + nv == m->args.num_kv && nk + nv == t->nfields - nstate;
    if (hist != 1)
        snprintf(why, wl, "cachepd_contract has %u history groups; kvbridge's KV buffers form one",
                 hist);
    else if (t->prefix_granularity % m->args.page_size != 0)
        snprintf(why, wl,
                 "cachepd_contract: prefix_granularity %llu is not whole pages of %u "
                 "tokens",
                 (unsigned long long)t->prefix_granularity, m->args.page_size);
    else if (!kv)
        snprintf(why, wl,
                 "cachepd_contract's history fields (%u k, %u v, %u latent_kv, no "
                 "others) are not this rank's %u KV buffers (%s)",
                 nk, nv, nlat, m->args.num_kv,
                 m->p.is_mla ? "MLA: one latent_kv per layer" : "K and V per layer");
    else if (nstate != m->args.num_state)
        snprintf(why, wl, "cachepd_contract names %u state fields; kv_args has %u state buffers",
                 nstate, m->args.num_state);
    else
        return true;
    return false;
}

/* Each partitioned field's extent at this rank's attention TP: the global
 * extent over min(TP, extent) shards (replicated beyond, as TokenSpeed's
 * max(heads // tp, 1)). */
static bool local_shapes(const struct kvb_manager *m, kvb__cpd_contract_t *t, char *why, size_t wl)
{
    uint64_t tp = (uint64_t)m->p.attn_tp_size;
    for (uint32_t i = 0; i < t->nparts; i++) {
        const kvb__cpd_partition_t *p = &t->parts[i];
        uint64_t g = p->global_extent, n = g < tp ? g : tp;
        bool even = n >= 1 && g % n == 0 && tp % n == 0;
        for (uint32_t k = 0; even && k < p->nparts; k++)
            even = p->parts[k] % n == 0;
        if (!even) {
            snprintf(why, wl,
                     "cachepd_contract: field '%s' (global extent %llu) cannot be split "
                     "over attention TP %llu",
                     p->field_id, (unsigned long long)g, (unsigned long long)tp);
            return false;
        }
        t->fields[p->field].shape[p->axis] = g / n;
    }
    return true;
}

/* Parents of the plan: the larger pool (KV pages, state slots). */
static uint64_t pool_of(const struct kvb_manager *m)
{
    uint64_t kv = kvb__cpd_kv_pool(m), st = kvb__cpd_state_pool(m);
    return kv > st ? kv : st;
}

/* Field f's plane: its kvbridge buffer (item bytes a page); its payload
 * at this rank's shape must be that item. */
static bool place_field(const struct kvb_manager *m, kvb__cpd_contract_t *t, uint32_t f,
                        uint64_t item, uint64_t *off_p, char *why, size_t wl)
{
    kvb__cpd_field_t *fd = &t->fields[f];
    uint64_t payload = kvb__cpd_dtype_bytes(fd->dtype), span;
    bool sized = true;
    for (uint32_t d = 0; d < fd->ndim; d++)
        sized = sized && kvb__mul_u64(payload, fd->shape[d], &payload);
    if (!sized || payload != item) {
        snprintf(why, wl,
                 "cachepd_contract: field '%s' holds %llu bytes a page at attention TP %d; its "
                 "kvbridge buffer's item is %llu",
                 fd->field_id, (unsigned long long)(sized ? payload : 0), m->p.attn_tp_size,
                 (unsigned long long)item);
        return false;
    }
    char id[32];
    snprintf(id, sizeof(id), "buffer.%u", f);
    kvb__cpd_plane_t *pl = &t->planes[f];
    free(fd->plane_id);
    fd->plane_id = strdup(id);
    pl->plane_id = strdup(id);
    pl->bytes_per_lcm = item;
    pl->arena_offset = *off_p;
    fd->field_offset = 0;
    fd->page_stride = item;
    if (fd->plane_id == NULL || pl->plane_id == NULL ||
        !kvb__mul_u64(t->num_lcm_blocks + 1, item, &span) || !kvb__add_u64(*off_p, span, off_p)) {
        snprintf(why, wl, "cachepd_contract: out of memory or arena overflow at field '%s'",
                 fd->field_id);
        return false;
    }
    return true;
}

/* Every field's buffer (its item bytes into item[]), or why not. */
static bool homes(const struct kvb_manager *m, const kvb__cpd_contract_t *t, uint64_t *item,
                  char *why, size_t wl)
{
    uint64_t *ptr = calloc(t->nfields ? t->nfields : 1, sizeof(*ptr));
    int64_t bad = ptr != NULL ? kvb__cpd_field_homes(m, t, ptr, item) : -2;
    free(ptr);
    if (bad == -2)
        snprintf(why, wl, "out of memory");
    else if (bad >= 0)
        snprintf(why, wl, "cachepd_contract: field '%s' is held by no buffer of kv_args",
                 t->fields[bad].field_id);
    return bad == -1;
}

/* This rank's geometry in t: planes, strides, page counts. */
static bool rebind(const struct kvb_manager *m, kvb__cpd_contract_t *t, char *why, size_t wl)
{
    uint64_t pool = pool_of(m), off = 0, lcm = 0;
    uint64_t *item = calloc(t->nfields ? t->nfields : 1, sizeof(*item));
    bool ok = item != NULL && homes(m, t, item, why, wl);
    if (item == NULL)
        snprintf(why, wl, "out of memory");
    else if (ok && (pool == 0 || pool >= (1ull << 31))) {
        snprintf(why, wl, "a pool of %llu pages cannot be described", (unsigned long long)pool);
        ok = false;
    }
    for (uint32_t i = 0; ok && i < t->nplanes; i++)
        free(t->planes[i].plane_id);
    if (ok) {
        free(t->planes);
        t->nplanes = 0;
        ok = (t->planes = calloc(t->nfields, sizeof(*t->planes))) != NULL;
        t->nplanes = ok ? t->nfields : 0;
        t->num_lcm_blocks = pool;
        t->resident_block_bytes = -1;
    }
    for (uint32_t f = 0; ok && f < t->nfields; f++) {
        ok = place_field(m, t, f, item[f], &off, why, wl);
        lcm += item[f]; /* no overflow: off summed more */
    }
    for (uint32_t s = 0; ok && s < t->nspecs; s++) { /* each group only its buffers' items */
        bool state = t->specs[s].family == KVB__CPD_STATE;
        t->groups[t->specs[s].group].blocks_per_lcm = 1;
        t->groups[t->specs[s].group].page_count =
            (state ? kvb__cpd_state_pool(m) : kvb__cpd_kv_pool(m)) + 1;
    }
    t->lcm_block_bytes = lcm;
    free(item);
    return ok;
}

kvb_status_t kvb__cpd_template_contract(const struct kvb_manager *m, kvb__cpd_contract_t *c_p,
                                        char *why, size_t wl)
{
    kvb__cpd_contract_t t;
    kvb__frames_err_t e;
    char *json = NULL;
    size_t len = 0;
    memset(&t, 0, sizeof(t));
    kvb_status_t st = kvb__cpd_template_parse(m, &t, why, wl);
    if (st == KVB_OK &&
        !(groups_ok(m, &t, why, wl) && local_shapes(m, &t, why, wl) && rebind(m, &t, why, wl)))
        st = KVB_ERR_INVALID;
    if (st == KVB_OK)
        st = kvb__cpd_contract_encode(&t, &json, &len);
    kvb__cpd_contract_free(&t);
    if (st == KVB_OK &&
        (st = kvb__cpd_contract_parse((const uint8_t *)json, len, &e, c_p)) != KVB_OK)
        snprintf(why, wl, "cachepd_contract laid over this rank's buffers: %s", e.reason);
    free(json);
    return st == KVB_ERR_PROTO ? KVB_ERR_INVALID : st;
}
