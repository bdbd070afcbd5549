"""kvbridge's bootstrap server driven by a small SGLang-2026 peer written from
the spec (shared/spec/PROTOCOL-SGLANG-2026.md section 3), not from SGLang's
code.

The peer does what section 3 says SGLang main (2026-08) does: each prefill
rank PUTs /route without "role" and with the new keys; the decode asks the
parallel info with all four new query keys at -1 on a one-shot connection,
treats 503 as "try again" (at most 15 tries, >= 1 s apart in SGLang; 0.1 s
here), builds PrefillServerInfo(**data) (so any key outside the 15 would
raise TypeError), then asks per-rank addresses and /query_dp_ranks on one
kept-alive session (pool size 1), and heartbeats /health on another. A
seed-001 peer (role, old query) uses the same server meanwhile.
"""

import dataclasses
import os
import re
import signal
import subprocess
import time

import pytest
import requests

BIN = os.environ.get("KVBRIDGE_BIN", "kvbridge")
LISTEN_RE = re.compile(r"^listening on (.+):(\d+)$")
NOT_READY = "Prefill server not fully registered yet ({} workers registered)."


@dataclasses.dataclass
class PrefillServerInfo:
    """The 15 keys of spec 3.2; the first seven have no default."""

    attn_tp_size: int
    attn_cp_size: int
    dp_size: int
    pp_size: int
    page_size: object
    kv_cache_dtype: object
    follow_bootstrap_room: bool
    enable_dsa_cache_layer_split: bool = False
    prefill_http_port: object = None
    target_tp_rank: object = None
    target_tp_ranks: object = None
    target_cp_ranks: object = None
    target_pp_ranks: object = None
    required_dst_info_num: object = None
    required_prefill_response_num: object = None


@pytest.fixture
def server():
    env = dict(os.environ)
    env.pop("KVBRIDGE_BOOTSTRAP_TOKEN", None)
    proc = subprocess.Popen([BIN, "bootstrap", "--host", "127.0.0.1", "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    line = proc.stdout.readline().strip()
    m = LISTEN_RE.match(line)
    assert m, f"no listening line, got {line!r}"
    yield f"{m.group(1)}:{m.group(2)}"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=10) == 0


def put_2026(attn_tp_rank, rank_port, attn_tp_size=2, attn_cp_rank=0, attn_cp_size=1,
             attn_dp_rank=0, attn_dp_size=1):
    # Spec 3.1: the body of C:770-791, no "role".
    return {
        "attn_tp_size": attn_tp_size, "attn_tp_rank": attn_tp_rank,
        "attn_cp_size": attn_cp_size, "attn_cp_rank": attn_cp_rank,
        "attn_dp_size": attn_dp_size, "attn_dp_rank": attn_dp_rank,
        "pp_size": 1, "pp_rank": 0,
        "system_dp_size": 1, "system_dp_rank": 0,
        "rank_ip": "127.0.0.1", "rank_port": rank_port,
        "page_size": 16, "kv_cache_dtype": "auto",
        "load_balance_method": "round_robin",
        "enable_dsa_cache_layer_split": False,
        "prefill_http_port": 30000,
    }


def register(boot, body):
    # Spec 3.1: 5 s time-out; a non-200 answer is a failed attempt.
    r = requests.put(f"http://{boot}/route", json=body, timeout=5)
    assert r.status_code == 200 and r.text == "OK", (r.status_code, r.text)


def parallel_info(boot, tries=15, pause=0.1):
    # Spec 3.3: one-shot GET, 503 (or any non-200) = try again later.
    url = (f"http://{boot}/route?prefill_dp_rank=-1&prefill_cp_rank=-1"
           f"&target_tp_rank=-1&target_pp_rank=-1")
    answers = []
    for _ in range(tries):
        r = requests.get(url, timeout=5)
        answers.append((r.status_code, r.text))
        if r.status_code == 200:
            return PrefillServerInfo(**r.json()), answers
        time.sleep(pause)
    return None, answers


def test_2026_prefill_and_decode(server):
    boot = server
    # Before any PUT: 503 with SGLang's text.
    info, answers = parallel_info(boot, tries=1)
    assert info is None and answers == [(503, NOT_READY.format(0))]

    # DP 2 (attention DP) x TP 2: four prefill ranks; 503 until the fourth.
    ranks = [(dp, tp) for dp in range(2) for tp in range(2)]
    for i, (dp, tp) in enumerate(ranks):
        register(boot, put_2026(tp, 7000 + dp * 10 + tp, attn_dp_rank=dp, attn_dp_size=2))
        if i < len(ranks) - 1:
            info, answers = parallel_info(boot, tries=1)
            assert info is None and answers == [(503, NOT_READY.format(i + 1))]

    info, _ = parallel_info(boot)
    assert info == PrefillServerInfo(
        attn_tp_size=2, attn_cp_size=1, dp_size=2, pp_size=1, page_size=16,
        kv_cache_dtype="auto", follow_bootstrap_room=False,
        enable_dsa_cache_layer_split=False, prefill_http_port=30000)

    # Per-rank look-ups on one kept-alive session (C:50-71, pool size 1).
    s = requests.Session()
    s.mount("http://", requests.adapters.HTTPAdapter(pool_connections=1, pool_maxsize=1))
    for dp, tp in ranks:
        r = s.get(f"http://{boot}/route", timeout=5, params={
            "prefill_dp_rank": dp, "prefill_cp_rank": 0,
            "target_tp_rank": tp, "target_pp_rank": 0})
        assert r.status_code == 200
        assert r.json() == {"rank_ip": "127.0.0.1", "rank_port": 7000 + dp * 10 + tp}
    r = s.get(f"http://{boot}/route", timeout=5, params={
        "prefill_dp_rank": 1, "prefill_cp_rank": 0, "target_tp_rank": 2, "target_pp_rank": 0})
    assert (r.status_code, r.text) == (
        404, "Bootstrap info not found for dp_rank=1 cp_rank=0 tp_rank=2 pp_rank=0")

    # follow_bootstrap_room is false (round_robin): the prefill registers
    # room -> dp rank, the decode batch-asks (spec 3.5, 3.6).
    for room, dp in ((123, 1), (2**63 - 1, 0)):
        r = requests.post(f"http://{boot}/register_dp_rank", timeout=5,
                          json={"bootstrap_room": room, "dp_rank": dp})
        assert (r.status_code, r.text) == (200, "OK")
    r = s.post(f"http://{boot}/query_dp_ranks", timeout=5,
               json={"bootstrap_rooms": [123, 456, 2**63 - 1]})
    assert r.status_code == 200
    assert r.json() == {"123": 1, str(2**63 - 1): 0}

    # Heartbeats on their own kept-alive session (C:1056-1063).
    hb = requests.Session()
    for _ in range(3):
        r = hb.get(f"http://{boot}/health", timeout=5, headers={"Connection": "keep-alive"})
        assert (r.status_code, r.text) == (200, "OK")


def test_2026_and_seed001_peers_share_a_server(server):
    boot = server
    # A seed-001 prefill rank (role, no new keys) and a 2026 one.
    register(boot, {"role": "Prefill", "attn_tp_size": 2, "attn_tp_rank": 0,
                    "attn_dp_size": 1, "attn_dp_rank": 0, "pp_size": 1, "pp_rank": 0,
                    "system_dp_size": 1, "system_dp_rank": 0,
                    "rank_ip": "127.0.0.1", "rank_port": 7100})
    register(boot, put_2026(1, 7101))
    # Rank 0 speaks seed 001 on ZeroMQ (no 2026 keys): a 2026 decode is
    # answered as that rank's own server would (400), not given ranks whose
    # control thread its 18-frame KV-args would kill.
    info, answers = parallel_info(boot, tries=1)
    assert info is None and answers == [(400, "Missing inputs for bootstrap server.")]
    # The seed-001 decode reads the same table its own way.
    r = requests.get(f"http://{boot}/route?engine_rank=-1&target_dp_group=-1&target_pp_rank=-1",
                     timeout=5)
    assert r.status_code == 200
    old = r.json()
    assert (old["prefill_attn_tp_size"], old["prefill_dp_size"], old["prefill_pp_size"]) == (2, 1, 1)
    r = requests.get(f"http://{boot}/route?engine_rank=1&target_dp_group=0&target_pp_rank=0",
                     timeout=5)
    assert r.json() == {"rank_ip": "127.0.0.1", "rank_port": 7101}
    # Rank 0 re-registers with the 2026 keys: the 2026 decode is served. The
    # first registration decided follow_bootstrap_room: the seed-001 one had
    # no load_balance_method, i.e. the default follow_bootstrap_room.
    register(boot, put_2026(0, 7100))
    info, _ = parallel_info(boot)
    assert info.attn_tp_size == 2 and info.page_size == 16 and info.follow_bootstrap_room is True


def test_2026_malformed_input_is_refused_and_server_keeps_serving(server):
    boot = server
    base = put_2026(0, 7200)
    cases = [
        ({k: v for k, v in base.items() if k != "page_size"}, "page_size"),
        (dict(base, page_size=None), "page_size"),
        ({k: v for k, v in base.items() if k != "kv_cache_dtype"}, "kv_cache_dtype"),
        (dict(base, attn_cp_rank=1), "attn_cp_rank"),
        (dict(base, kv_cache_dtype="fp8\ne4m3"), "kv_cache_dtype"),
        (dict(base, prefill_http_port="http"), "prefill_http_port"),
    ]
    for body, key in cases:
        r = requests.put(f"http://{boot}/route", json=body, timeout=5)
        assert r.status_code == 400 and key in r.text and "\n" not in r.text, (body, r.text)
    for path, body in (("/register_dp_rank", {"bootstrap_room": "x", "dp_rank": 0}),
                       ("/query_dp_ranks", {"bootstrap_rooms": "all"})):
        r = requests.post(f"http://{boot}{path}", json=body, timeout=5)
        assert r.status_code == 400, (path, r.text)
    r = requests.get(f"http://{boot}/route?prefill_dp_rank=0&target_tp_rank=0", timeout=5)
    assert (r.status_code, r.text) == (400, "Missing inputs for bootstrap server.")
    # Still serving, nothing registered.
    assert requests.get(f"http://{boot}/health", timeout=5).text == "OK"
    info, answers = parallel_info(boot, tries=1)
    assert info is None and answers == [(503, NOT_READY.format(0))]
    register(boot, base)
    register(boot, put_2026(1, 7201))
    info, _ = parallel_info(boot)
    assert info.attn_tp_size == 2
