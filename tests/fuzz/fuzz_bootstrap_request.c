/* Fuzz harness: the bootstrap server's request parsing without HTTP.
 * Input = a GET /route query string (either dialect), a newline, then a body
 * given to every body parser: PUT /route (both shapes), POST
 * /register_dp_rank, POST /query_dp_ranks, and the client's parsers of both
 * parallel-info answers and of the /query_dp_ranks answer.
 * Invariants checked (abort on violation):
 *  - an accepted query is either the parallel-info query (-1/-1) or three
 *    non-negative ranks;
 *  - an accepted registration has ranks below sizes and a valid port/ip, and
 *    re-serialises to JSON that parses back to an identical registration;
 *  - applying a registration to a table either succeeds (the entry is then
 *    found with that address) or leaves the table exactly as it was;
 *  - a rank look-up answer parses to a valid address and "kvbridge" value,
 *    or is refused with a one-line reason. */
#include "fuzz_assert.h"
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bootstrap/boot_table.h"
#include "proto/bootstrap_proto.h"

static void check_query(const char *qs, size_t len)
{
    char reason[KVB__BOOT_REASON_MAX];
    kvb__boot_query_t q;
    reason[0] = '\0';
    kvb__boot_query_result_t r = kvb__boot_query_parse_string(qs, len, &q, reason, sizeof(reason));
    if (r == KVB__BOOT_QUERY_OK && q.v2026) {
        FUZZ_ASSERT(q.engine_rank >= -1 && q.dp_group >= -1 && q.pp_rank >= -1 && q.cp_rank >= -1);
        FUZZ_ASSERT(q.parallel_info == (q.engine_rank == -1 && q.dp_group == -1 &&
                                        q.pp_rank == -1 && q.cp_rank == -1));
    } else if (r == KVB__BOOT_QUERY_OK) {
        FUZZ_ASSERT(q.cp_rank == 0 && !q.want_layout);
        if (q.parallel_info)
            FUZZ_ASSERT(q.engine_rank == -1 && q.dp_group == -1 && q.pp_rank == -1);
        else
            FUZZ_ASSERT(q.engine_rank >= 0 && q.dp_group >= 0 && q.pp_rank >= 0);
    } else {
        FUZZ_ASSERT(reason[0] != '\0' && strchr(reason, '\n') == NULL);
    }
}

static int same_str(const char *a, const char *b)
{
    return (a == NULL && b == NULL) || (a != NULL && b != NULL && strcmp(a, b) == 0);
}

static int same_reg(const kvb__boot_reg_t *a, const kvb__boot_reg_t *b)
{
    return a->attn_tp_size == b->attn_tp_size && a->attn_tp_rank == b->attn_tp_rank &&
           a->attn_dp_size == b->attn_dp_size && a->attn_dp_rank == b->attn_dp_rank &&
           a->pp_size == b->pp_size && a->pp_rank == b->pp_rank &&
           a->system_dp_size == b->system_dp_size && a->system_dp_rank == b->system_dp_rank &&
           a->rank_port == b->rank_port && strcmp(a->rank_ip, b->rank_ip) == 0 &&
           json_equal(a->layout, b->layout) && a->has_role == b->has_role && a->v2026 == b->v2026 &&
           a->attn_cp_size == b->attn_cp_size && a->attn_cp_rank == b->attn_cp_rank &&
           a->page_size == b->page_size && same_str(a->kv_cache_dtype, b->kv_cache_dtype) &&
           same_str(a->load_balance_method, b->load_balance_method) &&
           a->enable_dsa_cache_layer_split == b->enable_dsa_cache_layer_split &&
           a->prefill_http_port == b->prefill_http_port && a->kvbridge == b->kvbridge;
}

static void check_table(const kvb__boot_reg_t *reg)
{
    static const char base[] =
        "{\"role\":\"Prefill\",\"attn_tp_size\":2,\"attn_tp_rank\":1,\"attn_dp_size\":1,"
        "\"attn_dp_rank\":0,\"pp_size\":1,\"pp_rank\":0,\"system_dp_size\":2,"
        "\"system_dp_rank\":1,\"rank_ip\":\"10.0.0.1\",\"rank_port\":7000,"
        "\"kv_item_lens\":[64]}";
    char reason[KVB__BOOT_REASON_MAX];
    kvb__boot_table_t t;
    kvb__boot_reg_t b;
    json_t *before, *after;
    bool nomem;

    FUZZ_ASSERT(kvb__boot_table_init(&t) == KVB_OK);
    FUZZ_ASSERT(kvb__boot_reg_parse(base, sizeof(base) - 1, &b, reason, sizeof(reason)) == KVB_OK);
    FUZZ_ASSERT(kvb__boot_table_apply(&t, &b, reason, sizeof(reason)) == KVB_OK);
    kvb__boot_reg_clear(&b);
    before = kvb__boot_table_snapshot(&t);
    FUZZ_ASSERT(before != NULL);
    kvb_status_t st = kvb__boot_table_apply(&t, reg, reason, sizeof(reason));
    after = kvb__boot_table_snapshot(&t);
    FUZZ_ASSERT(after != NULL);
    if (st == KVB_OK) {
        const kvb__boot_entry_t *e = kvb__boot_table_find(
            &t, kvb__boot_reg_dp_group(reg), reg->attn_cp_rank, reg->attn_tp_rank, reg->pp_rank);
        FUZZ_ASSERT(e != NULL && e->rank_port == reg->rank_port &&
                    strcmp(e->rank_ip, reg->rank_ip) == 0);
        FUZZ_ASSERT(t.count >= 1 && t.count <= 2);
        json_t *info = kvb__boot_table_parallel_info(&t, &nomem);
        FUZZ_ASSERT(info != NULL);
        json_decref(info);
        /* 2026: exactly SGLang's 15 keys once ready (an SGLang decode
         * refuses any other key). */
        info = kvb__boot_table_parallel_info_2026(&t, false, &nomem);
        FUZZ_ASSERT((info != NULL) == kvb__boot_table_ready(&t));
        FUZZ_ASSERT(info == NULL || json_object_size(info) == 15);
        json_decref(info);
    } else {
        FUZZ_ASSERT(json_equal(before, after));
    }
    json_decref(before);
    json_decref(after);
    kvb__boot_table_destroy(&t);
}

static void check_body(const char *body, size_t len)
{
    char reason[KVB__BOOT_REASON_MAX];
    kvb__boot_reg_t reg, again;
    reason[0] = '\0';
    if (kvb__boot_reg_parse(body, len, &reg, reason, sizeof(reason)) != KVB_OK) {
        FUZZ_ASSERT(reason[0] != '\0' && strchr(reason, '\n') == NULL);
        return;
    }
    FUZZ_ASSERT(reg.attn_tp_rank < reg.attn_tp_size && reg.pp_rank < reg.pp_size);
    FUZZ_ASSERT(reg.attn_dp_rank < reg.attn_dp_size && reg.system_dp_rank < reg.system_dp_size);
    FUZZ_ASSERT(reg.rank_port >= 1 && reg.rank_port <= 65535);
    FUZZ_ASSERT(kvb__boot_valid_host(reg.rank_ip, strlen(reg.rank_ip)));
    FUZZ_ASSERT(reg.attn_cp_rank >= 0 && reg.attn_cp_rank < reg.attn_cp_size);
    FUZZ_ASSERT(reg.page_size == -1 || reg.page_size >= 1);
    FUZZ_ASSERT(reg.kvbridge >= 0 && reg.kvbridge <= KVB__BOOT_KVBRIDGE_MAX);
    /* Without role it is SGLang 2026's shape: page_size is required. */
    FUZZ_ASSERT(reg.has_role || (reg.v2026 && reg.page_size >= 1));
    FUZZ_ASSERT(reg.kv_cache_dtype == NULL ||
                kvb__boot_valid_word(reg.kv_cache_dtype, strlen(reg.kv_cache_dtype)));
    json_t *o = kvb__boot_reg_to_json(&reg);
    FUZZ_ASSERT(o != NULL);
    char *text = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    FUZZ_ASSERT(text != NULL);
    /* Reals in kvbridge_layout may print longer than they were written. */
    if (strlen(text) <= KVB_BOOTSTRAP_MAX_BODY) {
        FUZZ_ASSERT(kvb__boot_reg_parse(text, strlen(text), &again, reason, sizeof(reason)) ==
                    KVB_OK);
        FUZZ_ASSERT(same_reg(&reg, &again));
        kvb__boot_reg_clear(&again);
    }
    free(text);
    check_table(&reg);
    kvb__boot_reg_clear(&reg);
}

/* The other body parsers: accepted values are in range, refusals have a
 * one-line reason, nothing leaks. */
static void check_other_bodies(const char *body, size_t len)
{
    char reason[KVB__BOOT_REASON_MAX];
    uint64_t room, *rooms = NULL;
    int64_t dp;
    size_t n = 0;
    kvb_bootstrap_parallel_info_t info;
    kvb_bootstrap_parallel_info_ext_t ext;
    static const uint64_t ask[3] = {0, 7, UINT64_MAX};
    int32_t dps[3];

    reason[0] = '\0';
    if (kvb__boot_dp_rank_parse(body, len, &room, &dp, reason, sizeof(reason)) == KVB_OK)
        FUZZ_ASSERT(dp >= 0 && dp < KVB__BOOT_MAX_SIZE);
    else
        FUZZ_ASSERT(reason[0] != '\0' && strchr(reason, '\n') == NULL);
    if (kvb__boot_dp_query_parse(body, len, &rooms, &n, reason, sizeof(reason)) == KVB_OK)
        FUZZ_ASSERT(n <= KVB__BOOT_MAX_QUERY_ROOMS && (n == 0) == (rooms == NULL));
    free(rooms);
    if (kvb__boot_dp_answer_parse(body, len, ask, 3, dps, reason, sizeof(reason)) == KVB_OK)
        for (int i = 0; i < 3; i++)
            FUZZ_ASSERT(dps[i] >= -1 && dps[i] < KVB__BOOT_MAX_SIZE);
    memset(&ext, 0, sizeof(ext));
    ext.field_mask = ~(uint64_t)0;
    if (kvb__boot_parallel_info_parse_2026(body, len, &info, &ext, reason, sizeof(reason)) ==
        KVB_OK) {
        FUZZ_ASSERT(info.attn_tp_size >= 1 && ext.attn_cp_size >= 1);
        FUZZ_ASSERT(ext.page_size == -1 || ext.page_size >= 1);
        FUZZ_ASSERT(strlen(ext.kv_cache_dtype) <= KVB__BOOT_WORD_MAX);
        kvb_bootstrap_parallel_info_free(&info);
    }
    if (kvb__boot_parallel_info_parse(body, len, &info, reason, sizeof(reason)) == KVB_OK)
        kvb_bootstrap_parallel_info_free(&info);
    kvb_bootstrap_rank_addr_t addr;
    int kvbridge = -1;
    if (kvb__boot_rank_addr_parse(body, len, &addr, &kvbridge, reason, sizeof(reason)) == KVB_OK)
        FUZZ_ASSERT(kvbridge >= 0 && kvbridge <= KVB__BOOT_KVBRIDGE_MAX && addr.rank_port >= 1 &&
                    kvb__boot_valid_host(addr.rank_ip, strlen(addr.rank_ip)));
    else
        FUZZ_ASSERT(reason[0] != '\0' && strchr(reason, '\n') == NULL);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *s = (const char *)data;
    const char *nl = memchr(s, '\n', size);
    size_t qlen = nl != NULL ? (size_t)(nl - s) : size;
    check_query(s, qlen);
    if (nl != NULL) {
        check_body(nl + 1, size - qlen - 1);
        check_other_bodies(nl + 1, size - qlen - 1);
    }
    return 0;
}
