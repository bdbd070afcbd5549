/* A room's timeline (docs/observe.md): monotonic stamps of its events in a
 * fixed ring, recorded by any thread without a lock, read as a snapshot.
 * Refcounted: the room and its sender or receiver each hold a reference,
 * so a timeline outlives a room freed before its handle. */
#ifndef KVB_CONN_TIMELINE_H
#define KVB_CONN_TIMELINE_H

#include <kvbridge/conn.h>

#include "core/metrics.h"

/* What a record holds, copied in and out as 64-bit words (atomically, so
 * the seqlock needs no fence: TSan supports none). */
typedef struct kvb__tl_payload {
    int64_t t_ns; /* since the timeline's creation */
    int64_t value;
    char detail[KVB_TIMELINE_DETAIL];
    uint16_t event;
} kvb__tl_payload_t;
#define KVB__TL_WORDS ((sizeof(kvb__tl_payload_t) + 7) / 8)

typedef struct kvb__tl_rec {
    uint32_t seq;  /* atomic: index + 1 once written, 0 while being written */
    uint32_t busy; /* atomic: a writer holds the record (another one drops its event) */
    uint64_t w[KVB__TL_WORDS];
} kvb__tl_rec_t;

typedef struct kvb__tl {
    int refs; /* atomic */
    int role; /* kvb_mode_t */
    uint64_t room;
    uint64_t t0_ns;
    uint32_t next; /* atomic: events claimed so far */
    /* first and last stamp of each event (atomic, ns since t0 + 1; 0: never):
     * the stage histograms' boundaries */
    uint64_t first[KVB_EV_COUNT], last[KVB_EV_COUNT];
    int ended;   /* atomic: the terminal event was counted */
    int holding; /* atomic: a fence hold is counted in the gauge */
    kvb__tl_rec_t rec[KVB_TIMELINE_SLOTS];
} kvb__tl_t;

/* KVBRIDGE_TIMELINE (default 1): 0 turns timelines and room metrics off. */
bool kvb__tl_enabled(void);
/* A new timeline of room (role: kvb_mode_t), one reference; counted as a
 * room in flight. NULL: off, or no memory (the room runs without). */
kvb__tl_t *kvb__tl_new(int role, uint64_t room);
kvb__tl_t *kvb__tl_ref(kvb__tl_t *tl); /* NULL-safe */
void kvb__tl_put(kvb__tl_t *tl);       /* NULL-safe; frees at the last reference */
/* Record ev now (or at t_ns, monotonic, when not 0) with value and detail
 * (NULL: none; truncated). Any thread, no lock; NULL-safe. */
void kvb__tl_add_at(kvb__tl_t *tl, kvb_event_t ev, uint64_t t_ns, int64_t value,
                    const char *detail);
static inline void kvb__tl_add(kvb__tl_t *tl, kvb_event_t ev, int64_t value, const char *detail)
{
    if (tl != NULL)
        kvb__tl_add_at(tl, ev, 0, value, detail);
}
/* detail "ip:port". */
void kvb__tl_add_ep(kvb__tl_t *tl, kvb_event_t ev, int64_t value, const char *ip, uint16_t port);
/* The room ended (status: kvb_poll_t; was: its status before, -1 none;
 * reason: the failure's text or NULL): the terminal event once (a failure's
 * detail "<class> in <stage>: <reason>"), and the rooms' metrics. */
void kvb__tl_terminal(kvb__tl_t *tl, int status, int was, const char *reason);
/* Decode: a failed room is held / released by its writer fence (each once,
 * a release only after a hold; unsafe: released past the abort-ack bound). */
void kvb__tl_fence(kvb__tl_t *tl, bool hold, const char *reason, bool unsafe);
/* The room is freed (it may never have ended: counted out of flight). */
void kvb__tl_room_gone(kvb__tl_t *tl);
/* The reason class of a room's failure text (the seeds' fixed texts). */
kvb__reason_t kvb__reason_class(const char *reason);
/* trace.c (KVBRIDGE_TRACE=path): is a trace file open (opened on the first
 * call)? Append room tl's line, from its final snapshot t. Any thread. */
bool kvb__trace_on(void);
void kvb__trace_room(const kvb__tl_t *tl, const kvb_timeline_t *t);
/* A snapshot (kvb_*_timeline). */
kvb_status_t kvb__tl_snapshot(kvb__tl_t *tl, uint64_t room, kvb_timeline_t **tl_p);

#endif
