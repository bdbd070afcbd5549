/* Helpers shared by the CachePD dialect's files (internal to
 * src/dialect/cachepd/): refusal reasons, a growable text buffer that writes
 * JSON the way Python's json.dumps does, and strict jansson accessors. */
#ifndef KVB_DIALECT_CACHEPD_INT_H
#define KVB_DIALECT_CACHEPD_INT_H

#include "core/core.h"
#include "dialect/cachepd/cachepd.h"

#include <jansson.h>

/* Fill err (when not NULL) with a printable one-line reason and the room;
 * return KVB_ERR_PROTO. */
kvb_status_t kvb__cpd_fail(kvb__frames_err_t *err, bool has_room, uint64_t room, const char *fmt,
                           ...) KVB_PRINTF(4, 5);
/* Peer text shown in a reason: printable ASCII, others as \xNN, at most 48
 * bytes then "...". out must hold 256 bytes. Returns out. */
const char *kvb__cpd_show(const char *s, size_t len, char out[256]);

/* Growable text; on allocation failure oom is set and later puts do nothing. */
typedef struct kvb__cpd_buf {
    char *p;
    size_t len, cap;
    bool oom;
} kvb__cpd_buf_t;
void kvb__cpd_put(kvb__cpd_buf_t *b, const char *s, size_t n);
void kvb__cpd_puts(kvb__cpd_buf_t *b, const char *s);
void kvb__cpd_put_u64(kvb__cpd_buf_t *b, uint64_t v);
void kvb__cpd_put_i64(kvb__cpd_buf_t *b, int64_t v);
/* An optional integer: -1 is JSON null. */
void kvb__cpd_put_opt(kvb__cpd_buf_t *b, int64_t v);
/* A JSON string as Python's json.dumps writes it (ensure_ascii: '"', '\\',
 * \n \r \t \b \f, other controls and non-ASCII bytes as \u00xx). */
void kvb__cpd_put_jstr(kvb__cpd_buf_t *b, const char *s, size_t n);
/* Hand the text over: KVB_ERR_NOMEM after a failed put (the buffer freed),
 * else *text_p / *len_p (NUL-terminated). */
kvb_status_t kvb__cpd_buf_take(kvb__cpd_buf_t *b, char **text_p, size_t *len_p);

/* Parse untrusted JSON text strictly (one value, no duplicate keys). NULL
 * with the reason ("<prefix>: invalid <what> JSON at byte N: ...") in err. */
json_t *kvb__cpd_json_load(const char *text, size_t len, const char *prefix, const char *what,
                           kvb__frames_err_t *err);
/* Member key of obj as an integer in [min, max] (a JSON integer; never a
 * boolean, float or string). what/key name it in the reason. */
kvb_status_t kvb__cpd_get_u64(json_t *obj, const char *what, const char *key, uint64_t min,
                              uint64_t max, kvb__frames_err_t *err, uint64_t *out_p);
/* The same, JSON null allowed (then -1) when nullable; absent = null when
 * optional. Values in [min, INT64_MAX]. */
kvb_status_t kvb__cpd_get_opt(json_t *obj, const char *what, const char *key, bool optional,
                              uint64_t min, kvb__frames_err_t *err, int64_t *out_p);
/* Member key as an id: a string of 1..KVB__CPD_MAX_ID printable ASCII bytes;
 * *out_p is a malloc'ed copy. KVB_ERR_PROTO, KVB_ERR_NOMEM. */
kvb_status_t kvb__cpd_get_id(json_t *obj, const char *what, const char *key, kvb__frames_err_t *err,
                             char **out_p);
/* Member key as an array of at most max entries. */
kvb_status_t kvb__cpd_get_array(json_t *obj, const char *what, const char *key, size_t max,
                                kvb__frames_err_t *err, json_t **out_p);
/* obj is an object whose keys are all in keys[0..n) (TokenSpeed builds these
 * entries with Class(**entry): an unknown key is a TypeError). */
kvb_status_t kvb__cpd_only_keys(json_t *obj, const char *what, const char *const *keys, size_t n,
                                kvb__frames_err_t *err);

/* Canonical unsigned decimal frame (TokenSpeed's _bounded_ascii_uint): 1 to
 * digits(max) bytes of 0-9, no leading zero, value in [min, max]. */
bool kvb__cpd_canon_uint(const uint8_t *p, size_t n, uint64_t min, uint64_t max, uint64_t *out_p);
/* Non-empty, at most max bytes, every byte ASCII (< 0x80). */
bool kvb__cpd_ascii(const uint8_t *p, size_t n, size_t max);

#endif
