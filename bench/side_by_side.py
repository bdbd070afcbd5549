"""Side by side (issue 16 §3): the same blocks moved by Mooncake's transfer
engine, NIXL's UCX backend and kvbridge, between two processes on this host,
with raw TCP and memcpy yardsticks, in one run. Driven by
bench/side_by_side.sh (venv with pinned PyPI releases under the build
folder); not part of `make check`.

    python side_by_side.py run OUT.json [--ws MiB] [--sizes 32768,...] [--reps N] [--only IMPL]
    python side_by_side.py table OUT.json          # markdown table on stdout

Each row: one implementation, one lane, one block size. The writer (this
process) writes the working set as blocks at random, non-overlapping
destination slots of a fresh target process's buffer (sources sequential,
like engine-bench): one cold pass, then REPS timed passes (median). Every
pass goes through the implementation's own batch call from Python; the
target's buffer is verified against the expected bytes by SHA-256 after the
last pass.

Implementations and lanes (what each offers between two processes of one
host):
  mooncake  Mooncake's real `mooncake.engine` (PyPI
            mooncake-transfer-engine-non-cuda): protocol "tcp" (its only
            lane without RDMA NICs here); buffers from allocate_managed_buffer
  kvbridge  kvbridge through the same Python surface: the `mooncake.engine`
            drop-in (python/compat/mooncake) on libkvbridge; "tcp" (message
            lane over TCP) and same-host ("rdma" protocol = the engine's
            auto lane: with allocate_managed_buffer memory, the direct lane)
  nixl      NIXL's Python agent with the UCX backend (PyPI nixl), UCX
            picking its lanes (same-host: shared memory / CMA; tcp:
            UCX_TLS=tcp), when it imports and runs without a GPU
  memcpy    yardstick: numpy gather-scatter copy of the same blocks in one
            process
  tcp-raw   yardstick: one plain TCP stream of the working set to a sink
            process (sendall / recv_into)
"""

import hashlib
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time

import numpy as np

HOST = "127.0.0.1"
READY_S = 120
BATCH = int(os.environ.get("SBS_BATCH", "1024"))  # blocks per batch call


# ------------------------------------------------------------ target side
def target_main(impl, lane, ws):
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # library chatter on stdout must not reach the pipe
    if impl in ("mooncake", "kvbridge"):
        from mooncake.engine import TransferEngine
        e = TransferEngine()
        proto = "tcp" if lane == "tcp" else "rdma"
        if e.initialize(HOST, "P2PHANDSHAKE", proto, "") != 0:
            print(json.dumps({"error": "initialize failed"}), file=out, flush=True)
            return
        addr = e.allocate_managed_buffer(ws)
        buf = np.ctypeslib.as_array((np.ctypeslib.ctypes.c_uint8 * ws).from_address(addr))
        hello = {"sid": f"{HOST}:{e.get_rpc_port()}", "addr": addr}
    elif impl == "nixl":
        agent, buf, hello = nixl_target(ws)
    else:  # tcp-raw sink
        buf = np.zeros(ws, np.uint8)
        ls = socket.socket()
        ls.bind((HOST, 0))
        ls.listen(4)
        hello = {"port": ls.getsockname()[1]}
    buf[:] = 0  # the owner's pages exist before any writer maps them
    print(json.dumps(hello), flush=True, file=out)
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["op"] == "digest":
            rep = hashlib.sha256(memoryview(buf)).hexdigest()
        elif cmd["op"] == "sink":
            c, _ = ls.accept()
            view, got = memoryview(buf), 0
            while got < cmd["bytes"]:
                n = c.recv_into(view[got:cmd["bytes"]])
                if n <= 0:
                    break
                got += n
            c.sendall(b"k")
            c.close()
            rep = got
        elif cmd["op"] == "nixl_peer":
            agent.add_remote_agent(bytes.fromhex(cmd["meta"]))
            rep = "ok"
        else:
            break
        print(json.dumps(rep), flush=True, file=out)


def nixl_agent_new(name):
    try:  # PyPI: `nixl` is a meta package over nixl-cu12 / nixl-cu13
        from nixl._api import nixl_agent, nixl_agent_config
    except ImportError:
        from nixl_cu12._api import nixl_agent, nixl_agent_config
    return nixl_agent(name, nixl_agent_config(backends=["UCX"]))


def nixl_register(agent, buf):
    agent.register_memory(agent.get_reg_descs([(buf.ctypes.data, buf.nbytes, 0, "")], "DRAM"))


def nixl_target(ws):
    agent = nixl_agent_new("target")
    buf = np.zeros(ws, np.uint8)
    nixl_register(agent, buf)
    hello = {"addr": buf.ctypes.data, "meta": agent.get_agent_metadata().hex()}
    return agent, buf, hello


class Target:
    def __init__(self, impl, lane, ws, env):
        self.p = subprocess.Popen([sys.executable, __file__, "target", impl, lane, str(ws)],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                  env=env)
        self.hello = self.read(READY_S)
        if "error" in self.hello:
            raise RuntimeError(self.hello["error"])

    def read(self, timeout):
        box = []
        t = threading.Thread(target=lambda: box.append(self.p.stdout.readline()), daemon=True)
        t.start()
        t.join(timeout)
        if not box or not box[0]:
            raise RuntimeError(f"target said nothing (exit {self.p.poll()})")
        return json.loads(box[0])

    def ask(self, cmd, timeout=300):
        self.p.stdin.write(json.dumps(cmd) + "\n")
        self.p.stdin.flush()
        return self.read(timeout)

    def close(self):
        try:
            self.p.stdin.write(json.dumps({"op": "quit"}) + "\n")
            self.p.stdin.close()
            self.p.wait(10)
        except Exception:
            self.p.kill()
            self.p.wait()


# ------------------------------------------------------------ writer side
class MooncakeWriter:
    """Mooncake's engine or kvbridge's drop-in: the same calls."""

    def __init__(self, lane, ws):
        from mooncake.engine import TransferEngine
        self.e = TransferEngine()
        if self.e.initialize(HOST, "P2PHANDSHAKE", "tcp" if lane == "tcp" else "rdma", "") != 0:
            raise RuntimeError("initialize failed")
        self.src = self.e.allocate_managed_buffer(ws)
        if self.src == 0:
            raise RuntimeError("allocate_managed_buffer failed")
        self.view = np.ctypeslib.as_array((np.ctypeslib.ctypes.c_uint8 * ws).from_address(self.src))

    def connect(self, t):
        self.sid, self.dst = t.hello["sid"], t.hello["addr"]

    def write(self, srcs, dsts, lens):
        # Mooncake's TCP lane refuses a batch of 8192 blocks (its lane queue
        # fills: "TCP lane queue-full rejection"), so both implementations
        # get at most BATCH blocks per call.
        for i in range(0, len(srcs), BATCH):
            rc = self.e.batch_transfer_sync_write(self.sid, srcs[i:i + BATCH], dsts[i:i + BATCH],
                                                  lens[i:i + BATCH])
            if rc != 0:
                raise RuntimeError(f"batch_transfer_sync_write returned {rc}")


class NixlWriter:
    def __init__(self, lane, ws):
        self.agent = nixl_agent_new("writer")
        self.view = np.zeros(ws, np.uint8)
        nixl_register(self.agent, self.view)
        self.src = self.view.ctypes.data

    def connect(self, t):
        self.peer = self.agent.add_remote_agent(bytes.fromhex(t.hello["meta"]))
        t.ask({"op": "nixl_peer", "meta": self.agent.get_agent_metadata().hex()})
        self.dst = t.hello["addr"]

    def write(self, srcs, dsts, lens):
        # The descriptor lists are built once per block list (in the cold
        # pass), as a serving engine would keep them; a transfer per pass.
        if getattr(self, "key", None) != id(srcs):
            self.key = id(srcs)
            self.local = self.agent.get_xfer_descs([(s, n, 0) for s, n in zip(srcs, lens)],
                                                   "DRAM")
            self.remote = self.agent.get_xfer_descs([(d, n, 0) for d, n in zip(dsts, lens)],
                                                    "DRAM")
        h = self.agent.initialize_xfer("WRITE", self.local, self.remote, self.peer)
        state = self.agent.transfer(h)
        deadline = time.monotonic() + 300
        while state not in ("DONE", "ERR") and time.monotonic() < deadline:
            state = self.agent.check_xfer_state(h)
        self.agent.release_xfer_handle(h)
        if state != "DONE":
            raise RuntimeError(f"nixl transfer ended {state}")


def blocks(w, ws, bs, seed):
    n = ws // bs
    perm = np.random.default_rng(seed).permutation(n)
    srcs = [w.src + i * bs for i in range(n)]
    dsts = [w.dst + int(p) * bs for p in perm]
    return srcs, dsts, [bs] * n, perm


def expected_digest(view, perm, bs):
    n = len(perm)
    out = np.empty(n * bs, np.uint8)
    out.reshape(n, bs)[perm] = view[: n * bs].reshape(n, bs)
    return hashlib.sha256(memoryview(out)).hexdigest()


def writer_class(impl):
    return NixlWriter if impl == "nixl" else MooncakeWriter


def run_row(impl, lane, ws, bs, reps, env):
    """One fresh target: cold pass, reps timed passes, verification."""
    row = {"impl": impl, "lane": lane, "block": bs, "bytes": ws // bs * bs}
    w = writer_class(impl)(lane, ws)
    t = Target(impl, lane, ws, env)
    try:
        w.connect(t)
        srcs, dsts, lens, perm = blocks(w, ws, bs, bs)
        rng = np.random.default_rng(7)
        times = []
        for r in range(reps + 1):
            w.view[:] = rng.integers(0, 256, ws, np.uint8)  # fresh bytes every pass
            t0 = time.perf_counter()
            w.write(srcs, dsts, lens)
            times.append(time.perf_counter() - t0)
        row["cold_gbps"] = row["bytes"] / times[0] / 1e9
        row["gbps"] = row["bytes"] / statistics.median(times[1:]) / 1e9
        got = t.ask({"op": "digest"})
        row["verified"] = got == expected_digest(w.view, perm, bs)
    except Exception as e:  # the row records why
        row["error"] = f"{type(e).__name__}: {e}"[:300]
    finally:
        t.close()
    return row


def memcpy_row(ws, bs, reps):
    src = np.random.default_rng(1).integers(0, 256, ws, np.uint8)
    dst = np.zeros(ws, np.uint8)
    n = ws // bs
    perm = np.random.default_rng(bs).permutation(n)
    times = []
    for _ in range(reps + 1):
        t0 = time.perf_counter()
        dst[: n * bs].reshape(n, bs)[perm] = src[: n * bs].reshape(n, bs)
        times.append(time.perf_counter() - t0)
    return {"impl": "memcpy", "lane": "-", "block": bs, "bytes": n * bs,
            "gbps": n * bs / statistics.median(times[1:]) / 1e9, "verified": True}


def tcp_row(ws, reps, env):
    t = Target("tcp-raw", "tcp", ws, env)
    src = np.random.default_rng(2).integers(0, 256, ws, np.uint8)
    times = []
    try:
        for _ in range(reps + 1):  # the first stream of a fresh process is slower
            t.p.stdin.write(json.dumps({"op": "sink", "bytes": ws}) + "\n")
            t.p.stdin.flush()
            t0 = time.perf_counter()
            s = socket.create_connection((HOST, t.hello["port"]))
            s.sendall(memoryview(src))
            s.recv(1)
            times.append(time.perf_counter() - t0)
            s.close()
            if t.read(60) != ws:
                raise RuntimeError("sink short")
    finally:
        t.close()
    return {"impl": "tcp-raw", "lane": "tcp", "block": ws, "bytes": ws,
            "gbps": ws / statistics.median(times[1:]) / 1e9, "verified": True}


def impl_env(impl):
    """The environment of one implementation's processes: Mooncake's own
    module must not see the drop-in on the path; the drop-in must."""
    env = dict(os.environ)
    compat = env.pop("SBS_COMPAT", "")
    env.pop("PYTHONPATH", None)
    if impl == "kvbridge":
        env["PYTHONPATH"] = compat
    return env


def run(out, ws, sizes, reps, only):
    plan = [("mooncake", "tcp"), ("kvbridge", "tcp"), ("kvbridge", "same-host"),
            ("nixl", "same-host"), ("nixl", "tcp")]
    rows = []
    for bs in sizes:
        rows.append(memcpy_row(ws, bs, reps))
    rows.append(tcp_row(ws, reps, impl_env("tcp-raw")))
    for impl, lane in plan:
        if only and impl not in only:
            continue
        env = impl_env(impl)
        if impl == "nixl" and lane == "tcp":
            env["UCX_TLS"] = "tcp"
        # The writer runs in a child of its own: the implementations' modules
        # (mooncake.engine from two places, UCX from two builds) never share
        # a process.
        for bs in sizes:
            cmd = [sys.executable, __file__, "row", impl, lane, str(ws), str(bs), str(reps)]
            p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
            try:
                row = json.loads(p.stdout.strip().splitlines()[-1])
            except (ValueError, IndexError):
                tail = (p.stderr or "").strip().splitlines()[-3:]
                row = {"impl": impl, "lane": lane, "block": bs,
                       "error": f"exit {p.returncode}: {' | '.join(tail)[:300]}"}
            print(json.dumps(row), file=sys.stderr, flush=True)
            rows.append(row)
    with open(out, "w") as f:
        json.dump({"ws": ws, "reps": reps, "rows": rows}, f, indent=1)


def row_main(impl, lane, ws, bs, reps):
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    try:
        row = run_row(impl, lane, ws, bs, reps, dict(os.environ))
    except Exception as e:
        row = {"impl": impl, "lane": lane, "block": bs, "error": f"{type(e).__name__}: {e}"[:300]}
    print(json.dumps(row), file=out, flush=True)


def size_name(b):
    return f"{b >> 20} MiB" if b >= 1 << 20 else f"{b >> 10} KiB"


def table(path):
    with open(path) as f:
        d = json.load(f)
    rows = d["rows"]
    memcpy = {r["block"]: r["gbps"] for r in rows if r["impl"] == "memcpy"}
    tcp = next((r["gbps"] for r in rows if r["impl"] == "tcp-raw"), 0)
    sizes = sorted(memcpy)
    cols = [(r["impl"], r["lane"]) for r in rows if r["impl"] not in ("memcpy", "tcp-raw")]
    cols = list(dict.fromkeys(cols))
    print("| block | memcpy | raw TCP | " +
          " | ".join(f"{i} {l}" for i, l in cols) + " |")
    print("|---" * (len(cols) + 3) + "|")
    notes = []
    for bs in sizes:
        cells = []
        for i, l in cols:
            r = next((x for x in rows if x["impl"] == i and x["lane"] == l and x["block"] == bs),
                     None)
            if r is None or "error" in r:
                cells.append("–")
                if r is not None and (i, l) not in [n[0] for n in notes]:
                    notes.append(((i, l), r["error"]))
                continue
            base = tcp if l == "tcp" else memcpy[bs]
            ok = "" if r.get("verified") else " **NOT verified**"
            cells.append(f"{r['gbps']:.2f} ({r['gbps'] / base:.2f}x; cold {r['cold_gbps']:.2f})"
                         f"{ok}")
        print(f"| {size_name(bs)} | {memcpy[bs]:.2f} | {tcp:.2f} | " + " | ".join(cells) + " |")
    for (i, l), e in notes:
        print(f"\n{i} {l}: {e}")


if __name__ == "__main__":
    a = sys.argv
    if a[1] == "target":
        target_main(a[2], a[3], int(a[4]))
    elif a[1] == "row":
        row_main(a[2], a[3], int(a[4]), int(a[5]), int(a[6]))
    elif a[1] == "table":
        table(a[2])
    else:
        args = {"--ws": "256", "--sizes": "32768,262144,1048576,4194304", "--reps": "3",
                "--only": ""}
        for k, v in zip(a[3::2], a[4::2]):
            args[k] = v
        run(a[2], int(args["--ws"]) << 20, [int(x) for x in args["--sizes"].split(",")],
            int(args["--reps"]), [x for x in args["--only"].split(",") if x])
