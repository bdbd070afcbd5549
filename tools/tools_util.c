#include "tools.h"

#include <errno.h>
#include <stdlib.h>
#include <time.h>

bool kvb_tool_parse_int(const char *opt, const char *val, long long min, long long max,
                        long long *out_p)
{
    char *end = NULL;
    long long v;
    if (val == NULL) {
        fprintf(stderr, "kvbridge: %s needs a value\n", opt);
        return false;
    }
    errno = 0;
    v = strtoll(val, &end, 10);
    if (errno != 0 || end == val || *end != '\0' || v < min || v > max) {
        fprintf(stderr, "kvbridge: %s: '%s' is not an integer in [%lld, %lld]\n", opt, val, min,
                max);
        return false;
    }
    *out_p = v;
    return true;
}

double kvb_tool_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}
