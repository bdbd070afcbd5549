/* Pieces of a manager that every role file (decode, prefill, the dialect
 * files) uses: a malformed message's accounting, this rank's planner
 * layout, writer tags, the bootstrap client. Below the role files and
 * above the room table: nothing here calls a role file or manager.c (no
 * import circle through the manager). */
#include "conn/conn_int.h"

#include <stdlib.h>
#include <string.h>

void kvb__copy_str(char *dst, size_t cap, const char *s, size_t n)
{
    if (n >= cap)
        n = cap - 1;
    memcpy(dst, s, n);
    dst[n] = '\0';
}

uint64_t *kvb__copy_u64_view(kvb__u64_view_t v)
{
    uint64_t *a = malloc((v.count ? v.count : 1) * sizeof(*a));
    for (size_t i = 0; a != NULL && i < v.count; i++)
        a[i] = kvb__u64_at(v, i);
    return a;
}

void *kvb__lazy_table(void **slot, size_t size, bool create)
{
    void *t = __atomic_load_n(slot, __ATOMIC_ACQUIRE);
    if (t != NULL || !create)
        return t;
    t = calloc(1, size);
    if (t == NULL)
        return NULL;
    pthread_mutex_init((pthread_mutex_t *)t, NULL);
    void *expected = NULL;
    if (!__atomic_compare_exchange_n(slot, &expected, t, false, __ATOMIC_ACQ_REL,
                                     __ATOMIC_ACQUIRE)) {
        pthread_mutex_destroy((pthread_mutex_t *)t);
        free(t);
        return expected; /* another thread made it first */
    }
    return t;
}

void kvb__conn_bad_message(struct kvb_manager *m, const char *kind, const kvb__frames_err_t *e)
{
    bool first = true;
    size_t i = 0;
    pthread_mutex_lock(&m->mu);
    m->bad_messages++;
    for (; i < 64 && m->bad_kinds_logged[i] != NULL && first; i++)
        first = strcmp(m->bad_kinds_logged[i], kind) != 0;
    if (first && i < 64)
        m->bad_kinds_logged[i] = kind;
    if (e != NULL && e->has_room) {
        kvb__room_t *r = kvb__room_find(m, e->room);
        if (r != NULL)
            kvb__room_fail(r, "Malformed control message for room %llu: %s",
                           (unsigned long long)e->room, e->reason);
    }
    pthread_mutex_unlock(&m->mu);
    if (first)
        KVB_LOGW("control %s: dropped a malformed %s message: %s (further ones of this kind "
                 "are counted, not logged)",
                 m->endpoint, kind, e != NULL ? e->reason : "unrecognised frames");
}

bool kvb__conn_note_once(struct kvb_manager *m, const char *kind)
{
    for (size_t i = 0; i < sizeof(m->notes_logged) / sizeof(m->notes_logged[0]); i++) {
        const char *seen = NULL;
        if (__atomic_compare_exchange_n(&m->notes_logged[i], &seen, kind, false, __ATOMIC_ACQ_REL,
                                        __ATOMIC_ACQUIRE))
            return true;
        if (seen == kind)
            return false;
    }
    return false;
}

uint32_t kvb__endpoint_tag(const char *ip, uint16_t port)
{
    uint32_t h = 2166136261u; /* FNV-1a over "ip" then the port */
    for (const char *c = ip; *c != '\0'; c++)
        h = (h ^ (uint8_t)*c) * 16777619u;
    h = (h ^ (port & 0xff)) * 16777619u;
    h = (h ^ (port >> 8)) * 16777619u;
    return h != 0 ? h : 1;
}

uint32_t kvb__target_layers(const struct kvb_manager *m)
{
    uint32_t per = m->p.is_mla ? 1 : 2;
    return m->args.num_kv / per - m->p.draft_layers;
}

void kvb__layout_self(struct kvb_manager *m, kvb_plan_layout_t *out)
{
    const kvb_kv_args_t *a = &m->args;
    memset(out, 0, sizeof(*out));
    out->attn = m->p.is_mla ? KVB_PLAN_MLA : KVB_PLAN_MHA;
    out->num_layers = a->num_layers_total;
    out->tp_size = (uint32_t)m->p.attn_tp_size;
    out->tp_rank = (uint32_t)m->p.attn_tp_rank;
    out->page_size = a->page_size;
    out->field_mask = KVB_PLAN_LAYOUT_KV_GEOM | KVB_PLAN_LAYOUT_POOL | KVB_PLAN_LAYOUT_ORDER;
    out->kv_order = (kvb_plan_order_t)a->kv_order;
    out->kv_geom.item_len = a->kv_item_len;
    if (m->p.is_mla) {
        out->kv_geom.unit_len = 0;
        out->kv_geom.axis = KVB_PLAN_AXIS_REPLICATED;
    } else {
        out->kv_geom.unit_len = a->kv_item_len / a->page_size / a->kv_head_num;
        out->kv_geom.axis = KVB_PLAN_AXIS_KV_HEAD;
    }
    out->kv_pool_pages = a->kv_data_lens[0] / a->kv_item_len;
    if (m->mode == KVB_MODE_PREFILL) {
        out->field_mask |= KVB_PLAN_LAYOUT_PP | KVB_PLAN_LAYOUT_STAGE;
        out->pp_size = (uint32_t)m->p.pp_size;
        out->pp_rank = (uint32_t)m->p.pp_rank;
        out->start_layer = a->prefill_start_layer;
        out->stage_layers = kvb__target_layers(m);
    }
    if (m->p.draft_layers > 0) { /* same item geometry as the target's */
        out->field_mask |= KVB_PLAN_LAYOUT_DRAFT_GEOM;
        out->draft_layers = m->p.draft_layers;
        out->draft_geom = out->kv_geom;
    }
    if (a->num_state > 0 && m->state_geom != NULL) {
        out->field_mask |= KVB_PLAN_LAYOUT_STATE;
        out->num_state = a->num_state;
        out->state = m->state_geom;
        out->state_pool_items = UINT64_MAX; /* the smallest buffer bounds every index */
        for (uint32_t i = 0; i < a->num_state; i++) {
            uint64_t items = a->state_data_lens[i] / a->state_item_lens[i];
            out->state_pool_items = items < out->state_pool_items ? items : out->state_pool_items;
        }
    }
    if (a->num_aux > 0) {
        out->field_mask |= KVB_PLAN_LAYOUT_AUX;
        out->num_aux = a->num_aux;
        out->aux_item_lens = m->aux_items;
        out->aux_pool_items = a->aux_data_lens[0] / a->aux_item_lens[0];
    }
}

kvb_status_t kvb__bootstrap_client(struct kvb_manager *m, const char *addr,
                                   kvb_bootstrap_client_h *client_p)
{
    kvb_bootstrap_client_params_t cp = {0};
    cp.field_mask = KVB_BOOTSTRAP_CLIENT_PARAM_DIALECT;
    cp.dialect = m->p.sglang_dialect;
    if (m->bootstrap_token != NULL) {
        cp.field_mask |= KVB_BOOTSTRAP_CLIENT_PARAM_TOKEN;
        cp.token = m->bootstrap_token;
    }
    return kvb_bootstrap_client_create(addr, &cp, client_p);
}
