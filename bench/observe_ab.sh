#!/usr/bin/env bash
# The cost of timelines and metrics (issue 34 §4): `kvbridge bench` with
# recording on (default) and off (KVBRIDGE_TIMELINE=0), alternating, REPS
# pairs of each case: steady throughput (tp1-tp1, llama3-8b, 4096 tokens,
# 8 in flight) and the 1-page latency case. Prints one line per run and the
# medians. Results: bench/results/observe.md.
# Usage: [REPS=N] bench/observe_ab.sh [BUILD_DIR]
set -uo pipefail
BUILD=${1:-build}
KVB="$BUILD/kvbridge"
REPS=${REPS:-5}
OUT=$(mktemp -d)
STEADY="--model llama3-8b --prompt-len 4096 --page-size 16 --concurrency 8 --requests 16 --prefill-tp 1 --decode-tp 1"
LAT="--model llama3-8b --prompt-len 16 --page-size 16 --concurrency 1 --requests 300"
echo "observe_ab: $(uptime)"
for ((r = 1; r <= REPS; r++)); do
    for mode in on off; do
        for c in steady lat; do
            if [ "$c" = steady ]; then args=$STEADY; else args=$LAT; fi
            env=""
            [ "$mode" = off ] && env="KVBRIDGE_TIMELINE=0"
            # shellcheck disable=SC2086
            env $env "$KVB" bench $args --no-progress --json "$OUT/$c-$mode-$r.json" \
                >"$OUT/$c-$mode-$r.txt" 2>&1 || echo "run $c $mode $r failed"
        done
    done
done
/usr/bin/python3 - "$OUT" "$REPS" <<'PY'
import json, statistics, sys
out, reps = sys.argv[1], int(sys.argv[2])
for c in ("steady", "lat"):
    for mode in ("on", "off"):
        runs = [json.load(open(f"{out}/{c}-{mode}-{r}.json")) for r in range(1, reps + 1)]
        g = [x["gbps"] for x in runs]
        p50 = [x["latency_ms"]["p50"] for x in runs]
        p99 = [x["latency_ms"]["p99"] for x in runs]
        print(f"{c:6s} {mode:3s} gbps {' '.join(f'{v:.2f}' for v in g)} median {statistics.median(g):.2f}"
              f" | p50 ms {' '.join(f'{v:.3f}' for v in p50)} median {statistics.median(p50):.3f}"
              f" | p99 median {statistics.median(p99):.3f}")
PY
echo "observe_ab: $(uptime)"
