/* Passing the target's VMM descriptors to same-host writers over a Unix
 * domain socket (SCM_RIGHTS), so a writer needs no ptrace rights over the
 * target (pidfd_getfd's requirement). The target engine starts the server
 * with its first reply that names VMM allocations: an abstract-namespace
 * SOCK_SEQPACKET socket with a random name, served by one thread. Each such
 * reply (only ever sent to a writer that passed the same-host proof, and
 * with an engine secret the mutual authentication) carries the socket's name
 * and a fresh random ticket. A request must come from a process of our user
 * (SO_PEERCRED), name a live ticket (at most FDSRV_TICKETS kept, each for
 * FDSRV_TICKET_S seconds) and only descriptors the engine exports for VMM
 * regions now; then it gets duplicates of them (at most KVB_FDSRV_MAX_FDS
 * per message), else a refusal and nothing.
 *
 * request  "KVBFQ001" ticket[32] u32 n u32 fd[n]       (1 <= n <= 64)
 * answer   "KVBFA001" u32 status(0 granted, 1 refused) u32 n
 *          (granted: the n descriptors ride along as SCM_RIGHTS, in order) */
#include "engine/lane/cuda_ipc/cuda_ipc.h"

#include <errno.h>
#include <fcntl.h>
#include <openssl/rand.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#define FDSRV_TICKETS 64
#define FDSRV_TICKET_S 60
#define FDSRV_IO_MS 2000          /* a peer that stalls a request is dropped */
#define FDSRV_REQS_PER_CONN 4096u /* requests one connection may make */
#define REQ_MAGIC "KVBFQ001"
#define ANS_MAGIC "KVBFA001"
#define REQ_MAX (8 + KVB_HS_TICKET_LEN + 4 + 4 * KVB_FDSRV_MAX_FDS)
#define ANS_LEN (8 + 4 + 4)

typedef struct ticket {
    uint8_t v[KVB_HS_TICKET_LEN];
    uint64_t expires_ns; /* 0: unused */
} ticket_t;

struct kvb__fdsrv {
    kvb_engine_h eng;
    int fd, stop_fd;
    pthread_t thr;
    pthread_mutex_t mu; /* tickets */
    ticket_t tickets[FDSRV_TICKETS];
    unsigned next;
    uint8_t name[KVB_HS_FDSOCK_LEN]; /* abstract name, NUL-padded */
};

static socklen_t sun_of(const uint8_t name[KVB_HS_FDSOCK_LEN], struct sockaddr_un *sa)
{
    size_t n = strnlen((const char *)name, KVB_HS_FDSOCK_LEN);
    memset(sa, 0, sizeof(*sa));
    sa->sun_family = AF_UNIX;
    memcpy(sa->sun_path + 1, name, n); /* sun_path[0] = 0: abstract */
    return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + n);
}

static void timeouts(int fd)
{
    struct timeval tv = {FDSRV_IO_MS / 1000, (FDSRV_IO_MS % 1000) * 1000};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
}

static bool ticket_ok(kvb__fdsrv_t *s, const uint8_t *t)
{
    bool ok = false;
    uint64_t now = kvb__now_ns();
    pthread_mutex_lock(&s->mu);
    for (unsigned i = 0; i < FDSRV_TICKETS; i++)
        ok |=
            s->tickets[i].expires_ns > now && kvb__ct_equal(s->tickets[i].v, t, KVB_HS_TICKET_LEN);
    pthread_mutex_unlock(&s->mu);
    return ok;
}

/* Is fd one of the descriptors we export for a VMM region? seg_mu held. */
static bool exported(kvb_engine_h eng, int fd)
{
    for (size_t i = 0; i < eng->segs.n; i++) {
        const kvb__cuda_seg_t *cs = eng->segs.v[i].cuda;
        for (uint32_t k = 0; cs != NULL && cs->vmm && k < cs->vmm_n; k++)
            if (cs->vmm_fds[k] == fd)
                return true;
    }
    return false;
}

/* Answer one request on c: granted with the descriptors, or refused. The
 * descriptors are duplicated under seg_mu (an unregistration may close ours
 * the moment it is released) and closed once sent. */
static bool serve_one(kvb__fdsrv_t *s, int c, const uint8_t *req, ssize_t len)
{
    uint32_t n = 0;
    int dup_fds[KVB_FDSRV_MAX_FDS];
    uint32_t ndup = 0;
    bool ok = len >= 8 + KVB_HS_TICKET_LEN + 4 && memcmp(req, REQ_MAGIC, 8) == 0;
    if (ok) {
        memcpy(&n, req + 8 + KVB_HS_TICKET_LEN, 4);
        ok = n >= 1 && n <= KVB_FDSRV_MAX_FDS && (size_t)len == 8 + KVB_HS_TICKET_LEN + 4 + 4 * n &&
             ticket_ok(s, req + 8);
    }
    if (ok) {
        pthread_mutex_lock(&s->eng->seg_mu);
        for (uint32_t i = 0; ok && i < n; i++) {
            int32_t fd;
            memcpy(&fd, req + 8 + KVB_HS_TICKET_LEN + 4 + 4 * i, 4);
            ok = exported(s->eng, fd);
            int d = ok ? fcntl(fd, F_DUPFD_CLOEXEC, 0) : -1;
            ok = d >= 0;
            if (ok)
                dup_fds[ndup++] = d;
        }
        pthread_mutex_unlock(&s->eng->seg_mu);
    }
    uint8_t ans[ANS_LEN];
    uint32_t status = ok ? 0 : 1, cnt = ok ? n : 0;
    memcpy(ans, ANS_MAGIC, 8);
    memcpy(ans + 8, &status, 4);
    memcpy(ans + 12, &cnt, 4);
    struct iovec iov = {ans, sizeof(ans)};
    union {
        struct cmsghdr h;
        char b[CMSG_SPACE(sizeof(int) * KVB_FDSRV_MAX_FDS)];
    } ctl;
    struct msghdr m = {0};
    m.msg_iov = &iov;
    m.msg_iovlen = 1;
    if (ok) {
        memset(&ctl, 0, sizeof(ctl));
        m.msg_control = ctl.b;
        m.msg_controllen = CMSG_SPACE(sizeof(int) * n);
        struct cmsghdr *h = CMSG_FIRSTHDR(&m);
        h->cmsg_level = SOL_SOCKET;
        h->cmsg_type = SCM_RIGHTS;
        h->cmsg_len = CMSG_LEN(sizeof(int) * n);
        memcpy(CMSG_DATA(h), dup_fds, sizeof(int) * n);
    }
    bool sent = sendmsg(c, &m, MSG_NOSIGNAL) == (ssize_t)sizeof(ans);
    for (uint32_t i = 0; i < ndup; i++)
        close(dup_fds[i]);
    if (!ok)
        KVB_LOGW("engine %s: descriptor request refused (bad ticket, message or descriptor)",
                 s->eng->sid);
    return sent && ok;
}

static void serve_conn(kvb__fdsrv_t *s, int c)
{
    struct ucred cr;
    socklen_t cl = sizeof(cr);
    if (getsockopt(c, SOL_SOCKET, SO_PEERCRED, &cr, &cl) != 0 || cr.uid != geteuid()) {
        KVB_LOGW("engine %s: descriptor request from another user refused", s->eng->sid);
        return;
    }
    timeouts(c);
    uint8_t req[REQ_MAX + 1];
    for (unsigned i = 0; i < FDSRV_REQS_PER_CONN; i++) {
        ssize_t len = recv(c, req, sizeof(req), 0);
        if (len <= 0 || !serve_one(s, c, req, len))
            return; /* EOF, time-out, refused: the connection ends */
    }
}

static void *fdsrv_main(void *arg)
{
    kvb__fdsrv_t *s = arg;
    for (;;) {
        struct pollfd p[2] = {{s->fd, POLLIN, 0}, {s->stop_fd, POLLIN, 0}};
        if (poll(p, 2, -1) < 0 && errno != EINTR)
            break;
        if (p[1].revents)
            break;
        if (!(p[0].revents & POLLIN))
            continue;
        int c = accept4(s->fd, NULL, NULL, SOCK_CLOEXEC);
        if (c >= 0) {
            serve_conn(s, c);
            close(c);
        }
    }
    return NULL;
}

static kvb__fdsrv_t *fdsrv_start(kvb_engine_h eng)
{
    kvb__fdsrv_t *s = calloc(1, sizeof(*s));
    uint8_t rnd[8];
    if (s == NULL || RAND_bytes(rnd, sizeof(rnd)) != 1) {
        free(s);
        return NULL;
    }
    s->eng = eng;
    snprintf((char *)s->name, sizeof(s->name), "kvbridge-fd-%u-%02x%02x%02x%02x%02x%02x",
             (unsigned)getpid(), rnd[0], rnd[1], rnd[2], rnd[3], rnd[4], rnd[5]);
    struct sockaddr_un sa;
    socklen_t sl = sun_of(s->name, &sa);
    s->fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    s->stop_fd = eventfd(0, EFD_CLOEXEC);
    pthread_mutex_init(&s->mu, NULL);
    if (s->fd < 0 || s->stop_fd < 0 || bind(s->fd, (struct sockaddr *)&sa, sl) != 0 ||
        listen(s->fd, 16) != 0 || pthread_create(&s->thr, NULL, fdsrv_main, s) != 0) {
        KVB_LOGW("engine %s: no descriptor socket (%s): writers fetch descriptors with "
                 "pidfd_getfd",
                 eng->sid, strerror(errno));
        if (s->fd >= 0)
            close(s->fd);
        if (s->stop_fd >= 0)
            close(s->stop_fd);
        pthread_mutex_destroy(&s->mu);
        free(s);
        return NULL;
    }
    return s;
}

void kvb__fdsrv_ensure(kvb_engine_h eng)
{
    if (eng->fdsrv != NULL || eng->fdsrv_failed ||
        kvb__env_int("KVBRIDGE_CUDA_FD_SOCKET", NULL, 1, 0, 1) == 0)
        return;
    eng->fdsrv = fdsrv_start(eng);
    eng->fdsrv_failed = eng->fdsrv == NULL; /* logged; not tried again */
}

bool kvb__fdsrv_ticket(kvb_engine_h eng, uint8_t name[KVB_HS_FDSOCK_LEN],
                       uint8_t ticket[KVB_HS_TICKET_LEN])
{
    kvb__fdsrv_t *s = eng->fdsrv;
    memset(name, 0, KVB_HS_FDSOCK_LEN);
    memset(ticket, 0, KVB_HS_TICKET_LEN);
    if (s == NULL || RAND_bytes(ticket, KVB_HS_TICKET_LEN) != 1)
        return false;
    pthread_mutex_lock(&s->mu);
    s->tickets[s->next].expires_ns = kvb__now_ns() + FDSRV_TICKET_S * 1000000000ull;
    memcpy(s->tickets[s->next].v, ticket, KVB_HS_TICKET_LEN);
    s->next = (s->next + 1) % FDSRV_TICKETS;
    pthread_mutex_unlock(&s->mu);
    memcpy(name, s->name, KVB_HS_FDSOCK_LEN);
    return true;
}

void kvb__fdsrv_stop(kvb_engine_h eng)
{
    kvb__fdsrv_t *s = eng->fdsrv;
    uint64_t one = 1;
    if (s == NULL)
        return;
    if (write(s->stop_fd, &one, sizeof(one)) != sizeof(one))
        KVB_LOGW("engine %s: descriptor server stop: %s", eng->sid, strerror(errno));
    pthread_join(s->thr, NULL);
    close(s->fd);
    close(s->stop_fd);
    pthread_mutex_destroy(&s->mu);
    explicit_bzero(s->tickets, sizeof(s->tickets));
    free(s);
    eng->fdsrv = NULL;
}

/* ---- writer ---- */

static void close_all(int *fds, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++)
        if (fds[i] >= 0)
            close(fds[i]);
}

/* The answer's descriptors, exactly n of them, else none (all closed). */
static bool recv_fds(int c, uint32_t n, int *out, char *why, size_t wl)
{
    uint8_t ans[ANS_LEN + 1];
    union {
        struct cmsghdr h;
        char b[CMSG_SPACE(sizeof(int) * KVB_FDSRV_MAX_FDS)];
    } ctl;
    struct iovec iov = {ans, sizeof(ans)};
    struct msghdr m = {0};
    m.msg_iov = &iov;
    m.msg_iovlen = 1;
    m.msg_control = ctl.b;
    m.msg_controllen = sizeof(ctl.b);
    ssize_t len = recvmsg(c, &m, MSG_CMSG_CLOEXEC);
    uint32_t got = 0;
    int fds[KVB_FDSRV_MAX_FDS];
    for (struct cmsghdr *h = len >= 0 ? CMSG_FIRSTHDR(&m) : NULL; h != NULL;
         h = CMSG_NXTHDR(&m, h)) {
        if (h->cmsg_level != SOL_SOCKET || h->cmsg_type != SCM_RIGHTS)
            continue;
        size_t k = (h->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t i = 0; i < k; i++) { /* every descriptor received is ours to close */
            int fd;
            memcpy(&fd, CMSG_DATA(h) + i * sizeof(int), sizeof(int));
            if (got < KVB_FDSRV_MAX_FDS)
                fds[got++] = fd;
            else
                close(fd);
        }
    }
    uint32_t status = 1, cnt = 0;
    if (len == ANS_LEN && memcmp(ans, ANS_MAGIC, 8) == 0) {
        memcpy(&status, ans + 8, 4);
        memcpy(&cnt, ans + 12, 4);
    }
    if (len != ANS_LEN || (m.msg_flags & MSG_CTRUNC) || status != 0 || cnt != n || got != n) {
        close_all(fds, got);
        snprintf(why, wl, "the target's descriptor socket %s (%u of %u descriptors)",
                 len < 0       ? strerror(errno)
                 : status != 0 ? "refused the request"
                               : "answered badly",
                 got, n);
        return false;
    }
    memcpy(out, fds, n * sizeof(int));
    return true;
}

int kvb__fdsrv_connect(const uint8_t name[KVB_HS_FDSOCK_LEN], char *why, size_t wl)
{
    struct sockaddr_un sa;
    socklen_t sl = sun_of(name, &sa);
    int c = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    if (c >= 0 && connect(c, (struct sockaddr *)&sa, sl) == 0) {
        timeouts(c);
        return c;
    }
    snprintf(why, wl, "cannot reach the target's descriptor socket: %s", strerror(errno));
    if (c >= 0)
        close(c);
    return -1;
}

bool kvb__fdsrv_fetch(int c, const uint8_t ticket[KVB_HS_TICKET_LEN], const uint32_t *fdn,
                      uint32_t n, int *out, char *why, size_t wl)
{
    uint8_t req[REQ_MAX];
    if (n == 0 || n > KVB_FDSRV_MAX_FDS) {
        snprintf(why, wl, "%u descriptors in one request", n);
        return false;
    }
    memcpy(req, REQ_MAGIC, 8);
    memcpy(req + 8, ticket, KVB_HS_TICKET_LEN);
    memcpy(req + 8 + KVB_HS_TICKET_LEN, &n, 4);
    memcpy(req + 8 + KVB_HS_TICKET_LEN + 4, fdn, 4 * n);
    size_t len = 8 + KVB_HS_TICKET_LEN + 4 + 4 * n;
    if (send(c, req, len, MSG_NOSIGNAL) != (ssize_t)len) {
        snprintf(why, wl, "the target's descriptor socket: %s", strerror(errno));
        return false;
    }
    return recv_fds(c, n, out, why, wl);
}
