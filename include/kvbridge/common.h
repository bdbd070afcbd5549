/* kvbridge: shared definitions (status codes, logging, version).
 * Every public header includes this one. */
#ifndef KVBRIDGE_COMMON_H
#define KVBRIDGE_COMMON_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(KVB_BUILDING) && defined(__GNUC__)
#define KVB_API __attribute__((visibility("default")))
#else
#define KVB_API
#endif

#define KVB_VERSION_MAJOR 0
#define KVB_VERSION_MINOR 1
#define KVB_VERSION_PATCH 0
#define KVB_VERSION_STRING "0.1.0"

/* The one status enum of the library. KVB_OK is zero, every error negative.
 * Detailed text (which peer, which range, which frame) is kept by the object
 * that failed; see each layer's *_last_error(). */
typedef enum kvb_status {
    KVB_OK = 0,
    KVB_ERR_INVALID = -1,      /* bad argument or unsupported geometry */
    KVB_ERR_NOMEM = -2,        /* allocation failed */
    KVB_ERR_BOUNDS = -3,       /* range outside registered memory */
    KVB_ERR_OVERLAP = -4,      /* registration overlaps an existing one */
    KVB_ERR_NOT_FOUND = -5,    /* unknown region, session, rank or room */
    KVB_ERR_TIMEOUT = -6,      /* a bound passed before completion */
    KVB_ERR_PEER = -7,         /* peer unreachable, refused, reset or dead */
    KVB_ERR_PROTO = -8,        /* malformed or unexpected message from a peer */
    KVB_ERR_CANCELED = -9,     /* operation cancelled by the caller */
    KVB_ERR_IO = -10,          /* local I/O or transport failure */
    KVB_ERR_INPROGRESS = -11,  /* not finished yet (test functions) */
    KVB_ERR_AUTH = -12,        /* authentication failed */
    KVB_ERR_STATE = -13,       /* call not valid in the object's state */
    KVB_ERR_UNSUPPORTED = -14, /* feature not available in this build */
    KVB_ERR_FENCED = -15,      /* the target refused this writer (its grant was revoked) */
    KVB_ERR_UNSETTLED = -16,   /* failed, and bytes it had in flight to a peer that stopped
                                  answering may still be placed (kvb_xfer_drained 0) */
    KVB_ERR_BUSY = -17         /* the peer refused for now (its caps are full): try again */
} kvb_status_t;

/* Short constant English text for a status ("ok", "out of bounds", ...).
 * Never NULL; unknown values give "unknown status". Thread-safe. */
KVB_API const char *kvb_status_string(kvb_status_t status);

/* Library version string, e.g. "0.1.0". */
KVB_API const char *kvb_version(void);

typedef enum kvb_log_level {
    KVB_LOG_ERROR = 0,
    KVB_LOG_WARN = 1,
    KVB_LOG_INFO = 2,
    KVB_LOG_DEBUG = 3
} kvb_log_level_t;

/* Log sink: receives the level and one formatted line without a newline.
 * Called from any library thread; must be thread-safe. */
typedef void (*kvb_log_fn)(kvb_log_level_t level, const char *line, void *arg);

/* Redirect log lines to fn (NULL restores stderr). Thread-safe. */
KVB_API void kvb_log_set_handler(kvb_log_fn fn, void *arg);

/* Set the level; the default comes from KVBRIDGE_LOG
 * (error|warn|info|debug, default warn). Thread-safe. */
KVB_API void kvb_log_set_level(kvb_log_level_t level);
KVB_API kvb_log_level_t kvb_log_get_level(void);

#ifdef __cplusplus
}
#endif
#endif
