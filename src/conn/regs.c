/* Prefill side: the table of decode registrations (KV args), whatever
 * dialect they came in. Bounded (KVBRIDGE_MAX_REGISTRATIONS,
 * KVBRIDGE_MAX_REGISTRATIONS_BYTES); a registration in use is never
 * evicted (reg_victim). Reference-counted: a worker's job holds one while
 * it plans and writes. reg_mu guards the list; refs, used_ms and failed are
 * atomics. */
#include "dialect/dialect.h"

#include <stdlib.h>
#include <string.h>

uint64_t kvb__now_ms(void)
{
    return (uint64_t)(kvb__now_s() * 1000.0) + 1; /* never 0 */
}

void kvb__reg_put(kvb__reg_t *g)
{
    if (g == NULL || __atomic_sub_fetch(&g->refs, 1, __ATOMIC_ACQ_REL) != 0)
        return;
    kvb_plan_destroy(g->plan);
    if (g->priv != NULL)
        g->dialect->reg_free(g->priv);
    free(g->plan_error);
    free(g->kv_ptrs);
    free(g->aux_ptrs);
    free(g->state_ptrs);
    free(g);
}

kvb__reg_t *kvb__reg_get(struct kvb_manager *m, const char *session)
{
    kvb__reg_t *g;
    pthread_rwlock_rdlock(&m->reg_mu);
    for (g = m->regs; g != NULL; g = g->next)
        if (strcmp(g->session, session) == 0)
            break;
    if (g != NULL) {
        __atomic_add_fetch(&g->refs, 1, __ATOMIC_RELAXED);
        __atomic_store_n(&g->used_ms, kvb__now_ms(), __ATOMIC_RELAXED);
    }
    pthread_rwlock_unlock(&m->reg_mu);
    return g;
}

/* A transfer info names the session: its registration is in use for the
 * room TTL from now (the longest a room waits), as when a chunk is planned. */
void kvb__reg_touch(struct kvb_manager *m, const char *session)
{
    pthread_rwlock_rdlock(&m->reg_mu);
    for (kvb__reg_t *g = m->regs; g != NULL; g = g->next)
        if (strcmp(g->session, session) == 0) {
            __atomic_store_n(&g->used_ms, kvb__now_ms(), __ATOMIC_RELAXED);
            break;
        }
    pthread_rwlock_unlock(&m->reg_mu);
}

/* Both came from the same claimed peer: CURVE key and control endpoint. */
static bool reg_same_peer(const kvb__reg_t *a, const kvb__reg_t *b)
{
    return a->port == b->port && strcmp(a->ip, b->ip) == 0 && strcmp(a->peer_id, b->peer_id) == 0;
}

/* A registration to drop so the newcomer nc fits (reg_mu held for
 * writing), in this order: one whose decode failed; the oldest of nc's own
 * claimed peer that no transfer info named yet (a peer's flood displaces
 * its own); the oldest no transfer info named within
 * KVBRIDGE_REGISTRATION_GRACE of its arrival (a decode registers when it
 * resolves its route, and its first transfer info may come much later: a
 * newer bogus session must not displace it meanwhile); the longest idle
 * past the room TTL. In use, never dropped: a job holds it, or a transfer
 * info or chunk named it within the room TTL (the longest a room waits).
 * NULL: refuse the newcomer. */
static kvb__reg_t **reg_victim(struct kvb_manager *m, const kvb__reg_t *nc)
{
    kvb__reg_t **best[4] = {NULL, NULL, NULL, NULL};
    uint64_t now = kvb__now_ms(), ttl = (uint64_t)(m->p.room_ttl_s * 1000);
    for (kvb__reg_t **pp = &m->regs; *pp != NULL; pp = &(*pp)->next) {
        kvb__reg_t *g = *pp;
        uint64_t used = __atomic_load_n(&g->used_ms, __ATOMIC_RELAXED);
        if (__atomic_load_n(&g->refs, __ATOMIC_ACQUIRE) != 1)
            continue; /* a room's job holds it */
        if (__atomic_load_n(&g->failed, __ATOMIC_ACQUIRE))
            return pp;
        if (used == 0 && reg_same_peer(g, nc) &&
            (best[1] == NULL || g->registered_ms < (*best[1])->registered_ms))
            best[1] = pp;
        if (used == 0 && now - g->registered_ms > m->reg_grace_ms &&
            (best[2] == NULL || g->registered_ms < (*best[2])->registered_ms))
            best[2] = pp;
        if (used != 0 && now - used > ttl &&
            (best[3] == NULL || used < __atomic_load_n(&(*best[3])->used_ms, __ATOMIC_RELAXED)))
            best[3] = pp;
    }
    return best[1] != NULL ? best[1] : best[2] != NULL ? best[2] : best[3];
}

/* Unlink the registration at pp (reg_mu held for writing). */
static kvb__reg_t *reg_unlink(struct kvb_manager *m, kvb__reg_t **pp)
{
    kvb__reg_t *g = *pp;
    *pp = g->next;
    m->n_regs--;
    kvb__m_sub(KVB__M_REGISTRATIONS, kvb__m_role(KVB_MODE_PREFILL, 0, 1), 1);
    m->reg_bytes -= g->bytes;
    return g;
}

/* Drop victims (reg_victim's order) until g fits the count and byte caps;
 * false when only registrations in use are left. */
static bool reg_make_room(struct kvb_manager *m, const kvb__reg_t *g)
{
    while (m->n_regs >= m->max_regs || m->reg_bytes + g->bytes > m->max_regs_bytes) {
        kvb__reg_t **pp = reg_victim(m, g);
        if (pp == NULL)
            return false;
        m->regs_evicted++;
        kvb__reg_put(reg_unlink(m, pp)); /* refs 1: frees only memory */
    }
    return true;
}

/* Put g in the table, replacing the session's earlier record, which only
 * the same CURVE identity may do (KVB__REG_IMPOSTOR otherwise). KVB__REG_TOO_BIG /
 * KVB__REG_FULL: the byte / count caps cannot be met without dropping a
 * registration in use. *old_p: what to release. */
kvb__reg_ins_t kvb__reg_insert(struct kvb_manager *m, kvb__reg_t *g, kvb__reg_t **old_p)
{
    kvb__reg_t **pp = &m->regs;
    *old_p = NULL;
    while (*pp != NULL && strcmp((*pp)->session, g->session) != 0)
        pp = &(*pp)->next;
    if (*pp != NULL && strcmp((*pp)->peer_id, g->peer_id) != 0) {
        m->regs_impostor++;
        return KVB__REG_IMPOSTOR; /* another CURVE identity: never redirect its rooms */
    }
    if (*pp != NULL) { /* a re-registration: in use as the record it replaces */
        *old_p = reg_unlink(m, pp);
        g->used_ms = __atomic_load_n(&(*old_p)->used_ms, __ATOMIC_RELAXED);
    }
    if (!reg_make_room(m, g)) {
        bool bytes = m->reg_bytes + g->bytes > m->max_regs_bytes;
        if (bytes)
            m->regs_too_big++;
        else
            m->regs_refused++;
        return bytes ? KVB__REG_TOO_BIG
                     : KVB__REG_FULL; /* *old_p is dropped too: it was replaced */
    }
    g->next = m->regs;
    m->regs = g;
    m->n_regs++;
    kvb__m_add(KVB__M_REGISTRATIONS, kvb__m_role(KVB_MODE_PREFILL, 0, 1), 1);
    m->reg_bytes += g->bytes;
    return KVB__REG_OK;
}
