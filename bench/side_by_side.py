"""Side by side: the same blocks moved by Mooncake's transfer engine (0.3.14
by default), kvbridge through the same Python calls (the `mooncake.engine`
drop-in), optionally NIXL's UCX backend, Mooncake 0.3.13.post1 and
TokenSpeed's Mooncake fork, between two processes on this host, with memcpy
and raw TCP yardsticks, in one run. Driven by bench/side_by_side.sh (pinned
venvs under the build folder, the libcuda.so.1 stand-in for Mooncake's CUDA
wheels); not part of `make check`.

    python side_by_side.py run OUT.json [--ws MiB] [--sizes 32768,...] [--reps N]
        [--rounds R] [--ops write,read] [--pages-rounds N] [--only IMPL,...]
    python side_by_side.py table OUT.json          # markdown on stdout

Block rows (op write / read): one implementation, one lane, one block size,
one fresh target process. Write: this process writes the working set as
blocks from sequential sources to random, non-overlapping destination slots
of the target's buffer; read: the same block list read back (the target's
buffer holds seeded random bytes, the local buffer is zeroed before every
pass, outside the timing). One cold pass, then REPS timed passes (median);
the bytes are verified by SHA-256 after the last pass (target's buffer for a
write, the local one for a read). A call that raises NotImplementedError
(kvbridge's drop-in reads, on a library without reads) makes the row
"n/a (NotImplementedError)".

Pages rows: batch_transfer_sync_write_pages against batch_transfer_sync_write
given the same spans (pre-built lists, building not timed), alternating call
by call (A, B, A, B ...) in one writer process, over a TokenSpeed-like page x
field grid (CASES); then the read twins (batch_transfer_sync_read_pages /
batch_transfer_sync_read). Each call kind is verified on its own after the
timed rounds: the destination zeroed, one call, its digest compared.

Rounds: the whole plan (yardsticks, every implementation's block rows and
pages rows) runs ROUNDS times; the order of the implementations alternates
from round to round; the table gives medians over rounds and ratios taken
within each round (then the median), so a drift of the host's bandwidth
between rounds does not pass for a difference between implementations.

Implementations (impl, lanes):
  mc14      Mooncake 0.3.14 (PyPI mooncake-transfer-engine-cuda13, the only
            0.3.14 wheel; its engine.so needs libcuda.so.1: the bench's
            counting stand-in, bench/libcuda_standin.c, satisfies the loader
            and must see no call while bytes move: every row records the
            stand-in's call counter in both processes, setup and timed
            passes apart). Protocol "tcp" (its lane between two processes
            without RDMA NICs); buffers from allocate_managed_buffer (in this
            build: 64 KiB-aligned malloc for protocol tcp, registered).
  kvbridge  kvbridge through the same Python surface: the mooncake.engine
            drop-in (python/compat/mooncake) on this build's libkvbridge;
            "tcp" (message lane over TCP) and "same-host" (protocol "rdma" =
            the engine's auto lane: with allocate_managed_buffer memory
            between two processes of one host, the direct lane).
  mc13      (opt-in) Mooncake 0.3.13.post1, mooncake-transfer-engine-non-cuda,
            protocol tcp, as the earlier side-by-side runs.
  tsmc      (opt-in) TokenSpeed's fork tokenspeed-mooncake 0.3.13.post20261027
            (CUDA 13 wheel, the same stand-in), protocol tcp with
            MC_FORCE_TCP=1 (otherwise its NVLink transport, installed next
            to tcp, refuses every registration without a driver).
  nixl      (opt-in) NIXL's Python agent with the UCX backend (same-host:
            shared memory / CMA; tcp: UCX_TLS=tcp).
  memcpy    yardstick: numpy gather-scatter of the same blocks, one thread
  memcpy-mt yardstick: the same gather-scatter with glibc memcpy on all
            cores (bench/sbs_copy.c, os.cpu_count() threads): the honest
            ceiling of a same-host copy on this host
  tcp-raw   yardstick: one plain TCP stream of the working set to a sink
            process (sendall / recv_into)
"""

import ctypes
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
MOONCAKE_LIKE = ("mc14", "mc13", "tsmc", "kvbridge")
LABEL = {"mc14": "mooncake 0.3.14", "mc13": "mooncake 0.3.13.post1",
         "tsmc": "tokenspeed-mooncake", "kvbridge": "kvbridge", "nixl": "nixl",
         "mooncake": "mooncake"}
YARDSTICKS = ("memcpy", "memcpy-mt", "tcp-raw")
PAGES_BYTES = 64 << 20
CASES = [  # name, pages, fields, bytes per span, page pattern (bench/pages_vs_batch.py)
    ("64p x 8f x 16KiB, runs", 64, 8, 16 << 10, "runs"),
    ("64p x 8f x 16KiB, scattered", 64, 8, 16 << 10, "scattered"),
    ("256p x 8f x 128B, runs", 256, 8, 128, "runs"),
    ("256p x 8f x 128B, scattered", 256, 8, 128, "scattered"),
]


# ------------------------------------------------------------ stand-in proof
def standin_calls():
    """Calls into the libcuda.so.1 stand-in so far in this process; None when
    no stand-in is loaded (kvbridge, NIXL, a real driver)."""
    try:
        lib = ctypes.CDLL("libcuda.so.1", mode=os.RTLD_NOLOAD)
        return int(ctypes.CFUNCTYPE(ctypes.c_ulong)(("kvb_standin_calls", lib))())
    except (OSError, AttributeError):
        return None


def standin_detail():
    """{entry point: calls} of the stand-in in this process (non-zero only)."""
    try:
        lib = ctypes.CDLL("libcuda.so.1", mode=os.RTLD_NOLOAD)
        lib.kvb_standin_name.restype = ctypes.c_char_p
        lib.kvb_standin_count.restype = ctypes.c_ulong
        out = {}
        for i in range(lib.kvb_standin_nsyms()):
            c = lib.kvb_standin_count(i)
            if c:
                out[lib.kvb_standin_name(i).decode()] = c
        return out
    except (OSError, AttributeError):
        return None


def module_origin():
    m = sys.modules.get("mooncake.engine")
    if m is None:
        return None
    return {"file": m.__file__, "drop_in": bool(getattr(sys.modules["mooncake"],
                                                        "KVBRIDGE_DROP_IN", False))}


# ------------------------------------------------------------ engines
def mc_engine(impl, lane):
    from mooncake.engine import TransferEngine
    origin = module_origin()
    if origin["drop_in"] != (impl == "kvbridge"):
        raise RuntimeError(f"{impl} loaded the wrong mooncake.engine: {origin}")
    e = TransferEngine()
    proto = {"tcp": "tcp", "shm": "shm"}.get(lane, "rdma")
    if e.initialize(HOST, "P2PHANDSHAKE", proto, "") != 0:
        raise RuntimeError("initialize failed")
    return e


def mc_buffer(impl, e, n):
    """(address, numpy view, keepalive) of n bytes the engine can move."""
    addr = e.allocate_managed_buffer(n)
    if addr == 0:
        raise RuntimeError("allocate_managed_buffer returned 0")
    return addr, np.ctypeslib.as_array((ctypes.c_uint8 * n).from_address(addr)), None


# ------------------------------------------------------------ target side
def target_main(impl, lane, mode, ws):
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # library chatter on stdout must not reach the pipe
    keep = None
    if impl in MOONCAKE_LIKE:
        try:
            e = mc_engine(impl, lane)
            addr, buf, keep = mc_buffer(impl, e, ws)
        except Exception as ex:
            print(json.dumps({"error": f"target: {ex}"}), file=out, flush=True)
            return
        hello = {"sid": f"{HOST}:{e.get_rpc_port()}", "addr": addr}
    elif impl == "nixl":
        agent, buf, hello = nixl_target(ws)
    else:  # tcp-raw sink
        buf = np.zeros(ws, np.uint8)
        ls = socket.socket()
        ls.bind((HOST, 0))
        ls.listen(4)
        hello = {"port": ls.getsockname()[1]}
    if mode == "read":
        buf[:] = np.random.default_rng(11).integers(0, 256, ws, np.uint8)
    else:
        buf[:] = 0  # the owner's pages exist before any writer maps them
    hello["standin"] = standin_calls()
    print(json.dumps(hello), flush=True, file=out)
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["op"] == "digest":
            a = cmd.get("off", 0)
            n = cmd.get("len", ws)
            rep = hashlib.sha256(memoryview(buf[a:a + n])).hexdigest()
        elif cmd["op"] == "zero":
            buf[:] = 0
            rep = "ok"
        elif cmd["op"] == "standin":
            rep = {"calls": standin_calls(), "detail": standin_detail()}
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
    del keep


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
    def __init__(self, impl, lane, mode, ws, env=None):
        t0 = time.perf_counter()
        self.p = subprocess.Popen([sys.executable, __file__, "target", impl, lane, mode, str(ws)],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                  env=env)
        self.hello = self.read(READY_S)
        self.ready_s = time.perf_counter() - t0
        if "error" in self.hello:
            self.close()
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
    """Mooncake's engine (0.3.14, 0.3.13, TokenSpeed's) or kvbridge's drop-in:
    the same calls."""

    def __init__(self, impl, lane, ws):
        self.e = mc_engine(impl, lane)
        self.src, self.view, self.keep = mc_buffer(impl, self.e, ws)

    def connect(self, t):
        self.sid, self.dst = t.hello["sid"], t.hello["addr"]

    def move(self, op, srcs, dsts, lens):
        # Mooncake's TCP lane refuses a batch of 8192 blocks (its lane queue
        # fills: "TCP lane queue-full rejection"), so every implementation
        # gets at most BATCH blocks per call.
        call = (self.e.batch_transfer_sync_write if op == "write"
                else self.e.batch_transfer_sync_read)
        for i in range(0, len(srcs), BATCH):
            rc = call(self.sid, srcs[i:i + BATCH], dsts[i:i + BATCH], lens[i:i + BATCH])
            if rc != 0:
                raise RuntimeError(f"batch_transfer_sync_{op} returned {rc}")


class NixlWriter:
    def __init__(self, impl, lane, ws):
        self.agent = nixl_agent_new("writer")
        self.view = np.zeros(ws, np.uint8)
        nixl_register(self.agent, self.view)
        self.src = self.view.ctypes.data

    def connect(self, t):
        self.peer = self.agent.add_remote_agent(bytes.fromhex(t.hello["meta"]))
        t.ask({"op": "nixl_peer", "meta": self.agent.get_agent_metadata().hex()})
        self.dst = t.hello["addr"]

    def move(self, op, srcs, dsts, lens):
        # The descriptor lists are built once per block list (in the cold
        # pass), as a serving engine would keep them; a transfer per pass.
        if getattr(self, "key", None) != id(srcs):
            self.key = id(srcs)
            self.local = self.agent.get_xfer_descs([(s, n, 0) for s, n in zip(srcs, lens)],
                                                   "DRAM")
            self.remote = self.agent.get_xfer_descs([(d, n, 0) for d, n in zip(dsts, lens)],
                                                    "DRAM")
        h = self.agent.initialize_xfer(op.upper(), self.local, self.remote, self.peer)
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


def sha(a):
    return hashlib.sha256(memoryview(np.ascontiguousarray(a))).hexdigest()


def expected_write(view, perm, bs):
    n = len(perm)
    out = np.zeros(view.size, np.uint8)
    out[: n * bs].reshape(n, bs)[perm] = view[: n * bs].reshape(n, bs)
    return sha(out)


def expected_read(ws, perm, bs):
    n = len(perm)
    tgt = np.random.default_rng(11).integers(0, 256, ws, np.uint8)  # target_main's bytes
    out = np.zeros(ws, np.uint8)
    out[: n * bs].reshape(n, bs)[:] = tgt[: n * bs].reshape(n, bs)[perm]
    return sha(out)


def writer_class(impl):
    return NixlWriter if impl == "nixl" else MooncakeWriter


def standin_mark(t):
    return {"writer": standin_calls(), "target": t.ask({"op": "standin"})["calls"]}


def standin_delta(a, b):
    return {k: (None if a[k] is None or b[k] is None else b[k] - a[k]) for k in a}


def run_row(impl, lane, op, ws, bs, reps):
    """One fresh target: cold pass, reps timed passes, verification."""
    row = {"impl": impl, "lane": lane, "op": op, "block": bs, "bytes": ws // bs * bs}
    t0 = time.perf_counter()
    w = writer_class(impl)(impl, lane, ws)
    row["writer_setup_s"] = time.perf_counter() - t0
    row["module"] = module_origin()
    t = Target(impl, lane, op, ws)
    row["target_ready_s"] = t.ready_s
    try:
        w.connect(t)
        srcs, dsts, lens, perm = blocks(w, ws, bs, bs)
        rng = np.random.default_rng(7)
        m0 = standin_mark(t)
        row["standin_setup"] = {"writer": m0["writer"], "target": t.hello.get("standin")}
        times = []
        for r in range(reps + 1):
            if op == "write":
                w.view[:] = rng.integers(0, 256, ws, np.uint8)  # fresh bytes every pass
            else:
                w.view[:] = 0  # a read must bring every byte back
            t1 = time.perf_counter()
            try:
                w.move(op, srcs, dsts, lens)
            except NotImplementedError as e:
                if r:
                    raise
                row["na"] = "NotImplementedError"
                row["why"] = str(e)[:200]
                return row
            times.append(time.perf_counter() - t1)
        m1 = standin_mark(t)
        row["standin_timed"] = standin_delta(m0, m1)
        row["cold_gbps"] = row["bytes"] / times[0] / 1e9
        row["gbps"] = row["bytes"] / statistics.median(times[1:]) / 1e9
        if op == "write":
            row["verified"] = t.ask({"op": "digest"}) == expected_write(w.view, perm, bs)
        else:
            row["verified"] = sha(w.view) == expected_read(ws, perm, bs)
        if any(v for v in row["standin_timed"].values()):
            row["standin_detail"] = {"writer": standin_detail(),
                                     "target": t.ask({"op": "standin"})["detail"]}
    except Exception as e:  # the row records why
        row["error"] = f"{type(e).__name__}: {e}"[:300]
    finally:
        t.close()
    return row


# ------------------------------------------------------------ pages rows
def grid(src_ptr, dst_ptr, pages, fields, span, pattern, rng):
    """fields rows and page arrays: field f owns a region of 2 * pages page
    slots on each side; page stride = span rounded up to 4 KiB / 256 B
    (also bench/pages_vs_batch.py's)."""
    stride = span if span >= 4096 else 256
    region = 2 * pages * stride
    if pattern == "runs":  # 4 runs of consecutive pages on both sides
        sp = np.concatenate([np.arange(k * pages // 4, (k + 1) * pages // 4) + k * 3
                             for k in range(4)])
        dp = sp + pages // 2
    else:
        sp = rng.choice(2 * pages, pages, replace=False)
        dp = rng.choice(2 * pages, pages, replace=False)
    f = np.array([[src_ptr + k * region, stride, dst_ptr + k * region, stride, span]
                  for k in range(fields)], dtype=np.int64)
    return sp.astype(np.int64), dp.astype(np.int64), f, fields * region


def quant(ts):
    q = statistics.quantiles(ts, n=10) if len(ts) >= 2 else [ts[0]] * 9
    return {"med_us": statistics.median(ts) * 1e6, "p10_us": q[0] * 1e6, "p90_us": q[-1] * 1e6}


def pages_row(impl, lane, rounds):
    """Every CASE: write phase (pages call vs batch call, alternating), each
    call kind verified alone; then the read phase likewise."""
    row = {"impl": impl, "lane": lane, "op": "pages", "rounds": rounds, "cases": []}
    w = MooncakeWriter(impl, lane, PAGES_BYTES)
    row["module"] = module_origin()
    t = Target(impl, lane, "pages", PAGES_BYTES)
    try:
        w.connect(t)
        e, sid, base = w.e, w.sid, w.src
        w.view[:] = np.random.default_rng(1).integers(0, 256, PAGES_BYTES, np.uint8)
        orig = w.view.copy()
        rng = np.random.default_rng(2)
        mb = BATCH  # spans per submitted batch, both calls (Mooncake's tcp queue)
        m0 = standin_mark(t)
        row["standin_setup"] = {"writer": m0["writer"], "target": t.hello.get("standin")}
        for name, pages, fields, span, pattern in CASES:
            sp, dp, f, used = grid(base, w.dst, pages, fields, span, pattern, rng)
            srcs = [int(r[0] + s * r[1]) for r in f for s in sp]  # field-major, as the grid
            dsts = [int(r[2] + d * r[3]) for r in f for d in dp]
            lens = [span] * len(srcs)
            nbytes = pages * fields * span
            case = {"case": name, "spans": len(srcs), "bytes": nbytes}
            # the target image a write must leave / the local image a read must
            img_w = np.zeros(used, np.uint8)
            img_r = np.zeros(used, np.uint8)
            for s, d in zip(srcs, dsts):
                img_w[d - w.dst:d - w.dst + span] = orig[s - base:s - base + span]
                img_r[s - base:s - base + span] = orig[s - base:s - base + span]
            want_w, want_r = sha(img_w), sha(img_r)
            for op in ("write", "read"):
                if op == "write":
                    a_call = lambda: e.batch_transfer_sync_write_pages(sid, sp, dp, f, mb)  # noqa
                    b_fn = e.batch_transfer_sync_write
                else:
                    a_call = lambda: e.batch_transfer_sync_read_pages(sid, sp, dp, f, mb)  # noqa
                    b_fn = e.batch_transfer_sync_read

                def b_call():
                    for i in range(0, len(srcs), BATCH):
                        rc = b_fn(sid, srcs[i:i + BATCH], dsts[i:i + BATCH], lens[i:i + BATCH])
                        if rc != 0:
                            return rc
                    return 0
                res = {}
                try:
                    ta, tb = [], []
                    for _ in range(3):  # warm-up: connection, mappings
                        for c in (a_call, b_call):
                            if c() != 0:
                                raise RuntimeError("warm-up call failed")
                    for _ in range(rounds):
                        t1 = time.perf_counter()
                        rca = a_call()
                        t2 = time.perf_counter()
                        rcb = b_call()
                        t3 = time.perf_counter()
                        if rca or rcb:
                            raise RuntimeError(f"pages {rca} / batch {rcb}")
                        ta.append(t2 - t1)
                        tb.append(t3 - t2)
                    for label, c in (("pages", a_call), ("batch", b_call)):
                        if op == "write":
                            t.ask({"op": "zero"})
                            ok = c() == 0 and t.ask({"op": "digest", "len": used}) == want_w
                        else:
                            w.view[:used] = 0
                            ok = c() == 0 and sha(w.view[:used]) == want_r
                        res[label + "_verified"] = bool(ok)
                    if op == "read":
                        w.view[:] = orig
                    res["pages"] = quant(ta)
                    res["batch"] = quant(tb)
                    res["batch_over_pages"] = statistics.median(tb) / statistics.median(ta)
                except NotImplementedError:
                    res = {"na": "NotImplementedError"}
                    w.view[:] = orig
                except Exception as ex:
                    res = {"error": f"{type(ex).__name__}: {ex}"[:300]}
                    w.view[:] = orig
                case[op] = res
            row["cases"].append(case)
        row["standin_timed"] = standin_delta(m0, standin_mark(t))
    except Exception as ex:
        row["error"] = f"{type(ex).__name__}: {ex}"[:300]
    finally:
        t.close()
    return row


# ------------------------------------------------------------ yardsticks
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
    return {"impl": "memcpy", "lane": "-", "op": "copy", "block": bs, "bytes": n * bs,
            "gbps": n * bs / statistics.median(times[1:]) / 1e9, "verified": True}


def memcpy_mt_row(ws, bs, reps):
    lib = os.environ.get("SBS_COPY_LIB", "")
    threads = os.cpu_count() or 1
    row = {"impl": "memcpy-mt", "lane": "-", "op": "copy", "block": bs, "threads": threads}
    if not lib:
        row["error"] = "SBS_COPY_LIB unset (bench/sbs_copy.c not built)"
        return row
    f = ctypes.CDLL(lib).sbs_copy
    f.restype = ctypes.c_double
    f.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t,
                  ctypes.c_size_t, ctypes.c_int]
    src = np.random.default_rng(1).integers(0, 256, ws, np.uint8)
    dst = np.zeros(ws, np.uint8)
    n = ws // bs
    perm = np.random.default_rng(bs).permutation(n).astype(np.int64)
    times = [f(dst.ctypes.data, src.ctypes.data, perm.ctypes.data, n, bs, threads)
             for _ in range(reps + 1)]
    want = np.zeros(ws, np.uint8)
    want[: n * bs].reshape(n, bs)[perm] = src[: n * bs].reshape(n, bs)
    row.update(bytes=n * bs, gbps=n * bs / statistics.median(times[1:]) / 1e9,
               verified=bool(np.array_equal(dst, want)))
    return row


def tcp_row(ws, reps):
    t = Target("tcp-raw", "tcp", "write", ws)
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
    return {"impl": "tcp-raw", "lane": "tcp", "op": "copy", "block": ws, "bytes": ws,
            "gbps": ws / statistics.median(times[1:]) / 1e9, "verified": True}


# ------------------------------------------------------------ driver
def impl_python(impl):
    """The interpreter of one implementation's processes (its venv)."""
    key = {"mc14": "MC14", "mc13": "MC13", "nixl": "MC13", "tsmc": "TSMC",
           "kvbridge": "KVB"}[impl]
    return os.environ.get(f"SBS_PY_{key}") or sys.executable


def impl_env(impl):
    """The environment of one implementation's processes: Mooncake's own
    module must not see the drop-in on the path; the drop-in must; only
    Mooncake's CUDA wheels get the libcuda.so.1 stand-in's folder."""
    env = dict(os.environ)
    compat = env.get("SBS_COMPAT", "")
    env.pop("PYTHONPATH", None)
    if impl == "kvbridge":
        env["PYTHONPATH"] = compat
    standin = {"mc14": env.get("SBS_LD_MC14"), "tsmc": env.get("SBS_LD_TSMC")}.get(impl)
    if impl == "tsmc":
        # Its "tcp" engine also installs the NVLink transport, which refuses
        # every registration (managed buffers included) without a driver:
        # MC_FORCE_TCP=1 (Mooncake's own switch) leaves the TCP transport
        # alone; without it the NVLink transport's refusal is where the
        # stand-in sees a call (cuMemGetAddressRange_v2).
        env["MC_FORCE_TCP"] = "1"
    if standin:
        env["LD_LIBRARY_PATH"] = standin + (":" + env["LD_LIBRARY_PATH"]
                                            if env.get("LD_LIBRARY_PATH") else "")
    return env


def child(impl, lane, args, timeout=900):
    env = impl_env(impl)
    if impl == "nixl" and lane == "tcp":
        env["UCX_TLS"] = "tcp"
    cmd = [impl_python(impl), __file__] + args
    try:
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"impl": impl, "lane": lane, "error": f"timed out after {timeout} s"}
    try:
        return json.loads(p.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        tail = (p.stderr or "").strip().splitlines()[-3:]
        return {"impl": impl, "lane": lane, "error": f"exit {p.returncode}: "
                f"{' | '.join(tail)[:300]}"}


def run(out, ws, sizes, reps, rounds, ops, pages_rounds, only):
    plan = [("mc14", "tcp"), ("kvbridge", "tcp"), ("kvbridge", "same-host"),
            ("mc13", "tcp"), ("tsmc", "tcp"), ("nixl", "same-host"), ("nixl", "tcp")]
    plan = [p for p in plan if p[0] in only]
    rows = []
    meta = {"ws": ws, "reps": reps, "rounds": rounds, "ops": ops, "pages_rounds": pages_rounds,
            "sizes": sizes, "batch": BATCH, "cpus": os.cpu_count(),
            "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
            "load_start": os.getloadavg()}

    def keep(row, rnd):
        row["round"] = rnd
        print(json.dumps(row), file=sys.stderr, flush=True)
        rows.append(row)

    for rnd in range(rounds):
        order = plan if rnd % 2 == 0 else plan[::-1]  # alternate A/B between rounds
        for bs in sizes:
            keep(memcpy_row(ws, bs, reps), rnd)
            keep(memcpy_mt_row(ws, bs, reps), rnd)
        keep(tcp_row(ws, reps), rnd)
        for op in ops:
            for bs in sizes:
                for impl, lane in order:
                    row = child(impl, lane, ["row", impl, lane, op, str(ws), str(bs), str(reps)])
                    row.setdefault("op", op)
                    row.setdefault("block", bs)
                    keep(row, rnd)
        if pages_rounds:
            for impl, lane in order:
                if impl in ("nixl", "mc13"):  # no pages call (0.3.13 has none)
                    continue
                row = child(impl, lane, ["pages", impl, lane, str(pages_rounds)])
                row.setdefault("op", "pages")
                keep(row, rnd)
    meta["load_end"] = os.getloadavg()
    meta["ended"] = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    with open(out, "w") as f:
        json.dump({**meta, "rows": rows}, f, indent=1)


def row_main(fn, *args):
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    try:
        row = fn(*args)
    except Exception as e:
        row = {"impl": args[0], "lane": args[1], "error": f"{type(e).__name__}: {e}"[:300]}
    print(json.dumps(row), file=out, flush=True)


# ------------------------------------------------------------ table
def size_name(b):
    return f"{b >> 20} MiB" if b >= 1 << 20 else f"{b >> 10} KiB"


def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def col_name(impl, lane):
    return f"{LABEL.get(impl, impl)} {lane}"


def table(path):
    with open(path) as f:
        d = json.load(f)
    rows = d["rows"]
    rounds = d.get("rounds", 1)
    print(f"Run {d.get('started', '?')} – {d.get('ended', '?')}; working set "
          f"{d['ws'] >> 20} MiB, {d['reps']} timed passes per cell (median), {rounds} "
          f"round(s) (cells: median over rounds; ratios: per round, then median); "
          f"{d.get('cpus', '?')} CPUs; load average {d.get('load_start')} → "
          f"{d.get('load_end')}.\n")

    def by(impl, lane, op, bs, rnd=None):
        return [r for r in rows if r["impl"] == impl and r.get("lane") == lane
                and r.get("op", "copy" if impl in YARDSTICKS else "write") == op
                and r.get("block") == bs
                and (rnd is None or r.get("round", 0) == rnd)]

    def gb(impl, lane, op, bs, rnd=None, key="gbps"):
        return med([r.get(key) for r in by(impl, lane, op, bs, rnd)
                    if "error" not in r and "na" not in r and r.get("verified")])

    sizes = sorted({r["block"] for r in rows if r["impl"] == "memcpy"})
    cols = list(dict.fromkeys((r["impl"], r["lane"]) for r in rows
                              if r["impl"] in MOONCAKE_LIKE + ("nixl", "mooncake")
                              and r.get("op", "write") in ("write", "read")))
    tcp = gb("tcp-raw", "tcp", "copy", d["ws"])
    notes = {}
    ref = ("mc14", "tcp") if ("mc14", "tcp") in cols else None
    for op in ("write", "read"):
        if not any(r.get("op", "write") == op for r in rows if r["impl"] in MOONCAKE_LIKE):
            continue
        print(f"### Blocks, {op}: `batch_transfer_sync_{op}`\n")
        print("Cell: steady GB/s (ratio to the yardstick: all-core memcpy on same-host lanes, "
              "raw TCP on tcp lanes; cold = the first pass)." +
              (" Last columns: kvbridge ÷ Mooncake 0.3.14 tcp, per round." if ref else "") + "\n")
        kcols = [c for c in cols if c[0] == "kvbridge"] if ref else []
        print("| block | memcpy 1 thread | memcpy all cores | raw TCP | " +
              " | ".join(col_name(*c) for c in cols) +
              "".join(f" | {col_name(*c)} ÷ mc14" for c in kcols) + " |")
        print("|---" * (len(cols) + 4 + len(kcols)) + "|")
        for bs in sizes:
            cells = []
            for impl, lane in cols:
                rs = by(impl, lane, op, bs)
                if not rs:
                    cells.append("")
                    continue
                na = [r for r in rs if "na" in r]
                if na:
                    cells.append(f"n/a ({na[0]['na']})")
                    continue
                bad = [r for r in rs if "error" in r or not r.get("verified")]
                for r in bad:
                    notes.setdefault((impl, lane, op), r.get("error", "bytes NOT verified"))
                g = gb(impl, lane, op, bs)
                if g is None:
                    cells.append("–")
                    continue
                base = tcp if lane == "tcp" else (gb("memcpy-mt", "-", "copy", bs)
                                                  or gb("memcpy", "-", "copy", bs))  # old JSON
                cold = gb(impl, lane, op, bs, key="cold_gbps")
                st = [v for r in rs for v in (r.get("standin_timed") or {}).values() if v]
                flag = " **stand-in called**" if st else ""
                flag += f" ({len(bad)}/{len(rs)} rounds failed)" if bad else ""
                ratio = f"{g / base:.2f}x; " if base else ""
                cells.append(f"{g:.2f} ({ratio}cold {cold:.2f}){flag}")
            for c in kcols:
                rats = []
                for rnd in range(rounds):
                    a, b = gb(*c, op, bs, rnd), gb(*ref, op, bs, rnd)
                    rats.append(a / b if a and b else None)
                m = med(rats)
                cells.append(f"**{m:.2f}x**" if m else "–")
            m1, mt = gb("memcpy", "-", "copy", bs), gb("memcpy-mt", "-", "copy", bs)
            print(f"| {size_name(bs)} | {m1:.2f} | " + (f"{mt:.2f}" if mt else "–") +
                  f" | {tcp:.2f} | " + " | ".join(cells) + " |")
        print()
    prow = [r for r in rows if r.get("op") == "pages"]
    if prow:
        pcols = list(dict.fromkeys((r["impl"], r["lane"]) for r in prow))
        names = [c[0] for c in CASES]
        for op in ("write", "read"):
            print(f"### Pages, {op}: `batch_transfer_sync_{op}_pages` (A) vs "
                  f"`batch_transfer_sync_{op}` with the same spans (B)\n")
            print("Cell: median µs per call over rounds (p10–p90 of the last round), GB/s; "
                  "B÷A = plain batch time over pages time, within each round.\n")
            print("Last column: Mooncake 0.3.14's time ÷ this implementation's, the same call "
                  "(pages / plain batch), per round then median: above 1 = faster than "
                  "Mooncake 0.3.14.\n")
            print("| case | impl lane | pages call | plain batch, same spans | B÷A | verified "
                  "| mc14 time ÷ this (pages; batch) |")
            print("|---|---|---|---|---|---|---|")

            def case_of(r, name):
                return next((c.get(op, {}) for c in r.get("cases", []) if c["case"] == name), {})
            for name in names:
                for impl, lane in pcols:
                    cs = [c.get(op, {}) for r in prow if r["impl"] == impl and r["lane"] == lane
                          for c in r.get("cases", []) if c["case"] == name]
                    errs = [r.get("error") for r in prow if r["impl"] == impl
                            and r["lane"] == lane and "error" in r]
                    if not cs:
                        print(f"| {name} | {col_name(impl, lane)} | – | – | – | "
                              f"{(errs or ['no data'])[0][:120]} | |")
                        continue
                    if any("na" in c for c in cs):
                        print(f"| {name} | {col_name(impl, lane)} | n/a (NotImplementedError) "
                              f"| | | | |")
                        continue
                    good = [c for c in cs if "pages" in c]
                    if not good:
                        err = next((c.get("error") for c in cs if "error" in c), "?")
                        print(f"| {name} | {col_name(impl, lane)} | – | – | – | {err[:160]} | |")
                        continue
                    nb = next(c2["bytes"] for r in prow for c2 in r.get("cases", [])
                              if c2["case"] == name)
                    cell = []
                    for k in ("pages", "batch"):
                        m = med([c[k]["med_us"] for c in good])
                        last = good[-1][k]
                        cell.append(f"{m:.0f} µs ({last['p10_us']:.0f}–{last['p90_us']:.0f}), "
                                    f"{nb / m / 1e3:.2f} GB/s")
                    ba = med([c["batch_over_pages"] for c in good])
                    ver = all(c.get("pages_verified") and c.get("batch_verified") for c in good)
                    fails = len(cs) - len(good)
                    vs = []
                    for k in ("pages", "batch"):
                        rats = []
                        for rnd in range(rounds):
                            mine = [case_of(r, name) for r in prow if r["impl"] == impl and
                                    r["lane"] == lane and r.get("round", 0) == rnd]
                            ref = [case_of(r, name) for r in prow if r["impl"] == "mc14" and
                                   r["lane"] == "tcp" and r.get("round", 0) == rnd]
                            if mine and ref and k in mine[0] and k in ref[0]:
                                rats.append(ref[0][k]["med_us"] / mine[0][k]["med_us"])
                        m = med(rats)
                        vs.append(f"{m:.2f}x" if m else "–")
                    vs_cell = "" if (impl, lane) == ("mc14", "tcp") else "; ".join(vs)
                    print(f"| {name} | {col_name(impl, lane)} | {cell[0]} | {cell[1]} | "
                          f"{ba:.2f}x | {'yes' if ver else '**NO**'}"
                          f"{f' ({fails} rounds failed)' if fails else ''} | {vs_cell} |")
            print()
    # the stand-in: calls seen per implementation, setup and timed passes apart
    sl = [r for r in rows if r["impl"] in ("mc14", "tsmc")]
    if sl:
        print("### libcuda.so.1 stand-in: calls counted\n")
        for impl in dict.fromkeys(r["impl"] for r in sl):
            rs = [r for r in sl if r["impl"] == impl and "standin_timed" in r]
            setup = [v for r in rs for v in (r.get("standin_setup") or {}).values()]
            timed = [v for r in rs for v in r["standin_timed"].values()]
            print(f"- {LABEL[impl]}: {len(rs)} rows with counters (writer and target each); "
                  f"calls during setup (import, initialize, buffers): max "
                  f"{max(setup) if setup else '?'}; calls during the timed passes (cold pass "
                  f"included): total {sum(v or 0 for v in timed)}"
                  f"{'' if all(v == 0 for v in timed) else ' (some counters missing)' if None in timed else ''}.")
        print()
    for (i, l, op), e in notes.items():
        print(f"{col_name(i, l)} {op}: {e}\n")


if __name__ == "__main__":
    a = sys.argv
    if a[1] == "target":
        target_main(a[2], a[3], a[4], int(a[5]))
    elif a[1] == "row":
        row_main(run_row, a[2], a[3], a[4], int(a[5]), int(a[6]), int(a[7]))
    elif a[1] == "pages":
        row_main(pages_row, a[2], a[3], int(a[4]))
    elif a[1] == "table":
        table(a[2])
    else:
        args = {"--ws": "256", "--sizes": "32768,262144,1048576,4194304", "--reps": "3",
                "--rounds": "3", "--ops": "write,read", "--pages-rounds": "50",
                "--only": "mc14,kvbridge"}
        for k, v in zip(a[3::2], a[4::2]):
            if k not in args:
                sys.exit(f"side_by_side.py: unknown option {k}")
            args[k] = v
        run(a[2], int(args["--ws"]) << 20, [int(x) for x in args["--sizes"].split(",")],
            int(args["--reps"]), int(args["--rounds"]), args["--ops"].split(","),
            int(args["--pages-rounds"]), [x for x in args["--only"].split(",") if x])
