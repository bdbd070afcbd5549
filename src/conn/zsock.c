/* ZeroMQ plumbing of the control channel: one PULL socket per rank, PUSH
 * sockets cached per endpoint (the seeds' _connect cache), each with its own
 * lock because ZeroMQ sockets are not thread-safe. */
#include "conn/conn_int.h"

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

void kvb__zcache_init(kvb__zcache_t *c, void *zctx)
{
    c->zctx = zctx;
    c->head = NULL;
    pthread_mutex_init(&c->mu, NULL);
}

void kvb__zcache_free(kvb__zcache_t *c)
{
    for (kvb__zpush_t *p = c->head, *next; p != NULL; p = next) {
        next = p->next;
        zmq_close(p->sock);
        pthread_mutex_destroy(&p->mu);
        free(p);
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
    pthread_mutex_lock(&c->mu);
    for (p = c->head; p != NULL; p = p->next)
        if (strcmp(p->endpoint, ep) == 0)
            break;
    if (p == NULL && (p = calloc(1, sizeof(*p))) != NULL) {
        snprintf(p->endpoint, sizeof(p->endpoint), "%s", ep);
        p->sock = zmq_socket(c->zctx, ZMQ_PUSH);
        if (p->sock != NULL) {
            zmq_setsockopt(p->sock, ZMQ_LINGER, &zero, sizeof(zero));
            zmq_setsockopt(p->sock, ZMQ_SNDHWM, &hwm, sizeof(hwm));
            zmq_setsockopt(p->sock, ZMQ_IPV6, &v6, sizeof(v6));
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
        }
    }
    pthread_mutex_unlock(&c->mu);
    return p;
}

kvb_status_t kvb__zsend(kvb__zcache_t *c, const char *ip, uint16_t port,
                        const kvb__frames_buf_t *msg)
{
    kvb__zpush_t *p = push_get(c, ip, port);
    kvb_status_t st = KVB_OK;
    if (p == NULL)
        return KVB_ERR_PEER;
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
    return st;
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

kvb_status_t kvb__zbind_pull(void *zctx, const char *host, void **sock_p, uint16_t *port_p)
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
