/* ZeroMQ plumbing of the control channel: one PULL socket per rank, PUSH
 * sockets cached per endpoint (the seeds' _connect cache), each with its own
 * lock because ZeroMQ sockets are not thread-safe. Optional CURVE security
 * (docs/security.md): the PULL socket is a CURVE server, PUSH sockets are
 * CURVE clients, and a ZAP handler thread admits the configured client keys;
 * ZeroMQ delivers nothing from a peer whose handshake failed. */
#include "conn/conn_int.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#define PUSH_HWM 4096        /* messages queued to one peer before we drop */
#define MAX_MSG (64ll << 20) /* largest control message accepted */

void kvb__zendpoint(const char *ip, uint16_t port, char *out, size_t len)
{
    if (strchr(ip, ':') != NULL && ip[0] != '[')
        snprintf(out, len, "tcp://[%s]:%u", ip, port);
    else
        snprintf(out, len, "tcp://%s:%u", ip, port);
}

/* ---- CURVE keys and the ZAP handler ---- */

#define ZAP_ENDPOINT "inproc://zeromq.zap.01"
#define ZAP_DOMAIN "kvbridge"

static kvb_status_t key_secret(const char *z85, char *sec, char *pub, const char *what, char *why,
                               size_t wl)
{
    uint8_t bin[32];
    if (strlen(z85) != 40 || zmq_z85_decode(bin, z85) == NULL) {
        snprintf(why, wl, "%s is not a 40-character Z85 key", what);
        return KVB_ERR_INVALID;
    }
    memcpy(sec, z85, 41);
    if (zmq_curve_public(pub, sec) != 0) {
        snprintf(why, wl, "cannot derive the public key of %s: %s", what, zmq_strerror(errno));
        return KVB_ERR_INVALID;
    }
    return KVB_OK;
}

static kvb_status_t add_allowed(kvb__zcurve_t *z, const char *z85, size_t n, char *why, size_t wl)
{
    char key[41];
    uint8_t(*v)[32];
    if (n != 40) {
        snprintf(why, wl, "allowed client key of %zu characters (Z85 keys have 40)", n);
        return KVB_ERR_INVALID;
    }
    memcpy(key, z85, 40);
    key[40] = '\0';
    v = realloc(z->allowed, (z->n_allowed + 1) * sizeof(*v));
    if (v == NULL)
        return KVB_ERR_NOMEM;
    z->allowed = v;
    if (zmq_z85_decode(v[z->n_allowed], key) == NULL) {
        snprintf(why, wl, "allowed client key \"%s\" is not Z85", key);
        return KVB_ERR_INVALID;
    }
    z->n_allowed++;
    return KVB_OK;
}

kvb_status_t kvb__zcurve_init(kvb__zcurve_t *z, const char *server_secret,
                              const char *client_secret, const char *allowed, char *why, size_t wl)
{
    kvb_status_t st;
    memset(z, 0, sizeof(*z));
    if (server_secret == NULL)
        server_secret = kvb__env_get("KVBRIDGE_CURVE_SECRET_KEY", NULL);
    if (client_secret == NULL)
        client_secret = kvb__env_get("KVBRIDGE_CURVE_CLIENT_SECRET_KEY", NULL);
    if (allowed == NULL)
        allowed = kvb__env_get("KVBRIDGE_CURVE_ALLOWED_CLIENTS", NULL);
    if (server_secret == NULL || server_secret[0] == '\0')
        return KVB_OK; /* off */
    if (!zmq_has("curve")) {
        snprintf(why, wl, "this libzmq was built without CURVE");
        return KVB_ERR_UNSUPPORTED;
    }
    if (client_secret == NULL || client_secret[0] == '\0')
        client_secret = server_secret;
    st = key_secret(server_secret, z->server_secret, z->server_public, "the CURVE secret key", why,
                    wl);
    if (st == KVB_OK)
        st = key_secret(client_secret, z->client_secret, z->client_public,
                        "the CURVE client secret key", why, wl);
    if (st == KVB_OK && allowed != NULL && allowed[0] != '\0') {
        for (const char *p = allowed; st == KVB_OK && *p != '\0';) {
            size_t n = strcspn(p, ", \t\n");
            if (n > 0)
                st = add_allowed(z, p, n, why, wl);
            p += n;
            while (*p != '\0' && (*p == ',' || isspace((unsigned char)*p)))
                p++;
        }
    } else if (st == KVB_OK) {
        st = add_allowed(z, z->server_public, 40, why, wl);
        if (st == KVB_OK && strcmp(z->client_public, z->server_public) != 0)
            st = add_allowed(z, z->client_public, 40, why, wl);
    }
    if (st != KVB_OK) {
        kvb__zcurve_free(z);
        return st;
    }
    z->on = 1;
    return KVB_OK;
}

static bool frame_is(zmq_msg_t *m, const char *s)
{
    size_t n = strlen(s);
    return zmq_msg_size(m) == n && memcmp(zmq_msg_data(m), s, n) == 0;
}

static bool key_allowed(const kvb__zcurve_t *z, zmq_msg_t *cred)
{
    bool ok = false;
    if (zmq_msg_size(cred) != 32)
        return false;
    for (size_t i = 0; i < z->n_allowed; i++) /* no early exit: time independent of the match */
        ok |= memcmp(z->allowed[i], zmq_msg_data(cred), 32) == 0;
    return ok;
}

/* One ZAP request (RFC 27): version, request id, domain, address, routing id,
 * mechanism, credentials (the client's 32-byte public key). A REP socket
 * must answer every request, malformed ones included. */
static void zap_serve_one(kvb__zcurve_t *z)
{
    zmq_msg_t f[8], extra;
    size_t n = 0;
    int more = 1;
    size_t ml = sizeof(more);
    while (more) {
        zmq_msg_t *m = n < 8 ? &f[n] : &extra;
        zmq_msg_init(m);
        if (zmq_msg_recv(m, z->zap_sock, 0) < 0) {
            zmq_msg_close(m);
            break;
        }
        if (m == &extra)
            zmq_msg_close(&extra);
        n++;
        zmq_getsockopt(z->zap_sock, ZMQ_RCVMORE, &more, &ml);
    }
    size_t have = n < 8 ? n : 8;
    bool ok = n == 7 && frame_is(&f[0], "1.0") && frame_is(&f[2], ZAP_DOMAIN) &&
              frame_is(&f[5], "CURVE") && key_allowed(z, &f[6]);
    if (!ok) {
        uint64_t k = __atomic_add_fetch(&z->zap_denied, 1, __ATOMIC_RELAXED);
        char addr[64] = "?";
        if (have > 3)
            snprintf(addr, sizeof(addr), "%.*s",
                     (int)(zmq_msg_size(&f[3]) < 60 ? zmq_msg_size(&f[3]) : 60),
                     (const char *)zmq_msg_data(&f[3]));
        if (k <= 16 || (k & (k - 1)) == 0) /* first ones, then powers of two */
            KVB_LOGW("control: CURVE client from %s refused (key not allowed); %llu refused so far",
                     addr, (unsigned long long)k);
    }
    zmq_send(z->zap_sock, "1.0", 3, ZMQ_SNDMORE);
    if (have > 1)
        zmq_send(z->zap_sock, zmq_msg_data(&f[1]), zmq_msg_size(&f[1]), ZMQ_SNDMORE);
    else
        zmq_send(z->zap_sock, "", 0, ZMQ_SNDMORE);
    zmq_send(z->zap_sock, ok ? "200" : "400", 3, ZMQ_SNDMORE);
    zmq_send(z->zap_sock, ok ? "OK" : "key not allowed", ok ? 2 : 15, ZMQ_SNDMORE);
    /* User id: the client's public key (Z85), which every message from that
     * connection then carries as "User-Id" (kvb__zpeer_id): a registration
     * may replace only one made with the same key. */
    char uid[41] = "";
    if (ok)
        zmq_z85_encode(uid, zmq_msg_data(&f[6]), 32);
    zmq_send(z->zap_sock, uid, strlen(uid), ZMQ_SNDMORE);
    zmq_send(z->zap_sock, "", 0, 0); /* metadata */
    for (size_t i = 0; i < have; i++)
        zmq_msg_close(&f[i]);
}

static void *zap_main(void *arg)
{
    kvb__zcurve_t *z = arg;
    while (!__atomic_load_n(&z->zap_stop, __ATOMIC_ACQUIRE)) {
        zmq_pollitem_t it = {z->zap_sock, 0, ZMQ_POLLIN, 0};
        if (zmq_poll(&it, 1, 100) > 0)
            zap_serve_one(z);
    }
    return NULL;
}

kvb_status_t kvb__zap_start(kvb__zcurve_t *z, void *zctx)
{
    int zero = 0;
    z->zap_sock = zmq_socket(zctx, ZMQ_REP);
    if (z->zap_sock == NULL)
        return KVB_ERR_IO;
    zmq_setsockopt(z->zap_sock, ZMQ_LINGER, &zero, sizeof(zero));
    if (zmq_bind(z->zap_sock, ZAP_ENDPOINT) != 0) {
        KVB_LOGE("control: cannot bind the ZAP handler: %s", zmq_strerror(errno));
        zmq_close(z->zap_sock);
        z->zap_sock = NULL;
        return KVB_ERR_IO;
    }
    if (pthread_create(&z->zap_thr, NULL, zap_main, z) != 0) {
        zmq_close(z->zap_sock);
        z->zap_sock = NULL;
        return KVB_ERR_IO;
    }
    z->zap_running = 1;
    return KVB_OK;
}

void kvb__zcurve_free(kvb__zcurve_t *z)
{
    if (z->zap_running) {
        __atomic_store_n(&z->zap_stop, 1, __ATOMIC_RELEASE);
        pthread_join(z->zap_thr, NULL);
        z->zap_running = 0;
    }
    if (z->zap_sock != NULL)
        zmq_close(z->zap_sock);
    z->zap_sock = NULL;
    free(z->allowed);
    z->allowed = NULL;
    z->n_allowed = 0;
    explicit_bzero(z->server_secret, sizeof(z->server_secret));
    explicit_bzero(z->client_secret, sizeof(z->client_secret));
}

/* The PUSH side: a CURVE client of the deployment's server key. */
static void push_curve(void *sock, const kvb__zcurve_t *z)
{
    zmq_setsockopt(sock, ZMQ_CURVE_SERVERKEY, z->server_public, 40);
    zmq_setsockopt(sock, ZMQ_CURVE_PUBLICKEY, z->client_public, 40);
    zmq_setsockopt(sock, ZMQ_CURVE_SECRETKEY, z->client_secret, 40);
}

void kvb__zcache_init(kvb__zcache_t *c, void *zctx)
{
    c->zctx = zctx;
    c->curve = NULL;
    c->head = NULL;
    c->n = 0;
    c->evicted = 0;
    c->sent = c->send_failed = 0;
    /* Each endpoint a peer names gets a socket that reconnects forever:
     * keep the most recently used ones only (docs/security.md). */
    c->max = (size_t)kvb__env_int("KVBRIDGE_MAX_PUSH_SOCKETS", NULL, 1024, 1, 1000000);
    pthread_mutex_init(&c->mu, NULL);
}

void kvb__zcache_stats(kvb__zcache_t *c, uint64_t *open_p, uint64_t *evicted_p)
{
    pthread_mutex_lock(&c->mu);
    *open_p = c->n;
    *evicted_p = c->evicted;
    pthread_mutex_unlock(&c->mu);
}

void kvb__zcache_traffic(kvb__zcache_t *c, uint64_t *sent_p, uint64_t *failed_p)
{
    *sent_p = __atomic_load_n(&c->sent, __ATOMIC_RELAXED);
    *failed_p = __atomic_load_n(&c->send_failed, __ATOMIC_RELAXED);
}

static void push_close(kvb__zpush_t *p)
{
    zmq_close(p->sock);
    pthread_mutex_destroy(&p->mu);
    free(p);
}

/* Close the least recently used socket nobody is sending on (c->mu held);
 * false when every one is in use. */
static bool push_evict(kvb__zcache_t *c)
{
    kvb__zpush_t **victim = NULL;
    for (kvb__zpush_t **pp = &c->head; *pp != NULL; pp = &(*pp)->next)
        if ((*pp)->users == 0)
            victim = pp; /* the last idle one: least recently used */
    if (victim == NULL)
        return false;
    kvb__zpush_t *p = *victim;
    *victim = p->next;
    c->n--;
    c->evicted++;
    push_close(p);
    return true;
}

/* Move p to the front (most recently used; c->mu held). */
static void push_touch(kvb__zcache_t *c, kvb__zpush_t **pp)
{
    kvb__zpush_t *p = *pp;
    if (pp == &c->head)
        return;
    *pp = p->next;
    p->next = c->head;
    c->head = p;
}

void kvb__zcache_free(kvb__zcache_t *c)
{
    for (kvb__zpush_t *p = c->head, *next; p != NULL; p = next) {
        next = p->next;
        push_close(p);
    }
    c->head = NULL;
    pthread_mutex_destroy(&c->mu);
}

static kvb__zpush_t *push_get(kvb__zcache_t *c, const char *ip, uint16_t port)
{
    char ep[KVB_IP_MAX + 16];
    kvb__zpush_t *p;
    int zero = 0, hwm = PUSH_HWM, v6 = strchr(ip, ':') != NULL;
    kvb__zendpoint(ip, port, ep, sizeof(ep));
    kvb__zpush_t **pp;
    pthread_mutex_lock(&c->mu);
    for (pp = &c->head; *pp != NULL; pp = &(*pp)->next)
        if (strcmp((*pp)->endpoint, ep) == 0)
            break;
    p = *pp;
    if (p != NULL)
        push_touch(c, pp);
    if (p == NULL && c->n >= c->max && !push_evict(c)) {
        pthread_mutex_unlock(&c->mu);
        KVB_LOGW("control: no socket for %s: %zu PUSH sockets, all sending "
                 "(KVBRIDGE_MAX_PUSH_SOCKETS)",
                 ep, c->n);
        return NULL;
    }
    if (p == NULL && (p = calloc(1, sizeof(*p))) != NULL) {
        snprintf(p->endpoint, sizeof(p->endpoint), "%s", ep);
        p->sock = zmq_socket(c->zctx, ZMQ_PUSH);
        if (p->sock != NULL) {
            zmq_setsockopt(p->sock, ZMQ_LINGER, &zero, sizeof(zero));
            zmq_setsockopt(p->sock, ZMQ_SNDHWM, &hwm, sizeof(hwm));
            zmq_setsockopt(p->sock, ZMQ_IPV6, &v6, sizeof(v6));
            if (c->curve != NULL && c->curve->on)
                push_curve(p->sock, c->curve);
        }
        if (p->sock == NULL || zmq_connect(p->sock, ep) != 0) {
            KVB_LOGW("control: cannot connect to %s: %s", ep, zmq_strerror(errno));
            if (p->sock != NULL)
                zmq_close(p->sock);
            free(p);
            p = NULL;
        } else {
            pthread_mutex_init(&p->mu, NULL);
            p->next = c->head;
            c->head = p;
            c->n++;
        }
    }
    if (p != NULL)
        p->users++;
    pthread_mutex_unlock(&c->mu);
    return p;
}

static void push_put(kvb__zcache_t *c, kvb__zpush_t *p)
{
    pthread_mutex_lock(&c->mu);
    p->users--;
    pthread_mutex_unlock(&c->mu);
}

kvb_status_t kvb__zsend(kvb__zcache_t *c, const char *ip, uint16_t port,
                        const kvb__frames_buf_t *msg)
{
    kvb__zpush_t *p = push_get(c, ip, port);
    kvb_status_t st = KVB_OK;
    if (p == NULL) {
        __atomic_add_fetch(&c->send_failed, 1, __ATOMIC_RELAXED);
        return KVB_ERR_PEER;
    }
    pthread_mutex_lock(&p->mu);
    for (size_t i = 0; i < msg->n; i++) {
        kvb__frame_t f = kvb__frames_buf_get(msg, i);
        int flags = ZMQ_DONTWAIT | (i + 1 < msg->n ? ZMQ_SNDMORE : 0);
        if (zmq_send(p->sock, f.data, f.len, flags) < 0) {
            /* Only the first frame can fail: ZeroMQ queues multipart
             * messages atomically once the first part is accepted. */
            KVB_LOGW("control: message to %s dropped: %s", p->endpoint, zmq_strerror(errno));
            st = KVB_ERR_PEER;
            break;
        }
    }
    pthread_mutex_unlock(&p->mu);
    push_put(c, p);
    __atomic_add_fetch(st == KVB_OK ? &c->sent : &c->send_failed, 1, __ATOMIC_RELAXED);
    return st;
}

void kvb__zpeer_id(void *msg, char *out, size_t len)
{
    const char *id = zmq_msg_gets(msg, "User-Id");
    snprintf(out, len, "%s", id != NULL ? id : "");
}

int kvb__zrecv(void *sock, void *msgs_v, size_t max, int timeout_ms)
{
    zmq_msg_t *msgs = msgs_v, extra;
    zmq_pollitem_t it = {sock, 0, ZMQ_POLLIN, 0};
    size_t n = 0;
    int more = 1;
    size_t ml = sizeof(more);
    if (zmq_poll(&it, 1, timeout_ms) <= 0)
        return 0;
    while (more) {
        zmq_msg_t *m = n < max ? &msgs[n] : &extra;
        zmq_msg_init(m);
        if (zmq_msg_recv(m, sock, 0) < 0) {
            zmq_msg_close(m);
            for (size_t i = 0; i < n && i < max; i++)
                zmq_msg_close(&msgs[i]);
            return -1;
        }
        if (m == &extra)
            zmq_msg_close(&extra); /* more frames than any message has: drain */
        n++;
        zmq_getsockopt(sock, ZMQ_RCVMORE, &more, &ml);
    }
    return n > max ? (int)max + 1 : (int)n;
}

kvb_status_t kvb__zbind_pull(void *zctx, const char *host, const kvb__zcurve_t *curve,
                             void **sock_p, uint16_t *port_p)
{
    char ep[KVB_IP_MAX + 16], last[KVB_IP_MAX + 32];
    size_t ll = sizeof(last);
    int v6 = strchr(host, ':') != NULL, zero = 0;
    int64_t maxmsg = MAX_MSG;
    void *s = zmq_socket(zctx, ZMQ_PULL);
    if (s == NULL)
        return KVB_ERR_IO;
    zmq_setsockopt(s, ZMQ_IPV6, &v6, sizeof(v6));
    zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof(zero));
    zmq_setsockopt(s, ZMQ_MAXMSGSIZE, &maxmsg, sizeof(maxmsg));
    if (curve != NULL && curve->on) {
        int one = 1;
        if (zmq_setsockopt(s, ZMQ_ZAP_DOMAIN, ZAP_DOMAIN, strlen(ZAP_DOMAIN)) != 0 ||
            zmq_setsockopt(s, ZMQ_CURVE_SERVER, &one, sizeof(one)) != 0 ||
            zmq_setsockopt(s, ZMQ_CURVE_SECRETKEY, curve->server_secret, 40) != 0) {
            KVB_LOGE("control: cannot make the PULL socket a CURVE server: %s",
                     zmq_strerror(errno));
            zmq_close(s);
            return KVB_ERR_IO;
        }
        /* The ZAP handler (kvb__zap_start) is bound in this context before
         * this socket: libzmq would admit every CURVE client without one. */
    }
    snprintf(ep, sizeof(ep), v6 ? "tcp://[%s]:*" : "tcp://%s:*", host);
    if (zmq_bind(s, ep) != 0 || zmq_getsockopt(s, ZMQ_LAST_ENDPOINT, last, &ll) != 0) {
        KVB_LOGE("control: cannot bind %s: %s", ep, zmq_strerror(errno));
        zmq_close(s);
        return KVB_ERR_IO;
    }
    const char *colon = strrchr(last, ':');
    *port_p = (uint16_t)atoi(colon + 1);
    *sock_p = s;
    return KVB_OK;
}
