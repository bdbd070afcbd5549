"""TokenSpeed 0.1.1's own CachePD decode connector (PyPI wheel, unmodified,
on kvbridge's `mooncake.engine` drop-in) against kvbridge's C prefill ranks
(tests/integration/cachepd/cpd_helper.c). Run by scripts/interop-cachepd.sh:

    python cachepd_kvbridge_prefill.py HELPER CASE

CASE: mha_tp1, mha_tp2 (TP2 -> TP1), mha_tp1_tp2 (TP1 -> TP2), mla_tp2 (one
prefill rank a dummy), hybrid_tp2 (TP2 -> TP1) and hybrid (TP1 -> TP1) of
the hybrid model with state groups (tokenspeed011_common.HybridModel, the
CachePD golden's), each with kvbridge's C bootstrap server; *_tsboot the
same with TokenSpeed's own bootstrap server (MooncakeKVBootstrapServer, in
this process): the kvbridge ranks then register in CachePD's PUT shape.

This process is the decode: per decode rank TokenSpeed's
MooncakeKVManagerDecode over an arena laid out by TokenSpeed's own contract
(the ordinary recipe's fields, built by its spec/plan/bind code), one
MooncakeKVReceiver per room (parallel info, route planning, registration,
the manifest from build_cache_block_manifest). The helper's ranks then send
every request page; checked here: every room Success, the first token,
candidates, cached tokens and logprob TokenSpeed's decode read from
kvbridge's statuses, and every byte of every decode arena: the manifest's
pages hold the room's pattern (kvbh_pat, reimplemented below) at this
rank's heads; the prefix pages and everything else keep their noise.
Hybrid: the kvbridge ranks are given TokenSpeed's contract of the model (at
TP 1, written by this process from TokenSpeed's builders) and send a state
slot; the decode's state block of each state group at the prompt's latest
snapshot slot holds this rank's rows of the room's state pattern (every
byte of the six state fields), the state blocks of the other slots keep
their noise.

Stubbed (only what needs a GPU stack): torch, tokenspeed_kernel.platform,
the GPU logits layer, runtime.utils' star imports, utils.env (the PD
variables with 0.1.1's defaults), metrics (as tests/interop/
tokenspeed011_common.py on the drop-in branch, which this duplicates until
the two land together).
"""

import hashlib
import json
import logging
import os
import subprocess
import sys
import time
import types

import numpy as np

import tokenspeed011_common as C

HOST = "127.0.0.1"
PG = 16
TIMEOUT = float(os.environ.get("KVB_CPD_TIMEOUT", "60"))


# ------------------------------------------------------------------ stubs

# What cannot run here (torch, GPU kernels, TokenSpeed's env module) is
# stubbed exactly as for TokenSpeed on the drop-in: tokenspeed011_common.
from tokenspeed011_common import install  # noqa: E402


# ------------------------------------------------------------------ model

class Model:
    """cpd_helper's models: MHA 4 layers x 8 KV heads of 64 bf16, MLA 3
    layers x a 576-wide bf16 latent; page 16."""

    def __init__(self, kind):
        self.kind = kind
        self.layers = 4 if kind == "mha" else 3
        self.heads = 8 if kind == "mha" else 1
        self.head_bytes = 128 if kind == "mha" else 1152
        self.width = 64 if kind == "mha" else 576
        self.pg = PG

    def field_ids(self):
        names = ("k", "v") if self.kind == "mha" else ("latent_kv",)
        return [f"layer.{l}.{n}" for l in range(self.layers) for n in names]

    def buffer(self, fid):
        """kvbridge's KV buffer of a field: K of layers 0..L-1, then V."""
        _, layer, kind = fid.split(".")
        return int(layer) + (self.layers if kind == "v" else 0)

    def contract(self, tp, num_lcm_blocks):
        """TokenSpeed's own contract (the ordinary recipe) for TP size tp."""
        from tokenspeed.runtime.layers.attention.kv_cache.recipes import plan as P
        from tokenspeed.runtime.layers.attention.kv_cache.recipes import spec as S
        from tokenspeed.runtime.layers.attention.kv_cache.recipes.transfer import (
            CacheFieldPartition, CacheFieldTransferSpec, CacheTransferSchema)
        from tokenspeed.runtime.pd.cache_protocol import CacheTransferContract

        def fields_for_layer(layer_id, group_id, occurrence):
            if self.kind == "mha":  # ordinary.py:_mha_layer_fields
                shape = (PG, max(self.heads // tp, 1), self.width)
                return (P.CacheFieldSpec(f"layer.{layer_id}.k", f"unit.{occurrence}.k",
                                         shape, "bfloat16"),
                        P.CacheFieldSpec(f"layer.{layer_id}.v", f"unit.{occurrence}.v",
                                         shape, "bfloat16"))
            return (P.CacheFieldSpec(f"layer.{layer_id}.latent_kv", f"slot.{occurrence}",
                                     (PG, 1, self.width), "bfloat16"),)

        groups = S.group(layer_types=["full_attention"] * self.layers,
                         group_ids=["full_attention"] * self.layers,
                         sliding_window_tokens=None, prefix_granularity=PG,
                         fields_for_layer=fields_for_layer, pd_disaggregation_enabled=True)
        layout = P.pack(groups, prefix_granularity=PG,
                        cache_blocks_per_lcm_block={"full_attention": 1},
                        alignment=1, max_padding_fraction=float("inf"))
        schema = CacheTransferSchema(fields=tuple(
            CacheFieldTransferSpec(fid, CacheFieldPartition(axis=1, global_extent=self.heads))
            for fid in self.field_ids()) if self.kind == "mha" else ())
        return CacheTransferContract(plan=layout.bind(num_lcm_blocks),
                                     group_specs=tuple(s for s, _ in groups),
                                     transfer_schema=schema)


def page_offset(plan_json, field_id, page):
    """Spec section 6, from the contract's numbers (not TokenSpeed's code)."""
    f = next(x for x in plan_json["fields"] if x["field_id"] == field_id)
    pl = next(x for x in plan_json["planes"] if x["plane_id"] == f["plane_id"])
    return (pl["arena_offset_bytes"] + pl["bytes_per_lcm_block"] - f["page_stride_bytes"]
            + page * f["page_stride_bytes"] + f["field_offset_bytes"])


M64 = (1 << 64) - 1


def pat(room, buf, page, k):
    """kvbh_pat (tests/harness/kvb_cluster.c) over an array of offsets k."""
    k = k.astype(np.uint64)
    x = np.uint64((room * 0x9E3779B97F4A7C15 & M64) ^ (buf << 48) ^ (page << 24)) ^ (k >> 3)
    x ^= x >> np.uint64(31)
    x *= np.uint64(0xBF58476D1CE4E5B9)
    x ^= x >> np.uint64(29)
    return ((x >> (np.uint64(8) * (k & np.uint64(7)))) & np.uint64(0xFF)).astype(np.uint8)


def page_bytes(model, room, fid, page, tp, rank):
    """What rank `rank` of TP size tp holds of one request page of fid."""
    hd = max(model.heads // tp, 1)
    first = rank * hd if model.kind == "mha" else 0
    t, h, x = np.meshgrid(np.arange(PG), np.arange(hd), np.arange(model.head_bytes),
                          indexing="ij")
    glob = (t * model.heads + first + h) * model.head_bytes + x
    return pat(room, model.buffer(fid), page, glob.reshape(-1))


def hybrid_page(m, room, fid, page, tp, rank):
    """The same for the hybrid model's K/V (kvbridge buffer = position in
    m.kv_fields(): K of the full-attention layers, then V)."""
    hd, hb = max(m.heads // tp, 1), m.head_dim * m.elt
    t, h, x = np.meshgrid(np.arange(m.pg), np.arange(hd), np.arange(hb), indexing="ij")
    glob = (t * m.heads + rank * hd + h) * hb + x
    return pat(room, m.kv_fields().index(fid), page, glob.reshape(-1))


def hybrid_state(m, room, fid, tp, rank):
    """What rank `rank` of TP size tp holds of state field fid (cpd_helper:
    byte o of the global row-major payload of state buffer j is
    kvbh_pat(room, 32 + j, 0, o)), in its local row order."""
    _, width, _ = m.state_geometry(fid)
    rows = m.state_rows(fid, tp, rank)
    glob = rows[:, None] * width + np.arange(width)[None, :]
    return pat(room, 32 + m.state_fields().index(fid), 0, glob.reshape(-1))


def noise(n, *key):
    h = hashlib.sha256(repr(key).encode()).digest()
    return np.random.default_rng(int.from_bytes(h[:8], "little")).integers(
        0, 256, n, dtype=np.uint8)


# ------------------------------------------------------------------ cases

CASES = {  # name: (model, prefill TP, decode TP)
    "mha_tp1": ("mha", 1, 1),
    "mha_tp2": ("mha", 2, 1),
    "mha_tp1_tp2": ("mha", 1, 2),
    "mla_tp2": ("mla", 2, 1),
    "hybrid": ("hybrid", 1, 1),
    "hybrid_tp2": ("hybrid", 2, 1),
}
ROOMS = [(4242, 40, 0), (4259, 75, 2), (4276, 16, 0)]  # room, prompt, prefix pages
# page 128: 3 pages (latest snapshot slot 2), 1 page past a 1-page prefix
# (slot 1), 1 page (slot 0)
HYBRID_ROOMS = [(4242, 300, 0), (4259, 130, 1), (4276, 128, 0)]
D_BLOCKS = 96


def wait_for(pred, what):
    end = time.monotonic() + TIMEOUT
    while not pred():
        if time.monotonic() > end:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(0.005)


def manager_args(tp, rank, port):
    from tokenspeed.runtime.pd.mooncake.entities import KVManagerArgs
    from tokenspeed.runtime.pd.topology import PDParallelTopology

    return KVManagerArgs(
        bootstrap_port=port, dist_init_addr=None,
        topology=PDParallelTopology(tp_size=tp, tp_rank=rank, dp_size=1, dp_rank=0,
                                    world_size=tp, global_rank=rank),
        enable_metrics=False, enable_dp_attention=False, served_model_name="m",
        app_key="k", metrics_reporters="")


def start_helper(helper, model, ptp, tsboot, contract_file=None):
    argv = [helper, str(ptp), model.kind]
    if contract_file:
        argv.append(f"contract={contract_file}")
    server = None
    if tsboot:
        from tokenspeed.runtime.pd.mooncake.conn import MooncakeKVBootstrapServer
        from tokenspeed.runtime.utils.network import get_free_port

        port = get_free_port()
        server = MooncakeKVBootstrapServer(port)
        argv.append(f"boot={HOST}:{port}")
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    boot = None
    for line in proc.stdout:
        if line.startswith("boot "):
            boot = line.split()[1]
        if line.strip() == "ready":
            break
    assert boot, "cpd_helper did not start"
    return proc, boot, server


def run(helper, name):
    from tokenspeed.runtime.pd.base.status import TransferPoll
    from tokenspeed.runtime.pd.cache_protocol import build_cache_block_manifest
    from tokenspeed.runtime.pd.mooncake.entities import KVArgs
    from tokenspeed.runtime.pd.mooncake.receiver import (MooncakeKVManagerDecode,
                                                          MooncakeKVReceiver)

    tsboot = name.endswith("_tsboot")
    kind, ptp, dtp = CASES[name[:-7] if tsboot else name]
    hybrid = kind == "hybrid"
    model = C.HybridModel() if hybrid else Model(kind)
    pg = model.pg
    contract_file = None
    if hybrid:  # TokenSpeed's contract of the model (TP 1) for the kvbridge ranks
        contract_file = os.path.join(os.environ.get("TMPDIR", "/tmp"),
                                     f"cpd-{name}-{os.getpid()}.json")
        with open(contract_file, "wb") as f:
            f.write(model.contract(1, D_BLOCKS).to_wire_bytes())
    proc, boot, server = start_helper(helper, model, ptp, tsboot, contract_file)  # noqa: F841
    try:
        contract = model.contract(dtp, D_BLOCKS)
        plan_json = json.loads(contract.to_wire_bytes())["plan"]
        ranks = []
        for q in range(dtp):
            arena = noise(contract.plan.arena_bytes, "decode", name, q)
            kv = KVArgs(engine_rank=q, kv_data_ptr=arena.ctypes.data, ib_device=None, gpu_id=0,
                        cache_layout=contract, cache_fields_by_stage=(tuple(model.field_ids()),))
            mgr = MooncakeKVManagerDecode(manager_args(dtp, q, 0), kv)
            ranks.append((mgr, arena, arena.copy()))
        if hybrid:  # the decode's blocks: no two groups' blocks share bytes
            alloc = C.BlockAlloc(contract, C._rng("decode blocks", name))
            states = [g for g in alloc.k if g != "full_attention"]
        moved = state_moved = 0
        for k, (room, prompt, prefix) in enumerate(HYBRID_ROOMS if hybrid else ROOMS):
            slots = -(-prompt // pg)
            if hybrid:
                d_row = [alloc.take("full_attention") for _ in range(slots)]
                d_state = {g: [alloc.take(g) for _ in range(slots)] for g in states}
            else:
                d_row = [1 + ((7 * k + 5 * s) % (D_BLOCKS - 1)) for s in range(slots)]
                d_state = {}
            tables = {"full_attention": np.array([d_row], np.int32)}
            tables.update({g: np.array([r], np.int32) for g, r in d_state.items()})
            op = types.SimpleNamespace(block_tables_arrays=lambda t=tables: t)
            rcvs = []
            for q, (mgr, arena, expect) in enumerate(ranks):
                rcv = MooncakeKVReceiver(mgr, boot, room)
                assert rcv.poll() == TransferPoll.Bootstrapped, (room, q, rcv.poll())
                man = build_cache_block_manifest(op, layout=contract, request_row=0,
                                                 prefix_len=prefix * pg, prompt_len=prompt)
                rcv.prefill(block_manifest=man)
                rcvs.append(rcv)
                for slot in range(prefix, slots):
                    for fid in model.kv_fields() if hybrid else model.field_ids():
                        data = (hybrid_page(model, room, fid, slot, dtp, q) if hybrid
                                else page_bytes(model, room, fid, slot, dtp, q))
                        off = page_offset(plan_json, fid, d_row[slot])
                        expect[off:off + data.size] = data
                        moved += data.size
                for fid in model.state_fields() if hybrid else ():
                    data = hybrid_state(model, room, fid, dtp, q)
                    block = d_state[C.group_of(plan_json, fid)][(prompt - 1) // pg]
                    off = page_offset(plan_json, fid, block)
                    expect[off:off + data.size] = data
                    state_moved += data.size
            # the prefill's state slot (hybrid): 3, 4, 5 for the rooms in turn
            proc.stdin.write(f"send {room} {slots} {1000 + room % 1000} {prefix * pg}"
                             f"{f' {3 + k}' if hybrid else ''}\n")
            proc.stdin.flush()
            for i in range(ptp):
                f = proc.stdout.readline().split(None, 4)
                assert f[:2] == ["status", str(room)] and f[3] == "4", f  # KVB_POLL_SUCCESS
            for q, rcv in enumerate(rcvs):
                wait_for(lambda: rcv.poll() in (TransferPoll.Success, TransferPoll.Failed),
                         f"room {room} decode rank {q}")
                if rcv.poll() != TransferPoll.Success:
                    try:
                        rcv.failure_exception()
                    except Exception as e:
                        raise AssertionError(f"room {room} decode rank {q}: {e}") from None
                tok, cands, cached, lp = ranks[q][0].pop_prefill_metadata(room)
                want = 1000 + room % 1000
                assert (tok, list(cands), cached, lp) == (want, [want + 1, want + 2],
                                                          prefix * pg, -0.5), \
                    (room, q, tok, cands, cached, lp)
        compared = 0
        for q, (mgr, arena, expect) in enumerate(ranks):
            if not np.array_equal(arena, expect):
                bad = np.flatnonzero(arena != expect)
                raise AssertionError(f"decode rank {q}: {bad.size} bytes differ, first at "
                                     f"{bad[0]} of {arena.size}")
            compared += arena.size
        state = f" and {state_moved} state bytes (6 fields' latest snapshots)" if hybrid else ""
        print(f"PASS {name}: kvbridge C prefill TP{ptp} -> TokenSpeed 0.1.1 decode TP{dtp} "
              f"({kind.upper()}, {model.layers} layers), bootstrap "
              f"{'TokenSpeed' if tsboot else 'kvbridge'}'s, "
              f"{len(HYBRID_ROOMS if hybrid else ROOMS)} rooms Success with "
              f"token, candidates, cached tokens, logprob; {moved} KV bytes{state} moved, "
              f"{compared} decode arena bytes compared (all equal)")
    finally:
        proc.stdin.close()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
        if contract_file:
            os.unlink(contract_file)


def main():
    install()
    logging.basicConfig(level=os.environ.get("TS_LOGLEVEL", "WARNING"))
    try:
        run(sys.argv[1], sys.argv[2])
    except BaseException:
        import traceback

        traceback.print_exc()
        sys.stdout.flush()
        os._exit(1)
    sys.stdout.flush()
    os._exit(0)  # TokenSpeed's threads never end


if __name__ == "__main__":
    main()
