/* Control-channel frames (internal): the multipart message views, limits,
 * errors and the output buffer every dialect's codec (src/dialect/<name>/
 * frames.h) builds on, plus kvbridge's trailing "key=value" extension
 * frames after its marker. Pure functions: no ZeroMQ, no I/O, no threads, no global state; every
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

/* The dialect's frames of a message: those before the first marker frame
 * (n when there is none). */
size_t kvb__frames_dialect_count(const kvb__frame_t *frames, size_t n);

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

#endif
