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

/* A registration to drop so a new one fits (reg_mu held for writing), in
 * this order: one whose decode failed; the oldest no room ever used (a
 * flood of bogus sessions displaces only its own kind); the longest idle
 * past the room TTL. NULL: every entry is in use, refuse the newcomer. */
static kvb__reg_t **reg_victim(struct kvb_manager *m)
{
    kvb__reg_t **best[3] = {NULL, NULL, NULL};
    uint64_t now = now_ms(), ttl = (uint64_t)(m->p.room_ttl_s * 1000);
    for (kvb__reg_t **pp = &m->regs; *pp != NULL; pp = &(*pp)->next) {
        kvb__reg_t *g = *pp;
        uint64_t used = __atomic_load_n(&g->used_ms, __ATOMIC_RELAXED);
        if (__atomic_load_n(&g->refs, __ATOMIC_ACQUIRE) != 1)
            continue; /* a room's job holds it */
        if (__atomic_load_n(&g->failed, __ATOMIC_ACQUIRE))
            return pp;
        if (used == 0 && (best[1] == NULL || g->registered_ms < (*best[1])->registered_ms))
            best[1] = pp;
        if (used != 0 && now - used > ttl &&
            (best[2] == NULL || used < __atomic_load_n(&(*best[2])->used_ms, __ATOMIC_RELAXED)))
            best[2] = pp;
    }
    return best[1] != NULL ? best[1] : best[2];
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
        kvb__reg_t **pp = reg_victim(m);
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
    if (*pp != NULL)
        *old_p = reg_unlink(m, pp);
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
    dec->num_layers = (uint32_t)(m->p.is_mla ? g->n_kv : g->n_kv / 2);
    pre->num_layers = dec->num_layers; /* the decode holds every layer */
    dec->tp_size = (uint32_t)g->tp_size;
    dec->tp_rank = (uint32_t)(g->tp_rank % g->tp_size);
    dec->kv_geom.item_len = (uint64_t)g->item_len;
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

static void reg_build_plan(struct kvb_manager *m, kvb__reg_t *g)
{
    kvb_plan_layout_t pre, dec;
    char buf[512];
    if (!m->p.is_mla && g->n_kv % 2 != 0) {
        snprintf(buf, sizeof(buf), "decode %s registered %zu KV buffers (odd, MHA needs K and V)",
                 g->session, g->n_kv);
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
static bool reg_kv_pool(const kvb__reg_msg_t *msg, bool *has_p, uint64_t *pool_p,
                        kvb__frames_err_t *e)
{
    static const char key[] = "kv_lens=";
    const size_t kl = sizeof(key) - 1;
    *has_p = false;
    *pool_p = 0;
    for (size_t i = 0; i < msg->n_ext; i++) {
        const kvb__frame_t *x = &msg->ext[i];
        if (x->len < kl || memcmp(x->data, key, kl) != 0)
            continue;
        if (x->len - kl != msg->kv_ptrs.count * 8) {
            snprintf(e->reason, sizeof(e->reason),
                     "registration: extension kv_lens has %zu bytes, %zu KV buffers need %zu",
                     x->len - kl, msg->kv_ptrs.count, msg->kv_ptrs.count * 8);
            e->has_room = false;
            return false;
        }
        kvb__u64_view_t v = {x->data + kl, msg->kv_ptrs.count};
        uint64_t pool = UINT64_MAX;
        for (size_t k = 0; k < v.count; k++)
            if (kvb__u64_at(v, k) / (uint64_t)msg->dst_kv_item_len < pool)
                pool = kvb__u64_at(v, k) / (uint64_t)msg->dst_kv_item_len;
        *pool_p = pool;
        *has_p = true;
        return true;
    }
    return true;
}

static void on_registration(struct kvb_manager *m, const kvb__frame_t *f, size_t n)
{
    kvb__reg_msg_t msg;
    kvb__frames_err_t e;
    uint64_t pool;
    bool has_pool;
    if (kvb__frames_decode_registration(f, n, &e, &msg) != KVB_OK ||
        !reg_kv_pool(&msg, &has_pool, &pool, &e)) {
        kvb__conn_bad_message(m, KVB__MSG_REGISTRATION, &e);
        return;
    }
    uint64_t bytes = (uint64_t)(msg.kv_ptrs.count + msg.aux_ptrs.count +
                                (msg.has_state_ptrs ? msg.state_ptrs.count : 0)) *
                     8;
    if (bytes > m->max_reg_bytes) { /* refused before anything is copied */
        pthread_rwlock_wrlock(&m->reg_mu);
        uint64_t k = ++m->regs_too_big;
        pthread_rwlock_unlock(&m->reg_mu);
        if ((k & (k - 1)) == 0)
            KVB_LOGW("manager %s: KV args with %llu bytes of pointers refused "
                     "(KVBRIDGE_MAX_REGISTRATION_BYTES %llu); %llu so far",
                     m->endpoint, (unsigned long long)bytes, (unsigned long long)m->max_reg_bytes,
                     (unsigned long long)k);
        return;
    }
    kvb__reg_t *g = calloc(1, sizeof(*g));
    if (g == NULL)
        return;
    g->bytes = bytes;
    copy_str(g->session, sizeof(g->session), msg.session_id, msg.session_id_len);
    copy_str(g->ip, sizeof(g->ip), msg.ip, msg.ip_len);
    g->port = msg.port;
    g->kv_ptrs = copy_u64_view(msg.kv_ptrs);
    g->n_kv = msg.kv_ptrs.count;
    g->aux_ptrs = copy_u64_view(msg.aux_ptrs);
    g->n_aux = msg.aux_ptrs.count;
    g->state_ptrs = msg.has_state_ptrs ? copy_u64_view(msg.state_ptrs) : NULL;
    g->n_state = msg.has_state_ptrs ? msg.state_ptrs.count : 0;
    g->tp_rank = msg.dst_tp_rank;
    g->tp_size = msg.dst_attn_tp_size;
    g->item_len = msg.dst_kv_item_len;
    g->has_kv_pool = has_pool;
    g->kv_pool = pool;
    g->refs = 1;
    snprintf(g->peer_id, sizeof(g->peer_id), "%s", m->rx_peer_id);
    reg_build_plan(m, g);
    g->registered_ms = now_ms();
    /* Replace any earlier record of the session: a restarted decode
     * re-registers, which also clears its failure mark. */
    kvb__reg_t *old;
    pthread_rwlock_wrlock(&m->reg_mu);
    reg_ins_t ins = reg_insert(m, g, &old);
    pthread_rwlock_unlock(&m->reg_mu);
    kvb__reg_put(old);
    if (ins == REG_IMPOSTOR)
        KVB_LOGW("manager %s: KV args of %s refused: that session is registered with another "
                 "CURVE key (this one %.8s...)",
                 m->endpoint, g->session, g->peer_id);
    if (ins == REG_IMPOSTOR || ins == REG_TOO_BIG) {
        kvb__reg_put(g);
        return;
    }
    if (ins == REG_TOO_BIG)
        KVB_LOGW("manager %s: KV args of %s refused: registrations would hold more than %llu "
                 "bytes of pointers (KVBRIDGE_MAX_REGISTRATIONS_BYTES)",
                 m->endpoint, g->session, (unsigned long long)m->max_regs_bytes);
    if (ins == REG_FULL) {
        KVB_LOGW("manager %s: KV args of %s refused: %zu registrations in use "
                 "(KVBRIDGE_MAX_REGISTRATIONS)",
                 m->endpoint, g->session, m->max_regs);
        kvb__reg_put(g);
        return;
    }
    KVB_LOGD("manager %s: KV args of %s registered", m->endpoint, g->session);
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

void kvb__prefill_on_message(struct kvb_manager *m, const kvb__frame_t *f, size_t n)
{
    kvb__msg_kind_t kind = kvb__frames_classify(f, n);
    if (kind == KVB__MSG_REGISTRATION)
        on_registration(m, f, n);
    else if (kind == KVB__MSG_TRANSFER)
        on_transfer(m, f, n);
    else
        kvb__conn_bad_message(m, kind, NULL);
}

/* What this rank tells the bootstrap server (PUT /route); item and unit are
 * the storage of its length arrays. */
static void registration(struct kvb_manager *m, kvb_bootstrap_registration_t *reg, uint64_t *item,
                         uint64_t *unit)
{
    *item = m->args.kv_item_len;
    *unit =
        m->p.is_mla ? *item / m->args.page_size : *item / m->args.page_size / m->args.kv_head_num;
    memset(reg, 0, sizeof(*reg));
    /* The 2026 keys go out only when the client speaks 2026: SGLang's 2026
     * server needs page_size (PROTOCOL-SGLANG-2026.md 3.1). */
    reg->field_mask = KVB_BOOTSTRAP_REG_KV_ITEM_LENS | KVB_BOOTSTRAP_REG_KV_UNIT_LENS |
                      KVB_BOOTSTRAP_REG_PAGE_SIZE;
    reg->page_size = (int32_t)m->args.page_size;
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
    reg->kv_item_lens = (kvb_bootstrap_lens_t){item, 1};
    reg->kv_unit_lens = (kvb_bootstrap_lens_t){unit, 1};
}

kvb_status_t kvb__prefill_register(struct kvb_manager *m)
{
    kvb_bootstrap_client_h c;
    kvb_bootstrap_registration_t reg;
    uint64_t item, unit;
    kvb_status_t st = kvb__bootstrap_client(m, m->bootstrap_addr, &c);
    if (st != KVB_OK)
        return kvb__err_set(&m->err, st, "bootstrap address \"%s\" is invalid", m->bootstrap_addr);
    registration(m, &reg, &item, &unit);
    st = kvb_bootstrap_client_register(c, &reg, 5.0);
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
    uint64_t item, unit;
    double timeout_s;
    double down_since; /* 0: the last attempt succeeded */
    int attempts;      /* failed attempts of the current outage */
} refresh_t;

static void refresh_once(struct kvb_manager *m, refresh_t *r)
{
    kvb_status_t st = kvb_bootstrap_client_register(r->client, &r->reg, r->timeout_s);
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
    if (kvb__bootstrap_client(m, m->bootstrap_addr, &r.client) != KVB_OK)
        return NULL; /* the address was valid at creation: out of memory */
    registration(m, &r.reg, &r.item, &r.unit);
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
