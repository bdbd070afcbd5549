/* Prefill side, TokenSpeed's dialect (seed 004, PROTOCOL-TOKENSPEED.md):
 * its 8-frame KV-args and 12/14-frame transfer infos arrive on the same PULL
 * socket as both SGLang dialects and are told apart per session (spec
 * 11.4); its rooms carry a decode-computed plan that is validated against
 * this prefill's layout and the decode's registered regions before any
 * write (spec 7.7) and executed per token (7.6); statuses to its decodes are
 * 5 frames with TokenSpeed's values and the first token (4.4): WaitingForInput
 * (3) once a transfer info is accepted, then Success (5) or Failed (0).
 * Nothing else is ever sent to a TokenSpeed decode: its control thread dies
 * on anything else. Field by field: docs/tokenspeed-fields.md. */
#include "dialect/tokenspeed_seed/tokenspeed_seed.h"
#include "engine/peer_region.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TS_MAX_BLOCKS (1u << 22) /* blocks one chunk may plan for one decode */

static void copy_n(char *dst, size_t cap, const char *s, size_t n)
{
    n = n < cap ? n : cap - 1;
    memcpy(dst, s, n);
    dst[n] = '\0';
}

void kvb__ts_plan_destroy(void *plan)
{
    kvb__ts_plan_free(plan);
    free(plan);
}

static void remember_endpoint(struct kvb_manager *m, const char *ip, size_t ip_len, uint16_t port)
{
    kvb__outputs_enable(m); /* its statuses carry first tokens */
    kvb__endpoint_note(m, ip, ip_len, port, &kvb__dialect_tokenspeed_seed);
}

/* ---- statuses: 5 frames, TokenSpeed's values, the first token ---- */

static kvb_status_t send_raw(struct kvb_manager *m, const char *ip, uint16_t port, uint64_t room,
                             int value, int64_t token, const int32_t *cands, size_t n)
{
    kvb__frames_buf_t b;
    kvb__frames_err_t e;
    kvb__statusts_msg_t s = {room, value, m->p.attn_tp_rank, token,
                             kvb__i32_view_of(cands, cands ? n : 0)};
    kvb__frames_buf_init(&b);
    kvb_status_t st = kvb__frames_encode_status_ts(&s, &e, &b);
    if (st == KVB_OK)
        st = kvb__zsend(&m->zc, ip, port, &b);
    kvb__frames_buf_free(&b);
    return st;
}

/* A prefill only ever reports the end: Failed, or Success with the room's
 * first token and candidates (rank: TokenSpeed's sender is the TP rank
 * inside the DP group, send_raw's). */
kvb_status_t kvb__ts_send_status(struct kvb_manager *m, const char *ip, uint16_t port,
                                 uint64_t room, int status, int32_t rank)
{
    (void)rank;
    int32_t *cands = NULL;
    size_t n = 0;
    if (status != KVB_POLL_SUCCESS)
        return send_raw(m, ip, port, room, KVB__TS_FAILED, -1, NULL, 0);
    int64_t token = kvb__output_first_token(m, room, &cands, &n);
    kvb_status_t st = send_raw(m, ip, port, room, KVB__TS_SUCCESS, token, cands, n);
    free(cands);
    return st;
}

/* ---- KV-args ---- */

/* Kept for the life of the process (or until evicted): TokenSpeed sends
 * them once per prefill rank, not per room (spec 3.3). No item length or TP
 * rank: each room brings its plan. */
kvb_status_t kvb__ts_decode_registration(struct kvb_manager *m, const kvb__frame_t *f, size_t n,
                                         kvb__reg_in_t *in)
{
    kvb__regts_msg_t x;
    kvb__frames_err_t e;
    memset(in, 0, sizeof(*in));
    if (kvb__frames_decode_registration_ts(f, n, &e, &x) != KVB_OK) {
        kvb__conn_bad_message(m, "registration", &e);
        return KVB_ERR_PROTO;
    }
    remember_endpoint(m, x.ip, x.ip_len, x.port);
    in->state = kvb__copy_u64_view(x.state_ptrs);
    if (in->state == NULL)
        return KVB_ERR_NOMEM;
    in->n_state = x.state_ptrs.count;
    in->ip = x.ip;
    in->ip_len = x.ip_len;
    in->session = x.session_id;
    in->session_len = x.session_id_len;
    in->port = x.port;
    in->kv = x.kv_ptrs;
    in->tp_size = 1;
    in->item_len = 1;
    in->dialect = &kvb__dialect_tokenspeed_seed;
    return KVB_OK;
}

/* ---- transfer info: checks against this prefill (spec 7.7 rules 1-16) ---- */

/* Rules 9-12 and 16 for one fragment; P = page size. */
static bool frag_ok(struct kvb_manager *m, const kvb__ts_frag_t *f, size_t i, char *why, size_t wl)
{
    uint64_t P = m->args.page_size ? m->args.page_size : 1, item = m->args.kv_item_len;
    uint64_t nkv = m->args.num_kv;
    if (f->kind == KVB__TS_MAMBA_STATE) {
        snprintf(why, wl, "plan fragment %zu: mamba_state fragments are not supported by kvbridge",
                 i);
        return false;
    }
    if (f->buffer_index >= nkv)
        snprintf(why, wl, "plan fragment %zu: buffer %llu, this prefill has %llu KV buffers", i,
                 (unsigned long long)f->buffer_index, (unsigned long long)nkv);
    else if (f->kind != (kvb__ts_kind_t)kvb__ts_buffer_kind(m, f->buffer_index))
        snprintf(why, wl,
                 "plan fragment %zu: buffer %llu is a %s buffer here (%u target + %u draft "
                 "layers), the plan says %s",
                 i, (unsigned long long)f->buffer_index,
                 kvb__ts_kind_name((kvb__ts_kind_t)kvb__ts_buffer_kind(m, f->buffer_index)),
                 kvb__target_layers(m), m->p.draft_layers, kvb__ts_kind_name(f->kind));
    else if (f->src_rank != m->p.attn_tp_rank)
        snprintf(why, wl, "plan fragment %zu: src_rank %lld, this prefill is TP rank %d", i,
                 (long long)f->src_rank, m->p.attn_tp_rank);
    else if (f->src_stride != item)
        snprintf(why, wl,
                 "plan fragment %zu: src_page_stride_bytes %llu, this prefill's items are %llu", i,
                 (unsigned long long)f->src_stride, (unsigned long long)item);
    else if (f->src_off > item || f->bytes > item - f->src_off)
        snprintf(why, wl, "plan fragment %zu: source bytes [%llu, +%llu) outside a %llu-byte item",
                 i, (unsigned long long)f->src_off, (unsigned long long)f->bytes,
                 (unsigned long long)item);
    else if (f->dst_off > f->dst_stride || f->bytes > f->dst_stride - f->dst_off)
        snprintf(why, wl,
                 "plan fragment %zu: destination bytes [%llu, +%llu) outside its %llu-byte page "
                 "stride",
                 i, (unsigned long long)f->dst_off, (unsigned long long)f->bytes,
                 (unsigned long long)f->dst_stride);
    else if (f->page_count != 0)
        snprintf(why, wl, "plan fragment %zu: page_count %llu (kvbridge executes only null)", i,
                 (unsigned long long)f->page_count);
    else if (P > 1 && (f->src_stride % P || f->dst_stride % P || f->src_off % P || f->dst_off % P ||
                       f->bytes % P))
        snprintf(why, wl,
                 "plan fragment %zu: a partial item not divisible into %llu token rows (spec "
                 "7.6)",
                 i, (unsigned long long)P);
    else
        return true;
    return false;
}

/* Rule 16's second half: per buffer, one destination stride (the decode's
 * item length) and no two fragments writing the same bytes of a page. */
static bool frags_consistent(const kvb__ts_plan_t *p, char *why, size_t wl)
{
    for (size_t i = 0; i < p->n; i++)
        for (size_t k = i + 1; k < p->n; k++) {
            const kvb__ts_frag_t *a = &p->frags[i], *b = &p->frags[k];
            if (a->buffer_index == b->buffer_index && a->dst_stride != b->dst_stride) {
                snprintf(why, wl,
                         "plan fragments %zu and %zu give buffer %llu two destination strides "
                         "(%llu, %llu)",
                         i, k, (unsigned long long)a->buffer_index,
                         (unsigned long long)a->dst_stride, (unsigned long long)b->dst_stride);
                return false;
            }
            if (a->buffer_index == b->buffer_index && a->dst_off < b->dst_off + b->bytes &&
                b->dst_off < a->dst_off + a->bytes) {
                snprintf(why, wl,
                         "plan fragments %zu and %zu write overlapping bytes of buffer %llu", i, k,
                         (unsigned long long)a->buffer_index);
                return false;
            }
        }
    return true;
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : x > y;
}

/* Rule 15: page indices fit the int32 pools kvbridge addresses, no repeats. */
static bool pages_ok(const kvb__i64_view_t v, const char *what, char *why, size_t wl)
{
    int64_t *s = malloc((v.count ? v.count : 1) * sizeof(*s));
    bool ok = s != NULL;
    for (size_t i = 0; ok && i < v.count; i++) {
        s[i] = kvb__i64_at(v, i);
        if (s[i] > INT32_MAX) {
            snprintf(why, wl, "%s entry %zu is %lld, beyond any pool", what, i, (long long)s[i]);
            ok = false;
        }
    }
    if (ok && v.count > 1) {
        qsort(s, v.count, sizeof(*s), cmp_i64);
        for (size_t i = 1; ok && i < v.count; i++)
            if (s[i] == s[i - 1]) {
                snprintf(why, wl, "%s repeats %lld", what, (long long)s[i]);
                ok = false;
            }
    }
    if (s == NULL)
        snprintf(why, wl, "out of memory checking %s", what);
    free(s);
    return ok;
}

/* Why kvbridge cannot serve this transfer info (empty: it can), spec 7.7. */
static void xfer_refusal(struct kvb_manager *m, const kvb__xferts_msg_t *x, const kvb__reg_t *g,
                         char *why, size_t wl)
{
    uint64_t P = m->args.page_size ? m->args.page_size : 1;
    int sid = (int)x->session_id_len;
    why[0] = '\0';
    if (g == NULL)
        snprintf(why, wl,
                 "decode %.*s sent a transfer info but never its KV args (TokenSpeed sends them "
                 "once per prefill rank)",
                 sid, x->session_id);
    else if (m->p.pp_size > 1)
        snprintf(why, wl,
                 "TokenSpeed has no pipeline parallelism; this prefill is PP stage %d of %d",
                 m->p.pp_rank, m->p.pp_size);
    else if (x->is_dummy)
        return;
    else if (x->l1_5 != 0 || x->mask_len != 0 || x->local_len != 0)
        snprintf(why, wl, "the MLA L1.5 cache (frames 8-10) is not supported by kvbridge");
    else if (g->n_kv != m->args.num_kv)
        snprintf(why, wl,
                 "decode %.*s registered %zu KV buffers, this prefill has %u (%u target + %u "
                 "draft layers, draft_layers)",
                 sid, x->session_id, g->n_kv, m->args.num_kv, kvb__target_layers(m),
                 m->p.draft_layers);
    else if (x->prefix_len % (int64_t)P != 0)
        snprintf(why, wl, "decode prefix of %lld tokens is not a multiple of the page size %llu",
                 (long long)x->prefix_len, (unsigned long long)P);
    else if (x->state_idx.count > 0 && g->n_state != m->args.num_state)
        snprintf(why, wl, "decode %.*s registered %zu state buffers, this prefill has %u", sid,
                 x->session_id, g->n_state, m->args.num_state);
    else if (pages_ok(x->pages, "frame 4 (dst_kv_indices)", why, wl))
        pages_ok(x->state_idx, "frame 11 (state slots)", why, wl);
}

static bool plan_from(struct kvb_manager *m, const kvb__xferts_msg_t *x, kvb__ts_plan_t **plan_p,
                      char *why, size_t wl)
{
    uint64_t P = m->args.page_size ? m->args.page_size : 1;
    *plan_p = NULL;
    if (!x->has_plan || x->is_dummy)
        return true;
    kvb__ts_plan_t *p = calloc(1, sizeof(*p));
    if (p == NULL || kvb__ts_plan_parse(x->plan_json, x->plan_len, (size_t)(m->args.num_kv * P * 4),
                                        p, why, wl) != KVB_OK) {
        if (p == NULL || why[0] == '\0') /* a refusal always has a reason: never no plan */
            snprintf(why, wl, "out of memory for the plan");
        free(p);
        return false;
    }
    for (size_t i = 0; i < p->n; i++)
        if (!frag_ok(m, &p->frags[i], i, why, wl)) {
            kvb__ts_plan_destroy(p);
            return false;
        }
    if (!frags_consistent(p, why, wl)) {
        kvb__ts_plan_destroy(p);
        return false;
    }
    *plan_p = p;
    return true;
}

static kvb_status_t dst_of(const kvb__xferts_msg_t *x, kvb__dst_t *d, uint64_t page)
{
    memset(d, 0, sizeof(*d));
    copy_n(d->session, sizeof(d->session), x->session_id, x->session_id_len);
    copy_n(d->ip, sizeof(d->ip), x->ip, x->ip_len);
    d->port = x->port;
    d->dummy = x->is_dummy;
    d->aux_index = -1;
    d->dialect = &kvb__dialect_tokenspeed_seed;
    d->prefix_tokens = x->prefix_len;
    d->skip_pages = (uint64_t)x->prefix_len / page;
    d->n_pages = x->pages.count;
    d->pages = malloc((d->n_pages ? d->n_pages : 1) * sizeof(int32_t));
    d->n_state = x->state_idx.count;
    d->state_idx = malloc((d->n_state ? d->n_state : 1) * sizeof(int32_t));
    if (d->pages == NULL || d->state_idx == NULL)
        return KVB_ERR_NOMEM;
    /* int64 on the wire; xfer_refusal bounded them to int32 first */
    for (size_t i = 0; i < d->n_pages; i++)
        d->pages[i] = (int32_t)kvb__i64_at(x->pages, i);
    for (size_t i = 0; i < d->n_state; i++)
        d->state_idx[i] = (int32_t)kvb__i64_at(x->state_idx, i);
    return KVB_OK;
}

/* A malformed transfer info that names its room and decode still gives a
 * destination: the room fails with the reason and the decode hears Failed. */
static kvb_status_t take_malformed(struct kvb_manager *m, const kvb__frame_t *f, size_t n,
                                   const kvb__frames_err_t *e, kvb__xfer_in_t *out)
{
    kvb__xferts_msg_t x;
    uint16_t port;
    uint64_t page = m->args.page_size ? m->args.page_size : 1;
    kvb__conn_bad_message(m, "transfer info", e);
    if (!e->has_room || kvb__frames_decode_peer(f, n, "", true, NULL, &x.room, &port) != KVB_OK)
        return KVB_ERR_PROTO; /* no room or nowhere to tell */
    memset(&x, 0, sizeof(x));
    x.room = e->room;
    x.ip = (const char *)f[1].data;
    x.ip_len = f[1].len;
    x.port = port;
    x.session_id = (const char *)f[3].data;
    x.session_id_len = f[3].len;
    x.required_dst_info_num = 1;
    remember_endpoint(m, x.ip, x.ip_len, port);
    out->room = x.room;
    out->required = 1;
    snprintf(out->why, sizeof(out->why), "%s", e->reason);
    if (dst_of(&x, &out->d, page) != KVB_OK) {
        kvb__dst_free(&out->d);
        memset(&out->d, 0, sizeof(out->d));
    }
    return KVB_ERR_PROTO;
}

kvb_status_t kvb__ts_take_transfer(struct kvb_manager *m, const kvb__frame_t *f, size_t n,
                                   kvb__xfer_in_t *out)
{
    kvb__xferts_msg_t x;
    kvb__frames_err_t e;
    char *why = out->why;
    const size_t wl = sizeof(out->why);
    uint64_t page = m->args.page_size ? m->args.page_size : 1;
    memset(out, 0, sizeof(*out));
    if (kvb__frames_decode_transfer_ts(f, n, &e, &x) != KVB_OK)
        return take_malformed(m, f, n, &e, out);
    remember_endpoint(m, x.ip, x.ip_len, x.port);
    char sid[KVB_SID_MAX];
    copy_n(sid, sizeof(sid), x.session_id, x.session_id_len);
    kvb__reg_t *g = kvb__reg_get(m, sid);
    xfer_refusal(m, &x, g, why, wl);
    kvb__reg_put(g);
    kvb__ts_plan_t *plan = NULL;
    if (why[0] == '\0' && !plan_from(m, &x, &plan, why, wl))
        plan = NULL;
    if (why[0] != '\0') { /* a refused room writes nothing: no pages, no plan */
        x.pages.count = 0;
        x.state_idx.count = 0;
    }
    out->room = x.room;
    out->required = x.required_dst_info_num;
    if (dst_of(&x, &out->d, page) != KVB_OK) {
        kvb__ts_plan_destroy(plan);
        return KVB_ERR_NOMEM;
    }
    out->d.plan = plan;
    /* WaitingForInput (3) arms the decode's own time-out (spec 6.3): without
     * it a TokenSpeed decode whose prefill rank dies while the bootstrap
     * server lives waits forever. Sent before the room can end, on the same
     * socket, so it always precedes the terminal status. */
    if (why[0] == '\0' && !x.is_dummy && kvb__env_int("KVBRIDGE_TS_WAITING_STATUS", NULL, 1, 0, 1))
        send_raw(m, out->d.ip, out->d.port, x.room, KVB__TS_WAITING_FOR_INPUT, -1, NULL, 0);
    return KVB_OK;
}

/* ---- dispatch ---- */

static bool frame_eq(const kvb__frame_t *f, const char *lit)
{
    return f->len == strlen(lit) && memcmp(f->data, lit, f->len) == 0;
}

/* Told apart from both SGLang dialects on one port (spec 11.4): 8-frame
 * KV args with frame 5 empty, 12/14-frame transfer infos whose frame 7 is a
 * decimal, no kvbridge marker; a session that registered in another
 * dialect keeps it. Statuses: exactly 5 frames, frame 0 a room, no marker. */
kvb__dmsg_t kvb__ts_classify(struct kvb_manager *m, const kvb__frame_t *f, size_t n)
{
    bool room = n > 0 && f[0].len > 0 && f[0].data[0] >= '0' && f[0].data[0] <= '9';
    if (n == 0)
        return KVB__DMSG_NONE;
    for (size_t i = 0; i < n; i++)
        if (frame_eq(&f[i], KVB__EXT_MARKER))
            return KVB__DMSG_NONE; /* kvbridge's own message (its extensions follow a marker:
                                      a 3-frame status with kv_digest= has 5 frames too) */
    if (n == KVB__STATUSTS_FRAMES && room)
        return KVB__DMSG_STATUS;
    if (frame_eq(&f[0], "None")) {
        /* 8 frames with frame 5 empty; CachePD's 8 carry JSON there (unsupported) */
        if (n != KVB__REGTS_FRAMES || f[5].len != 0)
            return KVB__DMSG_NONE;
        return KVB__DMSG_REGISTRATION;
    }
    if (!room || (n != KVB__XFERTS_FRAMES && n != KVB__XFERTS_PLAN))
        return KVB__DMSG_NONE;
    /* Frame 7 is a decimal (or empty in a dummy) here, a kvbridge key=value
     * extension in an older kvbridge's seed-001 message. */
    if (f[7].len > 0 && f[7].data[0] >= 'a' && f[7].data[0] <= 'z')
        return KVB__DMSG_NONE;
    /* Decided per session: a session that registered in another dialect
     * keeps it (spec 11.4); an unknown one goes by the count. */
    char sid[KVB_SID_MAX];
    copy_n(sid, sizeof(sid), (const char *)f[3].data, f[3].len);
    kvb__reg_t *g = kvb__reg_get(m, sid);
    bool other = g != NULL && g->dialect != &kvb__dialect_tokenspeed_seed;
    kvb__reg_put(g);
    if (other)
        return KVB__DMSG_NONE;
    return KVB__DMSG_TRANSFER;
}

/* ---- the data path: a chunk's blocks for one TokenSpeed decode ---- */

typedef struct ts_job {
    struct kvb_manager *m;
    const kvb__reg_t *g;
    const kvb__dst_t *d;
    kvb_plan_strided_t *out;
    uint64_t P, item;
    uint64_t *dst_end; /* per KV buffer: end of the decode region holding its base */
} ts_job_t;

/* Append rows of len bytes at these strides (one row: a plain block). */
static bool push_rows(ts_job_t *j, uint64_t src, uint64_t dst, uint64_t len, uint64_t sstride,
                      uint64_t dstride, uint64_t rows)
{
    kvb_plan_strided_t *o = j->out;
    if (o->count == o->capacity) {
        size_t cap = o->capacity ? o->capacity * 2 : 256;
        kvb_strided_block_t *v = cap <= TS_MAX_BLOCKS ? realloc(o->blocks, cap * sizeof(*v)) : NULL;
        if (v == NULL)
            return false;
        o->blocks = v;
        o->capacity = cap;
    }
    o->blocks[o->count++] = (kvb_strided_block_t){src, dst, len, sstride, dstride, rows};
    o->bytes += len * rows;
    return true;
}

static bool push(ts_job_t *j, uint64_t src, uint64_t dst, uint64_t len)
{
    return push_rows(j, src, dst, len, len, len, 1);
}

/* Fragment f of buffer b for one page pair, per token when it is a partial
 * item at page size > 1 (spec 7.6: TokenSpeed's literal reading cuts a
 * token-major page into whole tokens instead of heads). */
static bool frag_blocks(ts_job_t *j, const kvb__ts_frag_t *f, uint64_t sp, uint64_t dp)
{
    uint64_t b = f->buffer_index;
    uint64_t s0 = j->m->kv_ptrs[b] + sp * f->src_stride, d0 = j->g->kv_ptrs[b] + dp * f->dst_stride;
    bool whole = f->src_off == 0 && f->dst_off == 0 && f->bytes == f->src_stride &&
                 f->bytes == f->dst_stride;
    if (whole || j->P == 1)
        return push(j, s0 + f->src_off, d0 + f->dst_off, f->bytes);
    /* one strided block: the slice of each of the page's P tokens */
    return push_rows(j, s0 + f->src_off / j->P, d0 + f->dst_off / j->P, f->bytes / j->P,
                     f->src_stride / j->P, f->dst_stride / j->P, j->P);
}

static bool page_blocks(ts_job_t *j, uint64_t sp, uint64_t dp)
{
    const kvb__ts_plan_t *p = j->d->plan;
    for (uint32_t b = 0; p == NULL && b < j->m->args.num_kv; b++)
        if (!push(j, j->m->kv_ptrs[b] + sp * j->item, j->g->kv_ptrs[b] + dp * j->item, j->item))
            return false;
    for (size_t i = 0; p != NULL && i < p->n; i++)
        if (!frag_blocks(j, &p->frags[i], sp, dp))
            return false;
    return true;
}

/* Rule 17/18: the whole destination item of the highest page of buffer b
 * (every write of a page stays inside its item, in either reading of a
 * fragment: frag_ok) lies inside the region the decode registered around
 * that buffer's base, so no write of buffer b lands in buffer b+1. Checked
 * over every page of the transfer info at each chunk, so a bad one fails
 * before any write. */
static bool regions_ok(ts_job_t *j, char *why, size_t wl)
{
    int32_t max_page = -1;
    for (size_t i = 0; i < j->d->n_pages; i++)
        max_page = j->d->pages[i] > max_page ? j->d->pages[i] : max_page;
    if (max_page < 0)
        return true;
    for (uint32_t b = 0; b < j->m->args.num_kv; b++) {
        uint64_t stride = j->item, base = 0, len = 0;
        const kvb__ts_plan_t *p = j->d->plan;
        bool written = p == NULL;
        for (size_t i = 0; p != NULL && i < p->n; i++)
            if (p->frags[i].buffer_index == b) {
                stride = p->frags[i].dst_stride; /* one per buffer: frags_consistent */
                written = true;
            }
        if (!written)
            continue;
        kvb_status_t st = kvb__engine_peer_region(j->m->engine, j->d->session, j->g->kv_ptrs[b],
                                                  j->m->transfer_timeout_s, &base, &len);
        if (st != KVB_OK) {
            snprintf(why, wl,
                     "decode %s: KV buffer %u at 0x%llx is not in a region it registered "
                     "(%s); nothing written",
                     j->d->session, b, (unsigned long long)j->g->kv_ptrs[b], kvb_status_string(st));
            return false;
        }
        uint64_t end = 0;
        bool wraps = !kvb__mul_u64((uint64_t)max_page + 1, stride, &end) ||
                     !kvb__add_u64(end, j->g->kv_ptrs[b], &end);
        if (wraps || end > base + len) {
            snprintf(why, wl,
                     "decode %s: page %d of KV buffer %u would end %llu bytes past the region "
                     "it registered ([0x%llx, +%llu)); nothing written",
                     j->d->session, (int)max_page, b,
                     wraps ? (unsigned long long)UINT64_MAX
                           : (unsigned long long)(end - (base + len)),
                     (unsigned long long)base, (unsigned long long)len);
            return false;
        }
    }
    return true;
}

/* The registration planned with (the session's current one) has the
 * pointers this plan indexes: xfer_refusal checked the one current when the
 * transfer info came, and the decode (or any peer claiming its session) may
 * have re-sent its KV args since. */
static bool reg_fits(struct kvb_manager *m, const kvb__reg_t *g, const kvb__dst_t *d, char *why,
                     size_t wl)
{
    if (g->dialect != &kvb__dialect_tokenspeed_seed)
        snprintf(why, wl,
                 "decode %s re-sent its KV args in another dialect after its TokenSpeed transfer "
                 "info; nothing written",
                 d->session);
    else if (g->n_kv != m->args.num_kv)
        snprintf(why, wl,
                 "decode %s re-sent its KV args with %zu KV buffers after its transfer info, this "
                 "prefill has %u; nothing written",
                 d->session, g->n_kv, m->args.num_kv);
    else if (d->n_state > 0 && g->n_state != m->args.num_state)
        snprintf(why, wl,
                 "decode %s re-sent its KV args with %zu state buffers after its transfer info, "
                 "this prefill has %u; nothing written",
                 d->session, g->n_state, m->args.num_state);
    else
        return true;
    return false;
}

void kvb__ts_job_plan(struct kvb_manager *m, kvb__reg_t *g, const kvb__dst_t *d,
                      const kvb__chunk_t *c, kvb_plan_strided_t *out, kvb_status_t *st_p, char *why,
                      size_t wl)
{
    ts_job_t j = {m,   g, d, out, m->args.page_size ? m->args.page_size : 1, m->args.kv_item_len,
                  NULL};
    uint64_t shift = 0, pool = m->args.num_kv ? m->kv_lens[0] / j.item : 0;
    *st_p = KVB_ERR_INVALID;
    /* The sender may hold the whole request (skip the decode's prefix) or
     * only the missing pages, as TokenSpeed's prefill does (spec 8.1). */
    if (c->total == d->n_pages + d->skip_pages && d->skip_pages > 0)
        shift = d->skip_pages;
    else if (c->total != d->n_pages) {
        snprintf(why, wl,
                 "the sender has %llu pages; decode %s holds a %llu-page prefix and asked for "
                 "%zu",
                 (unsigned long long)c->total, d->session, (unsigned long long)d->skip_pages,
                 d->n_pages);
        return;
    }
    if (!reg_fits(m, g, d, why, wl) || !regions_ok(&j, why, wl))
        return;
    for (size_t i = 0; i < c->n; i++) {
        uint64_t gi = c->first + i;
        if (gi < shift)
            continue;
        if (c->indices[i] < 0 || (uint64_t)c->indices[i] >= pool) {
            snprintf(why, wl, "prefill page %d is outside this prefill's pool of %llu pages",
                     (int)c->indices[i], (unsigned long long)pool);
            return;
        }
        if (!page_blocks(&j, (uint64_t)c->indices[i], (uint64_t)d->pages[gi - shift])) {
            snprintf(why, wl, "room %llu: more than %u blocks or out of memory",
                     (unsigned long long)c->room, TS_MAX_BLOCKS);
            return;
        }
    }
    /* State slots: whole slots with this prefill's item length (8.4). */
    for (size_t i = 0; c->is_last && c->n_state > 0 && i < m->args.num_state; i++) {
        if (c->n_state != d->n_state) {
            snprintf(why, wl, "the prefill has %zu state slots, decode %s asked for %zu",
                     c->n_state, d->session, d->n_state);
            return;
        }
        for (size_t k = 0; k < c->n_state; k++)
            if (!push(&j, m->state_ptrs[i] + m->state_items[i] * (uint64_t)c->state_idx[k],
                      g->state_ptrs[i] + m->state_items[i] * (uint64_t)d->state_idx[k],
                      m->state_items[i]))
                return;
    }
    *st_p = KVB_OK;
}

const kvb__dialect_t kvb__dialect_tokenspeed_seed = {
    .t = {.name = "TokenSpeed seed 004",
          .family = "TokenSpeed",
          .plans_chunks = true,
          .extensions = false,
          .suffix_pages = true,
          .own_status = true},
    .boot_dialect = KVB_BOOTSTRAP_DIALECT_TOKENSPEED,
    .classify = kvb__ts_classify,
    .decode_registration = kvb__ts_decode_registration,
    .take_transfer = kvb__ts_take_transfer,
    .send_status = kvb__ts_send_status,
    .plan_job = kvb__ts_job_plan,
    .plan_free = kvb__ts_plan_destroy,
    .send_registration = kvb__ts_send_registration,
    .send_transfer = kvb__ts_send_transfer,
    .send_abort = kvb__dialect_no_abort, /* nothing but KV args and transfer infos: its control
                                             thread dies on anything else */
    .transfer_form = kvb__ts_transfer_form,
    .decode_status = kvb__ts_decode_status,
};
