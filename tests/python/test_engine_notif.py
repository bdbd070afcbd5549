"""Notifications through the Python bindings (TransferEngine.notify /
get_notifs, engine.h "Notifications"): two engines, one named; the
messages arrive in order with the sender's name (the name given, else the
session id), empty and 64 KiB messages; too long a message, a bad name
and a closed engine are refused with the reason; nothing arrives twice."""
import os
import sys
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
PYDIR = os.path.join(os.path.dirname(os.path.dirname(HERE)), "python")
if PYDIR not in sys.path:
    sys.path.insert(0, PYDIR)

from kvbridge import KVBridgeError, TransferEngine  # noqa: E402
from kvbridge._lib import InvalidArgument  # noqa: E402


def take(eng, want, bound=5.0):
    got, end = [], time.monotonic() + bound
    while len(got) < want and time.monotonic() < end:
        got += eng.get_notifs()
        time.sleep(0.001)
    return got


def test_notify_order_and_names():
    with TransferEngine() as rx, TransferEngine(name="decode-agent-0") as tx, \
            TransferEngine() as anon:
        msgs = [f"req{i}:1".encode() for i in range(20)] + [b"", b"x" * 65536]
        for m in msgs:
            tx.notify(rx.get_session_id(), m)
        anon.notify(rx.get_session_id(), "HB:req1,req2")
        got = take(rx, len(msgs) + 1)
        assert got[:len(msgs)] == [("decode-agent-0", m) for m in msgs]
        assert got[len(msgs):] == [(anon.get_session_id(), b"HB:req1,req2")]
        time.sleep(0.1)
        assert rx.get_notifs() == []


def test_notify_refusals():
    with TransferEngine() as rx, TransferEngine() as tx:
        with pytest.raises(InvalidArgument, match="at most 65536"):
            tx.notify(rx.get_session_id(), b"x" * 65537)
        with pytest.raises(InvalidArgument):
            tx.notify(rx.get_session_id(), 42)
        with pytest.raises(KVBridgeError):  # nobody listens there
            tx.notify("127.0.0.1:1", b"hello", timeout=1)
    with pytest.raises(InvalidArgument, match="name must be"):
        TransferEngine(name="n" * 256)
    with pytest.raises(InvalidArgument, match="name must be"):
        TransferEngine(name="")
    rx = TransferEngine()
    rx.close()
    with pytest.raises(Exception):
        rx.get_notifs()
