/* kvbridge transfer planner: which bytes of a prefill rank's KV cache go
 * where in a decode rank's KV cache.
 *
 * Pure functions over buffer layouts: no I/O, no threads, no global state.
 * A plan (kvb_plan_h) is built once for a (prefill layout, decode layout)
 * pair and is immutable afterwards: any number of threads may call route,
 * fragment and block functions on one plan at once. Block output goes into
 * a kvb_plan_blocks_t owned by the caller (one per thread).
 *
 * Model: every buffer is an array of items; a page index addresses one item
 * in every layer buffer. An item holds rows (page_size token rows for K/V,
 * latent and draft buffers; one row for state and aux items). A row of a
 * sharded buffer holds this rank's units (KV heads, or state channels) side
 * by side; the planner intersects the global unit intervals of the two ranks
 * to get one fragment (src_offset, dst_offset, bytes) per buffer kind, then
 * expands fragments over pages, rows and layers into (src, dst, len) blocks
 * that feed kvb_engine_write directly. The two sides may differ in page size
 * and in the order of a page (NHD, HND): the planner then maps token rows,
 * not pages (docs/planner.md).
 *
 * Errors: every function returns KVB_ERR_INVALID for unsupported or
 * inconsistent geometry and never a wrong plan; kvb_plan_last_error() gives
 * the reason, naming the field and both values. */
#ifndef KVBRIDGE_PLAN_H
#define KVBRIDGE_PLAN_H

#include <kvbridge/common.h>
#include <kvbridge/engine.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Largest TP size, layer count and state/aux buffer count a layout may name. */
#define KVB_PLAN_MAX_TP 1024u
#define KVB_PLAN_MAX_LAYERS 65536u
#define KVB_PLAN_MAX_EXTRA 256u

typedef struct kvb_plan *kvb_plan_h;

/* Attention kind: MHA/GQA keeps a K and a V buffer per layer; MLA keeps one
 * latent buffer per layer, replicated on every TP rank. */
typedef enum kvb_plan_attn { KVB_PLAN_MHA = 0, KVB_PLAN_MLA = 1 } kvb_plan_attn_t;

/* Which axis of a buffer row is split across TP ranks. */
typedef enum kvb_plan_axis {
    KVB_PLAN_AXIS_KV_HEAD = 0,       /* units are KV heads */
    KVB_PLAN_AXIS_STATE_CHANNEL = 1, /* units are state channels */
    KVB_PLAN_AXIS_REPLICATED = 2     /* every rank holds the whole row */
} kvb_plan_axis_t;

/* Order of one page of a K/V, latent or draft buffer. The innermost axis is
 * always the unit (head_dim × element bytes); state and aux items have no
 * token axis and ignore it. */
typedef enum kvb_plan_order {
    KVB_PLAN_ORDER_NHD = 0, /* (page, token, head, dim): a token's heads side by side */
    KVB_PLAN_ORDER_HND = 1  /* (page, head, token, dim): a head's tokens side by side */
} kvb_plan_order_t;

/* "nhd", "hnd"; "?" otherwise. Constant text, thread-safe. */
KVB_API const char *kvb_plan_order_name(kvb_plan_order_t order);

/* Parse "nhd" / "hnd" (case-insensitive) into *order_p; KVB_ERR_INVALID
 * otherwise (*order_p untouched). Thread-safe. */
KVB_API kvb_status_t kvb_plan_order_parse(const char *text, kvb_plan_order_t *order_p);

/* Buffer kinds, in the order blocks are emitted. MLA latent buffers use
 * KVB_PLAN_BUF_LATENT; MLA draft layers use KVB_PLAN_BUF_DRAFT_K. */
typedef enum kvb_plan_buffer {
    KVB_PLAN_BUF_K = 0,
    KVB_PLAN_BUF_V = 1,
    KVB_PLAN_BUF_LATENT = 2,
    KVB_PLAN_BUF_DRAFT_K = 3,
    KVB_PLAN_BUF_DRAFT_V = 4,
    KVB_PLAN_BUF_STATE = 5,
    KVB_PLAN_BUF_AUX = 6
} kvb_plan_buffer_t;

/* "k", "v", "latent", "draft_k", "draft_v", "state", "aux"; "?" otherwise.
 * Constant text, thread-safe. */
KVB_API const char *kvb_plan_buffer_name(kvb_plan_buffer_t buffer);

/* Generic geometry of one buffer kind on one rank (TokenSpeed's
 * kv_item_lens / kv_unit_lens form). */
typedef struct kvb_plan_geom {
    uint64_t item_len;     /* bytes of one item on this rank */
    uint64_t unit_len;     /* bytes of one unit in one row; 0 = the row is one unit */
    uint64_t global_units; /* distinct units of the whole model; 0 = infer: equal
                              products of units × TP → sharded; equal item lengths →
                              replicated; otherwise the side with more units × TP holds
                              replicas (TokenSpeed's GQA rule, both directions) */
    kvb_plan_axis_t axis;
} kvb_plan_geom_t;

/* Optional parts of a layout, named in field_mask. */
enum kvb_plan_layout_field {
    KVB_PLAN_LAYOUT_PP = 1u << 0,         /* pp_size, pp_rank (default 1, 0) */
    KVB_PLAN_LAYOUT_STAGE = 1u << 1,      /* start_layer, stage_layers (default: SGLang's
                                             partition, remainder to the stages before
                                             the last) */
    KVB_PLAN_LAYOUT_DP = 1u << 2,         /* dp_size (default 1) */
    KVB_PLAN_LAYOUT_KV_GEOM = 1u << 3,    /* kv_geom replaces kv_heads / head_bytes */
    KVB_PLAN_LAYOUT_DRAFT = 1u << 4,      /* draft_layers, draft_kv_heads, draft_head_bytes */
    KVB_PLAN_LAYOUT_DRAFT_GEOM = 1u << 5, /* draft_layers, draft_geom */
    KVB_PLAN_LAYOUT_STATE = 1u << 6,      /* num_state, state */
    KVB_PLAN_LAYOUT_AUX = 1u << 7,        /* num_aux, aux_item_lens */
    KVB_PLAN_LAYOUT_POOL = 1u << 8,       /* kv_pool_pages, state_pool_items, aux_pool_items */
    KVB_PLAN_LAYOUT_ORDER = 1u << 9       /* kv_order, elem_bytes (default NHD, unchecked) */
};

/* What one rank holds. Always read: attn, num_layers, tp_size, tp_rank,
 * page_size, and kv_heads + head_bytes unless KVB_PLAN_LAYOUT_KV_GEOM.
 * Pointers are read during kvb_plan_create only (not retained). */
typedef struct kvb_plan_layout {
    uint64_t field_mask;
    kvb_plan_attn_t attn;
    uint32_t num_layers; /* layers of the whole model */
    uint32_t tp_size;    /* attention TP size (per DP group) */
    uint32_t tp_rank;    /* attention TP rank; checked < tp_size */
    uint32_t page_size;  /* tokens per K/V/latent/draft item; the sides may differ */
    uint32_t kv_heads;   /* MHA: KV heads of the whole model; MLA: ignored */
    uint64_t head_bytes; /* MHA: head_dim × dtype bytes; MLA: latent bytes per token */
    uint32_t pp_size, pp_rank;
    uint32_t start_layer, stage_layers; /* this PP stage: [start, start + n) */
    uint32_t dp_size;
    kvb_plan_geom_t kv_geom; /* K, V (or latent) item: page_size rows */
    uint32_t draft_layers;   /* draft-model layers, held by the last PP stage */
    uint32_t draft_kv_heads;
    uint64_t draft_head_bytes;
    kvb_plan_geom_t draft_geom;
    uint32_t num_state;           /* state buffers (last PP stage) */
    const kvb_plan_geom_t *state; /* num_state entries; item = one row */
    uint32_t num_aux;             /* aux buffers (last PP stage), replicated */
    const uint64_t *aux_item_lens;
    uint64_t kv_pool_pages;    /* items per K/V/latent/draft buffer; 0 = unchecked */
    uint64_t state_pool_items; /* items per state buffer; 0 = unchecked */
    uint64_t aux_pool_items;   /* items per aux buffer; 0 = unchecked */
    kvb_plan_order_t kv_order; /* order of K/V/latent/draft pages */
    uint32_t elem_bytes;       /* bytes per element: divides the unit; equal on both sides
                                  when both give it; 0 = unchecked */
} kvb_plan_layout_t;

/* A model description and the presets shared by `kvbridge plan`, `plan-bench`
 * and `bench`. */
typedef struct kvb_plan_model {
    const char *name;
    kvb_plan_attn_t attn;
    uint32_t num_layers;
    uint32_t kv_heads;    /* MLA: 1 */
    uint32_t head_dim;    /* MLA: latent + rope dims per token */
    uint32_t dtype_bytes; /* 2 for bf16 */
} kvb_plan_model_t;

/* Look up a preset by name: "llama3-8b", "llama3-70b", "qwen2.5-7b",
 * "deepseek-v3". Unknown → KVB_ERR_NOT_FOUND. *model_p is written on success
 * (name points to constant text). Thread-safe. */
KVB_API kvb_status_t kvb_plan_model_preset(const char *name, kvb_plan_model_t *model_p);

/* Names of the presets, NULL-terminated, constant. */
KVB_API const char *const *kvb_plan_model_preset_names(void);

/* Fill *layout_p for rank tp_rank of tp_size, PP stage pp_rank of pp_size,
 * from a model (field_mask = PP; other optional parts zero). Validates
 * nothing; kvb_plan_create does. */
KVB_API void kvb_plan_layout_from_model(const kvb_plan_model_t *model, uint32_t tp_size,
                                        uint32_t tp_rank, uint32_t pp_size, uint32_t pp_rank,
                                        uint32_t page_size, kvb_plan_layout_t *layout_p);

/* Build the plan of a layout pair. prefill describes the sending rank (its
 * pp_rank / stage selects the layers it sends; its tp_rank is only checked),
 * decode the receiving side (it holds all layers: pp_size must be 1).
 * Errors: KVB_ERR_INVALID (geometry; see kvb_plan_last_error), KVB_ERR_NOMEM.
 * *plan_p is set on success; free with kvb_plan_destroy. Thread-safe. */
KVB_API kvb_status_t kvb_plan_create(const kvb_plan_layout_t *prefill,
                                     const kvb_plan_layout_t *decode, kvb_plan_h *plan_p);

/* Free a plan (NULL is a no-op). Must not race other calls on the plan. */
KVB_API void kvb_plan_destroy(kvb_plan_h plan);

/* Reason of the calling thread's last failing kvb_plan_* call ("" if none).
 * Thread-local text, valid until that thread's next failing plan call. */
KVB_API const char *kvb_plan_last_error(void);

/* One source of a decode rank. */
typedef struct kvb_plan_source {
    uint32_t prefill_rank;          /* prefill attention TP rank */
    uint32_t dummy;                 /* 1: gets empty transfer info, sends nothing */
    uint32_t required_dst_info_num; /* decode ranks this prefill rank hears from */
} kvb_plan_source_t;

/* The receiver's route of one decode rank (PROTOCOL.md "Receiver rules",
 * generalised to any TP pair the geometry allows). */
typedef struct kvb_plan_route {
    uint32_t decode_rank;
    uint32_t num_sources;
    const kvb_plan_source_t *sources;       /* ascending prefill_rank; owned by the plan */
    uint32_t required_prefill_response_num; /* real sources × prefill pp_size */
} kvb_plan_route_t;

/* Route of decode TP rank decode_rank. Every prefill rank appears in the
 * sources of at least one decode rank. Out-of-range rank → KVB_ERR_INVALID.
 * The sources array stays valid until kvb_plan_destroy. */
KVB_API kvb_status_t kvb_plan_route(kvb_plan_h plan, uint32_t decode_rank,
                                    kvb_plan_route_t *route_p);

/* One fragment: the part of one row of a buffer kind that a prefill rank
 * sends to a decode rank. Offsets are within one token's (one item's, for
 * state and aux) row. */
typedef struct kvb_plan_fragment {
    kvb_plan_buffer_t buffer;
    uint32_t index;             /* state / aux buffer index, 0 otherwise */
    uint64_t src_offset;        /* in the prefill row */
    uint64_t dst_offset;        /* in the decode row */
    uint64_t bytes;             /* per row */
    uint64_t src_row_bytes;     /* prefill row length */
    uint64_t dst_row_bytes;     /* decode row length */
    uint32_t rows_per_item;     /* prefill page_size, or 1 for state and aux */
    uint32_t dst_rows_per_item; /* decode page_size, or 1 for state and aux */
    uint64_t unit_bytes;        /* bytes of one unit (head); offsets are unit multiples */
    kvb_plan_order_t src_order, dst_order; /* HND: unit u of token r lies at
                                              r × unit_bytes + u × rows × unit_bytes */
} kvb_plan_fragment_t;

/* Upper bound of the fragments of one rank pair (for sizing arrays). */
KVB_API size_t kvb_plan_max_fragments(kvb_plan_h plan);

/* Fragments prefill_rank sends to decode_rank, in buffer-kind order; none
 * (count 0) when the pair exchanges nothing (dummy, other replica). Draft,
 * state and aux fragments are listed whatever the PP stage (only the last
 * stage sends them). frags has room for cap entries; a smaller cap than
 * needed → KVB_ERR_INVALID. *count_p written on success. */
KVB_API kvb_status_t kvb_plan_fragments(kvb_plan_h plan, uint32_t prefill_rank,
                                        uint32_t decode_rank, kvb_plan_fragment_t *frags,
                                        size_t cap, size_t *count_p);

/* Base addresses of one rank's buffers. kv: MHA → K of this rank's layers
 * then V of the same layers (prefill: its stage's layers; decode: all
 * num_layers); MLA → one latent buffer per layer. draft: draft K then
 * draft V (MLA: draft latent only). state: num_state; aux: num_aux. Arrays
 * a layout does not have may be NULL. */
typedef struct kvb_plan_buffers {
    const uint64_t *kv;
    const uint64_t *draft;
    const uint64_t *state;
    const uint64_t *aux;
} kvb_plan_buffers_t;

enum kvb_plan_chunk_field {
    KVB_PLAN_CHUNK_PREFIX = 1u << 0,    /* first_page, prefix_tokens */
    KVB_PLAN_CHUNK_STATE = 1u << 1,     /* src_state, dst_state, num_state_indices */
    KVB_PLAN_CHUNK_AUX = 1u << 2,       /* src_aux_index, dst_aux_index */
    KVB_PLAN_CHUNK_DST_PAGES = 1u << 3, /* dst_first_page, num_dst_pages */
    KVB_PLAN_CHUNK_END = 1u << 4        /* end_tokens */
};

/* One chunk of a request: it sends request token rows [first_page × P_p,
 * (first_page + num_pages) × P_p) (P_p, P_d: prefill and decode page sizes)
 * less the rows below prefix_tokens (already on the decode; any count, a
 * partly filled decode page keeps its rows below it) and the rows from
 * end_tokens on (with KVB_PLAN_CHUNK_END: the request's length; the rest of
 * the last decode page is left as it was). src_pages[i] holds prefill page
 * first_page + i. dst_pages[i] holds decode page first_page + i, or with
 * KVB_PLAN_CHUNK_DST_PAGES decode page dst_first_page + i of num_dst_pages
 * (needed when P_p != P_d: every decode page the rows reach must be there).
 * State items and the aux item (pass them with the last chunk) are sent by
 * the last PP stage only. */
typedef struct kvb_plan_chunk {
    uint64_t field_mask;
    const int32_t *src_pages;
    const int32_t *dst_pages;
    size_t num_pages;
    uint64_t first_page;
    uint64_t prefix_tokens; /* rows already on the decode */
    const int32_t *src_state;
    const int32_t *dst_state;
    size_t num_state_indices;
    int64_t src_aux_index;
    int64_t dst_aux_index;
    uint64_t dst_first_page; /* request decode page of dst_pages[0] */
    size_t num_dst_pages;
    uint64_t end_tokens; /* rows from here on are not sent */
} kvb_plan_chunk_t;

/* Growable block array. Zero-initialise (or kvb_plan_blocks_init) and the
 * planner grows it with realloc; free with kvb_plan_blocks_free. To supply
 * your own array instead, set blocks/capacity and fixed = 1: the planner then
 * never reallocates and fails with KVB_ERR_INVALID when it is too small.
 * Not thread-safe: one per thread. */
typedef struct kvb_plan_blocks {
    kvb_block_t *blocks;
    size_t count;    /* set count = 0 to reuse */
    size_t capacity; /* entries allocated */
    uint64_t bytes;  /* sum of len over blocks[0..count) added by kvb_plan_blocks */
    int fixed;
} kvb_plan_blocks_t;

/* Zero *out: an empty, planner-grown array. Cannot fail. */
KVB_API void kvb_plan_blocks_init(kvb_plan_blocks_t *out);
/* Free a planner-grown array (no-op for fixed ones) and zero the struct. */
KVB_API void kvb_plan_blocks_free(kvb_plan_blocks_t *out);

/* Append the blocks that prefill_rank (at the plan's prefill PP stage) writes
 * into decode_rank for one chunk: every buffer and layer, consecutive pages
 * merged, whole rows merged when a fragment covers them on both sides; with
 * page sizes or orders that differ, or a chunk cut mid-page, the token rows
 * mapped one page segment at a time and every block that continues the one
 * before on both sides merged into it (docs/planner.md). Appends nothing for
 * a pair that exchanges nothing. Errors (out unchanged): KVB_ERR_INVALID
 * (index outside a pool or negative, rows reaching a decode page dst_pages
 * lacks, missing address array, address overflow, fixed array too small),
 * KVB_ERR_NOMEM. Thread-safe on a shared plan. */
KVB_API kvb_status_t kvb_plan_blocks(kvb_plan_h plan, uint32_t prefill_rank, uint32_t decode_rank,
                                     const kvb_plan_buffers_t *src, const kvb_plan_buffers_t *dst,
                                     const kvb_plan_chunk_t *chunk, kvb_plan_blocks_t *out);

/* The same chunk as strided blocks (kvb_strided_block_t, engine.h), for
 * kvb_write_member_t's strided field: the rows of one buffer over a run of
 * pages consecutive on both sides become one strided block (count = pages ×
 * rows per page, len = the fragment's bytes, strides = the prefill and
 * decode row lengths) when a fragment is part of a row; whole rows stay
 * plain (count 1, src_stride = dst_stride = len) and merge as in
 * kvb_plan_blocks. The bytes moved are exactly kvb_plan_blocks' for the same
 * arguments, and in the same order when each strided block is read row by
 * row; the descriptors are O(buffers × page runs) instead of O(rows). The
 * row mapping (page sizes or orders differ) gives one per page segment, or
 * per unit and segment where the orders differ (docs/planner.md), none
 * spanning two buffers. Same container rules (a fixed array needs
 * room for one descriptor per buffer and page run, counted before whole rows
 * merge, or per piece of the row mapping), errors (out unchanged) and thread
 * safety as kvb_plan_blocks. */
typedef struct kvb_plan_strided {
    kvb_strided_block_t *blocks;
    size_t count;
    size_t capacity;
    uint64_t bytes; /* sum of len × count added by kvb_plan_strided_blocks */
    int fixed;
} kvb_plan_strided_t;

/* Zero *out: an empty, planner-grown array. Cannot fail. */
KVB_API void kvb_plan_strided_init(kvb_plan_strided_t *out);
/* Free a planner-grown array (no-op for fixed ones) and zero the struct. */
KVB_API void kvb_plan_strided_free(kvb_plan_strided_t *out);
KVB_API kvb_status_t kvb_plan_strided_blocks(kvb_plan_h plan, uint32_t prefill_rank,
                                             uint32_t decode_rank, const kvb_plan_buffers_t *src,
                                             const kvb_plan_buffers_t *dst,
                                             const kvb_plan_chunk_t *chunk,
                                             kvb_plan_strided_t *out);

#ifdef __cplusplus
}
#endif
#endif
