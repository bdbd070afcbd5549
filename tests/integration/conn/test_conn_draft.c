/* Draft-model (speculative decoding) KV through the connector: both sides
 * declare draft_layers, their draft K/V buffers appended after the target's
 * (K target, V target, K draft, V draft; MLA: target, draft). Every KV and
 * aux byte is verified on every decode rank, draft layers carrying their own
 * pattern (so a draft buffer written from a target one is caught); a decode
 * holding another draft count fails with the prefill's reason and no byte of
 * its pools written. */
#include "harness/kvb_cluster.h"
#include "kvb_test.h"

#include <string.h>

typedef struct tcase {
    const char *name;
    kvbh_geom_t g; /* layers, heads, head_bytes, page, pool, mla, state */
    int ptp, dtp, pre_draft, dec_draft;
    const char *expect_fail;
} tcase_t;

/* Bytes of r's KV pools that are not their initial zeros. */
static uint64_t written(const kvbh_rank_t *r)
{
    uint64_t n = 0;
    for (int b = 0; b < r->n_kv; b++)
        for (uint64_t k = 0; k < r->buf_len; k++)
            n += r->kv[b][k] != 0;
    return n;
}

static int run_case(const tcase_t *t, uint64_t first_room)
{
    kvbh_cluster_cfg_t cfg = {.g = t->g, .ptp = t->ptp, .ppp = 1, .pdp = 1, .dtp = t->dtp};
    kvbh_room_opts_t o = {.chunks = 2, .dp_rank = -1, .expect_fail = t->expect_fail};
    kvbh_cluster_t c;
    cfg.pre.draft = t->pre_draft;
    cfg.dec.draft = t->dec_draft;
    CHECK_EQ(kvbh_cluster_start(&c, &cfg), KVB_OK);
    int f = kvbh_run_rooms(&c, 4, first_room, &o);
    for (int d = 0; t->expect_fail != NULL && d < c.dtp; d++)
        if (written(&c.dec[d]) != 0) {
            fprintf(stderr, "decode %d: %llu bytes written by refused rooms\n", d,
                    (unsigned long long)written(&c.dec[d]));
            f++;
        }
    kvbh_cluster_stop(&c);
    return f;
}

int main(int argc, char **argv)
{
    static const tcase_t cases[] = {
        {"draft TP1->TP1", {3, 4, 16, 4, 256, 0, 0}, 1, 1, 1, 1, NULL},
        {"draft TP2->TP1", {2, 4, 16, 4, 256, 0, 0}, 2, 1, 2, 2, NULL},
        {"draft TP1->TP2", {2, 4, 16, 4, 256, 0, 0}, 1, 2, 1, 1, NULL},
        {"draft MLA TP2->TP1", {3, 1, 32, 4, 256, 1, 0}, 2, 1, 2, 2, NULL},
        {"draft with state TP1->TP1", {2, 4, 16, 4, 256, 0, 64}, 1, 1, 1, 1, NULL},
        {"draft count mismatch fails",
         {2, 4, 16, 4, 256, 0, 0},
         1,
         1,
         1,
         2,
         "the decode's 2 draft layers do not match"},
        {"draft on the decode only fails",
         {2, 4, 16, 4, 256, 0, 0},
         1,
         1,
         0,
         1,
         "this prefill's model has 2 target + 0 draft layers"},
        {"draft on the prefill only fails",
         {2, 4, 16, 4, 256, 0, 0},
         1,
         1,
         1,
         0,
         "registered KV buffers for 2 layers, this prefill's model has 2 target + 1 draft"},
    };
    const char *only = argc > 1 ? argv[1] : NULL;
    int failures = 0;
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        if (only != NULL && strstr(cases[i].name, only) == NULL)
            continue;
        int f = run_case(&cases[i], 3000 + i * 100);
        fprintf(stderr, "%s: %s\n", f == 0 ? "ok" : "FAILED", cases[i].name);
        failures += f != 0;
    }
    CHECK_EQ(failures, 0);
    return 0;
}
