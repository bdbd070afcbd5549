/* Prefill side: telling the decode ranks how a room ended (its status, or
 * ABORT_ACK to a decode that asked for the abort), once nothing of the
 * room is in flight, and the abort itself (fail, wait for the submitting
 * worker, cancel the writes). Used by the control path (prefill_ctl.c) and
 * the workers (prefill_xfer.c). */
#include "dialect/dialect.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- notifications (never under m->mu: ZeroMQ sends) ---- */

/* Collect, under m->mu, the decode endpoints to tell about the room's end.
 * Returns the count (0 when nothing is due); *status_p the value to send. */
size_t kvb__notes_due(struct kvb_manager *m, kvb__room_t *r, kvb__note_t **out, int *status_p)
{
    size_t n = 0;
    int failed = r->status == KVB_POLL_FAILED;
    if (r->inflight > 0 || r->submitting || (failed ? r->fail_notified : !r->success_due))
        return 0;
    if (failed && r->unsettled) /* a Failed or ABORT_ACK would say nothing more lands */
        return 0;
    if (!failed && r->status != KVB_POLL_SUCCESS)
        return 0;
    *out = calloc(r->n_dst + 1, sizeof(kvb__note_t));
    if (*out == NULL)
        return 0;
    for (size_t i = 0; i < r->n_dst; i++)
        if (!r->dsts[i].dummy) {
            snprintf((*out)[n].ip, KVB_IP_MAX, "%s", r->dsts[i].ip);
            if (!failed && i < r->n_integ && r->integ[i].buf_sum != NULL &&
                kvb__integ_sendable(&r->integ[i]))
                kvb__integ_encode(&r->integ[i], &(*out)[n].digest, &(*out)[n].digest_len);
            (*out)[n++].port = r->dsts[i].port;
        }
    if (failed && r->abort_port != 0) {
        bool known = false;
        for (size_t i = 0; i < n; i++)
            if ((*out)[i].port == r->abort_port && strcmp((*out)[i].ip, r->abort_ip) == 0) {
                known = true;
                (*out)[i].ack = r->abort_via;
                (*out)[i].has_gen = r->abort_has_gen;
                (*out)[i].gen = r->abort_gen;
            }
        if (!known) {
            snprintf((*out)[n].ip, KVB_IP_MAX, "%s", r->abort_ip);
            (*out)[n].ack = r->abort_via;
            (*out)[n].has_gen = r->abort_has_gen;
            (*out)[n].gen = r->abort_gen;
            (*out)[n++].port = r->abort_port;
        }
    }
    if (failed)
        r->fail_notified = 1;
    else
        r->success_due = 0;
    *status_p = failed ? KVB_POLL_FAILED : KVB_POLL_SUCCESS;
    return n;
}

kvb_status_t kvb__send_status_digest(struct kvb_manager *m, const char *ip, uint16_t port,
                                     uint64_t room, int status, int32_t rank, const uint8_t *digest,
                                     size_t digest_len)
{
    const kvb__dialect_t *d = kvb__endpoint_dialect(m, ip, port);
    if (d == NULL)
        d = kvb__dialect_default();
    if (digest == NULL || d->send_status_digest == NULL)
        return d->send_status(m, ip, port, room, status, rank);
    kvb_status_t st = d->send_status_digest(m, ip, port, room, status, rank, digest, digest_len);
    if (st == KVB_OK)
        __atomic_add_fetch(&m->integ_sent, 1, __ATOMIC_RELAXED);
    return st;
}

kvb_status_t kvb__send_status(struct kvb_manager *m, const char *ip, uint16_t port, uint64_t room,
                              int status, int32_t rank)
{
    const kvb__dialect_t *d = kvb__endpoint_dialect(m, ip, port);
    if (d == NULL)
        d = kvb__dialect_default();
    return d->send_status(m, ip, port, room, status, rank);
}

void kvb__send_notes(struct kvb_manager *m, uint64_t room, kvb__note_t *notes, size_t n, int status,
                     kvb__tl_t *tl)
{
    KVB_LOGD("manager %s: room %llu ends %s; telling %zu decode rank(s)", m->endpoint,
             (unsigned long long)room, kvb_poll_string((kvb_poll_t)status), n);
    for (size_t i = 0; i < n; i++) {
        kvb__note_t *t = &notes[i];
        kvb_status_t st = t->ack != NULL
                              ? t->ack->send_abort_ack(m, t->ip, t->port, room, m->prefill_rank,
                                                       t->has_gen ? &t->gen : NULL)
                              : kvb__send_status_digest(m, t->ip, t->port, room, status,
                                                        m->prefill_rank, t->digest, t->digest_len);
        free(t->digest);
        kvb__tl_add_ep(tl, t->ack != NULL ? KVB_EV_ABORT_ACK_SENT : KVB_EV_STATUS_SENT,
                       t->ack != NULL ? st : status, t->ip, t->port);
        if (st != KVB_OK)
            KVB_LOGW("manager %s: status of room %llu to %s:%u not sent", m->endpoint,
                     (unsigned long long)room, t->ip, t->port);
    }
    free(notes);
}

/* Send whatever terminal status of room is due. */
void kvb__prefill_notify(struct kvb_manager *m, uint64_t room)
{
    kvb__note_t *notes = NULL;
    int status = 0;
    size_t n = 0;
    pthread_mutex_lock(&m->mu);
    kvb__room_t *r = kvb__room_find(m, room);
    if (r != NULL)
        n = kvb__notes_due(m, r, &notes, &status);
    kvb__tl_t *tl = notes != NULL ? kvb__tl_ref(r->tl) : NULL;
    pthread_mutex_unlock(&m->mu);
    if (n > 0 || notes != NULL)
        kvb__send_notes(m, room, notes, n, status, tl);
    kvb__tl_put(tl);
}

static bool holds_session(const kvb__room_t *r, const char *sid)
{
    for (size_t i = 0; i < r->n_dst; i++)
        if (strcmp(r->dsts[i].session, sid) == 0)
            return true;
    return false;
}

void kvb__prefill_fail_session(struct kvb_manager *m, const char *sid, const char *reason)
{
    uint64_t *ids = NULL;
    size_t n = 0, cap = 0;
    pthread_mutex_lock(&m->mu);
    for (size_t i = 0; i < m->n_buckets; i++)
        for (kvb__room_t *r = m->buckets[i]; r != NULL; r = r->next) {
            if (r->status == KVB_POLL_SUCCESS || r->status == KVB_POLL_FAILED ||
                !holds_session(r, sid))
                continue;
            kvb__prefill_abort_room(m, r, reason);
            if (n == cap) {
                uint64_t *v = realloc(ids, (cap = cap ? 2 * cap : 8) * sizeof(*v));
                if (v == NULL)
                    continue; /* failed all the same; told when a sender polls it */
                ids = v;
            }
            ids[n++] = r->id;
        }
    pthread_mutex_unlock(&m->mu);
    for (size_t i = 0; i < n; i++)
        kvb__prefill_notify(m, ids[i]);
    free(ids);
}

/* m->mu held. Fail the room, wait until no worker is issuing writes for it,
 * and cancel the writes in flight: after this returns no new block of the
 * room is issued. */
void kvb__prefill_abort_room(struct kvb_manager *m, kvb__room_t *r, const char *reason)
{
    kvb__room_fail(r, "%s", reason);
    r->aborted = 1;
    while (r->submitting)
        pthread_cond_wait(&m->room_cv, &m->mu);
    for (size_t i = 0; i < r->n_xfers; i++)
        kvb_xfer_cancel(r->xfers[i]);
}
