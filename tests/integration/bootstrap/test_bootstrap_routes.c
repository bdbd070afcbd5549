/* Every route and every error answer of the bootstrap server, over HTTP, plus
 * the client API against it: exact status codes and texts, the table never
 * changing on a refused request, overwrite on re-registration, layout keys,
 * bearer-token rules, metrics. */
#include <kvbridge/bootstrap.h>

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "boot_test_util.h"

static char g_base[256];

static const char *url(const char *path)
{
    static char buf[1024];
    snprintf(buf, sizeof(buf), "%s%s", g_base, path);
    return buf;
}

static char *get_body(const char *path)
{
    http_resp_t r;
    char *b;
    http_req("GET", url(path), NULL, 0, NULL, &r);
    CHECK_EQ(r.code, 200);
    b = strdup(r.body);
    http_resp_free(&r);
    return b;
}

/* Value of an unlabelled or labelled metric line, -1 when absent. */
static double metric(const char *text, const char *name)
{
    const char *p = text;
    size_t n = strlen(name);
    while ((p = strstr(p, name)) != NULL) {
        if ((p == text || p[-1] == '\n') && p[n] == ' ')
            return atof(p + n + 1);
        p += n;
    }
    return -1;
}

static void test_basic_routes(void)
{
    expect_http("GET", url("/health"), NULL, NULL, 200, "OK");
    expect_http("HEAD", url("/health"), NULL, NULL, 200, NULL);
    expect_http("POST", url("/health"), "x", NULL, 405, "Method not allowed");
    expect_http("GET", url("/nothing"), NULL, NULL, 404, NULL);
    expect_http("GET", url("/route/"), NULL, NULL, 404, NULL);
    /* Nothing registered yet. */
    expect_http("GET", url("/route?engine_rank=-1&target_dp_group=-1&target_pp_rank=-1"), NULL,
                NULL, 404, "Bootstrap info not Found");
    expect_http("GET", url("/route?engine_rank=0&target_dp_group=0&target_pp_rank=0"), NULL, NULL,
                404, "Bootstrap info not Found");
    /* Every other method on /route. */
    const char *methods[] = {"POST", "DELETE", "PATCH", "OPTIONS", "HEAD"};
    for (size_t i = 0; i < sizeof(methods) / sizeof(methods[0]); i++)
        expect_http(methods[i], url("/route"), NULL, NULL, 405,
                    strcmp(methods[i], "HEAD") == 0 ? NULL : "Method not allowed");
    TEST_PASS("basic routes, 404 and 405");
}

static void test_register_and_lookup(kvb_bootstrap_server_h s)
{
    http_resp_t r;
    /* tp 2, dp 2 (system_dp_size 2 → dp_group = system_dp_rank), pp 2. */
    for (int dp = 0; dp < 2; dp++)
        for (int tp = 0; tp < 2; tp++)
            for (int pp = 0; pp < 2; pp++) {
                char *p = seed_payload(2, tp, 1, 0, 2, pp, 2, dp, "10.1.2.3",
                                       20000 + dp * 100 + tp * 10 + pp);
                expect_http("PUT", url("/route"), p, NULL, 200, "OK");
                free(p);
            }
    CHECK_EQ(kvb_bootstrap_server_num_ranks(s), 8);

    http_req("GET", url("/route?engine_rank=-1&target_dp_group=-1&target_pp_rank=-1"), NULL, 0,
             NULL, &r);
    CHECK_EQ(r.code, 200);
    CHECK_STR_CONTAINS(r.ctype, "application/json");
    CHECK_STR_CONTAINS(r.body, "\"prefill_attn_tp_size\":2");
    CHECK_STR_CONTAINS(r.body, "\"prefill_dp_size\":2");
    CHECK_STR_CONTAINS(r.body, "\"prefill_pp_size\":2");
    /* TokenSpeed's prefill_tp_size is its world size: attn TP 2 x DP 2 (spec 3.2). */
    CHECK_STR_CONTAINS(r.body, "\"prefill_tp_size\":4");
    CHECK_STR_CONTAINS(r.body, "\"dp_size\":2");
    CHECK_STR_CONTAINS(r.body, "\"enable_mla_l1_5_cache\":false");
    /* TokenSpeed: no target_pp_rank. */
    char *ts = get_body("/route?engine_rank=-1&target_dp_group=-1");
    CHECK(strcmp(ts, r.body) == 0);
    free(ts);
    http_resp_free(&r);

    expect_http("GET", url("/route?engine_rank=1&target_dp_group=0&target_pp_rank=1"), NULL, NULL,
                200, "{\"rank_ip\":\"10.1.2.3\",\"rank_port\":20011}");
    /* Missing target_pp_rank = 0. */
    expect_http("GET", url("/route?engine_rank=1&target_dp_group=1"), NULL, NULL, 200,
                "{\"rank_ip\":\"10.1.2.3\",\"rank_port\":20110}");
    /* Percent-encoded and reordered query. */
    expect_http("GET", url("/route?target_pp_rank=%31&target_dp_group=1&engine_rank=0"), NULL, NULL,
                200, "{\"rank_ip\":\"10.1.2.3\",\"rank_port\":20101}");
    expect_http("GET", url("/route?engine_rank=2&target_dp_group=0&target_pp_rank=0"), NULL, NULL,
                404, "Bootstrap info not Found");
    expect_http("GET", url("/route?engine_rank=0&target_dp_group=5&target_pp_rank=0"), NULL, NULL,
                404, "Bootstrap info not Found");

    /* Re-registration overwrites, the count stays. */
    char *p = seed_payload(2, 1, 1, 0, 2, 1, 2, 0, "10.9.9.9", 31111);
    expect_http("PUT", url("/route"), p, NULL, 200, "OK");
    free(p);
    CHECK_EQ(kvb_bootstrap_server_num_ranks(s), 8);
    expect_http("GET", url("/route?engine_rank=1&target_dp_group=0&target_pp_rank=1"), NULL, NULL,
                200, "{\"rank_ip\":\"10.9.9.9\",\"rank_port\":31111}");
    /* rank_port as a decimal string (the seed coerces with int()). */
    expect_http("PUT", url("/route"),
                "{\"role\":\"Prefill\",\"attn_tp_size\":2,\"attn_tp_rank\":1,\"attn_dp_size\":1,"
                "\"attn_dp_rank\":0,\"pp_size\":2,\"pp_rank\":1,\"system_dp_size\":2,"
                "\"system_dp_rank\":0,\"rank_ip\":\"fe80::1%eth0\",\"rank_port\":\"31112\","
                "\"some_future_key\":[1,{\"x\":null}]}",
                NULL, 200, "OK");
    expect_http("GET", url("/route?engine_rank=1&target_dp_group=0&target_pp_rank=1"), NULL, NULL,
                200, "{\"rank_ip\":\"fe80::1%eth0\",\"rank_port\":31112}");
    TEST_PASS("register, parallel info (both dialects), rank lookup, overwrite");
}

static void test_query_errors(void)
{
    const char *missing[] = {"/route",
                             "/route?engine_rank=0",
                             "/route?target_dp_group=0",
                             "/route?target_pp_rank=0&engine_rank=0",
                             "/route?engine_rank=&target_dp_group=0",
                             "/route?engine_rank=0&target_dp_group="};
    for (size_t i = 0; i < sizeof(missing) / sizeof(missing[0]); i++)
        expect_http("GET", url(missing[i]), NULL, NULL, 400,
                    "Missing inputs for bootstrap server.");
    const char *invalid[] = {
        "/route?engine_rank=abc&target_dp_group=0",
        "/route?engine_rank=1.5&target_dp_group=0",
        "/route?engine_rank=0x1&target_dp_group=0",
        "/route?engine_rank=%201&target_dp_group=0",
        "/route?engine_rank=99999999999&target_dp_group=0",
        "/route?engine_rank=-2&target_dp_group=0",
        "/route?engine_rank=0&target_dp_group=0&target_pp_rank=x",
        "/route?engine_rank=-1&target_dp_group=0",
        "/route?engine_rank=0&target_dp_group=-1",
        "/route?engine_rank=0&target_dp_group=0&target_pp_rank=-1",
        "/route?engine_rank=-1&target_dp_group=-1&target_pp_rank=0",
        "/route?engine_rank=99999999999999999999999&target_dp_group=0",
    };
    for (size_t i = 0; i < sizeof(invalid) / sizeof(invalid[0]); i++) {
        http_resp_t r;
        http_req("GET", url(invalid[i]), NULL, 0, NULL, &r);
        if (r.code != 400 || r.len == 0 || strchr(r.body, '\n') != NULL) {
            fprintf(stderr, "GET %s: %ld \"%s\"\n", invalid[i], r.code, r.body);
            exit(1);
        }
        http_resp_free(&r);
    }
    TEST_PASS("GET /route 400 cases");
}

/* Bodies that must all get 400 with a one-line reason and change nothing. */
static void test_put_errors(kvb_bootstrap_server_h s)
{
    static const char *const keys[] = {
        "role",    "attn_tp_size",   "attn_tp_rank",   "attn_dp_size", "attn_dp_rank", "pp_size",
        "pp_rank", "system_dp_size", "system_dp_rank", "rank_ip",      "rank_port"};
    char *before = get_body("/route?engine_rank=-1&target_dp_group=-1&target_pp_rank=-1");
    char *metrics_before = get_body("/metrics");
    double regs_before = metric(metrics_before, "kvbridge_bootstrap_registrations_total");
    char *lookup_before = get_body("/route?engine_rank=0&target_dp_group=0&target_pp_rank=0");
    size_t ranks_before = kvb_bootstrap_server_num_ranks(s);
    const char *good = "\"role\":\"Prefill\",\"attn_tp_size\":2,\"attn_tp_rank\":0,"
                       "\"attn_dp_size\":1,\"attn_dp_rank\":0,\"pp_size\":2,\"pp_rank\":0,"
                       "\"system_dp_size\":2,\"system_dp_rank\":0,\"rank_ip\":\"1.1.1.1\","
                       "\"rank_port\":1";
    char body[2048];
    int n400 = 0;

    /* Each required key missing. */
    static const char *const values[] = {"\"Prefill\"", "2", "0", "1",           "0", "2",
                                         "0",           "2", "0", "\"1.1.1.1\"", "1"};
    for (size_t k = 0; k < sizeof(keys) / sizeof(keys[0]); k++) {
        size_t off = 0;
        http_resp_t r;
        off += (size_t)snprintf(body + off, sizeof(body) - off, "{");
        for (size_t j = 0; j < sizeof(keys) / sizeof(keys[0]); j++)
            if (j != k)
                off += (size_t)snprintf(body + off, sizeof(body) - off, "%s\"%s\":%s",
                                        off > 1 ? "," : "", keys[j], values[j]);
        snprintf(body + off, sizeof(body) - off, "}");
        http_req("PUT", url("/route"), body, strlen(body), NULL, &r);
        CHECK_EQ(r.code, 400);
        CHECK_STR_CONTAINS(r.body, keys[k]);
        http_resp_free(&r);
        n400++;
    }
    const char *bad[] = {
        "",
        "not json",
        "[1,2,3]",
        "\"Prefill\"",
        "{\"role\":\"Prefill\"",
        "{}",
        "{\"role\":\"Decode\",\"attn_tp_size\":2}",
        NULL, /* marker: the rest are patches of the good body */
    };
    for (size_t i = 0; bad[i] != NULL; i++) {
        http_resp_t r;
        http_req("PUT", url("/route"), bad[i], strlen(bad[i]), NULL, &r);
        if (r.code != 400 || r.len == 0 || strchr(r.body, '\n') != NULL) {
            fprintf(stderr, "PUT %s: %ld \"%s\"\n", bad[i], r.code, r.body);
            exit(1);
        }
        http_resp_free(&r);
        n400++;
    }
    /* Extra or replaced keys (JSON: a later duplicate key is refused too). */
    const char *patches[] = {
        ",\"role\":\"Prefill\"",              /* duplicate key */
        "} trailing",                         /* garbage after the object */
        ",\"kv_item_lens\":\"12\"",           /* wrong type */
        ",\"kv_item_lens\":[1,0]",            /* zero length */
        ",\"kv_item_lens\":[1,-5]",           /* negative */
        ",\"kv_item_lens\":[1.5]",            /* not an integer */
        ",\"state_unit_lens\":{}",            /* wrong type */
        ",\"enable_mla_l1_5_cache\":\"yes\"", /* wrong type */
        ",\"enable_mla_l1_5_cache\":2",       /* out of range */
        ",\"kvbridge_layout\":[1]",           /* must be an object */
    };
    for (size_t i = 0; i < sizeof(patches) / sizeof(patches[0]); i++) {
        http_resp_t r;
        snprintf(body, sizeof(body), "{%s%s}", good, patches[i]);
        http_req("PUT", url("/route"), body, strlen(body), NULL, &r);
        if (r.code != 400 || strchr(r.body, '\n') != NULL) {
            fprintf(stderr, "PUT %s: %ld \"%s\"\n", body, r.code, r.body);
            exit(1);
        }
        http_resp_free(&r);
        n400++;
    }
    /* Wrong values for the good keys. */
    struct {
        int tp_size, tp_rank, dp_size, dp_rank, pp_size, pp_rank, sdp_size, sdp_rank;
        const char *ip;
        int port;
        const char *want;
    } cases[] = {
        {2, 2, 1, 0, 2, 0, 2, 0, "1.1.1.1", 1, "attn_tp_rank"},   /* rank >= size */
        {2, -1, 1, 0, 2, 0, 2, 0, "1.1.1.1", 1, "attn_tp_rank"},  /* negative */
        {2, 0, 1, 0, 2, 2, 2, 0, "1.1.1.1", 1, "pp_rank"},        /* rank >= size */
        {2, 0, 1, 1, 2, 0, 2, 0, "1.1.1.1", 1, "attn_dp_rank"},   /* rank >= size */
        {2, 0, 1, 0, 2, 0, 2, 2, "1.1.1.1", 1, "system_dp_rank"}, /* rank >= size */
        {0, 0, 1, 0, 2, 0, 2, 0, "1.1.1.1", 1, "attn_tp_size"},   /* size 0 */
        {2, 0, 1, 0, 70000, 0, 2, 0, "1.1.1.1", 1, "pp_size"},    /* size too big */
        {2, 0, 1, 0, 2, 0, 2, 0, "1.1.1.1", 0, "rank_port"},      /* port 0 */
        {2, 0, 1, 0, 2, 0, 2, 0, "1.1.1.1", 65536, "rank_port"},  /* port too big */
        {2, 0, 1, 0, 2, 0, 2, 0, "", 1, "rank_ip"},               /* empty ip */
        {2, 0, 1, 0, 2, 0, 2, 0, "a b", 1, "rank_ip"},            /* space */
        {2, 0, 1, 0, 2, 0, 2, 0, "x\\n", 1, "rank_ip"},           /* newline */
        {4, 0, 1, 0, 2, 0, 2, 0, "1.1.1.1", 1, "contradict"},     /* tp size changes */
        {2, 0, 1, 0, 1, 0, 2, 0, "1.1.1.1", 1, "contradict"},     /* pp size changes */
        {2, 0, 1, 0, 2, 0, 3, 0, "1.1.1.1", 1, "contradict"},     /* dp size changes */
        {2, 0, 3, 0, 2, 0, 1, 0, "1.1.1.1", 1, "contradict"},     /* attn dp → dp 3 */
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        http_resp_t r;
        char *p = seed_payload(cases[i].tp_size, cases[i].tp_rank, cases[i].dp_size,
                               cases[i].dp_rank, cases[i].pp_size, cases[i].pp_rank,
                               cases[i].sdp_size, cases[i].sdp_rank, cases[i].ip, cases[i].port);
        http_req("PUT", url("/route"), p, strlen(p), NULL, &r);
        if (r.code != 400 || strstr(r.body, cases[i].want) == NULL ||
            strchr(r.body, '\n') != NULL) {
            fprintf(stderr, "PUT %s: %ld \"%s\" (want 400 naming %s)\n", p, r.code, r.body,
                    cases[i].want);
            exit(1);
        }
        http_resp_free(&r);
        free(p);
        n400++;
    }
    /* rank_ip of 256 bytes. */
    {
        char ip[257];
        memset(ip, 'a', 256);
        ip[256] = '\0';
        char *p = seed_payload(2, 0, 1, 0, 2, 0, 2, 0, ip, 1);
        expect_http("PUT", url("/route"), p, NULL, 400, NULL);
        free(p);
        n400++;
    }
    /* Bodies over 1 MiB: with a Content-Length, and chunked. */
    {
        size_t big = KVB_BOOTSTRAP_MAX_BODY + 1;
        char *p = malloc(big + 1);
        http_resp_t r;
        memset(p, ' ', big);
        p[0] = '{';
        p[big - 1] = '}';
        p[big] = '\0';
        http_req("PUT", url("/route"), p, big, NULL, &r);
        CHECK_EQ(r.code, 400);
        CHECK_STR_CONTAINS(r.body, "exceeds 1048576");
        http_resp_free(&r);
        http_req("PUT", url("/route"), p, big, "Transfer-Encoding: chunked", &r);
        CHECK_EQ(r.code, 400);
        CHECK_STR_CONTAINS(r.body, "exceeds 1048576");
        http_resp_free(&r);
        n400 += 2;
        /* Exactly 1 MiB of valid JSON is accepted (whitespace padding). */
        char *seed = seed_payload(2, 0, 1, 0, 2, 0, 2, 0, "10.1.2.3", 20000);
        size_t sl = strlen(seed);
        memset(p, ' ', KVB_BOOTSTRAP_MAX_BODY);
        memcpy(p, seed, sl);
        http_req("PUT", url("/route"), p, KVB_BOOTSTRAP_MAX_BODY, NULL, &r);
        CHECK_EQ(r.code, 200);
        http_resp_free(&r);
        free(seed);
        free(p);
    }

    /* Nothing changed (the 64 KiB registration re-wrote an identical entry). */
    char *after = get_body("/route?engine_rank=-1&target_dp_group=-1&target_pp_rank=-1");
    char *lookup_after = get_body("/route?engine_rank=0&target_dp_group=0&target_pp_rank=0");
    CHECK(strcmp(before, after) == 0);
    CHECK(strcmp(lookup_before, lookup_after) == 0);
    CHECK_EQ(kvb_bootstrap_server_num_ranks(s), ranks_before);
    char *metrics_after = get_body("/metrics");
    CHECK(metric(metrics_after, "kvbridge_bootstrap_registrations_total") == regs_before + 1);
    CHECK(metric(metrics_after, "kvbridge_bootstrap_errors_total{code=\"400\"}") ==
          metric(metrics_before, "kvbridge_bootstrap_errors_total{code=\"400\"}") + n400);
    free(before);
    free(after);
    free(lookup_before);
    free(lookup_after);
    free(metrics_before);
    free(metrics_after);
    TEST_PASS("PUT /route 400 cases leave the table unchanged");
}

static void test_layout_keys(void)
{
    const char *body =
        "{\"role\":\"Prefill\",\"attn_tp_size\":2,\"attn_tp_rank\":0,\"attn_dp_size\":1,"
        "\"attn_dp_rank\":0,\"pp_size\":2,\"pp_rank\":0,\"system_dp_size\":2,"
        "\"system_dp_rank\":0,\"rank_ip\":\"10.1.2.3\",\"rank_port\":20000,"
        "\"kv_item_lens\":[4096,4096],\"kv_unit_lens\":[256,256],\"state_item_lens\":[],"
        "\"state_unit_lens\":null,\"enable_mla_l1_5_cache\":true,"
        "\"kvbridge_layout\":{\"layers\":2,\"kind\":\"mha\"}}";
    expect_http("PUT", url("/route"), body, NULL, 200, "OK");
    char *info = get_body("/route?engine_rank=-1&target_dp_group=-1");
    CHECK_STR_CONTAINS(info, "\"kv_item_lens\":[4096,4096]");
    CHECK_STR_CONTAINS(info, "\"kv_unit_lens\":[256,256]");
    CHECK_STR_CONTAINS(info, "\"state_item_lens\":[]");
    CHECK(strstr(info, "state_unit_lens") == NULL);
    CHECK_STR_CONTAINS(info, "\"enable_mla_l1_5_cache\":true");
    CHECK_STR_CONTAINS(info, "\"kvbridge_layout\":{\"layers\":2,\"kind\":\"mha\"}");
    free(info);
    TEST_PASS("layout keys stored and served");
}

static void test_metrics(void)
{
    http_resp_t r;
    http_req("GET", url("/metrics"), NULL, 0, NULL, &r);
    CHECK_EQ(r.code, 200);
    CHECK_STR_CONTAINS(r.ctype, "text/plain");
    CHECK_STR_CONTAINS(r.body, "# TYPE kvbridge_bootstrap_registrations_total counter\n");
    CHECK(metric(r.body, "kvbridge_bootstrap_registrations_total") >= 10);
    CHECK(metric(r.body, "kvbridge_bootstrap_lookups_total{kind=\"parallel_info\"}") >= 3);
    CHECK(metric(r.body, "kvbridge_bootstrap_lookups_total{kind=\"rank\"}") >= 4);
    CHECK(metric(r.body, "kvbridge_bootstrap_errors_total{code=\"404\"}") >= 4);
    CHECK(metric(r.body, "kvbridge_bootstrap_errors_total{code=\"405\"}") >= 6);
    CHECK(metric(r.body, "kvbridge_bootstrap_errors_total{code=\"401\"}") == 0);
    CHECK(metric(r.body, "kvbridge_bootstrap_registered_ranks") == 8);
    CHECK(metric(r.body, "kvbridge_bootstrap_uptime_seconds") > 0);
    http_resp_free(&r);
    expect_http("PUT", url("/metrics"), "x", NULL, 405, "Method not allowed");
    TEST_PASS("metrics");
}

static void test_client_api(kvb_bootstrap_server_h s)
{
    kvb_bootstrap_client_h c;
    kvb_bootstrap_parallel_info_t info;
    kvb_bootstrap_rank_addr_t a;
    uint64_t lens[3] = {100, 200, 300};

    CHECK_EQ(kvb_bootstrap_client_create(kvb_bootstrap_server_address(s), NULL, &c), KVB_OK);
    CHECK_EQ(kvb_bootstrap_client_health(c, 0), KVB_OK);
    kvb_bootstrap_registration_t reg = {
        .field_mask = KVB_BOOTSTRAP_REG_KV_ITEM_LENS | KVB_BOOTSTRAP_REG_MLA_L1_5_CACHE,
        .attn_tp_size = 2,
        .attn_tp_rank = 1,
        .attn_dp_size = 1,
        .attn_dp_rank = 0,
        .pp_size = 2,
        .pp_rank = 0,
        .system_dp_size = 2,
        .system_dp_rank = 1,
        .rank_ip = "192.168.7.7",
        .rank_port = 4567,
        .kv_item_lens = {lens, 3},
        .enable_mla_l1_5_cache = 0,
    };
    CHECK_EQ(kvb_bootstrap_client_register(c, &reg, 0), KVB_OK);
    /* Idempotent: the same registration again (a prefill's periodic refresh)
     * neither grows the table nor changes any answer. */
    size_t ranks = kvb_bootstrap_server_num_ranks(s);
    char *pinfo = get_body("/route?engine_rank=-1&target_dp_group=-1&target_pp_rank=-1");
    char *prank = get_body("/route?engine_rank=1&target_dp_group=1&target_pp_rank=0");
    for (int i = 0; i < 3; i++)
        CHECK_EQ(kvb_bootstrap_client_register(c, &reg, 0), KVB_OK);
    CHECK_EQ(kvb_bootstrap_server_num_ranks(s), ranks);
    char *pinfo2 = get_body("/route?engine_rank=-1&target_dp_group=-1&target_pp_rank=-1");
    char *prank2 = get_body("/route?engine_rank=1&target_dp_group=1&target_pp_rank=0");
    CHECK(strcmp(pinfo, pinfo2) == 0);
    CHECK(strcmp(prank, prank2) == 0);
    free(pinfo);
    free(pinfo2);
    free(prank);
    free(prank2);
    CHECK_EQ(kvb_bootstrap_client_lookup(c, 1, 1, 0, 0, &a), KVB_OK);
    CHECK(strcmp(a.rank_ip, "192.168.7.7") == 0);
    CHECK_EQ(a.rank_port, 4567);
    CHECK_EQ(kvb_bootstrap_client_parallel_info(c, 0, &info), KVB_OK);
    CHECK_EQ(info.attn_tp_size, 2);
    CHECK_EQ(info.dp_size, 2);
    CHECK_EQ(info.pp_size, 2);
    CHECK_EQ(info.enable_mla_l1_5_cache, 0);
    CHECK_EQ(info.kv_item_lens.count, 3);
    CHECK_EQ(info.kv_item_lens.values[2], 300);
    CHECK_EQ(info.kv_unit_lens.count, 2);
    CHECK(info.layout_json != NULL);
    CHECK_STR_CONTAINS(info.layout_json, "\"layers\":2");
    kvb_bootstrap_parallel_info_free(&info);
    CHECK(info.kv_item_lens.values == NULL);

    /* Unknown rank: NOT_FOUND naming the URL and the server's text. */
    CHECK_EQ(kvb_bootstrap_client_lookup(c, 1, 1, 1, 0, &a) == KVB_OK, 1); /* from HTTP tests */
    CHECK_EQ(kvb_bootstrap_client_lookup(c, 0, 1, 5, 0, &a), KVB_ERR_NOT_FOUND);
    CHECK_STR_CONTAINS(kvb_bootstrap_client_last_error(c), "/route?engine_rank=1");
    CHECK_STR_CONTAINS(kvb_bootstrap_client_last_error(c), "Bootstrap info not Found");
    CHECK_EQ(kvb_bootstrap_client_lookup(c, -1, 0, 0, 0, &a), KVB_ERR_INVALID);
    /* Contradicting sizes: the server's 400 reason comes back as PROTO. */
    reg.attn_tp_size = 4;
    CHECK_EQ(kvb_bootstrap_client_register(c, &reg, 0), KVB_ERR_PROTO);
    CHECK_STR_CONTAINS(kvb_bootstrap_client_last_error(c), "HTTP 400");
    CHECK_STR_CONTAINS(kvb_bootstrap_client_last_error(c), "contradict");
    /* Invalid locally: nothing sent. */
    reg.attn_tp_size = 2;
    reg.attn_tp_rank = 2;
    CHECK_EQ(kvb_bootstrap_client_register(c, &reg, 0), KVB_ERR_INVALID);
    reg.attn_tp_rank = 0;
    reg.rank_ip = "bad ip";
    CHECK_EQ(kvb_bootstrap_client_register(c, &reg, 0), KVB_ERR_INVALID);
    reg.rank_ip = "1.2.3.4";
    reg.field_mask = KVB_BOOTSTRAP_REG_LAYOUT_JSON;
    reg.layout_json = "[1]";
    CHECK_EQ(kvb_bootstrap_client_register(c, &reg, 0), KVB_ERR_INVALID);
    kvb_bootstrap_client_destroy(c);

    /* Malformed addresses. */
    const char *bad_addrs[] = {"",       "host",    "host:",  "host:0",     "host:65536",
                               "::1:80", "[::1]80", "a b:80", "http://x:80"};
    for (size_t i = 0; i < sizeof(bad_addrs) / sizeof(bad_addrs[0]); i++)
        CHECK_EQ(kvb_bootstrap_client_create(bad_addrs[i], NULL, &c), KVB_ERR_INVALID);
    TEST_PASS("client API: register, parallel info, lookup, health, errors");
}

static void test_auth(void)
{
    char base[256], u[512], hdr[128];
    kvb_bootstrap_server_h s = start_server("127.0.0.1", "s3cret", 0);
    kvb_bootstrap_client_h c;
    kvb_bootstrap_client_params_t cp = {.field_mask = KVB_BOOTSTRAP_CLIENT_PARAM_TOKEN,
                                        .token = "s3cret"};
    char *p = seed_payload(1, 0, 1, 0, 1, 0, 1, 0, "127.0.0.1", 5000);
    snprintf(base, sizeof(base), "http://%s", kvb_bootstrap_server_address(s));
    snprintf(u, sizeof(u), "%s/route", base);
    expect_http("PUT", u, p, NULL, 401, NULL);
    expect_http("PUT", u, p, "Authorization: Bearer wrong", 401, NULL);
    expect_http("PUT", u, p, "Authorization: Bearer s3cret2", 401, NULL);
    expect_http("PUT", u, p, "Authorization: Basic s3cret", 401, NULL);
    CHECK_EQ(kvb_bootstrap_server_num_ranks(s), 0);
    expect_http("PUT", u, p, "Authorization: Bearer s3cret", 200, "OK");
    CHECK_EQ(kvb_bootstrap_server_num_ranks(s), 1);
    /* Reads stay open. */
    snprintf(u, sizeof(u), "%s/route?engine_rank=0&target_dp_group=0", base);
    expect_http("GET", u, NULL, NULL, 200, NULL);
    snprintf(u, sizeof(u), "%s/metrics", base);
    expect_http("GET", u, NULL, NULL, 200, NULL);
    /* The client without / with the token. */
    CHECK_EQ(kvb_bootstrap_client_create(kvb_bootstrap_server_address(s), NULL, &c), KVB_OK);
    kvb_bootstrap_registration_t reg = {.attn_tp_size = 1,
                                        .attn_dp_size = 1,
                                        .pp_size = 1,
                                        .system_dp_size = 1,
                                        .rank_ip = "127.0.0.1",
                                        .rank_port = 5001};
    CHECK_EQ(kvb_bootstrap_client_register(c, &reg, 0), KVB_ERR_AUTH);
    CHECK_STR_CONTAINS(kvb_bootstrap_client_last_error(c), "HTTP 401");
    kvb_bootstrap_client_destroy(c);
    CHECK_EQ(kvb_bootstrap_client_create(kvb_bootstrap_server_address(s), &cp, &c), KVB_OK);
    CHECK_EQ(kvb_bootstrap_client_register(c, &reg, 0), KVB_OK);
    kvb_bootstrap_client_destroy(c);
    snprintf(u, sizeof(u), "%s/metrics", base);
    http_resp_t r;
    http_req("GET", u, NULL, 0, NULL, &r);
    CHECK(metric(r.body, "kvbridge_bootstrap_errors_total{code=\"401\"}") == 5);
    http_resp_free(&r);
    kvb_bootstrap_server_stop(s);

    /* auth_reads: GET /route and /metrics need it, /health does not. */
    s = start_server("127.0.0.1", "s3cret", 1);
    snprintf(base, sizeof(base), "http://%s", kvb_bootstrap_server_address(s));
    snprintf(hdr, sizeof(hdr), "Authorization: Bearer s3cret");
    snprintf(u, sizeof(u), "%s/route?engine_rank=-1&target_dp_group=-1", base);
    expect_http("GET", u, NULL, NULL, 401, NULL);
    expect_http("GET", u, NULL, hdr, 404, "Bootstrap info not Found");
    snprintf(u, sizeof(u), "%s/metrics", base);
    expect_http("GET", u, NULL, NULL, 401, NULL);
    expect_http("GET", u, NULL, hdr, 200, NULL);
    snprintf(u, sizeof(u), "%s/health", base);
    expect_http("GET", u, NULL, NULL, 200, "OK");
    kvb_bootstrap_server_stop(s);

    /* The token from KVBRIDGE_BOOTSTRAP_TOKEN (server and client). */
    setenv("KVBRIDGE_BOOTSTRAP_TOKEN", "from-env", 1);
    s = start_server("127.0.0.1", NULL, 0);
    snprintf(u, sizeof(u), "http://%s/route", kvb_bootstrap_server_address(s));
    expect_http("PUT", u, p, NULL, 401, NULL);
    expect_http("PUT", u, p, "Authorization: Bearer from-env", 200, "OK");
    CHECK_EQ(kvb_bootstrap_client_create(kvb_bootstrap_server_address(s), NULL, &c), KVB_OK);
    CHECK_EQ(kvb_bootstrap_client_register(c, &reg, 0), KVB_OK);
    kvb_bootstrap_client_destroy(c);
    kvb_bootstrap_server_stop(s);
    unsetenv("KVBRIDGE_BOOTSTRAP_TOKEN");
    free(p);
    TEST_PASS("bearer token: 401 on PUT, reads open unless auth_reads, env variable");
}

static void test_start_errors(void)
{
    kvb_bootstrap_server_h s = start_server("127.0.0.1", NULL, 0), s2 = NULL;
    kvb_bootstrap_server_params_t p = {.field_mask = KVB_BOOTSTRAP_SERVER_PARAM_HOST |
                                                     KVB_BOOTSTRAP_SERVER_PARAM_PORT,
                                       .host = "127.0.0.1",
                                       .port = kvb_bootstrap_server_port(s)};
    CHECK_EQ(kvb_bootstrap_server_start(&p, &s2), KVB_ERR_IO); /* port in use */
    p.host = "no.such.host.invalid";
    p.port = 0;
    CHECK_EQ(kvb_bootstrap_server_start(&p, &s2), KVB_ERR_INVALID);
    p.host = "127.0.0.1";
    p.field_mask |= KVB_BOOTSTRAP_SERVER_PARAM_THREADS;
    p.threads = 0;
    CHECK_EQ(kvb_bootstrap_server_start(&p, &s2), KVB_ERR_INVALID);
    CHECK(s2 == NULL);
    kvb_bootstrap_server_stop(s);
    kvb_bootstrap_server_stop(NULL);
    TEST_PASS("start errors");
}

int main(void)
{
    kvb_bootstrap_server_h s;
    curl_global_init(CURL_GLOBAL_DEFAULT);
    unsetenv("KVBRIDGE_BOOTSTRAP_TOKEN");
    s = start_server("127.0.0.1", NULL, 0);
    snprintf(g_base, sizeof(g_base), "http://%s", kvb_bootstrap_server_address(s));
    CHECK_STR_CONTAINS(kvb_bootstrap_server_address(s), "127.0.0.1:");
    test_basic_routes();
    test_register_and_lookup(s);
    test_query_errors();
    test_layout_keys();
    test_put_errors(s);
    test_metrics();
    test_client_api(s);
    kvb_bootstrap_server_stop(s);
    test_auth();
    test_start_errors();
    curl_global_cleanup();
    return 0;
}
