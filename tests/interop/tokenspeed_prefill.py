"""kvbridge's C decode (sglang26_helper decode) against TokenSpeed's own
prefill and bootstrap server (lightseekorg/tokenspeed at e41aa8b1609a:
mooncake/prefill.py, sender.py, conn.py's MooncakeKVBootstrapServer on
aiohttp, ...), unmodified, their bytes moved by kvbridge's engine through the
Mooncake drop-in (python/compat/mooncake). Run by
scripts/interop-tokenspeed.sh; not part of `make check`. Stubbed: what
imports torch, triton or TokenSpeed's GPU kernels (tokenspeed_common.py); the
prefill's KV pool is host memory.

kvbridge's decode learns the dialect from TokenSpeed's bootstrap answer,
sends 8-frame KV-args and 12/14-frame transfer infos (with TP 2 -> 1 a plan
of per-token-row fragments, which TokenSpeed's prefill executes literally),
reads the 5-frame statuses and the first token. Cases (argv[1]): pf_tp1,
pf_prefix, pf_tp2. Prints "CASE ok ..." or raises.
"""

import ctypes
import os
import socket
import time

import numpy as np

from tokenspeed_common import LineProc, main, manager_args
from tokenspeed_peer import pat

HELPER = os.environ["KVBRIDGE_SGLANG26_HELPER"]
PAGE, HEADS, HB, LAYERS = 4, 2, 32, 2  # KVBH_CHILD_GEOM, the helper's decode


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def Decode(boot):
    return LineProc([HELPER, "decode", f"boot={boot}"])


class Prefill:
    """One TokenSpeed prefill rank of TP `tp`: its pool holds its heads'
    slice (token-major rows) of the TP 1 pattern."""

    def __init__(self, port, rank, tp, pages=64):
        from tokenspeed.runtime.pd.mooncake.prefill import MooncakeKVManagerPrefill

        self.rank, self.tp, self.hl = rank, tp, HEADS // tp
        self.item = PAGE * self.hl * HB
        n_kv = 2 * LAYERS
        self.bufs = [ctypes.create_string_buffer(self.item * pages) for _ in range(n_kv)]
        # unit: one head of one token (MHA pool)
        args, kv_args = manager_args(self.bufs, self.item, LAYERS, False, HB, rank, tp, port)
        self.mgr = MooncakeKVManagerPrefill(args, kv_args)

    def fill(self, room, src_pages, first):
        for b, buf in enumerate(self.bufs):
            raw = memoryview(buf).cast("B")
            for j, s in enumerate(src_pages):
                for t in range(PAGE):
                    for h in range(self.hl):
                        for x in range(HB):
                            g = (t * HEADS + self.rank * self.hl + h) * HB + x
                            raw[s * self.item + (t * self.hl + h) * HB + x] = pat(
                                room, b, first + j, g
                            )


def wait(sender, want, timeout_s=20):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        st = sender.poll()
        if st in want:
            return st
        time.sleep(0.02)
    raise AssertionError(f"sender still {sender.poll()} after {timeout_s} s")


def run_case(case):
    from tokenspeed.runtime.pd.base.status import TransferPoll
    from tokenspeed.runtime.pd.mooncake.conn import MooncakeKVBootstrapServer
    from tokenspeed.runtime.pd.mooncake.sender import MooncakeKVSender

    tp = 2 if case == "pf_tp2" else 1
    port = free_port()
    MooncakeKVBootstrapServer(port)
    boot = f"127.0.0.1:{port}"
    pre = [Prefill(port, r, tp) for r in range(tp)]
    dec = Decode(boot)
    out = []
    rooms = [(9101, 0), (9102, 2)] if case == "pf_prefix" else [(9101, 0), (9102, 0)]
    for room, prefix in rooms:
        n = 3 + prefix
        dst = [5 * (room % 7) + i for i in range(n)]
        st = dec.ask(f"recv {room} 1 {prefix * PAGE} {n} " + " ".join(map(str, dst)), "recv")
        assert st in ("1", "2"), st
        senders = []
        for p in pre:
            s = MooncakeKVSender(p.mgr, boot, room)
            assert wait(s, (TransferPoll.Bootstrapped, TransferPoll.Failed)) == TransferPoll.Bootstrapped
            infos = p.mgr.transfer_infos[room].values()  # what kvbridge's decode sent it
            frags = sum(len(i.transfer_fragments or ()) for i in infos)
            src = [20 + i for i in range(n - prefix)]  # TokenSpeed sends the missing pages
            p.fill(room, src, prefix)
            s.send(np.array(src, dtype=np.int64), aux_index=0, is_last=True,
                   bootstrap_token=77 + room % 10, spec_candidate_ids=[1, 2])
            senders.append(s)
        for s in senders:
            assert wait(s, (TransferPoll.Success, TransferPoll.Failed)) == TransferPoll.Success
        status = dec.ask(f"poll {room} 10", "poll").split(" ")[0]
        assert status == "4", status  # kvbridge's Success
        bad = dec.ask(f"check {room} {prefix} " + " ".join(map(str, dst[prefix:])), "check")
        assert bad == "0", f"{bad} wrong KV bytes"
        token = dec.ask(f"token {room}", "token")
        assert token == f"1 {77 + room % 10} 1,2", token
        out.append(f"room {room} prefix {prefix} pages {n - prefix} token {token.split()[1]} "
                   f"fragments/rank {frags} verified")
    dec.close()
    print(f"{case} ok: " + "; ".join(out))


if __name__ == "__main__":
    main(run_case)
