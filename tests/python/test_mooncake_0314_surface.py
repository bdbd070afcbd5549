"""Conformance of the `mooncake.engine` drop-in (python/compat/mooncake)
to Mooncake 0.3.14's official type stub, recorded in
mooncake_0314_surface.json (scripts/mooncake-surface.py over
`mooncake/engine.pyi` of mooncake-transfer-engine-cuda13 0.3.14: names,
parameters, defaults, annotations; no code of it).

(a) Surface: every module name of the stub exists; every TransferEngine
    method has a compatible signature (inspect.signature): the stub's
    positional parameters in its order (positional-only ones under any
    name, the others under the stub's name), the same defaults, nothing
    required that the stub leaves optional, no *args / **kwargs; the other
    classes' members likewise. The drop-in's own extras are listed exactly.
(b) Behaviour: every TransferEngine method of the stub is called (the
    test checks that none is left out) with good arguments -- byte-exact
    at the target, between two engines of this process and, for the sync
    and pages writes, into another process -- and with bad ones: a clear
    exception (TypeError / ValueError, or NotImplementedError naming the
    method and why) or, where Mooncake reports a bad value by its return
    code (-1, batch id 0, -3, -7, -102), that code; after every bad call
    the target's bytes are unchanged.
(c) NOT_IMPLEMENTED is exactly the set of methods that raise
    NotImplementedError, each with its reason: a later session that makes
    one work (reads, scatter tickets, ...) changes this list and the
    method's test.
"""

import ctypes
import inspect
import json
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
from mooncake.engine import TransferEngine, TransferNotify, TransferOpcode  # noqa: E402

with open(os.path.join(HERE, "mooncake_0314_surface.json")) as _f:
    GOLDEN = json.load(_f)
MOD = GOLDEN["module"]
TE = MOD["classes"]["TransferEngine"]["methods"]
HOST = "127.0.0.1"
SIZE = 1 << 20

# method -> what its NotImplementedError must say (besides the method name)
NOT_IMPLEMENTED = {
    "transfer_write_on_cuda": "no CUDA",
    "transfer_read_on_cuda": "no CUDA",
    "batch_transfer_write_on_cuda": "no CUDA",
    "batch_transfer_read_on_cuda": "no CUDA",
    "get_engine": "Mooncake Store hook",
    "get_engine_ptr": "Mooncake Store hook",
}
# supported, but a documented part raises NotImplementedError
PARTIAL = {}
# kvbridge's own additions to TransferEngine (docs/python.md)
KVBRIDGE_EXTRAS = {"close", "batch_transfer_poll", "batch_transfer_free"}
# module classes of the stub the drop-in declares but does not provide
# the RPC helpers (on engine notifications; behaviour: test_mooncake_names.py)
RPC_CLASSES = {"RpcInterface", "ReceivedData", "ReceivedTensor"}

_EMPTY = inspect.Parameter.empty


# ------------------------------------------------------------------ (a) surface

def _compatible(golden, fn):
    """Problems of fn's signature against a golden method entry (list of
    strings; empty when compatible). The stub's entries carry no self."""
    sig = inspect.signature(fn)
    ps = list(sig.parameters.values())
    if ps and ps[0].name in ("self", "cls"):
        ps = ps[1:]
    bad = []
    if any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in ps):
        bad.append("takes *args / **kwargs")
        return bad
    gps = golden["params"]
    positional = [p for p in ps if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    for i, g in enumerate(gps):
        if g["kind"] == "keyword_only":
            p = sig.parameters.get(g["name"])
            if p is None or p.kind not in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD):
                bad.append(f"no keyword {g['name']}")
                continue
        else:
            if i >= len(positional):
                bad.append(f"no parameter {i} ({g['name']})")
                continue
            p = positional[i]
            if g["kind"] == "positional_or_keyword" and (
                    p.name != g["name"] or p.kind != p.POSITIONAL_OR_KEYWORD):
                bad.append(f"parameter {i} is {p.name!r} ({p.kind}), the stub says "
                           f"{g['name']!r} (by position or keyword)")
        want = g["default"]["value"] if "default" in g else _EMPTY
        if p.default != want or (p.default is _EMPTY) != (want is _EMPTY):
            bad.append(f"{g['name']}: default {p.default!r}, the stub says {want!r}")
    for p in ps[len(gps):]:
        if p.default is _EMPTY:
            bad.append(f"extra required parameter {p.name}")
    return bad


def test_golden_is_mooncake_0314():
    src = GOLDEN["source"]
    assert (src["package"], src["version"], src["file"]) == (
        "mooncake-transfer-engine-cuda13", "0.3.14", "mooncake/engine.pyi")
    assert len(TE) == 45 and "batch_transfer_sync_write_pages" in TE


def test_module_names():
    for name, ann in MOD["constants"].items():
        v = getattr(me, name)
        if ann == "bool":
            assert v is False, name  # host-only build: no CUDA/EFA/HIP/..., one protocol
        else:
            assert isinstance(v, TransferOpcode), name
    assert me.Read is TransferOpcode.Read and me.Write is TransferOpcode.Write
    for name, target in MOD["aliases"].items():
        if not name.startswith("_"):
            assert getattr(me, name) is getattr(me, target), name
    assert TransferEngine.TransferOpcode is TransferOpcode  # the class alias
    for name in MOD["classes"]:
        assert inspect.isclass(getattr(me, name)), name
    for name, f in MOD["functions"].items():  # create_rpc_client / _server
        assert _compatible(f, getattr(me, name)) == [], name
    c = me.create_rpc_client()  # (the server one listens on 0.0.0.0:8080: not here)
    assert isinstance(c, me.RpcInterface)
    c.close()


@pytest.mark.parametrize("name", sorted(TE))
def test_transfer_engine_signature(name):
    fn = getattr(TransferEngine, name, None)
    assert fn is not None, f"TransferEngine.{name} missing"
    assert _compatible(TE[name], fn) == [], name


def test_transfer_engine_has_nothing_else():
    public = {n for n, _ in inspect.getmembers(TransferEngine)
              if not n.startswith("_")} - {"TransferOpcode"}
    assert public - set(TE) == KVBRIDGE_EXTRAS
    assert set(NOT_IMPLEMENTED) <= set(TE) and set(PARTIAL) <= set(TE)


def test_enums():
    for cls in (TransferOpcode, me.ScatterTransferCompletionStatus):
        g = MOD["classes"][cls.__name__]
        names = [n for n in g["attributes"] if n != "__members__"]
        assert list(cls.__members__) == names
        for m in g["methods"]:
            assert hasattr(cls, m), (cls.__name__, m)
        for p in g["properties"]:
            assert all(hasattr(v, p) for v in cls), (cls.__name__, p)
        for v in cls:
            assert cls(int(v)) is v and cls(v.value) == v and hash(v) == hash(cls(int(v)))
            assert int(v) == v.__index__() == v.value and v.name in names
    assert TransferOpcode.Read < TransferOpcode.Write and int(TransferOpcode.Write) == 1
    with pytest.raises(ValueError):
        TransferOpcode(7)


def test_other_classes():
    # TransferNotify: both overloads, the two attributes
    g = MOD["classes"]["TransferNotify"]
    assert len(g["methods"]["__init__"]["overloads"]) == 2
    n0, n2 = TransferNotify(), TransferNotify("name", "msg")
    assert (n0.name, n0.msg, n2.name, n2.msg) == ("", "", "name", "msg")
    assert set(g["attributes"]) == {"name", "msg"}
    # InnerTransferEngine: opaque, no constructor
    with pytest.raises(TypeError):
        me.InnerTransferEngine()
    # ScatterTransferTicket: declared members, never constructed
    g = MOD["classes"]["ScatterTransferTicket"]
    for p in g["properties"]:
        assert isinstance(inspect.getattr_static(me.ScatterTransferTicket, p), property), p
    for m, f in g["methods"].items():
        assert _compatible(f, getattr(me.ScatterTransferTicket, m)) == [], m
    with pytest.raises(TypeError):
        me.ScatterTransferTicket()
    # SharedSegment: every member with the stub's signature; host memory by
    # mapping only (test_mooncake_segment.py exercises it across processes)
    g = MOD["classes"]["SharedSegment"]
    for m, f in g["methods"].items():
        static = "staticmethod" in f["decorators"]
        assert isinstance(inspect.getattr_static(me.SharedSegment, m), staticmethod) == static
        assert _compatible(f, getattr(me.SharedSegment, m)) == [], m
    assert me.SharedSegment.supported() is True
    assert me.SharedSegment.supported(mmap=False, host_register=True) is False
    seg, blob = me.SharedSegment.create("seg", 4096, 1, 0)
    seg.complete([blob])
    assert seg.ready() and seg.base_addr() != 0 and seg.size() == 4096
    # RPC helpers: the stub's members; the received kinds have no constructor
    for name in RPC_CLASSES:
        g = MOD["classes"][name]
        for m, f in g["methods"].items():
            assert _compatible(f, getattr(getattr(me, name), m)) == [], (name, m)
        for p in g["properties"]:
            assert isinstance(inspect.getattr_static(getattr(me, name), p), property), (name, p)
    for name in ("ReceivedData", "ReceivedTensor"):
        with pytest.raises(TypeError):
            getattr(me, name)()
    assert set(MOD["classes"]) - RPC_CLASSES == {
        "TransferOpcode", "ScatterTransferCompletionStatus", "ScatterTransferTicket",
        "TransferNotify", "InnerTransferEngine", "TransferEngine", "SharedSegment"}


# ------------------------------------------------------------------ (b) behaviour

class Pair:
    """A writer w and a target t of this process; src registered with w,
    dst with t; img is what dst must hold."""

    def __init__(self):
        self.w, self.t = TransferEngine(), TransferEngine()
        assert self.w.initialize(HOST, "P2PHANDSHAKE", "rdma", "") == 0
        assert self.t.initialize(HOST, "P2PHANDSHAKE", "rdma", "") == 0
        self.sid = f"{HOST}:{self.t.get_rpc_port()}"
        self.rng = np.random.default_rng(314)
        self.src = self.rng.integers(0, 256, SIZE, dtype=np.uint8)
        self.dst = np.zeros(SIZE, np.uint8)
        assert self.w.register_memory(self.src.ctypes.data, SIZE) == 0
        assert self.t.register_memory(self.dst.ctypes.data, SIZE) == 0
        self.s, self.d = self.src.ctypes.data, self.dst.ctypes.data
        self.img = self.dst.copy()
        self.bytes_checked = 0

    def fresh(self):
        """New source bytes: any write from now on would show."""
        self.src[:] = self.rng.integers(0, 256, SIZE, dtype=np.uint8)

    def wrote(self, spans):
        """spans (src offset, dst offset, length) were written: check all of dst."""
        for so, do, n in spans:
            self.img[do:do + n] = self.src[so:so + n]
        assert np.array_equal(self.dst, self.img)
        self.bytes_checked += sum(n for _, _, n in spans)

    def unchanged(self):
        assert np.array_equal(self.dst, self.img)

    def read(self, spans):
        """spans (src offset, dst offset, length) were read: the local src
        holds the target's bytes there, the bytes around them are 0 (the
        caller zeroed src first), and the target is unchanged."""
        want = np.zeros(SIZE, np.uint8)
        for so, do, n in spans:
            want[so:so + n] = self.dst[do:do + n]
        assert np.array_equal(self.src, want)
        self.unchanged()
        self.bytes_checked += sum(n for _, _, n in spans)

    def read_refused(self, call, expect):
        """As refused, for reads: the local src is unchanged too."""
        self.fresh()
        before = self.src.copy()
        self._outcome(call, expect)
        assert np.array_equal(self.src, before)
        self.unchanged()

    @staticmethod
    def _outcome(call, expect):
        """call() raises expect (an exception class, or (class, pattern)) or
        returns expect (a return code)."""
        if isinstance(expect, int):
            assert call() == expect
        else:
            cls, pat = expect if isinstance(expect, tuple) else (expect, None)
            with pytest.raises(cls, match=pat):
                call()

    def refused(self, call, expect):
        """_outcome(call, expect); dst unchanged either way."""
        self.fresh()
        self._outcome(call, expect)
        self.unchanged()

    def close(self):
        self.w.close()
        self.t.close()


@pytest.fixture(scope="module")
def pair():
    p = Pair()
    try:
        yield p
    finally:
        p.close()


COVERED = set()


def covers(*names):
    def deco(f):
        COVERED.update(names)
        return f
    return deco


OOB = SIZE - 8  # a destination offset whose 16-byte span leaves dst


@covers("__init__", "initialize", "initialize_ext", "get_rpc_port")
def test_life(pair):
    e = TransferEngine()
    with pytest.raises(TypeError):
        TransferEngine(1)
    with pytest.raises(RuntimeError, match="before initialize"):
        e.get_rpc_port()
    assert e.transfer_sync_write(pair.sid, pair.s, pair.d, 8) == -1  # not initialized
    assert e.initialize(HOST, "etcd://127.0.0.1:2379", "rdma", "") == -1
    assert e.initialize(HOST, "P2PHANDSHAKE", "nvlink", "") == -1
    with pytest.raises(TypeError):
        e.initialize(1, "P2PHANDSHAKE", "rdma", "")
    assert e.initialize(f"{HOST}:12345", "P2PHANDSHAKE", "rdma", "mlx5_0") == 0
    assert 15000 <= e.get_rpc_port() <= 17000
    assert e.initialize(HOST, "P2PHANDSHAKE", "rdma", "") == -1  # twice
    e.close()
    e = TransferEngine()
    assert e.initialize_ext(HOST, "http://127.0.0.1:8080/metadata", "rdma", "", "http") == -1
    assert e.initialize_ext(HOST, "P2PHANDSHAKE", "tcp", "", "p2p") == 0
    assert 15000 <= e.get_rpc_port() <= 17000
    e.close()
    pair.unchanged()


@covers("transfer_sync_write")
def test_transfer_sync_write(pair):
    w, sid, s, d = pair.w, pair.sid, pair.s, pair.d
    assert w.transfer_sync_write(sid, s + 100, d + 4096, 3000) == 0
    pair.wrote([(100, 4096, 3000)])
    assert w.transfer_sync_write(sid, s, d, 16, transport_hint="rdma", nic_hint="mlx5_0") == 0
    pair.wrote([(0, 0, 16)])
    pair.refused(lambda: w.transfer_sync_write(sid, s, d + OOB, 16), -1)
    pair.refused(lambda: w.transfer_sync_write(sid, s + OOB, d, 16), -1)  # source
    pair.refused(lambda: w.transfer_sync_write(f"{HOST}:1", s, d, 16), -1)
    pair.refused(lambda: w.transfer_sync_write(sid, "s", d, 16), TypeError)
    pair.refused(lambda: w.transfer_sync_write(sid, s, d, -1), TypeError)
    pair.refused(lambda: w.transfer_sync_write(None, s, d, 16), TypeError)
    pair.refused(lambda: w.transfer_sync_write(sid, s, d, 16, nic_hint=0), TypeError)


@covers("batch_transfer_sync_write")
def test_batch_transfer_sync_write(pair):
    w, sid, s, d = pair.w, pair.sid, pair.s, pair.d
    so = np.arange(0, 200) * 4096 + 7
    do = (np.arange(0, 200)[::-1] * 4096) + 100
    n = np.full(200, 3000)
    assert w.batch_transfer_sync_write(sid, (s + so).tolist(), (d + do).tolist(),
                                       n.tolist()) == 0
    pair.wrote(list(zip(so.tolist(), do.tolist(), n.tolist())))
    pair.fresh()
    assert w.batch_transfer_sync_write(sid, (s + so).astype(np.uint64),
                                       (d + do).astype(np.uint64), n.astype(np.uint64)) == 0
    pair.wrote(list(zip(so.tolist(), do.tolist(), n.tolist())))
    assert w.batch_transfer_sync_write(sid, [], [], []) == 0
    pair.refused(lambda: w.batch_transfer_sync_write(sid, [s, s], [d], [8, 8]), -1)
    # one block of three leaves the target's memory: nothing of the batch lands
    pair.refused(lambda: w.batch_transfer_sync_write(sid, [s, s + 64, s], [d, d + 64, d + OOB],
                                                     [8, 8, 16]), -1)
    pair.refused(lambda: w.batch_transfer_sync_write(sid, [s], [d], [1.5]), TypeError)
    pair.refused(lambda: w.batch_transfer_sync_write(sid, "abc", [d], [8]), TypeError)


@covers("batch_transfer_async_write", "get_batch_transfer_status")
def test_batch_transfer_async_write(pair):
    w, sid, s, d = pair.w, pair.sid, pair.s, pair.d
    b1 = w.batch_transfer_async_write(sid, [s, s + 8192], [d + 20000, d + 30000], [5000, 77])
    b2 = w.batch_transfer_async_write(sid, [s + 1], [d + 50000], [10], "", "")
    assert b1 > 0 and b2 > 0 and b1 != b2
    assert w.get_batch_transfer_status([b1, b2]) == 0
    pair.wrote([(0, 20000, 5000), (8192, 30000, 77), (1, 50000, 10)])
    pair.refused(lambda: w.batch_transfer_async_write(sid, [s], [d + OOB], [16]), 0)
    pair.refused(lambda: w.batch_transfer_async_write(sid, [s, s], [d], [8]), 0)
    pair.refused(lambda: w.get_batch_transfer_status([987654321]), -1)
    pair.refused(lambda: w.get_batch_transfer_status([b1]), -1)  # freed by the first call
    pair.refused(lambda: w.batch_transfer_async_write(sid, [s], [d], ["8"]), TypeError)


@covers("transfer_submit_write", "transfer_check_status")
def test_transfer_submit_write(pair):
    w, sid, s, d = pair.w, pair.sid, pair.s, pair.d
    bid = w.transfer_submit_write(sid, s + 5, d + 60000, 4000)
    assert bid > 0
    for _ in range(3000):
        st = w.transfer_check_status(bid)
        if st != 0:
            break
        time.sleep(0.002)
    assert st == 1
    pair.wrote([(5, 60000, 4000)])
    pair.refused(lambda: w.transfer_check_status(bid), -1)  # freed once done
    pair.refused(lambda: w.transfer_check_status(987654321), -1)
    pair.refused(lambda: w.transfer_submit_write(sid, s, d + OOB, 16), 0)
    pair.refused(lambda: w.transfer_submit_write(sid, s, d, 16, nic_hint=None), TypeError)


@covers("batch_transfer_sync_write_arrays", "batch_transfer_async_write_arrays")
def test_arrays(pair):
    w, sid, s, d = pair.w, pair.sid, pair.s, pair.d
    so = np.arange(50, dtype=np.uint64) * 1000 + 3
    do = np.arange(50, dtype=np.uint64)[::-1].copy() * 1000 + 70000
    n = np.full(50, 999, np.uint64)
    assert w.batch_transfer_sync_write_arrays(sid, so + np.uint64(s), do + np.uint64(d), n) == 0
    pair.wrote(list(zip(so.tolist(), do.tolist(), n.tolist())))
    pair.fresh()
    bid = w.batch_transfer_async_write_arrays(sid, (so + np.uint64(s)).astype(np.int64),
                                              (do + np.uint64(d)).astype(np.int64),
                                              n.astype(np.int64), "", "mlx5_0")
    assert bid > 0 and w.get_batch_transfer_status([bid]) == 0
    pair.wrote(list(zip(so.tolist(), do.tolist(), n.tolist())))
    a = (so + np.uint64(s))[:10]
    b = (do + np.uint64(d))[:10]
    ln = n[:10]
    for call, code in ((w.batch_transfer_sync_write_arrays, -1),
                       (w.batch_transfer_async_write_arrays, 0)):
        pair.refused(lambda: call(sid, a, b[:9], ln), (ValueError, "same length"))
        pair.refused(lambda: call(sid, a.reshape(2, 5), b, ln), (ValueError, "one-dimensional"))
        pair.refused(lambda: call(sid, (so + np.uint64(s))[:20:2], b, ln),
                     (ValueError, "contiguous"))
        pair.refused(lambda: call(sid, a.astype(np.uint32), b, ln), (ValueError, "8-byte"))
        pair.refused(lambda: call(sid, a, b, ln.astype(np.float64)), (ValueError, "8-byte"))
        neg = a.astype(np.int64)
        neg[3] = -1
        pair.refused(lambda: call(sid, neg, b, ln), (ValueError, "negative"))
        oob = b.copy()
        oob[-1] = np.uint64(d + OOB)
        pair.refused(lambda: call(sid, a, oob, ln), code)


def _grid(pair, rows):
    """rows (src base off, src stride, dst base off, dst stride, length) -> [F, 5]"""
    return np.array([[pair.s + a, b, pair.d + c, e, n] for a, b, c, e, n in rows], np.int64)


def _apply_grid(sp, dp, rows):
    return [(a + i * b, c + j * e, n) for a, b, c, e, n in rows for i, j in zip(sp, dp)]


@covers("batch_transfer_sync_write_pages")
def test_pages(pair):
    w, sid = pair.w, pair.sid
    rows = [(0, 4096, 200000, 4096, 4096), (1 << 19, 1024, 600000, 2048, 1000)]
    sp, dp = [0, 1, 2, 9, 5], [3, 4, 5, 0, 40]
    f = _grid(pair, rows)
    assert w.batch_transfer_sync_write_pages(sid, np.array(sp, np.int64),
                                             np.array(dp, np.int64), f, 4096) == 0
    pair.wrote(_apply_grid(sp, dp, rows))
    pair.fresh()
    assert w.batch_transfer_sync_write_pages(sid, sp, dp, f.tolist(), max_batch_size=3,
                                             transport_hint="", nic_hint="") == 0
    pair.wrote(_apply_grid(sp, dp, rows))
    spa, dpa = np.array(sp, np.int64), np.array(dp, np.int64)
    wp = w.batch_transfer_sync_write_pages
    pair.refused(lambda: wp(sid, spa[:-1], dpa, f), (ValueError, "same length"))
    pair.refused(lambda: wp(sid, spa, dpa, f[:, :4].copy()), (ValueError, r"\[rows, 5\]"))
    pair.refused(lambda: wp(sid, spa, dpa, np.asfortranarray(f)), (ValueError, "C-contiguous"))
    g = f.copy()
    g[1, 4] = 0
    pair.refused(lambda: wp(sid, spa, dpa, g), (ValueError, "positive length"))
    g = f.copy()
    g[0, 3] = -1
    pair.refused(lambda: wp(sid, spa, dpa, g), (ValueError, "non-negative strides"))
    neg = spa.copy()
    neg[0] = -2
    pair.refused(lambda: wp(sid, neg, dpa, f), (ValueError, "negative"))
    pair.refused(lambda: wp(sid, spa, dpa, f, -1), (ValueError, "max_batch_size"))
    far = dpa.copy()
    far[-1] = 400  # page 400 of the 4096-stride row lies past dst
    pair.refused(lambda: wp(sid, spa, far, f), -1)
    assert wp(sid, spa[:0], dpa[:0], f) == 0  # an empty grid


@covers("transfer_sync_read", "batch_transfer_sync_read", "batch_transfer_async_read")
def test_reads(pair):
    """One-sided reads: the target's bytes into w's registered src, exact,
    neighbours untouched; bad calls change neither side."""
    w, sid, s, d = pair.w, pair.sid, pair.s, pair.d
    pair.src[:] = 0
    assert w.transfer_sync_read(sid, s + 100, d + 4096, 3000) == 0
    assert w.transfer_sync_read(sid, s + 4000, d, 1, transport_hint="", nic_hint="") == 0
    pair.read([(100, 4096, 3000), (4000, 0, 1)])
    so = np.arange(0, 200) * 4096 + 7
    do = (np.arange(0, 200)[::-1] * 4096) + 100
    n = np.full(200, 3000)
    pair.src[:] = 0
    assert w.batch_transfer_sync_read(sid, (s + so).tolist(), (d + do).tolist(), n.tolist()) == 0
    pair.read(list(zip(so.tolist(), do.tolist(), n.tolist())))
    pair.src[:] = 0
    b1 = w.batch_transfer_async_read(sid, [s, s + 8192], [d + 20000, d + 30000], [5000, 77])
    b2 = w.batch_transfer_async_read(sid, [s + 100000], [d + 1], [10], "", "")
    assert b1 > 0 and b2 > 0 and w.get_batch_transfer_status([b1, b2]) == 0
    pair.read([(0, 20000, 5000), (8192, 30000, 77), (100000, 1, 10)])
    assert w.batch_transfer_sync_read(sid, [], [], []) == 0
    rr = pair.read_refused
    rr(lambda: w.transfer_sync_read(sid, s, d + OOB, 16), -1)  # the peer's side
    rr(lambda: w.transfer_sync_read(sid, s + OOB, d, 16), -1)  # ours
    rr(lambda: w.transfer_sync_read(f"{HOST}:1", s, d, 16), -1)
    rr(lambda: w.batch_transfer_sync_read(sid, [s, s], [d], [8, 8]), -1)
    rr(lambda: w.batch_transfer_sync_read(sid, [s, s + 64], [d, d + OOB], [8, 16]), -1)
    rr(lambda: w.batch_transfer_async_read(sid, [s], [d + OOB], [16]), 0)
    rr(lambda: w.batch_transfer_async_read(sid, [s, s], [d], [8]), 0)
    rr(lambda: w.batch_transfer_sync_read(sid, [s], [d], [1.5]), TypeError)
    rr(lambda: w.transfer_sync_read(sid, s, d, 16, nic_hint=None), TypeError)


@covers("batch_transfer_sync_read_arrays", "batch_transfer_async_read_arrays")
def test_read_arrays(pair):
    w, sid, s, d = pair.w, pair.sid, pair.s, pair.d
    so = np.arange(50, dtype=np.uint64) * 1000 + 3
    do = np.arange(50, dtype=np.uint64)[::-1].copy() * 1000 + 70000
    n = np.full(50, 999, np.uint64)
    pair.src[:] = 0
    assert w.batch_transfer_sync_read_arrays(sid, so + np.uint64(s), do + np.uint64(d), n) == 0
    pair.read(list(zip(so.tolist(), do.tolist(), n.tolist())))
    pair.src[:] = 0
    bid = w.batch_transfer_async_read_arrays(sid, (so + np.uint64(s)).astype(np.int64),
                                             (do + np.uint64(d)).astype(np.int64),
                                             n.astype(np.int64), "", "mlx5_0")
    assert bid > 0 and w.get_batch_transfer_status([bid]) == 0
    pair.read(list(zip(so.tolist(), do.tolist(), n.tolist())))
    a, b, ln = (so + np.uint64(s))[:10], (do + np.uint64(d))[:10], n[:10]
    for call, code in ((w.batch_transfer_sync_read_arrays, -1),
                       (w.batch_transfer_async_read_arrays, 0)):
        pair.read_refused(lambda: call(sid, a, b[:9], ln), (ValueError, "same length"))
        pair.read_refused(lambda: call(sid, a.astype(np.uint32), b, ln), (ValueError, "8-byte"))
        neg = b.astype(np.int64)
        neg[3] = -1
        pair.read_refused(lambda: call(sid, a, neg, ln), (ValueError, "negative"))
        oob = b.copy()
        oob[-1] = np.uint64(d + OOB)
        pair.read_refused(lambda: call(sid, a, oob, ln), code)


@covers("batch_transfer_sync_read_pages")
def test_read_pages(pair):
    """src columns local, dst columns the peer's: span (f, i) reads the
    peer's dst_base + dst_pages[i] * dst_stride into src_base + src_pages[i]
    * src_stride."""
    w, sid = pair.w, pair.sid
    rows = [(0, 4096, 200000, 4096, 4096), (1 << 19, 1024, 600000, 2048, 1000)]
    sp, dp = [0, 1, 2, 9, 5], [3, 4, 5, 0, 40]
    f = _grid(pair, rows)
    pair.src[:] = 0
    assert w.batch_transfer_sync_read_pages(sid, np.array(sp, np.int64),
                                            np.array(dp, np.int64), f, 4096) == 0
    pair.read(_apply_grid(sp, dp, rows))
    pair.src[:] = 0
    assert w.batch_transfer_sync_read_pages(sid, sp, dp, f.tolist(), max_batch_size=3,
                                            transport_hint="", nic_hint="") == 0
    pair.read(_apply_grid(sp, dp, rows))
    spa, dpa = np.array(sp, np.int64), np.array(dp, np.int64)
    rp = w.batch_transfer_sync_read_pages
    pair.read_refused(lambda: rp(sid, spa[:-1], dpa, f), (ValueError, "same length"))
    g = f.copy()
    g[1, 4] = 0
    pair.read_refused(lambda: rp(sid, spa, dpa, g), (ValueError, "positive length"))
    far = dpa.copy()
    far[-1] = 400  # page 400 of the 4096-stride row lies past the peer's dst
    pair.read_refused(lambda: rp(sid, spa, far, f), -1)
    assert rp(sid, spa[:0], dpa[:0], f) == 0  # an empty grid


@covers("transfer_sync", "batch_transfer_sync", "batch_transfer_async", "get_notifies")
def test_opcode_calls(pair):
    w, sid, s, d = pair.w, pair.sid, pair.s, pair.d
    assert w.transfer_sync(sid, s + 11, d + 700000, 100, TransferOpcode.Write) == 0
    assert w.batch_transfer_sync(sid, [s + 12], [d + 700200], [100], me.Write, None) == 0
    bid = w.batch_transfer_async(sid, [s + 13], [d + 700400], [100], TransferOpcode.Write,
                                 transport_hint="", nic_hint="")
    assert bid > 0 and w.get_batch_transfer_status([bid]) == 0
    pair.wrote([(11, 700000, 100), (12, 700200, 100), (13, 700400, 100)])
    # READ: one-sided reads of the peer's memory into the local buffer
    pair.src[:] = 0
    assert w.transfer_sync(sid, s + 50, d + 700000, 100, TransferOpcode.Read) == 0
    assert w.batch_transfer_sync(sid, [s + 300], [d + 700200], [100], me.Read, None) == 0
    bid = w.batch_transfer_async(sid, [s + 600], [d + 700400], [100], me.Read)
    assert bid > 0 and w.get_batch_transfer_status([bid]) == 0
    pair.read([(50, 700000, 100), (300, 700200, 100), (600, 700400, 100)])
    pair.read_refused(lambda: w.transfer_sync(sid, s, d + OOB, 16, me.Read), -1)
    pair.read_refused(lambda: w.batch_transfer_async(sid, [s], [d + OOB], [16], me.Read), 0)
    # with a notify: the transfer, then the notification at the target
    pair.src[:] = 0
    assert w.batch_transfer_sync(sid, [s + 900], [d + 700600], [8], me.Read,
                                 TransferNotify("n", "m")) == 0
    pair.read([(900, 700600, 8)])
    assert w.transfer_sync(sid, s + 64, d + 700800, 8, me.Write, TransferNotify("n", "m")) == 0
    assert w.batch_transfer_sync(sid, [s + 96], [d + 700900], [8], me.Write,
                                 TransferNotify("n2", "m2")) == 0
    pair.wrote([(64, 700800, 8), (96, 700900, 8)])
    got, t0 = [], time.monotonic()
    while len(got) < 3 and time.monotonic() - t0 < 10:
        got += pair.t.get_notifies()
    assert [(x.name, x.msg) for x in got] == [("n", "m"), ("n", "m"), ("n2", "m2")]
    pair.refused(lambda: w.transfer_sync(sid, s, d, 8, 7), ValueError)
    pair.refused(lambda: w.batch_transfer_sync(sid, [s], [d], [8], "write"), TypeError)
    pair.refused(lambda: w.transfer_sync(sid, s, d + OOB, 16, me.Write), -1)
    pair.refused(lambda: w.batch_transfer_async(sid, [s], [d + OOB], [16], me.Write), 0)


@covers("allocate_managed_buffer", "free_managed_buffer")
def test_managed_buffer(pair):
    w, t, sid, s = pair.w, pair.t, pair.sid, pair.s
    addr = t.allocate_managed_buffer(8192)
    assert addr != 0
    assert w.transfer_sync_write(sid, s + 77, addr + 100, 5000) == 0
    assert ctypes.string_at(addr + 100, 5000) == pair.src[77:5077].tobytes()
    pair.bytes_checked += 5000
    assert t.free_managed_buffer(addr, 8192) == 0
    pair.refused(lambda: t.free_managed_buffer(addr, 8192), -1)
    pair.refused(lambda: t.allocate_managed_buffer(-5), TypeError)
    assert TransferEngine().allocate_managed_buffer(4096) == 0  # before initialize


@covers("write_bytes_to_buffer", "read_bytes_from_buffer")
def test_local_bytes(pair):
    t, d = pair.t, pair.d
    assert t.write_bytes_to_buffer(d + 800000, b"kvbridge!", 8) == 0
    assert t.write_bytes_to_buffer(d + 800008, "str", 3) == 0  # 0.3.14: a str too
    pair.img[800000:800011] = np.frombuffer(b"kvbridgestr", np.uint8)
    pair.unchanged()
    assert t.read_bytes_from_buffer(d + 800000, 11) == b"kvbridgestr"
    pair.refused(lambda: t.write_bytes_to_buffer(d, b"abc", 4), ValueError)
    pair.refused(lambda: t.write_bytes_to_buffer(-1, b"abc", 3), TypeError)
    pair.refused(lambda: t.read_bytes_from_buffer(d, -1), TypeError)


@covers("register_memory", "unregister_memory", "batch_register_memory",
        "batch_unregister_memory")
def test_registration(pair):
    w, sid = pair.w, pair.sid
    extra = np.random.default_rng(5).integers(0, 256, 3 * 4096, dtype=np.uint8)
    a = extra.ctypes.data
    assert w.register_memory(a, 4096) == 0
    assert w.register_memory(a + 4096, 4096, "cpu:0", False) == 0  # a local-only source
    assert w.register_memory(a + 8192, 4096, location="*", remote_accessible=True) == 0
    for k in range(3):  # all three are write sources
        assert w.transfer_sync_write(sid, a + k * 4096, pair.d + 900000 + k * 4096, 4096) == 0
    pair.img[900000:900000 + 3 * 4096] = extra
    pair.unchanged()
    pair.bytes_checked += 3 * 4096
    pair.refused(lambda: w.register_memory(a + 10, 10), -7)  # overlap
    pair.refused(lambda: w.register_memory(a + 3 * 4096, 0), -1)  # empty
    pair.refused(lambda: w.register_memory(a, 4096, "*", "yes"), TypeError)
    pair.refused(lambda: w.register_memory(a, 4096, 5), TypeError)
    assert w.unregister_memory(a) == 0
    assert w.unregister_memory(a + 4096) == 0
    assert w.unregister_memory(a + 8192) == 0
    pair.refused(lambda: w.unregister_memory(a), -3)
    pair.refused(lambda: w.transfer_sync_write(sid, a, pair.d, 16), -1)  # source unregistered
    assert w.batch_register_memory([a, a + 8192], [4096, 4096]) == 0
    pair.refused(lambda: w.batch_register_memory([a + 4096], [4096, 1]), -1)
    pair.refused(lambda: w.batch_register_memory([a + 4096, a + 100], [100, 100]), -7)
    assert w.register_memory(a + 4096, 4096) == 0  # the refused batch left nothing behind
    assert w.batch_unregister_memory([a, a + 4096, a + 8192]) == 0
    pair.refused(lambda: w.batch_unregister_memory([a]), -3)
    assert w.batch_register_memory([], []) == 0 and w.batch_unregister_memory([]) == 0


@covers("get_local_topology", "warmup_efa_segment", "send_probe")
def test_helpers(pair):
    w = pair.w
    assert w.get_local_topology() == "{}" and w.get_local_topology("mlx5_0") == "{}"
    assert w.warmup_efa_segment(pair.sid) == 0
    assert w.send_probe(pair.sid) == 0
    pair.refused(lambda: w.send_probe(f"{HOST}:1"), -102)
    pair.refused(lambda: w.send_probe(None), TypeError)
    assert TransferEngine().send_probe(pair.sid) == -1  # before initialize


@covers("submit_scatter_write", "scatter_transfer_sync_write_with_ticket")
def test_scatter_writes(pair):
    """Tickets of both forms: COMPLETED and drained with exact bytes; a
    malformed call raises (nothing written); a fragment past what the peer
    registered gives FAILED_DRAINED, nothing written
    (tests/python/test_mooncake_scatter.py covers the stopped peer)."""
    w, sid, s, d = pair.w, pair.sid, pair.s, pair.d
    S = me.ScatterTransferCompletionStatus
    pair.fresh()
    t = w.submit_scatter_write(sid, [s + 100, s + 9000], [4096, 4096], [d + 950000, d + 960000],
                               [8192, 4096], [[0, 50], [7]], [[10, 5000], [0]], [[20, 30], [4000]])
    assert t.drain(10000) == S.COMPLETED and t.drained
    pair.wrote([(100, 950010, 20), (150, 955000, 30), (9007, 960000, 4000)])
    t = w.scatter_transfer_sync_write_with_ticket(sid, [s], [64], [d + 970000], [64], [[0]],
                                                  [[0]], [[64]])
    assert t.status == S.COMPLETED and t.drained
    pair.wrote([(0, 970000, 64)])
    pair.refused(lambda: w.submit_scatter_write(sid, [s], [64], [d], [64], [[0]], [[60]],
                                                [[8]]),
                 (ValueError, "invalid scatter transfer fragment"))
    pair.refused(lambda: w.scatter_transfer_sync_write_with_ticket(sid, [s], [64], [d], [64],
                                                                   [[0]], [[0]]),
                 TypeError)
    pair.fresh()
    t = w.submit_scatter_write(sid, [s], [64], [d + OOB], [64], [[0]], [[0]], [[16]])
    assert t.status == S.FAILED_DRAINED and t.drained and "peer registered" in t.error
    pair.unchanged()


@covers("submit_scatter_read", "scatter_transfer_sync_read_with_ticket")
def test_scatter_reads(pair):
    """Scatter reads: the target's fragments into w's registered src, exact,
    COMPLETED and drained; a fragment past what the peer registered:
    FAILED_DRAINED, nothing read; malformed calls raise, nothing read."""
    w, sid, s, d = pair.w, pair.sid, pair.s, pair.d
    S = me.ScatterTransferCompletionStatus
    pair.src[:] = 0
    t = w.submit_scatter_read(sid, [s + 100, s + 9000], [4096, 4096], [d + 4096, d + 500000],
                              [8192, 4096], [[0, 50], [7]], [[10, 5000], [0]],
                              [[20, 30], [4000]])
    assert t.drain(10000) == S.COMPLETED and t.drained
    t = w.scatter_transfer_sync_read_with_ticket(sid, [s + 20000], [64], [d + 70000], [64],
                                                 [[0]], [[0]], [[64]])
    assert t.status == S.COMPLETED and t.drained
    pair.read([(100, 4106, 20), (150, 9096, 30), (9007, 500000, 4000), (20000, 70000, 64)])
    rr = pair.read_refused
    rr(lambda: w.submit_scatter_read(sid, [s], [64], [d + OOB], [64], [[0]], [[0]],
                                     [[16]]).status, S.FAILED_DRAINED)
    rr(lambda: w.submit_scatter_read(sid, [s], [64], [d], [64], [[60]], [[0]], [[8]]),
       (ValueError, "invalid scatter transfer fragment"))
    rr(lambda: w.scatter_transfer_sync_read_with_ticket(sid, [s], [64], [d], [64], [[0]],
                                                        [[0]]), TypeError)


@covers("get_first_buffer_address")
def test_first_buffer_address():
    """A fresh pair (each engine holds one region): the target's region from
    the writer, and each engine's own; 0 for a segment nobody serves; a str
    is required (test_mooncake_names.py: another process, host names,
    several regions)."""
    p = Pair()
    try:
        assert p.w.get_first_buffer_address(p.sid) == p.d
        assert p.t.get_first_buffer_address(p.sid) == p.d
        assert p.w.get_first_buffer_address(f"{HOST}:{p.w.get_rpc_port()}") == p.s
        assert p.w.get_first_buffer_address(f"{HOST}:1") == 0
        p.refused(lambda: p.w.get_first_buffer_address(1), TypeError)
    finally:
        p.close()


def _not_implemented_calls(pair):
    s, d, sid = pair.s, pair.d, pair.sid
    return {
        "transfer_write_on_cuda": (sid, s, d, 8, 0),
        "transfer_read_on_cuda": (sid, s, d, 8),
        "batch_transfer_write_on_cuda": (sid, [s], [d], [8], 0, "", ""),
        "batch_transfer_read_on_cuda": (sid, [s], [d], [8]),
        "get_engine": (),
        "get_engine_ptr": (),
    }


@covers(*NOT_IMPLEMENTED)
def test_not_implemented(pair):
    calls = _not_implemented_calls(pair)
    assert set(calls) == set(NOT_IMPLEMENTED)
    raised = set()
    for name in sorted(TE):
        if name == "__init__" or name not in calls:
            continue
        pair.refused(lambda: getattr(pair.w, name)(*calls[name]),
                     (NotImplementedError, rf"TransferEngine\.{name}: .*"
                                           rf"{NOT_IMPLEMENTED[name]}"))
        raised.add(name)
    assert raised == set(NOT_IMPLEMENTED)


def test_every_method_is_exercised(pair):
    """Every method of the stub has a behaviour test above (a new stub
    method needs one). With the whole file run, the byte count of the
    good writes checked so far is printed (pytest -s)."""
    assert COVERED == set(TE), sorted(set(TE) ^ COVERED)
    print(f"\n{len(COVERED)} methods exercised, {pair.bytes_checked} written bytes checked "
          f"in this process's target")


# ------------------------------------------------------------------ other process

def test_writes_into_another_process():
    """The sync, arrays and pages writes into a target process, byte-exact
    (digests); bad calls leave it unchanged."""
    from test_mooncake_compat import SIZES, Target, sha

    tgt = Target()
    w = TransferEngine()
    try:
        assert w.initialize(HOST, "P2PHANDSHAKE", "rdma", "") == 0
        src = np.random.default_rng(9).integers(0, 256, 1 << 20, dtype=np.uint8)
        s = src.ctypes.data
        assert w.register_memory(s, src.nbytes) == 0
        img = [np.zeros(n, np.uint8) for n in SIZES]
        t0, t1 = tgt.addrs[0], tgt.addrs[1]
        assert w.transfer_sync_write(tgt.sid, s + 3, t0 + 10, 70000) == 0
        img[0][10:70010] = src[3:70003]
        so = np.arange(64, dtype=np.uint64) * 512
        do = np.arange(64, dtype=np.uint64)[::-1].copy() * 1024
        assert w.batch_transfer_sync_write_arrays(tgt.sid, so + np.uint64(s),
                                                  do + np.uint64(t1),
                                                  np.full(64, 300, np.uint64)) == 0
        for a, b in zip(so.tolist(), do.tolist()):
            img[1][b:b + 300] = src[a:a + 300]
        f = np.array([[s + 4096, 4096, t0 + (512 << 10), 8192, 4000]], np.int64)
        sp, dp = np.array([0, 5, 2], np.int64), np.array([1, 0, 30], np.int64)
        assert w.batch_transfer_sync_write_pages(tgt.sid, sp, dp, f, 2) == 0
        for a, b in zip(sp.tolist(), dp.tolist()):
            o = (512 << 10) + b * 8192
            img[0][o:o + 4000] = src[4096 + a * 4096:4096 + a * 4096 + 4000]
        want = [sha(i) for i in img]
        assert tgt.digests() == want
        src[:] = 0xAB  # any later write would show
        assert w.transfer_sync_write(tgt.sid, s, t0 + SIZES[0] - 8, 16) == -1
        assert w.batch_transfer_sync_write(tgt.sid, [s, s], [t1, t1 + SIZES[1]], [8, 8]) == -1
        far = dp.copy()
        far[0] = 64  # page 64 of the 8192 stride passes the 1 MiB buffer
        assert w.batch_transfer_sync_write_pages(tgt.sid, sp, far, f, 2) == -1
        assert tgt.digests() == want
        # one-sided reads of the target process's memory, byte-exact
        got = np.zeros(1 << 20, np.uint8)
        assert w.register_memory(got.ctypes.data, got.nbytes) == 0
        g = got.ctypes.data
        assert w.transfer_sync_read(tgt.sid, g + 5, t0 + 10, 70000) == 0
        assert w.batch_transfer_sync_read(tgt.sid, [g + 100000, g + 200000], [t1, t1 + 1000],
                                          [300, 300]) == 0
        assert w.batch_transfer_sync_read_pages(tgt.sid, sp, dp,
                                                np.array([[g + 300000, 4096,
                                                           t0 + (512 << 10), 8192, 4000]],
                                                         np.int64), 2) == 0
        assert np.array_equal(got[5:70005], img[0][10:70010])
        assert np.array_equal(got[100000:100300], img[1][0:300])
        assert np.array_equal(got[200000:200300], img[1][1000:1300])
        for a, b in zip(sp.tolist(), dp.tolist()):
            o = (512 << 10) + b * 8192
            assert np.array_equal(got[300000 + a * 4096:300000 + a * 4096 + 4000],
                                  img[0][o:o + 4000])
        assert w.transfer_sync_read(tgt.sid, g, t0 + SIZES[0] - 8, 16) == -1
    finally:
        w.close()
        tgt.close()
