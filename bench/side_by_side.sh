#!/usr/bin/env bash
# Side by side against Mooncake 0.3.14 (bench/side_by_side.py says what every
# row and column is): Mooncake's real transfer engine and kvbridge through
# the same Python calls (the python/compat/mooncake drop-in on this build's
# libkvbridge.so) move the same blocks between two processes of this host,
# writes and reads, plus the pages call against the plain batch call, with
# memcpy (one thread, all cores) and raw TCP yardsticks, in one run.
# Opt-in, NOT part of `make check`: it installs pinned PyPI releases into
# venvs under the build folder.
#
# Mooncake 0.3.14 exists on PyPI only as mooncake-transfer-engine-cuda13
# (cp311): its engine.so has libcuda.so.1 as a DT_NEEDED library, so it does
# not import without a GPU driver. This script builds a stand-in
# (bench/libcuda_standin.c: every driver entry point the engine imports,
# listed from `nm -D --undefined-only engine.so`, counts its call and returns
# CUDA_ERROR_NO_DEVICE; it copies nothing) into the venv's folder; only
# Mooncake's processes get that folder on LD_LIBRARY_PATH. Proof that no
# driver call happens while bytes move: every row records the stand-in's
# counter in writer and target (setup and timed passes apart), and the check
# below (before the run) records with LD_DEBUG=bindings which files bind to
# the stand-in and what they call.
#
# Options (environment): SBS_MC13=1 adds Mooncake 0.3.13.post1 (non-cuda
# wheel), SBS_NIXL=1 NIXL's UCX backend (both in $BUILD/side-venv, the
# earlier side-by-side recipe), SBS_TSMC=1 TokenSpeed's fork
# tokenspeed-mooncake 0.3.13.post20261027 (CUDA 13 wheel, the same stand-in);
# SBS_OUT=path for the JSON (default bench/results/side-by-side-0314.json);
# SBS_PIP_ARGS extra pip arguments (e.g. --find-links DIR with the wheels).
# Usage: bench/side_by_side.sh [BUILD_DIR] [--ws MiB] [--sizes ...] [--reps N]
#        [--rounds R] [--ops write,read] [--pages-rounds N]
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=$(cd "${1:-$ROOT/build}" && pwd)
shift || true
[ -f "$BUILD/libkvbridge.so" ] || { echo "side_by_side: no $BUILD/libkvbridge.so" >&2; exit 2; }
# shellcheck disable=SC2206 # SBS_PIP_ARGS: several words on purpose
PIP=(-m pip install -q --disable-pip-version-check ${SBS_PIP_ARGS:-})
CC=${CC:-cc}

# Mooncake 0.3.14 and everything it pulls in, pinned (pip freeze of the venv)
VENV14=$BUILD/side-venv-0314
PINS14=(mooncake-transfer-engine-cuda13==0.3.14 numpy==2.4.6 aiohttp==3.14.5
    aiohappyeyeballs==2.7.1 aiosignal==1.4.0 attrs==26.1.0 frozenlist==1.8.0
    multidict==7.2.1 propcache==0.5.4 yarl==1.25.1 idna==3.20 requests==2.34.2
    certifi==2026.10.19.post1 charset-normalizer==3.5.3 urllib3==2.8.0 msgpack==1.2.4
    typing_extensions==4.16.0)
# the earlier side-by-side's venv (Mooncake 0.3.13.post1, NIXL)
VENV13=$BUILD/side-venv
PINS13=(mooncake-transfer-engine-non-cuda==0.3.13.post1 numpy==2.4.6)
NIXL_PIN=nixl-cu12==1.5.1
# TokenSpeed's fork (needs nvidia-cuda-runtime; the wheel names libcudart.so.13)
VENVTS=$BUILD/side-venv-tsmc
PINSTS=(tokenspeed-mooncake==0.3.13.post20261027 nvidia-cuda-runtime==13.5.37 numpy==2.4.6)

venv() { # venv DIR PINS...
    local d=$1
    shift
    [ -x "$d/bin/python" ] || /usr/bin/python3 -m venv "$d"
    timeout 1200 "$d/bin/python" "${PIP[@]}" "$@"
}

standin() { # standin VENV: build the libcuda.so.1 stand-in for that venv's engine.so
    local v=$1 so dir
    so=$("$v/bin/python" -c 'import importlib.util as u; print(u.find_spec("mooncake").submodule_search_locations[0])')/engine.so
    dir=$v/cuda-standin
    mkdir -p "$dir"
    nm -D --undefined-only "$so" | awk '$1 == "U" {print $2}' | sed 's/@.*//' |
        grep -E '^cu[A-Z]' | sort -u | while read -r s; do
        case $s in
        cuGetErrorName | cuGetErrorString) echo "E($s)" ;;
        *) echo "S($s)" ;;
        esac
    done >"$dir/standin_syms.h"
    "$CC" -O2 -Wall -Wextra -shared -fPIC -fvisibility=hidden -Wl,-soname,libcuda.so.1 \
        -I"$dir" "$ROOT/bench/libcuda_standin.c" -o "$dir/libcuda.so.1"
    echo "$dir"
}

venv "$VENV14" "${PINS14[@]}"
export SBS_PY_MC14=$VENV14/bin/python SBS_PY_KVB=$VENV14/bin/python
SBS_LD_MC14=$(standin "$VENV14")
export SBS_LD_MC14
"$CC" -O2 -Wall -Wextra -shared -fPIC -fvisibility=hidden -pthread "$ROOT/bench/sbs_copy.c" \
    -o "$VENV14/sbs_copy.so"
export SBS_COPY_LIB=$VENV14/sbs_copy.so
ONLY=mc14,kvbridge
if [ "${SBS_MC13:-0}" = 1 ] || [ "${SBS_NIXL:-0}" = 1 ]; then
    venv "$VENV13" "${PINS13[@]}"
    export SBS_PY_MC13=$VENV13/bin/python
    [ "${SBS_MC13:-0}" = 1 ] && ONLY=$ONLY,mc13
    if [ "${SBS_NIXL:-0}" = 1 ]; then
        timeout 1200 "$VENV13/bin/python" "${PIP[@]}" --no-deps "$NIXL_PIN"
        ONLY=$ONLY,nixl
    fi
fi
if [ "${SBS_TSMC:-0}" = 1 ]; then
    venv "$VENVTS" "${PINSTS[@]}"
    export SBS_PY_TSMC=$VENVTS/bin/python
    SBS_LD_TSMC=$(standin "$VENVTS")
    export SBS_LD_TSMC
    ONLY=$ONLY,tsmc
fi
export SBS_COMPAT=$ROOT/python/compat KVBRIDGE_LIB=$BUILD/libkvbridge.so
OUT=${SBS_OUT:-$ROOT/bench/results/side-by-side-0314.json}

# The stand-in check: one short Mooncake 0.3.14 write row and one read row
# under LD_DEBUG=bindings (writer and target), every process's stand-in
# counters logged at exit (KVB_STANDIN_LOG), and a positive control (a
# direct cuInit through the loaded stand-in must count 1).
CHECK=${OUT%.json}-standin.txt
LDD=$(mktemp -d)
{
    echo "# libcuda.so.1 stand-in check, $(date -u '+%F %T UTC')"
    echo "stand-in: $SBS_LD_MC14/libcuda.so.1 ($(grep -c . "$SBS_LD_MC14/standin_syms.h") entry points)"
    for op in write read; do
        LD_LIBRARY_PATH=$SBS_LD_MC14 LD_DEBUG=bindings LD_DEBUG_OUTPUT=$LDD/ld KVB_STANDIN_LOG=$LDD/calls \
            timeout 300 "$SBS_PY_MC14" "$ROOT/bench/side_by_side.py" row mc14 tcp $op $((16 << 20)) 262144 2 \
            2>/dev/null | tail -1 | sed "s/^/row ($op): /"
    done
    echo "bindings to the stand-in (file that binds -> symbol), all processes of both rows:"
    cat "$LDD"/ld.* | grep "to $SBS_LD_MC14/libcuda.so.1" | sed 's/.*binding file //' |
        awk '{print $1, $NF}' | sort | uniq -c | sed 's/^/  /'
    echo "stand-in calls logged at exit, per process (pid total N, then any entry point called):"
    sed 's/^/  /' "$LDD/calls"
    echo "positive control (the counter counts): $(LD_LIBRARY_PATH=$SBS_LD_MC14 "$SBS_PY_MC14" -c '
import ctypes
c = ctypes.CDLL("libcuda.so.1")
print("cuInit(0) ->", c.cuInit(0), "; calls counted:", c.kvb_standin_calls())')"
} >"$CHECK"
rm -rf "$LDD"
cat "$CHECK" >&2

echo "side_by_side: $(uptime)" >&2
timeout "${SBS_TIMEOUT:-5400}" "$SBS_PY_MC14" "$ROOT/bench/side_by_side.py" run "$OUT" --only "$ONLY" "$@" \
    2> >(grep '^{' | cut -c1-400 >&2)
echo "load after: $(uptime)" >&2
"$SBS_PY_MC14" "$ROOT/bench/side_by_side.py" table "$OUT"
