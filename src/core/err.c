#include "core.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

/* Per thread: the last message recorded on each of the few objects the
 * thread used most recently (an engine, a manager, a client). */
#define ERR_SLOTS 8
typedef struct err_slot {
    uint64_t id; /* 0: free */
    uint64_t used;
    char msg[KVB_ERRMSG_MAX];
} err_slot_t;
static __thread err_slot_t t_slots[ERR_SLOTS];
static __thread uint64_t t_clock;

static err_slot_t *slot_of(uint64_t id, bool make)
{
    err_slot_t *oldest = &t_slots[0];
    for (int i = 0; i < ERR_SLOTS; i++) {
        if (t_slots[i].id == id) {
            t_slots[i].used = ++t_clock;
            return &t_slots[i];
        }
        if (t_slots[i].used < oldest->used)
            oldest = &t_slots[i];
    }
    if (!make)
        return NULL;
    oldest->id = id;
    oldest->used = ++t_clock;
    return oldest;
}

void kvb__err_init(kvb__err_t *err)
{
    static uint64_t next_id;
    pthread_mutex_init(&err->mu, NULL);
    err->code = KVB_OK;
    err->id = __atomic_add_fetch(&next_id, 1, __ATOMIC_RELAXED);
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
    if (err->id != 0) /* 0: not initialised yet (no thread slots) */
        memcpy(slot_of(err->id, true)->msg, buf, sizeof(buf));
    KVB_LOGD("%s (%s)", buf, kvb_status_string(code));
    return code;
}

const char *kvb__err_get(kvb__err_t *err)
{
    static __thread char copy[KVB_ERRMSG_MAX];
    err_slot_t *mine = err->id != 0 ? slot_of(err->id, false) : NULL;
    if (mine != NULL) {
        memcpy(copy, mine->msg, sizeof(copy));
        return copy;
    }
    pthread_mutex_lock(&err->mu);
    memcpy(copy, err->msg, sizeof(copy));
    pthread_mutex_unlock(&err->mu);
    return copy;
}

void kvb__err_clear(kvb__err_t *err)
{
    err_slot_t *mine = err->id != 0 ? slot_of(err->id, false) : NULL;
    if (mine != NULL)
        mine->msg[0] = '\0';
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
