/* Control-frame codec of SGLang's seed-001 dialect (internal; PROTOCOL.md,
 * docs/protocol-frames.md): its messages and the classification of SGLang
 * messages of both dialects. Same rules as proto/frames.h: pure functions,
 * no allocation while decoding, views into the input frames, every byte
 * hostile. */
#ifndef KVB_DIALECT_SGLANG2025_FRAMES_H
#define KVB_DIALECT_SGLANG2025_FRAMES_H

#include "proto/frames.h"

/* Wire status values (PROTOCOL.md "Status values"). */
enum {
    KVB__WIRE_FAILED = 0,
    KVB__WIRE_BOOTSTRAPPING = 1,
    KVB__WIRE_WAITING_FOR_INPUT = 2,
    KVB__WIRE_TRANSFERRING = 3,
    KVB__WIRE_SUCCESS = 4
};

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

/* Prefill → decode status (3 frames: a seed-001 decode unpacks three and
 * raises on more, so only a kvbridge decode gets the marker and extensions
 * after them: kv_digest=, docs/integrity.md). ext/n_ext as in kvb__reg_msg_t. */
typedef struct kvb__status_msg {
    uint64_t room;
    int32_t status;       /* KVB__WIRE_*, 0..4 */
    int32_t prefill_rank; /* >= 0 */
    const kvb__frame_t *ext;
    size_t n_ext;
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
