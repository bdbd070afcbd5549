/* What SGLang's two dialects share (seed 001 = SGLang 0.5.2rc2, and the
 * 2026 dialect of SGLang 0.5.23, which changed the registration and the
 * transfer info and added ABORT/ABORT_ACK, PROTOCOL-SGLANG-2026.md): the
 * 3-frame status, AUX_DATA, and kvbridge's extension frames after the
 * "kvbridge-ext/1" marker (docs/protocol-frames.md). Defined in
 * sglang2025/; the 2026 dialect (sglang2026/) builds on it. */
#ifndef KVB_DIALECT_SGLANG_H
#define KVB_DIALECT_SGLANG_H

#include "dialect/dialect.h"
#include "dialect/sglang2025/frames.h"

extern const kvb__dialect_t kvb__dialect_sglang2025;

/* The 3-frame status (both dialects); send_status_digest: with kv_digest=
 * after the marker (digest NULL: none), for kvbridge decodes only. */
kvb_status_t kvb__sglang_send_status_digest(struct kvb_manager *m, const char *ip, uint16_t port,
                                            uint64_t room, int status, int32_t rank,
                                            const uint8_t *digest, size_t digest_len);
kvb_status_t kvb__sglang_send_status(struct kvb_manager *m, const char *ip, uint16_t port,
                                     uint64_t room, int status, int32_t rank);
kvb_status_t kvb__sglang_decode_status(struct kvb_manager *m, const kvb__frame_t *f, size_t n,
                                       kvb__status_in_t *out);
kvb_status_t kvb__sglang_decode_aux(struct kvb_manager *m, const kvb__frame_t *f, size_t n,
                                    kvb__aux_in_t *out);
kvb_status_t kvb__sglang_send_aux(struct kvb_manager *m, const char *ip, uint16_t port,
                                  const kvb__aux_in_t *a);
/* kvbridge's "kv_lens=" extension of a registration into in (has_pool,
 * pool); false: malformed (reason in *e). */
bool kvb__sglang_kv_pool(const kvb__frame_t *ext, size_t n_ext, size_t n_kv, int64_t item_len,
                         kvb__reg_in_t *in, kvb__frames_err_t *e);
/* "kv_lens=" + this rank's KV buffer lengths, into *f (pointing into
 * *buf_p, caller frees). */
kvb_status_t kvb__sglang_kv_lens_ext(const struct kvb_manager *m, uint8_t **buf_p, kvb__frame_t *f);
/* kvbridge's "kv_layout=<page_size>,<nhd|hnd>" extension of a registration
 * (a kvbridge decode's page size and page order, docs/planner.md) into in
 * (has_layout, page_size, kv_order); absent: has_layout false. false:
 * malformed (reason in *e). */
bool kvb__sglang_kv_layout(const kvb__frame_t *ext, size_t n_ext, kvb__reg_in_t *in,
                           kvb__frames_err_t *e);
/* "kv_layout=" + this rank's page size and order into *f (text in buf, at
 * least KVB__SGLANG_LAYOUT_MAX bytes). Cannot fail. */
#define KVB__SGLANG_LAYOUT_MAX 32
void kvb__sglang_kv_layout_ext(const struct kvb_manager *m, char *buf, kvb__frame_t *f);
/* kvbridge's "kv_digest=<version>" extension of a registration (the
 * highest integrity digest version a kvbridge decode reads,
 * docs/integrity.md "Wire") into in->digest_max; absent: 0 (version 1
 * only). false: malformed (reason in *e). */
bool kvb__sglang_kv_digest(const kvb__frame_t *ext, size_t n_ext, kvb__reg_in_t *in,
                           kvb__frames_err_t *e);
/* "kv_digest=2" into *f when m checks integrity (true), else false. */
bool kvb__sglang_kv_digest_ext(const struct kvb_manager *m, kvb__frame_t *f);
/* transfer_form's rule for both: what needs kvbridge's extensions to a
 * prefill that is not kvbridge: holes in a page mask, and in seed 001
 * (v26 false) also a prefix or state indices. */
void kvb__sglang_needs_ext(const kvb__src_t *s, size_t count, const kvb_receiver_init_t *ex,
                           bool v26, char *why, size_t len);

#endif
