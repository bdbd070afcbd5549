#!/usr/bin/env bash
# CUDA check for a machine with a GPU (issue 15; NOT part of `make check`):
#   1. builds kvbridge (Release) and the CUDA tests; nothing needs nvcc (the
#      driver API is loaded at run time), the toolkit's cuda.h, where found,
#      only feeds the ABI check (test_cuda_abi);
#   2. runs the CUDA lane tests against the real driver (KVBRIDGE_CUDA_LIB
#      unset: libcuda.so.1): IPC between two processes, VMM allocations
#      (cuMemCreate, shared as file descriptors), staging over tcp,
#      offsets, head slices, the fence, bounds, bytes verified;
#   3. runs `kvbridge bench --memory cuda` for TP1->TP1, TP2->TP1, TP1->TP2,
#      deepseek-v3 MLA (TP1->TP1) and TP1->TP1 over tcp (staging), plus the
#      host tcp run the staging goal is measured against, and prints a
#      markdown table (gbps, the device-to-device yardstick, ratios) for
#      bench/results/gpu.md;
#   4. runs KV integrity off then check on host memory, direct lane and tcp
#      (issue 35 §2: its cost where the two ranks do not share the 2 cores
#      of the project's own machine), rows in the same table.
# With --double the same steps run against the driver-API test double
# (tests/cuda/libkvb_cuda_double.so) with small sizes: that proves the script
# and the plumbing on a machine without a GPU, never GPU speed.
# Usage: scripts/gpu-check.sh [--double] [--device N] [--build DIR] [--out FILE]
#                             [--no-werror]
#   --out FILE: also append the table to FILE. The build is Release with
#   -Werror (KVB_WERROR=ON) unless --no-werror (a newer compiler's new
#   warnings need not stop a GPU run). Exit status: 0 all passed,
#   1 a test or a bench failed, 2 usage / no driver.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=$ROOT/build-gpu
DOUBLE=0
DEVICE=0
OUT=
WERROR=ON
while [ $# -gt 0 ]; do
    case $1 in
    --double) DOUBLE=1 ;;
    --device) DEVICE=$2; shift ;;
    --build) BUILD=$2; shift ;;
    --out) OUT=$2; shift ;;
    --no-werror) WERROR=OFF ;;
    -h | --help) sed -n '2,25p' "$0"; exit 0 ;;
    *) echo "gpu-check: unknown option $1" >&2; exit 2 ;;
    esac
    shift
done
JOBS=$(nproc 2>/dev/null || echo 2)
[ "$DOUBLE" = 1 ] && JOBS=2 # a shared CI machine
LOG=$BUILD/gpu-check
mkdir -p "$LOG"

echo "== build ($BUILD)"
cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DKVB_WERROR=$WERROR >"$LOG/cmake.log" 2>&1 ||
    { echo "gpu-check: cmake failed ($LOG/cmake.log)" >&2; exit 1; }
TARGETS=(kvbridge_cli kvb_cuda_double test_cuda_lanes_ipc test_cuda_lanes_vmm test_cuda_lanes_stage_tcp
    test_cuda_lanes_vmm_parts test_cuda_lanes_vmm_scm test_cuda_fdsrv test_cuda_stage_ring)
grep -q '^test_cuda_abi' <(cmake --build "$BUILD" --target help 2>/dev/null | sed 's/^... //') &&
    TARGETS+=(test_cuda_abi)
cmake --build "$BUILD" -j"$JOBS" --target "${TARGETS[@]}" >"$LOG/build.log" 2>&1 ||
    { tail -20 "$LOG/build.log"; echo "gpu-check: build failed ($LOG/build.log)" >&2; exit 1; }
KVB=$BUILD/kvbridge

if [ "$DOUBLE" = 1 ]; then
    export KVBRIDGE_CUDA_LIB=$BUILD/tests/cuda/libkvb_cuda_double.so
    DRIVER="test double $KVBRIDGE_CUDA_LIB (plumbing only, no GPU speed)"
    SIZE=(--layers 4 --kv-heads 8 --head-dim 64 --prompt-len 512 --requests 12 --concurrency 4)
    MLA=(--model deepseek-v3 --layers 4 --prompt-len 512 --requests 12 --concurrency 4)
else
    unset KVBRIDGE_CUDA_LIB
    if ! command -v nvidia-smi >/dev/null || ! nvidia-smi >/dev/null 2>&1; then
        echo "gpu-check: no working NVIDIA driver (nvidia-smi); --double runs without one" >&2
        exit 2
    fi
    DRIVER="libcuda.so.1: $(nvidia-smi --query-gpu=name,driver_version,memory.total \
        --format=csv,noheader -i "$DEVICE")"
    SIZE=(--model llama3-8b --prompt-len 4096 --requests 48 --concurrency 8)
    MLA=(--model deepseek-v3 --prompt-len 4096 --requests 48 --concurrency 8)
fi
echo "== driver: $DRIVER"

FAILED=0
echo "== CUDA tests"
# binary, lane, then environment for it (the VMM parts lane maps 2 MiB
# handles back to back; _scm takes the descriptors only over the socket)
for t in "test_cuda_lanes_ipc ipc" "test_cuda_lanes_vmm vmm" "test_cuda_lanes_stage_tcp stage_tcp" \
    "test_cuda_lanes_vmm_parts vmm_parts" "test_cuda_lanes_vmm_scm vmm_parts KVBRIDGE_CUDA_PIDFD=0" \
    "test_cuda_fdsrv -" "test_cuda_stage_ring -" "test_cuda_abi"; do
    set -- $t
    bin=$BUILD/tests/cuda/$1
    arg=${2:-}
    [ "$arg" = - ] && arg=
    [ -x "$bin" ] || { echo "   $1: not built (no cuda.h), skipped"; continue; }
    if timeout 120 env "${@:3}" "$bin" $arg >"$LOG/$1.log" 2>&1; then
        echo "   $1: passed"
    else
        echo "   $1: FAILED (log: $LOG/$1.log)"; tail -5 "$LOG/$1.log"; FAILED=1
    fi
done

echo "== bench --memory cuda (device $DEVICE)"
ROWS=()
run_bench() { # name, memory, then bench options
    local name=$1 mem=$2; shift 2
    local json=$LOG/bench-$name.json
    local args=(bench "$@" --no-progress --timeout 300 --json "$json")
    [ "$mem" = cuda ] && args+=(--memory cuda --device "$DEVICE")
    if timeout 900 "$KVB" "${args[@]}" >"$LOG/bench-$name.log" 2>&1; then
        ROWS+=("$(python3 - "$json" "$name" <<'EOF'
import json, sys
j = json.load(open(sys.argv[1]))
cuda = j.get("cuda_memcpy_gbps")
tcp = j.get("tcp_gbps")
print(f"| {sys.argv[2]} | {j['model']} | {j['verified_requests']}/{j['requests']} | "
      f"{j['gbps']:.2f} | " + (f"{cuda:.2f} | {j['cuda_ratio']:.2f}" if cuda else "- | -") +
      f" | {j['memcpy_gbps']:.2f} | " + (f"{tcp:.2f}" if tcp else "-") + " |")
EOF
)")
        echo "   $name: ok"
    else
        echo "   $name: FAILED (log: $LOG/bench-$name.log)"; tail -5 "$LOG/bench-$name.log"
        FAILED=1
    fi
}
run_bench tp1-tp1 cuda "${SIZE[@]}"
run_bench tp2-tp1 cuda "${SIZE[@]}" --prefill-tp 2
run_bench tp1-tp2 cuda "${SIZE[@]}" --decode-tp 2
run_bench mla-tp1-tp1 cuda "${MLA[@]}"
run_bench tp1-tp1-tcp cuda "${SIZE[@]}" --transport tcp
run_bench tp1-tp1-tcp-host host "${SIZE[@]}" --transport tcp
run_bench integ-off-direct host "${SIZE[@]}" --integrity off
run_bench integ-check-direct host "${SIZE[@]}" --integrity check
run_bench integ-off-tcp host "${SIZE[@]}" --transport tcp --integrity off
run_bench integ-check-tcp host "${SIZE[@]}" --transport tcp --integrity check

{
    echo
    echo "### gpu-check $(date -u +%Y-%m-%dT%H:%MZ), $(git -C "$ROOT" rev-parse --short HEAD)"
    echo
    echo "Driver: $DRIVER"
    echo
    echo "| run | model | verified | GB/s | CUDA d2d GB/s | ratio | memcpy GB/s | raw TCP GB/s |"
    echo "|---|---|---|---|---|---|---|---|"
    printf '%s\n' "${ROWS[@]}"
    echo
    echo "Goals (issue 15, recorded, not asserted): tp1-tp1 ratio >= 0.8 (same-GPU IPC vs"
    echo "device-to-device copy); tp2-tp1 GB/s >= 0.7x tp1-tp1 (head slices);"
    echo "tp1-tp1-tcp GB/s >= 0.7x tp1-tp1-tcp-host (staging vs the host tcp lane)."
    echo "Issue 35 §2 (recorded): integ-check-X GB/s >= 0.9x integ-off-X, host memory."
} | tee -a "${OUT:-/dev/null}"
exit $FAILED
