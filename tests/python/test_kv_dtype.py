"""The KV cache dtype check (SGLang 2026's kv_cache_dtype): a prefill
KVManager given kv_cache_dtype registers it with kvbridge's bootstrap
server; a decode given another one fails the room with SGLang's words
("KV cache dtype mismatch"), before any KV-args or transfer info goes out, so
nothing lands in its pages; the same dtype, or an unknown one on either side,
moves the bytes."""


import numpy as np
import pytest
import requests

import kvbridge as kb  # noqa: E402
from kvb_testutil import poll_until, small_kv_args  # noqa: E402

PAGE, ITEM, POOL = 4, 4 * 16, 8
PAGES = [1, 3, 6]


def kv_args(fill):
    return small_kv_args(fill, PAGE, ITEM, POOL)


def run_room(prefill_dtype, decode_dtype, room):
    """One room prefill -> decode on one engine; returns (decode state,
    failure reason or None, decode KV buffers, prefill KV buffers, the
    server's parallel info)."""
    pa, pkv = kv_args(1)
    da, dkv = kv_args(0)
    pkw = {} if prefill_dtype is None else {"kv_cache_dtype": prefill_dtype}
    dkw = {} if decode_dtype is None else {"kv_cache_dtype": decode_dtype}
    with kb.KVBootstrapServer("127.0.0.1", 0) as server:
        eng = kb.TransferEngine("127.0.0.1", 0)
        try:
            pm = kb.KVManager(pa, "prefill", server.address, engine=eng, **pkw)
            dm = kb.KVManager(da, "decode", engine=eng, **dkw)
            info = requests.get(f"http://{server.address}/route", timeout=5, params={
                "prefill_dp_rank": -1, "prefill_cp_rank": -1, "target_tp_rank": -1,
                "target_pp_rank": -1}).json()
            rc = kb.KVReceiver(dm, server.address, room)
            rc.init(PAGES, aux_index=0)
            s = kb.KVSender(pm, server.address, room)
            state = poll_until(s, 10, (kb.KVPoll.WaitingForInput, kb.KVPoll.Failed))
            if state == kb.KVPoll.WaitingForInput:
                s.init(len(PAGES), aux_index=0)
                s.send(PAGES)
            state = poll_until(rc, 10)
            reason = rc.failure_reason() if state == kb.KVPoll.Failed else None
            return state, reason, dkv, pkv, info
        finally:
            eng.close()


def test_dtype_mismatch_fails_the_room_and_writes_nothing():
    state, reason, dkv, _, info = run_room("fp8_e4m3", "bfloat16", 11)
    assert info["kv_cache_dtype"] == "fp8_e4m3", info
    assert state == kb.KVPoll.Failed
    assert reason.startswith("KV cache dtype mismatch: prefill at 127.0.0.1:"), reason
    assert reason.endswith("has kv_cache_dtype fp8_e4m3, this decode bfloat16"), reason
    assert all(not buf.any() for buf in dkv)  # nothing landed (KV and aux)


@pytest.mark.parametrize("pdt,ddt", [("bfloat16", "bfloat16"), (None, "bfloat16"),
                                     ("auto", None)])
def test_same_or_unknown_dtype_moves_the_bytes(pdt, ddt):
    state, reason, dkv, pkv, info = run_room(pdt, ddt, 12)
    assert info["kv_cache_dtype"] == pdt, info  # null when the prefill has none
    assert state == kb.KVPoll.Success, reason
    for d, p in zip(dkv[:2], pkv[:2]):
        assert np.array_equal(d[PAGES], p[PAGES])
        others = [i for i in range(POOL) if i not in PAGES]
        assert not d[others].any()


@pytest.mark.parametrize("bad", ["fp8 e4m3", "x" * 65, "dtype\"", 7])
def test_bad_dtype_refused(bad):
    args, keep = kv_args(0)
    with pytest.raises((kb.InvalidArgument, kb.KVBridgeError)) as e:
        kb.KVManager(args, "decode", kv_cache_dtype=bad)
    assert "kv_cache_dtype" in str(e.value)
    del keep
