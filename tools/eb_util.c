/* engine-bench helpers: patterns, checksums, permutations, target channel. */
#include "eb_util.h"

#include <kvbridge/engine.h>

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tools.h"

extern char **environ;

void *kvb_eb_alloc(size_t bytes)
{
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE,
                   -1, 0);
    if (p == MAP_FAILED)
        return NULL;
    /* MAP_POPULATE may map the shared zero page lazily; write to own pages. */
    memset(p, 0, bytes);
    return p;
}

void *kvb_eb_alloc_shared(size_t bytes)
{
    void *p = NULL;
    if (kvb_mem_alloc(bytes, &p) != KVB_OK)
        return NULL;
    memset(p, 0, bytes); /* fault the pages in now, outside any timed window */
    return p;
}

void kvb_eb_free_shared(void *p)
{
    if (p != NULL)
        kvb_mem_free(p);
}

void kvb_eb_free(void *p, size_t bytes)
{
    if (p != NULL)
        munmap(p, bytes);
}

void kvb_eb_fill(void *buf, size_t bytes, uint64_t seed)
{
    uint64_t *w = buf;
    uint64_t s = (seed + 1) * 0xC2B2AE3D27D4EB4Full;
    for (size_t i = 0; i < bytes / 8; i++) {
        uint64_t x = (i ^ s) * 0x9E3779B97F4A7C15ull;
        w[i] = x ^ (x >> 29);
    }
}

uint64_t kvb_eb_cksum(const void *p, size_t len, uint64_t word_base)
{
    const unsigned char *b = p;
    uint64_t sum = 0;
    for (size_t i = 0; i < len / 8; i++) {
        uint64_t w;
        memcpy(&w, b + i * 8, 8);
        uint64_t x = (w ^ ((word_base + i) * 0xD6E8FEB86659FD93ull)) * 0xFF51AFD7ED558CCDull;
        sum += x ^ (x >> 32);
    }
    return sum;
}

static uint64_t splitmix(uint64_t *state)
{
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

void kvb_eb_permute(uint32_t *perm, size_t n, uint64_t seed)
{
    uint64_t st = seed;
    for (size_t i = 0; i < n; i++)
        perm[i] = (uint32_t)i;
    for (size_t i = n; i > 1; i--) {
        size_t j = (size_t)(((unsigned __int128)splitmix(&st) * i) >> 64);
        uint32_t t = perm[i - 1];
        perm[i - 1] = perm[j];
        perm[j] = t;
    }
}

static void close_pair(int p[2])
{
    if (p[0] >= 0)
        close(p[0]);
    if (p[1] >= 0)
        close(p[1]);
}

bool kvb_eb_spawn(kvb_eb_chan_t *ch, const char *exe, char *const argv[])
{
    int in[2] = {-1, -1}, out[2] = {-1, -1};
    posix_spawn_file_actions_t fa;
    int rc;
    ch->pid = -1;
    ch->rfd = ch->wfd = -1;
    ch->len = 0;
    if (pipe2(in, O_CLOEXEC) != 0 || pipe2(out, O_CLOEXEC) != 0) {
        fprintf(stderr, "kvbridge: pipe: %s\n", strerror(errno));
        goto undo_pipes;
    }
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, in[0], 0);
    posix_spawn_file_actions_adddup2(&fa, out[1], 1);
    rc = posix_spawn(&ch->pid, exe, &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    if (rc != 0) {
        fprintf(stderr, "kvbridge: cannot start %s: %s\n", exe, strerror(rc));
        ch->pid = -1;
        goto undo_pipes;
    }
    close(in[0]);
    close(out[1]);
    ch->wfd = in[1];
    ch->rfd = out[0];
    return true;
undo_pipes:
    close_pair(in);
    close_pair(out);
    return false;
}

bool kvb_eb_send(kvb_eb_chan_t *ch, const char *fmt, ...)
{
    char line[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof(line) - 1, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= sizeof(line) - 1 || ch->wfd < 0)
        return false;
    line[n++] = '\n';
    for (int off = 0; off < n;) {
        ssize_t w = write(ch->wfd, line + off, (size_t)(n - off));
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return false;
        off += (int)w;
    }
    return true;
}

/* Move the first line out of ch->buf if there is one. */
static bool take_line(kvb_eb_chan_t *ch, char *line, size_t cap, bool *too_long_p)
{
    char *nl = memchr(ch->buf, '\n', ch->len);
    if (nl == NULL)
        return false;
    size_t n = (size_t)(nl - ch->buf);
    *too_long_p = n >= cap;
    if (!*too_long_p) {
        memcpy(line, ch->buf, n);
        line[n] = '\0';
    }
    ch->len -= n + 1;
    memmove(ch->buf, nl + 1, ch->len);
    return true;
}

bool kvb_eb_recv(kvb_eb_chan_t *ch, char *line, size_t cap, double timeout_s)
{
    double deadline = kvb_tool_now() + timeout_s;
    bool too_long = false;
    while (!take_line(ch, line, cap, &too_long)) {
        double left = deadline - kvb_tool_now();
        struct pollfd pfd = {.fd = ch->rfd, .events = POLLIN};
        if (ch->len == sizeof(ch->buf) || left <= 0 || ch->rfd < 0) {
            snprintf(line, cap, ch->len == sizeof(ch->buf) ? "line too long" : "timed out");
            return false;
        }
        int pr = poll(&pfd, 1, (int)(left * 1000) + 1);
        if (pr < 0 && errno == EINTR)
            continue;
        if (pr <= 0)
            continue;
        ssize_t r = read(ch->rfd, ch->buf + ch->len, sizeof(ch->buf) - ch->len);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            snprintf(line, cap, "target exited (end of its output)");
            return false;
        }
        ch->len += (size_t)r;
    }
    if (too_long)
        snprintf(line, cap, "line too long");
    return !too_long;
}

static bool reap_within(pid_t pid, double grace_s, int *status_p)
{
    double deadline = kvb_tool_now() + grace_s;
    for (;;) {
        pid_t r = waitpid(pid, status_p, WNOHANG);
        if (r == pid || (r < 0 && errno != EINTR))
            return r == pid;
        if (kvb_tool_now() >= deadline)
            return false;
        struct timespec ts = {0, 5 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
}

int kvb_eb_stop(kvb_eb_chan_t *ch, double grace_s)
{
    int status = -1;
    if (ch->pid > 0) {
        if (grace_s > 0)
            kvb_eb_send(ch, "quit");
        if (grace_s <= 0 || !reap_within(ch->pid, grace_s, &status)) {
            kill(ch->pid, SIGKILL);
            while (waitpid(ch->pid, &status, 0) < 0 && errno == EINTR)
                ;
        }
        ch->pid = -1;
    }
    if (ch->rfd >= 0)
        close(ch->rfd);
    if (ch->wfd >= 0)
        close(ch->wfd);
    ch->rfd = ch->wfd = -1;
    return status;
}
