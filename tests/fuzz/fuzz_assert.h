/* Invariant check of the fuzz harnesses: prints the failed condition and
 * aborts (libFuzzer then saves the input as a crash). */
#ifndef KVB_FUZZ_ASSERT_H
#define KVB_FUZZ_ASSERT_H

#include <stdio.h>
#include <stdlib.h>

#define FUZZ_ASSERT(c)                                                                             \
    do {                                                                                           \
        if (!(c)) {                                                                                \
            fprintf(stderr, "fuzz invariant failed: %s (%s:%d)\n", #c, __FILE__, __LINE__);        \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

#endif
