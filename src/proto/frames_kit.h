/* The field rules every control-frame codec of the SGLang family shares
 * (internal to the codecs: proto/frames.c implements them; the dialects'
 * frames.c files in src/dialect/ use them): reason text naming the message
 * kind, frame index and offending value; scalar and array fields; kvbridge's
 * extension frames after the "kvbridge-ext/1" marker; appending frames to a
 * kvb__frames_buf_t with rollback. Pure functions, as frames.h says. */
#ifndef KVB_PROTO_FRAMES_KIT_H
#define KVB_PROTO_FRAMES_KIT_H

#include "core/core.h"
#include "proto/frames.h"

#include <stdarg.h>

#define KVB__FK_NONE_TAG "None" /* a registration's frame 0 */
#define KVB__FK_AUX_TAG "AUX_DATA"

/* kvbridge's extension keys a registration / transfer info decoder reads
 * (NULL-terminated); an encoder skips them in its extra extensions. */
extern const char *const kvb__fk_reg_known[];
extern const char *const kvb__fk_xfer_known[];

typedef struct dctx {
    const char *kind;
    kvb__frames_err_t *err;
    bool has_room;
    uint64_t room;
} kvb__fk_ctx_t;
typedef struct ext_kv {
    const uint8_t *key;
    size_t key_len;
    const uint8_t *val;
    size_t val_len;
} kvb__fk_ext_kv_t;
typedef struct ext_out {
    const uint8_t *key;
    size_t key_len;
    const uint8_t *val; /* whole frame when raw */
    size_t val_len;
    bool raw;
} kvb__fk_ext_out_t;

void kvb__fk_quote(char *buf, size_t cap, const uint8_t *p, size_t len);
kvb_status_t kvb__fk_vfail(kvb__fk_ctx_t *c, int frame, const char *name, const char *fmt,
                           va_list ap);
kvb_status_t kvb__fk_fail(kvb__fk_ctx_t *c, const char *fmt, ...) KVB_PRINTF(2, 3);
kvb_status_t kvb__fk_fail_frame(kvb__fk_ctx_t *c, size_t frame, const char *name, const char *fmt,
                                ...) KVB_PRINTF(4, 5);
bool kvb__fk_frame_is(const kvb__frame_t *f, const char *lit, size_t lit_len);
/* The frame is exactly the NUL-terminated literal. */
bool kvb__fk_tag_is(const kvb__frame_t *f, const char *lit);
bool kvb__fk_canonical_digits(const uint8_t *p, size_t len);
bool kvb__fk_parse_room(const kvb__frame_t *f, uint64_t *out_p);
kvb_status_t kvb__fk_need_room(kvb__fk_ctx_t *c, const kvb__frame_t *f, size_t idx,
                               uint64_t *out_p);
kvb_status_t kvb__fk_need_int(kvb__fk_ctx_t *c, const kvb__frame_t *f, size_t idx, const char *name,
                              int64_t min, int64_t max, int64_t *out_p);
kvb_status_t kvb__fk_need_i32(kvb__fk_ctx_t *c, const kvb__frame_t *f, size_t idx, const char *name,
                              int32_t min, int32_t *out_p);
bool kvb__fk_host_char(uint8_t ch, bool allow_colon);
kvb_status_t kvb__fk_need_ip(kvb__fk_ctx_t *c, const kvb__frame_t *f, size_t idx);
kvb_status_t kvb__fk_need_session(kvb__fk_ctx_t *c, const kvb__frame_t *f, size_t idx);
kvb_status_t kvb__fk_need_u64_array(kvb__fk_ctx_t *c, const kvb__frame_t *f, size_t idx,
                                    const char *name, bool non_empty, kvb__u64_view_t *out_p);
kvb_status_t kvb__fk_need_i32_array(kvb__fk_ctx_t *c, const kvb__frame_t *f, size_t idx,
                                    const char *name, kvb__i32_view_t *out_p);
bool kvb__fk_split_ext(const kvb__frame_t *f, kvb__fk_ext_kv_t *kv_p);
int kvb__fk_key_cmp(const uint8_t *a, size_t alen, const uint8_t *b, size_t blen);
bool kvb__fk_key_is(const kvb__fk_ext_kv_t *kv, const char *lit);
bool kvb__fk_known_key(const char *const *known, const kvb__fk_ext_kv_t *kv);
kvb_status_t kvb__fk_check_ext(kvb__fk_ctx_t *c, const kvb__frame_t *frames, size_t first,
                               size_t n);
bool kvb__fk_is_marker(const kvb__frame_t *f);
kvb_status_t kvb__fk_split_marker(kvb__fk_ctx_t *c, const kvb__frame_t *frames, size_t n,
                                  size_t *nd_p, size_t *from_p);
kvb_status_t kvb__fk_need_frames(kvb__fk_ctx_t *c, const kvb__frame_t *frames, size_t n, size_t min,
                                 size_t max, size_t *nd_p, size_t *from_p);
kvb_status_t kvb__fk_need_peer(kvb__fk_ctx_t *c, const kvb__frame_t *frames, uint16_t *port_p);
kvb_status_t kvb__fk_need_reg_head(kvb__fk_ctx_t *c, const kvb__frame_t *frames, uint16_t *port_p);
bool kvb__fk_grow(void **p, size_t *cap, size_t need, size_t elem);
bool kvb__fk_put3(kvb__frames_buf_t *b, const void *a, size_t alen, const void *m, size_t mlen,
                  const void *z, size_t zlen);
bool kvb__fk_put(kvb__frames_buf_t *b, const void *p, size_t len);
bool kvb__fk_put_u64(kvb__frames_buf_t *b, uint64_t v);
bool kvb__fk_put_i64(kvb__frames_buf_t *b, int64_t v);
int kvb__fk_ext_out_cmp(const void *a, const void *b);
kvb_status_t kvb__fk_put_ext(kvb__frames_buf_t *b, const char *const *known,
                             kvb__fk_ext_out_t *typed, size_t n_typed, const kvb__frame_t *ext,
                             size_t n_ext);
kvb__fk_ext_out_t kvb__fk_typed_ext(const char *key, const void *val, size_t len);
kvb__frame_t *kvb__fk_appended(const kvb__frames_buf_t *b, size_t n0);
kvb_status_t kvb__fk_rollback(kvb__frames_buf_t *b, size_t n0, size_t len0, kvb_status_t st);
bool kvb__fk_bad_view(const void *p, size_t len);
kvb_status_t kvb__fk_caller_error(kvb__frames_err_t *err, const char *kind, const char *what);

/* Validate the appended frames with the decoder; a PROTO error there is the
 * caller's invalid field. */
#define KVB__FK_VERIFY(b, n0, len0, err, decode, msgtype)                                          \
    do {                                                                                           \
        kvb__frame_t *f_ = kvb__fk_appended(b, n0);                                                \
        msgtype tmp_;                                                                              \
        kvb_status_t st_;                                                                          \
        if (f_ == NULL)                                                                            \
            return kvb__fk_rollback(b, n0, len0, KVB_ERR_NOMEM);                                   \
        st_ = decode(f_, (b)->n - (n0), err, &tmp_);                                               \
        free(f_);                                                                                  \
        if (st_ != KVB_OK)                                                                         \
            return kvb__fk_rollback(b, n0, len0, KVB_ERR_INVALID);                                 \
    } while (0)

#endif
