#!/usr/bin/env bash
# Installs kvbridge as a framework would, into a temporary prefix, and uses
# only what was installed:
#   1. cmake --install <build> --prefix $T/prefix: the expected files, the
#      SONAME, the CLI runs;
#   2. a C consumer (consumer.c) built through pkg-config against the shared
#      library, run (version, status string, engine create/destroy);
#   3. the same consumer built by a CMake project through find_package(kvbridge)
#      against kvbridge::kvbridge and kvbridge::kvbridge_static, both run;
#   4. the Python package pip-installed (Debian's pip, offline, no build
#      isolation) from a copy of python/ into $T/py, imported with neither
#      KVBRIDGE_LIB nor the source tree: it loads the installed library and
#      creates an engine; the compat folder travels along when python/compat
#      exists; KVBRIDGE_LIB still wins over the recorded path.
# Writes only under a mktemp folder (removed at exit) and the build folder
# (cmake --install's install_manifest.txt). Needs no network.
#
# usage: test_install.sh SOURCE_DIR BUILD_DIR SHARED_LIB VERSION LIBDIR CMAKE CC PKG_CONFIG
#   SHARED_LIB: the build's libkvbridge.so; LIBDIR: CMAKE_INSTALL_LIBDIR (relative)
set -euo pipefail

[ $# -eq 8 ] || { echo "usage: $0 SOURCE_DIR BUILD_DIR SHARED_LIB VERSION LIBDIR CMAKE CC PKG_CONFIG" >&2; exit 2; }
SRC=$1 BUILD=$2 BUILD_LIB=$3 VERSION=$4 LIBDIR_REL=$5 CMAKE=$6 CC=$7 PKGCONF=$8
PY=/usr/bin/python3
HERE=$SRC/tests/install

# Nothing from the caller's environment may point at another kvbridge.
unset DESTDIR KVBRIDGE_LIB PYTHONPATH PKG_CONFIG_PATH CMAKE_PREFIX_PATH LD_LIBRARY_PATH
export PYTHONNOUSERSITE=1 PIP_CONFIG_FILE=/dev/null

T=$(mktemp -d "${TMPDIR:-/tmp}/kvb-install.XXXXXX")
trap 'rm -rf "$T"' EXIT
P=$T/prefix

fail() { echo "FAIL: $*" >&2; exit 1; }
step() { echo "== $*"; }

# ---- 1. install
step "cmake --install $BUILD --prefix $P"
timeout 120 "$CMAKE" --install "$BUILD" --prefix "$P" >"$T/install.log" || { cat "$T/install.log"; fail "cmake --install"; }
LIBDIR=$P/$LIBDIR_REL
for f in bin/kvbridge include/kvbridge/kvbridge.h include/kvbridge/common.h include/kvbridge/engine.h \
    include/kvbridge/conn.h include/kvbridge/bootstrap.h include/kvbridge/plan.h \
    include/kvbridge/ts_mooncake.h; do
    [ -f "$P/$f" ] || fail "not installed: $f"
done
for f in "libkvbridge.so.$VERSION" libkvbridge.so.0 libkvbridge.so libkvbridge.a \
    libkvbridge_ts_mooncake.so pkgconfig/kvbridge.pc cmake/kvbridge/kvbridgeConfig.cmake \
    cmake/kvbridge/kvbridgeConfigVersion.cmake cmake/kvbridge/kvbridgeTargets.cmake; do
    [ -e "$LIBDIR/$f" ] || fail "not installed: $LIBDIR/$f"
done
[ "$(readlink "$LIBDIR/libkvbridge.so.0")" = "libkvbridge.so.$VERSION" ] || fail "libkvbridge.so.0 is not a link to libkvbridge.so.$VERSION"
soname=$(readelf -d "$LIBDIR/libkvbridge.so.$VERSION" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
[ "$soname" = libkvbridge.so.0 ] || fail "SONAME is '$soname', want libkvbridge.so.0"
if grep -rqs -- "$SRC" "$LIBDIR/pkgconfig" "$LIBDIR/cmake"; then fail "installed metadata names the source tree $SRC"; fi
out=$("$P/bin/kvbridge" --version) || fail "installed CLI: --version failed"
[ "$out" = "kvbridge $VERSION" ] || fail "installed CLI prints '$out'"

# TokenSpeed's C ABI: needs the shared library, found next to itself.
readelf -d "$LIBDIR/libkvbridge_ts_mooncake.so" | grep -q 'NEEDED.*\[libkvbridge.so.0\]' ||
    fail "libkvbridge_ts_mooncake.so does not need libkvbridge.so.0"
readelf -d "$LIBDIR/libkvbridge_ts_mooncake.so" | grep -Eq '(RUNPATH|RPATH).*\[\$ORIGIN\]' ||
    fail "libkvbridge_ts_mooncake.so has no \$ORIGIN run path"
for s in ts_mooncake_abi_version ts_mooncake_create ts_mooncake_destroy ts_mooncake_rpc_port \
    ts_mooncake_register ts_mooncake_unregister ts_mooncake_write ts_mooncake_write_pages; do
    readelf --dyn-syms -W "$LIBDIR/libkvbridge_ts_mooncake.so" | grep -q " $s\$" ||
        fail "libkvbridge_ts_mooncake.so does not export $s"
done
cat >"$T/ts_consumer.c" <<'TSEOF'
#include <kvbridge/ts_mooncake.h>
#include <stdio.h>
int main(void)
{
    if (ts_mooncake_abi_version() != TS_MOONCAKE_ABI_VERSION)
        return 1;
    if (ts_mooncake_create("127.0.0.1", "P2PHANDSHAKE", "tcp", "") != NULL)
        return 2;
    ts_mooncake_engine_t *e = ts_mooncake_create("127.0.0.1", "P2PHANDSHAKE", "rdma", "");
    if (e == NULL || ts_mooncake_rpc_port(e) <= 0)
        return 3;
    static char buf[4096];
    if (ts_mooncake_register(e, buf, sizeof(buf)) != 0 || ts_mooncake_unregister(e, buf) != 0)
        return 4;
    ts_mooncake_destroy(e);
    puts("ts_mooncake consumer: ok");
    return 0;
}
TSEOF
timeout 60 "$CC" -std=c11 -Wall -Wextra -Werror -I"$P/include" -o "$T/ts_consumer" "$T/ts_consumer.c" \
    -L"$LIBDIR" -lkvbridge_ts_mooncake -Wl,-rpath,"$LIBDIR" || fail "build of the ts_mooncake consumer"
timeout 30 "$T/ts_consumer" 2>"$T/ts_consumer.log" || { cat "$T/ts_consumer.log"; fail "ts_mooncake consumer run"; }

# ---- 2. pkg-config, shared library
step "pkg-config consumer"
export PKG_CONFIG_PATH=$LIBDIR/pkgconfig
[ "$("$PKGCONF" --modversion kvbridge)" = "$VERSION" ] || fail "pkg-config --modversion kvbridge"
pc_libdir=$(cd "$("$PKGCONF" --variable=libdir kvbridge)" && pwd -P)
[ "$pc_libdir" = "$(cd "$LIBDIR" && pwd -P)" ] || fail "pkg-config libdir $pc_libdir, installed in $LIBDIR"
static_libs=$("$PKGCONF" --static --libs kvbridge)
for l in -lucp -lzmq -lmicrohttpd -lcurl -ljansson -lcrypto; do
    case " $static_libs " in *" $l "*) ;; *) fail "pkg-config --static --libs kvbridge lacks $l: $static_libs" ;; esac
done
# shellcheck disable=SC2046 # word splitting of the flags is wanted
timeout 60 "$CC" -std=c11 -Wall -Wextra -Werror -o "$T/consumer_pc" "$HERE/consumer.c" \
    $("$PKGCONF" --cflags --libs kvbridge) -Wl,-rpath,"$LIBDIR" || fail "build through pkg-config"
readelf -d "$T/consumer_pc" | grep -q 'NEEDED.*\[libkvbridge.so.0\]' || fail "consumer_pc does not need libkvbridge.so.0"
timeout 30 "$T/consumer_pc" "$VERSION" || fail "consumer_pc run"
unset PKG_CONFIG_PATH

# ---- 3. CMake package, shared and static
step "find_package(kvbridge) consumer"
mkdir "$T/cm"
cp "$HERE/consumer.c" "$T/cm/consumer.c"
cp "$HERE/consumer-CMakeLists.txt" "$T/cm/CMakeLists.txt"
timeout 120 "$CMAKE" -S "$T/cm" -B "$T/cm/build" -DCMAKE_PREFIX_PATH="$P" -DCMAKE_C_COMPILER="$CC" \
    -DKVB_EXPECT_VERSION="$VERSION" -DCMAKE_BUILD_RPATH="$LIBDIR" >"$T/cm.log" 2>&1 ||
    { cat "$T/cm.log"; fail "configure of the find_package consumer"; }
timeout 120 "$CMAKE" --build "$T/cm/build" >>"$T/cm.log" 2>&1 || { cat "$T/cm.log"; fail "build of the find_package consumer"; }
readelf -d "$T/cm/build/consumer_shared" | grep -q 'NEEDED.*\[libkvbridge.so.0\]' || fail "consumer_shared does not need libkvbridge.so.0"
if readelf -d "$T/cm/build/consumer_static" | grep -q 'NEEDED.*libkvbridge'; then fail "consumer_static needs libkvbridge.so"; fi
timeout 30 "$T/cm/build/consumer_shared" "$VERSION" || fail "consumer_shared run"
timeout 30 "$T/cm/build/consumer_static" "$VERSION" || fail "consumer_static run"

# ---- 4. Python package
step "pip install ./python (offline, --target)"
cp -r "$SRC/python" "$T/pysrc" # the build writes build/ and *.egg-info next to setup.py
rm -rf "$T/pysrc/build" "$T/pysrc"/*.egg-info
PKG_CONFIG_PATH=$LIBDIR/pkgconfig timeout 120 "$PY" -m pip install --no-deps --no-build-isolation \
    --no-index --no-cache-dir --disable-pip-version-check --target "$T/py" "$T/pysrc" >"$T/pip.log" 2>&1 ||
    { cat "$T/pip.log"; fail "pip install"; }
if [ -d "$SRC/python/compat" ]; then
    [ -d "$T/py/kvbridge/compat" ] || fail "python/compat exists but was not installed"
    (cd "$SRC/python/compat" && find . -name '*.py' -not -path '*/__pycache__/*') | while read -r f; do
        cmp -s "$SRC/python/compat/$f" "$T/py/kvbridge/compat/$f" || fail "compat file $f not installed as is"
    done
else
    [ ! -e "$T/py/kvbridge/compat" ] || fail "kvbridge/compat installed without python/compat"
fi
# From $T (not the source tree), with only the installed package on the path.
(cd "$T" && PYTHONPATH=$T/py timeout 60 "$PY" - "$T/py" "$LIBDIR" "$VERSION" "$SRC" <<'EOF') || fail "python: installed package"
import importlib.metadata, os, sys
target, libdir, version, src = sys.argv[1:]
import kvbridge
real = os.path.realpath
assert real(kvbridge.__file__).startswith(real(target) + "/"), kvbridge.__file__
path = kvbridge.library_path()
assert real(path) == real(os.path.join(libdir, "libkvbridge.so.0")), path
assert kvbridge.version() == version == kvbridge.__version__, (kvbridge.version(), kvbridge.__version__)
assert importlib.metadata.version("kvbridge") == version
with kvbridge.TransferEngine() as e:
    assert e.get_session_id().startswith("127.0.0.1:"), e.get_session_id()
compat = kvbridge.compat_path()
if os.path.isdir(os.path.join(src, "python", "compat")):
    assert compat == os.path.join(os.path.dirname(kvbridge.__file__), "compat"), compat
else:
    assert compat is None, compat
print("python: kvbridge", kvbridge.version(), "from", path)
EOF
# KVBRIDGE_LIB still overrides the recorded path.
(cd "$T" && KVBRIDGE_LIB=$BUILD_LIB PYTHONPATH=$T/py timeout 60 "$PY" -c \
    'import kvbridge, os, sys; p = kvbridge.library_path(); assert p == os.environ["KVBRIDGE_LIB"], p') ||
    fail "python: KVBRIDGE_LIB not honoured by the installed package"
echo "install: ok"
