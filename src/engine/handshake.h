/* Engine handshake messages (over the session's TCP control connection) and
 * the blocking socket helpers that carry them. Every decoder treats its input
 * as hostile: lengths, counts and sizes are checked before use.
 *
 * request  "KVBHQ001" u32 total u32 sid_len sid [u32 caps]
 *          (caps: what the writer understands in a reply, KVB_HS_CAP_*; sent
 *          only by a writer with a CUDA driver loaded, the one case it matters,
 *          so other writers still reach targets that know no caps; absent: 0;
 *          unknown bits ignored)
 * reply    "KVBHS002" u32 total u64 epoch u64 generation u32 host_len host
 *          u32 waddr_len waddr u32 nseg { u64 addr u64 len u32 rkey_len rkey }*
 *          u32 pid u32 nshm { u32 seg u32 fd u64 file_off u64 file_size u64 dev
 *          u64 ino nonce[16] }*   (direct lane: segments in shared files, sorted
 *          by seg; seg 0xffffffff = the listener's fence page, last)
 *          [u32 ncuda { u32 seg i32 device u32 flags u32 zero u64 alloc_off
 *          handle[64] }*]   (optional, present when ncuda > 0: the segments in
 *          CUDA device memory, sorted by seg; flags bit 0: handle is a CUDA IPC
 *          handle of the allocation holding the segment at alloc_off; bit 1
 *          (never with bit 0): handle names the listener's file descriptor
 *          of a VMM allocation's shareable handle (KVB_HS_CUDA_VMM; sent by
 *          the previous version, decoded, never imported); bit 2 (alone):
 *          the segment lies in VMM allocations mapped back to back, handle =
 *          u32 first part, u32 parts, u64 bytes in all (KVB_HS_CUDA_VMM_PARTS),
 *          sent only to a writer whose caps have KVB_HS_CAP_VMM_PARTS; all
 *          sent to same-host writers only.)
 *          [u32 nparts fdsock[32] ticket[32] { u32 fd u32 zero u64 size }*]
 *          (present when an entry has bit 2: the listener's descriptor socket
 *          (lane/cuda_ipc/fdsrv.c: an abstract Unix socket name "kvbridge-fd-...",
 *          NUL-padded; all zero: none, fetch with pidfd_getfd) and a ticket
 *          for it; the VMM allocations, the listener's descriptors of their
 *          shareable handles, each entry's parts in order, entries in order) A writer that does not
 * know the table refuses the reply, which is right: it would treat device memory as host memory.)
 * notice   "KVBGN001" u64 generation      (segment table changed)
 *
 * With an engine secret, both sides prove it (docs/security.md):
 * challenge "KVBHC001" u32 total nonce_l[32]          (listener's nonce)
 * proof     "KVBHA002" u32 total nonce_w[32] mac[32]  writer's nonce and
 *           HMAC-SHA256(secret, "KVBAUTH2" || nonce_l || nonce_w || sid)
 * deny      "KVBHD001" u32 total           (proof wrong; connection closed)
 * sealed    "KVBHR001" u32 total mac[32] reply   the reply, MAC'd:
 *           HMAC-SHA256(secret, "KVBRPLY1" || nonce_l || nonce_w || u32 sid_len
 *           || sid || reply) proves the listener knows the secret and binds
 *           the reply (worker address, table) to this handshake.
 * A writer with a secret accepts nothing but a challenge first and a sealed
 * reply last. Its message-lane token is per connection:
 * HMAC-SHA256(secret, "KVBAMTK2" || nonce_w || nonce_l || u64 epoch)[0..16).
 *
 * Same-host proof (direct lane), before the reply when the listener has
 * segments in shared files, secret or not:
 * local     "KVBHP001" u32 total u32 pid u32 fd u32 host_len host
 *           (a one-time memfd of the listener holding 32 random bytes v)
 * localok   "KVBHL001" u32 total mac[32]   HMAC-SHA256(v, "KVBLOCL1" ||
 *           the connection's client address, port, server address, port)
 * The reply carries the shared-file table (pid, fds, nonces) only when the
 * proof is right: only a process of this host that can open the listener's
 * descriptors reads v, and the addresses bind the proof to this TCP
 * connection, so a relay cannot pass a local writer's proof on.
 * Integers little-endian. */
#ifndef KVB_ENGINE_HANDSHAKE_H
#define KVB_ENGINE_HANDSHAKE_H

#include "engine/shmem.h"

#include <kvbridge/common.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define KVB_HS_MAGIC_LEN 8
#define KVB_HS_MAX_MSG (64u << 20)
#define KVB_HS_MAX_SEGS (1u << 20)
#define KVB_HS_MAX_RKEY 4096u
#define KVB_HS_MAX_WADDR 65536u
#define KVB_HS_MAX_HOST 256u
#define KVB_HS_MAX_SID 300u
#define KVB_HS_NOTICE_LEN 16
#define KVB_HS_NONCE_LEN 32
#define KVB_HS_MAC_LEN 32
#define KVB_HS_TOKEN_LEN 16
#define KVB_HS_CHALLENGE_LEN (KVB_HS_MAGIC_LEN + 4 + KVB_HS_NONCE_LEN)
#define KVB_HS_PROOF_LEN (KVB_HS_MAGIC_LEN + 4 + KVB_HS_NONCE_LEN + KVB_HS_MAC_LEN)
#define KVB_HS_DENY_LEN (KVB_HS_MAGIC_LEN + 4)
#define KVB_HS_SEAL_HDR (KVB_HS_MAGIC_LEN + 4 + KVB_HS_MAC_LEN) /* before the reply */
#define KVB_HS_LOCAL_VALUE_LEN 32
#define KVB_HS_LOCAL_MAX (KVB_HS_MAGIC_LEN + 4 + 12 + KVB_HS_MAX_HOST)
#define KVB_HS_LOCALOK_LEN (KVB_HS_MAGIC_LEN + 4 + KVB_HS_MAC_LEN)
#define KVB_HS_LOCAL_NAME "kvb-hs-local" /* the one-time memfd's name */
#define KVB_HS_TUPLE_MAX 40              /* two (IPv6 address, port) pairs */

typedef struct kvb__hs_seg {
    uint64_t addr;
    uint64_t len;
    const uint8_t *rkey; /* points into the decoded buffer */
    uint32_t rkey_len;
} kvb__hs_seg_t;

#define KVB_HS_SHM_FENCE 0xffffffffu
#define KVB_HS_FENCE_FILE (9u * KVB_SHM_TRAILER) /* 32 KiB page + trailer (fence.c) */

/* A segment (or, seg = KVB_HS_SHM_FENCE, the fence page) that lives in a
 * shared file of the listener's process: the direct lane can map it. */
typedef struct kvb__hs_shm {
    uint32_t seg;
    kvb__shm_ref_t ref;
} kvb__hs_shm_t;

#define KVB_HS_CUDA_IPC 1u /* kvb__hs_cuda_t.flags: handle is a legacy IPC handle */
/* kvb__hs_cuda_t.flags: handle is u32 fd, u32 zero, u64 size (LE): the
 * listener's descriptor of a POSIX shareable handle of the VMM allocation
 * (cuMemExportToShareableHandle), size bytes, mapped whole at offset 0 */
#define KVB_HS_CUDA_VMM 2u
/* kvb__hs_cuda_t.flags: the segment lies in parts [part0, +nparts) of the
 * reply's VMM parts table, mapped back to back (vmm_size bytes in all), the
 * segment at alloc_off from the first part's start */
#define KVB_HS_CUDA_VMM_PARTS 4u
#define KVB_HS_CUDA_HANDLE 64
#define KVB_HS_CAP_VMM_PARTS 1u          /* request caps: the writer maps VMM parts */
#define KVB_HS_MAX_VMM_PARTS 65536u      /* parts in one reply (descriptors the listener holds) */
#define KVB_HS_VMM_SIZE_MAX (1ull << 48) /* bytes of one entry's parts, all together */
#define KVB_HS_FDSOCK_LEN 32             /* the descriptor socket's name, NUL-padded */
#define KVB_HS_FDSOCK_PREFIX "kvbridge-fd-"
#define KVB_HS_TICKET_LEN 32

/* One VMM allocation of the parts table. */
typedef struct kvb__hs_vmm_part {
    uint32_t fd; /* the listener's descriptor of its shareable handle */
    uint64_t size;
} kvb__hs_vmm_part_t;

/* A segment in CUDA device memory (mem_cuda.c; lane/cuda_ipc/). */
typedef struct kvb__hs_cuda {
    uint32_t seg;
    int32_t device; /* the listener's ordinal (informational: ordinals are per process) */
    uint32_t flags;
    uint64_t alloc_off; /* the segment's offset in the allocation the handle exports */
    uint8_t handle[KVB_HS_CUDA_HANDLE];
    /* KVB_HS_CUDA_VMM_PARTS: decoded from handle (encode: filled from these) */
    uint32_t part0, nparts;
    uint64_t vmm_size;
} kvb__hs_cuda_t;

typedef struct kvb__hs_reply {
    uint64_t epoch;
    uint64_t generation;
    const uint8_t *host; /* host identity (boot id), not NUL-terminated */
    uint32_t host_len;
    const uint8_t *waddr; /* UCX worker address */
    uint32_t waddr_len;
    uint32_t nseg;
    kvb__hs_seg_t *segs; /* malloc'ed by decode; free with kvb__hs_reply_free */
    uint32_t pid;        /* listener's process id (direct lane), 0 = none */
    uint32_t nshm;
    kvb__hs_shm_t *shm; /* malloc'ed by decode; free with kvb__hs_reply_free */
    uint32_t ncuda;
    kvb__hs_cuda_t *cuda; /* malloc'ed by decode; free with kvb__hs_reply_free */
    uint32_t nparts;
    kvb__hs_vmm_part_t *parts;         /* malloc'ed by decode; free with kvb__hs_reply_free */
    uint8_t fdsock[KVB_HS_FDSOCK_LEN]; /* with parts: the descriptor socket (zeros: none) */
    uint8_t ticket[KVB_HS_TICKET_LEN]; /* with parts: the ticket for it */
} kvb__hs_reply_t;

/* Encode a reply into a malloc'ed buffer (*buf_p, *len_p). */
kvb_status_t kvb__hs_reply_encode(const kvb__hs_reply_t *r, uint8_t **buf_p, size_t *len_p);

/* Decode a whole reply message. Pointers in *r refer into buf. On error
 * returns KVB_ERR_PROTO and writes a one-line reason to why. Segments must be
 * sorted and non-overlapping. */
kvb_status_t kvb__hs_reply_decode(const uint8_t *buf, size_t len, kvb__hs_reply_t *r, char *why,
                                  size_t whylen);
void kvb__hs_reply_free(kvb__hs_reply_t *r);

/* caps 0: the request without the caps field (as before caps). */
kvb_status_t kvb__hs_request_encode(const char *sid, uint32_t caps, uint8_t **buf_p, size_t *len_p);
/* Validate a request; the returned sid points into buf; *caps_p 0 if absent. */
kvb_status_t kvb__hs_request_decode(const uint8_t *buf, size_t len, const uint8_t **sid_p,
                                    uint32_t *sid_len_p, uint32_t *caps_p, char *why,
                                    size_t whylen);

/* ---- authentication and the same-host proof ---- */
typedef enum kvb__hs_kind {
    KVB_HS_MSG_UNKNOWN = 0,
    KVB_HS_MSG_REPLY,
    KVB_HS_MSG_CHALLENGE,
    KVB_HS_MSG_DENY,
    KVB_HS_MSG_SEALED,
    KVB_HS_MSG_LOCAL
} kvb__hs_kind_t;

/* What a message read by a writer is, by its magic only (decode to validate). */
kvb__hs_kind_t kvb__hs_kind(const uint8_t *buf, size_t len);

void kvb__hs_challenge_encode(const uint8_t nonce[KVB_HS_NONCE_LEN],
                              uint8_t out[KVB_HS_CHALLENGE_LEN]);
/* *nonce_p points into buf. KVB_ERR_PROTO (reason in why) unless exact. */
kvb_status_t kvb__hs_challenge_decode(const uint8_t *buf, size_t len, const uint8_t **nonce_p,
                                      char *why, size_t whylen);
void kvb__hs_proof_encode(const uint8_t nonce_w[KVB_HS_NONCE_LEN],
                          const uint8_t mac[KVB_HS_MAC_LEN], uint8_t out[KVB_HS_PROOF_LEN]);
kvb_status_t kvb__hs_proof_decode(const uint8_t *buf, size_t len, const uint8_t **nonce_w_p,
                                  const uint8_t **mac_p, char *why, size_t whylen);
void kvb__hs_deny_encode(uint8_t out[KVB_HS_DENY_LEN]);
kvb_status_t kvb__hs_deny_decode(const uint8_t *buf, size_t len, char *why, size_t whylen);
/* Sealed reply: mac, then the reply message rep (malloc'ed into *buf_p). */
kvb_status_t kvb__hs_sealed_encode(const uint8_t mac[KVB_HS_MAC_LEN], const uint8_t *rep,
                                   size_t rep_len, uint8_t **buf_p, size_t *len_p);
/* *mac_p and *rep_p point into buf; the reply itself is not checked here. */
kvb_status_t kvb__hs_sealed_decode(const uint8_t *buf, size_t len, const uint8_t **mac_p,
                                   const uint8_t **rep_p, size_t *rep_len_p, char *why,
                                   size_t whylen);
/* Same-host challenge; returns the encoded length (<= KVB_HS_LOCAL_MAX). */
size_t kvb__hs_local_encode(uint32_t pid, uint32_t fd, const char *host,
                            uint8_t out[KVB_HS_LOCAL_MAX]);
kvb_status_t kvb__hs_local_decode(const uint8_t *buf, size_t len, uint32_t *pid_p, uint32_t *fd_p,
                                  const uint8_t **host_p, uint32_t *host_len_p, char *why,
                                  size_t whylen);
void kvb__hs_localok_encode(const uint8_t mac[KVB_HS_MAC_LEN], uint8_t out[KVB_HS_LOCALOK_LEN]);
kvb_status_t kvb__hs_localok_decode(const uint8_t *buf, size_t len, const uint8_t **mac_p,
                                    char *why, size_t whylen);

/* The writer's proof over both nonces (writer session id sid). KVB_ERR_IO if
 * the crypto library fails (it does not for these inputs). */
kvb_status_t kvb__hs_auth_mac(const char *secret, const uint8_t nonce_l[KVB_HS_NONCE_LEN],
                              const uint8_t nonce_w[KVB_HS_NONCE_LEN], const uint8_t *sid,
                              uint32_t sid_len, uint8_t mac[KVB_HS_MAC_LEN]);
/* The listener's proof, sealing the reply message rep. */
kvb_status_t kvb__hs_reply_mac(const char *secret, const uint8_t nonce_l[KVB_HS_NONCE_LEN],
                               const uint8_t nonce_w[KVB_HS_NONCE_LEN], const uint8_t *sid,
                               uint32_t sid_len, const uint8_t *rep, size_t rep_len,
                               uint8_t mac[KVB_HS_MAC_LEN]);
/* The write-message token of one connection (both nonces, listener epoch). */
kvb_status_t kvb__hs_am_token(const char *secret, const uint8_t nonce_w[KVB_HS_NONCE_LEN],
                              const uint8_t nonce_l[KVB_HS_NONCE_LEN], uint64_t epoch,
                              uint8_t token[KVB_HS_TOKEN_LEN]);
/* The same-host proof: HMAC keyed by the one-time value over the tuple. */
kvb_status_t kvb__hs_local_mac(const uint8_t value[KVB_HS_LOCAL_VALUE_LEN], const uint8_t *tuple,
                               size_t tuple_len, uint8_t mac[KVB_HS_MAC_LEN]);
/* The connected TCP socket fd as (client address, port, server address,
 * port), IPv4-mapped addresses as IPv4: both ends of one connection get the
 * same bytes (listener: the peer is the client). false if fd has no
 * addresses. */
bool kvb__hs_conn_tuple(int fd, bool listener, uint8_t out[KVB_HS_TUPLE_MAX], size_t *len_p);
/* Constant-time equality of n bytes (time independent of where they differ). */
bool kvb__ct_equal(const void *a, const void *b, size_t n);

void kvb__hs_notice_encode(uint64_t generation, uint8_t out[KVB_HS_NOTICE_LEN]);
bool kvb__hs_notice_decode(const uint8_t in[KVB_HS_NOTICE_LEN], uint64_t *generation_p);

/* Parse "host:port" / "[v6]:port" into host (NUL-terminated, brackets
 * stripped) and port 1..65535. */
kvb_status_t kvb__sid_parse(const char *sid, char *host, size_t hostlen, uint16_t *port_p);

/* ---- blocking socket helpers, all bounded by an absolute deadline ---- */
/* TCP connect to host:port; KVB_ERR_PEER (refused/unreachable) or
 * KVB_ERR_TIMEOUT; *fd_p on success. */
kvb_status_t kvb__sock_connect(const char *host, uint16_t port, uint64_t deadline_ns, int *fd_p,
                               char *why, size_t whylen);
kvb_status_t kvb__sock_write_all(int fd, const void *buf, size_t len, uint64_t deadline_ns);
kvb_status_t kvb__sock_read_all(int fd, void *buf, size_t len, uint64_t deadline_ns);
/* Read one framed message ("magic u32 total ...") of at most max bytes.
 * magic NULL: any handshake magic ("KVBH...") is accepted; the caller
 * dispatches on kvb__hs_kind and decodes. */
kvb_status_t kvb__sock_read_msg(int fd, const char *magic, size_t max, uint64_t deadline_ns,
                                uint8_t **buf_p, size_t *len_p, char *why, size_t whylen);

#endif
