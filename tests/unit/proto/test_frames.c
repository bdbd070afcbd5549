/* Control-frame codec: seed-001 byte compatibility, round trips, and every
 * rejection with its reason text. Expected bytes are written by hand from what
 * seed 001 sends: str(x).encode("ascii"), struct.pack(f"{n}Q", ...) (native,
 * little-endian here), np.int32 .tobytes(), struct.pack(">I", len). */
#include "kvb_test.h"
#include "dialect/sglang2025/frames.h"

#include <stdint.h>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the hand-written packed arrays below are little-endian"
#endif

#define T(s) ((kvb__frame_t){(const uint8_t *)(s), sizeof(s) - 1})
#define B(a) ((kvb__frame_t){(a), sizeof(a)})
#define EMPTY ((kvb__frame_t){NULL, 0})
#define MARKER T(KVB__EXT_MARKER)

#define CHECK_STR_EQ(a, b)                                                                         \
    do {                                                                                           \
        const char *a_ = (a), *b_ = (b);                                                           \
        if (strcmp(a_, b_) != 0) {                                                                 \
            fprintf(stderr, "%s:%d: got  \"%s\"\n%*s want \"%s\"\n", __FILE__, __LINE__, a_,       \
                    (int)strlen(__FILE__) + 6, "", b_);                                            \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

static void check_frames(const kvb__frames_buf_t *b, size_t first, const kvb__frame_t *exp,
                         size_t n)
{
    CHECK_EQ(b->n - first, n);
    for (size_t i = 0; i < n; i++) {
        kvb__frame_t f = kvb__frames_buf_get(b, first + i);
        if (f.len != exp[i].len || (f.len && memcmp(f.data, exp[i].data, f.len) != 0)) {
            fprintf(stderr, "frame %zu differs (len %zu, want %zu)\n", i, f.len, exp[i].len);
            exit(1);
        }
    }
}

/* ---- registration ---- */

static const uint8_t KV_PTRS[] = {0x00, 0x10, 0x00, 0x00, 0x00, 0x7f, 0x00, 0x00,
                                  0x00, 0x20, 0x00, 0x00, 0x00, 0x7f, 0x00, 0x00};
static const uint8_t AUX_PTRS[] = {0x00, 0x30, 0x00, 0x00, 0x00, 0x7f, 0x00, 0x00};
static const uint8_t STATE_EXT[] = {'s', 't',  'a',  't',  'e',  '_',  'p',  't',  'r', 's',
                                    '=', 0x08, 0x07, 0x06, 0x05, 0x04, 0x03, 0x02, 0x01};

static void reg_frames(kvb__frame_t *f)
{
    f[0] = T("None");
    f[1] = T("10.0.0.2");
    f[2] = T("17001");
    f[3] = T("10.0.0.2:15001");
    f[4] = B(KV_PTRS);
    f[5] = B(AUX_PTRS);
    f[6] = T("1");
    f[7] = T("2");
    f[8] = T("4096");
}

static void test_registration_bytes_and_round_trip(void)
{
    const uint64_t kv[] = {0x7f0000001000ull, 0x7f0000002000ull};
    const uint64_t aux[] = {0x7f0000003000ull};
    kvb__reg_msg_t m, d;
    kvb__frames_buf_t b;
    kvb__frames_err_t e;
    kvb__frame_t exp[12];
    memset(&m, 0, sizeof(m));
    m.ip = "10.0.0.2";
    m.ip_len = 8;
    m.port = 17001;
    m.session_id = "10.0.0.2:15001";
    m.session_id_len = 14;
    m.kv_ptrs = kvb__u64_view_of(kv, 2);
    m.aux_ptrs = kvb__u64_view_of(aux, 1);
    m.dst_tp_rank = 1;
    m.dst_attn_tp_size = 2;
    m.dst_kv_item_len = 4096;
    kvb__frames_buf_init(&b);
    CHECK_EQ(kvb__frames_encode_registration(&m, &e, &b), KVB_OK);
    reg_frames(exp);
    check_frames(&b, 0, exp, 9);
    CHECK_EQ(kvb__frames_classify(exp, 9), KVB__MSG_REGISTRATION);

    CHECK_EQ(kvb__frames_decode_registration(exp, 9, &e, &d), KVB_OK);
    CHECK_EQ(d.ip_len, 8);
    CHECK(memcmp(d.ip, "10.0.0.2", 8) == 0);
    CHECK_EQ(d.port, 17001);
    CHECK_EQ(d.session_id_len, 14);
    CHECK(memcmp(d.session_id, "10.0.0.2:15001", 14) == 0);
    CHECK_EQ(d.kv_ptrs.count, 2);
    CHECK(kvb__u64_at(d.kv_ptrs, 0) == 0x7f0000001000ull);
    CHECK(kvb__u64_at(d.kv_ptrs, 1) == 0x7f0000002000ull);
    CHECK_EQ(d.aux_ptrs.count, 1);
    CHECK(kvb__u64_at(d.aux_ptrs, 0) == 0x7f0000003000ull);
    CHECK_EQ(d.dst_tp_rank, 1);
    CHECK_EQ(d.dst_attn_tp_size, 2);
    CHECK_EQ(d.dst_kv_item_len, 4096);
    CHECK(!d.has_state_ptrs);
    CHECK_EQ(d.n_ext, 0);
    /* The decoded message points into exp. */
    CHECK(d.ip == (const char *)exp[1].data);

    /* Extensions: the marker, then state_ptrs (typed) and an unknown key,
     * emitted in key order, whatever order the caller gives. */
    const uint64_t state[] = {0x0102030405060708ull};
    kvb__frame_t extra[2] = {T("zz_future=x"), T("layout={\"v\":1}")};
    m.has_state_ptrs = true;
    m.state_ptrs = kvb__u64_view_of(state, 1);
    m.ext = extra;
    m.n_ext = 2;
    kvb__frames_buf_reset(&b);
    CHECK_EQ(kvb__frames_encode_registration(&m, &e, &b), KVB_OK);
    exp[9] = MARKER;
    exp[10] = T("layout={\"v\":1}");
    exp[11] = B(STATE_EXT);
    kvb__frame_t exp2[13];
    memcpy(exp2, exp, sizeof(exp));
    exp2[12] = T("zz_future=x");
    check_frames(&b, 0, exp2, 13);
    CHECK_EQ(kvb__frames_classify(exp2, 13), KVB__MSG_REGISTRATION);
    CHECK_EQ(kvb__frames_decode_registration(exp2, 13, &e, &d), KVB_OK);
    CHECK(d.has_state_ptrs);
    CHECK_EQ(d.state_ptrs.count, 1);
    CHECK(kvb__u64_at(d.state_ptrs, 0) == 0x0102030405060708ull);
    CHECK_EQ(d.n_ext, 3);
    CHECK(d.ext == &exp2[10]);
    /* A decoded message re-encodes to the same frames (state_ptrs in ext is
     * skipped, the typed field regenerates it). */
    kvb__frames_buf_reset(&b);
    CHECK_EQ(kvb__frames_encode_registration(&d, &e, &b), KVB_OK);
    check_frames(&b, 0, exp2, 13);
    /* A known key among caller extras without the typed field is dropped. */
    kvb__frame_t stale[1] = {B(STATE_EXT)};
    m.has_state_ptrs = false;
    m.ext = stale;
    m.n_ext = 1;
    kvb__frames_buf_reset(&b);
    CHECK_EQ(kvb__frames_encode_registration(&m, &e, &b), KVB_OK);
    check_frames(&b, 0, exp, 9);
    kvb__frames_buf_free(&b);
    TEST_PASS("registration bytes and round trip");
}

/* ---- transfer info ---- */

static const uint8_t PAGES[] = {3, 0, 0, 0, 4, 0, 0, 0, 0x10, 0x27, 0, 0}; /* 3, 4, 10000 */

static void xfer_frames(kvb__frame_t *f)
{
    f[0] = T("12345678901234567890");
    f[1] = T("fe80::1");
    f[2] = T("17002");
    f[3] = T("[fe80::1]:15002");
    f[4] = B(PAGES);
    f[5] = T("7");
    f[6] = T("2");
}

static void test_transfer_bytes_and_round_trip(void)
{
    const int32_t pages[] = {3, 4, 10000};
    const int32_t sidx[] = {9, 0};
    const uint8_t mask[] = {1, 0, 1};
    kvb__xfer_msg_t m, d;
    kvb__frames_buf_t b;
    kvb__frames_err_t e;
    kvb__frame_t exp[11];
    memset(&m, 0, sizeof(m));
    m.room = 12345678901234567890ull; /* above 2^63: a full uint64 room */
    m.ip = "fe80::1";
    m.ip_len = 7;
    m.port = 17002;
    m.session_id = "[fe80::1]:15002";
    m.session_id_len = 15;
    m.pages = kvb__i32_view_of(pages, 3);
    m.aux_index = 7;
    m.required_dst_info_num = 2;
    kvb__frames_buf_init(&b);
    CHECK_EQ(kvb__frames_encode_transfer(&m, &e, &b), KVB_OK);
    xfer_frames(exp);
    check_frames(&b, 0, exp, 7);
    CHECK_EQ(kvb__frames_classify(exp, 7), KVB__MSG_TRANSFER);
    CHECK_EQ(kvb__frames_decode_transfer(exp, 7, &e, &d), KVB_OK);
    CHECK(d.room == 12345678901234567890ull);
    CHECK(!d.is_dummy);
    CHECK_EQ(d.pages.count, 3);
    CHECK_EQ(kvb__i32_at(d.pages, 2), 10000);
    CHECK_EQ(d.aux_index, 7);
    CHECK_EQ(d.required_dst_info_num, 2);
    CHECK_EQ(d.port, 17002);
    CHECK(!d.has_page_mask && !d.has_prefix_len && !d.has_state_idx);

    /* The marker, then kvbridge extensions in key order. */
    static const uint8_t MASK_EXT[] = {'p', 'a', 'g', 'e', '_', 'm', 'a', 's', 'k', '=', 1, 0, 1};
    static const uint8_t SIDX_EXT[] = {'s', 't', 'a', 't', 'e', '_', 'i', 'd', 'x',
                                       '=', 9,   0,   0,   0,   0,   0,   0,   0};
    m.has_page_mask = true;
    m.page_mask = mask;
    m.has_prefix_len = true;
    m.prefix_len = 128;
    m.has_state_idx = true;
    m.state_idx = kvb__i32_view_of(sidx, 2);
    kvb__frames_buf_reset(&b);
    CHECK_EQ(kvb__frames_encode_transfer(&m, &e, &b), KVB_OK);
    exp[7] = MARKER;
    exp[8] = B(MASK_EXT);
    exp[9] = T("prefix_len=128");
    exp[10] = B(SIDX_EXT);
    check_frames(&b, 0, exp, 11);
    CHECK_EQ(kvb__frames_classify(exp, 11), KVB__MSG_TRANSFER);
    CHECK_EQ(kvb__frames_decode_transfer(exp, 11, &e, &d), KVB_OK);
    CHECK(d.has_page_mask && d.page_mask[0] == 1 && d.page_mask[1] == 0);
    CHECK(d.has_prefix_len && d.prefix_len == 128);
    CHECK(d.has_state_idx && d.state_idx.count == 2 && kvb__i32_at(d.state_idx, 0) == 9);
    CHECK_EQ(d.n_ext, 3);
    kvb__frames_buf_reset(&b);
    CHECK_EQ(kvb__frames_encode_transfer(&d, &e, &b), KVB_OK);
    check_frames(&b, 0, exp, 11);

    /* Dummy: frames 4 and 5 empty, as seed 001 sends b"" for both. */
    memset(&m, 0, sizeof(m));
    m.room = 5;
    m.ip = "10.0.0.3";
    m.ip_len = 8;
    m.port = 1;
    m.session_id = "node-3:65535";
    m.session_id_len = 12;
    m.is_dummy = true;
    m.required_dst_info_num = 1;
    kvb__frames_buf_reset(&b);
    CHECK_EQ(kvb__frames_encode_transfer(&m, &e, &b), KVB_OK);
    kvb__frame_t dummy[7] = {T("5"), T("10.0.0.3"), T("1"), T("node-3:65535"),
                             EMPTY,  EMPTY,         T("1")};
    check_frames(&b, 0, dummy, 7);
    CHECK_EQ(kvb__frames_decode_transfer(dummy, 7, &e, &d), KVB_OK);
    CHECK(d.is_dummy);
    CHECK_EQ(d.pages.count, 0);
    CHECK_EQ(d.aux_index, -1);
    kvb__frames_buf_reset(&b);
    CHECK_EQ(kvb__frames_encode_transfer(&d, &e, &b), KVB_OK);
    check_frames(&b, 0, dummy, 7);

    /* Real rank with zero pages (all prefix-cached): empty frame 4, aux set. */
    kvb__frame_t nopages[7] = {T("0"), T("h"), T("2"), T("h:3"), EMPTY, T("0"), T("1")};
    CHECK_EQ(kvb__frames_decode_transfer(nopages, 7, &e, &d), KVB_OK);
    CHECK(!d.is_dummy);
    CHECK_EQ(d.pages.count, 0);
    CHECK_EQ(d.aux_index, 0);
    kvb__frames_buf_reset(&b);
    CHECK_EQ(kvb__frames_encode_transfer(&d, &e, &b), KVB_OK);
    check_frames(&b, 0, nopages, 7);

    /* Largest room. */
    kvb__frame_t maxroom[7];
    xfer_frames(maxroom);
    maxroom[0] = T("18446744073709551615");
    CHECK_EQ(kvb__frames_decode_transfer(maxroom, 7, &e, &d), KVB_OK);
    CHECK(d.room == UINT64_MAX);
    kvb__frames_buf_free(&b);
    TEST_PASS("transfer info bytes and round trip");
}

/* ---- status and aux ---- */

static void test_status_and_aux_bytes(void)
{
    kvb__status_msg_t s = {42, KVB__WIRE_SUCCESS, 3, NULL, 0}, sd;
    kvb__frames_buf_t b;
    kvb__frames_err_t e;
    kvb__frames_buf_init(&b);
    CHECK_EQ(kvb__frames_encode_status(&s, &e, &b), KVB_OK);
    kvb__frame_t sexp[3] = {T("42"), T("4"), T("3")};
    check_frames(&b, 0, sexp, 3);
    CHECK_EQ(kvb__frames_classify(sexp, 3), KVB__MSG_STATUS);
    CHECK_EQ(kvb__frames_decode_status(sexp, 3, &e, &sd), KVB_OK);
    CHECK(sd.room == 42 && sd.status == 4 && sd.prefill_rank == 3);
    /* Encoders append: a second message follows the first. */
    s.status = KVB__WIRE_FAILED;
    CHECK_EQ(kvb__frames_encode_status(&s, &e, &b), KVB_OK);
    kvb__frame_t sexp2[3] = {T("42"), T("0"), T("3")};
    check_frames(&b, 3, sexp2, 3);
    CHECK(sd.n_ext == 0);
    /* kvbridge's kv_digest= after the marker (docs/integrity.md): still a
     * status, the extension passed up as is */
    kvb__frame_t dig = T("kv_digest=0123456789abcdef");
    s.status = KVB__WIRE_SUCCESS;
    s.ext = &dig;
    s.n_ext = 1;
    kvb__frames_buf_reset(&b);
    CHECK_EQ(kvb__frames_encode_status(&s, &e, &b), KVB_OK);
    kvb__frame_t sexp3[5] = {T("42"), T("4"), T("3"), T("kvbridge-ext/1"),
                             T("kv_digest=0123456789abcdef")};
    check_frames(&b, 0, sexp3, 5);
    CHECK_EQ(kvb__frames_classify(sexp3, 5), KVB__MSG_STATUS);
    CHECK_EQ(kvb__frames_decode_status(sexp3, 5, &e, &sd), KVB_OK);
    CHECK(sd.n_ext == 1 && sd.ext[0].len == dig.len);
    CHECK_EQ(kvb__frames_decode_status(sexp3, 4, &e, &sd), KVB_ERR_PROTO); /* marker alone */
    CHECK_STR_CONTAINS(e.reason, "with no extension after it");
    s.ext = NULL;
    s.n_ext = 0;

    kvb__aux_msg_t a = {7, 0, 5, (const uint8_t *)"abcdefgh", 8}, ad;
    static const uint8_t LEN8[] = {0, 0, 0, 8};
    kvb__frame_t aexp[6] = {T("AUX_DATA"), T("7"), T("0"), T("5"), B(LEN8), T("abcdefgh")};
    kvb__frames_buf_reset(&b);
    CHECK_EQ(kvb__frames_encode_aux(&a, &e, &b), KVB_OK);
    check_frames(&b, 0, aexp, 6);
    CHECK_EQ(kvb__frames_classify(aexp, 6), KVB__MSG_AUX);
    CHECK_EQ(kvb__frames_decode_aux(aexp, 6, &e, &ad), KVB_OK);
    CHECK(ad.room == 7 && ad.buffer_index == 0 && ad.aux_index == 5 && ad.payload_len == 8);
    CHECK(ad.payload == aexp[5].data);

    /* struct.pack(">I", 300) == b"\x00\x00\x01\x2c" */
    static uint8_t big[300];
    static const uint8_t LEN300[] = {0x00, 0x00, 0x01, 0x2c};
    memset(big, 0xab, sizeof(big));
    kvb__aux_msg_t a2 = {UINT64_MAX, 3, 2147483647, big, sizeof(big)};
    kvb__frame_t aexp2[6] = {
        T("AUX_DATA"), T("18446744073709551615"), T("3"), T("2147483647"), B(LEN300), B(big)};
    kvb__frames_buf_reset(&b);
    CHECK_EQ(kvb__frames_encode_aux(&a2, &e, &b), KVB_OK);
    check_frames(&b, 0, aexp2, 6);
    /* Empty payload: length 0, empty frame. */
    static const uint8_t LEN0[] = {0, 0, 0, 0};
    kvb__aux_msg_t a3 = {1, 0, 0, NULL, 0};
    kvb__frame_t aexp3[6] = {T("AUX_DATA"), T("1"), T("0"), T("0"), B(LEN0), EMPTY};
    kvb__frames_buf_reset(&b);
    CHECK_EQ(kvb__frames_encode_aux(&a3, &e, &b), KVB_OK);
    check_frames(&b, 0, aexp3, 6);
    CHECK_EQ(kvb__frames_decode_aux(aexp3, 6, &e, &ad), KVB_OK);
    kvb__frames_buf_free(&b);
    TEST_PASS("status and aux bytes");
}

static void test_classify(void)
{
    kvb__frame_t f[9] = {EMPTY};
    xfer_frames(f);
    CHECK_EQ(kvb__frames_classify(NULL, 0), KVB__MSG_UNKNOWN);
    CHECK_EQ(kvb__frames_classify(f, 4), KVB__MSG_UNKNOWN); /* digits, 4 frames */
    CHECK_EQ(kvb__frames_classify(f, 3), KVB__MSG_STATUS);
    CHECK_EQ(kvb__frames_classify(f, 7), KVB__MSG_TRANSFER);
    f[0] = T("x1");
    CHECK_EQ(kvb__frames_classify(f, 3), KVB__MSG_UNKNOWN);
    f[0] = T("None");
    CHECK_EQ(kvb__frames_classify(f, 1), KVB__MSG_REGISTRATION); /* decoder rejects the count */
    f[0] = T("AUX_DATA");
    CHECK_EQ(kvb__frames_classify(f, 2), KVB__MSG_AUX);
    f[0] = T("none");
    CHECK_EQ(kvb__frames_classify(f, 9), KVB__MSG_UNKNOWN);
    CHECK_STR_EQ(kvb__frames_kind_name(KVB__MSG_TRANSFER), "transfer info");
    CHECK_STR_EQ(kvb__frames_kind_name(KVB__MSG_UNKNOWN), "unknown");
    TEST_PASS("classify");
}

/* ---- rejections ---- */

enum { K_REG, K_XFER, K_STATUS, K_AUX };

/* Decode must fail with exactly this reason and room, and leave the output
 * untouched. */
static void reject(int kind, const kvb__frame_t *f, size_t n, const char *reason, int has_room,
                   uint64_t room, int line)
{
    union {
        kvb__reg_msg_t r;
        kvb__xfer_msg_t x;
        kvb__status_msg_t s;
        kvb__aux_msg_t a;
    } out, canary;
    kvb__frames_err_t e;
    kvb_status_t st = KVB_OK;
    memset(&out, 0x5a, sizeof(out));
    memset(&canary, 0x5a, sizeof(canary));
    memset(&e, 0, sizeof(e));
    switch (kind) {
    case K_REG:
        st = kvb__frames_decode_registration(f, n, &e, &out.r);
        break;
    case K_XFER:
        st = kvb__frames_decode_transfer(f, n, &e, &out.x);
        break;
    case K_STATUS:
        st = kvb__frames_decode_status(f, n, &e, &out.s);
        break;
    default:
        st = kvb__frames_decode_aux(f, n, &e, &out.a);
        break;
    }
    if (st != KVB_ERR_PROTO || strcmp(e.reason, reason) != 0 || e.has_room != (has_room != 0) ||
        (has_room && e.room != room)) {
        fprintf(stderr,
                "test_frames.c:%d: status %d reason\n  \"%s\" (room %d %llu), want\n  \"%s\" "
                "(room %d %llu)\n",
                line, (int)st, e.reason, (int)e.has_room, (unsigned long long)e.room, reason,
                has_room, (unsigned long long)room);
        exit(1);
    }
    CHECK(memcmp(&out, &canary, sizeof(out)) == 0);
    /* NULL err is allowed. */
    switch (kind) {
    case K_REG:
        CHECK_EQ(kvb__frames_decode_registration(f, n, NULL, &out.r), KVB_ERR_PROTO);
        break;
    case K_XFER:
        CHECK_EQ(kvb__frames_decode_transfer(f, n, NULL, &out.x), KVB_ERR_PROTO);
        break;
    case K_STATUS:
        CHECK_EQ(kvb__frames_decode_status(f, n, NULL, &out.s), KVB_ERR_PROTO);
        break;
    default:
        CHECK_EQ(kvb__frames_decode_aux(f, n, NULL, &out.a), KVB_ERR_PROTO);
        break;
    }
}
#define REJECT(kind, f, n, reason, has_room, room)                                                 \
    reject(kind, f, n, reason, has_room, room, __LINE__)

/* Registration with frame i replaced. */
static void reg_bad(size_t i, kvb__frame_t v, const char *reason, int line)
{
    kvb__frame_t f[9];
    reg_frames(f);
    f[i] = v;
    reject(K_REG, f, 9, reason, 0, 0, line);
}
#define REG_BAD(i, v, reason) reg_bad(i, v, reason, __LINE__)

static void test_registration_rejects(void)
{
    kvb__frame_t f[80];
    kvb__reg_msg_t d;
    kvb__frames_err_t e;
    static char longs[300];
    static const uint8_t KV12[12] = {1};
    static const uint8_t KV_EMPTY_ENTRY[16] = {1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
    static const uint8_t AUX7[7] = {1};
    static const uint8_t BAD_IP[] = {'1', '0', 0x01, 0xff};
    static const uint8_t STATE5[] = {'s', 't', 'a', 't', 'e', '_', 'p', 't',
                                     'r', 's', '=', 1,   2,   3,   4,   5};

    memset(longs, '1', sizeof(longs));
    reg_frames(f);
    REJECT(K_REG, f, 8, "registration: expected at least 9 frames, got 8", 0, 0);
    REJECT(K_REG, NULL, 0, "registration: expected at least 9 frames, got 0", 0, 0);
    REG_BAD(0, T("none"), "registration frame 0 (tag): \"none\" is not \"None\"");
    REG_BAD(1, EMPTY, "registration frame 1 (ip): empty");
    REG_BAD(1, ((kvb__frame_t){(const uint8_t *)longs, 256}),
            "registration frame 1 (ip): 256 bytes, longer than 255");
    REG_BAD(1, T("10.0.0.2/x"),
            "registration frame 1 (ip): byte 0x2f at offset 8 not allowed in an address");
    REG_BAD(1, T("*"),
            "registration frame 1 (ip): byte 0x2a at offset 0 not allowed in an address");
    REG_BAD(1, T("[::1]"),
            "registration frame 1 (ip): byte 0x5b at offset 0 not allowed in an address");
    REG_BAD(1, B(BAD_IP),
            "registration frame 1 (ip): byte 0x01 at offset 2 not allowed in an "
            "address");
    REG_BAD(2, T("0"), "registration frame 2 (port): \"0\" out of range 1..65535");
    REG_BAD(2, T("65536"), "registration frame 2 (port): \"65536\" out of range 1..65535");
    REG_BAD(2, T("017001"),
            "registration frame 2 (port): \"017001\" is not a decimal integer "
            "(digits, no sign, no leading 0)");
    REG_BAD(2, T("+1"),
            "registration frame 2 (port): \"+1\" is not a decimal integer (digits, no "
            "sign, no leading 0)");
    REG_BAD(2, T(" 1"),
            "registration frame 2 (port): \" 1\" is not a decimal integer (digits, no "
            "sign, no leading 0)");
    REG_BAD(2, EMPTY,
            "registration frame 2 (port): \"\" is not a decimal integer (digits, no "
            "sign, no leading 0)");
    /* Peer bytes are escaped and long values truncated in the reason. */
    REG_BAD(2, T("\"\\\x00\xff"),
            "registration frame 2 (port): \"\\\"\\\\\\x00\\xff\" is not a "
            "decimal integer (digits, no sign, no leading 0)");
    REG_BAD(2, ((kvb__frame_t){(const uint8_t *)longs, 50}),
            "registration frame 2 (port): \"11111111111111111111111111111111\"... (50 bytes) out "
            "of range 1..65535");
    REG_BAD(3, T("host"),
            "registration frame 3 (session id): \"host\" is not host:port or "
            "[v6]:port (port 1..65535)");
    REG_BAD(3, EMPTY, "registration frame 3 (session id): empty");
    REG_BAD(3, ((kvb__frame_t){(const uint8_t *)longs, 256}),
            "registration frame 3 (session id): 256 bytes, longer than 255");
    static const char *const bad_sessions[] = {
        "fe80::1:15001", "[fe80::1]15001", "[]:1", "h:0",        "h:70000", ":80",    "h:",
        "[fe80::1]:",    "a b:1",          "h:01", "[fe80::1:1", "h:1:2",   "[a]:1x", "h:-1",
        "[a/b]:1",       "h*:1",           "h:+1", "[a]]:1"};
    for (size_t i = 0; i < sizeof(bad_sessions) / sizeof(bad_sessions[0]); i++) {
        char want[200];
        snprintf(want, sizeof(want),
                 "registration frame 3 (session id): \"%s\" is not host:port or [v6]:port (port "
                 "1..65535)",
                 bad_sessions[i]);
        reg_bad(3, (kvb__frame_t){(const uint8_t *)bad_sessions[i], strlen(bad_sessions[i])}, want,
                __LINE__);
    }
    REG_BAD(4, B(KV12), "registration frame 4 (kv_ptrs): length 12 is not a multiple of 8");
    REG_BAD(4, EMPTY, "registration frame 4 (kv_ptrs): empty");
    REG_BAD(4, B(KV_EMPTY_ENTRY), "registration frame 4 (kv_ptrs): entry 1 is a null address");
    REG_BAD(5, B(AUX7), "registration frame 5 (aux_ptrs): length 7 is not a multiple of 8");
    REG_BAD(6, T("-1"),
            "registration frame 6 (dst_tp_rank): \"-1\" is not a decimal integer "
            "(digits, no sign, no leading 0)");
    REG_BAD(6, T("2147483648"),
            "registration frame 6 (dst_tp_rank): \"2147483648\" out of range 0..2147483647");
    REG_BAD(7, T("0"), "registration frame 7 (dst_attn_tp_size): \"0\" out of range 1..2147483647");
    REG_BAD(8, T("0"),
            "registration frame 8 (dst_kv_item_len): \"0\" out of range 1..9223372036854775807");
    REG_BAD(8, T("9223372036854775808"),
            "registration frame 8 (dst_kv_item_len): "
            "\"9223372036854775808\" out of range "
            "1..9223372036854775807");
    REG_BAD(8, T("4096.0"),
            "registration frame 8 (dst_kv_item_len): \"4096.0\" is not a decimal "
            "integer (digits, no sign, no leading 0)");

    /* Accepted edges: 255-byte ip, empty aux_ptrs, unknown empty extension. */
    reg_frames(f);
    f[9] = MARKER;
    f[1] = (kvb__frame_t){(const uint8_t *)longs, 255};
    f[5] = EMPTY;
    f[10] = T("zzz=");
    CHECK_EQ(kvb__frames_decode_registration(f, 11, &e, &d), KVB_OK);
    CHECK_EQ(d.aux_ptrs.count, 0);
    CHECK(!d.has_state_ptrs);
    CHECK_EQ(d.n_ext, 1);
    f[3] = T("[::ffff:10.0.0.2%eth0]:1");
    CHECK_EQ(kvb__frames_decode_registration(f, 11, &e, &d), KVB_OK);

    /* Extension frames. */
    static const char *const bad_ext[] = {"foo",   "Key=1", "=x",   "1a=2",
                                          "a-b=1", "a b=1", "z.=1", "a"};
    for (size_t i = 0; i < sizeof(bad_ext) / sizeof(bad_ext[0]); i++) {
        char want[200];
        reg_frames(f);
        f[9] = MARKER;
        f[10] = (kvb__frame_t){(const uint8_t *)bad_ext[i], strlen(bad_ext[i])};
        snprintf(want, sizeof(want),
                 "registration frame 10 (extension): \"%s\" is not key=value (key "
                 "[a-z][a-z0-9_]*, at most 32 bytes)",
                 bad_ext[i]);
        reject(K_REG, f, 11, want, 0, 0, __LINE__);
    }
    reg_frames(f);
    f[9] = MARKER;
    f[10] = T("abcdefghijklmnopqrstuvwxyz0123456=1"); /* 33-byte key */
    REJECT(K_REG, f, 11,
           "registration frame 10 (extension): \"abcdefghijklmnopqrstuvwxyz012345\"... "
           "(35 bytes) is not key=value (key [a-z][a-z0-9_]*, at most 32 bytes)",
           0, 0);
    f[10] = T("abcdefghijklmnopqrstuvwxyz012345=1"); /* 32-byte key: fine */
    CHECK_EQ(kvb__frames_decode_registration(f, 11, &e, &d), KVB_OK);
    f[10] = T("b=1");
    f[11] = T("a=1");
    REJECT(K_REG, f, 12,
           "registration frame 11 (extension): key \"a\" does not follow \"b\" (keys "
           "must be strictly ascending)",
           0, 0);
    f[11] = T("b=2");
    REJECT(K_REG, f, 12,
           "registration frame 11 (extension): key \"b\" does not follow \"b\" (keys "
           "must be strictly ascending)",
           0, 0);
    f[10] = T("a1=1"); /* key order, not frame-byte order: "a" < "a1" although '=' > '1' */
    f[11] = T("a=1");
    REJECT(K_REG, f, 12,
           "registration frame 11 (extension): key \"a\" does not follow \"a1\" "
           "(keys must be strictly ascending)",
           0, 0);
    f[10] = T("a=1");
    f[11] = T("a1=1");
    CHECK_EQ(kvb__frames_decode_registration(f, 12, &e, &d), KVB_OK);
    f[10] = B(STATE5);
    REJECT(K_REG, f, 11,
           "registration frame 10 (extension state_ptrs): length 5 is not a multiple "
           "of 8",
           0, 0);
    f[10] = T("state_ptrs=\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00");
    REJECT(K_REG, f, 11, "registration frame 10 (extension state_ptrs): entry 1 is a null address",
           0, 0);
    reg_frames(f);
    f[9] = MARKER;
    static char keys[65][8];
    for (int i = 0; i < 65; i++) {
        snprintf(keys[i], sizeof(keys[i]), "k%03d=", i);
        f[10 + i] = (kvb__frame_t){(const uint8_t *)keys[i], strlen(keys[i])};
    }
    CHECK_EQ(kvb__frames_decode_registration(f, 10 + 64, &e, &d), KVB_OK);
    CHECK_EQ(d.n_ext, 64);
    REJECT(K_REG, f, 10 + 65, "registration: 65 extension frames, at most 64 allowed", 0, 0);

    /* The marker: extensions only after it; nothing unmarked after frame 8
     * (a seed-001 registration has exactly 9 dialect frames, more is 2026). */
    reg_frames(f);
    f[9] = T("zzz=1");
    CHECK_EQ(kvb__frames_classify(f, 10), KVB__MSG_REGISTRATION26);
    REJECT(K_REG, f, 10,
           "registration: 10 frames before any \"kvbridge-ext/1\" marker, at most 9 "
           "(kvbridge extensions follow the marker)",
           0, 0);
    f[9] = MARKER;
    REJECT(K_REG, f, 10,
           "registration frame 9 (marker): \"kvbridge-ext/1\" with no extension after it", 0, 0);
    f[10] = MARKER; /* a second marker is no extension */
    REJECT(K_REG, f, 11,
           "registration frame 10 (extension): \"kvbridge-ext/1\" is not key=value (key "
           "[a-z][a-z0-9_]*, at most 32 bytes)",
           0, 0);
    f[8] = MARKER; /* too early: the dialect frames end at the marker */
    f[9] = T("zzz=1");
    CHECK_EQ(kvb__frames_classify(f, 10), KVB__MSG_REGISTRATION);
    REJECT(K_REG, f, 10, "registration: expected at least 9 frames, got 8", 0, 0);
    TEST_PASS("registration rejects");
}

/* Transfer info with frame i replaced (and n frames). */
static void xfer_bad(size_t i, kvb__frame_t v, const char *reason, int has_room, uint64_t room,
                     int line)
{
    kvb__frame_t f[7];
    xfer_frames(f);
    f[i] = v;
    reject(K_XFER, f, 7, reason, has_room, room, line);
}
#define XFER_BAD(i, v, reason) xfer_bad(i, v, reason, 1, 12345678901234567890ull, __LINE__)

static void test_transfer_rejects(void)
{
    kvb__frame_t f[10];
    static const uint8_t P6[6] = {0};
    static const uint8_t PNEG[8] = {1, 0, 0, 0, 0xfe, 0xff, 0xff, 0xff}; /* 1, -2 */
    static const uint8_t P2[8] = {1, 0, 0, 0, 2, 0, 0, 0};
    xfer_frames(f);
    REJECT(K_XFER, f, 6, "transfer info: expected at least 7 frames, got 6", 1,
           12345678901234567890ull);
    f[0] = T("abc");
    REJECT(K_XFER, f, 6, "transfer info: expected at least 7 frames, got 6", 0, 0);
    xfer_bad(0, T("abc"),
             "transfer info frame 0 (room): \"abc\" is not a decimal integer in "
             "0..18446744073709551615",
             0, 0, __LINE__);
    xfer_bad(0, T("18446744073709551616"),
             "transfer info frame 0 (room): \"18446744073709551616\" "
             "is not a decimal integer in 0..18446744073709551615",
             0, 0, __LINE__);
    xfer_bad(0, T("-1"),
             "transfer info frame 0 (room): \"-1\" is not a decimal integer in "
             "0..18446744073709551615",
             0, 0, __LINE__);
    xfer_bad(0, T("00"),
             "transfer info frame 0 (room): \"00\" is not a decimal integer in "
             "0..18446744073709551615",
             0, 0, __LINE__);
    XFER_BAD(1, T("a;b"),
             "transfer info frame 1 (ip): byte 0x3b at offset 1 not allowed in an "
             "address");
    XFER_BAD(2, T("99999"), "transfer info frame 2 (port): \"99999\" out of range 1..65535");
    XFER_BAD(3, T("x"),
             "transfer info frame 3 (session id): \"x\" is not host:port or [v6]:port "
             "(port 1..65535)");
    XFER_BAD(4, B(P6), "transfer info frame 4 (dst page indices): length 6 is not a multiple of 4");
    XFER_BAD(4, B(PNEG), "transfer info frame 4 (dst page indices): entry 1 is negative (-2)");
    XFER_BAD(5, EMPTY,
             "transfer info frame 5 (aux index): empty while frame 4 holds 3 page "
             "indices");
    XFER_BAD(5, T("x"),
             "transfer info frame 5 (aux index): \"x\" is not a decimal integer "
             "(digits, no sign, no leading 0)");
    XFER_BAD(5, T("-1"),
             "transfer info frame 5 (aux index): \"-1\" is not a decimal integer "
             "(digits, no sign, no leading 0)");
    XFER_BAD(6, T("0"),
             "transfer info frame 6 (required_dst_info_num): \"0\" out of range "
             "1..2147483647");
    XFER_BAD(6, EMPTY,
             "transfer info frame 6 (required_dst_info_num): \"\" is not a decimal "
             "integer (digits, no sign, no leading 0)");

    xfer_frames(f);
    f[7] = MARKER;
    f[8] = T("page_mask=\x01\x00");
    REJECT(K_XFER, f, 9, "transfer info frame 8 (extension page_mask): 2 bytes for 3 page indices",
           1, 12345678901234567890ull);
    f[8] = T("page_mask=\x01\x02\x00");
    REJECT(K_XFER, f, 9,
           "transfer info frame 8 (extension page_mask): byte 1 is 0x02, expected 0 "
           "or 1",
           1, 12345678901234567890ull);
    f[8] = T("prefix_len=-3");
    REJECT(K_XFER, f, 9,
           "transfer info frame 8 (extension prefix_len): \"-3\" is not a decimal "
           "integer (digits, no sign, no leading 0)",
           1, 12345678901234567890ull);
    f[8] = T("state_idx=\x01\x00\x00");
    REJECT(K_XFER, f, 9,
           "transfer info frame 8 (extension state_idx): length 3 is not a multiple "
           "of 4",
           1, 12345678901234567890ull);
    f[8] = T("state_idx=\xff\xff\xff\xff");
    REJECT(K_XFER, f, 9, "transfer info frame 8 (extension state_idx): entry 0 is negative (-1)", 1,
           12345678901234567890ull);
    f[8] = T("prefix_len=5");
    f[9] = T("page_mask=\x01\x01\x01");
    REJECT(K_XFER, f, 10,
           "transfer info frame 9 (extension): key \"page_mask\" does not follow "
           "\"prefix_len\" (keys must be strictly ascending)",
           1, 12345678901234567890ull);
    /* TokenSpeed-style positional extras are not kvbridge extensions. */
    f[8] = T("0");
    REJECT(K_XFER, f, 9,
           "transfer info frame 8 (extension): \"0\" is not key=value (key "
           "[a-z][a-z0-9_]*, at most 32 bytes)",
           1, 12345678901234567890ull);
    /* Dummy with a page mask must have it empty. */
    kvb__frame_t dummy[9] = {T("5"), T("h"), T("1"), T("h:1"),           EMPTY,
                             EMPTY,  T("1"), MARKER, T("page_mask=\x01")};
    REJECT(K_XFER, dummy, 9,
           "transfer info frame 8 (extension page_mask): 1 bytes for 0 page "
           "indices",
           1, 5);

    /* Unmarked frames after frame 6 make it a 2026 transfer info. */
    xfer_frames(f);
    f[7] = T("epoch=3");
    CHECK_EQ(kvb__frames_classify(f, 8), KVB__MSG_TRANSFER26);
    REJECT(K_XFER, f, 8,
           "transfer info: 8 frames before any \"kvbridge-ext/1\" marker, at most 7 "
           "(kvbridge extensions follow the marker)",
           1, 12345678901234567890ull);

    /* Pool bound, checked by the caller. */
    kvb__frames_err_t e;
    kvb__xfer_msg_t d;
    xfer_frames(f);
    f[4] = B(P2);
    CHECK_EQ(kvb__frames_decode_transfer(f, 7, &e, &d), KVB_OK);
    CHECK_EQ(kvb__frames_check_indices(d.pages, 3, "transfer info frame 4 (dst page indices)", &e),
             KVB_OK);
    memset(&e, 0, sizeof(e));
    CHECK_EQ(kvb__frames_check_indices(d.pages, 2, "transfer info frame 4 (dst page indices)", &e),
             KVB_ERR_PROTO);
    CHECK_STR_EQ(e.reason,
                 "transfer info frame 4 (dst page indices): entry 1 is 2, outside the pool of 2");
    CHECK_EQ(kvb__frames_check_indices(d.pages, 0, "x", NULL), KVB_ERR_PROTO);
    kvb__i32_view_t none = {NULL, 0};
    CHECK_EQ(kvb__frames_check_indices(none, 0, "x", NULL), KVB_OK);
    TEST_PASS("transfer info rejects");
}

static void test_status_rejects(void)
{
    kvb__frame_t f[4] = {T("9"), T("4"), T("0"), T("x")};
    REJECT(K_STATUS, f, 4, "status: expected 3 frames, got 4", 1, 9);
    REJECT(K_STATUS, f, 2, "status: expected 3 frames, got 2", 1, 9);
    REJECT(K_STATUS, NULL, 0, "status: expected 3 frames, got 0", 0, 0);
    f[1] = T("5");
    REJECT(K_STATUS, f, 3, "status frame 1 (status): \"5\" out of range 0..4", 1, 9);
    f[1] = T("99999999999999999999");
    REJECT(K_STATUS, f, 3, "status frame 1 (status): \"99999999999999999999\" out of range 0..4", 1,
           9);
    f[1] = T("Success");
    REJECT(K_STATUS, f, 3,
           "status frame 1 (status): \"Success\" is not a decimal integer (digits, "
           "no sign, no leading 0)",
           1, 9);
    f[1] = T("0");
    f[2] = T("-1");
    REJECT(K_STATUS, f, 3,
           "status frame 2 (prefill_rank): \"-1\" is not a decimal integer "
           "(digits, no sign, no leading 0)",
           1, 9);
    f[0] = T("-9");
    f[2] = T("0");
    REJECT(K_STATUS, f, 3,
           "status frame 0 (room): \"-9\" is not a decimal integer in "
           "0..18446744073709551615",
           0, 0);
    TEST_PASS("status rejects");
}

static void test_aux_rejects(void)
{
    static const uint8_t LEN8[] = {0, 0, 0, 8};
    static const uint8_t LEN3[] = {0, 0, 8};
    static const uint8_t LEN16[] = {0, 0, 0, 16};
    kvb__frame_t f[7] = {T("AUX_DATA"), T("77"), T("1"), T("2"), B(LEN8), T("abcdefgh"), T("x")};
    kvb__frames_err_t e;
    kvb__aux_msg_t d;
    REJECT(K_AUX, f, 5, "aux data: expected 6 frames, got 5", 1, 77);
    REJECT(K_AUX, f, 7, "aux data: expected 6 frames, got 7", 1, 77);
    REJECT(K_AUX, f, 1, "aux data: expected 6 frames, got 1", 0, 0);
    f[0] = T("AUX_DATA ");
    REJECT(K_AUX, f, 6, "aux data frame 0 (tag): \"AUX_DATA \" is not \"AUX_DATA\"", 0, 0);
    f[0] = T("AUX_DATA");
    f[1] = T("r");
    REJECT(K_AUX, f, 6,
           "aux data frame 1 (room): \"r\" is not a decimal integer in "
           "0..18446744073709551615",
           0, 0);
    f[1] = T("77");
    f[2] = T("a");
    REJECT(K_AUX, f, 6,
           "aux data frame 2 (buffer index): \"a\" is not a decimal integer (digits, "
           "no sign, no leading 0)",
           1, 77);
    f[2] = T("1");
    f[3] = T("2147483648");
    REJECT(K_AUX, f, 6, "aux data frame 3 (aux index): \"2147483648\" out of range 0..2147483647",
           1, 77);
    f[3] = T("2");
    f[4] = B(LEN3);
    REJECT(K_AUX, f, 6, "aux data frame 4 (length): 3 bytes, expected 4 (big-endian uint32)", 1,
           77);
    f[4] = B(LEN16);
    REJECT(K_AUX, f, 6, "aux data frame 5 (payload): 8 bytes, frame 4 declares 16", 1, 77);
    f[4] = B(LEN8);
    f[5] = T("abcdefg");
    REJECT(K_AUX, f, 6, "aux data frame 5 (payload): 7 bytes, frame 4 declares 8", 1, 77);

    /* Caller-bounded checks. */
    f[5] = T("abcdefgh");
    CHECK_EQ(kvb__frames_decode_aux(f, 6, &e, &d), KVB_OK);
    const uint64_t item_lens[2] = {16, 8};
    const uint64_t n_items[2] = {10, 3};
    CHECK_EQ(kvb__frames_check_aux(&d, 2, item_lens, n_items, &e), KVB_OK);
    memset(&e, 0, sizeof(e));
    CHECK_EQ(kvb__frames_check_aux(&d, 1, item_lens, n_items, &e), KVB_ERR_PROTO);
    CHECK_STR_EQ(e.reason, "aux data frame 2 (buffer index): 1 outside the 1 aux buffers");
    CHECK(e.has_room && e.room == 77);
    const uint64_t few[2] = {10, 2};
    CHECK_EQ(kvb__frames_check_aux(&d, 2, item_lens, few, &e), KVB_ERR_PROTO);
    CHECK_STR_EQ(e.reason, "aux data frame 3 (aux index): 2 outside the 2 items of aux buffer 1");
    const uint64_t lens16[2] = {16, 16};
    CHECK_EQ(kvb__frames_check_aux(&d, 2, lens16, n_items, &e), KVB_ERR_PROTO);
    CHECK_STR_EQ(e.reason, "aux data frame 5 (payload): 8 bytes, aux buffer 1 has items of 16");
    CHECK_EQ(kvb__frames_check_aux(&d, 0, NULL, NULL, NULL), KVB_ERR_PROTO);
    TEST_PASS("aux rejects");
}

static void test_encode_rejects(void)
{
    kvb__frames_buf_t b;
    kvb__frames_err_t e;
    kvb__frames_buf_init(&b);
    kvb__status_msg_t s = {1, 2, 0, NULL, 0};
    CHECK_EQ(kvb__frames_encode_status(&s, &e, &b), KVB_OK);
    CHECK_EQ(b.n, 3);
    size_t len0 = b.len;

    /* Invalid fields: KVB_ERR_INVALID, the decoder's reason, out unchanged. */
    s.status = 5;
    CHECK_EQ(kvb__frames_encode_status(&s, &e, &b), KVB_ERR_INVALID);
    CHECK_STR_EQ(e.reason, "status frame 1 (status): \"5\" out of range 0..4");
    CHECK_EQ(b.n, 3);
    CHECK_EQ(b.len, len0);
    s.status = 4;
    s.prefill_rank = -1;
    CHECK_EQ(kvb__frames_encode_status(&s, NULL, &b), KVB_ERR_INVALID);
    CHECK_EQ(b.n, 3);

    const uint64_t kv[1] = {0x1000};
    kvb__reg_msg_t r;
    memset(&r, 0, sizeof(r));
    r.ip = "h";
    r.ip_len = 1;
    r.port = 0;
    r.session_id = "h:1";
    r.session_id_len = 3;
    r.kv_ptrs = kvb__u64_view_of(kv, 1);
    r.dst_attn_tp_size = 1;
    r.dst_kv_item_len = 1;
    CHECK_EQ(kvb__frames_encode_registration(&r, &e, &b), KVB_ERR_INVALID);
    CHECK_STR_EQ(e.reason, "registration frame 2 (port): \"0\" out of range 1..65535");
    CHECK_EQ(b.n, 3);
    r.port = 1;
    r.ip = NULL;
    CHECK_EQ(kvb__frames_encode_registration(&r, &e, &b), KVB_ERR_INVALID);
    CHECK_STR_EQ(e.reason, "registration: NULL array with a non-zero length");
    r.ip = "h";
    kvb__frame_t dup[2] = {T("a=1"), T("a=2")};
    r.ext = dup;
    r.n_ext = 2;
    CHECK_EQ(kvb__frames_encode_registration(&r, &e, &b), KVB_ERR_INVALID);
    CHECK_STR_EQ(e.reason, "registration frame 11 (extension): key \"a\" does not follow \"a\" "
                           "(keys must be strictly ascending)");
    kvb__frame_t junk[1] = {T("nokey")};
    r.ext = junk;
    r.n_ext = 1;
    CHECK_EQ(kvb__frames_encode_registration(&r, &e, &b), KVB_ERR_INVALID);
    CHECK_EQ(b.n, 3);
    r.n_ext = 0;
    CHECK_EQ(kvb__frames_encode_registration(&r, &e, &b), KVB_OK);
    CHECK_EQ(b.n, 12);

    const int32_t pages[2] = {1, 2};
    kvb__xfer_msg_t x;
    memset(&x, 0, sizeof(x));
    x.room = 3;
    x.ip = "h";
    x.ip_len = 1;
    x.port = 1;
    x.session_id = "h:1";
    x.session_id_len = 3;
    x.is_dummy = true;
    x.pages = kvb__i32_view_of(pages, 2);
    x.required_dst_info_num = 1;
    CHECK_EQ(kvb__frames_encode_transfer(&x, &e, &b), KVB_ERR_INVALID);
    CHECK_STR_EQ(e.reason, "transfer info: a dummy transfer info carries no page indices");
    x.is_dummy = false;
    x.aux_index = -1;
    CHECK_EQ(kvb__frames_encode_transfer(&x, &e, &b), KVB_ERR_INVALID);
    CHECK_STR_EQ(e.reason, "transfer info frame 5 (aux index): \"-1\" is not a decimal integer "
                           "(digits, no sign, no leading 0)");
    CHECK(e.has_room && e.room == 3);
    x.aux_index = 0;
    x.prefix_len = -1;
    x.has_prefix_len = true;
    CHECK_EQ(kvb__frames_encode_transfer(&x, &e, &b), KVB_ERR_INVALID);
    CHECK_EQ(b.n, 12);

    kvb__aux_msg_t a = {1, -1, 0, (const uint8_t *)"x", 1};
    CHECK_EQ(kvb__frames_encode_aux(&a, &e, &b), KVB_ERR_INVALID);
    CHECK_STR_EQ(e.reason, "aux data frame 2 (buffer index): \"-1\" is not a decimal integer "
                           "(digits, no sign, no leading 0)");
    a.buffer_index = 0;
    a.payload = NULL;
    CHECK_EQ(kvb__frames_encode_aux(&a, &e, &b), KVB_ERR_INVALID);
    CHECK_STR_EQ(e.reason, "aux data: NULL payload with a non-zero length");
    CHECK_EQ(b.n, 12);
    kvb__frames_buf_free(&b);
    CHECK(b.data == NULL && b.n == 0);
    kvb__frames_buf_free(&b); /* idempotent */
    TEST_PASS("encode rejects");
}

int main(void)
{
    test_registration_bytes_and_round_trip();
    test_transfer_bytes_and_round_trip();
    test_status_and_aux_bytes();
    test_classify();
    test_registration_rejects();
    test_transfer_rejects();
    test_status_rejects();
    test_aux_rejects();
    test_encode_rejects();
    return 0;
}
