/* Internal core helpers: logging, per-object error text, env knobs, clocks,
 * strict integer parsing. Not part of the public API. */
#ifndef KVB_CORE_H
#define KVB_CORE_H

#include <kvbridge/common.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#if defined(__GNUC__)
#define KVB_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define KVB_PRINTF(a, b)
#endif

/* ---- logging (the only global mutable state of the library) ---- */
void kvb__log(kvb_log_level_t level, const char *fmt, ...) KVB_PRINTF(2, 3);
bool kvb__log_enabled(kvb_log_level_t level);
#define KVB_LOGE(...) kvb__log(KVB_LOG_ERROR, __VA_ARGS__)
#define KVB_LOGW(...) kvb__log(KVB_LOG_WARN, __VA_ARGS__)
#define KVB_LOGI(...) kvb__log(KVB_LOG_INFO, __VA_ARGS__)
#define KVB_LOGD(...)                                                                              \
    do {                                                                                           \
        if (kvb__log_enabled(KVB_LOG_DEBUG))                                                       \
            kvb__log(KVB_LOG_DEBUG, __VA_ARGS__);                                                  \
    } while (0)

/* ---- per-object last error ---- */
#define KVB_ERRMSG_MAX 512
/* The object's most recent message (any thread), and per thread the most
 * recent message that thread recorded on it: kvb__err_get prefers the
 * latter, so a thread reads the reason of its own failed call even while
 * other threads fail on the same object. */
typedef struct kvb__err {
    pthread_mutex_t mu;
    kvb_status_t code;
    uint64_t id; /* unique per object ever made (thread slots match on it) */
    char msg[KVB_ERRMSG_MAX];
} kvb__err_t;

void kvb__err_init(kvb__err_t *err);
void kvb__err_destroy(kvb__err_t *err);
/* Record code and a formatted message (logged at debug); returns code. */
kvb_status_t kvb__err_set(kvb__err_t *err, kvb_status_t code, const char *fmt, ...)
    KVB_PRINTF(3, 4);
/* Copy of the calling thread's last message on err (the object's last one
 * when this thread recorded none) in a thread-local buffer (valid until the
 * calling thread's next call); "" when none. */
const char *kvb__err_get(kvb__err_t *err);
void kvb__err_clear(kvb__err_t *err);

/* ---- environment knobs ----
 * Look up name (a KVBRIDGE_* variable); when unset, look up alias (a seed
 * variable such as SGLANG_DISAGGREGATION_*; may be NULL). The KVBRIDGE_ twin
 * wins when both are set. */
const char *kvb__env_get(const char *name, const char *alias);
/* Integer knob in [min, max]; unset → def; unparsable or out of range → def
 * with a warning naming the variable. */
int64_t kvb__env_int(const char *name, const char *alias, int64_t def, int64_t min, int64_t max);
/* Seconds knob (decimal allowed, e.g. "2.5"), same rules as kvb__env_int. */
double kvb__env_double(const char *name, const char *alias, double def, double min, double max);

/* ---- clocks ---- */
uint64_t kvb__now_ns(void); /* CLOCK_MONOTONIC */
double kvb__now_s(void);
/* A condition variable whose timed waits run on CLOCK_MONOTONIC, so a
 * wall-clock jump neither stretches nor cuts them. */
void kvb__cond_init_mono(pthread_cond_t *cv);
/* Wait on cv (made by kvb__cond_init_mono; mu held) until woken or until
 * the monotonic time deadline_ns; false once the deadline has passed. */
bool kvb__cond_wait_until(pthread_cond_t *cv, pthread_mutex_t *mu, uint64_t deadline_ns);
/* The same for at most ns from now. */
void kvb__cond_wait_ns(pthread_cond_t *cv, pthread_mutex_t *mu, uint64_t ns);

/* ---- strict parsing of untrusted text ----
 * Accepts an optional '-' then 1..19 ASCII digits, nothing else, exactly len
 * bytes; value must lie in [min, max]. Returns false otherwise. */
bool kvb__parse_i64(const char *s, size_t len, int64_t min, int64_t max, int64_t *out_p);

/* Overflow-checked address arithmetic: false when a + b wraps. */
static inline bool kvb__add_u64(uint64_t a, uint64_t b, uint64_t *out_p)
{
    return !__builtin_add_overflow(a, b, out_p);
}
static inline bool kvb__mul_u64(uint64_t a, uint64_t b, uint64_t *out_p)
{
    return !__builtin_mul_overflow(a, b, out_p);
}

/* ---- ThreadSanitizer annotations ----
 * Bytes the engine places are read by other threads after a completion that
 * travels through sockets or shared memory (an acknowledgement, a ZeroMQ
 * status), which TSan cannot see. The engine releases this token after
 * placing bytes; the connector acquires it when a completion arrives. */
#if defined(__SANITIZE_THREAD__)
void __tsan_acquire(void *addr);
void __tsan_release(void *addr);
void __tsan_ignore_thread_begin(void);
void __tsan_ignore_thread_end(void);
#define KVB_TSAN_RELEASE() __tsan_release(kvb__tsan_token())
#define KVB_TSAN_ACQUIRE() __tsan_acquire(kvb__tsan_token())
/* Accesses between these are not seen (a thread's value-preserving touches
 * of memory others use: the direct lane's warmer). */
#define KVB_TSAN_IGNORE_BEGIN() __tsan_ignore_thread_begin()
#define KVB_TSAN_IGNORE_END() __tsan_ignore_thread_end()
#else
#define KVB_TSAN_RELEASE() ((void)0)
#define KVB_TSAN_ACQUIRE() ((void)0)
#define KVB_TSAN_IGNORE_BEGIN() ((void)0)
#define KVB_TSAN_IGNORE_END() ((void)0)
#endif
void *kvb__tsan_token(void);

#endif
