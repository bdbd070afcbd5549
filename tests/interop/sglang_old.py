"""The SGLang side of the interop suite for the seed-001 dialect: SGLang
0.5.2rc2's real Mooncake PD connector (sglang/srt/disaggregation/mooncake/
conn.py, the connector seed 001 was written from; PROTOCOL-SGLANG-2026.md
section 0), unmodified, from its own venv (BUILD/interop-venv-0.5.2), with
kvbridge's Mooncake drop-in as its transfer engine. sglang_pd.py runs it in
place of 0.5.23's when INTEROP_SGLANG=0.5.2rc2 (its driver's `run-0.5.2`).

Stubbed (nothing else), after the connector module is imported, since it
binds these names at import:

- get_attention_tp_size/_rank, get_attention_dp_size/_rank
  (sglang.srt.layers.dp_attention) and get_pp_group
  (sglang.srt.distributed): module globals a launched SGLang server
  initialises with its model runner and torch.distributed; here one
  TP1/DP1/PP1 rank (the last PP rank);
- get_local_ip_auto: 0.5.2rc2 guesses its IP from a UDP connect towards
  8.8.8.8 (only a NIC name, needing netifaces, overrides it); here
  127.0.0.1, the loopback the suite runs on;
- the `server_args` argument: the five fields the connector reads.

KV and aux buffers are host memory (numpy), as in sglang_pd.py.
"""

import sys
import time
import types


def setup():
    import sglang.srt.disaggregation.mooncake.conn as mc
    from sglang.srt.disaggregation.base.conn import KVArgs, KVPoll
    from sglang.srt.disaggregation.utils import DisaggregationMode

    mc.get_attention_tp_size = lambda: 1
    mc.get_attention_tp_rank = lambda: 0
    mc.get_attention_dp_size = lambda: 1
    mc.get_attention_dp_rank = lambda: 0
    mc.get_pp_group = lambda: types.SimpleNamespace(is_last_rank=True)
    mc.get_local_ip_auto = lambda: "127.0.0.1"
    import mooncake

    assert getattr(mooncake, "KVBRIDGE_DROP_IN", False), "mooncake is not kvbridge's drop-in"
    return mc, KVArgs, KVPoll, DisaggregationMode


def server_args(boot_port=0):
    return types.SimpleNamespace(disaggregation_bootstrap_port=boot_port, dist_init_addr=None,
                                 enable_dp_attention=False, dp_size=1, pp_size=1)


def kv_args(KVArgs, g, kv, aux):
    """g: the geometry module (sglang_pd): ITEM, PAGE, HEADS_ARG, AUX_ITEM."""
    a = KVArgs()
    a.engine_rank = 0
    a.kv_data_ptrs = [x.ctypes.data for x in kv]
    a.kv_data_lens = [x.nbytes for x in kv]
    a.kv_item_lens = [g.ITEM] * len(kv)
    a.aux_data_ptrs = [aux.ctypes.data]
    a.aux_data_lens = [aux.nbytes]
    a.aux_item_lens = [g.AUX_ITEM]
    a.ib_device = None
    a.ib_traffic_class = None
    a.gpu_id = 0
    a.decode_tp_size = 1
    a.kv_head_num = g.HEADS_ARG
    a.page_size = g.PAGE
    a.prefill_pp_size = 1
    a.pp_rank = 0
    a.prefill_start_layer = 0
    a.system_dp_rank = 0
    return a


def boot():
    mc, _, _, _ = setup()
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return mc.MooncakeKVBootstrapServer(port), f"127.0.0.1:{port}"


def prefill(g, boot_addr, room):
    """The prefill role (sglang_pd.role_prefill's protocol on stdin/stdout)."""
    import numpy as np

    mc, KVArgs, KVPoll, Mode = setup()
    kv, aux = g.buffers(np, fill_room=room)
    mgr = mc.MooncakeKVManager(kv_args(KVArgs, g, kv, aux), Mode.PREFILL,
                               server_args(int(boot_addr.rsplit(":", 1)[1])), g.MLA)
    g.out("ready")
    sender = mc.MooncakeKVSender(mgr, boot_addr, room, [0], 0)
    st = g.wait_until(sender.poll, (KVPoll.WaitingForInput,), KVPoll)
    if st != KVPoll.WaitingForInput:
        g.out({"status": int(st), "reason": g.reason_of(sender), "stage": "bootstrap"})
        return
    g.out("waiting")
    if sys.stdin.readline().strip() == "go":
        sender.init(len(g.SRC_PAGES), g.SRC_AUX)
        sender.send(np.array(g.SRC_PAGES, dtype=np.int32))
    st = g.wait_terminal(sender.poll, KVPoll)
    g.out({"status": int(st), "reason": g.reason_of(sender) if st == KVPoll.Failed else ""})


def decode(g, boot_addr, room):
    import numpy as np

    mc, KVArgs, KVPoll, Mode = setup()
    kv, aux = g.buffers(np)
    mgr = mc.MooncakeKVManager(kv_args(KVArgs, g, kv, aux), Mode.DECODE, server_args(), g.MLA)
    # The old receiver fetches the parallel info and the prefill ranks in its
    # constructor (a missing one fails the room); init() sends the KV args
    # and the transfer info.
    recv = mc.MooncakeKVReceiver(mgr, boot_addr, room, None)
    recv.init(np.array(g.DST_PAGES, dtype=np.int32), g.DST_AUX)
    g.out("sent")
    sys.stdin.readline()  # "wait" (seed 001 has no abort message)
    st = g.wait_terminal(recv.poll, KVPoll)
    res = {"status": int(st), "reason": g.reason_of(recv) if st == KVPoll.Failed else ""}
    res["bytes"] = g.verify(np, kv, aux, room) if res["status"] == 4 else "not checked"
    time.sleep(0.1)
    g.out(res)
