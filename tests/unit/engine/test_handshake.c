#include "engine/handshake.h"
#include "kvb_test.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

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
    uint32_t sl, caps;
    char why[100], host[64];
    uint16_t port;
    CHECK_EQ(kvb__hs_request_encode("10.0.0.1:1234", 0, &buf, &len), KVB_OK);
    CHECK_EQ(kvb__hs_request_decode(buf, len, &sid, &sl, &caps, why, sizeof(why)), KVB_OK);
    CHECK(sl == 13 && memcmp(sid, "10.0.0.1:1234", 13) == 0);
    CHECK_EQ(kvb__hs_request_decode(buf, len - 1, &sid, &sl, &caps, why, sizeof(why)),
             KVB_ERR_PROTO);
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
 * the MACs and the token match Python's hmac module for the same inputs
 * (hmac.new(b"Jefe", b"KVBAUTH2" + nonce_l + nonce_w + sid, sha256), ...). */
static void test_auth(void)
{
    uint8_t nl[KVB_HS_NONCE_LEN], nw[KVB_HS_NONCE_LEN], chal[KVB_HS_CHALLENGE_LEN];
    uint8_t proof[KVB_HS_PROOF_LEN], deny[KVB_HS_DENY_LEN], mac[KVB_HS_MAC_LEN];
    uint8_t tok[KVB_HS_TOKEN_LEN], tok2[KVB_HS_TOKEN_LEN];
    const uint8_t *p, *q, *sid = (const uint8_t *)"127.0.0.1:5000";
    char why[200], h[2 * KVB_HS_MAC_LEN + 1];
    for (int i = 0; i < KVB_HS_NONCE_LEN; i++) {
        nl[i] = (uint8_t)i;
        nw[i] = (uint8_t)(32 + i);
    }
    kvb__hs_challenge_encode(nl, chal);
    CHECK_EQ(kvb__hs_kind(chal, sizeof(chal)), KVB_HS_MSG_CHALLENGE);
    CHECK_EQ(kvb__hs_challenge_decode(chal, sizeof(chal), &p, why, sizeof(why)), KVB_OK);
    CHECK(memcmp(p, nl, sizeof(nl)) == 0);
    for (size_t cut = 0; cut < sizeof(chal); cut++)
        CHECK_EQ(kvb__hs_challenge_decode(chal, cut, &p, why, sizeof(why)), KVB_ERR_PROTO);
    CHECK_EQ(kvb__hs_proof_decode(chal, sizeof(chal), &p, &q, why, sizeof(why)), KVB_ERR_PROTO);

    CHECK_EQ(kvb__hs_auth_mac("Jefe", nl, nw, sid, 14, mac), KVB_OK);
    hex(mac, sizeof(mac), h);
    CHECK(strcmp(h, "9fde64d4b90520edd4e79d039e02da3e17e8ef6afeef44fde7681068e856ebfc") == 0);
    kvb__hs_proof_encode(nw, mac, proof);
    CHECK_EQ(sizeof(proof), 76);
    CHECK_EQ(kvb__hs_kind(proof, sizeof(proof)), KVB_HS_MSG_UNKNOWN); /* writers never read it */
    CHECK_EQ(kvb__hs_proof_decode(proof, sizeof(proof), &p, &q, why, sizeof(why)), KVB_OK);
    CHECK(memcmp(p, nw, sizeof(nw)) == 0 && kvb__ct_equal(q, mac, sizeof(mac)));
    CHECK_EQ(kvb__hs_proof_decode(proof, sizeof(proof) - 1, &p, &q, why, sizeof(why)),
             KVB_ERR_PROTO);
    proof[9] ^= 1; /* length field */
    CHECK_EQ(kvb__hs_proof_decode(proof, sizeof(proof), &p, &q, why, sizeof(why)), KVB_ERR_PROTO);
    proof[9] ^= 1;
    memcpy(proof, "KVBHA001", 8); /* the old one-way proof's magic */
    CHECK_EQ(kvb__hs_proof_decode(proof, sizeof(proof), &p, &q, why, sizeof(why)), KVB_ERR_PROTO);

    /* a different sid, secret or writer nonce gives a different proof */
    uint8_t mac2[KVB_HS_MAC_LEN];
    CHECK_EQ(kvb__hs_auth_mac("Jefe", nl, nw, (const uint8_t *)"127.0.0.1:5001", 14, mac2), KVB_OK);
    CHECK(!kvb__ct_equal(mac, mac2, sizeof(mac)));
    CHECK_EQ(kvb__hs_auth_mac("Jeff", nl, nw, sid, 14, mac2), KVB_OK);
    CHECK(!kvb__ct_equal(mac, mac2, sizeof(mac)));
    CHECK_EQ(kvb__hs_auth_mac("Jefe", nl, nl, sid, 14, mac2), KVB_OK);
    CHECK(!kvb__ct_equal(mac, mac2, sizeof(mac)));

    /* the token is per connection: other nonces, other token */
    CHECK_EQ(kvb__hs_am_token("Jefe", nw, nl, 0x1122334455667788ull, tok), KVB_OK);
    hex(tok, sizeof(tok), h);
    CHECK(strcmp(h, "281569ca3f5c8c3c53287381b54e6f75") == 0);
    nw[0] ^= 1;
    CHECK_EQ(kvb__hs_am_token("Jefe", nw, nl, 0x1122334455667788ull, tok2), KVB_OK);
    nw[0] ^= 1;
    CHECK(!kvb__ct_equal(tok, tok2, sizeof(tok)));

    kvb__hs_deny_encode(deny);
    CHECK_EQ(kvb__hs_kind(deny, sizeof(deny)), KVB_HS_MSG_DENY);
    CHECK_EQ(kvb__hs_deny_decode(deny, sizeof(deny), why, sizeof(why)), KVB_OK);
    CHECK_EQ(kvb__hs_deny_decode(deny, sizeof(deny) - 1, why, sizeof(why)), KVB_ERR_PROTO);
    CHECK_EQ(kvb__hs_kind(deny, 4), KVB_HS_MSG_UNKNOWN);
}

/* Sealed reply: the listener's MAC covers both nonces, the writer's sid and
 * every byte of the reply; the wrapper round-trips. */
static void test_sealed(void)
{
    uint8_t nl[KVB_HS_NONCE_LEN], nw[KVB_HS_NONCE_LEN], mac[KVB_HS_MAC_LEN], mac2[KVB_HS_MAC_LEN];
    const uint8_t *sid = (const uint8_t *)"127.0.0.1:5000", *m, *rep;
    const uint8_t inner[] = "KVBHS002-ish";
    uint8_t *buf;
    size_t len, rep_len;
    char why[200], h[2 * KVB_HS_MAC_LEN + 1];
    for (int i = 0; i < KVB_HS_NONCE_LEN; i++) {
        nl[i] = (uint8_t)i;
        nw[i] = (uint8_t)(32 + i);
    }
    CHECK_EQ(kvb__hs_reply_mac("Jefe", nl, nw, sid, 14, inner, 12, mac), KVB_OK);
    hex(mac, sizeof(mac), h);
    CHECK(strcmp(h, "6204ab82f2df854ce9060e869cae6ad9e8d90543a489337c5142948ddb2ba58f") == 0);
    /* one byte of the reply changed (a relay's worker address): another MAC */
    CHECK_EQ(kvb__hs_reply_mac("Jefe", nl, nw, sid, 14, (const uint8_t *)"KVBHS002-isH", 12, mac2),
             KVB_OK);
    CHECK(!kvb__ct_equal(mac, mac2, sizeof(mac)));
    /* the proof a writer sends is not a valid seal (labels differ) */
    CHECK_EQ(kvb__hs_auth_mac("Jefe", nl, nw, sid, 14, mac2), KVB_OK);
    CHECK(!kvb__ct_equal(mac, mac2, sizeof(mac)));

    CHECK_EQ(kvb__hs_sealed_encode(mac, inner, 12, &buf, &len), KVB_OK);
    CHECK_EQ(len, KVB_HS_SEAL_HDR + 12);
    CHECK_EQ(kvb__hs_kind(buf, len), KVB_HS_MSG_SEALED);
    CHECK_EQ(kvb__hs_sealed_decode(buf, len, &m, &rep, &rep_len, why, sizeof(why)), KVB_OK);
    CHECK(kvb__ct_equal(m, mac, sizeof(mac)) && rep_len == 12 && memcmp(rep, inner, 12) == 0);
    for (size_t cut = 0; cut < KVB_HS_SEAL_HDR; cut++)
        CHECK_EQ(kvb__hs_sealed_decode(buf, cut, &m, &rep, &rep_len, why, sizeof(why)),
                 KVB_ERR_PROTO);
    buf[8] ^= 1;
    CHECK_EQ(kvb__hs_sealed_decode(buf, len, &m, &rep, &rep_len, why, sizeof(why)), KVB_ERR_PROTO);
    free(buf);
}

/* Same-host challenge and answer; the connection tuple is the same bytes on
 * both ends of one TCP connection, and differs between two connections. */
static void test_local(void)
{
    uint8_t msg[KVB_HS_LOCAL_MAX], ok[KVB_HS_LOCALOK_LEN], mac[KVB_HS_MAC_LEN], val[32];
    uint8_t tup[] = {127, 0, 0, 1, 0x13, 0x88, 127, 0, 0, 2, 0x00, 0x50};
    const uint8_t *host, *m;
    uint32_t pid, fd, hl;
    char why[200], h[2 * KVB_HS_MAC_LEN + 1];
    size_t n = kvb__hs_local_encode(4242, 17, "boot-id", msg);
    CHECK_EQ(n, 12 + 12 + 7);
    CHECK_EQ(kvb__hs_kind(msg, n), KVB_HS_MSG_LOCAL);
    CHECK_EQ(kvb__hs_local_decode(msg, n, &pid, &fd, &host, &hl, why, sizeof(why)), KVB_OK);
    CHECK(pid == 4242 && fd == 17 && hl == 7 && memcmp(host, "boot-id", 7) == 0);
    for (size_t cut = 0; cut < n; cut++)
        CHECK_EQ(kvb__hs_local_decode(msg, cut, &pid, &fd, &host, &hl, why, sizeof(why)),
                 KVB_ERR_PROTO);
    n = kvb__hs_local_encode(0, 17, "boot-id", msg); /* no process 0 */
    CHECK_EQ(kvb__hs_local_decode(msg, n, &pid, &fd, &host, &hl, why, sizeof(why)), KVB_ERR_PROTO);

    for (int i = 0; i < 32; i++)
        val[i] = (uint8_t)(100 + i);
    CHECK_EQ(kvb__hs_local_mac(val, tup, sizeof(tup), mac), KVB_OK);
    hex(mac, sizeof(mac), h);
    CHECK(strcmp(h, "dca9df5d4fe3b2ef581574ada36eff440df4424b9973a7773366fe52c0acd85e") == 0);
    kvb__hs_localok_encode(mac, ok);
    CHECK_EQ(kvb__hs_localok_decode(ok, sizeof(ok), &m, why, sizeof(why)), KVB_OK);
    CHECK(kvb__ct_equal(m, mac, sizeof(mac)));
    CHECK_EQ(kvb__hs_localok_decode(ok, sizeof(ok) - 1, &m, why, sizeof(why)), KVB_ERR_PROTO);

    /* tuples over real loopback connections */
    int lfd = socket(AF_INET, SOCK_STREAM, 0), c1 = socket(AF_INET, SOCK_STREAM, 0),
        c2 = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t al = sizeof(a);
    CHECK(bind(lfd, (struct sockaddr *)&a, sizeof(a)) == 0 && listen(lfd, 4) == 0);
    CHECK(getsockname(lfd, (struct sockaddr *)&a, &al) == 0);
    CHECK(connect(c1, (struct sockaddr *)&a, sizeof(a)) == 0);
    CHECK(connect(c2, (struct sockaddr *)&a, sizeof(a)) == 0);
    int s1 = accept(lfd, NULL, NULL), s2 = accept(lfd, NULL, NULL);
    uint8_t tw[KVB_HS_TUPLE_MAX], tl1[KVB_HS_TUPLE_MAX], tl2[KVB_HS_TUPLE_MAX];
    size_t nw, n1, n2;
    CHECK(kvb__hs_conn_tuple(c1, false, tw, &nw));
    CHECK(kvb__hs_conn_tuple(s1, true, tl1, &n1));
    CHECK(kvb__hs_conn_tuple(s2, true, tl2, &n2));
    CHECK(nw == 12 && n1 == 12 && memcmp(tw, tl1, nw) == 0);
    CHECK(n2 == 12 && memcmp(tw, tl2, nw) != 0);     /* a relay's connection differs */
    CHECK(!kvb__hs_conn_tuple(lfd, true, tl1, &n1)); /* not connected */
    close(s1);
    close(s2);
    close(c1);
    close(c2);
    close(lfd);
}

/* ---- shared-file table (direct lane) ---- */

/* The sample's two segments ([0x1000, +0x100), [0x2000, +0x10)) in shared
 * files, then the fence page; every field distinct so a swap shows. */
static kvb__hs_reply_t shm_sample(kvb__hs_seg_t *segs, kvb__hs_shm_t *shm)
{
    kvb__hs_reply_t r = sample(segs);
    r.pid = 4242;
    r.nshm = 3;
    r.shm = shm;
    memset(shm, 0, 3 * sizeof(*shm));
    shm[0].seg = 0;
    shm[0].ref = (kvb__shm_ref_t){
        .fd = 7, .file_off = 0, .file_size = 8192, .dev = 0x801, .ino = 0x123456789abcull};
    shm[1].seg = 1;
    shm[1].ref = (kvb__shm_ref_t){
        .fd = INT32_MAX, .file_off = 4096, .file_size = 12288, .dev = 0x802, .ino = 99};
    shm[2].seg = KVB_HS_SHM_FENCE;
    shm[2].ref = (kvb__shm_ref_t){
        .fd = 9, .file_off = 0, .file_size = KVB_HS_FENCE_FILE, .dev = 0x803, .ino = 100};
    for (int e = 0; e < 3; e++)
        for (int i = 0; i < KVB_SHM_NONCE_LEN; i++)
            shm[e].ref.nonce[i] = (uint8_t)(16 * e + i + 1);
    return r;
}

/* Encode r and decode it: the status, and the reason on failure. */
static kvb_status_t shm_decode(const kvb__hs_reply_t *r, char *why, size_t wl)
{
    uint8_t *buf;
    size_t len;
    kvb__hs_reply_t d;
    CHECK_EQ(kvb__hs_reply_encode(r, &buf, &len), KVB_OK);
    why[0] = '\0';
    kvb_status_t st = kvb__hs_reply_decode(buf, len, &d, why, wl);
    if (st == KVB_OK)
        kvb__hs_reply_free(&d);
    free(buf);
    return st;
}

static void expect_refused(const kvb__hs_reply_t *r, const char *what)
{
    char why[200];
    kvb_status_t st = shm_decode(r, why, sizeof(why));
    if (st != KVB_ERR_PROTO || why[0] == '\0') {
        fprintf(stderr, "%s: decode gave %d, reason \"%s\"\n", what, (int)st, why);
        exit(1);
    }
}

static void test_shm_roundtrip(void)
{
    kvb__hs_seg_t segs[2];
    kvb__hs_shm_t shm[3];
    kvb__hs_reply_t r = shm_sample(segs, shm), d;
    uint8_t *buf;
    size_t len, len0;
    char why[200] = "";
    CHECK_EQ(kvb__hs_reply_encode(&r, &buf, &len), KVB_OK);
    CHECK_EQ(kvb__hs_reply_decode(buf, len, &d, why, sizeof(why)), KVB_OK);
    CHECK(d.nseg == 2 && d.segs[1].addr == 0x2000 && d.segs[1].len == 0x10);
    CHECK_EQ(d.pid, 4242);
    CHECK_EQ(d.nshm, 3);
    for (int e = 0; e < 3; e++) {
        CHECK_EQ(d.shm[e].seg, shm[e].seg);
        CHECK_EQ(d.shm[e].ref.fd, shm[e].ref.fd);
        CHECK(d.shm[e].ref.file_off == shm[e].ref.file_off);
        CHECK(d.shm[e].ref.file_size == shm[e].ref.file_size);
        CHECK(d.shm[e].ref.dev == shm[e].ref.dev && d.shm[e].ref.ino == shm[e].ref.ino);
        CHECK(memcmp(d.shm[e].ref.nonce, shm[e].ref.nonce, KVB_SHM_NONCE_LEN) == 0);
    }
    kvb__hs_reply_free(&d);
    /* Every cut inside the table, with the length field told the cut length
     * (so the header check passes and the table decoder meets it), is refused. */
    r.nshm = 0;
    r.pid = 0;
    uint8_t *b0;
    CHECK_EQ(kvb__hs_reply_encode(&r, &b0, &len0), KVB_OK); /* ends after u32 pid u32 nshm */
    free(b0);
    for (size_t cut = len0 - 8; cut < len; cut++) {
        uint8_t *c = malloc(cut);
        memcpy(c, buf, cut);
        for (int i = 0; i < 4; i++)
            c[KVB_HS_MAGIC_LEN + i] = (uint8_t)(cut >> (8 * i));
        why[0] = '\0';
        CHECK_EQ(kvb__hs_reply_decode(c, cut, &d, why, sizeof(why)), KVB_ERR_PROTO);
        CHECK(why[0] != '\0');
        free(c);
    }
    /* one byte too many after the table */
    uint8_t *c = malloc(len + 1);
    memcpy(c, buf, len);
    c[len] = 0;
    for (int i = 0; i < 4; i++)
        c[KVB_HS_MAGIC_LEN + i] = (uint8_t)((len + 1) >> (8 * i));
    CHECK_EQ(kvb__hs_reply_decode(c, len + 1, &d, why, sizeof(why)), KVB_ERR_PROTO);
    CHECK_STR_CONTAINS(why, "trailing");
    free(c);
    free(buf);
    TEST_PASS("shared-file table round trip; truncations refused");
}

static void test_shm_hostile(void)
{
    kvb__hs_seg_t segs[2];
    kvb__hs_shm_t shm[4];
    kvb__hs_reply_t r;
    char why[200];
#define FRESH() (r = shm_sample(segs, shm))
    /* positive controls: the sample, and the limits exactly, decode */
    FRESH();
    CHECK_EQ(shm_decode(&r, why, sizeof(why)), KVB_OK);
    shm[0].ref.file_off = 4096 - 0x100; /* segment ends at the trailer */
    CHECK_EQ(shm_decode(&r, why, sizeof(why)), KVB_OK);
    FRESH();
    shm[0].ref.file_size = KVB_SHM_MAX_FILE;
    CHECK_EQ(shm_decode(&r, why, sizeof(why)), KVB_OK);
    FRESH();
    r.nshm = 0; /* no table: pid 0 allowed */
    r.pid = 0;
    CHECK_EQ(shm_decode(&r, why, sizeof(why)), KVB_OK);
    FRESH();
    shm[0] = shm[2]; /* only the fence page */
    r.nshm = 1;
    CHECK_EQ(shm_decode(&r, why, sizeof(why)), KVB_OK);

    FRESH();
    shm[1].seg = 2; /* == nseg */
    expect_refused(&r, "seg == nseg");
    FRESH();
    shm[1].seg = 0x7fffffff;
    expect_refused(&r, "seg > nseg");
    FRESH();
    shm[0].seg = 1;
    shm[1].seg = 0;
    expect_refused(&r, "unsorted");
    FRESH();
    shm[1].seg = 0;
    expect_refused(&r, "duplicate seg");
    FRESH();
    {
        kvb__hs_shm_t t = shm[1];
        shm[1] = shm[2];
        shm[2] = t;
    }
    expect_refused(&r, "entry after the fence page");
    CHECK_EQ(shm_decode(&r, why, sizeof(why)), KVB_ERR_PROTO);
    CHECK_STR_CONTAINS(why, "after the fence page");
    FRESH();
    shm[1] = shm[0]; /* the fence page first, then segment 0 */
    shm[0] = shm[2];
    r.nshm = 2;
    expect_refused(&r, "segment entry after a leading fence entry");
    FRESH();
    shm[1] = shm[2]; /* two fence pages */
    r.nshm = 3;
    expect_refused(&r, "two fence entries");

    FRESH();
    shm[0].ref.file_off = 4096 - 0x100 + 1; /* one byte into the trailer */
    expect_refused(&r, "segment reaches the trailer");
    FRESH();
    shm[1].ref.file_off = 12288; /* starts past the file */
    expect_refused(&r, "segment past the file");
    FRESH();
    shm[0].ref.file_off = UINT64_MAX - 0x10; /* + 0x100 wraps */
    expect_refused(&r, "file_off + len wraps");
    FRESH();
    shm[0].ref.file_off = UINT64_MAX - 0x100 + 1; /* end would be exactly 2^64 (0) */
    expect_refused(&r, "file_off + len == 2^64");

    FRESH();
    shm[0].ref.file_size = 8193;
    expect_refused(&r, "file_size not page multiple");
    FRESH();
    shm[1].ref.file_size = 12288 + 1024;
    expect_refused(&r, "file_size not page multiple (2)");
    FRESH();
    shm[0].ref.file_size = 4096;
    shm[0].ref.file_off = 0;
    segs[0].len = 16;
    expect_refused(&r, "file_size < 8192");
    FRESH();
    shm[0].ref.file_size = 0;
    expect_refused(&r, "file_size 0");
    FRESH();
    shm[0].ref.file_size = KVB_SHM_MAX_FILE + 4096;
    expect_refused(&r, "file_size > 2^50");
    FRESH();
    shm[0].ref.file_size = UINT64_MAX - 4095; /* page multiple, huge */
    expect_refused(&r, "file_size near 2^64");

    FRESH();
    shm[2].ref.file_size = 12288;
    expect_refused(&r, "fence file of 12288 bytes");
    FRESH();
    shm[2].ref.file_size = KVB_SHM_TRAILER;
    expect_refused(&r, "fence file of 4096 bytes");
    FRESH();
    shm[2].ref.file_off = 4096;
    expect_refused(&r, "fence at file_off 4096");
    FRESH();
    shm[2].ref.file_off = 1;
    expect_refused(&r, "fence at file_off 1");

    FRESH();
    shm[3] = shm[2];
    r.nshm = 4; /* nseg + 2 */
    CHECK_EQ(shm_decode(&r, why, sizeof(why)), KVB_ERR_PROTO);
    CHECK_STR_CONTAINS(why, "oversized");
    FRESH();
    r.nseg = 0; /* no segments, two entries */
    shm[0] = shm[2];
    shm[1] = shm[2];
    r.nshm = 2;
    CHECK_EQ(shm_decode(&r, why, sizeof(why)), KVB_ERR_PROTO);
    CHECK_STR_CONTAINS(why, "oversized");

    FRESH();
    r.pid = 0;
    CHECK_EQ(shm_decode(&r, why, sizeof(why)), KVB_ERR_PROTO);
    CHECK_STR_CONTAINS(why, "process id");
    FRESH();
    r.pid = 0;
    shm[0] = shm[2];
    r.nshm = 1;
    expect_refused(&r, "fence page alone with pid 0");

    FRESH();
    shm[1].ref.fd = INT32_MIN; /* encoded as 0x80000000 = INT32_MAX + 1 */
    expect_refused(&r, "fd INT32_MAX + 1");
    FRESH();
    shm[2].ref.fd = -1; /* 0xffffffff */
    expect_refused(&r, "fd 0xffffffff");
#undef FRESH

    /* nshm claims more entries than the bytes hold (a huge count) */
    uint8_t *buf;
    size_t len;
    kvb__hs_reply_t d;
    r = shm_sample(segs, shm);
    CHECK_EQ(kvb__hs_reply_encode(&r, &buf, &len), KVB_OK);
    size_t nshm_off = len - 3 * (4 + 4 + 8 * 4 + KVB_SHM_NONCE_LEN) - 4;
    CHECK_EQ(buf[nshm_off], 3);
    buf[nshm_off + 3] = 0xff;
    CHECK_EQ(kvb__hs_reply_decode(buf, len, &d, why, sizeof(why)), KVB_ERR_PROTO);
    CHECK(why[0] != '\0');
    free(buf);
    TEST_PASS("shared-file table: hostile entries refused with a reason");
}

int main(void)
{
    test_roundtrip();
    test_hostile();
    test_request_and_sid();
    test_auth();
    test_sealed();
    test_local();
    test_shm_roundtrip();
    test_shm_hostile();
    TEST_PASS("handshake codec");
    return 0;
}
