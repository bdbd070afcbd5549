/* Checks shared by the control-frame fuzz harnesses (fuzz_frames.c,
 * fuzz_frames26.c, fuzz_frames_ts.c): abort with a message on a broken
 * property. Define FUZZ_NAME (the harness, for messages) before including. */
#ifndef KVB_FUZZ_FRAMES_UTIL_H
#define KVB_FUZZ_FRAMES_UTIL_H

#include "dialect/sglang2025/frames.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static inline void die(const char *what)
{
    fprintf(stderr, "%s: %s\n", FUZZ_NAME, what);
    abort();
}

/* A rejection's reason: non-empty, terminated, one printable line. */
static inline void check_reason_text(const char *reason, size_t cap)
{
    size_t len = strnlen(reason, cap);
    if (len == 0 || len == cap)
        die("rejection without a terminated reason");
    for (size_t i = 0; i < len; i++)
        if ((unsigned char)reason[i] < 0x20 || (unsigned char)reason[i] > 0x7e)
            die("reason carries a non-printable byte");
}

static inline void check_reason(const kvb__frames_err_t *e)
{
    check_reason_text(e->reason, sizeof(e->reason));
}

/* The frames of b as an array (caller frees). */
static inline kvb__frame_t *frames_of(const kvb__frames_buf_t *b)
{
    kvb__frame_t *f = malloc((b->n + 1) * sizeof(*f));
    if (f == NULL)
        die("out of memory");
    for (size_t i = 0; i < b->n; i++)
        f[i] = kvb__frames_buf_get(b, i);
    return f;
}

/* Two encodings are byte for byte and frame for frame the same. */
static inline void same_bytes(const kvb__frames_buf_t *a, const kvb__frames_buf_t *b)
{
    if (a->n != b->n || a->len != b->len || (a->len && memcmp(a->data, b->data, a->len) != 0))
        die("re-encoding is not idempotent");
    for (size_t i = 0; i < a->n; i++)
        if (a->ends[i] != b->ends[i])
            die("re-encoding moves a frame boundary");
}

/* An encoding is exactly the n input frames f. */
static inline void same_frames(const kvb__frames_buf_t *b, const kvb__frame_t *f, size_t n)
{
    if (b->n != n)
        die("re-encode gives a different frame count");
    for (size_t i = 0; i < n; i++) {
        kvb__frame_t g = kvb__frames_buf_get(b, i);
        if (g.len != f[i].len || (g.len && memcmp(g.data, f[i].data, g.len) != 0))
            die("re-encode gives different frame bytes");
    }
}

#endif
