/* TokenSpeed's PUT /route body (seed 004; PROTOCOL-TOKENSPEED.md 3.1,
 * 11.2): "role", "world_size", "dp_size", the global "engine_rank",
 * "rank_ip", "rank_port", a required "enable_mla_l1_5_cache" and the length
 * lists. Mapped onto the table's seed-001 fields: attention TP size =
 * world_size / dp_size, DP group = engine_rank / that, TP rank = engine_rank
 * % that, PP 1. rank_ip, rank_port and the layout keys are read by the
 * shared code (bootstrap_json.c). */
#include "proto/bootstrap_proto.h"

#include <string.h>

bool kvb__boot_reg_is_ts(json_t *root)
{
    return json_object_get(root, "world_size") != NULL &&
           json_object_get(root, "engine_rank") != NULL &&
           json_object_get(root, "attn_tp_size") == NULL;
}

kvb_status_t kvb__boot_reg_parse_ts(json_t *root, kvb__boot_reg_t *r, char *reason,
                                    size_t reason_len)
{
    int64_t world, dp, rank;
    json_t *v = json_object_get(root, "role");
    if (!json_is_string(v) || strcmp(json_string_value(v), "Prefill") != 0 ||
        json_string_length(v) != strlen("Prefill")) {
        kvb__boot_reason(reason, reason_len, "\"role\" must be \"Prefill\"");
        return KVB_ERR_PROTO;
    }
    if (!kvb__boot_get_intish(json_object_get(root, "world_size"), "world_size", 1,
                              KVB__BOOT_MAX_SIZE, &world, reason, reason_len) ||
        !kvb__boot_get_intish(json_object_get(root, "dp_size"), "dp_size", 1, KVB__BOOT_MAX_SIZE,
                              &dp, reason, reason_len) ||
        !kvb__boot_get_intish(json_object_get(root, "engine_rank"), "engine_rank", 0,
                              KVB__BOOT_MAX_SIZE - 1, &rank, reason, reason_len))
        return KVB_ERR_PROTO;
    if (world % dp != 0 || rank >= world) {
        kvb__boot_reason(reason, reason_len,
                         "world_size %lld, dp_size %lld, engine_rank %lld: world_size must be a "
                         "multiple of dp_size and engine_rank below it",
                         (long long)world, (long long)dp, (long long)rank);
        return KVB_ERR_PROTO;
    }
    /* TokenSpeed's server raises KeyError (500) without it (CN:107). */
    if (json_object_get(root, KVB__BOOT_KEY_MLA_L1_5) == NULL) {
        kvb__boot_reason(reason, reason_len, "missing key \"%s\" (TokenSpeed registration)",
                         KVB__BOOT_KEY_MLA_L1_5);
        return KVB_ERR_PROTO;
    }
    int64_t tp = world / dp;
    r->has_role = true;
    r->attn_tp_size = tp;
    r->attn_tp_rank = rank % tp;
    r->attn_dp_size = dp;
    r->attn_dp_rank = rank / tp;
    r->pp_size = 1;
    r->pp_rank = 0;
    r->system_dp_size = 1;
    r->system_dp_rank = 0;
    return KVB_OK;
}

kvb_status_t kvb__boot_parallel_info_parse_ts(const char *body, size_t len,
                                              kvb_bootstrap_parallel_info_t *info_p, char *reason,
                                              size_t reason_len)
{
    kvb_bootstrap_parallel_info_t info;
    int64_t world, dp;
    bool nomem = false, l15 = true;
    memset(&info, 0, sizeof(info));
    json_t *root = kvb__boot_load_object(body, len, "parallel info", reason, reason_len);
    if (root == NULL)
        return KVB_ERR_PROTO;
    if (json_object_get(root, "prefill_attn_tp_size") != NULL) {
        kvb__boot_reason(reason, reason_len, "not TokenSpeed's shape (prefill_attn_tp_size)");
        goto fail;
    }
    if (!kvb__boot_get_intish(json_object_get(root, "prefill_tp_size"), "prefill_tp_size", 1,
                              KVB__BOOT_MAX_SIZE, &world, reason, reason_len) ||
        !kvb__boot_get_intish(json_object_get(root, "prefill_dp_size"), "prefill_dp_size", 1,
                              KVB__BOOT_MAX_SIZE, &dp, reason, reason_len) ||
        !kvb__boot_valid_flag(json_object_get(root, KVB__BOOT_KEY_MLA_L1_5), KVB__BOOT_KEY_MLA_L1_5,
                              &l15, reason, reason_len))
        goto fail;
    if (world % dp != 0 || l15) {
        kvb__boot_reason(reason, reason_len,
                         l15 ? "enable_mla_l1_5_cache is true: kvbridge has no MLA L1.5 cache"
                             : "prefill_tp_size %lld is not a multiple of prefill_dp_size %lld",
                         (long long)world, (long long)dp);
        goto fail;
    }
    info.attn_tp_size = (int32_t)(world / dp);
    info.dp_size = (int32_t)dp;
    info.pp_size = 1;
    if (!kvb__boot_info_layout_parse(root, &info, &nomem, reason, reason_len))
        goto fail;
    json_decref(root);
    *info_p = info;
    return KVB_OK;
fail:
    json_decref(root);
    kvb_bootstrap_parallel_info_free(&info);
    return nomem ? KVB_ERR_NOMEM : KVB_ERR_PROTO;
}

bool kvb__boot_answer_is_ts(const char *body, size_t len)
{
    char reason[KVB__BOOT_REASON_MAX];
    json_t *root = kvb__boot_load_object(body, len, "parallel info", reason, sizeof(reason));
    if (root == NULL)
        return false;
    json_t *d = json_object_get(root, KVB__BOOT_KEY_DIALECT);
    bool ts = (json_is_string(d) && strcmp(json_string_value(d), KVB__BOOT_DIALECT_TS) == 0) ||
              (json_object_get(root, "prefill_tp_size") != NULL &&
               json_object_get(root, "prefill_attn_tp_size") == NULL &&
               json_object_get(root, "attn_tp_size") == NULL);
    json_decref(root);
    return ts;
}
