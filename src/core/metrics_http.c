/* The process's /metrics listener (KVBRIDGE_METRICS_ADDR=host:port): a
 * libmicrohttpd daemon on its own thread, started once by the first engine
 * or manager and kept for the process's life. Only GET (or HEAD) /metrics
 * is served; nothing listens when the variable is unset. */
#include "core/core.h"
#include "core/metrics.h"

#include <kvbridge/metrics.h>

#include <arpa/inet.h>
#include <microhttpd.h>
#include <netdb.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#define CT_PROM "text/plain; version=0.0.4; charset=utf-8"

static pthread_once_t once = PTHREAD_ONCE_INIT;
static struct MHD_Daemon *daemon_;
static char bound[300]; /* "host:port" once listening */
static int listening;   /* atomic */

static enum MHD_Result reply(struct MHD_Connection *c, unsigned code, const char *ct, char *body,
                             size_t len, enum MHD_ResponseMemoryMode mode)
{
    struct MHD_Response *r = MHD_create_response_from_buffer(len, body, mode);
    if (r == NULL)
        return MHD_NO;
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, ct);
    enum MHD_Result ret = MHD_queue_response(c, code, r);
    MHD_destroy_response(r);
    return ret;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version, const char *upload,
                                  size_t *upload_len, void **ctx)
{
    (void)cls, (void)version, (void)upload;
    static char text_plain[] = "text/plain";
    if (*ctx == NULL) { /* first call: headers only */
        *ctx = text_plain;
        return MHD_YES;
    }
    if (*upload_len != 0) { /* a body nobody asked for: dropped */
        *upload_len = 0;
        return MHD_YES;
    }
    bool get = strcmp(method, MHD_HTTP_METHOD_GET) == 0;
    if (!get && strcmp(method, MHD_HTTP_METHOD_HEAD) != 0)
        return reply(c, MHD_HTTP_METHOD_NOT_ALLOWED, text_plain, "GET /metrics only\n", 18,
                     MHD_RESPMEM_PERSISTENT);
    if (strcmp(url, "/metrics") != 0)
        return reply(c, MHD_HTTP_NOT_FOUND, text_plain, "not found: GET /metrics\n", 24,
                     MHD_RESPMEM_PERSISTENT);
    size_t len = 0;
    char *text = kvb__metrics_text(&len);
    if (text == NULL)
        return reply(c, MHD_HTTP_INTERNAL_SERVER_ERROR, text_plain, "out of memory\n", 14,
                     MHD_RESPMEM_PERSISTENT);
    return reply(c, MHD_HTTP_OK, CT_PROM, text, len, MHD_RESPMEM_MUST_FREE);
}

/* host:port (IPv6 in brackets) into a socket address; false with why. */
static bool parse_addr(const char *v, struct sockaddr_storage *ss, socklen_t *sl_p, char *why,
                       size_t wl)
{
    char host[256];
    const char *colon = strrchr(v, ':');
    int64_t port;
    if (colon == NULL || colon == v) {
        snprintf(why, wl, "expected host:port");
        return false;
    }
    size_t hl = (size_t)(colon - v);
    if (v[0] == '[' && hl >= 2 && v[hl - 1] == ']')
        v++, hl -= 2;
    if (hl == 0 || hl >= sizeof(host)) {
        snprintf(why, wl, "bad host");
        return false;
    }
    memcpy(host, v, hl);
    host[hl] = '\0';
    if (!kvb__parse_i64(colon + 1, strlen(colon + 1), 0, 65535, &port)) {
        snprintf(why, wl, "port is not an integer in [0, 65535]");
        return false;
    }
    struct addrinfo hints = {.ai_family = AF_UNSPEC,
                             .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE},
                    *ai = NULL;
    int rc = getaddrinfo(host, NULL, &hints, &ai);
    if (rc != 0 || ai == NULL) {
        snprintf(why, wl, "host not resolved: %s", gai_strerror(rc));
        return false;
    }
    memcpy(ss, ai->ai_addr, ai->ai_addrlen);
    *sl_p = ai->ai_addrlen;
    freeaddrinfo(ai);
    if (ss->ss_family == AF_INET6)
        ((struct sockaddr_in6 *)ss)->sin6_port = htons((uint16_t)port);
    else
        ((struct sockaddr_in *)ss)->sin_port = htons((uint16_t)port);
    return true;
}

static void start(void)
{
    const char *v = kvb__env_get("KVBRIDGE_METRICS_ADDR", NULL);
    struct sockaddr_storage ss;
    socklen_t sl = 0;
    char why[128], host[INET6_ADDRSTRLEN];
    if (v == NULL)
        return;
    if (!parse_addr(v, &ss, &sl, why, sizeof(why))) {
        KVB_LOGE("KVBRIDGE_METRICS_ADDR=\"%s\": %s; /metrics is not served", v, why);
        return;
    }
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG;
    if (ss.ss_family == AF_INET6)
        flags |= MHD_USE_IPv6;
    daemon_ = MHD_start_daemon(flags, 0, NULL, NULL, on_request, NULL, MHD_OPTION_SOCK_ADDR,
                               (struct sockaddr *)&ss, MHD_OPTION_CONNECTION_LIMIT, 32u,
                               MHD_OPTION_CONNECTION_TIMEOUT, 10u, MHD_OPTION_END);
    if (daemon_ == NULL) {
        KVB_LOGE("KVBRIDGE_METRICS_ADDR=\"%s\": cannot listen there (in use, or not an address "
                 "of this host); /metrics is not served",
                 v);
        return;
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(daemon_, MHD_DAEMON_INFO_LISTEN_FD);
    sl = sizeof(ss);
    if (di == NULL || getsockname(di->listen_fd, (struct sockaddr *)&ss, &sl) != 0) {
        snprintf(bound, sizeof(bound), "%s", v);
    } else if (ss.ss_family == AF_INET6) {
        inet_ntop(AF_INET6, &((struct sockaddr_in6 *)&ss)->sin6_addr, host, sizeof(host));
        snprintf(bound, sizeof(bound), "[%s]:%u", host,
                 ntohs(((struct sockaddr_in6 *)&ss)->sin6_port));
    } else {
        inet_ntop(AF_INET, &((struct sockaddr_in *)&ss)->sin_addr, host, sizeof(host));
        snprintf(bound, sizeof(bound), "%s:%u", host, ntohs(((struct sockaddr_in *)&ss)->sin_port));
    }
    __atomic_store_n(&listening, 1, __ATOMIC_RELEASE);
    KVB_LOGI("metrics: serving Prometheus text at http://%s/metrics", bound);
}

void kvb__metrics_serve(void)
{
    pthread_once(&once, start);
}

const char *kvb_metrics_addr(void)
{
    return __atomic_load_n(&listening, __ATOMIC_ACQUIRE) ? bound : NULL;
}
