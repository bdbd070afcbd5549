#!/usr/bin/python3
"""Record the `mooncake.engine` calls vLLM's MooncakeConnector makes
(vllm/distributed/kv_transfer/kv_connector/v1/mooncake/mooncake_connector.py
of a vLLM wheel) as a trace, for tests/python/test_vllm_mooncake_trace.py
to replay against kvbridge's drop-in without vLLM, torch or a GPU.

vLLM's connector itself cannot run here (it needs torch tensors on a
device, vLLM's config and platform layers); what decides its engine calls
is plain Python: the descriptor planning functions of that file
(group_concurrent_contiguous, _get_tp_ratio, _compute_sender_transfer_plan,
_can_coalesce_block_transfers). This script takes those four functions out
of the wheel's source (ast; nothing else of vLLM is imported), runs them
over a few scenarios with the loop of MooncakeConnectorWorker.
_build_transfer_params (regions outer, contiguous block groups inner,
coalesced or per block), and writes each rank's calls in order, with the
call sites they come from:

  TransferEngine()                                    worker __init__
  initialize(get_ip(), "P2PHANDSHAKE", protocol, device_name)
  get_rpc_port()
  batch_register_memory(storage ptrs, storage lens)   register_kv_caches
  batch_transfer_sync_write(session, srcs, dsts, lens) _send_blocks (sender threads)
  batch_unregister_memory(ptrs) / batch_register_memory(ptrs, lens)
                                                      unregister_kv_caches /
                                                      restore_kv_caches (sleep mode)

Addresses are symbolic: ["P0.L2", offset] is byte `offset` of layer 2's
KV storage on prefill rank 0. Usage:

    pip download vllm==0.33.0 --no-deps -d DIR
    scripts/vllm-mooncake-trace.py DIR/vllm-0.33.0-*.whl \
        > tests/python/vllm_0_33_mooncake_trace.json
"""

import ast
import hashlib
import json
import os
import sys
import zipfile

import numpy as np

CONNECTOR = "vllm/distributed/kv_transfer/kv_connector/v1/mooncake/mooncake_connector.py"
FUNCS = ("group_concurrent_contiguous", "_get_tp_ratio", "_compute_sender_transfer_plan",
         "_can_coalesce_block_transfers")


def load(wheel):
    with zipfile.ZipFile(wheel) as z:
        src = z.read(CONNECTOR).decode()
        version = next((n.split("/")[0][len("vllm-"):-len(".dist-info")]
                        for n in z.namelist() if n.endswith(".dist-info/METADATA")), "?")
    tree = ast.parse(src)
    ns = {"np": np}
    found = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name in FUNCS:
            found[node.name] = node.lineno
            code = ast.Module(body=[node], type_ignores=[])
            node.returns = None  # annotations name vLLM types; not needed
            for a in node.args.args + node.args.kwonlyargs:
                a.annotation = None
            exec(compile(code, CONNECTOR, "exec"), ns)
    assert set(found) == set(FUNCS), found
    lines = {name: src[:src.index(pat)].count("\n") + 1 for name, pat in (
        ("TransferEngine()", "self.engine = TransferEngine()"),
        ("initialize", "ret_value = self.engine.initialize("),
        ("get_rpc_port", "self.rpc_port = self.engine.get_rpc_port()"),
        ("batch_transfer_sync_write", "ret_value = self.engine.batch_transfer_sync_write("),
        ("batch_register_memory", "ret_value = self.engine.batch_register_memory(kv_data_ptrs"),
        ("batch_unregister_memory", "ret_value = self.engine.batch_unregister_memory("),
    )}
    engine_calls = sorted({c for c in
                           __import__("re").findall(r"self\.engine\.(\w+)\(", src)})
    return ns, found, lines, engine_calls, version, hashlib.sha256(src.encode()).hexdigest()


def scenario(ns, name, ptp, dtp, layers, p_kv, d_kv, heads, mla, reqs, protocol="rdma"):
    """Every rank's calls. p_kv / d_kv: a layer's bytes per block on a
    prefill / decode rank (block_len == kv_block_len: one region per
    layer storage). reqs: (local block ids, remote block ids) per request;
    every prefill rank sends its part to decode rank 0..dtp-1 as vLLM's
    planner says, one batch_transfer_sync_write per request (one pull
    message per request; vLLM folds the requests of one pull into one
    call)."""
    nblocks = 64
    ranks = []
    for role, tp, kv in (("P", ptp, p_kv), ("D", dtp, d_kv)):
        for r in range(tp):
            rid = f"{role}{r}"
            calls = [{"call": "TransferEngine"},
                     {"call": "initialize", "args": ["$IP", "P2PHANDSHAKE", protocol, ""]},
                     {"call": "get_rpc_port"},
                     {"call": "batch_register_memory",
                      "args": [[[f"{rid}.L{l}", 0] for l in range(layers)],
                               [kv * nblocks] * layers]}]
            ranks.append({"rank": rid, "tp_rank": r, "tp_size": tp,
                          "storages": [kv * nblocks] * layers, "block_len": kv, "calls": calls})
    replicated = mla  # MLA: every rank holds the whole latent
    for p in (x for x in ranks if x["rank"][0] == "P"):
        for d in (x for x in ranks if x["rank"][0] == "D"):
            ratio = ns["_get_tp_ratio"](ptp, dtp)
            # which decode ranks a prefill rank serves (vLLM's target ranks)
            if ratio > 0 and d["tp_rank"] != p["tp_rank"] // ratio:
                continue
            if ratio < 0 and p["tp_rank"] != d["tp_rank"] // -ratio:
                continue
            send, so, do, n = ns["_compute_sender_transfer_plan"](
                local_tp_rank=p["tp_rank"], local_tp_size=ptp, remote_tp_rank=d["tp_rank"],
                remote_tp_size=dtp, local_kv_block_len=p_kv, remote_kv_block_len=d_kv,
                producer_cache_replicated=replicated,
                total_num_kv_heads=None if mla else heads)
            if not send:
                continue
            for local_ids, remote_ids in reqs:  # _build_transfer_params, one pull a request
                srcs, dsts, lens = [], [], []
                if len(local_ids) > len(remote_ids):  # partial prefix hit
                    local_ids = local_ids[-len(remote_ids):]
                for l in range(layers):
                    gl, gr = ns["group_concurrent_contiguous"](np.array(local_ids),
                                                               np.array(remote_ids))
                    coalesce = ns["_can_coalesce_block_transfers"](
                        local_region_block_len=p_kv, remote_region_block_len=d_kv,
                        src_region_offset=so, dst_region_offset=do, transfer_len=n)
                    for a, b in zip(gl, gr):
                        if coalesce:
                            srcs.append([f"{p['rank']}.L{l}", a[0] * p_kv + so])
                            dsts.append([f"{d['rank']}.L{l}", b[0] * d_kv + do])
                            lens.append(n * len(a))
                        else:
                            for x, y in zip(a, b):
                                srcs.append([f"{p['rank']}.L{l}", x * p_kv + so])
                                dsts.append([f"{d['rank']}.L{l}", y * d_kv + do])
                                lens.append(n)
                p["calls"].append({"call": "batch_transfer_sync_write",
                                   "args": [f"$SESSION:{d['rank']}", srcs, dsts, lens]})
    for x in ranks:  # sleep mode: unregister, restore
        regs = [[f"{x['rank']}.L{l}", 0] for l in range(layers)]
        x["calls"].append({"call": "batch_unregister_memory", "args": [regs]})
        x["calls"].append({"call": "batch_register_memory",
                           "args": [regs, x["storages"]]})
    return {"name": name, "prefill_tp": ptp, "decode_tp": dtp, "layers": layers,
            "mla": mla, "ranks": ranks}


def main():
    wheel = sys.argv[1]
    ns, found, lines, engine_calls, version, sha = load(wheel)
    head = 8 * 64 * 2 * 16  # 8 KV heads x 64 dims x bf16 x 16 tokens
    reqs = [([3, 4, 5, 6, 9], [10, 11, 12, 13, 20]),   # a run, then one block
            ([1, 2, 7, 8, 30, 31, 32], [40, 41, 42, 43, 44]),  # prefix hit on D: 2 fewer
            ([50], [60])]
    out = {
        "source": {"package": "vllm", "version": version, "file": CONNECTOR,
                   "file_sha256": sha, "wheel": os.path.basename(wheel)},
        "note": "recorded by scripts/vllm-mooncake-trace.py: vLLM's planning functions "
                "(lines " + ", ".join(f"{k}:{v}" for k, v in sorted(found.items())) +
                ") run over the scenarios; call sites " +
                ", ".join(f"{k}:{v}" for k, v in lines.items()),
        "engine_methods_called": engine_calls,
        "sender_threads": 10,
        "scenarios": [
            scenario(ns, "tp1_tp1", 1, 1, 4, head, head, 8, False, reqs),
            scenario(ns, "tp2_tp1", 2, 1, 4, head // 2, head, 8, False, reqs),
            scenario(ns, "tp1_tp2", 1, 2, 2, head, head // 2, 8, False, reqs[:2]),
            scenario(ns, "mla_tp2_tp1", 2, 1, 3, 16 * 576 * 2, 16 * 576 * 2, 1, True, reqs),
        ],
    }
    json.dump(out, sys.stdout, indent=None, separators=(",", ":"))
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
