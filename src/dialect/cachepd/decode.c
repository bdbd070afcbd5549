/* Decode side of TokenSpeed 0.1.1's CachePD dialect (spec 3.3, 4.2-4.4,
 * 7.6; field by field: docs/tokenspeed-cachepd-fields.md): a kvbridge
 * decode whose bootstrap server answered in CachePD's shape.
 *
 * The answer carries the prefill's layout contract; this rank's own is
 * TokenSpeed's ordinary recipe over kvbridge's KV buffers, registered as one
 * slab (own.c, kvb__cpd_own_slab). Both sides run the planner: the route
 * (sources over every stage, stage-major, and on TP rank 0 the dummies) is
 * planned here once per prefill instance and kept with the bootstrap
 * address (kvb__addr_t.priv). Each room sends every target a 3-frame
 * request: the block manifest (this rank's pages past the prefix, as
 * TokenSpeed ids: kvbridge page p is block p + 1, block 0 being the null
 * page), empty for a dummy. Statuses are 7 frames; a Success carries the
 * first token, candidates, cached tokens and logprob into the outputs
 * table. There is no abort message (kvb__dialect_no_abort): a failed room's
 * fence waits for each source's status (or the abort-ack time-out). */
#include "dialect/cachepd/adapter.h"
#include "dialect/cachepd/cpd_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* What this decode keeps of one prefill instance (kvb__addr_t.priv). */
typedef struct cpd_addr {
    kvb__cpd_pinfo_t pi; /* the prefill's sizes, contract and stages */
    char *contract;      /* ours, as frame 5 sends it */
    size_t contract_len;
    uint64_t slab;              /* frame 4 */
    kvb_plan_source_t *targets; /* the route's sources, then its dummies */
    uint32_t ntargets, nsources;
} cpd_addr_t;

void kvb__cpd_addr_free(void *priv)
{
    cpd_addr_t *a = priv;
    if (a == NULL)
        return;
    kvb__cpd_pinfo_free(&a->pi);
    free(a->contract);
    free(a->targets);
    free(a);
}

/* The targets of decode rank tp_rank: sources first (they answer), dummies
 * (registered and asked, never answering) after. */
static kvb_status_t plan_targets(const struct kvb_manager *m, cpd_addr_t *a,
                                 const kvb__cpd_contract_t *own, char *why, size_t wl)
{
    kvb__cpd_pair_t pair = {&a->pi.contract, own, &a->pi.stages, a->pi.tp_size,
                            (uint32_t)m->p.attn_tp_size};
    kvb__cpd_route_t r;
    kvb__frames_err_t e;
    kvb_status_t st = kvb__cpd_plan_decode(&pair, (uint32_t)m->p.attn_tp_rank, &e, &r);
    if (st != KVB_OK) {
        snprintf(why, wl, "%s", st == KVB_ERR_PROTO ? e.reason : kvb_status_string(st));
        return st;
    }
    a->nsources = r.nsources;
    a->ntargets = r.nsources + r.ndummies;
    a->targets = calloc(a->ntargets + 1, sizeof(*a->targets));
    for (uint32_t i = 0; a->targets != NULL && i < a->ntargets; i++) {
        bool dummy = i >= r.nsources;
        a->targets[i].prefill_rank = dummy ? r.dummies[i - r.nsources] : r.sources[i].prefill_rank;
        a->targets[i].dummy = dummy;
    }
    kvb__cpd_route_free(&r);
    if (a->targets == NULL) {
        snprintf(why, wl, "out of memory");
        return KVB_ERR_NOMEM;
    }
    if (a->nsources == 0) {
        snprintf(why, wl, "no prefill rank sends decode rank %d anything", m->p.attn_tp_rank);
        return KVB_ERR_INVALID;
    }
    return KVB_OK;
}

/* The prefill's answer, this rank's contract against it (the prefill's
 * peer check, run here too so the room fails with its reason instead of a
 * bare Failed status), and the route. */
kvb_status_t kvb__cpd_addr_info(struct kvb_manager *m, const char *body, size_t len, void **priv_p,
                                char *why, size_t wl)
{
    kvb__frames_err_t e;
    kvb__cpd_contract_t own;
    cpd_addr_t *a = calloc(1, sizeof(*a));
    if (a == NULL)
        return KVB_ERR_NOMEM;
    memset(&own, 0, sizeof(own));
    kvb_status_t st = kvb__cpd_pinfo_parse(body, len, &e, &a->pi);
    if (st != KVB_OK)
        snprintf(why, wl, "%s", st == KVB_ERR_PROTO ? e.reason : kvb_status_string(st));
    else
        st = kvb__cpd_own_slab(m, &a->pi.contract, &own, &a->slab, why, wl);
    if (st == KVB_OK && (st = kvb__cpd_check_peer(&a->pi.contract, &own, &e)) != KVB_OK)
        snprintf(why, wl, "%s", e.reason);
    if (st == KVB_OK)
        st = plan_targets(m, a, &own, why, wl);
    if (st == KVB_OK && kvb__cpd_contract_encode(&own, &a->contract, &a->contract_len) != KVB_OK)
        st = KVB_ERR_NOMEM;
    kvb__cpd_contract_free(&own);
    if (st != KVB_OK) {
        kvb__cpd_addr_free(a);
        return st;
    }
    *priv_p = a;
    return KVB_OK;
}

kvb_status_t kvb__cpd_addr_route(struct kvb_manager *m, const void *priv, kvb_plan_route_t *route)
{
    const cpd_addr_t *a = priv;
    if (a == NULL)
        return KVB_ERR_STATE;
    route->decode_rank = (uint32_t)m->p.attn_tp_rank;
    route->num_sources = a->ntargets;
    route->sources = a->targets;
    route->required_prefill_response_num = a->nsources; /* Success from exactly the sources */
    return KVB_OK;
}

/* ---- messages ---- */

/* The 8-frame registration (spec 4.2): the endpoint is this rank's host
 * (TokenSpeed sends its IP; statuses come to it and frame 2's port). */
kvb_status_t kvb__cpd_send_registration(struct kvb_manager *m, const char *ip, uint16_t port,
                                        bool kvbridge, const void *priv)
{
    const cpd_addr_t *a = priv;
    const char *sid = kvb_engine_session_id(m->engine);
    (void)kvbridge; /* no extension frames on this wire */
    if (a == NULL)
        return KVB_ERR_STATE;
    kvb__cpd_reg_t r = {m->host,
                        strlen(m->host),
                        m->port,
                        sid,
                        strlen(sid),
                        a->slab,
                        (const uint8_t *)a->contract,
                        a->contract_len,
                        (uint32_t)m->p.attn_tp_size,
                        (uint32_t)m->p.attn_tp_rank};
    kvb__cpd_msg_t msg;
    kvb__frames_err_t e;
    kvb__cpd_msg_init(&msg);
    return kvb__cpd_send_encoded(m, ip, port, kvb__cpd_encode_registration(&r, &e, &msg), &msg, &e,
                                 "registration");
}

/* The request's prompt length: the caller's, else every page full. */
static uint64_t prompt_of(const struct kvb_manager *m, size_t count, const kvb_receiver_init_t *ex)
{
    if (ex != NULL && (ex->field_mask & KVB_RECV_INIT_PROMPT))
        return ex->prompt_tokens;
    return (uint64_t)count * m->args.page_size;
}

static uint64_t prefix_of(const kvb_receiver_init_t *ex)
{
    return ex != NULL && (ex->field_mask & KVB_RECV_INIT_PREFIX) ? ex->prefix_tokens : 0;
}

/* This rank's groups in manifest order, and which is its history group:
 * the ordinary recipe's one "full_attention", else the framework's
 * contract's (parsed again per request: its groups are all a manifest
 * needs, and nothing of it is kept per manager). */
typedef struct own_groups {
    kvb__cpd_contract_t t; /* the template, or empty */
    uint32_t n, history;
} own_groups_t;

static kvb_status_t own_groups(const struct kvb_manager *m, own_groups_t *o, char *why, size_t wl)
{
    memset(o, 0, sizeof(*o));
    o->n = 1;
    if (m->cachepd_contract == NULL)
        return KVB_OK;
    kvb_status_t st = kvb__cpd_template_parse(m, &o->t, why, wl);
    o->n = o->t.nspecs;
    for (uint32_t s = 0; st == KVB_OK && s < o->n; s++)
        if (o->t.specs[s].family == KVB__CPD_HISTORY)
            o->history = s;
    return st;
}

/* The block manifest (text in *json_p): this rank's pages past the prefix
 * in the history group, its one state slot in each state group (TokenSpeed
 * ids: kvbridge item i is block i + 1, block 0 being the null page). */
static kvb_status_t manifest_of(const struct kvb_manager *m, const int32_t *idx, size_t n,
                                const kvb_receiver_init_t *ex, char **json_p, size_t *len_p)
{
    uint64_t prefix = prefix_of(ex), skip = prefix / m->args.page_size;
    size_t nb = skip < n ? n - (size_t)skip : 0;
    char why[256];
    own_groups_t o;
    kvb_status_t st = own_groups(m, &o, why, sizeof(why));
    int64_t *ids = malloc((nb + o.n) * sizeof(*ids));
    kvb__cpd_mgroup_t *g = calloc(o.n, sizeof(*g));
    if (st == KVB_OK && (ids == NULL || g == NULL))
        st = KVB_ERR_NOMEM;
    for (size_t i = 0; st == KVB_OK && i < nb; i++)
        ids[i] = (int64_t)idx[skip + i] + 1; /* block 0 is TokenSpeed's null page */
    for (uint32_t s = 0; st == KVB_OK && s < o.n; s++) {
        bool hist = s == o.history;
        g[s].group_id =
            m->cachepd_contract == NULL ? (char *)"full_attention" : o.t.specs[s].group_id;
        g[s].n = hist ? nb : 1;
        g[s].block_ids = hist ? ids : ids + nb + s;
        if (hist)
            continue;
        if (ex == NULL || !(ex->field_mask & KVB_RECV_INIT_STATE) || ex->num_state_indices != 1)
            st = KVB_ERR_INVALID; /* transfer_form refused it before: never reached */
        else
            ids[nb + s] = (int64_t)ex->state_indices[0] + 1;
    }
    kvb__cpd_manifest_t man = {o.n, g, (int64_t)prefix, (int64_t)prompt_of(m, n, ex)};
    if (st == KVB_OK)
        st = kvb__cpd_manifest_encode(&man, json_p, len_p);
    kvb__cpd_contract_free(&o.t);
    free(ids);
    free(g);
    return st;
}

/* Issue 32: without prompt_tokens the manifest says every page is full, and
 * TokenSpeed 0.1.1's prefill takes that as the prompt: a prompt shorter
 * than its pages then waits for tokens that never come (a harness that
 * forgot it waited its whole time-out). Not refused (a prompt that fills
 * its pages needs nothing more), said once per manager. */
static void warn_no_prompt(struct kvb_manager *m, uint64_t room, size_t n,
                           const kvb_receiver_init_t *ex)
{
    static const char kind[] = "CachePD room without prompt_tokens";
    if ((ex != NULL && (ex->field_mask & KVB_RECV_INIT_PROMPT)) || !kvb__conn_note_once(m, kind))
        return;
    KVB_LOGW("manager %s: room %llu inited without prompt_tokens (KVB_RECV_INIT_PROMPT): its "
             "CachePD manifest says every one of its %zu pages is full (%llu tokens), and a "
             "TokenSpeed 0.1.1 prefill takes that as the prompt, so a shorter prompt never "
             "completes there; pass the prompt's exact length (KVReceiver.init(prompt_tokens=)). "
             "Logged once per manager",
             m->endpoint, (unsigned long long)room, n, (unsigned long long)(n * m->args.page_size));
}

/* The 3-frame request (spec 4.3); a dummy's manifest frame is empty. The
 * aux index has no place here: the first token travels in the status. */
kvb_status_t kvb__cpd_send_transfer(struct kvb_manager *m, const kvb__src_t *s, uint64_t room,
                                    const int32_t *idx, size_t n, int64_t aux,
                                    const kvb_receiver_init_t *ex)
{
    const char *sid = kvb_engine_session_id(m->engine);
    char *json = NULL;
    size_t len = 0;
    (void)aux;
    if (!s->dummy)
        warn_no_prompt(m, room, n, ex);
    kvb_status_t st = s->dummy ? KVB_OK : manifest_of(m, idx, n, ex, &json, &len);
    kvb__cpd_req_t q = {room, sid, strlen(sid), s->dummy, (const uint8_t *)json, len};
    kvb__cpd_msg_t msg;
    kvb__frames_err_t e;
    kvb__cpd_msg_init(&msg);
    if (st == KVB_OK)
        st = kvb__cpd_encode_request(&q, &e, &msg);
    st = kvb__cpd_send_encoded(m, s->ip, s->port, st, &msg, &e, "request");
    free(json);
    return st;
}

/* What a manifest cannot say: a page mask with holes (it lists one run of
 * blocks after the prefix), a prefix that is not whole pages, a prompt
 * length outside the pages given or not past the prefix (TokenSpeed's
 * prefill needs prefix_len < prompt_len and the exact prompt). */
void kvb__cpd_transfer_form(const struct kvb_manager *m, const kvb__src_t *s, size_t count,
                            const kvb_receiver_init_t *ex, char *why, size_t len)
{
    size_t hole = 0;
    uint64_t page = m->args.page_size, prompt = prompt_of(m, count, ex), prefix = prefix_of(ex);
    (void)s;
    if (kvb__dialect_mask_hole(count, ex, &hole)) {
        snprintf(why, len,
                 "a page mask with holes (entry %zu is 0) has no form in a CachePD block "
                 "manifest; use prefix_tokens",
                 hole);
        return;
    }
    kvb__dialect_prefix_form(m, count, ex, why, len);
    if (why[0] == '\0' && m->args.num_state > 0 && (ex->field_mask & KVB_RECV_INIT_STATE) &&
        ex->num_state_indices != 1)
        snprintf(why, len,
                 "%zu state indices: a CachePD manifest names one state slot per request "
                 "(one per state group)",
                 ex->num_state_indices);
    else if (why[0] == '\0' && m->args.num_state > 0 && !(ex->field_mask & KVB_RECV_INIT_STATE))
        snprintf(why, len,
                 "no state index: a CachePD prefill of a hybrid model writes the "
                 "request's state slot (state_indices)");
    if (why[0] == '\0' && (prompt <= prefix || prompt > (uint64_t)count * page ||
                           prompt <= (uint64_t)(count ? count - 1 : 0) * page))
        snprintf(why, len,
                 "a prompt of %llu tokens after a prefix of %llu does not fill the %zu pages "
                 "given (page size %llu): a CachePD prefill needs the exact prompt length "
                 "(prompt_tokens)",
                 (unsigned long long)prompt, (unsigned long long)prefix, count,
                 (unsigned long long)page);
}

/* A status into the connector's: Success 5 and Failed 0; the progress
 * values change nothing. A Success's outputs are kept as TokenSpeed's
 * decode keeps them: the first token other than -1 and its candidates, the
 * largest cached count, the first logprob. */
kvb_status_t kvb__cpd_status_in(struct kvb_manager *m, const kvb__frame_t *f, size_t n,
                                kvb__status_in_t *out)
{
    kvb__cpd_status_t s;
    kvb__frames_err_t e;
    if (kvb__cpd_decode_status(f, n, &e, &s) != KVB_OK) {
        kvb__conn_bad_message(m, "CachePD status", &e);
        return KVB_ERR_PROTO;
    }
    kvb__dialect_status_in(out, s.room, (int32_t)s.sender, s.status, KVB__CPD_SUCCESS,
                           KVB__CPD_FAILED);
    if (s.status != KVB__CPD_SUCCESS)
        return KVB_OK;
    kvb__dialect_keep_first_token(m, s.room, s.token, s.candidates);
    kvb__output_set_extras(m, s.room, &s.cached_tokens, s.has_logprob ? &s.logprob : NULL, true);
    return KVB_OK;
}
