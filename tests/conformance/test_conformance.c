/* Conformance corpus replay (docs/testing.md, "Conformance corpus";
 * tests/conformance/README.md): every golden file under
 * tests/conformance/<dialect>/ is one wire message of one dialect.
 *
 * - ZeroMQ messages ("frames"): kvbridge's decoder must accept them and give
 *   exactly the "expect" fields (written by corpus.py's own reading of the
 *   specs, or of a real peer's recording); decoding then re-encoding with
 *   kvbridge's encoder must give the same bytes exactly when the file says
 *   "kvbridge_encodes": true (and different bytes when false, so the flag
 *   cannot rot); malformed variants made from the message (too few frames,
 *   an extra frame, each packed frame truncated, each integer at a wrong
 *   width, each count or decimal huge) are refused with KVB_ERR_PROTO and a
 *   reason naming the frame (or the frame count), with the room when frame 0
 *   parsed, and never crash (the suite runs it under ASan as well).
 * - Bootstrap bodies ("body"): the PUT /route body parses to "expect" (kvbridge's
 *   reading, as its own serialisation), a GET /route answer to "expect" (the
 *   client's parsed fields); files with "server_puts" are what kvbridge's
 *   server answers after those PUTs, compared byte for byte; malformed variants
 *   (cut in half, each key of the wrong type) are refused naming the key.
 *
 * Usage: test_conformance CORPUS_DIR            replay everything
 *        test_conformance --probe FILE          what kvbridge makes of one file
 *                                               (corpus.py build / import)
 *        test_conformance --read KIND BODY      print kvbridge's reading of a body
 *        test_conformance --serve KIND PUT...   print kvbridge's server answer */
#include "bootstrap/boot_table.h"
#include "kvb_test.h"
#include "proto/bootstrap_proto.h"
#include "dialect/sglang2026/frames.h"
#include "dialect/tokenspeed_seed/frames.h"

#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the corpus' packed arrays are little-endian (every host the peers support)"
#endif

static const char *g_file; /* the golden file being replayed */
static int g_variants, g_files, g_bad;

#define FAILF(...)                                                                                 \
    do {                                                                                           \
        fprintf(stderr, "%s: ", g_file);                                                           \
        fprintf(stderr, __VA_ARGS__);                                                              \
        fputc('\n', stderr);                                                                       \
        exit(1);                                                                                   \
    } while (0)

/* ------------------------------------------------------------------ JSON out */

static json_t *jstrn(const void *p, size_t n)
{
    return json_stringn(p != NULL ? (const char *)p : "", n);
}
static json_t *jint(long long v)
{
    return json_integer(v);
}
static json_t *jarr_w(const uint8_t *d, size_t count, int w, bool sign)
{
    json_t *a = json_array();
    for (size_t i = 0; i < count; i++) {
        uint64_t u = 0;
        memcpy(&u, d + i * (size_t)w, (size_t)w);
        long long v = (long long)u;
        if (sign && w == 4)
            v = (int32_t)(uint32_t)u;
        json_array_append_new(a, json_integer(v));
    }
    return a;
}
static json_t *ju64(kvb__u64_view_t v)
{
    return jarr_w(v.data, v.count, 8, false);
}
static json_t *ji32(kvb__i32_view_t v)
{
    return jarr_w(v.data, v.count, 4, true);
}
static json_t *ji64(kvb__i64_view_t v)
{
    return jarr_w(v.data, v.count, 8, true);
}
static json_t *ju32(kvb__u32_view_t v)
{
    return jarr_w(v.data, v.count, 4, false);
}
static json_t *jlol(kvb__lol_view_t v)
{
    json_t *a = json_array();
    for (uint32_t i = 0; i < v.n; i++) {
        const uint8_t *d;
        size_t count;
        kvb__lol_list(v, i, &d, &count);
        json_array_append_new(a, jarr_w(d, count, v.elem, true));
    }
    return a;
}
static json_t *jhex(const uint8_t *p, size_t n)
{
    char *s = malloc(2 * n + 1);
    for (size_t i = 0; i < n; i++)
        sprintf(s + 2 * i, "%02x", p[i]);
    s[2 * n] = 0;
    json_t *o = json_string(s);
    free(s);
    return o;
}
/* A frame as corpus text: "t:" printable ASCII, else "x:" hex. */
static json_t *jframe(kvb__frame_t f)
{
    bool text = true;
    for (size_t i = 0; i < f.len; i++)
        text = text && f.data[i] >= 0x20 && f.data[i] < 0x7f;
    size_t cap = 2 * f.len + 3;
    char *s = malloc(cap);
    if (text) {
        memcpy(s, "t:", 2);
        if (f.len)
            memcpy(s + 2, f.data, f.len);
        s[2 + f.len] = 0;
    } else {
        memcpy(s, "x:", 2);
        for (size_t i = 0; i < f.len; i++)
            sprintf(s + 2 + 2 * i, "%02x", f.data[i]);
        s[2 + 2 * f.len] = 0;
    }
    json_t *o = json_string(s);
    free(s);
    return o;
}
static json_t *jext(const kvb__frame_t *ext, size_t n)
{
    json_t *a = json_array();
    for (size_t i = 0; i < n; i++)
        json_array_append_new(a, jframe(ext[i]));
    return a;
}
static json_t *jmask(bool has, const uint8_t *m, size_t n)
{
    if (!has)
        return json_null();
    return jarr_w(m, n, 1, false);
}

/* ------------------------------------------------------------------ frame kinds */

typedef enum { F_TAG, F_TEXT, F_DEC, F_U64, F_I32, F_I64, F_U32, F_LOL, F_BE32, F_RAW } ftype_t;

typedef struct kind_ops {
    const char *dialect, *kind;
    size_t min_frames; /* fewer dialect frames are refused */
    int room_frame;    /* -1: none */
    /* decode; on KVB_OK *got is the expect object */
    kvb_status_t (*decode)(const kvb__frame_t *f, size_t n, kvb__frames_err_t *e, json_t **got);
    /* decode then encode into out */
    kvb_status_t (*reencode)(const kvb__frame_t *f, size_t n, kvb__frames_buf_t *out);
    ftype_t (*type)(size_t i, size_t n_dialect);
} kind_ops_t;

/* seed 001 */
static kvb_status_t dec_reg25(const kvb__frame_t *f, size_t n, kvb__frames_err_t *e, json_t **got)
{
    kvb__reg_msg_t m;
    kvb_status_t st = kvb__frames_decode_registration(f, n, e, &m);
    if (st == KVB_OK)
        *got = json_pack(
            "{s:o, s:I, s:o, s:o, s:o, s:I, s:I, s:I, s:o, s:o}", "ip", jstrn(m.ip, m.ip_len),
            "port", (json_int_t)m.port, "session_id", jstrn(m.session_id, m.session_id_len),
            "kv_ptrs", ju64(m.kv_ptrs), "aux_ptrs", ju64(m.aux_ptrs), "dst_tp_rank",
            (json_int_t)m.dst_tp_rank, "dst_attn_tp_size", (json_int_t)m.dst_attn_tp_size,
            "dst_kv_item_len", (json_int_t)m.dst_kv_item_len, "state_ptrs",
            m.has_state_ptrs ? ju64(m.state_ptrs) : json_null(), "ext", jext(m.ext, m.n_ext));
    return st;
}
static kvb_status_t enc_reg25(const kvb__frame_t *f, size_t n, kvb__frames_buf_t *out)
{
    kvb__reg_msg_t m;
    kvb_status_t st = kvb__frames_decode_registration(f, n, NULL, &m);
    return st != KVB_OK ? st : kvb__frames_encode_registration(&m, NULL, out);
}
static ftype_t ty_reg25(size_t i, size_t nd)
{
    (void)nd;
    static const ftype_t t[] = {F_TAG, F_TEXT, F_DEC, F_TEXT, F_U64, F_U64, F_DEC, F_DEC, F_DEC};
    return i < 9 ? t[i] : F_RAW;
}

static kvb_status_t dec_xfer25(const kvb__frame_t *f, size_t n, kvb__frames_err_t *e, json_t **got)
{
    kvb__xfer_msg_t m;
    kvb_status_t st = kvb__frames_decode_transfer(f, n, e, &m);
    if (st == KVB_OK)
        *got = json_pack(
            "{s:I, s:o, s:I, s:o, s:b, s:o, s:I, s:I, s:o, s:o, s:o, s:o, s:o}", "room",
            (json_int_t)m.room, "ip", jstrn(m.ip, m.ip_len), "port", (json_int_t)m.port,
            "session_id", jstrn(m.session_id, m.session_id_len), "is_dummy", (int)m.is_dummy,
            "pages", ji32(m.pages), "aux_index", (json_int_t)m.aux_index, "required_dst_info_num",
            (json_int_t)m.required_dst_info_num, "page_mask",
            jmask(m.has_page_mask, m.page_mask, m.pages.count), "prefix_len",
            m.has_prefix_len ? jint(m.prefix_len) : json_null(), "state_idx",
            m.has_state_idx ? ji32(m.state_idx) : json_null(), "epoch",
            m.has_epoch ? jint((long long)m.epoch) : json_null(), "ext", jext(m.ext, m.n_ext));
    return st;
}
static kvb_status_t enc_xfer25(const kvb__frame_t *f, size_t n, kvb__frames_buf_t *out)
{
    kvb__xfer_msg_t m;
    kvb_status_t st = kvb__frames_decode_transfer(f, n, NULL, &m);
    return st != KVB_OK ? st : kvb__frames_encode_transfer(&m, NULL, out);
}
static ftype_t ty_xfer25(size_t i, size_t nd)
{
    (void)nd;
    static const ftype_t t[] = {F_DEC, F_TEXT, F_DEC, F_TEXT, F_I32, F_DEC, F_DEC};
    return i < 7 ? t[i] : F_RAW;
}

static kvb_status_t dec_status(const kvb__frame_t *f, size_t n, kvb__frames_err_t *e, json_t **got)
{
    kvb__status_msg_t m;
    kvb_status_t st = kvb__frames_decode_status(f, n, e, &m);
    if (st == KVB_OK)
        *got = json_pack("{s:I, s:I, s:I}", "room", (json_int_t)m.room, "status",
                         (json_int_t)m.status, "prefill_rank", (json_int_t)m.prefill_rank);
    return st;
}
static kvb_status_t enc_status(const kvb__frame_t *f, size_t n, kvb__frames_buf_t *out)
{
    kvb__status_msg_t m;
    kvb_status_t st = kvb__frames_decode_status(f, n, NULL, &m);
    return st != KVB_OK ? st : kvb__frames_encode_status(&m, NULL, out);
}
static ftype_t ty_status(size_t i, size_t nd)
{
    (void)nd;
    (void)i;
    return F_DEC;
}

static kvb_status_t dec_aux(const kvb__frame_t *f, size_t n, kvb__frames_err_t *e, json_t **got)
{
    kvb__aux_msg_t m;
    kvb_status_t st = kvb__frames_decode_aux(f, n, e, &m);
    if (st == KVB_OK)
        *got = json_pack("{s:I, s:I, s:I, s:o}", "room", (json_int_t)m.room, "buffer_index",
                         (json_int_t)m.buffer_index, "aux_index", (json_int_t)m.aux_index,
                         "payload", jhex(m.payload, m.payload_len));
    return st;
}
static kvb_status_t enc_aux(const kvb__frame_t *f, size_t n, kvb__frames_buf_t *out)
{
    kvb__aux_msg_t m;
    kvb_status_t st = kvb__frames_decode_aux(f, n, NULL, &m);
    return st != KVB_OK ? st : kvb__frames_encode_aux(&m, NULL, out);
}
static ftype_t ty_aux(size_t i, size_t nd)
{
    (void)nd;
    static const ftype_t t[] = {F_TAG, F_DEC, F_DEC, F_DEC, F_BE32, F_RAW};
    return t[i];
}

/* 2026 */
static kvb_status_t dec_reg26(const kvb__frame_t *f, size_t n, kvb__frames_err_t *e, json_t **got)
{
    kvb__reg26_msg_t m;
    kvb_status_t st = kvb__frames_decode_registration26(f, n, e, &m);
    if (st != KVB_OK)
        return st;
    json_t *o =
        json_pack("{s:o, s:I, s:o, s:o, s:o, s:o, s:I, s:I, s:I}", "ip", jstrn(m.ip, m.ip_len),
                  "port", (json_int_t)m.port, "session_id", jstrn(m.session_id, m.session_id_len),
                  "kv_ptrs", ju64(m.kv_ptrs), "aux_ptrs", ju64(m.aux_ptrs), "state_ptrs",
                  jlol(m.state_ptrs), "dst_tp_rank", (json_int_t)m.dst_tp_rank, "dst_attn_tp_size",
                  (json_int_t)m.dst_attn_tp_size, "dst_kv_item_len", (json_int_t)m.dst_kv_item_len);
    json_object_update_new(
        o,
        json_pack("{s:o, s:o, s:o, s:o, s:o, s:I, s:I, s:I, s:o, s:o, s:I, s:o}", "state_item_lens",
                  jlol(m.state_item_lens), "state_dims", jlol(m.state_dims), "kv_layer_ids",
                  ju32(m.kv_layer_ids), "state_layer_ids", jlol(m.state_layer_ids), "staging_base",
                  m.has_staging_base ? jint((long long)m.staging_base) : json_null(),
                  "staging_size", (json_int_t)m.staging_size, "dcp_size", (json_int_t)m.dcp_size,
                  "dcp_rank", (json_int_t)m.dcp_rank, "staging_slot_ids", ju64(m.staging_slot_ids),
                  "kv_item_lens", ju64(m.kv_item_lens), "n_fixed", (json_int_t)m.n_fixed, "ext",
                  jext(m.ext, m.n_ext)));
    *got = o;
    return KVB_OK;
}
static kvb_status_t enc_reg26(const kvb__frame_t *f, size_t n, kvb__frames_buf_t *out)
{
    kvb__reg26_msg_t m;
    kvb_status_t st = kvb__frames_decode_registration26(f, n, NULL, &m);
    return st != KVB_OK ? st : kvb__frames_encode_registration26(&m, NULL, out);
}
static ftype_t ty_reg26(size_t i, size_t nd)
{
    (void)nd;
    static const ftype_t t[] = {F_TAG, F_TEXT, F_DEC, F_TEXT, F_U64, F_U64, F_LOL,
                                F_DEC, F_DEC,  F_DEC, F_LOL,  F_LOL, F_U32, F_LOL,
                                F_RAW, F_DEC,  F_DEC, F_DEC,  F_U64, F_U64};
    return i < 20 ? t[i] : F_RAW;
}

static kvb_status_t dec_xfer26(const kvb__frame_t *f, size_t n, kvb__frames_err_t *e, json_t **got)
{
    kvb__xfer26_msg_t m;
    kvb_status_t st = kvb__frames_decode_transfer26(f, n, e, &m);
    if (st != KVB_OK)
        return st;
    json_t *o =
        json_pack("{s:I, s:o, s:I, s:o, s:b, s:o, s:I, s:o, s:I}", "room", (json_int_t)m.room, "ip",
                  jstrn(m.ip, m.ip_len), "port", (json_int_t)m.port, "session_id",
                  jstrn(m.session_id, m.session_id_len), "is_dummy", (int)m.is_dummy, "pages",
                  ji32(m.pages), "aux_index", (json_int_t)m.aux_index, "state_idx",
                  jlol(m.state_idx), "required_dst_info_num", (json_int_t)m.required_dst_info_num);
    json_object_update_new(
        o, json_pack("{s:o, s:o, s:o, s:o, s:I, s:o}", "prefix_len",
                     m.has_prefix_len ? jint(m.prefix_len) : json_null(), "device_pages",
                     ji32(m.device_pages), "epoch",
                     m.has_epoch ? jint((long long)m.epoch) : json_null(), "page_mask",
                     jmask(m.has_page_mask, m.page_mask, m.pages.count), "n_fixed",
                     (json_int_t)m.n_fixed, "ext", jext(m.ext, m.n_ext)));
    *got = o;
    return KVB_OK;
}
static kvb_status_t enc_xfer26(const kvb__frame_t *f, size_t n, kvb__frames_buf_t *out)
{
    kvb__xfer26_msg_t m;
    kvb_status_t st = kvb__frames_decode_transfer26(f, n, NULL, &m);
    return st != KVB_OK ? st : kvb__frames_encode_transfer26(&m, NULL, out);
}
static ftype_t ty_xfer26(size_t i, size_t nd)
{
    (void)nd;
    static const ftype_t t[] = {F_DEC, F_TEXT, F_DEC, F_TEXT, F_I32,
                                F_DEC, F_LOL,  F_DEC, F_DEC,  F_I32};
    return i < 10 ? t[i] : F_RAW;
}

static kvb_status_t dec_abort(const kvb__frame_t *f, size_t n, kvb__frames_err_t *e, json_t **got)
{
    kvb__abort_msg_t m;
    kvb_status_t st = kvb__frames_decode_abort(f, n, e, &m);
    if (st == KVB_OK)
        *got = json_pack("{s:I, s:o, s:I, s:o}", "room", (json_int_t)m.room, "ip",
                         jstrn(m.ip, m.ip_len), "port", (json_int_t)m.port, "generation",
                         m.has_generation ? jint((long long)m.generation) : json_null());
    return st;
}
static kvb_status_t enc_abort(const kvb__frame_t *f, size_t n, kvb__frames_buf_t *out)
{
    kvb__abort_msg_t m;
    kvb_status_t st = kvb__frames_decode_abort(f, n, NULL, &m);
    return st != KVB_OK ? st : kvb__frames_encode_abort(&m, NULL, out);
}
static ftype_t ty_abort(size_t i, size_t nd)
{
    (void)nd;
    static const ftype_t t[] = {F_TAG, F_DEC, F_TEXT, F_DEC, F_DEC};
    return t[i];
}

static kvb_status_t dec_ack(const kvb__frame_t *f, size_t n, kvb__frames_err_t *e, json_t **got)
{
    kvb__abort_ack_msg_t m;
    kvb_status_t st = kvb__frames_decode_abort_ack(f, n, e, &m);
    if (st == KVB_OK)
        *got = json_pack("{s:I, s:o, s:o}", "room", (json_int_t)m.room, "rank",
                         m.has_rank ? jint(m.rank) : json_null(), "generation",
                         m.has_generation ? jint((long long)m.generation) : json_null());
    return st;
}
static kvb_status_t enc_ack(const kvb__frame_t *f, size_t n, kvb__frames_buf_t *out)
{
    kvb__abort_ack_msg_t m;
    kvb_status_t st = kvb__frames_decode_abort_ack(f, n, NULL, &m);
    return st != KVB_OK ? st : kvb__frames_encode_abort_ack(&m, NULL, out);
}
static ftype_t ty_ack(size_t i, size_t nd)
{
    (void)nd;
    return i == 0 ? F_TAG : F_DEC;
}

/* TokenSpeed seed 004 */
static kvb_status_t dec_regts(const kvb__frame_t *f, size_t n, kvb__frames_err_t *e, json_t **got)
{
    kvb__regts_msg_t m;
    kvb_status_t st = kvb__frames_decode_registration_ts(f, n, e, &m);
    if (st == KVB_OK)
        *got = json_pack("{s:o, s:I, s:o, s:o, s:o, s:I}", "ip", jstrn(m.ip, m.ip_len), "port",
                         (json_int_t)m.port, "session_id", jstrn(m.session_id, m.session_id_len),
                         "kv_ptrs", ju64(m.kv_ptrs), "state_ptrs", ju64(m.state_ptrs), "prefix_len",
                         (json_int_t)m.prefix_len);
    return st;
}
static kvb_status_t enc_regts(const kvb__frame_t *f, size_t n, kvb__frames_buf_t *out)
{
    kvb__regts_msg_t m;
    kvb_status_t st = kvb__frames_decode_registration_ts(f, n, NULL, &m);
    return st != KVB_OK ? st : kvb__frames_encode_registration_ts(&m, NULL, out);
}
static ftype_t ty_regts(size_t i, size_t nd)
{
    (void)nd;
    static const ftype_t t[] = {F_TAG, F_TEXT, F_DEC, F_TEXT, F_U64, F_RAW, F_U64, F_DEC};
    return t[i];
}

static json_t *jplan(const uint8_t *json, size_t len)
{
    kvb__ts_plan_t p;
    char reason[256];
    if (kvb__ts_plan_parse(json, len, KVB__TS_PLAN_MAX_FRAGS, &p, reason, sizeof(reason)) != KVB_OK)
        FAILF("plan refused: %s", reason);
    json_t *a = json_array();
    for (size_t i = 0; i < p.n; i++) {
        const kvb__ts_frag_t *g = &p.frags[i];
        json_array_append_new(
            a, json_pack("{s:I, s:s, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:o}", "buffer_index",
                         (json_int_t)g->buffer_index, "buffer_kind", kvb__ts_kind_name(g->kind),
                         "src_rank", (json_int_t)g->src_rank, "dst_rank", (json_int_t)g->dst_rank,
                         "src_page_stride_bytes", (json_int_t)g->src_stride,
                         "dst_page_stride_bytes", (json_int_t)g->dst_stride, "src_byte_offset",
                         (json_int_t)g->src_off, "dst_byte_offset", (json_int_t)g->dst_off,
                         "bytes_per_page", (json_int_t)g->bytes, "page_count",
                         g->page_count ? jint((long long)g->page_count) : json_null()));
    }
    /* kvbridge's plan encoder (its decode's plans) writes TokenSpeed's bytes. */
    char *text;
    size_t tlen;
    CHECK_EQ(kvb__ts_plan_encode(p.frags, p.n, &text, &tlen), KVB_OK);
    if (tlen != len || memcmp(text, json, len) != 0)
        FAILF("kvb__ts_plan_encode differs from the golden plan:\n  %.*s\n  %.*s", (int)tlen, text,
              (int)len, (const char *)json);
    free(text);
    kvb__ts_plan_free(&p);
    return a;
}

static kvb_status_t dec_xferts(const kvb__frame_t *f, size_t n, kvb__frames_err_t *e, json_t **got)
{
    kvb__xferts_msg_t m;
    kvb_status_t st = kvb__frames_decode_transfer_ts(f, n, e, &m);
    if (st != KVB_OK)
        return st;
    json_t *o =
        json_pack("{s:I, s:o, s:I, s:o, s:b, s:o, s:I, s:I, s:I}", "room", (json_int_t)m.room, "ip",
                  jstrn(m.ip, m.ip_len), "port", (json_int_t)m.port, "session_id",
                  jstrn(m.session_id, m.session_id_len), "is_dummy", (int)m.is_dummy, "pages",
                  ji64(m.pages), "aux_index", (json_int_t)m.aux_index, "required_dst_info_num",
                  (json_int_t)m.required_dst_info_num, "prefix_len", (json_int_t)m.prefix_len);
    json_object_update_new(o, json_pack("{s:I, s:I, s:I, s:o, s:o}", "l1_5", (json_int_t)m.l1_5,
                                        "mask_len", (json_int_t)m.mask_len, "local_len",
                                        (json_int_t)m.local_len, "state_idx", ji64(m.state_idx),
                                        "plan",
                                        m.has_plan ? jplan(m.plan_json, m.plan_len) : json_null()));
    *got = o;
    return KVB_OK;
}
static kvb_status_t enc_xferts(const kvb__frame_t *f, size_t n, kvb__frames_buf_t *out)
{
    kvb__xferts_msg_t m;
    kvb_status_t st = kvb__frames_decode_transfer_ts(f, n, NULL, &m);
    return st != KVB_OK ? st : kvb__frames_encode_transfer_ts(&m, NULL, out);
}
static ftype_t ty_xferts(size_t i, size_t nd)
{
    (void)nd;
    static const ftype_t t[] = {F_DEC, F_TEXT, F_DEC, F_TEXT, F_I64, F_DEC, F_DEC,
                                F_DEC, F_DEC,  F_RAW, F_I64,  F_I64, F_DEC, F_RAW};
    return t[i];
}

static kvb_status_t dec_statusts(const kvb__frame_t *f, size_t n, kvb__frames_err_t *e,
                                 json_t **got)
{
    kvb__statusts_msg_t m;
    kvb_status_t st = kvb__frames_decode_status_ts(f, n, e, &m);
    if (st == KVB_OK)
        *got = json_pack("{s:I, s:I, s:I, s:I, s:o}", "room", (json_int_t)m.room, "status",
                         (json_int_t)m.status, "sender", (json_int_t)m.sender, "first_token",
                         (json_int_t)m.first_token, "candidates", ji32(m.candidates));
    return st;
}
static kvb_status_t enc_statusts(const kvb__frame_t *f, size_t n, kvb__frames_buf_t *out)
{
    kvb__statusts_msg_t m;
    kvb_status_t st = kvb__frames_decode_status_ts(f, n, NULL, &m);
    return st != KVB_OK ? st : kvb__frames_encode_status_ts(&m, NULL, out);
}
static ftype_t ty_statusts(size_t i, size_t nd)
{
    (void)nd;
    return i == 4 ? F_I32 : F_DEC;
}

static const kind_ops_t KINDS[] = {
    {"sglang2025", "registration", 9, -1, dec_reg25, enc_reg25, ty_reg25},
    {"sglang2025", "transfer", 7, 0, dec_xfer25, enc_xfer25, ty_xfer25},
    {"sglang2025", "status", 3, 0, dec_status, enc_status, ty_status},
    {"sglang2025", "aux", 6, 1, dec_aux, enc_aux, ty_aux},
    {"sglang2026", "registration", 10, -1, dec_reg26, enc_reg26, ty_reg26},
    {"sglang2026", "transfer", 8, 0, dec_xfer26, enc_xfer26, ty_xfer26},
    {"sglang2026", "status", 3, 0, dec_status, enc_status, ty_status},
    {"sglang2026", "aux", 6, 1, dec_aux, enc_aux, ty_aux},
    {"sglang2026", "abort", 4, 1, dec_abort, enc_abort, ty_abort},
    {"sglang2026", "abort_ack", 2, 1, dec_ack, enc_ack, ty_ack},
    {"tokenspeed_seed004", "registration", 8, -1, dec_regts, enc_regts, ty_regts},
    {"tokenspeed_seed004", "transfer", 12, 0, dec_xferts, enc_xferts, ty_xferts},
    {"tokenspeed_seed004", "status", 5, 0, dec_statusts, enc_statusts, ty_statusts},
};

/* ------------------------------------------------------------------ frames in */

typedef struct msg {
    kvb__frame_t f[64];
    uint8_t *own[64];
    size_t n;
} msg_t;

static void msg_free(msg_t *m)
{
    for (size_t i = 0; i < m->n; i++)
        free(m->own[i]);
    m->n = 0;
}
static void msg_set(msg_t *m, size_t i, const void *p, size_t len)
{
    uint8_t *b = malloc(len ? len : 1); /* exact size: ASan sees any over-read */
    if (len)
        memcpy(b, p, len);
    if (i < m->n)
        free(m->own[i]);
    m->own[i] = b;
    m->f[i] = (kvb__frame_t){b, len};
}
static void msg_copy(msg_t *dst, const msg_t *src)
{
    dst->n = 0;
    for (size_t i = 0; i < src->n; i++) {
        dst->n = i; /* msg_set frees only i < n */
        msg_set(dst, i, src->f[i].data, src->f[i].len);
    }
    dst->n = src->n;
}
static void msg_load(msg_t *m, json_t *frames)
{
    size_t i;
    json_t *v;
    m->n = 0;
    if (!json_is_array(frames) || json_array_size(frames) > 60)
        FAILF("\"frames\": an array of at most 60 strings");
    json_array_foreach(frames, i, v)
    {
        const char *s = json_string_value(v);
        if (s == NULL)
            FAILF("frame %zu: not a string", i);
        size_t len = strlen(s);
        if (strncmp(s, "t:", 2) == 0) {
            msg_set(m, i, s + 2, len - 2);
        } else if (strncmp(s, "x:", 2) == 0 && len % 2 == 0) {
            size_t nb = (len - 2) / 2;
            uint8_t *b = malloc(nb ? nb : 1);
            for (size_t k = 0; k < nb; k++) {
                unsigned x;
                if (sscanf(s + 2 + 2 * k, "%2x", &x) != 1)
                    FAILF("frame %zu: bad hex", i);
                b[k] = (uint8_t)x;
            }
            msg_set(m, i, b, nb);
            free(b);
        } else {
            FAILF("frame %zu: neither \"t:\" nor \"x:\" (hex)", i);
        }
        m->n = i + 1;
    }
}

static size_t dialect_count(const msg_t *m)
{
    return kvb__frames_dialect_count(m->f, m->n);
}

/* ------------------------------------------------------------------ frame replay */

/* One malformed variant: must be refused naming `want` (NULL: any non-empty
 * reason), with the room when want_room. */
static void expect_refused(const kind_ops_t *k, const msg_t *m, const char *what, const char *want,
                           bool want_room, uint64_t room)
{
    kvb__frames_err_t e;
    json_t *got = NULL;
    memset(&e, 0, sizeof(e));
    kvb_status_t st = k->decode(m->f, m->n, &e, &got);
    g_variants++;
    if (st == KVB_OK) {
        char *s = json_dumps(got, JSON_COMPACT);
        FAILF("%s %s, variant \"%s\": accepted (%s)", k->dialect, k->kind, what, s);
    }
    if (st != KVB_ERR_PROTO)
        FAILF("variant \"%s\": status %d, not KVB_ERR_PROTO", what, (int)st);
    if (e.reason[0] == 0 || (want != NULL && strstr(e.reason, want) == NULL))
        FAILF("variant \"%s\": reason \"%s\" does not name \"%s\"", what, e.reason,
              want ? want : "");
    if (want_room && (!e.has_room || e.room != room))
        FAILF("variant \"%s\": reason \"%s\" without the room %llu", what, e.reason,
              (unsigned long long)room);
}

static void mutate_frames(const kind_ops_t *k, const msg_t *gold, uint64_t room, bool has_room)
{
    msg_t v = {0};
    char what[96], want[32];
    size_t nd = dialect_count(gold);

    /* too few frames */
    msg_copy(&v, gold);
    for (size_t i = k->min_frames - 1; i < v.n; i++)
        free(v.own[i]);
    v.n = k->min_frames - 1;
    expect_refused(k, &v, "one frame fewer than the dialect's minimum", "frames", false, 0);
    msg_free(&v);

    /* an extra (unmarked, not key=value) frame */
    msg_copy(&v, gold);
    msg_set(&v, v.n, "\xff", 1);
    v.n++;
    expect_refused(k, &v, "an extra frame", "frame", false, 0);
    msg_free(&v);

    for (size_t i = 0; i < nd; i++) {
        ftype_t t = k->type(i, nd);
        const kvb__frame_t g = gold->f[i];
        bool room_ok = has_room && (int)i > k->room_frame && k->room_frame >= 0;
        int w = t == F_U64 || t == F_I64 ? 8 : t == F_I32 || t == F_U32 ? 4 : 0;
        snprintf(want, sizeof(want), "frame %zu", i);
        if (w && g.len > 0) {
            /* truncated: one byte short */
            msg_copy(&v, gold);
            msg_set(&v, i, g.data, g.len - 1);
            snprintf(what, sizeof(what), "frame %zu truncated by one byte", i);
            expect_refused(k, &v, what, want, room_ok, room);
            /* wrong width: the last element half as wide */
            msg_set(&v, i, g.data, g.len - (size_t)w / 2);
            snprintf(what, sizeof(what), "frame %zu: last element %d bytes, not %d", i, w / 2, w);
            expect_refused(k, &v, what, want, room_ok, room);
            msg_free(&v);
        }
        if (t == F_DEC && g.len > 0) {
            /* the integer sent binary (as a packed int64) */
            char digits[32] = {0};
            memcpy(digits, g.data, g.len < 31 ? g.len : 31);
            long long x = strtoll(digits, NULL, 10);
            msg_copy(&v, gold);
            msg_set(&v, i, &x, 8);
            snprintf(what, sizeof(what), "frame %zu: integer as 8 binary bytes", i);
            expect_refused(k, &v, what, want, room_ok, room);
            /* huge: 2^64 */
            msg_set(&v, i, "18446744073709551616", 20);
            snprintf(what, sizeof(what), "frame %zu: 2^64", i);
            expect_refused(k, &v, what, want, room_ok && (int)i != k->room_frame, room);
            msg_free(&v);
        }
        if (t == F_LOL && g.len >= 8) {
            uint8_t *b = malloc(g.len);
            memcpy(b, g.data, g.len);
            memset(b, 0xff, 4); /* list count 2^32-1 */
            msg_copy(&v, gold);
            msg_set(&v, i, b, g.len);
            snprintf(what, sizeof(what), "frame %zu: list count 2^32-1", i);
            expect_refused(k, &v, what, want, room_ok, room);
            memcpy(b, g.data, g.len);
            memset(b + 4, 0xff, 4); /* first list 4 GiB long */
            msg_set(&v, i, b, g.len);
            snprintf(what, sizeof(what), "frame %zu: first list length 2^32-1", i);
            expect_refused(k, &v, what, want, room_ok, room);
            msg_set(&v, i, g.data, g.len - 1);
            snprintf(what, sizeof(what), "frame %zu truncated by one byte", i);
            expect_refused(k, &v, what, want, room_ok, room);
            msg_free(&v);
            free(b);
        }
        if (t == F_BE32) {
            msg_copy(&v, gold);
            msg_set(&v, i, "\xff\xff\xff\xff", 4);
            snprintf(what, sizeof(what), "frame %zu: payload length 2^32-1", i);
            expect_refused(k, &v, what, "frame", room_ok, room);
            msg_set(&v, i, "\x00\x00\x08", 3);
            snprintf(what, sizeof(what), "frame %zu: a 3-byte length", i);
            expect_refused(k, &v, what, "frame", room_ok, room);
            msg_free(&v);
        }
    }
}

/* TokenSpeed plans: malformed variants of frame 13 go to kvb__ts_plan_parse. */
static void mutate_plan(const uint8_t *json, size_t len)
{
    static const struct {
        const char *from, *to, *want;
    } subs[] = {
        {"\"page_count\":null", "\"page_count\":18446744073709551616", "too big integer"},
        {"\"page_count\":null", "\"page_count\":1e30", "page_count"},
        {"\"bytes_per_page\":1024", "\"bytes_per_page\":1024.0", "bytes_per_page"},
        {"\"bytes_per_page\":1024", "\"bytes_per_page\":\"1024\"", "bytes_per_page"},
        {"\"src_byte_offset\":0", "\"src_byte_offset\":-1", "src_byte_offset"},
        {"\"buffer_kind\":\"target_k\"", "\"buffer_kind\":\"target_q\"", "buffer_kind"},
        {"\"dst_rank\":0,", "", "ten keys"},
    };
    char *s = malloc(len + 1), reason[256];
    kvb__ts_plan_t p;
    memcpy(s, json, len);
    s[len] = 0;
    for (size_t i = 0; i < sizeof(subs) / sizeof(subs[0]); i++) {
        char *at = strstr(s, subs[i].from);
        if (at == NULL)
            FAILF("plan variant %zu: \"%s\" not in the plan", i, subs[i].from);
        size_t a = (size_t)(at - s), fl = strlen(subs[i].from), tl = strlen(subs[i].to);
        size_t nl = len - fl + tl;
        uint8_t *b = malloc(nl);
        memcpy(b, s, a);
        memcpy(b + a, subs[i].to, tl);
        memcpy(b + a + tl, s + a + fl, len - a - fl);
        reason[0] = 0;
        g_variants++;
        if (kvb__ts_plan_parse(b, nl, KVB__TS_PLAN_MAX_FRAGS, &p, reason, sizeof(reason)) == KVB_OK)
            FAILF("plan variant %s -> %s: accepted", subs[i].from, subs[i].to);
        if (strstr(reason, subs[i].want) == NULL)
            FAILF("plan variant %s -> %s: reason \"%s\" does not name %s", subs[i].from, subs[i].to,
                  reason, subs[i].want);
        free(b);
    }
    /* truncated JSON */
    g_variants++;
    if (kvb__ts_plan_parse(json, len / 2, KVB__TS_PLAN_MAX_FRAGS, &p, reason, sizeof(reason)) ==
        KVB_OK)
        FAILF("plan cut in half: accepted");
    free(s);
}

static bool same_frames(const kvb__frames_buf_t *b, const msg_t *m)
{
    if (b->n != m->n)
        return false;
    for (size_t i = 0; i < m->n; i++) {
        kvb__frame_t f = kvb__frames_buf_get(b, i);
        if (f.len != m->f[i].len || (f.len && memcmp(f.data, m->f[i].data, f.len) != 0))
            return false;
    }
    return true;
}

static void replay_frames(const char *dialect, const char *kind, json_t *root)
{
    const kind_ops_t *k = NULL;
    for (size_t i = 0; i < sizeof(KINDS) / sizeof(KINDS[0]); i++)
        if (strcmp(KINDS[i].dialect, dialect) == 0 && strcmp(KINDS[i].kind, kind) == 0)
            k = &KINDS[i];
    if (k == NULL)
        FAILF("no decoder for dialect %s kind %s", dialect, kind);
    json_t *expect = json_object_get(root, "expect");
    json_t *enc = json_object_get(root, "kvbridge_encodes");
    if (!json_is_object(expect))
        FAILF("no \"expect\" object");
    if (!json_is_boolean(enc))
        FAILF("no \"kvbridge_encodes\" boolean");
    msg_t m = {0};
    msg_load(&m, json_object_get(root, "frames"));

    /* 1. decodes to the expected fields */
    kvb__frames_err_t e;
    json_t *got = NULL;
    if (k->decode(m.f, m.n, &e, &got) != KVB_OK)
        FAILF("refused by kvbridge's decoder: %s", e.reason);
    if (!json_equal(got, expect)) {
        char *a = json_dumps(got, JSON_COMPACT | JSON_SORT_KEYS);
        char *b = json_dumps(expect, JSON_COMPACT | JSON_SORT_KEYS);
        FAILF("decoded fields differ from \"expect\":\n  kvbridge: %s\n  expect:   %s", a, b);
    }
    json_decref(got);

    /* 2. re-encodes byte-identical exactly when the file says so */
    kvb__frames_buf_t out;
    kvb__frames_buf_init(&out);
    kvb_status_t st = k->reencode(m.f, m.n, &out);
    bool same = st == KVB_OK && same_frames(&out, &m);
    if (same != json_is_true(enc))
        FAILF("kvbridge_encodes is %s but kvbridge's encoder gives %s bytes (status %d, %zu "
              "frames)",
              json_is_true(enc) ? "true" : "false", same ? "the same" : "other", (int)st, out.n);
    kvb__frames_buf_free(&out);

    /* 3. malformed variants */
    json_t *r = json_object_get(expect, "room");
    mutate_frames(k, &m, json_is_integer(r) ? (uint64_t)json_integer_value(r) : 0,
                  json_is_integer(r));
    if (strcmp(kind, "transfer") == 0 && strcmp(dialect, "tokenspeed_seed004") == 0 &&
        m.n == KVB__XFERTS_PLAN && m.f[13].len > 0)
        mutate_plan(m.f[13].data, m.f[13].len);
    msg_free(&m);
}

/* ------------------------------------------------------------------ bootstrap */

static json_t *jlens(const kvb_bootstrap_lens_t *l)
{
    json_t *a = json_array();
    for (size_t i = 0; i < l->count; i++)
        json_array_append_new(a, json_integer((json_int_t)l->values[i]));
    return a;
}

/* kvbridge's reading of a body of kind; *mine: the bytes kvbridge itself
 * would send for the same values (malloc'ed; NULL when it sends no such
 * body). KVB_ERR_PROTO with reason. */
static kvb_status_t boot_read(const char *kind, const char *body, size_t len, json_t **got,
                              char **mine, char *reason, size_t rlen)
{
    kvb_status_t st;
    *mine = NULL;
    if (strcmp(kind, "bootstrap_put") == 0) {
        kvb__boot_reg_t r;
        st = kvb__boot_reg_parse(body, len, &r, reason, rlen);
        if (st != KVB_OK)
            return st;
        *got = kvb__boot_reg_to_json(&r);
        *mine = json_dumps(*got, JSON_COMPACT); /* kvbridge's client: the same object */
        kvb__boot_reg_clear(&r);
        return KVB_OK;
    }
    if (strcmp(kind, "bootstrap_rank_addr") == 0) {
        kvb_bootstrap_rank_addr_t a;
        int kvbridge = 0;
        st = kvb__boot_rank_addr_parse(body, len, &a, &kvbridge, reason, rlen);
        if (st != KVB_OK)
            return st;
        *got = json_pack("{s:s, s:I, s:I}", "rank_ip", a.rank_ip, "rank_port",
                         (json_int_t)a.rank_port, "kvbridge", (json_int_t)kvbridge);
        kvb__boot_entry_t e = {
            .rank_ip = a.rank_ip, .rank_port = a.rank_port, .kvbridge = kvbridge};
        json_t *o = kvb__boot_entry_json(&e);
        *mine = json_dumps(o, JSON_COMPACT);
        json_decref(o);
        return KVB_OK;
    }
    kvb_bootstrap_parallel_info_t info;
    kvb_bootstrap_parallel_info_ext_t ext = {.field_mask = ~0ull};
    if (strcmp(kind, "bootstrap_parallel_info") == 0) {
        st = kvb__boot_parallel_info_parse(body, len, &info, reason, rlen);
        kvb__boot_info_ext_default(&ext);
    } else if (strcmp(kind, "bootstrap_parallel_info_2026") == 0) {
        st = kvb__boot_parallel_info_parse_2026(body, len, &info, &ext, reason, rlen);
    } else if (strcmp(kind, "bootstrap_parallel_info_ts") == 0) {
        st = kvb__boot_parallel_info_parse_ts(body, len, &info, reason, rlen);
        kvb__boot_info_ext_default(&ext);
        ext.dialect = 4;
    } else {
        FAILF("unknown kind %s", kind);
    }
    if (st != KVB_OK)
        return st;
    *got = json_pack(
        "{s:I, s:I, s:I, s:b, s:o, s:o, s:o, s:o, s:o, s:I, s:I, s:I, s:o, s:b, s:b, s:I}",
        "attn_tp_size", (json_int_t)info.attn_tp_size, "dp_size", (json_int_t)info.dp_size,
        "pp_size", (json_int_t)info.pp_size, "enable_mla_l1_5_cache", info.enable_mla_l1_5_cache,
        "kv_item_lens", jlens(&info.kv_item_lens), "kv_unit_lens", jlens(&info.kv_unit_lens),
        "state_item_lens", jlens(&info.state_item_lens), "state_unit_lens",
        jlens(&info.state_unit_lens), "layout_json",
        info.layout_json ? json_string(info.layout_json) : json_null(), "dialect",
        (json_int_t)ext.dialect, "attn_cp_size", (json_int_t)ext.attn_cp_size, "page_size",
        (json_int_t)ext.page_size, "kv_cache_dtype", json_string(ext.kv_cache_dtype),
        "follow_bootstrap_room", ext.follow_bootstrap_room, "enable_dsa_cache_layer_split",
        ext.enable_dsa_cache_layer_split, "prefill_http_port", (json_int_t)ext.prefill_http_port);
    kvb_bootstrap_parallel_info_free(&info);
    return KVB_OK;
}

/* kvbridge's server answer of kind after the PUT bodies puts (JSON strings). */
static char *boot_serve(const char *kind, json_t *puts)
{
    kvb__boot_table_t t;
    size_t i;
    json_t *v;
    char reason[KVB__BOOT_REASON_MAX];
    bool nomem;
    CHECK_EQ(kvb__boot_table_init(&t), KVB_OK);
    json_array_foreach(puts, i, v)
    {
        kvb__boot_reg_t r;
        const char *b = json_string_value(v);
        if (b == NULL || kvb__boot_reg_parse(b, strlen(b), &r, reason, sizeof(reason)) != KVB_OK ||
            kvb__boot_table_apply(&t, &r, reason, sizeof(reason)) != KVB_OK)
            FAILF("server_puts[%zu] refused: %s", i, b ? reason : "not a string");
        kvb__boot_reg_clear(&r);
    }
    json_t *o = strcmp(kind, "bootstrap_parallel_info_2026") == 0
                    ? kvb__boot_table_parallel_info_2026(&t, false, &nomem)
                    : kvb__boot_table_parallel_info(&t, &nomem);
    if (o == NULL)
        FAILF("kvbridge's table gives no parallel info for these PUTs");
    char *s = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    kvb__boot_table_destroy(&t);
    return s;
}

/* Keys kvbridge does not read in a body of that kind (a wrong type there is
 * accepted): TokenSpeed's own keys that kvbridge's table maps elsewhere, and
 * the 2026 server facts the client does not need. Everything else must be
 * refused naming the key. */
static bool key_ignored(const char *kind, const char *key)
{
    static const char *const ignored[][2] = {
        {"bootstrap_parallel_info_2026", "target_tp_rank"},
        {"bootstrap_parallel_info_2026", "target_tp_ranks"},
        {"bootstrap_parallel_info_2026", "target_cp_ranks"},
        {"bootstrap_parallel_info_2026", "target_pp_ranks"},
        {"bootstrap_parallel_info_2026", "required_dst_info_num"},
        {"bootstrap_parallel_info_2026", "required_prefill_response_num"},
        /* TokenSpeed's keys in kvbridge's own server answer (its decode
         * reads the seed-001 keys there) */
        {"bootstrap_parallel_info", "prefill_tp_size"},
        {"bootstrap_parallel_info", "dp_size"},
        /* SGLang 0.5.23's PUT keys after the spec's commit (recorded): kvbridge's
         * server neither reads nor serves them (its decodes take their defaults) */
        {"bootstrap_put", "dsv41_spec_layout"},
        {"bootstrap_put", "enable_kv_cache_sharding"},
        {"bootstrap_put", "decode_allocation_policy"},
        {"bootstrap_put", "kv_layout"},
        {"bootstrap_parallel_info_2026", "decode_allocation_policy"},
        {"bootstrap_parallel_info_2026", "enable_kv_cache_sharding"},
        /* read by the client's dialect probe (kvb__boot_answer_is_ts), not the parser */
        {"bootstrap_parallel_info", "kvbridge_peer_dialect"},
    };
    for (size_t i = 0; i < sizeof(ignored) / sizeof(ignored[0]); i++)
        if (strcmp(ignored[i][0], kind) == 0 && strcmp(ignored[i][1], key) == 0)
            return true;
    return false;
}

static void replay_bootstrap(const char *kind, json_t *root)
{
    const char *body = json_string_value(json_object_get(root, "body"));
    json_t *expect = json_object_get(root, "expect");
    json_t *enc = json_object_get(root, "kvbridge_encodes");
    json_t *puts = json_object_get(root, "server_puts");
    char reason[KVB__BOOT_REASON_MAX], *mine = NULL;
    json_t *got = NULL;
    if (body == NULL || !json_is_object(expect) || !json_is_boolean(enc))
        FAILF("needs \"body\", \"expect\" and \"kvbridge_encodes\" (run corpus.py build)");
    size_t len = strlen(body);
    if (boot_read(kind, body, len, &got, &mine, reason, sizeof(reason)) != KVB_OK)
        FAILF("refused by kvbridge: %s", reason);
    if (!json_equal(got, expect)) {
        char *a = json_dumps(got, JSON_COMPACT | JSON_SORT_KEYS);
        char *b = json_dumps(expect, JSON_COMPACT | JSON_SORT_KEYS);
        FAILF("kvbridge's reading differs from \"expect\":\n  kvbridge: %s\n  expect:   %s", a, b);
    }
    json_decref(got);
    if (puts != NULL) { /* what kvbridge's server answers */
        free(mine);
        mine = boot_serve(kind, puts);
    }
    bool same = mine != NULL && strcmp(mine, body) == 0;
    if (same != json_is_true(enc))
        FAILF("kvbridge_encodes is %s but kvbridge's bytes are %s:\n  %s",
              json_is_true(enc) ? "true" : "false", same ? "the same" : "other",
              mine ? mine : "(none)");
    free(mine);

    /* malformed: cut in half; each key of the wrong type */
    g_variants++;
    if (boot_read(kind, body, len / 2, &got, &mine, reason, sizeof(reason)) == KVB_OK)
        FAILF("body cut in half: accepted");
    json_t *o = json_loads(body, 0, NULL);
    const char *key;
    json_t *val;
    json_object_foreach(o, key, val)
    {
        json_t *c = json_deep_copy(o);
        /* the wrong type: a string for a list, a list for anything else */
        json_object_set_new(c, key, json_is_array(val) ? json_string("x") : json_array());
        char *s = json_dumps(c, JSON_COMPACT);
        reason[0] = 0;
        g_variants++;
        kvb_status_t st = boot_read(kind, s, strlen(s), &got, &mine, reason, sizeof(reason));
        if (st == KVB_OK) {
            json_decref(got);
            free(mine);
            if (!key_ignored(kind, key))
                fprintf(stderr, "%s: key \"%s\" of the wrong type accepted\n", g_file, key),
                    g_bad++;
        } else if (strstr(reason, key) == NULL) {
            fprintf(stderr, "%s: key \"%s\" of the wrong type: reason \"%s\" does not name it\n",
                    g_file, key, reason);
            g_bad++;
        }
        free(s);
        json_decref(c);
    }
    json_decref(o);
}

/* ------------------------------------------------------------------ driver */

static void replay_file(const char *path, const char *dialect)
{
    json_error_t je;
    g_file = path;
    json_t *root = json_load_file(path, 0, &je);
    if (root == NULL)
        FAILF("not JSON: %s (line %d)", je.text, je.line);
    const char *d = json_string_value(json_object_get(root, "dialect"));
    const char *kind = json_string_value(json_object_get(root, "kind"));
    const char *prov = json_string_value(json_object_get(root, "provenance"));
    if (json_integer_value(json_object_get(root, "corpus")) != 1 || d == NULL || kind == NULL ||
        prov == NULL)
        FAILF("needs \"corpus\": 1, \"dialect\", \"kind\", \"provenance\"");
    if (strcmp(d, dialect) != 0)
        FAILF("dialect %s in folder %s", d, dialect);
    if (strncmp(prov, "recorded-from-release ", 22) != 0 && strcmp(prov, "spec-example") != 0 &&
        strcmp(prov, "spec-derived") != 0 && strcmp(prov, "kvbridge-encoder") != 0)
        FAILF("provenance \"%s\": recorded-from-release X, spec-example, spec-derived or "
              "kvbridge-encoder",
              prov);
    if (strncmp(kind, "bootstrap_", 10) == 0)
        replay_bootstrap(kind, root);
    else
        replay_frames(dialect, kind, root);
    json_decref(root);
    g_files++;
}

static int replay_all(const char *dir)
{
    static const char *const dialects[] = {"sglang2025", "sglang2026", "tokenspeed_seed004"};
    double t0 = kvb_test_now_s();
    for (size_t di = 0; di < 3; di++) {
        char path[4096];
        snprintf(path, sizeof(path), "%s/%s", dir, dialects[di]);
        char *names[1024];
        int n = kvb_test_json_files(path, names, 1024);
        if (n < 0) {
            fprintf(stderr, "%s: missing\n", path);
            return 1;
        }
        int before = g_files;
        for (int i = 0; i < n; i++) {
            char f[8192];
            snprintf(f, sizeof(f), "%s/%s", path, names[i]);
            replay_file(f, dialects[di]);
            free(names[i]);
        }
        if (g_files - before < 10) {
            fprintf(stderr, "%s: only %d golden files\n", path, g_files - before);
            return 1;
        }
        fprintf(stderr, "ok: %s: %d golden files\n", dialects[di], g_files - before);
    }
    if (g_bad) {
        fprintf(stderr, "FAIL: %d bootstrap variants (above)\n", g_bad);
        return 1;
    }
    fprintf(stderr, "ok: %d golden files, %d malformed variants refused (%.2f s)\n", g_files,
            g_variants, kvb_test_now_s() - t0);
    return 0;
}

/* --probe FILE: what kvbridge makes of a golden file (corpus.py writes it
 * into the file): {"kvbridge_encodes"} for frames; {"body" (server_puts
 * files), "expect", "kvbridge_encodes"} for bootstrap bodies. */
static int probe(const char *path)
{
    json_error_t je;
    g_file = path;
    json_t *root = json_load_file(path, 0, &je), *res = json_object();
    if (root == NULL)
        FAILF("not JSON: %s", je.text);
    const char *kind = json_string_value(json_object_get(root, "kind"));
    const char *dialect = json_string_value(json_object_get(root, "dialect"));
    if (kind == NULL || dialect == NULL)
        FAILF("no kind/dialect");
    if (strncmp(kind, "bootstrap_", 10) == 0) {
        json_t *puts = json_object_get(root, "server_puts");
        char *body = puts != NULL ? boot_serve(kind, puts)
                                  : strdup(json_string_value(json_object_get(root, "body")));
        char reason[KVB__BOOT_REASON_MAX], *mine;
        json_t *got;
        if (boot_read(kind, body, strlen(body), &got, &mine, reason, sizeof(reason)) != KVB_OK)
            FAILF("refused: %s", reason);
        if (puts != NULL) {
            free(mine);
            mine = strdup(body);
            json_object_set_new(res, "body", json_string(body));
        }
        json_object_set_new(res, "expect", got);
        json_object_set_new(res, "kvbridge_encodes",
                            json_boolean(mine != NULL && strcmp(mine, body) == 0));
        free(mine);
        free(body);
    } else {
        const kind_ops_t *k = NULL;
        for (size_t i = 0; i < sizeof(KINDS) / sizeof(KINDS[0]); i++)
            if (strcmp(KINDS[i].dialect, dialect) == 0 && strcmp(KINDS[i].kind, kind) == 0)
                k = &KINDS[i];
        if (k == NULL)
            FAILF("no decoder");
        msg_t m = {0};
        kvb__frames_buf_t out;
        msg_load(&m, json_object_get(root, "frames"));
        kvb__frames_buf_init(&out);
        kvb_status_t st = k->reencode(m.f, m.n, &out);
        json_object_set_new(res, "kvbridge_encodes",
                            json_boolean(st == KVB_OK && same_frames(&out, &m)));
        kvb__frames_buf_free(&out);
        msg_free(&m);
    }
    char *s = json_dumps(res, JSON_COMPACT | JSON_PRESERVE_ORDER);
    printf("%s\n", s);
    free(s);
    json_decref(res);
    json_decref(root);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc == 3 && strcmp(argv[1], "--probe") == 0)
        return probe(argv[2]);
    if (argc == 4 && strcmp(argv[1], "--read") == 0) {
        char reason[KVB__BOOT_REASON_MAX], *mine;
        json_t *got;
        g_file = "--read";
        if (boot_read(argv[2], argv[3], strlen(argv[3]), &got, &mine, reason, sizeof(reason)) !=
            KVB_OK) {
            fprintf(stderr, "refused: %s\n", reason);
            return 1;
        }
        char *s = json_dumps(got, JSON_COMPACT | JSON_PRESERVE_ORDER);
        printf("%s\n%s\n", s, mine ? mine : "");
        return 0;
    }
    if (argc >= 4 && strcmp(argv[1], "--serve") == 0) {
        json_t *puts = json_array();
        g_file = "--serve";
        for (int i = 3; i < argc; i++)
            json_array_append_new(puts, json_string(argv[i]));
        printf("%s\n", boot_serve(argv[2], puts));
        return 0;
    }
    if (argc != 2) {
        fprintf(stderr, "usage: test_conformance CORPUS_DIR | --read KIND BODY | --serve KIND "
                        "PUT...\n");
        return 2;
    }
    return replay_all(argv[1]);
}
