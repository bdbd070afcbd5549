/* kvbridge metrics: the process's counters, gauges and histograms in
 * Prometheus text exposition (docs/observe.md lists every one). With
 * KVBRIDGE_METRICS_ADDR=host:port set, the first engine or manager created
 * in the process serves the same text at http://host:port/metrics. */
#ifndef KVBRIDGE_METRICS_H
#define KVBRIDGE_METRICS_H

#include <kvbridge/common.h>

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kvb_metrics {
    uint64_t field_mask; /* none defined yet: 0 */
    char *text;          /* Prometheus text format 0.0.4, NUL-terminated (owned by the snapshot) */
    size_t len;          /* bytes of text */
} kvb_metrics_t;

/* A snapshot of every metric of the process into *s_p (the caller's: free
 * with kvb_metrics_free); no pointer to a live counter is handed out.
 * Thread-safe. Errors: KVB_ERR_INVALID (NULL), KVB_ERR_NOMEM. */
KVB_API kvb_status_t kvb_metrics_snapshot(kvb_metrics_t **s_p);
/* Free a snapshot (NULL-safe). */
KVB_API void kvb_metrics_free(kvb_metrics_t *s);
/* "host:port" the /metrics listener serves on (the port chosen when
 * KVBRIDGE_METRICS_ADDR named port 0), or NULL when none runs. Static;
 * thread-safe. */
KVB_API const char *kvb_metrics_addr(void);

#ifdef __cplusplus
}
#endif
#endif
