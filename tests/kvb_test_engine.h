/* Engine-level test pieces (no manager, nothing more to link): an engine on
 * a transport with its copy threads, an "end" (an engine and one registered
 * buffer, malloc or kvb_mem_alloc memory), a whole-buffer write, a timed
 * write, a byte check. Connector tests use the cluster harness (tests/harness) instead. */
#ifndef KVB_TEST_ENGINE_H
#define KVB_TEST_ENGINE_H

#include <kvbridge/engine.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kvb_test.h"

/* Every byte of p[0..n) is v? */
static inline bool kvb_test_all(const uint8_t *p, size_t n, uint8_t v)
{
    for (size_t i = 0; i < n; i++)
        if (p[i] != v)
            return false;
    return true;
}

/* An engine on transport tr with copy_threads direct-lane copy threads (0:
 * the message lane only). */
static inline kvb_engine_h kvb_test_engine(kvb_transport_t tr, unsigned copy_threads)
{
    kvb_engine_params_t p = {0};
    kvb_engine_h e;
    p.field_mask = KVB_ENGINE_PARAM_TRANSPORT | KVB_ENGINE_PARAM_COPY_THREADS;
    p.transport = tr;
    p.copy_threads = copy_threads;
    CHECK_EQ(kvb_engine_create(&p, &e), KVB_OK);
    return e;
}

typedef struct kvb_test_end {
    kvb_engine_h eng;
    uint8_t *buf;
    size_t len;
    bool shared; /* kvb_mem_alloc memory (the direct lane's), else malloc */
} kvb_test_end_t;

/* Engine e (the end owns it now) with len bytes of fill registered. */
static inline kvb_test_end_t kvb_test_end(kvb_engine_h e, size_t len, uint8_t fill, bool shared)
{
    kvb_test_end_t x = {e, NULL, len, shared};
    if (shared)
        CHECK_EQ(kvb_mem_alloc(len, (void **)&x.buf), KVB_OK);
    else
        CHECK((x.buf = malloc(len)) != NULL);
    memset(x.buf, fill, len);
    CHECK_EQ(kvb_engine_register(e, x.buf, len, KVB_MEM_HOST), KVB_OK);
    return x;
}

/* Destroys the engine, then frees the buffer. */
static inline void kvb_test_end_free(kvb_test_end_t *x)
{
    kvb_engine_destroy(x->eng);
    if (x->shared)
        kvb_mem_free(x->buf);
    else
        free(x->buf);
    memset(x, 0, sizeof(*x));
}

/* All of w's buffer to dst (in a registration of session sid). */
static inline kvb_status_t kvb_test_end_write(const kvb_test_end_t *w, const char *sid,
                                              const void *dst, double timeout_s)
{
    kvb_block_t b = {(uint64_t)(uintptr_t)w->buf, (uint64_t)(uintptr_t)dst, w->len};
    return kvb_engine_write(w->eng, sid, &b, 1, timeout_s);
}

/* A write timed: its status, *took_p its seconds; both printed after what,
 * with the engine's last error. */
static inline kvb_status_t kvb_test_write_timed(kvb_engine_h e, const char *sid,
                                                const kvb_block_t *b, size_t n, double timeout_s,
                                                const char *what, double *took_p)
{
    double t0 = kvb_test_now_s();
    kvb_status_t st = kvb_engine_write(e, sid, b, n, timeout_s);
    *took_p = kvb_test_now_s() - t0;
    fprintf(stderr, "%s: %s after %.3f s (%s)\n", what, kvb_status_string(st), *took_p,
            kvb_engine_last_error(e));
    return st;
}

#endif
