/* Helpers of `kvbridge engine-bench`: data patterns and checksums, the pipe
 * channel to the target process, and the raw TCP baseline. CLI-internal. */
#ifndef KVB_EB_UTIL_H
#define KVB_EB_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* ---- data ---- */

/* Page-aligned, pre-faulted anonymous memory; NULL on failure. */
void *kvb_eb_alloc(size_t bytes);
void kvb_eb_free(void *p, size_t bytes);
/* The same from kvb_mem_alloc: writers on this host can map it (direct lane). */
void *kvb_eb_alloc_shared(size_t bytes);
void kvb_eb_free_shared(void *p);

/* Fill buf (bytes % 8 == 0) with a pattern that depends on seed and on the
 * word index, so a block placed at the wrong offset is detected. */
void kvb_eb_fill(void *buf, size_t bytes, uint64_t seed);

/* Position-keyed checksum of len bytes (len % 8 == 0) that sit at word index
 * word_base of the destination. Sums of checksums over disjoint ranges equal
 * the checksum of their union, so it can be built block by block. */
uint64_t kvb_eb_cksum(const void *p, size_t len, uint64_t word_base);

/* perm[0..n) = a permutation of 0..n-1 drawn from seed (Fisher-Yates). */
void kvb_eb_permute(uint32_t *perm, size_t n, uint64_t seed);

/* ---- pipe channel to the target ---- */

typedef struct kvb_eb_chan {
    pid_t pid; /* -1 when no child */
    int rfd;   /* child's stdout */
    int wfd;   /* child's stdin */
    size_t len;
    char buf[512];
} kvb_eb_chan_t;

/* Start `exe argv[1..]` with its stdin/stdout on pipes; stderr inherited. */
bool kvb_eb_spawn(kvb_eb_chan_t *ch, const char *exe, char *const argv[]);

/* Send one line (a '\n' is appended). False if the child is gone. */
bool kvb_eb_send(kvb_eb_chan_t *ch, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Read one line (without '\n') within timeout_s. False on EOF, timeout or a
 * line longer than cap; the reason is written into line. */
bool kvb_eb_recv(kvb_eb_chan_t *ch, char *line, size_t cap, double timeout_s);

/* Stop the child: "quit", wait up to grace_s, then SIGKILL; always reaps.
 * Returns the exit status as waitpid reports it (or -1). */
int kvb_eb_stop(kvb_eb_chan_t *ch, double grace_s);

/* ---- raw TCP baseline ---- */

/* Listening socket on host, ephemeral port; -1 on error. */
int kvb_eb_listen(const char *host, uint16_t *port_p);

/* Sink side: accept one connection, recv exactly bytes into buf in large
 * reads, reply one byte, close. */
bool kvb_eb_sink_one(int lfd, void *buf, size_t bytes);

/* Source side: connect to host:port, send bytes with large send() calls and
 * wait for the one-byte reply. *seconds_p = connect → reply. */
bool kvb_eb_send_stream(const char *host, uint16_t port, const void *buf, size_t bytes,
                        double *seconds_p);

#endif
