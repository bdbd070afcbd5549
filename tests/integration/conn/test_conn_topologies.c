/* Connector topologies: bootstrap + prefill ranks + decode ranks (threads of
 * this process, each rank its own engine and manager); every KV and aux byte
 * verified on every decode rank. */
#include "harness/kvb_cluster.h"
#include "kvb_test.h"

#include <stdlib.h>

typedef struct tcase {
    const char *name;
    kvbh_geom_t g; /* pool of 512 pages */
    int ptp, ppp, pdp, dtp;
    kvbh_room_opts_t o;
} tcase_t;

int main(int argc, char **argv)
{
    static const tcase_t cases[] = {
        {"TP1->TP1", {4, 8, 16, 4, 512, 0, 0}, 1, 1, 1, 1, {3, 0, 0, -1, 0, 0, NULL, 0}},
        {"TP2->TP1", {4, 8, 16, 4, 512, 0, 0}, 2, 1, 1, 1, {2, 0, 0, -1, 0, 0, NULL, 0}},
        {"TP1->TP2", {4, 8, 16, 4, 512, 0, 0}, 1, 1, 1, 2, {2, 0, 0, -1, 0, 0, NULL, 0}},
        {"TP4->TP2", {2, 8, 8, 2, 512, 0, 0}, 4, 1, 1, 2, {3, 0, 0, -1, 0, 0, NULL, 0}},
        {"TP2->TP4", {2, 8, 8, 2, 512, 0, 0}, 2, 1, 1, 4, {3, 0, 0, -1, 0, 0, NULL, 0}},
        {"MLA TP2->TP1", {4, 1, 32, 4, 512, 1, 0}, 2, 1, 1, 1, {2, 0, 0, -1, 0, 0, NULL, 0}},
        {"MLA TP1->TP2", {4, 1, 32, 4, 512, 1, 0}, 1, 1, 1, 2, {2, 0, 0, -1, 0, 0, NULL, 0}},
        {"PP2->PP1", {4, 8, 16, 4, 512, 0, 0}, 1, 2, 1, 1, {2, 0, 0, -1, 0, 0, NULL, 0}},
        {"DP2 by room", {2, 4, 16, 4, 512, 0, 0}, 1, 1, 2, 1, {1, 0, 0, -1, 0, 0, NULL, 0}},
        {"DP2 explicit rank", {2, 4, 16, 4, 512, 0, 0}, 1, 1, 2, 1, {1, 0, 0, 1, 0, 0, NULL, 0}},
        {"GQA TP4 > 2 heads ->TP1",
         {2, 2, 16, 4, 512, 0, 0},
         4,
         1,
         1,
         1,
         {2, 0, 0, -1, 0, 0, NULL, 0}},
        {"prefix skip", {2, 8, 16, 4, 512, 0, 0}, 1, 1, 1, 1, {2, 2, 0, -1, 0, 0, NULL, 0}},
        {"page mask", {2, 8, 16, 4, 512, 0, 0}, 2, 1, 1, 1, {2, 0, 1, -1, 0, 0, NULL, 0}},
        {"uneven chunks", {2, 8, 16, 4, 512, 0, 0}, 1, 1, 1, 1, {7, 0, 0, -1, 0, 0, NULL, 0}},
        /* hybrid models: state buffers (one item per slot, sent with the last chunk) */
        {"state TP1->TP1", {4, 8, 16, 4, 512, 0, 96}, 1, 1, 1, 1, {3, 0, 0, -1, 1, 0, NULL, 0}},
        {"state TP2->TP2, 2 slots",
         {4, 8, 16, 4, 512, 0, 256},
         2,
         1,
         1,
         2,
         {2, 0, 0, -1, 2, 0, NULL, 0}},
        {"state PP2->PP1", {4, 8, 16, 4, 512, 0, 64}, 1, 2, 1, 1, {2, 0, 0, -1, 1, 0, NULL, 0}},
        {"state slot count mismatch fails",
         {2, 8, 16, 4, 512, 0, 64},
         1,
         1,
         1,
         1,
         {2, 0, 0, -1, 1, 1, "state indices", 0}},
        {"state across TP sizes fails",
         {2, 8, 16, 4, 512, 0, 64},
         2,
         1,
         1,
         1,
         {2, 0, 0, -1, 1, 0, "same attention TP size", 0}},
    };
    const char *only = argc > 1 ? argv[1] : NULL;
    int failures = 0;
    srand(12345);
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        const tcase_t *t = &cases[i];
        kvbh_cluster_cfg_t cfg = {
            .g = t->g, .ptp = t->ptp, .ppp = t->ppp, .pdp = t->pdp, .dtp = t->dtp};
        kvbh_cluster_t c;
        if (only != NULL && strstr(t->name, only) == NULL)
            continue;
        CHECK_EQ(kvbh_cluster_start(&c, &cfg), KVB_OK);
        int f = kvbh_run_rooms(&c, 6, 1000 + i * 100, &t->o);
        kvbh_cluster_stop(&c);
        fprintf(stderr, "%s: %s\n", f == 0 ? "ok" : "FAILED", t->name);
        failures += f != 0;
    }
    CHECK_EQ(failures, 0);
    return 0;
}
