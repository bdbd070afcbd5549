"""KVReceiver.init / KVSender.init without aux_index (issue 13, section 2).

aux_index is optional in the bindings. Before, a missing one went out as
"-1", which the prefill refused ('aux index "-1" is not a decimal integer')
and the room stalled until its time-out. Now: a manager without aux buffers
needs none (the room completes, bytes exact); a manager with aux buffers
raises KVBridgeError at init, naming the room, and nothing is sent."""
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "python"))

import kvbridge as kb  # noqa: E402
from kvb_testutil import poll_until  # noqa: E402

PAGES, PAGE_BYTES, LAYERS = 16, 256, 2


def _pool():
    return [np.zeros((PAGES, PAGE_BYTES), np.uint8) for _ in range(2 * LAYERS)]


def _args(kv, aux=None):
    a = dict(kv_data_ptrs=[b.ctypes.data for b in kv], kv_data_lens=[b.nbytes for b in kv],
             kv_item_lens=[PAGE_BYTES] * len(kv), page_size=4, kv_head_num=1, engine_rank=0)
    if aux is not None:
        a.update(aux_data_ptrs=[aux.ctypes.data], aux_data_lens=[aux.nbytes],
                 aux_item_lens=[aux.shape[1]])
    return kb.KVArgs(**a)


def test_no_aux_buffers_no_aux_index():
    src, dst = _pool(), _pool()
    rng = np.random.default_rng(13)
    for b in src:
        b[:] = rng.integers(0, 256, b.shape, dtype=np.uint8)
    with kb.KVBootstrapServer("127.0.0.1", 0) as server:
        pm = kb.KVManager(_args(src), "prefill", server.address)
        dm = kb.KVManager(_args(dst), "decode")
        try:
            rc = kb.KVReceiver(dm, server.address, 5)
            s = kb.KVSender(pm, server.address, 5)
            rc.init(np.asarray([9, 3, 7], np.int32))  # no aux_index
            assert poll_until(s, 10, (kb.KVPoll.WaitingForInput,)) == kb.KVPoll.WaitingForInput
            s.init(3)  # no aux_index either
            s.send(np.asarray([1, 2, 4], np.int32))
            st = poll_until(rc, 10)
            if st != kb.KVPoll.Success:
                rc.failure_exception()  # raises with the reason
            assert poll_until(s, 10) == kb.KVPoll.Success
            for a, b in zip(src, dst):
                assert np.array_equal(b[[9, 3, 7]], a[[1, 2, 4]])
                assert not b[[0, 1, 2, 4, 5, 6, 8]].any()
        finally:
            pm.close()
            dm.close()


def test_aux_buffers_need_aux_index():
    src, dst = _pool(), _pool()
    aux_p, aux_d = np.zeros((4, 32), np.uint8), np.zeros((4, 32), np.uint8)
    with kb.KVBootstrapServer("127.0.0.1", 0) as server:
        pm = kb.KVManager(_args(src, aux_p), "prefill", server.address)
        dm = kb.KVManager(_args(dst, aux_d), "decode")
        try:
            rc = kb.KVReceiver(dm, server.address, 6)
            s = kb.KVSender(pm, server.address, 6)
            try:
                rc.init(np.asarray([1, 2], np.int32))
                raise AssertionError("KVReceiver.init without aux_index did not raise")
            except kb.KVBridgeError as e:
                assert "room 6" in str(e) and "aux slot" in str(e), str(e)
            # nothing was sent: the prefill still waits for the transfer info
            time.sleep(0.2)
            assert s.poll() == kb.KVPoll.Bootstrapping
            rc.init(np.asarray([1, 2], np.int32), aux_index=3)  # the proper call works
            assert poll_until(s, 10, (kb.KVPoll.WaitingForInput,)) == kb.KVPoll.WaitingForInput
            try:
                s.init(2)
                raise AssertionError("KVSender.init without aux_index did not raise")
            except kb.KVBridgeError as e:
                assert "room 6" in str(e) and "aux slot" in str(e), str(e)
            aux_p[1] = 0x5D
            s.init(2, aux_index=1)
            s.send(np.asarray([5, 6], np.int32))
            assert poll_until(rc, 10) == kb.KVPoll.Success
            assert (aux_d[3] == 0x5D).all() and not aux_d[[0, 1, 2]].any()
        finally:
            pm.close()
            dm.close()
