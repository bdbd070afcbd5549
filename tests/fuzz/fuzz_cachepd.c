/* Fuzz harness for the CachePD dialect's parsers (src/dialect/cachepd/):
 * the layout contract, the block manifest, the registration / request /
 * status frames and the bootstrap bodies.
 *
 * Input: one selector byte, then the payload. Selector % 6: 0 contract JSON,
 * 1 manifest JSON, 2 PUT /route body, 3 parallel-info body; 4 and 5 frames
 * (each a 2-byte little-endian length then that many bytes; the last takes
 * what is left), 4 as a registration then a request, 5 as a status.
 *
 * Properties: no crash or sanitizer report on any input; a refusal has a
 * non-empty printable one-line reason; an accepted contract / manifest /
 * PUT re-encodes canonically, parses back and re-encodes to the same bytes;
 * an accepted contract keeps every page of every field inside its arena
 * and validates its own manifests' bounds; accepted frames re-encode to
 * exactly the input frames. */
#include "dialect/cachepd/cachepd.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_FRAMES 16
#define FUZZ_NAME "fuzz_cachepd"
#include "fuzz_frames_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void fuzz_contract(const uint8_t *p, size_t n)
{
    kvb__cpd_contract_t c, c2;
    kvb__frames_err_t e;
    char *w1, *w2;
    size_t l1, l2;
    memset(&e, 0, sizeof(e));
    if (kvb__cpd_contract_parse(p, n, &e, &c) != KVB_OK) {
        check_reason(&e);
        return;
    }
    for (uint32_t f = 0; f < c.nfields; f++) {
        const kvb__cpd_field_t *fd = &c.fields[f];
        uint64_t last = c.groups[fd->group].page_count - 1;
        if (kvb__cpd_page_offset(&c, f, last) + fd->payload > c.arena_bytes ||
            fd->page0 + fd->payload > c.arena_bytes)
            die("accepted a field page outside the arena");
    }
    if (kvb__cpd_contract_encode(&c, &w1, &l1) != KVB_OK)
        die("out of memory");
    if (kvb__cpd_contract_parse((const uint8_t *)w1, l1, &e, &c2) != KVB_OK)
        die("canonical contract does not parse back");
    if (kvb__cpd_contract_encode(&c2, &w2, &l2) != KVB_OK || l1 != l2 || memcmp(w1, w2, l1) != 0)
        die("canonical contract is not a fixed point");
    free(w1);
    free(w2);
    kvb__cpd_contract_free(&c);
    kvb__cpd_contract_free(&c2);
}

static void fuzz_manifest(const uint8_t *p, size_t n)
{
    kvb__cpd_manifest_t m, m2;
    kvb__frames_err_t e;
    char *w1, *w2;
    size_t l1, l2;
    memset(&e, 0, sizeof(e));
    if (kvb__cpd_manifest_parse(p, n, &e, &m) != KVB_OK) {
        check_reason(&e);
        return;
    }
    if (kvb__cpd_manifest_encode(&m, &w1, &l1) != KVB_OK)
        die("out of memory");
    if (kvb__cpd_manifest_parse((const uint8_t *)w1, l1, &e, &m2) != KVB_OK ||
        kvb__cpd_manifest_encode(&m2, &w2, &l2) != KVB_OK || l1 != l2 || memcmp(w1, w2, l1) != 0)
        die("manifest does not round-trip");
    free(w1);
    free(w2);
    kvb__cpd_manifest_free(&m);
    kvb__cpd_manifest_free(&m2);
}

static void fuzz_boot(const uint8_t *p, size_t n, bool put)
{
    kvb__frames_err_t e;
    memset(&e, 0, sizeof(e));
    if (put) {
        kvb__cpd_put_t a, b;
        char *w1, *w2;
        size_t l1, l2;
        if (kvb__cpd_put_parse((const char *)p, n, &e, &a) != KVB_OK) {
            check_reason(&e);
            return;
        }
        if (kvb__cpd_put_encode(&a, &w1, &l1) != KVB_OK)
            die("out of memory");
        if (kvb__cpd_put_parse(w1, l1, &e, &b) != KVB_OK ||
            kvb__cpd_put_encode(&b, &w2, &l2) != KVB_OK || l1 != l2 || memcmp(w1, w2, l1) != 0)
            die("PUT body does not round-trip");
        kvb__cpd_boot_t bs = {0};
        if (kvb__cpd_boot_admit(&bs, &a, &e, NULL, NULL) != KVB_OK ||
            kvb__cpd_boot_admit(&bs, &b, &e, NULL, NULL) != KVB_OK)
            die("the same PUT twice is refused");
        free(w1);
        free(w2);
        kvb__cpd_boot_free(&bs);
        kvb__cpd_put_free(&a);
        kvb__cpd_put_free(&b);
        return;
    }
    kvb__cpd_pinfo_t pi;
    if (kvb__cpd_pinfo_parse((const char *)p, n, &e, &pi) != KVB_OK) {
        check_reason(&e);
        return;
    }
    if (pi.stages.n != pi.pp_size || pi.tp_size * pi.dp_size * pi.pp_size != pi.world_size)
        die("accepted inconsistent parallel info");
    kvb__cpd_pinfo_free(&pi);
}

static void same_msg(const kvb__cpd_msg_t *m, const kvb__frame_t *f, size_t n)
{
    if (m->n != n)
        die("re-encode gives a different frame count");
    for (size_t i = 0; i < n; i++) {
        kvb__frame_t g = kvb__cpd_msg_frame(m, i);
        if (g.len != f[i].len || (g.len && memcmp(g.data, f[i].data, g.len) != 0))
            die("re-encode gives different frame bytes");
    }
}

static void fuzz_messages(const kvb__frame_t *f, size_t n, bool status)
{
    kvb__frames_err_t e;
    kvb__cpd_msg_t out;
    memset(&e, 0, sizeof(e));
    kvb__cpd_msg_init(&out);
    if (status) {
        kvb__cpd_status_t s;
        if (kvb__cpd_decode_status(f, n, &e, &s) != KVB_OK) {
            check_reason(&e);
        } else if (n == KVB__CPD_STATUS_FRAMES) {
            if (kvb__cpd_encode_status(&s, &e, &out) != KVB_OK)
                die("accepted status does not re-encode");
            same_msg(&out, f, n);
        }
        kvb__cpd_msg_free(&out);
        return;
    }
    kvb__cpd_reg_t r;
    kvb__cpd_contract_t c;
    if (kvb__cpd_decode_registration(f, n, &e, &r, &c) != KVB_OK) {
        check_reason(&e);
    } else {
        if (kvb__cpd_encode_registration(&r, &e, &out) != KVB_OK)
            die("accepted registration does not re-encode");
        same_msg(&out, f, n);
        kvb__cpd_contract_free(&c);
    }
    kvb__cpd_req_t q;
    kvb__cpd_manifest_t m;
    if (kvb__cpd_decode_request(f, n, &e, &q, &m) != KVB_OK) {
        check_reason(&e);
    } else {
        if (kvb__cpd_encode_request(&q, &e, &out) != KVB_OK)
            die("accepted request does not re-encode");
        same_msg(&out, f, n);
        if (!q.is_dummy)
            kvb__cpd_manifest_free(&m);
    }
    kvb__cpd_msg_free(&out);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    kvb__frame_t f[MAX_FRAMES];
    size_t n = 0, off = 1;
    if (size < 1)
        return 0;
    switch (data[0] % 6) {
    case 0:
        fuzz_contract(data + 1, size - 1);
        return 0;
    case 1:
        fuzz_manifest(data + 1, size - 1);
        return 0;
    case 2:
        fuzz_boot(data + 1, size - 1, true);
        return 0;
    case 3:
        fuzz_boot(data + 1, size - 1, false);
        return 0;
    default:
        break;
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
    fuzz_messages(f, n, data[0] % 6 == 5);
    return 0;
}
