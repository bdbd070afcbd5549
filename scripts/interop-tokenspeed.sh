#!/usr/bin/env bash
# TokenSpeed interop (run by `make check-interop`, after scripts/interop.sh;
# NOT part of `make check`: it needs TokenSpeed's source and PyPI). Runs
# TokenSpeed's own decode receiver (lightseekorg/tokenspeed at e41aa8b1609a,
# whose pd/mooncake/receiver.py is seed 004), unmodified, against kvbridge's
# C prefill ranks (ts_helper) with kvbridge's Mooncake drop-in
# (python/compat) as its transfer engine: TP1->TP1, TP2->TP1, MLA,
# MLA TP2->TP1, prefix skip, a killed prefill and a killed prefill rank
# whose bootstrap server lives on (Failed with TokenSpeed's reasons); then
# TokenSpeed's own prefill and bootstrap server, unmodified, against
# kvbridge's C decode (sglang26_helper decode): TP1->TP1, prefix skip, TP2->TP1
# (kvbridge's plan executed by TokenSpeed's prefill). Every KV byte and the
# first token are checked. What is stubbed, and why:
# tests/interop/tokenspeed_common.py (docs/testing.md).
#   TOKENSPEED_SRC  a git clone of lightseekorg/tokenspeed holding that
#                   commit (default: cloned into BUILD/tokenspeed-git). When
#                   neither it nor a clone can be had (a machine that cannot
#                   reach github), the seed-004 cases are SKIPPED with a
#                   message naming TOKENSPEED_SRC, and the exit status says
#                   only how what ran went (0 when nothing ran).
# --record: also record what TokenSpeed's code sends and reads
# (tests/interop/interop_record.py) into BUILD/interop-record-ts/ and refresh
# tests/conformance/tokenspeed_seed004/ from it (docs/testing.md,
# "Conformance corpus"), and refresh tests/conformance/tokenspeed_cachepd/
# from the PyPI release tokenspeed==0.1.1 (scripts/record-cachepd.sh; needs
# PyPI, not TOKENSPEED_SRC).
# Usage: scripts/interop-tokenspeed.sh [--record] [BUILD_DIR]   (make build first)
set -euo pipefail
RECORD=0
if [ "${1:-}" = "--record" ]; then
    RECORD=1
    shift
fi
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=$(cd "${1:-$ROOT/build}" && pwd)
COMMIT=e41aa8b1609a9412d7ed26aa56d910828607950f
VENV=$BUILD/ts-venv
HELPER=$BUILD/tests/integration/tokenspeed/ts_helper
HELPER26=$BUILD/tests/integration/sglang26/sglang26_helper
for f in "$BUILD/libkvbridge.so" "$HELPER" "$HELPER26"; do
    if [ ! -e "$f" ]; then
        echo "interop-tokenspeed: $f missing: build first (make build)" >&2
        exit 2
    fi
done
rc=0
if [ "$RECORD" = 1 ]; then
    echo "== CachePD corpus from tokenspeed==0.1.1 (scripts/record-cachepd.sh)"
    bash "$ROOT/scripts/record-cachepd.sh" "$BUILD" || rc=1
fi

# source_ok: TokenSpeed's tree at $COMMIT is reachable as $SRC (TOKENSPEED_SRC,
# else a clone into BUILD/tokenspeed-git); false, with the reason printed,
# when it is not (no network to github, a TOKENSPEED_SRC without the commit).
SRC=${TOKENSPEED_SRC:-$BUILD/tokenspeed-git}
source_ok() {
    git -C "$SRC" cat-file -e "$COMMIT^{commit}" 2>/dev/null && return 0
    if [ -n "${TOKENSPEED_SRC:-}" ]; then
        echo "interop-tokenspeed: TOKENSPEED_SRC=$TOKENSPEED_SRC does not hold commit $COMMIT"
        return 1
    fi
    rm -rf "$BUILD/tokenspeed-git"
    if ! GIT_TERMINAL_PROMPT=0 timeout 300 git clone -q --filter=blob:none \
        https://github.com/lightseekorg/tokenspeed "$BUILD/tokenspeed-git" \
        >"$BUILD/tokenspeed-clone.log" 2>&1; then
        echo "interop-tokenspeed: cannot clone lightseekorg/tokenspeed" \
            "($(tail -n 1 "$BUILD/tokenspeed-clone.log"))"
        return 1
    fi
    git -C "$SRC" cat-file -e "$COMMIT^{commit}" 2>/dev/null
}
if ! source_ok; then
    echo "SKIP: TokenSpeed seed-004 interop (10 cases) and its --record: TokenSpeed's source" \
        "at $COMMIT is not available here; set TOKENSPEED_SRC to a git clone of" \
        "lightseekorg/tokenspeed holding that commit to run them"
    exit $rc
fi
TREE=$BUILD/tokenspeed
rm -rf "$TREE"
mkdir -p "$TREE"
git -C "$SRC" archive "$COMMIT" python/tokenspeed | tar -x -C "$TREE"
# aiohttp: TokenSpeed's bootstrap module imports it (Debian's python3 lacks it).
if [ ! -x "$VENV/bin/python" ]; then
    /usr/bin/python3 -m venv --system-site-packages "$VENV"
fi
"$VENV/bin/python" -c 'import aiohttp' 2>/dev/null ||
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check aiohttp==3.14.5
OUT=$BUILD/interop-tokenspeed
rm -rf "$OUT"
mkdir -p "$OUT"
export KVBRIDGE_TS_HELPER=$HELPER KVBRIDGE_SGLANG26_HELPER=$HELPER26
export KVBRIDGE_LIB=$BUILD/libkvbridge.so KVBRIDGE_BIN=$BUILD/kvbridge
export PYTHONPATH=$TREE/python:$ROOT/python/compat:$ROOT/python:$ROOT/tests/interop:$ROOT/tests/python
export TOKENSPEED_HOST_IP=127.0.0.1 # where TokenSpeed's prefill PUTs (its get_ip())
export TOKENSPEED_DISAGGREGATION_HEARTBEAT_INTERVAL=2 TOKENSPEED_DISAGGREGATION_HEARTBEAT_MAX_FAILURE=1
export TOKENSPEED_DISAGGREGATION_WAITING_TIMEOUT=3
if [ "$RECORD" = 1 ]; then
    export KVB_RECORD_DIR=$BUILD/interop-record-ts KVB_RECORD_DIALECT=tokenspeed_seed004
    export KVB_RECORD_RELEASE="tokenspeed@${COMMIT:0:12}"
    rm -rf "$KVB_RECORD_DIR"
    mkdir -p "$KVB_RECORD_DIR"
fi
echo "== TokenSpeed $COMMIT receiver (seed 004) <- kvbridge C prefill, TokenSpeed prefill -> kvbridge C decode (drop-in engine)"
for c in tp1 tp2 mla mla_tp2 prefix killed rank_killed pf_tp1 pf_prefix pf_tp2; do
    driver=tokenspeed_receiver.py
    [[ $c == pf_* ]] && driver=tokenspeed_prefill.py
    if timeout 120 "$VENV/bin/python" "$ROOT/tests/interop/$driver" "$c" >"$OUT/$c.log" 2>&1; then
        tail -n 1 "$OUT/$c.log"
    else
        echo "FAIL $c (log: $OUT/$c.log)"
        tail -n 15 "$OUT/$c.log"
        rc=1
    fi
done
if [ "$RECORD" = 1 ]; then
    echo "== recorded: $KVB_RECORD_DIR -> tests/conformance (corpus.py import)"
    KVB_CONFORMANCE_READER=$BUILD/tests/conformance/test_conformance \
        /usr/bin/python3 "$ROOT/tests/conformance/corpus.py" import "$KVB_RECORD_DIR" || rc=1
    "$BUILD/tests/conformance/test_conformance" "$ROOT/tests/conformance" || rc=1
fi
exit $rc
