/* A KV-args registration that replaces another decode's (same session id)
 * needs the same CURVE client key (review 2.3): an impostor with another
 * admitted key, pointing the victim's session at shifted addresses inside the
 * victim's own registered memory, is refused and counted, and the victim's
 * rooms keep landing where the victim asked. */
#include <stdio.h>
#include <string.h>
#include <zmq.h>

#include "harness/kvb_cluster.h"
#include "kvb_test.h"
#include "dialect/sglang2025/frames.h"

/* Packed: the victim's layer 1 and aux buffer follow layer 0 directly, so
 * the impostor's shifted pointers are registered memory. */
static const kvbh_geom_t G = {
    .layers = 2, .heads = 1, .head_bytes = 64, .page = 4, .pool_pages = 8, .mla = 1};

static uint64_t impostors(kvb_manager_h m)
{
    kvb_manager_limits_t l = {.field_mask = KVB_MANAGER_LIMITS_REG_IDENTITY};
    kvb_manager_limits(m, &l);
    return l.registrations_impostor;
}

/* The impostor (client key bpub/bsec): the victim's session id, the victim's
 * pool shifted by one layer. */
static void impostor(kvbh_pair_t *p, const char *spub, const char *bpub, const char *bsec)
{
    const char *keys[3] = {spub, bpub, bsec};
    const kvbh_rank_t *d = &p->dec;
    kvbh_push_t z;
    kvb__frames_buf_t b;
    kvb__frames_buf_init(&b);
    CHECK_EQ(kvbh_reg_frames(&b, kvb_engine_session_id(d->eng), kvb_manager_endpoint(d->mgr),
                             (uint64_t)(uintptr_t)d->kv[1], d->buf_len, (size_t)d->n_kv,
                             (uint64_t)(uintptr_t)d->aux, d->item_len),
             KVB_OK);
    CHECK_EQ(kvbh_push_open(&z, kvb_manager_endpoint(p->pre.mgr), keys), 0);
    CHECK_EQ(kvbh_push_send(&z, &b), 0);
    double end = kvbh_now() + 5;
    while (impostors(p->pre.mgr) == 0 && kvbh_now() < end)
        kvbh_sleep(0.005);
    CHECK_EQ(impostors(p->pre.mgr), 1);
    kvbh_push_close(&z);
    kvb__frames_buf_free(&b);
}

int main(void)
{
    char spub[41], ssec[41], apub[41], asec[41], bpub[41], bsec[41], allowed[160];
    kvbh_pair_t p;
    const int32_t src[2] = {0, 1}, dst[2] = {1, 2}, dst2[2] = {5, 6};
    CHECK_EQ(zmq_curve_keypair(spub, ssec), 0); /* the deployment's server key */
    CHECK_EQ(zmq_curve_keypair(apub, asec), 0); /* the victim decode's client key */
    CHECK_EQ(zmq_curve_keypair(bpub, bsec), 0); /* another admitted rank's key */
    snprintf(allowed, sizeof(allowed), "%s,%s,%s", spub, apub, bpub);
    kvbh_knobs_t pre = {.curve_sk = ssec, .curve_allowed = allowed},
                 dec = {.curve_sk = ssec, .curve_client_sk = asec, .curve_allowed = allowed};
    CHECK_EQ(kvbh_pair_start(&p, &G, KVBH_MEM_PACKED, &pre, &dec), KVB_OK);
    /* the victim registers */
    CHECK_EQ(kvbh_run_room_pages(&p.pre, &p.dec, p.boot.addr, 1, src, dst, 2, 0), 0);
    impostor(&p, spub, bpub, bsec);
    /* The victim's next room lands where it asked (every byte of both
     * layers verified), not one layer further. */
    CHECK_EQ(kvbh_run_room_pages(&p.pre, &p.dec, p.boot.addr, 2, src, dst2, 2, 0), 0);
    CHECK(kvbh_canaries_ok(&p.dec, "decode")); /* nothing before or after its buffers */
    TEST_PASS("an impostor registration does not redirect the victim's rooms");
    kvbh_pair_stop(&p);
    return 0;
}
