/* Engine lifecycle, local registrations, the handshake listener and the
 * progress thread. See engine_int.h for the threading model. */
#include "engine/engine_int.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#define EP_TAG_UCX 0
#define EP_TAG_EVFD 1

static void params_defaults(kvb_engine_params_t *out, const kvb_engine_params_t *in)
{
    const char *t = kvb__env_get("KVBRIDGE_TRANSPORT", NULL);
    memset(out, 0, sizeof(*out));
    out->host = "127.0.0.1";
    out->transport = KVB_TRANSPORT_AUTO;
    if (t != NULL && strcmp(t, "tcp") == 0)
        out->transport = KVB_TRANSPORT_TCP;
    else if (t != NULL && strcmp(t, "shm") == 0)
        out->transport = KVB_TRANSPORT_SHM;
    out->connect_timeout_s = kvb__env_double("KVBRIDGE_CONNECT_TIMEOUT", NULL, 5.0, 0.01, 3600);
    out->peer_timeout_s = kvb__env_double("KVBRIDGE_PEER_TIMEOUT", NULL, 2.0, 0.1, 3600);
    out->am_chunk_bytes =
        (size_t)kvb__env_int("KVBRIDGE_AM_CHUNK", NULL, 4 << 20, 4096, (int64_t)1 << 30);
    out->secret = kvb__env_get("KVBRIDGE_ENGINE_SECRET", NULL);
    out->copy_threads = (unsigned)kvb__env_int("KVBRIDGE_COPY_THREADS", NULL, 2, 0, 64);
    if (in == NULL)
        return;
    if (in->field_mask & KVB_ENGINE_PARAM_HOST && in->host != NULL)
        out->host = in->host;
    if (in->field_mask & KVB_ENGINE_PARAM_PORT)
        out->port = in->port;
    if (in->field_mask & KVB_ENGINE_PARAM_TRANSPORT)
        out->transport = in->transport;
    if (in->field_mask & KVB_ENGINE_PARAM_CONNECT_TIMEOUT)
        out->connect_timeout_s = in->connect_timeout_s;
    if (in->field_mask & KVB_ENGINE_PARAM_PEER_TIMEOUT)
        out->peer_timeout_s = in->peer_timeout_s;
    if (in->field_mask & KVB_ENGINE_PARAM_AM_CHUNK)
        out->am_chunk_bytes = in->am_chunk_bytes;
    if (in->field_mask & KVB_ENGINE_PARAM_SECRET)
        out->secret = in->secret;
    if (in->field_mask & KVB_ENGINE_PARAM_COPY_THREADS)
        out->copy_threads = in->copy_threads < 64 ? in->copy_threads : 64;
}

/* UCX's TCP transport moves data in segments of 8 KiB by default (one
 * send/recv system call each, and the eager limit). 64 KiB segments measured
 * faster on the tcp lane (docs/engine.md). Only the tcp transport has
 * TX_SEG_SIZE/RX_SEG_SIZE (UCX warns about keys no transport used, so not
 * with --transport shm, nor when UCX_TLS is set: the caller picks the
 * transports then); UCX_TCP_* or UCX_* in the environment still win. */
static void tcp_segments(ucp_config_t *cfg)
{
    static const char *const names[] = {"TX_SEG_SIZE", "RX_SEG_SIZE"};
    char env[2][40];
    for (size_t i = 0; i < 2; i++) {
        snprintf(env[0], sizeof(env[0]), "UCX_TCP_%s", names[i]);
        snprintf(env[1], sizeof(env[1]), "UCX_%s", names[i]);
        if (getenv(env[0]) == NULL && getenv(env[1]) == NULL &&
            ucp_config_modify(cfg, names[i], "64k") != UCS_OK)
            KVB_LOGD("UCX does not know %s; TCP segments left at its default", names[i]);
    }
}

/* UCX probes an endpoint's peer every KEEPALIVE_INTERVAL (20 s by
 * default). Until it does, a target does not learn that a writer that went
 * away (its control connection dropped, its endpoint closed) will never send
 * the data of a rendezvous it announced: that receive stays counted by the
 * writer's grant, so a decode holds the room (the abort fence) that long.
 * Probing at the peer time-out bounds the hold by it (test_fence_drop_tcp:
 * 20 s -> 1-2 s); UCX_KEEPALIVE_INTERVAL in the environment still wins. */
static void keepalive(ucp_config_t *cfg, double peer_timeout_s)
{
    char v[32];
    snprintf(v, sizeof(v), "%.0fms", peer_timeout_s * 1000);
    if (getenv("UCX_KEEPALIVE_INTERVAL") == NULL &&
        ucp_config_modify(cfg, "KEEPALIVE_INTERVAL", v) != UCS_OK)
        KVB_LOGD("UCX does not know KEEPALIVE_INTERVAL; left at its default");
}

static kvb_status_t ucx_init(kvb_engine_h eng)
{
    ucp_config_t *cfg;
    ucp_params_t p = {0};
    ucp_worker_params_t wp = {0};
    ucp_worker_attr_t wa = {0};
    if (ucp_config_read(NULL, NULL, &cfg) != UCS_OK)
        return kvb__err_set(&eng->err, KVB_ERR_IO, "UCX configuration could not be read");
    if (eng->params.transport == KVB_TRANSPORT_TCP)
        ucp_config_modify(cfg, "TLS", "tcp");
    else if (eng->params.transport == KVB_TRANSPORT_SHM)
        ucp_config_modify(cfg, "TLS", "sm,self");
    if (eng->params.transport != KVB_TRANSPORT_SHM && getenv("UCX_TLS") == NULL)
        tcp_segments(cfg);
    keepalive(cfg, eng->params.peer_timeout_s);
    p.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
    p.features = UCP_FEATURE_RMA | UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
    p.mt_workers_shared = 1;
    ucs_status_t us = ucp_init(&p, cfg, &eng->ctx);
    ucp_config_release(cfg);
    if (us != UCS_OK)
        return kvb__err_set(&eng->err, KVB_ERR_IO, "ucp_init failed: %s", ucs_status_string(us));
    wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wp.thread_mode = UCS_THREAD_MODE_SINGLE;
    us = ucp_worker_create(eng->ctx, &wp, &eng->worker);
    if (us != UCS_OK)
        return kvb__err_set(&eng->err, KVB_ERR_IO, "ucp_worker_create failed: %s",
                            ucs_status_string(us));
    wa.field_mask = UCP_WORKER_ATTR_FIELD_MAX_AM_HEADER;
    ucp_worker_query(eng->worker, &wa);
    eng->max_am_header = wa.max_am_header;
    if (ucp_worker_get_address(eng->worker, &eng->waddr, &eng->waddr_len) != UCS_OK)
        return kvb__err_set(&eng->err, KVB_ERR_IO, "ucp_worker_get_address failed");
    if (ucp_worker_get_efd(eng->worker, &eng->ucx_efd) != UCS_OK)
        return kvb__err_set(&eng->err, KVB_ERR_IO, "ucp_worker_get_efd failed");
    return kvb__lanes_init(eng);
}

static void format_sid(kvb_engine_h eng, const struct sockaddr_storage *ss)
{
    char addr[INET6_ADDRSTRLEN];
    if (ss->ss_family == AF_INET6) {
        const struct sockaddr_in6 *s6 = (const struct sockaddr_in6 *)ss;
        inet_ntop(AF_INET6, &s6->sin6_addr, addr, sizeof(addr));
        snprintf(eng->sid, sizeof(eng->sid), "[%s]:%u", addr, ntohs(s6->sin6_port));
    } else {
        const struct sockaddr_in *s4 = (const struct sockaddr_in *)ss;
        inet_ntop(AF_INET, &s4->sin_addr, addr, sizeof(addr));
        snprintf(eng->sid, sizeof(eng->sid), "%s:%u", addr, ntohs(s4->sin_port));
    }
}

static kvb_status_t listen_init(kvb_engine_h eng)
{
    struct addrinfo hints = {0}, *res = NULL;
    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss);
    char port[8];
    int one = 1;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV | AI_PASSIVE;
    snprintf(port, sizeof(port), "%u", eng->params.port);
    if (getaddrinfo(eng->params.host, port, &hints, &res) != 0)
        return kvb__err_set(&eng->err, KVB_ERR_INVALID,
                            "listen host \"%s\" is not a numeric IPv4/IPv6 address",
                            eng->params.host);
    eng->listen_fd = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (eng->listen_fd >= 0)
        setsockopt(eng->listen_fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (eng->listen_fd < 0 || bind(eng->listen_fd, res->ai_addr, res->ai_addrlen) != 0 ||
        listen(eng->listen_fd, 128) != 0) {
        int e = errno;
        freeaddrinfo(res);
        return kvb__err_set(&eng->err, KVB_ERR_IO, "cannot listen on %s:%u: %s", eng->params.host,
                            eng->params.port, strerror(e));
    }
    freeaddrinfo(res);
    getsockname(eng->listen_fd, (struct sockaddr *)&ss, &sl);
    format_sid(eng, &ss);
    return KVB_OK;
}

static void read_host_id(kvb_engine_h eng)
{
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    eng->host_id[0] = '\0';
    if (f != NULL) {
        if (fgets(eng->host_id, sizeof(eng->host_id), f) == NULL)
            eng->host_id[0] = '\0';
        fclose(f);
    }
    eng->host_id[strcspn(eng->host_id, "\n")] = '\0';
    if (eng->host_id[0] == '\0')
        gethostname(eng->host_id, sizeof(eng->host_id) - 1);
}

/* ---- local registrations ---- */

static void notify_locked(kvb_engine_h eng)
{
    uint8_t msg[KVB_HS_NOTICE_LEN];
    kvb__hs_notice_encode(eng->generation, msg);
    for (size_t i = 0; i < eng->n_notify; i++)
        if (send(eng->notify[i].fd, msg, sizeof(msg), MSG_DONTWAIT | MSG_NOSIGNAL) < 0)
            KVB_LOGD("segment notice to fd %d failed: %s", eng->notify[i].fd, strerror(errno));
}

static kvb_status_t map_region(kvb_engine_h eng, const kvb_mem_region_ex_t *r, kvb__seg_t *seg)
{
    ucp_mem_map_params_t mp = {0};
    ucp_mem_h memh;
    bool cuda = false;
    memset(seg, 0, sizeof(*seg));
    if (r->addr == NULL || r->length == 0 || (uintptr_t)r->addr + r->length < (uintptr_t)r->addr)
        return kvb__err_set(&eng->err, KVB_ERR_INVALID, "region %p+%zu is empty or wraps", r->addr,
                            r->length);
    /* Device memory is moved by the driver (mem_cuda.c), never by UCX. */
    kvb_status_t st = kvb__cuda_map_region(eng, r, seg, &cuda);
    if (st != KVB_OK || cuda)
        return st;
    mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
    mp.address = r->addr;
    mp.length = r->length;
    ucs_status_t us = ucp_mem_map(eng->ctx, &mp, &memh);
    if (us != UCS_OK)
        return kvb__err_set(&eng->err, KVB_ERR_IO, "ucp_mem_map(%p, %zu) failed: %s", r->addr,
                            r->length, ucs_status_string(us));
    us = ucp_rkey_pack(eng->ctx, memh, &seg->rkey_buf, &seg->rkey_len);
    if (us != UCS_OK) {
        ucp_mem_unmap(eng->ctx, memh);
        return kvb__err_set(&eng->err, KVB_ERR_IO, "ucp_rkey_pack failed: %s",
                            ucs_status_string(us));
    }
    seg->addr = (uint64_t)(uintptr_t)r->addr;
    seg->len = r->length;
    seg->handle = memh;
    seg->shared = kvb__shm_lookup(seg->addr, seg->len, &seg->ref);
    return KVB_OK;
}

static void unmap_seg(kvb_engine_h eng, kvb__seg_t *seg)
{
    if (seg->cuda != NULL) {
        kvb__cuda_unmap_seg(eng, seg);
        return;
    }
    ucp_rkey_buffer_release(seg->rkey_buf);
    ucp_mem_unmap(eng->ctx, (ucp_mem_h)seg->handle);
}

/* Remove the region starting at addr (seg_mu held); waits for pins. A
 * region stays registered while an incoming receive into it is in progress:
 * a stalled writer resumes and UCX completes the rendezvous straight into
 * the destination, i.e. into memory the caller would free. That is also why
 * unpin may find a pinned segment by its start address: a pinned segment is
 * never removed, so no new registration can sit at that address. */
static kvb_status_t unregister_locked(kvb_engine_h eng, void *addr)
{
    long i = kvb__segtab_find_start(&eng->segs, (uint64_t)(uintptr_t)addr);
    kvb__seg_t seg;
    if (i < 0)
        return kvb__err_set(&eng->err, KVB_ERR_NOT_FOUND,
                            "unregister: no registered region starts at %p", addr);
    double wait_s = 2 * eng->params.peer_timeout_s;
    uint64_t deadline = kvb__now_ns() + (uint64_t)(wait_s * 1e9);
    while (eng->segs.v[i].pins > 0) {
        if (kvb__now_ns() >= deadline)
            return kvb__err_set(&eng->err, KVB_ERR_TIMEOUT,
                                "unregister %p: an incoming write into it is still in progress "
                                "after %.1f s; the region stays registered (do not free it; "
                                "retry, or close the writer's session)",
                                addr, wait_s);
        kvb__cond_wait_ns(&eng->seg_cv, &eng->seg_mu, 50000000ull);
        i = kvb__segtab_find_start(&eng->segs, (uint64_t)(uintptr_t)addr);
        if (i < 0)
            return kvb__err_set(&eng->err, KVB_ERR_NOT_FOUND,
                                "unregister: region %p went away while waiting", addr);
    }
    kvb__segtab_remove(&eng->segs, (size_t)i, &seg);
    unmap_seg(eng, &seg);
    return KVB_OK;
}

/* Region i of an array with stride size (kvb_mem_region_t when legacy),
 * as this version's struct: fields the caller's struct lacks take their
 * defaults. */
static kvb_mem_region_ex_t region_at(const void *regions, size_t i, size_t size, bool legacy)
{
    kvb_mem_region_ex_t r = {0};
    if (legacy) {
        const kvb_mem_region_t *o = (const kvb_mem_region_t *)regions + i;
        r = (kvb_mem_region_ex_t){0, o->addr, o->length, o->mem_type, -1};
    } else {
        memcpy(&r, (const uint8_t *)regions + i * size, size < sizeof(r) ? size : sizeof(r));
        if (size < offsetof(kvb_mem_region_ex_t, device) + sizeof(int))
            r.field_mask &= ~(uint64_t)KVB_MEM_REGION_FIELD_DEVICE;
    }
    return r;
}

static kvb_status_t register_regions(kvb_engine_h eng, const void *regions, size_t count,
                                     size_t size, bool legacy)
{
    kvb_status_t st = KVB_OK;
    size_t done = 0;
    if (eng == NULL || (regions == NULL && count > 0))
        return KVB_ERR_INVALID;
    if (!legacy && size < offsetof(kvb_mem_region_ex_t, mem_type) + sizeof(kvb_mem_type_t))
        return kvb__err_set(&eng->err, KVB_ERR_INVALID,
                            "register: region_size %zu is shorter than a region", size);
    pthread_mutex_lock(&eng->seg_mu);
    for (; done < count; done++) {
        kvb__seg_t seg;
        kvb_mem_region_ex_t r = region_at(regions, done, size, legacy);
        st = map_region(eng, &r, &seg);
        if (st != KVB_OK)
            break;
        st = kvb__segtab_insert(&eng->segs, &seg);
        if (st != KVB_OK) {
            unmap_seg(eng, &seg);
            kvb__err_set(&eng->err, st, "register %p+%zu: %s", r.addr, r.length,
                         st == KVB_ERR_OVERLAP ? "overlaps a registered region"
                                               : kvb_status_string(st));
            break;
        }
    }
    if (st != KVB_OK)
        while (done-- > 0)
            unregister_locked(eng, region_at(regions, done, size, legacy).addr);
    else if (count > 0) {
        eng->generation++;
        notify_locked(eng);
    }
    pthread_mutex_unlock(&eng->seg_mu);
    return st;
}

kvb_status_t kvb_engine_register_batch(kvb_engine_h eng, const kvb_mem_region_t *regions,
                                       size_t count)
{
    return register_regions(eng, regions, count, sizeof(*regions), true);
}

kvb_status_t kvb_engine_register_ex(kvb_engine_h eng, const kvb_mem_region_ex_t *regions,
                                    size_t count, size_t region_size)
{
    return register_regions(eng, regions, count, region_size, false);
}

kvb_status_t kvb_engine_register(kvb_engine_h eng, void *addr, size_t length,
                                 kvb_mem_type_t mem_type)
{
    kvb_mem_region_t r = {addr, length, mem_type};
    return kvb_engine_register_batch(eng, &r, 1);
}

kvb_status_t kvb_engine_unregister_batch(kvb_engine_h eng, void *const *addrs, size_t count)
{
    kvb_status_t st = KVB_OK;
    if (eng == NULL || (addrs == NULL && count > 0))
        return KVB_ERR_INVALID;
    pthread_mutex_lock(&eng->seg_mu);
    for (size_t i = 0; i < count; i++) {
        kvb_status_t s = unregister_locked(eng, addrs[i]);
        if (s != KVB_OK)
            st = s;
    }
    eng->generation++;
    notify_locked(eng);
    pthread_mutex_unlock(&eng->seg_mu);
    return st;
}

kvb_status_t kvb_engine_unregister(kvb_engine_h eng, void *addr)
{
    return kvb_engine_unregister_batch(eng, &addr, 1);
}

/* ---- handshake listener ---- */

/* local: the writer proved it runs on this host; only then the reply names
 * our shared files (pid, descriptors, nonces). caps: what the writer's
 * request says it understands (KVB_HS_CAP_*). */
static kvb_status_t build_reply(kvb_engine_h eng, bool local, uint32_t caps, uint8_t **buf_p,
                                size_t *len_p, uint64_t *gen_p)
{
    kvb__hs_reply_t r = {0};
    kvb_status_t st;
    pthread_mutex_lock(&eng->seg_mu);
    r.epoch = eng->epoch;
    r.generation = *gen_p = eng->generation;
    r.host = (const uint8_t *)eng->host_id;
    r.host_len = (uint32_t)strlen(eng->host_id);
    r.waddr = (const uint8_t *)eng->waddr;
    r.waddr_len = (uint32_t)eng->waddr_len;
    r.nseg = (uint32_t)eng->segs.n;
    r.segs = calloc(eng->segs.n ? eng->segs.n : 1, sizeof(*r.segs));
    st = r.segs == NULL ? KVB_ERR_NOMEM : KVB_OK;
    for (size_t i = 0; st == KVB_OK && i < eng->segs.n; i++) {
        r.segs[i].addr = eng->segs.v[i].addr;
        r.segs[i].len = eng->segs.v[i].len;
        r.segs[i].rkey = eng->segs.v[i].rkey_buf;
        r.segs[i].rkey_len = (uint32_t)eng->segs.v[i].rkey_len;
    }
    if (st == KVB_OK)
        st = kvb__cuda_table(eng, &r);
    if (st == KVB_OK)
        st = kvb__lanes_advertise(eng, &r, local, caps);
    if (st == KVB_OK)
        st = kvb__hs_reply_encode(&r, buf_p, len_p);
    pthread_mutex_unlock(&eng->seg_mu);
    free(r.segs);
    free(r.shm);
    free(r.cuda);
    free(r.parts);
    return st;
}

static void peer_host(int fd, uint8_t host[16])
{
    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss);
    memset(host, 0, 16);
    if (getpeername(fd, (struct sockaddr *)&ss, &sl) != 0)
        return;
    if (ss.ss_family == AF_INET6) {
        memcpy(host, &((struct sockaddr_in6 *)&ss)->sin6_addr, 16);
    } else if (ss.ss_family == AF_INET) {
        host[10] = host[11] = 0xff;
        memcpy(host + 12, &((struct sockaddr_in *)&ss)->sin_addr, 4);
    }
}

/* The cap keeps connections by what they proved, not by their address
 * (review 2, finding 4). May a newcomer (authed: it proved the engine
 * secret) displace connection n? Never one that proved more than the
 * newcomer (secret), never one that wrote or may be writing: its writes
 * carried its token (secret), or, without a secret, where writes cannot be
 * told apart, any write came after its reply (admitted: eng->am_admitted
 * now); never one that proved it runs on this host (the direct lane's
 * writes are not seen here at all). seg_mu held. */
static bool notify_evictable(const kvb__notify_t *n, bool authed, uint64_t admitted)
{
    if (n->authed && !authed)
        return false;
    if (n->used || n->local)
        return false;
    return n->authed || n->admitted_at == admitted;
}

/* At the cap: the oldest connection a newcomer may displace (idle, never
 * wrote, proved no more than the newcomer), or -1: none, the newcomer is
 * refused. One pass. seg_mu held. */
static long notify_victim(kvb_engine_h eng, bool authed)
{
    uint64_t admitted = __atomic_load_n(&eng->am_admitted, __ATOMIC_SEQ_CST);
    for (size_t i = 0; i < eng->n_notify; i++)
        if (notify_evictable(&eng->notify[i], authed, admitted))
            return (long)i;
    return -1;
}

/* Remove entry i keeping the order (seg_mu held); the fd is the caller's. */
/* Take control connection i off the list (seg_mu held); its message-lane
 * token goes with it. Returns its fd for the caller to close. */
static int notify_remove(kvb_engine_h eng, size_t i)
{
    int fd = eng->notify[i].fd;
    kvb__am_token_drop_locked(eng, fd);
    memmove(&eng->notify[i], &eng->notify[i + 1], (eng->n_notify - i - 1) * sizeof(*eng->notify));
    eng->n_notify--;
    return fd;
}

/* Evict one connection to make room (seg_mu held): shut down now (its
 * writer sees the peer gone and re-handshakes), closed by the listener,
 * which may be polling it. */
static bool notify_evict(kvb_engine_h eng, bool authed)
{
    long victim = notify_victim(eng, authed);
    if (victim < 0)
        return false;
    if (eng->n_dead == eng->cap_dead) {
        size_t cap = eng->cap_dead ? eng->cap_dead * 2 : 8;
        int *v = realloc(eng->dead_fds, cap * sizeof(*v));
        if (v == NULL)
            return false;
        eng->dead_fds = v;
        eng->cap_dead = cap;
    }
    int fd = notify_remove(eng, (size_t)victim);
    shutdown(fd, SHUT_RDWR);
    eng->dead_fds[eng->n_dead++] = fd;
    uint64_t k = ++eng->notify_evicted;
    if ((k & (k - 1)) == 0)
        KVB_LOGW("engine %s: %zu control connections (KVBRIDGE_MAX_CONTROL_CONNS): the oldest that "
                 "never wrote closed for a newcomer (%llu so far)",
                 eng->sid, eng->max_notify, (unsigned long long)k);
    return true;
}

/* A place under the cap for a newcomer that proved what authed says: a
 * free one, or one made by closing a connection it may displace; taken
 * (notify_pending) until the newcomer is listed or fails, so handshakes
 * served at once never take the cap past its size. None: count and log the
 * refusal (the first, then every power of two). seg_mu held. */
static bool notify_room(kvb_engine_h eng, bool authed)
{
    if (eng->n_notify + eng->notify_pending < eng->max_notify || notify_evict(eng, authed)) {
        eng->notify_pending++;
        return true;
    }
    uint64_t k = ++eng->notify_refused;
    if ((k & (k - 1)) == 0)
        KVB_LOGW("engine %s: new control connection refused: %zu held "
                 "(KVBRIDGE_MAX_CONTROL_CONNS) and none may be closed for it (each wrote, may be "
                 "writing, proved this host%s) (%llu refused so far)",
                 eng->sid, eng->max_notify, authed ? "" : " or proved the engine secret",
                 (unsigned long long)k);
    return false;
}

/* What a handshake proved, for the cap. */
typedef struct hs_proved {
    bool authed, local;
    bool placed; /* it holds a place under the cap (notify_pending) */
    uint64_t admitted_at;
} hs_proved_t;

static void add_notify_fd(kvb_engine_h eng, int fd, uint64_t gen_sent, const hs_proved_t *pr)
{
    pthread_mutex_lock(&eng->seg_mu);
    bool ok = true; /* its place was taken by notify_room before its reply */
    eng->notify_pending--;
    if (ok && eng->n_notify == eng->cap_notify) {
        size_t cap = eng->cap_notify ? eng->cap_notify * 2 : 8;
        kvb__notify_t *v = realloc(eng->notify, cap * sizeof(*v));
        ok = v != NULL;
        if (ok) {
            eng->notify = v;
            eng->cap_notify = cap;
        }
    }
    if (!ok) {
        kvb__am_token_drop_locked(eng, fd);
        pthread_mutex_unlock(&eng->seg_mu);
        close(fd);
        return;
    }
    kvb__notify_t *n = &eng->notify[eng->n_notify++];
    *n = (kvb__notify_t){
        .fd = fd, .authed = pr->authed, .local = pr->local, .admitted_at = pr->admitted_at};
    peer_host(fd, n->host);
    for (size_t i = 0; i < eng->n_am_toks; i++) /* it may have written already */
        if (eng->am_toks[i].fd == fd)
            n->used = eng->am_toks[i].used;
    if (eng->generation != gen_sent) {
        uint8_t msg[KVB_HS_NOTICE_LEN];
        kvb__hs_notice_encode(eng->generation, msg);
        send(fd, msg, sizeof(msg), MSG_DONTWAIT | MSG_NOSIGNAL);
    }
    pthread_mutex_unlock(&eng->seg_mu);
}

/* Peer-supplied bytes for a log line: printable ASCII only. */
static void printable(const uint8_t *in, uint32_t n, char *out, size_t outlen)
{
    size_t k = 0;
    for (uint32_t i = 0; i < n && k + 1 < outlen; i++)
        out[k++] = in[i] >= 0x20 && in[i] < 0x7f ? (char)in[i] : '?';
    out[k] = '\0';
}

/* The nonces of one authenticated handshake (engine secret set). */
typedef struct hs_auth {
    uint8_t nonce_l[KVB_HS_NONCE_LEN], nonce_w[KVB_HS_NONCE_LEN];
} hs_auth_t;

/* Engine secret set: challenge the writer, check its proof over both
 * nonces in constant time. Nothing about this engine is sent before the
 * proof is right; a wrong or malformed proof gets a denial. */
static kvb_status_t challenge(kvb_engine_h eng, int fd, uint64_t deadline, const uint8_t *sid,
                              uint32_t sid_len, hs_auth_t *a, char *why, size_t wl)
{
    uint8_t chal[KVB_HS_CHALLENGE_LEN], want[KVB_HS_MAC_LEN];
    uint8_t *msg = NULL;
    const uint8_t *mac, *nonce_w;
    size_t len;
    char who[128];
    printable(sid, sid_len, who, sizeof(who));
    if (getrandom(a->nonce_l, KVB_HS_NONCE_LEN, 0) != KVB_HS_NONCE_LEN) {
        snprintf(why, wl, "no random nonce: %s", strerror(errno));
        return KVB_ERR_IO;
    }
    kvb__hs_challenge_encode(a->nonce_l, chal);
    kvb_status_t st = kvb__sock_write_all(fd, chal, sizeof(chal), deadline);
    if (st == KVB_OK)
        st = kvb__sock_read_msg(fd, NULL, KVB_HS_PROOF_LEN, deadline, &msg, &len, why, wl);
    bool read_ok = st == KVB_OK;
    if (st == KVB_OK)
        st = kvb__hs_proof_decode(msg, len, &nonce_w, &mac, why, wl);
    if (st == KVB_OK) {
        memcpy(a->nonce_w, nonce_w, KVB_HS_NONCE_LEN);
        st = kvb__hs_auth_mac(eng->secret, a->nonce_l, a->nonce_w, sid, sid_len, want);
    }
    if (st == KVB_OK && !kvb__ct_equal(mac, want, sizeof(want))) {
        snprintf(why, wl, "writer \"%s\" did not prove the engine secret", who);
        st = KVB_ERR_AUTH;
    } else if (st != KVB_OK && why[0] != '\0') {
        char inner[200];
        snprintf(inner, sizeof(inner), "%s", why);
        snprintf(why, wl, "writer \"%.60s\" sent no valid proof of the engine secret: %.120s", who,
                 inner);
    }
    if (st != KVB_OK && read_ok) { /* it spoke: tell it why it is cut off */
        uint8_t deny[KVB_HS_DENY_LEN];
        kvb__hs_deny_encode(deny);
        kvb__sock_write_all(fd, deny, sizeof(deny), deadline);
    }
    free(msg);
    return st;
}

/* Segments a same-host writer writes directly: in shared files, or in
 * device memory (CUDA IPC): worth the same-host proof. */
static bool has_shared(kvb_engine_h eng)
{
    bool any = false;
    pthread_mutex_lock(&eng->seg_mu);
    any = eng->n_cuda_segs > 0;
    for (size_t i = 0; i < eng->segs.n && !any; i++)
        any = eng->segs.v[i].shared;
    pthread_mutex_unlock(&eng->seg_mu);
    return any;
}

/* A one-time memfd holding 32 random bytes; -1 if none can be made. */
static int local_file(uint8_t value[KVB_HS_LOCAL_VALUE_LEN])
{
    int mfd = memfd_create(KVB_HS_LOCAL_NAME, MFD_CLOEXEC);
    if (mfd < 0)
        return -1;
    if (getrandom(value, KVB_HS_LOCAL_VALUE_LEN, 0) != KVB_HS_LOCAL_VALUE_LEN ||
        pwrite(mfd, value, KVB_HS_LOCAL_VALUE_LEN, 0) != KVB_HS_LOCAL_VALUE_LEN) {
        close(mfd);
        return -1;
    }
    return mfd;
}

/* Shared files to offer (direct lane): the writer must prove it runs on
 * this host by reading a one-time file of ours through /proc (only local
 * processes allowed to open our descriptors can, the same right the direct
 * lane needs) and binding it to this TCP connection's addresses. *local_p
 * false: the reply names no shared file. */
static kvb_status_t local_check(kvb_engine_h eng, int fd, uint64_t deadline, bool *local_p,
                                char *why, size_t wl)
{
    uint8_t value[KVB_HS_LOCAL_VALUE_LEN], want[KVB_HS_MAC_LEN], tuple[KVB_HS_TUPLE_MAX];
    uint8_t chal[KVB_HS_LOCAL_MAX], *msg = NULL;
    const uint8_t *mac;
    size_t tl, len;
    *local_p = false;
    if (!has_shared(eng) || !kvb__hs_conn_tuple(fd, true, tuple, &tl))
        return KVB_OK;
    int mfd = local_file(value);
    if (mfd < 0) {
        KVB_LOGD("engine %s: no same-host proof file (%s): direct lane not offered", eng->sid,
                 strerror(errno));
        return KVB_OK;
    }
    size_t n = kvb__hs_local_encode((uint32_t)getpid(), (uint32_t)mfd, eng->host_id, chal);
    kvb_status_t st = kvb__sock_write_all(fd, chal, n, deadline);
    if (st == KVB_OK)
        st = kvb__sock_read_msg(fd, NULL, KVB_HS_LOCALOK_LEN, deadline, &msg, &len, why, wl);
    if (st == KVB_OK)
        st = kvb__hs_localok_decode(msg, len, &mac, why, wl);
    if (st == KVB_OK)
        st = kvb__hs_local_mac(value, tuple, tl, want);
    if (st == KVB_OK)
        *local_p = kvb__ct_equal(mac, want, sizeof(want));
    close(mfd);
    explicit_bzero(value, sizeof(value));
    free(msg);
    return st;
}

static kvb_status_t token_add(kvb_engine_h eng, int fd, const uint8_t tok[KVB_HS_TOKEN_LEN])
{
    kvb_status_t st = KVB_OK;
    pthread_mutex_lock(&eng->seg_mu);
    if (eng->n_am_toks == eng->cap_am_toks) {
        size_t cap = eng->cap_am_toks ? eng->cap_am_toks * 2 : 8;
        struct kvb__am_tok *v = realloc(eng->am_toks, cap * sizeof(*v));
        if (v == NULL)
            st = KVB_ERR_NOMEM;
        else {
            eng->am_toks = v;
            eng->cap_am_toks = cap;
        }
    }
    if (st == KVB_OK) {
        eng->am_toks[eng->n_am_toks].fd = fd;
        eng->am_toks[eng->n_am_toks].used = false;
        memcpy(eng->am_toks[eng->n_am_toks++].tok, tok, KVB_HS_TOKEN_LEN);
    }
    pthread_mutex_unlock(&eng->seg_mu);
    return st;
}

void kvb__am_token_drop_locked(kvb_engine_h eng, int fd)
{
    for (size_t i = 0; i < eng->n_am_toks; i++)
        if (eng->am_toks[i].fd == fd) {
            explicit_bzero(eng->am_toks[i].tok, KVB_HS_TOKEN_LEN);
            eng->am_toks[i] = eng->am_toks[--eng->n_am_toks];
            return;
        }
}

/* Secret set: this connection's token goes live before the writer can
 * use it (it writes as soon as it has the reply); the reply is sealed with
 * our proof over both nonces. *rep_p is replaced by the sealed message. */
static kvb_status_t seal_reply(kvb_engine_h eng, int fd, const hs_auth_t *a, const uint8_t *sid,
                               uint32_t sid_len, uint8_t **rep_p, size_t *rep_len_p)
{
    uint8_t tok[KVB_HS_TOKEN_LEN], mac[KVB_HS_MAC_LEN], *sealed = NULL;
    size_t len;
    kvb_status_t st = kvb__hs_am_token(eng->secret, a->nonce_w, a->nonce_l, eng->epoch, tok);
    if (st == KVB_OK)
        st = kvb__hs_reply_mac(eng->secret, a->nonce_l, a->nonce_w, sid, sid_len, *rep_p,
                               *rep_len_p, mac);
    if (st == KVB_OK)
        st = kvb__hs_sealed_encode(mac, *rep_p, *rep_len_p, &sealed, &len);
    if (st == KVB_OK)
        st = token_add(eng, fd, tok);
    explicit_bzero(tok, sizeof(tok));
    if (st != KVB_OK) {
        free(sealed);
        return st;
    }
    free(*rep_p);
    *rep_p = sealed;
    *rep_len_p = len;
    return KVB_OK;
}

/* Answer one writer's handshake on fd; *gen_p: the generation its reply
 * described. Not KVB_OK: refused (logged), the caller closes fd (and drops
 * a token registered for it). */
static kvb_status_t serve_handshake(kvb_engine_h eng, int fd, uint64_t *gen_p, hs_proved_t *pr)
{
    uint64_t deadline = kvb__now_ns() + 2000000000ull;
    uint8_t *req = NULL, *rep = NULL;
    size_t req_len, rep_len;
    const uint8_t *sid;
    uint32_t sid_len, caps = 0;
    hs_auth_t a;
    bool local = false;
    char why[256] = "";
    kvb_status_t st =
        kvb__sock_read_msg(fd, "KVBHQ001", 4096, deadline, &req, &req_len, why, sizeof(why));
    if (st == KVB_OK)
        st = kvb__hs_request_decode(req, req_len, &sid, &sid_len, &caps, why, sizeof(why));
    if (st == KVB_OK && eng->secret != NULL)
        st = challenge(eng, fd, deadline, sid, sid_len, &a, why, sizeof(why));
    if (st == KVB_OK)
        st = local_check(eng, fd, deadline, &local, why, sizeof(why));
    if (st == KVB_OK) {
        /* The cap: refused before any reply (the writer writes as soon as
         * it has one), logged by notify_room. */
        pthread_mutex_lock(&eng->seg_mu);
        *pr = (hs_proved_t){eng->secret != NULL, local, false,
                            __atomic_load_n(&eng->am_admitted, __ATOMIC_SEQ_CST)};
        bool room = pr->placed = notify_room(eng, pr->authed);
        pthread_mutex_unlock(&eng->seg_mu);
        if (!room) {
            free(req);
            explicit_bzero(&a, sizeof(a));
            return KVB_ERR_PEER;
        }
        st = build_reply(eng, local, caps, &rep, &rep_len, gen_p);
    }
    if (st == KVB_OK && eng->secret != NULL)
        st = seal_reply(eng, fd, &a, sid, sid_len, &rep, &rep_len);
    if (st == KVB_OK)
        st = kvb__sock_write_all(fd, rep, rep_len, deadline);
    free(req);
    free(rep);
    explicit_bzero(&a, sizeof(a));
    if (st != KVB_OK)
        KVB_LOGW("engine %s: handshake refused: %s", eng->sid,
                 why[0] ? why : kvb_status_string(st));
    return st;
}

typedef struct hs_job {
    kvb_engine_h eng;
    int fd;
} hs_job_t;

static void *hs_main(void *arg)
{
    hs_job_t *j = arg;
    kvb_engine_h eng = j->eng;
    int fd = j->fd;
    uint64_t gen = 0;
    hs_proved_t pr = {0};
    free(j);
    kvb_status_t st = serve_handshake(eng, fd, &gen, &pr);
    /* The fd leaves its slot before it is closed or handed on (hs_drain must
     * not shut down its number once reused); the count drops last (the
     * engine outlives this thread's last use of it). */
    pthread_mutex_lock(&eng->hs_mu);
    for (int i = 0; i < KVB_HS_MAX_ACTIVE; i++)
        if (eng->hs_fds[i] == fd) {
            eng->hs_fds[i] = -1;
            break;
        }
    pthread_mutex_unlock(&eng->hs_mu);
    if (st == KVB_OK) {
        add_notify_fd(eng, fd, gen, &pr);
    } else {
        pthread_mutex_lock(&eng->seg_mu);
        eng->notify_pending -= pr.placed;
        kvb__am_token_drop_locked(eng, fd);
        pthread_mutex_unlock(&eng->seg_mu);
        close(fd);
    }
    pthread_mutex_lock(&eng->hs_mu);
    eng->hs_active--;
    pthread_cond_broadcast(&eng->hs_cv);
    pthread_mutex_unlock(&eng->hs_mu);
    return NULL;
}

/* Serve the handshake on a thread of its own. The listener stops accepting
 * while KVB_HS_MAX_ACTIVE are in progress (a flood of silent or garbage
 * connections), so newcomers wait in the backlog; a connection is closed at
 * once only when no slot or thread can be had after all. */
static void accept_one(kvb_engine_h eng)
{
    int one = 1;
    pthread_t th;
    pthread_attr_t at;
    int fd = accept4(eng->listen_fd, NULL, NULL, SOCK_CLOEXEC);
    hs_job_t *j = fd >= 0 ? malloc(sizeof(*j)) : NULL;
    if (j == NULL) {
        if (fd >= 0)
            close(fd);
        return;
    }
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
    *j = (hs_job_t){eng, fd};
    pthread_attr_init(&at);
    pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
    pthread_mutex_lock(&eng->hs_mu);
    int slot = 0;
    while (slot < KVB_HS_MAX_ACTIVE && eng->hs_fds[slot] >= 0)
        slot++;
    bool ok = slot < KVB_HS_MAX_ACTIVE && pthread_create(&th, &at, hs_main, j) == 0;
    uint64_t refused = ok ? 0 : ++eng->hs_refused;
    if (ok) {
        eng->hs_fds[slot] = fd;
        eng->hs_active++;
    }
    pthread_mutex_unlock(&eng->hs_mu);
    pthread_attr_destroy(&at);
    if (!ok) {
        if ((refused & (refused - 1)) == 0) /* 1st, 2nd, 4th, ...: no log flood */
            KVB_LOGW("engine %s: %d handshakes in progress: connection refused (%llu so far)",
                     eng->sid, KVB_HS_MAX_ACTIVE, (unsigned long long)refused);
        close(fd);
        free(j);
    }
}

/* Stop: cut the handshakes still in progress and wait for their threads. */
static void hs_drain(kvb_engine_h eng)
{
    pthread_mutex_lock(&eng->hs_mu);
    for (int i = 0; i < KVB_HS_MAX_ACTIVE; i++)
        if (eng->hs_fds[i] >= 0)
            shutdown(eng->hs_fds[i], SHUT_RDWR);
    while (eng->hs_active > 0)
        pthread_cond_wait(&eng->hs_cv, &eng->hs_mu);
    pthread_mutex_unlock(&eng->hs_mu);
}

/* Drop control connections whose writer went away (EOF or error), or that
 * sent bytes: writers send nothing after the request, and unread bytes
 * would keep POLLIN set and spin this thread. */
static void reap_notify(kvb_engine_h eng, const struct pollfd *p, size_t n)
{
    pthread_mutex_lock(&eng->seg_mu);
    for (size_t k = 0; k < n; k++) {
        char b[64];
        if (!(p[k].revents & (POLLIN | POLLHUP | POLLERR)))
            continue;
        bool bytes = recv(p[k].fd, b, sizeof(b), MSG_DONTWAIT) > 0;
        for (size_t i = 0; i < eng->n_notify; i++)
            if (eng->notify[i].fd == p[k].fd) {
                close(notify_remove(eng, i));
                eng->notify_misbehaved += bytes;
                break;
            }
    }
    pthread_mutex_unlock(&eng->seg_mu);
}

/* The listener's poll set: listen socket, stop pipe, then every control
 * connection (seg_mu held). Reuses *p_p; closes evicted fds first (no
 * poll of this thread holds them any more). */
static size_t poll_set(kvb_engine_h eng, struct pollfd **p_p, size_t *cap_p)
{
    for (size_t i = 0; i < eng->n_dead; i++)
        close(eng->dead_fds[i]);
    eng->n_dead = 0;
    size_t n = eng->n_notify;
    if (n + 2 > *cap_p) {
        struct pollfd *v = realloc(*p_p, (n + 2) * 2 * sizeof(*v));
        if (v == NULL)
            return SIZE_MAX;
        *p_p = v;
        *cap_p = (n + 2) * 2;
    }
    for (size_t i = 0; i < n; i++)
        (*p_p)[i + 2] = (struct pollfd){eng->notify[i].fd, POLLIN, 0};
    return n;
}

static void *listen_main(void *arg)
{
    kvb_engine_h eng = arg;
    struct pollfd *p = NULL;
    size_t cap = 0;
    while (!__atomic_load_n(&eng->stop, __ATOMIC_ACQUIRE)) {
        pthread_mutex_lock(&eng->seg_mu);
        size_t n = poll_set(eng, &p, &cap);
        pthread_mutex_unlock(&eng->seg_mu);
        if (n == SIZE_MAX) {
            usleep(10000);
            continue;
        }
        /* All handshake slots busy: leave newcomers in the listen backlog
         * (they wait, as behind a serial listener) and look again soon. */
        pthread_mutex_lock(&eng->hs_mu);
        bool full = eng->hs_active >= KVB_HS_MAX_ACTIVE;
        pthread_mutex_unlock(&eng->hs_mu);
        p[0] = (struct pollfd){full ? -1 : eng->listen_fd, POLLIN, 0};
        p[1] = (struct pollfd){eng->stop_pipe[0], POLLIN, 0};
        if (poll(p, n + 2, full ? 10 : 1000) > 0) {
            if (p[0].revents & POLLIN)
                accept_one(eng);
            reap_notify(eng, p + 2, n);
        }
    }
    free(p);
    return NULL;
}

/* ---- progress thread ---- */

static void conn_unlink(kvb_engine_h eng, kvb__conn_t *c)
{
    kvb__conn_t **pp = &eng->conns;
    while (*pp != NULL && *pp != c)
        pp = &(*pp)->next_all;
    if (*pp == c)
        *pp = c->next_all;
}

static void conn_retire(kvb_engine_h eng, kvb__conn_t *c)
{
    conn_unlink(eng, c);
    kvb__conn_release_ucx(eng, c);
    kvb__session_put(eng, c->sess);
    free(c);
}

/* Shutdown: close every endpoint and drop its keys, but keep the structs:
 * requests UCX still holds are purged (their callbacks run, touching
 * transfers and conns) only when the worker is destroyed, after which
 * conns_free_all frees them. */
static void conns_release_all(kvb_engine_h eng)
{
    for (kvb__conn_t *c = eng->conns; c != NULL; c = c->next_all)
        kvb__conn_release_ucx(eng, c);
}

/* Free every conn nobody references; one a transfer handle the caller has
 * not freed yet still holds is orphaned: its last kvb__conn_put frees it. */
static void conns_free_all(kvb_engine_h eng)
{
    while (eng->conns != NULL) {
        kvb__conn_t *c = eng->conns;
        eng->conns = c->next_all;
        c->eng_backref = NULL;
        if (__atomic_load_n(&c->refs, __ATOMIC_ACQUIRE) == 0)
            free(c);
    }
}

/* Fail every conn of the session, not only its current one: a transfer
 * keeps the conn it was issued on, which may be an older one (the session
 * re-handshaked after a notice or a bounds retry), and a stopped peer never
 * ends it otherwise. Retired conns are unlinked only by CMD_RETIRE, which
 * this loop does not run. */
static void session_kill(kvb_engine_h eng, kvb__cmd_t *cmd)
{
    const char *why = cmd->why[0] ? cmd->why : "session closed by the caller (peer unresponsive)";
    for (kvb__conn_t *c = eng->conns; c != NULL; c = c->next_all)
        if (c == cmd->conn || (cmd->sess != NULL && c->sess == cmd->sess)) {
            /* Endpoint first: UCX drops the conn's requests, so no source
             * byte is read once its transfers are reported failed. */
            kvb__conn_close_ep(eng, c);
            kvb__conn_fail(eng, c, why);
        }
    kvb__conn_put(cmd->conn);
    kvb__session_put(eng, cmd->sess); /* kvb_engine_close_session's reference */
}

static void run_commands(kvb_engine_h eng)
{
    kvb__cmd_t *c;
    pthread_mutex_lock(&eng->cmd_mu);
    c = eng->cmd_head;
    eng->cmd_head = eng->cmd_tail = NULL;
    pthread_mutex_unlock(&eng->cmd_mu);
    while (c != NULL) {
        kvb__cmd_t *next = c->next;
        bool waited = c->kind == CMD_CONNECT;
        if (c->kind == CMD_XFER)
            kvb__xfer_start(eng, c->xfer);
        else if (c->kind == CMD_CONNECT)
            kvb__conn_establish(eng, c);
        else if (c->kind == CMD_RETIRE)
            conn_retire(eng, c->conn);
        else if (c->kind == CMD_KILL)
            session_kill(eng, c);
        if (c->kind != CMD_CONNECT)
            free(c);
        if (waited) {
            pthread_mutex_lock(&eng->cmd_mu);
            c->done = 1;
            pthread_cond_broadcast(&eng->cmd_cv);
            pthread_mutex_unlock(&eng->cmd_mu);
        }
        c = next;
    }
}

static void handle_events(kvb_engine_h eng, int timeout_ms)
{
    struct epoll_event ev[32];
    int n = epoll_wait(eng->epfd, ev, 32, timeout_ms);
    for (int i = 0; i < n; i++) {
        uint64_t tag = ev[i].data.u64, v;
        if (tag == EP_TAG_EVFD) {
            if (read(eng->evfd, &v, sizeof(v)) < 0)
                KVB_LOGD("eventfd read: %s", strerror(errno));
        } else if (tag != EP_TAG_UCX) {
            kvb__conn_on_fd(eng, (kvb__conn_t *)(uintptr_t)tag);
        }
    }
}

/* Endpoints of peers found dead are closed outside UCX's callbacks: the
 * forced close completes their outstanding requests (and frees what those
 * hold) instead of leaving them pending until the worker is destroyed. */
static void close_dead_eps(kvb_engine_h eng)
{
    for (kvb__conn_t *c = eng->conns; c != NULL; c = c->next_all)
        if (c->ep != NULL && __atomic_load_n(&c->dead, __ATOMIC_ACQUIRE))
            kvb__conn_close_ep(eng, c);
}

/* Spinning while waiting on a peer pays only where UCX's same-host
 * shared-memory transports carry the data: they signal no event, and the
 * writer must keep progressing (the put is emulated over messages). Over
 * TCP (the tcp lane, or a peer on another host) the worker's event fd
 * wakes the thread when a socket is ready, so it sleeps instead of taking
 * a core from the processes it serves. */
static bool spin_pays(kvb_engine_h eng)
{
    if (eng->params.transport == KVB_TRANSPORT_TCP)
        return false;
    if (eng->am_pending > 0)
        return true; /* incoming writes: the lane is not known here */
    for (const struct kvb_xfer *x = eng->active; x != NULL; x = x->next_active)
        if (x->conn->local)
            return true;
    return false;
}

static void *progress_main(void *arg)
{
    kvb_engine_h eng = arg;
    unsigned idle_spins = 0, iter = 0;
    while (!__atomic_load_n(&eng->stop, __ATOMIC_ACQUIRE)) {
        bool busy;
        run_commands(eng);
        busy = kvb__jobs_progress(eng);
        busy |= kvb__xfer_progress_all(eng);
        while (ucp_worker_progress(eng->worker) != 0)
            busy = true;
        if ((++iter & 63) == 0)
            handle_events(eng, 0);
        if (eng->dead_conns > 0) {
            eng->dead_conns = 0;
            close_dead_eps(eng);
        }
        if (busy) {
            idle_spins = 0;
            continue;
        }
        if (eng->active != NULL || eng->am_pending > 0) {
            /* Waiting on the peer: spin a little, then yield the core. (A
             * 1 ms sleep on the event fd measured 2x slower still when both
             * processes share one core: UCX's same-host put is emulated over
             * shared-memory messages, so the writer must keep progressing.) */
            if (++idle_spins > 64 && !spin_pays(eng)) {
                if (ucp_worker_arm(eng->worker) == UCS_OK)
                    handle_events(eng, 1);
                continue;
            }
            if (idle_spins > 64)
                sched_yield();
            /* A peer silent for long (stopped, overloaded): stop burning a
             * core, sleep on the event fd 1 ms at a time. */
            if (idle_spins > 20000 && ucp_worker_arm(eng->worker) == UCS_OK)
                handle_events(eng, 1);
            continue;
        }
        if (ucp_worker_arm(eng->worker) == UCS_OK)
            handle_events(eng, 100);
    }
    run_commands(eng);         /* transfers queued before the stop start... */
    kvb__xfer_cancel_all(eng); /* ...and end CANCELED with the others */
    conns_release_all(eng);
    return NULL;
}

static kvb_status_t fds_init(kvb_engine_h eng)
{
    struct epoll_event ev = {.events = EPOLLIN};
    eng->evfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    eng->epfd = epoll_create1(EPOLL_CLOEXEC);
    if (eng->evfd < 0 || eng->epfd < 0 || pipe2(eng->stop_pipe, O_CLOEXEC) != 0)
        return kvb__err_set(&eng->err, KVB_ERR_IO, "engine descriptors: %s", strerror(errno));
    ev.data.u64 = EP_TAG_EVFD;
    epoll_ctl(eng->epfd, EPOLL_CTL_ADD, eng->evfd, &ev);
    ev.data.u64 = EP_TAG_UCX;
    epoll_ctl(eng->epfd, EPOLL_CTL_ADD, eng->ucx_efd, &ev);
    return KVB_OK;
}

/* After ucp_worker_destroy: no callback can run any more. */
static void ops_release_all(kvb_engine_h eng)
{
    while (eng->ops.next != &eng->ops) {
        kvb__op_t *op = eng->ops.next;
        kvb__op_untrack(eng, op);
        op->release(op);
    }
}

static void engine_free(kvb_engine_h eng)
{
    kvb__lanes_fini(eng); /* what the lanes keep (their threads are gone: kvb__lanes_stop) */
    kvb__sessions_free(eng);
    for (size_t i = 0; i < eng->segs.n; i++)
        unmap_seg(eng, &eng->segs.v[i]);
    kvb__segtab_free(&eng->segs);
    for (size_t i = 0; i < eng->n_notify; i++)
        close(eng->notify[i].fd);
    free(eng->notify);
    for (size_t i = 0; i < eng->n_dead; i++)
        close(eng->dead_fds[i]);
    free(eng->dead_fds);
    if (eng->am_toks != NULL)
        explicit_bzero(eng->am_toks, eng->cap_am_toks * sizeof(*eng->am_toks));
    free(eng->am_toks);
    kvb__fence_free(eng);
    if (eng->waddr != NULL)
        ucp_worker_release_address(eng->worker, eng->waddr);
    if (eng->worker)
        ucp_worker_destroy(eng->worker);
    ops_release_all(eng);
    conns_free_all(eng);
    if (eng->ctx)
        ucp_cleanup(eng->ctx);
    int fds[] = {eng->listen_fd, eng->evfd, eng->epfd, eng->stop_pipe[0], eng->stop_pipe[1]};
    for (size_t i = 0; i < sizeof(fds) / sizeof(fds[0]); i++)
        if (fds[i] >= 0)
            close(fds[i]);
    kvb__jobs_free(&eng->jobs);
    pthread_mutex_destroy(&eng->seg_mu);
    pthread_cond_destroy(&eng->seg_cv);
    pthread_mutex_destroy(&eng->sess_mu);
    pthread_mutex_destroy(&eng->cmd_mu);
    pthread_cond_destroy(&eng->cmd_cv);
    pthread_mutex_destroy(&eng->hs_mu);
    pthread_cond_destroy(&eng->hs_cv);
    kvb__err_destroy(&eng->err);
    if (eng->secret != NULL) {
        explicit_bzero(eng->secret, strlen(eng->secret));
        free(eng->secret);
    }
    free(eng);
}

/* The secret in force (param wins over the environment); NULL when off. */
static const char *params_secret(const kvb_engine_params_t *in)
{
    const char *sec = kvb__env_get("KVBRIDGE_ENGINE_SECRET", NULL);
    if (in != NULL && (in->field_mask & KVB_ENGINE_PARAM_SECRET))
        sec = in->secret;
    return sec != NULL && sec[0] != '\0' ? sec : NULL;
}

static kvb_engine_h engine_alloc(const kvb_engine_params_t *params)
{
    kvb_engine_h eng = calloc(1, sizeof(*eng));
    if (eng == NULL)
        return NULL;
    params_defaults(&eng->params, params);
    eng->cuda_device = -1;
    kvb__jobs_init(&eng->jobs);
    /* Every writer that completes a handshake keeps a socket here: cap them
     * (docs/security.md) well below the usual descriptor limit. */
    eng->max_notify = (size_t)kvb__env_int("KVBRIDGE_MAX_CONTROL_CONNS", NULL, 1024, 1, 1000000);
    eng->max_sessions = (size_t)kvb__env_int("KVBRIDGE_MAX_SESSIONS", NULL, 4096, 1, 10000000);
    kvb__err_init(&eng->err);
    pthread_mutex_init(&eng->seg_mu, NULL);
    kvb__cond_init_mono(&eng->seg_cv);
    pthread_mutex_init(&eng->sess_mu, NULL);
    pthread_mutex_init(&eng->cmd_mu, NULL);
    pthread_cond_init(&eng->cmd_cv, NULL);
    pthread_mutex_init(&eng->hs_mu, NULL);
    pthread_cond_init(&eng->hs_cv, NULL);
    for (int i = 0; i < KVB_HS_MAX_ACTIVE; i++)
        eng->hs_fds[i] = -1;
    eng->listen_fd = eng->evfd = eng->epfd = eng->stop_pipe[0] = eng->stop_pipe[1] = -1;
    eng->ops.next = eng->ops.prev = &eng->ops;
    if (getrandom(&eng->epoch, sizeof(eng->epoch), 0) != sizeof(eng->epoch))
        eng->epoch = kvb__now_ns() ^ (uint64_t)getpid() << 32;
    read_host_id(eng);
    kvb__fence_init(eng);
    /* The caller's string need not outlive create: keep our own copy. */
    eng->params.secret = NULL;
    if (params_secret(params) != NULL) {
        eng->secret = strdup(params_secret(params));
        if (eng->secret == NULL) {
            engine_free(eng);
            return NULL;
        }
        eng->params.secret = eng->secret;
    }
    return eng;
}

kvb_status_t kvb_engine_create(const kvb_engine_params_t *params, kvb_engine_h *engine_p)
{
    kvb_status_t st;
    if (engine_p == NULL)
        return KVB_ERR_INVALID;
    kvb_engine_h eng = engine_alloc(params);
    if (eng == NULL)
        return KVB_ERR_NOMEM;
    st = ucx_init(eng);
    if (st == KVB_OK)
        st = listen_init(eng);
    if (st == KVB_OK)
        st = fds_init(eng);
    if (st == KVB_OK && pthread_create(&eng->progress_thr, NULL, progress_main, eng) != 0)
        st = kvb__err_set(&eng->err, KVB_ERR_IO, "cannot start the progress thread");
    if (st == KVB_OK && pthread_create(&eng->listen_thr, NULL, listen_main, eng) != 0) {
        __atomic_store_n(&eng->stop, 1, __ATOMIC_RELEASE);
        pthread_join(eng->progress_thr, NULL);
        st = kvb__err_set(&eng->err, KVB_ERR_IO, "cannot start the listener thread");
    }
    if (st != KVB_OK) {
        KVB_LOGE("engine create failed: %s", kvb__err_get(&eng->err));
        engine_free(eng);
        return st;
    }
    KVB_LOGI("engine %s up (transport %d)", eng->sid, (int)eng->params.transport);
    *engine_p = eng;
    return KVB_OK;
}

void kvb_engine_destroy(kvb_engine_h eng)
{
    uint64_t one = 1;
    if (eng == NULL)
        return;
    kvb__lanes_stop(eng); /* before the progress thread: transfers release conns */
    kvb__jobs_stop(eng);  /* likewise; copies arriving later run inline */
    pthread_mutex_lock(&eng->cmd_mu);
    __atomic_store_n(&eng->stop, 1, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&eng->cmd_mu);
    if (write(eng->evfd, &one, sizeof(one)) < 0 || write(eng->stop_pipe[1], "x", 1) < 0)
        KVB_LOGD("engine stop signal: %s", strerror(errno));
    pthread_join(eng->progress_thr, NULL);
    pthread_join(eng->listen_thr, NULL);
    hs_drain(eng);
    engine_free(eng);
}

const char *kvb_engine_session_id(kvb_engine_h eng)
{
    return eng != NULL ? eng->sid : "";
}

kvb_transport_t kvb_engine_transport(kvb_engine_h eng)
{
    return eng->params.transport;
}

const char *kvb_engine_last_error(kvb_engine_h eng)
{
    return eng != NULL ? kvb__err_get(&eng->err) : "";
}

void kvb_engine_limits(kvb_engine_h eng, kvb_engine_limits_t *l)
{
    uint64_t f = l->field_mask;
    if (f & KVB_ENGINE_LIMITS_CONTROL) {
        pthread_mutex_lock(&eng->seg_mu);
        l->control_conns = eng->n_notify;
        l->control_conns_evicted = eng->notify_evicted;
        l->control_conns_misbehaved = eng->notify_misbehaved;
        l->handshakes_refused = eng->notify_refused;
        pthread_mutex_unlock(&eng->seg_mu);
        pthread_mutex_lock(&eng->hs_mu);
        l->handshakes_refused += eng->hs_refused;
        pthread_mutex_unlock(&eng->hs_mu);
    }
    if (f & KVB_ENGINE_LIMITS_SESSIONS) {
        pthread_mutex_lock(&eng->sess_mu);
        l->sessions = eng->n_sessions;
        l->sessions_evicted = eng->sessions_evicted;
        l->sessions_refused = eng->sessions_refused;
        pthread_mutex_unlock(&eng->sess_mu);
    }
    kvb__lanes_stats(eng, l);
}
