/* Connector authentication (docs/security.md):
 *  - CURVE on the control channel: rooms complete and verify with CURVE on
 *    every rank; a raw ZeroMQ PUSH peer without keys, or with a key outside
 *    the allowed set, gets nothing delivered (bad_messages unchanged, rooms
 *    unaffected); an allowed key is delivered (the check can see delivery);
 *  - bootstrap token through the connector: a prefill rank without the token
 *    is refused (kvb_manager_create → KVB_ERR_AUTH), with it registers; the
 *    decode's look-ups carry it (server with auth_reads) and rooms verify.
 * Reuses tests/integration/conn/cluster.c's pattern, verifier and run_rooms;
 * ranks are built here so each gets the auth parameters. */
#include "../conn/cluster.h"
#include "kvb_test.h"

#include <kvbridge/bootstrap.h>
#include <unistd.h>
#include <zmq.h>

typedef struct auth {
    const char *token; /* manager bootstrap_token, NULL: not set */
    const char *curve_sk, *curve_client_sk, *curve_allowed;
} auth_t;

static const model_t MODEL = {.layers = 4, .heads = 4, .head_bytes = 16, .page = 4, .mla = 0};

static kvb_status_t rank_start(cluster_t *c, rank_t *r, kvb_mode_t mode, const auth_t *au)
{
    const model_t *m = &c->m;
    kvb_manager_params_t mp = {0};
    kvb_kv_args_t a = {0};
    r->local_heads = m->heads / r->tp_size;
    r->first_head = r->tp * r->local_heads;
    r->n_layers = m->layers / r->pp_size;
    r->first_layer = r->pp * r->n_layers;
    r->item_len = (uint64_t)m->page * (uint64_t)r->local_heads * (uint64_t)m->head_bytes;
    r->n_kv = 2 * r->n_layers;
    r->pool_pages = c->pool_pages;
    r->kv = calloc((size_t)r->n_kv, sizeof(*r->kv));
    uint64_t ptrs[64], lens[64];
    for (int i = 0; i < r->n_kv; i++) {
        r->kv[i] = calloc(1, r->pool_pages * r->item_len);
        ptrs[i] = (uint64_t)(uintptr_t)r->kv[i];
        lens[i] = r->pool_pages * r->item_len;
    }
    r->aux = calloc(AUX_ITEMS, AUX_ITEM);
    uint64_t aux_ptr = (uint64_t)(uintptr_t)r->aux, aux_len = AUX_ITEMS * AUX_ITEM,
             aux_item = AUX_ITEM;
    a.kv_data_ptrs = ptrs;
    a.kv_data_lens = lens;
    a.num_kv = (uint32_t)r->n_kv;
    a.kv_item_len = r->item_len;
    a.aux_data_ptrs = &aux_ptr;
    a.aux_data_lens = &aux_len;
    a.aux_item_lens = &aux_item;
    a.num_aux = 1;
    a.page_size = (uint32_t)m->page;
    a.kv_head_num = (uint32_t)r->local_heads;
    a.engine_rank = r->tp;
    a.prefill_start_layer = (uint32_t)r->first_layer;
    a.num_layers_total = (uint32_t)m->layers;
    CHECK_EQ(kvb_engine_create(NULL, &r->eng), KVB_OK);
    mp.field_mask = KVB_MANAGER_PARAM_BOOTSTRAP_ADDR | KVB_MANAGER_PARAM_THREADS;
    mp.mode = mode;
    mp.kv_args = &a;
    mp.engine = r->eng;
    mp.attn_tp_size = r->tp_size;
    mp.attn_tp_rank = r->tp;
    mp.attn_dp_size = 1;
    mp.pp_size = r->pp_size;
    mp.pp_rank = r->pp;
    mp.system_dp_size = 1;
    mp.bootstrap_addr = c->boot_addr;
    mp.transfer_threads = 2;
    mp.transfer_queues = 2;
    if (au->token != NULL) {
        mp.field_mask |= KVB_MANAGER_PARAM_BOOTSTRAP_TOKEN;
        mp.bootstrap_token = au->token;
    }
    if (au->curve_sk != NULL) {
        mp.field_mask |= KVB_MANAGER_PARAM_CURVE;
        mp.curve_secret_key = au->curve_sk;
        mp.curve_client_secret_key = au->curve_client_sk;
        mp.curve_allowed_clients = au->curve_allowed;
    }
    kvb_status_t st = kvb_manager_create(&mp, &r->mgr);
    if (st != KVB_OK) {
        kvb_engine_destroy(r->eng);
        for (int i = 0; i < r->n_kv; i++)
            free(r->kv[i]);
        free(r->kv);
        free(r->aux);
    }
    return st;
}

static void rank_stop(rank_t *r)
{
    kvb_manager_destroy(r->mgr);
    kvb_engine_destroy(r->eng);
    for (int i = 0; i < r->n_kv; i++)
        free(r->kv[i]);
    free(r->kv);
    free(r->aux);
}

/* Prefill TP 2, decode TP 1; the server with token (and auth_reads). */
static void start(cluster_t *c, const char *server_token, const auth_t *pre, const auth_t *dec)
{
    kvb_bootstrap_server_params_t bp = {0};
    memset(c, 0, sizeof(*c));
    c->m = MODEL;
    c->ptp = 2;
    c->ppp = 1;
    c->pdp = 1;
    c->dtp = 1;
    c->pool_pages = 256;
    bp.field_mask = KVB_BOOTSTRAP_SERVER_PARAM_PORT | KVB_BOOTSTRAP_SERVER_PARAM_TOKEN |
                    KVB_BOOTSTRAP_SERVER_PARAM_AUTH_READS;
    bp.token = server_token;
    bp.auth_reads = server_token != NULL;
    CHECK_EQ(kvb_bootstrap_server_start(&bp, &c->boot), KVB_OK);
    snprintf(c->boot_addr, sizeof(c->boot_addr), "%s", kvb_bootstrap_server_address(c->boot));
    c->pre = calloc(2, sizeof(rank_t));
    c->dec = calloc(1, sizeof(rank_t));
    for (int t = 0; t < 2; t++) {
        c->pre[t] = (rank_t){.tp = t, .tp_size = 2, .pp = 0, .pp_size = 1};
        CHECK_EQ(rank_start(c, &c->pre[t], KVB_MODE_PREFILL, pre), KVB_OK);
    }
    c->dec[0] = (rank_t){.tp = 0, .tp_size = 1, .pp = 0, .pp_size = 1};
    CHECK_EQ(rank_start(c, &c->dec[0], KVB_MODE_DECODE, dec), KVB_OK);
}

static void stop(cluster_t *c)
{
    rank_stop(&c->dec[0]);
    for (int t = 0; t < 2; t++)
        rank_stop(&c->pre[t]);
    free(c->pre);
    free(c->dec);
    kvb_bootstrap_server_stop(c->boot);
}

static const room_opts_t OPTS = {.chunks = 3, .prefix_pages = 0, .use_mask = 0, .dp_rank = -1};

static uint64_t bad(kvb_manager_h m)
{
    kvb_manager_stats_t s;
    kvb_manager_stats(m, &s);
    return s.bad_messages;
}

/* A raw PUSH peer sends three malformed messages to endpoint ("ip:port");
 * keys NULL = no CURVE, else (server public, client public, client secret). */
static void raw_push(void *zctx, const char *endpoint, const char *const *keys)
{
    char ep[128];
    int zero = 0;
    void *s = zmq_socket(zctx, ZMQ_PUSH);
    CHECK(s != NULL);
    zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof(zero));
    if (keys != NULL) {
        CHECK_EQ(zmq_setsockopt(s, ZMQ_CURVE_SERVERKEY, keys[0], 40), 0);
        CHECK_EQ(zmq_setsockopt(s, ZMQ_CURVE_PUBLICKEY, keys[1], 40), 0);
        CHECK_EQ(zmq_setsockopt(s, ZMQ_CURVE_SECRETKEY, keys[2], 40), 0);
    }
    snprintf(ep, sizeof(ep), "tcp://%s", endpoint);
    CHECK_EQ(zmq_connect(s, ep), 0);
    for (int i = 0; i < 3; i++) {
        zmq_send(s, "garbage", 7, ZMQ_SNDMORE | ZMQ_DONTWAIT);
        zmq_send(s, "x", 1, ZMQ_DONTWAIT);
    }
    usleep(700 * 1000); /* time to connect, handshake and (if admitted) deliver */
    zmq_close(s);
}

static void test_curve(void)
{
    char pub[41], sec[41], opub[41], osec[41];
    CHECK_EQ(zmq_curve_keypair(pub, sec), 0);   /* the deployment's key */
    CHECK_EQ(zmq_curve_keypair(opub, osec), 0); /* an outsider's key */
    auth_t au = {.curve_sk = sec};
    cluster_t c;
    start(&c, NULL, &au, &au);
    CHECK_EQ(run_rooms(&c, 12, 1000, &OPTS), 0);

    void *zctx = zmq_ctx_new();
    kvb_manager_h targets[] = {c.dec[0].mgr, c.pre[0].mgr};
    for (int i = 0; i < 2; i++) {
        kvb_manager_h m = targets[i];
        const char *outsider[] = {pub, opub, osec}, *wrong_server[] = {opub, pub, sec},
                   *member[] = {pub, pub, sec};
        uint64_t before = bad(m);
        raw_push(zctx, kvb_manager_endpoint(m), NULL);
        CHECK_EQ(bad(m), before);
        raw_push(zctx, kvb_manager_endpoint(m), outsider); /* knows the server key only */
        CHECK_EQ(bad(m), before);
        raw_push(zctx, kvb_manager_endpoint(m), wrong_server);
        CHECK_EQ(bad(m), before);
        raw_push(zctx, kvb_manager_endpoint(m), member); /* control: delivered */
        CHECK(bad(m) > before);
    }
    zmq_ctx_term(zctx);
    CHECK_EQ(run_rooms(&c, 12, 2000, &OPTS), 0);
    stop(&c);

    /* A separate client key, admitted through the allowed list. */
    char cpub[41], csec[41], allowed[100];
    CHECK_EQ(zmq_curve_keypair(cpub, csec), 0);
    snprintf(allowed, sizeof(allowed), "%s, %s", pub, cpub);
    auth_t au2 = {.curve_sk = sec, .curve_client_sk = csec, .curve_allowed = allowed};
    start(&c, NULL, &au2, &au2);
    CHECK_EQ(run_rooms(&c, 8, 3000, &OPTS), 0);
    stop(&c);

    /* A malformed key is refused at creation. */
    auth_t badkey = {.curve_sk = "not-a-key"};
    cluster_t c2 = {0};
    c2.m = MODEL;
    c2.pool_pages = 16;
    snprintf(c2.boot_addr, sizeof(c2.boot_addr), "127.0.0.1:1");
    rank_t r = {.tp = 0, .tp_size = 1, .pp = 0, .pp_size = 1};
    CHECK_EQ(rank_start(&c2, &r, KVB_MODE_DECODE, &badkey), KVB_ERR_INVALID);
    CHECK_STR_CONTAINS(kvb_manager_last_error(NULL), "CURVE");
}

/* With CURVE off the same raw peer's frames arrive (the seeds' dialect). */
static void test_plain_control(void)
{
    auth_t none = {0};
    cluster_t c;
    start(&c, NULL, &none, &none);
    void *zctx = zmq_ctx_new();
    uint64_t before = bad(c.dec[0].mgr);
    raw_push(zctx, kvb_manager_endpoint(c.dec[0].mgr), NULL);
    CHECK(bad(c.dec[0].mgr) > before);
    zmq_ctx_term(zctx);
    CHECK_EQ(run_rooms(&c, 4, 4000, &OPTS), 0);
    stop(&c);
}

static void test_bootstrap_token(void)
{
    auth_t tok = {.token = "s3cr3t-token"}, wrong = {.token = "nope"}, none = {0};
    cluster_t c;
    start(&c, "s3cr3t-token", &tok, &tok);
    CHECK_EQ(run_rooms(&c, 8, 5000, &OPTS), 0);

    /* An extra prefill rank without / with a wrong token is refused. */
    rank_t r = {.tp = 1, .tp_size = 2, .pp = 0, .pp_size = 1};
    CHECK_EQ(rank_start(&c, &r, KVB_MODE_PREFILL, &none), KVB_ERR_AUTH);
    CHECK_STR_CONTAINS(kvb_manager_last_error(NULL), "registration");
    CHECK_EQ(rank_start(&c, &r, KVB_MODE_PREFILL, &wrong), KVB_ERR_AUTH);
    /* The refused registrations changed nothing: rooms still verify. */
    CHECK_EQ(run_rooms(&c, 8, 6000, &OPTS), 0);

    /* A decode rank without the token cannot look the prefill up (auth_reads):
     * its receiver polls Failed. */
    rank_t d = {.tp = 0, .tp_size = 1, .pp = 0, .pp_size = 1};
    CHECK_EQ(rank_start(&c, &d, KVB_MODE_DECODE, &none), KVB_OK);
    kvb_receiver_h rcv;
    CHECK_EQ(kvb_receiver_create(d.mgr, c.boot_addr, 7777, -1, &rcv), KVB_OK);
    CHECK_EQ(kvb_receiver_poll(rcv), KVB_POLL_FAILED);
    kvb_receiver_destroy(rcv);
    rank_stop(&d);

    /* The token from KVBRIDGE_BOOTSTRAP_TOKEN when the parameter is unset. */
    setenv("KVBRIDGE_BOOTSTRAP_TOKEN", "s3cr3t-token", 1);
    r.tp = 1;
    CHECK_EQ(rank_start(&c, &r, KVB_MODE_PREFILL, &none), KVB_OK); /* re-registers tp 1 */
    unsetenv("KVBRIDGE_BOOTSTRAP_TOKEN");
    rank_stop(&r);
    stop(&c);
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
