/* Helpers of the connector failure tests: a rank (engine + manager) whose KV
 * and aux buffers sit in one arena with canary gaps between and around them
 * (the gaps are never registered, so a write outside a pool is either refused
 * by the engine or caught by the canary check), a byte pattern per (room,
 * buffer, request page, byte), child processes driven by lines on a pipe. */
#ifndef KVB_TEST_FAULT_UTIL_H
#define KVB_TEST_FAULT_UTIL_H

#include <kvbridge/kvbridge.h>
#include <kvbridge/conn.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define FR_CANARY 4096
#define FR_CANARY_BYTE 0xA5
#define FR_AUX_ITEM 64
#define FR_AUX_ITEMS 32
#define FR_MAX_KV 16

typedef struct fgeom {
    int layers, heads, head_bytes, page;
    uint64_t pool_pages;
} fgeom_t;

typedef struct fknobs {
    double hb_interval; /* 0 = default */
    int hb_misses;
    double boot_timeout, wait_timeout; /* 0 = default */
    int shared_pool; /* arena from kvb_mem_alloc: same-host writers take the direct lane */
} fknobs_t;

typedef struct frank {
    fgeom_t g;
    kvb_engine_h eng;
    kvb_manager_h mgr;
    uint8_t *arena;
    size_t arena_len;
    int mapped; /* arena is an mmap of a memfd; 2: from kvb_mem_alloc */
    int n_kv;
    uint64_t item_len, buf_len;
    uint8_t *kv[FR_MAX_KV];
    uint8_t *aux;
} frank_t;

double fnow(void);
void fsleep(double s);
/* Bytes of the arena for g (same layout in every process). */
size_t farena_len(const fgeom_t *g);
/* Lay the buffers out over arena (filled with zeros, canaries 0xA5). */
void flayout(frank_t *r, const fgeom_t *g, uint8_t *arena, int fill);
/* Create a rank: arena from memfd (>= 0, mapped shared) or malloc. mode
 * prefill needs boot. Returns 0 or -1 (reason printed). */
int frank_start(frank_t *r, const fgeom_t *g, kvb_mode_t mode, const char *boot, int memfd,
                const fknobs_t *k);
void frank_stop(frank_t *r);
/* Every canary byte intact? Prints the first broken one. */
bool fcanaries_ok(const frank_t *r, const char *who);

uint8_t fpat(uint64_t room, int buf, uint64_t page, uint64_t k);
void ffill(frank_t *r, uint64_t room, const int32_t *src, int n, int aux_index);
/* Wrong bytes of room on a decode rank (pages dst[0..n), aux item). */
uint64_t fverify(const frank_t *r, uint64_t room, const int32_t *dst, int n, int aux_index);

/* Poll until terminal or deadline; returns the last poll value. */
kvb_poll_t fwait_receiver(kvb_receiver_h rc, double timeout_s);
kvb_poll_t fwait_sender(kvb_sender_h s, double timeout_s);
/* Sender ready to send (WaitingForInput or later); -1 on Failed/timeout. */
int fwait_sender_ready(kvb_sender_h s, double timeout_s);

/* One whole room from prefill P to decode D (in this process), two chunks,
 * bytes verified; 0 or -1 (reason printed). */
int frun_room(frank_t *p, frank_t *d, const char *boot, uint64_t room, int n, int32_t src0,
              int32_t dst0, int aux);

/* Child process: exec self with args, stdin/stdout pipes. */
typedef struct fchild {
    pid_t pid;
    int to, from; /* write to its stdin, read its stdout */
} fchild_t;
int fchild_spawn(fchild_t *c, const char *self, char *const argv_tail[]);
/* Read one line (without newline) within timeout_s; 0 or -1. */
int fchild_line(fchild_t *c, char *buf, size_t cap, double timeout_s);
void fchild_kill(fchild_t *c);
void fchild_close(fchild_t *c);

#endif
