/* `kvbridge plan`: print the route and fragments of every decode rank for a
 * prefill/decode layout pair. */
#include <kvbridge/plan.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tools.h"

static void plan_usage(FILE *out)
{
    fprintf(out,
            "usage: kvbridge plan --model PRESET | --layers N --kv-heads H --head-dim D\n"
            "                     [--dtype-bytes B] [--mla]\n"
            "                     --prefill-tp N --decode-tp M [--prefill-pp K] [--page-size P]\n"
            "                     [--json FILE]\n\n"
            "Prints, for every decode rank, its sources (prefill attention TP ranks, real or\n"
            "dummy), required_dst_info_num, required_prefill_response_num and the fragments\n"
            "(offsets within one token's row of one layer buffer) per source and buffer.\n"
            "--json FILE writes the same as JSON ('-' = stdout). Presets:");
    for (const char *const *n = kvb_plan_model_preset_names(); *n != NULL; n++)
        fprintf(out, " %s", *n);
    fprintf(out, "\n");
}

static int write_json(FILE *f, kvb_plan_h plan, uint32_t dtp)
{
    size_t maxf = kvb_plan_max_fragments(plan);
    kvb_plan_fragment_t *fr = calloc(maxf ? maxf : 1, sizeof(*fr));
    if (fr == NULL)
        return -1;
    fprintf(f, "{\"routes\": [");
    for (uint32_t d = 0; d < dtp; d++) {
        kvb_plan_route_t r;
        if (kvb_plan_route(plan, d, &r) != KVB_OK)
            goto fail;
        fprintf(f, "%s\n  {\"decode_rank\": %u, \"sources\": [", d ? "," : "", d);
        for (uint32_t k = 0; k < r.num_sources; k++) {
            const kvb_plan_source_t *s = &r.sources[k];
            size_t n = 0;
            if (kvb_plan_fragments(plan, s->prefill_rank, d, fr, maxf, &n) != KVB_OK)
                goto fail;
            fprintf(f,
                    "%s\n    {\"prefill_rank\": %u, \"dummy\": %s, \"required_dst_info_num\": %u, "
                    "\"fragments\": [",
                    k ? "," : "", s->prefill_rank, s->dummy ? "true" : "false",
                    s->required_dst_info_num);
            for (size_t i = 0; i < n; i++)
                fprintf(f,
                        "%s{\"buffer\": \"%s\", \"src_offset\": %llu, \"dst_offset\": %llu, "
                        "\"bytes\": %llu}",
                        i ? ", " : "", kvb_plan_buffer_name(fr[i].buffer),
                        (unsigned long long)fr[i].src_offset, (unsigned long long)fr[i].dst_offset,
                        (unsigned long long)fr[i].bytes);
            fprintf(f, "]}");
        }
        fprintf(f, "],\n   \"required_prefill_response_num\": %u}",
                r.required_prefill_response_num);
    }
    fprintf(f, "\n]}\n");
    free(fr);
    return 0;
fail:
    free(fr);
    return -1;
}

static int write_text(FILE *f, kvb_plan_h plan, uint32_t dtp)
{
    size_t maxf = kvb_plan_max_fragments(plan);
    kvb_plan_fragment_t *fr = calloc(maxf ? maxf : 1, sizeof(*fr));
    if (fr == NULL)
        return -1;
    for (uint32_t d = 0; d < dtp; d++) {
        kvb_plan_route_t r;
        if (kvb_plan_route(plan, d, &r) != KVB_OK)
            goto fail;
        fprintf(f, "decode rank %u: %u source(s), required_prefill_response_num=%u\n", d,
                r.num_sources, r.required_prefill_response_num);
        for (uint32_t k = 0; k < r.num_sources; k++) {
            const kvb_plan_source_t *s = &r.sources[k];
            size_t n = 0;
            if (kvb_plan_fragments(plan, s->prefill_rank, d, fr, maxf, &n) != KVB_OK)
                goto fail;
            fprintf(f, "  prefill rank %u: %s, required_dst_info_num=%u\n", s->prefill_rank,
                    s->dummy ? "dummy" : "real", s->required_dst_info_num);
            for (size_t i = 0; i < n; i++)
                fprintf(f,
                        "    %-7s src_offset=%llu dst_offset=%llu bytes=%llu (rows: prefill %llu "
                        "B, decode %llu B, %u per item)\n",
                        kvb_plan_buffer_name(fr[i].buffer), (unsigned long long)fr[i].src_offset,
                        (unsigned long long)fr[i].dst_offset, (unsigned long long)fr[i].bytes,
                        (unsigned long long)fr[i].src_row_bytes,
                        (unsigned long long)fr[i].dst_row_bytes, fr[i].rows_per_item);
        }
    }
    free(fr);
    return 0;
fail:
    free(fr);
    return -1;
}

int kvb_cmd_plan(int argc, char **argv)
{
    const char *preset = NULL, *json = NULL;
    long long ptp = 0, dtp = 0, ppp = 1, page = 16, layers = 0, heads = 0, hdim = 0, dbytes = 2;
    int mla = 0, custom = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        bool ok = true;
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            plan_usage(stdout);
            return 0;
        } else if (strcmp(a, "--mla") == 0) {
            mla = 1;
            custom = 1;
            continue;
        }
        if (v == NULL) {
            fprintf(stderr, "kvbridge plan: %s needs a value (or unknown option)\n", a);
            plan_usage(stderr);
            return 2;
        }
        i++;
        if (strcmp(a, "--model") == 0)
            preset = v;
        else if (strcmp(a, "--json") == 0)
            json = v;
        else if (strcmp(a, "--prefill-tp") == 0)
            ok = kvb_tool_parse_int(a, v, 1, KVB_PLAN_MAX_TP, &ptp);
        else if (strcmp(a, "--decode-tp") == 0)
            ok = kvb_tool_parse_int(a, v, 1, KVB_PLAN_MAX_TP, &dtp);
        else if (strcmp(a, "--prefill-pp") == 0)
            ok = kvb_tool_parse_int(a, v, 1, KVB_PLAN_MAX_LAYERS, &ppp);
        else if (strcmp(a, "--page-size") == 0)
            ok = kvb_tool_parse_int(a, v, 1, 1 << 20, &page);
        else if (strcmp(a, "--layers") == 0)
            custom = 1, ok = kvb_tool_parse_int(a, v, 1, KVB_PLAN_MAX_LAYERS, &layers);
        else if (strcmp(a, "--kv-heads") == 0)
            custom = 1, ok = kvb_tool_parse_int(a, v, 1, 1 << 20, &heads);
        else if (strcmp(a, "--head-dim") == 0)
            custom = 1, ok = kvb_tool_parse_int(a, v, 1, 1 << 24, &hdim);
        else if (strcmp(a, "--dtype-bytes") == 0)
            custom = 1, ok = kvb_tool_parse_int(a, v, 1, 64, &dbytes);
        else {
            fprintf(stderr, "kvbridge plan: unknown option %s\n", a);
            plan_usage(stderr);
            return 2;
        }
        if (!ok)
            return 2;
    }
    kvb_plan_model_t model;
    if (preset != NULL) {
        if (kvb_plan_model_preset(preset, &model) != KVB_OK) {
            fprintf(stderr, "kvbridge plan: unknown model preset '%s'\n", preset);
            plan_usage(stderr);
            return 2;
        }
    } else {
        memset(&model, 0, sizeof(model));
        model.name = "custom";
    }
    /* explicit dimensions override the preset's */
    if (layers)
        model.num_layers = (uint32_t)layers;
    if (heads)
        model.kv_heads = (uint32_t)heads;
    if (hdim)
        model.head_dim = (uint32_t)hdim;
    if (custom)
        model.dtype_bytes = (uint32_t)dbytes;
    if (mla) {
        model.attn = KVB_PLAN_MLA;
        model.kv_heads = 1;
    }
    if (preset == NULL && (!layers || !hdim || (!mla && !heads))) {
        fprintf(stderr, "kvbridge plan: give --model or --layers, --head-dim and --kv-heads "
                        "(or --mla)\n");
        return 2;
    }
    if (ptp == 0 || dtp == 0) {
        fprintf(stderr, "kvbridge plan: --prefill-tp and --decode-tp are required\n");
        return 2;
    }
    kvb_plan_layout_t pl, dl;
    kvb_plan_layout_from_model(&model, (uint32_t)ptp, 0, (uint32_t)ppp, 0, (uint32_t)page, &pl);
    kvb_plan_layout_from_model(&model, (uint32_t)dtp, 0, 1, 0, (uint32_t)page, &dl);
    kvb_plan_h plan;
    if (kvb_plan_create(&pl, &dl, &plan) != KVB_OK) {
        fprintf(stderr, "kvbridge plan: cannot plan this layout: %s\n", kvb_plan_last_error());
        return 1;
    }
    printf("model %s: %s, %u layers, %u KV heads × %u × %u B; prefill TP %lld PP %lld → decode "
           "TP %lld, page size %lld\n",
           model.name, model.attn == KVB_PLAN_MLA ? "MLA" : "MHA/GQA", model.num_layers,
           model.kv_heads, model.head_dim, model.dtype_bytes, ptp, ppp, dtp, page);
    int rc = write_text(stdout, plan, (uint32_t)dtp);
    if (rc == 0 && json != NULL) {
        FILE *f = strcmp(json, "-") == 0 ? stdout : fopen(json, "w");
        if (f == NULL) {
            fprintf(stderr, "kvbridge plan: cannot write %s\n", json);
            rc = -1;
        } else {
            rc = write_json(f, plan, (uint32_t)dtp);
            if (f != stdout && fclose(f) != 0)
                rc = -1;
        }
    }
    if (rc != 0)
        fprintf(stderr, "kvbridge plan: %s\n", kvb_plan_last_error());
    kvb_plan_destroy(plan);
    return rc == 0 ? 0 : 1;
}
