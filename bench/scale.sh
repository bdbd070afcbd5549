#!/usr/bin/env bash
# The scale curve of issue 16 §4: `kvbridge bench --scale` (one-page rooms,
# control dominates) over rank counts and rooms in flight; one process per
# rank up to 64 ranks, past that several managers per process (the bench
# picks the fewest that keep 64 rank processes; RPP=K forces K). Prints a
# markdown table and keeps each run's JSON in bench/results/scale/.
# Usage: [SIZES="1x1 2x2 ..."] [INFLIGHT="100 1000 10000"] [REQS=2] [WARMUP=1]
#        [POLL=changed|event|many|single] [RPP=K] [HOLD=N] bench/scale.sh [BUILD_DIR]
# (REQS: timed requests per point = REQS x in flight; POLL: how the ranks poll,
# KVBRIDGE_BENCH_POLL, docs/bench.md; HOLD: --hold N, rooms held in flight on
# every rank while the timed ones run, e.g. HOLD=10000 INFLIGHT=16 for the
# 1-page latency with 10k rooms in flight; the files then end in -hN)
set -uo pipefail
BUILD=${1:-build}
KVB="$BUILD/kvbridge"
OUT=$(dirname "$0")/results/scale
mkdir -p "$OUT"
SIZES=${SIZES:-"1x1 2x2 4x4 8x8 16x16 32x32"}
INFLIGHT=${INFLIGHT:-"100 1000 10000"}
REQS=${REQS:-2}
WARMUP=${WARMUP:-1}
export KVBRIDGE_BENCH_POLL=${POLL:-changed}
HOLD=${HOLD:-0}
SUF=""
[ "$HOLD" != 0 ] && SUF="-h$HOLD"
# held receivers wait in WaitingForInput for the whole run: past the
# library's 300 s waiting time-out on the large points unless raised
[ "$HOLD" != 0 ] && export KVBRIDGE_WAITING_TIMEOUT=${KVBRIDGE_WAITING_TIMEOUT:-3600}
RPP_ARGS=()
[ -n "${RPP:-}" ] && RPP_ARGS=(--ranks-per-process "$RPP")
echo "scale: $(uptime)" >&2
for s in $SIZES; do
    p=${s%x*} d=${s#*x}
    for c in $INFLIGHT; do
        n="p${p}-d${d}-c${c}${SUF}"
        timeout 900 "$KVB" bench --scale --prefill-tp "$p" --decode-tp "$d" --concurrency "$c" \
            --requests $((REQS * c)) --hold "$HOLD" --warmup "$WARMUP" "${RPP_ARGS[@]}" --timeout 300 \
            --no-progress --json "$OUT/$n.json" \
            >"$OUT/$n.txt" 2>&1 || echo "   $n failed (exit $?): see $OUT/$n.txt" >&2
        echo "   $n done: $(uptime)" >&2
    done
done
/usr/bin/python3 - "$OUT" "$SUF" $SIZES -- $INFLIGHT <<'PY'
import json, sys
out, suf = sys.argv[1], sys.argv[2]
k = sys.argv.index("--")
sizes, infl = sys.argv[3:k], sys.argv[k + 1:]
print("| prefill x decode ranks | processes (ranks each) | rooms (in flight asked / held at most) | "
      "verified | CPU us per room | RSS B per room | ctl msgs per room | p50 ms | p99 ms | "
      "rooms/s | heartbeats/s per decode rank (run) | held (verified) | RSS B per held room | poll |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
for s in sizes:
    p, d = s.split("x")
    for c in infl:
        try:
            with open(f"{out}/p{p}-d{d}-c{c}{suf}.json") as f:
                j = json.load(f)
        except (OSError, ValueError):
            print(f"| {p} x {d} | | {c} | failed | | | | | | | | | | |")
            continue
        sc, lat = j["scale"], j["latency_ms"]
        rate = j["requests"] / j["seconds"] if j["seconds"] else 0
        hb = sc.get("heartbeats_run", 0) / int(d) / sc["run_wall_s"] if sc.get("run_wall_s") else 0
        print(f"| {p} x {d} | {sc['processes'] - 1} ({sc.get('ranks_per_process', 1)}) | "
              f"{c} / {sc['max_in_flight']} | {j['verified_requests']}/"
              f"{j['requests']} | {sc['cpu_us_per_room']:.0f} | {sc['rss_bytes_per_room']:.0f} | "
              f"{sc.get('control_sent_per_room', 0):.1f} | "
              f"{lat['p50']:.1f} | {lat['p99']:.1f} | {rate:.0f} | {hb:.2f} | "
              f"{sc.get('hold', 0)} ({sc.get('held_verified', 0)}) | "
              f"{sc.get('held_rss_bytes_per_room', 0):.0f} | {sc.get('poll', 'event')} |")
PY
