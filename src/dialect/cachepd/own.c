/* A kvbridge rank's own CachePD layout (adapter.h). kvbridge keeps one
 * buffer per layer's K and V (or latent), pages of kv_item_len bytes,
 * token-major; TokenSpeed's ordinary recipe describes the same bytes as one
 * plane per buffer with one page per parent, so the contract is
 * kvb__cpd_contract_ordinary's and each plane maps onto one kvbridge
 * buffer, shifted by TokenSpeed's null page. */
#include "dialect/cachepd/adapter.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The element type kv_cache_dtype names (SGLang's and TokenSpeed's
 * spellings); false for "auto" and unknown names. fp8 caches travel as
 * uint8 (TokenSpeed's ordinary recipe stores them so). */
static bool dtype_named(const char *s, kvb__cpd_dtype_t *dt)
{
    static const struct {
        const char *name;
        kvb__cpd_dtype_t dt;
    } names[] = {{"bfloat16", KVB__CPD_BFLOAT16}, {"bf16", KVB__CPD_BFLOAT16},
                 {"float16", KVB__CPD_FLOAT16},   {"fp16", KVB__CPD_FLOAT16},
                 {"half", KVB__CPD_FLOAT16},      {"float32", KVB__CPD_FLOAT32},
                 {"fp32", KVB__CPD_FLOAT32},      {"uint8", KVB__CPD_UINT8}};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        if (strcmp(s, names[i].name) == 0) {
            *dt = names[i].dt;
            return true;
        }
    if (strncmp(s, "fp8", 3) == 0 || strncmp(s, "float8", 6) == 0) {
        *dt = KVB__CPD_UINT8;
        return true;
    }
    return false;
}

/* The first K (or latent) field of a peer's contract: its dtype and, for
 * MHA, the model's KV head count (the partition's global extent). */
static const kvb__cpd_field_t *hint_field(const kvb__cpd_contract_t *h, bool mla)
{
    int32_t f = h == NULL ? -1 : kvb__cpd_field_index(h, mla ? "layer.0.latent_kv" : "layer.0.k");
    return f < 0 ? NULL : &h->fields[f];
}

static bool own_dtype(const struct kvb_manager *m, const kvb__cpd_field_t *hf, kvb__cpd_dtype_t *dt)
{
    if (dtype_named(m->kv_dtype, dt))
        return true; /* said by the framework: a peer that differs is refused by the peer check */
    *dt = hf != NULL ? hf->dtype : KVB__CPD_BFLOAT16;
    return false;
}

/* Why this rank's cache cannot be described in a CachePD contract
 * (false), else true. */
static bool describable(const struct kvb_manager *m, char *why, size_t wl)
{
    if (m->p.pp_size > 1)
        snprintf(why, wl, "this prefill is PP stage %d of %d: kvbridge serves CachePD from PP 1",
                 m->p.pp_rank, m->p.pp_size);
    else if (m->p.draft_layers > 0)
        snprintf(why, wl, "kvbridge does not describe draft layers (%u) in a CachePD contract",
                 m->p.draft_layers);
    else if (m->args.num_state > 0 && m->cachepd_contract == NULL)
        snprintf(why, wl,
                 "%u state buffers: a hybrid model's CachePD contract names its layers, which "
                 "kv_args cannot; give TokenSpeed's contract of the model (params "
                 "cachepd_contract)",
                 m->args.num_state);
    else if (m->args.num_kv == 0 || (!m->p.is_mla && m->args.num_kv % 2 != 0))
        snprintf(why, wl, "%u KV buffers are not K and V per layer", m->args.num_kv);
    else if (m->args.kv_item_len == 0 || m->args.page_size == 0)
        snprintf(why, wl, "KV item length and page size must be set");
    else
        return true;
    return false;
}

kvb_status_t kvb__cpd_own_contract(const struct kvb_manager *m, const kvb__cpd_contract_t *hint,
                                   kvb__cpd_contract_t *c_p, char *why, size_t wl)
{
    bool mla = m->p.is_mla != 0;
    uint32_t tp = (uint32_t)m->p.attn_tp_size, local = mla ? 1 : m->args.kv_head_num;
    if (!describable(m, why, wl))
        return KVB_ERR_INVALID;
    if (m->cachepd_contract != NULL)
        return kvb__cpd_template_contract(m, c_p, why, wl);
    const kvb__cpd_field_t *hf = hint_field(hint, mla);
    kvb__cpd_dtype_t dt;
    bool named = own_dtype(m, hf, &dt);
    uint64_t P = m->args.page_size, eb = kvb__cpd_dtype_bytes(dt), item = m->args.kv_item_len;
    uint64_t row = P * (local ? local : 1) * eb;
    if (local == 0 || item % row != 0) {
        snprintf(why, wl,
                 "this rank's KV item of %llu bytes is not %llu tokens x %u heads x a head of %s "
                 "(%s)",
                 (unsigned long long)item, (unsigned long long)P, local, kvb__cpd_dtype_name(dt),
                 named ? "kv_cache_dtype" : "the decode's dtype");
        return KVB_ERR_INVALID;
    }
    /* Under GQA replication (kv heads < TP) kv_head_num x TP overstates the
     * model's heads; a peer's global extent that gives our local count wins. */
    uint32_t heads = local * tp;
    if (!mla && hf != NULL && hf->partition >= 0) {
        uint64_t g = hint->parts[hf->partition].global_extent;
        uint64_t per = g / tp ? g / tp : 1;
        if (g >= 1 && g <= UINT32_MAX && per == local)
            heads = (uint32_t)g;
    }
    kvb__cpd_ordinary_t o = {mla,   mla ? m->args.num_kv : m->args.num_kv / 2,
                             heads, (uint32_t)(item / row),
                             tp,    m->args.page_size,
                             dt,    kvb__cpd_kv_pool(m),
                             0};
    kvb__frames_err_t e;
    kvb_status_t st = kvb__cpd_contract_ordinary(&o, &e, c_p);
    if (st == KVB_ERR_INVALID)
        snprintf(why, wl, "%s", e.reason);
    return st;
}

kvb_status_t kvb__cpd_check_manager(const struct kvb_manager *m, char *why, size_t wl)
{
    kvb__cpd_contract_t c;
    memset(&c, 0, sizeof(c));
    kvb_status_t st =
        m->cachepd_contract != NULL ? kvb__cpd_template_contract(m, &c, why, wl) : KVB_OK;
    kvb__cpd_contract_free(&c);
    return st;
}

uint64_t *kvb__cpd_own_page0(const struct kvb_manager *m, const kvb__cpd_contract_t *own, char *why,
                             size_t wl)
{
    size_t n = own->nfields ? own->nfields : 1;
    uint64_t *a = calloc(n, sizeof(*a)), *item = calloc(n, sizeof(*item));
    int64_t bad = a != NULL && item != NULL ? kvb__cpd_field_homes(m, own, a, item) : -2;
    for (uint32_t f = 0; bad == -1 && f < own->nfields; f++) {
        if (own->fields[f].page_stride != item[f] || a[f] < item[f])
            bad = f;
        else
            a[f] -= item[f]; /* TokenSpeed's page 0 is the null page */
    }
    free(item);
    if (bad == -1)
        return a;
    if (bad == -2)
        snprintf(why, wl, "out of memory");
    else
        snprintf(why, wl, "field %s of this rank's contract is no buffer of it",
                 own->fields[bad].field_id);
    free(a);
    return NULL;
}

/* TokenSpeed's PUT /route body for this rank (spec 3.1): its full contract
 * (PP 1: the wire contract is the rank's own), one stage, the global rank
 * dp x tp + tp_rank, so that a TokenSpeed 0.1.1 decode finds its contract
 * through kvbridge's bootstrap server or TokenSpeed's. NULL (logged once)
 * when this rank's cache is not one TokenSpeed's ordinary recipe
 * describes. */
char *kvb__cpd_own_put(struct kvb_manager *m)
{
    kvb__cpd_put_t p;
    char why[256], *body = NULL;
    size_t len;
    memset(&p, 0, sizeof(p));
    if (kvb__cpd_own_contract(m, NULL, &p.contract, why, sizeof(why)) != KVB_OK) {
        KVB_LOGI("manager %s: not registered for TokenSpeed 0.1.1 (CachePD) decodes: %s",
                 m->endpoint, why);
        return NULL;
    }
    uint32_t tp = (uint32_t)m->p.attn_tp_size, dp = (uint32_t)m->p.attn_dp_size;
    p.world_size = tp * dp;
    p.dp_size = dp;
    p.pp_size = 1;
    p.engine_rank = (uint32_t)m->p.attn_dp_rank * tp + (uint32_t)m->p.attn_tp_rank;
    snprintf(p.rank_ip, sizeof(p.rank_ip), "%s", m->host);
    p.rank_port = m->port;
    if (kvb__cpd_stages_single(&p.contract, &p.stages) != KVB_OK ||
        kvb__cpd_put_encode(&p, &body, &len) != KVB_OK)
        body = NULL;
    kvb__cpd_put_free(&p);
    return body;
}

/* Each plane at its buffer's offset from the lowest; the arena per parent
 * widened (resident_block_bytes) when the planes reach past the recipe's. */
static bool place_planes(const struct kvb_manager *m, kvb__cpd_contract_t *c, uint64_t *slab_p,
                         char *why, size_t wl)
{
    uint64_t slab = UINT64_MAX, span = 0, parents = c->num_lcm_blocks + 1, end;
    uint64_t *base = calloc(c->nplanes + 1, sizeof(*base)); /* plane -> its page 0 */
    uint64_t *page0 = kvb__cpd_own_page0(m, c, why, wl);    /* field -> its page 0 */
    bool ok = base != NULL && page0 != NULL;
    if (base == NULL)
        snprintf(why, wl, "out of memory");
    for (uint32_t f = 0; ok && f < c->nfields; f++)
        base[c->fields[f].plane] = page0[f]; /* one item before its buffer */
    for (uint32_t i = 0; ok && i < c->nplanes; i++) {
        if ((ok = base[i] != 0) == false)
            snprintf(why, wl, "plane %s of this rank's contract is no buffer of it",
                     c->planes[i].plane_id);
        slab = base[i] < slab ? base[i] : slab;
    }
    for (uint32_t i = 0; ok && i < c->nplanes; i++) {
        c->planes[i].arena_offset = base[i] - slab;
        end = c->planes[i].arena_offset + parents * c->planes[i].bytes_per_lcm;
        span = end > span ? end : span; /* no overflow: the planes are this process's memory */
    }
    free(base);
    free(page0);
    if (!ok)
        return false;
    if (span > parents * c->lcm_block_bytes)
        c->resident_block_bytes = (int64_t)((span + parents - 1) / parents);
    *slab_p = slab;
    return true;
}

kvb_status_t kvb__cpd_own_slab(const struct kvb_manager *m, const kvb__cpd_contract_t *hint,
                               kvb__cpd_contract_t *c_p, uint64_t *slab_p, char *why, size_t wl)
{
    kvb__cpd_contract_t own;
    kvb__frames_err_t e;
    char *json = NULL;
    size_t len = 0;
    kvb_status_t st = kvb__cpd_own_contract(m, hint, &own, why, wl);
    if (st != KVB_OK)
        return st;
    st = place_planes(m, &own, slab_p, why, wl) ? kvb__cpd_contract_encode(&own, &json, &len)
                                                : KVB_ERR_INVALID;
    kvb__cpd_contract_free(&own);
    if (st == KVB_OK &&
        (st = kvb__cpd_contract_parse((const uint8_t *)json, len, &e, c_p)) != KVB_OK)
        snprintf(why, wl, "%s", e.reason); /* re-checked as a peer's: every page in its plane */
    free(json);
    return st;
}
