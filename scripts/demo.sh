#!/usr/bin/env bash
# `make demo`: a small verified transfer between two processes on this machine.
set -euo pipefail
BUILD=${1:-build}
exec "$BUILD/kvbridge" engine-bench --quick
