/* Test harness: a bootstrap server, prefill ranks and decode ranks in one
 * process (each rank its own engine, manager and KV pool), a byte pattern
 * that identifies (room, layer, kind, token, head, byte), and a verifier. */
#ifndef KVB_TEST_CLUSTER_H
#define KVB_TEST_CLUSTER_H

#include <kvbridge/kvbridge.h>
#include <kvbridge/conn.h>
#include <stdbool.h>

typedef struct model {
    int layers, heads, head_bytes, page, mla;
    int state_bytes; /* > 0: STATE_BUFS state buffers per rank, items of this size */
} model_t;

typedef struct rank {
    kvb_engine_h eng;
    kvb_manager_h mgr;
    int tp, tp_size, pp, pp_size, dp;
    int first_layer, n_layers, local_heads, first_head;
    uint64_t item_len;
    int n_kv;
    uint8_t **kv;
    uint64_t pool_pages;
    uint8_t *aux;
    uint8_t *state[2]; /* STATE_BUFS buffers of STATE_ITEMS items (state_bytes > 0) */
} rank_t;

typedef struct cluster {
    model_t m;
    kvb_bootstrap_server_h boot;
    char boot_addr[64];
    int ptp, ppp, pdp, dtp;
    rank_t *pre; /* [dp][tp][pp] */
    rank_t *dec; /* [tp] */
    uint64_t pool_pages;
} cluster_t;

#define AUX_ITEM 64
#define AUX_ITEMS 64
#define STATE_BUFS 2
#define STATE_ITEMS 64

int cluster_start(cluster_t *c, const model_t *m, int ptp, int ppp, int pdp, int dtp,
                  uint64_t pool_pages);
void cluster_stop(cluster_t *c);
rank_t *cluster_prefill(cluster_t *c, int dp, int tp, int pp);

/* Pattern byte of (room, global layer, kind 0=K/latent 1=V, token, global
 * head, byte in head). */
uint8_t pattern(uint64_t room, int layer, int kind, uint64_t token, int head, int b);
/* Fill a prefill rank's pages of room (request page i at src_pages[i]). */
void fill_prefill(const cluster_t *c, rank_t *r, uint64_t room, const int32_t *src_pages,
                  int n_pages, int aux_index);
/* State slot k of room: written on a prefill rank, checked on a decode rank
 * of the same TP rank (wrong bytes counted). */
void fill_state(const cluster_t *c, rank_t *r, uint64_t room, int k, int32_t slot);
uint64_t verify_state(const cluster_t *c, const rank_t *r, uint64_t room, int k, int32_t slot);
/* Count wrong bytes on a decode rank for room (pages >= skip_pages only,
 * masked pages skipped when mask != NULL). */
uint64_t verify_decode(const cluster_t *c, const rank_t *r, uint64_t room, const int32_t *dst_pages,
                       int n_pages, int skip_pages, const uint8_t *mask, int aux_index);

typedef struct room_opts {
    int chunks;       /* number of uneven chunks */
    int prefix_pages; /* decode prefix skip */
    int use_mask;     /* page-transfer mask (every third page held) */
    int dp_rank;      /* explicit DP rank or -1 */
    int state;        /* state slots per room (model with state_bytes); the prefill
                         sends state + extra_state of them */
    int extra_state;
    const char *expect_fail; /* every decode rank fails with this text in its reason */
} room_opts_t;

/* Run n rooms through the whole protocol concurrently and verify every
 * byte; returns the number of failures (printing reasons). */
int run_rooms(cluster_t *c, int n, uint64_t first_room, const room_opts_t *o);

double now_s(void);

#endif
