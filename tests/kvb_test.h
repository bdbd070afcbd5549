/* Minimal assertion helpers for kvbridge's C tests (one executable per test
 * file, run by CTest). A failed CHECK prints where and why and exits 1. */
#ifndef KVB_TEST_H
#define KVB_TEST_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <time.h>

/* Monotonic clock in seconds. */
static inline double kvb_test_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* One splitmix64 step of *state (any seed): test data and choices. */
static inline uint64_t kvb_test_splitmix(uint64_t *state)
{
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* A splitmix64 draw in [lo, hi]. */
static inline uint32_t kvb_test_range(uint64_t *state, uint32_t lo, uint32_t hi)
{
    return lo + (uint32_t)(kvb_test_splitmix(state) % (uint64_t)(hi - lo + 1));
}

/* One xorshift64 step of *state (seed it non-zero): test data and choices. */
static inline uint64_t kvb_test_xorshift(uint64_t *state)
{
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    return *state;
}

static inline int kvb_test_cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The names of dir's *.json files (a golden corpus), sorted, each
 * malloc'ed (the caller frees), at most cap of them; their count, or -1
 * when dir cannot be opened. */
static inline int kvb_test_json_files(const char *dir, char **names, size_t cap)
{
    DIR *dp = opendir(dir);
    struct dirent *de;
    size_t n = 0;
    if (dp == NULL)
        return -1;
    while ((de = readdir(dp)) != NULL && n < cap)
        if (strlen(de->d_name) > 5 && strcmp(de->d_name + strlen(de->d_name) - 5, ".json") == 0)
            names[n++] = strdup(de->d_name);
    closedir(dp);
    qsort(names, n, sizeof(names[0]), kvb_test_cmp_str);
    return (int)n;
}

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);               \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

#define CHECK_EQ(a, b)                                                                             \
    do {                                                                                           \
        long long a_ = (long long)(a), b_ = (long long)(b);                                        \
        if (a_ != b_) {                                                                            \
            fprintf(stderr, "%s:%d: CHECK_EQ failed: %s == %lld, %s == %lld\n", __FILE__,          \
                    __LINE__, #a, a_, #b, b_);                                                     \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

#define CHECK_STR_CONTAINS(hay, needle)                                                            \
    do {                                                                                           \
        const char *h_ = (hay), *n_ = (needle);                                                    \
        if (h_ == NULL || strstr(h_, n_) == NULL) {                                                \
            fprintf(stderr, "%s:%d: \"%s\" does not contain \"%s\"\n", __FILE__, __LINE__,         \
                    h_ ? h_ : "(null)", n_);                                                       \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

#define TEST_PASS(name) fprintf(stderr, "ok: %s\n", name)

#endif
