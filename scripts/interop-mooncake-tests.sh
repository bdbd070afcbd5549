#!/usr/bin/env bash
# Mooncake's own transfer-engine tests, unmodified, on kvbridge's
# mooncake.engine drop-in (run by `make check-interop`; NOT part of
# `make check`: it needs Mooncake's source tree). From the tree (nothing of it
# is copied into this repository) it runs mooncake-wheel/tests/
# transfer_engine_target.py + transfer_engine_initiator_test.py (P2PHANDSHAKE
# over TCP), test_import_structure.py and mooncake-transfer-engine/tests/
# rpc_communicator_test.py with python/compat first on PYTHONPATH and
# /usr/bin/python3 (they need no PyPI package); the cases, and which are
# not applicable and why: tests/interop/mooncake_tests.py.
#   MOONCAKE_SRC (or --mooncake PATH)  a Mooncake source tree (a checkout of
#       kvcache-ai/Mooncake, or `git archive` of one). Unset: the cases are
#       SKIPPED with a message naming it, exit status 0.
#   --real PYTHON  run the same cases on Mooncake's real engine instead: an
#       interpreter that imports Mooncake's wheel (e.g. BUILD/mooncake-venv/
#       bin/python from scripts/mooncake-diff.sh); the drop-in is not on its
#       path. Every case is then expected to pass.
# Logs: BUILD/interop-mooncake-tests[-real]/.
# Usage: scripts/interop-mooncake-tests.sh [--mooncake PATH] [--real PYTHON] [BUILD_DIR]
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
SRC=${MOONCAKE_SRC:-}
REAL=
while [ $# -gt 0 ]; do
    case $1 in
    --mooncake) SRC=$2; shift 2 ;;
    --real) REAL=$2; shift 2 ;;
    *) break ;;
    esac
done
BUILD=$(cd "${1:-$ROOT/build}" && pwd)
if [ -z "$SRC" ]; then
    echo "SKIP: Mooncake's own transfer-engine tests (19 cases): no Mooncake source tree;" \
        "set MOONCAKE_SRC (or --mooncake PATH) to a kvcache-ai/Mooncake checkout to run them"
    exit 0
fi
if [ ! -d "$SRC/mooncake-wheel/tests" ]; then
    echo "interop-mooncake-tests: $SRC is not a Mooncake source tree" \
        "(no mooncake-wheel/tests)" >&2
    exit 2
fi
SRC=$(cd "$SRC" && pwd)
DRIVER=$ROOT/tests/interop/mooncake_tests.py
if [ -n "$REAL" ]; then
    echo "== Mooncake's transfer-engine tests ($SRC) on Mooncake's real engine ($REAL)"
    exec env -u PYTHONPATH -u KVBRIDGE_LIB timeout 900 "$REAL" "$DRIVER" "$SRC" \
        "$BUILD/interop-mooncake-tests-real" real
fi
if [ ! -e "$BUILD/libkvbridge.so" ]; then
    echo "interop-mooncake-tests: $BUILD/libkvbridge.so missing: build first (make build)" >&2
    exit 2
fi
echo "== Mooncake's transfer-engine tests ($SRC) on kvbridge's drop-in (python/compat)"
PYTHONPATH=$ROOT/python/compat:$ROOT/python KVBRIDGE_LIB=$BUILD/libkvbridge.so \
    timeout 900 /usr/bin/python3 "$DRIVER" "$SRC" "$BUILD/interop-mooncake-tests" dropin
