/* SGLang's seed-001 dialect (SGLang 0.5.2rc2's Mooncake connector,
 * PROTOCOL.md; docs/protocol-frames.md): 9-frame KV args, 7-frame transfer
 * info, 3-frame status, AUX_DATA; no abort message (kvbridge's abort=1
 * extension on a dummy transfer info, to a kvbridge prefill only).
 * kvbridge's extension frames (kv_lens=, epoch=, page_mask=, prefix_len=,
 * state_idx=, abort=1) follow the "kvbridge-ext/1" marker, to a prefill
 * whose bootstrap look-up answer said "kvbridge" only. */
#include "dialect/sglang2025/sglang.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static kvb__dmsg_t classify(struct kvb_manager *m, const kvb__frame_t *f, size_t n)
{
    (void)m;
    switch (kvb__frames_classify(f, n)) {
    case KVB__MSG_REGISTRATION:
        return KVB__DMSG_REGISTRATION;
    case KVB__MSG_TRANSFER:
        return KVB__DMSG_TRANSFER;
    case KVB__MSG_STATUS:
        return KVB__DMSG_STATUS;
    case KVB__MSG_AUX:
        return KVB__DMSG_AUX;
    default:
        return KVB__DMSG_NONE;
    }
}

/* ---- shared with the 2026 dialect (sglang.h) ---- */

bool kvb__sglang_kv_pool(const kvb__frame_t *ext, size_t n_ext, size_t n_kv, int64_t item_len,
                         kvb__reg_in_t *in, kvb__frames_err_t *e)
{
    static const char key[] = "kv_lens=";
    const size_t kl = sizeof(key) - 1;
    in->has_pool = false;
    in->pool = 0;
    for (size_t i = 0; i < n_ext; i++) {
        const kvb__frame_t *x = &ext[i];
        if (x->len < kl || memcmp(x->data, key, kl) != 0)
            continue;
        if (x->len - kl != n_kv * 8 || item_len <= 0) {
            snprintf(e->reason, sizeof(e->reason),
                     "registration: extension kv_lens has %zu bytes, %zu KV buffers need %zu",
                     x->len - kl, n_kv, n_kv * 8);
            e->has_room = false;
            return false;
        }
        kvb__u64_view_t v = {x->data + kl, n_kv};
        uint64_t pool = UINT64_MAX;
        for (size_t k = 0; k < v.count; k++)
            if (kvb__u64_at(v, k) / (uint64_t)item_len < pool)
                pool = kvb__u64_at(v, k) / (uint64_t)item_len;
        in->pool = pool;
        in->has_pool = true;
        return true;
    }
    return true;
}

bool kvb__sglang_kv_layout(const kvb__frame_t *ext, size_t n_ext, kvb__reg_in_t *in,
                           kvb__frames_err_t *e)
{
    static const char key[] = "kv_layout=";
    const size_t kl = sizeof(key) - 1;
    in->has_layout = false;
    for (size_t i = 0; i < n_ext; i++) {
        const kvb__frame_t *x = &ext[i];
        if (x->len < kl || memcmp(x->data, key, kl) != 0)
            continue;
        const char *v = (const char *)x->data + kl;
        size_t n = x->len - kl, comma = 0;
        while (comma < n && v[comma] != ',')
            comma++;
        int64_t page = 0;
        bool hnd = comma + 4 == n && memcmp(v + comma + 1, "hnd", 3) == 0;
        bool nhd = comma + 4 == n && memcmp(v + comma + 1, "nhd", 3) == 0;
        bool canonical = comma > 0 && (comma == 1 || v[0] != '0'); /* as Python's str(int) */
        if (!canonical || !kvb__parse_i64(v, comma, 1, INT32_MAX, &page) || !(hnd || nhd)) {
            snprintf(e->reason, sizeof(e->reason),
                     "registration: extension kv_layout is not <page_size 1..2^31-1>,<nhd|hnd> "
                     "(%zu bytes)",
                     n);
            e->has_room = false;
            return false;
        }
        in->has_layout = true;
        in->page_size = (uint32_t)page;
        in->kv_order = hnd ? 1u : 0u;
        return true;
    }
    return true;
}

void kvb__sglang_kv_layout_ext(const struct kvb_manager *m, char *buf, kvb__frame_t *f)
{
    int n = snprintf(buf, KVB__SGLANG_LAYOUT_MAX, "kv_layout=%u,%s", m->args.page_size,
                     m->args.kv_order == 1 ? "hnd" : "nhd");
    *f = (kvb__frame_t){(const uint8_t *)buf, (size_t)n};
}

bool kvb__sglang_kv_digest(const kvb__frame_t *ext, size_t n_ext, kvb__reg_in_t *in,
                           kvb__frames_err_t *e)
{
    const size_t kl = sizeof(KVB__INTEG_CAP_KEY) - 1;
    in->digest_max = 0;
    for (size_t i = 0; i < n_ext; i++) {
        const kvb__frame_t *x = &ext[i];
        int64_t v = 0;
        if (x->len < kl || memcmp(x->data, KVB__INTEG_CAP_KEY, kl) != 0)
            continue;
        if (x->len == kl || ((const char *)x->data)[kl] == '0' ||
            !kvb__parse_i64((const char *)x->data + kl, x->len - kl, 1, INT32_MAX, &v)) {
            snprintf(e->reason, sizeof(e->reason),
                     "registration: extension kv_digest is not a version 1..2^31-1 (%zu bytes)",
                     x->len - kl);
            e->has_room = false;
            return false;
        }
        in->digest_max = (uint32_t)v;
        return true;
    }
    return true;
}

bool kvb__sglang_kv_digest_ext(const struct kvb_manager *m, kvb__frame_t *f)
{
    static const char cap[] = KVB__INTEG_CAP_KEY "2";
    _Static_assert(KVB__INTEG_WIRE_MAX == 2, "kv_digest= says the version this build reads");
    if (!m->p.integrity)
        return false;
    *f = (kvb__frame_t){(const uint8_t *)cap, sizeof(cap) - 1};
    return true;
}

kvb_status_t kvb__sglang_kv_lens_ext(const struct kvb_manager *m, uint8_t **buf_p, kvb__frame_t *f)
{
    static const char key[] = "kv_lens=";
    size_t n = sizeof(key) - 1 + (size_t)m->args.num_kv * 8;
    uint8_t *buf = malloc(n);
    if (buf == NULL)
        return KVB_ERR_NOMEM;
    memcpy(buf, key, sizeof(key) - 1);
    memcpy(buf + sizeof(key) - 1, m->kv_lens, (size_t)m->args.num_kv * 8);
    *f = (kvb__frame_t){buf, n};
    *buf_p = buf;
    return KVB_OK;
}

kvb_status_t kvb__sglang_send_status(struct kvb_manager *m, const char *ip, uint16_t port,
                                     uint64_t room, int status, int32_t rank)
{
    return kvb__sglang_send_status_digest(m, ip, port, room, status, rank, NULL, 0);
}

kvb_status_t kvb__sglang_send_status_digest(struct kvb_manager *m, const char *ip, uint16_t port,
                                            uint64_t room, int status, int32_t rank,
                                            const uint8_t *digest, size_t digest_len)
{
    kvb__frames_buf_t b;
    kvb__frames_err_t e;
    uint8_t *ext = NULL;
    kvb__frame_t f = {NULL, 0};
    kvb__status_msg_t s = {room, status, rank, NULL, 0};
    kvb_status_t st = KVB_OK;
    if (digest != NULL) {
        size_t kl = sizeof(KVB__INTEG_EXT_KEY "=") - 1;
        if ((ext = malloc(kl + digest_len)) == NULL)
            return KVB_ERR_NOMEM;
        memcpy(ext, KVB__INTEG_EXT_KEY "=", kl);
        memcpy(ext + kl, digest, digest_len);
        f = (kvb__frame_t){ext, kl + digest_len};
        s.ext = &f;
        s.n_ext = 1;
    }
    kvb__frames_buf_init(&b);
    st = kvb__frames_encode_status(&s, &e, &b);
    if (st == KVB_OK)
        st = kvb__zsend(&m->zc, ip, port, &b);
    kvb__frames_buf_free(&b);
    free(ext);
    return st;
}

/* Seed 001's status values are kvb_poll_t's (PROTOCOL.md "Status values");
 * a kvbridge prefill's kv_digest= rides after the marker (others ignored). */
kvb_status_t kvb__sglang_decode_status(struct kvb_manager *m, const kvb__frame_t *f, size_t n,
                                       kvb__status_in_t *out)
{
    kvb__status_msg_t s;
    kvb__frames_err_t e;
    if (kvb__frames_decode_status(f, n, &e, &s) != KVB_OK) {
        kvb__conn_bad_message(m, kvb__frames_kind_name(KVB__MSG_STATUS), &e);
        return KVB_ERR_PROTO;
    }
    *out = (kvb__status_in_t){s.room, s.status, s.prefill_rank, NULL, 0};
    size_t kl = sizeof(KVB__INTEG_EXT_KEY "=") - 1;
    for (size_t i = 0; i < s.n_ext; i++)
        if (s.ext[i].len >= kl && memcmp(s.ext[i].data, KVB__INTEG_EXT_KEY "=", kl) == 0) {
            out->digest = s.ext[i].data + kl;
            out->digest_len = s.ext[i].len - kl;
        }
    return KVB_OK;
}

kvb_status_t kvb__sglang_send_aux(struct kvb_manager *m, const char *ip, uint16_t port,
                                  const kvb__aux_in_t *a)
{
    kvb__frames_buf_t buf;
    kvb__frames_err_t e;
    kvb__aux_msg_t x = {a->room, a->buffer_index, a->aux_index, a->payload, a->payload_len};
    kvb__frames_buf_init(&buf);
    kvb_status_t st = kvb__frames_encode_aux(&x, &e, &buf);
    if (st == KVB_OK)
        st = kvb__zsend(&m->zc, ip, port, &buf);
    kvb__frames_buf_free(&buf);
    return st;
}

/* Decoded and checked against this decode's aux buffers. */
kvb_status_t kvb__sglang_decode_aux(struct kvb_manager *m, const kvb__frame_t *f, size_t n,
                                    kvb__aux_in_t *out)
{
    kvb__frames_err_t e;
    kvb__aux_msg_t x;
    uint64_t *items = calloc(m->args.num_aux + 1, sizeof(*items));
    kvb_status_t st = items == NULL ? KVB_ERR_NOMEM : kvb__frames_decode_aux(f, n, &e, &x);
    for (uint32_t i = 0; st == KVB_OK && i < m->args.num_aux; i++)
        items[i] = m->aux_lens[i] / m->aux_items[i];
    if (st == KVB_OK)
        st = kvb__frames_check_aux(&x, m->args.num_aux, m->aux_items, items, &e);
    if (st == KVB_OK)
        *out = (kvb__aux_in_t){x.room, x.buffer_index, x.aux_index, x.payload, x.payload_len};
    free(items);
    if (st == KVB_ERR_PROTO) {
        kvb__aux_msg_t a;
        if (!e.has_room && kvb__frames_decode_aux(f, n, NULL, &a) == KVB_OK) {
            e.has_room = true;
            e.room = a.room;
        }
        kvb__conn_bad_message(m, kvb__frames_kind_name(KVB__MSG_AUX), &e);
    }
    return st;
}

void kvb__sglang_needs_ext(const kvb__src_t *s, size_t count, const kvb_receiver_init_t *ex,
                           bool v26, char *why, size_t len)
{
    size_t hole = 0;
    bool holes = kvb__dialect_mask_hole(count, ex, &hole);
    bool prefix = (ex->field_mask & KVB_RECV_INIT_PREFIX) && ex->prefix_tokens > 0;
    bool state = (ex->field_mask & KVB_RECV_INIT_STATE) && ex->num_state_indices > 0;
    if (s->kvbridge || !(holes || (!v26 && (prefix || state))))
        return;
    snprintf(why, len,
             "%s%s has no form in %s transfer info without kvbridge extensions, and prefill "
             "%.64s:%u did not register as kvbridge%s",
             holes    ? "a page mask with holes"
             : prefix ? "a decode prefix"
                      : "state indices",
             holes ? "" : " (kvbridge's extension)", v26 ? "SGLang's 2026" : "seed 001's", s->ip,
             s->port, v26 ? "; use prefix_tokens" : "");
}

/* ---- prefill side ---- */

static kvb_status_t decode_registration(struct kvb_manager *m, const kvb__frame_t *f, size_t n,
                                        kvb__reg_in_t *in)
{
    kvb__reg_msg_t msg;
    kvb__frames_err_t e;
    memset(in, 0, sizeof(*in));
    if (kvb__frames_decode_registration(f, n, &e, &msg) != KVB_OK ||
        !kvb__sglang_kv_pool(msg.ext, msg.n_ext, msg.kv_ptrs.count, msg.dst_kv_item_len, in, &e) ||
        !kvb__sglang_kv_layout(msg.ext, msg.n_ext, in, &e) ||
        !kvb__sglang_kv_digest(msg.ext, msg.n_ext, in, &e)) {
        kvb__conn_bad_message(m, kvb__frames_kind_name(KVB__MSG_REGISTRATION), &e);
        return KVB_ERR_PROTO;
    }
    in->ip = msg.ip;
    in->ip_len = msg.ip_len;
    in->session = msg.session_id;
    in->session_len = msg.session_id_len;
    in->port = msg.port;
    in->kv = msg.kv_ptrs;
    in->aux = msg.aux_ptrs;
    in->tp_rank = msg.dst_tp_rank;
    in->tp_size = msg.dst_attn_tp_size;
    in->item_len = msg.dst_kv_item_len;
    in->dialect = &kvb__dialect_sglang2025;
    if (msg.has_state_ptrs) {
        in->state = kvb__copy_u64_view(msg.state_ptrs);
        in->n_state = msg.state_ptrs.count;
        if (in->state == NULL)
            return KVB_ERR_NOMEM;
    }
    return KVB_OK;
}

static bool msg_is_abort(const kvb__xfer_msg_t *x)
{
    for (size_t i = 0; i < x->n_ext; i++)
        if (x->ext[i].len == 7 && memcmp(x->ext[i].data, "abort=1", 7) == 0)
            return true;
    return false;
}

static kvb_status_t dst_from_msg(const kvb__xfer_msg_t *x, kvb__dst_t *d)
{
    kvb__copy_str(d->session, sizeof(d->session), x->session_id, x->session_id_len);
    kvb__copy_str(d->ip, sizeof(d->ip), x->ip, x->ip_len);
    d->port = x->port;
    d->dummy = x->is_dummy;
    d->aux_index = x->aux_index;
    d->n_pages = x->pages.count;
    d->prefix_tokens = x->has_prefix_len ? x->prefix_len : 0;
    d->epoch = x->has_epoch ? x->epoch : 0;
    d->dialect = &kvb__dialect_sglang2025;
    d->pages = malloc((d->n_pages ? d->n_pages : 1) * sizeof(int32_t));
    if (d->pages == NULL)
        return KVB_ERR_NOMEM;
    for (size_t i = 0; i < d->n_pages; i++)
        d->pages[i] = kvb__i32_at(x->pages, i);
    if (x->has_page_mask) {
        d->mask = malloc(d->n_pages ? d->n_pages : 1);
        if (d->mask == NULL)
            return KVB_ERR_NOMEM;
        memcpy(d->mask, x->page_mask, d->n_pages);
    }
    if (x->has_state_idx && x->state_idx.count > 0) {
        d->n_state = x->state_idx.count;
        d->state_idx = malloc(d->n_state * sizeof(int32_t));
        if (d->state_idx == NULL)
            return KVB_ERR_NOMEM;
        for (size_t i = 0; i < d->n_state; i++)
            d->state_idx[i] = kvb__i32_at(x->state_idx, i);
    }
    return KVB_OK;
}

/* A transfer info, or a kvbridge decode's abort=1 (d then names the asker). */
static kvb_status_t take_transfer(struct kvb_manager *m, const kvb__frame_t *f, size_t n,
                                  kvb__xfer_in_t *out)
{
    kvb__xfer_msg_t x;
    kvb__frames_err_t e;
    memset(out, 0, sizeof(*out));
    if (kvb__frames_decode_transfer(f, n, &e, &x) != KVB_OK) {
        kvb__conn_bad_message(m, kvb__frames_kind_name(KVB__MSG_TRANSFER), &e);
        return KVB_ERR_PROTO;
    }
    out->room = x.room;
    out->required = x.required_dst_info_num;
    out->is_abort = msg_is_abort(&x);
    if (out->is_abort) {
        kvb__copy_str(out->d.ip, sizeof(out->d.ip), x.ip, x.ip_len);
        out->d.port = x.port;
        return KVB_OK;
    }
    return dst_from_msg(&x, &out->d);
}

/* ---- decode side ---- */

static kvb_status_t send_registration(struct kvb_manager *m, const char *ip, uint16_t port,
                                      bool kvbridge, const void *priv)
{
    (void)priv; /* routed by kvbridge's planner: no record of its own */
    kvb__frames_buf_t b;
    kvb__frames_err_t e;
    kvb__reg_msg_t r = {0};
    kvb__frame_t ext[3]; /* kv_lens=, kv_layout=, kv_digest= */
    char layout[KVB__SGLANG_LAYOUT_MAX];
    uint8_t *lens_buf = NULL;
    if (kvb__sglang_kv_lens_ext(m, &lens_buf, &ext[0]) != KVB_OK)
        return KVB_ERR_NOMEM;
    kvb__sglang_kv_layout_ext(m, layout, &ext[1]);
    r.ext = kvbridge ? ext : NULL;
    r.n_ext = kvbridge ? 2u + kvb__sglang_kv_digest_ext(m, &ext[2]) : 0;
    const char *sid = kvb_engine_session_id(m->engine);
    r.ip = m->host;
    r.ip_len = strlen(m->host);
    r.port = m->port;
    r.session_id = sid;
    r.session_id_len = strlen(sid);
    r.kv_ptrs = kvb__u64_view_of(m->kv_ptrs, m->args.num_kv);
    r.aux_ptrs = kvb__u64_view_of(m->aux_ptrs, m->args.num_aux);
    r.dst_tp_rank = m->p.attn_tp_rank;
    r.dst_attn_tp_size = m->p.attn_tp_size;
    r.dst_kv_item_len = (int64_t)m->args.kv_item_len;
    if (m->args.num_state > 0) {
        r.has_state_ptrs = true;
        r.state_ptrs = kvb__u64_view_of(m->state_ptrs, m->args.num_state);
    }
    kvb__frames_buf_init(&b);
    kvb_status_t st = kvb__frames_encode_registration(&r, &e, &b);
    if (st == KVB_OK)
        st = kvb__zsend(&m->zc, ip, port, &b);
    kvb__frames_buf_free(&b);
    free(lens_buf);
    return st;
}

/* Frames 0-6 of a transfer info from us to s (a dummy when dummy). */
static void xfer_head(struct kvb_manager *m, const kvb__src_t *s, uint64_t room, bool dummy,
                      kvb__xfer_msg_t *x)
{
    const char *sid = kvb_engine_session_id(m->engine);
    memset(x, 0, sizeof(*x));
    x->room = room;
    x->ip = m->host;
    x->ip_len = strlen(m->host);
    x->port = m->port;
    x->session_id = sid;
    x->session_id_len = strlen(sid);
    x->is_dummy = dummy;
    x->aux_index = -1;
    x->required_dst_info_num = (int32_t)s->required_dst_info_num;
}

static kvb_status_t send_xfer_msg(struct kvb_manager *m, const kvb__src_t *s,
                                  const kvb__xfer_msg_t *x)
{
    kvb__frames_buf_t b;
    kvb__frames_err_t e;
    kvb__frames_buf_init(&b);
    kvb_status_t st = kvb__frames_encode_transfer(x, &e, &b);
    if (st != KVB_OK)
        KVB_LOGW("manager %s: transfer info for room %llu not encodable: %s", m->endpoint,
                 (unsigned long long)x->room, e.reason);
    else
        st = kvb__zsend(&m->zc, s->ip, s->port, &b);
    kvb__frames_buf_free(&b);
    return st;
}

/* 7 frames, then, to a kvbridge prefill, the marker and epoch=,
 * page_mask=, prefix_len=, state_idx= (a plain seed-001 prefill gets the 7
 * frames: transfer_form refused what they cannot say). */
static kvb_status_t send_transfer(struct kvb_manager *m, const kvb__src_t *s, uint64_t room,
                                  const int32_t *idx, size_t n, int64_t aux,
                                  const kvb_receiver_init_t *ex)
{
    kvb__xfer_msg_t x;
    bool ext = !s->dummy && s->kvbridge && ex != NULL;
    xfer_head(m, s, room, s->dummy, &x);
    x.pages = s->dummy ? kvb__i32_view_of(NULL, 0) : kvb__i32_view_of(idx, n);
    x.aux_index = s->dummy ? -1 : (int32_t)aux;
    x.has_epoch = !s->dummy && s->kvbridge && s->epoch != 0;
    x.epoch = s->epoch;
    if (ext && (ex->field_mask & KVB_RECV_INIT_MASK) && ex->page_mask) {
        x.has_page_mask = true;
        x.page_mask = ex->page_mask;
    }
    if (ext && (ex->field_mask & KVB_RECV_INIT_PREFIX)) {
        x.has_prefix_len = true;
        x.prefix_len = (int64_t)ex->prefix_tokens;
    }
    if (ext && (ex->field_mask & KVB_RECV_INIT_STATE) && ex->num_state_indices > 0 &&
        ex->state_indices != NULL) {
        x.has_state_idx = true;
        x.state_idx = kvb__i32_view_of(ex->state_indices, ex->num_state_indices);
    }
    return send_xfer_msg(m, s, &x);
}

/* Seed 001 has no abort: a kvbridge prefill gets a dummy transfer info
 * with abort=1; a plain seed-001 prefill is told nothing (its status, or
 * the abort-ack time-out, then closes the fence). */
static kvb_status_t send_abort(struct kvb_manager *m, const kvb__src_t *s, uint64_t room,
                               uint64_t gen)
{
    (void)gen;
    if (!s->kvbridge)
        return KVB_OK;
    kvb__xfer_msg_t x;
    kvb__frame_t ext = {(const uint8_t *)"abort=1", 7};
    xfer_head(m, s, room, true, &x);
    x.ext = &ext;
    x.n_ext = 1;
    return send_xfer_msg(m, s, &x);
}

/* Seed 001's transfer info carries pages only: masks with holes, prefixes
 * and state indices travel as kvbridge extensions. */
static void transfer_form(const struct kvb_manager *m, const kvb__src_t *s, size_t count,
                          const kvb_receiver_init_t *ex, char *why, size_t len)
{
    (void)m;
    kvb__sglang_needs_ext(s, count, ex, false, why, len);
}

const kvb__dialect_t kvb__dialect_sglang2025 = {
    .t = {.name = "SGLang seed 001",
          .family = "SGLang",
          .plans_chunks = false,
          .extensions = true,
          .suffix_pages = false,
          .own_status = false},
    .boot_dialect = KVB_BOOTSTRAP_DIALECT_2025,
    .classify = classify,
    .decode_registration = decode_registration,
    .take_transfer = take_transfer,
    .send_status = kvb__sglang_send_status,
    .send_status_digest = kvb__sglang_send_status_digest,
    .send_registration = send_registration,
    .send_transfer = send_transfer,
    .send_abort = send_abort,
    .transfer_form = transfer_form,
    .decode_status = kvb__sglang_decode_status,
    .decode_aux = kvb__sglang_decode_aux,
    .send_aux = kvb__sglang_send_aux,
};
