/* A write's blocks on the caller's thread: checked against both sides'
 * registrations, then coalesced into the form its lane walks. The direct
 * lane walks strided runs (kvb__run_t), so a strided block (a head slice of
 * every row of a run of pages) costs one check and one descriptor whatever
 * its row count; the UCX lanes walk plain blocks, so strided blocks are
 * expanded into rows for them (kvb__runs_expand). */
#include "engine/engine_int.h"
#include "engine/bufpool.h"

/* Segment of t holding [addr, addr+len): entry *last when it does (blocks
 * of a batch mostly stay in one segment), else a search; -1 if none. */
static long seg_of(const kvb__segtab_t *t, long *last, uint64_t addr, uint64_t len)
{
    const kvb__seg_t *s = *last >= 0 && (size_t)*last < t->n ? &t->v[*last] : NULL;
    if (s != NULL && addr >= s->addr && addr - s->addr <= s->len &&
        len <= s->len - (addr - s->addr))
        return *last;
    return *last = kvb__segtab_find(t, addr, len);
}

/* Bytes from the first row's start to the last row's end on a side with
 * this stride; false when that wraps. */
static bool span_of(const kvb_strided_block_t *b, uint64_t start, uint64_t stride, uint64_t *span_p)
{
    uint64_t step, span;
    if (!kvb__mul_u64(b->count - 1, stride, &step) || !kvb__add_u64(step, b->len, &span) ||
        !kvb__add_u64(start, span, &(uint64_t){0}))
        return false;
    *span_p = span;
    return true;
}

/* A strided block's own rules; its spans on both sides. */
static kvb_status_t check_shape(kvb_engine_h eng, const kvb_strided_block_t *b, size_t i,
                                uint64_t *sspan_p, uint64_t *dspan_p)
{
    if (b->count == 0)
        return kvb__err_set(&eng->err, KVB_ERR_INVALID, "strided block %zu: count 0", i);
    if (b->count > 1 && b->dst_stride < b->len)
        return kvb__err_set(&eng->err, KVB_ERR_INVALID,
                            "strided block %zu: dst_stride %llu below len %llu (rows overlap)", i,
                            (unsigned long long)b->dst_stride, (unsigned long long)b->len);
    if (!span_of(b, b->src, b->src_stride, sspan_p) || !span_of(b, b->dst, b->dst_stride, dspan_p))
        return kvb__err_set(&eng->err, KVB_ERR_INVALID,
                            "strided block %zu: %llu rows of %llu bytes wrap the address space", i,
                            (unsigned long long)b->count, (unsigned long long)b->len);
    return KVB_OK;
}

kvb_status_t kvb__wblocks_check(kvb_engine_h eng, kvb__conn_t *c, const kvb__wblocks_t *w,
                                long *dst_seg, bool *retry_p)
{
    kvb_status_t st = KVB_OK;
    long src_last = -1, dst_last = -1;
    pthread_mutex_lock(&eng->seg_mu);
    const char *local = w->read ? "local destination" : "local source";
    const char *remote = w->read ? "source" : "destination";
    for (size_t i = 0; i < w->n && st == KVB_OK; i++) {
        kvb_strided_block_t b = kvb__wb_at(w, i), raw = kvb__wb_raw(w, i);
        uint64_t sspan = b.len, dspan = b.len, span[2] = {b.len, b.len};
        dst_seg[i] = -1;
        if (b.len == 0)
            continue;
        /* The shape rules name the caller's sides (the bytes' destination
         * rows must not overlap); the spans then go to the engine's form. */
        if (w->strided != NULL && (st = check_shape(eng, &raw, i, &span[0], &span[1])) != KVB_OK)
            break;
        sspan = span[w->read], dspan = span[!w->read];
        /* the local side may also be a local-only region (peers never see it) */
        if (seg_of(&eng->segs, &src_last, b.src, sspan) < 0 &&
            kvb__segtab_find(&eng->local_segs, b.src, sspan) < 0)
            st = kvb__err_set(&eng->err, KVB_ERR_BOUNDS,
                              "block %zu: %s [0x%llx, +%llu) is not inside a "
                              "registered region",
                              i, local, (unsigned long long)b.src, (unsigned long long)sspan);
        else if ((dst_seg[i] = seg_of(&c->segs, &dst_last, b.dst, dspan)) < 0 &&
                 !KVB__HOOK(skip_remote_check)) {
            *retry_p = true;
            st = kvb__err_set(&eng->err, KVB_ERR_BOUNDS,
                              "session %s, block %zu: %s [0x%llx, +%llu) is not "
                              "inside a region the peer registered",
                              c->sess->sid, i, remote, (unsigned long long)b.dst,
                              (unsigned long long)dspan);
        }
    }
    pthread_mutex_unlock(&eng->seg_mu);
    return st;
}

/* r as its simplest run: rows contiguous on both sides are one row. */
static kvb__run_t run_of(const kvb_strided_block_t *b, long seg)
{
    kvb__run_t r = {b->src, b->dst, b->len, b->src_stride, b->dst_stride, b->count, seg};
    if (r.count > 1 && r.sstride == r.len && r.dstride == r.len) {
        r.len *= r.count; /* the span was checked not to wrap */
        r.count = 1;
    }
    if (r.count == 1)
        r.sstride = r.dstride = r.len;
    return r;
}

/* Fold r into *p when it continues it on both sides in the same segment:
 * contiguous single rows, or more rows of the same stride. */
static bool run_extends(kvb__run_t *p, const kvb__run_t *r)
{
    if (p->seg != r->seg)
        return false;
    if (p->count == 1 && r->count == 1) {
        if (p->src + p->len != r->src || p->dst + p->len != r->dst)
            return false;
        p->len += r->len;
        p->sstride = p->dstride = p->len;
        return true;
    }
    if (p->len != r->len || p->sstride != r->sstride || p->dstride != r->dstride ||
        p->src + p->count * p->sstride != r->src || p->dst + p->count * p->dstride != r->dst)
        return false;
    p->count += r->count;
    return true;
}

kvb_status_t kvb__runs_build(struct kvb_xfer *x, const kvb__wblocks_t *w, const long *dst_seg)
{
    x->runs = kvb__bufpool_get((w->n ? w->n : 1) * sizeof(*x->runs), &x->runs_cap);
    if (x->runs == NULL)
        return KVB_ERR_NOMEM;
    size_t m = 0;
    for (size_t i = 0; i < w->n; i++) {
        kvb_strided_block_t b = kvb__wb_at(w, i);
        if (b.len == 0)
            continue;
        kvb__run_t r = run_of(&b, dst_seg[i]);
        if (m == 0 || !run_extends(&x->runs[m - 1], &r))
            x->runs[m++] = r;
    }
    x->nruns = m;
    /* Counted after folding (contiguous single rows become one row): the
     * zip walks exactly these. Each run's rows lie in one registered
     * segment, so the sum stays far from wrapping. */
    x->nrows = 0;
    for (size_t i = 0; i < m; i++)
        x->nrows += x->runs[i].count;
    return KVB_OK;
}

/* Append one block, merged into the last when contiguous on both sides in
 * the same remote segment (a local region boundary is harmless: both are
 * ours, registered, and touched only by our own copies). */
static void block_add(kvb_block_t *out, size_t *m, long *last_seg, uint64_t src, uint64_t dst,
                      uint64_t len, long seg)
{
    kvb_block_t *p = *m > 0 ? &out[*m - 1] : NULL;
    if (p != NULL && seg == *last_seg && p->src + p->len == src && p->dst + p->len == dst) {
        p->len += len;
        return;
    }
    out[(*m)++] = (kvb_block_t){src, dst, len};
    *last_seg = seg;
}

kvb_status_t kvb__xfer_blocks(struct kvb_xfer *x, const kvb_block_t *b, const long *dst_seg,
                              size_t n)
{
    x->blocks = kvb__bufpool_get((n ? n : 1) * sizeof(*x->blocks), &x->blocks_cap);
    if (x->blocks == NULL)
        return KVB_ERR_NOMEM;
    size_t m = 0;
    long last_seg = -2;
    for (size_t i = 0; i < n; i++)
        if (b[i].len > 0)
            block_add(x->blocks, &m, &last_seg, b[i].src, b[i].dst, b[i].len, dst_seg[i]);
    x->n = m;
    return KVB_OK;
}

kvb_status_t kvb__runs_expand(struct kvb_xfer *x)
{
    uint64_t rows = 0;
    for (size_t i = 0; i < x->nruns; i++)
        if (!kvb__add_u64(rows, x->runs[i].count, &rows))
            return KVB_ERR_NOMEM;
    if (rows > SIZE_MAX / sizeof(kvb_block_t))
        return KVB_ERR_NOMEM;
    x->blocks = kvb__bufpool_get((rows ? rows : 1) * sizeof(*x->blocks), &x->blocks_cap);
    if (x->blocks == NULL)
        return KVB_ERR_NOMEM;
    size_t m = 0;
    long last_seg = -2;
    for (size_t i = 0; i < x->nruns; i++) {
        const kvb__run_t *r = &x->runs[i];
        for (uint64_t k = 0; k < r->count; k++)
            block_add(x->blocks, &m, &last_seg, r->src + k * r->sstride, r->dst + k * r->dstride,
                      r->len, r->seg);
    }
    x->n = m;
    kvb__bufpool_put(x->runs, x->runs_cap);
    x->runs = NULL;
    x->runs_cap = x->nruns = 0;
    x->nrows = 0;
    return KVB_OK;
}
