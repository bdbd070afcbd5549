/* Where each field of this rank's CachePD contract lives in kvbridge's
 * buffers (adapter.h, kvb__cpd_field_homes). One rule for both ways a
 * contract is made (the ordinary recipe's and a framework-given one's):
 * history fields are K then V of each layer (MLA: latent_kv) in layer
 * order, as kv_args lists its buffers; state fields are the state buffers
 * in (layer, name) order. A field id is "layer.<n>.<name>" (spec 5.2). */
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

/* A field's id, parsed once. */
typedef struct fkey {
    bool ok, state;
    uint32_t layer;
    const char *name;
} fkey_t;

/* g sorts before f in their family's buffer order. */
static bool before(const fkey_t *g, const fkey_t *f)
{
    if (f->state) /* (layer, name) */
        return g->layer < f->layer || (g->layer == f->layer && strcmp(g->name, f->name) < 0);
    return strcmp(g->name, f->name) == 0 && g->layer < f->layer; /* same kind, earlier layer */
}

/* Field f's buffer from its rank in its family (nk: the K fields, which
 * the V buffers follow). */
static bool home_of(const struct kvb_manager *m, const fkey_t *f, uint32_t rank, uint32_t nk,
                    uint64_t *ptr_p, uint64_t *item_p)
{
    if (f->state) {
        if (rank >= m->args.num_state)
            return false;
        *ptr_p = m->state_ptrs[rank];
        *item_p = m->state_items[rank];
        return true;
    }
    uint64_t b = rank;
    if (m->p.is_mla) {
        if (strcmp(f->name, "latent_kv") != 0)
            return false;
    } else if (strcmp(f->name, "v") == 0) {
        b += nk;
    } else if (strcmp(f->name, "k") != 0) {
        return false;
    }
    if (b >= m->args.num_kv)
        return false;
    *ptr_p = m->kv_ptrs[b];
    *item_p = m->args.kv_item_len;
    return true;
}

int64_t kvb__cpd_field_homes(const struct kvb_manager *m, const kvb__cpd_contract_t *c,
                             uint64_t *ptr, uint64_t *item)
{
    fkey_t *k = calloc(c->nfields ? c->nfields : 1, sizeof(*k));
    uint32_t nk = 0;
    if (k == NULL)
        return -2;
    for (uint32_t f = 0; f < c->nfields; f++) {
        k[f].ok = kvb__cpd_field_name(c->fields[f].field_id, &k[f].layer, &k[f].name);
        k[f].state = c->specs[c->fields[f].spec].family == KVB__CPD_STATE;
        nk += k[f].ok && !k[f].state && strcmp(k[f].name, "k") == 0;
    }
    int64_t bad = -1;
    for (uint32_t f = 0; f < c->nfields && bad < 0; f++) {
        uint32_t rank = 0;
        for (uint32_t g = 0; k[f].ok && g < c->nfields; g++) /* n^2: a few thousand fields */
            rank += g != f && k[g].ok && k[g].state == k[f].state && before(&k[g], &k[f]);
        if (!k[f].ok || !home_of(m, &k[f], rank, nk, &ptr[f], &item[f]))
            bad = f;
    }
    free(k);
    return bad;
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
