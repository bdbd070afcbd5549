/* Helpers shared by the bootstrap tests: a raw HTTP request with libcurl (so
 * tests see exact status codes, bodies and headers) and payload builders. */
#ifndef KVB_BOOT_TEST_UTIL_H
#define KVB_BOOT_TEST_UTIL_H

#include <kvbridge/bootstrap.h>

#include <curl/curl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvb_test.h"

#define BT_UNUSED __attribute__((unused))

typedef struct http_resp {
    long code;
    char *body; /* NUL-terminated */
    size_t len;
    char ctype[128];
} http_resp_t;

static BT_UNUSED size_t http_resp_write(char *data, size_t size, size_t nmemb, void *arg)
{
    http_resp_t *r = arg;
    size_t n = size * nmemb;
    char *b = realloc(r->body, r->len + n + 1);
    if (b == NULL)
        return 0;
    memcpy(b + r->len, data, n);
    r->body = b;
    r->len += n;
    r->body[r->len] = '\0';
    return n;
}

static BT_UNUSED void http_resp_free(http_resp_t *r)
{
    free(r->body);
    memset(r, 0, sizeof(*r));
}

/* One request on a fresh connection; extra_header may be NULL. Fails the test
 * on a transport error. */
static BT_UNUSED void http_req(const char *method, const char *url, const char *body,
                               size_t body_len, const char *extra_header, http_resp_t *r)
{
    CURL *c = curl_easy_init();
    struct curl_slist *h = NULL;
    char *ct = NULL;
    CURLcode rc;
    CHECK(c != NULL);
    memset(r, 0, sizeof(*r));
    r->body = calloc(1, 1);
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_NOPROXY, "*");
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_TIMEOUT, 10L);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, http_resp_write);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, r);
    h = curl_slist_append(h, "Expect:");
    if (extra_header != NULL)
        h = curl_slist_append(h, extra_header);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
    if (strcmp(method, "HEAD") == 0)
        curl_easy_setopt(c, CURLOPT_NOBODY, 1L);
    else if (strcmp(method, "GET") != 0)
        curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method);
    if (body != NULL) {
        curl_easy_setopt(c, CURLOPT_POSTFIELDS, body);
        curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE, (long)body_len);
    }
    rc = curl_easy_perform(c);
    if (rc != CURLE_OK) {
        fprintf(stderr, "%s %s: %s\n", method, url, curl_easy_strerror(rc));
        CHECK(rc == CURLE_OK);
    }
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &r->code);
    curl_easy_getinfo(c, CURLINFO_CONTENT_TYPE, &ct);
    snprintf(r->ctype, sizeof(r->ctype), "%s", ct != NULL ? ct : "");
    curl_slist_free_all(h);
    curl_easy_cleanup(c);
}

/* Request and check status and exact body (body_expect NULL = don't check). */
static BT_UNUSED void expect_http(const char *method, const char *url, const char *body,
                                  const char *extra_header, long code, const char *body_expect)
{
    http_resp_t r;
    http_req(method, url, body, body != NULL ? strlen(body) : 0, extra_header, &r);
    if (r.code != code || (body_expect != NULL && strcmp(r.body, body_expect) != 0)) {
        fprintf(stderr, "%s %s body=%s\n  got %ld \"%s\", expected %ld \"%s\"\n", method, url,
                body != NULL ? body : "(none)", r.code, r.body, code,
                body_expect != NULL ? body_expect : "*");
        exit(1);
    }
    http_resp_free(&r);
}

/* SGLang's prefill PUT payload (seed 001 _register_to_bootstrap). */
static BT_UNUSED char *seed_payload(int tp_size, int tp_rank, int dp_size, int dp_rank, int pp_size,
                                    int pp_rank, int sys_dp_size, int sys_dp_rank, const char *ip,
                                    int port)
{
    char *s = NULL;
    CHECK(asprintf(&s,
                   "{\"role\": \"Prefill\", \"attn_tp_size\": %d, \"attn_tp_rank\": %d, "
                   "\"attn_dp_size\": %d, \"attn_dp_rank\": %d, \"pp_size\": %d, "
                   "\"pp_rank\": %d, \"system_dp_size\": %d, \"system_dp_rank\": %d, "
                   "\"rank_ip\": \"%s\", \"rank_port\": %d}",
                   tp_size, tp_rank, dp_size, dp_rank, pp_size, pp_rank, sys_dp_size, sys_dp_rank,
                   ip, port) > 0);
    return s;
}

static BT_UNUSED kvb_bootstrap_server_h start_server(const char *host, const char *token,
                                                     int auth_reads)
{
    kvb_bootstrap_server_params_t p;
    kvb_bootstrap_server_h s = NULL;
    memset(&p, 0, sizeof(p));
    p.field_mask = KVB_BOOTSTRAP_SERVER_PARAM_HOST | KVB_BOOTSTRAP_SERVER_PARAM_PORT |
                   KVB_BOOTSTRAP_SERVER_PARAM_AUTH_READS;
    p.host = host;
    p.port = 0;
    p.auth_reads = auth_reads;
    if (token != NULL) {
        p.field_mask |= KVB_BOOTSTRAP_SERVER_PARAM_TOKEN;
        p.token = token;
    }
    CHECK_EQ(kvb_bootstrap_server_start(&p, &s), KVB_OK);
    CHECK(kvb_bootstrap_server_port(s) != 0);
    return s;
}

#endif
