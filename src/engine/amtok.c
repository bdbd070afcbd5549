/* The message-lane tokens of the writers' authenticated control
 * connections (engine secret, docs/security.md): added by the listener when
 * a writer proved the secret, dropped when its connection closes, checked
 * for every message that must carry one (the message lane's writes and
 * reads, notifications). A leaf below the listener and the lanes: both
 * reach the table through it. Everything under seg_mu. */
#include "engine/engine_int.h"

#include <stdlib.h>
#include <string.h>

kvb_status_t kvb__am_token_add(kvb_engine_h eng, int fd, const uint8_t tok[KVB_HS_TOKEN_LEN])
{
    kvb_status_t st = KVB_OK;
    pthread_mutex_lock(&eng->seg_mu);
    if (eng->n_am_toks == eng->cap_am_toks) {
        size_t cap = eng->cap_am_toks ? eng->cap_am_toks * 2 : 8;
        struct kvb__am_tok *v = realloc(eng->am_toks, cap * sizeof(*v));
        if (v == NULL)
            st = KVB_ERR_NOMEM;
        else {
            eng->am_toks = v;
            eng->cap_am_toks = cap;
        }
    }
    if (st == KVB_OK) {
        eng->am_toks[eng->n_am_toks].fd = fd;
        eng->am_toks[eng->n_am_toks].used = false;
        memcpy(eng->am_toks[eng->n_am_toks++].tok, tok, KVB_HS_TOKEN_LEN);
    }
    pthread_mutex_unlock(&eng->seg_mu);
    return st;
}

/* Is tok the token of one of our live authenticated control connections?
 * Tokens are per connection: one seen on the wire or taken from another
 * writer's handshake stops working when that connection closes. The first
 * write under a token marks its connection as one that wrote: the cap never
 * closes it (listener.c). Any thread. */
bool kvb__am_token_live(kvb_engine_h eng, const uint8_t *tok)
{
    long hit = -1;
    pthread_mutex_lock(&eng->seg_mu);
    for (size_t i = 0; i < eng->n_am_toks; i++)
        if (kvb__ct_equal(tok, eng->am_toks[i].tok, KVB_HS_TOKEN_LEN))
            hit = (long)i;
    if (hit >= 0 && !eng->am_toks[hit].used) {
        eng->am_toks[hit].used = true;
        for (size_t i = 0; i < eng->n_notify; i++)
            if (eng->notify[i].fd == eng->am_toks[hit].fd)
                eng->notify[i].used = true;
    }
    pthread_mutex_unlock(&eng->seg_mu);
    return hit >= 0;
}

void kvb__am_token_drop_locked(kvb_engine_h eng, int fd)
{
    for (size_t i = 0; i < eng->n_am_toks; i++)
        if (eng->am_toks[i].fd == fd) {
            explicit_bzero(eng->am_toks[i].tok, KVB_HS_TOKEN_LEN);
            eng->am_toks[i] = eng->am_toks[--eng->n_am_toks];
            return;
        }
}
