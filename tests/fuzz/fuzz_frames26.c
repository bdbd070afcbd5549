/* Fuzz harness for the 2026-dialect control frames (src/proto/frames.c,
 * frames26.h).
 *
 * Input: one selector byte, then frames, each a 2-byte little-endian length
 * followed by that many bytes (the last frame takes what is left when the
 * input is short). Selector % 5: 0 classify and dispatch as a receiver would,
 * 1 registration (2026), 2 transfer info (2026), 3 abort, 4 abort ack.
 *
 * Properties: no crash or sanitizer report on any input; a rejection has a
 * non-empty printable one-line reason; an accepted message is classified as
 * its kind, re-encodes, decodes again, and re-encodes to the same bytes
 * (the encoder is canonical: it always writes all 18 / 10 frames); abort and
 * abort ack re-encode to exactly the input. */
#include "dialect/sglang2026/frames.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_FRAMES 200
#define FUZZ_NAME "fuzz_frames26"
#include "fuzz_frames_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void fuzz_reg(const kvb__frame_t *f, size_t n, kvb__frames_err_t *e)
{
    kvb__reg26_msg_t m, m2;
    kvb__frames_buf_t b1, b2;
    if (kvb__frames_decode_registration26(f, n, e, &m) != KVB_OK) {
        check_reason(e);
        return;
    }
    if (kvb__frames_classify(f, n) != KVB__MSG_REGISTRATION26)
        die("accepted 2026 registration classified otherwise");
    kvb__frames_buf_init(&b1);
    kvb__frames_buf_init(&b2);
    if (kvb__frames_encode_registration26(&m, e, &b1) != KVB_OK)
        die("accepted 2026 registration does not re-encode");
    kvb__frame_t *g = frames_of(&b1);
    if (kvb__frames_decode_registration26(g, b1.n, e, &m2) != KVB_OK ||
        kvb__frames_encode_registration26(&m2, e, &b2) != KVB_OK)
        die("re-encoded 2026 registration does not decode");
    same_bytes(&b1, &b2);
    if (m2.kv_ptrs.count != m.kv_ptrs.count || m2.state_ptrs.n != m.state_ptrs.n ||
        m2.dcp_size != m.dcp_size || m2.dst_kv_item_len != m.dst_kv_item_len)
        die("re-encoded 2026 registration changed a field");
    for (uint32_t i = 0; i < m.state_ptrs.n; i++)
        (void)kvb__lol_at(m.state_ptrs, i, 0 * i);
    free(g);
    kvb__frames_buf_free(&b1);
    kvb__frames_buf_free(&b2);
}

static void fuzz_xfer(const kvb__frame_t *f, size_t n, kvb__frames_err_t *e)
{
    kvb__xfer26_msg_t m, m2;
    kvb__frames_buf_t b1, b2;
    if (kvb__frames_decode_transfer26(f, n, e, &m) != KVB_OK) {
        check_reason(e);
        return;
    }
    if (kvb__frames_classify(f, n) != KVB__MSG_TRANSFER26)
        die("accepted 2026 transfer info classified otherwise");
    kvb__frames_buf_init(&b1);
    kvb__frames_buf_init(&b2);
    if (kvb__frames_encode_transfer26(&m, e, &b1) != KVB_OK)
        die("accepted 2026 transfer info does not re-encode");
    kvb__frame_t *g = frames_of(&b1);
    if (kvb__frames_decode_transfer26(g, b1.n, e, &m2) != KVB_OK ||
        kvb__frames_encode_transfer26(&m2, e, &b2) != KVB_OK)
        die("re-encoded 2026 transfer info does not decode");
    same_bytes(&b1, &b2);
    if (m2.room != m.room || m2.pages.count != m.pages.count || m2.is_dummy != m.is_dummy ||
        m2.prefix_len != m.prefix_len || m2.has_epoch != m.has_epoch || m2.epoch != m.epoch ||
        m2.has_page_mask != m.has_page_mask)
        die("re-encoded 2026 transfer info changed a field");
    for (uint32_t i = 0; i < m.state_idx.n; i++) {
        const uint8_t *d;
        size_t count;
        kvb__lol_list(m.state_idx, i, &d, &count);
        for (size_t k = 0; k < count; k++)
            if ((int32_t)kvb__lol_at(m.state_idx, i, k) < 0)
                die("accepted a negative state index");
    }
    free(g);
    kvb__frames_buf_free(&b1);
    kvb__frames_buf_free(&b2);
}

static void fuzz_abort(const kvb__frame_t *f, size_t n, kvb__frames_err_t *e, bool ack)
{
    kvb__frames_buf_t b;
    kvb_status_t st;
    kvb__frames_buf_init(&b);
    if (ack) {
        kvb__abort_ack_msg_t m;
        st = kvb__frames_decode_abort_ack(f, n, e, &m);
        if (st == KVB_OK && (kvb__frames_classify(f, n) != KVB__MSG_ABORT_ACK ||
                             kvb__frames_encode_abort_ack(&m, e, &b) != KVB_OK))
            die("accepted abort ack misclassified or not re-encodable");
    } else {
        kvb__abort_msg_t m;
        st = kvb__frames_decode_abort(f, n, e, &m);
        if (st == KVB_OK && (kvb__frames_classify(f, n) != KVB__MSG_ABORT ||
                             kvb__frames_encode_abort(&m, e, &b) != KVB_OK))
            die("accepted abort misclassified or not re-encodable");
    }
    if (st == KVB_OK)
        same_frames(&b, f, n);
    else
        check_reason(e);
    kvb__frames_buf_free(&b);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    kvb__frame_t frames[MAX_FRAMES];
    size_t n = 0, off = 1;
    kvb__frames_err_t e;
    if (size == 0)
        return 0;
    while (off < size && n < MAX_FRAMES) {
        size_t len = data[off];
        if (off + 1 < size)
            len |= (size_t)data[off + 1] << 8;
        off += 2;
        if (off > size)
            off = size;
        if (len > size - off)
            len = size - off;
        frames[n].data = data + off;
        frames[n].len = len;
        n++;
        off += len;
    }
    kvb__msg_kind_t kind = (kvb__msg_kind_t)0;
    switch (data[0] % 5) {
    case 1:
        kind = KVB__MSG_REGISTRATION26;
        break;
    case 2:
        kind = KVB__MSG_TRANSFER26;
        break;
    case 3:
        kind = KVB__MSG_ABORT;
        break;
    case 4:
        kind = KVB__MSG_ABORT_ACK;
        break;
    default:
        kind = kvb__frames_classify(frames, n);
        break;
    }
    memset(&e, 0, sizeof(e));
    if (kind == KVB__MSG_REGISTRATION26)
        fuzz_reg(frames, n, &e);
    else if (kind == KVB__MSG_TRANSFER26)
        fuzz_xfer(frames, n, &e);
    else if (kind == KVB__MSG_ABORT || kind == KVB__MSG_ABORT_ACK)
        fuzz_abort(frames, n, &e, kind == KVB__MSG_ABORT_ACK);
    return 0;
}
