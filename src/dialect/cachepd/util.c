/* Shared helpers of the CachePD dialect: reasons, Python-compatible JSON
 * text, strict jansson accessors (cpd_int.h). */
#include "dialect/cachepd/cpd_int.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

kvb_status_t kvb__cpd_fail(kvb__frames_err_t *err, bool has_room, uint64_t room, const char *fmt,
                           ...)
{
    if (err == NULL)
        return KVB_ERR_PROTO;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->reason, sizeof(err->reason), fmt, ap);
    va_end(ap);
    /* Callers quote peer text through kvb__cpd_show; this keeps the line
     * printable whatever slipped through. */
    for (char *c = err->reason; *c != '\0'; c++)
        if ((unsigned char)*c < 0x20 || (unsigned char)*c > 0x7e)
            *c = '?';
    if (err->reason[0] == '\0')
        snprintf(err->reason, sizeof(err->reason), "CachePD: refused");
    err->has_room = has_room;
    err->room = has_room ? room : 0;
    return KVB_ERR_PROTO;
}

const char *kvb__cpd_show(const char *s, size_t len, char out[256])
{
    size_t o = 0;
    for (size_t i = 0; i < len && o < 200; i++) {
        unsigned char c = (unsigned char)s[i];
        if (i == 48) {
            memcpy(out + o, "...", 3);
            o += 3;
            break;
        }
        if (c >= 0x20 && c < 0x7f && c != '\\')
            out[o++] = (char)c;
        else
            o += (size_t)snprintf(out + o, 256 - o, "\\x%02x", c);
    }
    out[o] = '\0';
    return out;
}

/* ---------------------------------------------------------------- text */

static bool grow(kvb__cpd_buf_t *b, size_t more)
{
    if (b->oom)
        return false;
    if (b->len + more + 1 <= b->cap)
        return true;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + more + 1)
        cap *= 2;
    char *p = realloc(b->p, cap);
    if (p == NULL) {
        b->oom = true;
        return false;
    }
    b->p = p;
    b->cap = cap;
    return true;
}

void kvb__cpd_put(kvb__cpd_buf_t *b, const char *s, size_t n)
{
    if (!grow(b, n))
        return;
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

void kvb__cpd_puts(kvb__cpd_buf_t *b, const char *s)
{
    kvb__cpd_put(b, s, strlen(s));
}

void kvb__cpd_put_u64(kvb__cpd_buf_t *b, uint64_t v)
{
    char t[24];
    int k = snprintf(t, sizeof(t), "%llu", (unsigned long long)v);
    kvb__cpd_put(b, t, (size_t)k);
}

void kvb__cpd_put_i64(kvb__cpd_buf_t *b, int64_t v)
{
    char t[24];
    int k = snprintf(t, sizeof(t), "%lld", (long long)v);
    kvb__cpd_put(b, t, (size_t)k);
}

void kvb__cpd_put_opt(kvb__cpd_buf_t *b, int64_t v)
{
    if (v < 0)
        kvb__cpd_puts(b, "null");
    else
        kvb__cpd_put_i64(b, v);
}

void kvb__cpd_put_jstr(kvb__cpd_buf_t *b, const char *s, size_t n)
{
    kvb__cpd_put(b, "\"", 1);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        char t[8];
        const char *esc = NULL;
        switch (c) {
        case '"':
            esc = "\\\"";
            break;
        case '\\':
            esc = "\\\\";
            break;
        case '\n':
            esc = "\\n";
            break;
        case '\r':
            esc = "\\r";
            break;
        case '\t':
            esc = "\\t";
            break;
        case '\b':
            esc = "\\b";
            break;
        case '\f':
            esc = "\\f";
            break;
        default:
            break;
        }
        if (esc != NULL) {
            kvb__cpd_puts(b, esc);
        } else if (c < 0x20 || c >= 0x7f) {
            /* Only ASCII reaches here from the validated objects (ids are
             * printable); 0x7f and controls as Python writes them. */
            snprintf(t, sizeof(t), "\\u%04x", c);
            kvb__cpd_put(b, t, 6);
        } else {
            kvb__cpd_put(b, (const char *)&s[i], 1);
        }
    }
    kvb__cpd_put(b, "\"", 1);
}

kvb_status_t kvb__cpd_buf_take(kvb__cpd_buf_t *b, char **text_p, size_t *len_p)
{
    if (b->oom || !grow(b, 0)) {
        free(b->p);
        memset(b, 0, sizeof(*b));
        return KVB_ERR_NOMEM;
    }
    *text_p = b->p;
    *len_p = b->len;
    memset(b, 0, sizeof(*b));
    return KVB_OK;
}

/* ---------------------------------------------------------------- JSON in */

json_t *kvb__cpd_json_load(const char *text, size_t len, const char *prefix, const char *what,
                           kvb__frames_err_t *err)
{
    json_error_t je;
    json_t *v = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
    if (v == NULL) {
        char show[256];
        kvb__cpd_fail(err, false, 0, "%s: invalid %s JSON at byte %d: %s", prefix, what,
                      je.position, kvb__cpd_show(je.text, strlen(je.text), show));
        return NULL;
    }
    return v;
}

static const char *type_name(json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT:
        return "an object";
    case JSON_ARRAY:
        return "an array";
    case JSON_STRING:
        return "a string";
    case JSON_INTEGER:
        return "an integer";
    case JSON_REAL:
        return "a float";
    case JSON_TRUE:
    case JSON_FALSE:
        return "a boolean";
    default:
        return "null";
    }
}

kvb_status_t kvb__cpd_get_u64(json_t *obj, const char *what, const char *key, uint64_t min,
                              uint64_t max, kvb__frames_err_t *err, uint64_t *out_p)
{
    json_t *v = json_object_get(obj, key);
    *out_p = 0; /* on every path: gcc 12 -O3 cannot see that a failure is never read */
    if (v == NULL)
        return kvb__cpd_fail(err, false, 0, "%s: missing key \"%s\"", what, key);
    if (!json_is_integer(v))
        return kvb__cpd_fail(err, false, 0, "%s: \"%s\" is %s, not an integer", what, key,
                             type_name(v));
    json_int_t x = json_integer_value(v);
    if (x < 0 || (uint64_t)x < min || (uint64_t)x > max)
        return kvb__cpd_fail(err, false, 0, "%s: \"%s\" is %lld, outside [%llu, %llu]", what, key,
                             (long long)x, (unsigned long long)min, (unsigned long long)max);
    *out_p = (uint64_t)x;
    return KVB_OK;
}

kvb_status_t kvb__cpd_get_opt(json_t *obj, const char *what, const char *key, bool optional,
                              uint64_t min, kvb__frames_err_t *err, int64_t *out_p)
{
    json_t *v = json_object_get(obj, key);
    if (v == NULL && !optional)
        return kvb__cpd_fail(err, false, 0, "%s: missing key \"%s\"", what, key);
    if (v == NULL || json_is_null(v)) {
        *out_p = -1;
        return KVB_OK;
    }
    uint64_t x;
    KVB__FRAMES_TRY(kvb__cpd_get_u64(obj, what, key, min, INT64_MAX, err, &x));
    *out_p = (int64_t)x;
    return KVB_OK;
}

kvb_status_t kvb__cpd_get_id(json_t *obj, const char *what, const char *key, kvb__frames_err_t *err,
                             char **out_p)
{
    json_t *v = json_object_get(obj, key);
    char show[256];
    if (v == NULL)
        return kvb__cpd_fail(err, false, 0, "%s: missing key \"%s\"", what, key);
    if (!json_is_string(v))
        return kvb__cpd_fail(err, false, 0, "%s: \"%s\" is %s, not a string", what, key,
                             type_name(v));
    const char *s = json_string_value(v);
    size_t n = json_string_length(v);
    if (n == 0 || n > KVB__CPD_MAX_ID)
        return kvb__cpd_fail(err, false, 0, "%s: \"%s\" has %zu bytes, not 1..%u", what, key, n,
                             KVB__CPD_MAX_ID);
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] < 0x20 || (unsigned char)s[i] > 0x7e)
            return kvb__cpd_fail(err, false, 0,
                                 "%s: \"%s\" \"%s\" is not printable ASCII (kvbridge's rule)", what,
                                 key, kvb__cpd_show(s, n, show));
    char *c = strdup(s);
    if (c == NULL)
        return KVB_ERR_NOMEM;
    *out_p = c;
    return KVB_OK;
}

kvb_status_t kvb__cpd_get_array(json_t *obj, const char *what, const char *key, size_t max,
                                kvb__frames_err_t *err, json_t **out_p)
{
    json_t *v = json_object_get(obj, key);
    if (v == NULL)
        return kvb__cpd_fail(err, false, 0, "%s: missing key \"%s\"", what, key);
    if (!json_is_array(v))
        return kvb__cpd_fail(err, false, 0, "%s: \"%s\" is %s, not an array", what, key,
                             type_name(v));
    if (json_array_size(v) > max)
        return kvb__cpd_fail(err, false, 0, "%s: \"%s\" has %zu entries, more than %zu", what, key,
                             json_array_size(v), max);
    *out_p = v;
    return KVB_OK;
}

kvb_status_t kvb__cpd_only_keys(json_t *obj, const char *what, const char *const *keys, size_t n,
                                kvb__frames_err_t *err)
{
    const char *k;
    json_t *v;
    char show[256];
    if (!json_is_object(obj))
        return kvb__cpd_fail(err, false, 0, "%s is %s, not an object", what, type_name(obj));
    json_object_foreach(obj, k, v)
    {
        size_t i = 0;
        while (i < n && strcmp(k, keys[i]) != 0)
            i++;
        if (i == n)
            return kvb__cpd_fail(err, false, 0, "%s: unknown key \"%s\"", what,
                                 kvb__cpd_show(k, strlen(k), show));
    }
    return KVB_OK;
}

/* ---------------------------------------------------------------- frames */

bool kvb__cpd_canon_uint(const uint8_t *p, size_t n, uint64_t min, uint64_t max, uint64_t *out_p)
{
    char t[24];
    int digits = snprintf(t, sizeof(t), "%llu", (unsigned long long)max);
    if (n < 1 || n > (size_t)digits || (n > 1 && p[0] == '0'))
        return false;
    uint64_t v = 0;
    for (size_t i = 0; i < n; i++) {
        if (p[i] < '0' || p[i] > '9')
            return false;
        if (!kvb__mul_u64(v, 10, &v) || !kvb__add_u64(v, (uint64_t)(p[i] - '0'), &v))
            return false;
    }
    if (v < min || v > max)
        return false;
    *out_p = v;
    return true;
}

bool kvb__cpd_ascii(const uint8_t *p, size_t n, size_t max)
{
    if (n == 0 || n > max)
        return false;
    for (size_t i = 0; i < n; i++)
        if (p[i] >= 0x80)
            return false;
    return true;
}
