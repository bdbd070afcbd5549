#!/usr/bin/env bash
# Issue 33 §3: one-sided reads over TCP against writes and against the raw
# TCP yardstick of the same run (`kvbridge engine-bench --transport tcp`),
# alternating in every round: write, read (answers straight out of the
# target's registrations: B, the default), read with the target's gather
# copy (KVBRIDGE_READ_ANSWER_DIRECT=0: A, the path before). Every run
# verifies every byte. Each invocation holds /work/bench.lock (or $LOCK)
# only while it runs. Prints every run's rows, then per op and block size
# the median GB/s and ratio to raw TCP over the rounds (with their range).
# Results: bench/results/reads.md.
# VARIANTS (space-separated NAME:OP[:VAR=VALUE,...]) replaces the three runs
# of a round, e.g. copy sends against UCX zero-copy on tcp engines
# (docs/engine.md "Limits"):
#   VARIANTS="writeB:write readB:read writeA:write:KVBRIDGE_TCP_ZCOPY=1
#             readA:read:KVBRIDGE_TCP_ZCOPY=1" bench/reads_ab.sh build
# A variant's KVB=PATH (among its VAR=VALUE) runs that kvbridge binary
# instead of BUILD_DIR's, so two builds alternate in one invocation, e.g.
# the reply-endpoint watch (docs/engine.md) against the build before it:
#   VARIANTS="wA:write:KVB=/tmp/old/build/kvbridge wB:write
#             rA:read:KVB=/tmp/old/build/kvbridge rB:read" \
#     ROUNDS=4 SIZES=32768,4194304 bench/reads_ab.sh build
# Usage: [ROUNDS=N] [SIZES=a,b,c] [VARIANTS=...] bench/reads_ab.sh [BUILD_DIR]
set -uo pipefail
BUILD=${1:-build}
KVB="$BUILD/kvbridge"
ROUNDS=${ROUNDS:-3}
SIZES=${SIZES:-32768,262144,4194304}
VARIANTS=${VARIANTS:-write:write readB:read readA:read:KVBRIDGE_READ_ANSWER_DIRECT=0}
LOCK=${LOCK:-/work/bench.lock}
OUT=$(mktemp -d)
echo "reads_ab: $(uptime)"
for ((r = 1; r <= ROUNDS; r++)); do
    for spec in $VARIANTS; do
        IFS=: read -r v op vars <<<"$spec"
        bin=$KVB envs=()
        for kv in ${vars//,/ }; do
            case $kv in KVB=*) bin=${kv#KVB=} ;; *) envs+=("$kv") ;; esac
        done
        flock "$LOCK" env "${envs[@]}" "$bin" engine-bench --quick --transport tcp --sizes "$SIZES" \
            --op $op --json "$OUT/$v-$r.json" >"$OUT/$v-$r.txt" 2>&1 ||
            echo "run $v $r failed: $(tail -3 "$OUT/$v-$r.txt")"
    done
    echo "round $r done: $(uptime)"
done
# shellcheck disable=SC2086
/usr/bin/python3 - "$OUT" "$ROUNDS" $VARIANTS <<'PY'
import json, os, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
rows = {}
for v in (spec.split(":")[0] for spec in sys.argv[3:]):
    for r in range(1, rounds + 1):
        path = f"{out}/{v}-{r}.json"
        if not os.path.exists(path):
            continue
        for x in json.load(open(path)):
            if not x["verified"]:
                print(f"{v} round {r} {x['block_size']}: NOT VERIFIED {x.get('error', '')}")
            rows.setdefault((v, x["block_size"]), []).append(x)
def med(v):
    return f"{statistics.median(v):.2f} ({min(v):.2f}-{max(v):.2f})"
print("run    block   GB/s per round        | median (range)     | / raw TCP median (range) | raw TCP GB/s")
for (v, bs), xs in sorted(rows.items(), key=lambda k: (k[0][1], k[0][0])):
    g = [x["gbps"] for x in xs]
    q = [x["ratio"] for x in xs]
    t = [x["tcp_gbps"] for x in xs]
    print(f"{v:6s} {bs >> 10:5d}K  {' '.join(f'{a:.2f}' for a in g):22s}| {med(g):18s} | "
          f"{med(q):24s} | {med(t)}")
PY
echo "reads_ab: raw runs in $OUT; $(uptime)"
