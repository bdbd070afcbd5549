"""Scale APIs of the bindings (issue 16 §4): KVManager.traffic() counts
control messages, bootstrap requests and heartbeats; poll_many() polls many
senders or receivers in one call, with the same answers as poll()."""

import contextlib
import os
import time

import numpy as np

import kvbridge as kb  # noqa: E402

from test_bindings import MODEL, Rank  # noqa: E402


@contextlib.contextmanager
def _pair():
    """A bootstrap server, one engine, a prefill and a decode manager on it:
    (server, prefill Rank, decode Rank, prefill manager, decode manager)."""
    with kb.KVBootstrapServer("127.0.0.1", 0) as server:
        eng = kb.TransferEngine("127.0.0.1", 0)
        p, d = Rank(MODEL, 0, 1), Rank(MODEL, 0, 1)
        try:
            pm = kb.KVManager(p.kv_args(), "prefill", server.address, engine=eng)
            dm = kb.KVManager(d.kv_args(), "decode", engine=eng)
            yield server, p, d, pm, dm
        finally:
            eng.close()  # closes the managers and their rooms first


def test_traffic_counts_rooms_and_bootstrap():
    with _pair() as (server, p, d, pm, dm):
        t0p, t0d = pm.traffic(), dm.traffic()
        assert set(t0p) == {"control_sent", "control_send_failed", "control_received",
                            "bootstrap_requests", "bootstrap_failed",
                            "heartbeat_requests", "heartbeat_failed", "integrity_sent",
                            "integrity_checked", "integrity_mismatches",
                            "integrity_unchecked"}
        assert t0p["bootstrap_requests"] >= 1  # the prefill's registration
        rooms = 6
        for r in range(rooms):
            rc = kb.KVReceiver(dm, server.address, 100 + r)
            rc.init([r], aux_index=r % 8)
            s = kb.KVSender(pm, server.address, 100 + r)
            end = time.monotonic() + 10
            while s.poll() != kb.KVPoll.WaitingForInput and time.monotonic() < end:
                time.sleep(0.005)
            s.init(1, aux_index=r % 8)
            s.send(np.array([r], np.int32))
            while rc.poll() != kb.KVPoll.Success and time.monotonic() < end:
                time.sleep(0.005)
            assert rc.poll() == kb.KVPoll.Success
        t1p, t1d = pm.traffic(), dm.traffic()
        assert t1d["control_sent"] - t0d["control_sent"] >= rooms
        assert t1p["control_received"] - t0p["control_received"] >= rooms
        assert t1d["control_send_failed"] == 0
        assert t1d["bootstrap_requests"] >= 1  # parallel info + rank look-up
        assert t1p["heartbeat_requests"] == 0  # prefills do not beat


def test_integrity_parameter():
    """KVManager(integrity="check") on both sides: every room's digest is
    sent and checked (docs/integrity.md); a bad value is refused."""
    with kb.KVBootstrapServer("127.0.0.1", 0) as server:
        eng = kb.TransferEngine("127.0.0.1", 0)
        p, d = Rank(MODEL, 0, 1), Rank(MODEL, 0, 1)
        try:
            try:
                kb.KVManager(d.kv_args(), "decode", engine=eng, integrity="yes")
                assert False, "integrity='yes' accepted"
            except kb.InvalidArgument:
                pass
            pm = kb.KVManager(p.kv_args(), "prefill", server.address, engine=eng,
                              integrity="check")
            dm = kb.KVManager(d.kv_args(), "decode", engine=eng, integrity="check")
            rooms = 3
            for r in range(rooms):
                p.fill(300 + r, [r], r)
                rc = kb.KVReceiver(dm, server.address, 300 + r)
                rc.init([r], aux_index=r)
                s = kb.KVSender(pm, server.address, 300 + r)
                end = time.monotonic() + 10
                while s.poll() != kb.KVPoll.WaitingForInput and time.monotonic() < end:
                    time.sleep(0.005)
                s.init(1, aux_index=r)
                s.send(np.array([r], np.int32))
                while rc.poll() != kb.KVPoll.Success and time.monotonic() < end:
                    time.sleep(0.005)
                assert rc.poll() == kb.KVPoll.Success
            tp, td = pm.traffic(), dm.traffic()
            assert tp["integrity_sent"] == rooms
            assert (td["integrity_checked"], td["integrity_mismatches"],
                    td["integrity_unchecked"]) == (rooms, 0, 0)
        finally:
            eng.close()


def _wait_readable(fd, timeout):
    import select
    r, _, _ = select.select([fd], [], [], timeout)
    if r:
        os.read(fd, 8)
    return bool(r)


def test_poll_many_and_event_fd():
    """Rooms polled only with poll_many: the same answers as poll(), bytes
    right, the decode's event fd wakes on changes, bad input refused."""
    with _pair() as (server, p, d, pm, dm):
        fd = dm.event_fd()
        assert fd >= 0 and dm.event_fd() == fd
        while _wait_readable(fd, 0):
            pass
        rooms = list(range(200, 208))
        rcs, ss = [], []
        for i, room in enumerate(rooms):
            pages = [2 * i, 2 * i + 1]
            p.fill(room, pages, i)
            rc = kb.KVReceiver(dm, server.address, room)
            rc.init(pages, aux_index=i)
            rcs.append(rc)
            ss.append(kb.KVSender(pm, server.address, room))
        end = time.monotonic() + 10
        while time.monotonic() < end:
            st = kb.poll_many(ss)
            if all(x == kb.KVPoll.WaitingForInput for x in st):
                break
            time.sleep(0.005)
        assert st == [kb.KVPoll.WaitingForInput] * len(ss)
        assert [s.poll() for s in ss] == st
        while _wait_readable(fd, 0.1):
            pass
        for i, s in enumerate(ss):
            s.init(2, aux_index=i)
            s.send(np.array([2 * i, 2 * i + 1], np.int32))
        assert _wait_readable(fd, 5), "no event after the sends"
        while time.monotonic() < end:
            st = kb.poll_many(rcs)
            if all(x == kb.KVPoll.Success for x in st):
                break
            _wait_readable(fd, 0.05)
        assert st == [kb.KVPoll.Success] * len(rcs)
        assert [rc.poll() for rc in rcs] == st
        for i, room in enumerate(rooms):
            assert d.wrong_bytes(room, [2 * i, 2 * i + 1], i) == 0
        rcs[0].clear()  # cleared: its conclusion
        assert kb.poll_many(rcs)[0] == kb.KVPoll.Success
        assert kb.poll_many([]) == []
        try:
            kb.poll_many([ss[0], rcs[1]])
            raise AssertionError("a mix was accepted")
        except kb.InvalidArgument:
            pass
