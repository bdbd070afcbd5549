/* Prefill side of TokenSpeed 0.1.1's CachePD dialect (spec 4.2-4.5, 7; field
 * by field: docs/tokenspeed-cachepd-fields.md), and the dialect's table.
 *
 * A decode rank registers once per prefill rank with its layout contract
 * and one slab pointer; this rank plans the route then (the fragments never
 * travel: both sides run TokenSpeed's planner), from this rank's own
 * contract (own.c) and the decode's, and keeps both with the registration
 * (kvb__reg_t.priv). Each request carries the decode's block manifest; each
 * chunk the sender queues becomes strided blocks by kvb__cpd_plan_copy.
 * Statuses are 7 frames, Success 5, only at the end; a dummy rank sends
 * none. A refused registration is kept as a refusal, so the session's
 * requests are answered Failed with the reason (TokenSpeed remembers the
 * rejected endpoint the same way); every refused request is answered
 * Failed, with the reason in the room (TokenSpeed drops several silently,
 * spec 4.5). */
#include "dialect/cachepd/adapter.h"
#include "dialect/cachepd/cpd_int.h"
#include "engine/peer_region.h"
#include "proto/frames_kit.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* What this rank keeps of one decode rank's registration. */
typedef struct cpd_reg {
    kvb__cpd_contract_t decode; /* its contract (frame 5) */
    kvb__cpd_contract_t own;    /* this rank's, built against it */
    kvb__cpd_stages_t stages;   /* one stage: every field (PP 1) */
    kvb__cpd_route_t route;     /* what this rank sends it, or a dummy route */
    uint64_t *page0;            /* per own field: where its page 0 is here */
    uint64_t slab;              /* frame 4 */
    uint32_t dtp, drank;        /* frames 6, 7 */
    char *canon;                /* its contract, canonical: a re-registration compares it */
} cpd_reg_t;

static void reg_free(void *priv)
{
    cpd_reg_t *r = priv;
    if (r == NULL)
        return;
    kvb__cpd_contract_free(&r->decode);
    kvb__cpd_contract_free(&r->own);
    kvb__cpd_stages_free(&r->stages);
    kvb__cpd_route_free(&r->route);
    free(r->page0);
    free(r->canon);
    free(r);
}

/* TokenSpeed's status sender id: the stage-major rank (spec 12.1). */
static uint32_t stage_major_rank(const struct kvb_manager *m)
{
    return (uint32_t)(m->p.pp_rank * m->p.attn_tp_size + m->p.attn_tp_rank);
}

/* ---- statuses: 7 frames, Success 5 / Failed 0, only at the end ---- */

/* Failed carries no token (-1) but still the cached tokens, as TokenSpeed's
 * sync_status_to_decode_endpoint does (spec 4.4). */
static kvb_status_t send_status(struct kvb_manager *m, const char *ip, uint16_t port, uint64_t room,
                                int status, int32_t rank)
{
    (void)rank; /* the connector's rank order is not TokenSpeed's stage-major one */
    int32_t *cands = NULL;
    size_t n = 0;
    bool ok = status == KVB_POLL_SUCCESS;
    kvb__cpd_status_t s = {room,
                           ok ? KVB__CPD_SUCCESS : KVB__CPD_FAILED,
                           stage_major_rank(m),
                           -1,
                           kvb__i32_view_of(NULL, 0),
                           0,
                           false,
                           0.0};
    if (ok)
        s.token = kvb__output_first_token(m, room, &cands, &n);
    s.candidates = kvb__i32_view_of(cands, cands ? n : 0);
    bool has_lp = kvb__output_extras(m, room, &s.cached_tokens, &s.logprob);
    s.has_logprob = ok && has_lp;
    kvb__cpd_msg_t msg;
    kvb__frames_err_t e;
    kvb__cpd_msg_init(&msg);
    kvb_status_t st = kvb__cpd_send_encoded(m, ip, port, kvb__cpd_encode_status(&s, &e, &msg), &msg,
                                            &e, "status");
    free(cands);
    return st;
}

/* ---- registration (spec 4.2) ---- */

/* Frames 1-3 into the connector's record: the status endpoint is frame 1
 * cut at its first ':' (TokenSpeed's own reading, spec 2). */
static void reg_header(struct kvb_manager *m, const kvb__cpd_reg_t *x, kvb__reg_in_t *in)
{
    const char *colon = memchr(x->endpoint, ':', x->endpoint_len);
    in->ip = x->endpoint;
    in->ip_len = colon != NULL ? (size_t)(colon - x->endpoint) : x->endpoint_len;
    in->port = x->port;
    in->session = x->session_id;
    in->session_len = x->session_id_len;
    in->tp_size = 1;
    in->item_len = 1;
    in->dialect = &kvb__dialect_cachepd;
    kvb__outputs_enable(m); /* its statuses carry first tokens */
    kvb__endpoint_note(m, in->ip, in->ip_len, in->port, &kvb__dialect_cachepd);
}

/* A refused registration: kept as a refusal, so the session's later
 * requests are answered Failed; the connector fails the rooms already
 * holding its requests (trait refusal_ends_rooms). */
static void refuse(kvb__reg_in_t *in, const char *why)
{
    char buf[1024], show[256]; /* the session as the peer wrote it, escaped and cut */
    snprintf(buf, sizeof(buf), "Decode session %s registration rejected: %s",
             kvb__cpd_show(in->session, in->session_len, show), why);
    free(in->refuse);
    in->refuse = strdup(buf);
}

/* The route this rank serves decode rank r->drank by (spec 4.2 step 1). */
static bool reg_plan(struct kvb_manager *m, cpd_reg_t *r, char *why, size_t wl)
{
    kvb__frames_err_t e;
    if (kvb__cpd_own_contract(m, &r->decode, &r->own, why, wl) != KVB_OK)
        return false;
    kvb__cpd_pair_t pair = {&r->own, &r->decode, &r->stages, (uint32_t)m->p.attn_tp_size, r->dtp};
    kvb_status_t st = kvb__cpd_check_peer(&r->own, &r->decode, &e);
    if (st == KVB_OK)
        st = kvb__cpd_stages_single(&r->own, &r->stages);
    if (st == KVB_OK)
        st = kvb__cpd_plan_registration(&pair, 0, (uint32_t)m->p.attn_tp_rank, r->drank, &e,
                                        &r->route);
    if (st != KVB_OK) {
        snprintf(why, wl, "%s", st == KVB_ERR_PROTO ? e.reason : kvb_status_string(st));
        return false;
    }
    if (!r->route.dummy && (r->page0 = kvb__cpd_own_page0(m, &r->own, why, wl)) == NULL)
        return false;
    size_t len;
    if (kvb__cpd_contract_encode(&r->decode, &r->canon, &len) != KVB_OK) {
        snprintf(why, wl, "out of memory");
        return false;
    }
    return true;
}

/* TokenSpeed keeps an equal re-registration and rejects a different one for
 * a session it holds (spec 4.2 steps 2-3); a refused record is no holding. */
static bool conflicts(struct kvb_manager *m, const kvb__reg_in_t *in, const cpd_reg_t *r)
{
    char sid[KVB_SID_MAX];
    kvb__copy_str(sid, sizeof(sid), in->session, in->session_len);
    kvb__reg_t *g = kvb__reg_get(m, sid);
    const cpd_reg_t *o =
        g != NULL && g->dialect == &kvb__dialect_cachepd && g->plan_error == NULL ? g->priv : NULL;
    bool differ =
        o != NULL && (o->slab != r->slab || o->dtp != r->dtp || o->drank != r->drank ||
                      g->port != in->port || strlen(g->ip) != in->ip_len ||
                      memcmp(g->ip, in->ip, in->ip_len) != 0 || strcmp(o->canon, r->canon) != 0);
    kvb__reg_put(g);
    return differ;
}

static kvb_status_t decode_registration(struct kvb_manager *m, const kvb__frame_t *f, size_t n,
                                        kvb__reg_in_t *in)
{
    kvb__cpd_reg_t x;
    kvb__frames_err_t e, eh;
    char why[768];
    memset(in, 0, sizeof(*in));
    cpd_reg_t *r = calloc(1, sizeof(*r));
    if (r == NULL)
        return KVB_ERR_NOMEM;
    if (kvb__cpd_decode_registration(f, n, &e, &x, &r->decode) != KVB_OK) {
        free(r);
        kvb__conn_bad_message(m, "CachePD registration", &e);
        if (kvb__cpd_decode_registration_header(f, n, &eh, &x) != KVB_OK)
            return KVB_ERR_PROTO; /* nobody to answer */
        reg_header(m, &x, in);
        refuse(in, e.reason); /* the session's requests are answered Failed */
        return KVB_OK;
    }
    reg_header(m, &x, in);
    r->slab = x.slab;
    r->dtp = x.decode_tp_size;
    r->drank = x.decode_tp_rank;
    in->tp_rank = (int32_t)x.decode_tp_rank;
    in->tp_size = (int32_t)x.decode_tp_size;
    in->kv = (kvb__u64_view_t){f[4].data, 1}; /* the slab: the record's one KV pointer */
    why[0] = '\0';
    if (x.session_id_len >= KVB_SID_MAX)
        snprintf(why, sizeof(why), "a session id of %zu bytes (kvbridge holds %d)",
                 x.session_id_len, KVB_SID_MAX - 1);
    else if (reg_plan(m, r, why, sizeof(why)) && conflicts(m, in, r))
        snprintf(why, sizeof(why), "conflicting registration for an active CachePD session");
    if (why[0] != '\0') {
        reg_free(r);
        refuse(in, why);
        return KVB_OK;
    }
    in->priv = r;
    return KVB_OK;
}

/* ---- pre-allocation request (spec 4.3) ---- */

/* The ids fit the connector's int32 destination pages and state slots (a
 * contract may claim more pages than that; validated ids are > 0). */
static bool ids_fit(const kvb__cpd_manifest_t *man)
{
    for (uint32_t g = 0; g < man->ngroups; g++) {
        if (man->groups[g].n > INT32_MAX)
            return false;
        for (size_t i = 0; i < man->groups[g].n; i++)
            if (man->groups[g].block_ids[i] > INT32_MAX)
                return false;
    }
    return true;
}

/* The history group of this rank's contract (kvb__cpd_template_contract
 * and the ordinary recipe make exactly one); the peer check made the
 * decode's groups the same, in the same order. */
static uint32_t history_spec(const kvb__cpd_contract_t *own)
{
    for (uint32_t s = 0; s < own->nspecs; s++)
        if (own->specs[s].family == KVB__CPD_HISTORY)
            return s;
    return 0;
}

/* Why kvbridge does not serve this request of registration g (empty: it
 * does). TokenSpeed's checks and texts where it has them. */
static void request_refusal(const kvb__reg_t *g, const kvb__cpd_req_t *q,
                            const kvb__cpd_manifest_t *man, char *why, size_t wl)
{
    const cpd_reg_t *r = g->priv;
    kvb__frames_err_t e;
    if (g->plan_error != NULL)
        snprintf(why, wl, "%s", g->plan_error);
    else if (r == NULL)
        snprintf(why, wl,
                 "CachePD request references a Decode session whose route was never "
                 "planned");
    else if (q->is_dummy != r->route.dummy)
        snprintf(why, wl,
                 "invalid pre-allocation metadata: CachePD request kind disagrees with "
                 "its registration");
    else if (!q->is_dummy && kvb__cpd_manifest_validate(man, &r->decode, &e) != KVB_OK)
        snprintf(why, wl, "invalid pre-allocation metadata: %s", e.reason);
    else if (!q->is_dummy && !ids_fit(man))
        snprintf(why, wl,
                 "invalid pre-allocation metadata: block ids past %d (the connector holds "
                 "destination pages as int32)",
                 INT32_MAX);
    else
        why[0] = '\0';
}

/* What a room's fan-out check needs of each destination (kvb__dst_t.plan):
 * its registration's decode TP size and rank and expected decode ranks. */
typedef struct cpd_fan {
    uint32_t dtp, drank, nexpected;
    uint16_t expected[]; /* ascending */
} cpd_fan_t;

static cpd_fan_t *fan_of(const cpd_reg_t *r)
{
    cpd_fan_t *f = malloc(sizeof(*f) + (r->route.nexpected + 1) * sizeof(uint16_t));
    if (f == NULL)
        return NULL;
    f->dtp = r->dtp;
    f->drank = r->drank;
    f->nexpected = r->route.nexpected;
    memcpy(f->expected, r->route.expected, r->route.nexpected * sizeof(uint16_t));
    return f;
}

static bool fan_expects(const cpd_fan_t *f, uint32_t rank)
{
    for (uint32_t i = 0; i < f->nexpected; i++)
        if (f->expected[i] == rank)
            return true;
    return false;
}

/* TokenSpeed's _validate_cache_room_fanout: one decode TP size and one
 * expected set among the room's registrations, and their decode ranks
 * exactly that set (the count is the connector's). A refused request has no
 * record: it fails the room by itself. */
static void check_fanout(const kvb__dst_t *dsts, size_t n, char *why, size_t wl)
{
    const cpd_fan_t *f0 = n > 0 && dsts[0].dialect == &kvb__dialect_cachepd ? dsts[0].plan : NULL;
    bool consistent = f0 != NULL, covered = true;
    for (size_t i = 0; f0 != NULL && i < n; i++) {
        const cpd_fan_t *f = dsts[i].dialect == &kvb__dialect_cachepd ? dsts[i].plan : NULL;
        if (f == NULL)
            return;
        consistent = consistent && f->dtp == f0->dtp && f->nexpected == f0->nexpected &&
                     memcmp(f->expected, f0->expected, f->nexpected * sizeof(uint16_t)) == 0;
        covered = covered && fan_expects(f0, f->drank);
    }
    for (uint32_t k = 0; consistent && covered && k < f0->nexpected; k++) {
        bool seen = false;
        for (size_t i = 0; i < n && !seen; i++)
            seen = ((const cpd_fan_t *)dsts[i].plan)->drank == f0->expected[k];
        covered = seen;
    }
    if (f0 != NULL && !consistent)
        snprintf(why, wl,
                 "invalid pre-allocation metadata: Cache-transfer room has inconsistent TP "
                 "metadata");
    else if (f0 != NULL && (!covered || n != f0->nexpected))
        snprintf(why, wl,
                 "invalid pre-allocation metadata: Cache-transfer room destination ranks "
                 "disagree with the typed route plan");
}

/* A manifest into the destination: the history group's block ids as its
 * pages, each state group's one block (latest_snapshot) as its state
 * slots, in group order. */
static kvb_status_t dst_ids(const cpd_reg_t *r, const kvb__cpd_manifest_t *man, kvb__dst_t *d)
{
    uint32_t h = history_spec(&r->own), ns = 0;
    const kvb__cpd_mgroup_t *hg = &man->groups[h];
    d->prefix_tokens = man->prefix_len;
    d->skip_pages = (uint64_t)man->prefix_len / r->own.specs[h].granularity;
    d->n_pages = hg->n;
    d->pages = malloc((hg->n ? hg->n : 1) * sizeof(int32_t));
    d->state_idx = malloc((r->own.nspecs ? r->own.nspecs : 1) * sizeof(int32_t));
    if (d->pages == NULL || d->state_idx == NULL)
        return KVB_ERR_NOMEM;
    for (size_t i = 0; i < hg->n; i++) /* 0 < id < the decode's page count: validated */
        d->pages[i] = (int32_t)hg->block_ids[i];
    for (uint32_t s = 0; s < r->own.nspecs; s++)
        if (s != h && man->groups[s].n == 1)
            d->state_idx[ns++] = (int32_t)man->groups[s].block_ids[0];
    d->n_state = ns;
    return KVB_OK;
}

/* The destination of a request: the registration's endpoint and the
 * manifest's block ids (dst_ids); refused ones with none. */
static kvb_status_t dst_of(const kvb__reg_t *g, const kvb__cpd_manifest_t *man, bool dummy,
                           kvb__dst_t *d)
{
    const cpd_reg_t *r = g->priv;
    memset(d, 0, sizeof(*d));
    snprintf(d->session, sizeof(d->session), "%s", g->session);
    snprintf(d->ip, sizeof(d->ip), "%s", g->ip);
    d->port = g->port;
    d->dummy = dummy;
    d->aux_index = -1; /* the first token travels in the status, not in aux */
    d->dialect = &kvb__dialect_cachepd;
    bool served = r != NULL && (man != NULL || dummy); /* a refused one: no fan-out record */
    if (served && (d->plan = fan_of(r)) == NULL)
        return KVB_ERR_NOMEM;
    /* a dummy's manifest is empty; a served one has the decode's groups, which
     * the peer check made this rank's */
    if (man != NULL && r != NULL && man->ngroups == r->own.nspecs && man->ngroups > 0)
        return dst_ids(r, man, d);
    d->pages = malloc(sizeof(int32_t));
    return d->pages == NULL ? KVB_ERR_NOMEM : KVB_OK;
}

/* The CachePD registration of the request's session (frame 1), or NULL
 * with why (nobody to tell: TokenSpeed cannot either, spec 4.5). */
static kvb__reg_t *request_reg(struct kvb_manager *m, const kvb__frame_t *f, char *why, size_t wl)
{
    char sid[KVB_SID_MAX];
    kvb__copy_str(sid, sizeof(sid), (const char *)f[1].data, f[1].len);
    kvb__reg_t *g = f[1].len < KVB_SID_MAX ? kvb__reg_get(m, sid) : NULL;
    if (g != NULL && g->dialect == &kvb__dialect_cachepd)
        return g;
    char show[256]; /* peer bytes, escaped and cut */
    kvb__cpd_show((const char *)f[1].data, f[1].len, show);
    snprintf(why, wl,
             g == NULL ? "CachePD request references an unregistered Decode session %s"
                       : "CachePD request from Decode session %s, registered in another dialect",
             show);
    kvb__reg_put(g);
    return NULL;
}

/* Count a request kvbridge cannot answer; its room (when named) fails here. */
static kvb_status_t unanswerable(struct kvb_manager *m, const kvb__frames_err_t *e)
{
    kvb__conn_bad_message(m, "CachePD request", e);
    return KVB_ERR_PROTO;
}

/* The destination (in out) of a request of registration g: refused ones
 * (out->why) write nothing and hear Failed, dummy or not. */
static kvb_status_t take_dst(kvb__reg_t *g, const kvb__cpd_req_t *q, const kvb__cpd_manifest_t *man,
                             kvb__xfer_in_t *out)
{
    if (out->why[0] == '\0')
        request_refusal(g, q, man, out->why, sizeof(out->why));
    bool refused = out->why[0] != '\0';
    const cpd_reg_t *r = g->priv;
    out->room = q->room;
    out->required = refused || r == NULL ? 1 : (int32_t)r->route.nexpected;
    kvb_status_t st = dst_of(g, refused ? NULL : man, !refused && q->is_dummy, &out->d);
    if (st != KVB_OK) {
        kvb__dst_free(&out->d);
        memset(&out->d, 0, sizeof(out->d));
    }
    return st;
}

static kvb_status_t take_transfer(struct kvb_manager *m, const kvb__frame_t *f, size_t n,
                                  kvb__xfer_in_t *out)
{
    kvb__cpd_req_t q;
    kvb__cpd_manifest_t man = {0};
    kvb__frames_err_t e;
    memset(out, 0, sizeof(*out));
    kvb_status_t st = kvb__cpd_decode_request(f, n, &e, &q, &man);
    bool named = st == KVB_OK || (e.has_room && n == KVB__CPD_REQ_FRAMES && f[1].len > 0);
    char why[KVB__FRAMES_REASON_MAX];
    kvb__reg_t *g = named ? request_reg(m, f, why, sizeof(why)) : NULL;
    if (st == KVB_OK && g == NULL) { /* well formed, from nobody we know */
        e.has_room = true;
        e.room = q.room;
        snprintf(e.reason, sizeof(e.reason), "%s", why);
    }
    if (g == NULL) { /* malformed or unregistered: counted, nobody to tell */
        kvb__cpd_manifest_free(&man);
        return unanswerable(m, &e);
    }
    if (st != KVB_OK) { /* counted; the room fails with the reason when added */
        kvb__frames_err_t counted = e;
        counted.has_room = false;
        kvb__conn_bad_message(m, "CachePD request", &counted);
        snprintf(out->why, sizeof(out->why), "invalid pre-allocation metadata: %s", e.reason);
        q.room = e.room;
        q.is_dummy = false;
    }
    kvb_status_t dst = take_dst(g, &q, &man, out);
    kvb__reg_put(g);
    kvb__cpd_manifest_free(&man);
    return dst != KVB_OK ? dst : st == KVB_OK ? KVB_OK : KVB_ERR_PROTO;
}

/* ---- the data path: one chunk's blocks for one decode ---- */

/* Every page a chunk may write of each field of the decode's (pages
 * 1..page_count - 1, page 0 being the null page) lies in one region that
 * decode registered with the engine: no write of a checked page leaves it.
 * Field by field: a kvbridge decode's planes are separate buffers, and a
 * plane may span more than its buffer (kvb__cpd_template_contract). */
static bool field_ok(struct kvb_manager *m, const kvb__dst_t *d, const cpd_reg_t *r, uint32_t i,
                     char *why, size_t wl)
{
    const kvb__cpd_field_t *f = &r->decode.fields[i];
    uint64_t pages = r->decode.groups[f->group].page_count, base = 0, len = 0, lo = 0, hi = 0;
    if (pages <= 1)
        return true;
    /* no overflow past the slab offsets: the contract's checks keep pages in the arena */
    bool sums = kvb__add_u64(r->slab, f->page0 + f->page_stride, &lo) &&
                kvb__add_u64(lo, (pages - 2) * f->page_stride + f->payload, &hi);
    kvb_status_t st = sums ? kvb__engine_peer_region(m->engine, d->session, lo,
                                                     m->transfer_timeout_s, &base, &len)
                           : KVB_ERR_BOUNDS;
    if (st == KVB_OK && hi <= base + len)
        return true;
    snprintf(why, wl,
             "decode %s: field %s of its contract ([0x%llx, 0x%llx) past slab 0x%llx) is not "
             "in one region it registered (%s)",
             d->session, f->field_id, (unsigned long long)lo, (unsigned long long)hi,
             (unsigned long long)r->slab, st == KVB_OK ? "it ends past it" : kvb_status_string(st));
    return false;
}

static bool slab_ok(struct kvb_manager *m, const kvb__dst_t *d, const cpd_reg_t *r, char *why,
                    size_t wl)
{
    for (uint32_t i = 0; i < r->decode.nfields; i++)
        if (!field_ok(m, d, r, i, why, wl))
            return false;
    return true;
}

/* Request pages of the chunk -> block id pairs (TokenSpeed ids: this
 * rank's page p is id p + 1). The sender may hold the whole prompt (the
 * decode's prefix skipped) or only the pages the manifest asks for. */
static bool chunk_pairs(const kvb__dst_t *d, const kvb__chunk_t *c, uint64_t pool, int64_t *src,
                        int64_t *dst, size_t *n_p, char *why, size_t wl)
{
    uint64_t shift = 0;
    *n_p = 0;
    if (c->total == d->n_pages + d->skip_pages && d->skip_pages > 0)
        shift = d->skip_pages;
    else if (c->total != d->n_pages) {
        snprintf(why, wl,
                 "the sender has %llu pages; decode %s holds a %llu-page prefix and asked for "
                 "%zu",
                 (unsigned long long)c->total, d->session, (unsigned long long)d->skip_pages,
                 d->n_pages);
        return false;
    }
    for (size_t i = 0; i < c->n; i++) {
        uint64_t gi = c->first + i;
        if (gi < shift)
            continue;
        if (c->indices[i] < 0 || (uint64_t)c->indices[i] >= pool) {
            snprintf(why, wl, "prefill page %d is outside this prefill's pool of %llu pages",
                     (int)c->indices[i], (unsigned long long)pool);
            return false;
        }
        src[*n_p] = (int64_t)c->indices[i] + 1;
        dst[(*n_p)++] = d->pages[gi - shift];
    }
    return true;
}

/* The state groups' pairs (last chunk only): this rank's one state slot
 * (block slot + 1) to each group's block of the decode's manifest. */
static bool state_pairs(struct kvb_manager *m, const kvb__dst_t *d, const kvb__chunk_t *c,
                        int64_t *src, int64_t *dst, char *why, size_t wl)
{
    if (d->n_state == 0 || !c->is_last)
        return true;
    if (c->n_state != 1 || c->state_idx[0] < 0 ||
        (uint64_t)c->state_idx[0] >= kvb__cpd_state_pool(m)) {
        snprintf(why, wl,
                 "room %llu: a CachePD decode takes one state slot per request, within this "
                 "prefill's %llu; the sender gave %zu (kvb_sender_set_state_indices)",
                 (unsigned long long)c->room, (unsigned long long)kvb__cpd_state_pool(m),
                 c->n_state);
        return false;
    }
    for (size_t i = 0; i < d->n_state; i++) {
        src[i] = (int64_t)c->state_idx[0] + 1;
        dst[i] = d->state_idx[i];
    }
    return true;
}

/* One copy group per spec, in order: the history group's page pairs, each
 * state group's slot pair (ids[] holds the pairs: src first, dst after). */
static void fill_groups(const cpd_reg_t *r, const kvb__dst_t *d, const kvb__chunk_t *c,
                        const int64_t *ids, size_t npages, size_t cap, kvb__cpd_copy_group_t *grp)
{
    uint32_t h = history_spec(&r->own);
    size_t k = 0;
    bool state = c->is_last && d->n_state > 0;
    for (uint32_t s = 0; s < r->own.nspecs; s++) {
        if (s == h)
            grp[s] = (kvb__cpd_copy_group_t){ids, ids + cap, npages};
        else if (state && k < d->n_state) {
            grp[s] = (kvb__cpd_copy_group_t){ids + npages + k, ids + cap + npages + k, 1};
            k++;
        } else
            grp[s] = (kvb__cpd_copy_group_t){NULL, NULL, 0};
    }
}

static void plan_job(struct kvb_manager *m, kvb__reg_t *g, const kvb__dst_t *d,
                     const kvb__chunk_t *c, kvb_plan_strided_t *out, kvb_status_t *st_p, char *why,
                     size_t wl)
{
    const cpd_reg_t *r = g->dialect == &kvb__dialect_cachepd ? g->priv : NULL;
    *st_p = KVB_ERR_INVALID;
    if (g->plan_error != NULL || r == NULL || r->route.dummy || r->route.nsources != 1) {
        snprintf(why, wl, "decode %s re-registered since its request: %s", d->session,
                 g->plan_error != NULL ? g->plan_error : "no route to it now");
        return;
    }
    size_t cap = c->n + d->n_state, n = 0; /* src ids, then dst ids, each cap long */
    int64_t *ids = malloc((cap ? 2 * cap : 1) * sizeof(int64_t));
    kvb__cpd_copy_group_t *grp = calloc(r->own.nspecs ? r->own.nspecs : 1, sizeof(*grp));
    kvb__frames_err_t e;
    if (ids == NULL || grp == NULL)
        snprintf(why, wl, "out of memory");
    else if (chunk_pairs(d, c, kvb__cpd_kv_pool(m), ids, ids + cap, &n, why, wl) &&
             state_pairs(m, d, c, ids + n, ids + cap + n, why, wl) && slab_ok(m, d, r, why, wl)) {
        fill_groups(r, d, c, ids, n, cap, grp);
        kvb__cpd_copy_t cp = {
            &r->route.sources[0], &r->own, &r->own, &r->decode, 0, r->slab, grp, NULL, r->page0};
        *st_p = kvb__cpd_plan_copy(&cp, &e, out);
        if (*st_p != KVB_OK)
            snprintf(why, wl, "room %llu: %s", (unsigned long long)c->room,
                     *st_p == KVB_ERR_PROTO ? e.reason : kvb_status_string(*st_p));
    }
    free(ids);
    free(grp);
}

/* ---- dispatch ---- */

/* Told apart from the other dialects on one port (spec 12.4): an 8-frame
 * registration whose frame 4 is one pointer and frame 5 a JSON object
 * (seed 004's frame 5 is empty), a 3-frame request (no other dialect sends
 * 3 frames to a prefill). On a decode: 6- and 7-frame statuses (seed 004's
 * have 5). */
static kvb__dmsg_t classify(struct kvb_manager *m, const kvb__frame_t *f, size_t n)
{
    if (m->mode != KVB_MODE_PREFILL) /* a 7-frame seed-001 transfer info reaches prefills only */
        return kvb__cpd_is_status(f, n) ? KVB__DMSG_STATUS : KVB__DMSG_NONE;
    if (kvb__cpd_is_registration(f, n))
        return KVB__DMSG_REGISTRATION;
    return kvb__cpd_is_request(f, n) ? KVB__DMSG_TRANSFER : KVB__DMSG_NONE;
}

const kvb__dialect_t kvb__dialect_cachepd = {
    .t = {.name = "TokenSpeed 0.1.1 CachePD",
          .family = "TokenSpeed",
          .plans_chunks = true, /* planned here from both contracts (plan_job) */
          .extensions = false,
          .suffix_pages = true,
          .own_status = true,
          .stage_major = true,
          .refusal_ends_rooms = true},
    .boot_dialect = KVB_BOOTSTRAP_DIALECT_CACHEPD,
    .classify = classify,
    .decode_registration = decode_registration,
    .take_transfer = take_transfer,
    .send_status = send_status,
    .plan_job = plan_job,
    .plan_free = free, /* a destination's cpd_fan_t */
    .check_fanout = check_fanout,
    .reg_free = reg_free,
    .boot_put = kvb__cpd_own_put,
    .check_manager = kvb__cpd_check_manager,
    .addr_info = kvb__cpd_addr_info,
    .addr_route = kvb__cpd_addr_route,
    .addr_free = kvb__cpd_addr_free,
    .send_registration = kvb__cpd_send_registration,
    .send_transfer = kvb__cpd_send_transfer,
    .send_abort = kvb__dialect_no_abort, /* CachePD has none */
    .transfer_form = kvb__cpd_transfer_form,
    .decode_status = kvb__cpd_status_in,
};
