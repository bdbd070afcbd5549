/* Control-channel frame codec, SGLang's 2026 dialect (internal): the
 * messages of PROTOCOL-SGLANG-2026.md sections 4-5 that differ from seed 001
 * (18-frame KV-args, 10-frame transfer info, ABORT, ABORT_ACK), next to the
 * seed-001 codec (dialect/sglang2025/frames.h). Status (3 frames) and
 * AUX_DATA (6 frames) are the same in both dialects: use that one for them. Same rules as frames.h:
 * pure functions, no allocation while decoding, views into the input frames,
 * every byte hostile. docs/protocol-frames.md, "The 2026 dialect". */
#ifndef KVB_DIALECT_SGLANG2026_FRAMES_H
#define KVB_DIALECT_SGLANG2026_FRAMES_H

#include "dialect/sglang2025/frames.h"

/* Message kinds, as reasons and logs name them. */
#define KVB__KIND_REG26 "registration (2026)"
#define KVB__KIND_XFER26 "transfer info (2026)"
#define KVB__KIND_ABORT "abort"
#define KVB__KIND_ACK "abort ack"

/* Frame counts SGLang sends; the 2026 prefill parser accepts from 10 / 8. */
#define KVB__REG26_FRAMES 18
#define KVB__REG26_MIN 10
#define KVB__REG26_MAX 20 /* SGLang 0.5.23 sends 20 (frames 18, 19) */
#define KVB__XFER26_FRAMES 10
#define KVB__XFER26_MIN 8
#define KVB__LOL_MAX_LISTS 64 /* state components kvbridge accepts per message */

/* Packed list of lists (spec 4 "LoL"): little-endian u32 count n, n u32
 * byte lengths, then the payloads back to back; an empty frame is no list.
 * elem is the element width (4 or 8). Decoded views point into the frame. */
typedef struct kvb__lol_view {
    const uint8_t *data; /* the whole frame */
    size_t len;
    uint32_t n;
    uint8_t elem;
} kvb__lol_view_t;

/* List i (i < v.n): *data_p its payload (unaligned), *count_p its elements. */
void kvb__lol_list(kvb__lol_view_t v, uint32_t i, const uint8_t **data_p, size_t *count_p);
/* Element k of list i as unsigned (4 or 8 bytes, little-endian). */
uint64_t kvb__lol_at(kvb__lol_view_t v, uint32_t i, size_t k);
/* Pack one list of count elements of elem bytes (native = little-endian
 * hosts) into a malloc'ed LoL frame: *buf_p (caller frees), *view_p over it.
 * count 0 gives the 8-byte "one empty list". KVB_ERR_NOMEM / KVB_ERR_INVALID. */
kvb_status_t kvb__lol_pack_one(const void *elems, size_t count, unsigned elem, uint8_t **buf_p,
                               kvb__lol_view_t *view_p);

typedef struct kvb__u32_view {
    const uint8_t *data;
    size_t count;
} kvb__u32_view_t;

/* KV-args registration, 2026 (frame 0 "None", 10..20 dialect frames, then
 * the marker and kvbridge extensions when any). Absent frames 10..19 take
 * the spec's defaults. */
typedef struct kvb__reg26_msg {
    const char *ip; /* 1 */
    size_t ip_len;
    uint16_t port;          /* 2 */
    const char *session_id; /* 3 */
    size_t session_id_len;
    kvb__u64_view_t kv_ptrs;         /* 4, none zero; empty only with item_len 0 */
    kvb__u64_view_t aux_ptrs;        /* 5, none zero */
    kvb__lol_view_t state_ptrs;      /* 6, LoL<Q>, none zero */
    int32_t dst_tp_rank;             /* 7, >= 0 */
    int32_t dst_attn_tp_size;        /* 8, >= 1 */
    int64_t dst_kv_item_len;         /* 9, >= 1 (0 with no KV buffers) */
    kvb__lol_view_t state_item_lens; /* 10, LoL<I>: empty or shaped as 6 */
    kvb__lol_view_t state_dims;      /* 11, LoL<I>: empty, or one list per component */
    kvb__u32_view_t kv_layer_ids;    /* 12, u32[]: empty or one per kv_ptrs entry */
    kvb__lol_view_t state_layer_ids; /* 13, LoL<I>: empty or shaped as 6 */
    bool has_staging_base;           /* 14 was 8 bytes */
    uint64_t staging_base;
    uint64_t staging_size; /* 15, 0 when empty/absent */
    int32_t dcp_size;      /* 16, >= 1 (1 when empty/absent) */
    int32_t dcp_rank;      /* 17, 0..dcp_size-1 (0 when empty/absent) */
    /* SGLang >= 0.5.23 (after the spec's commit): frames 18 and 19. */
    kvb__u64_view_t staging_slot_ids; /* 18, u64[]: ignored (no staging) */
    kvb__u64_view_t kv_item_lens;     /* 19, u64[]: empty or one per kv_ptrs entry, >= 1 */
    size_t n_fixed;                   /* dialect frames present, 10..20 */
    const kvb__frame_t *ext;          /* after the marker (kvbridge "key=value") */
    size_t n_ext;
} kvb__reg26_msg_t;

/* Transfer info, 2026 (8..10 dialect frames, then the marker and kvbridge
 * extensions when any). Dummy iff frames 4 and 5 are both empty (then
 * frame 6 must be empty too). Known extensions: "epoch" (decimal >= 1),
 * "page_mask" (pages.count bytes, each 0 or 1). */
typedef struct kvb__xfer26_msg {
    uint64_t room; /* 0 */
    const char *ip;
    size_t ip_len;
    uint16_t port;
    const char *session_id;
    size_t session_id_len;
    bool is_dummy;
    kvb__i32_view_t pages;         /* 4, each >= 0 (suffix pages only) */
    int32_t aux_index;             /* 5, >= 0; -1 when dummy */
    kvb__lol_view_t state_idx;     /* 6, LoL<i>, each >= 0 */
    int32_t required_dst_info_num; /* 7, >= 1 */
    bool has_prefix_len;           /* 8 present and not empty */
    int64_t prefix_len;            /* tokens the decode already holds */
    kvb__i32_view_t device_pages;  /* 9, HiSparse device pages, each >= 0 */
    bool has_epoch;
    uint64_t epoch;
    bool has_page_mask;       /* kvbridge extension "page_mask": one byte 0/1 per */
    const uint8_t *page_mask; /* frame-4 page (1 = write it) */
    size_t n_fixed;           /* 8..10 */
    const kvb__frame_t *ext;
    size_t n_ext;
} kvb__xfer26_msg_t;

/* ABORT (decode -> prefill), 4 frames, or 5 with SGLang 0.5.23's
 * generation (its deferred decode KV release, on by default there): the ACK
 * must echo it or that decode ignores the ACK. */
typedef struct kvb__abort_msg {
    uint64_t room;
    const char *ip;
    size_t ip_len;
    uint16_t port; /* the decode's PULL port: where the ACK goes */
    bool has_generation;
    uint64_t generation; /* 4, decimal */
} kvb__abort_msg_t;

/* ABORT_ACK (prefill -> decode): 2 frames, or 3 with the sender's
 * prefill_unique_rank (SGLang's deferred mode; kvbridge always sends 3 and
 * only once no write of the room can land). */
typedef struct kvb__abort_ack_msg {
    uint64_t room;
    bool has_rank;
    int32_t rank;
    bool has_generation; /* 4 frames (SGLang 0.5.23): the ABORT's generation */
    uint64_t generation;
} kvb__abort_ack_msg_t;

/* Decoders: as in frames.h (KVB_OK, or KVB_ERR_PROTO with *err). */
kvb_status_t kvb__frames_decode_registration26(const kvb__frame_t *frames, size_t n,
                                               kvb__frames_err_t *err, kvb__reg26_msg_t *msg_p);
kvb_status_t kvb__frames_decode_transfer26(const kvb__frame_t *frames, size_t n,
                                           kvb__frames_err_t *err, kvb__xfer26_msg_t *msg_p);
kvb_status_t kvb__frames_decode_abort(const kvb__frame_t *frames, size_t n, kvb__frames_err_t *err,
                                      kvb__abort_msg_t *msg_p);
kvb_status_t kvb__frames_decode_abort_ack(const kvb__frame_t *frames, size_t n,
                                          kvb__frames_err_t *err, kvb__abort_ack_msg_t *msg_p);

/* Encoders: as in frames.h. Registration and transfer info always emit all
 * 18 / 10 dialect frames (empty frames for what is absent), then, when
 * msg->ext or "epoch=" / "page_mask=" are given, the marker and those
 * extension frames; pass no extensions for a peer that is not kvbridge. */
kvb_status_t kvb__frames_encode_registration26(const kvb__reg26_msg_t *msg, kvb__frames_err_t *err,
                                               kvb__frames_buf_t *out);
kvb_status_t kvb__frames_encode_transfer26(const kvb__xfer26_msg_t *msg, kvb__frames_err_t *err,
                                           kvb__frames_buf_t *out);
kvb_status_t kvb__frames_encode_abort(const kvb__abort_msg_t *msg, kvb__frames_err_t *err,
                                      kvb__frames_buf_t *out);
kvb_status_t kvb__frames_encode_abort_ack(const kvb__abort_ack_msg_t *msg, kvb__frames_err_t *err,
                                          kvb__frames_buf_t *out);

#endif
