"""KVManager.changed() (kvb_manager_changed, issue 16 §4): the ids of rooms
whose poll answer may have changed since last asked, each once, oldest
first; nothing when nothing changed; a freed room never listed."""

import time

import numpy as np

import kvbridge as kb  # noqa: E402

from test_scale_api import _pair  # noqa: E402


def _wait(obj, want, timeout=10):
    end = time.monotonic() + timeout
    while obj.poll() != want and time.monotonic() < end:
        time.sleep(0.005)
    return obj.poll()


def test_changed_lists_rooms_once_in_order():
    with _pair() as (server, p, d, pm, dm):
        assert dm.changed() == [] and pm.changed() == []
        rooms = [300, 301, 302, 303]
        rcs = {}
        for i, room in enumerate(rooms):
            rcs[room] = kb.KVReceiver(dm, server.address, room)
            rcs[room].init([i], aux_index=i)
        # each changed twice (Bootstrapping, WaitingForInput), listed once;
        # cap 3 fetches them in two calls, in creation order
        assert dm.changed(cap=3) == rooms
        assert dm.changed() == []
        ss = {}
        for i, room in enumerate(rooms):
            p.fill(room, [i], i)
            ss[room] = kb.KVSender(pm, server.address, room)
            assert _wait(ss[room], kb.KVPoll.WaitingForInput) == kb.KVPoll.WaitingForInput
        assert sorted(pm.changed()) == rooms
        for room in (302, 300):  # one at a time: listed in that order
            i = rooms.index(room)
            ss[room].init(1, aux_index=i)
            ss[room].send(np.array([i], np.int32))
            assert _wait(rcs[room], kb.KVPoll.Success) == kb.KVPoll.Success
            assert d.wrong_bytes(room, [i], i) == 0
        assert dm.changed() == [302, 300]
        rcs[301].abort()
        rcs[301].clear()  # its room freed while listed: never returned
        assert 301 not in dm.changed()
        try:
            dm.changed(cap=0)
            raise AssertionError("cap 0 was accepted")
        except kb.InvalidArgument:
            pass
