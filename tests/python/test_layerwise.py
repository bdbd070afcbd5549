"""Layerwise sends (kvb_sender_send_layers, issue 26): a chunk's layers
are written as the forward produces them, and the decode sees Success only
after the piece that ends at the last layer of the last chunk.

What a user would notice: after the piece of layers [0, 1) settled, layer 0's
K and V pages hold the prefill's bytes and no other layer's do, and the room
is not Success; a piece out of order (not starting at 0, skipping, past the
last layer, other indices) is refused with nothing written; a plain send
while a chunk is open is refused; the whole request ends byte-exact."""
import os
import sys
import time

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "python"))

import kvbridge as kb  # noqa: E402
from kvb_testutil import poll_until  # noqa: E402

PAGES, PAGE_BYTES, LAYERS = 16, 256, 4


def _pool():
    return [np.zeros((PAGES, PAGE_BYTES), np.uint8) for _ in range(2 * LAYERS)]


def _args(kv):
    return kb.KVArgs(kv_data_ptrs=[b.ctypes.data for b in kv], kv_data_lens=[b.nbytes for b in kv],
                     kv_item_lens=[PAGE_BYTES] * len(kv), page_size=4, kv_head_num=1,
                     engine_rank=0)


def _layer_bufs(pool, layer):
    return [pool[layer], pool[LAYERS + layer]]  # its K and its V


def _wait_bytes(dst, src, layer, dpages, spages, timeout=10):
    """Until layer's decode pages hold the prefill's (they land before any
    status says so); True when they did within timeout."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(np.array_equal(d[dpages], s[spages])
               for d, s in zip(_layer_bufs(dst, layer), _layer_bufs(src, layer))):
            return True
        time.sleep(0.002)
    return False


@pytest.fixture
def pair():
    src, dst = _pool(), _pool()
    rng = np.random.default_rng(26)
    for b in src:
        b[:] = rng.integers(1, 256, b.shape, dtype=np.uint8)  # never 0: "unwritten" reads 0
    with kb.KVBootstrapServer("127.0.0.1", 0) as server:
        pm = kb.KVManager(_args(src), "prefill", server.address)
        dm = kb.KVManager(_args(dst), "decode")
        try:
            yield src, dst, pm, dm, server.address
        finally:
            pm.close()
            dm.close()


def test_layers_land_in_order_success_after_the_last(pair):
    src, dst, pm, dm, addr = pair
    dpages, spages = [9, 3, 7, 12, 5], [1, 2, 4, 6, 8]
    rc = kb.KVReceiver(dm, addr, 11)
    s = kb.KVSender(pm, addr, 11)
    rc.init(np.asarray(dpages, np.int32))
    assert poll_until(s, 10, (kb.KVPoll.WaitingForInput,)) == kb.KVPoll.WaitingForInput
    assert s.num_layers() == LAYERS
    s.init(len(dpages))
    first, rest = np.asarray(spages[:3], np.int32), np.asarray(spages[3:], np.int32)
    s.send_layers(first, 0, 1)
    assert _wait_bytes(dst, src, 0, dpages[:3], spages[:3])
    for layer in range(1, LAYERS):
        assert not any(b.any() for b in _layer_bufs(dst, layer)), f"layer {layer} written early"
    s.send_layers(first, 1, 3)
    assert _wait_bytes(dst, src, 2, dpages[:3], spages[:3])
    assert not any(b.any() for b in _layer_bufs(dst, 3)), "layer 3 written before its piece"
    assert rc.poll() != kb.KVPoll.Success
    s.send_layers(first, 3, 4)  # completes the first chunk (not the request)
    assert s.curr_idx == 3
    time.sleep(0.2)
    assert rc.poll() != kb.KVPoll.Success, "Success before the request's last chunk"
    s.send_layers(rest, 0, 2)
    assert _wait_bytes(dst, src, 1, dpages[3:], spages[3:])
    assert rc.poll() != kb.KVPoll.Success, "Success before the last piece"
    s.send_layers(rest, 2, 4)
    assert poll_until(rc, 10) == kb.KVPoll.Success
    assert poll_until(s, 10) == kb.KVPoll.Success
    for a, b in zip(src, dst):
        assert np.array_equal(b[dpages], a[spages])
        assert not np.delete(b, dpages, axis=0).any()


def test_pieces_out_of_order_refused_nothing_written(pair):
    src, dst, pm, dm, addr = pair
    rc = kb.KVReceiver(dm, addr, 12)
    s = kb.KVSender(pm, addr, 12)
    rc.init(np.asarray([0, 1], np.int32))
    assert poll_until(s, 10, (kb.KVPoll.WaitingForInput,)) == kb.KVPoll.WaitingForInput
    s.init(2)
    idx = np.asarray([3, 4], np.int32)
    for lb, le in ((1, 2), (0, 0), (2, 1), (0, LAYERS + 1)):
        with pytest.raises(kb.KVBridgeError):
            s.send_layers(idx, lb, le)
    s.send_layers(idx, 0, 2)
    with pytest.raises(kb.KVBridgeError):
        s.send_layers(idx, 3, 4)  # skips layer 2
    with pytest.raises(kb.KVBridgeError):
        s.send_layers(np.asarray([3, 5], np.int32), 2, 4)  # other pages
    with pytest.raises(kb.KVBridgeError):
        s.send(idx)  # a plain send while the chunk is open
    assert _wait_bytes(dst, src, 1, [0, 1], [3, 4])
    time.sleep(0.2)  # a refused piece would have landed by now
    for layer in (2, 3):
        assert not any(b.any() for b in _layer_bufs(dst, layer)), f"layer {layer} written"
    assert rc.poll() != kb.KVPoll.Success
    s.send_layers(idx, 2, 4)
    assert poll_until(rc, 10) == kb.KVPoll.Success
    for a, b in zip(src, dst):
        assert np.array_equal(b[[0, 1]], a[[3, 4]])
