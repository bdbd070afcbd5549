"""TokenSpeed's own decode receiver (lightseekorg/tokenspeed at e41aa8b1609a,
pd/mooncake/receiver.py = seed 004), run unmodified against kvbridge's C
prefill (tests/integration/tokenspeed/ts_helper), its bytes moved by
kvbridge's engine through the Mooncake drop-in (python/compat/mooncake).
Run by scripts/interop-tokenspeed.sh; not part of `make check`.

Run unmodified: receiver.py, mooncake/decode.py, mooncake/conn.py,
mooncake/entities.py, base/manager.py, base/mooncake_engine.py,
base/status.py, base/bootstrap.py, transfer_plan.py, pd/utils.py and
utils/network.py, all from the TokenSpeed tree on sys.path. Stubbed: what
imports torch, triton or TokenSpeed's GPU kernels (tokenspeed_common.py says
which and why). The decode's KV pool is host memory (ctypes) instead of GPU
tensors.

Cases (argv[1]): tp1, tp2, mla, mla_tp2, prefix, killed (the prefill
process and its bootstrap server: TokenSpeed's heartbeat notices),
rank_killed (the prefill ranks only, the bootstrap server a separate
`kvbridge bootstrap` that lives on: the WaitingForInput kvbridge sends arms
TokenSpeed's own time-out, TOKENSPEED_DISAGGREGATION_WAITING_TIMEOUT). Prints
one line "CASE ok ..." or raises.
"""

import ctypes
import os
import subprocess
import time

import numpy as np

from tokenspeed_common import LineProc, failure_text, main, manager_args
from tokenspeed_peer import pat

HELPER = os.environ["KVBRIDGE_TS_HELPER"]


class Helper(LineProc):
    def __init__(self, tp, mla, boot=None):
        args = [HELPER, "prefill", str(tp)] + (["mla"] if mla else [])
        super().__init__(args + ([f"boot={boot}"] if boot else []))

    def send(self, room, ranks, n, prefix, pages, token):
        line = f"send {room} {ranks} {n} {prefix} suffix {token} " + " ".join(map(str, pages))
        return self.cmd(line, len(ranks) + 2)[: len(ranks)]


class Pool:
    """The decode's KV pool: TP 1, token-major pages, host memory."""

    def __init__(self, info, pages=256):
        self.page = int(info["page"])
        self.layers = int(info["layers"])
        self.item = int(info["item_len"])
        self.n_kv = len(info["kv"].split(","))
        self.bufs = [ctypes.create_string_buffer(self.item * pages) for _ in range(self.n_kv)]

    def verify(self, room, dst, first_page):
        bad = 0
        for b, buf in enumerate(self.bufs):
            raw = memoryview(buf).cast("B")
            for j, p in enumerate(dst):
                base = p * self.item
                for k in range(self.item):
                    bad += raw[base + k] != pat(room, b, first_page + j, k)
        return bad


def make_receiver_manager(pool, mla, head_bytes):
    from tokenspeed.runtime.pd.mooncake.decode import MooncakeKVManagerDecode

    unit = 1 if mla else head_bytes  # MLA pools keep the base default (spec 8.2)
    return MooncakeKVManagerDecode(*manager_args(pool.bufs, pool.item, pool.layers, mla, unit))


def poll(recv, timeout_s):
    from tokenspeed.runtime.pd.base.status import TransferPoll

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        st = recv.poll()
        if st in (TransferPoll.Success, TransferPoll.Failed):
            return st
        time.sleep(0.02)
    raise AssertionError(f"no Success or Failed in {timeout_s} s (last {st})")


def run_case(case):
    from tokenspeed.runtime.pd.base.status import TransferPoll
    from tokenspeed.runtime.pd.mooncake.receiver import MooncakeKVReceiver

    tp = 2 if case in ("tp2", "mla_tp2") else 1
    mla = case.startswith("mla")
    server = None
    if case == "rank_killed":
        server = subprocess.Popen(
            [os.environ["KVBRIDGE_BIN"], "bootstrap", "--host", "127.0.0.1", "--port", "0"],
            stdout=subprocess.PIPE,
            text=True,
        )
        addr = server.stdout.readline().strip().rsplit(" ", 1)[-1]  # "listening on H:P"
    h = Helper(tp, mla, boot=addr if server else None)
    pool = Pool(h.info)
    mgr = make_receiver_manager(pool, mla, int(h.info["head_bytes"]))
    boot = h.info["boot"]
    results = []
    rooms = [(9001, 0), (9002, 2)] if case == "prefix" else [(9001, 0), (9002, 0)]
    for room, prefix in rooms:
        recv = MooncakeKVReceiver(mgr, boot, room)
        assert mgr.check_status(room) == TransferPoll.Bootstrapped, mgr.failure_records
        n = 4 + prefix
        dst = np.array([3 * room % 200 + i for i in range(n - prefix)], dtype=np.int64)
        recv.prefill(dst, aux_index=room % 32, decode_prefix_len=prefix * pool.page)
        if case == "rank_killed":
            deadline = time.monotonic() + 10
            while recv.poll() != TransferPoll.WaitingForInput and time.monotonic() < deadline:
                time.sleep(0.02)
            assert recv.poll() == TransferPoll.WaitingForInput
            h.kill()
            st = poll(recv, 30)
            assert st == TransferPoll.Failed, st
            text = failure_text(recv)
            assert "in TransferPoll.WaitingForInput" in text, text
            server.kill()
            print(f"rank_killed ok: {text}")
            return
        if case == "killed":
            h.kill()
            st = poll(recv, 30)
            assert st == TransferPoll.Failed, st
            text = failure_text(recv)
            assert "Losing connection with prefill instance" in text, text
            print(f"killed ok: {text}")
            return
        targets = ",".join(str(r) for r in recv.route_plan.target_tp_ranks)
        token = 500 + room % 100
        st_lines = h.send(room, targets.replace(",", ""), n, prefix, dst.tolist(), token)
        st = poll(recv, 20)
        assert st == TransferPoll.Success, (st, mgr.failure_records, st_lines)
        tok, cands = mgr.pop_prefill_metadata(room)
        assert tok == token, (tok, token)
        bad = pool.verify(room, dst.tolist(), prefix)
        assert bad == 0, f"{bad} wrong KV bytes in room {room}"
        results.append(
            f"room {room} targets [{targets}] prefix {prefix} pages {len(dst)} token {tok} "
            f"cands {cands} bytes {len(dst) * pool.item * pool.n_kv} verified"
        )
    h.kill()
    print(f"{case} ok: " + "; ".join(results))


if __name__ == "__main__":
    main(run_case)
