#!/usr/bin/env bash
# `make demo`: the point of kvbridge in one command. A bootstrap server, two
# prefill rank processes (llama3-8b, TP2) and one decode rank process (TP1)
# move the KV caches of 2K-token prompts (256 MiB each, 3.2 GB in all) through
# the SGLang Mooncake connector protocol; every byte is verified on the decode
# side; progress bar on stderr, report table on stdout.
set -euo pipefail
BUILD=${1:-build}
exec "$BUILD/kvbridge" bench --model llama3-8b --prefill-tp 2 --decode-tp 1 \
    --prompt-len 2048 --chunk 1024 --requests 12 --concurrency 4
