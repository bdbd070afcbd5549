/* Control-channel frame codec, TokenSpeed's dialect (seed 004; internal):
 * the 8-frame KV-args, the 12/14-frame transfer info with its int64 page
 * indices and decode-computed plan (frames 12-13, a versioned JSON array),
 * and the 5-frame status (PROTOCOL-TOKENSPEED.md sections 4 and 7;
 * docs/tokenspeed-fields.md). Same rules as frames.h: the frame decoders are
 * pure, never allocate, return views into the input frames and treat every
 * byte as hostile; only the plan parser allocates (its result is owned by
 * the caller). Callable from any thread. */
#ifndef KVB_PROTO_FRAMES_TS_H
#define KVB_PROTO_FRAMES_TS_H

#include "proto/frames.h"

#define KVB__REGTS_FRAMES 8    /* KV-args: tag, ip, port, sid, kv, aux (empty), state, prefix */
#define KVB__XFERTS_FRAMES 12  /* transfer info without a plan */
#define KVB__XFERTS_PLAN 14    /* ... with frames 12 (version) and 13 (plan JSON) */
#define KVB__STATUSTS_FRAMES 5 /* room, status, sender, first token, candidates */
#define KVB__TS_PLAN_VERSION 1 /* TRANSFER_PLAN_PROTOCOL_VERSION (spec 7.5) */
#define KVB__TS_PLAN_MAX_JSON (256u << 10) /* bytes of frame 13 kvbridge parses */
#define KVB__TS_PLAN_MAX_FRAGS 4096        /* fragments of one plan, before layout caps */

/* TokenSpeed's status values (TransferPoll, spec 1): 4 is Transferring here,
 * Success in both SGLang dialects. */
enum {
    KVB__TS_FAILED = 0,
    KVB__TS_BOOTSTRAPPING = 1,
    KVB__TS_BOOTSTRAPPED = 2,
    KVB__TS_WAITING_FOR_INPUT = 3,
    KVB__TS_TRANSFERRING = 4,
    KVB__TS_SUCCESS = 5
};

/* Packed native-endian int64 array (numpy int64 tobytes), any alignment. */
typedef struct kvb__i64_view {
    const uint8_t *data;
    size_t count;
} kvb__i64_view_t;

static inline int64_t kvb__i64_at(kvb__i64_view_t v, size_t i)
{
    int64_t x;
    memcpy(&x, v.data + i * 8, 8);
    return x;
}

/* KV-args registration (D -> P), exactly 8 frames: frame 5 empty (TokenSpeed
 * removed aux buffers and kept the slot), frame 6 flat u64 state pointers
 * (not SGLang 2026's list of lists), frame 7 a decimal the prefill never
 * reads (TokenSpeed always sends 0). */
typedef struct kvb__regts_msg {
    const char *ip; /* 1 */
    size_t ip_len;
    uint16_t port;          /* 2 */
    const char *session_id; /* 3 */
    size_t session_id_len;
    kvb__u64_view_t kv_ptrs;    /* 4, >= 1 entry, none zero */
    kvb__u64_view_t state_ptrs; /* 6, may be empty, none zero */
    int64_t prefix_len;         /* 7, >= 0 */
} kvb__regts_msg_t;

/* Transfer info (D -> P), 12 frames, or 14 with a plan. Dummy iff frames 4
 * and 5 are both empty (then frames 7-11 empty too and no plan). */
typedef struct kvb__xferts_msg {
    uint64_t room; /* 0 */
    const char *ip;
    size_t ip_len;
    uint16_t port;
    const char *session_id;
    size_t session_id_len;
    bool is_dummy;
    kvb__i64_view_t pages;         /* 4: the decode's missing pages, each >= 0 */
    int64_t aux_index;             /* 5: the decode's request slot (unused); -1 dummy */
    int32_t required_dst_info_num; /* 6, >= 1 */
    int64_t prefix_len;            /* 7: tokens the decode holds (0 for a dummy) */
    int32_t l1_5;                  /* 8: dst_indices_are_local, 0 or 1 (1: refused later) */
    size_t mask_len;               /* 9: L1.5 page mask bytes (non-zero: refused later) */
    size_t local_len;              /* 10: L1.5 local indices bytes (idem) */
    kvb__i64_view_t state_idx;     /* 11: decode state slots, each >= 0 */
    bool has_plan;                 /* frames 12-13 present and non-empty */
    const uint8_t *plan_json;      /* 13 (not parsed here: kvb__ts_plan_parse) */
    size_t plan_len;
} kvb__xferts_msg_t;

/* Status (P -> D), exactly 5 frames. candidates: int32 token ids (frame 4,
 * empty = none). */
typedef struct kvb__statusts_msg {
    uint64_t room;
    int32_t status;      /* KVB__TS_*, 0..5 */
    int32_t sender;      /* the prefill's TP rank inside its DP group */
    int64_t first_token; /* -1: none */
    kvb__i32_view_t candidates;
} kvb__statusts_msg_t;

/* One fragment of a decode-computed plan (spec 7.5): bytes_per_page bytes at
 * src_byte_offset of every source item go to dst_byte_offset of the matching
 * destination item. page_count 0 means JSON null (all pages of each run). */
typedef enum kvb__ts_kind {
    KVB__TS_TARGET_K = 0,
    KVB__TS_TARGET_V,
    KVB__TS_DRAFT_K,
    KVB__TS_DRAFT_V,
    KVB__TS_MAMBA_STATE
} kvb__ts_kind_t;

typedef struct kvb__ts_frag {
    uint64_t buffer_index;
    kvb__ts_kind_t kind;
    int64_t src_rank, dst_rank;
    uint64_t src_stride, dst_stride; /* *_page_stride_bytes */
    uint64_t src_off, dst_off;       /* *_byte_offset */
    uint64_t bytes;                  /* bytes_per_page, >= 1 */
    uint64_t page_count;             /* 0: null */
} kvb__ts_frag_t;

typedef struct kvb__ts_plan {
    size_t n;
    kvb__ts_frag_t *frags; /* n entries, owned */
} kvb__ts_plan_t;

/* Decoders: as in frames.h (KVB_OK, or KVB_ERR_PROTO with *err; the room is
 * in *err when frame 0 parsed). Frame counts are exact: a TokenSpeed peer
 * sends exactly these, and kvbridge's own extension frames follow a marker,
 * never these shapes. */
kvb_status_t kvb__frames_decode_registration_ts(const kvb__frame_t *frames, size_t n,
                                                kvb__frames_err_t *err, kvb__regts_msg_t *msg_p);
kvb_status_t kvb__frames_decode_transfer_ts(const kvb__frame_t *frames, size_t n,
                                            kvb__frames_err_t *err, kvb__xferts_msg_t *msg_p);
kvb_status_t kvb__frames_decode_status_ts(const kvb__frame_t *frames, size_t n,
                                          kvb__frames_err_t *err, kvb__statusts_msg_t *msg_p);

/* Encoders: as in frames.h (checked with the decoder; out unchanged on
 * error). The registration always sends an empty frame 5 and "0" in frame 7
 * (what TokenSpeed sends); the transfer info sends 12 frames, or 14 when
 * msg->has_plan (plan_json then holds the JSON text, version 1). */
kvb_status_t kvb__frames_encode_registration_ts(const kvb__regts_msg_t *msg, kvb__frames_err_t *err,
                                                kvb__frames_buf_t *out);
kvb_status_t kvb__frames_encode_transfer_ts(const kvb__xferts_msg_t *msg, kvb__frames_err_t *err,
                                            kvb__frames_buf_t *out);
kvb_status_t kvb__frames_encode_status_ts(const kvb__statusts_msg_t *msg, kvb__frames_err_t *err,
                                          kvb__frames_buf_t *out);

/* Parse frame 13 (json, len bytes) into *plan_p (caller frees with
 * kvb__ts_plan_free). Strict (spec 7.7 rules 6-8): at most
 * KVB__TS_PLAN_MAX_JSON bytes and max_frags fragments (<=
 * KVB__TS_PLAN_MAX_FRAGS); a non-empty array of objects with exactly the ten
 * keys, each numeric value a JSON integer (no float, string or boolean),
 * buffer_index/strides/offsets >= 0, strides and bytes_per_page >= 1,
 * page_count null or >= 1, a known buffer_kind. KVB_ERR_PROTO with a
 * one-line reason; KVB_ERR_NOMEM. Allocates. */
kvb_status_t kvb__ts_plan_parse(const uint8_t *json, size_t len, size_t max_frags,
                                kvb__ts_plan_t *plan_p, char *reason, size_t reason_len);
/* The JSON array TokenSpeed's encode_transfer_fragments writes for these
 * fragments (keys in its order, compact separators); malloc'ed text in
 * *json_p, its length in *len_p. KVB_ERR_NOMEM. */
kvb_status_t kvb__ts_plan_encode(const kvb__ts_frag_t *frags, size_t n, char **json_p,
                                 size_t *len_p);
void kvb__ts_plan_free(kvb__ts_plan_t *plan); /* NULL-safe; zeroes it */
const char *kvb__ts_kind_name(kvb__ts_kind_t kind);

/* ---- shared with frames.c (defined there: the same field rules) ---- */
/* Frames 1-3 (ip, port, session id) of a decode message of kind (the reason
 * prefix), with frame 0 a room (has_room) or the tag "None". */
kvb_status_t kvb__frames_decode_peer(const kvb__frame_t *frames, size_t n, const char *kind,
                                     bool room_first, kvb__frames_err_t *err, uint64_t *room_p,
                                     uint16_t *port_p);
/* Frame f (index idx, name) as canonical decimal in [min, max]; the reason
 * in err, prefixed with kind; err->has_room/room as given. */
kvb_status_t kvb__frames_need_int(const kvb__frame_t *f, size_t idx, const char *kind,
                                  const char *name, int64_t min, int64_t max, bool has_room,
                                  uint64_t room, kvb__frames_err_t *err, int64_t *out_p);
/* Append one frame of len bytes to b; false on no memory. */
bool kvb__frames_put(kvb__frames_buf_t *b, const void *p, size_t len);

#endif
