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

int main(void)
{
    test_roundtrip();
    test_hostile();
    test_request_and_sid();
    TEST_PASS("handshake codec");
    return 0;
}
