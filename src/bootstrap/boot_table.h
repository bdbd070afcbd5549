/* The bootstrap server's registration table: sizes fixed by the first
 * registration, entries [dp_group][tp_rank][pp_rank] -> (rank_ip, rank_port),
 * and the layout keys registrations supplied. HTTP-free so it can be fuzzed.
 * Not thread-safe: the server calls it under its one lock. Internal. */
#ifndef KVB_BOOTSTRAP_TABLE_H
#define KVB_BOOTSTRAP_TABLE_H

#include "proto/bootstrap_proto.h"

/* Most entries one table holds; more is a 400 (bounds memory a peer can take). */
#define KVB__BOOT_MAX_ENTRIES 65536

typedef struct kvb__boot_entry {
    int64_t dp, tp, pp;
    char *rank_ip; /* owned */
    int64_t rank_port;
} kvb__boot_entry_t;

typedef struct kvb__boot_table {
    bool sized; /* true once the first registration fixed the sizes */
    int64_t attn_tp_size, dp_size, pp_size;
    json_t *layout;             /* merged layout keys; an object, never NULL */
    kvb__boot_entry_t *entries; /* sorted by (dp, tp, pp) */
    size_t count, cap;
} kvb__boot_table_t;

/* Empty table. KVB_ERR_NOMEM on allocation failure. */
kvb_status_t kvb__boot_table_init(kvb__boot_table_t *t);
/* Free everything the table owns. */
void kvb__boot_table_destroy(kvb__boot_table_t *t);

/* Apply a validated registration: the first one fixes attn_tp_size, dp_size
 * and pp_size; a later one with other sizes is refused (KVB_ERR_PROTO with a
 * reason); the entry is inserted or overwritten; layout keys present in the
 * registration replace the stored ones. On any error the table is unchanged. */
kvb_status_t kvb__boot_table_apply(kvb__boot_table_t *t, const kvb__boot_reg_t *reg, char *reason,
                                   size_t reason_len);

/* The entry for (dp, tp, pp) or NULL. Valid until the next apply/destroy. */
const kvb__boot_entry_t *kvb__boot_table_find(const kvb__boot_table_t *t, int64_t dp, int64_t tp,
                                              int64_t pp);

/* Parallel info object (both dialects' keys, stored layout keys, and
 * enable_mla_l1_5_cache defaulting to false); NULL when nothing is registered
 * yet or on allocation failure (*nomem_p says which). New reference. */
json_t *kvb__boot_table_parallel_info(const kvb__boot_table_t *t, bool *nomem_p);

/* {"rank_ip", "rank_port"} of an entry. New reference, NULL on no memory. */
json_t *kvb__boot_entry_json(const kvb__boot_entry_t *e);

/* Whole table as JSON (for tests and invariants). New reference or NULL. */
json_t *kvb__boot_table_snapshot(const kvb__boot_table_t *t);

#endif
