"""Timelines and metrics from Python (docs/observe.md): sender.timeline() /
receiver.timeline() list a successful room's events in their order with
times since creation; kvbridge.metrics_text() counts the room."""

import re
import time

import numpy as np

import kvbridge as kb  # noqa: E402

from test_scale_api import _pair  # noqa: E402


def _wait(obj, want, timeout=10):
    end = time.monotonic() + timeout
    while obj.poll() != want and time.monotonic() < end:
        time.sleep(0.005)
    return obj.poll()


def _value(text, name, **labels):
    """The sample of name whose labels include labels (0 when absent)."""
    for line in text.splitlines():
        m = re.match(r"^(\w+)(?:\{(.*)\})? (\S+)$", line)
        if not m or m.group(1) != name:
            continue
        got = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2) or ""))
        if all(got.get(k) == v for k, v in labels.items()):
            return float(m.group(3))
    return 0.0


def _names(tl):
    return [e[0] for e in tl]


def _before(names, a, b):
    assert a in names and b in names, (a, b, names)
    assert names.index(a) < names.index(b), (a, b, names)


def test_timeline_and_metrics_of_a_room():
    with _pair() as (server, p, d, pm, dm):
        ended0 = _value(kb.metrics_text(), "kvbridge_rooms_ended_total", role="decode",
                        outcome="success")
        room = 900
        rc = kb.KVReceiver(dm, server.address, room)
        rc.init([0], aux_index=0)
        p.fill(room, [0], 0)
        s = kb.KVSender(pm, server.address, room)
        assert _wait(s, kb.KVPoll.WaitingForInput) == kb.KVPoll.WaitingForInput
        s.init(1, aux_index=0)
        s.send(np.array([0], np.int32))
        assert _wait(rc, kb.KVPoll.Success) == kb.KVPoll.Success
        assert _wait(s, kb.KVPoll.Success) == kb.KVPoll.Success
        assert d.wrong_bytes(room, [0], 0) == 0
        rt, st = rc.timeline(), s.timeline()
        print("receiver", list(rt), "sender", list(st))
        rn, sn = _names(rt), _names(st)
        assert rn[0] == "created" and rt[0].t == 0.0
        for a, b in [("created", "bootstrap_answered"),
                     ("bootstrap_answered", "transfer_info_sent"),
                     ("transfer_info_sent", "status_received"),
                     ("status_received", "terminal")]:
            _before(rn, a, b)
        term = rt[rn.index("terminal")]
        assert term.value == int(kb.KVPoll.Success) and term.detail == "success"
        for a, b in [("transfer_info_received", "chunk_planned"),
                     ("chunk_planned", "first_write_posted"),
                     ("first_write_posted", "last_write_done"),
                     ("last_write_done", "terminal"), ("terminal", "status_sent")]:
            _before(sn, a, b)
        times = [e.t for e in rt]
        assert times == sorted(times)  # one thread's stamps, in order
        assert rt.age >= times[-1] and rt.dropped == 0 and rt.room == room
        text = kb.metrics_text()
        assert "# TYPE kvbridge_rooms_ended_total counter" in text
        assert _value(text, "kvbridge_rooms_ended_total", role="decode",
                      outcome="success") == ended0 + 1
        s.clear()
        rc.clear()
        # the snapshot outlives nothing: a cleared handle has no timeline
        try:
            rc.timeline()
            raise AssertionError("a cleared receiver gave a timeline")
        except RuntimeError:
            pass


_OFF_SCRIPT = r"""
import numpy as np, kvbridge as kb, sys, time
sys.path.insert(0, sys.argv[1])
from test_scale_api import _pair
with _pair() as (server, p, d, pm, dm):
    rc = kb.KVReceiver(dm, server.address, 901)
    rc.init([0], aux_index=0)
    s = kb.KVSender(pm, server.address, 901)
    end = time.monotonic() + 10
    while s.poll() != kb.KVPoll.WaitingForInput and time.monotonic() < end:
        time.sleep(0.005)
    s.init(1, aux_index=0)
    s.send(np.array([0], np.int32))
    while rc.poll() != kb.KVPoll.Success and time.monotonic() < end:
        time.sleep(0.005)
    assert rc.poll() == kb.KVPoll.Success
    assert list(rc.timeline()) == [] and list(s.timeline()) == []
    text = kb.metrics_text()
    assert 'kvbridge_rooms_ended_total{role="decode",rank="0",outcome="success"} 0' in text
    assert 'kvbridge_transfers_total{lane=' in text
    print("off ok")
"""


def test_timeline_off():
    """KVBRIDGE_TIMELINE=0: rooms run, their timelines read empty and the
    per-room counters stay at 0 (a fresh interpreter: read once)."""
    import os
    import subprocess
    import sys
    env = dict(os.environ, KVBRIDGE_TIMELINE="0")
    here = os.path.dirname(os.path.abspath(__file__))
    r = subprocess.run([sys.executable, "-c", _OFF_SCRIPT, here], env=env, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0 and "off ok" in r.stdout, r.stdout + r.stderr
