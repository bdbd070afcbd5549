/* kvbridge's bootstrap server hosting TokenSpeed 0.1.1 (CachePD) prefill
 * ranks, and kvbridge prefill ranks described to CachePD decodes
 * (PROTOCOL-TOKENSPEED-CACHEPD.md 3, 12.2):
 * - every recorded case's PUT /route bodies (TokenSpeed's prefill ranks)
 *   are taken, the parallel info is TokenSpeed's server's answer byte for
 *   byte, each per-rank look-up gives its rank's address, an unknown rank
 *   is a clean 404;
 * - a rank with another layout or placement is refused with TokenSpeed's
 *   text and changes nothing;
 * - a kvbridge prefill rank registers its own contract next to its kvbridge
 *   registration: the answer keeps kvbridge's keys and carries the contract
 *   and placement, which a CachePD decode of the same model (the recorded
 *   decode contract) checks compatible and plans a route from, to that
 *   rank's control endpoint.
 *
 *   test_cpd_bootstrap CORPUS_DIR */
#include <jansson.h>

#include "dialect/cachepd/cachepd.h"
#include "harness/kvb_cluster.h"
#include "integration/bootstrap/boot_test_util.h"

static const char *CORPUS;

static json_t *corpus(const char *name)
{
    char path[1024];
    json_error_t je;
    snprintf(path, sizeof(path), "%s/%s.json", CORPUS, name);
    json_t *j = json_load_file(path, 0, &je);
    if (j == NULL)
        fprintf(stderr, "%s: %s\n", path, je.text);
    CHECK(j != NULL);
    return j;
}

static char *url_of(kvb_bootstrap_server_h s, const char *path)
{
    char *u = NULL;
    CHECK(asprintf(&u, "http://%s%s", kvb_bootstrap_server_address(s), path) > 0);
    return u;
}

static void expect(kvb_bootstrap_server_h s, const char *method, const char *path, const char *body,
                   long code, const char *want)
{
    char *u = url_of(s, path);
    expect_http(method, u, body, NULL, code, want);
    free(u);
}

/* GET path: 200, the body into *out (caller frees). */
static char *get(kvb_bootstrap_server_h s, const char *path)
{
    http_resp_t r;
    char *u = url_of(s, path);
    http_req("GET", u, NULL, 0, NULL, &r);
    free(u);
    if (r.code != 200)
        fprintf(stderr, "GET %s: %ld %s\n", path, r.code, r.body);
    CHECK_EQ(r.code, 200);
    return r.body;
}

/* Each recorded rank's PUT, then the answers TokenSpeed's server gave. */
static void replay_case(const char *name)
{
    char file[128], path[128];
    snprintf(file, sizeof(file), "%s_bootstrap_parallel_info", name);
    json_t *j = corpus(file), *put;
    size_t i;
    kvb_bootstrap_server_h s = start_server("127.0.0.1", NULL, 0);
    expect(s, "GET", "/route?engine_rank=-1&target_dp_group=-1", NULL, 404, NULL);
    json_array_foreach(json_object_get(j, "server_puts"), i, put)
        expect(s, "PUT", "/route", json_string_value(put), 200, "OK");
    expect(s, "GET", "/route?engine_rank=-1&target_dp_group=-1", NULL, 200,
           json_string_value(json_object_get(j, "body")));
    json_array_foreach(json_object_get(j, "server_puts"), i, put)
    {
        json_t *b = json_loads(json_string_value(put), 0, NULL);
        int64_t w = json_integer_value(json_object_get(b, "world_size"));
        int64_t dp = json_integer_value(json_object_get(b, "dp_size"));
        int64_t r = json_integer_value(json_object_get(b, "engine_rank"));
        char want[256];
        snprintf(path, sizeof(path), "/route?engine_rank=%lld&target_dp_group=%lld",
                 (long long)(r % (w / dp)), (long long)(r / (w / dp)));
        snprintf(want, sizeof(want), "{\"rank_ip\":\"%s\",\"rank_port\":%lld}",
                 json_string_value(json_object_get(b, "rank_ip")),
                 (long long)json_integer_value(json_object_get(b, "rank_port")));
        expect(s, "GET", path, NULL, 200, want);
        json_decref(b);
    }
    expect(s, "GET", "/route?engine_rank=77&target_dp_group=0", NULL, 404, NULL);
    CHECK_EQ(kvb_bootstrap_server_num_ranks(s), json_array_size(json_object_get(j, "server_puts")));
    kvb_bootstrap_server_stop(s);
    json_decref(j);
    fprintf(stderr, "ok: %s: TokenSpeed's PUTs taken, answers byte for byte\n", name);
}

/* A rank of another layout after mha_tp2_tp1's: refused, nothing changed. */
static void refusals(void)
{
    json_t *a = corpus("mha_tp2_tp1_bootstrap_parallel_info");
    json_t *b = corpus("mha_tp1_tp1_bootstrap_put");
    kvb_bootstrap_server_h s = start_server("127.0.0.1", NULL, 0);
    size_t i;
    json_t *put;
    json_array_foreach(json_object_get(a, "server_puts"), i, put)
        expect(s, "PUT", "/route", json_string_value(put), 200, "OK");
    char *u = url_of(s, "/route");
    http_resp_t r;
    const char *other = json_string_value(json_object_get(b, "body"));
    http_req("PUT", u, other, strlen(other), NULL, &r);
    CHECK_EQ(r.code, 400);
    CHECK_STR_CONTAINS(r.body, "CachePD");
    http_resp_free(&r);
    const char *cut = "{\"role\": \"Prefill\", \"cache_layout\": \"{\"}";
    http_req("PUT", u, cut, strlen(cut), NULL, &r);
    CHECK_EQ(r.code, 400);
    http_resp_free(&r);
    free(u);
    expect(s, "GET", "/route?engine_rank=-1&target_dp_group=-1", NULL, 200,
           json_string_value(json_object_get(a, "body")));
    kvb_bootstrap_server_stop(s);
    json_decref(a);
    json_decref(b);
    TEST_PASS("CachePD PUT refusals change nothing");
}

/* A 126-layer model's contract (Llama-405B-like) makes a PUT of about
 * 97 KiB: past the 64 KiB the bootstrap bodies were once capped at. */
static void big_contract(void)
{
    kvb__cpd_ordinary_t o = {false, 126, 8, 128, 8, 64, KVB__CPD_BFLOAT16, 4095, 0};
    kvb__cpd_put_t p;
    kvb__frames_err_t e;
    char *body, *info;
    size_t len;
    memset(&p, 0, sizeof(p));
    CHECK_EQ(kvb__cpd_contract_ordinary(&o, &e, &p.contract), KVB_OK);
    CHECK_EQ(kvb__cpd_stages_single(&p.contract, &p.stages), KVB_OK);
    p.world_size = p.dp_size = p.pp_size = 1;
    snprintf(p.rank_ip, sizeof(p.rank_ip), "10.0.0.1");
    p.rank_port = 35001;
    CHECK_EQ(kvb__cpd_put_encode(&p, &body, &len), KVB_OK);
    fprintf(stderr, "126-layer PUT: %zu bytes\n", len);
    CHECK(len > 64 * 1024);
    kvb_bootstrap_server_h s = start_server("127.0.0.1", NULL, 0);
    expect(s, "PUT", "/route", body, 200, "OK");
    info = get(s, "/route?engine_rank=-1&target_dp_group=-1");
    CHECK_STR_CONTAINS(info, "layer.125.v");
    free(info);
    free(body);
    kvb__cpd_put_free(&p);
    kvb_bootstrap_server_stop(s);
    TEST_PASS("a 126-layer CachePD registration through kvbridge's server");
}

/* A kvbridge decode sent to CachePD prefill ranks (TokenSpeed's PUTs on
 * kvbridge's server) with pages of 32 tokens against the prefill's 16: it
 * reads the prefill's contract and the room fails with TokenSpeed's
 * peer-check reason, before anything is sent. */
static void kvbridge_decode(void)
{
    const kvbh_geom_t g = {2, 8, 256, 32, 64, 0, 0};
    json_t *put = corpus("mha_tp1_tp1_bootstrap_put");
    kvbh_boot_t boot;
    kvbh_rank_t dec;
    kvb_receiver_h rc;
    char why[512] = "";
    CHECK_EQ(kvbh_boot_start(&boot, 0, NULL), 0);
    expect(boot.h, "PUT", "/route", json_string_value(json_object_get(put, "body")), 200, "OK");
    CHECK_EQ(kvbh_rank_start(&dec, &g, KVB_MODE_DECODE, NULL, KVBH_MEM_MALLOC, NULL), KVB_OK);
    CHECK_EQ(kvb_receiver_create(dec.mgr, boot.addr, 5, -1, &rc), KVB_OK);
    CHECK_EQ(kvbh_wait_receiver(rc, 10), KVB_POLL_FAILED);
    kvb_receiver_failure(rc, why, sizeof(why));
    fprintf(stderr, "kvbridge decode: %s\n", why);
    CHECK_STR_CONTAINS(why, "Cache P/D contract mismatch: prefix_granularity");
    kvb_receiver_destroy(rc);
    kvbh_rank_stop(&dec);
    kvbh_boot_stop(&boot);
    json_decref(put);
    TEST_PASS("a kvbridge decode refused by the CachePD peer check, with its reason");
}

static void contract_of(const char *name, kvb__cpd_contract_t *c)
{
    json_t *j = corpus(name);
    const char *body = json_string_value(json_object_get(j, "body"));
    kvb__frames_err_t e;
    if (kvb__cpd_contract_parse((const uint8_t *)body, strlen(body), &e, c) != KVB_OK)
        fprintf(stderr, "%s: %s\n", name, e.reason);
    json_decref(j);
}

/* kvbridge prefill ranks (TP 2) on the model of the recorded mha_tp2_tp1
 * case, through kvbridge's server, read as TokenSpeed's decode reads them. */
static void kvbridge_prefill(void)
{
    const kvbh_geom_t g = {2, 8, 256, 16, 64, 0, 0}; /* 8 heads of 128 bf16, page 16 */
    kvbh_boot_t boot;
    kvbh_rank_t pre[2];
    kvb__cpd_contract_t dec;
    kvb__cpd_pinfo_t pi;
    kvb__cpd_route_t route;
    kvb__frames_err_t e;
    CHECK_EQ(kvbh_boot_start(&boot, 0, NULL), 0);
    for (int i = 0; i < 2; i++) {
        kvbh_place_t pl = {i, 2, 0, 1, 0, 1};
        CHECK_EQ(kvbh_rank_start_at(&pre[i], &g, &pl, KVB_MODE_PREFILL, boot.addr, KVBH_MEM_MALLOC,
                                    NULL),
                 KVB_OK);
    }
    char *info = get(boot.h, "/route?engine_rank=-1&target_dp_group=-1");
    CHECK_STR_CONTAINS(info, "\"prefill_attn_tp_size\":2"); /* kvbridge's and SGLang's */
    CHECK_STR_CONTAINS(info, "\"cache_fields_by_stage\":[[\"layer.0.k\",");
    if (kvb__cpd_pinfo_parse(info, strlen(info), &e, &pi) != KVB_OK)
        fprintf(stderr, "parallel info: %s\n", e.reason);
    CHECK_EQ(pi.tp_size, 2);
    contract_of("mha_tp2_tp1_contract_decode", &dec);
    if (kvb__cpd_check_peer(&pi.contract, &dec, &e) != KVB_OK)
        fprintf(stderr, "peer check: %s\n", e.reason);
    kvb__cpd_pair_t pair = {&pi.contract, &dec, &pi.stages, pi.tp_size, 1};
    CHECK_EQ(kvb__cpd_plan_decode(&pair, 0, &e, &route), KVB_OK);
    CHECK_EQ(route.nsources, 2); /* both prefill ranks, 4 heads each */
    for (int i = 0; i < 2; i++) {
        char path[96], *addr;
        char ip[KVB__CPD_MAX_ENDPOINT + 1], ep[300];
        uint16_t port;
        snprintf(path, sizeof(path), "/route?engine_rank=%d&target_dp_group=0", i);
        addr = get(boot.h, path);
        CHECK_EQ(kvb__cpd_rank_addr_parse(addr, strlen(addr), &e, ip, &port), KVB_OK);
        snprintf(ep, sizeof(ep), "%s:%u", ip, port);
        CHECK(strcmp(ep, kvb_manager_endpoint(pre[i].mgr)) == 0);
        free(addr);
    }
    kvb__cpd_route_free(&route);
    kvb__cpd_contract_free(&dec);
    kvb__cpd_pinfo_free(&pi);
    free(info);
    for (int i = 0; i < 2; i++)
        kvbh_rank_stop(&pre[i]);
    kvbh_boot_stop(&boot);
    TEST_PASS("kvbridge prefill ranks described to a CachePD decode by kvbridge's server");
}

int main(int argc, char **argv)
{
    CHECK(argc == 2);
    CORPUS = argv[1];
    curl_global_init(CURL_GLOBAL_ALL);
    static const char *const cases[] = {"mha_tp1_tp1",      "mha_tp2_tp1",     "mha_tp1_tp2",
                                        "gqa_tp4_tp1",      "mla_tp2_tp1",     "mla_tp4_tp2",
                                        "mla_dcp2_tp2_tp1", "mha_pp2_tp1_tp1", "hybrid_tp2_tp1",
                                        "swa_tp1_tp1",      "mha_prefix2"};
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        replay_case(cases[i]);
    refusals();
    big_contract();
    kvbridge_prefill();
    kvbridge_decode();
    curl_global_cleanup();
    TEST_PASS("CachePD on kvbridge's bootstrap server");
    return 0;
}
