/* Engine lifecycle (create, destroy, UCX context and worker, the listening
 * socket) and the progress thread: commands, events, its lanes' writes.
 * Registrations: register.c; the handshake listener: listener.c; writers'
 * sessions: session.c. See engine_int.h for the threading model. */
#include "core/metrics.h"
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
#include <strings.h>
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
    out->serve_reads = (int)kvb__env_int("KVBRIDGE_SERVE_READS", NULL, 1, 0, 1);
    out->reads_need_grant = (int)kvb__env_int("KVBRIDGE_READS_NEED_GRANT", NULL, 0, 0, 1);
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
    if (in->field_mask & KVB_ENGINE_PARAM_SERVE_READS)
        out->serve_reads = in->serve_reads != 0;
    if (in->field_mask & KVB_ENGINE_PARAM_READS_NEED_GRANT)
        out->reads_need_grant = in->reads_need_grant != 0;
    if (in->field_mask & KVB_ENGINE_PARAM_NAME)
        out->name = in->name;
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

/* UCX 1.13's TCP transport (unchanged upstream as of 2026-08) frees an
 * endpoint inside its receive handler when the peer's "nothing more will
 * be sent" (CONN_FIN) arrives on a connection UCX kept open only to
 * receive, then calls that same endpoint's send handler when the socket
 * was writable too (uct_tcp_iface_handle_events): a use after free that
 * killed the process (segfault, or heap corruption). We reach that state
 * whenever we force-close an endpoint whose socket was full (a stopped
 * peer: the read caps' tick, kvb_xfer_expire, kvb_engine_close_session)
 * and a zero-copy send was on it: UCX cancels that send without ending
 * its buffer, so its socket stays armed for writing for good, and the
 * peer's close, once it resumes, hits it. Without zero-copy sends the
 * rest of the partly sent segment goes out once the peer drains the
 * socket, the buffer ends, and writing is disarmed before the peer's
 * close can come (test_engine_read_closed: 5 of 6 rounds died before,
 * none after). So a tcp engine sends every message by copy (UCX's
 * ZCOPY_THRESH=inf); KVBRIDGE_TCP_ZCOPY=1 or UCX_ZCOPY_THRESH in the
 * environment restore UCX's choice. */
static void tcp_no_zcopy(ucp_config_t *cfg)
{
    if (getenv("UCX_ZCOPY_THRESH") != NULL ||
        kvb__env_int("KVBRIDGE_TCP_ZCOPY", NULL, 0, 0, 1) == 1)
        return;
    if (ucp_config_modify(cfg, "ZCOPY_THRESH", "inf") != UCS_OK)
        KVB_LOGW("UCX does not know ZCOPY_THRESH: tcp endpoints keep zero-copy sends (a "
                 "force-closed stuck peer that resumes can crash this process)");
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

/* A target closes the reply endpoint of a reader that stopped taking its
 * read answers (lane/msg/target.c). UCX then frees that endpoint, and a
 * late message naming it must be looked up, not dereferenced: UCX does so
 * for endpoints with peer-failure handling (PROTO_INDIRECT_ID=auto, its
 * default; the only ones it lets us force-close). UCX_PROTO_INDIRECT_ID=off
 * in the environment: no reply endpoint is closed (the read caps' shares
 * still bound a reader). */
static void indirect_ids(kvb_engine_h eng)
{
    const char *v = getenv("UCX_PROTO_INDIRECT_ID");
    eng->am_close_safe = v == NULL || strcasecmp(v, "auto") == 0 || strcasecmp(v, "on") == 0 ||
                         strcasecmp(v, "y") == 0 || strcasecmp(v, "yes") == 0 ||
                         strcmp(v, "1") == 0;
    if (!eng->am_close_safe)
        KVB_LOGD("UCX ids endpoints directly: stuck readers' endpoints are not closed");
}

static kvb_status_t ucx_init(kvb_engine_h eng)
{
    ucp_config_t *cfg;
    ucp_params_t p = {0};
    ucp_worker_params_t wp = {0};
    ucp_worker_attr_t wa = {0};
    if (ucp_config_read(NULL, NULL, &cfg) != UCS_OK)
        return kvb__err_set(&eng->err, KVB_ERR_IO, "UCX configuration could not be read");
    if (eng->params.transport == KVB_TRANSPORT_TCP) {
        ucp_config_modify(cfg, "TLS", "tcp");
        tcp_no_zcopy(cfg);
    } else if (eng->params.transport == KVB_TRANSPORT_SHM)
        ucp_config_modify(cfg, "TLS", "sm,self");
    if (eng->params.transport != KVB_TRANSPORT_SHM && getenv("UCX_TLS") == NULL)
        tcp_segments(cfg);
    keepalive(cfg, eng->params.peer_timeout_s);
    indirect_ids(eng);
    p.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
    /* STREAM: the message lane's target watches each reply endpoint for
     * its end with a stream receive (lane/msg/target.c, peer_watch); no
     * stream data is sent. */
    p.features = UCP_FEATURE_RMA | UCP_FEATURE_AM | UCP_FEATURE_WAKEUP | UCP_FEATURE_STREAM;
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
    if (kvb__notif_register(eng) != KVB_OK)
        return kvb__err_set(&eng->err, KVB_ERR_IO, "notification handler not set");
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

/* A socket bound to ai and listening, or -1 with errno set. */
static int listen_on(const struct addrinfo *ai)
{
    int one = 1;
    int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || listen(fd, 128) != 0) {
        int e = errno;
        close(fd);
        errno = e;
        return -1;
    }
    return fd;
}

/* Listen on params.host: a numeric address, or a host name resolved here
 * (Mooncake's initialize takes names such as "localhost"); each address the
 * name resolves to is tried in getaddrinfo's order until one binds. The
 * session id is the bound numeric address either way. */
static kvb_status_t listen_init(kvb_engine_h eng)
{
    struct addrinfo hints = {0}, *res = NULL;
    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss);
    char port[8];
    int e = 0;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICSERV | AI_PASSIVE;
    snprintf(port, sizeof(port), "%u", eng->params.port);
    int gai = getaddrinfo(eng->params.host, port, &hints, &res);
    if (gai != 0)
        return kvb__err_set(&eng->err, KVB_ERR_INVALID,
                            "listen host \"%s\" does not resolve to an address: %s",
                            eng->params.host, gai_strerror(gai));
    eng->listen_fd = -1;
    for (const struct addrinfo *ai = res; ai != NULL && eng->listen_fd < 0; ai = ai->ai_next) {
        eng->listen_fd = listen_on(ai);
        if (eng->listen_fd < 0)
            e = errno;
    }
    freeaddrinfo(res);
    if (eng->listen_fd < 0)
        return kvb__err_set(&eng->err, KVB_ERR_IO, "cannot listen on %s:%u: %s", eng->params.host,
                            eng->params.port, strerror(e));
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

/* kvb_xfer_expire: a transfer its caller gave up on that is still running
 * at its expiry has a peer that stopped answering: fail its conn, endpoint
 * first (as session_kill), so it ends. At most one conn per call: failing one
 * finishes its transfers, which changes the list. */
static void expire_overdue(kvb_engine_h eng)
{
    uint64_t now = kvb__now_ns();
    for (struct kvb_xfer *x = eng->active; x != NULL; x = x->next_active) {
        uint64_t at = __atomic_load_n(&x->expire_ns, __ATOMIC_ACQUIRE);
        if (at == 0 || now < at || x->abandoned ||
            __atomic_load_n(&x->conn->dead, __ATOMIC_ACQUIRE))
            continue;
        /* Closing the endpoint progresses UCX, whose callbacks may finish
         * and free x (its caller let go): hold the conn, read x first. */
        kvb__conn_t *c = x->conn;
        const char *why = x->read ? "a read given up by its caller did not settle within the "
                                    "peer time-out"
                                  : "a write given up by its caller did not settle within the "
                                    "peer time-out";
        kvb__conn_get(c);
        kvb__conn_close_ep(eng, c);
        kvb__conn_fail(eng, c, why);
        kvb__conn_put(c);
        return;
    }
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
        c->wiring = false;
        if (c->kind == CMD_XFER)
            kvb__xfer_start(eng, c->xfer);
        else if (c->kind == CMD_CONNECT)
            kvb__conn_establish(eng, c);
        else if (c->kind == CMD_RETIRE)
            conn_retire(eng, c->conn);
        else if (c->kind == CMD_KILL)
            session_kill(eng, c);
        else if (c->kind == CMD_NOTIF)
            kvb__notif_send(eng, c->xfer);
        if (c->kind != CMD_CONNECT)
            free(c);
        if (waited && !c->wiring) /* a wire-up in flight: done when it ends */
            kvb__cmd_done(eng, c);
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
        if (eng->wiring != NULL)
            kvb__conn_wiring_expire(eng, false);
        busy = kvb__jobs_progress(eng);
        busy |= kvb__xfer_progress_all(eng);
        while (ucp_worker_progress(eng->worker) != 0)
            busy = true;
        if ((++iter & 63) == 0) {
            handle_events(eng, 0);
            expire_overdue(eng);
        }
        kvb__lanes_tick(eng);
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
    run_commands(eng);                  /* transfers queued before the stop start... */
    kvb__conn_wiring_expire(eng, true); /* handshakes waiting on a wire-up fail */
    kvb__xfer_cancel_all(eng, false);   /* ...and end CANCELED with the others */
    conns_release_all(eng);
    /* Reads still receiving into their pieces end last: nothing progresses
     * the worker after this (ucp_worker_destroy progresses no transport),
     * so nothing of them lands any more. */
    kvb__xfer_cancel_all(eng, true);
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
        kvb__seg_unmap(eng, &eng->segs.v[i]);
    kvb__segtab_free(&eng->segs);
    kvb__segtab_free(&eng->local_segs);
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
    kvb__notifq_free(&eng->notifs);
    free(eng->name);
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
    kvb__notifq_init(&eng->notifs);
    /* Every writer that completes a handshake keeps a socket here: cap them
     * (docs/security.md) well below the usual descriptor limit. */
    eng->max_notify = (size_t)kvb__env_int("KVBRIDGE_MAX_CONTROL_CONNS", NULL, 1024, 1, 1000000);
    eng->max_sessions = (size_t)kvb__env_int("KVBRIDGE_MAX_SESSIONS", NULL, 4096, 1, 10000000);
    eng->poll_yield = kvb__env_int("KVBRIDGE_POLL_YIELD", NULL, 1, 0, 1) != 0;
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

/* The name our notifications carry (the caller's, checked, else the
 * session id, known once listening). */
static kvb_status_t name_init(kvb_engine_h eng)
{
    const char *n = eng->params.name != NULL ? eng->params.name : eng->sid;
    size_t len = strlen(n);
    if (len == 0 || len > KVB_NOTIF_NAME_MAX)
        return kvb__err_set(&eng->err, KVB_ERR_INVALID, "engine name of %zu bytes: 1..%u allowed",
                            len, KVB_NOTIF_NAME_MAX);
    if ((eng->name = strdup(n)) == NULL)
        return KVB_ERR_NOMEM;
    eng->params.name = eng->name;
    return KVB_OK;
}

/* The engine's gauges that need its locks, read at a scrape. */
static void collect(void *arg, kvb__msnap_t *s)
{
    kvb_engine_h eng = arg;
    pthread_mutex_lock(&eng->sess_mu);
    kvb__metrics_put(s, KVB__M_SESSIONS, 0, eng->n_sessions);
    pthread_mutex_unlock(&eng->sess_mu);
    pthread_mutex_lock(&eng->seg_mu);
    kvb__metrics_put(s, KVB__M_FENCE_GRANTS, 0, eng->fence.n_grants);
    pthread_mutex_unlock(&eng->seg_mu);
    /* the progress thread's count: a word read while it changes is still one of its values */
    KVB_TSAN_IGNORE_BEGIN();
    size_t reads = __atomic_load_n(&eng->am_reads, __ATOMIC_RELAXED);
    KVB_TSAN_IGNORE_END();
    kvb__metrics_put(s, KVB__M_READ_ANSWERS, 0, reads);
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
        st = name_init(eng);
    if (st == KVB_OK)
        st = fds_init(eng);
    if (st == KVB_OK && pthread_create(&eng->progress_thr, NULL, progress_main, eng) != 0)
        st = kvb__err_set(&eng->err, KVB_ERR_IO, "cannot start the progress thread");
    if (st == KVB_OK && pthread_create(&eng->listen_thr, NULL, kvb__listen_main, eng) != 0) {
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
    kvb__metrics_collector_add(collect, eng);
    kvb__metrics_serve();
    *engine_p = eng;
    return KVB_OK;
}

void kvb_engine_destroy(kvb_engine_h eng)
{
    uint64_t one = 1;
    if (eng == NULL)
        return;
    kvb__metrics_collector_remove(collect, eng);
    kvb__lanes_stop(eng); /* before the progress thread: transfers release conns */
    kvb__jobs_stop(eng);  /* likewise; copies arriving later run inline */
    pthread_mutex_lock(&eng->cmd_mu);
    __atomic_store_n(&eng->stop, 1, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&eng->cmd_mu);
    if (write(eng->evfd, &one, sizeof(one)) < 0 || write(eng->stop_pipe[1], "x", 1) < 0)
        KVB_LOGD("engine stop signal: %s", strerror(errno));
    pthread_join(eng->progress_thr, NULL);
    pthread_join(eng->listen_thr, NULL);
    kvb__hs_drain(eng);
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
    if (f & KVB_ENGINE_LIMITS_NOTIFS)
        kvb__notif_stats(eng, l);
    kvb__lanes_stats(eng, l);
}
