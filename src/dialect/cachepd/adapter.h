/* TokenSpeed 0.1.1 "CachePD" on the connector (issue 26): the dialect's
 * table and what its adapter files share. The codec and planner
 * (cachepd.h) know nothing of the connector; these files put them on it:
 * own.c (this kvbridge rank's layout contract and where its fields live),
 * prefill.c (a TokenSpeed decode's registration and requests, the plan of
 * each chunk, statuses, the table). Field by field:
 * docs/tokenspeed-cachepd-fields.md. */
#ifndef KVB_DIALECT_CACHEPD_ADAPTER_H
#define KVB_DIALECT_CACHEPD_ADAPTER_H

#include "dialect/cachepd/cachepd.h"
#include "dialect/dialect.h"

extern const kvb__dialect_t kvb__dialect_cachepd;

/* own.c */
/* This rank's contract as TokenSpeed's ordinary recipe writes it
 * (kvb__cpd_contract_ordinary) from its KV args. What the args do not say
 * (the element type when kv_cache_dtype is "auto" or unset, the model's KV
 * head count under GQA replication) comes from hint, a peer's contract of
 * the same model, when it agrees with this rank's item length; else
 * bfloat16 and kv_head_num x TP. KVB_ERR_INVALID with the reason in why
 * when this rank's cache cannot be described (PP, draft layers, state
 * buffers, an item length that is no page x heads x head_dim). */
kvb_status_t kvb__cpd_own_contract(const struct kvb_manager *m, const kvb__cpd_contract_t *hint,
                                   kvb__cpd_contract_t *c_p, char *why, size_t wl);
/* The address of page 0 of each field of own (kvb__cpd_copy_t.src_page0):
 * TokenSpeed page t of layer i's K (V, latent) is kvbridge page t - 1 of
 * KV buffer i (layers + i, i), page 0 being TokenSpeed's null page.
 * Malloc'ed; NULL with the reason in why. */
uint64_t *kvb__cpd_own_page0(const struct kvb_manager *m, const kvb__cpd_contract_t *own, char *why,
                             size_t wl);
/* This rank's TokenSpeed PUT /route body (dialect->boot_put), malloc'ed;
 * NULL when it cannot be described (logged). */
char *kvb__cpd_own_put(struct kvb_manager *m);

#endif
