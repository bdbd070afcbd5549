/* Transfer planner: layouts → classes (unit geometry per buffer kind) →
 * routes and fragments. Blocks are in blocks.c. */
#include "plan_int.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static __thread char t_plan_err[KVB_ERRMSG_MAX];

kvb_status_t kvb__plan_fail(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(t_plan_err, sizeof(t_plan_err), fmt, ap);
    va_end(ap);
    KVB_LOGD("plan: %s", t_plan_err);
    return KVB_ERR_INVALID;
}

const char *kvb_plan_last_error(void)
{
    return t_plan_err;
}

const char *kvb_plan_buffer_name(kvb_plan_buffer_t buffer)
{
    switch (buffer) {
    case KVB_PLAN_BUF_K:
        return "k";
    case KVB_PLAN_BUF_V:
        return "v";
    case KVB_PLAN_BUF_LATENT:
        return "latent";
    case KVB_PLAN_BUF_DRAFT_K:
        return "draft_k";
    case KVB_PLAN_BUF_DRAFT_V:
        return "draft_v";
    case KVB_PLAN_BUF_STATE:
        return "state";
    case KVB_PLAN_BUF_AUX:
        return "aux";
    }
    return "?";
}

const char *kvb_plan_order_name(kvb_plan_order_t order)
{
    switch (order) {
    case KVB_PLAN_ORDER_NHD:
        return "nhd";
    case KVB_PLAN_ORDER_HND:
        return "hnd";
    }
    return "?";
}

kvb_status_t kvb_plan_order_parse(const char *text, kvb_plan_order_t *order_p)
{
    if (text == NULL || order_p == NULL)
        return KVB_ERR_INVALID;
    if (strcasecmp(text, "nhd") == 0)
        *order_p = KVB_PLAN_ORDER_NHD;
    else if (strcasecmp(text, "hnd") == 0)
        *order_p = KVB_PLAN_ORDER_HND;
    else
        return KVB_ERR_INVALID;
    return KVB_OK;
}

/* ---- presets ---- */

static const kvb_plan_model_t g_presets[] = {
    {"llama3-8b", KVB_PLAN_MHA, 32, 8, 128, 2},
    {"llama3-70b", KVB_PLAN_MHA, 80, 8, 128, 2},
    {"qwen2.5-7b", KVB_PLAN_MHA, 28, 4, 128, 2},
    {"deepseek-v3", KVB_PLAN_MLA, 61, 1, 512 + 64, 2},
};
static const char *const g_preset_names[] = {"llama3-8b", "llama3-70b", "qwen2.5-7b", "deepseek-v3",
                                             NULL};

kvb_status_t kvb_plan_model_preset(const char *name, kvb_plan_model_t *model_p)
{
    if (name == NULL || model_p == NULL)
        return KVB_ERR_INVALID;
    for (size_t i = 0; i < sizeof(g_presets) / sizeof(g_presets[0]); i++) {
        if (strcmp(name, g_presets[i].name) == 0) {
            *model_p = g_presets[i];
            return KVB_OK;
        }
    }
    return KVB_ERR_NOT_FOUND;
}

const char *const *kvb_plan_model_preset_names(void)
{
    return g_preset_names;
}

void kvb_plan_layout_from_model(const kvb_plan_model_t *model, uint32_t tp_size, uint32_t tp_rank,
                                uint32_t pp_size, uint32_t pp_rank, uint32_t page_size,
                                kvb_plan_layout_t *layout_p)
{
    memset(layout_p, 0, sizeof(*layout_p));
    layout_p->field_mask = KVB_PLAN_LAYOUT_PP;
    layout_p->attn = model->attn;
    layout_p->num_layers = model->num_layers;
    layout_p->tp_size = tp_size;
    layout_p->tp_rank = tp_rank;
    layout_p->page_size = page_size;
    layout_p->kv_heads = model->attn == KVB_PLAN_MLA ? 1 : model->kv_heads;
    layout_p->head_bytes = (uint64_t)model->head_dim * model->dtype_bytes;
    layout_p->pp_size = pp_size;
    layout_p->pp_rank = pp_rank;
    layout_p->dp_size = 1;
}

/* ---- layout checks ---- */

typedef struct side_layout {
    const kvb_plan_layout_t *l;
    const char *who;
    uint32_t pp_size, pp_rank, start, stage, dp_size;
    uint32_t draft_layers, num_state, num_aux;
    uint64_t kv_pool, state_pool, aux_pool;
    kvb_plan_order_t order;
    uint32_t elem;
} side_layout_t;

/* SGLang / vLLM get_pp_indices: layers / pp per stage, the remainder spread
 * one each over the stages just before the last. */
static void default_stage(uint32_t layers, uint32_t pp, uint32_t rank, uint32_t *start_p,
                          uint32_t *n_p)
{
    uint32_t base = layers / pp, rem = layers % pp, start = 0, n = 0;
    for (uint32_t r = 0; r <= rank; r++) {
        n = base + ((rem > 0 && r + 1 + rem >= pp && r + 1 < pp) ? 1 : 0);
        if (r < rank)
            start += n;
    }
    *start_p = start;
    *n_p = n;
}

static kvb_status_t check_side(side_layout_t *s)
{
    const kvb_plan_layout_t *l = s->l;
    const char *w = s->who;
    uint64_t m = l->field_mask;
    if (l->attn != KVB_PLAN_MHA && l->attn != KVB_PLAN_MLA)
        return kvb__plan_fail("%s attn=%d is not MHA (0) or MLA (1)", w, (int)l->attn);
    if (l->num_layers == 0 || l->num_layers > KVB_PLAN_MAX_LAYERS)
        return kvb__plan_fail("%s num_layers=%u outside 1..%u", w, l->num_layers,
                              KVB_PLAN_MAX_LAYERS);
    if (l->tp_size == 0 || l->tp_size > KVB_PLAN_MAX_TP)
        return kvb__plan_fail("%s tp_size=%u outside 1..%u", w, l->tp_size, KVB_PLAN_MAX_TP);
    if (l->tp_rank >= l->tp_size)
        return kvb__plan_fail("%s tp_rank=%u not below tp_size=%u", w, l->tp_rank, l->tp_size);
    if (l->page_size == 0)
        return kvb__plan_fail("%s page_size=0", w);
    s->pp_size = 1;
    s->pp_rank = 0;
    if (m & KVB_PLAN_LAYOUT_PP) {
        s->pp_size = l->pp_size;
        s->pp_rank = l->pp_rank;
        if (s->pp_size == 0 || s->pp_size > l->num_layers)
            return kvb__plan_fail("%s pp_size=%u outside 1..num_layers=%u", w, s->pp_size,
                                  l->num_layers);
        if (s->pp_rank >= s->pp_size)
            return kvb__plan_fail("%s pp_rank=%u not below pp_size=%u", w, s->pp_rank, s->pp_size);
    }
    if (m & KVB_PLAN_LAYOUT_STAGE) {
        s->start = l->start_layer;
        s->stage = l->stage_layers;
        if (s->stage == 0 || (uint64_t)s->start + s->stage > l->num_layers)
            return kvb__plan_fail("%s stage [start_layer=%u, +stage_layers=%u) not inside "
                                  "num_layers=%u",
                                  w, s->start, s->stage, l->num_layers);
    } else {
        default_stage(l->num_layers, s->pp_size, s->pp_rank, &s->start, &s->stage);
    }
    s->dp_size = (m & KVB_PLAN_LAYOUT_DP) ? l->dp_size : 1;
    if (s->dp_size == 0)
        return kvb__plan_fail("%s dp_size=0", w);
    s->draft_layers =
        (m & (KVB_PLAN_LAYOUT_DRAFT | KVB_PLAN_LAYOUT_DRAFT_GEOM)) ? l->draft_layers : 0;
    if (s->draft_layers > KVB_PLAN_MAX_LAYERS)
        return kvb__plan_fail("%s draft_layers=%u above %u", w, s->draft_layers,
                              KVB_PLAN_MAX_LAYERS);
    s->num_state = (m & KVB_PLAN_LAYOUT_STATE) ? l->num_state : 0;
    if (s->num_state > KVB_PLAN_MAX_EXTRA || (s->num_state > 0 && l->state == NULL))
        return kvb__plan_fail("%s num_state=%u above %u or state array missing", w, s->num_state,
                              KVB_PLAN_MAX_EXTRA);
    s->num_aux = (m & KVB_PLAN_LAYOUT_AUX) ? l->num_aux : 0;
    if (s->num_aux > KVB_PLAN_MAX_EXTRA || (s->num_aux > 0 && l->aux_item_lens == NULL))
        return kvb__plan_fail("%s num_aux=%u above %u or aux_item_lens missing", w, s->num_aux,
                              KVB_PLAN_MAX_EXTRA);
    s->order = KVB_PLAN_ORDER_NHD;
    s->elem = 0;
    if (m & KVB_PLAN_LAYOUT_ORDER) {
        s->order = l->kv_order;
        s->elem = l->elem_bytes;
        if (s->order != KVB_PLAN_ORDER_NHD && s->order != KVB_PLAN_ORDER_HND)
            return kvb__plan_fail("%s kv_order=%d is not NHD (0) or HND (1)", w, (int)s->order);
    }
    s->kv_pool = s->state_pool = s->aux_pool = 0;
    if (m & KVB_PLAN_LAYOUT_POOL) {
        s->kv_pool = l->kv_pool_pages;
        s->state_pool = l->state_pool_items;
        s->aux_pool = l->aux_pool_items;
    }
    return KVB_OK;
}

/* ---- unit geometry ---- */

/* One side of one buffer kind before pairing. */
typedef struct side_geom {
    uint64_t item, unit, row, units, hint;
    uint32_t tp;
    kvb_plan_axis_t axis;
} side_geom_t;

/* Head form: kv_heads split over tp (divisor) or replicated (tp multiple). */
static kvb_status_t geom_from_heads(const char *buf, const char *w, uint32_t heads,
                                    uint64_t head_bytes, uint32_t tp, uint32_t rows, bool mla,
                                    side_geom_t *g)
{
    if (head_bytes == 0)
        return kvb__plan_fail("%s: %s head_bytes=0", buf, w);
    g->tp = tp;
    g->unit = head_bytes;
    if (mla) {
        g->units = 1;
        g->hint = 1;
        g->axis = KVB_PLAN_AXIS_REPLICATED;
    } else {
        if (heads == 0)
            return kvb__plan_fail("%s: %s kv_heads=0", buf, w);
        if (tp <= heads && heads % tp != 0)
            return kvb__plan_fail("%s: %s kv_heads=%u cannot be split over tp_size=%u", buf, w,
                                  heads, tp);
        if (tp > heads && tp % heads != 0)
            return kvb__plan_fail("%s: %s tp_size=%u is not a multiple of kv_heads=%u", buf, w, tp,
                                  heads);
        g->units = tp <= heads ? heads / tp : 1;
        g->hint = heads;
        g->axis = KVB_PLAN_AXIS_KV_HEAD;
    }
    if (!kvb__mul_u64(g->units, head_bytes, &g->row) || !kvb__mul_u64(g->row, rows, &g->item))
        return kvb__plan_fail("%s: %s item size overflows (units=%llu head_bytes=%llu rows=%u)",
                              buf, w, (unsigned long long)g->units, (unsigned long long)head_bytes,
                              rows);
    return KVB_OK;
}

static kvb_status_t geom_from_generic(const char *buf, const char *w, const kvb_plan_geom_t *in,
                                      uint32_t tp, uint32_t rows, side_geom_t *g)
{
    g->tp = tp;
    g->item = in->item_len;
    g->axis = in->axis;
    g->hint = in->global_units;
    if (in->axis != KVB_PLAN_AXIS_KV_HEAD && in->axis != KVB_PLAN_AXIS_STATE_CHANNEL &&
        in->axis != KVB_PLAN_AXIS_REPLICATED)
        return kvb__plan_fail("%s: %s axis=%d unknown", buf, w, (int)in->axis);
    if (in->item_len == 0)
        return kvb__plan_fail("%s: %s item_len=0", buf, w);
    if (in->item_len % rows != 0)
        return kvb__plan_fail("%s: %s item_len=%llu is not a multiple of rows per item=%u", buf, w,
                              (unsigned long long)in->item_len, rows);
    g->row = in->item_len / rows;
    g->unit = in->unit_len ? in->unit_len : g->row;
    if (g->row % g->unit != 0)
        return kvb__plan_fail("%s: %s row bytes=%llu (item_len=%llu) is not a multiple of "
                              "unit_len=%llu",
                              buf, w, (unsigned long long)g->row, (unsigned long long)g->item,
                              (unsigned long long)g->unit);
    g->units = g->row / g->unit;
    return KVB_OK;
}

/* Replica group size of one side holding units of H global units. */
static kvb_status_t side_group(const char *buf, const char *w, const side_geom_t *g, uint64_t H,
                               uint32_t *group_p)
{
    uint64_t total;
    if (!kvb__mul_u64(g->units, g->tp, &total))
        return kvb__plan_fail("%s: %s units × tp_size overflows", buf, w);
    if (total == H) {
        *group_p = 1;
        return KVB_OK;
    }
    if (total < H)
        return kvb__plan_fail("%s: %s units per rank=%llu × tp_size=%u = %llu do not cover the "
                              "%llu global units",
                              buf, w, (unsigned long long)g->units, g->tp,
                              (unsigned long long)total, (unsigned long long)H);
    if (H % g->units != 0 || g->tp % (H / g->units) != 0)
        return kvb__plan_fail("%s: %s units per rank=%llu with tp_size=%u cannot form replica "
                              "groups of %llu global units",
                              buf, w, (unsigned long long)g->units, g->tp, (unsigned long long)H);
    *group_p = (uint32_t)(g->tp / (H / g->units));
    return KVB_OK;
}

static kvb_status_t pair_class(const char *buf, const side_geom_t *s, const side_geom_t *d,
                               uint32_t rows, kvb__plan_class_t *c)
{
    if (s->unit != d->unit)
        return kvb__plan_fail("%s: unit_len differs: prefill=%llu decode=%llu", buf,
                              (unsigned long long)s->unit, (unsigned long long)d->unit);
    uint64_t H;
    if (s->axis == KVB_PLAN_AXIS_REPLICATED || d->axis == KVB_PLAN_AXIS_REPLICATED) {
        if (s->row != d->row)
            return kvb__plan_fail("%s: replicated row bytes differ: prefill=%llu decode=%llu", buf,
                                  (unsigned long long)s->row, (unsigned long long)d->row);
        H = s->units;
    } else {
        if (s->axis != d->axis)
            return kvb__plan_fail("%s: sharded axis differs: prefill=%d decode=%d", buf,
                                  (int)s->axis, (int)d->axis);
        if (s->hint && d->hint && s->hint != d->hint)
            return kvb__plan_fail("%s: global units differ: prefill=%llu decode=%llu", buf,
                                  (unsigned long long)s->hint, (unsigned long long)d->hint);
        H = s->hint ? s->hint : d->hint;
        if (H == 0) {
            uint64_t ps, ds;
            if (!kvb__mul_u64(s->units, s->tp, &ps) || !kvb__mul_u64(d->units, d->tp, &ds))
                return kvb__plan_fail("%s: units × tp_size overflows", buf);
            if (ps == ds)
                H = ps;
            else if (s->units == d->units)
                H = s->units; /* TokenSpeed: equal items → replicated */
            else
                H = ps < ds ? ps : ds; /* the larger side holds replicas */
        }
    }
    c->rows = rows;
    c->dst_rows = rows;
    c->src_order = c->dst_order = KVB_PLAN_ORDER_NHD;
    c->unit = s->unit;
    c->units = H;
    c->src_units = s->units;
    c->dst_units = d->units;
    c->src_row = s->row;
    c->dst_row = d->row;
    c->src_item = s->item;
    c->dst_item = d->item;
    kvb_status_t st = side_group(buf, "prefill", s, H, &c->src_group);
    if (st == KVB_OK)
        st = side_group(buf, "decode", d, H, &c->dst_group);
    return st;
}

bool kvb__plan_pair_fragment(const kvb_plan_h plan, const kvb__plan_class_t *c, uint32_t p,
                             uint32_t d, uint64_t *src_off_p, uint64_t *dst_off_p,
                             uint64_t *bytes_p)
{
    (void)plan;
    uint64_t ps = p / c->src_group, ds = d / c->dst_group;
    uint64_t plo = ps * c->src_units, phi = plo + c->src_units;
    uint64_t dlo = ds * c->dst_units, dhi = dlo + c->dst_units;
    uint64_t lo = plo > dlo ? plo : dlo, hi = phi < dhi ? phi : dhi;
    if (lo >= hi)
        return false;
    /* Decode ranks needing prefill shard ps form one contiguous range; the
     * i-th of its m ranks is served by member i·g/m of the replica group. */
    uint64_t first_shard = plo / c->dst_units, last_shard = (phi - 1) / c->dst_units;
    uint64_t m = (last_shard - first_shard + 1) * c->dst_group;
    uint64_t i = d - first_shard * c->dst_group;
    uint64_t rep = ps * c->src_group + i * c->src_group / m;
    if (p != rep)
        return false;
    *src_off_p = (lo - plo) * c->unit;
    *dst_off_p = (lo - dlo) * c->unit;
    *bytes_p = (hi - lo) * c->unit;
    return true;
}

/* ---- plan creation ---- */

/* A paged class (K/V, latent, draft): pair_class, then each side's page
 * size and order; element sizes must divide the unit (and agree). */
static kvb_status_t pair_paged(const char *buf, const side_layout_t *ps, const side_layout_t *ds,
                               const side_geom_t *sg, const side_geom_t *dg, kvb__plan_class_t *c)
{
    if (ps->elem && ds->elem && ps->elem != ds->elem)
        return kvb__plan_fail("%s: elem_bytes differs: prefill=%u decode=%u", buf, ps->elem,
                              ds->elem);
    if ((ps->elem && sg->unit % ps->elem != 0) || (ds->elem && dg->unit % ds->elem != 0))
        return kvb__plan_fail("%s: unit_len=%llu is not a multiple of elem_bytes (prefill=%u "
                              "decode=%u)",
                              buf, (unsigned long long)sg->unit, ps->elem, ds->elem);
    kvb_status_t st = pair_class(buf, sg, dg, ps->l->page_size, c);
    c->dst_rows = ds->l->page_size;
    c->src_order = ps->order;
    c->dst_order = ds->order;
    return st;
}

static kvb_status_t build_classes(kvb_plan_h plan, const side_layout_t *ps, const side_layout_t *ds)
{
    const kvb_plan_layout_t *pl = ps->l, *dl = ds->l;
    uint32_t rows = pl->page_size, drows = dl->page_size;
    bool mla = pl->attn == KVB_PLAN_MLA;
    size_t n = 0;
    kvb__plan_class_t *cls = plan->classes;
    side_geom_t sg, dg;
    kvb_status_t st;

    /* target K/V (or latent) */
    const char *kvname = mla ? "latent" : "k";
    if (pl->field_mask & KVB_PLAN_LAYOUT_KV_GEOM)
        st = geom_from_generic(kvname, "prefill", &pl->kv_geom, pl->tp_size, rows, &sg);
    else
        st = geom_from_heads(kvname, "prefill", pl->kv_heads, pl->head_bytes, pl->tp_size, rows,
                             mla, &sg);
    if (st != KVB_OK)
        return st;
    if (dl->field_mask & KVB_PLAN_LAYOUT_KV_GEOM)
        st = geom_from_generic(kvname, "decode", &dl->kv_geom, dl->tp_size, drows, &dg);
    else
        st = geom_from_heads(kvname, "decode", dl->kv_heads, dl->head_bytes, dl->tp_size, drows,
                             mla, &dg);
    if (st != KVB_OK)
        return st;
    if (mla && (sg.axis != KVB_PLAN_AXIS_REPLICATED || dg.axis != KVB_PLAN_AXIS_REPLICATED))
        return kvb__plan_fail("latent: MLA buffers must be replicated (axis prefill=%d "
                              "decode=%d)",
                              (int)sg.axis, (int)dg.axis);
    if ((st = pair_paged(kvname, ps, ds, &sg, &dg, &cls[n])) != KVB_OK)
        return st;
    cls[n].kind = mla ? KVB_PLAN_BUF_LATENT : KVB_PLAN_BUF_K;
    n++;
    if (!mla) {
        cls[n] = cls[n - 1];
        cls[n].kind = KVB_PLAN_BUF_V;
        n++;
    }

    /* draft K/V (or draft latent) */
    if (ps->draft_layers > 0) {
        const char *dname = mla ? "draft_k" : "draft_k/v";
        if (pl->field_mask & KVB_PLAN_LAYOUT_DRAFT_GEOM)
            st = geom_from_generic(dname, "prefill", &pl->draft_geom, pl->tp_size, rows, &sg);
        else
            st = geom_from_heads(dname, "prefill", pl->draft_kv_heads, pl->draft_head_bytes,
                                 pl->tp_size, rows, mla, &sg);
        if (st != KVB_OK)
            return st;
        if (dl->field_mask & KVB_PLAN_LAYOUT_DRAFT_GEOM)
            st = geom_from_generic(dname, "decode", &dl->draft_geom, dl->tp_size, drows, &dg);
        else
            st = geom_from_heads(dname, "decode", dl->draft_kv_heads, dl->draft_head_bytes,
                                 dl->tp_size, drows, mla, &dg);
        if (st != KVB_OK)
            return st;
        if ((st = pair_paged(dname, ps, ds, &sg, &dg, &cls[n])) != KVB_OK)
            return st;
        cls[n].kind = KVB_PLAN_BUF_DRAFT_K;
        n++;
        if (!mla) {
            cls[n] = cls[n - 1];
            cls[n].kind = KVB_PLAN_BUF_DRAFT_V;
            n++;
        }
    }

    for (uint32_t i = 0; i < ps->num_state; i++) {
        char name[32];
        snprintf(name, sizeof(name), "state[%u]", i);
        if ((st = geom_from_generic(name, "prefill", &pl->state[i], pl->tp_size, 1, &sg)) != KVB_OK)
            return st;
        if ((st = geom_from_generic(name, "decode", &dl->state[i], dl->tp_size, 1, &dg)) != KVB_OK)
            return st;
        if ((st = pair_class(name, &sg, &dg, 1, &cls[n])) != KVB_OK)
            return st;
        cls[n].kind = KVB_PLAN_BUF_STATE;
        cls[n].index = i;
        n++;
    }
    for (uint32_t i = 0; i < ps->num_aux; i++) {
        uint64_t sl = pl->aux_item_lens[i], dlen = dl->aux_item_lens[i];
        if (sl == 0 || sl != dlen)
            return kvb__plan_fail("aux[%u]: item_len differs or is 0: prefill=%llu decode=%llu", i,
                                  (unsigned long long)sl, (unsigned long long)dlen);
        kvb__plan_class_t *c = &cls[n++];
        memset(c, 0, sizeof(*c));
        c->kind = KVB_PLAN_BUF_AUX;
        c->index = i;
        c->rows = c->dst_rows = 1;
        c->unit = sl;
        c->units = c->src_units = c->dst_units = 1;
        c->src_group = pl->tp_size;
        c->dst_group = dl->tp_size;
        c->src_row = c->dst_row = c->src_item = c->dst_item = sl;
    }
    plan->num_classes = n;
    return KVB_OK;
}

/* Sources of every decode rank: for each class, the representative of each
 * prefill replica group that overlaps the decode rank's units is real; the
 * other members of its block (i·g/m .. (i+1)·g/m) are dummies, so every
 * prefill rank is named by some decode rank and leaves Bootstrapping. */
static kvb_status_t build_routes(kvb_plan_h plan)
{
    uint32_t ptp = plan->ptp, dtp = plan->dtp;
    uint8_t *mark = calloc(ptp, 1);
    uint32_t *info = calloc(ptp, sizeof(uint32_t));
    size_t cap = (size_t)dtp + ptp, count = 0;
    plan->sources = malloc(cap * sizeof(kvb_plan_source_t));
    plan->route_off = malloc(((size_t)dtp + 1) * sizeof(uint32_t));
    plan->response_num = malloc((size_t)dtp * sizeof(uint32_t));
    if (!mark || !info || !plan->sources || !plan->route_off || !plan->response_num) {
        free(mark);
        free(info);
        return KVB_ERR_NOMEM;
    }
    for (uint32_t d = 0; d < dtp; d++) {
        memset(mark, 0, ptp);
        for (size_t k = 0; k < plan->num_classes; k++) {
            const kvb__plan_class_t *c = &plan->classes[k];
            uint64_t dlo = (uint64_t)(d / c->dst_group) * c->dst_units, dhi = dlo + c->dst_units;
            for (uint64_t psh = dlo / c->src_units; psh * c->src_units < dhi; psh++) {
                uint64_t plo = psh * c->src_units, phi = plo + c->src_units;
                uint64_t first_shard = plo / c->dst_units, last_shard = (phi - 1) / c->dst_units;
                uint64_t m = (last_shard - first_shard + 1) * c->dst_group;
                uint64_t i = d - first_shard * c->dst_group, g = c->src_group;
                uint64_t base = psh * g, rep = base + i * g / m, end = base + (i + 1) * g / m;
                mark[rep] = 2;
                for (uint64_t p = rep + 1; p < end; p++)
                    if (mark[p] == 0)
                        mark[p] = 1;
            }
        }
        plan->route_off[d] = (uint32_t)count;
        uint32_t real = 0;
        for (uint32_t p = 0; p < ptp; p++) {
            if (mark[p] == 0)
                continue;
            if (count == cap) {
                size_t ncap = cap * 2;
                kvb_plan_source_t *ns = realloc(plan->sources, ncap * sizeof(*ns));
                if (ns == NULL) {
                    free(mark);
                    free(info);
                    return KVB_ERR_NOMEM;
                }
                plan->sources = ns;
                cap = ncap;
            }
            plan->sources[count].prefill_rank = p;
            plan->sources[count].dummy = mark[p] == 1;
            count++;
            info[p]++;
            real += mark[p] == 2;
        }
        plan->response_num[d] = real * plan->pp_size;
    }
    plan->route_off[dtp] = (uint32_t)count;
    for (size_t k = 0; k < count; k++)
        plan->sources[k].required_dst_info_num = info[plan->sources[k].prefill_rank];
    kvb_status_t st = KVB_OK;
    for (uint32_t p = 0; p < ptp; p++) {
        if (info[p] == 0) {
            st = kvb__plan_fail("prefill rank %u of tp_size=%u is no decode rank's source "
                                "(decode tp_size=%u)",
                                p, ptp, dtp);
            break;
        }
    }
    free(mark);
    free(info);
    return st;
}

void kvb_plan_destroy(kvb_plan_h plan)
{
    if (plan == NULL)
        return;
    free(plan->classes);
    free(plan->sources);
    free(plan->route_off);
    free(plan->response_num);
    free(plan);
}

kvb_status_t kvb_plan_create(const kvb_plan_layout_t *prefill, const kvb_plan_layout_t *decode,
                             kvb_plan_h *plan_p)
{
    if (prefill == NULL || decode == NULL || plan_p == NULL)
        return kvb__plan_fail("kvb_plan_create: NULL argument");
    side_layout_t ps = {.l = prefill, .who = "prefill"}, ds = {.l = decode, .who = "decode"};
    kvb_status_t st;
    if ((st = check_side(&ps)) != KVB_OK || (st = check_side(&ds)) != KVB_OK)
        return st;
    if (prefill->attn != decode->attn)
        return kvb__plan_fail("attn differs: prefill=%s decode=%s",
                              prefill->attn == KVB_PLAN_MLA ? "mla" : "mha",
                              decode->attn == KVB_PLAN_MLA ? "mla" : "mha");
    if (prefill->num_layers != decode->num_layers)
        return kvb__plan_fail("num_layers differs: prefill=%u decode=%u", prefill->num_layers,
                              decode->num_layers);
    if (ds.pp_size != 1 || ds.start != 0 || ds.stage != decode->num_layers)
        return kvb__plan_fail("decode must hold all layers: decode pp_size=%u start_layer=%u "
                              "stage_layers=%u num_layers=%u",
                              ds.pp_size, ds.start, ds.stage, decode->num_layers);
    if (ps.draft_layers != ds.draft_layers)
        return kvb__plan_fail("draft_layers differs: prefill=%u decode=%u", ps.draft_layers,
                              ds.draft_layers);
    if (ps.num_state != ds.num_state)
        return kvb__plan_fail("num_state differs: prefill=%u decode=%u", ps.num_state,
                              ds.num_state);
    if (ps.num_aux != ds.num_aux)
        return kvb__plan_fail("num_aux differs: prefill=%u decode=%u", ps.num_aux, ds.num_aux);

    kvb_plan_h plan = calloc(1, sizeof(*plan));
    if (plan == NULL)
        return KVB_ERR_NOMEM;
    plan->classes = calloc(4 + (size_t)ps.num_state + ps.num_aux, sizeof(kvb__plan_class_t));
    if (plan->classes == NULL) {
        free(plan);
        return KVB_ERR_NOMEM;
    }
    plan->attn = prefill->attn;
    plan->ptp = prefill->tp_size;
    plan->dtp = decode->tp_size;
    plan->pp_size = ps.pp_size;
    plan->pp_rank = ps.pp_rank;
    plan->start_layer = ps.start;
    plan->stage_layers = ps.stage;
    plan->num_layers = prefill->num_layers;
    plan->src_page = prefill->page_size;
    plan->dst_page = decode->page_size;
    plan->draft_layers = ps.draft_layers;
    plan->num_state = ps.num_state;
    plan->num_aux = ps.num_aux;
    plan->src_kv_pool = ps.kv_pool;
    plan->dst_kv_pool = ds.kv_pool;
    plan->src_state_pool = ps.state_pool;
    plan->dst_state_pool = ds.state_pool;
    plan->src_aux_pool = ps.aux_pool;
    plan->dst_aux_pool = ds.aux_pool;
    if ((st = build_classes(plan, &ps, &ds)) != KVB_OK || (st = build_routes(plan)) != KVB_OK) {
        kvb_plan_destroy(plan);
        return st;
    }
    *plan_p = plan;
    return KVB_OK;
}

kvb_status_t kvb_plan_route(kvb_plan_h plan, uint32_t decode_rank, kvb_plan_route_t *route_p)
{
    if (plan == NULL || route_p == NULL)
        return kvb__plan_fail("kvb_plan_route: NULL argument");
    if (decode_rank >= plan->dtp)
        return kvb__plan_fail("decode_rank=%u not below decode tp_size=%u", decode_rank, plan->dtp);
    route_p->decode_rank = decode_rank;
    route_p->sources = plan->sources + plan->route_off[decode_rank];
    route_p->num_sources = plan->route_off[decode_rank + 1] - plan->route_off[decode_rank];
    route_p->required_prefill_response_num = plan->response_num[decode_rank];
    return KVB_OK;
}

size_t kvb_plan_max_fragments(kvb_plan_h plan)
{
    return plan ? plan->num_classes : 0;
}

kvb_status_t kvb_plan_fragments(kvb_plan_h plan, uint32_t prefill_rank, uint32_t decode_rank,
                                kvb_plan_fragment_t *frags, size_t cap, size_t *count_p)
{
    if (plan == NULL || count_p == NULL)
        return kvb__plan_fail("kvb_plan_fragments: NULL argument");
    if (prefill_rank >= plan->ptp)
        return kvb__plan_fail("prefill_rank=%u not below prefill tp_size=%u", prefill_rank,
                              plan->ptp);
    if (decode_rank >= plan->dtp)
        return kvb__plan_fail("decode_rank=%u not below decode tp_size=%u", decode_rank, plan->dtp);
    size_t n = 0;
    for (size_t k = 0; k < plan->num_classes; k++) {
        const kvb__plan_class_t *c = &plan->classes[k];
        uint64_t so, dof, b;
        if (!kvb__plan_pair_fragment(plan, c, prefill_rank, decode_rank, &so, &dof, &b))
            continue;
        if (n >= cap || frags == NULL)
            return kvb__plan_fail("fragments: cap=%zu too small, need at least %zu", cap,
                                  plan->num_classes);
        kvb_plan_fragment_t *f = &frags[n++];
        f->buffer = c->kind;
        f->index = c->index;
        f->src_offset = so;
        f->dst_offset = dof;
        f->bytes = b;
        f->src_row_bytes = c->src_row;
        f->dst_row_bytes = c->dst_row;
        f->rows_per_item = c->rows;
        f->dst_rows_per_item = c->dst_rows;
        f->unit_bytes = c->unit;
        f->src_order = c->src_order;
        f->dst_order = c->dst_order;
    }
    *count_p = n;
    return KVB_OK;
}
