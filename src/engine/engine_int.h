/* Internal structures of the transfer engine: its objects (engine,
 * session, connection, write), the core's prototypes and those of the
 * primitives the lanes call (docs/architecture.md, "The engine: core and
 * lanes"; the lane interface: lane.h; the fence: fence.h). One engine owns
 * one UCX context and worker; only the engine's progress thread calls UCX
 * on the worker (ep creation, rkey unpack, put, AM, flush), so the worker
 * runs in single-thread mode. Caller threads validate, queue commands and
 * wait. */
#ifndef KVB_ENGINE_INT_H
#define KVB_ENGINE_INT_H

#include <kvbridge/engine.h>
#include <ucp/api/ucp.h>
#include <sched.h>

#include "core/core.h"
#include "engine/cuda_drv.h"
#include "engine/fence.h"
#include "engine/handshake.h"
#include "engine/lane.h"
#include "engine/notif.h"
#include "engine/segtab.h"

/* What a connection's UCX endpoint was set up for (session.c): one-sided
 * puts (--transport shm, KVBRIDGE_LANE=put) or messages. */
typedef enum lane { LANE_PUT = 0, LANE_AM = 1 } lane_t;

typedef struct kvb__conn kvb__conn_t;

typedef struct kvb__session kvb__session_t;

typedef struct kvb__notify { /* a writer's control connection (listener side) */
    int fd;
    uint8_t host[16];     /* peer address (IPv4-mapped for v4): for log lines */
    bool authed;          /* it proved the engine secret */
    bool local;           /* it proved it runs on this host: may write by the direct lane,
                           * which the target does not see */
    bool used;            /* a write carried its token (engine secret): it wrote */
    uint64_t admitted_at; /* eng->am_admitted before its reply went out */
} kvb__notify_t;

/* One incarnation of a connection to a peer: its endpoint, the segment table
 * it advertised and the TCP control connection used for liveness. Immutable
 * for caller threads once published (segs); ep/fd owned by the progress
 * thread. Freed when retired and unreferenced. */
struct kvb__conn {
    kvb__session_t *sess;
    kvb_engine_h eng_backref;
    ucp_ep_h ep;
    kvb__segtab_t segs; /* remote segments; handle = ucp_rkey_h */
    int fd;
    uint64_t epoch, generation;
    lane_t lane;
    int local;     /* peer on this host (same boot id) */
    int refs;      /* atomic: session + each transfer using it */
    int dead;      /* atomic: peer lost; fail everything on it */
    int stale;     /* atomic: peer's table changed; re-handshake before next use */
    char why[256]; /* why it died */
    int am_auth;   /* the peer challenged us: token in every message */
    uint8_t am_token[KVB_HS_TOKEN_LEN]; /* its write-message token */
    uint8_t rx[KVB_HS_NOTICE_LEN];      /* partial notice from the control connection */
    struct kvb__direct_conn *direct; /* the direct lane's: the peer's files mapped here, or NULL */
    uint8_t *fence; /* same host: the peer's fence page mapped (direct lane), or NULL (fence.h) */
    struct kvb__cuda_conn *cuda; /* the peer's device-memory segments (mem_cuda.c), or NULL */
    struct kvb__cuda_ipc_conn *cuda_ipc; /* the CUDA IPC lane's imports (lane/cuda_ipc/), or NULL */
    size_t rxlen;
    /* progress thread: message-lane read requests of running reads in
     * flight on this connection, and their bytes (lane/msg/read.c counts
     * them per window slot, complete.c's finish drops a read's last ones):
     * kept within the target's share (amwire.h) */
    size_t am_reads_out;
    uint64_t am_read_out;
    kvb__conn_t *next_all;
};

enum sess_state { SESS_IDLE = 0, SESS_CONNECTING, SESS_READY };

struct kvb__session {
    char *sid;
    char host[KVB_HS_MAX_HOST];
    uint16_t port;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    enum sess_state state;
    kvb__conn_t *conn; /* current incarnation, ref held */
    /* sess_mu: the table (until evicted), each caller inside an engine call,
     * and each conn (which names it in its errors) hold a reference; an
     * evicted session is freed with its last one. */
    int refs, evicted;
    uint64_t used_ns; /* last acquire (eviction picks the least recent idle one) */
    kvb__session_t *next;
};

#define KVB__AM_WINDOW 8 /* unacknowledged messages per transfer */

/* A transfer's blocks as the caller gave them: plain or strided (runs.c).
 * The caller names them after the bytes (src → dst): a write's src is
 * local, a read's src remote (engine.h, "One-sided reads"). */
typedef struct kvb__wblocks {
    const kvb_strided_block_t *strided; /* or, when NULL, */
    const kvb_block_t *plain;
    size_t n;
    bool read; /* a one-sided read: src is the peer's side */
} kvb__wblocks_t;

/* Block i of w as the caller gave it, as a strided block (plain: count 1). */
static inline kvb_strided_block_t kvb__wb_raw(const kvb__wblocks_t *w, size_t i)
{
    if (w->strided != NULL)
        return w->strided[i];
    const kvb_block_t *b = &w->plain[i];
    return (kvb_strided_block_t){b->src, b->dst, b->len, b->len, b->len, 1};
}

/* Block i of w in the engine's form, where a block's `src` is always the
 * LOCAL side and `dst` the REMOTE one (so checks, coalescing and lane
 * choice serve reads and writes alike; x->read says which way the bytes
 * go): a read's block swapped. */
static inline kvb_strided_block_t kvb__wb_at(const kvb__wblocks_t *w, size_t i)
{
    kvb_strided_block_t b = kvb__wb_raw(w, i);
    if (w->read)
        b = (kvb_strided_block_t){b.dst, b.src, b.len, b.dst_stride, b.src_stride, b.count};
    return b;
}

/* The direct lane's form of a write: strided blocks, checked, with their
 * destination segment (an index into the connection's table, which is
 * fixed for the connection's life). count 1 for a contiguous block. */
typedef struct kvb__run {
    uint64_t src, dst, len;
    uint64_t sstride, dstride, count;
    long seg;
} kvb__run_t;

/* A transfer (kvb_xfer_h): a write, or a one-sided read (read set). The
 * core's part first, then what each lane keeps of it (read by that lane
 * only; the staging marks also by complete.c's progress loop, which frees
 * ring space as messages are acknowledged). Its blocks and runs are in the
 * engine's form: `src` the local side, `dst` the remote one, whichever way
 * the bytes go (kvb__wb_at). */
struct kvb_xfer {
    /* core: its peer, its lane, how it ends */
    kvb_engine_h eng;
    bool read; /* bytes go from the peer's dst into our src */
    kvb__conn_t *conn;
    const kvb__lane_t *lane;      /* the lane that moves it (lane.h) */
    const kvb__lane_t *lane_next; /* where it goes if that lane refuses it, or NULL */
    int cuda;                     /* a source or destination is CUDA device memory (mem_cuda.c) */
    uint64_t bytes, t0_ns;        /* its bytes and start (monotonic ns), for the metrics (0: off) */
    unsigned lane_ix;             /* its lane's place in the registry (the metrics' lane label) */
    uint64_t epoch;               /* writer grant stamped on every write (0: tag-only fence) */
    int refs;                     /* atomic: caller + engine */
    int status;                   /* atomic: KVB_ERR_INPROGRESS until final */
    int cancel;                   /* atomic */
    uint64_t expire_ns;           /* atomic: 0, or when a still-running transfer fails its conn
                                     (kvb_xfer_expire; the progress thread acts on it) */
    kvb_status_t fail_status;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    char err[KVB_ERRMSG_MAX];
    /* its blocks in its lane's form (runs.c; capacities in bytes for
     * kvb__bufpool_put): plain blocks, coalesced, for the UCX lanes; runs
     * (KVB__LANE_RUNS: the direct lanes) instead (blocks NULL) */
    kvb_block_t *blocks;
    size_t blocks_cap;
    size_t n; /* blocks */
    kvb__run_t *runs;
    size_t runs_cap, nruns;
    uint64_t nrows; /* the runs' rows in all */
    /* KVB_WRITE_PARAM_DIGEST: the unit asked for (0: none); the direct lane
     * (direct.c) hashes into dg[n_dg] (owned), each run's first unit at
     * dg_run0[run]; both NULL where the lane does not (kvb_xfer_digests) */
    uint64_t digest_unit;
    uint64_t *dg, *dg_run0;
    size_t n_dg;
    /* UCX lanes (message, put, staging), progress thread: complete.c's list */
    uint64_t id;
    size_t next;     /* next block to issue */
    size_t off;      /* message lane: bytes of blocks[next] already sent */
    size_t inflight; /* flushes or unacked messages */
    int failed;      /* error seen, waiting for inflight */
    int abandoned;   /* connection lost, outstanding ops ignored */
    int unsettled;   /* ended with ops in flight abandoned (kvb_xfer_drained) */
    /* message lane: a message's send ended with an error after UCX took it
     * (not refused by the call itself): its bytes may have reached the
     * target, which may place them, yet no ack will say so; UCX 1.13 can
     * complete a failed endpoint's sends before its error handler runs
     * (ucp_ep_set_failed: discard and purge, then the callback), so the
     * window alone does not show it. The transfer is then not drained. */
    int send_err;
    /* message lane, reads: rendezvous answers being received straight into
     * our pieces (read.c), and when x was abandoned (its connection failed):
     * such a read ends only once they ended or the peer time-out passed */
    size_t am_rx;
    uint64_t abandoned_ns;
    struct kvb_xfer *next_active;
    /* message lane: sequence numbers (low half of the message id) of the
     * messages in flight; an ack counts only when it names one of them, a
     * send that fails takes its own out (then no ack comes) */
    uint32_t am_win[KVB__AM_WINDOW];
    uint64_t am_pos[KVB__AM_WINDOW]; /* first byte of each message of am_win */
    /* message lane, reads: where each request of am_win's replies land
     * (our pieces, owned; freed by the reply or with x) and their bytes */
    ucp_dt_iov_t *am_iov[KVB__AM_WINDOW];
    size_t am_niov[KVB__AM_WINDOW];
    uint64_t am_len[KVB__AM_WINDOW];
    size_t msgs_sent, msgs_acked;
    uint64_t pos; /* bytes issued so far */
    /* CUDA staging lane: device sources staged through this ring (pinned,
     * stage_len bytes), or NULL; staged[i]: block i's src is an offset in
     * the stream of staged bytes, found at stage + offset % stage_len */
    void *stage;
    size_t stage_len;
    bool *staged;
    /* staged: bytes of blocks (in order) whose sources are readable
     * (atomic; UINT64_MAX all), set by the device-copy worker; its failure
     * (atomic status, then the reason, written before it) */
    uint64_t stage_ready;
    /* staged: bytes of blocks (in order) whose messages were acknowledged,
     * so their ring space may be reused (atomic; progress thread) */
    uint64_t stage_free;
    void *stage_job; /* caller, until the lane starts it: the staging job */
    int stage_status;
    char stage_why[340];
    /* CUDA staging lane, reads: a local destination is device memory (this
     * ordinal, else -1), so the message lane places the answers with the
     * driver (read.c) */
    int read_device;
    /* direct lanes (their copy queue's dmu) */
    int queued;  /* pieces left to claim (its group's cursor) */
    size_t busy; /* units being copied that include it */
    /* its notification (notif.h), owned, or NULL: sent once it succeeded,
     * before its end is published (notif_sending: handed to the progress
     * thread for that, so the next publish is the end) */
    uint8_t *notif;
    size_t notif_len;
    bool notif_sending;
};

/* A UCX request we own resources for (a message, a flush). UCX does not
 * always complete requests to a dead same-host peer (no peer-failure mode
 * there), so every such op is listed and what is left is freed after the
 * worker is destroyed. Progress thread only. */
typedef struct kvb__op {
    struct kvb__op *prev, *next;
    void (*release)(struct kvb__op *op);
} kvb__op_t;

/* cmdq.c: list op (its release runs after the worker is destroyed if it
 * is still listed then); untrack: off the list (no-op when not on it). */
void kvb__op_track(kvb_engine_h eng, kvb__op_t *op);
void kvb__op_untrack(kvb_engine_h eng, kvb__op_t *op);

/* jobs.c: the device-copy worker, one thread per engine started with the
 * first job: CUDA copies kept off the progress thread. A job runs in steps
 * on the worker; after its last one the progress thread calls done (it may
 * answer peers); if the engine stops first, drop is called instead (on the
 * destroying thread), exactly one of the two. */
typedef struct kvb__job kvb__job_t;
enum {
    KVB__JOB_DONE = 0,   /* run: the last step ran */
    KVB__JOB_MORE = 1,   /* run: a step ran, more to run */
    KVB__JOB_BLOCKED = 2 /* run: nothing could run (waits for kvb__jobs_kick) */
};
struct kvb__job {
    kvb__job_t *next;
    int (*run)(kvb__job_t *j); /* worker: one step; KVB__JOB_* */
    void (*done)(kvb_engine_h eng, kvb__job_t *j);
    void (*drop)(kvb_engine_h eng, kvb__job_t *j);
    bool bounded; /* counts against KVBRIDGE_CUDA_COPY_QUEUE (peer-driven jobs) */
};
typedef struct kvb__jobs {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    kvb__job_t *head, *tail, *done; /* queued (run order), finished */
    size_t n_bounded, max_bounded;
    size_t n_queued, n_blocked; /* jobs queued; steps blocked in a row */
    bool kicked;                /* kvb__jobs_kick since the worker last waited */
    int has_done;               /* atomic: done is not empty */
    bool started, stop;
    pthread_t thr;
} kvb__jobs_t;

typedef enum cmd_kind { CMD_XFER, CMD_CONNECT, CMD_RETIRE, CMD_KILL, CMD_NOTIF } cmd_kind_t;

typedef struct kvb__cmd {
    cmd_kind_t kind;
    struct kvb_xfer *xfer;
    kvb__conn_t *conn;
    kvb__session_t *sess;   /* CMD_KILL: every conn of it */
    kvb__hs_reply_t *reply; /* CMD_CONNECT input */
    uint64_t deadline;      /* CMD_CONNECT input: the UCX wire-up's (monotonic ns) */
    kvb_status_t result;    /* CMD_CONNECT output */
    char why[256];
    int done;
    bool wiring; /* CMD_CONNECT: done only once its UCX wire-up ends (session.c) */
    struct kvb__cmd *next;
} kvb__cmd_t;

#define KVB_HS_MAX_ACTIVE 32 /* concurrent handshakes; more wait in the backlog */

struct kvb_engine {
    kvb_engine_params_t params;
    char sid[KVB_HS_MAX_SID + 1];
    kvb__err_t err;
    ucp_context_h ctx;
    ucp_worker_h worker;
    int ucx_efd, evfd, epfd, listen_fd;
    size_t max_am_header;
    bool read_direct;   /* message-lane reads receive answers into the caller's pieces (read.c) */
    bool answer_direct; /* message-lane read answers go out of the registrations (target.c) */
    uint64_t epoch;
    char host_id[64];
    char *secret;        /* engine secret (copy) or NULL: auth off */
    uint32_t writer_tag; /* atomic: stamped on our message-lane writes */
    kvb__fence_t fence;  /* writer grants, the legacy tag list, our fence page (fence.h) */

    /* local registrations */
    pthread_mutex_t seg_mu;
    pthread_cond_t seg_cv;
    kvb__segtab_t segs; /* handle = ucp_mem_h */
    /* Regions registered with KVB_MEM_REGION_FIELD_LOCAL_ONLY: sources of
     * this engine's own transfers only, never in a peer's view (no remote
     * key, not in the handshake). Same seg_mu; never overlaps segs. */
    kvb__segtab_t local_segs;
    uint64_t generation;
    kvb__notify_t *notify; /* accepted control connections, oldest first (seg_mu) */
    size_t n_notify, cap_notify, max_notify; /* max: KVBRIDGE_MAX_CONTROL_CONNS */
    int *dead_fds; /* evicted (shut down), closed by the listener (seg_mu) */
    size_t n_dead, cap_dead;
    uint64_t notify_evicted, notify_misbehaved; /* seg_mu */
    uint64_t notify_refused;                    /* seg_mu: newcomers refused at the cap */
    size_t notify_pending; /* seg_mu: handshakes given a place under the cap, not yet listed */
    uint64_t am_admitted;  /* atomic: message-lane writes admitted so far (lane/msg/target.c) */
    size_t n_cuda_segs;    /* local registrations in device memory (seg_mu) */
    int cuda_device;       /* atomic: the device our copies run in (first CUDA registration), -1 */
    struct kvb__fdsrv *fdsrv; /* VMM descriptors for same-host writers (seg_mu; lane/cuda_ipc/) */
    bool fdsrv_failed;        /* seg_mu: it could not start (not tried again) */
    /* secret set: the message-lane token of each authenticated control
     * connection (seg_mu); dropped when its connection closes */
    struct kvb__am_tok {
        int fd;
        bool used; /* a write carried it (its control connection wrote) */
        uint8_t tok[KVB_HS_TOKEN_LEN];
    } * am_toks;
    size_t n_am_toks, cap_am_toks;

    /* sessions (sess_mu) */
    pthread_mutex_t sess_mu;
    kvb__session_t *sessions;
    kvb__session_t *sess_evicted;    /* out of the table, still named by a conn */
    size_t n_sessions, max_sessions; /* max: KVBRIDGE_MAX_SESSIONS */
    bool poll_yield; /* KVBRIDGE_POLL_YIELD: an empty poll gives up the CPU (kvb__poll_idle) */
    uint64_t sessions_evicted, sessions_refused;

    /* command queue to the progress thread (cmd_mu) */
    pthread_mutex_t cmd_mu;
    pthread_cond_t cmd_cv;
    kvb__cmd_t *cmd_head, *cmd_tail;

    /* progress thread only */
    struct kvb_xfer *active;
    kvb__conn_t *conns;         /* every live conn */
    struct kvb__wiring *wiring; /* new conns' UCX wire-ups in flight (session.c) */
    size_t am_pending;          /* incoming receives in progress, and read answers being sent:
                                   the loop keeps progressing UCX while any (engine.c) */
    size_t am_reads;      /* atomic writes: read answers being sent (lane/msg/target.c's caps) */
    size_t am_read_bytes; /* atomic writes: and their bytes */
    struct kvb__am_peer *am_peers; /* reply endpoints something of ours still answers over
                                      (lane/msg/target.c): their shares, their time bound */
    uint64_t am_reads_busy;        /* atomic: read requests refused as busy (the caps) */
    uint64_t am_peers_closed;      /* atomic: reply endpoints closed, answers stuck past the
                                      peer time-out */
    bool am_close_safe;            /* UCX ids endpoints with peer-failure handling indirectly
                                      (UCX_PROTO_INDIRECT_ID not off): such a reply endpoint may be
                                      force-closed (engine.c ucx_init) */
    int dead_conns;                /* a conn died since the last sweep */
    uint64_t conn_failures;        /* conns failed so far */
    kvb__op_t ops;                 /* outstanding ops (list head) */
    uint64_t next_xfer_id;
    uint64_t acks_ignored; /* acks from another connection or for no outstanding message */

    /* handshakes in progress, one detached thread each (hs_mu): a silent
     * peer holds only its own thread, for at most the 2 s handshake bound */
    pthread_mutex_t hs_mu;
    pthread_cond_t hs_cv;
    int hs_fds[KVB_HS_MAX_ACTIVE]; /* -1: free slot */
    int hs_active;                 /* threads not yet finished */
    uint64_t hs_refused;           /* connections closed: too many in progress */
    ucp_address_t *waddr;          /* this worker's address, fetched once */
    size_t waddr_len;

    char *name;                 /* the sender name our notifications carry (copy; notif.h) */
    kvb__notifq_t notifs;       /* notifications received, not yet taken (notif.h) */
    struct kvb__direct *direct; /* the direct lane's copy threads and warmer (lane/direct/) */
    kvb__jobs_t jobs;           /* device-copy worker (jobs.c) */

    pthread_t progress_thr, listen_thr;
    int stop; /* atomic */
    int stop_pipe[2];
};

/* Fault injection for tests only (tests/integration/sec2; hooks.c); all
 * zero in production, nothing sets them but a test. */
typedef struct kvb__test_hooks {
    int fail_rkey_unpack;   /* establishing a conn treats every remote key as unusable */
    int am_send_status;     /* message-lane sends complete with this UCX status */
    int target_drop_writes; /* write messages are dropped unanswered (a stalled peer) */
    int direct_stall_ms;    /* the next direct-lane unit stalls this long inside the fence, after
                               its check (a stuck copy thread or device); taken by one unit */
    int skip_remote_check;  /* a transfer's remote ranges are not checked here (a stale or hostile
                               peer: the target's own check answers); message lane only */
    int read_rx_unended;    /* a read's straight receives' ends are not counted (UCX never ending
                               them): an abandoned read waits the peer time-out (read.c) */
    int read_rx_waited;     /* set by the engine, read by tests (atomic add): reads abandoned with
                               answers being received into their pieces (complete.c) */
    int notif_wire_fault;   /* notifications go out malformed (notif.c): 1 data one byte short of
                               the lengths, 2 a message length past KVB_NOTIF_MAX_LEN, 3 a bad
                               magic, 4 a NUL inside the name */
    int read_share_ignored; /* message-lane reads issue requests past the target's per-connection
                               share (amwire.h): a reader that ignores it is refused busy */
    /* set by the engine, read by tests (tests/integration/fault8/test_sendorder.c): message-lane
       sends that completed with an error while their transfer was still live (before its
       connection was failed) and after; the first such UCX status */
    int am_send_err_live, am_send_err_after, am_send_err_first;
    /* the next flip_in_flight writes (a direct-lane copy piece, a message-lane message's first
       piece) of at least KVB__FLIP_MIN bytes land with their first byte XORed 0x01, the source
       untouched: a byte flipped in flight (tests/integration/integrity); each takes one */
    int flip_in_flight;
    /* set by the engine, read by tests (atomic add): items the direct lane's copy threads
       hashed (KVB_WRITE_PARAM_DIGEST), so a test sees which side hashed a room */
    unsigned digest_items; /* wraps; tests read differences */
} kvb__test_hooks_t;
extern kvb__test_hooks_t kvb__test_hooks;
/* Atomic (relaxed): a test sets a hook while engine threads run. */
#define KVB__HOOK(name) __atomic_load_n(&kvb__test_hooks.name, __ATOMIC_RELAXED)
#define KVB__HOOK_SET(name, v) __atomic_store_n(&kvb__test_hooks.name, (v), __ATOMIC_RELAXED)
#define KVB__FLIP_MIN 128 /* flip_in_flight leaves smaller pieces (the tests' aux items) alone */
/* Take one of a counting hook (> 0): true once per unit the test asked for. */
/* A caller's poll found nothing yet (a running transfer, no notification):
 * give up the CPU once. A caller that spins on such polls (NIXL's agents,
 * Mooncake's transfer_check_status loops) otherwise holds a core the
 * engine's own threads need to make that progress whenever the host has
 * fewer free cores than spinning threads; bench/results/nixl.md measured
 * 0.2 -> 1.9-4.5 GB/s under nixlbench on 2 vCPUs. One syscall when another
 * thread is runnable, nearly free when none is. KVBRIDGE_POLL_YIELD=0: off. */
static inline void kvb__poll_idle(kvb_engine_h eng)
{
    if (eng != NULL && eng->poll_yield)
        sched_yield();
}

static inline bool kvb__hook_take(int *h)
{
    int v = __atomic_load_n(h, __ATOMIC_RELAXED);
    while (v > 0)
        if (__atomic_compare_exchange_n(h, &v, v - 1, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
            return true;
    return false;
}

/* cmdq.c: queue cmd for the progress thread (wait: until it ran);
 * KVB_ERR_CANCELED when the engine is stopping. Any thread. */
kvb_status_t kvb__engine_submit(kvb_engine_h eng, kvb__cmd_t *cmd, bool wait);
void kvb__conn_put(kvb__conn_t *c); /* drop a reference (any thread) */
void kvb__conn_get(kvb__conn_t *c);
/* Any thread: have the progress thread close c's endpoint and fail c (its
 * transfers end KVB_ERR_PEER). */
void kvb__conn_kill(kvb_engine_h eng, kvb__conn_t *c, const char *why);

/* session.c */
/* Ready connection for sid (handshake on first use or after death/staleness,
 * within the connect time-out); returns a referenced conn. Waiting for
 * another thread's handshake, and our own, end by deadline (monotonic ns):
 * KVB_ERR_TIMEOUT. */
kvb_status_t kvb__session_acquire_by(kvb_engine_h eng, const char *sid, bool force_new,
                                     uint64_t deadline, kvb__conn_t **conn_p);
/* The same, deadline twice the connect time-out from now. */
kvb_status_t kvb__session_acquire(kvb_engine_h eng, const char *sid, bool force_new,
                                  kvb__conn_t **conn_p);
void kvb__sessions_free(kvb_engine_h eng);
/* Drop a reference taken on s (a conn's, when the conn is freed). */
void kvb__session_put(kvb_engine_h eng, kvb__session_t *s);
/* Progress thread: create ep and unpack rkeys for a handshake reply. An
 * endpoint that detects a dead peer (UCP_ERR_HANDLING_MODE_PEER) is then
 * flushed, and the command is done (cmd->wiring set meanwhile) only once
 * that flush ends: its UCX wire-up completed, failed, or passed
 * cmd->deadline (kvb__conn_wiring_expire). */
void kvb__conn_establish(kvb_engine_h eng, kvb__cmd_t *cmd);
/* Progress thread: end the wire-ups past their deadline (every one when
 * stopping: KVB_ERR_CANCELED), their commands done with the reason. */
void kvb__conn_wiring_expire(kvb_engine_h eng, bool stopping);
/* cmdq.c: mark a waited command done and wake its caller. */
void kvb__cmd_done(kvb_engine_h eng, kvb__cmd_t *cmd);
void kvb__conn_fail(kvb_engine_h eng, kvb__conn_t *c, const char *why);
void kvb__conn_on_fd(kvb_engine_h eng, kvb__conn_t *c);
void kvb__conn_release_ucx(kvb_engine_h eng, kvb__conn_t *c);
void kvb__conn_close_ep(kvb_engine_h eng, kvb__conn_t *c);

/* listener.c: the listener thread; at destroy (after it was joined), cut
 * the handshakes still in progress and wait for their threads. */
void *kvb__listen_main(void *arg);
void kvb__hs_drain(kvb_engine_h eng);
/* amtok.c: the message-lane token table (engine secret). Add the token of
 * control connection fd (KVB_ERR_NOMEM; takes seg_mu); forget it (seg_mu
 * held). */
kvb_status_t kvb__am_token_add(kvb_engine_h eng, int fd, const uint8_t tok[KVB_HS_TOKEN_LEN]);
void kvb__am_token_drop_locked(kvb_engine_h eng, int fd);
/* Is tok the message-lane token of one of our live authenticated control
 * connections (engine secret)? Marks that connection as one that wrote.
 * Any thread (takes seg_mu). */
bool kvb__am_token_live(kvb_engine_h eng, const uint8_t *tok);
/* register.c: release a registration's mapping (seg_mu held, or the
 * engine being freed). */
void kvb__seg_unmap(kvb_engine_h eng, kvb__seg_t *seg);

/* runs.c: a write's blocks, checked and coalesced on the caller's thread */
/* Check every block of w against our registrations (source) and c's
 * (destination): dst_seg[i] gets block i's destination segment (-1 when
 * empty). KVB_ERR_INVALID (a strided block breaking its rules),
 * KVB_ERR_BOUNDS (*retry_p set when a destination was the cause: the
 * peer may have registered more). The engine's error set. */
kvb_status_t kvb__wblocks_check(kvb_engine_h eng, kvb__conn_t *c, const kvb__wblocks_t *w,
                                long *dst_seg, bool *retry_p);
/* xfer.c: kvb_engine_write (kvb_engine_read when w->read) of w (plain or
 * strided), with its time-out and settle rules; the engine's error set. */
kvb_status_t kvb__xfer_sync(kvb_engine_h eng, const char *sid, const kvb__wblocks_t *w,
                            double timeout_s);
/* x->runs from checked w (x->blocks, x->n for plain w on the UCX lanes:
 * kvb__xfer_blocks). KVB_ERR_NOMEM. */
kvb_status_t kvb__runs_build(struct kvb_xfer *x, const kvb__wblocks_t *w, const long *dst_seg);
/* x->blocks from x->runs, one block per row with contiguous rows merged,
 * for the lanes that cannot walk strides; x->runs freed. KVB_ERR_NOMEM. */
kvb_status_t kvb__runs_expand(struct kvb_xfer *x);
/* x->blocks from plain checked blocks (neighbours contiguous on both sides
 * in one destination segment merged). KVB_ERR_NOMEM. */
kvb_status_t kvb__xfer_blocks(struct kvb_xfer *x, const kvb_block_t *b, const long *dst_seg,
                              size_t n);

/* mem_cuda.c: CUDA device memory as a memory kind (docs/engine.md). A
 * registration's device record; ipc, vmm*, handle: the CUDA IPC lane's
 * export (lane/cuda_ipc/). */
typedef struct kvb__cuda_seg {
    int device;          /* local: ordinal here; remote: the peer's (informational) */
    bool ipc;            /* local: handle exports the allocation (legacy IPC) */
    bool vmm;            /* local: the VMM allocations holding the segment exported */
    uint32_t vmm_n;      /* local, vmm: allocations, mapped back to back from the first */
    int *vmm_fds;        /* local, vmm: our shareable handles (closed at unregistration) */
    uint64_t *vmm_sizes; /* local, vmm: their sizes */
    uint64_t vmm_size;   /* local, vmm: their sum */
    uint64_t alloc_off;  /* local: offset of the segment in that allocation (the first) */
    uint8_t handle[KVB_HS_CUDA_HANDLE]; /* local, ipc: the IPC handle */
} kvb__cuda_seg_t;
/* seg_mu held: classify r (AUTO), check it and fill seg's CUDA part;
 * *cuda_p: device memory (then no UCX registration). */
kvb_status_t kvb__cuda_map_region(kvb_engine_h eng, const kvb_mem_region_ex_t *r, kvb__seg_t *seg,
                                  bool *cuda_p);
void kvb__cuda_unmap_seg(kvb_engine_h eng, kvb__seg_t *seg); /* seg_mu held */
/* seg_mu held: the reply's device-memory table, which segments are device
 * memory (the lanes add what their writers need: lane.h `advertise`). */
kvb_status_t kvb__cuda_table(kvb_engine_h eng, kvb__hs_reply_t *r);
/* Writer, before the handshake's conn is established: room for the peer's
 * device-memory table (KVB_ERR_NOMEM). Before the lanes attach: mark the
 * peer's device segments (s->cuda). Freed with the conn. */
kvb_status_t kvb__cuda_conn_alloc(kvb__conn_t *c, const kvb__hs_reply_t *r);
void kvb__cuda_mark(kvb__conn_t *c, const kvb__hs_reply_t *r);
void kvb__cuda_conn_free(kvb__conn_t *c);
/* The memory kind of each side of the batch: CUDA when a block's source
 * (destination) there is device memory (dst_seg: the peer's segment of each
 * block, -1 for empty ones). */
void kvb__mem_kinds(kvb_engine_h eng, const kvb__conn_t *c, const long *dst_seg,
                    const kvb__wblocks_t *w, kvb__mem_kind_t *src_p, kvb__mem_kind_t *dst_p);
/* jobs.c (see kvb__job_t) */
void kvb__jobs_init(kvb__jobs_t *q);
/* Queue j; false when it cannot run there (the engine is stopping, a
 * bounded job finds the bound reached, no thread): run it inline. */
bool kvb__jobs_push(kvb_engine_h eng, kvb__job_t *j);
/* Progress thread: call done for finished jobs; true when there were any. */
bool kvb__jobs_progress(kvb_engine_h eng);
/* Wake the progress thread (a job made progress it may act on). */
void kvb__jobs_wake(kvb_engine_h eng);
/* Wake the worker (a blocked job may run: staging memory was freed). When
 * every queued job is blocked the worker waits for this, or 2 ms. */
void kvb__jobs_kick(kvb_engine_h eng);
/* Before the progress thread stops: join the worker, drop every job left. */
void kvb__jobs_stop(kvb_engine_h eng);
void kvb__jobs_free(kvb__jobs_t *q);

/* complete.c: a write's end, and the progress thread's list of writes */
/* Drop a reference to x (any thread); the last frees it. */
void kvb__xfer_release(struct kvb_xfer *x);
/* Set x's final status, wake its waiters and drop the engine's reference. */
void kvb__xfer_publish(struct kvb_xfer *x, kvb_status_t st);
/* Progress thread: x failed with st and a reason (fmt with a and b); the
 * first failure counts. x ends once nothing of it is in flight. */
void kvb__xfer_fail(struct kvb_xfer *x, kvb_status_t st, const char *fmt, const char *a,
                    const char *b);
/* The UCX lanes' submit (lane.h): hand each write to the progress thread. */
kvb_status_t kvb__xfer_queue(kvb_engine_h eng, struct kvb_xfer *const *xs, size_t n);
/* Progress thread: list x (CMD_XFER); give each listed write's lane a turn
 * (true when something was issued); fail c's writes; end every write. */
void kvb__xfer_start(kvb_engine_h eng, struct kvb_xfer *x);
bool kvb__xfer_progress_all(kvb_engine_h eng);
void kvb__xfer_fail_conn(kvb_engine_h eng, kvb__conn_t *c, const char *why);
/* The engine stops: end every transfer CANCELED, except (last false) a
 * read whose answers are still being received into its pieces (read.c);
 * last: the worker is never progressed again, those end too (drained). */
void kvb__xfer_cancel_all(kvb_engine_h eng, bool last);
/* Progress thread: the listed write of id, or NULL. */
struct kvb_xfer *kvb__xfer_find(kvb_engine_h eng, uint64_t id);

#endif
