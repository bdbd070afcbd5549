"""TokenSpeed 0.1.1's own CachePD prefill and decode (PyPI wheel,
unmodified), both on kvbridge's `mooncake.engine` drop-in
(python/compat first on PYTHONPATH). Run by
scripts/interop-tokenspeed011.sh:

    python tokenspeed011_pd.py CASE            # the decode side; starts the prefill
    python tokenspeed011_pd.py --prefill CASE  # the prefill side (a child process)

The decode process holds the decode ranks (MooncakeKVManagerDecode +
MooncakeKVReceiver per room), the prefill process the bootstrap server
(MooncakeKVBootstrapServer) and the prefill ranks (MooncakeKVManagerPrefill
+ MooncakeKVSender). Each rank's MooncakeTransferEngine wraps its own
drop-in TransferEngine: TokenSpeed's constructor checks
batch_transfer_sync_write_pages, initialize()s it with
("<ip>", "P2PHANDSHAKE", "rdma", ""), registers the arena, and the prefill
writes through batch_transfer_sync_write_pages and
batch_transfer_sync_write. What this driver does in the executors' place
(prefill_executor.py / decode_executor.py, which need the scheduler and
the model): the block tables (one row per room), the manifests through
TokenSpeed's build_cache_block_manifest /
build_cache_layerwise_block_selection, the forward (it writes each layer's
pages into the prefill arenas and records the step after each layer, so a
layerwise write that ran ahead of its layer would carry noise), the first
token (set_prefill_metadata / send(bootstrap_token=...)).

Checked on the decode side: every room Success, the first token, and every
byte of every decode arena equal to the image computed independently
(initial noise, with the room's pages replaced by the rank's slice of the
model's pages; prefix pages and everything else unchanged; hybrid: and each
state group's block at the prompt's latest snapshot slot holding the rank's
rows of the room's state, the group's other blocks unchanged). The last line
says what ran: rooms, bytes transferred, arena bytes compared, and the
engine calls TokenSpeed made (counted on the drop-in's class).
"""

import os
import subprocess
import sys
import threading
import time
import traceback

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import tokenspeed011_common as C  # noqa: E402

TIMEOUT = float(os.environ.get("KVB_TS011_TIMEOUT", "60"))


class Op:
    """The forward op's block_tables_arrays() for one request row (hybrid:
    and one row per state group)."""

    def __init__(self, row, width, states=None):
        t = np.zeros((1, max(width, len(row))), np.int32)
        t[0, :len(row)] = row
        self.tables = {"full_attention": t}
        for group, srow in (states or {}).items():
            self.tables[group] = np.array([srow], np.int32)

    def block_tables_arrays(self):
        return self.tables


def count_engine_calls():
    """Count what TokenSpeed asks of the drop-in (wrappers on the class;
    behaviour unchanged): calls, spans and bytes per method."""
    import mooncake.engine as me

    stats = {}
    lock = threading.Lock()

    def wrap(name, spans):
        orig = getattr(me.TransferEngine, name)

        def f(self, *a, **k):
            r = orig(self, *a, **k)
            n, b = spans(a) if spans else (0, 0)
            with lock:
                s = stats.setdefault(name, [0, 0, 0, 0])
                s[0] += 1
                s[1] += n
                s[2] += b
                s[3] += r != 0 if isinstance(r, int) else 0
            return r
        setattr(me.TransferEngine, name, f)

    def pages(a):
        sp, fl = np.asarray(a[1]), np.asarray(a[3])
        return sp.size * fl.shape[0], int(sp.size * fl[:, 4].sum())

    wrap("batch_transfer_sync_write_pages", pages)
    wrap("batch_transfer_sync_write", lambda a: (len(a[3]), sum(a[3])))
    wrap("transfer_sync_write", lambda a: (1, a[3]))
    wrap("register_memory", None)
    wrap("unregister_memory", None)
    wrap("initialize", None)
    return stats


def fmt_stats(stats):
    out = []
    for name in sorted(stats):
        c, n, b, bad = stats[name]
        extra = f" {n} spans {b} B" if n else ""
        out.append(f"{name} x{c}{extra}" + (f" ({bad} non-zero)" if bad else ""))
    return "; ".join(out)


def wait_for(pred, what, timeout=TIMEOUT):
    end = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > end:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(0.005)


def manager_args(case, tp, rank, port):
    from tokenspeed.runtime.pd.mooncake.entities import KVManagerArgs
    from tokenspeed.runtime.pd.topology import PDParallelTopology

    return KVManagerArgs(
        bootstrap_port=port, dist_init_addr=None,
        topology=PDParallelTopology(tp_size=tp, tp_rank=rank, dp_size=1, dp_rank=0,
                                    world_size=tp, global_rank=rank),
        enable_metrics=False, enable_dp_attention=False, served_model_name="m",
        app_key="k", metrics_reporters="")


def kv_args(case, contract, arena, rank, layerwise):
    from tokenspeed.runtime.pd.cache_protocol import build_cache_fields_by_producer_step
    from tokenspeed.runtime.pd.mooncake.entities import KVArgs

    fields = tuple(case.model.field_ids())
    schedule = None
    if layerwise:  # one producer step per layer
        per_layer = tuple(tuple(f for f in fields if f.startswith(f"layer.{l}."))
                          for l in range(case.model.layers))
        schedule = build_cache_fields_by_producer_step(contract.plan,
                                                       producer_fields_by_step=per_layer)
    return KVArgs(engine_rank=rank, kv_data_ptr=arena.ctypes.data, ib_device=None, gpu_id=0,
                  cache_layout=contract, cache_fields_by_stage=(fields,),
                  cache_producer_schedule=schedule)


# ------------------------------------------------------------------ prefill

def prefill_main(name):
    """The prefill instance: bootstrap server, ptp ranks, the forward."""
    from tokenspeed.runtime.pd.cache_protocol import (
        build_cache_block_manifest, build_cache_layerwise_block_selection)
    from tokenspeed.runtime.pd.mooncake.conn import MooncakeKVBootstrapServer
    from tokenspeed.runtime.pd.mooncake.prefill import (MooncakeKVManagerPrefill,
                                                         MooncakeKVSender)
    from tokenspeed.runtime.pd.base.status import TransferPoll

    stats = count_engine_calls()
    case = C.CASES[name]()
    m = case.model
    from tokenspeed.runtime.utils.network import get_free_port

    # KVB_TS011_BOOT_PORT: register with a bootstrap server already running
    # on that port (kvbridge's, for cachepd_kvbridge_decode.py); else its own
    boot_port = os.environ.get("KVB_TS011_BOOT_PORT")
    port = int(boot_port) if boot_port else get_free_port()
    server = None if boot_port else MooncakeKVBootstrapServer(port)  # noqa: F841  (until exit)
    layer_s = float(os.environ.get("KVB_TS011_LAYER_S", "0.002"))  # a layer's compute
    prefill_info = os.environ.get("KVB_TS011_PREFILL_INFO") == "1"  # status frames 5-6
    contract = m.contract(case.ptp, case.p_blocks)
    plan = contract.plan
    ranks = []
    for r in range(case.ptp):
        arena = np.empty(plan.arena_bytes, np.uint8)
        C.fill_noise(arena, "prefill", name, r)
        mgr = MooncakeKVManagerPrefill(manager_args(case, case.ptp, r, port),
                                       kv_args(case, contract, arena, r, case.layerwise))
        counter = None
        if case.layerwise:
            counter = C.host_step_counter()
            mgr.register_layerwise_step_counter(counter, 1)
        ranks.append((mgr, arena, counter))
    import json
    plan_json = json.loads(contract.to_wire_bytes())["plan"]
    senders = {}
    for room in case.rooms:
        for r, (mgr, _, _) in enumerate(ranks):
            senders[room.room, r] = MooncakeKVSender(mgr, f"{C.HOST}:{port}", room.room)
    print("ready", port, flush=True)
    assert sys.stdin.readline().strip() == "go"

    def produce(arena, r, room, layer, slots, last):
        """The forward wrote layer `layer` of these slots of the room (and,
        on the last chunk, the layer's state: the prompt's latest snapshot)."""
        for slot in slots:
            for fid in m.kv_fields():
                if not fid.startswith(f"layer.{layer}."):
                    continue
                data = C.rank_slice(m, C.global_page(m, room.room, slot, fid), case.ptp, r)
                off = C.page_offset(plan_json, fid, room.p_row[slot])
                arena[off:off + data.size] = data.reshape(-1)
        for fid in m.state_fields() if last else ():
            if fid.startswith(f"layer.{layer}."):
                data = C.state_slice(m, C.global_state(m, room.room, fid), fid, case.ptp, r)
                block = room.p_state[C.group_of(plan_json, fid)][room.snapshot_slot(pg)]
                off = C.page_offset(plan_json, fid, block)
                arena[off:off + data.size] = data.reshape(-1)

    pg = m.pg
    for room in case.rooms:
        op = Op(room.p_row, len(room.p_row), room.p_state)
        for r, (mgr, _, _) in enumerate(ranks):
            wait_for(lambda: mgr.check_status(room.room) in (TransferPoll.Bootstrapped,
                                                            TransferPoll.Failed),
                     f"room {room.room} rank {r} Bootstrapped")
        infos = [list(mgr.transfer_infos.get(room.room, {}).values()) for mgr, _, _ in ranks]
        begin = 0
        for ce in room.chunks:
            is_last = ce == room.prompt_len
            slots = range(begin // pg, -(-ce // pg))
            if case.layerwise:
                for r, (mgr, arena, counter) in enumerate(ranks):
                    dests = [i for i in infos[r] if not i.is_dummy]
                    start = mgr.reserve_layerwise_cache_steps()
                    if not dests:
                        continue
                    first = dests[0].block_manifest
                    s = senders[room.room, r]
                    sel_start = begin if s.layerwise_chunk_submitted() else min(
                        begin, first.prefix_len)
                    sel = build_cache_layerwise_block_selection(
                        op, layout=mgr.kv_args.cache_layout, request_row=0,
                        prefix_len=first.prefix_len, prompt_len=first.prompt_len,
                        chunk_start=sel_start, chunk_end=ce)
                    if any(g.source_block_ids for g in sel.groups) or is_last:
                        s.send_layerwise(is_last, begin_cache_step=start,
                                         layerwise_interval=1,
                                         wait_for_bootstrap_token=is_last,
                                         cache_block_selection=sel)
            for layer in range(m.layers):  # the forward, layer by layer
                for r, (mgr, arena, counter) in enumerate(ranks):
                    produce(arena, r, room, layer, slots, is_last)
                    if counter is not None:
                        time.sleep(layer_s)
                        counter.record_cache()
            begin = ce
        for r, (mgr, arena, counter) in enumerate(ranks):  # _cache_decode
            s = senders[room.room, r]
            dests = [i for i in infos[r] if not i.is_dummy]
            if prefill_info:  # the cached prefix and the first token's logprob
                mgr.record_cached_tokens(room.room, room.prefix_len + 7)
                mgr.record_bootstrap_logprob(room.room, -0.25)
            if case.layerwise and dests:
                mgr.set_prefill_metadata(room.room, room.token, None)
            elif not dests:
                s.send(True, bootstrap_token=room.token, block_manifest=None)
            else:
                man = build_cache_block_manifest(
                    op, layout=mgr.kv_args.cache_layout, request_row=0,
                    prefix_len=dests[0].block_manifest.prefix_len,
                    prompt_len=dests[0].block_manifest.prompt_len)
                s.send(True, bootstrap_token=room.token, block_manifest=man)
    for room in case.rooms:
        for r in range(case.ptp):
            s = senders[room.room, r]
            wait_for(lambda: s.poll() in (TransferPoll.Success, TransferPoll.Failed),
                     f"prefill room {room.room} rank {r} done")
            st = s.poll()
            reason = ""
            if st == TransferPoll.Failed:
                try:
                    s.failure_exception()
                except Exception as e:
                    reason = str(e)
            print("room", room.room, r, int(st), reason, flush=True)
    print("stats", fmt_stats(stats), flush=True)
    sys.stdin.readline()  # until the decode is done
    os._exit(0)


# ------------------------------------------------------------------ decode

def decode_main(name):
    from tokenspeed.runtime.pd.base.status import TransferPoll
    from tokenspeed.runtime.pd.cache_protocol import build_cache_block_manifest
    from tokenspeed.runtime.pd.mooncake.receiver import (MooncakeKVManagerDecode,
                                                          MooncakeKVReceiver)
    import json

    stats = count_engine_calls()
    case = C.CASES[name]()
    m = case.model
    child = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--prefill", name],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        line = child.stdout.readline().split()
        assert line and line[0] == "ready", f"prefill did not start: {line}"
        port = int(line[1])
        contract = m.contract(case.dtp, case.d_blocks)
        plan_json = json.loads(contract.to_wire_bytes())["plan"]
        ranks = []
        for q in range(case.dtp):
            arena = np.empty(contract.plan.arena_bytes, np.uint8)
            C.fill_noise(arena, "decode", name, q)
            expect = arena.copy()
            mgr = MooncakeKVManagerDecode(manager_args(case, case.dtp, q, 0),
                                          kv_args(case, contract, arena, q, False))
            ranks.append((mgr, arena, expect))
        moved = state_moved = 0
        receivers = {}
        for room in case.rooms:
            op = Op(room.d_row, len(room.d_row), room.d_state)
            for q, (mgr, arena, expect) in enumerate(ranks):
                rcv = MooncakeKVReceiver(mgr, f"{C.HOST}:{port}", room.room)
                assert rcv.poll() == TransferPoll.Bootstrapped, rcv.poll()
                man = build_cache_block_manifest(op, layout=contract, request_row=0,
                                                 prefix_len=room.prefix_len,
                                                 prompt_len=room.prompt_len)
                rcv.prefill(block_manifest=man)
                receivers[room.room, q] = rcv
                for slot in range(room.prefix_len // m.pg, len(room.d_row)):
                    for fid in m.kv_fields():
                        data = C.rank_slice(m, C.global_page(m, room.room, slot, fid),
                                            case.dtp, q)
                        off = C.page_offset(plan_json, fid, room.d_row[slot])
                        expect[off:off + data.size] = data.reshape(-1)
                        moved += data.size
                for fid in m.state_fields():  # the latest snapshot of each state group
                    data = C.state_slice(m, C.global_state(m, room.room, fid), fid, case.dtp, q)
                    block = room.d_state[C.group_of(plan_json, fid)][room.snapshot_slot(m.pg)]
                    off = C.page_offset(plan_json, fid, block)
                    expect[off:off + data.size] = data.reshape(-1)
                    state_moved += data.size
        if case.fail:  # the destination is gone before the prefill writes
            for mgr, arena, expect in ranks:
                mgr.engine.deregister(arena.ctypes.data)
                expect[:] = arena
            moved = state_moved = 0
        child.stdin.write("go\n")
        child.stdin.flush()
        for (rid, q), rcv in receivers.items():
            wait_for(lambda: rcv.poll() in (TransferPoll.Success, TransferPoll.Failed),
                     f"decode room {rid} rank {q}")
            if case.fail:
                assert rcv.poll() == TransferPoll.Failed, rcv.poll()
                try:
                    rcv.failure_exception()
                except Exception as e:
                    assert "Failed to get kvcache from prefill instance" in str(e), e
                continue
            if rcv.poll() != TransferPoll.Success:
                try:
                    rcv.failure_exception()
                except Exception as e:
                    raise AssertionError(f"room {rid} decode rank {q} failed: {e}") from None
        tokens = {}
        for room in [] if case.fail else case.rooms:
            for q, (mgr, _, _) in enumerate(ranks):
                tok = mgr.pop_prefill_metadata(room.room)[0]
                tokens[room.room, q] = tok
                assert tok == room.token, (room.room, q, tok, room.token)
        compared = 0
        for q, (mgr, arena, expect) in enumerate(ranks):
            if not np.array_equal(arena, expect):
                bad = np.flatnonzero(arena != expect)
                raise AssertionError(f"decode rank {q}: {bad.size} bytes differ, first at "
                                     f"{bad[0]} of {arena.size}")
            compared += arena.size
        out = []
        for _ in range(len(case.rooms) * case.ptp):
            out.append(child.stdout.readline().split(None, 4))
        pstats = child.stdout.readline().strip()
        for f in out:
            if case.fail:
                assert f[0] == "room" and int(f[3]) == int(TransferPoll.Failed), f
                assert "CachePD transfer failed" in f[4], f
            else:
                assert f[0] == "room" and int(f[3]) == int(TransferPoll.Success), f
        child.stdin.write("quit\n")
        child.stdin.flush()
        child.wait(timeout=20)
        outcome = ("Failed on both sides with TokenSpeed's reasons, nothing written"
                   if case.fail else "Success on both sides, first tokens right")
        print(f"PASS {name}: prefill TP{case.ptp} -> decode TP{case.dtp} "
              f"({m.kind.upper()}, {m.layers} layers, "
              f"{'layerwise' if case.layerwise else 'final'}), {len(case.rooms)} rooms "
              f"{outcome}, {moved} KV bytes"
              f"{f' and {state_moved} state bytes' if m.state_fields() else ''} moved, "
              f"{compared} decode arena bytes compared (all equal); prefill "
              f"{pstats[6:]}; decode {fmt_stats(stats)}")
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


def main():
    name = sys.argv[2] if sys.argv[1] == "--prefill" else sys.argv[1]
    C.install(host_pack=C.CASES[name]().host_pack if name in C.CASES else False)
    import logging

    logging.basicConfig(level=os.environ.get("TS_LOGLEVEL", "WARNING"))
    try:
        if sys.argv[1] == "--prefill":
            prefill_main(sys.argv[2])
        else:
            decode_main(sys.argv[1])
    except BaseException:
        traceback.print_exc()
        sys.stdout.flush()
        os._exit(1)
    sys.stdout.flush()
    os._exit(0)  # TokenSpeed's threads never end


if __name__ == "__main__":
    main()
