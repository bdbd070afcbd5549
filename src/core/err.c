#include "core.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

void kvb__err_init(kvb__err_t *err)
{
    pthread_mutex_init(&err->mu, NULL);
    err->code = KVB_OK;
    err->msg[0] = '\0';
}

void kvb__err_destroy(kvb__err_t *err)
{
    pthread_mutex_destroy(&err->mu);
}

kvb_status_t kvb__err_set(kvb__err_t *err, kvb_status_t code, const char *fmt, ...)
{
    char buf[KVB_ERRMSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    pthread_mutex_lock(&err->mu);
    err->code = code;
    memcpy(err->msg, buf, sizeof(buf));
    pthread_mutex_unlock(&err->mu);
    KVB_LOGD("%s (%s)", buf, kvb_status_string(code));
    return code;
}

const char *kvb__err_get(kvb__err_t *err)
{
    static __thread char copy[KVB_ERRMSG_MAX];
    pthread_mutex_lock(&err->mu);
    memcpy(copy, err->msg, sizeof(copy));
    pthread_mutex_unlock(&err->mu);
    return copy;
}

void kvb__err_clear(kvb__err_t *err)
{
    pthread_mutex_lock(&err->mu);
    err->code = KVB_OK;
    err->msg[0] = '\0';
    pthread_mutex_unlock(&err->mu);
}

void *kvb__tsan_token(void)
{
    static char token;
    return &token;
}
