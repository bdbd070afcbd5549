/* A room's outputs that travel with its status in the dialects that carry
 * them (TokenSpeed: the first token and speculative candidates): set by the
 * prefill's sender, read back into the status by its dialect; on the decode,
 * stored from a Success and read by kvb_receiver_first_token. A bounded
 * table: rooms map onto KVB__OUTPUTS slots and a later room takes a slot.
 * Made on first use, so a manager that never meets such a dialect pays
 * nothing. Any thread. */
#include "conn/conn_int.h"

#include <stdlib.h>
#include <string.h>

#define KVB__OUTPUTS 4096 /* rooms' first tokens (direct-mapped by room) */

typedef struct output {
    uint64_t room;
    int used, has_token;
    int64_t token, aux_index;
    int32_t *cands;
    size_t n_cands;
    uint64_t cached; /* the prefill's prefix-cache hit in tokens (0: none said) */
    int has_cached;  /* a decode: a Success said it */
    int has_logprob; /* logprob: the first token's, when the request asked for it */
    double logprob;
} output_t;

struct kvb__outputs {
    pthread_mutex_t mu; /* first: kvb__lazy_table initialises it */
    output_t out[KVB__OUTPUTS];
};

static struct kvb__outputs *outputs_get(struct kvb_manager *m, bool create)
{
    return kvb__lazy_table((void **)&m->outputs, sizeof(struct kvb__outputs), create);
}

void kvb__outputs_free(struct kvb_manager *m)
{
    struct kvb__outputs *t = m->outputs;
    if (t == NULL)
        return;
    for (size_t i = 0; i < KVB__OUTPUTS; i++)
        free(t->out[i].cands);
    pthread_mutex_destroy(&t->mu);
    free(t);
    m->outputs = NULL;
}

static output_t *output_slot(struct kvb__outputs *t, uint64_t room, bool claim)
{
    output_t *o = &t->out[room % KVB__OUTPUTS];
    if (o->used && o->room == room)
        return o;
    if (!claim)
        return NULL;
    free(o->cands); /* another room's: a later one wins the slot */
    memset(o, 0, sizeof(*o));
    o->used = 1;
    o->room = room;
    o->aux_index = -1;
    return o;
}

void kvb__output_note_aux(struct kvb_manager *m, uint64_t room, int64_t aux_index)
{
    struct kvb__outputs *t = outputs_get(m, false);
    if (t == NULL)
        return; /* no dialect that carries outputs ever spoke to this rank */
    pthread_mutex_lock(&t->mu);
    output_slot(t, room, true)->aux_index = aux_index;
    pthread_mutex_unlock(&t->mu);
}

void kvb__outputs_enable(struct kvb_manager *m)
{
    (void)outputs_get(m, true);
}

kvb_status_t kvb__output_set(struct kvb_manager *m, uint64_t room, int64_t token,
                             const int32_t *cands, size_t count, bool first_wins)
{
    struct kvb__outputs *t = outputs_get(m, true);
    int32_t *copy = malloc((count ? count : 1) * sizeof(*copy));
    if (t == NULL || copy == NULL) {
        free(copy);
        return KVB_ERR_NOMEM;
    }
    if (count > 0)
        memcpy(copy, cands, count * sizeof(*copy));
    pthread_mutex_lock(&t->mu);
    output_t *o = output_slot(t, room, true);
    if (first_wins && o->has_token) {
        free(copy);
    } else {
        free(o->cands);
        o->has_token = 1;
        o->token = token;
        o->cands = copy;
        o->n_cands = count;
    }
    pthread_mutex_unlock(&t->mu);
    return KVB_OK;
}

kvb_status_t kvb__output_set_extras(struct kvb_manager *m, uint64_t room, const uint64_t *cached,
                                    const double *logprob, bool merge)
{
    struct kvb__outputs *t = outputs_get(m, true);
    if (t == NULL)
        return KVB_ERR_NOMEM;
    pthread_mutex_lock(&t->mu);
    output_t *o = output_slot(t, room, true);
    if (cached != NULL && (!merge || !o->has_cached || *cached > o->cached)) {
        o->cached = *cached;
        o->has_cached = 1;
    }
    if (logprob != NULL && (!merge || !o->has_logprob)) {
        o->has_logprob = 1;
        o->logprob = *logprob;
    }
    pthread_mutex_unlock(&t->mu);
    return KVB_OK;
}

bool kvb__output_extras(struct kvb_manager *m, uint64_t room, uint64_t *cached_p, double *logprob_p)
{
    struct kvb__outputs *t = outputs_get(m, false);
    bool has = false;
    *cached_p = 0;
    if (t == NULL)
        return false;
    pthread_mutex_lock(&t->mu);
    output_t *o = output_slot(t, room, false);
    if (o != NULL) {
        *cached_p = o->cached;
        has = o->has_logprob != 0;
        *logprob_p = o->logprob;
    }
    pthread_mutex_unlock(&t->mu);
    return has;
}

kvb_status_t kvb_sender_set_cached_tokens(kvb_sender_h s, uint64_t cached_tokens)
{
    if (s == NULL || cached_tokens > INT64_MAX)
        return KVB_ERR_INVALID;
    return kvb__output_set_extras(s->mgr, s->room, &cached_tokens, NULL, false);
}

kvb_status_t kvb_sender_set_first_logprob(kvb_sender_h s, double logprob)
{
    if (s == NULL || logprob != logprob) /* NaN: no logprob a decode could use */
        return KVB_ERR_INVALID;
    return kvb__output_set_extras(s->mgr, s->room, NULL, &logprob, false);
}

kvb_status_t kvb_sender_set_first_token(kvb_sender_h s, int64_t token, const int32_t *cands,
                                        size_t count)
{
    if (s == NULL || (cands == NULL && count > 0) || count > KVB__MAX_CANDIDATES || token < -1)
        return KVB_ERR_INVALID;
    return kvb__output_set(s->mgr, s->room, token, cands, count, false);
}

int kvb_receiver_first_token(kvb_receiver_h rc, int64_t *token_p, int32_t *cands, size_t cap,
                             size_t *n_p)
{
    int32_t *c = NULL;
    size_t n = 0;
    if (rc == NULL || token_p == NULL || (cands == NULL && cap > 0))
        return 0;
    struct kvb__outputs *t = outputs_get(rc->mgr, false);
    if (t == NULL)
        return 0;
    pthread_mutex_lock(&t->mu);
    output_t *o = output_slot(t, rc->room, false);
    bool known = o != NULL && o->has_token;
    if (known) {
        *token_p = o->token;
        n = o->n_cands;
        c = o->cands;
        memcpy(cands, c, (n < cap ? n : cap) * sizeof(int32_t));
    }
    pthread_mutex_unlock(&t->mu);
    if (known && n_p != NULL)
        *n_p = n;
    return known ? 1 : 0;
}

/* One of a decode room's extras (kvb__output_set_extras with merge), under
 * the table's lock: 1 when a Success said it. */
static int receiver_extra(kvb_receiver_h rc, uint64_t *cached_p, double *logprob_p)
{
    struct kvb__outputs *t = rc != NULL ? outputs_get(rc->mgr, false) : NULL;
    int known = 0;
    if (t == NULL)
        return 0;
    pthread_mutex_lock(&t->mu);
    output_t *o = output_slot(t, rc->room, false);
    if (o != NULL && cached_p != NULL && o->has_cached) {
        *cached_p = o->cached;
        known = 1;
    }
    if (o != NULL && logprob_p != NULL && o->has_logprob) {
        *logprob_p = o->logprob;
        known = 1;
    }
    pthread_mutex_unlock(&t->mu);
    return known;
}

int kvb_receiver_cached_tokens(kvb_receiver_h rc, uint64_t *cached_p)
{
    return cached_p != NULL ? receiver_extra(rc, cached_p, NULL) : 0;
}

int kvb_receiver_first_logprob(kvb_receiver_h rc, double *logprob_p)
{
    return logprob_p != NULL ? receiver_extra(rc, NULL, logprob_p) : 0;
}

/* aux buffer 0's first int32 at slot aux (SGLang's output_ids), or -2 when
 * there is no such slot. */
static int64_t aux_token(const struct kvb_manager *m, int64_t aux)
{
    int32_t v;
    if (aux < 0 || m->args.num_aux == 0 || m->aux_items[0] < 4 ||
        (uint64_t)aux >= m->aux_lens[0] / m->aux_items[0])
        return -2;
    memcpy(&v, (const uint8_t *)(uintptr_t)m->aux_ptrs[0] + m->aux_items[0] * (uint64_t)aux, 4);
    return v;
}

void kvb__output_latch(struct kvb_manager *m, uint64_t room)
{
    struct kvb__outputs *t = outputs_get(m, false);
    if (t == NULL)
        return;
    pthread_mutex_lock(&t->mu);
    output_t *o = output_slot(t, room, false);
    int64_t v = o != NULL && !o->has_token ? aux_token(m, o->aux_index) : -2;
    if (v != -2) {
        o->token = v;
        o->has_token = 1;
    }
    pthread_mutex_unlock(&t->mu);
}

int64_t kvb__output_first_token(struct kvb_manager *m, uint64_t room, int32_t **cands_p,
                                size_t *n_p)
{
    struct kvb__outputs *t = outputs_get(m, false);
    int64_t token = -1, aux = -1;
    *cands_p = NULL;
    *n_p = 0;
    if (t == NULL)
        return -1;
    pthread_mutex_lock(&t->mu);
    output_t *o = output_slot(t, room, false);
    if (o != NULL && o->has_token) {
        token = o->token;
        *cands_p = o->n_cands ? malloc(o->n_cands * sizeof(int32_t)) : NULL;
        if (*cands_p != NULL) {
            memcpy(*cands_p, o->cands, o->n_cands * sizeof(int32_t));
            *n_p = o->n_cands;
        }
    } else if (o != NULL) {
        aux = o->aux_index;
    }
    pthread_mutex_unlock(&t->mu);
    if (aux_token(m, aux) != -2) /* not latched (kvb__output_latch): read now */
        token = aux_token(m, aux);
    /* Not a token id (an aux slot that holds none): "none", not a status
     * that fails to encode, is never sent and leaves the decode waiting. */
    return token < -1 ? -1 : token;
}
