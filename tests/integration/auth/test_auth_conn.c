/* Connector authentication (docs/security.md):
 *  - CURVE on the control channel: rooms complete and verify with CURVE on
 *    every rank; a raw ZeroMQ PUSH peer without keys, or with a key outside
 *    the allowed set, gets nothing delivered (bad_messages unchanged, rooms
 *    unaffected); an allowed key is delivered (the check can see delivery);
 *  - bootstrap token through the connector: a prefill rank without the token
 *    is refused (kvb_manager_create → KVB_ERR_AUTH), with it registers; the
 *    decode's look-ups carry it (server with auth_reads) and rooms verify.
 * Ranks, rooms and verification: the cluster harness (tests/harness), each
 * side with its auth knobs. */
#include "harness/kvb_cluster.h"
#include "kvb_test.h"

#include <kvbridge/bootstrap.h>
#include <zmq.h>

/* Prefill TP 2, decode TP 1, 256 pages; the server with token (and auth_reads). */
static const kvbh_geom_t GEOM = {
    .layers = 4, .heads = 4, .head_bytes = 16, .page = 4, .pool_pages = 256};

static void start(kvbh_cluster_t *c, const char *server_token, const kvbh_knobs_t *pre,
                  const kvbh_knobs_t *dec)
{
    kvbh_cluster_cfg_t cfg = {.g = GEOM,
                              .ptp = 2,
                              .ppp = 1,
                              .pdp = 1,
                              .dtp = 1,
                              .server_token = server_token,
                              .pre = *pre,
                              .dec = *dec};
    CHECK_EQ(kvbh_cluster_start(c, &cfg), KVB_OK);
}

static const kvbh_room_opts_t OPTS = {.chunks = 3, .prefix_pages = 0, .use_mask = 0, .dp_rank = -1};

static uint64_t bad(kvb_manager_h m)
{
    kvb_manager_stats_t s;
    kvb_manager_stats(m, &s);
    return s.bad_messages;
}

/* A raw PUSH peer sends three malformed messages to endpoint ("ip:port");
 * keys NULL = no CURVE, else (server public, client public, client secret). */
static void raw_push(const char *endpoint, const char *const *keys)
{
    static const char *const garbage[2] = {"garbage", "x"};
    static const size_t len[2] = {7, 1};
    kvbh_push_t z;
    CHECK_EQ(kvbh_push_open(&z, endpoint, keys), 0);
    for (int i = 0; i < 3; i++)
        kvbh_push_frames(&z, (const void *const *)garbage, len, 2); /* queued, maybe refused */
    kvbh_sleep(0.6); /* + 0.1 s in the close: to connect, handshake and (if admitted) deliver */
    kvbh_push_close(&z);
}

static void test_curve(void)
{
    char pub[41], sec[41], opub[41], osec[41];
    CHECK_EQ(zmq_curve_keypair(pub, sec), 0);   /* the deployment's key */
    CHECK_EQ(zmq_curve_keypair(opub, osec), 0); /* an outsider's key */
    kvbh_knobs_t au = {.curve_sk = sec};
    kvbh_cluster_t c;
    start(&c, NULL, &au, &au);
    CHECK_EQ(kvbh_run_rooms(&c, 12, 1000, &OPTS), 0);

    kvb_manager_h targets[] = {c.dec[0].mgr, c.pre[0].mgr};
    for (int i = 0; i < 2; i++) {
        kvb_manager_h m = targets[i];
        const char *outsider[] = {pub, opub, osec}, *wrong_server[] = {opub, pub, sec},
                   *member[] = {pub, pub, sec};
        uint64_t before = bad(m);
        raw_push(kvb_manager_endpoint(m), NULL);
        CHECK_EQ(bad(m), before);
        raw_push(kvb_manager_endpoint(m), outsider); /* knows the server key only */
        CHECK_EQ(bad(m), before);
        raw_push(kvb_manager_endpoint(m), wrong_server);
        CHECK_EQ(bad(m), before);
        raw_push(kvb_manager_endpoint(m), member); /* control: delivered */
        CHECK(bad(m) > before);
    }
    CHECK_EQ(kvbh_run_rooms(&c, 12, 2000, &OPTS), 0);
    kvbh_cluster_stop(&c);

    /* A separate client key, admitted through the allowed list. */
    char cpub[41], csec[41], allowed[100];
    CHECK_EQ(zmq_curve_keypair(cpub, csec), 0);
    snprintf(allowed, sizeof(allowed), "%s, %s", pub, cpub);
    kvbh_knobs_t au2 = {.curve_sk = sec, .curve_client_sk = csec, .curve_allowed = allowed};
    start(&c, NULL, &au2, &au2);
    CHECK_EQ(kvbh_run_rooms(&c, 8, 3000, &OPTS), 0);
    kvbh_cluster_stop(&c);

    /* A malformed key is refused at creation. */
    kvbh_knobs_t badkey = {.curve_sk = "not-a-key"};
    kvbh_geom_t g16 = GEOM;
    kvbh_rank_t r;
    g16.pool_pages = 16;
    CHECK_EQ(kvbh_rank_start_at(&r, &g16, NULL, KVB_MODE_DECODE, "127.0.0.1:1", KVBH_MEM_MALLOC,
                                &badkey),
             KVB_ERR_INVALID);
    CHECK_STR_CONTAINS(kvb_manager_last_error(NULL), "CURVE");
}

/* With CURVE off the same raw peer's frames arrive (the seeds' dialect). */
static void test_plain_control(void)
{
    kvbh_knobs_t none = {0};
    kvbh_cluster_t c;
    start(&c, NULL, &none, &none);
    uint64_t before = bad(c.dec[0].mgr);
    raw_push(kvb_manager_endpoint(c.dec[0].mgr), NULL);
    CHECK(bad(c.dec[0].mgr) > before);
    CHECK_EQ(kvbh_run_rooms(&c, 4, 4000, &OPTS), 0);
    kvbh_cluster_stop(&c);
}

static void test_bootstrap_token(void)
{
    kvbh_knobs_t tok = {.bootstrap_token = "s3cr3t-token"}, wrong = {.bootstrap_token = "nope"},
                 none = {0};
    kvbh_cluster_t c;
    start(&c, "s3cr3t-token", &tok, &tok);
    CHECK_EQ(kvbh_run_rooms(&c, 8, 5000, &OPTS), 0);

    /* An extra prefill rank without / with a wrong token is refused. */
    kvbh_place_t tp1 = {.tp = 1, .tp_size = 2, .pp = 0, .pp_size = 1, .dp = 0, .dp_size = 1};
    kvbh_rank_t r;
    CHECK_EQ(kvbh_cluster_rank(&c, &r, &tp1, KVB_MODE_PREFILL, &none), KVB_ERR_AUTH);
    CHECK_STR_CONTAINS(kvb_manager_last_error(NULL), "registration");
    CHECK_EQ(kvbh_cluster_rank(&c, &r, &tp1, KVB_MODE_PREFILL, &wrong), KVB_ERR_AUTH);
    /* The refused registrations changed nothing: rooms still verify. */
    CHECK_EQ(kvbh_run_rooms(&c, 8, 6000, &OPTS), 0);

    /* A decode rank without the token cannot look the prefill up (auth_reads):
     * its receiver polls Failed. */
    kvbh_rank_t d;
    CHECK_EQ(kvbh_cluster_rank(&c, &d, NULL, KVB_MODE_DECODE, &none), KVB_OK);
    kvb_receiver_h rcv;
    CHECK_EQ(kvb_receiver_create(d.mgr, c.boot_addr, 7777, -1, &rcv), KVB_OK);
    CHECK_EQ(kvb_receiver_poll(rcv), KVB_POLL_FAILED);
    kvb_receiver_destroy(rcv);
    kvbh_rank_stop(&d);

    /* The token from KVBRIDGE_BOOTSTRAP_TOKEN when the parameter is unset. */
    setenv("KVBRIDGE_BOOTSTRAP_TOKEN", "s3cr3t-token", 1);
    CHECK_EQ(kvbh_cluster_rank(&c, &r, &tp1, KVB_MODE_PREFILL, &none),
             KVB_OK); /* re-registers tp 1 */
    unsetenv("KVBRIDGE_BOOTSTRAP_TOKEN");
    kvbh_rank_stop(&r);
    kvbh_cluster_stop(&c);
}

int main(void)
{
    unsetenv("KVBRIDGE_BOOTSTRAP_TOKEN");
    unsetenv("KVBRIDGE_CURVE_SECRET_KEY");
    unsetenv("KVBRIDGE_CURVE_CLIENT_SECRET_KEY");
    unsetenv("KVBRIDGE_CURVE_ALLOWED_CLIENTS");
    unsetenv("KVBRIDGE_ENGINE_SECRET");
    test_curve();
    TEST_PASS("CURVE control channel");
    test_plain_control();
    TEST_PASS("CURVE off: the seeds' dialect");
    test_bootstrap_token();
    TEST_PASS("bootstrap token through the connector");
    return 0;
}
