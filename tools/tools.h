/* Shared helpers of the kvbridge CLI (tools/ uses the public API only). */
#ifndef KVB_TOOLS_H
#define KVB_TOOLS_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

/* Parse a decimal integer option value; prints an error naming opt and
 * returns false when it is not an integer in [min, max]. */
bool kvb_tool_parse_int(const char *opt, const char *val, long long min, long long max,
                        long long *out_p);

/* Monotonic seconds. */
double kvb_tool_now(void);

#endif
