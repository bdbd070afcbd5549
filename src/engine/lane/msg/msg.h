/* The message lane's own declarations (writer msg.c, target target.c). */
#ifndef KVB_ENGINE_LANE_MSG_H
#define KVB_ENGINE_LANE_MSG_H

#include "engine/engine_int.h"

/* target.c: set the write handlers (plain, and token-first for an engine
 * with a secret) on the worker; the lane's init. KVB_ERR_IO. */
kvb_status_t kvb__am_target_register(kvb_engine_h eng);

#endif
