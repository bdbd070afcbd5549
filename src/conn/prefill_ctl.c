/* Prefill side, control path: registration with the bootstrap server, the
 * decode ranks' KV-args registrations and transfer infos, aborts asked by a
 * decode. Transfer workers are in prefill_xfer.c. */
#include "conn/conn_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void copy_str(char *dst, size_t cap, const char *s, size_t n)
{
    if (n >= cap)
        n = cap - 1;
    memcpy(dst, s, n);
    dst[n] = '\0';
}

static uint64_t *copy_u64_view(kvb__u64_view_t v)
{
    uint64_t *a = malloc((v.count ? v.count : 1) * sizeof(*a));
    for (size_t i = 0; a != NULL && i < v.count; i++)
        a[i] = kvb__u64_at(v, i);
    return a;
}

static uint64_t now_ms(void)
{
    return (uint64_t)(kvb__now_s() * 1000.0) + 1; /* never 0 */
}

void kvb__reg_put(kvb__reg_t *g)
{
    if (g == NULL || __atomic_sub_fetch(&g->refs, 1, __ATOMIC_ACQ_REL) != 0)
        return;
    kvb_plan_destroy(g->plan);
    free(g->plan_error);
    free(g->kv_ptrs);
    free(g->aux_ptrs);
    free(g->state_ptrs);
    free(g);
}

kvb__reg_t *kvb__reg_get(struct kvb_manager *m, const char *session)
{
    kvb__reg_t *g;
    pthread_rwlock_rdlock(&m->reg_mu);
    for (g = m->regs; g != NULL; g = g->next)
        if (strcmp(g->session, session) == 0)
            break;
    if (g != NULL) {
        __atomic_add_fetch(&g->refs, 1, __ATOMIC_RELAXED);
        __atomic_store_n(&g->used_ms, now_ms(), __ATOMIC_RELAXED);
    }
    pthread_rwlock_unlock(&m->reg_mu);
    return g;
}

/* A transfer info names the session: its registration is in use for the
 * room TTL from now (the longest a room waits), as when a chunk is planned. */
static void reg_touch(struct kvb_manager *m, const char *session)
{
    pthread_rwlock_rdlock(&m->reg_mu);
    for (kvb__reg_t *g = m->regs; g != NULL; g = g->next)
        if (strcmp(g->session, session) == 0) {
            __atomic_store_n(&g->used_ms, now_ms(), __ATOMIC_RELAXED);
            break;
        }
    pthread_rwlock_unlock(&m->reg_mu);
}

/* Both came from the same claimed peer: CURVE key and control endpoint. */
static bool reg_same_peer(const kvb__reg_t *a, const kvb__reg_t *b)
{
    return a->port == b->port && strcmp(a->ip, b->ip) == 0 && strcmp(a->peer_id, b->peer_id) == 0;
}

/* A registration to drop so the newcomer nc fits (reg_mu held for
 * writing), in this order: one whose decode failed; the oldest of nc's own
 * claimed peer that no transfer info named yet (a peer's flood displaces
 * its own); the oldest no transfer info named within
 * KVBRIDGE_REGISTRATION_GRACE of its arrival (a decode registers when it
 * resolves its route, and its first transfer info may come much later: a
 * newer bogus session must not displace it meanwhile); the longest idle
 * past the room TTL. In use, never dropped: a job holds it, or a transfer
 * info or chunk named it within the room TTL (the longest a room waits).
 * NULL: refuse the newcomer. */
static kvb__reg_t **reg_victim(struct kvb_manager *m, const kvb__reg_t *nc)
{
    kvb__reg_t **best[4] = {NULL, NULL, NULL, NULL};
    uint64_t now = now_ms(), ttl = (uint64_t)(m->p.room_ttl_s * 1000);
    for (kvb__reg_t **pp = &m->regs; *pp != NULL; pp = &(*pp)->next) {
        kvb__reg_t *g = *pp;
        uint64_t used = __atomic_load_n(&g->used_ms, __ATOMIC_RELAXED);
        if (__atomic_load_n(&g->refs, __ATOMIC_ACQUIRE) != 1)
            continue; /* a room's job holds it */
        if (__atomic_load_n(&g->failed, __ATOMIC_ACQUIRE))
            return pp;
        if (used == 0 && reg_same_peer(g, nc) &&
            (best[1] == NULL || g->registered_ms < (*best[1])->registered_ms))
            best[1] = pp;
        if (used == 0 && now - g->registered_ms > m->reg_grace_ms &&
            (best[2] == NULL || g->registered_ms < (*best[2])->registered_ms))
            best[2] = pp;
        if (used != 0 && now - used > ttl &&
            (best[3] == NULL || used < __atomic_load_n(&(*best[3])->used_ms, __ATOMIC_RELAXED)))
            best[3] = pp;
    }
    return best[1] != NULL ? best[1] : best[2] != NULL ? best[2] : best[3];
}

typedef enum reg_ins { REG_OK = 0, REG_FULL, REG_IMPOSTOR, REG_TOO_BIG } reg_ins_t;

/* Unlink the registration at pp (reg_mu held for writing). */
static kvb__reg_t *reg_unlink(struct kvb_manager *m, kvb__reg_t **pp)
{
    kvb__reg_t *g = *pp;
    *pp = g->next;
    m->n_regs--;
    m->reg_bytes -= g->bytes;
    return g;
}

/* Drop victims (reg_victim's order) until g fits the count and byte caps;
 * false when only registrations in use are left. */
static bool reg_make_room(struct kvb_manager *m, const kvb__reg_t *g)
{
    while (m->n_regs >= m->max_regs || m->reg_bytes + g->bytes > m->max_regs_bytes) {
        kvb__reg_t **pp = reg_victim(m, g);
        if (pp == NULL)
            return false;
        m->regs_evicted++;
        kvb__reg_put(reg_unlink(m, pp)); /* refs 1: frees only memory */
    }
    return true;
}

/* Put g in the table, replacing the session's earlier record, which only
 * the same CURVE identity may do (REG_IMPOSTOR otherwise). REG_TOO_BIG /
 * REG_FULL: the byte / count caps cannot be met without dropping a
 * registration in use. *old_p: what to release. */
static reg_ins_t reg_insert(struct kvb_manager *m, kvb__reg_t *g, kvb__reg_t **old_p)
{
    kvb__reg_t **pp = &m->regs;
    *old_p = NULL;
    while (*pp != NULL && strcmp((*pp)->session, g->session) != 0)
        pp = &(*pp)->next;
    if (*pp != NULL && strcmp((*pp)->peer_id, g->peer_id) != 0) {
        m->regs_impostor++;
        return REG_IMPOSTOR; /* another CURVE identity: never redirect its rooms */
    }
    if (*pp != NULL) { /* a re-registration: in use as the record it replaces */
        *old_p = reg_unlink(m, pp);
        g->used_ms = __atomic_load_n(&(*old_p)->used_ms, __ATOMIC_RELAXED);
    }
    if (!reg_make_room(m, g)) {
        bool bytes = m->reg_bytes + g->bytes > m->max_regs_bytes;
        if (bytes)
            m->regs_too_big++;
        else
            m->regs_refused++;
        return bytes ? REG_TOO_BIG : REG_FULL; /* *old_p is dropped too: it was replaced */
    }
    g->next = m->regs;
    m->regs = g;
    m->n_regs++;
    m->reg_bytes += g->bytes;
    return REG_OK;
}

/* The decode rank's layout, from what its registration says; geometry the
 * frames do not carry (bytes per head, aux item lengths) is assumed equal to
 * ours, as in the seeds. */
static void decode_layout(struct kvb_manager *m, const kvb__reg_t *g, kvb_plan_layout_t *pre,
                          kvb_plan_layout_t *dec)
{
    kvb__layout_self(m, pre);
    *dec = *pre;
    dec->field_mask &=
        ~(uint64_t)(KVB_PLAN_LAYOUT_PP | KVB_PLAN_LAYOUT_STAGE | KVB_PLAN_LAYOUT_POOL);
    /* the decode holds every layer, its draft layers (draft_pairs) after */
    dec->num_layers = (uint32_t)(m->p.is_mla ? g->n_kv : g->n_kv / 2) - m->p.draft_layers;
    pre->num_layers = dec->num_layers;
    dec->tp_size = (uint32_t)g->tp_size;
    dec->tp_rank = (uint32_t)(g->tp_rank % g->tp_size);
    dec->kv_geom.item_len = (uint64_t)g->item_len;
    dec->draft_geom.item_len = (uint64_t)g->item_len; /* one item length on the wire */
    dec->pp_size = 1;
    dec->pp_rank = 0;
    if (g->n_aux != m->args.num_aux) {
        dec->field_mask &= ~(uint64_t)KVB_PLAN_LAYOUT_AUX;
        pre->field_mask &= ~(uint64_t)KVB_PLAN_LAYOUT_AUX;
        dec->num_aux = pre->num_aux = 0;
    }
    /* State: the decode registers only its buffers' addresses; with the same
     * TP size its items are ours (same model, same shard). */
    if (g->n_state != m->args.num_state || g->n_state == 0) {
        dec->field_mask &= ~(uint64_t)KVB_PLAN_LAYOUT_STATE;
        pre->field_mask &= ~(uint64_t)KVB_PLAN_LAYOUT_STATE;
        dec->num_state = pre->num_state = 0;
    }
}

/* Layers pair by position, target K then V, then the draft model's K and V
 * (params draft_layers; SGLang and TokenSpeed append draft KV the same way).
 * The wire carries no draft count (an SGLang prefill guesses it from
 * Ld % Ls, spec 7.2), so the decode's draft layers are its KV layers beyond
 * our model's target layers, and must equal our draft_layers: with another
 * count V (or the draft) would land in the wrong buffers. */
static bool draft_pairs(struct kvb_manager *m, const kvb__reg_t *g, char *why, size_t wl)
{
    size_t layers = m->p.is_mla ? g->n_kv : g->n_kv / 2;
    uint32_t target = m->args.num_layers_total, draft = m->p.draft_layers;
    if (layers == (size_t)target + draft)
        return true;
    if (layers > target)
        snprintf(why, wl,
                 "decode %s registered KV buffers for %zu layers, this prefill's model has %u "
                 "target + %u draft layers: kvbridge pairs target and draft-model layers by "
                 "position and the decode's %zu draft layers do not match (draft_layers)",
                 g->session, layers, target, draft, layers - target);
    else
        snprintf(why, wl,
                 "decode %s registered KV buffers for %zu layers, this prefill's model has %u "
                 "target + %u draft layers: kvbridge pairs layers by position",
                 g->session, layers, target, draft);
    return false;
}

static void reg_build_plan(struct kvb_manager *m, kvb__reg_t *g)
{
    kvb_plan_layout_t pre, dec;
    char buf[768]; /* a reason naming the session (KVB_SID_MAX) */
    if (!m->p.is_mla && g->n_kv % 2 != 0) {
        snprintf(buf, sizeof(buf), "decode %s registered %zu KV buffers (odd, MHA needs K and V)",
                 g->session, g->n_kv);
        g->plan_error = strdup(buf);
        return;
    }
    if (!draft_pairs(m, g, buf, sizeof(buf))) {
        g->plan_error = strdup(buf);
        return;
    }
    if (m->args.num_state > 0 && g->n_state > 0 && g->tp_size != m->p.attn_tp_size) {
        snprintf(buf, sizeof(buf),
                 "decode %s: state buffers need the same attention TP size on both sides "
                 "(prefill %d, decode %d)",
                 g->session, m->p.attn_tp_size, (int)g->tp_size);
        g->plan_error = strdup(buf);
        return;
    }
    decode_layout(m, g, &pre, &dec);
    if (kvb_plan_create(&pre, &dec, &g->plan) != KVB_OK) {
        snprintf(buf, sizeof(buf), "cannot plan transfers to decode %s: %s", g->session,
                 kvb_plan_last_error());
        g->plan_error = strdup(buf);
        g->plan = NULL;
        KVB_LOGW("manager %s: %s", m->endpoint, buf);
    }
}

/* The decode's "kv_lens=" extension (packed u64, one per KV buffer): the
 * pages each of its buffers holds, the smallest wins. *has_p false when
 * absent (an older decode: its pages are not checked here). false:
 * malformed. */
static bool reg_kv_pool(const kvb__frame_t *ext, size_t n_ext, size_t n_kv, int64_t item_len,
                        bool *has_p, uint64_t *pool_p, kvb__frames_err_t *e)
{
    static const char key[] = "kv_lens=";
    const size_t kl = sizeof(key) - 1;
    *has_p = false;
    *pool_p = 0;
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
        *pool_p = pool;
        *has_p = true;
        return true;
    }
    return true;
}

/* A decoded registration of either dialect, as the table keeps it. */
typedef struct reg_in {
    const char *ip, *session;
    size_t ip_len, session_len;
    uint16_t port;
    kvb__u64_view_t kv, aux;
    uint64_t *state; /* owned: moved into the record */
    size_t n_state;
    int32_t tp_rank, tp_size;
    int64_t item_len;
    bool has_pool;
    uint64_t pool;
    int dialect;
    char *refuse; /* owned: why this decode cannot be served (2026 fields) */
} reg_in_t;

/* Pointer bytes past the per-registration cap: refused before anything is
 * copied (counted, logged at powers of two). */
static bool reg_too_big(struct kvb_manager *m, uint64_t bytes)
{
    if (bytes <= m->max_reg_bytes)
        return false;
    pthread_rwlock_wrlock(&m->reg_mu);
    uint64_t k = ++m->regs_too_big;
    pthread_rwlock_unlock(&m->reg_mu);
    if ((k & (k - 1)) == 0)
        KVB_LOGW("manager %s: KV args with %llu bytes of pointers refused "
                 "(KVBRIDGE_MAX_REGISTRATION_BYTES %llu); %llu so far",
                 m->endpoint, (unsigned long long)bytes, (unsigned long long)m->max_reg_bytes,
                 (unsigned long long)k);
    return true;
}

static kvb__reg_t *reg_from_in(struct kvb_manager *m, reg_in_t *in, uint64_t bytes)
{
    kvb__reg_t *g = calloc(1, sizeof(*g));
    if (g == NULL)
        return NULL;
    g->bytes = bytes;
    copy_str(g->session, sizeof(g->session), in->session, in->session_len);
    copy_str(g->ip, sizeof(g->ip), in->ip, in->ip_len);
    g->port = in->port;
    g->kv_ptrs = copy_u64_view(in->kv);
    g->n_kv = in->kv.count;
    g->aux_ptrs = copy_u64_view(in->aux);
    g->n_aux = in->aux.count;
    g->state_ptrs = in->state;
    g->n_state = in->n_state;
    in->state = NULL;
    g->tp_rank = in->tp_rank;
    g->tp_size = in->tp_size;
    g->item_len = in->item_len;
    g->has_kv_pool = in->has_pool;
    g->kv_pool = in->pool;
    g->dialect = in->dialect;
    g->refs = 1;
    snprintf(g->peer_id, sizeof(g->peer_id), "%s", m->rx_peer_id);
    if (in->refuse != NULL) {
        g->plan_error = in->refuse; /* every room to it fails with this reason */
        in->refuse = NULL;
        KVB_LOGW("manager %s: %s", m->endpoint, g->plan_error);
    } else if (in->dialect != KVB__DIALECT_TS) {
        reg_build_plan(m, g); /* TokenSpeed rooms bring their own plans */
    }
    g->registered_ms = now_ms();
    return g;
}

/* Build the record and put it in the table (in's owned fields consumed). */
static void reg_install(struct kvb_manager *m, reg_in_t *in)
{
    uint64_t bytes = (uint64_t)(in->kv.count + in->aux.count + in->n_state) * 8;
    kvb__reg_t *g = reg_too_big(m, bytes) ? NULL : reg_from_in(m, in, bytes);
    free(in->state);
    free(in->refuse);
    if (g == NULL)
        return;
    /* Replace any earlier record of the session: a restarted decode
     * re-registers, which also clears its failure mark. */
    kvb__reg_t *old;
    pthread_rwlock_wrlock(&m->reg_mu);
    reg_ins_t ins = reg_insert(m, g, &old);
    uint64_t refused = m->regs_refused;
    pthread_rwlock_unlock(&m->reg_mu);
    kvb__reg_put(old);
    if (ins == REG_IMPOSTOR)
        KVB_LOGW("manager %s: KV args of %s refused: that session is registered with another "
                 "CURVE key (this one %.8s...)",
                 m->endpoint, g->session, g->peer_id);
    if (ins == REG_TOO_BIG)
        KVB_LOGW("manager %s: KV args of %s refused: registrations would hold more than %llu "
                 "bytes of pointers (KVBRIDGE_MAX_REGISTRATIONS_BYTES)",
                 m->endpoint, g->session, (unsigned long long)m->max_regs_bytes);
    if (ins == REG_FULL && (refused & (refused - 1)) == 0) /* logged at powers of two */
        KVB_LOGW("manager %s: KV args of %s refused: %zu registrations in use or new "
                 "(KVBRIDGE_MAX_REGISTRATIONS, KVBRIDGE_REGISTRATION_GRACE); %llu refused so far",
                 m->endpoint, g->session, m->max_regs, (unsigned long long)refused);
    if (ins != REG_OK) {
        kvb__reg_put(g);
        return;
    }
    KVB_LOGD("manager %s: KV args of %s registered (dialect %d)", m->endpoint, g->session,
             g->dialect);
}

void kvb__prefill_reg_install(struct kvb_manager *m, const char *ip, size_t ip_len, const char *sid,
                              size_t sid_len, uint16_t port, kvb__u64_view_t kv, uint64_t *state,
                              size_t n_state, int dialect)
{
    kvb__u64_view_t none = {NULL, 0};
    reg_in_t in = {ip,      sid, ip_len, sid_len, port,  kv, none,    state,
                   n_state, 0,   1,      1,       false, 0,  dialect, NULL};
    reg_install(m, &in);
}

static void on_registration(struct kvb_manager *m, const kvb__frame_t *f, size_t n)
{
    kvb__reg_msg_t msg;
    kvb__frames_err_t e;
    reg_in_t in = {0};
    if (kvb__frames_decode_registration(f, n, &e, &msg) != KVB_OK ||
        !reg_kv_pool(msg.ext, msg.n_ext, msg.kv_ptrs.count, msg.dst_kv_item_len, &in.has_pool,
                     &in.pool, &e)) {
        kvb__conn_bad_message(m, KVB__MSG_REGISTRATION, &e);
        return;
    }
    in = (reg_in_t){msg.ip,      msg.session_id,  msg.ip_len,           msg.session_id_len,
                    msg.port,    msg.kv_ptrs,     msg.aux_ptrs,         NULL,
                    0,           msg.dst_tp_rank, msg.dst_attn_tp_size, msg.dst_kv_item_len,
                    in.has_pool, in.pool,         KVB__DIALECT_2025,    NULL};
    if (msg.has_state_ptrs) {
        in.state = copy_u64_view(msg.state_ptrs);
        in.n_state = msg.state_ptrs.count;
        if (in.state == NULL)
            return;
    }
    reg_install(m, &in);
}

/* Why kvbridge cannot serve a 2026 registration's fields, or NULL (the
 * fields it honours are copied into in). */
/* What of a 2026 registration kvbridge cannot serve, into buf (empty: all
 * fine). Checked: KV buffers present, DCP off, the KV item length at the
 * same attention TP size (or MLA: page size and KV dtype), one state
 * component, layer ids only where position pairs the same layers. */
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

static void reg26_unsupported(struct kvb_manager *m, const kvb__reg26_msg_t *x, char *buf,
                              size_t len)
{
    int sid = (int)x->session_id_len;
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
             (uint64_t)x->dst_kv_item_len != m->args.kv_item_len)
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
static void reg26_state(struct kvb_manager *m, const kvb__reg26_msg_t *x, reg_in_t *in, char *buf,
                        size_t len)
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
static char *reg26_refusal(struct kvb_manager *m, const kvb__reg26_msg_t *x, reg_in_t *in)
{
    char buf[400];
    reg26_unsupported(m, x, buf, sizeof(buf));
    if (buf[0] == '\0' && x->state_ptrs.n == 1)
        reg26_state(m, x, in, buf, sizeof(buf));
    return buf[0] != '\0' ? strdup(buf) : NULL;
}

static void on_registration26(struct kvb_manager *m, const kvb__frame_t *f, size_t n)
{
    kvb__reg26_msg_t x;
    kvb__frames_err_t e;
    reg_in_t in = {0};
    if (kvb__frames_decode_registration26(f, n, &e, &x) != KVB_OK ||
        !reg_kv_pool(x.ext, x.n_ext, x.kv_ptrs.count, x.dst_kv_item_len, &in.has_pool, &in.pool,
                     &e)) {
        kvb__conn_bad_message(m, KVB__MSG_REGISTRATION26, &e);
        return;
    }
    in = (reg_in_t){x.ip,
                    x.session_id,
                    x.ip_len,
                    x.session_id_len,
                    x.port,
                    x.kv_ptrs,
                    x.aux_ptrs,
                    NULL,
                    0,
                    x.dst_tp_rank,
                    x.dst_attn_tp_size,
                    x.dst_kv_item_len > 0 ? x.dst_kv_item_len : 1,
                    in.has_pool,
                    in.pool,
                    KVB__DIALECT_2026,
                    NULL};
    in.refuse = reg26_refusal(m, &x, &in);
    reg_install(m, &in);
}

static kvb_status_t dst_from_msg(const kvb__xfer_msg_t *x, kvb__dst_t *d)
{
    memset(d, 0, sizeof(*d));
    copy_str(d->session, sizeof(d->session), x->session_id, x->session_id_len);
    copy_str(d->ip, sizeof(d->ip), x->ip, x->ip_len);
    d->port = x->port;
    d->dummy = x->is_dummy;
    d->aux_index = x->aux_index;
    d->n_pages = x->pages.count;
    d->prefix_tokens = x->has_prefix_len ? x->prefix_len : 0;
    d->epoch = x->has_epoch ? x->epoch : 0;
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

/* A 2026 transfer info as a destination; *why_p (static text or buf) says
 * why kvbridge cannot serve it (the room then fails with that reason). */
static kvb_status_t dst_from_msg26(struct kvb_manager *m, const kvb__xfer26_msg_t *x, kvb__dst_t *d,
                                   char *why, size_t wl)
{
    memset(d, 0, sizeof(*d));
    why[0] = '\0';
    copy_str(d->session, sizeof(d->session), x->session_id, x->session_id_len);
    copy_str(d->ip, sizeof(d->ip), x->ip, x->ip_len);
    d->port = x->port;
    d->dummy = x->is_dummy;
    d->aux_index = x->aux_index;
    d->dialect = KVB__DIALECT_2026;
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

/* Who named a room (the wire-room caps' fairness): the CURVE key the
 * message came with, else the ip:port its frames claim. */
static void wire_peer(const struct kvb_manager *m, const kvb__xfer_msg_t *x, char *out, size_t len)
{
    if (m->rx_peer_id[0] != '\0')
        snprintf(out, len, "%s", m->rx_peer_id);
    else
        snprintf(out, len, "%.*s:%u", (int)(x->ip_len < KVB_IP_MAX ? x->ip_len : KVB_IP_MAX), x->ip,
                 x->port);
}

static void wire_peer26(const struct kvb_manager *m, const char *ip, size_t ip_len, uint16_t port,
                        char *out, size_t len)
{
    if (m->rx_peer_id[0] != '\0')
        snprintf(out, len, "%s", m->rx_peer_id);
    else
        snprintf(out, len, "%.*s:%u", (int)(ip_len < KVB_IP_MAX ? ip_len : KVB_IP_MAX), ip, port);
}

/* What a destination holds in memory (the wire-room byte cap). */
static uint64_t dst_bytes(const kvb__dst_t *d)
{
    return sizeof(*d) + d->n_pages * (sizeof(int32_t) + (d->mask != NULL)) +
           d->n_state * sizeof(int32_t);
}

static bool msg_is_abort(const kvb__xfer_msg_t *x)
{
    for (size_t i = 0; i < x->n_ext; i++)
        if (x->ext[i].len == 7 && memcmp(x->ext[i].data, "abort=1", 7) == 0)
            return true;
    return false;
}

void kvb__prefill_abort_room(struct kvb_manager *m, kvb__room_t *r, const char *reason);
void kvb__prefill_notify(struct kvb_manager *m, uint64_t room);

/* A decode aborted the room: stop writing; the decode learns that nothing is
 * in flight from the Failed status sent once the writes settled. */
static void on_abort(struct kvb_manager *m, const kvb__xfer_msg_t *x)
{
    char ip[KVB_IP_MAX];
    copy_str(ip, sizeof(ip), x->ip, x->ip_len);
    pthread_mutex_lock(&m->mu);
    char peer[KVB_IP_MAX + 48];
    wire_peer(m, x, peer, sizeof(peer));
    kvb__room_t *r = kvb__room_wire_admit(m, x->room, 0, peer);
    if (r != NULL) {
        snprintf(r->abort_ip, sizeof(r->abort_ip), "%s", ip);
        r->abort_port = x->port;
        kvb__prefill_abort_room(m, r, "Aborted by the decode instance");
    }
    pthread_mutex_unlock(&m->mu);
    kvb__prefill_notify(m, x->room);
}

static void dst_free(kvb__dst_t *d)
{
    free(d->pages);
    free(d->mask);
    free(d->state_idx);
    kvb__ts_plan_destroy(d->ts_plan);
}

/* Put d into room r (m->mu held); d is moved or freed. Once a chunk of the
 * room was queued, its destinations are fixed: a worker plans from the
 * room's page arrays without the lock, and a chunk already written to the
 * old pages cannot follow a new pre-allocation. A changed re-send is then
 * refused (the decode keeps its first pre-allocation). A decode joining a
 * Failed room is still recorded, so the room's Failed status reaches it. */
static void room_put_dst(struct kvb_manager *m, kvb__room_t *r, kvb__dst_t *d)
{
    size_t i = 0;
    for (; r != NULL && i < r->n_dst; i++)
        if (strcmp(r->dsts[i].session, d->session) == 0)
            break;
    bool again = r != NULL && i < r->n_dst;
    if (r != NULL && r->dsts_frozen && (again || r->status != KVB_POLL_FAILED)) {
        KVB_LOGW("manager %s: transfer info of %s for room %llu refused: the room's chunks "
                 "are already being sent to its first destinations",
                 m->endpoint, d->session, (unsigned long long)r->id);
        dst_free(d);
        return;
    }
    kvb__dst_t *grown = r == NULL || again ? NULL : realloc(r->dsts, (r->n_dst + 1) * sizeof(*d));
    if (again) { /* the same decode again: keep the newest pre-allocation */
        dst_free(&r->dsts[i]);
        r->dsts[i] = *d;
    } else if (grown != NULL) {
        r->dsts = grown;
        r->dsts[r->n_dst++] = *d;
    } else {
        dst_free(d);
    }
}

static void on_transfer(struct kvb_manager *m, const kvb__frame_t *f, size_t n)
{
    kvb__xfer_msg_t x;
    kvb__frames_err_t e;
    kvb__dst_t d;
    if (kvb__frames_decode_transfer(f, n, &e, &x) != KVB_OK) {
        kvb__conn_bad_message(m, KVB__MSG_TRANSFER, &e);
        return;
    }
    if (msg_is_abort(&x)) {
        on_abort(m, &x);
        return;
    }
    if (dst_from_msg(&x, &d) != KVB_OK) {
        dst_free(&d);
        return;
    }
    reg_touch(m, d.session);
    pthread_mutex_lock(&m->mu);
    char peer[KVB_IP_MAX + 48];
    wire_peer(m, &x, peer, sizeof(peer));
    kvb__room_t *r = kvb__room_wire_admit(m, x.room, dst_bytes(&d), peer);
    room_put_dst(m, r, &d);
    bool late = false; /* the room already ended Failed here (aborted) */
    char ip[KVB_IP_MAX];
    if (r != NULL) {
        r->required_dst = x.required_dst_info_num;
        if (r->n_dst >= (size_t)r->required_dst)
            kvb__room_set_status(r, KVB_POLL_WAITING_FOR_INPUT);
        late = r->status == KVB_POLL_FAILED && r->fail_notified;
    }
    copy_str(ip, sizeof(ip), x.ip, x.ip_len);
    pthread_mutex_unlock(&m->mu);
    /* A decode whose transfer info arrives after the room ended here is told
     * at once instead of waiting out its waiting time-out. */
    if (late)
        kvb__send_status(m, ip, x.port, x.room, KVB_POLL_FAILED, m->prefill_rank);
}

/* Record a 2026 destination in its room (failing the room when kvbridge
 * cannot serve it) and move the room to WaitingForInput when complete. */
static void on_transfer26(struct kvb_manager *m, const kvb__frame_t *f, size_t n)
{
    kvb__xfer26_msg_t x;
    kvb__frames_err_t e;
    kvb__dst_t d;
    char why[256];
    if (kvb__frames_decode_transfer26(f, n, &e, &x) != KVB_OK) {
        kvb__conn_bad_message(m, KVB__MSG_TRANSFER26, &e);
        return;
    }
    if (dst_from_msg26(m, &x, &d, why, sizeof(why)) != KVB_OK) {
        dst_free(&d);
        return;
    }
    kvb__prefill_add_dst(m, x.room, &d, x.required_dst_info_num, why, x.ip, x.ip_len, x.port);
}

void kvb__prefill_add_dst(struct kvb_manager *m, uint64_t room, kvb__dst_t *d, int32_t required,
                          const char *why, const char *ip, size_t ip_len, uint16_t port)
{
    char peer[KVB_IP_MAX + 48];
    char session[KVB_SID_MAX];
    snprintf(session, sizeof(session), "%s", d->session);
    reg_touch(m, session);
    pthread_mutex_lock(&m->mu);
    wire_peer26(m, ip, ip_len, port, peer, sizeof(peer));
    kvb__room_t *r = kvb__room_wire_admit(m, room, dst_bytes(d), peer);
    /* Told before this decode joined: only it still needs the Failed. Read
     * under the lock that adds it, not after: a sender's poll may notify the
     * room (this decode included) in between, and it must hear once. */
    bool told_before = r != NULL && r->status == KVB_POLL_FAILED && r->fail_notified;
    room_put_dst(m, r, d);
    bool tell = false;
    if (r != NULL) {
        r->required_dst = required;
        if (why[0] != '\0')
            kvb__room_fail(r, "room %llu from decode %s: %s", (unsigned long long)room, session,
                           why);
        if (r->n_dst >= (size_t)r->required_dst)
            kvb__room_set_status(r, KVB_POLL_WAITING_FOR_INPUT);
        tell = r->status == KVB_POLL_FAILED;
    }
    pthread_mutex_unlock(&m->mu);
    if (why[0] != '\0')
        KVB_LOGW("manager %s: room %llu: %s", m->endpoint, (unsigned long long)room, why);
    /* A room that failed here (or before, aborted) tells its decodes now,
     * once nothing of it is in flight (kvb__prefill_notify checks). */
    char host[KVB_IP_MAX];
    copy_str(host, sizeof(host), ip, ip_len);
    if (told_before)
        kvb__send_status(m, host, port, room, KVB_POLL_FAILED, m->prefill_rank);
    else if (tell)
        kvb__prefill_notify(m, room);
}

/* A 2026 decode asked to abort the room: stop writing, and answer
 * ABORT_ACK once no write of the room can land (the same fence as
 * kvbridge's abort=1; the ACK replaces the Failed status to the asker). A
 * room already over (Success and told, or Failed and told) is acknowledged
 * at once. */
static void on_abort26(struct kvb_manager *m, const kvb__frame_t *f, size_t n)
{
    kvb__abort_msg_t a;
    kvb__frames_err_t e;
    char ip[KVB_IP_MAX], peer[KVB_IP_MAX + 48];
    if (kvb__frames_decode_abort(f, n, &e, &a) != KVB_OK) {
        kvb__conn_bad_message(m, KVB__MSG_ABORT, &e);
        return;
    }
    copy_str(ip, sizeof(ip), a.ip, a.ip_len);
    pthread_mutex_lock(&m->mu);
    wire_peer26(m, a.ip, a.ip_len, a.port, peer, sizeof(peer));
    kvb__room_t *r = kvb__room_wire_admit(m, a.room, 0, peer);
    bool ack_now = r == NULL;
    if (r != NULL) {
        snprintf(r->abort_ip, sizeof(r->abort_ip), "%s", ip);
        r->abort_port = a.port;
        r->abort_ack26 = 1;
        r->abort_has_gen = a.has_generation;
        r->abort_gen = a.generation;
        /* A room that already ended Success here fails too (as with
         * abort=1: sender and receiver agree), but its decodes were told
         * Success: only the asker hears back, with the ACK. */
        bool told_success = r->status == KVB_POLL_SUCCESS && !r->success_due;
        kvb__prefill_abort_room(m, r, "Aborted by the decode instance");
        if (told_success)
            r->fail_notified = 1;
        ack_now = r->inflight == 0 && !r->submitting && r->fail_notified;
    }
    pthread_mutex_unlock(&m->mu);
    if (ack_now)
        kvb__send_abort_ack(m, ip, a.port, a.room, m->prefill_rank,
                            a.has_generation ? &a.generation : NULL);
    else
        kvb__prefill_notify(m, a.room);
}

void kvb__prefill_on_message(struct kvb_manager *m, const kvb__frame_t *f, size_t n)
{
    if (kvb__ts_on_message(m, f, n))
        return; /* TokenSpeed (seed 004): told apart per session, prefill_ts.c */
    kvb__msg_kind_t kind = kvb__frames_classify(f, n);
    if (kind == KVB__MSG_REGISTRATION)
        on_registration(m, f, n);
    else if (kind == KVB__MSG_TRANSFER)
        on_transfer(m, f, n);
    else if (kind == KVB__MSG_REGISTRATION26)
        on_registration26(m, f, n);
    else if (kind == KVB__MSG_TRANSFER26)
        on_transfer26(m, f, n);
    else if (kind == KVB__MSG_ABORT)
        on_abort26(m, f, n);
    else if (kind == KVB__MSG_STAGING)
        kvb__conn_unsupported(m, f, n);
    else
        kvb__conn_bad_message(m, kind, NULL);
}

/* What this rank tells the bootstrap server (PUT /route); item and unit are
 * the storage of its length arrays, num_kv entries each: TokenSpeed's decode
 * reads one per KV buffer in its buffer order (PROTOCOL-TOKENSPEED.md 3.2;
 * kvbridge's decode reads the first). The unit is one head of one token for
 * MHA and 1 byte for MLA, as TokenSpeed's pools say (spec 1, 8.2). */
static void registration(struct kvb_manager *m, kvb_bootstrap_registration_t *reg, uint64_t *item,
                         uint64_t *unit)
{
    for (uint32_t i = 0; i < m->args.num_kv; i++) {
        item[i] = m->args.kv_item_len;
        unit[i] = m->p.is_mla ? 1 : item[i] / m->args.page_size / m->args.kv_head_num;
    }
    memset(reg, 0, sizeof(*reg));
    /* The 2026 keys go out only when the client speaks 2026: SGLang's 2026
     * server needs page_size (PROTOCOL-SGLANG-2026.md 3.1). "kvbridge": 1
     * (both dialects; SGLang's servers ignore it) lets a kvbridge decode
     * send this rank its extension frames (docs/protocol-frames.md). */
    reg->field_mask = KVB_BOOTSTRAP_REG_KV_ITEM_LENS | KVB_BOOTSTRAP_REG_KV_UNIT_LENS |
                      KVB_BOOTSTRAP_REG_PAGE_SIZE | KVB_BOOTSTRAP_REG_KVBRIDGE;
    reg->page_size = (int32_t)m->args.page_size;
    if (m->kv_dtype[0] != '\0') { /* a decode of another dtype fails the room */
        reg->field_mask |= KVB_BOOTSTRAP_REG_KV_CACHE_DTYPE;
        reg->kv_cache_dtype = m->kv_dtype;
    }
    reg->attn_tp_size = m->p.attn_tp_size;
    reg->attn_tp_rank = m->p.attn_tp_rank;
    reg->attn_dp_size = m->p.attn_dp_size;
    reg->attn_dp_rank = m->p.attn_dp_rank;
    reg->pp_size = m->p.pp_size;
    reg->pp_rank = m->p.pp_rank;
    reg->system_dp_size = m->p.system_dp_size;
    reg->system_dp_rank = m->p.system_dp_rank;
    reg->rank_ip = m->host;
    reg->rank_port = m->port;
    reg->kv_item_lens = (kvb_bootstrap_lens_t){item, m->args.num_kv};
    reg->kv_unit_lens = (kvb_bootstrap_lens_t){unit, m->args.num_kv};
}

kvb_status_t kvb__prefill_register(struct kvb_manager *m)
{
    kvb_bootstrap_client_h c;
    kvb_bootstrap_registration_t reg;
    uint64_t *lens = calloc(2 * (size_t)m->args.num_kv + 2, sizeof(uint64_t));
    kvb_status_t st =
        lens == NULL ? KVB_ERR_NOMEM : kvb__bootstrap_client(m, m->bootstrap_addr, &c);
    if (st != KVB_OK) {
        free(lens);
        return kvb__err_set(&m->err, st, "bootstrap address \"%s\" is invalid", m->bootstrap_addr);
    }
    registration(m, &reg, lens, lens + m->args.num_kv + 1);
    st = kvb_bootstrap_client_register(c, &reg, 5.0);
    kvb__count_boot(m, st);
    free(lens);
    if (st != KVB_OK)
        kvb__err_set(&m->err, st, "registration with bootstrap server %s failed: %s",
                     m->bootstrap_addr, kvb_bootstrap_client_last_error(c));
    kvb_bootstrap_client_destroy(c);
    return st;
}

/* ---- periodic re-registration ----
 * A bootstrap server that was restarted (kill -9, a new pod on the same
 * address) starts with an empty table; PUT /route is idempotent, so every
 * rank simply registers again every bootstrap_refresh_s. The PUT runs on this
 * thread with a short time-out, never on the control thread or a worker. */

typedef struct refresh {
    kvb_bootstrap_client_h client;
    kvb_bootstrap_registration_t reg;
    uint64_t *lens; /* the registration's item then unit lengths */
    double timeout_s;
    double down_since; /* 0: the last attempt succeeded */
    int attempts;      /* failed attempts of the current outage */
} refresh_t;

static void refresh_once(struct kvb_manager *m, refresh_t *r)
{
    kvb_status_t st = kvb_bootstrap_client_register(r->client, &r->reg, r->timeout_s);
    kvb__count_boot(m, st);
    double now = kvb__now_s();
    if (st != KVB_OK && r->down_since == 0) {
        KVB_LOGW("manager %s: re-registration with bootstrap server %s failed: %s (retried "
                 "every %.3g s; logged once per outage)",
                 m->endpoint, m->bootstrap_addr, kvb_bootstrap_client_last_error(r->client),
                 m->p.bootstrap_refresh_s);
        r->down_since = now;
    }
    if (st != KVB_OK) {
        r->attempts++;
        return;
    }
    if (r->down_since != 0)
        KVB_LOGI("manager %s: registered with bootstrap server %s again after %.1f s (%d failed "
                 "attempts)",
                 m->endpoint, m->bootstrap_addr, now - r->down_since, r->attempts);
    r->down_since = 0;
    r->attempts = 0;
}

static void *refresh_main(void *arg)
{
    struct kvb_manager *m = arg;
    refresh_t r = {0};
    double interval = m->p.bootstrap_refresh_s, next = kvb__now_s() + interval;
    r.lens = calloc(2 * (size_t)m->args.num_kv + 2, sizeof(uint64_t));
    if (r.lens == NULL || kvb__bootstrap_client(m, m->bootstrap_addr, &r.client) != KVB_OK) {
        free(r.lens);
        return NULL; /* the address was valid at creation: out of memory */
    }
    registration(m, &r.reg, r.lens, r.lens + m->args.num_kv + 1);
    r.timeout_s = interval < 1.0 ? interval : 1.0;
    while (!__atomic_load_n(&m->stop, __ATOMIC_ACQUIRE)) {
        double now = kvb__now_s();
        if (now < next) {
            double left = next - now;
            usleep(left < 0.02 ? (useconds_t)(left * 1e6) : 20000);
            continue;
        }
        refresh_once(m, &r);
        next += interval;
        if (next < kvb__now_s())
            next = kvb__now_s() + interval;
    }
    kvb_bootstrap_client_destroy(r.client);
    free(r.lens);
    return NULL;
}

kvb_status_t kvb__prefill_refresh_start(struct kvb_manager *m)
{
    if (!(m->p.bootstrap_refresh_s > 0))
        return KVB_OK;
    if (pthread_create(&m->ref_thr, NULL, refresh_main, m) != 0)
        return kvb__err_set(&m->err, KVB_ERR_IO, "cannot start the bootstrap refresh thread");
    m->ref_started = 1;
    return KVB_OK;
}

void kvb__prefill_refresh_stop(struct kvb_manager *m)
{
    if (m->ref_started)
        pthread_join(m->ref_thr, NULL);
    m->ref_started = 0;
}
