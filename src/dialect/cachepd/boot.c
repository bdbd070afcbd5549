/* CachePD bootstrap JSON shapes: PUT /route body, the server's cross-rank
 * checks, the parallel-info and per-rank answers (cachepd.h; spec 3, 12.2).
 * Bodies are produced the way TokenSpeed's Python produces them (requests'
 * json= and aiohttp's json_response: json.dumps with ", " and ": "). */
#include "dialect/cachepd/cpd_int.h"

#include <stdlib.h>
#include <string.h>

#define P_WHAT "CachePD PUT /route"
#define I_WHAT "CachePD parallel info"

/* ---------------------------------------------------------------- stages */

void kvb__cpd_stages_free(kvb__cpd_stages_t *st)
{
    if (st == NULL)
        return;
    free(st->start);
    free(st->idx);
    memset(st, 0, sizeof(*st));
}

kvb_status_t kvb__cpd_stages_single(const kvb__cpd_contract_t *c, kvb__cpd_stages_t *st_p)
{
    kvb__cpd_stages_t st = {0};
    st.start = calloc(2, sizeof(uint32_t));
    st.idx = calloc(c->nfields ? c->nfields : 1, sizeof(uint32_t));
    if (st.start == NULL || st.idx == NULL) {
        kvb__cpd_stages_free(&st);
        return KVB_ERR_NOMEM;
    }
    st.n = 1;
    st.start[1] = c->nfields;
    for (uint32_t i = 0; i < c->nfields; i++)
        st.idx[i] = i;
    *st_p = st;
    return KVB_OK;
}

bool kvb__cpd_stages_equal(const kvb__cpd_stages_t *a, const kvb__cpd_stages_t *b)
{
    if (a->n != b->n)
        return false;
    for (uint32_t s = 0; s <= a->n; s++)
        if (a->start[s] != b->start[s])
            return false;
    return memcmp(a->idx, b->idx, a->start[a->n] * sizeof(uint32_t)) == 0;
}

/* validate_cache_stage_fields: a non-empty list of lists of strings naming
 * every field of c exactly once. */
static kvb_status_t parse_stages(json_t *v, const kvb__cpd_contract_t *c, const char *what,
                                 kvb__frames_err_t *err, kvb__cpd_stages_t *st_p)
{
    json_t *stage, *id;
    size_t s, k;
    if (!json_is_array(v))
        return kvb__cpd_fail(err, false, 0, "%s: CachePD requires explicit stage field placement",
                             what);
    if (json_array_size(v) == 0 || json_array_size(v) > KVB__CPD_MAX_STAGES)
        return kvb__cpd_fail(err, false, 0,
                             "%s: cache stage placement must cover every logical field exactly "
                             "once (%zu stages)",
                             what, json_array_size(v));
    kvb__cpd_stages_t st = {0};
    bool *seen = calloc(c->nfields + 1, sizeof(bool));
    st.start = calloc(json_array_size(v) + 1, sizeof(uint32_t));
    st.idx = calloc(c->nfields + 1, sizeof(uint32_t));
    kvb_status_t rc = seen && st.start && st.idx ? KVB_OK : KVB_ERR_NOMEM;
    uint32_t total = 0;
    json_array_foreach(v, s, stage)
    {
        if (rc != KVB_OK)
            break;
        if (!json_is_array(stage)) {
            rc = kvb__cpd_fail(err, false, 0, "%s: CachePD requires explicit stage field placement",
                               what);
            break;
        }
        json_array_foreach(stage, k, id)
        {
            int32_t f = json_is_string(id) ? kvb__cpd_field_index(c, json_string_value(id)) : -1;
            if (f < 0 || seen[f] || total >= c->nfields) {
                rc = kvb__cpd_fail(err, false, 0,
                                   "%s: cache stage placement must cover every logical field "
                                   "exactly once (stage %zu entry %zu)",
                                   what, s, k);
                break;
            }
            seen[f] = true;
            st.idx[total++] = (uint32_t)f;
        }
        st.start[s + 1] = total;
    }
    if (rc == KVB_OK && total != c->nfields)
        rc = kvb__cpd_fail(err, false, 0,
                           "%s: cache stage placement must cover every logical field exactly "
                           "once (%u of %u fields)",
                           what, total, c->nfields);
    free(seen);
    if (rc != KVB_OK) {
        kvb__cpd_stages_free(&st);
        return rc;
    }
    st.n = (uint32_t)json_array_size(v);
    *st_p = st;
    return KVB_OK;
}

static void put_stages(kvb__cpd_buf_t *b, const kvb__cpd_contract_t *c, const kvb__cpd_stages_t *st)
{
    kvb__cpd_puts(b, "[");
    for (uint32_t s = 0; s < st->n; s++) {
        kvb__cpd_puts(b, s ? ", [" : "[");
        for (uint32_t k = st->start[s]; k < st->start[s + 1]; k++) {
            const char *id = c->fields[st->idx[k]].field_id;
            if (k > st->start[s])
                kvb__cpd_puts(b, ", ");
            kvb__cpd_put_jstr(b, id, strlen(id));
        }
        kvb__cpd_puts(b, "]");
    }
    kvb__cpd_puts(b, "]");
}

/* ---------------------------------------------------------------- PUT */

void kvb__cpd_put_free(kvb__cpd_put_t *p)
{
    if (p == NULL)
        return;
    kvb__cpd_contract_free(&p->contract);
    kvb__cpd_stages_free(&p->stages);
    memset(p, 0, sizeof(*p));
}

bool kvb__cpd_is_put(const char *body, size_t len)
{
    if (body == NULL || len == 0)
        return false;
    json_t *v = json_loadb(body, len, 0, NULL);
    bool yes = json_is_object(v) && json_object_get(v, "cache_layout") != NULL;
    json_decref(v);
    return yes;
}

/* An integer, or a decimal string (TokenSpeed applies int()), in [min, max]. */
static kvb_status_t get_intlike(json_t *o, const char *what, const char *key, uint64_t min,
                                uint64_t max, kvb__frames_err_t *err, uint64_t *out_p)
{
    json_t *v = json_object_get(o, key);
    int64_t x;
    if (json_is_string(v)) {
        if (!kvb__parse_i64(json_string_value(v), json_string_length(v), (int64_t)min, (int64_t)max,
                            &x))
            return kvb__cpd_fail(err, false, 0, "%s: \"%s\" is not a decimal in [%llu, %llu]", what,
                                 key, (unsigned long long)min, (unsigned long long)max);
        *out_p = (uint64_t)x;
        return KVB_OK;
    }
    return kvb__cpd_get_u64(o, what, key, min, max, err, out_p);
}

static bool ip_char(char ch)
{
    return (ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
           ch == '.' || ch == ':' || ch == '-';
}

static kvb_status_t get_ip(json_t *o, const char *what, kvb__frames_err_t *err,
                           char ip[KVB__CPD_MAX_ENDPOINT + 1])
{
    json_t *v = json_object_get(o, "rank_ip");
    char show[256];
    if (!json_is_string(v))
        return kvb__cpd_fail(err, false, 0, "%s: \"rank_ip\" is missing or not a string", what);
    const char *s = json_string_value(v);
    size_t n = json_string_length(v);
    bool ok = n >= 1 && n <= KVB__CPD_MAX_ENDPOINT;
    for (size_t i = 0; ok && i < n; i++)
        ok = ip_char(s[i]);
    if (!ok)
        return kvb__cpd_fail(err, false, 0, "%s: \"rank_ip\" \"%s\" is not a host", what,
                             kvb__cpd_show(s, n, show));
    memcpy(ip, s, n);
    ip[n] = '\0';
    return KVB_OK;
}

static kvb_status_t put_sizes(json_t *o, kvb__frames_err_t *err, kvb__cpd_put_t *p)
{
    json_t *role = json_object_get(o, "role");
    uint64_t w, d, pp, er, port;
    if (!json_is_string(role) || strcmp(json_string_value(role), "Prefill") != 0)
        return kvb__cpd_fail(err, false, 0, P_WHAT ": \"role\" must be \"Prefill\"");
    KVB__FRAMES_TRY(kvb__cpd_get_u64(o, P_WHAT, "world_size", 1, 1u << 20, err, &w));
    KVB__FRAMES_TRY(kvb__cpd_get_u64(o, P_WHAT, "dp_size", 1, 1u << 20, err, &d));
    KVB__FRAMES_TRY(get_ip(o, P_WHAT, err, p->rank_ip));
    KVB__FRAMES_TRY(get_intlike(o, P_WHAT, "rank_port", 1, 65535, err, &port));
    KVB__FRAMES_TRY(get_intlike(o, P_WHAT, "engine_rank", 0, w - 1, err, &er));
    KVB__FRAMES_TRY(get_intlike(o, P_WHAT, "pp_size", 1, KVB__CPD_MAX_STAGES, err, &pp));
    if (w % (d * pp) != 0 || w / (d * pp) > KVB__CPD_MAX_TP)
        return kvb__cpd_fail(err, false, 0,
                             P_WHAT ": world_size %llu is not dp_size %llu x pp_size %llu x a TP "
                                    "size of 1..%u",
                             (unsigned long long)w, (unsigned long long)d, (unsigned long long)pp,
                             KVB__CPD_MAX_TP);
    p->world_size = (uint32_t)w;
    p->dp_size = (uint32_t)d;
    p->pp_size = (uint32_t)pp;
    p->engine_rank = (uint32_t)er;
    p->rank_port = (uint16_t)port;
    return KVB_OK;
}

/* MooncakeKVBootstrapServer._ingest_put_extra. */
static kvb_status_t put_layout(json_t *o, kvb__frames_err_t *err, kvb__cpd_put_t *p)
{
    json_t *lay = json_object_get(o, "cache_layout"), *st;
    if (!json_is_string(lay))
        return kvb__cpd_fail(err, false, 0, P_WHAT ": CachePD bootstrap layout must be a string");
    kvb__frames_err_t why;
    if (kvb__cpd_contract_parse((const uint8_t *)json_string_value(lay), json_string_length(lay),
                                &why, &p->contract) != KVB_OK)
        return kvb__cpd_fail(err, false, 0, P_WHAT ": CachePD bootstrap layout is invalid: %s",
                             why.reason);
    st = json_object_get(o, "cache_fields_by_stage");
    if (st == NULL)
        return kvb__cpd_fail(err, false, 0, P_WHAT ": missing key \"cache_fields_by_stage\"");
    KVB__FRAMES_TRY(parse_stages(st, &p->contract, P_WHAT, err, &p->stages));
    if (p->stages.n != p->pp_size)
        return kvb__cpd_fail(err, false, 0,
                             P_WHAT ": CachePD placement does not match pipeline stage count (%u "
                                    "stages, pp_size %u)",
                             p->stages.n, p->pp_size);
    return KVB_OK;
}

kvb_status_t kvb__cpd_put_parse(const char *body, size_t len, kvb__frames_err_t *err,
                                kvb__cpd_put_t *p_p)
{
    kvb__cpd_put_t p;
    memset(&p, 0, sizeof(p));
    json_t *o = kvb__cpd_json_load(body, len, P_WHAT, "body", err);
    if (o == NULL)
        return KVB_ERR_PROTO;
    kvb_status_t st =
        json_is_object(o) ? KVB_OK : kvb__cpd_fail(err, false, 0, P_WHAT ": not an object");
    if (st == KVB_OK)
        st = put_sizes(o, err, &p);
    if (st == KVB_OK)
        st = put_layout(o, err, &p);
    json_decref(o);
    if (st != KVB_OK) {
        kvb__cpd_put_free(&p);
        return st;
    }
    *p_p = p;
    return KVB_OK;
}

static void put_kint(kvb__cpd_buf_t *b, const char *key, uint64_t v, bool first)
{
    if (!first)
        kvb__cpd_puts(b, ", ");
    kvb__cpd_put_jstr(b, key, strlen(key));
    kvb__cpd_puts(b, ": ");
    kvb__cpd_put_u64(b, v);
}

/* The canonical contract as a JSON string value. */
static bool put_layout_str(kvb__cpd_buf_t *b, const kvb__cpd_contract_t *c)
{
    char *wire;
    size_t n;
    if (kvb__cpd_contract_encode(c, &wire, &n) != KVB_OK)
        return false;
    kvb__cpd_put_jstr(b, wire, n);
    free(wire);
    return true;
}

kvb_status_t kvb__cpd_put_encode(const kvb__cpd_put_t *p, char **body_p, size_t *len_p)
{
    kvb__cpd_buf_t b = {0};
    kvb__cpd_puts(&b, "{\"role\": \"Prefill\"");
    put_kint(&b, "world_size", p->world_size, false);
    put_kint(&b, "dp_size", p->dp_size, false);
    put_kint(&b, "pp_size", p->pp_size, false);
    kvb__cpd_puts(&b, ", \"cache_fields_by_stage\": ");
    put_stages(&b, &p->contract, &p->stages);
    kvb__cpd_puts(&b, ", \"rank_ip\": ");
    kvb__cpd_put_jstr(&b, p->rank_ip, strlen(p->rank_ip));
    put_kint(&b, "rank_port", p->rank_port, false);
    put_kint(&b, "engine_rank", p->engine_rank, false);
    kvb__cpd_puts(&b, ", \"cache_layout\": ");
    if (!put_layout_str(&b, &p->contract))
        b.oom = true;
    kvb__cpd_puts(&b, "}");
    return kvb__cpd_buf_take(&b, body_p, len_p);
}

/* ---------------------------------------------------------------- server */

void kvb__cpd_boot_free(kvb__cpd_boot_t *b)
{
    if (b == NULL)
        return;
    free(b->canonical);
    kvb__cpd_contract_free(&b->contract);
    kvb__cpd_stages_free(&b->stages);
    memset(b, 0, sizeof(*b));
}

/* A deep copy of the parsed contract, through its canonical text (the
 * parse is the only constructor of the derived fields). */
static kvb_status_t copy_contract(const char *wire, size_t n, kvb__cpd_contract_t *out)
{
    return kvb__cpd_contract_parse((const uint8_t *)wire, n, NULL, out) == KVB_OK ? KVB_OK
                                                                                  : KVB_ERR_NOMEM;
}

static kvb_status_t copy_stages(const kvb__cpd_stages_t *in, kvb__cpd_stages_t *out)
{
    out->start = malloc((in->n + 1) * sizeof(uint32_t));
    out->idx = malloc((in->start[in->n] + 1) * sizeof(uint32_t));
    if (out->start == NULL || out->idx == NULL) {
        kvb__cpd_stages_free(out);
        return KVB_ERR_NOMEM;
    }
    memcpy(out->start, in->start, (in->n + 1) * sizeof(uint32_t));
    memcpy(out->idx, in->idx, in->start[in->n] * sizeof(uint32_t));
    out->n = in->n;
    return KVB_OK;
}

kvb_status_t kvb__cpd_boot_admit(kvb__cpd_boot_t *b, const kvb__cpd_put_t *p,
                                 kvb__frames_err_t *err, uint32_t *dp_group_p, uint32_t *rank_p)
{
    char *wire;
    size_t n;
    KVB__FRAMES_TRY(kvb__cpd_contract_encode(&p->contract, &wire, &n));
    kvb_status_t st = KVB_OK;
    if (b->registered && !kvb__cpd_stages_equal(&b->stages, &p->stages))
        st = kvb__cpd_fail(err, false, 0,
                           "CachePD prefill ranks registered incompatible field placement");
    else if (b->registered && (n != b->canonical_len || memcmp(wire, b->canonical, n) != 0))
        st = kvb__cpd_fail(err, false, 0, "CachePD prefill ranks registered incompatible layouts");
    else if (b->registered && (p->world_size != b->world_size || p->dp_size != b->dp_size))
        st = kvb__cpd_fail(err, false, 0,
                           "CachePD prefill ranks registered different sizes (world %u dp %u, "
                           "first rank: world %u dp %u)",
                           p->world_size, p->dp_size, b->world_size, b->dp_size);
    if (st == KVB_OK && !b->registered) {
        kvb__cpd_boot_t nb = {0};
        st = copy_contract(wire, n, &nb.contract);
        if (st == KVB_OK)
            st = copy_stages(&p->stages, &nb.stages);
        if (st != KVB_OK) {
            kvb__cpd_boot_free(&nb);
            free(wire);
            return st;
        }
        nb.registered = true;
        nb.canonical = wire;
        nb.canonical_len = n;
        nb.world_size = p->world_size;
        nb.dp_size = p->dp_size;
        wire = NULL;
        *b = nb;
    }
    free(wire);
    if (st != KVB_OK)
        return st;
    b->pp_size = p->pp_size;
    uint32_t per_dp = p->world_size / p->dp_size;
    if (dp_group_p != NULL)
        *dp_group_p = p->engine_rank / per_dp;
    if (rank_p != NULL)
        *rank_p = p->engine_rank % per_dp;
    return KVB_OK;
}

kvb_status_t kvb__cpd_boot_parallel_info(const kvb__cpd_boot_t *b, char **body_p, size_t *len_p)
{
    if (!b->registered)
        return KVB_ERR_STATE;
    kvb__cpd_buf_t t = {0};
    kvb__cpd_puts(&t, "{");
    put_kint(&t, "prefill_tp_size", b->world_size, true);
    put_kint(&t, "prefill_dp_size", b->dp_size, false);
    put_kint(&t, "prefill_pp_size", b->pp_size, false);
    kvb__cpd_puts(&t, ", \"cache_layout\": ");
    kvb__cpd_put_jstr(&t, b->canonical, b->canonical_len);
    kvb__cpd_puts(&t, ", \"cache_fields_by_stage\": ");
    put_stages(&t, &b->contract, &b->stages);
    kvb__cpd_puts(&t, "}");
    return kvb__cpd_buf_take(&t, body_p, len_p);
}

/* ---------------------------------------------------------------- client */

void kvb__cpd_pinfo_free(kvb__cpd_pinfo_t *pi)
{
    if (pi == NULL)
        return;
    kvb__cpd_contract_free(&pi->contract);
    kvb__cpd_stages_free(&pi->stages);
    memset(pi, 0, sizeof(*pi));
}

static kvb_status_t pinfo_sizes(json_t *o, kvb__frames_err_t *err, kvb__cpd_pinfo_t *pi)
{
    uint64_t w, d, pp = 1;
    KVB__FRAMES_TRY(get_intlike(o, I_WHAT, "prefill_tp_size", 1, 1u << 20, err, &w));
    KVB__FRAMES_TRY(get_intlike(o, I_WHAT, "prefill_dp_size", 1, 1u << 20, err, &d));
    if (json_object_get(o, "prefill_pp_size") != NULL)
        KVB__FRAMES_TRY(
            get_intlike(o, I_WHAT, "prefill_pp_size", 1, KVB__CPD_MAX_STAGES, err, &pp));
    if (w % (d * pp) != 0 || w / (d * pp) > KVB__CPD_MAX_TP)
        return kvb__cpd_fail(err, false, 0,
                             I_WHAT ": prefill_tp_size %llu is not prefill_dp_size %llu x "
                                    "prefill_pp_size %llu x a TP size of 1..%u",
                             (unsigned long long)w, (unsigned long long)d, (unsigned long long)pp,
                             KVB__CPD_MAX_TP);
    pi->world_size = (uint32_t)w;
    pi->dp_size = (uint32_t)d;
    pi->pp_size = (uint32_t)pp;
    pi->tp_size = (uint32_t)(w / (d * pp));
    return KVB_OK;
}

static kvb_status_t pinfo_layout(json_t *o, kvb__frames_err_t *err, kvb__cpd_pinfo_t *pi)
{
    json_t *lay = json_object_get(o, "cache_layout"), *st;
    if (lay == NULL || json_is_null(lay))
        return kvb__cpd_fail(err, false, 0,
                             I_WHAT ": no cache_layout: Cache-transfer decode connected to a "
                                    "non-cache-transfer prefill");
    if (!json_is_string(lay))
        return kvb__cpd_fail(err, false, 0, I_WHAT ": \"cache_layout\" is not a string");
    kvb__frames_err_t why;
    if (kvb__cpd_contract_parse((const uint8_t *)json_string_value(lay), json_string_length(lay),
                                &why, &pi->contract) != KVB_OK)
        return kvb__cpd_fail(err, false, 0, I_WHAT ": %s", why.reason);
    st = json_object_get(o, "cache_fields_by_stage");
    if (st == NULL || json_is_null(st))
        return kvb__cpd_fail(err, false, 0, I_WHAT ": no \"cache_fields_by_stage\"");
    KVB__FRAMES_TRY(parse_stages(st, &pi->contract, I_WHAT, err, &pi->stages));
    if (pi->stages.n != pi->pp_size)
        return kvb__cpd_fail(err, false, 0,
                             I_WHAT ": CachePD placement does not match pipeline stage count (%u "
                                    "stages, prefill_pp_size %u)",
                             pi->stages.n, pi->pp_size);
    return KVB_OK;
}

kvb_status_t kvb__cpd_pinfo_parse(const char *body, size_t len, kvb__frames_err_t *err,
                                  kvb__cpd_pinfo_t *pi_p)
{
    kvb__cpd_pinfo_t pi;
    memset(&pi, 0, sizeof(pi));
    json_t *o = kvb__cpd_json_load(body, len, I_WHAT, "answer", err);
    if (o == NULL)
        return KVB_ERR_PROTO;
    kvb_status_t st =
        json_is_object(o) ? KVB_OK : kvb__cpd_fail(err, false, 0, I_WHAT ": not an object");
    if (st == KVB_OK)
        st = pinfo_sizes(o, err, &pi);
    if (st == KVB_OK)
        st = pinfo_layout(o, err, &pi);
    json_decref(o);
    if (st != KVB_OK) {
        kvb__cpd_pinfo_free(&pi);
        return st;
    }
    *pi_p = pi;
    return KVB_OK;
}

kvb_status_t kvb__cpd_rank_addr_parse(const char *body, size_t len, kvb__frames_err_t *err,
                                      char ip[KVB__CPD_MAX_ENDPOINT + 1], uint16_t *port_p)
{
    char tmp[KVB__CPD_MAX_ENDPOINT + 1];
    uint64_t port;
    json_t *o = kvb__cpd_json_load(body, len, "CachePD rank address", "answer", err);
    if (o == NULL)
        return KVB_ERR_PROTO;
    kvb_status_t st = json_is_object(o)
                          ? get_ip(o, "CachePD rank address", err, tmp)
                          : kvb__cpd_fail(err, false, 0, "CachePD rank address: not an object");
    if (st == KVB_OK)
        st = get_intlike(o, "CachePD rank address", "rank_port", 1, 65535, err, &port);
    json_decref(o);
    if (st != KVB_OK)
        return st;
    memcpy(ip, tmp, sizeof(tmp));
    *port_p = (uint16_t)port;
    return KVB_OK;
}

kvb_status_t kvb__cpd_rank_addr_encode(const char *ip, uint16_t port, char **body_p, size_t *len_p)
{
    kvb__cpd_buf_t b = {0};
    kvb__cpd_puts(&b, "{\"rank_ip\": ");
    kvb__cpd_put_jstr(&b, ip, strlen(ip));
    put_kint(&b, "rank_port", port, false);
    kvb__cpd_puts(&b, "}");
    return kvb__cpd_buf_take(&b, body_p, len_p);
}
