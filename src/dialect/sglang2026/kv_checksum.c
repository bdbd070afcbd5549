/* SGLang 0.5.23's KV checksum over host pages (kv_checksum.h). */
#include "dialect/sglang2026/kv_checksum.h"

#include "core/core.h"
#include "engine/cuda_drv.h"
#include <inttypes.h>
#include <stdio.h>
#include <zlib.h>

/* SGLang's row: u64 digest, u64 layout signature (MetadataBuffers). */
#define ROW_BYTES 16u

uint32_t kvb__sgl26_adler_items(const uint64_t *kv_ptrs, size_t n_kv, uint64_t item_len,
                                const int32_t *pages, size_t n)
{
    uLong a = adler32_z(0L, Z_NULL, 0);
    for (size_t b = 0; b < n_kv; b++)
        for (size_t i = 0; i < n; i++)
            a = adler32_z(a, (const Bytef *)(uintptr_t)(kv_ptrs[b] + (uint64_t)pages[i] * item_len),
                          (z_size_t)item_len);
    return (uint32_t)a;
}

/* Items every KV buffer holds (the smallest buffer's). */
static uint64_t kv_pool(const struct kvb_manager *m)
{
    uint64_t pool = UINT64_MAX;
    for (uint32_t b = 0; b < m->args.num_kv; b++)
        if (m->args.kv_item_len > 0 && m->kv_lens[b] / m->args.kv_item_len < pool)
            pool = m->kv_lens[b] / m->args.kv_item_len;
    return m->args.num_kv > 0 ? pool : 0;
}

static bool kv_on_host(const struct kvb_manager *m)
{
    kvb_mem_type_t t = KVB_MEM_HOST;
    int dev = 0;
    return m->args.num_kv == 0 ||
           kvb_mem_query((const void *)(uintptr_t)m->kv_ptrs[0], &t, &dev) != KVB_OK ||
           t != KVB_MEM_CUDA;
}

kvb_status_t kvb__sgl26_check_manager(const struct kvb_manager *m, char *why, size_t wl)
{
    int32_t k = m->p.sglang_kv_checksum_aux;
    if (k == -1)
        return KVB_OK;
    if (k < 0 || (uint32_t)k >= m->args.num_aux) {
        snprintf(why, wl,
                 "sglang_kv_checksum_aux %d: this manager registered %u aux buffer(s) (-1: none)",
                 (int)k, m->args.num_aux);
        return KVB_ERR_INVALID;
    }
    if (m->aux_items[k] < ROW_BYTES) {
        snprintf(why, wl,
                 "sglang_kv_checksum_aux %d: its items are %" PRIu64 " bytes; SGLang's "
                 "kv_checksum row holds a u64 digest and a u64 signature (64 bytes)",
                 (int)k, m->aux_items[k]);
        return KVB_ERR_INVALID;
    }
    return KVB_OK;
}

/* Whether SGLang's one digest describes the room's pages: it covers what one
 * prefill rank holds of every buffer (SGLang's decode skips another TP width
 * or a PP stage by the layout signature; kvbridge knows the sources), and
 * no state slots (SGLang's digest then covers state items whose selection
 * depends on the pool kind). */
static bool comparable(const struct kvb_manager *m, const kvb__own_digest_in_t *in, char *why,
                       size_t wl)
{
    if (in->n_real_srcs != 1)
        snprintf(why, wl, "%zu prefill ranks wrote the room; each digests its own share",
                 in->n_real_srcs);
    else if (in->has_state)
        snprintf(why, wl, "the room has state slots");
    else if (!kv_on_host(m))
        snprintf(why, wl, "the KV pages are device memory");
    else if (in->aux_slot < 0 ||
             (uint64_t)in->aux_slot >= m->aux_lens[m->p.sglang_kv_checksum_aux] /
                                           m->aux_items[m->p.sglang_kv_checksum_aux])
        snprintf(why, wl, "aux slot %" PRId64 " is outside the checksum buffer", in->aux_slot);
    else
        return true;
    return false;
}

kvb__own_result_t kvb__sgl26_check_own_digest(struct kvb_manager *m, const kvb__own_digest_in_t *in,
                                              char *why, size_t wl)
{
    int32_t k = m->p.sglang_kv_checksum_aux;
    uint64_t row[2] = {0, 0};
    if (k < 0 || !comparable(m, in, why, wl))
        return KVB__OWN_NONE;
    uint64_t pool = kv_pool(m);
    for (size_t i = 0; i < in->n_pages; i++)
        if (in->pages[i] < 0 || (uint64_t)in->pages[i] >= pool) {
            snprintf(why, wl, "page %d is outside the KV pool", (int)in->pages[i]);
            return KVB__OWN_NONE;
        }
    /* The row came as an engine write or an AUX_DATA message, both before the
     * source's Success; aux may be device memory. */
    if (kvb__mem_copy(
            row,
            (const void *)(uintptr_t)(m->aux_ptrs[k] + m->aux_items[k] * (uint64_t)in->aux_slot),
            ROW_BYTES) != KVB_OK ||
        row[0] == 0) {
        snprintf(why, wl, "the prefill wrote no digest (its checksum is off)");
        return KVB__OWN_NONE;
    }
    uint32_t mine = kvb__sgl26_adler_items(m->kv_ptrs, m->args.num_kv, m->args.kv_item_len,
                                           in->pages, in->n_pages);
    if (row[0] == mine)
        return KVB__OWN_MATCH;
    snprintf(why, wl,
             "SGLang KV checksum mismatch: the prefill's Adler-32 %#" PRIx64 " (layout signature "
             "%#" PRIx64 ", aux buffer %d slot %" PRId64 ") differs from %#x over this decode's "
             "%zu pages of %u KV buffers: the KV that landed is not what the prefill digested "
             "(SGLang's digest is one sum over the room: it names no buffer or page)",
             row[0], row[1], (int)k, in->aux_slot, (unsigned)mine, in->n_pages, m->args.num_kv);
    return KVB__OWN_MISMATCH;
}

kvb_status_t kvb_manager_sglang_kv_checksum(kvb_manager_h m, const int32_t *indices, size_t count,
                                            uint64_t *digest_p)
{
    if (m == NULL || digest_p == NULL || (indices == NULL && count > 0))
        return KVB_ERR_INVALID;
    if (!kv_on_host(m))
        return kvb__err_set(&m->err, KVB_ERR_INVALID,
                            "SGLang KV checksum: the KV buffers are device memory (SGLang's GPU "
                            "kernel digests those)");
    uint64_t pool = kv_pool(m);
    for (size_t i = 0; i < count; i++)
        if (indices[i] < 0 || (uint64_t)indices[i] >= pool)
            return kvb__err_set(&m->err, KVB_ERR_INVALID,
                                "SGLang KV checksum: page index %d (entry %zu) is outside the KV "
                                "pool of %" PRIu64 " pages",
                                (int)indices[i], i, pool);
    *digest_p =
        kvb__sgl26_adler_items(m->kv_ptrs, m->args.num_kv, m->args.kv_item_len, indices, count);
    return KVB_OK;
}
