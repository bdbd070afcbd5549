#include "core.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

const char *kvb__env_get(const char *name, const char *alias)
{
    const char *v = name != NULL ? getenv(name) : NULL;
    if (v != NULL && *v != '\0')
        return v;
    v = alias != NULL ? getenv(alias) : NULL;
    return (v != NULL && *v != '\0') ? v : NULL;
}

static const char *used_name(const char *name, const char *alias)
{
    const char *v = name != NULL ? getenv(name) : NULL;
    return (v != NULL && *v != '\0') ? name : alias;
}

int64_t kvb__env_int(const char *name, const char *alias, int64_t def, int64_t min, int64_t max)
{
    const char *v = kvb__env_get(name, alias);
    int64_t out;
    if (v == NULL)
        return def;
    if (!kvb__parse_i64(v, strlen(v), min, max, &out)) {
        KVB_LOGW("%s=\"%s\" is not an integer in [%lld, %lld]; using %lld", used_name(name, alias),
                 v, (long long)min, (long long)max, (long long)def);
        return def;
    }
    return out;
}

double kvb__env_double(const char *name, const char *alias, double def, double min, double max)
{
    const char *v = kvb__env_get(name, alias);
    char *end = NULL;
    double out;
    if (v == NULL)
        return def;
    out = strtod(v, &end);
    if (end == v || *end != '\0' || !isfinite(out) || out < min || out > max) {
        KVB_LOGW("%s=\"%s\" is not a number in [%g, %g]; using %g", used_name(name, alias), v, min,
                 max, def);
        return def;
    }
    return out;
}

void kvb__cond_wait_ns(pthread_cond_t *cv, pthread_mutex_t *mu, uint64_t ns)
{
    kvb__cond_wait_until(cv, mu, kvb__now_ns() + ns);
}

bool kvb__parse_i64(const char *s, size_t len, int64_t min, int64_t max, int64_t *out_p)
{
    size_t i = 0;
    bool neg = false;
    uint64_t acc = 0;
    if (s == NULL || len == 0)
        return false;
    if (s[0] == '-') {
        neg = true;
        i = 1;
    }
    if (i == len || len - i > 19)
        return false;
    for (; i < len; i++) {
        if (s[i] < '0' || s[i] > '9')
            return false;
        acc = acc * 10 + (uint64_t)(s[i] - '0');
    }
    /* 19 digits fit in uint64; reject what does not fit in int64. */
    if (!neg && acc > (uint64_t)INT64_MAX)
        return false;
    if (neg && acc > (uint64_t)INT64_MAX + 1)
        return false;
    int64_t v = neg ? (int64_t)(0 - acc) : (int64_t)acc;
    if (v < min || v > max)
        return false;
    *out_p = v;
    return true;
}
