#!/usr/bin/env bash
# Side by side (issue 16 §3): Mooncake's transfer engine, NIXL's UCX backend
# and kvbridge (through Mooncake's Python surface: the python/compat/mooncake
# drop-in on this build's libkvbridge.so) move the same blocks between two
# processes of this host, with memcpy and raw TCP yardsticks, in one run
# (bench/side_by_side.py says what each row is). Opt-in, NOT part of
# `make check`: it installs pinned PyPI releases into a venv under the build
# folder (the recipe of scripts/mooncake-diff.sh). NIXL comes from
# nixl-cu12 (the `nixl` meta package's 1.5.2 has no nixl-cu12 1.5.2 for
# Python 3.11), installed without its torch dependency (only imported for
# type checks); SBS_NIXL=0 skips it.
# Usage: [SBS_NIXL=0] bench/side_by_side.sh [BUILD_DIR] [--ws MiB] [--sizes ...] [--reps N]
# Writes bench/results/side-by-side.json and prints the markdown table.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=$(cd "${1:-$ROOT/build}" && pwd)
shift || true
VENV=$BUILD/side-venv
MOONCAKE_PIN=mooncake-transfer-engine-non-cuda==0.3.13.post1
NUMPY_PIN=numpy==2.4.6
NIXL_PIN=nixl-cu12==1.5.1
if [ ! -x "$VENV/bin/python" ]; then
    /usr/bin/python3 -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install -q --disable-pip-version-check "$MOONCAKE_PIN" "$NUMPY_PIN"
ONLY=mooncake,kvbridge
if [ "${SBS_NIXL:-1}" != 0 ]; then
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-deps "$NIXL_PIN"
    ONLY=$ONLY,nixl
fi
OUT=$ROOT/bench/results/side-by-side.json
echo "side_by_side: $(uptime)" >&2
SBS_COMPAT=$ROOT/python/compat KVBRIDGE_LIB=$BUILD/libkvbridge.so \
    timeout 3600 "$VENV/bin/python" "$ROOT/bench/side_by_side.py" run "$OUT" --only "$ONLY" "$@" \
    2> >(grep '^{' >&2)
echo "load after: $(uptime)" >&2
"$VENV/bin/python" "$ROOT/bench/side_by_side.py" table "$OUT"
