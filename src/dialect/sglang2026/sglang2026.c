/* SGLang's 2026 dialect (SGLang 0.5.23, PROTOCOL-SGLANG-2026.md;
 * docs/sglang-2026-fields.md): 18- to 20-frame KV args, 8- to 10-frame
 * transfer info listing only the pages after the decode's prefix, ABORT and
 * ABORT_ACK (with 0.5.23's generation), the GPU staging messages (refused:
 * kvbridge never stages). Status and AUX_DATA are seed 001's
 * (sglang2025/sglang.h), as are kvbridge's extension frames. */
#include "dialect/sglang2026/sglang2026.h"
#include "dialect/sglang2026/kv_checksum.h"
#include "dialect/sglang2025/sglang.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static kvb__dmsg_t classify(struct kvb_manager *m, const kvb__frame_t *f, size_t n)
{
    (void)m;
    switch (kvb__frames_classify(f, n)) {
    case KVB__MSG_REGISTRATION26:
        return KVB__DMSG_REGISTRATION;
    case KVB__MSG_TRANSFER26:
        return KVB__DMSG_TRANSFER;
    case KVB__MSG_ABORT:
        return KVB__DMSG_ABORT;
    case KVB__MSG_ABORT_ACK:
        return KVB__DMSG_ABORT_ACK;
    case KVB__MSG_STAGING:
        return KVB__DMSG_UNSUPPORTED;
    default:
        return KVB__DMSG_NONE;
    }
}

/* ---- prefill side: KV args ---- */

/* SGLang 0.5.23's frame 19: per-buffer item lengths; kvbridge takes one per
 * rank (frame 9), so a buffer with another length cannot be served. */
static bool reg26_mixed_items(const kvb__reg26_msg_t *x, char *buf, size_t len)
{
    for (size_t i = 0; i < x->kv_item_lens.count; i++) {
        uint64_t v = kvb__u64_at(x->kv_item_lens, i);
        if (v != (uint64_t)x->dst_kv_item_len) {
            snprintf(buf, len,
                     "decode %.*s KV buffer %zu has %llu-byte items, its first %lld; kvbridge "
                     "takes one item length per rank",
                     (int)x->session_id_len, x->session_id, i, (unsigned long long)v,
                     (long long)x->dst_kv_item_len);
            return true;
        }
    }
    return false;
}

/* What of a 2026 registration kvbridge cannot serve, into buf (empty: all
 * fine). Checked: KV buffers present, DCP off, the KV item length at the
 * same attention TP size (or MLA: page size and KV dtype), one state
 * component, layer ids only where position pairs the same layers. */
static void reg26_unsupported(struct kvb_manager *m, const kvb__reg26_msg_t *x,
                              const kvb__reg_in_t *in, char *buf, size_t len)
{
    int sid = (int)x->session_id_len;
    /* items compare per token where a kvbridge decode said its page size */
    uint64_t dpage = in->has_layout ? in->page_size : m->args.page_size;
    buf[0] = '\0';
    if (x->kv_ptrs.count == 0)
        snprintf(buf, len, "decode %.*s registered no KV buffers", sid, x->session_id);
    else if (x->dcp_size != 1)
        snprintf(buf, len,
                 "decode %.*s uses decode context parallelism (DCP size %d, rank %d); kvbridge "
                 "does not relayout KV for DCP",
                 sid, x->session_id, (int)x->dcp_size, (int)x->dcp_rank);
    else if (reg26_mixed_items(x, buf, len))
        ;
    else if ((m->p.is_mla || x->dst_attn_tp_size == m->p.attn_tp_size) &&
             (uint64_t)x->dst_kv_item_len * m->args.page_size != m->args.kv_item_len * dpage)
        snprintf(buf, len,
                 "decode %.*s KV items are %lld bytes, this prefill's %llu (same attention TP "
                 "size or MLA): the page size or the KV cache dtype differ",
                 sid, x->session_id, (long long)x->dst_kv_item_len,
                 (unsigned long long)m->args.kv_item_len);
    else if (x->state_ptrs.n > 1)
        snprintf(buf, len,
                 "decode %.*s registered %u state components; kvbridge pairs one (its state "
                 "buffers, one index list)",
                 sid, x->session_id, x->state_ptrs.n);
    else if (m->p.pp_size > 1 && (x->kv_layer_ids.count > 0 || x->state_layer_ids.len > 0))
        snprintf(buf, len,
                 "decode %.*s sent layer ids; kvbridge pairs layers by position and cannot "
                 "pair by layer id with prefill PP size %d",
                 sid, x->session_id, m->p.pp_size);
}

/* The one state component's buffers into in (owned), checked against this
 * prefill's state item lengths (frame 10) where both have them. */
static void reg26_state(struct kvb_manager *m, const kvb__reg26_msg_t *x, kvb__reg_in_t *in,
                        char *buf, size_t len)
{
    const uint8_t *d;
    size_t count;
    int sid = (int)x->session_id_len;
    kvb__lol_list(x->state_ptrs, 0, &d, &count);
    in->state = malloc((count ? count : 1) * sizeof(uint64_t));
    if (in->state == NULL) {
        snprintf(buf, len, "decode %.*s: out of memory for its state buffers", sid, x->session_id);
        return;
    }
    for (size_t k = 0; k < count; k++)
        in->state[k] = kvb__lol_at(x->state_ptrs, 0, k);
    in->n_state = count;
    for (size_t k = 0; x->state_item_lens.n == 1 && k < count && k < m->args.num_state; k++)
        if (kvb__lol_at(x->state_item_lens, 0, k) != m->state_items[k]) {
            snprintf(buf, len,
                     "decode %.*s state tensor %zu has items of %llu bytes, this prefill %llu: "
                     "the state layouts differ",
                     sid, x->session_id, k,
                     (unsigned long long)kvb__lol_at(x->state_item_lens, 0, k),
                     (unsigned long long)m->state_items[k]);
            return;
        }
}

/* Why kvbridge cannot serve a 2026 registration, or NULL (the fields it
 * honours are copied into in). */
static char *reg26_refusal(struct kvb_manager *m, const kvb__reg26_msg_t *x, kvb__reg_in_t *in)
{
    char buf[400];
    reg26_unsupported(m, x, in, buf, sizeof(buf));
    if (buf[0] == '\0' && x->state_ptrs.n == 1)
        reg26_state(m, x, in, buf, sizeof(buf));
    return buf[0] != '\0' ? strdup(buf) : NULL;
}

static kvb_status_t decode_registration(struct kvb_manager *m, const kvb__frame_t *f, size_t n,
                                        kvb__reg_in_t *in)
{
    kvb__reg26_msg_t x;
    kvb__frames_err_t e;
    memset(in, 0, sizeof(*in));
    if (kvb__frames_decode_registration26(f, n, &e, &x) != KVB_OK ||
        !kvb__sglang_kv_pool(x.ext, x.n_ext, x.kv_ptrs.count, x.dst_kv_item_len, in, &e) ||
        !kvb__sglang_kv_layout(x.ext, x.n_ext, in, &e) ||
        !kvb__sglang_kv_digest(x.ext, x.n_ext, in, &e)) {
        kvb__conn_bad_message(m, kvb__frames_kind_name(KVB__MSG_REGISTRATION26), &e);
        return KVB_ERR_PROTO;
    }
    in->ip = x.ip;
    in->ip_len = x.ip_len;
    in->session = x.session_id;
    in->session_len = x.session_id_len;
    in->port = x.port;
    in->kv = x.kv_ptrs;
    in->aux = x.aux_ptrs;
    in->tp_rank = x.dst_tp_rank;
    in->tp_size = x.dst_attn_tp_size;
    in->item_len = x.dst_kv_item_len > 0 ? x.dst_kv_item_len : 1;
    in->dialect = &kvb__dialect_sglang2026;
    in->refuse = reg26_refusal(m, &x, in);
    return KVB_OK;
}

/* ---- prefill side: transfer info, abort ---- */

/* What of a 2026 transfer info kvbridge cannot serve, into why. */
static void xfer26_refusal(struct kvb_manager *m, const kvb__xfer26_msg_t *x, char *why, size_t wl)
{
    uint32_t page = m->args.page_size ? m->args.page_size : 1;
    if (x->prefix_len % page != 0)
        snprintf(why, wl, "decode prefix of %lld tokens is not a multiple of the page size %u",
                 (long long)x->prefix_len, page);
    else if (x->device_pages.count > 0)
        snprintf(why, wl,
                 "transfer info frame 9 (HiSparse device page indices, %zu) is not "
                 "supported by kvbridge",
                 x->device_pages.count);
    else if (x->state_idx.n > 1)
        snprintf(why, wl, "%u state index lists; kvbridge pairs one state component",
                 x->state_idx.n);
}

/* A 2026 transfer info as a destination (its pages: the suffix after the
 * prefix); out->why says why kvbridge cannot serve it. */
static kvb_status_t dst_from_msg26(struct kvb_manager *m, const kvb__xfer26_msg_t *x,
                                   kvb__xfer_in_t *out)
{
    kvb__dst_t *d = &out->d;
    uint32_t page = m->args.page_size ? m->args.page_size : 1;
    kvb__copy_str(d->session, sizeof(d->session), x->session_id, x->session_id_len);
    kvb__copy_str(d->ip, sizeof(d->ip), x->ip, x->ip_len);
    d->port = x->port;
    d->dummy = x->is_dummy;
    d->aux_index = x->aux_index;
    d->dialect = &kvb__dialect_sglang2026;
    d->epoch = x->has_epoch ? x->epoch : 0;
    d->prefix_tokens = x->prefix_len;
    d->n_pages = x->pages.count;
    d->pages = malloc((d->n_pages ? d->n_pages : 1) * sizeof(int32_t));
    if (d->pages == NULL)
        return KVB_ERR_NOMEM;
    for (size_t i = 0; i < d->n_pages; i++)
        d->pages[i] = kvb__i32_at(x->pages, i);
    if (x->has_page_mask) { /* aligned with the suffix pages */
        d->mask = malloc(d->n_pages ? d->n_pages : 1);
        if (d->mask == NULL)
            return KVB_ERR_NOMEM;
        memcpy(d->mask, x->page_mask, d->n_pages);
    }
    xfer26_refusal(m, x, out->why, sizeof(out->why));
    d->skip_pages = (uint64_t)x->prefix_len / page;
    if (x->state_idx.n == 1) {
        const uint8_t *p;
        kvb__lol_list(x->state_idx, 0, &p, &d->n_state);
        d->state_idx = malloc((d->n_state ? d->n_state : 1) * sizeof(int32_t));
        if (d->state_idx == NULL)
            return KVB_ERR_NOMEM;
        for (size_t i = 0; i < d->n_state; i++)
            d->state_idx[i] = (int32_t)kvb__lol_at(x->state_idx, 0, i);
    }
    return KVB_OK;
}

static kvb_status_t take_transfer(struct kvb_manager *m, const kvb__frame_t *f, size_t n,
                                  kvb__xfer_in_t *out)
{
    kvb__xfer26_msg_t x;
    kvb__frames_err_t e;
    memset(out, 0, sizeof(*out));
    if (kvb__frames_decode_transfer26(f, n, &e, &x) != KVB_OK) {
        kvb__conn_bad_message(m, kvb__frames_kind_name(KVB__MSG_TRANSFER26), &e);
        return KVB_ERR_PROTO;
    }
    out->room = x.room;
    out->required = x.required_dst_info_num;
    return dst_from_msg26(m, &x, out);
}

static kvb_status_t decode_abort(struct kvb_manager *m, const kvb__frame_t *f, size_t n,
                                 kvb__abort_in_t *out)
{
    kvb__abort_msg_t a;
    kvb__frames_err_t e;
    if (kvb__frames_decode_abort(f, n, &e, &a) != KVB_OK) {
        kvb__conn_bad_message(m, kvb__frames_kind_name(KVB__MSG_ABORT), &e);
        return KVB_ERR_PROTO;
    }
    out->room = a.room;
    kvb__copy_str(out->ip, sizeof(out->ip), a.ip, a.ip_len);
    out->port = a.port;
    out->has_generation = a.has_generation;
    out->generation = a.generation;
    return KVB_OK;
}

static void unsupported(struct kvb_manager *m, const kvb__frame_t *f, size_t n)
{
    kvb__frames_err_t e = {0};
    snprintf(e.reason, sizeof(e.reason),
             "%.*s (%zu frames): GPU staging is not supported by kvbridge (it never advertises "
             "a staging ring and never stages); ignored",
             (int)(n > 0 && f[0].len < 16 ? f[0].len : 0), n > 0 ? (const char *)f[0].data : "", n);
    kvb__conn_bad_message(m, kvb__frames_kind_name(KVB__MSG_STAGING), &e);
}

static kvb_status_t send_buf(struct kvb_manager *m, const char *ip, uint16_t port,
                             kvb__frames_buf_t *b, kvb_status_t st)
{
    if (st == KVB_OK)
        st = kvb__zsend(&m->zc, ip, port, b);
    kvb__frames_buf_free(b);
    return st;
}

/* Always the 3-frame form with our rank (4 with the ABORT's generation),
 * sent only once no write of the room can land. */
static kvb_status_t send_abort_ack(struct kvb_manager *m, const char *ip, uint16_t port,
                                   uint64_t room, int32_t rank, const uint64_t *gen)
{
    kvb__frames_buf_t b;
    kvb__frames_err_t e;
    kvb__abort_ack_msg_t a = {room, true, rank, gen != NULL, gen != NULL ? *gen : 0};
    kvb__frames_buf_init(&b);
    return send_buf(m, ip, port, &b, kvb__frames_encode_abort_ack(&a, &e, &b));
}

/* ---- decode side ---- */

/* 18 frames: state buffers as one component, no layer ids, no staging ring
 * (kvbridge never stages), DCP 1/0; then, to a kvbridge prefill, the marker
 * and kv_lens=. */
static kvb_status_t send_registration(struct kvb_manager *m, const char *ip, uint16_t port,
                                      bool kvbridge, const void *priv)
{
    (void)priv; /* routed by kvbridge's planner: no record of its own */
    kvb__frames_buf_t b;
    kvb__frames_err_t e;
    kvb__reg26_msg_t r = {0};
    kvb__frame_t ext[3]; /* kv_lens=, kv_layout=, kv_digest= */
    char layout[KVB__SGLANG_LAYOUT_MAX];
    uint8_t *sp = NULL, *sl = NULL, *lens_buf = NULL;
    uint32_t *items = calloc(m->args.num_state + 1, sizeof(*items));
    kvb_status_t st =
        items == NULL ? KVB_ERR_NOMEM : kvb__sglang_kv_lens_ext(m, &lens_buf, &ext[0]);
    kvb__sglang_kv_layout_ext(m, layout, &ext[1]);
    for (uint32_t i = 0; st == KVB_OK && i < m->args.num_state; i++) {
        if (m->state_items[i] > UINT32_MAX)
            st = KVB_ERR_INVALID; /* frame 10 carries u32 item lengths */
        items[i] = (uint32_t)m->state_items[i];
    }
    if (st == KVB_OK && m->args.num_state > 0)
        st = kvb__lol_pack_one(m->state_ptrs, m->args.num_state, 8, &sp, &r.state_ptrs);
    if (st == KVB_OK && m->args.num_state > 0)
        st = kvb__lol_pack_one(items, m->args.num_state, 4, &sl, &r.state_item_lens);
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
    r.dcp_size = 1;
    r.ext = kvbridge ? ext : NULL;
    r.n_ext = kvbridge ? 2u + kvb__sglang_kv_digest_ext(m, &ext[2]) : 0;
    kvb__frames_buf_init(&b);
    if (st == KVB_OK)
        st = kvb__frames_encode_registration26(&r, &e, &b);
    if (st == KVB_OK)
        st = kvb__zsend(&m->zc, ip, port, &b);
    kvb__frames_buf_free(&b);
    free(items);
    free(sp);
    free(sl);
    free(lens_buf);
    return st;
}

/* 10 frames: the suffix pages after the prefix, the prefix in tokens
 * (frame 8), one state index list; then, to a kvbridge prefill, the
 * marker, epoch= and page_mask=. transfer_form refused what has no 2026
 * form. */
static kvb_status_t send_transfer(struct kvb_manager *m, const kvb__src_t *s, uint64_t room,
                                  const int32_t *idx, size_t n, int64_t aux,
                                  const kvb_receiver_init_t *ex)
{
    kvb__frames_buf_t b;
    kvb__frames_err_t e;
    kvb__xfer26_msg_t x = {0};
    uint8_t *lol = NULL;
    const char *sid = kvb_engine_session_id(m->engine);
    uint64_t prefix = ex != NULL && (ex->field_mask & KVB_RECV_INIT_PREFIX) ? ex->prefix_tokens : 0;
    uint64_t skip = prefix / (m->args.page_size ? m->args.page_size : 1);
    kvb_status_t st = KVB_OK;
    x.room = room;
    x.ip = m->host;
    x.ip_len = strlen(m->host);
    x.port = m->port;
    x.session_id = sid;
    x.session_id_len = strlen(sid);
    x.is_dummy = s->dummy;
    x.aux_index = s->dummy ? -1 : (int32_t)aux;
    x.pages =
        s->dummy || skip >= n ? kvb__i32_view_of(NULL, 0) : kvb__i32_view_of(idx + skip, n - skip);
    x.required_dst_info_num = (int32_t)s->required_dst_info_num;
    x.has_prefix_len = true;
    x.prefix_len = (int64_t)prefix;
    x.has_epoch = !s->dummy && s->epoch != 0 && s->kvbridge;
    x.epoch = s->epoch;
    if (!s->dummy && s->kvbridge && ex != NULL && (ex->field_mask & KVB_RECV_INIT_MASK) &&
        ex->page_mask != NULL && x.pages.count > 0) {
        x.has_page_mask = true; /* the suffix's bytes, aligned with frame 4 */
        x.page_mask = ex->page_mask + skip;
    }
    if (!s->dummy && ex != NULL && (ex->field_mask & KVB_RECV_INIT_STATE) &&
        ex->num_state_indices > 0 && ex->state_indices != NULL)
        st = kvb__lol_pack_one(ex->state_indices, ex->num_state_indices, 4, &lol, &x.state_idx);
    kvb__frames_buf_init(&b);
    if (st == KVB_OK)
        st = kvb__frames_encode_transfer26(&x, &e, &b);
    if (st != KVB_OK)
        KVB_LOGW("manager %s: transfer info for room %llu not encodable: %s", m->endpoint,
                 (unsigned long long)room, e.reason);
    else
        st = kvb__zsend(&m->zc, s->ip, s->port, &b);
    kvb__frames_buf_free(&b);
    free(lol);
    return st;
}

/* ABORT carrying gen (SGLang 0.5.23's frame 4: its deferred mode ACKs only
 * an ABORT with one, echoing it; the spec's commit reads frames 0-3). */
static kvb_status_t send_abort(struct kvb_manager *m, const kvb__src_t *s, uint64_t room,
                               uint64_t gen)
{
    kvb__frames_buf_t b;
    kvb__frames_err_t e;
    kvb__abort_msg_t a = {room, m->host, strlen(m->host), m->port, true, gen};
    kvb__frames_buf_init(&b);
    return send_buf(m, s->ip, s->port, &b, kvb__frames_encode_abort(&a, &e, &b));
}

/* The prefix travels in tokens (whole pages only); holes in a page mask
 * need kvbridge's extension. */
static void transfer_form(const struct kvb_manager *m, const kvb__src_t *s, size_t count,
                          const kvb_receiver_init_t *ex, char *why, size_t len)
{
    kvb__dialect_prefix_form(m, count, ex, why, len);
    if (why[0] == '\0')
        kvb__sglang_needs_ext(s, count, ex, true, why, len);
}

static kvb_status_t decode_abort_ack(struct kvb_manager *m, const kvb__frame_t *f, size_t n,
                                     kvb__ack_in_t *out)
{
    kvb__frames_err_t e;
    kvb__abort_ack_msg_t a;
    if (kvb__frames_decode_abort_ack(f, n, &e, &a) != KVB_OK) {
        kvb__conn_bad_message(m, kvb__frames_kind_name(KVB__MSG_ABORT_ACK), &e);
        return KVB_ERR_PROTO;
    }
    *out = (kvb__ack_in_t){a.room, a.has_rank, a.rank, a.has_generation, a.generation};
    return KVB_OK;
}

const kvb__dialect_t kvb__dialect_sglang2026 = {
    .t = {.name = "SGLang 2026",
          .family = "SGLang",
          .plans_chunks = false,
          .extensions = true,
          .suffix_pages = true,
          .own_status = false},
    .boot_dialect = KVB_BOOTSTRAP_DIALECT_2026,
    .classify = classify,
    .decode_registration = decode_registration,
    .take_transfer = take_transfer,
    .decode_abort = decode_abort,
    .unsupported = unsupported,
    .send_status = kvb__sglang_send_status,
    .send_status_digest = kvb__sglang_send_status_digest,
    .send_abort_ack = send_abort_ack,
    .send_registration = send_registration,
    .send_transfer = send_transfer,
    .send_abort = send_abort,
    .transfer_form = transfer_form,
    .decode_status = kvb__sglang_decode_status,
    .decode_abort_ack = decode_abort_ack,
    .decode_aux = kvb__sglang_decode_aux,
    .send_aux = kvb__sglang_send_aux,
    .check_manager = kvb__sgl26_check_manager,
    .check_own_digest = kvb__sgl26_check_own_digest,
};
