/* Wire format of the engine's message lane (UCX active messages), parsed on
 * the progress thread from peer-controlled bytes. Pure functions: no I/O, no
 * locks, no allocation (fuzzed by tests/fuzz/fuzz_amwire.c).
 *
 * Write header (writer → target), little-endian:
 *   u32 magic "KVBW" | u32 nd | u64 xfer id | u64 msg id | u64 total bytes |
 *   u64 epoch | nd × (u64 dst | u64 len | u64 stride | u32 count | u32 zero)
 * msg id: the writer's tag in the high 32 bits (writer fencing, 0 = none),
 * its sequence in the low 32 (echoed in the ack). epoch: the writer grant
 * the write is made under (fence.c; 0 = the legacy tag-only fence). A descriptor names count
 * pieces of len bytes at dst, dst + stride, ... (count 1: one run, stride 0;
 * count > 1: stride >= len, so pieces never overlap); its whole span lies
 * inside one target registration. Strided descriptors carry head slices
 * (1 KiB rows every 2 KiB for a TP2 -> TP1 pair) sixteen to a descriptor.
 * The payload is the pieces' bytes in order.
 * Ack header (target → writer):
 *   u32 magic "KVBA" | i32 status | u64 xfer id | u64 msg id | u32 rl |
 *   rl bytes of reason
 * Read request (reader → target, on the write message ids, so it passes the
 * same token check): the write header with magic "KVBR", no payload, total
 * = the bytes asked for (at most AM_READ_MAX), the descriptors naming the
 * target's ranges. Answer: an ack; with status 0 its payload is exactly
 * total bytes, the pieces' bytes in order (else a refusal's reason). */
#ifndef KVB_ENGINE_AMWIRE_H
#define KVB_ENGINE_AMWIRE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* The UCX active-message ids of the message lane. */
#define KVB_AM_WRITE 11      /* writer → target: descriptors in header, bytes as data */
#define KVB_AM_ACK 12        /* target → writer: placed (or refused) */
#define KVB_AM_WRITE_AUTH 13 /* as KVB_AM_WRITE, the peer's token (engine secret) first */

#define AM_HDR_FIXED 40
#define AM_DESC 32
#define AM_ACK_FIXED 28
#define AM_MAX_PIECES 4096u        /* pieces (IOV entries) one message may name */
#define AM_MAGIC_WRITE 0x5742564bu /* "KVBW" (with the epoch; "KVBV" had none) */
#define AM_MAGIC_ACK 0x4142564bu   /* "KVBA" */
#define AM_MAGIC_READ 0x5242564bu  /* "KVBR" */
#define AM_READ_MAX (16ull << 20)  /* bytes one read request may ask for */
/* A target answers at most AM_READS_MAX answers of at most AM_READ_BYTES_MAX
 * bytes in all at once, and of them at most an eighth to one connection
 * (one reply endpoint): AM_READS_CONN_MAX answers, AM_READ_CONN_BYTES_MAX
 * bytes (at least one answer of AM_READ_MAX). Past either it refuses the
 * request with KVB_ERR_BUSY ("... try again"); a reader keeps its requests
 * in flight on one connection within the share (msg.c), so only a reader
 * that ignores it, or many readers at once, are refused. */
#define AM_READS_MAX 256u
#define AM_READ_BYTES_MAX (256ull << 20)
#define AM_READS_CONN_MAX (AM_READS_MAX / 8)
#define AM_READ_CONN_BYTES_MAX (AM_READ_BYTES_MAX / 8)

static inline uint64_t kvb__am_u64(const uint8_t *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

static inline void kvb__am_put_u64(uint8_t *p, uint64_t v)
{
    memcpy(p, &v, 8);
}

typedef struct kvb__am_desc {
    uint64_t dst, len, stride;
    uint32_t count;
} kvb__am_desc_t;

/* Check a write header of hlen bytes announcing a payload of length bytes:
 * magic, nd >= 1, exactly nd well-formed descriptors (count 1..AM_MAX_PIECES,
 * zero padding, stride 0 for one piece and >= len > 0 for more, span
 * computable without overflow), at most AM_MAX_PIECES pieces in all, the total
 * field and the sum of the piece lengths (no overflow) equal to length. On
 * success *nd_p = nd and *pieces_p = the number of pieces; on failure nothing
 * is written. Destination ranges are not checked here (that needs the
 * registrations: am_validate in target.c, over kvb__am_desc_span). */
bool kvb__am_parse_write_header(const uint8_t *h, size_t hlen, size_t length, uint32_t *nd_p,
                                uint32_t *pieces_p);

/* Check a read request of hlen bytes with a payload of length bytes: as a
 * write header, but magic "KVBR", no payload (length 0) and a total of
 * 1..AM_READ_MAX bytes, which *total_p gets. */
bool kvb__am_parse_read_header(const uint8_t *h, size_t hlen, size_t length, uint32_t *nd_p,
                               uint32_t *pieces_p, uint64_t *total_p);

/* Descriptor i (< nd of an accepted header). */
void kvb__am_write_desc(const uint8_t *h, uint32_t i, kvb__am_desc_t *d);

/* Store descriptor i of a header being built. */
void kvb__am_put_desc(uint8_t *h, uint32_t i, const kvb__am_desc_t *d);

/* Bytes from d->dst to the end of its last piece; false on overflow. */
bool kvb__am_desc_span(const kvb__am_desc_t *d, uint64_t *span_p);

/* Check an ack header: magic and a reason length that matches hlen exactly.
 * On success fills the outputs (*reason_p points into h); else writes none. */
bool kvb__am_parse_ack(const uint8_t *h, size_t hlen, int32_t *status_p, uint64_t *xfer_id_p,
                       uint64_t *msg_id_p, const uint8_t **reason_p, uint32_t *reason_len_p);

#endif
