/* Fuzz harness for TokenSpeed's control frames and plan (src/proto/frames_ts.c).
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
#include "proto/frames_ts.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_FRAMES 64

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void die(const char *what)
{
    fprintf(stderr, "fuzz_frames_ts: %s\n", what);
    abort();
}

static void check_reason(const char *reason, size_t cap)
{
    size_t len = strnlen(reason, cap);
    if (len == 0 || len == cap)
        die("rejection without a terminated reason");
    for (size_t i = 0; i < len; i++)
        if ((unsigned char)reason[i] < 0x20 || (unsigned char)reason[i] > 0x7e)
            die("reason carries a non-printable byte");
}

static kvb__frame_t *frames_of(const kvb__frames_buf_t *b)
{
    kvb__frame_t *f = malloc((b->n + 1) * sizeof(*f));
    if (f == NULL)
        die("out of memory");
    for (size_t i = 0; i < b->n; i++)
        f[i] = kvb__frames_buf_get(b, i);
    return f;
}

static void same_bytes(const kvb__frames_buf_t *a, const kvb__frames_buf_t *b)
{
    if (a->n != b->n || a->len != b->len || (a->len && memcmp(a->data, b->data, a->len) != 0))
        die("re-encoding is not idempotent");
}

static void fuzz_reg(const kvb__frame_t *f, size_t n, kvb__frames_err_t *e)
{
    kvb__regts_msg_t m, m2;
    kvb__frames_buf_t b1, b2;
    if (kvb__frames_decode_registration_ts(f, n, e, &m) != KVB_OK) {
        check_reason(e->reason, sizeof(e->reason));
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
        check_reason(e->reason, sizeof(e->reason));
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
        check_reason(e->reason, sizeof(e->reason));
        return;
    }
    kvb__frames_buf_init(&b);
    if (kvb__frames_encode_status_ts(&m, e, &b) != KVB_OK || b.n != n)
        die("accepted status does not re-encode");
    for (size_t i = 0; i < n; i++) {
        kvb__frame_t g = kvb__frames_buf_get(&b, i);
        if (g.len != f[i].len || (g.len && memcmp(g.data, f[i].data, g.len) != 0))
            die("status re-encodes to other bytes");
    }
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
            check_reason(reason, sizeof(reason));
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
