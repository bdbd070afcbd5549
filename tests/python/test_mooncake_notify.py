"""Mooncake's notifications on the drop-in: transfer_sync / batch_transfer_sync
with notify=TransferNotify(name, msg), get_notifies() at the target (Mooncake's
transfer_engine_py.cpp: submitTransferWithNotify, getNotifies), over kvbridge's
engine notifications: one arrives only after the bytes of its transfer, none
for a failed transfer, hostile payloads read as text."""

import os
import sys
import time

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
PYDIR = os.path.join(os.path.dirname(os.path.dirname(HERE)), "python")
for d in (os.path.join(PYDIR, "compat"), PYDIR):
    if d not in sys.path:
        sys.path.insert(0, d)

import kvbridge  # noqa: E402
from mooncake.engine import TransferEngine, TransferNotify, TransferOpcode  # noqa: E402

N = 4 << 20


def wait_notifies(eng, n, limit=10.0):
    got, t0 = [], time.monotonic()
    while len(got) < n and time.monotonic() - t0 < limit:
        got += eng.get_notifies()
        time.sleep(0.001)
    return got


@pytest.fixture(params=["tcp", "rdma"])
def pair(request):
    a, b = TransferEngine(), TransferEngine()
    for e in (a, b):
        assert e.initialize("127.0.0.1", "P2PHANDSHAKE", request.param, "") == 0
    src = np.random.default_rng(7).integers(0, 256, N, dtype=np.uint8)
    dst = np.zeros(N, np.uint8)
    assert a.register_memory(src.ctypes.data, N) == 0
    assert b.register_memory(dst.ctypes.data, N) == 0
    yield a, b, src, dst, f"127.0.0.1:{b.get_rpc_port()}", f"127.0.0.1:{a.get_rpc_port()}"
    a.close()
    b.close()


def test_write_then_notify(pair):
    a, b, src, dst, sid_b, _ = pair
    assert b.get_notifies() == []
    rc = a.transfer_sync(sid_b, src.ctypes.data, dst.ctypes.data, N, TransferOpcode.Write,
                         notify=TransferNotify("req-7", "kv ready"))
    assert rc == 0
    got = wait_notifies(b, 1)
    assert [(n.name, n.msg) for n in got] == [("req-7", "kv ready")]
    assert np.array_equal(dst, src)  # its bytes were there when it came
    assert b.get_notifies() == []  # taken once


def test_batch_read_with_notify(pair):
    a, b, src, dst, _, sid_a = pair
    dst[:] = 0
    half = N // 2
    rc = b.batch_transfer_sync(sid_a, [dst.ctypes.data, dst.ctypes.data + half],
                               [src.ctypes.data, src.ctypes.data + half], [half, half],
                               TransferOpcode.Read, notify=TransferNotify("reader", "ü" * 3))
    assert rc == 0 and np.array_equal(dst, src)
    got = wait_notifies(a, 1)
    assert [(n.name, n.msg) for n in got] == [("reader", "üüü")]


def test_failed_transfer_sends_none(pair):
    a, b, src, _, sid_b, _ = pair
    rc = a.transfer_sync(sid_b, src.ctypes.data, 4096, 64, TransferOpcode.Write,
                         notify=TransferNotify("x", "must not arrive"))
    assert rc == -1
    time.sleep(0.3)
    assert b.get_notifies() == []


def test_order_and_bad_arguments(pair):
    a, b, src, dst, sid_b, _ = pair
    for i in range(20):
        assert a.transfer_sync(sid_b, src.ctypes.data + i, dst.ctypes.data + i, 1,
                               TransferOpcode.Write, TransferNotify(f"n{i}", str(i))) == 0
    got = wait_notifies(b, 20)
    assert [n.name for n in got] == [f"n{i}" for i in range(20)]
    with pytest.raises(TypeError):
        a.transfer_sync(sid_b, src.ctypes.data, dst.ctypes.data, 1, TransferOpcode.Write,
                        notify="not a TransferNotify")
    with pytest.raises(ValueError):
        a.transfer_sync(sid_b, src.ctypes.data, dst.ctypes.data, 1, TransferOpcode.Write,
                        notify=TransferNotify("n", "x" * (64 << 10)))


def test_plain_and_hostile_notifications(pair):
    _, b, _, _, sid_b, _ = pair
    raw = kvbridge.TransferEngine("127.0.0.1", 0, "tcp", name="raw-sender")
    try:
        for payload in (b"hello", b"MCN1", b"MCN1\xff\xff\xff\xffname", b"\xfe\xfd"):
            raw.notify(sid_b, payload)
        got = wait_notifies(b, 4)
        assert [n.name for n in got] == ["raw-sender"] * 4
        assert got[0].msg == "hello" and got[2].msg.startswith("MCN1")
    finally:
        raw.close()
