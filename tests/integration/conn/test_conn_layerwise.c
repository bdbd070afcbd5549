/* Layerwise sends (kvb_sender_send_layers) through a real prefill and
 * decode pair, under the sanitizers too: after the piece of layers [0, 1)
 * settled, that layer's K and V (MLA: its latent) hold the room's bytes and
 * no other buffer of the decode's pages changed (the draft model's layers
 * come only with the piece that ends at the last layer); no Success before
 * the last piece; then every KV byte exact. MHA with a draft layer,
 * and MLA. */
#include "harness/kvb_cluster.h"
#include "kvb_test.h"

#include <string.h>

#define GUARD 0x5A

/* Is buffer b one of layer 0's (its K and V; MLA: its latent)? */
static bool layer0(const kvbh_geom_t *g, int b)
{
    return b == 0 || (!g->mla && b == g->layers);
}

static int run_case(const char *name, const kvbh_geom_t *g, int draft, uint64_t room)
{
    kvbh_knobs_t k = {.draft = draft};
    kvbh_pair_t p;
    kvb_receiver_h rc;
    kvb_sender_h s;
    int32_t src[6], dst[6], n = 6, f = 0;
    CHECK_EQ(kvbh_pair_start(&p, g, KVBH_MEM_MALLOC, &k, &k), KVB_OK);
    kvbh_room_pages(g, room, n, src, dst);
    kvbh_guard_fill(&p.dec, dst, n, 0, GUARD);
    CHECK_EQ(kvbh_pair_room(&p, room, src, dst, n, &rc, &s), KVB_OK);
    uint32_t L = kvb_sender_num_layers(s);
    CHECK_EQ(L, (uint32_t)g->layers);
    CHECK_EQ(kvb_sender_send_layers(s, src, (size_t)n, 0, 1), KVB_OK);
    double t0 = kvbh_now();
    while (kvbh_now() - t0 < 10 &&
           (kvbh_verify_buf(&p.dec, room, 0, dst, n) != 0 ||
            (!g->mla && kvbh_verify_buf(&p.dec, room, g->layers, dst, n) != 0)))
        kvbh_sleep(0.002);
    for (int b = 0; b < p.dec.n_kv; b++) {
        uint64_t x = layer0(g, b) ? kvbh_verify_buf(&p.dec, room, b, dst, n)
                                  : kvbh_guard_bad_buf(&p.dec, b, dst, n, GUARD);
        if (x != 0) {
            fprintf(stderr, "%s: buffer %d after the piece [0, 1): %llu bytes %s\n", name, b,
                    (unsigned long long)x, layer0(g, b) ? "wrong" : "written early");
            f++;
        }
    }
    CHECK(kvb_receiver_poll(rc) != KVB_POLL_SUCCESS);
    CHECK_EQ(kvb_sender_send_layers(s, src, (size_t)n, 0, 1), KVB_ERR_INVALID); /* again */
    CHECK_EQ(kvb_sender_send(s, src, (size_t)n), KVB_ERR_STATE); /* the chunk is open */
    CHECK_EQ(kvb_sender_send_layers(s, src, (size_t)n, 1, L), KVB_OK);
    CHECK_EQ(kvbh_wait_receiver(rc, 20), KVB_POLL_SUCCESS);
    CHECK_EQ(kvbh_wait_sender(s, 20), KVB_POLL_SUCCESS);
    uint64_t bad = kvbh_verify(&p.dec, room, dst, n, -1); /* the pair fills no aux pattern */
    if (bad != 0) {
        fprintf(stderr, "%s: %llu bytes wrong after Success\n", name, (unsigned long long)bad);
        f++;
    }
    CHECK(kvbh_canaries_ok(&p.dec, name));
    kvb_sender_destroy(s);
    kvb_receiver_destroy(rc);
    kvbh_pair_stop(&p);
    if (f == 0)
        printf("ok: %s (layer 0 alone after its piece, %u layers, draft %d)\n", name, L, draft);
    return f;
}

int main(int argc, char **argv)
{
    kvbh_main_init(argc, argv);
    kvbh_geom_t mha = {4, 2, 32, 4, 64, 0, 0}, mla = {3, 1, 64, 4, 64, 1, 0};
    int f = run_case("MHA TP1->TP1, one draft layer", &mha, 1, 7);
    f += run_case("MLA TP1->TP1", &mla, 0, 8);
    return f == 0 ? 0 : 1;
}
