/* Decode side: receivers, route resolution through the bootstrap server
 * (cached per address), KV-args registration, statuses and inline aux from
 * the prefill ranks, heartbeats, and the abort fence. */
#include "conn/conn_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define FAIL_FROM_PREFILL "Failed to get kvcache from prefill instance, it might be dead"

/* ---- caches (m->mu held unless stated) ---- */

static kvb__addr_t *addr_get(struct kvb_manager *m, const char *addr)
{
    kvb__addr_t *a;
    for (a = m->addrs; a != NULL; a = a->next)
        if (strcmp(a->addr, addr) == 0)
            return a;
    a = calloc(1, sizeof(*a));
    if (a == NULL || (a->addr = strdup(addr)) == NULL ||
        kvb__bootstrap_client(m, addr, &a->client) != KVB_OK ||
        kvb__bootstrap_client(m, addr, &a->hb) != KVB_OK) {
        if (a != NULL) {
            kvb_bootstrap_client_destroy(a->client);
            free(a->addr);
        }
        free(a);
        return NULL;
    }
    pthread_mutex_init(&a->client_mu, NULL);
    a->next = m->addrs;
    m->addrs = a;
    return a;
}

static void addr_forget(kvb__addr_t *a)
{
    for (kvb__route_t *r = a->routes, *next; r != NULL; r = next) {
        next = r->next;
        free(r);
    }
    a->routes = NULL;
    kvb_plan_destroy(a->plan);
    a->plan = NULL;
    if (a->have_info)
        kvb_bootstrap_parallel_info_free(&a->info);
    a->have_info = 0;
}

static kvb__route_t *route_find(kvb__addr_t *a, int32_t dp, int32_t tp, int32_t pp)
{
    for (kvb__route_t *r = a->routes; r != NULL; r = r->next)
        if (r->dp == dp && r->tp == tp && r->pp == pp)
            return r;
    return NULL;
}

/* The prefill rank-0 layout as the bootstrap server describes it; geometry
 * it does not carry (a seed-001 prefill) is assumed to match ours. */
static void prefill_layout(struct kvb_manager *m, const kvb_bootstrap_parallel_info_t *info,
                           kvb_plan_layout_t *out)
{
    kvb__layout_self(m, out);
    out->field_mask &= ~(uint64_t)KVB_PLAN_LAYOUT_POOL;
    out->field_mask |= KVB_PLAN_LAYOUT_PP;
    out->tp_size = (uint32_t)info->attn_tp_size;
    out->tp_rank = 0;
    out->pp_size = (uint32_t)info->pp_size;
    out->pp_rank = 0;
    if (info->kv_item_lens.count > 0)
        out->kv_geom.item_len = info->kv_item_lens.values[0];
    else if (!m->p.is_mla &&
             (m->args.kv_item_len * (uint64_t)m->p.attn_tp_size) % (uint64_t)info->attn_tp_size ==
                 0)
        out->kv_geom.item_len =
            m->args.kv_item_len * (uint64_t)m->p.attn_tp_size / (uint64_t)info->attn_tp_size;
    if (!m->p.is_mla && info->kv_unit_lens.count > 0)
        out->kv_geom.unit_len = info->kv_unit_lens.values[0];
}

/* ---- receiver creation ---- */

typedef struct resolve {
    kvb_plan_route_t route;
    kvb__src_t *srcs;
    size_t n_srcs;
    int32_t dp_group;
    char why[512];
} resolve_t;

static kvb_status_t fetch_info(struct kvb_manager *m, kvb__addr_t *a, resolve_t *rs)
{
    kvb_bootstrap_parallel_info_t info;
    kvb_plan_layout_t pre, dec;
    kvb_plan_h plan = NULL;
    pthread_mutex_lock(&m->mu);
    int have = a->have_info;
    pthread_mutex_unlock(&m->mu);
    if (have)
        return KVB_OK;
    pthread_mutex_lock(&a->client_mu);
    kvb_status_t st = kvb_bootstrap_client_parallel_info(a->client, 5.0, &info);
    pthread_mutex_unlock(&a->client_mu);
    if (st != KVB_OK) {
        snprintf(rs->why, sizeof(rs->why),
                 "Could not fetch prefill parallel info from bootstrap_addr: %s", a->addr);
        return st;
    }
    prefill_layout(m, &info, &pre);
    kvb__layout_self(m, &dec);
    /* Routes follow the KV geometry; state pairs up rank by rank (the prefill
     * checks its TP size against ours). */
    pre.field_mask &= ~(uint64_t)KVB_PLAN_LAYOUT_STATE;
    dec.field_mask &= ~(uint64_t)KVB_PLAN_LAYOUT_STATE;
    pre.num_state = dec.num_state = 0;
    if (kvb_plan_create(&pre, &dec, &plan) != KVB_OK) {
        snprintf(rs->why, sizeof(rs->why), "prefill at %s cannot serve this decode rank: %s",
                 a->addr, kvb_plan_last_error());
        kvb_bootstrap_parallel_info_free(&info);
        return KVB_ERR_INVALID;
    }
    pthread_mutex_lock(&m->mu);
    if (!a->have_info) {
        a->info = info;
        a->plan = plan;
        a->have_info = 1;
        a->failures = 0;
    } else {
        kvb_bootstrap_parallel_info_free(&info);
        kvb_plan_destroy(plan);
    }
    pthread_mutex_unlock(&m->mu);
    return KVB_OK;
}

/* The "kv_lens=" registration extension: this rank's KV buffer lengths
 * (packed u64, kv_args order), so the prefill can refuse destination pages
 * past the end of a buffer before writing anything. *f points into *buf_p. */
static kvb_status_t kv_lens_ext(const struct kvb_manager *m, uint8_t **buf_p, kvb__frame_t *f)
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

static kvb_status_t send_registration(struct kvb_manager *m, const char *ip, uint16_t port)
{
    kvb__frames_buf_t b;
    kvb__frames_err_t e;
    kvb__reg_msg_t r = {0};
    kvb__frame_t lens;
    uint8_t *lens_buf = NULL;
    if (kv_lens_ext(m, &lens_buf, &lens) != KVB_OK)
        return KVB_ERR_NOMEM;
    r.ext = &lens;
    r.n_ext = 1;
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

/* Resolve (dp, tp, pp) to the prefill rank's control endpoint, register our
 * KV args there once. */
static kvb_status_t resolve_one(struct kvb_manager *m, kvb__addr_t *a, int32_t dp, int32_t tp,
                                int32_t pp, kvb__src_t *out, resolve_t *rs)
{
    kvb_bootstrap_rank_addr_t ra;
    pthread_mutex_lock(&m->mu);
    kvb__route_t *r = route_find(a, dp, tp, pp);
    if (r != NULL) {
        snprintf(out->ip, sizeof(out->ip), "%s", r->ip);
        out->port = r->port;
    }
    pthread_mutex_unlock(&m->mu);
    if (r != NULL)
        return KVB_OK;
    pthread_mutex_lock(&a->client_mu);
    kvb_status_t st = kvb_bootstrap_client_lookup(a->client, dp, tp, pp, 5.0, &ra);
    pthread_mutex_unlock(&a->client_mu);
    if (st != KVB_OK) {
        snprintf(rs->why, sizeof(rs->why),
                 "Could not fetch bootstrap info for engine rank: %d and target_dp_group: %d "
                 "and target_pp_rank %d",
                 m->args.engine_rank, dp, pp);
        return st;
    }
    kvb_engine_fence_writer(m->engine, kvb__endpoint_tag(ra.rank_ip, ra.rank_port), 0);
    st = send_registration(m, ra.rank_ip, ra.rank_port);
    if (st != KVB_OK) {
        snprintf(rs->why, sizeof(rs->why), "KV args not delivered to prefill %s:%u", ra.rank_ip,
                 ra.rank_port);
        return st;
    }
    snprintf(out->ip, sizeof(out->ip), "%s", ra.rank_ip);
    out->port = ra.rank_port;
    pthread_mutex_lock(&m->mu);
    if (a->have_info && route_find(a, dp, tp, pp) == NULL && (r = calloc(1, sizeof(*r))) != NULL) {
        *r = (kvb__route_t){dp, tp, pp, "", ra.rank_port, 1, a->routes};
        snprintf(r->ip, sizeof(r->ip), "%s", ra.rank_ip);
        a->routes = r;
    }
    pthread_mutex_unlock(&m->mu);
    return KVB_OK;
}

static kvb_status_t resolve(struct kvb_manager *m, kvb__addr_t *a, uint64_t room, int32_t dp_rank,
                            resolve_t *rs)
{
    kvb_status_t st = fetch_info(m, a, rs);
    if (st != KVB_OK)
        return st;
    pthread_mutex_lock(&m->mu);
    int32_t pp = a->info.pp_size, dp = a->info.dp_size;
    st = a->have_info ? kvb_plan_route(a->plan, (uint32_t)m->p.attn_tp_rank, &rs->route)
                      : KVB_ERR_STATE;
    pthread_mutex_unlock(&m->mu);
    if (st != KVB_OK) {
        snprintf(rs->why, sizeof(rs->why), "no route from prefill %s: %s", a->addr,
                 kvb_plan_last_error());
        return st;
    }
    rs->dp_group = dp_rank >= 0 ? dp_rank : (int32_t)(room % (uint64_t)dp);
    rs->srcs = calloc((size_t)rs->route.num_sources * (size_t)pp + 1, sizeof(*rs->srcs));
    if (rs->srcs == NULL)
        return KVB_ERR_NOMEM;
    for (uint32_t i = 0; i < rs->route.num_sources; i++)
        for (int32_t p = 0; p < pp; p++) {
            kvb__src_t *s = &rs->srcs[rs->n_srcs++];
            const kvb_plan_source_t *ps = &rs->route.sources[i];
            s->tp_rank = ps->prefill_rank;
            s->pp_rank = (uint32_t)p;
            s->dummy = (int)ps->dummy;
            s->required_dst_info_num = ps->required_dst_info_num;
            st = resolve_one(m, a, rs->dp_group, (int32_t)ps->prefill_rank, p, s, rs);
            if (st != KVB_OK)
                return st;
        }
    return KVB_OK;
}

kvb_status_t kvb_receiver_create(kvb_manager_h m, const char *bootstrap_addr, uint64_t room,
                                 int32_t dp_rank, kvb_receiver_h *receiver_p)
{
    resolve_t rs;
    if (m == NULL || receiver_p == NULL || m->mode != KVB_MODE_DECODE)
        return KVB_ERR_STATE;
    if (bootstrap_addr == NULL)
        return KVB_ERR_INVALID;
    kvb_receiver_h rc = calloc(1, sizeof(*rc));
    if (rc == NULL)
        return KVB_ERR_NOMEM;
    pthread_mutex_lock(&m->mu);
    kvb__room_t *r = kvb__room_get(m, room);
    kvb__addr_t *a = addr_get(m, bootstrap_addr);
    kvb_status_t st = r == NULL || a == NULL ? KVB_ERR_NOMEM
                      : r->has_handle        ? KVB_ERR_STATE
                                             : KVB_OK;
    if (st == KVB_OK) {
        r->has_handle = 1;
        r->bootstrap_addr = strdup(bootstrap_addr);
        kvb__room_set_status(r, KVB_POLL_BOOTSTRAPPING);
    }
    pthread_mutex_unlock(&m->mu);
    if (st != KVB_OK) {
        free(rc);
        return kvb__err_set(&m->err, st, "room %llu: receiver exists or out of memory",
                            (unsigned long long)room);
    }
    memset(&rs, 0, sizeof(rs));
    st = resolve(m, a, room, dp_rank, &rs);
    pthread_mutex_lock(&m->mu);
    if (st != KVB_OK) {
        kvb__room_fail(r, "%s", rs.why);
        free(rs.srcs);
    } else {
        r->srcs = rs.srcs;
        r->n_src = rs.n_srcs;
        r->required_responses = rs.route.required_prefill_response_num;
        kvb__room_set_status(r, KVB_POLL_WAITING_FOR_INPUT);
    }
    pthread_mutex_unlock(&m->mu);
    rc->mgr = m;
    rc->room = room;
    *receiver_p = rc;
    return KVB_OK;
}

/* ---- init and abort messages ---- */

static kvb_status_t send_transfer(struct kvb_manager *m, const kvb__src_t *s, uint64_t room,
                                  const int32_t *idx, size_t n, int64_t aux,
                                  const kvb_receiver_init_t *ex, bool abort)
{
    kvb__frames_buf_t b;
    kvb__frames_err_t e;
    kvb__xfer_msg_t x = {0};
    kvb__frame_t ext = {(const uint8_t *)"abort=1", 7};
    const char *sid = kvb_engine_session_id(m->engine);
    bool dummy = s->dummy || abort;
    x.room = room;
    x.ip = m->host;
    x.ip_len = strlen(m->host);
    x.port = m->port;
    x.session_id = sid;
    x.session_id_len = strlen(sid);
    x.is_dummy = dummy;
    x.pages = dummy ? kvb__i32_view_of(NULL, 0) : kvb__i32_view_of(idx, n);
    x.aux_index = dummy ? -1 : (int32_t)aux;
    x.required_dst_info_num = (int32_t)s->required_dst_info_num;
    if (!dummy && ex != NULL && (ex->field_mask & KVB_RECV_INIT_MASK) && ex->page_mask) {
        x.has_page_mask = true;
        x.page_mask = ex->page_mask;
    }
    if (!dummy && ex != NULL && (ex->field_mask & KVB_RECV_INIT_PREFIX)) {
        x.has_prefix_len = true;
        x.prefix_len = (int64_t)ex->prefix_tokens;
    }
    if (!dummy && ex != NULL && (ex->field_mask & KVB_RECV_INIT_STATE) &&
        ex->num_state_indices > 0 && ex->state_indices != NULL) {
        x.has_state_idx = true;
        x.state_idx = kvb__i32_view_of(ex->state_indices, ex->num_state_indices);
    }
    if (abort) {
        x.ext = &ext;
        x.n_ext = 1;
    }
    kvb__frames_buf_init(&b);
    kvb_status_t st = kvb__frames_encode_transfer(&x, &e, &b);
    if (st != KVB_OK)
        KVB_LOGW("manager %s: transfer info for room %llu not encodable: %s", m->endpoint,
                 (unsigned long long)room, e.reason);
    else
        st = kvb__zsend(&m->zc, s->ip, s->port, &b);
    kvb__frames_buf_free(&b);
    return st;
}

static uint32_t src_key(uint32_t tp, uint32_t pp)
{
    return tp * 1000003u + pp;
}

/* m->mu held: the room failed after init; ask every real source that has
 * not answered to stop, and hold the terminal report until they confirm. */
static void open_fence(struct kvb_manager *m, kvb__room_t *r, kvb__src_t **todo, size_t *n_todo)
{
    *todo = NULL;
    *n_todo = 0;
    if (r->fence_open || r->t_init == 0 || r->lost)
        return;
    r->fence_open = 1;
    *todo = calloc(r->n_src + 1, sizeof(**todo));
    for (size_t i = 0; *todo != NULL && i < r->n_src; i++) {
        uint32_t key = src_key(r->srcs[i].tp_rank, r->srcs[i].pp_rank);
        bool answered = false;
        for (size_t k = 0; k < r->n_responded; k++)
            answered |= r->responded[k] == key;
        if (!r->srcs[i].dummy && !answered)
            (*todo)[(*n_todo)++] = r->srcs[i];
    }
}

static void send_aborts(struct kvb_manager *m, uint64_t room, kvb__src_t *todo, size_t n)
{
    for (size_t i = 0; i < n; i++)
        send_transfer(m, &todo[i], room, NULL, 0, -1, NULL, true);
    free(todo);
}

/* Pages every KV buffer of this rank holds: an index at or past it would
 * land past the end of the smallest buffer (in the next buffer when they
 * are adjacent slices of one allocation). */
static uint64_t kv_pool_pages(const struct kvb_manager *m)
{
    uint64_t pool = UINT64_MAX;
    for (uint32_t i = 0; i < m->args.num_kv; i++)
        if (m->kv_lens[i] / m->args.kv_item_len < pool)
            pool = m->kv_lens[i] / m->args.kv_item_len;
    return pool == UINT64_MAX ? 0 : pool;
}

/* Every destination page the prefill will write (page mask 1, or no mask)
 * must lie in this rank's pool; otherwise the room fails with why and
 * nothing is sent. */
static bool pages_in_pool(struct kvb_manager *m, uint64_t room, const int32_t *idx, size_t n,
                          const kvb_receiver_init_t *ex)
{
    const uint8_t *mask =
        ex != NULL && (ex->field_mask & KVB_RECV_INIT_MASK) ? ex->page_mask : NULL;
    uint64_t pool = kv_pool_pages(m);
    for (size_t i = 0; i < n; i++) {
        if ((mask != NULL && !mask[i]) || (idx[i] >= 0 && (uint64_t)idx[i] < pool))
            continue;
        pthread_mutex_lock(&m->mu);
        kvb__room_t *r = kvb__room_find(m, room);
        if (r != NULL)
            kvb__room_fail(r,
                           "room %llu: destination page index %d (entry %zu) is outside this "
                           "decode rank's KV pool of %llu pages; nothing was sent",
                           (unsigned long long)room, (int)idx[i], i, (unsigned long long)pool);
        pthread_mutex_unlock(&m->mu);
        KVB_LOGW("manager %s: room %llu: destination page index %d (entry %zu) outside the KV "
                 "pool of %llu pages",
                 m->endpoint, (unsigned long long)room, (int)idx[i], i, (unsigned long long)pool);
        return false;
    }
    return true;
}

kvb_status_t kvb_receiver_init(kvb_receiver_h rc, const int32_t *indices, size_t count,
                               int64_t aux_index, const kvb_receiver_init_t *extra)
{
    struct kvb_manager *m = rc != NULL ? rc->mgr : NULL;
    kvb__src_t *srcs = NULL;
    size_t n = 0;
    if (m == NULL || (indices == NULL && count > 0))
        return KVB_ERR_INVALID;
    if (!pages_in_pool(m, rc->room, indices, count, extra))
        return KVB_ERR_INVALID;
    pthread_mutex_lock(&m->mu);
    kvb__room_t *r = kvb__room_find(m, rc->room);
    if (r != NULL && r->status != KVB_POLL_FAILED && r->n_src > 0) {
        srcs = malloc(r->n_src * sizeof(*srcs));
        if (srcs != NULL) {
            memcpy(srcs, r->srcs, r->n_src * sizeof(*srcs));
            n = r->n_src;
        }
        r->t_init = kvb__now_s();
    }
    pthread_mutex_unlock(&m->mu);
    kvb_status_t st = KVB_OK;
    for (size_t i = 0; i < n && st == KVB_OK; i++)
        st = send_transfer(m, &srcs[i], rc->room, indices, count, aux_index, extra, false);
    free(srcs);
    if (st != KVB_OK) {
        pthread_mutex_lock(&m->mu);
        if ((r = kvb__room_find(m, rc->room)) != NULL)
            kvb__room_fail(r, "transfer info for room %llu could not be sent",
                           (unsigned long long)rc->room);
        pthread_mutex_unlock(&m->mu);
    }
    return KVB_OK;
}

static bool fence_done(const kvb__room_t *r)
{
    return !r->fence_open || r->lost || r->n_responded >= r->required_responses;
}

kvb_poll_t kvb_receiver_poll(kvb_receiver_h rc)
{
    struct kvb_manager *m = rc->mgr;
    kvb__src_t *todo = NULL;
    size_t n_todo = 0;
    int status;
    if (rc->concluded)
        return (kvb_poll_t)(rc->concluded - 1);
    pthread_mutex_lock(&m->mu);
    kvb__room_t *r = kvb__room_find(m, rc->room);
    if (r == NULL) {
        status = KVB_POLL_FAILED;
    } else {
        double el = r->t_init > 0 ? kvb__now_s() - r->t_init : 0;
        if (r->status == KVB_POLL_WAITING_FOR_INPUT && r->t_init > 0 &&
            el >= m->p.waiting_timeout_s) {
            kvb__room_fail(r, "Request %llu timed out after %.1fs in KVPoll.WaitingForInput",
                           (unsigned long long)rc->room, el);
        }
        /* Whatever failed the room (time-out, a malformed message naming it,
         * an undeliverable transfer info), the sources must stop writing
         * before the pages are reported reusable. No-op once opened. */
        if (r->status == KVB_POLL_FAILED)
            open_fence(m, r, &todo, &n_todo);
        status = r->status < 0 ? KVB_POLL_BOOTSTRAPPING : r->status;
        if (status == KVB_POLL_FAILED && !fence_done(r))
            status = KVB_POLL_TRANSFERRING; /* not terminal until the fence closes */
    }
    pthread_mutex_unlock(&m->mu);
    if (todo != NULL)
        send_aborts(m, rc->room, todo, n_todo);
    if (status == KVB_POLL_FAILED || status == KVB_POLL_SUCCESS)
        rc->concluded = status + 1;
    return (kvb_poll_t)status;
}

void kvb_receiver_abort(kvb_receiver_h rc)
{
    struct kvb_manager *m = rc->mgr;
    kvb__src_t *todo = NULL;
    size_t n = 0;
    pthread_mutex_lock(&m->mu);
    kvb__room_t *r = kvb__room_find(m, rc->room);
    if (r != NULL && r->status != KVB_POLL_SUCCESS) {
        kvb__room_fail(r, "Aborted by AbortReq.");
        open_fence(m, r, &todo, &n);
    }
    pthread_mutex_unlock(&m->mu);
    if (todo != NULL)
        send_aborts(m, rc->room, todo, n);
}

void kvb_receiver_failure(kvb_receiver_h rc, char *buf, size_t len)
{
    struct kvb_manager *m = rc->mgr;
    pthread_mutex_lock(&m->mu);
    kvb__room_take_reason(kvb__room_find(m, rc->room), buf, len);
    pthread_mutex_unlock(&m->mu);
}

void kvb_receiver_destroy(kvb_receiver_h rc)
{
    if (rc == NULL)
        return;
    struct kvb_manager *m = rc->mgr;
    pthread_mutex_lock(&m->mu);
    kvb__room_t *r = kvb__room_find(m, rc->room);
    bool live = r != NULL && r->status != KVB_POLL_SUCCESS && r->status != KVB_POLL_FAILED;
    pthread_mutex_unlock(&m->mu);
    if (live)
        kvb_receiver_abort(rc);
    pthread_mutex_lock(&m->mu);
    kvb__room_remove(m, rc->room);
    pthread_mutex_unlock(&m->mu);
    free(rc);
}

/* ---- control messages ---- */

static void on_status(struct kvb_manager *m, const kvb__frame_t *f, size_t n)
{
    kvb__status_msg_t s;
    kvb__frames_err_t e;
    kvb__src_t *todo = NULL;
    size_t n_todo = 0;
    if (kvb__frames_decode_status(f, n, &e, &s) != KVB_OK) {
        kvb__conn_bad_message(m, KVB__MSG_STATUS, &e);
        return;
    }
    KVB_TSAN_ACQUIRE(); /* a status follows the placement of the room's bytes */
    KVB_LOGD("manager %s: room %llu: status %d from prefill rank %d", m->endpoint,
             (unsigned long long)s.room, s.status, s.prefill_rank);
    pthread_mutex_lock(&m->mu);
    kvb__room_t *r = kvb__room_find(m, s.room);
    if (r != NULL && (s.status == KVB_POLL_SUCCESS || s.status == KVB_POLL_FAILED)) {
        int32_t pp_size = 1;
        kvb__addr_t *a = r->bootstrap_addr ? addr_get(m, r->bootstrap_addr) : NULL;
        if (a != NULL && a->have_info)
            pp_size = a->info.pp_size;
        uint32_t key =
            src_key((uint32_t)(s.prefill_rank / pp_size), (uint32_t)(s.prefill_rank % pp_size));
        bool seen = false;
        for (size_t i = 0; i < r->n_responded; i++)
            seen |= r->responded[i] == key;
        uint32_t *v = seen ? NULL : realloc(r->responded, (r->n_responded + 1) * sizeof(*v));
        if (v != NULL) {
            r->responded = v;
            r->responded[r->n_responded++] = key;
            if (s.status == KVB_POLL_SUCCESS && ++r->n_success >= r->required_responses)
                kvb__room_set_status(r, KVB_POLL_SUCCESS);
            if (s.status == KVB_POLL_FAILED) {
                kvb__room_fail(r, FAIL_FROM_PREFILL);
                open_fence(m, r, &todo, &n_todo);
            }
        }
    }
    pthread_mutex_unlock(&m->mu);
    if (todo != NULL)
        send_aborts(m, s.room, todo, n_todo);
}

static void on_aux(struct kvb_manager *m, const kvb__frame_t *f, size_t n)
{
    kvb__aux_msg_t a;
    kvb__frames_err_t e;
    uint64_t *items = calloc(m->args.num_aux + 1, sizeof(*items));
    kvb_status_t st = items == NULL ? KVB_ERR_NOMEM : kvb__frames_decode_aux(f, n, &e, &a);
    for (uint32_t i = 0; st == KVB_OK && i < m->args.num_aux; i++)
        items[i] = m->aux_lens[i] / m->aux_items[i];
    if (st == KVB_OK)
        st = kvb__frames_check_aux(&a, m->args.num_aux, m->aux_items, items, &e);
    free(items);
    if (st != KVB_OK) {
        if (st == KVB_ERR_PROTO && !e.has_room &&
            kvb__frames_decode_aux(f, n, NULL, &a) == KVB_OK) {
            e.has_room = true;
            e.room = a.room;
        }
        kvb__conn_bad_message(m, KVB__MSG_AUX, &e);
        return;
    }
    pthread_mutex_lock(&m->mu);
    kvb__room_t *r = kvb__room_find(m, a.room);
    if (r != NULL && r->status != KVB_POLL_FAILED)
        memcpy((void *)(uintptr_t)(m->aux_ptrs[a.buffer_index] +
                                   m->aux_items[a.buffer_index] * (uint64_t)a.aux_index),
               a.payload, a.payload_len);
    pthread_mutex_unlock(&m->mu);
}

void kvb__decode_on_message(struct kvb_manager *m, const kvb__frame_t *f, size_t n)
{
    kvb__msg_kind_t kind = kvb__frames_classify(f, n);
    if (kind == KVB__MSG_STATUS)
        on_status(m, f, n);
    else if (kind == KVB__MSG_AUX)
        on_aux(m, f, n);
    else
        kvb__conn_bad_message(m, kind, NULL);
}

/* ---- heartbeats ---- */

static void node_failure(struct kvb_manager *m, kvb__addr_t *a)
{
    size_t affected = 0;
    pthread_mutex_lock(&m->mu);
    /* Fence the instance's ranks before reporting their rooms over: a rank
     * that was only stalled (SIGSTOP, a long pause) must not land writes in
     * pages we are about to hand back. Lifted when its route is resolved
     * again (resolve_one). */
    for (kvb__route_t *rt = a->routes; rt != NULL; rt = rt->next)
        kvb_engine_fence_writer(m->engine, kvb__endpoint_tag(rt->ip, rt->port), 1);
    addr_forget(a);
    for (size_t i = 0; i < m->n_buckets; i++)
        for (kvb__room_t *r = m->buckets[i]; r != NULL; r = r->next)
            if (r->bootstrap_addr != NULL && strcmp(r->bootstrap_addr, a->addr) == 0 &&
                r->status != KVB_POLL_SUCCESS) {
                kvb__room_fail(r, "Losing connection with prefill instance (bootstrap_addr: %s)",
                               a->addr);
                r->lost = 1;
                affected++;
            }
    pthread_mutex_unlock(&m->mu);
    KVB_LOGE("Losing connection with prefill instance (bootstrap_addr: %s), %zu requests "
             "affected",
             a->addr, affected);
}

static void heartbeat_round(struct kvb_manager *m)
{
    kvb__addr_t *list[256];
    size_t n = 0;
    pthread_mutex_lock(&m->mu);
    for (kvb__addr_t *a = m->addrs; a != NULL && n < 256; a = a->next)
        if (a->have_info)
            list[n++] = a;
    pthread_mutex_unlock(&m->mu);
    for (size_t i = 0; i < n; i++) {
        double t = m->p.heartbeat_interval_s < 3 ? m->p.heartbeat_interval_s : 3;
        kvb_status_t st = kvb_bootstrap_client_health(list[i]->hb, t);
        pthread_mutex_lock(&m->mu);
        int fails = list[i]->failures = st == KVB_OK ? 0 : list[i]->failures + 1;
        pthread_mutex_unlock(&m->mu);
        if (fails >= m->p.heartbeat_max_failures)
            node_failure(m, list[i]);
    }
}

static void *heartbeat_main(void *arg)
{
    struct kvb_manager *m = arg;
    double next = kvb__now_s() + m->p.heartbeat_interval_s;
    while (!__atomic_load_n(&m->stop, __ATOMIC_ACQUIRE)) {
        if (kvb__now_s() < next) {
            usleep(20000);
            continue;
        }
        heartbeat_round(m);
        next += m->p.heartbeat_interval_s;
        if (next < kvb__now_s())
            next = kvb__now_s() + m->p.heartbeat_interval_s;
    }
    return NULL;
}

kvb_status_t kvb__decode_start(struct kvb_manager *m)
{
    if (pthread_create(&m->hb_thr, NULL, heartbeat_main, m) != 0)
        return KVB_ERR_IO;
    m->hb_started = 1;
    return KVB_OK;
}

void kvb__decode_stop(struct kvb_manager *m)
{
    if (m->hb_started)
        pthread_join(m->hb_thr, NULL);
    m->hb_started = 0;
}

void kvb__decode_free(struct kvb_manager *m)
{
    for (kvb__addr_t *a = m->addrs, *next; a != NULL; a = next) {
        next = a->next;
        addr_forget(a);
        kvb_bootstrap_client_destroy(a->client);
        kvb_bootstrap_client_destroy(a->hb);
        pthread_mutex_destroy(&a->client_mu);
        free(a->addr);
        free(a);
    }
    m->addrs = NULL;
}
