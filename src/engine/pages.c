/* Pages x fields grids (kvb_engine_write_pages, kvb_engine_read_pages):
 * Mooncake's batch_transfer_sync_write_pages / _read_pages and TokenSpeed's
 * ts_mooncake_write_pages turned into strided blocks here, one transfer per
 * batch, so no caller expands the grid span by span. A grid's "src"
 * columns are always this engine's side; a read moves the bytes from the
 * "dst" (peer) side into them. */
#include "engine/engine_int.h"

#include <stdlib.h>

kvb_status_t kvb_pages_check(const int64_t *src_pages, const int64_t *dst_pages, size_t num_pages,
                             const int64_t *fields, size_t num_fields, const char **why_p)
{
    const char *why = NULL;
    size_t total;
    uint64_t max_s = 0, max_d = 0;
    if (num_pages == 0 || num_fields == 0)
        return KVB_OK; /* nothing to move: before any check, as Mooncake */
    if (src_pages == NULL || dst_pages == NULL || fields == NULL) {
        why = "pages or fields array is NULL";
        goto bad;
    }
    if (__builtin_mul_overflow(num_pages, num_fields, &total)) {
        why = "num_pages * num_fields overflows";
        goto bad;
    }
    for (size_t i = 0; i < num_pages; i++) {
        if (src_pages[i] < 0 || dst_pages[i] < 0) {
            why = "src_pages and dst_pages must not contain negative values";
            goto bad;
        }
        if ((uint64_t)src_pages[i] > max_s)
            max_s = (uint64_t)src_pages[i];
        if ((uint64_t)dst_pages[i] > max_d)
            max_d = (uint64_t)dst_pages[i];
    }
    for (size_t f = 0; f < num_fields; f++) {
        const int64_t *r = fields + f * KVB_PAGE_FIELD_COLS;
        uint64_t off, end;
        if (r[4] <= 0 || r[1] < 0 || r[3] < 0) {
            why = "fields rows need a positive length and non-negative strides";
            goto bad;
        }
        /* Strides and pages are non-negative: the largest page is the last
         * byte's worst case on each side. */
        if (!kvb__mul_u64(max_s, (uint64_t)r[1], &off) ||
            !kvb__add_u64((uint64_t)r[0], off, &end) ||
            !kvb__add_u64(end, (uint64_t)r[4] - 1, &end) ||
            !kvb__mul_u64(max_d, (uint64_t)r[3], &off) ||
            !kvb__add_u64((uint64_t)r[2], off, &end) ||
            !kvb__add_u64(end, (uint64_t)r[4] - 1, &end)) {
            why = "a span's address passes 2^64 (base + page * stride + length overflows)";
            goto bad;
        }
    }
    return KVB_OK;
bad:
    if (why_p != NULL)
        *why_p = why;
    return KVB_ERR_INVALID;
}

/* One strided block of count rows from local (ls, lstride) and remote
 * (rs, rstride), named the bytes' way (engine.h): a read's src is remote. */
static kvb_strided_block_t span_block(bool read, uint64_t ls, uint64_t lstride, uint64_t rs,
                                      uint64_t rstride, uint64_t len, uint64_t count)
{
    if (read)
        return (kvb_strided_block_t){rs, ls, len, rstride, lstride, count};
    return (kvb_strided_block_t){ls, rs, len, lstride, rstride, count};
}

/* Spans [k0, k1) of a checked grid (field-major: span k is field k / n,
 * page k % n) as strided blocks into out (room for k1 - k0); their number,
 * and their bytes in *bytes_p. read: the bytes go from the peer's side (dst
 * columns) into ours. */
static size_t to_strided(const int64_t *sp, const int64_t *dp, size_t n, const int64_t *fields,
                         size_t k0, size_t k1, bool read, kvb_strided_block_t *out, double *bytes_p)
{
    size_t m = 0;
    double bytes = 0;
    for (size_t k = k0; k < k1;) {
        const int64_t *r = fields + (k / n) * KVB_PAGE_FIELD_COLS;
        uint64_t sb = (uint64_t)r[0], ss = (uint64_t)r[1], db = (uint64_t)r[2];
        uint64_t ds = (uint64_t)r[3], len = (uint64_t)r[4];
        size_t i = k % n, end = n - i < k1 - k ? n : i + (k1 - k);
        k += end - i;
        while (i < end) {
            size_t j = i + 1;
            int64_t si = 0, di = 0; /* page steps of the run */
            if (j < end) {
                si = sp[j] - sp[i];
                di = dp[j] - dp[i];
                /* One descriptor when both sides step forward evenly and
                 * the rows the bytes go to do not overlap (the strided
                 * rules): the peer's for a write, ours for a read. */
                int64_t to = read ? si : di, from = read ? di : si;
                uint64_t to_stride = read ? ss : ds;
                if (from >= 0 && to > 0 && (uint64_t)to * to_stride >= len) {
                    while (j + 1 < end && sp[j + 1] - sp[j] == si && dp[j + 1] - dp[j] == di)
                        j++;
                    j++;
                } else {
                    si = di = 0;
                }
            }
            uint64_t count = j - i;
            out[m++] = span_block(read, sb + (uint64_t)sp[i] * ss,
                                  count > 1 ? (uint64_t)si * ss : len, db + (uint64_t)dp[i] * ds,
                                  count > 1 ? (uint64_t)di * ds : len, len, count);
            bytes += (double)len * (double)count;
            i = j;
        }
    }
    *bytes_p = bytes;
    return m;
}

/* kvb_engine_write_pages, or kvb_engine_read_pages when read. */
static kvb_status_t pages_xfer(kvb_engine_h eng, const char *sid, const int64_t *src_pages,
                               const int64_t *dst_pages, size_t num_pages, const int64_t *fields,
                               size_t num_fields, size_t max_batch_size, double timeout_s,
                               bool read)
{
    const char *why = NULL, *what = read ? "read_pages" : "write_pages";
    if (eng == NULL)
        return KVB_ERR_INVALID;
    if (num_pages == 0 || num_fields == 0)
        return KVB_OK;
    if (kvb_pages_check(src_pages, dst_pages, num_pages, fields, num_fields, &why) != KVB_OK)
        return kvb__err_set(&eng->err, KVB_ERR_INVALID, "%s %s %s: %s", what, read ? "from" : "to",
                            sid != NULL ? sid : "(null)", why);
    if (sid == NULL)
        return kvb__err_set(&eng->err, KVB_ERR_INVALID, "%s without a session", what);
    size_t total = num_pages * num_fields; /* checked above */
    size_t per = max_batch_size == 0 || max_batch_size > total ? total : max_batch_size;
    kvb_strided_block_t *out = malloc(per * sizeof(*out));
    if (out == NULL)
        return kvb__err_set(&eng->err, KVB_ERR_NOMEM, "%s: %zu spans per batch", what, per);
    kvb_status_t st = KVB_OK;
    for (size_t k0 = 0; k0 < total && st == KVB_OK; k0 += per) {
        size_t k1 = total - k0 < per ? total : k0 + per;
        double bytes;
        kvb__wblocks_t w = {.strided = out, .read = read};
        w.n = to_strided(src_pages, dst_pages, num_pages, fields, k0, k1, read, out, &bytes);
        st = kvb__xfer_sync(eng, sid, &w, timeout_s > 0 ? timeout_s + bytes * 1e-9 : 0);
    }
    free(out);
    return st;
}

kvb_status_t kvb_engine_write_pages(kvb_engine_h eng, const char *sid, const int64_t *src_pages,
                                    const int64_t *dst_pages, size_t num_pages,
                                    const int64_t *fields, size_t num_fields, size_t max_batch_size,
                                    double timeout_s)
{
    return pages_xfer(eng, sid, src_pages, dst_pages, num_pages, fields, num_fields, max_batch_size,
                      timeout_s, false);
}

kvb_status_t kvb_engine_read_pages(kvb_engine_h eng, const char *sid, const int64_t *src_pages,
                                   const int64_t *dst_pages, size_t num_pages,
                                   const int64_t *fields, size_t num_fields, size_t max_batch_size,
                                   double timeout_s)
{
    return pages_xfer(eng, sid, src_pages, dst_pages, num_pages, fields, num_fields, max_batch_size,
                      timeout_s, true);
}
