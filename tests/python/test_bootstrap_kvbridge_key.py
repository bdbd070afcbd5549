"""kvbridge's bootstrap server and the "kvbridge" registration key (the
shared decision of docs/protocol-frames.md, "Extension frames"): a prefill
rank that registers with "kvbridge": 1 is answered with that key in its
per-rank look-ups, in both dialects, so a kvbridge decode knows it may send
that rank its extension frames; any other rank's answer is exactly
{rank_ip, rank_port}; the 2026 parallel info never carries it (SGLang's
decode builds PrefillServerInfo(**data), spec 3.3, and would raise)."""

import pytest
import requests

from test_bootstrap_2026 import (  # noqa: F401 (server is a fixture)
    PrefillServerInfo,
    parallel_info,
    put_2026,
    register,
    server,
)


@pytest.fixture
def boot(server):  # noqa: F811
    return server


def rank26(boot, tp):
    r = requests.get(f"http://{boot}/route", timeout=5, params={
        "prefill_dp_rank": 0, "prefill_cp_rank": 0, "target_tp_rank": tp, "target_pp_rank": 0})
    assert r.status_code == 200, r.text
    return r.json()


def rank25(boot, tp):
    r = requests.get(f"http://{boot}/route?engine_rank={tp}&target_dp_group=0&target_pp_rank=0",
                     timeout=5)
    assert r.status_code == 200, r.text
    return r.json()


def test_kvbridge_key_per_rank_only(boot):
    # Rank 0 a kvbridge prefill (2026 body plus the key), rank 1 SGLang's.
    register(boot, dict(put_2026(0, 7300), kvbridge=1))
    register(boot, put_2026(1, 7301))
    assert rank26(boot, 0) == {"rank_ip": "127.0.0.1", "rank_port": 7300, "kvbridge": 1}
    assert rank26(boot, 1) == {"rank_ip": "127.0.0.1", "rank_port": 7301}
    assert rank25(boot, 0) == {"rank_ip": "127.0.0.1", "rank_port": 7300, "kvbridge": 1}
    assert rank25(boot, 1) == {"rank_ip": "127.0.0.1", "rank_port": 7301}
    # Exactly the 15 keys: PrefillServerInfo(**data) builds.
    info, _ = parallel_info(boot)
    assert info == PrefillServerInfo(
        attn_tp_size=2, attn_cp_size=1, dp_size=1, pp_size=1, page_size=16,
        kv_cache_dtype="auto", follow_bootstrap_room=False,
        enable_dsa_cache_layer_split=False, prefill_http_port=30000)
    # A re-registration without the key (an SGLang prefill took the rank over)
    # drops it from the answer.
    register(boot, put_2026(0, 7302))
    assert rank26(boot, 0) == {"rank_ip": "127.0.0.1", "rank_port": 7302}


def test_seed001_body_with_the_key(boot):
    register(boot, {"role": "Prefill", "attn_tp_size": 1, "attn_tp_rank": 0,
                    "attn_dp_size": 1, "attn_dp_rank": 0, "pp_size": 1, "pp_rank": 0,
                    "system_dp_size": 1, "system_dp_rank": 0,
                    "rank_ip": "127.0.0.1", "rank_port": 7400, "kvbridge": 1})
    assert rank25(boot, 0) == {"rank_ip": "127.0.0.1", "rank_port": 7400, "kvbridge": 1}


@pytest.mark.parametrize("value", ["1", 0, -1, 65536, True, 1.5, [1]])
def test_bad_kvbridge_value_is_refused(boot, value):
    r = requests.put(f"http://{boot}/route", json=dict(put_2026(0, 7500, attn_tp_size=1), kvbridge=value),
                     timeout=5)
    assert r.status_code == 400 and "kvbridge" in r.text, (value, r.status_code, r.text)
    # null counts as absent
    register(boot, dict(put_2026(0, 7500, attn_tp_size=1), kvbridge=None))
    assert rank26(boot, 0) == {"rank_ip": "127.0.0.1", "rank_port": 7500}
