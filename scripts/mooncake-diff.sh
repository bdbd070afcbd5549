#!/usr/bin/env bash
# Opt-in differential test of the mooncake.engine drop-in (NOT part of
# `make check`: it needs PyPI). Makes a venv under the build folder, installs
# pinned releases of Mooncake's CPU-only engine and numpy, runs one call
# sequence (tests/interop/mooncake_diff.py) through Mooncake's real module and
# through python/compat/mooncake, and compares the values; the differences
# that are the drop-in's documented limits are listed in EXPECTED there.
# Usage: scripts/mooncake-diff.sh [BUILD_DIR]   (libkvbridge.so must be built)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=$(cd "${1:-$ROOT/build}" && pwd)
VENV=$BUILD/mooncake-venv
MOONCAKE_PIN=mooncake-transfer-engine-non-cuda==0.3.13.post1
NUMPY_PIN=numpy==2.4.6
if [ ! -x "$VENV/bin/python" ]; then
    /usr/bin/python3 -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install -q --disable-pip-version-check "$MOONCAKE_PIN" "$NUMPY_PIN"
OUT=$BUILD/mooncake-diff
mkdir -p "$OUT"
PROG=$ROOT/tests/interop/mooncake_diff.py
# Mooncake's own module: the compat folder must not be on the path.
env -u PYTHONPATH timeout 300 "$VENV/bin/python" "$PROG" real "$OUT/real.json" >"$OUT/real.log" 2>&1
PYTHONPATH=$ROOT/python/compat KVBRIDGE_LIB=$BUILD/libkvbridge.so \
    timeout 300 "$VENV/bin/python" "$PROG" dropin "$OUT/dropin.json" >"$OUT/dropin.log" 2>&1
"$VENV/bin/python" "$PROG" compare "$OUT/real.json" "$OUT/dropin.json"
