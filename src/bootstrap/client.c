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
#include <unistd.h>

#define DEFAULT_TIMEOUT_S 5.0
/* 503 (2026: not every prefill rank registered yet) is asked again after
 * these pauses (doubling), within the call's time-out. */
#define RETRY_FIRST_S 0.05
#define RETRY_MAX_S 0.5

struct kvb_bootstrap_client {
    pthread_mutex_t mu; /* one request at a time on the easy handle */
    kvb__err_t err;
    CURL *curl;
    char *base; /* "http://host:port" */
    struct curl_slist *get_headers, *put_headers;
    double timeout_s;
    char errbuf[CURL_ERROR_SIZE];
    char *resp; /* resp_cap bytes, grown up to KVB_BOOTSTRAP_MAX_BODY + 1 */
    size_t resp_len, resp_cap;
    bool resp_overflow;
    long code;       /* HTTP status of the last answer, 0 = none */
    int dialect;     /* configured: 2025 or 2026 */
    int dialect_now; /* spoken now (2025 after a fallback); under mu */
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
    if (c->resp_len + n + 1 > c->resp_cap) { /* most answers are small: grow on demand */
        size_t cap = 2 * c->resp_cap > c->resp_len + n + 1 ? 2 * c->resp_cap : c->resp_len + n + 1;
        cap = cap < KVB_BOOTSTRAP_MAX_BODY + 1 ? cap : KVB_BOOTSTRAP_MAX_BODY + 1;
        char *p = realloc(c->resp, cap);
        if (p == NULL)
            return 0;
        c->resp = p;
        c->resp_cap = cap;
    }
    memcpy(c->resp + c->resp_len, data, n);
    c->resp_len += n;
    return n;
}

/* KVBRIDGE_SGLANG_DIALECT=2025|2026; anything else warns and means 2026. */
static int env_dialect(void)
{
    const char *v = kvb__env_get("KVBRIDGE_SGLANG_DIALECT", NULL);
    if (v == NULL || v[0] == '\0' || strcmp(v, "2026") == 0)
        return KVB_BOOTSTRAP_DIALECT_2026;
    if (strcmp(v, "2025") == 0)
        return KVB_BOOTSTRAP_DIALECT_2025;
    KVB_LOGW("KVBRIDGE_SGLANG_DIALECT=\"%.16s\" is not 2025 or 2026: using 2026", v);
    return KVB_BOOTSTRAP_DIALECT_2026;
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
    c->dialect = (mask & KVB_BOOTSTRAP_CLIENT_PARAM_DIALECT) ? params->dialect : 0;
    if (c->dialect == KVB_BOOTSTRAP_DIALECT_DEFAULT)
        c->dialect = env_dialect();
    c->dialect_now = c->dialect;
    if (c->dialect != KVB_BOOTSTRAP_DIALECT_2025 && c->dialect != KVB_BOOTSTRAP_DIALECT_2026) {
        KVB_LOGE("bootstrap client: dialect %d is not 0, 2025 or 2026", c->dialect);
        kvb_bootstrap_client_destroy(c);
        return KVB_ERR_INVALID;
    }
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
    c->resp_cap = 16 * 1024;
    c->resp = malloc(c->resp_cap);
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
    else if ((code == 404 || code == 503) && not_found_ok)
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
    c->code = 0;
    c->errbuf[0] = '\0';
    curl_easy_setopt(c->curl, CURLOPT_URL, url);
    curl_easy_setopt(c->curl, CURLOPT_TIMEOUT_MS, ms);
    curl_easy_setopt(c->curl, CURLOPT_CONNECTTIMEOUT_MS, ms);
    if (body != NULL) {
        curl_easy_setopt(c->curl, CURLOPT_POSTFIELDS, body);
        curl_easy_setopt(c->curl, CURLOPT_POSTFIELDSIZE, (long)strlen(body));
        curl_easy_setopt(c->curl, CURLOPT_CUSTOMREQUEST, method); /* PUT or POST */
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
    c->code = code;
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
    st = kvb__boot_reg_from_public(reg, c->dialect, &r, reason, sizeof(reason));
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

kvb_status_t kvb__bootstrap_client_put_route(kvb_bootstrap_client_h c, const char *body,
                                             double timeout_s)
{
    char *url = NULL;
    if (c == NULL || body == NULL)
        return KVB_ERR_INVALID;
    if (asprintf(&url, "%s/route", c->base) < 0)
        return kvb__err_set(&c->err, KVB_ERR_NOMEM, "PUT %s/route: out of memory", c->base);
    pthread_mutex_lock(&c->mu);
    kvb_status_t st = do_request(c, "PUT", url, body, timeout_s, false);
    pthread_mutex_unlock(&c->mu);
    free(url);
    return st;
}

/* A seed-001 server's answer to a 2026 query (PROTOCOL-SGLANG-2026.md 11.1). */
static bool old_dialect_refusal(const struct kvb_bootstrap_client *c)
{
    return c->code == 400 && c->resp_len == strlen(KVB__BOOT_MSG_MISSING) &&
           memcmp(c->resp, KVB__BOOT_MSG_MISSING, c->resp_len) == 0;
}

/* GET of a 2026 look-up (caller holds c->mu): with retry_503, a 503 is asked
 * again after a growing pause until the time-out (SGLang's decode retries
 * the parallel info; a per-rank 503 fails its room at once). Returns
 * do_request's status (KVB_OK = 200 in c->resp). */
static kvb_status_t get_2026(struct kvb_bootstrap_client *c, const char *url, double timeout_s,
                             bool retry_503)
{
    double end, pause = RETRY_FIRST_S;
    kvb_status_t st;
    if (timeout_s <= 0)
        timeout_s = c->timeout_s;
    end = kvb__now_s() + timeout_s;
    for (;;) {
        st = do_request(c, "GET", url, NULL, end - kvb__now_s(), true);
        if (c->code != 503 || !retry_503)
            return st;
        double left = end - kvb__now_s();
        if (left <= 0.001)
            return kvb__err_set(&c->err, st, "%s (still 503 after %.3g s)", kvb__err_get(&c->err),
                                timeout_s);
        usleep((useconds_t)((pause < left ? pause : left) * 1e6));
        pause = pause * 2 < RETRY_MAX_S ? pause * 2 : RETRY_MAX_S;
        if (end - kvb__now_s() <= 0.001)
            return kvb__err_set(&c->err, st, "%s (still 503 after %.3g s)", kvb__err_get(&c->err),
                                timeout_s);
    }
}

/* One look-up in the dialect spoken now (caller holds c->mu): url_new
 * (2026) or url_old (2025; NULL when the question has no 2025 form). A 2026
 * client refused by a seed-001 server asks url_old and speaks 2025 from then
 * on. *dialect_p: the dialect of the answer. */
static kvb_status_t lookup_get(struct kvb_bootstrap_client *c, const char *url_new,
                               const char *url_old, double timeout_s, bool retry_503,
                               int *dialect_p)
{
    double end = kvb__now_s() + (timeout_s > 0 ? timeout_s : c->timeout_s);
    kvb_status_t st;
    if (c->dialect_now == KVB_BOOTSTRAP_DIALECT_2025) {
        *dialect_p = KVB_BOOTSTRAP_DIALECT_2025;
        if (url_old == NULL)
            return kvb__err_set(&c->err, KVB_ERR_INVALID,
                                "GET %s: no seed-001 (2025) form of this question", url_new);
        return do_request(c, "GET", url_old, NULL, timeout_s, true);
    }
    *dialect_p = KVB_BOOTSTRAP_DIALECT_2026;
    st = get_2026(c, url_new, timeout_s, retry_503);
    if (st == KVB_OK || !old_dialect_refusal(c) || url_old == NULL || end - kvb__now_s() <= 0)
        return st;
    st = do_request(c, "GET", url_old, NULL, end - kvb__now_s(), true);
    if (st == KVB_OK || c->code == 404) {
        KVB_LOGI("bootstrap client: %s speaks the seed-001 (2025) dialect; this client follows",
                 c->base);
        c->dialect_now = KVB_BOOTSTRAP_DIALECT_2025;
        *dialect_p = KVB_BOOTSTRAP_DIALECT_2025;
    }
    return st;
}

KVB_API kvb_status_t kvb_bootstrap_client_parallel_info_ext(
    kvb_bootstrap_client_h c, double timeout_s, kvb_bootstrap_parallel_info_t *info_p,
    kvb_bootstrap_parallel_info_ext_t *ext_p)
{
    char reason[KVB__BOOT_REASON_MAX], *url = NULL, *old = NULL;
    int dialect;
    kvb_status_t st;
    if (c == NULL || info_p == NULL)
        return KVB_ERR_INVALID;
    if (asprintf(&url,
                 "%s/route?prefill_dp_rank=-1&prefill_cp_rank=-1&target_tp_rank=-1"
                 "&target_pp_rank=-1&kvbridge_layout=1",
                 c->base) < 0)
        url = NULL;
    if (url == NULL ||
        asprintf(&old, "%s/route?engine_rank=-1&target_dp_group=-1&target_pp_rank=-1", c->base) <
            0) {
        free(url);
        return kvb__err_set(&c->err, KVB_ERR_NOMEM, "GET %s/route: out of memory", c->base);
    }
    pthread_mutex_lock(&c->mu);
    st = lookup_get(c, url, old, timeout_s, true, &dialect);
    if (st == KVB_OK) {
        if (dialect == KVB_BOOTSTRAP_DIALECT_2026) {
            st = kvb__boot_parallel_info_parse_2026(c->resp, c->resp_len, info_p, ext_p, reason,
                                                    sizeof(reason));
        } else {
            st =
                kvb__boot_parallel_info_parse(c->resp, c->resp_len, info_p, reason, sizeof(reason));
            /* TokenSpeed's server answers the seed-001 query in its own shape
             * (PROTOCOL-TOKENSPEED.md 11.3): its ranks speak its dialect. */
            char why_ts[KVB__BOOT_REASON_MAX];
            if (st == KVB_ERR_PROTO &&
                kvb__boot_parallel_info_parse_ts(c->resp, c->resp_len, info_p, why_ts,
                                                 sizeof(why_ts)) == KVB_OK)
                st = KVB_OK;
            if (st == KVB_OK)
                kvb__boot_info_ext_default(ext_p);
        }
        /* TokenSpeed ranks: its server's shape, or kvbridge's server saying
         * so ("kvbridge_peer_dialect"; either query style). */
        if (st == KVB_OK && ext_p != NULL && (ext_p->field_mask & KVB_BOOTSTRAP_INFO_DIALECT) &&
            kvb__boot_answer_is_ts(c->resp, c->resp_len))
            ext_p->dialect = KVB_BOOTSTRAP_DIALECT_TOKENSPEED;
        /* TokenSpeed 0.1.1 (CachePD) ranks: their own answer shape, whose
         * layout contract the decode reads (kvb__bootstrap_client_answer). */
        if (st != KVB_OK && kvb__boot_answer_is_cpd(c->resp, c->resp_len)) {
            st = kvb__boot_parallel_info_parse_cpd(c->resp, c->resp_len, info_p, reason,
                                                   sizeof(reason));
            if (st == KVB_OK)
                kvb__boot_info_ext_default(ext_p);
            if (st == KVB_OK && ext_p != NULL && (ext_p->field_mask & KVB_BOOTSTRAP_INFO_DIALECT))
                ext_p->dialect = KVB_BOOTSTRAP_DIALECT_CACHEPD;
        }
        if (st != KVB_OK)
            kvb__err_set(&c->err, st, "GET %s: bad answer: %s",
                         dialect == KVB_BOOTSTRAP_DIALECT_2026 ? url : old, reason);
    }
    pthread_mutex_unlock(&c->mu);
    free(url);
    free(old);
    return st;
}

char *kvb__bootstrap_client_answer(kvb_bootstrap_client_h c, size_t *len_p)
{
    char *copy = NULL;
    *len_p = 0;
    if (c == NULL)
        return NULL;
    pthread_mutex_lock(&c->mu);
    if (c->resp != NULL && (copy = malloc(c->resp_len + 1)) != NULL) {
        memcpy(copy, c->resp, c->resp_len + 1);
        *len_p = c->resp_len;
    }
    pthread_mutex_unlock(&c->mu);
    return copy;
}

KVB_API kvb_status_t kvb_bootstrap_client_parallel_info(kvb_bootstrap_client_h c, double timeout_s,
                                                        kvb_bootstrap_parallel_info_t *info_p)
{
    return kvb_bootstrap_client_parallel_info_ext(c, timeout_s, info_p, NULL);
}

KVB_API kvb_status_t kvb_bootstrap_client_lookup_ext(kvb_bootstrap_client_h c, int32_t dp_group,
                                                     int32_t cp_rank, int32_t tp_rank,
                                                     int32_t pp_rank, double timeout_s,
                                                     kvb_bootstrap_rank_addr_t *addr_p,
                                                     kvb_bootstrap_rank_ext_t *ext_p)
{
    char reason[KVB__BOOT_REASON_MAX], *url = NULL, *old = NULL;
    int dialect;
    kvb_status_t st;
    if (c == NULL || addr_p == NULL)
        return KVB_ERR_INVALID;
    if (dp_group < 0 || cp_rank < 0 || tp_rank < 0 || pp_rank < 0)
        return kvb__err_set(&c->err, KVB_ERR_INVALID,
                            "GET %s/route: negative rank (dp %d cp %d tp %d pp %d)", c->base,
                            (int)dp_group, (int)cp_rank, (int)tp_rank, (int)pp_rank);
    if (asprintf(&url,
                 "%s/route?prefill_dp_rank=%d&prefill_cp_rank=%d&target_tp_rank=%d"
                 "&target_pp_rank=%d",
                 c->base, (int)dp_group, (int)cp_rank, (int)tp_rank, (int)pp_rank) < 0)
        url = NULL;
    if (url != NULL && cp_rank == 0 &&
        asprintf(&old, "%s/route?engine_rank=%d&target_dp_group=%d&target_pp_rank=%d", c->base,
                 (int)tp_rank, (int)dp_group, (int)pp_rank) < 0) {
        free(url);
        url = NULL;
    }
    if (url == NULL)
        return kvb__err_set(&c->err, KVB_ERR_NOMEM, "GET %s/route: out of memory", c->base);
    pthread_mutex_lock(&c->mu);
    st = lookup_get(c, url, old, timeout_s, false, &dialect);
    if (st == KVB_OK) {
        kvb_bootstrap_rank_addr_t a;
        int kvbridge = 0;
        st = kvb__boot_rank_addr_parse(c->resp, c->resp_len, &a, &kvbridge, reason, sizeof(reason));
        if (st != KVB_OK) {
            kvb__err_set(&c->err, st, "GET %s: bad answer: %s",
                         dialect == KVB_BOOTSTRAP_DIALECT_2026 ? url : old, reason);
        } else {
            *addr_p = a;
            if (ext_p != NULL && (ext_p->field_mask & KVB_BOOTSTRAP_RANK_KVBRIDGE))
                ext_p->kvbridge = kvbridge;
        }
    }
    pthread_mutex_unlock(&c->mu);
    free(url);
    free(old);
    return st;
}

kvb_status_t kvb__bootstrap_client_lookup_rank(kvb_bootstrap_client_h c, int32_t dp_group,
                                               int32_t rank, double timeout_s,
                                               kvb_bootstrap_rank_addr_t *addr_p)
{
    char reason[KVB__BOOT_REASON_MAX], *url = NULL;
    if (c == NULL || addr_p == NULL || dp_group < 0 || rank < 0)
        return KVB_ERR_INVALID;
    if (asprintf(&url, "%s/route?engine_rank=%d&target_dp_group=%d", c->base, (int)rank,
                 (int)dp_group) < 0)
        return kvb__err_set(&c->err, KVB_ERR_NOMEM, "GET %s/route: out of memory", c->base);
    pthread_mutex_lock(&c->mu);
    kvb_status_t st = do_request(c, "GET", url, NULL, timeout_s, true);
    if (st == KVB_OK) {
        kvb_bootstrap_rank_addr_t a;
        int kvbridge = 0;
        st = kvb__boot_rank_addr_parse(c->resp, c->resp_len, &a, &kvbridge, reason, sizeof(reason));
        if (st == KVB_OK)
            *addr_p = a;
        else
            kvb__err_set(&c->err, st, "GET %s: bad answer: %s", url, reason);
    }
    pthread_mutex_unlock(&c->mu);
    free(url);
    return st;
}

KVB_API kvb_status_t kvb_bootstrap_client_lookup_cp(kvb_bootstrap_client_h c, int32_t dp_group,
                                                    int32_t cp_rank, int32_t tp_rank,
                                                    int32_t pp_rank, double timeout_s,
                                                    kvb_bootstrap_rank_addr_t *addr_p)
{
    return kvb_bootstrap_client_lookup_ext(c, dp_group, cp_rank, tp_rank, pp_rank, timeout_s,
                                           addr_p, NULL);
}

KVB_API kvb_status_t kvb_bootstrap_client_lookup(kvb_bootstrap_client_h c, int32_t dp_group,
                                                 int32_t tp_rank, int32_t pp_rank, double timeout_s,
                                                 kvb_bootstrap_rank_addr_t *addr_p)
{
    return kvb_bootstrap_client_lookup_cp(c, dp_group, 0, tp_rank, pp_rank, timeout_s, addr_p);
}

/* POST path with body (caller frees nothing; body is freed here). */
static kvb_status_t post(struct kvb_bootstrap_client *c, const char *path, char *body,
                         double timeout_s)
{
    char *url = NULL;
    kvb_status_t st;
    if (body == NULL || asprintf(&url, "%s%s", c->base, path) < 0) {
        free(body);
        return kvb__err_set(&c->err, KVB_ERR_NOMEM, "POST %s%s: out of memory", c->base, path);
    }
    st = do_request(c, "POST", url, body, timeout_s, false);
    free(body);
    free(url);
    return st;
}

KVB_API kvb_status_t kvb_bootstrap_client_register_dp_rank(kvb_bootstrap_client_h c, uint64_t room,
                                                           int32_t dp_rank, double timeout_s)
{
    char *body = NULL;
    kvb_status_t st;
    if (c == NULL)
        return KVB_ERR_INVALID;
    if (dp_rank < 0 || dp_rank >= KVB__BOOT_MAX_SIZE)
        return kvb__err_set(&c->err, KVB_ERR_INVALID,
                            "POST %s/register_dp_rank: dp_rank %d outside [0, %d]", c->base,
                            (int)dp_rank, KVB__BOOT_MAX_SIZE - 1);
    /* Rooms above 2^63-1 go as decimal strings (SGLang's int() takes them;
     * JSON parsers with 64-bit signed integers, jansson's too, do not take
     * such numbers). */
    char q[4] = "";
    if (room > (uint64_t)INT64_MAX)
        strcpy(q, "\"");
    if (asprintf(&body, "{\"bootstrap_room\":%s%llu%s,\"dp_rank\":%d}", q, (unsigned long long)room,
                 q, (int)dp_rank) < 0)
        body = NULL;
    pthread_mutex_lock(&c->mu);
    st = post(c, "/register_dp_rank", body, timeout_s);
    pthread_mutex_unlock(&c->mu);
    return st;
}

/* {"bootstrap_rooms":[r0,r1,...]} */
static char *rooms_body(const uint64_t *rooms, size_t n)
{
    size_t cap = 32 + n * 24, off;
    char *b = malloc(cap);
    if (b == NULL)
        return NULL;
    off = (size_t)snprintf(b, cap, "{\"bootstrap_rooms\":[");
    for (size_t i = 0; i < n; i++) {
        const char *q = rooms[i] > (uint64_t)INT64_MAX ? "\"" : ""; /* as above */
        off += (size_t)snprintf(b + off, cap - off, "%s%s%llu%s", i ? "," : "", q,
                                (unsigned long long)rooms[i], q);
    }
    snprintf(b + off, cap - off, "]}");
    return b;
}

KVB_API kvb_status_t kvb_bootstrap_client_query_dp_ranks(kvb_bootstrap_client_h c,
                                                         const uint64_t *rooms, size_t n,
                                                         double timeout_s, int32_t *dp_ranks_p)
{
    char reason[KVB__BOOT_REASON_MAX];
    kvb_status_t st;
    if (c == NULL || rooms == NULL || dp_ranks_p == NULL || n == 0 || n > KVB__BOOT_MAX_QUERY_ROOMS)
        return c != NULL ? kvb__err_set(&c->err, KVB_ERR_INVALID,
                                        "POST %s/query_dp_ranks: 1..%d rooms, non-NULL arrays",
                                        c->base, KVB__BOOT_MAX_QUERY_ROOMS)
                         : KVB_ERR_INVALID;
    pthread_mutex_lock(&c->mu);
    st = post(c, "/query_dp_ranks", rooms_body(rooms, n), timeout_s);
    if (st == KVB_OK) {
        st = kvb__boot_dp_answer_parse(c->resp, c->resp_len, rooms, n, dp_ranks_p, reason,
                                       sizeof(reason));
        if (st != KVB_OK)
            kvb__err_set(&c->err, st, "POST %s/query_dp_ranks: bad answer: %s", c->base, reason);
    }
    pthread_mutex_unlock(&c->mu);
    return st;
}

KVB_API int kvb_bootstrap_client_dialect(kvb_bootstrap_client_h c)
{
    int d;
    if (c == NULL)
        return 0;
    pthread_mutex_lock(&c->mu);
    d = c->dialect_now;
    pthread_mutex_unlock(&c->mu);
    return d;
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
