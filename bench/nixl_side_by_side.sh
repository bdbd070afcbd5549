#!/usr/bin/env bash
# Side by side inside NIXL (bench/nixl_bench.py says what every row and
# column is): NIXL 1.5.1's Python agent moving the same descriptor lists
# with its own UCX backend and with KVBRIDGE (libplugin_KVBRIDGE.so), two
# processes of this host, DRAM, WRITE and READ, auto and tcp, with the
# memcpy-mt and raw TCP yardsticks, A/B alternating, in one run (about
# 2.5 minutes with the defaults). Opt-in, NOT part of `make check`.
#
# It reuses scripts/interop-nixl.sh's set-up (the pinned wheels in
# BUILD/nixl-venv, the plug-in built with -DKVB_NIXL=ON, the plug-in folder
# BUILD/nixl-plugins): run that once first (it needs NIXL's headers:
# NIXL_INCLUDE_DIR, or NIXL_SRC and ABSL_SRC, docs/nixl.md), e.g.
#   NIXL_SRC=/path/nixl ABSL_SRC=/path/abseil-cpp scripts/interop-nixl.sh build params
# Then:
#   bench/nixl_side_by_side.sh [BUILD_DIR] [nixl_bench.py run options]
# Writes NB_OUT (default bench/results/nixl.json) and NB_OUT's stem +
# -engine-{write,read}.{json,txt} (kvbridge engine-bench --quick, auto and
# tcp, run right after in the same lock: the engine without NIXL) and
# prints both (bench/results/nixl.md quotes them). The timed part runs under
# flock /work/bench.lock when that file's folder exists (NB_LOCK to change),
# so it never overlaps another benchmark on a shared host.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=$(cd "${1:-$ROOT/build}" && pwd)
shift || true
VENV=$BUILD/nixl-venv
PLUG=$BUILD/nixl-plugins
OUT=${NB_OUT:-$ROOT/bench/results/nixl.json}
LOCK=${NB_LOCK:-/work/bench.lock}
if [ ! -x "$VENV/bin/python" ] || [ ! -e "$PLUG/libplugin_KVBRIDGE.so" ] ||
    [ ! -e "$PLUG/libplugin_UCX.so" ]; then
    echo "nixl_side_by_side: no $VENV or $PLUG with libplugin_KVBRIDGE.so and libplugin_UCX.so:" \
        "run scripts/interop-nixl.sh $BUILD first (docs/nixl.md)" >&2
    exit 2
fi
# the plug-in must be this build's (interop-nixl.sh links it into the folder)
cmake --build "$BUILD" -j"${JOBS:-2}" --target kvbridge_nixl >/dev/null
CC=${CC:-cc}
"$CC" -O2 -Wall -Wextra -shared -fPIC -fvisibility=hidden -pthread "$ROOT/bench/sbs_copy.c" \
    -o "$BUILD/sbs_copy.so"
export SBS_COPY_LIB=$BUILD/sbs_copy.so
export NIXL_PLUGIN_DIR=$PLUG
# The wheel's own plug-ins find their bundled libraries (libucp-<hash>.so ...)
# through an $ORIGIN-relative RPATH, which a symlink in another folder breaks
# (NIXL then refuses "UCX": NIXL_ERR_NOT_FOUND): name that folder here.
SITE=$("$VENV/bin/python" -c 'import nixl_cu12, os; print(os.path.dirname(os.path.dirname(nixl_cu12.__file__)))')
export LD_LIBRARY_PATH=$SITE/nixl_cu12.libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
unset UCX_TLS KVBRIDGE_TRANSPORT PYTHONPATH
"$VENV/bin/python" -c '
import os
from nixl._api import nixl_agent, nixl_agent_config
a = nixl_agent("probe", nixl_agent_config(backends=["UCX"]))
a.create_backend("KVBRIDGE", {})
os._exit(0 if sorted(a.backends) == ["KVBRIDGE", "UCX"] else 1)' >/dev/null 2>&1 ||
    { echo "nixl_side_by_side: NIXL cannot create both UCX and KVBRIDGE from $PLUG" >&2; exit 1; }
echo "== NIXL $("$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("nixl-cu12"))')" \
    "(PyPI nixl-cu12), kvbridge $(git -C "$ROOT" rev-parse --short HEAD)$(git -C "$ROOT" diff --quiet HEAD -- src include compat || echo '+dirty'), $(nproc) CPUs"
echo "== uptime before: $(uptime)"
# The timed part: the NIXL rows, then the engine alone in the same sitting
# (kvbridge engine-bench: the same lanes without NIXL, Python or a polling
# caller; it waits on the transfer), under one hold of the lock.
ENG=${OUT%.json}-engine
timed() {
    "$VENV/bin/python" "$ROOT/bench/nixl_bench.py" run "$OUT" "$@" 2>"$BUILD/nixl-bench.log"
    for op in write read; do
        "$BUILD/kvbridge" engine-bench --quick --op $op --transport auto,tcp \
            --sizes 32768,262144,4194304 --reps 3 --json "$ENG-$op.json" >"$ENG-$op.txt" 2>&1
    done
}
export -f timed
export VENV ROOT OUT BUILD ENG
if [ -d "$(dirname "$LOCK")" ]; then
    flock "$LOCK" bash -c 'timed "$@"' _ "$@"
else
    timed "$@"
fi
echo "== uptime after: $(uptime)"
"$VENV/bin/python" "$ROOT/bench/nixl_bench.py" table "$OUT"
echo
echo "kvbridge's engine alone, same sitting ($ENG-{write,read}.{txt,json}):"
cat "$ENG-write.txt" "$ENG-read.txt"
