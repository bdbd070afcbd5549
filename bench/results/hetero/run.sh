#!/bin/bash
# A/B alternating: each round runs every layout once, in order.
cd /work/wt-hetero
BASE="--model llama3-8b --layers 8 --prompt-len 2048 --requests 32 --concurrency 4 --page-size 16 --no-progress"
declare -A CFG=( [A_same]="" [B_64hnd]="--decode-page-size 64 --decode-layout hnd" [C_64nhd]="--decode-page-size 64" [D_16hnd]="--decode-layout hnd" [E_5nhd]="--decode-page-size 5" )
for round in ${ROUNDS:-1 2 3}; do
  for k in A_same B_64hnd C_64nhd D_16hnd E_5nhd; do
    ./build/kvbridge bench $BASE ${CFG[$k]} --json /tmp/hetero-bench/$k.$round.json > /tmp/hetero-bench/$k.$round.txt 2>&1
    echo "$k round $round rc=$?"
  done
done
