/* Room table: chained hash map of room id → state, guarded by mgr->mu. */
#include "dialect/dialect.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static size_t bucket_of(const struct kvb_manager *m, uint64_t id)
{
    id ^= id >> 33;
    id *= 0xff51afd7ed558ccdull;
    id ^= id >> 33;
    return (size_t)(id & (m->n_buckets - 1));
}

kvb__room_t *kvb__room_find(struct kvb_manager *m, uint64_t id)
{
    kvb__room_t *r = m->buckets[bucket_of(m, id)];
    while (r != NULL && r->id != id)
        r = r->next;
    return r;
}

static void grow(struct kvb_manager *m)
{
    size_t n = m->n_buckets * 2;
    kvb__room_t **b = calloc(n, sizeof(*b));
    if (b == NULL)
        return; /* keep the longer chains */
    kvb__room_t **old = m->buckets;
    size_t on = m->n_buckets;
    m->buckets = b;
    m->n_buckets = n;
    for (size_t i = 0; i < on; i++)
        for (kvb__room_t *r = old[i], *next; r != NULL; r = next) {
            next = r->next;
            size_t k = bucket_of(m, r->id);
            r->next = b[k];
            b[k] = r;
        }
    free(old);
}

kvb__room_t *kvb__room_get(struct kvb_manager *m, uint64_t id)
{
    kvb__room_t *r = kvb__room_find(m, id);
    if (r != NULL)
        return r;
    r = calloc(1, sizeof(*r));
    if (r == NULL)
        return NULL;
    r->id = id;
    r->mgr = m;
    r->status = -1; /* none yet */
    r->t_start = kvb__now_s();
    r->tl = kvb__tl_new((int)m->mode, id);
    if (m->n_rooms + 1 > m->n_buckets)
        grow(m);
    size_t k = bucket_of(m, id);
    r->next = m->buckets[k];
    m->buckets[k] = r;
    m->n_rooms++;
    return r;
}

void kvb__dst_free(kvb__dst_t *d)
{
    free(d->pages);
    free(d->mask);
    free(d->state_idx);
    if (d->plan != NULL)
        d->dialect->plan_free(d->plan);
}

static void room_free(kvb__room_t *r)
{
    kvb__room_unchange(r->mgr, r);
    kvb__tl_room_gone(r->tl);
    kvb__tl_put(r->tl);
    for (size_t i = 0; i < r->n_dst; i++)
        kvb__dst_free(&r->dsts[i]);
    free(r->dsts);
    free(r->xfers);
    free(r->srcs);
    free(r->responded);
    for (size_t i = 0; i < r->n_integ; i++)
        kvb__integ_free(&r->integ[i]);
    free(r->integ);
    free(r->own_pages);
    free(r->bootstrap_addr);
    free(r->reason);
    free(r);
}

/* ---- rooms peers created by naming them (prefill) ----
 * Each is listed, oldest first, under the peer that named it first (its
 * CURVE key, or without CURVE the ip:port its frames claim). At a cap the
 * oldest room of the peer holding the most goes: a flood displaces its own
 * rooms, not the few a genuine decode has waiting for their senders. */

static kvb__wpeer_t *wpeer_get(struct kvb_manager *m, const char *key)
{
    kvb__wpeer_t *p = m->wpeers;
    while (p != NULL && strcmp(p->key, key) != 0)
        p = p->next;
    if (p == NULL && (p = calloc(1, sizeof(*p))) != NULL) {
        snprintf(p->key, sizeof(p->key), "%s", key);
        p->next = m->wpeers;
        m->wpeers = p;
    }
    return p;
}

static void wpeer_drop_if_empty(struct kvb_manager *m, kvb__wpeer_t *p)
{
    if (p->rooms > 0)
        return;
    kvb__wpeer_t **pp = &m->wpeers;
    while (*pp != p)
        pp = &(*pp)->next;
    *pp = p->next;
    free(p);
}

static void wpeer_link(kvb__wpeer_t *p, kvb__room_t *r)
{
    r->wpeer = p;
    r->wnext = NULL;
    r->wprev = p->tail;
    if (p->tail != NULL)
        p->tail->wnext = r;
    else
        p->head = r;
    p->tail = r;
    p->rooms++;
}

static void wpeer_unlink(struct kvb_manager *m, kvb__room_t *r)
{
    kvb__wpeer_t *p = r->wpeer;
    if (r->wprev != NULL)
        r->wprev->wnext = r->wnext;
    else
        p->head = r->wnext;
    if (r->wnext != NULL)
        r->wnext->wprev = r->wprev;
    else
        p->tail = r->wprev;
    p->rooms--;
    p->bytes -= r->wire_bytes;
    r->wpeer = NULL;
    r->wprev = r->wnext = NULL;
    wpeer_drop_if_empty(m, p);
}

/* Free the oldest room of the busiest peer (not keep); false: none left. */
static bool wire_evict(struct kvb_manager *m, const kvb__room_t *keep)
{
    kvb__wpeer_t *busiest = NULL;
    for (kvb__wpeer_t *p = m->wpeers; p != NULL; p = p->next)
        if ((busiest == NULL || p->rooms > busiest->rooms) && (p->head != keep || p->rooms > 1))
            busiest = p;
    if (busiest == NULL)
        return false;
    kvb__room_t *v = busiest->head != keep ? busiest->head : busiest->head->wnext;
    m->wire_rooms_evicted++;
    kvb__room_remove(m, v->id);
    return true;
}

static void wire_refused(struct kvb_manager *m, uint64_t id)
{
    uint64_t k = ++m->wire_rooms_refused;
    if ((k & (k - 1)) == 0)
        KVB_LOGW("manager %s: message for room %llu refused: it alone passes "
                 "KVBRIDGE_MAX_WIRE_ROOM_BYTES (%llu); %llu refused so far",
                 m->endpoint, (unsigned long long)id, (unsigned long long)m->max_wire_room_bytes,
                 (unsigned long long)k);
}

kvb__room_t *kvb__room_wire_admit(struct kvb_manager *m, uint64_t id, uint64_t bytes,
                                  const char *peer)
{
    kvb__room_t *r = kvb__room_find(m, id);
    uint64_t add =
        bytes + (r == NULL ? sizeof(*r) + (kvb__tl_enabled() ? sizeof(kvb__tl_t) : 0) : 0);
    if (r != NULL && !r->wire)
        return r; /* a sender's room: the application bounds it */
    uint64_t evicted0 = m->wire_rooms_evicted;
    while ((r == NULL && m->wire_rooms >= m->max_wire_rooms) ||
           m->wire_room_bytes + add > m->max_wire_room_bytes) {
        if (!wire_evict(m, r)) {
            wire_refused(m, id);
            return NULL;
        }
    }
    if (m->wire_rooms_evicted != evicted0 &&
        (m->wire_rooms_evicted & (m->wire_rooms_evicted - 1)) == 0)
        KVB_LOGW("manager %s: %llu rooms named by peers without a sender dropped so far "
                 "(KVBRIDGE_MAX_WIRE_ROOMS %zu / KVBRIDGE_MAX_WIRE_ROOM_BYTES %llu)",
                 m->endpoint, (unsigned long long)m->wire_rooms_evicted, m->max_wire_rooms,
                 (unsigned long long)m->max_wire_room_bytes);
    if (r == NULL) {
        kvb__wpeer_t *p = wpeer_get(m, peer);
        if (p == NULL || (r = kvb__room_get(m, id)) == NULL) {
            if (p != NULL)
                wpeer_drop_if_empty(m, p);
            return NULL;
        }
        r->wire = 1;
        wpeer_link(p, r);
        m->wire_rooms++;
    }
    r->wire_bytes += add;
    r->wpeer->bytes += add;
    m->wire_room_bytes += add;
    return r;
}

void kvb__room_unwire(struct kvb_manager *m, kvb__room_t *r)
{
    if (!r->wire)
        return;
    m->wire_rooms--;
    m->wire_room_bytes -= r->wire_bytes;
    wpeer_unlink(m, r);
    r->wire = 0;
    r->wire_bytes = 0;
}

void kvb__room_remove(struct kvb_manager *m, uint64_t id)
{
    kvb__room_t **pp = &m->buckets[bucket_of(m, id)];
    while (*pp != NULL && (*pp)->id != id)
        pp = &(*pp)->next;
    if (*pp == NULL)
        return;
    kvb__room_t *r = *pp;
    *pp = r->next;
    m->n_rooms--;
    kvb__room_unwire(m, r);
    room_free(r);
}

void kvb__room_set_status(kvb__room_t *r, int status)
{
    int old = r->status;
    if (old == KVB_POLL_FAILED)
        return; /* kvbridge: Failed is sticky */
    if (old < 0 || status == KVB_POLL_FAILED || status > old)
        r->status = status;
    if (r->status != old)
        kvb__room_changed(r);
    if ((r->status == KVB_POLL_FAILED || r->status == KVB_POLL_SUCCESS) && r->t_terminal == 0) {
        r->t_terminal = kvb__now_s();
        kvb__tl_terminal(r->tl, r->status, old, r->reason);
    }
}

void kvb__room_fail(kvb__room_t *r, const char *fmt, ...)
{
    if (r->reason == NULL && r->status != KVB_POLL_FAILED) {
        char buf[512];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(buf, sizeof(buf), fmt, ap);
        va_end(ap);
        r->reason = strdup(buf);
    }
    kvb__room_set_status(r, KVB_POLL_FAILED);
}

void kvb__room_note(kvb__room_t *r, const char *note)
{
    const char *base = r->reason != NULL ? r->reason : "Failed";
    size_t n = strlen(base) + strlen(note) + 1;
    char *v = malloc(n);
    if (v == NULL)
        return;
    snprintf(v, n, "%s%s", base, note);
    free(r->reason);
    r->reason = v;
}

void kvb__room_take_reason(kvb__room_t *r, char *buf, size_t len)
{
    const char *why = r != NULL && r->reason != NULL
                          ? r->reason
                          : "Failed due to an unknown reason from another rank";
    if (len > 0)
        snprintf(buf, len, "%s", why);
    if (r != NULL) {
        free(r->reason);
        r->reason = NULL;
    }
}

/* Is r, a room with a handle, due for a poll that no message will prompt: a
 * time-out passed (kvb__sender_status: Bootstrapping;
 * kvb__receiver_status: WaitingForInput), or a failed room poll() holds
 * until its writes end or its quarantine bound passes (decode.c fence_done:
 * each poll looks again)? */
static bool room_due(const struct kvb_manager *m, const kvb__room_t *r, double now)
{
    if (!r->has_handle)
        return false;
    if (m->mode == KVB_MODE_PREFILL)
        return r->status < 0 || r->status == KVB_POLL_BOOTSTRAPPING
                   ? now - r->t_start >= m->p.bootstrap_timeout_s
                   : false;
    if (r->status == KVB_POLL_WAITING_FOR_INPUT && r->t_init > 0)
        return now - r->t_init >= m->p.waiting_timeout_s;
    return r->status == KVB_POLL_FAILED && !r->reported;
}

/* Once a second (m->mu held): free rooms nobody holds a handle on once
 * they are terminal (or stuck) for longer than the TTL (transfer infos of
 * requests the prefill never created a sender for, statuses for receivers
 * already destroyed), and list in kvb_manager_changed the rooms whose
 * time-out has passed, so that a caller polling only what changed sees
 * them fail. */
void kvb__rooms_sweep(struct kvb_manager *m, double now)
{
    double ttl = m->p.room_ttl_s;
    for (size_t i = 0; i < m->n_buckets; i++) {
        kvb__room_t **pp = &m->buckets[i];
        while (*pp != NULL) {
            kvb__room_t *r = *pp;
            double since = r->t_terminal > 0 ? r->t_terminal : r->t_start;
            if (room_due(m, r, now))
                kvb__room_changed(r);
            if (!r->has_handle && r->inflight == 0 && now - since > ttl) {
                *pp = r->next;
                m->n_rooms--;
                kvb__room_unwire(m, r);
                room_free(r);
                continue;
            }
            pp = &r->next;
        }
    }
}

void kvb__rooms_free(struct kvb_manager *m)
{
    for (size_t i = 0; i < m->n_buckets; i++)
        for (kvb__room_t *r = m->buckets[i], *next; r != NULL; r = next) {
            next = r->next;
            room_free(r);
        }
    free(m->buckets);
    m->buckets = NULL;
    m->n_rooms = 0;
    for (kvb__wpeer_t *p = m->wpeers, *next; p != NULL; p = next) {
        next = p->next;
        free(p);
    }
    m->wpeers = NULL;
}

/* ---- the changed list: kvb_manager_changed says which rooms to poll at
 * all (polling every active room on each wake made a rank's cost per wake
 * O(rooms in flight); the list makes it O(rooms that changed)) ---- */

void kvb__room_changed(kvb__room_t *r)
{
    struct kvb_manager *m = r->mgr;
    uint64_t one = 1;
    if (m == NULL)
        return;
    if (!r->changed) { /* at most once in the list: appended at its first change */
        r->changed = 1;
        r->cnext = NULL;
        r->cprev = m->chg_tail;
        if (m->chg_tail != NULL)
            m->chg_tail->cnext = r;
        else
            m->chg_head = r;
        m->chg_tail = r;
    }
    /* Non-blocking; a full counter (2^64 - 2 unread) is still readable. */
    if (m->ev_on && write(m->ev_fd, &one, sizeof(one)) < 0)
        return;
}

void kvb__room_unchange(struct kvb_manager *m, kvb__room_t *r)
{
    if (!r->changed)
        return;
    if (r->cprev != NULL)
        r->cprev->cnext = r->cnext;
    else
        m->chg_head = r->cnext;
    if (r->cnext != NULL)
        r->cnext->cprev = r->cprev;
    else
        m->chg_tail = r->cprev;
    r->cprev = r->cnext = NULL;
    r->changed = 0;
}

kvb_status_t kvb_manager_changed(kvb_manager_h m, uint64_t *rooms, size_t cap, size_t *n_p)
{
    if (m == NULL || n_p == NULL || (cap > 0 && rooms == NULL))
        return KVB_ERR_INVALID;
    size_t n = 0;
    pthread_mutex_lock(&m->mu);
    while (n < cap && m->chg_head != NULL) {
        kvb__room_t *r = m->chg_head;
        rooms[n++] = r->id;
        kvb__room_unchange(m, r);
    }
    pthread_mutex_unlock(&m->mu);
    *n_p = n;
    return KVB_OK;
}
