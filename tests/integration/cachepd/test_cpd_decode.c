/* kvbridge's C decode speaking TokenSpeed 0.1.1's CachePD to kvbridge's C
 * prefill (which serves CachePD decodes), through kvbridge's bootstrap
 * server. The prefill ranks appear there as TokenSpeed 0.1.1 prefills do:
 * only their CachePD PUTs (kvbridge's own registration would make the
 * decode speak SGLang 2026 to them), so the decode reads the prefill's
 * layout contract, plans its route with TokenSpeed's planner, registers one
 * slab over its separate KV buffers and sends block manifests.
 *
 * Checked: whole rooms over TP 1->1, 2->1, 1->2, MLA 2->1 (a dummy rank)
 * and a decode prefix of 2 pages, every KV byte of every decode rank (a
 * pattern keyed by global layer and head, so the head re-slicing is
 * checked); the status fields read back on the receiver (first token and
 * candidates, the largest cached count, the logprob); and refusals, each
 * failing its room with a reason that says what is wrong, after which the
 * ranks keep serving: a prompt length that does not fill the pages, a
 * prefix not short of the prompt, a page mask with holes (nothing sent), a
 * sender holding more pages than the manifest asked (the prefill refuses
 * it, the decode hears Failed within 10 s), a decode whose pages are not
 * the prefill's (TokenSpeed's peer-check reason, nothing sent).
 *
 *   test_cpd_decode [case-substring] */
#include "dialect/cachepd/adapter.h"
#include "harness/kvb_cluster.h"
#include "kvb_test.h"
#include "proto/bootstrap_proto.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TOKEN 29871
#define LOGPROB (-0.0123)

/* The cluster's prefill ranks registered on a server of their own with
 * their CachePD PUT only; the decodes are pointed at it. */
static void cpd_server(kvbh_cluster_t *c, kvbh_boot_t *b)
{
    kvb_bootstrap_client_h cl;
    CHECK_EQ(kvbh_boot_start(b, 0, NULL), 0);
    CHECK_EQ(kvb_bootstrap_client_create(b->addr, NULL, &cl), KVB_OK);
    for (int dp = 0; dp < c->pdp; dp++)
        for (int tp = 0; tp < c->ptp; tp++) {
            char *body = kvb__cpd_own_put(kvbh_cluster_prefill(c, dp, tp, 0)->mgr);
            CHECK(body != NULL);
            CHECK_EQ(kvb__bootstrap_client_put_route(cl, body, 5.0), KVB_OK);
            free(body);
        }
    kvb_bootstrap_client_destroy(cl);
    snprintf(c->boot_addr, sizeof(c->boot_addr), "%s", b->addr);
    c->no_aux = 1; /* CachePD carries no aux data */
}

/* contract: params cachepd_contract of every rank, or NULL. */
static void cluster_with(kvbh_cluster_t *c, kvbh_boot_t *b, const kvbh_geom_t *g, int ptp, int dtp,
                         const char *contract)
{
    kvbh_cluster_cfg_t cfg = {.g = *g, .ptp = ptp, .ppp = 1, .pdp = 1, .dtp = dtp};
    cfg.pre.cachepd_contract = cfg.dec.cachepd_contract = contract;
    CHECK_EQ(kvbh_cluster_start(c, &cfg), KVB_OK);
    cpd_server(c, b);
}

static void cluster(kvbh_cluster_t *c, kvbh_boot_t *b, const kvbh_geom_t *g, int ptp, int dtp)
{
    cluster_with(c, b, g, ptp, dtp, NULL);
}

static void stop(kvbh_cluster_t *c, kvbh_boot_t *b)
{
    kvbh_cluster_stop(c);
    kvbh_boot_stop(b);
}

static const kvbh_geom_t MHA = {2, 4, 64, 4, 128, 0, 0}; /* bf16 heads of 32 */
static const kvbh_geom_t MLA = {3, 1, 96, 4, 128, 1, 0};

/* A hybrid model as its framework would describe it to kvbridge (params
 * cachepd_contract; TokenSpeed's contract at TP 1, plan of one parent):
 * full-attention layers 1 and 3 (K/V [page 4, 4 heads, 32] bfloat16, the
 * harness's 2 layers), linear-attention layer 0's state in group
 * linear_attention_0, listed first as TokenSpeed lists state groups:
 * conv [64, 2] bfloat16 split by TP in parts (16, 16, 32), ssm [4, 16]
 * float32 split on axis 0; at TP 1 256 bytes each, at TP 2 128 (the
 * harness's state buffers 0 and 1, in (layer, name) order). */
static const char HYBRID[] =
    "{\"plan\":{\"prefix_granularity\":4,\"lcm_block_bytes\":4608,\"num_lcm_blocks\":1,"
    "\"groups\":[{\"group_id\":\"full_attention\",\"cache_blocks_per_lcm_block\":1,"
    "\"page_count\":2},{\"group_id\":\"linear_attention_0\",\"cache_blocks_per_lcm_block\":1,"
    "\"page_count\":2}],\"planes\":["
    "{\"plane_id\":\"p0\",\"bytes_per_lcm_block\":1024,\"arena_offset_bytes\":0},"
    "{\"plane_id\":\"p1\",\"bytes_per_lcm_block\":1024,\"arena_offset_bytes\":2048},"
    "{\"plane_id\":\"p2\",\"bytes_per_lcm_block\":1024,\"arena_offset_bytes\":4096},"
    "{\"plane_id\":\"p3\",\"bytes_per_lcm_block\":1024,\"arena_offset_bytes\":6144},"
    "{\"plane_id\":\"p4\",\"bytes_per_lcm_block\":256,\"arena_offset_bytes\":8192},"
    "{\"plane_id\":\"p5\",\"bytes_per_lcm_block\":256,\"arena_offset_bytes\":8704}],"
    "\"fields\":["
    "{\"group_id\":\"full_attention\",\"field_id\":\"layer.1.k\",\"plane_id\":\"p0\","
    "\"shape\":[4,4,32],\"dtype\":\"bfloat16\",\"field_offset_bytes\":0,\"page_stride_bytes\":1024}"
    ","
    "{\"group_id\":\"full_attention\",\"field_id\":\"layer.1.v\",\"plane_id\":\"p1\","
    "\"shape\":[4,4,32],\"dtype\":\"bfloat16\",\"field_offset_bytes\":0,\"page_stride_bytes\":1024}"
    ","
    "{\"group_id\":\"full_attention\",\"field_id\":\"layer.3.k\",\"plane_id\":\"p2\","
    "\"shape\":[4,4,32],\"dtype\":\"bfloat16\",\"field_offset_bytes\":0,\"page_stride_bytes\":1024}"
    ","
    "{\"group_id\":\"full_attention\",\"field_id\":\"layer.3.v\",\"plane_id\":\"p3\","
    "\"shape\":[4,4,32],\"dtype\":\"bfloat16\",\"field_offset_bytes\":0,\"page_stride_bytes\":1024}"
    ","
    "{\"group_id\":\"linear_attention_0\",\"field_id\":\"layer.0.ssm\",\"plane_id\":\"p4\","
    "\"shape\":[4,16],\"dtype\":\"float32\",\"field_offset_bytes\":0,\"page_stride_bytes\":256},"
    "{\"group_id\":\"linear_attention_0\",\"field_id\":\"layer.0.conv\",\"plane_id\":\"p5\","
    "\"shape\":[64,2],\"dtype\":\"bfloat16\",\"field_offset_bytes\":0,\"page_stride_bytes\":256}],"
    "\"resident_block_bytes\":null},\"group_specs\":["
    "{\"group_id\":\"linear_attention_0\",\"retention\":\"full_history\",\"rows_per_page\":null,"
    "\"entry_stride_tokens\":null,\"sliding_window_tokens\":null,\"replayable\":false,"
    "\"family\":\"state\",\"transfer_policy\":\"latest_snapshot\",\"checkpoint_granularity\":4,"
    "\"shard_count\":1},"
    "{\"group_id\":\"full_attention\",\"retention\":\"full_history\",\"rows_per_page\":4,"
    "\"entry_stride_tokens\":1,\"sliding_window_tokens\":null,\"replayable\":false,"
    "\"family\":\"history\",\"transfer_policy\":\"full_suffix\",\"checkpoint_granularity\":null,"
    "\"shard_count\":1}],\"transfer_schema\":{\"fields\":["
    "{\"field_id\":\"layer.1.k\",\"partition\":{\"axis\":1,\"global_extent\":4,\"global_parts\":[]}"
    "},"
    "{\"field_id\":\"layer.1.v\",\"partition\":{\"axis\":1,\"global_extent\":4,\"global_parts\":[]}"
    "},"
    "{\"field_id\":\"layer.3.k\",\"partition\":{\"axis\":1,\"global_extent\":4,\"global_parts\":[]}"
    "},"
    "{\"field_id\":\"layer.3.v\",\"partition\":{\"axis\":1,\"global_extent\":4,\"global_parts\":[]}"
    "},"
    "{\"field_id\":\"layer.0.ssm\",\"partition\":{\"axis\":0,\"global_extent\":4,\"global_parts\":["
    "]}},"
    "{\"field_id\":\"layer.0.conv\",\"partition\":{\"axis\":0,\"global_extent\":64,"
    "\"global_parts\":[16,16,32]}}]}}";
static const kvbh_geom_t HYB1 = {2, 4, 64, 4, 128, 0, 256}; /* state items at TP 1 */
static const kvbh_geom_t HYB2 = {2, 4, 64, 4, 128, 0, 128}; /* ... at TP 2 */

typedef struct tcase {
    const char *name;
    const kvbh_geom_t *g;
    int ptp, dtp, prefix_pages;
    const char *contract; /* params cachepd_contract (then one state slot a room) */
} tcase_t;

static int run_case(const tcase_t *t, uint64_t first)
{
    kvbh_cluster_t c;
    kvbh_boot_t b;
    kvbh_room_opts_t o = {
        .chunks = 3, .prefix_pages = t->prefix_pages, .dp_rank = -1, .state = t->contract != NULL};
    cluster_with(&c, &b, t->g, t->ptp, t->dtp, t->contract);
    int f = kvbh_run_rooms(&c, 4, first, &o);
    stop(&c, &b);
    fprintf(stderr, "%s: %s\n", f == 0 ? "ok" : "FAILED", t->name);
    return f;
}

/* ---- the status fields ---- */

static void send_room(kvbh_cluster_t *c, int tp, uint64_t room, const int32_t *src, int n,
                      uint64_t cached, kvb_sender_h *s_p)
{
    static const int32_t cands[3] = {11, 12, 13};
    CHECK_EQ(kvb_sender_create(kvbh_cluster_prefill(c, 0, tp, 0)->mgr, c->boot_addr, room, s_p),
             KVB_OK);
    CHECK_EQ(kvbh_wait_sender_ready(*s_p, 10), 0);
    CHECK_EQ(kvb_sender_set_first_token(*s_p, TOKEN, cands, 3), KVB_OK);
    CHECK_EQ(kvb_sender_set_cached_tokens(*s_p, cached), KVB_OK);
    CHECK_EQ(kvb_sender_set_first_logprob(*s_p, LOGPROB), KVB_OK);
    CHECK_EQ(kvb_sender_init(*s_p, (uint64_t)n, 0), KVB_OK);
    CHECK_EQ(kvb_sender_send(*s_p, src, (size_t)n), KVB_OK);
}

/* TP 2 -> 1: both prefill ranks are sources; the receiver reads the first
 * token and candidates, the larger cached count (16 and 32 said), the
 * logprob; the prompt ends inside the last page (prompt_tokens exact). */
static void status_fields(void)
{
    kvbh_cluster_t c;
    kvbh_boot_t b;
    kvb_receiver_h rc;
    kvb_sender_h s[2];
    int32_t src[3], dst[3], cands[8];
    int64_t tok = 0;
    size_t nc = 0;
    uint64_t cached = 0;
    double lp = 0;
    cluster(&c, &b, &MHA, 2, 1);
    kvbh_room_pages(&c.g, 77, 3, src, dst);
    kvb_receiver_init_t ex = {.field_mask = KVB_RECV_INIT_PROMPT,
                              .prompt_tokens = 2 * (uint64_t)MHA.page + 1};
    CHECK_EQ(kvb_receiver_create(c.dec[0].mgr, c.boot_addr, 77, -1, &rc), KVB_OK);
    CHECK_EQ(kvb_receiver_init(rc, dst, 3, 0, &ex), KVB_OK);
    CHECK_EQ(kvb_receiver_first_token(rc, &tok, cands, 8, &nc), 0); /* nothing yet */
    send_room(&c, 0, 77, src, 3, 16, &s[0]);
    send_room(&c, 1, 77, src, 3, 32, &s[1]);
    CHECK_EQ(kvbh_wait_receiver(rc, 10), KVB_POLL_SUCCESS);
    CHECK_EQ(kvb_receiver_first_token(rc, &tok, cands, 8, &nc), 1);
    CHECK_EQ(tok, TOKEN);
    CHECK_EQ(nc, 3);
    CHECK(cands[0] == 11 && cands[1] == 12 && cands[2] == 13);
    CHECK_EQ(kvb_receiver_cached_tokens(rc, &cached), 1);
    CHECK_EQ(cached, 32);
    CHECK_EQ(kvb_receiver_first_logprob(rc, &lp), 1);
    CHECK(lp == LOGPROB);
    for (int i = 0; i < 2; i++) {
        CHECK_EQ(kvbh_wait_sender(s[i], 10), KVB_POLL_SUCCESS);
        kvb_sender_destroy(s[i]);
    }
    kvb_receiver_destroy(rc);
    stop(&c, &b);
    TEST_PASS("status fields: first token, candidates, largest cached count, logprob");
}

/* ---- layerwise ---- */

/* kvb_sender_send_layers from a kvbridge prefill speaking CachePD: after
 * the piece of layer 0 settled, only layer 0's K and V pages on the decode
 * hold the room's bytes (every other buffer keeps its guard) and the room
 * is not Success; after the last piece every byte is exact. */
static void layerwise(void)
{
    const uint64_t room = 91;
    const uint8_t guard = 0x5A;
    kvbh_cluster_t c;
    kvbh_boot_t b;
    kvb_receiver_h rc;
    kvb_sender_h s;
    int32_t src[3], dst[3];
    cluster(&c, &b, &MHA, 1, 1);
    kvbh_rank_t *p = kvbh_cluster_prefill(&c, 0, 0, 0), *d = &c.dec[0];
    kvbh_room_pages(&c.g, room, 3, src, dst);
    kvbh_fill(p, room, src, 3, -1);
    kvbh_guard_fill(d, dst, 3, -1, guard);
    CHECK_EQ(kvb_receiver_create(d->mgr, c.boot_addr, room, -1, &rc), KVB_OK);
    CHECK_EQ(kvb_receiver_init(rc, dst, 3, 0, NULL), KVB_OK);
    CHECK_EQ(kvb_sender_create(p->mgr, c.boot_addr, room, &s), KVB_OK);
    CHECK_EQ(kvbh_wait_sender_ready(s, 10), 0);
    CHECK_EQ(kvb_sender_init(s, 3, 0), KVB_OK);
    uint32_t L = kvb_sender_num_layers(s);
    CHECK_EQ(L, (uint32_t)MHA.layers);
    CHECK_EQ(kvb_sender_send_layers(s, src, 3, 0, 1), KVB_OK);
    int k = 0, v = MHA.layers; /* layer 0's K and V buffers */
    double t0 = kvbh_now();
    while (kvbh_now() - t0 < 10 &&
           (kvbh_verify_buf(d, room, k, dst, 3) != 0 || kvbh_verify_buf(d, room, v, dst, 3) != 0))
        kvbh_sleep(0.002);
    fprintf(stderr, "layerwise: layer 0 placed %.3f s after its piece\n", kvbh_now() - t0);
    for (int i = 0; i < d->n_kv; i++)
        CHECK_EQ(i == k || i == v ? kvbh_verify_buf(d, room, i, dst, 3)
                                  : kvbh_guard_bad_buf(d, i, dst, 3, guard),
                 0);
    CHECK(kvb_receiver_poll(rc) != KVB_POLL_SUCCESS);
    CHECK_EQ(kvb_sender_send_layers(s, src, 3, 1, L), KVB_OK);
    CHECK_EQ(kvbh_wait_receiver(rc, 10), KVB_POLL_SUCCESS);
    CHECK_EQ(kvbh_wait_sender(s, 10), KVB_POLL_SUCCESS);
    CHECK_EQ(kvbh_verify(d, room, dst, 3, -1), 0);
    kvb_sender_destroy(s);
    kvb_receiver_destroy(rc);
    stop(&c, &b);
    TEST_PASS("layerwise: layer 0 alone after its piece, no Success before the last");
}

/* ---- refusals ---- */

/* A receiver for room whose init is refused before anything is sent: the
 * room is Failed at once with why in its reason. */
static void refused_init(kvbh_cluster_t *c, uint64_t room, int n, const kvb_receiver_init_t *ex,
                         const char *why)
{
    kvb_receiver_h rc;
    int32_t src[8], dst[8];
    char reason[512] = "";
    kvbh_room_pages(&c->g, room, n, src, dst);
    CHECK_EQ(kvb_receiver_create(c->dec[0].mgr, c->boot_addr, room, -1, &rc), KVB_OK);
    CHECK_EQ(kvb_receiver_init(rc, dst, (size_t)n, 0, ex), KVB_ERR_INVALID);
    CHECK_EQ(kvbh_wait_receiver(rc, 1), KVB_POLL_FAILED);
    kvb_receiver_failure(rc, reason, sizeof(reason));
    fprintf(stderr, "room %llu: %s\n", (unsigned long long)room, reason);
    CHECK_STR_CONTAINS(reason, why);
    CHECK_STR_CONTAINS(reason, "nothing was sent");
    kvb_receiver_destroy(rc);
}

/* One good room after a refusal: the ranks keep serving. */
static void still_serving(kvbh_cluster_t *c, uint64_t room)
{
    kvbh_room_opts_t o = {.chunks = 2, .dp_rank = -1};
    CHECK_EQ(kvbh_run_rooms(c, 1, room, &o), 0);
}

/* The sender holds 3 pages, the decode asked for 2: the prefill refuses
 * the room (its reason says so) and the decode hears Failed. */
static void prefill_refusal(kvbh_cluster_t *c, uint64_t room)
{
    kvb_receiver_h rc;
    kvb_sender_h s;
    int32_t src[3], dst[3];
    char why[512] = "";
    kvbh_room_pages(&c->g, room, 3, src, dst);
    CHECK_EQ(kvb_receiver_create(c->dec[0].mgr, c->boot_addr, room, -1, &rc), KVB_OK);
    CHECK_EQ(kvb_receiver_init(rc, dst, 2, 0, NULL), KVB_OK);
    CHECK_EQ(kvb_sender_create(kvbh_cluster_prefill(c, 0, 0, 0)->mgr, c->boot_addr, room, &s),
             KVB_OK);
    CHECK_EQ(kvbh_wait_sender_ready(s, 10), 0);
    CHECK_EQ(kvb_sender_init(s, 3, 0), KVB_OK);
    kvb_sender_send(s, src, 3);
    double t0 = kvbh_now();
    CHECK_EQ(kvbh_wait_receiver(rc, 10), KVB_POLL_FAILED);
    fprintf(stderr, "decode Failed %.3f s after the send\n", kvbh_now() - t0);
    CHECK_EQ(kvbh_wait_sender(s, 10), KVB_POLL_FAILED);
    kvb_sender_failure(s, why, sizeof(why));
    fprintf(stderr, "prefill: %s\n", why);
    CHECK_STR_CONTAINS(why, "the sender has 3 pages");
    kvb_receiver_failure(rc, why, sizeof(why));
    CHECK_STR_CONTAINS(why, "Failed to get kvcache from prefill instance");
    kvb_sender_destroy(s);
    kvb_receiver_destroy(rc);
}

/* A decode rank of geometry g (no cachepd_contract) whose room is refused
 * by the route planning: Failed within 5 s with want in the reason. */
static void decode_refused(kvbh_cluster_t *c, const kvbh_geom_t *g, uint64_t room, const char *want)
{
    kvbh_rank_t d;
    kvb_receiver_h rc;
    char why[512] = "";
    CHECK_EQ(kvbh_rank_start(&d, g, KVB_MODE_DECODE, NULL, KVBH_MEM_MALLOC, NULL), KVB_OK);
    CHECK_EQ(kvb_receiver_create(d.mgr, c->boot_addr, room, -1, &rc), KVB_OK);
    CHECK_EQ(kvbh_wait_receiver(rc, 5), KVB_POLL_FAILED);
    kvb_receiver_failure(rc, why, sizeof(why));
    fprintf(stderr, "room %llu: %s\n", (unsigned long long)room, why);
    CHECK_STR_CONTAINS(why, want);
    kvb_receiver_destroy(rc);
    kvbh_rank_stop(&d);
}

/* A decode rank with pages of 8 tokens against the prefill's 4. */
static void contract_refusal(kvbh_cluster_t *c, uint64_t room)
{
    kvbh_geom_t g = c->g;
    g.page = 8;
    decode_refused(c, &g, room, "Cache P/D contract mismatch: prefix_granularity");
}

static void refusals(void)
{
    kvbh_cluster_t c;
    kvbh_boot_t b;
    uint64_t P = (uint64_t)MHA.page;
    static const uint8_t holes[3] = {1, 0, 1};
    kvb_receiver_init_t shorter = {.field_mask = KVB_RECV_INIT_PROMPT, .prompt_tokens = P};
    kvb_receiver_init_t longer = {.field_mask = KVB_RECV_INIT_PROMPT, .prompt_tokens = 3 * P + 1};
    kvb_receiver_init_t no_suffix = {.field_mask = KVB_RECV_INIT_PREFIX, .prefix_tokens = 3 * P};
    kvb_receiver_init_t mask = {.field_mask = KVB_RECV_INIT_MASK, .page_mask = holes};
    cluster(&c, &b, &MHA, 1, 1);
    refused_init(&c, 200, 3, &shorter, "needs the exact prompt length");
    refused_init(&c, 201, 3, &longer, "does not fill the 3 pages");
    refused_init(&c, 202, 3, &no_suffix, "after a prefix of 12");
    refused_init(&c, 203, 3, &mask, "page mask with holes");
    still_serving(&c, 204);
    prefill_refusal(&c, 205);
    still_serving(&c, 206);
    contract_refusal(&c, 207);
    still_serving(&c, 208);
    stop(&c, &b);
    TEST_PASS("refusals fail their rooms with the reason; the ranks keep serving");
}

/* A contract that does not fit the rank's buffers: manager creation fails
 * with the reason. */
static void hybrid_bad_contract(const kvbh_geom_t *g, const char *contract, const char *want)
{
    kvbh_rank_t d;
    kvbh_knobs_t k = {.cachepd_contract = contract};
    CHECK_EQ(kvbh_rank_start(&d, g, KVB_MODE_DECODE, NULL, KVBH_MEM_MALLOC, &k), KVB_ERR_INVALID);
    fprintf(stderr, "refused: %s\n", kvb_manager_last_error(NULL));
    CHECK_STR_CONTAINS(kvb_manager_last_error(NULL), want);
}

static void hybrid_refusals(void)
{
    kvbh_cluster_t c;
    kvbh_boot_t b;
    kvbh_geom_t wide = HYB1;
    kvb_receiver_init_t two = {.field_mask = KVB_RECV_INIT_STATE,
                               .state_indices = (const int32_t[]){3, 4},
                               .num_state_indices = 2};
    kvb_receiver_init_t none = {.field_mask = KVB_RECV_INIT_PROMPT, .prompt_tokens = 12};
    wide.state_bytes = 512;
    cluster_with(&c, &b, &HYB1, 1, 1, HYBRID);
    refused_init(&c, 300, 3, &two, "one state slot per request");
    refused_init(&c, 301, 3, &none, "no state index");
    /* without the framework's contract a hybrid rank cannot describe its state */
    decode_refused(&c, &c.g, 302, "params cachepd_contract");
    kvbh_room_opts_t o = {.chunks = 2, .dp_rank = -1, .state = 1};
    CHECK_EQ(kvbh_run_rooms(&c, 1, 303, &o), 0); /* still serving */
    stop(&c, &b);
    hybrid_bad_contract(&wide, HYBRID, "its kvbridge buffer's item is 512");
    hybrid_bad_contract(&MHA, HYBRID, "names 2 state fields; kv_args has 0 state buffers");
    hybrid_bad_contract(&HYB1, "{\"plan\":1}", "cachepd_contract: ");
    TEST_PASS("hybrid refusals: state slots, no contract, a contract that does not fit");
}

int main(int argc, char **argv)
{
    static const tcase_t cases[] = {
        {"MHA TP1->TP1", &MHA, 1, 1, 0, NULL},
        {"MHA TP2->TP1", &MHA, 2, 1, 0, NULL},
        {"MHA TP1->TP2", &MHA, 1, 2, 0, NULL},
        {"MHA TP2->TP2", &MHA, 2, 2, 0, NULL},
        {"MLA TP2->TP1", &MLA, 2, 1, 0, NULL},
        {"MHA prefix 2 pages", &MHA, 1, 1, 2, NULL},
        {"hybrid TP1->TP1", &HYB1, 1, 1, 0, HYBRID},
        {"hybrid TP2->TP2", &HYB2, 2, 2, 0, HYBRID},
        {"hybrid prefix 1 page", &HYB1, 1, 1, 1, HYBRID},
    };
    const char *only = argc > 1 ? argv[1] : NULL;
    int failures = 0;
    srand(4242);
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        if (only == NULL || strstr(cases[i].name, only) != NULL)
            failures += run_case(&cases[i], 1000 + i * 100) != 0;
    CHECK_EQ(failures, 0);
    if (only == NULL || strstr("status fields", only) != NULL)
        status_fields();
    if (only == NULL || strstr("layerwise", only) != NULL)
        layerwise();
    if (only == NULL || strstr("refusals", only) != NULL)
        refusals();
    if (only == NULL || strstr("hybrid refusals", only) != NULL)
        hybrid_refusals();
    return 0;
}
