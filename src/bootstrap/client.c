/* Bootstrap HTTP client on libcurl. One easy handle per client keeps its
 * connection alive between calls (heartbeats reuse it); a lock serialises
 * calls on one client. Answers are untrusted: bounded in size, validated by
 * src/proto before anything reaches the caller. */
#include <kvbridge/bootstrap.h>

#include "core/core.h"
#include "proto/bootstrap_proto.h"

#include <curl/curl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DEFAULT_TIMEOUT_S 5.0

struct kvb_bootstrap_client {
    pthread_mutex_t mu; /* one request at a time on the easy handle */
    kvb__err_t err;
    CURL *curl;
    char *base; /* "http://host:port" */
    struct curl_slist *get_headers, *put_headers;
    double timeout_s;
    char errbuf[CURL_ERROR_SIZE];
    char *resp; /* KVB_BOOTSTRAP_MAX_BODY + 1 bytes */
    size_t resp_len;
    bool resp_overflow;
};

static pthread_once_t g_curl_once = PTHREAD_ONCE_INIT;
static CURLcode g_curl_init_rc = CURLE_OK;

static void curl_init_once(void)
{
    g_curl_init_rc = curl_global_init(CURL_GLOBAL_DEFAULT);
}

/* Accept "host:port" or "[v6]:port"; writes "http://..." into a new string. */
static char *make_base(const char *addr)
{
    const char *host, *colon;
    size_t host_len;
    int64_t port;
    char *base;
    if (addr == NULL || addr[0] == '\0')
        return NULL;
    if (addr[0] == '[') {
        const char *close = strchr(addr, ']');
        if (close == NULL || close[1] != ':')
            return NULL;
        host = addr + 1;
        host_len = (size_t)(close - host);
        colon = close + 1;
    } else {
        colon = strrchr(addr, ':');
        if (colon == NULL)
            return NULL;
        host = addr;
        host_len = (size_t)(colon - addr);
        if (memchr(host, ':', host_len) != NULL)
            return NULL; /* an IPv6 address needs brackets */
    }
    if (!kvb__boot_valid_host(host, host_len) ||
        !kvb__parse_i64(colon + 1, strlen(colon + 1), 1, 65535, &port))
        return NULL;
    if (asprintf(&base, "http://%s", addr) < 0)
        return NULL;
    return base;
}

static size_t on_write(char *data, size_t size, size_t nmemb, void *arg)
{
    struct kvb_bootstrap_client *c = arg;
    size_t n = size * nmemb;
    if (c->resp_len + n > KVB_BOOTSTRAP_MAX_BODY) {
        c->resp_overflow = true;
        return 0; /* aborts the transfer with CURLE_WRITE_ERROR */
    }
    memcpy(c->resp + c->resp_len, data, n);
    c->resp_len += n;
    return n;
}

KVB_API kvb_status_t kvb_bootstrap_client_create(const char *addr,
                                                 const kvb_bootstrap_client_params_t *params,
                                                 kvb_bootstrap_client_h *client_p)
{
    uint64_t mask = params != NULL ? params->field_mask : 0;
    const char *token = kvb__env_get("KVBRIDGE_BOOTSTRAP_TOKEN", NULL);
    struct kvb_bootstrap_client *c;
    char *auth = NULL;

    if (client_p == NULL)
        return KVB_ERR_INVALID;
    pthread_once(&g_curl_once, curl_init_once);
    if (g_curl_init_rc != CURLE_OK) {
        KVB_LOGE("bootstrap client: curl_global_init failed: %s",
                 curl_easy_strerror(g_curl_init_rc));
        return KVB_ERR_IO;
    }
    c = calloc(1, sizeof(*c));
    if (c == NULL)
        return KVB_ERR_NOMEM;
    pthread_mutex_init(&c->mu, NULL);
    kvb__err_init(&c->err);
    c->timeout_s = DEFAULT_TIMEOUT_S;
    if (mask & KVB_BOOTSTRAP_CLIENT_PARAM_TIMEOUT)
        c->timeout_s = params->timeout_s;
    if (mask & KVB_BOOTSTRAP_CLIENT_PARAM_TOKEN)
        token = params->token;
    if (!(c->timeout_s > 0 && c->timeout_s <= 86400)) {
        KVB_LOGE("bootstrap client: timeout_s %g outside (0, 86400]", c->timeout_s);
        kvb_bootstrap_client_destroy(c);
        return KVB_ERR_INVALID;
    }
    c->base = make_base(addr);
    if (c->base == NULL) {
        KVB_LOGE("bootstrap client: \"%s\" is not host:port or [ipv6]:port",
                 addr != NULL ? addr : "(null)");
        kvb_bootstrap_client_destroy(c);
        return KVB_ERR_INVALID;
    }
    c->resp = malloc(KVB_BOOTSTRAP_MAX_BODY + 1);
    c->curl = curl_easy_init();
    if (c->resp == NULL || c->curl == NULL)
        goto nomem;
    if (token != NULL && token[0] != '\0') {
        if (asprintf(&auth, "Authorization: Bearer %s", token) < 0) {
            auth = NULL;
            goto nomem;
        }
    }
    /* GET headers: the token only. PUT: also JSON, and no 100-continue wait. */
    if (auth != NULL) {
        struct curl_slist *g = curl_slist_append(NULL, auth);
        if (g == NULL)
            goto nomem;
        c->get_headers = g;
        g = curl_slist_append(NULL, auth);
        if (g == NULL)
            goto nomem;
        c->put_headers = g;
    }
    {
        struct curl_slist *p = curl_slist_append(c->put_headers, "Content-Type: application/json");
        if (p == NULL)
            goto nomem;
        c->put_headers = p;
        p = curl_slist_append(c->put_headers, "Expect:");
        if (p == NULL)
            goto nomem;
        c->put_headers = p;
    }
    free(auth);
    auth = NULL;

    curl_easy_setopt(c->curl, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c->curl, CURLOPT_PROTOCOLS_STR, "http");
    curl_easy_setopt(c->curl, CURLOPT_NOPROXY, "*");
    curl_easy_setopt(c->curl, CURLOPT_FOLLOWLOCATION, 0L);
    curl_easy_setopt(c->curl, CURLOPT_ERRORBUFFER, c->errbuf);
    curl_easy_setopt(c->curl, CURLOPT_WRITEFUNCTION, on_write);
    curl_easy_setopt(c->curl, CURLOPT_WRITEDATA, c);
    curl_easy_setopt(c->curl, CURLOPT_TCP_NODELAY, 1L);
    *client_p = c;
    return KVB_OK;
nomem:
    free(auth);
    kvb_bootstrap_client_destroy(c);
    return KVB_ERR_NOMEM;
}

KVB_API void kvb_bootstrap_client_destroy(kvb_bootstrap_client_h c)
{
    if (c == NULL)
        return;
    if (c->curl != NULL)
        curl_easy_cleanup(c->curl);
    curl_slist_free_all(c->get_headers);
    curl_slist_free_all(c->put_headers);
    free(c->resp);
    free(c->base);
    kvb__err_destroy(&c->err);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

KVB_API const char *kvb_bootstrap_client_last_error(kvb_bootstrap_client_h c)
{
    return c != NULL ? kvb__err_get(&c->err) : "";
}

static kvb_status_t map_curl_error(CURLcode rc)
{
    switch (rc) {
    case CURLE_OPERATION_TIMEDOUT:
        return KVB_ERR_TIMEOUT;
    case CURLE_COULDNT_CONNECT:
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_SEND_ERROR:
    case CURLE_RECV_ERROR:
    case CURLE_GOT_NOTHING:
    case CURLE_PARTIAL_FILE:
        return KVB_ERR_PEER;
    case CURLE_OUT_OF_MEMORY:
        return KVB_ERR_NOMEM;
    default:
        return KVB_ERR_PROTO;
    }
}

/* Map a non-200 answer to a status with the server's text in the message. */
static kvb_status_t bad_status(struct kvb_bootstrap_client *c, const char *method, const char *url,
                               long code, bool not_found_ok)
{
    char text[160];
    kvb_status_t st = KVB_ERR_PROTO;
    kvb__boot_sanitize(c->resp, c->resp_len, 120, text, sizeof(text));
    if (code == 401)
        st = KVB_ERR_AUTH;
    else if (code == 404 && not_found_ok)
        st = KVB_ERR_NOT_FOUND;
    return kvb__err_set(&c->err, st, "%s %s: HTTP %ld: %s", method, url, code, text);
}

/* One request; caller holds c->mu. KVB_OK only for HTTP 200, with the body
 * in c->resp (NUL-terminated, c->resp_len bytes); other answers map through
 * bad_status (404 to KVB_ERR_NOT_FOUND when not_found_ok). */
static kvb_status_t do_request(struct kvb_bootstrap_client *c, const char *method, const char *url,
                               const char *body, double timeout_s, bool not_found_ok)
{
    long code = 0;
    CURLcode rc;
    long ms;
    if (timeout_s <= 0)
        timeout_s = c->timeout_s;
    ms = (long)(timeout_s * 1000.0);
    if (ms < 1)
        ms = 1;
    c->resp_len = 0;
    c->resp_overflow = false;
    c->errbuf[0] = '\0';
    curl_easy_setopt(c->curl, CURLOPT_URL, url);
    curl_easy_setopt(c->curl, CURLOPT_TIMEOUT_MS, ms);
    curl_easy_setopt(c->curl, CURLOPT_CONNECTTIMEOUT_MS, ms);
    if (body != NULL) {
        curl_easy_setopt(c->curl, CURLOPT_POSTFIELDS, body);
        curl_easy_setopt(c->curl, CURLOPT_POSTFIELDSIZE, (long)strlen(body));
        curl_easy_setopt(c->curl, CURLOPT_CUSTOMREQUEST, "PUT");
        curl_easy_setopt(c->curl, CURLOPT_HTTPHEADER, c->put_headers);
    } else {
        curl_easy_setopt(c->curl, CURLOPT_CUSTOMREQUEST, NULL);
        curl_easy_setopt(c->curl, CURLOPT_HTTPGET, 1L);
        curl_easy_setopt(c->curl, CURLOPT_HTTPHEADER, c->get_headers);
    }
    rc = curl_easy_perform(c->curl);
    if (rc != CURLE_OK) {
        if (c->resp_overflow)
            return kvb__err_set(&c->err, KVB_ERR_PROTO, "%s %s: answer larger than %d bytes",
                                method, url, KVB_BOOTSTRAP_MAX_BODY);
        kvb_status_t st = map_curl_error(rc);
        if (st == KVB_ERR_TIMEOUT)
            return kvb__err_set(&c->err, st, "%s %s: no answer within %.3g s (%s)", method, url,
                                timeout_s, c->errbuf[0] ? c->errbuf : curl_easy_strerror(rc));
        return kvb__err_set(&c->err, st, "%s %s: %s", method, url,
                            c->errbuf[0] ? c->errbuf : curl_easy_strerror(rc));
    }
    c->resp[c->resp_len] = '\0';
    curl_easy_getinfo(c->curl, CURLINFO_RESPONSE_CODE, &code);
    return code == 200 ? KVB_OK : bad_status(c, method, url, code, not_found_ok);
}

KVB_API kvb_status_t kvb_bootstrap_client_register(kvb_bootstrap_client_h c,
                                                   const kvb_bootstrap_registration_t *reg,
                                                   double timeout_s)
{
    char reason[KVB__BOOT_REASON_MAX], *url = NULL, *body = NULL;
    kvb__boot_reg_t r;
    json_t *o;
    kvb_status_t st;

    if (c == NULL)
        return KVB_ERR_INVALID;
    st = kvb__boot_reg_from_public(reg, &r, reason, sizeof(reason));
    if (st != KVB_OK)
        return kvb__err_set(&c->err, st, "PUT %s/route: invalid registration: %s", c->base, reason);
    o = kvb__boot_reg_to_json(&r);
    body = o != NULL ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    kvb__boot_reg_clear(&r);
    if (body == NULL || asprintf(&url, "%s/route", c->base) < 0) {
        free(body);
        return kvb__err_set(&c->err, KVB_ERR_NOMEM, "PUT %s/route: out of memory", c->base);
    }
    pthread_mutex_lock(&c->mu);
    st = do_request(c, "PUT", url, body, timeout_s, false);
    pthread_mutex_unlock(&c->mu);
    free(body);
    free(url);
    return st;
}

KVB_API kvb_status_t kvb_bootstrap_client_parallel_info(kvb_bootstrap_client_h c, double timeout_s,
                                                        kvb_bootstrap_parallel_info_t *info_p)
{
    char reason[KVB__BOOT_REASON_MAX], *url = NULL;
    kvb_status_t st;
    if (c == NULL || info_p == NULL)
        return KVB_ERR_INVALID;
    if (asprintf(&url, "%s/route?engine_rank=-1&target_dp_group=-1&target_pp_rank=-1", c->base) < 0)
        return kvb__err_set(&c->err, KVB_ERR_NOMEM, "GET %s/route: out of memory", c->base);
    pthread_mutex_lock(&c->mu);
    st = do_request(c, "GET", url, NULL, timeout_s, true);
    if (st == KVB_OK) {
        st = kvb__boot_parallel_info_parse(c->resp, c->resp_len, info_p, reason, sizeof(reason));
        if (st != KVB_OK)
            kvb__err_set(&c->err, st, "GET %s: bad answer: %s", url, reason);
    }
    pthread_mutex_unlock(&c->mu);
    free(url);
    return st;
}

KVB_API kvb_status_t kvb_bootstrap_client_lookup(kvb_bootstrap_client_h c, int32_t dp_group,
                                                 int32_t tp_rank, int32_t pp_rank, double timeout_s,
                                                 kvb_bootstrap_rank_addr_t *addr_p)
{
    char reason[KVB__BOOT_REASON_MAX], *url = NULL;
    kvb_status_t st;
    if (c == NULL || addr_p == NULL)
        return KVB_ERR_INVALID;
    if (dp_group < 0 || tp_rank < 0 || pp_rank < 0)
        return kvb__err_set(&c->err, KVB_ERR_INVALID,
                            "GET %s/route: negative rank (dp %d tp %d pp %d)", c->base,
                            (int)dp_group, (int)tp_rank, (int)pp_rank);
    if (asprintf(&url, "%s/route?engine_rank=%d&target_dp_group=%d&target_pp_rank=%d", c->base,
                 (int)tp_rank, (int)dp_group, (int)pp_rank) < 0)
        return kvb__err_set(&c->err, KVB_ERR_NOMEM, "GET %s/route: out of memory", c->base);
    pthread_mutex_lock(&c->mu);
    st = do_request(c, "GET", url, NULL, timeout_s, true);
    if (st == KVB_OK) {
        kvb_bootstrap_rank_addr_t a;
        st = kvb__boot_rank_addr_parse(c->resp, c->resp_len, &a, reason, sizeof(reason));
        if (st != KVB_OK)
            kvb__err_set(&c->err, st, "GET %s: bad answer: %s", url, reason);
        else
            *addr_p = a;
    }
    pthread_mutex_unlock(&c->mu);
    free(url);
    return st;
}

KVB_API kvb_status_t kvb_bootstrap_client_health(kvb_bootstrap_client_h c, double timeout_s)
{
    char *url = NULL;
    kvb_status_t st;
    if (c == NULL)
        return KVB_ERR_INVALID;
    if (asprintf(&url, "%s/health", c->base) < 0)
        return kvb__err_set(&c->err, KVB_ERR_NOMEM, "GET %s/health: out of memory", c->base);
    pthread_mutex_lock(&c->mu);
    st = do_request(c, "GET", url, NULL, timeout_s, false);
    pthread_mutex_unlock(&c->mu);
    free(url);
    return st;
}
