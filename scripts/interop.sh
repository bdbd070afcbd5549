#!/usr/bin/env bash
# Interop suite (`make check-interop`; NOT part of `make check`: it needs
# PyPI and ~12 GB of disk). Makes two venvs under the build folder, each with
# a pinned SGLang release (--no-deps: their full requirement sets pull
# GPU-only packages) and the exact set of packages its Mooncake PD connector
# imports (tests/interop/requirements-sglang*.txt, all pinned, also
# --no-deps): 0.5.23 (the 2026 dialect) and 0.5.2rc2 (seed 001's). Then runs
# each SGLang's real connector, unmodified, against kvbridge's C
# prefill/decode (tests/interop/sglang_pd.py, sglang_old.py) with kvbridge's
# Mooncake drop-in (python/compat, first on PYTHONPATH) as SGLang's transfer
# engine.
# What is stubbed: tests/interop/sglang_stubs.py, sglang_old.py, sglang_checksum.py (docs/testing.md, "Interop
# suite"). Then runs scripts/mooncake-diff.sh (drop-in vs Mooncake's real
# module). Logs: BUILD/interop/*.log, BUILD/interop-0.5.2/*.log.
# --record: also record every ZeroMQ message and bootstrap body SGLang's own
# code sends and reads (tests/interop/interop_record.py) into
# BUILD/interop-record/, and refresh the golden files of
# tests/conformance/sglang2026/ and sglang2025/ from them
# (tests/conformance/corpus.py import; `git diff tests/conformance` then shows
# what the release changed). Skips mooncake-diff. docs/testing.md,
# "Conformance corpus". It also rewrites tests/interop/golden/
# sglang0523_kv_checksum.json (tests/interop/ck_golden.py): what SGLang
# 0.5.23's --disaggregation-enable-kv-checksum changes on the wire.
# The ck_ cases of the 0.5.23 run are that flag both ways
# (tests/interop/sglang_checksum.py, docs/integrity.md "With SGLang's own
# checksum").
# Usage: scripts/interop.sh [--record] [BUILD_DIR]   (libkvbridge.so must be built)
set -euo pipefail
RECORD=0
if [ "${1:-}" = "--record" ]; then
    RECORD=1
    shift
fi
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=$(cd "${1:-$ROOT/build}" && pwd)
if [ ! -f "$BUILD/libkvbridge.so" ]; then
    echo "interop: $BUILD/libkvbridge.so missing: build first (make build)" >&2
    exit 2
fi

# venv DIR PIN REQS: make DIR a venv holding REQS and PIN (all --no-deps);
# installed once, a changed pin list reinstalls. PyPI unreachable when it
# must install: the suite is skipped with a message (exit 0).
venv() {
    local dir=$1 pin=$2 reqs=$3 want
    [ -x "$dir/bin/python" ] || /usr/bin/python3 -m venv "$dir"
    want=$(cat "$reqs" "$(dirname "$reqs")/requirements-sglang.txt"; echo "$pin")
    if [ ! -f "$dir/.interop-stamp" ] || [ "$(cat "$dir/.interop-stamp")" != "$want" ]; then
        if ! timeout 20 /usr/bin/python3 -c \
            'import urllib.request; urllib.request.urlopen("https://pypi.org/simple/sglang/", timeout=15)' \
            >/dev/null 2>&1; then
            echo "interop: SKIPPED: PyPI (pypi.org) is unreachable and $dir is not set up ($pin)"
            exit 0
        fi
        "$dir/bin/python" -m pip install -q --disable-pip-version-check --no-deps -r "$reqs"
        "$dir/bin/python" -m pip install -q --disable-pip-version-check --no-deps "$pin"
        printf '%s' "$want" >"$dir/.interop-stamp"
    fi
}

# run VENV MODE OUT [DIALECT RELEASE]: the cases of sglang_pd.py MODE (run /
# run-0.5.2); with --record, recorded as DIALECT / RELEASE.
REC=$BUILD/interop-record
run() {
    rm -rf "$3"
    mkdir -p "$3"
    local rec=()
    if [ "$RECORD" = 1 ]; then
        rec=(KVB_RECORD_DIR="$REC" KVB_RECORD_DIALECT="$4" KVB_RECORD_RELEASE="$5")
    fi
    env "${rec[@]}" PYTHONPATH="$ROOT/python/compat:$ROOT/python" \
        KVBRIDGE_LIB="$BUILD/libkvbridge.so" SGLANG_HOST_IP=127.0.0.1 PYTHONWARNINGS=ignore \
        timeout 900 "$1/bin/python" "$ROOT/tests/interop/sglang_pd.py" "$2" "$3"
}
if [ "$RECORD" = 1 ]; then
    if [ ! -x "$BUILD/tests/conformance/test_conformance" ]; then
        echo "interop --record: $BUILD/tests/conformance/test_conformance missing: build first" >&2
        exit 2
    fi
    rm -rf "$REC"
    mkdir -p "$REC"
fi

REQS=$ROOT/tests/interop
venv "$BUILD/interop-venv" sglang==0.5.23 "$REQS/requirements-sglang-0.5.23.txt"
venv "$BUILD/interop-venv-0.5.2" sglang==0.5.2rc2 "$REQS/requirements-sglang-0.5.2.txt"
rc=0
echo "== SGLang 0.5.23 Mooncake connector <-> kvbridge (drop-in engine), 2026 dialect"
run "$BUILD/interop-venv" run "$BUILD/interop" sglang2026 sglang==0.5.23 || rc=1
echo "== SGLang 0.5.2rc2 Mooncake connector <-> kvbridge (drop-in engine), seed-001 dialect"
run "$BUILD/interop-venv-0.5.2" run-0.5.2 "$BUILD/interop-0.5.2" sglang2025 sglang==0.5.2rc2 || rc=1
if [ "$RECORD" = 1 ]; then
    echo "== recorded: $REC -> tests/conformance (corpus.py import)"
    KVB_CONFORMANCE_READER=$BUILD/tests/conformance/test_conformance \
        /usr/bin/python3 "$ROOT/tests/conformance/corpus.py" import "$REC" || rc=1
    /usr/bin/python3 "$ROOT/tests/interop/ck_golden.py" "$REC" \
        "$ROOT/tests/interop/golden/sglang0523_kv_checksum.json" || rc=1
    "$BUILD/tests/conformance/test_conformance" "$ROOT/tests/conformance" || rc=1
    exit $rc
fi
echo "== mooncake.engine: drop-in vs Mooncake's real module (scripts/mooncake-diff.sh)"
bash "$ROOT/scripts/mooncake-diff.sh" "$BUILD" || rc=1
exit $rc
