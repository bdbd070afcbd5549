/* The SGLang 2026 parts of the bootstrap protocol (PROTOCOL-SGLANG-2026.md
 * 3.1, 3.5): the registration keys SGLang added, and the bodies of
 * /register_dp_rank and /query_dp_ranks. Untrusted bytes, as in
 * bootstrap_json.c. */
#include "proto/bootstrap_proto.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static bool get_word(json_t *root, const char *key, bool required, char **out, bool *nomem,
                     char *reason, size_t reason_len)
{
    json_t *v = json_object_get(root, key);
    *out = NULL;
    if (v == NULL && required) {
        kvb__boot_reason(reason, reason_len,
                         "missing key \"%s\" (a registration without \"role\" is SGLang 2026's, "
                         "which needs it)",
                         key);
        return false;
    }
    if (v == NULL || json_is_null(v))
        return true;
    if (!json_is_string(v) || !kvb__boot_valid_word(json_string_value(v), json_string_length(v))) {
        kvb__boot_reason(reason, reason_len,
                         "\"%s\" must be null or a string of 1..%d characters [A-Za-z0-9_.:+-]",
                         key, KVB__BOOT_WORD_MAX);
        return false;
    }
    *out = strdup(json_string_value(v));
    if (*out == NULL) {
        *nomem = true;
        kvb__boot_reason(reason, reason_len, "out of memory");
        return false;
    }
    return true;
}

/* attn_cp_size / attn_cp_rank: both or neither (neither: 1 / 0). */
static bool parse_cp(json_t *root, bool required, kvb__boot_reg_t *r, char *reason,
                     size_t reason_len)
{
    bool any = json_object_get(root, "attn_cp_size") != NULL ||
               json_object_get(root, "attn_cp_rank") != NULL;
    if (!required && !any)
        return true;
    if (!kvb__boot_get_int(root, "attn_cp_size", 1, KVB__BOOT_MAX_SIZE, &r->attn_cp_size, reason,
                           reason_len) ||
        !kvb__boot_get_int(root, "attn_cp_rank", 0, KVB__BOOT_MAX_SIZE - 1, &r->attn_cp_rank,
                           reason, reason_len))
        return false;
    if (r->attn_cp_rank >= r->attn_cp_size) {
        kvb__boot_reason(reason, reason_len,
                         "\"attn_cp_rank\" = %lld must be below \"attn_cp_size\" = %lld",
                         (long long)r->attn_cp_rank, (long long)r->attn_cp_size);
        return false;
    }
    return true;
}

/* page_size: SGLang's 2026 server applies int() (a null is its 500); a
 * seed-001-shaped body may leave it out or null. */
static bool parse_page_size(json_t *root, bool required, kvb__boot_reg_t *r, char *reason,
                            size_t reason_len)
{
    json_t *v = json_object_get(root, "page_size");
    if (v == NULL || json_is_null(v)) {
        if (required) {
            kvb__boot_reason(reason, reason_len,
                             "\"page_size\" must be an integer (a registration without \"role\" "
                             "is SGLang 2026's, which needs it)");
            return false;
        }
        return true;
    }
    return kvb__boot_get_intish(v, "page_size", 1, INT32_MAX, &r->page_size, reason, reason_len);
}

static const char *const g_2026_keys[] = {"attn_cp_size",        "attn_cp_rank",
                                          "page_size",           "kv_cache_dtype",
                                          "load_balance_method", "enable_dsa_cache_layer_split",
                                          "prefill_http_port"};

kvb_status_t kvb__boot_reg_parse_2026(json_t *root, kvb__boot_reg_t *r, char *reason,
                                      size_t reason_len)
{
    bool required = !r->has_role, nomem = false, flag = false;
    json_t *v;

    r->attn_cp_size = 1;
    r->attn_cp_rank = 0;
    r->page_size = -1;
    r->v2026 = required;
    for (size_t k = 0; k < sizeof(g_2026_keys) / sizeof(g_2026_keys[0]); k++)
        if (json_object_get(root, g_2026_keys[k]) != NULL)
            r->v2026 = true;
    if (!parse_cp(root, required, r, reason, reason_len) ||
        !parse_page_size(root, required, r, reason, reason_len) ||
        !get_word(root, "kv_cache_dtype", required, &r->kv_cache_dtype, &nomem, reason,
                  reason_len) ||
        !get_word(root, "load_balance_method", false, &r->load_balance_method, &nomem, reason,
                  reason_len))
        goto fail;
    v = json_object_get(root, "enable_dsa_cache_layer_split");
    if (v != NULL && !json_is_null(v)) {
        if (!kvb__boot_valid_flag(v, "enable_dsa_cache_layer_split", &flag, reason, reason_len))
            goto fail;
        r->enable_dsa_cache_layer_split = flag;
    }
    v = json_object_get(root, "prefill_http_port");
    if (v != NULL && !json_is_null(v) &&
        !kvb__boot_get_intish(v, "prefill_http_port", 1, 65535, &r->prefill_http_port, reason,
                              reason_len))
        goto fail;
    return KVB_OK;
fail:
    free(r->kv_cache_dtype);
    free(r->load_balance_method);
    r->kv_cache_dtype = r->load_balance_method = NULL;
    return nomem ? KVB_ERR_NOMEM : KVB_ERR_PROTO;
}

static json_t *int_or_null(int64_t v, int64_t null_value)
{
    return v == null_value ? json_null() : json_integer((json_int_t)v);
}

bool kvb__boot_reg_2026_to_json(const kvb__boot_reg_t *r, json_t *o)
{
    bool ok =
        json_object_set_new(o, "attn_cp_size", json_integer((json_int_t)r->attn_cp_size)) == 0 &&
        json_object_set_new(o, "attn_cp_rank", json_integer((json_int_t)r->attn_cp_rank)) == 0 &&
        json_object_set_new(o, "page_size", int_or_null(r->page_size, -1)) == 0 &&
        json_object_set_new(o, "kv_cache_dtype",
                            r->kv_cache_dtype != NULL ? json_string(r->kv_cache_dtype)
                                                      : json_null()) == 0 &&
        json_object_set_new(o, "enable_dsa_cache_layer_split",
                            json_boolean(r->enable_dsa_cache_layer_split)) == 0 &&
        json_object_set_new(o, "prefill_http_port", int_or_null(r->prefill_http_port, 0)) == 0;
    if (ok && r->load_balance_method != NULL)
        ok =
            json_object_set_new(o, "load_balance_method", json_string(r->load_balance_method)) == 0;
    return ok;
}

/* ------------------------------------------------------- DP rank routes */

/* A room: a JSON integer >= 0, or a decimal string up to 2^64-1 (SGLang's
 * int(); rooms are 64-bit on the wire). */
static bool get_room(json_t *v, const char *what, uint64_t *out, char *reason, size_t reason_len)
{
    if (json_is_integer(v) && json_integer_value(v) >= 0) {
        *out = (uint64_t)json_integer_value(v);
        return true;
    }
    if (json_is_string(v)) {
        const char *s = json_string_value(v);
        size_t n = json_string_length(v);
        uint64_t x = 0;
        bool ok = n >= 1 && n <= 20;
        for (size_t i = 0; ok && i < n; i++) {
            unsigned d = (unsigned)(s[i] - '0');
            if (d > 9 || x > (UINT64_MAX - d) / 10)
                ok = false;
            else
                x = x * 10 + d;
        }
        if (ok) {
            *out = x;
            return true;
        }
    }
    kvb__boot_reason(reason, reason_len, "%s must be an integer in [0, 2^64-1]", what);
    return false;
}

kvb_status_t kvb__boot_dp_rank_parse(const char *body, size_t len, uint64_t *room_p,
                                     int64_t *dp_rank_p, char *reason, size_t reason_len)
{
    json_t *root = kvb__boot_load_object(body, len, "POST /register_dp_rank", reason, reason_len);
    json_t *room, *dp;
    uint64_t r;
    int64_t d;
    bool ok;
    if (root == NULL)
        return KVB_ERR_PROTO;
    room = json_object_get(root, "bootstrap_room");
    dp = json_object_get(root, "dp_rank");
    if (room == NULL || dp == NULL) {
        kvb__boot_reason(reason, reason_len, "missing key \"%s\"",
                         room == NULL ? "bootstrap_room" : "dp_rank");
        json_decref(root);
        return KVB_ERR_PROTO;
    }
    ok = get_room(room, "\"bootstrap_room\"", &r, reason, reason_len) &&
         kvb__boot_get_intish(dp, "dp_rank", 0, KVB__BOOT_MAX_SIZE - 1, &d, reason, reason_len);
    json_decref(root);
    if (!ok)
        return KVB_ERR_PROTO;
    *room_p = r;
    *dp_rank_p = d;
    return KVB_OK;
}

kvb_status_t kvb__boot_dp_query_parse(const char *body, size_t len, uint64_t **rooms_p, size_t *n_p,
                                      char *reason, size_t reason_len)
{
    json_t *root = kvb__boot_load_object(body, len, "POST /query_dp_ranks", reason, reason_len);
    json_t *list, *e;
    uint64_t *rooms = NULL;
    size_t i, n;
    if (root == NULL)
        return KVB_ERR_PROTO;
    list = json_object_get(root, "bootstrap_rooms");
    if (list == NULL || !json_is_array(list)) {
        kvb__boot_reason(reason, reason_len, "\"bootstrap_rooms\" must be a list of rooms");
        goto fail;
    }
    n = json_array_size(list);
    if (n > KVB__BOOT_MAX_QUERY_ROOMS) {
        kvb__boot_reason(reason, reason_len, "\"bootstrap_rooms\" has %zu rooms, more than %d", n,
                         KVB__BOOT_MAX_QUERY_ROOMS);
        goto fail;
    }
    if (n > 0 && (rooms = calloc(n, sizeof(*rooms))) == NULL) {
        kvb__boot_reason(reason, reason_len, "out of memory");
        json_decref(root);
        return KVB_ERR_NOMEM;
    }
    json_array_foreach(list, i, e)
    {
        char what[48];
        snprintf(what, sizeof(what), "\"bootstrap_rooms\"[%zu]", i);
        if (!get_room(e, what, &rooms[i], reason, reason_len))
            goto fail;
    }
    json_decref(root);
    *rooms_p = rooms;
    *n_p = n;
    return KVB_OK;
fail:
    free(rooms);
    json_decref(root);
    return KVB_ERR_PROTO;
}

kvb_status_t kvb__boot_dp_answer_parse(const char *body, size_t len, const uint64_t *rooms,
                                       size_t n, int32_t *dp_ranks, char *reason, size_t reason_len)
{
    json_t *root = kvb__boot_load_object(body, len, "query_dp_ranks answer", reason, reason_len);
    const char *key;
    json_t *v;
    if (root == NULL)
        return KVB_ERR_PROTO;
    json_object_foreach(root, key, v)
    {
        if (!json_is_integer(v) || json_integer_value(v) < 0 ||
            json_integer_value(v) >= KVB__BOOT_MAX_SIZE) {
            char text[48];
            kvb__boot_sanitize(key, strlen(key), 24, text, sizeof(text));
            kvb__boot_reason(reason, reason_len, "dp_rank of room \"%s\" must be in [0, %d]", text,
                             KVB__BOOT_MAX_SIZE - 1);
            json_decref(root);
            return KVB_ERR_PROTO;
        }
    }
    for (size_t i = 0; i < n; i++) {
        char k[24];
        snprintf(k, sizeof(k), "%llu", (unsigned long long)rooms[i]);
        v = json_object_get(root, k);
        dp_ranks[i] = v != NULL ? (int32_t)json_integer_value(v) : -1;
    }
    json_decref(root);
    return KVB_OK;
}
