/* Engine secret (docs/security.md): a listener with a secret hands its
 * segment table out only to writers that prove the secret. Writers without
 * it, or with a wrong one, fail with KVB_ERR_AUTH naming the session and
 * change nothing; the right secret moves the bytes. A raw TCP peer gets a
 * challenge, never a segment table. */
#include "engine/engine_int.h"
#include "engine/handshake.h"
#include "kvb_test.h"
#include "kvb_test_engine.h"

#include <kvbridge/engine.h>
#include <unistd.h>

#define LEN (1u << 20)
#define SECRET "correct horse battery staple"

static kvb_engine_h mk(const char *secret, kvb_transport_t tr)
{
    kvb_engine_params_t p = {0};
    kvb_engine_h e;
    p.field_mask = KVB_ENGINE_PARAM_TRANSPORT | KVB_ENGINE_PARAM_CONNECT_TIMEOUT;
    p.transport = tr;
    p.connect_timeout_s = 3;
    if (secret != (const char *)1) { /* (const char *)1: leave the field unset (env) */
        p.field_mask |= KVB_ENGINE_PARAM_SECRET;
        p.secret = secret;
    }
    CHECK_EQ(kvb_engine_create(&p, &e), KVB_OK);
    return e;
}

typedef kvb_test_end_t side_t;

static side_t side(const char *secret, kvb_transport_t tr, uint8_t fill)
{
    return kvb_test_end(mk(secret, tr), LEN, fill, false);
}

static kvb_status_t write_all(side_t *w, side_t *t)
{
    return kvb_test_end_write(w, kvb_engine_session_id(t->eng), t->buf, 10);
}

/* Target with the secret: refused without / with a wrong secret, served with it. */
static void test_secret(kvb_transport_t tr)
{
    side_t t = side(SECRET, tr, 0x00);
    side_t none = side(NULL, tr, 0x11), wrong = side("incorrect horse", tr, 0x22),
           right = side(SECRET, tr, 0x33);
    const char *sid = kvb_engine_session_id(t.eng);

    CHECK_EQ(write_all(&none, &t), KVB_ERR_AUTH);
    CHECK_STR_CONTAINS(kvb_engine_last_error(none.eng), sid);
    CHECK_STR_CONTAINS(kvb_engine_last_error(none.eng), "requires an engine secret");
    CHECK(kvb_test_all(t.buf, LEN, 0x00));

    CHECK_EQ(write_all(&wrong, &t), KVB_ERR_AUTH);
    CHECK_STR_CONTAINS(kvb_engine_last_error(wrong.eng), sid);
    CHECK_STR_CONTAINS(kvb_engine_last_error(wrong.eng), "refused our engine secret");
    CHECK(kvb_test_all(t.buf, LEN, 0x00));
    /* a second try is refused again (no state left behind by the first) */
    CHECK_EQ(write_all(&wrong, &t), KVB_ERR_AUTH);

    CHECK_EQ(write_all(&right, &t), KVB_OK);
    CHECK(kvb_test_all(t.buf, LEN, 0x33));

    if (tr != KVB_TRANSPORT_SHM) {
        /* Message lane: a write message without the token (a peer that reached
         * the UCX worker without passing the challenge), or with a wrong one,
         * is refused by the target before any byte lands. */
        kvb__conn_t *c;
        CHECK_EQ(kvb__session_acquire(right.eng, sid, false, &c), KVB_OK);
        CHECK_EQ(c->am_auth, 1);
        memset(right.buf, 0x3c, LEN);
        c->am_auth = 0;
        CHECK_EQ(write_all(&right, &t), KVB_ERR_AUTH);
        CHECK_STR_CONTAINS(kvb_engine_last_error(right.eng), "not authenticated");
        c->am_auth = 1;
        c->am_token[3] ^= 0x40;
        CHECK_EQ(write_all(&right, &t), KVB_ERR_AUTH);
        c->am_token[3] ^= 0x40;
        CHECK(kvb_test_all(t.buf, LEN, 0x33));
        CHECK_EQ(write_all(&right, &t), KVB_OK);
        CHECK(kvb_test_all(t.buf, LEN, 0x3c));
        kvb__conn_put(c);
    }

    /* a writer with a secret refuses a listener without one (downgrade;
     * tests/integration/auth/test_auth_mutual.c has the attacks) */
    memset(none.buf, 0x00, LEN);
    memset(right.buf, 0x44, LEN);
    CHECK_EQ(write_all(&right, &none), KVB_ERR_AUTH);
    CHECK_STR_CONTAINS(kvb_engine_last_error(right.eng), "without the engine-secret challenge");
    CHECK(kvb_test_all(none.buf, LEN, 0x00));

    kvb_test_end_free(&right);
    kvb_test_end_free(&wrong);
    kvb_test_end_free(&none);
    kvb_test_end_free(&t);
}

/* KVBRIDGE_ENGINE_SECRET is the default; the param wins over it. */
static void test_env(void)
{
    setenv("KVBRIDGE_ENGINE_SECRET", SECRET, 1);
    side_t t = side((const char *)1, KVB_TRANSPORT_AUTO, 0x00);
    side_t right = side((const char *)1, KVB_TRANSPORT_AUTO, 0x55);
    side_t off = side("", KVB_TRANSPORT_AUTO, 0x66); /* "" = off, whatever the env says */
    unsetenv("KVBRIDGE_ENGINE_SECRET");
    CHECK_EQ(write_all(&off, &t), KVB_ERR_AUTH);
    CHECK(kvb_test_all(t.buf, LEN, 0x00));
    CHECK_EQ(write_all(&right, &t), KVB_OK);
    CHECK(kvb_test_all(t.buf, LEN, 0x55));
    kvb_test_end_free(&off);
    kvb_test_end_free(&right);
    kvb_test_end_free(&t);
}

/* A raw TCP peer: the listener's first answer is a 44-byte challenge, with
 * nothing of the segment table; a made-up proof is denied and the
 * connection closed; the listener keeps serving writers with the secret. */
static void test_raw_peer(void)
{
    side_t t = side(SECRET, KVB_TRANSPORT_AUTO, 0x00),
           right = side(SECRET, KVB_TRANSPORT_AUTO, 0x77);
    char host[64], why[200];
    uint16_t port;
    int fd;
    uint8_t *req, *msg, proof[KVB_HS_PROOF_LEN], mac[KVB_HS_MAC_LEN] = {0};
    uint8_t nonce_w[KVB_HS_NONCE_LEN] = {0};
    size_t req_len, len;
    const uint8_t *nonce;
    uint64_t dl = kvb__now_ns() + 3000000000ull;
    CHECK_EQ(kvb__sid_parse(kvb_engine_session_id(t.eng), host, sizeof(host), &port), KVB_OK);
    CHECK_EQ(kvb__sock_connect(host, port, dl, &fd, why, sizeof(why)), KVB_OK);
    CHECK_EQ(kvb__hs_request_encode("10.9.9.9:9", 0, &req, &req_len), KVB_OK);
    CHECK_EQ(kvb__sock_write_all(fd, req, req_len, dl), KVB_OK);
    CHECK_EQ(kvb__sock_read_msg(fd, NULL, KVB_HS_MAX_MSG, dl, &msg, &len, why, sizeof(why)),
             KVB_OK);
    CHECK_EQ(len, KVB_HS_CHALLENGE_LEN);
    CHECK_EQ(kvb__hs_challenge_decode(msg, len, &nonce, why, sizeof(why)), KVB_OK);
    free(msg);
    kvb__hs_proof_encode(nonce_w, mac, proof);
    CHECK_EQ(kvb__sock_write_all(fd, proof, sizeof(proof), dl), KVB_OK);
    CHECK_EQ(kvb__sock_read_msg(fd, NULL, KVB_HS_MAX_MSG, dl, &msg, &len, why, sizeof(why)),
             KVB_OK);
    CHECK_EQ(kvb__hs_kind(msg, len), KVB_HS_MSG_DENY);
    free(msg);
    uint8_t b;
    CHECK_EQ(kvb__sock_read_all(fd, &b, 1, dl), KVB_ERR_PEER); /* closed */
    close(fd);

    /* a peer that sends the request and stalls is dropped after its bound */
    dl = kvb__now_ns() + 3000000000ull;
    CHECK_EQ(kvb__sock_connect(host, port, dl, &fd, why, sizeof(why)), KVB_OK);
    CHECK_EQ(kvb__sock_write_all(fd, req, req_len, dl), KVB_OK);
    free(req);
    CHECK_EQ(kvb__sock_read_msg(fd, NULL, KVB_HS_MAX_MSG, dl, &msg, &len, why, sizeof(why)),
             KVB_OK);
    free(msg);
    CHECK_EQ(kvb__sock_read_all(fd, &b, 1, kvb__now_ns() + 5000000000ull), KVB_ERR_PEER);
    close(fd);

    CHECK(kvb_test_all(t.buf, LEN, 0x00));
    CHECK_EQ(write_all(&right, &t), KVB_OK);
    CHECK(kvb_test_all(t.buf, LEN, 0x77));
    kvb_test_end_free(&right);
    kvb_test_end_free(&t);
}

int main(void)
{
    unsetenv("KVBRIDGE_ENGINE_SECRET");
    test_secret(KVB_TRANSPORT_AUTO); /* message lane */
    TEST_PASS("engine secret, message lane");
    test_secret(KVB_TRANSPORT_SHM); /* put lane */
    TEST_PASS("engine secret, put lane");
    test_env();
    TEST_PASS("engine secret from KVBRIDGE_ENGINE_SECRET");
    test_raw_peer();
    TEST_PASS("raw TCP peer gets a challenge only");
    return 0;
}
