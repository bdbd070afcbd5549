/* Mutual engine authentication (docs/security.md, review 2.1/2.2): a writer
 * with an engine secret writes only to a listener that proves the same
 * secret over both nonces and seals its reply, so
 *  - a listener without a secret (downgrade) is refused;
 *  - a listener with another secret is refused by the writer;
 *  - a relay that forwards the challenge and the proof and swaps the reply's
 *    worker address and segments for its own gets no write;
 *  - a message-lane token works only while its own connection lives (one
 *    taken from another writer's ended connection is refused);
 *  - without a secret, the direct lane's shared-file table (pid, fds,
 *    nonces) goes only to a writer that proved it runs on the listener's
 *    host over that very TCP connection (not to a raw peer, not through a
 *    relay). */
#include "engine/engine_int.h"
#include "engine/handshake.h"
#include "kvb_test.h"
#include "kvb_test_engine.h"
#include "relay.h"

#include <kvbridge/engine.h>
#include <poll.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#define LEN (256u << 10)
#define SECRET "correct horse battery staple"

typedef kvb_test_end_t side_t;

static side_t side(const char *secret, uint8_t fill, bool shared)
{
    kvb_engine_params_t p = {0};
    kvb_engine_h e;
    p.field_mask =
        KVB_ENGINE_PARAM_TRANSPORT | KVB_ENGINE_PARAM_CONNECT_TIMEOUT | KVB_ENGINE_PARAM_SECRET;
    p.transport = KVB_TRANSPORT_AUTO;
    p.connect_timeout_s = 3;
    p.secret = secret;
    CHECK_EQ(kvb_engine_create(&p, &e), KVB_OK);
    return kvb_test_end(e, LEN, fill, shared);
}

/* w's whole buffer to dst (an address in the target's registration) of
 * session sid. */
static kvb_status_t write_to(side_t *w, const char *sid, const uint8_t *dst)
{
    return kvb_test_end_write(w, sid, dst, 5);
}

/* Writer with a secret, listener without one: refused before a byte moves. */
static void test_downgrade(void)
{
    side_t l = side(NULL, 0x00, false), w = side(SECRET, 0x11, false);
    const char *sid = kvb_engine_session_id(l.eng);
    CHECK_EQ(write_to(&w, sid, l.buf), KVB_ERR_AUTH);
    CHECK_STR_CONTAINS(kvb_engine_last_error(w.eng), sid);
    CHECK_STR_CONTAINS(kvb_engine_last_error(w.eng), "without the engine-secret challenge");
    CHECK(kvb_test_all(l.buf, LEN, 0x00));
    kvb_test_end_free(&w);
    kvb_test_end_free(&l);
}

/* ---- a listener that knows another secret ---- */

typedef struct fake_listener {
    relay_t net;         /* only its listening socket and sid are used */
    const char *backend; /* a real listener without secret: its reply is served */
    const char *secret;  /* what the fake knows */
    pthread_t thr;
} fake_listener_t;

/* Challenge, take any proof, then the best reply the fake can give: sealed
 * with its own secret (before sealed replies existed, a listener needed no
 * proof and sent the reply as is). */
static void *fake_main(void *arg)
{
    fake_listener_t *f = arg;
    uint8_t nonce_l[KVB_HS_NONCE_LEN], chal[KVB_HS_CHALLENGE_LEN], *req, *proof, *rep, *out;
    size_t req_len, proof_len, rep_len, out_len;
    const uint8_t *sid;
    uint32_t sid_len, caps;
    char why[256];
    uint64_t dl = kvb__now_ns() + 5000000000ull;
    struct pollfd p = {f->net.lfd, POLLIN, 0};
    CHECK(poll(&p, 1, 5000) == 1);
    int fd = accept(f->net.lfd, NULL, NULL);
    CHECK(fd >= 0);
    CHECK_EQ(kvb__sock_read_msg(fd, NULL, 4096, dl, &req, &req_len, why, sizeof(why)), KVB_OK);
    CHECK_EQ(kvb__hs_request_decode(req, req_len, &sid, &sid_len, &caps, why, sizeof(why)), KVB_OK);
    CHECK(getrandom(nonce_l, sizeof(nonce_l), 0) == sizeof(nonce_l));
    kvb__hs_challenge_encode(nonce_l, chal);
    CHECK_EQ(kvb__sock_write_all(fd, chal, sizeof(chal), dl), KVB_OK);
    CHECK_EQ(kvb__sock_read_msg(fd, NULL, 4096, dl, &proof, &proof_len, why, sizeof(why)), KVB_OK);
    rep = relay_fetch_reply(f->backend, &rep_len);
#ifdef KVB_HS_SEAL_HDR
    uint8_t mac[KVB_HS_MAC_LEN];
    CHECK_EQ(proof_len, KVB_HS_PROOF_LEN);
    CHECK_EQ(kvb__hs_reply_mac(f->secret, nonce_l, proof + 12, sid, sid_len, rep, rep_len, mac),
             KVB_OK);
    CHECK_EQ(kvb__hs_sealed_encode(mac, rep, rep_len, &out, &out_len), KVB_OK);
    free(rep);
#else
    out = rep;
    out_len = rep_len;
#endif
    kvb__sock_write_all(fd, out, out_len, dl);
    free(out);
    free(proof);
    free(req);
    uint8_t b;
    kvb__sock_read_all(fd, &b, 1, kvb__now_ns() + 3000000000ull); /* until the writer goes */
    close(fd);
    return NULL;
}

static void test_listener_wrong_secret(void)
{
    side_t backend = side(NULL, 0x00, false), w = side(SECRET, 0x22, false);
    fake_listener_t f = {.backend = kvb_engine_session_id(backend.eng), .secret = "wrong horse"};
    relay_start(&f.net, "127.0.0.1:1", NULL, 0); /* for its socket; the relay thread idles */
    relay_cut(&f.net);                           /* stop the relay thread, keep the socket */
    CHECK_EQ(pthread_create(&f.thr, NULL, fake_main, &f), 0);
    CHECK_EQ(write_to(&w, f.net.sid, backend.buf), KVB_ERR_AUTH);
    CHECK_STR_CONTAINS(kvb_engine_last_error(w.eng), "did not prove the engine secret");
    CHECK(kvb_test_all(backend.buf, LEN, 0x00));
    kvb_test_end_free(&w);
    pthread_join(f.thr, NULL);
    relay_stop(&f.net);
    kvb_test_end_free(&backend);
}

/* A relay forwards the challenge and the writer's proof to the real
 * listener and swaps the reply's worker address and segments for those of
 * its own engine (which has no secret and accepts any token): the writer
 * must not write there. */
static void test_relay_substitutes(void)
{
    side_t l = side(SECRET, 0x00, false), w = side(SECRET, 0x33, false);
    side_t evil = side(NULL, 0x00, false);
    size_t sub_len;
    uint8_t *sub = relay_fetch_reply(kvb_engine_session_id(evil.eng), &sub_len);
    relay_t m;
    relay_start(&m, kvb_engine_session_id(l.eng), sub, sub_len);
    CHECK_EQ(write_to(&w, m.sid, evil.buf), KVB_ERR_AUTH);
    CHECK_STR_CONTAINS(kvb_engine_last_error(w.eng), "reply's MAC is wrong");
    CHECK_EQ(__atomic_load_n(&m.replies_seen, __ATOMIC_ACQUIRE), 1); /* it did get one */
    CHECK(kvb_test_all(evil.buf, LEN, 0x00));
    CHECK(kvb_test_all(l.buf, LEN, 0x00));
    relay_stop(&m);
    free(sub);
    kvb_test_end_free(&evil);
    kvb_test_end_free(&w);
    kvb_test_end_free(&l);
}

/* A faithful relay is harmless: the writer reaches the real listener. The
 * token of that connection stops working when the connection ends: another
 * writer that presents it (as one that read it off the wire would) is
 * refused, while its own token still works. */
static void test_token_per_connection(void)
{
    side_t l = side(SECRET, 0x00, false), w = side(SECRET, 0x44, false),
           x = side(SECRET, 0x55, false);
    const char *lsid = kvb_engine_session_id(l.eng);
    relay_t m;
    kvb__conn_t *cw, *cx;
    uint8_t stolen[KVB_HS_TOKEN_LEN], own[KVB_HS_TOKEN_LEN];
    relay_start(&m, lsid, NULL, 0);
    CHECK_EQ(write_to(&w, m.sid, l.buf), KVB_OK);
    CHECK(kvb_test_all(l.buf, LEN, 0x44));
    CHECK_EQ(kvb__session_acquire(w.eng, m.sid, false, &cw), KVB_OK);
    CHECK_EQ(cw->am_auth, 1);
    memcpy(stolen, cw->am_token, sizeof(stolen));
    kvb__conn_put(cw);
    CHECK_EQ(write_to(&x, lsid, l.buf), KVB_OK);
    CHECK(kvb_test_all(l.buf, LEN, 0x55));
    CHECK_EQ(kvb__session_acquire(x.eng, lsid, false, &cx), KVB_OK);
    memcpy(own, cx->am_token, sizeof(own));
    CHECK(memcmp(own, stolen, sizeof(own)) != 0); /* one token per connection */

    relay_cut(&m); /* w's control connection to l ends */
    memset(x.buf, 0x66, LEN);
    memset(l.buf, 0x00, LEN);
    memcpy(cx->am_token, stolen, sizeof(stolen));
    kvb_status_t st = KVB_OK;
    for (int i = 0; i < 50 && st == KVB_OK; i++) { /* until l has seen the close: 2.5 s */
        st = write_to(&x, lsid, l.buf);
        if (st == KVB_OK) {
            memset(l.buf, 0x00, LEN);
            usleep(50000);
        }
    }
    CHECK_EQ(st, KVB_ERR_AUTH);
    CHECK_STR_CONTAINS(kvb_engine_last_error(x.eng), "not authenticated");
    CHECK(kvb_test_all(l.buf, LEN, 0x00));
    memcpy(cx->am_token, own, sizeof(own));
    CHECK_EQ(write_to(&x, lsid, l.buf), KVB_OK);
    CHECK(kvb_test_all(l.buf, LEN, 0x66));
    kvb__conn_put(cx);
    relay_stop(&m);
    kvb_test_end_free(&x);
    kvb_test_end_free(&w);
    kvb_test_end_free(&l);
}

/* No secret: a raw TCP peer that cannot prove it runs here gets a reply
 * without the shared-file table; a local writer through a relay gets none
 * either (its proof is bound to its own connection), a direct one does. */
static void test_table_only_local(void)
{
    side_t l = side(NULL, 0x00, true), w = side(NULL, 0x77, false);
    const char *lsid = kvb_engine_session_id(l.eng);
    char host[64], why[256];
    uint16_t port;
    int fd;
    uint8_t *req, *msg;
    size_t req_len, len;
    uint64_t dl = kvb__now_ns() + 3000000000ull;
    kvb__hs_reply_t r;
    CHECK_EQ(kvb__sid_parse(lsid, host, sizeof(host), &port), KVB_OK);
    CHECK_EQ(kvb__sock_connect(host, port, dl, &fd, why, sizeof(why)), KVB_OK);
    CHECK_EQ(kvb__hs_request_encode("10.9.9.9:9", 0, &req, &req_len), KVB_OK);
    CHECK_EQ(kvb__sock_write_all(fd, req, req_len, dl), KVB_OK);
    free(req);
    CHECK_EQ(kvb__sock_read_msg(fd, NULL, KVB_HS_MAX_MSG, dl, &msg, &len, why, sizeof(why)),
             KVB_OK);
    if (memcmp(msg, "KVBHP001", 8) == 0) { /* same-host challenge: a made-up answer */
        uint8_t ans[44] = "KVBHL001";
        ans[8] = 44;
        free(msg);
        CHECK_EQ(kvb__sock_write_all(fd, ans, sizeof(ans), dl), KVB_OK);
        CHECK_EQ(kvb__sock_read_msg(fd, NULL, KVB_HS_MAX_MSG, dl, &msg, &len, why, sizeof(why)),
                 KVB_OK);
    }
    CHECK_EQ(kvb__hs_reply_decode(msg, len, &r, why, sizeof(why)), KVB_OK);
    CHECK_EQ(r.nseg, 1);
    CHECK_EQ(r.pid, 0);
    CHECK_EQ(r.nshm, 0);
    kvb__hs_reply_free(&r);
    free(msg);
    close(fd);

    relay_t m;
    relay_start(&m, lsid, NULL, 0);
    CHECK_EQ(write_to(&w, m.sid, l.buf), KVB_OK); /* served, on the message lane */
    CHECK(kvb_test_all(l.buf, LEN, 0x77));
    CHECK_EQ(kvb_engine_session_direct(w.eng, m.sid), 0);
    memset(w.buf, 0x78, LEN);
    CHECK_EQ(write_to(&w, lsid, l.buf), KVB_OK);
    CHECK_EQ(kvb_engine_session_direct(w.eng, lsid), 1);
    CHECK(kvb_test_all(l.buf, LEN, 0x78));
    relay_stop(&m);
    kvb_test_end_free(&w);
    kvb_test_end_free(&l);
}

typedef struct named {
    const char *name, *pass;
    void (*fn)(void);
} named_t;

/* argv[1]: run only the case of that name (to see each fail alone). */
int main(int argc, char **argv)
{
    static const named_t cases[] = {
        {"downgrade", "writer with a secret refuses a listener without one", test_downgrade},
        {"wrong_secret", "writer refuses a listener with another secret",
         test_listener_wrong_secret},
        {"relay", "relay swapping the worker address gets no write", test_relay_substitutes},
        {"token", "message-lane token dies with its connection", test_token_per_connection},
        {"table", "shared-file table only to a proven same-host writer", test_table_only_local},
    };
    unsetenv("KVBRIDGE_ENGINE_SECRET");
    unsetenv("KVBRIDGE_TRANSPORT");
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        if (argc > 1 && strcmp(argv[1], cases[i].name) != 0)
            continue;
        cases[i].fn();
        TEST_PASS(cases[i].pass);
    }
    return 0;
}
