"""Prefill → decode KV cache round trip with kvbridge's Python bindings.

This process runs the bootstrap server and a decode rank; a spawned process
runs a prefill rank. Names follow SGLang's Mooncake connector (seed 001).
Run from the source tree after `make build`:
    PYTHONPATH=python python3 examples/python_pd.py
"""
import multiprocessing
import time

import numpy as np
from kvbridge import KVArgs, KVBootstrapServer, KVManager, KVPoll, KVReceiver, KVSender

LAYERS, HEADS, HEAD_BYTES, PAGE, POOL, AUX_LEN = 4, 8, 64, 16, 64, 128
ITEM = PAGE * HEADS * HEAD_BYTES  # bytes of one page of one layer's K (or V)
ROOM = 1234
SRC_PAGES = np.array([5, 9, 2, 40, 17], np.int32)  # where prefill holds the request
DST_PAGES = np.array([0, 1, 30, 31, 8], np.int32)  # where decode pre-allocated it


def make_rank(fill):
    """K buffers of every layer, then V buffers, plus one aux buffer."""
    kv = [np.zeros((POOL, ITEM), np.uint8) for _ in range(2 * LAYERS)]
    aux = np.zeros((4, AUX_LEN), np.uint8)
    if fill:
        rng = np.random.default_rng(ROOM)
        for buf in kv:
            buf[SRC_PAGES] = rng.integers(0, 256, (len(SRC_PAGES), ITEM), np.uint8)
        aux[2] = rng.integers(0, 256, AUX_LEN, np.uint8)
    args = KVArgs(kv_data_ptrs=[b.ctypes.data for b in kv], kv_data_lens=[b.nbytes for b in kv],
                  kv_item_lens=[ITEM] * len(kv), aux_data_ptrs=[aux.ctypes.data],
                  aux_data_lens=[aux.nbytes], aux_item_lens=[AUX_LEN], page_size=PAGE,
                  kv_head_num=HEADS)
    return kv, aux, args


def wait(obj, states, timeout=30.0):
    deadline = time.monotonic() + timeout
    while (st := obj.poll()) not in states and time.monotonic() < deadline:
        time.sleep(0.001)
    return st


def prefill(bootstrap_addr):
    kv, aux, args = make_rank(fill=True)
    with KVManager(args, "prefill", bootstrap_addr) as mgr:
        sender = KVSender(mgr, bootstrap_addr, ROOM)
        if wait(sender, (KVPoll.WaitingForInput, KVPoll.Failed)) != KVPoll.WaitingForInput:
            sender.failure_exception()  # raises KVTransferError with the reason
        sender.init(len(SRC_PAGES), aux_index=2)
        sender.send(SRC_PAGES[:3])  # chunked prefill: first chunk ...
        sender.send(SRC_PAGES[3:])  # ... the last one carries the aux data
        if wait(sender, (KVPoll.Success, KVPoll.Failed)) != KVPoll.Success:
            sender.failure_exception()


if __name__ == "__main__":
    server = KVBootstrapServer("127.0.0.1", 0)
    proc = multiprocessing.get_context("spawn").Process(target=prefill, args=(server.address,))
    proc.start()
    try:
        kv, aux, args = make_rank(fill=False)
        with KVManager(args, "decode") as mgr:
            deadline = time.monotonic() + 30
            while server.num_ranks < 1 and time.monotonic() < deadline:
                time.sleep(0.01)  # the prefill rank registers with the server
            receiver = KVReceiver(mgr, server.address, ROOM)
            receiver.init(DST_PAGES, aux_index=3)
            if wait(receiver, (KVPoll.Success, KVPoll.Failed)) != KVPoll.Success:
                receiver.failure_exception()
            want_kv, want_aux, _ = make_rank(fill=True)
            assert all((d[DST_PAGES] == w[SRC_PAGES]).all() for d, w in zip(kv, want_kv))
            assert (aux[3] == want_aux[2]).all()
            print(f"room {ROOM}: {len(SRC_PAGES) * ITEM * len(kv)} KV bytes + aux verified")
    finally:
        proc.join(30)
        if proc.is_alive():
            proc.kill()
        server.close()
