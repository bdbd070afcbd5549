/* The connector tests' one cluster harness (docs/testing.md, "The cluster
 * harness"): ranks (engine + manager) whose KV, aux and state buffers sit in
 * one arena with canary gaps, byte patterns and their verifiers, bounded
 * waits, bootstrap servers that can be stopped and restarted on their port,
 * child processes (this executable run with --child) driven by lines on
 * pipes, and a multi-rank cluster that runs whole rooms across TP/PP/DP. */
#ifndef KVB_TEST_CLUSTER_H
#define KVB_TEST_CLUSTER_H

#include <kvbridge/kvbridge.h>
#include <kvbridge/conn.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define KVBH_CANARY 4096      /* bytes of each gap, never registered */
#define KVBH_CANARY_BYTE 0xA5 /* what a gap holds */
#define KVBH_AUX_ITEM 64      /* bytes of one aux item */
#define KVBH_AUX_ITEMS 32     /* aux items per rank */
#define KVBH_STATE_BUFS 2     /* state buffers of a rank with state_bytes > 0 */
#define KVBH_MAX_STATE 8      /* state buffers of a rank with knobs n_state */
#define KVBH_STATE_ITEMS 64   /* items per state buffer */
#define KVBH_MAX_KV 16        /* KV buffers per rank */
#define KVBH_MEM_MALLOC (-1)  /* arena source: malloc */
#define KVBH_MEM_SHARED (-2)  /* arena source: kvb_mem_alloc (the direct lane's memory) */
#define KVBH_MEM_PACKED (-3)  /* arena source: malloc, no canary between buffers (below) */
#define KVBH_MAX_ROOMS 64     /* rooms of one child prefill or decode */
#define KVBH_MAX_PAGES 16     /* pages per room of the child servers */

/* ---- time ---- */

double kvbh_now(void); /* CLOCK_MONOTONIC seconds */
void kvbh_sleep(double s);
/* The whole file at path, NUL-terminated, malloc'ed (caller frees); NULL,
 * said on stderr, when it cannot be read. */
char *kvbh_read_file(const char *path);

/* ---- ranks ---- */

typedef struct kvbh_geom {
    int layers, heads, head_bytes, page;
    uint64_t pool_pages;
    int mla;         /* one latent buffer per layer instead of K and V */
    int state_bytes; /* > 0: KVBH_STATE_BUFS state buffers of items this size */
} kvbh_geom_t;

/* Where a rank sits; NULL everywhere means the single rank (TP 1, PP 1, DP 1). */
typedef struct kvbh_place {
    int tp, tp_size, pp, pp_size, dp, dp_size;
} kvbh_place_t;

/* Everything optional: zero / NULL keeps the library's default. */
typedef struct kvbh_knobs {
    double hb_interval; /* > 0: heartbeat interval, with hb_misses */
    int hb_misses;
    double boot_timeout, wait_timeout;
    const char *bootstrap_token;
    const char *curve_sk, *curve_client_sk, *curve_allowed;
    const char *host;                  /* the manager's control address */
    const kvb_engine_params_t *engine; /* secret, transport, host, time-outs */
    int draft;                    /* draft-model layers appended after the target's (same heads;
                                     params draft_layers): K target, V target, K draft, V draft */
    const char *cachepd_contract; /* params cachepd_contract (TokenSpeed's contract of the
                                     model), NULL none */
    int n_state;                  /* > 0: n_state (<= KVBH_MAX_STATE) state buffers, buffer i of
                                     KVBH_STATE_ITEMS items of state_items[i] bytes, instead of
                                     the geometry's (state_bytes); kvbh_rank_start_at only:
                                     kvbh_arena_len and kvbh_layout know the geometry's alone */
    const uint64_t *state_items;
} kvbh_knobs_t;

typedef struct kvbh_rank {
    kvbh_geom_t g;
    int tp, tp_size, pp, pp_size, dp;
    int first_layer, n_layers, local_heads, first_head;
    kvb_engine_h eng;
    kvb_manager_h mgr;
    uint8_t *arena;
    size_t arena_len;
    int mem;         /* KVBH_MEM_MALLOC, _SHARED, _PACKED or a memfd mapped shared */
    int n_kv, draft; /* draft: the last draft layers' buffers (kvbh_knobs_t) */
    uint64_t item_len, buf_len;
    uint8_t *kv[KVBH_MAX_KV];
    uint8_t *aux;
    int n_state; /* state buffers, KVBH_STATE_ITEMS items of state_item[i] bytes each */
    uint64_t state_item[KVBH_MAX_STATE];
    uint8_t *state[KVBH_MAX_STATE];
} kvbh_rank_t;

/* Bytes of the arena of a rank of g at place p (same in every process). */
size_t kvbh_arena_len(const kvbh_geom_t *g, const kvbh_place_t *p);
/* Lay r's buffers over arena; fill: zeros in the pools, 0xA5 in the gaps
 * (0: a view of an arena another process laid out). */
void kvbh_layout(kvbh_rank_t *r, const kvbh_geom_t *g, const kvbh_place_t *p, uint8_t *arena,
                 int fill);
/* The same with draft layers appended (kvbh_knobs_t draft). */
size_t kvbh_arena_len_draft(const kvbh_geom_t *g, const kvbh_place_t *p, int draft);
void kvbh_layout_draft(kvbh_rank_t *r, const kvbh_geom_t *g, const kvbh_place_t *p, uint8_t *arena,
                       int fill, int draft);
/* Start a rank. mem: KVBH_MEM_MALLOC, KVBH_MEM_SHARED or a memfd (>= 0, at
 * least kvbh_arena_len bytes); KVBH_MEM_PACKED: malloc, the KV, aux and state
 * buffers side by side (canaries only before the first and after the last),
 * so a page past a buffer's pool is the next buffer's registered memory,
 * what a destination bounds check must catch. boot: NULL or the bootstrap
 * address the manager registers with (a prefill) or is given (a decode). k
 * may be NULL.
 * Returns the failing call's status (printed), r zeroed then. */
kvb_status_t kvbh_rank_start_at(kvbh_rank_t *r, const kvbh_geom_t *g, const kvbh_place_t *p,
                                kvb_mode_t mode, const char *boot, int mem, const kvbh_knobs_t *k);
/* The single rank; a decode is not given boot. */
kvb_status_t kvbh_rank_start(kvbh_rank_t *r, const kvbh_geom_t *g, kvb_mode_t mode,
                             const char *boot, int mem, const kvbh_knobs_t *k);
void kvbh_rank_stop(kvbh_rank_t *r); /* safe on a zeroed or failed rank */
/* Every canary byte intact? Prints the first broken one. */
bool kvbh_canaries_ok(const kvbh_rank_t *r, const char *who);

/* ---- patterns: byte k of request page `page` of buffer buf of room ---- */

uint8_t kvbh_pat(uint64_t room, int buf, uint64_t page, uint64_t k);
/* Request page i at src[i] in every KV buffer, and aux item aux_index. */
void kvbh_fill(kvbh_rank_t *r, uint64_t room, const int32_t *src, int n, int aux_index);
/* Wrong bytes of room on a decode rank (pages dst[0..n), aux item aux_index
 * when >= 0). */
uint64_t kvbh_verify(const kvbh_rank_t *r, uint64_t room, const int32_t *dst, int n, int aux_index);
/* The same for KV buffer b alone. */
uint64_t kvbh_verify_buf(const kvbh_rank_t *r, uint64_t room, int b, const int32_t *dst, int n);
/* A guard: byte value v over pages dst[0..n) of every KV buffer (and aux
 * item aux_index when >= 0); kvbh_guard_bad counts bytes that differ. */
void kvbh_guard_fill(kvbh_rank_t *r, const int32_t *dst, int n, int aux_index, uint8_t v);
uint64_t kvbh_guard_bad(const kvbh_rank_t *r, const int32_t *dst, int n, int aux_index, uint8_t v);
uint64_t kvbh_guard_bad_buf(const kvbh_rank_t *r, int b, const int32_t *dst, int n, uint8_t v);
/* Default page layout of a room: pool_pages / 16 slots of 16 pages side by
 * side, room r in slot r % slots (so rooms of consecutive ids do not share
 * pages); the prefill's source pages run backwards, the decode's forwards. */
int32_t kvbh_src_page(const kvbh_geom_t *g, uint64_t room, int i);
int32_t kvbh_dst_page(const kvbh_geom_t *g, uint64_t room, int i);
int kvbh_room_aux(uint64_t room); /* room % KVBH_AUX_ITEMS */
/* Both page lists of a room's n pages (either may be NULL). */
void kvbh_room_pages(const kvbh_geom_t *g, uint64_t room, int n, int32_t *src, int32_t *dst);

/* ---- bounded waits ---- */

/* Poll until terminal or timeout; returns the last poll value. */
kvb_poll_t kvbh_wait_receiver(kvb_receiver_h rc, double timeout_s);
kvb_poll_t kvbh_wait_sender(kvb_sender_h s, double timeout_s);
/* Sender ready to send (WaitingForInput or later); -1 on Failed/time-out. */
int kvbh_wait_sender_ready(kvb_sender_h s, double timeout_s);
/* Poll n receivers until each has ended or t0 + timeout_s; returns how many
 * are still open. *other_p: how many ended other than Failed; *t_last_p:
 * seconds from t0 to the last end (a peer declared lost, say). */
int kvbh_wait_receivers_fail(kvb_receiver_h *rc, int n, double t0, double timeout_s, int *other_p,
                             double *t_last_p);
/* Receivers on d for rooms first.. (pages kvbh_dst_page, aux kvbh_room_aux);
 * 0 or -1. */
int kvbh_receivers(kvbh_rank_t *d, const char *boot, uint64_t first, int count, int n,
                   kvb_receiver_h *rc);
/* One whole room from prefill p to decode d (in this process), two chunks,
 * bytes verified; 0 or -1 (reason printed). Pages src0.. and dst0.. reversed. */
int kvbh_run_room(kvbh_rank_t *p, kvbh_rank_t *d, const char *boot, uint64_t room, int n,
                  int32_t src0, int32_t dst0, int aux);
/* The same on the given page lists (n <= 256). */
int kvbh_run_room_pages(kvbh_rank_t *p, kvbh_rank_t *d, const char *boot, uint64_t room,
                        const int32_t *src, const int32_t *dst, int n, int aux);

/* ---- bootstrap servers ---- */

typedef struct kvbh_boot {
    kvb_bootstrap_server_h h;
    char addr[128];
    unsigned port;
    const char *token; /* kept for a restart */
} kvbh_boot_t;

/* port 0: ephemeral; token NULL: none (else auth_reads too). 0 or -1. */
int kvbh_boot_start(kvbh_boot_t *b, unsigned port, const char *token);
void kvbh_boot_stop(kvbh_boot_t *b); /* safe twice */
/* Stop, then start again on the same port (bounded retries while the port is
 * not free yet); addr unchanged. 0 or -1. */
int kvbh_boot_restart(kvbh_boot_t *b);
unsigned kvbh_addr_port(const char *addr); /* the port of "host:port" */

/* ---- a bootstrap server, one prefill and one decode rank in this process ---- */

typedef struct kvbh_pair {
    kvbh_boot_t boot;
    kvbh_rank_t pre, dec;
} kvbh_pair_t;

/* Both ranks on g, arenas from mem (KVBH_MEM_MALLOC, _SHARED or _PACKED);
 * pre / dec: knobs per side (NULL: defaults). The failing call's status
 * (printed), everything stopped then. */
kvb_status_t kvbh_pair_start(kvbh_pair_t *p, const kvbh_geom_t *g, int mem, const kvbh_knobs_t *pre,
                             const kvbh_knobs_t *dec);
void kvbh_pair_stop(kvbh_pair_t *p); /* safe on a zeroed or failed pair */
/* One room of n pages between a pair, ready to send: the prefill's pages
 * src filled with room's pattern, a receiver initialised on dst (aux slot
 * 0) and a sender initialised and ready; the caller sends, then destroys
 * both. The failing call's status (a sender not ready within 10 s:
 * KVB_ERR_TIMEOUT). */
kvb_status_t kvbh_pair_room(kvbh_pair_t *p, uint64_t room, const int32_t *src, const int32_t *dst,
                            int n, kvb_receiver_h *rc_p, kvb_sender_h *s_p);

/* ---- a raw ZeroMQ peer: frames as any peer on the network could send them ---- */

struct kvb__frames_buf; /* proto/frames.h */

typedef struct kvbh_push {
    void *zctx, *sock;
} kvbh_push_t;

/* A PUSH socket (linger 0, send time-out 5 s, high-water mark 100000)
 * connected to endpoint ("ip:port", as kvb_manager_endpoint says); keys NULL:
 * plain TCP, else CURVE with {server public, client public, client secret}.
 * 0 or -1 (printed). */
int kvbh_push_open(kvbh_push_t *p, const char *endpoint, const char *const *keys);
/* One message of n frames; 0 or -1 (a send failed or timed out). */
int kvbh_push_frames(kvbh_push_t *p, const void *const *f, const size_t *len, int n);
int kvbh_push_send(kvbh_push_t *p, const struct kvb__frames_buf *b); /* encoded frames */
/* Waits 0.1 s (linger 0: queued messages leave first), then closes. */
void kvbh_push_close(kvbh_push_t *p);
/* Encoded into b (reset first): a KV-args registration for session sid whose
 * control endpoint is ep ("ip:port"), n KV pointers ptr0 + i * step, one aux
 * pointer, TP rank 0 of 1; a transfer info for room to the decode at ep with
 * pages[0..n) and aux_index, one destination. The encoder's status. */
kvb_status_t kvbh_reg_frames(struct kvb__frames_buf *b, const char *sid, const char *ep,
                             uint64_t ptr0, uint64_t step, size_t n, uint64_t aux_ptr,
                             uint64_t item_len);
kvb_status_t kvbh_xfer_frames(struct kvb__frames_buf *b, uint64_t room, const char *sid,
                              const char *ep, const int32_t *pages, size_t n, int aux_index);

/* ---- processes ---- */

typedef struct kvbh_child {
    pid_t pid;
    int to, from; /* write to its stdin, read its stdout */
} kvbh_child_t;

/* In main, first: argv[1] == "--child" makes this a child (it dies with its
 * parent, PR_SET_PDEATHSIG; returns 1), else it records argv[0] for
 * kvbh_child_spawn, ignores SIGPIPE and returns 0. */
int kvbh_main_init(int argc, char **argv);
/* The harness's own children (argv[2] "prefill", "bprefill", "decode",
 * "bootsrv", see kvb_child.c); returns the exit status, or -1 when argv[2]
 * names none of them (the test's own children then). */
int kvbh_child_main(int argc, char **argv);
/* Exec this executable with --child and args; stdin/stdout are pipes. */
int kvbh_child_spawn(kvbh_child_t *c, char *const args[]);
/* Read one line (without newline) within timeout_s; 0 or -1. */
int kvbh_child_line(kvbh_child_t *c, char *buf, size_t cap, double timeout_s);
/* Send cmd + newline, expect the answer want exactly (printed if not). */
int kvbh_child_ask(kvbh_child_t *c, const char *cmd, const char *want, double timeout_s);
void kvbh_child_kill(kvbh_child_t *c);  /* SIGKILL and reap */
void kvbh_child_close(kvbh_child_t *c); /* EOF on its stdin, reap (kill after 10 s) */
/* A prefill child (rank + its own bootstrap server, "boot ADDR") on g;
 * commands in kvb_child.c. addr gets the bootstrap address. 0 or -1. */
int kvbh_spawn_prefill(kvbh_child_t *c, char *addr, size_t cap);
/* A prefill child registered with the bootstrap server at boot (no server of
 * its own; it survives the server's death); ep gets its control endpoint. */
int kvbh_spawn_bprefill(kvbh_child_t *c, const char *boot, char *ep, size_t cap);
/* A decode child (rank on kvbh_child_geom(), arena in memfd or malloc for -1)
 * with receivers for rooms first..first+count-1 of n pages, up and "ready". */
int kvbh_spawn_decode(kvbh_child_t *c, const char *boot, int memfd, uint64_t first, int count,
                      int n);
/* A bootstrap server child on port (0: ephemeral; restarts on a port not yet
 * free are retried, bounded); addr gets "host:port". 0 or -1. */
int kvbh_spawn_boot(kvbh_child_t *c, unsigned port, char *addr, size_t cap);
/* The geometry of the child prefill/decode/bprefill ranks: KVBH_CHILD_GEOM
 * unless the parent set another (before the spawn; state buffers and MLA are
 * not passed on). */
extern const kvbh_geom_t KVBH_CHILD_GEOM;
void kvbh_child_geom_set(const kvbh_geom_t *g);
kvbh_geom_t kvbh_child_geom(void);

/* kill(SIGSTOP) returns before the target stops: wait (bounded) until /proc
 * says it is stopped. */
void kvbh_wait_stopped(pid_t pid);
long kvbh_rss_kib(pid_t pid); /* VmRSS, -1 unknown */
int kvbh_count_fds(void);     /* open fds of this process */

/* ---- a cluster of ranks in this process: rooms across TP/PP/DP ---- */

typedef struct kvbh_cluster {
    kvbh_geom_t g;
    kvbh_boot_t boot;
    char boot_addr[128];
    int ptp, ppp, pdp, dtp;
    kvbh_rank_t *pre; /* [dp][tp][pp] */
    kvbh_rank_t *dec; /* [tp] */
    int no_aux;       /* set by the caller: the decodes' dialect carries no aux data (CachePD: the
                         first token rides the status), so aux items are not verified */
    int mem;          /* the ranks' memory: KVBH_MEM_MALLOC, or _SHARED (cfg's shared) */
} kvbh_cluster_t;

typedef struct kvbh_cluster_cfg {
    kvbh_geom_t g;
    int ptp, ppp, pdp, dtp;
    const char *server_token; /* bootstrap server token (auth_reads), NULL none */
    kvbh_knobs_t pre, dec;    /* per side */
    int shared; /* nonzero: every rank's memory from kvb_mem_alloc (the direct lane's), else
                   malloc */
} kvbh_cluster_cfg_t;

/* Bootstrap server + prefill ranks + decode ranks; the rank start's status. */
kvb_status_t kvbh_cluster_start(kvbh_cluster_t *c, const kvbh_cluster_cfg_t *cfg);
void kvbh_cluster_stop(kvbh_cluster_t *c);
kvbh_rank_t *kvbh_cluster_prefill(kvbh_cluster_t *c, int dp, int tp, int pp);
/* One more rank of the cluster's geometry on its bootstrap server. */
kvb_status_t kvbh_cluster_rank(kvbh_cluster_t *c, kvbh_rank_t *r, const kvbh_place_t *p,
                               kvb_mode_t mode, const kvbh_knobs_t *k);

typedef struct kvbh_room_opts {
    int chunks;       /* number of uneven chunks */
    int prefix_pages; /* decode prefix skip */
    int use_mask;     /* page-transfer mask (every third page held) */
    int dp_rank;      /* explicit DP rank or -1 */
    int state;        /* state slots per room (geometry with state_bytes); the
                         prefill sends state + extra_state of them */
    int extra_state;
    const char *expect_fail;   /* every decode rank fails with this text in its reason */
    int expect_integrity_fail; /* every decode rank fails its KV integrity check, the reason
                                  naming a buffer and page that hold a wrong byte; the
                                  senders end Success */
} kvbh_room_opts_t;

/* Run n rooms through the whole protocol concurrently, every KV, aux and
 * state byte verified on every decode rank (a pattern keyed by global layer
 * and head, so TP/PP re-slicing is checked); returns the failures (printed). */
int kvbh_run_rooms(kvbh_cluster_t *c, int n, uint64_t first_room, const kvbh_room_opts_t *o);

#endif
