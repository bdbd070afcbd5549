/* Small one-prefill / one-decode setup for the resource-cap and bounds
 * tests: an MLA model of CAPS_LAYERS layers whose decode KV buffers are
 * adjacent slices of one allocation followed by a guard zone, so a write
 * past a buffer's end is seen as changed guard (or next-buffer) bytes. */
#ifndef KVB_TEST_CAPS_UTIL_H
#define KVB_TEST_CAPS_UTIL_H

#include <kvbridge/kvbridge.h>
#include <stdbool.h>
#include <stdint.h>

#define CAPS_LAYERS 2
#define CAPS_PAGE 4                      /* tokens per page */
#define CAPS_ITEM (CAPS_PAGE * 64)       /* bytes of one page of one layer */
#define CAPS_POOL 8                      /* pages per buffer */
#define CAPS_BUF (CAPS_POOL * CAPS_ITEM) /* bytes of layer buffer 0 */
/* Layer buffer l starts at CAPS_OFF(l) and holds (l + 1) * CAPS_POOL pages:
 * the pool is CAPS_POOL pages (the smallest buffer), and page CAPS_POOL of
 * layer 0 is the first page of layer 1 (registered memory). */
#define CAPS_OFF(l) ((size_t)(l) * (size_t)((l) + 1) / 2 * CAPS_BUF)
#define CAPS_LEN(l) ((size_t)((l) + 1) * CAPS_BUF)
#define CAPS_GUARD (CAPS_BUF) /* bytes after the last buffer */
#define CAPS_TOTAL (CAPS_OFF(CAPS_LAYERS) + CAPS_GUARD)
#define CAPS_FILL 0xA5 /* decode memory before any write */

typedef struct caps_rank {
    kvb_engine_h eng;
    kvb_manager_h mgr;
    uint8_t *mem; /* CAPS_TOTAL bytes: buffers, then the guard */
    uint8_t aux[64];
} caps_rank_t;

typedef struct caps_curve { /* NULL fields: CURVE off / defaults */
    const char *sk, *client_sk, *allowed;
} caps_curve_t;

typedef struct caps_pair {
    kvb_bootstrap_server_h boot;
    char boot_addr[64];
    caps_rank_t pre, dec;
} caps_pair_t;

int caps_boot_start(caps_pair_t *p);
int caps_rank_start(caps_pair_t *p, caps_rank_t *r, kvb_mode_t mode, const caps_curve_t *cv);
void caps_rank_stop(caps_rank_t *r);
int caps_pair_start(caps_pair_t *p, const caps_curve_t *cv); /* boot + both ranks */
void caps_pair_stop(caps_pair_t *p);

/* Prefill page src of layer l for room: pattern bytes. */
void caps_fill_prefill(caps_rank_t *r, uint64_t room, const int32_t *src, int n);
/* Wrong bytes on the decode for room at pages dst (all layers). */
uint64_t caps_verify(const caps_rank_t *r, uint64_t room, const int32_t *dst, int n);
/* Decode bytes that are not CAPS_FILL in [off, off+len). */
uint64_t caps_changed(const caps_rank_t *r, uint64_t off, uint64_t len);

/* Run one room end to end (sender and receiver); 0: both Success and the
 * bytes verify. timeout_s bounds the whole. */
int caps_room(caps_pair_t *p, uint64_t room, const int32_t *src, const int32_t *dst, int n,
              double timeout_s);

/* Poll a receiver / sender until terminal or timeout_s. */
kvb_poll_t caps_wait_recv(kvb_receiver_h rc, double timeout_s);
kvb_poll_t caps_wait_send(kvb_sender_h s, double timeout_s);

/* "ip" and port of a manager's control endpoint. */
void caps_endpoint(kvb_manager_h m, char *ip, size_t len, uint16_t *port_p);

#endif
