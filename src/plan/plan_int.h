/* Internal definitions of the transfer planner (src/plan/). */
#ifndef KVB_PLAN_INT_H
#define KVB_PLAN_INT_H

#include <kvbridge/plan.h>
#include <stdbool.h>

#include "core/core.h"

/* One buffer kind of a layout pair with its unit geometry. A rank r of a side
 * holds the distinct shard r / g (g = replica group size) made of units
 * [shard * U, shard * U + U) out of H global units; a replicated buffer is the
 * case U = H, g = tp. */
typedef struct kvb__plan_class {
    kvb_plan_buffer_t kind;
    uint32_t index;    /* state / aux buffer index */
    uint32_t rows;     /* rows per item: the prefill's page size for paged kinds */
    uint32_t dst_rows; /* the decode's (equal for state and aux) */
    kvb_plan_order_t src_order, dst_order; /* NHD for state and aux */
    uint64_t unit;                         /* bytes per unit */
    uint64_t units;                        /* H */
    uint64_t src_units, dst_units;
    uint32_t src_group, dst_group;
    uint64_t src_row, dst_row;
    uint64_t src_item, dst_item;
} kvb__plan_class_t;

struct kvb_plan {
    kvb_plan_attn_t attn;
    uint32_t ptp, dtp;
    uint32_t pp_size, pp_rank, start_layer, stage_layers;
    uint32_t num_layers, draft_layers, num_state, num_aux;
    uint32_t src_page, dst_page; /* page sizes in tokens: P_p, P_d */
    uint64_t src_kv_pool, dst_kv_pool, src_state_pool, dst_state_pool;
    uint64_t src_aux_pool, dst_aux_pool;
    kvb__plan_class_t *classes;
    size_t num_classes;
    /* routes: sources of decode rank d are sources[route_off[d] .. route_off[d+1]) */
    kvb_plan_source_t *sources;
    uint32_t *route_off;
    uint32_t *response_num;
};

/* Record the calling thread's plan error (also logged at debug); returns
 * KVB_ERR_INVALID. */
kvb_status_t kvb__plan_fail(const char *fmt, ...) KVB_PRINTF(1, 2);

/* The fragment prefill rank p sends to decode rank d for class c; false when
 * the pair exchanges nothing for it (disjoint units, or p is not the
 * representative of its replica group for d). */
bool kvb__plan_pair_fragment(const kvb_plan_h plan, const kvb__plan_class_t *c, uint32_t p,
                             uint32_t d, uint64_t *src_off_p, uint64_t *dst_off_p,
                             uint64_t *bytes_p);

#endif
