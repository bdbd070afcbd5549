/* TokenSpeed's Mooncake C ABI, version 1 (the ts_mooncake_* entry points of
 * tokenspeed-mooncake's libtokenspeed_transfer_engine.so), served by
 * kvbridge's engine in libkvbridge_ts_mooncake.so. Written from the
 * signatures and semantics of that ABI (docs/engine.md, "TokenSpeed's C
 * ABI"); a host built against the original header links or dlopens this
 * library instead and needs no other change. Link: -lkvbridge_ts_mooncake
 * (it pulls libkvbridge.so.0 in).
 *
 * Each entry behaves as the Python TransferEngine method of the same purpose
 * does in kvbridge's mooncake.engine drop-in. Strings and arrays are
 * borrowed for the call only. A handle may be used from several threads at
 * once (as kvbridge's engine), except ts_mooncake_destroy, which must not
 * race any other call on it. Unlike the original, every function taking a
 * handle returns -1 for a NULL one (destroy: no-op). */
#ifndef KVBRIDGE_TS_MOONCAKE_H
#define KVBRIDGE_TS_MOONCAKE_H

#include <stddef.h>
#include <stdint.h>

#if defined(KVB_TS_BUILDING)
#define TS_MOONCAKE_API __attribute__((visibility("default")))
#else
#define TS_MOONCAKE_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

#define TS_MOONCAKE_ABI_VERSION 1

/* TS_MOONCAKE_ABI_VERSION of the library: a host refuses a mismatch. */
TS_MOONCAKE_API int ts_mooncake_abi_version(void);

typedef struct ts_mooncake_engine ts_mooncake_engine_t;

/* A started engine, as TransferEngine.initialize(local_hostname,
 * metadata_server, protocol, device_name): it listens on the address part of
 * local_hostname ("ip", "ip:port" whose port is ignored, "[v6]:port", a bare
 * IPv6 address; "" = 127.0.0.1) at a free port of [MC_MIN_RPC_PORT,
 * MC_MAX_RPC_PORT] (default 15000-17000). metadata_server must be
 * "P2PHANDSHAKE" (kvbridge exchanges segment tables in its own handshake).
 * protocol must be exactly "rdma", as in the original; kvbridge then moves
 * the bytes over its own lanes (KVBRIDGE_TRANSPORT=auto|tcp|shm, default
 * auto: shared memory on one host, UCX RDMA or TCP across hosts;
 * MC_FORCE_TCP set: tcp). device_name (a comma-separated NIC filter in the
 * original) is accepted and ignored: UCX picks devices (UCX_NET_DEVICES).
 * Each write waits at most MC_TRANSFER_TIMEOUT seconds (default 30, at
 * least 5) plus 1 ns per byte. This ABI has no read call, and the engine
 * answers no peer's one-sided read of registered memory (refused, nothing
 * sent) unless KVBRIDGE_SERVE_READS=1 is set at create; it takes writes
 * from any peer that reaches its port unless KVBRIDGE_ENGINE_SECRET is set
 * (kvbridge's docs/security.md; with KVBRIDGE_TRANSPORT=shm peers holding
 * the remote keys can also read by UCX get). kvbridge's Python Mooncake
 * drop-in (mooncake.engine), by contrast, serves reads to any peer that
 * reaches it unless KVBRIDGE_SERVE_READS=0 or a secret is set. NULL on any
 * failure (logged), also for a NULL argument. The caller owns the handle
 * until ts_mooncake_destroy. */
TS_MOONCAKE_API ts_mooncake_engine_t *ts_mooncake_create(const char *local_hostname,
                                                         const char *metadata_server,
                                                         const char *protocol,
                                                         const char *device_name);

/* Stop the engine, drop its registrations and free the handle. NULL: no-op.
 * Unregister memory first (peers may still hold its addresses). */
TS_MOONCAKE_API void ts_mooncake_destroy(ts_mooncake_engine_t *engine);

/* The engine's listening port: peers reach it as "host:port" (the session
 * id), host being create's address. */
TS_MOONCAKE_API int ts_mooncake_rpc_port(ts_mooncake_engine_t *engine);

/* Register length bytes at addr, for any location (host memory, or CUDA
 * device memory when the process has a CUDA driver), as a write source and a
 * destination peers may write (and read, only with KVBRIDGE_SERVE_READS=1:
 * ts_mooncake_create). 0, or Mooncake's code: -1 invalid (zero
 * length, NULL), -7 overlapping a registered range, -302 out of memory,
 * -303 device memory without a driver. The caller keeps the memory alive
 * until it is unregistered. */
TS_MOONCAKE_API int ts_mooncake_register(ts_mooncake_engine_t *engine, void *addr, size_t length);

/* Undo the registration that starts at addr. 0, or -3 (none starts there),
 * -1 another failure (an incoming write still placing bytes into it past
 * its bound: the range stays registered; retry). */
TS_MOONCAKE_API int ts_mooncake_unregister(ts_mooncake_engine_t *engine, void *addr);

/* Write count spans to the engine whose session id ("host:port") is target
 * and wait: span i copies lengths[i] bytes from local sources[i] (inside a
 * registration of this engine) to destinations[i] (inside one of the
 * target's). 0 once every byte is in the target's memory; negative on
 * failure or time-out (kvbridge's status: -1 invalid arguments such as a
 * NULL target, -3 a range outside the registered memory on either side,
 * nothing written, -6 time-out, -7 unreachable or dead peer, ...). count 0:
 * 0. */
TS_MOONCAKE_API int ts_mooncake_write(ts_mooncake_engine_t *engine, const char *target,
                                      const uint64_t *sources, const uint64_t *destinations,
                                      const uint64_t *lengths, size_t count);

/* Write a pages x fields grid to target and wait. fields holds num_fields
 * rows of (src_base, src_stride, dst_base, dst_stride, length); span (f, i)
 * copies length bytes from src_base + src_pages[i] * src_stride to
 * dst_base + dst_pages[i] * dst_stride. Spans are submitted field-major (all
 * pages of row 0, then row 1, ...) in batches of at most max_batch_size
 * spans (0: one batch), each waited for. num_pages * num_fields == 0: 0 at
 * once, before any check. A row with length <= 0 or a negative stride, a
 * negative page (which the original does not check), or a span whose
 * address overflows: -1, logged, nothing sent. Otherwise 0 when every
 * batch completed, else the first failing batch's status (negative, as
 * ts_mooncake_write's; later batches are not submitted). */
TS_MOONCAKE_API int ts_mooncake_write_pages(ts_mooncake_engine_t *engine, const char *target,
                                            const int64_t *src_pages, const int64_t *dst_pages,
                                            size_t num_pages, const int64_t *fields,
                                            size_t num_fields, size_t max_batch_size);

#ifdef __cplusplus
}
#endif
#endif
