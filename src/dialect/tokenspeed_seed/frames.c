/* Control-channel frame codec, TokenSpeed's dialect; see frames.h,
 * PROTOCOL-TOKENSPEED.md sections 4 and 7 and docs/tokenspeed-fields.md. */
#include "dialect/tokenspeed_seed/frames.h"

#include "core/core.h"

#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#define KIND_REGTS "registration (TokenSpeed)"
#define KIND_XFERTS "transfer info (TokenSpeed)"
#define KIND_STATUSTS "status (TokenSpeed)"

static kvb_status_t failf(kvb__frames_err_t *err, const char *kind, bool has_room, uint64_t room,
                          const char *fmt, ...) KVB_PRINTF(5, 6);
static kvb_status_t failf(kvb__frames_err_t *err, const char *kind, bool has_room, uint64_t room,
                          const char *fmt, ...)
{
    if (err == NULL)
        return KVB_ERR_PROTO;
    va_list ap;
    int o = snprintf(err->reason, sizeof(err->reason), "%s: ", kind);
    va_start(ap, fmt);
    if (o > 0 && (size_t)o < sizeof(err->reason))
        vsnprintf(err->reason + o, sizeof(err->reason) - (size_t)o, fmt, ap);
    va_end(ap);
    err->has_room = has_room;
    err->room = has_room ? room : 0;
    return KVB_ERR_PROTO;
}

/* A packed array of elem-byte entries; u64 pointers must be non-zero, i64
 * indices >= 0 (a negative page would write below a buffer's base). */
static kvb_status_t need_packed(const kvb__frame_t *f, size_t idx, const char *kind,
                                const char *name, bool pointers, bool has_room, uint64_t room,
                                kvb__frames_err_t *err)
{
    if (f->len % 8 != 0)
        return failf(err, kind, has_room, room, "frame %zu (%s): length %zu is not a multiple of 8",
                     idx, name, f->len);
    for (size_t i = 0; i < f->len / 8; i++) {
        int64_t v;
        memcpy(&v, f->data + i * 8, 8);
        if (pointers ? v == 0 : v < 0)
            return failf(err, kind, has_room, room, "frame %zu (%s): entry %zu is %s (%lld)", idx,
                         name, i, pointers ? "a null address" : "negative", (long long)v);
    }
    return KVB_OK;
}

kvb_status_t kvb__frames_decode_registration_ts(const kvb__frame_t *frames, size_t n,
                                                kvb__frames_err_t *err, kvb__regts_msg_t *msg_p)
{
    kvb__regts_msg_t m;
    memset(&m, 0, sizeof(m));
    if (n != KVB__REGTS_FRAMES)
        return failf(err, KIND_REGTS, false, 0, "expected %d frames, got %zu", KVB__REGTS_FRAMES,
                     n);
    KVB__FRAMES_TRY(kvb__frames_decode_peer(frames, n, KIND_REGTS, false, err, NULL, &m.port));
    KVB__FRAMES_TRY(need_packed(&frames[4], 4, KIND_REGTS, "dst_kv_ptrs", true, false, 0, err));
    if (frames[4].len == 0)
        return failf(err, KIND_REGTS, false, 0, "frame 4 (dst_kv_ptrs): empty");
    if (frames[5].len != 0)
        return failf(err, KIND_REGTS, false, 0,
                     "frame 5 (aux pointers): %zu bytes; TokenSpeed sends it empty", frames[5].len);
    KVB__FRAMES_TRY(
        need_packed(&frames[6], 6, KIND_REGTS, "dst_state_data_ptrs", true, false, 0, err));
    if (frames[7].len != 0)
        KVB__FRAMES_TRY(kvb__frames_need_int(&frames[7], 7, KIND_REGTS, "decode_prefix_len", 0,
                                             INT64_MAX, false, 0, err, &m.prefix_len));
    m.ip = (const char *)frames[1].data;
    m.ip_len = frames[1].len;
    m.session_id = (const char *)frames[3].data;
    m.session_id_len = frames[3].len;
    m.kv_ptrs = (kvb__u64_view_t){frames[4].data, frames[4].len / 8};
    m.state_ptrs = (kvb__u64_view_t){frames[6].data, frames[6].len / 8};
    *msg_p = m;
    return KVB_OK;
}

/* Frames 7-13 of a real (non-dummy) transfer info. */
static kvb_status_t xfer_tail(const kvb__frame_t *f, size_t n, kvb__frames_err_t *err,
                              kvb__xferts_msg_t *m)
{
    int64_t v;
    KVB__FRAMES_TRY(kvb__frames_need_int(&f[7], 7, KIND_XFERTS, "decode_prefix_len", 0, INT64_MAX,
                                         true, m->room, err, &m->prefix_len));
    KVB__FRAMES_TRY(kvb__frames_need_int(&f[8], 8, KIND_XFERTS, "dst_indices_are_local", 0, 1, true,
                                         m->room, err, &v));
    m->l1_5 = (int32_t)v;
    m->mask_len = f[9].len;
    if (f[10].len % 8 != 0)
        return failf(err, KIND_XFERTS, true, m->room,
                     "frame 10 (page-local indices): length %zu is not a multiple of 8", f[10].len);
    m->local_len = f[10].len;
    KVB__FRAMES_TRY(need_packed(&f[11], 11, KIND_XFERTS, "state slots", false, true, m->room, err));
    m->state_idx = (kvb__i64_view_t){f[11].data, f[11].len / 8};
    if (n == KVB__XFERTS_PLAN) {
        if ((f[12].len == 0) != (f[13].len == 0))
            return failf(err, KIND_XFERTS, true, m->room,
                         "frames 12-13 (plan): one is empty and the other not");
        if (f[12].len != 0) {
            KVB__FRAMES_TRY(kvb__frames_need_int(&f[12], 12, KIND_XFERTS, "plan version",
                                                 KVB__TS_PLAN_VERSION, KVB__TS_PLAN_VERSION, true,
                                                 m->room, err, &v));
            m->has_plan = true;
            m->plan_json = f[13].data;
            m->plan_len = f[13].len;
        }
    }
    return KVB_OK;
}

kvb_status_t kvb__frames_decode_transfer_ts(const kvb__frame_t *frames, size_t n,
                                            kvb__frames_err_t *err, kvb__xferts_msg_t *msg_p)
{
    kvb__xferts_msg_t m;
    int64_t v;
    memset(&m, 0, sizeof(m));
    if (n != KVB__XFERTS_FRAMES && n != KVB__XFERTS_PLAN) {
        uint64_t room = 0;
        bool has = n >= 4 && kvb__frames_decode_peer(frames, n, KIND_XFERTS, true, NULL, &room,
                                                     &m.port) == KVB_OK;
        return failf(err, KIND_XFERTS, has, room, "expected 12 or 14 frames, got %zu", n);
    }
    kvb_status_t st = kvb__frames_decode_peer(frames, n, KIND_XFERTS, true, err, &m.room, &m.port);
    if (st != KVB_OK)
        return st;
    m.is_dummy = frames[4].len == 0 && frames[5].len == 0;
    m.aux_index = -1;
    KVB__FRAMES_TRY(kvb__frames_need_int(&frames[6], 6, KIND_XFERTS, "required_dst_info_num", 1,
                                         INT32_MAX, true, m.room, err, &v));
    m.required_dst_info_num = (int32_t)v;
    if (m.is_dummy) {
        for (size_t i = 7; i < n; i++)
            if (frames[i].len != 0)
                return failf(err, KIND_XFERTS, true, m.room,
                             "frame %zu: %zu bytes in a dummy (frames 4 and 5 empty)", i,
                             frames[i].len);
    } else {
        KVB__FRAMES_TRY(
            need_packed(&frames[4], 4, KIND_XFERTS, "dst_kv_indices", false, true, m.room, err));
        m.pages = (kvb__i64_view_t){frames[4].data, frames[4].len / 8};
        KVB__FRAMES_TRY(kvb__frames_need_int(&frames[5], 5, KIND_XFERTS, "aux index", 0, INT64_MAX,
                                             true, m.room, err, &m.aux_index));
        KVB__FRAMES_TRY(xfer_tail(frames, n, err, &m));
    }
    m.ip = (const char *)frames[1].data;
    m.ip_len = frames[1].len;
    m.session_id = (const char *)frames[3].data;
    m.session_id_len = frames[3].len;
    *msg_p = m;
    return KVB_OK;
}

kvb_status_t kvb__frames_decode_status_ts(const kvb__frame_t *frames, size_t n,
                                          kvb__frames_err_t *err, kvb__statusts_msg_t *msg_p)
{
    kvb__statusts_msg_t m;
    int64_t v;
    memset(&m, 0, sizeof(m));
    if (n != KVB__STATUSTS_FRAMES)
        return failf(err, KIND_STATUSTS, false, 0, "expected %d frames, got %zu",
                     KVB__STATUSTS_FRAMES, n);
    KVB__FRAMES_TRY(kvb__frames_need_int(&frames[0], 0, KIND_STATUSTS, "room", 0, INT64_MAX, false,
                                         0, err, &v));
    m.room = (uint64_t)v;
    KVB__FRAMES_TRY(kvb__frames_need_int(&frames[1], 1, KIND_STATUSTS, "status", 0, KVB__TS_SUCCESS,
                                         true, m.room, err, &v));
    m.status = (int32_t)v;
    KVB__FRAMES_TRY(kvb__frames_need_int(&frames[2], 2, KIND_STATUSTS, "sender", 0, INT32_MAX, true,
                                         m.room, err, &v));
    m.sender = (int32_t)v;
    if (frames[3].len == 2 && memcmp(frames[3].data, "-1", 2) == 0)
        m.first_token = -1;
    else
        KVB__FRAMES_TRY(kvb__frames_need_int(&frames[3], 3, KIND_STATUSTS, "first token", 0,
                                             INT64_MAX, true, m.room, err, &m.first_token));
    if (frames[4].len % 4 != 0)
        return failf(err, KIND_STATUSTS, true, m.room,
                     "frame 4 (candidates): length %zu is not a multiple of 4", frames[4].len);
    m.candidates = (kvb__i32_view_t){frames[4].data, frames[4].len / 4};
    *msg_p = m;
    return KVB_OK;
}

/* ---- encoders ---- */

static bool put_dec(kvb__frames_buf_t *b, long long v)
{
    char t[24];
    int k = snprintf(t, sizeof(t), "%lld", v);
    return kvb__frames_put(b, t, (size_t)k);
}

static bool put_udec(kvb__frames_buf_t *b, unsigned long long v)
{
    char t[24];
    int k = snprintf(t, sizeof(t), "%llu", v);
    return kvb__frames_put(b, t, (size_t)k);
}

static kvb_status_t verify(kvb__frames_buf_t *b, size_t n0, size_t len0, kvb__frames_err_t *err,
                           int which)
{
    size_t n = b->n - n0;
    kvb__frame_t *f = malloc((n ? n : 1) * sizeof(*f));
    kvb_status_t st = KVB_ERR_NOMEM;
    if (f != NULL) {
        for (size_t i = 0; i < n; i++)
            f[i] = kvb__frames_buf_get(b, n0 + i);
        kvb__regts_msg_t r;
        kvb__xferts_msg_t x;
        kvb__statusts_msg_t s;
        st = which == 0   ? kvb__frames_decode_registration_ts(f, n, err, &r)
             : which == 1 ? kvb__frames_decode_transfer_ts(f, n, err, &x)
                          : kvb__frames_decode_status_ts(f, n, err, &s);
        st = st == KVB_OK ? KVB_OK : KVB_ERR_INVALID;
        free(f);
    }
    if (st != KVB_OK) {
        b->n = n0;
        b->len = len0;
    }
    return st;
}

static kvb_status_t rollback(kvb__frames_buf_t *b, size_t n0, size_t len0)
{
    b->n = n0;
    b->len = len0;
    return KVB_ERR_NOMEM;
}

kvb_status_t kvb__frames_encode_registration_ts(const kvb__regts_msg_t *m, kvb__frames_err_t *err,
                                                kvb__frames_buf_t *out)
{
    size_t n0 = out->n, len0 = out->len;
    if (!kvb__frames_put(out, "None", 4) || !kvb__frames_put(out, m->ip, m->ip_len) ||
        !put_udec(out, m->port) || !kvb__frames_put(out, m->session_id, m->session_id_len) ||
        !kvb__frames_put(out, m->kv_ptrs.data, m->kv_ptrs.count * 8) ||
        !kvb__frames_put(out, NULL, 0) ||
        !kvb__frames_put(out, m->state_ptrs.data, m->state_ptrs.count * 8) ||
        !put_dec(out, m->prefix_len))
        return rollback(out, n0, len0);
    return verify(out, n0, len0, err, 0);
}

kvb_status_t kvb__frames_encode_transfer_ts(const kvb__xferts_msg_t *m, kvb__frames_err_t *err,
                                            kvb__frames_buf_t *out)
{
    size_t n0 = out->n, len0 = out->len;
    bool d = m->is_dummy;
    bool ok = put_udec(out, m->room) && kvb__frames_put(out, m->ip, m->ip_len) &&
              put_udec(out, m->port) && kvb__frames_put(out, m->session_id, m->session_id_len) &&
              kvb__frames_put(out, d ? NULL : m->pages.data, d ? 0 : m->pages.count * 8) &&
              (d ? kvb__frames_put(out, NULL, 0) : put_dec(out, m->aux_index)) &&
              put_dec(out, m->required_dst_info_num) &&
              (d ? kvb__frames_put(out, NULL, 0) : put_dec(out, m->prefix_len)) &&
              (d ? kvb__frames_put(out, NULL, 0) : put_dec(out, m->l1_5)) &&
              kvb__frames_put(out, NULL, 0) && kvb__frames_put(out, NULL, 0) &&
              kvb__frames_put(out, d ? NULL : m->state_idx.data, d ? 0 : m->state_idx.count * 8);
    if (ok && m->has_plan && !d)
        ok = put_dec(out, KVB__TS_PLAN_VERSION) && kvb__frames_put(out, m->plan_json, m->plan_len);
    if (!ok)
        return rollback(out, n0, len0);
    return verify(out, n0, len0, err, 1);
}

kvb_status_t kvb__frames_encode_status_ts(const kvb__statusts_msg_t *m, kvb__frames_err_t *err,
                                          kvb__frames_buf_t *out)
{
    size_t n0 = out->n, len0 = out->len;
    if (!put_udec(out, m->room) || !put_dec(out, m->status) || !put_dec(out, m->sender) ||
        !put_dec(out, m->first_token) ||
        !kvb__frames_put(out, m->candidates.data, m->candidates.count * 4))
        return rollback(out, n0, len0);
    return verify(out, n0, len0, err, 2);
}

/* ---- the plan (frame 13) ---- */

static const char *const KIND_NAMES[] = {"target_k", "target_v", "draft_k", "draft_v",
                                         "mamba_state"};
#define N_KINDS (sizeof(KIND_NAMES) / sizeof(KIND_NAMES[0]))

const char *kvb__ts_kind_name(kvb__ts_kind_t kind)
{
    return (size_t)kind < N_KINDS ? KIND_NAMES[kind] : "?";
}

/* The ten keys in TokenSpeed's order (TP:113-127). */
static const char *const KEYS[] = {
    "buffer_index",    "buffer_kind",           "src_rank",
    "dst_rank",        "src_page_stride_bytes", "dst_page_stride_bytes",
    "src_byte_offset", "dst_byte_offset",       "bytes_per_page",
    "page_count"};

static bool frag_int(json_t *o, const char *key, int64_t min, int64_t *out, size_t i, char *reason,
                     size_t rl)
{
    json_t *v = json_object_get(o, key);
    if (!json_is_integer(v) || json_integer_value(v) < min) {
        snprintf(reason, rl, "plan fragment %zu: \"%s\" must be a JSON integer >= %lld", i, key,
                 (long long)min);
        return false;
    }
    *out = json_integer_value(v);
    return true;
}

static bool frag_parse(json_t *o, size_t i, kvb__ts_frag_t *f, char *reason, size_t rl)
{
    int64_t v[8];
    if (!json_is_object(o) || json_object_size(o) != 10) {
        snprintf(reason, rl, "plan fragment %zu: not an object with exactly the ten keys", i);
        return false;
    }
    json_t *kind = json_object_get(o, "buffer_kind");
    size_t k = 0;
    while (json_is_string(kind) && k < N_KINDS && strcmp(json_string_value(kind), KIND_NAMES[k]))
        k++;
    if (!json_is_string(kind) || k == N_KINDS) {
        snprintf(reason, rl, "plan fragment %zu: unknown \"buffer_kind\"", i);
        return false;
    }
    static const int64_t mins[8] = {0, 0, 0, 1, 1, 0, 0, 1};
    static const int map[8] = {0, 2, 3, 4, 5, 6, 7, 8};
    for (size_t j = 0; j < 8; j++)
        if (!frag_int(o, KEYS[map[j]], mins[j], &v[j], i, reason, rl))
            return false;
    json_t *pc = json_object_get(o, "page_count");
    if (pc == NULL || (!json_is_null(pc) && (!json_is_integer(pc) || json_integer_value(pc) < 1))) {
        snprintf(reason, rl, "plan fragment %zu: \"page_count\" must be null or an integer >= 1",
                 i);
        return false;
    }
    *f = (kvb__ts_frag_t){(uint64_t)v[0], (kvb__ts_kind_t)k,
                          v[1],           v[2],
                          (uint64_t)v[3], (uint64_t)v[4],
                          (uint64_t)v[5], (uint64_t)v[6],
                          (uint64_t)v[7], json_is_null(pc) ? 0 : (uint64_t)json_integer_value(pc)};
    return true;
}

kvb_status_t kvb__ts_plan_parse(const uint8_t *json, size_t len, size_t max_frags,
                                kvb__ts_plan_t *plan_p, char *reason, size_t rl)
{
    json_error_t je;
    kvb_status_t st = KVB_ERR_PROTO;
    if (max_frags > KVB__TS_PLAN_MAX_FRAGS)
        max_frags = KVB__TS_PLAN_MAX_FRAGS;
    if (len > KVB__TS_PLAN_MAX_JSON) {
        snprintf(reason, rl, "plan: %zu bytes of JSON, kvbridge takes at most %u", len,
                 KVB__TS_PLAN_MAX_JSON);
        return KVB_ERR_PROTO;
    }
    json_t *root = json_loadb((const char *)json, len, JSON_REJECT_DUPLICATES, &je);
    if (root == NULL) {
        snprintf(reason, rl, "plan: not JSON (%s)", je.text);
        for (char *c = reason; *c != '\0'; c++) /* jansson quotes the peer's bytes */
            if ((unsigned char)*c < 0x20 || (unsigned char)*c > 0x7e)
                *c = '?';
        return KVB_ERR_PROTO;
    }
    size_t n = json_is_array(root) ? json_array_size(root) : 0;
    kvb__ts_frag_t *f = NULL;
    if (!json_is_array(root) || n == 0)
        snprintf(reason, rl, "plan: not a non-empty JSON array of fragments");
    else if (n > max_frags)
        snprintf(reason, rl, "plan: %zu fragments, at most %zu for this layout", n, max_frags);
    else if ((f = calloc(n, sizeof(*f))) == NULL)
        st = KVB_ERR_NOMEM;
    for (size_t i = 0; f != NULL && i < n; i++)
        if (!frag_parse(json_array_get(root, i), i, &f[i], reason, rl)) {
            free(f);
            f = NULL;
        }
    json_decref(root);
    if (f == NULL)
        return st;
    plan_p->n = n;
    plan_p->frags = f;
    return KVB_OK;
}

kvb_status_t kvb__ts_plan_encode(const kvb__ts_frag_t *frags, size_t n, char **json_p,
                                 size_t *len_p)
{
    size_t cap = 64 + n * 400, o = 1;
    char *s = malloc(cap);
    if (s == NULL)
        return KVB_ERR_NOMEM;
    s[0] = '[';
    for (size_t i = 0; i < n; i++) {
        const kvb__ts_frag_t *f = &frags[i];
        char pc[24];
        if (f->page_count == 0)
            snprintf(pc, sizeof(pc), "null");
        else
            snprintf(pc, sizeof(pc), "%llu", (unsigned long long)f->page_count);
        o += (size_t)snprintf(
            s + o, cap - o,
            "%s{\"buffer_index\":%llu,\"buffer_kind\":\"%s\",\"src_rank\":%lld,\"dst_rank\":%lld,"
            "\"src_page_stride_bytes\":%llu,\"dst_page_stride_bytes\":%llu,\"src_byte_offset\":"
            "%llu,\"dst_byte_offset\":%llu,\"bytes_per_page\":%llu,\"page_count\":%s}",
            i ? "," : "", (unsigned long long)f->buffer_index, kvb__ts_kind_name(f->kind),
            (long long)f->src_rank, (long long)f->dst_rank, (unsigned long long)f->src_stride,
            (unsigned long long)f->dst_stride, (unsigned long long)f->src_off,
            (unsigned long long)f->dst_off, (unsigned long long)f->bytes, pc);
    }
    s[o++] = ']';
    s[o] = '\0';
    *json_p = s;
    *len_p = o;
    return KVB_OK;
}

void kvb__ts_plan_free(kvb__ts_plan_t *plan)
{
    if (plan == NULL)
        return;
    free(plan->frags);
    plan->frags = NULL;
    plan->n = 0;
}
