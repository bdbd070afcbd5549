/* kvbridge prefill ranks serving a TokenSpeed 0.1.1 (CachePD) decode, from
 * the decode side's frames recorded from TokenSpeed's own code
 * (tests/conformance/tokenspeed_cachepd/: the registration with the
 * decode's contract, the request with its block manifest), sent through a
 * raw ZeroMQ PUSH as TokenSpeed's receiver sends them. Only what names the
 * decode's process changes (frames 1-4 of the registration: endpoint,
 * port, session, slab; frame 1 of the request: session): the decode's
 * memory is a real slab laid out by its contract and registered with a
 * kvbridge engine, its PULL socket a real one.
 *
 * Per case: every byte of the decode's slab (the manifest's pages of every
 * history field hold the request's pattern at the decode's heads, everything
 * else stays zero), and the exact 7-frame statuses (Success 5 from each
 * planned source, with the first token, candidates, cached tokens and
 * logprob bytes; nothing from a dummy rank).
 *
 * The hybrid case (3 linear-attention state groups with fields layer.N.conv
 * [128/TP, 3] bfloat16 over parts [32, 32, 64] and layer.N.ssm [4/TP, 16,
 * 16] float32, one full-attention layer 3): the prefill ranks get
 * TokenSpeed's prefill contract (params cachepd_contract), K and V of layer
 * 3 as KV buffers 0 and 1, a state buffer per state field in (layer, name)
 * order, and send state slot SLOT with the last chunk. Byte x of global row
 * g of state field j is kvbh_pat(room, 32 + j, 0, g * row bytes + x); each
 * prefill rank holds its rows (spec 7.3: each part of axis 0 split evenly,
 * the rank's slices side by side), the decode must hold its rows of every
 * field at its group's manifest block. The recorded manifest names block
 * 29 in all three state groups, and TokenSpeed's state groups share planes:
 * the three conv (and the three ssm) fields land on the same bytes in an
 * order nobody promises, so that room checks each such row whole against
 * the rows of the aliased fields (alias_pick); a second room with the state
 * blocks moved apart (29, 30, 31) checks every byte exactly.
 *
 * Then the refusals: a malformed manifest, a block id past the decode's
 * pages, a registration with an incompatible contract, one whose slab is 0,
 * a request from an unknown session, two sessions registered as the same
 * decode rank of a TP1 -> TP2 room: each room Failed on the prefill with the
 * reason, a Failed status (room, 0, rank, -1, empty, cached, empty) to the
 * decode where TokenSpeed has someone to tell, and the rank keeps serving.
 *
 *   test_cpd_prefill CORPUS_DIR */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "dialect/cachepd/cachepd.h"
#include "harness/kvb_cluster.h"
#include "kvb_test.h"

#define MAX_RANKS 4
#define MAX_FRAMES 8
#define TOKEN 29871
#define CACHED 16
#define LOGPROB (-0.0123)
#define SLOT 5 /* the prefill's state slot (hybrid) */

static const char *CORPUS;

/* ---- corpus frames ---- */

typedef struct msg {
    void *buf[MAX_FRAMES];
    size_t len[MAX_FRAMES];
    int n;
} msg_t;

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

static void msg_set(msg_t *m, int i, const void *p, size_t len)
{
    free(m->buf[i]);
    m->buf[i] = malloc(len ? len : 1);
    memcpy(m->buf[i], p, len);
    m->len[i] = len;
}

static void msg_load(msg_t *m, const char *name)
{
    json_t *j = corpus(name), *v;
    size_t i;
    memset(m, 0, sizeof(*m));
    json_array_foreach(json_object_get(j, "frames"), i, v)
    {
        const char *s = json_string_value(v);
        size_t len = strlen(s + 2);
        uint8_t b[300000];
        CHECK(len / (s[0] == 't' ? 1 : 2) <= sizeof(b));
        if (s[0] == 't')
            memcpy(b, s + 2, len);
        else
            len /= 2;
        for (size_t k = 0; s[0] != 't' && k < len; k++)
            sscanf(s + 2 + 2 * k, "%2hhx", &b[k]);
        msg_set(m, (int)i, b, len);
        m->n = (int)i + 1;
    }
    json_decref(j);
}

static void msg_free(msg_t *m)
{
    for (int i = 0; i < m->n; i++)
        free(m->buf[i]);
    memset(m, 0, sizeof(*m));
}

/* ---- one decode rank: slab, engine, PULL socket ---- */

typedef struct drank {
    kvb__cpd_contract_t c;
    uint8_t *slab, *want;
    kvb_engine_h eng;
    void *pull;
    uint16_t port;
    const char *sid;
} drank_t;

/* A state field of the decode's contract: kvbridge's state buffer j (its
 * position in (layer, name) order). Global rows on the partition axis 0,
 * bytes per row, the axis' parts (one part: the whole axis). */
typedef struct sfield {
    uint32_t f; /* index in the decode contract's fields */
    int rows, width, nparts;
    uint64_t parts[KVB__CPD_MAX_PARTS];
} sfield_t;

/* A region of the decode's slab a room writes (aliases: state regions of
 * other groups at exactly the same bytes, see alias_pick). */
typedef struct region {
    uint64_t off, len;
    int state; /* state buffer j, -1: a KV page */
} region_t;

#define MAX_REGIONS 256

typedef struct scene {
    const char *name;
    int ptp, dtp;
    kvbh_boot_t boot;
    kvbh_geom_t g;
    int kv_layer[64]; /* the KV layers in order: KV buffer b holds layer kv_layer[b % layers] */
    int n_state;      /* hybrid: state fields, in kvbridge's state buffer order */
    sfield_t st[KVBH_MAX_STATE];
    uint64_t state_item[KVBH_MAX_STATE]; /* a prefill rank's item of each */
    char *contract;                      /* hybrid: TokenSpeed's prefill contract */
    region_t reg_w[MAX_REGIONS];         /* what the last expect_bytes wrote */
    int n_reg;
    kvbh_rank_t pre[MAX_RANKS];
    kvbh_push_t push[MAX_RANKS];
    drank_t dec[MAX_RANKS];
    void *zctx;
    json_t *plan; /* the case's recorded routes */
    msg_t reg[MAX_RANKS];
    char manifest[4096];
    int64_t prefix, prompt;
} scene_t;

static void contract_of(const char *name, kvb__cpd_contract_t *c)
{
    json_t *j = corpus(name);
    const char *body = json_string_value(json_object_get(j, "body"));
    kvb__frames_err_t e;
    if (kvb__cpd_contract_parse((const uint8_t *)body, strlen(body), &e, c) != KVB_OK)
        fprintf(stderr, "%s: %s\n", name, e.reason);
    json_decref(j);
}

static bool is_state(const kvb__cpd_contract_t *c, uint32_t f)
{
    return c->specs[c->fields[f].spec].family == KVB__CPD_STATE;
}

/* A field id's layer and name ("layer.3.k": 3, "k"). */
static void field_name(const kvb__cpd_field_t *f, unsigned *layer, char *name)
{
    CHECK_EQ(sscanf(f->field_id, "layer.%u.%15s", layer, name), 2);
}

/* The prefill geometry the decode's contract describes (model-wide): its
 * history fields (K and V, or MLA latents) are the KV buffers, K of the
 * layers in order then V (s->kv_layer: which layer each is); its state
 * fields, in (layer, name) order, the state buffers (s->st). */
static void geom_of(scene_t *s, const kvb__cpd_contract_t *c)
{
    kvbh_geom_t *g = &s->g;
    memset(g, 0, sizeof(*g));
    s->n_state = 0;
    for (uint32_t f = 0; f < c->nfields; f++) {
        const kvb__cpd_field_t *fl = &c->fields[f];
        unsigned layer;
        char name[16];
        field_name(fl, &layer, name);
        if (is_state(c, f)) {
            /* insertion by (layer, name) */
            sfield_t sf = {f, 0, 0, 0, {0}};
            CHECK(fl->partition >= 0);
            const kvb__cpd_partition_t *pt = &c->parts[fl->partition];
            CHECK(pt->axis == 0);
            sf.rows = (int)pt->global_extent;
            sf.width = (int)(fl->payload / fl->shape[0]);
            sf.nparts = pt->nparts ? (int)pt->nparts : 1;
            for (int p = 0; p < sf.nparts; p++)
                sf.parts[p] = pt->nparts ? pt->parts[p] : pt->global_extent;
            int j = s->n_state++;
            CHECK(j < KVBH_MAX_STATE);
            for (; j > 0; j--) {
                unsigned l2;
                char n2[16];
                field_name(&c->fields[s->st[j - 1].f], &l2, n2);
                if (l2 < layer || (l2 == layer && strcmp(n2, name) < 0))
                    break;
                s->st[j] = s->st[j - 1];
            }
            s->st[j] = sf;
            continue;
        }
        if (strcmp(name, "v") == 0)
            continue;
        /* K or a latent: one KV layer, inserted in order */
        int i = g->layers++;
        CHECK(i < 64);
        for (; i > 0 && s->kv_layer[i - 1] > (int)layer; i--)
            s->kv_layer[i] = s->kv_layer[i - 1];
        s->kv_layer[i] = (int)layer;
        g->mla = strstr(name, "latent") != NULL;
        g->heads = g->mla ? 1 : (int)c->parts[fl->partition].global_extent;
        g->head_bytes = (int)(fl->shape[2] * kvb__cpd_dtype_bytes(fl->dtype));
        g->page = (int)fl->shape[0];
    }
    g->pool_pages = 64;
}

/* KV buffer of a history field: its layer's position, + layers for V. */
static int kv_buffer(const scene_t *s, const kvb__cpd_field_t *f)
{
    unsigned layer;
    char name[16];
    field_name(f, &layer, name);
    for (int i = 0; i < s->g.layers; i++)
        if (s->kv_layer[i] == (int)layer)
            return i + (strcmp(name, "v") == 0 ? s->g.layers : 0);
    CHECK(0);
    return -1;
}

/* The global row of local row i of rank tp of TP size tp_size
 * (PROTOCOL-TOKENSPEED-CACHEPD.md 7.3: each part of axis 0 split evenly,
 * the rank's slices of the parts side by side). */
static int global_row(const sfield_t *f, int i, int tp, int tp_size)
{
    for (int p = 0, off = 0, loff = 0; p < f->nparts; p++) {
        int e = (int)f->parts[p] / tp_size;
        CHECK(e * tp_size == (int)f->parts[p]);
        if (i < loff + e)
            return off + tp * e + (i - loff);
        off += (int)f->parts[p];
        loff += e;
    }
    CHECK(0);
    return -1;
}

/* Row i (rank tp of tp_size's local rows) of state field j: byte x holds
 * the room's pattern at (field j, global row, x), whichever rank holds it. */
static void state_row(const scene_t *s, uint64_t room, int j, int i, int tp, int tp_size,
                      uint8_t *out)
{
    const sfield_t *f = &s->st[j];
    uint64_t g = (uint64_t)global_row(f, i, tp, tp_size);
    for (int x = 0; x < f->width; x++)
        out[x] = kvbh_pat(room, 32 + j, 0, g * (uint64_t)f->width + (uint64_t)x);
}

static void drank_start(scene_t *s, int k)
{
    drank_t *d = &s->dec[k];
    kvb_engine_params_t ep = {0};
    char name[128], end[64];
    size_t el = sizeof(end);
    int zero = 0, ms = 100;
    snprintf(name, sizeof(name), "%s_contract_decode", s->name);
    contract_of(name, &d->c);
    d->slab = calloc(1, d->c.arena_bytes);
    d->want = calloc(1, d->c.arena_bytes);
    CHECK(d->slab != NULL && d->want != NULL);
    CHECK_EQ(kvb_engine_create(&ep, &d->eng), KVB_OK);
    CHECK_EQ(kvb_engine_register(d->eng, d->slab, d->c.arena_bytes, KVB_MEM_HOST), KVB_OK);
    d->sid = kvb_engine_session_id(d->eng);
    d->pull = zmq_socket(s->zctx, ZMQ_PULL);
    zmq_setsockopt(d->pull, ZMQ_LINGER, &zero, sizeof(zero));
    zmq_setsockopt(d->pull, ZMQ_RCVTIMEO, &ms, sizeof(ms));
    CHECK_EQ(zmq_bind(d->pull, "tcp://127.0.0.1:*"), 0);
    CHECK_EQ(zmq_getsockopt(d->pull, ZMQ_LAST_ENDPOINT, end, &el), 0);
    d->port = (uint16_t)atoi(strrchr(end, ':') + 1);
    snprintf(name, sizeof(name), "%s_registration_d%d", s->name, k);
    msg_load(&s->reg[k], name);
}

static void drank_stop(drank_t *d)
{
    zmq_close(d->pull);
    kvb_engine_destroy(d->eng);
    kvb__cpd_contract_free(&d->c);
    free(d->slab);
    free(d->want);
}

static void start(scene_t *s, const char *name, int ptp, int dtp)
{
    char file[128];
    memset(s, 0, sizeof(*s));
    s->name = name;
    s->ptp = ptp;
    s->dtp = dtp;
    s->zctx = zmq_ctx_new();
    snprintf(file, sizeof(file), "%s_plan", name);
    s->plan = corpus(file);
    for (int k = 0; k < dtp; k++)
        drank_start(s, k);
    geom_of(s, &s->dec[0].c);
    kvbh_knobs_t kn = {0};
    if (s->n_state > 0) { /* hybrid: TokenSpeed's contract, a state buffer per field */
        snprintf(file, sizeof(file), "%s_contract_prefill", name);
        json_t *j = corpus(file);
        s->contract = strdup(json_string_value(json_object_get(j, "body")));
        json_decref(j);
        for (int i = 0; i < s->n_state; i++)
            s->state_item[i] = (uint64_t)(s->st[i].rows / ptp * s->st[i].width);
        kn.cachepd_contract = s->contract;
        kn.n_state = s->n_state;
        kn.state_items = s->state_item;
    }
    CHECK_EQ(kvbh_boot_start(&s->boot, 0, NULL), 0);
    for (int i = 0; i < ptp; i++) {
        kvbh_place_t pl = {i, ptp, 0, 1, 0, 1};
        CHECK_EQ(kvbh_rank_start_at(&s->pre[i], &s->g, &pl, KVB_MODE_PREFILL, s->boot.addr,
                                    KVBH_MEM_MALLOC, &kn),
                 KVB_OK);
        CHECK_EQ(kvbh_push_open(&s->push[i], kvb_manager_endpoint(s->pre[i].mgr), NULL), 0);
    }
    snprintf(file, sizeof(file), "%s_request", name);
    json_t *j = corpus(file);
    const char *m = json_string_value(json_array_get(json_object_get(j, "frames"), 2));
    snprintf(s->manifest, sizeof(s->manifest), "%s", m + 2);
    json_t *e = json_object_get(json_object_get(j, "expect"), "manifest");
    s->prefix = json_integer_value(json_object_get(e, "prefix_len"));
    s->prompt = json_integer_value(json_object_get(e, "prompt_len"));
    json_decref(j);
}

static void stop(scene_t *s)
{
    for (int i = 0; i < s->ptp; i++) {
        kvbh_push_close(&s->push[i]);
        kvbh_rank_stop(&s->pre[i]);
    }
    for (int k = 0; k < s->dtp; k++) {
        drank_stop(&s->dec[k]);
        msg_free(&s->reg[k]);
    }
    zmq_ctx_term(s->zctx);
    json_decref(s->plan);
    kvbh_boot_stop(&s->boot);
    free(s->contract);
}

/* ---- the decode's messages ---- */

static void send_msg(kvbh_push_t *p, const msg_t *m)
{
    CHECK_EQ(kvbh_push_frames(p, (const void *const *)m->buf, m->len, m->n), 0);
}

/* Decode rank k's recorded registration, naming this process's decode
 * (slab: NULL for the real one; sid: NULL for its engine's session). */
static void send_reg(scene_t *s, int k, int prefill, const char *sid, const uint64_t *slab)
{
    msg_t m = s->reg[k];
    char port[8];
    uint64_t p = slab ? *slab : (uint64_t)(uintptr_t)s->dec[k].slab;
    sid = sid ? sid : s->dec[k].sid;
    snprintf(port, sizeof(port), "%u", s->dec[k].port);
    m.buf[1] = "127.0.0.1";
    m.len[1] = 9;
    m.buf[2] = port;
    m.len[2] = strlen(port);
    m.buf[3] = (void *)sid;
    m.len[3] = strlen(sid);
    m.buf[4] = &p;
    send_msg(&s->push[prefill], &m);
}

static void send_req(scene_t *s, int prefill, uint64_t room, const char *sid, const char *manifest)
{
    char r[24];
    snprintf(r, sizeof(r), "%llu", (unsigned long long)room);
    const void *f[3] = {r, sid, manifest};
    size_t l[3] = {strlen(r), strlen(sid), strlen(manifest)};
    CHECK_EQ(kvbh_push_frames(&s->push[prefill], f, l, 3), 0);
}

/* ---- statuses ---- */

typedef struct status {
    int n;
    char f[7][64];
    size_t len[7];
} status_t;

/* One message from decode rank k's PULL within timeout_s; 0 or -1. */
static int recv_status(drank_t *d, status_t *st, double timeout_s)
{
    double end = kvbh_now() + timeout_s;
    memset(st, 0, sizeof(*st));
    while (kvbh_now() < end) {
        int more = 1;
        size_t ml = sizeof(more);
        int n = zmq_recv(d->pull, st->f[0], sizeof(st->f[0]) - 1, 0);
        if (n < 0)
            continue;
        st->len[0] = (size_t)n;
        st->n = 1;
        for (zmq_getsockopt(d->pull, ZMQ_RCVMORE, &more, &ml); more;
             zmq_getsockopt(d->pull, ZMQ_RCVMORE, &more, &ml)) {
            char sink[64];
            int i = st->n < 7 ? st->n : 6;
            n = zmq_recv(d->pull, st->n < 7 ? st->f[i] : sink, sizeof(sink) - 1, 0);
            st->len[i] = n < 0 ? 0 : (size_t)n;
            st->n++;
        }
        return 0;
    }
    return -1;
}

static void check_frame(const status_t *st, int i, const void *want, size_t len)
{
    if (st->len[i] != len || memcmp(st->f[i], want, len) != 0) {
        fprintf(stderr, "status frame %d: %zu bytes, want %zu\n", i, st->len[i], len);
        exit(1);
    }
}

static void check_text(const status_t *st, int i, const char *want)
{
    check_frame(st, i, want, strlen(want));
}

/* The 7 frames TokenSpeed's prefill sends (spec 4.4). */
static void check_status(const status_t *st, uint64_t room, bool ok, int rank)
{
    char buf[32];
    const int32_t cands[2] = {TOKEN + 1, TOKEN + 2};
    const uint8_t lp[8] = {0x8d, 0x28, 0xed, 0x0d, 0xbe, 0x30, 0x89, 0xbf}; /* -0.0123 */
    CHECK_EQ(st->n, 7);
    snprintf(buf, sizeof(buf), "%llu", (unsigned long long)room);
    check_text(st, 0, buf);
    check_text(st, 1, ok ? "5" : "0");
    snprintf(buf, sizeof(buf), "%d", rank);
    check_text(st, 2, buf);
    snprintf(buf, sizeof(buf), "%d", ok ? TOKEN : -1);
    check_text(st, 3, buf);
    check_frame(st, 4, cands, ok ? sizeof(cands) : 0);
    check_text(st, 5, ok ? "16" : "0");
    check_frame(st, 6, lp, ok ? 8 : 0);
}

/* ---- bytes ---- */

/* Request page p of every buffer of prefill rank r at its page sp: heads
 * first_head.. of the model-wide pattern, token-major. */
static void fill_page(const scene_t *s, kvbh_rank_t *r, uint64_t room, uint64_t p, int32_t sp)
{
    int hb = s->g.head_bytes, H = s->g.heads, Hl = r->local_heads;
    for (int b = 0; b < r->n_kv; b++) {
        uint8_t *item = r->kv[b] + (uint64_t)sp * r->item_len;
        for (int t = 0; t < s->g.page; t++)
            for (int h = 0; h < Hl; h++)
                for (int k = 0; k < hb; k++) {
                    uint64_t global = ((uint64_t)t * H + (uint64_t)(r->first_head + h)) * hb + k;
                    item[((uint64_t)t * Hl + h) * hb + k] = kvbh_pat(room, b, p, global);
                }
    }
}

static const kvb__cpd_mgroup_t *mgroup(const kvb__cpd_manifest_t *m, const char *id)
{
    for (uint32_t g = 0; g < m->ngroups; g++)
        if (strcmp(m->groups[g].group_id, id) == 0)
            return &m->groups[g];
    CHECK(0);
    return NULL;
}

static void add_region(scene_t *s, uint64_t off, uint64_t len, int state)
{
    CHECK(s->n_reg < MAX_REGIONS);
    s->reg_w[s->n_reg++] = (region_t){off, len, state};
}

/* What decode rank k must hold after room with manifest (its history
 * group's ids: request pages prefix/page + j at block ids[j], for its
 * heads; each state group's one block: the rank's rows of the prefill's
 * state slot for each field of the group). s->reg_w: the regions written;
 * state regions of several groups at the same bytes (aliases) get the
 * last one's image here, alias_pick settles them. */
static void expect_bytes(scene_t *s, int k, uint64_t room, const char *manifest)
{
    drank_t *d = &s->dec[k];
    kvb__cpd_manifest_t m;
    kvb__frames_err_t e;
    int hb = s->g.head_bytes, H = s->g.heads;
    uint8_t row[4096];
    CHECK_EQ(kvb__cpd_manifest_parse((const uint8_t *)manifest, strlen(manifest), &e, &m), KVB_OK);
    s->n_reg = 0;
    for (uint32_t f = 0; f < d->c.nfields; f++) {
        const kvb__cpd_field_t *fl = &d->c.fields[f];
        const kvb__cpd_mgroup_t *g = mgroup(&m, fl->group_id);
        if (is_state(&d->c, f))
            continue;
        int b = kv_buffer(s, fl);
        int Hd = (int)fl->shape[1], first = s->g.mla ? 0 : k * Hd;
        for (size_t j = 0; j < g->n; j++) {
            uint64_t p = (uint64_t)(s->prefix / s->g.page) + j;
            uint64_t off = kvb__cpd_page_offset(&d->c, f, (uint64_t)g->block_ids[j]);
            uint8_t *page = d->want + off;
            add_region(s, off, fl->payload, -1);
            for (int t = 0; t < s->g.page; t++)
                for (int h = 0; h < Hd; h++)
                    for (int x = 0; x < hb; x++)
                        page[((uint64_t)t * Hd + h) * hb + x] =
                            kvbh_pat(room, b, p, ((uint64_t)t * H + first + h) * hb + x);
        }
    }
    for (int j = 0; j < s->n_state; j++) {
        const sfield_t *sf = &s->st[j];
        const kvb__cpd_field_t *fl = &d->c.fields[sf->f];
        const kvb__cpd_mgroup_t *g = mgroup(&m, fl->group_id);
        CHECK_EQ(g->n, 1); /* latest_snapshot: the block of slot (prompt_len - 1) / page */
        uint64_t off = kvb__cpd_page_offset(&d->c, sf->f, (uint64_t)g->block_ids[0]);
        int rows = (int)fl->shape[0];
        CHECK(sf->width <= (int)sizeof(row) && rows * s->dtp == sf->rows);
        add_region(s, off, fl->payload, j);
        for (int i = 0; i < rows; i++) {
            state_row(s, room, j, i, k, s->dtp, row);
            memcpy(d->want + off + (uint64_t)i * sf->width, row, (size_t)sf->width);
        }
    }
    kvb__cpd_manifest_free(&m);
}

/* How many pairs of the written regions share bytes; state regions at
 * exactly the same bytes are aliases (TokenSpeed's state groups share their
 * planes), any other overlap fails here. */
static int overlaps(const scene_t *s)
{
    int n = 0;
    for (int a = 0; a < s->n_reg; a++)
        for (int b = a + 1; b < s->n_reg; b++) {
            const region_t *x = &s->reg_w[a], *y = &s->reg_w[b];
            if (x->off >= y->off + y->len || y->off >= x->off + x->len)
                continue;
            CHECK(x->state >= 0 && y->state >= 0 && x->off == y->off && x->len == y->len);
            n++;
        }
    return n;
}

/* Aliased state regions of decode rank k: several fields' images written
 * to the same bytes, in an order nobody promises (the prefill's writes of
 * the fields, from every rank, may land in any order). Each local row must
 * be one of the aliases' rows at that position, whole: the want image takes
 * the slab's row where it is one, else keeps the last alias' (and the slab
 * check fails). Prints which field's row landed last. */
static void alias_pick(scene_t *s, int k, uint64_t room)
{
    drank_t *d = &s->dec[k];
    uint8_t row[4096];
    for (int a = 0; a < s->n_reg; a++) {
        const region_t *x = &s->reg_w[a];
        int won[KVBH_MAX_STATE] = {0}, naliases = 0, first = 1;
        if (x->state < 0)
            continue;
        for (int b = 0; b < s->n_reg; b++)
            if (s->reg_w[b].state >= 0 && s->reg_w[b].off == x->off) {
                naliases++;
                first &= b >= a;
            }
        if (naliases < 2 || !first)
            continue;
        const sfield_t *sf = &s->st[x->state];
        int rows = (int)(x->len / (uint64_t)sf->width);
        for (int i = 0; i < rows; i++) {
            uint8_t *at = d->slab + x->off + (uint64_t)i * sf->width;
            for (int b = 0; b < s->n_reg; b++) {
                const region_t *y = &s->reg_w[b];
                if (y->state < 0 || y->off != x->off)
                    continue;
                state_row(s, room, y->state, i, k, s->dtp, row);
                if (memcmp(at, row, (size_t)sf->width) == 0) {
                    memcpy(d->want + x->off + (uint64_t)i * sf->width, row, (size_t)sf->width);
                    won[y->state]++;
                    break;
                }
            }
        }
        fprintf(stderr, "%s: decode rank %d: %d state fields aliased at slab offset %llu:", s->name,
                k, naliases, (unsigned long long)x->off);
        for (int j = 0; j < s->n_state; j++)
            if (won[j])
                fprintf(stderr, " %s %d/%d rows", d->c.fields[s->st[j].f].field_id, won[j], rows);
        fprintf(stderr, "\n");
    }
}

static uint64_t slab_bad(const drank_t *d)
{
    uint64_t bad = 0;
    for (uint64_t i = 0; i < d->c.arena_bytes; i++)
        bad += d->slab[i] != d->want[i];
    return bad;
}

/* ---- rooms ---- */

static bool in_list(json_t *a, int v)
{
    size_t i;
    json_t *x;
    json_array_foreach(a, i, x) if (json_integer_value(x) == v) return true;
    return false;
}

/* Decode rank k's route as TokenSpeed's planner made it. */
static json_t *route(const scene_t *s, int k)
{
    return json_array_get(json_object_get(json_object_get(s->plan, "expect"), "decode_routes"),
                          (size_t)k);
}

/* A sender on every prefill rank, ready; the decode's requests sent. */
static void senders(scene_t *s, uint64_t room, kvb_sender_h *snd)
{
    const int32_t cands[2] = {TOKEN + 1, TOKEN + 2};
    for (int i = 0; i < s->ptp; i++) {
        CHECK_EQ(kvb_sender_create(s->pre[i].mgr, s->boot.addr, room, &snd[i]), KVB_OK);
        CHECK_EQ(kvb_sender_set_first_token(snd[i], TOKEN, cands, 2), KVB_OK);
        CHECK_EQ(kvb_sender_set_cached_tokens(snd[i], CACHED), KVB_OK);
        CHECK_EQ(kvb_sender_set_first_logprob(snd[i], LOGPROB), KVB_OK);
    }
    for (int k = 0; k < s->dtp; k++) {
        json_t *rt = route(s, k);
        for (int t = 0; t < s->ptp; t++)
            if (in_list(json_object_get(rt, "targets"), t))
                send_req(s, t, room, s->dec[k].sid,
                         in_list(json_object_get(rt, "dummies"), t) ? "" : s->manifest);
    }
}

/* Every rank sends the whole prompt (the decode's prefix skipped), in two
 * chunks; returns how many ended Success. */
static int run_senders(scene_t *s, uint64_t room, kvb_sender_h *snd)
{
    int32_t src[64];
    int total = (int)((s->prompt + s->g.page - 1) / s->g.page), ok = 0;
    for (int i = 0; i < s->ptp; i++) {
        kvbh_rank_t *r = &s->pre[i];
        const int32_t slot = SLOT;
        for (int p = 0; p < total; p++) {
            src[p] = 40 - 2 * p;
            fill_page(s, r, room, (uint64_t)p, src[p]);
        }
        for (int j = 0; j < r->n_state; j++) /* the rank's rows of every state field */
            for (int x = 0; x < s->st[j].rows / s->ptp; x++)
                state_row(s, room, j, x, i, s->ptp,
                          r->state[j] + SLOT * r->state_item[j] + (uint64_t)x * s->st[j].width);
        CHECK_EQ(kvbh_wait_sender_ready(snd[i], 10), 0);
        CHECK_EQ(kvb_sender_init(snd[i], (uint64_t)total, 0), KVB_OK);
        CHECK_EQ(kvb_sender_send(snd[i], src, (size_t)(total / 2)), KVB_OK);
        if (r->n_state > 0)
            CHECK_EQ(kvb_sender_set_state_indices(snd[i], &slot, 1), KVB_OK);
        CHECK_EQ(kvb_sender_send(snd[i], src + total / 2, (size_t)(total - total / 2)), KVB_OK);
    }
    for (int i = 0; i < s->ptp; i++) {
        char why[512] = "";
        kvb_poll_t st = kvbh_wait_sender(snd[i], 20);
        if (st != KVB_POLL_SUCCESS) {
            kvb_sender_failure(snd[i], why, sizeof(why));
            fprintf(stderr, "%s: prefill rank %d: %s: %s\n", s->name, i, kvb_poll_string(st), why);
        }
        ok += st == KVB_POLL_SUCCESS;
        kvb_sender_destroy(snd[i]);
    }
    return ok;
}

/* One room with the scene's manifest: the decode's requests, a sender on
 * every prefill rank; every byte of every decode slab and the statuses.
 * Returns how many pairs of state regions the manifest aliases. */
static int run_room(scene_t *s, uint64_t room)
{
    kvb_sender_h snd[MAX_RANKS];
    int aliased = 0;
    senders(s, room, snd);
    CHECK_EQ(run_senders(s, room, snd), s->ptp);
    for (int k = 0; k < s->dtp; k++) {
        json_t *srcs = json_object_get(route(s, k), "sources");
        status_t st;
        for (size_t i = 0; i < json_array_size(srcs); i++) {
            CHECK_EQ(recv_status(&s->dec[k], &st, 5), 0);
            int rank = atoi(st.f[2]);
            CHECK(json_integer_value(json_object_get(json_array_get(srcs, i), "prefill_rank")) ==
                      rank ||
                  json_array_size(srcs) > 1);
            check_status(&st, room, true, rank);
        }
        CHECK_EQ(recv_status(&s->dec[k], &st, 0.3), -1); /* dummies say nothing */
        expect_bytes(s, k, room, s->manifest);
        aliased = overlaps(s);
        alias_pick(s, k, room);
        CHECK_EQ(slab_bad(&s->dec[k]), 0);
    }
    return aliased;
}

/* The manifest with state group q's block moved up by q (q: its position
 * among the state groups): no two groups' blocks share bytes. */
static void dealias(scene_t *s)
{
    kvb__cpd_manifest_t m;
    kvb__frames_err_t e;
    char *json;
    size_t len;
    int q = 0;
    CHECK_EQ(kvb__cpd_manifest_parse((const uint8_t *)s->manifest, strlen(s->manifest), &e, &m),
             KVB_OK);
    for (uint32_t g = 0; g < m.ngroups; g++) {
        int32_t sp = kvb__cpd_spec_index(&s->dec[0].c, m.groups[g].group_id);
        CHECK(sp >= 0);
        if (s->dec[0].c.specs[sp].family == KVB__CPD_STATE)
            m.groups[g].block_ids[0] += q++;
    }
    CHECK_EQ(kvb__cpd_manifest_encode(&m, &json, &len), KVB_OK);
    CHECK(len < sizeof(s->manifest));
    memcpy(s->manifest, json, len + 1);
    free(json);
    kvb__cpd_manifest_free(&m);
}

/* The recorded case end to end: bytes and statuses. A manifest whose state
 * groups share bytes: the recorded room (each aliased row whole from one of
 * its fields), then a room with the state blocks apart (every byte exact). */
static void run_case(const char *name, int ptp, int dtp)
{
    scene_t s;
    start(&s, name, ptp, dtp);
    for (int k = 0; k < dtp; k++)
        for (int t = 0; t < ptp; t++)
            if (in_list(json_object_get(route(&s, k), "targets"), t))
                send_reg(&s, k, t, NULL, NULL);
    int aliased = run_room(&s, 1234);
    if (aliased > 0) {
        dealias(&s);
        fprintf(stderr,
                "%s: the recorded manifest aliases %d pairs of state blocks; again with %s\n", name,
                aliased, s.manifest);
        CHECK_EQ(run_room(&s, 1235), 0);
    }
    int n_state = s.n_state;
    stop(&s);
    fprintf(stderr,
            "ok: %s: TokenSpeed decode x %d <- kvbridge prefill x %d, bytes%s and "
            "statuses exact\n",
            name, dtp, ptp, n_state ? " (KV pages and state snapshots)" : "");
}

/* ---- refusals ---- */

static uint64_t bad_count(kvb_manager_h m)
{
    kvb_manager_stats_t st;
    kvb_manager_stats(m, &st);
    return st.bad_messages;
}

/* A room of prefill rank 0 that the decode's request (sid, manifest) must
 * fail with a reason holding want; told: the decode hears Failed. */
static void refused_room(scene_t *s, uint64_t room, const char *sid, const char *manifest,
                         const char *want, bool told)
{
    kvb_sender_h snd;
    char why[1024] = "";
    status_t st;
    CHECK_EQ(kvb_sender_create(s->pre[0].mgr, s->boot.addr, room, &snd), KVB_OK);
    send_req(s, 0, room, sid, manifest);
    kvb_poll_t p = kvbh_wait_sender(snd, 10);
    kvb_sender_failure(snd, why, sizeof(why));
    kvb_sender_destroy(snd);
    fprintf(stderr, "room %llu: %s: %s\n", (unsigned long long)room, kvb_poll_string(p), why);
    CHECK_EQ(p, KVB_POLL_FAILED);
    CHECK_STR_CONTAINS(why, want);
    if (told) {
        CHECK_EQ(recv_status(&s->dec[0], &st, 5), 0);
        check_status(&st, room, false, 0);
    }
    CHECK_EQ(recv_status(&s->dec[0], &st, 0.3), -1);
}

/* The recorded decode contract with its first "16" page size made 32: a
 * peer of another page size (spec 7.1). */
static void send_reg_contract(scene_t *s, const char *sid, const char *contract)
{
    msg_t m = {0};
    for (int i = 0; i < s->reg[0].n; i++)
        msg_set(&m, i, s->reg[0].buf[i], s->reg[0].len[i]);
    m.n = s->reg[0].n;
    msg_set(&m, 5, contract, strlen(contract));
    msg_t keep = s->reg[0];
    s->reg[0] = m;
    send_reg(s, 0, 0, sid, NULL);
    s->reg[0] = keep;
    msg_free(&m);
}

static void good_room(scene_t *s, uint64_t room)
{
    kvb_sender_h snd[1];
    status_t st;
    senders(s, room, snd);
    CHECK_EQ(run_senders(s, room, snd), 1);
    CHECK_EQ(recv_status(&s->dec[0], &st, 5), 0);
    check_status(&st, room, true, 0);
    expect_bytes(s, 0, room, s->manifest);
    CHECK_EQ(slab_bad(&s->dec[0]), 0);
}

static void run_refusals(void)
{
    scene_t s;
    char bad[4096], *p;
    const char *sid_c = "10.9.9.9:1", *sid_z = "10.9.9.9:2", *sid_u = "10.9.9.9:3";
    uint64_t zero = 0, other;
    kvb_sender_h held;
    char why[1024] = "";
    status_t st;
    start(&s, "mha_tp1_tp1", 1, 1);
    send_reg(&s, 0, 0, NULL, NULL);
    good_room(&s, 1);

    /* manifests: a string block id (TokenSpeed: TypeError, nothing sent),
     * a block past the decode's 48 pages, a dummy request to a real rank */
    refused_room(&s, 2, s.dec[0].sid,
                 "{\"groups\":[{\"group_id\":\"full_attention\",\"block_ids\":[\"18\",29]}],"
                 "\"prefix_len\":16,\"prompt_len\":40}",
                 "invalid pre-allocation metadata: CachePD manifest: groups[0]: block_ids[0] is "
                 "not an integer",
                 true);
    refused_room(&s, 3, s.dec[0].sid,
                 "{\"groups\":[{\"group_id\":\"full_attention\",\"block_ids\":[18,48]}],"
                 "\"prefix_len\":16,\"prompt_len\":40}",
                 "out-of-bounds block", true);
    refused_room(&s, 4, s.dec[0].sid, "", "kind disagrees", true);

    /* registrations: another page size, a zero slab: their requests fail */
    snprintf(bad, sizeof(bad), "%.*s", (int)s.reg[0].len[5], (const char *)s.reg[0].buf[5]);
    p = strstr(bad, "\"prefix_granularity\":16");
    CHECK(p != NULL);
    memcpy(p + strlen("\"prefix_granularity\":"), "32", 2);
    send_reg_contract(&s, sid_c, bad);
    refused_room(&s, 5, sid_c, s.manifest, "registration rejected: Cache P/D contract mismatch",
                 true);
    send_reg(&s, 0, 0, sid_z, &zero);
    refused_room(&s, 6, sid_z, s.manifest, "slab pointer must be nonzero", true);
    /* a session nobody registered: nobody to tell, the room fails here */
    uint64_t before = bad_count(s.pre[0].mgr);
    refused_room(&s, 7, sid_u, s.manifest, "unregistered Decode session", false);
    CHECK(bad_count(s.pre[0].mgr) > before);

    /* the session re-registers with another slab: refused (TokenSpeed's
     * conflict rule); room 10, which already holds its request, fails with
     * it (TokenSpeed aborts it) and the decode hears Failed; a later room
     * fails too; then with its own slab again: served */
    CHECK_EQ(kvb_sender_create(s.pre[0].mgr, s.boot.addr, 10, &held), KVB_OK);
    send_req(&s, 0, 10, s.dec[0].sid, s.manifest);
    CHECK_EQ(kvbh_wait_sender_ready(held, 10), 0);
    other = (uint64_t)(uintptr_t)s.dec[0].slab + 4096;
    send_reg(&s, 0, 0, NULL, &other);
    CHECK_EQ(kvbh_wait_sender(held, 10), KVB_POLL_FAILED);
    kvb_sender_failure(held, why, sizeof(why));
    kvb_sender_destroy(held);
    fprintf(stderr, "room 10: %s\n", why);
    CHECK_STR_CONTAINS(why, "conflicting registration");
    CHECK_EQ(recv_status(&s.dec[0], &st, 5), 0);
    check_status(&st, 10, false, 0);
    refused_room(&s, 8, s.dec[0].sid, s.manifest, "conflicting registration", true);
    send_reg(&s, 0, 0, NULL, NULL);
    good_room(&s, 9);
    stop(&s);
    TEST_PASS("CachePD refusals: Failed with the reason, the rank keeps serving");
}

/* Two decode sessions that both registered as decode rank 0 of 2 (TP1 ->
 * TP2): the room's requests reach the expected count but not the expected
 * ranks {0, 1}. The room fails with TokenSpeed's step-9 reason and both
 * decodes hear Failed (before the check, the room waited for its chunks). */
static void run_fanout(void)
{
    scene_t s;
    kvb_sender_h snd;
    char why[1024] = "";
    status_t st;
    start(&s, "mha_tp1_tp2", 1, 2);
    send_reg(&s, 0, 0, NULL, NULL);
    msg_t keep = s.reg[1];
    s.reg[1] = s.reg[0]; /* decode rank 0's frames 6-7, rank 1's process */
    send_reg(&s, 1, 0, NULL, NULL);
    s.reg[1] = keep;
    CHECK_EQ(kvb_sender_create(s.pre[0].mgr, s.boot.addr, 50, &snd), KVB_OK);
    send_req(&s, 0, 50, s.dec[0].sid, s.manifest);
    send_req(&s, 0, 50, s.dec[1].sid, s.manifest);
    CHECK_EQ(kvbh_wait_sender(snd, 10), KVB_POLL_FAILED);
    kvb_sender_failure(snd, why, sizeof(why));
    kvb_sender_destroy(snd);
    fprintf(stderr, "room 50: %s\n", why);
    CHECK_STR_CONTAINS(why, "destination ranks disagree with the typed route plan");
    for (int k = 0; k < 2; k++) {
        CHECK_EQ(recv_status(&s.dec[k], &st, 5), 0);
        check_status(&st, 50, false, 0);
    }
    stop(&s);
    TEST_PASS("CachePD fan-out: a room's decode ranks must be the route's exactly");
}

int main(int argc, char **argv)
{
    CHECK(argc == 2);
    CORPUS = argv[1];
    run_case("mha_tp1_tp1", 1, 1); /* whole-copy route, a 1-page prefix */
    run_case("mha_prefix2", 1, 1); /* a 2-page prefix */
    run_case("mha_tp2_tp1", 2, 1); /* head fragments: 16 rows per page */
    run_case("mha_tp1_tp2", 1, 2); /* one prefill rank, two decode ranks */
    run_case("gqa_tp4_tp1", 4, 1); /* replicated heads: ranks 1 and 3 are dummies */
    run_case("mla_tp2_tp1", 2, 1); /* replicated latent: rank 1 is a dummy */
    run_case("mla_tp4_tp2", 4, 2);
    run_case("hybrid_tp2_tp1", 2, 1); /* KV pages and 6 state fields' latest snapshots */
    run_refusals();
    run_fanout();
    TEST_PASS("CachePD decode frames replayed against kvbridge prefill ranks");
    return 0;
}
