/* Prefill side, control path: the decode ranks' KV-args registrations,
 * transfer infos and aborts, in whatever dialect they came (each dialect
 * decodes its own into the connector's structs, dialect/dialect.h).
 * Transfer workers are in prefill_xfer.c, statuses in prefill_notify.c, the
 * bootstrap registration in prefill_boot.c. */
#include "dialect/dialect.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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
    /* a kvbridge decode said its page size and order ("kv_layout="): the
     * planner maps rows (docs/planner.md); any other decode is taken as ours */
    if (g->page_size != 0)
        dec->page_size = g->page_size;
    dec->kv_order = (kvb_plan_order_t)g->kv_order;
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

static kvb__reg_t *reg_from_in(struct kvb_manager *m, kvb__reg_in_t *in, uint64_t bytes)
{
    kvb__reg_t *g = calloc(1, sizeof(*g));
    if (g == NULL)
        return NULL;
    g->bytes = bytes;
    kvb__copy_str(g->session, sizeof(g->session), in->session, in->session_len);
    kvb__copy_str(g->ip, sizeof(g->ip), in->ip, in->ip_len);
    g->port = in->port;
    g->kv_ptrs = kvb__copy_u64_view(in->kv);
    g->n_kv = in->kv.count;
    g->aux_ptrs = kvb__copy_u64_view(in->aux);
    g->n_aux = in->aux.count;
    g->state_ptrs = in->state;
    g->n_state = in->n_state;
    in->state = NULL;
    g->tp_rank = in->tp_rank;
    g->tp_size = in->tp_size;
    g->item_len = in->item_len;
    g->has_kv_pool = in->has_pool;
    g->kv_pool = in->pool;
    g->page_size = in->has_layout ? in->page_size : 0;
    g->kv_order = in->has_layout ? in->kv_order : KVB_PLAN_ORDER_NHD;
    g->digest_max = in->digest_max;
    g->dialect = in->dialect;
    g->priv = in->priv;
    in->priv = NULL;
    g->refs = 1;
    snprintf(g->peer_id, sizeof(g->peer_id), "%s", m->rx_peer_id);
    if (in->refuse != NULL) {
        g->plan_error = in->refuse; /* every room to it fails with this reason */
        in->refuse = NULL;
        KVB_LOGW("manager %s: %s", m->endpoint, g->plan_error);
    } else if (!in->dialect->t.plans_chunks) {
        reg_build_plan(m, g); /* else each room brings its plan */
    }
    g->registered_ms = kvb__now_ms();
    return g;
}

/* What a decoded registration still owns. */
static void reg_in_release(kvb__reg_in_t *in)
{
    free(in->state);
    free(in->refuse);
    if (in->priv != NULL)
        in->dialect->reg_free(in->priv);
}

/* Build the record and put it in the table (in's owned fields consumed). */
static void reg_install(struct kvb_manager *m, kvb__reg_in_t *in)
{
    uint64_t bytes = (uint64_t)(in->kv.count + in->aux.count + in->n_state) * 8;
    kvb__reg_t *g = reg_too_big(m, bytes) ? NULL : reg_from_in(m, in, bytes);
    reg_in_release(in);
    if (g == NULL)
        return;
    /* Replace any earlier record of the session: a restarted decode
     * re-registers, which also clears its failure mark. */
    kvb__reg_t *old;
    pthread_rwlock_wrlock(&m->reg_mu);
    kvb__reg_ins_t ins = kvb__reg_insert(m, g, &old);
    uint64_t refused = m->regs_refused;
    pthread_rwlock_unlock(&m->reg_mu);
    kvb__reg_put(old);
    if (ins == KVB__REG_IMPOSTOR)
        KVB_LOGW("manager %s: KV args of %s refused: that session is registered with another "
                 "CURVE key (this one %.8s...)",
                 m->endpoint, g->session, g->peer_id);
    if (ins == KVB__REG_TOO_BIG)
        KVB_LOGW("manager %s: KV args of %s refused: registrations would hold more than %llu "
                 "bytes of pointers (KVBRIDGE_MAX_REGISTRATIONS_BYTES)",
                 m->endpoint, g->session, (unsigned long long)m->max_regs_bytes);
    if (ins == KVB__REG_FULL && (refused & (refused - 1)) == 0) /* logged at powers of two */
        KVB_LOGW("manager %s: KV args of %s refused: %zu registrations in use or new "
                 "(KVBRIDGE_MAX_REGISTRATIONS, KVBRIDGE_REGISTRATION_GRACE); %llu refused so far",
                 m->endpoint, g->session, m->max_regs, (unsigned long long)refused);
    if (ins != KVB__REG_OK) {
        kvb__reg_put(g);
        return;
    }
    KVB_LOGD("manager %s: KV args of %s registered (%s)", m->endpoint, g->session,
             g->dialect->t.name);
}

/* A registration refused by a dialect whose refusal ends the session's
 * rooms in flight (refusal_ends_rooms): they fail with its reason. */
static void refusal_ends_rooms(struct kvb_manager *m, const kvb__dialect_t *d,
                               const kvb__reg_in_t *in)
{
    char sid[KVB_SID_MAX];
    if (in->refuse == NULL || !d->t.refusal_ends_rooms || in->session_len >= KVB_SID_MAX)
        return; /* a session kvbridge cannot name holds no room */
    kvb__copy_str(sid, sizeof(sid), in->session, in->session_len);
    kvb__prefill_fail_session(m, sid, in->refuse);
}

static void on_registration(struct kvb_manager *m, const kvb__dialect_t *d, const kvb__frame_t *f,
                            size_t n)
{
    kvb__reg_in_t in;
    if (d->decode_registration(m, f, n, &in) == KVB_OK) {
        refusal_ends_rooms(m, d, &in);
        reg_install(m, &in);
        return;
    }
    reg_in_release(&in);
}

/* Who named a room (the wire-room caps' fairness): the CURVE key the
 * message came with, else the ip:port its frames claim. */
static void wire_peer(const struct kvb_manager *m, const char *ip, uint16_t port, char *out,
                      size_t len)
{
    if (m->rx_peer_id[0] != '\0')
        snprintf(out, len, "%s", m->rx_peer_id);
    else
        snprintf(out, len, "%s:%u", ip, port);
}

/* What a destination holds in memory (the wire-room byte cap). */
static uint64_t dst_bytes(const kvb__dst_t *d)
{
    return sizeof(*d) + d->n_pages * (sizeof(int32_t) + (d->mask != NULL)) +
           d->n_state * sizeof(int32_t);
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
        kvb__dst_free(d);
        return;
    }
    kvb__dst_t *grown = r == NULL || again ? NULL : realloc(r->dsts, (r->n_dst + 1) * sizeof(*d));
    if (again) { /* the same decode again: keep the newest pre-allocation */
        kvb__dst_free(&r->dsts[i]);
        r->dsts[i] = *d;
    } else if (grown != NULL) {
        r->dsts = grown;
        r->dsts[r->n_dst++] = *d;
    } else {
        kvb__dst_free(d);
    }
}

/* m->mu held: room r has all its destinations; where their dialect checks
 * them together, a set it cannot serve fails the room (every destination
 * hears Failed). */
static void check_fanout(kvb__room_t *r, const kvb__dialect_t *dialect)
{
    char why[KVB__FRAMES_REASON_MAX];
    if (dialect == NULL || dialect->check_fanout == NULL || r->status == KVB_POLL_FAILED)
        return;
    why[0] = '\0';
    dialect->check_fanout(r->dsts, r->n_dst, why, sizeof(why));
    if (why[0] != '\0')
        kvb__room_fail(r, "room %llu: %s", (unsigned long long)r->id, why);
}

/* The room's timeline: when the destination's registration had come (it
 * usually precedes the room; stamped with that time). Not under m->mu
 * (the registration table has its own lock). */
static void note_registration(struct kvb_manager *m, kvb__tl_t *tl, const char *session)
{
    if (tl == NULL)
        return;
    kvb__reg_t *g = kvb__reg_get(m, session);
    if (g != NULL && g->registered_ms > 0)
        kvb__tl_add_at(tl, KVB_EV_REGISTRATION_RECEIVED, (g->registered_ms - 1) * 1000000ull, 0,
                       session);
    kvb__reg_put(g);
}

void kvb__prefill_add_dst(struct kvb_manager *m, uint64_t room, kvb__dst_t *d, int32_t required,
                          const char *why)
{
    const kvb__dialect_t *dialect = d->dialect;
    char peer[KVB_IP_MAX + 48];
    char session[KVB_SID_MAX], host[KVB_IP_MAX];
    uint16_t port = d->port;
    snprintf(session, sizeof(session), "%s", d->session);
    snprintf(host, sizeof(host), "%s", d->ip);
    kvb__reg_touch(m, session);
    pthread_mutex_lock(&m->mu);
    wire_peer(m, host, port, peer, sizeof(peer));
    kvb__room_t *r = kvb__room_wire_admit(m, room, dst_bytes(d), peer);
    /* Told before this decode joined: only it still needs the Failed. Read
     * under the lock that adds it, not after: a sender's poll may notify the
     * room (this decode included) in between, and it must hear once. */
    bool told_before = r != NULL && r->status == KVB_POLL_FAILED && r->fail_notified;
    kvb__tl_t *tl = r != NULL ? kvb__tl_ref(r->tl) : NULL;
    /* under the lock that makes the room ready: before any chunk of it */
    kvb__tl_add_ep(tl, KVB_EV_TRANSFER_INFO_RECEIVED, 0, host, port);
    room_put_dst(m, r, d);
    bool tell = false;
    if (r != NULL) {
        r->required_dst = required;
        if (why[0] != '\0')
            kvb__room_fail(r, "room %llu from decode %s: %s", (unsigned long long)room, session,
                           why);
        if (r->n_dst >= (size_t)r->required_dst)
            check_fanout(r, dialect);
        if (r->n_dst >= (size_t)r->required_dst)
            kvb__room_set_status(r, KVB_POLL_WAITING_FOR_INPUT);
        tell = r->status == KVB_POLL_FAILED;
    }
    pthread_mutex_unlock(&m->mu);
    note_registration(m, tl, session);
    if (why[0] != '\0')
        KVB_LOGW("manager %s: room %llu: %s", m->endpoint, (unsigned long long)room, why);
    /* A room that failed here (or before, aborted) tells its decodes now,
     * once nothing of it is in flight (kvb__prefill_notify checks). */
    if (told_before)
        kvb__tl_add_ep(tl, KVB_EV_STATUS_SENT,
                       kvb__send_status(m, host, port, room, KVB_POLL_FAILED, m->prefill_rank) ==
                               KVB_OK
                           ? KVB_POLL_FAILED
                           : -1,
                       host, port);
    else if (tell)
        kvb__prefill_notify(m, room);
    kvb__tl_put(tl);
}

/* A decode asked to abort the room: stop writing. via: the dialect whose
 * abort message it was, answered with its ABORT_ACK once no write of the
 * room can land; NULL (kvbridge's abort=1): the Failed status sent once the
 * writes settled says so. A room already over is acknowledged at once. */
static void abort_room(struct kvb_manager *m, const kvb__abort_in_t *a, const kvb__dialect_t *via)
{
    char peer[KVB_IP_MAX + 48];
    pthread_mutex_lock(&m->mu);
    wire_peer(m, a->ip, a->port, peer, sizeof(peer));
    kvb__room_t *r = kvb__room_wire_admit(m, a->room, 0, peer);
    bool ack_now = r == NULL && via != NULL;
    kvb__tl_t *tl = r != NULL ? kvb__tl_ref(r->tl) : NULL;
    kvb__tl_add_ep(tl, KVB_EV_ABORT_RECEIVED, 0, a->ip, a->port);
    if (r != NULL) {
        snprintf(r->abort_ip, sizeof(r->abort_ip), "%s", a->ip);
        r->abort_port = a->port;
        r->abort_via = via;
        r->abort_has_gen = a->has_generation;
        r->abort_gen = a->generation;
        /* A room that already ended Success here fails too (sender and
         * receiver agree), but its decodes were told Success: with an
         * abort message only the asker hears back, with the ACK. */
        bool told_success = r->status == KVB_POLL_SUCCESS && !r->success_due;
        kvb__prefill_abort_room(m, r, "Aborted by the decode instance");
        if (told_success && via != NULL)
            r->fail_notified = 1;
        ack_now = via != NULL && r->inflight == 0 && !r->submitting && r->fail_notified;
    }
    pthread_mutex_unlock(&m->mu);
    if (ack_now)
        kvb__tl_add_ep(tl, KVB_EV_ABORT_ACK_SENT,
                       via->send_abort_ack(m, a->ip, a->port, a->room, m->prefill_rank,
                                           a->has_generation ? &a->generation : NULL),
                       a->ip, a->port);
    else
        kvb__prefill_notify(m, a->room);
    kvb__tl_put(tl);
}

static void on_transfer(struct kvb_manager *m, const kvb__dialect_t *d, const kvb__frame_t *f,
                        size_t n)
{
    kvb__xfer_in_t x;
    kvb_status_t st = d->take_transfer(m, f, n, &x);
    if (st == KVB_OK && x.is_abort) {
        kvb__abort_in_t a = {x.room, "", x.d.port, false, 0};
        snprintf(a.ip, sizeof(a.ip), "%s", x.d.ip);
        abort_room(m, &a, NULL);
    } else if (st == KVB_OK || (st == KVB_ERR_PROTO && x.d.session[0] != '\0')) {
        kvb__prefill_add_dst(m, x.room, &x.d, x.required, x.why);
    } else {
        kvb__dst_free(&x.d);
    }
}

static void on_abort(struct kvb_manager *m, const kvb__dialect_t *d, const kvb__frame_t *f,
                     size_t n)
{
    kvb__abort_in_t a;
    if (d->decode_abort(m, f, n, &a) == KVB_OK)
        abort_room(m, &a, d);
}

void kvb__prefill_on_message(struct kvb_manager *m, const kvb__frame_t *f, size_t n)
{
    kvb__dmsg_t kind;
    const kvb__dialect_t *d = kvb__dialect_classify(m, f, n, &kind);
    if (kind == KVB__DMSG_REGISTRATION)
        on_registration(m, d, f, n);
    else if (kind == KVB__DMSG_TRANSFER)
        on_transfer(m, d, f, n);
    else if (kind == KVB__DMSG_ABORT)
        on_abort(m, d, f, n);
    else if (kind == KVB__DMSG_UNSUPPORTED)
        d->unsupported(m, f, n);
    else
        kvb__dialect_unexpected(m, f, n);
}
