"""Helpers shared by the Python tests (no test_ prefix: pytest collects
nothing here). Import it after the test has put python/ on sys.path."""
import time

import numpy as np

import kvbridge as kb


def poll_until(obj, timeout, states=(kb.KVPoll.Success, kb.KVPoll.Failed)):
    """Poll obj (a KVSender or KVReceiver) every 2 ms until its state is one
    of states or timeout seconds passed; the last state polled."""
    deadline = time.monotonic() + timeout
    st = obj.poll()
    while st not in states and time.monotonic() < deadline:
        time.sleep(0.002)
        st = obj.poll()
    return st


def small_kv_args(fill, page=4, item=64, pool=8):
    """KVArgs of one rank with one layer's K and V (one KV head; pool pages
    of item bytes each, filled with a pattern when fill, else zeros) and one
    aux buffer: (args, buffers), the buffers (aux last) to keep alive."""
    kv = [np.zeros((pool, item), np.uint8) for _ in range(2)]
    if fill:
        for b, buf in enumerate(kv):
            buf[:] = (np.arange(pool * item, dtype=np.uint32).reshape(pool, item) * 7 + b) % 251
    aux = np.zeros((4, 64), np.uint8)
    args = kb.KVArgs(kv_data_ptrs=[b.ctypes.data for b in kv], kv_data_lens=[b.nbytes for b in kv],
                     kv_item_lens=[item] * 2, aux_data_ptrs=[aux.ctypes.data],
                     aux_data_lens=[aux.nbytes], aux_item_lens=[64], page_size=page,
                     kv_head_num=1, engine_rank=0)
    return args, kv + [aux]


def stop_process(pid, timeout=5.0):
    """SIGSTOP pid and wait until the kernel shows it stopped (state T in
    /proc/pid/stat): kill() returns before the target has stopped, and a
    transfer started in between may still be answered. The seconds it took."""
    import os
    import signal
    t0 = time.monotonic()
    os.kill(pid, signal.SIGSTOP)
    while time.monotonic() - t0 < timeout:
        with open(f"/proc/{pid}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[0] in ("T", "t"):
                return time.monotonic() - t0
        time.sleep(0.0005)
    raise AssertionError(f"process {pid} not stopped {timeout} s after SIGSTOP")
