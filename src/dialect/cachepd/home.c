/* Where a field of this rank's CachePD contract lives in kvbridge's buffers
 * (adapter.h, kvb__cpd_field_home). One rule for both ways a contract is
 * made (the ordinary recipe's and a framework-given one's): history fields
 * are K then V of each layer (MLA: latent_kv) in layer order, as kv_args
 * lists its buffers; state fields are the state buffers in (layer, name)
 * order. A field id is "layer.<n>.<name>" (spec 5.2). */
#include "dialect/cachepd/adapter.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

bool kvb__cpd_field_name(const char *id, uint32_t *layer_p, const char **name_p)
{
    unsigned layer;
    int used = 0;
    if (sscanf(id, "layer.%u.%n", &layer, &used) != 1 || used == 0 || id[used] == '\0')
        return false;
    *layer_p = layer;
    *name_p = id + used;
    return true;
}

static bool is_state(const kvb__cpd_contract_t *c, uint32_t f)
{
    return c->specs[c->fields[f].spec].family == KVB__CPD_STATE;
}

/* Field g sorts before field f in its family's buffer order. */
static bool before(const kvb__cpd_contract_t *c, uint32_t g, uint32_t f)
{
    uint32_t lf, lg;
    const char *nf, *ng;
    if (!kvb__cpd_field_name(c->fields[f].field_id, &lf, &nf) ||
        !kvb__cpd_field_name(c->fields[g].field_id, &lg, &ng))
        return false;
    if (is_state(c, f)) /* (layer, name) */
        return lg < lf || (lg == lf && strcmp(ng, nf) < 0);
    return strcmp(ng, nf) == 0 && lg < lf; /* same kind, earlier layer */
}

/* Fields of f's family that sort before it, and (history) how many K
 * fields there are (V buffers follow them). */
static uint32_t rank_of(const kvb__cpd_contract_t *c, uint32_t f, uint32_t *nk_p)
{
    uint32_t rank = 0, nk = 0, lg;
    const char *ng;
    for (uint32_t g = 0; g < c->nfields; g++) {
        if (g != f && is_state(c, g) == is_state(c, f) && before(c, g, f))
            rank++;
        if (!is_state(c, g) && kvb__cpd_field_name(c->fields[g].field_id, &lg, &ng) &&
            strcmp(ng, "k") == 0)
            nk++;
    }
    *nk_p = nk;
    return rank;
}

bool kvb__cpd_field_home(const struct kvb_manager *m, const kvb__cpd_contract_t *c, uint32_t f,
                         uint64_t *ptr_p, uint64_t *item_p)
{
    uint32_t layer, nk, rank = rank_of(c, f, &nk);
    const char *name;
    if (!kvb__cpd_field_name(c->fields[f].field_id, &layer, &name))
        return false;
    if (is_state(c, f)) {
        if (rank >= m->args.num_state)
            return false;
        *ptr_p = m->state_ptrs[rank];
        *item_p = m->state_items[rank];
        return true;
    }
    uint64_t b = rank;
    if (m->p.is_mla) {
        if (strcmp(name, "latent_kv") != 0)
            return false;
    } else if (strcmp(name, "v") == 0) {
        b += nk;
    } else if (strcmp(name, "k") != 0) {
        return false;
    }
    if (b >= m->args.num_kv)
        return false;
    *ptr_p = m->kv_ptrs[b];
    *item_p = m->args.kv_item_len;
    return true;
}

uint64_t kvb__cpd_kv_pool(const struct kvb_manager *m)
{
    uint64_t pool = UINT64_MAX;
    for (uint32_t b = 0; b < m->args.num_kv && m->args.kv_item_len > 0; b++)
        pool =
            m->kv_lens[b] / m->args.kv_item_len < pool ? m->kv_lens[b] / m->args.kv_item_len : pool;
    return pool == UINT64_MAX ? 0 : pool;
}

uint64_t kvb__cpd_state_pool(const struct kvb_manager *m)
{
    uint64_t pool = UINT64_MAX;
    for (uint32_t i = 0; i < m->args.num_state; i++) {
        uint64_t n = m->state_items[i] > 0 ? m->state_lens[i] / m->state_items[i] : 0;
        pool = n < pool ? n : pool;
    }
    return pool == UINT64_MAX ? 0 : pool;
}
