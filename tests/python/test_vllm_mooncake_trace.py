"""vLLM 0.33.0's MooncakeConnector, replayed: the exact `mooncake.engine`
calls its worker makes (vllm_0_33_mooncake_trace.json, recorded by
scripts/vllm-mooncake-trace.py from the wheel: vLLM's own descriptor
planning functions run over four scenarios) against kvbridge's drop-in.
vLLM itself cannot run here (its worker needs torch tensors on a device
and vLLM's config/platform layers); its engine calls need none of that.

Per scenario (TP1->TP1, TP2->TP1, TP1->TP2, MLA TP2->TP1 where one
prefill rank is replicated and sends nothing), every rank gets its own
drop-in engine and one KV storage per layer:

- TransferEngine(), initialize("127.0.0.1", "P2PHANDSHAKE", "rdma", ""),
  get_rpc_port(), batch_register_memory(storage ptrs, lens), as
  MooncakeConnectorWorker.__init__ / register_kv_caches do;
- the prefill ranks' batch_transfer_sync_write(session, srcs, dsts, lens)
  calls, all at once from a pool of 10 threads (the connector's sender
  executor, num_workers=10): every decode byte equal to the image the
  descriptors define, nothing else changed;
- sleep mode: batch_unregister_memory on every rank, then
  batch_register_memory again on the prefill ranks: a write into the
  still unregistered decode returns -1 with nothing written; once the
  decode re-registers, the writes land again.
"""

import json
import os
import sys
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
PYDIR = os.path.join(os.path.dirname(os.path.dirname(HERE)), "python")
COMPAT = os.path.join(PYDIR, "compat")
for d in (HERE, COMPAT, PYDIR):
    if d not in sys.path:
        sys.path.insert(0, d)

from mooncake.engine import TransferEngine  # noqa: E402

with open(os.path.join(HERE, "vllm_0_33_mooncake_trace.json")) as _f:
    TRACE = json.load(_f)
HOST = "127.0.0.1"


def test_trace_is_vllm_033():
    assert TRACE["source"]["version"] == "0.33.0"
    # every engine method the connector file calls, and nothing the drop-in lacks
    assert TRACE["engine_methods_called"] == [
        "batch_register_memory", "batch_transfer_sync_write", "batch_unregister_memory",
        "get_rpc_port", "initialize"]


class Cluster:
    """The ranks of one scenario: engines, storages, sessions."""

    def __init__(self, sc):
        self.sc = sc
        self.rng = np.random.default_rng(33)
        self.eng, self.mem, self.sid = {}, {}, {}
        for r in sc["ranks"]:
            for k, n in enumerate(r["storages"]):
                fill = self.rng.integers(0, 256, n, dtype=np.uint8)
                self.mem[f"{r['rank']}.L{k}"] = fill
        self.expect = {k: v.copy() for k, v in self.mem.items()}

    def addr(self, sym):
        name, off = sym
        return self.mem[name].ctypes.data + off

    def run_setup(self, r, calls):
        """The calls before the first transfer, as the worker makes them."""
        rank = r["rank"]
        for c in calls:
            a = c.get("args", [])
            if c["call"] == "TransferEngine":
                self.eng[rank] = TransferEngine()
            elif c["call"] == "initialize":
                assert a[0] == "$IP"
                assert self.eng[rank].initialize(HOST, *a[1:]) == 0
            elif c["call"] == "get_rpc_port":
                self.sid[rank] = f"{HOST}:{self.eng[rank].get_rpc_port()}"
            elif c["call"] == "batch_register_memory":
                ptrs = [self.addr(x) for x in a[0]]
                assert self.eng[rank].batch_register_memory(ptrs, a[1]) == 0
            else:
                raise AssertionError(c)

    def writes(self):
        """(rank, session, srcs, dsts, lens, symbolic call) of every transfer."""
        out = []
        for r in self.sc["ranks"]:
            for c in r["calls"]:
                if c["call"] == "batch_transfer_sync_write":
                    sess, srcs, dsts, lens = c["args"]
                    assert sess.startswith("$SESSION:")
                    out.append((r["rank"], self.sid[sess[9:]], [self.addr(x) for x in srcs],
                                [self.addr(x) for x in dsts], lens, c))
        return out

    def apply(self, c):
        _, srcs, dsts, lens = c["args"]
        for (sn, so), (dn, do), n in zip(srcs, dsts, lens):
            self.expect[dn][do:do + n] = self.mem[sn][so:so + n]
        return sum(lens)

    def check(self):
        for k in self.mem:
            assert np.array_equal(self.mem[k], self.expect[k]), k

    def refill_sources(self):
        for r in self.sc["ranks"]:
            if r["rank"][0] == "P":
                for k in range(len(r["storages"])):
                    name = f"{r['rank']}.L{k}"
                    self.mem[name][:] = self.rng.integers(0, 256, self.mem[name].size,
                                                          dtype=np.uint8)
                    self.expect[name][:] = self.mem[name]

    def close(self):
        for e in self.eng.values():
            e.close()


def _run_writes(cl, writes):
    with ThreadPoolExecutor(TRACE["sender_threads"]) as ex:
        futs = [ex.submit(cl.eng[rank].batch_transfer_sync_write, sid, s, d, n)
                for rank, sid, s, d, n, _ in writes]
        return [f.result() for f in futs]


@pytest.mark.parametrize("sc", TRACE["scenarios"], ids=lambda s: s["name"])
def test_replay(sc):
    cl = Cluster(sc)
    try:
        for r in sc["ranks"]:
            first = next(i for i, c in enumerate(r["calls"])
                         if c["call"] in ("batch_transfer_sync_write",
                                          "batch_unregister_memory"))
            cl.run_setup(r, r["calls"][:first])
        writes = cl.writes()
        assert writes or sc["prefill_tp"] > 0
        assert _run_writes(cl, writes) == [0] * len(writes)
        moved = sum(cl.apply(w[5]) for w in writes)
        cl.check()
        assert moved > 0
        # sleep mode: every rank unregisters (the trace's next call)
        for r in sc["ranks"]:
            tail = [c for c in r["calls"] if c["call"] != "batch_transfer_sync_write"][4:]
            assert [c["call"] for c in tail] == ["batch_unregister_memory",
                                                 "batch_register_memory"]
            ptrs = [cl.addr(x) for x in tail[0]["args"][0]]
            assert cl.eng[r["rank"]].batch_unregister_memory(ptrs) == 0
        cl.refill_sources()  # any write now would show

        def restore(role):  # restore_kv_caches
            for r in sc["ranks"]:
                if r["rank"][0] == role:
                    tail = [c for c in r["calls"] if c["call"] == "batch_register_memory"][-1]
                    ptrs = [cl.addr(x) for x in tail["args"][0]]
                    assert cl.eng[r["rank"]].batch_register_memory(ptrs, tail["args"][1]) == 0

        # the prefill back, the decode still asleep: refused, nothing written
        restore("P")
        assert _run_writes(cl, writes) == [-1] * len(writes)
        cl.check()
        restore("D")
        assert _run_writes(cl, writes) == [0] * len(writes)
        for w in writes:
            cl.apply(w[5])
        cl.check()
        print(f"\n{sc['name']}: {len(writes)} batch writes, "
              f"{sum(len(w[4]) for w in writes)} descriptors, {moved} bytes, twice")
    finally:
        cl.close()
