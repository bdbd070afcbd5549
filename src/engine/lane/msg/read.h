/* The message lane's one-sided reads, reader side (read.c): the window
 * slots that keep each request's local pieces, and placing the target's
 * answer. Progress thread only. */
#ifndef KVB_ENGINE_LANE_MSG_READ_H
#define KVB_ENGINE_LANE_MSG_READ_H

#include "engine/engine_int.h"

/* eng->read_direct from KVBRIDGE_READ_DIRECT and the UCX knobs the
 * straight receive relies on (read.c's header). */
void kvb__am_read_direct_init(kvb_engine_h eng);
/* The slot of message seq in x's window, or -1. */
long kvb__am_win_find(const struct kvb_xfer *x, uint32_t seq);
/* Take slot i out of x's window (a read's pieces kept there freed). */
void kvb__am_win_drop(struct kvb_xfer *x, size_t i);
/* Read x's slot i now waits for bytes bytes, placed into iov[0..n) (taken). */
void kvb__am_read_slot(struct kvb_xfer *x, size_t i, ucp_dt_iov_t *iov, size_t n, uint64_t bytes);
/* A successful answer to read request seq of x (from x's connection):
 * exactly the bytes asked, placed now (eager) or received into a buffer of
 * ours and placed when the receive ends, only if x still runs then and the
 * request is still in its window (rendezvous). Anything else fails x. */
ucs_status_t kvb__am_read_answer(kvb_engine_h eng, struct kvb_xfer *x, uint32_t seq, void *data,
                                 size_t length, const ucp_am_recv_param_t *param);
/* Copy data into the pieces iov[0..n), in order. */
void kvb__am_scatter(const ucp_dt_iov_t *iov, size_t n, const uint8_t *data);
/* The same with the driver (pieces in device memory), in device's context:
 * data (host, contiguous) into the pieces (in), or the pieces gathered into
 * data. Waited for. KVB_OK, KVB_ERR_NOMEM or KVB_ERR_IO (why). */
kvb_status_t kvb__am_cuda_copy(int device, const ucp_dt_iov_t *iov, size_t n, void *data, bool in,
                               char *why, size_t wl);

#endif
