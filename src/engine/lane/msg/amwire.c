/* Message-lane header parsing: every length and count from the wire is
 * checked against the received sizes before any use. */
#include "engine/lane/msg/amwire.h"

#include <string.h>

static uint32_t get_u32(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

void kvb__am_write_desc(const uint8_t *h, uint32_t i, kvb__am_desc_t *d)
{
    const uint8_t *p = h + AM_HDR_FIXED + (size_t)i * AM_DESC;
    d->dst = kvb__am_u64(p);
    d->len = kvb__am_u64(p + 8);
    d->stride = kvb__am_u64(p + 16);
    d->count = get_u32(p + 24);
}

void kvb__am_put_desc(uint8_t *h, uint32_t i, const kvb__am_desc_t *d)
{
    uint8_t *p = h + AM_HDR_FIXED + (size_t)i * AM_DESC;
    uint32_t zero = 0;
    memcpy(p, &d->dst, 8);
    memcpy(p + 8, &d->len, 8);
    memcpy(p + 16, &d->stride, 8);
    memcpy(p + 24, &d->count, 4);
    memcpy(p + 28, &zero, 4);
}

bool kvb__am_desc_span(const kvb__am_desc_t *d, uint64_t *span_p)
{
    uint64_t span;
    if (d->count == 0 || __builtin_mul_overflow(d->stride, (uint64_t)d->count - 1, &span) ||
        __builtin_add_overflow(span, d->len, &span))
        return false;
    *span_p = span;
    return true;
}

/* One descriptor's shape; adds its bytes to *total and pieces to *pieces. */
static bool desc_ok(const uint8_t *h, uint32_t i, uint64_t *total, uint32_t *pieces)
{
    kvb__am_desc_t d;
    uint64_t span, bytes;
    kvb__am_write_desc(h, i, &d);
    if (get_u32(h + AM_HDR_FIXED + (size_t)i * AM_DESC + 28) != 0 || d.count == 0 ||
        d.count > AM_MAX_PIECES - *pieces)
        return false;
    if (d.count == 1 ? d.stride != 0 : (d.len == 0 || d.stride < d.len))
        return false;
    if (!kvb__am_desc_span(&d, &span) || __builtin_mul_overflow(d.len, d.count, &bytes) ||
        __builtin_add_overflow(*total, bytes, total))
        return false;
    *pieces += d.count;
    return true;
}

/* A header of magic whose descriptors' bytes add up to want (the total
 * field too). */
static bool parse_header(const uint8_t *h, size_t hlen, uint32_t want_magic, uint64_t want,
                         uint32_t *nd_p, uint32_t *pieces_p)
{
    uint32_t magic, nd, pieces = 0;
    uint64_t total = 0;
    if (h == NULL || hlen < AM_HDR_FIXED)
        return false;
    memcpy(&magic, h, 4);
    memcpy(&nd, h + 4, 4);
    if (magic != want_magic || nd == 0 || (hlen - AM_HDR_FIXED) / AM_DESC != nd ||
        (hlen - AM_HDR_FIXED) % AM_DESC != 0 || kvb__am_u64(h + 24) != want)
        return false;
    for (uint32_t i = 0; i < nd; i++)
        if (!desc_ok(h, i, &total, &pieces))
            return false;
    if (total != want)
        return false;
    *nd_p = nd;
    *pieces_p = pieces;
    return true;
}

bool kvb__am_parse_write_header(const uint8_t *h, size_t hlen, size_t length, uint32_t *nd_p,
                                uint32_t *pieces_p)
{
    return parse_header(h, hlen, AM_MAGIC_WRITE, length, nd_p, pieces_p);
}

bool kvb__am_parse_read_header(const uint8_t *h, size_t hlen, size_t length, uint32_t *nd_p,
                               uint32_t *pieces_p, uint64_t *total_p)
{
    if (h == NULL || hlen < AM_HDR_FIXED || length != 0)
        return false;
    uint64_t total = kvb__am_u64(h + 24);
    if (total == 0 || total > AM_READ_MAX ||
        !parse_header(h, hlen, AM_MAGIC_READ, total, nd_p, pieces_p))
        return false;
    *total_p = total;
    return true;
}

bool kvb__am_parse_ack(const uint8_t *h, size_t hlen, int32_t *status_p, uint64_t *xfer_id_p,
                       uint64_t *msg_id_p, const uint8_t **reason_p, uint32_t *reason_len_p)
{
    uint32_t magic, rl;
    if (h == NULL || hlen < AM_ACK_FIXED)
        return false;
    memcpy(&magic, h, 4);
    memcpy(&rl, h + 24, 4);
    if (magic != AM_MAGIC_ACK || rl != hlen - AM_ACK_FIXED)
        return false;
    memcpy(status_p, h + 4, 4);
    *xfer_id_p = kvb__am_u64(h + 8);
    *msg_id_p = kvb__am_u64(h + 16);
    *reason_p = h + AM_ACK_FIXED;
    *reason_len_p = rl;
    return true;
}
