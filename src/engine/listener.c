/* The handshake listener: one thread accepts writers' connections and
 * serves each handshake on a short-lived thread of its own (engine secret
 * challenge, same-host proof, the reply: segments, remote keys, and what
 * each lane offers, lane.h `advertise`); the control connections it keeps
 * (liveness, "segments changed" notices), capped by what each proved. */
#include "engine/engine_int.h"

#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

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
        st = kvb__am_token_add(eng, fd, tok);
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
void kvb__hs_drain(kvb_engine_h eng)
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

void *kvb__listen_main(void *arg)
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
