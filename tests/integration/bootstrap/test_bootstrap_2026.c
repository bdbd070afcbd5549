/* The SGLang 2026 bootstrap dialect (PROTOCOL-SGLANG-2026.md 3) next to the
 * seed-001 one, over HTTP: both PUT shapes, both query styles on one table,
 * 503 until every rank registered, exactly SGLang's 15 parallel-info keys,
 * SGLang's 404 text, /register_dp_rank and /query_dp_ranks (expiry, cap),
 * 400 with a reason for malformed input while the server keeps serving; and
 * the client: the 2026 style, 503 retried within the call's bound, the
 * fallback to 2025 against a seed-001 server, the HTTP detail in errors. */
#include <kvbridge/bootstrap.h>

#include <arpa/inet.h>
#include <jansson.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "boot_test_util.h"

static char g_base[256];

static const char *url(const char *path)
{
    static char buf[2048];
    snprintf(buf, sizeof(buf), "%s%s", g_base, path);
    return buf;
}

static void set_base(kvb_bootstrap_server_h s)
{
    snprintf(g_base, sizeof(g_base), "http://%s", kvb_bootstrap_server_address(s));
}

#define Q26(dp, cp, tp, pp)                                                                        \
    "/route?prefill_dp_rank=" dp "&prefill_cp_rank=" cp "&target_tp_rank=" tp "&target_pp_"        \
    "rank=" pp
#define INFO26 Q26("-1", "-1", "-1", "-1")
#define INFO25 "/route?engine_rank=-1&target_dp_group=-1&target_pp_rank=-1"

/* SGLang 2026's registration body (PROTOCOL-SGLANG-2026.md 3.1, C:770-791). */
static char *put_2026(int tp_size, int tp_rank, int cp_size, int cp_rank, int page,
                      const char *dtype, int port)
{
    char *s = NULL;
    CHECK(asprintf(&s,
                   "{\"attn_tp_size\": %d, \"attn_tp_rank\": %d, \"attn_cp_size\": %d, "
                   "\"attn_cp_rank\": %d, \"attn_dp_size\": 1, \"attn_dp_rank\": 0, "
                   "\"pp_size\": 1, \"pp_rank\": 0, \"system_dp_size\": 1, "
                   "\"system_dp_rank\": 0, \"rank_ip\": \"10.2.0.%d\", \"rank_port\": %d, "
                   "\"page_size\": %d, \"kv_cache_dtype\": %s, \"load_balance_method\": "
                   "\"follow_bootstrap_room\", \"enable_dsa_cache_layer_split\": false, "
                   "\"prefill_http_port\": 30000}",
                   tp_size, tp_rank, cp_size, cp_rank, tp_rank, port, page, dtype) > 0);
    return s;
}

static void expect_put(const char *body, long code, const char *text)
{
    expect_http("PUT", url("/route"), body, NULL, code, text);
}

/* 400 with a one-line reason naming what, and the table unchanged. */
static void expect_400(kvb_bootstrap_server_h s, const char *method, const char *path,
                       const char *body, const char *what)
{
    http_resp_t r;
    size_t before = kvb_bootstrap_server_num_ranks(s);
    http_req(method, url(path), body, body != NULL ? strlen(body) : 0, NULL, &r);
    if (r.code != 400 || strstr(r.body, what) == NULL || strchr(r.body, '\n') != NULL) {
        fprintf(stderr, "%s %s %s: got %ld \"%s\", expected 400 naming \"%s\"\n", method, path,
                body != NULL ? body : "", r.code, r.body, what);
        exit(1);
    }
    http_resp_free(&r);
    CHECK_EQ(kvb_bootstrap_server_num_ranks(s), before);
    expect_http("GET", url("/health"), NULL, NULL, 200, "OK");
}

static json_t *get_json(const char *path)
{
    http_resp_t r;
    json_error_t e;
    http_req("GET", url(path), NULL, 0, NULL, &r);
    CHECK_EQ(r.code, 200);
    CHECK_STR_CONTAINS(r.ctype, "application/json");
    json_t *o = json_loads(r.body, 0, &e);
    CHECK(o != NULL);
    http_resp_free(&r);
    return o;
}

static void test_readiness_and_answers(void)
{
    kvb_bootstrap_server_h s = start_server("127.0.0.1", NULL, 0);
    set_base(s);
    /* Nothing registered: 503 for both 2026 look-ups, seed-001's 404 for its own. */
    expect_http("GET", url(INFO26), NULL, NULL, 503,
                "Prefill server not fully registered yet (0 workers registered).");
    expect_http("GET", url(Q26("0", "0", "0", "0")), NULL, NULL, 503,
                "Prefill server not fully registered yet (0 workers registered).");
    expect_http("GET", url(INFO25), NULL, NULL, 404, "Bootstrap info not Found");

    /* tp 2 x cp 2: four ranks; 503 until the fourth. */
    int n = 0;
    for (int cp = 0; cp < 2; cp++)
        for (int tp = 0; tp < 2; tp++) {
            char *b = put_2026(2, tp, 2, cp, 16, "\"auto\"", 17000 + cp * 10 + tp);
            if (n > 0) {
                char text[96];
                snprintf(text, sizeof(text),
                         "Prefill server not fully registered yet (%d workers registered).", n);
                expect_http("GET", url(INFO26), NULL, NULL, 503, text);
            }
            expect_put(b, 200, "OK");
            free(b);
            n++;
        }
    CHECK_EQ(kvb_bootstrap_server_num_ranks(s), 4);

    /* Exactly SGLang's 15 PrefillServerInfo keys (an extra one raises TypeError
     * in SGLang's decode). */
    json_t *o = get_json(INFO26);
    CHECK_EQ(json_object_size(o), 15);
    CHECK_EQ(json_integer_value(json_object_get(o, "attn_tp_size")), 2);
    CHECK_EQ(json_integer_value(json_object_get(o, "attn_cp_size")), 2);
    CHECK_EQ(json_integer_value(json_object_get(o, "dp_size")), 1);
    CHECK_EQ(json_integer_value(json_object_get(o, "pp_size")), 1);
    CHECK_EQ(json_integer_value(json_object_get(o, "page_size")), 16);
    CHECK(strcmp(json_string_value(json_object_get(o, "kv_cache_dtype")), "auto") == 0);
    CHECK(json_is_true(json_object_get(o, "follow_bootstrap_room")));
    CHECK(json_is_false(json_object_get(o, "enable_dsa_cache_layer_split")));
    CHECK_EQ(json_integer_value(json_object_get(o, "prefill_http_port")), 30000);
    const char *nulls[] = {"target_tp_rank",        "target_tp_ranks",
                           "target_cp_ranks",       "target_pp_ranks",
                           "required_dst_info_num", "required_prefill_response_num"};
    for (size_t i = 0; i < 6; i++)
        CHECK(json_is_null(json_object_get(o, nulls[i])));
    json_decref(o);

    /* Per-rank: the address, exactly; CP rank 1 is its own entry. */
    expect_http("GET", url(Q26("0", "1", "1", "0")), NULL, NULL, 200,
                "{\"rank_ip\":\"10.2.0.1\",\"rank_port\":17011}");
    expect_http("GET", url(Q26("0", "0", "1", "0")), NULL, NULL, 200,
                "{\"rank_ip\":\"10.2.0.1\",\"rank_port\":17001}");
    /* A miss and a mixed -1: SGLang's 404 text. */
    expect_http("GET", url(Q26("0", "0", "5", "0")), NULL, NULL, 404,
                "Bootstrap info not found for dp_rank=0 cp_rank=0 tp_rank=5 pp_rank=0");
    expect_http("GET", url(Q26("-1", "0", "0", "0")), NULL, NULL, 404,
                "Bootstrap info not found for dp_rank=-1 cp_rank=0 tp_rank=0 pp_rank=0");
    /* The seed-001 style reads the same table at CP rank 0. */
    expect_http("GET", url("/route?engine_rank=1&target_dp_group=0&target_pp_rank=0"), NULL, NULL,
                200, "{\"rank_ip\":\"10.2.0.1\",\"rank_port\":17001}");
    o = get_json(INFO25);
    CHECK_EQ(json_integer_value(json_object_get(o, "prefill_attn_tp_size")), 2);
    json_decref(o);
    kvb_bootstrap_server_stop(s);
    TEST_PASS("2026: 503 until all ranks, 15 keys, per-rank, 404 text, both styles on one table");
}

static void test_both_put_shapes(void)
{
    kvb_bootstrap_server_h s = start_server("127.0.0.1", NULL, 0);
    set_base(s);
    /* Seed 001 (role, no 2026 keys) for rank 0, SGLang 2026 (no role) for rank 1. */
    char *b = seed_payload(2, 0, 1, 0, 1, 0, 1, 0, "10.3.0.1", 18000);
    expect_put(b, 200, "OK");
    free(b);
    b = put_2026(2, 1, 1, 0, 32, "null", 18001);
    expect_put(b, 200, "OK");
    free(b);
    /* The union body (role + 2026 keys) replaces rank 1. */
    expect_put("{\"role\":\"Prefill\",\"attn_tp_size\":2,\"attn_tp_rank\":1,\"attn_dp_size\":1,"
               "\"attn_dp_rank\":0,\"pp_size\":1,\"pp_rank\":0,\"system_dp_size\":1,"
               "\"system_dp_rank\":0,\"rank_ip\":\"10.3.0.9\",\"rank_port\":\"18009\","
               "\"attn_cp_size\":1,\"attn_cp_rank\":0,\"page_size\":\"32\","
               "\"kv_cache_dtype\":\"fp8_e4m3\",\"prefill_http_port\":null}",
               200, "OK");
    /* Rank 0 registered without the 2026 keys: it speaks seed 001 on
     * ZeroMQ, so the 2026 look-ups get the old server's 400 (a 2026
     * decode's KV-args would kill that prefill's control thread; kvbridge's
     * decode then asks in the old style); the seed-001 look-ups answer. */
    expect_http("GET", url(INFO26), NULL, NULL, 400, "Missing inputs for bootstrap server.");
    expect_http("GET", url(Q26("0", "0", "1", "0")), NULL, NULL, 400,
                "Missing inputs for bootstrap server.");
    expect_http("GET", url("/route?engine_rank=0&target_dp_group=0&target_pp_rank=0"), NULL, NULL,
                200, "{\"rank_ip\":\"10.3.0.1\",\"rank_port\":18000}");
    /* Rank 0 again with the 2026 keys (and kvbridge's layout key). */
    b = put_2026(2, 0, 1, 0, 32, "null", 18000);
    b[strlen(b) - 1] = '\0';
    char *withl = NULL;
    CHECK(asprintf(&withl, "%s, \"kv_item_lens\": [4096]}", b) > 0);
    expect_put(withl, 200, "OK");
    free(withl);
    free(b);
    json_t *o = get_json(INFO26);
    CHECK_EQ(json_object_size(o), 15);
    CHECK_EQ(json_integer_value(json_object_get(o, "page_size")), 32);
    CHECK(strcmp(json_string_value(json_object_get(o, "kv_cache_dtype")), "fp8_e4m3") == 0);
    CHECK_EQ(json_integer_value(json_object_get(o, "prefill_http_port")),
             30000); /* first non-null kept */
    json_decref(o);
    expect_http("GET", url(Q26("0", "0", "1", "0")), NULL, NULL, 200,
                "{\"rank_ip\":\"10.3.0.9\",\"rank_port\":18009}");
    expect_http("GET", url(Q26("0", "0", "0", "0")), NULL, NULL, 200,
                "{\"rank_ip\":\"10.2.0.0\",\"rank_port\":18000}");
    /* kvbridge's own client asks for the layout keys (kvbridge_layout=1). */
    o = get_json(INFO26 "&kvbridge_layout=1");
    CHECK_EQ(json_object_size(o), 15 + 1);
    CHECK_EQ(json_integer_value(json_array_get(json_object_get(o, "kv_item_lens"), 0)), 4096);
    json_decref(o);
    o = get_json(INFO26 "&kvbridge_layout=0");
    CHECK_EQ(json_object_size(o), 15);
    json_decref(o);
    kvb_bootstrap_server_stop(s);
    TEST_PASS("PUT with and without role, union body, layout keys only when asked");
}

static void test_malformed(void)
{
    kvb_bootstrap_server_h s = start_server("127.0.0.1", NULL, 0);
    set_base(s);
    char *good = put_2026(2, 0, 1, 0, 16, "\"auto\"", 19000);
    expect_put(good, 200, "OK");
    free(good);
    struct {
        const char *body, *what;
    } bad[] = {
        /* no role and no 2026 keys */
        {"{\"attn_tp_size\":2,\"attn_tp_rank\":1,\"attn_dp_size\":1,\"attn_dp_rank\":0,"
         "\"pp_size\":1,\"pp_rank\":0,\"system_dp_size\":1,\"system_dp_rank\":0,"
         "\"rank_ip\":\"1.1.1.1\",\"rank_port\":1}",
         "role"},
        {"{\"attn_tp_size\":2,\"attn_tp_rank\":1,\"attn_cp_size\":1,\"attn_cp_rank\":0,"
         "\"attn_dp_size\":1,\"attn_dp_rank\":0,\"pp_size\":1,\"pp_rank\":0,"
         "\"system_dp_size\":1,\"system_dp_rank\":0,\"rank_ip\":\"1.1.1.1\",\"rank_port\":1,"
         "\"kv_cache_dtype\":null}",
         "page_size"},
        {"{\"attn_tp_size\":2,\"attn_tp_rank\":1,\"attn_cp_size\":1,\"attn_cp_rank\":0,"
         "\"attn_dp_size\":1,\"attn_dp_rank\":0,\"pp_size\":1,\"pp_rank\":0,"
         "\"system_dp_size\":1,\"system_dp_rank\":0,\"rank_ip\":\"1.1.1.1\",\"rank_port\":1,"
         "\"page_size\":null,\"kv_cache_dtype\":null}",
         "page_size"},
        {"{\"attn_tp_size\":2,\"attn_tp_rank\":1,\"attn_cp_size\":1,\"attn_cp_rank\":0,"
         "\"attn_dp_size\":1,\"attn_dp_rank\":0,\"pp_size\":1,\"pp_rank\":0,"
         "\"system_dp_size\":1,\"system_dp_rank\":0,\"rank_ip\":\"1.1.1.1\",\"rank_port\":1,"
         "\"page_size\":16}",
         "kv_cache_dtype"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        expect_400(s, "PUT", "/route", bad[i].body, bad[i].what);
    struct {
        int cp_size, cp_rank, page;
        const char *dtype, *what;
    } vals[] = {
        {1, 1, 16, "\"auto\"", "attn_cp_rank"},             /* rank not below size */
        {0, 0, 16, "\"auto\"", "attn_cp_size"},             /* size 0 */
        {1, 0, 0, "\"auto\"", "page_size"},                 /* page 0 */
        {1, 0, 16, "\"fp8 e4m3\"", "kv_cache_dtype"},       /* charset */
        {1, 0, 16, "7", "kv_cache_dtype"},                  /* type */
        {1, 0, 32, "\"auto\"", "page_size=32 contradicts"}, /* first registration said 16 */
        {1, 0, 16, "\"bf16\"", "contradicts the registered \"auto\""},
        {2, 0, 16, "\"auto\"", "attn_cp_size=2"}, /* sizes */
    };
    for (size_t i = 0; i < sizeof(vals) / sizeof(vals[0]); i++) {
        char *b = put_2026(2, 1, vals[i].cp_size, vals[i].cp_rank, vals[i].page, vals[i].dtype, 1);
        expect_400(s, "PUT", "/route", b, vals[i].what);
        free(b);
    }
    /* Other 2026 keys, wrong. */
    static const char base[] =
        "{\"attn_tp_size\":2,\"attn_tp_rank\":1,\"attn_cp_size\":1,\"attn_cp_rank\":0,"
        "\"attn_dp_size\":1,\"attn_dp_rank\":0,\"pp_size\":1,\"pp_rank\":0,"
        "\"system_dp_size\":1,\"system_dp_rank\":0,\"rank_ip\":\"1.1.1.1\",\"rank_port\":1,"
        "\"page_size\":16,\"kv_cache_dtype\":\"auto\"";
    const char *extra[][2] = {
        {",\"prefill_http_port\":70000}", "prefill_http_port"},
        {",\"enable_dsa_cache_layer_split\":\"no\"}", "enable_dsa_cache_layer_split"},
        {",\"load_balance_method\":[1]}", "load_balance_method"},
    };
    for (size_t i = 0; i < 3; i++) {
        char body[1024];
        snprintf(body, sizeof(body), "%s%s", base, extra[i][0]);
        expect_400(s, "PUT", "/route", body, extra[i][1]);
    }
    /* Queries. */
    expect_400(s, "GET", "/route?prefill_dp_rank=0&prefill_cp_rank=0&target_tp_rank=0", NULL,
               "Missing inputs for bootstrap server.");
    expect_400(s, "GET", "/route?prefill_cp_rank=0&target_tp_rank=0&target_pp_rank=0", NULL,
               "Missing inputs for bootstrap server.");
    expect_400(s, "GET", Q26("0", "x", "0", "0"), NULL, "prefill_cp_rank");
    expect_400(s, "GET", Q26("0", "0", "0x1", "0"), NULL, "target_tp_rank");
    expect_400(s, "GET", Q26("0", "0", "0", "-2"), NULL, "target_pp_rank");
    expect_400(s, "GET", Q26("0", "0", "0", "0") "&kvbridge_layout=2", NULL, "kvbridge_layout");
    expect_400(s, "GET", "/route?target_pp_rank=0", NULL, "Missing inputs for bootstrap server.");
    CHECK_EQ(kvb_bootstrap_server_num_ranks(s), 1);
    kvb_bootstrap_server_stop(s);
    TEST_PASS("malformed 2026 registrations and queries: 400 naming the key, table unchanged");
}

static kvb_bootstrap_server_h start_dp_server(double ttl_s, size_t max_rooms)
{
    kvb_bootstrap_server_params_t p;
    kvb_bootstrap_server_h s = NULL;
    memset(&p, 0, sizeof(p));
    p.field_mask = KVB_BOOTSTRAP_SERVER_PARAM_PORT | KVB_BOOTSTRAP_SERVER_PARAM_DP_ROOMS;
    p.port = 0;
    p.dp_room_ttl_s = ttl_s;
    p.max_dp_rooms = max_rooms;
    CHECK_EQ(kvb_bootstrap_server_start(&p, &s), KVB_OK);
    set_base(s);
    return s;
}

static void test_dp_rank_routes(void)
{
    kvb_bootstrap_server_h s = start_dp_server(0.5, 4);
    expect_http("POST", url("/register_dp_rank"), "{\"bootstrap_room\": 5, \"dp_rank\": 1}", NULL,
                200, "OK");
    expect_http("POST", url("/register_dp_rank"),
                "{\"bootstrap_room\": \"18446744073709551615\", \"dp_rank\": \"0\"}", NULL, 200,
                "OK");
    expect_http("POST", url("/query_dp_ranks"),
                "{\"bootstrap_rooms\": [5, 6, \"18446744073709551615\"]}", NULL, 200,
                "{\"5\":1,\"18446744073709551615\":0}");
    expect_http("POST", url("/query_dp_ranks"), "{\"bootstrap_rooms\": []}", NULL, 200, "{}");
    /* Re-registration moves a room. */
    expect_http("POST", url("/register_dp_rank"), "{\"bootstrap_room\": 5, \"dp_rank\": 3}", NULL,
                200, "OK");
    expect_http("POST", url("/query_dp_ranks"), "{\"bootstrap_rooms\": [5]}", NULL, 200,
                "{\"5\":3}");
    /* Other methods: 405. */
    expect_http("GET", url("/register_dp_rank"), NULL, NULL, 405, "Method not allowed");
    expect_http("PUT", url("/query_dp_ranks"), "{}", NULL, 405, "Method not allowed");
    /* Malformed. */
    expect_400(s, "POST", "/register_dp_rank", "{\"bootstrap_room\": 5}", "dp_rank");
    expect_400(s, "POST", "/register_dp_rank", "{\"dp_rank\": 5}", "bootstrap_room");
    expect_400(s, "POST", "/register_dp_rank", "{\"bootstrap_room\": -1, \"dp_rank\": 0}",
               "bootstrap_room");
    expect_400(s, "POST", "/register_dp_rank",
               "{\"bootstrap_room\": \"18446744073709551616\", \"dp_rank\": 0}", "bootstrap_room");
    expect_400(s, "POST", "/register_dp_rank", "{\"bootstrap_room\": 1, \"dp_rank\": 65536}",
               "dp_rank");
    expect_400(s, "POST", "/register_dp_rank", "not json", "not valid JSON");
    expect_400(s, "POST", "/query_dp_ranks", "{\"bootstrap_rooms\": 5}", "bootstrap_rooms");
    expect_400(s, "POST", "/query_dp_ranks", "{\"bootstrap_rooms\": [1, null]}",
               "bootstrap_rooms\"[1]");
    /* More rooms than one query may ask about. */
    size_t cap = 32 + 16385 * 3;
    char *big = malloc(cap);
    size_t off = (size_t)snprintf(big, cap, "{\"bootstrap_rooms\":[");
    for (int i = 0; i < 16385; i++)
        off += (size_t)snprintf(big + off, cap - off, "%s1", i ? "," : "");
    snprintf(big + off, cap - off, "]}");
    expect_400(s, "POST", "/query_dp_ranks", big, "more than 16384");
    free(big);
    /* Cap: 4 live rooms (5 and 2^64-1 so far); a fifth distinct one is a 503,
     * a known one is still accepted. */
    expect_http("POST", url("/register_dp_rank"), "{\"bootstrap_room\": 7, \"dp_rank\": 0}", NULL,
                200, "OK");
    expect_http("POST", url("/register_dp_rank"), "{\"bootstrap_room\": 8, \"dp_rank\": 0}", NULL,
                200, "OK");
    http_resp_t r;
    const char *ninth = "{\"bootstrap_room\": 9, \"dp_rank\": 0}";
    http_req("POST", url("/register_dp_rank"), ninth, strlen(ninth), NULL, &r);
    CHECK_EQ(r.code, 503);
    CHECK_STR_CONTAINS(r.body, "dp_rank table full");
    http_resp_free(&r);
    expect_http("POST", url("/register_dp_rank"), "{\"bootstrap_room\": 8, \"dp_rank\": 1}", NULL,
                200, "OK");
    /* Expiry: after the TTL the rooms are gone and room 9 fits. */
    usleep(700 * 1000);
    expect_http("POST", url("/query_dp_ranks"), "{\"bootstrap_rooms\": [5, 7, 8]}", NULL, 200,
                "{}");
    expect_http("POST", url("/register_dp_rank"), ninth, NULL, 200, "OK");
    expect_http("POST", url("/query_dp_ranks"), "{\"bootstrap_rooms\": [9]}", NULL, 200,
                "{\"9\":0}");
    kvb_bootstrap_server_stop(s);
    TEST_PASS("/register_dp_rank, /query_dp_ranks: 64-bit rooms, 405, 400s, cap 503, expiry");
}

/* ---------------------------------------------------------------- client */

static kvb_bootstrap_client_h client(const char *addr, int dialect)
{
    kvb_bootstrap_client_params_t p;
    kvb_bootstrap_client_h c = NULL;
    memset(&p, 0, sizeof(p));
    p.field_mask = KVB_BOOTSTRAP_CLIENT_PARAM_DIALECT;
    p.dialect = dialect;
    CHECK_EQ(kvb_bootstrap_client_create(addr, &p, &c), KVB_OK);
    return c;
}

static kvb_bootstrap_registration_t reg_2026(int tp_rank, uint16_t port)
{
    kvb_bootstrap_registration_t r;
    memset(&r, 0, sizeof(r));
    r.field_mask = KVB_BOOTSTRAP_REG_CP | KVB_BOOTSTRAP_REG_PAGE_SIZE |
                   KVB_BOOTSTRAP_REG_KV_CACHE_DTYPE | KVB_BOOTSTRAP_REG_HTTP_PORT |
                   KVB_BOOTSTRAP_REG_LOAD_BALANCE;
    r.attn_tp_size = 2;
    r.attn_tp_rank = tp_rank;
    r.attn_dp_size = r.pp_size = r.system_dp_size = 1;
    r.attn_cp_size = 1;
    r.rank_ip = "127.0.0.1";
    r.rank_port = port;
    r.page_size = 64;
    r.kv_cache_dtype = "auto";
    r.load_balance_method = "round_robin";
    r.prefill_http_port = 30001;
    return r;
}

struct late_reg {
    const char *addr;
    double delay_s;
};

static void *register_late(void *arg)
{
    struct late_reg *l = arg;
    usleep((useconds_t)(l->delay_s * 1e6));
    kvb_bootstrap_client_h c = client(l->addr, KVB_BOOTSTRAP_DIALECT_2026);
    kvb_bootstrap_registration_t r = reg_2026(1, 21001);
    CHECK_EQ(kvb_bootstrap_client_register(c, &r, 0), KVB_OK);
    kvb_bootstrap_client_destroy(c);
    return NULL;
}

static void test_client_2026(void)
{
    kvb_bootstrap_server_h s = start_server("127.0.0.1", NULL, 0);
    const char *addr = kvb_bootstrap_server_address(s);
    kvb_bootstrap_client_h c = client(addr, KVB_BOOTSTRAP_DIALECT_2026);
    kvb_bootstrap_parallel_info_t info;
    kvb_bootstrap_parallel_info_ext_t ext;
    kvb_bootstrap_rank_addr_t a;
    set_base(s);
    CHECK_EQ(kvb_bootstrap_client_dialect(c), 2026);
    kvb_bootstrap_registration_t r = reg_2026(0, 21000);
    CHECK_EQ(kvb_bootstrap_client_register(c, &r, 0), KVB_OK);

    /* One rank of two: the parallel info is 503 for the whole bound... */
    double t0 = kvb_test_now_s();
    CHECK_EQ(kvb_bootstrap_client_parallel_info(c, 0.4, &info), KVB_ERR_NOT_FOUND);
    double dt = kvb_test_now_s() - t0;
    CHECK(dt >= 0.35 && dt < 1.5);
    CHECK_STR_CONTAINS(kvb_bootstrap_client_last_error(c),
                       "HTTP 503: Prefill server not fully registered yet (1 workers registered).");
    CHECK_STR_CONTAINS(kvb_bootstrap_client_last_error(c), "still 503 after");
    /* ...a per-rank look-up is not retried (SGLang fails the room at once). */
    t0 = kvb_test_now_s();
    CHECK_EQ(kvb_bootstrap_client_lookup(c, 0, 0, 0, 2.0, &a), KVB_ERR_NOT_FOUND);
    CHECK(kvb_test_now_s() - t0 < 0.5);
    CHECK_STR_CONTAINS(kvb_bootstrap_client_last_error(c), "prefill_dp_rank=0&prefill_cp_rank=0");

    /* ...and answered once the second rank registers within the bound. */
    struct late_reg l = {addr, 0.3};
    pthread_t thr;
    CHECK_EQ(pthread_create(&thr, NULL, register_late, &l), 0);
    memset(&ext, 0, sizeof(ext));
    ext.field_mask = ~(uint64_t)0;
    t0 = kvb_test_now_s();
    CHECK_EQ(kvb_bootstrap_client_parallel_info_ext(c, 3.0, &info, &ext), KVB_OK);
    dt = kvb_test_now_s() - t0;
    pthread_join(thr, NULL);
    CHECK(dt >= 0.25 && dt < 1.5);
    CHECK_EQ(info.attn_tp_size, 2);
    CHECK_EQ(ext.dialect, 2026);
    CHECK_EQ(ext.attn_cp_size, 1);
    CHECK_EQ(ext.page_size, 64);
    CHECK(strcmp(ext.kv_cache_dtype, "auto") == 0);
    CHECK_EQ(ext.follow_bootstrap_room, 0); /* round_robin */
    CHECK_EQ(ext.prefill_http_port, 30001);
    kvb_bootstrap_parallel_info_free(&info);
    /* A caller that names no field gets none written. */
    kvb_bootstrap_parallel_info_ext_t none;
    memset(&none, 0x5a, sizeof(none));
    none.field_mask = KVB_BOOTSTRAP_INFO_PAGE_SIZE;
    CHECK_EQ(kvb_bootstrap_client_parallel_info_ext(c, 0, &info, &none), KVB_OK);
    CHECK_EQ(none.page_size, 64);
    CHECK_EQ(none.attn_cp_size, 0x5a5a5a5a);
    kvb_bootstrap_parallel_info_free(&info);

    CHECK_EQ(kvb_bootstrap_client_lookup_cp(c, 0, 0, 1, 0, 0, &a), KVB_OK);
    CHECK_EQ(a.rank_port, 21001);
    CHECK_EQ(kvb_bootstrap_client_lookup_cp(c, 0, 1, 1, 0, 0, &a), KVB_ERR_NOT_FOUND);
    CHECK_STR_CONTAINS(kvb_bootstrap_client_last_error(c),
                       "HTTP 404: Bootstrap info not found for dp_rank=0 cp_rank=1");
    /* The union body carried role too: the seed-001 style reads it. */
    expect_http("GET", url("/route?engine_rank=1&target_dp_group=0"), NULL, NULL, 200,
                "{\"rank_ip\":\"127.0.0.1\",\"rank_port\":21001}");

    /* DP ranks through the client. */
    uint64_t rooms[3] = {11, UINT64_MAX, 12};
    int32_t dps[3];
    CHECK_EQ(kvb_bootstrap_client_register_dp_rank(c, UINT64_MAX, 2, 0), KVB_OK);
    CHECK_EQ(kvb_bootstrap_client_register_dp_rank(c, 11, 1, 0), KVB_OK);
    CHECK_EQ(kvb_bootstrap_client_query_dp_ranks(c, rooms, 3, 0, dps), KVB_OK);
    CHECK(dps[0] == 1 && dps[1] == 2 && dps[2] == -1);
    CHECK_EQ(kvb_bootstrap_client_register_dp_rank(c, 1, -1, 0), KVB_ERR_INVALID);
    CHECK_EQ(kvb_bootstrap_client_query_dp_ranks(c, rooms, 0, 0, dps), KVB_ERR_INVALID);

    /* A bad local 2026 field: nothing sent. */
    r.kv_cache_dtype = "no spaces";
    CHECK_EQ(kvb_bootstrap_client_register(c, &r, 0), KVB_ERR_INVALID);
    kvb_bootstrap_client_destroy(c);
    kvb_bootstrap_server_stop(s);
    TEST_PASS("2026 client: 503 retried within the bound, ext fields, CP look-up, DP ranks");
}

/* ---------------------------------------------- a seed-001 server stand-in */

/* Answers like seed 001's aiohttp server: the seed-001 query style only,
 * 400 "Missing inputs..." to anything else; records the last request line. */
struct fake {
    int fd;
    uint16_t port;
    pthread_t thr;
    int stop;
    char last[512];
    int requests;
};

static void *fake_main(void *arg)
{
    struct fake *f = arg;
    while (!__atomic_load_n(&f->stop, __ATOMIC_ACQUIRE)) {
        int c = accept(f->fd, NULL, NULL);
        if (c < 0)
            continue;
        char req[2048];
        ssize_t n = recv(c, req, sizeof(req) - 1, 0);
        if (n <= 0) {
            close(c);
            continue;
        }
        req[n] = '\0';
        req[strcspn(req, "\r\n")] = '\0';
        snprintf(f->last, sizeof(f->last), "%.500s", req);
        __atomic_add_fetch(&f->requests, 1, __ATOMIC_ACQ_REL);
        const char *code = "400 Bad Request", *body = "Missing inputs for bootstrap server.";
        if (strstr(req, "engine_rank=-1&target_dp_group=-1") != NULL) {
            code = "200 OK";
            body = "{\"prefill_attn_tp_size\": 1, \"prefill_dp_size\": 1, \"prefill_pp_size\": 1}";
        } else if (strstr(req, "engine_rank=0&target_dp_group=0") != NULL) {
            code = "200 OK";
            body = "{\"rank_ip\": \"127.0.0.1\", \"rank_port\": 23000}";
        }
        char resp[512];
        int len = snprintf(resp, sizeof(resp),
                           "HTTP/1.1 %s\r\nContent-Length: %zu\r\nConnection: close\r\n\r\n%s",
                           code, strlen(body), body);
        CHECK(send(c, resp, (size_t)len, MSG_NOSIGNAL) == len);
        close(c);
    }
    return NULL;
}

static void fake_start(struct fake *f)
{
    struct sockaddr_in a;
    socklen_t al = sizeof(a);
    struct timeval tv = {0, 100 * 1000};
    memset(f, 0, sizeof(*f));
    f->fd = socket(AF_INET, SOCK_STREAM, 0);
    memset(&a, 0, sizeof(a));
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    CHECK(bind(f->fd, (struct sockaddr *)&a, sizeof(a)) == 0 && listen(f->fd, 16) == 0);
    CHECK(getsockname(f->fd, (struct sockaddr *)&a, &al) == 0);
    setsockopt(f->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)); /* accept wakes to see stop */
    f->port = ntohs(a.sin_port);
    CHECK_EQ(pthread_create(&f->thr, NULL, fake_main, f), 0);
}

static void fake_stop(struct fake *f)
{
    __atomic_store_n(&f->stop, 1, __ATOMIC_RELEASE);
    pthread_join(f->thr, NULL);
    close(f->fd);
}

static void test_fallback_to_2025(void)
{
    struct fake f;
    char addr[64];
    kvb_bootstrap_parallel_info_t info;
    kvb_bootstrap_parallel_info_ext_t ext;
    kvb_bootstrap_rank_addr_t a;
    fake_start(&f);
    snprintf(addr, sizeof(addr), "127.0.0.1:%u", (unsigned)f.port);

    /* 2026 client: refused in the 2026 style, asks again in the 2025 style
     * and stays there. */
    kvb_bootstrap_client_h c = client(addr, KVB_BOOTSTRAP_DIALECT_2026);
    memset(&ext, 0, sizeof(ext));
    ext.field_mask = KVB_BOOTSTRAP_INFO_DIALECT | KVB_BOOTSTRAP_INFO_PAGE_SIZE |
                     KVB_BOOTSTRAP_INFO_FOLLOW_ROOM | KVB_BOOTSTRAP_INFO_CP_SIZE;
    CHECK_EQ(kvb_bootstrap_client_parallel_info_ext(c, 2.0, &info, &ext), KVB_OK);
    CHECK_EQ(f.requests, 2);
    CHECK_EQ(info.attn_tp_size, 1);
    CHECK(ext.dialect == 2025 && ext.page_size == -1 && ext.follow_bootstrap_room == 1 &&
          ext.attn_cp_size == 1);
    kvb_bootstrap_parallel_info_free(&info);
    CHECK_EQ(kvb_bootstrap_client_dialect(c), 2025);
    CHECK_EQ(kvb_bootstrap_client_lookup(c, 0, 0, 0, 2.0, &a), KVB_OK);
    CHECK_EQ(a.rank_port, 23000);
    CHECK_EQ(f.requests, 3); /* straight to the 2025 style */
    CHECK_STR_CONTAINS(f.last, "GET /route?engine_rank=0&target_dp_group=0&target_pp_rank=0 ");
    /* A CP rank has no 2025 form. */
    CHECK_EQ(kvb_bootstrap_client_lookup_cp(c, 0, 1, 0, 0, 2.0, &a), KVB_ERR_INVALID);
    kvb_bootstrap_client_destroy(c);

    /* A fresh 2026 client whose first call is a look-up falls back too. */
    c = client(addr, KVB_BOOTSTRAP_DIALECT_2026);
    CHECK_EQ(kvb_bootstrap_client_lookup(c, 0, 0, 0, 2.0, &a), KVB_OK);
    CHECK_EQ(kvb_bootstrap_client_dialect(c), 2025);
    kvb_bootstrap_client_destroy(c);

    /* 2025 client: never sends the 2026 style. */
    int before = f.requests;
    c = client(addr, KVB_BOOTSTRAP_DIALECT_2025);
    CHECK_EQ(kvb_bootstrap_client_parallel_info(c, 2.0, &info), KVB_OK);
    kvb_bootstrap_parallel_info_free(&info);
    CHECK_EQ(f.requests, before + 1);
    CHECK_STR_CONTAINS(f.last, "engine_rank=-1&target_dp_group=-1");
    /* Its failures carry the HTTP detail. */
    CHECK_EQ(kvb_bootstrap_client_lookup(c, 1, 0, 0, 2.0, &a), KVB_ERR_PROTO);
    CHECK_STR_CONTAINS(kvb_bootstrap_client_last_error(c),
                       "HTTP 400: Missing inputs for bootstrap server.");
    kvb_bootstrap_client_destroy(c);

    /* The env knob picks the default; a bad value means 2026. */
    setenv("KVBRIDGE_SGLANG_DIALECT", "2025", 1);
    CHECK_EQ(kvb_bootstrap_client_create(addr, NULL, &c), KVB_OK);
    CHECK_EQ(kvb_bootstrap_client_dialect(c), 2025);
    kvb_bootstrap_client_destroy(c);
    setenv("KVBRIDGE_SGLANG_DIALECT", "1999", 1);
    CHECK_EQ(kvb_bootstrap_client_create(addr, NULL, &c), KVB_OK);
    CHECK_EQ(kvb_bootstrap_client_dialect(c), 2026);
    kvb_bootstrap_client_destroy(c);
    unsetenv("KVBRIDGE_SGLANG_DIALECT");
    kvb_bootstrap_client_params_t p = {.field_mask = KVB_BOOTSTRAP_CLIENT_PARAM_DIALECT,
                                       .dialect = 7};
    CHECK_EQ(kvb_bootstrap_client_create(addr, &p, &c), KVB_ERR_INVALID);
    fake_stop(&f);
    TEST_PASS("2026 client falls back to 2025 on a seed-001 server; 2025 client; env knob");
}

int main(void)
{
    unsetenv("KVBRIDGE_BOOTSTRAP_TOKEN");
    unsetenv("KVBRIDGE_SGLANG_DIALECT");
    test_readiness_and_answers();
    test_both_put_shapes();
    test_malformed();
    test_dp_rank_routes();
    test_client_2026();
    test_fallback_to_2025();
    return 0;
}
