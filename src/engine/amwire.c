/* Message-lane header parsing: every length and count from the wire is
 * checked against the received sizes before any use. */
#include "engine/amwire.h"

#include <string.h>

static uint64_t get_u64(const uint8_t *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

bool kvb__am_parse_write_header(const uint8_t *h, size_t hlen, size_t length, uint32_t *nd_p)
{
    uint32_t magic, nd;
    uint64_t total = 0;
    if (h == NULL || hlen < AM_HDR_FIXED)
        return false;
    memcpy(&magic, h, 4);
    memcpy(&nd, h + 4, 4);
    if (magic != AM_MAGIC_WRITE || nd == 0 || (hlen - AM_HDR_FIXED) / AM_DESC != nd ||
        (hlen - AM_HDR_FIXED) % AM_DESC != 0 || get_u64(h + 24) != length)
        return false;
    for (uint32_t i = 0; i < nd; i++)
        if (__builtin_add_overflow(total, get_u64(h + AM_HDR_FIXED + (size_t)i * AM_DESC + 8),
                                   &total))
            return false;
    if (total != length)
        return false;
    *nd_p = nd;
    return true;
}

void kvb__am_write_desc(const uint8_t *h, uint32_t i, uint64_t *dst_p, uint64_t *len_p)
{
    *dst_p = get_u64(h + AM_HDR_FIXED + (size_t)i * AM_DESC);
    *len_p = get_u64(h + AM_HDR_FIXED + (size_t)i * AM_DESC + 8);
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
    *xfer_id_p = get_u64(h + 8);
    *msg_id_p = get_u64(h + 16);
    *reason_p = h + AM_ACK_FIXED;
    *reason_len_p = rl;
    return true;
}
