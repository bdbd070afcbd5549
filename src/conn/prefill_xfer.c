/* Prefill side, data path: senders queue chunks; one worker per queue plans
 * each chunk for every destination (planner), writes it through the engine
 * (async, one chunk planned while the previous is in flight), and reports
 * the room's outcome to the decode ranks once its writes have settled. */
#include "dialect/dialect.h"
#include "engine/cuda_drv.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* What a worker does for one chunk: one job per real destination. */
typedef struct job {
    kvb__reg_t *reg;
    const kvb__dialect_t *dialect; /* the destination's */
    char ip[KVB_IP_MAX];
    uint16_t port;
    kvb_plan_strided_t kv; /* strided blocks: one per buffer and page run */
    kvb_plan_blocks_t aux;
    int32_t dst_aux_index;
    uint64_t epoch; /* the decode's grant, stamped on every write */
    kvb_xfer_h x, xa;
    int aux_inline; /* the engine refused the aux write: send it inline */
    int unsettled;  /* a write did not end even after its session was closed */
    kvb_status_t st;
    uint64_t t_done;    /* monotonic ns its writes settled (the timeline's stamp) */
    kvb__integ_t integ; /* integrity on, a kvbridge decode: what its writes carried */
    int has_integ;
    int integ_in_copy; /* the engine hashes its items as it copies them (kvb_xfer_digests) */
    char why[512];
} job_t;

typedef struct work {
    kvb__chunk_t *c;
    job_t *jobs;
    size_t n_jobs;
    int skip;         /* room gone, failed or aborted before any write */
    double issued;    /* when its writes were issued: their transfer time-out runs from here */
    double cancelled; /* when they were cancelled past it (0: not yet): one more from here */
    kvb__tl_t *tl;    /* the room's timeline (a reference), or NULL */
} work_t;

/* ---- queues ---- */

static void queue_push(kvb__queue_t *q, kvb__chunk_t *c)
{
    pthread_mutex_lock(&q->mu);
    c->next = NULL;
    if (q->tail)
        q->tail->next = c;
    else
        q->head = c;
    q->tail = c;
    if (++q->len > q->high_water)
        q->high_water = q->len;
    pthread_cond_signal(&q->cv);
    pthread_mutex_unlock(&q->mu);
}

/* Next chunk; waits (bounded, to see stop) only when wait is set. */
static kvb__chunk_t *queue_pop(kvb__queue_t *q, bool wait)
{
    kvb__chunk_t *c;
    pthread_mutex_lock(&q->mu);
    if (q->head == NULL && wait)
        kvb__cond_wait_ns(&q->cv, &q->mu, 100000000ull);
    c = q->head;
    if (c != NULL) {
        q->head = c->next;
        if (q->head == NULL)
            q->tail = NULL;
        q->len--;
    }
    pthread_mutex_unlock(&q->mu);
    return c;
}

static void chunk_free(kvb__chunk_t *c)
{
    if (c != NULL) {
        free(c->indices);
        free(c->state_idx);
    }
    free(c);
}

/* ---- planning ---- */

/* Plan one chunk description of job j: its KV and state blocks into j->kv
 * (strided), or, with aux, its aux blocks into j->aux (plain; appended). */
static kvb_status_t plan_into(struct kvb_manager *m, job_t *j, const kvb_plan_chunk_t *ch, bool aux)
{
    /* Draft K/V (params draft_layers) follow the target's on both sides:
     * this stage's target buffers here, every target layer at the decode
     * (reg_build_plan checked the decode holds exactly our draft count). */
    size_t per = m->p.is_mla ? 1 : 2;
    const uint64_t *sd = m->p.draft_layers ? m->kv_ptrs + per * kvb__target_layers(m) : NULL;
    const uint64_t *dd =
        m->p.draft_layers ? j->reg->kv_ptrs + per * m->args.num_layers_total : NULL;
    kvb_plan_buffers_t src = {m->kv_ptrs, sd, m->state_ptrs, m->aux_ptrs};
    kvb_plan_buffers_t dst = {j->reg->kv_ptrs, dd, j->reg->state_ptrs, j->reg->aux_ptrs};
    uint32_t p = (uint32_t)m->p.attn_tp_rank, d = (uint32_t)(j->reg->tp_rank % j->reg->tp_size);
    if (aux)
        return kvb_plan_blocks(j->reg->plan, p, d, &src, &dst, ch, &j->aux);
    return kvb_plan_strided_blocks(j->reg->plan, p, d, &src, &dst, ch, &j->kv);
}

/* Request page g goes to destination page g - shift when g >= shift and
 * its page-mask byte (if any; aligned with the destination pages) is 1. */
static bool page_wanted(const kvb__dst_t *d, uint64_t g, uint64_t shift)
{
    return g >= shift && (d->mask == NULL || d->mask[g - shift]);
}

/* Request pages a suffix-pages destination (dialect trait) skips: its pages cover only the suffix
 * after its prefix. A sender with the suffix only (SGLang's prefill sends
 * from the decode's prefix on) maps page for page; a sender with the whole
 * request skips the prefix pages. Any other count cannot be mapped. */
static bool dst_shift(const kvb__dst_t *d, const kvb__chunk_t *c, uint64_t *shift_p, char *why,
                      size_t wl)
{
    *shift_p = 0;
    if (!d->dialect->t.suffix_pages || d->skip_pages == 0 || c->total == d->n_pages)
        return true;
    if (c->total == d->n_pages + d->skip_pages) {
        *shift_p = d->skip_pages;
        return true;
    }
    snprintf(why, wl,
             "the sender has %llu pages; decode %s holds a %llu-page prefix and pre-allocated %zu "
             "suffix pages",
             (unsigned long long)c->total, d->session, (unsigned long long)d->skip_pages,
             d->n_pages);
    return false;
}

/* The decode said another page size than ours ("kv_layout="): its pages
 * and ours pair up by token rows (docs/planner.md). */
static bool rows_differ(const struct kvb_manager *m, const kvb__reg_t *g)
{
    return g->page_size != 0 && g->page_size != m->args.page_size;
}

/* Request page of the decode's first listed page: a suffix-pages transfer
 * info (2026) lists its pages after its prefix. */
static uint64_t dst_base(const kvb__reg_t *g, const kvb__dst_t *d)
{
    return d->dialect->t.suffix_pages ? (uint64_t)d->prefix_tokens / g->page_size : 0;
}

/* The sender's request page of c->indices[0] is c->first + *shift_p: 0 for
 * a sender with the whole request; prefix / P_p for one with the suffix
 * only (SGLang's prefill), told apart by its page count against the rows
 * the decode's pages can hold (refused where both or neither fit). */
static bool src_shift(uint64_t Pp, uint64_t Pd, uint64_t prefix, uint64_t n, uint64_t total,
                      uint64_t *shift_p)
{
    bool whole = total * Pp + Pd > prefix + n * Pd && (total - 1) * Pp < prefix + n * Pd;
    bool suffix = total * Pp + Pd > n * Pd && (total - 1) * Pp < n * Pd;
    *shift_p = suffix && !whole ? prefix / Pp : 0;
    return prefix == 0 || total == 0 || whole != suffix;
}

/* Rows pairing needs a prefix on both sides' page boundaries where the
 * decode lists only its suffix pages, a sender whose pages can be placed,
 * and the chunk's last page to start inside the decode's pages. */
static bool rows_fit(const struct kvb_manager *m, const kvb__reg_t *g, const kvb__dst_t *d,
                     const kvb__chunk_t *c, uint64_t *shift_p, char *why, size_t wl)
{
    uint64_t Pp = m->args.page_size, Pd = g->page_size, base = dst_base(g, d);
    uint64_t prefix = d->dialect->t.suffix_pages && d->prefix_tokens > 0 ? d->prefix_tokens : 0;
    *shift_p = 0;
    if (prefix % Pd != 0 || prefix % Pp != 0) {
        snprintf(why, wl,
                 "decode %s lists the pages after a %llu-token prefix, not a multiple of both "
                 "page sizes (decode %llu, this prefill %llu)",
                 d->session, (unsigned long long)prefix, (unsigned long long)Pd,
                 (unsigned long long)Pp);
        return false;
    }
    if (!src_shift(Pp, Pd, prefix, d->n_pages, c->total, shift_p)) {
        snprintf(why, wl,
                 "the sender has %llu pages of %llu tokens; decode %s holds a %llu-token prefix "
                 "and %zu pages of %llu tokens after it: neither the whole request nor its suffix",
                 (unsigned long long)c->total, (unsigned long long)Pp, d->session,
                 (unsigned long long)prefix, d->n_pages, (unsigned long long)Pd);
        return false;
    }
    uint64_t last = c->n > 0 ? (c->first + *shift_p + c->n - 1) * Pp : 0;
    if (c->n > 0 && last >= (base + d->n_pages) * Pd) {
        snprintf(why, wl,
                 "chunk's last page starts at token %llu but decode %s's pages end at token %llu",
                 (unsigned long long)last, d->session,
                 (unsigned long long)((base + d->n_pages) * Pd));
        return false;
    }
    return true;
}

/* Page sizes differ: one planner call per run of wanted decode pages, its
 * rows clipped to the run and the decode's prefix; rows past the decode's
 * last page are not sent (docs/planner.md). */
static kvb_status_t plan_kv_rows(struct kvb_manager *m, job_t *j, const kvb__dst_t *d,
                                 const kvb__chunk_t *c, uint64_t shift)
{
    uint64_t Pd = j->reg->page_size, base = dst_base(j->reg, d);
    uint64_t prefix = d->prefix_tokens > 0 ? (uint64_t)d->prefix_tokens : 0;
    kvb_plan_chunk_t ch = {0};
    ch.field_mask = KVB_PLAN_CHUNK_PREFIX | KVB_PLAN_CHUNK_DST_PAGES | KVB_PLAN_CHUNK_END;
    ch.src_pages = c->indices;
    ch.num_pages = c->n;
    ch.first_page = c->first + shift;
    for (size_t i = 0, k; i < d->n_pages; i = k) {
        for (k = i; k < d->n_pages && page_wanted(d, k, 0); k++)
            ;
        if (k == i) {
            k++;
            continue;
        }
        ch.dst_pages = d->pages + i;
        ch.dst_first_page = base + i;
        ch.num_dst_pages = k - i;
        ch.prefix_tokens = prefix > (base + i) * Pd ? prefix : (base + i) * Pd;
        ch.end_tokens = (base + k) * Pd;
        if (plan_into(m, j, &ch, false) != KVB_OK)
            return KVB_ERR_INVALID;
    }
    return KVB_OK;
}

static kvb_status_t plan_runs(struct kvb_manager *m, job_t *j, const kvb__dst_t *d,
                              const kvb__chunk_t *c, uint64_t shift)
{
    kvb_plan_chunk_t ch = {0};
    size_t i = rows_differ(m, j->reg) ? c->n : 0; /* then planned by rows */
    if (i > 0 && plan_kv_rows(m, j, d, c, shift) != KVB_OK)
        return KVB_ERR_INVALID;
    ch.field_mask = KVB_PLAN_CHUNK_PREFIX;
    /* 2026: the pages already exclude the prefix (shift maps them). */
    ch.prefix_tokens = d->dialect->t.suffix_pages ? 0 : (uint64_t)d->prefix_tokens;
    /* Pages the decode already holds (page mask 0, below the shift) are
     * skipped: plan each run of wanted pages on its own. */
    while (i < c->n) {
        size_t k = i;
        if (!page_wanted(d, c->first + i, shift)) {
            i++;
            continue;
        }
        while (k < c->n && page_wanted(d, c->first + k, shift))
            k++;
        ch.src_pages = c->indices + i;
        ch.dst_pages = d->pages + (c->first + i - shift);
        ch.num_pages = k - i;
        ch.first_page = c->first + i - shift;
        if (plan_into(m, j, &ch, false) != KVB_OK)
            return KVB_ERR_INVALID;
        i = k;
    }
    if (c->is_last && m->is_last_stage && m->args.num_state > 0 && c->n_state > 0) {
        kvb_plan_chunk_t sc = {0}; /* counts checked equal by job_plan */
        sc.field_mask = KVB_PLAN_CHUNK_STATE;
        sc.src_state = c->state_idx;
        sc.dst_state = d->state_idx;
        sc.num_state_indices = c->n_state;
        /* With the last KV blocks: the room completes when both are placed. */
        if (plan_into(m, j, &sc, false) != KVB_OK)
            return KVB_ERR_INVALID;
    }
    if (c->is_last && m->is_last_stage && m->args.num_aux > 0 && j->reg->n_aux > 0) {
        kvb_plan_chunk_t ax = {0};
        ax.field_mask = KVB_PLAN_CHUNK_AUX;
        ax.src_aux_index = c->aux_index;
        ax.dst_aux_index = d->aux_index;
        if (plan_into(m, j, &ax, true) != KVB_OK)
            return KVB_ERR_INVALID;
    }
    return KVB_OK;
}

/* Every page the decode wants written lies inside its buffers (from its
 * "kv_lens=" registration extension); checked over the whole transfer info
 * before its first chunk is written, so a bad one writes nothing. */
static bool dst_pages_fit(const kvb__reg_t *g, const kvb__dst_t *d, char *why, size_t wl)
{
    for (size_t i = 0; g->has_kv_pool && i < d->n_pages; i++) {
        if ((d->mask != NULL && !d->mask[i]) || (uint64_t)d->pages[i] < g->kv_pool)
            continue;
        snprintf(why, wl,
                 "destination page index %d (entry %zu) is outside decode %s's KV pool of %llu "
                 "pages; nothing written",
                 (int)d->pages[i], i, d->session, (unsigned long long)g->kv_pool);
        return false;
    }
    return true;
}

/* When reg's decode last failed a write (record_failures may store it again
 * meanwhile: a worker reads it without m->mu). */
static double reg_failed_at(kvb__reg_t *reg)
{
    double t;
    __atomic_load(&reg->failed_at, &t, __ATOMIC_RELAXED);
    return t;
}

/* This rank's target layer of KV buffer b: K then V of layers 0..L-1 (MLA:
 * one latent per layer), then the draft model's buffers, which count as
 * layer L (sent with the piece that ends at the last layer). */
static uint32_t buffer_layer(const struct kvb_manager *m, uint32_t b, uint32_t L)
{
    if (m->p.is_mla)
        return b < L ? b : L;
    return b < L ? b : b < 2 * L ? b - L : L;
}

/* The KV buffer holding address a (*hint: the last one found, tried
 * first: blocks come buffer by buffer); num_kv when none (a state block). */
static uint32_t buffer_of(const struct kvb_manager *m, uint64_t a, uint32_t *hint)
{
    for (uint32_t k = 0; k < m->args.num_kv; k++) {
        uint32_t b = (*hint + k) % m->args.num_kv;
        if (a >= m->kv_ptrs[b] && a - m->kv_ptrs[b] < m->kv_lens[b]) {
            *hint = b;
            return b;
        }
    }
    return m->args.num_kv;
}

/* A layerwise piece (kvb_sender_send_layers): keep the chunk's blocks of
 * layers [layer_begin, layer_end), the draft model's when it ends at the
 * last layer, and what is not KV (state, only on the last piece). Filtered
 * after planning, so every dialect's plan (kvbridge's planner, a
 * decode-computed plan) is cut the same way. */
static void keep_layers(const struct kvb_manager *m, const kvb__chunk_t *c, kvb_plan_strided_t *kv)
{
    uint32_t L = kvb__target_layers(m), hint = 0, lb = c->layer_begin, le = c->layer_end;
    size_t n = 0;
    kv->bytes = 0;
    for (size_t i = 0; i < kv->count; i++) {
        const kvb_strided_block_t *x = &kv->blocks[i];
        uint32_t b = buffer_of(m, x->src, &hint);
        uint32_t layer = b < m->args.num_kv ? buffer_layer(m, b, L) : UINT32_MAX;
        bool keep = layer == UINT32_MAX || (layer >= lb && layer < le) || (layer == L && le == L);
        if (!keep)
            continue;
        kv->blocks[n++] = *x;
        kv->bytes += x->len * x->count;
    }
    kv->count = n;
}

static void job_plan(struct kvb_manager *m, job_t *j, const kvb__dst_t *d, const kvb__chunk_t *c)
{
    uint64_t shift = 0;
    j->st = KVB_OK;
    snprintf(j->ip, sizeof(j->ip), "%s", d->ip);
    j->port = d->port;
    j->dst_aux_index = d->aux_index;
    j->epoch = d->epoch;
    j->dialect = d->dialect;
    j->reg = kvb__reg_get(m, d->session);
    if (j->reg == NULL) {
        j->st = KVB_ERR_STATE;
        snprintf(j->why, sizeof(j->why), "decode %s sent a transfer info but never its KV args",
                 d->session);
    } else if (!d->dialect->t.plans_chunks && j->reg->dialect->t.plans_chunks) {
        /* re-sent in a decode-planning dialect after a transfer info that
         * needs kvbridge's planner: no plan, no plan_error */
        j->st = KVB_ERR_INVALID;
        snprintf(j->why, sizeof(j->why),
                 "decode %s re-sent its KV args in the %s dialect after its %s transfer info; "
                 "nothing written",
                 d->session, j->reg->dialect->t.family, d->dialect->t.family);
    } else if (!d->dialect->t.plans_chunks && j->reg->plan == NULL) {
        j->st = KVB_ERR_INVALID;
        snprintf(j->why, sizeof(j->why), "%s", j->reg->plan_error);
    } else if (__atomic_load_n(&j->reg->failed, __ATOMIC_ACQUIRE) &&
               kvb__now_s() - reg_failed_at(j->reg) < m->session_backoff_s) {
        j->st = KVB_ERR_PEER;
        snprintf(j->why, sizeof(j->why),
                 "Decode instance could be dead, remote session %s is not alive", d->session);
    } else if (d->dialect->t.plans_chunks) {
        d->dialect->plan_job(m, j->reg, d, c, &j->kv, &j->st, j->why, sizeof(j->why));
    } else if (!dst_pages_fit(j->reg, d, j->why, sizeof(j->why))) {
        j->st = KVB_ERR_INVALID;
    } else if (rows_differ(m, j->reg) ? !rows_fit(m, j->reg, d, c, &shift, j->why, sizeof(j->why))
                                      : !dst_shift(d, c, &shift, j->why, sizeof(j->why))) {
        j->st = KVB_ERR_INVALID;
    } else if (!rows_differ(m, j->reg) && c->first + c->n > d->n_pages + shift) {
        j->st = KVB_ERR_INVALID;
        snprintf(j->why, sizeof(j->why),
                 "chunk covers request pages up to %llu but decode %s pre-allocated %zu",
                 (unsigned long long)(c->first + c->n), d->session, d->n_pages);
    } else if (c->is_last && m->is_last_stage && m->args.num_state > 0 &&
               c->n_state != d->n_state) {
        j->st = KVB_ERR_INVALID;
        snprintf(j->why, sizeof(j->why),
                 "room %llu: the prefill has %zu state indices, decode %s asked for %zu",
                 (unsigned long long)c->room, c->n_state, d->session, d->n_state);
    } else if (plan_runs(m, j, d, c, shift) != KVB_OK) {
        j->st = KVB_ERR_INVALID;
        snprintf(j->why, sizeof(j->why), "planning room %llu for %s: %s",
                 (unsigned long long)c->room, d->session, kvb_plan_last_error());
    }
    if (j->st == KVB_OK && c->layer_end != 0)
        keep_layers(m, c, &j->kv);
}

/* Plan chunk c for every real destination (no lock held while planning;
 * the destinations are copied out of the room first). */
static void work_prepare(struct kvb_manager *m, kvb__chunk_t *c, work_t *w)
{
    kvb__dst_t *dsts = NULL;
    size_t n = 0;
    memset(w, 0, sizeof(*w));
    w->c = c;
    pthread_mutex_lock(&m->mu);
    kvb__room_t *r = kvb__room_find(m, c->room);
    if (r == NULL || r->status == KVB_POLL_FAILED) {
        w->skip = 1;
    } else {
        dsts = malloc((r->n_dst ? r->n_dst : 1) * sizeof(*dsts));
        for (size_t i = 0; dsts != NULL && i < r->n_dst; i++)
            if (!r->dsts[i].dummy)
                dsts[n++] = r->dsts[i]; /* shallow: the room keeps the arrays */
        kvb__room_set_status(r, KVB_POLL_TRANSFERRING);
        w->tl = kvb__tl_ref(r->tl);
    }
    pthread_mutex_unlock(&m->mu);
    /* The room's arrays stay valid: dsts_frozen (set when the chunk was
     * queued) stops on_transfer from replacing them, and the room is not
     * freed while inflight > 0. */
    w->jobs = calloc(n ? n : 1, sizeof(*w->jobs));
    w->n_jobs = w->jobs != NULL ? n : 0;
    for (size_t i = 0; i < w->n_jobs; i++)
        job_plan(m, &w->jobs[i], &dsts[i], c);
    free(dsts);
    if (w->tl != NULL) {
        char first[32];
        snprintf(first, sizeof(first), "page %llu", (unsigned long long)c->first);
        kvb__tl_add(w->tl, KVB_EV_CHUNK_PLANNED, (int64_t)c->n, first);
    }
}

/* ---- writing ---- */

static void track_xfer(kvb__room_t *r, kvb_xfer_h x)
{
    if (r->n_xfers == r->cap_xfers) {
        size_t cap = r->cap_xfers ? r->cap_xfers * 2 : 8;
        kvb_xfer_h *v = realloc(r->xfers, cap * sizeof(*v));
        if (v == NULL)
            return;
        r->xfers = v;
        r->cap_xfers = cap;
    }
    r->xfers[r->n_xfers++] = x;
}

static void untrack_xfers(kvb__room_t *r, const work_t *w)
{
    for (size_t i = 0; i < r->n_xfers;) {
        bool mine = false;
        for (size_t k = 0; k < w->n_jobs; k++)
            mine |= r->xfers[i] == w->jobs[k].x || r->xfers[i] == w->jobs[k].xa;
        if (mine)
            r->xfers[i] = r->xfers[--r->n_xfers];
        else
            i++;
    }
}

static const char *job_session(const job_t *j)
{
    return j->reg ? j->reg->session : "";
}

/* Member k of a group ended its start with st and handle x. */
static void kv_started(struct kvb_manager *m, job_t *j, kvb_status_t st, kvb_xfer_h x)
{
    j->st = st;
    j->x = st == KVB_OK ? x : NULL;
    if (st == KVB_OK)
        return;
    snprintf(j->why, sizeof(j->why), "%s",
             x != NULL ? kvb_xfer_error(x) : kvb_engine_last_error(m->engine));
    kvb_xfer_free(x);
}

/* Integrity on and a kvbridge decode (it sent a grant, so it reads our
 * extensions): the job's writes are digested (docs/integrity.md). */
static bool job_integ(const struct kvb_manager *m, const job_t *j)
{
    return m->p.integrity && j->st == KVB_OK && j->epoch != 0 && j->dialect->t.extensions;
}

/* The chunk's KV writes to all its destinations, submitted as engine
 * groups: on the direct lane their copies are zipped, so each source row
 * is read once for all decode ranks (docs/engine.md). Each write keeps its
 * own grant (epoch), handle and failure, as separate writes would. */
static void kv_submit(struct kvb_manager *m, work_t *w)
{
    kvb_write_member_t mb[KVB_WRITE_GROUP_MAX];
    kvb_write_params_t wp[KVB_WRITE_GROUP_MAX];
    kvb_status_t st[KVB_WRITE_GROUP_MAX];
    kvb_xfer_h x[KVB_WRITE_GROUP_MAX];
    job_t *js[KVB_WRITE_GROUP_MAX];
    for (size_t i = 0; i < w->n_jobs;) {
        size_t n = 0;
        for (; i < w->n_jobs && n < KVB_WRITE_GROUP_MAX; i++) {
            job_t *j = &w->jobs[i];
            if (j->st != KVB_OK)
                continue;
            wp[n] = (kvb_write_params_t){.field_mask = KVB_WRITE_PARAM_EPOCH, .epoch = j->epoch};
            if (job_integ(m, j)) { /* the direct lane hashes each page as it copies it */
                wp[n].field_mask |= KVB_WRITE_PARAM_DIGEST;
                wp[n].digest_unit = (uint64_t)j->reg->item_len;
            }
            mb[n] = (kvb_write_member_t){.field_mask =
                                             KVB_WRITE_MEMBER_PARAMS | KVB_WRITE_MEMBER_STRIDED,
                                         .session_id = job_session(j),
                                         .params = &wp[n],
                                         .strided = j->kv.blocks,
                                         .strided_count = j->kv.count};
            st[n] = KVB_ERR_INVALID; /* the call refused them all: nothing written */
            x[n] = NULL;
            js[n++] = j;
        }
        if (n > 0)
            kvb_engine_write_group_async(m->engine, mb, n, sizeof(mb[0]), st, x);
        for (size_t k = 0; k < n; k++)
            kv_started(m, js[k], st[k], x[k]);
    }
}

static void aux_submit(struct kvb_manager *m, job_t *j)
{
    kvb_write_params_t wp = {.field_mask = KVB_WRITE_PARAM_EPOCH, .epoch = j->epoch};
    if (j->st != KVB_OK || j->aux.count == 0)
        return;
    j->st = kvb_engine_write_async_ex(m->engine, job_session(j), j->aux.blocks, j->aux.count, &wp,
                                      &j->xa);
    if (j->st == KVB_ERR_BOUNDS) {
        j->st = KVB_OK; /* decode aux memory not registered: send inline */
        j->xa = NULL;
        j->aux_inline = 1;
    }
    if (j->st != KVB_OK)
        snprintf(j->why, sizeof(j->why), "%s", kvb_engine_last_error(m->engine));
}

/* job_integ: digest the source bytes of the job's KV blocks (integrity.h;
 * kept only if its writes succeed). Where its lane hashes them as it copies
 * them (the direct lane: the source is then in cache) they are added once
 * the writes ended (job_digest_in_copy); else here, while the writes are in
 * flight (the source does not change meanwhile). Device sources are not
 * covered: reading them back would cost a device copy (docs/integrity.md). */
static void job_digest(struct kvb_manager *m, job_t *j)
{
    kvb_mem_type_t t = KVB_MEM_HOST;
    int dev = 0;
    if (!job_integ(m, j) || kvb__integ_init(&j->integ, j->reg->n_kv) != KVB_OK)
        return;
    j->has_integ = 1;
    j->integ.dst_pool = j->reg->has_kv_pool ? j->reg->kv_pool : 0; /* bounds parts of pages */
    if (j->kv.count > 0 &&
        kvb_mem_query((const void *)(uintptr_t)j->kv.blocks[0].src, &t, &dev) == KVB_OK &&
        t == KVB_MEM_CUDA) {
        j->integ.uncovered = 1;
        snprintf(j->integ.why, sizeof(j->integ.why), "device memory: not covered");
    } else if (j->x != NULL && kvb_xfer_digests(j->x, NULL, NULL) != KVB_ERR_UNSUPPORTED) {
        j->integ_in_copy = 1;
    } else if (kvb__integ_add_blocks(&j->integ, j->kv.blocks, j->kv.count, j->reg->kv_ptrs,
                                     j->reg->n_kv, (uint64_t)j->reg->item_len) != KVB_OK) {
        j->integ.uncovered = 1;
        snprintf(j->integ.why, sizeof(j->integ.why), "out of memory");
    }
}

/* Issue the chunk's writes; a room failed or aborted meanwhile gets none. */
static void work_submit(struct kvb_manager *m, work_t *w)
{
    pthread_mutex_lock(&m->mu);
    kvb__room_t *r = kvb__room_find(m, w->c->room);
    if (r == NULL || r->status == KVB_POLL_FAILED)
        w->skip = 1;
    else
        r->submitting = 1;
    pthread_mutex_unlock(&m->mu);
    if (w->skip)
        return;
    kv_submit(m, w);
    uint64_t posted = kvb__now_ns();
    for (size_t i = 0; i < w->n_jobs; i++)
        aux_submit(m, &w->jobs[i]);
    w->issued = kvb__now_s();
    pthread_mutex_lock(&m->mu);
    r->submitting = 0;
    for (size_t i = 0; !r->first_posted && i < w->n_jobs; i++)
        if (w->jobs[i].x != NULL) {
            r->first_posted = 1;
            kvb__tl_add_at(r->tl, KVB_EV_FIRST_WRITE_POSTED, posted, 0, NULL);
        }
    for (size_t i = 0; i < w->n_jobs; i++) {
        if (w->jobs[i].x)
            track_xfer(r, w->jobs[i].x);
        if (w->jobs[i].xa)
            track_xfer(r, w->jobs[i].xa);
    }
    if (r->aborted) /* abort won the race after our check: stop them now */
        for (size_t i = 0; i < r->n_xfers; i++)
            kvb_xfer_cancel(r->xfers[i]);
    pthread_cond_broadcast(&m->room_cv);
    pthread_mutex_unlock(&m->mu);
    /* while the writes are in flight: the source bytes do not change */
    for (size_t i = 0; i < w->n_jobs; i++)
        job_digest(m, &w->jobs[i]);
}

/* Cancel every write of w, past its transfer time-out: one settle window
 * for all of them, from now. */
static void work_cancel(work_t *w)
{
    for (size_t i = 0; i < w->n_jobs; i++) {
        if (w->jobs[i].x != NULL)
            kvb_xfer_cancel(w->jobs[i].x);
        if (w->jobs[i].xa != NULL)
            kvb_xfer_cancel(w->jobs[i].xa);
    }
    w->cancelled = kvb__now_s();
}

/* Seconds from now to t, for kvb_xfer_wait: 1 us at least (0 waits forever). */
static double until(double t)
{
    double left = t - kvb__now_s();
    return left > 1e-6 ? left : 1e-6;
}

/* Wait for a transfer to settle. Past the transfer time-out it is cancelled
 * and waited for once more (the room must not be reported over while a write
 * may still land: the abort fence); past that the session is declared dead,
 * which ends the wait. The job's first failure keeps the reason: the aux
 * write, ended by the session the KV write's time-out closed, would say only
 * "session closed by the caller" and hide the time-out. */
static kvb_status_t wait_xfer(struct kvb_manager *m, job_t *j, kvb_xfer_h x, work_t *w)
{
    /* The time-outs count from the issue and from the cancel, not from this
     * call: a chunk set aside (or settled after the next chunk's submit) has
     * waited already, and the aside thread cancels every overdue chunk at
     * once (aside_cancel_due), so stalled sessions settle side by side. */
    kvb_status_t st = kvb_xfer_wait(x, until(w->issued + m->transfer_timeout_s));
    if (st == KVB_ERR_TIMEOUT) {
        /* Cancel, give the issued writes one more time-out to settle, then
         * declare the session dead (a stopped decode never acknowledges):
         * the room must end, and the worker must not block its queue. */
        if (w->cancelled == 0)
            work_cancel(w);
        if (kvb_xfer_wait(x, until(w->cancelled + m->transfer_timeout_s)) == KVB_ERR_TIMEOUT) {
            /* Fails every conn of the session, the one x was issued on
             * included, so this wait ends at once; it is bounded anyway: a
             * worker that never returns stalls every room of its queue. */
            kvb_engine_close_session(m->engine, j->reg->session);
            if (kvb_xfer_wait(x, m->transfer_timeout_s) == KVB_ERR_TIMEOUT) {
                KVB_LOGE("manager %s: a write to %s did not end after its session was "
                         "closed; the room is failed without telling the decode (its "
                         "fence holds the pages)",
                         m->endpoint, j->reg->session);
                j->unsettled = 1;
            }
        }
        if (j->why[0] == '\0')
            snprintf(j->why, sizeof(j->why), "writes to %s did not finish within %.1f s",
                     j->reg->session, m->transfer_timeout_s);
    } else if (st != KVB_OK && st != KVB_ERR_CANCELED && j->why[0] == '\0') {
        snprintf(j->why, sizeof(j->why), "%s", kvb_xfer_error(x));
    }
    return st;
}

/* AUX_DATA for the buffers both sides have (the first min(ours, its)): an
 * SGLang decode indexes its aux pointers with frame 2 unchecked (spec 5.5),
 * so a buffer it lacks would kill its control thread. */
static void send_aux_inline(struct kvb_manager *m, job_t *j, const kvb__chunk_t *c)
{
    for (uint32_t b = 0; b < m->args.num_aux && b < j->reg->n_aux; b++) {
        /* a copy: the aux buffer may be device memory */
        uint8_t *item = malloc(m->aux_items[b] ? m->aux_items[b] : 1);
        kvb__aux_in_t a = {c->room, (int32_t)b, j->dst_aux_index, item, m->aux_items[b]};
        if (item == NULL || j->dialect->send_aux == NULL ||
            kvb__mem_copy(item,
                          (const void *)(uintptr_t)(m->aux_ptrs[b] +
                                                    m->aux_items[b] * (uint64_t)c->aux_index),
                          m->aux_items[b]) != KVB_OK ||
            j->dialect->send_aux(m, j->ip, j->port, &a) != KVB_OK) {
            j->st = KVB_ERR_PEER;
            snprintf(j->why, sizeof(j->why), "inline aux to %s:%u not sent", j->ip, j->port);
        }
        free(item);
    }
}

/* Mark failed sessions and fail the room (m->mu held). */
static void record_failures(struct kvb_manager *m, kvb__room_t *r, work_t *w)
{
    for (size_t i = 0; i < w->n_jobs; i++) {
        job_t *j = &w->jobs[i];
        if (j->st == KVB_OK || j->st == KVB_ERR_CANCELED)
            continue;
        m->transfers_failed++;
        if (j->reg != NULL && (j->st == KVB_ERR_PEER || j->st == KVB_ERR_TIMEOUT)) {
            double now = kvb__now_s();
            /* atomic: a worker planning another chunk to it reads it unlocked */
            __atomic_store(&j->reg->failed_at, &now, __ATOMIC_RELAXED);
            __atomic_store_n(&j->reg->failed, 1, __ATOMIC_RELEASE);
        }
        if (r != NULL)
            kvb__room_fail(r, "Failed to send kv chunk of %llu to %s:%u: %s",
                           (unsigned long long)w->c->room, j->ip, j->port, j->why);
    }
}

/* m->mu held: add each job's digest to its destination's in the room. */
static void room_digest(kvb__room_t *r, const work_t *w)
{
    for (size_t i = 0; i < w->n_jobs; i++) {
        const job_t *j = &w->jobs[i];
        if (!j->has_integ || j->st != KVB_OK)
            continue;
        if (r->integ == NULL && (r->integ = calloc(r->n_dst, sizeof(*r->integ))) != NULL)
            r->n_integ = r->n_dst;
        for (size_t k = 0; k < r->n_integ; k++) {
            kvb__integ_t *a = &r->integ[k];
            if (r->dsts[k].dummy || r->dsts[k].port != j->port || strcmp(r->dsts[k].ip, j->ip))
                continue;
            if ((a->buf_sum == NULL && kvb__integ_init(a, j->integ.n_buf) != KVB_OK) ||
                kvb__integ_merge(a, &j->integ) != KVB_OK)
                a->uncovered = 1;
            a->peer_v2 = j->reg->digest_max >= 2; /* it reads partial-page shares */
        }
    }
}

/* A job whose lane hashed its items (job_digest), its writes ended: their
 * hashes added to its digest, no lock. */
static void job_digest_in_copy(job_t *j)
{
    const uint64_t *h = NULL;
    size_t n = 0;
    if (!j->has_integ || !j->integ_in_copy || j->st != KVB_OK)
        return;
    if (kvb_xfer_digests(j->x, &h, &n) != KVB_OK ||
        kvb__integ_add_hashes(&j->integ, j->kv.blocks, j->kv.count, j->reg->kv_ptrs, j->reg->n_kv,
                              (uint64_t)j->reg->item_len, h, n) != KVB_OK) {
        j->integ.uncovered = 1;
        snprintf(j->integ.why, sizeof(j->integ.why), "the engine's item hashes were not there");
    }
}

/* Wait the chunk's writes, settle the room, send the due statuses. */
static void work_finish(struct kvb_manager *m, work_t *w)
{
    for (size_t i = 0; !w->skip && i < w->n_jobs; i++) {
        job_t *j = &w->jobs[i];
        /* Every write issued is settled, whatever happened to the others. */
        kvb_status_t sx = j->x != NULL ? wait_xfer(m, j, j->x, w) : KVB_OK;
        kvb_status_t sa = j->xa != NULL ? wait_xfer(m, j, j->xa, w) : KVB_OK;
        if (j->st == KVB_OK)
            j->st = sx != KVB_OK ? sx : sa;
        j->t_done = kvb__now_ns();
        job_digest_in_copy(j);
        if (j->xa == NULL && j->st == KVB_OK && (j->aux.count == 0 || j->aux_inline) &&
            w->c->is_last && m->is_last_stage && m->args.num_aux > 0 && j->reg->n_aux > 0)
            send_aux_inline(m, j, w->c);
    }
    kvb__note_t *notes = NULL;
    size_t n_notes = 0;
    int note_status = 0;
    pthread_mutex_lock(&m->mu);
    kvb__room_t *r = kvb__room_find(m, w->c->room);
    record_failures(m, r, w);
    if (r != NULL) {
        for (size_t i = 0; i < w->n_jobs; i++)
            r->unsettled |= w->jobs[i].unsettled;
        untrack_xfers(r, w);
        room_digest(r, w);
        for (size_t i = 0; w->c->is_last && i < w->n_jobs; i++)
            kvb__tl_add_at(r->tl, KVB_EV_LAST_WRITE_DONE, w->jobs[i].t_done, w->jobs[i].st,
                           job_session(&w->jobs[i]));
        r->inflight--;
        r->last_done |= w->c->is_last;
        /* Success once the last chunk and every earlier one settled (an
         * earlier one may have been set aside and settle later). */
        if (r->last_done && r->inflight == 0 && r->status != KVB_POLL_FAILED) {
            kvb__output_latch(m, w->c->room); /* the statuses read it after Success */
            kvb__room_set_status(r, KVB_POLL_SUCCESS);
            r->success_due = 1; /* notes_due sends it and clears it */
        }
        /* Collected in the same critical section that published the outcome:
         * a sender destroyed right after its poll saw Success must not lose
         * the decode's status. */
        n_notes = kvb__notes_due(m, r, &notes, &note_status);
    }
    pthread_mutex_unlock(&m->mu);
    for (size_t i = 0; i < w->n_jobs; i++) {
        kvb_xfer_free(w->jobs[i].x);
        kvb_xfer_free(w->jobs[i].xa);
        kvb_plan_strided_free(&w->jobs[i].kv);
        kvb_plan_blocks_free(&w->jobs[i].aux);
        kvb__integ_free(&w->jobs[i].integ);
        kvb__reg_put(w->jobs[i].reg);
    }
    free(w->jobs);
    if (n_notes > 0 || notes != NULL)
        kvb__send_notes(m, w->c->room, notes, n_notes, note_status, w->tl);
    kvb__tl_put(w->tl);
    chunk_free(w->c);
}

/* ---- stalled chunks set aside ----
 * A queue's worker settles its chunks in order. A chunk whose writes have
 * not settled within KVBRIDGE_STALL_ASIDE (1 s) (a stopped or slow decode)
 * is handed to the manager's aside thread, which settles such chunks as
 * their writes end (or through wait_xfer's time-outs), so the other decodes
 * sharing the queue are not held for 2 x transfer_timeout (review §3). A
 * room's Success still waits for all its chunks (room.last_done). */

typedef struct aside_item {
    work_t w;
    struct aside_item *next;
} aside_item_t;

struct kvb__aside {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    aside_item_t *head;
    size_t n;
    double stall_s;
    int stop;
    pthread_t thr;
};

/* All the chunk's writes ended (or were never issued)? */
static bool work_settled(const work_t *w)
{
    for (size_t i = 0; !w->skip && i < w->n_jobs; i++) {
        const job_t *j = &w->jobs[i];
        if ((j->x != NULL && kvb_xfer_test(j->x) == KVB_ERR_INPROGRESS) ||
            (j->xa != NULL && kvb_xfer_test(j->xa) == KVB_ERR_INPROGRESS))
            return false;
    }
    return true;
}

/* Wait up to stall_s for w to settle; true if it did (or there is no aside
 * thread): the worker finishes it in place. */
static bool settles_in_time(struct kvb_manager *m, const work_t *w)
{
    if (m->aside == NULL)
        return true;
    double end = kvb__now_s() + m->aside->stall_s;
    for (size_t i = 0; !w->skip && i < w->n_jobs; i++) {
        kvb_xfer_h x[2] = {w->jobs[i].x, w->jobs[i].xa};
        for (int k = 0; k < 2; k++) {
            double left = end - kvb__now_s();
            /* A time-out cancels nothing: the write stays in flight. (A
             * time-out of 0 would wait forever: 1 us at least.) */
            if (x[k] != NULL && kvb_xfer_wait(x[k], left > 1e-6 ? left : 1e-6) == KVB_ERR_TIMEOUT)
                return false;
        }
    }
    return true;
}

static void aside_push(struct kvb_manager *m, const work_t *w)
{
    aside_item_t *it = malloc(sizeof(*it));
    if (it == NULL) { /* no memory: settle it here, as before */
        work_t copy = *w;
        work_finish(m, &copy);
        return;
    }
    it->w = *w;
    KVB_LOGW("manager %s: room %llu: writes not settled after %.1f s: set aside so the "
             "queue's other rooms proceed",
             m->endpoint, (unsigned long long)w->c->room, m->aside->stall_s);
    pthread_mutex_lock(&m->aside->mu);
    it->next = m->aside->head;
    m->aside->head = it;
    m->aside->n++;
    pthread_cond_signal(&m->aside->cv);
    pthread_mutex_unlock(&m->aside->mu);
}

/* Cancel the writes of every chunk past its transfer time-out (a->mu held):
 * their settle windows run side by side, so k stalled sessions end within
 * two time-outs of their issue, not one more per session (the thread
 * settles them one by one, each closing its own session). */
static void aside_cancel_due(struct kvb__aside *a, double timeout_s)
{
    double now = kvb__now_s();
    for (aside_item_t *it = a->head; it != NULL; it = it->next) {
        work_t *w = &it->w;
        if (w->cancelled != 0 || now - w->issued < timeout_s || work_settled(w))
            continue;
        work_cancel(w);
    }
}

/* One that settled or whose cancelled writes had their time-out to settle
 * (aside_cancel_due), so that wait_xfer closes its session at once without
 * holding this thread while other chunks come due (or any, when stopping);
 * NULL if none. */
static aside_item_t *aside_take(struct kvb__aside *a, double timeout_s, bool stopping)
{
    double now = kvb__now_s();
    for (aside_item_t **pp = &a->head; *pp != NULL; pp = &(*pp)->next) {
        aside_item_t *it = *pp;
        if (stopping || work_settled(&it->w) ||
            (it->w.cancelled != 0 && now - it->w.cancelled >= timeout_s)) {
            *pp = it->next;
            a->n--;
            return it;
        }
    }
    return NULL;
}

static void *aside_main(void *arg)
{
    struct kvb_manager *m = arg;
    struct kvb__aside *a = m->aside;
    pthread_mutex_lock(&a->mu);
    while (!a->stop || a->head != NULL) {
        aside_cancel_due(a, m->transfer_timeout_s);
        aside_item_t *it = aside_take(a, m->transfer_timeout_s, a->stop);
        if (it == NULL) {
            kvb__cond_wait_ns(&a->cv, &a->mu, a->head != NULL ? 2000000 : 100000000);
            continue;
        }
        pthread_mutex_unlock(&a->mu);
        work_finish(m, &it->w); /* settled: at once; else wait_xfer's time-out path */
        free(it);
        pthread_mutex_lock(&a->mu);
    }
    pthread_mutex_unlock(&a->mu);
    return NULL;
}

static kvb_status_t aside_start(struct kvb_manager *m)
{
    double stall = kvb__env_double("KVBRIDGE_STALL_ASIDE", NULL, 1.0, 0, 1e9);
    if (stall <= 0)
        return KVB_OK; /* 0: off, the worker waits in place */
    struct kvb__aside *a = calloc(1, sizeof(*a));
    if (a == NULL)
        return KVB_ERR_NOMEM;
    pthread_mutex_init(&a->mu, NULL);
    kvb__cond_init_mono(&a->cv);
    a->stall_s = stall;
    m->aside = a;
    if (pthread_create(&a->thr, NULL, aside_main, m) != 0) {
        m->aside = NULL;
        free(a);
        return KVB_ERR_IO;
    }
    return KVB_OK;
}

/* After the workers stopped: settle what is aside, then free. */
static void aside_stop(struct kvb_manager *m)
{
    struct kvb__aside *a = m->aside;
    if (a == NULL)
        return;
    pthread_mutex_lock(&a->mu);
    a->stop = 1;
    pthread_cond_signal(&a->cv);
    pthread_mutex_unlock(&a->mu);
    pthread_join(a->thr, NULL);
    pthread_mutex_destroy(&a->mu);
    pthread_cond_destroy(&a->cv);
    free(a);
    m->aside = NULL;
}

/* The worker's turn to settle prev: in place, or aside when it stalls. */
static void work_settle(struct kvb_manager *m, work_t *w)
{
    if (settles_in_time(m, w))
        work_finish(m, w);
    else
        aside_push(m, w);
}

static void *worker_main(void *arg)
{
    kvb__queue_t *q = arg;
    struct kvb_manager *m = q->mgr;
    work_t cur, prev;
    bool pending = false;
    while (!__atomic_load_n(&m->stop, __ATOMIC_ACQUIRE) || pending) {
        kvb__chunk_t *c =
            __atomic_load_n(&m->stop, __ATOMIC_ACQUIRE) ? NULL : queue_pop(q, !pending);
        if (c == NULL) {
            if (pending)
                work_settle(m, &prev);
            pending = false;
            continue;
        }
        /* Planned and issued while prev is still in flight: two chunks in
         * the engine at once, so the lane never drains between chunks.
         * Chunks settle in order, so a room's last chunk is reported after
         * all earlier ones. */
        work_prepare(m, c, &cur);
        work_submit(m, &cur);
        if (pending)
            work_settle(m, &prev);
        prev = cur;
        pending = true;
    }
    return NULL;
}

kvb_status_t kvb__prefill_start(struct kvb_manager *m)
{
    kvb_status_t st;
    m->transfer_timeout_s = kvb__env_double("KVBRIDGE_TRANSFER_TIMEOUT", NULL, 60, 0.1, 1e9);
    m->session_backoff_s = kvb__env_double("KVBRIDGE_SESSION_BACKOFF", NULL, 5, 0, 1e9);
    m->max_regs = (size_t)kvb__env_int("KVBRIDGE_MAX_REGISTRATIONS", NULL, 4096, 1, 1000000);
    m->reg_grace_ms =
        (uint64_t)(kvb__env_double("KVBRIDGE_REGISTRATION_GRACE", NULL, 60, 0, 86400) * 1000);
    /* Caps on what unauthenticated peers can make this rank hold
     * (docs/security.md, kvb_manager_limits). */
    m->max_reg_bytes = (uint64_t)kvb__env_int("KVBRIDGE_MAX_REGISTRATION_BYTES", NULL, 1 << 20, 64,
                                              (int64_t)1 << 40);
    m->max_regs_bytes = (uint64_t)kvb__env_int("KVBRIDGE_MAX_REGISTRATIONS_BYTES", NULL, 64 << 20,
                                               64, (int64_t)1 << 40);
    m->max_wire_rooms = (size_t)kvb__env_int("KVBRIDGE_MAX_WIRE_ROOMS", NULL, 4096, 1, 100000000);
    m->max_wire_room_bytes = (uint64_t)kvb__env_int("KVBRIDGE_MAX_WIRE_ROOM_BYTES", NULL, 256 << 20,
                                                    4096, (int64_t)1 << 40);
    st = aside_start(m);
    if (st != KVB_OK)
        return st;
    m->n_queues = m->p.transfer_queues;
    m->queues = calloc((size_t)m->n_queues, sizeof(*m->queues));
    if (m->queues == NULL)
        return KVB_ERR_NOMEM;
    for (int i = 0; i < m->n_queues; i++) {
        kvb__queue_t *q = &m->queues[i];
        pthread_mutex_init(&q->mu, NULL);
        kvb__cond_init_mono(&q->cv);
        q->mgr = m;
        if (pthread_create(&q->thr, NULL, worker_main, q) != 0) {
            m->n_queues = i;
            return KVB_ERR_IO;
        }
    }
    /* The bootstrap shapes other dialects' decodes read (TokenSpeed 0.1.1:
     * this rank's layout contract), from the dialects themselves. */
    m->boot_puts = kvb__dialect_boot_puts(m, &m->n_boot_puts);
    st = kvb__prefill_register(m);
    if (st != KVB_OK)
        KVB_LOGE("manager %s: %s", m->endpoint, kvb__err_get(&m->err));
    return st;
}

void kvb__prefill_stop(struct kvb_manager *m)
{
    for (int i = 0; i < m->n_queues; i++) {
        pthread_mutex_lock(&m->queues[i].mu);
        pthread_cond_broadcast(&m->queues[i].cv);
        pthread_mutex_unlock(&m->queues[i].mu);
        pthread_join(m->queues[i].thr, NULL);
    }
    aside_stop(m);
}

void kvb__prefill_free(struct kvb_manager *m)
{
    for (int i = 0; i < m->n_queues; i++) {
        kvb__chunk_t *c;
        while ((c = queue_pop(&m->queues[i], false)) != NULL)
            chunk_free(c);
        pthread_mutex_destroy(&m->queues[i].mu);
        pthread_cond_destroy(&m->queues[i].cv);
    }
    free(m->queues);
    m->queues = NULL;
    for (kvb__reg_t *g = m->regs, *next; g != NULL; g = next) {
        next = g->next;
        kvb__reg_put(g);
    }
    m->regs = NULL;
    kvb__m_sub(KVB__M_REGISTRATIONS, kvb__m_role(KVB_MODE_PREFILL, 0, 1), m->n_regs);
    m->n_regs = 0;
}

/* ---- sender API ---- */

kvb_status_t kvb_sender_create(kvb_manager_h m, const char *bootstrap_addr, uint64_t room,
                               kvb_sender_h *sender_p)
{
    if (m == NULL || sender_p == NULL || m->mode != KVB_MODE_PREFILL)
        return KVB_ERR_STATE;
    kvb_sender_h s = calloc(1, sizeof(*s));
    if (s == NULL)
        return KVB_ERR_NOMEM;
    pthread_mutex_lock(&m->mu);
    kvb__room_t *r = kvb__room_get(m, room);
    kvb_status_t st = r == NULL ? KVB_ERR_NOMEM : r->has_handle ? KVB_ERR_STATE : KVB_OK;
    if (st == KVB_OK) {
        r->has_handle = 1;
        kvb__room_unwire(m, r);
        r->t_start = kvb__now_s();
        kvb__room_set_status(r, KVB_POLL_BOOTSTRAPPING);
        s->tl = kvb__tl_ref(r->tl);
    }
    pthread_mutex_unlock(&m->mu);
    if (st != KVB_OK) {
        free(s);
        return kvb__err_set(&m->err, st, "room %llu already has a sender",
                            (unsigned long long)room);
    }
    s->mgr = m;
    s->room = room;
    s->aux_index = -1;
    *sender_p = s;
    return KVB_OK;
}

kvb_status_t kvb_sender_init(kvb_sender_h s, uint64_t num_kv_indices, int64_t aux_index)
{
    if (s == NULL || num_kv_indices == 0)
        return KVB_ERR_INVALID;
    if ((aux_index < 0 || aux_index > INT32_MAX) && s->mgr->args.num_aux > 0)
        return kvb__err_set(&s->mgr->err, KVB_ERR_INVALID,
                            "room %llu: aux_index %lld: this prefill registered %u aux "
                            "buffer(s), so each sender needs its aux slot (>= 0)",
                            (unsigned long long)s->room, (long long)aux_index,
                            s->mgr->args.num_aux);
    s->num_kv = num_kv_indices;
    s->aux_index = aux_index;
    kvb__output_note_aux(s->mgr, s->room, aux_index);
    s->initialized = 1;
    return KVB_OK;
}

/* Queue shard: sum of the destination session ports (the seeds' rule), so a
 * room always lands on the queue of its destinations. m->mu held. */
static int shard_of(struct kvb_manager *m, const kvb__room_t *r)
{
    uint64_t sum = 0;
    for (size_t i = 0; i < r->n_dst; i++) {
        const char *colon = strrchr(r->dsts[i].session, ':');
        sum += colon != NULL ? (uint64_t)atoi(colon + 1) : 0;
    }
    return (int)(sum % (uint64_t)m->n_queues);
}

/* Queue a chunk of count pages from s->cur: the whole chunk, or a
 * layerwise piece of it (layers [lb, le); le 0: all). Only a piece that
 * completes the chunk advances the request (and may be its last: aux,
 * state). */
static kvb_status_t send_chunk(kvb_sender_h s, const int32_t *indices, size_t count, uint32_t lb,
                               uint32_t le, bool completes)
{
    struct kvb_manager *m = s->mgr;
    /* count > num_kv - cur, not cur + count > num_kv: the sum can wrap
     * (cur > num_kv after a re-init with fewer indices). */
    if (!s->initialized || s->cur > s->num_kv || count > s->num_kv - s->cur ||
        count > SIZE_MAX / sizeof(int32_t))
        return kvb__err_set(&m->err, KVB_ERR_STATE,
                            "room %llu: send of %zu indices past num_kv_indices %llu (at %llu)",
                            (unsigned long long)s->room, count, (unsigned long long)s->num_kv,
                            (unsigned long long)s->cur);
    kvb__chunk_t *c = calloc(1, sizeof(*c));
    if (c == NULL || (c->indices = malloc((count ? count : 1) * sizeof(int32_t))) == NULL) {
        free(c);
        return KVB_ERR_NOMEM;
    }
    memcpy(c->indices, indices, count * sizeof(int32_t));
    c->room = s->room;
    c->n = count;
    c->first = s->cur;
    c->total = s->num_kv;
    c->layer_begin = lb;
    c->layer_end = le;
    uint64_t advance = completes ? count : 0;
    s->cur += advance;
    c->is_last = completes && s->cur == s->num_kv;
    c->aux_index = s->aux_index;
    if (c->is_last && s->n_state > 0) { /* the sender's copy moves to the chunk */
        c->state_idx = s->state_idx;
        c->n_state = s->n_state;
        s->state_idx = NULL;
        s->n_state = 0;
    }
    pthread_mutex_lock(&m->mu);
    kvb__room_t *r = kvb__room_find(m, s->room);
    kvb_status_t st = KVB_OK;
    int q = 0;
    if (r == NULL || r->status == KVB_POLL_FAILED) {
        st = KVB_ERR_CANCELED; /* dropped, as the seeds drop chunks of failed rooms */
    } else if (r->status < KVB_POLL_WAITING_FOR_INPUT) {
        st = KVB_ERR_STATE;
    } else if (!c->is_last && r->n_dst > 0) {
        bool any_real = false;
        for (size_t i = 0; i < r->n_dst; i++)
            any_real |= !r->dsts[i].dummy;
        if (!any_real)
            st = KVB_ERR_CANCELED; /* dummy rank: nothing to send before the end */
    }
    if (st == KVB_OK ||
        (st == KVB_ERR_CANCELED && c->is_last && r != NULL && r->status != KVB_POLL_FAILED)) {
        r->inflight++;
        r->dsts_frozen = 1; /* workers plan from dsts without the lock */
        q = shard_of(m, r);
        st = KVB_OK;
    }
    pthread_mutex_unlock(&m->mu);
    if (st == KVB_ERR_STATE) {
        s->cur -= advance;
        s->state_idx = c->state_idx; /* back to the sender for the retry */
        s->n_state = c->n_state;
        c->state_idx = NULL;
        chunk_free(c);
        return kvb__err_set(&m->err, st, "room %llu is not WaitingForInput yet",
                            (unsigned long long)s->room);
    }
    if (st != KVB_OK) {
        chunk_free(c);
        return KVB_OK;
    }
    queue_push(&m->queues[q], c);
    return KVB_OK;
}

kvb_status_t kvb_sender_send(kvb_sender_h s, const int32_t *indices, size_t count)
{
    if (s == NULL || s->mgr == NULL || (indices == NULL && count > 0))
        return KVB_ERR_INVALID;
    if (s->lw_indices != NULL)
        return kvb__err_set(&s->mgr->err, KVB_ERR_STATE,
                            "room %llu: a chunk is being sent layer by layer (next layer %u)",
                            (unsigned long long)s->room, s->lw_next);
    return send_chunk(s, indices, count, 0, 0, true);
}

uint32_t kvb_sender_num_layers(kvb_sender_h s)
{
    return s != NULL && s->mgr != NULL ? kvb__target_layers(s->mgr) : 0;
}

/* Is this piece the next of the chunk being sent layer by layer? */
static bool piece_in_order(kvb_sender_h s, const int32_t *indices, size_t count, uint32_t lb)
{
    if (s->lw_indices == NULL)
        return lb == 0;
    return lb == s->lw_next && count == s->lw_count &&
           memcmp(indices, s->lw_indices, count * sizeof(int32_t)) == 0;
}

kvb_status_t kvb_sender_send_layers(kvb_sender_h s, const int32_t *indices, size_t count,
                                    uint32_t layer_begin, uint32_t layer_end)
{
    if (s == NULL || s->mgr == NULL || (indices == NULL && count > 0))
        return KVB_ERR_INVALID;
    struct kvb_manager *m = s->mgr;
    uint32_t L = kvb__target_layers(m);
    if (layer_begin >= layer_end || layer_end > L ||
        !piece_in_order(s, indices, count, layer_begin))
        return kvb__err_set(&m->err, KVB_ERR_INVALID,
                            "room %llu: layers [%u, %u) are not the next piece of the chunk (%u "
                            "target layers; a chunk's pieces start at 0, follow each other and "
                            "carry the same indices; next %u)",
                            (unsigned long long)s->room, layer_begin, layer_end, L,
                            s->lw_indices != NULL ? s->lw_next : 0);
    bool completes = layer_end == L;
    int32_t *copy = NULL;
    if (!completes && s->lw_indices == NULL &&
        (copy = malloc((count ? count : 1) * sizeof(int32_t))) == NULL)
        return KVB_ERR_NOMEM;
    bool whole = layer_begin == 0 && completes;
    kvb_status_t st =
        send_chunk(s, indices, count, whole ? 0 : layer_begin, whole ? 0 : layer_end, completes);
    if (st != KVB_OK) {
        free(copy);
        return st;
    }
    if (copy != NULL) { /* the chunk's first piece */
        memcpy(copy, indices, count * sizeof(int32_t));
        s->lw_indices = copy;
        s->lw_count = count;
    }
    s->lw_next = layer_end;
    if (completes) {
        free(s->lw_indices);
        s->lw_indices = NULL;
    }
    return KVB_OK;
}

int kvb__sender_status(struct kvb_manager *m, kvb_sender_h s)
{
    kvb__room_t *r = kvb__room_find(m, s->room);
    if (r == NULL)
        return KVB_POLL_FAILED;
    double elapsed = kvb__now_s() - r->t_start;
    if (r->status == KVB_POLL_BOOTSTRAPPING && elapsed >= m->p.bootstrap_timeout_s)
        kvb__room_fail(r, "Request %llu timed out after %.1fs in KVPoll.Bootstrapping",
                       (unsigned long long)s->room, elapsed);
    return r->status < 0 ? KVB_POLL_BOOTSTRAPPING : r->status;
}

kvb_poll_t kvb__sender_conclude(kvb_sender_h s, int status)
{
    if (status == KVB_POLL_FAILED || status == KVB_POLL_SUCCESS)
        s->concluded = status + 1;
    if (status == KVB_POLL_FAILED)
        kvb__prefill_notify(s->mgr, s->room);
    return (kvb_poll_t)status;
}

kvb_poll_t kvb_sender_poll(kvb_sender_h s)
{
    struct kvb_manager *m = s->mgr;
    if (s->concluded)
        return (kvb_poll_t)s->concluded - 1;
    pthread_mutex_lock(&m->mu);
    int status = kvb__sender_status(m, s);
    pthread_mutex_unlock(&m->mu);
    return kvb__sender_conclude(s, status);
}

void kvb_sender_abort(kvb_sender_h s)
{
    struct kvb_manager *m = s->mgr;
    pthread_mutex_lock(&m->mu);
    kvb__room_t *r = kvb__room_find(m, s->room);
    if (r != NULL)
        kvb__prefill_abort_room(m, r, "Aborted by AbortReq.");
    pthread_mutex_unlock(&m->mu);
    s->concluded = KVB_POLL_FAILED + 1;
    kvb__prefill_notify(m, s->room);
}

void kvb_sender_failure(kvb_sender_h s, char *buf, size_t len)
{
    struct kvb_manager *m = s->mgr;
    pthread_mutex_lock(&m->mu);
    kvb__room_take_reason(kvb__room_find(m, s->room), buf, len);
    pthread_mutex_unlock(&m->mu);
    if (!s->concluded)
        s->concluded = KVB_POLL_FAILED + 1;
}

void kvb_sender_destroy(kvb_sender_h s)
{
    struct kvb_manager *m;
    if (s == NULL)
        return;
    m = s->mgr;
    pthread_mutex_lock(&m->mu);
    kvb__room_t *r = kvb__room_find(m, s->room);
    if (r != NULL) {
        if (r->status != KVB_POLL_SUCCESS && r->status != KVB_POLL_FAILED)
            kvb__prefill_abort_room(m, r, "Aborted: sender destroyed before the end");
        r->has_handle = 0;
        /* A failed room stays as a tombstone until the sweep (room TTL), so a
         * decode whose transfer info comes late still learns it failed. */
        if (r->inflight == 0 && r->status != KVB_POLL_FAILED)
            kvb__room_remove(m, s->room); /* else the sweep frees it */
    }
    pthread_mutex_unlock(&m->mu);
    kvb__tl_put(s->tl);
    free(s->state_idx);
    free(s->lw_indices);
    free(s);
}

kvb_status_t kvb_sender_timeline(kvb_sender_h s, kvb_timeline_t **tl_p)
{
    if (s == NULL || tl_p == NULL)
        return KVB_ERR_INVALID;
    return kvb__tl_snapshot(s->tl, s->room, tl_p);
}

kvb_status_t kvb_sender_set_state_indices(kvb_sender_h s, const int32_t *indices, size_t count)
{
    struct kvb_manager *m = s != NULL ? s->mgr : NULL;
    if (m == NULL || (indices == NULL && count > 0))
        return KVB_ERR_INVALID;
    if (s->initialized && s->cur == s->num_kv && s->num_kv > 0)
        return kvb__err_set(&m->err, KVB_ERR_STATE,
                            "room %llu: state indices after the last chunk was sent",
                            (unsigned long long)s->room);
    for (size_t i = 0; i < count; i++)
        if (indices[i] < 0)
            return kvb__err_set(&m->err, KVB_ERR_INVALID, "room %llu: state index %zu is %d",
                                (unsigned long long)s->room, i, (int)indices[i]);
    int32_t *v = malloc((count ? count : 1) * sizeof(*v));
    if (v == NULL)
        return KVB_ERR_NOMEM;
    memcpy(v, indices, count * sizeof(*v));
    free(s->state_idx);
    s->state_idx = count > 0 ? v : NULL;
    s->n_state = count;
    if (count == 0)
        free(v);
    return KVB_OK;
}
