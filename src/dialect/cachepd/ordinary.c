/* A kvbridge rank's own CachePD contract, as TokenSpeed 0.1.1's ordinary
 * recipe (recipes/ordinary.py, plan.pack with one page per parent and
 * alignment 1) would describe the same cache (cachepd.h). The text is
 * written in TokenSpeed's order and then parsed, so the derived fields come
 * from the one validating constructor. */
#include "dialect/cachepd/cpd_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct ofield {
    char field[48], plane[48];
} ofield_t;

static int cmp_plane(const void *a, const void *b)
{
    const ofield_t *x = a, *y = b;
    int c = strcmp(x->plane, y->plane);
    return c ? c : strcmp(x->field, y->field);
}

static void put_fields(kvb__cpd_buf_t *b, const kvb__cpd_ordinary_t *m, const ofield_t *f, size_t n,
                       uint64_t payload, const uint64_t shape[3])
{
    uint64_t off = 0, per_plane = (m->num_lcm_blocks + 1) * payload;
    kvb__cpd_puts(b, "],\"planes\":[");
    for (size_t i = 0; i < n; i++, off += per_plane) {
        kvb__cpd_puts(b, i ? ",{\"plane_id\":" : "{\"plane_id\":");
        kvb__cpd_put_jstr(b, f[i].plane, strlen(f[i].plane));
        kvb__cpd_puts(b, ",\"bytes_per_lcm_block\":");
        kvb__cpd_put_u64(b, payload);
        kvb__cpd_puts(b, ",\"arena_offset_bytes\":");
        kvb__cpd_put_u64(b, off);
        kvb__cpd_puts(b, "}");
    }
    kvb__cpd_puts(b, "],\"fields\":[");
    for (size_t i = 0; i < n; i++) {
        kvb__cpd_puts(b, i ? ",{\"group_id\":\"full_attention\",\"field_id\":"
                           : "{\"group_id\":\"full_attention\",\"field_id\":");
        kvb__cpd_put_jstr(b, f[i].field, strlen(f[i].field));
        kvb__cpd_puts(b, ",\"plane_id\":");
        kvb__cpd_put_jstr(b, f[i].plane, strlen(f[i].plane));
        kvb__cpd_puts(b, ",\"shape\":[");
        for (int d = 0; d < 3; d++) {
            kvb__cpd_put_u64(b, shape[d]);
            kvb__cpd_puts(b, d < 2 ? "," : "]");
        }
        kvb__cpd_puts(b, ",\"dtype\":");
        kvb__cpd_put_jstr(b, kvb__cpd_dtype_name(m->dtype), strlen(kvb__cpd_dtype_name(m->dtype)));
        kvb__cpd_puts(b, ",\"field_offset_bytes\":0,\"page_stride_bytes\":");
        kvb__cpd_put_u64(b, payload);
        kvb__cpd_puts(b, "}");
    }
}

static void put_specs(kvb__cpd_buf_t *b, const kvb__cpd_ordinary_t *m, const ofield_t *f, size_t n)
{
    kvb__cpd_puts(b, "],\"resident_block_bytes\":null},\"group_specs\":[{\"group_id\":"
                     "\"full_attention\",\"retention\":\"full_history\",\"rows_per_page\":");
    kvb__cpd_put_u64(b, m->page_size);
    kvb__cpd_puts(b, ",\"entry_stride_tokens\":1,\"sliding_window_tokens\":null,\"replayable\":"
                     "false,\"family\":\"history\",\"transfer_policy\":\"full_suffix\","
                     "\"checkpoint_granularity\":null,\"shard_count\":");
    kvb__cpd_put_u64(b, m->shard_count > 1 ? m->shard_count : 1);
    kvb__cpd_puts(b, "}],\"transfer_schema\":{\"fields\":[");
    for (size_t i = 0; !m->mla && i < n; i++) {
        kvb__cpd_puts(b, i ? ",{\"field_id\":" : "{\"field_id\":");
        kvb__cpd_put_jstr(b, f[i].field, strlen(f[i].field));
        kvb__cpd_puts(b, ",\"partition\":{\"axis\":1,\"global_extent\":");
        kvb__cpd_put_u64(b, m->kv_heads);
        kvb__cpd_puts(b, ",\"global_parts\":[]}}");
    }
    kvb__cpd_puts(b, "]}}");
}

static bool sizes_ok(const kvb__cpd_ordinary_t *m)
{
    return m->num_layers >= 1 && m->num_layers <= KVB__CPD_MAX_FIELDS / 2 && m->head_dim >= 1 &&
           m->tp_size >= 1 && m->tp_size <= KVB__CPD_MAX_TP && m->page_size >= 1 &&
           (m->mla || m->kv_heads >= 1) && kvb__cpd_dtype_bytes(m->dtype) != 0 &&
           m->num_lcm_blocks >= 1 && m->num_lcm_blocks < (1ull << 31) &&
           m->shard_count <= KVB__CPD_MAX_TP && (m->mla || m->shard_count <= 1);
}

kvb_status_t kvb__cpd_contract_ordinary(const kvb__cpd_ordinary_t *m, kvb__frames_err_t *err,
                                        kvb__cpd_contract_t *c_p)
{
    if (!sizes_ok(m)) {
        kvb__cpd_fail(err, false, 0, "CachePD contract: ordinary layout sizes out of range");
        return KVB_ERR_INVALID;
    }
    uint64_t heads = m->mla ? 1 : (m->kv_heads / m->tp_size ? m->kv_heads / m->tp_size : 1);
    uint64_t shape[3] = {m->page_size, heads, m->head_dim}, payload;
    if (!kvb__mul_u64(shape[0] * shape[1], shape[2] * kvb__cpd_dtype_bytes(m->dtype), &payload)) {
        kvb__cpd_fail(err, false, 0, "CachePD contract: ordinary page size overflows");
        return KVB_ERR_INVALID;
    }
    size_t n = m->mla ? m->num_layers : 2u * m->num_layers;
    uint64_t lcm, arena;
    if (!kvb__mul_u64(payload, n, &lcm) || !kvb__mul_u64(lcm, m->num_lcm_blocks + 1, &arena) ||
        arena > INT64_MAX) {
        kvb__cpd_fail(err, false, 0, "CachePD contract: ordinary arena size overflows");
        return KVB_ERR_INVALID;
    }
    ofield_t *f = calloc(n, sizeof(*f));
    if (f == NULL)
        return KVB_ERR_NOMEM;
    for (uint32_t i = 0; i < m->num_layers; i++) {
        if (m->mla) {
            snprintf(f[i].field, sizeof(f[i].field), "layer.%u.latent_kv", i);
            snprintf(f[i].plane, sizeof(f[i].plane), "slot.%u", i);
            continue;
        }
        for (int kv = 0; kv < 2; kv++) {
            snprintf(f[2 * i + kv].field, sizeof(f[0].field), "layer.%u.%s", i, kv ? "v" : "k");
            snprintf(f[2 * i + kv].plane, sizeof(f[0].plane), "unit.%u.%s", i, kv ? "v" : "k");
        }
    }
    qsort(f, n, sizeof(*f), cmp_plane); /* TokenSpeed orders planes and fields by id */
    kvb__cpd_buf_t b = {0};
    kvb__cpd_puts(&b, "{\"plan\":{\"prefix_granularity\":");
    kvb__cpd_put_u64(&b, m->page_size);
    kvb__cpd_puts(&b, ",\"lcm_block_bytes\":");
    kvb__cpd_put_u64(&b, lcm);
    kvb__cpd_puts(&b, ",\"num_lcm_blocks\":");
    kvb__cpd_put_u64(&b, m->num_lcm_blocks);
    kvb__cpd_puts(&b, ",\"groups\":[{\"group_id\":\"full_attention\","
                      "\"cache_blocks_per_lcm_block\":1,\"page_count\":");
    kvb__cpd_put_u64(&b, m->num_lcm_blocks + 1);
    kvb__cpd_puts(&b, "}");
    put_fields(&b, m, f, n, payload, shape);
    put_specs(&b, m, f, n);
    free(f);
    char *text;
    size_t len;
    KVB__FRAMES_TRY(kvb__cpd_buf_take(&b, &text, &len));
    kvb_status_t st = kvb__cpd_contract_parse((const uint8_t *)text, len, err, c_p);
    free(text);
    return st == KVB_ERR_PROTO ? KVB_ERR_INVALID : st;
}
