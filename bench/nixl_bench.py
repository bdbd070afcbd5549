"""Side by side inside NIXL: backend UCX (NIXL's own plug-in from the PyPI
wheel nixl-cu12 1.5.1) against backend KVBRIDGE (libplugin_KVBRIDGE.so),
both driven by NIXL's Python agent (`nixl_agent`) the way vLLM's
NixlConnector drives it, two processes on this host, host memory (DRAM).
Driven by bench/nixl_side_by_side.sh (the venv, the plug-in folder, the
copy yardstick's library, the lock); not part of `make check`.

    python nixl_bench.py run OUT.json [--ws MiB] [--sizes 32768,...] [--reps N]
        [--rounds R] [--ops WRITE,READ] [--rows ucx:auto,kvbridge:auto,...]
        [--poll spin|sleep]
    python nixl_bench.py table OUT.json          # markdown on stdout

A row is one backend, one transport, one op, one block size, in a fresh
pair of processes (the initiator, a child of the driver, and its target):

  backend x transport  UCX auto: NIXL's UCX backend with UCX's defaults
                       (on one host: shared memory / CMA); UCX tcp: the same
                       with UCX_TLS=tcp. KVBRIDGE auto: KVBRIDGE_TRANSPORT=auto
                       (memory NIXL registers is the application's own, not
                       kvb_mem_alloc files, so the direct lane does not apply:
                       the message lane on UCX's same-host transports);
                       KVBRIDGE tcp: KVBRIDGE_TRANSPORT=tcp (message lane over
                       TCP). Each backend's environment is set only in its
                       own processes.
  op                   WRITE (initiator's buffer -> target's) or READ
                       (target's -> initiator's), NIXL's names.
  transfer             the working set (WS, 64 MiB) as WS / block descriptors:
                       local block i <-> remote block perm[i] (a seeded
                       permutation: scattered destination slots, as a paged
                       KV cache). vLLM's calls: prep_xfer_dlist once per side
                       ("NIXL_INIT_AGENT" and the remote agent), then per
                       transfer make_prepped_xfer(op, local, 0..n-1, remote,
                       perm) + transfer + check_xfer_state polled in a tight
                       loop (as nixlbench does; --poll sleep: 100 us apart,
                       a caller that leaves the CPU to the backends' own
                       threads, as vLLM's once-per-step check) +
                       release_xfer_handle.
  cold                 the first transfer after registration and the
                       metadata exchange, prep_xfer_dlist of both sides
                       included (KVBRIDGE connects to the peer here; UCX at
                       add_remote_agent): bytes / that time.
  steady               REPS further transfers (warm, repeated): bytes /
                       median time.
  check_consistency    before every pass the bytes that pass must move are
                       changed (WRITE: an 8-byte pass stamp at the head of
                       every source block; READ: the initiator's buffer
                       zeroed), outside the timing; after the timed loop the
                       destination is compared byte for byte with what the
                       last pass had to leave there (every byte of the WS).

Rounds: the whole plan runs ROUNDS times; within a round, for each
(transport, op, block size) the backends run back to back, their order
alternating from round to round (A/B, B/A). Yardsticks, every round:
memcpy-mt (glibc memcpy of the same scattered blocks on all cores,
bench/sbs_copy.c, the ceiling of a same-host copy: the auto rows' ratio)
and tcp-raw (one plain TCP stream of the WS to a sink process:
the tcp rows' ratio), both from bench/side_by_side.py. The table: medians
over rounds, ranges (min-max over rounds), ratios taken within a round
(then the median).
"""

import base64
import json
import os
import socket
import statistics
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import side_by_side as sbs  # noqa: E402 (the yardsticks)

BACKEND = {"ucx": "UCX", "kvbridge": "KVBRIDGE"}
POLL_BOUND_S = 120
POLL_SLEEP_S = 0.0001  # --poll sleep: between check_xfer_state calls


def pattern(n, seed):
    return np.frombuffer(np.random.default_rng(seed).bytes(n), np.uint8).copy()


def make_agent(name, backend):
    from nixl._api import nixl_agent, nixl_agent_config
    if backend == "ucx":  # NIXL's default agent: UCX created with its defaults
        return nixl_agent(name, nixl_agent_config(backends=["UCX"]))
    a = nixl_agent(name, nixl_agent_config(backends=[]))
    a.create_backend("KVBRIDGE", {})
    return a


def register(a, backend, buf):
    descs = a.get_reg_descs([(buf.ctypes.data, buf.nbytes, 0, "")], "DRAM")
    a.register_memory(descs, backends=[BACKEND[backend]])


class Link:
    def __init__(self, sock):
        self.f = sock.makefile("rw", buffering=1)

    def send(self, **kw):
        self.f.write(json.dumps(kw) + "\n")
        self.f.flush()

    def recv(self):
        line = self.f.readline()
        if not line:
            raise RuntimeError("peer process went away")
        return json.loads(line)


# ------------------------------------------------------------ target
def target_main(fd, backend, ws):
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # library chatter on stdout must not mix with anything
    link = Link(socket.socket(fileno=fd))
    a = make_agent("target", backend)
    buf = np.zeros(ws, np.uint8)
    register(a, backend, buf)
    link.send(meta=base64.b64encode(a.get_agent_metadata()).decode(), addr=buf.ctypes.data)
    while True:
        c = link.recv()
        if c["cmd"] == "peer":
            a.add_remote_agent(base64.b64decode(c["meta"]))
            link.send(ok=True)
        elif c["cmd"] == "fill":
            buf[:] = pattern(ws, c["seed"])
            link.send(ok=True)
        elif c["cmd"] == "zero":
            buf[:] = 0
            link.send(ok=True)
        elif c["cmd"] == "check":  # what the last WRITE pass must have left
            want = expected_write(ws, c["bs"], c["seed"], c["stamp"])
            link.send(mismatched=int(np.count_nonzero(buf != want)))
        else:
            link.send(ok=True)
            out.flush()
            os._exit(0)


# ------------------------------------------------------------ initiator
def perm_of(ws, bs):
    return np.random.default_rng(bs).permutation(ws // bs)


def stamp(buf, bs, k):
    """The pass stamp: 8 bytes at the head of every block."""
    n = buf.size // bs
    buf[: n * bs].reshape(n, bs)[:, :8] = np.frombuffer(np.uint64(k + 1).tobytes(), np.uint8)


def expected_write(ws, bs, seed, k):
    src = pattern(ws, seed)
    stamp(src, bs, k)
    n, perm = ws // bs, perm_of(ws, bs)
    out = np.zeros(ws, np.uint8)
    out[: n * bs].reshape(n, bs)[perm] = src[: n * bs].reshape(n, bs)
    return out


def expected_read(ws, bs, seed):
    tgt = pattern(ws, seed)
    n, perm = ws // bs, perm_of(ws, bs)
    out = np.zeros(ws, np.uint8)
    out[: n * bs].reshape(n, bs)[:] = tgt[: n * bs].reshape(n, bs)[perm]
    return out


def one_transfer(a, op, lh, rh, n, perm, poll):
    h = a.make_prepped_xfer(op, lh, list(range(n)), rh, perm)
    st = a.transfer(h)
    t_end = time.monotonic() + POLL_BOUND_S
    while st == "PROC" and time.monotonic() < t_end:
        if poll == "sleep":
            time.sleep(POLL_SLEEP_S)
        st = a.check_xfer_state(h)
    a.release_xfer_handle(h)
    if st != "DONE":
        raise RuntimeError(f"{op} ended {st}")


def pair_main(backend, transport, op, ws, bs, reps, poll):
    """One row: this process is the initiator; it starts the target."""
    row = {"backend": backend, "transport": transport, "op": op, "block": bs,
           "bytes": ws // bs * bs, "descs": ws // bs, "poll": poll}
    t0 = time.perf_counter()
    parent, childsock = socket.socketpair()
    p = subprocess.Popen([sys.executable, __file__, "target", str(childsock.fileno()), backend,
                          str(ws)], pass_fds=[childsock.fileno()])
    childsock.close()
    link = Link(parent)
    try:
        a = make_agent("initiator", backend)
        buf = np.zeros(ws, np.uint8)
        register(a, backend, buf)
        hello = link.recv()
        peer = a.add_remote_agent(base64.b64decode(hello["meta"]))
        link.send(cmd="peer", meta=base64.b64encode(a.get_agent_metadata()).decode())
        link.recv()
        row["setup_s"] = time.perf_counter() - t0
        n, perm = ws // bs, [int(x) for x in perm_of(ws, bs)]
        if op == "WRITE":
            buf[:] = pattern(ws, 3)
            link.send(cmd="zero")
        else:
            link.send(cmd="fill", seed=5)
        link.recv()
        times = []
        for k in range(reps + 1):
            if op == "WRITE":
                stamp(buf, bs, k)
            else:
                buf[:] = 0
            t1 = time.perf_counter()
            if k == 0:  # cold: the descriptor lists are prepared here
                lh = a.prep_xfer_dlist("NIXL_INIT_AGENT",
                                       [(buf.ctypes.data + i * bs, bs, 0) for i in range(n)],
                                       "DRAM")
                rh = a.prep_xfer_dlist(peer, [(hello["addr"] + i * bs, bs, 0)
                                              for i in range(n)], "DRAM")
            one_transfer(a, op, lh, rh, n, perm, poll)
            times.append(time.perf_counter() - t1)
        if op == "WRITE":
            link.send(cmd="check", bs=bs, seed=3, stamp=reps)
            row["mismatched"] = link.recv()["mismatched"]
        else:
            row["mismatched"] = int(np.count_nonzero(buf != expected_read(ws, bs, 5)))
        row["verified"] = row["mismatched"] == 0
        row["total_s"] = time.perf_counter() - t0
        row["cold_s"] = times[0]
        row["cold_gbps"] = row["bytes"] / times[0] / 1e9
        row["times_s"] = times[1:]
        row["gbps"] = row["bytes"] / statistics.median(times[1:]) / 1e9
        a.release_dlist_handle(lh)
        a.release_dlist_handle(rh)
        link.send(cmd="exit")
        link.recv()
    except Exception as e:  # the row records why
        row["error"] = f"{type(e).__name__}: {e}"[:300]
    finally:
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
    return row


# ------------------------------------------------------------ driver
def pair_env(backend, transport):
    env = dict(os.environ)
    for k in ("UCX_TLS", "KVBRIDGE_TRANSPORT"):
        env.pop(k, None)
    if backend == "ucx" and transport == "tcp":
        env["UCX_TLS"] = "tcp"
    if backend == "kvbridge":
        env["KVBRIDGE_TRANSPORT"] = transport
    return env


def pair(backend, transport, op, ws, bs, reps, poll, timeout=150):
    cmd = [sys.executable, __file__, "pair", backend, transport, op, str(ws), str(bs), str(reps),
           poll]
    base = {"backend": backend, "transport": transport, "op": op, "block": bs}
    try:
        p = subprocess.run(cmd, env=pair_env(backend, transport), capture_output=True, text=True,
                           timeout=timeout)
    except subprocess.TimeoutExpired:
        return {**base, "error": f"timed out after {timeout} s"}
    try:
        return json.loads(p.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        tail = [ln for ln in (p.stderr or "").strip().splitlines() if "NIXL INFO" not in ln]
        return {**base, "error": f"exit {p.returncode}: {' | '.join(tail[-3:])[:300]}"}


def run(out, ws, sizes, reps, rounds, ops, rows_plan, poll):
    meta = {"ws": ws, "reps": reps, "rounds": rounds, "ops": ops, "sizes": sizes,
            "plan": rows_plan, "poll": poll, "cpus": os.cpu_count(),
            "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
            "load_start": os.getloadavg()}
    rows = []

    def keep(row, rnd):
        row["round"] = rnd
        print(json.dumps(row), file=sys.stderr, flush=True)
        rows.append(row)

    transports = []
    for _, tr in rows_plan:
        if tr not in transports:
            transports.append(tr)
    for rnd in range(rounds):
        for bs in sizes:
            keep(sbs.memcpy_mt_row(ws, bs, reps), rnd)
        keep(sbs.tcp_row(ws, reps), rnd)
        for tr in transports:
            backends = [b for b, t in rows_plan if t == tr]
            if rnd % 2:
                backends = backends[::-1]
            for op in ops:
                for bs in sizes:
                    for b in backends:
                        keep(pair(b, tr, op, ws, bs, reps, poll), rnd)
    meta["load_end"] = os.getloadavg()
    meta["ended"] = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    with open(out, "w") as f:
        json.dump({**meta, "rows": rows}, f, indent=1)


# ------------------------------------------------------------ table
def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def fmt(x, spec=".2f", suffix=""):
    return "-" if x is None else f"{x:{spec}}{suffix}"


def table(path):
    with open(path) as f:
        d = json.load(f)
    rows = d["rows"]
    la0, la1 = d["load_start"], d["load_end"]
    print(f"Run {d['started']} .. {d['ended']}: WS {d['ws'] >> 20} MiB per transfer, "
          f"{d['reps']} steady transfers per row, {d['rounds']} rounds, {d['cpus']} CPUs, "
          f"check_xfer_state polled {'in a tight loop' if d.get('poll', 'spin') == 'spin' else 'every 100 us'}; "
          f"load averages {la0[0]:.2f} {la0[1]:.2f} {la0[2]:.2f} at the start, "
          f"{la1[0]:.2f} {la1[1]:.2f} {la1[2]:.2f} at the end.\n")

    def pick(rnd, **kw):
        for r in rows:
            if r["round"] == rnd and all(r.get(k) == v for k, v in kw.items()):
                return r
        return None

    def yard(rnd, tr, bs):
        r = (pick(rnd, impl="tcp-raw") if tr == "tcp" else pick(rnd, impl="memcpy-mt", block=bs))
        return r.get("gbps") if r and "error" not in r else None

    def gb(r, key="gbps"):
        return r.get(key) if r and "error" not in r else None

    def size_name(b):
        return f"{b >> 20} MiB" if b >= 1 << 20 else f"{b >> 10} KiB"

    rounds = range(d["rounds"])
    print("| backend | transport | op | block | descs | steady GB/s (median) | range | "
          "x UCX (same round) | x yardstick | yardstick GB/s | cold GB/s | cold ms | "
          "bytes checked |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    errors = []
    for b, tr in d["plan"]:
        for op in d["ops"]:
            for bs in d["sizes"]:
                per = [pick(rnd, backend=b, transport=tr, op=op, block=bs) for rnd in rounds]
                vals = [gb(r) for r in per]
                good = [v for v in vals if v is not None]
                ucx = [gb(pick(rnd, backend="ucx", transport=tr, op=op, block=bs))
                       for rnd in rounds]
                y = [yard(rnd, tr, bs) for rnd in rounds]
                x_ucx = med([v / u if v and u else None for v, u in zip(vals, ucx)])
                x_y = med([v / u if v and u else None for v, u in zip(vals, y)])
                cold = [gb(r, "cold_gbps") for r in per]
                cold_ms = [r["cold_s"] * 1e3 if r and "cold_s" in r else None for r in per]
                checked = [r.get("verified") for r in per if r and "error" not in r]
                for r in per:
                    if r and "error" in r:
                        errors.append(f"{b} {tr} {op} {size_name(bs)} round {r['round']}: "
                                      f"{r['error']}")
                rng = f"{min(good):.2f}-{max(good):.2f}" if good else "-"
                ok = (f"{sum(1 for c in checked if c)}/{len(per)} rows" if checked else "-")
                ystr = "raw TCP" if tr == "tcp" else "memcpy-mt"
                print(f"| {BACKEND[b]} | {tr} | {op} | {size_name(bs)} | {d['ws'] // bs} | "
                      f"{fmt(med(vals))} | {rng} | "
                      f"{'1' if b == 'ucx' else fmt(x_ucx, '.2f', 'x')} | "
                      f"{fmt(x_y, '.2f', 'x')} | {fmt(med(y))} ({ystr}) | {fmt(med(cold))} | "
                      f"{fmt(med(cold_ms), '.1f')} | {ok} |")
    if errors:
        print("\nFailed rows:\n")
        for e in errors:
            print(f"- {e}")


def main():
    if len(sys.argv) >= 2 and sys.argv[1] == "target":
        target_main(int(sys.argv[2]), sys.argv[3], int(sys.argv[4]))
        return
    if len(sys.argv) >= 2 and sys.argv[1] == "pair":
        out = os.fdopen(os.dup(1), "w")
        os.dup2(2, 1)
        b, tr, op, ws, bs, reps, poll = sys.argv[2:9]
        row = pair_main(b, tr, op, int(ws), int(bs), int(reps), poll)
        print(json.dumps(row), file=out, flush=True)
        os._exit(0)  # the 1.5.1 wheel can crash at interpreter exit (docs/nixl.md)
    if len(sys.argv) >= 3 and sys.argv[1] == "table":
        table(sys.argv[2])
        return
    if len(sys.argv) < 3 or sys.argv[1] != "run":
        sys.exit(__doc__)
    args = sys.argv[3:]

    def opt(name, default):
        return args[args.index(name) + 1] if name in args else default

    ws = int(opt("--ws", "64")) << 20
    sizes = [int(s) for s in opt("--sizes", "32768,262144,4194304").split(",")]
    plan = [tuple(x.split(":")) for x in
            opt("--rows", "ucx:auto,kvbridge:auto,ucx:tcp,kvbridge:tcp").split(",")]
    for b, tr in plan:
        if b not in BACKEND or tr not in ("auto", "tcp"):
            sys.exit(f"nixl_bench: bad row {b}:{tr}")
    poll = opt("--poll", "spin")
    if poll not in ("spin", "sleep"):
        sys.exit(f"nixl_bench: bad --poll {poll}")
    run(sys.argv[2], ws, sizes, int(opt("--reps", "5")), int(opt("--rounds", "3")),
        opt("--ops", "WRITE,READ").split(","), plan, poll)


if __name__ == "__main__":
    main()
