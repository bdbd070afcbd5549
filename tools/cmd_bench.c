/* `kvbridge bench`: a verified prefill/decode KV transfer workload on real
 * processes (see bench_common.h for the process layout and docs/bench.md). */
#include "bench_common.h"

int kvb_cmd_bench(int argc, char **argv);

int kvb_cmd_bench(int argc, char **argv)
{
    bench_opts_t o;
    int rc = bench_parse(&o, argc, argv);
    if (rc != 0)
        return rc == 1 ? 0 : 2;
    switch (o.role) {
    case BENCH_ROLE_BOOTSTRAP:
        return bench_run_bootstrap(&o, o.child);
    case BENCH_ROLE_PREFILL_RANK:
    case BENCH_ROLE_DECODE_RANK:
        return bench_run_rank(&o);
    default:
        return bench_run_driver(&o);
    }
}
