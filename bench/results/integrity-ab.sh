#!/bin/bash
# What KVBRIDGE_INTEGRITY=check costs, A/B alternating (memory bandwidth on
# the 2-vCPU VM varies 2x between minutes, so every variant runs in every
# round, in the same order).
#
#   bench/results/integrity-ab.sh NEW [OLD] [LANES] [REPS]
#
# NEW, OLD: build folders (OLD: a build of the commit to compare against,
# e.g. `git archive 886e408 | tar -x -C /tmp/old` built with
# `cmake --build build --target kvbridge_cli`; "-" or absent: none).
# LANES: "direct tcp" (default), or one of them. REPS: rounds (default 3).
# Per round and lane, in this order: steady (256 MiB requests) then 1 page,
# each for OLD off, OLD check, NEW off, NEW check, then NEW check once per
# entry of VARIANTS (steady and 1 page), a space-separated list of
# name:VAR=VALUE[,VAR=VALUE...] (default
# "threads0:KVBRIDGE_INTEGRITY_THREADS=0", steady only: the decode's check on
# its control thread, as before the check workers; set 6 ran
# VARIANTS=landed:KVBRIDGE_INTEGRITY_LANDED=on with NEW a build of branch
# `landed`, not on main). One round of one lane takes about
# 2 minutes here: run each under `flock /work/bench.lock` on a shared
# machine, e.g. the 2026-12-06 set:
#   for i in 1 2 3; do for l in direct tcp; do
#     uptime; flock /work/bench.lock bench/results/integrity-ab.sh build /tmp/old/build $l 1
#   done; done
VARIANTS=${VARIANTS-threads0:KVBRIDGE_INTEGRITY_THREADS=0}
NEW=${1:-build}
OLD=${2:--}
LANES=${3:-direct tcp}
REPS=${4:-3}
FILTER="throughput|latency ms|integrity|result"

one() { # label binary-dir env(VAR=VALUE,... or "") args...
    local label=$1 dir=$2 vars=$3
    shift 3
    echo "== $label"
    env ${vars//,/ } "$dir/kvbridge" bench "$@" --no-progress 2>&1 | grep -E "$FILTER"
}

variants() { # case-label steady(1)/1-page(0) args...
    local c=$1 steady=$2 v
    shift 2
    for m in off check; do
        [ "$OLD" != "-" ] && one "$c old $m" "$OLD" "" "$@" --integrity $m
        one "$c new $m" "$NEW" "" "$@" --integrity $m
    done
    for v in $VARIANTS; do
        [ "${v%%:*}" = threads0 ] && [ "$steady" = 0 ] && continue
        one "$c new check ${v%%:*}" "$NEW" "${v#*:}" "$@" --integrity check
    done
}

for i in $(seq 1 "$REPS"); do
    for lane in $LANES; do
        echo "#### rep $i lane $lane $(uptime)"
        if [ "$lane" = tcp ]; then
            variants "steady tcp" 1 --requests 16 --concurrency 4 --transport tcp
            variants "1page tcp" 0 --requests 200 --concurrency 1 --prompt-len 16 --transport tcp
        else
            variants "steady direct" 1 --requests 32 --concurrency 4
            variants "1page direct" 0 --requests 200 --concurrency 1 --prompt-len 16
        fi
    done
done
echo ALLDONE
