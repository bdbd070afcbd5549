#!/bin/sh
# Lay out NIXL's headers as a NIXL install with -Dinstall_headers=true does,
# plus the abseil headers its logging header includes, into OUT, for
# cmake -DKVB_NIXL=ON -DNIXL_INCLUDE_DIR=OUT (docs/nixl.md). Copies from
# checkouts the caller provides; nothing is fetched, nothing lands in the
# repository (OUT must be outside it, or under build/).
#   scripts/nixl-headers.sh NIXL_SRC ABSL_SRC OUT
# NIXL_SRC: a checkout of ai-dynamo/nixl (the headers of the release the
# plug-in runs in; docs/nixl.md names the one tested). ABSL_SRC: a checkout
# of abseil-cpp at the release NIXL pins (subprojects/abseil-cpp.wrap).
set -eu
[ $# -eq 3 ] || { echo "usage: $0 NIXL_SRC ABSL_SRC OUT" >&2; exit 2; }
src=$1 absl=$2 out=$3
for f in src/api/cpp/nixl_types.h src/api/cpp/backend/backend_plugin.h \
         src/utils/common/nixl_log.h src/core/telemetry/telemetry_event.h; do
  [ -f "$src/$f" ] || { echo "$0: $src has no $f: not a NIXL checkout" >&2; exit 1; }
done
[ -f "$absl/absl/log/log.h" ] || { echo "$0: $absl has no absl/log/log.h" >&2; exit 1; }
mkdir -p "$out/backend" "$out/utils/common"
cp "$src"/src/api/cpp/nixl.h "$src"/src/api/cpp/nixl_types.h "$src"/src/api/cpp/nixl_params.h \
   "$src"/src/api/cpp/nixl_descriptors.h "$src"/src/core/telemetry/telemetry_event.h "$out/"
cp "$src"/src/api/cpp/backend/backend_*.h "$out/backend/"
cp "$src"/src/utils/common/nixl_log.h "$src"/src/utils/common/nixl_time.h "$out/utils/common/"
(cd "$absl" && find absl -name '*.h' -o -name '*.inc') | while read -r h; do
  mkdir -p "$out/$(dirname "$h")" && cp "$absl/$h" "$out/$h"
done
echo "$out"
