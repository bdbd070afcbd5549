/* CachePD planner: peer compatibility and the routes both sides compute
 * from the two contracts (cachepd.h; spec 7.1-7.6). A line-by-line reading
 * of TokenSpeed 0.1.1's CacheTransferPlanner and build_pipeline_transfer_plan:
 * the rank sets are never sent, so a kvbridge peer must reach exactly the
 * same ones (tests/cachepd pins this against TokenSpeed's own planner). */
#include "dialect/cachepd/cpd_int.h"

#include <stdlib.h>
#include <string.h>

void kvb__cpd_route_free(kvb__cpd_route_t *r)
{
    if (r == NULL)
        return;
    for (uint32_t i = 0; r->sources != NULL && i < r->nsources; i++) {
        free(r->sources[i].frags);
        free(r->sources[i].owners);
    }
    free(r->sources);
    free(r->dummies);
    free(r->expected);
    memset(r, 0, sizeof(*r));
}

/* ---------------------------------------------------------------- 7.1 */

static bool same_opt(int64_t a, int64_t b)
{
    return a == b;
}

static bool same_spec(const kvb__cpd_spec_t *a, const kvb__cpd_spec_t *b)
{
    return a->family == b->family && same_opt(a->rows_per_page, b->rows_per_page) &&
           same_opt(a->entry_stride_tokens, b->entry_stride_tokens) &&
           same_opt(a->checkpoint_granularity, b->checkpoint_granularity) &&
           a->retention == b->retention &&
           same_opt(a->sliding_window_tokens, b->sliding_window_tokens) &&
           a->replayable == b->replayable && a->policy == b->policy;
}

static bool same_partition(const kvb__cpd_contract_t *p, const kvb__cpd_field_t *pf,
                           const kvb__cpd_contract_t *d, const kvb__cpd_field_t *df)
{
    if ((pf->partition < 0) != (df->partition < 0))
        return false;
    if (pf->partition < 0)
        return true;
    const kvb__cpd_partition_t *a = &p->parts[pf->partition], *b = &d->parts[df->partition];
    return a->axis == b->axis && a->global_extent == b->global_extent && a->nparts == b->nparts &&
           memcmp(a->parts, b->parts, a->nparts * sizeof(a->parts[0])) == 0;
}

/* Same dtype, partition and global shape (the partition axis at its global
 * extent). */
static bool same_field(const kvb__cpd_contract_t *p, const kvb__cpd_field_t *pf,
                       const kvb__cpd_contract_t *d, const kvb__cpd_field_t *df)
{
    if (pf->dtype != df->dtype || !same_partition(p, pf, d, df) || pf->ndim != df->ndim)
        return false;
    int32_t axis = pf->partition >= 0 ? (int32_t)p->parts[pf->partition].axis : -1;
    for (uint32_t k = 0; k < pf->ndim; k++)
        if ((int32_t)k != axis && pf->shape[k] != df->shape[k])
            return false;
    return true;
}

kvb_status_t kvb__cpd_check_peer(const kvb__cpd_contract_t *p, const kvb__cpd_contract_t *d,
                                 kvb__frames_err_t *err)
{
    if (p->prefix_granularity != d->prefix_granularity)
        return kvb__cpd_fail(
            err, false, 0, "Cache P/D contract mismatch: prefix_granularity (%llu vs %llu)",
            (unsigned long long)p->prefix_granularity, (unsigned long long)d->prefix_granularity);
    bool order = p->nspecs == d->nspecs;
    for (uint32_t s = 0; order && s < p->nspecs; s++)
        order = strcmp(p->specs[s].group_id, d->specs[s].group_id) == 0;
    if (!order)
        return kvb__cpd_fail(err, false, 0, "Cache P/D contract mismatch: group order");
    for (uint32_t s = 0; s < p->nspecs; s++) {
        const kvb__cpd_spec_t *ps = &p->specs[s], *ds = &d->specs[s];
        if (!same_spec(ps, ds))
            return kvb__cpd_fail(err, false, 0, "Cache P/D contract mismatch: group '%s' semantics",
                                 ps->group_id);
        bool ids = ps->nfields == ds->nfields;
        for (uint32_t k = 0; ids && k < ps->nfields; k++)
            ids = strcmp(p->fields[ps->sorted_fields[k]].field_id,
                         d->fields[ds->sorted_fields[k]].field_id) == 0;
        if (!ids)
            return kvb__cpd_fail(err, false, 0,
                                 "Cache P/D contract mismatch: group '%s' transfer field order",
                                 ps->group_id);
        for (uint32_t k = 0; k < ps->nfields; k++) {
            const kvb__cpd_field_t *pf = &p->fields[ps->sorted_fields[k]];
            if (!same_field(p, pf, d, &d->fields[ds->sorted_fields[k]]))
                return kvb__cpd_fail(err, false, 0,
                                     "Cache P/D contract mismatch: field '%s' semantics",
                                     pf->field_id);
        }
    }
    return KVB_OK;
}

/* ---------------------------------------------------------------- planner */

typedef struct seg {
    uint32_t spec, pf, df;
} seg_t;

/* One CacheTransferPlanner: one stage's field set. */
typedef struct planner {
    const kvb__cpd_contract_t *p, *d;
    uint32_t ptp, dtp;
    bool all; /* the stage holds every field (TokenSpeed's _field_ids None) */
    uint32_t nsegs;
    seg_t *segs; /* field pairs, group order then sorted field id, in the stage */
    uint32_t shard[KVB__CPD_MAX_GROUPS]; /* per spec; 1 = not sharded */
    bool sharded;
} planner_t;

/* A rank's interval of one global part on the partition axis. */
typedef struct interval {
    uint64_t start, end, local;
} interval_t;

static kvb_status_t check_mapping(const kvb__cpd_contract_t *c, uint32_t f, uint32_t tp,
                                  const kvb__cpd_partition_t *pt, kvb__frames_err_t *err)
{
    uint64_t local = c->fields[f].shape[pt->axis], n = pt->global_extent / local;
    if (local == 0 || pt->global_extent % local != 0 || n > tp || tp % n != 0)
        return kvb__cpd_fail(err, false, 0,
                             "Cache field '%s' cannot map global extent %llu and local extent %llu "
                             "to TP=%u",
                             c->fields[f].field_id, (unsigned long long)pt->global_extent,
                             (unsigned long long)local, tp);
    return KVB_OK;
}

/* _rank_partitions: the intervals tp_rank holds, one per global part. */
static uint32_t rank_parts(const kvb__cpd_contract_t *c, uint32_t f, const kvb__cpd_partition_t *pt,
                           uint32_t tp, uint32_t rank, interval_t out[KVB__CPD_MAX_PARTS])
{
    uint64_t local = c->fields[f].shape[pt->axis], n = pt->global_extent / local;
    uint64_t shard = rank / (tp / n), goff = 0, loff = 0;
    uint32_t np = pt->nparts ? pt->nparts : 1;
    for (uint32_t k = 0; k < np; k++) {
        uint64_t e = pt->nparts ? pt->parts[k] : pt->global_extent, le = e / n;
        out[k].start = goff + shard * le;
        out[k].end = out[k].start + le;
        out[k].local = loff;
        goff += e;
        loff += le;
    }
    return np;
}

static kvb_status_t check_segs(planner_t *pl, kvb__frames_err_t *err)
{
    for (uint32_t i = 0; i < pl->nsegs; i++) {
        const kvb__cpd_field_t *pf = &pl->p->fields[pl->segs[i].pf];
        const kvb__cpd_field_t *df = &pl->d->fields[pl->segs[i].df];
        if (pl->ptp == pl->dtp &&
            (pf->ndim != df->ndim || memcmp(pf->shape, df->shape, pf->ndim * 8) != 0 ||
             pf->payload != df->payload))
            return kvb__cpd_fail(err, false, 0,
                                 "equal-TP cache field '%s' rank-local geometry differs",
                                 pf->field_id);
        if (pf->partition < 0)
            continue;
        const kvb__cpd_partition_t *pt = &pl->p->parts[pf->partition];
        KVB__FRAMES_TRY(check_mapping(pl->p, pl->segs[i].pf, pl->ptp, pt, err));
        KVB__FRAMES_TRY(check_mapping(pl->d, pl->segs[i].df, pl->dtp, pt, err));
        if (pl->shard[pl->segs[i].spec] != 1)
            return kvb__cpd_fail(err, false, 0,
                                 "cache field '%s' is both head-partitioned and page-sharded on "
                                 "Prefill",
                                 pf->field_id);
    }
    return KVB_OK;
}

static kvb_status_t check_shards(planner_t *pl, kvb__frames_err_t *err)
{
    for (uint32_t s = 0; s < pl->p->nspecs; s++) {
        const kvb__cpd_spec_t *ps = &pl->p->specs[s];
        if (pl->d->specs[s].shard_count != 1)
            return kvb__cpd_fail(err, false, 0,
                                 "cache group '%s' is sharded on Decode; PD transfer into a "
                                 "DCP-sharded destination is not supported",
                                 ps->group_id);
        if (pl->ptp % ps->shard_count != 0)
            return kvb__cpd_fail(err, false, 0,
                                 "cache group '%s' shard count %u does not divide Prefill TP=%u",
                                 ps->group_id, ps->shard_count, pl->ptp);
        pl->shard[s] = ps->shard_count;
        pl->sharded = pl->sharded || ps->shard_count != 1;
    }
    return KVB_OK;
}

static void planner_free(planner_t *pl)
{
    free(pl->segs);
    memset(pl, 0, sizeof(*pl));
}

/* The CacheTransferPlanner constructor for stage `stage` of the pair. */
static kvb_status_t planner_init(planner_t *pl, const kvb__cpd_pair_t *pair, uint32_t stage,
                                 kvb__frames_err_t *err)
{
    memset(pl, 0, sizeof(*pl));
    pl->p = pair->prefill;
    pl->d = pair->decode;
    pl->ptp = pair->prefill_tp;
    pl->dtp = pair->decode_tp;
    if (pl->ptp == 0 || pl->dtp == 0)
        return kvb__cpd_fail(err, false, 0, "Cache TP sizes must be positive");
    if (pl->ptp > KVB__CPD_MAX_TP || pl->dtp > KVB__CPD_MAX_TP)
        return kvb__cpd_fail(err, false, 0, "Cache TP sizes cannot exceed %u", KVB__CPD_MAX_TP);
    const kvb__cpd_stages_t *st = pair->stages;
    if (stage >= st->n || st->start[st->n] != pl->p->nfields)
        return KVB_ERR_INVALID;
    KVB__FRAMES_TRY(kvb__cpd_check_peer(pl->p, pl->d, err));
    KVB__FRAMES_TRY(check_shards(pl, err));
    bool *in = calloc(pl->p->nfields + 1, sizeof(bool));
    pl->segs = calloc(pl->p->nfields + 1, sizeof(seg_t));
    if (in == NULL || pl->segs == NULL) {
        free(in);
        planner_free(pl);
        return KVB_ERR_NOMEM;
    }
    for (uint32_t k = st->start[stage]; k < st->start[stage + 1]; k++)
        in[st->idx[k]] = true;
    pl->all = st->start[stage + 1] - st->start[stage] == pl->p->nfields;
    for (uint32_t s = 0; s < pl->p->nspecs; s++)
        for (uint32_t k = 0; k < pl->p->specs[s].nfields; k++)
            if (in[pl->p->specs[s].sorted_fields[k]])
                pl->segs[pl->nsegs++] =
                    (seg_t){s, pl->p->specs[s].sorted_fields[k], pl->d->specs[s].sorted_fields[k]};
    free(in);
    kvb_status_t rc = check_segs(pl, err);
    if (rc != KVB_OK)
        planner_free(pl);
    return rc;
}

static bool whole_route(const planner_t *pl)
{
    return pl->ptp == pl->dtp && pl->all && !pl->sharded;
}

/* ---------------------------------------------------------------- fragments */

typedef struct rfrag {
    uint32_t rank;
    kvb__cpd_frag_t f;
} rfrag_t;

typedef struct fvec {
    rfrag_t *v;
    size_t n, cap;
} fvec_t;

static bool fvec_push(fvec_t *fv, uint32_t rank, const kvb__cpd_frag_t *f)
{
    if (fv->n == fv->cap) {
        size_t cap = fv->cap ? 2 * fv->cap : 64;
        rfrag_t *v = realloc(fv->v, cap * sizeof(*v));
        if (v == NULL)
            return false;
        fv->v = v;
        fv->cap = cap;
    }
    fv->v[fv->n].rank = rank;
    fv->v[fv->n++].f = *f;
    return true;
}

/* _make_fragment for a partitioned field: the intersection [lo, hi) of the
 * two ranks' intervals pi and di of one part. */
static kvb__cpd_frag_t part_frag(const planner_t *pl, const seg_t *sg, const interval_t *pi,
                                 const interval_t *di, uint64_t lo, uint64_t hi)
{
    const kvb__cpd_field_t *pf = &pl->p->fields[sg->pf], *df = &pl->d->fields[sg->df];
    uint32_t a = pl->p->parts[pf->partition].axis;
    uint64_t inner = kvb__cpd_dtype_bytes(pf->dtype), rows = 1;
    for (uint32_t k = a + 1; k < pf->ndim; k++)
        inner *= pf->shape[k]; /* <= payload: no overflow */
    for (uint32_t k = 0; k < a; k++)
        rows *= pf->shape[k];
    kvb__cpd_frag_t f = {sg->spec,
                         sg->pf,
                         sg->df,
                         (pi->local + lo - pi->start) * inner,
                         (di->local + lo - di->start) * inner,
                         pf->shape[a] * inner,
                         df->shape[a] * inner,
                         (hi - lo) * inner,
                         rows};
    if (rows > 1 && f.src_row_stride == f.bytes_per_row && f.dst_row_stride == f.bytes_per_row) {
        f.bytes_per_row *= rows; /* whole rows on both sides: one span */
        f.src_row_stride = f.dst_row_stride = f.bytes_per_row;
        f.rows_per_page = 1;
    }
    return f;
}

/* The fragments of one partitioned pair for decode rank d. TokenSpeed walks
 * every representative prefill rank; the ones whose shard intersects d's
 * interval are computed directly here (same fragments, same per-rank order:
 * per rank, parts in order). */
static bool partitioned(const planner_t *pl, const seg_t *sg, uint32_t d, fvec_t *out)
{
    const kvb__cpd_field_t *pf = &pl->p->fields[sg->pf];
    const kvb__cpd_partition_t *pt = &pl->p->parts[pf->partition];
    interval_t di[KVB__CPD_MAX_PARTS], pi[KVB__CPD_MAX_PARTS];
    uint32_t np = rank_parts(pl->d, sg->df, pt, pl->dtp, d, di);
    uint64_t n = pt->global_extent / pf->shape[pt->axis], group = pl->ptp / n;
    for (uint32_t k = 0; k < np; k++) {
        uint64_t e = pt->nparts ? pt->parts[k] : pt->global_extent, le = e / n, base = 0;
        for (uint32_t j = 0; j < k; j++) /* the part's start on the global axis */
            base += pt->parts[j];
        uint64_t s_lo = (di[k].start - base) / le, s_hi = (di[k].end - base + le - 1) / le;
        for (uint64_t s = s_lo; s < s_hi && s < n; s++) {
            uint32_t rank = (uint32_t)(s * group);
            rank_parts(pl->p, sg->pf, pt, pl->ptp, rank, pi);
            uint64_t lo = pi[k].start > di[k].start ? pi[k].start : di[k].start;
            uint64_t hi = pi[k].end < di[k].end ? pi[k].end : di[k].end;
            if (lo >= hi)
                continue;
            kvb__cpd_frag_t f = part_frag(pl, sg, &pi[k], &di[k], lo, hi);
            if (!fvec_push(out, rank, &f))
                return false;
        }
    }
    return true;
}

/* A replicated field: one whole-field fragment from the replica rank, or
 * from every rank of its DCP subgroup when the group is sharded. */
static bool replicated(const planner_t *pl, const seg_t *sg, uint32_t d, fvec_t *out)
{
    const kvb__cpd_field_t *pf = &pl->p->fields[sg->pf], *df = &pl->d->fields[sg->df];
    kvb__cpd_frag_t f = {sg->spec, sg->pf, sg->df, 0, 0, pf->payload, df->payload, pf->payload, 1};
    uint32_t r = (uint32_t)((uint64_t)d * pl->ptp / pl->dtp), k = pl->shard[sg->spec];
    uint32_t base = r - r % k;
    for (uint32_t rank = base; rank < base + k; rank++)
        if (!fvec_push(out, rank, &f))
            return false;
    return true;
}

/* _fragments_for_decode_rank: every fragment for d, grouped by prefill rank
 * (ascending), each rank's in TokenSpeed's order. */
static kvb_status_t frags_for(const planner_t *pl, uint32_t d, fvec_t *out)
{
    out->n = 0;
    for (uint32_t i = 0; i < pl->nsegs; i++) {
        const seg_t *sg = &pl->segs[i];
        bool ok = pl->p->fields[sg->pf].partition < 0 ? replicated(pl, sg, d, out)
                                                      : partitioned(pl, sg, d, out);
        if (!ok)
            return KVB_ERR_NOMEM;
    }
    /* A stable grouping by rank: counting sort keeps each rank's order. */
    rfrag_t *tmp = malloc((out->n ? out->n : 1) * sizeof(*tmp));
    uint32_t *count = calloc(pl->ptp + 1, sizeof(uint32_t));
    if (tmp == NULL || count == NULL) {
        free(tmp);
        free(count);
        return KVB_ERR_NOMEM;
    }
    for (size_t i = 0; i < out->n; i++)
        count[out->v[i].rank + 1]++;
    for (uint32_t r = 0; r < pl->ptp; r++)
        count[r + 1] += count[r];
    for (size_t i = 0; i < out->n; i++)
        tmp[count[out->v[i].rank]++] = out->v[i];
    memcpy(out->v, tmp, out->n * sizeof(*tmp));
    free(tmp);
    free(count);
    return KVB_OK;
}

/* ---------------------------------------------------------------- routes */

/* A source entry for stage-local rank `rank` (stage-major base + rank) with
 * frags[0..n) (NULL: whole copy), and its owner filters
 * (owner_filters_for: sharded groups its fragments name). */
static kvb_status_t make_source(const planner_t *pl, uint32_t base, uint32_t rank,
                                const rfrag_t *frags, size_t n, kvb__cpd_source_t *src)
{
    memset(src, 0, sizeof(*src));
    src->prefill_rank = base + rank;
    src->whole = frags == NULL;
    src->owners = calloc(pl->p->nspecs + 1, sizeof(kvb__cpd_owner_t));
    src->frags = calloc(n + 1, sizeof(kvb__cpd_frag_t));
    if (src->owners == NULL || src->frags == NULL)
        return KVB_ERR_NOMEM;
    for (size_t i = 0; i < n; i++) {
        uint32_t s = frags[i].f.spec, k = pl->shard[s];
        src->frags[i] = frags[i].f;
        if (k != 1)
            src->owners[s] = (kvb__cpd_owner_t){rank % k, k};
    }
    src->nfrags = (uint32_t)n;
    return KVB_OK;
}

static kvb_status_t add_source(kvb__cpd_route_t *r, const planner_t *pl, uint32_t base,
                               uint32_t rank, const rfrag_t *frags, size_t n)
{
    kvb__cpd_source_t *v = realloc(r->sources, (r->nsources + 1) * sizeof(*v));
    if (v == NULL)
        return KVB_ERR_NOMEM;
    r->sources = v;
    kvb_status_t st = make_source(pl, base, rank, frags, n, &v[r->nsources]);
    r->nsources++; /* counted even on failure: route_free releases it */
    return st;
}

/* plan_for_decode_rank of one stage: append its sources (ranks + base). */
static kvb_status_t stage_sources(const planner_t *pl, uint32_t d, uint32_t base, fvec_t *fv,
                                  kvb__frames_err_t *err, kvb__cpd_route_t *r)
{
    if (whole_route(pl))
        return add_source(r, pl, base, d, NULL, 0);
    KVB__FRAMES_TRY(frags_for(pl, d, fv));
    if (fv->n == 0)
        return kvb__cpd_fail(err, false, 0,
                             "Cache-transfer decode TP rank %u has no source fragments", d);
    for (size_t i = 0; i < fv->n;) {
        size_t j = i;
        while (j < fv->n && fv->v[j].rank == fv->v[i].rank)
            j++;
        KVB__FRAMES_TRY(add_source(r, pl, base, fv->v[i].rank, &fv->v[i], j - i));
        i = j;
    }
    return KVB_OK;
}

/* decode_ranks_by_prefill_rank: served[rank] = some decode rank reads it;
 * the decode ranks `rank` serves into exp (ascending). */
static kvb_status_t served_by(const planner_t *pl, uint32_t rank, fvec_t *fv, bool *served,
                              uint16_t *exp, uint32_t *nexp)
{
    *nexp = 0;
    if (whole_route(pl)) {
        for (uint32_t r = 0; r < pl->ptp; r++)
            served[r] = true;
        if (rank < pl->ptp)
            exp[(*nexp)++] = (uint16_t)rank;
        return KVB_OK;
    }
    for (uint32_t d = 0; d < pl->dtp; d++) {
        KVB__FRAMES_TRY(frags_for(pl, d, fv));
        bool mine = false;
        for (size_t i = 0; i < fv->n; i++) {
            served[fv->v[i].rank] = true;
            mine = mine || fv->v[i].rank == rank;
        }
        if (mine)
            exp[(*nexp)++] = (uint16_t)d;
    }
    return KVB_OK;
}

/* Every stage-local rank that serves no decode rank, + base, into r. */
static kvb_status_t add_dummies(const planner_t *pl, uint32_t base, fvec_t *fv, kvb__cpd_route_t *r)
{
    bool *served = calloc(pl->ptp, sizeof(bool));
    uint16_t *exp = calloc(pl->dtp, sizeof(uint16_t));
    uint32_t *v = realloc(r->dummies, (r->ndummies + pl->ptp) * sizeof(uint32_t));
    uint32_t nexp;
    kvb_status_t st = served && exp && v ? KVB_OK : KVB_ERR_NOMEM;
    if (v != NULL)
        r->dummies = v;
    if (st == KVB_OK)
        st = served_by(pl, UINT32_MAX, fv, served, exp, &nexp);
    for (uint32_t k = 0; st == KVB_OK && k < pl->ptp; k++)
        if (!served[k])
            r->dummies[r->ndummies++] = base + k;
    free(served);
    free(exp);
    return st;
}

static kvb_status_t decode_stage(const kvb__cpd_pair_t *pair, uint32_t stage, uint32_t d,
                                 fvec_t *fv, kvb__frames_err_t *err, kvb__cpd_route_t *r)
{
    planner_t pl;
    KVB__FRAMES_TRY(planner_init(&pl, pair, stage, err));
    uint32_t base = stage * pair->prefill_tp;
    kvb_status_t st = stage_sources(&pl, d, base, fv, err, r);
    if (st == KVB_OK && d == 0)
        st = add_dummies(&pl, base, fv, r);
    planner_free(&pl);
    return st;
}

kvb_status_t kvb__cpd_plan_decode(const kvb__cpd_pair_t *pair, uint32_t d, kvb__frames_err_t *err,
                                  kvb__cpd_route_t *route_p)
{
    kvb__cpd_route_t r = {0};
    fvec_t fv = {0};
    if (pair->stages == NULL || pair->stages->n == 0 || pair->prefill == NULL ||
        pair->decode == NULL)
        return KVB_ERR_INVALID;
    if (d >= pair->decode_tp)
        return kvb__cpd_fail(err, false, 0, "decode_tp_rank=%u is out of range", d);
    kvb_status_t st = KVB_OK;
    for (uint32_t s = 0; st == KVB_OK && s < pair->stages->n; s++)
        st = decode_stage(pair, s, d, &fv, err, &r);
    free(fv.v);
    if (st != KVB_OK) {
        kvb__cpd_route_free(&r);
        return st;
    }
    *route_p = r;
    return KVB_OK;
}

/* The registration's outcome on prefill rank tp_rank (_prepare_decode_registration). */
static kvb_status_t registration(const planner_t *pl, uint32_t base, uint32_t tp_rank, uint32_t d,
                                 fvec_t *fv, kvb__frames_err_t *err, kvb__cpd_route_t *r)
{
    kvb__cpd_route_t all = {0};
    bool *served = calloc(pl->ptp, sizeof(bool));
    r->expected = calloc(pl->dtp + 1, sizeof(uint16_t));
    kvb_status_t st = served && r->expected ? KVB_OK : KVB_ERR_NOMEM;
    if (st == KVB_OK)
        st = stage_sources(pl, d, base, fv, err, &all);
    if (st == KVB_OK)
        st = served_by(pl, tp_rank, fv, served, r->expected, &r->nexpected);
    uint32_t i = 0;
    while (st == KVB_OK && i < all.nsources && all.sources[i].prefill_rank != base + tp_rank)
        i++;
    if (st == KVB_OK && i < all.nsources) {
        r->sources = malloc(sizeof(*r->sources));
        st = r->sources ? KVB_OK : KVB_ERR_NOMEM;
        if (st == KVB_OK) {
            r->sources[0] = all.sources[i]; /* moved out of `all` */
            all.sources[i] = all.sources[--all.nsources];
            r->nsources = 1;
        }
    } else if (st == KVB_OK && d == 0 && r->nexpected == 0) {
        r->dummy = true;
        r->expected[0] = 0;
        r->nexpected = 1;
    } else if (st == KVB_OK) {
        st = kvb__cpd_fail(err, false, 0,
                           "CachePD Decode registration targets the wrong Prefill TP rank "
                           "(decode rank %u, prefill rank %u)",
                           d, base + tp_rank);
    }
    kvb__cpd_route_free(&all);
    free(served);
    return st;
}

kvb_status_t kvb__cpd_plan_registration(const kvb__cpd_pair_t *pair, uint32_t pp_rank,
                                        uint32_t tp_rank, uint32_t d, kvb__frames_err_t *err,
                                        kvb__cpd_route_t *route_p)
{
    planner_t pl;
    kvb__cpd_route_t r = {0};
    fvec_t fv = {0};
    if (pair->stages == NULL || pp_rank >= pair->stages->n || tp_rank >= pair->prefill_tp)
        return KVB_ERR_INVALID;
    KVB__FRAMES_TRY(planner_init(&pl, pair, pp_rank, err));
    kvb_status_t st = d < pair->decode_tp
                          ? registration(&pl, pp_rank * pair->prefill_tp, tp_rank, d, &fv, err, &r)
                          : kvb__cpd_fail(err, false, 0, "decode_tp_rank=%u is out of range", d);
    planner_free(&pl);
    free(fv.v);
    if (st != KVB_OK) {
        kvb__cpd_route_free(&r);
        return st;
    }
    *route_p = r;
    return KVB_OK;
}
