#!/usr/bin/env bash
# Interop suite (`make check-interop`; NOT part of `make check`: it needs
# PyPI and ~6 GB of disk). Makes a venv under the build folder, installs
# pinned releases of SGLang (0.5.23, --no-deps: its full requirement set pulls
# GPU-only packages) and the exact set of packages its Mooncake PD connector
# imports (tests/interop/requirements-sglang.txt, all pinned, also --no-deps),
# then runs SGLang's real connector, unmodified, against kvbridge's C
# prefill/decode (tests/interop/sglang_pd.py) with kvbridge's Mooncake
# drop-in (python/compat, first on PYTHONPATH) as SGLang's transfer engine.
# What is stubbed: tests/interop/sglang_stubs.py (docs/testing.md, "Interop
# suite"). Then runs scripts/mooncake-diff.sh (drop-in vs Mooncake's real
# module). Logs: BUILD/interop/*.log.
# Usage: scripts/interop.sh [BUILD_DIR]   (libkvbridge.so must be built)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=$(cd "${1:-$ROOT/build}" && pwd)
VENV=$BUILD/interop-venv
SGLANG_PIN=sglang==0.5.23
REQS=$ROOT/tests/interop/requirements-sglang.txt
PIP=("$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-deps)
if [ ! -f "$BUILD/libkvbridge.so" ]; then
    echo "interop: $BUILD/libkvbridge.so missing: build first (make build)" >&2
    exit 2
fi
if [ ! -x "$VENV/bin/python" ]; then
    /usr/bin/python3 -m venv "$VENV"
fi
# Installed once; a changed pin list reinstalls.
STAMP=$VENV/.interop-stamp
WANT=$(cat "$REQS"; echo "$SGLANG_PIN")
if [ ! -f "$STAMP" ] || [ "$(cat "$STAMP")" != "$WANT" ]; then
    "${PIP[@]}" -r "$REQS"
    "${PIP[@]}" "$SGLANG_PIN"
    printf '%s' "$WANT" >"$STAMP"
fi
OUT=$BUILD/interop
rm -rf "$OUT"
mkdir -p "$OUT"
rc=0
echo "== SGLang $SGLANG_PIN Mooncake connector <-> kvbridge (drop-in engine)"
PYTHONPATH=$ROOT/python/compat:$ROOT/python KVBRIDGE_LIB=$BUILD/libkvbridge.so \
    SGLANG_HOST_IP=127.0.0.1 PYTHONWARNINGS=ignore \
    timeout 900 "$VENV/bin/python" "$ROOT/tests/interop/sglang_pd.py" run "$OUT" || rc=1
echo "== mooncake.engine: drop-in vs Mooncake's real module (scripts/mooncake-diff.sh)"
bash "$ROOT/scripts/mooncake-diff.sh" "$BUILD" || rc=1
exit $rc
