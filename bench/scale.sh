#!/usr/bin/env bash
# The scale curve of issue 16 §4: `kvbridge bench --scale` (one-page rooms,
# control dominates) over rank counts and rooms in flight, one process per
# rank (the bench's limit: 64 rank processes, so 32 x 32 at most). Prints a
# markdown table and keeps each run's JSON in bench/results/scale/.
# Usage: [SIZES="1x1 2x2 ..."] [INFLIGHT="100 1000 4000"] bench/scale.sh [BUILD_DIR]
set -uo pipefail
BUILD=${1:-build}
KVB="$BUILD/kvbridge"
OUT=$(dirname "$0")/results/scale
mkdir -p "$OUT"
SIZES=${SIZES:-"1x1 2x2 4x4 8x8 16x16 32x32"}
INFLIGHT=${INFLIGHT:-"100 1000 4000"}
echo "scale: $(uptime)" >&2
for s in $SIZES; do
    p=${s%x*} d=${s#*x}
    for c in $INFLIGHT; do
        n="p${p}-d${d}-c${c}"
        timeout 900 "$KVB" bench --scale --prefill-tp "$p" --decode-tp "$d" --concurrency "$c" \
            --requests $((2 * c)) --timeout 300 --no-progress --json "$OUT/$n.json" \
            >"$OUT/$n.txt" 2>&1 || echo "   $n failed (exit $?): see $OUT/$n.txt" >&2
        echo "   $n done: $(uptime)" >&2
    done
done
/usr/bin/python3 - "$OUT" $SIZES -- $INFLIGHT <<'PY'
import json, sys
out = sys.argv[1]
k = sys.argv.index("--")
sizes, infl = sys.argv[2:k], sys.argv[k + 1:]
print("| prefill x decode ranks | rooms (in flight asked / held at most) | verified | "
      "CPU us per room | RSS B per room | p50 ms | p99 ms | rooms/s |")
print("|---|---|---|---|---|---|---|---|")
for s in sizes:
    p, d = s.split("x")
    for c in infl:
        try:
            with open(f"{out}/p{p}-d{d}-c{c}.json") as f:
                j = json.load(f)
        except (OSError, ValueError):
            print(f"| {p} x {d} | {c} | failed | | | | | |")
            continue
        sc, lat = j["scale"], j["latency_ms"]
        rate = j["requests"] / j["seconds"] if j["seconds"] else 0
        print(f"| {p} x {d} | {c} / {sc['max_in_flight']} | {j['verified_requests']}/"
              f"{j['requests']} | {sc['cpu_us_per_room']:.0f} | {sc['rss_bytes_per_room']:.0f} | "
              f"{lat['p50']:.1f} | {lat['p99']:.1f} | {rate:.0f} |")
PY
