/* Control-frame codec, SGLang's 2026 dialect (PROTOCOL-SGLANG-2026.md 4-5):
 * exact bytes as SGLang's Python writes them (str(x).encode("ascii"),
 * struct.pack Q/I per element, the packed list-of-lists header of
 * disaggregation/common/utils.py as the spec describes it), round trips,
 * defaults for absent frames, how the two dialects are told apart, and every
 * rejection with its reason. */
#include "kvb_test.h"
#include "dialect/sglang2026/frames.h"

#include <stdint.h>
#include <stdlib.h>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the hand-written packed arrays below are little-endian"
#endif

#define T(s) ((kvb__frame_t){(const uint8_t *)(s), sizeof(s) - 1})
#define B(a) ((kvb__frame_t){(a), sizeof(a)})
#define EMPTY ((kvb__frame_t){NULL, 0})

static const uint8_t KV[] = {0x00, 0x10, 0x00, 0x00, 0x00, 0x7f, 0x00, 0x00,
                             0x00, 0x20, 0x00, 0x00, 0x00, 0x7f, 0x00, 0x00};
static const uint8_t AUX[] = {0x00, 0x30, 0x00, 0x00, 0x00, 0x7f, 0x00, 0x00};
/* [[0x7f0000004000]] packed with Q */
static const uint8_t STATE_PTRS[] = {1,    0,    0,    0,    8,    0,    0, 0,
                                     0x00, 0x40, 0x00, 0x00, 0x00, 0x7f, 0, 0};
/* [[256]] packed with I */
static const uint8_t STATE_LENS[] = {1, 0, 0, 0, 4, 0, 0, 0, 0x00, 0x01, 0x00, 0x00};
/* [[5]] packed with i (the spec's example) */
static const uint8_t STATE_IDX[] = {1, 0, 0, 0, 4, 0, 0, 0, 5, 0, 0, 0};
static const uint8_t PAGES[] = {7, 0, 0, 0, 8, 0, 0, 0, 42, 0, 0, 0};

static void check_frames(const kvb__frames_buf_t *b, const kvb__frame_t *exp, size_t n)
{
    CHECK_EQ(b->n, n);
    for (size_t i = 0; i < n; i++) {
        kvb__frame_t f = kvb__frames_buf_get(b, i);
        if (f.len != exp[i].len || (f.len && memcmp(f.data, exp[i].data, f.len) != 0)) {
            fprintf(stderr, "frame %zu differs (len %zu, want %zu)\n", i, f.len, exp[i].len);
            exit(1);
        }
    }
}

/* SGLang's plain-MHA example (spec 5.2): no state, no staging, DCP 1/0. */
static void reg_plain(kvb__frame_t *f)
{
    kvb__frame_t x[18] = {T("None"), T("10.0.0.2"), T("17001"), T("10.0.0.2:15001"),
                          B(KV),     B(AUX),        EMPTY,      T("0"),
                          T("1"),    T("4096"),     EMPTY,      EMPTY,
                          EMPTY,     EMPTY,         EMPTY,      EMPTY,
                          T("1"),    T("0")};
    memcpy(f, x, sizeof(x));
}

static void test_reg26_decode_plain(void)
{
    kvb__frame_t f[20];
    kvb__reg26_msg_t m;
    kvb__frames_err_t e;
    reg_plain(f);
    CHECK_EQ(kvb__frames_classify(f, 18), KVB__MSG_REGISTRATION26);
    CHECK_EQ(kvb__frames_decode_registration26(f, 18, &e, &m), KVB_OK);
    CHECK_EQ(m.ip_len, 8);
    CHECK(memcmp(m.ip, "10.0.0.2", 8) == 0);
    CHECK_EQ(m.port, 17001);
    CHECK_EQ(m.kv_ptrs.count, 2);
    CHECK_EQ(kvb__u64_at(m.kv_ptrs, 1), 0x7f0000002000ull);
    CHECK_EQ(m.aux_ptrs.count, 1);
    CHECK_EQ(m.state_ptrs.n, 0);
    CHECK_EQ(m.dst_tp_rank, 0);
    CHECK_EQ(m.dst_attn_tp_size, 1);
    CHECK_EQ(m.dst_kv_item_len, 4096);
    CHECK_EQ(m.kv_layer_ids.count, 0);
    CHECK(!m.has_staging_base);
    CHECK_EQ(m.staging_size, 0);
    CHECK_EQ(m.dcp_size, 1);
    CHECK_EQ(m.dcp_rank, 0);
    CHECK_EQ(m.n_fixed, 18);
    CHECK_EQ(m.n_ext, 0);
    /* Re-encoded: the same 18 frames. */
    kvb__frames_buf_t b;
    kvb__frames_buf_init(&b);
    CHECK_EQ(kvb__frames_encode_registration26(&m, &e, &b), KVB_OK);
    check_frames(&b, f, 18);
    kvb__frames_buf_free(&b);
    /* The parser's minimum, 10 frames: the rest take the spec's defaults. */
    CHECK_EQ(kvb__frames_classify(f, 10), KVB__MSG_REGISTRATION26);
    CHECK_EQ(kvb__frames_decode_registration26(f, 10, &e, &m), KVB_OK);
    CHECK_EQ(m.dcp_size, 1);
    CHECK_EQ(m.n_fixed, 10);
    /* Seed 001: 9 dialect frames, then the marker and kvbridge extensions. */
    CHECK_EQ(kvb__frames_classify(f, 9), KVB__MSG_REGISTRATION);
    f[9] = T(KVB__EXT_MARKER);
    f[10] = T("kv_lens=");
    CHECK_EQ(kvb__frames_classify(f, 11), KVB__MSG_REGISTRATION);
    TEST_PASS("registration (2026): SGLang's plain example, defaults, told apart");
}

static void test_reg26_encode_state_and_ext(void)
{
    const uint64_t kv[] = {0x7f0000001000ull, 0x7f0000002000ull};
    const uint64_t aux[] = {0x7f0000003000ull};
    const uint64_t st[] = {0x7f0000004000ull};
    const uint32_t lens[] = {256};
    uint8_t *sp, *sl;
    kvb__reg26_msg_t m = {0}, d;
    kvb__frames_err_t e;
    kvb__frames_buf_t b;
    kvb__frame_t ext = T("kv_lens=abcdefghABCDEFGH");
    CHECK_EQ(kvb__lol_pack_one(st, 1, 8, &sp, &m.state_ptrs), KVB_OK);
    CHECK_EQ(kvb__lol_pack_one(lens, 1, 4, &sl, &m.state_item_lens), KVB_OK);
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
    m.dcp_size = 1;
    m.ext = &ext;
    m.n_ext = 1;
    kvb__frames_buf_init(&b);
    CHECK_EQ(kvb__frames_encode_registration26(&m, &e, &b), KVB_OK);
    kvb__frame_t exp[20] = {T("None"),
                            T("10.0.0.2"),
                            T("17001"),
                            T("10.0.0.2:15001"),
                            B(KV),
                            B(AUX),
                            B(STATE_PTRS),
                            T("1"),
                            T("2"),
                            T("4096"),
                            B(STATE_LENS),
                            EMPTY,
                            EMPTY,
                            EMPTY,
                            EMPTY,
                            EMPTY,
                            T("1"),
                            T("0"),
                            T(KVB__EXT_MARKER),
                            ext};
    check_frames(&b, exp, 20);
    CHECK_EQ(kvb__frames_classify(exp, 20), KVB__MSG_REGISTRATION26);
    CHECK_EQ(kvb__frames_decode_registration26(exp, 20, &e, &d), KVB_OK);
    CHECK_EQ(d.state_ptrs.n, 1);
    CHECK_EQ(kvb__lol_at(d.state_ptrs, 0, 0), 0x7f0000004000ull);
    CHECK_EQ(kvb__lol_at(d.state_item_lens, 0, 0), 256);
    CHECK_EQ(d.n_ext, 1);
    kvb__frames_buf_free(&b);
    free(sp);
    free(sl);
    TEST_PASS("registration (2026): exact bytes with a state component and kv_lens=");
}

#define REJECT26(decode, type, f, n, want)                                                         \
    do {                                                                                           \
        type m_;                                                                                   \
        kvb__frames_err_t e_;                                                                      \
        CHECK_EQ(decode(f, n, &e_, &m_), KVB_ERR_PROTO);                                           \
        if (strcmp(e_.reason, want) != 0) {                                                        \
            fprintf(stderr, "%s:%d: got  \"%s\"\n want \"%s\"\n", __FILE__, __LINE__, e_.reason,   \
                    want);                                                                         \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)
#define REJ_REG(f, n, want)                                                                        \
    REJECT26(kvb__frames_decode_registration26, kvb__reg26_msg_t, f, n, want)

static void test_reg26_rejects(void)
{
    kvb__frame_t f[20];
    static const uint8_t short_hdr[] = {1, 0, 0};
    static const uint8_t bad_sum[] = {1, 0, 0, 0, 8, 0, 0, 0, 1, 2, 3, 4};
    static const uint8_t many[] = {0xff, 0, 0, 0};
    static const uint8_t odd[] = {1, 0, 0, 0, 4, 0, 0, 0, 1, 2, 3, 4};
    static const uint8_t null_ptr[] = {1, 0, 0, 0, 8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
    static const uint8_t ids3[] = {0, 0, 0, 0, 1, 0, 0, 0, 2, 0, 0, 0};
    reg_plain(f);
    REJ_REG(f, 9, "registration (2026): expected at least 10 frames, got 9");
    f[6] = B(short_hdr);
    REJ_REG(f, 18,
            "registration (2026) frame 6 (dst_state_data_ptrs): 3 bytes, shorter than "
            "the 4-byte list count");
    f[6] = B(bad_sum);
    REJ_REG(f, 18,
            "registration (2026) frame 6 (dst_state_data_ptrs): lists declare 8 payload "
            "bytes, frame holds 4");
    f[6] = B(many);
    REJ_REG(f, 18, "registration (2026) frame 6 (dst_state_data_ptrs): 255 lists, at most 64");
    f[6] = B(odd);
    REJ_REG(f, 18,
            "registration (2026) frame 6 (dst_state_data_ptrs): list 0 is 4 bytes, not a "
            "multiple of 8");
    f[6] = B(null_ptr);
    REJ_REG(f, 18,
            "registration (2026) frame 6 (dst_state_data_ptrs): list 0 entry 0 is a null "
            "address");
    f[6] = B(STATE_PTRS);
    f[10] = B(STATE_IDX); /* [[5]] as I: shaped like frame 6, accepted */
    kvb__reg26_msg_t ok;
    kvb__frames_err_t e;
    CHECK_EQ(kvb__frames_decode_registration26(f, 18, &e, &ok), KVB_OK);
    static const uint8_t two[] = {2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
    f[10] = B(two);
    REJ_REG(f, 18,
            "registration (2026) frame 10 (dst_state_item_lens): 2 lists, frame 6 has 1 "
            "state components");
    reg_plain(f);
    f[12] = B(ids3);
    REJ_REG(f, 18, "registration (2026) frame 12 (dst_kv_layer_ids): 3 ids for 2 KV buffers");
    reg_plain(f);
    f[14] = T("1234");
    REJ_REG(f, 18, "registration (2026) frame 14 (staging_base_ptr): 4 bytes, expected 8 or none");
    reg_plain(f);
    f[16] = T("2");
    f[17] = T("2");
    REJ_REG(f, 18, "registration (2026) frame 17 (dst_dcp_rank): \"2\" out of range 0..1");
    reg_plain(f);
    f[16] = T("0");
    REJ_REG(f, 18,
            "registration (2026) frame 16 (dst_dcp_size): \"0\" out of range "
            "1..2147483647");
    reg_plain(f);
    f[9] = T("0");
    REJ_REG(f, 18,
            "registration (2026) frame 9 (dst_kv_item_len): \"0\" out of range "
            "1..9223372036854775807");
    reg_plain(f);
    f[18] = T("7"); /* not key=value: SGLang 0.5.23's frame 18, packed u64 */
    REJ_REG(f, 19,
            "registration (2026) frame 18 (staging_slot_layer_ids): length 1 is not a "
            "multiple of 8");
    reg_plain(f);
    f[4] = EMPTY; /* no KV buffers: item length must be 0 */
    f[9] = T("0");
    CHECK_EQ(kvb__frames_decode_registration26(f, 18, &e, &ok), KVB_OK);
    CHECK_EQ(ok.kv_ptrs.count, 0);
    TEST_PASS("registration (2026): rejections");
}

static void xfer_real(kvb__frame_t *f)
{
    kvb__frame_t x[10] = {T("12345678901234567890"),
                          T("10.0.0.2"),
                          T("17001"),
                          T("10.0.0.2:15001"),
                          B(PAGES),
                          T("3"),
                          B(STATE_IDX),
                          T("1"),
                          T("64"),
                          EMPTY};
    memcpy(f, x, sizeof(x));
}

#define REJ_XFER(f, n, want) REJECT26(kvb__frames_decode_transfer26, kvb__xfer26_msg_t, f, n, want)

static void test_xfer26(void)
{
    kvb__frame_t f[13];
    kvb__xfer26_msg_t m;
    kvb__frames_err_t e;
    kvb__frames_buf_t b;
    xfer_real(f);
    CHECK_EQ(kvb__frames_classify(f, 10), KVB__MSG_TRANSFER26);
    CHECK_EQ(kvb__frames_decode_transfer26(f, 10, &e, &m), KVB_OK);
    CHECK_EQ(m.room, 12345678901234567890ull);
    CHECK(!m.is_dummy);
    CHECK_EQ(m.pages.count, 3);
    CHECK_EQ(kvb__i32_at(m.pages, 2), 42);
    CHECK_EQ(m.aux_index, 3);
    CHECK_EQ(m.state_idx.n, 1);
    CHECK_EQ(kvb__lol_at(m.state_idx, 0, 0), 5);
    CHECK_EQ(m.required_dst_info_num, 1);
    CHECK(m.has_prefix_len);
    CHECK_EQ(m.prefix_len, 64);
    CHECK_EQ(m.device_pages.count, 0);
    CHECK(!m.has_epoch);
    kvb__frames_buf_init(&b);
    CHECK_EQ(kvb__frames_encode_transfer26(&m, &e, &b), KVB_OK);
    check_frames(&b, f, 10);
    /* kvbridge's writer grant after frame 9 and the marker. */
    kvb__frames_buf_reset(&b);
    m.has_epoch = true;
    m.epoch = 77;
    m.ext = NULL;
    m.n_ext = 0;
    CHECK_EQ(kvb__frames_encode_transfer26(&m, &e, &b), KVB_OK);
    f[10] = T(KVB__EXT_MARKER);
    f[11] = T("epoch=77");
    check_frames(&b, f, 12);
    CHECK_EQ(kvb__frames_classify(f, 12), KVB__MSG_TRANSFER26);
    CHECK_EQ(kvb__frames_decode_transfer26(f, 12, &e, &m), KVB_OK);
    CHECK(m.has_epoch && m.epoch == 77);
    /* 8 frames (the parser's minimum): no prefix, no device pages. */
    CHECK_EQ(kvb__frames_decode_transfer26(f, 8, &e, &m), KVB_OK);
    CHECK(!m.has_prefix_len && m.prefix_len == 0);
    /* Seed 001: 7 dialect frames, then the marker and extensions; unmarked
     * frames after 6 make it 2026. */
    CHECK_EQ(kvb__frames_classify(f, 7), KVB__MSG_TRANSFER);
    f[7] = T(KVB__EXT_MARKER);
    f[8] = T("epoch=1");
    CHECK_EQ(kvb__frames_classify(f, 9), KVB__MSG_TRANSFER);
    f[7] = T("epoch=1");
    CHECK_EQ(kvb__frames_classify(f, 8), KVB__MSG_TRANSFER26);
    /* A dummy: frames 4, 5, 6 and 9 empty. */
    kvb__frame_t dummy[10] = {T("5"), T("h"), T("1"), T("h:1"), EMPTY,
                              EMPTY,  EMPTY,  T("2"), T("0"),   EMPTY};
    CHECK_EQ(kvb__frames_decode_transfer26(dummy, 10, &e, &m), KVB_OK);
    CHECK(m.is_dummy && m.aux_index == -1 && m.required_dst_info_num == 2);
    kvb__frames_buf_reset(&b);
    CHECK_EQ(kvb__frames_encode_transfer26(&m, &e, &b), KVB_OK);
    check_frames(&b, dummy, 10);
    kvb__frames_buf_free(&b);
    /* Rejections. */
    dummy[6] = B(STATE_IDX);
    REJ_XFER(dummy, 10,
             "transfer info (2026) frame 6 (dst_state_indices): 12 bytes on a dummy "
             "transfer info");
    xfer_real(f);
    f[5] = EMPTY;
    REJ_XFER(f, 10,
             "transfer info (2026) frame 5 (dst_aux_index): empty while frame 4 holds 3 "
             "page indices");
    xfer_real(f);
    f[7] = T("0");
    REJ_XFER(f, 10,
             "transfer info (2026) frame 7 (required_dst_info_num): \"0\" out of range "
             "1..2147483647");
    xfer_real(f);
    static const uint8_t neg[] = {1, 0, 0, 0, 4, 0, 0, 0, 0xff, 0xff, 0xff, 0xff};
    f[6] = B(neg);
    REJ_XFER(f, 10,
             "transfer info (2026) frame 6 (dst_state_indices): list 0 entry 0 is negative "
             "(-1)");
    xfer_real(f);
    f[8] = T("-1");
    REJ_XFER(f, 10,
             "transfer info (2026) frame 8 (decode_prefix_len): \"-1\" is not a decimal "
             "integer (digits, no sign, no leading 0)");
    xfer_real(f);
    f[9] = T("abc");
    REJ_XFER(f, 10,
             "transfer info (2026) frame 9 (dst_device_kv_indices): length 3 is not a "
             "multiple of 4");
    xfer_real(f);
    f[10] = T(KVB__EXT_MARKER);
    f[11] = T("epoch=0");
    REJ_XFER(f, 12,
             "transfer info (2026) frame 11 (extension epoch): \"0\" out of range "
             "1..9223372036854775807");
    /* kvbridge's page mask after the marker: one byte per frame-4 page. */
    xfer_real(f);
    f[10] = T(KVB__EXT_MARKER);
    f[11] = T("epoch=3");
    f[12] = T("page_mask=\x01\x00\x01");
    CHECK_EQ(kvb__frames_decode_transfer26(f, 13, &e, &m), KVB_OK);
    CHECK(m.has_page_mask && m.page_mask[1] == 0 && m.page_mask[2] == 1);
    kvb__frames_buf_init(&b);
    CHECK_EQ(kvb__frames_encode_transfer26(&m, &e, &b), KVB_OK);
    check_frames(&b, f, 13);
    kvb__frames_buf_free(&b);
    f[12] = T("page_mask=\x01\x00");
    REJ_XFER(f, 13,
             "transfer info (2026) frame 12 (extension page_mask): 2 bytes for 3 page "
             "indices");
    f[12] = T("page_mask=\x01\x02\x01");
    REJ_XFER(f, 13,
             "transfer info (2026) frame 12 (extension page_mask): byte 1 is 0x02, "
             "expected 0 or 1");
    xfer_real(f);
    f[10] = T(KVB__EXT_MARKER);
    f[11] = T("epoch=0");
    kvb__frames_err_t e2;
    CHECK_EQ(kvb__frames_decode_transfer26(f, 12, &e2, &m), KVB_ERR_PROTO);
    CHECK(e2.has_room && e2.room == 12345678901234567890ull); /* the room it names fails */
    /* Unmarked frames after 9: refused (SGLang's later frames would be
     * misread otherwise), and a marker must have an extension after it. */
    xfer_real(f);
    f[10] = T("epoch=3");
    REJ_XFER(f, 11,
             "transfer info (2026): 11 frames before any \"kvbridge-ext/1\" marker, at most 10 "
             "(kvbridge extensions follow the marker)");
    f[10] = T(KVB__EXT_MARKER);
    REJ_XFER(f, 11,
             "transfer info (2026) frame 10 (marker): \"kvbridge-ext/1\" with no extension "
             "after it");
    /* The marker ends the dialect frames: after frame 8, no frame 9. */
    f[9] = T(KVB__EXT_MARKER);
    f[10] = T("epoch=3");
    CHECK_EQ(kvb__frames_decode_transfer26(f, 11, &e, &m), KVB_OK);
    CHECK_EQ(m.n_fixed, 9);
    CHECK(m.has_epoch && m.epoch == 3 && m.device_pages.count == 0);
    TEST_PASS("transfer info (2026): bytes, epoch extension, dummy, rejections");
}

static void test_abort_and_ack(void)
{
    kvb__frames_buf_t b;
    kvb__frames_err_t e;
    kvb__abort_msg_t a = {99, "10.0.0.2", 8, 17001, false, 0}, da;
    kvb__frame_t exp[4] = {T("ABORT"), T("99"), T("10.0.0.2"), T("17001")};
    kvb__frames_buf_init(&b);
    CHECK_EQ(kvb__frames_encode_abort(&a, &e, &b), KVB_OK);
    check_frames(&b, exp, 4);
    CHECK_EQ(kvb__frames_classify(exp, 4), KVB__MSG_ABORT);
    CHECK_EQ(kvb__frames_decode_abort(exp, 4, &e, &da), KVB_OK);
    CHECK(da.room == 99 && da.port == 17001 && da.ip_len == 8);
    REJECT26(kvb__frames_decode_abort, kvb__abort_msg_t, exp, 3,
             "abort: expected 4 or 5 frames, got 3");
    exp[3] = T("0");
    REJECT26(kvb__frames_decode_abort, kvb__abort_msg_t, exp, 4,
             "abort frame 3 (port): \"0\" out of range 1..65535");
    kvb__abort_ack_msg_t k = {99, true, 3, false, 0}, dk;
    kvb__frame_t ack[3] = {T("ABORT_ACK"), T("99"), T("3")};
    kvb__frames_buf_reset(&b);
    CHECK_EQ(kvb__frames_encode_abort_ack(&k, &e, &b), KVB_OK);
    check_frames(&b, ack, 3);
    CHECK_EQ(kvb__frames_classify(ack, 3), KVB__MSG_ABORT_ACK);
    CHECK_EQ(kvb__frames_decode_abort_ack(ack, 3, &e, &dk), KVB_OK);
    CHECK(dk.room == 99 && dk.has_rank && dk.rank == 3);
    CHECK_EQ(kvb__frames_decode_abort_ack(ack, 2, &e, &dk), KVB_OK); /* SGLang's default form */
    CHECK(dk.room == 99 && !dk.has_rank);
    kvb__frames_buf_free(&b);
    kvb__frame_t five[5] = {T("ABORT_ACK"), T("99"), T("3"), T("1"), T("x")};
    REJECT26(kvb__frames_decode_abort_ack, kvb__abort_ack_msg_t, five, 5,
             "abort ack: expected 2, 3 or 4 frames, got 5");
    kvb__frame_t st[1] = {T("WATERMARK")};
    CHECK_EQ(kvb__frames_classify(st, 1), KVB__MSG_STAGING);
    st[0] = T("STAGING_REQ");
    CHECK_EQ(kvb__frames_classify(st, 1), KVB__MSG_STAGING);
    st[0] = T("CHUNK_READY");
    CHECK_EQ(kvb__frames_classify(st, 1), KVB__MSG_STAGING);
    st[0] = T("STAGING_RSP");
    CHECK_EQ(kvb__frames_classify(st, 1), KVB__MSG_STAGING);
    CHECK_STR_CONTAINS(kvb__frames_kind_name(KVB__MSG_TRANSFER26), "transfer info (2026)");
    TEST_PASS("abort, abort ack, staging kinds");
}

int main(void)
{
    test_reg26_decode_plain();
    test_reg26_encode_state_and_ext();
    test_reg26_rejects();
    test_xfer26();
    test_abort_and_ack();
    return 0;
}
