"""A real Prometheus server scrapes kvbridge's /metrics (issue 34,
docs/observe.md "Metrics"): a child process (one engine, a prefill and a
decode manager, KVBRIDGE_METRICS_ADDR=127.0.0.1:0) moves rooms, one every
~20 ms, and prints where it serves; Debian's `prometheus` (config and TSDB
in a folder under the build tree, a free port, scrape interval 1 s) scrapes
it. Through the server's HTTP query API the test then waits (bounded) for:
the target up, kvbridge_rooms_ended_total for both roles with rank "0" and
outcome "success", kvbridge_transfers_total{op="write",outcome="ok"} on a
known lane, kvbridge_transfer_bytes_total and the histogram's
kvbridge_room_stage_seconds_count{stage="total"} for both roles, all > 0 and never more than
the child says it moved. Both processes are stopped at the end. Skipped,
with a message, without the prometheus binary."""

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request

import pytest

_MOVER = r"""
import os, sys, time
import numpy as np
sys.path.insert(0, sys.argv[1])
import kvbridge as kb
from test_scale_api import _pair
with _pair() as (server, p, d, pm, dm):
    print("serving", kb.metrics_addr(), flush=True)
    end, room, done = time.monotonic() + float(sys.argv[2]), 5000, 0
    while time.monotonic() < end:
        room += 1
        rc = kb.KVReceiver(dm, server.address, room)
        rc.init([room % 8], aux_index=room % 8)
        s = kb.KVSender(pm, server.address, room)
        bound = time.monotonic() + 10
        while s.poll() != kb.KVPoll.WaitingForInput and time.monotonic() < bound:
            time.sleep(0.002)
        s.init(1, aux_index=room % 8)
        s.send(np.array([room % 8], np.int32))
        while (rc.poll() != kb.KVPoll.Success or s.poll() != kb.KVPoll.Success) and \
                time.monotonic() < bound:
            time.sleep(0.002)
        done += rc.poll() == kb.KVPoll.Success
        s.clear()
        rc.clear()
        print("moved", done, flush=True)
        time.sleep(0.02)
"""

LANES = {"direct", "cuda-ipc", "put", "message", "cuda-staging"}


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _query(port, q):
    url = "http://127.0.0.1:%d/api/v1/query?%s" % (port, urllib.parse.urlencode({"query": q}))
    with urllib.request.urlopen(url, timeout=5) as r:
        body = json.load(r)
    assert body["status"] == "success", body
    return [(s["metric"], float(s["value"][1])) for s in body["data"]["result"]]


def _stop(proc):
    if proc is not None and proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def _wanted(port):
    """What is still missing from the server's view ('' when all is there),
    and the largest rooms-ended value seen."""
    up = _query(port, 'up{job="kvbridge"}')
    if not up or up[0][1] != 1:
        return "target not up: %r" % up, 0
    ended = _query(port, 'kvbridge_rooms_ended_total{outcome="success"}')
    roles = {m.get("role"): v for m, v in ended if m.get("rank") == "0" and v > 0}
    if set(roles) != {"prefill", "decode"}:
        return "rooms_ended_total: %r" % ended, 0
    xfers = _query(port, 'kvbridge_transfers_total{op="write",outcome="ok"}')
    if not any(m.get("lane") in LANES and v > 0 for m, v in xfers):
        return "transfers_total: %r" % xfers, 0
    nbytes = _query(port, 'kvbridge_transfer_bytes_total{op="write"}')
    if not any(m.get("lane") in LANES and v > 0 for m, v in nbytes):
        return "transfer_bytes_total: %r" % nbytes, 0
    stage = _query(port, 'kvbridge_room_stage_seconds_count{stage="total"}')
    if {m.get("role") for m, v in stage if v > 0} != {"prefill", "decode"}:
        return "room_stage_seconds_count: %r" % stage, 0
    return "", max(roles.values())


def test_prometheus_scrapes_rooms():
    prom = shutil.which("prometheus")
    if prom is None:
        pytest.skip("prometheus not installed (Debian: prometheus, scripts/install-deps.sh)")
    here = os.path.dirname(os.path.abspath(__file__))
    work = tempfile.mkdtemp(prefix="prometheus-scrape-", dir=os.getcwd())  # the build tree
    env = dict(os.environ, KVBRIDGE_METRICS_ADDR="127.0.0.1:0")
    mover = server = None
    try:
        mover = subprocess.Popen([sys.executable, "-c", _MOVER, here, "40"], env=env,
                                 stdout=subprocess.PIPE, text=True)
        first = mover.stdout.readline().split()
        assert first[:1] == ["serving"] and first[1] != "None", first
        target = first[1]
        with open(os.path.join(work, "prometheus.yml"), "w") as f:
            f.write("global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
                    "scrape_configs:\n  - job_name: kvbridge\n    static_configs:\n"
                    "      - targets: ['%s']\n" % target)
        port = _free_port()
        log = open(os.path.join(work, "prometheus.log"), "w")
        server = subprocess.Popen(
            [prom, "--config.file=" + os.path.join(work, "prometheus.yml"),
             "--storage.tsdb.path=" + os.path.join(work, "data"),
             "--web.listen-address=127.0.0.1:%d" % port], stdout=log, stderr=log)
        t0, missing, ended = time.monotonic(), "server not answering", 0
        while time.monotonic() - t0 < 30 and missing:
            time.sleep(0.5)
            assert server.poll() is None, open(os.path.join(work, "prometheus.log")).read()
            try:
                missing, ended = _wanted(port)
            except OSError as e:  # not listening yet
                missing = "query: %s" % e
        print("scraped %s via 127.0.0.1:%d after %.1f s: %s" %
              (target, port, time.monotonic() - t0, missing or "all series"))
        assert missing == "", missing
        _stop(mover)
        moved = [int(line.split()[1]) for line in mover.stdout if line.startswith("moved")]
        assert moved and 0 < ended <= moved[-1], (ended, moved[-1:])
    finally:
        _stop(mover)
        _stop(server)
    shutil.rmtree(work, ignore_errors=True)  # kept when the test failed
