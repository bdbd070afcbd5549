/* The message lane's own declarations (writer msg.c, target target.c). */
#ifndef KVB_ENGINE_LANE_MSG_H
#define KVB_ENGINE_LANE_MSG_H

#include "engine/engine_int.h"

/* target.c: set the write handlers (plain, and token-first for an engine
 * with a secret) on the worker; the lane's init. KVB_ERR_IO. */
kvb_status_t kvb__am_target_register(kvb_engine_h eng);
/* Progress thread, every pass: close the reply endpoints with read answers
 * being sent none of which left within the peer time-out (their copies and
 * their share of the caps freed). */
void kvb__am_target_tick(kvb_engine_h eng);
/* Engine freed, before its worker is destroyed: force-close the reply
 * endpoints that still have answers being sent. */
void kvb__am_target_fini(kvb_engine_h eng);
/* kvb_engine_limits: the read caps' counters (KVB_ENGINE_LIMITS_READS). */
void kvb__am_target_stats(kvb_engine_h eng, kvb_engine_limits_t *l);

#endif
