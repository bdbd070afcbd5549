/* kvbridge's bootstrap server hosting TokenSpeed 0.1.1 (CachePD) prefill
 * ranks (spec 3, 12.2; proto/bootstrap_proto.h): their PUT /route bodies
 * (told apart by "cache_layout"), TokenSpeed's cross-rank checks, the table
 * (DP group, stage-major rank) -> address, and the answers a CachePD decode
 * reads. Called by the route table (bootstrap/server.c) under its lock;
 * the last two functions by the client (bootstrap/client.c). */
#include "dialect/cachepd/cpd_int.h"
#include "proto/bootstrap_proto.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_ENTRIES 65536 /* the route table's own cap */

typedef struct entry {
    uint32_t dp, rank; /* DP group, stage-major rank in it */
    char ip[KVB__CPD_MAX_ENDPOINT + 1];
    uint16_t port;
} entry_t;

struct kvb__boot_cpd {
    kvb__cpd_boot_t b; /* sizes, canonical contract, placement */
    entry_t *e;
    size_t n, cap;
};

bool kvb__boot_is_cpd_put(const char *body, size_t len)
{
    return kvb__cpd_is_put(body, len);
}

void kvb__boot_cpd_free(kvb__boot_cpd_t *st)
{
    if (st == NULL)
        return;
    kvb__cpd_boot_free(&st->b);
    free(st->e);
    free(st);
}

static entry_t *find(const kvb__boot_cpd_t *st, uint32_t dp, uint32_t rank)
{
    for (size_t i = 0; st != NULL && i < st->n; i++)
        if (st->e[i].dp == dp && st->e[i].rank == rank)
            return &st->e[i];
    return NULL;
}

/* Room for one more entry (a re-registration overwrites its own). */
static bool room_for(kvb__boot_cpd_t *st, uint32_t dp, uint32_t rank)
{
    if (find(st, dp, rank) != NULL || st->n < st->cap)
        return true;
    size_t cap = st->cap ? 2 * st->cap : 16;
    entry_t *e = cap <= MAX_ENTRIES ? realloc(st->e, cap * sizeof(*e)) : NULL;
    if (e == NULL)
        return false;
    st->e = e;
    st->cap = cap;
    return true;
}

static void put_entry(kvb__boot_cpd_t *st, uint32_t dp, uint32_t rank, const kvb__cpd_put_t *p)
{
    entry_t *e = find(st, dp, rank);
    if (e == NULL) {
        e = &st->e[st->n++];
        e->dp = dp;
        e->rank = rank;
    }
    snprintf(e->ip, sizeof(e->ip), "%s", p->rank_ip);
    e->port = p->rank_port;
}

/* Admitted atomically: a refusal (TokenSpeed's texts) leaves the state as
 * it was. */
kvb_status_t kvb__boot_cpd_put(kvb__boot_cpd_t **st_p, const char *body, size_t len, char *reason,
                               size_t reason_len)
{
    kvb__frames_err_t e;
    kvb__cpd_put_t p;
    uint32_t dp, rank;
    if (*st_p == NULL && (*st_p = calloc(1, sizeof(**st_p))) == NULL)
        return KVB_ERR_NOMEM;
    kvb__boot_cpd_t *st = *st_p;
    kvb_status_t rc = kvb__cpd_put_parse(body, len, &e, &p);
    if (rc != KVB_OK) {
        kvb__boot_reason(reason, reason_len, "%s", rc == KVB_ERR_PROTO ? e.reason : "no memory");
        return rc;
    }
    uint32_t group = p.world_size / p.dp_size;
    if (!room_for(st, p.engine_rank / group, p.engine_rank % group)) {
        kvb__cpd_put_free(&p);
        kvb__boot_reason(reason, reason_len, "CachePD table full or out of memory");
        return KVB_ERR_PROTO;
    }
    rc = kvb__cpd_boot_admit(&st->b, &p, &e, &dp, &rank);
    if (rc == KVB_OK)
        put_entry(st, dp, rank, &p);
    else
        kvb__boot_reason(reason, reason_len, "%s", rc == KVB_ERR_PROTO ? e.reason : "no memory");
    kvb__cpd_put_free(&p);
    return rc;
}

bool kvb__boot_cpd_active(const kvb__boot_cpd_t *st)
{
    return st != NULL && st->b.registered;
}

size_t kvb__boot_cpd_count(const kvb__boot_cpd_t *st)
{
    return st != NULL ? st->n : 0;
}

char *kvb__boot_cpd_info(const kvb__boot_cpd_t *st, json_t *base, bool *nomem_p)
{
    char *text = NULL;
    size_t len;
    *nomem_p = false;
    if (!kvb__boot_cpd_active(st))
        return NULL;
    if (kvb__cpd_boot_parallel_info(&st->b, &text, &len) != KVB_OK) {
        *nomem_p = true;
        return NULL;
    }
    if (base == NULL)
        return text; /* TokenSpeed's server's bytes */
    /* Ranks of other dialects registered too (kvbridge prefills speak them
     * all): their keys, and the two a CachePD decode needs. */
    json_t *o = json_loads(text, 0, NULL);
    free(text);
    json_t *u = json_copy(base);
    bool ok = o != NULL && u != NULL &&
              json_object_set(u, "cache_layout", json_object_get(o, "cache_layout")) == 0 &&
              json_object_set(u, "cache_fields_by_stage",
                              json_object_get(o, "cache_fields_by_stage")) == 0;
    text = ok ? json_dumps(u, JSON_COMPACT) : NULL;
    json_decref(o);
    json_decref(u);
    *nomem_p = text == NULL;
    return text;
}

json_t *kvb__boot_cpd_rank(const kvb__boot_cpd_t *st, int64_t dp, int64_t rank)
{
    const entry_t *e = dp < 0 || rank < 0 || dp > UINT32_MAX || rank > UINT32_MAX
                           ? NULL
                           : find(st, (uint32_t)dp, (uint32_t)rank);
    if (e == NULL)
        return NULL;
    return json_pack("{s:s, s:I}", "rank_ip", e->ip, "rank_port", (json_int_t)e->port);
}

bool kvb__boot_answer_is_cpd(const char *body, size_t len)
{
    json_t *o = len > 0 && len <= KVB_BOOTSTRAP_MAX_BODY ? json_loadb(body, len, 0, NULL) : NULL;
    bool cpd = json_is_string(json_object_get(o, "cache_layout")) &&
               json_is_array(json_object_get(o, "cache_fields_by_stage")) &&
               json_object_get(o, "prefill_attn_tp_size") == NULL;
    json_decref(o);
    return cpd;
}

kvb_status_t kvb__boot_parallel_info_parse_cpd(const char *body, size_t len,
                                               kvb_bootstrap_parallel_info_t *info_p, char *reason,
                                               size_t reason_len)
{
    kvb__cpd_pinfo_t pi;
    kvb__frames_err_t e;
    kvb_status_t st = kvb__cpd_pinfo_parse(body, len, &e, &pi);
    if (st != KVB_OK) {
        kvb__boot_reason(reason, reason_len, "%s",
                         st == KVB_ERR_PROTO ? e.reason : kvb_status_string(st));
        return st;
    }
    memset(info_p, 0, sizeof(*info_p));
    info_p->attn_tp_size = (int32_t)pi.tp_size;
    info_p->dp_size = (int32_t)pi.dp_size;
    info_p->pp_size = (int32_t)pi.pp_size;
    kvb__cpd_pinfo_free(&pi);
    return KVB_OK;
}
