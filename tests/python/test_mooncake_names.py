"""The Mooncake drop-in's names (issue 33: what Mooncake's own
transfer-engine tests need; scripts/interop-mooncake-tests.sh runs those):

- get_first_buffer_address(segment_name): a peer's first registered region
  (the lowest address) as its handshake says, from another process, under
  its numeric and its host name; a registration made or dropped since is
  seen; this engine's own segment under its session id and under
  initialize()'s host name; 0 for a segment with none, an unreachable or
  unresolvable one, before initialize();
- initialize() with a host name ("localhost", "localhost:12345") listening
  on what the name resolves to; a name that does not resolve: -1 with the
  reason logged; MC_MIN_RPC_PORT == MC_MAX_RPC_PORT pins the port;
- RpcInterface on engine notifications: whole messages of 0 B to 1 MiB
  (17 parts) delivered once and in order to the data callback with the
  sender, 8 threads at once, the asyncio form, a tensor to the tensor
  callback (shape, dtype, bytes after the 40-byte header); -1 before
  initialize, to nobody, for a non-bytes message, non-tensors, a stopped
  server (within timeout_seconds); hostile parts dropped and logged while
  the server serves on; a raising callback still answered;
- mooncake.BufferPool / RegisteredBufferPool None, as Mooncake without its
  store.

Alone: KVBRIDGE_LIB=build/libkvbridge.so /usr/bin/python3 -m pytest -q
tests/python/test_mooncake_names.py
"""

import asyncio
import importlib
import json
import logging
import os
import socket
import struct
import subprocess
import sys
import threading
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
COMPAT = os.path.join(ROOT, "python", "compat")
PYDIR = os.path.join(ROOT, "python")
for d in (COMPAT, PYDIR):
    if d not in sys.path:
        sys.path.insert(0, d)

import kvbridge  # noqa: E402
import mooncake  # noqa: E402
import mooncake.engine as me  # noqa: E402
from mooncake.engine import TransferEngine  # noqa: E402

MB = 1 << 20


# ------------------------------------------------------------------ the peer

def target_main():
    """Child: an engine named localhost:12345 (as Mooncake's
    transfer_engine_target.py), driven by JSON lines on stdin."""
    import ctypes
    t = TransferEngine()
    rc = t.initialize("localhost:12345", "P2PHANDSHAKE", "tcp", "")
    own = f"localhost:{t.get_rpc_port()}"
    bufs = [ctypes.create_string_buffer(MB) for _ in range(2)]
    addrs = [ctypes.addressof(b) for b in bufs]
    out = {"rc": rc, "port": t.get_rpc_port(), "own_empty": t.get_first_buffer_address(own)}
    # Registered highest address first: "first" is the lowest all the same.
    for a in sorted(addrs, reverse=True):
        assert t.register_memory(a, MB) == 0
    out["addrs"] = addrs
    out["own_first"] = t.get_first_buffer_address(own)
    out["own_first_by_sid"] = t.get_first_buffer_address(t._eng.get_session_id())
    print(json.dumps(out), flush=True)
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["op"] == "unregister":
            r = t.batch_unregister_memory(addrs)
            print(json.dumps({"rc": r}), flush=True)
        elif cmd["op"] == "read":
            print(json.dumps({"hex": t.read_bytes_from_buffer(cmd["addr"], cmd["n"]).hex()}),
                  flush=True)


class Peer:
    def __init__(self):
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([COMPAT, PYDIR]))
        self.p = subprocess.Popen([sys.executable, __file__, "target"], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, env=env, text=True)
        self.hello = self.read(30)

    def read(self, timeout):
        box = []
        t = threading.Thread(target=lambda: box.append(self.p.stdout.readline()), daemon=True)
        t.start()
        t.join(timeout)
        assert box and box[0], f"the peer said nothing within {timeout} s"
        return json.loads(box[0])

    def call(self, **kw):
        self.p.stdin.write(json.dumps(kw) + "\n")
        self.p.stdin.flush()
        return self.read(30)

    def close(self):
        self.p.kill()
        self.p.wait(10)


@pytest.fixture
def peer():
    p = Peer()
    try:
        yield p
    finally:
        p.close()


def engine(host="127.0.0.1"):
    e = TransferEngine()
    assert e.initialize(host, "P2PHANDSHAKE", "tcp", "") == 0
    return e


# ------------------------------------------------------------------ tests

def test_first_buffer_address_of_a_peer(peer):
    h = peer.hello
    assert h["rc"] == 0
    first = min(h["addrs"])
    # the peer's own view, before and after registering (Mooncake's target)
    assert h["own_empty"] == 0
    assert h["own_first"] == first and h["own_first_by_sid"] == first
    w = engine("localhost")
    try:
        for name in (f"127.0.0.1:{h['port']}", f"localhost:{h['port']}"):
            assert w.get_first_buffer_address(name) == first, name
        # it is the peer's memory: bytes written there are the peer's
        src = w.allocate_managed_buffer(4096)
        msg = os.urandom(200)
        w.write_bytes_to_buffer(src, msg, len(msg))
        assert w.transfer_sync_write(f"localhost:{h['port']}", src, first + 100, len(msg)) == 0
        assert bytes.fromhex(peer.call(op="read", addr=first + 100, n=len(msg))["hex"]) == msg
        # dropped since: the next answer says so (once the notice came)
        assert peer.call(op="unregister")["rc"] == 0
        deadline = time.monotonic() + 5
        while w.get_first_buffer_address(f"127.0.0.1:{h['port']}") != 0:
            assert time.monotonic() < deadline, "the peer's unregistration was never seen"
            time.sleep(0.02)
    finally:
        w.close()


def test_first_buffer_address_own_and_unknown(caplog):
    e = TransferEngine()
    assert e.get_first_buffer_address("127.0.0.1:1") == 0  # before initialize()
    with pytest.raises(TypeError):
        e.get_first_buffer_address(5)
    assert e.initialize("localhost:12347", "P2PHANDSHAKE", "tcp", "") == 0
    try:
        port = e.get_rpc_port()
        own = [f"localhost:{port}", e._eng.get_session_id()]
        assert [e.get_first_buffer_address(n) for n in own] == [0, 0]
        a = e.allocate_managed_buffer(MB)
        b = e.allocate_managed_buffer(MB)
        assert a and b
        assert [e.get_first_buffer_address(n) for n in own] == [min(a, b)] * 2
        e.free_managed_buffer(min(a, b), MB)
        assert e.get_first_buffer_address(own[0]) == max(a, b)
        # nobody there, a name that does not resolve: 0, fast, the reason logged
        t0 = time.monotonic()
        with caplog.at_level(logging.WARNING, logger="mooncake.engine"):
            assert e.get_first_buffer_address("127.0.0.1:1") == 0
            assert e.get_first_buffer_address("unreachable_peer:9") == 0
        assert time.monotonic() - t0 < 5
        assert "unreachable_peer" in caplog.text and "resolve" in caplog.text
    finally:
        e.close()


def test_initialize_host_names(caplog, monkeypatch):
    for name in ("localhost", "localhost:12345"):
        e = engine(name)
        try:
            sid = e._eng.get_session_id()
            assert sid.startswith(("127.0.0.1:", "[::1]:")), sid
            assert 15000 <= e.get_rpc_port() <= 17000
        finally:
            e.close()
    e = TransferEngine()
    with caplog.at_level(logging.ERROR, logger="mooncake.engine"):
        assert e.initialize("no-such-host.invalid", "P2PHANDSHAKE", "tcp", "") == -1
    assert "'no-such-host.invalid' does not resolve" in caplog.text
    assert e._eng is None
    # kvbridge's own bindings: the C engine resolves the name too
    k = kvbridge.TransferEngine("localhost")
    assert k.get_session_id().startswith(("127.0.0.1:", "[::1]:"))
    k.close()
    with pytest.raises(kvbridge.KVBridgeError):
        kvbridge.TransferEngine("no-such-host.invalid")
    # MC_MIN_RPC_PORT == MC_MAX_RPC_PORT: that port (Mooncake's rule)
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    if 1024 <= port <= 32767 or port > 60999:  # outside the ephemeral range it refuses
        monkeypatch.setenv("MC_MIN_RPC_PORT", str(port))
        monkeypatch.setenv("MC_MAX_RPC_PORT", str(port))
        e = engine("localhost")
        assert e.get_rpc_port() == port
        e.close()
    monkeypatch.setenv("MC_MIN_RPC_PORT", "40000")  # ephemeral: back to the default
    monkeypatch.setenv("MC_MAX_RPC_PORT", "40001")
    e = engine()
    assert 15000 <= e.get_rpc_port() <= 17000
    e.close()


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class FakeTensor:
    """What Mooncake's send_tensor reads of a torch tensor, over numpy."""

    def __init__(self, a, dtype):
        self.a, self.shape, self.dtype = a, a.shape, dtype

    def data_ptr(self):
        return self.a.ctypes.data

    def numel(self):
        return self.a.size

    def element_size(self):
        return self.a.itemsize


@pytest.fixture
def rpc_pair():
    srv, cli = me.RpcInterface(), me.RpcInterface()
    addr = f"127.0.0.1:{free_port()}"
    got, tensors = [], []
    assert srv.initialize_server(addr, thread_count=2) is True
    srv.set_data_receive_callback(got.append)
    srv.set_tensor_receive_callback(tensors.append)
    assert srv.start_server_async() is True
    assert cli.initialize_client(pool_size=4, timeout_seconds=2) is True
    try:
        yield srv, cli, addr, got, tensors
    finally:
        cli.close()
        srv.close()


def test_rpc_send_data(rpc_pair):
    srv, cli, addr, got, _ = rpc_pair
    big = os.urandom(1 << 20)  # 17 notifications
    for msg in (b"hello", big, b""):
        assert cli.send_data(addr, msg) == 0
    assert [g["data"] for g in got] == [b"hello", big, b""]  # whole, once, in order
    assert {g["source"] for g in got} == {cli._eng.get_session_id()}
    # 8 threads at once, each message whole
    msgs = [os.urandom(100000 + i) for i in range(8)]
    rcs = [None] * 8

    def send(i):
        rcs[i] = cli.send_data(addr, msgs[i])
    ts = [threading.Thread(target=send, args=(i,)) for i in range(8)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(30)
    assert rcs == [0] * 8
    assert sorted(g["data"] for g in got[3:]) == sorted(msgs)
    # the asyncio form
    loop = asyncio.new_event_loop()
    try:
        fut = cli.send_data_async(addr, b"async", loop)
        assert loop.run_until_complete(asyncio.wait_for(fut, 10)) == 0
    finally:
        loop.close()
    assert got[-1]["data"] == b"async"


def test_rpc_send_tensor(rpc_pair):
    np = pytest.importorskip("numpy")
    _, cli, addr, got, tensors = rpc_pair
    a = np.arange(2 * 3 * 5, dtype=np.float32).reshape(2, 3, 5)
    assert cli.send_tensor(addr, FakeTensor(a, "torch.float32")) == 0
    assert len(tensors) == 1 and got == []
    t = tensors[0]
    assert (t.shape, t.dtype) == ([2, 3, 5], "float32")
    assert t.get_data_as_bytes()[40:] == a.tobytes() and t.get_data_size() == 40 + a.nbytes
    assert bytes(t.get_memory_view()) == t.get_data_as_bytes()
    assert cli.send_tensor(addr, object()) == -1  # not a tensor
    assert cli.send_tensor(addr, FakeTensor(a, "torch.complex64")) == -1


def test_rpc_failures(rpc_pair, caplog):
    srv, cli, addr, got, _ = rpc_pair
    r = me.RpcInterface()
    assert r.send_data(addr, b"x") == -1  # before initialize
    loop = asyncio.new_event_loop()
    try:
        with pytest.raises(RuntimeError, match="not initialized"):
            loop.run_until_complete(r.send_data_async(addr, b"x", loop))
    finally:
        loop.close()
    assert r.start_server_async() is False and r.initialize("not an address") is False
    assert cli.initialize_client() is False  # twice
    with pytest.raises(TypeError):
        me.ReceivedData()
    t0 = time.monotonic()
    assert cli.send_data(f"127.0.0.1:{free_port()}", b"x") == -1  # nobody there
    assert cli.send_data(addr, 12) == -1  # not bytes-like
    # hostile parts: dropped, logged; the server goes on serving
    k = kvbridge.TransferEngine("127.0.0.1")
    with caplog.at_level(logging.WARNING, logger="mooncake.engine"):
        k.notify(addr, b"junk")
        k.notify(addr, b"KVBR" + bytes(28))  # kind 0
        k.notify(addr, struct.pack("<4sBBHQQQ", b"KVBR", 1, 0, 0, 7, 0, 1 << 40) + b"x")
        k.notify(addr, struct.pack("<4sBBHQQQ", b"KVBR", 1, 0, 0, 8, 10, 5) + b"123456")
        deadline = time.monotonic() + 5
        while caplog.text.count("dropped") < 4 and time.monotonic() < deadline:
            time.sleep(0.01)
    assert caplog.text.count("dropped") >= 4, caplog.text
    k.close()
    # a callback that raises: the message still answered
    srv.set_data_receive_callback(lambda d: 1 / 0)
    assert cli.send_data(addr, b"boom") == 0
    # a stopped server answers nothing: -1 within timeout_seconds (2 s)
    srv.stop_server()
    t1 = time.monotonic()
    assert cli.send_data(addr, b"late") == -1
    assert 1.5 < time.monotonic() - t1 < 5
    assert got == [] and time.monotonic() - t0 < 15


def test_rpc_dropped_interface_closes():
    """The receiver holds its interface weakly: dropping the last reference
    stops it and closes the engine (no thread or listener left behind)."""
    import gc
    r = me.RpcInterface()
    assert r.initialize_client() is True
    t, port = r._thread, int(r._eng.get_session_id().rsplit(":", 1)[1])
    del r
    gc.collect()
    t.join(5)
    assert not t.is_alive()
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", port))  # the listener is gone
    finally:
        s.close()


def test_top_level_names():
    from mooncake import BufferPool, RegisteredBufferPool
    assert BufferPool is None and RegisteredBufferPool is None
    assert mooncake.KVBRIDGE_DROP_IN is True
    with pytest.raises(ImportError):
        importlib.import_module("mooncake.store")


if __name__ == "__main__" and sys.argv[1:] == ["target"]:
    target_main()
