/* Sessions: a peer's "host:port", its handshake, and the connection
 * incarnations (kvb__conn_t) behind it. The handshake's TCP socket stays open
 * as the liveness and "segment table changed" channel. */
#include "engine/engine_int.h"

#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/epoll.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

static void session_destroy(kvb__session_t *s)
{
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    free(s->sid);
    free(s);
}

void kvb__session_put(kvb_engine_h eng, kvb__session_t *s)
{
    if (s == NULL)
        return;
    pthread_mutex_lock(&eng->sess_mu);
    bool last = --s->refs == 0 && s->evicted;
    if (last) {
        kvb__session_t **pp = &eng->sess_evicted;
        while (*pp != NULL && *pp != s)
            pp = &(*pp)->next;
        if (*pp == s)
            *pp = s->next;
    }
    pthread_mutex_unlock(&eng->sess_mu);
    if (last)
        session_destroy(s);
}

/* Idle: nobody inside a call on it, not connecting, and its connection (if
 * any) used by no transfer. sess_mu held (then s->mu: the lock order). */
static bool session_idle(kvb__session_t *s)
{
    pthread_mutex_lock(&s->mu);
    bool idle = s->state != SESS_CONNECTING && s->refs == 1 + (s->conn != NULL) &&
                (s->conn == NULL || __atomic_load_n(&s->conn->refs, __ATOMIC_ACQUIRE) == 1);
    pthread_mutex_unlock(&s->mu);
    return idle;
}

/* At the cap (sess_mu held): take the least recently used idle session out
 * of the table; *conn_p: its connection, for the caller to release after
 * sess_mu. false: every session is busy. */
static bool session_evict(kvb_engine_h eng, kvb__conn_t **conn_p)
{
    kvb__session_t **victim = NULL;
    for (kvb__session_t **pp = &eng->sessions; *pp != NULL; pp = &(*pp)->next)
        if ((victim == NULL || (*pp)->used_ns < (*victim)->used_ns) && session_idle(*pp))
            victim = pp;
    if (victim == NULL)
        return false;
    kvb__session_t *s = *victim;
    *victim = s->next;
    eng->n_sessions--;
    eng->sessions_evicted++;
    pthread_mutex_lock(&s->mu);
    *conn_p = s->conn;
    s->conn = NULL;
    s->state = SESS_IDLE;
    pthread_mutex_unlock(&s->mu);
    s->evicted = 1;
    if (--s->refs == 0) {
        session_destroy(s);
    } else {
        s->next = eng->sess_evicted;
        eng->sess_evicted = s;
    }
    return true;
}

static kvb__session_t *session_new(kvb_engine_h eng, const char *sid, kvb_status_t *st)
{
    kvb__session_t *s = calloc(1, sizeof(*s));
    if (s == NULL || (s->sid = strdup(sid)) == NULL) {
        free(s);
        *st = KVB_ERR_NOMEM;
        return NULL;
    }
    if (kvb__sid_parse(sid, s->host, sizeof(s->host), &s->port) != KVB_OK) {
        free(s->sid);
        free(s);
        *st = kvb__err_set(&eng->err, KVB_ERR_INVALID,
                           "session id \"%s\" is not host:port or [v6]:port", sid);
        return NULL;
    }
    pthread_mutex_init(&s->mu, NULL);
    kvb__cond_init_mono(&s->cv);
    s->refs = 1; /* the table's */
    return s;
}

/* The session of sid, created if absent (within KVBRIDGE_MAX_SESSIONS: an
 * idle one is evicted to make room), with a reference for the caller. */
static kvb__session_t *session_find(kvb_engine_h eng, const char *sid, kvb_status_t *st)
{
    kvb__session_t *s;
    kvb__conn_t *evicted = NULL;
    pthread_mutex_lock(&eng->sess_mu);
    for (s = eng->sessions; s != NULL; s = s->next)
        if (strcmp(s->sid, sid) == 0)
            break;
    if (s == NULL && eng->n_sessions >= eng->max_sessions && !session_evict(eng, &evicted)) {
        eng->sessions_refused++;
        pthread_mutex_unlock(&eng->sess_mu);
        *st = kvb__err_set(&eng->err, KVB_ERR_PEER,
                           "session %s refused: %zu sessions, all in use (KVBRIDGE_MAX_SESSIONS)",
                           sid, eng->max_sessions);
        return NULL;
    }
    if (s == NULL && (s = session_new(eng, sid, st)) != NULL) {
        s->next = eng->sessions;
        eng->sessions = s;
        eng->n_sessions++;
    }
    if (s != NULL) {
        s->refs++;
        s->used_ns = kvb__now_ns();
    }
    pthread_mutex_unlock(&eng->sess_mu);
    kvb__conn_put(evicted); /* retired by the progress thread */
    return s;
}

static void set_keepalive(int fd, double peer_timeout_s)
{
    int one = 1, idle = peer_timeout_s >= 2 ? (int)(peer_timeout_s / 2) : 1, cnt = 2;
    unsigned ut = (unsigned)(peer_timeout_s * 1000);
    setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle));
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &idle, sizeof(idle));
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof(cnt));
    setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &ut, sizeof(ut));
}

/* A writer's side of one handshake: the last message read, the reply in it,
 * and, with an engine secret, both nonces (they key the connection's token). */
typedef struct hs_out {
    uint8_t *msg;
    size_t len;
    const uint8_t *rep; /* the reply message inside msg */
    size_t rep_len;
    bool authed;
    uint8_t nonce_l[KVB_HS_NONCE_LEN], nonce_w[KVB_HS_NONCE_LEN];
} hs_out_t;

static kvb_status_t next_msg(int fd, uint64_t deadline, hs_out_t *o, char *why, size_t wl)
{
    free(o->msg);
    o->msg = NULL;
    return kvb__sock_read_msg(fd, NULL, KVB_HS_MAX_MSG + KVB_HS_SEAL_HDR, deadline, &o->msg,
                              &o->len, why, wl);
}

/* Engine secret set: the listener's first answer must be a challenge (no
 * downgrade); prove the secret over its nonce and ours, read what follows. */
static kvb_status_t prove(kvb_engine_h eng, int fd, uint64_t deadline, hs_out_t *o, char *why,
                          size_t wl)
{
    const uint8_t *nonce;
    uint8_t mac[KVB_HS_MAC_LEN], proof[KVB_HS_PROOF_LEN];
    if (kvb__hs_kind(o->msg, o->len) != KVB_HS_MSG_CHALLENGE) {
        snprintf(why, wl,
                 "authentication failed: the listener answered without the engine-secret "
                 "challenge (it has no secret, or is not the real listener); a writer with a "
                 "secret refuses it");
        return KVB_ERR_AUTH;
    }
    kvb_status_t st = kvb__hs_challenge_decode(o->msg, o->len, &nonce, why, wl);
    if (st != KVB_OK)
        return st;
    memcpy(o->nonce_l, nonce, KVB_HS_NONCE_LEN);
    if (getrandom(o->nonce_w, KVB_HS_NONCE_LEN, 0) != KVB_HS_NONCE_LEN) {
        snprintf(why, wl, "no random nonce: %s", strerror(errno));
        return KVB_ERR_IO;
    }
    st = kvb__hs_auth_mac(eng->secret, o->nonce_l, o->nonce_w, (const uint8_t *)eng->sid,
                          (uint32_t)strlen(eng->sid), mac);
    if (st != KVB_OK)
        return st;
    kvb__hs_proof_encode(o->nonce_w, mac, proof);
    st = kvb__sock_write_all(fd, proof, sizeof(proof), deadline);
    if (st == KVB_OK)
        st = next_msg(fd, deadline, o, why, wl);
    if (st == KVB_OK && kvb__hs_kind(o->msg, o->len) == KVB_HS_MSG_DENY) {
        st = kvb__hs_deny_decode(o->msg, o->len, why, wl);
        if (st == KVB_OK) {
            snprintf(why, wl, "authentication failed: the peer refused our engine secret");
            st = KVB_ERR_AUTH;
        }
    }
    o->authed = st == KVB_OK;
    return st;
}

static bool is_local_file(const char *link_path)
{
    static const char want[] = "/memfd:" KVB_HS_LOCAL_NAME " ";
    char link[128];
    ssize_t n = readlink(link_path, link, sizeof(link) - 1);
    if (n <= 0)
        return false;
    link[n] = '\0';
    return strncmp(link, want, strlen(want)) == 0;
}

/* The 32 bytes of the listener's one-time file, only if pid/fd names such a
 * file here: a listener elsewhere cannot make us open or read anything else
 * (checked before the open, and again on what was opened). */
static bool read_local_value(uint32_t pid, uint32_t fdn, uint8_t value[KVB_HS_LOCAL_VALUE_LEN])
{
    char path[64], self[64];
    struct stat sb;
    snprintf(path, sizeof(path), "/proc/%u/fd/%u", pid, fdn);
    if (!is_local_file(path))
        return false;
    int f = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (f < 0)
        return false;
    snprintf(self, sizeof(self), "/proc/self/fd/%d", f);
    bool ok = is_local_file(self) && fstat(f, &sb) == 0 && sb.st_size == KVB_HS_LOCAL_VALUE_LEN &&
              pread(f, value, KVB_HS_LOCAL_VALUE_LEN, 0) == KVB_HS_LOCAL_VALUE_LEN;
    close(f);
    return ok;
}

/* A same-host challenge: prove we run on the listener's host (it then sends
 * its shared-file table); a zero MAC when we cannot or its host differs. */
static kvb_status_t answer_local(kvb_engine_h eng, int fd, uint64_t deadline, hs_out_t *o,
                                 char *why, size_t wl)
{
    uint32_t pid, fdn, hl;
    const uint8_t *host;
    uint8_t value[KVB_HS_LOCAL_VALUE_LEN], tuple[KVB_HS_TUPLE_MAX], mac[KVB_HS_MAC_LEN] = {0};
    uint8_t msg[KVB_HS_LOCALOK_LEN];
    size_t tl;
    if (kvb__hs_kind(o->msg, o->len) != KVB_HS_MSG_LOCAL)
        return KVB_OK;
    kvb_status_t st = kvb__hs_local_decode(o->msg, o->len, &pid, &fdn, &host, &hl, why, wl);
    if (st != KVB_OK)
        return st;
    if (hl == strlen(eng->host_id) && memcmp(host, eng->host_id, hl) == 0 &&
        kvb__hs_conn_tuple(fd, false, tuple, &tl) && read_local_value(pid, fdn, value)) {
        st = kvb__hs_local_mac(value, tuple, tl, mac);
        explicit_bzero(value, sizeof(value));
        if (st != KVB_OK)
            return st;
    }
    kvb__hs_localok_encode(mac, msg);
    st = kvb__sock_write_all(fd, msg, sizeof(msg), deadline);
    return st == KVB_OK ? next_msg(fd, deadline, o, why, wl) : st;
}

/* The reply: as is without a secret; with one, it must come sealed with the
 * listener's MAC over both nonces (the listener knows the secret, and no
 * relay changed the worker address or the table). */
static kvb_status_t open_reply(kvb_engine_h eng, hs_out_t *o, char *why, size_t wl)
{
    const uint8_t *mac;
    uint8_t want[KVB_HS_MAC_LEN];
    kvb__hs_kind_t k = kvb__hs_kind(o->msg, o->len);
    if (!o->authed) {
        o->rep = o->msg;
        o->rep_len = o->len;
        return KVB_OK;
    }
    if (k != KVB_HS_MSG_SEALED) {
        snprintf(why, wl,
                 "authentication failed: the listener did not prove the engine secret (its "
                 "reply is not sealed)");
        return KVB_ERR_AUTH;
    }
    kvb_status_t st = kvb__hs_sealed_decode(o->msg, o->len, &mac, &o->rep, &o->rep_len, why, wl);
    if (st == KVB_OK)
        st = kvb__hs_reply_mac(eng->secret, o->nonce_l, o->nonce_w, (const uint8_t *)eng->sid,
                               (uint32_t)strlen(eng->sid), o->rep, o->rep_len, want);
    if (st == KVB_OK && !kvb__ct_equal(mac, want, sizeof(want))) {
        snprintf(why, wl,
                 "authentication failed: the listener did not prove the engine secret (its "
                 "reply's MAC is wrong: another secret there, or the reply was altered on the "
                 "way)");
        st = KVB_ERR_AUTH;
    }
    return st;
}

/* Request, then the listener's answers (challenge, same-host proof, reply)
 * in the order handshake.h gives; on success o->rep is the reply. */
static kvb_status_t exchange(kvb_engine_h eng, int fd, uint64_t deadline, hs_out_t *o, char *why,
                             size_t wl)
{
    uint8_t *req = NULL;
    size_t req_len;
    kvb_status_t st = kvb__hs_request_encode(eng->sid, kvb__lanes_request_caps(), &req, &req_len);
    if (st == KVB_OK)
        st = kvb__sock_write_all(fd, req, req_len, deadline);
    free(req);
    if (st == KVB_OK)
        st = next_msg(fd, deadline, o, why, wl);
    if (st != KVB_OK)
        return st;
    if (eng->secret != NULL) {
        st = prove(eng, fd, deadline, o, why, wl);
    } else if (kvb__hs_kind(o->msg, o->len) == KVB_HS_MSG_CHALLENGE) {
        snprintf(why, wl,
                 "authentication failed: the peer requires an engine secret and none is "
                 "set (KVBRIDGE_ENGINE_SECRET)");
        st = KVB_ERR_AUTH;
    }
    if (st == KVB_OK)
        st = answer_local(eng, fd, deadline, o, why, wl);
    if (st == KVB_OK)
        st = open_reply(eng, o, why, wl);
    return st;
}

/* Blocking handshake on the caller's thread, then the progress thread turns
 * the reply into an endpoint. */
static kvb_status_t handshake(kvb_engine_h eng, kvb__session_t *s, uint64_t deadline,
                              kvb__conn_t **conn_p)
{
    hs_out_t o = {0};
    kvb__hs_reply_t reply;
    kvb__cmd_t cmd = {0};
    char why[256] = "";
    int fd = -1;
    kvb_status_t st = kvb__sock_connect(s->host, s->port, deadline, &fd, why, sizeof(why));
    if (st == KVB_OK)
        st = exchange(eng, fd, deadline, &o, why, sizeof(why));
    if (st == KVB_OK)
        st = kvb__hs_reply_decode(o.rep, o.rep_len, &reply, why, sizeof(why));
    if (st == KVB_OK) {
        set_keepalive(fd, eng->params.peer_timeout_s);
        cmd.kind = CMD_CONNECT;
        cmd.reply = &reply;
        cmd.deadline = deadline;
        cmd.conn = calloc(1, sizeof(*cmd.conn));
        if (cmd.conn == NULL)
            st = KVB_ERR_NOMEM;
        else if (o.authed)
            st = kvb__hs_am_token(eng->secret, o.nonce_w, o.nonce_l, reply.epoch,
                                  cmd.conn->am_token);
        if (cmd.conn != NULL)
            cmd.conn->am_auth = o.authed;
        if (st == KVB_OK)
            st = kvb__cuda_conn_alloc(cmd.conn, &reply);
        if (st == KVB_OK)
            st = kvb__lanes_attach_prepare(cmd.conn, &reply);
        if (st != KVB_OK)
            kvb__hs_reply_free(&reply);
    }
    if (st == KVB_OK) {
        cmd.conn->sess = s;
        pthread_mutex_lock(&eng->sess_mu);
        s->refs++; /* the conn's (dropped when it is freed) */
        pthread_mutex_unlock(&eng->sess_mu);
        cmd.conn->eng_backref = eng;
        cmd.conn->fd = fd;
        cmd.conn->refs = 1;
        st = kvb__engine_submit(eng, &cmd, true);
        if (st == KVB_OK)
            st = cmd.result;
        if (st != KVB_OK)
            snprintf(why, sizeof(why), "%s", cmd.why);
        else
            fd = -1; /* owned by the conn now */
        /* Each lane maps or imports what the reply offers (mapping and
         * pre-faulting the peer's files takes a while for big pools: on
         * this caller's thread, not the progress thread). The conn is not
         * published yet, so no transfer reads what this sets. */
        if (st == KVB_OK) {
            kvb__cuda_mark(cmd.conn, &reply); /* never written as host memory */
            kvb__lanes_attach(eng, cmd.conn, &reply);
        }
        kvb__hs_reply_free(&reply);
    }
    free(o.msg);
    if (fd >= 0)
        close(fd);
    if (st != KVB_OK) {
        if (cmd.conn != NULL && (cmd.result != KVB_OK || !cmd.done)) {
            kvb__lanes_detach(cmd.conn);
            kvb__cuda_conn_free(cmd.conn);
            kvb__session_put(eng, cmd.conn->sess);
            free(cmd.conn);
        }
        if (st == KVB_ERR_PROTO)
            st = KVB_ERR_PEER; /* a peer that speaks garbage is not reachable */
        return kvb__err_set(&eng->err, st, "session %s: %s", s->sid,
                            why[0] ? why : kvb_status_string(st));
    }
    *conn_p = cmd.conn;
    return KVB_OK;
}

static bool conn_usable(kvb__conn_t *c)
{
    return c != NULL && !__atomic_load_n(&c->dead, __ATOMIC_ACQUIRE) &&
           !__atomic_load_n(&c->stale, __ATOMIC_ACQUIRE);
}

/* Another thread's handshake with s is in progress: wait for it, at most
 * until deadline (s->mu held). */
static kvb_status_t wait_connecting(kvb_engine_h eng, kvb__session_t *s, uint64_t start,
                                    uint64_t deadline)
{
    while (s->state == SESS_CONNECTING)
        if (!kvb__cond_wait_until(&s->cv, &s->mu, deadline))
            return kvb__err_set(&eng->err, KVB_ERR_TIMEOUT,
                                "session %s: another thread's handshake with it still runs "
                                "after %.3f s",
                                s->sid, (double)(kvb__now_ns() - start) / 1e9);
    return KVB_OK;
}

kvb_status_t kvb__session_acquire(kvb_engine_h eng, const char *sid, bool force_new,
                                  kvb__conn_t **conn_p)
{
    uint64_t deadline = kvb__now_ns() + (uint64_t)(2 * eng->params.connect_timeout_s * 1e9);
    return kvb__session_acquire_by(eng, sid, force_new, deadline, conn_p);
}

kvb_status_t kvb__session_acquire_by(kvb_engine_h eng, const char *sid, bool force_new,
                                     uint64_t deadline, kvb__conn_t **conn_p)
{
    kvb_status_t st = KVB_OK;
    kvb__session_t *s = session_find(eng, sid, &st);
    kvb__conn_t *old, *c = NULL;
    uint64_t now = kvb__now_ns();
    uint64_t hs_deadline = now + (uint64_t)(eng->params.connect_timeout_s * 1e9);
    if (s == NULL)
        return st;
    pthread_mutex_lock(&s->mu);
    if ((st = wait_connecting(eng, s, now, deadline)) != KVB_OK) {
        pthread_mutex_unlock(&s->mu);
        return st;
    }
    if (!force_new && conn_usable(s->conn)) {
        kvb__conn_get(s->conn);
        *conn_p = s->conn;
        pthread_mutex_unlock(&s->mu);
        kvb__session_put(eng, s);
        return KVB_OK;
    }
    s->state = SESS_CONNECTING;
    old = s->conn;
    s->conn = NULL;
    pthread_mutex_unlock(&s->mu);
    kvb__conn_put(old);
    st = handshake(eng, s, deadline < hs_deadline ? deadline : hs_deadline, &c);
    pthread_mutex_lock(&s->mu);
    s->state = st == KVB_OK ? SESS_READY : SESS_IDLE;
    s->conn = c;
    if (c != NULL)
        kvb__conn_get(c);
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    kvb__session_put(eng, s);
    if (st == KVB_OK)
        *conn_p = c;
    return st;
}

void kvb__sessions_free(kvb_engine_h eng)
{
    kvb__session_t *lists[2] = {eng->sessions, eng->sess_evicted};
    for (int k = 0; k < 2; k++)
        for (kvb__session_t *s = lists[k], *next; s != NULL; s = next) {
            next = s->next;
            if (s->conn != NULL) /* the session's reference; engine threads are gone */
                __atomic_sub_fetch(&s->conn->refs, 1, __ATOMIC_ACQ_REL);
            session_destroy(s);
        }
    eng->sessions = eng->sess_evicted = NULL;
    eng->n_sessions = 0;
}

/* ---- progress thread side ---- */

static void ep_error_cb(void *arg, ucp_ep_h ep, ucs_status_t status)
{
    kvb__conn_t *c = arg;
    char why[160];
    snprintf(why, sizeof(why), "transport error: %s", ucs_status_string(status));
    kvb__conn_fail(c->eng_backref, c, why);
}

static bool same_host(kvb_engine_h eng, const kvb__hs_reply_t *r)
{
    return r->host_len == strlen(eng->host_id) && memcmp(r->host, eng->host_id, r->host_len) == 0;
}

static lane_t choose_lane(kvb_engine_h eng, const kvb__hs_reply_t *r)
{
    const char *forced = kvb__env_get("KVBRIDGE_LANE", NULL); /* put|am: diagnostics */
    if (forced != NULL)
        return strcmp(forced, "am") == 0 ? LANE_AM : LANE_PUT;
    /* AUTO and TCP: the message lane. On one host UCX 1.13's put into user
     * memory is itself emulated over shared-memory messages; the message lane
     * matched or beat it (bench/results/engine.md), keeps working when both
     * processes share a core (put: 40x slower there), and the target checks
     * every range. Across hosts without RDMA, put over TCP is emulated and
     * slow. SHM forces UCX's one-sided put (the lane RDMA hosts want). */
    return eng->params.transport == KVB_TRANSPORT_SHM ? LANE_PUT : LANE_AM;
}

static kvb_status_t unpack_rkeys(kvb__conn_t *c, const kvb__hs_reply_t *r, char *why, size_t wl)
{
    for (uint32_t i = 0; i < r->nseg; i++) {
        kvb__seg_t seg = {.addr = r->segs[i].addr, .len = r->segs[i].len};
        ucp_rkey_h rk = NULL;
        ucs_status_t us = r->segs[i].rkey_len == 0
                              ? UCS_ERR_UNSUPPORTED
                              : ucp_ep_rkey_unpack(c->ep, r->segs[i].rkey, &rk);
        if (us == UCS_OK && KVB__HOOK(fail_rkey_unpack)) {
            ucp_rkey_destroy(rk);
            us = UCS_ERR_UNREACHABLE;
        }
        /* Device memory comes without a remote key: the put lane never
         * writes it (the transfer takes another lane, mem_cuda.c). */
        if (us != UCS_OK && c->lane == LANE_PUT && r->segs[i].rkey_len > 0) {
            snprintf(why, wl, "remote key %u unusable: %s", i, ucs_status_string(us));
            return KVB_ERR_PEER;
        }
        seg.handle = us == UCS_OK ? rk : NULL;
        if (kvb__segtab_insert(&c->segs, &seg) != KVB_OK) {
            if (rk != NULL)
                ucp_rkey_destroy(rk);
            snprintf(why, wl, "segment %u overlaps another", i);
            return KVB_ERR_PEER;
        }
    }
    return KVB_OK;
}

/* The connection is usable (progress thread): its control socket watched,
 * listed among the live conns. */
static void conn_ready(kvb_engine_h eng, kvb__conn_t *c)
{
    struct epoll_event ev = {.events = EPOLLIN | EPOLLRDHUP};
    ev.data.u64 = (uint64_t)(uintptr_t)c;
    epoll_ctl(eng->epfd, EPOLL_CTL_ADD, c->fd, &ev);
    c->next_all = eng->conns;
    eng->conns = c;
    KVB_LOGI("engine %s: session %s connected (%s lane, %zu segments)", eng->sid, c->sess->sid,
             c->lane == LANE_PUT ? "put" : "message", c->segs.n);
}

/* The connection cannot be set up (progress thread): its UCX objects go;
 * the handshake socket stays the caller's until success (it closes it), so
 * release_ucx must not close it too, or the second close hits whatever
 * descriptor took the number meanwhile. */
static void conn_abandon(kvb_engine_h eng, kvb__conn_t *c)
{
    c->fd = -1;
    kvb__conn_release_ucx(eng, c);
}

/* A new connection's UCX wire-up in flight: its endpoint's flush. UCX
 * 1.13.1 aborts a process (an assertion in ucp_request_send_state_ff, "got
 * REP message"; removed upstream by openucx/ucx#8175) when the peer that
 * asked it for a wire-up is gone before its reply went out. A writer whose
 * call returned right after the handshake (a probe, a write refused for its
 * bounds, a table look-up) and whose process then exited left that reply
 * pending and killed the target; so the handshake ends only once the
 * wire-up did. Progress thread only. */
typedef struct kvb__wiring {
    kvb_engine_h eng;
    kvb__cmd_t *cmd; /* NULL once ended: the flush's callback frees it */
    struct kvb__wiring *next;
} kvb__wiring_t;

static void wiring_unlink(kvb_engine_h eng, kvb__wiring_t *w)
{
    kvb__wiring_t **pp = &eng->wiring;
    while (*pp != NULL && *pp != w)
        pp = &(*pp)->next;
    if (*pp == w)
        *pp = w->next;
}

/* End w's command with st (KVB_OK: the conn is ready). w must not be used
 * afterwards: abandoning the conn closes its endpoint, whose flush's
 * callback then frees w. */
static void wiring_end(kvb__wiring_t *w, kvb_status_t st, const char *why)
{
    kvb_engine_h eng = w->eng;
    kvb__cmd_t *cmd = w->cmd;
    kvb__conn_t *c = cmd->conn;
    w->cmd = NULL;
    wiring_unlink(eng, w);
    cmd->result = st;
    if (st == KVB_OK) {
        conn_ready(eng, c);
    } else {
        snprintf(cmd->why, sizeof(cmd->why), "%s", why);
        conn_abandon(eng, c);
    }
    kvb__cmd_done(eng, cmd);
}

static void wired_cb(void *req, ucs_status_t status, void *arg)
{
    kvb__wiring_t *w = arg;
    if (w->cmd != NULL) {
        char why[160];
        snprintf(why, sizeof(why), "UCX wire-up with the peer failed: %s",
                 ucs_status_string(status));
        wiring_end(w, status == UCS_OK ? KVB_OK : KVB_ERR_PEER, why);
    }
    free(w);
    ucp_request_free(req);
}

/* Flush cmd's new endpoint; true while that runs (cmd->wiring), false when
 * it ended at once (cmd->result says how). */
static bool wiring_start(kvb_engine_h eng, kvb__cmd_t *cmd)
{
    kvb__wiring_t *w = calloc(1, sizeof(*w));
    if (w == NULL) {
        cmd->result = KVB_ERR_NOMEM;
        snprintf(cmd->why, sizeof(cmd->why), "out of memory for the UCX wire-up");
        return false;
    }
    ucp_request_param_t p = {.op_attr_mask =
                                 UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA,
                             .cb.send = wired_cb,
                             .user_data = w};
    void *req = ucp_ep_flush_nbx(cmd->conn->ep, &p);
    if (!UCS_PTR_IS_PTR(req)) {
        free(w);
        cmd->result = UCS_PTR_STATUS(req) == UCS_OK ? KVB_OK : KVB_ERR_PEER;
        snprintf(cmd->why, sizeof(cmd->why), "UCX wire-up with the peer failed: %s",
                 ucs_status_string(UCS_PTR_STATUS(req)));
        return false;
    }
    w->eng = eng;
    w->cmd = cmd;
    w->next = eng->wiring;
    eng->wiring = w;
    cmd->wiring = true;
    return true;
}

void kvb__conn_wiring_expire(kvb_engine_h eng, bool stopping)
{
    uint64_t now = kvb__now_ns();
    kvb__wiring_t *w = eng->wiring;
    while (w != NULL) {
        if (!stopping && now <= w->cmd->deadline) {
            w = w->next;
            continue;
        }
        /* Ending one runs UCX callbacks that may end others: start over. */
        wiring_end(w, stopping ? KVB_ERR_CANCELED : KVB_ERR_TIMEOUT,
                   stopping ? "engine stopping during the UCX wire-up with the peer"
                            : "UCX wire-up with the peer did not complete within the "
                              "handshake's time");
        w = eng->wiring;
    }
}

void kvb__conn_establish(kvb_engine_h eng, kvb__cmd_t *cmd)
{
    kvb__conn_t *c = cmd->conn;
    const kvb__hs_reply_t *r = cmd->reply;
    ucp_ep_params_t ep = {0};
    ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                    UCP_EP_PARAM_FIELD_ERR_HANDLER;
    ep.address = (const ucp_address_t *)r->waddr;
    c->lane = choose_lane(eng, r);
    /* UCX drops transports without peer-failure support (CMA, shared memory)
     * from endpoints in PEER mode, so a same-host endpoint would fall back to
     * TCP (put emulated over TCP measured 5x slower). On one host the control
     * connection alone detects a dead peer. */
    bool local = eng->params.transport == KVB_TRANSPORT_SHM ||
                 (eng->params.transport == KVB_TRANSPORT_AUTO && same_host(eng, r));
    ep.err_mode = local ? UCP_ERR_HANDLING_MODE_NONE : UCP_ERR_HANDLING_MODE_PEER;
    c->local = local;
    ep.err_handler.cb = ep_error_cb;
    ep.err_handler.arg = c;
    c->epoch = r->epoch;
    c->generation = r->generation;
    ucs_status_t us = ucp_ep_create(eng->worker, &ep, &c->ep);
    if (us != UCS_OK) {
        c->ep = NULL;
        cmd->result = KVB_ERR_PEER;
        snprintf(cmd->why, sizeof(cmd->why), "no UCX path to the peer (transport %s): %s",
                 eng->params.transport == KVB_TRANSPORT_SHM ? "shm" : "auto/tcp",
                 ucs_status_string(us));
        return;
    }
    cmd->result = unpack_rkeys(c, r, cmd->why, sizeof(cmd->why));
    /* A local endpoint is not flushed: without peer-failure detection the
     * flush of a peer that stopped would never end (and UCX's shared-memory
     * wire-up does not reach the assertion above). */
    if (cmd->result == KVB_OK && !local && wiring_start(eng, cmd))
        return;
    if (cmd->result != KVB_OK) {
        conn_abandon(eng, c);
        return;
    }
    conn_ready(eng, c);
}

void kvb__conn_fail(kvb_engine_h eng, kvb__conn_t *c, const char *why)
{
    /* Progress thread only: the reason is complete before other threads
     * (direct-lane copy threads, new transfers) can see the conn dead. */
    if (__atomic_load_n(&c->dead, __ATOMIC_ACQUIRE))
        return;
    snprintf(c->why, sizeof(c->why), "%s", why);
    __atomic_store_n(&c->dead, 1, __ATOMIC_RELEASE);
    eng->conn_failures++;
    KVB_LOGW("engine %s: session %s lost: %s", eng->sid, c->sess->sid, why);
    kvb__xfer_fail_conn(eng, c, why);
    eng->dead_conns = 1;
    if (c->fd >= 0)
        epoll_ctl(eng->epfd, EPOLL_CTL_DEL, c->fd, NULL);
}

void kvb__conn_on_fd(kvb_engine_h eng, kvb__conn_t *c)
{
    for (;;) {
        ssize_t n = recv(c->fd, c->rx + c->rxlen, sizeof(c->rx) - c->rxlen, MSG_DONTWAIT);
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return;
        if (n <= 0) {
            kvb__conn_fail(eng, c,
                           "peer closed its control connection (process died or restarted)");
            return;
        }
        c->rxlen += (size_t)n;
        if (c->rxlen < sizeof(c->rx))
            continue;
        uint64_t gen;
        c->rxlen = 0;
        if (!kvb__hs_notice_decode(c->rx, &gen)) {
            kvb__conn_fail(eng, c, "malformed notice on the control connection");
            return;
        }
        if (gen != c->generation)
            __atomic_store_n(&c->stale, 1, __ATOMIC_RELEASE);
    }
}

/* Close the endpoint now (force): UCX completes its outstanding requests
 * with an error, so their callbacks release what they hold. */
void kvb__conn_close_ep(kvb_engine_h eng, kvb__conn_t *c)
{
    ucp_request_param_t p = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
                             .flags = UCP_EP_CLOSE_FLAG_FORCE};
    if (c->ep == NULL)
        return;
    void *req = ucp_ep_close_nbx(c->ep, &p);
    c->ep = NULL;
    if (UCS_PTR_IS_PTR(req)) {
        for (int i = 0; i < 1000000 && ucp_request_check_status(req) == UCS_INPROGRESS; i++)
            ucp_worker_progress(eng->worker);
        ucp_request_free(req);
    }
}

void kvb__conn_release_ucx(kvb_engine_h eng, kvb__conn_t *c)
{
    kvb__conn_close_ep(eng, c);
    kvb__lanes_detach(c);
    kvb__cuda_conn_free(c);
    for (size_t i = 0; i < c->segs.n; i++)
        if (c->segs.v[i].handle != NULL)
            ucp_rkey_destroy((ucp_rkey_h)c->segs.v[i].handle);
    kvb__segtab_free(&c->segs);
    if (c->fd >= 0) {
        epoll_ctl(eng->epfd, EPOLL_CTL_DEL, c->fd, NULL);
        close(c->fd);
        c->fd = -1;
    }
}

static kvb__session_t *session_lookup(kvb_engine_h eng, const char *sid)
{
    kvb__session_t *s;
    pthread_mutex_lock(&eng->sess_mu);
    for (s = eng->sessions; s != NULL; s = s->next)
        if (strcmp(s->sid, sid) == 0)
            break;
    if (s != NULL)
        s->refs++; /* the caller's: kvb__session_put */
    pthread_mutex_unlock(&eng->sess_mu);
    return s;
}

int kvb_engine_session_direct(kvb_engine_h eng, const char *sid)
{
    kvb__session_t *s = eng != NULL && sid != NULL ? session_lookup(eng, sid) : NULL;
    int direct = KVB_ERR_NOT_FOUND;
    if (s == NULL)
        return KVB_ERR_NOT_FOUND;
    pthread_mutex_lock(&s->mu);
    if (s->conn != NULL && !__atomic_load_n(&s->conn->dead, __ATOMIC_ACQUIRE)) {
        direct = 0;
        for (size_t i = 0; s->conn->fence != NULL && i < s->conn->segs.n; i++)
            direct |= s->conn->segs.v[i].direct != NULL;
    }
    pthread_mutex_unlock(&s->mu);
    kvb__session_put(eng, s);
    return direct;
}

kvb_status_t kvb_engine_close_session(kvb_engine_h eng, const char *sid)
{
    kvb__session_t *s;
    kvb__conn_t *c = NULL;
    if (eng == NULL || sid == NULL)
        return KVB_ERR_INVALID;
    s = session_lookup(eng, sid);
    if (s == NULL)
        return KVB_ERR_NOT_FOUND;
    pthread_mutex_lock(&s->mu);
    if ((c = s->conn) != NULL)
        kvb__conn_get(c);
    pthread_mutex_unlock(&s->mu);
    /* Even without a current conn: older ones may still carry transfers.
     * The command holds our session reference until the progress thread ran
     * it (session_kill drops it). */
    kvb__cmd_t *cmd = calloc(1, sizeof(*cmd));
    if (cmd == NULL) {
        kvb__conn_put(c);
        kvb__session_put(eng, s);
        return KVB_ERR_NOMEM;
    }
    cmd->kind = CMD_KILL;
    cmd->conn = c;
    cmd->sess = s;
    if (kvb__engine_submit(eng, cmd, false) != KVB_OK) {
        free(cmd);
        kvb__conn_put(c);
        kvb__session_put(eng, s);
    }
    return KVB_OK;
}
