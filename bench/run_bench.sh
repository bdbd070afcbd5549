#!/usr/bin/env bash
# The speed bars of `kvbridge bench` (issue 6 §3, issue 16). Each
# configuration runs REPS times (default 3; this 2-vCPU VM varies +-20%
# between runs) in alternation, and the run with the median gbps is kept: its
# JSON goes to bench/results/bench-<name>.json (every run's to
# bench-<name>.r<k>.json) and a summary line per configuration to stdout:
# every run's steady gbps and cold_gbps, the median run's first-request
# latency. Every bar runs with the default warm-up (--warmup 1): gbps is the
# steady state, cold_gbps the first pass over fresh mappings. Then, unless
# SCALE=0, the scale curve (bench/scale.sh). The load average is printed.
# Usage: [REPS=N] [SCALE=0] [RESULTS=DIR] bench/run_bench.sh [BUILD_DIR]   (default: build,
# bench/results)
set -uo pipefail
BUILD=${1:-build}
KVB="$BUILD/kvbridge"
OUT=${RESULTS:-$(dirname "$0")/results}
mkdir -p "$OUT"
W="--model llama3-8b --prompt-len 4096 --page-size 16 --concurrency 8 --requests 16"
REPS=${REPS:-3}
NAMES=()
ARGS=()
ENVS=()
add() { # name args...
    NAMES+=("$1")
    ENVS+=("")
    shift
    ARGS+=("$*")
}
add_env() { # name VAR=value args...: the same with an environment setting
    add "$1" "${@:3}"
    ENVS[-1]=$2
}
add tp1-tp1 $W --prefill-tp 1 --decode-tp 1
add tp2-tp1 $W --prefill-tp 2 --decode-tp 1
add tp1-tp2 $W --prefill-tp 1 --decode-tp 2
add mla-tp1-tp2 --model deepseek-v3 --prompt-len 4096 --page-size 16 --concurrency 8 \
    --requests 16 --prefill-tp 1 --decode-tp 2
add tcp-tp1-tp1 $W --prefill-tp 1 --decode-tp 1 --transport tcp
add latency-1page --model llama3-8b --prompt-len 16 --page-size 16 --concurrency 1 \
    --requests 300
# The same-host lane comparison: TP1->TP1 with the direct lane off (UCX
# message lane), alternating with the runs above.
add_env tp1-tp1-ucx KVBRIDGE_COPY_THREADS=0 $W --prefill-tp 1 --decode-tp 1
status=0
echo "run_bench: $(uptime)"
for ((r = 1; r <= REPS; r++)); do
    for i in "${!NAMES[@]}"; do
        n=${NAMES[$i]}
        # shellcheck disable=SC2086
        env ${ENVS[$i]} "$KVB" bench ${ARGS[$i]} --no-progress --json "$OUT/bench-$n.r$r.json" \
            >"$OUT/bench-$n.r$r.txt" 2>&1 || status=1
    done
done
for i in "${!NAMES[@]}"; do
    n=${NAMES[$i]}
    echo "== $n: ${ENVS[$i]:+${ENVS[$i]} }kvbridge bench ${ARGS[$i]}"
    /usr/bin/python3 - "$OUT" "$n" "$REPS" <<'PY'
import json, shutil, sys
out, name, reps = sys.argv[1], sys.argv[2], int(sys.argv[3])
runs = []
for r in range(1, reps + 1):
    try:
        with open(f"{out}/bench-{name}.r{r}.json") as f:
            runs.append((json.load(f), r))
    except (OSError, ValueError):
        print(f"   run {r}: no JSON (see bench-{name}.r{r}.txt)")
runs.sort(key=lambda x: x[0].get("gbps", 0))
if runs:
    med, r = runs[len(runs) // 2]
    for ext in ("json", "txt"):
        shutil.copy(f"{out}/bench-{name}.r{r}.{ext}", f"{out}/bench-{name}.{ext}")
    print("   gbps of the runs: " + ", ".join(f"{j['gbps']:.2f}" for j, _ in runs) +
          "; cold_gbps: " + ", ".join(f"{j.get('cold_gbps', 0):.2f}" for j, _ in runs) +
          f"; median run {r}: first request {med.get('first_request_ms', 0):.1f} ms, "
          f"memcpy {med.get('memcpy_gbps', 0):.2f}, p50 {med['latency_ms']['p50']:.2f} ms")
PY
done
echo "run_bench: load after: $(uptime)"
if [ "${SCALE:-1}" != 0 ]; then
    bash "$(dirname "$0")/scale.sh" "$BUILD" || status=1
fi
exit $status
