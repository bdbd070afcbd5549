/* CachePD block manifest: parse, encode, validate against a contract, and
 * the transfer policies' slot arithmetic (cachepd.h; spec 5.4-5.5, 7.7-7.8). */
#include "dialect/cachepd/cpd_int.h"

#include <stdlib.h>
#include <string.h>

#define M_WHAT "CachePD manifest"

void kvb__cpd_manifest_free(kvb__cpd_manifest_t *m)
{
    if (m == NULL)
        return;
    for (uint32_t i = 0; m->groups != NULL && i < m->ngroups; i++) {
        free(m->groups[i].group_id);
        free(m->groups[i].block_ids);
    }
    free(m->groups);
    memset(m, 0, sizeof(*m));
}

static kvb_status_t get_i64(json_t *obj, const char *key, kvb__frames_err_t *err, int64_t *out_p)
{
    json_t *v = json_object_get(obj, key);
    if (v == NULL)
        return kvb__cpd_fail(err, false, 0, M_WHAT ": missing key \"%s\"", key);
    if (!json_is_integer(v))
        return kvb__cpd_fail(err, false, 0, M_WHAT ": \"%s\" is not an integer", key);
    *out_p = (int64_t)json_integer_value(v);
    return KVB_OK;
}

static kvb_status_t parse_group(json_t *e, size_t i, kvb__frames_err_t *err, kvb__cpd_mgroup_t *g)
{
    char what[64];
    json_t *arr, *x;
    size_t k;
    snprintf(what, sizeof(what), M_WHAT ": groups[%zu]", i);
    if (!json_is_object(e))
        return kvb__cpd_fail(err, false, 0, "%s is not an object", what);
    KVB__FRAMES_TRY(kvb__cpd_get_id(e, what, "group_id", err, &g->group_id));
    KVB__FRAMES_TRY(kvb__cpd_get_array(e, what, "block_ids", KVB__CPD_MAX_BLOCKS, err, &arr));
    g->block_ids = malloc((json_array_size(arr) ? json_array_size(arr) : 1) * sizeof(int64_t));
    if (g->block_ids == NULL)
        return KVB_ERR_NOMEM;
    json_array_foreach(arr, k, x)
    {
        if (!json_is_integer(x))
            return kvb__cpd_fail(err, false, 0, "%s: block_ids[%zu] is not an integer", what, k);
        g->block_ids[k] = (int64_t)json_integer_value(x);
    }
    g->n = json_array_size(arr);
    return KVB_OK;
}

static kvb_status_t parse_obj(json_t *root, kvb__frames_err_t *err, kvb__cpd_manifest_t *m)
{
    json_t *arr, *e;
    size_t i;
    if (!json_is_object(root))
        return kvb__cpd_fail(err, false, 0,
                             M_WHAT ": Cache block manifest payload must be a JSON object");
    KVB__FRAMES_TRY(kvb__cpd_get_array(root, M_WHAT, "groups", KVB__CPD_MAX_GROUPS, err, &arr));
    m->groups = calloc(json_array_size(arr) ? json_array_size(arr) : 1, sizeof(*m->groups));
    if (m->groups == NULL)
        return KVB_ERR_NOMEM;
    json_array_foreach(arr, i, e)
    {
        m->ngroups = (uint32_t)i + 1;
        KVB__FRAMES_TRY(parse_group(e, i, err, &m->groups[i]));
    }
    KVB__FRAMES_TRY(get_i64(root, "prefix_len", err, &m->prefix_len));
    return get_i64(root, "prompt_len", err, &m->prompt_len);
}

kvb_status_t kvb__cpd_manifest_parse(const uint8_t *json, size_t len, kvb__frames_err_t *err,
                                     kvb__cpd_manifest_t *m_p)
{
    kvb__cpd_manifest_t m;
    memset(&m, 0, sizeof(m));
    if (len == 0 || len > KVB__CPD_MAX_MANIFEST_BYTES)
        return kvb__cpd_fail(err, false, 0,
                             M_WHAT ": Cache block manifest payload must be 1..%u bytes, got %zu",
                             KVB__CPD_MAX_MANIFEST_BYTES, len);
    json_t *root = kvb__cpd_json_load((const char *)json, len, M_WHAT, "Cache block manifest", err);
    if (root == NULL)
        return KVB_ERR_PROTO;
    kvb_status_t st = parse_obj(root, err, &m);
    json_decref(root);
    if (st != KVB_OK) {
        kvb__cpd_manifest_free(&m);
        return st;
    }
    *m_p = m;
    return KVB_OK;
}

kvb_status_t kvb__cpd_manifest_encode(const kvb__cpd_manifest_t *m, char **json_p, size_t *len_p)
{
    kvb__cpd_buf_t b = {0};
    kvb__cpd_puts(&b, "{\"groups\":[");
    for (uint32_t i = 0; i < m->ngroups; i++) {
        const kvb__cpd_mgroup_t *g = &m->groups[i];
        kvb__cpd_puts(&b, i ? ",{\"group_id\":" : "{\"group_id\":");
        kvb__cpd_put_jstr(&b, g->group_id, strlen(g->group_id));
        kvb__cpd_puts(&b, ",\"block_ids\":[");
        for (size_t k = 0; k < g->n; k++) {
            if (k)
                kvb__cpd_puts(&b, ",");
            kvb__cpd_put_i64(&b, g->block_ids[k]);
        }
        kvb__cpd_puts(&b, "]}");
    }
    kvb__cpd_puts(&b, "],\"prefix_len\":");
    kvb__cpd_put_i64(&b, m->prefix_len);
    kvb__cpd_puts(&b, ",\"prompt_len\":");
    kvb__cpd_put_i64(&b, m->prompt_len);
    kvb__cpd_puts(&b, "}");
    return kvb__cpd_buf_take(&b, json_p, len_p);
}

/* ---------------------------------------------------------------- policies */

kvb_status_t kvb__cpd_slots(const kvb__cpd_contract_t *c, uint32_t s, int64_t prefix_len,
                            int64_t prompt_len, uint64_t *first_p, uint64_t *count_p)
{
    if (s >= c->nspecs || prompt_len < 1 || prefix_len < 0)
        return KVB_ERR_INVALID;
    const kvb__cpd_spec_t *sp = &c->specs[s];
    uint64_t g = sp->granularity, prompt = (uint64_t)prompt_len;
    if (sp->policy != KVB__CPD_FULL_SUFFIX) {
        *first_p = (prompt - 1) / g;
        *count_p = 1;
        return KVB_OK;
    }
    uint64_t begin = (uint64_t)prefix_len / g, end = prompt / g + (prompt % g != 0);
    if (sp->retention == KVB__CPD_SLIDING_WINDOW) {
        /* The next token attends the window - 1 tokens before it: every
         * block intersecting that tail. */
        uint64_t w = (uint64_t)sp->sliding_window_tokens;
        uint64_t retained = prompt + 1 > w ? prompt + 1 - w : 0;
        if (retained / g > begin)
            begin = retained / g;
    }
    *first_p = begin;
    *count_p = end > begin ? end - begin : 0;
    return KVB_OK;
}

kvb_status_t kvb__cpd_layerwise_positions(const kvb__cpd_contract_t *c, uint32_t s,
                                          int64_t prefix_len, int64_t prompt_len,
                                          int64_t chunk_start, int64_t chunk_end, uint64_t *pos_p,
                                          uint64_t *count_p)
{
    uint64_t first, n;
    if (s >= c->nspecs || prefix_len < 0 || prefix_len >= prompt_len ||
        (uint64_t)prefix_len % c->prefix_granularity != 0 || chunk_start < 0 ||
        chunk_start >= chunk_end || chunk_end > prompt_len)
        return KVB_ERR_INVALID;
    const kvb__cpd_spec_t *sp = &c->specs[s];
    bool final = chunk_end == prompt_len;
    if (sp->policy == KVB__CPD_POLICY_NULL)
        return KVB_ERR_INVALID; /* TokenSpeed's selection has no case for it */
    KVB__FRAMES_TRY(kvb__cpd_slots(c, s, prefix_len, prompt_len, &first, &n));
    if (sp->policy == KVB__CPD_LATEST_SNAPSHOT) {
        *pos_p = 0;
        *count_p = final ? 1 : 0;
        return KVB_OK;
    }
    uint64_t g = sp->granularity, ce = (uint64_t)chunk_end;
    int64_t start = (int64_t)((uint64_t)chunk_start / g) - (int64_t)first;
    int64_t ready = (int64_t)(final ? ce / g + (ce % g != 0) : ce / g) - (int64_t)first;
    start = start < 0 ? 0 : (start > (int64_t)n ? (int64_t)n : start);
    ready = ready < 0 ? 0 : (ready > (int64_t)n ? (int64_t)n : ready);
    *pos_p = (uint64_t)start;
    *count_p = ready > start ? (uint64_t)(ready - start) : 0;
    return KVB_OK;
}

/* ---------------------------------------------------------------- validation */

static kvb_status_t check_group(const kvb__cpd_manifest_t *m, const kvb__cpd_contract_t *c,
                                uint32_t s, kvb__frames_err_t *err)
{
    const kvb__cpd_mgroup_t *g = &m->groups[s];
    uint64_t first, n, bound = kvb__cpd_virtual_blocks(c, s);
    KVB__FRAMES_TRY(kvb__cpd_slots(c, s, m->prefix_len, m->prompt_len, &first, &n));
    if (g->n != n)
        return kvb__cpd_fail(err, false, 0,
                             "destination manifest group '%s' block count disagrees with its "
                             "transfer policy (%zu ids, %llu slots)",
                             g->group_id, g->n, (unsigned long long)n);
    for (size_t k = 0; k < g->n; k++)
        if (g->block_ids[k] <= 0 || (uint64_t)g->block_ids[k] >= bound)
            return kvb__cpd_fail(err, false, 0,
                                 "destination manifest group '%s' has an out-of-bounds block "
                                 "(block_ids[%zu] = %lld, valid 1..%llu)",
                                 g->group_id, k, (long long)g->block_ids[k],
                                 (unsigned long long)(bound - 1));
    return KVB_OK;
}

kvb_status_t kvb__cpd_manifest_validate(const kvb__cpd_manifest_t *m, const kvb__cpd_contract_t *c,
                                        kvb__frames_err_t *err)
{
    if (m->prefix_len >= m->prompt_len)
        return kvb__cpd_fail(err, false, 0,
                             "destination manifest requires prefix_len < prompt_len (%lld, %lld)",
                             (long long)m->prefix_len, (long long)m->prompt_len);
    if (m->prefix_len < 0)
        return kvb__cpd_fail(err, false, 0, "destination manifest prefix_len %lld is negative",
                             (long long)m->prefix_len);
    bool order = m->ngroups == c->nspecs;
    for (uint32_t i = 0; order && i < m->ngroups; i++)
        order = strcmp(m->groups[i].group_id, c->specs[i].group_id) == 0;
    if (!order)
        return kvb__cpd_fail(err, false, 0,
                             "destination manifest group order disagrees with layout");
    if ((uint64_t)m->prefix_len % c->prefix_granularity != 0)
        return kvb__cpd_fail(err, false, 0,
                             "destination manifest prefix_len is not aligned to prefix_granularity "
                             "(%lld, %llu)",
                             (long long)m->prefix_len, (unsigned long long)c->prefix_granularity);
    for (uint32_t s = 0; s < m->ngroups; s++)
        KVB__FRAMES_TRY(check_group(m, c, s, err));
    return KVB_OK;
}
