#!/usr/bin/env python3
"""vLLM 0.34's NixlConnector pull, replayed on NIXL's Python agent with
backend KVBRIDGE (kvbridge's plug-in): the exact calls, arguments and
notification formats its workers make, recorded from its source into
tests/interop/golden/vllm034_nixl_pull.json (file:line of each), in two
processes: this one the decode rank, a child (--prefill) the prefill rank.
Each side wraps its nixl_agent in a recorder; the order in which each
method is first called must be the golden's.

The request flow: the prefill fills its KV blocks (4 layers x 64 blocks x
256 KiB, Nx5 strided descriptors as vLLM builds them), the decode reads
request A's blocks (notif "reqA:1"), reads request B twice (two consumers,
each half of its blocks, notif "reqB:2"), sends a heartbeat "HB:reqC" and,
for request C (a full prefix hit), only the notification "reqC:1". The
prefill counts notifications as vLLM does (rsplit(":", 1)) and, the moment
a request's count is reached, frees its blocks by overwriting them (the
next request's KV would): a notification that came before the READ's bytes
were taken would leave garbage in the decode's copy, which the decode
compares byte for byte with what the prefill computed."""
import base64
import json
import os
import socket
import subprocess
import sys
import time
import uuid

import numpy as np
from nixl._api import nixl_agent, nixl_agent_config

HERE = os.path.dirname(os.path.abspath(__file__))
GOLDEN = json.load(open(os.path.join(HERE, "golden", "vllm034_nixl_pull.json")))
BACKENDS = ["KVBRIDGE"]
LAYERS, BLOCKS, BLOCK_LEN = 4, 64, 256 << 10
REQS = {"reqA": list(range(3, 19)), "reqB": list(range(20, 52)), "reqC": list(range(52, 60))}


class Recorder:
    """The agent, with the order each method was first called in."""

    def __init__(self, agent):
        self._a, self.first = agent, []

    def __getattr__(self, name):
        f = getattr(self._a, name)
        if callable(f) and name not in self.first:
            self.first.append(name)
        return f


def make_agent():
    # base_worker.py:790-812: a non-UCX backend named -> this config
    return Recorder(nixl_agent(str(uuid.uuid4()),
                               nixl_agent_config(backends=BACKENDS, capture_telemetry=True)))


def block_value(layer, block, salt):
    return np.uint8((layer * 131 + block * 7 + salt) % 251 + 1)


def kv_caches():
    return [np.zeros(BLOCKS * BLOCK_LEN, dtype=np.uint8) for _ in range(LAYERS)]


def register_kv(a, caches):
    # base_worker.py:1935-1944
    ranges = [(c.ctypes.data, c.nbytes, 0, "") for c in caches]
    descs = a.get_reg_descs(ranges, "DRAM")
    a.register_memory(descs, backends=BACKENDS)
    # base_worker.py:2247-2267 (_build_fa_local / _block_strided_descs): one
    # Nx5 row per region: (base, block_len, device, stride, num_blocks)
    blocks_data = np.array([[c.ctypes.data, BLOCK_LEN, 0, BLOCK_LEN, BLOCKS] for c in caches],
                           dtype=np.uint64)
    handle = a.prep_xfer_dlist("NIXL_INIT_AGENT", blocks_data, mem_type="DRAM")  # :2409
    return descs, handle


def desc_ids(block_ids):
    # base_worker.py:170-229 (_compute_desc_ids, all-attention fast path)
    offsets = np.arange(LAYERS, dtype=np.int64) * BLOCKS
    return (offsets[:, None] + np.asarray(block_ids, dtype=np.int64)[None, :]).ravel()


def check_order(side, rec):
    want = []
    for name, _, _ in GOLDEN[side]:
        if name not in want:
            want.append(name)
    if rec.first != want:
        print(f"FAIL: {side} call order {rec.first}, vLLM 0.34's {want}", flush=True)
        os._exit(1)


def fail(msg):
    print("FAIL:", msg, flush=True)
    os._exit(1)


# ---- prefill ----

def prefill_main(fd):
    f = socket.socket(fileno=fd).makefile("rw", buffering=1)
    a = make_agent()
    caches = kv_caches()
    for layer, c in enumerate(caches):
        for b in range(BLOCKS):
            c[b * BLOCK_LEN:(b + 1) * BLOCK_LEN] = block_value(layer, b, 0)
    descs, handle = register_kv(a, caches)
    f.write(json.dumps({"agent_metadata": base64.b64encode(a.get_agent_metadata()).decode(),
                        "kv_caches_base_addr": [c.ctypes.data for c in caches]}) + "\n")
    f.flush()
    counts, expected, freed, heartbeats, t_end = {}, {}, [], [], time.monotonic() + 30
    while len(freed) < len(REQS) and time.monotonic() < t_end:
        for notifs in a.get_new_notifs().values():  # pull_worker.py:726
            for notif in notifs:
                msg = notif.decode("utf-8")
                if msg.startswith("HB:"):
                    heartbeats.append(msg[3:])
                    continue
                req_id, consumers = msg.rsplit(":", 1)
                expected[req_id] = int(consumers)
                counts[req_id] = counts.get(req_id, 0) + 1
                if counts[req_id] == expected[req_id]:
                    freed.append(req_id)
                    for c in caches:  # the blocks go to the next request at once
                        for b in REQS[req_id]:
                            c[b * BLOCK_LEN:(b + 1) * BLOCK_LEN] = 0xEE
        time.sleep(0.0005)
    a.release_dlist_handle(handle)  # base_worker.py:4150
    a.deregister_memory(descs)  # base_worker.py:4224
    check_order("prefill", a)
    f.write(json.dumps({"freed": freed, "heartbeats": heartbeats, "counts": counts}) + "\n")
    f.flush()
    os._exit(0)


# ---- decode ----

def decode_main():
    parent, child = socket.socketpair()
    p = subprocess.Popen([sys.executable, __file__, "--prefill", str(child.fileno())],
                         pass_fds=[child.fileno()])
    child.close()
    f = parent.makefile("rw", buffering=1)
    meta = json.loads(f.readline() or fail("prefill died"))
    a = make_agent()
    caches = kv_caches()
    descs, local_handle = register_kv(a, caches)
    remote_agent_name = a.add_remote_agent(base64.b64decode(meta["agent_metadata"]))  # :2588
    remote_blocks = np.array([[addr, BLOCK_LEN, 0, BLOCK_LEN, BLOCKS]
                              for addr in meta["kv_caches_base_addr"]], dtype=np.uint64)
    remote_handle = a.prep_xfer_dlist(remote_agent_name, remote_blocks, mem_type="DRAM")  # :2729

    def read(req_id, blocks, consumers):
        ids = desc_ids(blocks)  # same block ids on both sides (a prefix-free request)
        handle = a.make_prepped_xfer("READ", local_handle, ids, remote_handle, ids,
                                     notif_msg=f"{req_id}:{consumers}".encode())  # :620
        a.transfer(handle)  # pull_worker.py:630
        t0 = time.monotonic()
        while True:  # base_worker.py:3490-3494, once per engine step
            state = a.check_xfer_state(handle)
            if state == "DONE":
                tel = a.get_xfer_telemetry(handle)
                a.release_xfer_handle(handle)
                return tel
            if state != "PROC" or time.monotonic() - t0 > 30:
                fail(f"{req_id}: transfer state {state}")
            time.sleep(0.001)

    tel = read("reqA", REQS["reqA"], 1)
    half = len(REQS["reqB"]) // 2
    read("reqB", REQS["reqB"][:half], 2)  # two consumers (decode TP ranks)
    read("reqB", REQS["reqB"][half:], 2)
    a.send_notif(remote_agent_name, notif_msg=b"HB:reqC")  # base_worker.py:3612
    a.send_notif(remote_agent_name, notif_msg=b"reqC:1")  # pull_worker.py:537 (prefix hit)
    result = json.loads(f.readline() or fail("prefill died"))
    p.wait()
    bad = 0
    for req_id in ("reqA", "reqB"):
        for layer, c in enumerate(caches):
            for b in REQS[req_id]:
                bad += int(np.count_nonzero(c[b * BLOCK_LEN:(b + 1) * BLOCK_LEN]
                                            != block_value(layer, b, 0)))
    untouched = sum(int(np.count_nonzero(c[b * BLOCK_LEN:(b + 1) * BLOCK_LEN]))
                    for c in caches for b in range(BLOCKS)
                    if b not in REQS["reqA"] and b not in REQS["reqB"])
    a.release_dlist_handle(local_handle)  # base_worker.py:4150
    a.release_dlist_handle(remote_handle)
    a.remove_remote_agent(remote_agent_name)  # base_worker.py:4158
    a.deregister_memory(descs)  # base_worker.py:4224
    print(f"prefill freed {result['freed']} (counts {result['counts']}), heartbeats "
          f"{result['heartbeats']}; reqA telemetry {tel.totalBytes} bytes in {tel.descCount} "
          f"descriptors; {bad} decode bytes differ from the prefill's KV, {untouched} bytes "
          f"written outside the requests' blocks", flush=True)
    if result["freed"] != ["reqA", "reqB", "reqC"] or result["heartbeats"] != ["reqC"]:
        fail("prefill's notification accounting")
    if result["counts"] != {"reqA": 1, "reqB": 2, "reqC": 1}:
        fail("notification counts")
    if bad != 0 or untouched != 0:
        fail("decode KV bytes")
    if tel.totalBytes != LAYERS * len(REQS["reqA"]) * BLOCK_LEN:
        fail("telemetry bytes")
    check_order("decode", a)
    print("ok: vLLM 0.34 NixlConnector pull on KVBRIDGE", flush=True)
    os._exit(0)


if __name__ == "__main__":
    try:
        if len(sys.argv) > 2 and sys.argv[1] == "--prefill":
            prefill_main(int(sys.argv[2]))
        decode_main()
    except BaseException as e:  # noqa: BLE001 - report, exit without interpreter teardown
        import traceback
        traceback.print_exc()
        fail(f"{type(e).__name__}: {e}")
