/* Registration table of the bootstrap server (see boot_table.h). */
#include "bootstrap/boot_table.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

kvb_status_t kvb__boot_table_init(kvb__boot_table_t *t)
{
    memset(t, 0, sizeof(*t));
    t->page_size = -1;
    t->layout = json_object();
    return t->layout != NULL ? KVB_OK : KVB_ERR_NOMEM;
}

void kvb__boot_table_destroy(kvb__boot_table_t *t)
{
    for (size_t i = 0; i < t->count; i++)
        free(t->entries[i].rank_ip);
    free(t->entries);
    free(t->kv_cache_dtype);
    json_decref(t->layout);
    memset(t, 0, sizeof(*t));
}

static int cmp_key(const kvb__boot_entry_t *e, int64_t dp, int64_t cp, int64_t tp, int64_t pp)
{
    if (e->dp != dp)
        return e->dp < dp ? -1 : 1;
    if (e->cp != cp)
        return e->cp < cp ? -1 : 1;
    if (e->tp != tp)
        return e->tp < tp ? -1 : 1;
    if (e->pp != pp)
        return e->pp < pp ? -1 : 1;
    return 0;
}

/* Index of the first entry not below the key. */
static size_t lower_bound(const kvb__boot_table_t *t, int64_t dp, int64_t cp, int64_t tp,
                          int64_t pp)
{
    size_t lo = 0, hi = t->count;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (cmp_key(&t->entries[mid], dp, cp, tp, pp) < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

bool kvb__boot_table_legacy(const kvb__boot_table_t *t)
{
    return t->n_legacy > 0;
}

const kvb__boot_entry_t *kvb__boot_table_find(const kvb__boot_table_t *t, int64_t dp, int64_t cp,
                                              int64_t tp, int64_t pp)
{
    size_t i = lower_bound(t, dp, cp, tp, pp);
    if (i < t->count && cmp_key(&t->entries[i], dp, cp, tp, pp) == 0)
        return &t->entries[i];
    return NULL;
}

/* A registration agrees with the sizes and facts already fixed. */
static bool consistent(const kvb__boot_table_t *t, const kvb__boot_reg_t *reg, char *reason,
                       size_t reason_len)
{
    int64_t dp_size = kvb__boot_reg_dp_size(reg);
    if (t->sized && (reg->attn_tp_size != t->attn_tp_size || reg->pp_size != t->pp_size ||
                     dp_size != t->dp_size || reg->attn_cp_size != t->attn_cp_size)) {
        kvb__boot_reason(reason, reason_len,
                         "sizes attn_tp_size=%lld dp_size=%lld pp_size=%lld attn_cp_size=%lld "
                         "contradict the registered %lld/%lld/%lld/%lld",
                         (long long)reg->attn_tp_size, (long long)dp_size, (long long)reg->pp_size,
                         (long long)reg->attn_cp_size, (long long)t->attn_tp_size,
                         (long long)t->dp_size, (long long)t->pp_size, (long long)t->attn_cp_size);
        return false;
    }
    if (reg->page_size >= 0 && t->page_size >= 0 && reg->page_size != t->page_size) {
        kvb__boot_reason(reason, reason_len,
                         "page_size=%lld contradicts the registered page_size=%lld",
                         (long long)reg->page_size, (long long)t->page_size);
        return false;
    }
    if (reg->kv_cache_dtype != NULL && t->kv_cache_dtype != NULL &&
        strcmp(reg->kv_cache_dtype, t->kv_cache_dtype) != 0) {
        kvb__boot_reason(reason, reason_len,
                         "kv_cache_dtype=\"%s\" contradicts the registered \"%s\"",
                         reg->kv_cache_dtype, t->kv_cache_dtype);
        return false;
    }
    return true;
}

kvb_status_t kvb__boot_table_apply(kvb__boot_table_t *t, const kvb__boot_reg_t *reg, char *reason,
                                   size_t reason_len)
{
    int64_t dp_size = kvb__boot_reg_dp_size(reg), dp = kvb__boot_reg_dp_group(reg);
    size_t pos;
    bool exists;
    char *ip;
    json_t *layout;

    char *dtype = NULL;

    if (!consistent(t, reg, reason, reason_len))
        return KVB_ERR_PROTO;
    pos = lower_bound(t, dp, reg->attn_cp_rank, reg->attn_tp_rank, reg->pp_rank);
    exists = pos < t->count &&
             cmp_key(&t->entries[pos], dp, reg->attn_cp_rank, reg->attn_tp_rank, reg->pp_rank) == 0;
    if (!exists && t->count >= KVB__BOOT_MAX_ENTRIES) {
        kvb__boot_reason(reason, reason_len, "table full (%d entries)", KVB__BOOT_MAX_ENTRIES);
        return KVB_ERR_PROTO;
    }
    /* Allocate everything first so that a failure changes nothing. */
    if (!exists && t->count == t->cap) {
        size_t ncap = t->cap ? t->cap * 2 : 16;
        kvb__boot_entry_t *n = realloc(t->entries, ncap * sizeof(*n));
        if (n == NULL)
            goto nomem;
        t->entries = n;
        t->cap = ncap;
    }
    ip = strdup(reg->rank_ip);
    if (ip == NULL)
        goto nomem;
    if (t->kv_cache_dtype == NULL && reg->kv_cache_dtype != NULL &&
        (dtype = strdup(reg->kv_cache_dtype)) == NULL) {
        free(ip);
        goto nomem;
    }
    layout = json_copy(t->layout);
    if (layout == NULL || (reg->layout != NULL && json_object_update(layout, reg->layout) != 0)) {
        json_decref(layout);
        free(ip);
        free(dtype);
        goto nomem;
    }

    if (!t->sized) {
        t->sized = true;
        t->attn_tp_size = reg->attn_tp_size;
        t->pp_size = reg->pp_size;
        t->dp_size = dp_size;
        t->attn_cp_size = reg->attn_cp_size;
        t->follow_bootstrap_room = reg->load_balance_method == NULL ||
                                   strcmp(reg->load_balance_method, "follow_bootstrap_room") == 0;
        t->enable_dsa_cache_layer_split = reg->enable_dsa_cache_layer_split;
    }
    if (dtype != NULL)
        t->kv_cache_dtype = dtype;
    if (t->page_size < 0)
        t->page_size = reg->page_size;
    if (t->prefill_http_port == 0)
        t->prefill_http_port = reg->prefill_http_port;
    if (exists) {
        free(t->entries[pos].rank_ip);
        t->n_legacy -= !t->entries[pos].v2026;
    } else {
        memmove(&t->entries[pos + 1], &t->entries[pos], (t->count - pos) * sizeof(*t->entries));
        t->count++;
        t->entries[pos].dp = dp;
        t->entries[pos].cp = reg->attn_cp_rank;
        t->entries[pos].tp = reg->attn_tp_rank;
        t->entries[pos].pp = reg->pp_rank;
    }
    t->entries[pos].rank_ip = ip;
    t->entries[pos].rank_port = reg->rank_port;
    t->entries[pos].kvbridge = reg->kvbridge;
    t->entries[pos].v2026 = reg->v2026;
    t->n_legacy += !reg->v2026;
    json_decref(t->layout);
    t->layout = layout;
    return KVB_OK;
nomem:
    kvb__boot_reason(reason, reason_len, "out of memory");
    return KVB_ERR_NOMEM;
}

json_t *kvb__boot_table_parallel_info(const kvb__boot_table_t *t, bool *nomem_p)
{
    json_t *o;
    *nomem_p = false;
    if (!t->sized)
        return NULL;
    o = json_pack("{s:I, s:I, s:I, s:I, s:I, s:b}", "prefill_attn_tp_size",
                  (json_int_t)t->attn_tp_size, "prefill_dp_size", (json_int_t)t->dp_size,
                  "prefill_pp_size", (json_int_t)t->pp_size, "prefill_tp_size",
                  /* TokenSpeed's: its world size (PROTOCOL-TOKENSPEED.md 3.2, 13) */
                  (json_int_t)(t->attn_tp_size * t->dp_size), "dp_size", (json_int_t)t->dp_size,
                  KVB__BOOT_KEY_MLA_L1_5, 0);
    if (o == NULL || json_object_update(o, t->layout) != 0) {
        json_decref(o);
        *nomem_p = true;
        return NULL;
    }
    return o;
}

bool kvb__boot_table_ready(const kvb__boot_table_t *t)
{
    /* Entries are unique and in range, so "all registered" is a count; the
     * product saturates (a table holds at most KVB__BOOT_MAX_ENTRIES). */
    uint64_t need = 1;
    const int64_t f[4] = {t->dp_size, t->attn_cp_size, t->attn_tp_size, t->pp_size};
    if (!t->sized)
        return false;
    for (int i = 0; i < 4; i++) {
        need *= (uint64_t)f[i];
        if (need > KVB__BOOT_MAX_ENTRIES)
            return false;
    }
    return t->count >= need;
}

json_t *kvb__boot_table_parallel_info_2026(const kvb__boot_table_t *t, bool with_layout,
                                           bool *nomem_p)
{
    json_t *o;
    *nomem_p = false;
    if (!kvb__boot_table_ready(t))
        return NULL;
    o = json_pack(
        "{s:I, s:I, s:I, s:I, s:o, s:o, s:b, s:b, s:o, s:n, s:n, s:n, s:n, s:n, s:n}",
        "attn_tp_size", (json_int_t)t->attn_tp_size, "attn_cp_size", (json_int_t)t->attn_cp_size,
        "dp_size", (json_int_t)t->dp_size, "pp_size", (json_int_t)t->pp_size, "page_size",
        t->page_size >= 0 ? json_integer((json_int_t)t->page_size) : json_null(), "kv_cache_dtype",
        t->kv_cache_dtype != NULL ? json_string(t->kv_cache_dtype) : json_null(),
        "follow_bootstrap_room", (int)t->follow_bootstrap_room, "enable_dsa_cache_layer_split",
        (int)t->enable_dsa_cache_layer_split, "prefill_http_port",
        t->prefill_http_port > 0 ? json_integer((json_int_t)t->prefill_http_port) : json_null(),
        "target_tp_rank", "target_tp_ranks", "target_cp_ranks", "target_pp_ranks",
        "required_dst_info_num", "required_prefill_response_num");
    if (o == NULL || (with_layout && json_object_update(o, t->layout) != 0)) {
        json_decref(o);
        *nomem_p = true;
        return NULL;
    }
    return o;
}

json_t *kvb__boot_entry_json(const kvb__boot_entry_t *e)
{
    if (e->kvbridge > 0)
        return json_pack("{s:s, s:I, s:I}", "rank_ip", e->rank_ip, "rank_port",
                         (json_int_t)e->rank_port, KVB__BOOT_KEY_KVBRIDGE, (json_int_t)e->kvbridge);
    return json_pack("{s:s, s:I}", "rank_ip", e->rank_ip, "rank_port", (json_int_t)e->rank_port);
}

json_t *kvb__boot_table_snapshot(const kvb__boot_table_t *t)
{
    json_t *entries = json_array();
    json_t *o;
    if (entries == NULL)
        return NULL;
    for (size_t i = 0; i < t->count; i++) {
        const kvb__boot_entry_t *e = &t->entries[i];
        if (json_array_append_new(entries,
                                  json_pack("[I, I, I, I, s, I]", (json_int_t)e->dp,
                                            (json_int_t)e->cp, (json_int_t)e->tp, (json_int_t)e->pp,
                                            e->rank_ip, (json_int_t)e->rank_port)) != 0) {
            json_decref(entries);
            return NULL;
        }
    }
    o = json_pack("{s:b, s:I, s:I, s:I, s:I, s:I, s:s?, s:b, s:b, s:I, s:O, s:o}", "sized",
                  t->sized, "attn_tp_size", (json_int_t)t->attn_tp_size, "dp_size",
                  (json_int_t)t->dp_size, "pp_size", (json_int_t)t->pp_size, "attn_cp_size",
                  (json_int_t)t->attn_cp_size, "page_size", (json_int_t)t->page_size,
                  "kv_cache_dtype", t->kv_cache_dtype, "follow_bootstrap_room",
                  (int)t->follow_bootstrap_room, "enable_dsa_cache_layer_split",
                  (int)t->enable_dsa_cache_layer_split, "prefill_http_port",
                  (json_int_t)t->prefill_http_port, "layout", t->layout, "entries", entries);
    return o;
}
