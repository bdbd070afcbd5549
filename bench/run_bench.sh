#!/usr/bin/env bash
# The speed bars of `kvbridge bench` (issue 6 §3), one run each; JSON results
# go to bench/results/bench-<name>.json and a summary line per run to stdout.
# Usage: bench/run_bench.sh [BUILD_DIR]   (default: build)
set -uo pipefail
BUILD=${1:-build}
KVB="$BUILD/kvbridge"
OUT=$(dirname "$0")/results
mkdir -p "$OUT"
W="--model llama3-8b --prompt-len 4096 --page-size 16 --concurrency 8 --requests 16"
run() {
    local name=$1
    shift
    echo "== $name: kvbridge bench $*"
    "$KVB" bench "$@" --no-progress --json "$OUT/bench-$name.json" >"$OUT/bench-$name.txt" 2>&1
    echo "   exit $? : $(tr -d '\n' <"$OUT/bench-$name.json" | sed 's/, "prompt_len".*//')"
}
run tp1-tp1 $W --prefill-tp 1 --decode-tp 1
run tp2-tp1 $W --prefill-tp 2 --decode-tp 1
run tp1-tp2 $W --prefill-tp 1 --decode-tp 2
run mla-tp1-tp2 --model deepseek-v3 --prompt-len 4096 --page-size 16 --concurrency 8 \
    --requests 16 --prefill-tp 1 --decode-tp 2
run tcp-tp1-tp1 $W --prefill-tp 1 --decode-tp 1 --transport tcp
run latency-1page --model llama3-8b --prompt-len 16 --page-size 16 --concurrency 1 \
    --requests 300
