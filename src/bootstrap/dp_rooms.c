/* room -> dp_rank table (see dp_rooms.h). Linear probing at a load of at
 * most 1/2; expired entries are dropped when the table is rebuilt (growth, or
 * the cap reached), so it holds at most max occupied slots and 4 x max slots
 * in all. */
#include "bootstrap/dp_rooms.h"

#include <stdlib.h>
#include <string.h>

#define MIN_CAP 64

void kvb__dp_rooms_init(kvb__dp_rooms_t *t, size_t max, double ttl_s)
{
    memset(t, 0, sizeof(*t));
    t->max = max;
    t->ttl_ns = (uint64_t)(ttl_s * 1e9);
}

void kvb__dp_rooms_destroy(kvb__dp_rooms_t *t)
{
    free(t->slots);
    memset(t, 0, sizeof(*t));
}

static size_t hash_room(uint64_t room)
{
    room ^= room >> 33;
    room *= 0xff51afd7ed558ccdULL;
    room ^= room >> 33;
    return (size_t)room;
}

static bool live(const kvb__dp_rooms_t *t, const kvb__dp_slot_t *s, uint64_t now_ns)
{
    return s->t_ns != 0 && now_ns - s->t_ns < t->ttl_ns;
}

/* Slot holding room, or the empty slot where it would go. */
static kvb__dp_slot_t *probe(kvb__dp_slot_t *slots, size_t cap, uint64_t room)
{
    size_t i = hash_room(room) & (cap - 1);
    while (slots[i].t_ns != 0 && slots[i].room != room)
        i = (i + 1) & (cap - 1);
    return &slots[i];
}

/* Rebuild into cap slots keeping only live entries. */
static kvb_status_t rebuild(kvb__dp_rooms_t *t, size_t cap, uint64_t now_ns)
{
    kvb__dp_slot_t *n = calloc(cap, sizeof(*n));
    size_t used = 0;
    if (n == NULL)
        return KVB_ERR_NOMEM;
    for (size_t i = 0; i < t->cap; i++) {
        if (!live(t, &t->slots[i], now_ns))
            continue;
        *probe(n, cap, t->slots[i].room) = t->slots[i];
        used++;
    }
    free(t->slots);
    t->slots = n;
    t->cap = cap;
    t->used = used;
    return KVB_OK;
}

/* Slots for n live entries at a load of at most 1/2. */
static size_t cap_for(size_t n)
{
    size_t cap = MIN_CAP;
    while (cap < 2 * n)
        cap *= 2;
    return cap;
}

kvb_status_t kvb__dp_rooms_put(kvb__dp_rooms_t *t, uint64_t room, int32_t dp_rank, uint64_t now_ns)
{
    kvb__dp_slot_t *s;
    if (now_ns == 0)
        now_ns = 1; /* 0 marks an empty slot */
    if (t->cap == 0 && rebuild(t, MIN_CAP, now_ns) != KVB_OK)
        return KVB_ERR_NOMEM;
    s = probe(t->slots, t->cap, room);
    if (s->t_ns == 0 && t->used >= t->max) {
        /* At the cap: drop the expired, at most every ttl/8 (a flood of
         * refused rooms costs no rebuild each). */
        if (now_ns < t->next_sweep_ns)
            return KVB_ERR_STATE;
        t->next_sweep_ns = now_ns + t->ttl_ns / 8;
        if (rebuild(t, t->cap, now_ns) != KVB_OK)
            return KVB_ERR_NOMEM;
        if (t->used >= t->max)
            return KVB_ERR_STATE;
        s = probe(t->slots, t->cap, room);
    }
    if (s->t_ns == 0 && 2 * (t->used + 1) > t->cap) {
        /* Load 1/2: grow, dropping the expired. */
        if (rebuild(t, cap_for(kvb__dp_rooms_live(t, now_ns) + 1), now_ns) != KVB_OK)
            return KVB_ERR_NOMEM;
        s = probe(t->slots, t->cap, room);
    }
    if (s->t_ns == 0)
        t->used++;
    s->room = room;
    s->t_ns = now_ns;
    s->dp_rank = dp_rank;
    return KVB_OK;
}

int32_t kvb__dp_rooms_get(const kvb__dp_rooms_t *t, uint64_t room, uint64_t now_ns)
{
    const kvb__dp_slot_t *s;
    if (t->cap == 0)
        return -1;
    s = probe(t->slots, t->cap, room);
    return live(t, s, now_ns) ? s->dp_rank : -1;
}

size_t kvb__dp_rooms_live(const kvb__dp_rooms_t *t, uint64_t now_ns)
{
    size_t n = 0;
    for (size_t i = 0; i < t->cap; i++)
        n += live(t, &t->slots[i], now_ns);
    return n;
}
