/* Control-channel frame codec (internal): encode, decode and validate the
 * ZeroMQ multipart messages of the SGLang Mooncake connector dialect
 * (docs/protocol-frames.md) plus kvbridge's trailing "key=value" extension
 * frames. Pure functions: no ZeroMQ, no I/O, no threads, no global state; every
 * function is reentrant and may be called from any thread on distinct objects.
 *
 * Decoding never allocates: decoded messages are views that point into the
 * input frames and stay valid exactly as long as those frame bytes (and, for
 * the ext array, the frame array itself) stay alive and unchanged. Strings are
 * NOT NUL-terminated. Packed arrays are native-endian and may be unaligned;
 * read them with kvb__u64_at() / kvb__i32_at(). Every byte of the input is
 * treated as hostile. */
#ifndef KVB_PROTO_FRAMES_H
#define KVB_PROTO_FRAMES_H

#include <kvbridge/common.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* One frame of a multipart message: len bytes at data (data may be NULL when
 * len is 0). The codec never writes through it. */
typedef struct kvb__frame {
    const uint8_t *data;
    size_t len;
} kvb__frame_t;

/* Limits of the dialect as kvbridge enforces them (docs/protocol-frames.md). */
#define KVB__FRAMES_MAX_STR 255    /* ip and session id, bytes */
#define KVB__FRAMES_MAX_EXT 64     /* trailing extension frames per message */
#define KVB__FRAMES_MAX_KEY 32     /* extension key, bytes */
#define KVB__FRAMES_REASON_MAX 320 /* reason text incl. NUL */

/* kvbridge's extension marker (docs/protocol-frames.md, "Extension frames"):
 * a registration or transfer info carrying kvbridge extensions has this
 * frame after its dialect's frames, then the "key=value" extension frames.
 * A receiver counts the frames before it as the dialect's, so extensions
 * are never read as another dialect's frames. Sent only to a peer known to
 * be kvbridge (its bootstrap registration said so): SGLang's and
 * TokenSpeed's parsers know nothing of it. */
#define KVB__EXT_MARKER "kvbridge-ext/1"

/* Decoders: return the status of expr unless it is KVB_OK. */
#define KVB__FRAMES_TRY(expr)                                                                      \
    do {                                                                                           \
        kvb_status_t st_ = (expr);                                                                 \
        if (st_ != KVB_OK)                                                                         \
            return st_;                                                                            \
    } while (0)

/* Wire status values (PROTOCOL.md "Status values"). */
enum {
    KVB__WIRE_FAILED = 0,
    KVB__WIRE_BOOTSTRAPPING = 1,
    KVB__WIRE_WAITING_FOR_INPUT = 2,
    KVB__WIRE_TRANSFERRING = 3,
    KVB__WIRE_SUCCESS = 4
};

/* Why a message was rejected. reason is one line naming the message kind, the
 * frame index and name, and the offending value (escaped, truncated). has_room
 * says whether the message's room frame parsed, so the connector can fail that
 * room. Plain data owned by the caller; no destroy needed. */
typedef struct kvb__frames_err {
    bool has_room;
    uint64_t room;
    char reason[KVB__FRAMES_REASON_MAX];
} kvb__frames_err_t;

/* Packed native-endian arrays. count elements of 8 (u64) or 4 (i32) bytes at
 * data, any alignment. A decoded view points into its frame; to encode from a
 * C array use kvb__u64_view_of() / kvb__i32_view_of(). */
typedef struct kvb__u64_view {
    const uint8_t *data;
    size_t count;
} kvb__u64_view_t;
typedef struct kvb__i32_view {
    const uint8_t *data;
    size_t count;
} kvb__i32_view_t;

/* Element i of a view (caller guarantees i < count). Unaligned-safe. */
static inline uint64_t kvb__u64_at(kvb__u64_view_t v, size_t i)
{
    uint64_t x;
    memcpy(&x, v.data + i * 8, 8);
    return x;
}
static inline int32_t kvb__i32_at(kvb__i32_view_t v, size_t i)
{
    int32_t x;
    memcpy(&x, v.data + i * 4, 4);
    return x;
}
/* View of a caller array (borrowed; keep it alive while the view is used). */
static inline kvb__u64_view_t kvb__u64_view_of(const uint64_t *a, size_t n)
{
    kvb__u64_view_t v = {(const uint8_t *)a, n};
    return v;
}
static inline kvb__i32_view_t kvb__i32_view_of(const int32_t *a, size_t n)
{
    kvb__i32_view_t v = {(const uint8_t *)a, n};
    return v;
}

/* ---- messages ----
 * Each struct is both the decoder's output (views into the input frames) and
 * the encoder's input (views into caller memory). ext/n_ext: on decode, every
 * extension frame after the marker in wire order ("key=value", keys strictly
 * ascending), known keys included; on encode, extra extension frames to send:
 * those whose key this version knows are skipped (the typed has_* field is
 * authoritative), so a decoded message re-encodes to identical frames. The
 * encoder writes the marker before the first extension frame, and neither
 * when there is none. */

/* Decode → prefill KV-args registration (frame 0 "None", 9 frames, then
 * the marker and extensions when any).
 * Known extension: "state_ptrs" (packed u64, Mamba/linear-attention state
 * buffer bases). dst_tp_rank is the decode engine rank; it may exceed
 * dst_attn_tp_size under DP attention, so no order between them is checked. */
typedef struct kvb__reg_msg {
    const char *ip; /* frame 1, ip_len bytes, not NUL-terminated */
    size_t ip_len;
    uint16_t port;          /* frame 2, 1..65535 */
    const char *session_id; /* frame 3, "host:port" or "[v6]:port" */
    size_t session_id_len;
    kvb__u64_view_t kv_ptrs;  /* frame 4, >= 1 entry, none zero */
    kvb__u64_view_t aux_ptrs; /* frame 5, may be empty, none zero */
    int32_t dst_tp_rank;      /* frame 6, >= 0 */
    int32_t dst_attn_tp_size; /* frame 7, >= 1 */
    int64_t dst_kv_item_len;  /* frame 8, >= 1 */
    bool has_state_ptrs;
    kvb__u64_view_t state_ptrs; /* ext "state_ptrs", none zero */
    const kvb__frame_t *ext;
    size_t n_ext;
} kvb__reg_msg_t;

/* Decode → prefill transfer info for one room (7 frames, then the marker
 * and extensions when any). Dummy iff
 * frames 4 and 5 are both empty; then pages.count == 0 and aux_index is -1.
 * Known extensions: "page_mask" (one byte 0/1 per page index, count equal to
 * pages.count), "prefix_len" (decimal >= 0, decode prefix length in tokens),
 * "state_idx" (packed int32 >= 0), "epoch" (decimal >= 1: the decode's writer
 * grant the prefill must stamp on this room's writes, docs/engine.md "The
 * writer fence"). Page and state indices are only checked to
 * be >= 0 here; check them against the pool with kvb__frames_check_indices(). */
typedef struct kvb__xfer_msg {
    uint64_t room; /* frame 0 */
    const char *ip;
    size_t ip_len;
    uint16_t port;
    const char *session_id;
    size_t session_id_len;
    bool is_dummy;
    kvb__i32_view_t pages;         /* frame 4 */
    int32_t aux_index;             /* frame 5, >= 0; -1 when dummy */
    int32_t required_dst_info_num; /* frame 6, >= 1 */
    bool has_page_mask;
    const uint8_t *page_mask; /* pages.count bytes, each 0 or 1 */
    bool has_prefix_len;
    int64_t prefix_len;
    bool has_state_idx;
    kvb__i32_view_t state_idx;
    bool has_epoch;
    uint64_t epoch;
    const kvb__frame_t *ext;
    size_t n_ext;
} kvb__xfer_msg_t;

/* Prefill → decode status (exactly 3 frames: a seed-001 decode unpacks three
 * and raises on more, so status carries no extensions). */
typedef struct kvb__status_msg {
    uint64_t room;
    int32_t status;       /* KVB__WIRE_*, 0..4 */
    int32_t prefill_rank; /* >= 0 */
} kvb__status_msg_t;

/* Prefill → decode inline aux data (exactly 6 frames). Buffer index, aux
 * index and payload length are only checked in themselves here; check them
 * against the decode's aux buffers with kvb__frames_check_aux(). */
typedef struct kvb__aux_msg {
    uint64_t room;          /* frame 1 */
    int32_t buffer_index;   /* frame 2, >= 0 */
    int32_t aux_index;      /* frame 3, >= 0 */
    const uint8_t *payload; /* frame 5; frame 4 is its length, big-endian u32 */
    size_t payload_len;
} kvb__aux_msg_t;

/* ---- classification ---- */
typedef enum kvb__msg_kind {
    KVB__MSG_UNKNOWN = 0,
    KVB__MSG_REGISTRATION, /* frame 0 is "None", <= 9 dialect frames */
    KVB__MSG_TRANSFER,     /* frame 0 digits, 7 dialect frames */
    KVB__MSG_STATUS,       /* frame 0 digits, exactly 3 frames */
    KVB__MSG_AUX,          /* frame 0 is "AUX_DATA" */
    /* SGLang's 2026 dialect (frames26.h): a registration with >= 10
     * dialect frames, a transfer info with >= 8. */
    KVB__MSG_REGISTRATION26,
    KVB__MSG_TRANSFER26,
    KVB__MSG_ABORT,     /* frame 0 "ABORT" */
    KVB__MSG_ABORT_ACK, /* frame 0 "ABORT_ACK" */
    KVB__MSG_STAGING    /* STAGING_REQ/STAGING_RSP/CHUNK_READY/WATERMARK: unsupported */
} kvb__msg_kind_t;

/* The dialect's frames of a message: those before the first marker frame
 * (n when there is none). */
size_t kvb__frames_dialect_count(const kvb__frame_t *frames, size_t n);

/* Which message a multipart is, from frame 0 and the count of dialect frames
 * (kvb__frames_dialect_count), as the seed's receivers dispatch. Validates nothing else: the
 * decoder does. A side expecting one kind (a decode rank: status or aux) may instead call that
 * decoder on anything not classified, to get a reason and the room. */
kvb__msg_kind_t kvb__frames_classify(const kvb__frame_t *frames, size_t n);
/* "registration", "transfer info", "status", "aux data", "registration (2026)",
 * "transfer info (2026)", "abort", "abort ack", "staging" or "unknown". Static. */
const char *kvb__frames_kind_name(kvb__msg_kind_t kind);

/* ---- decoding ----
 * Validate frames[0..n) as the given message and fill *msg_p (views into
 * frames, see the file comment). On success returns KVB_OK and writes only
 * *msg_p. On a malformed message returns KVB_ERR_PROTO, leaves *msg_p alone
 * and, when err is not NULL, fills *err (reason, room when parsed); frames may
 * be NULL only when n is 0. Never logs: the connector decides. */
kvb_status_t kvb__frames_decode_registration(const kvb__frame_t *frames, size_t n,
                                             kvb__frames_err_t *err, kvb__reg_msg_t *msg_p);
kvb_status_t kvb__frames_decode_transfer(const kvb__frame_t *frames, size_t n,
                                         kvb__frames_err_t *err, kvb__xfer_msg_t *msg_p);
kvb_status_t kvb__frames_decode_status(const kvb__frame_t *frames, size_t n, kvb__frames_err_t *err,
                                       kvb__status_msg_t *msg_p);
kvb_status_t kvb__frames_decode_aux(const kvb__frame_t *frames, size_t n, kvb__frames_err_t *err,
                                    kvb__aux_msg_t *msg_p);

/* ---- semantic checks the caller owns the bounds for ----
 * Every index of idx must be < pool_size (they are already >= 0 when decoded;
 * a negative one is rejected too). what names the array in the reason, e.g.
 * "transfer info frame 4 (dst page indices)". KVB_OK, or KVB_ERR_PROTO with
 * the first offending position and value in *err (err may be NULL; its room
 * fields are left alone). */
kvb_status_t kvb__frames_check_indices(kvb__i32_view_t idx, uint64_t pool_size, const char *what,
                                       kvb__frames_err_t *err);
/* Check an aux message against the decode's aux buffers: buffer_index <
 * n_buffers, aux_index < n_items[buffer_index], payload_len ==
 * item_lens[buffer_index]. KVB_OK or KVB_ERR_PROTO with the reason and the
 * message's room in *err (err may be NULL). */
kvb_status_t kvb__frames_check_aux(const kvb__aux_msg_t *msg, size_t n_buffers,
                                   const uint64_t *item_lens, const uint64_t *n_items,
                                   kvb__frames_err_t *err);

/* ---- encoding ----
 * Caller-owned growable output: frame i is bytes [start(i), end(i)) of data.
 * Init once, reset between messages, free at the end. Not thread-safe; one
 * owner at a time. */
typedef struct kvb__frames_buf {
    uint8_t *data;
    size_t len, cap;
    size_t *ends; /* ends[i] = offset one past frame i */
    size_t n, cap_frames;
} kvb__frames_buf_t;

/* Empty buffer, no allocation. */
void kvb__frames_buf_init(kvb__frames_buf_t *b);
/* Forget all frames, keep the memory. */
void kvb__frames_buf_reset(kvb__frames_buf_t *b);
/* Release the memory; b is then as after init. */
void kvb__frames_buf_free(kvb__frames_buf_t *b);
/* Frame i (i < b->n). The view is valid until the next append, reset or
 * free of b. */
kvb__frame_t kvb__frames_buf_get(const kvb__frames_buf_t *b, size_t i);

/* Append the frames of msg to out (reset out first to hold one message).
 * The result is checked with the decoder, so kvbridge never sends what it
 * would reject: an invalid field gives KVB_ERR_INVALID with the decoder's
 * reason in *err (err may be NULL); allocation failure gives KVB_ERR_NOMEM.
 * On any error out holds the frames it held before (its memory may have
 * grown). Bytes are identical to what seed 001 sends for the same values. */
kvb_status_t kvb__frames_encode_registration(const kvb__reg_msg_t *msg, kvb__frames_err_t *err,
                                             kvb__frames_buf_t *out);
kvb_status_t kvb__frames_encode_transfer(const kvb__xfer_msg_t *msg, kvb__frames_err_t *err,
                                         kvb__frames_buf_t *out);
kvb_status_t kvb__frames_encode_status(const kvb__status_msg_t *msg, kvb__frames_err_t *err,
                                       kvb__frames_buf_t *out);
kvb_status_t kvb__frames_encode_aux(const kvb__aux_msg_t *msg, kvb__frames_err_t *err,
                                    kvb__frames_buf_t *out);

#endif
