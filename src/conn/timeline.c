/* Rooms' timelines: a fixed ring per room (the first KVB_TIMELINE_HEAD
 * events kept, then the newest), claimed by an atomic counter and published
 * per record with a sequence number, so recording takes no lock and a
 * reader copies a consistent record or skips it. The rooms' metrics
 * (ended, failed by class, stage histograms, in flight, fence holds) are
 * counted here from the same stamps. */
#include "conn/timeline.h"
#include "core/core.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define RING (KVB_TIMELINE_SLOTS - KVB_TIMELINE_HEAD)

bool kvb__tl_enabled(void)
{
    return kvb__observe_on();
}

kvb__tl_t *kvb__tl_new(int role, uint64_t room)
{
    if (!kvb__observe_on())
        return NULL;
    kvb__tl_t *tl = calloc(1, sizeof(*tl));
    if (tl == NULL)
        return NULL;
    tl->refs = 1;
    tl->role = role != 0;
    tl->room = room;
    tl->t0_ns = kvb__now_ns();
    kvb__m_add(KVB__M_ROOMS_IN_FLIGHT, kvb__m_role(tl->role, 0, 1), 1);
    kvb__tl_add_at(tl, KVB_EV_CREATED, tl->t0_ns, 0, NULL);
    return tl;
}

kvb__tl_t *kvb__tl_ref(kvb__tl_t *tl)
{
    if (tl != NULL)
        __atomic_add_fetch(&tl->refs, 1, __ATOMIC_RELAXED);
    return tl;
}

void kvb__tl_put(kvb__tl_t *tl)
{
    if (tl == NULL || __atomic_sub_fetch(&tl->refs, 1, __ATOMIC_ACQ_REL) != 0)
        return;
    kvb_timeline_t *t = NULL;
    /* let go by its room and its handle: no event can follow */
    if (kvb__trace_on() && kvb__tl_snapshot(tl, tl->room, &t) == KVB_OK)
        kvb__trace_room(tl, t);
    kvb_timeline_free(t);
    free(tl);
}

static uint32_t slot_of(uint32_t i)
{
    return i < KVB_TIMELINE_HEAD ? i : KVB_TIMELINE_HEAD + (i - KVB_TIMELINE_HEAD) % RING;
}

static void stamp(uint64_t *first, uint64_t *last, uint64_t rel)
{
    uint64_t zero = 0;
    __atomic_compare_exchange_n(first, &zero, rel, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
    __atomic_store_n(last, rel, __ATOMIC_RELAXED);
}

void kvb__tl_add_at(kvb__tl_t *tl, kvb_event_t ev, uint64_t t_ns, int64_t value, const char *detail)
{
    if (tl == NULL || (unsigned)ev >= KVB_EV_COUNT)
        return;
    int64_t rel = (int64_t)((t_ns != 0 ? t_ns : kvb__now_ns()) - tl->t0_ns);
    uint32_t i = __atomic_fetch_add(&tl->next, 1, __ATOMIC_RELAXED);
    if (rel >= 0)
        stamp(&tl->first[ev], &tl->last[ev], (uint64_t)rel + 1);
    kvb__tl_rec_t *r = &tl->rec[slot_of(i)];
    /* Past the ring an event overwrites the oldest one after the head; a
     * writer finding another one still in that record (RING events behind
     * it) drops its event rather than wait. */
    bool busy = i >= KVB_TIMELINE_HEAD && __atomic_exchange_n(&r->busy, 1, __ATOMIC_ACQUIRE);
    if (i >= KVB_TIMELINE_SLOTS || busy)
        kvb__m_add(KVB__M_TL_DROPPED, kvb__m_role(tl->role, 0, 1), 1);
    if (busy)
        return;
    uint64_t w[KVB__TL_WORDS] = {0};
    kvb__tl_payload_t p = {.t_ns = rel, .value = value, .event = (uint16_t)ev};
    snprintf(p.detail, sizeof(p.detail), "%s", detail != NULL ? detail : "");
    memcpy(w, &p, sizeof(p));
    /* A reader that sees seq 0, or a seq that changed while it copied,
     * skips the record (seqlock). Each word a release store: none moves
     * before the seq's reset. */
    __atomic_store_n(&r->seq, 0, __ATOMIC_RELAXED);
    for (size_t k = 0; k < KVB__TL_WORDS; k++)
        __atomic_store_n(&r->w[k], w[k], __ATOMIC_RELEASE);
    __atomic_store_n(&r->seq, i + 1, __ATOMIC_RELEASE);
    if (i >= KVB_TIMELINE_HEAD)
        __atomic_store_n(&r->busy, 0, __ATOMIC_RELEASE);
}

void kvb__tl_add_ep(kvb__tl_t *tl, kvb_event_t ev, int64_t value, const char *ip, uint16_t port)
{
    char d[KVB_TIMELINE_DETAIL];
    if (tl == NULL)
        return;
    snprintf(d, sizeof(d), "%s:%u", ip, port);
    kvb__tl_add_at(tl, ev, 0, value, d);
}

/* The seeds' and kvbridge's failure texts, by class: the first pattern
 * found in the reason names it. */
static const struct {
    const char *pat;
    kvb__reason_t cls;
} classes[] = {
    {"Aborted", KVB__R_ABORTED},
    {"timed out", KVB__R_TIMEOUT},
    {"did not finish within", KVB__R_TIMEOUT},
    {"Losing connection", KVB__R_PEER_LOST},
    {"declared lost", KVB__R_PEER_LOST},
    {"from another rank", KVB__R_PEER_FAILED},
    {"prefill reported", KVB__R_PEER_FAILED},
    {"Failed to send kv chunk", KVB__R_TRANSFER},
    {"bootstrap", KVB__R_BOOTSTRAP},
    {"refused", KVB__R_REFUSED},
    {"cannot be served", KVB__R_REFUSED},
};

kvb__reason_t kvb__reason_class(const char *reason)
{
    for (size_t i = 0; reason != NULL && i < sizeof(classes) / sizeof(classes[0]); i++)
        if (strstr(reason, classes[i].pat) != NULL)
            return classes[i].cls;
    return KVB__R_OTHER;
}

/* ns from a to b when both were stamped (b after a); false otherwise. */
static bool span(uint64_t a, uint64_t b, uint64_t *ns_p)
{
    if (a == 0 || b == 0 || b < a)
        return false;
    *ns_p = b - a;
    return true;
}

static void observe_stages(const kvb__tl_t *tl, uint64_t end)
{
    uint64_t ns;
    const uint64_t *f = tl->first, *l = tl->last;
    size_t base = (size_t)tl->role * KVB__STAGES;
    if (tl->role == 0) {
        if (span(1, __atomic_load_n(&l[KVB_EV_TRANSFER_INFO_RECEIVED], __ATOMIC_RELAXED), &ns))
            kvb__m_observe(KVB__M_STAGE, base + KVB__ST_WAIT_DECODE, ns);
        if (span(__atomic_load_n(&f[KVB_EV_FIRST_WRITE_POSTED], __ATOMIC_RELAXED),
                 __atomic_load_n(&l[KVB_EV_LAST_WRITE_DONE], __ATOMIC_RELAXED), &ns))
            kvb__m_observe(KVB__M_STAGE, base + KVB__ST_TRANSFER, ns);
    } else {
        if (span(1, __atomic_load_n(&l[KVB_EV_BOOTSTRAP_ANSWERED], __ATOMIC_RELAXED), &ns))
            kvb__m_observe(KVB__M_STAGE, base + KVB__ST_BOOTSTRAP, ns);
        if (span(__atomic_load_n(&f[KVB_EV_TRANSFER_INFO_SENT], __ATOMIC_RELAXED),
                 __atomic_load_n(&l[KVB_EV_STATUS_RECEIVED], __ATOMIC_RELAXED), &ns))
            kvb__m_observe(KVB__M_STAGE, base + KVB__ST_TRANSFER, ns);
    }
    kvb__m_observe(KVB__M_STAGE, base + KVB__ST_TOTAL, end - 1);
}

void kvb__tl_terminal(kvb__tl_t *tl, int status, int was, const char *reason)
{
    char d[KVB_TIMELINE_DETAIL];
    if (tl == NULL || __atomic_exchange_n(&tl->ended, 1, __ATOMIC_RELAXED))
        return;
    bool ok = status == KVB_POLL_SUCCESS;
    kvb__reason_t cls = kvb__reason_class(reason);
    if (ok)
        snprintf(d, sizeof(d), "success");
    else
        snprintf(d, sizeof(d), "%s in %s: %s", kvb__reason_name(cls),
                 was < 0 ? "Created" : kvb_poll_string((kvb_poll_t)was),
                 reason != NULL ? reason : "");
    kvb__tl_add(tl, KVB_EV_TERMINAL, status, d);
    kvb__m_sub(KVB__M_ROOMS_IN_FLIGHT, kvb__m_role(tl->role, 0, 1), 1);
    kvb__m_add(KVB__M_ROOMS_ENDED,
               kvb__m_role(tl->role, ok ? KVB__M_SUCCESS : KVB__M_FAIL, KVB__M_ROOM_OUTCOMES), 1);
    if (!ok)
        kvb__m_add(KVB__M_ROOMS_FAILED, kvb__m_role(tl->role, cls, KVB__R_COUNT), 1);
    else
        observe_stages(tl, __atomic_load_n(&tl->last[KVB_EV_TERMINAL], __ATOMIC_RELAXED));
}

void kvb__tl_fence(kvb__tl_t *tl, bool hold, const char *reason, bool unsafe)
{
    size_t slot;
    if (tl == NULL)
        return;
    slot = kvb__m_role(tl->role, 0, 1);
    int from = hold ? 0 : 1; /* never held -> held -> released, each once */
    if (!__atomic_compare_exchange_n(&tl->holding, &from, hold ? 1 : 2, false, __ATOMIC_RELAXED,
                                     __ATOMIC_RELAXED))
        return;
    if (hold) {
        kvb__m_add(KVB__M_FENCE_HOLDS, slot, 1);
        kvb__m_add(KVB__M_FENCE_HOLDS_TOTAL, slot, 1);
        kvb__tl_add(tl, KVB_EV_FENCE_HOLD, 0, reason);
        return;
    }
    kvb__m_sub(KVB__M_FENCE_HOLDS, slot, 1);
    kvb__tl_add(tl, KVB_EV_FENCE_RELEASE, unsafe, reason);
}

void kvb__tl_room_gone(kvb__tl_t *tl)
{
    if (tl == NULL)
        return;
    if (!__atomic_exchange_n(&tl->ended, 1, __ATOMIC_RELAXED))
        kvb__m_sub(KVB__M_ROOMS_IN_FLIGHT, kvb__m_role(tl->role, 0, 1), 1);
    int held = 1;
    if (__atomic_compare_exchange_n(&tl->holding, &held, 2, false, __ATOMIC_RELAXED,
                                    __ATOMIC_RELAXED))
        kvb__m_sub(KVB__M_FENCE_HOLDS, kvb__m_role(tl->role, 0, 1), 1);
}

/* Copy record index i of tl into *e; false: being written or overwritten. */
static bool copy_rec(const kvb__tl_t *tl, uint32_t i, kvb_timeline_event_t *e)
{
    const kvb__tl_rec_t *r = &tl->rec[slot_of(i)];
    uint64_t w[KVB__TL_WORDS];
    kvb__tl_payload_t c;
    if (__atomic_load_n(&r->seq, __ATOMIC_ACQUIRE) != i + 1)
        return false;
    /* acquire loads: the seq's second read cannot move before them */
    for (size_t k = 0; k < KVB__TL_WORDS; k++)
        w[k] = __atomic_load_n(&r->w[k], __ATOMIC_ACQUIRE);
    if (__atomic_load_n(&r->seq, __ATOMIC_RELAXED) != i + 1)
        return false;
    memcpy(&c, w, sizeof(c));
    e->event = (kvb_event_t)c.event;
    e->t_s = (double)c.t_ns / 1e9;
    e->value = c.value;
    memcpy(e->detail, c.detail, sizeof(e->detail));
    e->detail[sizeof(e->detail) - 1] = '\0';
    return true;
}

kvb_status_t kvb__tl_snapshot(kvb__tl_t *tl, uint64_t room, kvb_timeline_t **tl_p)
{
    kvb_timeline_t *t = calloc(1, sizeof(*t));
    if (t == NULL)
        return KVB_ERR_NOMEM;
    t->room = room;
    if (tl == NULL) {
        *tl_p = t;
        return KVB_OK;
    }
    t->events = calloc(KVB_TIMELINE_SLOTS, sizeof(*t->events));
    if (t->events == NULL) {
        free(t);
        return KVB_ERR_NOMEM;
    }
    uint32_t n = __atomic_load_n(&tl->next, __ATOMIC_ACQUIRE);
    t->age_s = (double)(kvb__now_ns() - tl->t0_ns) / 1e9;
    uint32_t head = n < KVB_TIMELINE_HEAD ? n : KVB_TIMELINE_HEAD;
    uint32_t tail = n > KVB_TIMELINE_HEAD + RING ? n - RING : KVB_TIMELINE_HEAD;
    for (uint32_t i = 0; i < head; i++)
        t->n += copy_rec(tl, i, &t->events[t->n]);
    for (uint32_t i = tail; i < n; i++)
        t->n += copy_rec(tl, i, &t->events[t->n]);
    t->dropped = n - t->n; /* past the ring, dropped by a busy record, or being written */
    *tl_p = t;
    return KVB_OK;
}

void kvb_timeline_free(kvb_timeline_t *t)
{
    if (t == NULL)
        return;
    free(t->events);
    free(t);
}
