#!/usr/bin/env bash
# `make soak` (docs/testing.md, issue 8 §6): SOAK_ROOMS rooms (default 20000)
# through `kvbridge bench` with a small model, 5% random aborts and random
# chunk sizes; fails when the bench fails, when any process's VmRSS at the
# end exceeds its warm-up value by more than 5% + SOAK_SLACK_KIB (default
# 1024 KiB: allocator and page-cache jitter of a ~20 MiB process), or when
# any process's fd count grew. Bounded by SOAK_TIMEOUT seconds (default 900).
set -euo pipefail
BUILD=${1:-build}
ROOMS=${SOAK_ROOMS:-20000}
SLACK=${SOAK_SLACK_KIB:-1024}
JSON=$(mktemp /tmp/kvb-soak.XXXXXX.json)
trap 'rm -f "$JSON"' EXIT
start=$(date +%s)
rc=0
timeout "${SOAK_TIMEOUT:-900}" "$BUILD/kvbridge" bench --layers 2 --kv-heads 2 --head-dim 32 \
    --prompt-len 64 --page-size 16 --requests "$ROOMS" --concurrency 8 --seed 7 \
    --abort-rate 0.05 --random-chunks --resource-report --timeout 30 --no-progress \
    --json "$JSON" || rc=$?
echo "soak: $ROOMS rooms in $(($(date +%s) - start)) s, bench exit $rc"
[ "$rc" -eq 0 ] || exit 1
bad=$(jq -r --argjson slack "$SLACK" '
  (.rss_kib | to_entries[] | select(.value[1] > .value[0] * 1.05 + $slack)
     | "RSS grew: \(.key) \(.value[0]) -> \(.value[1]) KiB"),
  (.fds | to_entries[] | select(.value[1] > .value[0])
     | "fds grew: \(.key) \(.value[0]) -> \(.value[1])")' "$JSON")
if [ -n "$bad" ]; then
    echo "soak: FAILED:"
    echo "$bad"
    exit 1
fi
echo "soak: ok (RSS within 5% + $SLACK KiB of warm-up, no fd growth)"
