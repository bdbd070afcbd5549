/* `kvbridge bench` driver: a queue of command bytes per child, written
 * without blocking. The driver must never block writing a command: a child
 * blocked writing its answers to a full stdout pipe would then wait for a
 * driver that waits for it (10k rooms in flight deadlocked that way). */
#include "bench_common.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* What the queue of one child may hold before the driver gives up on it:
 * 10k rooms x a few commands x ~40 B is under 2 MiB. */
#define OUTQ_MAX ((size_t)64 << 20)

bool bench_outq_put(bench_outq_t *q, int fd, const char *line, size_t n)
{
    if (q->off > 0 && q->off == q->len)
        q->off = q->len = 0;
    if (q->len + n > q->cap) {
        if (q->off > 0) { /* compact before growing */
            memmove(q->buf, q->buf + q->off, q->len - q->off);
            q->len -= q->off;
            q->off = 0;
        }
        size_t cap = q->cap ? q->cap : 4096;
        while (cap < q->len + n)
            cap *= 2;
        if (cap > OUTQ_MAX)
            return false;
        char *b = cap > q->cap ? realloc(q->buf, cap) : q->buf;
        if (b == NULL)
            return false;
        q->buf = b;
        q->cap = cap;
    }
    memcpy(q->buf + q->len, line, n);
    q->len += n;
    size_t held = q->len - q->off;
    q->max_held = held > q->max_held ? held : q->max_held;
    return bench_outq_flush(q, fd) >= 0;
}

int bench_outq_flush(bench_outq_t *q, int fd)
{
    while (q->off < q->len) {
        ssize_t w = write(fd, q->buf + q->off, q->len - q->off);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return 1; /* the pipe is full: later, when poll says POLLOUT */
        if (w <= 0)
            return -1;
        q->off += (size_t)w;
    }
    q->off = q->len = 0;
    return 0;
}

bool bench_outq_pending(const bench_outq_t *q)
{
    return q->off < q->len;
}

void bench_outq_free(bench_outq_t *q)
{
    free(q->buf);
    memset(q, 0, sizeof(*q));
}
