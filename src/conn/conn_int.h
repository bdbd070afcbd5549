/* Internal structures of the connector. One mutex per manager (mu) guards
 * the room table and the decode-side caches; the registration table of a
 * prefill manager has its own rwlock; ZeroMQ PUSH sockets each their own
 * mutex (ZeroMQ sockets are not thread-safe). No lock is held across a
 * network call except a PUSH socket's own. */
#ifndef KVB_CONN_INT_H
#define KVB_CONN_INT_H

#include <kvbridge/bootstrap.h>
#include <kvbridge/conn.h>
#include <kvbridge/plan.h>

#include "conn/integrity.h"
#include "conn/timeline.h"
#include "core/core.h"
#include "proto/frames.h"

struct kvb__dialect; /* dialect/dialect.h: the connector sees dialects only through it */

#define KVB_IP_MAX 256
#define KVB_SID_MAX 300
/* Longest params cachepd_contract (a peer's contract has the same cap). */
#define KVB_MANAGER_CONTRACT_MAX (256 << 10)

/* ---- ZeroMQ helpers (zsock.c) ---- */
typedef struct kvb__zpush {
    char endpoint[KVB_IP_MAX + 16];
    void *sock;
    pthread_mutex_t mu;
    int users; /* senders between push_get and the end of their send (cache mu) */
    struct kvb__zpush *next;
} kvb__zpush_t;

/* CURVE keys of a manager (all Z85, NUL-terminated); on = 0: plain TCP. */
typedef struct kvb__zcurve {
    int on;
    char server_secret[41], server_public[41];
    char client_secret[41], client_public[41];
    uint8_t (*allowed)[32]; /* admitted client public keys (binary) */
    size_t n_allowed;
    void *zap_sock; /* ZAP handler (REP on inproc://zeromq.zap.01) */
    pthread_t zap_thr;
    int zap_running, zap_stop;
    uint64_t zap_denied; /* connections refused (atomic) */
} kvb__zcurve_t;

/* Resolve the keys (params, then KVBRIDGE_CURVE_* environment); off when no
 * server key. KVB_ERR_INVALID with the reason in why on a malformed key. */
kvb_status_t kvb__zcurve_init(kvb__zcurve_t *z, const char *server_secret,
                              const char *client_secret, const char *allowed, char *why,
                              size_t whylen);
/* Start the ZAP handler of zctx (before any CURVE socket binds). */
kvb_status_t kvb__zap_start(kvb__zcurve_t *z, void *zctx);
/* Stop it (before zmq_ctx_term) and wipe the keys. */
void kvb__zcurve_free(kvb__zcurve_t *z);

typedef struct kvb__zcache {
    void *zctx;
    const kvb__zcurve_t *curve; /* NULL or off: plain PUSH sockets */
    pthread_mutex_t mu;
    kvb__zpush_t *head;         /* most recently used first */
    size_t n, max;              /* open sockets; cap (KVBRIDGE_MAX_PUSH_SOCKETS) */
    uint64_t evicted;           /* closed least-recently used to make room */
    uint64_t sent, send_failed; /* messages queued / dropped (atomic, any thread) */
} kvb__zcache_t;

void kvb__zcache_init(kvb__zcache_t *c, void *zctx);
void kvb__zcache_free(kvb__zcache_t *c);
void kvb__zcache_stats(kvb__zcache_t *c, uint64_t *open_p, uint64_t *evicted_p);
/* Messages kvb__zsend queued and dropped so far (relaxed atomic reads). */
void kvb__zcache_traffic(kvb__zcache_t *c, uint64_t *sent_p, uint64_t *failed_p);
/* Send a multipart message to tcp://ip:port without blocking; KVB_ERR_PEER
 * when the peer's queue is full or the socket cannot be made. */
kvb_status_t kvb__zsend(kvb__zcache_t *c, const char *ip, uint16_t port,
                        const kvb__frames_buf_t *msg);
/* Receive one multipart message (frames point into msgs[]); returns the frame
 * count, 0 on timeout, -1 on error. Messages with more than max frames are
 * drained and reported as max + 1. */
int kvb__zrecv(void *sock, void *msgs /* zmq_msg_t[max] */, size_t max, int timeout_ms);
/* The sender identity of a received message (zmq_msg_t *): its CURVE client
 * public key in Z85, "" without CURVE. */
void kvb__zpeer_id(void *msg, char *out, size_t len);
/* Bind a PULL socket on tcp://host:* (IPv6 aware); writes the port. */
kvb_status_t kvb__zbind_pull(void *zctx, const char *host, const kvb__zcurve_t *curve,
                             void **sock_p, uint16_t *port_p);
/* "tcp://ip:port", brackets around IPv6. */
void kvb__zendpoint(const char *ip, uint16_t port, char *out, size_t len);

/* ---- the connector's own messages (every dialect decodes into these) ---- */
typedef struct kvb__status_in { /* a room's status from a prefill rank */
    uint64_t room;
    int32_t status; /* KVB_POLL_*: only Success and Failed change anything */
    int32_t prefill_rank;
    const uint8_t *digest; /* a kvbridge prefill's kv_digest= value (a view into the message's
                              frames, integrity.h), or NULL */
    size_t digest_len;
} kvb__status_in_t;

typedef struct kvb__aux_in { /* inline aux data, checked against our aux buffers */
    uint64_t room;
    int32_t buffer_index, aux_index;
    const uint8_t *payload;
    size_t payload_len;
} kvb__aux_in_t;

typedef struct kvb__ack_in { /* a prefill rank's answer to our abort */
    uint64_t room;
    bool has_rank; /* without: sent at once, it confirms nothing */
    int32_t rank;
    bool has_generation; /* must then be our abort's */
    uint64_t generation;
} kvb__ack_in_t;

/* ---- rooms ---- */

/* One destination of a prefill room (a decode rank's transfer info). */
typedef struct kvb__dst {
    char session[KVB_SID_MAX];
    char ip[KVB_IP_MAX];
    uint16_t port;
    int dummy;
    int32_t *pages;
    size_t n_pages;
    int32_t aux_index;
    int64_t prefix_tokens;
    uint8_t *mask; /* n_pages entries or NULL */
    int32_t *state_idx;
    size_t n_state;
    uint64_t epoch;                     /* the decode's writer grant for this room (0: none sent) */
    const struct kvb__dialect *dialect; /* of the transfer info (dialect/dialect.h) */
    /* 2026: pages cover only the suffix after the decode's prefix of
     * skip_pages pages (prefix_tokens / page_size). */
    uint64_t skip_pages;
    void *plan; /* a decode-planning dialect's plan (dialect->plan_free), or NULL */
} kvb__dst_t;

/* A source of a decode room. */
typedef struct kvb__src {
    char ip[KVB_IP_MAX];
    uint16_t port;
    uint32_t tp_rank, pp_rank;
    uint32_t required_dst_info_num;
    int dummy;
    uint64_t epoch; /* our writer grant for this room to this source (0: none delivered:
                       dummy, no "kvbridge" key, TokenSpeed, grant table full) */
    const struct kvb__dialect *dialect; /* of its bootstrap server's answer: what we speak */
    int kvbridge; /* its look-up answer said "kvbridge": it gets our extension frames */
} kvb__src_t;

typedef struct kvb__room {
    uint64_t id;
    struct kvb_manager *mgr; /* whose event fd a change signals */
    int status;              /* kvb_poll_t */
    char *reason;
    double t_start, t_init, t_terminal;
    kvb__tl_t *tl;    /* its timeline (timeline.h; NULL: off), shared with its handle */
    int first_posted; /* prefill: FIRST_WRITE_POSTED recorded */
    int has_handle;
    int aborted;
    struct kvb__room *next;
    /* kvb_manager_changed: place in the manager's list of rooms whose poll
     * answer may have changed since the caller last heard of them (mu);
     * changed = 1 while linked */
    struct kvb__room *cprev, *cnext;
    int changed;
    /* prefill */
    kvb__dst_t *dsts;
    size_t n_dst;
    int32_t required_dst;
    int inflight;      /* chunks queued or being written */
    int last_done;     /* the last chunk settled (Success once inflight is 0) */
    int fail_notified; /* Failed status sent to the destinations */
    int unsettled;     /* a write never ended (review 2, 10): no Failed / ABORT_ACK is sent,
                          each says no write of the room can land */
    int success_due;   /* Success reached, status not sent yet */
    int submitting;    /* a worker is issuing writes for it (abort waits) */
    int dsts_frozen;   /* a chunk was queued: dsts and their arrays are fixed */
    kvb_xfer_h *xfers; /* writes in flight (abort cancels them) */
    size_t n_xfers, cap_xfers;
    char abort_ip[KVB_IP_MAX]; /* decode that asked for the abort (ack target) */
    uint16_t abort_port;
    const struct kvb__dialect *abort_via; /* the abort came as this dialect's abort message:
                                             its send_abort_ack answers, not a status */
    int abort_has_gen;  /* that ABORT carried SGLang 0.5.23's generation: the ACK echoes it */
    uint64_t abort_gen; /* prefill: that generation; decode: the one our ABORT carried (an
                           ACK with another is a late one for an earlier use of the room id) */
    /* decode */
    char *bootstrap_addr;
    kvb__src_t *srcs;
    size_t n_src;
    uint32_t required_responses;
    uint32_t *responded; /* prefill ranks that sent a terminal status */
    size_t n_responded;
    size_t n_success;
    int wire;                        /* prefill: created by a peer's message, no sender yet */
    uint64_t wire_bytes;             /* what it counts against the wire-room byte cap */
    struct kvb__wpeer *wpeer;        /* wire: the peer that named it first */
    struct kvb__room *wprev, *wnext; /* wire: that peer's rooms, oldest first */
    int fence_open;                  /* abort sent to the sources that had not answered */
    int lost;                        /* its prefill instance was declared lost */
    int unsafe;   /* reported Failed past the quarantine bound while a source may still write */
    int reported; /* poll() said Failed: the fence closed or its bound passed */
    /* integrity (integrity.h; mu): prefill, one digest per entry of dsts
     * (n_integ == n_dst once made); decode, one: the sums its sources sent */
    kvb__integ_t *integ;
    size_t n_integ;
    int integ_missing; /* decode: a source's Success came without a digest */
    /* decode, integrity on and a dialect digest in aux asked for
     * (sglang_kv_checksum_aux): the room's pages past its prefix, its aux
     * slot, whether it has state slots (dialect->check_own_digest) */
    int32_t *own_pages;
    size_t n_own_pages;
    int64_t own_aux_slot;
    int own_state;
} kvb__room_t;

/* A peer that named rooms no sender has yet (prefill; rooms.c). */
typedef struct kvb__wpeer {
    char key[KVB_IP_MAX + 48]; /* CURVE key, or the ip:port its frames claim */
    size_t rooms;
    uint64_t bytes;
    kvb__room_t *head, *tail; /* its wire rooms, oldest first */
    struct kvb__wpeer *next;
} kvb__wpeer_t;

/* ---- prefill: decode registrations ---- */
typedef struct kvb__reg {
    char session[KVB_SID_MAX];
    char ip[KVB_IP_MAX];
    uint16_t port;
    uint64_t *kv_ptrs;
    size_t n_kv;
    uint64_t *aux_ptrs;
    size_t n_aux;
    uint64_t *state_ptrs;
    size_t n_state;
    int32_t tp_rank, tp_size;
    int64_t item_len;
    const struct kvb__dialect *dialect; /* its KV args came in */
    char peer_id[41];                   /* CURVE key it came with ("" without CURVE): a replacement
                                           needs the same */
    int has_kv_pool;                    /* it sent "kv_lens=": its destination pages are checked */
    uint64_t kv_pool;                   /* pages in each of its KV buffers (the smallest) */
    kvb_plan_h plan;                    /* NULL when plan_error is set */
    char *plan_error;                   /* why this decode cannot be served */
    void *priv;     /* what its dialect keeps of it (a contract, a route), or NULL: freed by
                       dialect->reg_free */
    uint64_t bytes; /* its pointer arrays (KVBRIDGE_MAX_REGISTRATION[S]_BYTES) */
    int failed;     /* a write to it failed */
    double failed_at;
    uint64_t registered_ms, used_ms; /* monotonic ms; used_ms: last transfer info or chunk
                                        naming it, 0: none yet */
    int refs;
    /* its page size and order ("kv_layout="; page_size 0: unsaid, taken as ours) */
    uint32_t page_size, kv_order;
    uint32_t digest_max; /* highest digest wire version it reads ("kv_digest="; 0: 1) */
    struct kvb__reg *next;
} kvb__reg_t;

/* regs.c: the registration table (reg_mu taken inside). */
typedef enum kvb__reg_ins {
    KVB__REG_OK = 0,
    KVB__REG_FULL,     /* count cap, only registrations in use left */
    KVB__REG_IMPOSTOR, /* the session is registered with another CURVE key */
    KVB__REG_TOO_BIG   /* byte cap, only registrations in use left */
} kvb__reg_ins_t;
/* The session's registration with a reference (release with kvb__reg_put),
 * marked in use now; NULL when none. */
kvb__reg_t *kvb__reg_get(struct kvb_manager *m, const char *session);
void kvb__reg_put(kvb__reg_t *g); /* NULL-safe; frees at the last reference */
/* A transfer info names the session: in use for the room TTL from now. */
void kvb__reg_touch(struct kvb_manager *m, const char *session);
/* Put g in the table (caller holds reg_mu for writing), replacing the
 * session's earlier record, which only the same CURVE identity may do;
 * *old_p: what to release after unlocking. */
kvb__reg_ins_t kvb__reg_insert(struct kvb_manager *m, kvb__reg_t *g, kvb__reg_t **old_p);
/* Monotonic milliseconds, never 0. */
uint64_t kvb__now_ms(void);

/* ---- prefill: chunks and queues ---- */
typedef struct kvb__chunk {
    uint64_t room;
    int32_t *indices;
    size_t n;
    uint64_t first; /* request page index of indices[0] */
    uint64_t total; /* the sender's num_kv_indices */
    int is_last;    /* the request's last pages, all layers: aux, state, then Success */
    int64_t aux_index;
    int32_t *state_idx; /* last chunk: the prefill's state slots, or NULL */
    size_t n_state;
    /* kvb_sender_send_layers: only this rank's target layers [layer_begin,
     * layer_end) of these pages (the draft model's with the piece that ends
     * at the last layer); layer_end 0: every layer */
    uint32_t layer_begin, layer_end;
    struct kvb__chunk *next;
} kvb__chunk_t;

typedef struct kvb__queue {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    kvb__chunk_t *head, *tail;
    size_t len, high_water;
    pthread_t thr;
    struct kvb_manager *mgr;
} kvb__queue_t;

/* ---- decode: caches per bootstrap address ---- */
typedef struct kvb__addr {
    char *addr;
    kvb_bootstrap_client_h client; /* requests (receiver creation) */
    kvb_bootstrap_client_h hb;     /* heartbeats (own keep-alive connection) */
    pthread_mutex_t client_mu;
    int have_info;
    kvb_bootstrap_parallel_info_t info;
    const struct kvb__dialect *dialect; /* the server answered in: the ZeroMQ dialect to its
                                           ranks */
    int32_t cp_size; /* the prefill's attention CP size (seed 001: 1): its status ranks are
                        tp*(pp*cp) + pp*cp + cp; only CP rank 0 sends (spec 7.7) */
    int follow_room; /* 2026 follow_bootstrap_room (seed 001: 1): DP group = room % dp_size;
                        else the group the prefill registered for the room (/query_dp_ranks) */
    kvb_plan_h plan; /* prefill rank 0 layout × this decode rank */
    void *priv;      /* the dialect's own record of the instance (dialect addr_info), or NULL */
    int failures;
    struct kvb__route *routes;
    /* the prefill's page size (2026 parallel info; 0: unsaid) when it differs from
     * ours: only a rank that registered as kvbridge can be told ours */
    int32_t other_page;
    struct kvb__addr *next;
} kvb__addr_t;

typedef struct kvb__route { /* resolved (dp, tp, pp) → endpoint, kv args sent */
    int32_t dp, tp, pp;
    char ip[KVB_IP_MAX];
    uint16_t port;
    int kvbridge; /* the look-up answer said "kvbridge" (kvb__src_t.kvbridge) */
    struct kvb__route *next;
    int resend; /* a room through it failed: the next receiver sends the KV args again */
} kvb__route_t;

struct kvb_manager {
    kvb_mode_t mode;
    kvb_manager_params_t p; /* knobs resolved */
    kvb_kv_args_t args;     /* deep copy */
    uint64_t *kv_ptrs, *kv_lens, *aux_ptrs, *aux_lens, *aux_items, *state_ptrs, *state_lens,
        *state_items;
    kvb_plan_geom_t *state_geom; /* one per state buffer: an item is one row */
    kvb_engine_h engine;
    char *bootstrap_addr;
    char host[KVB_IP_MAX];
    uint16_t port;
    char endpoint[KVB_IP_MAX + 8];
    kvb__err_t err;
    void *zctx, *pull;
    kvb__zcache_t zc;
    kvb__zcurve_t curve;
    char *bootstrap_token; /* NULL: the client's default (KVBRIDGE_BOOTSTRAP_TOKEN) */
    char kv_dtype[KVB_BOOTSTRAP_WORD_MAX + 1]; /* kv_cache_dtype; "" = unknown */
    char *cachepd_contract; /* params cachepd_contract (NUL-terminated copy), or NULL */
    pthread_t ctl_thr, hb_thr;
    int stop;
    /* kvb_manager_traffic counters: relaxed atomics bumped where the
     * traffic happens (no lock: read as a snapshot, not as a consistent set) */
    uint64_t ctl_received, boot_requests, boot_failed, hb_requests, hb_failed;
    /* integrity (integrity.h): relaxed atomics as above */
    uint64_t integ_sent, integ_checked, integ_mismatches, integ_unchecked;
    /* kvb_manager_event_fd: an eventfd written (m->mu held) on every room
     * status change; ev_on says it exists (made on first request) */
    int ev_fd, ev_on;
    /* kvb_manager_changed: rooms changed and not yet returned, oldest first
     * (mu; intrusive through kvb__room_t, so never longer than n_rooms) */
    kvb__room_t *chg_head, *chg_tail;

    pthread_mutex_t mu;
    kvb__room_t **buckets;
    size_t n_buckets, n_rooms;
    uint64_t bad_messages, transfers_failed;
    /* prefill: rooms a peer created by naming them (no sender yet) */
    uint64_t wire_rooms, wire_room_bytes, wire_rooms_refused, wire_rooms_evicted;
    kvb__wpeer_t *wpeers; /* peers holding wire rooms (mu) */
    size_t max_wire_rooms;
    uint64_t max_wire_room_bytes;
    const char *bad_kinds_logged[64]; /* message kinds already logged (mu) */
    const char *notes_logged[16];     /* kvb__conn_note_once's kinds (atomic slots) */

    pthread_cond_t room_cv;

    /* prefill */
    double transfer_timeout_s;
    double session_backoff_s;
    double fence_wait_s;        /* decode: bound on waiting for a revoked grant's writes */
    double abort_ack_timeout_s; /* decode: bound on waiting for sources to confirm an abort */
    pthread_rwlock_t reg_mu;
    kvb__reg_t *regs; /* at most max_regs (KVBRIDGE_MAX_REGISTRATIONS) */
    size_t n_regs, max_regs;
    uint64_t reg_grace_ms; /* KVBRIDGE_REGISTRATION_GRACE: a new one is kept this long */
    uint64_t regs_evicted, regs_refused;
    uint64_t regs_impostor; /* replacements refused: another CURVE key */
    uint64_t reg_bytes, max_reg_bytes, max_regs_bytes, regs_too_big; /* pointer arrays */
    char rx_peer_id[41]; /* control thread: identity of the message in hand */
    kvb__queue_t *queues;
    int n_queues;
    struct kvb__aside *aside; /* chunks moved off a stalled queue (prefill_xfer.c) */
    int32_t prefill_rank;     /* attn_tp_rank * pp_size + pp_rank */
    int is_last_stage;
    pthread_t ref_thr; /* periodic re-registration (prefill_ctl.c) */
    int ref_started;
    char **boot_puts; /* extra PUT /route bodies (dialect boot_put): owned */
    size_t n_boot_puts;

    struct kvb__outputs *outputs;     /* rooms' first tokens (outputs.c) */
    struct kvb__endpoints *endpoints; /* prefill: decode endpoints' dialects (endpoints.c) */

    /* decode */
    kvb__addr_t *addrs;
    int hb_started;                  /* the heartbeat thread runs (join it on stop) */
    uint64_t abort_gen_last;         /* generations of our 2026 ABORTs (mu): 1, 2, ... */
    struct kvb__icheck_pool *icheck; /* integrity on: the check workers (icheck.c), or NULL */
};

struct kvb_sender {
    struct kvb_manager *mgr;
    uint64_t room;
    uint64_t num_kv, cur;
    int64_t aux_index;
    int32_t *state_idx; /* kvb_sender_set_state_indices, for the last chunk */
    size_t n_state;
    int initialized;
    int concluded;
    /* a chunk being sent layer by layer (kvb_sender_send_layers): its
     * pages and the next layer expected; lw_indices NULL: none open */
    int32_t *lw_indices;
    size_t lw_count;
    uint32_t lw_next;
    kvb__tl_t *tl; /* the room's timeline (a reference), or NULL */
};

struct kvb_receiver {
    struct kvb_manager *mgr;
    uint64_t room;
    int concluded;
    kvb__tl_t *tl; /* the room's timeline (a reference), or NULL */
};

/* rooms.c (mgr->mu held by the caller for every function here) */
kvb__room_t *kvb__room_find(struct kvb_manager *m, uint64_t id);
kvb__room_t *kvb__room_get(struct kvb_manager *m, uint64_t id); /* create if absent */
void kvb__room_remove(struct kvb_manager *m, uint64_t id);
/* Prefill: the room peer's message names, created if absent. Within the
 * wire-room caps (count, and bytes plus the message's): at a cap, the oldest
 * room of the peer holding the most is freed first. NULL: the message alone
 * passes the byte cap, or no memory (counted). */
kvb__room_t *kvb__room_wire_admit(struct kvb_manager *m, uint64_t id, uint64_t bytes,
                                  const char *peer);
/* A sender took the room (or it is freed): it no longer counts as a peer's. */
void kvb__room_unwire(struct kvb_manager *m, kvb__room_t *r);
/* The seeds' update rule, with Failed sticky. */
void kvb__room_set_status(kvb__room_t *r, int status);
/* Record the failure reason (the first one wins) and set Failed. */
/* Append note to the room's failure reason (m->mu held). */
void kvb__room_note(kvb__room_t *r, const char *note);
void kvb__room_fail(kvb__room_t *r, const char *fmt, ...) KVB_PRINTF(2, 3);
void kvb__rooms_sweep(struct kvb_manager *m, double now);
void kvb__rooms_free(struct kvb_manager *m);
void kvb__room_take_reason(kvb__room_t *r, char *buf, size_t len);

/* prefill.c */
kvb_status_t kvb__prefill_start(struct kvb_manager *m);
void kvb__prefill_stop(struct kvb_manager *m);
void kvb__prefill_on_message(struct kvb_manager *m, const kvb__frame_t *f, size_t n);
void kvb__prefill_free(struct kvb_manager *m);
/* prefill_notify.c. m->mu held: fail the room, wait until no worker is
 * issuing writes for it, cancel the writes in flight. */
void kvb__prefill_abort_room(struct kvb_manager *m, kvb__room_t *r, const char *reason);
/* Send whatever terminal status of room is due (never under m->mu). */
void kvb__prefill_notify(struct kvb_manager *m, uint64_t room);
/* Abort (kvb__prefill_abort_room) every room not over that holds a
 * destination of decode session sid, and tell each its decodes once
 * nothing of it is in flight: a refused registration of a dialect with
 * refusal_ends_rooms (TokenSpeed 0.1.1's CachePD). Not under m->mu. */
void kvb__prefill_fail_session(struct kvb_manager *m, const char *sid, const char *reason);
typedef struct kvb__note { /* one decode endpoint to tell */
    char ip[KVB_IP_MAX];
    uint16_t port;
    const struct kvb__dialect *ack; /* the decode asked for the abort in this dialect:
                                       its ABORT_ACK instead of the status */
    int has_gen;                    /* its ABORT's generation (SGLang 0.5.23): echoed in the ACK */
    uint64_t gen;
    uint8_t *digest; /* Success to a kvbridge decode with integrity on: the kv_digest= value
                        (owned; integrity.h), or NULL */
    size_t digest_len;
} kvb__note_t;
/* m->mu held: the endpoints to tell about the room's end (0: nothing due);
 * *status_p the value to send. */
size_t kvb__notes_due(struct kvb_manager *m, kvb__room_t *r, kvb__note_t **out, int *status_p);
/* Send them (never under m->mu), each recorded in tl (the room's timeline,
 * a reference the caller holds, or NULL), and free notes. */
void kvb__send_notes(struct kvb_manager *m, uint64_t room, kvb__note_t *notes, size_t n, int status,
                     kvb__tl_t *tl);
/* prefill_boot.c: register this rank with the bootstrap server (PUT /route):
 * kvbridge's body, then m->boot_puts (the shapes other dialects' decodes
 * read); KVB_OK when the server took any of them (a TokenSpeed server takes
 * only its own). */
kvb_status_t kvb__prefill_register(struct kvb_manager *m);
void kvb__prefill_boot_free(struct kvb_manager *m); /* m->boot_puts */
/* prefill_boot.c: re-register with the bootstrap server every
 * p.bootstrap_refresh_s on a thread of its own (nothing when 0); stop joins it
 * within the PUT's time-out (min(1 s, interval)) once m->stop is set. */
kvb_status_t kvb__prefill_refresh_start(struct kvb_manager *m);
void kvb__prefill_refresh_stop(struct kvb_manager *m);

/* prefill_ctl.c: put destination d (moved) into its room as a transfer
 * info of the decode at d->ip:d->port does; why non-empty fails the room
 * with it; the decode is told at once when the room failed. */
void kvb__prefill_add_dst(struct kvb_manager *m, uint64_t room, kvb__dst_t *d, int32_t required,
                          const char *why);

/* outputs.c: a room's first token and candidates (prefill: the sender's;
 * decode: from a Success that carried them). first_wins: keep what is there
 * (a decode keeps the first non -1 token seen). Bounded table. Any thread. */
#define KVB__MAX_CANDIDATES 4096
kvb_status_t kvb__output_set(struct kvb_manager *m, uint64_t room, int64_t token,
                             const int32_t *cands, size_t n, bool first_wins);
/* A sender's aux slot (first-token fallback), from kvb_sender_init: kept
 * only once kvb__outputs_enable ran (a dialect that carries outputs spoke). */
void kvb__output_note_aux(struct kvb_manager *m, uint64_t room, int64_t aux_index);
void kvb__outputs_enable(struct kvb_manager *m);
/* The room's first token: the sender's, else aux buffer 0's first int32 at
 * the sender's aux slot (SGLang's output_ids), else -1. Candidates copied
 * into *cands_p (caller frees). */
int64_t kvb__output_first_token(struct kvb_manager *m, uint64_t room, int32_t **cands_p,
                                size_t *n_p);
/* Copy the room's aux-slot first token into its record (when the sender
 * set none), before its Success is published: once a sender's poll says
 * Success the framework may reuse the aux slot, while the statuses that
 * carry the token are sent after (prefill_xfer.c). */
void kvb__output_latch(struct kvb_manager *m, uint64_t room);
void kvb__outputs_free(struct kvb_manager *m);
/* What else travels with a first token in some dialects' statuses: the
 * prefill's prefix-cache hit (cached tokens) and the first token's logprob.
 * Set either (NULL: leave it); merge (a decode gathering its sources'
 * statuses): keep the larger cached count and the first logprob, as
 * TokenSpeed's decode does. Read both (*cached_p 0 when never set; true
 * when a logprob was set, into *logprob_p). Any thread. */
kvb_status_t kvb__output_set_extras(struct kvb_manager *m, uint64_t room, const uint64_t *cached,
                                    const double *logprob, bool merge);
bool kvb__output_extras(struct kvb_manager *m, uint64_t room, uint64_t *cached_p,
                        double *logprob_p);

/* endpoints.c: the dialect a decode endpoint spoke, when not the default. */
void kvb__endpoint_note(struct kvb_manager *m, const char *ip, size_t ip_len, uint16_t port,
                        const struct kvb__dialect *dialect);
/* NULL: never said (the default dialect's statuses). */
const struct kvb__dialect *kvb__endpoint_dialect(struct kvb_manager *m, const char *ip,
                                                 uint16_t port);
void kvb__endpoints_free(struct kvb_manager *m);
/* rooms.c: free a destination's arrays and plan. */
void kvb__dst_free(kvb__dst_t *d);

/* decode.c */
kvb_status_t kvb__decode_start(struct kvb_manager *m);
void kvb__decode_stop(struct kvb_manager *m);
void kvb__decode_on_message(struct kvb_manager *m, const kvb__frame_t *f, size_t n);
void kvb__decode_free(struct kvb_manager *m);
/* icheck.c: the decode's integrity checks off the control thread, on
 * KVBRIDGE_INTEGRITY_THREADS workers (default 2; 0: none), at most
 * KVBRIDGE_INTEGRITY_QUEUE rooms waiting (default 64), so one room's
 * recomputation does not hold the statuses of the others; a room of more
 * than KVBRIDGE_INTEGRITY_PART bytes (default 1 MiB) is split into parts the
 * idle workers share (one per such size, at most one per worker), the last
 * to end reports it. Start: at the decode's
 * start with integrity on (KVB_ERR_IO: no thread); report: decode.c's,
 * called once per room on the worker that ended it, no lock held (passed
 * in: no call circle). Submit: the control thread; false (none started, the
 * queue full, out of memory: the caller checks it itself, which paces the
 * statuses) leaves a and tl with the caller; true takes a and a reference
 * of tl. Stop: after the control thread's end; joins the workers (a room
 * whose parts are all claimed is reported), drops the rooms still waiting
 * (their manager is going: nothing reports them). */
typedef void (*kvb__icheck_fn)(struct kvb_manager *m, uint64_t room, bool good, const char *why,
                               kvb__tl_t *tl);
kvb_status_t kvb__icheck_start(struct kvb_manager *m, kvb__icheck_fn report);
bool kvb__icheck_submit(struct kvb_manager *m, uint64_t room, kvb__integ_t *a, kvb__tl_t *tl);
void kvb__icheck_stop(struct kvb_manager *m);
/* Tests only (kvb__icheck_stall_ms: 0 in production; atomic): the next
 * integrity check holds this long before it recomputes, a slow check
 * (tests/integration/integrity); kvb__icheck_test_stall takes it. */
extern int kvb__icheck_stall_ms;
void kvb__icheck_test_stall(void);

/* rooms.c */
/* m->mu held: a room's poll answer may have changed (status, or a source's
 * response that can close a failed room's fence): wake kvb_manager_event_fd
 * waiters. */
void kvb__room_changed(kvb__room_t *r);
/* m->mu held: take r off the kvb_manager_changed list (when freed). */
void kvb__room_unchange(struct kvb_manager *m, kvb__room_t *r);

/* Polling pieces shared by kvb_*_poll and kvb_*_poll_many (poll_many.c).
 * m->mu held: the status of s's room (failing it past the bootstrap
 * time-out). After unlocking: remember a terminal status and tell the
 * decode about a failure; returns status. */
int kvb__sender_status(struct kvb_manager *m, kvb_sender_h s);
kvb_poll_t kvb__sender_conclude(kvb_sender_h s, int status);
/* m->mu held: the status of rc's room (failing it past the waiting
 * time-out). Failed here is not final: the writer fence decides, so the
 * caller then polls that receiver alone with kvb_receiver_poll. */
int kvb__receiver_status(struct kvb_manager *m, kvb_receiver_h rc);

/* Count one bootstrap HTTP request (kvb_manager_traffic) that ended with st. */
static inline void kvb__count_boot(struct kvb_manager *m, kvb_status_t st)
{
    __atomic_add_fetch(&m->boot_requests, 1, __ATOMIC_RELAXED);
    if (st != KVB_OK)
        __atomic_add_fetch(&m->boot_failed, 1, __ATOMIC_RELAXED);
}
/* common.c: shared by the role files. */
/* A bootstrap client for addr carrying the manager's token (if any). */
kvb_status_t kvb__bootstrap_client(struct kvb_manager *m, const char *addr,
                                   kvb_bootstrap_client_h *client_p);
/* A table made on first use (any thread): *slot, or, when create and it is
 * NULL, a zeroed allocation of size bytes whose first member is a
 * pthread_mutex_t (initialised here). NULL: not made (or no memory). */
void *kvb__lazy_table(void **slot, size_t size, bool create);
/* Copy n bytes of s into dst (cap bytes, NUL-terminated, truncated). */
void kvb__copy_str(char *dst, size_t cap, const char *s, size_t n);
/* A malloc'ed copy of v (NULL: no memory). */
uint64_t *kvb__copy_u64_view(kvb__u64_view_t v);
/* Count a malformed control message of kind (its name, a static string;
 * logged once per kind); the room it names (e->has_room) fails with
 * e->reason. Takes m->mu. */
void kvb__conn_bad_message(struct kvb_manager *m, const char *kind, const kvb__frames_err_t *e);
/* True the first time this manager is asked about kind (a static string,
 * compared by address), false after: a warning logged once per manager.
 * Any thread, with or without m->mu; past 16 kinds always false. */
bool kvb__conn_note_once(struct kvb_manager *m, const char *kind);
/* prefill_notify.c: send a status (room, value, rank) to ip:port, in the
 * dialect that endpoint speaks. */
/* The same with kv_digest= (digest_len bytes at digest, integrity.h) after the
 * marker where the endpoint's dialect carries kvbridge extensions
 * (send_status_digest); else the plain status. */
kvb_status_t kvb__send_status_digest(struct kvb_manager *m, const char *ip, uint16_t port,
                                     uint64_t room, int status, int32_t rank, const uint8_t *digest,
                                     size_t digest_len);
kvb_status_t kvb__send_status(struct kvb_manager *m, const char *ip, uint16_t port, uint64_t room,
                              int status, int32_t rank);
/* Writer tag of the prefill rank whose control endpoint is ip:port (the
 * engine's writer fencing; never 0). */
uint32_t kvb__endpoint_tag(const char *ip, uint16_t port);
/* Target-model layers of this rank's KV list: num_kv per K/V (or latent)
 * less the draft layers appended after them (params draft_layers). */
uint32_t kvb__target_layers(const struct kvb_manager *m);
/* This rank's planner layout (prefill) or decode layout. */
void kvb__layout_self(struct kvb_manager *m, kvb_plan_layout_t *out);

#endif
