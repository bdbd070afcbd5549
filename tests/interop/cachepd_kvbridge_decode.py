"""TokenSpeed 0.1.1's own CachePD prefill (PyPI wheel, unmodified, on
kvbridge's `mooncake.engine` drop-in: `tokenspeed011_pd.py --prefill`, the
same prefill process scripts/interop-tokenspeed011.sh runs) against
kvbridge's C decode ranks (tests/integration/cachepd/cpd_decode_helper.c).
Run by scripts/interop-cachepd.sh:

    python cachepd_kvbridge_decode.py HELPER CASE

CASE: d_<c> with kvbridge's C bootstrap server (in the decode helper; the
TokenSpeed prefill registers there in CachePD's PUT shape), d_<c>_tsboot
with TokenSpeed's own (MooncakeKVBootstrapServer, in the prefill process),
for c in tokenspeed011_common.CASES: tp1 (MHA TP1 -> TP1, a 2-page decode
prefix), tp2 (TP2 -> TP1), tp1_tp2 (TP1 -> TP2), mla_tp2 (MLA TP2 -> TP1,
prefill rank 1 a dummy), tp1_layerwise (TokenSpeed's default layerwise
sends), hybrid_tp2 and hybrid (TP2 / TP1 -> TP1, the hybrid model with
state groups, tokenspeed011_common.HybridModel: the kvbridge decode ranks
are given TokenSpeed's contract of the model, at TP 1, written here from
TokenSpeed's builders, and a state slot per room), hybrid_tp2_layerwise.
The prefill records cached tokens (prefix + 7) and a logprob (-0.25) per
room, so status frames 5-6 carry values.

Checked: every room Success on both sides; what kvbridge's receivers read
from TokenSpeed's statuses (first token, no candidates, cached tokens,
logprob); every byte of every decode KV buffer (noise first, the rooms'
pages past the prefix replaced by the rank's slice of the model's pages,
computed here independently of both planners; everything else unchanged)
and, hybrid, of every state buffer (noise first, each room's state slot
replaced by the rank's rows of the room's latest snapshot of the field);
the canary gaps after every decode buffer intact.

And the faults (TokenSpeed's bootstrap server, layerwise, 0.5 s per layer so
a room's writes span seconds; the timings are logged):
  kill_prefill  kill -9 of the TokenSpeed prefill once the first write of a
                room landed: kvbridge's decode reports the room Failed with
                a reason within 15 s (heartbeats 0.5 s x 2, abort-ack
                time-out 2 s), not Success.
  kill_decode   kill -9 of the kvbridge decode once the first write landed:
                what TokenSpeed's prefill reports for the room (recorded;
                it must end, and not in Success).
"""

import os
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import tokenspeed011_common as C  # noqa: E402
from cachepd_kvbridge_prefill import pat  # noqa: E402  (kvbh_pat)

NOISE = 0xC0FFEE
POOL = 100
STATE_ITEMS = 64  # KVBH_STATE_ITEMS
KVB_SUCCESS, KVB_FAILED = 4, 0
TS_SUCCESS = 5
KILL_BOUND_S = 15.0


class Proc:
    """A child driven by lines on stdin/stdout, its output logged."""

    def __init__(self, argv, env=None, name=""):
        self.name = name
        self.p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  text=True, env=env)

    def line(self):
        s = self.p.stdout.readline()
        if not s:
            raise EOFError(f"{self.name} ended (rc {self.p.poll()})")
        print(f"[{self.name}] {s.rstrip()}", flush=True)
        return s.split()

    def until(self, word):
        while True:
            f = self.line()
            if f and f[0] == word:
                return f

    def send(self, cmd):
        self.p.stdin.write(cmd + "\n")
        self.p.stdin.flush()

    def kill9(self):
        self.p.send_signal(signal.SIGKILL)
        self.p.wait()

    def close(self):
        if self.p.poll() is None:
            try:
                self.p.stdin.close()
                self.p.wait(timeout=10)
            except (BrokenPipeError, subprocess.TimeoutExpired):
                self.p.kill()
                self.p.wait()


def start(helper, case, tsboot, env_extra, contract_file=None):
    """The decode helper and the TokenSpeed prefill, registered: (decode, prefill)."""
    kind = case.model.kind
    env = dict(os.environ, **env_extra)
    pre_argv = [sys.executable, os.path.join(HERE, "tokenspeed011_pd.py"), "--prefill",
                case.name]
    dec_argv = [helper, str(case.dtp), kind]
    if contract_file:
        dec_argv.append(f"contract={contract_file}")
    if tsboot:
        pre = Proc(pre_argv, env, "prefill")
        port = pre.until("ready")[1]
        dec = Proc(dec_argv + [f"boot={C.HOST}:{port}"], env, "decode")
        dec.until("ready")
    else:
        dec = Proc(dec_argv, env, "decode")
        boot = dec.until("boot")[1]
        dec.until("ready")
        env["KVB_TS011_BOOT_PORT"] = boot.rsplit(":", 1)[1]
        pre = Proc(pre_argv, env, "prefill")
        pre.until("ready")
    return dec, pre


def ask_rooms(dec, case):
    for room in case.rooms:
        ids = " ".join(str(i) for i in room.d_row)
        state = f" state {room.kvb_slot}" if case.model.state_fields() else ""
        dec.send(f"recv {room.room} {room.prefix_len} {room.prompt_len} {ids}{state}")
        for _ in range(case.dtp):
            f = dec.until("init")
            assert int(f[3]) != KVB_FAILED, f"room {room.room} failed at init: {f}"


def buffer_of(model, fid):
    if model.state_fields():  # hybrid: K of the full-attention layers, then V
        return model.kv_fields().index(fid)
    _, layer, kind = fid.split(".")
    return int(layer) + (model.layers if kind == "v" else 0)


def expected(case, q):
    """Decode rank q's KV buffers as they must end: noise, the rooms' pages
    past the prefix holding the rank's slice of the model's pages; then
    (hybrid) its state buffers: noise, each room's state slot holding the
    rank's rows of the room's state."""
    m = case.model
    parts, width = m.row_shape(case.dtp)
    item = m.pg * parts * width
    nbuf = len(m.kv_fields())
    k = np.arange(item, dtype=np.uint64)
    img = np.empty((nbuf, POOL, item), np.uint8)
    for b in range(nbuf):
        for p in range(POOL):
            img[b, p] = pat(NOISE, b, p, k)
    for room in case.rooms:
        for slot in range(room.prefix_len // m.pg, len(room.d_row)):
            for fid in m.kv_fields():
                data = C.rank_slice(m, C.global_page(m, room.room, slot, fid), case.dtp, q)
                img[buffer_of(m, fid), room.d_row[slot] - 1] = data.reshape(-1)
    out = [img.reshape(-1)]
    for j, fid in enumerate(m.state_fields()):
        rows, width, _ = m.state_geometry(fid)
        sitem = rows // case.dtp * width
        k = np.arange(sitem, dtype=np.uint64)
        simg = np.empty((STATE_ITEMS, sitem), np.uint8)
        for s in range(STATE_ITEMS):
            simg[s] = pat(NOISE, 32 + j, s, k)
        for room in case.rooms:
            state = C.state_slice(m, C.global_state(m, room.room, fid), fid, case.dtp, q)
            simg[room.kvb_slot] = state.reshape(-1)
        out.append(simg.reshape(-1))
    return np.concatenate(out)


def run(helper, name):
    tsboot = name.endswith("_tsboot")
    cname = name[2:-7] if tsboot else name[2:]
    case = C.CASES[cname]()
    contract_file = None
    if case.model.state_fields():  # TokenSpeed's contract of the model (TP 1)
        C.install()
        contract_file = os.path.join(os.environ.get("TMPDIR", "/tmp"),
                                     f"cpd-{name}-{os.getpid()}.json")
        with open(contract_file, "wb") as f:
            f.write(case.model.contract(1, case.d_blocks).to_wire_bytes())
    dec, pre = start(helper, case, tsboot, {"KVB_TS011_PREFILL_INFO": "1"}, contract_file)
    try:
        ask_rooms(dec, case)
        pre.send("go")
        for room in case.rooms:
            dec.send(f"wait {room.room} 60")
            for q in range(case.dtp):
                f = dec.until("done")
                assert int(f[3]) == KVB_SUCCESS, f"room {room.room} rank {q}: {f}"
                tok, nc, cached, lp = int(f[5]), int(f[6]), f[9], f[10]
                assert (tok, nc, cached, lp) == (room.token, 0, str(room.prefix_len + 7),
                                                 "-0.25"), (room.room, q, f)
        for _ in range(len(case.rooms) * case.ptp):
            f = pre.until("room")
            assert int(f[3]) == TS_SUCCESS, f"prefill: {f}"
        with tempfile.TemporaryDirectory() as d:
            dec.send(f"dump {d}")
            f = dec.until("dumped")
            assert f[1:] == ["canaries-intact"], f"decode helper: {f}"
            compared = 0
            for q in range(case.dtp):
                got = np.fromfile(os.path.join(d, f"r{q}.bin"), np.uint8)
                want = expected(case, q)
                if not np.array_equal(got, want):
                    bad = np.flatnonzero(got != want) if got.size == want.size else [-1]
                    raise AssertionError(f"decode rank {q}: {len(bad)} bytes differ, first at "
                                         f"{bad[0]} of {want.size}")
                compared += got.size
        what = "KV and state" if case.model.state_fields() else "KV"
        print(f"PASS {name}: TokenSpeed 0.1.1 prefill TP{case.ptp} -> kvbridge C decode "
              f"TP{case.dtp} ({case.model.kind.upper()}, "
              f"{'layerwise' if case.layerwise else 'final'}), bootstrap "
              f"{'TokenSpeed' if tsboot else 'kvbridge'}'s, {len(case.rooms)} rooms Success "
              f"with token, cached tokens, logprob; {compared} decode {what} bytes compared "
              f"(all equal)", flush=True)
    finally:
        dec.close()
        pre.close()
        if contract_file:
            os.unlink(contract_file)


def kill_case(helper, name):
    """A room's first write landed, then kill -9 of one side (module doc)."""
    case = C.CASES["tp1_layerwise"]()
    env = {"KVB_TS011_LAYER_S": "0.5", "KVBRIDGE_ABORT_ACK_TIMEOUT": "2",
           "KVB_TS011_TIMEOUT": "40"}
    dec, pre = start(helper, case, True, env)
    room = case.rooms[0]
    try:
        ask_rooms(dec, case)
        t0 = time.monotonic()
        pre.send("go")
        dec.send(f"landed {room.room} {room.d_row[0]} 30")
        f = dec.until("landed")
        assert f[2] != "none", "no write landed within 30 s"
        t_land = time.monotonic() - t0
        victim = pre if name == "kill_prefill" else dec
        victim.kill9()
        t_kill = time.monotonic() - t0
        print(f"first write of room {room.room} landed {t_land:.3f} s after go; "
              f"{victim.name} killed (-9) at {t_kill:.3f} s", flush=True)
        if name == "kill_prefill":
            dec.send(f"wait {room.room} 30")
            f = dec.until("done")
            t_end = time.monotonic() - t0
            reason = " ".join(f[11:])
            print(f"kvbridge decode: room {room.room} poll {f[3]} at {t_end:.3f} s "
                  f"({t_end - t_kill:.3f} s after the kill): {reason}", flush=True)
            assert int(f[3]) == KVB_FAILED and reason, f
            assert t_end - t_kill < KILL_BOUND_S, f"Failed only {t_end - t_kill:.1f} s after"
            outcome = f"kvbridge decode Failed {t_end - t_kill:.3f} s after the kill: {reason}"
        else:
            f = pre.until("room")
            t_end = time.monotonic() - t0
            reason = " ".join(f[4:])
            print(f"TokenSpeed prefill: room {room.room} TransferPoll {f[3]} at {t_end:.3f} s "
                  f"({t_end - t_kill:.3f} s after the kill): {reason}", flush=True)
            assert int(f[3]) != TS_SUCCESS, f
            outcome = (f"TokenSpeed prefill reported TransferPoll {f[3]} "
                       f"{t_end - t_kill:.3f} s after the kill: {reason}")
        print(f"PASS {name}: first write landed at {t_land:.3f} s, kill -9 at {t_kill:.3f} s; "
              f"{outcome}", flush=True)
    finally:
        for p in (dec, pre):
            if p.p.poll() is None:
                p.p.kill()
                p.p.wait()


def main():
    helper, name = sys.argv[1], sys.argv[2]
    if name.startswith("kill_"):
        kill_case(helper, name)
    else:
        run(helper, name)


if __name__ == "__main__":
    main()
