/* CachePD layout contract: strict parser, validator, canonical encoder
 * (cachepd.h; spec 5.1-5.3, 6). The parse builds the C struct the way
 * TokenSpeed's from_wire_bytes builds its dataclasses (which keys are
 * required, which refused, which ignored), then checks what TokenSpeed
 * leaves to chance: types, references and the geometry a peer's addresses
 * are computed from. */
#include "dialect/cachepd/cpd_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define C_WHAT "CachePD contract"

static const struct {
    const char *name;
    unsigned bytes;
} DTYPES[KVB__CPD_DTYPE_COUNT] = {
    {"uint8", 1},          {"int8", 1},     {"float8_e4m3fn", 1}, {"float8_e5m2", 1},
    {"float8_e8m0fnu", 1}, {"bfloat16", 2}, {"float16", 2},       {"int32", 4},
    {"float32", 4},        {"int64", 8},    {"float64", 8},
};

const char *kvb__cpd_dtype_name(kvb__cpd_dtype_t dt)
{
    return (unsigned)dt < KVB__CPD_DTYPE_COUNT ? DTYPES[dt].name : "?";
}

unsigned kvb__cpd_dtype_bytes(kvb__cpd_dtype_t dt)
{
    return (unsigned)dt < KVB__CPD_DTYPE_COUNT ? DTYPES[dt].bytes : 0;
}

void kvb__cpd_contract_free(kvb__cpd_contract_t *c)
{
    if (c == NULL)
        return;
    for (uint32_t i = 0; c->groups && i < c->ngroups; i++)
        free(c->groups[i].group_id);
    for (uint32_t i = 0; c->planes && i < c->nplanes; i++)
        free(c->planes[i].plane_id);
    for (uint32_t i = 0; c->fields && i < c->nfields; i++) {
        free(c->fields[i].group_id);
        free(c->fields[i].field_id);
        free(c->fields[i].plane_id);
    }
    for (uint32_t i = 0; c->specs && i < c->nspecs; i++) {
        free(c->specs[i].group_id);
        free(c->specs[i].sorted_fields);
    }
    for (uint32_t i = 0; c->parts && i < c->nparts; i++)
        free(c->parts[i].field_id);
    free(c->groups);
    free(c->planes);
    free(c->fields);
    free(c->specs);
    free(c->parts);
    memset(c, 0, sizeof(*c));
}

/* ---------------------------------------------------------------- building */

/* Entries of a plan / spec array: allocate n zeroed entries of size bytes. */
static kvb_status_t alloc_n(void **p, size_t n, size_t size)
{
    *p = calloc(n ? n : 1, size);
    return *p != NULL ? KVB_OK : KVB_ERR_NOMEM;
}

static kvb_status_t parse_groups(json_t *plan, kvb__frames_err_t *err, kvb__cpd_contract_t *c)
{
    static const char *const keys[] = {"group_id", "cache_blocks_per_lcm_block", "page_count"};
    json_t *arr, *e;
    size_t i;
    char what[96];
    KVB__FRAMES_TRY(
        kvb__cpd_get_array(plan, C_WHAT ": plan", "groups", KVB__CPD_MAX_GROUPS, err, &arr));
    KVB__FRAMES_TRY(alloc_n((void **)&c->groups, json_array_size(arr), sizeof(*c->groups)));
    json_array_foreach(arr, i, e)
    {
        kvb__cpd_group_t *g = &c->groups[i];
        snprintf(what, sizeof(what), C_WHAT ": plan.groups[%zu]", i);
        KVB__FRAMES_TRY(kvb__cpd_only_keys(e, what, keys, 3, err));
        KVB__FRAMES_TRY(kvb__cpd_get_id(e, what, "group_id", err, &g->group_id));
        c->ngroups = (uint32_t)i + 1;
        KVB__FRAMES_TRY(kvb__cpd_get_u64(e, what, "cache_blocks_per_lcm_block", 1, INT64_MAX, err,
                                         &g->blocks_per_lcm));
        KVB__FRAMES_TRY(kvb__cpd_get_u64(e, what, "page_count", 1, INT64_MAX, err, &g->page_count));
    }
    return KVB_OK;
}

static kvb_status_t parse_planes(json_t *plan, kvb__frames_err_t *err, kvb__cpd_contract_t *c)
{
    static const char *const keys[] = {"plane_id", "bytes_per_lcm_block", "arena_offset_bytes"};
    json_t *arr, *e;
    size_t i;
    char what[96];
    KVB__FRAMES_TRY(
        kvb__cpd_get_array(plan, C_WHAT ": plan", "planes", KVB__CPD_MAX_PLANES, err, &arr));
    KVB__FRAMES_TRY(alloc_n((void **)&c->planes, json_array_size(arr), sizeof(*c->planes)));
    json_array_foreach(arr, i, e)
    {
        kvb__cpd_plane_t *p = &c->planes[i];
        snprintf(what, sizeof(what), C_WHAT ": plan.planes[%zu]", i);
        KVB__FRAMES_TRY(kvb__cpd_only_keys(e, what, keys, 3, err));
        KVB__FRAMES_TRY(kvb__cpd_get_id(e, what, "plane_id", err, &p->plane_id));
        c->nplanes = (uint32_t)i + 1;
        KVB__FRAMES_TRY(
            kvb__cpd_get_u64(e, what, "bytes_per_lcm_block", 1, INT64_MAX, err, &p->bytes_per_lcm));
        KVB__FRAMES_TRY(
            kvb__cpd_get_u64(e, what, "arena_offset_bytes", 0, INT64_MAX, err, &p->arena_offset));
    }
    return KVB_OK;
}

static kvb_status_t parse_dtype(json_t *e, const char *what, kvb__frames_err_t *err,
                                kvb__cpd_dtype_t *dt_p)
{
    json_t *v = json_object_get(e, "dtype");
    char show[256];
    if (v == NULL)
        return kvb__cpd_fail(err, false, 0, "%s: missing key \"dtype\"", what);
    if (!json_is_string(v))
        return kvb__cpd_fail(err, false, 0, "%s: \"dtype\" is not a string", what);
    for (unsigned d = 0; d < KVB__CPD_DTYPE_COUNT; d++)
        if (strcmp(json_string_value(v), DTYPES[d].name) == 0) {
            *dt_p = (kvb__cpd_dtype_t)d;
            return KVB_OK;
        }
    return kvb__cpd_fail(err, false, 0, "%s: unsupported cache dtype \"%s\"", what,
                         kvb__cpd_show(json_string_value(v), json_string_length(v), show));
}

static kvb_status_t parse_shape(json_t *e, const char *what, kvb__frames_err_t *err,
                                kvb__cpd_field_t *f)
{
    json_t *arr, *x;
    size_t i;
    KVB__FRAMES_TRY(kvb__cpd_get_array(e, what, "shape", KVB__CPD_MAX_DIMS, err, &arr));
    if (json_array_size(arr) == 0)
        return kvb__cpd_fail(err, false, 0, "%s: \"shape\" is empty", what);
    json_array_foreach(arr, i, x)
    {
        if (!json_is_integer(x) || json_integer_value(x) < 1 ||
            json_integer_value(x) > (json_int_t)UINT32_MAX)
            return kvb__cpd_fail(
                err, false, 0, "%s: \"shape\"[%zu] is not an integer in [1, 4294967295]", what, i);
        f->shape[i] = (uint64_t)json_integer_value(x);
    }
    f->ndim = (uint32_t)json_array_size(arr);
    return KVB_OK;
}

static kvb_status_t parse_fields(json_t *plan, kvb__frames_err_t *err, kvb__cpd_contract_t *c)
{
    static const char *const keys[] = {
        "group_id", "field_id",           "plane_id",         "shape",
        "dtype",    "field_offset_bytes", "page_stride_bytes"};
    json_t *arr, *e;
    size_t i;
    char what[96];
    KVB__FRAMES_TRY(
        kvb__cpd_get_array(plan, C_WHAT ": plan", "fields", KVB__CPD_MAX_FIELDS, err, &arr));
    KVB__FRAMES_TRY(alloc_n((void **)&c->fields, json_array_size(arr), sizeof(*c->fields)));
    json_array_foreach(arr, i, e)
    {
        kvb__cpd_field_t *f = &c->fields[i];
        snprintf(what, sizeof(what), C_WHAT ": plan.fields[%zu]", i);
        KVB__FRAMES_TRY(kvb__cpd_only_keys(e, what, keys, 7, err));
        c->nfields = (uint32_t)i + 1;
        KVB__FRAMES_TRY(kvb__cpd_get_id(e, what, "group_id", err, &f->group_id));
        KVB__FRAMES_TRY(kvb__cpd_get_id(e, what, "field_id", err, &f->field_id));
        KVB__FRAMES_TRY(kvb__cpd_get_id(e, what, "plane_id", err, &f->plane_id));
        KVB__FRAMES_TRY(parse_shape(e, what, err, f));
        KVB__FRAMES_TRY(parse_dtype(e, what, err, &f->dtype));
        KVB__FRAMES_TRY(
            kvb__cpd_get_u64(e, what, "field_offset_bytes", 0, INT64_MAX, err, &f->field_offset));
        KVB__FRAMES_TRY(
            kvb__cpd_get_u64(e, what, "page_stride_bytes", 1, INT64_MAX, err, &f->page_stride));
        f->partition = -1;
    }
    return KVB_OK;
}

static kvb_status_t parse_plan(json_t *root, kvb__frames_err_t *err, kvb__cpd_contract_t *c)
{
    json_t *plan = json_object_get(root, "plan");
    if (plan == NULL)
        return kvb__cpd_fail(err, false, 0, C_WHAT ": missing key \"plan\"");
    if (!json_is_object(plan))
        return kvb__cpd_fail(err, false, 0, C_WHAT ": \"plan\" is not an object");
    KVB__FRAMES_TRY(kvb__cpd_get_u64(plan, C_WHAT ": plan", "prefix_granularity", 1, INT64_MAX, err,
                                     &c->prefix_granularity));
    KVB__FRAMES_TRY(kvb__cpd_get_u64(plan, C_WHAT ": plan", "lcm_block_bytes", 1, INT64_MAX, err,
                                     &c->lcm_block_bytes));
    KVB__FRAMES_TRY(kvb__cpd_get_u64(plan, C_WHAT ": plan", "num_lcm_blocks", 1, INT64_MAX, err,
                                     &c->num_lcm_blocks));
    KVB__FRAMES_TRY(parse_groups(plan, err, c));
    KVB__FRAMES_TRY(parse_planes(plan, err, c));
    KVB__FRAMES_TRY(parse_fields(plan, err, c));
    return kvb__cpd_get_opt(plan, C_WHAT ": plan", "resident_block_bytes", true, 1, err,
                            &c->resident_block_bytes);
}

/* Member key as the index of one of names[0..n) (a NULL name stands for
 * JSON null); absent: def when optional. */
static kvb_status_t parse_enum(json_t *e, const char *what, const char *key,
                               const char *const *names, int n, bool optional, int def,
                               kvb__frames_err_t *err, int *out_p)
{
    json_t *v = json_object_get(e, key);
    char show[256];
    *out_p = def; /* on every path: gcc 12 -O3 cannot see that a failure is never read */
    if (v == NULL && !optional)
        return kvb__cpd_fail(err, false, 0, "%s: missing key \"%s\"", what, key);
    if (v == NULL)
        return KVB_OK;
    for (int i = 0; i < n; i++)
        if (names[i] == NULL ? json_is_null(v)
                             : json_is_string(v) && strcmp(json_string_value(v), names[i]) == 0) {
            *out_p = i;
            return KVB_OK;
        }
    if (json_is_string(v))
        return kvb__cpd_fail(err, false, 0, "%s: \"%s\" \"%s\" is not a known value", what, key,
                             kvb__cpd_show(json_string_value(v), json_string_length(v), show));
    return kvb__cpd_fail(err, false, 0, "%s: \"%s\" is not a string", what, key);
}

/* CacheGroupSpec.__post_init__ (spec 5.1). */
static kvb_status_t check_spec(const kvb__cpd_spec_t *s, const char *what, kvb__frames_err_t *err)
{
    bool has_rows = s->rows_per_page >= 0 || s->entry_stride_tokens >= 0;
    if (s->checkpoint_granularity >= 0) {
        if (has_rows)
            return kvb__cpd_fail(err, false, 0,
                                 "%s: checkpoint_granularity is mutually exclusive with "
                                 "rows_per_page/entry_stride_tokens",
                                 what);
        if (s->family != KVB__CPD_STATE)
            return kvb__cpd_fail(err, false, 0,
                                 "%s: checkpoint_granularity is only valid for state-family groups",
                                 what);
        if (s->retention != KVB__CPD_FULL_HISTORY)
            return kvb__cpd_fail(err, false, 0,
                                 "%s: a state group keeps checkpoints that never slide out; "
                                 "declare full_history retention",
                                 what);
        return KVB_OK;
    }
    if (s->family == KVB__CPD_STATE)
        return kvb__cpd_fail(err, false, 0,
                             "%s: a state-family group declares checkpoint_granularity", what);
    if (s->rows_per_page < 0 || s->entry_stride_tokens < 0)
        return kvb__cpd_fail(err, false, 0,
                             "%s: declare either row geometry (rows_per_page + "
                             "entry_stride_tokens) or checkpoint_granularity",
                             what);
    if (s->replayable && s->retention != KVB__CPD_SLIDING_WINDOW)
        return kvb__cpd_fail(err, false, 0,
                             "%s: only a sliding-window group can be regenerated by bounded "
                             "replay (replayable with full_history)",
                             what);
    if (s->retention == KVB__CPD_SLIDING_WINDOW && s->sliding_window_tokens < 1)
        return kvb__cpd_fail(err, false, 0,
                             "%s: a sliding_window group needs sliding_window_tokens >= 1", what);
    return KVB_OK;
}

static kvb_status_t parse_spec(json_t *e, const char *what, kvb__frames_err_t *err,
                               kvb__cpd_spec_t *s)
{
    static const char *const keys[] = {"group_id",
                                       "retention",
                                       "rows_per_page",
                                       "entry_stride_tokens",
                                       "sliding_window_tokens",
                                       "replayable",
                                       "family",
                                       "transfer_policy",
                                       "checkpoint_granularity",
                                       "shard_count"};
    static const char *const retention[] = {"full_history", "sliding_window"};
    static const char *const family[] = {"history", "state"};
    static const char *const policy[] = {NULL, "full_suffix", "latest_snapshot"};
    int v;
    uint64_t shards = 1;
    KVB__FRAMES_TRY(kvb__cpd_only_keys(e, what, keys, 10, err));
    KVB__FRAMES_TRY(kvb__cpd_get_id(e, what, "group_id", err, &s->group_id));
    KVB__FRAMES_TRY(parse_enum(e, what, "retention", retention, 2, false, 0, err, &v));
    s->retention = (kvb__cpd_retention_t)v;
    KVB__FRAMES_TRY(kvb__cpd_get_opt(e, what, "rows_per_page", true, 1, err, &s->rows_per_page));
    KVB__FRAMES_TRY(
        kvb__cpd_get_opt(e, what, "entry_stride_tokens", true, 1, err, &s->entry_stride_tokens));
    KVB__FRAMES_TRY(kvb__cpd_get_opt(e, what, "sliding_window_tokens", true, 1, err,
                                     &s->sliding_window_tokens));
    json_t *r = json_object_get(e, "replayable");
    if (r == NULL)
        return kvb__cpd_fail(err, false, 0,
                             "%s: missing key \"replayable\" (required since TokenSpeed 0.1.1)",
                             what);
    if (!json_is_boolean(r))
        return kvb__cpd_fail(err, false, 0, "%s: \"replayable\" is not a boolean", what);
    s->replayable = json_is_true(r);
    KVB__FRAMES_TRY(parse_enum(e, what, "family", family, 2, true, 0, err, &v));
    s->family = (kvb__cpd_family_t)v;
    KVB__FRAMES_TRY(parse_enum(e, what, "transfer_policy", policy, 3, true, 0, err, &v));
    s->policy = (kvb__cpd_policy_t)v;
    KVB__FRAMES_TRY(kvb__cpd_get_opt(e, what, "checkpoint_granularity", true, 1, err,
                                     &s->checkpoint_granularity));
    if (json_object_get(e, "shard_count") != NULL)
        KVB__FRAMES_TRY(kvb__cpd_get_u64(e, what, "shard_count", 1, KVB__CPD_MAX_TP, err, &shards));
    s->shard_count = (uint32_t)shards;
    KVB__FRAMES_TRY(check_spec(s, what, err));
    uint64_t g = (uint64_t)s->checkpoint_granularity;
    if (s->checkpoint_granularity < 0 &&
        !kvb__mul_u64((uint64_t)s->rows_per_page, (uint64_t)s->entry_stride_tokens, &g))
        return kvb__cpd_fail(err, false, 0, "%s: rows_per_page x entry_stride_tokens overflows",
                             what);
    s->granularity = g;
    return KVB_OK;
}

static kvb_status_t parse_specs(json_t *root, kvb__frames_err_t *err, kvb__cpd_contract_t *c)
{
    json_t *arr, *e;
    size_t i;
    char what[96];
    KVB__FRAMES_TRY(
        kvb__cpd_get_array(root, C_WHAT, "group_specs", KVB__CPD_MAX_GROUPS, err, &arr));
    KVB__FRAMES_TRY(alloc_n((void **)&c->specs, json_array_size(arr), sizeof(*c->specs)));
    json_array_foreach(arr, i, e)
    {
        snprintf(what, sizeof(what), C_WHAT ": group_specs[%zu]", i);
        c->nspecs = (uint32_t)i + 1;
        KVB__FRAMES_TRY(parse_spec(e, what, err, &c->specs[i]));
    }
    return KVB_OK;
}

static kvb_status_t parse_partition(json_t *e, const char *what, kvb__frames_err_t *err,
                                    kvb__cpd_partition_t *p)
{
    json_t *pt = json_object_get(e, "partition"), *arr, *x;
    size_t i;
    uint64_t axis;
    if (pt == NULL)
        return kvb__cpd_fail(err, false, 0, "%s: missing key \"partition\"", what);
    if (!json_is_object(pt))
        return kvb__cpd_fail(err, false, 0, "%s: \"partition\" is not an object", what);
    KVB__FRAMES_TRY(kvb__cpd_get_u64(pt, what, "axis", 0, KVB__CPD_MAX_DIMS - 1, err, &axis));
    p->axis = (uint32_t)axis;
    KVB__FRAMES_TRY(
        kvb__cpd_get_u64(pt, what, "global_extent", 1, UINT32_MAX, err, &p->global_extent));
    KVB__FRAMES_TRY(kvb__cpd_get_array(pt, what, "global_parts", KVB__CPD_MAX_PARTS, err, &arr));
    json_array_foreach(arr, i, x)
    {
        if (!json_is_integer(x) || json_integer_value(x) < 1 ||
            json_integer_value(x) > (json_int_t)UINT32_MAX)
            return kvb__cpd_fail(err, false, 0, "%s has invalid global partition parts", what);
        p->parts[i] = (uint64_t)json_integer_value(x);
    }
    p->nparts = (uint32_t)json_array_size(arr);
    return KVB_OK;
}

static kvb_status_t parse_schema(json_t *root, kvb__frames_err_t *err, kvb__cpd_contract_t *c)
{
    json_t *sch = json_object_get(root, "transfer_schema"), *arr, *e;
    size_t i;
    char what[96];
    if (sch == NULL)
        return kvb__cpd_fail(err, false, 0, C_WHAT ": missing key \"transfer_schema\"");
    if (!json_is_object(sch))
        return kvb__cpd_fail(err, false, 0, C_WHAT ": \"transfer_schema\" is not an object");
    KVB__FRAMES_TRY(kvb__cpd_get_array(sch, C_WHAT ": transfer_schema", "fields",
                                       KVB__CPD_MAX_FIELDS, err, &arr));
    KVB__FRAMES_TRY(alloc_n((void **)&c->parts, json_array_size(arr), sizeof(*c->parts)));
    json_array_foreach(arr, i, e)
    {
        snprintf(what, sizeof(what), C_WHAT ": transfer_schema.fields[%zu]", i);
        if (!json_is_object(e))
            return kvb__cpd_fail(err, false, 0, "%s is not an object", what);
        KVB__FRAMES_TRY(kvb__cpd_get_id(e, what, "field_id", err, &c->parts[i].field_id));
        c->nparts = (uint32_t)i + 1;
        KVB__FRAMES_TRY(parse_partition(e, what, err, &c->parts[i]));
    }
    return KVB_OK;
}

/* ---------------------------------------------------------------- checks */

int32_t kvb__cpd_field_index(const kvb__cpd_contract_t *c, const char *id)
{
    for (uint32_t i = 0; i < c->nfields; i++)
        if (strcmp(c->fields[i].field_id, id) == 0)
            return (int32_t)i;
    return -1;
}

int32_t kvb__cpd_spec_index(const kvb__cpd_contract_t *c, const char *group_id)
{
    for (uint32_t i = 0; i < c->nspecs; i++)
        if (strcmp(c->specs[i].group_id, group_id) == 0)
            return (int32_t)i;
    return -1;
}

static int32_t group_index(const kvb__cpd_contract_t *c, const char *id)
{
    for (uint32_t i = 0; i < c->ngroups; i++)
        if (strcmp(c->groups[i].group_id, id) == 0)
            return (int32_t)i;
    return -1;
}

static int32_t plane_index(const kvb__cpd_contract_t *c, const char *id)
{
    for (uint32_t i = 0; i < c->nplanes; i++)
        if (strcmp(c->planes[i].plane_id, id) == 0)
            return (int32_t)i;
    return -1;
}

/* Ids unique per list; plan.groups and group_specs name the same groups
 * (TokenSpeed checks this when it builds its own contract, not a peer's). */
static kvb_status_t check_ids(kvb__cpd_contract_t *c, kvb__frames_err_t *err)
{
    for (uint32_t i = 0; i < c->ngroups; i++)
        if (group_index(c, c->groups[i].group_id) != (int32_t)i)
            return kvb__cpd_fail(err, false, 0, C_WHAT ": plan.groups: duplicate group \"%s\"",
                                 c->groups[i].group_id);
    for (uint32_t i = 0; i < c->nplanes; i++)
        if (plane_index(c, c->planes[i].plane_id) != (int32_t)i)
            return kvb__cpd_fail(err, false, 0, C_WHAT ": plan.planes: duplicate plane \"%s\"",
                                 c->planes[i].plane_id);
    for (uint32_t i = 0; i < c->nfields; i++)
        if (kvb__cpd_field_index(c, c->fields[i].field_id) != (int32_t)i)
            return kvb__cpd_fail(err, false, 0, C_WHAT ": plan.fields: duplicate field \"%s\"",
                                 c->fields[i].field_id);
    if (c->nspecs != c->ngroups)
        return kvb__cpd_fail(err, false, 0,
                             C_WHAT ": %u group_specs for %u plan.groups (the same groups)",
                             c->nspecs, c->ngroups);
    for (uint32_t i = 0; i < c->nspecs; i++) {
        kvb__cpd_spec_t *s = &c->specs[i];
        int32_t g = group_index(c, s->group_id);
        if (kvb__cpd_spec_index(c, s->group_id) != (int32_t)i)
            return kvb__cpd_fail(err, false, 0, C_WHAT ": group_specs: duplicate group \"%s\"",
                                 s->group_id);
        if (g < 0)
            return kvb__cpd_fail(err, false, 0,
                                 C_WHAT ": group_specs[%u] \"%s\" is not in plan.groups", i,
                                 s->group_id);
        s->group = (uint32_t)g;
    }
    return KVB_OK;
}

/* transfer_schema: CacheTransferSchema.__post_init__ and validate(plan). */
static kvb_status_t check_schema(kvb__cpd_contract_t *c, kvb__frames_err_t *err)
{
    for (uint32_t i = 0; i < c->nparts; i++) {
        kvb__cpd_partition_t *p = &c->parts[i];
        int32_t f = kvb__cpd_field_index(c, p->field_id);
        if (f < 0)
            return kvb__cpd_fail(err, false, 0,
                                 C_WHAT ": cache transfer schema references unknown field \"%s\"",
                                 p->field_id);
        if (c->fields[f].partition >= 0)
            return kvb__cpd_fail(err, false, 0,
                                 C_WHAT ": cache transfer schema contains a duplicate field \"%s\"",
                                 p->field_id);
        kvb__cpd_field_t *fd = &c->fields[f];
        if (p->axis >= fd->ndim || p->global_extent < fd->shape[p->axis])
            return kvb__cpd_fail(err, false, 0,
                                 C_WHAT ": cache field \"%s\" has invalid partition geometry",
                                 p->field_id);
        uint64_t local = fd->shape[p->axis], shards = p->global_extent / local, sum = 0;
        bool parts_ok = true;
        if (p->global_extent % local != 0)
            return kvb__cpd_fail(err, false, 0,
                                 C_WHAT ": cache field \"%s\" global partition extent is not "
                                        "divisible by its local extent",
                                 p->field_id);
        for (uint32_t k = 0; k < p->nparts; k++) {
            parts_ok = parts_ok && p->parts[k] % shards == 0;
            sum += p->parts[k]; /* each <= 2^32, at most 16 */
        }
        if (p->nparts != 0 && (!parts_ok || p->nparts < 2 || sum != p->global_extent))
            return kvb__cpd_fail(err, false, 0,
                                 C_WHAT ": cache field \"%s\" has invalid global partition parts",
                                 p->field_id);
        fd->partition = (int32_t)i;
        p->field = (uint32_t)f;
    }
    return KVB_OK;
}

/* Spec 6: the arena, every plane inside it, every page of a field inside
 * its plane and no field spilling into the next page slot. These bound the
 * addresses computed from a peer's contract (TokenSpeed trusts them). */
static kvb_status_t check_plane(const kvb__cpd_contract_t *c, uint32_t i, kvb__frames_err_t *err)
{
    const kvb__cpd_plane_t *p = &c->planes[i];
    uint64_t size, end;
    if (!kvb__mul_u64(c->num_lcm_blocks + 1, p->bytes_per_lcm, &size) ||
        !kvb__add_u64(p->arena_offset, size, &end) || end > c->arena_bytes)
        return kvb__cpd_fail(err, false, 0,
                             C_WHAT ": plane \"%s\" (offset %llu, %llu bytes per parent) lies "
                                    "outside the %llu-byte arena",
                             p->plane_id, (unsigned long long)p->arena_offset,
                             (unsigned long long)p->bytes_per_lcm,
                             (unsigned long long)c->arena_bytes);
    return KVB_OK;
}

static kvb_status_t check_field(kvb__cpd_contract_t *c, uint32_t i, kvb__frames_err_t *err)
{
    kvb__cpd_field_t *f = &c->fields[i];
    int32_t g = group_index(c, f->group_id), pl = plane_index(c, f->plane_id);
    if (g < 0 || pl < 0)
        return kvb__cpd_fail(err, false, 0, C_WHAT ": field \"%s\" names an unknown %s \"%s\"",
                             f->field_id, g < 0 ? "group" : "plane",
                             g < 0 ? f->group_id : f->plane_id);
    f->group = (uint32_t)g;
    f->plane = (uint32_t)pl;
    f->spec = (uint32_t)kvb__cpd_spec_index(c, f->group_id);
    uint64_t payload = kvb__cpd_dtype_bytes(f->dtype), slot, last, end;
    for (uint32_t d = 0; d < f->ndim; d++)
        if (!kvb__mul_u64(payload, f->shape[d], &payload))
            return kvb__cpd_fail(err, false, 0, C_WHAT ": field \"%s\" payload overflows",
                                 f->field_id);
    f->payload = payload;
    const kvb__cpd_plane_t *p = &c->planes[pl];
    /* page 0 is the last child slot of the null parent: it starts at
     * plane + bytes_per_lcm - stride, so stride <= bytes_per_lcm keeps it in
     * the plane; the last page ends at most at the plane's end. */
    if (!kvb__add_u64(f->field_offset, payload, &slot) || slot > f->page_stride ||
        f->page_stride > p->bytes_per_lcm)
        return kvb__cpd_fail(err, false, 0,
                             C_WHAT ": field \"%s\": offset %llu + payload %llu exceed its page "
                                    "stride %llu, or the stride exceeds plane \"%s\"'s %llu bytes "
                                    "per parent",
                             f->field_id, (unsigned long long)f->field_offset,
                             (unsigned long long)payload, (unsigned long long)f->page_stride,
                             p->plane_id, (unsigned long long)p->bytes_per_lcm);
    f->page0 = p->arena_offset + p->bytes_per_lcm - f->page_stride + f->field_offset;
    uint64_t plane_end = p->arena_offset + (c->num_lcm_blocks + 1) * p->bytes_per_lcm;
    if (!kvb__mul_u64(c->groups[g].page_count - 1, f->page_stride, &last) ||
        !kvb__add_u64(f->page0, last, &end) || !kvb__add_u64(end, payload, &end) || end > plane_end)
        return kvb__cpd_fail(err, false, 0,
                             C_WHAT ": field \"%s\": %llu pages of stride %llu overflow plane "
                                    "\"%s\" (outside the slab)",
                             f->field_id, (unsigned long long)c->groups[g].page_count,
                             (unsigned long long)f->page_stride, p->plane_id);
    return KVB_OK;
}

static int cmp_field_id(const void *a, const void *b, void *ctx)
{
    const kvb__cpd_contract_t *c = ctx;
    return strcmp(c->fields[*(const uint32_t *)a].field_id,
                  c->fields[*(const uint32_t *)b].field_id);
}

/* Each spec's fields by field_id (fields_for_group: the pairing order). */
static kvb_status_t sort_group_fields(kvb__cpd_contract_t *c)
{
    for (uint32_t s = 0; s < c->nspecs; s++) {
        kvb__cpd_spec_t *sp = &c->specs[s];
        sp->sorted_fields = calloc(c->nfields ? c->nfields : 1, sizeof(uint32_t));
        if (sp->sorted_fields == NULL)
            return KVB_ERR_NOMEM;
        for (uint32_t f = 0; f < c->nfields; f++)
            if (c->fields[f].spec == s)
                sp->sorted_fields[sp->nfields++] = f;
        qsort_r(sp->sorted_fields, sp->nfields, sizeof(uint32_t), cmp_field_id, c);
    }
    return KVB_OK;
}

static kvb_status_t check_geometry(kvb__cpd_contract_t *c, kvb__frames_err_t *err)
{
    uint64_t per_parent =
        c->resident_block_bytes >= 0 ? (uint64_t)c->resident_block_bytes : c->lcm_block_bytes;
    if (!kvb__mul_u64(c->num_lcm_blocks + 1, per_parent, &c->arena_bytes) ||
        c->arena_bytes > INT64_MAX)
        return kvb__cpd_fail(err, false, 0, C_WHAT ": arena size (%llu + 1) x %llu overflows",
                             (unsigned long long)c->num_lcm_blocks, (unsigned long long)per_parent);
    for (uint32_t i = 0; i < c->nplanes; i++)
        KVB__FRAMES_TRY(check_plane(c, i, err));
    for (uint32_t i = 0; i < c->nfields; i++)
        KVB__FRAMES_TRY(check_field(c, i, err));
    return KVB_OK;
}

static kvb_status_t parse_root(const uint8_t *json, size_t len, kvb__frames_err_t *err,
                               kvb__cpd_contract_t *c)
{
    if (len == 0 || len > KVB__CPD_MAX_CONTRACT_BYTES)
        return kvb__cpd_fail(
            err, false, 0, C_WHAT ": cache transfer contract payload must be 1..%u bytes, got %zu",
            KVB__CPD_MAX_CONTRACT_BYTES, len);
    json_t *root =
        kvb__cpd_json_load((const char *)json, len, C_WHAT, "cache transfer contract", err);
    if (root == NULL)
        return KVB_ERR_PROTO;
    kvb_status_t st = KVB_OK;
    if (!json_is_object(root))
        st = kvb__cpd_fail(err, false, 0,
                           C_WHAT ": cache transfer contract payload must be a JSON object");
    if (st == KVB_OK)
        st = parse_plan(root, err, c);
    if (st == KVB_OK)
        st = parse_specs(root, err, c);
    if (st == KVB_OK)
        st = parse_schema(root, err, c);
    json_decref(root);
    return st;
}

kvb_status_t kvb__cpd_contract_parse(const uint8_t *json, size_t len, kvb__frames_err_t *err,
                                     kvb__cpd_contract_t *c_p)
{
    kvb__cpd_contract_t c;
    memset(&c, 0, sizeof(c));
    c.resident_block_bytes = -1;
    kvb_status_t st = parse_root(json, len, err, &c);
    if (st == KVB_OK)
        st = check_ids(&c, err);
    if (st == KVB_OK)
        st = check_schema(&c, err);
    if (st == KVB_OK)
        st = check_geometry(&c, err);
    if (st == KVB_OK)
        st = sort_group_fields(&c);
    if (st != KVB_OK) {
        kvb__cpd_contract_free(&c);
        return st;
    }
    *c_p = c;
    return KVB_OK;
}

uint64_t kvb__cpd_page_offset(const kvb__cpd_contract_t *c, uint32_t f, uint64_t page)
{
    return c->fields[f].page0 + page * c->fields[f].page_stride;
}

uint64_t kvb__cpd_virtual_blocks(const kvb__cpd_contract_t *c, uint32_t s)
{
    const kvb__cpd_spec_t *sp = &c->specs[s];
    /* Saturate at INT64_MAX: block ids are int64, so nothing above it can
     * be named anyway. */
    uint64_t v;
    if (!kvb__mul_u64(c->groups[sp->group].page_count - 1, sp->shard_count, &v) || v >= INT64_MAX)
        return INT64_MAX;
    return v + 1;
}

/* ---------------------------------------------------------------- encoding */

static void put_key(kvb__cpd_buf_t *b, const char *key)
{
    kvb__cpd_put_jstr(b, key, strlen(key));
    kvb__cpd_put(b, ":", 1);
}

static void put_kstr(kvb__cpd_buf_t *b, const char *key, const char *v)
{
    put_key(b, key);
    kvb__cpd_put_jstr(b, v, strlen(v));
}

static void put_ku64(kvb__cpd_buf_t *b, const char *key, uint64_t v)
{
    put_key(b, key);
    kvb__cpd_put_u64(b, v);
}

static void put_kopt(kvb__cpd_buf_t *b, const char *key, int64_t v)
{
    put_key(b, key);
    kvb__cpd_put_opt(b, v);
}

static void encode_plan(kvb__cpd_buf_t *b, const kvb__cpd_contract_t *c)
{
    kvb__cpd_puts(b, "{");
    put_ku64(b, "prefix_granularity", c->prefix_granularity);
    kvb__cpd_puts(b, ",");
    put_ku64(b, "lcm_block_bytes", c->lcm_block_bytes);
    kvb__cpd_puts(b, ",");
    put_ku64(b, "num_lcm_blocks", c->num_lcm_blocks);
    kvb__cpd_puts(b, ",\"groups\":[");
    for (uint32_t i = 0; i < c->ngroups; i++) {
        kvb__cpd_puts(b, i ? ",{" : "{");
        put_kstr(b, "group_id", c->groups[i].group_id);
        kvb__cpd_puts(b, ",");
        put_ku64(b, "cache_blocks_per_lcm_block", c->groups[i].blocks_per_lcm);
        kvb__cpd_puts(b, ",");
        put_ku64(b, "page_count", c->groups[i].page_count);
        kvb__cpd_puts(b, "}");
    }
    kvb__cpd_puts(b, "],\"planes\":[");
    for (uint32_t i = 0; i < c->nplanes; i++) {
        kvb__cpd_puts(b, i ? ",{" : "{");
        put_kstr(b, "plane_id", c->planes[i].plane_id);
        kvb__cpd_puts(b, ",");
        put_ku64(b, "bytes_per_lcm_block", c->planes[i].bytes_per_lcm);
        kvb__cpd_puts(b, ",");
        put_ku64(b, "arena_offset_bytes", c->planes[i].arena_offset);
        kvb__cpd_puts(b, "}");
    }
    kvb__cpd_puts(b, "],\"fields\":[");
    for (uint32_t i = 0; i < c->nfields; i++) {
        const kvb__cpd_field_t *f = &c->fields[i];
        kvb__cpd_puts(b, i ? ",{" : "{");
        put_kstr(b, "group_id", f->group_id);
        kvb__cpd_puts(b, ",");
        put_kstr(b, "field_id", f->field_id);
        kvb__cpd_puts(b, ",");
        put_kstr(b, "plane_id", f->plane_id);
        kvb__cpd_puts(b, ",\"shape\":[");
        for (uint32_t d = 0; d < f->ndim; d++) {
            if (d)
                kvb__cpd_puts(b, ",");
            kvb__cpd_put_u64(b, f->shape[d]);
        }
        kvb__cpd_puts(b, "],");
        put_kstr(b, "dtype", kvb__cpd_dtype_name(f->dtype));
        kvb__cpd_puts(b, ",");
        put_ku64(b, "field_offset_bytes", f->field_offset);
        kvb__cpd_puts(b, ",");
        put_ku64(b, "page_stride_bytes", f->page_stride);
        kvb__cpd_puts(b, "}");
    }
    kvb__cpd_puts(b, "],");
    put_kopt(b, "resident_block_bytes", c->resident_block_bytes);
    kvb__cpd_puts(b, "}");
}

static void encode_spec(kvb__cpd_buf_t *b, const kvb__cpd_spec_t *s)
{
    static const char *const retention[] = {"full_history", "sliding_window"};
    static const char *const family[] = {"history", "state"};
    kvb__cpd_puts(b, "{");
    put_kstr(b, "group_id", s->group_id);
    kvb__cpd_puts(b, ",");
    put_kstr(b, "retention", retention[s->retention]);
    kvb__cpd_puts(b, ",");
    put_kopt(b, "rows_per_page", s->rows_per_page);
    kvb__cpd_puts(b, ",");
    put_kopt(b, "entry_stride_tokens", s->entry_stride_tokens);
    kvb__cpd_puts(b, ",");
    put_kopt(b, "sliding_window_tokens", s->sliding_window_tokens);
    kvb__cpd_puts(b, s->replayable ? ",\"replayable\":true," : ",\"replayable\":false,");
    put_kstr(b, "family", family[s->family]);
    kvb__cpd_puts(b, ",");
    put_key(b, "transfer_policy");
    if (s->policy == KVB__CPD_POLICY_NULL)
        kvb__cpd_puts(b, "null");
    else
        kvb__cpd_put_jstr(b, s->policy == KVB__CPD_FULL_SUFFIX ? "full_suffix" : "latest_snapshot",
                          s->policy == KVB__CPD_FULL_SUFFIX ? 11 : 15);
    kvb__cpd_puts(b, ",");
    put_kopt(b, "checkpoint_granularity", s->checkpoint_granularity);
    kvb__cpd_puts(b, ",");
    put_ku64(b, "shard_count", s->shard_count);
    kvb__cpd_puts(b, "}");
}

static void encode_schema(kvb__cpd_buf_t *b, const kvb__cpd_contract_t *c)
{
    kvb__cpd_puts(b, "{\"fields\":[");
    for (uint32_t i = 0; i < c->nparts; i++) {
        const kvb__cpd_partition_t *p = &c->parts[i];
        kvb__cpd_puts(b, i ? ",{" : "{");
        put_kstr(b, "field_id", p->field_id);
        kvb__cpd_puts(b, ",\"partition\":{");
        put_ku64(b, "axis", p->axis);
        kvb__cpd_puts(b, ",");
        put_ku64(b, "global_extent", p->global_extent);
        kvb__cpd_puts(b, ",\"global_parts\":[");
        for (uint32_t k = 0; k < p->nparts; k++) {
            if (k)
                kvb__cpd_puts(b, ",");
            kvb__cpd_put_u64(b, p->parts[k]);
        }
        kvb__cpd_puts(b, "]}}");
    }
    kvb__cpd_puts(b, "]}");
}

kvb_status_t kvb__cpd_contract_encode(const kvb__cpd_contract_t *c, char **json_p, size_t *len_p)
{
    kvb__cpd_buf_t b = {0};
    kvb__cpd_puts(&b, "{\"plan\":");
    encode_plan(&b, c);
    kvb__cpd_puts(&b, ",\"group_specs\":[");
    for (uint32_t i = 0; i < c->nspecs; i++) {
        if (i)
            kvb__cpd_puts(&b, ",");
        encode_spec(&b, &c->specs[i]);
    }
    kvb__cpd_puts(&b, "],\"transfer_schema\":");
    encode_schema(&b, c);
    kvb__cpd_puts(&b, "}");
    return kvb__cpd_buf_take(&b, json_p, len_p);
}
