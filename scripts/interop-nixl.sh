#!/usr/bin/env bash
# kvbridge as a NIXL backend (libplugin_KVBRIDGE.so) inside NIXL's own
# agent, the PyPI wheel nixl-cu12 1.5.1 (+ the meta package nixl 1.5.1 for
# `nixl._api`, the import vLLM uses), run by `make check-interop`; NOT part
# of `make check` (it needs PyPI and NIXL's headers). Steps:
#  1. NIXL's headers (the wheel ships none): NIXL_INCLUDE_DIR (an install's
#     include/ or a folder scripts/nixl-headers.sh made), or NIXL_SRC and
#     ABSL_SRC (checkouts of ai-dynamo/nixl and abseil-cpp) laid out into
#     BUILD/nixl-include. Neither given: SKIPPED (exit 0).
#  2. A venv BUILD/nixl-venv (Debian's python3 with its numpy; the wheels
#     --no-deps: nixl-cu12 declares torch, which host memory does not need).
#  3. The plug-in built into BUILD (cmake -DKVB_NIXL=ON) and a plug-in
#     folder BUILD/nixl-plugins holding it and links to the wheel's own
#     plug-ins (NIXL_PLUGIN_DIR replaces NIXL's default folder), with the
#     wheel's bundled-library folder on LD_LIBRARY_PATH (below).
#  4. It must load (NIXL logs a refused plug-in only at INFO), then the
#     cases: tests/interop/nixl_pair.py (params write_read notif local
#     socket_md bounds kill release vram vram_vmm vram_refused; two
#     processes each, except params, local and socket_md) and
#     tests/interop/nixl_vllm_pull.py (vLLM 0.34's NixlConnector pull
#     replayed); write_read, vram and the replay also over the message lane
#     (KVBRIDGE_TRANSPORT=tcp). vram*: VRAM_SEG against the CUDA driver-API
#     test double (BUILD's libkvb_cuda_double.so; plumbing only, no GPU).
#     Logs: BUILD/interop-nixl/*.log.
# Usage: scripts/interop-nixl.sh [BUILD_DIR] [CASE...]   (make build first)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=$(cd "${1:-$ROOT/build}" && pwd)
shift || true
CASES=("$@")
if [ ${#CASES[@]} -eq 0 ]; then
    CASES=(params write_read notif local socket_md bounds kill release vram vram_vmm
        vram_refused vllm_pull write_read@tcp vram@tcp vllm_pull@tcp)
fi
PINS="nixl-cu12==1.5.1 nixl==1.5.1"

# 1. headers
INC=${NIXL_INCLUDE_DIR:-}
if [ -z "$INC" ] && [ -n "${NIXL_SRC:-}" ] && [ -n "${ABSL_SRC:-}" ]; then
    INC=$BUILD/nixl-include
    rm -rf "$INC"
    bash "$ROOT/scripts/nixl-headers.sh" "$NIXL_SRC" "$ABSL_SRC" "$INC" >/dev/null
fi
if [ -z "$INC" ] || [ ! -f "$INC/backend/backend_plugin.h" ]; then
    echo "interop-nixl: SKIPPED: no NIXL headers: set NIXL_INCLUDE_DIR (a folder with" \
        "backend/backend_plugin.h and abseil's absl/), or NIXL_SRC and ABSL_SRC (checkouts" \
        "of ai-dynamo/nixl and abseil-cpp 20250814.1); docs/nixl.md"
    exit 0
fi

# 2. the pinned wheel
VENV=$BUILD/nixl-venv
if [ ! -f "$VENV/.interop-stamp" ] || [ "$(cat "$VENV/.interop-stamp")" != "$PINS" ]; then
    if ! timeout 20 /usr/bin/python3 -c \
        'import urllib.request; urllib.request.urlopen("https://pypi.org/simple/nixl-cu12/", timeout=15)' \
        >/dev/null 2>&1; then
        echo "interop-nixl: SKIPPED: PyPI (pypi.org) is unreachable and $VENV is not set up"
        exit 0
    fi
    rm -rf "$VENV"
    /usr/bin/python3 -m venv --system-site-packages "$VENV"
    # shellcheck disable=SC2086
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-deps $PINS
    printf '%s' "$PINS" >"$VENV/.interop-stamp"
fi
LIBS=$("$VENV/bin/python" -c 'import nixl_cu12, os; print(os.path.join(os.path.dirname(os.path.dirname(nixl_cu12.__file__)), ".nixl_cu12.mesonpy.libs"))')

# 3. the plug-in and its folder
cmake -S "$ROOT" -B "$BUILD" -DKVB_NIXL=ON -DNIXL_INCLUDE_DIR="$INC" >/dev/null
cmake --build "$BUILD" -j"${JOBS:-2}" --target kvbridge_nixl kvb_cuda_double >/dev/null
# the vram cases' "device" memory: the driver double (never a GPU), which
# nixl_pair.py hands to kvbridge as KVBRIDGE_CUDA_LIB in those cases only
export KVBRIDGE_CUDA_DOUBLE=$BUILD/tests/cuda/libkvb_cuda_double.so
PLUG=$BUILD/nixl-plugins
rm -rf "$PLUG"
mkdir -p "$PLUG"
for p in "$LIBS"/plugins/libplugin_*.so; do ln -s "$p" "$PLUG/"; done
ln -sf "$BUILD/libplugin_KVBRIDGE.so" "$PLUG/libplugin_KVBRIDGE.so"
export NIXL_PLUGIN_DIR=$PLUG
# The wheel's plug-ins find their bundled libraries (libucp-<hash>.so ...) by
# an $ORIGIN-relative RPATH, which a link in another folder breaks: without
# this NIXL refuses "UCX" from $PLUG (NIXL_ERR_NOT_FOUND, logged at INFO).
LD_LIBRARY_PATH=$(dirname "$LIBS")/nixl_cu12.libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export LD_LIBRARY_PATH
export PYTHONPATH=$ROOT/tests/interop

# 4. it loads, then the cases
echo "== NIXL $("$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("nixl-cu12"))') (PyPI nixl-cu12) with backend KVBRIDGE"
"$VENV/bin/python" -c '
import os
from nixl._api import nixl_agent, nixl_agent_config
a = nixl_agent("probe", nixl_agent_config(backends=[]))
plugins = a.get_plugin_list()
print("plug-ins:", plugins, "| KVBRIDGE params:", a.get_plugin_params("KVBRIDGE"))
try:  # NIXL lists a plug-in by its file name; UCX beside ours must also load
    a.create_backend("UCX")
except Exception:
    os._exit(2)
os._exit(0 if "KVBRIDGE" in plugins else 1)' 2>/dev/null ||
    { echo "interop-nixl: NIXL does not list KVBRIDGE, or cannot create UCX, from $PLUG" >&2
        exit 1; }
OUT=$BUILD/interop-nixl
rm -rf "$OUT"
mkdir -p "$OUT"
rc=0
for c in "${CASES[@]}"; do
    name=${c%@*} tr=auto
    [ "$c" != "$name" ] && tr=${c#*@}
    if [ "$name" = vllm_pull ]; then
        cmd=("$VENV/bin/python" "$ROOT/tests/interop/nixl_vllm_pull.py")
    else
        cmd=("$VENV/bin/python" "$ROOT/tests/interop/nixl_pair.py" "$name")
    fi
    log=$OUT/${name}_$tr.log
    if KVBRIDGE_TRANSPORT=$tr timeout 180 "${cmd[@]}" >"$log" 2>&1; then
        echo "$c: $(grep -E '^(ok|FAIL)' "$log" | tail -n 1)"
    else
        echo "FAIL $c (log: $log)"
        grep -v 'NIXL INFO' "$log" | tail -n 15
        rc=1
    fi
done
exit $rc
