/* TokenSpeed 0.1.1 "CachePD" on the connector (issue 26): the dialect's
 * table and what its adapter files share. The codec and planner
 * (cachepd.h) know nothing of the connector; these files put them on it:
 * own.c (this kvbridge rank's layout contract and where its fields live),
 * prefill.c (a TokenSpeed decode's registration and requests, the plan of
 * each chunk, statuses, the table), decode.c (a TokenSpeed prefill's
 * route, registration, requests and statuses). Field by field:
 * docs/tokenspeed-cachepd-fields.md. */
#ifndef KVB_DIALECT_CACHEPD_ADAPTER_H
#define KVB_DIALECT_CACHEPD_ADAPTER_H

#include "dialect/cachepd/cachepd.h"
#include "dialect/dialect.h"

extern const kvb__dialect_t kvb__dialect_cachepd;

/* own.c */
/* This rank's contract: the framework's (params cachepd_contract) laid over
 * kvbridge's buffers (template.c), else TokenSpeed's ordinary recipe
 * (kvb__cpd_contract_ordinary) from its KV args. What the args do not say
 * (the element type when kv_cache_dtype is "auto" or unset, the model's KV
 * head count under GQA replication) comes from hint, a peer's contract of
 * the same model, when it agrees with this rank's item length; else
 * bfloat16 and kv_head_num x TP. KVB_ERR_INVALID with the reason in why
 * when this rank's cache cannot be described (PP, draft layers, state
 * buffers without cachepd_contract, an item length that is no page x
 * heads x head_dim). */
kvb_status_t kvb__cpd_own_contract(const struct kvb_manager *m, const kvb__cpd_contract_t *hint,
                                   kvb__cpd_contract_t *c_p, char *why, size_t wl);
/* dialect->check_manager: a cachepd_contract this rank cannot lay over its
 * buffers (KVB_ERR_INVALID, why). */
kvb_status_t kvb__cpd_check_manager(const struct kvb_manager *m, char *why, size_t wl);
/* The address of page 0 of each field of own (kvb__cpd_copy_t.src_page0):
 * TokenSpeed page t of a field is item t - 1 of its buffer
 * (kvb__cpd_field_homes), page 0 being TokenSpeed's null page.
 * Malloc'ed; NULL with the reason in why. */
uint64_t *kvb__cpd_own_page0(const struct kvb_manager *m, const kvb__cpd_contract_t *own, char *why,
                             size_t wl);
/* This rank's TokenSpeed PUT /route body (dialect->boot_put), malloc'ed;
 * NULL when it cannot be described (logged). */
char *kvb__cpd_own_put(struct kvb_manager *m);
/* This rank's contract (kvb__cpd_own_contract, hint the prefill's) as one
 * slab at *slab_p, although kvbridge's KV buffers are separate allocations:
 * each plane where its buffer is (TokenSpeed's page 0, the null page, one
 * page before the buffer), at its offset from the lowest, and the arena
 * widened to hold them all (resident_block_bytes: a peer never compares
 * it, and TokenSpeed sizes only its own memory by it), so that the
 * contract stays one kvbridge's strict parser takes. A decode registers
 * it (frames 4-5). */
kvb_status_t kvb__cpd_own_slab(const struct kvb_manager *m, const kvb__cpd_contract_t *hint,
                               kvb__cpd_contract_t *c_p, uint64_t *slab_p, char *why, size_t wl);

/* home.c */
/* "layer.<n>.<name>": n and name (spec 5.2); false for another form. */
bool kvb__cpd_field_name(const char *id, uint32_t *layer_p, const char **name_p);
/* The kvbridge buffer of each field of this rank's contract c: its
 * address (ptr[f]) and item bytes (item[f]), arrays of c->nfields.
 * History fields: K of each layer in layer order, then V (MLA: latent_kv),
 * kv_args' KV buffers in order; state fields in (layer, name) order: the
 * state buffers. -1 when every field has one; else the first field no
 * buffer holds (-2: out of memory). */
int64_t kvb__cpd_field_homes(const struct kvb_manager *m, const kvb__cpd_contract_t *c,
                             uint64_t *ptr, uint64_t *item);
/* Items every KV buffer holds (the smallest's), slots every state buffer
 * holds; 0 without buffers. */
uint64_t kvb__cpd_kv_pool(const struct kvb_manager *m);
uint64_t kvb__cpd_state_pool(const struct kvb_manager *m);

/* template.c */
/* params cachepd_contract, parsed and validated as a peer's would be
 * (KVB_ERR_INVALID, why "cachepd_contract: ..."). */
kvb_status_t kvb__cpd_template_parse(const struct kvb_manager *m, kvb__cpd_contract_t *t, char *why,
                                     size_t wl);
/* This rank's contract from it: its groups, specs, field ids, dtypes and
 * partitions; rank-local shapes at this rank's attention TP; one plane per
 * field over its buffer (kvb__cpd_field_homes), one page per parent, each
 * group as many pages as its buffers hold. Refused (KVB_ERR_INVALID,
 * why) unless it has one full-history full_suffix group of page_size
 * pages whose fields are kv_args' KV buffers, state groups (latest
 * snapshot) whose fields are its state buffers, nothing sharded, and each
 * field's payload at this TP is its buffer's item. */
kvb_status_t kvb__cpd_template_contract(const struct kvb_manager *m, kvb__cpd_contract_t *c_p,
                                        char *why, size_t wl);

/* send.c: msg, encoded with status st (its reason in e), to ip:port, or
 * the reason logged (what names the message); msg freed either way. */
kvb_status_t kvb__cpd_send_encoded(struct kvb_manager *m, const char *ip, uint16_t port,
                                   kvb_status_t st, kvb__cpd_msg_t *msg, const kvb__frames_err_t *e,
                                   const char *what);

/* decode.c: the decode side's operations (dialect.h), in the table. */
kvb_status_t kvb__cpd_addr_info(struct kvb_manager *m, const char *body, size_t len, void **priv_p,
                                char *why, size_t wl);
kvb_status_t kvb__cpd_addr_route(struct kvb_manager *m, const void *priv, kvb_plan_route_t *route);
void kvb__cpd_addr_free(void *priv);
kvb_status_t kvb__cpd_send_registration(struct kvb_manager *m, const char *ip, uint16_t port,
                                        bool kvbridge, const void *priv);
kvb_status_t kvb__cpd_send_transfer(struct kvb_manager *m, const kvb__src_t *s, uint64_t room,
                                    const int32_t *idx, size_t n, int64_t aux,
                                    const kvb_receiver_init_t *ex);
void kvb__cpd_transfer_form(const struct kvb_manager *m, const kvb__src_t *s, size_t count,
                            const kvb_receiver_init_t *ex, char *why, size_t len);
kvb_status_t kvb__cpd_status_in(struct kvb_manager *m, const kvb__frame_t *f, size_t n,
                                kvb__status_in_t *out);

#endif
