#!/usr/bin/env python3
"""`kvbridge bench --trace / --report` (issue 34): one short bench run (two DP
groups of one prefill rank, two decode ranks, a quarter of the rooms
aborted by the soak hook --abort-rate so that failures are in the views),
then checks what a user opening the files would rely on.

Trace (Chrome trace-event JSON): it parses; every event is M, X or i; every
X has ts >= 0 and dur >= 0; every track (pid) and lane (tid) used is named by
an M event; every room of the run (warm-up and timed) has exactly one room
slice on exactly the ranks that serve it (the prefill rank of its DP group,
room % 2, and both decode ranks) and on no other; the stages of a room lie
inside its slice, in order, without overlap, with the side's names; rooms on
one lane do not overlap; the rooms whose slices say "failed" are as many as
the run aborted (JSON report), and each rank-side failure has an instant
event on its lane inside its room's slice.

HTML (text level; tests/integration/bench/check_report_chromium.py renders
it): self-contained (no src=, href=, url(, @import), one SVG row per room
slice of the trace, the failed rows as many as the failed slices, the
summary table with the run's verified count.

usage: check_views.py KVBRIDGE OUTDIR
"""
import json
import os
import re
import subprocess
import sys

ARGS = ("--layers 4 --kv-heads 8 --head-dim 64 --prompt-len 512 --requests 8 "
        "--concurrency 4 --chunk 128 --timeout 60 --dp 2 --decode-tp 2 "
        "--abort-rate 0.25 --seed 3 --no-progress").split()
PREFILL_STAGES = {"wait_decode", "transfer", "notify"}
DECODE_STAGES = {"bootstrap", "wait_prefill", "fence_hold"}


def fail(msg):
    print("FAIL: " + msg)
    sys.exit(1)


def run_bench(kvb, out):
    paths = {k: os.path.join(out, "views." + k) for k in ("json", "trace.json", "html")}
    for p in paths.values():
        if os.path.exists(p):
            os.unlink(p)
    cmd = [kvb, "bench", *ARGS, "--json", paths["json"], "--trace", paths["trace.json"],
           "--report", paths["html"]]
    print(" ".join(cmd))
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=150)
    print(r.stdout + r.stderr)
    if r.returncode != 0:
        fail("bench exited %d" % r.returncode)
    return paths


def expected_ranks(room):
    return {"prefill dp%d tp0 pp0" % (room % 2), "decode tp0", "decode tp1"}


def check_trace(path, rep):
    with open(path) as f:
        tr = json.load(f)
    ev = tr["traceEvents"]
    procs, threads = {}, set()
    for e in ev:
        if e["ph"] not in ("M", "X", "i"):
            fail("unexpected phase %r" % e["ph"])
        if e["ph"] == "M" and e["name"] == "process_name":
            procs[e["pid"]] = e["args"]["name"]
        if e["ph"] == "M" and e["name"] == "thread_name":
            threads.add((e["pid"], e["tid"]))
    rooms, stages, instants = {}, {}, []
    for e in ev:
        if e["ph"] == "M":
            continue
        if not isinstance(e["ts"], (int, float)) or e["ts"] < 0:
            fail("negative or missing ts: %r" % e)
        if e["pid"] not in procs or (e["pid"], e["tid"]) not in threads:
            fail("event on an unnamed track or lane: %r" % e)
        if e["ph"] == "i":
            instants.append(e)
            continue
        if e["dur"] < 0:
            fail("negative dur: %r" % e)
        key = (e["args"]["room"], procs[e["pid"]])
        if e["cat"] == "room":
            if key in rooms:
                fail("room %d twice on %s" % key)
            rooms[key] = e
        else:
            stages.setdefault(key, []).append(e)
    base = 3 * 10**7 + 1
    n = rep["warmup_requests"] + rep["requests"]
    want = {(base + i, rk) for i in range(n) for rk in expected_ranks(base + i)}
    if set(rooms) != want:
        fail("rooms on ranks differ: missing %s, extra %s" %
             (sorted(want - set(rooms))[:5], sorted(set(rooms) - want)[:5]))
    for key, r in rooms.items():
        side = DECODE_STAGES if key[1].startswith("decode") else PREFILL_STAGES
        prev = r["ts"]
        sts = sorted(stages.get(key, []), key=lambda s: s["ts"])
        for s in sts:
            if (s["pid"], s["tid"]) != (r["pid"], r["tid"]) or s["name"] not in side:
                fail("stage %r of %r on the wrong lane or side" % (s, key))
            if s["ts"] < prev - 1e-3 or s["ts"] + s["dur"] > r["ts"] + r["dur"] + 1e-3:
                fail("stage %s of room %d on %s out of order or outside its room" %
                     (s["name"], key[0], key[1]))
            prev = s["ts"] + s["dur"]
        names = {s["name"] for s in sts}
        if r["args"]["outcome"] == "success":
            need = "wait_prefill" if key[1].startswith("decode") else "transfer"
            if need not in names:
                fail("successful room %d on %s has no %s stage: %s" % (key[0], key[1], need,
                                                                       names))
    lanes = {}
    for r in rooms.values():
        lanes.setdefault((r["pid"], r["tid"]), []).append((r["ts"], r["ts"] + r["dur"]))
    for lane, spans in lanes.items():
        spans.sort()
        for a, b in zip(spans, spans[1:]):
            if b[0] < a[1] - 1e-3:
                fail("rooms overlap on lane %r: %r %r" % (lane, a, b))
    failed = {k[0] for k, r in rooms.items() if r["args"]["outcome"] == "failed"}
    aborted = rep["aborted"] + rep["warmup_aborted"]
    if aborted == 0 or len(failed) != aborted:
        fail("failed rooms in the trace %d, aborted in the run %d" % (len(failed), aborted))
    own = [(k, r) for k, r in rooms.items()
           if r["args"]["outcome"] == "failed" and r["args"]["reason"] != "failed on another rank"]
    for key, r in own:
        hit = [i for i in instants if i["args"]["room"] == key[0] and i["pid"] == r["pid"] and
               i["tid"] == r["tid"] and r["ts"] - 1e-3 <= i["ts"] <= r["ts"] + r["dur"] + 1e-3]
        if len(hit) != 1 or not hit[0]["args"]["reason"]:
            fail("room %d failed on %s without one failure instant inside it" % key)
    print("trace: %d rooms x ranks, %d stage slices, %d failed rooms, %d failure instants" %
          (len(rooms), sum(len(v) for v in stages.values()), len(failed), len(instants)))
    return rooms


def check_html(path, rep, rooms):
    with open(path) as f:
        html = f.read()
    for bad in ("src=", "href=", "url(", "@import", "<link"):
        if bad in html:
            fail("report is not self-contained: %r in it" % bad)
    rows = len(re.findall(r'<g class="room (ok|failed)"', html))
    failed_rows = len(re.findall(r'<g class="room failed"', html))
    failed_slices = sum(1 for r in rooms.values() if r["args"]["outcome"] == "failed")
    if rows != len(rooms) or failed_rows != failed_slices:
        fail("SVG rows %d (failed %d), trace room slices %d (failed %d)" %
             (rows, failed_rows, len(rooms), failed_slices))
    if '<svg id="timeline"' not in html or "%d verified" % rep["verified_requests"] not in html:
        fail("no timeline SVG or no summary with the verified count")
    if len(re.findall(r'<rect class="st" data-stage="transfer"', html)) == 0:
        fail("no transfer stage drawn")
    print("html: %d rows, %d failed" % (rows, failed_rows))


def main():
    kvb, out = sys.argv[1], sys.argv[2]
    os.makedirs(out, exist_ok=True)
    paths = run_bench(kvb, out)
    with open(paths["json"]) as f:
        rep = json.load(f)
    rooms = check_trace(paths["trace.json"], rep)
    check_html(paths["html"], rep, rooms)
    with open(os.path.join(out, "views.expect"), "w") as f:  # for the Chromium check
        json.dump({"rows": len(rooms),
                   "failed": sum(1 for r in rooms.values() if r["args"]["outcome"] == "failed")}, f)
    print("PASS")


if __name__ == "__main__":
    main()
