/* kvbridge transfer engine: one-sided batched writes from this process's
 * registered memory into memory a peer process registered, and one-sided
 * reads the other way ("One-sided reads" below), over UCX.
 *
 * Thread safety: an engine is thread-safe. Several threads may register,
 * write (sync or async) and query at once, to one or several sessions.
 * A transfer handle (kvb_xfer_h) may be tested/waited/cancelled from any
 * thread but freed exactly once. kvb_engine_destroy must not race any other
 * call on the same engine. */
#ifndef KVBRIDGE_ENGINE_H
#define KVBRIDGE_ENGINE_H

#include <kvbridge/common.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kvb_engine *kvb_engine_h;
typedef struct kvb_xfer *kvb_xfer_h;

/* Which lane moves the bytes. AUTO: UCX one-sided put where it is fast
 * (shared memory / CMA on one host, RDMA), UCX active messages into the
 * registered destination over TCP otherwise. TCP and SHM force a lane. */
typedef enum kvb_transport {
    KVB_TRANSPORT_AUTO = 0,
    KVB_TRANSPORT_TCP = 1,
    KVB_TRANSPORT_SHM = 2
} kvb_transport_t;

/* Memory kind of a registration. CUDA: device memory of the CUDA driver API
 * (cuMemAlloc, PyTorch's caching allocator, VMM), moved with the driver
 * loaded at run time (dlopen "libcuda.so.1", or the library
 * KVBRIDGE_CUDA_LIB names): without a driver, registering it fails
 * KVB_ERR_UNSUPPORTED naming why. AUTO: the engine asks the driver
 * (cuPointerGetAttribute) and takes HOST for memory the driver does not know
 * (or without a driver). docs/engine.md "CUDA device memory". */
typedef enum kvb_mem_type { KVB_MEM_HOST = 0, KVB_MEM_CUDA = 1, KVB_MEM_AUTO = 2 } kvb_mem_type_t;

enum kvb_engine_param_field {
    KVB_ENGINE_PARAM_HOST = 1u << 0,
    KVB_ENGINE_PARAM_PORT = 1u << 1,
    KVB_ENGINE_PARAM_TRANSPORT = 1u << 2,
    KVB_ENGINE_PARAM_CONNECT_TIMEOUT = 1u << 3,
    KVB_ENGINE_PARAM_PEER_TIMEOUT = 1u << 4,
    KVB_ENGINE_PARAM_AM_CHUNK = 1u << 5,
    KVB_ENGINE_PARAM_SECRET = 1u << 6,
    KVB_ENGINE_PARAM_COPY_THREADS = 1u << 7,
    KVB_ENGINE_PARAM_SERVE_READS = 1u << 8,
    KVB_ENGINE_PARAM_READS_NEED_GRANT = 1u << 9,
    KVB_ENGINE_PARAM_NAME = 1u << 10,
};

/* Creation parameters; only the fields named in field_mask are read, the
 * others take their defaults (shown). Environment twins in brackets. */
typedef struct kvb_engine_params {
    uint64_t field_mask;
    const char *host;          /* listen address, "127.0.0.1"; IPv6 allowed; a
                                  host name ("localhost") is resolved at
                                  creation (the first address that binds; the
                                  session id names that address) and one that
                                  does not resolve fails KVB_ERR_INVALID */
    uint16_t port;             /* listen port, 0 = ephemeral */
    kvb_transport_t transport; /* AUTO [KVBRIDGE_TRANSPORT=auto|tcp|shm] */
    double connect_timeout_s;  /* handshake bound, 5 s [KVBRIDGE_CONNECT_TIMEOUT] */
    double peer_timeout_s;     /* dead peer fails its batches within, 2 s
                                  [KVBRIDGE_PEER_TIMEOUT] */
    size_t am_chunk_bytes;     /* aggregation size of the message lane, 4 MiB */
    const char *secret;        /* shared secret of the deployment, NULL = off
                                  [KVBRIDGE_ENGINE_SECRET]. Set: both sides prove
                                  it (mutual challenge-response, HMAC-SHA256): the
                                  listener hands out its segment table only to
                                  writers that prove it, seals its reply with its
                                  own proof, and refuses write messages without a
                                  live connection's token; this engine, as a
                                  writer, writes only to listeners that prove it.
                                  A writer refused, challenged without a secret,
                                  or facing a listener without the challenge or
                                  with a wrong seal, fails with KVB_ERR_AUTH. ""
                                  = off. Copied. See docs/security.md. */
    unsigned copy_threads;     /* direct lane (see kvb_mem_alloc): this engine's
                                  writer threads, 2; 0 = lane off
                                  [KVBRIDGE_COPY_THREADS] */
    int serve_reads;           /* answer peers' one-sided read requests (message
                                  lane), 1 [KVBRIDGE_SERVE_READS=0|1]; 0: each
                                  is refused with KVB_ERR_UNSUPPORTED ("serves
                                  no reads"), nothing gathered. PD connectors
                                  never read: an engine that only receives KV
                                  can turn it off. Same-host peers that map
                                  the memory (direct lane, same user) and the
                                  put lane's remote keys are not asked
                                  (docs/security.md). */
    int reads_need_grant;      /* serve a read request only under a live grant
                                  (kvb_engine_grant_writer), 0
                                  [KVBRIDGE_READS_NEED_GRANT=0|1]; 1: one at
                                  epoch 0 (no grant) is refused with
                                  KVB_ERR_FENCED ("only under a live grant"),
                                  nothing gathered. 0: an epoch-0 read is
                                  served unless its tag is fenced
                                  (kvb_engine_fence_writer). Message lane only,
                                  as serve_reads. */
    const char *name;          /* this engine's name in the notifications it sends
                                  ("Notifications" below): 1..KVB_NOTIF_NAME_MAX
                                  bytes, else create fails KVB_ERR_INVALID;
                                  default (NULL or unset) its session id. Copied. */
} kvb_engine_params_t;

/* Create an engine listening on host:port. NULL params = all defaults.
 * On success *engine_p is set; on error returns a status and logs why. */
KVB_API kvb_status_t kvb_engine_create(const kvb_engine_params_t *params, kvb_engine_h *engine_p);

/* Stop the engine's threads, fail its in-flight transfers (KVB_ERR_CANCELED),
 * unregister everything and free it. Transfer handles must still be freed. */
KVB_API void kvb_engine_destroy(kvb_engine_h engine);

/* The string peers use to reach this engine: "host:port", IPv6 "[addr]:port".
 * Owned by the engine, valid until destroy. */
KVB_API const char *kvb_engine_session_id(kvb_engine_h engine);

/* The lane this engine was created with. */
KVB_API kvb_transport_t kvb_engine_transport(kvb_engine_h engine);

/* Detailed text of the most recent error of a call the calling thread made
 * on this engine (which peer, which range): other threads failing meanwhile
 * do not change it. A thread that never failed a call on this engine gets
 * the engine's most recent error from any thread. The pointer is to a
 * thread-local copy, valid until the calling thread's next call of this
 * function. Failures of asynchronous transfers: kvb_xfer_error. */
KVB_API const char *kvb_engine_last_error(kvb_engine_h engine);

/* Allocate length bytes of host memory (page-aligned, zeroed) that writers
 * on this host can fill directly: once registered, an engine of another
 * process on the same host (transport AUTO, copy_threads > 0) maps it and its
 * copy threads write the blocks straight in: one copy by the writer, no CPU
 * on this side. Backed by a sealed anonymous shared file (memfd), opened by
 * the writer through /proc/<pid>/fd/<fd>; needs the same user or ptrace
 * read rights, else writers keep to the UCX lanes. Thread-safe. */
KVB_API kvb_status_t kvb_mem_alloc(size_t length, void **addr_p);
/* Free an allocation of kvb_mem_alloc (unregister it first). Writers that
 * still map it keep the file alive; nothing of theirs faults.
 * KVB_ERR_NOT_FOUND for an address kvb_mem_alloc did not return. */
KVB_API kvb_status_t kvb_mem_free(void *addr);

/* ---- One kvb_mem_alloc allocation mapped by several processes ----
 * (Mooncake 0.3.14's SharedSegment.) The owner exports an allocation into a
 * blob of KVB_MEM_EXPORT_LEN bytes (its pid, descriptor, file identity and
 * the file's random nonce); another process of this host run by the same
 * user (or with ptrace read rights) imports the blob and gets the same
 * memory mapped read-write at its own address. The importer opens the file
 * through /proc/<pid>/fd/<fd> and maps it only when device, inode, size,
 * seals and nonce all match the blob, so a forged or stale blob maps
 * nothing. The owner may free its allocation while importers map it: the
 * file lives until the last mapping goes. */
#define KVB_MEM_EXPORT_LEN 64

/* addr: the start of a live kvb_mem_alloc allocation (KVB_ERR_NOT_FOUND
 * otherwise). Writes the blob. Thread-safe. */
KVB_API kvb_status_t kvb_mem_export(const void *addr, uint8_t blob[KVB_MEM_EXPORT_LEN]);
/* Map the allocation a blob names: *addr_p its first byte, *length_p its
 * usable bytes (the owner's length rounded up to pages). Errors:
 * KVB_ERR_INVALID (NULL arguments, not a blob of this version),
 * KVB_ERR_NOT_FOUND (the owner or its file is gone, the file is not the
 * one the blob names, or its sizes are impossible; the reason is logged),
 * KVB_ERR_NOMEM. Thread-safe. */
KVB_API kvb_status_t kvb_mem_import(const uint8_t blob[KVB_MEM_EXPORT_LEN], void **addr_p,
                                    size_t *length_p);
/* Unmap an import (unregister it from engines first). KVB_ERR_NOT_FOUND for
 * an address kvb_mem_import did not return. */
KVB_API kvb_status_t kvb_mem_unimport(void *addr);

/* Does the current connection to session_id write directly into mapped
 * memory (1), through UCX (0), or is there none yet (KVB_ERR_NOT_FOUND; also
 * for a NULL argument)? Thread-safe; the answer can change with the next
 * handshake. */
KVB_API int kvb_engine_session_direct(kvb_engine_h engine, const char *session_id);

typedef struct kvb_mem_region {
    void *addr;
    size_t length;
    kvb_mem_type_t mem_type;
} kvb_mem_region_t;

/* The regions session_id registered for peers, as its latest handshake with
 * this engine says (connecting first when there is none: within timeout_s or
 * the connect time-out, whichever is shorter; timeout_s <= 0: the connect
 * time-out), sorted by address (the handshake does not carry the order they
 * were registered in), lowest first: the first
 * cap of them into addrs[i] / lens[i] (either may be NULL), their number into
 * *count_p (may exceed cap). session_id equal to this engine's own session id:
 * its own table, the one its handshake sends (local-only regions are not in
 * it), without connecting. Errors: KVB_ERR_INVALID (NULL engine, session_id or
 * count_p), the connection's (KVB_ERR_PEER unreachable or unresolvable,
 * KVB_ERR_TIMEOUT, KVB_ERR_AUTH). Thread-safe. (Mooncake's
 * get_first_buffer_address.) */
KVB_API kvb_status_t kvb_engine_peer_regions(kvb_engine_h engine, const char *session_id,
                                             double timeout_s, uint64_t *addrs, uint64_t *lens,
                                             size_t cap, size_t *count_p);

/* Register [addr, addr+length) as a source and as a destination peers may
 * write, and as memory peers may read (one-sided reads). A range overlapping a registered one →
 * KVB_ERR_OVERLAP; zero length or NULL → KVB_ERR_INVALID. Peers see the new table on their next
 * write. KVB_MEM_CUDA: the range must lie inside one device allocation (KVB_ERR_INVALID otherwise,
 * also for host memory); KVB_ERR_UNSUPPORTED without a CUDA driver. */
KVB_API kvb_status_t kvb_engine_register(kvb_engine_h engine, void *addr, size_t length,
                                         kvb_mem_type_t mem_type);

/* All-or-nothing batch: on error nothing of the batch stays registered. */
KVB_API kvb_status_t kvb_engine_register_batch(kvb_engine_h engine, const kvb_mem_region_t *regions,
                                               size_t count);

/* A region with the fields that came later; only those named in field_mask
 * are read (the others: defaults). */
enum kvb_mem_region_field {
    KVB_MEM_REGION_FIELD_DEVICE = 1u << 0,     /* device (default: any) */
    KVB_MEM_REGION_FIELD_LOCAL_ONLY = 1u << 1, /* local_only (default: 0) */
};

typedef struct kvb_mem_region_ex {
    uint64_t field_mask;
    void *addr;
    size_t length;
    kvb_mem_type_t mem_type; /* HOST, CUDA or AUTO */
    int device;              /* CUDA: the ordinal the caller expects the memory on
                                (in this process); another one → KVB_ERR_INVALID */
    /* Nonzero: a region only this engine uses, as the source of its own
     * writes (Mooncake's register_memory(..., remote_accessible=False)).
     * Peers never see it: it is not in the table the handshake sends (no
     * remote key, no shared mapping), so no peer can write into it or read
     * from it. Host memory only (device memory → KVB_ERR_INVALID). It must
     * not overlap any registration either way (KVB_ERR_OVERLAP), nor share
     * a kvb_mem_alloc allocation with a normal registration, either order
     * (KVB_ERR_INVALID: same-host peers map that whole file read-write);
     * kvb_engine_unregister removes it as any other. */
    int local_only;
} kvb_mem_region_ex_t;

/* As kvb_engine_register_batch. region_size: sizeof(kvb_mem_region_ex_t) as
 * the caller was compiled (the array's stride), so a later, longer struct
 * keeps older callers working; smaller than this version's first fields →
 * KVB_ERR_INVALID. */
KVB_API kvb_status_t kvb_engine_register_ex(kvb_engine_h engine, const kvb_mem_region_ex_t *regions,
                                            size_t count, size_t region_size);

/* What memory addr is: *type_p HOST or CUDA (then *device_p its ordinal in
 * this process, else -1). HOST without a CUDA driver. Thread-safe. Errors:
 * KVB_ERR_INVALID (a NULL argument), KVB_ERR_IO (the driver failed to say;
 * logged). */
KVB_API kvb_status_t kvb_mem_query(const void *addr, kvb_mem_type_t *type_p, int *device_p);

/* Is the CUDA driver loaded (1) or not (0)? Loads it on first call; why, when
 * not NULL, gets the reason it is not (valid for the process's life). */
KVB_API int kvb_cuda_available(const char **why_p);

/* Unregister the region that starts at addr; unknown → KVB_ERR_NOT_FOUND.
 * Waits until no incoming message-lane write into it (nor, on a tcp engine,
 * a read answer sent straight out of it) is in progress, at most
 * twice the peer time-out; past that KVB_ERR_TIMEOUT and the region STAYS
 * registered (a stalled writer that resumes still completes its receive into
 * it): do not free the memory; retry later, or kvb_engine_close_session the
 * writer on its side first. The batch form tries every address and returns
 * the last error. */
KVB_API kvb_status_t kvb_engine_unregister(kvb_engine_h engine, void *addr);
KVB_API kvb_status_t kvb_engine_unregister_batch(kvb_engine_h engine, void *const *addrs,
                                                 size_t count);

/* One block of a batch: copy len bytes from local address src (inside a
 * local registration) to remote address dst (inside one registration of the
 * peer). */
typedef struct kvb_block {
    uint64_t src;
    uint64_t dst;
    uint64_t len;
} kvb_block_t;

/* A strided block: count rows of len bytes; row r copies from
 * src + r * src_stride to dst + r * dst_stride. One descriptor stands for the
 * head slice of every token row of a run of pages (heterogeneous TP), so a
 * write of it is checked, queued and walked per descriptor, not per row.
 * Rules (else KVB_ERR_INVALID): count >= 1; when count > 1, dst_stride >= len
 * (destination rows do not overlap) and the last row's addresses do not
 * wrap. Every row lies inside one registration on each side: the first
 * row's and the last row's (KVB_ERR_BOUNDS otherwise). Lanes that cannot
 * walk strides (the message lane, tcp) send the rows as plain blocks. */
typedef struct kvb_strided_block {
    uint64_t src;
    uint64_t dst;
    uint64_t len;        /* bytes per row */
    uint64_t src_stride; /* bytes between row starts in the source */
    uint64_t dst_stride; /* and in the destination */
    uint64_t count;      /* rows */
} kvb_strided_block_t;

/* Synchronous batched write to session_id ("host:port"). Returns KVB_OK only
 * when every byte is in the destination memory. Opens the session on first
 * use: the handshake ends within the connect time-out or timeout_s, whichever
 * is shorter; so does waiting for another thread's handshake with the same
 * session (timeout_s counts the set-up). Errors: KVB_ERR_BOUNDS (a range
 * outside the registered memory on either side; nothing written),
 * KVB_ERR_PEER (unreachable or died), KVB_ERR_AUTH (the peer requires an
 * engine secret and ours is missing or wrong, or we have one and the peer did
 * not prove it), KVB_ERR_TIMEOUT (timeout_s passed;
 * timeout_s <= 0 waits without bound), KVB_ERR_INVALID. On KVB_ERR_TIMEOUT
 * the batch was cancelled and settled, or, when the peer did not settle
 * within its peer time-out, the connection was failed (endpoint closed, the
 * next write re-handshakes): either way nothing reads the source blocks any
 * more and the caller may reuse them (returns within about timeout_s + 2 peer
 * time-outs). KVB_ERR_UNSETTLED instead of KVB_ERR_TIMEOUT when the peer
 * stopped answering with bytes of the batch in flight: those may still be
 * placed in its memory should it resume (do not reuse that destination for
 * other data before the peer is known dead or re-fenced). The blocks array is
 * not retained after return. Up to at least 100k blocks per batch. */
KVB_API kvb_status_t kvb_engine_write(kvb_engine_h engine, const char *session_id,
                                      const kvb_block_t *blocks, size_t count, double timeout_s);

/* ---- Pages x fields grids ----
 * The batch shape of Mooncake's batch_transfer_sync_write_pages and of
 * TokenSpeed's ts_mooncake_write_pages: num_pages page pairs and num_fields
 * rows of KVB_PAGE_FIELD_COLS int64 values each, fields[5 f + 0..4] =
 * (src_base, src_stride, dst_base, dst_stride, length). Span (f, i) copies
 * length_f bytes from local src_base_f + src_pages[i] * src_stride_f to the
 * peer's dst_base_f + dst_pages[i] * dst_stride_f. Bases are read as
 * unsigned 64-bit addresses. Rules (else KVB_ERR_INVALID): pages >= 0; per
 * row length > 0 and strides >= 0; no span's first or last byte passes
 * 2^64 - 1; num_pages * num_fields fits a size_t; arrays not NULL. An empty
 * grid (num_pages * num_fields == 0) passes before any check. */
#define KVB_PAGE_FIELD_COLS 5

/* Check a grid, moving nothing: KVB_OK or KVB_ERR_INVALID, then *why_p (when
 * not NULL) is a static text naming the broken rule. O(num_pages +
 * num_fields). Thread-safe; needs no engine. */
KVB_API kvb_status_t kvb_pages_check(const int64_t *src_pages, const int64_t *dst_pages,
                                     size_t num_pages, const int64_t *fields, size_t num_fields,
                                     const char **why_p);

/* Write a grid to session_id and wait. The spans are taken field-major (all
 * pages of row 0, then of row 1, ...) in batches of at most max_batch_size
 * spans (0: one batch). A batch is converted, in this call, into strided
 * blocks (a run of pages whose indices step evenly on both sides, without
 * overlapping destination rows, becomes one kvb_strided_block_t; any other
 * span a block of one row) and written as one transfer, which gets
 * timeout_s plus 1 ns per byte it moves (timeout_s <= 0: no bound); the next
 * batch starts once it completed. Returns KVB_OK when every batch did. An
 * empty grid: KVB_OK before any check. A grid breaking the rules:
 * KVB_ERR_INVALID before anything is sent, kvb_pages_check's text in
 * kvb_engine_last_error. Otherwise the first failing batch's status, with
 * kvb_engine_write's errors and settle guarantees (KVB_ERR_BOUNDS: nothing
 * of that batch written; a strided block must lie in one registration per
 * side, so a run of pages crossing from one registration into another
 * fails KVB_ERR_BOUNDS); later batches are not started, earlier ones stay
 * written. Arrays are not retained. Thread-safe as kvb_engine_write. */
KVB_API kvb_status_t kvb_engine_write_pages(kvb_engine_h engine, const char *session_id,
                                            const int64_t *src_pages, const int64_t *dst_pages,
                                            size_t num_pages, const int64_t *fields,
                                            size_t num_fields, size_t max_batch_size,
                                            double timeout_s);

/* Asynchronous form: validates and queues the batch, returns a handle in
 * *xfer_p. The blocks array is copied. Session set-up as kvb_engine_write's,
 * bounded by the connect time-out (waiting for another thread's handshake:
 * twice that). Same errors as kvb_engine_write for
 * what can be known before any byte moves. */
KVB_API kvb_status_t kvb_engine_write_async(kvb_engine_h engine, const char *session_id,
                                            const kvb_block_t *blocks, size_t count,
                                            kvb_xfer_h *xfer_p);

/* KVB_ERR_INPROGRESS while running (the calling thread then yields the CPU
 * once, so a caller spinning on it leaves the engine's threads room:
 * KVBRIDGE_POLL_YIELD=0 turns that off); then KVB_OK or the final error. */
KVB_API kvb_status_t kvb_xfer_test(kvb_xfer_h xfer);

/* Wait up to timeout_s (<= 0: no bound) for the end; returns the final status
 * or KVB_ERR_TIMEOUT (the transfer goes on). */
KVB_API kvb_status_t kvb_xfer_wait(kvb_xfer_h xfer, double timeout_s);

/* Ask the transfer to stop: no new block is issued after this returns; the
 * transfer ends KVB_ERR_CANCELED once blocks already issued have settled
 * (wait for it before reusing the destination). No-op after the end. */
KVB_API kvb_status_t kvb_xfer_cancel(kvb_xfer_h xfer);

/* Give up on a transfer whose caller's deadline passed: cancel it and, should
 * it not have ended within the engine's peer time-out (its peer stopped
 * answering), fail its connection as a timed-out kvb_engine_write does, so it
 * ends within about twice the peer time-out whatever the peer does. Other
 * transfers on that connection fail with it (KVB_ERR_PEER); the next one
 * re-handshakes. Non-blocking, idempotent, thread-safe; then kvb_xfer_test /
 * kvb_xfer_wait for the end and kvb_xfer_drained for whether anything of it
 * can still land. The one way the Mooncake drop-in's asynchronous batches
 * and kvb_engine_write's time-out settle. */
KVB_API kvb_status_t kvb_xfer_expire(kvb_xfer_h xfer);

/* The item hashes a write made while copying (KVB_WRITE_PARAM_DIGEST): once
 * it succeeded, *h_p (owned by xfer, valid until kvb_xfer_free) holds *n_p,
 * one per digest_unit bytes of its blocks in block, row and unit order
 * (empty blocks skipped), each XXH3-64 of the source bytes seeded with
 * their destination address (docs/integrity.md's item hash). Only the direct
 * lane makes them (host memory, every block a whole number of units); the
 * copy thread hashes each unit right after copying it, while the source is
 * in cache. KVB_ERR_INPROGRESS: running, and they will be made (known at
 * once after the submitting call returned); KVB_ERR_UNSUPPORTED: not asked
 * for or not made by its lane (hash the sources yourself); a failed write's
 * status. h_p, n_p may be NULL. Thread-safe. */
KVB_API kvb_status_t kvb_xfer_digests(kvb_xfer_h xfer, const uint64_t **h_p, size_t *n_p);

/* Detailed reason of a failed transfer ("" while running or on success).
 * Valid until kvb_xfer_free. */
KVB_API const char *kvb_xfer_error(kvb_xfer_h xfer);

/* Whether nothing of the transfer can still move: 1 once it is final and
 * every byte it issued was either placed or is proven never to be (the
 * peer acknowledged each message, a cancel settled, the direct lane's own
 * copy threads are done with it); 0 while it runs, and for a transfer
 * that failed with operations still in flight to a peer that stopped
 * answering (its connection was failed: bytes the peer already received
 * may still be placed if it resumes, docs/engine.md "Drained"), or one
 * of whose messages' sends failed after the transport took it. A
 * successful transfer is drained; so is a final read on the message and
 * staging lanes (their answers are placed only while the read runs; one
 * whose connection failed while an answer was being received straight
 * into its memory ends once UCX ended that receive, and is reported 0 if
 * UCX did not within the peer time-out), not one of the put lane's
 * abandoned gets. Mooncake 0.3.14's scatter tickets map
 * onto it (FAILED_DRAINED vs COMPLETION_UNKNOWN). */
KVB_API int kvb_xfer_drained(kvb_xfer_h xfer);

/* Release the handle. A running transfer is cancelled first (no wait). */
KVB_API void kvb_xfer_free(kvb_xfer_h xfer);

/* Declare every connection of session_id dead now (an unresponsive peer):
 * the current one and older ones transfers still hold (the session moves to
 * a new connection when the peer's registrations change); their transfers
 * fail with KVB_ERR_PEER at once and the next write re-handshakes. Bytes the peer already holds in
 * its receive queues may still be placed when it resumes. KVB_ERR_NOT_FOUND for an unknown session.
 * Thread-safe. */
KVB_API kvb_status_t kvb_engine_close_session(kvb_engine_h engine, const char *session_id);

/* Caps on what peers can make an engine hold (docs/security.md), and what
 * they cost. Set field_mask to the groups your struct has (a caller built
 * against an older, shorter struct stays safe); only those are written. */
enum kvb_engine_limits_field {
    KVB_ENGINE_LIMITS_CONTROL = 1u << 0,  /* control_conns .. handshakes_refused */
    KVB_ENGINE_LIMITS_SESSIONS = 1u << 1, /* sessions .. sessions_refused */
    KVB_ENGINE_LIMITS_DIRECT = 1u << 2,   /* direct_files_refused, direct_files_unpopulated */
    KVB_ENGINE_LIMITS_NOTIFS = 1u << 3,   /* notifs_queued .. notifs_refused */
    KVB_ENGINE_LIMITS_READS = 1u << 4,    /* read_answers .. read_conns_closed */
};

typedef struct kvb_engine_limits {
    uint64_t field_mask;
    /* Listener: writers' control connections held now (at most
     * KVBRIDGE_MAX_CONTROL_CONNS, default 1024; at the cap a newcomer
     * displaces the oldest connection that never wrote, proved no more than
     * it and is not same-host proven, else the newcomer is refused;
     * docs/security.md), closed to make room, closed because the peer sent
     * bytes (writers send none after the handshake), and connections
     * refused: KVB_HS_MAX_ACTIVE handshakes in progress, or at the cap with
     * none that may be closed. */
    uint64_t control_conns, control_conns_evicted, control_conns_misbehaved;
    uint64_t handshakes_refused;
    /* Writer: sessions (peers written to) held now (at most
     * KVBRIDGE_MAX_SESSIONS, default 4096), freed while idle to make room,
     * and writes refused (KVB_ERR_PEER) because every session was busy. */
    uint64_t sessions, sessions_evicted, sessions_refused;
    /* Writer, direct lane: peer files not mapped because they exceed the
     * segments advertised in them (page-rounded) plus the trailer plus
     * KVBRIDGE_DIRECT_MAP_SLACK (default 64 MiB): those segments keep to the
     * UCX lanes; and files mapped without prefaulting because the
     * connection's prefaulted total would pass KVBRIDGE_DIRECT_POPULATE_MAX
     * (default 4 GiB), or because the background warmer (default on,
     * KVBRIDGE_DIRECT_WARM_CPU) warms them instead. */
    uint64_t direct_files_refused, direct_files_unpopulated;
    /* Notifications received and not yet taken (at most
     * KVBRIDGE_NOTIF_QUEUE_MAX, default 65536, and KVBRIDGE_NOTIF_QUEUE_BYTES
     * of messages and names, default 64 MiB), their bytes; notifications
     * dropped because the queue was full; and refused: malformed, too long,
     * or without the engine-secret token where one is required. */
    uint64_t notifs_queued, notifs_queued_bytes, notifs_dropped, notifs_refused;
    /* Target, message lane: answers to peers' read requests being sent now
     * and their bytes (each a copy; at most 256 answers, 256 MiB, and of
     * them at most an eighth, 32 answers and 32 MiB, to one connection);
     * requests refused KVB_ERR_BUSY at those caps so far; and readers'
     * connections closed because none of their answers left within the
     * peer time-out (docs/engine.md "Read caps"). */
    uint64_t read_answers, read_answer_bytes, reads_refused_busy, read_conns_closed;
} kvb_engine_limits_t;

/* Snapshot of the engine's caps counters into the fields of *limits_p that
 * its field_mask names. Thread-safe; cannot fail. */
KVB_API void kvb_engine_limits(kvb_engine_h engine, kvb_engine_limits_t *limits_p);

/* ---- The writer fence ----
 * A target admits a writer's writes by grant: (writer tag, epoch). The
 * writer engine stamps its tag (kvb_engine_set_writer_tag, set once, before
 * writing) and, per transfer, the epoch the target granted for that work
 * (kvb_engine_write_async_ex). The target refuses every write, on every lane
 * it can check (message lane and direct lane; the put lane cannot be checked
 * by the target, see docs/engine.md), whose epoch is not a live grant of
 * that tag: the writer's transfer fails KVB_ERR_FENCED ("writer fenced ...")
 * and nothing of that write is placed. A revoked grant
 * is never admitted again; new work gets a new grant. Thread-safe. */

/* Target: a fresh epoch for writer tag (unique for this engine, above the
 * epochs of earlier engines on this host while the clock does not go back).
 * KVB_ERR_NOMEM past 4096 grants live or still draining. */
KVB_API kvb_status_t kvb_engine_grant_writer(kvb_engine_h engine, uint32_t tag, uint64_t *epoch_p);

/* Target: revoke (tag, epoch), then wait up to wait_s (<= 0: just look) for
 * the writes admitted before the revoke (message-lane receives being placed,
 * direct-lane units being copied) and the reads (message-lane answers being
 * gathered, or, on a tcp engine, being sent straight out of the memory:
 * bounded by the peer time-out, docs/engine.md "One-sided reads") to end.
 * KVB_OK: none is left, no byte of that grant can land from now on, and no
 * byte written from now on reaches a read of it that succeeds (also for a
 * grant unknown or already drained). KVB_ERR_INPROGRESS: some may still
 * land or be read (a stalled writer or reader); call again to re-check. A direct-lane writer
 * process that no longer exists counts as ended. KVB_ERR_INVALID for tag or epoch 0. */
KVB_API kvb_status_t kvb_engine_revoke_writer(kvb_engine_h engine, uint32_t tag, uint64_t epoch,
                                              double wait_s);

/* Legacy tag-only fence, for writes stamped epoch 0: fenced = 1 refuses
 * every later epoch-0 write of tag, 0 lifts that. Epoch-0 receives already
 * in progress are not waited for. The connector uses grants instead. */
KVB_API void kvb_engine_set_writer_tag(kvb_engine_h engine, uint32_t tag);
KVB_API void kvb_engine_fence_writer(kvb_engine_h engine, uint32_t tag, int fenced);

enum {
    KVB_WRITE_PARAM_EPOCH = 1u << 0,
    KVB_WRITE_PARAM_NOTIF = 1u << 1,
    KVB_WRITE_PARAM_DIGEST = 1u << 2 /* digest_unit: item hashes while copying (kvb_xfer_digests) */
};

typedef struct kvb_write_params {
    uint64_t field_mask; /* KVB_WRITE_PARAM_* */
    uint64_t epoch;      /* the target's grant this write is made under (0: none) */
    /* KVB_WRITE_PARAM_NOTIF: a notification sent to the peer once the
     * transfer succeeded ("Notifications" below); notif_len bytes (at most
     * KVB_NOTIF_MAX_LEN, else KVB_ERR_INVALID at the start), copied. */
    const void *notif;
    size_t notif_len;
    /* KVB_WRITE_PARAM_DIGEST: hash every digest_unit bytes of each block as
     * they are copied, where the lane copies them itself (kvb_xfer_digests).
     * Read only with the flag set: callers built before it never set it. */
    uint64_t digest_unit;
} kvb_write_params_t;

/* kvb_engine_write_async with parameters (NULL: the same as it). */
KVB_API kvb_status_t kvb_engine_write_async_ex(kvb_engine_h engine, const char *session_id,
                                               const kvb_block_t *blocks, size_t count,
                                               const kvb_write_params_t *params,
                                               kvb_xfer_h *xfer_p);

/* ---- Writes submitted as one group ----
 * Several writes (each its own session, blocks, parameters, handle and
 * final status) queued together. On the direct lane (same host, the
 * target's memory from kvb_mem_alloc) the members that take it are queued
 * as one group, atomically, and the copy threads take their bytes in zip
 * order: block i of member 0, block i of member 1, ..., then block i + 1 (a
 * member with fewer blocks drops out; a long block is split into units as
 * usual; blocks are first merged per member as in a single write). When the
 * members read the same source rows in the same order (a prefill page split
 * between decode ranks: member r gets the r-th slice of every row), the
 * source is read once, sequentially, instead of once per member at a
 * stride, which copies about twice as fast. The bytes placed and every
 * member's status and error text are those of separate
 * kvb_engine_write_async_ex calls: each member is fenced against its own
 * target's grant, cancelled, failed by its own dead peer, and ends on its
 * own; one failing does not stop the others. Members on another lane
 * (message lane, CUDA memory) go their own way unchanged. */
#define KVB_WRITE_GROUP_MAX 64 /* members per group */

enum {
    KVB_WRITE_MEMBER_PARAMS = 1u << 0,  /* params */
    KVB_WRITE_MEMBER_STRIDED = 1u << 1, /* strided, strided_count */
    /* The member is a one-sided read (see "One-sided reads" below): each
     * block's src is the peer's address, dst ours (strided blocks too: the
     * src fields name the peer's side). No new field. */
    KVB_WRITE_MEMBER_READ = 1u << 2
};

typedef struct kvb_write_member {
    uint64_t field_mask; /* KVB_WRITE_MEMBER_*: which optional fields are set */
    const char *session_id;
    const kvb_block_t *blocks;
    size_t count;
    const kvb_write_params_t *params; /* KVB_WRITE_MEMBER_PARAMS (else none) */
    /* KVB_WRITE_MEMBER_STRIDED: the member's blocks as strided blocks
     * instead (blocks must then be NULL and count 0; KVB_ERR_INVALID
     * otherwise). On the direct lane a member's rows are numbered through
     * its strided blocks in order and zipped with the other members' rows
     * as plain blocks are (row r of every member, then row r + 1), so
     * members whose blocks cover different page runs still line up. */
    const kvb_strided_block_t *strided;
    size_t strided_count;
} kvb_write_member_t;

/* Start members[0..count) (count <= KVB_WRITE_GROUP_MAX) as one group, on the
 * calling thread as kvb_engine_write_async_ex does (session set-up
 * included). member_size: sizeof(kvb_write_member_t) as the caller was
 * compiled (the array's stride). Block arrays are copied; nothing of
 * members is retained. For every member i, statuses_p[i] is its start
 * status and xfers_p[i] a handle the caller owns and frees with
 * kvb_xfer_free: running when statuses_p[i] is KVB_OK, else already final
 * with that status and its reason in kvb_xfer_error (NULL only when even
 * that could not be allocated: KVB_ERR_NOMEM). Returns KVB_OK when every
 * member started, else the first failing member's status (the others run
 * on). Members are set up in order; the zipped ones start copying once the
 * last member is set up. KVB_ERR_INVALID with nothing started and no array
 * written: a NULL engine, members, statuses_p or xfers_p (count > 0), count
 * above the maximum, or member_size smaller than this version's struct.
 * Thread-safe. */
KVB_API kvb_status_t kvb_engine_write_group_async(kvb_engine_h engine,
                                                  const kvb_write_member_t *members, size_t count,
                                                  size_t member_size, kvb_status_t *statuses_p,
                                                  kvb_xfer_h *xfers_p);

/* ---- One-sided reads ----
 * A read copies bytes out of memory a peer registered into memory this
 * engine registered, with no call on the peer's side: the mirror of a
 * write. Its blocks are kvb_block_t with the names following the bytes:
 * src = the REMOTE address (inside one registration of the peer), dst =
 * the LOCAL address (inside one local registration), len bytes. Reads share
 * the writes' handles (kvb_xfer_test/wait/cancel/error/free), session
 * set-up, time-outs and settle guarantees, with "source" and "destination"
 * read the other way round; differences:
 * - Bounds: KVB_ERR_BOUNDS before anything moves when a block's remote range
 *   is not inside one peer registration or its local range not inside one
 *   local registration; nothing is written into local memory then.
 * - Settling: once a read's final status is reported (kvb_xfer_test/wait,
 *   kvb_engine_read's return), not one more byte of it lands in local
 *   memory, whatever the peer does later (late replies are dropped),
 *   unless kvb_xfer_drained says 0 (an answer UCX was receiving straight
 *   into local memory did not end within the peer time-out; kvb_engine_read
 *   then says KVB_ERR_UNSETTLED). Bytes a failed or cancelled read had
 *   already placed stay placed.
 * - Fence: a read is stamped with the writer tag and the transfer's epoch
 *   (kvb_write_params_t) exactly as a write, and admitted as a write: one
 *   made under a grant (epoch != 0) only while that grant is live
 *   (KVB_ERR_FENCED "... fenced ..." otherwise, nothing read), so a revoked
 *   grant can neither write nor read any more; one at epoch 0 (no grant,
 *   the default) whenever its tag is not fenced (kvb_engine_fence_writer),
 *   i.e. any peer that reaches the engine (and passes its secret, if set)
 *   reads any registered range, unless the target was created with
 *   reads_need_grant = 1 (epoch-0 reads refused KVB_ERR_FENCED) or
 *   serve_reads = 0.
 * - Lanes: the direct lane (same host, the peer's memory from
 *   kvb_mem_alloc: the copy threads copy out of the mapping), the message
 *   lane (the target answers a read request with the bytes; also transport
 *   TCP), the put lane (UCX get) where connections are set up for puts; with
 *   device memory on either side the CUDA IPC lane (same host) or else the
 *   CUDA staging lane (the target gathers device bytes with the driver, the
 *   reader copies answers into device memory; KVBRIDGE_CUDA_STAGE_MSG_MAX
 *   bounds one answer).
 * - Refusals by the target: KVB_ERR_UNSUPPORTED ("serves no reads") from an
 *   engine created with serve_reads = 0; KVB_ERR_FENCED ("only under a live
 *   grant") for an epoch-0 read from one created with reads_need_grant = 1;
 *   a local-only region is in no peer's view (KVB_ERR_BOUNDS); KVB_ERR_BUSY
 *   ("target busy ... try again") when its read caps, or this connection's
 *   share of them, are full: nothing more of the read lands, retry it later.
 *   A connection that takes none of its answers within the target's peer
 *   time-out is closed by the target (one with UCX peer-failure handling:
 *   not same-host). The message lane's target decides these; direct-lane
 *   and put-lane readers are not asked (docs/security.md). docs/engine.md
 *   "One-sided reads", "Read caps". */

/* Synchronous read from session_id; KVB_OK when every byte is in local
 * memory. Errors and time-out as kvb_engine_write. */
KVB_API kvb_status_t kvb_engine_read(kvb_engine_h engine, const char *session_id,
                                     const kvb_block_t *blocks, size_t count, double timeout_s);

/* Asynchronous forms, as kvb_engine_write_async(_ex): params' epoch is the
 * target's grant the read is made under (NULL: none). */
KVB_API kvb_status_t kvb_engine_read_async(kvb_engine_h engine, const char *session_id,
                                           const kvb_block_t *blocks, size_t count,
                                           kvb_xfer_h *xfer_p);
KVB_API kvb_status_t kvb_engine_read_async_ex(kvb_engine_h engine, const char *session_id,
                                              const kvb_block_t *blocks, size_t count,
                                              const kvb_write_params_t *params, kvb_xfer_h *xfer_p);

/* Read a pages x fields grid: kvb_engine_write_pages with the bytes going
 * the other way. The grid keeps its columns' meaning of "src" = this
 * engine's side and "dst" = the peer's (Mooncake's local buffer / peer
 * buffer): span (f, i) copies length_f bytes from the peer's dst_base_f +
 * dst_pages[i] * dst_stride_f into local src_base_f + src_pages[i] *
 * src_stride_f. Same rules, batching, time-out and errors. */
KVB_API kvb_status_t kvb_engine_read_pages(kvb_engine_h engine, const char *session_id,
                                           const int64_t *src_pages, const int64_t *dst_pages,
                                           size_t num_pages, const int64_t *fields,
                                           size_t num_fields, size_t max_batch_size,
                                           double timeout_s);

/* ---- Notifications ----
 * A small message to a peer engine, queued there until its application
 * takes it (kvb_engine_get_notifs), tagged with the sender's name
 * (kvb_engine_params_t.name, default its session id: as the sender states
 * it; with an engine secret only writers that proved it are heard). It
 * travels over the session's UCX endpoint as one active message. A
 * transfer's notification (kvb_write_params_t, KVB_WRITE_PARAM_NOTIF) is
 * sent only after the transfer succeeded, on every lane: for a write once
 * every byte is placed in the peer's memory (acknowledged, flushed, or
 * copied in by the direct lane), for a read once every answer was placed
 * here; so the peer may reuse the memory when it reads the notification.
 * The transfer's handle reports KVB_OK only once the notification was
 * sent (handed to the transport, not acknowledged by the peer); a failed or
 * cancelled transfer sends none; a notification that cannot be sent after
 * the bytes moved ends the transfer KVB_ERR_PEER (KVB_ERR_CANCELED when the
 * engine is destroyed first), "notification not sent" in its reason, its
 * bytes placed and settled. A transfer with no blocks and a notification
 * only sends the notification. Order: notifications sent over one
 * connection arrive in the order they were sent (UCX keeps eager active
 * messages on one endpoint in order); a transfer's goes when it succeeded,
 * so of two transfers running at once either may come first. The receiver
 * caps its queue (kvb_engine_limits, KVB_ENGINE_LIMITS_NOTIFS): past the
 * cap new notifications are dropped and counted; a malformed one is
 * refused and counted; the engine keeps serving either way. */
#define KVB_NOTIF_MAX_LEN 65536u /* bytes of one notification's message */
#define KVB_NOTIF_NAME_MAX 255u  /* bytes of a sender's name */

/* A notification taken from the queue: sender NUL-terminated (its bytes
 * as sent), msg its len bytes (followed by a NUL, not counted). Both live
 * in one allocation owned by the caller: kvb_notifs_free. */
typedef struct kvb_notif {
    char *sender;
    const uint8_t *msg;
    size_t len;
} kvb_notif_t;

/* Send len bytes (at most KVB_NOTIF_MAX_LEN; len 0 allowed) to session_id,
 * not tied to a transfer, and wait until sent, at most timeout_s (<= 0:
 * the connect time-out; session set-up included). Errors: KVB_ERR_INVALID
 * (NULL arguments, too long), the session set-up's (KVB_ERR_PEER,
 * KVB_ERR_AUTH, KVB_ERR_TIMEOUT), KVB_ERR_PEER (the send failed),
 * KVB_ERR_TIMEOUT (not sent in time: the connection is failed, the next
 * call re-handshakes). Thread-safe. */
KVB_API kvb_status_t kvb_engine_notify(kvb_engine_h engine, const char *session_id, const void *msg,
                                       size_t len, double timeout_s);

/* Take up to max queued notifications, oldest first, into notifs[0..*n_p)
 * (*n_p 0: none queued; the thread then yields the CPU once, as
 * kvb_xfer_test). Never blocks. Each entry is the caller's:
 * kvb_notifs_free. KVB_ERR_INVALID for NULL arguments. Thread-safe. */
KVB_API kvb_status_t kvb_engine_get_notifs(kvb_engine_h engine, kvb_notif_t *notifs, size_t max,
                                           size_t *n_p);

/* Free n entries kvb_engine_get_notifs filled (their fields are cleared). */
KVB_API void kvb_notifs_free(kvb_notif_t *notifs, size_t n);

#ifdef __cplusplus
}
#endif
#endif
