/* Bootstrap HTTP server on libmicrohttpd (routes in docs/bootstrap.md).
 *
 * libmicrohttpd runs a small pool of its own threads; every handler takes the
 * server's one lock around the table and the counters, and never does I/O
 * while holding it. Request bodies are buffered up to KVB_BOOTSTRAP_MAX_BODY;
 * an idle or stalled connection is closed after conn_timeout_s. */
#include <kvbridge/bootstrap.h>

#include "bootstrap/boot_table.h"
#include "bootstrap/dp_rooms.h"
#include "core/core.h"
#include "proto/bootstrap_proto.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <microhttpd.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#define DEFAULT_HOST "127.0.0.1"
#define DEFAULT_THREADS 4u
#define DEFAULT_CONN_TIMEOUT_S 10.0
#define DEFAULT_DP_ROOM_TTL_S 120.0
#define DEFAULT_MAX_DP_ROOMS ((size_t)1 << 18)
/* Bytes of an over-long chunked body read and dropped before the connection
 * is cut (a Content-Length over the limit is refused before any byte). */
#define DISCARD_MAX (1024 * 1024)

#define CT_TEXT "text/plain; charset=utf-8"
#define CT_JSON "application/json"
#define CT_PROM "text/plain; version=0.0.4; charset=utf-8"

enum { ERR_400, ERR_401, ERR_404, ERR_405, ERR_500, ERR_OTHER, N_ERR };
static const char *const g_err_codes[N_ERR] = {"400", "401", "404", "405", "500", "other"};

struct kvb_bootstrap_server {
    struct MHD_Daemon *daemon;
    pthread_mutex_t mu; /* guards table and counters */
    kvb__boot_table_t table;
    kvb__dp_rooms_t dp_rooms; /* POST /register_dp_rank */
    kvb__boot_cpd_t *cpd;     /* TokenSpeed 0.1.1 (CachePD) ranks, NULL until one registers */
    uint64_t registrations, lookups_info, lookups_rank, errors[N_ERR];
    uint64_t started_ns;
    char *token; /* NULL: no authentication */
    size_t token_len;
    bool auth_reads;
    uint16_t port;
    char address[NI_MAXHOST + NI_MAXSERV + 4];
};

/* Requests with a body. */
enum body_kind { BODY_PUT_ROUTE, BODY_REGISTER_DP, BODY_QUERY_DP };

/* Per-request state (MHD's con_cls), freed by on_completed. */
struct req_ctx {
    enum body_kind kind;
    char *buf;
    size_t len, cap; /* cap grows up to KVB_BOOTSTRAP_MAX_BODY */
    size_t dropped;  /* bytes past the limit, read and discarded */
};

static void mhd_log(void *cls, const char *fmt, va_list ap)
{
    char line[256];
    vsnprintf(line, sizeof(line), fmt, ap);
    line[strcspn(line, "\r\n")] = '\0';
    KVB_LOGD("bootstrap server (libmicrohttpd): %s", line);
}

static void count_status(struct kvb_bootstrap_server *s, unsigned code)
{
    int k;
    if (code < 400)
        return;
    switch (code) {
    case 400:
        k = ERR_400;
        break;
    case 401:
        k = ERR_401;
        break;
    case 404:
        k = ERR_404;
        break;
    case 405:
        k = ERR_405;
        break;
    case 500:
        k = ERR_500;
        break;
    default:
        k = ERR_OTHER;
    }
    pthread_mutex_lock(&s->mu);
    s->errors[k]++;
    pthread_mutex_unlock(&s->mu);
}

/* allow: the Allow header of a 405. */
static enum MHD_Result respond_allow(struct kvb_bootstrap_server *s, struct MHD_Connection *c,
                                     unsigned code, const char *ctype, const char *body, size_t len,
                                     const char *allow)
{
    struct MHD_Response *r =
        MHD_create_response_from_buffer(len, (void *)body, MHD_RESPMEM_MUST_COPY);
    enum MHD_Result ret;
    if (r == NULL)
        return MHD_NO;
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, ctype);
    if (code == 401)
        MHD_add_response_header(r, MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer");
    if (code == 405)
        MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, allow);
    ret = MHD_queue_response(c, code, r);
    MHD_destroy_response(r);
    count_status(s, code);
    return ret;
}

static enum MHD_Result respond(struct kvb_bootstrap_server *s, struct MHD_Connection *c,
                               unsigned code, const char *ctype, const char *body, size_t len)
{
    return respond_allow(s, c, code, ctype, body, len, "GET, PUT");
}

static enum MHD_Result respond_text(struct kvb_bootstrap_server *s, struct MHD_Connection *c,
                                    unsigned code, const char *text)
{
    return respond(s, c, code, CT_TEXT, text, strlen(text));
}

/* Take ownership of a dumped JSON string (NULL = out of memory → 500). */
static enum MHD_Result respond_json(struct kvb_bootstrap_server *s, struct MHD_Connection *c,
                                    char *json)
{
    enum MHD_Result ret;
    if (json == NULL)
        return respond_text(s, c, 500, "out of memory");
    ret = respond(s, c, 200, CT_JSON, json, strlen(json));
    free(json);
    return ret;
}

/* "Authorization: Bearer <token>", compared in constant time. */
static bool authorized(const struct kvb_bootstrap_server *s, struct MHD_Connection *c)
{
    const char *h;
    size_t n;
    unsigned char diff = 0;
    if (s->token == NULL)
        return true;
    h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    if (h == NULL || strncasecmp(h, "Bearer ", 7) != 0)
        return false;
    h += 7;
    while (*h == ' ')
        h++;
    n = strlen(h);
    if (n != s->token_len)
        return false;
    for (size_t i = 0; i < n; i++)
        diff |= (unsigned char)(h[i] ^ s->token[i]);
    return diff == 0;
}

static const char *arg(struct MHD_Connection *c, const char *key)
{
    return MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, key);
}

/* The 2026 look-ups (PROTOCOL-SGLANG-2026.md 3.2, 3.7): 503 until every rank
 * registered; the parallel info with exactly SGLang's keys; 404 with SGLang's
 * text. While a rank registered without the 2026 keys (it speaks seed 001
 * or TokenSpeed's dialect on ZeroMQ), or only TokenSpeed 0.1.1 (CachePD)
 * ranks registered, 400 as their own server answers: a 2026 decode's
 * KV-args would kill such a prefill's control thread. */
static enum MHD_Result get_route_2026(struct kvb_bootstrap_server *s, struct MHD_Connection *c,
                                      const kvb__boot_query_t *q)
{
    char text[192], *json = NULL;
    bool nomem = false, ready, found = false;
    pthread_mutex_lock(&s->mu);
    /* CachePD ranks alone: TokenSpeed's server's 400 too (a kvbridge decode
     * then asks in the old style and learns what the prefill speaks) */
    bool legacy =
        kvb__boot_table_legacy(&s->table) || (kvb__boot_cpd_active(s->cpd) && s->table.count == 0);
    pthread_mutex_unlock(&s->mu);
    if (legacy)
        return respond_text(s, c, 400, KVB__BOOT_MSG_MISSING);
    pthread_mutex_lock(&s->mu);
    ready = kvb__boot_table_ready(&s->table);
    if (!ready) {
        snprintf(text, sizeof(text), KVB__BOOT_MSG_NOT_READY, (long long)s->table.count);
    } else if (q->parallel_info) {
        json_t *o = kvb__boot_table_parallel_info_2026(&s->table, q->want_layout, &nomem);
        found = o != NULL;
        json = o != NULL ? json_dumps(o, JSON_COMPACT) : NULL;
        json_decref(o);
        if (json != NULL)
            s->lookups_info++;
    } else {
        const kvb__boot_entry_t *e =
            kvb__boot_table_find(&s->table, q->dp_group, q->cp_rank, q->engine_rank, q->pp_rank);
        json_t *o = e != NULL ? kvb__boot_entry_json(e) : NULL;
        found = e != NULL;
        json = o != NULL ? json_dumps(o, JSON_COMPACT) : NULL;
        json_decref(o);
        if (json != NULL)
            s->lookups_rank++;
    }
    pthread_mutex_unlock(&s->mu);
    if (!ready)
        return respond_text(s, c, 503, text);
    if (!found && !nomem) {
        snprintf(text, sizeof(text),
                 "Bootstrap info not found for dp_rank=%lld cp_rank=%lld tp_rank=%lld "
                 "pp_rank=%lld",
                 (long long)q->dp_group, (long long)q->cp_rank, (long long)q->engine_rank,
                 (long long)q->pp_rank);
        return respond_text(s, c, 404, text);
    }
    return respond_json(s, c, json);
}

static enum MHD_Result handle_get_route(struct kvb_bootstrap_server *s, struct MHD_Connection *c)
{
    char reason[KVB__BOOT_REASON_MAX];
    kvb__boot_query_t q;
    char *json = NULL;
    bool nomem = false, found = false;
    kvb__boot_query_vals_t v = {arg(c, "engine_rank"),     arg(c, "target_dp_group"),
                                arg(c, "target_pp_rank"),  arg(c, "prefill_dp_rank"),
                                arg(c, "prefill_cp_rank"), arg(c, "target_tp_rank"),
                                arg(c, "kvbridge_layout")};
    kvb__boot_query_result_t res = kvb__boot_query_parse_vals(&v, &q, reason, sizeof(reason));
    if (res == KVB__BOOT_QUERY_MISSING)
        return respond_text(s, c, 400, KVB__BOOT_MSG_MISSING);
    if (res != KVB__BOOT_QUERY_OK)
        return respond_text(s, c, 400, reason);
    if (q.v2026)
        return get_route_2026(s, c, &q);

    pthread_mutex_lock(&s->mu);
    if (q.parallel_info) {
        json_t *o = kvb__boot_table_parallel_info(&s->table, &nomem);
        /* A CachePD decode asks the same: with CachePD ranks registered the
         * answer carries what it reads (PROTOCOL-TOKENSPEED-CACHEPD.md 12.2) */
        json = kvb__boot_cpd_active(s->cpd) ? kvb__boot_cpd_info(s->cpd, o, &nomem)
               : o != NULL                  ? json_dumps(o, JSON_COMPACT)
                                            : NULL;
        found = json != NULL || o != NULL;
        json_decref(o);
        if (json != NULL)
            s->lookups_info++;
    } else {
        const kvb__boot_entry_t *e =
            kvb__boot_table_find(&s->table, q.dp_group, 0, q.engine_rank, q.pp_rank);
        json_t *o = e != NULL ? kvb__boot_entry_json(e)
                              : kvb__boot_cpd_rank(s->cpd, q.dp_group, q.engine_rank);
        found = o != NULL;
        nomem = e != NULL && o == NULL;
        json = o != NULL ? json_dumps(o, JSON_COMPACT) : NULL;
        json_decref(o);
        if (json != NULL)
            s->lookups_rank++;
    }
    pthread_mutex_unlock(&s->mu);
    if (!found && !nomem)
        return respond_text(s, c, 404, KVB__BOOT_MSG_NOT_FOUND);
    return respond_json(s, c, json);
}

/* A registration into the table (seed 001, SGLang 2026, TokenSpeed seed 004). */
static kvb_status_t put_table(struct kvb_bootstrap_server *s, const struct req_ctx *ctx,
                              char *reason, size_t reason_len)
{
    kvb__boot_reg_t reg;
    kvb_status_t st = kvb__boot_reg_parse(ctx->buf, ctx->len, &reg, reason, reason_len);
    if (st != KVB_OK)
        return st;
    pthread_mutex_lock(&s->mu);
    st = kvb__boot_table_apply(&s->table, &reg, reason, reason_len);
    if (st == KVB_OK)
        s->registrations++;
    pthread_mutex_unlock(&s->mu);
    if (st == KVB_OK)
        KVB_LOGD("bootstrap: registered DP%lld CP%lld TP%lld PP%lld at %s:%lld",
                 (long long)kvb__boot_reg_dp_group(&reg), (long long)reg.attn_cp_rank,
                 (long long)reg.attn_tp_rank, (long long)reg.pp_rank, reg.rank_ip,
                 (long long)reg.rank_port);
    kvb__boot_reg_clear(&reg);
    return st;
}

/* A TokenSpeed 0.1.1 (CachePD) rank: its own state (dialect/cachepd). */
static kvb_status_t put_cpd(struct kvb_bootstrap_server *s, const struct req_ctx *ctx, char *reason,
                            size_t reason_len)
{
    pthread_mutex_lock(&s->mu);
    kvb_status_t st = kvb__boot_cpd_put(&s->cpd, ctx->buf, ctx->len, reason, reason_len);
    if (st == KVB_OK)
        s->registrations++;
    pthread_mutex_unlock(&s->mu);
    return st;
}

static enum MHD_Result handle_put_route(struct kvb_bootstrap_server *s, struct MHD_Connection *c,
                                        const struct req_ctx *ctx)
{
    char reason[KVB__BOOT_REASON_MAX];
    kvb_status_t st = kvb__boot_is_cpd_put(ctx->buf, ctx->len)
                          ? put_cpd(s, ctx, reason, sizeof(reason))
                          : put_table(s, ctx, reason, sizeof(reason));
    if (st == KVB_OK)
        return respond_text(s, c, 200, "OK");
    if (st == KVB_ERR_NOMEM)
        return respond_text(s, c, 500, "out of memory");
    KVB_LOGD("bootstrap: PUT /route refused: %s", reason);
    return respond_text(s, c, 400, reason);
}

static enum MHD_Result handle_register_dp(struct kvb_bootstrap_server *s, struct MHD_Connection *c,
                                          const struct req_ctx *ctx)
{
    char reason[KVB__BOOT_REASON_MAX];
    uint64_t room;
    int64_t dp;
    kvb_status_t st =
        kvb__boot_dp_rank_parse(ctx->buf, ctx->len, &room, &dp, reason, sizeof(reason));
    if (st != KVB_OK)
        return respond_text(s, c, 400, reason);
    pthread_mutex_lock(&s->mu);
    st = kvb__dp_rooms_put(&s->dp_rooms, room, (int32_t)dp, kvb__now_ns());
    pthread_mutex_unlock(&s->mu);
    if (st == KVB_ERR_NOMEM)
        return respond_text(s, c, 500, "out of memory");
    if (st != KVB_OK) {
        snprintf(reason, sizeof(reason),
                 "dp_rank table full (%zu rooms registered in the last %.0f s)", s->dp_rooms.max,
                 (double)s->dp_rooms.ttl_ns / 1e9);
        return respond_text(s, c, 503, reason);
    }
    return respond_text(s, c, 200, "OK");
}

static enum MHD_Result handle_query_dp(struct kvb_bootstrap_server *s, struct MHD_Connection *c,
                                       const struct req_ctx *ctx)
{
    char reason[KVB__BOOT_REASON_MAX], *json;
    uint64_t *rooms = NULL, now = kvb__now_ns();
    size_t n = 0;
    json_t *o;
    kvb_status_t st =
        kvb__boot_dp_query_parse(ctx->buf, ctx->len, &rooms, &n, reason, sizeof(reason));
    if (st == KVB_ERR_NOMEM)
        return respond_text(s, c, 500, "out of memory");
    if (st != KVB_OK)
        return respond_text(s, c, 400, reason);
    o = json_object();
    pthread_mutex_lock(&s->mu);
    for (size_t i = 0; o != NULL && i < n; i++) {
        int32_t dp = kvb__dp_rooms_get(&s->dp_rooms, rooms[i], now);
        char key[24];
        if (dp < 0)
            continue; /* unknown rooms are left out (SGLang) */
        snprintf(key, sizeof(key), "%llu", (unsigned long long)rooms[i]);
        if (json_object_set_new(o, key, json_integer(dp)) != 0) {
            json_decref(o);
            o = NULL;
        }
    }
    pthread_mutex_unlock(&s->mu);
    free(rooms);
    json = o != NULL ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    return respond_json(s, c, json);
}

/* A complete request body: dispatch by route. */
static enum MHD_Result handle_body(struct kvb_bootstrap_server *s, struct MHD_Connection *c,
                                   const struct req_ctx *ctx)
{
    if (ctx->dropped > 0) {
        char reason[96];
        snprintf(reason, sizeof(reason), "request body exceeds %d bytes", KVB_BOOTSTRAP_MAX_BODY);
        return respond_text(s, c, 400, reason);
    }
    if (ctx->kind == BODY_REGISTER_DP)
        return handle_register_dp(s, c, ctx);
    if (ctx->kind == BODY_QUERY_DP)
        return handle_query_dp(s, c, ctx);
    return handle_put_route(s, c, ctx);
}

static enum MHD_Result handle_metrics(struct kvb_bootstrap_server *s, struct MHD_Connection *c)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    enum MHD_Result ret;
    if (f == NULL)
        return respond_text(s, c, 500, "out of memory");
    pthread_mutex_lock(&s->mu);
    fprintf(f,
            "# HELP kvbridge_bootstrap_registrations_total Registrations accepted by PUT /route "
            "(re-registrations included).\n"
            "# TYPE kvbridge_bootstrap_registrations_total counter\n"
            "kvbridge_bootstrap_registrations_total %llu\n"
            "# HELP kvbridge_bootstrap_lookups_total GET /route lookups answered 200, by kind.\n"
            "# TYPE kvbridge_bootstrap_lookups_total counter\n"
            "kvbridge_bootstrap_lookups_total{kind=\"parallel_info\"} %llu\n"
            "kvbridge_bootstrap_lookups_total{kind=\"rank\"} %llu\n"
            "# HELP kvbridge_bootstrap_errors_total Error responses by HTTP status code.\n"
            "# TYPE kvbridge_bootstrap_errors_total counter\n",
            (unsigned long long)s->registrations, (unsigned long long)s->lookups_info,
            (unsigned long long)s->lookups_rank);
    for (int k = 0; k < N_ERR; k++)
        fprintf(f, "kvbridge_bootstrap_errors_total{code=\"%s\"} %llu\n", g_err_codes[k],
                (unsigned long long)s->errors[k]);
    fprintf(f,
            "# HELP kvbridge_bootstrap_registered_ranks Registered (dp_group, tp_rank, pp_rank) "
            "entries.\n"
            "# TYPE kvbridge_bootstrap_registered_ranks gauge\n"
            "kvbridge_bootstrap_registered_ranks %zu\n"
            "# HELP kvbridge_bootstrap_uptime_seconds Seconds since the server started.\n"
            "# TYPE kvbridge_bootstrap_uptime_seconds gauge\n"
            "kvbridge_bootstrap_uptime_seconds %.3f\n",
            s->table.count, (double)(kvb__now_ns() - s->started_ns) / 1e9);
    pthread_mutex_unlock(&s->mu);
    if (fclose(f) != 0 || buf == NULL) {
        free(buf);
        return respond_text(s, c, 500, "out of memory");
    }
    ret = respond(s, c, 200, CT_PROM, buf, len);
    free(buf);
    return ret;
}

/* A request with a body: refuse an over-long Content-Length now, else wait
 * for the body (*wait_body). */
static enum MHD_Result expect_body(struct kvb_bootstrap_server *s, struct MHD_Connection *c,
                                   bool *wait_body)
{
    const char *cl =
        MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
    int64_t n;
    if (cl != NULL &&
        (!kvb__parse_i64(cl, strlen(cl), 0, INT64_MAX, &n) || n > KVB_BOOTSTRAP_MAX_BODY)) {
        char reason[96];
        snprintf(reason, sizeof(reason), "request body exceeds %d bytes", KVB_BOOTSTRAP_MAX_BODY);
        return respond_text(s, c, 400, reason);
    }
    *wait_body = true;
    return MHD_YES;
}

/* POST /register_dp_rank (a write: the token) and /query_dp_ranks (a read:
 * the token with auth_reads). */
static enum MHD_Result dp_route(struct kvb_bootstrap_server *s, struct MHD_Connection *c,
                                const char *method, bool write, bool *wait_body)
{
    if (strcmp(method, MHD_HTTP_METHOD_POST) != 0) {
        const char *t = KVB__BOOT_MSG_METHOD;
        return respond_allow(s, c, 405, CT_TEXT, t, strlen(t), "POST");
    }
    if ((write || s->auth_reads) && !authorized(s, c))
        return respond_text(s, c, 401, "Unauthorized");
    return expect_body(s, c, wait_body);
}

/* Headers of a request are in: everything except a body can be answered
 * now. Returns MHD_YES without queueing to wait for the body (*kind says
 * which). */
static enum MHD_Result first_call(struct kvb_bootstrap_server *s, struct MHD_Connection *c,
                                  const char *url, const char *method, bool *wait_body,
                                  enum body_kind *kind)
{
    bool get = strcmp(method, MHD_HTTP_METHOD_GET) == 0;
    bool head = strcmp(method, MHD_HTTP_METHOD_HEAD) == 0;
    *wait_body = false;
    *kind = BODY_PUT_ROUTE;
    if (strcmp(url, "/register_dp_rank") == 0) {
        *kind = BODY_REGISTER_DP;
        return dp_route(s, c, method, true, wait_body);
    }
    if (strcmp(url, "/query_dp_ranks") == 0) {
        *kind = BODY_QUERY_DP;
        return dp_route(s, c, method, false, wait_body);
    }
    if (strcmp(url, "/route") == 0) {
        if (strcmp(method, MHD_HTTP_METHOD_PUT) == 0) {
            if (!authorized(s, c))
                return respond_text(s, c, 401, "Unauthorized");
            return expect_body(s, c, wait_body);
        }
        if (get) {
            if (s->auth_reads && !authorized(s, c))
                return respond_text(s, c, 401, "Unauthorized");
            return handle_get_route(s, c);
        }
        return respond_text(s, c, 405, KVB__BOOT_MSG_METHOD);
    }
    if (strcmp(url, "/health") == 0) {
        if (get || head)
            return respond_text(s, c, 200, "OK");
        return respond_text(s, c, 405, KVB__BOOT_MSG_METHOD);
    }
    if (strcmp(url, "/metrics") == 0) {
        if (!get && !head)
            return respond_text(s, c, 405, KVB__BOOT_MSG_METHOD);
        if (s->auth_reads && !authorized(s, c))
            return respond_text(s, c, 401, "Unauthorized");
        return handle_metrics(s, c);
    }
    return respond_text(s, c, 404, "Not Found");
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version, const char *upload_data,
                                  size_t *upload_data_size, void **con_cls)
{
    struct kvb_bootstrap_server *s = cls;
    struct req_ctx *ctx = *con_cls;

    if (ctx == NULL) {
        bool wait_body;
        enum body_kind kind;
        enum MHD_Result ret = first_call(s, c, url, method, &wait_body, &kind);
        if (!wait_body || ret != MHD_YES)
            return ret;
        ctx = calloc(1, sizeof(*ctx));
        if (ctx == NULL)
            return MHD_NO;
        ctx->kind = kind;
        *con_cls = ctx;
        return MHD_YES;
    }
    if (*upload_data_size > 0) {
        size_t n = *upload_data_size;
        *upload_data_size = 0;
        if (ctx->dropped > 0 || ctx->len + n > KVB_BOOTSTRAP_MAX_BODY) {
            /* A chunked body over the limit: drain a little to answer 400,
             * cut the connection if it goes on. */
            ctx->dropped += n;
            return ctx->dropped > DISCARD_MAX ? MHD_NO : MHD_YES;
        }
        if (ctx->len + n > ctx->cap) { /* most bodies are small: grow on demand */
            size_t cap = ctx->cap ? 2 * ctx->cap : 16 * 1024;
            cap = cap < ctx->len + n ? ctx->len + n : cap;
            cap = cap < KVB_BOOTSTRAP_MAX_BODY ? cap : KVB_BOOTSTRAP_MAX_BODY;
            char *p = realloc(ctx->buf, cap);
            if (p == NULL)
                return MHD_NO;
            ctx->buf = p;
            ctx->cap = cap;
        }
        memcpy(ctx->buf + ctx->len, upload_data, n);
        ctx->len += n;
        return MHD_YES;
    }
    return handle_body(s, c, ctx);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                         enum MHD_RequestTerminationCode toe)
{
    struct req_ctx *ctx = *con_cls;
    if (ctx != NULL) {
        free(ctx->buf);
        free(ctx);
        *con_cls = NULL;
    }
}

/* Bind and listen; returns the socket or -1 (status in *st_p). */
static int open_listener(const char *host, uint16_t port, int *family_p, kvb_status_t *st_p)
{
    struct addrinfo hints, *res = NULL, *ai;
    char portstr[8];
    int fd = -1, rc, err = 0;

    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    snprintf(portstr, sizeof(portstr), "%u", (unsigned)port);
    rc = getaddrinfo(host, portstr, &hints, &res);
    if (rc != 0) {
        KVB_LOGE("bootstrap server: cannot resolve host \"%s\": %s", host, gai_strerror(rc));
        *st_p = KVB_ERR_INVALID;
        return -1;
    }
    for (ai = res; ai != NULL; ai = ai->ai_next) {
        int one = 1;
        fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
        if (fd < 0) {
            err = errno;
            continue;
        }
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
        if (ai->ai_family == AF_INET6) {
            /* "::" serves IPv4 too; a specific IPv6 address only itself. */
            const struct sockaddr_in6 *a6 = (const struct sockaddr_in6 *)ai->ai_addr;
            int v6only = memcmp(&a6->sin6_addr, &in6addr_any, sizeof(in6addr_any)) != 0;
            setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &v6only, sizeof(v6only));
        }
        if (bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && listen(fd, 256) == 0 &&
            fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK) == 0) {
            *family_p = ai->ai_family;
            break;
        }
        err = errno;
        close(fd);
        fd = -1;
    }
    freeaddrinfo(res);
    if (fd < 0) {
        KVB_LOGE("bootstrap server: cannot listen on %s port %u: %s", host, (unsigned)port,
                 strerror(err));
        *st_p = KVB_ERR_IO;
    }
    return fd;
}

static kvb_status_t describe_listener(struct kvb_bootstrap_server *s, int fd)
{
    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss);
    char host[NI_MAXHOST], serv[NI_MAXSERV];
    if (getsockname(fd, (struct sockaddr *)&ss, &sl) != 0 ||
        getnameinfo((struct sockaddr *)&ss, sl, host, sizeof(host), serv, sizeof(serv),
                    NI_NUMERICHOST | NI_NUMERICSERV) != 0) {
        KVB_LOGE("bootstrap server: getsockname: %s", strerror(errno));
        return KVB_ERR_IO;
    }
    s->port = (uint16_t)atoi(serv);
    if (ss.ss_family == AF_INET6)
        snprintf(s->address, sizeof(s->address), "[%s]:%s", host, serv);
    else
        snprintf(s->address, sizeof(s->address), "%s:%s", host, serv);
    return KVB_OK;
}

KVB_API kvb_status_t kvb_bootstrap_server_start(const kvb_bootstrap_server_params_t *params,
                                                kvb_bootstrap_server_h *server_p)
{
    uint64_t mask = params != NULL ? params->field_mask : 0;
    const char *host = DEFAULT_HOST;
    uint16_t port = KVB_BOOTSTRAP_DEFAULT_PORT;
    const char *token = kvb__env_get("KVBRIDGE_BOOTSTRAP_TOKEN", NULL);
    unsigned threads = DEFAULT_THREADS;
    double timeout_s = DEFAULT_CONN_TIMEOUT_S;
    double dp_ttl_s = kvb__env_double("KVBRIDGE_BOOTSTRAP_ENTRY_CLEANUP_INTERVAL",
                                      "SGLANG_DISAGGREGATION_BOOTSTRAP_ENTRY_CLEANUP_INTERVAL",
                                      DEFAULT_DP_ROOM_TTL_S, 0.01, 86400.0);
    size_t max_dp = DEFAULT_MAX_DP_ROOMS;
    struct kvb_bootstrap_server *s;
    kvb_status_t st = KVB_ERR_NOMEM;
    int fd, family = AF_INET;
    unsigned flags;

    if (server_p == NULL)
        return KVB_ERR_INVALID;
    if ((mask & KVB_BOOTSTRAP_SERVER_PARAM_HOST) && params->host != NULL)
        host = params->host;
    if (mask & KVB_BOOTSTRAP_SERVER_PARAM_PORT)
        port = params->port;
    if (mask & KVB_BOOTSTRAP_SERVER_PARAM_TOKEN)
        token = params->token;
    if (mask & KVB_BOOTSTRAP_SERVER_PARAM_THREADS)
        threads = params->threads;
    if (mask & KVB_BOOTSTRAP_SERVER_PARAM_CONN_TIMEOUT)
        timeout_s = params->conn_timeout_s;
    if (mask & KVB_BOOTSTRAP_SERVER_PARAM_DP_ROOMS) {
        dp_ttl_s = params->dp_room_ttl_s;
        max_dp = params->max_dp_rooms;
    }
    if (threads < 1 || threads > 64 || !(timeout_s >= 1.0 && timeout_s <= 3600.0) ||
        host[0] == '\0' || !(dp_ttl_s >= 0.01 && dp_ttl_s <= 86400.0) || max_dp < 1 ||
        max_dp > ((size_t)1 << 24)) {
        KVB_LOGE("bootstrap server: invalid parameters (threads %u in [1, 64], conn_timeout_s "
                 "%g in [1, 3600], host non-empty, dp_room_ttl_s %g in [0.01, 86400], "
                 "max_dp_rooms %zu in [1, 2^24])",
                 threads, timeout_s, dp_ttl_s, max_dp);
        return KVB_ERR_INVALID;
    }

    s = calloc(1, sizeof(*s));
    if (s == NULL)
        return KVB_ERR_NOMEM;
    if (kvb__boot_table_init(&s->table) != KVB_OK)
        goto err_free;
    kvb__dp_rooms_init(&s->dp_rooms, max_dp, dp_ttl_s);
    pthread_mutex_init(&s->mu, NULL);
    if (token != NULL && token[0] != '\0') {
        s->token = strdup(token);
        if (s->token == NULL)
            goto err_token;
        s->token_len = strlen(token);
    }
    s->auth_reads = (mask & KVB_BOOTSTRAP_SERVER_PARAM_AUTH_READS) && params->auth_reads;
    s->started_ns = kvb__now_ns();

    fd = open_listener(host, port, &family, &st);
    if (fd < 0)
        goto err_token;
    st = describe_listener(s, fd);
    if (st != KVB_OK) {
        close(fd);
        goto err_token;
    }
    flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_AUTO | MHD_USE_ERROR_LOG;
    if (family == AF_INET6)
        flags |= MHD_USE_IPv6;
    s->daemon = MHD_start_daemon(
        flags, 0, NULL, NULL, on_request, s, MHD_OPTION_LISTEN_SOCKET, fd,
        MHD_OPTION_THREAD_POOL_SIZE, threads, MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)timeout_s,
        MHD_OPTION_CONNECTION_LIMIT, 1000u, MHD_OPTION_NOTIFY_COMPLETED, on_completed, s,
        MHD_OPTION_EXTERNAL_LOGGER, mhd_log, s, MHD_OPTION_END);
    if (s->daemon == NULL) {
        KVB_LOGE("bootstrap server: libmicrohttpd failed to start on %s", s->address);
        close(fd);
        st = KVB_ERR_IO;
        goto err_token;
    }
    KVB_LOGI("bootstrap server listening on %s%s", s->address,
             s->token != NULL ? " (bearer token required)" : "");
    *server_p = s;
    return KVB_OK;

err_token:
    free(s->token);
    pthread_mutex_destroy(&s->mu);
    kvb__boot_table_destroy(&s->table);
    kvb__dp_rooms_destroy(&s->dp_rooms);
err_free:
    free(s);
    return st;
}

KVB_API void kvb_bootstrap_server_stop(kvb_bootstrap_server_h s)
{
    if (s == NULL)
        return;
    /* Closes the listening socket and every connection, joins the threads. */
    MHD_stop_daemon(s->daemon);
    kvb__boot_table_destroy(&s->table);
    kvb__boot_cpd_free(s->cpd);
    kvb__dp_rooms_destroy(&s->dp_rooms);
    pthread_mutex_destroy(&s->mu);
    free(s->token);
    free(s);
}

KVB_API uint16_t kvb_bootstrap_server_port(kvb_bootstrap_server_h s)
{
    return s != NULL ? s->port : 0;
}

KVB_API const char *kvb_bootstrap_server_address(kvb_bootstrap_server_h s)
{
    return s != NULL ? s->address : "";
}

KVB_API size_t kvb_bootstrap_server_num_ranks(kvb_bootstrap_server_h s)
{
    size_t n;
    if (s == NULL)
        return 0;
    pthread_mutex_lock(&s->mu);
    /* A kvbridge prefill registers in both shapes: a rank is counted once */
    n = s->table.count > kvb__boot_cpd_count(s->cpd) ? s->table.count : kvb__boot_cpd_count(s->cpd);
    pthread_mutex_unlock(&s->mu);
    return n;
}
