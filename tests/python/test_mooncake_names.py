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
- RpcInterface and its helpers refused with the reason (no message
  channel); mooncake.BufferPool / RegisteredBufferPool None, as Mooncake
  without its store.

Alone: KVBRIDGE_LIB=build/libkvbridge.so /usr/bin/python3 -m pytest -q
tests/python/test_mooncake_names.py
"""

import importlib
import json
import logging
import os
import socket
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


def test_rpc_interface_declined():
    for name in ("RpcInterface", "CoroRPCInterface", "ReceivedData", "ReceivedTensor",
                 "create_rpc_client", "create_rpc_server"):
        with pytest.raises(NotImplementedError, match="no message channel") as ei:
            getattr(me, name)()
        assert "coro_rpc" in str(ei.value) and "real Mooncake peer" in str(ei.value)


def test_top_level_names():
    from mooncake import BufferPool, RegisteredBufferPool
    assert BufferPool is None and RegisteredBufferPool is None
    assert mooncake.KVBRIDGE_DROP_IN is True
    with pytest.raises(ImportError):
        importlib.import_module("mooncake.store")


if __name__ == "__main__" and sys.argv[1:] == ["target"]:
    target_main()
