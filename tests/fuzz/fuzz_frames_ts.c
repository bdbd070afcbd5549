/* Fuzz harness for TokenSpeed's control frames and plan (src/dialect/tokenspeed_seed/frames.c).
 *
 * Input: one selector byte, then frames, each a 2-byte little-endian length
 * followed by that many bytes (the last frame takes what is left when the
 * input is short). Selector % 4: 0 KV-args, 1 transfer info, 2 status, 3 the
 * rest of the input as a plan (frame 13's JSON).
 *
 * Properties: no crash or sanitizer report on any input; a rejection has a
 * non-empty printable one-line reason; an accepted message re-encodes,
 * decodes again with the same fields and re-encodes to the same bytes; a
 * status re-encodes to exactly the input; an accepted plan is within the
 * caps, encodes to JSON that parses back to identical fragments. */
#include "dialect/tokenspeed_seed/frames.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_FRAMES 64
#define FUZZ_NAME "fuzz_frames_ts"
#include "fuzz_frames_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void fuzz_reg(const kvb__frame_t *f, size_t n, kvb__frames_err_t *e)
{
    kvb__regts_msg_t m, m2;
    kvb__frames_buf_t b1, b2;
    if (kvb__frames_decode_registration_ts(f, n, e, &m) != KVB_OK) {
        check_reason(e);
        return;
    }
    kvb__frames_buf_init(&b1);
    kvb__frames_buf_init(&b2);
    if (kvb__frames_encode_registration_ts(&m, e, &b1) != KVB_OK)
        die("accepted KV-args do not re-encode");
    kvb__frame_t *g = frames_of(&b1);
    if (kvb__frames_decode_registration_ts(g, b1.n, e, &m2) != KVB_OK ||
        kvb__frames_encode_registration_ts(&m2, e, &b2) != KVB_OK)
        die("re-encoded KV-args do not decode");
    same_bytes(&b1, &b2);
    if (m2.kv_ptrs.count != m.kv_ptrs.count || m2.state_ptrs.count != m.state_ptrs.count ||
        m2.port != m.port || m2.prefix_len != m.prefix_len)
        die("re-encoded KV-args changed a field");
    free(g);
    kvb__frames_buf_free(&b1);
    kvb__frames_buf_free(&b2);
}

static void fuzz_xfer(const kvb__frame_t *f, size_t n, kvb__frames_err_t *e)
{
    kvb__xferts_msg_t m, m2;
    kvb__frames_buf_t b1, b2;
    if (kvb__frames_decode_transfer_ts(f, n, e, &m) != KVB_OK) {
        check_reason(e);
        return;
    }
    for (size_t i = 0; i < m.pages.count; i++)
        if (kvb__i64_at(m.pages, i) < 0)
            die("accepted a negative page index");
    if (m.mask_len != 0) /* the encoder sends frames 9-10 empty: compare the rest */
        return;
    kvb__frames_buf_init(&b1);
    kvb__frames_buf_init(&b2);
    if (kvb__frames_encode_transfer_ts(&m, e, &b1) != KVB_OK) {
        if (m.local_len != 0)
            goto out; /* likewise frame 10 */
        die("accepted transfer info does not re-encode");
    }
    kvb__frame_t *g = frames_of(&b1);
    if (kvb__frames_decode_transfer_ts(g, b1.n, e, &m2) != KVB_OK ||
        kvb__frames_encode_transfer_ts(&m2, e, &b2) != KVB_OK)
        die("re-encoded transfer info does not decode");
    same_bytes(&b1, &b2);
    if (m2.room != m.room || m2.pages.count != m.pages.count || m2.is_dummy != m.is_dummy ||
        m2.prefix_len != m.prefix_len || m2.has_plan != m.has_plan ||
        m2.required_dst_info_num != m.required_dst_info_num ||
        m2.state_idx.count != m.state_idx.count)
        die("re-encoded transfer info changed a field");
    free(g);
out:
    kvb__frames_buf_free(&b1);
    kvb__frames_buf_free(&b2);
}

static void fuzz_status(const kvb__frame_t *f, size_t n, kvb__frames_err_t *e)
{
    kvb__statusts_msg_t m;
    kvb__frames_buf_t b;
    if (kvb__frames_decode_status_ts(f, n, e, &m) != KVB_OK) {
        check_reason(e);
        return;
    }
    kvb__frames_buf_init(&b);
    if (kvb__frames_encode_status_ts(&m, e, &b) != KVB_OK)
        die("accepted status does not re-encode");
    same_frames(&b, f, n);
    kvb__frames_buf_free(&b);
}

static void fuzz_plan(const uint8_t *json, size_t len)
{
    kvb__ts_plan_t p = {0}, q = {0};
    char reason[200];
    char *text;
    size_t tl;
    reason[0] = '\0';
    kvb_status_t st = kvb__ts_plan_parse(json, len, 64, &p, reason, sizeof(reason));
    if (st != KVB_OK) {
        if (st == KVB_ERR_PROTO)
            check_reason_text(reason, sizeof(reason));
        return;
    }
    if (p.n == 0 || p.n > 64)
        die("accepted plan outside the fragment cap");
    if (kvb__ts_plan_encode(p.frags, p.n, &text, &tl) != KVB_OK)
        die("out of memory");
    if (kvb__ts_plan_parse((const uint8_t *)text, tl, 64, &q, reason, sizeof(reason)) != KVB_OK ||
        q.n != p.n || memcmp(p.frags, q.frags, p.n * sizeof(*p.frags)) != 0)
        die("encoded plan does not parse back to the same fragments");
    free(text);
    kvb__ts_plan_free(&p);
    kvb__ts_plan_free(&q);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    kvb__frame_t f[MAX_FRAMES];
    kvb__frames_err_t e;
    size_t n = 0, off = 1;
    if (size < 1)
        return 0;
    if (data[0] % 4 == 3) {
        fuzz_plan(data + 1, size - 1);
        return 0;
    }
    while (off < size && n < MAX_FRAMES) {
        size_t len = off + 2 <= size ? (size_t)data[off] | (size_t)data[off + 1] << 8 : 0;
        off += 2;
        if (off > size)
            off = size;
        if (len > size - off)
            len = size - off;
        f[n].data = data + off;
        f[n++].len = len;
        off += len;
    }
    memset(&e, 0, sizeof(e));
    if (data[0] % 4 == 0)
        fuzz_reg(f, n, &e);
    else if (data[0] % 4 == 1)
        fuzz_xfer(f, n, &e);
    else
        fuzz_status(f, n, &e);
    return 0;
}
