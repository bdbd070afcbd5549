/* Control-frame codec of SGLang's 2026 dialect (PROTOCOL-SGLANG-2026.md
 * sections 4-5; docs/protocol-frames.md "The 2026 dialect"): the messages
 * that differ from seed 001. Field rules: proto/frames_kit.h. */
#include "dialect/sglang2026/frames.h"
#include "proto/frames_kit.h"

#include <stdio.h>
#include <stdlib.h>

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
static kvb_status_t need_lol(kvb__fk_ctx_t *c, const kvb__frame_t *f, size_t idx, const char *name,
                             unsigned elem, kvb__lol_view_t *out_p)
{
    kvb__lol_view_t v = {f->data, f->len, 0, (uint8_t)elem};
    if (f->len == 0) {
        *out_p = v;
        return KVB_OK;
    }
    if (f->len < 4)
        return kvb__fk_fail_frame(c, idx, name, "%zu bytes, shorter than the 4-byte list count",
                                  f->len);
    uint64_t n = le_at(f->data, 4);
    if (n > KVB__LOL_MAX_LISTS)
        return kvb__fk_fail_frame(c, idx, name, "%llu lists, at most %d", (unsigned long long)n,
                                  KVB__LOL_MAX_LISTS);
    size_t head = 4 + 4 * (size_t)n, sum = 0;
    if (f->len < head)
        return kvb__fk_fail_frame(c, idx, name, "%zu bytes, %llu lists need a %zu-byte header",
                                  f->len, (unsigned long long)n, head);
    for (size_t i = 0; i < n; i++) {
        size_t l = (size_t)le_at(f->data + 4 + 4 * i, 4);
        if (l % elem != 0)
            return kvb__fk_fail_frame(c, idx, name, "list %zu is %zu bytes, not a multiple of %u",
                                      i, l, elem);
        sum += l;
    }
    if (sum != f->len - head)
        return kvb__fk_fail_frame(c, idx, name, "lists declare %zu payload bytes, frame holds %zu",
                                  sum, f->len - head);
    v.n = (uint32_t)n;
    *out_p = v;
    return KVB_OK;
}

/* Every element of every list: non-zero (pointers) or a non-negative i32. */
static kvb_status_t lol_elems(kvb__fk_ctx_t *c, kvb__lol_view_t v, size_t idx, const char *name,
                              bool pointers)
{
    for (uint32_t i = 0; i < v.n; i++) {
        const uint8_t *d;
        size_t count;
        kvb__lol_list(v, i, &d, &count);
        for (size_t k = 0; k < count; k++) {
            uint64_t x = le_at(d + k * v.elem, v.elem);
            if (pointers && x == 0)
                return kvb__fk_fail_frame(c, idx, name, "list %u entry %zu is a null address", i,
                                          k);
            if (!pointers && (int32_t)(uint32_t)x < 0)
                return kvb__fk_fail_frame(c, idx, name, "list %u entry %zu is negative (%d)", i, k,
                                          (int)(int32_t)(uint32_t)x);
        }
    }
    return KVB_OK;
}

/* v is empty, or has the lists of ref each with the same element count
 * (counts_may_be_empty: a list may also be empty). */
static kvb_status_t lol_shaped(kvb__fk_ctx_t *c, kvb__lol_view_t v, kvb__lol_view_t ref, size_t idx,
                               const char *name, bool counts_may_be_empty)
{
    if (v.len == 0)
        return KVB_OK;
    if (v.n != ref.n)
        return kvb__fk_fail_frame(c, idx, name, "%u lists, frame 6 has %u state components", v.n,
                                  ref.n);
    for (uint32_t i = 0; i < v.n; i++) {
        const uint8_t *d;
        size_t a, b;
        kvb__lol_list(v, i, &d, &a);
        kvb__lol_list(ref, i, &d, &b);
        if (a != b && !(counts_may_be_empty && a == 0))
            return kvb__fk_fail_frame(c, idx, name, "list %u has %zu entries, component %u has %zu",
                                      i, a, i, b);
    }
    return KVB_OK;
}

/* Decimal frame that may be empty (then *out_p = dflt). */
static kvb_status_t opt_int(kvb__fk_ctx_t *c, const kvb__frame_t *frames, size_t n, size_t idx,
                            const char *name, int64_t min, int64_t max, int64_t dflt,
                            int64_t *out_p)
{
    *out_p = dflt;
    if (idx >= n || frames[idx].len == 0)
        return KVB_OK;
    return kvb__fk_need_int(c, &frames[idx], idx, name, min, max, out_p);
}

static kvb_status_t reg26_state(kvb__fk_ctx_t *c, const kvb__frame_t *f, size_t n,
                                kvb__reg26_msg_t *m)
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
        return kvb__fk_fail_frame(c, 12, "dst_kv_layer_ids", "length %zu is not a multiple of 4",
                                  ids->len);
    m->kv_layer_ids = (kvb__u32_view_t){ids->data, ids->len / 4};
    if (m->kv_layer_ids.count != 0 && m->kv_layer_ids.count != m->kv_ptrs.count)
        return kvb__fk_fail_frame(c, 12, "dst_kv_layer_ids", "%zu ids for %zu KV buffers",
                                  m->kv_layer_ids.count, m->kv_ptrs.count);
    KVB__FRAMES_TRY(
        need_lol(c, n > 13 ? &f[13] : &none, 13, "dst_state_layer_ids", 4, &m->state_layer_ids));
    return lol_shaped(c, m->state_layer_ids, m->state_ptrs, 13, "dst_state_layer_ids", false);
}

/* Packed u64 frame of any values (layer ids may be 0). */
static kvb_status_t need_u64_values(kvb__fk_ctx_t *c, const kvb__frame_t *f, size_t idx,
                                    const char *name, kvb__u64_view_t *out_p)
{
    if (f->len % 8 != 0)
        return kvb__fk_fail_frame(c, idx, name, "length %zu is not a multiple of 8", f->len);
    *out_p = (kvb__u64_view_t){f->data, f->len / 8};
    return KVB_OK;
}

/* SGLang after the spec's commit (release 0.5.23) appends frame 18, the
 * staging slot layer ids (u64[]; kvbridge never stages: ignored), and frame
 * 19, each KV buffer's item length (u64[], empty or one per frame-4 entry).
 * nd: the dialect frames (before the marker). */
static kvb_status_t reg26_after17(kvb__fk_ctx_t *c, const kvb__frame_t *f, size_t nd,
                                  kvb__reg26_msg_t *m)
{
    if (nd > 18)
        KVB__FRAMES_TRY(
            need_u64_values(c, &f[18], 18, "staging_slot_layer_ids", &m->staging_slot_ids));
    if (nd <= 19)
        return KVB_OK;
    KVB__FRAMES_TRY(need_u64_values(c, &f[19], 19, "dst_kv_item_lens", &m->kv_item_lens));
    if (m->kv_item_lens.count != 0 && m->kv_item_lens.count != m->kv_ptrs.count)
        return kvb__fk_fail_frame(c, 19, "dst_kv_item_lens", "%zu lengths for %zu KV buffers",
                                  m->kv_item_lens.count, m->kv_ptrs.count);
    for (size_t i = 0; i < m->kv_item_lens.count; i++)
        if (kvb__u64_at(m->kv_item_lens, i) == 0 ||
            kvb__u64_at(m->kv_item_lens, i) > (uint64_t)INT64_MAX)
            return kvb__fk_fail_frame(c, 19, "dst_kv_item_lens", "entry %zu is %llu", i,
                                      (unsigned long long)kvb__u64_at(m->kv_item_lens, i));
    return KVB_OK;
}

static kvb_status_t reg26_tail(kvb__fk_ctx_t *c, const kvb__frame_t *f, size_t n,
                               kvb__reg26_msg_t *m)
{
    int64_t v;
    if (n > 14 && f[14].len != 0 && f[14].len != 8)
        return kvb__fk_fail_frame(c, 14, "staging_base_ptr", "%zu bytes, expected 8 or none",
                                  f[14].len);
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
    kvb__fk_ctx_t c = {KVB__KIND_REG26, err, false, 0};
    kvb__reg26_msg_t m;
    memset(&m, 0, sizeof(m));
    size_t nd, from;
    KVB__FRAMES_TRY(kvb__fk_need_frames(&c, frames, n, KVB__REG26_MIN, KVB__REG26_MAX, &nd, &from));
    KVB__FRAMES_TRY(kvb__fk_need_reg_head(&c, frames, &m.port));
    KVB__FRAMES_TRY(kvb__fk_need_u64_array(&c, &frames[4], 4, "dst_kv_ptrs", false, &m.kv_ptrs));
    KVB__FRAMES_TRY(kvb__fk_need_u64_array(&c, &frames[5], 5, "dst_aux_ptrs", false, &m.aux_ptrs));
    KVB__FRAMES_TRY(kvb__fk_need_i32(&c, &frames[7], 7, "dst_tp_rank", 0, &m.dst_tp_rank));
    KVB__FRAMES_TRY(
        kvb__fk_need_i32(&c, &frames[8], 8, "dst_attn_tp_size", 1, &m.dst_attn_tp_size));
    KVB__FRAMES_TRY(kvb__fk_need_int(&c, &frames[9], 9, "dst_kv_item_len",
                                     m.kv_ptrs.count > 0 ? 1 : 0,
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

static kvb_status_t need_mask(kvb__fk_ctx_t *c, const kvb__frame_t *val, size_t i, size_t pages)
{
    if (val->len != pages)
        return kvb__fk_fail_frame(c, i, "extension page_mask", "%zu bytes for %zu page indices",
                                  val->len, pages);
    for (size_t k = 0; k < val->len; k++)
        if (val->data[k] > 1)
            return kvb__fk_fail_frame(c, i, "extension page_mask",
                                      "byte %zu is 0x%02x, expected 0 or 1", k, val->data[k]);
    return KVB_OK;
}

/* The known extensions after the marker (frames [from, n), checked). */
static kvb_status_t xfer26_ext(kvb__fk_ctx_t *c, const kvb__frame_t *f, size_t from, size_t n,
                               kvb__xfer26_msg_t *m)
{
    for (size_t i = from; i < n; i++) {
        kvb__fk_ext_kv_t kv;
        kvb__fk_split_ext(&f[i], &kv);
        kvb__frame_t val = {kv.val, kv.val_len};
        if (kvb__fk_key_is(&kv, "epoch")) {
            int64_t ep;
            KVB__FRAMES_TRY(kvb__fk_need_int(c, &val, i, "extension epoch", 1, INT64_MAX, &ep));
            m->has_epoch = true;
            m->epoch = (uint64_t)ep;
        } else if (kvb__fk_key_is(&kv, "page_mask")) {
            KVB__FRAMES_TRY(need_mask(c, &val, i, m->pages.count));
            m->has_page_mask = true;
            m->page_mask = val.data;
        }
    }
    m->ext = n > from ? &f[from] : NULL;
    m->n_ext = n - from;
    return KVB_OK;
}

static kvb_status_t xfer26_dst(kvb__fk_ctx_t *c, const kvb__frame_t *f, kvb__xfer26_msg_t *m)
{
    m->is_dummy = f[4].len == 0 && f[5].len == 0;
    m->aux_index = -1;
    KVB__FRAMES_TRY(need_lol(c, &f[6], 6, "dst_state_indices", 4, &m->state_idx));
    KVB__FRAMES_TRY(lol_elems(c, m->state_idx, 6, "dst_state_indices", false));
    if (m->is_dummy) {
        if (f[6].len != 0)
            return kvb__fk_fail_frame(c, 6, "dst_state_indices",
                                      "%zu bytes on a dummy transfer info", f[6].len);
        return KVB_OK;
    }
    KVB__FRAMES_TRY(kvb__fk_need_i32_array(c, &f[4], 4, "dst_kv_indices", &m->pages));
    if (f[5].len == 0)
        return kvb__fk_fail_frame(c, 5, "dst_aux_index",
                                  "empty while frame 4 holds %zu page indices", m->pages.count);
    return kvb__fk_need_i32(c, &f[5], 5, "dst_aux_index", 0, &m->aux_index);
}

kvb_status_t kvb__frames_decode_transfer26(const kvb__frame_t *frames, size_t n,
                                           kvb__frames_err_t *err, kvb__xfer26_msg_t *msg_p)
{
    kvb__fk_ctx_t c = {KVB__KIND_XFER26, err, false, 0};
    kvb__xfer26_msg_t m;
    memset(&m, 0, sizeof(m));
    if (n >= 1)
        c.has_room = kvb__fk_parse_room(&frames[0], &c.room);
    size_t nd, from;
    KVB__FRAMES_TRY(
        kvb__fk_need_frames(&c, frames, n, KVB__XFER26_MIN, KVB__XFER26_FRAMES, &nd, &from));
    KVB__FRAMES_TRY(kvb__fk_need_room(&c, &frames[0], 0, &m.room));
    KVB__FRAMES_TRY(kvb__fk_need_peer(&c, frames, &m.port));
    KVB__FRAMES_TRY(xfer26_dst(&c, frames, &m));
    KVB__FRAMES_TRY(
        kvb__fk_need_i32(&c, &frames[7], 7, "required_dst_info_num", 1, &m.required_dst_info_num));
    m.has_prefix_len = nd > 8 && frames[8].len > 0;
    KVB__FRAMES_TRY(
        opt_int(&c, frames, nd, 8, "decode_prefix_len", 0, INT64_MAX, 0, &m.prefix_len));
    if (nd > 9)
        KVB__FRAMES_TRY(
            kvb__fk_need_i32_array(&c, &frames[9], 9, "dst_device_kv_indices", &m.device_pages));
    if (m.is_dummy && m.device_pages.count > 0)
        return kvb__fk_fail_frame(&c, 9, "dst_device_kv_indices",
                                  "%zu entries on a dummy transfer info", m.device_pages.count);
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
    kvb__fk_ctx_t c = {KVB__KIND_ABORT, err, false, 0};
    kvb__abort_msg_t m;
    int64_t v;
    char q[200];
    if (n >= 2 && kvb__fk_tag_is(&frames[0], "ABORT"))
        c.has_room = kvb__fk_parse_room(&frames[1], &c.room);
    if (n != 4 && n != 5)
        return kvb__fk_fail(&c, "expected 4 or 5 frames, got %zu", n);
    if (!kvb__fk_tag_is(&frames[0], "ABORT")) {
        kvb__fk_quote(q, sizeof(q), frames[0].data, frames[0].len);
        return kvb__fk_fail_frame(&c, 0, "tag", "%s is not \"ABORT\"", q);
    }
    KVB__FRAMES_TRY(kvb__fk_need_room(&c, &frames[1], 1, &m.room));
    KVB__FRAMES_TRY(kvb__fk_need_ip(&c, &frames[2], 2));
    KVB__FRAMES_TRY(kvb__fk_need_int(&c, &frames[3], 3, "port", 1, 65535, &v));
    m.port = (uint16_t)v;
    m.ip = (const char *)frames[2].data;
    m.ip_len = frames[2].len;
    m.has_generation = n == 5;
    m.generation = 0;
    if (n == 5) {
        KVB__FRAMES_TRY(kvb__fk_need_int(&c, &frames[4], 4, "generation", 0, INT64_MAX, &v));
        m.generation = (uint64_t)v;
    }
    *msg_p = m;
    return KVB_OK;
}

kvb_status_t kvb__frames_decode_abort_ack(const kvb__frame_t *frames, size_t n,
                                          kvb__frames_err_t *err, kvb__abort_ack_msg_t *msg_p)
{
    kvb__fk_ctx_t c = {KVB__KIND_ACK, err, false, 0};
    kvb__abort_ack_msg_t m = {0, false, 0, false, 0};
    int64_t v;
    char q[200];
    if (n >= 2 && kvb__fk_tag_is(&frames[0], "ABORT_ACK"))
        c.has_room = kvb__fk_parse_room(&frames[1], &c.room);
    if (n < 2 || n > 4)
        return kvb__fk_fail(&c, "expected 2, 3 or 4 frames, got %zu", n);
    if (!kvb__fk_tag_is(&frames[0], "ABORT_ACK")) {
        kvb__fk_quote(q, sizeof(q), frames[0].data, frames[0].len);
        return kvb__fk_fail_frame(&c, 0, "tag", "%s is not \"ABORT_ACK\"", q);
    }
    KVB__FRAMES_TRY(kvb__fk_need_room(&c, &frames[1], 1, &m.room));
    if (n >= 3) {
        KVB__FRAMES_TRY(kvb__fk_need_i32(&c, &frames[2], 2, "prefill_unique_rank", 0, &m.rank));
        m.has_rank = true;
    }
    if (n == 4) {
        KVB__FRAMES_TRY(kvb__fk_need_int(&c, &frames[3], 3, "generation", 0, INT64_MAX, &v));
        m.generation = (uint64_t)v;
        m.has_generation = true;
    }
    *msg_p = m;
    return KVB_OK;
}

/* ---- 2026 encoders ---- */

static bool put_lol(kvb__frames_buf_t *b, kvb__lol_view_t v)
{
    return kvb__fk_put(b, v.data, v.len);
}

static bool bad_lol(kvb__lol_view_t v)
{
    return kvb__fk_bad_view(v.data, v.len);
}

static bool reg26_fixed(kvb__frames_buf_t *out, const kvb__reg26_msg_t *msg)
{
    uint8_t base[8];
    memcpy(base, &msg->staging_base, 8);
    return kvb__fk_put(out, KVB__FK_NONE_TAG, sizeof(KVB__FK_NONE_TAG) - 1) &&
           kvb__fk_put(out, msg->ip, msg->ip_len) && kvb__fk_put_u64(out, msg->port) &&
           kvb__fk_put(out, msg->session_id, msg->session_id_len) &&
           kvb__fk_put(out, msg->kv_ptrs.data, msg->kv_ptrs.count * 8) &&
           kvb__fk_put(out, msg->aux_ptrs.data, msg->aux_ptrs.count * 8) &&
           put_lol(out, msg->state_ptrs) && kvb__fk_put_i64(out, msg->dst_tp_rank) &&
           kvb__fk_put_i64(out, msg->dst_attn_tp_size) &&
           kvb__fk_put_i64(out, msg->dst_kv_item_len) && put_lol(out, msg->state_item_lens) &&
           put_lol(out, msg->state_dims) &&
           kvb__fk_put(out, msg->kv_layer_ids.data, msg->kv_layer_ids.count * 4) &&
           put_lol(out, msg->state_layer_ids) &&
           kvb__fk_put(out, msg->has_staging_base ? base : NULL, msg->has_staging_base ? 8 : 0) &&
           (msg->staging_size > 0 || msg->has_staging_base ? kvb__fk_put_u64(out, msg->staging_size)
                                                           : kvb__fk_put(out, NULL, 0)) &&
           kvb__fk_put_i64(out, msg->dcp_size) && kvb__fk_put_i64(out, msg->dcp_rank);
}

kvb_status_t kvb__frames_encode_registration26(const kvb__reg26_msg_t *msg, kvb__frames_err_t *err,
                                               kvb__frames_buf_t *out)
{
    size_t n0 = out->n, len0 = out->len;
    if (kvb__fk_bad_view(msg->ip, msg->ip_len) ||
        kvb__fk_bad_view(msg->session_id, msg->session_id_len) ||
        kvb__fk_bad_view(msg->kv_ptrs.data, msg->kv_ptrs.count) ||
        kvb__fk_bad_view(msg->aux_ptrs.data, msg->aux_ptrs.count) ||
        kvb__fk_bad_view(msg->kv_layer_ids.data, msg->kv_layer_ids.count) ||
        bad_lol(msg->state_ptrs) || bad_lol(msg->state_item_lens) || bad_lol(msg->state_dims) ||
        bad_lol(msg->state_layer_ids) || kvb__fk_bad_view(msg->ext, msg->n_ext) ||
        msg->kv_ptrs.count > SIZE_MAX / 8 || msg->aux_ptrs.count > SIZE_MAX / 8 ||
        msg->kv_layer_ids.count > SIZE_MAX / 4)
        return kvb__fk_caller_error(err, KVB__KIND_REG26, "NULL array with a non-zero length");
    if (!reg26_fixed(out, msg))
        return kvb__fk_rollback(out, n0, len0, KVB_ERR_NOMEM);
    kvb_status_t st = kvb__fk_put_ext(out, kvb__fk_reg_known, NULL, 0, msg->ext, msg->n_ext);
    if (st != KVB_OK)
        return kvb__fk_rollback(out, n0, len0, st);
    KVB__FK_VERIFY(out, n0, len0, err, kvb__frames_decode_registration26, kvb__reg26_msg_t);
    return KVB_OK;
}

kvb_status_t kvb__frames_encode_transfer26(const kvb__xfer26_msg_t *msg, kvb__frames_err_t *err,
                                           kvb__frames_buf_t *out)
{
    size_t n0 = out->n, len0 = out->len;
    char epoch[24];
    kvb__fk_ext_out_t typed[2];
    size_t n_typed = 0;
    static const char *const known[] = {"epoch", "page_mask", NULL};
    if (kvb__fk_bad_view(msg->ip, msg->ip_len) ||
        kvb__fk_bad_view(msg->session_id, msg->session_id_len) ||
        kvb__fk_bad_view(msg->pages.data, msg->pages.count) || bad_lol(msg->state_idx) ||
        kvb__fk_bad_view(msg->device_pages.data, msg->device_pages.count) ||
        kvb__fk_bad_view(msg->ext, msg->n_ext) || msg->pages.count > SIZE_MAX / 4 ||
        msg->device_pages.count > SIZE_MAX / 4)
        return kvb__fk_caller_error(err, KVB__KIND_XFER26, "NULL array with a non-zero length");
    if (msg->is_dummy && (msg->pages.count != 0 || msg->state_idx.len != 0))
        return kvb__fk_caller_error(err, KVB__KIND_XFER26,
                                    "a dummy transfer info carries no indices");
    if (msg->has_epoch) {
        if (msg->epoch == 0 || msg->epoch > INT64_MAX)
            return kvb__fk_caller_error(err, KVB__KIND_XFER26, "epoch outside 1..2^63-1");
        int k = snprintf(epoch, sizeof(epoch), "%llu", (unsigned long long)msg->epoch);
        typed[n_typed++] = kvb__fk_typed_ext("epoch", epoch, (size_t)k);
    }
    if (msg->has_page_mask) {
        if (kvb__fk_bad_view(msg->page_mask, msg->pages.count))
            return kvb__fk_caller_error(err, KVB__KIND_XFER26, "NULL page mask with page indices");
        typed[n_typed++] = kvb__fk_typed_ext("page_mask", msg->page_mask, msg->pages.count);
    }
    bool ok = kvb__fk_put_u64(out, msg->room) && kvb__fk_put(out, msg->ip, msg->ip_len) &&
              kvb__fk_put_u64(out, msg->port) &&
              kvb__fk_put(out, msg->session_id, msg->session_id_len);
    if (ok && msg->is_dummy)
        ok = kvb__fk_put(out, NULL, 0) && kvb__fk_put(out, NULL, 0);
    else if (ok)
        ok = kvb__fk_put(out, msg->pages.data, msg->pages.count * 4) &&
             kvb__fk_put_i64(out, msg->aux_index);
    ok = ok && put_lol(out, msg->state_idx) && kvb__fk_put_i64(out, msg->required_dst_info_num) &&
         kvb__fk_put_i64(out, msg->has_prefix_len ? msg->prefix_len : 0) &&
         kvb__fk_put(out, msg->device_pages.data, msg->device_pages.count * 4);
    if (!ok)
        return kvb__fk_rollback(out, n0, len0, KVB_ERR_NOMEM);
    kvb_status_t st = kvb__fk_put_ext(out, known, typed, n_typed, msg->ext, msg->n_ext);
    if (st != KVB_OK)
        return kvb__fk_rollback(out, n0, len0, st);
    KVB__FK_VERIFY(out, n0, len0, err, kvb__frames_decode_transfer26, kvb__xfer26_msg_t);
    return KVB_OK;
}

kvb_status_t kvb__frames_encode_abort(const kvb__abort_msg_t *msg, kvb__frames_err_t *err,
                                      kvb__frames_buf_t *out)
{
    size_t n0 = out->n, len0 = out->len;
    if (kvb__fk_bad_view(msg->ip, msg->ip_len))
        return kvb__fk_caller_error(err, KVB__KIND_ABORT, "NULL ip with a non-zero length");
    if (!kvb__fk_put(out, "ABORT", 5) || !kvb__fk_put_u64(out, msg->room) ||
        !kvb__fk_put(out, msg->ip, msg->ip_len) || !kvb__fk_put_u64(out, msg->port) ||
        (msg->has_generation && !kvb__fk_put_u64(out, msg->generation)))
        return kvb__fk_rollback(out, n0, len0, KVB_ERR_NOMEM);
    KVB__FK_VERIFY(out, n0, len0, err, kvb__frames_decode_abort, kvb__abort_msg_t);
    return KVB_OK;
}

kvb_status_t kvb__frames_encode_abort_ack(const kvb__abort_ack_msg_t *msg, kvb__frames_err_t *err,
                                          kvb__frames_buf_t *out)
{
    size_t n0 = out->n, len0 = out->len;
    if (msg->has_generation && !msg->has_rank)
        return kvb__fk_caller_error(err, KVB__KIND_ACK,
                                    "a generation needs the rank frame before it");
    if (!kvb__fk_put(out, "ABORT_ACK", 9) || !kvb__fk_put_u64(out, msg->room) ||
        (msg->has_rank && !kvb__fk_put_i64(out, msg->rank)) ||
        (msg->has_generation && !kvb__fk_put_u64(out, msg->generation)))
        return kvb__fk_rollback(out, n0, len0, KVB_ERR_NOMEM);
    KVB__FK_VERIFY(out, n0, len0, err, kvb__frames_decode_abort_ack, kvb__abort_ack_msg_t);
    return KVB_OK;
}
