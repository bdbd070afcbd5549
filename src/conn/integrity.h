/* KV integrity (docs/integrity.md): the digest a prefill sends with a room's
 * Success to a kvbridge decode, and the decode's recomputation over its own
 * pages. A digest is a sum (mod 2^64) of one XXH3-64 per (buffer, page,
 * share) item: the bytes one source wrote into that page of that buffer (the
 * whole page, or one strided pattern of it: a head slice, a row range), in
 * destination order, seeded with the page's destination address; kept
 * twice: per destination buffer and per (destination page, pattern). The
 * sums are order-free (the chunks, stages and blocks of a room add up in
 * any order) and the address
 * seed ties every item's bytes to the place they belong, so a wrong byte and
 * a right byte in the wrong page both change it; the two views name the
 * buffer and the page of a single fault. Pure functions on caller memory: no
 * lock, no I/O; one owner per accumulator. */
#ifndef KVB_CONN_INTEGRITY_H
#define KVB_CONN_INTEGRITY_H

#include <kvbridge/engine.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The extension key of the digest on a status (docs/integrity.md, "Wire"). */
#define KVB__INTEG_EXT_KEY "kv_digest"
/* A decode's "kv_digest=" registration extension: the highest wire
 * version it reads (a prefill sends partial-page shares only at 2). */
#define KVB__INTEG_CAP_KEY "kv_digest="
#define KVB__INTEG_WIRE_MAX 2u
/* Page entries one room's digests may name (a peer's allocation cap): 1 Mi,
 * 24 MiB; patterns: 256. */
#define KVB__INTEG_MAX_PAGES (1u << 20)
#define KVB__INTEG_MAX_PATS 256u

/* The bytes of a page one share covers: count pieces of len bytes, the
 * first at off from the page start, one every stride. {0,0,0,0}: the whole
 * page (pattern index 0). */
typedef struct kvb__integ_pat {
    uint64_t off, len, stride, count;
} kvb__integ_pat_t;

/* One (page, pattern) entry: sum of its shares' hashes over the buffers;
 * nbuf: how many (buffer, share) hashes went in (the prefill's check that
 * each pattern covers every buffer it names; not on the wire). */
typedef struct kvb__integ_ent {
    uint64_t page, sum;
    uint32_t pat, nbuf;
} kvb__integ_ent_t;

typedef struct kvb__integ {
    uint64_t *buf_sum; /* n_buf sums; buf_seen[b]: buffer b was written */
    uint8_t *buf_seen;
    size_t n_buf;
    kvb__integ_ent_t *pages; /* sorted by (page, pat), unique after kvb__integ_merge */
    size_t n_pages, cap_pages;
    kvb__integ_pat_t *pats; /* pats[0]: the whole page; n_pats >= 1 */
    size_t n_pats;
    uint64_t item_len; /* the destination page's bytes (0: none added yet) */
    uint64_t dst_pool; /* prefill, set by the caller: pages in each destination KV buffer
                          (kv_lens=): a block at or past them is a state block, left out;
                          0 (unknown): parts of pages leave a uncovered */
    int peer_v2;       /* prefill: the destination reads wire version 2 */
    int uncovered;     /* a block the digest cannot describe: no digest is sent */
    char why[160];     /* why uncovered */
} kvb__integ_t;

/* KVBRIDGE_INTEGRITY: "check" → 1, "off" or unset → 0 (anything else is
 * logged and read as off). */
int kvb__integ_env(void);
/* An empty accumulator over n_buf destination buffers: KVB_ERR_NOMEM. */
kvb_status_t kvb__integ_init(kvb__integ_t *a, size_t n_buf);
void kvb__integ_free(kvb__integ_t *a);
/* Prefill, a worker's thread, after the blocks' writes succeeded: add the
 * source bytes of blocks written into destination buffers dst_ptrs[n_dst]
 * of items item_len (a row may hold several whole items: a coalesced run of
 * pages, or part of one). The parts landing in one page of one buffer must
 * form one strided pattern (integ_share.c), else a is marked uncovered
 * (with the reason). KVB_ERR_NOMEM. */
kvb_status_t kvb__integ_add_blocks(kvb__integ_t *a, const kvb_strided_block_t *b, size_t n,
                                   const uint64_t *dst_ptrs, size_t n_dst, uint64_t item_len);
/* The same with the items' hashes computed elsewhere: h[nh], one per item
 * in block, row, item order, empty blocks skipped (kvb_xfer_digests: the
 * direct lane's copy threads hashed each source item as they copied it).
 * Blocks that are not whole pages are hashed from the sources instead; a
 * count that does not match the blocks marks a uncovered. KVB_ERR_NOMEM. */
kvb_status_t kvb__integ_add_hashes(kvb__integ_t *a, const kvb_strided_block_t *b, size_t n,
                                   const uint64_t *dst_ptrs, size_t n_dst, uint64_t item_len,
                                   const uint64_t *h, size_t nh);
/* Add from into into (the same n_buf), pages merged by page. KVB_ERR_NOMEM. */
kvb_status_t kvb__integ_merge(kvb__integ_t *into, const kvb__integ_t *from);
/* Whether a's shares are sendable at wire version 2 or below: every entry
 * whole (version 1) or a->peer_v2 and each pattern in every buffer named;
 * false with the reason in a->why (a then counts as uncovered). */
bool kvb__integ_sendable(kvb__integ_t *a);
/* The extension's value (caller frees *buf_p): version 1 when every entry
 * is a whole page, else 2 (call kvb__integ_sendable first). KVB_ERR_NOMEM. */
kvb_status_t kvb__integ_encode(const kvb__integ_t *a, uint8_t **buf_p, size_t *len_p);
/* Decode: a peer's value (hostile) added into a: buffers < a->n_buf, pages <
 * pool, patterns inside an item_len page, counts capped. KVB_ERR_PROTO with
 * why; nothing kept then. */
kvb_status_t kvb__integ_add_wire(kvb__integ_t *a, const uint8_t *v, size_t len, uint64_t pool,
                                 uint64_t item_len, char *why, size_t wl);
/* Decode: recompute over the items a names, at kv_ptrs (a->n_buf buffers) of
 * item_len bytes: true when both views match, else false and why names the
 * first buffer and page that differ. */
bool kvb__integ_check(const kvb__integ_t *a, const uint64_t *kv_ptrs, uint64_t item_len, char *why,
                      size_t wl);

/* The same in parts, for several threads: init (KVB_ERR_NOMEM), then every
 * part of n_parts once, each on any thread (they add into r atomically),
 * then, after all of them, the verdict (kvb__integ_check's answer). a and r
 * must not change meanwhile; the items are split evenly between parts. */
typedef struct kvb__integ_run {
    size_t *bufs, nb;  /* the buffers a names */
    uint64_t *bs, *ps; /* recomputed sums per buffer (n_buf) and per page (a->n_pages) */
    size_t n_items;    /* a->n_pages * nb: entry t / nb, buffer bufs[t % nb] */
} kvb__integ_run_t;
kvb_status_t kvb__integ_run_init(const kvb__integ_t *a, kvb__integ_run_t *r);
void kvb__integ_run_part(const kvb__integ_t *a, kvb__integ_run_t *r, const uint64_t *kv_ptrs,
                         uint64_t item_len, size_t part, size_t n_parts);
bool kvb__integ_run_verdict(const kvb__integ_t *a, const kvb__integ_run_t *r, char *why, size_t wl);
void kvb__integ_run_free(kvb__integ_run_t *r);

/* ---- internal to the integrity files ---- */
/* integ_table.c, for integrity.c and integ_share.c: entry (page, pattern
 * pat) += h (nbuf: the (buffer, share) hashes in h). KVB_ERR_NOMEM. */
kvb_status_t kvb__integ_page_add(kvb__integ_t *a, uint64_t page, uint32_t pat, uint64_t h,
                                 uint32_t nbuf);
/* pat's index in a->pats (added when new; 0 for the whole item_len page);
 * -1 past KVB__INTEG_MAX_PATS or out of memory. */
long kvb__integ_pat_index(kvb__integ_t *a, const kvb__integ_pat_t *pat);
/* Mark a uncovered; the first reason is kept. */
void kvb__integ_uncover(kvb__integ_t *a, const char *why);
/* integ_share.c: add the shares of parts of pages (pieces) of blocks b[n]
 * to a, each page's pieces as one strided pattern, hashed from the sources.
 * KVB_ERR_NOMEM. */
kvb_status_t kvb__integ_add_parts(kvb__integ_t *a, const kvb_strided_block_t *b, size_t n,
                                  const uint64_t *dst_ptrs, size_t n_dst, uint64_t item_len);

#endif
