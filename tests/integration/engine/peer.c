#include "peer.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

kvb_transport_t test_transport(const char *name)
{
    if (strcmp(name, "tcp") == 0)
        return KVB_TRANSPORT_TCP;
    if (strcmp(name, "shm") == 0)
        return KVB_TRANSPORT_SHM;
    return KVB_TRANSPORT_AUTO;
}

int test_peer_main(int argc, char **argv)
{
    kvb_engine_params_t prm = {0};
    kvb_engine_h eng;
    if (argc < 6)
        return 2;
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    int memfd = atoi(argv[4]);
    size_t size = strtoull(argv[5], NULL, 10);
    uint8_t *buf = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0);
    if (buf == MAP_FAILED)
        return 3;
    prm.field_mask = KVB_ENGINE_PARAM_TRANSPORT | KVB_ENGINE_PARAM_PORT;
    prm.transport = test_transport(argv[2]);
    prm.port = (uint16_t)atoi(argv[3]);
    if (kvb_engine_create(&prm, &eng) != KVB_OK)
        return 4;
    /* The first half is registered now, the second on the "more" command. */
    if (kvb_engine_register(eng, buf, size / 2, KVB_MEM_HOST) != KVB_OK)
        return 5;
    printf("ready %s %llx\n", kvb_engine_session_id(eng), (unsigned long long)(uintptr_t)buf);
    fflush(stdout);
    char c;
    while (read(0, &c, 1) > 0) {
        if (c == 'm') {
            kvb_status_t st =
                kvb_engine_register(eng, buf + size / 2, size - size / 2, KVB_MEM_HOST);
            printf("more %d\n", (int)st);
            fflush(stdout);
        }
    }
    kvb_engine_destroy(eng);
    return 0;
}

static int read_line(int fd, char *line, size_t cap)
{
    size_t n = 0;
    while (n + 1 < cap) {
        ssize_t r = read(fd, line + n, 1);
        if (r <= 0) {
            line[n] = '\0';
            return -1;
        }
        if (line[n] == '\n')
            break;
        n++;
    }
    line[n] = '\0';
    return 0;
}

/* Read the child's lines until one starts with want (UCX logs to stdout
 * too: those are passed on to stderr, at most 32). 0 when found. */
static int read_reply(test_peer_t *p, int fd, const char *want, char *line, size_t cap)
{
    int rc, lines = 0;
    while ((rc = read_line(fd, line, cap)) == 0 && strncmp(line, want, strlen(want)) != 0 &&
           ++lines < 32)
        fprintf(stderr, "peer: %s\n", line);
    if (rc == 0 && strncmp(line, want, strlen(want)) == 0)
        return 0;
    int status = 0;
    pid_t w = waitpid(p->pid, &status, WNOHANG);
    fprintf(stderr, "peer: no '%s' reply (last line '%s', read %d, child %s %d)\n", want, line, rc,
            w == p->pid ? "exited, status" : "still running, pid", w == p->pid ? status : p->pid);
    return -1;
}

int test_peer_start(test_peer_t *p, const char *self, const char *transport, uint16_t port,
                    size_t size, uint8_t fill)
{
    int out[2], in[2];
    char fds[16], sizes[32], ports[16], line[256];
    if (p->buf == NULL) {
        p->memfd = memfd_create("kvb-test-peer", 0);
        if (p->memfd < 0 || ftruncate(p->memfd, (off_t)size) != 0)
            return -1;
        p->buf = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, p->memfd, 0);
        p->size = size;
    }
    memset(p->buf, fill, size);
    if (pipe(out) != 0 || pipe(in) != 0)
        return -1;
    snprintf(fds, sizeof(fds), "%d", p->memfd);
    snprintf(sizes, sizeof(sizes), "%zu", size);
    snprintf(ports, sizeof(ports), "%u", port);
    p->pid = fork();
    if (p->pid == 0) {
        dup2(in[0], 0);
        dup2(out[1], 1);
        close(in[1]);
        close(out[0]);
        execl(self, self, "--target", transport, ports, fds, sizes, (char *)NULL);
        _exit(127);
    }
    close(in[0]);
    close(out[1]);
    p->out_fd = in[1]; /* closing it tells the child to exit */
    unsigned long long base;
    p->in_fd = out[0];
    if (read_reply(p, out[0], "ready ", line, sizeof(line)) != 0 ||
        sscanf(line, "ready %127s %llx", p->sid, &base) != 2)
        return -1;
    p->remote_base = base;
    return 0;
}

int test_peer_register_more(test_peer_t *p)
{
    char line[256];
    int st = -1;
    if (write(p->out_fd, "m", 1) != 1 ||
        read_reply(p, p->in_fd, "more ", line, sizeof(line)) != 0 ||
        sscanf(line, "more %d", &st) != 1)
        return -1;
    return st;
}

void test_peer_kill(test_peer_t *p)
{
    if (p->pid > 0) {
        kill(p->pid, SIGKILL);
        waitpid(p->pid, NULL, 0);
        p->pid = 0;
        close(p->out_fd);
        close(p->in_fd);
    }
}

void test_peer_stop(test_peer_t *p)
{
    if (p->pid > 0) {
        close(p->out_fd);
        close(p->in_fd);
        waitpid(p->pid, NULL, 0);
        p->pid = 0;
    }
}
