/* The field rules of the control-frame codecs (frames_kit.h) and the
 * frame buffer (frames.h). The dialects' messages: src/dialect/<name>/frames.c. */
#include "proto/frames_kit.h"

#include "core/core.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

const char *const kvb__fk_reg_known[] = {"state_ptrs", NULL};
const char *const kvb__fk_xfer_known[] = {"epoch", "page_mask", "prefix_len", "state_idx", NULL};

/* ---- reason text ---- */

/* Quote up to 32 bytes of peer data for a one-line reason: printable ASCII
 * as is, everything else escaped, so a reason never carries control bytes. */
void kvb__fk_quote(char *buf, size_t cap, const uint8_t *p, size_t len)
{
    static const char hex[] = "0123456789abcdef";
    size_t shown = len < 32 ? len : 32, o = 0;
    buf[o++] = '"';
    for (size_t i = 0; i < shown && o + 6 < cap; i++) {
        uint8_t c = p[i];
        if (c == '"' || c == '\\') {
            buf[o++] = '\\';
            buf[o++] = (char)c;
        } else if (c >= 0x20 && c < 0x7f) {
            buf[o++] = (char)c;
        } else {
            buf[o++] = '\\';
            buf[o++] = 'x';
            buf[o++] = hex[c >> 4];
            buf[o++] = hex[c & 15];
        }
    }
    buf[o++] = '"';
    buf[o] = '\0';
    if (shown < len)
        snprintf(buf + o, cap - o, "... (%zu bytes)", len);
}

kvb_status_t kvb__fk_vfail(kvb__fk_ctx_t *c, int frame, const char *name, const char *fmt,
                           va_list ap)
{
    if (c->err == NULL)
        return KVB_ERR_PROTO;
    char *r = c->err->reason;
    size_t cap = sizeof(c->err->reason);
    int o;
    if (frame >= 0)
        o = snprintf(r, cap, "%s frame %d (%s): ", c->kind, frame, name);
    else
        o = snprintf(r, cap, "%s: ", c->kind);
    if (o > 0 && (size_t)o < cap)
        vsnprintf(r + o, cap - (size_t)o, fmt, ap);
    c->err->has_room = c->has_room;
    c->err->room = c->has_room ? c->room : 0;
    return KVB_ERR_PROTO;
}

kvb_status_t kvb__fk_fail(kvb__fk_ctx_t *c, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    kvb_status_t st = kvb__fk_vfail(c, -1, NULL, fmt, ap);
    va_end(ap);
    return st;
}

kvb_status_t kvb__fk_fail_frame(kvb__fk_ctx_t *c, size_t frame, const char *name, const char *fmt,
                                ...)
{
    va_list ap;
    va_start(ap, fmt);
    kvb_status_t st = kvb__fk_vfail(c, (int)frame, name, fmt, ap);
    va_end(ap);
    return st;
}

/* ---- scalar fields ---- */

bool kvb__fk_frame_is(const kvb__frame_t *f, const char *lit, size_t lit_len)
{
    return f->len == lit_len && memcmp(f->data, lit, lit_len) == 0;
}

/* Canonical decimal: digits only, no sign, no leading zero (what Python's
 * str(int) produces), so that a re-encode gives the same bytes. */
bool kvb__fk_tag_is(const kvb__frame_t *f, const char *lit)
{
    return kvb__fk_frame_is(f, lit, strlen(lit));
}

bool kvb__fk_canonical_digits(const uint8_t *p, size_t len)
{
    if (len == 0 || (p[0] == '0' && len > 1))
        return false;
    for (size_t i = 0; i < len; i++)
        if (p[i] < '0' || p[i] > '9')
            return false;
    return true;
}

/* Room: uint64 (SGLang rooms are Python ints the router draws in [0, 2^63);
 * kvbridge accepts the whole uint64 range so no valid peer room is refused). */
bool kvb__fk_parse_room(const kvb__frame_t *f, uint64_t *out_p)
{
    uint64_t acc = 0;
    if (!kvb__fk_canonical_digits(f->data, f->len) || f->len > 20)
        return false;
    for (size_t i = 0; i < f->len; i++)
        if (!kvb__mul_u64(acc, 10, &acc) || !kvb__add_u64(acc, (uint64_t)(f->data[i] - '0'), &acc))
            return false;
    *out_p = acc;
    return true;
}

kvb_status_t kvb__fk_need_room(kvb__fk_ctx_t *c, const kvb__frame_t *f, size_t idx, uint64_t *out_p)
{
    char q[200];
    if (kvb__fk_parse_room(f, out_p))
        return KVB_OK;
    kvb__fk_quote(q, sizeof(q), f->data, f->len);
    return kvb__fk_fail_frame(c, idx, "room",
                              "%s is not a decimal integer in 0..18446744073709551615", q);
}

kvb_status_t kvb__fk_need_int(kvb__fk_ctx_t *c, const kvb__frame_t *f, size_t idx, const char *name,
                              int64_t min, int64_t max, int64_t *out_p)
{
    char q[200];
    int64_t v;
    *out_p = 0; /* on every path: gcc 12 -O3 cannot see that a failure is never read */
    kvb__fk_quote(q, sizeof(q), f->data, f->len);
    if (!kvb__fk_canonical_digits(f->data, f->len))
        return kvb__fk_fail_frame(c, idx, name,
                                  "%s is not a decimal integer (digits, no sign, no leading 0)", q);
    if (!kvb__parse_i64((const char *)f->data, f->len, 0, INT64_MAX, &v) || v < min || v > max)
        return kvb__fk_fail_frame(c, idx, name, "%s out of range %lld..%lld", q, (long long)min,
                                  (long long)max);
    *out_p = v;
    return KVB_OK;
}

kvb_status_t kvb__fk_need_i32(kvb__fk_ctx_t *c, const kvb__frame_t *f, size_t idx, const char *name,
                              int32_t min, int32_t *out_p)
{
    int64_t v;
    kvb_status_t st = kvb__fk_need_int(c, f, idx, name, min, INT32_MAX, &v);
    if (st == KVB_OK)
        *out_p = (int32_t)v;
    return st;
}

bool kvb__fk_host_char(uint8_t ch, bool allow_colon)
{
    return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
           ch == '.' || ch == '-' || ch == '_' || ch == '%' || (allow_colon && ch == ':');
}

/* The IP ends up in a ZeroMQ endpoint "tcp://ip:port": a tight charset keeps
 * a peer from injecting '*', '/', ';' or brackets into it. */
kvb_status_t kvb__fk_need_ip(kvb__fk_ctx_t *c, const kvb__frame_t *f, size_t idx)
{
    if (f->len == 0)
        return kvb__fk_fail_frame(c, idx, "ip", "empty");
    if (f->len > KVB__FRAMES_MAX_STR)
        return kvb__fk_fail_frame(c, idx, "ip", "%zu bytes, longer than %d", f->len,
                                  KVB__FRAMES_MAX_STR);
    for (size_t i = 0; i < f->len; i++)
        if (!kvb__fk_host_char(f->data[i], true))
            return kvb__fk_fail_frame(
                c, idx, "ip", "byte 0x%02x at offset %zu not allowed in an address", f->data[i], i);
    return KVB_OK;
}

kvb_status_t kvb__fk_need_session(kvb__fk_ctx_t *c, const kvb__frame_t *f, size_t idx)
{
    const uint8_t *p = f->data;
    size_t len = f->len, host_end, port_at;
    int64_t port;
    char q[200];
    if (len == 0)
        return kvb__fk_fail_frame(c, idx, "session id", "empty");
    if (len > KVB__FRAMES_MAX_STR)
        return kvb__fk_fail_frame(c, idx, "session id", "%zu bytes, longer than %d", len,
                                  KVB__FRAMES_MAX_STR);
    kvb__fk_quote(q, sizeof(q), p, len);
    if (p[0] == '[') {
        const uint8_t *close = memchr(p, ']', len);
        if (close == NULL)
            goto bad_form;
        host_end = (size_t)(close - p);
        if (host_end == 1 || host_end + 1 >= len || p[host_end + 1] != ':')
            goto bad_form;
        for (size_t i = 1; i < host_end; i++)
            if (!kvb__fk_host_char(p[i], true))
                goto bad_form;
        port_at = host_end + 2;
    } else {
        const uint8_t *colon = memchr(p, ':', len);
        if (colon == NULL || colon == p)
            goto bad_form;
        host_end = (size_t)(colon - p);
        for (size_t i = 0; i < host_end; i++)
            if (!kvb__fk_host_char(p[i], false))
                goto bad_form;
        port_at = host_end + 1;
    }
    if (!kvb__fk_canonical_digits(p + port_at, len - port_at) ||
        !kvb__parse_i64((const char *)p + port_at, len - port_at, 1, 65535, &port))
        goto bad_form;
    return KVB_OK;
bad_form:
    return kvb__fk_fail_frame(c, idx, "session id",
                              "%s is not host:port or [v6]:port (port 1..65535)", q);
}

kvb_status_t kvb__fk_need_u64_array(kvb__fk_ctx_t *c, const kvb__frame_t *f, size_t idx,
                                    const char *name, bool non_empty, kvb__u64_view_t *out_p)
{
    kvb__u64_view_t v = {f->data, f->len / 8};
    if (f->len % 8 != 0)
        return kvb__fk_fail_frame(c, idx, name, "length %zu is not a multiple of 8", f->len);
    if (non_empty && v.count == 0)
        return kvb__fk_fail_frame(c, idx, name, "empty");
    for (size_t i = 0; i < v.count; i++)
        if (kvb__u64_at(v, i) == 0)
            return kvb__fk_fail_frame(c, idx, name, "entry %zu is a null address", i);
    *out_p = v;
    return KVB_OK;
}

kvb_status_t kvb__fk_need_i32_array(kvb__fk_ctx_t *c, const kvb__frame_t *f, size_t idx,
                                    const char *name, kvb__i32_view_t *out_p)
{
    kvb__i32_view_t v = {f->data, f->len / 4};
    if (f->len % 4 != 0)
        return kvb__fk_fail_frame(c, idx, name, "length %zu is not a multiple of 4", f->len);
    for (size_t i = 0; i < v.count; i++) {
        int32_t x = kvb__i32_at(v, i);
        if (x < 0)
            return kvb__fk_fail_frame(c, idx, name, "entry %zu is negative (%d)", i, (int)x);
    }
    *out_p = v;
    return KVB_OK;
}

/* ---- extension frames ---- */

/* key = [a-z][a-z0-9_]{0,31}, then '=' */
bool kvb__fk_split_ext(const kvb__frame_t *f, kvb__fk_ext_kv_t *kv_p)
{
    size_t i = 0;
    if (f->len == 0 || f->data[0] < 'a' || f->data[0] > 'z')
        return false;
    for (i = 1; i < f->len && f->data[i] != '='; i++) {
        uint8_t ch = f->data[i];
        if (!((ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') || ch == '_'))
            return false;
    }
    if (i == f->len || i > KVB__FRAMES_MAX_KEY)
        return false;
    kv_p->key = f->data;
    kv_p->key_len = i;
    kv_p->val = f->data + i + 1;
    kv_p->val_len = f->len - i - 1;
    return true;
}

int kvb__fk_key_cmp(const uint8_t *a, size_t alen, const uint8_t *b, size_t blen)
{
    int r = memcmp(a, b, alen < blen ? alen : blen);
    if (r != 0)
        return r;
    return alen < blen ? -1 : alen > blen ? 1 : 0;
}

bool kvb__fk_key_is(const kvb__fk_ext_kv_t *kv, const char *lit)
{
    size_t n = strlen(lit);
    return kv->key_len == n && memcmp(kv->key, lit, n) == 0;
}

bool kvb__fk_known_key(const char *const *known, const kvb__fk_ext_kv_t *kv)
{
    for (size_t i = 0; known[i] != NULL; i++)
        if (kvb__fk_key_is(kv, known[i]))
            return true;
    return false;
}

/* Syntax, order and count of the extension frames [first, n) (those after
 * the marker); the caller then interprets the keys it knows and ignores the
 * others. */
kvb_status_t kvb__fk_check_ext(kvb__fk_ctx_t *c, const kvb__frame_t *frames, size_t first, size_t n)
{
    kvb__fk_ext_kv_t prev = {NULL, 0, NULL, 0}, kv;
    char q[200];
    if (n - first > KVB__FRAMES_MAX_EXT)
        return kvb__fk_fail(c, "%zu extension frames, at most %d allowed", n - first,
                            KVB__FRAMES_MAX_EXT);
    for (size_t i = first; i < n; i++) {
        if (!kvb__fk_split_ext(&frames[i], &kv)) {
            kvb__fk_quote(q, sizeof(q), frames[i].data, frames[i].len);
            return kvb__fk_fail_frame(c, i, "extension",
                                      "%s is not key=value (key [a-z][a-z0-9_]*, "
                                      "at most %d bytes)",
                                      q, KVB__FRAMES_MAX_KEY);
        }
        if (i > first && kvb__fk_key_cmp(prev.key, prev.key_len, kv.key, kv.key_len) >= 0)
            return kvb__fk_fail_frame(c, i, "extension",
                                      "key \"%.*s\" does not follow \"%.*s\" (keys "
                                      "must be strictly ascending)",
                                      (int)kv.key_len, (const char *)kv.key, (int)prev.key_len,
                                      (const char *)prev.key);
        prev = kv;
    }
    return KVB_OK;
}

/* ---- the extension marker ---- */

bool kvb__fk_is_marker(const kvb__frame_t *f)
{
    return kvb__fk_frame_is(f, KVB__EXT_MARKER, sizeof(KVB__EXT_MARKER) - 1);
}

size_t kvb__frames_dialect_count(const kvb__frame_t *frames, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (kvb__fk_is_marker(&frames[i]))
            return i;
    return n;
}

/* *nd_p: the dialect's frames (before the marker); *from_p: the first
 * extension frame (n when unmarked). The extensions are checked here; a
 * marker with nothing after it is refused (kvbridge never sends one, and
 * every accepted message has one encoding). */
kvb_status_t kvb__fk_split_marker(kvb__fk_ctx_t *c, const kvb__frame_t *frames, size_t n,
                                  size_t *nd_p, size_t *from_p)
{
    size_t nd = kvb__frames_dialect_count(frames, n);
    *nd_p = nd;
    *from_p = nd < n ? nd + 1 : n;
    if (nd < n && nd + 1 == n)
        return kvb__fk_fail_frame(c, nd, "marker",
                                  "\"" KVB__EXT_MARKER "\" with no extension after it");
    return kvb__fk_check_ext(c, frames, *from_p, n);
}

/* ---- decoders ---- */

/* The message's dialect frames (before the marker) number min..max; the
 * extensions after the marker are checked. *nd_p / *from_p as split_marker. */
kvb_status_t kvb__fk_need_frames(kvb__fk_ctx_t *c, const kvb__frame_t *frames, size_t n, size_t min,
                                 size_t max, size_t *nd_p, size_t *from_p)
{
    size_t nd = kvb__frames_dialect_count(frames, n);
    if (nd < min)
        return kvb__fk_fail(c, "expected at least %zu frames, got %zu", min, nd);
    if (nd > max)
        return kvb__fk_fail(c,
                            "%zu frames before any \"" KVB__EXT_MARKER
                            "\" marker, at most %zu (kvbridge "
                            "extensions follow the marker)",
                            nd, max);
    return kvb__fk_split_marker(c, frames, n, nd_p, from_p);
}

/* Frames 1-3 every decode message starts with after its tag or room:
 * control ip, port, session id (the message keeps views into them). */
kvb_status_t kvb__fk_need_peer(kvb__fk_ctx_t *c, const kvb__frame_t *frames, uint16_t *port_p)
{
    int64_t v;
    KVB__FRAMES_TRY(kvb__fk_need_ip(c, &frames[1], 1));
    KVB__FRAMES_TRY(kvb__fk_need_int(c, &frames[2], 2, "port", 1, 65535, &v));
    *port_p = (uint16_t)v;
    return kvb__fk_need_session(c, &frames[3], 3);
}

/* A registration's frames 0-3 (either dialect): "None", then need_peer. */
kvb_status_t kvb__fk_need_reg_head(kvb__fk_ctx_t *c, const kvb__frame_t *frames, uint16_t *port_p)
{
    char q[200];
    if (!kvb__fk_frame_is(&frames[0], KVB__FK_NONE_TAG, sizeof(KVB__FK_NONE_TAG) - 1)) {
        kvb__fk_quote(q, sizeof(q), frames[0].data, frames[0].len);
        return kvb__fk_fail_frame(c, 0, "tag", "%s is not \"None\"", q);
    }
    return kvb__fk_need_peer(c, frames, port_p);
}

/* ---- output buffer ---- */

void kvb__frames_buf_init(kvb__frames_buf_t *b)
{
    memset(b, 0, sizeof(*b));
}

void kvb__frames_buf_reset(kvb__frames_buf_t *b)
{
    b->len = 0;
    b->n = 0;
}

void kvb__frames_buf_free(kvb__frames_buf_t *b)
{
    free(b->data);
    free(b->ends);
    kvb__frames_buf_init(b);
}

kvb__frame_t kvb__frames_buf_get(const kvb__frames_buf_t *b, size_t i)
{
    size_t start = i == 0 ? 0 : b->ends[i - 1];
    kvb__frame_t f = {b->data + start, b->ends[i] - start};
    return f;
}

bool kvb__fk_grow(void **p, size_t *cap, size_t need, size_t elem)
{
    size_t nc = *cap ? *cap : 16;
    void *np;
    if (need <= *cap)
        return true;
    while (nc < need) {
        if (nc > SIZE_MAX / 2 / elem)
            return false;
        nc *= 2;
    }
    np = realloc(*p, nc * elem);
    if (np == NULL)
        return false;
    *p = np;
    *cap = nc;
    return true;
}

/* Append one frame made of up to three byte runs (e.g. key, '=', value). */
bool kvb__fk_put3(kvb__frames_buf_t *b, const void *a, size_t alen, const void *m, size_t mlen,
                  const void *z, size_t zlen)
{
    size_t total = alen + mlen;
    if (total < alen || total + zlen < total)
        return false;
    total += zlen;
    if (b->len + total < b->len || !kvb__fk_grow((void **)&b->data, &b->cap, b->len + total, 1) ||
        !kvb__fk_grow((void **)&b->ends, &b->cap_frames, b->n + 1, sizeof(size_t)))
        return false;
    if (alen)
        memcpy(b->data + b->len, a, alen);
    if (mlen)
        memcpy(b->data + b->len + alen, m, mlen);
    if (zlen)
        memcpy(b->data + b->len + alen + mlen, z, zlen);
    b->len += total;
    b->ends[b->n++] = b->len;
    return true;
}

bool kvb__fk_put(kvb__frames_buf_t *b, const void *p, size_t len)
{
    return kvb__fk_put3(b, p, len, NULL, 0, NULL, 0);
}

bool kvb__fk_put_u64(kvb__frames_buf_t *b, uint64_t v)
{
    char s[24];
    int k = snprintf(s, sizeof(s), "%llu", (unsigned long long)v);
    return kvb__fk_put(b, s, (size_t)k);
}

bool kvb__fk_put_i64(kvb__frames_buf_t *b, int64_t v)
{
    char s[24];
    int k = snprintf(s, sizeof(s), "%lld", (long long)v);
    return kvb__fk_put(b, s, (size_t)k);
}

/* One extension entry to emit; known-key values are built from typed fields. */

int kvb__fk_ext_out_cmp(const void *a, const void *b)
{
    const kvb__fk_ext_out_t *x = a, *y = b;
    return kvb__fk_key_cmp(x->key, x->key_len, y->key, y->key_len);
}

/* Emit the marker, then typed known entries and caller extras (minus known
 * keys) in key order; nothing at all when there are none. Extras that are
 * not key=value are passed through as is; the decoder check that follows
 * rejects them. */
kvb_status_t kvb__fk_put_ext(kvb__frames_buf_t *b, const char *const *known,
                             kvb__fk_ext_out_t *typed, size_t n_typed, const kvb__frame_t *ext,
                             size_t n_ext)
{
    kvb__fk_ext_out_t *all;
    size_t n = 0;
    kvb_status_t st = KVB_OK;
    if (n_typed + n_ext == 0)
        return KVB_OK;
    if (n_ext > SIZE_MAX / sizeof(*all) - n_typed)
        return KVB_ERR_NOMEM;
    all = malloc((n_typed + n_ext) * sizeof(*all));
    if (all == NULL)
        return KVB_ERR_NOMEM;
    for (size_t i = 0; i < n_typed; i++)
        all[n++] = typed[i];
    for (size_t i = 0; i < n_ext; i++) {
        kvb__fk_ext_kv_t kv;
        kvb__fk_ext_out_t e = {ext[i].data, ext[i].len, ext[i].data, ext[i].len, true};
        if (kvb__fk_split_ext(&ext[i], &kv)) {
            if (kvb__fk_known_key(known, &kv))
                continue;
            e.key_len = kv.key_len;
        }
        all[n++] = e;
    }
    qsort(all, n, sizeof(*all), kvb__fk_ext_out_cmp);
    if (n > 0 && !kvb__fk_put(b, KVB__EXT_MARKER, sizeof(KVB__EXT_MARKER) - 1))
        st = KVB_ERR_NOMEM;
    for (size_t i = 0; i < n && st == KVB_OK; i++) {
        bool ok = all[i].raw ? kvb__fk_put(b, all[i].val, all[i].val_len)
                             : kvb__fk_put3(b, all[i].key, all[i].key_len, "=", 1, all[i].val,
                                            all[i].val_len);
        if (!ok)
            st = KVB_ERR_NOMEM;
    }
    free(all);
    return st;
}

kvb__fk_ext_out_t kvb__fk_typed_ext(const char *key, const void *val, size_t len)
{
    kvb__fk_ext_out_t e = {(const uint8_t *)key, strlen(key), (const uint8_t *)val, len, false};
    return e;
}

/* The frames appended since n0, as an array the decoders take. */
kvb__frame_t *kvb__fk_appended(const kvb__frames_buf_t *b, size_t n0)
{
    kvb__frame_t *f = malloc((b->n - n0 + 1) * sizeof(*f));
    if (f == NULL)
        return NULL;
    for (size_t i = n0; i < b->n; i++)
        f[i - n0] = kvb__frames_buf_get(b, i);
    return f;
}

kvb_status_t kvb__fk_rollback(kvb__frames_buf_t *b, size_t n0, size_t len0, kvb_status_t st)
{
    b->n = n0;
    b->len = len0;
    return st;
}

bool kvb__fk_bad_view(const void *p, size_t len)
{
    return p == NULL && len != 0;
}

kvb_status_t kvb__fk_caller_error(kvb__frames_err_t *err, const char *kind, const char *what)
{
    if (err != NULL) {
        snprintf(err->reason, sizeof(err->reason), "%s: %s", kind, what);
        err->has_room = false;
        err->room = 0;
    }
    return KVB_ERR_INVALID;
}

/* Validate the appended frames with the decoder; a PROTO error there is the
 * caller's invalid field. */
/* ---- shared with the TokenSpeed codec (dialect/tokenspeed_seed/frames.c): the same field rules
 * ---- */

kvb_status_t kvb__frames_decode_peer(const kvb__frame_t *frames, size_t n, const char *kind,
                                     bool room_first, kvb__frames_err_t *err, uint64_t *room_p,
                                     uint16_t *port_p)
{
    kvb__fk_ctx_t c = {kind, err, false, 0};
    if (n < 4)
        return kvb__fk_fail(&c, "expected at least 4 frames, got %zu", n);
    if (!room_first)
        return kvb__fk_need_reg_head(&c, frames, port_p);
    c.has_room = kvb__fk_parse_room(&frames[0], &c.room);
    KVB__FRAMES_TRY(kvb__fk_need_room(&c, &frames[0], 0, room_p));
    return kvb__fk_need_peer(&c, frames, port_p);
}

kvb_status_t kvb__frames_need_int(const kvb__frame_t *f, size_t idx, const char *kind,
                                  const char *name, int64_t min, int64_t max, bool has_room,
                                  uint64_t room, kvb__frames_err_t *err, int64_t *out_p)
{
    kvb__fk_ctx_t c = {kind, err, has_room, room};
    return kvb__fk_need_int(&c, f, idx, name, min, max, out_p);
}

bool kvb__frames_put(kvb__frames_buf_t *b, const void *p, size_t len)
{
    return kvb__fk_put(b, p, len);
}
