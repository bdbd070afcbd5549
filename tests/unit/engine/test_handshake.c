#include "engine/handshake.h"
#include "kvb_test.h"

#include <stdlib.h>

static kvb__hs_reply_t sample(kvb__hs_seg_t *segs)
{
    static const uint8_t rk[5] = {1, 2, 3, 4, 5};
    kvb__hs_reply_t r = {0};
    r.epoch = 0x1122334455667788ull;
    r.generation = 7;
    r.host = (const uint8_t *)"boot-id";
    r.host_len = 7;
    r.waddr = (const uint8_t *)"WORKERADDR";
    r.waddr_len = 10;
    r.nseg = 2;
    segs[0] = (kvb__hs_seg_t){0x1000, 0x100, rk, 5};
    segs[1] = (kvb__hs_seg_t){0x2000, 0x10, rk, 0};
    r.segs = segs;
    return r;
}

static void test_roundtrip(void)
{
    kvb__hs_seg_t segs[2];
    kvb__hs_reply_t r = sample(segs), d;
    uint8_t *buf;
    size_t len;
    char why[200] = "";
    CHECK_EQ(kvb__hs_reply_encode(&r, &buf, &len), KVB_OK);
    CHECK_EQ(kvb__hs_reply_decode(buf, len, &d, why, sizeof(why)), KVB_OK);
    CHECK(d.epoch == r.epoch && d.generation == 7 && d.nseg == 2);
    CHECK(d.waddr_len == 10 && memcmp(d.waddr, "WORKERADDR", 10) == 0);
    CHECK(d.segs[0].addr == 0x1000 && d.segs[0].rkey_len == 5 && d.segs[0].rkey[4] == 5);
    kvb__hs_reply_free(&d);
    /* every truncation is refused */
    for (size_t cut = 0; cut < len; cut++) {
        why[0] = '\0';
        CHECK_EQ(kvb__hs_reply_decode(buf, cut, &d, why, sizeof(why)), KVB_ERR_PROTO);
        CHECK(why[0] != '\0');
    }
    free(buf);
}

static void test_hostile(void)
{
    kvb__hs_seg_t segs[2];
    kvb__hs_reply_t r = sample(segs), d;
    uint8_t *buf;
    size_t len;
    char why[200];
    /* unsorted / overlapping segments */
    segs[1].addr = 0x1080;
    CHECK_EQ(kvb__hs_reply_encode(&r, &buf, &len), KVB_OK);
    CHECK_EQ(kvb__hs_reply_decode(buf, len, &d, why, sizeof(why)), KVB_ERR_PROTO);
    free(buf);
    /* wrapping segment */
    segs[1].addr = UINT64_MAX - 4;
    CHECK_EQ(kvb__hs_reply_encode(&r, &buf, &len), KVB_OK);
    CHECK_EQ(kvb__hs_reply_decode(buf, len, &d, why, sizeof(why)), KVB_ERR_PROTO);
    free(buf);
    /* huge segment count claimed in a small message */
    segs[1].addr = 0x2000;
    CHECK_EQ(kvb__hs_reply_encode(&r, &buf, &len), KVB_OK);
    size_t nseg_off = 8 + 4 + 8 + 8 + 4 + 7 + 4 + 10;
    buf[nseg_off + 3] = 0x7f;
    CHECK_EQ(kvb__hs_reply_decode(buf, len, &d, why, sizeof(why)), KVB_ERR_PROTO);
    CHECK_STR_CONTAINS(why, "segment count");
    free(buf);
    /* length field lies */
    CHECK_EQ(kvb__hs_reply_encode(&r, &buf, &len), KVB_OK);
    buf[8] ^= 1;
    CHECK_EQ(kvb__hs_reply_decode(buf, len, &d, why, sizeof(why)), KVB_ERR_PROTO);
    free(buf);
}

static void test_request_and_sid(void)
{
    uint8_t *buf;
    size_t len;
    const uint8_t *sid;
    uint32_t sl;
    char why[100], host[64];
    uint16_t port;
    CHECK_EQ(kvb__hs_request_encode("10.0.0.1:1234", &buf, &len), KVB_OK);
    CHECK_EQ(kvb__hs_request_decode(buf, len, &sid, &sl, why, sizeof(why)), KVB_OK);
    CHECK(sl == 13 && memcmp(sid, "10.0.0.1:1234", 13) == 0);
    CHECK_EQ(kvb__hs_request_decode(buf, len - 1, &sid, &sl, why, sizeof(why)), KVB_ERR_PROTO);
    free(buf);
    CHECK_EQ(kvb__sid_parse("127.0.0.1:80", host, sizeof(host), &port), KVB_OK);
    CHECK(strcmp(host, "127.0.0.1") == 0 && port == 80);
    CHECK_EQ(kvb__sid_parse("[::1]:9000", host, sizeof(host), &port), KVB_OK);
    CHECK(strcmp(host, "::1") == 0 && port == 9000);
    CHECK_EQ(kvb__sid_parse("::1:9000", host, sizeof(host), &port), KVB_ERR_INVALID);
    CHECK_EQ(kvb__sid_parse("h:0", host, sizeof(host), &port), KVB_ERR_INVALID);
    CHECK_EQ(kvb__sid_parse("h:65536", host, sizeof(host), &port), KVB_ERR_INVALID);
    CHECK_EQ(kvb__sid_parse(":80", host, sizeof(host), &port), KVB_ERR_INVALID);
    CHECK_EQ(kvb__sid_parse("h:8x", host, sizeof(host), &port), KVB_ERR_INVALID);
    CHECK_EQ(kvb__sid_parse("[::1:80", host, sizeof(host), &port), KVB_ERR_INVALID);
    uint8_t note[KVB_HS_NOTICE_LEN];
    uint64_t g;
    kvb__hs_notice_encode(42, note);
    CHECK(kvb__hs_notice_decode(note, &g) && g == 42);
    note[0] ^= 1;
    CHECK(!kvb__hs_notice_decode(note, &g));
}

static void hex(const uint8_t *b, size_t n, char *out)
{
    for (size_t i = 0; i < n; i++)
        sprintf(out + 2 * i, "%02x", b[i]);
}

/* Challenge, proof, denial: exact sizes only, magic checked, kinds told apart;
 * the MAC and token match Python's hmac module for the same inputs. */
static void test_auth(void)
{
    uint8_t nonce[KVB_HS_NONCE_LEN], chal[KVB_HS_CHALLENGE_LEN], proof[KVB_HS_PROOF_LEN];
    uint8_t deny[KVB_HS_DENY_LEN], mac[KVB_HS_MAC_LEN], tok[KVB_HS_TOKEN_LEN];
    const uint8_t *p;
    char why[200], h[2 * KVB_HS_MAC_LEN + 1];
    for (int i = 0; i < KVB_HS_NONCE_LEN; i++)
        nonce[i] = (uint8_t)i;
    kvb__hs_challenge_encode(nonce, chal);
    CHECK_EQ(kvb__hs_kind(chal, sizeof(chal)), KVB_HS_MSG_CHALLENGE);
    CHECK_EQ(kvb__hs_challenge_decode(chal, sizeof(chal), &p, why, sizeof(why)), KVB_OK);
    CHECK(memcmp(p, nonce, sizeof(nonce)) == 0);
    for (size_t cut = 0; cut < sizeof(chal); cut++)
        CHECK_EQ(kvb__hs_challenge_decode(chal, cut, &p, why, sizeof(why)), KVB_ERR_PROTO);
    CHECK_EQ(kvb__hs_proof_decode(chal, sizeof(chal), &p, why, sizeof(why)), KVB_ERR_PROTO);

    CHECK_EQ(kvb__hs_auth_mac("Jefe", nonce, (const uint8_t *)"127.0.0.1:5000", 14, mac), KVB_OK);
    hex(mac, sizeof(mac), h);
    CHECK(strcmp(h, "4edbfa31c4df44ae46e187a2a2e9967f14b525adc14113ba9b733a4b75d880c8") == 0);
    kvb__hs_proof_encode(mac, proof);
    CHECK_EQ(kvb__hs_kind(proof, sizeof(proof)), KVB_HS_MSG_UNKNOWN); /* writers never read it */
    CHECK_EQ(kvb__hs_proof_decode(proof, sizeof(proof), &p, why, sizeof(why)), KVB_OK);
    CHECK(kvb__ct_equal(p, mac, sizeof(mac)));
    CHECK_EQ(kvb__hs_proof_decode(proof, sizeof(proof) - 1, &p, why, sizeof(why)), KVB_ERR_PROTO);
    proof[9] ^= 1; /* length field */
    CHECK_EQ(kvb__hs_proof_decode(proof, sizeof(proof), &p, why, sizeof(why)), KVB_ERR_PROTO);

    /* a different sid or secret gives a different proof */
    uint8_t mac2[KVB_HS_MAC_LEN];
    CHECK_EQ(kvb__hs_auth_mac("Jefe", nonce, (const uint8_t *)"127.0.0.1:5001", 14, mac2), KVB_OK);
    CHECK(!kvb__ct_equal(mac, mac2, sizeof(mac)));
    CHECK_EQ(kvb__hs_auth_mac("Jeff", nonce, (const uint8_t *)"127.0.0.1:5000", 14, mac2), KVB_OK);
    CHECK(!kvb__ct_equal(mac, mac2, sizeof(mac)));

    CHECK_EQ(kvb__hs_am_token("Jefe", 0x1122334455667788ull, tok), KVB_OK);
    hex(tok, sizeof(tok), h);
    CHECK(strcmp(h, "68474012441eb88bc4df802ce94968a6") == 0);

    kvb__hs_deny_encode(deny);
    CHECK_EQ(kvb__hs_kind(deny, sizeof(deny)), KVB_HS_MSG_DENY);
    CHECK_EQ(kvb__hs_deny_decode(deny, sizeof(deny), why, sizeof(why)), KVB_OK);
    CHECK_EQ(kvb__hs_deny_decode(deny, sizeof(deny) - 1, why, sizeof(why)), KVB_ERR_PROTO);
    CHECK_EQ(kvb__hs_kind(deny, 4), KVB_HS_MSG_UNKNOWN);
}

int main(void)
{
    test_roundtrip();
    test_hostile();
    test_request_and_sid();
    test_auth();
    TEST_PASS("handshake codec");
    return 0;
}
