/* kvbridge connector: KV managers, senders (prefill) and receivers (decode)
 * speaking the SGLang Mooncake connector's control protocol (PROTOCOL.md),
 * over kvbridge's engine, planner and bootstrap client.
 *
 * Names follow the seeds: a manager per rank (KVManager), a sender per room
 * on prefill (KVSender), a receiver per room on decode (KVReceiver), polled
 * for kvb_poll_t values numbered exactly as the seeds' KVPoll.
 *
 * Threads: a manager is thread-safe; it runs a control thread (ZeroMQ PULL
 * socket), transfer workers (prefill) or a heartbeat thread (decode). A
 * sender or receiver may be used from any thread but not from two at once;
 * destroy exactly once. Destroy senders/receivers before their manager. */
#ifndef KVBRIDGE_CONN_H
#define KVBRIDGE_CONN_H

#include <kvbridge/common.h>
#include <kvbridge/engine.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kvb_manager *kvb_manager_h;
typedef struct kvb_sender *kvb_sender_h;
typedef struct kvb_receiver *kvb_receiver_h;

/* The seeds' KVPoll values. */
typedef enum kvb_poll {
    KVB_POLL_FAILED = 0,
    KVB_POLL_BOOTSTRAPPING = 1,
    KVB_POLL_WAITING_FOR_INPUT = 2,
    KVB_POLL_TRANSFERRING = 3,
    KVB_POLL_SUCCESS = 4
} kvb_poll_t;

/* "Failed", "Bootstrapping", "WaitingForInput", "Transferring", "Success". */
KVB_API const char *kvb_poll_string(kvb_poll_t poll);

typedef enum kvb_mode { KVB_MODE_PREFILL = 0, KVB_MODE_DECODE = 1 } kvb_mode_t;

/* A rank's KV arguments (the seeds' KVArgs). Arrays are copied at manager
 * creation. kv_data_ptrs follow PROTOCOL.md's layout order: MHA → K of each
 * local layer, then V of the same layers; MLA → one latent buffer per layer;
 * with params draft_layers the draft model's K then V (MLA: latents) follow.
 * Every buffer holds items of kv_item_len bytes (page_size tokens).
 * num_layers_total counts target layers only. */
typedef struct kvb_kv_args {
    const uint64_t *kv_data_ptrs;
    const uint64_t *kv_data_lens;
    uint32_t num_kv;      /* entries of kv_data_ptrs / lens */
    uint64_t kv_item_len; /* bytes of one item of one layer buffer */
    const uint64_t *aux_data_ptrs;
    const uint64_t *aux_data_lens;
    const uint64_t *aux_item_lens;
    uint32_t num_aux;
    const uint64_t *state_data_ptrs; /* Mamba / linear-attention state */
    const uint64_t *state_data_lens;
    const uint64_t *state_item_lens;
    uint32_t num_state;
    uint32_t page_size;           /* tokens per item */
    uint32_t kv_head_num;         /* KV heads held by this rank (MHA; 1 for MLA) */
    int32_t engine_rank;          /* the seeds' engine_rank (attention TP rank) */
    uint32_t prefill_start_layer; /* prefill PP stage: first model layer held */
    uint32_t num_layers_total;    /* model layers; 0 = num local layers × pp_size */
    uint32_t kv_order; /* page order of the KV buffers, kvb_plan_order_t: 0 NHD (page, token,
                          head, dim), 1 HND (page, head, token, dim). A kvbridge peer is told
                          it and the page size (docs/planner.md) */
} kvb_kv_args_t;

enum kvb_manager_param_field {
    KVB_MANAGER_PARAM_BOOTSTRAP_ADDR = 1u << 0,
    KVB_MANAGER_PARAM_HOST = 1u << 1,
    KVB_MANAGER_PARAM_BOOTSTRAP_TIMEOUT = 1u << 2,
    KVB_MANAGER_PARAM_WAITING_TIMEOUT = 1u << 3,
    KVB_MANAGER_PARAM_HEARTBEAT = 1u << 4, /* interval and max failures */
    KVB_MANAGER_PARAM_THREADS = 1u << 5,   /* transfer threads and queues */
    KVB_MANAGER_PARAM_ROOM_TTL = 1u << 6,
    KVB_MANAGER_PARAM_BOOTSTRAP_TOKEN = 1u << 7,
    KVB_MANAGER_PARAM_CURVE = 1u << 8, /* curve_secret_key, curve_client_secret_key,
                                          curve_allowed_clients */
    KVB_MANAGER_PARAM_BOOTSTRAP_REFRESH = 1u << 9,
    /* A high bit: other parameters may claim 10.. meanwhile. */
    KVB_MANAGER_PARAM_SGLANG_DIALECT = 1u << 16,
    KVB_MANAGER_PARAM_KV_CACHE_DTYPE = 1u << 18,
    KVB_MANAGER_PARAM_DRAFT_LAYERS = 1u << 20,       /* draft_layers */
    KVB_MANAGER_PARAM_CACHEPD_CONTRACT = 1u << 21,   /* cachepd_contract */
    KVB_MANAGER_PARAM_INTEGRITY = 1u << 22,          /* integrity */
    KVB_MANAGER_PARAM_SGLANG_KV_CHECKSUM = 1u << 27, /* sglang_kv_checksum_aux */
};

/* Manager creation. Always read: mode, kv_args, engine, the parallel info
 * (attn_tp_size .. system_dp_rank; sizes >= 1, ranks in range) and is_mla.
 * Knob defaults come from the environment (PROTOCOL.md; KVBRIDGE_* twins win
 * over SGLANG_DISAGGREGATION_* names): bootstrap time-out 300 s, waiting
 * time-out 300 s, heartbeat interval 5 s (>= 2), heartbeat max failures 2
 * (>= 1), transfer threads min(max(4, 0.75·cpus/8), 12), queues 4 (<= threads),
 * bootstrap refresh 5 s (0 = off). The fields from bootstrap_timeout_s on are
 * read only when field_mask names them (UCX's habit: a caller built against
 * an older, shorter struct stays safe). */
typedef struct kvb_manager_params {
    uint64_t field_mask;
    kvb_mode_t mode;
    const kvb_kv_args_t *kv_args;
    kvb_engine_h engine; /* not owned; must outlive the manager */
    int32_t attn_tp_size, attn_tp_rank;
    int32_t attn_dp_size, attn_dp_rank;
    int32_t pp_size, pp_rank;
    int32_t system_dp_size, system_dp_rank;
    int is_mla;
    const char *bootstrap_addr; /* prefill: "host:port" to register with (required) */
    const char *host;           /* control socket address, default "127.0.0.1" */
    double bootstrap_timeout_s; /* sender stuck in Bootstrapping → Failed */
    double waiting_timeout_s;   /* receiver stuck in WaitingForInput → Failed */
    double heartbeat_interval_s;
    int heartbeat_max_failures;
    int transfer_threads, transfer_queues;
    double room_ttl_s; /* terminal rooms nobody polls are freed after this, 600 s */
    /* Authentication (optional, off by default; docs/security.md). */
    const char *bootstrap_token; /* bearer token of every bootstrap request this
                                    manager makes (prefill registration, decode
                                    look-ups and heartbeats); default from
                                    KVBRIDGE_BOOTSTRAP_TOKEN; "" = none */
    /* ZeroMQ CURVE on the control channel, one key set per deployment: every
     * rank's PULL socket is a CURVE server with the deployment's server key;
     * PUSH sockets are CURVE clients of that same server key; a ZAP handler
     * admits only client public keys in the allowed set. Keys are Z85 text
     * (40 characters; zmq_curve_keypair(), or pyzmq's zmq.curve_keypair()). Set on
     * every rank or on none: a rank without CURVE cannot talk to one with it. */
    const char *curve_secret_key;        /* deployment server secret key; NULL or
                                            "" = CURVE off [KVBRIDGE_CURVE_SECRET_KEY] */
    const char *curve_client_secret_key; /* this rank's client secret key; default
                                            the server key
                                            [KVBRIDGE_CURVE_CLIENT_SECRET_KEY] */
    const char *curve_allowed_clients;   /* comma-separated client public keys
                                            admitted; default the public keys of
                                            the two keys above
                                            [KVBRIDGE_CURVE_ALLOWED_CLIENTS] */
    double bootstrap_refresh_s;          /* prefill: re-register with the bootstrap server
                                            every this many seconds (a restarted server
                                            finds its ranks again), 5; 0 = only at
                                            creation [KVBRIDGE_BOOTSTRAP_REFRESH] */
    int sglang_dialect;                  /* bootstrap dialect of this manager's requests
                                            (kvb_bootstrap_dialect_t: 0 = default, 2025, 2026):
                                            the prefill's registration PUT, the decode's
                                            look-ups; default KVBRIDGE_SGLANG_DIALECT, else 2026
                                            (a 2026 decode falls back to 2025 with a seed-001
                                            server: docs/bootstrap.md) */
    const char *kv_cache_dtype;          /* the KV cache's dtype name as the framework
                                            spells it (SGLang's --kv-cache-dtype, e.g.
                                            "auto", "fp8_e4m3"), 1..64 of
                                            [A-Za-z0-9_.:+-]; NULL or "" = unknown. A
                                            prefill registers it (SGLang 2026's PUT key);
                                            a decode fails a room whose prefill
                                            registered another ("KV cache dtype mismatch").
                                            Unknown on either side: no check (the item
                                            length check still catches another width).
                                            Default KVBRIDGE_KV_CACHE_DTYPE */
    uint32_t draft_layers;               /* speculative decoding: the last draft_layers
                                            layers of kv_args are the draft model's, appended
                                            after the target's as SGLang and TokenSpeed do
                                            (MHA: K target, V target, K draft, V draft; MLA:
                                            target, draft); same item length as the target.
                                            A prefill pairs them with the decode's draft
                                            layers and fails a room whose decode holds
                                            another number; needs pp_size 1. 0 = none */
    const char *cachepd_contract;        /* TokenSpeed 0.1.1 (CachePD) peers: the JSON text
                                            of a TokenSpeed CacheTransferContract of this
                                            model at any TP (as TokenSpeed's recipes build
                                            it), up to 256 KiB. kvbridge keeps its groups,
                                            specs, field ids, dtypes, global shapes and
                                            partitions and lays its fields over kv_args:
                                            the history group's K of each layer in layer
                                            order, then V (MLA: latent_kv), one page per
                                            item; the state groups' fields in (layer, name)
                                            order onto the state buffers, one slot per
                                            item (docs/tokenspeed-cachepd-fields.md). Needed
                                            for a hybrid model (state buffers); without it
                                            kvbridge describes a plain MHA/MLA cache as
                                            TokenSpeed's ordinary recipe does. Checked at
                                            creation (KVB_ERR_INVALID with the reason).
                                            NULL or "" = none */
    int integrity; /* kvb_integrity_t: off (0) or check (1) the KV pages' digest between
                      kvbridge ranks (docs/integrity.md); default KVBRIDGE_INTEGRITY
                      ("off" | "check"), else off */
    int32_t sglang_kv_checksum_aux; /* decode: the aux buffer that holds SGLang 0.5.23's
                      kv_checksum rows (--disaggregation-enable-kv-checksum: 64-byte items,
                      u64 digest then u64 layout signature), or -1 (default): with
                      integrity check, a room whose SGLang 2026 prefill sent no kvbridge
                      digest is checked against that digest over its pages
                      (docs/integrity.md, "With SGLang's own checksum"). An index past the
                      aux buffers or an item under 16 bytes: KVB_ERR_INVALID at creation */
} kvb_manager_params_t;

/* KV integrity (docs/integrity.md): with check, a prefill sends each kvbridge
 * decode an XXH3 digest of the KV pages it wrote with the room's Success, and
 * a decode recomputes it over its own pages before it reports Success (a
 * mismatch fails the room naming the buffer and page). */
typedef enum kvb_integrity { KVB_INTEGRITY_OFF = 0, KVB_INTEGRITY_CHECK = 1 } kvb_integrity_t;

/* Create a manager: registers the KV/aux/state buffers with the engine,
 * binds the control socket on an ephemeral port, starts its threads and
 * (prefill) registers with the bootstrap server. Errors: KVB_ERR_INVALID
 * (parameters, a malformed CURVE key), KVB_ERR_PEER / KVB_ERR_TIMEOUT /
 * KVB_ERR_PROTO (bootstrap registration), KVB_ERR_AUTH (the bootstrap server
 * refused the token), KVB_ERR_IO, KVB_ERR_NOMEM; the reason is logged and
 * available from kvb_manager_last_error(NULL). */
KVB_API kvb_status_t kvb_manager_create(const kvb_manager_params_t *params,
                                        kvb_manager_h *manager_p);

/* Stop every thread, unregister the buffers and free everything. Senders and
 * receivers must be destroyed first. */
KVB_API void kvb_manager_destroy(kvb_manager_h manager);

/* Detailed text of the last error recorded by this manager (NULL: the last
 * kvb_manager_create failure of the calling thread). Thread-local copy. */
KVB_API const char *kvb_manager_last_error(kvb_manager_h manager);

/* "ip:port" of the control socket (the seeds' rank_ip:rank_port). Owned by
 * the manager, valid until destroy; any thread. */
KVB_API const char *kvb_manager_endpoint(kvb_manager_h manager);

typedef struct kvb_manager_stats {
    uint64_t bad_messages;     /* malformed control messages dropped */
    uint64_t rooms;            /* rooms tracked now (incl. tombstones) */
    uint64_t transfers_failed; /* destination writes that failed */
    /* prefill: decode KV-args registrations held now, dropped to make room
     * (failed, never used, or idle past the room TTL first) and refused
     * (table of KVBRIDGE_MAX_REGISTRATIONS, default 4096, all in use) */
    uint64_t registrations, registrations_evicted, registrations_refused;
} kvb_manager_stats_t;

/* Snapshot of the manager's counters into *stats_p (consistent with each
 * other: read under the manager's lock). Any thread; cannot fail. */
KVB_API void kvb_manager_stats(kvb_manager_h manager, kvb_manager_stats_t *stats_p);

/* Caps on what peers can make a manager hold without authentication, and
 * what they refused (docs/security.md). Set field_mask to the fields your
 * struct has (UCX's habit: a caller built against an older, shorter struct
 * stays safe); only those are written. */
enum kvb_manager_limits_field {
    KVB_MANAGER_LIMITS_REG_IDENTITY = 1u << 0, /* registrations_impostor */
    KVB_MANAGER_LIMITS_REG_BYTES = 1u << 1,    /* registration_bytes, registrations_too_big */
    KVB_MANAGER_LIMITS_WIRE_ROOMS = 1u << 2,   /* wire_rooms .. wire_rooms_evicted */
    KVB_MANAGER_LIMITS_PUSH = 1u << 3,         /* push_sockets, push_sockets_evicted */
};

typedef struct kvb_manager_limits {
    uint64_t field_mask;
    /* prefill: KV-args registrations refused because the session id is
     * registered with another CURVE client key */
    uint64_t registrations_impostor;
    /* prefill: bytes of pointer arrays held by registrations now, and
     * registrations refused for exceeding KVBRIDGE_MAX_REGISTRATION_BYTES
     * (one, default 1 MiB) or KVBRIDGE_MAX_REGISTRATIONS_BYTES (all,
     * default 64 MiB) */
    uint64_t registration_bytes, registrations_too_big;
    /* prefill: rooms that exist only because a peer named them (no sender
     * yet) and their bytes, at most KVBRIDGE_MAX_WIRE_ROOMS (default 4096)
     * and KVBRIDGE_MAX_WIRE_ROOM_BYTES (default 256 MiB); messages refused
     * (one alone past the byte cap); rooms dropped to make room (the oldest
     * of the peer, CURVE key or claimed ip:port, that holds the most) */
    uint64_t wire_rooms, wire_room_bytes, wire_rooms_refused;
    uint64_t wire_rooms_evicted;
    /* PUSH sockets open now (at most KVBRIDGE_MAX_PUSH_SOCKETS, default
     * 1024) and closed least-recently used to make room */
    uint64_t push_sockets, push_sockets_evicted;
} kvb_manager_limits_t;

/* Snapshot of the manager's caps counters into the fields of *limits_p
 * that its field_mask names. Any thread; cannot fail. */
KVB_API void kvb_manager_limits(kvb_manager_h manager, kvb_manager_limits_t *limits_p);

/* Traffic a manager caused or received, for sizing deployments (issue 16
 * §4: control messages per room, heartbeat and bootstrap load per rank).
 * Monotonic since create; set field_mask to the fields your struct has (an
 * older, shorter struct stays safe); only those are written. */
enum kvb_manager_traffic_field {
    KVB_MANAGER_TRAFFIC_CONTROL = 1u << 0,   /* control_sent .. control_received */
    KVB_MANAGER_TRAFFIC_BOOTSTRAP = 1u << 1, /* bootstrap_requests, bootstrap_failed */
    KVB_MANAGER_TRAFFIC_HEARTBEAT = 1u << 2, /* heartbeat_requests, heartbeat_failed */
    KVB_MANAGER_TRAFFIC_INTEGRITY = 1u << 3, /* integrity_sent .. integrity_unchecked */
};

typedef struct kvb_manager_traffic {
    uint64_t field_mask;
    /* ZeroMQ control messages (multipart) queued to peers, dropped (peer
     * queue full, socket not made) and received on the PULL socket (all of
     * them, malformed ones included) */
    uint64_t control_sent, control_send_failed, control_received;
    /* HTTP requests to bootstrap servers other than heartbeats (decode:
     * parallel info, rank look-ups, dp-rank queries; prefill: registration
     * and its periodic refresh), and how many of them failed */
    uint64_t bootstrap_requests, bootstrap_failed;
    /* decode: health GETs to bootstrap servers, and failed ones */
    uint64_t heartbeat_requests, heartbeat_failed;
    /* integrity (docs/integrity.md). prefill: Success statuses sent with a
     * digest. decode: rooms whose digest was recomputed (checked), of those
     * the ones that differed (mismatches, each failed), and rooms that ended
     * Success without a digest to check (a source with integrity off, not
     * kvbridge, device memory, or a plan that writes part of a page) */
    uint64_t integrity_sent, integrity_checked, integrity_mismatches, integrity_unchecked;
} kvb_manager_traffic_t;

/* Snapshot of the traffic counters into the fields of *traffic_p that its
 * field_mask names (each read atomically; not a consistent set while traffic
 * flows). Any thread; cannot fail. */
KVB_API void kvb_manager_traffic(kvb_manager_h manager, kvb_manager_traffic_t *traffic_p);

/* SGLang 0.5.23's KV checksum (--disaggregation-enable-kv-checksum) of this
 * rank's KV at pages indices[count]: one Adler-32 over every KV buffer in
 * registration order, each buffer's items in the order given, the bytes its
 * GPU kernel digests (docs/integrity.md, "With SGLang's own checksum"). A
 * prefill application fills its kv_checksum aux row with it (and SGLang's
 * layout signature) before the last chunk, as SGLang's scheduler does.
 * Reads host KV memory while the caller keeps the pages still; any thread.
 * KVB_ERR_INVALID: device KV memory, or an index outside the KV pool. */
KVB_API kvb_status_t kvb_manager_sglang_kv_checksum(kvb_manager_h manager, const int32_t *indices,
                                                    size_t count, uint64_t *digest_p);

/* A file descriptor (an eventfd, non-blocking, close-on-exec) that becomes
 * readable when a room of this manager may poll differently: a status
 * change, or a prefill's answer that can end a failed room's writer fence.
 * Lets a caller with thousands of rooms sleep in poll/epoll and poll its
 * rooms (kvb_*_poll_many) only after a change, instead of spinning. Read
 * 8 bytes to reset it before polling, so no change is missed. It is also
 * written once a second while a room is due for a poll that no message
 * prompts (see kvb_manager_changed). Made on the first call; the same fd after;
 * owned by the manager (closed by kvb_manager_destroy: do not close it).
 * Any thread. Errors: KVB_ERR_INVALID (NULL), KVB_ERR_IO (no eventfd). */
KVB_API kvb_status_t kvb_manager_event_fd(kvb_manager_h manager, int *fd_p);

/* The ids of this manager's rooms whose poll answer may have changed since
 * they were last returned here (the same changes that wake
 * kvb_manager_event_fd), oldest change first, each room at most once; at
 * most cap of them into rooms[0..cap), their count in *n_p; the rest stay
 * for the next call. Lets a caller with thousands of rooms in flight poll
 * only those (kvb_*_poll_many) after a wake instead of all of them.
 * Recorded from kvb_manager_create on, whether or not anyone asks: the list
 * is threaded through the rooms themselves (no allocation), so it never
 * holds more entries than rooms exist; a room freed (its handle destroyed
 * and the room gone) leaves it. An id can name a room the caller holds no
 * handle for (a peer's message arrived first, or after its destroy):
 * ignore it. Rooms due for a poll that no message prompts are listed by
 * the manager's once-a-second sweep, every second while due: a time-out
 * passed (bootstrap, waiting, abort-ack: the poll fails the room) or a
 * failed room whose lost prefill's writes are still being fenced. So a
 * caller that polls what this returns needs no periodic pass over all its
 * rooms for the library's sake. Not listed: a room's own first state (poll
 * each new handle once).
 * Read the event fd first, then call this until it returns fewer than cap,
 * so no change is missed. Any thread; the caller owns rooms. Errors:
 * KVB_ERR_INVALID (NULL manager or n_p, NULL rooms with cap > 0). */
KVB_API kvb_status_t kvb_manager_changed(kvb_manager_h manager, uint64_t *rooms, size_t cap,
                                         size_t *n_p);

/* ---- sender (prefill) ---- */

/* Create the sender of room (status Bootstrapping until every decode rank
 * that needs this rank sent its transfer info). bootstrap_addr is kept for
 * the seeds' signature. Errors: KVB_ERR_STATE (not a prefill manager, or the
 * room already has a sender), KVB_ERR_NOMEM. */
KVB_API kvb_status_t kvb_sender_create(kvb_manager_h manager, const char *bootstrap_addr,
                                       uint64_t room, kvb_sender_h *sender_p);

/* How many page indices the request has, and its aux index (the seeds'
 * init(num_kv_indices, aux_index)). aux_index < 0 ("none") is
 * KVB_ERR_INVALID when this manager registered aux buffers. */
KVB_API kvb_status_t kvb_sender_init(kvb_sender_h sender, uint64_t num_kv_indices,
                                     int64_t aux_index);

/* Queue the next chunk: indices are the prefill page indices of request
 * pages [cur, cur + count). The chunk that reaches num_kv_indices is the
 * last (it carries aux and state). The array is copied. Errors:
 * KVB_ERR_STATE (not initialised, past the end, or the room is not yet
 * WaitingForInput), KVB_ERR_INVALID. A room already Failed accepts and
 * drops chunks (KVB_OK), as the seeds do. */
KVB_API kvb_status_t kvb_sender_send(kvb_sender_h sender, const int32_t *indices, size_t count);

/* Layerwise send: queue only layers [layer_begin, layer_end) of the next
 * chunk's pages, as the forward pass produces them, so the transfer runs
 * behind the compute of the layers after it. Layers are this rank's target
 * layers, 0 .. L-1 (L = num_kv / 2 for MHA, num_kv for MLA, less
 * draft_layers; a PP stage counts its own). A chunk's pieces come in order:
 * the first starts at layer 0, each next one where the last ended, every
 * piece with the same indices; the piece that ends at L completes the chunk
 * (it also carries the draft model's layers and, on the request's last
 * chunk, aux and state) and advances the request as kvb_sender_send does.
 * kvb_sender_send(s, i, n) is kvb_sender_send_layers(s, i, n, 0, L). The
 * decode sees nothing but writes until Success, which comes only after the
 * last piece of the last chunk; every dialect. Errors as kvb_sender_send,
 * and KVB_ERR_INVALID: a layer range out of order or past L, or other
 * indices than the chunk's earlier pieces (nothing queued). */
KVB_API kvb_status_t kvb_sender_send_layers(kvb_sender_h sender, const int32_t *indices,
                                            size_t count, uint32_t layer_begin, uint32_t layer_end);
/* L of kvb_sender_send_layers: this rank's target layers (0 for NULL). */
KVB_API uint32_t kvb_sender_num_layers(kvb_sender_h sender);

/* Hybrid models (Mamba / linear-attention state buffers in kv_args): this
 * request's state slots on the prefill, one per state index the decode
 * passed to kvb_receiver_init; sent with the last chunk (the seeds'
 * send(kv_indices, state_indices)). Call before the chunk that reaches
 * num_kv_indices; a later call replaces the earlier. The array is copied.
 * A count different from the decode's fails the room with both counts.
 * State needs the same attention TP size on both sides. Errors:
 * KVB_ERR_INVALID (negative index), KVB_ERR_STATE (last chunk already sent),
 * KVB_ERR_NOMEM. */
KVB_API kvb_status_t kvb_sender_set_state_indices(kvb_sender_h sender, const int32_t *indices,
                                                  size_t count);

/* TokenSpeed decodes (PROTOCOL-TOKENSPEED.md 4.4, 8.6): the first output
 * token the prefill sampled and the optional speculative candidate token
 * ids, sent in this room's Success status to every TokenSpeed decode (they
 * have no aux buffers). Without this call the token is the first int32 of
 * this prefill's aux buffer 0 at the sender's aux_index (SGLang's output_ids
 * slot) when the prefill has aux buffers, else -1 (the decode then resumes
 * from the wrong position). Call before the last chunk; the array is copied
 * (at most 4096 candidates). SGLang decodes never see it. Errors:
 * KVB_ERR_INVALID (too many, NULL with count), KVB_ERR_NOMEM. */
KVB_API kvb_status_t kvb_sender_set_first_token(kvb_sender_h sender, int64_t token,
                                                const int32_t *candidates, size_t count);

/* TokenSpeed 0.1.1 decodes (CachePD, PROTOCOL-TOKENSPEED-CACHEPD.md 4.4):
 * what else its Success status carries. cached_tokens: this prefill's
 * prefix-cache hit for the request, in tokens (the decode resumes from the
 * larger of its own and this; default 0; at most 2^63 - 1). logprob: the
 * first token's log-probability, when the request asked for logprobs
 * (default: none; NaN is refused). Call before the last chunk; other
 * dialects' decodes never see them. Errors: KVB_ERR_INVALID, KVB_ERR_NOMEM. */
KVB_API kvb_status_t kvb_sender_set_cached_tokens(kvb_sender_h sender, uint64_t cached_tokens);
KVB_API kvb_status_t kvb_sender_set_first_logprob(kvb_sender_h sender, double logprob);

/* Current status; checks the bootstrap time-out. */
KVB_API kvb_poll_t kvb_sender_poll(kvb_sender_h sender);

/* kvb_sender_poll of senders[0..count) into polls_p[0..count), with one
 * lock round trip per run of consecutive senders of the same manager
 * instead of one per sender (a rank with thousands of rooms in flight).
 * The same answers and effects as polling each in turn; the caller owns
 * both arrays; each sender follows kvb_sender_poll's threading rule.
 * KVB_ERR_INVALID (NULL array with count > 0, a NULL handle): nothing polled. */
KVB_API kvb_status_t kvb_sender_poll_many(kvb_sender_h const *senders, size_t count,
                                          kvb_poll_t *polls_p);

/* Fail the room "Aborted by AbortReq.": no write for it is issued after this
 * returns; the decode is told (status Failed) once writes already issued
 * have settled. */
KVB_API void kvb_sender_abort(kvb_sender_h sender);

/* The recorded failure reason (or "Failed due to an unknown reason from
 * another rank"); the record is forgotten, as the seeds' failure_exception.
 * Copied into buf (NUL-terminated, truncated to len). */
KVB_API void kvb_sender_failure(kvb_sender_h sender, char *buf, size_t len);

/* Forget the room (the seeds' clear) and free the sender. */
KVB_API void kvb_sender_destroy(kvb_sender_h sender);

/* ---- receiver (decode) ---- */

/* Create the receiver of room: fetch the prefill parallel info (cached per
 * bootstrap address), choose the source ranks, resolve them (cached) and
 * send this rank's KV arguments once per prefill rank. dp_rank < 0 = route by
 * room % prefill DP size. Failures are not returned: the receiver is created
 * and polls Failed with the seeds' reason (as the seeds do). Errors returned:
 * KVB_ERR_STATE (not a decode manager), KVB_ERR_INVALID, KVB_ERR_NOMEM. */
KVB_API kvb_status_t kvb_receiver_create(kvb_manager_h manager, const char *bootstrap_addr,
                                         uint64_t room, int32_t dp_rank,
                                         kvb_receiver_h *receiver_p);

enum kvb_receiver_init_field {
    KVB_RECV_INIT_STATE = 1u << 0,  /* state_indices, num_state_indices */
    KVB_RECV_INIT_PREFIX = 1u << 1, /* prefix_tokens */
    KVB_RECV_INIT_MASK = 1u << 2,   /* page_mask */
    KVB_RECV_INIT_PROMPT = 1u << 3, /* prompt_tokens */
};

/* Extras of init (kvbridge extensions, sent as trailing frames). */
typedef struct kvb_receiver_init {
    uint64_t field_mask;
    const int32_t *state_indices;
    size_t num_state_indices;
    uint64_t prefix_tokens;   /* tokens already on the decode (multiple of page) */
    const uint8_t *page_mask; /* one byte per index: 1 = needs data */
    /* The request's prompt length in tokens, which a TokenSpeed 0.1.1
     * (CachePD) prefill needs exactly in the block manifest (its prefill
     * raises on a shorter one and sends a last partial page only when the
     * prompt ends there). Without it: count x page_size. Must lie in
     * ((count - 1) x page_size, count x page_size] and above prefix_tokens;
     * other dialects do not carry it. */
    uint64_t prompt_tokens;
} kvb_receiver_init_t;

/* Send the pre-allocation (destination page indices, aux index) to every
 * source; status → WaitingForInput. extra may be NULL. aux_index < 0 means
 * "none": allowed only when this manager registered no aux buffers (nothing
 * aux is then written into it); with aux buffers it is KVB_ERR_INVALID and
 * nothing is sent (the reason names the room). Every index the prefill will
 * write (page mask 1, or no mask) must be below this rank's KV pool (the
 * smallest kv_data_lens / kv_item_len): otherwise nothing is sent, the room
 * fails with the offending index in its reason and KVB_ERR_INVALID is
 * returned. */
KVB_API kvb_status_t kvb_receiver_init(kvb_receiver_h receiver, const int32_t *indices,
                                       size_t count, int64_t aux_index,
                                       const kvb_receiver_init_t *extra);

/* Current status; checks the waiting time-out. A failed room (any cause:
 * Failed status, abort, time-out, prefill lost) is reported Failed only
 * once nothing more of it can land in its pages: every source that got the
 * room's writer grant has it revoked and drained, every other source (no
 * "kvbridge" key, TokenSpeed) confirmed (terminal status or abort ack).
 * Until then it reads Transferring, so a framework that reuses pages on
 * Failed is safe without asking. Bounded: KVBRIDGE_ABORT_ACK_TIMEOUT (30 s)
 * after the failure it is reported Failed anyway, its reason then says the
 * pages are NOT safe to reuse, and kvb_receiver_pages_safe() says when they
 * are (docs/engine.md, "The writer fence"). */
KVB_API kvb_poll_t kvb_receiver_poll(kvb_receiver_h receiver);

/* kvb_receiver_poll of receivers[0..count) into polls_p[0..count), one lock
 * round trip per run of receivers of the same manager (a failed room is
 * then polled alone: its writer fence decides when Failed is final).
 * Errors as kvb_sender_poll_many. */
KVB_API kvb_status_t kvb_receiver_poll_many(kvb_receiver_h const *receivers, size_t count,
                                            kvb_poll_t *polls_p);

/* Abort: record "Aborted by AbortReq." and tell the sources to stop. */
KVB_API void kvb_receiver_abort(kvb_receiver_h receiver);

/* Copy the room's failure reason into buf (at most len - 1 bytes and a NUL)
 * and consume it, as the seeds pop it: a second call gives the generic
 * "Failed due to an unknown reason..." text. Any thread. */
KVB_API void kvb_receiver_failure(kvb_receiver_h receiver, char *buf, size_t len);

/* TokenSpeed prefills (PROTOCOL-TOKENSPEED.md 4.4, 8.6; they have no aux
 * data): the first output token and speculative candidate token ids their
 * Success statuses carried (the first token other than -1 seen among the
 * room's sources, with its candidates). 1 when known: *token_p, the
 * candidates copied into cands (at most cap), *n_p (optional) how many there
 * were; 0 otherwise (another dialect, or not arrived yet). Any thread. */
KVB_API int kvb_receiver_first_token(kvb_receiver_h receiver, int64_t *token_p, int32_t *cands,
                                     size_t cap, size_t *n_p);

/* TokenSpeed 0.1.1 prefills (CachePD, PROTOCOL-TOKENSPEED-CACHEPD.md 4.4),
 * the twins of kvb_sender_set_cached_tokens / kvb_sender_set_first_logprob:
 * what the room's Success statuses carried besides the first token. The
 * prefill's prefix-cache hit in tokens (the largest among the room's
 * sources, as TokenSpeed's decode keeps it) and the first token's
 * logprob (the first seen; absent when the request asked for none). 1 when
 * known (*cached_p / *logprob_p), 0 otherwise (another dialect, none said,
 * not arrived yet). Any thread. */
KVB_API int kvb_receiver_cached_tokens(kvb_receiver_h receiver, uint64_t *cached_p);
KVB_API int kvb_receiver_first_logprob(kvb_receiver_h receiver, double *logprob_p);

/* 1 when nothing can land in the room's pages any more: Success, or Failed
 * with every source quiescent (its revoked grant has no write left in
 * flight, or, without a grant, it confirmed); 0 while the room runs or a
 * source may still write (re-checked on each call). Call before
 * kvb_receiver_destroy. Any thread. */
KVB_API int kvb_receiver_pages_safe(kvb_receiver_h receiver);

/* Forget the room and free the receiver. Destroying a room that is not
 * terminal aborts it first (without waiting for the fence). */
KVB_API void kvb_receiver_destroy(kvb_receiver_h receiver);

/* ---- timelines: where a room is (docs/observe.md) ----
 * Each room records monotonic stamps of the events of its path in a fixed
 * ring (the first KVB_TIMELINE_HEAD events are kept, then the newest; the
 * rest are counted as dropped), written without a lock. KVBRIDGE_TIMELINE=0
 * turns recording off (timelines then read empty). One row per event:
 * XX(id, name, what it means). */
#define KVB_EVENT_MAP(XX)                                                                          \
    XX(CREATED, "created", "the room exists here (a handle, or a peer's message named it)")        \
    XX(BOOTSTRAP_ASKED, "bootstrap_asked", "decode: a bootstrap server look-up started")           \
    XX(BOOTSTRAP_ANSWERED, "bootstrap_answered",                                                   \
       "decode: the look-ups ended (value: status, 0 ok; detail: why not)")                        \
    XX(REGISTRATION_SENT, "registration_sent", "decode: KV args sent to a source (detail)")        \
    XX(REGISTRATION_RECEIVED, "registration_received",                                             \
       "prefill: when the destination's KV args had arrived (detail: session)")                    \
    XX(TRANSFER_INFO_SENT, "transfer_info_sent", "decode: pre-allocation handed to the socket")    \
    XX(TRANSFER_INFO_RECEIVED, "transfer_info_received",                                           \
       "prefill: a destination's pre-allocation arrived (detail: session)")                        \
    XX(CHUNK_PLANNED, "chunk_planned",                                                             \
       "prefill: a chunk's writes planned (value: pages; detail: first page)")                     \
    XX(FIRST_WRITE_POSTED, "first_write_posted", "prefill: the room's first write was issued")     \
    XX(LAST_WRITE_DONE, "last_write_done",                                                         \
       "prefill: the last chunk's writes to a destination settled (value: status; detail: "        \
       "session)")                                                                                 \
    XX(STATUS_SENT, "status_sent", "prefill: a status sent to a decode (value: kvb_poll_t)")       \
    XX(STATUS_RECEIVED, "status_received",                                                         \
       "decode: a source's status arrived (value: kvb_poll_t; detail: rank)")                      \
    XX(ABORT_SENT, "abort_sent", "decode: an abort sent to a source (detail)")                     \
    XX(ABORT_RECEIVED, "abort_received", "prefill: a decode asked to abort (detail)")              \
    XX(ABORT_ACK_SENT, "abort_ack_sent", "prefill: an abort acknowledged to a decode (detail)")    \
    XX(ABORT_ACK_RECEIVED, "abort_ack_received", "decode: a source acknowledged the abort")        \
    XX(FENCE_HOLD, "fence_hold",                                                                   \
       "decode: failed, held Transferring while a source may write (detail: reason)")              \
    XX(FENCE_RELEASE, "fence_release", "decode: the hold ended (detail: reason)")                  \
    XX(TERMINAL, "terminal",                                                                       \
       "the room ended (value: kvb_poll_t; detail: success, or the failure as \"<class> in "       \
       "<stage>: <reason>\")")

typedef enum kvb_event {
#define KVB_EVENT_ENUM_(id, name, what) KVB_EV_##id,
    KVB_EVENT_MAP(KVB_EVENT_ENUM_)
#undef KVB_EVENT_ENUM_
        KVB_EV_COUNT
} kvb_event_t;

/* The event's name ("created", ...; "unknown" out of range). Static; any thread. */
KVB_API const char *kvb_event_name(kvb_event_t event);

#define KVB_TIMELINE_HEAD 12  /* first events always kept */
#define KVB_TIMELINE_SLOTS 32 /* events kept per room in all */
#define KVB_TIMELINE_DETAIL 64

typedef struct kvb_timeline_event {
    kvb_event_t event;
    double t_s;    /* seconds since the room was created (negative: before, e.g. a
                      registration that came first) */
    int64_t value; /* per event (kvb_event_name's table): a status, a count, or 0 */
    char detail[KVB_TIMELINE_DETAIL]; /* NUL-terminated, truncated; "" when none */
} kvb_timeline_event_t;

typedef struct kvb_timeline {
    uint64_t field_mask; /* none defined yet: 0 */
    uint64_t room;
    double age_s;     /* seconds since creation when the snapshot was taken: with the last
                         event, how long the room has been in its stage */
    uint64_t dropped; /* events recorded but not here: past the ring (or, rarely, lost to a
                         concurrent writer of the same record, or being written) */
    size_t n;         /* events[0..n), in the order they were recorded */
    kvb_timeline_event_t *events;
} kvb_timeline_t;

/* A snapshot of the sender's / receiver's room timeline into *tl_p (owned
 * by the caller: kvb_timeline_free). No lock the room's writes wait on is
 * taken; events recorded while copying may be missing. Thread-safe.
 * Errors: KVB_ERR_INVALID (NULL), KVB_ERR_NOMEM. */
KVB_API kvb_status_t kvb_sender_timeline(kvb_sender_h sender, kvb_timeline_t **tl_p);
KVB_API kvb_status_t kvb_receiver_timeline(kvb_receiver_h receiver, kvb_timeline_t **tl_p);
/* Free a snapshot (NULL-safe). */
KVB_API void kvb_timeline_free(kvb_timeline_t *tl);

#ifdef __cplusplus
}
#endif
#endif
