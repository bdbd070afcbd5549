/* CachePD golden replay (src/dialect/cachepd/; tests/conformance/
 * tokenspeed_cachepd/, recorded from TokenSpeed 0.1.1's own code by
 * scripts/record-cachepd.sh).
 *
 * Per golden file, by "kind":
 * - contract: parses, gives TokenSpeed's arena size, virtual block bounds,
 *   field pairing order, page-0 offsets and payloads, and re-encodes byte for
 *   byte; malformed variants (cut short, unknown and missing keys,
 *   `replayable` removed, offsets outside the slab, overflowing strides,
 *   huge counts, bad types) are refused with a reason naming the problem;
 * - manifest: parses, re-encodes byte for byte, validates against its
 *   contract; variants break each of TokenSpeed's rules;
 * - registration / request / status: decode to the recorded fields,
 *   re-encode to the same frames; variants (a frame short, one extra, wrong
 *   widths, non-canonical or huge decimals, a bad contract or manifest) are
 *   refused, with the room when it could be read;
 * - bootstrap_put / bootstrap_parallel_info / bootstrap_rank_addr: parse to
 *   the recorded reading and re-encode byte for byte; kvbridge's server state
 *   after the recorded PUTs answers exactly TokenSpeed's server's body and
 *   refuses incompatible ranks;
 * - plan: TokenSpeed's decode routes (sources, fragments, owner filters,
 *   dummies), every prefill registration's outcome, and every copy list,
 *   expanded to byte spans, equal kvbridge's planner's, span for span.
 *
 * Usage: test_cachepd_codec CORPUS_DIR */
#include "dialect/cachepd/cachepd.h"
#include "kvb_test.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *g_file;
static const char *g_dir;
static int g_files, g_variants, g_ordinary;

#define FAILF(...)                                                                                 \
    do {                                                                                           \
        fprintf(stderr, "%s: ", g_file);                                                           \
        fprintf(stderr, __VA_ARGS__);                                                              \
        fputc('\n', stderr);                                                                       \
        exit(1);                                                                                   \
    } while (0)

/* ------------------------------------------------------------------ helpers */

static json_t *load_rel(const char *name)
{
    char path[4096];
    json_error_t je;
    snprintf(path, sizeof(path), "%s/%s.json", g_dir, name);
    json_t *o = json_load_file(path, 0, &je);
    if (o == NULL)
        FAILF("cannot load %s: %s", path, je.text);
    return o;
}

static const char *jstr(json_t *o, const char *key)
{
    const char *s = json_string_value(json_object_get(o, key));
    if (s == NULL)
        FAILF("no string \"%s\"", key);
    return s;
}

static long long jint(json_t *o, const char *key)
{
    json_t *v = json_object_get(o, key);
    if (!json_is_integer(v))
        FAILF("no integer \"%s\"", key);
    return json_integer_value(v);
}

static void parse_contract_text(const char *text, kvb__cpd_contract_t *c)
{
    kvb__frames_err_t e;
    if (kvb__cpd_contract_parse((const uint8_t *)text, strlen(text), &e, c) != KVB_OK)
        FAILF("contract refused: %s", e.reason);
}

static void load_contract(const char *name, kvb__cpd_contract_t *c)
{
    json_t *o = load_rel(name);
    parse_contract_text(jstr(o, "body"), c);
    json_decref(o);
}

/* The text refused with KVB_ERR_PROTO and a reason containing want. */
static void expect_refusal(kvb_status_t st, const kvb__frames_err_t *e, const char *want,
                           const char *variant)
{
    g_variants++;
    if (st != KVB_ERR_PROTO)
        FAILF("variant \"%s\": status %d, expected a refusal", variant, st);
    if (want != NULL && strstr(e->reason, want) == NULL)
        FAILF("variant \"%s\": reason \"%s\" lacks \"%s\"", variant, e->reason, want);
    for (const char *c = e->reason; *c; c++)
        if ((unsigned char)*c < 0x20 || (unsigned char)*c > 0x7e)
            FAILF("variant \"%s\": reason not printable", variant);
}

/* ------------------------------------------------------------------ contract */

static void contract_variant(json_t *root, const char *variant, const char *want,
                             void (*edit)(json_t *))
{
    json_t *copy = json_deep_copy(root);
    edit(copy);
    char *text = json_dumps(copy, JSON_COMPACT | JSON_PRESERVE_ORDER);
    kvb__cpd_contract_t c;
    kvb__frames_err_t e;
    memset(&e, 0, sizeof(e));
    expect_refusal(kvb__cpd_contract_parse((const uint8_t *)text, strlen(text), &e, &c), &e, want,
                   variant);
    free(text);
    json_decref(copy);
}

static json_t *plan_of(json_t *r)
{
    return json_object_get(r, "plan");
}
static json_t *field0(json_t *r)
{
    return json_array_get(json_object_get(plan_of(r), "fields"), 0);
}
static json_t *spec0(json_t *r)
{
    return json_array_get(json_object_get(r, "group_specs"), 0);
}
static void ed_no_replayable(json_t *r)
{
    json_object_del(spec0(r), "replayable");
}
static void ed_unknown_field_key(json_t *r)
{
    json_object_set_new(field0(r), "extra", json_integer(1));
}
static void ed_missing_stride(json_t *r)
{
    json_object_del(field0(r), "page_stride_bytes");
}
static void ed_offset_outside(json_t *r)
{
    json_t *pl = json_array_get(json_object_get(plan_of(r), "planes"), 0);
    json_object_set_new(pl, "arena_offset_bytes", json_integer(1LL << 50));
}
static void ed_stride_overflow(json_t *r)
{
    json_object_set_new(field0(r), "page_stride_bytes", json_integer(INT64_MAX));
}
static void ed_pages_overflow(json_t *r)
{
    json_t *g = json_array_get(json_object_get(plan_of(r), "groups"), 0);
    json_object_set_new(g, "page_count", json_integer(INT64_MAX / 2));
}
static void ed_field_spill(json_t *r)
{
    json_object_set_new(
        field0(r), "field_offset_bytes",
        json_integer(json_integer_value(json_object_get(field0(r), "page_stride_bytes"))));
}
static void ed_huge_shape(json_t *r)
{
    json_t *sh = json_array();
    for (int i = 0; i < 9; i++)
        json_array_append_new(sh, json_integer(1));
    json_object_set_new(field0(r), "shape", sh);
}
static void ed_many_groups(json_t *r)
{
    json_t *g = json_object_get(plan_of(r), "groups");
    while (json_array_size(g) <= KVB__CPD_MAX_GROUPS)
        json_array_append_new(g, json_deep_copy(json_array_get(g, 0)));
}
static void ed_string_int(json_t *r)
{
    json_object_set_new(plan_of(r), "num_lcm_blocks", json_string("47"));
}
static void ed_bad_dtype(json_t *r)
{
    json_object_set_new(field0(r), "dtype", json_string("float4"));
}
static void ed_replayable_full(json_t *r)
{
    if (json_integer_value(json_object_get(spec0(r), "checkpoint_granularity")) == 0) {
        json_object_set_new(spec0(r), "replayable", json_true());
        json_object_set_new(spec0(r), "retention", json_string("full_history"));
    } else
        json_object_set_new(spec0(r), "family", json_string("history"));
}
static void ed_no_plan(json_t *r)
{
    json_object_del(r, "plan");
}
static void ed_dup_field(json_t *r)
{
    json_t *f = json_object_get(plan_of(r), "fields");
    json_array_append_new(f, json_deep_copy(json_array_get(f, 0)));
}
static void ed_unknown_plane(json_t *r)
{
    json_object_set_new(field0(r), "plane_id", json_string("no.such.plane"));
}
static void ed_bad_partition(json_t *r)
{
    json_t *sf = json_object_get(json_object_get(r, "transfer_schema"), "fields");
    json_t *pt = json_object_get(json_array_get(sf, 0), "partition");
    if (pt == NULL) { /* replicated-only contracts: name an unknown field */
        json_t *e = json_object(), *pp = json_object();
        json_object_set_new(pp, "axis", json_integer(0));
        json_object_set_new(pp, "global_extent", json_integer(1));
        json_object_set_new(pp, "global_parts", json_array());
        json_object_set_new(e, "field_id", json_string("layer.999.k"));
        json_object_set_new(e, "partition", pp);
        json_array_append_new(sf, e);
        return;
    }
    json_object_set_new(pt, "axis", json_integer(5));
}
static void ed_unknown_top(json_t *r)
{
    json_object_set_new(r, "future_key", json_integer(1));
}

static void contract_variants(const char *body)
{
    json_error_t je;
    json_t *root = json_loads(body, 0, &je);
    kvb__cpd_contract_t c;
    kvb__frames_err_t e;
    expect_refusal(kvb__cpd_contract_parse((const uint8_t *)body, strlen(body) / 2, &e, &c), &e,
                   "invalid cache transfer contract JSON", "cut in half");
    expect_refusal(kvb__cpd_contract_parse((const uint8_t *)body, 0, &e, &c), &e, "1..262144",
                   "empty");
    contract_variant(root, "no replayable", "replayable", ed_no_replayable);
    contract_variant(root, "unknown field key", "unknown key \"extra\"", ed_unknown_field_key);
    contract_variant(root, "missing stride", "missing key \"page_stride_bytes\"",
                     ed_missing_stride);
    contract_variant(root, "plane outside arena", "outside the", ed_offset_outside);
    contract_variant(root, "stride overflow", "stride", ed_stride_overflow);
    contract_variant(root, "page count overflow", "outside the slab", ed_pages_overflow);
    contract_variant(root, "field spills its page", "exceed its page stride", ed_field_spill);
    contract_variant(root, "9-dim shape", "more than 8", ed_huge_shape);
    contract_variant(root, "65 groups", "more than 64", ed_many_groups);
    contract_variant(root, "string integer", "not an integer", ed_string_int);
    contract_variant(root, "dtype", "unsupported cache dtype", ed_bad_dtype);
    contract_variant(root, "spec rule", "group_specs[0]", ed_replayable_full);
    contract_variant(root, "no plan", "missing key \"plan\"", ed_no_plan);
    contract_variant(root, "duplicate field", "duplicate", ed_dup_field);
    contract_variant(root, "unknown plane", "unknown plane", ed_unknown_plane);
    contract_variant(root, "partition", "field", ed_bad_partition);
    /* Unknown top-level keys are ignored (TokenSpeed too) and dropped from
     * the canonical form. */
    json_t *copy = json_deep_copy(root);
    ed_unknown_top(copy);
    char *text = json_dumps(copy, JSON_COMPACT | JSON_PRESERVE_ORDER), *wire;
    size_t n;
    if (kvb__cpd_contract_parse((const uint8_t *)text, strlen(text), &e, &c) != KVB_OK ||
        kvb__cpd_contract_encode(&c, &wire, &n) != KVB_OK || strcmp(wire, body) != 0)
        FAILF("an unknown top-level key is not ignored");
    free(wire);
    free(text);
    kvb__cpd_contract_free(&c);
    json_decref(copy);
    json_decref(root);
}

/* The golden contracts of ordinary MHA/GQA/MLA cases, rebuilt from
 * kvbridge-side arguments (kvb__cpd_contract_ordinary): the same bytes as
 * TokenSpeed's recipe pipeline (the models of tests/interop/cachepd_record.py). */
static void check_ordinary(const char *name, const char *body)
{
    kvb__cpd_ordinary_t m = {.num_layers = 2,
                             .page_size = 16,
                             .dtype = KVB__CPD_BFLOAT16,
                             .tp_size = 1,
                             .kv_heads = 8,
                             .head_dim = 128};
    bool prefill = strstr(name, "_contract_prefill") != NULL;
    const char *tp = strstr(name, "_tp");
    if (strcmp(name, "worked_example_contract") == 0)
        m.num_lcm_blocks = 4095;
    else if (strstr(name, "_stage") != NULL || strstr(name, "_contract_") == NULL ||
             (strncmp(name, "mha_", 4) != 0 && strncmp(name, "gqa_", 4) != 0 &&
              strncmp(name, "mla_", 4) != 0))
        return; /* a narrowed PP stage, or a model of another recipe */
    else
        m.num_lcm_blocks = prefill ? 63 : 47;
    if (tp != NULL) {
        unsigned a = 1, b = 1;
        sscanf(tp, "_tp%u_tp%u", &a, &b);
        m.tp_size = prefill ? a : b;
    }
    if (strncmp(name, "gqa_", 4) == 0) {
        m.kv_heads = 2;
        m.head_dim = 64;
    }
    if (strncmp(name, "mla_", 4) == 0) {
        m.mla = true;
        m.head_dim = 576;
        m.shard_count = prefill && strstr(name, "_dcp2") ? 2 : 1;
    }
    kvb__cpd_contract_t c;
    kvb__frames_err_t e;
    char *wire;
    size_t n;
    if (kvb__cpd_contract_ordinary(&m, &e, &c) != KVB_OK)
        FAILF("ordinary contract refused: %s", e.reason);
    if (kvb__cpd_contract_encode(&c, &wire, &n) != KVB_OK || strcmp(wire, body) != 0)
        FAILF("kvbridge's ordinary contract differs from TokenSpeed's:\n%s\n%s", body, wire);
    free(wire);
    kvb__cpd_contract_free(&c);
    g_ordinary++;
}

static void replay_contract(json_t *root)
{
    const char *body = jstr(root, "body");
    json_t *ex = json_object_get(root, "expect"), *gs = json_object_get(ex, "groups"), *g;
    kvb__cpd_contract_t c;
    char *wire;
    size_t n, i;
    parse_contract_text(body, &c);
    if (kvb__cpd_contract_encode(&c, &wire, &n) != KVB_OK || n != strlen(body) ||
        memcmp(wire, body, n) != 0)
        FAILF("re-encoding differs:\n%s\n%s", body, wire);
    free(wire);
    if ((long long)c.arena_bytes != jint(ex, "arena_bytes"))
        FAILF("arena_bytes %llu", (unsigned long long)c.arena_bytes);
    if (json_array_size(gs) != c.nspecs)
        FAILF("group count");
    json_array_foreach(gs, i, g)
    {
        kvb__cpd_spec_t *s = &c.specs[i];
        if (strcmp(s->group_id, jstr(g, "group_id")) != 0 ||
            (long long)kvb__cpd_virtual_blocks(&c, (uint32_t)i) != jint(g, "virtual_blocks") ||
            json_array_size(json_object_get(g, "fields")) != s->nfields)
            FAILF("group %zu", i);
        for (uint32_t k = 0; k < s->nfields; k++)
            if (strcmp(c.fields[s->sorted_fields[k]].field_id,
                       json_string_value(json_array_get(json_object_get(g, "fields"), k))) != 0)
                FAILF("group %zu field order at %u", i, k);
    }
    for (uint32_t f = 0; f < c.nfields; f++) {
        json_t *p0 = json_object_get(json_object_get(ex, "page0"), c.fields[f].field_id);
        json_t *pl = json_object_get(json_object_get(ex, "payload"), c.fields[f].field_id);
        if ((long long)c.fields[f].page0 != json_integer_value(p0) ||
            (long long)c.fields[f].payload != json_integer_value(pl))
            FAILF("field %s: page0 %llu payload %llu", c.fields[f].field_id,
                  (unsigned long long)c.fields[f].page0, (unsigned long long)c.fields[f].payload);
    }
    if (strcmp(jstr(root, "case"), "worked_example_contract") == 0) {
        /* spec 11.1: 1821 bytes; page p of layer.1.v at 402653184 + p x 32768 */
        int32_t f = kvb__cpd_field_index(&c, "layer.1.v");
        if (strlen(body) != 1821 || f < 0 ||
            kvb__cpd_page_offset(&c, (uint32_t)f, 19) != 402653184ull + 19 * 32768ull)
            FAILF("spec 11.1's numbers");
    }
    contract_variants(body);
    check_ordinary(jstr(root, "case"), body);
    kvb__cpd_contract_free(&c);
}

/* ------------------------------------------------------------------ manifest */

static void manifest_variant(const char *body, const kvb__cpd_contract_t *c, const char *variant,
                             const char *want, const char *key, json_t *value)
{
    json_t *root = json_loads(body, 0, NULL);
    if (strcmp(key, "block0") == 0 || strcmp(key, "blockmax") == 0 || strcmp(key, "count") == 0) {
        json_t *ids =
            json_object_get(json_array_get(json_object_get(root, "groups"), 0), "block_ids");
        if (strcmp(key, "count") == 0)
            json_array_append_new(ids, json_integer(1));
        else
            json_array_set_new(ids, 0, value);
    } else if (strcmp(key, "order") == 0) {
        json_object_set_new(json_array_get(json_object_get(root, "groups"), 0), "group_id",
                            json_string("other"));
    } else if (value == NULL) {
        json_object_del(root, key);
    } else {
        json_object_set_new(root, key, value);
    }
    char *text = json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER);
    kvb__cpd_manifest_t m;
    kvb__frames_err_t e;
    kvb_status_t st = kvb__cpd_manifest_parse((const uint8_t *)text, strlen(text), &e, &m);
    if (st == KVB_OK) {
        st = kvb__cpd_manifest_validate(&m, c, &e);
        kvb__cpd_manifest_free(&m);
    }
    expect_refusal(st, &e, want, variant);
    free(text);
    json_decref(root);
}

static void replay_manifest(json_t *root)
{
    const char *body = jstr(root, "body");
    kvb__cpd_contract_t c;
    kvb__cpd_manifest_t m;
    kvb__frames_err_t e;
    char *wire;
    size_t n;
    load_contract(jstr(root, "contract"), &c);
    if (kvb__cpd_manifest_parse((const uint8_t *)body, strlen(body), &e, &m) != KVB_OK)
        FAILF("manifest refused: %s", e.reason);
    if (kvb__cpd_manifest_validate(&m, &c, &e) != KVB_OK)
        FAILF("manifest invalid: %s", e.reason);
    if (kvb__cpd_manifest_encode(&m, &wire, &n) != KVB_OK || strcmp(wire, body) != 0)
        FAILF("manifest re-encoding differs");
    json_t *ex = json_object_get(root, "expect");
    if (m.prefix_len != jint(ex, "prefix_len") || m.prompt_len != jint(ex, "prompt_len"))
        FAILF("prefix/prompt");
    free(wire);
    int64_t pg = (int64_t)c.prefix_granularity;
    manifest_variant(body, &c, "prefix >= prompt", "prefix_len < prompt_len", "prefix_len",
                     json_integer(m.prompt_len));
    manifest_variant(body, &c, "prefix unaligned", "not aligned", "prefix_len",
                     json_integer(pg > 1 ? 1 : -1));
    manifest_variant(body, &c, "block 0", "out-of-bounds", "block0", json_integer(0));
    manifest_variant(body, &c, "block past the pool", "out-of-bounds", "blockmax",
                     json_integer((json_int_t)kvb__cpd_virtual_blocks(&c, 0)));
    manifest_variant(body, &c, "count", "block count disagrees", "count", NULL);
    manifest_variant(body, &c, "group order", "group order", "order", NULL);
    manifest_variant(body, &c, "float prompt", "not an integer", "prompt_len", json_real(40.0));
    manifest_variant(body, &c, "no groups", "missing key \"groups\"", "groups", NULL);
    manifest_variant(body, &c, "string block", "not an integer", "block0", json_string("5"));
    expect_refusal(kvb__cpd_manifest_parse((const uint8_t *)body, strlen(body) - 1, &e, &m), &e,
                   "invalid Cache block manifest JSON", "cut short");
    kvb__cpd_manifest_free(&m);
    kvb__cpd_contract_free(&c);
}

/* ------------------------------------------------------------------ frames */

typedef struct msg {
    kvb__frame_t f[16];
    uint8_t *buf[16];
    size_t n;
} msg_t;

static void msg_load(msg_t *m, json_t *frames)
{
    size_t i;
    json_t *v;
    memset(m, 0, sizeof(*m));
    json_array_foreach(frames, i, v)
    {
        const char *s = json_string_value(v);
        size_t len = strlen(s + 2);
        uint8_t *b = malloc(len + 1);
        if (s[0] == 't') {
            memcpy(b, s + 2, len);
        } else {
            len /= 2;
            for (size_t k = 0; k < len; k++)
                sscanf(s + 2 + 2 * k, "%2hhx", &b[k]);
        }
        m->buf[i] = b;
        m->f[i] = (kvb__frame_t){b, len};
        m->n = i + 1;
    }
}

static void msg_free(msg_t *m)
{
    for (size_t i = 0; i < m->n; i++)
        free(m->buf[i]);
}

static void same_frames(const kvb__cpd_msg_t *out, const msg_t *m)
{
    if (out->n != m->n)
        FAILF("re-encode: %zu frames, recorded %zu", out->n, m->n);
    for (size_t i = 0; i < m->n; i++) {
        kvb__frame_t g = kvb__cpd_msg_frame(out, i);
        if (g.len != m->f[i].len || (g.len && memcmp(g.data, m->f[i].data, g.len) != 0))
            FAILF("re-encode: frame %zu differs", i);
    }
}

/* A copy of m with frame i replaced by text t (len n) or dropped (t NULL,
 * n 0 and drop) or one extra frame appended (i == m->n). */
static msg_t with_frame(const msg_t *m, size_t i, const void *t, size_t n, bool drop)
{
    msg_t v = *m;
    if (drop) {
        v.n = m->n - 1;
        return v;
    }
    if (i == m->n)
        v.n = m->n + 1;
    v.f[i] = (kvb__frame_t){t, n};
    return v;
}

typedef kvb_status_t (*decode_fn)(const msg_t *, kvb__frames_err_t *);

static void frame_variant(decode_fn fn, const msg_t *v, const char *variant, const char *want,
                          int room)
{
    kvb__frames_err_t e;
    memset(&e, 0, sizeof(e));
    expect_refusal(fn(v, &e), &e, want, variant);
    if (room >= 0 && (!e.has_room || e.room != (uint64_t)room))
        FAILF("variant \"%s\": room %d not reported", variant, room);
}

static kvb_status_t dec_reg(const msg_t *m, kvb__frames_err_t *e)
{
    kvb__cpd_reg_t r;
    kvb__cpd_contract_t c;
    kvb_status_t st = kvb__cpd_decode_registration(m->f, m->n, e, &r, &c);
    if (st == KVB_OK)
        kvb__cpd_contract_free(&c);
    return st;
}

static void replay_registration(json_t *root)
{
    msg_t m;
    kvb__cpd_reg_t r;
    kvb__cpd_contract_t c;
    kvb__frames_err_t e;
    kvb__cpd_msg_t out;
    json_t *ex = json_object_get(root, "expect");
    msg_load(&m, json_object_get(root, "frames"));
    if (!kvb__cpd_is_registration(m.f, m.n))
        FAILF("not classified as a CachePD registration");
    if (kvb__cpd_decode_registration(m.f, m.n, &e, &r, &c) != KVB_OK)
        FAILF("registration refused: %s", e.reason);
    if (r.endpoint_len != strlen(jstr(ex, "endpoint")) || r.port != jint(ex, "port") ||
        r.slab != (uint64_t)jint(ex, "slab") || r.decode_tp_size != jint(ex, "decode_tp_size") ||
        r.decode_tp_rank != jint(ex, "decode_tp_rank") ||
        r.session_id_len != strlen(jstr(ex, "session_id")))
        FAILF("registration fields");
    kvb__cpd_msg_init(&out);
    if (kvb__cpd_encode_registration(&r, &e, &out) != KVB_OK)
        FAILF("registration does not re-encode: %s", e.reason);
    same_frames(&out, &m);
    kvb__cpd_msg_free(&out);
    static const uint8_t zero8[8] = {0};
    char big[600];
    memset(big, 'a', sizeof(big));
    msg_t v;
    v = with_frame(&m, 0, NULL, 0, true);
    frame_variant(dec_reg, &v, "7 frames", "exactly 8 frames", -1);
    v = with_frame(&m, m.n, "x", 1, false);
    frame_variant(dec_reg, &v, "9 frames", "exactly 8 frames", -1);
    v = with_frame(&m, 0, "none", 4, false);
    frame_variant(dec_reg, &v, "tag", "exactly 8 frames", -1);
    v = with_frame(&m, 1, "\x80", 1, false);
    frame_variant(dec_reg, &v, "endpoint", "endpoint is invalid", -1);
    v = with_frame(&m, 3, big, 513, false);
    frame_variant(dec_reg, &v, "session 513 bytes", "session is invalid", -1);
    v = with_frame(&m, 2, "041234", 6, false);
    frame_variant(dec_reg, &v, "port leading zero", "port", -1);
    v = with_frame(&m, 2, "65536", 5, false);
    frame_variant(dec_reg, &v, "port 65536", "port", -1);
    v = with_frame(&m, 4, zero8, 7, false);
    frame_variant(dec_reg, &v, "pointer 7 bytes", "exactly 8 bytes", -1);
    v = with_frame(&m, 4, big, 9, false);
    frame_variant(dec_reg, &v, "pointer 9 bytes", "exactly 8 bytes", -1);
    v = with_frame(&m, 4, zero8, 8, false);
    frame_variant(dec_reg, &v, "null pointer", "must be nonzero", -1);
    v = with_frame(&m, 6, "1025", 4, false);
    frame_variant(dec_reg, &v, "tp size 1025", "decode_tp_size", -1);
    v = with_frame(&m, 6, "99999999999999999999999", 23, false);
    frame_variant(dec_reg, &v, "huge tp size", "decode_tp_size", -1);
    v = with_frame(&m, 7, "1024", 4, false);
    frame_variant(dec_reg, &v, "tp rank >= size", "decode_tp_rank", -1);
    v = with_frame(&m, 5, m.f[5].data, m.f[5].len / 2, false);
    frame_variant(dec_reg, &v, "contract cut", "CachePD contract", -1);
    /* August-2026 contract: no `replayable` (spec 13 row 29) */
    char *aug = strndup((const char *)m.f[5].data, m.f[5].len), *p;
    while ((p = strstr(aug, "\"replayable\":false,")) != NULL)
        memmove(p, p + 19, strlen(p + 19) + 1);
    v = with_frame(&m, 5, aug, strlen(aug), false);
    frame_variant(dec_reg, &v, "August contract", "replayable", -1);
    free(aug);
    kvb__cpd_contract_free(&c);
    msg_free(&m);
}

static kvb_status_t dec_req(const msg_t *m, kvb__frames_err_t *e)
{
    kvb__cpd_req_t r;
    kvb__cpd_manifest_t mf;
    kvb_status_t st = kvb__cpd_decode_request(m->f, m->n, e, &r, &mf);
    if (st == KVB_OK && !r.is_dummy)
        kvb__cpd_manifest_free(&mf);
    return st;
}

static void replay_request(json_t *root)
{
    msg_t m, v;
    kvb__cpd_req_t r;
    kvb__cpd_manifest_t mf;
    kvb__frames_err_t e;
    kvb__cpd_msg_t out;
    json_t *ex = json_object_get(root, "expect");
    msg_load(&m, json_object_get(root, "frames"));
    if (!kvb__cpd_is_request(m.f, m.n))
        FAILF("not classified as a CachePD request");
    if (kvb__cpd_decode_request(m.f, m.n, &e, &r, &mf) != KVB_OK)
        FAILF("request refused: %s", e.reason);
    if ((long long)r.room != jint(ex, "room") ||
        r.is_dummy != json_is_true(json_object_get(ex, "is_dummy")))
        FAILF("request fields");
    if (!r.is_dummy) {
        if (mf.prompt_len != jint(json_object_get(ex, "manifest"), "prompt_len"))
            FAILF("request manifest");
        kvb__cpd_manifest_free(&mf);
    }
    kvb__cpd_msg_init(&out);
    if (kvb__cpd_encode_request(&r, &e, &out) != KVB_OK)
        FAILF("request does not re-encode: %s", e.reason);
    same_frames(&out, &m);
    kvb__cpd_msg_free(&out);
    int room = (int)r.room;
    v = with_frame(&m, 0, NULL, 0, true);
    frame_variant(dec_req, &v, "2 frames", "exactly 3 frames", room);
    v = with_frame(&m, m.n, "x", 1, false);
    frame_variant(dec_req, &v, "4 frames", "exactly 3 frames", room);
    v = with_frame(&m, 0, "01234", 5, false);
    frame_variant(dec_req, &v, "room leading zero", "CachePD room", -1);
    v = with_frame(&m, 0, "9223372036854775808", 19, false);
    frame_variant(dec_req, &v, "room 2^63", "CachePD room", -1);
    v = with_frame(&m, 1, "", 0, false);
    frame_variant(dec_req, &v, "no session", "requires a Decode session", room);
    v = with_frame(&m, 2, "{\"groups\":", 10, false);
    frame_variant(dec_req, &v, "manifest cut", "manifest", room);
    v = with_frame(&m, 2, "[]", 2, false);
    frame_variant(dec_req, &v, "manifest not an object", "JSON object", room);
    msg_free(&m);
}

static kvb_status_t dec_status(const msg_t *m, kvb__frames_err_t *e)
{
    kvb__cpd_status_t s;
    return kvb__cpd_decode_status(m->f, m->n, e, &s);
}

static void replay_status(json_t *root)
{
    msg_t m, v;
    kvb__cpd_status_t s;
    kvb__frames_err_t e;
    kvb__cpd_msg_t out;
    json_t *ex = json_object_get(root, "expect"), *lp = json_object_get(ex, "logprob");
    msg_load(&m, json_object_get(root, "frames"));
    if (kvb__cpd_decode_status(m.f, m.n, &e, &s) != KVB_OK)
        FAILF("status refused: %s", e.reason);
    json_t *cands = json_object_get(ex, "candidates");
    if ((long long)s.room != jint(ex, "room") || s.status != jint(ex, "status") ||
        s.sender != jint(ex, "sender") || s.token != jint(ex, "token") ||
        (long long)s.cached_tokens != jint(ex, "cached_tokens") ||
        s.candidates.count != json_array_size(cands) || s.has_logprob != !json_is_null(lp) ||
        (s.has_logprob && s.logprob != json_real_value(lp)))
        FAILF("status fields");
    for (size_t i = 0; i < s.candidates.count; i++)
        if (kvb__i32_at(s.candidates, i) != json_integer_value(json_array_get(cands, i)))
            FAILF("candidate %zu", i);
    kvb__cpd_msg_init(&out);
    if (kvb__cpd_encode_status(&s, &e, &out) != KVB_OK)
        FAILF("status does not re-encode: %s", e.reason);
    same_frames(&out, &m);
    kvb__cpd_msg_free(&out);
    int room = (int)s.room;
    v = with_frame(&m, 0, NULL, 0, true);
    v = with_frame(&v, 0, NULL, 0, true);
    v = with_frame(&v, 0, NULL, 0, true);
    frame_variant(dec_status, &v, "4 frames", "5 to 7 frames", room);
    v = with_frame(&m, m.n, "x", 1, false);
    frame_variant(dec_status, &v, "8 frames", "5 to 7 frames", room);
    v = with_frame(&m, 1, "6", 1, false);
    frame_variant(dec_status, &v, "status 6", "frame 1 (status)", room);
    v = with_frame(&m, 1, "4 ", 2, false);
    frame_variant(dec_status, &v, "status with a space", "frame 1", room);
    v = with_frame(&m, 4, "abc", 3, false);
    frame_variant(dec_status, &v, "candidates 3 bytes", "multiple of 4", room);
    v = with_frame(&m, 5, "", 0, false);
    frame_variant(dec_status, &v, "cached tokens empty", "frame 5", room);
    v = with_frame(&m, 6, "abcdefg", 7, false);
    frame_variant(dec_status, &v, "logprob 7 bytes", "not 8", room);
    v = with_frame(&m, 0, "x", 1, false);
    frame_variant(dec_status, &v, "room", "frame 0", -1);
    msg_free(&m);
}

/* ------------------------------------------------------------------ bootstrap */

static void put_variant(const char *body, const char *variant, const char *want, const char *key,
                        json_t *value)
{
    json_t *o = json_loads(body, 0, NULL);
    if (strcmp(key, "drop_field") == 0) {
        json_t *st = json_array_get(json_object_get(o, "cache_fields_by_stage"), 0);
        json_array_remove(st, 0);
    } else if (value == NULL) {
        json_object_del(o, key);
    } else {
        json_object_set_new(o, key, value);
    }
    char *text = json_dumps(o, JSON_PRESERVE_ORDER);
    kvb__cpd_put_t p;
    kvb__frames_err_t e;
    expect_refusal(kvb__cpd_put_parse(text, strlen(text), &e, &p), &e, want, variant);
    free(text);
    json_decref(o);
}

static void replay_put(json_t *root)
{
    const char *body = jstr(root, "body");
    json_t *ex = json_object_get(root, "expect");
    kvb__cpd_put_t p;
    kvb__frames_err_t e;
    char *mine;
    size_t n;
    if (!kvb__cpd_is_put(body, strlen(body)))
        FAILF("not classified as a CachePD PUT");
    if (kvb__cpd_put_parse(body, strlen(body), &e, &p) != KVB_OK)
        FAILF("PUT refused: %s", e.reason);
    if (p.world_size != jint(ex, "world_size") || p.pp_size != jint(ex, "pp_size") ||
        p.rank_port != jint(ex, "rank_port") || strcmp(p.rank_ip, jstr(ex, "rank_ip")) != 0 ||
        p.stages.n != json_array_size(json_object_get(ex, "cache_fields_by_stage")))
        FAILF("PUT fields");
    if (kvb__cpd_put_encode(&p, &mine, &n) != KVB_OK || strcmp(mine, body) != 0)
        FAILF("PUT re-encoding differs:\n%s\n%s", body, mine);
    free(mine);
    put_variant(body, "layout not a string", "must be a string", "cache_layout", json_integer(1));
    put_variant(body, "layout invalid", "bootstrap layout is invalid", "cache_layout",
                json_string("{}"));
    put_variant(body, "no placement", "cache_fields_by_stage", "cache_fields_by_stage", NULL);
    put_variant(body, "placement short", "exactly once", "drop_field", NULL);
    put_variant(body, "pp mismatch", "world_size", "pp_size", json_integer(3));
    put_variant(body, "role", "Prefill", "role", json_string("Decode"));
    put_variant(body, "no pp_size", "pp_size", "pp_size", NULL);
    kvb__cpd_put_free(&p);
}

static void replay_parallel_info(json_t *root)
{
    json_t *puts = json_object_get(root, "server_puts"), *v, *ex = json_object_get(root, "expect");
    const char *body = jstr(root, "body");
    kvb__cpd_boot_t b = {0};
    kvb__frames_err_t e;
    size_t i, n;
    char *answer;
    if (kvb__cpd_boot_parallel_info(&b, &answer, &n) != KVB_ERR_STATE)
        FAILF("an empty server answers");
    json_array_foreach(puts, i, v)
    {
        kvb__cpd_put_t p;
        uint32_t dpg, rank;
        if (kvb__cpd_put_parse(json_string_value(v), json_string_length(v), &e, &p) != KVB_OK ||
            kvb__cpd_boot_admit(&b, &p, &e, &dpg, &rank) != KVB_OK)
            FAILF("PUT %zu refused: %s", i, e.reason);
        if (dpg != 0 || rank != i)
            FAILF("PUT %zu keyed (%u, %u)", i, dpg, rank);
        kvb__cpd_put_free(&p);
    }
    if (kvb__cpd_boot_parallel_info(&b, &answer, &n) != KVB_OK || strcmp(answer, body) != 0)
        FAILF("server answer differs:\n%s\n%s", body, answer);
    free(answer);
    kvb__cpd_pinfo_t pi;
    if (kvb__cpd_pinfo_parse(body, strlen(body), &e, &pi) != KVB_OK)
        FAILF("parallel info refused: %s", e.reason);
    char *wire;
    if (pi.world_size != jint(ex, "world_size") || pi.tp_size != jint(ex, "tp_size") ||
        pi.pp_size != jint(ex, "pp_size") || pi.stages.n != pi.pp_size ||
        kvb__cpd_contract_encode(&pi.contract, &wire, &n) != KVB_OK ||
        strcmp(wire, jstr(ex, "cache_layout_canonical")) != 0)
        FAILF("parallel info fields");
    free(wire);
    kvb__cpd_pinfo_free(&pi);
    /* A rank with another layout / placement is refused, state kept. */
    json_t *o = json_loads(json_string_value(json_array_get(puts, 0)), 0, NULL);
    json_t *c = json_loads(json_string_value(json_object_get(o, "cache_layout")), 0, NULL);
    json_object_set_new(json_object_get(c, "plan"), "prefix_granularity", json_integer(7));
    char *ct = json_dumps(c, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_object_set_new(o, "cache_layout", json_string(ct));
    char *text = json_dumps(o, JSON_PRESERVE_ORDER);
    kvb__cpd_put_t p;
    if (kvb__cpd_put_parse(text, strlen(text), &e, &p) != KVB_OK)
        FAILF("mutated PUT refused at parse: %s", e.reason);
    expect_refusal(kvb__cpd_boot_admit(&b, &p, &e, NULL, NULL), &e, "incompatible layouts",
                   "another layout");
    kvb__cpd_put_free(&p);
    free(ct);
    free(text);
    json_decref(c);
    json_decref(o);
    json_t *bad = json_loads(body, 0, NULL);
    json_object_set_new(bad, "cache_layout", json_null());
    text = json_dumps(bad, JSON_PRESERVE_ORDER);
    expect_refusal(kvb__cpd_pinfo_parse(text, strlen(text), &e, &pi), &e,
                   "non-cache-transfer prefill", "null layout");
    free(text);
    json_decref(bad);
    kvb__cpd_boot_free(&b);
}

static void replay_rank_addr(json_t *root)
{
    const char *body = jstr(root, "body");
    char ip[KVB__CPD_MAX_ENDPOINT + 1], *mine;
    uint16_t port;
    size_t n;
    kvb__frames_err_t e;
    if (kvb__cpd_rank_addr_parse(body, strlen(body), &e, ip, &port) != KVB_OK ||
        kvb__cpd_rank_addr_encode(ip, port, &mine, &n) != KVB_OK || strcmp(mine, body) != 0)
        FAILF("rank address");
    free(mine);
    const char *bad = "{\"rank_ip\": \"a b\", \"rank_port\": 1}";
    expect_refusal(kvb__cpd_rank_addr_parse(bad, strlen(bad), &e, ip, &port), &e, "rank_ip",
                   "bad host");
}

/* ------------------------------------------------------------------ planner */

#include "test_cachepd_plan.h"

/* ------------------------------------------------------------------ main */

static void replay_file(const char *path)
{
    json_error_t je;
    g_file = path;
    json_t *root = json_load_file(path, 0, &je);
    if (root == NULL)
        FAILF("not JSON: %s", je.text);
    const char *kind = jstr(root, "kind");
    if (jint(root, "corpus") != 1 || strcmp(jstr(root, "dialect"), "tokenspeed_cachepd") != 0 ||
        strncmp(jstr(root, "provenance"), "recorded-from-release ", 22) != 0)
        FAILF("needs corpus 1, dialect tokenspeed_cachepd, a recorded provenance");
    if (strcmp(kind, "contract") == 0)
        replay_contract(root);
    else if (strcmp(kind, "manifest") == 0)
        replay_manifest(root);
    else if (strcmp(kind, "registration") == 0)
        replay_registration(root);
    else if (strcmp(kind, "request") == 0)
        replay_request(root);
    else if (strcmp(kind, "status") == 0)
        replay_status(root);
    else if (strcmp(kind, "bootstrap_put") == 0)
        replay_put(root);
    else if (strcmp(kind, "bootstrap_parallel_info") == 0)
        replay_parallel_info(root);
    else if (strcmp(kind, "bootstrap_rank_addr") == 0)
        replay_rank_addr(root);
    else if (strcmp(kind, "plan") == 0)
        replay_plan(root);
    else
        FAILF("unknown kind %s", kind);
    json_decref(root);
    g_files++;
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: test_cachepd_codec CORPUS_DIR\n");
        return 2;
    }
    double t0 = kvb_test_now_s();
    g_dir = argv[1];
    char *names[1024];
    int n = kvb_test_json_files(g_dir, names, 1024);
    if (n < 0) {
        fprintf(stderr, "%s: missing\n", g_dir);
        return 1;
    }
    for (int i = 0; i < n; i++) {
        char path[4096];
        snprintf(path, sizeof(path), "%s/%s", g_dir, names[i]);
        replay_file(path);
        free(names[i]);
    }
    if (g_ordinary < 10) {
        fprintf(stderr, "only %d contracts rebuilt by kvb__cpd_contract_ordinary\n", g_ordinary);
        return 1;
    }
    if (g_files < 40) {
        fprintf(stderr, "%s: only %d golden files\n", g_dir, g_files);
        return 1;
    }
    fprintf(stderr,
            "ok: %d CachePD golden files, %d malformed variants refused, %d contracts rebuilt "
            "from kvbridge's arguments (%.2f s)\n",
            g_files, g_variants, g_ordinary, kvb_test_now_s() - t0);
    return 0;
}
