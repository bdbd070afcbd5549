/* Pieces several dialects use (dialect.h). */
#include "dialect/dialect.h"

#include <stdio.h>

bool kvb__dialect_mask_hole(size_t count, const kvb_receiver_init_t *ex, size_t *hole_p)
{
    if (!(ex->field_mask & KVB_RECV_INIT_MASK) || ex->page_mask == NULL)
        return false;
    for (size_t i = 0; i < count; i++)
        if (!ex->page_mask[i]) {
            *hole_p = i;
            return true;
        }
    return false;
}

void kvb__dialect_prefix_form(const struct kvb_manager *m, size_t count,
                              const kvb_receiver_init_t *ex, char *why, size_t len)
{
    uint32_t page = m->args.page_size ? m->args.page_size : 1;
    bool prefix = (ex->field_mask & KVB_RECV_INIT_PREFIX) && ex->prefix_tokens > 0;
    if (prefix && (ex->prefix_tokens % page != 0 || ex->prefix_tokens / page > count))
        snprintf(why, len,
                 "prefix of %llu tokens is not a whole number of pages (page size %u) within the "
                 "%zu pages given",
                 (unsigned long long)ex->prefix_tokens, page, count);
}
