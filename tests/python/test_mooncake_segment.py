"""Mooncake 0.3.14's SharedSegment on kvbridge's drop-in
(python/compat/mooncake/_segment.py, over kvb_mem_export / kvb_mem_import):

- two ranks in two processes: the owner's blob carries its export, the
  other rank maps the same memory; bytes written by either are seen by the
  other; an engine write into one rank's base_addr shows at the other's;
- Mooncake's refusals (world size, ranks, host_register, blob count,
  length, magic, version, another declaration, an owner without a handle);
- supported() says what works.
"""

import ctypes
import json
import os
import subprocess
import sys

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
PYDIR = os.path.join(os.path.dirname(os.path.dirname(HERE)), "python")
COMPAT = os.path.join(PYDIR, "compat")
for d in (HERE, COMPAT, PYDIR):
    if d not in sys.path:
        sys.path.insert(0, d)

import mooncake.engine as me  # noqa: E402
from mooncake.engine import SharedSegment, TransferEngine  # noqa: E402

SIZE = 5 << 20


def view(seg):
    return np.ctypeslib.as_array((ctypes.c_uint8 * seg.size()).from_address(seg.base_addr()))


def child_main():
    """Rank 1 of 2: prints its blob, reads the owner's, completes, checks
    and writes, then waits for the parent's word to leave."""
    seg, blob = SharedSegment.create("kv", SIZE, 2, 1)
    print(json.dumps({"blob": blob.hex(), "base": seg.base_addr()}), flush=True)
    owner = bytes.fromhex(json.loads(sys.stdin.readline())["blob"])
    seg.complete([owner, blob])
    v = view(seg)
    ok = seg.ready() and seg.base_addr() != 0 and bool((v[:4096] == 7).all())
    v[4096:8192] = 9
    print(json.dumps({"ok": ok}), flush=True)
    sys.stdin.readline()  # the parent checked; leave (unmaps)


def test_two_processes():
    assert SharedSegment.supported() and SharedSegment.supported(True, False)
    assert not SharedSegment.supported(mmap=False) and not SharedSegment.supported(True, True)
    seg, blob = SharedSegment.create("kv", SIZE, 2, 0)
    assert seg.ready() and seg.size() == SIZE and seg.device_addr() == 0
    v = view(seg)
    v[:4096] = 7
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([COMPAT, PYDIR]))
    p = subprocess.Popen([sys.executable, __file__, "child"], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True, env=env)
    try:
        hello = json.loads(p.stdout.readline())
        assert hello["base"] == 0  # not mapped before complete
        seg.complete([blob, bytes.fromhex(hello["blob"])])
        p.stdin.write(json.dumps({"blob": blob.hex()}) + "\n")
        p.stdin.flush()
        assert json.loads(p.stdout.readline())["ok"] is True
        assert (v[4096:8192] == 9).all() and not v[8192:].any()  # the child's bytes
        # the segment as an engine buffer: a write into it shows in the mapping
        w, t = TransferEngine(), TransferEngine()
        assert w.initialize("127.0.0.1", "P2PHANDSHAKE", "rdma", "") == 0
        assert t.initialize("127.0.0.1", "P2PHANDSHAKE", "rdma", "") == 0
        src = np.arange(4096, dtype=np.uint8)
        assert w.register_memory(src.ctypes.data, 4096) == 0
        assert t.register_memory(seg.base_addr(), SIZE) == 0
        assert w.transfer_sync_write(f"127.0.0.1:{t.get_rpc_port()}", src.ctypes.data,
                                     seg.base_addr() + 65536, 4096) == 0
        assert (v[65536:65536 + 4096] == src).all()
        assert t.unregister_memory(seg.base_addr()) == 0
        w.close()
        t.close()
        p.stdin.write("bye\n")
        p.stdin.flush()
        assert p.wait(30) == 0
    finally:
        if p.poll() is None:
            p.kill()


def test_refusals():
    with pytest.raises(ValueError, match="world_size must not be zero"):
        SharedSegment.create("s", 4096, 0, 0)
    with pytest.raises(ValueError, match="must be below world_size"):
        SharedSegment.create("s", 4096, 2, 2)
    with pytest.raises(ValueError, match="must be below world_size"):
        SharedSegment.create("s", 4096, 2, 0, owner_rank=3)
    with pytest.raises(ValueError, match="host_register requires mmap=true"):
        SharedSegment.create("s", 4096, 1, 0, mmap=False, host_register=True)
    with pytest.raises(RuntimeError, match="host_register"):
        SharedSegment.create("s", 4096, 1, 0, host_register=True)
    with pytest.raises(RuntimeError, match="no VMM backend"):
        SharedSegment.create("s", 4096, 1, 0, mmap=False)
    with pytest.raises(TypeError):
        SharedSegment()
    a, ba = SharedSegment.create("s", 4096, 2, 0)
    b, bb = SharedSegment.create("s", 4096, 2, 1)
    other, bo = SharedSegment.create("t", 4096, 2, 1)
    cases = [
        ([ba], "one blob per rank, got 1"),
        ([ba, bb[:-1]], "unexpected length"),
        ([ba, b"X" + bb[1:]], "magic mismatch"),
        ([ba, bb[:8] + b"\x02" + bb[9:]], "version mismatch"),
        ([ba, bo], "declaration of rank 1 differs"),
        ([bb, ba], "declaration of rank 0 differs"),
        ([ba[:16] + b"\0" + ba[17:], bb], "owner rank did not export a handle"),
    ]
    for blobs, msg in cases:
        with pytest.raises(ValueError, match=msg):
            b.complete(blobs)
    assert not b.ready() and b.base_addr() == 0
    b.complete([ba, bb])  # in this process too: a second mapping
    assert b.ready() and b.base_addr() not in (0, a.base_addr())
    view(a)[:16] = 5
    assert (view(b)[:16] == 5).all()


if __name__ == "__main__" and len(sys.argv) > 1 and sys.argv[1] == "child":
    child_main()
