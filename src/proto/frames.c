/* Control-channel frame codec; see frames.h and docs/protocol-frames.md. */
#include "proto/frames.h"
#include "proto/frames26.h"

#include "core/core.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#define KIND_REG "registration"
#define KIND_XFER "transfer info"
#define KIND_STATUS "status"
#define KIND_AUX "aux data"
#define KIND_REG26 "registration (2026)"
#define KIND_XFER26 "transfer info (2026)"
#define KIND_ABORT "abort"
#define KIND_ACK "abort ack"

static const char NONE_TAG[] = "None";
static const char AUX_TAG[] = "AUX_DATA";

#define XFER_FRAMES 7
#define REG_FRAMES 9
#define STATUS_FRAMES 3
#define AUX_FRAMES 6

/* ---- reason text ---- */

typedef struct dctx {
    const char *kind;
    kvb__frames_err_t *err;
    bool has_room;
    uint64_t room;
} dctx_t;

/* Quote up to 32 bytes of peer data for a one-line reason: printable ASCII
 * as is, everything else escaped, so a reason never carries control bytes. */
static void quote(char *buf, size_t cap, const uint8_t *p, size_t len)
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

static kvb_status_t vfail(dctx_t *c, int frame, const char *name, const char *fmt, va_list ap)
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

static kvb_status_t fail(dctx_t *c, const char *fmt, ...) KVB_PRINTF(2, 3);
static kvb_status_t fail(dctx_t *c, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    kvb_status_t st = vfail(c, -1, NULL, fmt, ap);
    va_end(ap);
    return st;
}

static kvb_status_t fail_frame(dctx_t *c, size_t frame, const char *name, const char *fmt, ...)
    KVB_PRINTF(4, 5);
static kvb_status_t fail_frame(dctx_t *c, size_t frame, const char *name, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    kvb_status_t st = vfail(c, (int)frame, name, fmt, ap);
    va_end(ap);
    return st;
}

/* ---- scalar fields ---- */

static bool frame_is(const kvb__frame_t *f, const char *lit, size_t lit_len)
{
    return f->len == lit_len && memcmp(f->data, lit, lit_len) == 0;
}

/* Canonical decimal: digits only, no sign, no leading zero (what Python's
 * str(int) produces), so that a re-encode gives the same bytes. */
static bool canonical_digits(const uint8_t *p, size_t len)
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
static bool parse_room(const kvb__frame_t *f, uint64_t *out_p)
{
    uint64_t acc = 0;
    if (!canonical_digits(f->data, f->len) || f->len > 20)
        return false;
    for (size_t i = 0; i < f->len; i++)
        if (!kvb__mul_u64(acc, 10, &acc) || !kvb__add_u64(acc, (uint64_t)(f->data[i] - '0'), &acc))
            return false;
    *out_p = acc;
    return true;
}

static kvb_status_t need_room(dctx_t *c, const kvb__frame_t *f, size_t idx, uint64_t *out_p)
{
    char q[200];
    if (parse_room(f, out_p))
        return KVB_OK;
    quote(q, sizeof(q), f->data, f->len);
    return fail_frame(c, idx, "room", "%s is not a decimal integer in 0..18446744073709551615", q);
}

static kvb_status_t need_int(dctx_t *c, const kvb__frame_t *f, size_t idx, const char *name,
                             int64_t min, int64_t max, int64_t *out_p)
{
    char q[200];
    int64_t v;
    quote(q, sizeof(q), f->data, f->len);
    if (!canonical_digits(f->data, f->len))
        return fail_frame(c, idx, name,
                          "%s is not a decimal integer (digits, no sign, no leading 0)", q);
    if (!kvb__parse_i64((const char *)f->data, f->len, 0, INT64_MAX, &v) || v < min || v > max)
        return fail_frame(c, idx, name, "%s out of range %lld..%lld", q, (long long)min,
                          (long long)max);
    *out_p = v;
    return KVB_OK;
}

static kvb_status_t need_i32(dctx_t *c, const kvb__frame_t *f, size_t idx, const char *name,
                             int32_t min, int32_t *out_p)
{
    int64_t v;
    kvb_status_t st = need_int(c, f, idx, name, min, INT32_MAX, &v);
    if (st == KVB_OK)
        *out_p = (int32_t)v;
    return st;
}

static bool host_char(uint8_t ch, bool allow_colon)
{
    return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
           ch == '.' || ch == '-' || ch == '_' || ch == '%' || (allow_colon && ch == ':');
}

/* The IP ends up in a ZeroMQ endpoint "tcp://ip:port": a tight charset keeps
 * a peer from injecting '*', '/', ';' or brackets into it. */
static kvb_status_t need_ip(dctx_t *c, const kvb__frame_t *f, size_t idx)
{
    if (f->len == 0)
        return fail_frame(c, idx, "ip", "empty");
    if (f->len > KVB__FRAMES_MAX_STR)
        return fail_frame(c, idx, "ip", "%zu bytes, longer than %d", f->len, KVB__FRAMES_MAX_STR);
    for (size_t i = 0; i < f->len; i++)
        if (!host_char(f->data[i], true))
            return fail_frame(c, idx, "ip", "byte 0x%02x at offset %zu not allowed in an address",
                              f->data[i], i);
    return KVB_OK;
}

static kvb_status_t need_session(dctx_t *c, const kvb__frame_t *f, size_t idx)
{
    const uint8_t *p = f->data;
    size_t len = f->len, host_end, port_at;
    int64_t port;
    char q[200];
    if (len == 0)
        return fail_frame(c, idx, "session id", "empty");
    if (len > KVB__FRAMES_MAX_STR)
        return fail_frame(c, idx, "session id", "%zu bytes, longer than %d", len,
                          KVB__FRAMES_MAX_STR);
    quote(q, sizeof(q), p, len);
    if (p[0] == '[') {
        const uint8_t *close = memchr(p, ']', len);
        if (close == NULL)
            goto bad_form;
        host_end = (size_t)(close - p);
        if (host_end == 1 || host_end + 1 >= len || p[host_end + 1] != ':')
            goto bad_form;
        for (size_t i = 1; i < host_end; i++)
            if (!host_char(p[i], true))
                goto bad_form;
        port_at = host_end + 2;
    } else {
        const uint8_t *colon = memchr(p, ':', len);
        if (colon == NULL || colon == p)
            goto bad_form;
        host_end = (size_t)(colon - p);
        for (size_t i = 0; i < host_end; i++)
            if (!host_char(p[i], false))
                goto bad_form;
        port_at = host_end + 1;
    }
    if (!canonical_digits(p + port_at, len - port_at) ||
        !kvb__parse_i64((const char *)p + port_at, len - port_at, 1, 65535, &port))
        goto bad_form;
    return KVB_OK;
bad_form:
    return fail_frame(c, idx, "session id", "%s is not host:port or [v6]:port (port 1..65535)", q);
}

static kvb_status_t need_u64_array(dctx_t *c, const kvb__frame_t *f, size_t idx, const char *name,
                                   bool non_empty, kvb__u64_view_t *out_p)
{
    kvb__u64_view_t v = {f->data, f->len / 8};
    if (f->len % 8 != 0)
        return fail_frame(c, idx, name, "length %zu is not a multiple of 8", f->len);
    if (non_empty && v.count == 0)
        return fail_frame(c, idx, name, "empty");
    for (size_t i = 0; i < v.count; i++)
        if (kvb__u64_at(v, i) == 0)
            return fail_frame(c, idx, name, "entry %zu is a null address", i);
    *out_p = v;
    return KVB_OK;
}

static kvb_status_t need_i32_array(dctx_t *c, const kvb__frame_t *f, size_t idx, const char *name,
                                   kvb__i32_view_t *out_p)
{
    kvb__i32_view_t v = {f->data, f->len / 4};
    if (f->len % 4 != 0)
        return fail_frame(c, idx, name, "length %zu is not a multiple of 4", f->len);
    for (size_t i = 0; i < v.count; i++) {
        int32_t x = kvb__i32_at(v, i);
        if (x < 0)
            return fail_frame(c, idx, name, "entry %zu is negative (%d)", i, (int)x);
    }
    *out_p = v;
    return KVB_OK;
}

/* ---- extension frames ---- */

typedef struct ext_kv {
    const uint8_t *key;
    size_t key_len;
    const uint8_t *val;
    size_t val_len;
} ext_kv_t;

/* key = [a-z][a-z0-9_]{0,31}, then '=' */
static bool split_ext(const kvb__frame_t *f, ext_kv_t *kv_p)
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

static int key_cmp(const uint8_t *a, size_t alen, const uint8_t *b, size_t blen)
{
    int r = memcmp(a, b, alen < blen ? alen : blen);
    if (r != 0)
        return r;
    return alen < blen ? -1 : alen > blen ? 1 : 0;
}

static bool key_is(const ext_kv_t *kv, const char *lit)
{
    size_t n = strlen(lit);
    return kv->key_len == n && memcmp(kv->key, lit, n) == 0;
}

static const char *const REG_KNOWN[] = {"state_ptrs", NULL};
static const char *const XFER_KNOWN[] = {"epoch", "page_mask", "prefix_len", "state_idx", NULL};

static bool known_key(const char *const *known, const ext_kv_t *kv)
{
    for (size_t i = 0; known[i] != NULL; i++)
        if (key_is(kv, known[i]))
            return true;
    return false;
}

/* Syntax, order and count of the extension frames [first, n) (those after
 * the marker); the caller then interprets the keys it knows and ignores the
 * others. */
static kvb_status_t check_ext(dctx_t *c, const kvb__frame_t *frames, size_t first, size_t n)
{
    ext_kv_t prev = {NULL, 0, NULL, 0}, kv;
    char q[200];
    if (n - first > KVB__FRAMES_MAX_EXT)
        return fail(c, "%zu extension frames, at most %d allowed", n - first, KVB__FRAMES_MAX_EXT);
    for (size_t i = first; i < n; i++) {
        if (!split_ext(&frames[i], &kv)) {
            quote(q, sizeof(q), frames[i].data, frames[i].len);
            return fail_frame(c, i, "extension",
                              "%s is not key=value (key [a-z][a-z0-9_]*, "
                              "at most %d bytes)",
                              q, KVB__FRAMES_MAX_KEY);
        }
        if (i > first && key_cmp(prev.key, prev.key_len, kv.key, kv.key_len) >= 0)
            return fail_frame(c, i, "extension",
                              "key \"%.*s\" does not follow \"%.*s\" (keys "
                              "must be strictly ascending)",
                              (int)kv.key_len, (const char *)kv.key, (int)prev.key_len,
                              (const char *)prev.key);
        prev = kv;
    }
    return KVB_OK;
}

/* ---- the extension marker ---- */

static bool is_marker(const kvb__frame_t *f)
{
    return frame_is(f, KVB__EXT_MARKER, sizeof(KVB__EXT_MARKER) - 1);
}

size_t kvb__frames_dialect_count(const kvb__frame_t *frames, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (is_marker(&frames[i]))
            return i;
    return n;
}

/* *nd_p: the dialect's frames (before the marker); *from_p: the first
 * extension frame (n when unmarked). The extensions are checked here; a
 * marker with nothing after it is refused (kvbridge never sends one, and
 * every accepted message has one encoding). */
static kvb_status_t split_marker(dctx_t *c, const kvb__frame_t *frames, size_t n, size_t *nd_p,
                                 size_t *from_p)
{
    size_t nd = kvb__frames_dialect_count(frames, n);
    *nd_p = nd;
    *from_p = nd < n ? nd + 1 : n;
    if (nd < n && nd + 1 == n)
        return fail_frame(c, nd, "marker", "\"" KVB__EXT_MARKER "\" with no extension after it");
    return check_ext(c, frames, *from_p, n);
}

/* ---- classification ---- */

static bool tag_is(const kvb__frame_t *f, const char *lit)
{
    return frame_is(f, lit, strlen(lit));
}

/* Registrations and transfer infos are told apart by their dialect frames
 * alone (those before the marker): seed 001 has 9 / 7, SGLang 2026 at least
 * 10 / 8 (docs/protocol-frames.md, "Told apart from seed 001"). */
kvb__msg_kind_t kvb__frames_classify(const kvb__frame_t *frames, size_t n)
{
    uint64_t room;
    if (n == 0)
        return KVB__MSG_UNKNOWN;
    if (frame_is(&frames[0], NONE_TAG, sizeof(NONE_TAG) - 1))
        return kvb__frames_dialect_count(frames, n) >= KVB__REG26_MIN ? KVB__MSG_REGISTRATION26
                                                                      : KVB__MSG_REGISTRATION;
    if (frame_is(&frames[0], AUX_TAG, sizeof(AUX_TAG) - 1))
        return KVB__MSG_AUX;
    if (tag_is(&frames[0], "ABORT"))
        return KVB__MSG_ABORT;
    if (tag_is(&frames[0], "ABORT_ACK"))
        return KVB__MSG_ABORT_ACK;
    if (tag_is(&frames[0], "STAGING_REQ") || tag_is(&frames[0], "STAGING_RSP") ||
        tag_is(&frames[0], "CHUNK_READY") || tag_is(&frames[0], "WATERMARK"))
        return KVB__MSG_STAGING;
    if (!parse_room(&frames[0], &room))
        return KVB__MSG_UNKNOWN;
    if (n == STATUS_FRAMES)
        return KVB__MSG_STATUS;
    size_t nd = kvb__frames_dialect_count(frames, n);
    if (nd >= KVB__XFER26_MIN)
        return KVB__MSG_TRANSFER26;
    if (nd >= XFER_FRAMES)
        return KVB__MSG_TRANSFER;
    return KVB__MSG_UNKNOWN;
}

const char *kvb__frames_kind_name(kvb__msg_kind_t kind)
{
    switch (kind) {
    case KVB__MSG_REGISTRATION:
        return KIND_REG;
    case KVB__MSG_TRANSFER:
        return KIND_XFER;
    case KVB__MSG_STATUS:
        return KIND_STATUS;
    case KVB__MSG_AUX:
        return KIND_AUX;
    case KVB__MSG_REGISTRATION26:
        return KIND_REG26;
    case KVB__MSG_TRANSFER26:
        return KIND_XFER26;
    case KVB__MSG_ABORT:
        return KIND_ABORT;
    case KVB__MSG_ABORT_ACK:
        return KIND_ACK;
    case KVB__MSG_STAGING:
        return "staging";
    default:
        return "unknown";
    }
}

/* ---- decoders ---- */

/* The message's dialect frames (before the marker) number min..max; the
 * extensions after the marker are checked. *nd_p / *from_p as split_marker. */
static kvb_status_t need_frames(dctx_t *c, const kvb__frame_t *frames, size_t n, size_t min,
                                size_t max, size_t *nd_p, size_t *from_p)
{
    size_t nd = kvb__frames_dialect_count(frames, n);
    if (nd < min)
        return fail(c, "expected at least %zu frames, got %zu", min, nd);
    if (nd > max)
        return fail(c,
                    "%zu frames before any \"" KVB__EXT_MARKER "\" marker, at most %zu (kvbridge "
                    "extensions follow the marker)",
                    nd, max);
    return split_marker(c, frames, n, nd_p, from_p);
}

/* Frames 1-3 every decode message starts with after its tag or room:
 * control ip, port, session id (the message keeps views into them). */
static kvb_status_t need_peer(dctx_t *c, const kvb__frame_t *frames, uint16_t *port_p)
{
    int64_t v;
    KVB__FRAMES_TRY(need_ip(c, &frames[1], 1));
    KVB__FRAMES_TRY(need_int(c, &frames[2], 2, "port", 1, 65535, &v));
    *port_p = (uint16_t)v;
    return need_session(c, &frames[3], 3);
}

/* A registration's frames 0-3 (either dialect): "None", then need_peer. */
static kvb_status_t need_reg_head(dctx_t *c, const kvb__frame_t *frames, uint16_t *port_p)
{
    char q[200];
    if (!frame_is(&frames[0], NONE_TAG, sizeof(NONE_TAG) - 1)) {
        quote(q, sizeof(q), frames[0].data, frames[0].len);
        return fail_frame(c, 0, "tag", "%s is not \"None\"", q);
    }
    return need_peer(c, frames, port_p);
}

kvb_status_t kvb__frames_decode_registration(const kvb__frame_t *frames, size_t n,
                                             kvb__frames_err_t *err, kvb__reg_msg_t *msg_p)
{
    dctx_t c = {KIND_REG, err, false, 0};
    kvb__reg_msg_t m;
    memset(&m, 0, sizeof(m));
    size_t nd, from;
    KVB__FRAMES_TRY(need_frames(&c, frames, n, REG_FRAMES, REG_FRAMES, &nd, &from));
    KVB__FRAMES_TRY(need_reg_head(&c, frames, &m.port));
    KVB__FRAMES_TRY(need_u64_array(&c, &frames[4], 4, "kv_ptrs", true, &m.kv_ptrs));
    KVB__FRAMES_TRY(need_u64_array(&c, &frames[5], 5, "aux_ptrs", false, &m.aux_ptrs));
    KVB__FRAMES_TRY(need_i32(&c, &frames[6], 6, "dst_tp_rank", 0, &m.dst_tp_rank));
    KVB__FRAMES_TRY(need_i32(&c, &frames[7], 7, "dst_attn_tp_size", 1, &m.dst_attn_tp_size));
    KVB__FRAMES_TRY(
        need_int(&c, &frames[8], 8, "dst_kv_item_len", 1, INT64_MAX, &m.dst_kv_item_len));
    for (size_t i = from; i < n; i++) {
        ext_kv_t kv;
        kvb__frame_t val;
        split_ext(&frames[i], &kv);
        val.data = kv.val;
        val.len = kv.val_len;
        if (key_is(&kv, "state_ptrs")) {
            KVB__FRAMES_TRY(
                need_u64_array(&c, &val, i, "extension state_ptrs", false, &m.state_ptrs));
            m.has_state_ptrs = true;
        }
    }
    m.ip = (const char *)frames[1].data;
    m.ip_len = frames[1].len;
    m.session_id = (const char *)frames[3].data;
    m.session_id_len = frames[3].len;
    m.ext = n > from ? &frames[from] : NULL;
    m.n_ext = n - from;
    *msg_p = m;
    return KVB_OK;
}

kvb_status_t kvb__frames_decode_transfer(const kvb__frame_t *frames, size_t n,
                                         kvb__frames_err_t *err, kvb__xfer_msg_t *msg_p)
{
    dctx_t c = {KIND_XFER, err, false, 0};
    kvb__xfer_msg_t m;
    memset(&m, 0, sizeof(m));
    if (n >= 1)
        c.has_room = parse_room(&frames[0], &c.room);
    size_t nd, from;
    KVB__FRAMES_TRY(need_frames(&c, frames, n, XFER_FRAMES, XFER_FRAMES, &nd, &from));
    KVB__FRAMES_TRY(need_room(&c, &frames[0], 0, &m.room));
    KVB__FRAMES_TRY(need_peer(&c, frames, &m.port));
    m.is_dummy = frames[4].len == 0 && frames[5].len == 0;
    m.aux_index = -1;
    if (!m.is_dummy) {
        KVB__FRAMES_TRY(need_i32_array(&c, &frames[4], 4, "dst page indices", &m.pages));
        if (frames[5].len == 0)
            return fail_frame(&c, 5, "aux index", "empty while frame 4 holds %zu page indices",
                              m.pages.count);
        KVB__FRAMES_TRY(need_i32(&c, &frames[5], 5, "aux index", 0, &m.aux_index));
    }
    KVB__FRAMES_TRY(
        need_i32(&c, &frames[6], 6, "required_dst_info_num", 1, &m.required_dst_info_num));
    for (size_t i = from; i < n; i++) {
        ext_kv_t kv;
        kvb__frame_t val;
        split_ext(&frames[i], &kv);
        val.data = kv.val;
        val.len = kv.val_len;
        if (key_is(&kv, "page_mask")) {
            if (val.len != m.pages.count)
                return fail_frame(&c, i, "extension page_mask", "%zu bytes for %zu page indices",
                                  val.len, m.pages.count);
            for (size_t k = 0; k < val.len; k++)
                if (val.data[k] > 1)
                    return fail_frame(&c, i, "extension page_mask",
                                      "byte %zu is 0x%02x, expected 0 or 1", k, val.data[k]);
            m.has_page_mask = true;
            m.page_mask = val.data;
        } else if (key_is(&kv, "prefix_len")) {
            KVB__FRAMES_TRY(
                need_int(&c, &val, i, "extension prefix_len", 0, INT64_MAX, &m.prefix_len));
            m.has_prefix_len = true;
        } else if (key_is(&kv, "state_idx")) {
            KVB__FRAMES_TRY(need_i32_array(&c, &val, i, "extension state_idx", &m.state_idx));
            m.has_state_idx = true;
        } else if (key_is(&kv, "epoch")) {
            int64_t ep;
            KVB__FRAMES_TRY(need_int(&c, &val, i, "extension epoch", 1, INT64_MAX, &ep));
            m.has_epoch = true;
            m.epoch = (uint64_t)ep;
        }
    }
    m.ip = (const char *)frames[1].data;
    m.ip_len = frames[1].len;
    m.session_id = (const char *)frames[3].data;
    m.session_id_len = frames[3].len;
    m.ext = n > from ? &frames[from] : NULL;
    m.n_ext = n - from;
    *msg_p = m;
    return KVB_OK;
}

kvb_status_t kvb__frames_decode_status(const kvb__frame_t *frames, size_t n, kvb__frames_err_t *err,
                                       kvb__status_msg_t *msg_p)
{
    dctx_t c = {KIND_STATUS, err, false, 0};
    kvb__status_msg_t m;
    int64_t v;
    if (n >= 1)
        c.has_room = parse_room(&frames[0], &c.room);
    if (n != STATUS_FRAMES)
        return fail(&c, "expected %d frames, got %zu", STATUS_FRAMES, n);
    KVB__FRAMES_TRY(need_room(&c, &frames[0], 0, &m.room));
    KVB__FRAMES_TRY(need_int(&c, &frames[1], 1, "status", KVB__WIRE_FAILED, KVB__WIRE_SUCCESS, &v));
    m.status = (int32_t)v;
    KVB__FRAMES_TRY(need_i32(&c, &frames[2], 2, "prefill_rank", 0, &m.prefill_rank));
    *msg_p = m;
    return KVB_OK;
}

kvb_status_t kvb__frames_decode_aux(const kvb__frame_t *frames, size_t n, kvb__frames_err_t *err,
                                    kvb__aux_msg_t *msg_p)
{
    dctx_t c = {KIND_AUX, err, false, 0};
    kvb__aux_msg_t m;
    uint32_t declared;
    char q[200];
    if (n >= 2 && frame_is(&frames[0], AUX_TAG, sizeof(AUX_TAG) - 1))
        c.has_room = parse_room(&frames[1], &c.room);
    if (n != AUX_FRAMES)
        return fail(&c, "expected %d frames, got %zu", AUX_FRAMES, n);
    if (!frame_is(&frames[0], AUX_TAG, sizeof(AUX_TAG) - 1)) {
        quote(q, sizeof(q), frames[0].data, frames[0].len);
        return fail_frame(&c, 0, "tag", "%s is not \"AUX_DATA\"", q);
    }
    KVB__FRAMES_TRY(need_room(&c, &frames[1], 1, &m.room));
    KVB__FRAMES_TRY(need_i32(&c, &frames[2], 2, "buffer index", 0, &m.buffer_index));
    KVB__FRAMES_TRY(need_i32(&c, &frames[3], 3, "aux index", 0, &m.aux_index));
    if (frames[4].len != 4)
        return fail_frame(&c, 4, "length", "%zu bytes, expected 4 (big-endian uint32)",
                          frames[4].len);
    declared = (uint32_t)frames[4].data[0] << 24 | (uint32_t)frames[4].data[1] << 16 |
               (uint32_t)frames[4].data[2] << 8 | (uint32_t)frames[4].data[3];
    if (frames[5].len != declared)
        return fail_frame(&c, 5, "payload", "%zu bytes, frame 4 declares %u", frames[5].len,
                          (unsigned)declared);
    m.payload = frames[5].data;
    m.payload_len = frames[5].len;
    *msg_p = m;
    return KVB_OK;
}

/* ---- caller-bounded checks ---- */

kvb_status_t kvb__frames_check_indices(kvb__i32_view_t idx, uint64_t pool_size, const char *what,
                                       kvb__frames_err_t *err)
{
    for (size_t i = 0; i < idx.count; i++) {
        int32_t x = kvb__i32_at(idx, i);
        if (x < 0 || (uint64_t)x >= pool_size) {
            if (err != NULL)
                snprintf(err->reason, sizeof(err->reason),
                         "%s: entry %zu is %d, outside the pool of %llu", what ? what : "indices",
                         i, (int)x, (unsigned long long)pool_size);
            return KVB_ERR_PROTO;
        }
    }
    return KVB_OK;
}

kvb_status_t kvb__frames_check_aux(const kvb__aux_msg_t *msg, size_t n_buffers,
                                   const uint64_t *item_lens, const uint64_t *n_items,
                                   kvb__frames_err_t *err)
{
    dctx_t c = {KIND_AUX, err, true, msg->room};
    size_t b = (size_t)msg->buffer_index;
    if (msg->buffer_index < 0 || b >= n_buffers)
        return fail_frame(&c, 2, "buffer index", "%d outside the %zu aux buffers",
                          (int)msg->buffer_index, n_buffers);
    if (msg->aux_index < 0 || (uint64_t)msg->aux_index >= n_items[b])
        return fail_frame(&c, 3, "aux index", "%d outside the %llu items of aux buffer %zu",
                          (int)msg->aux_index, (unsigned long long)n_items[b], b);
    if ((uint64_t)msg->payload_len != item_lens[b])
        return fail_frame(&c, 5, "payload", "%zu bytes, aux buffer %zu has items of %llu",
                          msg->payload_len, b, (unsigned long long)item_lens[b]);
    return KVB_OK;
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

static bool grow(void **p, size_t *cap, size_t need, size_t elem)
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
static bool put3(kvb__frames_buf_t *b, const void *a, size_t alen, const void *m, size_t mlen,
                 const void *z, size_t zlen)
{
    size_t total = alen + mlen;
    if (total < alen || total + zlen < total)
        return false;
    total += zlen;
    if (b->len + total < b->len || !grow((void **)&b->data, &b->cap, b->len + total, 1) ||
        !grow((void **)&b->ends, &b->cap_frames, b->n + 1, sizeof(size_t)))
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

static bool put(kvb__frames_buf_t *b, const void *p, size_t len)
{
    return put3(b, p, len, NULL, 0, NULL, 0);
}

static bool put_u64(kvb__frames_buf_t *b, uint64_t v)
{
    char s[24];
    int k = snprintf(s, sizeof(s), "%llu", (unsigned long long)v);
    return put(b, s, (size_t)k);
}

static bool put_i64(kvb__frames_buf_t *b, int64_t v)
{
    char s[24];
    int k = snprintf(s, sizeof(s), "%lld", (long long)v);
    return put(b, s, (size_t)k);
}

/* One extension entry to emit; known-key values are built from typed fields. */
typedef struct ext_out {
    const uint8_t *key;
    size_t key_len;
    const uint8_t *val; /* whole frame when raw */
    size_t val_len;
    bool raw;
} ext_out_t;

static int ext_out_cmp(const void *a, const void *b)
{
    const ext_out_t *x = a, *y = b;
    return key_cmp(x->key, x->key_len, y->key, y->key_len);
}

/* Emit the marker, then typed known entries and caller extras (minus known
 * keys) in key order; nothing at all when there are none. Extras that are
 * not key=value are passed through as is; the decoder check that follows
 * rejects them. */
static kvb_status_t put_ext(kvb__frames_buf_t *b, const char *const *known, ext_out_t *typed,
                            size_t n_typed, const kvb__frame_t *ext, size_t n_ext)
{
    ext_out_t *all;
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
        ext_kv_t kv;
        ext_out_t e = {ext[i].data, ext[i].len, ext[i].data, ext[i].len, true};
        if (split_ext(&ext[i], &kv)) {
            if (known_key(known, &kv))
                continue;
            e.key_len = kv.key_len;
        }
        all[n++] = e;
    }
    qsort(all, n, sizeof(*all), ext_out_cmp);
    if (n > 0 && !put(b, KVB__EXT_MARKER, sizeof(KVB__EXT_MARKER) - 1))
        st = KVB_ERR_NOMEM;
    for (size_t i = 0; i < n && st == KVB_OK; i++) {
        bool ok = all[i].raw
                      ? put(b, all[i].val, all[i].val_len)
                      : put3(b, all[i].key, all[i].key_len, "=", 1, all[i].val, all[i].val_len);
        if (!ok)
            st = KVB_ERR_NOMEM;
    }
    free(all);
    return st;
}

static ext_out_t typed_ext(const char *key, const void *val, size_t len)
{
    ext_out_t e = {(const uint8_t *)key, strlen(key), (const uint8_t *)val, len, false};
    return e;
}

/* The frames appended since n0, as an array the decoders take. */
static kvb__frame_t *appended(const kvb__frames_buf_t *b, size_t n0)
{
    kvb__frame_t *f = malloc((b->n - n0 + 1) * sizeof(*f));
    if (f == NULL)
        return NULL;
    for (size_t i = n0; i < b->n; i++)
        f[i - n0] = kvb__frames_buf_get(b, i);
    return f;
}

static kvb_status_t rollback(kvb__frames_buf_t *b, size_t n0, size_t len0, kvb_status_t st)
{
    b->n = n0;
    b->len = len0;
    return st;
}

static bool bad_view(const void *p, size_t len)
{
    return p == NULL && len != 0;
}

static kvb_status_t caller_error(kvb__frames_err_t *err, const char *kind, const char *what)
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
#define VERIFY(b, n0, len0, err, decode, msgtype)                                                  \
    do {                                                                                           \
        kvb__frame_t *f_ = appended(b, n0);                                                        \
        msgtype tmp_;                                                                              \
        kvb_status_t st_;                                                                          \
        if (f_ == NULL)                                                                            \
            return rollback(b, n0, len0, KVB_ERR_NOMEM);                                           \
        st_ = decode(f_, (b)->n - (n0), err, &tmp_);                                               \
        free(f_);                                                                                  \
        if (st_ != KVB_OK)                                                                         \
            return rollback(b, n0, len0, KVB_ERR_INVALID);                                         \
    } while (0)

kvb_status_t kvb__frames_encode_registration(const kvb__reg_msg_t *msg, kvb__frames_err_t *err,
                                             kvb__frames_buf_t *out)
{
    size_t n0 = out->n, len0 = out->len;
    ext_out_t typed[1];
    size_t n_typed = 0;
    kvb_status_t st;
    if (bad_view(msg->ip, msg->ip_len) || bad_view(msg->session_id, msg->session_id_len) ||
        bad_view(msg->kv_ptrs.data, msg->kv_ptrs.count) ||
        bad_view(msg->aux_ptrs.data, msg->aux_ptrs.count) ||
        (msg->has_state_ptrs && bad_view(msg->state_ptrs.data, msg->state_ptrs.count)) ||
        bad_view(msg->ext, msg->n_ext) || msg->kv_ptrs.count > SIZE_MAX / 8 ||
        msg->aux_ptrs.count > SIZE_MAX / 8 || msg->state_ptrs.count > SIZE_MAX / 8)
        return caller_error(err, KIND_REG, "NULL array with a non-zero length");
    if (msg->has_state_ptrs)
        typed[n_typed++] = typed_ext("state_ptrs", msg->state_ptrs.data, msg->state_ptrs.count * 8);
    if (!put(out, NONE_TAG, sizeof(NONE_TAG) - 1) || !put(out, msg->ip, msg->ip_len) ||
        !put_u64(out, msg->port) || !put(out, msg->session_id, msg->session_id_len) ||
        !put(out, msg->kv_ptrs.data, msg->kv_ptrs.count * 8) ||
        !put(out, msg->aux_ptrs.data, msg->aux_ptrs.count * 8) || !put_i64(out, msg->dst_tp_rank) ||
        !put_i64(out, msg->dst_attn_tp_size) || !put_i64(out, msg->dst_kv_item_len))
        return rollback(out, n0, len0, KVB_ERR_NOMEM);
    st = put_ext(out, REG_KNOWN, typed, n_typed, msg->ext, msg->n_ext);
    if (st != KVB_OK)
        return rollback(out, n0, len0, st);
    VERIFY(out, n0, len0, err, kvb__frames_decode_registration, kvb__reg_msg_t);
    return KVB_OK;
}

kvb_status_t kvb__frames_encode_transfer(const kvb__xfer_msg_t *msg, kvb__frames_err_t *err,
                                         kvb__frames_buf_t *out)
{
    size_t n0 = out->n, len0 = out->len;
    ext_out_t typed[4];
    size_t n_typed = 0;
    char prefix[24], epoch[24];
    kvb_status_t st;
    bool ok;
    if (bad_view(msg->ip, msg->ip_len) || bad_view(msg->session_id, msg->session_id_len) ||
        bad_view(msg->pages.data, msg->pages.count) ||
        (msg->has_page_mask && bad_view(msg->page_mask, msg->pages.count)) ||
        (msg->has_state_idx && bad_view(msg->state_idx.data, msg->state_idx.count)) ||
        bad_view(msg->ext, msg->n_ext) || msg->pages.count > SIZE_MAX / 4 ||
        msg->state_idx.count > SIZE_MAX / 4)
        return caller_error(err, KIND_XFER, "NULL array with a non-zero length");
    if (msg->is_dummy && msg->pages.count != 0)
        return caller_error(err, KIND_XFER, "a dummy transfer info carries no page indices");
    /* typed[] in key order; put_ext sorts anyway. */
    if (msg->has_epoch) {
        if (msg->epoch == 0 || msg->epoch > INT64_MAX)
            return caller_error(err, KIND_XFER, "epoch outside 1..2^63-1");
        int k = snprintf(epoch, sizeof(epoch), "%llu", (unsigned long long)msg->epoch);
        typed[n_typed++] = typed_ext("epoch", epoch, (size_t)k);
    }
    if (msg->has_page_mask)
        typed[n_typed++] = typed_ext("page_mask", msg->page_mask, msg->pages.count);
    if (msg->has_prefix_len) {
        int k = snprintf(prefix, sizeof(prefix), "%lld", (long long)msg->prefix_len);
        typed[n_typed++] = typed_ext("prefix_len", prefix, (size_t)k);
    }
    if (msg->has_state_idx)
        typed[n_typed++] = typed_ext("state_idx", msg->state_idx.data, msg->state_idx.count * 4);
    ok = put_u64(out, msg->room) && put(out, msg->ip, msg->ip_len) && put_u64(out, msg->port) &&
         put(out, msg->session_id, msg->session_id_len);
    if (ok && msg->is_dummy)
        ok = put(out, NULL, 0) && put(out, NULL, 0);
    else if (ok)
        ok = put(out, msg->pages.data, msg->pages.count * 4) && put_i64(out, msg->aux_index);
    ok = ok && put_i64(out, msg->required_dst_info_num);
    if (!ok)
        return rollback(out, n0, len0, KVB_ERR_NOMEM);
    st = put_ext(out, XFER_KNOWN, typed, n_typed, msg->ext, msg->n_ext);
    if (st != KVB_OK)
        return rollback(out, n0, len0, st);
    VERIFY(out, n0, len0, err, kvb__frames_decode_transfer, kvb__xfer_msg_t);
    return KVB_OK;
}

kvb_status_t kvb__frames_encode_status(const kvb__status_msg_t *msg, kvb__frames_err_t *err,
                                       kvb__frames_buf_t *out)
{
    size_t n0 = out->n, len0 = out->len;
    if (!put_u64(out, msg->room) || !put_i64(out, msg->status) || !put_i64(out, msg->prefill_rank))
        return rollback(out, n0, len0, KVB_ERR_NOMEM);
    VERIFY(out, n0, len0, err, kvb__frames_decode_status, kvb__status_msg_t);
    return KVB_OK;
}

kvb_status_t kvb__frames_encode_aux(const kvb__aux_msg_t *msg, kvb__frames_err_t *err,
                                    kvb__frames_buf_t *out)
{
    size_t n0 = out->n, len0 = out->len;
    uint8_t be[4];
    if (bad_view(msg->payload, msg->payload_len))
        return caller_error(err, KIND_AUX, "NULL payload with a non-zero length");
    if (msg->payload_len > UINT32_MAX)
        return caller_error(err, KIND_AUX, "payload longer than 4294967295 bytes");
    be[0] = (uint8_t)(msg->payload_len >> 24);
    be[1] = (uint8_t)(msg->payload_len >> 16);
    be[2] = (uint8_t)(msg->payload_len >> 8);
    be[3] = (uint8_t)msg->payload_len;
    if (!put(out, AUX_TAG, sizeof(AUX_TAG) - 1) || !put_u64(out, msg->room) ||
        !put_i64(out, msg->buffer_index) || !put_i64(out, msg->aux_index) || !put(out, be, 4) ||
        !put(out, msg->payload, msg->payload_len))
        return rollback(out, n0, len0, KVB_ERR_NOMEM);
    VERIFY(out, n0, len0, err, kvb__frames_decode_aux, kvb__aux_msg_t);
    return KVB_OK;
}

/* ==== SGLang's 2026 dialect (frames26.h) ==== */

static uint64_t le_at(const uint8_t *p, unsigned elem)
{
    uint64_t v = 0;
    for (unsigned i = 0; i < elem; i++)
        v |= (uint64_t)p[i] << (8 * i);
    return v;
}

/* Offset of list i's payload (header checked by need_lol). */
static size_t lol_offset(kvb__lol_view_t v, uint32_t i)
{
    size_t off = 4 + 4 * (size_t)v.n;
    for (uint32_t k = 0; k < i; k++)
        off += (size_t)le_at(v.data + 4 + 4 * (size_t)k, 4);
    return off;
}

void kvb__lol_list(kvb__lol_view_t v, uint32_t i, const uint8_t **data_p, size_t *count_p)
{
    *data_p = v.data + lol_offset(v, i);
    *count_p = (size_t)le_at(v.data + 4 + 4 * (size_t)i, 4) / v.elem;
}

uint64_t kvb__lol_at(kvb__lol_view_t v, uint32_t i, size_t k)
{
    const uint8_t *d;
    size_t count;
    kvb__lol_list(v, i, &d, &count);
    return le_at(d + k * v.elem, v.elem);
}

kvb_status_t kvb__lol_pack_one(const void *elems, size_t count, unsigned elem, uint8_t **buf_p,
                               kvb__lol_view_t *view_p)
{
    if ((elem != 4 && elem != 8) || (elems == NULL && count > 0) || count > UINT32_MAX / elem)
        return KVB_ERR_INVALID;
    size_t bytes = count * elem;
    uint8_t *b = malloc(8 + bytes);
    if (b == NULL)
        return KVB_ERR_NOMEM;
    for (unsigned i = 0; i < 4; i++) {
        b[i] = i == 0 ? 1 : 0;
        b[4 + i] = (uint8_t)(bytes >> (8 * i));
    }
    for (size_t k = 0; k < count; k++) { /* little-endian whatever the host */
        uint64_t x = elem == 8 ? ((const uint64_t *)elems)[k] : ((const uint32_t *)elems)[k];
        for (unsigned i = 0; i < elem; i++)
            b[8 + k * elem + i] = (uint8_t)(x >> (8 * i));
    }
    *buf_p = b;
    *view_p = (kvb__lol_view_t){b, 8 + bytes, 1, (uint8_t)elem};
    return KVB_OK;
}

/* LoL frame: header, lengths that are multiples of elem and sum exactly to
 * the payload, at most KVB__LOL_MAX_LISTS lists. */
static kvb_status_t need_lol(dctx_t *c, const kvb__frame_t *f, size_t idx, const char *name,
                             unsigned elem, kvb__lol_view_t *out_p)
{
    kvb__lol_view_t v = {f->data, f->len, 0, (uint8_t)elem};
    if (f->len == 0) {
        *out_p = v;
        return KVB_OK;
    }
    if (f->len < 4)
        return fail_frame(c, idx, name, "%zu bytes, shorter than the 4-byte list count", f->len);
    uint64_t n = le_at(f->data, 4);
    if (n > KVB__LOL_MAX_LISTS)
        return fail_frame(c, idx, name, "%llu lists, at most %d", (unsigned long long)n,
                          KVB__LOL_MAX_LISTS);
    size_t head = 4 + 4 * (size_t)n, sum = 0;
    if (f->len < head)
        return fail_frame(c, idx, name, "%zu bytes, %llu lists need a %zu-byte header", f->len,
                          (unsigned long long)n, head);
    for (size_t i = 0; i < n; i++) {
        size_t l = (size_t)le_at(f->data + 4 + 4 * i, 4);
        if (l % elem != 0)
            return fail_frame(c, idx, name, "list %zu is %zu bytes, not a multiple of %u", i, l,
                              elem);
        sum += l;
    }
    if (sum != f->len - head)
        return fail_frame(c, idx, name, "lists declare %zu payload bytes, frame holds %zu", sum,
                          f->len - head);
    v.n = (uint32_t)n;
    *out_p = v;
    return KVB_OK;
}

/* Every element of every list: non-zero (pointers) or a non-negative i32. */
static kvb_status_t lol_elems(dctx_t *c, kvb__lol_view_t v, size_t idx, const char *name,
                              bool pointers)
{
    for (uint32_t i = 0; i < v.n; i++) {
        const uint8_t *d;
        size_t count;
        kvb__lol_list(v, i, &d, &count);
        for (size_t k = 0; k < count; k++) {
            uint64_t x = le_at(d + k * v.elem, v.elem);
            if (pointers && x == 0)
                return fail_frame(c, idx, name, "list %u entry %zu is a null address", i, k);
            if (!pointers && (int32_t)(uint32_t)x < 0)
                return fail_frame(c, idx, name, "list %u entry %zu is negative (%d)", i, k,
                                  (int)(int32_t)(uint32_t)x);
        }
    }
    return KVB_OK;
}

/* v is empty, or has the lists of ref each with the same element count
 * (counts_may_be_empty: a list may also be empty). */
static kvb_status_t lol_shaped(dctx_t *c, kvb__lol_view_t v, kvb__lol_view_t ref, size_t idx,
                               const char *name, bool counts_may_be_empty)
{
    if (v.len == 0)
        return KVB_OK;
    if (v.n != ref.n)
        return fail_frame(c, idx, name, "%u lists, frame 6 has %u state components", v.n, ref.n);
    for (uint32_t i = 0; i < v.n; i++) {
        const uint8_t *d;
        size_t a, b;
        kvb__lol_list(v, i, &d, &a);
        kvb__lol_list(ref, i, &d, &b);
        if (a != b && !(counts_may_be_empty && a == 0))
            return fail_frame(c, idx, name, "list %u has %zu entries, component %u has %zu", i, a,
                              i, b);
    }
    return KVB_OK;
}

/* Decimal frame that may be empty (then *out_p = dflt). */
static kvb_status_t opt_int(dctx_t *c, const kvb__frame_t *frames, size_t n, size_t idx,
                            const char *name, int64_t min, int64_t max, int64_t dflt,
                            int64_t *out_p)
{
    *out_p = dflt;
    if (idx >= n || frames[idx].len == 0)
        return KVB_OK;
    return need_int(c, &frames[idx], idx, name, min, max, out_p);
}

static kvb_status_t reg26_state(dctx_t *c, const kvb__frame_t *f, size_t n, kvb__reg26_msg_t *m)
{
    static const kvb__frame_t none = {NULL, 0};
    KVB__FRAMES_TRY(need_lol(c, &f[6], 6, "dst_state_data_ptrs", 8, &m->state_ptrs));
    KVB__FRAMES_TRY(lol_elems(c, m->state_ptrs, 6, "dst_state_data_ptrs", true));
    KVB__FRAMES_TRY(
        need_lol(c, n > 10 ? &f[10] : &none, 10, "dst_state_item_lens", 4, &m->state_item_lens));
    KVB__FRAMES_TRY(
        lol_shaped(c, m->state_item_lens, m->state_ptrs, 10, "dst_state_item_lens", false));
    KVB__FRAMES_TRY(
        need_lol(c, n > 11 ? &f[11] : &none, 11, "dst_state_dim_per_tensor", 4, &m->state_dims));
    KVB__FRAMES_TRY(
        lol_shaped(c, m->state_dims, m->state_ptrs, 11, "dst_state_dim_per_tensor", true));
    const kvb__frame_t *ids = n > 12 ? &f[12] : &none;
    if (ids->len % 4 != 0)
        return fail_frame(c, 12, "dst_kv_layer_ids", "length %zu is not a multiple of 4", ids->len);
    m->kv_layer_ids = (kvb__u32_view_t){ids->data, ids->len / 4};
    if (m->kv_layer_ids.count != 0 && m->kv_layer_ids.count != m->kv_ptrs.count)
        return fail_frame(c, 12, "dst_kv_layer_ids", "%zu ids for %zu KV buffers",
                          m->kv_layer_ids.count, m->kv_ptrs.count);
    KVB__FRAMES_TRY(
        need_lol(c, n > 13 ? &f[13] : &none, 13, "dst_state_layer_ids", 4, &m->state_layer_ids));
    return lol_shaped(c, m->state_layer_ids, m->state_ptrs, 13, "dst_state_layer_ids", false);
}

/* Packed u64 frame of any values (layer ids may be 0). */
static kvb_status_t need_u64_values(dctx_t *c, const kvb__frame_t *f, size_t idx, const char *name,
                                    kvb__u64_view_t *out_p)
{
    if (f->len % 8 != 0)
        return fail_frame(c, idx, name, "length %zu is not a multiple of 8", f->len);
    *out_p = (kvb__u64_view_t){f->data, f->len / 8};
    return KVB_OK;
}

/* SGLang after the spec's commit (release 0.5.23) appends frame 18, the
 * staging slot layer ids (u64[]; kvbridge never stages: ignored), and frame
 * 19, each KV buffer's item length (u64[], empty or one per frame-4 entry).
 * nd: the dialect frames (before the marker). */
static kvb_status_t reg26_after17(dctx_t *c, const kvb__frame_t *f, size_t nd, kvb__reg26_msg_t *m)
{
    if (nd > 18)
        KVB__FRAMES_TRY(
            need_u64_values(c, &f[18], 18, "staging_slot_layer_ids", &m->staging_slot_ids));
    if (nd <= 19)
        return KVB_OK;
    KVB__FRAMES_TRY(need_u64_values(c, &f[19], 19, "dst_kv_item_lens", &m->kv_item_lens));
    if (m->kv_item_lens.count != 0 && m->kv_item_lens.count != m->kv_ptrs.count)
        return fail_frame(c, 19, "dst_kv_item_lens", "%zu lengths for %zu KV buffers",
                          m->kv_item_lens.count, m->kv_ptrs.count);
    for (size_t i = 0; i < m->kv_item_lens.count; i++)
        if (kvb__u64_at(m->kv_item_lens, i) == 0 ||
            kvb__u64_at(m->kv_item_lens, i) > (uint64_t)INT64_MAX)
            return fail_frame(c, 19, "dst_kv_item_lens", "entry %zu is %llu", i,
                              (unsigned long long)kvb__u64_at(m->kv_item_lens, i));
    return KVB_OK;
}

static kvb_status_t reg26_tail(dctx_t *c, const kvb__frame_t *f, size_t n, kvb__reg26_msg_t *m)
{
    int64_t v;
    if (n > 14 && f[14].len != 0 && f[14].len != 8)
        return fail_frame(c, 14, "staging_base_ptr", "%zu bytes, expected 8 or none", f[14].len);
    m->has_staging_base = n > 14 && f[14].len == 8;
    m->staging_base = m->has_staging_base ? kvb__u64_at((kvb__u64_view_t){f[14].data, 1}, 0) : 0;
    KVB__FRAMES_TRY(opt_int(c, f, n, 15, "staging_total_size", 0, INT64_MAX, 0, &v));
    m->staging_size = (uint64_t)v;
    KVB__FRAMES_TRY(opt_int(c, f, n, 16, "dst_dcp_size", 1, INT32_MAX, 1, &v));
    m->dcp_size = (int32_t)v;
    KVB__FRAMES_TRY(opt_int(c, f, n, 17, "dst_dcp_rank", 0, m->dcp_size - 1, 0, &v));
    m->dcp_rank = (int32_t)v;
    return reg26_after17(c, f, n, m);
}

kvb_status_t kvb__frames_decode_registration26(const kvb__frame_t *frames, size_t n,
                                               kvb__frames_err_t *err, kvb__reg26_msg_t *msg_p)
{
    dctx_t c = {KIND_REG26, err, false, 0};
    kvb__reg26_msg_t m;
    memset(&m, 0, sizeof(m));
    size_t nd, from;
    KVB__FRAMES_TRY(need_frames(&c, frames, n, KVB__REG26_MIN, KVB__REG26_MAX, &nd, &from));
    KVB__FRAMES_TRY(need_reg_head(&c, frames, &m.port));
    KVB__FRAMES_TRY(need_u64_array(&c, &frames[4], 4, "dst_kv_ptrs", false, &m.kv_ptrs));
    KVB__FRAMES_TRY(need_u64_array(&c, &frames[5], 5, "dst_aux_ptrs", false, &m.aux_ptrs));
    KVB__FRAMES_TRY(need_i32(&c, &frames[7], 7, "dst_tp_rank", 0, &m.dst_tp_rank));
    KVB__FRAMES_TRY(need_i32(&c, &frames[8], 8, "dst_attn_tp_size", 1, &m.dst_attn_tp_size));
    KVB__FRAMES_TRY(need_int(&c, &frames[9], 9, "dst_kv_item_len", m.kv_ptrs.count > 0 ? 1 : 0,
                             m.kv_ptrs.count > 0 ? INT64_MAX : 0, &m.dst_kv_item_len));
    KVB__FRAMES_TRY(reg26_state(&c, frames, nd, &m));
    KVB__FRAMES_TRY(reg26_tail(&c, frames, nd, &m));
    m.n_fixed = nd;
    m.ext = n > from ? &frames[from] : NULL;
    m.n_ext = n - from;
    m.ip = (const char *)frames[1].data;
    m.ip_len = frames[1].len;
    m.session_id = (const char *)frames[3].data;
    m.session_id_len = frames[3].len;
    *msg_p = m;
    return KVB_OK;
}

static kvb_status_t need_mask(dctx_t *c, const kvb__frame_t *val, size_t i, size_t pages)
{
    if (val->len != pages)
        return fail_frame(c, i, "extension page_mask", "%zu bytes for %zu page indices", val->len,
                          pages);
    for (size_t k = 0; k < val->len; k++)
        if (val->data[k] > 1)
            return fail_frame(c, i, "extension page_mask", "byte %zu is 0x%02x, expected 0 or 1", k,
                              val->data[k]);
    return KVB_OK;
}

/* The known extensions after the marker (frames [from, n), checked). */
static kvb_status_t xfer26_ext(dctx_t *c, const kvb__frame_t *f, size_t from, size_t n,
                               kvb__xfer26_msg_t *m)
{
    for (size_t i = from; i < n; i++) {
        ext_kv_t kv;
        split_ext(&f[i], &kv);
        kvb__frame_t val = {kv.val, kv.val_len};
        if (key_is(&kv, "epoch")) {
            int64_t ep;
            KVB__FRAMES_TRY(need_int(c, &val, i, "extension epoch", 1, INT64_MAX, &ep));
            m->has_epoch = true;
            m->epoch = (uint64_t)ep;
        } else if (key_is(&kv, "page_mask")) {
            KVB__FRAMES_TRY(need_mask(c, &val, i, m->pages.count));
            m->has_page_mask = true;
            m->page_mask = val.data;
        }
    }
    m->ext = n > from ? &f[from] : NULL;
    m->n_ext = n - from;
    return KVB_OK;
}

static kvb_status_t xfer26_dst(dctx_t *c, const kvb__frame_t *f, kvb__xfer26_msg_t *m)
{
    m->is_dummy = f[4].len == 0 && f[5].len == 0;
    m->aux_index = -1;
    KVB__FRAMES_TRY(need_lol(c, &f[6], 6, "dst_state_indices", 4, &m->state_idx));
    KVB__FRAMES_TRY(lol_elems(c, m->state_idx, 6, "dst_state_indices", false));
    if (m->is_dummy) {
        if (f[6].len != 0)
            return fail_frame(c, 6, "dst_state_indices", "%zu bytes on a dummy transfer info",
                              f[6].len);
        return KVB_OK;
    }
    KVB__FRAMES_TRY(need_i32_array(c, &f[4], 4, "dst_kv_indices", &m->pages));
    if (f[5].len == 0)
        return fail_frame(c, 5, "dst_aux_index", "empty while frame 4 holds %zu page indices",
                          m->pages.count);
    return need_i32(c, &f[5], 5, "dst_aux_index", 0, &m->aux_index);
}

kvb_status_t kvb__frames_decode_transfer26(const kvb__frame_t *frames, size_t n,
                                           kvb__frames_err_t *err, kvb__xfer26_msg_t *msg_p)
{
    dctx_t c = {KIND_XFER26, err, false, 0};
    kvb__xfer26_msg_t m;
    memset(&m, 0, sizeof(m));
    if (n >= 1)
        c.has_room = parse_room(&frames[0], &c.room);
    size_t nd, from;
    KVB__FRAMES_TRY(need_frames(&c, frames, n, KVB__XFER26_MIN, KVB__XFER26_FRAMES, &nd, &from));
    KVB__FRAMES_TRY(need_room(&c, &frames[0], 0, &m.room));
    KVB__FRAMES_TRY(need_peer(&c, frames, &m.port));
    KVB__FRAMES_TRY(xfer26_dst(&c, frames, &m));
    KVB__FRAMES_TRY(
        need_i32(&c, &frames[7], 7, "required_dst_info_num", 1, &m.required_dst_info_num));
    m.has_prefix_len = nd > 8 && frames[8].len > 0;
    KVB__FRAMES_TRY(
        opt_int(&c, frames, nd, 8, "decode_prefix_len", 0, INT64_MAX, 0, &m.prefix_len));
    if (nd > 9)
        KVB__FRAMES_TRY(
            need_i32_array(&c, &frames[9], 9, "dst_device_kv_indices", &m.device_pages));
    if (m.is_dummy && m.device_pages.count > 0)
        return fail_frame(&c, 9, "dst_device_kv_indices", "%zu entries on a dummy transfer info",
                          m.device_pages.count);
    m.n_fixed = nd;
    KVB__FRAMES_TRY(xfer26_ext(&c, frames, from, n, &m));
    m.ip = (const char *)frames[1].data;
    m.ip_len = frames[1].len;
    m.session_id = (const char *)frames[3].data;
    m.session_id_len = frames[3].len;
    *msg_p = m;
    return KVB_OK;
}

kvb_status_t kvb__frames_decode_abort(const kvb__frame_t *frames, size_t n, kvb__frames_err_t *err,
                                      kvb__abort_msg_t *msg_p)
{
    dctx_t c = {KIND_ABORT, err, false, 0};
    kvb__abort_msg_t m;
    int64_t v;
    char q[200];
    if (n >= 2 && tag_is(&frames[0], "ABORT"))
        c.has_room = parse_room(&frames[1], &c.room);
    if (n != 4 && n != 5)
        return fail(&c, "expected 4 or 5 frames, got %zu", n);
    if (!tag_is(&frames[0], "ABORT")) {
        quote(q, sizeof(q), frames[0].data, frames[0].len);
        return fail_frame(&c, 0, "tag", "%s is not \"ABORT\"", q);
    }
    KVB__FRAMES_TRY(need_room(&c, &frames[1], 1, &m.room));
    KVB__FRAMES_TRY(need_ip(&c, &frames[2], 2));
    KVB__FRAMES_TRY(need_int(&c, &frames[3], 3, "port", 1, 65535, &v));
    m.port = (uint16_t)v;
    m.ip = (const char *)frames[2].data;
    m.ip_len = frames[2].len;
    m.has_generation = n == 5;
    m.generation = 0;
    if (n == 5) {
        KVB__FRAMES_TRY(need_int(&c, &frames[4], 4, "generation", 0, INT64_MAX, &v));
        m.generation = (uint64_t)v;
    }
    *msg_p = m;
    return KVB_OK;
}

kvb_status_t kvb__frames_decode_abort_ack(const kvb__frame_t *frames, size_t n,
                                          kvb__frames_err_t *err, kvb__abort_ack_msg_t *msg_p)
{
    dctx_t c = {KIND_ACK, err, false, 0};
    kvb__abort_ack_msg_t m = {0, false, 0, false, 0};
    int64_t v;
    char q[200];
    if (n >= 2 && tag_is(&frames[0], "ABORT_ACK"))
        c.has_room = parse_room(&frames[1], &c.room);
    if (n < 2 || n > 4)
        return fail(&c, "expected 2, 3 or 4 frames, got %zu", n);
    if (!tag_is(&frames[0], "ABORT_ACK")) {
        quote(q, sizeof(q), frames[0].data, frames[0].len);
        return fail_frame(&c, 0, "tag", "%s is not \"ABORT_ACK\"", q);
    }
    KVB__FRAMES_TRY(need_room(&c, &frames[1], 1, &m.room));
    if (n >= 3) {
        KVB__FRAMES_TRY(need_i32(&c, &frames[2], 2, "prefill_unique_rank", 0, &m.rank));
        m.has_rank = true;
    }
    if (n == 4) {
        KVB__FRAMES_TRY(need_int(&c, &frames[3], 3, "generation", 0, INT64_MAX, &v));
        m.generation = (uint64_t)v;
        m.has_generation = true;
    }
    *msg_p = m;
    return KVB_OK;
}

/* ---- 2026 encoders ---- */

static bool put_lol(kvb__frames_buf_t *b, kvb__lol_view_t v)
{
    return put(b, v.data, v.len);
}

static bool bad_lol(kvb__lol_view_t v)
{
    return bad_view(v.data, v.len);
}

static bool reg26_fixed(kvb__frames_buf_t *out, const kvb__reg26_msg_t *msg)
{
    uint8_t base[8];
    memcpy(base, &msg->staging_base, 8);
    return put(out, NONE_TAG, sizeof(NONE_TAG) - 1) && put(out, msg->ip, msg->ip_len) &&
           put_u64(out, msg->port) && put(out, msg->session_id, msg->session_id_len) &&
           put(out, msg->kv_ptrs.data, msg->kv_ptrs.count * 8) &&
           put(out, msg->aux_ptrs.data, msg->aux_ptrs.count * 8) && put_lol(out, msg->state_ptrs) &&
           put_i64(out, msg->dst_tp_rank) && put_i64(out, msg->dst_attn_tp_size) &&
           put_i64(out, msg->dst_kv_item_len) && put_lol(out, msg->state_item_lens) &&
           put_lol(out, msg->state_dims) &&
           put(out, msg->kv_layer_ids.data, msg->kv_layer_ids.count * 4) &&
           put_lol(out, msg->state_layer_ids) &&
           put(out, msg->has_staging_base ? base : NULL, msg->has_staging_base ? 8 : 0) &&
           (msg->staging_size > 0 || msg->has_staging_base ? put_u64(out, msg->staging_size)
                                                           : put(out, NULL, 0)) &&
           put_i64(out, msg->dcp_size) && put_i64(out, msg->dcp_rank);
}

kvb_status_t kvb__frames_encode_registration26(const kvb__reg26_msg_t *msg, kvb__frames_err_t *err,
                                               kvb__frames_buf_t *out)
{
    size_t n0 = out->n, len0 = out->len;
    if (bad_view(msg->ip, msg->ip_len) || bad_view(msg->session_id, msg->session_id_len) ||
        bad_view(msg->kv_ptrs.data, msg->kv_ptrs.count) ||
        bad_view(msg->aux_ptrs.data, msg->aux_ptrs.count) ||
        bad_view(msg->kv_layer_ids.data, msg->kv_layer_ids.count) || bad_lol(msg->state_ptrs) ||
        bad_lol(msg->state_item_lens) || bad_lol(msg->state_dims) ||
        bad_lol(msg->state_layer_ids) || bad_view(msg->ext, msg->n_ext) ||
        msg->kv_ptrs.count > SIZE_MAX / 8 || msg->aux_ptrs.count > SIZE_MAX / 8 ||
        msg->kv_layer_ids.count > SIZE_MAX / 4)
        return caller_error(err, KIND_REG26, "NULL array with a non-zero length");
    if (!reg26_fixed(out, msg))
        return rollback(out, n0, len0, KVB_ERR_NOMEM);
    kvb_status_t st = put_ext(out, REG_KNOWN, NULL, 0, msg->ext, msg->n_ext);
    if (st != KVB_OK)
        return rollback(out, n0, len0, st);
    VERIFY(out, n0, len0, err, kvb__frames_decode_registration26, kvb__reg26_msg_t);
    return KVB_OK;
}

kvb_status_t kvb__frames_encode_transfer26(const kvb__xfer26_msg_t *msg, kvb__frames_err_t *err,
                                           kvb__frames_buf_t *out)
{
    size_t n0 = out->n, len0 = out->len;
    char epoch[24];
    ext_out_t typed[2];
    size_t n_typed = 0;
    static const char *const known[] = {"epoch", "page_mask", NULL};
    if (bad_view(msg->ip, msg->ip_len) || bad_view(msg->session_id, msg->session_id_len) ||
        bad_view(msg->pages.data, msg->pages.count) || bad_lol(msg->state_idx) ||
        bad_view(msg->device_pages.data, msg->device_pages.count) ||
        bad_view(msg->ext, msg->n_ext) || msg->pages.count > SIZE_MAX / 4 ||
        msg->device_pages.count > SIZE_MAX / 4)
        return caller_error(err, KIND_XFER26, "NULL array with a non-zero length");
    if (msg->is_dummy && (msg->pages.count != 0 || msg->state_idx.len != 0))
        return caller_error(err, KIND_XFER26, "a dummy transfer info carries no indices");
    if (msg->has_epoch) {
        if (msg->epoch == 0 || msg->epoch > INT64_MAX)
            return caller_error(err, KIND_XFER26, "epoch outside 1..2^63-1");
        int k = snprintf(epoch, sizeof(epoch), "%llu", (unsigned long long)msg->epoch);
        typed[n_typed++] = typed_ext("epoch", epoch, (size_t)k);
    }
    if (msg->has_page_mask) {
        if (bad_view(msg->page_mask, msg->pages.count))
            return caller_error(err, KIND_XFER26, "NULL page mask with page indices");
        typed[n_typed++] = typed_ext("page_mask", msg->page_mask, msg->pages.count);
    }
    bool ok = put_u64(out, msg->room) && put(out, msg->ip, msg->ip_len) &&
              put_u64(out, msg->port) && put(out, msg->session_id, msg->session_id_len);
    if (ok && msg->is_dummy)
        ok = put(out, NULL, 0) && put(out, NULL, 0);
    else if (ok)
        ok = put(out, msg->pages.data, msg->pages.count * 4) && put_i64(out, msg->aux_index);
    ok = ok && put_lol(out, msg->state_idx) && put_i64(out, msg->required_dst_info_num) &&
         put_i64(out, msg->has_prefix_len ? msg->prefix_len : 0) &&
         put(out, msg->device_pages.data, msg->device_pages.count * 4);
    if (!ok)
        return rollback(out, n0, len0, KVB_ERR_NOMEM);
    kvb_status_t st = put_ext(out, known, typed, n_typed, msg->ext, msg->n_ext);
    if (st != KVB_OK)
        return rollback(out, n0, len0, st);
    VERIFY(out, n0, len0, err, kvb__frames_decode_transfer26, kvb__xfer26_msg_t);
    return KVB_OK;
}

kvb_status_t kvb__frames_encode_abort(const kvb__abort_msg_t *msg, kvb__frames_err_t *err,
                                      kvb__frames_buf_t *out)
{
    size_t n0 = out->n, len0 = out->len;
    if (bad_view(msg->ip, msg->ip_len))
        return caller_error(err, KIND_ABORT, "NULL ip with a non-zero length");
    if (!put(out, "ABORT", 5) || !put_u64(out, msg->room) || !put(out, msg->ip, msg->ip_len) ||
        !put_u64(out, msg->port) || (msg->has_generation && !put_u64(out, msg->generation)))
        return rollback(out, n0, len0, KVB_ERR_NOMEM);
    VERIFY(out, n0, len0, err, kvb__frames_decode_abort, kvb__abort_msg_t);
    return KVB_OK;
}

kvb_status_t kvb__frames_encode_abort_ack(const kvb__abort_ack_msg_t *msg, kvb__frames_err_t *err,
                                          kvb__frames_buf_t *out)
{
    size_t n0 = out->n, len0 = out->len;
    if (msg->has_generation && !msg->has_rank)
        return caller_error(err, KIND_ACK, "a generation needs the rank frame before it");
    if (!put(out, "ABORT_ACK", 9) || !put_u64(out, msg->room) ||
        (msg->has_rank && !put_i64(out, msg->rank)) ||
        (msg->has_generation && !put_u64(out, msg->generation)))
        return rollback(out, n0, len0, KVB_ERR_NOMEM);
    VERIFY(out, n0, len0, err, kvb__frames_decode_abort_ack, kvb__abort_ack_msg_t);
    return KVB_OK;
}

/* ---- shared with the TokenSpeed codec (frames_ts.c): the same field rules ---- */

kvb_status_t kvb__frames_decode_peer(const kvb__frame_t *frames, size_t n, const char *kind,
                                     bool room_first, kvb__frames_err_t *err, uint64_t *room_p,
                                     uint16_t *port_p)
{
    dctx_t c = {kind, err, false, 0};
    if (n < 4)
        return fail(&c, "expected at least 4 frames, got %zu", n);
    if (!room_first)
        return need_reg_head(&c, frames, port_p);
    c.has_room = parse_room(&frames[0], &c.room);
    KVB__FRAMES_TRY(need_room(&c, &frames[0], 0, room_p));
    return need_peer(&c, frames, port_p);
}

kvb_status_t kvb__frames_need_int(const kvb__frame_t *f, size_t idx, const char *kind,
                                  const char *name, int64_t min, int64_t max, bool has_room,
                                  uint64_t room, kvb__frames_err_t *err, int64_t *out_p)
{
    dctx_t c = {kind, err, has_room, room};
    return need_int(&c, f, idx, name, min, max, out_p);
}

bool kvb__frames_put(kvb__frames_buf_t *b, const void *p, size_t len)
{
    return put(b, p, len);
}
