/* room -> dp_rank table of POST /register_dp_rank and /query_dp_ranks
 * (PROTOCOL-SGLANG-2026.md 3.5): open addressing on the room id, entries
 * expire ttl after their last registration, at most max live entries (the
 * memory a peer can make the server hold). HTTP-free; not thread-safe (the
 * server calls it under its lock). Internal. */
#ifndef KVB_BOOTSTRAP_DP_ROOMS_H
#define KVB_BOOTSTRAP_DP_ROOMS_H

#include "core/core.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct kvb__dp_slot {
    uint64_t room;
    uint64_t t_ns; /* 0 = empty */
    int32_t dp_rank;
} kvb__dp_slot_t;

typedef struct kvb__dp_rooms {
    kvb__dp_slot_t *slots;
    size_t cap;  /* power of two, 0 before the first put */
    size_t used; /* occupied slots, expired ones included until a sweep */
    size_t max;  /* most occupied slots (live entries) */
    uint64_t ttl_ns;
    uint64_t next_sweep_ns; /* at the cap: no rebuild before this */
} kvb__dp_rooms_t;

void kvb__dp_rooms_init(kvb__dp_rooms_t *t, size_t max, double ttl_s);
void kvb__dp_rooms_destroy(kvb__dp_rooms_t *t);

/* Record room -> dp_rank at now_ns (a re-registration refreshes it).
 * KVB_ERR_STATE: max live entries already; KVB_ERR_NOMEM. */
kvb_status_t kvb__dp_rooms_put(kvb__dp_rooms_t *t, uint64_t room, int32_t dp_rank, uint64_t now_ns);

/* dp_rank of room, or -1 when unknown or expired at now_ns. */
int32_t kvb__dp_rooms_get(const kvb__dp_rooms_t *t, uint64_t room, uint64_t now_ns);

/* Live entries at now_ns (counts; for tests and metrics). */
size_t kvb__dp_rooms_live(const kvb__dp_rooms_t *t, uint64_t now_ns);

#endif
