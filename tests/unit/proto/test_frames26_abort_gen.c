/* ABORT / ABORT_ACK of SGLang's release 0.5.23 (after the spec's commit),
 * with its deferred decode KV release on by default: AbortNotification.to_zmq
 * appends str(generation) as frame 4, and the decode counts only an ACK
 * whose frame 3 (AbortAck.to_zmq) echoes it ("Generation-less ABORT_ACK
 * received; ignoring it"). Found by make check-interop: kvbridge refused the
 * 5-frame ABORT ("abort: expected 4 frames, got 5"). */
#include "kvb_test.h"
#include "dialect/sglang2026/frames.h"

#include <stdint.h>
#include <string.h>

#define T(s) ((kvb__frame_t){(const uint8_t *)(s), sizeof(s) - 1})

static void check_frames(const kvb__frames_buf_t *b, const kvb__frame_t *exp, size_t n)
{
    CHECK_EQ(b->n, n);
    for (size_t i = 0; i < n; i++) {
        kvb__frame_t f = kvb__frames_buf_get(b, i);
        CHECK_EQ(f.len, exp[i].len);
        CHECK(f.len == 0 || memcmp(f.data, exp[i].data, f.len) == 0);
    }
}

static void test_abort_generation(void)
{
    kvb__frames_err_t e;
    kvb__abort_msg_t a;
    kvb__frame_t f[5] = {T("ABORT"), T("1008"), T("127.0.0.1"), T("40001"), T("7")};
    CHECK_EQ(kvb__frames_classify(f, 5), KVB__MSG_ABORT);
    CHECK_EQ(kvb__frames_decode_abort(f, 5, &e, &a), KVB_OK);
    CHECK(a.room == 1008 && a.port == 40001 && a.has_generation && a.generation == 7);
    CHECK_EQ(kvb__frames_decode_abort(f, 4, &e, &a), KVB_OK);
    CHECK(!a.has_generation);
    kvb__frames_buf_t b;
    kvb__frames_buf_init(&b);
    a = (kvb__abort_msg_t){1008, "127.0.0.1", 9, 40001, true, 7};
    CHECK_EQ(kvb__frames_encode_abort(&a, &e, &b), KVB_OK);
    check_frames(&b, f, 5);
    kvb__frames_buf_free(&b);
    f[4] = T("x");
    CHECK_EQ(kvb__frames_decode_abort(f, 5, &e, &a), KVB_ERR_PROTO);
    CHECK_STR_CONTAINS(e.reason, "abort frame 4 (generation)");
    CHECK(e.has_room && e.room == 1008);
    kvb__frame_t six[6] = {T("ABORT"), T("1"), T("127.0.0.1"), T("40001"), T("7"), T("8")};
    CHECK_EQ(kvb__frames_decode_abort(six, 6, &e, &a), KVB_ERR_PROTO);
    CHECK_STR_CONTAINS(e.reason, "expected 4 or 5 frames, got 6");
    TEST_PASS("abort: SGLang 0.5.23's generation frame parsed, bad ones refused");
}

static void test_ack_generation(void)
{
    kvb__frames_err_t e;
    kvb__frames_buf_t b;
    kvb__abort_ack_msg_t k = {1008, true, 0, true, 7}, d;
    kvb__frame_t exp[4] = {T("ABORT_ACK"), T("1008"), T("0"), T("7")};
    kvb__frames_buf_init(&b);
    CHECK_EQ(kvb__frames_encode_abort_ack(&k, &e, &b), KVB_OK);
    check_frames(&b, exp, 4);
    CHECK_EQ(kvb__frames_decode_abort_ack(exp, 4, &e, &d), KVB_OK);
    CHECK(d.room == 1008 && d.has_rank && d.rank == 0 && d.has_generation && d.generation == 7);
    CHECK_EQ(kvb__frames_decode_abort_ack(exp, 3, &e, &d), KVB_OK);
    CHECK(!d.has_generation);
    k = (kvb__abort_ack_msg_t){1008, false, 0, true, 7}; /* no rank, no generation frame */
    kvb__frames_buf_reset(&b);
    CHECK_EQ(kvb__frames_encode_abort_ack(&k, &e, &b), KVB_ERR_INVALID);
    kvb__frames_buf_free(&b);
    exp[3] = T("-1");
    CHECK_EQ(kvb__frames_decode_abort_ack(exp, 4, &e, &d), KVB_ERR_PROTO);
    CHECK_STR_CONTAINS(e.reason, "frame 3 (generation)");
    TEST_PASS("abort ack: the generation echoed as frame 3, refused when malformed");
}

int main(void)
{
    test_abort_generation();
    test_ack_generation();
    return 0;
}
