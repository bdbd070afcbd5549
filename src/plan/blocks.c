/* Transfer planner, hot path: fragments × pages × rows × layers → blocks.
 * Every index and address is checked once per call so the inner loops run
 * without checks; capacity is reserved per buffer kind for the same reason. */
#include "plan_int.h"

#include <stddef.h>
#include <stdlib.h>
#include <string.h>

void kvb_plan_blocks_init(kvb_plan_blocks_t *out)
{
    memset(out, 0, sizeof(*out));
}

void kvb_plan_blocks_free(kvb_plan_blocks_t *out)
{
    if (out == NULL)
        return;
    if (!out->fixed)
        free(out->blocks);
    memset(out, 0, sizeof(*out));
}

static kvb_status_t reserve(kvb_plan_blocks_t *out, uint64_t more)
{
    uint64_t need;
    if (!kvb__add_u64(out->count, more, &need) || need > SIZE_MAX / sizeof(kvb_block_t))
        return kvb__plan_fail("blocks: %llu more blocks overflow the array size",
                              (unsigned long long)more);
    if (need <= out->capacity)
        return KVB_OK;
    if (out->fixed)
        return kvb__plan_fail("blocks: fixed array capacity=%zu, need at least %llu", out->capacity,
                              (unsigned long long)need);
    size_t cap = out->capacity ? out->capacity : 256;
    while (cap < need)
        cap = cap > SIZE_MAX / 2 / sizeof(kvb_block_t) ? (size_t)need : cap * 2;
    kvb_block_t *nb = realloc(out->blocks, cap * sizeof(kvb_block_t));
    if (nb == NULL)
        return KVB_ERR_NOMEM;
    out->blocks = nb;
    out->capacity = cap;
    return KVB_OK;
}

/* Check that indices lie in [0, pool) (pool 0: only non-negative) and return
 * the largest. */
static kvb_status_t check_indices(const char *what, const int32_t *idx, size_t n, uint64_t pool,
                                  uint64_t *max_p)
{
    int32_t mx = 0, mn = 0;
    for (size_t i = 0; i < n; i++) {
        mx = idx[i] > mx ? idx[i] : mx;
        mn = idx[i] < mn ? idx[i] : mn;
    }
    if (mn < 0 || (pool != 0 && (uint64_t)mx >= pool)) {
        for (size_t i = 0; i < n; i++)
            if (idx[i] < 0 || (pool != 0 && (uint64_t)idx[i] >= pool))
                return kvb__plan_fail("%s[%zu]=%d outside the pool of %llu items", what, i,
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

typedef struct emit_job {
    const kvb__plan_class_t *c;
    const uint64_t *sb, *db; /* base address per buffer */
    uint32_t nbuf;
    const int32_t *sp, *dp; /* item indices */
    size_t n;
    uint64_t smax, dmax;
    uint64_t soff, doff, bytes;
} emit_job_t;

static kvb_status_t emit(kvb_plan_blocks_t *out, size_t floor, const emit_job_t *j)
{
    const kvb__plan_class_t *c = j->c;
    const char *kind = kvb_plan_buffer_name(c->kind);
    kvb_status_t st;
    if (j->n == 0 || j->nbuf == 0)
        return KVB_OK;
    for (uint32_t b = 0; b < j->nbuf; b++) {
        if ((st = check_span(kind, "prefill", j->sb[b], j->smax, c->src_item)) != KVB_OK ||
            (st = check_span(kind, "decode", j->db[b], j->dmax, c->dst_item)) != KVB_OK)
            return st;
    }
    bool whole = j->bytes == c->src_row && j->bytes == c->dst_row;
    uint64_t per_buf = whole ? j->n : (uint64_t)j->n * c->rows, total;
    if (!kvb__mul_u64(per_buf, j->nbuf, &total))
        return kvb__plan_fail("%s: block count overflows", kind);
    if ((st = reserve(out, total)) != KVB_OK)
        return st;
    kvb_block_t *o = out->blocks + out->count;
    kvb_block_t *const start = o;
    uint64_t sitem = c->src_item, ditem = c->dst_item, bytes = j->bytes;
    if (whole) {
        /* Runs of pages consecutive on both sides become one block; a block
         * that continues the previous one on both sides (adjacent buffers)
         * is folded into it too. */
        for (uint32_t b = 0; b < j->nbuf; b++) {
            uint64_t sb = j->sb[b], db = j->db[b];
            size_t k = 0;
            while (k < j->n) {
                size_t e = k + 1;
                while (e < j->n && j->sp[e] == j->sp[e - 1] + 1 && j->dp[e] == j->dp[e - 1] + 1)
                    e++;
                uint64_t s = sb + (uint64_t)j->sp[k] * sitem, d = db + (uint64_t)j->dp[k] * ditem;
                uint64_t len = (uint64_t)(e - k) * sitem;
                /* only blocks of this call merge, so an error can restore out */
                kvb_block_t *prev = o - out->blocks > (ptrdiff_t)floor ? o - 1 : NULL;
                if (prev != NULL && prev->src + prev->len == s && prev->dst + prev->len == d) {
                    prev->len += len;
                } else {
                    o->src = s;
                    o->dst = d;
                    o->len = len;
                    o++;
                }
                k = e;
            }
        }
    } else {
        uint64_t srow = c->src_row, drow = c->dst_row, rows = c->rows;
        for (uint32_t b = 0; b < j->nbuf; b++) {
            uint64_t sb = j->sb[b] + j->soff, db = j->db[b] + j->doff;
            for (size_t k = 0; k < j->n; k++) {
                uint64_t s = sb + (uint64_t)j->sp[k] * sitem, d = db + (uint64_t)j->dp[k] * ditem;
                for (uint64_t r = 0; r < rows; r++) {
                    o[r].src = s + r * srow;
                    o[r].dst = d + r * drow;
                    o[r].len = bytes;
                }
                o += rows;
            }
        }
    }
    uint64_t added = (uint64_t)(o - start);
    out->count += (size_t)added;
    /* Bytes: every row of every item of every buffer carries `bytes`. */
    out->bytes += (uint64_t)j->n * c->rows * bytes * j->nbuf;
    return KVB_OK;
}

kvb_status_t kvb_plan_blocks(kvb_plan_h plan, uint32_t prefill_rank, uint32_t decode_rank,
                             const kvb_plan_buffers_t *src, const kvb_plan_buffers_t *dst,
                             const kvb_plan_chunk_t *chunk, kvb_plan_blocks_t *out)
{
    if (plan == NULL || src == NULL || dst == NULL || chunk == NULL || out == NULL)
        return kvb__plan_fail("kvb_plan_blocks: NULL argument");
    if (prefill_rank >= plan->ptp)
        return kvb__plan_fail("prefill_rank=%u not below prefill tp_size=%u", prefill_rank,
                              plan->ptp);
    if (decode_rank >= plan->dtp)
        return kvb__plan_fail("decode_rank=%u not below decode tp_size=%u", decode_rank, plan->dtp);
    if (chunk->num_pages > 0 && (chunk->src_pages == NULL || chunk->dst_pages == NULL))
        return kvb__plan_fail("chunk: num_pages=%zu but src_pages or dst_pages is NULL",
                              chunk->num_pages);
    size_t count0 = out->count;
    uint64_t bytes0 = out->bytes;
    kvb_status_t st;

    /* Pages already on the decode (its prefix) are skipped. */
    size_t skip = 0;
    if (chunk->field_mask & KVB_PLAN_CHUNK_PREFIX) {
        if (chunk->prefix_tokens % plan->page_size != 0)
            return kvb__plan_fail("chunk: prefix_tokens=%llu is not a multiple of page_size=%u",
                                  (unsigned long long)chunk->prefix_tokens, plan->page_size);
        uint64_t prefix_pages = chunk->prefix_tokens / plan->page_size;
        if (prefix_pages > chunk->first_page) {
            uint64_t s = prefix_pages - chunk->first_page;
            skip = s > chunk->num_pages ? chunk->num_pages : (size_t)s;
        }
    }
    uint64_t smax = 0, dmax = 0;
    if ((st = check_indices("src_pages", chunk->src_pages, chunk->num_pages, plan->src_kv_pool,
                            &smax)) != KVB_OK ||
        (st = check_indices("dst_pages", chunk->dst_pages, chunk->num_pages, plan->dst_kv_pool,
                            &dmax)) != KVB_OK)
        return st;
    bool last_stage = plan->pp_rank + 1 == plan->pp_size;
    bool with_state = last_stage && (chunk->field_mask & KVB_PLAN_CHUNK_STATE) &&
                      chunk->num_state_indices > 0 && plan->num_state > 0;
    uint64_t ssmax = 0, dsmax = 0;
    if (with_state) {
        if (chunk->src_state == NULL || chunk->dst_state == NULL)
            return kvb__plan_fail("chunk: num_state_indices=%zu but src_state or dst_state is "
                                  "NULL",
                                  chunk->num_state_indices);
        if ((st = check_indices("src_state", chunk->src_state, chunk->num_state_indices,
                                plan->src_state_pool, &ssmax)) != KVB_OK ||
            (st = check_indices("dst_state", chunk->dst_state, chunk->num_state_indices,
                                plan->dst_state_pool, &dsmax)) != KVB_OK)
            return st;
    }
    bool with_aux = last_stage && (chunk->field_mask & KVB_PLAN_CHUNK_AUX) && plan->num_aux > 0;
    int32_t aux_s = 0, aux_d = 0;
    if (with_aux) {
        int64_t a = chunk->src_aux_index, b = chunk->dst_aux_index;
        if (a < 0 || a > INT32_MAX || (plan->src_aux_pool && (uint64_t)a >= plan->src_aux_pool))
            return kvb__plan_fail("chunk: src_aux_index=%lld outside the pool of %llu items",
                                  (long long)a, (unsigned long long)plan->src_aux_pool);
        if (b < 0 || b > INT32_MAX || (plan->dst_aux_pool && (uint64_t)b >= plan->dst_aux_pool))
            return kvb__plan_fail("chunk: dst_aux_index=%lld outside the pool of %llu items",
                                  (long long)b, (unsigned long long)plan->dst_aux_pool);
        aux_s = (int32_t)a;
        aux_d = (int32_t)b;
    }

    for (size_t k = 0; k < plan->num_classes; k++) {
        const kvb__plan_class_t *c = &plan->classes[k];
        emit_job_t j = {.c = c};
        if (!kvb__plan_pair_fragment(plan, c, prefill_rank, decode_rank, &j.soff, &j.doff,
                                     &j.bytes))
            continue;
        const uint64_t *sarr = NULL, *darr = NULL;
        switch (c->kind) {
        case KVB_PLAN_BUF_K:
        case KVB_PLAN_BUF_LATENT:
        case KVB_PLAN_BUF_V: {
            bool v = c->kind == KVB_PLAN_BUF_V;
            sarr = src->kv;
            darr = dst->kv;
            if (sarr == NULL || darr == NULL)
                goto missing;
            j.sb = sarr + (v ? plan->stage_layers : 0);
            j.db = darr + (v ? plan->num_layers : 0) + plan->start_layer;
            j.nbuf = plan->stage_layers;
            j.sp = chunk->src_pages + skip;
            j.dp = chunk->dst_pages + skip;
            j.n = chunk->num_pages - skip;
            j.smax = smax;
            j.dmax = dmax;
            break;
        }
        case KVB_PLAN_BUF_DRAFT_K:
        case KVB_PLAN_BUF_DRAFT_V: {
            if (!last_stage)
                continue;
            bool v = c->kind == KVB_PLAN_BUF_DRAFT_V;
            sarr = src->draft;
            darr = dst->draft;
            if (sarr == NULL || darr == NULL)
                goto missing;
            j.sb = sarr + (v ? plan->draft_layers : 0);
            j.db = darr + (v ? plan->draft_layers : 0);
            j.nbuf = plan->draft_layers;
            j.sp = chunk->src_pages + skip;
            j.dp = chunk->dst_pages + skip;
            j.n = chunk->num_pages - skip;
            j.smax = smax;
            j.dmax = dmax;
            break;
        }
        case KVB_PLAN_BUF_STATE:
            if (!with_state)
                continue;
            sarr = src->state;
            darr = dst->state;
            if (sarr == NULL || darr == NULL)
                goto missing;
            j.sb = sarr + c->index;
            j.db = darr + c->index;
            j.nbuf = 1;
            j.sp = chunk->src_state;
            j.dp = chunk->dst_state;
            j.n = chunk->num_state_indices;
            j.smax = ssmax;
            j.dmax = dsmax;
            break;
        case KVB_PLAN_BUF_AUX:
            if (!with_aux)
                continue;
            sarr = src->aux;
            darr = dst->aux;
            if (sarr == NULL || darr == NULL)
                goto missing;
            j.sb = sarr + c->index;
            j.db = darr + c->index;
            j.nbuf = 1;
            j.sp = &aux_s;
            j.dp = &aux_d;
            j.n = 1;
            j.smax = (uint64_t)aux_s;
            j.dmax = (uint64_t)aux_d;
            break;
        }
        if ((st = emit(out, count0, &j)) != KVB_OK)
            goto restore;
        continue;
    missing:
        st = kvb__plan_fail("%s: %s base address array is NULL", kvb_plan_buffer_name(c->kind),
                            sarr == NULL ? "prefill" : "decode");
        goto restore;
    }
    return KVB_OK;

restore:
    out->count = count0;
    out->bytes = bytes0;
    return st;
}
