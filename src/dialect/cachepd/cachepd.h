/* TokenSpeed 0.1.1 "CachePD" dialect (internal): codec and planner.
 *
 * Wire reference: ../shared/spec/PROTOCOL-TOKENSPEED-CACHEPD.md (cited "spec
 * N"); field table: docs/tokenspeed-cachepd-fields.md. Where the spec and
 * TokenSpeed 0.1.1's code differ, this module follows the code.
 *
 * What lives here, and nothing else of kvbridge does (no connector, no
 * sockets, no engine):
 * - the typed layout contract (CacheTransferContract): strict parser,
 *   validator (every page of every field inside the registered slab,
 *   overflow-checked) and the canonical encoder, byte-identical to
 *   TokenSpeed's to_wire_bytes() (spec 5.1-5.3, 6);
 * - the block manifest (CachePDBlockManifest) and its validation (5.4);
 * - the three ZeroMQ messages: 8-frame registration, 3-frame pre-allocation
 *   request, 5-7-frame status (4.2-4.4);
 * - the bootstrap JSON shapes: PUT /route body, parallel-info and per-rank
 *   GET answers, and the server's cross-rank checks (3);
 * - the planner both sides run (7): peer compatibility, whole-copy and
 *   fragment routes, head partitions, DCP owner filters, PP stages, dummy
 *   ranks and fan-out, and the copy list as strided blocks.
 *
 * Conventions: functions return KVB_OK or an error code and write their
 * outputs only on success. A refusal of peer data is KVB_ERR_PROTO with a
 * one-line printable reason in err->reason (err may be NULL) that names the
 * message, the field and the value; err->has_room/room say whether the
 * message's room could be read, so the caller can fail that room with the
 * reason. Bad caller arguments are KVB_ERR_INVALID, allocation failure
 * KVB_ERR_NOMEM. Decoders return views into the input frames where they can
 * (not NUL-terminated; valid while the frames are), and owned objects
 * (contract, manifest, stage placement, route) that the caller frees with
 * the matching *_free (NULL-safe, idempotent). Nothing here keeps global
 * state: every function is reentrant, and const objects may be shared by
 * threads. */
#ifndef KVB_DIALECT_CACHEPD_H
#define KVB_DIALECT_CACHEPD_H

#include "proto/frames.h"

#include <kvbridge/plan.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ---- limits ----
 * TokenSpeed's own bounds (spec 4.2-4.3, 5.1, 7): */
#define KVB__CPD_MAX_CONTRACT_BYTES (256u << 10) /* MAX_CACHE_CONTRACT_WIRE_BYTES */
#define KVB__CPD_MAX_MANIFEST_BYTES (2u << 20)   /* MAX_CACHE_MANIFEST_WIRE_BYTES */
#define KVB__CPD_MAX_TP 1024u                    /* MAX_CACHE_TP_SIZE */
#define KVB__CPD_MAX_PARTS 16u                   /* global_parts entries */
#define KVB__CPD_MAX_ENDPOINT 255u               /* registration frame 1 */
#define KVB__CPD_MAX_SESSION 512u                /* registration frame 3, request frame 1 */
/* kvbridge's own caps on what a peer may make it hold (a 256 KiB contract
 * holds at most about 1400 fields; real models use < 600): */
#define KVB__CPD_MAX_GROUPS 64u        /* cache groups (plan.groups, group_specs) */
#define KVB__CPD_MAX_PLANES 4096u      /* plan.planes */
#define KVB__CPD_MAX_FIELDS 4096u      /* plan.fields, transfer_schema.fields */
#define KVB__CPD_MAX_DIMS 8u           /* rank of a field's shape */
#define KVB__CPD_MAX_ID 128u           /* bytes of a group, plane or field id */
#define KVB__CPD_MAX_STAGES 256u       /* PP stages of cache_fields_by_stage */
#define KVB__CPD_MAX_BLOCKS (1u << 20) /* block ids of one manifest group */

/* Frame counts (spec 4.2-4.4). */
#define KVB__CPD_REG_FRAMES 8
#define KVB__CPD_REQ_FRAMES 3
#define KVB__CPD_STATUS_FRAMES 7     /* what TokenSpeed 0.1.1 always sends */
#define KVB__CPD_STATUS_MIN_FRAMES 5 /* kvbridge's floor (5: the Aug-2026 form) */

/* Status values (TransferPoll, spec 1). Success is 5, not SGLang's 4. */
enum {
    KVB__CPD_FAILED = 0,
    KVB__CPD_BOOTSTRAPPING = 1,
    KVB__CPD_BOOTSTRAPPED = 2,
    KVB__CPD_WAITING_FOR_INPUT = 3,
    KVB__CPD_TRANSFERRING = 4,
    KVB__CPD_SUCCESS = 5
};

/* ================================================================ contract */

typedef enum kvb__cpd_dtype {
    KVB__CPD_UINT8 = 0,
    KVB__CPD_INT8,
    KVB__CPD_FLOAT8_E4M3FN,
    KVB__CPD_FLOAT8_E5M2,
    KVB__CPD_FLOAT8_E8M0FNU,
    KVB__CPD_BFLOAT16,
    KVB__CPD_FLOAT16,
    KVB__CPD_INT32,
    KVB__CPD_FLOAT32,
    KVB__CPD_INT64,
    KVB__CPD_FLOAT64,
    KVB__CPD_DTYPE_COUNT
} kvb__cpd_dtype_t;

/* "bfloat16", ...; "?" out of range. Element bytes: 1, 2, 4 or 8 (0 out of
 * range). Constant, thread-safe. */
const char *kvb__cpd_dtype_name(kvb__cpd_dtype_t dt);
unsigned kvb__cpd_dtype_bytes(kvb__cpd_dtype_t dt);

typedef enum { KVB__CPD_FULL_HISTORY = 0, KVB__CPD_SLIDING_WINDOW = 1 } kvb__cpd_retention_t;
typedef enum { KVB__CPD_HISTORY = 0, KVB__CPD_STATE = 1 } kvb__cpd_family_t;
/* transfer_policy: JSON null, "full_suffix" or "latest_snapshot". null acts
 * as latest_snapshot (spec 7.7) but re-encodes as null. */
typedef enum {
    KVB__CPD_POLICY_NULL = 0,
    KVB__CPD_FULL_SUFFIX = 1,
    KVB__CPD_LATEST_SNAPSHOT = 2
} kvb__cpd_policy_t;

/* plan.groups[] */
typedef struct kvb__cpd_group {
    char *group_id;
    uint64_t blocks_per_lcm; /* cache_blocks_per_lcm_block, >= 1 */
    uint64_t page_count;     /* >= 1; page 0 is the null page */
} kvb__cpd_group_t;

/* plan.planes[] */
typedef struct kvb__cpd_plane {
    char *plane_id;
    uint64_t bytes_per_lcm;
    uint64_t arena_offset;
} kvb__cpd_plane_t;

/* plan.fields[], with what the validator derived from it. */
typedef struct kvb__cpd_field {
    char *group_id, *field_id, *plane_id;
    uint32_t ndim;                     /* 1..KVB__CPD_MAX_DIMS */
    uint64_t shape[KVB__CPD_MAX_DIMS]; /* rank-local, each >= 1 */
    kvb__cpd_dtype_t dtype;
    uint64_t field_offset; /* field_offset_bytes */
    uint64_t page_stride;  /* page_stride_bytes, >= 1 */
    /* derived */
    uint32_t group;    /* index in plan.groups */
    uint32_t spec;     /* index in group_specs */
    uint32_t plane;    /* index in plan.planes */
    int32_t partition; /* index in schema, -1: replicated */
    uint64_t payload;  /* prod(shape) x element bytes: what one page copies */
    uint64_t page0;    /* byte offset of page 0 in the arena (spec 6) */
} kvb__cpd_field_t;

/* group_specs[] (CacheGroupSpec). An optional integer is -1 for JSON null. */
typedef struct kvb__cpd_spec {
    char *group_id;
    kvb__cpd_retention_t retention;
    int64_t rows_per_page;         /* history: >= 1; state: -1 */
    int64_t entry_stride_tokens;   /* history: >= 1; state: -1 */
    int64_t sliding_window_tokens; /* sliding_window: >= 1; else -1 or >= 1 */
    bool replayable;               /* required; only with sliding_window */
    kvb__cpd_family_t family;
    kvb__cpd_policy_t policy;       /* transfer_policy */
    int64_t checkpoint_granularity; /* state: >= 1; history: -1 */
    uint32_t shard_count;           /* 1..KVB__CPD_MAX_TP */
    /* derived */
    uint32_t group;          /* index in plan.groups */
    uint64_t granularity;    /* block_granularity in tokens */
    uint32_t nfields;        /* fields of the group, ... */
    uint32_t *sorted_fields; /* ... their plan.fields indices by field_id (the pairing order) */
} kvb__cpd_spec_t;

/* transfer_schema.fields[] */
typedef struct kvb__cpd_partition {
    char *field_id;
    uint32_t axis;
    uint64_t global_extent;
    uint32_t nparts; /* 0 (JSON []) or 2..16 */
    uint64_t parts[KVB__CPD_MAX_PARTS];
    uint32_t field; /* derived: index in plan.fields */
} kvb__cpd_partition_t;

/* A parsed, validated contract. Owned: free with kvb__cpd_contract_free. */
typedef struct kvb__cpd_contract {
    uint64_t prefix_granularity;  /* >= 1 */
    uint64_t lcm_block_bytes;     /* >= 1 */
    uint64_t num_lcm_blocks;      /* >= 1, excluding the null parent */
    int64_t resident_block_bytes; /* -1: null (absent) */
    uint32_t ngroups, nplanes, nfields, nspecs, nparts;
    kvb__cpd_group_t *groups;
    kvb__cpd_plane_t *planes;
    kvb__cpd_field_t *fields;
    kvb__cpd_spec_t *specs; /* wire order: the manifest's group order */
    kvb__cpd_partition_t *parts;
    uint64_t arena_bytes; /* (num_lcm_blocks + 1) x (resident or lcm) bytes */
} kvb__cpd_contract_t;

/* Parse and validate json[0..len) (spec 5.1, 5.6) into *c_p. Follows
 * TokenSpeed's from_wire_bytes: 1..256 KiB, a JSON object; unknown keys
 * ignored at the top level, in plan, in schema entries and partitions, but
 * refused inside groups/planes/fields/group_specs entries; missing required
 * keys refused, `replayable` included; the group-spec constructor rules; the
 * schema rules. Stricter than TokenSpeed (each a refusal with a reason): JSON
 * types (integers are JSON integers >= 0, booleans booleans), the literals of
 * retention/family/transfer_policy, ids of 1..128 printable ASCII bytes,
 * unique ids, fields and specs naming existing groups and planes, the same
 * group set in plan.groups and group_specs, the caps above, and geometry:
 * every plane inside the arena and every page of every field inside its
 * plane, field_offset + payload <= page_stride, all arithmetic checked for
 * overflow. KVB_ERR_PROTO (reason prefixed "CachePD contract: "),
 * KVB_ERR_NOMEM. */
kvb_status_t kvb__cpd_contract_parse(const uint8_t *json, size_t len, kvb__frames_err_t *err,
                                     kvb__cpd_contract_t *c_p);
void kvb__cpd_contract_free(kvb__cpd_contract_t *c);

/* The canonical wire form (TokenSpeed's to_wire_bytes: compact, keys in
 * dataclass order, nulls written): malloc'ed NUL-terminated text in *json_p,
 * its length in *len_p. Parsing TokenSpeed's bytes and encoding gives them
 * back. KVB_ERR_NOMEM. */
kvb_status_t kvb__cpd_contract_encode(const kvb__cpd_contract_t *c, char **json_p, size_t *len_p);

/* Index of the plan field / group spec named id, -1 if none. */
int32_t kvb__cpd_field_index(const kvb__cpd_contract_t *c, const char *id);
int32_t kvb__cpd_spec_index(const kvb__cpd_contract_t *c, const char *group_id);
/* Byte offset of page `page` of field f in the arena (spec 6); page must be
 * < its group's page_count (the contract's checks keep it in the arena). */
uint64_t kvb__cpd_page_offset(const kvb__cpd_contract_t *c, uint32_t f, uint64_t page);
/* Exclusive bound of a manifest's block ids for spec s:
 * 1 + (page_count - 1) x shard_count (spec 5.4). */
uint64_t kvb__cpd_virtual_blocks(const kvb__cpd_contract_t *c, uint32_t s);

/* A kvbridge rank's own contract, laid out as TokenSpeed 0.1.1's ordinary
 * recipe lays out MHA/GQA and MLA caches (recipes/ordinary.py, spec 6), so
 * a TokenSpeed peer of the same model finds it compatible (spec 7.1): one
 * group "full_attention" (full_suffix, pages of prefix_granularity tokens),
 * per layer token-major fields `layer.<i>.k`/`.v` of shape [page,
 * max(kv_heads / tp, 1), head_dim] in planes `unit.<i>.k`/`.v`
 * partitioned on axis 1 (MHA), or `layer.<i>.latent_kv` [page, 1,
 * latent_dim] in plane `slot.<i>`, replicated (MLA); one page per parent,
 * planes back to back in id order. */
typedef struct kvb__cpd_ordinary {
    bool mla;
    uint32_t num_layers;     /* 1..KVB__CPD_MAX_FIELDS / 2 */
    uint32_t kv_heads;       /* MHA: the model's KV heads */
    uint32_t head_dim;       /* MHA: per head; MLA: latent + rope width */
    uint32_t tp_size;        /* this rank's attention TP size */
    uint32_t page_size;      /* prefix_granularity, tokens per page */
    kvb__cpd_dtype_t dtype;  /* as stored (fp8 caches travel as uint8) */
    uint64_t num_lcm_blocks; /* pages, excluding the null page */
    uint32_t shard_count;    /* MLA DCP; 0 or 1: not sharded */
} kvb__cpd_ordinary_t;

/* Build it (parsed and validated like a peer's). KVB_ERR_INVALID with the
 * reason in err for sizes out of range, KVB_ERR_NOMEM. */
kvb_status_t kvb__cpd_contract_ordinary(const kvb__cpd_ordinary_t *m, kvb__frames_err_t *err,
                                        kvb__cpd_contract_t *c_p);

/* ================================================================ manifest */

typedef struct kvb__cpd_mgroup {
    char *group_id;
    size_t n;
    int64_t *block_ids; /* n entries */
} kvb__cpd_mgroup_t;

/* A request's block manifest. Owned: free with kvb__cpd_manifest_free. */
typedef struct kvb__cpd_manifest {
    uint32_t ngroups;
    kvb__cpd_mgroup_t *groups;
    int64_t prefix_len;
    int64_t prompt_len;
} kvb__cpd_manifest_t;

/* Parse json[0..len) (1..2 MiB; an empty frame is a dummy request and never
 * reaches here): an object with `groups` (array of objects with a string
 * `group_id` and an integer array `block_ids`), integers `prefix_len` and
 * `prompt_len`; other keys ignored, as TokenSpeed does. Stricter: the JSON
 * types (TokenSpeed's TypeError/KeyError here leaves the decode waiting
 * 300 s; kvbridge refuses with a reason), at most KVB__CPD_MAX_GROUPS groups
 * and KVB__CPD_MAX_BLOCKS ids per group. KVB_ERR_PROTO ("CachePD manifest:
 * ..."), KVB_ERR_NOMEM. */
kvb_status_t kvb__cpd_manifest_parse(const uint8_t *json, size_t len, kvb__frames_err_t *err,
                                     kvb__cpd_manifest_t *m_p);
void kvb__cpd_manifest_free(kvb__cpd_manifest_t *m);
/* TokenSpeed's to_wire_bytes of the manifest; malloc'ed text. KVB_ERR_NOMEM. */
kvb_status_t kvb__cpd_manifest_encode(const kvb__cpd_manifest_t *m, char **json_p, size_t *len_p);

/* validate_cache_manifest against the contract of the side that owns the
 * ids (the decode's, for a received request): prefix_len < prompt_len,
 * group order, prefix alignment, block count per transfer policy, and
 * 0 < id < virtual block count, in TokenSpeed's order and with its texts
 * (prefixed "destination manifest ..."); kvbridge adds prefix_len >= 0.
 * KVB_ERR_PROTO. */
kvb_status_t kvb__cpd_manifest_validate(const kvb__cpd_manifest_t *m, const kvb__cpd_contract_t *c,
                                        kvb__frames_err_t *err);

/* The logical block-table slots of spec s for a request (spec 7.7):
 * [*first_p, *first_p + *count_p). full_suffix: from prefix_len / g (or the
 * sliding window's first block) to ceil(prompt_len / g); any other policy:
 * the one slot (prompt_len - 1) / g. KVB_ERR_INVALID when prompt_len < 1 or
 * prefix_len < 0. */
kvb_status_t kvb__cpd_slots(const kvb__cpd_contract_t *c, uint32_t s, int64_t prefix_len,
                            int64_t prompt_len, uint64_t *first_p, uint64_t *count_p);

/* The part of spec s's slots a prefill may send once its chunk
 * [chunk_start, chunk_end) is computed (build_cache_layerwise_block_selection,
 * spec 7.8): manifest positions [*pos_p, *pos_p + *count_p). full_suffix:
 * complete blocks up to chunk_end (the partial last block on the final
 * chunk), from the chunk's first block (positions before it belong to earlier
 * chunks); latest_snapshot: position 0 on the final chunk only. Requires
 * prefix_len < prompt_len, prefix aligned, chunk_start < chunk_end <=
 * prompt_len (KVB_ERR_INVALID otherwise). */
kvb_status_t kvb__cpd_layerwise_positions(const kvb__cpd_contract_t *c, uint32_t s,
                                          int64_t prefix_len, int64_t prompt_len,
                                          int64_t chunk_start, int64_t chunk_end, uint64_t *pos_p,
                                          uint64_t *count_p);

/* ================================================================ frames */

/* Registration (D -> P), exactly 8 frames (spec 4.2). */
typedef struct kvb__cpd_reg {
    const char *endpoint; /* 1: ASCII, 1..255 bytes */
    size_t endpoint_len;
    uint16_t port;          /* 2: canonical decimal, 1..65535 */
    const char *session_id; /* 3: ASCII, 1..512 bytes */
    size_t session_id_len;
    uint64_t slab;                /* 4: exactly 8 bytes, native order, non-zero */
    const uint8_t *contract_json; /* 5: the decode's contract (view) */
    size_t contract_len;
    uint32_t decode_tp_size; /* 6: 1..1024 */
    uint32_t decode_tp_rank; /* 7: < decode_tp_size */
} kvb__cpd_reg_t;

/* Pre-allocation request (D -> P), exactly 3 frames (spec 4.3). */
typedef struct kvb__cpd_req {
    uint64_t room; /* 0: canonical, <= 2^63 - 1 */
    const char *session_id;
    size_t session_id_len;        /* 1: ASCII, 1..512 bytes */
    bool is_dummy;                /* 2 empty */
    const uint8_t *manifest_json; /* 2 (view), NULL/0 for a dummy */
    size_t manifest_len;
} kvb__cpd_req_t;

/* Status (P -> D): 7 frames sent; 5 to 7 read (spec 4.4). */
typedef struct kvb__cpd_status {
    uint64_t room;              /* 0 */
    int32_t status;             /* 1: 0..5 (TokenSpeed sends only 0 and 5) */
    uint32_t sender;            /* 2: the prefill's stage-major rank */
    int64_t token;              /* 3: first token, -1 none */
    kvb__i32_view_t candidates; /* 4: int32 ids, count 0 = none */
    uint64_t cached_tokens;     /* 5: default 0 when absent */
    bool has_logprob;           /* 6: non-empty */
    double logprob;             /* 6: little-endian IEEE double */
} kvb__cpd_status_t;

/* Decoders. The registration decoder checks in TokenSpeed's order (frame
 * count and tag, endpoint, session, port, frame 4 width, contract, TP size,
 * TP rank, pointer) and parses frame 5 into *contract_p (owned; may be NULL
 * to skip it: then frame 5 is only checked for size). The request decoder
 * parses a non-empty frame 2 into *manifest_p (owned; NULL to skip) but does
 * not validate it against a contract (kvb__cpd_manifest_validate does, with
 * the registration's contract). Texts start with TokenSpeed's ("CachePD slab
 * registration requires exactly 8 frames", ...). On error nothing is
 * written; a request error carries the room when frame 0 parsed. */
kvb_status_t kvb__cpd_decode_registration(const kvb__frame_t *f, size_t n, kvb__frames_err_t *err,
                                          kvb__cpd_reg_t *msg_p, kvb__cpd_contract_t *contract_p);
kvb_status_t kvb__cpd_decode_request(const kvb__frame_t *f, size_t n, kvb__frames_err_t *err,
                                     kvb__cpd_req_t *msg_p, kvb__cpd_manifest_t *manifest_p);
kvb_status_t kvb__cpd_decode_status(const kvb__frame_t *f, size_t n, kvb__frames_err_t *err,
                                    kvb__cpd_status_t *msg_p);
/* Frames 1-3 of a registration only (TokenSpeed's route_header_from_zmq): the
 * decode to answer Failed when the rest is refused. */
kvb_status_t kvb__cpd_decode_registration_header(const kvb__frame_t *f, size_t n,
                                                 kvb__frames_err_t *err, kvb__cpd_reg_t *msg_p);

/* Does this multipart look like a CachePD registration (8 frames, "None",
 * frame 4 exactly 8 bytes, frame 5 starting with '{') or request (3 frames,
 * frame 0 a decimal)? The spec 12.4 test that tells it from seed 004 on one
 * port; validates nothing else. */
bool kvb__cpd_is_registration(const kvb__frame_t *f, size_t n);
bool kvb__cpd_is_request(const kvb__frame_t *f, size_t n);
/* A status a decode claims on its port: 6 or 7 frames (TokenSpeed 0.1.1
 * always sends 7; the 5-frame form is seed 004's shape there), frame 0 a
 * room. */
bool kvb__cpd_is_status(const kvb__frame_t *f, size_t n);

/* An encoded multipart message: frame i is data[start(i) .. ends[i]).
 * Zero it (or kvb__cpd_msg_init) before first use; reset between messages;
 * free at the end. One owner at a time. */
typedef struct kvb__cpd_msg {
    uint8_t *data;
    size_t len, cap;
    size_t ends[KVB__CPD_STATUS_FRAMES + 1];
    size_t n;
} kvb__cpd_msg_t;
void kvb__cpd_msg_init(kvb__cpd_msg_t *m);
void kvb__cpd_msg_reset(kvb__cpd_msg_t *m);
void kvb__cpd_msg_free(kvb__cpd_msg_t *m);
/* Frame i (< m->n), valid until the next change of m. */
kvb__frame_t kvb__cpd_msg_frame(const kvb__cpd_msg_t *m, size_t i);

/* Encoders: the exact frames TokenSpeed sends for these values, checked with
 * the decoder first (KVB_ERR_INVALID with its reason in *err; the contract
 * and manifest JSON are sent as given: produce them with *_encode). The
 * status always has 7 frames. *out is reset and filled; on error it is left
 * empty. KVB_ERR_NOMEM. */
kvb_status_t kvb__cpd_encode_registration(const kvb__cpd_reg_t *msg, kvb__frames_err_t *err,
                                          kvb__cpd_msg_t *out);
kvb_status_t kvb__cpd_encode_request(const kvb__cpd_req_t *msg, kvb__frames_err_t *err,
                                     kvb__cpd_msg_t *out);
kvb_status_t kvb__cpd_encode_status(const kvb__cpd_status_t *msg, kvb__frames_err_t *err,
                                    kvb__cpd_msg_t *out);

/* ================================================================ bootstrap */

/* cache_fields_by_stage: stage s owns fields idx[start[s] .. start[s+1]) (plan
 * field indices, in the order sent). Owned: kvb__cpd_stages_free. */
typedef struct kvb__cpd_stages {
    uint32_t n;      /* 1..KVB__CPD_MAX_STAGES */
    uint32_t *start; /* n + 1 entries */
    uint32_t *idx;   /* start[n] == the contract's nfields entries */
} kvb__cpd_stages_t;
void kvb__cpd_stages_free(kvb__cpd_stages_t *st);
/* One stage holding every field (a prefill without PP). */
kvb_status_t kvb__cpd_stages_single(const kvb__cpd_contract_t *c, kvb__cpd_stages_t *st_p);
bool kvb__cpd_stages_equal(const kvb__cpd_stages_t *a, const kvb__cpd_stages_t *b);

/* A CachePD PUT /route body (spec 3.1). */
typedef struct kvb__cpd_put {
    uint32_t world_size, dp_size, pp_size; /* world = tp x dp x pp */
    uint32_t engine_rank;                  /* global rank */
    char rank_ip[KVB__CPD_MAX_ENDPOINT + 1];
    uint16_t rank_port;
    kvb__cpd_contract_t contract; /* cache_layout, parsed */
    kvb__cpd_stages_t stages;     /* cache_fields_by_stage */
} kvb__cpd_put_t;
void kvb__cpd_put_free(kvb__cpd_put_t *p);

/* Is this PUT body CachePD's (a `cache_layout` key; spec 12.2)? Cheap
 * classification for a server holding several dialects; NULL/len 0: false. */
bool kvb__cpd_is_put(const char *body, size_t len);

/* Parse a PUT body with TokenSpeed's server checks (spec 3.1 step 2):
 * role "Prefill", integers world_size/dp_size/pp_size >= 1 (pp_size
 * required; rank_port/engine_rank also as decimal strings, TokenSpeed applies
 * int()), world a multiple of dp x pp, engine_rank < world_size, cache_layout
 * a string holding a valid contract, cache_fields_by_stage a list of pp_size
 * lists covering every field exactly once. KVB_ERR_PROTO with TokenSpeed's
 * text where it has one ("CachePD placement does not match pipeline stage
 * count", ...), KVB_ERR_NOMEM. */
kvb_status_t kvb__cpd_put_parse(const char *body, size_t len, kvb__frames_err_t *err,
                                kvb__cpd_put_t *p_p);
/* The body TokenSpeed's prefill PUTs (requests' json=: ", " and ": "
 * separators, its key order); cache_layout is the canonical contract.
 * malloc'ed text. KVB_ERR_NOMEM. */
kvb_status_t kvb__cpd_put_encode(const kvb__cpd_put_t *p, char **body_p, size_t *len_p);

/* What a bootstrap server keeps for its CachePD prefill instance. Zero it to
 * start; kvb__cpd_boot_free releases it. Not thread-safe (the server's lock). */
typedef struct kvb__cpd_boot {
    bool registered;
    uint32_t world_size, dp_size, pp_size; /* first PUT's world/dp, last PUT's pp */
    char *canonical;                       /* the stored canonical contract */
    size_t canonical_len;
    kvb__cpd_contract_t contract;
    kvb__cpd_stages_t stages;
} kvb__cpd_boot_t;
void kvb__cpd_boot_free(kvb__cpd_boot_t *b);
/* Admit one parsed PUT: the same placement and the same canonical layout as
 * every earlier rank ("CachePD prefill ranks registered incompatible field
 * placement" / "... layouts", KVB_ERR_PROTO, state unchanged), and the same
 * world and DP sizes (kvbridge's addition; TokenSpeed keeps the first). The
 * rank's table key: DP group engine_rank / (world / dp), rank in the group
 * engine_rank % (world / dp) (the stage-major rank): *dp_group_p, *rank_p
 * (either may be NULL). KVB_ERR_NOMEM. */
kvb_status_t kvb__cpd_boot_admit(kvb__cpd_boot_t *b, const kvb__cpd_put_t *p,
                                 kvb__frames_err_t *err, uint32_t *dp_group_p, uint32_t *rank_p);
/* The parallel-info answer (GET engine_rank=-1&target_dp_group=-1, spec 3.2)
 * of a registered state, as aiohttp's json_response writes it. KVB_ERR_STATE
 * before any admitted PUT (never answer a null cache_layout, spec 12.2). */
kvb_status_t kvb__cpd_boot_parallel_info(const kvb__cpd_boot_t *b, char **body_p, size_t *len_p);

/* A parallel-info answer as a CachePD decode reads it (spec 3.3). */
typedef struct kvb__cpd_pinfo {
    uint32_t world_size; /* prefill_tp_size: tp x dp x pp */
    uint32_t dp_size, pp_size;
    uint32_t tp_size; /* intra-stage prefill TP: world / (dp x pp) */
    kvb__cpd_contract_t contract;
    kvb__cpd_stages_t stages;
} kvb__cpd_pinfo_t;
void kvb__cpd_pinfo_free(kvb__cpd_pinfo_t *pi);
/* Parse it: integers prefill_tp_size, prefill_dp_size, prefill_pp_size
 * (absent: 1), a string cache_layout holding a valid contract (null: the
 * prefill is not CachePD; refused with that reason rather than TokenSpeed's
 * exception), cache_fields_by_stage covering every field once, one list per
 * stage; world a multiple of dp x pp. KVB_ERR_PROTO, KVB_ERR_NOMEM. */
kvb_status_t kvb__cpd_pinfo_parse(const char *body, size_t len, kvb__frames_err_t *err,
                                  kvb__cpd_pinfo_t *pi_p);

/* Per-rank answer {"rank_ip": ..., "rank_port": ...} (spec 3.2): parse
 * (rank_ip 1..255 bytes of [0-9A-Za-z.:-], port 1..65535) and produce. */
kvb_status_t kvb__cpd_rank_addr_parse(const char *body, size_t len, kvb__frames_err_t *err,
                                      char ip[KVB__CPD_MAX_ENDPOINT + 1], uint16_t *port_p);
kvb_status_t kvb__cpd_rank_addr_encode(const char *ip, uint16_t port, char **body_p, size_t *len_p);

/* ================================================================ planner */

/* One fragment (CacheTransferFragment, spec 7.3): for every page pair, rows
 * of bytes_per_row at src_off + row x src_row_stride of the prefill field's
 * page go to dst_off + row x dst_row_stride of the decode field's page. */
typedef struct kvb__cpd_frag {
    uint32_t spec;   /* group: index in the prefill contract's group_specs */
    uint32_t pfield; /* index in the prefill (wire) contract's plan.fields */
    uint32_t dfield; /* index in the decode contract's plan.fields */
    uint64_t src_off, dst_off;
    uint64_t src_row_stride, dst_row_stride;
    uint64_t bytes_per_row;
    uint64_t rows_per_page;
} kvb__cpd_frag_t;

/* A sharded group's owner filter (CachePageOwnerFilter): count 0 = None
 * (the rank sends nothing of the group). */
typedef struct kvb__cpd_owner {
    uint32_t owner_rank, owner_count;
} kvb__cpd_owner_t;

/* What one prefill rank sends one decode rank. whole: the whole-copy route
 * (spec 7.2; no fragments, every field page copied whole). owners: one entry
 * per group spec of the prefill contract (count 0 for unsharded groups and
 * None decisions). */
typedef struct kvb__cpd_source {
    uint32_t prefill_rank; /* stage-major (stage x ptp + tp rank) */
    bool whole;
    uint32_t nfrags;
    kvb__cpd_frag_t *frags;
    kvb__cpd_owner_t *owners;
} kvb__cpd_source_t;

/* The route of one decode rank over every stage (build_pipeline_transfer_plan,
 * spec 7.5-7.6), or one prefill rank's registration (spec 4.2 step 1). Owned:
 * kvb__cpd_route_free. */
typedef struct kvb__cpd_route {
    uint32_t nsources;
    kvb__cpd_source_t *sources; /* ascending prefill_rank */
    uint32_t ndummies;
    uint32_t *dummies;  /* ascending; computed on decode TP rank 0 only */
    uint32_t nexpected; /* registration: decode TP ranks this prefill rank */
    uint16_t *expected; /* serves, ascending ({0} for a dummy) */
    bool dummy;         /* registration: a dummy (rendezvous-only) registration */
} kvb__cpd_route_t;
void kvb__cpd_route_free(kvb__cpd_route_t *r);

/* Planner inputs shared by both sides. */
typedef struct kvb__cpd_pair {
    const kvb__cpd_contract_t *prefill; /* the prefill's wire (full-model) contract */
    const kvb__cpd_contract_t *decode;
    const kvb__cpd_stages_t *stages; /* cache_fields_by_stage of the prefill */
    uint32_t prefill_tp;             /* intra-stage TP size, 1..1024 */
    uint32_t decode_tp;              /* 1..1024 */
} kvb__cpd_pair_t;

/* Peer compatibility (validate_cache_peer_layout, spec 7.1), TokenSpeed's
 * texts ("Cache P/D contract mismatch: ..."). KVB_ERR_PROTO. */
kvb_status_t kvb__cpd_check_peer(const kvb__cpd_contract_t *p, const kvb__cpd_contract_t *d,
                                 kvb__frames_err_t *err);

/* The decode side: the sources (and, on decode rank 0, the dummy ranks) of
 * decode rank d over every stage; targets = sources + dummies. Errors as
 * TokenSpeed's planner raises them (UnsupportedPDLayoutError texts),
 * KVB_ERR_PROTO; KVB_ERR_NOMEM. */
kvb_status_t kvb__cpd_plan_decode(const kvb__cpd_pair_t *pair, uint32_t d, kvb__frames_err_t *err,
                                  kvb__cpd_route_t *route_p);

/* The prefill side, on receiving a registration from decode rank d
 * (_prepare_decode_registration): prefill rank tp_rank of stage pp_rank.
 * A source of d: one source (its fragments or whole, its owner filters) and
 * expected = every decode rank it serves; serving nobody and d == 0: dummy,
 * expected {0}; else "CachePD Decode registration targets the wrong Prefill
 * TP rank". KVB_ERR_PROTO, KVB_ERR_NOMEM. */
kvb_status_t kvb__cpd_plan_registration(const kvb__cpd_pair_t *pair, uint32_t pp_rank,
                                        uint32_t tp_rank, uint32_t d, kvb__frames_err_t *err,
                                        kvb__cpd_route_t *route_p);

/* One group's block ids for a copy: src[i] (the prefill's ids: virtual for a
 * sharded group) goes to dst[i] (the decode's pages). */
typedef struct kvb__cpd_copy_group {
    const int64_t *src;
    const int64_t *dst;
    size_t n;
} kvb__cpd_copy_group_t;

typedef struct kvb__cpd_copy {
    const kvb__cpd_source_t *source;    /* from the registration route */
    const kvb__cpd_contract_t *prefill; /* the wire contract the route came from */
    const kvb__cpd_contract_t *local;   /* the prefill rank's own (PP: narrowed) contract */
    const kvb__cpd_contract_t *decode;
    uint64_t src_slab, dst_slab;
    const kvb__cpd_copy_group_t *groups; /* one per group spec, in order */
    const bool *field_mask;              /* local fields to send (layerwise step); NULL: all */
    /* The address of page 0 of each local field, where the prefill's fields
     * are not in one slab (a kvbridge rank: one buffer per layer's K or V);
     * NULL: src_slab + the field's page-0 offset. */
    const uint64_t *src_page0;
} kvb__cpd_copy_t;

/* Append the copies of one request (or layerwise step) to out as strided
 * blocks, in TokenSpeed's order (_cache_transfer_blocks, spec 7.9): per
 * group, first each multi-row fragment page by page (a run of pages
 * consecutive on both sides whose rows continue at the same pitch is one
 * block), then each single-span field over the group's pages (one block per
 * run of consecutive pages; strides = the page strides). A sharded group
 * keeps the positions its owner filter owns, at local page (v - 1) / k + 1.
 * Every page is checked against its group's page count on both sides (and a
 * virtual id against the virtual bound), every address sum for overflow.
 * KVB_ERR_PROTO (bad ids), KVB_ERR_INVALID (mismatched arguments, a fixed
 * array too small), KVB_ERR_NOMEM; out unchanged on error. */
kvb_status_t kvb__cpd_plan_copy(const kvb__cpd_copy_t *cp, kvb__frames_err_t *err,
                                kvb_plan_strided_t *out);

#endif
