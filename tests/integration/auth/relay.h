/* A man in the middle of the engine handshake, for the auth tests: a TCP
 * listener that takes one writer connection, opens its own connection to an
 * upstream listener and forwards the handshake message by message (then raw
 * bytes: the control connection's notices), optionally rewriting the reply.
 * It speaks only the framing ("KVBH" magic, u32 total), so it also runs
 * against older handshake versions. One relay serves one connection. */
#ifndef KVB_TEST_RELAY_H
#define KVB_TEST_RELAY_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

typedef struct relay {
    int lfd;
    char sid[64];         /* where writers connect ("127.0.0.1:port") */
    char upstream[64];    /* the real listener's session id */
    const uint8_t *subst; /* a plain reply whose worker address and segments replace
                             the upstream reply's (NULL: forward unchanged) */
    size_t subst_len;
    pthread_t thr;
    int stop;         /* atomic */
    int replies_seen; /* atomic: replies forwarded to the writer */
    int closed;       /* atomic: both connections closed */
} relay_t;

void relay_start(relay_t *r, const char *upstream, const uint8_t *subst, size_t subst_len);
/* Close both connections now (the writer's control connection ends). */
void relay_cut(relay_t *r);
void relay_stop(relay_t *r);

/* The plain reply of a listener without a secret (a raw request; the
 * listener must have no shared-file segments, so it answers at once).
 * malloc'ed. */
uint8_t *relay_fetch_reply(const char *sid, size_t *len_p);

#endif
