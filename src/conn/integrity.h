/* KV integrity (docs/integrity.md): the digest a prefill sends with a room's
 * Success to a kvbridge decode, and the decode's recomputation over its own
 * pages. A digest is a sum (mod 2^64) of one XXH3-64 per (buffer, page) item
 * written whole, seeded with the item's destination address, kept twice: per
 * destination buffer and per destination page. The sums are order-free (the
 * chunks, stages and blocks of a room add up in any order) and the address
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
/* Pages one digest may name (a peer's allocation cap): 1 Mi pages, 16 MiB. */
#define KVB__INTEG_MAX_PAGES (1u << 20)

typedef struct kvb__integ {
    uint64_t *buf_sum; /* n_buf sums; buf_seen[b]: buffer b was written */
    uint8_t *buf_seen;
    size_t n_buf;
    uint64_t *pages; /* (page, sum) pairs, 2 u64 each; sorted, unique after kvb__integ_merge */
    size_t n_pages, cap_pages;
    int uncovered; /* a block the digest cannot describe: no digest is sent */
    char why[160]; /* why uncovered */
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
 * pages). A block that is not whole destination items marks a uncovered (with the reason).
 * KVB_ERR_NOMEM. */
kvb_status_t kvb__integ_add_blocks(kvb__integ_t *a, const kvb_strided_block_t *b, size_t n,
                                   const uint64_t *dst_ptrs, size_t n_dst, uint64_t item_len);
/* The same with the items' hashes computed elsewhere: h[nh], one per item
 * in block, row, item order, empty blocks skipped (kvb_xfer_digests: the
 * direct lane's copy threads hashed each source item as they copied it).
 * A count that does not match the blocks marks a uncovered. KVB_ERR_NOMEM. */
kvb_status_t kvb__integ_add_hashes(kvb__integ_t *a, const kvb_strided_block_t *b, size_t n,
                                   const uint64_t *dst_ptrs, size_t n_dst, uint64_t item_len,
                                   const uint64_t *h, size_t nh);
/* Add from into into (the same n_buf), pages merged by page. KVB_ERR_NOMEM. */
kvb_status_t kvb__integ_merge(kvb__integ_t *into, const kvb__integ_t *from);
/* The extension's value (caller frees *buf_p). KVB_ERR_NOMEM. */
kvb_status_t kvb__integ_encode(const kvb__integ_t *a, uint8_t **buf_p, size_t *len_p);
/* Decode: a peer's value (hostile) added into a: buffers < a->n_buf, pages <
 * pool, counts capped. KVB_ERR_PROTO with why. */
kvb_status_t kvb__integ_add_wire(kvb__integ_t *a, const uint8_t *v, size_t len, uint64_t pool,
                                 char *why, size_t wl);
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
    size_t n_items;    /* a->n_pages * nb */
} kvb__integ_run_t;
kvb_status_t kvb__integ_run_init(const kvb__integ_t *a, kvb__integ_run_t *r);
void kvb__integ_run_part(const kvb__integ_t *a, kvb__integ_run_t *r, const uint64_t *kv_ptrs,
                         uint64_t item_len, size_t part, size_t n_parts);
bool kvb__integ_run_verdict(const kvb__integ_t *a, const kvb__integ_run_t *r, char *why, size_t wl);
void kvb__integ_run_free(kvb__integ_run_t *r);

#endif
