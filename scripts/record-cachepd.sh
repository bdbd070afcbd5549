#!/usr/bin/env bash
# Refresh the CachePD golden corpus (tests/conformance/tokenspeed_cachepd/)
# from TokenSpeed 0.1.1's own code (NOT part of `make check`, which only
# replays the committed files; this needs PyPI once). Makes a venv at
# BUILD/cachepd-venv (Debian's python3 with its system packages: numpy,
# requests) holding the pinned tokenspeed==0.1.1 wheel (--no-deps: the
# release's requirements pull torch and GPU kernels, and nothing recorded
# here runs them), then runs tests/interop/cachepd_record.py, which builds
# contracts, manifests, frames, bootstrap bodies and the planner's routes and
# copy lists with TokenSpeed's own functions (what it stubs, and why, is in
# its docstring). `git diff tests/conformance/tokenspeed_cachepd` then shows
# what a release changed. When the C replay is built, it runs it on the new
# files (docs/testing.md, "Conformance corpus"; docs/tokenspeed-cachepd-fields.md).
# Also run by `scripts/interop-tokenspeed.sh --record`.
# Usage: scripts/record-cachepd.sh [BUILD_DIR]
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${1:-$ROOT/build}
mkdir -p "$BUILD"
BUILD=$(cd "$BUILD" && pwd)
PIN=0.1.1
VENV=$BUILD/cachepd-venv
OUT=$ROOT/tests/conformance/tokenspeed_cachepd
[ -x "$VENV/bin/python" ] || /usr/bin/python3 -m venv --system-site-packages "$VENV"
if [ "$("$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("tokenspeed"))' \
    2>/dev/null)" != "$PIN" ]; then
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-deps "tokenspeed==$PIN"
fi
mkdir -p "$OUT"
rm -f "$OUT"/*.json
PYTHONWARNINGS=ignore "$VENV/bin/python" "$ROOT/tests/interop/cachepd_record.py" "$OUT"
REPLAY=$BUILD/tests/cachepd/test_cachepd_codec
if [ -x "$REPLAY" ]; then
    "$REPLAY" "$OUT"
else
    echo "record-cachepd: $REPLAY not built; replay with make check"
fi
