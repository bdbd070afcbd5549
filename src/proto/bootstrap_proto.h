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
/* kvbridge's server stores it with a TokenSpeed registration and serves it
 * with the layout keys: the ZeroMQ dialect of those ranks ("tokenspeed"),
 * which the answer's shape alone does not say (PROTOCOL-TOKENSPEED.md 11.2,
 * "record the registering dialect"). */
#define KVB__BOOT_KEY_DIALECT "kvbridge_peer_dialect"
#define KVB__BOOT_DIALECT_TS "tokenspeed"
/* A kvbridge prefill says so in its registration, and the server in that
 * rank's look-up answers: an integer, the extension version (1: the
 * "kvbridge-ext/1" marker and extension frames, docs/protocol-frames.md).
 * Never in the 2026 parallel info (SGLang's decode refuses unknown keys
 * there). */
#define KVB__BOOT_KEY_KVBRIDGE "kvbridge"
#define KVB__BOOT_KVBRIDGE_MAX 65535

/* The texts the seeds answer with. */
#define KVB__BOOT_MSG_MISSING "Missing inputs for bootstrap server."
#define KVB__BOOT_MSG_NOT_FOUND "Bootstrap info not Found"
#define KVB__BOOT_MSG_METHOD "Method not allowed"
/* SGLang 2026 (PROTOCOL-SGLANG-2026.md 3.2): 503 text, "%lld" = ranks registered. */
#define KVB__BOOT_MSG_NOT_READY "Prefill server not fully registered yet (%lld workers registered)."

/* Longest kv_cache_dtype / load_balance_method string accepted (bytes). */
#define KVB__BOOT_WORD_MAX 64
/* Most rooms one POST /query_dp_ranks may ask about. */
#define KVB__BOOT_MAX_QUERY_ROOMS 16384

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
    /* SGLang 2026 keys (PROTOCOL-SGLANG-2026.md 3.1). A seed-001 body
     * carries none of them and gets the defaults shown. */
    bool has_role;                     /* the body carried "role": "Prefill" */
    bool v2026;                        /* the body carried 2026 keys (serialised back) */
    int64_t attn_cp_size;              /* 1 */
    int64_t attn_cp_rank;              /* 0 */
    int64_t page_size;                 /* -1 = null */
    char *kv_cache_dtype;              /* owned; NULL = null */
    char *load_balance_method;         /* owned; NULL = absent ("follow_bootstrap_room") */
    bool enable_dsa_cache_layer_split; /* false */
    int64_t prefill_http_port;         /* 0 = null */
    int64_t kvbridge;                  /* "kvbridge" (1..65535), 0 = absent (any dialect) */
} kvb__boot_reg_t;

/* Parse and validate a PUT /route body (len bytes, not NUL-terminated).
 * Unknown keys are ignored (peers may add extensions). Two shapes: with
 * "role" (seed 001; role must be "Prefill"; 2026 keys optional, validated
 * when present) and without (SGLang 2026: attn_cp_size, attn_cp_rank,
 * page_size and kv_cache_dtype required). On success fills *reg_p (release with
 * kvb__boot_reg_clear) and returns KVB_OK. Otherwise returns KVB_ERR_PROTO (or KVB_ERR_NOMEM),
 * writes a one-line reason to reason[reason_len] and leaves *reg_p untouched. */
kvb_status_t kvb__boot_reg_parse(const char *body, size_t len, kvb__boot_reg_t *reg_p, char *reason,
                                 size_t reason_len);

/* TokenSpeed's body (dialect/tokenspeed_seed/boot_json.c): world_size and engine_rank
 * present, attn_tp_size absent; then role, world_size, dp_size,
 * engine_rank and enable_mla_l1_5_cache are required and fill r's seed-001
 * fields (rank_ip, rank_port and the layout keys as for the others). */
bool kvb__boot_reg_is_ts(json_t *root);
kvb_status_t kvb__boot_reg_parse_ts(json_t *root, kvb__boot_reg_t *r, char *reason,
                                    size_t reason_len);

/* Client side: a TokenSpeed server's parallel info (spec 3.2):
 * prefill_tp_size (its world size), prefill_dp_size, enable_mla_l1_5_cache
 * (must be false: kvbridge has no L1.5), the length lists; no
 * prefill_attn_tp_size. Fills attention TP = world / DP, PP 1. */
kvb_status_t kvb__boot_parallel_info_parse_ts(const char *body, size_t len,
                                              kvb_bootstrap_parallel_info_t *info_p, char *reason,
                                              size_t reason_len);
/* Does a parallel-info answer name TokenSpeed ranks: TokenSpeed's own shape
 * (prefill_tp_size without prefill_attn_tp_size) or kvbridge's server's
 * "kvbridge_peer_dialect": "tokenspeed"? (dialect/tokenspeed_seed/boot_json.c) */
bool kvb__boot_answer_is_ts(const char *body, size_t len);
/* TokenSpeed 0.1.1 (CachePD) prefill ranks on kvbridge's server
 * (dialect/cachepd/boot_server.c; PROTOCOL-TOKENSPEED-CACHEPD.md 3, 12.2):
 * a PUT body with "cache_layout" is theirs; the state (sizes, canonical
 * contract, placement, the (DP group, stage-major rank) -> address table)
 * is made at the first PUT, refused ones change nothing. Not thread-safe
 * (the server's lock). */
typedef struct kvb__boot_cpd kvb__boot_cpd_t;
bool kvb__boot_is_cpd_put(const char *body, size_t len);
kvb_status_t kvb__boot_cpd_put(kvb__boot_cpd_t **st_p, const char *body, size_t len, char *reason,
                               size_t reason_len);
/* A CachePD rank registered: the engine_rank/target_dp_group look-ups are
 * answered in its shape. */
bool kvb__boot_cpd_active(const kvb__boot_cpd_t *st);
size_t kvb__boot_cpd_count(const kvb__boot_cpd_t *st); /* entries */
/* The parallel info (malloc'ed text): TokenSpeed's own bytes when base is
 * NULL; else base (the other dialects' answer) with the CachePD keys a
 * CachePD decode needs. NULL when none registered or no memory (*nomem_p). */
char *kvb__boot_cpd_info(const kvb__boot_cpd_t *st, json_t *base, bool *nomem_p);
/* {"rank_ip", "rank_port"} of (DP group, stage-major rank), NULL if none. */
json_t *kvb__boot_cpd_rank(const kvb__boot_cpd_t *st, int64_t dp, int64_t rank);
void kvb__boot_cpd_free(kvb__boot_cpd_t *st); /* NULL-safe */
/* Client side: a parallel-info answer of CachePD ranks only (cache_layout
 * and cache_fields_by_stage, none of kvbridge's or SGLang's keys): read by
 * the dialect's parser into info (attention TP = the intra-stage TP, DP,
 * PP); the decode reads the contract from the answer's text
 * (kvb__bootstrap_client_answer). */
bool kvb__boot_answer_is_cpd(const char *body, size_t len);
kvb_status_t kvb__boot_parallel_info_parse_cpd(const char *body, size_t len,
                                               kvb_bootstrap_parallel_info_t *info_p, char *reason,
                                               size_t reason_len);

/* Client side (bootstrap/client.c): PUT /route with a body a dialect built
 * (its own shape, e.g. a CachePD registration); as
 * kvb_bootstrap_client_register otherwise. */
/* Client side: the address of rank `rank` of DP group dp_group asked as
 * TokenSpeed's decode asks it (engine_rank and target_dp_group only: a
 * stage-major rank, no PP rank); errors as kvb_bootstrap_client_lookup. */
kvb_status_t kvb__bootstrap_client_lookup_rank(kvb_bootstrap_client_h c, int32_t dp_group,
                                               int32_t rank, double timeout_s,
                                               kvb_bootstrap_rank_addr_t *addr_p);
/* Client side: a copy (malloc'ed, NUL-terminated, *len_p bytes) of the last
 * answer's body, for a dialect that reads more of it than the public structs
 * hold (CachePD's layout contract); NULL when none or no memory. */
char *kvb__bootstrap_client_answer(kvb_bootstrap_client_h c, size_t *len_p);
kvb_status_t kvb__bootstrap_client_put_route(kvb_bootstrap_client_h c, const char *body,
                                             double timeout_s);

/* The layout keys of an answer into info (boot_json_util.c). */
bool kvb__boot_info_layout_parse(json_t *root, kvb_bootstrap_parallel_info_t *info, bool *nomem,
                                 char *reason, size_t reason_len);

/* Free what reg owns and zero it. NULL-safe, idempotent. */
void kvb__boot_reg_clear(kvb__boot_reg_t *reg);

/* The JSON object of a registration: role "Prefill" when has_role, every
 * seed-001 field, the 2026 keys when v2026, the layout keys. New reference,
 * NULL on allocation failure. */
json_t *kvb__boot_reg_to_json(const kvb__boot_reg_t *reg);

/* dp_group and dp_size of a registration (SGLang rule: attn_dp_* when
 * system_dp_size == 1, else system_dp_*). */
int64_t kvb__boot_reg_dp_group(const kvb__boot_reg_t *reg);
int64_t kvb__boot_reg_dp_size(const kvb__boot_reg_t *reg);

/* Build a validated registration from the public struct (client side) for
 * the given dialect (KVB_BOOTSTRAP_DIALECT_*): 2025 = the seed-001 body as
 * before; 2026 = the union body (role "Prefill" + every 2026 key), which both
 * SGLang servers accept. KVB_ERR_INVALID with a reason when a field is out of
 * range. */
kvb_status_t kvb__boot_reg_from_public(const kvb_bootstrap_registration_t *pub, int dialect,
                                       kvb__boot_reg_t *reg_p, char *reason, size_t reason_len);

/* Validate the 2026 keys of a registration body (called by
 * kvb__boot_reg_parse; fills the 2026 fields of r). */
kvb_status_t kvb__boot_reg_parse_2026(json_t *root, kvb__boot_reg_t *r, char *reason,
                                      size_t reason_len);

/* Add the 2026 keys of r to o (kvb__boot_reg_to_json). false on no memory. */
bool kvb__boot_reg_2026_to_json(const kvb__boot_reg_t *r, json_t *o);

/* A validated GET /route query. */
typedef struct kvb__boot_query {
    bool parallel_info; /* seed 001: engine_rank = target_dp_group = -1
                           (target_pp_rank -1 or absent); 2026: all four -1 */
    bool v2026;         /* prefill_dp_rank/prefill_cp_rank/target_tp_rank style */
    int64_t engine_rank, dp_group, pp_rank; /* 2026: target_tp_rank,
                                               prefill_dp_rank, target_pp_rank
                                               (each >= -1; a -1 among other
                                               values finds nothing: 404) */
    int64_t cp_rank;                        /* 2026: prefill_cp_rank; seed 001: 0 */
    bool want_layout; /* 2026 + kvbridge_layout=1: kvbridge's layout keys wanted */
} kvb__boot_query_t;

/* Query values by key (NUL-terminated, NULL when absent). */
typedef struct kvb__boot_query_vals {
    const char *engine_rank, *target_dp_group, *target_pp_rank;     /* seed 001 */
    const char *prefill_dp_rank, *prefill_cp_rank, *target_tp_rank; /* 2026 (+ target_pp_rank) */
    const char *kvbridge_layout; /* 2026 extension: "1" = add the layout keys */
} kvb__boot_query_vals_t;

/* Outcome of query validation. */
typedef enum kvb__boot_query_result {
    KVB__BOOT_QUERY_OK = 0,
    KVB__BOOT_QUERY_MISSING = 1, /* engine_rank or target_dp_group absent or empty */
    KVB__BOOT_QUERY_INVALID = 2  /* a value that is not an integer in range */
} kvb__boot_query_result_t;

/* Validate a query of either dialect. Any of prefill_dp_rank,
 * prefill_cp_rank, target_tp_rank present (non-empty) makes it a 2026 query:
 * all four 2026 keys are then required (MISSING otherwise) and the seed-001
 * keys are ignored. Otherwise as kvb__boot_query_parse. */
kvb__boot_query_result_t kvb__boot_query_parse_vals(const kvb__boot_query_vals_t *v,
                                                    kvb__boot_query_t *query_p, char *reason,
                                                    size_t reason_len);

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

/* Client side: parse a rank lookup answer {"rank_ip", "rank_port"} and,
 * when kvbridge_p is not NULL, its optional "kvbridge" (0 when absent).
 * Other keys are ignored. KVB_ERR_PROTO with a reason when a key is
 * missing or out of range. */
kvb_status_t kvb__boot_rank_addr_parse(const char *body, size_t len,
                                       kvb_bootstrap_rank_addr_t *addr_p, int *kvbridge_p,
                                       char *reason, size_t reason_len);

/* Client side: parse a parallel-info answer. Requires prefill_attn_tp_size,
 * prefill_dp_size, prefill_pp_size (positive integers); the layout keys are
 * optional but validated. On success *info_p owns its arrays. */
kvb_status_t kvb__boot_parallel_info_parse(const char *body, size_t len,
                                           kvb_bootstrap_parallel_info_t *info_p, char *reason,
                                           size_t reason_len);

/* Client side: parse a 2026 parallel-info answer (SGLang's PrefillServerInfo:
 * attn_tp_size, attn_cp_size, dp_size, pp_size required; page_size,
 * kv_cache_dtype, prefill_http_port int/string or null; the two flags
 * booleans; kvbridge's layout keys optional). Fills *info_p (owning its
 * arrays) and, when ext_p is not NULL, the fields ext_p->field_mask names. */
kvb_status_t kvb__boot_parallel_info_parse_2026(const char *body, size_t len,
                                                kvb_bootstrap_parallel_info_t *info_p,
                                                kvb_bootstrap_parallel_info_ext_t *ext_p,
                                                char *reason, size_t reason_len);

/* Fill the fields ext_p->field_mask names with a seed-001 server's defaults
 * (dialect 2025, cp 1, page_size -1, follow_bootstrap_room 1). NULL-safe. */
void kvb__boot_info_ext_default(kvb_bootstrap_parallel_info_ext_t *ext_p);

/* Server side: parse a POST /register_dp_rank body {"bootstrap_room", "dp_rank"}
 * (each an integer, or a decimal string as SGLang's int() allows; room
 * 0..2^64-1, dp_rank 0..65535). */
kvb_status_t kvb__boot_dp_rank_parse(const char *body, size_t len, uint64_t *room_p,
                                     int64_t *dp_rank_p, char *reason, size_t reason_len);

/* Server side: parse a POST /query_dp_ranks body {"bootstrap_rooms": [...]}
 * (at most KVB__BOOT_MAX_QUERY_ROOMS rooms). *rooms_p is malloc'ed (NULL when
 * the list is empty). */
kvb_status_t kvb__boot_dp_query_parse(const char *body, size_t len, uint64_t **rooms_p, size_t *n_p,
                                      char *reason, size_t reason_len);

/* Client side: parse a /query_dp_ranks answer {"<room>": dp_rank, ...} into
 * dp_ranks[i] for rooms[i] (-1 when the room is not in the answer). */
kvb_status_t kvb__boot_dp_answer_parse(const char *body, size_t len, const uint64_t *rooms,
                                       size_t n, int32_t *dp_ranks, char *reason,
                                       size_t reason_len);

/* Shared helpers (boot_json_util.c). */
json_t *kvb__boot_load_object(const char *body, size_t len, const char *what, char *reason,
                              size_t reason_len);
bool kvb__boot_get_int(json_t *obj, const char *key, int64_t min, int64_t max, int64_t *out,
                       char *reason, size_t reason_len);
bool kvb__boot_valid_flag(json_t *v, const char *key, bool *out, char *reason, size_t reason_len);
/* A list of lengths: array of at most KVB__BOOT_MAX_LENS integers >= 1. */
bool kvb__boot_valid_lens(json_t *v, const char *key, char *reason, size_t reason_len);
/* The layout's length-list keys (kv item, kv unit, state item, state unit). */
#define KVB__BOOT_N_LENS 4
extern const char *const kvb__boot_lens_keys[KVB__BOOT_N_LENS];
/* An integer or a decimal string (SGLang's int()) in [min, max]. */
bool kvb__boot_get_intish(json_t *v, const char *key, int64_t min, int64_t max, int64_t *out,
                          char *reason, size_t reason_len);
/* A word: 1..KVB__BOOT_WORD_MAX bytes of [A-Za-z0-9_.:+-]. */
bool kvb__boot_valid_word(const char *s, size_t len);

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
