#!/usr/bin/env bash
# TokenSpeed 0.1.1's own CachePD connector (PyPI, unmodified, on kvbridge's
# mooncake.engine drop-in) against kvbridge's C ranks, both directions (run
# by `make check-interop`; NOT part of `make check`: it needs PyPI once).
# Its decode against kvbridge's C prefill ranks:
# The venv is BUILD/ts011-venv with tests/interop/requirements-tokenspeed011.txt
# (pinned, --no-deps; shared with scripts/interop-tokenspeed011.sh). Cases
# (tests/interop/cachepd_kvbridge_prefill.py; the C side is
# tests/integration/cachepd/cpd_helper.c), each with kvbridge's C bootstrap
# server and again (*_tsboot) with TokenSpeed's own, where the kvbridge
# ranks register in CachePD's PUT shape:
#   mha_tp1       MHA TP1 -> TP1 (whole-copy route), prefixes of 0 and 2 pages
#   mha_tp2       MHA TP2 -> TP1 (head fragments, 16 rows per page)
#   mha_tp1_tp2   MHA TP1 -> TP2 (one prefill rank, two decode ranks)
#   mla_tp2       MLA TP2 -> TP1 (prefill rank 1 a dummy: it says nothing)
#   hybrid_tp2    the CachePD golden's hybrid model (3 linear-attention layers,
#                 one state group each, + 1 full-attention layer; page 128;
#                 tests/interop/tokenspeed011_common.py HybridModel) TP2 -> TP1:
#                 K/V pages and every state group's latest snapshot (conv in
#                 three parts and ssm split by TP), kvbridge's ranks given
#                 TokenSpeed's contract of the model at TP 1 (params
#                 cachepd_contract); rooms of 3 pages, 1 page past a 1-page
#                 prefix, 1 page
#   hybrid        the same TP1 -> TP1
# Every decode arena byte (KV and state) is compared with an image computed
# independently of both sides' planners; the first token, candidates, cached
# tokens and logprob the TokenSpeed decode read are checked.
# Its prefill (tokenspeed011_pd.py --prefill) against kvbridge's C decode
# ranks (tests/interop/cachepd_kvbridge_decode.py; the C side is
# tests/integration/cachepd/cpd_decode_helper.c), d_* with kvbridge's
# bootstrap server, d_*_tsboot with TokenSpeed's:
#   d_tp1         MHA TP1 -> TP1, a room with a 2-page decode prefix
#   d_tp2         MHA TP2 -> TP1
#   d_tp1_tp2     MHA TP1 -> TP2
#   d_mla_tp2     MLA TP2 -> TP1 (prefill rank 1 a dummy)
#   d_tp1_layerwise  TokenSpeed's layerwise sends
#   d_hybrid_tp2  the hybrid model TP2 -> TP1 (as hybrid_tp2; kvbridge's decode
#                 given TokenSpeed's contract and one state slot per room)
#   d_hybrid      the same TP1 -> TP1
#   d_hybrid_tp2_layerwise  the same TP2 -> TP1, TokenSpeed's layerwise sends
#   kill_prefill  kill -9 of TokenSpeed's prefill after a room's first write
#                 landed: kvbridge's decode reports Failed with a reason in 15 s
#   kill_decode   kill -9 of kvbridge's decode after the first write landed:
#                 what TokenSpeed's prefill reports (recorded; not Success)
# Every decode KV and state byte is compared with an image computed
# independently, and the canary gaps after kvbridge's decode buffers; the
# first token, cached tokens and logprob kvbridge's receivers read are
# checked. Logs: BUILD/interop-cachepd/.
# PyPI unreachable and no venv yet: skipped with a message (exit 0).
# Usage: scripts/interop-cachepd.sh [BUILD_DIR] [CASE...]   (make build first)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=$(cd "${1:-$ROOT/build}" && pwd)
shift || true
CASES=("$@")
if [ ${#CASES[@]} -eq 0 ]; then
    CASES=(mha_tp1 mha_tp2 mha_tp1_tp2 mla_tp2 hybrid_tp2 hybrid mha_tp1_tsboot mha_tp2_tsboot
        mla_tp2_tsboot hybrid_tp2_tsboot hybrid_tsboot
        d_tp1 d_tp2 d_tp1_tp2 d_mla_tp2 d_tp1_layerwise d_hybrid_tp2 d_hybrid
        d_hybrid_tp2_layerwise d_tp1_tsboot d_tp2_tsboot d_tp1_tp2_tsboot d_mla_tp2_tsboot
        d_tp1_layerwise_tsboot d_hybrid_tp2_tsboot d_hybrid_tsboot kill_prefill kill_decode)
fi
HELPER=$BUILD/tests/integration/cachepd/cpd_helper
DHELPER=$BUILD/tests/integration/cachepd/cpd_decode_helper
if [ ! -f "$BUILD/libkvbridge.so" ] || [ ! -x "$HELPER" ] || [ ! -x "$DHELPER" ]; then
    echo "interop-cachepd: $BUILD/libkvbridge.so, cpd_helper or cpd_decode_helper missing:" \
        "build first" >&2
    exit 2
fi
VENV=$BUILD/ts011-venv
REQS=$ROOT/tests/interop/requirements-tokenspeed011.txt
# shellcheck source=scripts/ts011-venv.sh
. "$ROOT/scripts/ts011-venv.sh"
ts011_venv interop-cachepd "$VENV" "$REQS" || exit 0
OUT=$BUILD/interop-cachepd
rm -rf "$OUT"
mkdir -p "$OUT"
export KVBRIDGE_LIB=$BUILD/libkvbridge.so
export PYTHONPATH=$ROOT/python/compat:$ROOT/python:$ROOT/tests/interop
export TOKENSPEED_HOST_IP=127.0.0.1
echo "== TokenSpeed 0.1.1 (on kvbridge's mooncake.engine drop-in) <-> kvbridge C ranks"
rc=0
for c in "${CASES[@]}"; do
    case $c in
    d_* | kill_*) drv=cachepd_kvbridge_decode.py h=$DHELPER ;;
    *) drv=cachepd_kvbridge_prefill.py h=$HELPER ;;
    esac
    if timeout 180 "$VENV/bin/python" "$ROOT/tests/interop/$drv" "$h" "$c" >"$OUT/$c.log" 2>&1; then
        grep "^PASS" "$OUT/$c.log" | tail -n 1 # its processes may log after it
    else
        echo "FAIL $c (log: $OUT/$c.log)"
        tail -n 15 "$OUT/$c.log"
        rc=1
    fi
done
exit $rc
