/* What a peer registered, as this engine's handshake with it says (internal;
 * used by the connector to bound writes whose destinations a peer computed,
 * e.g. TokenSpeed's decode-computed plans, before any byte moves). */
#ifndef KVB_ENGINE_PEER_REGION_H
#define KVB_ENGINE_PEER_REGION_H

#include <kvbridge/engine.h>
#include <stdint.h>

/* The region [*base_p, *base_p + *len_p) that session sid registered and
 * that holds addr (connecting first if needed; asks again once when the
 * handshake is older than a registration). KVB_ERR_BOUNDS when no region
 * holds addr; the connection's errors otherwise (KVB_ERR_TIMEOUT within
 * timeout_s, KVB_ERR_PEER, ...). Any thread. */
kvb_status_t kvb__engine_peer_region(kvb_engine_h eng, const char *sid, uint64_t addr,
                                     double timeout_s, uint64_t *base_p, uint64_t *len_p);

#endif
