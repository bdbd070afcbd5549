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
#include "conn/conn_int.h"
#include "engine/peer_region.h"
#include "proto/frames_ts.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

kvb__reg_t *kvb__reg_get(struct kvb_manager *m, const char *session);
void kvb__reg_put(kvb__reg_t *g);

#define TS_ENDPOINTS 1024 /* TokenSpeed decode endpoints remembered (FIFO) */
#define TS_OUTPUTS 4096   /* rooms' first tokens (direct-mapped by room) */
#define TS_MAX_CANDS 4096
#define TS_MAX_BLOCKS (1u << 22) /* blocks one chunk may plan for one decode */

typedef struct ts_output {
    uint64_t room;
    int used, has_token;
    int64_t token, aux_index;
    int32_t *cands;
    size_t n_cands;
} ts_output_t;

struct kvb__ts {
    pthread_mutex_t mu;
    struct {
        char ip[KVB_IP_MAX];
        uint16_t port;
    } ep[TS_ENDPOINTS];
    size_t n_ep, next_ep;
    ts_output_t out[TS_OUTPUTS];
};

/* The manager's TokenSpeed state, made on first use (any thread). */
static struct kvb__ts *ts_get(struct kvb_manager *m, bool create)
{
    struct kvb__ts *t = __atomic_load_n(&m->ts, __ATOMIC_ACQUIRE);
    if (t != NULL || !create)
        return t;
    t = calloc(1, sizeof(*t));
    if (t == NULL)
        return NULL;
    pthread_mutex_init(&t->mu, NULL);
    struct kvb__ts *expected = NULL;
    if (!__atomic_compare_exchange_n(&m->ts, &expected, t, false, __ATOMIC_ACQ_REL,
                                     __ATOMIC_ACQUIRE)) {
        pthread_mutex_destroy(&t->mu);
        free(t);
        return expected;
    }
    return t;
}

void kvb__ts_free(struct kvb_manager *m)
{
    struct kvb__ts *t = m->ts;
    if (t == NULL)
        return;
    for (size_t i = 0; i < TS_OUTPUTS; i++)
        free(t->out[i].cands);
    pthread_mutex_destroy(&t->mu);
    free(t);
    m->ts = NULL;
}

void kvb__ts_plan_destroy(struct kvb__ts_plan *plan)
{
    kvb__ts_plan_free(plan);
    free(plan);
}

static void copy_n(char *dst, size_t cap, const char *s, size_t n)
{
    n = n < cap ? n : cap - 1;
    memcpy(dst, s, n);
    dst[n] = '\0';
}

/* ---- TokenSpeed endpoints: where only 5-frame statuses may go ---- */

static void remember_endpoint(struct kvb_manager *m, const char *ip, size_t ip_len, uint16_t port)
{
    struct kvb__ts *t = ts_get(m, true);
    char host[KVB_IP_MAX];
    if (t == NULL)
        return;
    copy_n(host, sizeof(host), ip, ip_len);
    pthread_mutex_lock(&t->mu);
    bool known = false;
    for (size_t i = 0; i < t->n_ep && !known; i++)
        known = t->ep[i].port == port && strcmp(t->ep[i].ip, host) == 0;
    if (!known) {
        size_t k = t->n_ep < TS_ENDPOINTS ? t->n_ep++ : t->next_ep++ % TS_ENDPOINTS;
        snprintf(t->ep[k].ip, sizeof(t->ep[k].ip), "%s", host);
        t->ep[k].port = port;
    }
    pthread_mutex_unlock(&t->mu);
}

/* The endpoints of recent TokenSpeed messages, and of every TokenSpeed
 * registration held (those outlast a flood of forged messages that would
 * push a real decode out of the FIFO). */
bool kvb__ts_endpoint(struct kvb_manager *m, const char *ip, uint16_t port)
{
    struct kvb__ts *t = ts_get(m, false);
    bool known = false;
    if (t == NULL)
        return false; /* no TokenSpeed message ever came: the SGLang paths pay nothing */
    pthread_mutex_lock(&t->mu);
    for (size_t i = 0; i < t->n_ep && !known; i++)
        known = t->ep[i].port == port && strcmp(t->ep[i].ip, ip) == 0;
    pthread_mutex_unlock(&t->mu);
    pthread_rwlock_rdlock(&m->reg_mu);
    for (const kvb__reg_t *g = m->regs; g != NULL && !known; g = g->next)
        known = g->dialect == KVB__DIALECT_TS && g->port == port && strcmp(g->ip, ip) == 0;
    pthread_rwlock_unlock(&m->reg_mu);
    return known;
}

/* ---- first tokens ---- */

static ts_output_t *output_slot(struct kvb__ts *t, uint64_t room, bool claim)
{
    ts_output_t *o = &t->out[room % TS_OUTPUTS];
    if (o->used && o->room == room)
        return o;
    if (!claim)
        return NULL;
    free(o->cands); /* another room's: a later one wins the slot */
    memset(o, 0, sizeof(*o));
    o->used = 1;
    o->room = room;
    o->aux_index = -1;
    return o;
}

void kvb__ts_note_aux(struct kvb_manager *m, uint64_t room, int64_t aux_index)
{
    struct kvb__ts *t = ts_get(m, false);
    if (t == NULL)
        return; /* no TokenSpeed decode ever spoke to this rank */
    pthread_mutex_lock(&t->mu);
    output_slot(t, room, true)->aux_index = aux_index;
    pthread_mutex_unlock(&t->mu);
}

kvb_status_t kvb__ts_output_set(struct kvb_manager *m, uint64_t room, int64_t token,
                                const int32_t *cands, size_t count, bool first_wins)
{
    struct kvb__ts *t = ts_get(m, true);
    int32_t *copy = malloc((count ? count : 1) * sizeof(*copy));
    if (t == NULL || copy == NULL) {
        free(copy);
        return KVB_ERR_NOMEM;
    }
    if (count > 0)
        memcpy(copy, cands, count * sizeof(*copy));
    pthread_mutex_lock(&t->mu);
    ts_output_t *o = output_slot(t, room, true);
    if (first_wins && o->has_token) {
        free(copy);
    } else {
        free(o->cands);
        o->has_token = 1;
        o->token = token;
        o->cands = copy;
        o->n_cands = count;
    }
    pthread_mutex_unlock(&t->mu);
    return KVB_OK;
}

kvb_status_t kvb_sender_set_first_token(kvb_sender_h s, int64_t token, const int32_t *cands,
                                        size_t count)
{
    if (s == NULL || (cands == NULL && count > 0) || count > TS_MAX_CANDS || token < -1)
        return KVB_ERR_INVALID;
    return kvb__ts_output_set(s->mgr, s->room, token, cands, count, false);
}

int kvb_receiver_first_token(kvb_receiver_h rc, int64_t *token_p, int32_t *cands, size_t cap,
                             size_t *n_p)
{
    int32_t *c = NULL;
    size_t n = 0;
    if (rc == NULL || token_p == NULL || (cands == NULL && cap > 0))
        return 0;
    struct kvb__ts *t = ts_get(rc->mgr, false);
    if (t == NULL)
        return 0;
    pthread_mutex_lock(&t->mu);
    ts_output_t *o = output_slot(t, rc->room, false);
    bool known = o != NULL && o->has_token;
    if (known) {
        *token_p = o->token;
        n = o->n_cands;
        c = o->cands;
        memcpy(cands, c, (n < cap ? n : cap) * sizeof(int32_t));
    }
    pthread_mutex_unlock(&t->mu);
    if (known && n_p != NULL)
        *n_p = n;
    return known ? 1 : 0;
}

/* The room's first token: the sender's, else aux buffer 0's first int32 at
 * the sender's aux slot (SGLang's output_ids), else -1. Candidates copied
 * into *cands_p (caller frees). */
static int64_t first_token(struct kvb_manager *m, uint64_t room, int32_t **cands_p, size_t *n_p)
{
    struct kvb__ts *t = ts_get(m, false);
    int64_t token = -1, aux = -1;
    *cands_p = NULL;
    *n_p = 0;
    if (t == NULL)
        return -1;
    pthread_mutex_lock(&t->mu);
    ts_output_t *o = output_slot(t, room, false);
    if (o != NULL && o->has_token) {
        token = o->token;
        *cands_p = o->n_cands ? malloc(o->n_cands * sizeof(int32_t)) : NULL;
        if (*cands_p != NULL) {
            memcpy(*cands_p, o->cands, o->n_cands * sizeof(int32_t));
            *n_p = o->n_cands;
        }
    } else if (o != NULL) {
        aux = o->aux_index;
    }
    pthread_mutex_unlock(&t->mu);
    if (aux >= 0 && m->args.num_aux > 0 && m->aux_items[0] >= 4 &&
        (uint64_t)aux < m->aux_lens[0] / m->aux_items[0]) {
        int32_t v;
        memcpy(&v, (const uint8_t *)(uintptr_t)m->aux_ptrs[0] + m->aux_items[0] * (uint64_t)aux, 4);
        token = v;
    }
    /* Not a token id (an aux slot that holds none): "none", not a status
     * that fails to encode, is never sent and leaves the decode waiting. */
    return token < -1 ? -1 : token;
}

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

kvb_status_t kvb__ts_send_status(struct kvb_manager *m, const char *ip, uint16_t port,
                                 uint64_t room, int status)
{
    int32_t *cands = NULL;
    size_t n = 0;
    if (status != KVB_POLL_SUCCESS) /* a prefill only ever reports the end */
        return send_raw(m, ip, port, room, KVB__TS_FAILED, -1, NULL, 0);
    int64_t token = first_token(m, room, &cands, &n);
    kvb_status_t st = send_raw(m, ip, port, room, KVB__TS_SUCCESS, token, cands, n);
    free(cands);
    return st;
}

/* ---- KV-args ---- */

static void on_reg_ts(struct kvb_manager *m, const kvb__frame_t *f, size_t n)
{
    kvb__regts_msg_t x;
    kvb__frames_err_t e;
    if (kvb__frames_decode_registration_ts(f, n, &e, &x) != KVB_OK) {
        kvb__conn_bad_message(m, KVB__MSG_REGISTRATION, &e);
        return;
    }
    remember_endpoint(m, x.ip, x.ip_len, x.port);
    uint64_t *state = malloc((x.state_ptrs.count ? x.state_ptrs.count : 1) * sizeof(uint64_t));
    if (state == NULL)
        return;
    for (size_t i = 0; i < x.state_ptrs.count; i++)
        state[i] = kvb__u64_at(x.state_ptrs, i);
    /* Kept for the life of the process (or until evicted): TokenSpeed sends
     * them once per prefill rank, not per room (spec 3.3). */
    kvb__prefill_reg_install(m, x.ip, x.ip_len, x.session_id, x.session_id_len, x.port, x.kv_ptrs,
                             state, x.state_ptrs.count, KVB__DIALECT_TS);
}

/* ---- transfer info: checks against this prefill (spec 7.7 rules 1-16) ---- */

int kvb__ts_buffer_kind(const struct kvb_manager *m, uint64_t b)
{
    uint64_t L = kvb__target_layers(m), D = m->p.draft_layers;
    if (m->p.is_mla)
        return b < L ? KVB__TS_TARGET_K : KVB__TS_DRAFT_K;
    if (b < 2 * L)
        return b < L ? KVB__TS_TARGET_K : KVB__TS_TARGET_V;
    return b < 2 * L + D ? KVB__TS_DRAFT_K : KVB__TS_DRAFT_V;
}

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
    d->dialect = KVB__DIALECT_TS;
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

static void free_dst(kvb__dst_t *d)
{
    free(d->pages);
    free(d->state_idx);
    kvb__ts_plan_destroy(d->ts_plan);
}

static void on_xfer_ts(struct kvb_manager *m, const kvb__frame_t *f, size_t n)
{
    kvb__xferts_msg_t x;
    kvb__frames_err_t e;
    kvb__dst_t d;
    char why[KVB__FRAMES_REASON_MAX + 64];
    uint64_t page = m->args.page_size ? m->args.page_size : 1;
    if (kvb__frames_decode_transfer_ts(f, n, &e, &x) != KVB_OK) {
        uint16_t port;
        kvb__conn_bad_message(m, KVB__MSG_TRANSFER, &e);
        if (!e.has_room || kvb__frames_decode_peer(f, n, "", true, NULL, &x.room, &port) != KVB_OK)
            return; /* no room or nowhere to tell */
        /* The room fails with the reason and the decode hears Failed. */
        memset(&x, 0, sizeof(x));
        x.room = e.room;
        x.ip = (const char *)f[1].data;
        x.ip_len = f[1].len;
        x.port = port;
        x.session_id = (const char *)f[3].data;
        x.session_id_len = f[3].len;
        x.required_dst_info_num = 1;
        remember_endpoint(m, x.ip, x.ip_len, port);
        if (dst_of(&x, &d, page) == KVB_OK)
            kvb__prefill_add_dst(m, x.room, &d, 1, e.reason, x.ip, x.ip_len, port);
        else
            free_dst(&d);
        return;
    }
    remember_endpoint(m, x.ip, x.ip_len, x.port);
    char sid[KVB_SID_MAX];
    copy_n(sid, sizeof(sid), x.session_id, x.session_id_len);
    kvb__reg_t *g = kvb__reg_get(m, sid);
    xfer_refusal(m, &x, g, why, sizeof(why));
    kvb__reg_put(g);
    kvb__ts_plan_t *plan = NULL;
    if (why[0] == '\0' && !plan_from(m, &x, &plan, why, sizeof(why)))
        plan = NULL;
    if (why[0] != '\0') { /* a refused room writes nothing: no pages, no plan */
        x.pages.count = 0;
        x.state_idx.count = 0;
    }
    if (dst_of(&x, &d, page) != KVB_OK) {
        free_dst(&d);
        kvb__ts_plan_destroy(plan);
        return;
    }
    d.ts_plan = plan;
    /* WaitingForInput (3) arms the decode's own time-out (spec 6.3): without
     * it a TokenSpeed decode whose prefill rank dies while the bootstrap
     * server lives waits forever. Sent before the room can end, on the same
     * socket, so it always precedes the terminal status. */
    if (why[0] == '\0' && !x.is_dummy && kvb__env_int("KVBRIDGE_TS_WAITING_STATUS", NULL, 1, 0, 1))
        send_raw(m, d.ip, d.port, x.room, KVB__TS_WAITING_FOR_INPUT, -1, NULL, 0);
    kvb__prefill_add_dst(m, x.room, &d, x.required_dst_info_num, why, x.ip, x.ip_len, x.port);
}

/* ---- dispatch ---- */

static bool frame_eq(const kvb__frame_t *f, const char *lit)
{
    return f->len == strlen(lit) && memcmp(f->data, lit, f->len) == 0;
}

bool kvb__ts_on_message(struct kvb_manager *m, const kvb__frame_t *f, size_t n)
{
    if (n == 0)
        return false;
    for (size_t i = 0; i < n; i++)
        if (frame_eq(&f[i], KVB__EXT_MARKER))
            return false; /* kvbridge's own message (its extensions follow a marker) */
    if (frame_eq(&f[0], "None")) {
        /* 8 frames with frame 5 empty; CachePD's 8 carry JSON there (unsupported) */
        if (n != KVB__REGTS_FRAMES || f[5].len != 0)
            return false;
        on_reg_ts(m, f, n);
        return true;
    }
    if (f[0].len == 0 || f[0].data[0] < '0' || f[0].data[0] > '9' ||
        (n != KVB__XFERTS_FRAMES && n != KVB__XFERTS_PLAN))
        return false;
    /* Frame 7 is a decimal (or empty in a dummy) here, a kvbridge key=value
     * extension in an older kvbridge's seed-001 message. */
    if (f[7].len > 0 && f[7].data[0] >= 'a' && f[7].data[0] <= 'z')
        return false;
    /* Decided per session: a session that registered in another dialect
     * keeps it (spec 11.4); an unknown one goes by the count. */
    char sid[KVB_SID_MAX];
    copy_n(sid, sizeof(sid), (const char *)f[3].data, f[3].len);
    kvb__reg_t *g = kvb__reg_get(m, sid);
    bool other = g != NULL && g->dialect != KVB__DIALECT_TS;
    kvb__reg_put(g);
    if (other)
        return false;
    on_xfer_ts(m, f, n);
    return true;
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
    const kvb__ts_plan_t *p = j->d->ts_plan;
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
        const kvb__ts_plan_t *p = j->d->ts_plan;
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
    if (g->dialect != KVB__DIALECT_TS)
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
