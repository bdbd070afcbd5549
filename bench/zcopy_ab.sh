#!/usr/bin/env bash
# What the tcp engines' copy sends (UCX ZCOPY_THRESH=inf, engine.c
# tcp_no_zcopy: the workaround for UCX 1.13's use after free when a
# force-closed stuck peer resumes, docs/engine.md "Limits") cost against
# UCX's zero-copy sends (KVBRIDGE_TCP_ZCOPY=1, the code before), with the
# raw TCP yardstick of the same run: `kvbridge engine-bench --quick
# --transport tcp`, writes and reads, alternating B (copy, the default)
# and A (zero-copy) in every round. Every run verifies every byte. Each
# invocation holds /work/bench.lock (or $LOCK) only while it runs. Prints
# per op and block size the median GB/s over the rounds (range) and its
# ratio to raw TCP.
# Usage: [ROUNDS=N] [SIZES=a,b,c] bench/zcopy_ab.sh [BUILD_DIR]
set -uo pipefail
BUILD=${1:-build}
KVB="$BUILD/kvbridge"
ROUNDS=${ROUNDS:-5}
SIZES=${SIZES:-65536,262144,4194304}
LOCK=${LOCK:-/work/bench.lock}
OUT=$(mktemp -d)
echo "zcopy_ab: $(uptime)"
for ((r = 1; r <= ROUNDS; r++)); do
    for op in write read; do
        for v in B A; do
            z=0
            [ "$v" = A ] && z=1
            flock "$LOCK" env KVBRIDGE_TCP_ZCOPY=$z "$KVB" engine-bench --quick --transport tcp \
                --sizes "$SIZES" --op $op --json "$OUT/$op$v-$r.json" >"$OUT/$op$v-$r.txt" 2>&1 ||
                echo "run $op$v $r failed: $(tail -3 "$OUT/$op$v-$r.txt")"
        done
    done
    echo "round $r done: $(uptime)"
done
/usr/bin/python3 - "$OUT" "$ROUNDS" <<'PY'
import json, os, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
rows = {}
for op in ("write", "read"):
    for v in ("B", "A"):
        for r in range(1, rounds + 1):
            path = f"{out}/{op}{v}-{r}.json"
            if not os.path.exists(path):
                continue
            for x in json.load(open(path)):
                if not x["verified"]:
                    print(f"{op}{v} round {r} {x['block_size']}: NOT VERIFIED {x.get('error', '')}")
                rows.setdefault((op, x["block_size"], v), []).append(x)
def med(v):
    return f"{statistics.median(v):.2f} ({min(v):.2f}-{max(v):.2f})"
print("op     block    run                 | GB/s median (range) | / raw TCP median")
for (op, bs, v), xs in sorted(rows.items()):
    g = [x["gbps"] for x in xs]
    t = [x["gbps"] / x["tcp_gbps"] for x in xs if x.get("tcp_gbps")]
    name = "B copy (default)" if v == "B" else "A zero-copy (=1)"
    print(f"{op:6} {bs:>8} {name:19} | {med(g):19} | {statistics.median(t):.2f}" if t else
          f"{op:6} {bs:>8} {name:19} | {med(g):19} |")
PY
echo "zcopy_ab end: $(uptime)"
