/* Control-frame codec of SGLang's seed-001 dialect (PROTOCOL.md;
 * docs/protocol-frames.md): 9-frame KV args, 7-frame transfer info, 3-frame
 * status, AUX_DATA, and the classification of SGLang's messages (both
 * dialects). Field rules: proto/frames_kit.h. */
#include "dialect/sglang2025/frames.h"
#include "dialect/sglang2026/frames.h"
#include "proto/frames_kit.h"

#include <stdio.h>
#include <stdlib.h>

#define KIND_REG "registration"
#define KIND_XFER "transfer info"
#define KIND_STATUS "status"
#define KIND_AUX "aux data"

#define XFER_FRAMES 7
#define REG_FRAMES 9
#define STATUS_FRAMES 3
#define AUX_FRAMES 6

static const char *const status_known[] = {NULL}; /* its extensions pass through */

/* ---- classification ---- */

/* Registrations and transfer infos are told apart by their dialect frames
 * alone (those before the marker): seed 001 has 9 / 7, SGLang 2026 at least
 * 10 / 8 (docs/protocol-frames.md, "Told apart from seed 001"). */
kvb__msg_kind_t kvb__frames_classify(const kvb__frame_t *frames, size_t n)
{
    uint64_t room;
    if (n == 0)
        return KVB__MSG_UNKNOWN;
    if (kvb__fk_frame_is(&frames[0], KVB__FK_NONE_TAG, sizeof(KVB__FK_NONE_TAG) - 1))
        return kvb__frames_dialect_count(frames, n) >= KVB__REG26_MIN ? KVB__MSG_REGISTRATION26
                                                                      : KVB__MSG_REGISTRATION;
    if (kvb__fk_frame_is(&frames[0], KVB__FK_AUX_TAG, sizeof(KVB__FK_AUX_TAG) - 1))
        return KVB__MSG_AUX;
    if (kvb__fk_tag_is(&frames[0], "ABORT"))
        return KVB__MSG_ABORT;
    if (kvb__fk_tag_is(&frames[0], "ABORT_ACK"))
        return KVB__MSG_ABORT_ACK;
    if (kvb__fk_tag_is(&frames[0], "STAGING_REQ") || kvb__fk_tag_is(&frames[0], "STAGING_RSP") ||
        kvb__fk_tag_is(&frames[0], "CHUNK_READY") || kvb__fk_tag_is(&frames[0], "WATERMARK"))
        return KVB__MSG_STAGING;
    if (!kvb__fk_parse_room(&frames[0], &room))
        return KVB__MSG_UNKNOWN;
    size_t nd = kvb__frames_dialect_count(frames, n);
    if (nd == STATUS_FRAMES) /* with kvbridge's extensions after a marker, or without */
        return KVB__MSG_STATUS;
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
        return KVB__KIND_REG26;
    case KVB__MSG_TRANSFER26:
        return KVB__KIND_XFER26;
    case KVB__MSG_ABORT:
        return KVB__KIND_ABORT;
    case KVB__MSG_ABORT_ACK:
        return KVB__KIND_ACK;
    case KVB__MSG_STAGING:
        return "staging";
    default:
        return "unknown";
    }
}

kvb_status_t kvb__frames_decode_registration(const kvb__frame_t *frames, size_t n,
                                             kvb__frames_err_t *err, kvb__reg_msg_t *msg_p)
{
    kvb__fk_ctx_t c = {KIND_REG, err, false, 0};
    kvb__reg_msg_t m;
    memset(&m, 0, sizeof(m));
    size_t nd, from;
    KVB__FRAMES_TRY(kvb__fk_need_frames(&c, frames, n, REG_FRAMES, REG_FRAMES, &nd, &from));
    KVB__FRAMES_TRY(kvb__fk_need_reg_head(&c, frames, &m.port));
    KVB__FRAMES_TRY(kvb__fk_need_u64_array(&c, &frames[4], 4, "kv_ptrs", true, &m.kv_ptrs));
    KVB__FRAMES_TRY(kvb__fk_need_u64_array(&c, &frames[5], 5, "aux_ptrs", false, &m.aux_ptrs));
    KVB__FRAMES_TRY(kvb__fk_need_i32(&c, &frames[6], 6, "dst_tp_rank", 0, &m.dst_tp_rank));
    KVB__FRAMES_TRY(
        kvb__fk_need_i32(&c, &frames[7], 7, "dst_attn_tp_size", 1, &m.dst_attn_tp_size));
    KVB__FRAMES_TRY(
        kvb__fk_need_int(&c, &frames[8], 8, "dst_kv_item_len", 1, INT64_MAX, &m.dst_kv_item_len));
    for (size_t i = from; i < n; i++) {
        kvb__fk_ext_kv_t kv;
        kvb__frame_t val;
        kvb__fk_split_ext(&frames[i], &kv);
        val.data = kv.val;
        val.len = kv.val_len;
        if (kvb__fk_key_is(&kv, "state_ptrs")) {
            KVB__FRAMES_TRY(
                kvb__fk_need_u64_array(&c, &val, i, "extension state_ptrs", false, &m.state_ptrs));
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
    kvb__fk_ctx_t c = {KIND_XFER, err, false, 0};
    kvb__xfer_msg_t m;
    memset(&m, 0, sizeof(m));
    if (n >= 1)
        c.has_room = kvb__fk_parse_room(&frames[0], &c.room);
    size_t nd, from;
    KVB__FRAMES_TRY(kvb__fk_need_frames(&c, frames, n, XFER_FRAMES, XFER_FRAMES, &nd, &from));
    KVB__FRAMES_TRY(kvb__fk_need_room(&c, &frames[0], 0, &m.room));
    KVB__FRAMES_TRY(kvb__fk_need_peer(&c, frames, &m.port));
    m.is_dummy = frames[4].len == 0 && frames[5].len == 0;
    m.aux_index = -1;
    if (!m.is_dummy) {
        KVB__FRAMES_TRY(kvb__fk_need_i32_array(&c, &frames[4], 4, "dst page indices", &m.pages));
        if (frames[5].len == 0)
            return kvb__fk_fail_frame(&c, 5, "aux index",
                                      "empty while frame 4 holds %zu page indices", m.pages.count);
        KVB__FRAMES_TRY(kvb__fk_need_i32(&c, &frames[5], 5, "aux index", 0, &m.aux_index));
    }
    KVB__FRAMES_TRY(
        kvb__fk_need_i32(&c, &frames[6], 6, "required_dst_info_num", 1, &m.required_dst_info_num));
    for (size_t i = from; i < n; i++) {
        kvb__fk_ext_kv_t kv;
        kvb__frame_t val;
        kvb__fk_split_ext(&frames[i], &kv);
        val.data = kv.val;
        val.len = kv.val_len;
        if (kvb__fk_key_is(&kv, "page_mask")) {
            if (val.len != m.pages.count)
                return kvb__fk_fail_frame(&c, i, "extension page_mask",
                                          "%zu bytes for %zu page indices", val.len, m.pages.count);
            for (size_t k = 0; k < val.len; k++)
                if (val.data[k] > 1)
                    return kvb__fk_fail_frame(&c, i, "extension page_mask",
                                              "byte %zu is 0x%02x, expected 0 or 1", k,
                                              val.data[k]);
            m.has_page_mask = true;
            m.page_mask = val.data;
        } else if (kvb__fk_key_is(&kv, "prefix_len")) {
            KVB__FRAMES_TRY(
                kvb__fk_need_int(&c, &val, i, "extension prefix_len", 0, INT64_MAX, &m.prefix_len));
            m.has_prefix_len = true;
        } else if (kvb__fk_key_is(&kv, "state_idx")) {
            KVB__FRAMES_TRY(
                kvb__fk_need_i32_array(&c, &val, i, "extension state_idx", &m.state_idx));
            m.has_state_idx = true;
        } else if (kvb__fk_key_is(&kv, "epoch")) {
            int64_t ep;
            KVB__FRAMES_TRY(kvb__fk_need_int(&c, &val, i, "extension epoch", 1, INT64_MAX, &ep));
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
    kvb__fk_ctx_t c = {KIND_STATUS, err, false, 0};
    kvb__status_msg_t m;
    int64_t v;
    size_t nd, from;
    if (n >= 1)
        c.has_room = kvb__fk_parse_room(&frames[0], &c.room);
    if (kvb__frames_dialect_count(frames, n) != STATUS_FRAMES)
        return kvb__fk_fail(&c, "expected %d frames, got %zu", STATUS_FRAMES,
                            kvb__frames_dialect_count(frames, n));
    KVB__FRAMES_TRY(kvb__fk_split_marker(&c, frames, n, &nd, &from));
    KVB__FRAMES_TRY(kvb__fk_need_room(&c, &frames[0], 0, &m.room));
    KVB__FRAMES_TRY(
        kvb__fk_need_int(&c, &frames[1], 1, "status", KVB__WIRE_FAILED, KVB__WIRE_SUCCESS, &v));
    m.status = (int32_t)v;
    KVB__FRAMES_TRY(kvb__fk_need_i32(&c, &frames[2], 2, "prefill_rank", 0, &m.prefill_rank));
    m.ext = frames + from;
    m.n_ext = n - from;
    *msg_p = m;
    return KVB_OK;
}

kvb_status_t kvb__frames_decode_aux(const kvb__frame_t *frames, size_t n, kvb__frames_err_t *err,
                                    kvb__aux_msg_t *msg_p)
{
    kvb__fk_ctx_t c = {KIND_AUX, err, false, 0};
    kvb__aux_msg_t m;
    uint32_t declared;
    char q[200];
    if (n >= 2 && kvb__fk_frame_is(&frames[0], KVB__FK_AUX_TAG, sizeof(KVB__FK_AUX_TAG) - 1))
        c.has_room = kvb__fk_parse_room(&frames[1], &c.room);
    if (n != AUX_FRAMES)
        return kvb__fk_fail(&c, "expected %d frames, got %zu", AUX_FRAMES, n);
    if (!kvb__fk_frame_is(&frames[0], KVB__FK_AUX_TAG, sizeof(KVB__FK_AUX_TAG) - 1)) {
        kvb__fk_quote(q, sizeof(q), frames[0].data, frames[0].len);
        return kvb__fk_fail_frame(&c, 0, "tag", "%s is not \"AUX_DATA\"", q);
    }
    KVB__FRAMES_TRY(kvb__fk_need_room(&c, &frames[1], 1, &m.room));
    KVB__FRAMES_TRY(kvb__fk_need_i32(&c, &frames[2], 2, "buffer index", 0, &m.buffer_index));
    KVB__FRAMES_TRY(kvb__fk_need_i32(&c, &frames[3], 3, "aux index", 0, &m.aux_index));
    if (frames[4].len != 4)
        return kvb__fk_fail_frame(&c, 4, "length", "%zu bytes, expected 4 (big-endian uint32)",
                                  frames[4].len);
    declared = (uint32_t)frames[4].data[0] << 24 | (uint32_t)frames[4].data[1] << 16 |
               (uint32_t)frames[4].data[2] << 8 | (uint32_t)frames[4].data[3];
    if (frames[5].len != declared)
        return kvb__fk_fail_frame(&c, 5, "payload", "%zu bytes, frame 4 declares %u", frames[5].len,
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
    kvb__fk_ctx_t c = {KIND_AUX, err, true, msg->room};
    size_t b = (size_t)msg->buffer_index;
    if (msg->buffer_index < 0 || b >= n_buffers)
        return kvb__fk_fail_frame(&c, 2, "buffer index", "%d outside the %zu aux buffers",
                                  (int)msg->buffer_index, n_buffers);
    if (msg->aux_index < 0 || (uint64_t)msg->aux_index >= n_items[b])
        return kvb__fk_fail_frame(&c, 3, "aux index", "%d outside the %llu items of aux buffer %zu",
                                  (int)msg->aux_index, (unsigned long long)n_items[b], b);
    if ((uint64_t)msg->payload_len != item_lens[b])
        return kvb__fk_fail_frame(&c, 5, "payload", "%zu bytes, aux buffer %zu has items of %llu",
                                  msg->payload_len, b, (unsigned long long)item_lens[b]);
    return KVB_OK;
}

kvb_status_t kvb__frames_encode_registration(const kvb__reg_msg_t *msg, kvb__frames_err_t *err,
                                             kvb__frames_buf_t *out)
{
    size_t n0 = out->n, len0 = out->len;
    kvb__fk_ext_out_t typed[1];
    size_t n_typed = 0;
    kvb_status_t st;
    if (kvb__fk_bad_view(msg->ip, msg->ip_len) ||
        kvb__fk_bad_view(msg->session_id, msg->session_id_len) ||
        kvb__fk_bad_view(msg->kv_ptrs.data, msg->kv_ptrs.count) ||
        kvb__fk_bad_view(msg->aux_ptrs.data, msg->aux_ptrs.count) ||
        (msg->has_state_ptrs && kvb__fk_bad_view(msg->state_ptrs.data, msg->state_ptrs.count)) ||
        kvb__fk_bad_view(msg->ext, msg->n_ext) || msg->kv_ptrs.count > SIZE_MAX / 8 ||
        msg->aux_ptrs.count > SIZE_MAX / 8 || msg->state_ptrs.count > SIZE_MAX / 8)
        return kvb__fk_caller_error(err, KIND_REG, "NULL array with a non-zero length");
    if (msg->has_state_ptrs)
        typed[n_typed++] =
            kvb__fk_typed_ext("state_ptrs", msg->state_ptrs.data, msg->state_ptrs.count * 8);
    if (!kvb__fk_put(out, KVB__FK_NONE_TAG, sizeof(KVB__FK_NONE_TAG) - 1) ||
        !kvb__fk_put(out, msg->ip, msg->ip_len) || !kvb__fk_put_u64(out, msg->port) ||
        !kvb__fk_put(out, msg->session_id, msg->session_id_len) ||
        !kvb__fk_put(out, msg->kv_ptrs.data, msg->kv_ptrs.count * 8) ||
        !kvb__fk_put(out, msg->aux_ptrs.data, msg->aux_ptrs.count * 8) ||
        !kvb__fk_put_i64(out, msg->dst_tp_rank) || !kvb__fk_put_i64(out, msg->dst_attn_tp_size) ||
        !kvb__fk_put_i64(out, msg->dst_kv_item_len))
        return kvb__fk_rollback(out, n0, len0, KVB_ERR_NOMEM);
    st = kvb__fk_put_ext(out, kvb__fk_reg_known, typed, n_typed, msg->ext, msg->n_ext);
    if (st != KVB_OK)
        return kvb__fk_rollback(out, n0, len0, st);
    KVB__FK_VERIFY(out, n0, len0, err, kvb__frames_decode_registration, kvb__reg_msg_t);
    return KVB_OK;
}

kvb_status_t kvb__frames_encode_transfer(const kvb__xfer_msg_t *msg, kvb__frames_err_t *err,
                                         kvb__frames_buf_t *out)
{
    size_t n0 = out->n, len0 = out->len;
    kvb__fk_ext_out_t typed[4];
    size_t n_typed = 0;
    char prefix[24], epoch[24];
    kvb_status_t st;
    bool ok;
    if (kvb__fk_bad_view(msg->ip, msg->ip_len) ||
        kvb__fk_bad_view(msg->session_id, msg->session_id_len) ||
        kvb__fk_bad_view(msg->pages.data, msg->pages.count) ||
        (msg->has_page_mask && kvb__fk_bad_view(msg->page_mask, msg->pages.count)) ||
        (msg->has_state_idx && kvb__fk_bad_view(msg->state_idx.data, msg->state_idx.count)) ||
        kvb__fk_bad_view(msg->ext, msg->n_ext) || msg->pages.count > SIZE_MAX / 4 ||
        msg->state_idx.count > SIZE_MAX / 4)
        return kvb__fk_caller_error(err, KIND_XFER, "NULL array with a non-zero length");
    if (msg->is_dummy && msg->pages.count != 0)
        return kvb__fk_caller_error(err, KIND_XFER,
                                    "a dummy transfer info carries no page indices");
    /* typed[] in key order; put_ext sorts anyway. */
    if (msg->has_epoch) {
        if (msg->epoch == 0 || msg->epoch > INT64_MAX)
            return kvb__fk_caller_error(err, KIND_XFER, "epoch outside 1..2^63-1");
        int k = snprintf(epoch, sizeof(epoch), "%llu", (unsigned long long)msg->epoch);
        typed[n_typed++] = kvb__fk_typed_ext("epoch", epoch, (size_t)k);
    }
    if (msg->has_page_mask)
        typed[n_typed++] = kvb__fk_typed_ext("page_mask", msg->page_mask, msg->pages.count);
    if (msg->has_prefix_len) {
        int k = snprintf(prefix, sizeof(prefix), "%lld", (long long)msg->prefix_len);
        typed[n_typed++] = kvb__fk_typed_ext("prefix_len", prefix, (size_t)k);
    }
    if (msg->has_state_idx)
        typed[n_typed++] =
            kvb__fk_typed_ext("state_idx", msg->state_idx.data, msg->state_idx.count * 4);
    ok = kvb__fk_put_u64(out, msg->room) && kvb__fk_put(out, msg->ip, msg->ip_len) &&
         kvb__fk_put_u64(out, msg->port) && kvb__fk_put(out, msg->session_id, msg->session_id_len);
    if (ok && msg->is_dummy)
        ok = kvb__fk_put(out, NULL, 0) && kvb__fk_put(out, NULL, 0);
    else if (ok)
        ok = kvb__fk_put(out, msg->pages.data, msg->pages.count * 4) &&
             kvb__fk_put_i64(out, msg->aux_index);
    ok = ok && kvb__fk_put_i64(out, msg->required_dst_info_num);
    if (!ok)
        return kvb__fk_rollback(out, n0, len0, KVB_ERR_NOMEM);
    st = kvb__fk_put_ext(out, kvb__fk_xfer_known, typed, n_typed, msg->ext, msg->n_ext);
    if (st != KVB_OK)
        return kvb__fk_rollback(out, n0, len0, st);
    KVB__FK_VERIFY(out, n0, len0, err, kvb__frames_decode_transfer, kvb__xfer_msg_t);
    return KVB_OK;
}

kvb_status_t kvb__frames_encode_status(const kvb__status_msg_t *msg, kvb__frames_err_t *err,
                                       kvb__frames_buf_t *out)
{
    size_t n0 = out->n, len0 = out->len;
    if (!kvb__fk_put_u64(out, msg->room) || !kvb__fk_put_i64(out, msg->status) ||
        !kvb__fk_put_i64(out, msg->prefill_rank))
        return kvb__fk_rollback(out, n0, len0, KVB_ERR_NOMEM);
    kvb_status_t st = kvb__fk_put_ext(out, status_known, NULL, 0, msg->ext, msg->n_ext);
    if (st != KVB_OK)
        return kvb__fk_rollback(out, n0, len0, st);
    KVB__FK_VERIFY(out, n0, len0, err, kvb__frames_decode_status, kvb__status_msg_t);
    return KVB_OK;
}

kvb_status_t kvb__frames_encode_aux(const kvb__aux_msg_t *msg, kvb__frames_err_t *err,
                                    kvb__frames_buf_t *out)
{
    size_t n0 = out->n, len0 = out->len;
    uint8_t be[4];
    if (kvb__fk_bad_view(msg->payload, msg->payload_len))
        return kvb__fk_caller_error(err, KIND_AUX, "NULL payload with a non-zero length");
    if (msg->payload_len > UINT32_MAX)
        return kvb__fk_caller_error(err, KIND_AUX, "payload longer than 4294967295 bytes");
    be[0] = (uint8_t)(msg->payload_len >> 24);
    be[1] = (uint8_t)(msg->payload_len >> 16);
    be[2] = (uint8_t)(msg->payload_len >> 8);
    be[3] = (uint8_t)msg->payload_len;
    if (!kvb__fk_put(out, KVB__FK_AUX_TAG, sizeof(KVB__FK_AUX_TAG) - 1) ||
        !kvb__fk_put_u64(out, msg->room) || !kvb__fk_put_i64(out, msg->buffer_index) ||
        !kvb__fk_put_i64(out, msg->aux_index) || !kvb__fk_put(out, be, 4) ||
        !kvb__fk_put(out, msg->payload, msg->payload_len))
        return kvb__fk_rollback(out, n0, len0, KVB_ERR_NOMEM);
    KVB__FK_VERIFY(out, n0, len0, err, kvb__frames_decode_aux, kvb__aux_msg_t);
    return KVB_OK;
}

/* ==== SGLang's 2026 dialect (frames26.h) ==== */
