/* engine-bench raw TCP baseline: one plain stream over loopback, the yardstick
 * of the engine's tcp lane. */
#include "eb_util.h"

#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "tools.h"

#define EB_IO_CHUNK (16u << 20)

static struct addrinfo *resolve(const char *host, uint16_t port, bool passive)
{
    struct addrinfo hints, *ai = NULL;
    char ps[16];
    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICSERV | (passive ? AI_PASSIVE : 0);
    snprintf(ps, sizeof(ps), "%u", (unsigned)port);
    int rc = getaddrinfo(host, ps, &hints, &ai);
    if (rc != 0) {
        fprintf(stderr, "kvbridge: resolve %s: %s\n", host, gai_strerror(rc));
        return NULL;
    }
    return ai;
}

static uint16_t bound_port(int fd)
{
    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss);
    if (getsockname(fd, (struct sockaddr *)&ss, &sl) != 0)
        return 0;
    if (ss.ss_family == AF_INET6)
        return ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
    return ntohs(((struct sockaddr_in *)&ss)->sin_port);
}

int kvb_eb_listen(const char *host, uint16_t *port_p)
{
    struct addrinfo *ai = resolve(host, 0, true);
    int fd = -1, one = 1;
    if (ai == NULL)
        return -1;
    fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) != 0 ||
        bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || listen(fd, 4) != 0) {
        fprintf(stderr, "kvbridge: tcp sink on %s: %s\n", host, strerror(errno));
        if (fd >= 0)
            close(fd);
        fd = -1;
    } else {
        *port_p = bound_port(fd);
    }
    freeaddrinfo(ai);
    return fd;
}

static bool recv_exact(int fd, char *buf, size_t bytes)
{
    size_t got = 0;
    while (got < bytes) {
        size_t want = bytes - got < EB_IO_CHUNK ? bytes - got : EB_IO_CHUNK;
        ssize_t r = recv(fd, buf + got, want, 0);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return false;
        got += (size_t)r;
    }
    return true;
}

bool kvb_eb_sink_one(int lfd, void *buf, size_t bytes)
{
    int fd;
    while ((fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC)) < 0 && errno == EINTR)
        ;
    if (fd < 0)
        return false;
    bool ok = recv_exact(fd, buf, bytes) && send(fd, "k", 1, MSG_NOSIGNAL) == 1;
    close(fd);
    return ok;
}

static bool send_all(int fd, const char *buf, size_t bytes)
{
    size_t off = 0;
    while (off < bytes) {
        ssize_t w = send(fd, buf + off, bytes - off, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return false;
        off += (size_t)w;
    }
    return true;
}

static int connect_to(struct addrinfo *ai)
{
    int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd >= 0 && connect(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
        close(fd);
        fd = -1;
    }
    return fd;
}

bool kvb_eb_send_stream(const char *host, uint16_t port, const void *buf, size_t bytes,
                        double *seconds_p)
{
    struct addrinfo *ai = resolve(host, port, false);
    char ack = 0;
    if (ai == NULL)
        return false;
    double t0 = kvb_tool_now();
    int fd = connect_to(ai);
    freeaddrinfo(ai);
    if (fd < 0) {
        fprintf(stderr, "kvbridge: tcp connect %s:%u: %s\n", host, (unsigned)port, strerror(errno));
        return false;
    }
    bool ok = send_all(fd, buf, bytes) && recv_exact(fd, &ack, 1);
    double t1 = kvb_tool_now();
    close(fd);
    if (ok)
        *seconds_p = t1 - t0;
    return ok;
}
