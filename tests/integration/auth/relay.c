/* See relay.h. */
#include "relay.h"

#include "core/core.h"
#include "engine/handshake.h"
#include "kvb_test.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#define MAX_MSG (KVB_HS_MAX_MSG + 64)
#define SEAL_OFF 44 /* magic, total, MAC: where a sealed reply's reply starts */

static uint64_t deadline_s(double s)
{
    return kvb__now_ns() + (uint64_t)(s * 1e9);
}

/* The upstream reply with the substitute's worker address and segments:
 * what a relay needs to make the writer write to it instead. */
static uint8_t *substitute(const relay_t *r, const uint8_t *rep, size_t len, size_t *out_len)
{
    kvb__hs_reply_t up, sub;
    char why[256];
    uint8_t *out = NULL;
    CHECK_EQ(kvb__hs_reply_decode(rep, len, &up, why, sizeof(why)), KVB_OK);
    CHECK_EQ(kvb__hs_reply_decode(r->subst, r->subst_len, &sub, why, sizeof(why)), KVB_OK);
    kvb__hs_reply_t m = up;
    m.waddr = sub.waddr;
    m.waddr_len = sub.waddr_len;
    m.nseg = sub.nseg;
    m.segs = sub.segs;
    m.pid = 0;
    m.nshm = 0;
    CHECK_EQ(kvb__hs_reply_encode(&m, &out, out_len), KVB_OK);
    kvb__hs_reply_free(&up);
    kvb__hs_reply_free(&sub);
    return out;
}

/* A reply for the writer (plain, or sealed around a plain one), rewritten
 * when the relay has a substitute. Returns the message to forward. */
static uint8_t *on_reply(relay_t *r, uint8_t *msg, size_t *len)
{
    size_t off = memcmp(msg, "KVBHR001", 8) == 0 ? SEAL_OFF : 0, nl;
    if (r->subst == NULL || *len < off + 8 || memcmp(msg + off, "KVBHS002", 8) != 0)
        return msg;
    uint8_t *rep = substitute(r, msg + off, *len - off, &nl);
    uint8_t *out = malloc(off + nl);
    CHECK(out != NULL);
    memcpy(out, msg, off); /* the sealed header: MAC kept (the relay cannot make one) */
    memcpy(out + off, rep, nl);
    if (off > 0) {
        uint32_t total = (uint32_t)(off + nl);
        memcpy(out + 8, &total, 4); /* little-endian hosts only, as the tests run */
    }
    free(rep);
    free(msg);
    *len = off + nl;
    return out;
}

/* One framed handshake message from one side to the other; replies are
 * rewritten. false when either side closed or spoke out of turn. */
static bool forward_msg(relay_t *r, int from, int to, bool upstream, bool *replied)
{
    uint8_t *msg;
    size_t len;
    char why[256];
    if (kvb__sock_read_msg(from, NULL, MAX_MSG, deadline_s(5), &msg, &len, why, sizeof(why)) !=
        KVB_OK)
        return false;
    bool reply = upstream && (memcmp(msg, "KVBHS002", 8) == 0 || memcmp(msg, "KVBHR001", 8) == 0);
    if (reply) {
        msg = on_reply(r, msg, &len);
        /* Counted before it is forwarded: the writer may act on the reply
         * (and the test read the count) before this thread runs again. */
        *replied = true;
        __atomic_add_fetch(&r->replies_seen, 1, __ATOMIC_RELEASE);
    }
    bool ok = kvb__sock_write_all(to, msg, len, deadline_s(5)) == KVB_OK;
    free(msg);
    return ok;
}

static bool forward_raw(int from, int to)
{
    uint8_t b[256];
    ssize_t n = recv(from, b, sizeof(b), MSG_DONTWAIT);
    return n > 0 && kvb__sock_write_all(to, b, (size_t)n, deadline_s(5)) == KVB_OK;
}

static int accept_bounded(relay_t *r)
{
    while (!__atomic_load_n(&r->stop, __ATOMIC_ACQUIRE)) {
        struct pollfd p = {r->lfd, POLLIN, 0};
        if (poll(&p, 1, 50) > 0)
            return accept(r->lfd, NULL, NULL);
    }
    return -1;
}

static void *relay_main(void *arg)
{
    relay_t *r = arg;
    char host[64], why[256];
    uint16_t port;
    int ufd = -1, wfd = accept_bounded(r);
    bool replied = false;
    CHECK_EQ(kvb__sid_parse(r->upstream, host, sizeof(host), &port), KVB_OK);
    if (wfd >= 0 && kvb__sock_connect(host, port, deadline_s(5), &ufd, why, sizeof(why)) != KVB_OK)
        ufd = -1;
    while (wfd >= 0 && ufd >= 0 && !__atomic_load_n(&r->stop, __ATOMIC_ACQUIRE)) {
        struct pollfd p[2] = {{wfd, POLLIN, 0}, {ufd, POLLIN, 0}};
        if (poll(p, 2, 50) <= 0)
            continue;
        bool ok = true;
        if (p[0].revents)
            ok = replied ? forward_raw(wfd, ufd) : forward_msg(r, wfd, ufd, false, &replied);
        if (ok && p[1].revents)
            ok = replied ? forward_raw(ufd, wfd) : forward_msg(r, ufd, wfd, true, &replied);
        if (!ok)
            break;
    }
    if (wfd >= 0)
        close(wfd);
    if (ufd >= 0)
        close(ufd);
    __atomic_store_n(&r->closed, 1, __ATOMIC_RELEASE);
    return NULL;
}

void relay_start(relay_t *r, const char *upstream, const uint8_t *subst, size_t subst_len)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t al = sizeof(a);
    memset(r, 0, sizeof(*r));
    snprintf(r->upstream, sizeof(r->upstream), "%s", upstream);
    r->subst = subst;
    r->subst_len = subst_len;
    r->lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    CHECK(r->lfd >= 0 && bind(r->lfd, (struct sockaddr *)&a, sizeof(a)) == 0 &&
          listen(r->lfd, 4) == 0 && getsockname(r->lfd, (struct sockaddr *)&a, &al) == 0);
    snprintf(r->sid, sizeof(r->sid), "127.0.0.1:%u", ntohs(a.sin_port));
    CHECK_EQ(pthread_create(&r->thr, NULL, relay_main, r), 0);
}

void relay_cut(relay_t *r)
{
    if (__atomic_exchange_n(&r->stop, 1, __ATOMIC_ACQ_REL) == 0)
        pthread_join(r->thr, NULL);
}

void relay_stop(relay_t *r)
{
    relay_cut(r);
    if (r->lfd >= 0)
        close(r->lfd);
    r->lfd = -1;
}

uint8_t *relay_fetch_reply(const char *sid, size_t *len_p)
{
    char host[64], why[256];
    uint16_t port;
    int fd;
    uint8_t *req, *rep;
    size_t req_len;
    uint64_t dl = deadline_s(5);
    CHECK_EQ(kvb__sid_parse(sid, host, sizeof(host), &port), KVB_OK);
    CHECK_EQ(kvb__sock_connect(host, port, dl, &fd, why, sizeof(why)), KVB_OK);
    CHECK_EQ(kvb__hs_request_encode("127.0.0.1:1", 0, &req, &req_len), KVB_OK);
    CHECK_EQ(kvb__sock_write_all(fd, req, req_len, dl), KVB_OK);
    CHECK_EQ(kvb__sock_read_msg(fd, NULL, MAX_MSG, dl, &rep, len_p, why, sizeof(why)), KVB_OK);
    CHECK(memcmp(rep, "KVBHS002", 8) == 0);
    free(req);
    close(fd);
    return rep;
}
