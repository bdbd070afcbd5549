/* The process's Prometheus metrics (docs/observe.md): one table
 * (metrics.def), relaxed atomic adds on the hot path, gauges that need a
 * lock gathered by collectors at scrape time, one text writer. */
#ifndef KVB_CORE_METRICS_H
#define KVB_CORE_METRICS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Label sets. Roles: 0 prefill, 1 decode (kvb_mode_t). */
#define KVB__M_LANES 8 /* lane indices (engine/lanes.c registry order) */
enum { KVB__M_OP_WRITE = 0, KVB__M_OP_READ, KVB__M_OPS };
enum { KVB__M_OK = 0, KVB__M_FAILED, KVB__M_CANCELED, KVB__M_OUTCOMES };
enum { KVB__M_ROLES = 2 };
enum { KVB__M_SUCCESS = 0, KVB__M_FAIL, KVB__M_ROOM_OUTCOMES };
/* Reason classes of a failed room (conn/timeline.c kvb__reason_class). */
#define KVB__REASON_MAP(XX)                                                                        \
    XX(ABORTED, "aborted")                                                                         \
    XX(TIMEOUT, "timeout")                                                                         \
    XX(PEER_LOST, "peer_lost")                                                                     \
    XX(PEER_FAILED, "peer_failed")                                                                 \
    XX(TRANSFER, "transfer_error")                                                                 \
    XX(REFUSED, "refused")                                                                         \
    XX(BOOTSTRAP, "bootstrap")                                                                     \
    XX(OTHER, "other")
typedef enum kvb__reason {
#define KVB__REASON_ENUM_(id, name) KVB__R_##id,
    KVB__REASON_MAP(KVB__REASON_ENUM_)
#undef KVB__REASON_ENUM_
        KVB__R_COUNT
} kvb__reason_t;
const char *kvb__reason_name(kvb__reason_t r);
/* Stages of the stage histogram. */
enum { KVB__ST_BOOTSTRAP = 0, KVB__ST_WAIT_DECODE, KVB__ST_TRANSFER, KVB__ST_TOTAL, KVB__STAGES };

/* Label slots per label set (dims), values per slot (type), buckets. */
#define KVB__DN_NONE 1
#define KVB__DN_LANE_OP (KVB__M_LANES * KVB__M_OPS)
#define KVB__DN_LANE_OP_OUTCOME (KVB__M_LANES * KVB__M_OPS * KVB__M_OUTCOMES)
#define KVB__DN_ROLE KVB__M_ROLES
#define KVB__DN_ROLE_OUTCOME (KVB__M_ROLES * KVB__M_ROOM_OUTCOMES)
#define KVB__DN_ROLE_REASON (KVB__M_ROLES * KVB__R_COUNT)
#define KVB__DN_ROLE_STAGE (KVB__M_ROLES * KVB__STAGES)
#define KVB__BN_NONE 0
#define KVB__BN_SECONDS 18
#define KVB__BN_SPEED 12
#define KVB__TW_COUNTER 1
#define KVB__TW_GAUGE 1
#define KVB__TW_HISTOGRAM 2 /* count, sum (after the buckets) */

typedef enum kvb__mid {
#define KVB_METRIC(id, name, type, dims, bk, help) KVB__M_##id,
#include "core/metrics.def"
#undef KVB_METRIC
    KVB__M_COUNT
} kvb__mid_t;

/* Each metric's first value in kvb__mv: its label slots in order, each a
 * value (counter, gauge) or buckets then count then sum (histogram). */
enum kvb__moff {
#define KVB_METRIC(id, name, type, dims, bk, help)                                                 \
    KVB__MO_##id,                                                                                  \
        KVB__MO_##id##_END = KVB__MO_##id + KVB__DN_##dims * (KVB__TW_##type + KVB__BN_##bk) - 1,
#include "core/metrics.def"
#undef KVB_METRIC
    KVB__MO_TOTAL
};
extern uint64_t kvb__mv[KVB__MO_TOTAL];
extern const uint32_t kvb__moff[KVB__M_COUNT];

/* Add v to metric id's label slot (relaxed atomic; any thread, no lock). */
static inline void kvb__m_add(kvb__mid_t id, size_t slot, uint64_t v)
{
    __atomic_add_fetch(&kvb__mv[kvb__moff[id] + slot], v, __ATOMIC_RELAXED);
}
static inline void kvb__m_sub(kvb__mid_t id, size_t slot, uint64_t v)
{
    __atomic_sub_fetch(&kvb__mv[kvb__moff[id] + slot], v, __ATOMIC_RELAXED);
}
/* One observation of histogram id in slot: v in its base unit (seconds
 * histograms: ns; speed: bytes per second). Any thread, no lock. */
void kvb__m_observe(kvb__mid_t id, size_t slot, uint64_t v);

/* Slots of the label sets. */
static inline size_t kvb__m_lane_op(unsigned lane, bool read)
{
    return (lane < KVB__M_LANES ? lane : KVB__M_LANES - 1) * KVB__M_OPS + (read ? 1 : 0);
}
static inline size_t kvb__m_lane_op_out(unsigned lane, bool read, unsigned outcome)
{
    return kvb__m_lane_op(lane, read) * KVB__M_OUTCOMES + outcome;
}
/* Slot k of n per role. */
static inline size_t kvb__m_role(int role, unsigned k, unsigned n)
{
    return (size_t)(role != 0) * n + k;
}

/* Names of the label values the core does not know: lane i's name (static
 * string; the engine registers its lanes), and the rank a role's manager
 * has in this process (the last one created). */
void kvb__metrics_lane_name(unsigned lane, const char *name);
void kvb__metrics_role_rank(int role, int64_t rank);

/* A gauge that needs a lock, read at scrape: fn adds into the snapshot
 * with kvb__metrics_put. add/remove take the collectors' lock (never the
 * hot path); once remove returns, fn is not running for arg. */
typedef struct kvb__msnap kvb__msnap_t;
typedef void (*kvb__mcollect_fn)(void *arg, kvb__msnap_t *s);
void kvb__metrics_collector_add(kvb__mcollect_fn fn, void *arg);
void kvb__metrics_collector_remove(kvb__mcollect_fn fn, void *arg);
void kvb__metrics_put(kvb__msnap_t *s, kvb__mid_t id, size_t slot, uint64_t v);

/* The exposition (Prometheus text format 0.0.4) into a malloc'ed string
 * (*len_p bytes, NUL-terminated); NULL: no memory. Any thread. */
char *kvb__metrics_text(size_t *len_p);

/* KVBRIDGE_TIMELINE (default 1): 0 turns off recording timelines and the
 * metrics counted per room and per transfer (the A/B switch of
 * bench/results/observe.md). Read once; any thread. */
bool kvb__observe_on(void);

/* Start the /metrics listener once per process when KVBRIDGE_METRICS_ADDR
 * is set (metrics_http.c); a bad value or a failed bind is logged, never
 * fatal. Any thread. */
void kvb__metrics_serve(void);

#endif
