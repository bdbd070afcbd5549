"""Mooncake 0.3.14's additions to the `mooncake.engine` drop-in
(python/compat/mooncake), between drop-in engines:

- TokenSpeed 0.1.1's construction sequence: hasattr(TransferEngine(),
  "batch_transfer_sync_write_pages") before initialize, initialize(ip,
  "P2PHANDSHAKE", "rdma", ""), register_memory(ptr, len), its positional
  five-argument pages call with numpy int64 arrays, unregister_memory;
- batch_transfer_sync_write_pages: the target's bytes equal the image the
  spans define, byte for byte, for runs that become strided blocks and
  spans that do not, several fields, batch sizes 0 / 4096 / 5 / 1, numpy
  int64 and uint64 arrays, buffers and lists, into plain and managed
  (direct-lane) memory, and into another process;
- the *_write_arrays calls, sync and async, byte-exact;
- bad arguments raise ValueError (TypeError for wrong hint types) and leave
  the destination unchanged; an empty grid returns 0 before any value
  check; a span outside the target's memory returns -1, nothing written;
- nic_hint / transport_hint keywords on every transfer call,
  register_memory(..., remote_accessible);
- what this file leaves to others: reads (test_mooncake_0314_surface.py),
  scatter tickets (test_mooncake_scatter.py), SharedSegment
  (test_mooncake_segment.py).
"""

import array
import ctypes
import os
import sys
import time

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
PYDIR = os.path.join(os.path.dirname(os.path.dirname(HERE)), "python")
COMPAT = os.path.join(PYDIR, "compat")
for d in (HERE, COMPAT, PYDIR):
    if d not in sys.path:
        sys.path.insert(0, d)

import mooncake.engine as me  # noqa: E402
from mooncake.engine import TransferEngine  # noqa: E402

HOST = "127.0.0.1"
PAGE = 4096
NPAGES = 64  # pages per field region on each side


def engine():
    e = TransferEngine()
    assert e.initialize(HOST, "P2PHANDSHAKE", "rdma", "") == 0
    return e


class Pair:
    """A writer and a target drop-in engine of this process; the target's
    memory plain numpy or managed (kvbridge shared memory)."""

    def __init__(self, managed=False, nfields=4):
        self.w, self.t = engine(), engine()
        self.sid = f"{HOST}:{self.t.get_rpc_port()}"
        n = nfields * NPAGES * PAGE
        self.src = np.random.default_rng(11).integers(0, 256, n, dtype=np.uint8)
        assert self.w.register_memory(self.src.ctypes.data, n) == 0
        if managed:
            self.dptr = self.t.allocate_managed_buffer(n)
            assert self.dptr != 0
            self.dst = np.ctypeslib.as_array((ctypes.c_uint8 * n).from_address(
                self.dptr))
        else:
            self._dst = np.zeros(n, np.uint8)
            self.dst = self._dst
            self.dptr = self._dst.ctypes.data
            assert self.t.register_memory(self.dptr, n, "*", True) == 0
        self.img = np.zeros(n, np.uint8)
        self.sptr = self.src.ctypes.data

    def fields(self, rows):
        """rows of (src field, src stride, dst field, dst stride, length,
        src offset, dst offset) → an int64 [F, 5] array."""
        out = []
        for sf, ss, df, ds, ln, so, do in rows:
            out.append([self.sptr + sf * NPAGES * PAGE + so, ss,
                        self.dptr + df * NPAGES * PAGE + do, ds, ln])
        return np.array(out, dtype=np.int64)

    def apply(self, sp, dp, f):
        for row in np.asarray(f):
            for a, b in zip(np.asarray(sp).tolist(), np.asarray(dp).tolist()):
                s = int(row[0]) - self.sptr + a * int(row[1])
                d = int(row[2]) - self.dptr + b * int(row[3])
                self.img[d:d + int(row[4])] = self.src[s:s + int(row[4])]

    def same(self):
        return np.array_equal(self.dst, self.img)

    def close(self):
        self.w.close()
        self.t.close()


@pytest.fixture(params=[False, True], ids=["plain", "managed"])
def pair(request):
    p = Pair(managed=request.param)
    try:
        yield p
    finally:
        p.close()


# Contiguous runs on both sides (one strided block each), an even stride on
# both sides, then scattered and descending pages (single spans).
SRC_PAGES = [0, 1, 2, 3, 4, 5, 10, 12, 14, 16, 40, 7, 33, 32, 31, 50]
DST_PAGES = [8, 9, 10, 11, 12, 13, 20, 23, 26, 29, 1, 60, 2, 3, 4, 0]
ROWS = [
    (0, PAGE, 0, PAGE, PAGE, 0, 0),              # whole pages
    (1, PAGE, 1, PAGE, 1000, 17, 5),             # head of each page, offsets
    (2, 2048, 2, PAGE, 24, 3, 1),                # small rows, different strides
    (3, PAGE, 3, 2 * PAGE // 2, 4096 - 64, 64, 0),
]


def test_tokenspeed_construction_sequence():
    e = TransferEngine()
    # TokenSpeed 0.1.1 refuses an engine without it, before initialize.
    assert hasattr(e, "batch_transfer_sync_write_pages")
    assert e.initialize(HOST, "P2PHANDSHAKE", "rdma", "") == 0
    t = engine()
    try:
        session = f"{HOST}:{t.get_rpc_port()}"
        arena = np.random.default_rng(3).integers(0, 256, 16 * PAGE, dtype=np.uint8)
        scratch = np.zeros(PAGE, np.uint8)
        dst = np.zeros(16 * PAGE, np.uint8)
        assert e.register_memory(arena.ctypes.data, arena.nbytes) == 0  # positional, defaults
        assert e.register_memory(scratch.ctypes.data, scratch.nbytes) == 0
        assert t.register_memory(dst.ctypes.data, dst.nbytes) == 0
        src_pages = np.array([0, 1, 2, 5], dtype=np.int64)
        dst_pages = np.array([3, 4, 5, 9], dtype=np.int64)
        fields = np.ascontiguousarray(np.array(
            [[arena.ctypes.data, PAGE, dst.ctypes.data, PAGE, PAGE]], dtype=np.int64))
        assert e.batch_transfer_sync_write_pages(session, src_pages, dst_pages, fields,
                                                 4096) == 0
        for a, b in zip(src_pages, dst_pages):
            assert np.array_equal(dst[b * PAGE:(b + 1) * PAGE], arena[a * PAGE:(a + 1) * PAGE])
        assert e.batch_transfer_sync_write(session, [arena.ctypes.data], [dst.ctypes.data],
                                           [10]) == 0
        assert e.unregister_memory(scratch.ctypes.data) == 0  # the arena stays
        assert e.batch_transfer_sync_write_pages(session, src_pages, dst_pages, fields,
                                                 4096) == 0
    finally:
        e.close()
        t.close()


@pytest.mark.parametrize("batch", [0, 4096, 5, 1])
def test_write_pages_exact(pair, batch):
    sp = np.array(SRC_PAGES, np.int64)
    dp = np.array(DST_PAGES, np.int64)
    f = pair.fields(ROWS)
    assert pair.w.batch_transfer_sync_write_pages(pair.sid, sp, dp, f, batch) == 0
    pair.apply(sp, dp, f)
    assert pair.same()


def test_write_pages_input_kinds(pair):
    f = pair.fields(ROWS)
    kinds = [
        (np.array(SRC_PAGES, np.uint64), np.array(DST_PAGES, np.uint64), f.view(np.uint64)),
        (SRC_PAGES, DST_PAGES, f.tolist()),
        (array.array("q", SRC_PAGES), memoryview(array.array("q", DST_PAGES)), f),
        (tuple(SRC_PAGES[::-1]), tuple(DST_PAGES[::-1]), f[::-1].copy()),
    ]
    for k, (sp, dp, fl) in enumerate(kinds):
        pair.src[:] = np.random.default_rng(100 + k).integers(0, 256, pair.src.size,
                                                               dtype=np.uint8)
        assert pair.w.batch_transfer_sync_write_pages(pair.sid, sp, dp, fl) == 0, k
        pair.apply(SRC_PAGES if k < 3 else SRC_PAGES[::-1],
                   DST_PAGES if k < 3 else DST_PAGES[::-1], fl if k != 1 else f)
        assert pair.same(), k


def test_write_pages_other_process():
    from test_mooncake_compat import SIZES, Target, sha
    tgt = Target()
    w = engine()
    try:
        src = np.random.default_rng(5).integers(0, 256, 1 << 20, dtype=np.uint8)
        assert w.register_memory(src.ctypes.data, src.nbytes) == 0
        img = [np.zeros(n, np.uint8) for n in SIZES]
        # field 0 into buffer 0 (1 MiB), field 1 into buffer 1 (256 KiB)
        f = np.array([[src.ctypes.data, PAGE, tgt.addrs[0], PAGE, PAGE],
                      [src.ctypes.data + (512 << 10), 512, tgt.addrs[1], 1024, 300]], np.int64)
        sp = np.array([0, 1, 2, 3, 9, 7, 100], np.int64)
        dp = np.array([4, 5, 6, 7, 0, 200, 30], np.int64)
        assert w.batch_transfer_sync_write_pages(tgt.sid, sp, dp, f, 3) == 0
        for a, b in zip(sp.tolist(), dp.tolist()):
            img[0][b * PAGE:(b + 1) * PAGE] = src[a * PAGE:(a + 1) * PAGE]
            s = (512 << 10) + a * 512
            img[1][b * 1024:b * 1024 + 300] = src[s:s + 300]
        assert tgt.digests() == [sha(i) for i in img]
    finally:
        w.close()
        tgt.close()


def test_write_pages_bad_arguments(pair):
    sp = np.array(SRC_PAGES, np.int64)
    dp = np.array(DST_PAGES, np.int64)
    f = pair.fields(ROWS)
    wp = pair.w.batch_transfer_sync_write_pages

    def bad_row(r, c, v):
        g = f.copy()
        g[r, c] = v
        return g

    neg = dp.copy()
    neg[3] = -1
    cases = [
        ((sp[:-1], dp, f), "same length"),
        ((sp, neg, f), "negative"),
        ((sp.reshape(4, 4), dp.reshape(4, 4), f), "one-dimensional"),
        ((sp.astype(np.float64), dp, f), "8-byte integers"),
        ((sp.astype(np.int32), dp, f), "8-byte integers"),
        ((np.array(SRC_PAGES * 2, np.int64)[::2], dp, f), "contiguous"),
        ((sp, dp, f[:, :4].copy()), r"\[rows, 5\]"),
        ((sp, dp, f.ravel()), r"\[rows, 5\]"),
        ((sp, dp, np.asfortranarray(f)), "C-contiguous"),
        ((sp, dp, f.astype(np.int32)), "8-byte integers"),
        ((sp, dp, bad_row(1, 4, 0)), "positive length"),
        ((sp, dp, bad_row(2, 4, -24)), "positive length"),
        ((sp, dp, bad_row(0, 1, -PAGE)), "non-negative strides"),
        ((sp, dp, bad_row(3, 3, -1)), "non-negative strides"),
        ((sp, dp, bad_row(0, 2, -PAGE)), "2\\^64"),
        ((sp, dp, [[1, 2, 3, 4]]), r"\[rows, 5\]"),
        (("abc", dp, f), "8-byte integers"),
    ]
    for args, msg in cases:
        with pytest.raises(ValueError, match=msg):
            wp(pair.sid, *args)
    with pytest.raises(ValueError, match="max_batch_size"):
        wp(pair.sid, sp, dp, f, -1)
    with pytest.raises(TypeError):
        wp(pair.sid, sp, dp, f, 0, "", 7)  # nic_hint must be a str
    assert pair.same()  # nothing written
    # empty grids: 0 before any value check
    assert wp(pair.sid, sp[:0], dp[:0], bad_row(1, 4, 0)) == 0
    assert wp(pair.sid, sp, dp, f[:0]) == 0
    assert wp(pair.sid, [], [], f) == 0
    # a span outside the target's memory: -1, nothing of that batch written
    far = dp.copy()
    far[-1] = NPAGES * 4
    assert wp(pair.sid, sp, far, f) == -1
    assert pair.same()
    # before initialize: -1 for a good grid, shape errors still raise
    e = TransferEngine()
    assert e.batch_transfer_sync_write_pages(pair.sid, sp, dp, f) == -1
    with pytest.raises(ValueError):
        e.batch_transfer_sync_write_pages(pair.sid, sp, dp[:2], f)


def test_arrays_exact_and_bad(pair):
    n = 300
    rng = np.random.default_rng(9)
    size = pair.src.size
    starts = rng.choice(size // 512, n, replace=False).astype(np.uint64) * 512
    dsts = rng.permutation(size // 512)[:n].astype(np.uint64) * 512
    lens = rng.integers(1, 513, n).astype(np.uint64)
    src = np.uint64(pair.sptr) + starts
    dst = np.uint64(pair.dptr) + dsts

    def apply(lo, hi):
        for s, d, ln in zip(starts[lo:hi].tolist(), dsts[lo:hi].tolist(), lens[lo:hi].tolist()):
            pair.img[d:d + ln] = pair.src[s:s + ln]

    assert pair.w.batch_transfer_sync_write_arrays(pair.sid, src[:100], dst[:100], lens[:100],
                                                   nic_hint="mlx5_0") == 0
    apply(0, 100)
    assert pair.same()
    bid = pair.w.batch_transfer_async_write_arrays(
        pair.sid, src[100:200].astype(np.int64), dst[100:200].astype(np.int64),
        lens[100:200].astype(np.int64), transport_hint="rdma", nic_hint="")
    assert bid > 0 and pair.w.get_batch_transfer_status([bid]) == 0
    apply(100, 200)
    assert pair.same()
    a, b, c = (array.array("Q", v[200:].tolist()) for v in (src, dst, lens))
    assert pair.w.batch_transfer_sync_write_arrays(pair.sid, a, b, c) == 0
    apply(200, n)
    assert pair.same()
    assert pair.w.batch_transfer_sync_write_arrays(pair.sid, src[:0], dst[:0], lens[:0]) == 0

    pair.src[:] = rng.integers(0, 256, size, dtype=np.uint8)  # any write now shows
    i64 = src[:10].astype(np.int64)
    neg = i64.copy()
    neg[4] = -1
    for call in (pair.w.batch_transfer_sync_write_arrays,
                 pair.w.batch_transfer_async_write_arrays):
        for args, msg in [
            ((src[:10], dst[:9], lens[:10]), "same length"),
            ((src[:10].reshape(2, 5), dst[:10], lens[:10]), "one-dimensional"),
            ((src[:20:2], dst[:10], lens[:10]), "contiguous"),
            ((src[:10].astype(np.uint32), dst[:10], lens[:10]), "8-byte integers"),
            ((src[:10], dst[:10], lens[:10].astype(np.float64)), "8-byte integers"),
            ((neg, dst[:10], lens[:10]), "negative"),
            (("abc", dst[:10], lens[:10]), "8-byte integers"),
        ]:
            with pytest.raises(ValueError, match=msg):
                call(pair.sid, *args)
    assert pair.same()


def test_hints_on_every_transfer_call(pair):
    w, sid, s, d = pair.w, pair.sid, pair.sptr, pair.dptr
    kw = dict(transport_hint="rdma", nic_hint="mlx5_1")
    assert w.transfer_sync_write(sid, s, d, 8, **kw) == 0
    assert w.batch_transfer_sync_write(sid, [s], [d + 8], [8], **kw) == 0
    assert w.transfer_sync(sid, s, d + 16, 8, me.TransferOpcode.Write, None, **kw) == 0
    assert w.batch_transfer_sync(sid, [s], [d + 24], [8], me.Write, None, **kw) == 0
    bid = w.batch_transfer_async_write(sid, [s], [d + 32], [8], **kw)
    assert bid > 0 and w.get_batch_transfer_status([bid]) == 0
    bid = w.batch_transfer_async(sid, [s], [d + 40], [8], me.Write, **kw)
    assert bid > 0 and w.get_batch_transfer_status([bid]) == 0
    bid = w.transfer_submit_write(sid, s, d + 48, 8, **kw)
    assert bid > 0
    for _ in range(1000):
        st = w.transfer_check_status(bid)
        if st != 0:
            break
        time.sleep(0.01)
    assert st == 1
    for k in range(7):
        pair.img[8 * k:8 * k + 8] = pair.src[:8]
    assert pair.same()
    with pytest.raises(TypeError, match="nic_hint"):
        w.transfer_sync_write(sid, s, d, 8, nic_hint=None)
    # remote_accessible: accepted (True or False); the region is registered
    extra = np.zeros(PAGE, np.uint8)
    assert w.register_memory(extra.ctypes.data, PAGE, "cpu:0", False) == 0
    assert w.unregister_memory(extra.ctypes.data) == 0
    assert w.register_memory(extra.ctypes.data, PAGE, remote_accessible=True) == 0
    assert w.unregister_memory(extra.ctypes.data) == 0


def test_0314_module_names():
    assert me.SUPPORT_MULTI_PROTOCOL is False
    S = me.ScatterTransferCompletionStatus
    assert {m.name for m in S} == {"COMPLETED", "FAILED_DRAINED", "COMPLETION_UNKNOWN"}
    with pytest.raises(TypeError):
        me.ScatterTransferTicket()
    assert me.SharedSegment.supported() is True  # tests/python/test_mooncake_segment.py
