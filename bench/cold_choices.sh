#!/usr/bin/env bash
# The cold-start choices of issue 16 §1, measured in one run: the same
# `kvbridge bench` workload under each engine/host setting, REPS times in
# alternation (default 3); prints one table (medians, each run's values in
# brackets) and keeps each run's JSON in bench/results/cold/<choice>.r<k>.json.
# The load average is printed before and after (2-core VMs shared with
# builds vary 2x: compare choices within one run only).
#
# Usage: [REPS=N] [CHOICES="name=VAR=v,VAR=v ..."] bench/cold_choices.sh [BUILD_DIR] [bench options]
# A choice is a list of environment settings; two pseudo-settings change the
# host for that choice and are restored afterwards (root only, else the
# choice is skipped): SHMEM_ENABLED=advise (shmem transparent huge pages) and
# NR_HUGEPAGES=N (reserve N 2 MiB hugetlb pages).
set -uo pipefail
BUILD=${1:-build}
shift || true
KVB="$BUILD/kvbridge"
OUT=$(dirname "$0")/results/cold
mkdir -p "$OUT"
# Small enough that both pools (prefill and decode, 2.3 GB each) fit in
# reserved huge pages on a 23 GiB VM.
W=${*:-"--model llama3-8b --prompt-len 2048 --page-size 16 --concurrency 4 --requests 16"}
REPS=${REPS:-3}
OFF="KVBRIDGE_HUGEPAGES=off"
CHOICES=${CHOICES:-"fault=$OFF,KVBRIDGE_DIRECT_WARM_CPU=0,KVBRIDGE_DIRECT_POPULATE_MAX=0 \
sync=$OFF,KVBRIDGE_DIRECT_WARM_CPU=0,KVBRIDGE_DIRECT_POPULATE_MAX=1099511627776 \
warm50=$OFF,KVBRIDGE_DIRECT_WARM_CPU=50 warm100=$OFF,KVBRIDGE_DIRECT_WARM_CPU=100 \
thp=SHMEM_ENABLED=advise,KVBRIDGE_HUGEPAGES=thp \
hugetlb=NR_HUGEPAGES=2400,KVBRIDGE_HUGEPAGES=hugetlb"}
SHM=/sys/kernel/mm/transparent_hugepage/shmem_enabled
NRH=/proc/sys/vm/nr_hugepages
shm0=$(sed 's/.*\[\(.*\)\].*/\1/' $SHM 2>/dev/null)
nrh0=$(cat $NRH 2>/dev/null)
restore() {
    [ -w $SHM ] && echo "$shm0" >$SHM
    [ -w $NRH ] && echo "$nrh0" >$NRH
}
trap restore EXIT
# Apply a choice's host settings; print its environment settings.
apply() {
    local envs="" kv
    for kv in ${1//,/ }; do
        case $kv in
        SHMEM_ENABLED=*) echo "${kv#*=}" >$SHM 2>/dev/null || return 1 ;;
        NR_HUGEPAGES=*)
            echo "${kv#*=}" >$NRH 2>/dev/null || return 1
            [ "$(cat $NRH)" -ge "${kv#*=}" ] || return 1 ;;
        *) envs="$envs $kv" ;;
        esac
    done
    echo "$envs"
}
echo "cold_choices: kvbridge bench $W; $REPS alternating runs; load: $(uptime)"
for ((r = 1; r <= REPS; r++)); do
    for c in $CHOICES; do
        name=${c%%=*}
        rm -f "$OUT/$name.r$r.json"
        if ! envs=$(apply "${c#*=}"); then
            echo "   $name: host setting refused (not root?), skipped"
            restore
            continue
        fi
        # shellcheck disable=SC2086
        env $envs "$KVB" bench $W --no-progress --json "$OUT/$name.r$r.json" \
            >"$OUT/$name.r$r.txt" 2>&1 || echo "   $name run $r failed: see $OUT/$name.r$r.txt"
        restore
    done
done
echo "load after: $(uptime)"
/usr/bin/python3 - "$OUT" "$REPS" $CHOICES <<'PY'
import json, statistics, sys
out, reps, choices = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
keys = [("gbps", "steady GB/s"), ("cold_gbps", "cold GB/s"), ("cold_ratio", "cold/steady"),
        ("first_request_ms", "first request ms"), ("cold_p50", "cold p50 ms"),
        ("memcpy_gbps", "memcpy GB/s")]
print("| choice | settings | " + " | ".join(k[1] for k in keys) + " |")
print("|---" * (len(keys) + 2) + "|")
for c in choices:
    name, env = c.split("=", 1)
    runs = []
    for r in range(1, reps + 1):
        try:
            with open(f"{out}/{name}.r{r}.json") as f:
                j = json.load(f)
        except (OSError, ValueError):
            continue
        j["cold_p50"] = j.get("cold_latency_ms", {}).get("p50", 0)
        j["cold_ratio"] = j["cold_gbps"] / j["gbps"] if j.get("gbps") else 0
        runs.append(j)
    cells = []
    for k, _ in keys:
        v = [j.get(k, 0) for j in runs]
        cells.append(f"**{statistics.median(v):.2f}** ({', '.join(f'{x:.2f}' for x in v)})"
                     if v else "-")
    print(f"| {name} | `{env.replace(',', ' ')}` | " + " | ".join(cells) + " |")
PY
