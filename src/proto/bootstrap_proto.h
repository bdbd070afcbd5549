/* Bootstrap protocol, HTTP-free: validation of PUT /route bodies and GET /route
 * queries, serialisation of registrations, parsing of the server's answers.
 * Every input is untrusted bytes. Pure functions (no I/O, no global state):
 * safe from any thread. Not part of the public API. */
#ifndef KVB_PROTO_BOOTSTRAP_H
#define KVB_PROTO_BOOTSTRAP_H

#include "core/core.h"

#include <kvbridge/bootstrap.h>
#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Bounds on accepted values. Sizes up to 65536, ranks below their size, ports
 * 1..65535, at most 4096 entries per layout list. */
#define KVB__BOOT_MAX_SIZE 65536
#define KVB__BOOT_MAX_LENS 4096
/* Reason buffers: one line, never longer than this (including the NUL). */
#define KVB__BOOT_REASON_MAX 160

/* The layout keys a registration may carry (TokenSpeed's and kvbridge's). */
#define KVB__BOOT_KEY_KV_ITEM_LENS "kv_item_lens"
#define KVB__BOOT_KEY_KV_UNIT_LENS "kv_unit_lens"
#define KVB__BOOT_KEY_STATE_ITEM_LENS "state_item_lens"
#define KVB__BOOT_KEY_STATE_UNIT_LENS "state_unit_lens"
#define KVB__BOOT_KEY_MLA_L1_5 "enable_mla_l1_5_cache"
#define KVB__BOOT_KEY_LAYOUT "kvbridge_layout"

/* The texts the seeds answer with. */
#define KVB__BOOT_MSG_MISSING "Missing inputs for bootstrap server."
#define KVB__BOOT_MSG_NOT_FOUND "Bootstrap info not Found"
#define KVB__BOOT_MSG_METHOD "Method not allowed"

/* A validated registration. */
typedef struct kvb__boot_reg {
    int64_t attn_tp_size, attn_tp_rank;
    int64_t attn_dp_size, attn_dp_rank;
    int64_t pp_size, pp_rank;
    int64_t system_dp_size, system_dp_rank;
    int64_t rank_port;
    char *rank_ip;  /* owned, 1..KVB_BOOTSTRAP_IP_MAX bytes of [A-Za-z0-9.:%_-] */
    json_t *layout; /* owned object holding only the validated layout keys
                       present in the body (possibly empty) */
} kvb__boot_reg_t;

/* Parse and validate a PUT /route body (len bytes, not NUL-terminated).
 * Unknown keys are ignored (peers may add extensions); role must be
 * "Prefill". On success fills *reg_p (release with kvb__boot_reg_clear) and
 * returns KVB_OK. Otherwise returns KVB_ERR_PROTO (or KVB_ERR_NOMEM), writes a
 * one-line reason to reason[reason_len] and leaves *reg_p untouched. */
kvb_status_t kvb__boot_reg_parse(const char *body, size_t len, kvb__boot_reg_t *reg_p, char *reason,
                                 size_t reason_len);

/* Free what reg owns and zero it. NULL-safe, idempotent. */
void kvb__boot_reg_clear(kvb__boot_reg_t *reg);

/* The JSON object of a registration (role "Prefill" + every field + the
 * layout keys). New reference, NULL on allocation failure. */
json_t *kvb__boot_reg_to_json(const kvb__boot_reg_t *reg);

/* dp_group and dp_size of a registration (SGLang rule: attn_dp_* when
 * system_dp_size == 1, else system_dp_*). */
int64_t kvb__boot_reg_dp_group(const kvb__boot_reg_t *reg);
int64_t kvb__boot_reg_dp_size(const kvb__boot_reg_t *reg);

/* Build a validated registration from the public struct (client side).
 * KVB_ERR_INVALID with a reason when a field is out of range. */
kvb_status_t kvb__boot_reg_from_public(const kvb_bootstrap_registration_t *pub,
                                       kvb__boot_reg_t *reg_p, char *reason, size_t reason_len);

/* A validated GET /route query. */
typedef struct kvb__boot_query {
    bool parallel_info; /* engine_rank = target_dp_group = -1 (target_pp_rank
                           -1 or absent) */
    int64_t engine_rank, dp_group, pp_rank;
} kvb__boot_query_t;

/* Outcome of query validation. */
typedef enum kvb__boot_query_result {
    KVB__BOOT_QUERY_OK = 0,
    KVB__BOOT_QUERY_MISSING = 1, /* engine_rank or target_dp_group absent or empty */
    KVB__BOOT_QUERY_INVALID = 2  /* a value that is not an integer in range */
} kvb__boot_query_result_t;

/* Validate the three query values (each NUL-terminated, NULL when absent; an
 * empty value counts as absent). target_pp_rank absent means 0, except that
 * engine_rank = target_dp_group = -1 asks for the parallel info whatever
 * target_pp_rank is absent or -1. A reason is written for INVALID. */
kvb__boot_query_result_t kvb__boot_query_parse(const char *engine_rank, const char *dp_group,
                                               const char *pp_rank, kvb__boot_query_t *query_p,
                                               char *reason, size_t reason_len);

/* Split a raw query string ("a=1&b=2", len bytes, percent-encoded) and
 * validate it as kvb__boot_query_parse does. The first occurrence of a key
 * wins; a key without '=' counts as absent; an invalid %-escape is INVALID. */
kvb__boot_query_result_t kvb__boot_query_parse_string(const char *qs, size_t len,
                                                      kvb__boot_query_t *query_p, char *reason,
                                                      size_t reason_len);

/* Client side: parse a rank lookup answer {"rank_ip", "rank_port"}.
 * KVB_ERR_PROTO with a reason when the body is not exactly that. */
kvb_status_t kvb__boot_rank_addr_parse(const char *body, size_t len,
                                       kvb_bootstrap_rank_addr_t *addr_p, char *reason,
                                       size_t reason_len);

/* Client side: parse a parallel-info answer. Requires prefill_attn_tp_size,
 * prefill_dp_size, prefill_pp_size (positive integers); the layout keys are
 * optional but validated. On success *info_p owns its arrays. */
kvb_status_t kvb__boot_parallel_info_parse(const char *body, size_t len,
                                           kvb_bootstrap_parallel_info_t *info_p, char *reason,
                                           size_t reason_len);

/* True when s (len bytes) is an acceptable rank_ip / host: 1..255 bytes of
 * [A-Za-z0-9.:%_-]. */
bool kvb__boot_valid_host(const char *s, size_t len);

/* Copy at most max bytes of untrusted text into out[out_len] as one printable
 * line (control and non-ASCII bytes become '?'), appending "..." when cut. */
void kvb__boot_sanitize(const char *s, size_t len, size_t max, char *out, size_t out_len);

/* printf into reason[reason_len] as one line (newlines become spaces); no-op
 * when reason is NULL or reason_len 0. */
void kvb__boot_reason(char *reason, size_t reason_len, const char *fmt, ...) KVB_PRINTF(3, 4);

#endif
