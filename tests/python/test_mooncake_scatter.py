"""Mooncake 0.3.14's scatter transfers with drain tickets on kvbridge's
drop-in (python/compat/mooncake/_scatter.py), and remote_accessible=False.

- Fragments of several ranges land byte for byte (submit + drain, and the
  sync form); the ticket says COMPLETED and drained.
- Malformed calls raise ValueError / TypeError with Mooncake's texts and
  write nothing.
- A fragment outside what the peer registered: a FAILED_DRAINED ticket
  (nothing was sent), drained, with the reason.
- A stopped peer (SIGSTOP, tcp lane, so bytes wait for its acknowledgement):
  a running ticket is COMPLETION_UNKNOWN and not drained; the sync form
  returns after its deadline, the cancel's settle bound and the session's
  close, still COMPLETION_UNKNOWN and not drained (bytes were in flight and
  may land when the peer resumes); drain() cannot prove more; a scatter
  read given up the same way is FAILED_DRAINED (its answers are placed only
  while it runs).
- A region registered with remote_accessible=False is a source only: a
  peer's write into it fails and leaves it untouched.
"""

import collections
import os
import signal
import sys
import threading
import time

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from test_mooncake_compat import HOST, Target, writer  # noqa: E402
import mooncake.engine as me  # noqa: E402
from mooncake.engine import TransferEngine  # noqa: E402
from kvb_testutil import stop_process  # noqa: E402

S = me.ScatterTransferCompletionStatus
N = 1 << 20


def engine():
    e = TransferEngine()
    assert e.initialize(HOST, "P2PHANDSHAKE", "rdma", "") == 0
    return e


@pytest.fixture
def pair():
    w, t = engine(), engine()
    src = np.random.default_rng(21).integers(0, 256, N, dtype=np.uint8)
    dst = np.zeros(N, np.uint8)
    assert w.register_memory(src.ctypes.data, N) == 0
    assert t.register_memory(dst.ctypes.data, N) == 0
    try:
        yield w, t, f"{HOST}:{t.get_rpc_port()}", src, dst
    finally:
        w.close()
        t.close()


def _args(src, dst):
    """Two ranges, three and two fragments, and the image they make."""
    s, d = src.ctypes.data, dst.ctypes.data
    ranges = [(s, 65536, d + 4096, 65536, [0, 100, 5000], [7, 300, 60000], [50, 4000, 1]),
              (s + 200000, 4096, d + 500000, 8192, [0, 2048], [8000, 0], [192, 2048])]
    img = np.zeros(N, np.uint8)
    for lb, lc, rb, rc, lo, ro, ln in ranges:
        for a, b, n in zip(lo, ro, ln):
            img[rb - d + b:rb - d + b + n] = src[lb - s + a:lb - s + a + n]
    cols = list(zip(*ranges))
    return [list(c) for c in cols[:4]] + [list(c) for c in cols[4:]], img


def test_scatter_write_lands(pair):
    w, t, sid, src, dst = pair
    args, img = _args(src, dst)
    tk = w.submit_scatter_write(sid, *args)
    assert isinstance(tk, me.ScatterTransferTicket)
    assert tk.drain(10000) == S.COMPLETED
    assert tk.status == S.COMPLETED and tk.drained is True and tk.error == ""
    assert np.array_equal(dst, img)
    dst[:] = 0
    tk = w.scatter_transfer_sync_write_with_ticket(sid, *args)
    assert tk.status == S.COMPLETED and tk.drained
    assert np.array_equal(dst, img)
    with pytest.raises(TypeError):
        me.ScatterTransferTicket()


def test_scatter_bad_arguments(pair):
    w, t, sid, src, dst = pair
    s, d = src.ctypes.data, dst.ctypes.data
    good = [[s], [4096], [d], [4096], [[0]], [[0]], [[8]]]
    cases = [
        ([[s, s], [4096], [d], [4096], [[0]], [[0]], [[8]]], "range arrays have different"),
        ([[s], [4096], [d], [4096], [[0, 1]], [[0]], [[8]]],
         "fragment arrays have different sizes at range 0"),
        ([[2**64 - 10], [4096], [d], [4096], [[0]], [[0]], [[8]]],
         "local allocation range overflows the address space at range 0"),
        ([[s], [4096], [d], [4096], [[4090]], [[0]], [[8]]], "invalid scatter transfer fragment"),
        ([[s], [4096], [d], [4096], [[0]], [[4095]], [[8]]], "invalid scatter transfer fragment"),
        ([[s], [4096], [d], [4096], [[0]], [[0]], [[0]]], "invalid scatter transfer fragment"),
        ([[s], [4096], [d], [4096], [[]], [[]], [[]]], "scatter transfer is empty"),
    ]
    for args, msg in cases:
        with pytest.raises(ValueError, match=msg):
            w.submit_scatter_write(sid, *args)
    with pytest.raises(TypeError):
        w.submit_scatter_write(sid, [-1], *good[1:])
    with pytest.raises(TypeError):
        w.submit_scatter_write(sid, "abc", *good[1:])
    with pytest.raises(TypeError):
        w.submit_scatter_write(5, *good)
    tk = w.submit_scatter_write(sid, *good)
    with pytest.raises(ValueError):
        tk.drain(-1)
    with pytest.raises(TypeError):
        tk.drain("1")
    assert tk.drain(10000) == S.COMPLETED
    assert np.array_equal(dst[:8], src[:8]) and not dst[8:].any()


def test_scatter_outside_registration(pair):
    w, t, sid, src, dst = pair
    d = dst.ctypes.data
    tk = w.submit_scatter_write(sid, [src.ctypes.data], [N], [d], [2 * N], [[0]], [[N - 8]],
                                [[16]])
    assert tk.status == S.FAILED_DRAINED and tk.drained is True
    assert "not inside a region the peer registered" in tk.error
    assert not dst.any()


def test_remote_accessible_false(pair):
    w, t, sid, src, dst = pair
    private = np.full(8192, 0x33, np.uint8)
    assert t.register_memory(private.ctypes.data, 8192, "cpu:0", False) == 0
    assert w.transfer_sync_write(sid, src.ctypes.data, private.ctypes.data, 4096) == -1
    assert (private == 0x33).all()
    tk = w.submit_scatter_write(sid, [src.ctypes.data], [N], [private.ctypes.data], [8192],
                                [[0]], [[0]], [[64]])
    assert tk.status == S.FAILED_DRAINED and (private == 0x33).all()
    # a source for its own engine's writes
    assert t.transfer_sync_write(f"{HOST}:{w.get_rpc_port()}", private.ctypes.data,
                                 src.ctypes.data, 4096) == 0
    assert (src[:4096] == 0x33).all()
    assert t.unregister_memory(private.ctypes.data) == 0


def test_scatter_stopped_peer(monkeypatch):
    monkeypatch.setenv("MC_TRANSFER_TIMEOUT", "1")  # raised to the minimum, 5 s
    t = Target("tcp")
    eng, src = writer("tcp")
    try:
        a0 = t.addrs[0]
        one = ([src.ctypes.data], [1 << 20], [a0], [1 << 20], [[0]], [[0]], [[4096]])
        assert eng.scatter_transfer_sync_write_with_ticket(t.sid, *one).status == S.COMPLETED
        big = ([src.ctypes.data], [4 << 20], [a0], [1 << 20], [[0]], [[0]], [[1 << 20]])
        stop_process(t.p.pid)
        t_stop = time.monotonic()
        running = eng.submit_scatter_write(t.sid, *big)
        rd = ([src.ctypes.data + (2 << 20)], [1 << 20], [a0], [1 << 20], [[0]], [[0]],
              [[1 << 20]])
        reading = eng.submit_scatter_read(t.sid, *rd)
        assert reading.status == S.COMPLETION_UNKNOWN and reading.drained is False
        assert running.drain(300) == S.COMPLETION_UNKNOWN and running.drained is False
        t0 = time.monotonic()
        tk = eng.scatter_transfer_sync_write_with_ticket(t.sid, *big)
        took = time.monotonic() - t0
        print(f"stopped peer: SIGSTOP at 0, sync scatter from {t0 - t_stop:.3f} s returned "
              f"{tk.status.name} after {took:.3f} s: {tk.error}")
        assert tk.status == S.COMPLETION_UNKNOWN and tk.drained is False
        assert "given up by its caller did not settle" in tk.error
        assert 5 <= took < 5 + 5 + 3  # deadline, then SETTLE_S at most
        assert tk.drain(100) == S.COMPLETION_UNKNOWN
        # failing the connection failed the earlier one too, bytes in flight
        assert running.drain(5000) == S.COMPLETION_UNKNOWN and running.drained is False
        # a read on the same connection, given up the same way, is drained:
        # its answers land only while it runs
        assert reading.status == S.FAILED_DRAINED and reading.drained is True, reading.error
    finally:
        os.kill(t.p.pid, signal.SIGCONT)
        eng.close()
        t.close()


def test_close_releases_tickets(pair):
    w, t, sid, src, dst = pair
    args, _ = _args(src, dst)
    tk = w.submit_scatter_write(sid, *args)
    w.close()
    assert tk.status in (S.COMPLETED, S.FAILED_DRAINED, S.COMPLETION_UNKNOWN)
    assert tk.drain(0) == tk.status


class _WaitWatch:
    """The library, seen through the two calls the drain race is about:
    records every kvb_xfer_free of a handle a kvb_xfer_wait is still inside
    (in C a use after free: the wait reads the freed transfer). Each wait
    stays "inside" 2 ms past the C call's return, so a free that the ticket
    lets through lands in that window nearly every time instead of in the
    few instructions before the C wait unlocks."""

    def __init__(self, lib):
        self._lib = lib
        self._mu = threading.Lock()
        self._inside = collections.Counter()
        self.misuse = []

    def kvb_xfer_wait(self, x, timeout_s):
        with self._mu:
            self._inside[x] += 1
        try:
            st = self._lib.kvb_xfer_wait(x, timeout_s)
            time.sleep(0.002)
            return st
        finally:
            with self._mu:
                self._inside[x] -= 1

    def kvb_xfer_free(self, x):
        with self._mu:
            if self._inside[x] > 0:
                self.misuse.append(x)
        self._lib.kvb_xfer_free(x)

    def __getattr__(self, name):
        return getattr(self._lib, name)


@pytest.mark.parametrize("other", ["status", "drain"])
def test_drain_races_collect(pair, monkeypatch, other):
    """Review 3 F3: drain() waits on the ticket's handle with the ticket's
    lock released; a concurrent status (or second drain) that sees the end
    must not free the handle under that wait. 60 rounds of one 1 MiB write:
    thread A drains, thread B polls status (or drains too); every handle
    freed while a wait was inside it is a misuse. Bounded: each round's
    threads are joined within 10 s."""
    from kvbridge import _lib as L
    w, t, sid, src, dst = pair
    watch = _WaitWatch(L.lib())
    monkeypatch.setattr(L, "lib", lambda: watch)
    one = ([src.ctypes.data], [N], [dst.ctypes.data], [N], [[0]], [[0]], [[N]])
    outcomes = collections.Counter()
    for _ in range(60):
        dst[:] = 0
        tk = w.submit_scatter_write(sid, *one)
        end = time.monotonic() + 10

        def a():
            outcomes[tk.drain(5000)] += 1

        def b():
            if other == "drain":
                outcomes[tk.drain(5000)] += 1
                return
            while tk.status == S.COMPLETION_UNKNOWN and time.monotonic() < end:
                pass

        ts = [threading.Thread(target=a), threading.Thread(target=b)]
        for th in ts:
            th.start()
        for th in ts:
            th.join(max(end - time.monotonic(), 0.1))
        assert not any(th.is_alive() for th in ts), "a drain or status poll hung"
        assert tk.status == S.COMPLETED and tk.drained
        assert np.array_equal(dst, src)
    print(f"{other}: drains returned {dict(outcomes)}; handles freed under a wait: "
          f"{len(watch.misuse)}")
    assert watch.misuse == []


def test_close_races_drain(monkeypatch):
    """F3, the engine's side: close() releases a ticket (cancel, settle,
    free) that another thread is draining; the handle must outlive that
    drain's wait. 20 rounds, each a fresh writer engine closed while a
    thread drains its 1 MiB write; no handle freed under a wait, every
    drain returns within 10 s."""
    from kvbridge import _lib as L
    watch = _WaitWatch(L.lib())
    monkeypatch.setattr(L, "lib", lambda: watch)
    t = engine()
    src, dst = np.ones(N, np.uint8), np.zeros(N, np.uint8)
    assert t.register_memory(dst.ctypes.data, N) == 0
    sid = f"{HOST}:{t.get_rpc_port()}"
    try:
        for _ in range(20):
            w = engine()
            assert w.register_memory(src.ctypes.data, N) == 0
            tk = w.submit_scatter_write(sid, [src.ctypes.data], [N], [dst.ctypes.data], [N],
                                        [[0]], [[0]], [[N]])
            th = threading.Thread(target=tk.drain, args=(5000,))
            th.start()
            w.close()
            th.join(10)
            assert not th.is_alive(), "a drain hung past close()"
            assert tk.status in (S.COMPLETED, S.FAILED_DRAINED, S.COMPLETION_UNKNOWN)
        assert watch.misuse == []
    finally:
        t.close()
