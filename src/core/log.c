#include "core.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* The logger is the library's only global mutable state (ARCHITECTURE.md). */
static pthread_mutex_t g_log_mu = PTHREAD_MUTEX_INITIALIZER;
static kvb_log_fn g_log_fn;
static void *g_log_arg;
static int g_log_level = -1; /* -1: not read from KVBRIDGE_LOG yet */

static int level_from_env(void)
{
    const char *v = getenv("KVBRIDGE_LOG");
    if (v == NULL || *v == '\0')
        return KVB_LOG_WARN;
    if (strcasecmp(v, "error") == 0)
        return KVB_LOG_ERROR;
    if (strcasecmp(v, "warn") == 0 || strcasecmp(v, "warning") == 0)
        return KVB_LOG_WARN;
    if (strcasecmp(v, "info") == 0)
        return KVB_LOG_INFO;
    if (strcasecmp(v, "debug") == 0)
        return KVB_LOG_DEBUG;
    return KVB_LOG_WARN;
}

static int current_level(void)
{
    int lvl = __atomic_load_n(&g_log_level, __ATOMIC_RELAXED);
    if (lvl < 0) {
        lvl = level_from_env();
        __atomic_store_n(&g_log_level, lvl, __ATOMIC_RELAXED);
    }
    return lvl;
}

void kvb_log_set_level(kvb_log_level_t level)
{
    __atomic_store_n(&g_log_level, (int)level, __ATOMIC_RELAXED);
}

kvb_log_level_t kvb_log_get_level(void)
{
    return (kvb_log_level_t)current_level();
}

void kvb_log_set_handler(kvb_log_fn fn, void *arg)
{
    pthread_mutex_lock(&g_log_mu);
    g_log_fn = fn;
    g_log_arg = arg;
    pthread_mutex_unlock(&g_log_mu);
}

bool kvb__log_enabled(kvb_log_level_t level)
{
    return (int)level <= current_level();
}

static const char *level_name(kvb_log_level_t level)
{
    static const char *names[] = {"error", "warn", "info", "debug"};
    return (unsigned)level < 4 ? names[level] : "?";
}

/* Debug lines carry a monotonic time stamp, to read latencies off a log. */
static const char *debug_stamp(void)
{
    static __thread char buf[32];
    snprintf(buf, sizeof(buf), " [t=%.6f]", kvb__now_s());
    return buf;
}

void kvb__log(kvb_log_level_t level, const char *fmt, ...)
{
    if (!kvb__log_enabled(level))
        return;
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof(line), fmt, ap);
    va_end(ap);
    pthread_mutex_lock(&g_log_mu);
    if (g_log_fn != NULL)
        g_log_fn(level, line, g_log_arg);
    else
        fprintf(stderr, "kvbridge %s: %s%s\n", level_name(level), line,
                level == KVB_LOG_DEBUG ? debug_stamp() : "");
    pthread_mutex_unlock(&g_log_mu);
}
