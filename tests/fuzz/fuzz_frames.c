/* Fuzz harness for the control-frame codec (src/proto/frames.c).
 *
 * Input: one selector byte, then frames, each a 2-byte little-endian length
 * followed by that many bytes (the last frame takes what is left when the
 * input is short). Selector % 5: 0 classify and dispatch as a receiver would,
 * 1 registration, 2 transfer info, 3 status, 4 aux data.
 *
 * Properties: no crash or sanitizer report on any input; a rejection has a
 * non-empty one-line reason; an accepted message is classified as its kind
 * and re-encodes to exactly the input frames (the codec is canonical). */
#include "dialect/sglang2025/frames.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_FRAMES 200
#define FUZZ_NAME "fuzz_frames"
#include "fuzz_frames_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    kvb__frame_t frames[MAX_FRAMES];
    size_t n = 0, off = 1;
    kvb__frames_err_t e;
    kvb__frames_buf_t b;
    kvb__msg_kind_t kind;
    kvb_status_t st;
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
    switch (data[0] % 5) {
    case 1:
        kind = KVB__MSG_REGISTRATION;
        break;
    case 2:
        kind = KVB__MSG_TRANSFER;
        break;
    case 3:
        kind = KVB__MSG_STATUS;
        break;
    case 4:
        kind = KVB__MSG_AUX;
        break;
    default:
        kind = kvb__frames_classify(frames, n);
        break;
    }
    memset(&e, 0, sizeof(e));
    kvb__frames_buf_init(&b);
    switch (kind) {
    case KVB__MSG_REGISTRATION: {
        kvb__reg_msg_t m;
        st = kvb__frames_decode_registration(frames, n, &e, &m);
        if (st == KVB_OK) {
            if (kvb__frames_classify(frames, n) != KVB__MSG_REGISTRATION)
                die("accepted registration classified otherwise");
            if (kvb__frames_encode_registration(&m, &e, &b) != KVB_OK)
                die("accepted registration does not re-encode");
            same_frames(&b, frames, n);
        }
        break;
    }
    case KVB__MSG_TRANSFER: {
        kvb__xfer_msg_t m;
        st = kvb__frames_decode_transfer(frames, n, &e, &m);
        if (st == KVB_OK) {
            if (kvb__frames_classify(frames, n) != KVB__MSG_TRANSFER)
                die("accepted transfer info classified otherwise");
            if (kvb__frames_encode_transfer(&m, &e, &b) != KVB_OK)
                die("accepted transfer info does not re-encode");
            same_frames(&b, frames, n);
            (void)kvb__frames_check_indices(m.pages, 1000, "pages", &e);
            if (m.has_state_idx)
                (void)kvb__frames_check_indices(m.state_idx, 16, "state", &e);
        }
        break;
    }
    case KVB__MSG_STATUS: {
        kvb__status_msg_t m;
        st = kvb__frames_decode_status(frames, n, &e, &m);
        if (st == KVB_OK) {
            if (kvb__frames_classify(frames, n) != KVB__MSG_STATUS)
                die("accepted status classified otherwise");
            if (kvb__frames_encode_status(&m, &e, &b) != KVB_OK)
                die("accepted status does not re-encode");
            same_frames(&b, frames, n);
        }
        break;
    }
    case KVB__MSG_AUX: {
        kvb__aux_msg_t m;
        static const uint64_t item_lens[2] = {8, 64};
        static const uint64_t n_items[2] = {4, 100};
        st = kvb__frames_decode_aux(frames, n, &e, &m);
        if (st == KVB_OK) {
            if (kvb__frames_classify(frames, n) != KVB__MSG_AUX)
                die("accepted aux data classified otherwise");
            if (kvb__frames_encode_aux(&m, &e, &b) != KVB_OK)
                die("accepted aux data does not re-encode");
            same_frames(&b, frames, n);
            if (kvb__frames_check_aux(&m, 2, item_lens, n_items, &e) != KVB_OK)
                check_reason(&e);
        }
        break;
    }
    default:
        st = KVB_OK;
        break;
    }
    if (st != KVB_OK) {
        if (st != KVB_ERR_PROTO)
            die("decode failed with a status other than KVB_ERR_PROTO");
        check_reason(&e);
    }
    kvb__frames_buf_free(&b);
    return 0;
}
