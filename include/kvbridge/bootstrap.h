/* kvbridge bootstrap: the HTTP service where prefill ranks register their
 * control address and decode ranks look them up (wire-compatible with
 * SGLang's and TokenSpeed's Mooncake bootstrap server; see docs/bootstrap.md).
 *
 * Server: kvb_bootstrap_server_start() runs libmicrohttpd's own threads; the
 * handle is thread-safe (every function may be called from any thread) except
 * that kvb_bootstrap_server_stop() must not race other calls on it.
 *
 * Client: a kvb_bootstrap_client_h owns one HTTP connection (reused between
 * calls: keep-alive for heartbeats). A client is thread-safe: calls on one
 * handle are serialised by an internal lock, so use one client per thread
 * where requests must run in parallel. */
#ifndef KVBRIDGE_BOOTSTRAP_H
#define KVBRIDGE_BOOTSTRAP_H

#include <kvbridge/common.h>

#ifdef __cplusplus
extern "C" {
#endif

/* SGLang's default bootstrap port. */
#define KVB_BOOTSTRAP_DEFAULT_PORT 8998
/* Largest request or response body either side accepts (bytes): room for
 * TokenSpeed 0.1.1's layout contract (up to 256 KiB, sent as a JSON string
 * in its PUT and parallel-info bodies). Buffers grow with what arrives. */
#define KVB_BOOTSTRAP_MAX_BODY (1024 * 1024)
/* Longest accepted rank_ip (an IP literal or a host name), in bytes. */
#define KVB_BOOTSTRAP_IP_MAX 255
/* Longest kv_cache_dtype / load_balance_method string, in bytes. */
#define KVB_BOOTSTRAP_WORD_MAX 64

/* Which SGLang bootstrap dialect a client speaks (docs/bootstrap.md): 2025 is
 * seed 001 (SGLang 0.5.2rc2, PROTOCOL.md: engine_rank/target_dp_group
 * queries, registration with "role"); 2026 is SGLang main of 2026-08
 * (PROTOCOL-SGLANG-2026.md 3: prefill_dp_rank/prefill_cp_rank/target_tp_rank
 * queries, 503 until every rank registered, page_size/kv_cache_dtype in the
 * registration). The server always answers both. */
typedef enum kvb_bootstrap_dialect {
    KVB_BOOTSTRAP_DIALECT_DEFAULT = 0, /* KVBRIDGE_SGLANG_DIALECT=2025|2026, else 2026 */
    KVB_BOOTSTRAP_DIALECT_2025 = 2025,
    KVB_BOOTSTRAP_DIALECT_2026 = 2026,
    /* Only as an answer's dialect (kvb_bootstrap_parallel_info_ext_t): a
     * TokenSpeed (seed 004) server answered the seed-001 query in its own
     * shape (PROTOCOL-TOKENSPEED.md 11.3); its ranks speak TokenSpeed's
     * ZeroMQ dialect. Not a client setting. */
    KVB_BOOTSTRAP_DIALECT_TOKENSPEED = 4,
    /* Only as an answer's dialect: TokenSpeed 0.1.1 "CachePD" prefill ranks
     * (PROTOCOL-TOKENSPEED-CACHEPD.md 3.2; cache_layout and
     * cache_fields_by_stage, no other dialect's keys). The info then holds
     * the intra-stage TP, DP and PP sizes; the layout contract is read by
     * kvbridge's decode. Not a client setting. */
    KVB_BOOTSTRAP_DIALECT_CACHEPD = 5,
} kvb_bootstrap_dialect_t;

/* ------------------------------------------------------------------ server */

typedef struct kvb_bootstrap_server *kvb_bootstrap_server_h;

enum kvb_bootstrap_server_param_field {
    KVB_BOOTSTRAP_SERVER_PARAM_HOST = 1u << 0,
    KVB_BOOTSTRAP_SERVER_PARAM_PORT = 1u << 1,
    KVB_BOOTSTRAP_SERVER_PARAM_TOKEN = 1u << 2,
    KVB_BOOTSTRAP_SERVER_PARAM_AUTH_READS = 1u << 3,
    KVB_BOOTSTRAP_SERVER_PARAM_THREADS = 1u << 4,
    KVB_BOOTSTRAP_SERVER_PARAM_CONN_TIMEOUT = 1u << 5,
    KVB_BOOTSTRAP_SERVER_PARAM_DP_ROOMS = 1u << 6, /* dp_room_ttl_s, max_dp_rooms */
};

/* Server parameters; only the fields named in field_mask are read, the others
 * take their defaults (shown). */
typedef struct kvb_bootstrap_server_params {
    uint64_t field_mask;
    const char *host;      /* listen address, "127.0.0.1"; an IPv6 literal ("::1")
                              listens on IPv6; "::" listens on IPv6 and IPv4 */
    uint16_t port;         /* listen port, 8998; 0 = ephemeral (see _port()) */
    const char *token;     /* bearer token PUT /route must carry; default from
                              KVBRIDGE_BOOTSTRAP_TOKEN; NULL or "" = no auth.
                              Copied at start. */
    int auth_reads;        /* non-zero: GET /route and /metrics need the token
                              too (/health stays open), 0 */
    unsigned threads;      /* libmicrohttpd worker threads, 4 (1..64) */
    double conn_timeout_s; /* an idle or stalled connection is closed after
                              this many seconds, 10 (1..3600) */
    /* POST /register_dp_rank entries (2026 dialect): each is answered by
     * /query_dp_ranks for dp_room_ttl_s seconds, default 120 (0.01..86400)
     * [KVBRIDGE_BOOTSTRAP_ENTRY_CLEANUP_INTERVAL, or SGLang's
     * SGLANG_DISAGGREGATION_BOOTSTRAP_ENTRY_CLEANUP_INTERVAL]; at most
     * max_dp_rooms live entries, default 262144 (1..2^24; about 24 bytes x 2
     * each): more is a 503. */
    double dp_room_ttl_s;
    size_t max_dp_rooms;
} kvb_bootstrap_server_params_t;

/* Start a bootstrap server (NULL params = all defaults). Listening when this
 * returns. On success *server_p is set. Errors: KVB_ERR_INVALID (bad
 * parameter, unresolvable host), KVB_ERR_IO (socket/bind/listen failed, e.g.
 * address in use), KVB_ERR_NOMEM; the reason is logged. Any thread. */
KVB_API kvb_status_t kvb_bootstrap_server_start(const kvb_bootstrap_server_params_t *params,
                                                kvb_bootstrap_server_h *server_p);

/* Close the listening socket and every open connection (clients in the middle
 * of a request see the connection close), join the server's threads and free
 * everything. NULL is a no-op. Must not race other calls on this server. */
KVB_API void kvb_bootstrap_server_stop(kvb_bootstrap_server_h server);

/* The port actually bound (the ephemeral one when started with port 0). */
KVB_API uint16_t kvb_bootstrap_server_port(kvb_bootstrap_server_h server);

/* The address clients use: "host:port", or "[v6addr]:port" for IPv6. Owned by
 * the server, valid until stop. */
KVB_API const char *kvb_bootstrap_server_address(kvb_bootstrap_server_h server);

/* Number of (dp_group, cp_rank, tp_rank, pp_rank) entries registered so far. */
KVB_API size_t kvb_bootstrap_server_num_ranks(kvb_bootstrap_server_h server);

/* ------------------------------------------------------------------ client */

typedef struct kvb_bootstrap_client *kvb_bootstrap_client_h;

enum kvb_bootstrap_client_param_field {
    KVB_BOOTSTRAP_CLIENT_PARAM_TIMEOUT = 1u << 0,
    KVB_BOOTSTRAP_CLIENT_PARAM_TOKEN = 1u << 1,
    KVB_BOOTSTRAP_CLIENT_PARAM_DIALECT = 1u << 2,
};

typedef struct kvb_bootstrap_client_params {
    uint64_t field_mask;
    double timeout_s;  /* default bound of each call (connect + request +
                          answer), 5 s; a call's own timeout_s > 0 wins */
    const char *token; /* sent as "Authorization: Bearer <token>" on every
                          request; default from KVBRIDGE_BOOTSTRAP_TOKEN; NULL
                          or "" = none. Copied. */
    int dialect;       /* kvb_bootstrap_dialect_t, DEFAULT (see there). A 2026
                          client whose query a server answers 400 "Missing
                          inputs for bootstrap server." (a seed-001 server)
                          asks again in the 2025 style and keeps speaking 2025
                          to that server (kvb_bootstrap_client_dialect()). */
} kvb_bootstrap_client_params_t;

/* Create a client for the server at addr: "host:port" or "[v6addr]:port" (the
 * seeds' bootstrap_addr). No connection is made yet. Errors: KVB_ERR_INVALID
 * (malformed addr or parameter; logged), KVB_ERR_NOMEM. */
KVB_API kvb_status_t kvb_bootstrap_client_create(const char *addr,
                                                 const kvb_bootstrap_client_params_t *params,
                                                 kvb_bootstrap_client_h *client_p);

/* Close the connection and free the client. NULL is a no-op. Must not race
 * other calls on this client. */
KVB_API void kvb_bootstrap_client_destroy(kvb_bootstrap_client_h client);

/* Detailed text of the last failed call on this client: the method, the URL
 * and what was wrong. Copied to thread-local storage (valid until this
 * thread's next call of this function); "" when none. */
KVB_API const char *kvb_bootstrap_client_last_error(kvb_bootstrap_client_h client);

/* A list of byte lengths (layout keys); values are not modified or kept. */
typedef struct kvb_bootstrap_lens {
    uint64_t *values;
    size_t count;
} kvb_bootstrap_lens_t;

enum kvb_bootstrap_reg_field {
    KVB_BOOTSTRAP_REG_KV_ITEM_LENS = 1u << 0,
    KVB_BOOTSTRAP_REG_KV_UNIT_LENS = 1u << 1,
    KVB_BOOTSTRAP_REG_STATE_ITEM_LENS = 1u << 2,
    KVB_BOOTSTRAP_REG_STATE_UNIT_LENS = 1u << 3,
    KVB_BOOTSTRAP_REG_MLA_L1_5_CACHE = 1u << 4,
    KVB_BOOTSTRAP_REG_LAYOUT_JSON = 1u << 5,
    /* 2026 keys (sent by a 2026 client only; defaults in brackets) */
    KVB_BOOTSTRAP_REG_CP = 1u << 6,             /* attn_cp_size, attn_cp_rank [1, 0] */
    KVB_BOOTSTRAP_REG_PAGE_SIZE = 1u << 7,      /* page_size [null] */
    KVB_BOOTSTRAP_REG_KV_CACHE_DTYPE = 1u << 8, /* kv_cache_dtype [null] */
    KVB_BOOTSTRAP_REG_LOAD_BALANCE = 1u << 9,   /* load_balance_method [not sent] */
    KVB_BOOTSTRAP_REG_DSA_SPLIT = 1u << 10,     /* enable_dsa_cache_layer_split [false] */
    KVB_BOOTSTRAP_REG_HTTP_PORT = 1u << 11,     /* prefill_http_port [null] */
    /* "kvbridge": KVB_BOOTSTRAP_KVBRIDGE_VERSION (either dialect; SGLang's
     * servers ignore it): this rank is a kvbridge prefill, so a kvbridge
     * decode may send it kvbridge's extension frames (docs/protocol-frames.md).
     * kvbridge's server repeats it in this rank's look-up answers. [not sent] */
    KVB_BOOTSTRAP_REG_KVBRIDGE = 1u << 12,
};

/* The "kvbridge" value a kvbridge prefill registers: what it understands of
 * a kvbridge decode. 1: the extension frames. 2: also "kv_layout=", a decode
 * of another page size or page order (its planner maps token rows,
 * docs/planner.md); a decode of another layout refuses a prefill below 2,
 * which would write its own. */
#define KVB_BOOTSTRAP_KVBRIDGE_VERSION 2
#define KVB_BOOTSTRAP_KVBRIDGE_LAYOUTS 2 /* the first version that maps layouts */

/* One prefill rank's registration (the body of PUT /route). The integer and
 * address fields are always sent; field_mask names the optional keys sent
 * with it. A 2025 client sends role "Prefill" and the seed-001 keys; a 2026
 * client sends the union body: the same plus attn_cp_size, attn_cp_rank,
 * page_size, kv_cache_dtype, enable_dsa_cache_layer_split, prefill_http_port
 * (and load_balance_method when given), which SGLang's 2026 server reads and
 * its 2025 server ignores. SGLang's 2026 server answers 500 to a null
 * page_size: set KVB_BOOTSTRAP_REG_PAGE_SIZE when registering there. */
typedef struct kvb_bootstrap_registration {
    uint64_t field_mask;
    int32_t attn_tp_size, attn_tp_rank;
    int32_t attn_dp_size, attn_dp_rank;
    int32_t pp_size, pp_rank;
    int32_t system_dp_size, system_dp_rank;
    const char *rank_ip;                                   /* this rank's control-socket address */
    uint16_t rank_port;                                    /* 1..65535 */
    kvb_bootstrap_lens_t kv_item_lens, kv_unit_lens;       /* values >= 1 */
    kvb_bootstrap_lens_t state_item_lens, state_unit_lens; /* values >= 1 */
    int enable_mla_l1_5_cache;
    const char *layout_json;            /* kvbridge's layout description: a JSON object */
    int32_t attn_cp_size, attn_cp_rank; /* 1..65536, below attn_cp_size */
    int32_t page_size;                  /* tokens per page, >= 1 */
    const char *kv_cache_dtype;         /* e.g. "auto"; NULL = null; 1..64 bytes
                                           of [A-Za-z0-9_.:+-] */
    const char *load_balance_method;    /* e.g. "follow_bootstrap_room"; same charset */
    int enable_dsa_cache_layer_split;
    uint16_t prefill_http_port; /* 0 = null */
} kvb_bootstrap_registration_t;

/* What GET /route with -1/-1/-1 answers. Arrays are owned by the struct:
 * release with kvb_bootstrap_parallel_info_free(). A key the server did not
 * know leaves its list empty (values NULL, count 0) / layout_json NULL. */
typedef struct kvb_bootstrap_parallel_info {
    int32_t attn_tp_size; /* prefill_attn_tp_size (= prefill_tp_size) */
    int32_t dp_size;      /* prefill_dp_size */
    int32_t pp_size;      /* prefill_pp_size */
    int enable_mla_l1_5_cache;
    kvb_bootstrap_lens_t kv_item_lens, kv_unit_lens;
    kvb_bootstrap_lens_t state_item_lens, state_unit_lens;
    char *layout_json; /* compact JSON text of "kvbridge_layout", or NULL */
} kvb_bootstrap_parallel_info_t;

enum kvb_bootstrap_info_ext_field {
    KVB_BOOTSTRAP_INFO_DIALECT = 1u << 0,
    KVB_BOOTSTRAP_INFO_CP_SIZE = 1u << 1,
    KVB_BOOTSTRAP_INFO_PAGE_SIZE = 1u << 2,
    KVB_BOOTSTRAP_INFO_KV_CACHE_DTYPE = 1u << 3,
    KVB_BOOTSTRAP_INFO_FOLLOW_ROOM = 1u << 4,
    KVB_BOOTSTRAP_INFO_DSA_SPLIT = 1u << 5,
    KVB_BOOTSTRAP_INFO_HTTP_PORT = 1u << 6,
};

/* What the 2026 parallel info adds (SGLang's PrefillServerInfo). The caller
 * sets field_mask to the fields it wants; only those are written (a caller
 * built against an older, shorter struct stays safe). A seed-001 server's
 * answer gives the defaults shown. */
typedef struct kvb_bootstrap_parallel_info_ext {
    uint64_t field_mask;
    int dialect; /* 2025, 2026, 4 (TokenSpeed) or 5 (CachePD): the style the server answered */
    int32_t attn_cp_size;                            /* 1 */
    int32_t page_size;                               /* -1 = unknown (null) */
    char kv_cache_dtype[KVB_BOOTSTRAP_WORD_MAX + 1]; /* "" = unknown (null) */
    int follow_bootstrap_room;                       /* 1: DP group = room % dp_size; 0: ask
                                                        kvb_bootstrap_client_query_dp_ranks() */
    int enable_dsa_cache_layer_split;                /* 0 */
    int32_t prefill_http_port;                       /* 0 = unknown (null) */
} kvb_bootstrap_parallel_info_ext_t;

/* Free what a parallel info owns and zero it. NULL is a no-op. */
KVB_API void kvb_bootstrap_parallel_info_free(kvb_bootstrap_parallel_info_t *info);

/* One prefill rank's control address, answer of a rank lookup. */
typedef struct kvb_bootstrap_rank_addr {
    char rank_ip[KVB_BOOTSTRAP_IP_MAX + 1];
    uint16_t rank_port;
} kvb_bootstrap_rank_addr_t;

enum kvb_bootstrap_rank_ext_field {
    KVB_BOOTSTRAP_RANK_KVBRIDGE = 1u << 0,
};

/* What a rank look-up answer may add to the address; only the fields named
 * in field_mask are written. */
typedef struct kvb_bootstrap_rank_ext {
    uint64_t field_mask;
    int kvbridge; /* the answer's "kvbridge": the version the rank registered
                     as a kvbridge prefill (KVB_BOOTSTRAP_REG_KVBRIDGE,
                     KVB_BOOTSTRAP_KVBRIDGE_VERSION); 0 when absent (any other
                     prefill, or a server that does not keep it) */
} kvb_bootstrap_rank_ext_t;

/* Errors common to the calls below (each with the detail in _last_error()):
 * KVB_ERR_TIMEOUT  no full answer within the bound;
 * KVB_ERR_PEER     connection refused, reset or closed without an answer;
 * KVB_ERR_AUTH     the server answered 401 (token missing or wrong);
 * KVB_ERR_PROTO    any other unexpected status, or a body that is not what
 *                  the protocol says (too large, not JSON, missing key, bad
 *                  value);
 * KVB_ERR_INVALID  a bad argument (nothing sent);
 * KVB_ERR_NOMEM.
 * timeout_s <= 0 uses the client's default. */

/* PUT /route: register a prefill rank. The registration is validated locally
 * first (KVB_ERR_INVALID). A 400 from the server is KVB_ERR_PROTO with the
 * server's reason in the message. */
KVB_API kvb_status_t kvb_bootstrap_client_register(kvb_bootstrap_client_h client,
                                                   const kvb_bootstrap_registration_t *reg,
                                                   double timeout_s);

/* The parallel info. 2025: GET
 * /route?engine_rank=-1&target_dp_group=-1&target_pp_rank=-1. 2026: GET
 * /route?prefill_dp_rank=-1&prefill_cp_rank=-1&target_tp_rank=-1&target_pp_rank=-1
 * &kvbridge_layout=1 (the last key asks kvbridge's server for its layout
 * keys; other servers ignore it); a 503 (not every rank registered yet) is
 * asked again, backing off from 50 to 500 ms, until the call's time-out. On
 * success *info_p is filled (free it with kvb_bootstrap_parallel_info_free).
 * KVB_ERR_NOT_FOUND: no prefill rank registered yet (404), or still 503 when
 * the time-out ran out. */
KVB_API kvb_status_t kvb_bootstrap_client_parallel_info(kvb_bootstrap_client_h client,
                                                        double timeout_s,
                                                        kvb_bootstrap_parallel_info_t *info_p);

/* Same, also filling the fields of *ext_p that ext_p->field_mask names
 * (ext_p may be NULL). */
KVB_API kvb_status_t kvb_bootstrap_client_parallel_info_ext(
    kvb_bootstrap_client_h client, double timeout_s, kvb_bootstrap_parallel_info_t *info_p,
    kvb_bootstrap_parallel_info_ext_t *ext_p);

/* One prefill rank's address. 2025: GET
 * /route?engine_rank=tp_rank&target_dp_group=dp_group&target_pp_rank=pp_rank.
 * 2026: GET /route?prefill_dp_rank=dp_group&prefill_cp_rank=0
 * &target_tp_rank=tp_rank&target_pp_rank=pp_rank. On success *addr_p is
 * filled. KVB_ERR_NOT_FOUND: that rank is not registered (404), or (2026) not
 * every prefill rank is (503: not retried, as SGLang's decode fails the room;
 * ask the parallel info first). Negative ranks are KVB_ERR_INVALID. */
KVB_API kvb_status_t kvb_bootstrap_client_lookup(kvb_bootstrap_client_h client, int32_t dp_group,
                                                 int32_t tp_rank, int32_t pp_rank, double timeout_s,
                                                 kvb_bootstrap_rank_addr_t *addr_p);

/* The same with a prefill attention-CP rank (2026 only: cp_rank > 0 on a
 * client speaking 2025 is KVB_ERR_INVALID, nothing sent). */
KVB_API kvb_status_t kvb_bootstrap_client_lookup_cp(kvb_bootstrap_client_h client, int32_t dp_group,
                                                    int32_t cp_rank, int32_t tp_rank,
                                                    int32_t pp_rank, double timeout_s,
                                                    kvb_bootstrap_rank_addr_t *addr_p);

/* The same, also filling the fields of *ext_p that ext_p->field_mask names
 * (ext_p may be NULL). */
KVB_API kvb_status_t kvb_bootstrap_client_lookup_ext(kvb_bootstrap_client_h client,
                                                     int32_t dp_group, int32_t cp_rank,
                                                     int32_t tp_rank, int32_t pp_rank,
                                                     double timeout_s,
                                                     kvb_bootstrap_rank_addr_t *addr_p,
                                                     kvb_bootstrap_rank_ext_t *ext_p);

/* POST /register_dp_rank {"bootstrap_room": room, "dp_rank": dp_rank} (2026;
 * a prefill rank tells which DP group serves room). dp_rank 0..65535. A room
 * above 2^63-1 is sent as a decimal string (SGLang's int() takes it; 64-bit
 * signed JSON parsers do not take such a number). */
KVB_API kvb_status_t kvb_bootstrap_client_register_dp_rank(kvb_bootstrap_client_h client,
                                                           uint64_t room, int32_t dp_rank,
                                                           double timeout_s);

/* POST /query_dp_ranks {"bootstrap_rooms": [...]} (2026): dp_ranks_p[i] gets
 * the DP group registered for rooms[i], -1 when the server does not know it
 * (yet). n 1..16384. */
KVB_API kvb_status_t kvb_bootstrap_client_query_dp_ranks(kvb_bootstrap_client_h client,
                                                         const uint64_t *rooms, size_t n,
                                                         double timeout_s, int32_t *dp_ranks_p);

/* The dialect this client speaks now: the configured one, or 2025 after a
 * 2026 client fell back (see kvb_bootstrap_client_params_t.dialect). */
KVB_API int kvb_bootstrap_client_dialect(kvb_bootstrap_client_h client);

/* GET /health: KVB_OK when the server answered 200. Reuses the client's
 * kept-alive connection (heartbeats). */
KVB_API kvb_status_t kvb_bootstrap_client_health(kvb_bootstrap_client_h client, double timeout_s);

#ifdef __cplusplus
}
#endif
#endif
