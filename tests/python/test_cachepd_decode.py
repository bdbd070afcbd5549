"""A kvbridge decode (Python KVManager) speaking TokenSpeed 0.1.1's CachePD to
a kvbridge prefill: the prefill registers with one bootstrap server, and a
second server holds only what a TokenSpeed 0.1.1 prefill would PUT there
(its CachePD body, rebuilt from the first server's answers), so the decode
reads the prefill's layout contract and speaks CachePD. Checked: the bytes
land; KVReceiver.init(prompt_tokens=) travels in the manifest (a prompt
that does not fill the pages is refused before anything is sent); the
receiver reads what KVSender.set_first_token / set_prefill_info sent
(first_token(), prefill_info())."""

import json

import numpy as np
import requests

import kvbridge as kb  # noqa: E402
from kvb_testutil import poll_until, small_kv_args  # noqa: E402

PAGE, ITEM, POOL = 4, 4 * 16, 8  # 1 layer, 1 KV head of 8 bfloat16
PAGES = [1, 3, 6]


def kv_args(fill):
    return small_kv_args(fill, PAGE, ITEM, POOL)


def cachepd_only(src, dst):
    """PUT to server dst the CachePD body of the prefill registered at src."""
    get = lambda **q: requests.get(f"http://{src}/route", params=q, timeout=5).json()  # noqa
    info = get(engine_rank=-1, target_dp_group=-1)
    rank = get(engine_rank=0, target_dp_group=0)
    body = {"role": "Prefill", "world_size": 1, "dp_size": 1, "pp_size": 1,
            "rank_ip": rank["rank_ip"], "rank_port": rank["rank_port"], "engine_rank": 0,
            "cache_layout": info["cache_layout"],
            "cache_fields_by_stage": info["cache_fields_by_stage"]}
    r = requests.put(f"http://{dst}/route", data=json.dumps(body), timeout=5,
                     headers={"Content-Type": "application/json"})
    assert r.status_code == 200, r.text


def test_cachepd_decode_reads_bytes_token_and_prefill_info():
    pa, pkv = kv_args(True)
    da, dkv = kv_args(False)
    with kb.KVBootstrapServer("127.0.0.1", 0) as a, kb.KVBootstrapServer("127.0.0.1", 0) as b:
        eng = kb.TransferEngine("127.0.0.1", 0)
        try:
            pm = kb.KVManager(pa, "prefill", a.address, engine=eng)
            dm = kb.KVManager(da, "decode", engine=eng)
            cachepd_only(a.address, b.address)
            # a prompt that does not fill the 3 pages: refused, nothing sent
            bad = kb.KVReceiver(dm, b.address, 40)
            try:
                bad.init(PAGES, aux_index=0, prompt_tokens=2 * PAGE)
            except kb.KVBridgeError:
                pass
            assert poll_until(bad, 5) == kb.KVPoll.Failed
            assert "exact prompt length" in bad.failure_reason()
            rc = kb.KVReceiver(dm, b.address, 41)
            rc.init(PAGES, aux_index=0, prompt_tokens=3 * PAGE - 1)
            s = kb.KVSender(pm, a.address, 41)
            assert poll_until(s, 10, (kb.KVPoll.WaitingForInput,)) == kb.KVPoll.WaitingForInput
            s.set_first_token(777, [5, 6])
            s.set_prefill_info(cached_tokens=12, logprob=-0.5)
            s.init(len(PAGES), aux_index=0)
            s.send(PAGES)
            assert poll_until(rc, 10) == kb.KVPoll.Success
            assert poll_until(s, 10) == kb.KVPoll.Success
            assert rc.first_token() == (777, [5, 6])
            assert rc.prefill_info() == (12, -0.5)
            for d, p in zip(dkv[:2], pkv[:2]):
                assert np.array_equal(d[PAGES], p[PAGES])
                others = [i for i in range(POOL) if i not in PAGES]
                assert not d[others].any()  # nothing else written
        finally:
            eng.close()


def test_cachepd_contract_twin_checked_at_creation():
    """KVManager(cachepd_contract=): the prefill's own CachePD contract (the
    one its bootstrap PUT carries) given back as the framework's description
    is accepted; one naming state fields this rank has no buffers for, or
    text that is no contract, fails creation with the C side's reason."""
    pa, _ = kv_args(True)
    with kb.KVBootstrapServer("127.0.0.1", 0) as a:
        eng = kb.TransferEngine("127.0.0.1", 0)
        try:
            pm = kb.KVManager(pa, "prefill", a.address, engine=eng)
            info = requests.get(f"http://{a.address}/route",
                                params=dict(engine_rank=-1, target_dp_group=-1), timeout=5).json()
            own = info["cache_layout"]
            c = json.loads(own)
            da, _ = kv_args(False)
            dm = kb.KVManager(da, "decode", engine=eng, cachepd_contract=own)
            dm.close()
            spec = dict(c["group_specs"][0], group_id="linear_attention_0", family="state",
                        transfer_policy="latest_snapshot", rows_per_page=None,
                        entry_stride_tokens=None, checkpoint_granularity=PAGE)
            c["group_specs"].append(spec)
            c["plan"]["groups"].append(dict(c["plan"]["groups"][0], group_id="linear_attention_0"))
            c["plan"]["fields"].append(dict(c["plan"]["fields"][0], group_id="linear_attention_0",
                                            field_id="layer.0.ssm"))
            da, _ = kv_args(False)
            try:
                kb.KVManager(da, "decode", engine=eng, cachepd_contract=json.dumps(c))
                raise AssertionError("a contract with a state field was accepted")
            except kb.KVBridgeError as e:
                assert "names 1 state fields; kv_args has 0 state buffers" in str(e), str(e)
            for bad, err in (("{}", kb.KVBridgeError), ("{\"plan\": \"\u00e9\"}", kb.InvalidArgument)):
                da, _ = kv_args(False)
                try:
                    kb.KVManager(da, "decode", engine=eng, cachepd_contract=bad)
                    raise AssertionError(f"{bad!r} was accepted")
                except err as e:
                    assert "cachepd_contract" in str(e), str(e)
            pm.close()
        finally:
            eng.close()


def test_cachepd_init_without_prompt_warns_once(capfd):
    """Issue 32 §2: a CachePD room inited without prompt_tokens says in its
    manifest that every page is full, and TokenSpeed 0.1.1's prefill adopts
    that as the prompt (a harness that forgot it waited 300 s). The decode
    logs a warning naming prompt_tokens once per manager: two such rooms of
    one manager give one line, a room with prompt_tokens none, a second
    manager its own line."""
    pa, _ = kv_args(True)
    with kb.KVBootstrapServer("127.0.0.1", 0) as a, kb.KVBootstrapServer("127.0.0.1", 0) as b:
        eng = kb.TransferEngine("127.0.0.1", 0)
        try:
            kb.KVManager(pa, "prefill", a.address, engine=eng)
            cachepd_only(a.address, b.address)

            def lines():
                err = capfd.readouterr().err
                return [ln for ln in err.splitlines() if "without prompt_tokens" in ln]

            def room(dm, n, **kw):
                rc = kb.KVReceiver(dm, b.address, n)
                rc.init(PAGES, aux_index=0, **kw)
                # the request went out (or failed), so the warning had its chance
                assert poll_until(rc, 10, (kb.KVPoll.WaitingForInput,)) in (
                    kb.KVPoll.WaitingForInput, kb.KVPoll.Failed)
                return rc

            lines()
            da, dkv = kv_args(False)  # dkv: keep the buffers alive
            dm = kb.KVManager(da, "decode", engine=eng)
            room(dm, 50, prompt_tokens=3 * PAGE - 1)
            assert lines() == []
            room(dm, 51)
            room(dm, 52)
            got = lines()
            assert len(got) == 1, got
            assert "room 51" in got[0] and f"{len(PAGES) * PAGE} tokens" in got[0], got[0]
            da2, dkv2 = kv_args(False)
            dm2 = kb.KVManager(da2, "decode", engine=eng)
            room(dm2, 53)
            assert len(lines()) == 1
        finally:
            eng.close()
