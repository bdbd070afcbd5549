/* The bootstrap server's registration table: sizes fixed by the first
 * registration, entries [dp_group][cp_rank][tp_rank][pp_rank] -> (rank_ip,
 * rank_port) (seed-001 registrations have cp_rank 0), the SGLang 2026 server
 * facts (page size, KV dtype, ...) and the layout keys registrations supplied. HTTP-free so it can
 * be fuzzed. Not thread-safe: the server calls it under its one lock. Internal. */
#ifndef KVB_BOOTSTRAP_TABLE_H
#define KVB_BOOTSTRAP_TABLE_H

#include "proto/bootstrap_proto.h"

/* Most entries one table holds; more is a 400 (bounds memory a peer can take). */
#define KVB__BOOT_MAX_ENTRIES 65536

typedef struct kvb__boot_entry {
    int64_t dp, cp, tp, pp;
    char *rank_ip; /* owned */
    int64_t rank_port;
    int64_t kvbridge; /* the registration's "kvbridge" (a kvbridge prefill), 0: absent */
    bool v2026;       /* registered with the 2026 keys (a rank that speaks 2026 on ZeroMQ) */
} kvb__boot_entry_t;

typedef struct kvb__boot_table {
    bool sized; /* true once the first registration fixed the sizes */
    int64_t attn_tp_size, dp_size, pp_size, attn_cp_size;
    /* 2026 facts (PROTOCOL-SGLANG-2026.md 3.1): the first registration's
     * follow_bootstrap_room and enable_dsa_cache_layer_split; the first
     * non-null page_size, kv_cache_dtype, prefill_http_port. */
    int64_t page_size;    /* -1 = none yet */
    char *kv_cache_dtype; /* owned; NULL = none yet */
    bool follow_bootstrap_room, enable_dsa_cache_layer_split;
    int64_t prefill_http_port;  /* 0 = none yet */
    json_t *layout;             /* merged layout keys; an object, never NULL */
    kvb__boot_entry_t *entries; /* sorted by (dp, tp, pp) */
    size_t count, cap;
    size_t n_legacy; /* entries registered without the 2026 keys (seed 001, TokenSpeed) */
} kvb__boot_table_t;

/* Empty table. KVB_ERR_NOMEM on allocation failure. */
kvb_status_t kvb__boot_table_init(kvb__boot_table_t *t);
/* Free everything the table owns. */
void kvb__boot_table_destroy(kvb__boot_table_t *t);

/* Apply a validated registration: the first one fixes attn_tp_size, dp_size,
 * pp_size and attn_cp_size; a later one with other sizes, or with a page_size
 * or kv_cache_dtype other than the stored non-null one, is refused
 * (KVB_ERR_PROTO with a reason); the entry is inserted or overwritten; layout keys present in the
 * registration replace the stored ones. On any error the table is unchanged. */
kvb_status_t kvb__boot_table_apply(kvb__boot_table_t *t, const kvb__boot_reg_t *reg, char *reason,
                                   size_t reason_len);

/* The entry for (dp, cp, tp, pp) or NULL. Valid until the next
 * apply/destroy. */
const kvb__boot_entry_t *kvb__boot_table_find(const kvb__boot_table_t *t, int64_t dp, int64_t cp,
                                              int64_t tp, int64_t pp);

/* Some rank registered without the 2026 keys (a seed-001 or TokenSpeed
 * prefill): it does not speak 2026 on ZeroMQ, so the server answers 2026
 * look-ups as such a prefill's own server does (400), and a decode asks
 * again in the old style and speaks the old dialect (spec 11.1: "speak on
 * ZeroMQ the dialect of the server that answered"). */
bool kvb__boot_table_legacy(const kvb__boot_table_t *t);

/* SGLang 2026 readiness (3.7): the sizes are known and every
 * (dp, cp, tp, pp) is registered. */
bool kvb__boot_table_ready(const kvb__boot_table_t *t);

/* The 2026 parallel info: exactly SGLang's 15 PrefillServerInfo keys, plus
 * the stored layout keys when with_layout (kvbridge's own client asks for
 * them). NULL when not ready or on no memory (*nomem_p). New reference. */
json_t *kvb__boot_table_parallel_info_2026(const kvb__boot_table_t *t, bool with_layout,
                                           bool *nomem_p);

/* Parallel info object (both dialects' keys, stored layout keys, and
 * enable_mla_l1_5_cache defaulting to false); NULL when nothing is registered
 * yet or on allocation failure (*nomem_p says which). New reference. */
json_t *kvb__boot_table_parallel_info(const kvb__boot_table_t *t, bool *nomem_p);

/* {"rank_ip", "rank_port"} of an entry, plus "kvbridge" when its
 * registration carried it (a kvbridge decode then sends kvbridge's extension
 * frames to that rank; SGLang's and TokenSpeed's decodes read only the two
 * address keys). New reference, NULL on no memory. */
json_t *kvb__boot_entry_json(const kvb__boot_entry_t *e);

/* Whole table as JSON (for tests and invariants). New reference or NULL. */
json_t *kvb__boot_table_snapshot(const kvb__boot_table_t *t);

#endif
