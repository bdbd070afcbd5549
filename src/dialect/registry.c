/* The dialects kvbridge speaks, in the order a message is offered to them:
 * TokenSpeed 0.1.1's CachePD first (an 8-frame registration whose frame 5
 * is a JSON object, a 3-frame request: shapes no other dialect sends to a
 * prefill, PROTOCOL-TOKENSPEED-CACHEPD.md 12.4), then TokenSpeed's seed 004
 * (told apart by frame counts and contents that neither SGLang dialect
 * uses, spec 11.4), then SGLang's seed 001 and 2026 (told apart by
 * kvb__frames_classify). Adding a dialect is one line here
 * (docs/architecture.md, "Adding a dialect"). */
#include "dialect/cachepd/adapter.h"
#include "dialect/sglang2025/sglang.h"
#include "dialect/sglang2026/sglang2026.h"
#include "dialect/tokenspeed_seed/tokenspeed_seed.h"

#include <stdlib.h>

static const kvb__dialect_t *const dialects[] = {
    &kvb__dialect_cachepd,
    &kvb__dialect_tokenspeed_seed,
    &kvb__dialect_sglang2025,
    &kvb__dialect_sglang2026,
};
#define N_DIALECTS (sizeof(dialects) / sizeof(dialects[0]))

const kvb__dialect_t *kvb__dialect_classify(struct kvb_manager *m, const kvb__frame_t *f, size_t n,
                                            kvb__dmsg_t *kind_p)
{
    for (size_t i = 0; i < N_DIALECTS; i++) {
        kvb__dmsg_t k = dialects[i]->classify(m, f, n);
        if (k != KVB__DMSG_NONE) {
            *kind_p = k;
            return dialects[i];
        }
    }
    *kind_p = KVB__DMSG_NONE;
    return NULL;
}

const kvb__dialect_t *kvb__dialect_for_boot(int boot_dialect)
{
    for (size_t i = 0; i < N_DIALECTS; i++)
        if (dialects[i]->boot_dialect == boot_dialect)
            return dialects[i];
    return &kvb__dialect_sglang2025; /* a seed-001 answer names no dialect */
}

char **kvb__dialect_boot_puts(struct kvb_manager *m, size_t *n_p)
{
    char **v = calloc(N_DIALECTS, sizeof(*v));
    *n_p = 0;
    for (size_t i = 0; v != NULL && i < N_DIALECTS; i++)
        if (dialects[i]->boot_put != NULL && (v[*n_p] = dialects[i]->boot_put(m)) != NULL)
            (*n_p)++;
    return v;
}

kvb_status_t kvb__dialect_check_manager(const struct kvb_manager *m, char *why, size_t wl)
{
    for (size_t i = 0; i < N_DIALECTS; i++) {
        kvb_status_t st =
            dialects[i]->check_manager != NULL ? dialects[i]->check_manager(m, why, wl) : KVB_OK;
        if (st != KVB_OK)
            return st;
    }
    return KVB_OK;
}

const kvb__dialect_t *kvb__dialect_default(void)
{
    return &kvb__dialect_sglang2025;
}

void kvb__dialect_unexpected(struct kvb_manager *m, const kvb__frame_t *f, size_t n)
{
    kvb__conn_bad_message(m, kvb__frames_kind_name(kvb__frames_classify(f, n)), NULL);
}
