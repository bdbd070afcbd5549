"""KVManager(draft_layers=N) through the Python bindings: a prefill and a
decode whose KV lists end with a draft model's K and V buffers (SGLang's and
TokenSpeed's speculative-decoding pools: K target, V target, K draft, V
draft) move every byte of every buffer; a decode whose draft count differs
fails with the prefill's reason and nothing written; bad values are refused
at creation."""

import os

import numpy as np
import pytest

import kvbridge as kb  # noqa: E402
from kvb_testutil import poll_until  # noqa: E402

pytestmark = pytest.mark.skipif(not os.environ.get("KVBRIDGE_LIB"), reason="KVBRIDGE_LIB not set")

POOL, PAGE, HEADS, HB = 32, 4, 2, 16
ITEM = PAGE * HEADS * HB


def pools(layers, draft, rng=None):
    """K target, V target, K draft, V draft: 2 x (layers + draft) buffers."""
    n = 2 * (layers + draft)
    if rng is None:
        return [np.zeros((POOL, ITEM), np.uint8) for _ in range(n)]
    return [rng.integers(1, 256, (POOL, ITEM), dtype=np.uint8) for _ in range(n)]


def args(kv, aux):
    return kb.KVArgs(kv_data_ptrs=[b.ctypes.data for b in kv], kv_data_lens=[b.nbytes for b in kv],
                     kv_item_lens=[ITEM] * len(kv), aux_data_ptrs=[aux.ctypes.data],
                     aux_data_lens=[aux.nbytes], aux_item_lens=[64], page_size=PAGE,
                     kv_head_num=HEADS)


def transfer(server, pm, dm, room, src, dst):
    rc = kb.KVReceiver(dm, server.address, room)
    rc.init(np.array(dst, np.int32), aux_index=0)
    s = kb.KVSender(pm, server.address, room)
    assert poll_until(s, 10, (kb.KVPoll.WaitingForInput, kb.KVPoll.Failed)) in (
        kb.KVPoll.WaitingForInput, kb.KVPoll.Failed)
    if s.poll() == kb.KVPoll.WaitingForInput:
        s.init(len(src), aux_index=0)
        s.send(np.array(src, np.int32))
    return s, rc


def test_draft_layers_round_trip_and_mismatch():
    rng = np.random.default_rng(7)
    aux_p, aux_d = rng.integers(0, 256, (4, 64), dtype=np.uint8), np.zeros((4, 64), np.uint8)
    kv_p, kv_d, kv_d2 = pools(2, 1, rng), pools(2, 1), pools(2, 2)
    with kb.KVBootstrapServer("127.0.0.1", 0) as server:
        pm = kb.KVManager(args(kv_p, aux_p), "prefill", server.address, draft_layers=1)
        dm = kb.KVManager(args(kv_d, aux_d), "decode", draft_layers=1)
        dm2 = kb.KVManager(args(kv_d2, aux_d), "decode", draft_layers=2)
        try:
            src, dst = [3, 8, 20], [5, 6, 30]
            s, rc = transfer(server, pm, dm, 41, src, dst)
            assert poll_until(rc, 20) == kb.KVPoll.Success
            assert poll_until(s, 20) == kb.KVPoll.Success
            for b in range(len(kv_p)):  # draft buffers 4, 5 included
                assert np.array_equal(kv_d[b][dst], kv_p[b][src]), b
            others = [i for i in range(POOL) if i not in dst]
            assert not any(b[others].any() for b in kv_d)
            # Two draft layers at the decode: refused, nothing written.
            s, rc = transfer(server, pm, dm2, 42, [1], [2])
            assert poll_until(rc, 20) == kb.KVPoll.Failed
            assert poll_until(s, 20) == kb.KVPoll.Failed
            e = pytest.raises(kb.KVTransferError, s.failure_exception).value
            assert "the decode's 2 draft layers do not match (draft_layers)" in str(e), str(e)
            assert not any(b.any() for b in kv_d2)
        finally:
            dm2.close()
            dm.close()
            pm.close()


def test_bad_draft_layers():
    kv, aux = pools(1, 1), np.zeros((4, 64), np.uint8)
    for bad in ("1", -1, True, 1 << 20):
        with pytest.raises(kb.InvalidArgument, match="draft_layers"):
            kb.KVManager(args(kv, aux), "decode", draft_layers=bad)
    # 4 buffers hold at most 1 draft layer (one target layer must remain).
    with pytest.raises(Exception, match="draft_layers=2 needs at least 6 KV buffers"):
        kb.KVManager(args(kv, aux), "decode", draft_layers=2)
