/* A KV-args registration that replaces another decode's (same session id)
 * needs the same CURVE client key (review 2.3): an impostor with another
 * admitted key, pointing the victim's session at shifted addresses inside the
 * victim's own pool, is refused and counted, and the victim's rooms keep
 * landing where the victim asked. */
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include <zmq.h>

#include "caps_util.h"
#include "caps_wire.h"
#include "kvb_test.h"

static uint64_t impostors(kvb_manager_h m)
{
    kvb_manager_limits_t l = {.field_mask = KVB_MANAGER_LIMITS_REG_IDENTITY};
    kvb_manager_limits(m, &l);
    return l.registrations_impostor;
}

int main(void)
{
    char spub[41], ssec[41], apub[41], asec[41], bpub[41], bsec[41], allowed[160];
    char ip[64];
    uint16_t port;
    caps_pair_t p;
    const int32_t src[2] = {0, 1}, dst[2] = {1, 2}, dst2[2] = {5, 6};
    CHECK_EQ(zmq_curve_keypair(spub, ssec), 0); /* the deployment's server key */
    CHECK_EQ(zmq_curve_keypair(apub, asec), 0); /* the victim decode's client key */
    CHECK_EQ(zmq_curve_keypair(bpub, bsec), 0); /* another admitted rank's key */
    snprintf(allowed, sizeof(allowed), "%s,%s,%s", spub, apub, bpub);
    caps_curve_t pre = {ssec, NULL, allowed}, dec = {ssec, asec, allowed};
    memset(&p, 0, sizeof(p));
    CHECK_EQ(caps_boot_start(&p), 0);
    CHECK_EQ(caps_rank_start(&p, &p.pre, KVB_MODE_PREFILL, &pre), 0);
    CHECK_EQ(caps_rank_start(&p, &p.dec, KVB_MODE_DECODE, &dec), 0);
    CHECK_EQ(caps_room(&p, 1, src, dst, 2, 10), 0); /* the victim registers */

    /* The impostor: same session id, the victim's pool shifted by one layer. */
    caps_push_t z;
    kvb__frames_buf_t b;
    kvb__frames_buf_init(&b);
    caps_endpoint(p.dec.mgr, ip, sizeof(ip), &port);
    caps_reg_frames(&b, kvb_engine_session_id(p.dec.eng), ip, port,
                    (uint64_t)(uintptr_t)(p.dec.mem + CAPS_OFF(1)), CAPS_BUF, CAPS_LAYERS,
                    (uint64_t)(uintptr_t)p.dec.aux);
    caps_push_open(&z, p.pre.mgr, spub, bpub, bsec);
    caps_push_send(&z, &b);
    double end = kvb_test_now_s() + 5;
    while (impostors(p.pre.mgr) == 0 && kvb_test_now_s() < end)
        usleep(5000);
    CHECK_EQ(impostors(p.pre.mgr), 1);
    caps_push_close(&z);
    kvb__frames_buf_free(&b);

    /* The victim's next room lands where it asked (every byte of both
     * layers verified), not one layer further. */
    CHECK_EQ(caps_room(&p, 2, src, dst2, 2, 10), 0);
    TEST_PASS("an impostor registration does not redirect the victim's rooms");
    caps_rank_stop(&p.dec);
    caps_rank_stop(&p.pre);
    kvb_bootstrap_server_stop(p.boot);
    return 0;
}
