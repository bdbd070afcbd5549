/* Test helper: a target engine in a child process (exec of the test binary
 * with --target). Its destination buffer is a memfd shared with the parent,
 * so the parent verifies the bytes that arrived without another channel. */
#ifndef KVB_TEST_PEER_H
#define KVB_TEST_PEER_H

#include <kvbridge/engine.h>
#include <stdint.h>
#include <sys/types.h>

typedef struct test_peer {
    pid_t pid;
    int memfd;
    uint8_t *buf; /* parent's view of the destination buffer */
    size_t size;
    uint64_t remote_base; /* the address in the child's address space */
    char sid[128];
    int out_fd; /* child's stdin */
    int in_fd;  /* child's stdout */
} test_peer_t;

/* Start a target (port 0 = ephemeral) with a destination buffer of size
 * bytes; fills the buffer with fill first. Returns 0 on success. */
int test_peer_start(test_peer_t *p, const char *self, const char *transport, uint16_t port,
                    size_t size, uint8_t fill);
/* The child registers the second half of its buffer (only the first half is
 * registered at start). Returns the child's status code, -1 on I/O error. */
int test_peer_register_more(test_peer_t *p);
/* kill -9 and reap; keeps the memfd/buffer mapping. */
void test_peer_kill(test_peer_t *p);
void test_peer_stop(test_peer_t *p);

/* Child entry: argv = --target transport port memfd size. Never returns. */
int test_peer_main(int argc, char **argv);

kvb_transport_t test_transport(const char *name);

#endif
