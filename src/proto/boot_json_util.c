/* Pieces of the bootstrap JSON code every dialect's shapes use (reason
 * text, bounded reads of untrusted JSON, the layout keys): below
 * bootstrap_json.c and the dialects' boot_json.c files, calling neither. */
#include "proto/bootstrap_proto.h"

#include "core/core.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void kvb__boot_reason(char *reason, size_t reason_len, const char *fmt, ...)
{
    va_list ap;
    if (reason == NULL || reason_len == 0)
        return;
    va_start(ap, fmt);
    vsnprintf(reason, reason_len, fmt, ap);
    va_end(ap);
    /* One line, whatever a key name contained. */
    for (char *p = reason; *p != '\0'; p++)
        if (*p == '\n' || *p == '\r')
            *p = ' ';
}

void kvb__boot_sanitize(const char *s, size_t len, size_t max, char *out, size_t out_len)
{
    size_t o = 0;
    bool cut = len > max;
    if (out_len == 0)
        return;
    if (cut)
        len = max;
    for (size_t i = 0; i < len && o + 1 < out_len; i++) {
        unsigned char c = (unsigned char)s[i];
        out[o++] = (c >= 0x20 && c < 0x7f) ? (char)c : '?';
    }
    if (cut)
        for (int k = 0; k < 3 && o + 1 < out_len; k++)
            out[o++] = '.';
    out[o] = '\0';
}

bool kvb__boot_valid_host(const char *s, size_t len)
{
    if (s == NULL || len == 0 || len > KVB_BOOTSTRAP_IP_MAX)
        return false;
    for (size_t i = 0; i < len; i++) {
        char c = s[i];
        bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                  c == '.' || c == ':' || c == '%' || c == '_' || c == '-';
        if (!ok)
            return false;
    }
    return true;
}

json_t *kvb__boot_load_object(const char *body, size_t len, const char *what, char *reason,
                              size_t reason_len)
{
    json_error_t jerr;
    json_t *root;
    if (body == NULL || len == 0) {
        kvb__boot_reason(reason, reason_len, "%s: empty body, expected a JSON object", what);
        return NULL;
    }
    if (len > KVB_BOOTSTRAP_MAX_BODY) {
        kvb__boot_reason(reason, reason_len, "%s: body of %zu bytes exceeds %d", what, len,
                         KVB_BOOTSTRAP_MAX_BODY);
        return NULL;
    }
    root = json_loadb(body, len, JSON_REJECT_DUPLICATES, &jerr);
    if (root == NULL) {
        char text[96];
        kvb__boot_sanitize(jerr.text, strnlen(jerr.text, sizeof(jerr.text)), 80, text,
                           sizeof(text));
        kvb__boot_reason(reason, reason_len, "%s: body is not valid JSON (line %d column %d: %s)",
                         what, jerr.line, jerr.column, text);
        return NULL;
    }
    if (!json_is_object(root)) {
        kvb__boot_reason(reason, reason_len, "%s: body is not a JSON object", what);
        json_decref(root);
        return NULL;
    }
    return root;
}

/* Integer key in [min, max]; missing, wrong type or out of range → false. */
bool kvb__boot_get_int(json_t *obj, const char *key, int64_t min, int64_t max, int64_t *out,
                       char *reason, size_t reason_len)
{
    json_t *v = json_object_get(obj, key);
    if (v == NULL) {
        kvb__boot_reason(reason, reason_len, "missing key \"%s\"", key);
        return false;
    }
    if (!json_is_integer(v)) {
        kvb__boot_reason(reason, reason_len, "\"%s\" must be an integer", key);
        return false;
    }
    json_int_t x = json_integer_value(v);
    if (x < min || x > max) {
        kvb__boot_reason(reason, reason_len, "\"%s\" = %lld is outside [%lld, %lld]", key,
                         (long long)x, (long long)min, (long long)max);
        return false;
    }
    *out = (int64_t)x;
    return true;
}

/* A list of lengths: array of at most KVB__BOOT_MAX_LENS integers >= 1. */
bool kvb__boot_valid_lens(json_t *v, const char *key, char *reason, size_t reason_len)
{
    size_t i;
    json_t *e;
    if (!json_is_array(v)) {
        kvb__boot_reason(reason, reason_len, "\"%s\" must be an array of integers", key);
        return false;
    }
    if (json_array_size(v) > KVB__BOOT_MAX_LENS) {
        kvb__boot_reason(reason, reason_len, "\"%s\" has %zu entries, more than %d", key,
                         json_array_size(v), KVB__BOOT_MAX_LENS);
        return false;
    }
    json_array_foreach(v, i, e)
    {
        if (!json_is_integer(e) || json_integer_value(e) < 1) {
            kvb__boot_reason(reason, reason_len, "\"%s\"[%zu] must be an integer >= 1", key, i);
            return false;
        }
    }
    return true;
}

/* Boolean that also accepts 0 / 1; *out gets the truth value. */
bool kvb__boot_valid_flag(json_t *v, const char *key, bool *out, char *reason, size_t reason_len)
{
    if (json_is_boolean(v)) {
        *out = json_is_true(v);
        return true;
    }
    if (json_is_integer(v) && (json_integer_value(v) == 0 || json_integer_value(v) == 1)) {
        *out = json_integer_value(v) == 1;
        return true;
    }
    kvb__boot_reason(reason, reason_len, "\"%s\" must be true or false", key);
    return false;
}

const char *const kvb__boot_lens_keys[KVB__BOOT_N_LENS] = {
    KVB__BOOT_KEY_KV_ITEM_LENS, KVB__BOOT_KEY_KV_UNIT_LENS, KVB__BOOT_KEY_STATE_ITEM_LENS,
    KVB__BOOT_KEY_STATE_UNIT_LENS};
;

bool kvb__boot_valid_word(const char *s, size_t len)
{
    if (s == NULL || len == 0 || len > KVB__BOOT_WORD_MAX)
        return false;
    for (size_t i = 0; i < len; i++) {
        char c = s[i];
        bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                  c == '_' || c == '.' || c == ':' || c == '+' || c == '-';
        if (!ok)
            return false;
    }
    return true;
}

bool kvb__boot_get_intish(json_t *v, const char *key, int64_t min, int64_t max, int64_t *out,
                          char *reason, size_t reason_len)
{
    int64_t x;
    if (json_is_string(v)) {
        if (!kvb__parse_i64(json_string_value(v), json_string_length(v), min, max, &x))
            goto bad;
    } else if (json_is_integer(v)) {
        x = json_integer_value(v);
        if (x < min || x > max)
            goto bad;
    } else {
        goto bad;
    }
    *out = x;
    return true;
bad:
    kvb__boot_reason(reason, reason_len, "\"%s\" must be an integer in [%lld, %lld]", key,
                     (long long)min, (long long)max);
    return false;
}

/* A word-valued key: absent or null → *out NULL (an error when required). */
static bool lens_from_json(json_t *root, const char *key, kvb_bootstrap_lens_t *out, bool *nomem,
                           char *reason, size_t reason_len)
{
    json_t *v = json_object_get(root, key);
    size_t i;
    json_t *e;
    out->values = NULL;
    out->count = 0;
    if (v == NULL || json_is_null(v))
        return true;
    if (!kvb__boot_valid_lens(v, key, reason, reason_len))
        return false;
    if (json_array_size(v) == 0)
        return true;
    out->values = calloc(json_array_size(v), sizeof(uint64_t));
    if (out->values == NULL) {
        *nomem = true;
        kvb__boot_reason(reason, reason_len, "out of memory");
        return false;
    }
    json_array_foreach(v, i, e) out->values[i] = (uint64_t)json_integer_value(e);
    out->count = json_array_size(v);
    return true;
}

/* The optional layout keys of a parallel-info answer into info. */
bool kvb__boot_info_layout_parse(json_t *root, kvb_bootstrap_parallel_info_t *info, bool *nomem,
                                 char *reason, size_t reason_len)
{
    kvb_bootstrap_lens_t *lens[KVB__BOOT_N_LENS] = {&info->kv_item_lens, &info->kv_unit_lens,
                                                    &info->state_item_lens, &info->state_unit_lens};
    json_t *v;
    bool flag = false;
    for (size_t k = 0; k < KVB__BOOT_N_LENS; k++)
        if (!lens_from_json(root, kvb__boot_lens_keys[k], lens[k], nomem, reason, reason_len))
            return false;
    v = json_object_get(root, KVB__BOOT_KEY_MLA_L1_5);
    if (v != NULL && !json_is_null(v)) {
        if (!kvb__boot_valid_flag(v, KVB__BOOT_KEY_MLA_L1_5, &flag, reason, reason_len))
            return false;
        info->enable_mla_l1_5_cache = flag;
    }
    v = json_object_get(root, KVB__BOOT_KEY_LAYOUT);
    if (v != NULL && !json_is_null(v)) {
        if (!json_is_object(v)) {
            kvb__boot_reason(reason, reason_len, "\"%s\" must be a JSON object",
                             KVB__BOOT_KEY_LAYOUT);
            return false;
        }
        info->layout_json = json_dumps(v, JSON_COMPACT | JSON_SORT_KEYS);
        if (info->layout_json == NULL) {
            *nomem = true;
            kvb__boot_reason(reason, reason_len, "out of memory");
            return false;
        }
    }
    return true;
}

KVB_API void kvb_bootstrap_parallel_info_free(kvb_bootstrap_parallel_info_t *info)
{
    if (info == NULL)
        return;
    free(info->kv_item_lens.values);
    free(info->kv_unit_lens.values);
    free(info->state_item_lens.values);
    free(info->state_unit_lens.values);
    free(info->layout_json);
    memset(info, 0, sizeof(*info));
}
