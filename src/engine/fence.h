/* The writer fence: its whole rule, its state and its primitives. The code
 * is fence.c; the connector's one place is `writes_ended` (src/conn/), which
 * decides from these primitives when a failed room's pages are safe.
 *
 * The promise: once a target revoked a grant and the revoke drained, no
 * byte of a write made under it lands any more.
 *
 * - Grants. A target admits writes by grant, (writer tag, epoch):
 *   kvb_engine_grant_writer makes a fresh epoch (unique per engine, the
 *   first the wall clock in ns, so a restarted target never re-issues one a
 *   writer may still hold). A writer stamps its tag and, per transfer, the
 *   epoch on every write. A write whose grant is not live is refused
 *   (KVB_ERR_FENCED), nothing of it placed. A revoked grant is never
 *   admitted again; drained grants are dropped (at most 4096 live or
 *   draining).
 * - Revoking is a barrier (kvb_engine_revoke_writer): from its first call
 *   the grant is refused; it then waits for what was admitted before:
 *   message-lane receives between the header check and the end of placement
 *   (kvb__fence_admit .. kvb__fence_done, counted in the grant), and
 *   same-host units between a writer's check and its store fence (the busy
 *   count of the grant's slot in the shared fence page, raised by
 *   kvb__fence_enter, lowered by kvb__fence_exit: the target stores
 *   "revoked" then reads busy, the writer raises busy then re-reads the
 *   state, both sequentially consistent, so one sees the other). KVB_OK:
 *   nothing of the grant can land any more; KVB_ERR_INPROGRESS: a stalled
 *   writer may still land bytes (call again).
 * - Which lane admits how (lane.h, `fence`): the message lane's target
 *   admits every message (KVB__LANE_FENCE_TARGET); the direct and CUDA IPC
 *   lanes' writers enter the target's fence page per unit
 *   (KVB__LANE_FENCE_PAGE: a grant the page does not list, page full, sends
 *   the write to the message lane, whose target decides); the put lane
 *   cannot be checked by the target (KVB__LANE_FENCE_NONE, docs/engine.md).
 * - Epoch 0 is the legacy tag-only fence (kvb_engine_fence_writer): a list
 *   of refused tags, also published in the page (seqlock).
 * - Reads are admitted as writes (a read is stamped the same way), except
 *   that a target created with reads_need_grant refuses epoch-0 read
 *   requests (kvb__fence_admit_read). */
#ifndef KVB_ENGINE_FENCE_H
#define KVB_ENGINE_FENCE_H

#include <kvbridge/engine.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/shmem.h"

typedef struct kvb__conn kvb__conn_t;

/* A writer grant: writes stamped (tag, epoch) are admitted while live; once
 * revoked it stays until nothing admitted under it is in flight. */
typedef struct kvb__grant {
    uint32_t tag;
    int live;
    uint32_t am_busy; /* message-lane receives admitted, bytes not yet placed */
    uint64_t epoch;
    int32_t slot; /* its slot in the shared fence page, or -1 (none: no direct lane) */
    int corrupt;  /* its slot's busy count was seen corrupt (logged once; never drains) */
} kvb__grant_t;

/* A target's fence (struct kvb_engine's `fence`; every field under seg_mu). */
typedef struct kvb__fence {
    uint32_t *fenced; /* legacy: writer tags refused, epoch 0 */
    size_t n_fenced, cap_fenced;
    kvb__grant_t *grants; /* writer grants, live or draining */
    size_t n_grants, cap_grants;
    uint64_t last_epoch; /* the newest epoch granted */
    uint8_t *base;       /* our fence page, created with the first shared segment, or NULL */
    kvb__shm_ref_t ref;  /* its file, as the handshake advertises it */
} kvb__fence_t;

/* Engine creation: grants start at the wall clock (ns). Destruction: free
 * the tables and the page. */
void kvb__fence_init(kvb_engine_h eng);
void kvb__fence_free(kvb_engine_h eng);

/* ---- target side ---- */

/* seg_mu held: our fence page, made once (grants made before it get their
 * slots then); and its legacy tag list rewritten. */
kvb_status_t kvb__fence_page_ensure(kvb_engine_h eng);
void kvb__fence_page_sync(kvb_engine_h eng);
/* Message lane, progress thread: NULL when a write of (tag, epoch) is
 * admitted (then counted until kvb__fence_done), else why it is refused. */
const char *kvb__fence_admit(kvb_engine_h eng, uint32_t tag, uint64_t epoch);
/* The same for a read request; also refuses epoch 0 when the engine was
 * created with reads_need_grant. Ended by kvb__fence_done as a write. */
const char *kvb__fence_admit_read(kvb_engine_h eng, uint32_t tag, uint64_t epoch);
void kvb__fence_done(kvb_engine_h eng, uint32_t tag, uint64_t epoch);
/* Tests: the raw busy count of fence slot k of our page (0 without one). */
uint32_t kvb__fence_busy_raw(kvb_engine_h eng, int32_t k);

/* ---- writer side: the peer's fence page, mapped here (c->fence) ---- */

typedef enum fence_state { FENCE_NO = 0, FENCE_YES, FENCE_UNKNOWN } fence_state_t;
/* Is (tag, epoch) fenced by the peer's fence page? */
fence_state_t kvb__fence_check(const kvb__conn_t *c, uint32_t tag, uint64_t epoch);
/* Before a unit: FENCE_NO admits it and *slot_p must be passed to
 * kvb__fence_exit after the copy and its store fence. */
fence_state_t kvb__fence_enter(const kvb__conn_t *c, uint32_t tag, uint64_t epoch, int32_t *slot_p);
void kvb__fence_exit(const kvb__conn_t *c, int32_t slot);

#endif
