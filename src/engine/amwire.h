/* Wire format of the engine's message lane (UCX active messages), parsed on
 * the progress thread from peer-controlled bytes. Pure functions: no I/O, no
 * locks, no allocation (fuzzed by tests/fuzz/fuzz_amwire.c).
 *
 * Write header (writer → target), little-endian:
 *   u32 magic "KVBW" | u32 nd | u64 xfer id | u64 msg id | u64 total bytes |
 *   nd × (u64 dst | u64 len)
 * msg id: the writer's tag in the high 32 bits (writer fencing, 0 = none),
 * its sequence in the low 32 (echoed in the ack). Each descriptor is one
 * destination run inside one target registration; the payload is the runs'
 * bytes in order.
 * Ack header (target → writer):
 *   u32 magic "KVBA" | i32 status | u64 xfer id | u64 msg id | u32 rl |
 *   rl bytes of reason */
#ifndef KVB_ENGINE_AMWIRE_H
#define KVB_ENGINE_AMWIRE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define AM_HDR_FIXED 32
#define AM_DESC 16
#define AM_ACK_FIXED 28
#define AM_MAGIC_WRITE 0x5742564bu /* "KVBW" */
#define AM_MAGIC_ACK 0x4142564bu   /* "KVBA" */

/* Check a write header of hlen bytes announcing a payload of length bytes:
 * magic, nd >= 1, exactly nd descriptors, the total field and the sum of the
 * descriptor lengths (no overflow) equal to length. On success *nd_p = nd;
 * on failure nothing is written. Destination ranges are not checked here
 * (that needs the registrations: am_validate in xfer.c). */
bool kvb__am_parse_write_header(const uint8_t *h, size_t hlen, size_t length, uint32_t *nd_p);

/* Descriptor i (< nd of an accepted header): destination and length. */
void kvb__am_write_desc(const uint8_t *h, uint32_t i, uint64_t *dst_p, uint64_t *len_p);

/* Check an ack header: magic and a reason length that matches hlen exactly.
 * On success fills the outputs (*reason_p points into h); else writes none. */
bool kvb__am_parse_ack(const uint8_t *h, size_t hlen, int32_t *status_p, uint64_t *xfer_id_p,
                       uint64_t *msg_id_p, const uint8_t **reason_p, uint32_t *reason_len_p);

#endif
