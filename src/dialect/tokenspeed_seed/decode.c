/* Decode side, TokenSpeed's dialect (seed 004, PROTOCOL-TOKENSPEED.md 10,
 * "kvbridge decode <-> TokenSpeed prefill"): a decode whose bootstrap server
 * answered in TokenSpeed's shape (kvb__addr_t.dialect is this one)
 * sends its ranks the 8-frame KV-args and 12-frame transfer infos (int64
 * pages past the prefix; with another TP size, 14 frames: a plan computed by
 * kvbridge's planner, see plan_json) and reads their 5-frame statuses. Nothing else goes to a
 * TokenSpeed prefill: its control thread dies on anything else (there is no abort message).
 * Below prefill.c, which holds the dialect's table. */
#include "dialect/tokenspeed_seed/tokenspeed_seed.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static kvb_status_t send(struct kvb_manager *m, const char *ip, uint16_t port, kvb__frames_buf_t *b,
                         kvb_status_t st, const kvb__frames_err_t *e)
{
    if (st != KVB_OK)
        KVB_LOGW("manager %s: TokenSpeed message to %s:%u not encodable: %s", m->endpoint, ip, port,
                 e->reason);
    else
        st = kvb__zsend(&m->zc, ip, port, b);
    kvb__frames_buf_free(b);
    return st;
}

kvb_status_t kvb__ts_send_registration(struct kvb_manager *m, const char *ip, uint16_t port,
                                       bool kvbridge, const void *priv)
{
    (void)kvbridge, (void)priv; /* no extension frames on this wire */
    kvb__frames_buf_t b;
    kvb__frames_err_t e = {0};
    const char *sid = kvb_engine_session_id(m->engine);
    kvb__regts_msg_t r = {m->host,
                          strlen(m->host),
                          m->port,
                          sid,
                          strlen(sid),
                          kvb__u64_view_of(m->kv_ptrs, m->args.num_kv),
                          kvb__u64_view_of(m->state_ptrs, m->args.num_state),
                          0};
    kvb__frames_buf_init(&b);
    return send(m, ip, port, &b, kvb__frames_encode_registration_ts(&r, &e, &b), &e);
}

/* The TokenSpeed buffer_kind of this rank's KV buffer b (tokenspeed_seed.h). */
int kvb__ts_buffer_kind(const struct kvb_manager *m, uint64_t b)
{
    uint64_t L = kvb__target_layers(m), D = m->p.draft_layers;
    if (m->p.is_mla)
        return b < L ? KVB__TS_TARGET_K : KVB__TS_DRAFT_K;
    if (b < 2 * L)
        return b < L ? KVB__TS_TARGET_K : KVB__TS_TARGET_V;
    return b < 2 * L + D ? KVB__TS_DRAFT_K : KVB__TS_DRAFT_V;
}

/* Fake buffer bases for planning one page: buffer b at (b + 1) << 40, so a
 * block's buffer and in-item offset read back from its addresses. */
#define FAKE_BASE(b) ((uint64_t)((b) + 1) << 40)

/* kvbridge's planner's blocks for one page pair (prefill page 0 -> decode
 * page 0) from source s, as TokenSpeed fragments (m->mu held). TokenSpeed's
 * prefill applies each fragment to every page pair literally (spec 7.5), so
 * the exact in-page blocks are exact for every page: at page size P > 1 that
 * is P fragments per buffer and source for head slices (spec 7.6, second
 * half). 0 fragments, or -1 on a planner error. */
static long plan_frags(struct kvb_manager *m, const kvb__addr_t *a, const kvb__src_t *s,
                       kvb__ts_frag_t **frags_p)
{
    uint32_t nkv = m->args.num_kv;
    uint64_t *base = malloc((nkv + 1) * sizeof(uint64_t));
    int32_t page0 = 0;
    kvb_plan_blocks_t out = {0};
    kvb_plan_chunk_t ch = {0};
    long n = -1;
    uint64_t item_p =
        a->info.kv_item_lens.count > 0
            ? a->info.kv_item_lens.values[0]
            : m->args.kv_item_len * (uint64_t)m->p.attn_tp_size / (uint64_t)a->info.attn_tp_size;
    for (uint32_t b = 0; base != NULL && b < nkv; b++)
        base[b] = FAKE_BASE(b);
    /* Draft K/V follow the target's on both sides (params draft_layers). */
    const uint64_t *draft = base != NULL && m->p.draft_layers
                                ? base + (m->p.is_mla ? 1 : 2) * kvb__target_layers(m)
                                : NULL;
    kvb_plan_buffers_t src = {base, draft, NULL, NULL}, dst = {base, draft, NULL, NULL};
    ch.src_pages = &page0;
    ch.dst_pages = &page0;
    ch.num_pages = 1;
    if (base != NULL && kvb_plan_blocks(a->plan, s->tp_rank, (uint32_t)m->p.attn_tp_rank, &src,
                                        &dst, &ch, &out) == KVB_OK) {
        kvb__ts_frag_t *f = calloc(out.count + 1, sizeof(*f));
        for (size_t i = 0; f != NULL && i < out.count; i++) {
            uint64_t b = (out.blocks[i].src >> 40) - 1;
            f[i] = (kvb__ts_frag_t){b,
                                    (kvb__ts_kind_t)kvb__ts_buffer_kind(m, b),
                                    (int64_t)s->tp_rank,
                                    m->p.attn_tp_rank,
                                    item_p,
                                    m->args.kv_item_len,
                                    out.blocks[i].src - FAKE_BASE(b),
                                    out.blocks[i].dst - FAKE_BASE(b),
                                    out.blocks[i].len,
                                    0};
        }
        *frags_p = f;
        n = f != NULL ? (long)out.count : -1;
    }
    kvb_plan_blocks_free(&out);
    free(base);
    return n;
}

/* The plan JSON for source s of room (malloc'ed; NULL with *st_p KVB_OK: the
 * same TP size, no plan, TokenSpeed's identity copy). */
static char *plan_json(struct kvb_manager *m, uint64_t room, const kvb__src_t *s, size_t *len_p,
                       kvb_status_t *st_p)
{
    kvb__ts_frag_t *frags = NULL;
    long n = 0;
    char *json = NULL;
    *st_p = KVB_OK;
    pthread_mutex_lock(&m->mu);
    kvb__room_t *r = kvb__room_find(m, room);
    kvb__addr_t *a = m->addrs;
    while (a != NULL &&
           (r == NULL || r->bootstrap_addr == NULL || strcmp(a->addr, r->bootstrap_addr) != 0))
        a = a->next;
    if (a != NULL && a->have_info && a->info.attn_tp_size != m->p.attn_tp_size)
        n = plan_frags(m, a, s, &frags);
    pthread_mutex_unlock(&m->mu);
    if (n < 0 || (n > 0 && kvb__ts_plan_encode(frags, (size_t)n, &json, len_p) != KVB_OK))
        *st_p = KVB_ERR_INVALID;
    free(frags);
    return n > 0 ? json : NULL;
}

kvb_status_t kvb__ts_send_transfer(struct kvb_manager *m, const kvb__src_t *s, uint64_t room,
                                   const int32_t *idx, size_t n, int64_t aux,
                                   const kvb_receiver_init_t *ex)
{
    kvb__frames_buf_t b;
    kvb__frames_err_t e = {0};
    const char *sid = kvb_engine_session_id(m->engine);
    uint64_t prefix = ex != NULL && (ex->field_mask & KVB_RECV_INIT_PREFIX) ? ex->prefix_tokens : 0;
    uint64_t skip = prefix / (m->args.page_size ? m->args.page_size : 1);
    size_t np = s->dummy || skip >= n ? 0 : n - skip;
    size_t ns = !s->dummy && ex != NULL && (ex->field_mask & KVB_RECV_INIT_STATE) &&
                        ex->state_indices != NULL
                    ? ex->num_state_indices
                    : 0;
    int64_t *wide = malloc((np + ns + 1) * sizeof(int64_t)); /* int64 on this wire */
    if (wide == NULL)
        return KVB_ERR_NOMEM;
    for (size_t i = 0; i < np; i++)
        wide[i] = idx[skip + i];
    for (size_t i = 0; i < ns; i++)
        wide[np + i] = ex->state_indices[i];
    kvb__xferts_msg_t x = {0};
    x.room = room;
    x.ip = m->host;
    x.ip_len = strlen(m->host);
    x.port = m->port;
    x.session_id = sid;
    x.session_id_len = strlen(sid);
    x.is_dummy = s->dummy;
    x.pages = (kvb__i64_view_t){(const uint8_t *)wide, np};
    x.aux_index = aux;
    x.required_dst_info_num = (int32_t)s->required_dst_info_num;
    x.prefix_len = (int64_t)prefix;
    x.state_idx = (kvb__i64_view_t){(const uint8_t *)(wide + np), ns};
    kvb_status_t st = KVB_OK;
    char *json = s->dummy ? NULL : plan_json(m, room, s, &x.plan_len, &st);
    x.has_plan = json != NULL;
    x.plan_json = (const uint8_t *)json;
    kvb__frames_buf_init(&b);
    if (st == KVB_OK)
        st = send(m, s->ip, s->port, &b, kvb__frames_encode_transfer_ts(&x, &e, &b), &e);
    else
        kvb__frames_buf_free(&b);
    free(json);
    free(wide);
    return st;
}

/* A 5-frame status from a TokenSpeed prefill, read into the status kvbridge's
 * decode acts on: 5 (Success) as Success, 0 (Failed) as Failed; the
 * WaitingForInput and the other progress values change nothing here. The
 * first token and candidates of a Success are kept for
 * kvb_receiver_first_token(). */
kvb_status_t kvb__ts_decode_status(struct kvb_manager *m, const kvb__frame_t *f, size_t n,
                                   kvb__status_in_t *out)
{
    kvb__statusts_msg_t s;
    kvb__frames_err_t e;
    if (kvb__frames_decode_status_ts(f, n, &e, &s) != KVB_OK) {
        kvb__conn_bad_message(m, "status", &e);
        return KVB_ERR_PROTO;
    }
    kvb__dialect_status_in(out, s.room, s.sender, s.status, KVB__TS_SUCCESS, KVB__TS_FAILED);
    if (s.status == KVB__TS_SUCCESS)
        kvb__dialect_keep_first_token(m, s.room, s.first_token, s.candidates);
    return KVB_OK;
}

/* Pages past a whole-page prefix (frame 7) and state slots (frame 11); no
 * page mask with holes. */
void kvb__ts_transfer_form(const struct kvb_manager *m, const kvb__src_t *s, size_t count,
                           const kvb_receiver_init_t *ex, char *why, size_t len)
{
    size_t hole = 0;
    (void)s;
    if (kvb__dialect_mask_hole(count, ex, &hole))
        snprintf(why, len,
                 "a page mask with holes (entry %zu is 0) has no form in TokenSpeed's transfer "
                 "info; use prefix_tokens",
                 hole);
    else
        kvb__dialect_prefix_form(m, count, ex, why, len);
}
