/* A dialect: one peer protocol kvbridge speaks on its control channel
 * (ZeroMQ multipart messages): its frames, status values, bootstrap answer
 * and quirks. Each dialect lives in its own folder under src/dialect/ and
 * is the only place that knows them; the connector (src/conn/) sees a
 * dialect only through this table of operations and its traits, on the
 * connector's own structs (kvb__reg_in_t, kvb__xfer_in_t, kvb__abort_in_t
 * here; kvb__status_in_t, kvb__aux_in_t, kvb__ack_in_t, kvb__dst_t,
 * kvb__src_t in conn/conn_int.h).
 *
 * Layering (scripts/check-structure.py keeps it free of call circles):
 *   conn/manager.c, conn/decode.c, conn/prefill_{ctl,xfer}.c   role code
 *   dialect/<name>/, dialect/registry.c                         dialects
 *   conn/{rooms,regs,outputs,endpoints,common,zsock}.c,
 *   conn/prefill_{notify,boot}.c, proto/, plan/, engine/        below both
 * A dialect may call down (send on ZeroMQ, look up a registration, store a
 * first token), never into the role code.
 *
 * Adding a dialect: docs/architecture.md, "Adding a dialect". */
#ifndef KVB_DIALECT_H
#define KVB_DIALECT_H

#include "conn/conn_int.h"

/* What a message is, in the connector's terms. */
typedef enum kvb__dmsg {
    KVB__DMSG_NONE = 0,     /* not this dialect's */
    KVB__DMSG_REGISTRATION, /* decode -> prefill: KV args */
    KVB__DMSG_TRANSFER,     /* decode -> prefill: a room's transfer info (or kvbridge's abort=1) */
    KVB__DMSG_ABORT,        /* decode -> prefill: stop writing the room */
    KVB__DMSG_STATUS,       /* prefill -> decode: a room's status */
    KVB__DMSG_AUX,          /* prefill -> decode: inline aux data */
    KVB__DMSG_ABORT_ACK,    /* prefill -> decode: nothing of the room is in flight */
    KVB__DMSG_UNSUPPORTED,  /* the dialect's, but kvbridge does not serve it (logged, counted) */
} kvb__dmsg_t;

/* A room whose sources sent no kvbridge digest, for a dialect's own
 * (check_own_digest): the decode's view of it. */
typedef struct kvb__own_digest_in {
    uint64_t room;
    const int32_t *pages; /* the room's pages past its prefix, in the order sent */
    size_t n_pages;
    int64_t aux_slot;   /* the room's aux slot */
    size_t n_real_srcs; /* sources that write (not dummies) */
    bool has_state;     /* it asked for state slots */
} kvb__own_digest_in_t;

typedef enum kvb__own_result {
    KVB__OWN_NONE = 0, /* nothing to check (counted unchecked) */
    KVB__OWN_MATCH,
    KVB__OWN_MISMATCH, /* fails the room with the reason */
} kvb__own_result_t;

/* What the connector branches on. */
typedef struct kvb__dialect_traits {
    const char *name;   /* in logs: "SGLang seed 001" */
    const char *family; /* in failure reasons: "SGLang", "TokenSpeed" */
    /* The dialect plans each chunk (plan_job) instead of kvbridge's planner
     * on the registration: from the plan the decode sends with each
     * transfer info (seed 004), or from both sides' layout contracts
     * (CachePD, whose prefill plans). */
    bool plans_chunks;
    /* kvbridge's extension frames (after the "kvbridge-ext/1" marker) may
     * ride on its registration and transfer info to a kvbridge peer: the
     * writer grant travels only where this is true. */
    bool extensions;
    /* A transfer info lists only the pages after the decode's prefix
     * (kvb__dst_t.skip_pages of them are held already); else all pages. */
    bool suffix_pages;
    /* Its statuses are not SGLang's 3 frames: the endpoints that spoke it
     * are remembered (conn/endpoints.c) and every status to them is its. */
    bool own_status;
    /* Decode side: its routes name prefill ranks stage-major (stage x TP +
     * TP rank, every stage in one list: CachePD), each looked up once with
     * PP rank 0, and its statuses name them so; else one source per TP rank
     * and PP stage, statuses tp x pp_size + pp. */
    bool stage_major;
    /* Prefill side: a refused registration (kvb__reg_in_t.refuse) also fails
     * the rooms that already hold the session's requests (TokenSpeed 0.1.1
     * aborts them); else only the session's later rooms fail. */
    bool refusal_ends_rooms;
} kvb__dialect_traits_t;

/* A decode's KV args, decoded (the prefill's registration table keeps them). */
typedef struct kvb__reg_in {
    const char *ip, *session; /* views into the message */
    size_t ip_len, session_len;
    uint16_t port;
    kvb__u64_view_t kv, aux;
    uint64_t *state; /* owned: moved into the record */
    size_t n_state;
    int32_t tp_rank, tp_size;
    int64_t item_len;
    bool has_pool; /* pages per KV buffer known (kvbridge's kv_lens=) */
    uint64_t pool;
    bool has_layout;     /* page size and order known (kvbridge's kv_layout=) */
    uint32_t page_size;  /* the decode's tokens per page */
    uint32_t kv_order;   /* kvb_plan_order_t */
    uint32_t digest_max; /* highest kv_digest= version it reads (kvbridge's kv_digest=; 0: 1) */
    const struct kvb__dialect *dialect;
    char *refuse; /* owned: why this decode cannot be served (every room to it fails) */
    void *priv;   /* owned: the dialect's own record of it (kvb__reg_t.priv, reg_free) */
} kvb__reg_in_t;

/* A transfer info (or kvbridge's seed-001 abort=1), decoded. */
typedef struct kvb__xfer_in {
    uint64_t room;
    kvb__dst_t d; /* owned arrays (kvb__dst_free) */
    int32_t required;
    bool is_abort;                         /* kvbridge's abort=1: d holds only the asker */
    char why[KVB__FRAMES_REASON_MAX + 64]; /* non-empty: the room fails with it */
} kvb__xfer_in_t;

/* An abort request, decoded (ip/port: where the answer goes). */
typedef struct kvb__abort_in {
    uint64_t room;
    char ip[KVB_IP_MAX];
    uint16_t port;
    bool has_generation; /* SGLang 0.5.23: the ACK echoes it */
    uint64_t generation;
} kvb__abort_in_t;

typedef struct kvb__dialect {
    kvb__dialect_traits_t t;
    /* The bootstrap answer shape that selects it on a decode
     * (KVB_BOOTSTRAP_DIALECT_*). */
    int boot_dialect;

    /* Which of its messages frames are (any side; KVB__DMSG_NONE: not its). */
    kvb__dmsg_t (*classify)(struct kvb_manager *m, const kvb__frame_t *f, size_t n);

    /* ---- prefill side ----
     * Decoders return KVB_OK with *out filled; on a malformed message they
     * count it (kvb__conn_bad_message: the room it names fails) and return
     * KVB_ERR_PROTO, except that take_transfer may still hand back a
     * destination (out->d.session set, out->why the reason) so the decode
     * hears Failed at once. NULL where the dialect has no such message. */
    kvb_status_t (*decode_registration)(struct kvb_manager *m, const kvb__frame_t *f, size_t n,
                                        kvb__reg_in_t *out);
    kvb_status_t (*take_transfer)(struct kvb_manager *m, const kvb__frame_t *f, size_t n,
                                  kvb__xfer_in_t *out);
    kvb_status_t (*decode_abort)(struct kvb_manager *m, const kvb__frame_t *f, size_t n,
                                 kvb__abort_in_t *out);
    /* Log once and count a KVB__DMSG_UNSUPPORTED message (it fails no room). */
    void (*unsupported)(struct kvb_manager *m, const kvb__frame_t *f, size_t n);
    /* A status (KVB_POLL_SUCCESS / _FAILED) from prefill rank `rank`. */
    kvb_status_t (*send_status)(struct kvb_manager *m, const char *ip, uint16_t port, uint64_t room,
                                int status, int32_t rank);
    /* Optional (extensions dialects): the same status with kvbridge's
     * kv_digest= extension (docs/integrity.md), sent only to a kvbridge
     * decode; NULL: the dialect's statuses carry none. */
    kvb_status_t (*send_status_digest)(struct kvb_manager *m, const char *ip, uint16_t port,
                                       uint64_t room, int status, int32_t rank,
                                       const uint8_t *digest, size_t digest_len);
    /* The answer to its abort once nothing of the room can land (gen: echo). */
    kvb_status_t (*send_abort_ack)(struct kvb_manager *m, const char *ip, uint16_t port,
                                   uint64_t room, int32_t rank, const uint64_t *gen);
    /* plans_chunks: the blocks of chunk c for destination d (registration
     * g), validated against both sides before any write; *st_p / why. */
    void (*plan_job)(struct kvb_manager *m, kvb__reg_t *g, const kvb__dst_t *d,
                     const kvb__chunk_t *c, kvb_plan_strided_t *out, kvb_status_t *st_p, char *why,
                     size_t wl);
    void (*plan_free)(void *plan); /* kvb__dst_t.plan; NULL-safe */
    /* Once a room has as many destinations as its route expects: why they
     * cannot be served together (why empty: they can), e.g. CachePD's exact
     * decode-rank set (TokenSpeed's step 9). NULL where the count is
     * enough. */
    void (*check_fanout)(const kvb__dst_t *dsts, size_t n, char *why, size_t wl);
    /* kvb__reg_t.priv / kvb__reg_in_t.priv: what the dialect keeps with a
     * registration that the connector's record cannot hold (a decode's
     * layout contract, its planned route); NULL-safe. NULL where the
     * dialect keeps nothing. */
    void (*reg_free)(void *priv);
    /* The body of a PUT /route this rank sends besides kvbridge's own, for
     * a dialect whose decodes read another bootstrap shape (malloc'ed; NULL:
     * none, or this rank cannot be described in it). NULL where the dialect's
     * decodes read kvbridge's own registration. */
    char *(*boot_put)(struct kvb_manager *m);
    /* At manager creation: why this manager's parameters cannot serve the
     * dialect's peers as given (a malformed description of its cache), or
     * KVB_OK. NULL where the dialect reads no parameter of its own. */
    kvb_status_t (*check_manager)(const struct kvb_manager *m, char *why, size_t wl);
    /* Aux data inline (when the engine could not write it), NULL where the
     * dialect has none. */
    kvb_status_t (*send_aux)(struct kvb_manager *m, const char *ip, uint16_t port,
                             const kvb__aux_in_t *a);

    /* ---- decode side ---- */
    /* A dialect whose decode plans its own routes from what the bootstrap
     * answer describes (CachePD: the prefill's layout contract; NULL where
     * kvbridge's planner routes from the answer's geometry): addr_info reads
     * the parallel-info answer's text into the dialect's record of that
     * prefill instance (kvb__addr_t.priv, freed by addr_free), or why this
     * decode rank cannot be served; addr_route gives this rank's route in it
     * (sources and dummies; the array points into the record). */
    kvb_status_t (*addr_info)(struct kvb_manager *m, const char *body, size_t len, void **priv_p,
                              char *why, size_t wl);
    kvb_status_t (*addr_route)(struct kvb_manager *m, const void *priv, kvb_plan_route_t *route);
    void (*addr_free)(void *priv);
    /* Our KV args to prefill rank ip:port (kvbridge: it is a kvbridge peer;
     * priv: the record of addr_info, NULL without one). */
    kvb_status_t (*send_registration)(struct kvb_manager *m, const char *ip, uint16_t port,
                                      bool kvbridge, const void *priv);
    kvb_status_t (*send_transfer)(struct kvb_manager *m, const kvb__src_t *s, uint64_t room,
                                  const int32_t *idx, size_t n, int64_t aux,
                                  const kvb_receiver_init_t *ex);
    /* Ask s to stop writing the room (gen: our ABORT's generation); KVB_OK
     * sending nothing where the dialect has no abort for s. */
    kvb_status_t (*send_abort)(struct kvb_manager *m, const kvb__src_t *s, uint64_t room,
                               uint64_t gen);
    /* Into why (empty: fine) what of ex its transfer info to s cannot say. */
    void (*transfer_form)(const struct kvb_manager *m, const kvb__src_t *s, size_t count,
                          const kvb_receiver_init_t *ex, char *why, size_t len);
    /* A status into the connector's (status KVB_POLL_*; others than
     * Success/Failed change nothing). */
    kvb_status_t (*decode_status)(struct kvb_manager *m, const kvb__frame_t *f, size_t n,
                                  kvb__status_in_t *out);
    kvb_status_t (*decode_abort_ack)(struct kvb_manager *m, const kvb__frame_t *f, size_t n,
                                     kvb__ack_in_t *out);
    kvb_status_t (*decode_aux)(struct kvb_manager *m, const kvb__frame_t *f, size_t n,
                               kvb__aux_in_t *out);
    /* Integrity on, every source's Success in, none with a kvbridge digest:
     * the framework's own digest of the room, carried in its aux, checked
     * over the room's pages (why: the mismatch, or why nothing was checked).
     * Called without a lock; reads the pages. NULL where the dialect has
     * none. */
    kvb__own_result_t (*check_own_digest)(struct kvb_manager *m, const kvb__own_digest_in_t *in,
                                          char *why, size_t wl);
} kvb__dialect_t;

/* ---- registry.c ---- */
/* The dialect whose message frames are, and what it is; in registry order
 * (the first that claims it). NULL with KVB__DMSG_NONE: nobody's. */
const kvb__dialect_t *kvb__dialect_classify(struct kvb_manager *m, const kvb__frame_t *f, size_t n,
                                            kvb__dmsg_t *kind_p);
/* The dialect a bootstrap server's answer shape selects (decode side). */
const kvb__dialect_t *kvb__dialect_for_boot(int boot_dialect);
/* The bodies of the extra PUT /route every dialect asks this prefill rank
 * to send (dialect->boot_put), malloc'ed array of malloc'ed strings; *n_p
 * of them (NULL, 0: none). */
char **kvb__dialect_boot_puts(struct kvb_manager *m, size_t *n_p);
/* Every dialect's check_manager, the first refusal winning (why). */
kvb_status_t kvb__dialect_check_manager(const struct kvb_manager *m, char *why, size_t wl);
/* The dialect of statuses to an endpoint that never said (SGLang's 3 frames). */
const kvb__dialect_t *kvb__dialect_default(void);
/* Count (and log once per kind) a message nobody on this side handles. */
void kvb__dialect_unexpected(struct kvb_manager *m, const kvb__frame_t *f, size_t n);

/* ---- util.c: pieces several dialects use ---- */
/* transfer_form: a prefix that is not a whole number of pages within count
 * pages (the dialects that carry the prefix in tokens). */
void kvb__dialect_prefix_form(const struct kvb_manager *m, size_t count,
                              const kvb_receiver_init_t *ex, char *why, size_t len);
/* The first 0 entry of ex's page mask within count pages (true, *hole_p). */
bool kvb__dialect_mask_hole(size_t count, const kvb_receiver_init_t *ex, size_t *hole_p);
/* A status whose value is success, failed or progress (changing nothing)
 * into the connector's (decode_status). */
void kvb__dialect_status_in(kvb__status_in_t *out, uint64_t room, int32_t rank, int32_t value,
                            int32_t success, int32_t failed);
/* send_abort of a dialect that has no abort message (TokenSpeed's): sends
 * nothing; a failed room's fence waits for each source's status. */
kvb_status_t kvb__dialect_no_abort(struct kvb_manager *m, const kvb__src_t *s, uint64_t room,
                                   uint64_t gen);
/* A decode's Success that carried a first token (other than -1) and its
 * candidates: kept for kvb_receiver_first_token, the first seen winning
 * (TokenSpeed's setdefault). */
void kvb__dialect_keep_first_token(struct kvb_manager *m, uint64_t room, int64_t token,
                                   kvb__i32_view_t cands);

#endif
