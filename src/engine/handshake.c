#include "engine/handshake.h"
#include "core/core.h"

#include <errno.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <arpa/inet.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static const char REQ_MAGIC[] = "KVBHQ001";
static const char REP_MAGIC[] = "KVBHS002";
static const char NOTE_MAGIC[] = "KVBGN001";
static const char CHAL_MAGIC[] = "KVBHC001";
static const char PROOF_MAGIC[] = "KVBHA002";
static const char DENY_MAGIC[] = "KVBHD001";
static const char SEAL_MAGIC[] = "KVBHR001";
static const char LOCAL_MAGIC[] = "KVBHP001";
static const char LOCALOK_MAGIC[] = "KVBHL001";
static const char MAC_LABEL[] = "KVBAUTH2";
static const char REPLY_LABEL[] = "KVBRPLY1";
static const char TOKEN_LABEL[] = "KVBAMTK2";
static const char LOCAL_LABEL[] = "KVBLOCL1";

/* ---- little-endian writer / reader ---- */
typedef struct wbuf {
    uint8_t *p;
    size_t len, cap;
    bool fail;
} wbuf_t;

static void wb_put(wbuf_t *w, const void *src, size_t n)
{
    if (w->fail)
        return;
    if (w->len + n > w->cap) {
        size_t cap = w->cap ? w->cap : 256;
        while (cap < w->len + n)
            cap *= 2;
        uint8_t *p = realloc(w->p, cap);
        if (p == NULL) {
            w->fail = true;
            return;
        }
        w->p = p;
        w->cap = cap;
    }
    if (n > 0) /* src may be NULL for nothing (device memory has no remote key) */
        memcpy(w->p + w->len, src, n);
    w->len += n;
}

static void wb_u32(wbuf_t *w, uint32_t v)
{
    uint8_t b[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};
    wb_put(w, b, 4);
}

static void wb_u64(wbuf_t *w, uint64_t v)
{
    wb_u32(w, (uint32_t)v);
    wb_u32(w, (uint32_t)(v >> 32));
}

static kvb_status_t wb_finish(wbuf_t *w, uint8_t **buf_p, size_t *len_p)
{
    if (w->fail || w->len > KVB_HS_MAX_MSG) {
        free(w->p);
        return w->fail ? KVB_ERR_NOMEM : KVB_ERR_INVALID;
    }
    uint32_t total = (uint32_t)w->len;
    for (int i = 0; i < 4; i++)
        w->p[KVB_HS_MAGIC_LEN + i] = (uint8_t)(total >> (8 * i));
    *buf_p = w->p;
    *len_p = w->len;
    return KVB_OK;
}

typedef struct rbuf {
    const uint8_t *p;
    size_t len, off;
} rbuf_t;

static bool rb_u32(rbuf_t *r, uint32_t *v)
{
    if (r->len - r->off < 4)
        return false;
    const uint8_t *b = r->p + r->off;
    *v = (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
    r->off += 4;
    return true;
}

static bool rb_u64(rbuf_t *r, uint64_t *v)
{
    uint32_t lo, hi;
    if (!rb_u32(r, &lo) || !rb_u32(r, &hi))
        return false;
    *v = (uint64_t)hi << 32 | lo;
    return true;
}

static bool rb_bytes(rbuf_t *r, uint32_t n, const uint8_t **p)
{
    if (r->len - r->off < n)
        return false;
    *p = r->p + r->off;
    r->off += n;
    return true;
}

static bool rb_header(rbuf_t *r, const char *magic, char *why, size_t whylen)
{
    uint32_t total;
    if (r->len < KVB_HS_MAGIC_LEN + 4 || memcmp(r->p, magic, KVB_HS_MAGIC_LEN) != 0) {
        snprintf(why, whylen, "bad handshake magic");
        return false;
    }
    r->off = KVB_HS_MAGIC_LEN;
    rb_u32(r, &total);
    if (total != r->len) {
        snprintf(why, whylen, "handshake length field %u != message length %zu", total, r->len);
        return false;
    }
    return true;
}

kvb_status_t kvb__hs_reply_encode(const kvb__hs_reply_t *r, uint8_t **buf_p, size_t *len_p)
{
    static const uint8_t zero[KVB_HS_CUDA_HANDLE];
    wbuf_t w = {0};
    wb_put(&w, REP_MAGIC, KVB_HS_MAGIC_LEN);
    wb_u32(&w, 0); /* total, patched by wb_finish */
    wb_u64(&w, r->epoch);
    wb_u64(&w, r->generation);
    wb_u32(&w, r->host_len);
    wb_put(&w, r->host, r->host_len);
    wb_u32(&w, r->waddr_len);
    wb_put(&w, r->waddr, r->waddr_len);
    wb_u32(&w, r->nseg);
    for (uint32_t i = 0; i < r->nseg; i++) {
        wb_u64(&w, r->segs[i].addr);
        wb_u64(&w, r->segs[i].len);
        wb_u32(&w, r->segs[i].rkey_len);
        wb_put(&w, r->segs[i].rkey, r->segs[i].rkey_len);
    }
    wb_u32(&w, r->pid);
    wb_u32(&w, r->nshm);
    for (uint32_t i = 0; i < r->nshm; i++) {
        const kvb__shm_ref_t *f = &r->shm[i].ref;
        wb_u32(&w, r->shm[i].seg);
        wb_u32(&w, (uint32_t)f->fd);
        wb_u64(&w, f->file_off);
        wb_u64(&w, f->file_size);
        wb_u64(&w, f->dev);
        wb_u64(&w, f->ino);
        wb_put(&w, f->nonce, KVB_SHM_NONCE_LEN);
    }
    if (r->ncuda > 0) {
        wb_u32(&w, r->ncuda);
        for (uint32_t i = 0; i < r->ncuda; i++) {
            wb_u32(&w, r->cuda[i].seg);
            wb_u32(&w, (uint32_t)r->cuda[i].device);
            wb_u32(&w, r->cuda[i].flags);
            wb_u32(&w, 0);
            wb_u64(&w, r->cuda[i].alloc_off);
            if (r->cuda[i].flags == KVB_HS_CUDA_VMM_PARTS) {
                wb_u32(&w, r->cuda[i].part0);
                wb_u32(&w, r->cuda[i].nparts);
                wb_u64(&w, r->cuda[i].vmm_size);
                wb_put(&w, zero, KVB_HS_CUDA_HANDLE - 16);
            } else {
                wb_put(&w, r->cuda[i].handle, KVB_HS_CUDA_HANDLE);
            }
        }
    }
    if (r->nparts > 0) {
        wb_u32(&w, r->nparts);
        wb_put(&w, r->fdsock, KVB_HS_FDSOCK_LEN);
        wb_put(&w, r->ticket, KVB_HS_TICKET_LEN);
        for (uint32_t i = 0; i < r->nparts; i++) {
            wb_u32(&w, r->parts[i].fd);
            wb_u32(&w, 0);
            wb_u64(&w, r->parts[i].size);
        }
    }
    return wb_finish(&w, buf_p, len_p);
}

static bool decode_segs(rbuf_t *rb, kvb__hs_reply_t *r, char *why, size_t whylen)
{
    uint64_t prev_end = 0;
    for (uint32_t i = 0; i < r->nseg; i++) {
        kvb__hs_seg_t *s = &r->segs[i];
        uint64_t end;
        if (!rb_u64(rb, &s->addr) || !rb_u64(rb, &s->len) || !rb_u32(rb, &s->rkey_len)) {
            snprintf(why, whylen, "segment %u truncated", i);
            return false;
        }
        if (s->len == 0 || __builtin_add_overflow(s->addr, s->len, &end) ||
            (i > 0 && s->addr < prev_end)) {
            snprintf(why, whylen, "segment %u [0x%llx, +%llu) empty, wrapping or unsorted", i,
                     (unsigned long long)s->addr, (unsigned long long)s->len);
            return false;
        }
        if (s->rkey_len > KVB_HS_MAX_RKEY || !rb_bytes(rb, s->rkey_len, &s->rkey)) {
            snprintf(why, whylen, "segment %u remote key length %u invalid", i, s->rkey_len);
            return false;
        }
        prev_end = end;
    }
    return true;
}

#define SHM_ENTRY_LEN (4 + 4 + 8 * 4 + KVB_SHM_NONCE_LEN)

/* One shared-file entry: the file must hold its segment below the trailer. */
static bool shm_entry_ok(const kvb__hs_reply_t *r, const kvb__hs_shm_t *e, int64_t prev)
{
    const kvb__shm_ref_t *f = &e->ref;
    uint64_t end;
    if (e->seg != KVB_HS_SHM_FENCE && (e->seg >= r->nseg || (int64_t)e->seg <= prev))
        return false;
    if (f->fd < 0 || f->file_size < 2 * KVB_SHM_TRAILER || f->file_size > KVB_SHM_MAX_FILE ||
        f->file_size % KVB_SHM_TRAILER != 0)
        return false;
    if (e->seg == KVB_HS_SHM_FENCE)
        return f->file_off == 0 && f->file_size == KVB_HS_FENCE_FILE;
    return !__builtin_add_overflow(f->file_off, r->segs[e->seg].len, &end) &&
           end <= f->file_size - KVB_SHM_TRAILER;
}

static bool decode_shm(rbuf_t *rb, kvb__hs_reply_t *r, char *why, size_t whylen)
{
    int64_t prev = -1; /* segment of the previous entry; the fence page is last */
    uint32_t fd;
    if (!rb_u32(rb, &r->pid) || !rb_u32(rb, &r->nshm) || r->nshm > r->nseg + 1u ||
        r->nshm > (rb->len - rb->off) / SHM_ENTRY_LEN) {
        snprintf(why, whylen, "shared-file table truncated or oversized");
        return false;
    }
    r->shm = calloc(r->nshm ? r->nshm : 1, sizeof(*r->shm));
    if (r->shm == NULL) {
        snprintf(why, whylen, "out of memory");
        return false;
    }
    for (uint32_t i = 0; i < r->nshm; i++) {
        kvb__hs_shm_t *e = &r->shm[i];
        const uint8_t *nonce;
        if (prev == (int64_t)KVB_HS_SHM_FENCE || !rb_u32(rb, &e->seg) || !rb_u32(rb, &fd) ||
            !rb_u64(rb, &e->ref.file_off) || !rb_u64(rb, &e->ref.file_size) ||
            !rb_u64(rb, &e->ref.dev) || !rb_u64(rb, &e->ref.ino) ||
            !rb_bytes(rb, KVB_SHM_NONCE_LEN, &nonce)) {
            snprintf(why, whylen, "shared-file entry %u truncated or after the fence page", i);
            return false;
        }
        e->ref.fd = fd > INT32_MAX ? -1 : (int32_t)fd;
        memcpy(e->ref.nonce, nonce, KVB_SHM_NONCE_LEN);
        if (!shm_entry_ok(r, e, prev)) {
            snprintf(why, whylen, "shared-file entry %u (segment %u) invalid or unsorted", i,
                     e->seg);
            return false;
        }
        prev = (int64_t)e->seg;
    }
    if (r->nshm > 0 && r->pid == 0) {
        snprintf(why, whylen, "shared files advertised without a process id");
        return false;
    }
    return true;
}

#define CUDA_ENTRY_LEN (4 * 4 + 8 + KVB_HS_CUDA_HANDLE)
#define VMM_PART_LEN 16

static uint64_t get_le(const uint8_t *p, int n)
{
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

static bool cuda_flags_ok(uint32_t f)
{
    return f == 0 || f == KVB_HS_CUDA_IPC || f == KVB_HS_CUDA_VMM || f == KVB_HS_CUDA_VMM_PARTS;
}

/* A KVB_HS_CUDA_VMM_PARTS entry's handle: first part, count, bytes, zeros;
 * its parts follow the previous entry's (*next: the first part not yet
 * claimed). */
static bool vmm_entry(kvb__hs_cuda_t *e, const uint8_t *h, uint32_t *next)
{
    static const uint8_t zero[KVB_HS_CUDA_HANDLE - 16];
    e->part0 = (uint32_t)get_le(h, 4);
    e->nparts = (uint32_t)get_le(h + 4, 4);
    e->vmm_size = get_le(h + 8, 8);
    if (memcmp(h + 16, zero, sizeof(zero)) != 0 || e->part0 != *next || e->nparts == 0 ||
        e->nparts > KVB_HS_MAX_VMM_PARTS - e->part0 || e->vmm_size == 0 ||
        e->vmm_size > KVB_HS_VMM_SIZE_MAX || e->alloc_off >= e->vmm_size)
        return false;
    *next = e->part0 + e->nparts;
    return true;
}

/* The descriptor socket's name: none (all zero), or ours
 * ("kvbridge-fd-" then letters, digits, '-'), NUL-padded, never another
 * abstract socket of this host. */
static bool fdsock_ok(const uint8_t *n)
{
    size_t len = strnlen((const char *)n, KVB_HS_FDSOCK_LEN), pre = strlen(KVB_HS_FDSOCK_PREFIX);
    for (size_t i = len; i < KVB_HS_FDSOCK_LEN; i++)
        if (n[i] != 0)
            return false;
    if (len == 0)
        return true;
    if (len == KVB_HS_FDSOCK_LEN || len <= pre || memcmp(n, KVB_HS_FDSOCK_PREFIX, pre) != 0)
        return false;
    for (size_t i = pre; i < len; i++)
        if (!((n[i] >= 'a' && n[i] <= 'z') || (n[i] >= '0' && n[i] <= '9') || n[i] == '-'))
            return false;
    return true;
}

/* The VMM parts table: exactly the parts the entries claimed, each entry's
 * sizes adding up to its bytes. */
static bool decode_parts(rbuf_t *rb, kvb__hs_reply_t *r, uint32_t claimed, char *why, size_t whylen)
{
    if (claimed == 0)
        return true;
    const uint8_t *name, *ticket;
    if (!rb_u32(rb, &r->nparts) || r->nparts != claimed ||
        !rb_bytes(rb, KVB_HS_FDSOCK_LEN, &name) || !rb_bytes(rb, KVB_HS_TICKET_LEN, &ticket) ||
        r->nparts > (rb->len - rb->off) / VMM_PART_LEN) {
        snprintf(why, whylen, "VMM parts table truncated or not the %u parts claimed", claimed);
        return false;
    }
    if (!fdsock_ok(name)) {
        snprintf(why, whylen, "VMM parts table: descriptor socket name invalid");
        return false;
    }
    memcpy(r->fdsock, name, KVB_HS_FDSOCK_LEN);
    memcpy(r->ticket, ticket, KVB_HS_TICKET_LEN);
    r->parts = calloc(r->nparts, sizeof(*r->parts));
    if (r->parts == NULL) {
        snprintf(why, whylen, "out of memory");
        return false;
    }
    for (uint32_t i = 0; i < r->nparts; i++) {
        uint32_t zero;
        if (!rb_u32(rb, &r->parts[i].fd) || !rb_u32(rb, &zero) || !rb_u64(rb, &r->parts[i].size) ||
            zero != 0 || r->parts[i].size == 0 || r->parts[i].size > KVB_HS_VMM_SIZE_MAX) {
            snprintf(why, whylen, "VMM part %u invalid", i);
            return false;
        }
    }
    for (uint32_t i = 0; i < r->ncuda; i++) {
        const kvb__hs_cuda_t *e = &r->cuda[i];
        uint64_t sum = 0;
        for (uint32_t k = 0; e->flags == KVB_HS_CUDA_VMM_PARTS && k < e->nparts; k++)
            sum += r->parts[e->part0 + k].size; /* each <= 2^48, at most 2^16: no overflow */
        if (e->flags == KVB_HS_CUDA_VMM_PARTS && sum != e->vmm_size) {
            snprintf(why, whylen, "device-memory entry %u: parts of %llu bytes, not %llu", i,
                     (unsigned long long)sum, (unsigned long long)e->vmm_size);
            return false;
        }
    }
    return true;
}

/* The optional device-memory table: entries sorted by segment, known flags,
 * zero padding. The offset is checked by the writer against the allocation
 * it imports (lane/cuda_ipc/). */
static bool decode_cuda(rbuf_t *rb, kvb__hs_reply_t *r, char *why, size_t whylen)
{
    int64_t prev = -1;
    uint32_t claimed = 0;
    if (rb->off == rb->len)
        return true; /* no device memory */
    if (rb->len - rb->off < 4 + CUDA_ENTRY_LEN) {
        snprintf(why, whylen, "%zu trailing bytes after the shared-file table", rb->len - rb->off);
        return false;
    }
    if (!rb_u32(rb, &r->ncuda) || r->ncuda == 0 || r->ncuda > r->nseg ||
        r->ncuda > (rb->len - rb->off) / CUDA_ENTRY_LEN) {
        snprintf(why, whylen, "device-memory table truncated, empty or oversized");
        return false;
    }
    r->cuda = calloc(r->ncuda, sizeof(*r->cuda));
    if (r->cuda == NULL) {
        snprintf(why, whylen, "out of memory");
        return false;
    }
    for (uint32_t i = 0; i < r->ncuda; i++) {
        kvb__hs_cuda_t *e = &r->cuda[i];
        uint32_t dev, zero;
        const uint8_t *h;
        if (!rb_u32(rb, &e->seg) || !rb_u32(rb, &dev) || !rb_u32(rb, &e->flags) ||
            !rb_u32(rb, &zero) || !rb_u64(rb, &e->alloc_off) ||
            !rb_bytes(rb, KVB_HS_CUDA_HANDLE, &h) || e->seg >= r->nseg || (int64_t)e->seg <= prev ||
            !cuda_flags_ok(e->flags) || zero != 0 ||
            (e->flags == KVB_HS_CUDA_VMM_PARTS && !vmm_entry(e, h, &claimed))) {
            snprintf(why, whylen, "device-memory entry %u truncated, invalid or unsorted", i);
            return false;
        }
        e->device = (int32_t)dev;
        memcpy(e->handle, h, KVB_HS_CUDA_HANDLE);
        prev = (int64_t)e->seg;
    }
    return decode_parts(rb, r, claimed, why, whylen);
}

kvb_status_t kvb__hs_reply_decode(const uint8_t *buf, size_t len, kvb__hs_reply_t *r, char *why,
                                  size_t whylen)
{
    rbuf_t rb = {buf, len, 0};
    memset(r, 0, sizeof(*r));
    if (!rb_header(&rb, REP_MAGIC, why, whylen))
        return KVB_ERR_PROTO;
    if (!rb_u64(&rb, &r->epoch) || !rb_u64(&rb, &r->generation) || !rb_u32(&rb, &r->host_len) ||
        r->host_len > KVB_HS_MAX_HOST || !rb_bytes(&rb, r->host_len, &r->host) ||
        !rb_u32(&rb, &r->waddr_len) || r->waddr_len == 0 || r->waddr_len > KVB_HS_MAX_WADDR ||
        !rb_bytes(&rb, r->waddr_len, &r->waddr) || !rb_u32(&rb, &r->nseg)) {
        snprintf(why, whylen, "handshake reply header truncated or oversized");
        return KVB_ERR_PROTO;
    }
    /* Each segment takes at least 20 bytes: bound nseg by what is left. */
    if (r->nseg > KVB_HS_MAX_SEGS || r->nseg > (len - rb.off) / 20) {
        snprintf(why, whylen, "segment count %u does not fit the message", r->nseg);
        return KVB_ERR_PROTO;
    }
    r->segs = calloc(r->nseg ? r->nseg : 1, sizeof(*r->segs));
    if (r->segs == NULL)
        return KVB_ERR_NOMEM;
    bool ok = decode_segs(&rb, r, why, whylen) && decode_shm(&rb, r, why, whylen) &&
              decode_cuda(&rb, r, why, whylen);
    if (!ok || rb.off != len) {
        if (ok)
            snprintf(why, whylen, "%zu trailing bytes after the device-memory table", len - rb.off);
        kvb__hs_reply_free(r);
        return KVB_ERR_PROTO;
    }
    return KVB_OK;
}

void kvb__hs_reply_free(kvb__hs_reply_t *r)
{
    free(r->segs);
    free(r->shm);
    free(r->cuda);
    free(r->parts);
    r->segs = NULL;
    r->shm = NULL;
    r->cuda = NULL;
    r->parts = NULL;
    r->nseg = r->nshm = r->ncuda = r->nparts = 0;
}

kvb_status_t kvb__hs_request_encode(const char *sid, uint32_t caps, uint8_t **buf_p, size_t *len_p)
{
    wbuf_t w = {0};
    size_t n = strlen(sid);
    if (n > KVB_HS_MAX_SID)
        return KVB_ERR_INVALID;
    wb_put(&w, REQ_MAGIC, KVB_HS_MAGIC_LEN);
    wb_u32(&w, 0);
    wb_u32(&w, (uint32_t)n);
    wb_put(&w, sid, n);
    if (caps != 0)
        wb_u32(&w, caps);
    return wb_finish(&w, buf_p, len_p);
}

kvb_status_t kvb__hs_request_decode(const uint8_t *buf, size_t len, const uint8_t **sid_p,
                                    uint32_t *sid_len_p, uint32_t *caps_p, char *why, size_t whylen)
{
    rbuf_t rb = {buf, len, 0};
    uint32_t n, caps = 0;
    const uint8_t *sid;
    if (!rb_header(&rb, REQ_MAGIC, why, whylen))
        return KVB_ERR_PROTO;
    if (!rb_u32(&rb, &n) || n > KVB_HS_MAX_SID || !rb_bytes(&rb, n, &sid) ||
        (rb.off != len && !rb_u32(&rb, &caps)) || rb.off != len) {
        snprintf(why, whylen, "handshake request malformed");
        return KVB_ERR_PROTO;
    }
    *sid_p = sid;
    *sid_len_p = n;
    *caps_p = caps;
    return KVB_OK;
}

/* ---- authentication messages ---- */

kvb__hs_kind_t kvb__hs_kind(const uint8_t *buf, size_t len)
{
    if (len < KVB_HS_MAGIC_LEN)
        return KVB_HS_MSG_UNKNOWN;
    if (memcmp(buf, REP_MAGIC, KVB_HS_MAGIC_LEN) == 0)
        return KVB_HS_MSG_REPLY;
    if (memcmp(buf, CHAL_MAGIC, KVB_HS_MAGIC_LEN) == 0)
        return KVB_HS_MSG_CHALLENGE;
    if (memcmp(buf, DENY_MAGIC, KVB_HS_MAGIC_LEN) == 0)
        return KVB_HS_MSG_DENY;
    if (memcmp(buf, SEAL_MAGIC, KVB_HS_MAGIC_LEN) == 0)
        return KVB_HS_MSG_SEALED;
    if (memcmp(buf, LOCAL_MAGIC, KVB_HS_MAGIC_LEN) == 0)
        return KVB_HS_MSG_LOCAL;
    return KVB_HS_MSG_UNKNOWN;
}

/* magic, u32 total, then n fixed bytes */
static void fixed_encode(const char *magic, const uint8_t *body, size_t n, uint8_t *out)
{
    uint32_t total = (uint32_t)(KVB_HS_MAGIC_LEN + 4 + n);
    memcpy(out, magic, KVB_HS_MAGIC_LEN);
    for (int i = 0; i < 4; i++)
        out[KVB_HS_MAGIC_LEN + i] = (uint8_t)(total >> (8 * i));
    if (n > 0)
        memcpy(out + KVB_HS_MAGIC_LEN + 4, body, n);
}

static kvb_status_t fixed_decode(const char *magic, const char *what, const uint8_t *buf,
                                 size_t len, size_t n, const uint8_t **body_p, char *why,
                                 size_t whylen)
{
    rbuf_t rb = {buf, len, 0};
    if (!rb_header(&rb, magic, why, whylen))
        return KVB_ERR_PROTO;
    if (len != KVB_HS_MAGIC_LEN + 4 + n) {
        snprintf(why, whylen, "handshake %s of %zu bytes (expected %zu)", what, len,
                 (size_t)(KVB_HS_MAGIC_LEN + 4 + n));
        return KVB_ERR_PROTO;
    }
    if (body_p != NULL)
        *body_p = buf + KVB_HS_MAGIC_LEN + 4;
    return KVB_OK;
}

void kvb__hs_challenge_encode(const uint8_t nonce[KVB_HS_NONCE_LEN],
                              uint8_t out[KVB_HS_CHALLENGE_LEN])
{
    fixed_encode(CHAL_MAGIC, nonce, KVB_HS_NONCE_LEN, out);
}

kvb_status_t kvb__hs_challenge_decode(const uint8_t *buf, size_t len, const uint8_t **nonce_p,
                                      char *why, size_t whylen)
{
    return fixed_decode(CHAL_MAGIC, "challenge", buf, len, KVB_HS_NONCE_LEN, nonce_p, why, whylen);
}

void kvb__hs_proof_encode(const uint8_t nonce_w[KVB_HS_NONCE_LEN],
                          const uint8_t mac[KVB_HS_MAC_LEN], uint8_t out[KVB_HS_PROOF_LEN])
{
    uint8_t body[KVB_HS_NONCE_LEN + KVB_HS_MAC_LEN];
    memcpy(body, nonce_w, KVB_HS_NONCE_LEN);
    memcpy(body + KVB_HS_NONCE_LEN, mac, KVB_HS_MAC_LEN);
    fixed_encode(PROOF_MAGIC, body, sizeof(body), out);
}

kvb_status_t kvb__hs_proof_decode(const uint8_t *buf, size_t len, const uint8_t **nonce_w_p,
                                  const uint8_t **mac_p, char *why, size_t whylen)
{
    const uint8_t *body;
    kvb_status_t st = fixed_decode(PROOF_MAGIC, "proof", buf, len,
                                   KVB_HS_NONCE_LEN + KVB_HS_MAC_LEN, &body, why, whylen);
    if (st == KVB_OK) {
        *nonce_w_p = body;
        *mac_p = body + KVB_HS_NONCE_LEN;
    }
    return st;
}

void kvb__hs_deny_encode(uint8_t out[KVB_HS_DENY_LEN])
{
    fixed_encode(DENY_MAGIC, NULL, 0, out);
}

kvb_status_t kvb__hs_deny_decode(const uint8_t *buf, size_t len, char *why, size_t whylen)
{
    return fixed_decode(DENY_MAGIC, "denial", buf, len, 0, NULL, why, whylen);
}

kvb_status_t kvb__hs_sealed_encode(const uint8_t mac[KVB_HS_MAC_LEN], const uint8_t *rep,
                                   size_t rep_len, uint8_t **buf_p, size_t *len_p)
{
    wbuf_t w = {0};
    wb_put(&w, SEAL_MAGIC, KVB_HS_MAGIC_LEN);
    wb_u32(&w, 0);
    wb_put(&w, mac, KVB_HS_MAC_LEN);
    wb_put(&w, rep, rep_len);
    if (!w.fail && w.len > KVB_HS_MAX_MSG + KVB_HS_SEAL_HDR) {
        free(w.p);
        return KVB_ERR_INVALID;
    }
    if (w.fail) {
        free(w.p);
        return KVB_ERR_NOMEM;
    }
    uint32_t total = (uint32_t)w.len;
    for (int i = 0; i < 4; i++)
        w.p[KVB_HS_MAGIC_LEN + i] = (uint8_t)(total >> (8 * i));
    *buf_p = w.p;
    *len_p = w.len;
    return KVB_OK;
}

kvb_status_t kvb__hs_sealed_decode(const uint8_t *buf, size_t len, const uint8_t **mac_p,
                                   const uint8_t **rep_p, size_t *rep_len_p, char *why,
                                   size_t whylen)
{
    rbuf_t rb = {buf, len, 0};
    if (!rb_header(&rb, SEAL_MAGIC, why, whylen))
        return KVB_ERR_PROTO;
    if (len < KVB_HS_SEAL_HDR) {
        snprintf(why, whylen, "sealed handshake reply of %zu bytes has no MAC", len);
        return KVB_ERR_PROTO;
    }
    *mac_p = buf + KVB_HS_MAGIC_LEN + 4;
    *rep_p = buf + KVB_HS_SEAL_HDR;
    *rep_len_p = len - KVB_HS_SEAL_HDR;
    return KVB_OK;
}

size_t kvb__hs_local_encode(uint32_t pid, uint32_t fd, const char *host,
                            uint8_t out[KVB_HS_LOCAL_MAX])
{
    uint8_t body[12 + KVB_HS_MAX_HOST];
    size_t hl = strnlen(host, KVB_HS_MAX_HOST);
    uint32_t v[3] = {pid, fd, (uint32_t)hl};
    for (int k = 0; k < 3; k++)
        for (int i = 0; i < 4; i++)
            body[4 * k + i] = (uint8_t)(v[k] >> (8 * i));
    memcpy(body + 12, host, hl);
    fixed_encode(LOCAL_MAGIC, body, 12 + hl, out);
    return KVB_HS_MAGIC_LEN + 4 + 12 + hl;
}

kvb_status_t kvb__hs_local_decode(const uint8_t *buf, size_t len, uint32_t *pid_p, uint32_t *fd_p,
                                  const uint8_t **host_p, uint32_t *host_len_p, char *why,
                                  size_t whylen)
{
    rbuf_t rb = {buf, len, 0};
    uint32_t pid, fd, hl;
    const uint8_t *host;
    if (!rb_header(&rb, LOCAL_MAGIC, why, whylen))
        return KVB_ERR_PROTO;
    if (!rb_u32(&rb, &pid) || !rb_u32(&rb, &fd) || !rb_u32(&rb, &hl) || hl > KVB_HS_MAX_HOST ||
        !rb_bytes(&rb, hl, &host) || rb.off != len || pid == 0 || fd > INT32_MAX) {
        snprintf(why, whylen, "same-host challenge malformed");
        return KVB_ERR_PROTO;
    }
    *pid_p = pid;
    *fd_p = fd;
    *host_p = host;
    *host_len_p = hl;
    return KVB_OK;
}

void kvb__hs_localok_encode(const uint8_t mac[KVB_HS_MAC_LEN], uint8_t out[KVB_HS_LOCALOK_LEN])
{
    fixed_encode(LOCALOK_MAGIC, mac, KVB_HS_MAC_LEN, out);
}

kvb_status_t kvb__hs_localok_decode(const uint8_t *buf, size_t len, const uint8_t **mac_p,
                                    char *why, size_t whylen)
{
    return fixed_decode(LOCALOK_MAGIC, "same-host proof", buf, len, KVB_HS_MAC_LEN, mac_p, why,
                        whylen);
}

/* HMAC-SHA256(key, label || parts...) with OpenSSL's one-shot context. */
typedef struct part {
    const void *p;
    size_t n;
} part_t;

static kvb_status_t hmac_parts(const void *key, size_t keylen, const char *label,
                               const part_t *parts, size_t nparts, uint8_t out[KVB_HS_MAC_LEN])
{
    size_t n = KVB_HS_MAGIC_LEN, off = KVB_HS_MAGIC_LEN;
    for (size_t i = 0; i < nparts; i++)
        n += parts[i].n;
    uint8_t *msg = malloc(n);
    unsigned int ol = 0;
    if (msg == NULL)
        return KVB_ERR_NOMEM;
    memcpy(msg, label, KVB_HS_MAGIC_LEN);
    for (size_t i = 0; i < nparts; i++) {
        if (parts[i].n > 0)
            memcpy(msg + off, parts[i].p, parts[i].n);
        off += parts[i].n;
    }
    const unsigned char *r = HMAC(EVP_sha256(), key, (int)keylen, msg, n, out, &ol);
    OPENSSL_cleanse(msg, n);
    free(msg);
    return r != NULL && ol == KVB_HS_MAC_LEN ? KVB_OK : KVB_ERR_IO;
}

kvb_status_t kvb__hs_auth_mac(const char *secret, const uint8_t nonce_l[KVB_HS_NONCE_LEN],
                              const uint8_t nonce_w[KVB_HS_NONCE_LEN], const uint8_t *sid,
                              uint32_t sid_len, uint8_t mac[KVB_HS_MAC_LEN])
{
    part_t p[] = {{nonce_l, KVB_HS_NONCE_LEN}, {nonce_w, KVB_HS_NONCE_LEN}, {sid, sid_len}};
    return hmac_parts(secret, strlen(secret), MAC_LABEL, p, 3, mac);
}

kvb_status_t kvb__hs_reply_mac(const char *secret, const uint8_t nonce_l[KVB_HS_NONCE_LEN],
                               const uint8_t nonce_w[KVB_HS_NONCE_LEN], const uint8_t *sid,
                               uint32_t sid_len, const uint8_t *rep, size_t rep_len,
                               uint8_t mac[KVB_HS_MAC_LEN])
{
    uint8_t sl[4] = {(uint8_t)sid_len, (uint8_t)(sid_len >> 8), (uint8_t)(sid_len >> 16),
                     (uint8_t)(sid_len >> 24)};
    part_t p[] = {{nonce_l, KVB_HS_NONCE_LEN},
                  {nonce_w, KVB_HS_NONCE_LEN},
                  {sl, 4},
                  {sid, sid_len},
                  {rep, rep_len}};
    return hmac_parts(secret, strlen(secret), REPLY_LABEL, p, 5, mac);
}

kvb_status_t kvb__hs_am_token(const char *secret, const uint8_t nonce_w[KVB_HS_NONCE_LEN],
                              const uint8_t nonce_l[KVB_HS_NONCE_LEN], uint64_t epoch,
                              uint8_t token[KVB_HS_TOKEN_LEN])
{
    uint8_t e[8], mac[KVB_HS_MAC_LEN];
    for (int i = 0; i < 8; i++)
        e[i] = (uint8_t)(epoch >> (8 * i));
    part_t p[] = {{nonce_w, KVB_HS_NONCE_LEN}, {nonce_l, KVB_HS_NONCE_LEN}, {e, 8}};
    kvb_status_t st = hmac_parts(secret, strlen(secret), TOKEN_LABEL, p, 3, mac);
    if (st == KVB_OK)
        memcpy(token, mac, KVB_HS_TOKEN_LEN);
    OPENSSL_cleanse(mac, sizeof(mac));
    return st;
}

kvb_status_t kvb__hs_local_mac(const uint8_t value[KVB_HS_LOCAL_VALUE_LEN], const uint8_t *tuple,
                               size_t tuple_len, uint8_t mac[KVB_HS_MAC_LEN])
{
    part_t p[] = {{tuple, tuple_len}};
    return hmac_parts(value, KVB_HS_LOCAL_VALUE_LEN, LOCAL_LABEL, p, 1, mac);
}

/* One address as bytes: IPv4 (also IPv4-mapped IPv6) 4 + port, IPv6 16 + port. */
static bool addr_bytes(const struct sockaddr_storage *ss, uint8_t *out, size_t *len_p)
{
    static const uint8_t mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    const uint8_t *a;
    size_t n;
    uint16_t port;
    if (ss->ss_family == AF_INET) {
        const struct sockaddr_in *s4 = (const struct sockaddr_in *)ss;
        a = (const uint8_t *)&s4->sin_addr;
        n = 4;
        port = s4->sin_port;
    } else if (ss->ss_family == AF_INET6) {
        const struct sockaddr_in6 *s6 = (const struct sockaddr_in6 *)ss;
        a = (const uint8_t *)&s6->sin6_addr;
        n = 16;
        port = s6->sin6_port;
        if (memcmp(a, mapped, 12) == 0) {
            a += 12;
            n = 4;
        }
    } else {
        return false;
    }
    memcpy(out + *len_p, a, n);
    memcpy(out + *len_p + n, &port, 2);
    *len_p += n + 2;
    return true;
}

bool kvb__hs_conn_tuple(int fd, bool listener, uint8_t out[KVB_HS_TUPLE_MAX], size_t *len_p)
{
    struct sockaddr_storage me, peer;
    socklen_t ml = sizeof(me), pl = sizeof(peer);
    size_t n = 0;
    if (getsockname(fd, (struct sockaddr *)&me, &ml) != 0 ||
        getpeername(fd, (struct sockaddr *)&peer, &pl) != 0)
        return false;
    if (!addr_bytes(listener ? &peer : &me, out, &n) ||
        !addr_bytes(listener ? &me : &peer, out, &n))
        return false;
    *len_p = n;
    return true;
}

bool kvb__ct_equal(const void *a, const void *b, size_t n)
{
    return CRYPTO_memcmp(a, b, n) == 0;
}

void kvb__hs_notice_encode(uint64_t generation, uint8_t out[KVB_HS_NOTICE_LEN])
{
    memcpy(out, NOTE_MAGIC, KVB_HS_MAGIC_LEN);
    for (int i = 0; i < 8; i++)
        out[8 + i] = (uint8_t)(generation >> (8 * i));
}

bool kvb__hs_notice_decode(const uint8_t in[KVB_HS_NOTICE_LEN], uint64_t *generation_p)
{
    uint64_t g = 0;
    if (memcmp(in, NOTE_MAGIC, KVB_HS_MAGIC_LEN) != 0)
        return false;
    for (int i = 0; i < 8; i++)
        g |= (uint64_t)in[8 + i] << (8 * i);
    *generation_p = g;
    return true;
}

kvb_status_t kvb__sid_parse(const char *sid, char *host, size_t hostlen, uint16_t *port_p)
{
    const char *colon, *h = sid;
    size_t hl;
    int64_t port;
    if (sid == NULL || strlen(sid) > KVB_HS_MAX_SID)
        return KVB_ERR_INVALID;
    if (sid[0] == '[') {
        const char *close = strchr(sid, ']');
        if (close == NULL || close[1] != ':')
            return KVB_ERR_INVALID;
        h = sid + 1;
        hl = (size_t)(close - h);
        colon = close + 1;
    } else {
        colon = strrchr(sid, ':');
        if (colon == NULL || memchr(sid, ':', (size_t)(colon - sid)) != NULL)
            return KVB_ERR_INVALID;
        hl = (size_t)(colon - sid);
    }
    if (hl == 0 || hl >= hostlen || !kvb__parse_i64(colon + 1, strlen(colon + 1), 1, 65535, &port))
        return KVB_ERR_INVALID;
    memcpy(host, h, hl);
    host[hl] = '\0';
    *port_p = (uint16_t)port;
    return KVB_OK;
}

static int ms_left(uint64_t deadline_ns)
{
    uint64_t now = kvb__now_ns();
    if (now >= deadline_ns)
        return 0;
    uint64_t ms = (deadline_ns - now + 999999) / 1000000;
    return ms > 60000 ? 60000 : (int)ms;
}

static kvb_status_t wait_fd(int fd, short events, uint64_t deadline_ns)
{
    for (;;) {
        struct pollfd p = {fd, events, 0};
        int ms = ms_left(deadline_ns);
        if (ms == 0)
            return KVB_ERR_TIMEOUT;
        int rc = poll(&p, 1, ms);
        if (rc > 0)
            return KVB_OK;
        if (rc < 0 && errno != EINTR)
            return KVB_ERR_IO;
    }
}

static kvb_status_t connect_one(const struct addrinfo *ai, uint64_t deadline_ns, int *fd_p)
{
    int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    int err = 0, one = 1;
    socklen_t el = sizeof(err);
    kvb_status_t st;
    if (fd < 0)
        return KVB_ERR_IO;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    if (connect(fd, ai->ai_addr, ai->ai_addrlen) != 0 && errno != EINPROGRESS) {
        close(fd);
        return KVB_ERR_PEER;
    }
    st = wait_fd(fd, POLLOUT, deadline_ns);
    if (st == KVB_OK && (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el) != 0 || err != 0))
        st = KVB_ERR_PEER;
    if (st != KVB_OK) {
        close(fd);
        return st;
    }
    *fd_p = fd;
    return KVB_OK;
}

kvb_status_t kvb__sock_connect(const char *host, uint16_t port, uint64_t deadline_ns, int *fd_p,
                               char *why, size_t whylen)
{
    struct addrinfo hints = {0}, *res = NULL;
    char ports[8];
    kvb_status_t st = KVB_ERR_PEER;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICSERV;
    snprintf(ports, sizeof(ports), "%u", port);
    int gai = getaddrinfo(host, ports, &hints, &res);
    if (gai != 0) {
        snprintf(why, whylen, "cannot resolve %s: %s", host, gai_strerror(gai));
        return KVB_ERR_PEER;
    }
    for (struct addrinfo *ai = res; ai != NULL; ai = ai->ai_next) {
        st = connect_one(ai, deadline_ns, fd_p);
        if (st == KVB_OK || st == KVB_ERR_TIMEOUT)
            break;
    }
    freeaddrinfo(res);
    if (st == KVB_ERR_TIMEOUT)
        snprintf(why, whylen, "connect to %s:%u timed out", host, port);
    else if (st != KVB_OK)
        snprintf(why, whylen, "connect to %s:%u refused or unreachable", host, port);
    return st;
}

kvb_status_t kvb__sock_write_all(int fd, const void *buf, size_t len, uint64_t deadline_ns)
{
    const uint8_t *p = buf;
    while (len > 0) {
        ssize_t n = send(fd, p, len, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n > 0) {
            p += n;
            len -= (size_t)n;
            continue;
        }
        if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
            return KVB_ERR_PEER;
        kvb_status_t st = wait_fd(fd, POLLOUT, deadline_ns);
        if (st != KVB_OK)
            return st;
    }
    return KVB_OK;
}

kvb_status_t kvb__sock_read_all(int fd, void *buf, size_t len, uint64_t deadline_ns)
{
    uint8_t *p = buf;
    while (len > 0) {
        ssize_t n = recv(fd, p, len, MSG_DONTWAIT);
        if (n > 0) {
            p += n;
            len -= (size_t)n;
            continue;
        }
        if (n == 0)
            return KVB_ERR_PEER;
        if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
            return KVB_ERR_PEER;
        kvb_status_t st = wait_fd(fd, POLLIN, deadline_ns);
        if (st != KVB_OK)
            return st;
    }
    return KVB_OK;
}

kvb_status_t kvb__sock_read_msg(int fd, const char *magic, size_t max, uint64_t deadline_ns,
                                uint8_t **buf_p, size_t *len_p, char *why, size_t whylen)
{
    uint8_t hdr[KVB_HS_MAGIC_LEN + 4];
    kvb_status_t st = kvb__sock_read_all(fd, hdr, sizeof(hdr), deadline_ns);
    if (st != KVB_OK) {
        snprintf(why, whylen, "%s while reading the handshake",
                 st == KVB_ERR_TIMEOUT ? "timed out" : "connection closed");
        return st;
    }
    uint32_t total = (uint32_t)hdr[8] | (uint32_t)hdr[9] << 8 | (uint32_t)hdr[10] << 16 |
                     (uint32_t)hdr[11] << 24;
    bool magic_ok =
        magic != NULL ? memcmp(hdr, magic, KVB_HS_MAGIC_LEN) == 0 : memcmp(hdr, "KVBH", 4) == 0;
    if (!magic_ok || total < sizeof(hdr) || total > max) {
        snprintf(why, whylen, "bad handshake header (magic or length %u)", total);
        return KVB_ERR_PROTO;
    }
    uint8_t *buf = malloc(total);
    if (buf == NULL)
        return KVB_ERR_NOMEM;
    memcpy(buf, hdr, sizeof(hdr));
    st = kvb__sock_read_all(fd, buf + sizeof(hdr), total - sizeof(hdr), deadline_ns);
    if (st != KVB_OK) {
        free(buf);
        snprintf(why, whylen, "%s while reading the handshake body",
                 st == KVB_ERR_TIMEOUT ? "timed out" : "connection closed");
        return st;
    }
    *buf_p = buf;
    *len_p = total;
    return KVB_OK;
}
