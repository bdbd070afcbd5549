/* Fuzz harness for the engine's message-lane wire format
 * (src/engine/amwire.c) and the target-side destination check
 * (kvb__segtab_find, as am_validate in src/engine/xfer.c uses it).
 *
 * Input: one selector byte, then the header bytes. Selector % 3:
 *  0 write header, payload length = the header's own total field (so valid
 *    headers are reachable), perturbed by selector / 3 when selector >= 96;
 *    the same bytes as a read request, payload length 0 (perturbed the
 *    same way: any payload refuses it);
 *  1 ack header;
 *  2 write header, payload length = the first 8 header bytes read as u64.
 *
 * Invariants (abort on violation):
 *  - a rejected header writes no output;
 *  - an accepted write header has 1 <= nd, hlen == 40 + 32 nd, well-formed
 *    descriptors (count >= 1, stride 0 for one piece, >= len for more, span
 *    computed without overflow and equal to the 128-bit oracle), at most
 *    AM_MAX_PIECES pieces, piece lengths summing (without overflow) to the
 *    payload length, and re-encodes to exactly the input bytes;
 *  - the destination check accepts a descriptor only when one segment of the
 *    table wholly contains its span (checked against a brute-force oracle, with
 *    segments placed at the ends of the address space), and scattering an
 *    accepted message into guard-framed buffers never touches a guard byte;
 *  - an accepted read request has no payload, a total of 1..AM_READ_MAX
 *    bytes equal to its pieces' sum, the write header's shape otherwise,
 *    re-encodes to exactly the input bytes, and its ranges pass the same
 *    destination check;
 *  - an accepted ack has hlen == 28 + reason length, the reason inside the
 *    input, and re-encodes to exactly the input bytes. */
#include "fuzz_assert.h"
#include "engine/lane/msg/amwire.h"
#include "engine/segtab.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define GUARD 64
#define GUARD_BYTE 0xA5
#define NSEG 4
#define MAX_PAYLOAD (1u << 20)

/* Segments the "target" registered: virtual addresses (what descriptors
 * name) backed by real buffers framed with guard bytes. */
static const uint64_t seg_addr[NSEG] = {0x1000, 0x3000, 0x7fffffff0000ull, 0xfffffffffffff000ull};
static const uint64_t seg_len[NSEG] = {0x1000, 0x100, 0x10, 0xfff};

static uint64_t get_u64(const uint8_t *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

static bool oracle_inside(uint64_t dst, uint64_t len, int *seg_p)
{
    for (int s = 0; s < NSEG; s++) {
        /* wholly inside, with 128-bit arithmetic (no wrap possible) */
        unsigned __int128 end = (unsigned __int128)dst + len;
        if (len > 0 && dst >= seg_addr[s] && end <= (unsigned __int128)seg_addr[s] + seg_len[s]) {
            *seg_p = s;
            return true;
        }
    }
    return false;
}

/* Span of a descriptor with 128-bit arithmetic (the oracle's own). */
static unsigned __int128 oracle_span(const kvb__am_desc_t *d)
{
    return (unsigned __int128)d->stride * (d->count - 1) + d->len;
}

/* Re-encode an accepted header of magic whose pieces add up to length. */
static void reencode(const uint8_t *h, size_t hlen, uint32_t nd, uint32_t magic, size_t length)
{
    uint8_t *re = calloc(1, hlen);
    FUZZ_ASSERT(re != NULL);
    uint64_t xid = get_u64(h + 8), mid = get_u64(h + 16), total = length, epoch = get_u64(h + 32);
    memcpy(re, &magic, 4);
    memcpy(re + 4, &nd, 4);
    memcpy(re + 8, &xid, 8);
    memcpy(re + 16, &mid, 8);
    memcpy(re + 24, &total, 8);
    memcpy(re + 32, &epoch, 8);
    unsigned __int128 sum = 0;
    uint64_t pieces = 0;
    for (uint32_t i = 0; i < nd; i++) {
        kvb__am_desc_t d;
        uint64_t span = 0;
        uint8_t *o = re + AM_HDR_FIXED + (size_t)i * AM_DESC;
        kvb__am_write_desc(h, i, &d);
        FUZZ_ASSERT(d.count >= 1 && (d.count == 1 ? d.stride == 0 : d.stride >= d.len));
        FUZZ_ASSERT(kvb__am_desc_span(&d, &span) && span == oracle_span(&d));
        sum += (unsigned __int128)d.len * d.count;
        pieces += d.count;
        memcpy(o, &d.dst, 8);
        memcpy(o + 8, &d.len, 8);
        memcpy(o + 16, &d.stride, 8);
        memcpy(o + 24, &d.count, 4);
    }
    FUZZ_ASSERT(sum == length && pieces <= AM_MAX_PIECES);
    FUZZ_ASSERT(memcmp(re, h, hlen) == 0);
    free(re);
}

/* The destination check, as the target does it (span of each descriptor
 * inside one segment), against the oracle; true when all are accepted. */
static bool check_dests(const uint8_t *h, uint32_t nd)
{
    kvb__segtab_t t = {0};
    for (int s = 0; s < NSEG; s++) {
        kvb__seg_t sg = {.addr = seg_addr[s], .len = seg_len[s]};
        FUZZ_ASSERT(kvb__segtab_insert(&t, &sg) == KVB_OK);
    }
    bool all_ok = true;
    for (uint32_t i = 0; i < nd; i++) {
        kvb__am_desc_t d;
        uint64_t span = 0;
        int os = -1;
        kvb__am_write_desc(h, i, &d);
        FUZZ_ASSERT(kvb__am_desc_span(&d, &span));
        long s = kvb__segtab_find(&t, d.dst, span);
        bool in = oracle_span(&d) <= UINT64_MAX && oracle_inside(d.dst, span, &os);
        FUZZ_ASSERT((s >= 0) == in);
        if (s >= 0)
            FUZZ_ASSERT(t.v[s].addr == seg_addr[os] && t.v[s].len == seg_len[os]);
        else
            all_ok = false;
    }
    kvb__segtab_free(&t);
    return all_ok;
}

/* Place the payload (a counter pattern) piece by piece into guard-framed
 * buffers: no guard byte may change. */
static void check_place(const uint8_t *h, uint32_t nd, size_t length)
{
    uint8_t *mem[NSEG];
    for (int s = 0; s < NSEG; s++) {
        mem[s] = malloc(seg_len[s] + 2 * GUARD);
        FUZZ_ASSERT(mem[s] != NULL);
        memset(mem[s], GUARD_BYTE, seg_len[s] + 2 * GUARD);
    }
    uint8_t *payload = malloc(length ? length : 1);
    FUZZ_ASSERT(payload != NULL);
    for (size_t k = 0; k < length; k++)
        payload[k] = (uint8_t)(k * 7 + 1);
    const uint8_t *p = payload;
    for (uint32_t i = 0; i < nd; i++) {
        kvb__am_desc_t d;
        kvb__am_write_desc(h, i, &d);
        for (uint32_t c = 0; c < d.count; c++) {
            uint64_t dst = d.dst + (uint64_t)c * d.stride;
            int s = -1;
            FUZZ_ASSERT(d.len == 0 || oracle_inside(dst, d.len, &s));
            if (d.len > 0)
                memcpy(mem[s] + GUARD + (dst - seg_addr[s]), p, d.len);
            p += d.len;
        }
    }
    FUZZ_ASSERT(p == payload + length);
    for (int s = 0; s < NSEG; s++) {
        for (size_t g = 0; g < GUARD; g++) {
            FUZZ_ASSERT(mem[s][g] == GUARD_BYTE);
            FUZZ_ASSERT(mem[s][GUARD + seg_len[s] + g] == GUARD_BYTE);
        }
        free(mem[s]);
    }
    free(payload);
}

static void check_write(const uint8_t *h, size_t hlen, size_t length)
{
    uint32_t nd = 0xdeadbeefu, np = 0xdeadbeefu;
    if (!kvb__am_parse_write_header(h, hlen, length, &nd, &np)) {
        FUZZ_ASSERT(nd == 0xdeadbeefu && np == 0xdeadbeefu);
        return;
    }
    FUZZ_ASSERT(nd >= 1 && hlen == AM_HDR_FIXED + (size_t)nd * AM_DESC && np >= nd &&
                np <= AM_MAX_PIECES);
    uint32_t magic;
    memcpy(&magic, h, 4);
    FUZZ_ASSERT(magic == AM_MAGIC_WRITE && get_u64(h + 24) == length);
    reencode(h, hlen, nd, AM_MAGIC_WRITE, length);
    if (check_dests(h, nd) && length <= MAX_PAYLOAD)
        check_place(h, nd, length);
}

static void check_read(const uint8_t *h, size_t hlen, size_t length)
{
    uint32_t nd = 0xdeadbeefu, np = 0xdeadbeefu;
    uint64_t total = 0xdeadbeefu;
    if (!kvb__am_parse_read_header(h, hlen, length, &nd, &np, &total)) {
        FUZZ_ASSERT(nd == 0xdeadbeefu && np == 0xdeadbeefu && total == 0xdeadbeefu);
        return;
    }
    FUZZ_ASSERT(length == 0 && total >= 1 && total <= AM_READ_MAX && get_u64(h + 24) == total);
    FUZZ_ASSERT(nd >= 1 && hlen == AM_HDR_FIXED + (size_t)nd * AM_DESC && np >= nd &&
                np <= AM_MAX_PIECES);
    uint32_t magic;
    memcpy(&magic, h, 4);
    FUZZ_ASSERT(magic == AM_MAGIC_READ);
    reencode(h, hlen, nd, AM_MAGIC_READ, total);
    if (check_dests(h, nd) && total <= MAX_PAYLOAD)
        check_place(h, nd, total); /* the answer's pieces, gathered the same way */
}

static void check_ack(const uint8_t *h, size_t hlen)
{
    int32_t st = 0x5a5a5a5a;
    uint64_t xid = 1, mid = 2;
    const uint8_t *why = NULL;
    uint32_t rl = 0xdeadbeefu;
    if (!kvb__am_parse_ack(h, hlen, &st, &xid, &mid, &why, &rl)) {
        FUZZ_ASSERT(st == 0x5a5a5a5a && xid == 1 && mid == 2 && why == NULL && rl == 0xdeadbeefu);
        return;
    }
    FUZZ_ASSERT(hlen == AM_ACK_FIXED + (size_t)rl);
    FUZZ_ASSERT(why == h + AM_ACK_FIXED && why + rl == h + hlen);
    uint8_t *re = malloc(hlen);
    FUZZ_ASSERT(re != NULL);
    uint32_t magic = AM_MAGIC_ACK;
    memcpy(re, &magic, 4);
    memcpy(re + 4, &st, 4);
    memcpy(re + 8, &xid, 8);
    memcpy(re + 16, &mid, 8);
    memcpy(re + 24, &rl, 4);
    if (rl > 0)
        memcpy(re + AM_ACK_FIXED, why, rl);
    FUZZ_ASSERT(memcmp(re, h, hlen) == 0);
    free(re);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0)
        return 0;
    uint8_t sel = data[0];
    /* a private copy of exactly the header bytes: ASan catches any read
     * past hlen */
    size_t hlen = size - 1;
    uint8_t *h = malloc(hlen ? hlen : 1);
    FUZZ_ASSERT(h != NULL);
    memcpy(h, data + 1, hlen);
    switch (sel % 3) {
    case 0: {
        size_t length = hlen >= AM_HDR_FIXED ? (size_t)get_u64(h + 24) : 0;
        if (sel >= 96)
            length += sel / 3;
        check_write(h, hlen, length);
        check_read(h, hlen, sel >= 96 ? sel / 3 : 0);
        break;
    }
    case 1:
        check_ack(h, hlen);
        break;
    default:
        check_write(h, hlen, hlen >= 8 ? (size_t)get_u64(h) : 0);
        break;
    }
    free(h);
    return 0;
}
