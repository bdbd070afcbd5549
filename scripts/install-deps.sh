#!/usr/bin/env bash
# Install the Debian packages kvbridge needs to build and test.
# Idempotent: installs only what is missing; runs `apt-get update` only when
# something has to be installed. Needs root (or sudo) when it installs.
# --optional also installs the packages only some tests use (they skip with a
# message without them): chromium (bench_report_chromium renders
# `kvbridge bench --report` headless).
set -euo pipefail

PKGS=(
  build-essential cmake pkg-config make
  clang libclang-rt-14-dev clang-format
  libucx-dev ucx-utils
  libzmq3-dev
  libmicrohttpd-dev
  libcurl4-openssl-dev
  libjansson-dev
  libssl-dev
  libxxhash-dev # XXH3: KV integrity digests (docs/integrity.md)
  zlib1g-dev # Adler-32: SGLang's own KV checksum (docs/integrity.md)
  python3 python3-numpy python3-pytest python3-zmq python3-requests
  python3-pip python3-setuptools python3-wheel # pip install ./python, offline
  iproute2 procps
  prometheus # promtool: test_conn_observe checks the /metrics text with it; prometheus:
             # metrics_scrape runs a real server against a bench run (both skip without)
)
if [ "${1:-}" = "--optional" ]; then
  PKGS+=(chromium) # bench_report_chromium (skips without)
fi

missing=()
for p in "${PKGS[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#PKGS[@]} packages present"
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then SUDO="sudo"; else
    echo "install-deps: missing ${missing[*]} and not root (no sudo)" >&2
    exit 1
  fi
fi

echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
