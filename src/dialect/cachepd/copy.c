/* CachePD copy list: one request's (or one layerwise step's) writes as
 * strided blocks (cachepd.h; spec 7.4, 7.9), in the order TokenSpeed's
 * _cache_transfer_blocks yields them. A strided block covers a run of pages
 * consecutive on both sides (and, for a multi-row fragment, every row of
 * them when rows continue at the same pitch across pages), so descriptors
 * grow with page runs, not with rows. */
#include "dialect/cachepd/cpd_int.h"

#include <stdlib.h>
#include <string.h>

/* One group's page pairs after owner filtering. */
typedef struct pages {
    uint64_t *src, *dst;
    size_t n;
} pages_t;

/* A single-span copy per page (a PageFieldCopies row). */
typedef struct row {
    uint64_t src, src_stride, dst, dst_stride, len;
} row_t;

typedef struct emit {
    kvb_plan_strided_t *out;
    size_t count0;
    uint64_t bytes0;
} emit_t;

static kvb_status_t push(emit_t *em, const kvb_strided_block_t *b)
{
    kvb_plan_strided_t *o = em->out;
    if (o->count == o->capacity) {
        if (o->fixed)
            return KVB_ERR_INVALID;
        size_t cap = o->capacity ? 2 * o->capacity : 64;
        kvb_strided_block_t *v = realloc(o->blocks, cap * sizeof(*v));
        if (v == NULL)
            return KVB_ERR_NOMEM;
        o->blocks = v;
        o->capacity = cap;
    }
    o->blocks[o->count++] = *b;
    o->bytes += b->len * b->count;
    return KVB_OK;
}

/* Page pairs of spec s (TokenSpeed: replicated groups copy ids as pages; a
 * sharded group keeps the ids its owner filter owns, at local pages). Page
 * ids are checked against both contracts (TokenSpeed relies on the
 * manifests' earlier checks). */
static kvb_status_t group_pages(const kvb__cpd_copy_t *cp, uint32_t s, kvb__frames_err_t *err,
                                pages_t *pg)
{
    const kvb__cpd_copy_group_t *g = &cp->groups[s];
    const kvb__cpd_spec_t *sp = &cp->local->specs[s];
    uint64_t k = sp->shard_count, vbc = kvb__cpd_virtual_blocks(cp->local, s);
    uint64_t src_pages = cp->local->groups[sp->group].page_count;
    uint64_t dst_pages = cp->decode->groups[cp->decode->specs[s].group].page_count;
    kvb__cpd_owner_t own = cp->source->owners[s];
    pg->n = 0;
    if (k != 1 && own.owner_count == 0)
        return KVB_OK; /* None: this rank sends nothing of the group */
    for (size_t i = 0; i < g->n; i++) {
        int64_t v = g->src[i], dp = g->dst[i];
        if (v <= 0 || (uint64_t)v >= vbc || dp <= 0 || (uint64_t)dp >= dst_pages)
            return kvb__cpd_fail(err, false, 0,
                                 "CachePD copy: group '%s' position %zu: block %lld -> %lld is "
                                 "out of bounds (source 1..%llu, destination 1..%llu)",
                                 sp->group_id, i, (long long)v, (long long)dp,
                                 (unsigned long long)(vbc - 1),
                                 (unsigned long long)(dst_pages - 1));
        if (k != 1 && (uint64_t)(v - 1) % k != own.owner_rank)
            continue;
        uint64_t local = (uint64_t)(v - 1) / k + 1;
        if (local >= src_pages)
            return kvb__cpd_fail(
                err, false, 0, "CachePD copy: group '%s' block %lld is local page %llu, past %llu",
                sp->group_id, (long long)v, (unsigned long long)local,
                (unsigned long long)src_pages);
        pg->src[pg->n] = local;
        pg->dst[pg->n++] = (uint64_t)dp;
    }
    return KVB_OK;
}

/* Pages i.. consecutive on both sides: how many. */
static size_t run_len(const pages_t *pg, size_t i)
{
    size_t j = i + 1;
    while (j < pg->n && pg->src[j] == pg->src[j - 1] + 1 && pg->dst[j] == pg->dst[j - 1] + 1)
        j++;
    return j - i;
}

static bool addr(uint64_t base, uint64_t page, uint64_t stride, uint64_t *out)
{
    uint64_t off;
    return kvb__mul_u64(page, stride, &off) && kvb__add_u64(base, off, out);
}

/* A PageFieldCopies row over the group's pages: one block per page run. */
static kvb_status_t emit_row(emit_t *em, const row_t *r, const pages_t *pg)
{
    for (size_t i = 0; i < pg->n;) {
        size_t n = run_len(pg, i);
        kvb_strided_block_t b = {0, 0, r->len, r->src_stride, r->dst_stride, n};
        if (!addr(r->src, pg->src[i], r->src_stride, &b.src) ||
            !addr(r->dst, pg->dst[i], r->dst_stride, &b.dst))
            return KVB_ERR_INVALID;
        if (n == 1)
            b.src_stride = b.dst_stride = r->len; /* a plain block, as kvb_plan's */
        KVB__FRAMES_TRY(push(em, &b));
        i += n;
    }
    return KVB_OK;
}

/* A multi-row fragment, page by page (_strided_page_copies): each page's rows
 * one block; pages of a run merge when the page stride is rows x pitch on
 * both sides (the rows then continue evenly). */
static kvb_status_t emit_rows(emit_t *em, const kvb__cpd_frag_t *f, const row_t *r,
                              const pages_t *pg)
{
    bool even = r->src_stride == f->rows_per_page * f->src_row_stride &&
                r->dst_stride == f->rows_per_page * f->dst_row_stride;
    for (size_t i = 0; i < pg->n;) {
        size_t n = even ? run_len(pg, i) : 1;
        kvb_strided_block_t b = {
            0, 0, f->bytes_per_row, f->src_row_stride, f->dst_row_stride, n * f->rows_per_page};
        if (!addr(r->src, pg->src[i], r->src_stride, &b.src) ||
            !addr(r->dst, pg->dst[i], r->dst_stride, &b.dst))
            return KVB_ERR_INVALID;
        KVB__FRAMES_TRY(push(em, &b));
        i += n;
    }
    return KVB_OK;
}

static bool field_row(const kvb__cpd_copy_t *cp, uint32_t lf, uint32_t df, uint64_t src_off,
                      uint64_t dst_off, uint64_t len, row_t *r)
{
    r->src_stride = cp->local->fields[lf].page_stride;
    r->dst_stride = cp->decode->fields[df].page_stride;
    r->len = len;
    if (cp->src_page0 != NULL)
        r->src = cp->src_page0[lf];
    return (cp->src_page0 != NULL ||
            kvb__add_u64(cp->src_slab, cp->local->fields[lf].page0, &r->src)) &&
           kvb__add_u64(r->src, src_off, &r->src) &&
           kvb__add_u64(cp->dst_slab, cp->decode->fields[df].page0, &r->dst) &&
           kvb__add_u64(r->dst, dst_off, &r->dst);
}

/* The fragment route of spec s: multi-row fragments now, single-span ones
 * collected into rows (emitted after, as TokenSpeed's fields array). */
static kvb_status_t frag_group(const kvb__cpd_copy_t *cp, uint32_t s, const pages_t *pg, emit_t *em,
                               row_t *rows, size_t *nrows)
{
    for (uint32_t i = 0; i < cp->source->nfrags; i++) {
        const kvb__cpd_frag_t *f = &cp->source->frags[i];
        if (f->spec != s)
            continue;
        int32_t lf = kvb__cpd_field_index(cp->local, cp->prefill->fields[f->pfield].field_id);
        if (lf < 0 || f->dfield >= cp->decode->nfields)
            return KVB_ERR_INVALID; /* the local contract lacks a field its route sends */
        if (cp->field_mask != NULL && !cp->field_mask[lf])
            continue;
        row_t r;
        if (!field_row(cp, (uint32_t)lf, f->dfield, f->src_off, f->dst_off, f->bytes_per_row, &r))
            return KVB_ERR_INVALID;
        if (f->rows_per_page == 1)
            rows[(*nrows)++] = r;
        else
            KVB__FRAMES_TRY(emit_rows(em, f, &r, pg));
    }
    return KVB_OK;
}

/* The whole-copy route of spec s: every field of the group, by field id. */
static kvb_status_t whole_group(const kvb__cpd_copy_t *cp, uint32_t s, row_t *rows, size_t *nrows)
{
    const kvb__cpd_spec_t *sp = &cp->local->specs[s];
    for (uint32_t k = 0; k < sp->nfields; k++) {
        uint32_t lf = sp->sorted_fields[k];
        int32_t df = kvb__cpd_field_index(cp->decode, cp->local->fields[lf].field_id);
        if (cp->field_mask != NULL && !cp->field_mask[lf])
            continue;
        if (df < 0 ||
            !field_row(cp, lf, (uint32_t)df, 0, 0, cp->local->fields[lf].payload, &rows[*nrows]))
            return KVB_ERR_INVALID;
        (*nrows)++;
    }
    return KVB_OK;
}

static kvb_status_t copy_group(const kvb__cpd_copy_t *cp, uint32_t s, pages_t *pg, row_t *rows,
                               emit_t *em, kvb__frames_err_t *err)
{
    size_t nrows = 0;
    KVB__FRAMES_TRY(group_pages(cp, s, err, pg));
    if (pg->n == 0)
        return KVB_OK;
    KVB__FRAMES_TRY(cp->source->whole ? whole_group(cp, s, rows, &nrows)
                                      : frag_group(cp, s, pg, em, rows, &nrows));
    for (size_t i = 0; i < nrows; i++)
        KVB__FRAMES_TRY(emit_row(em, &rows[i], pg));
    return KVB_OK;
}

static bool copy_args_ok(const kvb__cpd_copy_t *cp)
{
    if (cp == NULL || cp->source == NULL || cp->prefill == NULL || cp->local == NULL ||
        cp->decode == NULL || cp->groups == NULL || cp->local->nspecs != cp->prefill->nspecs ||
        cp->decode->nspecs != cp->prefill->nspecs)
        return false;
    for (uint32_t s = 0; s < cp->local->nspecs; s++)
        if (strcmp(cp->local->specs[s].group_id, cp->prefill->specs[s].group_id) != 0 ||
            (cp->groups[s].n != 0 && (cp->groups[s].src == NULL || cp->groups[s].dst == NULL)))
            return false;
    return true;
}

kvb_status_t kvb__cpd_plan_copy(const kvb__cpd_copy_t *cp, kvb__frames_err_t *err,
                                kvb_plan_strided_t *out)
{
    if (!copy_args_ok(cp) || out == NULL)
        return KVB_ERR_INVALID;
    size_t maxn = 1, nf = cp->local->nfields + cp->source->nfrags + 1;
    for (uint32_t s = 0; s < cp->local->nspecs; s++)
        maxn = cp->groups[s].n > maxn ? cp->groups[s].n : maxn;
    pages_t pg = {malloc(maxn * sizeof(uint64_t)), malloc(maxn * sizeof(uint64_t)), 0};
    row_t *rows = malloc(nf * sizeof(row_t));
    emit_t em = {out, out->count, out->bytes};
    kvb_status_t st = pg.src && pg.dst && rows ? KVB_OK : KVB_ERR_NOMEM;
    for (uint32_t s = 0; st == KVB_OK && s < cp->local->nspecs; s++)
        st = copy_group(cp, s, &pg, rows, &em, err);
    free(pg.src);
    free(pg.dst);
    free(rows);
    if (st != KVB_OK) {
        out->count = em.count0;
        out->bytes = em.bytes0;
    }
    return st;
}
