/* Planner error cases: unsupported or inconsistent geometry and bad chunk
 * input give KVB_ERR_INVALID with a message naming the field and both
 * values, and never a plan or blocks. Also the seed-compatible routes. */
#include <kvbridge/plan.h>

#include <stdint.h>
#include <string.h>

#include "kvb_test.h"

static void base(kvb_plan_layout_t *l, uint32_t tp)
{
    kvb_plan_model_t m;
    CHECK(kvb_plan_model_preset("llama3-8b", &m) == KVB_OK);
    kvb_plan_layout_from_model(&m, tp, 0, 1, 0, 16, l);
}

static void expect_fail(const kvb_plan_layout_t *p, const kvb_plan_layout_t *d, const char *a,
                        const char *b)
{
    kvb_plan_h plan = (kvb_plan_h)(uintptr_t)1;
    CHECK_EQ(kvb_plan_create(p, d, &plan), KVB_ERR_INVALID);
    CHECK(plan == (kvb_plan_h)(uintptr_t)1); /* output untouched */
    CHECK_STR_CONTAINS(kvb_plan_last_error(), a);
    if (b)
        CHECK_STR_CONTAINS(kvb_plan_last_error(), b);
}

int main(void)
{
    kvb_plan_layout_t p, d;
    kvb_plan_model_t m;
    CHECK_EQ(kvb_plan_model_preset("nope", &m), KVB_ERR_NOT_FOUND);
    CHECK(kvb_plan_model_preset("deepseek-v3", &m) == KVB_OK && m.attn == KVB_PLAN_MLA &&
          m.num_layers == 61 && m.head_dim == 576);

    /* heads the TP size cannot split */
    base(&p, 3);
    base(&d, 2);
    expect_fail(&p, &d, "kv_heads=8", "tp_size=3");
    /* page sizes, layers, attention kinds differ */
    base(&p, 2);
    base(&d, 2);
    d.field_mask |= KVB_PLAN_LAYOUT_ORDER;
    d.kv_order = (kvb_plan_order_t)7;
    expect_fail(&p, &d, "decode kv_order=7", NULL);
    base(&d, 2);
    p.field_mask |= KVB_PLAN_LAYOUT_ORDER;
    d.field_mask |= KVB_PLAN_LAYOUT_ORDER;
    p.elem_bytes = 2;
    d.elem_bytes = 1;
    expect_fail(&p, &d, "elem_bytes differs: prefill=2 decode=1", NULL);
    d.elem_bytes = 3;
    expect_fail(&p, &d, "elem_bytes differs: prefill=2 decode=3", NULL);
    p.elem_bytes = 3;
    expect_fail(&p, &d, "unit_len=256 is not a multiple of elem_bytes", NULL);
    base(&p, 2);
    base(&d, 2);
    d.num_layers = 31;
    expect_fail(&p, &d, "num_layers differs: prefill=32 decode=31", NULL);
    base(&d, 2);
    d.attn = KVB_PLAN_MLA;
    expect_fail(&p, &d, "attn differs: prefill=mha decode=mla", NULL);
    /* unit sizes differ (head_dim) */
    base(&d, 2);
    d.head_bytes = 128;
    expect_fail(&p, &d, "unit_len differs: prefill=256 decode=128", NULL);
    /* generic form: item not a multiple of unit */
    base(&d, 2);
    d.field_mask |= KVB_PLAN_LAYOUT_KV_GEOM;
    d.kv_geom.item_len = 16 * 1000;
    d.kv_geom.unit_len = 256;
    d.kv_geom.axis = KVB_PLAN_AXIS_KV_HEAD;
    expect_fail(&p, &d, "row bytes=1000", "unit_len=256");
    /* generic form: units that do not cover the heads */
    d.kv_geom.item_len = 16 * 256;
    d.kv_geom.global_units = 8;
    expect_fail(&p, &d, "do not cover", "8 global units");
    /* decode with PP, bad ranks */
    base(&d, 2);
    d.pp_size = 2;
    expect_fail(&p, &d, "decode must hold all layers", "pp_size=2");
    base(&d, 2);
    d.tp_rank = 2;
    expect_fail(&p, &d, "tp_rank=2", "tp_size=2");
    p.pp_size = 40;
    base(&d, 2);
    expect_fail(&p, &d, "pp_size=40", "num_layers=32");
    /* extras must match */
    base(&p, 2);
    p.field_mask |= KVB_PLAN_LAYOUT_DRAFT;
    p.draft_layers = 1;
    p.draft_kv_heads = 8;
    p.draft_head_bytes = 256;
    expect_fail(&p, &d, "draft_layers differs: prefill=1 decode=0", NULL);
    uint64_t a1 = 8, a2 = 9;
    base(&p, 2);
    p.field_mask |= KVB_PLAN_LAYOUT_AUX;
    p.num_aux = 1;
    p.aux_item_lens = &a1;
    d.field_mask |= KVB_PLAN_LAYOUT_AUX;
    d.num_aux = 1;
    d.aux_item_lens = &a2;
    expect_fail(&p, &d, "aux[0]", "prefill=8 decode=9");

    /* seed routes: equal, decode larger, decode smaller (MHA all real,
     * MLA first real and the others dummy), GQA replicas */
    kvb_plan_h plan;
    kvb_plan_route_t r;
    base(&p, 2);
    base(&d, 8);
    CHECK(kvb_plan_create(&p, &d, &plan) == KVB_OK);
    CHECK(kvb_plan_route(plan, 5, &r) == KVB_OK);
    CHECK_EQ(r.num_sources, 1);
    CHECK_EQ(r.sources[0].prefill_rank, 1);
    CHECK_EQ(r.sources[0].required_dst_info_num, 4);
    CHECK_EQ(r.required_prefill_response_num, 1);
    CHECK_EQ(kvb_plan_route(plan, 8, &r), KVB_ERR_INVALID);
    CHECK_STR_CONTAINS(kvb_plan_last_error(), "decode_rank=8");

    /* chunk errors leave the output unchanged */
    uint64_t sa[64], da[64];
    for (int i = 0; i < 64; i++) {
        sa[i] = 0x100000000ull * (i + 1);
        da[i] = 0x10000000000ull * (i + 1);
    }
    kvb_plan_buffers_t sb = {.kv = sa}, db = {.kv = da};
    int32_t sp[3] = {0, 1, 2}, dp[3] = {5, 6, -1};
    kvb_plan_chunk_t ch;
    memset(&ch, 0, sizeof(ch));
    ch.src_pages = sp;
    ch.dst_pages = dp;
    ch.num_pages = 3;
    kvb_plan_blocks_t out;
    kvb_plan_blocks_init(&out);
    CHECK_EQ(kvb_plan_blocks(plan, 1, 5, &sb, &db, &ch, &out), KVB_ERR_INVALID);
    CHECK_STR_CONTAINS(kvb_plan_last_error(), "dst_pages[2]=-1");
    CHECK_EQ(out.count, 0);
    dp[2] = 7;
    ch.field_mask = KVB_PLAN_CHUNK_PREFIX;
    ch.prefix_tokens = 8; /* ends mid-page: rows 8..15 of page 0, then pages 1, 2 */
    CHECK(kvb_plan_blocks(plan, 1, 5, &sb, &db, &ch, &out) == KVB_OK);
    CHECK_EQ(out.count, (8 + 2 * 16) * 32 * 2);
    CHECK_EQ(out.blocks[0].src, sa[0] + 8 * 1024 + 256);
    CHECK_EQ(out.blocks[0].dst, da[0] + 5 * 16 * 256 + 8 * 256);
    out.count = 0;
    out.bytes = 0;
    ch.prefix_tokens = 16; /* skips page 0 */
    CHECK(kvb_plan_blocks(plan, 1, 5, &sb, &db, &ch, &out) == KVB_OK);
    /* pages 1,2 → 6,7 consecutive; fragment is 1 head of 4 → per row:
     * 2 pages × 16 rows × 32 layers × 2 */
    CHECK_EQ(out.count, 2 * 16 * 32 * 2);
    CHECK_EQ(out.blocks[0].len, 256);
    CHECK_EQ(out.blocks[0].src, sa[0] + 1 * 16 * 1024 + 256);
    CHECK_EQ(out.blocks[0].dst, da[0] + 6 * 16 * 256);
    /* fixed array too small: error, nothing appended */
    kvb_block_t small[4];
    kvb_plan_blocks_t fx = {.blocks = small, .capacity = 4, .fixed = 1};
    CHECK_EQ(kvb_plan_blocks(plan, 1, 5, &sb, &db, &ch, &fx), KVB_ERR_INVALID);
    CHECK_STR_CONTAINS(kvb_plan_last_error(), "capacity=4");
    CHECK_EQ(fx.count, 0);
    /* address overflow */
    sa[3] = UINT64_MAX - 100;
    out.count = 0;
    CHECK_EQ(kvb_plan_blocks(plan, 1, 5, &sb, &db, &ch, &out), KVB_ERR_INVALID);
    CHECK_STR_CONTAINS(kvb_plan_last_error(), "overflows");
    CHECK_EQ(out.count, 0);
    kvb_plan_blocks_free(&out);
    kvb_plan_destroy(plan);

    base(&p, 8);
    base(&d, 2);
    CHECK(kvb_plan_create(&p, &d, &plan) == KVB_OK);
    CHECK(kvb_plan_route(plan, 1, &r) == KVB_OK);
    CHECK_EQ(r.num_sources, 4);
    CHECK_EQ(r.sources[0].prefill_rank, 4);
    CHECK_EQ(r.sources[3].dummy, 0);
    CHECK_EQ(r.required_prefill_response_num, 4);
    kvb_plan_destroy(plan);

    CHECK(kvb_plan_model_preset("deepseek-v3", &m) == KVB_OK);
    kvb_plan_layout_from_model(&m, 8, 0, 2, 1, 64, &p);
    kvb_plan_layout_from_model(&m, 2, 0, 1, 0, 64, &d);
    CHECK(kvb_plan_create(&p, &d, &plan) == KVB_OK);
    CHECK(kvb_plan_route(plan, 1, &r) == KVB_OK);
    CHECK_EQ(r.num_sources, 4);
    CHECK_EQ(r.sources[0].prefill_rank, 4);
    CHECK_EQ(r.sources[0].dummy, 0);
    CHECK_EQ(r.sources[1].dummy, 1);
    CHECK_EQ(r.sources[3].dummy, 1);
    CHECK_EQ(r.required_prefill_response_num, 2); /* 1 real × prefill PP 2 */
    kvb_plan_destroy(plan);

    /* GQA: 8 heads over prefill TP 16 → one of each pair sends */
    base(&p, 16);
    base(&d, 8);
    CHECK(kvb_plan_create(&p, &d, &plan) == KVB_OK);
    CHECK(kvb_plan_route(plan, 3, &r) == KVB_OK);
    CHECK_EQ(r.num_sources, 2);
    CHECK_EQ(r.sources[0].prefill_rank, 6);
    CHECK_EQ(r.sources[0].dummy, 0);
    CHECK_EQ(r.sources[1].prefill_rank, 7);
    CHECK_EQ(r.sources[1].dummy, 1);
    CHECK_EQ(r.required_prefill_response_num, 1);
    kvb_plan_destroy(plan);
    TEST_PASS("plan errors and seed routes");
    return 0;
}
