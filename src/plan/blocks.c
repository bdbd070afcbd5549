/* Transfer planner, hot path: fragments × pages × rows × layers → blocks.
 *
 * One driver (plan_chunk) checks the arguments and every index and address
 * once per call and builds one job per buffer kind; an emitter then writes
 * the job's blocks without checks: plain kvb_block_t rows (kvb_plan_blocks)
 * or strided blocks over page runs (kvb_plan_strided_blocks). Capacity is
 * reserved per job for the same reason. */
#include "plan_int.h"

#include <stddef.h>
#include <stdlib.h>
#include <string.h>

void kvb_plan_blocks_init(kvb_plan_blocks_t *out)
{
    memset(out, 0, sizeof(*out));
}

void kvb_plan_strided_init(kvb_plan_strided_t *out)
{
    memset(out, 0, sizeof(*out));
}

/* Free a planner-grown array; a caller's fixed array is left alone. */
static void free_array(void *blocks, int fixed)
{
    if (!fixed)
        free(blocks);
}

void kvb_plan_blocks_free(kvb_plan_blocks_t *out)
{
    if (out == NULL)
        return;
    free_array(out->blocks, out->fixed);
    memset(out, 0, sizeof(*out));
}

void kvb_plan_strided_free(kvb_plan_strided_t *out)
{
    if (out == NULL)
        return;
    free_array(out->blocks, out->fixed);
    memset(out, 0, sizeof(*out));
}

/* Room for `more` entries of elem bytes after count in *arr_p (capacity
 * *cap_p), grown by doubling unless fixed. */
static kvb_status_t reserve(void **arr_p, size_t *cap_p, size_t count, int fixed, size_t elem,
                            uint64_t more)
{
    uint64_t need;
    if (!kvb__add_u64(count, more, &need) || need > SIZE_MAX / elem)
        return kvb__plan_fail("blocks: %llu more blocks overflow the array size",
                              (unsigned long long)more);
    if (need <= *cap_p)
        return KVB_OK;
    if (fixed)
        return kvb__plan_fail("blocks: fixed array capacity=%zu, need at least %llu", *cap_p,
                              (unsigned long long)need);
    size_t cap = *cap_p ? *cap_p : 256;
    while (cap < need)
        cap = cap > SIZE_MAX / 2 / elem ? (size_t)need : cap * 2;
    void *nb = realloc(*arr_p, cap * elem);
    if (nb == NULL)
        return KVB_ERR_NOMEM;
    *arr_p = nb;
    *cap_p = cap;
    return KVB_OK;
}

/* Check that indices lie in [0, pool) (pool 0: only non-negative) and return
 * the largest. */
static kvb_status_t check_indices(const char *side, const char *what, const int32_t *idx, size_t n,
                                  uint64_t pool, uint64_t *max_p)
{
    int32_t mx = 0, mn = 0;
    for (size_t i = 0; i < n; i++) {
        mx = idx[i] > mx ? idx[i] : mx;
        mn = idx[i] < mn ? idx[i] : mn;
    }
    if (mn < 0 || (pool != 0 && (uint64_t)mx >= pool)) {
        for (size_t i = 0; i < n; i++)
            if (idx[i] < 0 || (pool != 0 && (uint64_t)idx[i] >= pool))
                return kvb__plan_fail("%s_%s[%zu]=%d outside the pool of %llu items", side, what, i,
                                      (int)idx[i], (unsigned long long)pool);
    }
    *max_p = (uint64_t)mx;
    return KVB_OK;
}

/* base + (max_index + 1) × item must not wrap, so no address of any item up
 * to max_index does. */
static kvb_status_t check_span(const char *kind, const char *w, uint64_t base, uint64_t max_index,
                               uint64_t item)
{
    uint64_t span, end;
    if (!kvb__mul_u64(max_index + 1, item, &span) || !kvb__add_u64(base, span, &end))
        return kvb__plan_fail("%s: %s address 0x%llx + (%llu + 1) × item_len %llu overflows", kind,
                              w, (unsigned long long)base, (unsigned long long)max_index,
                              (unsigned long long)item);
    return KVB_OK;
}

/* Items of one kind that a call sends (pages, state items or the aux
 * item): index pairs, checked against the pools. */
typedef struct item_set {
    const int32_t *sp, *dp;
    size_t n, runs;      /* items; maximal runs of them consecutive on both sides */
    uint64_t smax, dmax; /* largest index on each side */
} item_set_t;

/* One buffer kind of one call: nbuf buffers, the same items of each. */
typedef struct emit_job {
    const kvb__plan_class_t *c;
    const uint64_t *sb, *db; /* base address per buffer */
    uint32_t nbuf;
    item_set_t is;
    uint64_t soff, doff, bytes; /* the fragment within a row */
} emit_job_t;

/* The fragment covers whole rows on both sides (offsets are then 0). */
static bool job_whole(const emit_job_t *j)
{
    return j->bytes == j->c->src_row && j->bytes == j->c->dst_row;
}

/* The fragment's rows of a run of items follow each other at the row
 * lengths on both sides (an item is exactly its rows). */
static bool job_packed(const emit_job_t *j)
{
    const kvb__plan_class_t *c = j->c;
    return c->src_item == c->rows * c->src_row && c->dst_item == c->rows * c->dst_row;
}

/* Addresses of every buffer checked for wrap-around, and *total_p = per_buf
 * × nbuf entries reserved in the emitter's array. */
static kvb_status_t job_check(const emit_job_t *j, uint64_t per_buf, uint64_t *total_p)
{
    const kvb__plan_class_t *c = j->c;
    const char *kind = kvb_plan_buffer_name(c->kind);
    kvb_status_t st;
    for (uint32_t b = 0; b < j->nbuf; b++) {
        if ((st = check_span(kind, "prefill", j->sb[b], j->is.smax, c->src_item)) != KVB_OK ||
            (st = check_span(kind, "decode", j->db[b], j->is.dmax, c->dst_item)) != KVB_OK)
            return st;
    }
    if (!kvb__mul_u64(per_buf, j->nbuf, total_p))
        return kvb__plan_fail("%s: block count overflows", kind);
    return KVB_OK;
}

/* Runs of items, buffer by buffer: maximal runs consecutive on both sides,
 * or single items when `single`; plain_whole and strided_runs walk jobs so.
 * The job's fields are copied in so that the compiler keeps them in
 * registers across the emitters' stores (which could alias the job's
 * uint64_t fields). */
typedef struct run_iter {
    const uint64_t *sb, *db;
    const int32_t *sp, *dp;
    uint64_t sitem, ditem, soff, doff;
    size_t n, k;
    uint32_t nbuf, b;
    bool single;
} run_iter_t;

static inline run_iter_t run_begin(const emit_job_t *j, bool single)
{
    return (run_iter_t){.sb = j->sb,
                        .db = j->db,
                        .sp = j->is.sp,
                        .dp = j->is.dp,
                        .sitem = j->c->src_item,
                        .ditem = j->c->dst_item,
                        .soff = j->soff,
                        .doff = j->doff,
                        .n = j->is.n,
                        .nbuf = j->nbuf,
                        .single = single};
}

/* Next run: *s_p / *d_p = address of the fragment in its first row, *items_p
 * = its length. False when every buffer is done. n > 0. */
static inline bool next_run(run_iter_t *it, uint64_t *s_p, uint64_t *d_p, uint64_t *items_p)
{
    if (it->k == it->n) {
        it->k = 0;
        it->b++;
    }
    if (it->b == it->nbuf)
        return false;
    const int32_t *sp = it->sp, *dp = it->dp;
    size_t k = it->k, e = k + 1;
    while (!it->single && e < it->n && sp[e] == sp[e - 1] + 1 && dp[e] == dp[e - 1] + 1)
        e++;
    *s_p = it->sb[it->b] + it->soff + (uint64_t)sp[k] * it->sitem;
    *d_p = it->db[it->b] + it->doff + (uint64_t)dp[k] * it->ditem;
    *items_p = e - k;
    it->k = e;
    return true;
}

/* ---- plain blocks (kvb_plan_blocks) ---- */

/* Whole rows: one block per run; a run that continues the previous block of
 * this call on both sides (adjacent buffers) is folded into it. Only blocks
 * of this call (from floor on) merge, so an error can restore out. */
static void plain_whole(kvb_plan_blocks_t *out, size_t floor, const emit_job_t *j)
{
    kvb_block_t *o = out->blocks + out->count;
    run_iter_t it = run_begin(j, false);
    uint64_t s, d, items;
    while (next_run(&it, &s, &d, &items)) {
        uint64_t len = items * it.sitem;
        kvb_block_t *prev = o - out->blocks > (ptrdiff_t)floor ? o - 1 : NULL;
        if (prev != NULL && prev->src + prev->len == s && prev->dst + prev->len == d) {
            prev->len += len;
        } else {
            *o++ = (kvb_block_t){.src = s, .dst = d, .len = len};
        }
    }
    out->count = (size_t)(o - out->blocks);
}

/* Part of a row: one block per row. The hottest loop (one block per 256
 * bytes copied at heterogeneous TP), so it is written out rather than built
 * on run_iter, whose per-item bookkeeping cost it ~30% in plan-bench. */
static void plain_rows(kvb_plan_blocks_t *out, const emit_job_t *j)
{
    const kvb__plan_class_t *c = j->c;
    uint64_t srow = c->src_row, drow = c->dst_row, rows = c->rows, bytes = j->bytes;
    uint64_t sitem = c->src_item, ditem = c->dst_item;
    const int32_t *sp = j->is.sp, *dp = j->is.dp;
    size_t n = j->is.n;
    kvb_block_t *o = out->blocks + out->count;
    for (uint32_t b = 0; b < j->nbuf; b++) {
        uint64_t sb = j->sb[b] + j->soff, db = j->db[b] + j->doff;
        for (size_t k = 0; k < n; k++) {
            uint64_t s = sb + (uint64_t)sp[k] * sitem, d = db + (uint64_t)dp[k] * ditem;
            for (uint64_t r = 0; r < rows; r++) {
                o[r].src = s + r * srow;
                o[r].dst = d + r * drow;
                o[r].len = bytes;
            }
            o += rows;
        }
    }
    out->count = (size_t)(o - out->blocks);
}

static kvb_status_t emit_plain(void *arg, size_t floor, const emit_job_t *j)
{
    kvb_plan_blocks_t *out = arg;
    bool whole = job_whole(j);
    uint64_t total;
    kvb_status_t st = job_check(j, whole ? j->is.runs : (uint64_t)j->is.n * j->c->rows, &total);
    void *arr = out->blocks;
    if (st == KVB_OK)
        st = reserve(&arr, &out->capacity, out->count, out->fixed, sizeof(kvb_block_t), total);
    out->blocks = arr;
    if (st != KVB_OK)
        return st;
    if (whole)
        plain_whole(out, floor, j);
    else
        plain_rows(out, j);
    return KVB_OK;
}

/* ---- strided blocks (kvb_plan_strided_blocks) ---- */

/* Append b at *o_p, or fold it into the block before (from lo on, this
 * call's) when both are plain (count 1) and b continues it on both sides:
 * the same merging as plain_whole. A plain block's strides equal its len. */
static void put_strided(kvb_strided_block_t **o_p, const kvb_strided_block_t *lo,
                        kvb_strided_block_t b)
{
    kvb_strided_block_t *o = *o_p, *prev = o > lo ? o - 1 : NULL;
    if (b.count == 1 && prev != NULL && prev->count == 1 && prev->src + prev->len == b.src &&
        prev->dst + prev->len == b.dst) {
        prev->len += b.len;
        prev->src_stride = prev->dst_stride = prev->len;
        return;
    }
    *o = b;
    *o_p = o + 1;
}

/* One strided block per run of items: the fragment of every row, row after
 * row. A run spans items only when an item is exactly its rows on both sides
 * (the row after an item's last is the next item's first), else one block per
 * item. Whole rows on both sides are one contiguous span: a plain block. */
static void strided_runs(kvb_plan_strided_t *out, size_t floor, const emit_job_t *j)
{
    uint64_t rows = j->c->rows, srow = j->c->src_row, drow = j->c->dst_row, bytes = j->bytes;
    bool whole = job_whole(j);
    kvb_strided_block_t *o = out->blocks + out->count;
    run_iter_t it = run_begin(j, !job_packed(j));
    uint64_t s, d, items;
    while (next_run(&it, &s, &d, &items)) {
        uint64_t n = items * rows, len = n * bytes;
        if (whole)
            put_strided(&o, out->blocks + floor, (kvb_strided_block_t){s, d, len, len, len, 1});
        else
            *o++ = (kvb_strided_block_t){s, d, bytes, srow, drow, n};
    }
    out->count = (size_t)(o - out->blocks);
}

static kvb_status_t emit_strided(void *arg, size_t floor, const emit_job_t *j)
{
    kvb_plan_strided_t *out = arg;
    uint64_t total;
    kvb_status_t st = job_check(j, job_packed(j) ? j->is.runs : j->is.n, &total);
    void *arr = out->blocks;
    if (st == KVB_OK)
        st = reserve(&arr, &out->capacity, out->count, out->fixed, sizeof(*out->blocks), total);
    out->blocks = arr;
    if (st == KVB_OK)
        strided_runs(out, floor, j);
    return st;
}

/* ---- row mapping: page sizes or orders differ, or a chunk cut mid-page ---- */

/* Request token rows [t0, t1) of one call and the pages that hold them:
 * row t lies in prefill page sp[t / P_p - sfirst] at row t % P_p and decode
 * page dp[t / P_d - dfirst] at row t % P_d (both checked to exist). */
typedef struct row_set {
    const int32_t *sp, *dp;
    uint64_t sfirst, dfirst;
    uint64_t t0, t1;
    uint64_t smax, dmax;
} row_set_t;

/* Where one row mapping writes a piece (a strided block: count rows of len
 * bytes). */
typedef kvb_status_t (*put_fn)(void *out, size_t floor, const kvb_strided_block_t *b);

/* Bytes between consecutive tokens of one unit, and between consecutive
 * units of one token, in a page of `rows` rows (row = a token's units). */
typedef struct row_strides {
    uint64_t tok, unit;
} row_strides_t;

static row_strides_t side_strides(kvb_plan_order_t order, uint64_t rows, uint64_t row,
                                  uint64_t unit)
{
    if (order == KVB_PLAN_ORDER_HND)
        return (row_strides_t){unit, rows * unit};
    return (row_strides_t){row, unit};
}

/* Segment by segment (rows that stay in one page on both sides), the
 * fragment's units of every row: one piece per segment where the units lie
 * side by side on both sides (NHD, NHD) or the tokens do (HND, HND; one
 * head each), else one piece per unit; the put merges what continues within
 * one buffer (each buffer is its own registration: a block, strided or not,
 * must not run into the next). *count is the sink's block count. */
static kvb_status_t emit_rows(put_fn put, void *out, const size_t *count, const emit_job_t *j,
                              const row_set_t *rs)
{
    const kvb__plan_class_t *c = j->c;
    uint64_t unit = c->unit, nu = j->bytes / unit, Ps = c->rows, Pd = c->dst_rows;
    row_strides_t S = side_strides(c->src_order, Ps, c->src_row, unit);
    row_strides_t D = side_strides(c->dst_order, Pd, c->dst_row, unit);
    bool units_packed = S.unit == unit && D.unit == unit;
    bool toks_packed = S.tok == unit && D.tok == unit;
    uint64_t su0 = j->soff / unit, du0 = j->doff / unit;
    kvb_status_t st = KVB_OK;
    for (uint32_t b = 0; b < j->nbuf && st == KVB_OK; b++) {
        uint64_t n;
        size_t floor = *count;
        for (uint64_t t = rs->t0; t < rs->t1 && st == KVB_OK; t += n) {
            uint64_t sr = t % Ps, dr = t % Pd;
            n = Ps - sr < Pd - dr ? Ps - sr : Pd - dr;
            n = n < rs->t1 - t ? n : rs->t1 - t;
            uint64_t sp = (uint64_t)rs->sp[t / Ps - rs->sfirst];
            uint64_t dp = (uint64_t)rs->dp[t / Pd - rs->dfirst];
            uint64_t s = j->sb[b] + sp * c->src_item + sr * S.tok + su0 * S.unit;
            uint64_t d = j->db[b] + dp * c->dst_item + dr * D.tok + du0 * D.unit;
            kvb_strided_block_t pc;
            if (units_packed) {
                pc = (kvb_strided_block_t){s, d, j->bytes, S.tok, D.tok, n};
                st = put(out, floor, &pc);
            } else if (toks_packed) {
                pc = (kvb_strided_block_t){s, d, n * unit, S.unit, D.unit, nu};
                st = put(out, floor, &pc);
            } else {
                for (uint64_t u = 0; u < nu && st == KVB_OK; u++) {
                    pc = (kvb_strided_block_t){s + u * S.unit, d + u * D.unit, unit,
                                               S.tok,          D.tok,          n};
                    st = put(out, floor, &pc);
                }
            }
        }
    }
    return st;
}

/* Plain sink: the piece's rows one by one, each folded into the block
 * before (of this call) when it continues it on both sides. */
static kvb_status_t put_plain(void *arg, size_t floor, const kvb_strided_block_t *b)
{
    kvb_plan_blocks_t *out = arg;
    void *arr = out->blocks;
    kvb_status_t st =
        reserve(&arr, &out->capacity, out->count, out->fixed, sizeof(kvb_block_t), b->count);
    out->blocks = arr;
    if (st != KVB_OK)
        return st;
    kvb_block_t *o = out->blocks + out->count;
    kvb_block_t *prev = out->count > floor ? o - 1 : NULL;
    for (uint64_t k = 0; k < b->count; k++) {
        uint64_t s = b->src + k * b->src_stride, d = b->dst + k * b->dst_stride;
        if (prev != NULL && prev->src + prev->len == s && prev->dst + prev->len == d) {
            prev->len += b->len;
            continue;
        }
        *o = (kvb_block_t){.src = s, .dst = d, .len = b->len};
        prev = o++;
    }
    out->count = (size_t)(o - out->blocks);
    return KVB_OK;
}

/* b continues the strided block a (same row length, rows at a's strides;
 * a one-row b has no strides of its own). */
static bool continues_strided(const kvb_strided_block_t *a, const kvb_strided_block_t *b)
{
    if (a->count < 2 || a->len != b->len || a->src + a->count * a->src_stride != b->src ||
        a->dst + a->count * a->dst_stride != b->dst)
        return false;
    return b->count == 1 || (b->src_stride == a->src_stride && b->dst_stride == a->dst_stride);
}

/* Strided sink: a piece whose rows touch on both sides becomes one plain
 * block; a piece that continues the block before (of this call) extends it:
 * a plain one by length, a strided one (or a one-row one of the piece's row
 * length, one stride before it) by rows, and two equal one-row blocks at a
 * forward distance of at least their length become two rows. */
static kvb_status_t put_strided_piece(void *arg, size_t floor, const kvb_strided_block_t *b)
{
    kvb_plan_strided_t *out = arg;
    kvb_strided_block_t x = *b;
    if (x.count == 1 || (x.src_stride == x.len && x.dst_stride == x.len)) {
        x.len *= x.count;
        x.count = 1;
        x.src_stride = x.dst_stride = x.len;
    }
    kvb_strided_block_t *prev = out->count > floor ? &out->blocks[out->count - 1] : NULL;
    if (prev != NULL && x.count == 1 && prev->count == 1 && prev->src + prev->len == x.src &&
        prev->dst + prev->len == x.dst) {
        prev->len += x.len;
        prev->src_stride = prev->dst_stride = prev->len;
        return KVB_OK;
    }
    if (prev != NULL && continues_strided(prev, &x)) {
        prev->count += x.count;
        return KVB_OK;
    }
    if (prev != NULL && prev->count == 1 && x.count > 1 && prev->len == x.len &&
        prev->src + x.src_stride == x.src && prev->dst + x.dst_stride == x.dst) {
        prev->src_stride = x.src_stride; /* one row, then x's rows at x's strides */
        prev->dst_stride = x.dst_stride;
        prev->count = 1 + x.count;
        return KVB_OK;
    }
    if (prev != NULL && x.count == 1 && prev->count == 1 && prev->len == x.len &&
        x.src > prev->src && x.dst >= prev->dst + x.len) {
        prev->src_stride = x.src - prev->src;
        prev->dst_stride = x.dst - prev->dst;
        prev->count = 2;
        return KVB_OK;
    }
    void *arr = out->blocks;
    kvb_status_t st =
        reserve(&arr, &out->capacity, out->count, out->fixed, sizeof(*out->blocks), 1);
    out->blocks = arr;
    if (st == KVB_OK)
        out->blocks[out->count++] = x;
    return st;
}

/* ---- the driver both entry points share ---- */

/* Where a call writes: the emitter and the container's count and bytes. */
typedef struct plan_sink {
    kvb_status_t (*emit)(void *out, size_t floor, const emit_job_t *j);
    put_fn put; /* the row mapping's pieces */
    void *out;
    size_t *count;
    uint64_t *bytes;
} plan_sink_t;

/* What one chunk asks for, checked. */
typedef struct chunk_prep {
    item_set_t pages, state, aux; /* pages: whole pages past the prefix (when aligned) */
    row_set_t rows;               /* the rows this call sends, for the row mapping */
    int32_t aux_s, aux_d;
    bool last_stage, with_state, with_aux;
    bool aligned; /* equal page sizes, rows from page start to page end: whole pages */
} chunk_prep_t;

static kvb_status_t check_args(const char *fn, kvb_plan_h plan, uint32_t p, uint32_t d,
                               const kvb_plan_buffers_t *src, const kvb_plan_buffers_t *dst,
                               const kvb_plan_chunk_t *chunk, const void *out)
{
    if (plan == NULL || src == NULL || dst == NULL || chunk == NULL || out == NULL)
        return kvb__plan_fail("%s: NULL argument", fn);
    if (p >= plan->ptp)
        return kvb__plan_fail("prefill_rank=%u not below prefill tp_size=%u", p, plan->ptp);
    if (d >= plan->dtp)
        return kvb__plan_fail("decode_rank=%u not below decode tp_size=%u", d, plan->dtp);
    if (chunk->num_pages > 0 && (chunk->src_pages == NULL || chunk->dst_pages == NULL))
        return kvb__plan_fail("chunk: num_pages=%zu but src_pages or dst_pages is NULL",
                              chunk->num_pages);
    return KVB_OK;
}

/* Maximal runs of n indices consecutive on both sides (what reserve needs). */
static size_t count_runs(const int32_t *sp, const int32_t *dp, size_t n)
{
    size_t runs = n > 0;
    for (size_t i = 1; i < n; i++)
        runs += sp[i] != sp[i - 1] + 1 || dp[i] != dp[i - 1] + 1;
    return runs;
}

/* Check n index pairs against the pools ("src_" / "dst_" + what) into *is. */
static kvb_status_t prep_items(const char *what, const int32_t *sp, const int32_t *dp, size_t n,
                               uint64_t spool, uint64_t dpool, item_set_t *is)
{
    kvb_status_t st = check_indices("src", what, sp, n, spool, &is->smax);
    if (st == KVB_OK)
        st = check_indices("dst", what, dp, n, dpool, &is->dmax);
    if (st != KVB_OK)
        return st;
    is->sp = sp;
    is->dp = dp;
    is->n = n;
    is->runs = count_runs(sp, dp, n);
    return KVB_OK;
}

/* Request rows [first × P, (first + n) × P), or false on overflow. */
static bool chunk_rows(uint64_t first, size_t n, uint64_t P, uint64_t *t0_p, uint64_t *t1_p)
{
    return kvb__mul_u64(first, P, t0_p) && kvb__add_u64(first, n, t1_p) &&
           kvb__mul_u64(*t1_p, P, t1_p);
}

/* Rows of the chunk less the decode's prefix and past end_tokens; the decode
 * pages they reach must be in dst_pages. Equal page sizes with both ends on
 * page boundaries also give the whole-page item set (today's blocks). */
static kvb_status_t prep_pages(kvb_plan_h plan, const kvb_plan_chunk_t *chunk, chunk_prep_t *pr)
{
    uint64_t Ps = plan->src_page, Pd = plan->dst_page, m = chunk->field_mask, t0, t1;
    row_set_t *rs = &pr->rows;
    bool own_dst = (m & KVB_PLAN_CHUNK_DST_PAGES) != 0;
    size_t dn = own_dst ? chunk->num_dst_pages : chunk->num_pages;
    rs->sp = chunk->src_pages;
    rs->dp = chunk->dst_pages;
    rs->sfirst = chunk->first_page;
    rs->dfirst = own_dst ? chunk->dst_first_page : chunk->first_page;
    if (dn > 0 && rs->dp == NULL)
        return kvb__plan_fail("chunk: num_dst_pages=%zu but dst_pages is NULL", dn);
    if (!chunk_rows(chunk->first_page, chunk->num_pages, Ps, &t0, &t1))
        return kvb__plan_fail("chunk: first_page=%llu + num_pages=%zu overflows in tokens",
                              (unsigned long long)chunk->first_page, chunk->num_pages);
    if ((m & KVB_PLAN_CHUNK_PREFIX) && chunk->prefix_tokens > t0)
        t0 = chunk->prefix_tokens;
    if ((m & KVB_PLAN_CHUNK_END) && chunk->end_tokens < t1)
        t1 = chunk->end_tokens;
    kvb_status_t st =
        check_indices("src", "pages", rs->sp, chunk->num_pages, plan->src_kv_pool, &rs->smax);
    if (st == KVB_OK)
        st = check_indices("dst", "pages", rs->dp, dn, plan->dst_kv_pool, &rs->dmax);
    if (st != KVB_OK)
        return st;
    rs->t0 = t0;
    rs->t1 = t1 > t0 ? t1 : t0;
    pr->pages.smax = rs->smax;
    pr->pages.dmax = rs->dmax;
    if (rs->t0 == rs->t1)
        return KVB_OK;
    uint64_t dlo = rs->t0 / Pd, dhi = (rs->t1 - 1) / Pd;
    if (dlo < rs->dfirst || dhi - rs->dfirst >= dn)
        return kvb__plan_fail("chunk: rows [%llu, %llu) reach decode pages %llu..%llu; dst_pages "
                              "hold %zu pages from %llu",
                              (unsigned long long)rs->t0, (unsigned long long)rs->t1,
                              (unsigned long long)dlo, (unsigned long long)dhi, dn,
                              (unsigned long long)rs->dfirst);
    pr->aligned = Ps == Pd && rs->t0 % Ps == 0 && rs->t1 % Ps == 0;
    if (pr->aligned) {
        item_set_t *is = &pr->pages;
        is->sp = rs->sp + (rs->t0 / Ps - rs->sfirst);
        is->dp = rs->dp + (rs->t0 / Pd - rs->dfirst);
        is->n = (size_t)((rs->t1 - rs->t0) / Ps);
        is->runs = count_runs(is->sp, is->dp, is->n);
    }
    return KVB_OK;
}

/* State items: the last PP stage sends them when the chunk names some. */
static kvb_status_t prep_state(kvb_plan_h plan, const kvb_plan_chunk_t *chunk, chunk_prep_t *pr)
{
    pr->with_state = pr->last_stage && (chunk->field_mask & KVB_PLAN_CHUNK_STATE) &&
                     chunk->num_state_indices > 0 && plan->num_state > 0;
    if (!pr->with_state)
        return KVB_OK;
    if (chunk->src_state == NULL || chunk->dst_state == NULL)
        return kvb__plan_fail("chunk: num_state_indices=%zu but src_state or dst_state is NULL",
                              chunk->num_state_indices);
    return prep_items("state", chunk->src_state, chunk->dst_state, chunk->num_state_indices,
                      plan->src_state_pool, plan->dst_state_pool, &pr->state);
}

/* One aux index, checked against its pool and int32_t. */
static kvb_status_t aux_index(const char *w, int64_t a, uint64_t pool, int32_t *idx_p)
{
    if (a < 0 || a > INT32_MAX || (pool && (uint64_t)a >= pool))
        return kvb__plan_fail("chunk: %s=%lld outside the pool of %llu items", w, (long long)a,
                              (unsigned long long)pool);
    *idx_p = (int32_t)a;
    return KVB_OK;
}

static kvb_status_t prep_chunk(kvb_plan_h plan, const kvb_plan_chunk_t *chunk, chunk_prep_t *pr)
{
    memset(pr, 0, sizeof(*pr));
    pr->last_stage = plan->pp_rank + 1 == plan->pp_size;
    kvb_status_t st = prep_pages(plan, chunk, pr);
    if (st == KVB_OK)
        st = prep_state(plan, chunk, pr);
    pr->with_aux = pr->last_stage && (chunk->field_mask & KVB_PLAN_CHUNK_AUX) && plan->num_aux > 0;
    if (st == KVB_OK && pr->with_aux)
        st = aux_index("src_aux_index", chunk->src_aux_index, plan->src_aux_pool, &pr->aux_s);
    if (st == KVB_OK && pr->with_aux)
        st = aux_index("dst_aux_index", chunk->dst_aux_index, plan->dst_aux_pool, &pr->aux_d);
    pr->aux = (item_set_t){&pr->aux_s, &pr->aux_d, 1, 1, (uint64_t)pr->aux_s, (uint64_t)pr->aux_d};
    return st;
}

/* Buffers of the job's kind: nbuf bases from index si of src and di of dst
 * (arrays a layout lacks may be NULL, unless this call needs them). */
static kvb_status_t job_bases(emit_job_t *j, const uint64_t *sarr, size_t si, const uint64_t *darr,
                              size_t di, uint32_t nbuf)
{
    if (sarr == NULL || darr == NULL)
        return kvb__plan_fail("%s: %s base address array is NULL", kvb_plan_buffer_name(j->c->kind),
                              sarr == NULL ? "prefill" : "decode");
    j->sb = sarr + si;
    j->db = darr + di;
    j->nbuf = nbuf;
    return KVB_OK;
}

/* Fill *j for class c; j->nbuf stays 0 when this call sends nothing of it. */
static kvb_status_t build_job(kvb_plan_h plan, const kvb__plan_class_t *c,
                              const kvb_plan_buffers_t *src, const kvb_plan_buffers_t *dst,
                              const chunk_prep_t *pr, emit_job_t *j)
{
    j->c = c;
    j->is = c->kind == KVB_PLAN_BUF_STATE ? pr->state
            : c->kind == KVB_PLAN_BUF_AUX ? pr->aux
                                          : pr->pages;
    switch (c->kind) {
    case KVB_PLAN_BUF_K:
    case KVB_PLAN_BUF_LATENT:
        return job_bases(j, src->kv, 0, dst->kv, plan->start_layer, plan->stage_layers);
    case KVB_PLAN_BUF_V:
        return job_bases(j, src->kv, plan->stage_layers, dst->kv,
                         (size_t)plan->num_layers + plan->start_layer, plan->stage_layers);
    case KVB_PLAN_BUF_DRAFT_K:
    case KVB_PLAN_BUF_DRAFT_V: {
        size_t off = c->kind == KVB_PLAN_BUF_DRAFT_V ? plan->draft_layers : 0;
        if (!pr->last_stage)
            return KVB_OK;
        return job_bases(j, src->draft, off, dst->draft, off, plan->draft_layers);
    }
    case KVB_PLAN_BUF_STATE:
        if (!pr->with_state)
            return KVB_OK;
        return job_bases(j, src->state, c->index, dst->state, c->index, 1);
    case KVB_PLAN_BUF_AUX:
        if (!pr->with_aux)
            return KVB_OK;
        return job_bases(j, src->aux, c->index, dst->aux, c->index, 1);
    }
    return KVB_OK;
}

/* Bytes of a job: every row of every item of every buffer carries `bytes`. */
static uint64_t job_bytes(const emit_job_t *j)
{
    return (uint64_t)j->is.n * j->c->rows * j->bytes * j->nbuf;
}

static bool paged(const kvb__plan_class_t *c)
{
    return c->kind != KVB_PLAN_BUF_STATE && c->kind != KVB_PLAN_BUF_AUX;
}

/* A paged job goes through the row mapping unless whole pages line up on
 * both sides: aligned rows, one order, and NHD or whole rows (an HND head
 * slice is not a run of token rows). */
static bool job_by_rows(const chunk_prep_t *pr, const emit_job_t *j)
{
    const kvb__plan_class_t *c = j->c;
    if (!paged(c))
        return false;
    if (!pr->aligned || c->src_order != c->dst_order)
        return true;
    return c->src_order == KVB_PLAN_ORDER_HND && !job_whole(j);
}

/* One job by the row mapping: addresses checked as for whole pages. */
static kvb_status_t emit_job_rows(const plan_sink_t *sk, const chunk_prep_t *pr, emit_job_t *j,
                                  uint64_t *bytes_p)
{
    uint64_t unused;
    j->is.smax = pr->rows.smax;
    j->is.dmax = pr->rows.dmax;
    kvb_status_t st = job_check(j, 0, &unused);
    if (st == KVB_OK)
        st = emit_rows(sk->put, sk->out, sk->count, j, &pr->rows);
    *bytes_p = (pr->rows.t1 - pr->rows.t0) * j->bytes * j->nbuf;
    return st;
}

/* Validate, then emit every class's job; on error the container's count and
 * bytes are restored (blocks past them may have been written). */
static kvb_status_t plan_chunk(const char *fn, kvb_plan_h plan, uint32_t p, uint32_t d,
                               const kvb_plan_buffers_t *src, const kvb_plan_buffers_t *dst,
                               const kvb_plan_chunk_t *chunk, const plan_sink_t *sk)
{
    chunk_prep_t pr;
    kvb_status_t st = check_args(fn, plan, p, d, src, dst, chunk, sk->out);
    if (st == KVB_OK)
        st = prep_chunk(plan, chunk, &pr);
    if (st != KVB_OK)
        return st;
    size_t count0 = *sk->count;
    uint64_t bytes0 = *sk->bytes;
    for (size_t k = 0; k < plan->num_classes && st == KVB_OK; k++) {
        const kvb__plan_class_t *c = &plan->classes[k];
        emit_job_t j = {.c = c};
        uint64_t so, dof, bytes;
        if (!kvb__plan_pair_fragment(plan, c, p, d, &so, &dof, &bytes))
            continue;
        st = build_job(plan, c, src, dst, &pr, &j);
        if (st != KVB_OK || j.nbuf == 0)
            continue;
        j.soff = so;
        j.doff = dof;
        j.bytes = bytes;
        if (job_by_rows(&pr, &j)) {
            if (pr.rows.t0 < pr.rows.t1 && (st = emit_job_rows(sk, &pr, &j, &bytes)) == KVB_OK)
                *sk->bytes += bytes;
            continue;
        }
        if (j.is.n == 0)
            continue;
        if ((st = sk->emit(sk->out, count0, &j)) == KVB_OK)
            *sk->bytes += job_bytes(&j);
    }
    if (st != KVB_OK) {
        *sk->count = count0;
        *sk->bytes = bytes0;
    }
    return st;
}

kvb_status_t kvb_plan_blocks(kvb_plan_h plan, uint32_t prefill_rank, uint32_t decode_rank,
                             const kvb_plan_buffers_t *src, const kvb_plan_buffers_t *dst,
                             const kvb_plan_chunk_t *chunk, kvb_plan_blocks_t *out)
{
    plan_sink_t sk = {emit_plain, put_plain, out, out ? &out->count : NULL,
                      out ? &out->bytes : NULL};
    return plan_chunk("kvb_plan_blocks", plan, prefill_rank, decode_rank, src, dst, chunk, &sk);
}

kvb_status_t kvb_plan_strided_blocks(kvb_plan_h plan, uint32_t prefill_rank, uint32_t decode_rank,
                                     const kvb_plan_buffers_t *src, const kvb_plan_buffers_t *dst,
                                     const kvb_plan_chunk_t *chunk, kvb_plan_strided_t *out)
{
    plan_sink_t sk = {emit_strided, put_strided_piece, out, out ? &out->count : NULL,
                      out ? &out->bytes : NULL};
    return plan_chunk("kvb_plan_strided_blocks", plan, prefill_rank, decode_rank, src, dst, chunk,
                      &sk);
}
