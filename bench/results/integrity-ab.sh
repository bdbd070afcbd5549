#!/bin/bash
# A/B alternating: off, check, off, check, ... (memory bandwidth on this VM varies 2x)
B=${1:-build}/kvbridge
for i in 1 2 3; do
  for m in off check; do
    echo "== steady auto rep $i $m"
    $B bench --requests 32 --concurrency 4 --no-progress --integrity $m 2>&1 | grep -E "throughput|latency ms|integrity|result"
    echo "== 1page auto rep $i $m"
    $B bench --requests 200 --concurrency 1 --prompt-len 16 --no-progress --integrity $m 2>&1 | grep -E "throughput|latency ms|integrity|result"
    echo "== steady tcp rep $i $m"
    $B bench --requests 16 --concurrency 4 --transport tcp --no-progress --integrity $m 2>&1 | grep -E "throughput|latency ms|integrity|result"
    echo "== 1page tcp rep $i $m"
    $B bench --requests 200 --concurrency 1 --prompt-len 16 --transport tcp --no-progress --integrity $m 2>&1 | grep -E "throughput|latency ms|integrity|result"
  done
done
echo ALLDONE
