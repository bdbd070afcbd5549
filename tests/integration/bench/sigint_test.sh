#!/usr/bin/env bash
# Ctrl-C on a running bench: exit status 130, a partial report on stdout, and
# no child process (bootstrap, ranks) left behind.
set -u
KVB=$1
OUT=$(mktemp)
"$KVB" bench --layers 4 --kv-heads 8 --head-dim 64 --prompt-len 4096 --requests 100000 \
    --concurrency 2 --prefill-tp 2 --no-progress >"$OUT" 2>&1 &
pid=$!
kids=""
for _ in $(seq 1 100); do # up to 10 s for the 4 children to start
    kids=$(pgrep -P "$pid" | tr '\n' ' ')
    [ "$(echo $kids | wc -w)" -ge 4 ] && break
    sleep 0.1
done
sleep 1
kill -INT "$pid"
wait "$pid"
rc=$?
sleep 0.5
cat "$OUT"
fail=0
[ "$rc" -eq 130 ] || { echo "FAIL: exit status $rc, want 130"; fail=1; }
grep -q "interrupted: partial" "$OUT" || { echo "FAIL: no partial report"; fail=1; }
[ -n "$kids" ] || { echo "FAIL: no child process seen"; fail=1; }
for k in $kids; do
    if kill -0 "$k" 2>/dev/null; then
        echo "FAIL: child $k still alive"
        kill -KILL "$k"
        fail=1
    fi
done
rm -f "$OUT"
exit $fail
