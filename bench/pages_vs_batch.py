#!/usr/bin/python3
"""batch_transfer_sync_write_pages vs batch_transfer_sync_write with the same
spans, through kvbridge's mooncake.engine drop-in, writer and target in two
processes on this host. Rounds alternate A (pages call: numpy grid, one C
call, strided blocks) and B (the plain batch call given the same spans as
pre-built Python lists, as a caller without the pages call would pass them;
building the lists is not timed). Every round's bytes are checked once at
the end against the last write (both calls write the same image).

usage: bench/pages_vs_batch.py [--rounds N] [--memory managed|plain]
  (PYTHONPATH=python/compat:python KVBRIDGE_LIB=build/libkvbridge.so)
Prints one line per case: median and p10/p90 µs per call and GB/s.
"""

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
for d in (os.path.join(HERE, "..", "python", "compat"), os.path.join(HERE, "..", "python")):
    sys.path.insert(0, os.path.abspath(d))

from mooncake.engine import TransferEngine  # noqa: E402

HOST = "127.0.0.1"
DST_BYTES = 64 << 20


def target(memory):
    e = TransferEngine()
    assert e.initialize(HOST, "P2PHANDSHAKE", "rdma", "") == 0
    if memory == "managed":
        ptr = e.allocate_managed_buffer(DST_BYTES)
        import ctypes
        buf = np.ctypeslib.as_array((ctypes.c_uint8 * DST_BYTES).from_address(ptr))
    else:
        buf = np.zeros(DST_BYTES, np.uint8)
        ptr = buf.ctypes.data
        assert e.register_memory(ptr, DST_BYTES) == 0
    print(json.dumps({"port": e.get_rpc_port(), "ptr": ptr}), flush=True)
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["op"] == "sha":
            a, n = cmd["off"], cmd["len"]
            print(json.dumps({"sha": hashlib.sha256(buf[a:a + n].tobytes()).hexdigest()}),
                  flush=True)
        elif cmd["op"] == "zero":
            buf[:] = 0
            print(json.dumps({"ok": True}), flush=True)
        else:
            break


CASES = [
    # name, pages, fields, bytes per span, page pattern
    ("64p x 8f x 16KiB, runs", 64, 8, 16 << 10, "runs"),
    ("64p x 8f x 16KiB, scattered", 64, 8, 16 << 10, "scattered"),
    ("256p x 8f x 128B, runs", 256, 8, 128, "runs"),
    ("256p x 8f x 128B, scattered", 256, 8, 128, "scattered"),
]


# The page grids: the same as the side-by-side bench's (one definition).
from side_by_side import grid  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=200)
    ap.add_argument("--memory", choices=("managed", "plain"), default="managed")
    ap.add_argument("target", nargs="?")
    a = ap.parse_args()
    if a.target == "target":
        return target(a.memory)
    p = subprocess.Popen([sys.executable, __file__, "--memory", a.memory, "target"],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    hello = json.loads(p.stdout.readline())
    sid, dptr = f"{HOST}:{hello['port']}", hello["ptr"]
    w = TransferEngine()
    assert w.initialize(HOST, "P2PHANDSHAKE", "rdma", "") == 0
    src = np.random.default_rng(1).integers(0, 256, DST_BYTES, dtype=np.uint8)
    assert w.register_memory(src.ctypes.data, src.nbytes) == 0
    rng = np.random.default_rng(2)
    print(f"pages_vs_batch: {a.rounds} alternating rounds per case, target memory {a.memory}, "
          f"transport {w._eng.transport}")
    try:
        for name, pages, fields, span, pattern in CASES:
            sp, dp, f, used = grid(src.ctypes.data, dptr, pages, fields, span, pattern, rng)
            assert used <= DST_BYTES
            srcs = [int(r[0] + s * r[1]) for r in f for s in sp]  # field-major, as the grid
            dsts = [int(r[2] + d * r[3]) for r in f for d in dp]
            lens = [span] * len(srcs)
            ta, tb = [], []
            p.stdin.write(json.dumps({"op": "zero"}) + "\n")  # cases overlap: start clean
            p.stdin.flush()
            assert json.loads(p.stdout.readline())["ok"]
            for _ in range(5):  # warm-up: connection, mappings
                assert w.batch_transfer_sync_write_pages(sid, sp, dp, f) == 0
                assert w.batch_transfer_sync_write(sid, srcs, dsts, lens) == 0
            for _ in range(a.rounds):
                t0 = time.perf_counter()
                assert w.batch_transfer_sync_write_pages(sid, sp, dp, f) == 0
                t1 = time.perf_counter()
                assert w.batch_transfer_sync_write(sid, srcs, dsts, lens) == 0
                t2 = time.perf_counter()
                ta.append(t1 - t0)
                tb.append(t2 - t1)
            # bytes: every span's destination equals its source
            img = np.zeros(used, np.uint8)
            for s, d in zip(srcs, dsts):
                img[d - dptr:d - dptr + span] = src[s - src.ctypes.data:s - src.ctypes.data + span]
            p.stdin.write(json.dumps({"op": "sha", "off": 0, "len": used}) + "\n")
            p.stdin.flush()
            got = json.loads(p.stdout.readline())["sha"]
            assert got == hashlib.sha256(img.tobytes()).hexdigest(), name
            nbytes = pages * fields * span
            for label, ts in (("pages", ta), ("batch", tb)):
                q = statistics.quantiles(ts, n=10)
                med = statistics.median(ts)
                print(f"{name:30s} {label}: median {med * 1e6:8.1f} us  p10 {q[0] * 1e6:8.1f}  "
                      f"p90 {q[-1] * 1e6:8.1f}  {nbytes / med / 1e9:6.2f} GB/s  "
                      f"({pages * fields} spans, {nbytes} B)")
            print(f"{name:30s} batch/pages median time: "
                  f"{statistics.median(tb) / statistics.median(ta):.2f}x  (bytes verified)")
    finally:
        w.close()
        p.stdin.write(json.dumps({"op": "quit"}) + "\n")
        p.stdin.flush()
        p.wait(10)


if __name__ == "__main__":
    main()
