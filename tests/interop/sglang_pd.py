"""Interop suite: SGLang's real Mooncake PD connector (pinned release, from
the interop venv, unmodified) against kvbridge's C prefill/decode (through
kvbridge's Python bindings), with kvbridge's Mooncake drop-in
(python/compat/mooncake) as SGLang's transfer engine. Run by
scripts/interop.sh (`make check-interop`); what is stubbed is in
sglang_stubs.py.

Each role is its own process (SGLang keeps per-process singletons: the
shared transfer engine, the runtime context):

  boot  {sglang|kvbridge}            a bootstrap server; prints "addr H:P"
  prefill {sglang|kvbridge} BOOT ROOM   registers, prints "ready", waits for
                                     "go" on stdin, sends pages 1..N of a
                                     known pattern to the decode, prints the
                                     outcome as one JSON line
  decode {sglang|kvbridge} BOOT ROOM    asks for ROOM into pages DST, prints
                                     the outcome and whether every KV/aux
                                     byte is the prefill's (and nothing else
                                     was written)

`run` (the driver) runs every case and prints one line per case and
"N passed, N failed". The ck_ cases turn on SGLang 0.5.23's KV checksum
(--disaggregation-enable-kv-checksum) on both sides and run SGLang's own
checksum code (sglang_checksum.py). `run-0.5.2` runs CASES_OLD with SGLang 0.5.2rc2's
connector (the seed-001 dialect, sglang_old.py; its own venv) as the SGLang
side: the roles read INTEROP_SGLANG=0.5.2rc2.
"""

import json
import os
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))

# One geometry both sides share: MHA, 2 layers (K and V buffers each), page
# size 16 tokens, 2 KV heads x 8 dims x bf16 -> 512 bytes per page per buffer.
LAYERS = 2
PAGE = 16
HEADS = 2
ITEM = PAGE * HEADS * 8 * 2
PAGES = 32
AUX_ITEM = 64
AUX_SLOTS = 8
SRC_PAGES = [3, 7, 8, 20]  # prefill page indices
DST_PAGES = [5, 1, 30, 12]  # decode page indices (same length)
SRC_AUX, DST_AUX = 2, 6
DTYPE = "bfloat16"
# MLA (INTEROP_MLA=1, set per case by the driver): one latent buffer per layer,
# one "head", is_mla_backend / is_mla on both sides.
MLA = os.environ.get("INTEROP_MLA") == "1"
N_KV = LAYERS if MLA else 2 * LAYERS
HEADS_ARG = 1 if MLA else HEADS
DEADLINE_S = 60.0
ABORT_ACK_S = 10.0  # an ABORT_ACK must come well before SGLang's 30 s release timeout
# The SGLang side is 0.5.2rc2's connector (seed-001 dialect, sglang_old.py).
OLD = os.environ.get("INTEROP_SGLANG") == "0.5.2rc2"
# A prefill rank of a TP group (the driver's tp2_ cases; the decode is TP1):
# it holds HEADS / TP_SIZE heads, the per-token slices of the TP1 pattern.
TP_SIZE = int(os.environ.get("INTEROP_TP_SIZE", "1"))
TP_RANK = int(os.environ.get("INTEROP_TP_RANK", "0"))
RITEM = ITEM if MLA else ITEM // TP_SIZE  # this rank's item length (MLA: replicated)
RHEADS = HEADS_ARG if MLA else HEADS // TP_SIZE  # this rank's KV heads
# SGLang 0.5.23's --disaggregation-enable-kv-checksum (the ck_ cases, set by
# the driver; sglang_checksum.py): both sides register a second aux buffer,
# SGLang's kv_checksum ([AUX_SLOTS, 8] uint64: digest, layout signature).
# FLIP (the _flip cases): after the prefill took its digest, one byte of a
# source page changes before the write (what a corruption between the
# prefill's digest and the decode's pages looks like): the decode's check
# must catch it.
CK = os.environ.get("INTEROP_CKSUM") == "1"
FLIP = os.environ.get("INTEROP_FLIP") == "1"
CK_AUX = 1  # the checksum buffer's aux index (after the one aux buffer)
FLIP_BUF, FLIP_PAGE_I, FLIP_BYTE = 1, 2, 100  # kv buffer, index into SRC_PAGES, byte


def out(obj):
    sys.stdout.write((obj if isinstance(obj, str) else json.dumps(obj)) + "\n")
    sys.stdout.flush()


def pattern(np, buf, page, room):
    """Bytes of prefill buffer `buf`, page `page`: distinct per buffer, page, room."""
    return ((np.arange(ITEM, dtype=np.uint32) * 7 + buf * 131 + page * 29 + room * 3 + 1) % 251 + 1).astype(np.uint8)


def aux_pattern(np, slot, room):
    return ((np.arange(AUX_ITEM, dtype=np.uint32) * 5 + slot * 17 + room + 3) % 253 + 1).astype(np.uint8)


def buffers(np, fill_room=None):
    """N_KV KV buffers (MHA: K layers then V layers) and one aux buffer; a
    prefill rank of a TP group holds heads [TP_RANK * RHEADS, +RHEADS) of
    each token row of the TP1 pattern (so the TP1 decode verifies as ever)."""
    item = RITEM if fill_room is not None else ITEM
    kv = [np.zeros(PAGES * item, dtype=np.uint8) for _ in range(N_KV)]
    aux = np.zeros(AUX_SLOTS * AUX_ITEM, dtype=np.uint8)
    row, rrow = ITEM // PAGE, item // PAGE  # bytes of one token, all heads / this rank's
    if fill_room is not None:
        for b, arr in enumerate(kv):
            for p in range(PAGES):
                full = pattern(np, b, p, fill_room).reshape(PAGE, row)
                part = full[:, TP_RANK * rrow:(TP_RANK + 1) * rrow] if rrow < row else full
                arr[p * item:(p + 1) * item] = part.reshape(-1)
        for s in range(AUX_SLOTS):
            aux[s * AUX_ITEM:(s + 1) * AUX_ITEM] = aux_pattern(np, s, fill_room)
    return kv, aux


def ck_row_want(np, room):
    """The checksum row the prefill writes: the Adler-32 of its pattern's
    pages (every buffer in order, the pages in request order), the layout
    signature, six zero words."""
    import zlib

    d = zlib.adler32(b"".join(pattern(np, b, p, room).tobytes() for b in range(N_KV)
                              for p in SRC_PAGES))
    row = np.zeros(8, dtype=np.uint64)
    row[0], row[1] = d, ck_module().layout_signature(layout_ns())
    return row.view(np.uint8)


def verify(np, kv, aux, room, ck=None):
    """'' if decode memory holds exactly the prefill's pages/aux, else why."""
    if ck is not None:
        got = np.frombuffer(ck.numpy().tobytes() if hasattr(ck, "numpy") else ck.tobytes(),
                            dtype=np.uint8)
        item = len(got) // AUX_SLOTS
        for s in range(AUX_SLOTS):
            want = ck_row_want(np, room) if s == DST_AUX else np.zeros(item, np.uint8)
            if not np.array_equal(got[s * item:(s + 1) * item], want):
                bad = int(np.argmax(got[s * item:(s + 1) * item] != want))
                return (f"kv_checksum slot {s} byte {bad}: "
                        f"{int(got[s * item + bad])} != {int(want[bad])}")
    for b, arr in enumerate(kv):
        for p in range(PAGES):
            got = arr[p * ITEM:(p + 1) * ITEM]
            if p in DST_PAGES:
                want = pattern(np, b, SRC_PAGES[DST_PAGES.index(p)], room)
            else:
                want = np.zeros(ITEM, dtype=np.uint8)
            if not np.array_equal(got, want):
                bad = int(np.argmax(got != want))
                return f"kv buffer {b} page {p} byte {bad}: {int(got[bad])} != {int(want[bad])}"
    for s in range(AUX_SLOTS):
        got = aux[s * AUX_ITEM:(s + 1) * AUX_ITEM]
        want = aux_pattern(np, SRC_AUX, room) if s == DST_AUX else np.zeros(AUX_ITEM, np.uint8)
        # SGLang's aux item is the whole slot; kvbridge compares the same bytes.
        if not np.array_equal(got, want):
            bad = int(np.argmax(got != want))
            return f"aux slot {s} byte {bad}: {int(got[bad])} != {int(want[bad])}"
    return ""


def ptrs(arrs):
    return [a.ctypes.data for a in arrs]


def aux_list(aux, ck):
    """(pointers, lengths, item lengths) of the aux buffers: the one aux
    buffer, then SGLang's kv_checksum (a torch tensor on the SGLang side, a
    numpy array on kvbridge's) in the ck_ cases."""
    if ck is None:
        return [aux.ctypes.data], [aux.nbytes], [AUX_ITEM]
    p = ck.data_ptr() if hasattr(ck, "data_ptr") else ck.ctypes.data
    n = ck.nbytes
    return [aux.ctypes.data, p], [aux.nbytes, n], [AUX_ITEM, n // AUX_SLOTS]


def layout_ns():
    """This geometry as SGLang's KVArgs describes it to kv_layout_signature
    (what an application fills in when it speaks SGLang's checksum)."""
    import types

    return types.SimpleNamespace(page_size=PAGE, kv_cache_dtype_str=DTYPE, kv_layout=None,
                                 swa_kv_cache_layout=None, state_types=[],
                                 kv_item_lens=[RITEM] * N_KV, state_item_lens=[])


def flip_source(kv):
    """FLIP: change one byte of a source page after the digest was taken."""
    if FLIP:
        kv[FLIP_BUF][SRC_PAGES[FLIP_PAGE_I] * RITEM + FLIP_BYTE] ^= 0xFF


def ck_module():
    sys.path.insert(0, HERE)
    import sglang_checksum

    return sglang_checksum


# ---------------------------------------------------------------- SGLang side
def sglang_setup(boot_port=0):
    """Stubs first, then SGLang's modules (see sglang_stubs.py)."""
    sys.path.insert(0, HERE)
    import sglang_stubs

    sglang_stubs.install(bootstrap_port=boot_port, tp_rank=TP_RANK, tp_size=TP_SIZE)
    import sglang.srt.disaggregation.mooncake.conn as mc
    from sglang.srt.disaggregation.base.conn import KVArgs
    from sglang.srt.distributed.device_communicators import mooncake_transfer_engine as mte

    import mooncake

    assert getattr(mooncake, "KVBRIDGE_DROP_IN", False), "mooncake is not kvbridge's drop-in"
    return sglang_stubs, mc, KVArgs, mte


def sglang_kv_args(KVArgs, kv, aux, ck=None):
    a = KVArgs()
    a.engine_rank = TP_RANK
    a.pp_rank = 0
    a.system_dp_rank = 0
    a.kv_cache_dtype_str = DTYPE
    a.kv_layout = None
    a.kv_data_ptrs = ptrs(kv)
    a.kv_data_lens = [x.nbytes for x in kv]
    a.kv_item_lens = [kv[0].nbytes // PAGES] * len(kv)
    a.num_draft_entries = 0
    a.kv_layer_ids = []
    a.page_size = PAGE
    a.aux_data_ptrs, a.aux_data_lens, a.aux_item_lens = aux_list(aux, ck)
    a.state_types = []
    a.state_data_ptrs = []
    a.state_data_lens = []
    a.state_item_lens = []
    a.state_layer_ids = []
    a.state_dim_per_tensor = []
    a.state_slice_outer_counts = []
    a.state_conv_shard_groups = []
    a.swa_kv_cache_layout = None
    a.is_hybrid_mla_backend = False
    a.ib_device = None
    a.gpu_id = 0
    a.kv_head_num = HEADS_ARG * (kv[0].nbytes // PAGES) // ITEM  # this rank's heads
    a.total_kv_head_num = HEADS_ARG
    a.prefill_start_layer = 0
    a.prefill_end_layer = None
    a.mla_compression_ratios = None
    a.rust_http_port = None
    return a


def sglang_engine(mte):
    # SGLang's own wrapper and initializer, over the drop-in engine.
    return mte.init_mooncake_transfer_engine(hostname="127.0.0.1", gpu_id=0, ib_device=None)


def wait_terminal(poll, KVPoll, deadline_s=DEADLINE_S):
    end = time.monotonic() + deadline_s
    st = poll()
    while st not in (KVPoll.Success, KVPoll.Failed) and time.monotonic() < end:
        time.sleep(0.01)
        st = poll()
    return st


def reason_of(obj):
    try:
        obj.failure_exception()
    except Exception as e:  # KVTransferError
        return str(e)
    return ""


def old():
    sys.path.insert(0, HERE)
    import sglang_old

    return sglang_old


def role_boot(kind):
    if kind == "sglang" and OLD:
        srv, addr = old().boot()
    elif kind == "sglang":
        _, mc, _, _ = sglang_setup()
        import socket

        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()
        srv = mc.MooncakeKVBootstrapServer("127.0.0.1", port)
        addr = f"127.0.0.1:{port}"
    else:
        import kvbridge

        srv = kvbridge.KVBootstrapServer("127.0.0.1", 0)
        addr = srv.address
    import requests

    end = time.monotonic() + 20
    while time.monotonic() < end:
        try:
            requests.get(f"http://{addr}/health", timeout=1)
            break
        except Exception:
            time.sleep(0.05)
    out(f"addr {addr}")
    sys.stdin.read()  # until the driver closes stdin
    if kind == "kvbridge":
        srv.close()


def role_prefill(kind, boot, room):
    import numpy as np

    kv, aux = buffers(np, fill_room=room)
    n = len(SRC_PAGES)
    if kind == "sglang" and OLD:
        old().prefill(sys.modules[__name__], boot, room)
    elif kind == "sglang":
        stubs, mc, KVArgs, mte = sglang_setup(int(boot.rsplit(":", 1)[1]))
        from sglang.srt.disaggregation.base.conn import KVPoll
        from sglang.srt.disaggregation.utils import DisaggregationMode

        sglang_engine(mte)
        ck = ck_module().checksum_tensor(AUX_SLOTS) if CK else None
        kv_args = sglang_kv_args(KVArgs, kv, aux, ck)
        mgr = mc.MooncakeKVManager(kv_args, DisaggregationMode.PREFILL, stubs.server_args(), MLA)
        out("ready")
        sender = mc.MooncakeKVSender(mgr, boot, room)
        st = wait_until(sender.poll, (KVPoll.WaitingForInput,), KVPoll)
        if st != KVPoll.WaitingForInput:
            out({"status": int(st), "reason": reason_of(sender), "stage": "bootstrap"})
            return
        out("waiting")
        if sys.stdin.readline().strip() == "go":  # else "wait": the decode aborts
            sender.init(n, SRC_AUX)
            if CK:  # SGLang's send_kv_chunk: digest, row, then the connector's send
                def send(req):
                    flip_source(kv)
                    sender.send(np.array(SRC_PAGES, dtype=np.int32))

                ck_module().prefill_send(kv_args.kv_data_ptrs, kv_args.kv_item_lens, SRC_PAGES,
                                         PAGE, ck_module().layout_signature(kv_args), ck,
                                         SRC_AUX, room, send)
            else:
                sender.send(np.array(SRC_PAGES, dtype=np.int32))
        st = wait_terminal(sender.poll, KVPoll)
        out({"status": int(st), "reason": reason_of(sender) if st == KVPoll.Failed else ""})
    else:
        import kvbridge
        from kvbridge import KVPoll

        ck = np.zeros(AUX_SLOTS * 64, dtype=np.uint8) if CK else None
        ap, al, ai = aux_list(aux, ck)
        args = kvbridge.KVArgs(kv_data_ptrs=ptrs(kv), kv_data_lens=[x.nbytes for x in kv],
                               kv_item_lens=[RITEM] * len(kv), aux_data_ptrs=ap,
                               aux_data_lens=al, aux_item_lens=ai, page_size=PAGE,
                               kv_head_num=RHEADS, engine_rank=TP_RANK)
        mgr = kvbridge.KVManager(args, "prefill", bootstrap_addr=boot, host="127.0.0.1", is_mla=MLA,
                                 attn_tp_size=TP_SIZE, attn_tp_rank=TP_RANK)
        out("ready")
        sender = kvbridge.KVSender(mgr, boot, room)
        st = wait_until(sender.poll, (KVPoll.WaitingForInput,), KVPoll)
        if st != KVPoll.WaitingForInput:
            out({"status": int(st), "reason": reason_of(sender), "stage": "bootstrap"})
            return
        out("waiting")
        if sys.stdin.readline().strip() == "go":  # else "wait": the decode aborts
            sender.init(n, SRC_AUX)
            if CK:  # the application fills SGLang's row, as SGLang's scheduler does
                row = ck[SRC_AUX * 64:(SRC_AUX + 1) * 64].view(np.uint64)
                row[0] = mgr.sglang_kv_checksum(SRC_PAGES)
                row[1] = ck_module().layout_signature(layout_ns())
                flip_source(kv)
            sender.send(np.array(SRC_PAGES, dtype=np.int32))
        st = wait_terminal(sender.poll, KVPoll)
        out({"status": int(st), "reason": reason_of(sender) if st == KVPoll.Failed else ""})
        mgr.close()


def wait_true(fn, deadline_s=ABORT_ACK_S):
    """Seconds until fn() held, or None past the bound."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < deadline_s:
        if fn():
            return round(time.monotonic() - t0, 2)
        time.sleep(0.02)
    return None


def wait_until(poll, wanted, KVPoll, deadline_s=DEADLINE_S):
    end = time.monotonic() + deadline_s
    st = poll()
    while st not in wanted and st != KVPoll.Failed and time.monotonic() < end:
        time.sleep(0.01)
        st = poll()
    return st


def role_decode(kind, boot, room):
    import numpy as np

    kv, aux = buffers(np)
    if kind == "sglang" and OLD:
        old().decode(sys.modules[__name__], boot, room)
        return
    if kind == "sglang":
        stubs, mc, KVArgs, mte = sglang_setup()
        from sglang.srt.disaggregation.base.conn import KVPoll
        from sglang.srt.disaggregation.utils import DisaggregationMode

        sglang_engine(mte)
        ck = ck_module().checksum_tensor(AUX_SLOTS) if CK else None
        kv_args = sglang_kv_args(KVArgs, kv, aux, ck)
        mgr = mc.MooncakeKVManager(kv_args, DisaggregationMode.DECODE, stubs.server_args(), MLA)
        recv = mc.MooncakeKVReceiver(mgr, boot, room)
        # What the decode scheduler does (decode.py): parallel info, then
        # init(prefill_dp_rank), then send_metadata with the page indices.
        end = time.monotonic() + 20
        while not mgr.try_ensure_parallel_info(boot) and time.monotonic() < end:
            time.sleep(0.1)
        recv.init(0)
        recv.send_metadata(np.array(DST_PAGES, dtype=np.int32), DST_AUX, None)
        out("sent")
        if sys.stdin.readline().strip() == "abort":
            recv.abort()
            # SGLang frees the pages once every prefill rank ACKed (deferred
            # decode KV release, on by default in 0.5.23).
            ack = wait_true(lambda: mgr.is_abort_release_safe(room, 1))
        st = wait_terminal(recv.poll, KVPoll)
        res = {"status": int(st), "reason": reason_of(recv) if st == KVPoll.Failed else ""}
        if CK and st == KVPoll.Success:  # SGLang's decode scheduler's check
            res["checksum"] = ck_module().decode_verify(
                mgr, kv_args.kv_data_ptrs, kv_args.kv_item_lens, DST_PAGES, PAGE,
                ck_module().layout_signature(kv_args), ck, DST_AUX, room, boot)
    else:
        import kvbridge
        from kvbridge import KVPoll

        ck = np.zeros(AUX_SLOTS * 64, dtype=np.uint8) if CK else None
        ap, al, ai = aux_list(aux, ck)
        args = kvbridge.KVArgs(kv_data_ptrs=ptrs(kv), kv_data_lens=[x.nbytes for x in kv],
                               kv_item_lens=[ITEM] * len(kv), aux_data_ptrs=ap,
                               aux_data_lens=al, aux_item_lens=ai, page_size=PAGE,
                               kv_head_num=HEADS_ARG, engine_rank=0)
        ck_kw = dict(integrity="check", sglang_kv_checksum_aux=CK_AUX) if CK else {}
        mgr = kvbridge.KVManager(args, "decode", host="127.0.0.1", is_mla=MLA, **ck_kw)
        recv = kvbridge.KVReceiver(mgr, boot, room)
        recv.init(np.array(DST_PAGES, dtype=np.int32), DST_AUX)
        out("sent")
        if sys.stdin.readline().strip() == "abort":
            recv.abort()
            ack = wait_true(recv.pages_safe)  # the prefill's ABORT_ACK closed the fence
        st = wait_terminal(recv.poll, KVPoll)
        res = {"status": int(st), "reason": recv.failure_reason() if st == KVPoll.Failed else ""}
        if CK:
            t = mgr.traffic()
            res["integrity"] = {k: t["integrity_" + k]
                                for k in ("checked", "mismatches", "unchecked")}
    res["bytes"] = (verify(np, kv, aux, room, ck if CK else None) if res["status"] == 4
                    else "not checked")
    if "ack" in locals():
        res["released_after_ack"] = ack
    out(res)
    if kind == "kvbridge":
        mgr.close()


# ---------------------------------------------------------------- driver
class Proc:
    def __init__(self, args, env):
        self.p = subprocess.Popen([sys.executable, os.path.abspath(__file__)] + args, env=env,
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=open(env["INTEROP_LOG"], "a"), text=True)

    def line(self, timeout_s=DEADLINE_S + 30):
        import select

        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            r, _, _ = select.select([self.p.stdout], [], [], 0.5)
            if r:
                s = self.p.stdout.readline()
                if not s:
                    raise RuntimeError(f"process exited rc={self.p.poll()}")
                return s.strip()
        raise RuntimeError("no line within %.0f s" % timeout_s)

    def send(self, s):
        self.p.stdin.write(s + "\n")
        self.p.stdin.flush()

    def stop(self):
        try:
            self.p.stdin.close()
        except Exception:
            pass
        try:
            self.p.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait()

    def kill(self):
        self.p.send_signal(signal.SIGKILL)
        self.p.wait()


def stop_all(procs):
    for p in reversed(procs):
        if p.p.poll() is None:
            p.stop()


def run_tp2(boot_kind, prefill_kind, decode_kind, room, env):
    """Transfer from two prefill ranks (attention TP 2, one KV head each) to
    a TP1 decode (both heads): every byte of the decode's pages checked."""
    procs = []
    try:
        boot = Proc(["boot", boot_kind], env)
        procs.append(boot)
        addr = boot.line().split()[1]
        pres = []
        for r in range(2):
            pres.append(Proc(["prefill", prefill_kind, addr, str(room)],
                             dict(env, INTEROP_TP_SIZE="2", INTEROP_TP_RANK=str(r))))
            procs.append(pres[-1])
            assert pres[-1].line() == "ready"
        dec = Proc(["decode", decode_kind, addr, str(room)], env)
        procs.append(dec)
        assert dec.line() == "sent"
        for r, pre in enumerate(pres):
            w = pre.line()
            if w != "waiting":
                return False, f"prefill rank {r} never ready to send: {w}"
        for pre in pres:
            pre.send("go")
        dec.send("wait")
        pr = [json.loads(pre.line()) for pre in pres]
        dres = json.loads(dec.line())
        ok = all(x["status"] == 4 for x in pr) and dres["status"] == 4 and dres["bytes"] == ""
        return ok, f"prefill ranks: {pr} decode: {dres}"
    except Exception as e:
        return False, f"{type(e).__name__}: {e}"
    finally:
        stop_all(procs)


def record_server(addr, case):
    """--record: the release's own bootstrap server's answers (registered
    by its own prefill), asked by the driver."""
    if os.environ.get("KVB_RECORD_DIR"):
        sys.path.insert(0, HERE)
        import interop_record

        interop_record.query_server(addr, os.environ.get("INTEROP_SGLANG") != "0.5.2rc2", case)


def judge_checksum(name, pres, dres, decode_kind):
    """The ck_ cases. Clean: both Success, every byte (KV, aux, the
    checksum row) the prefill's, and the decode's check compared the digest
    and found it equal (kvbridge: counted checked; SGLang: its
    _verify_kv_checksums compared and dropped nothing). _flip: the decode's
    check reports the mismatch (kvbridge: the room Failed with the reason,
    counted; SGLang: its message, the request dropped from the batch) and
    the flipped byte is where the bytes differ."""
    flip = "_flip" in name
    flipped = (f"kv buffer {FLIP_BUF} page {DST_PAGES[FLIP_PAGE_I]} byte {FLIP_BYTE}:")
    if pres["status"] != 4:
        return False
    if decode_kind == "kvbridge":
        integ = dres.get("integrity", {})
        if flip:
            return (dres["status"] == 0 and "SGLang KV checksum mismatch" in dres["reason"]
                    and integ == {"checked": 1, "mismatches": 1, "unchecked": 0})
        return (dres["status"] == 4 and dres["bytes"] == ""
                and integ == {"checked": 1, "mismatches": 0, "unchecked": 0})
    ck = dres.get("checksum", {})
    if dres["status"] != 4 or not ck.get("compared"):
        return False
    if flip:
        return (ck["mismatch"].startswith("KV checksum mismatch req=") and ck["dropped"]
                and dres["bytes"].startswith(flipped))
    return ck["verified"] and ck["mismatch"] == "" and dres["bytes"] == ""


def run_case(name, boot_kind, prefill_kind, decode_kind, room, env, kill=None):
    env = dict(env, INTEROP_MLA="1" if name.startswith("mla_") else "0",
               INTEROP_CKSUM="1" if name.startswith("ck_") else "0",
               INTEROP_FLIP="1" if "_flip" in name else "0")
    if name.startswith("tp2_"):
        env = dict(env, INTEROP_LOG=os.path.join(env["INTEROP_OUT"], name + ".log"))
        return run_tp2(boot_kind, prefill_kind, decode_kind, room, env)
    """kill: None, "prefill" (with its bootstrap server, after the decode's
    request arrived), "decode" (after its request arrived, before the prefill
    sends) or "abort" (the decode aborts then: both sides Failed with a
    reason, and the decode's pages released by the prefill's ABORT_ACK within
    ABORT_ACK_S)."""
    env = dict(env, INTEROP_LOG=os.path.join(env["INTEROP_OUT"], name + ".log"))
    procs = []
    try:
        boot = Proc(["boot", boot_kind], env)
        procs.append(boot)
        addr = boot.line().split()[1]
        pre = Proc(["prefill", prefill_kind, addr, str(room)], env)
        procs.append(pre)
        assert pre.line() == "ready"
        if boot_kind == "sglang" and prefill_kind == "sglang":
            record_server(addr, name)
        dec = Proc(["decode", decode_kind, addr, str(room)], env)
        procs.append(dec)
        assert dec.line() == "sent"
        w = pre.line()
        if w != "waiting":
            return False, f"prefill never ready to send: {w}"
        if kill == "abort":
            dec.send("abort")
            pre.send("wait")
            pres = json.loads(pre.line())
            dres = json.loads(dec.line())
            ok = (pres["status"] == 0 and pres["reason"] != "" and dres["status"] == 0
                  and dres.get("released_after_ack") is not None)
            return ok, f"prefill: {pres} decode: {dres}"
        if kill == "prefill":
            dec.send("wait")
            pre.kill()
            boot.kill()
            res = json.loads(dec.line())
            ok = res["status"] == 0 and res["reason"] != ""
            return ok, f"decode: {res}"
        if kill == "decode":
            dec.kill()
            pre.send("go")
            res = json.loads(pre.line())
            ok = res["status"] == 0 and res["reason"] != ""
            return ok, f"prefill: {res}"
        pre.send("go")
        dec.send("wait")
        pres = json.loads(pre.line())
        dres = json.loads(dec.line())
        if name.startswith("ck_"):
            return judge_checksum(name, pres, dres, decode_kind), f"prefill: {pres} decode: {dres}"
        ok = pres["status"] == 4 and dres["status"] == 4 and dres["bytes"] == ""
        return ok, f"prefill: {pres} decode: {dres}"
    except Exception as e:
        return False, f"{type(e).__name__}: {e}"
    finally:
        stop_all(procs)


CASES = [
    # name, bootstrap server, prefill, decode, kill, transfer case it needs
    ("sglang_decode_from_kvbridge_prefill__kvbridge_boot", "kvbridge", "kvbridge", "sglang", None, None),
    ("sglang_decode_from_kvbridge_prefill__sglang_boot", "sglang", "kvbridge", "sglang", None, None),
    ("kvbridge_decode_from_sglang_prefill__sglang_boot", "sglang", "sglang", "kvbridge", None, None),
    ("kvbridge_decode_from_sglang_prefill__kvbridge_boot", "kvbridge", "sglang", "kvbridge", None, None),
    ("sglang_decode__kvbridge_prefill_killed", "kvbridge", "kvbridge", "sglang", "prefill", 0),
    ("kvbridge_decode__sglang_prefill_killed", "sglang", "sglang", "kvbridge", "prefill", 2),
    ("sglang_prefill__kvbridge_decode_killed", "sglang", "sglang", "kvbridge", "decode", 2),
    ("kvbridge_prefill__sglang_decode_killed", "kvbridge", "kvbridge", "sglang", "decode", 0),
    ("sglang_decode_aborts__kvbridge_prefill", "kvbridge", "kvbridge", "sglang", "abort", 0),
    ("mla_sglang_decode_from_kvbridge_prefill__sglang_boot", "sglang", "kvbridge", "sglang", None, None),
    ("mla_kvbridge_decode_from_sglang_prefill__kvbridge_boot", "kvbridge", "sglang", "kvbridge", None, None),
    ("kvbridge_decode_aborts__sglang_prefill", "sglang", "sglang", "kvbridge", "abort", 2),
    # Prefill attention TP 2 -> decode TP 1 (non-MLA: both prefill ranks real
    # sources, each writing its KV head into every token row).
    ("tp2_kvbridge_decode_from_sglang_prefill__sglang_boot", "sglang", "sglang", "kvbridge", None, None),
    ("tp2_sglang_decode_from_kvbridge_prefill__kvbridge_boot", "kvbridge", "kvbridge", "sglang", None, None),
    # --disaggregation-enable-kv-checksum (sglang_checksum.py): SGLang's
    # kv_checksum aux moved like every aux buffer and checked by the decode,
    # kvbridge's (integrity check, sglang_kv_checksum_aux) or SGLang's own
    # scheduler code; _flip: a source byte changed after the digest, caught.
    ("ck_kvbridge_decode_from_sglang_prefill__sglang_boot", "sglang", "sglang", "kvbridge", None, None),
    ("ck_sglang_decode_from_kvbridge_prefill__kvbridge_boot", "kvbridge", "kvbridge", "sglang", None, None),
    ("ck_flip_kvbridge_decode_from_sglang_prefill__sglang_boot", "sglang", "sglang", "kvbridge", None, None),
    ("ck_flip_sglang_decode_from_kvbridge_prefill__kvbridge_boot", "kvbridge", "kvbridge", "sglang", None, None),
]

# The seed-001 dialect: SGLang 0.5.2rc2 against kvbridge's defaults (its
# decode falls back to the 2025 dialect on the old server's 400, its prefill's
# union registration is what the old server reads). No abort cases: seed 001
# has no abort message.
CASES_OLD = [c for c in CASES if "abort" not in c[0] and not c[0].startswith(("mla_", "tp2_", "ck_"))]

# Strict expected failures (as ctest's known_bug label): reported XFAIL while
# they fail, and a failure of the suite (XPASS) once they pass, so that the
# entry and docs/testing.md get updated.
KNOWN = {}


def driver(outdir, only=None, cases=CASES):
    """A kill case counts only when the same pair moved verified bytes in
    its transfer case (else its Failed could have another cause)."""
    os.makedirs(outdir, exist_ok=True)
    env = dict(os.environ, INTEROP_OUT=outdir)
    passed = failed = 0
    results = {}
    for i, (name, boot, pre, dec, kill, needs) in enumerate(cases):
        if only and only not in name:
            continue
        t0 = time.monotonic()
        ok, detail = run_case(name, boot, pre, dec, 1000 + i, env, kill)
        if ok and needs is not None and results.get(needs) is not True:
            ok = False
            detail = f"not counted: its transfer case {cases[needs][0]} did not pass; {detail}"
        results[i] = ok
        dt = time.monotonic() - t0
        word = "PASS" if ok else "FAIL"
        if name in KNOWN:
            word = "XPASS" if ok else "XFAIL"
            detail = f"known: {KNOWN[name]}; {detail}"
            ok = not ok
        print(f"{word} {name} ({dt:.1f} s): {detail}", flush=True)
        passed, failed = passed + ok, failed + (not ok)
    print(f"{passed} passed, {failed} failed")
    return 0 if failed == 0 else 1


def main(argv):
    role = argv[0]
    if role == "run":
        return driver(argv[1], argv[2] if len(argv) > 2 else None)
    if role == "run-0.5.2":
        os.environ["INTEROP_SGLANG"] = "0.5.2rc2"
        return driver(argv[1], argv[2] if len(argv) > 2 else None, CASES_OLD)
    if role in ("boot", "prefill", "decode") and argv[1] == "sglang":
        # --record (scripts/interop.sh): what SGLang's own code sends and reads
        sys.path.insert(0, HERE)
        import interop_record

        interop_record.install(role)
    if role == "boot":
        role_boot(argv[1])
    elif role == "prefill":
        role_prefill(argv[1], argv[2], int(argv[3]))
    elif role == "decode":
        role_decode(argv[1], argv[2], int(argv[3]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
