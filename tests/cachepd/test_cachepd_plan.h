/* The "plan" golden files of test_cachepd_codec.c (included there: it uses
 * that file's helpers): TokenSpeed 0.1.1's decode routes, prefill
 * registrations and copy lists against kvbridge's planner. */
#ifndef TEST_CACHEPD_PLAN_H
#define TEST_CACHEPD_PLAN_H

typedef struct span {
    uint64_t src, dst, len;
} span_t;

typedef struct spans {
    span_t *v;
    size_t n, cap;
} spans_t;

static void span_add(spans_t *s, uint64_t src, uint64_t dst, uint64_t len)
{
    if (s->n == s->cap) {
        s->cap = s->cap ? 2 * s->cap : 1024;
        s->v = realloc(s->v, s->cap * sizeof(span_t));
    }
    s->v[s->n++] = (span_t){src, dst, len};
}

static uint64_t ju(json_t *a, size_t i)
{
    return (uint64_t)json_integer_value(json_array_get(a, i));
}

/* TokenSpeed's copy items in yield order; a pages x fields grid field by
 * field (the order inside one batch_transfer_sync_write_pages call is
 * Mooncake's business; kvbridge emits it field-major). */
static void ts_spans(json_t *items, spans_t *out)
{
    size_t i, f, k;
    json_t *it, *row;
    json_array_foreach(items, i, it)
    {
        json_t *pg = json_object_get(it, "pages"), *sp = json_object_get(it, "span");
        json_t *pk = json_object_get(it, "packed");
        if (pg != NULL) {
            json_t *src = json_object_get(pg, "src_pages"), *dst = json_object_get(pg, "dst_pages");
            json_array_foreach(json_object_get(pg, "fields"), f, row)
            {
                for (k = 0; k < json_array_size(src); k++)
                    span_add(out, ju(row, 0) + ju(src, k) * ju(row, 1),
                             ju(row, 2) + ju(dst, k) * ju(row, 3), ju(row, 4));
            }
        } else if (sp != NULL) {
            span_add(out, ju(sp, 0), ju(sp, 1), ju(sp, 2));
        } else {
            for (k = 0; k < ju(pk, 4); k++)
                span_add(out, ju(pk, 0) + k * ju(pk, 3), ju(pk, 1) + k * ju(pk, 2), ju(pk, 2));
        }
    }
}

static void kvb_spans(const kvb_plan_strided_t *b, spans_t *out)
{
    for (size_t i = 0; i < b->count; i++) {
        const kvb_strided_block_t *x = &b->blocks[i];
        for (uint64_t r = 0; r < x->count; r++)
            span_add(out, x->src + r * x->src_stride, x->dst + r * x->dst_stride, x->len);
    }
}

static void check_frags(const kvb__cpd_contract_t *p, const kvb__cpd_frag_t *fr, uint32_t n,
                        json_t *want, const char *where)
{
    if (json_array_size(want) != n)
        FAILF("%s: %u fragments, TokenSpeed %zu", where, n, json_array_size(want));
    for (uint32_t i = 0; i < n; i++) {
        json_t *w = json_array_get(want, i);
        const kvb__cpd_frag_t *f = &fr[i];
        if (strcmp(p->specs[f->spec].group_id, jstr(w, "group_id")) != 0 ||
            strcmp(p->fields[f->pfield].field_id, jstr(w, "field_id")) != 0 ||
            (long long)f->src_off != jint(w, "src_byte_offset") ||
            (long long)f->dst_off != jint(w, "dst_byte_offset") ||
            (long long)f->src_row_stride != jint(w, "src_row_stride_bytes") ||
            (long long)f->dst_row_stride != jint(w, "dst_row_stride_bytes") ||
            (long long)f->bytes_per_row != jint(w, "bytes_per_row") ||
            (long long)f->rows_per_page != jint(w, "rows_per_page"))
            FAILF("%s: fragment %u differs from TokenSpeed's (%s %s)", where, i,
                  p->fields[f->pfield].field_id, jstr(w, "field_id"));
    }
}

static void check_owners(const kvb__cpd_contract_t *p, const kvb__cpd_owner_t *own, json_t *want,
                         const char *where)
{
    size_t sharded = 0;
    for (uint32_t s = 0; s < p->nspecs; s++) {
        if (p->specs[s].shard_count == 1)
            continue;
        sharded++;
        json_t *w = json_object_get(want, p->specs[s].group_id);
        bool none = own == NULL || own[s].owner_count == 0;
        if (json_is_null(w) != none ||
            (!none && (own[s].owner_rank != ju(w, 0) || own[s].owner_count != ju(w, 1))))
            FAILF("%s: owner filter of %s differs", where, p->specs[s].group_id);
    }
    if (json_object_size(want) != sharded)
        FAILF("%s: TokenSpeed names %zu sharded groups, kvbridge %zu", where,
              json_object_size(want), sharded);
}

static void check_decode_route(const kvb__cpd_pair_t *pair, json_t *dr)
{
    kvb__cpd_route_t r;
    kvb__frames_err_t e;
    char where[64];
    uint32_t d = (uint32_t)jint(dr, "decode_rank");
    snprintf(where, sizeof(where), "decode rank %u", d);
    if (kvb__cpd_plan_decode(pair, d, &e, &r) != KVB_OK)
        FAILF("%s: refused: %s", where, e.reason);
    json_t *srcs = json_object_get(dr, "sources"), *dums = json_object_get(dr, "dummies");
    json_t *tgts = json_object_get(dr, "targets");
    if (r.nsources != json_array_size(srcs) || r.ndummies != json_array_size(dums) ||
        r.nsources + r.ndummies != json_array_size(tgts))
        FAILF("%s: %u sources %u dummies", where, r.nsources, r.ndummies);
    for (uint32_t i = 0; i < r.ndummies; i++)
        if (r.dummies[i] != ju(dums, i))
            FAILF("%s: dummy %u", where, i);
    for (uint32_t i = 0; i < r.nsources; i++) {
        json_t *w = json_array_get(srcs, i);
        if (r.sources[i].prefill_rank != jint(w, "prefill_rank"))
            FAILF("%s: source %u is rank %u", where, i, r.sources[i].prefill_rank);
        check_frags(pair->prefill, r.sources[i].frags, r.sources[i].nfrags,
                    json_object_get(w, "fragments"), where);
        check_owners(pair->prefill, r.sources[i].owners, json_object_get(w, "owners"), where);
    }
    kvb__cpd_route_free(&r);
}

static void check_registration(const kvb__cpd_pair_t *pair, json_t *rg)
{
    kvb__cpd_route_t r;
    kvb__frames_err_t e;
    char where[96];
    uint32_t s = (uint32_t)jint(rg, "stage"), p = (uint32_t)jint(rg, "prefill_rank");
    uint32_t d = (uint32_t)jint(rg, "decode_rank");
    snprintf(where, sizeof(where), "registration stage %u prefill %u decode %u", s, p, d);
    kvb_status_t st = kvb__cpd_plan_registration(pair, s, p, d, &e, &r);
    json_t *err = json_object_get(rg, "error");
    if (err != NULL) {
        expect_refusal(st, &e, json_string_value(err), where);
        return;
    }
    if (st != KVB_OK)
        FAILF("%s: refused: %s", where, e.reason);
    json_t *exp = json_object_get(rg, "expected");
    if (r.dummy != json_is_true(json_object_get(rg, "dummy")) ||
        r.nexpected != json_array_size(exp))
        FAILF("%s: dummy %d, %u expected", where, r.dummy, r.nexpected);
    for (uint32_t i = 0; i < r.nexpected; i++)
        if (r.expected[i] != ju(exp, i))
            FAILF("%s: expected decode rank %u", where, i);
    if (!r.dummy) {
        if (r.nsources != 1 || r.sources[0].whole != json_is_true(json_object_get(rg, "whole")))
            FAILF("%s: route shape", where);
        check_frags(pair->prefill, r.sources[0].frags, r.sources[0].nfrags,
                    json_object_get(rg, "fragments"), where);
    }
    check_owners(pair->prefill, r.dummy ? NULL : r.sources[0].owners, json_object_get(rg, "owners"),
                 where);
    kvb__cpd_route_free(&r);
}

/* Per group of the manifest JSON: its ids as int64 arrays. */
static int64_t **manifest_ids(json_t *m, size_t *counts)
{
    json_t *gs = json_object_get(m, "groups"), *g;
    size_t i;
    int64_t **ids = calloc(json_array_size(gs) + 1, sizeof(int64_t *));
    json_array_foreach(gs, i, g)
    {
        json_t *b = json_object_get(g, "block_ids");
        ids[i] = malloc((json_array_size(b) + 1) * sizeof(int64_t));
        counts[i] = json_array_size(b);
        for (size_t k = 0; k < counts[i]; k++)
            ids[i][k] = (int64_t)ju(b, k);
    }
    return ids;
}

static void check_copy(const kvb__cpd_pair_t *pair, const kvb__cpd_contract_t *local, json_t *in,
                       json_t *cw)
{
    kvb__cpd_route_t r;
    kvb__frames_err_t e;
    char where[96];
    uint32_t s = (uint32_t)jint(cw, "stage"), p = (uint32_t)jint(cw, "prefill_rank");
    uint32_t d = (uint32_t)jint(cw, "decode_rank");
    json_t *fields = json_object_get(cw, "fields");
    snprintf(where, sizeof(where), "copy stage %u prefill %u decode %u%s", s, p, d,
             json_is_null(fields) ? "" : " (layerwise step)");
    if (kvb__cpd_plan_registration(pair, s, p, d, &e, &r) != KVB_OK || r.dummy)
        FAILF("%s: no route", where);
    size_t ns[KVB__CPD_MAX_GROUPS], nd[KVB__CPD_MAX_GROUPS];
    int64_t **src = manifest_ids(json_object_get(in, "src_manifest"), ns);
    int64_t **dst = manifest_ids(json_object_get(in, "dst_manifest"), nd);
    kvb__cpd_copy_group_t groups[KVB__CPD_MAX_GROUPS];
    for (uint32_t g = 0; g < local->nspecs; g++)
        groups[g] = (kvb__cpd_copy_group_t){src[g], dst[g], ns[g]};
    bool *mask = NULL;
    if (!json_is_null(fields)) {
        mask = calloc(local->nfields + 1, sizeof(bool));
        for (size_t k = 0; k < json_array_size(fields); k++)
            mask[kvb__cpd_field_index(local, json_string_value(json_array_get(fields, k)))] = true;
    }
    kvb__cpd_copy_t cp = {&r.sources[0],
                          pair->prefill,
                          local,
                          pair->decode,
                          (uint64_t)jint(cw, "src_slab"),
                          (uint64_t)jint(cw, "dst_slab"),
                          groups,
                          mask,
                          NULL};
    kvb_plan_strided_t out;
    kvb_plan_strided_init(&out);
    if (kvb__cpd_plan_copy(&cp, &e, &out) != KVB_OK)
        FAILF("%s: refused: %s", where, e.reason);
    spans_t a = {0}, b = {0};
    ts_spans(json_object_get(cw, "items"), &a);
    kvb_spans(&out, &b);
    if (a.n != b.n)
        FAILF("%s: %zu spans, TokenSpeed %zu (%zu blocks)", where, b.n, a.n, out.count);
    for (size_t i = 0; i < a.n; i++)
        if (a.v[i].src != b.v[i].src || a.v[i].dst != b.v[i].dst || a.v[i].len != b.v[i].len)
            FAILF("%s: span %zu (%llx -> %llx, %llu) vs TokenSpeed (%llx -> %llx, %llu)", where, i,
                  (unsigned long long)b.v[i].src, (unsigned long long)b.v[i].dst,
                  (unsigned long long)b.v[i].len, (unsigned long long)a.v[i].src,
                  (unsigned long long)a.v[i].dst, (unsigned long long)a.v[i].len);
    /* strided, not per row: never more blocks than TokenSpeed's descriptors */
    if (out.count > a.n || (a.n > 64 && out.count * 4 > a.n))
        FAILF("%s: %zu blocks for %zu spans: not strided", where, out.count, a.n);
    /* a bad destination id is refused, out unchanged */
    int64_t keep = dst[0][0];
    size_t before = out.count;
    dst[0][0] = 0;
    expect_refusal(kvb__cpd_plan_copy(&cp, &e, &out), &e, "out of bounds", "copy to page 0");
    if (out.count != before)
        FAILF("%s: refused copy changed the output", where);
    dst[0][0] = keep;
    for (uint32_t g = 0; g < local->nspecs; g++) {
        free(src[g]);
        free(dst[g]);
    }
    free(src);
    free(dst);
    free(mask);
    free(a.v);
    free(b.v);
    kvb_plan_strided_free(&out);
    kvb__cpd_route_free(&r);
}

/* build_cache_layerwise_block_selection's destination positions per group
 * for one chunk. */
static void check_layerwise(const kvb__cpd_contract_t *c, json_t *m, json_t *lw)
{
    json_t *pos = json_object_get(lw, "positions");
    int64_t lo = jint(lw, "chunk_start"), hi = jint(lw, "chunk_end");
    for (uint32_t s = 0; s < c->nspecs; s++) {
        uint64_t first, n;
        json_t *want = json_array_get(pos, s);
        if (kvb__cpd_layerwise_positions(c, s, jint(m, "prefix_len"), jint(m, "prompt_len"), lo, hi,
                                         &first, &n) != KVB_OK ||
            n != json_array_size(want) || (n && first != ju(want, 0)))
            FAILF("layerwise chunk [%lld, %lld) group %u: positions %llu+%llu", (long long)lo,
                  (long long)hi, s, (unsigned long long)first, (unsigned long long)n);
        for (uint64_t k = 0; k < n; k++)
            if (ju(want, k) != first + k)
                FAILF("layerwise chunk [%lld, %lld): positions not a run", (long long)lo,
                      (long long)hi);
    }
}

static void build_stages(const kvb__cpd_contract_t *p, json_t *stages, kvb__cpd_stages_t *st)
{
    size_t s, k;
    json_t *stage, *id;
    st->n = (uint32_t)json_array_size(stages);
    st->start = calloc(st->n + 1, sizeof(uint32_t));
    st->idx = calloc(p->nfields + 1, sizeof(uint32_t));
    uint32_t total = 0;
    json_array_foreach(stages, s, stage)
    {
        json_array_foreach(stage, k, id)
        {
            st->idx[total++] = (uint32_t)kvb__cpd_field_index(p, json_string_value(id));
        }
        st->start[s + 1] = total;
    }
}

static void replay_plan(json_t *root)
{
    json_t *in = json_object_get(root, "inputs"), *ex = json_object_get(root, "expect"), *v;
    kvb__cpd_contract_t p, d, locals[KVB__CPD_MAX_STAGES];
    kvb__cpd_stages_t st;
    size_t i;
    load_contract(jstr(in, "prefill_contract"), &p);
    load_contract(jstr(in, "decode_contract"), &d);
    json_t *loc = json_object_get(in, "local_contracts");
    size_t nloc = json_is_array(loc) ? json_array_size(loc) : 0;
    for (i = 0; i < nloc; i++)
        load_contract(json_string_value(json_array_get(loc, i)), &locals[i]);
    build_stages(&p, json_object_get(in, "stages"), &st);
    kvb__cpd_pair_t pair = {&p, &d, &st, (uint32_t)jint(in, "prefill_tp"),
                            (uint32_t)jint(in, "decode_tp")};
    json_array_foreach(json_object_get(ex, "decode_routes"), i, v)
    {
        check_decode_route(&pair, v);
    }
    json_array_foreach(json_object_get(ex, "registrations"), i, v)
    {
        check_registration(&pair, v);
    }
    json_array_foreach(json_object_get(ex, "copies"), i, v)
    {
        size_t s = (size_t)jint(v, "stage");
        check_copy(&pair, nloc ? &locals[s] : &p, in, v);
    }
    json_array_foreach(json_object_get(ex, "layerwise"), i, v)
    {
        check_layerwise(&p, json_object_get(in, "dst_manifest"), v);
    }
    /* Out-of-range and incompatible inputs are refused with TokenSpeed's texts. */
    kvb__cpd_route_t r;
    kvb__frames_err_t e;
    expect_refusal(kvb__cpd_plan_decode(&pair, pair.decode_tp, &e, &r), &e, "out of range",
                   "decode rank out of range");
    kvb__cpd_pair_t bad = pair;
    bad.decode_tp = 3;
    kvb_status_t rc = kvb__cpd_plan_decode(&bad, 0, &e, &r);
    if (rc == KVB_OK)
        kvb__cpd_route_free(&r); /* a model whose extents divide by 3 maps fine */
    else
        expect_refusal(rc, &e, NULL, "decode TP 3");
    for (i = 0; i < nloc; i++)
        kvb__cpd_contract_free(&locals[i]);
    kvb__cpd_stages_free(&st);
    kvb__cpd_contract_free(&p);
    kvb__cpd_contract_free(&d);
}

#endif
