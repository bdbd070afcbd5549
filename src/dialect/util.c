/* Pieces several dialects use (dialect.h). */
#include "dialect/dialect.h"

#include <stdio.h>
#include <stdlib.h>

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

kvb_status_t kvb__dialect_no_abort(struct kvb_manager *m, const kvb__src_t *s, uint64_t room,
                                   uint64_t gen)
{
    (void)m, (void)s, (void)room, (void)gen;
    return KVB_OK;
}

void kvb__dialect_keep_first_token(struct kvb_manager *m, uint64_t room, int64_t token,
                                   kvb__i32_view_t cands)
{
    if (token == -1 || cands.count > KVB__MAX_CANDIDATES)
        return;
    int32_t *c = malloc((cands.count + 1) * sizeof(int32_t));
    for (size_t i = 0; c != NULL && i < cands.count; i++)
        c[i] = kvb__i32_at(cands, i);
    if (c != NULL)
        kvb__output_set(m, room, token, c, cands.count, true);
    free(c);
}

void kvb__dialect_status_in(kvb__status_in_t *out, uint64_t room, int32_t rank, int32_t value,
                            int32_t success, int32_t failed)
{
    out->room = room;
    out->prefill_rank = rank;
    out->status = value == success  ? KVB_POLL_SUCCESS
                  : value == failed ? KVB_POLL_FAILED
                                    : KVB_POLL_TRANSFERRING; /* progress: no change */
}
