/* Two network namespaces joined by a veth pair, for the tests of what
 * crosses a link (a cut, a reset): test_fault8_netcut, test_sendorder_*.
 * The names carry a tag and this process's id; every way out (exit, the
 * signals a test dies of, a watchdog alarm) kills the registered children
 * and deletes them, and namespaces left by dead test processes of the same
 * tag are removed first. Root only: where they cannot be made, the test is
 * skipped (exit 77, the reason on stderr). Single-threaded parent. */
#ifndef KVB_TEST_NETNS_H
#define KVB_TEST_NETNS_H

#include "harness/kvb_cluster.h"

#include <stddef.h>

typedef struct kvbh_netns {
    char nsA[32], nsB[32]; /* <tag>A_<pid>, <tag>B_<pid> */
    char vA[16], vB[16];   /* the veth ends in them, <tag>a<pid>, <tag>b<pid> */
} kvbh_netns_t;

extern kvbh_netns_t kvbh_ns; /* valid after kvbh_netns_make */

/* system(3) of the formatted command: its exit status, -1, or 128 for a
 * signal. */
int kvbh_sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* In a child: join namespace name as `ip netns exec` does (setns, then a
 * private mount namespace with sysfs remounted, so /sys/class/net, where
 * UCX's tcp transport looks for devices, shows its interfaces). 0, or -1
 * with the reason on stderr after who. */
int kvbh_netns_join(const char *who, const char *name);

/* In the parent: both namespaces (tag: at most 5 characters), lo up, the
 * veth pair with ipA/24 in A and ipB/24 in B, up; children[0..n) killed
 * at clean-up; alarm(watchdog_s) (below the CTest time-out) cleans up and
 * dies. Skips the test where any step fails. Then add what the test needs
 * (a qdisc) and wait for the carrier. */
void kvbh_netns_make(const char *who, const char *tag, const char *ipA, const char *ipB,
                     unsigned watchdog_s, kvbh_child_t *const *children, size_t n);

/* Both veth ends report carrier (state UP) within timeout_s: 0, else -1. */
int kvbh_netns_wait_carrier(double timeout_s);

/* Kill the registered children, delete the namespaces (also at exit and
 * on the signals; idempotent). */
void kvbh_netns_cleanup(void);

/* The reason on stderr after who, clean-up, exit 77 (CTest's skip). */
void kvbh_netns_skip(const char *who, const char *why) __attribute__((noreturn));

#endif
