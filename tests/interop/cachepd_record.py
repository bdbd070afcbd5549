"""Record the CachePD golden corpus from TokenSpeed 0.1.1's own code.

Run by scripts/record-cachepd.sh inside a venv holding tokenspeed==0.1.1
(pure Python; installed --no-deps). No GPU and no torch: the pure modules
(recipes/plan, spec, transfer, pd/cache_protocol, pd/transfer_plan) import as
they are; importing pd/mooncake/prefill.py and receiver.py (whose methods
build the frames and the copy list) needs the heavy packages they import at
module level, which are stubbed (STUBBED below): nothing stubbed is called
on the paths recorded here.

What runs unmodified, per case (tests/conformance/tokenspeed_cachepd/):
  contracts   recipes' group() + pack() + CacheLayout.bind() (+ narrow_to_layers
              for PP) + build_cache_transfer_schema + CacheTransferContract,
              the field declarations as the recipes make them (ordinary MHA/MLA,
              Qwen3.5 GDN): to_wire_bytes();
  manifests   build_cache_block_manifest over block tables made here;
  frames      MooncakeKVReceiver._register_kv_args / .prefill and
              MooncakeKVManagerPrefill.sync_status_to_decode_endpoint, with a
              socket that records send_multipart; statuses read back with
              parse_prefill_status_message;
  bootstrap   the prefill's _register_to_bootstrap payload (body as requests
              encodes json=), MooncakeKVBootstrapServer._ingest_put_extra, the
              parallel info as _handle_route_get builds it (json.dumps, as
              aiohttp's json_response), _get_prefill_parallel_info_from_server;
  planner     receiver._calc (the decode's route) per decode rank,
              _prepare_decode_registration per (stage, prefill rank, decode
              rank), _cache_transfer_blocks (the copy list) per registration.

Usage: cachepd_record.py OUT_DIR
"""

import importlib.abc
import importlib.machinery
import json
import os
import struct
import sys
import types
from dataclasses import asdict, replace
from types import SimpleNamespace as NS

STUBBED = ("torch", "tokenspeed_kernel", "tokenspeed_triton", "aiohttp", "prometheus_client",
           "psutil", "pybase64", "PIL", "pydantic", "starlette", "transformers",
           "compressed_tensors")


class _Meta(type):
    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _stub(name)

    def __call__(cls, *a, **k):
        if len(a) == 1 and callable(a[0]) and not k and not isinstance(a[0], _Meta):
            return a[0]  # used as a decorator
        return super().__call__()

    def __or__(cls, other):
        return cls

    __ror__ = __or__

    def __getitem__(cls, key):
        return cls

    def __iter__(cls):
        return iter(())


def _stub(name):
    return _Meta(name, (), {"__init__": lambda self, *a, **k: None,
                            "__getattr__": lambda self, n: _stub(n),
                            "__call__": lambda self, *a, **k: self})


class _StubModule(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        value = _stub(name)
        setattr(self, name, value)
        return value


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in STUBBED:
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        module = _StubModule(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module):
        pass


sys.meta_path.insert(0, _StubFinder())

import numpy as np  # noqa: E402
import requests  # noqa: E402

import tokenspeed  # noqa: E402
from tokenspeed.runtime.layers.attention.kv_cache.recipes import plan as ts_plan  # noqa: E402
from tokenspeed.runtime.layers.attention.kv_cache.recipes import spec as ts_spec  # noqa: E402
from tokenspeed.runtime.layers.attention.kv_cache.recipes.transfer import (  # noqa: E402
    build_cache_transfer_schema,
)
from tokenspeed.runtime.pd import cache_protocol as cp  # noqa: E402
from tokenspeed.runtime.pd.mooncake import conn as ts_conn  # noqa: E402
from tokenspeed.runtime.pd.mooncake import decode as ts_decode  # noqa: E402
from tokenspeed.runtime.pd.mooncake import prefill as ts_prefill  # noqa: E402
from tokenspeed.runtime.pd.mooncake import receiver as ts_receiver  # noqa: E402

RELEASE = "tokenspeed==0.1.1"
PROV = "recorded-from-release " + RELEASE
DIALECT = "tokenspeed_cachepd"
SLAB_P = 0x7E0000000000
SLAB_D = 0x7F0000000000
OUT = None


# ------------------------------------------------------------------ models


def model_cfg(kv_heads=8, **extra):
    text = NS(**extra)
    return NS(num_key_value_heads=kv_heads, hf_text_config=text, num_attention_layers=0)


def mha_fields(tp, kv_heads, head_dim, dtype="bfloat16"):
    def fields(layer, gid, occ):
        shape = (PG, max(kv_heads // tp, 1), head_dim)
        return (ts_plan.CacheFieldSpec(f"layer.{layer}.k", f"unit.{occ}.k", shape, dtype),
                ts_plan.CacheFieldSpec(f"layer.{layer}.v", f"unit.{occ}.v", shape, dtype))
    return fields


def mla_fields(latent):
    def fields(layer, gid, occ):
        return (ts_plan.CacheFieldSpec(f"layer.{layer}.latent_kv", f"slot.{occ}",
                                       (PG, 1, latent), "bfloat16"),)
    return fields


def gdn_fields(tp, kv_heads, head_dim, kh, vh, kd, vd, kernel):
    conv_dim = 2 * kh * kd + vh * vd

    def fields(layer, gid, occ):
        if gid.startswith("linear_attention"):
            return (ts_plan.CacheFieldSpec(f"layer.{layer}.ssm", f"unit.{occ}.a",
                                           (vh // tp, vd, kd), "float32"),
                    ts_plan.CacheFieldSpec(f"layer.{layer}.conv", f"unit.{occ}.b",
                                           (conv_dim // tp, kernel - 1), "bfloat16",
                                           exact_page_stride=False))
        shape = (PG, max(kv_heads // tp, 1), head_dim)
        return (ts_plan.CacheFieldSpec(f"layer.{layer}.k", f"unit.{occ}.a", shape, "bfloat16"),
                ts_plan.CacheFieldSpec(f"layer.{layer}.v", f"unit.{occ}.b", shape, "bfloat16"))
    return fields


PG = 16


def contract(m, tp, num_lcm_blocks, window=None):
    """TokenSpeed's recipe pipeline for model m at TP tp: (full plan's
    contract, local contract for a PP window or None)."""
    global PG
    PG = m["pg"]
    layers = m["layer_types"]
    swin = m.get("window")
    gids = m.get("group_ids") or ts_spec.layer_group_ids(layer_types=layers,
                                                         sliding_window_tokens=swin)
    groups = ts_spec.group(layer_types=layers, group_ids=gids, sliding_window_tokens=swin,
                           prefix_granularity=PG, fields_for_layer=m["fields"](tp),
                           pd_disaggregation_enabled=True)
    if m.get("dcp"):
        groups = tuple((replace(s, shard_count=m["dcp"]), f) for s, f in groups)
    packing = m.get("packing")
    layout = ts_plan.pack(groups, prefix_granularity=PG,
                          cache_blocks_per_lcm_block=packing(groups) if packing else None,
                          alignment=m.get("alignment", 256),
                          max_padding_fraction=m.get("padding", 0.25))
    full = layout.bind(num_lcm_blocks)
    specs = tuple(s for s, _ in groups)
    cfg = NS(**{**vars(m["model"]), "num_attention_layers": len(layers)})
    wire = cp.CacheTransferContract(plan=full, group_specs=specs,
                                    transfer_schema=build_cache_transfer_schema(full,
                                                                                model_config=cfg))
    if window is None:
        return wire, None
    narrow = full.narrow_to_layers(*window)
    local = cp.CacheTransferContract(plan=narrow, group_specs=specs,
                                     transfer_schema=build_cache_transfer_schema(narrow,
                                                                                 model_config=cfg))
    return wire, local


ORDINARY = dict(packing=lambda g: {s.group_id: 1 for s, _ in g}, alignment=1, padding=float("inf"))

MODELS = {
    "mha": dict(pg=16, layer_types=("full_attention",) * 2, fields=lambda tp: mha_fields(tp, 8, 128),
                model=model_cfg(8), **ORDINARY),
    "gqa": dict(pg=16, layer_types=("full_attention",) * 2, fields=lambda tp: mha_fields(tp, 2, 64),
                model=model_cfg(2), **ORDINARY),
    "mla": dict(pg=16, layer_types=("full_attention",) * 2, fields=lambda tp: mla_fields(576),
                model=model_cfg(1), **ORDINARY),
    "swa": dict(pg=16, layer_types=("sliding_attention", "full_attention"), window=32,
                fields=lambda tp: mha_fields(tp, 4, 64), model=model_cfg(4), **ORDINARY),
    "hybrid": dict(pg=128, layer_types=("linear_attention",) * 3 + ("full_attention",),
                   group_ids=tuple(ts_spec.split_recurrent_state_groups(
                       ("linear_attention",) * 3 + ("full_attention",))),
                   fields=lambda tp: gdn_fields(tp, 2, 32, 2, 4, 16, 16, 4),
                   model=model_cfg(2, linear_num_key_heads=2, linear_num_value_heads=4,
                                   linear_key_head_dim=16, linear_value_head_dim=16),
                   padding=1.0),
}

# case: model, prefill TP, decode TP, prefill PP, parents (prefill, decode), prefix, prompt, dcp
CASES = [
    dict(case="mha_tp1_tp1", model="mha", ptp=1, dtp=1, pp=1, prefix=16, prompt=40),
    dict(case="mha_tp2_tp1", model="mha", ptp=2, dtp=1, pp=1, prefix=0, prompt=40),
    dict(case="mha_tp1_tp2", model="mha", ptp=1, dtp=2, pp=1, prefix=0, prompt=40),
    dict(case="gqa_tp4_tp1", model="gqa", ptp=4, dtp=1, pp=1, prefix=0, prompt=33),
    dict(case="mla_tp2_tp1", model="mla", ptp=2, dtp=1, pp=1, prefix=0, prompt=40),
    dict(case="mla_tp4_tp2", model="mla", ptp=4, dtp=2, pp=1, prefix=0, prompt=40),
    dict(case="swa_tp1_tp1", model="swa", ptp=1, dtp=1, pp=1, prefix=16, prompt=70),
    dict(case="mha_prefix2", model="mha", ptp=1, dtp=1, pp=1, prefix=32, prompt=70),
    dict(case="hybrid_tp2_tp1", model="hybrid", ptp=2, dtp=1, pp=1, prefix=0, prompt=300),
    dict(case="mla_dcp2_tp2_tp1", model="mla", ptp=2, dtp=1, pp=1, prefix=0, prompt=80, dcp=2),
    dict(case="mha_pp2_tp1_tp1", model="mha", ptp=1, dtp=1, pp=2, prefix=0, prompt=40),
]


# ------------------------------------------------------------------ output


def frame_text(b):
    if all(0x20 <= c < 0x7F for c in b):
        return "t:" + b.decode("ascii")
    return "x:" + b.hex()


def write(name, obj):
    obj = {"corpus": 1, "dialect": DIALECT, **obj}
    with open(os.path.join(OUT, name + ".json"), "w") as f:
        json.dump(obj, f, indent=1)
        f.write("\n")


class Recorder:
    """A zmq PUSH socket stand-in: keeps what send_multipart got."""

    def __init__(self):
        self.sent = []

    def send_multipart(self, parts):
        self.sent.append([bytes(p) for p in parts])


class _Lock:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


def recording_connect(rec):
    return lambda *a, **k: (rec, _Lock())


# ------------------------------------------------------------------ pieces


def contract_summary(c):
    plan = c.plan
    return {
        "arena_bytes": plan.arena_bytes,
        "groups": [{"group_id": s.group_id, "virtual_blocks": c.virtual_block_count(s.group_id),
                    "fields": [f.field_id for f in c.fields_for_group(s.group_id)]}
                   for s in c.group_specs],
        "page0": {f.field_id: plan.field_page_byte_offset(f.field_id, 0) for f in plan.fields},
        "payload": {f.field_id: f.payload_bytes for f in plan.fields},
    }


def record_contract(name, c, note):
    wire = c.to_wire_bytes()
    assert cp.CacheTransferContract.from_wire_bytes(wire).to_wire_bytes() == wire
    write(name, {"kind": "contract", "case": name, "direction": "both", "provenance": PROV,
                 "kvbridge_encodes": True, "note": note, "body": wire.decode("ascii"),
                 "expect": contract_summary(c)})


def block_table(c, row_base, prompt, gap_every=0):
    """A forward_op whose block tables hold row_base + i per slot (a gap of
    10 every gap_every slots, so page runs break)."""
    tables = {}
    for s in c.group_specs:
        slots = -(-prompt // s.block_granularity) + 1
        ids, nxt = [], row_base
        for i in range(slots):
            if gap_every and i and i % gap_every == 0:
                nxt += 10
            ids.append(nxt)
            nxt += 1
        tables[s.group_id] = np.asarray([ids], dtype=np.int64)
    return NS(block_tables_arrays=lambda: tables)


def manifest(c, base, prefix, prompt, gap_every=0):
    return cp.build_cache_block_manifest(block_table(c, base, prompt, gap_every), layout=c,
                                         request_row=0, prefix_len=prefix, prompt_len=prompt)


def frag_json(f):
    return asdict(f)


def owner_json(filters):
    return {g: (None if o is None else [o.owner_rank, o.owner_count]) for g, o in filters.items()}


def copy_items(items):
    out = []
    for it in items:
        if isinstance(it, ts_prefill.PageFieldCopies):
            out.append({"pages": {"src_pages": it.src_pages.tolist(),
                                  "dst_pages": it.dst_pages.tolist(),
                                  "fields": it.fields.tolist()}})
        elif isinstance(it, ts_prefill.PackedCopy):
            out.append({"packed": [it.src, it.dst, it.width, it.src_pitch, it.rows]})
        else:
            out.append({"span": [int(x) for x in it]})
    return out


# ------------------------------------------------------------------ frames


def record_registration(name, dcontract, d, dtp, note):
    rec = Recorder()
    self = NS(bootstrap_infos=[{"rank_ip": "10.0.0.1", "rank_port": 35001}],
              kv_mgr=NS(kv_args=NS(kv_data_ptr=SLAB_D, cache_layout=dcontract),
                        topology=NS(tp_size=dtp, tp_rank=d), rank_port=41234 + d),
              session_id=f"10.0.0.2:{16001 + d}", _connect=recording_connect(rec))
    orig = ts_receiver.get_local_ip_by_remote
    ts_receiver.get_local_ip_by_remote = lambda: "10.0.0.2"
    try:
        ts_receiver.MooncakeKVReceiver._register_kv_args(self)
    finally:
        ts_receiver.get_local_ip_by_remote = orig
    frames = rec.sent[0]
    write(name, {"kind": "registration", "case": name, "direction": "decode->prefill",
                 "provenance": PROV, "kvbridge_encodes": True, "note": note,
                 "frames": [frame_text(f) for f in frames],
                 "expect": {"endpoint": "10.0.0.2", "port": 41234 + d,
                            "session_id": f"10.0.0.2:{16001 + d}", "slab": SLAB_D,
                            "decode_tp_size": dtp, "decode_tp_rank": d}})
    return frames


def record_request(name, dcontract, room, mani, dummy, d, note):
    rec = Recorder()
    self = NS(kv_mgr=NS(kv_args=NS(cache_layout=dcontract),
                        update_status=lambda *a: None),
              bootstrap_infos=[{"rank_ip": "10.0.0.1", "rank_port": 35001, "is_dummy": dummy}],
              bootstrap_room=room, session_id=f"10.0.0.2:{16001 + d}",
              _connect=recording_connect(rec))
    ts_receiver.MooncakeKVReceiver.prefill(self, mani)
    frames = rec.sent[0]
    write(name, {"kind": "request", "case": name, "direction": "decode->prefill",
                 "provenance": PROV, "kvbridge_encodes": True, "note": note,
                 "frames": [frame_text(f) for f in frames],
                 "expect": {"room": room, "session_id": f"10.0.0.2:{16001 + d}",
                            "is_dummy": dummy,
                            "manifest": None if dummy else json.loads(mani.to_wire_bytes())}})


def record_status(name, room, status, rank, token, cands, cached, logprob, note):
    rec = Recorder()
    self = NS(bootstrap_token_cond=_Lock(), cached_tokens={room: cached} if cached else {},
              bootstrap_logprobs={room: logprob} if logprob is not None else {},
              _connect=recording_connect(rec))
    ts_prefill.MooncakeKVManagerPrefill.sync_status_to_decode_endpoint(
        self, "10.0.0.2", 41234, room, status, rank, bootstrap_token=token,
        spec_candidate_ids=cands)
    frames = rec.sent[0]
    got = ts_decode.parse_prefill_status_message(frames)
    write(name, {"kind": "status", "case": name, "direction": "prefill->decode",
                 "provenance": PROV, "kvbridge_encodes": True, "note": note,
                 "frames": [frame_text(f) for f in frames],
                 "expect": {"room": got[0], "status": got[1], "sender": got[2], "token": got[3],
                            "candidates": got[4] or [], "cached_tokens": got[5],
                            "logprob": got[6]}})


# ------------------------------------------------------------------ bootstrap


def put_payload(wire, stages, ptp, pp, rank, port):
    rec = {}
    topo = NS(world_size=ptp * pp, dp_size=1, pp_size=pp, global_rank=rank)
    self = NS(dist_init_addr="", bootstrap_port=8998, topology=topo, rank_port=port,
              kv_args=NS(cache_fields_by_stage=stages, wire_layout=wire, cache_layout=wire))
    orig_put, orig_ip, orig_get_ip = requests.put, ts_prefill.get_local_ip_by_remote, ts_prefill.get_ip
    requests.put = lambda url, json=None, timeout=None: rec.update(json=json) or NS(status_code=200)
    ts_prefill.requests.put = requests.put
    ts_prefill.get_local_ip_by_remote = lambda: "10.0.0.1"
    ts_prefill.get_ip = lambda: "127.0.0.1"
    try:
        ts_prefill.MooncakeKVManagerPrefill._register_to_bootstrap(self)
    finally:
        requests.put = ts_prefill.requests.put = orig_put
        ts_prefill.get_local_ip_by_remote, ts_prefill.get_ip = orig_ip, orig_get_ip
    req = requests.models.PreparedRequest()
    req.prepare_headers({})
    req.prepare_body(data=None, files=None, json=rec["json"])
    body = req.body.decode("utf-8") if isinstance(req.body, bytes) else req.body
    return rec["json"], body


def record_bootstrap(case, wire, stages, ptp, pp):
    server = NS(prefill_cache_layout_wire=None, prefill_cache_fields_by_stage=None)
    puts = []
    for rank in range(ptp * pp):
        payload, body = put_payload(wire, stages, ptp, pp, rank, 35001 + rank)
        ts_conn.MooncakeKVBootstrapServer._ingest_put_extra(server, json.loads(body))
        puts.append(body)
        if rank == 0:
            write(f"{case}_bootstrap_put", {
                "kind": "bootstrap_put", "case": case, "direction": "prefill->bootstrap",
                "provenance": PROV, "kvbridge_encodes": True,
                "note": "spec 3.1: MooncakeKVManagerPrefill._register_to_bootstrap's payload, "
                        "body as requests encodes json=",
                "body": body,
                "expect": {"world_size": ptp * pp, "dp_size": 1, "pp_size": pp,
                           "engine_rank": 0, "rank_ip": "10.0.0.1", "rank_port": 35001,
                           "cache_fields_by_stage": [list(s) for s in stages]}})
    info = {"prefill_tp_size": ptp * pp, "prefill_dp_size": 1, "prefill_pp_size": pp}
    info.update(ts_conn.MooncakeKVBootstrapServer._extra_parallel_info(server))
    body = json.dumps(info)
    orig = ts_receiver.requests.get
    ts_receiver.requests.get = lambda url, timeout=None: NS(status_code=200,
                                                            json=lambda: json.loads(body))
    try:
        parsed = ts_receiver._get_prefill_parallel_info_from_server("10.0.0.1:8998")
    finally:
        ts_receiver.requests.get = orig
    write(f"{case}_bootstrap_parallel_info", {
        "kind": "bootstrap_parallel_info", "case": case, "direction": "bootstrap->decode",
        "provenance": PROV, "kvbridge_encodes": True,
        "note": "spec 3.2: the server's answer after every rank's PUT (_ingest_put_extra, "
                "json_response); expect = receiver._get_prefill_parallel_info_from_server",
        "server_puts": puts, "body": body,
        "expect": {"world_size": parsed.tp_size, "dp_size": parsed.dp_size,
                   "pp_size": parsed.pp_size, "tp_size": parsed.prefill_tp_size_per_dp_rank,
                   "cache_fields_by_stage": [list(s) for s in parsed.cache_fields_by_stage],
                   "cache_layout_canonical": parsed.cache_layout.to_wire_bytes().decode()}})
    if case == "mha_tp1_tp1":
        write("rank_addr", {
            "kind": "bootstrap_rank_addr", "case": "rank_addr", "direction": "bootstrap->decode",
            "provenance": PROV, "kvbridge_encodes": True,
            "note": "spec 3.2: the per-rank answer (json_response of the table entry)",
            "body": json.dumps({"rank_ip": "10.0.0.1", "rank_port": 35001}),
            "expect": {"rank_ip": "10.0.0.1", "rank_port": 35001}})


# ------------------------------------------------------------------ planner


def decode_routes(case, wire, dcontract, stages, ptp, pp, dtp):
    out = []
    info = ts_decode.PrefillParallelInfo(tp_size=ptp * pp, dp_size=1, pp_size=pp,
                                         cache_fields_by_stage=stages, cache_layout=wire)
    for d in range(dtp):
        mgr = NS(topology=NS(tp_size=dtp, tp_rank=d), kv_args=NS(cache_layout=dcontract))
        rp = ts_receiver._calc(mgr, info)
        tp = rp.transfer_plan
        out.append({"decode_rank": d, "targets": list(rp.target_tp_ranks),
                    "dummies": list(rp.dummy_tp_ranks),
                    "sources": [{"prefill_rank": r,
                                 "fragments": [frag_json(f) for f in frs],
                                 "owners": owner_json(tp.owner_filters_by_prefill_rank[r])}
                                for r, frs in sorted(tp.fragments_by_prefill_rank.items())]})
    return out


def registration_outcome(wire, local, dcontract, stages, ptp, pp, s, r, d, dtp):
    reg = ts_prefill.KVArgsRegisterInfo(endpoint="10.0.0.2", dst_port=41234 + d,
                                        mooncake_session_id=f"10.0.0.2:{16001 + d}",
                                        dst_kv_ptr=SLAB_D, peer_cache_layout=dcontract,
                                        decode_tp_size=dtp, decode_tp_rank=d)
    self = NS(kv_args=NS(wire_layout=wire, cache_layout=local or wire,
                         cache_fields_by_stage=stages, kv_data_ptr=SLAB_P + s * (1 << 36)),
              topology=NS(tp_size=ptp, tp_rank=r, pp_rank=s))
    try:
        reg = ts_prefill.MooncakeKVManagerPrefill._prepare_decode_registration(self, reg)
    except ValueError as exc:
        return self, None, {"error": str(exc)}
    return self, reg, {"dummy": reg.is_dummy,
                       "expected": sorted(reg.expected_decode_ranks),
                       "whole": not reg.transfer_fragments and not reg.is_dummy,
                       "fragments": [frag_json(f) for f in reg.transfer_fragments],
                       "owners": owner_json(reg.transfer_owner_filters)}


def record_plan(c, wire, locals_, dcontract, stages, names, note):
    ptp, dtp, pp = c["ptp"], c["dtp"], c["pp"]
    dst_m = manifest(dcontract, 17, c["prefix"], c["prompt"], gap_every=2)
    src_m = manifest(wire, 5, c["prefix"], c["prompt"])
    regs, copies = [], []
    for s in range(pp):
        local = locals_[s] if locals_ else None
        for r in range(ptp):
            for d in range(dtp):
                self, reg, outcome = registration_outcome(wire, local, dcontract, stages, ptp, pp,
                                                          s, r, d, dtp)
                regs.append({"stage": s, "prefill_rank": r, "decode_rank": d, **outcome})
                if reg is None or reg.is_dummy:
                    continue
                first_layer = {f.field_id for f in (local or wire).plan.fields
                               if f.field_id.startswith(
                                   "layer.%d." % min(int(x.field_id.split(".")[1])
                                                     for x in (local or wire).plan.fields))}
                for step, fids in (("all", None), ("first_layer", frozenset(first_layer))):
                    items = ts_prefill.MooncakeKVManagerPrefill._cache_transfer_blocks(
                        self, dst_ptr=SLAB_D, src_block_manifest=src_m, dst_block_manifest=dst_m,
                        transfer_fragments=reg.transfer_fragments,
                        owner_filters=reg.transfer_owner_filters, dst_cache_layout=dcontract,
                        field_ids=fids)
                    copies.append({"stage": s, "prefill_rank": r, "decode_rank": d,
                                   "src_slab": self.kv_args.kv_data_ptr, "dst_slab": SLAB_D,
                                   "fields": None if fids is None else sorted(fids),
                                   "items": copy_items(items)})
    layerwise = []
    g = max(s_.block_granularity for s_ in wire.group_specs)
    bounds = sorted({c["prefix"], min(c["prefix"] + g, c["prompt"]), c["prompt"]} |
                    {x for x in range(c["prefix"] + 24, c["prompt"], 24)})
    for lo, hi in zip(bounds, bounds[1:]):
        sel = cp.build_cache_layerwise_block_selection(
            block_table(wire, 5, c["prompt"]), layout=wire, request_row=0,
            prefix_len=c["prefix"], prompt_len=c["prompt"], chunk_start=lo, chunk_end=hi)
        layerwise.append({"chunk_start": lo, "chunk_end": hi,
                          "positions": [list(x.destination_positions) for x in sel.groups]})
    write(f"{c['case']}_plan", {
        "kind": "plan", "case": c["case"], "direction": "both", "provenance": PROV,
        "kvbridge_encodes": False, "note": note,
        "inputs": {"prefill_contract": names["prefill"], "decode_contract": names["decode"],
                   "local_contracts": names.get("locals"), "prefill_tp": ptp, "decode_tp": dtp,
                   "pp": pp, "stages": [list(x) for x in stages],
                   "src_manifest": json.loads(src_m.to_wire_bytes()),
                   "dst_manifest": json.loads(dst_m.to_wire_bytes())},
        "expect": {"decode_routes": decode_routes(c["case"], wire, dcontract, stages, ptp, pp, dtp),
                   "registrations": regs, "copies": copies, "layerwise": layerwise}})
    return src_m, dst_m


def run_case(c):
    m = MODELS[c["model"]]
    m = dict(m, dcp=c.get("dcp"))
    ptp, dtp, pp = c["ptp"], c["dtp"], c["pp"]
    nlayers = len(m["layer_types"])
    wire, _ = contract(m, ptp, 63)
    dm = dict(m, dcp=None)
    dcontract, _ = contract(dm, dtp, 47)
    windows = [(s * nlayers // pp, (s + 1) * nlayers // pp) for s in range(pp)]
    locals_ = [contract(m, ptp, 63, w)[1] for w in windows] if pp > 1 else None
    if pp > 1:
        stages = tuple(tuple(f.field_id for f in loc.plan.fields) for loc in locals_)
    else:
        stages = (tuple(f.field_id for f in wire.plan.fields),)
    case = c["case"]
    names = {"prefill": f"{case}_contract_prefill", "decode": f"{case}_contract_decode"}
    record_contract(names["prefill"], wire, f"spec 5.1-5.3: the prefill's wire contract "
                    f"(TP {ptp}, 63 parents), built by TokenSpeed's recipe pipeline")
    record_contract(names["decode"], dcontract, f"spec 5.1-5.3: the decode's contract "
                    f"(TP {dtp}, 47 parents)")
    if locals_:
        names["locals"] = []
        for s, loc in enumerate(locals_):
            n = f"{case}_contract_prefill_stage{s}"
            record_contract(n, loc, f"spec 7.5: stage {s}'s narrowed local contract")
            names["locals"].append(n)
    note = (f"spec 7: TokenSpeed's planner for {case}: decode routes (receiver._calc), "
            f"prefill registrations (_prepare_decode_registration), copy lists "
            f"(_cache_transfer_blocks; 'first_layer' = a layerwise step's field filter), "
            f"layerwise chunk selections (build_cache_layerwise_block_selection)")
    src_m, dst_m = record_plan(c, wire, locals_, dcontract, stages, names, note)
    write(f"{case}_manifest", {
        "kind": "manifest", "case": case, "direction": "decode->prefill", "provenance": PROV,
        "kvbridge_encodes": True, "contract": names["decode"],
        "note": "spec 5.4: the decode's manifest (build_cache_block_manifest)",
        "body": dst_m.to_wire_bytes().decode(), "expect": json.loads(dst_m.to_wire_bytes())})
    for d in range(dtp):
        record_registration(f"{case}_registration_d{d}", dcontract, d, dtp,
                            "spec 4.2: MooncakeKVReceiver._register_kv_args")
    record_request(f"{case}_request", dcontract, 1234, dst_m, False, 0,
                   "spec 4.3: MooncakeKVReceiver.prefill")
    record_bootstrap(case, wire, stages, ptp, pp)


def main():
    global OUT
    OUT = sys.argv[1]
    os.makedirs(OUT, exist_ok=True)
    assert tokenspeed.__file__
    for c in CASES:
        run_case(c)
    example, _ = contract(MODELS["mha"], 1, 4095)
    assert len(example.to_wire_bytes()) == 1821, "spec 11.1's contract is 1821 bytes"
    record_contract("worked_example_contract", example,
                    "spec 11.1: the worked example's decode contract (1821 bytes), rebuilt by "
                    "TokenSpeed's recipe pipeline")
    dcontract, _ = contract(MODELS["mha"], 1, 47)
    record_request("request_dummy", dcontract, 1234, manifest(dcontract, 17, 0, 40), True, 0,
                   "spec 4.3, 5.5: a dummy request (empty frame 2)")
    record_status("status_success", 1234, 5, 0, 29871, None, 0, None,
                  "spec 4.4, 11.6: Success, no speculation, no logprob")
    record_status("status_success_full", 1234, 5, 1, 29871, [11, 22, 33], 16, -0.0123,
                  "spec 4.4: Success with candidates, cached tokens and a logprob")
    record_status("status_failed", 77, 0, 2, -1, None, 0, None,
                  "spec 4.5: a Failed status as abort_room sends it")
    print(f"recorded {len(os.listdir(OUT))} files into {OUT}")


if __name__ == "__main__":
    main()
