/* SGLang 0.5.23's KV checksum (--disaggregation-enable-kv-checksum),
 * reproduced over host pages: SGLang's prefill scheduler fills a row of its
 * kv_checksum aux buffer ([N, 8] u64: digest, layout signature) before the
 * last chunk, the connector moves it like every aux buffer, and its decode
 * scheduler recomputes the digest over the landed pages. The digest is
 * zlib's Adler-32 of the concatenation, for each KV buffer in registration
 * order, of the request's items in page-list order (the GPU kernel's
 * combine is Adler-32's own, so its blockwise reduction equals the serial
 * sum). docs/integrity.md, "With SGLang's own checksum". */
#ifndef KVB_DIALECT_SGLANG2026_KV_CHECKSUM_H
#define KVB_DIALECT_SGLANG2026_KV_CHECKSUM_H

#include "dialect/dialect.h"

/* The Adler-32 of items pages[n] of item_len bytes in each of kv_ptrs[n_kv]
 * (host memory the caller keeps still; pages already checked against the
 * pool). Pure: any thread. */
uint32_t kvb__sgl26_adler_items(const uint64_t *kv_ptrs, size_t n_kv, uint64_t item_len,
                                const int32_t *pages, size_t n);
/* dialect->check_manager: sglang_kv_checksum_aux names an aux buffer whose
 * items hold a digest and a signature (16 bytes at least). */
kvb_status_t kvb__sgl26_check_manager(const struct kvb_manager *m, char *why, size_t wl);
/* dialect->check_own_digest: the row of aux buffer sglang_kv_checksum_aux at
 * the room's slot against the room's pages (no lock held). */
kvb__own_result_t kvb__sgl26_check_own_digest(struct kvb_manager *m, const kvb__own_digest_in_t *in,
                                              char *why, size_t wl);

#endif
