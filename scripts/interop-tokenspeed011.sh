#!/usr/bin/env bash
# TokenSpeed 0.1.1 (PyPI) on kvbridge's Mooncake drop-in (run by `make
# check-interop`; NOT part of `make check`: it needs PyPI). Makes a venv
# under the build folder (BUILD/ts011-venv) holding the pinned release and
# exactly what its CachePD connector imports (tests/interop/
# requirements-tokenspeed011.txt, all pinned, --no-deps), then runs
# TokenSpeed 0.1.1's own prefill and decode connectors, unmodified, both on
# kvbridge's `mooncake.engine` drop-in (python/compat first on PYTHONPATH):
# tests/interop/tokenspeed011_pd.py, one case a run, decode in one process
# and prefill (with its bootstrap server) in another:
#   tp1, tp1_layerwise       TP1 -> TP1, final and layerwise (pages calls)
#   tp2, tp2_layerwise       TP2 -> TP1 (per-row spans, batch_transfer_sync_write)
#   tp1_tp2, tp1_tp2_pack    TP1 -> TP2 (pack fallback; pack on the host:
#                            scratch registered / unregistered on the drop-in)
#   mla, mla_tp2             MLA, TP1 -> TP1 layerwise, TP2 -> TP1 (a dummy rank)
#   hybrid, hybrid_tp2,      the CachePD golden's hybrid model (3 linear-attention
#   hybrid_tp2_layerwise     state groups + full attention, page 128): TP1 / TP2
#                            -> TP1, final and layerwise; K/V pages and every
#                            state group's latest snapshot
#   write_refused            the decode's memory is gone: every write -1, both
#                            sides Failed with TokenSpeed's reasons, no byte written
# Every decode byte is compared with an image computed independently of
# TokenSpeed. What is stubbed and why: tests/interop/tokenspeed011_common.py
# (docs/python.md, "Frameworks on it"). Logs: BUILD/interop-ts011/*.log.
# PyPI unreachable and no venv yet: skipped with a message (exit 0).
# Usage: scripts/interop-tokenspeed011.sh [BUILD_DIR] [CASE...]   (make build first)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=$(cd "${1:-$ROOT/build}" && pwd)
shift || true
CASES=("$@")
if [ ${#CASES[@]} -eq 0 ]; then
    CASES=(tp1 tp1_layerwise tp2 tp2_layerwise tp1_tp2 tp1_tp2_pack mla mla_tp2 hybrid hybrid_tp2
        hybrid_tp2_layerwise write_refused)
fi
if [ ! -f "$BUILD/libkvbridge.so" ]; then
    echo "interop-tokenspeed011: $BUILD/libkvbridge.so missing: build first (make build)" >&2
    exit 2
fi
VENV=$BUILD/ts011-venv
REQS=$ROOT/tests/interop/requirements-tokenspeed011.txt
# shellcheck source=scripts/ts011-venv.sh
. "$ROOT/scripts/ts011-venv.sh"
ts011_venv interop-tokenspeed011 "$VENV" "$REQS" || exit 0
OUT=$BUILD/interop-ts011
rm -rf "$OUT"
mkdir -p "$OUT"
export KVBRIDGE_LIB=$BUILD/libkvbridge.so
export PYTHONPATH=$ROOT/python/compat:$ROOT/python:$ROOT/tests/interop
export TOKENSPEED_HOST_IP=127.0.0.1 # where TokenSpeed's prefill PUTs (its get_ip())
echo "== TokenSpeed 0.1.1 prefill -> TokenSpeed 0.1.1 decode, both on kvbridge's mooncake.engine drop-in"
"$VENV/bin/python" -c '
import mooncake, tokenspeed.version as v
assert getattr(mooncake, "KVBRIDGE_DROP_IN", False), mooncake.__file__
print("tokenspeed", v.__version__, "| mooncake:", mooncake.__file__)' ||
    { echo "interop-tokenspeed011: mooncake does not resolve to the drop-in" >&2; exit 1; }
rc=0
for c in "${CASES[@]}"; do
    if timeout 180 "$VENV/bin/python" "$ROOT/tests/interop/tokenspeed011_pd.py" "$c" \
        >"$OUT/$c.log" 2>&1; then
        tail -n 1 "$OUT/$c.log"
    else
        echo "FAIL $c (log: $OUT/$c.log)"
        tail -n 15 "$OUT/$c.log"
        rc=1
    fi
done
exit $rc
