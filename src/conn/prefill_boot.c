/* Prefill side: this rank's registration with the bootstrap server (PUT
 * /route), once at the first sender and then every bootstrap_refresh_s on a
 * thread of its own. */
#include "conn/conn_int.h"
#include "proto/bootstrap_proto.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* What this rank tells the bootstrap server (PUT /route); item and unit are
 * the storage of its length arrays, num_kv entries each: TokenSpeed's decode
 * reads one per KV buffer in its buffer order (PROTOCOL-TOKENSPEED.md 3.2;
 * kvbridge's decode reads the first). The unit is one head of one token for
 * MHA and 1 byte for MLA, as TokenSpeed's pools say (spec 1, 8.2). */
static void registration(struct kvb_manager *m, kvb_bootstrap_registration_t *reg, uint64_t *item,
                         uint64_t *unit)
{
    for (uint32_t i = 0; i < m->args.num_kv; i++) {
        item[i] = m->args.kv_item_len;
        unit[i] = m->p.is_mla ? 1 : item[i] / m->args.page_size / m->args.kv_head_num;
    }
    memset(reg, 0, sizeof(*reg));
    /* The 2026 keys go out only when the client speaks 2026: SGLang's 2026
     * server needs page_size (PROTOCOL-SGLANG-2026.md 3.1). "kvbridge": 2
     * (both dialects; SGLang's servers ignore it) lets a kvbridge decode
     * send this rank its extension frames (docs/protocol-frames.md). */
    reg->field_mask = KVB_BOOTSTRAP_REG_KV_ITEM_LENS | KVB_BOOTSTRAP_REG_KV_UNIT_LENS |
                      KVB_BOOTSTRAP_REG_PAGE_SIZE | KVB_BOOTSTRAP_REG_KVBRIDGE;
    reg->page_size = (int32_t)m->args.page_size;
    if (m->kv_dtype[0] != '\0') { /* a decode of another dtype fails the room */
        reg->field_mask |= KVB_BOOTSTRAP_REG_KV_CACHE_DTYPE;
        reg->kv_cache_dtype = m->kv_dtype;
    }
    reg->attn_tp_size = m->p.attn_tp_size;
    reg->attn_tp_rank = m->p.attn_tp_rank;
    reg->attn_dp_size = m->p.attn_dp_size;
    reg->attn_dp_rank = m->p.attn_dp_rank;
    reg->pp_size = m->p.pp_size;
    reg->pp_rank = m->p.pp_rank;
    reg->system_dp_size = m->p.system_dp_size;
    reg->system_dp_rank = m->p.system_dp_rank;
    reg->rank_ip = m->host;
    reg->rank_port = m->port;
    reg->kv_item_lens = (kvb_bootstrap_lens_t){item, m->args.num_kv};
    reg->kv_unit_lens = (kvb_bootstrap_lens_t){unit, m->args.num_kv};
}

/* kvbridge's registration, then the dialects' own shapes (m->boot_puts):
 * KVB_OK when the server took any (kvbridge's server takes all; a
 * TokenSpeed 0.1.1 server only its own, refusing kvbridge's with a 500).
 * quiet: a refresh, whose refusals of an extra shape were logged at start. */
static kvb_status_t register_all(struct kvb_manager *m, kvb_bootstrap_client_h c,
                                 const kvb_bootstrap_registration_t *reg, double timeout_s,
                                 bool quiet, char *why, size_t wl)
{
    kvb_status_t st = kvb_bootstrap_client_register(c, reg, timeout_s);
    kvb__count_boot(m, st);
    snprintf(why, wl, "%s", st == KVB_OK ? "" : kvb_bootstrap_client_last_error(c));
    for (size_t i = 0; i < m->n_boot_puts; i++) {
        kvb_status_t x = kvb__bootstrap_client_put_route(c, m->boot_puts[i], timeout_s);
        kvb__count_boot(m, x);
        if (x != KVB_OK && !quiet)
            KVB_LOGI("manager %s: bootstrap server %s refused registration shape %zu: %s",
                     m->endpoint, m->bootstrap_addr, i + 1, kvb_bootstrap_client_last_error(c));
        st = x == KVB_OK ? KVB_OK : st;
    }
    return st;
}

void kvb__prefill_boot_free(struct kvb_manager *m)
{
    for (size_t i = 0; i < m->n_boot_puts; i++)
        free(m->boot_puts[i]);
    free(m->boot_puts);
    m->boot_puts = NULL;
    m->n_boot_puts = 0;
}

kvb_status_t kvb__prefill_register(struct kvb_manager *m)
{
    char why[512];
    kvb_bootstrap_client_h c;
    kvb_bootstrap_registration_t reg;
    uint64_t *lens = calloc(2 * (size_t)m->args.num_kv + 2, sizeof(uint64_t));
    kvb_status_t st =
        lens == NULL ? KVB_ERR_NOMEM : kvb__bootstrap_client(m, m->bootstrap_addr, &c);
    if (st != KVB_OK) {
        free(lens);
        return kvb__err_set(&m->err, st, "bootstrap address \"%s\" is invalid", m->bootstrap_addr);
    }
    registration(m, &reg, lens, lens + m->args.num_kv + 1);
    st = register_all(m, c, &reg, 5.0, false, why, sizeof(why));
    free(lens);
    if (st != KVB_OK)
        kvb__err_set(&m->err, st, "registration with bootstrap server %s failed: %s",
                     m->bootstrap_addr, why);
    kvb_bootstrap_client_destroy(c);
    return st;
}

/* ---- periodic re-registration ----
 * A bootstrap server that was restarted (kill -9, a new pod on the same
 * address) starts with an empty table; PUT /route is idempotent, so every
 * rank simply registers again every bootstrap_refresh_s. The PUT runs on this
 * thread with a short time-out, never on the control thread or a worker. */

typedef struct refresh {
    kvb_bootstrap_client_h client;
    kvb_bootstrap_registration_t reg;
    uint64_t *lens; /* the registration's item then unit lengths */
    double timeout_s;
    double down_since; /* 0: the last attempt succeeded */
    int attempts;      /* failed attempts of the current outage */
} refresh_t;

static void refresh_once(struct kvb_manager *m, refresh_t *r)
{
    char why[512];
    kvb_status_t st = register_all(m, r->client, &r->reg, r->timeout_s, true, why, sizeof(why));
    double now = kvb__now_s();
    if (st != KVB_OK && r->down_since == 0) {
        KVB_LOGW("manager %s: re-registration with bootstrap server %s failed: %s (retried "
                 "every %.3g s; logged once per outage)",
                 m->endpoint, m->bootstrap_addr, why, m->p.bootstrap_refresh_s);
        r->down_since = now;
    }
    if (st != KVB_OK) {
        r->attempts++;
        return;
    }
    if (r->down_since != 0)
        KVB_LOGI("manager %s: registered with bootstrap server %s again after %.1f s (%d failed "
                 "attempts)",
                 m->endpoint, m->bootstrap_addr, now - r->down_since, r->attempts);
    r->down_since = 0;
    r->attempts = 0;
}

static void *refresh_main(void *arg)
{
    struct kvb_manager *m = arg;
    refresh_t r = {0};
    double interval = m->p.bootstrap_refresh_s, next = kvb__now_s() + interval;
    r.lens = calloc(2 * (size_t)m->args.num_kv + 2, sizeof(uint64_t));
    if (r.lens == NULL || kvb__bootstrap_client(m, m->bootstrap_addr, &r.client) != KVB_OK) {
        free(r.lens);
        return NULL; /* the address was valid at creation: out of memory */
    }
    registration(m, &r.reg, r.lens, r.lens + m->args.num_kv + 1);
    r.timeout_s = interval < 1.0 ? interval : 1.0;
    while (!__atomic_load_n(&m->stop, __ATOMIC_ACQUIRE)) {
        double now = kvb__now_s();
        if (now < next) {
            double left = next - now;
            usleep(left < 0.02 ? (useconds_t)(left * 1e6) : 20000);
            continue;
        }
        refresh_once(m, &r);
        next += interval;
        if (next < kvb__now_s())
            next = kvb__now_s() + interval;
    }
    kvb_bootstrap_client_destroy(r.client);
    free(r.lens);
    return NULL;
}

kvb_status_t kvb__prefill_refresh_start(struct kvb_manager *m)
{
    if (!(m->p.bootstrap_refresh_s > 0))
        return KVB_OK;
    if (pthread_create(&m->ref_thr, NULL, refresh_main, m) != 0)
        return kvb__err_set(&m->err, KVB_ERR_IO, "cannot start the bootstrap refresh thread");
    m->ref_started = 1;
    return KVB_OK;
}

void kvb__prefill_refresh_stop(struct kvb_manager *m)
{
    if (m->ref_started)
        pthread_join(m->ref_thr, NULL);
    m->ref_started = 0;
}
