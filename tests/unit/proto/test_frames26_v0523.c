/* Registration frames 18 and 19 of SGLang's release 0.5.23 (after the spec's
 * commit): mooncake/conn.py build_receiver_registration_message appends the
 * staging slot layer ids (struct.pack "Q" each; empty without staging) and
 * struct.pack(f"{len(kv_item_lens)}Q", *kv_item_lens). Found by the interop
 * suite (make check-interop): kvbridge read frame 18 as an extension and
 * dropped the registration. Also: kvbridge extensions parse after the
 * kvbridge-ext/1 marker wherever the dialect frames end (17 for a kvbridge
 * decode, 19 for 0.5.23's layout); malformed 18/19 are refused. */
#include "kvb_test.h"
#include "dialect/sglang2026/frames.h"

#include <stdint.h>
#include <string.h>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the hand-written packed arrays below are little-endian"
#endif

#define T(s) ((kvb__frame_t){(const uint8_t *)(s), sizeof(s) - 1})
#define B(a) ((kvb__frame_t){(a), sizeof(a)})
#define EMPTY ((kvb__frame_t){NULL, 0})
#define MARKER T(KVB__EXT_MARKER)

static const uint8_t KV[] = {0x00, 0x10, 0x00, 0x00, 0x00, 0x7f, 0x00, 0x00,
                             0x00, 0x20, 0x00, 0x00, 0x00, 0x7f, 0x00, 0x00};
static const uint8_t AUX[] = {0x00, 0x30, 0x00, 0x00, 0x00, 0x7f, 0x00, 0x00};
/* struct.pack("2Q", 512, 512) */
static const uint8_t LENS[] = {0, 2, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0};
static const uint8_t LENS_MIXED[] = {0, 2, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0};
static const uint8_t LENS_ONE[] = {0, 2, 0, 0, 0, 0, 0, 0};
static const uint8_t LENS_ZERO[] = {0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
/* slot layer ids [0, 97]: the second starts with 'a' */
static const uint8_t SLOTS[] = {0, 0, 0, 0, 0, 0, 0, 0, 97, 0, 0, 0, 0, 0, 0, 0};

/* What SGLang 0.5.23 sends for the plain MHA pool of the interop suite. */
static void reg20(kvb__frame_t *f)
{
    kvb__frame_t x[20] = {T("None"), T("127.0.0.1"), T("17001"), T("127.0.0.1:15001"),
                          B(KV),     B(AUX),         EMPTY,      T("0"),
                          T("1"),    T("512"),       EMPTY,      EMPTY,
                          EMPTY,     EMPTY,          EMPTY,      EMPTY,
                          T("1"),    T("0"),         EMPTY,      B(LENS)};
    memcpy(f, x, sizeof(x));
}

static void test_sglang_0523(void)
{
    kvb__frame_t f[23];
    kvb__reg26_msg_t m;
    kvb__frames_err_t e;
    reg20(f);
    CHECK_EQ(kvb__frames_classify(f, 20), KVB__MSG_REGISTRATION26);
    CHECK_EQ(kvb__frames_decode_registration26(f, 20, &e, &m), KVB_OK);
    CHECK_EQ(m.n_fixed, 20);
    CHECK_EQ(m.n_ext, 0);
    CHECK_EQ(m.staging_slot_ids.count, 0);
    CHECK_EQ(m.kv_item_lens.count, 2);
    CHECK_EQ(kvb__u64_at(m.kv_item_lens, 1), 512);
    /* 19 frames (no item lengths), and slot ids that start with a letter. */
    f[18] = B(SLOTS);
    CHECK_EQ(kvb__frames_decode_registration26(f, 19, &e, &m), KVB_OK);
    CHECK_EQ(m.n_fixed, 19);
    CHECK_EQ(m.staging_slot_ids.count, 2);
    CHECK_EQ(m.kv_item_lens.count, 0);
    /* kvbridge extensions after the marker after frame 19. */
    f[20] = MARKER;
    f[21] = T("epoch=3");
    CHECK_EQ(kvb__frames_decode_registration26(f, 22, &e, &m), KVB_OK);
    CHECK_EQ(m.n_fixed, 20);
    CHECK_EQ(m.n_ext, 1);
    CHECK_EQ(m.ext[0].len, 7);
    /* Unmarked, a 21st frame is no extension: refused. */
    f[20] = T("epoch=3");
    CHECK_EQ(kvb__frames_decode_registration26(f, 21, &e, &m), KVB_ERR_PROTO);
    CHECK(strstr(e.reason, "21 frames before any \"kvbridge-ext/1\" marker, at most 20") != NULL);
    TEST_PASS("registration (2026): SGLang 0.5.23's frames 18 and 19, extensions after them");
}

static void test_ext_after_17(void)
{
    kvb__frame_t f[20];
    kvb__reg26_msg_t m;
    kvb__frames_err_t e;
    reg20(f);
    f[18] = MARKER;
    f[19] = T("kv_lens=12345678");
    CHECK_EQ(kvb__frames_classify(f, 20), KVB__MSG_REGISTRATION26);
    CHECK_EQ(kvb__frames_decode_registration26(f, 20, &e, &m), KVB_OK);
    CHECK_EQ(m.n_fixed, 18);
    CHECK_EQ(m.n_ext, 1);
    CHECK_EQ(m.kv_item_lens.count, 0);
    CHECK_EQ(m.staging_slot_ids.count, 0);
    /* Without the marker, frame 18 is SGLang's staging slot ids (a packed
     * u64 array: 16 bytes of text read as two ids) and frame 19 its item
     * lengths: text there is refused, never taken for an extension. */
    f[18] = T("kv_lens=12345678");
    f[19] = T("kv_lens=");
    CHECK_EQ(kvb__frames_decode_registration26(f, 19, &e, &m), KVB_OK);
    CHECK_EQ(m.n_fixed, 19);
    CHECK_EQ(m.n_ext, 0);
    CHECK_EQ(m.staging_slot_ids.count, 2);
    CHECK_EQ(kvb__frames_decode_registration26(f, 20, &e, &m), KVB_ERR_PROTO);
    CHECK(strstr(e.reason, "frame 19 (dst_kv_item_lens): 1 lengths for 2 KV buffers") != NULL);
    TEST_PASS("registration (2026): a kvbridge decode's kv_lens= after the marker after 17");
}

static void test_rejects(void)
{
    kvb__frame_t f[20];
    kvb__reg26_msg_t m;
    kvb__frames_err_t e;
    reg20(f);
    f[19] = B(LENS_ONE);
    CHECK_EQ(kvb__frames_decode_registration26(f, 20, &e, &m), KVB_ERR_PROTO);
    CHECK(strstr(e.reason, "frame 19 (dst_kv_item_lens)") != NULL);
    CHECK(strstr(e.reason, "1 lengths for 2 KV buffers") != NULL);
    f[19] = B(LENS_ZERO);
    CHECK_EQ(kvb__frames_decode_registration26(f, 20, &e, &m), KVB_ERR_PROTO);
    CHECK(strstr(e.reason, "entry 1 is 0") != NULL);
    f[19] = T("abc");
    CHECK_EQ(kvb__frames_decode_registration26(f, 20, &e, &m), KVB_ERR_PROTO);
    f[19] = B(LENS);
    f[18] = T("\x01\x02\x03");
    CHECK_EQ(kvb__frames_decode_registration26(f, 20, &e, &m), KVB_ERR_PROTO);
    CHECK(strstr(e.reason, "frame 18 (staging_slot_layer_ids)") != NULL);
    /* Mixed item lengths parse; the prefill refuses the decode (prefill_ctl). */
    f[18] = EMPTY;
    f[19] = B(LENS_MIXED);
    CHECK_EQ(kvb__frames_decode_registration26(f, 20, &e, &m), KVB_OK);
    CHECK_EQ(kvb__u64_at(m.kv_item_lens, 1), 256);
    TEST_PASS("registration (2026): malformed frames 18/19 refused with the frame named");
}

int main(void)
{
    test_sglang_0523();
    test_ext_after_17();
    test_rejects();
    return 0;
}
