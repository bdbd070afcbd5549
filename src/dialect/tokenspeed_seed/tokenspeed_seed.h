/* TokenSpeed's seed-004 dialect (PROTOCOL-TOKENSPEED.md;
 * docs/tokenspeed-fields.md): prefill side and the dialect's table in
 * prefill.c, decode side in decode.c (below it). */
#ifndef KVB_DIALECT_TOKENSPEED_SEED_H
#define KVB_DIALECT_TOKENSPEED_SEED_H

#include "dialect/dialect.h"
#include "dialect/tokenspeed_seed/frames.h"

extern const kvb__dialect_t kvb__dialect_tokenspeed_seed;

/* prefill.c */
kvb__dmsg_t kvb__ts_classify(struct kvb_manager *m, const kvb__frame_t *f, size_t n);
kvb_status_t kvb__ts_decode_registration(struct kvb_manager *m, const kvb__frame_t *f, size_t n,
                                         kvb__reg_in_t *in);
kvb_status_t kvb__ts_take_transfer(struct kvb_manager *m, const kvb__frame_t *f, size_t n,
                                   kvb__xfer_in_t *out);
kvb_status_t kvb__ts_send_status(struct kvb_manager *m, const char *ip, uint16_t port,
                                 uint64_t room, int status, int32_t rank);
void kvb__ts_job_plan(struct kvb_manager *m, kvb__reg_t *g, const kvb__dst_t *d,
                      const kvb__chunk_t *c, kvb_plan_strided_t *out, kvb_status_t *st_p, char *why,
                      size_t wl);
void kvb__ts_plan_destroy(void *plan); /* NULL-safe */

/* decode.c */
/* The TokenSpeed buffer_kind (kvb__ts_kind_t) of this rank's KV buffer b:
 * target K of layers 0..L-1, target V, then the draft model's K and V
 * (params draft_layers; spec 8.5: the draft pool's buffers are appended).
 * MLA: target latents, then draft latents (both "_k"). */
int kvb__ts_buffer_kind(const struct kvb_manager *m, uint64_t b);
kvb_status_t kvb__ts_send_registration(struct kvb_manager *m, const char *ip, uint16_t port,
                                       bool kvbridge, const void *priv);
kvb_status_t kvb__ts_send_transfer(struct kvb_manager *m, const kvb__src_t *s, uint64_t room,
                                   const int32_t *idx, size_t n, int64_t aux,
                                   const kvb_receiver_init_t *ex);
kvb_status_t kvb__ts_decode_status(struct kvb_manager *m, const kvb__frame_t *f, size_t n,
                                   kvb__status_in_t *out);
void kvb__ts_transfer_form(const struct kvb_manager *m, const kvb__src_t *s, size_t count,
                           const kvb_receiver_init_t *ex, char *why, size_t len);

#endif
