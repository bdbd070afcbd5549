/* Decode side: receivers, route resolution through the bootstrap server
 * (cached per address), KV-args registration, statuses and inline aux from
 * the prefill ranks, heartbeats, and the abort fence. */
#include "dialect/dialect.h"
#include "engine/cuda_drv.h"
#include "proto/bootstrap_proto.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define FAIL_FROM_PREFILL "Failed to get kvcache from prefill instance, it might be dead"
/* Appended to a failure reported while a source may still write the room's
 * pages (kvb_receiver_pages_safe). */
#define UNSAFE_NOTE                                                                                \
    "; its writes may still land: the pages are NOT safe to reuse until "                          \
    "kvb_receiver_pages_safe() says so"

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

/* Forget a's routes (m->mu held): the next receiver resolves and registers
 * again. Writer grants are per room (kvb_receiver_init), not per route. */
static void addr_forget(kvb__addr_t *a)
{
    for (kvb__route_t *r = a->routes, *next; r != NULL; r = next) {
        next = r->next;
        free(r);
    }
    a->routes = NULL;
    kvb_plan_destroy(a->plan);
    a->plan = NULL;
    if (a->priv != NULL)
        a->dialect->addr_free(a->priv);
    a->priv = NULL;
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
    out->draft_geom = out->kv_geom; /* draft items: the target's length (draft_layers) */
}

/* ---- receiver creation ---- */

typedef struct resolve {
    kvb_plan_route_t route;
    kvb__src_t *srcs;
    size_t n_srcs;
    int32_t dp_group;
    char why[512];
    kvb__tl_t *tl; /* the room's timeline (the receiver's reference) */
    int asked;     /* bootstrap requests made (0: every answer was cached) */
} resolve_t;

/* A bootstrap request of kind starts for the room being resolved. */
static void boot_asked(resolve_t *rs, const char *kind)
{
    rs->asked++;
    kvb__tl_add(rs->tl, KVB_EV_BOOTSTRAP_ASKED, 0, kind);
}

/* kvbridge's planner for the instance a's answer (info) describes. */
static kvb_status_t kvbridge_plan(struct kvb_manager *m, const kvb__addr_t *a,
                                  const kvb_bootstrap_parallel_info_t *info, int32_t page,
                                  kvb_plan_h *plan_p, resolve_t *rs)
{
    kvb_plan_layout_t pre, dec;
    prefill_layout(m, info, &pre);
    if (page > 0 && (uint32_t)page != pre.page_size) {
        /* item lengths it registered count its page's rows; ones derived
         * from ours (none registered), ours */
        if (info->kv_item_lens.count == 0)
            pre.kv_geom.item_len = pre.kv_geom.item_len / pre.page_size * (uint64_t)page;
        pre.page_size = (uint32_t)page;
        pre.draft_geom = pre.kv_geom;
    }
    kvb__layout_self(m, &dec);
    /* Routes follow the KV geometry; state pairs up rank by rank (the prefill
     * checks its TP size against ours). */
    pre.field_mask &= ~(uint64_t)KVB_PLAN_LAYOUT_STATE;
    dec.field_mask &= ~(uint64_t)KVB_PLAN_LAYOUT_STATE;
    pre.num_state = dec.num_state = 0;
    if (kvb_plan_create(&pre, &dec, plan_p) != KVB_OK) {
        snprintf(rs->why, sizeof(rs->why), "prefill at %s cannot serve this decode rank: %s%s",
                 a->addr, kvb_plan_last_error(),
                 page > 0 ? ""
                          : " (its bootstrap answer does not say its page size: a prefill of "
                            "another page size than this decode's is served in the 2026 "
                            "dialect only)");
        return KVB_ERR_INVALID;
    }
    return KVB_OK;
}

/* The dialect's own record of the instance, from the answer's text body
 * (its routes come from what kvbridge's structs do not hold: a layout
 * contract). */
static kvb_status_t dialect_info(struct kvb_manager *m, const kvb__addr_t *a,
                                 const kvb__dialect_t *d, const char *body, size_t len,
                                 void **priv_p, resolve_t *rs)
{
    char why[sizeof(rs->why) - 64];
    why[0] = '\0';
    kvb_status_t st =
        body != NULL ? d->addr_info(m, body, len, priv_p, why, sizeof(why)) : KVB_ERR_NOMEM;
    if (st != KVB_OK)
        snprintf(rs->why, sizeof(rs->why), "prefill at %s cannot serve this decode rank: %s",
                 a->addr, why[0] ? why : kvb_status_string(st));
    return st;
}

/* What of the answer's extras this decode cannot follow (rs->why). */
static kvb_status_t ext_refusal(const struct kvb_manager *m, const kvb__addr_t *a,
                                const kvb_bootstrap_parallel_info_ext_t *ext, resolve_t *rs)
{
    /* page sizes that differ: checked per rank (page_refusal), once its
     * look-up says whether it is kvbridge */
    if (ext->kv_cache_dtype[0] != '\0' && m->kv_dtype[0] != '\0' &&
        strcmp(ext->kv_cache_dtype, m->kv_dtype) != 0) {
        /* SGLang's decode: "KV cache dtype mismatch" (fatal there); unknown
         * on either side: no check. */
        snprintf(rs->why, sizeof(rs->why),
                 "KV cache dtype mismatch: prefill at %s has kv_cache_dtype %s, this decode %s",
                 a->addr, ext->kv_cache_dtype, m->kv_dtype);
        return KVB_ERR_INVALID;
    }
    if (ext->enable_dsa_cache_layer_split && ext->attn_cp_size > 1) {
        /* Each CP rank then holds a layer subset (spec 7.7): the decode
         * would have to pull from every CP rank and pair layers by id. */
        snprintf(rs->why, sizeof(rs->why),
                 "prefill at %s splits its DSA cache layers across %d CP ranks "
                 "(enable_dsa_cache_layer_split); kvbridge pulls every layer from CP rank 0",
                 a->addr, (int)ext->attn_cp_size);
        return KVB_ERR_INVALID;
    }
    return KVB_OK;
}

/* Who the prefill is, for a refusal: SGLang's/TokenSpeed's, or an older
 * kvbridge that registered a version below the layout mapping. */
static const char *whose(int version)
{
    return version > 0 ? "a kvbridge prefill of version 1, which ignores kv_layout= (upgrade it)"
                       : "a prefill not registered as kvbridge";
}

/* A prefill rank that cannot be told our layout ("kv_layout=" travels only
 * to kvbridge ranks, and only version 2 on maps it) writes its own: of
 * another page size (SGLang's decode raises "Page size mismatch" here), or
 * its pages in NHD order into our HND ones. kvbridge fails the room and
 * asks again for the next one. A kvbridge rank of version 2 maps rows
 * (docs/planner.md). version: the look-up answer's "kvbridge". */
static kvb_status_t page_refusal(struct kvb_manager *m, const kvb__addr_t *a, int version,
                                 resolve_t *rs)
{
    pthread_mutex_lock(&m->mu);
    int32_t other = a->other_page;
    pthread_mutex_unlock(&m->mu);
    if (version >= KVB_BOOTSTRAP_KVBRIDGE_LAYOUTS)
        return KVB_OK;
    if (other > 0)
        snprintf(rs->why, sizeof(rs->why),
                 "Page size mismatch: prefill at %s has page_size %d, this decode %u (%s: only a "
                 "kvbridge prefill of version %d or later can be told this decode's page size)",
                 a->addr, (int)other, m->args.page_size, whose(version),
                 KVB_BOOTSTRAP_KVBRIDGE_LAYOUTS);
    else if (m->args.kv_order == KVB_PLAN_ORDER_HND)
        snprintf(rs->why, sizeof(rs->why),
                 "Page order mismatch: this decode's KV pages are HND and prefill at %s is %s, "
                 "which writes its pages as they are (NHD); only a kvbridge prefill of version "
                 "%d or later can be told this decode's order",
                 a->addr, whose(version), KVB_BOOTSTRAP_KVBRIDGE_LAYOUTS);
    else
        return KVB_OK;
    return KVB_ERR_INVALID;
}

static kvb_status_t fetch_info(struct kvb_manager *m, kvb__addr_t *a, resolve_t *rs)
{
    kvb_bootstrap_parallel_info_t info;
    kvb_plan_h plan = NULL;
    char *body = NULL;
    size_t len = 0;
    pthread_mutex_lock(&m->mu);
    int have = a->have_info;
    pthread_mutex_unlock(&m->mu);
    if (have)
        return KVB_OK;
    kvb_bootstrap_parallel_info_ext_t ext = {0};
    ext.field_mask = KVB_BOOTSTRAP_INFO_DIALECT | KVB_BOOTSTRAP_INFO_PAGE_SIZE |
                     KVB_BOOTSTRAP_INFO_CP_SIZE | KVB_BOOTSTRAP_INFO_FOLLOW_ROOM |
                     KVB_BOOTSTRAP_INFO_DSA_SPLIT | KVB_BOOTSTRAP_INFO_KV_CACHE_DTYPE;
    boot_asked(rs, "parallel_info");
    pthread_mutex_lock(&a->client_mu);
    kvb_status_t st = kvb_bootstrap_client_parallel_info_ext(a->client, 5.0, &info, &ext);
    kvb__count_boot(m, st);
    /* The HTTP detail, read under the lock (thread-local copy). */
    const char *detail = st != KVB_OK ? kvb_bootstrap_client_last_error(a->client) : "";
    const kvb__dialect_t *d = st == KVB_OK ? kvb__dialect_for_boot(ext.dialect) : NULL;
    if (d != NULL && d->addr_info != NULL) /* this answer's text, before another call */
        body = kvb__bootstrap_client_answer(a->client, &len);
    pthread_mutex_unlock(&a->client_mu);
    if (st != KVB_OK) {
        snprintf(rs->why, sizeof(rs->why),
                 "Could not fetch prefill parallel info from bootstrap_addr: %s (%s)", a->addr,
                 detail);
        return st;
    }
    void *priv = NULL;
    st = ext_refusal(m, a, &ext, rs);
    if (st == KVB_OK)
        st = d->addr_info != NULL ? dialect_info(m, a, d, body, len, &priv, rs)
                                  : kvbridge_plan(m, a, &info, ext.page_size, &plan, rs);
    free(body);
    if (st != KVB_OK) {
        kvb_bootstrap_parallel_info_free(&info);
        return st;
    }
    pthread_mutex_lock(&m->mu);
    if (!a->have_info) {
        a->info = info;
        a->dialect = d;
        a->follow_room = ext.follow_bootstrap_room;
        a->cp_size = ext.attn_cp_size > 0 ? ext.attn_cp_size : 1;
        a->other_page =
            ext.page_size > 0 && (uint32_t)ext.page_size != m->args.page_size ? ext.page_size : 0;
        a->plan = plan;
        a->priv = priv;
        a->have_info = 1;
        a->failures = 0;
    } else {
        kvb_bootstrap_parallel_info_free(&info);
        kvb_plan_destroy(plan);
        if (priv != NULL)
            d->addr_free(priv);
    }
    pthread_mutex_unlock(&m->mu);
    return KVB_OK;
}

/* KV args in the source's dialect (extensions only to a kvbridge prefill). */
static kvb_status_t send_registration(struct kvb_manager *m, kvb__addr_t *a, const char *ip,
                                      uint16_t port, const kvb__src_t *s, kvb__tl_t *tl)
{
    pthread_mutex_lock(&m->mu);
    const void *priv = a->priv;
    pthread_mutex_unlock(&m->mu);
    kvb_status_t st = s->dialect->send_registration(m, ip, port, s->kvbridge != 0, priv);
    kvb__tl_add_ep(tl, KVB_EV_REGISTRATION_SENT, st, ip, port);
    return st;
}

/* KV args again to a cached route's prefill rank, asked by a failed room
 * (route_resend_mark); a failed send is asked again of the next receiver. */
static void route_resend(struct kvb_manager *m, kvb__addr_t *a, int32_t dp, int32_t tp, int32_t pp,
                         const kvb__src_t *out, kvb__tl_t *tl)
{
    if (send_registration(m, a, out->ip, out->port, out, tl) == KVB_OK)
        return;
    pthread_mutex_lock(&m->mu);
    kvb__route_t *r = route_find(a, dp, tp, pp);
    if (r != NULL)
        r->resend = 1;
    pthread_mutex_unlock(&m->mu);
}

/* Resolve (dp, tp, pp) to the prefill rank's control endpoint, register our
 * KV args there once (again after a room through it failed: resend). */
static kvb_status_t resolve_one(struct kvb_manager *m, kvb__addr_t *a, int32_t dp, int32_t tp,
                                int32_t pp, kvb__src_t *out, resolve_t *rs)
{
    kvb_bootstrap_rank_addr_t ra;
    pthread_mutex_lock(&m->mu);
    kvb__route_t *r = route_find(a, dp, tp, pp);
    int resend = 0;
    if (r != NULL) {
        snprintf(out->ip, sizeof(out->ip), "%s", r->ip);
        out->port = r->port;
        out->kvbridge = r->kvbridge;
        resend = r->resend;
        r->resend = 0;
    }
    pthread_mutex_unlock(&m->mu);
    if (resend)
        route_resend(m, a, dp, tp, pp, out, rs->tl);
    if (r != NULL)
        return KVB_OK;
    kvb_bootstrap_rank_ext_t rx = {KVB_BOOTSTRAP_RANK_KVBRIDGE, 0};
    boot_asked(rs, "rank");
    pthread_mutex_lock(&a->client_mu);
    /* stage-major ranks are asked as their dialect asks: no PP rank */
    kvb_status_t st =
        out->dialect->t.stage_major
            ? kvb__bootstrap_client_lookup_rank(a->client, dp, tp, 5.0, &ra)
            : kvb_bootstrap_client_lookup_ext(a->client, dp, 0, tp, pp, 5.0, &ra, &rx);
    kvb__count_boot(m, st);
    const char *detail = st != KVB_OK ? kvb_bootstrap_client_last_error(a->client) : "";
    pthread_mutex_unlock(&a->client_mu);
    if (st != KVB_OK) {
        snprintf(rs->why, sizeof(rs->why),
                 "Could not fetch bootstrap info for engine rank: %d and target_dp_group: %d "
                 "and target_pp_rank %d (%s)",
                 m->args.engine_rank, dp, pp, detail);
        return st;
    }
    out->kvbridge = rx.kvbridge > 0;
    if ((st = page_refusal(m, a, rx.kvbridge, rs)) != KVB_OK)
        return st;
    st = send_registration(m, a, ra.rank_ip, ra.rank_port, out, rs->tl);
    if (st != KVB_OK) {
        snprintf(rs->why, sizeof(rs->why), "KV args not delivered to prefill %s:%u", ra.rank_ip,
                 ra.rank_port);
        return st;
    }
    snprintf(out->ip, sizeof(out->ip), "%s", ra.rank_ip);
    out->port = ra.rank_port;
    pthread_mutex_lock(&m->mu);
    if (a->have_info && route_find(a, dp, tp, pp) == NULL && (r = calloc(1, sizeof(*r))) != NULL) {
        *r = (kvb__route_t){dp, tp, pp, "", ra.rank_port, out->kvbridge, a->routes, 0};
        snprintf(r->ip, sizeof(r->ip), "%s", ra.rank_ip);
        a->routes = r;
        if (!out->kvbridge) /* once per route: every room from it runs so */
            KVB_LOGW("manager %s: prefill %s:%u (bootstrap %s) did not register as kvbridge: no "
                     "writer grant reaches it, so a failed room from it is held until it "
                     "confirms (status or abort ack) or KVBRIDGE_ABORT_ACK_TIMEOUT passes; a "
                     "kvbridge prefill behind another bootstrap server runs unfenced this way "
                     "(use kvbridge's bootstrap server)",
                     m->endpoint, ra.rank_ip, ra.rank_port, a->addr);
    }
    pthread_mutex_unlock(&m->mu);
    return KVB_OK;
}

/* The prefill DP group serving room (spec 3.6): the caller's, 0 with one
 * group, room % dp_size under follow_bootstrap_room, else the group the
 * prefill registered for the room (POST /register_dp_rank), asked for up to
 * DP_QUERY_S (SGLang's decode keeps such a room pending and asks again). */
#define DP_QUERY_S 5.0
static kvb_status_t dp_group_of(struct kvb_manager *m, kvb__addr_t *a, uint64_t room,
                                int32_t dp_rank, int32_t dp, int follow, resolve_t *rs)
{
    double end = kvb__now_s() + DP_QUERY_S, pause = 0.02;
    int32_t got = -1;
    rs->dp_group = dp_rank >= 0 ? dp_rank : dp <= 1 ? 0 : (int32_t)(room % (uint64_t)dp);
    if (dp_rank >= 0 || dp <= 1 || follow)
        return KVB_OK;
    for (;;) {
        boot_asked(rs, "dp_rank");
        pthread_mutex_lock(&a->client_mu);
        kvb_status_t st = kvb_bootstrap_client_query_dp_ranks(a->client, &room, 1, 1.0, &got);
        kvb__count_boot(m, st);
        pthread_mutex_unlock(&a->client_mu);
        if (st == KVB_OK && got >= 0 && got < dp) {
            rs->dp_group = got;
            return KVB_OK;
        }
        if (kvb__now_s() + pause > end)
            break;
        usleep((useconds_t)(pause * 1e6));
        pause = pause < 0.2 ? pause * 2 : 0.2;
    }
    snprintf(rs->why, sizeof(rs->why),
             "prefill DP group of room %llu unknown at bootstrap server %s after %.0f s "
             "(follow_bootstrap_room is false there: the prefill must POST /register_dp_rank)",
             (unsigned long long)room, a->addr, DP_QUERY_S);
    return KVB_ERR_NOT_FOUND;
}

static kvb_status_t resolve(struct kvb_manager *m, kvb__addr_t *a, uint64_t room, int32_t dp_rank,
                            resolve_t *rs)
{
    kvb_status_t st = fetch_info(m, a, rs);
    if (st != KVB_OK)
        return st;
    pthread_mutex_lock(&m->mu);
    const kvb__dialect_t *dialect = a->dialect;
    /* stage-major sources name every stage: one look-up each */
    int32_t pp = a->have_info && dialect->t.stage_major ? 1 : a->info.pp_size;
    int32_t dp = a->info.dp_size;
    int follow = a->follow_room;
    st = !a->have_info         ? KVB_ERR_STATE
         : dialect->addr_route ? dialect->addr_route(m, a->priv, &rs->route)
                               : kvb_plan_route(a->plan, (uint32_t)m->p.attn_tp_rank, &rs->route);
    pthread_mutex_unlock(&m->mu);
    if (st != KVB_OK) {
        snprintf(rs->why, sizeof(rs->why), "no route from prefill %s: %s", a->addr,
                 kvb_plan_last_error());
        return st;
    }
    st = dp_group_of(m, a, room, dp_rank, dp, follow, rs);
    if (st != KVB_OK)
        return st;
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
            s->dialect = dialect;
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
        rc->tl = kvb__tl_ref(r->tl);
    }
    pthread_mutex_unlock(&m->mu);
    if (st != KVB_OK) {
        free(rc);
        return kvb__err_set(&m->err, st, "room %llu: receiver exists or out of memory",
                            (unsigned long long)room);
    }
    memset(&rs, 0, sizeof(rs));
    rs.tl = rc->tl;
    st = resolve(m, a, room, dp_rank, &rs);
    kvb__tl_add(rs.tl, KVB_EV_BOOTSTRAP_ANSWERED, st,
                st != KVB_OK    ? rs.why
                : rs.asked == 0 ? "cached"
                                : "");
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

/* Transfer info in the source's dialect. */
static kvb_status_t send_transfer(struct kvb_manager *m, const kvb__src_t *s, uint64_t room,
                                  const int32_t *idx, size_t n, int64_t aux,
                                  const kvb_receiver_init_t *ex, kvb__tl_t *tl)
{
    /* recorded before the send: the prefill's answer may be recorded on
     * the control thread before this call returns (a failed send fails the
     * room, its terminal event says so) */
    kvb__tl_add_ep(tl, KVB_EV_TRANSFER_INFO_SENT, 0, s->ip, s->port);
    return s->dialect->send_transfer(m, s, room, idx, n, aux, ex);
}

/* Ask source s to stop writing the room, if its dialect has a way (gen:
 * our abort's generation). Where none, its status, or the abort-ack
 * time-out, then closes the fence. */
static kvb_status_t send_abort(struct kvb_manager *m, const kvb__src_t *s, uint64_t room,
                               uint64_t gen, kvb__tl_t *tl)
{
    kvb__tl_add_ep(tl, KVB_EV_ABORT_SENT, 0, s->ip, s->port); /* before: as transfer infos */
    return s->dialect->send_abort(m, s, room, gen);
}

static uint32_t src_key(uint32_t tp, uint32_t pp)
{
    return tp * 1000003u + pp;
}

/* Has source s of r answered for the room (a terminal status, or an abort
 * ack with our generation: record_response)? */
static bool src_answered(const kvb__room_t *r, const kvb__src_t *s)
{
    uint32_t key = src_key(s->tp_rank, s->pp_rank);
    for (size_t k = 0; k < r->n_responded; k++)
        if (r->responded[k] == key)
            return true;
    return false;
}

/* m->mu held: the room failed after init; ask every real source that has
 * not answered to stop, and hold the terminal report until they confirm.
 * The abort's generation: a fresh one per room fence, so an ACK left over
 * from an earlier use of the room id is told apart. 0: nothing to send. */
static uint64_t open_fence(struct kvb_manager *m, kvb__room_t *r, kvb__src_t **todo, size_t *n_todo)
{
    *todo = NULL;
    *n_todo = 0;
    if (r->fence_open || r->t_init == 0 || r->lost)
        return 0;
    r->fence_open = 1;
    r->abort_gen = ++m->abort_gen_last;
    *todo = calloc(r->n_src + 1, sizeof(**todo));
    for (size_t i = 0; *todo != NULL && i < r->n_src; i++) {
        if (!r->srcs[i].dummy && !src_answered(r, &r->srcs[i]))
            (*todo)[(*n_todo)++] = r->srcs[i];
    }
    return r->abort_gen;
}

static void send_aborts(struct kvb_manager *m, uint64_t room, uint64_t gen, kvb__src_t *todo,
                        size_t n, kvb__tl_t *tl)
{
    for (size_t i = 0; i < n; i++)
        send_abort(m, &todo[i], room, gen, tl);
    free(todo);
}

/* Items every buffer of a kind holds (lens[i] / items[i] at its smallest):
 * an index at or past it would land past the end of the smallest buffer
 * (in the next buffer when they are adjacent slices of one allocation). */
static uint64_t pool_items(const uint64_t *lens, const uint64_t *items, uint64_t item, uint32_t n)
{
    uint64_t pool = UINT64_MAX;
    for (uint32_t i = 0; i < n; i++) {
        uint64_t len = items != NULL ? items[i] : item;
        if (len > 0 && lens[i] / len < pool)
            pool = lens[i] / len;
    }
    return pool == UINT64_MAX ? 0 : pool;
}

/* Fail the room (nothing sent) when an index the prefill will write (mask
 * 1, or no mask) lies outside this rank's pool of what. */
static bool in_pool(struct kvb_manager *m, uint64_t room, const char *kind, const char *what,
                    const int32_t *idx, size_t n, const uint8_t *mask, uint64_t pool)
{
    for (size_t i = 0; i < n; i++) {
        if ((mask != NULL && !mask[i]) || (idx[i] >= 0 && (uint64_t)idx[i] < pool))
            continue;
        pthread_mutex_lock(&m->mu);
        kvb__room_t *r = kvb__room_find(m, room);
        if (r != NULL)
            kvb__room_fail(r,
                           "room %llu: destination %s index %d (entry %zu) is outside this "
                           "decode rank's %s pool of %llu %ss; nothing was sent",
                           (unsigned long long)room, what, (int)idx[i], i, kind,
                           (unsigned long long)pool, what);
        pthread_mutex_unlock(&m->mu);
        KVB_LOGW("manager %s: room %llu: destination %s index %d (entry %zu) outside the pool of "
                 "%llu",
                 m->endpoint, (unsigned long long)room, what, (int)idx[i], i,
                 (unsigned long long)pool);
        return false;
    }
    return true;
}

/* Every KV page and state slot the prefill will write must lie in this
 * rank's pools; otherwise the room fails and nothing is sent. */
static bool indices_in_pools(struct kvb_manager *m, uint64_t room, const int32_t *idx, size_t n,
                             const kvb_receiver_init_t *ex)
{
    const uint8_t *mask =
        ex != NULL && (ex->field_mask & KVB_RECV_INIT_MASK) ? ex->page_mask : NULL;
    if (!in_pool(m, room, "KV", "page", idx, n, mask,
                 pool_items(m->kv_lens, NULL, m->args.kv_item_len, m->args.num_kv)))
        return false;
    if (ex == NULL || !(ex->field_mask & KVB_RECV_INIT_STATE) || ex->state_indices == NULL)
        return true;
    return in_pool(m, room, "state", "state", ex->state_indices, ex->num_state_indices, NULL,
                   pool_items(m->state_lens, m->state_items, 0, m->args.num_state));
}

/* Fail the room (nothing sent) when its transfer info cannot say what ex
 * asks of one of its sources. */
static bool init_fits_sources(struct kvb_manager *m, uint64_t room, size_t count,
                              const kvb_receiver_init_t *ex)
{
    static const kvb_receiver_init_t none; /* no extras: a dialect may still need some */
    char why[320] = "";
    if (ex == NULL)
        ex = &none;
    pthread_mutex_lock(&m->mu);
    kvb__room_t *r = kvb__room_find(m, room);
    for (size_t i = 0; r != NULL && i < r->n_src && why[0] == '\0'; i++)
        if (!r->srcs[i].dummy)
            r->srcs[i].dialect->transfer_form(m, &r->srcs[i], count, ex, why, sizeof(why));
    if (why[0] != '\0')
        kvb__room_fail(r, "room %llu: %s; nothing was sent", (unsigned long long)room, why);
    pthread_mutex_unlock(&m->mu);
    return why[0] == '\0';
}

/* Revoke the writer grants of srcs, without waiting: from here on their
 * writes are refused. KVB_OK when nothing admitted under them is still
 * landing (each call looks again). */
static kvb_status_t revoke_grants(struct kvb_manager *m, const kvb__src_t *srcs, size_t n)
{
    kvb_status_t st = KVB_OK;
    for (size_t i = 0; i < n; i++)
        if (srcs[i].epoch != 0 &&
            kvb_engine_revoke_writer(m->engine, kvb__endpoint_tag(srcs[i].ip, srcs[i].port),
                                     srcs[i].epoch, 0) != KVB_OK)
            st = KVB_ERR_INPROGRESS;
    return st;
}

/* A writer grant for the room to every source one can reach (a kvbridge
 * prefill speaking an SGLang dialect: the transfer info's epoch=), stored
 * in the room before its transfer info leaves, so that the room's failure
 * can revoke and drain exactly its writes. Sources a grant cannot reach
 * (no "kvbridge" key in their look-up, TokenSpeed's dialect, a full grant
 * table) keep epoch 0: the room is fenced by their answers (writes_ended). */
static void grant_sources(struct kvb_manager *m, uint64_t room, kvb__src_t *srcs, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        kvb__src_t *s = &srcs[i];
        if (s->dummy || !s->kvbridge || !s->dialect->t.extensions || s->epoch != 0)
            continue;
        if (kvb_engine_grant_writer(m->engine, kvb__endpoint_tag(s->ip, s->port), &s->epoch) !=
            KVB_OK) {
            s->epoch = 0;
            KVB_LOGW("manager %s: room %llu: no writer grant for prefill %s:%u (%s): the room's "
                     "pages are fenced by that prefill's answers only",
                     m->endpoint, (unsigned long long)room, s->ip, s->port,
                     kvb_engine_last_error(m->engine));
        }
    }
    pthread_mutex_lock(&m->mu);
    kvb__room_t *r = kvb__room_find(m, room);
    bool kept = r != NULL && r->n_src == n;
    for (size_t i = 0; kept && i < n; i++)
        r->srcs[i].epoch = srcs[i].epoch;
    pthread_mutex_unlock(&m->mu);
    if (!kept) /* destroyed meanwhile: nothing may land for it */
        revoke_grants(m, srcs, n);
}

/* Integrity on with a dialect digest in aux asked for (sglang_kv_checksum_aux):
 * a copy of the pages past the prefix (*n_p of them), which that digest
 * covers, for own_take; NULL otherwise (or out of memory: the room is then
 * unchecked). */
static int32_t *own_pages(const struct kvb_manager *m, const int32_t *idx, size_t n,
                          const kvb_receiver_init_t *ex, size_t *n_p)
{
    uint64_t prefix = ex != NULL && (ex->field_mask & KVB_RECV_INIT_PREFIX) ? ex->prefix_tokens : 0;
    uint64_t skip = prefix / (m->args.page_size ? m->args.page_size : 1);
    if (!m->p.integrity || m->p.sglang_kv_checksum_aux < 0)
        return NULL;
    *n_p = skip < n ? n - (size_t)skip : 0;
    int32_t *c = malloc((*n_p + 1) * sizeof(*c));
    if (c != NULL && *n_p > 0)
        memcpy(c, idx + (n - *n_p), *n_p * sizeof(*c));
    return c;
}

kvb_status_t kvb_receiver_init(kvb_receiver_h rc, const int32_t *indices, size_t count,
                               int64_t aux_index, const kvb_receiver_init_t *extra)
{
    struct kvb_manager *m = rc != NULL ? rc->mgr : NULL;
    kvb__src_t *srcs = NULL;
    size_t n = 0;
    if (m == NULL || (indices == NULL && count > 0))
        return KVB_ERR_INVALID;
    if (aux_index < 0 || aux_index > INT32_MAX) {
        /* The wire carries a non-negative slot (the seeds' format). */
        if (m->args.num_aux > 0)
            return kvb__err_set(&m->err, KVB_ERR_INVALID,
                                "room %llu: aux_index %lld: this decode registered %u aux "
                                "buffer(s), so each receiver needs its aux slot (>= 0)",
                                (unsigned long long)rc->room, (long long)aux_index,
                                m->args.num_aux);
        aux_index = 0; /* no aux buffers here: the prefill plans no aux into us */
    }
    if (!indices_in_pools(m, rc->room, indices, count, extra) ||
        !init_fits_sources(m, rc->room, count, extra))
        return KVB_ERR_INVALID;
    size_t n_own = 0;
    int32_t *own = own_pages(m, indices, count, extra, &n_own);
    pthread_mutex_lock(&m->mu);
    kvb__room_t *r = kvb__room_find(m, rc->room);
    if (r != NULL && own != NULL && r->own_pages == NULL) {
        r->own_pages = own;
        r->n_own_pages = n_own;
        r->own_aux_slot = aux_index;
        r->own_state = extra != NULL && (extra->field_mask & KVB_RECV_INIT_STATE) &&
                       extra->num_state_indices > 0;
        own = NULL;
    }
    if (r != NULL && r->status != KVB_POLL_FAILED && r->n_src > 0) {
        srcs = malloc(r->n_src * sizeof(*srcs));
        if (srcs != NULL) {
            memcpy(srcs, r->srcs, r->n_src * sizeof(*srcs));
            n = r->n_src;
        }
        r->t_init = kvb__now_s(); /* from here a source may write: the fence holds the room */
    }
    pthread_mutex_unlock(&m->mu);
    free(own); /* the room is gone, or kept its first list */
    grant_sources(m, rc->room, srcs, n);
    kvb_status_t st = KVB_OK;
    for (size_t i = 0; i < n && st == KVB_OK; i++)
        st = send_transfer(m, &srcs[i], rc->room, indices, count, aux_index, extra, rc->tl);
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

/* The abort fence's one rule (m->mu held): can nothing more of failed room
 * r land in its pages? Before its transfer info went out nothing could.
 * After: a source we gave the room's writer grant once that grant is
 * revoked (here, without waiting: its later writes are refused) and
 * drained (kvb_engine_revoke_writer: no write admitted under it is still
 * being placed or copied), whatever the source said or did not say; a
 * source no grant reached once it answered, which a prefill does only when
 * the room's writes have settled. A dummy source writes nothing. */
static bool writes_ended(struct kvb_manager *m, kvb__room_t *r)
{
    if (r->t_init == 0)
        return true;
    bool ended = revoke_grants(m, r->srcs, r->n_src) == KVB_OK;
    for (size_t k = 0; ended && k < r->n_src; k++)
        ended = r->srcs[k].dummy || r->srcs[k].epoch != 0 || src_answered(r, &r->srcs[k]);
    return ended;
}

/* May failed room r be reported terminal (m->mu held)? Once nothing more
 * of it can land. Until then poll() says Transferring, so a framework that
 * frees a request's pages on Failed (SGLang's and TokenSpeed's schedulers)
 * cannot reuse them while a write may still land; bounded: past
 * KVBRIDGE_ABORT_ACK_TIMEOUT after the failure (a source stopped mid-write
 * and never resumed) it is reported, with the quarantine note in its
 * reason, and kvb_receiver_pages_safe() keeps saying 0 until the writes
 * end. */
static bool fence_done(struct kvb_manager *m, kvb__room_t *r)
{
    if (writes_ended(m, r)) {
        kvb__tl_fence(r->tl, false, "writes ended", false);
        return true;
    }
    if (kvb__now_s() - r->t_terminal < m->abort_ack_timeout_s) {
        kvb__tl_fence(r->tl, true,
                      r->lost ? "prefill lost: grants draining" : "a source may still write",
                      false);
        return false;
    }
    kvb__tl_fence(r->tl, false, "abort-ack time-out: pages not safe", true);
    if (!r->unsafe) {
        r->unsafe = 1;
        kvb__m_add(KVB__M_FENCE_UNSAFE_TOTAL, kvb__m_role(KVB_MODE_DECODE, 0, 1), 1);
        kvb__room_note(r, " (its writes had not ended within the abort-ack time-out)");
        kvb__room_note(r, UNSAFE_NOTE);
        KVB_LOGE("manager %s: room %llu reported Failed with its pages quarantined: a source may "
                 "still write them",
                 m->endpoint, (unsigned long long)r->id);
    }
    return true;
}

/* Can nothing land in the room's pages any more (m->mu held)? */
static bool pages_safe(struct kvb_manager *m, kvb__room_t *r)
{
    if (r->status == KVB_POLL_SUCCESS)
        return true;
    return r->status == KVB_POLL_FAILED && writes_ended(m, r);
}

int kvb_receiver_pages_safe(kvb_receiver_h rc)
{
    if (rc == NULL)
        return 0;
    struct kvb_manager *m = rc->mgr;
    pthread_mutex_lock(&m->mu);
    kvb__room_t *r = kvb__room_find(m, rc->room);
    int safe = r != NULL && pages_safe(m, r);
    pthread_mutex_unlock(&m->mu);
    return safe;
}

/* m->mu held: fail r past the waiting time-out. */
static void check_waiting(struct kvb_manager *m, kvb__room_t *r)
{
    double el = r->t_init > 0 ? kvb__now_s() - r->t_init : 0;
    if (r->status == KVB_POLL_WAITING_FOR_INPUT && r->t_init > 0 && el >= m->p.waiting_timeout_s)
        kvb__room_fail(r, "Request %llu timed out after %.1fs in KVPoll.WaitingForInput",
                       (unsigned long long)r->id, el);
}

int kvb__receiver_status(struct kvb_manager *m, kvb_receiver_h rc)
{
    kvb__room_t *r = kvb__room_find(m, rc->room);
    if (r == NULL)
        return KVB_POLL_FAILED;
    check_waiting(m, r);
    if (r->status == KVB_POLL_SUCCESS) /* every source acknowledged its writes: drop them */
        revoke_grants(m, r->srcs, r->n_src);
    return r->status < 0 ? KVB_POLL_BOOTSTRAPPING : r->status;
}

kvb_poll_t kvb_receiver_poll(kvb_receiver_h rc)
{
    struct kvb_manager *m = rc->mgr;
    kvb__src_t *todo = NULL;
    size_t n_todo = 0;
    uint64_t gen = 0;
    int status;
    if (rc->concluded)
        return (kvb_poll_t)(rc->concluded - 1);
    pthread_mutex_lock(&m->mu);
    kvb__room_t *r = kvb__room_find(m, rc->room);
    if (r == NULL) {
        status = KVB_POLL_FAILED;
    } else {
        check_waiting(m, r);
        /* Whatever failed the room (time-out, a malformed message naming it,
         * an undeliverable transfer info), the sources must stop writing
         * before the pages are reported reusable. No-op once opened. */
        if (r->status == KVB_POLL_FAILED)
            gen = open_fence(m, r, &todo, &n_todo);
        status = r->status < 0 ? KVB_POLL_BOOTSTRAPPING : r->status;
        if (status == KVB_POLL_FAILED && !fence_done(m, r))
            status = KVB_POLL_TRANSFERRING; /* not terminal until the fence closes */
        r->reported = status == KVB_POLL_FAILED;
        if (status == KVB_POLL_SUCCESS) /* every source acknowledged its writes: drop them */
            revoke_grants(m, r->srcs, r->n_src);
    }
    pthread_mutex_unlock(&m->mu);
    if (todo != NULL)
        send_aborts(m, rc->room, gen, todo, n_todo, rc->tl);
    if (status == KVB_POLL_FAILED || status == KVB_POLL_SUCCESS)
        rc->concluded = status + 1;
    return (kvb_poll_t)status;
}

void kvb_receiver_abort(kvb_receiver_h rc)
{
    struct kvb_manager *m = rc->mgr;
    kvb__src_t *todo = NULL;
    size_t n = 0;
    uint64_t gen = 0;
    pthread_mutex_lock(&m->mu);
    kvb__room_t *r = kvb__room_find(m, rc->room);
    if (r != NULL && r->status != KVB_POLL_SUCCESS) {
        kvb__room_fail(r, "Aborted by AbortReq.");
        gen = open_fence(m, r, &todo, &n);
    }
    pthread_mutex_unlock(&m->mu);
    if (todo != NULL)
        send_aborts(m, rc->room, gen, todo, n, rc->tl);
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
    if ((r = kvb__room_find(m, rc->room)) != NULL) /* the room's writes are refused from here */
        revoke_grants(m, r->srcs, r->n_src);
    kvb__room_remove(m, rc->room);
    pthread_mutex_unlock(&m->mu);
    kvb__tl_put(rc->tl);
    free(rc);
}

kvb_status_t kvb_receiver_timeline(kvb_receiver_h rc, kvb_timeline_t **tl_p)
{
    if (rc == NULL || tl_p == NULL)
        return KVB_ERR_INVALID;
    return kvb__tl_snapshot(rc->tl, rc->room, tl_p);
}

/* ---- control messages ---- */

/* Is key (src_key of a prefill rank) one of r's sources? A room not yet
 * resolved has none: no prefill has its transfer info, so a status for it
 * is not a source's (one Success would otherwise end it for good). Where
 * a dummy never answers (stage-major dialects: TokenSpeed's planned
 * targets), it is none either. */
static bool is_source(const kvb__room_t *r, uint32_t key, bool dummies)
{
    for (size_t i = 0; i < r->n_src; i++)
        if (src_key(r->srcs[i].tp_rank, r->srcs[i].pp_rank) == key &&
            (dummies || !r->srcs[i].dummy))
            return true;
    return false;
}

/* m->mu held. Record that prefill rank (seed 001: tp * pp_size + pp; 2026:
 * tp * (pp_size * cp_size) + pp * cp_size + cp, the same with CP size 1)
 * answered for the room: a terminal status, or a drained abort ack (what
 * says). false when it had answered already, or is no source of the room
 * (a CP rank other than 0 never is; logged: any peer on the PULL socket
 * could otherwise end a room before its bytes landed). */
static bool record_response(struct kvb_manager *m, kvb__room_t *r, int32_t rank, const char *what)
{
    int32_t pp_size = 1, cp_size = 1;
    kvb__addr_t *a = r->bootstrap_addr ? addr_get(m, r->bootstrap_addr) : NULL;
    bool stage_major = a != NULL && a->have_info && a->dialect->t.stage_major;
    if (a != NULL && a->have_info && a->info.pp_size > 0 && !stage_major)
        pp_size = a->info.pp_size;
    if (a != NULL && a->have_info && a->cp_size > 1)
        cp_size = a->cp_size;
    int32_t base = rank / cp_size;
    uint32_t key = src_key((uint32_t)(base / pp_size), (uint32_t)(base % pp_size));
    if (rank % cp_size != 0 || !is_source(r, key, !stage_major)) {
        KVB_LOGW("manager %s: room %llu: %s from prefill rank %d, which is not one of its "
                 "sources: ignored",
                 m->endpoint, (unsigned long long)r->id, what, (int)rank);
        return false;
    }
    for (size_t i = 0; i < r->n_responded; i++)
        if (r->responded[i] == key)
            return false;
    uint32_t *v = realloc(r->responded, (r->n_responded + 1) * sizeof(*v));
    if (v == NULL)
        return false;
    r->responded = v;
    r->responded[r->n_responded++] = key;
    kvb__room_changed(r); /* it may close the room's fence */
    return true;
}

/* A prefill rank failed room r (m->mu held). A kvbridge prefill may have
 * lost our KV args (its registration table, KVBRIDGE_MAX_REGISTRATIONS,
 * evicted or refused them, or a peer replaced them) and no dialect's status
 * says why: the next receiver through a route of r's sources sends them
 * again (an idempotent replacement there), instead of every later room
 * failing until a heartbeat forgets the route. SGLang's and TokenSpeed's
 * prefills keep every registration: they get them once, as they expect. */
static void route_resend_mark(struct kvb_manager *m, const kvb__room_t *r)
{
    kvb__addr_t *a = r->bootstrap_addr ? addr_get(m, r->bootstrap_addr) : NULL;
    for (kvb__route_t *rt = a != NULL ? a->routes : NULL; rt != NULL; rt = rt->next)
        for (size_t i = 0; rt->kvbridge && i < r->n_src; i++)
            if (!r->srcs[i].dummy && r->srcs[i].port == rt->port &&
                strcmp(r->srcs[i].ip, rt->ip) == 0)
                rt->resend = 1;
}

/* Integrity on (docs/integrity.md), m->mu held: add source s's digest to the
 * room's (false, the room failed: a malformed digest). */
static bool integ_add(struct kvb_manager *m, kvb__room_t *r, const kvb__status_in_t *s)
{
    char why[256];
    if (s->digest == NULL) {
        r->integ_missing = 1;
        return true;
    }
    if (r->integ == NULL) {
        if ((r->integ = calloc(1, sizeof(*r->integ))) == NULL ||
            kvb__integ_init(r->integ, m->args.num_kv) != KVB_OK) {
            free(r->integ);
            r->integ = NULL;
            r->integ_missing = 1;
            return true;
        }
        r->n_integ = 1;
    }
    uint64_t pool = pool_items(m->kv_lens, NULL, m->args.kv_item_len, m->args.num_kv);
    if (kvb__integ_add_wire(r->integ, s->digest, s->digest_len, pool, m->args.kv_item_len, why,
                            sizeof(why)) == KVB_OK)
        return true;
    kvb__room_fail(r, "KV integrity: prefill rank %d's digest refused: %s", (int)s->prefill_rank,
                   why);
    return false;
}

/* Integrity on, every source's Success in, m->mu held: the room's digest
 * taken out to be recomputed outside the lock (integ_finish), the room left
 * Transferring meanwhile; NULL when there is nothing to check (no digest
 * from a source, a plan the digest cannot describe, device pages, which are
 * not read back: counted unchecked), Success then. */
static kvb__integ_t *integ_take(struct kvb_manager *m, kvb__room_t *r)
{
    kvb_mem_type_t t = KVB_MEM_HOST;
    int dev = 0;
    if (r->integ == NULL || r->integ_missing || r->integ->uncovered ||
        (m->args.num_kv > 0 &&
         kvb_mem_query((const void *)(uintptr_t)m->kv_ptrs[0], &t, &dev) == KVB_OK &&
         t == KVB_MEM_CUDA)) {
        __atomic_add_fetch(&m->integ_unchecked, 1, __ATOMIC_RELAXED);
        return NULL;
    }
    kvb__integ_t *a = r->integ;
    r->integ = NULL;
    r->n_integ = 0;
    return a;
}

/* A room's check ended (no lock held; a check worker, icheck.c, or the
 * control thread): report the room Success, or fail it naming the buffer
 * and page, unless it ended meanwhile (aborted, timed out). */
static void integ_report(struct kvb_manager *m, uint64_t room, bool good, const char *why,
                         kvb__tl_t *tl)
{
    kvb__src_t *todo = NULL;
    size_t n_todo = 0;
    uint64_t gen = 0;
    __atomic_add_fetch(&m->integ_checked, 1, __ATOMIC_RELAXED);
    if (!good) {
        __atomic_add_fetch(&m->integ_mismatches, 1, __ATOMIC_RELAXED);
        KVB_LOGW("manager %s: room %llu: %s", m->endpoint, (unsigned long long)room, why);
    }
    pthread_mutex_lock(&m->mu);
    kvb__room_t *r = kvb__room_find(m, room);
    if (r != NULL && r->status != KVB_POLL_FAILED && r->status != KVB_POLL_SUCCESS) {
        if (good) {
            kvb__room_set_status(r, KVB_POLL_SUCCESS);
        } else {
            kvb__room_fail(r, "%s", why);
            gen = open_fence(m, r, &todo, &n_todo);
        }
    }
    pthread_mutex_unlock(&m->mu);
    if (todo != NULL)
        send_aborts(m, room, gen, todo, n_todo, tl);
}

/* No check worker took the room (none, or their queue is full): recompute
 * a's digest over our pages here, on the control thread, no lock (it reads
 * the room's pages once, docs/integrity.md "Cost"), then report. Frees a. */
static void integ_finish(struct kvb_manager *m, uint64_t room, kvb__integ_t *a, kvb__tl_t *tl)
{
    char why[320];
    kvb__icheck_test_stall();
    bool good = kvb__integ_check(a, m->kv_ptrs, m->args.kv_item_len, why, sizeof(why));
    kvb__integ_free(a);
    free(a);
    integ_report(m, room, good, why, tl);
}

/* Integrity on, every source's Success in, m->mu held: no source sent a
 * kvbridge digest and the sources' dialect carries its own in aux
 * (dialect->check_own_digest, asked for with sglang_kv_checksum_aux): what
 * own_finish checks outside the lock, the room left Transferring meanwhile
 * (the pages move out of the room). NULL: integ_take decides. */
static kvb__own_digest_in_t *own_take(struct kvb_manager *m, kvb__room_t *r,
                                      const kvb__dialect_t **d_p)
{
    const kvb__dialect_t *d = NULL;
    size_t real = 0;
    for (size_t i = 0; i < r->n_src; i++)
        if (!r->srcs[i].dummy) {
            d = d != NULL ? d : r->srcs[i].dialect;
            real++;
        }
    if (r->own_pages == NULL || (r->integ != NULL && !r->integ_missing) || d == NULL ||
        d->check_own_digest == NULL)
        return NULL;
    kvb__own_digest_in_t *in = malloc(sizeof(*in));
    if (in == NULL)
        return NULL;
    *in = (kvb__own_digest_in_t){r->id,           r->own_pages, r->n_own_pages,
                                 r->own_aux_slot, real,         r->own_state != 0};
    r->own_pages = NULL;
    *d_p = d;
    return in;
}

/* Check the room's own digest (no lock: it reads the room's pages once), then
 * report it as integ_finish does (on the control thread: the check workers
 * take kvbridge's digest only); nothing to check: Success, unchecked. Frees in. */
static void own_finish(struct kvb_manager *m, const kvb__dialect_t *d, kvb__own_digest_in_t *in,
                       kvb__tl_t *tl)
{
    char why[512] = "";
    uint64_t room = in->room;
    kvb__own_result_t res = d->check_own_digest(m, in, why, sizeof(why));
    free((void *)in->pages);
    free(in);
    if (res != KVB__OWN_NONE) {
        integ_report(m, room, res == KVB__OWN_MATCH, why, tl);
        return;
    }
    KVB_LOGD("manager %s: room %llu: %s digest not checked: %s", m->endpoint,
             (unsigned long long)room, d->t.name, why);
    __atomic_add_fetch(&m->integ_unchecked, 1, __ATOMIC_RELAXED);
    pthread_mutex_lock(&m->mu);
    kvb__room_t *r = kvb__room_find(m, room);
    if (r != NULL && r->status != KVB_POLL_FAILED && r->status != KVB_POLL_SUCCESS)
        kvb__room_set_status(r, KVB_POLL_SUCCESS);
    pthread_mutex_unlock(&m->mu);
}

/* A terminal status of any dialect, decoded: record it as that source's
 * answer; a Failed one fails the room and opens its fence. */
static void status_in(struct kvb_manager *m, const kvb__status_in_t *s)
{
    kvb__src_t *todo = NULL;
    size_t n_todo = 0;
    uint64_t gen = 0;
    kvb__integ_t *verify = NULL;      /* integrity: the room's digest to recompute, unlocked */
    kvb__own_digest_in_t *own = NULL; /* integrity: the dialect's own digest, unlocked */
    const kvb__dialect_t *own_d = NULL;
    KVB_TSAN_ACQUIRE(); /* a status follows the placement of the room's bytes */
    KVB_LOGD("manager %s: room %llu: status %d from prefill rank %d", m->endpoint,
             (unsigned long long)s->room, s->status, s->prefill_rank);
    pthread_mutex_lock(&m->mu);
    kvb__room_t *r = kvb__room_find(m, s->room);
    kvb__tl_t *tl = r != NULL ? kvb__tl_ref(r->tl) : NULL;
    if (tl != NULL) {
        char rank[16];
        snprintf(rank, sizeof(rank), "rank %d", (int)s->prefill_rank);
        kvb__tl_add(tl, KVB_EV_STATUS_RECEIVED, s->status, rank);
    }
    if (r != NULL && (s->status == KVB_POLL_SUCCESS || s->status == KVB_POLL_FAILED) &&
        record_response(m, r, s->prefill_rank,
                        s->status == KVB_POLL_SUCCESS ? "Success" : "Failed")) {
        bool ok = s->status != KVB_POLL_SUCCESS || !m->p.integrity || integ_add(m, r, s);
        if (ok && s->status == KVB_POLL_SUCCESS && ++r->n_success >= r->required_responses &&
            (!m->p.integrity ||
             ((own = own_take(m, r, &own_d)) == NULL && (verify = integ_take(m, r)) == NULL)))
            kvb__room_set_status(r, KVB_POLL_SUCCESS);
        if (!ok) /* a malformed digest failed it: the sources still writing are told, as below */
            gen = open_fence(m, r, &todo, &n_todo);
        if (s->status == KVB_POLL_FAILED) {
            route_resend_mark(m, r);
            kvb__room_fail(r, FAIL_FROM_PREFILL);
            gen = open_fence(m, r, &todo, &n_todo);
        }
    }
    pthread_mutex_unlock(&m->mu);
    if (todo != NULL)
        send_aborts(m, s->room, gen, todo, n_todo, tl);
    if (verify != NULL && !kvb__icheck_submit(m, s->room, verify, tl))
        integ_finish(m, s->room, verify, tl);
    if (own != NULL)
        own_finish(m, own_d, own, tl);
    kvb__tl_put(tl);
}

static void on_status(struct kvb_manager *m, const kvb__dialect_t *d, const kvb__frame_t *f,
                      size_t n)
{
    kvb__status_in_t s;
    if (d->decode_status(m, f, n, &s) == KVB_OK)
        status_in(m, &s);
}

static void on_aux(struct kvb_manager *m, const kvb__dialect_t *d, const kvb__frame_t *f, size_t n)
{
    kvb__aux_in_t a;
    if (d->decode_aux(m, f, n, &a) != KVB_OK)
        return; /* checked against our aux buffers; a bad one fails its room */
    pthread_mutex_lock(&m->mu);
    kvb__room_t *r = kvb__room_find(m, a.room);
    if (r != NULL && r->status != KVB_POLL_FAILED) /* aux may be device memory */
        kvb__mem_copy((void *)(uintptr_t)(m->aux_ptrs[a.buffer_index] +
                                          m->aux_items[a.buffer_index] * (uint64_t)a.aux_index),
                      a.payload, a.payload_len);
    pthread_mutex_unlock(&m->mu);
}

/* ABORT_ACK from a 2026 prefill rank. The 3-frame form (SGLang's deferred
 * mode, and what a kvbridge prefill always sends, only once the room's
 * writes settled) confirms that nothing of the room is in flight from that
 * rank: it counts as that source's answer for the abort fence. The 4-frame
 * form (SGLang 0.5.23, and a kvbridge prefill answering our ABORT) must
 * echo our ABORT's generation: another is a late ACK for an earlier use of
 * the room id, ignored as SGLang's decode does. The 2-frame form is sent at
 * once, writes or not: it confirms nothing and is ignored (the fence then
 * waits for a status or KVBRIDGE_ABORT_ACK_TIMEOUT). */
static void on_abort_ack(struct kvb_manager *m, const kvb__dialect_t *d, const kvb__frame_t *f,
                         size_t n)
{
    kvb__ack_in_t a;
    if (d->decode_abort_ack(m, f, n, &a) != KVB_OK)
        return;
    KVB_LOGD("manager %s: room %llu: abort ack%s from prefill rank %d", m->endpoint,
             (unsigned long long)a.room, a.has_rank ? "" : " (2 frames, not a drain)",
             a.has_rank ? (int)a.rank : -1);
    if (!a.has_rank)
        return;
    pthread_mutex_lock(&m->mu);
    kvb__room_t *r = kvb__room_find(m, a.room);
    bool asked = r != NULL && (r->fence_open || r->lost); /* we sent it an abort */
    if (asked && a.has_generation && a.generation != r->abort_gen)
        KVB_LOGD("manager %s: room %llu: abort ack for generation %llu, ours is %llu: ignored",
                 m->endpoint, (unsigned long long)a.room, (unsigned long long)a.generation,
                 (unsigned long long)r->abort_gen);
    else if (asked && record_response(m, r, a.rank, "abort ack"))
        kvb__tl_add(r->tl, KVB_EV_ABORT_ACK_RECEIVED, a.rank, NULL);
    pthread_mutex_unlock(&m->mu);
}

void kvb__decode_on_message(struct kvb_manager *m, const kvb__frame_t *f, size_t n)
{
    kvb__dmsg_t kind;
    const kvb__dialect_t *d = kvb__dialect_classify(m, f, n, &kind);
    if (kind == KVB__DMSG_STATUS)
        on_status(m, d, f, n);
    else if (kind == KVB__DMSG_AUX)
        on_aux(m, d, f, n);
    else if (kind == KVB__DMSG_ABORT_ACK)
        on_abort_ack(m, d, f, n);
    else if (kind == KVB__DMSG_UNSUPPORTED)
        d->unsupported(m, f, n);
    else
        kvb__dialect_unexpected(m, f, n);
}

/* ---- heartbeats ---- */

typedef struct lost_abort {
    uint64_t room, gen;
    kvb__src_t src;
    kvb__tl_t *tl; /* a reference to the room's timeline */
} lost_abort_t;

/* m->mu held: fail a's rooms that are not over, revoke their writer grants
 * (no wait), and list best-effort aborts to their real sources (ZeroMQ
 * delivers them when the prefill is reachable again): the abort stops a
 * resumed prefill's queued work, and its ack confirms a source no grant
 * reached. */
static size_t fail_lost_rooms(struct kvb_manager *m, kvb__addr_t *a, lost_abort_t **ab_p,
                              size_t *n_ab)
{
    size_t affected = 0, cap = 0;
    for (size_t i = 0; i < m->n_buckets; i++)
        for (kvb__room_t *r = m->buckets[i]; r != NULL; r = r->next) {
            if (r->bootstrap_addr == NULL || strcmp(r->bootstrap_addr, a->addr) != 0 ||
                r->status == KVB_POLL_SUCCESS || r->status == KVB_POLL_FAILED || r->lost)
                continue;
            kvb__room_fail(r, "Losing connection with prefill instance (bootstrap_addr: %s)",
                           a->addr);
            r->lost = 1;
            r->abort_gen = ++m->abort_gen_last;
            revoke_grants(m, r->srcs, r->n_src);
            affected++;
            for (size_t k = 0; r->t_init > 0 && k < r->n_src; k++) {
                if (r->srcs[k].dummy)
                    continue;
                if (*n_ab == cap) {
                    cap = cap ? cap * 2 : 16;
                    lost_abort_t *v = realloc(*ab_p, cap * sizeof(*v));
                    if (v == NULL)
                        return affected; /* best effort */
                    *ab_p = v;
                }
                (*ab_p)[(*n_ab)++] =
                    (lost_abort_t){r->id, r->abort_gen, r->srcs[k], kvb__tl_ref(r->tl)};
            }
        }
    return affected;
}

/* Lost rooms of a whose writes have not ended (m->mu held). */
static size_t lost_unsafe(struct kvb_manager *m, kvb__addr_t *a)
{
    size_t n = 0;
    for (size_t i = 0; i < m->n_buckets; i++)
        for (kvb__room_t *r = m->buckets[i]; r != NULL; r = r->next)
            n += r->lost && r->bootstrap_addr != NULL && strcmp(r->bootstrap_addr, a->addr) == 0 &&
                 r->status == KVB_POLL_FAILED && !writes_ended(m, r);
    return n;
}

/* The prefill instance behind a stopped answering: its rooms fail, their
 * grants are revoked, and the thread waits (KVBRIDGE_FENCE_WAIT) for what
 * those grants admitted, so that a rank that was only stalled (SIGSTOP, a
 * long pause) is usually drained when the framework next polls. A room
 * whose writes have not ended is held by poll() (fence_done). Later rooms
 * resolve the instance again and get grants of their own. */
static void node_failure(struct kvb_manager *m, kvb__addr_t *a)
{
    lost_abort_t *ab = NULL;
    size_t n_ab = 0, unsafe = 0;
    pthread_mutex_lock(&m->mu);
    addr_forget(a);
    size_t affected = fail_lost_rooms(m, a, &ab, &n_ab);
    pthread_mutex_unlock(&m->mu);
    for (size_t i = 0; i < n_ab; i++) {
        send_abort(m, &ab[i].src, ab[i].room, ab[i].gen, ab[i].tl);
        kvb__tl_put(ab[i].tl);
    }
    free(ab);
    double deadline = kvb__now_s() + m->fence_wait_s;
    do {
        pthread_mutex_lock(&m->mu);
        unsafe = lost_unsafe(m, a);
        pthread_mutex_unlock(&m->mu);
    } while (unsafe > 0 && kvb__now_s() < deadline && usleep(2000) == 0);
    KVB_LOGE("Losing connection with prefill instance (bootstrap_addr: %s), %zu requests "
             "affected%s",
             a->addr, affected,
             unsafe ? " (writes of some still in flight: poll() holds them until they end)" : "");
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
        __atomic_add_fetch(&m->hb_requests, 1, __ATOMIC_RELAXED);
        if (st != KVB_OK)
            __atomic_add_fetch(&m->hb_failed, 1, __ATOMIC_RELAXED);
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
    m->fence_wait_s = kvb__env_double("KVBRIDGE_FENCE_WAIT", NULL, 1, 0, 60);
    m->abort_ack_timeout_s = kvb__env_double("KVBRIDGE_ABORT_ACK_TIMEOUT", NULL, 30, 0.01, 1e9);
    if (kvb__icheck_start(m, integ_report) != KVB_OK)
        return KVB_ERR_IO;
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
    kvb__icheck_stop(m); /* the control thread, which feeds it, has ended */
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
