/* Bootstrap protocol validation and (de)serialisation. Everything here runs on
 * bytes from the network: nothing is trusted until a check below passed. */
#include "proto/bootstrap_proto.h"

#include "core/core.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static bool check_rank(const char *key, int64_t rank, const char *size_key, int64_t size,
                       char *reason, size_t reason_len)
{
    if (rank >= size) {
        kvb__boot_reason(reason, reason_len, "\"%s\" = %lld must be below \"%s\" = %lld", key,
                         (long long)rank, size_key, (long long)size);
        return false;
    }
    return true;
}

/* Validated copy of the layout keys of root into a new object (NULL and a
 * reason on error; absent or null keys are skipped). */
static json_t *extract_layout(json_t *root, char *reason, size_t reason_len, bool *nomem)
{
    json_t *layout = json_object();
    json_t *v;
    bool flag;
    *nomem = false;
    if (layout == NULL)
        goto nomem;
    for (size_t k = 0; k < KVB__BOOT_N_LENS; k++) {
        v = json_object_get(root, kvb__boot_lens_keys[k]);
        if (v == NULL || json_is_null(v))
            continue;
        if (!kvb__boot_valid_lens(v, kvb__boot_lens_keys[k], reason, reason_len))
            goto invalid;
        if (json_object_set_new(layout, kvb__boot_lens_keys[k], json_deep_copy(v)) != 0)
            goto nomem;
    }
    v = json_object_get(root, KVB__BOOT_KEY_MLA_L1_5);
    if (v != NULL && !json_is_null(v)) {
        if (!kvb__boot_valid_flag(v, KVB__BOOT_KEY_MLA_L1_5, &flag, reason, reason_len))
            goto invalid;
        if (json_object_set_new(layout, KVB__BOOT_KEY_MLA_L1_5, json_boolean(flag)) != 0)
            goto nomem;
    }
    v = json_object_get(root, KVB__BOOT_KEY_DIALECT);
    if (v != NULL && !json_is_null(v)) {
        if (!json_is_string(v) || strcmp(json_string_value(v), KVB__BOOT_DIALECT_TS) != 0) {
            kvb__boot_reason(reason, reason_len, "\"%s\" must be \"%s\"", KVB__BOOT_KEY_DIALECT,
                             KVB__BOOT_DIALECT_TS);
            goto invalid;
        }
        if (json_object_set_new(layout, KVB__BOOT_KEY_DIALECT, json_string(KVB__BOOT_DIALECT_TS)))
            goto nomem;
    }
    v = json_object_get(root, KVB__BOOT_KEY_LAYOUT);
    if (v != NULL && !json_is_null(v)) {
        if (!json_is_object(v)) {
            kvb__boot_reason(reason, reason_len, "\"%s\" must be a JSON object",
                             KVB__BOOT_KEY_LAYOUT);
            goto invalid;
        }
        if (json_object_set_new(layout, KVB__BOOT_KEY_LAYOUT, json_deep_copy(v)) != 0)
            goto nomem;
    }
    return layout;
nomem:
    *nomem = true;
    kvb__boot_reason(reason, reason_len, "out of memory");
invalid:
    json_decref(layout);
    return NULL;
}

/* The optional "kvbridge" key of a registration or a look-up answer:
 * absent or null is 0. */
static bool opt_kvbridge(json_t *root, int64_t *out, char *reason, size_t reason_len)
{
    json_t *v = json_object_get(root, KVB__BOOT_KEY_KVBRIDGE);
    *out = 0;
    return v == NULL || json_is_null(v) ||
           kvb__boot_get_int(root, KVB__BOOT_KEY_KVBRIDGE, 1, KVB__BOOT_KVBRIDGE_MAX, out, reason,
                             reason_len);
}

static kvb_status_t validate_ranks(const kvb__boot_reg_t *r, char *reason, size_t reason_len)
{
    if (!check_rank("attn_tp_rank", r->attn_tp_rank, "attn_tp_size", r->attn_tp_size, reason,
                    reason_len) ||
        !check_rank("attn_dp_rank", r->attn_dp_rank, "attn_dp_size", r->attn_dp_size, reason,
                    reason_len) ||
        !check_rank("pp_rank", r->pp_rank, "pp_size", r->pp_size, reason, reason_len) ||
        !check_rank("system_dp_rank", r->system_dp_rank, "system_dp_size", r->system_dp_size,
                    reason, reason_len))
        return KVB_ERR_PROTO;
    return KVB_OK;
}

kvb_status_t kvb__boot_reg_parse(const char *body, size_t len, kvb__boot_reg_t *reg_p, char *reason,
                                 size_t reason_len)
{
    kvb__boot_reg_t r;
    json_t *root, *v;
    bool nomem = false;
    kvb_status_t st = KVB_ERR_PROTO;

    memset(&r, 0, sizeof(r));
    root = kvb__boot_load_object(body, len, "PUT /route", reason, reason_len);
    if (root == NULL)
        return KVB_ERR_PROTO;

    /* With "role": seed 001 (2026 keys optional). Without: SGLang 2026, whose
     * server needs attn_cp_* and page_size (PROTOCOL-SGLANG-2026.md 3.1). */
    /* TokenSpeed sends "role" too: told apart by world_size/engine_rank
     * first (PROTOCOL-TOKENSPEED.md 11.2). */
    if (kvb__boot_reg_is_ts(root)) {
        if (kvb__boot_reg_parse_ts(root, &r, reason, reason_len) != KVB_OK)
            goto out;
        goto ranked;
    }
    v = json_object_get(root, "role");
    if (v == NULL && json_object_get(root, "attn_cp_size") == NULL &&
        json_object_get(root, "page_size") == NULL) {
        kvb__boot_reason(reason, reason_len,
                         "missing key \"role\" (seed-001 registration) or \"attn_cp_size\" and "
                         "\"page_size\" (SGLang 2026 registration)");
        goto out;
    }
    if (v != NULL && (!json_is_string(v) || strcmp(json_string_value(v), "Prefill") != 0 ||
                      json_string_length(v) != strlen("Prefill"))) {
        kvb__boot_reason(reason, reason_len, "\"role\" must be \"Prefill\"");
        goto out;
    }
    r.has_role = v != NULL;
    if (!kvb__boot_get_int(root, "attn_tp_size", 1, KVB__BOOT_MAX_SIZE, &r.attn_tp_size, reason,
                           reason_len) ||
        !kvb__boot_get_int(root, "attn_tp_rank", 0, KVB__BOOT_MAX_SIZE - 1, &r.attn_tp_rank, reason,
                           reason_len) ||
        !kvb__boot_get_int(root, "attn_dp_size", 1, KVB__BOOT_MAX_SIZE, &r.attn_dp_size, reason,
                           reason_len) ||
        !kvb__boot_get_int(root, "attn_dp_rank", 0, KVB__BOOT_MAX_SIZE - 1, &r.attn_dp_rank, reason,
                           reason_len) ||
        !kvb__boot_get_int(root, "pp_size", 1, KVB__BOOT_MAX_SIZE, &r.pp_size, reason,
                           reason_len) ||
        !kvb__boot_get_int(root, "pp_rank", 0, KVB__BOOT_MAX_SIZE - 1, &r.pp_rank, reason,
                           reason_len) ||
        !kvb__boot_get_int(root, "system_dp_size", 1, KVB__BOOT_MAX_SIZE, &r.system_dp_size, reason,
                           reason_len) ||
        !kvb__boot_get_int(root, "system_dp_rank", 0, KVB__BOOT_MAX_SIZE - 1, &r.system_dp_rank,
                           reason, reason_len))
        goto out;
    if (validate_ranks(&r, reason, reason_len) != KVB_OK)
        goto out;
ranked:
    v = json_object_get(root, "rank_ip");
    if (v == NULL) {
        kvb__boot_reason(reason, reason_len, "missing key \"rank_ip\"");
        goto out;
    }
    if (!json_is_string(v) || !kvb__boot_valid_host(json_string_value(v), json_string_length(v))) {
        kvb__boot_reason(reason, reason_len,
                         "\"rank_ip\" must be a string of 1..%d characters [A-Za-z0-9.:%%_-]",
                         KVB_BOOTSTRAP_IP_MAX);
        goto out;
    }
    /* The seed coerces with int(), so a decimal string is accepted too. */
    v = json_object_get(root, "rank_port");
    if (v != NULL && json_is_string(v)) {
        if (!kvb__parse_i64(json_string_value(v), json_string_length(v), 1, 65535, &r.rank_port)) {
            kvb__boot_reason(reason, reason_len, "\"rank_port\" must be an integer in [1, 65535]");
            goto out;
        }
    } else if (!kvb__boot_get_int(root, "rank_port", 1, 65535, &r.rank_port, reason, reason_len)) {
        goto out;
    }

    st = kvb__boot_reg_parse_2026(root, &r, reason, reason_len);
    if (st != KVB_OK)
        goto out;
    st = KVB_ERR_PROTO;
    if (!opt_kvbridge(root, &r.kvbridge, reason, reason_len))
        goto out;
    r.layout = extract_layout(root, reason, reason_len, &nomem);
    if (r.layout == NULL) {
        st = nomem ? KVB_ERR_NOMEM : KVB_ERR_PROTO;
        goto out;
    }
    /* Its ranks speak TokenSpeed on ZeroMQ: served to kvbridge's decodes. */
    if (kvb__boot_reg_is_ts(root) &&
        json_object_set_new(r.layout, KVB__BOOT_KEY_DIALECT, json_string(KVB__BOOT_DIALECT_TS))) {
        st = KVB_ERR_NOMEM;
        goto out;
    }
    r.rank_ip = strdup(json_string_value(json_object_get(root, "rank_ip")));
    if (r.rank_ip == NULL) {
        kvb__boot_reason(reason, reason_len, "out of memory");
        st = KVB_ERR_NOMEM;
        goto out;
    }
    *reg_p = r;
    memset(&r, 0, sizeof(r));
    st = KVB_OK;
out:
    kvb__boot_reg_clear(&r);
    json_decref(root);
    return st;
}

void kvb__boot_reg_clear(kvb__boot_reg_t *reg)
{
    if (reg == NULL)
        return;
    free(reg->rank_ip);
    free(reg->kv_cache_dtype);
    free(reg->load_balance_method);
    json_decref(reg->layout);
    memset(reg, 0, sizeof(*reg));
}

json_t *kvb__boot_reg_to_json(const kvb__boot_reg_t *r)
{
    json_t *o = json_pack("{s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:s, s:I}", "attn_tp_size",
                          (json_int_t)r->attn_tp_size, "attn_tp_rank", (json_int_t)r->attn_tp_rank,
                          "attn_dp_size", (json_int_t)r->attn_dp_size, "attn_dp_rank",
                          (json_int_t)r->attn_dp_rank, "pp_size", (json_int_t)r->pp_size, "pp_rank",
                          (json_int_t)r->pp_rank, "system_dp_size", (json_int_t)r->system_dp_size,
                          "system_dp_rank", (json_int_t)r->system_dp_rank, "rank_ip", r->rank_ip,
                          "rank_port", (json_int_t)r->rank_port);
    if (o != NULL && r->has_role && json_object_set_new(o, "role", json_string("Prefill")) != 0) {
        json_decref(o);
        return NULL;
    }
    if (o != NULL && r->kvbridge > 0 &&
        json_object_set_new(o, KVB__BOOT_KEY_KVBRIDGE, json_integer((json_int_t)r->kvbridge)) !=
            0) {
        json_decref(o);
        return NULL;
    }
    if (o != NULL && r->v2026 && !kvb__boot_reg_2026_to_json(r, o)) {
        json_decref(o);
        return NULL;
    }
    if (o != NULL && r->layout != NULL && json_object_update(o, r->layout) != 0) {
        json_decref(o);
        return NULL;
    }
    return o;
}

int64_t kvb__boot_reg_dp_group(const kvb__boot_reg_t *reg)
{
    return reg->system_dp_size == 1 ? reg->attn_dp_rank : reg->system_dp_rank;
}

int64_t kvb__boot_reg_dp_size(const kvb__boot_reg_t *reg)
{
    return reg->system_dp_size == 1 ? reg->attn_dp_size : reg->system_dp_size;
}

static bool lens_to_json(json_t *layout, const char *key, const kvb_bootstrap_lens_t *lens,
                         char *reason, size_t reason_len)
{
    json_t *a;
    if (lens->count > KVB__BOOT_MAX_LENS || (lens->count > 0 && lens->values == NULL)) {
        kvb__boot_reason(reason, reason_len, "%s: at most %d values, non-NULL", key,
                         KVB__BOOT_MAX_LENS);
        return false;
    }
    a = json_array();
    if (a == NULL)
        return false;
    for (size_t i = 0; i < lens->count; i++) {
        if (lens->values[i] < 1 || lens->values[i] > (uint64_t)INT64_MAX) {
            kvb__boot_reason(reason, reason_len, "%s[%zu] must be in [1, 2^63-1]", key, i);
            json_decref(a);
            return false;
        }
        if (json_array_append_new(a, json_integer((json_int_t)lens->values[i])) != 0) {
            json_decref(a);
            return false;
        }
    }
    return json_object_set_new(layout, key, a) == 0;
}

/* The 2026 keys of a public registration (defaults where field_mask does not
 * name them). */
static kvb_status_t from_public_2026(const kvb_bootstrap_registration_t *p, kvb__boot_reg_t *r,
                                     char *reason, size_t reason_len)
{
    r->v2026 = true;
    r->attn_cp_size = 1;
    r->page_size = -1;
    if (p->field_mask & KVB_BOOTSTRAP_REG_CP) {
        r->attn_cp_size = p->attn_cp_size;
        r->attn_cp_rank = p->attn_cp_rank;
        if (r->attn_cp_size < 1 || r->attn_cp_size > KVB__BOOT_MAX_SIZE || r->attn_cp_rank < 0 ||
            r->attn_cp_rank >= r->attn_cp_size) {
            kvb__boot_reason(reason, reason_len,
                             "attn_cp_size must be in [1, %d], attn_cp_rank below it",
                             KVB__BOOT_MAX_SIZE);
            return KVB_ERR_INVALID;
        }
    }
    if (p->field_mask & KVB_BOOTSTRAP_REG_PAGE_SIZE) {
        if (p->page_size < 1) {
            kvb__boot_reason(reason, reason_len, "page_size must be >= 1");
            return KVB_ERR_INVALID;
        }
        r->page_size = p->page_size;
    }
    const char *words[2] = {
        (p->field_mask & KVB_BOOTSTRAP_REG_KV_CACHE_DTYPE) ? p->kv_cache_dtype : NULL,
        (p->field_mask & KVB_BOOTSTRAP_REG_LOAD_BALANCE) ? p->load_balance_method : NULL};
    char **outs[2] = {&r->kv_cache_dtype, &r->load_balance_method};
    for (int k = 0; k < 2; k++) {
        if (words[k] == NULL)
            continue;
        if (!kvb__boot_valid_word(words[k], strlen(words[k]))) {
            kvb__boot_reason(reason, reason_len, "%s must be 1..%d characters [A-Za-z0-9_.:+-]",
                             k == 0 ? "kv_cache_dtype" : "load_balance_method", KVB__BOOT_WORD_MAX);
            return KVB_ERR_INVALID;
        }
        if ((*outs[k] = strdup(words[k])) == NULL) {
            kvb__boot_reason(reason, reason_len, "out of memory");
            return KVB_ERR_NOMEM;
        }
    }
    if (p->field_mask & KVB_BOOTSTRAP_REG_DSA_SPLIT)
        r->enable_dsa_cache_layer_split = p->enable_dsa_cache_layer_split != 0;
    if (p->field_mask & KVB_BOOTSTRAP_REG_HTTP_PORT)
        r->prefill_http_port = p->prefill_http_port;
    return KVB_OK;
}

kvb_status_t kvb__boot_reg_from_public(const kvb_bootstrap_registration_t *p, int dialect,
                                       kvb__boot_reg_t *reg_p, char *reason, size_t reason_len)
{
    kvb__boot_reg_t r;
    const kvb_bootstrap_lens_t *lens[KVB__BOOT_N_LENS];
    const uint64_t lens_bits[KVB__BOOT_N_LENS] = {
        KVB_BOOTSTRAP_REG_KV_ITEM_LENS, KVB_BOOTSTRAP_REG_KV_UNIT_LENS,
        KVB_BOOTSTRAP_REG_STATE_ITEM_LENS, KVB_BOOTSTRAP_REG_STATE_UNIT_LENS};

    memset(&r, 0, sizeof(r));
    if (p == NULL) {
        kvb__boot_reason(reason, reason_len, "registration is NULL");
        return KVB_ERR_INVALID;
    }
    r.attn_tp_size = p->attn_tp_size;
    r.attn_tp_rank = p->attn_tp_rank;
    r.attn_dp_size = p->attn_dp_size;
    r.attn_dp_rank = p->attn_dp_rank;
    r.pp_size = p->pp_size;
    r.pp_rank = p->pp_rank;
    r.system_dp_size = p->system_dp_size;
    r.system_dp_rank = p->system_dp_rank;
    r.rank_port = p->rank_port;
    if (r.attn_tp_size < 1 || r.attn_tp_size > KVB__BOOT_MAX_SIZE || r.attn_dp_size < 1 ||
        r.attn_dp_size > KVB__BOOT_MAX_SIZE || r.pp_size < 1 || r.pp_size > KVB__BOOT_MAX_SIZE ||
        r.system_dp_size < 1 || r.system_dp_size > KVB__BOOT_MAX_SIZE) {
        kvb__boot_reason(reason, reason_len, "sizes must be in [1, %d]", KVB__BOOT_MAX_SIZE);
        return KVB_ERR_INVALID;
    }
    if (r.attn_tp_rank < 0 || r.attn_dp_rank < 0 || r.pp_rank < 0 || r.system_dp_rank < 0) {
        kvb__boot_reason(reason, reason_len, "ranks must not be negative");
        return KVB_ERR_INVALID;
    }
    if (validate_ranks(&r, reason, reason_len) != KVB_OK)
        return KVB_ERR_INVALID;
    if (r.rank_port < 1) {
        kvb__boot_reason(reason, reason_len, "rank_port must be in [1, 65535]");
        return KVB_ERR_INVALID;
    }
    if (p->rank_ip == NULL || !kvb__boot_valid_host(p->rank_ip, strlen(p->rank_ip))) {
        kvb__boot_reason(reason, reason_len, "rank_ip must be 1..%d characters [A-Za-z0-9.:%%_-]",
                         KVB_BOOTSTRAP_IP_MAX);
        return KVB_ERR_INVALID;
    }
    r.layout = json_object();
    r.rank_ip = strdup(p->rank_ip);
    if (r.layout == NULL || r.rank_ip == NULL)
        goto nomem;
    r.has_role = true;
    r.attn_cp_size = 1;
    r.page_size = -1;
    r.kvbridge = (p->field_mask & KVB_BOOTSTRAP_REG_KVBRIDGE) ? KVB_BOOTSTRAP_KVBRIDGE_VERSION : 0;
    if (dialect == KVB_BOOTSTRAP_DIALECT_2026) {
        kvb_status_t st = from_public_2026(p, &r, reason, reason_len);
        if (st != KVB_OK) {
            kvb__boot_reg_clear(&r);
            return st;
        }
    }
    lens[0] = &p->kv_item_lens;
    lens[1] = &p->kv_unit_lens;
    lens[2] = &p->state_item_lens;
    lens[3] = &p->state_unit_lens;
    for (size_t k = 0; k < KVB__BOOT_N_LENS; k++) {
        if (!(p->field_mask & lens_bits[k]))
            continue;
        reason[0] = '\0';
        if (!lens_to_json(r.layout, kvb__boot_lens_keys[k], lens[k], reason, reason_len)) {
            if (reason[0] == '\0')
                goto nomem;
            kvb__boot_reg_clear(&r);
            return KVB_ERR_INVALID;
        }
    }
    if ((p->field_mask & KVB_BOOTSTRAP_REG_MLA_L1_5_CACHE) &&
        json_object_set_new(r.layout, KVB__BOOT_KEY_MLA_L1_5,
                            json_boolean(p->enable_mla_l1_5_cache != 0)) != 0)
        goto nomem;
    if (p->field_mask & KVB_BOOTSTRAP_REG_LAYOUT_JSON) {
        json_error_t jerr;
        json_t *l = p->layout_json != NULL
                        ? json_loads(p->layout_json, JSON_REJECT_DUPLICATES, &jerr)
                        : NULL;
        if (l == NULL || !json_is_object(l)) {
            json_decref(l);
            kvb__boot_reason(reason, reason_len, "layout_json must be a JSON object");
            kvb__boot_reg_clear(&r);
            return KVB_ERR_INVALID;
        }
        if (json_object_set_new(r.layout, KVB__BOOT_KEY_LAYOUT, l) != 0)
            goto nomem;
    }
    *reg_p = r;
    return KVB_OK;
nomem:
    kvb__boot_reg_clear(&r);
    kvb__boot_reason(reason, reason_len, "out of memory");
    return KVB_ERR_NOMEM;
}

/* ---------------------------------------------------------------- queries */

static bool parse_rank_value(const char *name, const char *v, int64_t *out, char *reason,
                             size_t reason_len)
{
    if (!kvb__parse_i64(v, strlen(v), -1, INT32_MAX, out)) {
        char text[48];
        kvb__boot_sanitize(v, strlen(v), 24, text, sizeof(text));
        kvb__boot_reason(reason, reason_len, "%s=\"%s\" is not an integer in [-1, %d]", name, text,
                         INT32_MAX);
        return false;
    }
    return true;
}

kvb__boot_query_result_t kvb__boot_query_parse(const char *engine_rank, const char *dp_group,
                                               const char *pp_rank, kvb__boot_query_t *query_p,
                                               char *reason, size_t reason_len)
{
    kvb__boot_query_t q;
    memset(&q, 0, sizeof(q));
    if (engine_rank == NULL || engine_rank[0] == '\0' || dp_group == NULL || dp_group[0] == '\0') {
        kvb__boot_reason(reason, reason_len, "%s", KVB__BOOT_MSG_MISSING);
        return KVB__BOOT_QUERY_MISSING;
    }
    if (!parse_rank_value("engine_rank", engine_rank, &q.engine_rank, reason, reason_len) ||
        !parse_rank_value("target_dp_group", dp_group, &q.dp_group, reason, reason_len))
        return KVB__BOOT_QUERY_INVALID;
    bool pp_given = pp_rank != NULL && pp_rank[0] != '\0';
    if (pp_given && !parse_rank_value("target_pp_rank", pp_rank, &q.pp_rank, reason, reason_len))
        return KVB__BOOT_QUERY_INVALID;
    if (q.engine_rank == -1 && q.dp_group == -1) {
        if (pp_given && q.pp_rank != -1) {
            kvb__boot_reason(reason, reason_len,
                             "engine_rank=-1&target_dp_group=-1 asks for the parallel info; "
                             "target_pp_rank must be -1 or absent");
            return KVB__BOOT_QUERY_INVALID;
        }
        q.parallel_info = true;
        q.pp_rank = -1;
        *query_p = q;
        return KVB__BOOT_QUERY_OK;
    }
    if (!pp_given)
        q.pp_rank = 0;
    if (q.engine_rank < 0 || q.dp_group < 0 || q.pp_rank < 0) {
        kvb__boot_reason(reason, reason_len,
                         "-1 is only valid as engine_rank=-1&target_dp_group=-1 (parallel info)");
        return KVB__BOOT_QUERY_INVALID;
    }
    *query_p = q;
    return KVB__BOOT_QUERY_OK;
}

static int hexval(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* Percent-decode s[0..len) into a new NUL-terminated string; NULL on a bad
 * escape, an embedded NUL or no memory (*nomem tells which). */
static char *pct_decode(const char *s, size_t len, bool *nomem)
{
    char *out = malloc(len + 1);
    size_t o = 0;
    *nomem = out == NULL;
    if (out == NULL)
        return NULL;
    for (size_t i = 0; i < len; i++) {
        char c = s[i];
        if (c == '%') {
            int hi, lo;
            if (i + 2 >= len) {
                free(out);
                return NULL;
            }
            hi = hexval(s[i + 1]);
            lo = hexval(s[i + 2]);
            if (hi < 0 || lo < 0) {
                free(out);
                return NULL;
            }
            c = (char)(hi * 16 + lo);
            i += 2;
        } else if (c == '+') {
            c = ' ';
        }
        if (c == '\0') {
            free(out);
            return NULL;
        }
        out[o++] = c;
    }
    out[o] = '\0';
    return out;
}

static bool given(const char *v)
{
    return v != NULL && v[0] != '\0';
}

/* 2026 query (PROTOCOL-SGLANG-2026.md 3.2): four keys, each in [-1, 2^31-1];
 * all -1 = parallel info; a -1 among other values is a look-up that finds
 * nothing (SGLang answers 404). */
static kvb__boot_query_result_t parse_2026(const kvb__boot_query_vals_t *v, kvb__boot_query_t *q,
                                           char *reason, size_t reason_len)
{
    if (!given(v->prefill_dp_rank) || !given(v->prefill_cp_rank) || !given(v->target_tp_rank) ||
        !given(v->target_pp_rank)) {
        kvb__boot_reason(reason, reason_len, "%s", KVB__BOOT_MSG_MISSING);
        return KVB__BOOT_QUERY_MISSING;
    }
    if (!parse_rank_value("prefill_dp_rank", v->prefill_dp_rank, &q->dp_group, reason,
                          reason_len) ||
        !parse_rank_value("prefill_cp_rank", v->prefill_cp_rank, &q->cp_rank, reason, reason_len) ||
        !parse_rank_value("target_tp_rank", v->target_tp_rank, &q->engine_rank, reason,
                          reason_len) ||
        !parse_rank_value("target_pp_rank", v->target_pp_rank, &q->pp_rank, reason, reason_len))
        return KVB__BOOT_QUERY_INVALID;
    q->v2026 = true;
    q->parallel_info =
        q->dp_group == -1 && q->cp_rank == -1 && q->engine_rank == -1 && q->pp_rank == -1;
    if (given(v->kvbridge_layout)) {
        if (strcmp(v->kvbridge_layout, "0") != 0 && strcmp(v->kvbridge_layout, "1") != 0) {
            kvb__boot_reason(reason, reason_len, "kvbridge_layout must be 0 or 1");
            return KVB__BOOT_QUERY_INVALID;
        }
        q->want_layout = v->kvbridge_layout[0] == '1';
    }
    return KVB__BOOT_QUERY_OK;
}

kvb__boot_query_result_t kvb__boot_query_parse_vals(const kvb__boot_query_vals_t *v,
                                                    kvb__boot_query_t *query_p, char *reason,
                                                    size_t reason_len)
{
    kvb__boot_query_t q;
    kvb__boot_query_result_t res;
    if (!given(v->prefill_dp_rank) && !given(v->prefill_cp_rank) && !given(v->target_tp_rank))
        return kvb__boot_query_parse(v->engine_rank, v->target_dp_group, v->target_pp_rank, query_p,
                                     reason, reason_len);
    memset(&q, 0, sizeof(q));
    res = parse_2026(v, &q, reason, reason_len);
    if (res == KVB__BOOT_QUERY_OK)
        *query_p = q;
    return res;
}

#define NQ 7

kvb__boot_query_result_t kvb__boot_query_parse_string(const char *qs, size_t len,
                                                      kvb__boot_query_t *query_p, char *reason,
                                                      size_t reason_len)
{
    static const char *const names[NQ] = {"engine_rank",     "target_dp_group", "target_pp_rank",
                                          "prefill_dp_rank", "prefill_cp_rank", "target_tp_rank",
                                          "kvbridge_layout"};
    char *vals[NQ] = {NULL};
    kvb__boot_query_result_t res = KVB__BOOT_QUERY_INVALID;
    size_t pos = 0;
    bool nomem = false;

    while (qs != NULL && pos < len) {
        const char *seg = qs + pos;
        const char *amp = memchr(seg, '&', len - pos);
        size_t seg_len = amp != NULL ? (size_t)(amp - seg) : len - pos;
        const char *eq = memchr(seg, '=', seg_len);
        pos += seg_len + 1;
        if (eq == NULL)
            continue; /* "key" without a value: absent */
        char *key = pct_decode(seg, (size_t)(eq - seg), &nomem);
        if (key == NULL) {
            kvb__boot_reason(reason, reason_len,
                             nomem ? "out of memory" : "query string has a bad %%-escape");
            goto out;
        }
        for (int k = 0; k < NQ; k++) {
            if (vals[k] == NULL && strcmp(key, names[k]) == 0) {
                vals[k] = pct_decode(eq + 1, seg_len - (size_t)(eq - seg) - 1, &nomem);
                if (vals[k] == NULL) {
                    free(key);
                    kvb__boot_reason(reason, reason_len,
                                     nomem ? "out of memory" : "query string has a bad %%-escape");
                    goto out;
                }
                break;
            }
        }
        free(key);
    }
    kvb__boot_query_vals_t qv = {vals[0], vals[1], vals[2], vals[3], vals[4], vals[5], vals[6]};
    res = kvb__boot_query_parse_vals(&qv, query_p, reason, reason_len);
out:
    for (int k = 0; k < NQ; k++)
        free(vals[k]);
    return res;
}

/* ---------------------------------------------------------------- answers */

kvb_status_t kvb__boot_rank_addr_parse(const char *body, size_t len,
                                       kvb_bootstrap_rank_addr_t *addr_p, int *kvbridge_p,
                                       char *reason, size_t reason_len)
{
    json_t *root = kvb__boot_load_object(body, len, "rank info", reason, reason_len);
    json_t *ip;
    int64_t port, kvbridge;
    if (root == NULL)
        return KVB_ERR_PROTO;
    ip = json_object_get(root, "rank_ip");
    if (ip == NULL || !json_is_string(ip) ||
        !kvb__boot_valid_host(json_string_value(ip), json_string_length(ip))) {
        kvb__boot_reason(reason, reason_len, "\"rank_ip\" missing or not a valid address string");
        json_decref(root);
        return KVB_ERR_PROTO;
    }
    if (!kvb__boot_get_int(root, "rank_port", 1, 65535, &port, reason, reason_len) ||
        !opt_kvbridge(root, &kvbridge, reason, reason_len)) {
        json_decref(root);
        return KVB_ERR_PROTO;
    }
    if (kvbridge_p != NULL)
        *kvbridge_p = (int)kvbridge;
    memcpy(addr_p->rank_ip, json_string_value(ip), json_string_length(ip));
    addr_p->rank_ip[json_string_length(ip)] = '\0';
    addr_p->rank_port = (uint16_t)port;
    json_decref(root);
    return KVB_OK;
}

kvb_status_t kvb__boot_parallel_info_parse(const char *body, size_t len,
                                           kvb_bootstrap_parallel_info_t *info_p, char *reason,
                                           size_t reason_len)
{
    kvb_bootstrap_parallel_info_t info;
    json_t *root;
    int64_t tp, dp, pp;
    bool nomem = false;

    memset(&info, 0, sizeof(info));
    root = kvb__boot_load_object(body, len, "parallel info", reason, reason_len);
    if (root == NULL)
        return KVB_ERR_PROTO;
    if (!kvb__boot_get_int(root, "prefill_attn_tp_size", 1, KVB__BOOT_MAX_SIZE, &tp, reason,
                           reason_len) ||
        !kvb__boot_get_int(root, "prefill_dp_size", 1, KVB__BOOT_MAX_SIZE, &dp, reason,
                           reason_len) ||
        !kvb__boot_get_int(root, "prefill_pp_size", 1, KVB__BOOT_MAX_SIZE, &pp, reason, reason_len))
        goto fail;
    info.attn_tp_size = (int32_t)tp;
    info.dp_size = (int32_t)dp;
    info.pp_size = (int32_t)pp;
    if (!kvb__boot_info_layout_parse(root, &info, &nomem, reason, reason_len))
        goto fail;
    json_decref(root);
    *info_p = info;
    return KVB_OK;
fail:
    json_decref(root);
    kvb_bootstrap_parallel_info_free(&info);
    return nomem ? KVB_ERR_NOMEM : KVB_ERR_PROTO;
}

/* The 2026-only fields of a PrefillServerInfo answer into ext (defaults for
 * null). */
static bool info_2026_fields(json_t *root, kvb_bootstrap_parallel_info_ext_t *e, char *reason,
                             size_t reason_len)
{
    json_t *v;
    bool flag;
    int64_t x;
    memset(e, 0, sizeof(*e));
    e->dialect = KVB_BOOTSTRAP_DIALECT_2026;
    e->page_size = -1;
    e->follow_bootstrap_room = 1;
    if (!kvb__boot_get_int(root, "attn_cp_size", 1, KVB__BOOT_MAX_SIZE, &x, reason, reason_len))
        return false;
    e->attn_cp_size = (int32_t)x;
    v = json_object_get(root, "page_size");
    if (v != NULL && !json_is_null(v)) {
        if (!kvb__boot_get_int(root, "page_size", 1, INT32_MAX, &x, reason, reason_len))
            return false;
        e->page_size = (int32_t)x;
    }
    v = json_object_get(root, "kv_cache_dtype");
    if (v != NULL && !json_is_null(v)) {
        if (!json_is_string(v) ||
            !kvb__boot_valid_word(json_string_value(v), json_string_length(v))) {
            kvb__boot_reason(reason, reason_len,
                             "\"kv_cache_dtype\" must be null or 1..%d "
                             "characters [A-Za-z0-9_.:+-]",
                             KVB__BOOT_WORD_MAX);
            return false;
        }
        memcpy(e->kv_cache_dtype, json_string_value(v), json_string_length(v) + 1);
    }
    static const char *const flags[2] = {"follow_bootstrap_room", "enable_dsa_cache_layer_split"};
    int *outs[2] = {&e->follow_bootstrap_room, &e->enable_dsa_cache_layer_split};
    for (int k = 0; k < 2; k++) {
        v = json_object_get(root, flags[k]);
        if (v == NULL || json_is_null(v))
            continue;
        if (!kvb__boot_valid_flag(v, flags[k], &flag, reason, reason_len))
            return false;
        *outs[k] = flag;
    }
    v = json_object_get(root, "prefill_http_port");
    if (v != NULL && !json_is_null(v)) {
        if (!kvb__boot_get_int(root, "prefill_http_port", 1, 65535, &x, reason, reason_len))
            return false;
        e->prefill_http_port = (int32_t)x;
    }
    return true;
}

/* Copy the fields of src that dst->field_mask names. */
static void ext_copy(kvb_bootstrap_parallel_info_ext_t *dst,
                     const kvb_bootstrap_parallel_info_ext_t *src)
{
    uint64_t m = dst->field_mask;
    if (m & KVB_BOOTSTRAP_INFO_DIALECT)
        dst->dialect = src->dialect;
    if (m & KVB_BOOTSTRAP_INFO_CP_SIZE)
        dst->attn_cp_size = src->attn_cp_size;
    if (m & KVB_BOOTSTRAP_INFO_PAGE_SIZE)
        dst->page_size = src->page_size;
    if (m & KVB_BOOTSTRAP_INFO_KV_CACHE_DTYPE)
        memcpy(dst->kv_cache_dtype, src->kv_cache_dtype, sizeof(dst->kv_cache_dtype));
    if (m & KVB_BOOTSTRAP_INFO_FOLLOW_ROOM)
        dst->follow_bootstrap_room = src->follow_bootstrap_room;
    if (m & KVB_BOOTSTRAP_INFO_DSA_SPLIT)
        dst->enable_dsa_cache_layer_split = src->enable_dsa_cache_layer_split;
    if (m & KVB_BOOTSTRAP_INFO_HTTP_PORT)
        dst->prefill_http_port = src->prefill_http_port;
}

void kvb__boot_info_ext_default(kvb_bootstrap_parallel_info_ext_t *ext_p)
{
    kvb_bootstrap_parallel_info_ext_t e;
    if (ext_p == NULL)
        return;
    memset(&e, 0, sizeof(e));
    e.dialect = KVB_BOOTSTRAP_DIALECT_2025;
    e.attn_cp_size = 1;
    e.page_size = -1;
    e.follow_bootstrap_room = 1;
    ext_copy(ext_p, &e);
}

kvb_status_t kvb__boot_parallel_info_parse_2026(const char *body, size_t len,
                                                kvb_bootstrap_parallel_info_t *info_p,
                                                kvb_bootstrap_parallel_info_ext_t *ext_p,
                                                char *reason, size_t reason_len)
{
    kvb_bootstrap_parallel_info_t info;
    kvb_bootstrap_parallel_info_ext_t e;
    json_t *root;
    int64_t tp, dp, pp;
    bool nomem = false;

    memset(&info, 0, sizeof(info));
    root = kvb__boot_load_object(body, len, "parallel info", reason, reason_len);
    if (root == NULL)
        return KVB_ERR_PROTO;
    if (!kvb__boot_get_int(root, "attn_tp_size", 1, KVB__BOOT_MAX_SIZE, &tp, reason, reason_len) ||
        !kvb__boot_get_int(root, "dp_size", 1, KVB__BOOT_MAX_SIZE, &dp, reason, reason_len) ||
        !kvb__boot_get_int(root, "pp_size", 1, KVB__BOOT_MAX_SIZE, &pp, reason, reason_len) ||
        !info_2026_fields(root, &e, reason, reason_len))
        goto fail;
    info.attn_tp_size = (int32_t)tp;
    info.dp_size = (int32_t)dp;
    info.pp_size = (int32_t)pp;
    if (!kvb__boot_info_layout_parse(root, &info, &nomem, reason, reason_len))
        goto fail;
    json_decref(root);
    *info_p = info;
    if (ext_p != NULL)
        ext_copy(ext_p, &e);
    return KVB_OK;
fail:
    json_decref(root);
    kvb_bootstrap_parallel_info_free(&info);
    return nomem ? KVB_ERR_NOMEM : KVB_ERR_PROTO;
}
