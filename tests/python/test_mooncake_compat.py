"""The `mooncake.engine` drop-in (python/compat/mooncake) driven the way
SGLang's Mooncake backend, vLLM's MooncakeConnector and TokenSpeed drive
Mooncake's TransferEngine, between two processes.

- a target process (this file run as `target`) creates a drop-in engine
  (initialize(P2PHANDSHAKE), get_rpc_port), registers three numpy buffers
  (register_memory, batch_register_memory) and answers digests of them;
- the test process is the writer: transfer_sync_write,
  batch_transfer_sync_write (4096 scattered blocks, lists and numpy arrays),
  batch_transfer_async_write + get_batch_transfer_status,
  transfer_submit_write + transfer_check_status, transfer_sync /
  batch_transfer_sync / batch_transfer_async with TransferOpcode.Write; the
  target's buffers must equal the image the writer expects, byte for byte;
- bad calls return Mooncake's values: lists of different lengths (-1 / batch
  id 0), an address the target never registered or unregistered, an
  unregistered source, an unknown target, double registration (-7),
  unregistering an unknown address (-3), unknown batch ids (-1);
- a killed target: writes return -1 (batch id 0 or status -1) within a
  bound, send_probe -102; a stopped target over tcp: -1 within
  MC_TRANSFER_TIMEOUT plus the engine's settle bound, and an asynchronous
  batch past its deadline reports -2 and stays known;
- what kvbridge cannot do raises NotImplementedError naming the method.
"""

import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
PYDIR = os.path.join(os.path.dirname(os.path.dirname(HERE)), "python")
COMPAT = os.path.join(PYDIR, "compat")
for d in (COMPAT, PYDIR):
    if d not in sys.path:
        sys.path.insert(0, d)

import mooncake  # noqa: E402
import mooncake.engine as me  # noqa: E402
from mooncake.engine import TransferEngine, TransferNotify, TransferOpcode  # noqa: E402
from kvb_testutil import stop_process  # noqa: E402

SIZES = [1 << 20, 256 << 10, 64 << 10]  # the target's three buffers
HOST = "127.0.0.1"


# ------------------------------------------------------------------ target

def target_main(protocol):
    eng = TransferEngine()
    rc = eng.initialize(HOST, "P2PHANDSHAKE", protocol, "")
    bufs = [np.zeros(n, np.uint8) for n in SIZES]
    r1 = eng.register_memory(bufs[0].ctypes.data, bufs[0].nbytes)
    r2 = eng.batch_register_memory([b.ctypes.data for b in bufs[1:]],
                                   [b.nbytes for b in bufs[1:]])
    out = {"rc": rc, "port": eng.get_rpc_port(), "regs": [r1, r2],
           "addrs": [b.ctypes.data for b in bufs]}
    print(json.dumps(out), flush=True)
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["op"] == "digest":
            rep = {"sha": [hashlib.sha256(b.tobytes()).hexdigest() for b in bufs]}
        elif cmd["op"] == "unregister":
            rep = {"rc": eng.unregister_memory(bufs[cmd["i"]].ctypes.data)}
        elif cmd["op"] == "batch_unregister":
            rep = {"rc": eng.batch_unregister_memory([bufs[i].ctypes.data for i in cmd["i"]])}
        else:
            break
        print(json.dumps(rep), flush=True)


class Target:
    """The target child: .sid ("ip:port"), .addrs, .call(op, **kw)."""

    def __init__(self, protocol="rdma", env=None):
        e = dict(os.environ)
        e.update(env or {})
        e["PYTHONPATH"] = os.pathsep.join([COMPAT, PYDIR, e.get("PYTHONPATH", "")])
        self.p = subprocess.Popen([sys.executable, __file__, "target", protocol],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=e,
                                  text=True)
        hello = self._read(30)
        assert hello["rc"] == 0 and hello["regs"] == [0, 0], hello
        self.port = hello["port"]
        self.sid = f"{HOST}:{self.port}"
        self.addrs = hello["addrs"]

    def _read(self, timeout):
        box = []
        t = threading.Thread(target=lambda: box.append(self.p.stdout.readline()), daemon=True)
        t.start()
        t.join(timeout)
        assert box and box[0], f"target said nothing within {timeout} s"
        return json.loads(box[0])

    def call(self, op, **kw):
        self.p.stdin.write(json.dumps(dict(op=op, **kw)) + "\n")
        self.p.stdin.flush()
        return self._read(30)

    def digests(self):
        return self.call("digest")["sha"]

    def close(self):
        if self.p.poll() is None:
            try:
                os.kill(self.p.pid, signal.SIGCONT)
            except OSError:
                pass
            self.p.kill()
        self.p.wait(10)


@pytest.fixture
def target():
    t = Target()
    try:
        yield t
    finally:
        t.close()


def sha(a):
    return hashlib.sha256(a.tobytes()).hexdigest()


def writer(protocol="rdma"):
    eng = TransferEngine()
    assert eng.initialize(HOST, "P2PHANDSHAKE", protocol, "") == 0
    src = np.random.default_rng(7).integers(0, 256, 4 << 20, dtype=np.uint8)
    assert eng.register_memory(src.ctypes.data, src.nbytes, "cpu:0") == 0
    return eng, src


# ------------------------------------------------------------------ tests

def test_module_surface():
    assert mooncake.KVBRIDGE_DROP_IN is True
    assert int(TransferOpcode.Read) == 0 and int(TransferOpcode.Write) == 1
    assert me.Read == 0 and me.Write == 1 and TransferEngine.TransferOpcode is TransferOpcode
    n = TransferNotify("a", "b")
    assert (n.name, n.msg) == ("a", "b")
    n.msg = "c"
    assert TransferNotify().name == "" and n.msg == "c"
    for f in ("SUPPORT_CUDA", "SUPPORT_EFA", "SUPPORT_HIP", "SUPPORT_MNNVL", "SUPPORT_MUSA",
              "SUPPORT_INTRA_NVLINK"):
        assert getattr(me, f) is False
    with pytest.raises(TypeError):
        me.InnerTransferEngine()
    c = me.create_rpc_client()  # the RPC helpers: test_mooncake_names.py
    assert isinstance(c, me.RpcInterface)
    c.close()


def test_initialize_and_ports(monkeypatch):
    e = TransferEngine()
    with pytest.raises(RuntimeError, match="get_rpc_port"):
        e.get_rpc_port()
    assert e.batch_transfer_sync_write("x:1", [1], [1], [1]) == -1  # before initialize
    monkeypatch.setenv("MC_MIN_RPC_PORT", "16100")
    monkeypatch.setenv("MC_MAX_RPC_PORT", "16199")
    assert e.initialize(HOST, "P2PHANDSHAKE", "rdma", "") == 0
    assert 16100 <= e.get_rpc_port() <= 16199
    assert e.initialize(HOST, "P2PHANDSHAKE", "rdma", "") == -1  # twice
    e.close()
    monkeypatch.delenv("MC_MIN_RPC_PORT")
    monkeypatch.delenv("MC_MAX_RPC_PORT")
    e = TransferEngine()  # the port in local_hostname is ignored (P2P mode)
    assert e.initialize(f"{HOST}:1", "P2PHANDSHAKE", "tcp", "") == 0
    assert 15000 <= e.get_rpc_port() <= 17000
    e.close()
    monkeypatch.setenv("MC_FORCE_TCP", "")  # set at all = on, as in Mooncake
    e = TransferEngine()
    assert e.initialize(HOST, "P2PHANDSHAKE", "rdma", "") == 0
    assert e._eng.transport == "tcp"
    e.close()
    monkeypatch.delenv("MC_FORCE_TCP")
    assert [me._parse_host(h) for h in ("10.0.0.1", "10.0.0.1:17", "[::1]:80", "::1",
                                        "10.0.0.2:1234:npu_3")] == \
        ["10.0.0.1", "10.0.0.1", "::1", "::1", "10.0.0.2"]
    for meta, proto in [("etcd://127.0.0.1:2379", "rdma"), ("127.0.0.1:2379", "rdma"),
                        ("P2PHANDSHAKE", "nvlink"), ("P2PHANDSHAKE", "xgmi")]:
        assert TransferEngine().initialize(HOST, meta, proto, "") == -1, (meta, proto)


def test_writes_land_exactly(target):
    eng, src = writer()
    try:
        _writes(eng, src, target)
    finally:
        eng.close()


def _writes(eng, src, target):
    img = [np.zeros(n, np.uint8) for n in SIZES]
    s0 = src.ctypes.data
    a0, a1, a2 = target.addrs

    # transfer_sync_write: one block
    assert eng.transfer_sync_write(target.sid, s0 + 5, a0 + 100, 3000) == 0
    img[0][100:3100] = src[5:3005]

    # batch_transfer_sync_write: 4096 scattered blocks of 1..200 bytes into
    # buffer 0, as SGLang passes them (plain lists of ints)
    rng = np.random.default_rng(1)
    n = 4096
    slots = rng.permutation(4096)[:n]  # 256-byte slots of buffer 0
    lens = rng.integers(1, 201, n)
    soff = rng.integers(0, src.nbytes - 256, n)
    dst_off = 4096 + slots * 200
    assert eng.batch_transfer_sync_write(
        target.sid, [s0 + int(x) for x in soff], [a0 + int(x) for x in dst_off],
        [int(x) for x in lens]) == 0
    for so, do, ln in zip(soff, dst_off, lens):
        img[0][do:do + ln] = src[so:so + ln]

    # the same call with numpy arrays, into buffer 1
    offs = np.arange(0, 64 * 1024, 1024, dtype=np.uint64)
    assert eng.batch_transfer_sync_write(
        target.sid, s0 + 1_000_000 + offs, np.uint64(a1) + offs,
        np.full(offs.size, 512, np.int64)) == 0
    for o in offs.astype(int):
        img[1][o:o + 512] = src[1_000_000 + o:1_000_000 + o + 512]

    # batch_transfer_async_write + get_batch_transfer_status (three batches)
    ids = []
    for k in range(3):
        base = 200_000 + k * 20_000
        ids.append(eng.batch_transfer_async_write(
            target.sid, [s0 + 2_000_000 + base + j * 100 for j in range(100)],
            [a1 + base + j * 100 for j in range(100)], [100] * 100))
        img[1][base:base + 10_000] = src[2_000_000 + base:2_000_000 + base + 10_000]
    assert all(i > 0 for i in ids) and len(set(ids)) == 3
    assert eng.get_batch_transfer_status(ids) == 0
    assert eng.transfer_check_status(ids[0]) == -1  # freed by get_batch_transfer_status

    # transfer_submit_write + transfer_check_status (TokenSpeed's pattern)
    bid = eng.transfer_submit_write(target.sid, s0 + 3_000_000, a2, 65536)
    img[2][:] = src[3_000_000:3_000_000 + 65536]
    assert bid > 0
    deadline = time.monotonic() + 20
    st = 0
    while st == 0 and time.monotonic() < deadline:
        st = eng.transfer_check_status(bid)
        time.sleep(0.001)
    assert st == 1
    assert eng.transfer_check_status(bid) == -1  # freed once it reported done

    # the opcode forms
    assert eng.transfer_sync(target.sid, s0 + 7, a0 + 900_000, 1000, TransferOpcode.Write) == 0
    img[0][900_000:901_000] = src[7:1007]
    assert eng.batch_transfer_sync(target.sid, [s0 + 9, s0 + 11], [a0 + 950_000, a0 + 960_000],
                                   [10, 20], me.Write, None, "") == 0
    img[0][950_000:950_010] = src[9:19]
    img[0][960_000:960_020] = src[11:31]
    bid = eng.batch_transfer_async(target.sid, [s0], [a0 + 1_000_000], [48_000],
                                   TransferOpcode.Write)
    img[0][1_000_000:1_048_000] = src[:48_000]
    assert bid > 0 and eng.get_batch_transfer_status([bid]) == 0
    # empty batches: nothing to do
    assert eng.batch_transfer_sync_write(target.sid, [], [], []) == 0
    assert eng.get_batch_transfer_status([]) == 0

    assert target.digests() == [sha(i) for i in img]
    assert eng.send_probe(target.sid) == 0


def test_ipv6_session():
    """initialize("[::1]:port") listens on ::1; peers use "[::1]:rpc_port"."""
    t, w = TransferEngine(), TransferEngine()
    try:
        if t.initialize("[::1]:5", "P2PHANDSHAKE", "rdma", "") != 0:
            pytest.skip("no IPv6 loopback")
        assert w.initialize("::1", "P2PHANDSHAKE", "rdma", "") == 0
        d = np.zeros(4096, np.uint8)
        src = np.random.default_rng(2).integers(0, 256, 4096, dtype=np.uint8)
        assert t.register_memory(d.ctypes.data, 4096) == 0
        assert w.register_memory(src.ctypes.data, 4096) == 0
        sid = f"[::1]:{t.get_rpc_port()}"
        assert w.transfer_sync_write(sid, src.ctypes.data, d.ctypes.data, 4096) == 0
        assert (d == src).all() and w.send_probe(sid) == 0
    finally:
        w.close()
        t.close()


def test_concurrent_writers(target):
    """SGLang drives one engine from a pool of transfer threads: 8 threads ×
    20 batches at once, every byte checked."""
    eng, src = writer()
    img = np.zeros(SIZES[0], np.uint8)
    s0, a0 = src.ctypes.data, target.addrs[0]
    rcs = []

    def run(k):
        for j in range(20):
            base = (k * 20 + j) * 6000  # 160 slices of 6000 bytes, 50 blocks each
            rcs.append(eng.batch_transfer_sync_write(
                target.sid, [s0 + base * 2 + i * 120 for i in range(50)],
                [a0 + base + i * 120 for i in range(50)], [120] * 50))
    try:
        ths = [threading.Thread(target=run, args=(k,)) for k in range(8)]
        for t in ths:
            t.start()
        for t in ths:
            t.join(60)
        assert rcs == [0] * 160
        for s in range(160):
            for i in range(50):
                d = s * 6000 + i * 120
                img[d:d + 120] = src[s * 12000 + i * 120:s * 12000 + i * 120 + 120]
        assert target.digests()[0] == sha(img)
    finally:
        eng.close()


def test_bad_calls(target):
    eng, src = writer()
    s0 = src.ctypes.data
    a0, a1, _ = target.addrs
    try:
        # lists of different lengths
        assert eng.batch_transfer_sync_write(target.sid, [s0, s0], [a0], [1, 1]) == -1
        assert eng.batch_transfer_async_write(target.sid, [s0], [a0], [1, 1]) == 0
        # outside what the target registered (end of buffer 0 + 1)
        assert eng.transfer_sync_write(target.sid, s0, a0 + SIZES[0] - 10, 11) == -1
        assert eng.transfer_submit_write(target.sid, s0, a0 - 4096, 16) == 0
        # a source this engine never registered
        other = np.ones(4096, np.uint8)
        assert eng.transfer_sync_write(target.sid, other.ctypes.data, a0, 16) == -1
        # an unknown target (a port nobody listens on)
        assert eng.transfer_sync_write(f"{HOST}:1", s0, a0, 16) == -1
        assert eng.batch_transfer_async_write(f"{HOST}:1", [s0], [a0], [16]) == 0
        assert eng.send_probe(f"{HOST}:1") == -102
        # registration: double, overlapping, zero length, unknown unregister
        assert eng.register_memory(s0, src.nbytes) == -7
        assert eng.register_memory(s0 + 100, 10) == -7
        assert eng.register_memory(other.ctypes.data, 0) == -1
        # device memory: this build moves host memory only (ERR_NOT_IMPLEMENTED)
        assert eng.register_memory(other.ctypes.data, 4096, "cuda:0") == -303
        assert eng.batch_register_memory([other.ctypes.data], [4096], "cuda:0") == -303
        assert eng.unregister_memory(other.ctypes.data) == -3
        assert eng.batch_register_memory([other.ctypes.data], [4096, 1]) == -1
        # all or nothing: the second region overlaps the first one
        assert eng.batch_register_memory([other.ctypes.data, other.ctypes.data + 100],
                                         [4096, 100]) == -7
        assert eng.register_memory(other.ctypes.data, 4096) == 0
        assert eng.batch_unregister_memory([other.ctypes.data, other.ctypes.data + 1]) == -3
        assert eng.unregister_memory(other.ctypes.data) == -3  # the batch freed it
        # unknown batch ids
        assert eng.transfer_check_status(123456) == -1
        assert eng.get_batch_transfer_status([123456]) == -1
        # types pybind11 would refuse
        with pytest.raises(TypeError):
            eng.batch_transfer_sync_write(target.sid, [1.5], [a0], [1])
        with pytest.raises(TypeError):
            eng.batch_transfer_sync_write(target.sid, [-1], [a0], [1])
        with pytest.raises(TypeError):
            eng.transfer_sync_write(None, s0, a0, 1)
        # memory the target unregistered is no longer writable; the rest is
        assert eng.transfer_sync_write(target.sid, s0, a1, 16) == 0
        assert target.call("unregister", i=1)["rc"] == 0
        assert target.call("unregister", i=1)["rc"] == -3
        assert eng.transfer_sync_write(target.sid, s0, a1, 16) == -1
        assert eng.transfer_sync_write(target.sid, s0, a0, 16) == 0
        assert target.call("batch_unregister", i=[0, 2])["rc"] == 0
        assert eng.transfer_sync_write(target.sid, s0, a0, 16) == -1
        # nothing of the failed calls reached the target: buffer 2 is still zero
        assert target.digests()[2] == sha(np.zeros(SIZES[2], np.uint8))
    finally:
        eng.close()


def test_not_implemented():
    e = TransferEngine()
    assert e.initialize(HOST, "P2PHANDSHAKE", "rdma", "") == 0
    try:
        calls = {
            "get_engine": e.get_engine,
            "get_engine_ptr": e.get_engine_ptr,
            "transfer_write_on_cuda": lambda: e.transfer_write_on_cuda("x:1", 1, 1, 1),
            "transfer_read_on_cuda": lambda: e.transfer_read_on_cuda("x:1", 1, 1, 1),
            "batch_transfer_write_on_cuda": lambda: e.batch_transfer_write_on_cuda(
                "x:1", [1], [1], [1]),
            "batch_transfer_read_on_cuda": lambda: e.batch_transfer_read_on_cuda(
                "x:1", [1], [1], [1]),
        }
        for name, call in calls.items():
            with pytest.raises(NotImplementedError, match=f"TransferEngine.{name}:"):
                call()
        # what it does offer of Mooncake's helpers
        addr = e.allocate_managed_buffer(10000)
        assert addr != 0
        assert e.register_memory(addr, 10) == -7  # it is registered
        assert e.write_bytes_to_buffer(addr, b"hello world", 5) == 0
        assert e.read_bytes_from_buffer(addr, 6) == b"hello\0"
        assert e.free_managed_buffer(addr, 10000) == 0
        assert e.free_managed_buffer(addr, 10000) == -1
        assert e.get_local_topology() == "{}" and e.warmup_efa_segment("x") == 0
    finally:
        e.close()


def test_managed_buffer_across_processes(target):
    """A writer whose source is a managed buffer (kvbridge shared memory)."""
    e = TransferEngine()
    assert e.initialize(HOST, "P2PHANDSHAKE", "rdma", "") == 0
    try:
        addr = e.allocate_managed_buffer(SIZES[2])
        data = np.random.default_rng(3).integers(0, 256, SIZES[2], dtype=np.uint8)
        assert e.write_bytes_to_buffer(addr, data.tobytes(), SIZES[2]) == 0
        assert e.transfer_sync_write(target.sid, addr, target.addrs[2], SIZES[2]) == 0
        assert target.digests()[2] == sha(data)
    finally:
        e.close()


def test_killed_target():
    t = Target()
    eng, src = writer()
    try:
        a0 = t.addrs[0]
        assert eng.transfer_sync_write(t.sid, src.ctypes.data, a0, 4096) == 0
        t.p.kill()
        t.p.wait(10)
        t0 = time.monotonic()
        assert eng.batch_transfer_sync_write(t.sid, [src.ctypes.data] * 4,
                                             [a0 + i * 4096 for i in range(4)], [4096] * 4) == -1
        assert time.monotonic() - t0 < 10
        t0 = time.monotonic()
        bid = eng.batch_transfer_async_write(t.sid, [src.ctypes.data], [a0], [4096])
        assert bid == 0 or eng.get_batch_transfer_status([bid]) == -1
        assert eng.send_probe(t.sid) == -102
        assert time.monotonic() - t0 < 10
    finally:
        eng.close()
        t.close()


def test_stopped_target_times_out(monkeypatch):
    """A target that stops answering (SIGSTOP) over the tcp lane, whose bytes
    need the target's acknowledgement: the sync write gives -1 within
    MC_TRANSFER_TIMEOUT (5 s, the minimum) plus the engine's settle bound;
    an asynchronous write past its deadline is given up (kvb_xfer_expire)
    and, its bytes in flight to a peer that may resume, reported unsettled
    (-3, not Mooncake's -2 which LMCache takes for a settled end) once its
    connection was failed (about one peer time-out later), the id kept."""
    monkeypatch.setenv("MC_TRANSFER_TIMEOUT", "1")  # raised to the minimum, 5 s
    t = Target("tcp")
    eng, src = writer("tcp")
    try:
        a0 = t.addrs[0]
        assert eng.transfer_sync_write(t.sid, src.ctypes.data, a0, 4096) == 0
        stop_process(t.p.pid)
        bid = eng.transfer_submit_write(t.sid, src.ctypes.data, a0, 1 << 20)
        assert bid > 0
        t0 = time.monotonic()
        seen = []
        while time.monotonic() - t0 < 15:
            st = eng.transfer_check_status(bid)
            if not seen or seen[-1] != st:
                seen.append(st)
            if st != 0:
                break
            time.sleep(0.05)
        waited = time.monotonic() - t0
        assert seen == [0, -3], seen
        assert 4.5 < waited < 5 + 2 * 2 + 2, waited
        assert eng.transfer_check_status(bid) == -3  # kept, says it again
        assert eng.batch_transfer_poll([bid]) == [-3]
        assert eng.batch_transfer_free([bid]) == -3  # freed all the same
        assert eng.batch_transfer_poll([bid]) == [-1]
        t0 = time.monotonic()
        assert eng.transfer_sync_write(t.sid, src.ctypes.data, a0 + 8192, 1 << 20) == -1
        assert time.monotonic() - t0 < 5 + 2 * 2 + 4
    finally:
        eng.close()
        t.close()


if __name__ == "__main__" and len(sys.argv) > 1 and sys.argv[1] == "target":
    target_main(sys.argv[2])


@pytest.mark.parametrize("protocol", ["tcp", "rdma"])
def test_serve_reads_env(monkeypatch, protocol):
    """Review 3 F5: the drop-in serves one-sided reads (Mooncake peers such
    as LMCache read from it) unless KVBRIDGE_SERVE_READS=0 when the engine
    is initialized: then a peer's read of its registered bytes fails (-1)
    and nothing lands in the reader's buffer, while writes are still taken."""
    n = 64 << 10
    reader = TransferEngine()
    assert reader.initialize(HOST, "P2PHANDSHAKE", protocol, "") == 0
    got = np.zeros(n, np.uint8)
    assert reader.register_memory(got.ctypes.data, n) == 0
    try:
        for env, want in ((None, 0), ("0", -1), ("1", 0)):
            if env is None:
                monkeypatch.delenv("KVBRIDGE_SERVE_READS", raising=False)
            else:
                monkeypatch.setenv("KVBRIDGE_SERVE_READS", env)
            t = TransferEngine()
            assert t.initialize(HOST, "P2PHANDSHAKE", protocol, "") == 0
            monkeypatch.delenv("KVBRIDGE_SERVE_READS", raising=False)
            kv = np.full(n, 0x5A, np.uint8)
            assert t.register_memory(kv.ctypes.data, n) == 0
            sid = f"{HOST}:{t.get_rpc_port()}"
            got[:] = 0
            rc = reader.transfer_sync_read(sid, got.ctypes.data, kv.ctypes.data, n)
            assert rc == want, (env, rc)
            assert (got == 0x5A).all() if want == 0 else not got.any()
            got[:4096] = 0x33
            assert reader.transfer_sync_write(sid, got.ctypes.data, kv.ctypes.data, 4096) == 0
            assert (kv[:4096] == 0x33).all()
            t.close()
    finally:
        reader.close()
