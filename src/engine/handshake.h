/* Engine handshake messages (over the session's TCP control connection) and
 * the blocking socket helpers that carry them. Every decoder treats its input
 * as hostile: lengths, counts and sizes are checked before use.
 *
 * request  "KVBHQ001" u32 total u32 sid_len sid
 * reply    "KVBHS001" u32 total u64 epoch u64 generation u32 host_len host
 *          u32 waddr_len waddr u32 nseg { u64 addr u64 len u32 rkey_len rkey }*
 * notice   "KVBGN001" u64 generation      (segment table changed)
 * Integers little-endian. */
#ifndef KVB_ENGINE_HANDSHAKE_H
#define KVB_ENGINE_HANDSHAKE_H

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

typedef struct kvb__hs_seg {
    uint64_t addr;
    uint64_t len;
    const uint8_t *rkey; /* points into the decoded buffer */
    uint32_t rkey_len;
} kvb__hs_seg_t;

typedef struct kvb__hs_reply {
    uint64_t epoch;
    uint64_t generation;
    const uint8_t *host; /* host identity (boot id), not NUL-terminated */
    uint32_t host_len;
    const uint8_t *waddr; /* UCX worker address */
    uint32_t waddr_len;
    uint32_t nseg;
    kvb__hs_seg_t *segs; /* malloc'ed by decode; free with kvb__hs_reply_free */
} kvb__hs_reply_t;

/* Encode a reply into a malloc'ed buffer (*buf_p, *len_p). */
kvb_status_t kvb__hs_reply_encode(const kvb__hs_reply_t *r, uint8_t **buf_p, size_t *len_p);

/* Decode a whole reply message. Pointers in *r refer into buf. On error
 * returns KVB_ERR_PROTO and writes a one-line reason to why. Segments must be
 * sorted and non-overlapping. */
kvb_status_t kvb__hs_reply_decode(const uint8_t *buf, size_t len, kvb__hs_reply_t *r, char *why,
                                  size_t whylen);
void kvb__hs_reply_free(kvb__hs_reply_t *r);

kvb_status_t kvb__hs_request_encode(const char *sid, uint8_t **buf_p, size_t *len_p);
/* Validate a request; the returned sid points into buf. */
kvb_status_t kvb__hs_request_decode(const uint8_t *buf, size_t len, const uint8_t **sid_p,
                                    uint32_t *sid_len_p, char *why, size_t whylen);

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
/* Read one framed message ("magic u32 total ...") of at most max bytes. */
kvb_status_t kvb__sock_read_msg(int fd, const char *magic, size_t max, uint64_t deadline_ns,
                                uint8_t **buf_p, size_t *len_p, char *why, size_t whylen);

#endif
