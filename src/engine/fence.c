/* The writer fence, target and writer side, in one place.
 *
 * A target admits a writer's writes by grant: (writer tag, epoch). The
 * target makes up the epoch (kvb_engine_grant_writer, unique per engine and
 * above every epoch of an earlier incarnation), the writer stamps it on every
 * write of the transfers made for that grant, and the target refuses a write
 * whose grant is not live. A revoked grant is never admitted again: new work
 * gets a new grant. Revoking is a barrier, not a flag: the target then waits
 * for the writes that passed the check before the revoke (message-lane
 * receives being placed, direct-lane units being copied) and says whether it
 * saw them all end (kvb_engine_revoke_writer).
 *
 * Message lane: am_write checks the grant and counts the receive in
 * grant->am_busy (seg_mu) until its bytes are placed.
 * Direct lane: the grants live in slots of the shared fence page; a writer
 * copy thread, per unit, raises the slot's busy count, re-reads the slot,
 * copies, drains its streaming stores and lowers the count (Dekker: the
 * target stores "revoked" and then reads busy, the writer raises busy and
 * then reads the state, both sequentially consistent, so one of them sees
 * the other). A slot is freed only when its busy count is zero, and epochs
 * are never reused, so a writer holding a stale slot index sees a mismatch.
 * Only writers change the busy count (raise, and lower what they raised);
 * the target never overwrites it (slot_drained).
 *
 * Epoch 0 is the legacy, tag-only fence (kvb_engine_fence_writer): a list of
 * refused tags, also published in the page (seqlock). The rule in short, the
 * state and the primitives: fence.h. */
#include "engine/fence.h"
#include "core/metrics.h"

#include "engine/engine_int.h"

#include <errno.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define FENCE_TAGS 1020 /* legacy fenced tags the page lists */
#define FENCE_SLOTS 896 /* grants the page lists (more: message lane only) */
#define MAX_GRANTS 4096 /* live + draining grants per engine */
#define SLOT_FREE 0u
#define SLOT_LIVE 1u
#define SLOT_REVOKED 2u

typedef struct fence_slot {
    uint64_t epoch; /* target */
    uint32_t tag;   /* target */
    uint32_t state; /* target: SLOT_* */
    uint32_t busy;  /* writers: units past the check, not yet drained */
    int32_t pid;    /* writers: the last writer process that raised busy */
    uint64_t pad;
} fence_slot_t;

typedef struct fence_page {
    uint32_t seq; /* legacy tags: odd while the target rewrites them */
    uint32_t count;
    uint32_t overflow; /* more legacy tags fenced than the page holds */
    uint32_t pad;
    uint32_t tags[FENCE_TAGS];
    fence_slot_t slots[FENCE_SLOTS];
} fence_page_t;

_Static_assert(sizeof(fence_page_t) == KVB_HS_FENCE_FILE - KVB_SHM_TRAILER, "fence page size");

void kvb__fence_init(kvb_engine_h eng)
{
    /* Grants start at the wall clock in ns: a restarted target never grants
     * an epoch a writer may still hold from its previous incarnation. */
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    eng->fence.last_epoch = (uint64_t)now.tv_sec * 1000000000ull + (uint64_t)now.tv_nsec;
}

void kvb__fence_free(kvb_engine_h eng)
{
    /* Emptied, not only freed: UCX may still complete a read answer sent
     * straight out of the registrations while the worker is destroyed
     * after this, and its end looks its grant up (kvb__fence_done). */
    free(eng->fence.fenced);
    free(eng->fence.grants);
    eng->fence.fenced = NULL;
    eng->fence.grants = NULL;
    eng->fence.n_fenced = eng->fence.n_grants = eng->fence.cap_fenced = eng->fence.cap_grants = 0;
    if (eng->fence.base != NULL)
        kvb__shm_destroy(eng->fence.base, &eng->fence.ref);
}

/* ---- target side ---- */

/* seg_mu held. */
void kvb__fence_page_sync(kvb_engine_h eng)
{
    fence_page_t *f = (fence_page_t *)eng->fence.base;
    if (f == NULL)
        return;
    uint32_t s = __atomic_load_n(&f->seq, __ATOMIC_RELAXED);
    size_t n = eng->fence.n_fenced < FENCE_TAGS ? eng->fence.n_fenced : FENCE_TAGS;
    /* Seqlock: odd while rewriting. Release stores keep every data store
     * after the odd sequence number for a reader that sees it. */
    __atomic_store_n(&f->seq, s + 1, __ATOMIC_RELAXED);
    for (size_t i = 0; i < n; i++)
        __atomic_store_n(&f->tags[i], eng->fence.fenced[i], __ATOMIC_RELEASE);
    __atomic_store_n(&f->count, (uint32_t)n, __ATOMIC_RELEASE);
    __atomic_store_n(&f->overflow, eng->fence.n_fenced > FENCE_TAGS, __ATOMIC_RELEASE);
    __atomic_store_n(&f->seq, s + 2, __ATOMIC_RELEASE);
}

/* seg_mu held. Grants made before the page existed get their slots now. */
kvb_status_t kvb__fence_page_ensure(kvb_engine_h eng)
{
    if (eng->fence.base != NULL)
        return KVB_OK;
    kvb_status_t st = kvb__shm_create(sizeof(fence_page_t), &eng->fence.base, &eng->fence.ref);
    if (st != KVB_OK)
        return st;
    kvb__fence_page_sync(eng);
    fence_page_t *f = (fence_page_t *)eng->fence.base;
    for (size_t i = 0, k = 0; i < eng->fence.n_grants && k < FENCE_SLOTS; i++) {
        kvb__grant_t *g = &eng->fence.grants[i];
        if (!g->live)
            continue;
        f->slots[k] = (fence_slot_t){g->epoch, g->tag, SLOT_LIVE, 0, 0, 0};
        g->slot = (int32_t)k++;
    }
    return KVB_OK;
}

static void legacy_set(kvb_engine_h eng, uint32_t tag, int fenced)
{
    size_t i = 0;
    while (i < eng->fence.n_fenced && eng->fence.fenced[i] != tag)
        i++;
    if (!fenced && i < eng->fence.n_fenced) {
        eng->fence.fenced[i] = eng->fence.fenced[--eng->fence.n_fenced];
    } else if (fenced && i == eng->fence.n_fenced) {
        if (eng->fence.n_fenced == eng->fence.cap_fenced) {
            size_t cap = eng->fence.cap_fenced ? eng->fence.cap_fenced * 2 : 8;
            uint32_t *v = realloc(eng->fence.fenced, cap * sizeof(*v));
            if (v != NULL) {
                eng->fence.fenced = v;
                eng->fence.cap_fenced = cap;
            }
        }
        if (eng->fence.n_fenced < eng->fence.cap_fenced)
            eng->fence.fenced[eng->fence.n_fenced++] = tag;
    }
}

void kvb_engine_fence_writer(kvb_engine_h eng, uint32_t tag, int fenced)
{
    if (eng == NULL || tag == 0)
        return;
    pthread_mutex_lock(&eng->seg_mu);
    legacy_set(eng, tag, fenced);
    kvb__fence_page_sync(eng); /* direct-lane writers read it */
    pthread_mutex_unlock(&eng->seg_mu);
}

static kvb__grant_t *grant_find(kvb_engine_h eng, uint32_t tag, uint64_t epoch)
{
    for (size_t i = 0; i < eng->fence.n_grants; i++)
        if (eng->fence.grants[i].epoch == epoch && eng->fence.grants[i].tag == tag)
            return &eng->fence.grants[i];
    return NULL;
}

static int32_t slot_take(kvb_engine_h eng, uint32_t tag, uint64_t epoch)
{
    fence_page_t *f = (fence_page_t *)eng->fence.base;
    for (int32_t k = 0; f != NULL && k < FENCE_SLOTS; k++) {
        fence_slot_t *s = &f->slots[k];
        if (__atomic_load_n(&s->state, __ATOMIC_SEQ_CST) != SLOT_FREE)
            continue;
        __atomic_store_n(&s->epoch, epoch, __ATOMIC_RELAXED);
        __atomic_store_n(&s->tag, tag, __ATOMIC_RELAXED);
        __atomic_store_n(&s->state, SLOT_LIVE, __ATOMIC_SEQ_CST);
        return k;
    }
    return -1;
}

static bool revoke_step(kvb_engine_h eng, kvb__grant_t *g);

/* Drop revoked grants that drained since (nobody may call revoke on them
 * again, e.g. a manager destroyed meanwhile). seg_mu held. */
static void sweep_drained(kvb_engine_h eng)
{
    for (size_t i = eng->fence.n_grants; i-- > 0;)
        if (!eng->fence.grants[i].live)
            revoke_step(eng, &eng->fence.grants[i]);
}

kvb_status_t kvb_engine_grant_writer(kvb_engine_h eng, uint32_t tag, uint64_t *epoch_p)
{
    kvb_status_t st = KVB_OK;
    if (eng == NULL || tag == 0 || epoch_p == NULL)
        return KVB_ERR_INVALID;
    pthread_mutex_lock(&eng->seg_mu);
    sweep_drained(eng);
    if (eng->fence.n_grants == MAX_GRANTS) {
        st = kvb__err_set(&eng->err, KVB_ERR_NOMEM,
                          "%d writer grants live or draining: revoke some first", MAX_GRANTS);
    } else if (eng->fence.n_grants == eng->fence.cap_grants) {
        size_t cap = eng->fence.cap_grants ? eng->fence.cap_grants * 2 : 16;
        kvb__grant_t *v = realloc(eng->fence.grants, cap * sizeof(*v));
        if (v == NULL)
            st = KVB_ERR_NOMEM;
        else
            eng->fence.grants = v, eng->fence.cap_grants = cap;
    }
    if (st == KVB_OK) {
        uint64_t e = ++eng->fence.last_epoch;
        eng->fence.grants[eng->fence.n_grants++] =
            (kvb__grant_t){tag, 1, 0, e, slot_take(eng, tag, e), 0};
        *epoch_p = e;
        kvb__m_add(KVB__M_FENCE_GRANTS_TOTAL, 0, 1);
    }
    pthread_mutex_unlock(&eng->seg_mu);
    return st;
}

/* A busy count this high is no count of units in flight: a counted change
 * was lost (a writer decremented past zero). */
#define BUSY_CORRUPT 0x80000000u

/* Has g's slot drained: no direct-lane unit of it between a writer's check
 * and its store fence? seg_mu held, g revoked (its slot no longer LIVE).
 * The busy count is the writers': the target never stores it blindly, so
 * no counted change is lost. A writer that raised it just now against a
 * revoked or reused slot sees the state change and lowers it again itself,
 * so a slot freed while such a stale raise is pending stays balanced. The
 * one reset: the last writer process that raised it no longer exists (its
 * mapping went with it, it copies nothing), and then only the value read,
 * by compare-and-swap, so a raise in between keeps the slot busy. A count
 * at or above 2^31 is corrupt: unsafe, never drained (logged once). */
static bool slot_drained(kvb_engine_h eng, kvb__grant_t *g)
{
    fence_page_t *f = (fence_page_t *)eng->fence.base;
    if (f == NULL || g->slot < 0)
        return true;
    fence_slot_t *s = &f->slots[g->slot];
    uint32_t busy = __atomic_load_n(&s->busy, __ATOMIC_SEQ_CST);
    if (busy == 0)
        return true;
    if (busy >= BUSY_CORRUPT) {
        if (!g->corrupt)
            KVB_LOGE("engine %s: fence slot %d of writer %08x epoch %llu has a corrupt busy count "
                     "(%u): a counted enter or exit was lost; the grant is kept revoked and "
                     "never reported drained",
                     eng->sid, (int)g->slot, (unsigned)g->tag, (unsigned long long)g->epoch, busy);
        g->corrupt = 1;
        return false;
    }
    int32_t pid = __atomic_load_n(&s->pid, __ATOMIC_RELAXED);
    if (pid > 0 && pid != getpid() && kill(pid, 0) != 0 && errno == ESRCH)
        return __atomic_compare_exchange_n(&s->busy, &busy, 0, false, __ATOMIC_SEQ_CST,
                                           __ATOMIC_SEQ_CST);
    return false;
}

/* Revoke g (if live) and drop it once nothing of it is in flight. Returns
 * true when it is gone (quiescent). seg_mu held. */
static bool revoke_step(kvb_engine_h eng, kvb__grant_t *g)
{
    fence_page_t *f = (fence_page_t *)eng->fence.base;
    if (g->live) {
        g->live = 0;
        kvb__m_add(KVB__M_FENCE_REVOKES_TOTAL, 0, 1);
        if (f != NULL && g->slot >= 0)
            __atomic_store_n(&f->slots[g->slot].state, SLOT_REVOKED, __ATOMIC_SEQ_CST);
    }
    if (g->am_busy > 0 || !slot_drained(eng, g))
        return false;
    if (f != NULL && g->slot >= 0)
        __atomic_store_n(&f->slots[g->slot].state, SLOT_FREE, __ATOMIC_SEQ_CST);
    *g = eng->fence.grants[--eng->fence.n_grants];
    return true;
}

kvb_status_t kvb_engine_revoke_writer(kvb_engine_h eng, uint32_t tag, uint64_t epoch, double wait_s)
{
    if (eng == NULL || tag == 0 || epoch == 0)
        return KVB_ERR_INVALID;
    uint64_t deadline = kvb__now_ns() + (uint64_t)(wait_s > 0 ? wait_s * 1e9 : 0);
    for (;;) {
        pthread_mutex_lock(&eng->seg_mu);
        kvb__grant_t *g = grant_find(eng, tag, epoch);
        bool done = g == NULL || revoke_step(eng, g);
        pthread_mutex_unlock(&eng->seg_mu);
        if (done)
            return KVB_OK;
        if (kvb__now_ns() >= deadline) {
            if (wait_s > 0) /* a wait of 0 only asks (each poll of a held room) */
                kvb__m_add(KVB__M_FENCE_REVOKE_TIMEOUTS_TOTAL, 0, 1);
            return KVB_ERR_INPROGRESS;
        }
        usleep(500);
    }
}

/* Message lane: admit one write of (tag, epoch) and count it until placed.
 * NULL when admitted, else the reason it is refused. Progress thread. */
const char *kvb__fence_admit(kvb_engine_h eng, uint32_t tag, uint64_t epoch)
{
    const char *why = NULL;
    if (tag == 0 && epoch == 0)
        return NULL;
    pthread_mutex_lock(&eng->seg_mu);
    if (epoch == 0) {
        for (size_t i = 0; i < eng->fence.n_fenced && why == NULL; i++)
            if (eng->fence.fenced[i] == tag)
                why = "writer fenced: the destination declared this writer lost";
    } else {
        kvb__grant_t *g = grant_find(eng, tag, epoch);
        if (g == NULL || !g->live)
            why = "writer fenced: the destination revoked this writer's grant (declared it "
                  "lost or ended its rooms)";
        else
            g->am_busy++;
    }
    pthread_mutex_unlock(&eng->seg_mu);
    if (why != NULL)
        kvb__m_add(KVB__M_FENCE_REFUSED_TOTAL, 0, 1);
    return why;
}

/* Message lane: admit one read request as a write of (tag, epoch), except
 * that an engine with reads_need_grant serves none without a grant. */
const char *kvb__fence_admit_read(kvb_engine_h eng, uint32_t tag, uint64_t epoch)
{
    if (epoch == 0 && eng->params.reads_need_grant)
        return "this engine serves reads only under a live grant (reads_need_grant; "
               "KVBRIDGE_READS_NEED_GRANT): a read at epoch 0 is refused";
    return kvb__fence_admit(eng, tag, epoch);
}

/* The admitted write's bytes are placed (or it failed). */
void kvb__fence_done(kvb_engine_h eng, uint32_t tag, uint64_t epoch)
{
    if (epoch == 0)
        return;
    pthread_mutex_lock(&eng->seg_mu);
    kvb__grant_t *g = grant_find(eng, tag, epoch);
    if (g != NULL && g->am_busy > 0)
        g->am_busy--;
    pthread_mutex_unlock(&eng->seg_mu);
}

/* ---- writer side (direct lane) ---- */

static fence_state_t legacy_state(const fence_page_t *f, uint32_t tag)
{
    for (int tries = 0; tries < 1000; tries++) {
        uint32_t s1 = __atomic_load_n(&f->seq, __ATOMIC_ACQUIRE), hit = 0;
        if (s1 & 1) {
            sched_yield();
            continue;
        }
        /* Acquire loads: the second sequence read cannot move before them. */
        uint32_t n = __atomic_load_n(&f->count, __ATOMIC_ACQUIRE);
        uint32_t ov = __atomic_load_n(&f->overflow, __ATOMIC_ACQUIRE);
        for (uint32_t i = 0; i < n && i < FENCE_TAGS; i++)
            hit |= __atomic_load_n(&f->tags[i], __ATOMIC_ACQUIRE) == tag;
        if (__atomic_load_n(&f->seq, __ATOMIC_RELAXED) == s1)
            return hit ? FENCE_YES : ov ? FENCE_UNKNOWN : FENCE_NO;
    }
    return FENCE_UNKNOWN;
}

static bool slot_is(const fence_slot_t *s, uint32_t tag, uint64_t epoch, uint32_t state)
{
    return __atomic_load_n(&s->state, __ATOMIC_SEQ_CST) == state &&
           __atomic_load_n(&s->tag, __ATOMIC_RELAXED) == tag &&
           __atomic_load_n(&s->epoch, __ATOMIC_RELAXED) == epoch;
}

/* The slot holding (tag, epoch), live or revoked, or -1. */
static int32_t slot_find(const fence_page_t *f, uint32_t tag, uint64_t epoch, fence_state_t *fs)
{
    for (int32_t k = 0; k < FENCE_SLOTS; k++) {
        if (slot_is(&f->slots[k], tag, epoch, SLOT_LIVE)) {
            *fs = FENCE_NO;
            return k;
        }
        if (slot_is(&f->slots[k], tag, epoch, SLOT_REVOKED)) {
            *fs = FENCE_YES;
            return k;
        }
    }
    *fs = FENCE_UNKNOWN; /* never listed (page full) or revoked and drained */
    return -1;
}

fence_state_t kvb__fence_check(const kvb__conn_t *c, uint32_t tag, uint64_t epoch)
{
    const fence_page_t *f = (const fence_page_t *)c->fence;
    fence_state_t fs;
    if (epoch == 0)
        return tag == 0 ? FENCE_NO : legacy_state(f, tag);
    slot_find(f, tag, epoch, &fs);
    return fs;
}

fence_state_t kvb__fence_enter(const kvb__conn_t *c, uint32_t tag, uint64_t epoch, int32_t *slot_p)
{
    fence_page_t *f = (fence_page_t *)c->fence;
    fence_state_t fs;
    *slot_p = -1;
    if (epoch == 0)
        return kvb__fence_check(c, tag, epoch);
    int32_t k = slot_find(f, tag, epoch, &fs);
    if (k < 0 || fs != FENCE_NO)
        return fs;
    fence_slot_t *s = &f->slots[k];
    __atomic_store_n(&s->pid, (int32_t)getpid(), __ATOMIC_RELAXED);
    __atomic_fetch_add(&s->busy, 1, __ATOMIC_SEQ_CST);
    if (!slot_is(s, tag, epoch, SLOT_LIVE)) {
        __atomic_fetch_sub(&s->busy, 1, __ATOMIC_SEQ_CST);
        return FENCE_YES;
    }
    *slot_p = k;
    return FENCE_NO;
}

void kvb__fence_exit(const kvb__conn_t *c, int32_t slot)
{
    fence_page_t *f = (fence_page_t *)c->fence;
    if (slot >= 0)
        __atomic_fetch_sub(&f->slots[slot].busy, 1, __ATOMIC_RELEASE);
}

uint32_t kvb__fence_busy_raw(kvb_engine_h eng, int32_t k)
{
    fence_page_t *f = (fence_page_t *)eng->fence.base;
    if (f == NULL || k < 0 || k >= FENCE_SLOTS)
        return 0;
    return __atomic_load_n(&f->slots[k].busy, __ATOMIC_SEQ_CST);
}
