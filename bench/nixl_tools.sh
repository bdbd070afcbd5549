#!/usr/bin/env bash
# NIXL's own tools against KVBRIDGE and UCX (issue 33 §1): NIXL's generic
# transfer test (test/gtest/test_transfer.cpp, TestTransfer instantiated for
# KVBRIDGE) and nixlbench (--check_consistency, its backend allow-list
# patched to take KVBRIDGE), both compiled from a NIXL checkout the caller
# gives into BUILD/nixl-tools (scratch: nothing of NIXL's lands in the
# repository) and linked against the PyPI wheel's libnixl.so that
# scripts/interop-nixl.sh installed. Opt-in, NOT part of `make check`.
#
# Needs: scripts/interop-nixl.sh BUILD run once (the venv, the plug-in
# folder, BUILD/nixl-include); g++ with OpenMP; libgtest-dev/libgmock-dev;
# asio, gflags and toml++ 3.x headers (Debian: libasio-dev libgflags-dev
# libtomlplusplus-dev, installed, or unpacked without installing:
#   apt-get download libasio-dev libgflags-dev libgflags2.2 libtomlplusplus-dev
#   for d in *.deb; do dpkg -x "$d" DIR; done      # then NIXL_TOOLS_DEPS=DIR
# ). NIXL itself is not built: meson, its subprojects and abseil are not needed.
# Checked with ai-dynamo/nixl 8770b655 (v1.4.0 + later commits) against the
# wheel nixl-cu12 1.5.1.
#
# Usage: bench/nixl_tools.sh BUILD NIXL_SRC [gtest|nixlbench]...  (default both)
# nixlbench: UCX (NIXL's defaults; UCX_TLS=tcp for the tcp rows) and KVBRIDGE
# (KVBRIDGE_TRANSPORT=auto / tcp), WRITE and READ, 32 KiB x 2048, 256 KiB x
# 256, 4 MiB x 16 (64 MiB per transfer), 32 timed iterations after 16
# warm-up ones, the backends alternating per configuration, under
# flock /work/bench.lock when that folder exists; one line per run.
set -euo pipefail
[ $# -ge 2 ] || { echo "usage: $0 BUILD NIXL_SRC [gtest|nixlbench]..." >&2; exit 2; }
BUILD=$(cd "$1" && pwd)
SRC=$(cd "$2" && pwd)
shift 2
WHAT=("$@")
[ ${#WHAT[@]} -gt 0 ] || WHAT=(gtest nixlbench)
VENV=$BUILD/nixl-venv
PLUG=$BUILD/nixl-plugins
INC0=$BUILD/nixl-include
for f in "$VENV/bin/python" "$PLUG/libplugin_KVBRIDGE.so" "$INC0/nixl.h"; do
    [ -e "$f" ] || { echo "nixl_tools: no $f: run scripts/interop-nixl.sh $BUILD first" >&2; exit 2; }
done
for f in benchmark/nixlbench/src/worker/nixl/nixl_worker.cpp test/gtest/test_transfer.cpp; do
    [ -f "$SRC/$f" ] || { echo "nixl_tools: $SRC has no $f" >&2; exit 2; }
done
SITE=$("$VENV/bin/python" -c 'import nixl_cu12, os; print(os.path.dirname(os.path.dirname(nixl_cu12.__file__)))')
LIBS=$SITE/.nixl_cu12.mesonpy.libs
BUNDLED=$SITE/nixl_cu12.libs
DEPS=${NIXL_TOOLS_DEPS:-}
W=$BUILD/nixl-tools
rm -rf "$W"
mkdir -p "$W/inc/utils/serdes" "$W/inc/toml++" "$W/nb" "$W/gt"
cp -r "$INC0"/. "$W/inc/"
cp "$SRC/src/utils/serdes/serdes.h" "$W/inc/utils/serdes/"
# nixlbench includes <toml++/toml.hpp>; Debian 12's toml++ 3.3 names it toml.h
printf '#pragma once\n#define TOML_HEADER_ONLY 1\n#include <toml++/toml.h>\n' >"$W/inc/toml++/toml.hpp"
printf '#define HAVE_ETCD 0\n#define HAVE_NVSHMEM 0\n#define HAVE_CUDA 0\n#define HAVE_ROCM 0\n#define HAVE_CUDA_FABRIC 0\n' \
    >"$W/nb/config.h"
DEPINC=() DEPLIB=()
if [ -n "$DEPS" ]; then
    DEPINC=(-I"$DEPS/usr/include")
    DEPLIB=(-L"$DEPS/usr/lib/x86_64-linux-gnu" "-Wl,-rpath,$DEPS/usr/lib/x86_64-linux-gnu")
fi
export NIXL_PLUGIN_DIR=$PLUG
export LD_LIBRARY_PATH=$BUNDLED${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
unset UCX_TLS KVBRIDGE_TRANSPORT

build_gtest() {
    # TestTransfer instantiated for KVBRIDGE (with and without NIXL's progress
    # thread), beside UCX's own instantiations
    python3 - "$SRC/test/gtest/test_transfer.cpp" "$W/gt/test_transfer.cpp" <<'EOF'
import sys
s = open(sys.argv[1]).read()
i = s.rindex("} // namespace gtest")
add = ('NIXL_INSTANTIATE_TEST(kvbridge, TestTransfer, "KVBRIDGE", true, 1, 0, "");\n'
       'NIXL_INSTANTIATE_TEST(kvbridge_no_pt, TestTransfer, "KVBRIDGE", false, 1, 0, "");\n\n')
open(sys.argv[2], "w").write(s[:i] + add + s[i:])
EOF
    local inc=(-I"$SRC/test/gtest" -I"$W/inc" -I"$SRC/src/core" -I"$SRC/src/api/cpp"
        -I"$SRC/src/utils" -I"$SRC/src/infra" -I"$SRC/src/api/cpp/backend")
    local objs=()
    for f in "$W/gt/test_transfer.cpp" "$SRC/test/gtest/common.cpp" "$SRC/test/gtest/main.cpp"; do
        g++ -std=c++20 -O1 -DBUILD_DIR='"/nonexistent"' "${inc[@]}" -c "$f" \
            -o "$W/gt/$(basename "$f" .cpp).o"
        objs+=("$W/gt/$(basename "$f" .cpp).o")
    done
    local absl=()
    for l in "$BUNDLED"/libabsl_*.so*; do absl+=("-l:$(basename "$l")"); done
    g++ -o "$W/gt/gtest_transfer" "${objs[@]}" -L"$LIBS" -L"$BUNDLED" -Wl,-rpath,"$LIBS" \
        -Wl,-rpath,"$BUNDLED" -lnixl -lnixl_build -lnixl_common -lserdes "${absl[@]}" -lgtest \
        -lgmock -lpthread
}

run_gtest() {
    echo "== NIXL's TestTransfer (test/gtest/test_transfer.cpp at $(git -C "$SRC" rev-parse --short HEAD 2>/dev/null || echo '?'))"
    # The wheel's bundled libnl crashes in its destructor at exit in a process
    # that loaded the UCX plug-in (exit 139 after the summary): the verdict is
    # gtest's summary line, not the exit status.
    local log=$W/gt/gtest.log
    timeout 300 "$W/gt/gtest_transfer" \
        --gtest_filter='kvbridge*:ucx/TestTransfer.*:ucx_no_pt/TestTransfer.*' >"$log" 2>&1 || true
    grep -E '^\[ +(OK|FAILED) +\]|^\[  (PASSED|FAILED)  \]' "$log"
    grep -q '^\[  PASSED  \] 20 tests' "$log"
}

build_nixlbench() {
    local nb=$W/nb/src
    cp -r "$SRC/benchmark/nixlbench/src" "$nb"
    # the allow-list: KVBRIDGE beside Mooncake, with its default parameters
    python3 - "$nb/worker/nixl/nixl_worker.cpp" <<'EOF'
import sys
p = sys.argv[1]
s = open(p).read()
a = "        0 == xferBenchConfig::backend.compare(XFERBENCH_BACKEND_MOONCAKE) ||\n"
b = ('    } else if (0 == xferBenchConfig::backend.compare(XFERBENCH_BACKEND_MOONCAKE)) {\n'
     '        std::cout << "Mooncake backend" << std::endl;\n')
assert s.count(a) == 1 and s.count(b) == 1, "nixl_worker.cpp changed: patch by hand"
s = s.replace(a, a + '        0 == xferBenchConfig::backend.compare("KVBRIDGE") ||\n')
s = s.replace(b, b + '    } else if (0 == xferBenchConfig::backend.compare("KVBRIDGE")) {\n'
              '        std::cout << "KVBRIDGE backend" << std::endl;\n')
open(p, "w").write(s)
EOF
    local fl=(-std=c++20 -O2 -fopenmp -I"$W/nb" -I"$nb/.." -I"$nb" -I"$W/inc" "${DEPINC[@]}")
    local objs=()
    for f in utils/utils.cpp utils/neuron.cpp runtime/runtime.cpp worker/worker.cpp \
        worker/nixl/nixl_worker.cpp worker/nixl/nixl_mem_region.cpp main.cpp; do
        g++ "${fl[@]}" -c "$nb/$f" -o "$W/nb/$(basename "$f" .cpp).o"
        objs+=("$W/nb/$(basename "$f" .cpp).o")
    done
    g++ -fopenmp -o "$W/nb/nixlbench" "${objs[@]}" -L"$LIBS" -Wl,-rpath,"$LIBS" -lnixl \
        -lnixl_build -lserdes "${DEPLIB[@]}" -lgflags -ldl -lpthread
}

nb_pair() { # BACKEND OP BLOCK BATCH: initiator and target on this host (ASIO rendezvous)
    local port=$((20000 + RANDOM % 20000))
    local args=(--runtime_type=ASIO "--asio_port=$port" --backend="$1" --op_type="$2"
        --initiator_seg_type=DRAM --target_seg_type=DRAM --start_block_size="$3"
        --max_block_size="$3" --start_batch_size="$4" --max_batch_size="$4" --num_iter=32
        --warmup_iter=16 --large_blk_iter_ftr=1 --check_consistency
        --total_buffer_size=$((256 << 20)))
    timeout 120 "$W/nb/nixlbench" "${args[@]}" >"$W/nb/a.log" 2>&1 &
    local a=$!
    sleep 0.5
    local rb=0 ra=0
    timeout 120 "$W/nb/nixlbench" "${args[@]}" >"$W/nb/b.log" 2>&1 || rb=$?
    wait $a || ra=$?
    local line
    line=$(grep -h '^[0-9]' "$W/nb/a.log" "$W/nb/b.log" | head -n 1)
    # nixlbench's columns: block, batch, GB/s, average latency per block (us), prep, p99
    # prep, post, p99 post, tx, p99 tx (us). Exit 139: the wheel's exit crash (above).
    printf '%-8s %-5s %-5s %8s x %-5s %s (exit %s/%s)\n' "$1" "$TR" "$2" "$3" "$4" \
        "$(echo "$line" | awk '{print $3 " GB/s, " $4 " us per block"}')" "$ra" "$rb"
    grep -h -i 'consistency check failed\|mismatch' "$W/nb/a.log" "$W/nb/b.log" || true
}

run_nixlbench() {
    echo "== nixlbench (benchmark/nixlbench at $(git -C "$SRC" rev-parse --short HEAD 2>/dev/null || echo '?'), KVBRIDGE allowed), $(nproc) CPUs"
    echo "== uptime before: $(uptime)"
    for TR in auto tcp; do
        for op in WRITE READ; do
            for cfg in 32768:2048 262144:256 4194304:16; do
                for b in UCX KVBRIDGE; do
                    # (stderr: bash's "Segmentation fault" notices of UCX's exit crash)
                    if [ "$TR" = tcp ] && [ $b = UCX ]; then
                        UCX_TLS=tcp nb_pair $b $op "${cfg%:*}" "${cfg#*:}" 2>/dev/null
                    elif [ $b = KVBRIDGE ]; then
                        KVBRIDGE_TRANSPORT=$TR nb_pair $b $op "${cfg%:*}" "${cfg#*:}" 2>/dev/null
                    else
                        nb_pair $b $op "${cfg%:*}" "${cfg#*:}" 2>/dev/null
                    fi
                done
            done
        done
    done
    echo "== uptime after: $(uptime)"
}

rc=0
for w in "${WHAT[@]}"; do
    case $w in
    gtest) build_gtest && run_gtest || rc=1 ;;
    nixlbench)
        build_nixlbench
        export W TR SRC
        export -f nb_pair run_nixlbench
        if [ -d "$(dirname "${NB_LOCK:-/work/bench.lock}")" ]; then
            flock "${NB_LOCK:-/work/bench.lock}" bash -c run_nixlbench
        else
            run_nixlbench
        fi
        ;;
    *) echo "nixl_tools: unknown $w" >&2; exit 2 ;;
    esac
done
exit $rc
