"""TokenSpeed's prefill ranks (seed 004, PROTOCOL-TOKENSPEED.md 3.1, 11.2)
register with `kvbridge bootstrap`: the PUT body its prefill sends
(world_size, dp_size, the global engine_rank, a required
enable_mla_l1_5_cache, one length per buffer), told from seed 001 by
world_size/engine_rank before the "role" rule; its decode's GETs are
answered in its shape; a 2026 query gets the 400 TokenSpeed's own server
answers."""

import requests

from test_bootstrap import server  # noqa: F401  (fixture)


def ts_put(rank, world=4, dp=2, port=None, **extra):
    body = {
        "role": "Prefill",
        "world_size": world,
        "dp_size": dp,
        "rank_ip": "10.0.0.7",
        "rank_port": port or 17000 + rank,
        "engine_rank": rank,
        "enable_mla_l1_5_cache": False,
        "kv_item_lens": [4096, 4096],
        "kv_unit_lens": [128, 128],
        "state_item_lens": [],
        "state_unit_lens": [],
    }
    body.update(extra)
    return {k: v for k, v in body.items() if v is not None}


def test_tokenspeed_registration_and_lookups(server):  # noqa: F811
    for rank in range(4):  # world 4, DP 2: TP 2 per group
        r = requests.put(f"http://{server}/route", json=ts_put(rank), timeout=5)
        assert r.status_code == 200, r.text
    info = requests.get(f"http://{server}/route?engine_rank=-1&target_dp_group=-1").json()
    assert int(info["prefill_tp_size"]) == 4  # TokenSpeed's: the world size
    assert int(info["prefill_dp_size"]) == 2
    assert info["prefill_attn_tp_size"] == 2  # seed 001's key, same answer
    assert info["enable_mla_l1_5_cache"] is False
    assert info["kv_item_lens"] == [4096, 4096] and info["kv_unit_lens"] == [128, 128]
    # The per-rank query takes the TP rank inside the group: global 3 = (dp 1, tp 1).
    r = requests.get(f"http://{server}/route?engine_rank=1&target_dp_group=1", timeout=5)
    assert r.status_code == 200 and r.json() == {"rank_ip": "10.0.0.7", "rank_port": 17003}
    r = requests.get(f"http://{server}/route?engine_rank=0&target_dp_group=1", timeout=5)
    assert r.json()["rank_port"] == 17002
    # A 2026 query: 400 as TokenSpeed's own server answers it (an SGLang 2026
    # decode's KV-args would kill these ranks' control threads), so a
    # kvbridge client falls back to the query above.
    r = requests.get(
        f"http://{server}/route?prefill_dp_rank=-1&prefill_cp_rank=-1&target_tp_rank=-1"
        "&target_pp_rank=-1"
    )
    assert (r.status_code, r.text) == (400, "Missing inputs for bootstrap server."), r.text
    assert info["kvbridge_peer_dialect"] == "tokenspeed"  # what a kvbridge decode reads


def test_tokenspeed_registration_refused_with_a_reason(server):  # noqa: F811
    cases = [
        (ts_put(0, enable_mla_l1_5_cache=None), "enable_mla_l1_5_cache"),
        (ts_put(0, world=3, dp=2), "multiple of dp_size"),
        (ts_put(4), "engine_rank"),
        (ts_put(0, role="Decode"), '"role" must be "Prefill"'),
        (ts_put(0, kv_item_lens=[0]), "kv_item_lens"),
    ]
    for body, text in cases:
        r = requests.put(f"http://{server}/route", json=body, timeout=5)
        assert r.status_code == 400 and text in r.text, (body, r.status_code, r.text)
    # Nothing was registered; the server keeps serving.
    r = requests.get(f"http://{server}/route?engine_rank=-1&target_dp_group=-1")
    assert r.status_code == 404
    assert requests.get(f"http://{server}/health").text == "OK"
