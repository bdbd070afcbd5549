"""The Python bindings (python/kvbridge) driven the way seed 001's connector
is driven, across processes.

- engine: two Python processes write into each other's registered numpy
  buffers (sync and async), bytes checked by digest; out-of-bounds writes and
  writes to a killed peer come back as negative codes with a message; a C
  call that blocks lets other Python threads run (GIL released).
- connector: a bootstrap server and decode managers/receivers in the test
  process, prefill managers/senders in a child process; TP1→TP1, TP2→TP1
  (two prefill managers in one process) and TP1→TP2, chunked sends, every KV
  and aux byte checked.
- failure: the decode waits on a prefill process that is killed; within
  heartbeat interval × misses + 1 s the receiver polls Failed and
  failure_exception raises KVTransferError("Losing connection with prefill
  instance ..."). Abort reasons on both sides.
- bad arguments: wrong types, negative sizes, closed objects → ValueError /
  RuntimeError with the C message, never a crash.

The file is also the child program: `python3 test_bindings.py ROLE JSON`.
Children talk JSON lines on stdin/stdout and are killed in finally blocks.
"""

import array
import hashlib
import json
import os
import queue
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
PYDIR = os.path.join(os.path.dirname(os.path.dirname(HERE)), "python")
if PYDIR not in sys.path:
    sys.path.insert(0, PYDIR)

import kvbridge as kb  # noqa: E402
from kvb_testutil import poll_until  # noqa: E402

AUX_ITEMS, AUX_ITEM = 8, 64
MODEL = {"layers": 2, "heads": 4, "head_bytes": 16, "page": 4, "pool": 48}


# ------------------------------------------------------------------ helpers

def pattern(room, layer, kind, tokens, heads, hb):
    """Deterministic bytes of (room, layer, K/V, token, head, byte): uint8
    array of shape (len(tokens), len(heads), hb)."""
    t = np.asarray(tokens, np.uint64)[:, None, None]
    h = np.asarray(heads, np.uint64)[None, :, None]
    b = np.arange(hb, dtype=np.uint64)[None, None, :]
    x = (np.uint64((room * 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF)
         ^ np.uint64(layer << 40) ^ np.uint64(kind << 56) ^ (t << np.uint64(20))
         ^ (h << np.uint64(8)) ^ b)
    x = x ^ (x >> np.uint64(31))
    x = x * np.uint64(0xBF58476D1CE4E5B9)
    x = x ^ (x >> np.uint64(29))
    return (x & np.uint64(0xFF)).astype(np.uint8)


class Rank:
    """One rank's numpy KV pool (K layers then V layers) and aux buffer."""

    def __init__(self, m, tp, tp_size):
        self.m, self.tp, self.tp_size = m, tp, tp_size
        if tp_size <= m["heads"]:
            self.local_heads = m["heads"] // tp_size
            self.first_head = tp * self.local_heads
        else:
            self.local_heads, self.first_head = 1, tp * m["heads"] // tp_size
        self.item_len = m["page"] * self.local_heads * m["head_bytes"]
        self.kv = [np.zeros((m["pool"], m["page"], self.local_heads, m["head_bytes"]), np.uint8)
                   for _ in range(2 * m["layers"])]
        self.aux = np.zeros((AUX_ITEMS, AUX_ITEM), np.uint8)

    def kv_args(self):
        return kb.KVArgs(
            kv_data_ptrs=[b.ctypes.data for b in self.kv],
            kv_data_lens=[b.nbytes for b in self.kv],
            kv_item_lens=[self.item_len] * len(self.kv),
            aux_data_ptrs=[self.aux.ctypes.data], aux_data_lens=[self.aux.nbytes],
            aux_item_lens=[AUX_ITEM], page_size=self.m["page"], kv_head_num=self.local_heads,
            engine_rank=self.tp)

    def _expect(self, room, layer, kind, n):
        m = self.m
        heads = range(self.first_head, self.first_head + self.local_heads)
        p = pattern(room, layer, kind, np.arange(n * m["page"]), heads, m["head_bytes"])
        return p.reshape(n, m["page"], self.local_heads, m["head_bytes"])

    def fill(self, room, pages, aux):
        pages = np.asarray(pages)
        for k in range(2):
            for ll in range(self.m["layers"]):
                self.kv[k * self.m["layers"] + ll][pages] = self._expect(room, ll, k, len(pages))
        self.aux[aux] = pattern(room, 255, 2, [0], [0], AUX_ITEM).reshape(-1)

    def wrong_bytes(self, room, pages, aux):
        pages = np.asarray(pages)
        bad = 0
        for k in range(2):
            for ll in range(self.m["layers"]):
                got = self.kv[k * self.m["layers"] + ll][pages]
                bad += int(np.count_nonzero(got != self._expect(room, ll, k, len(pages))))
        bad += int(np.count_nonzero(
            self.aux[aux] != pattern(room, 255, 2, [0], [0], AUX_ITEM).reshape(-1)))
        return bad


def wait_for(fn, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = fn()
        if v:
            return v
        time.sleep(0.002)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


class Child:
    """This file run as ROLE in a subprocess; JSON lines both ways."""

    def __init__(self, role, args, env_extra=None):
        env = dict(os.environ)
        env["PYTHONPATH"] = PYDIR + os.pathsep + env.get("PYTHONPATH", "")
        env.update(env_extra or {})
        self.role = role
        self.err = tempfile.TemporaryFile()
        self.p = subprocess.Popen([sys.executable, os.path.abspath(__file__), role,
                                   json.dumps(args)], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=self.err, env=env, text=True)
        self.q = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.p.stdout:
            self.q.put(line)
        self.q.put(None)

    def stderr(self):
        self.err.seek(0)
        return self.err.read().decode(errors="replace")[-4000:]

    def expect(self, timeout=30):
        try:
            line = self.q.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"{self.role}: no answer in {timeout}s; stderr:\n{self.stderr()}")
        if line is None:
            rc = self.p.wait(timeout=10)
            raise AssertionError(f"{self.role} exited rc={rc}; stderr:\n{self.stderr()}")
        msg = json.loads(line)
        if "error" in msg:
            raise AssertionError(f"{self.role} failed:\n{msg['error']}\nstderr:\n{self.stderr()}")
        return msg

    def send(self, obj):
        self.p.stdin.write(json.dumps(obj) + "\n")
        self.p.stdin.flush()

    def close(self, timeout=15):
        """Ask it to exit cleanly; returns its exit code."""
        self.send({"cmd": "exit"})
        self.expect(timeout)
        return self.p.wait(timeout=timeout)

    def kill(self):
        if self.p.poll() is None:
            self.p.kill()
        try:
            self.p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        self.err.close()


# ------------------------------------------------------------------ child roles

def _out(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def _commands():
    for line in sys.stdin:
        if line.strip():
            yield json.loads(line)


def role_engine_peer(args):
    """An engine with a registered destination buffer; answers digests and
    writes a pattern into the parent's buffer on request."""
    n = args["len"]
    with kb.TransferEngine("127.0.0.1", 0, args.get("transport", "auto")) as eng:
        dst = np.zeros(n, np.uint8)
        src = np.arange(n, dtype=np.uint64).astype(np.uint8) ^ np.uint8(0x5A)
        eng.batch_register([dst.ctypes.data, src.ctypes.data], [n, n])
        _out({"session": eng.get_session_id(), "addr": dst.ctypes.data, "len": n})
        for c in _commands():
            if c["cmd"] == "digest":
                _out({"sha": hashlib.sha256(dst.tobytes()).hexdigest()})
            elif c["cmd"] == "write":
                # write src[off:off+len] to the parent, async then wait
                h = eng.batch_transfer_async(c["session"], [src.ctypes.data + o for o in c["offs"]],
                                             [c["dst"] + o for o in c["offs"]], c["lens"])
                st = h.wait(10)
                h.close()
                _out({"status": st})
            elif c["cmd"] == "exit":
                eng.unregister(dst.ctypes.data)
                _out({"bye": True})
                return


def role_prefill(args):
    """Prefill managers for args["tp_ranks"] of a TP args["tp_size"] prefill,
    one process. With args["bootstrap"] None it runs its own bootstrap server
    (as SGLang's prefill does). Runs rooms on command."""
    m = args["model"]
    server = None
    mgrs = []
    try:
        boot = args.get("bootstrap")
        if boot is None:
            server = kb.KVBootstrapServer("127.0.0.1", 0)
            boot = server.address
        ranks = [Rank(m, t, args["tp_size"]) for t in args["tp_ranks"]]
        for r in ranks:
            mgrs.append(kb.KVManager(r.kv_args(), "prefill", boot, attn_tp_size=args["tp_size"],
                                     attn_tp_rank=r.tp, transfer_threads=2, transfer_queues=2))
        _out({"ready": True, "bootstrap": boot, "endpoints": [g.endpoint for g in mgrs]})
        for c in _commands():
            if c["cmd"] == "exit":
                break
            if c["cmd"] != "rooms":
                continue
            results = []
            senders = []
            for spec in c["rooms"]:
                for r, g in zip(ranks, mgrs):
                    r.fill(spec["room"], spec["src"], spec["aux"])
                    senders.append((spec, kb.KVSender(g, boot, spec["room"])))
            for spec, s in senders:
                st = poll_until(s, 20, (kb.KVPoll.WaitingForInput, kb.KVPoll.Failed))
                if st != kb.KVPoll.WaitingForInput:
                    results.append({"room": spec["room"], "status": int(st),
                                    "reason": s.failure_reason()})
                    continue
                src = np.asarray(spec["src"], np.int32)
                s.init(len(src), aux_index=spec["aux"])
                cuts = [0] + spec["cuts"] + [len(src)]
                for i, (a, b) in enumerate(zip(cuts, cuts[1:])):
                    # alternate numpy and a plain buffer-protocol object
                    s.send(src[a:b] if i % 2 == 0 else array.array("i", src[a:b].tolist()))
            for spec, s in senders:
                st = poll_until(s, 20)
                results.append({"room": spec["room"], "status": int(st),
                                "reason": s.failure_reason() if st != kb.KVPoll.Success else ""})
                s.clear()
            _out({"results": results})
    finally:
        for g in mgrs:
            g.close()
        if server is not None:
            server.close()
    _out({"bye": True})


def child_main(role, args):
    try:
        {"engine_peer": role_engine_peer, "prefill": role_prefill}[role](args)
    except Exception:
        _out({"error": traceback.format_exc()})
        sys.exit(1)


# ------------------------------------------------------------------ engine

def test_engine_between_processes():
    n = 1 << 20
    peer = Child("engine_peer", {"len": n})
    try:
        info = peer.expect()
        with kb.TransferEngine("127.0.0.1", 0, connect_timeout=5, peer_timeout=2) as eng:
            src = np.random.default_rng(1).integers(0, 256, n, dtype=np.uint8)
            mine = np.zeros(n, np.uint8)
            eng.register(src.ctypes.data, n)
            eng.register(mine.ctypes.data, n)
            assert eng.get_session_id().startswith("127.0.0.1:")
            expect = np.zeros(n, np.uint8)
            # sync: 64 scattered blocks of 4 KiB, some adjacent
            rng = np.random.default_rng(2)
            offs = sorted(set(int(o) * 4096 for o in rng.choice(n // 4096, 64, replace=False)))
            srcs = [src.ctypes.data + o for o in offs]
            dsts = [info["addr"] + (n - 4096 - o) for o in offs]
            assert eng.batch_transfer_sync(info["session"], srcs, dsts, [4096] * len(offs),
                                           timeout=20) == 0
            for o in offs:
                expect[n - 4096 - o:n - o] = src[o:o + 4096]
            # async: one large block and a few odd-sized ones
            h = eng.batch_transfer_async(info["session"],
                                         [src.ctypes.data, src.ctypes.data + 7, src.ctypes.data],
                                         [info["addr"], info["addr"] + 300000 + 1,
                                          info["addr"] + n - 3],
                                         [200000, 12345, 3])
            assert h.wait(20) == 0 and h.done() and h.error == ""
            h.close()
            expect[0:200000] = src[0:200000]
            expect[300001:300001 + 12345] = src[7:7 + 12345]
            expect[n - 3:] = src[0:3]
            peer.send({"cmd": "digest"})
            assert peer.expect()["sha"] == hashlib.sha256(expect.tobytes()).hexdigest()
            # the other direction: the child writes into `mine`
            offs2, lens2 = [0, 65536, n - 10], [1000, 4096 * 3, 10]
            peer.send({"cmd": "write", "session": eng.get_session_id(), "dst": mine.ctypes.data,
                       "offs": offs2, "lens": lens2})
            assert peer.expect()["status"] == 0
            theirs = np.arange(n, dtype=np.uint64).astype(np.uint8) ^ np.uint8(0x5A)
            want = np.zeros(n, np.uint8)
            for o, ln in zip(offs2, lens2):
                want[o:o + ln] = theirs[o:o + ln]
            assert np.array_equal(mine, want)
            # out of the peer's registered memory: a negative code, nothing written
            st = eng.batch_transfer_sync(info["session"], [src.ctypes.data],
                                         [info["addr"] + n - 100], [200], timeout=10)
            assert st == -3, st  # KVB_ERR_BOUNDS
            assert eng.last_error
            peer.send({"cmd": "digest"})
            assert peer.expect()["sha"] == hashlib.sha256(expect.tobytes()).hexdigest()
            # peer dies: a bounded negative answer with a message
            peer.kill()
            t0 = time.monotonic()
            st = eng.batch_transfer_sync(info["session"], [src.ctypes.data], [info["addr"]],
                                         [4096], timeout=10)
            assert st < 0, st
            assert time.monotonic() - t0 < 12
            eng.unregister(src.ctypes.data)
            eng.batch_unregister([mine.ctypes.data])
    finally:
        peer.kill()


def test_engine_call_releases_gil():
    """A foreign call that blocks (handshake with a listener that never
    answers) lets another Python thread run."""
    lst = socket.socket()
    lst.bind(("127.0.0.1", 0))
    lst.listen(8)
    port = lst.getsockname()[1]
    ticks = [0]
    stop = threading.Event()

    def spin():
        while not stop.is_set():
            ticks[0] += 1
            time.sleep(0.001)

    th = threading.Thread(target=spin)
    try:
        with kb.TransferEngine("127.0.0.1", 0, connect_timeout=1.0, peer_timeout=1.0) as eng:
            buf = np.zeros(4096, np.uint8)
            eng.register(buf.ctypes.data, buf.nbytes)
            th.start()
            time.sleep(0.05)
            before = ticks[0]
            t0 = time.monotonic()
            st = eng.batch_transfer_sync(f"127.0.0.1:{port}", [buf.ctypes.data], [4096], [16],
                                         timeout=5)
            elapsed = time.monotonic() - t0
            assert st < 0 and eng.last_error
            assert 0.5 < elapsed < 8, elapsed  # it blocked for the handshake bound
            assert ticks[0] - before > 50, (ticks[0] - before, elapsed)  # others ran meanwhile
    finally:
        stop.set()
        if th.is_alive():
            th.join(5)
        lst.close()


# ------------------------------------------------------------------ connector

def _room_specs(first_room, n_rooms, seed):
    rng = np.random.default_rng(seed)
    pool = MODEL["pool"]
    src_free, dst_free = rng.permutation(pool), rng.permutation(pool)
    used, specs = 0, []
    for j in range(n_rooms):
        n = int(rng.integers(3, 12))
        cuts = sorted(set(int(c) for c in rng.integers(1, n, int(rng.integers(0, 3)))))
        specs.append({"room": first_room + j, "src": src_free[used:used + n].tolist(),
                      "dst": dst_free[used:used + n].tolist(), "aux": j % AUX_ITEMS,
                      "cuts": cuts})
        used += n
    return specs


def _round_trip(ptp, dtp, first_room):
    with kb.KVBootstrapServer("127.0.0.1", 0) as server:
        assert server.port > 0 and server.address.endswith(f":{server.port}")
        pre = Child("prefill", {"model": MODEL, "tp_size": ptp, "tp_ranks": list(range(ptp)),
                                "bootstrap": server.address})
        decs, mgrs = [], []
        try:
            assert pre.expect()["ready"]
            assert server.num_ranks == ptp
            for t in range(dtp):
                r = Rank(MODEL, t, dtp)
                decs.append(r)
                mgrs.append(kb.KVManager(r.kv_args(), kb.DisaggregationMode.DECODE,
                                         attn_tp_size=dtp, attn_tp_rank=t))
            specs = _room_specs(first_room, 3, seed=first_room)
            # the prefill creates its senders first (Bootstrapping until the
            # decode's transfer info arrives), then the decode pre-allocates
            pre.send({"cmd": "rooms", "rooms": [{k: s[k] for k in ("room", "src", "aux", "cuts")}
                                                 for s in specs]})
            recvs = []
            for s in specs:
                for g in mgrs:
                    rc = kb.KVReceiver(g, server.address, s["room"])
                    assert rc.poll() in (kb.KVPoll.Bootstrapping, kb.KVPoll.WaitingForInput)
                    rc.init(np.asarray(s["dst"], np.int32), aux_index=s["aux"])
                    recvs.append((s, rc))
            for s, rc in recvs:
                st = poll_until(rc, 30)
                if st != kb.KVPoll.Success:
                    rc.failure_exception()  # raises with the reason
            res = pre.expect(60)["results"]
            assert [r["status"] for r in res] == [int(kb.KVPoll.Success)] * len(res), res
            for s in specs:
                for r in decs:
                    assert r.wrong_bytes(s["room"], s["dst"], s["aux"]) == 0, (s["room"], r.tp)
            for _, rc in recvs:
                assert rc.pages_safe()  # Success: nothing can land any more
                rc.clear()
                assert rc.poll() == kb.KVPoll.Success
            assert pre.close() == 0
        finally:
            for g in mgrs:
                g.close()
            pre.kill()


def test_round_trip_tp1_to_tp1():
    _round_trip(1, 1, 100)


def test_round_trip_tp2_to_tp1():
    _round_trip(2, 1, 200)


def test_round_trip_tp1_to_tp2():
    _round_trip(1, 2, 300)


def test_in_process_shared_engine_and_abort():
    """Two managers on one caller-owned engine; abort reasons on both sides;
    closing the engine closes its managers."""
    with kb.KVBootstrapServer("127.0.0.1", 0) as server:
        eng = kb.TransferEngine("127.0.0.1", 0)
        p, d = Rank(MODEL, 0, 1), Rank(MODEL, 0, 1)
        pm = kb.KVManager(p.kv_args(), "prefill", server.address, engine=eng)
        dm = kb.KVManager(d.kv_args(), "decode", engine=eng)
        try:
            assert pm.get_session_id() == dm.get_session_id() == eng.get_session_id()
            rc = kb.KVReceiver(dm, server.address, 7)
            rc.init([1, 2, 3], aux_index=0)
            s = kb.KVSender(pm, server.address, 7)
            assert poll_until(s, 10, (kb.KVPoll.WaitingForInput,)) == kb.KVPoll.WaitingForInput
            assert not rc.pages_safe()  # running: the prefill may write
            rc.abort()
            assert poll_until(rc, 10) == kb.KVPoll.Failed
            assert rc.pages_safe()  # the prefill confirmed the abort
            try:
                rc.failure_exception()
                raise AssertionError("no exception")
            except kb.KVTransferError as e:
                assert e.bootstrap_room == 7 and "Aborted by AbortReq." in e.failure_reason
                assert str(e).startswith("KVTransferError(bootstrap_room=7): ")
            # the decode's abort reaches the prefill sender
            assert poll_until(s, 10) == kb.KVPoll.Failed
            e = raises(kb.KVTransferError, s.failure_exception)
            assert "Aborted by the decode instance" in str(e), str(e)
            assert s.poll() == kb.KVPoll.Failed  # cleared: the conclusion stays
            # an abort on the prefill side
            s2 = kb.KVSender(pm, server.address, 8)
            s2.abort()
            assert poll_until(s2, 10) == kb.KVPoll.Failed
            e = raises(kb.KVTransferError, s2.failure_exception)
            assert e.bootstrap_room == 8 and e.failure_reason == "Aborted by AbortReq."
            s3 = kb.KVSender(pm, server.address, 9)
        finally:
            eng.close()  # closes pm and dm (and s2) first
        assert pm.closed and dm.closed
        assert s3.poll() == kb.KVPoll.Failed
        raises(RuntimeError, s3.send, [1], match="cleared")


def test_close_races_other_threads():
    """Threads polling receivers and creating new ones while the manager is
    closed: every call returns a status or raises RuntimeError, no crash."""
    with kb.KVBootstrapServer("127.0.0.1", 0) as server:
        p, d = Rank(MODEL, 0, 1), Rank(MODEL, 0, 1)
        with kb.KVManager(p.kv_args(), "prefill", server.address) as pm:
            dm = kb.KVManager(d.kv_args(), "decode")
            rcs = [kb.KVReceiver(dm, server.address, 50 + i) for i in range(4)]
            for i, rc in enumerate(rcs):
                rc.init([i], aux_index=i)
            seen, errors, stop = [], [], threading.Event()

            def hammer(rc, k):
                while not stop.is_set():
                    try:
                        seen.append(rc.poll())
                        kb.KVReceiver(dm, server.address, 1000 + k * 100000 + len(seen)).clear()
                    except RuntimeError:
                        pass
                    except Exception as e:  # anything else is a defect
                        errors.append(repr(e))
                        return

            ths = [threading.Thread(target=hammer, args=(rc, k)) for k, rc in enumerate(rcs)]
            for t in ths:
                t.start()
            time.sleep(0.3)
            dm.close()
            time.sleep(0.1)
            stop.set()
            for t in ths:
                t.join(10)
            assert not any(t.is_alive() for t in ths)
            assert not errors, errors
            assert seen and all(isinstance(x, kb.KVPoll) for x in seen)
            assert all(rc.poll() == kb.KVPoll.Failed for rc in rcs)  # cleared by close


# ------------------------------------------------------------------ failure

def test_killed_prefill_fails_receiver(monkeypatch):
    interval, misses = 0.3, 2
    monkeypatch.setenv("KVBRIDGE_HEARTBEAT_FLOOR", "0.2")
    monkeypatch.setenv("KVBRIDGE_HEARTBEAT_INTERVAL", str(interval))
    monkeypatch.setenv("KVBRIDGE_HEARTBEAT_MAX_FAILURE", str(misses))
    pre = Child("prefill", {"model": MODEL, "tp_size": 1, "tp_ranks": [0], "bootstrap": None})
    mgr = None
    try:
        boot = pre.expect()["bootstrap"]
        d = Rank(MODEL, 0, 1)
        mgr = kb.KVManager(d.kv_args(), "decode")
        rc = kb.KVReceiver(mgr, boot, 11)
        rc.init(np.arange(4, dtype=np.int32), aux_index=1)
        assert rc.poll() == kb.KVPoll.WaitingForInput
        time.sleep(interval * 2)  # a few healthy heartbeats first
        assert rc.poll() == kb.KVPoll.WaitingForInput
        pre.kill()
        t0 = time.monotonic()
        st = poll_until(rc, interval * misses + 1.0)
        elapsed = time.monotonic() - t0
        assert st == kb.KVPoll.Failed, (st, elapsed)
        print(f"receiver failed {elapsed:.2f}s after the kill")
        try:
            rc.failure_exception()
            raise AssertionError("no exception")
        except kb.KVTransferError as e:
            assert e.bootstrap_room == 11
            assert "Losing connection with prefill instance" in e.failure_reason, e.failure_reason
            assert boot in e.failure_reason
        # a new receiver for the dead prefill fails too, with a reason
        rc2 = kb.KVReceiver(mgr, boot, 12)
        rc2.init([0], aux_index=0)
        assert poll_until(rc2, 10) == kb.KVPoll.Failed
        assert rc2.failure_reason()
    finally:
        if mgr is not None:
            mgr.close()
        pre.kill()


# ------------------------------------------------------------------ bad arguments

def raises(exc, fn, *a, match=None, **kw):
    try:
        fn(*a, **kw)
    except exc as e:
        if match is not None:
            assert match in str(e), (match, str(e))
        return e
    raise AssertionError(f"{fn} did not raise {exc}")


def test_bad_arguments_engine():
    raises(ValueError, kb.TransferEngine, "127.0.0.1", 0, "carrier-pigeon")
    raises(ValueError, kb.TransferEngine, "127.0.0.1", -1)
    raises(ValueError, kb.TransferEngine, "127.0.0.1", 70000)
    raises(ValueError, kb.TransferEngine, 127)
    raises(RuntimeError, kb.TransferEngine, "300.1.2.3", 0)
    eng = kb.TransferEngine()
    buf = np.zeros(8192, np.uint8)
    raises(ValueError, eng.register, "0x1000", 10)
    raises(TypeError, eng.register, 1.5, 10)
    raises(ValueError, eng.register, buf.ctypes.data, -1)
    raises(ValueError, eng.register, buf.ctypes.data, 0)
    raises(ValueError, eng.register, -4096, 10)
    raises(ValueError, eng.register, 1 << 64, 10)
    raises(ValueError, eng.batch_register, [buf.ctypes.data], [1, 2])
    raises(ValueError, eng.batch_register, [buf.ctypes.data], None)
    eng.register(buf.ctypes.data, 4096)
    e = raises(kb.KVBridgeError, eng.register, buf.ctypes.data + 100, 100)
    assert isinstance(e, RuntimeError) and e.status == -4 and "overlap" in str(e)
    e = raises(RuntimeError, eng.unregister, buf.ctypes.data + 8)
    assert e.status == -5
    raises(ValueError, eng.batch_transfer_sync, eng.get_session_id(), [1], [2, 3], [4])
    raises(ValueError, eng.batch_transfer_sync, eng.get_session_id(), [], [], [])
    raises(ValueError, eng.batch_transfer_sync, 12, [1], [2], [4])
    raises(ValueError, eng.batch_transfer_sync, eng.get_session_id(), [1], [2], [-4])
    raises(ValueError, eng.batch_transfer_sync, eng.get_session_id(), [buf.ctypes.data],
           [0], [4], timeout="soon")
    # an unreachable session: a negative code and a message, quickly
    st = eng.batch_transfer_sync("127.0.0.1:1", [buf.ctypes.data], [4096], [16], timeout=5)
    assert st < 0 and eng.last_error
    raises(RuntimeError, eng.batch_transfer_async, "not-a-session", [buf.ctypes.data], [1], [1])
    eng.close()
    eng.close()
    assert eng.closed
    raises(RuntimeError, eng.get_session_id, match="closed")
    raises(RuntimeError, eng.register, buf.ctypes.data, 16, match="closed")
    raises(RuntimeError, eng.batch_transfer_sync, "127.0.0.1:1", [1], [1], [1], match="closed")
    # the port is in use
    with kb.KVBootstrapServer("127.0.0.1", 0) as s:
        raises(RuntimeError, kb.KVBootstrapServer, "127.0.0.1", s.port)
        raises(ValueError, kb.KVBootstrapServer, "127.0.0.1", "8998")
    assert s.closed
    raises(RuntimeError, lambda: s.num_ranks)


def test_bad_arguments_connector():
    r = Rank(MODEL, 0, 1)
    a = r.kv_args()
    raises(ValueError, kb.KVManager, a, "middle")
    raises(ValueError, kb.KVManager, a, "prefill")  # no bootstrap_addr
    raises(ValueError, kb.KVManager, a, "decode", attn_tp_size=2, attn_tp_rank=2)
    raises(ValueError, kb.KVManager, a, "decode", attn_tp_size=0)
    raises(ValueError, kb.KVManager, a, "decode", is_mla="yes")
    raises(ValueError, kb.KVManager, None, "decode")
    raises(ValueError, kb.KVManager, kb.KVArgs(), "decode")
    raises(ValueError, kb.KVManager, a, "decode", engine="engine")
    raises(ValueError, kb.KVManager, a, "decode", transport="x")
    bad = r.kv_args()
    bad.kv_item_lens = [r.item_len] * 3 + [r.item_len * 2]
    raises(ValueError, kb.KVManager, bad, "decode", match="all be equal")
    bad = r.kv_args()
    bad.kv_data_lens = bad.kv_data_lens[:-1]
    raises(ValueError, kb.KVManager, bad, "decode", match="differ in length")
    bad = r.kv_args()
    bad.kv_data_ptrs = ["0x1"] * len(bad.kv_data_ptrs)
    raises(ValueError, kb.KVManager, bad, "decode")
    bad = r.kv_args()
    bad.kv_head_num = None
    raises(ValueError, kb.KVManager, bad, "decode", match="kv_head_num")
    bad = r.kv_args()
    bad.page_size = -4
    raises(ValueError, kb.KVManager, bad, "decode")
    bad = r.kv_args()
    bad.kv_head_num = 3  # item length not a multiple of page × heads: the C check
    e = raises(kb.KVBridgeError, kb.KVManager, bad, "decode")
    assert "kv_item_len" in str(e) or "MHA" in str(e), str(e)
    # prefill whose bootstrap server is gone: the C message, bounded
    s = kb.KVBootstrapServer("127.0.0.1", 0)
    dead = s.address
    s.close()
    t0 = time.monotonic()
    e = raises(RuntimeError, kb.KVManager, r.kv_args(), "prefill", dead)
    assert dead.split(":")[1] in str(e) or "bootstrap" in str(e), str(e)
    assert time.monotonic() - t0 < 15

    with kb.KVBootstrapServer("127.0.0.1", 0) as server:
        p, d = Rank(MODEL, 0, 1), Rank(MODEL, 0, 1)
        with kb.KVManager(p.kv_args(), "prefill", server.address) as pm, \
                kb.KVManager(d.kv_args(), "decode") as dm:
            raises(RuntimeError, kb.KVSender, dm, server.address, 1)  # not a prefill manager
            raises(RuntimeError, kb.KVReceiver, pm, server.address, 1)  # not a decode manager
            raises(ValueError, kb.KVReceiver, dm, server.address, None)
            raises(ValueError, kb.KVReceiver, dm, server.address, -1)
            raises(ValueError, kb.KVReceiver, dm, server.address, 1, data_parallel_rank=-2)
            raises(ValueError, kb.KVReceiver, "mgr", server.address, 1)
            raises(ValueError, kb.KVSender, pm, None, 1)
            s = kb.KVSender(pm, server.address, 5)
            raises(RuntimeError, kb.KVSender, pm, server.address, 5)  # room has a sender
            raises(ValueError, s.init, 0)
            raises(ValueError, s.init, -3)
            raises(ValueError, s.init, 4, aux_index=-1)
            s.init(4, aux_index=0)
            s.set_prefill_info(cached_tokens=16, logprob=-0.0123)  # TokenSpeed CachePD only
            raises(ValueError, s.set_prefill_info, cached_tokens=-1)
            raises(ValueError, s.set_prefill_info, logprob=float("nan"))
            raises(ValueError, s.set_prefill_info, logprob="x")
            e = raises(RuntimeError, s.send, np.array([1, 2], np.int32))
            assert "not WaitingForInput" in str(e)
            raises(ValueError, s.send, np.array([1.0, 2.0]))
            raises(ValueError, s.send, np.array([[1, 2]], np.int32))
            raises(ValueError, s.send, np.array([-1], np.int32))
            raises(ValueError, s.send, np.array([1 << 40], np.int64))
            raises(ValueError, s.send, array.array("h", [1, 2]))
            raises(ValueError, s.send, array.array("f", [1, 2]))
            raises(ValueError, s.send, "12")
            raises(ValueError, s.send, [1, "2"])
            raises(ValueError, s.send, None)
            raises(ValueError, s.send, 3)
            rc = kb.KVReceiver(dm, server.address, 5)
            raises(ValueError, rc.init, [1, 2], page_mask=[1])
            raises(ValueError, rc.init, [1, 2], prefix_tokens=-4)
            raises(ValueError, rc.init, b"\x01\x00\x00\x00")
            raises(ValueError, rc.init, [1, 2], prompt_tokens=0)
            assert rc.prefill_info() is None  # nothing said yet
            # prompt_tokens is CachePD's (a 2026 prefill here): carried, not sent
            rc.init(np.array([4, 5, 6, 7], np.int64), aux_index=2, prompt_tokens=60)
            assert poll_until(s, 10, (kb.KVPoll.WaitingForInput,)) == kb.KVPoll.WaitingForInput
            e = raises(RuntimeError, s.send, np.arange(5, dtype=np.int32))
            assert "past num_kv_indices" in str(e)
            s.send(np.arange(4, dtype=np.int32))
            assert poll_until(rc, 10) == kb.KVPoll.Success
            assert poll_until(s, 10) == kb.KVPoll.Success
            assert rc.prefill_info() is None  # SGLang's statuses carry neither
            rc.clear()
            rc.clear()
            raises(RuntimeError, rc.abort, match="cleared")
            raises(RuntimeError, rc.init, [1], match="cleared")
            assert pm.stats()["rooms"] >= 0
            lim = pm.limits()
            assert lim["wire_rooms"] == 0 and lim["registrations_impostor"] == 0
            assert lim["push_sockets"] >= 1 and lim["registration_bytes"] > 0
        raises(RuntimeError, kb.KVSender, pm, server.address, 9, match="closed")
        raises(RuntimeError, kb.KVReceiver, dm, server.address, 9, match="closed")
        raises(RuntimeError, pm.get_session_id, match="closed")
        raises(RuntimeError, lambda: dm.endpoint)
        assert s.poll() == kb.KVPoll.Success  # cleared by the manager's close
        pm.close()


def test_poll_values_and_library():
    assert [int(x) for x in (kb.KVPoll.Failed, kb.KVPoll.Bootstrapping,
                             kb.KVPoll.WaitingForInput, kb.KVPoll.Transferring,
                             kb.KVPoll.Success)] == [0, 1, 2, 3, 4]
    assert kb.version() == "0.1.0"
    assert os.path.exists(kb.library_path())
    e = kb.KVTransferError(3, "why")
    assert e.bootstrap_room == 3 and e.failure_reason == "why"
    raises(ValueError, kb.set_log_level, "loud")
    kb.set_log_level("warn")


def test_example_python_pd():
    """examples/python_pd.py runs and verifies its bytes."""
    ex = os.path.join(os.path.dirname(PYDIR), "examples", "python_pd.py")
    env = dict(os.environ)
    env["PYTHONPATH"] = PYDIR + os.pathsep + env.get("PYTHONPATH", "")
    r = subprocess.run([sys.executable, ex], env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "verified" in r.stdout
    assert len(open(ex).read().splitlines()) < 80


if __name__ == "__main__":
    child_main(sys.argv[1], json.loads(sys.argv[2]))


def test_manager_auth_and_refresh_kwargs():
    """The optional parameters past room_ttl (bootstrap token, CURVE keys,
    bootstrap refresh) reach the library at the right offsets: a wrong token
    is refused at registration, the right one plus CURVE keys on both sides
    carries a verified room."""
    import zmq
    pub, sec = zmq.curve_keypair()
    curve = dict(curve_secret_key=sec.decode(), curve_allowed_clients=pub.decode())
    with kb.KVBootstrapServer("127.0.0.1", 0, token="s3cret") as server:
        p, d = Rank(MODEL, 0, 1), Rank(MODEL, 0, 1)
        raises(Exception, kb.KVManager, p.kv_args(), "prefill", server.address,
               bootstrap_token="wrong", match="401")
        with kb.KVManager(p.kv_args(), "prefill", server.address, bootstrap_token="s3cret",
                          bootstrap_refresh=0.2, **curve) as pm, \
                kb.KVManager(d.kv_args(), "decode", bootstrap_token="s3cret", **curve) as dm:
            src, dst = [3, 1, 4], [5, 9, 2]
            p.fill(11, src, 1)
            rc = kb.KVReceiver(dm, server.address, 11)
            rc.init(dst, aux_index=2)
            s = kb.KVSender(pm, server.address, 11)
            assert poll_until(s, 10, (kb.KVPoll.WaitingForInput,)) == kb.KVPoll.WaitingForInput
            s.init(len(src), aux_index=1)
            s.send(np.asarray(src, np.int32))
            assert poll_until(rc, 10) == kb.KVPoll.Success, rc.failure_reason()
            assert d.wrong_bytes(11, dst, 2) == 0
            time.sleep(0.5)  # a few refreshes with the token: one rank, still served
            assert server.num_ranks == 1


def test_shared_memory_direct_lane():
    """A target pool from SharedMemory is written directly (one copy by the
    writer): exact bytes arrive and the session reports the direct lane;
    copy_threads=0 keeps the same write on UCX with the same bytes."""
    import numpy as np
    n = 4 << 20
    rng = np.random.default_rng(7)
    src = rng.integers(0, 256, n, dtype=np.uint8)
    with kb.TransferEngine("127.0.0.1", 0) as target, \
            kb.TransferEngine("127.0.0.1", 0) as direct, \
            kb.TransferEngine("127.0.0.1", 0, copy_threads=0) as ucx:
        pool = kb.SharedMemory(2 * n)
        dst = pool.array()
        assert dst.ctypes.data == pool.ptr and not dst.any()
        target.register(pool.ptr, pool.nbytes)
        sid = target.session_id
        for eng, want in ((direct, True), (ucx, False)):
            eng.register(src.ctypes.data, n)
            assert eng.session_direct(sid) is None
            dst[:] = 0
            # pages in reverse order, 64 KiB each, into the second half
            k = 64 << 10
            offs = list(range(0, n, k))
            eng.batch_transfer_sync(sid, [src.ctypes.data + o for o in offs],
                                    [pool.ptr + n + (n - k - o) for o in offs],
                                    [k] * len(offs))
            assert eng.session_direct(sid) is want
            got = dst[n:].reshape(-1, k)[::-1].reshape(-1)
            assert np.array_equal(got, src) and not dst[:n].any()
            eng.unregister(src.ctypes.data)
        target.unregister(pool.ptr)
        pool.close()
        raises(RuntimeError, pool.array)


def test_one_sided_reads():
    """batch_transfer_sync_read / transfer_sync_read / batch_transfer_async_read
    / read_pages (kvb_engine_read*) out of a SharedMemory pool (direct lane)
    and a plain one (message lane, copy_threads=0): exact bytes, the rest of
    the local buffer untouched; out-of-bounds reads return -3 with nothing
    read."""
    import numpy as np
    n = 1 << 20
    rng = np.random.default_rng(11)
    with kb.TransferEngine("127.0.0.1", 0) as target, \
            kb.TransferEngine("127.0.0.1", 0) as direct, \
            kb.TransferEngine("127.0.0.1", 0, copy_threads=0) as ucx:
        pool = kb.SharedMemory(n)
        remote = pool.array()
        remote[:] = rng.integers(0, 256, n, dtype=np.uint8)
        target.register(pool.ptr, n)
        sid = target.session_id
        for eng, want in ((direct, True), (ucx, False)):
            loc = np.zeros(n, np.uint8)
            eng.register(loc.ctypes.data, n)
            k = 4096
            offs = list(range(0, n // 2, k))
            assert eng.batch_transfer_sync_read(sid, [loc.ctypes.data + o for o in offs],
                                                [pool.ptr + n - k - o for o in offs],
                                                [k] * len(offs)) == 0
            assert eng.session_direct(sid) is want
            got = loc[:n // 2].reshape(-1, k)[::-1].reshape(-1)
            assert np.array_equal(got, remote[n // 2:]) and not loc[n // 2:].any()
            assert eng.transfer_sync_read(sid, loc.ctypes.data + n - 10, pool.ptr + 3, 7) == 0
            assert np.array_equal(loc[n - 10:n - 3], remote[3:10]) and not loc[n - 3:].any()
            h = eng.batch_transfer_async_read(sid, [loc.ctypes.data + n // 2], [pool.ptr], [100])
            assert h.wait(10) == 0
            h.close()
            assert np.array_equal(loc[n // 2:n // 2 + 100], remote[:100])
            fields = [[loc.ctypes.data, 512, pool.ptr, 1024, 200]]
            assert eng.read_pages(sid, [0, 1], [5, 2], fields) == 0
            assert np.array_equal(loc[0:200], remote[5120:5320])
            assert np.array_equal(loc[512:712], remote[2048:2248])
            before = loc.copy()
            assert eng.transfer_sync_read(sid, loc.ctypes.data, pool.ptr + n - 8, 16) == -3
            assert "source" in eng.last_error
            assert np.array_equal(loc, before)
            eng.unregister(loc.ctypes.data)
        target.unregister(pool.ptr)
        pool.close()


def test_state_indices_round_trip():
    """Hybrid model: two state buffers per rank; the prefill's state slots
    (KVSender.send(..., state_indices=)) land in the decode's
    (KVReceiver.init(..., state_indices=)), exact bytes, other slots untouched."""
    with kb.KVBootstrapServer("127.0.0.1", 0) as server:
        p, d = Rank(MODEL, 0, 1), Rank(MODEL, 0, 1)
        rng = np.random.default_rng(3)
        states = {r: [np.zeros((16, 96), np.uint8) for _ in range(2)] for r in ("p", "d")}

        def args(rank, st):
            a = rank.kv_args()
            a.state_data_ptrs = [b.ctypes.data for b in st]
            a.state_data_lens = [b.nbytes for b in st]
            a.state_item_lens = [96, 96]
            return a
        for b in states["p"]:
            b[:] = rng.integers(1, 256, b.shape, dtype=np.uint8)
        pm = kb.KVManager(args(p, states["p"]), "prefill", server.address)
        dm = kb.KVManager(args(d, states["d"]), "decode")
        try:
            p.fill(11, [4, 5], 1)
            rc = kb.KVReceiver(dm, server.address, 11)
            rc.init(np.array([7, 9], np.int32), aux_index=1, state_indices=[12, 3])
            s = kb.KVSender(pm, server.address, 11)
            assert poll_until(s, 10, (kb.KVPoll.WaitingForInput,)) == kb.KVPoll.WaitingForInput
            s.init(2, aux_index=1)
            s.send(np.array([4], np.int32), state_indices=np.array([2, 6], np.int32))
            s.send(np.array([5], np.int32))
            assert poll_until(rc, 20) == kb.KVPoll.Success
            assert d.wrong_bytes(11, [7, 9], 1) == 0
            for i in range(2):
                src, dst = states["p"][i], states["d"][i]
                assert np.array_equal(dst[12], src[2]) and np.array_equal(dst[3], src[6])
                others = [k for k in range(16) if k not in (12, 3)]
                assert not dst[others].any()
            raises(ValueError, s.send, [1], state_indices=[-1])
        finally:
            pm.close()
            dm.close()
