"""The kvbridge bootstrap server, driven exactly as the seeds' Python drives it.

A prefill rank registers with SGLang's PUT payload (seed 001
_register_to_bootstrap), a decode rank fetches the parallel info and its
rank's address (seed 001 _get_prefill_parallel_info_from_server /
_get_bootstrap_info_from_server), the heartbeat GETs /health on a kept-alive
session, and TokenSpeed (seed 004) GETs the parallel info and rank without
target_pp_rank. The server is `kvbridge bootstrap --port 0` in a subprocess.
"""

import os
import re
import signal
import subprocess
import time

import pytest
import requests

BIN = os.environ.get("KVBRIDGE_BIN", "kvbridge")
LISTEN_RE = re.compile(r"^listening on (.+):(\d+)$")


def start_server(*args, env_extra=None):
    env = dict(os.environ)
    env.pop("KVBRIDGE_BOOTSTRAP_TOKEN", None)
    env.update(env_extra or {})
    proc = subprocess.Popen(
        [BIN, "bootstrap", "--host", "127.0.0.1", "--port", "0", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    line = proc.stdout.readline().strip()
    m = LISTEN_RE.match(line)
    if not m:
        proc.kill()
        raise AssertionError(f"no listening line, got {line!r}: {proc.stderr.read()}")
    return proc, f"{m.group(1)}:{m.group(2)}"


def stop_server(proc):
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=10) == 0


@pytest.fixture
def server():
    proc, addr = start_server()
    yield addr
    stop_server(proc)


def prefill_payload(attn_tp_rank, rank_port, attn_tp_size=2, pp_rank=0, pp_size=1,
                    system_dp_size=1, system_dp_rank=0):
    # Seed 001, CommonKVManager._register_to_bootstrap.
    return {
        "role": "Prefill",
        "attn_tp_size": attn_tp_size,
        "attn_tp_rank": attn_tp_rank,
        "attn_dp_size": 1,
        "attn_dp_rank": 0,
        "pp_size": pp_size,
        "pp_rank": pp_rank,
        "system_dp_size": system_dp_size,
        "system_dp_rank": system_dp_rank,
        "rank_ip": "127.0.0.1",
        "rank_port": rank_port,
    }


def test_sglang_prefill_and_decode(server):
    url = f"http://{server}/route"
    for rank in range(2):
        response = requests.put(url, json=prefill_payload(rank, 17000 + rank), timeout=5)
        assert response.status_code == 200
        assert response.text == "OK"

    # Decode: parallel info, exactly as the seed parses it.
    url = f"http://{server}/route?engine_rank={-1}&target_dp_group={-1}&target_pp_rank={-1}"
    response = requests.get(url)
    assert response.status_code == 200
    info = response.json()
    assert (
        int(info["prefill_attn_tp_size"]),
        int(info["prefill_dp_size"]),
        int(info["prefill_pp_size"]),
    ) == (2, 1, 1)

    # Decode: one rank's address.
    url = f"http://{server}/route?engine_rank={1}&target_dp_group={0}&target_pp_rank={0}"
    response = requests.get(url, timeout=5)
    assert response.status_code == 200
    assert response.json() == {"rank_ip": "127.0.0.1", "rank_port": 17001}

    # Unknown rank: 404 with the seed's text.
    url = f"http://{server}/route?engine_rank={5}&target_dp_group={0}&target_pp_rank={0}"
    response = requests.get(url, timeout=5)
    assert response.status_code == 404
    assert response.text == "Bootstrap info not Found"


def test_heartbeat_keepalive(server):
    # Seed 001 heartbeat_checker: a requests.Session per bootstrap address.
    session = requests.Session()
    for _ in range(5):
        response = session.get(
            f"http://{server}/health", timeout=(2, 3), headers={"Connection": "keep-alive"}
        )
        assert response.status_code == 200
        assert response.text == "OK"


def test_tokenspeed_without_target_pp_rank(server):
    payload = prefill_payload(0, 18000, attn_tp_size=1)
    payload.update(
        kv_item_lens=[4096, 4096],
        kv_unit_lens=[128, 128],
        state_item_lens=[512],
        state_unit_lens=[512],
        enable_mla_l1_5_cache=False,
    )
    assert requests.put(f"http://{server}/route", json=payload, timeout=5).status_code == 200

    # Seed 004 _get_prefill_parallel_info_from_server.
    url = f"http://{server}/route?engine_rank={-1}&target_dp_group={-1}"
    response = requests.get(url)
    assert response.status_code == 200
    info = response.json()
    assert int(info["prefill_tp_size"]) == 1
    assert int(info["prefill_dp_size"]) == 1
    assert bool(info["enable_mla_l1_5_cache"]) is False
    assert tuple(int(x) for x in info.get("kv_item_lens", [])) == (4096, 4096)
    assert tuple(int(x) for x in info.get("kv_unit_lens", [])) == (128, 128)
    assert tuple(int(x) for x in info.get("state_item_lens", [])) == (512,)
    assert tuple(int(x) for x in info.get("state_unit_lens", [])) == (512,)
    assert info["dp_size"] == 1

    # Seed 004 _get_bootstrap_info_from_server: target_pp_rank absent = 0.
    url = f"http://{server}/route?engine_rank={0}&target_dp_group={0}"
    response = requests.get(url, timeout=5)
    assert response.status_code == 200
    assert response.json() == {"rank_ip": "127.0.0.1", "rank_port": 18000}


def test_errors(server):
    r = requests.get(f"http://{server}/route?engine_rank=0", timeout=5)
    assert (r.status_code, r.text) == (400, "Missing inputs for bootstrap server.")
    r = requests.get(f"http://{server}/route?engine_rank=zero&target_dp_group=0", timeout=5)
    assert r.status_code == 400 and "engine_rank" in r.text and "\n" not in r.text
    r = requests.delete(f"http://{server}/route", timeout=5)
    assert (r.status_code, r.text) == (405, "Method not allowed")
    r = requests.post(f"http://{server}/route", json={}, timeout=5)
    assert r.status_code == 405
    bad = prefill_payload(0, 17000)
    bad["attn_tp_rank"] = 2
    r = requests.put(f"http://{server}/route", json=bad, timeout=5)
    assert r.status_code == 400 and "attn_tp_rank" in r.text
    r = requests.put(f"http://{server}/route", data="{not json", timeout=5)
    assert r.status_code == 400
    r = requests.put(f"http://{server}/route", data=b" " * (1024 * 1024 + 1), timeout=5)
    assert r.status_code == 400 and "exceeds" in r.text
    # Nothing was registered by any of that.
    r = requests.get(f"http://{server}/route?engine_rank=-1&target_dp_group=-1", timeout=5)
    assert r.status_code == 404
    metrics = requests.get(f"http://{server}/metrics", timeout=5).text
    assert "kvbridge_bootstrap_registrations_total 0\n" in metrics
    assert 'kvbridge_bootstrap_errors_total{code="400"} 5\n' in metrics
    assert 'kvbridge_bootstrap_errors_total{code="405"} 2\n' in metrics


def test_token_from_environment():
    proc, addr = start_server(env_extra={"KVBRIDGE_BOOTSTRAP_TOKEN": "t0k"})
    try:
        url = f"http://{addr}/route"
        assert requests.put(url, json=prefill_payload(0, 1), timeout=5).status_code == 401
        r = requests.put(url, json=prefill_payload(0, 1), timeout=5,
                         headers={"Authorization": "Bearer t0k"})
        assert r.status_code == 200
        # Reads stay open without --auth-reads.
        r = requests.get(f"{url}?engine_rank=0&target_dp_group=0", timeout=5)
        assert r.status_code == 200
    finally:
        stop_server(proc)


def test_auth_reads_and_sigint():
    proc, addr = start_server("--token", "abc", "--auth-reads")
    try:
        url = f"http://{addr}/route?engine_rank=-1&target_dp_group=-1"
        assert requests.get(url, timeout=5).status_code == 401
        r = requests.get(url, timeout=5, headers={"Authorization": "Bearer abc"})
        assert r.status_code == 404
        assert requests.get(f"http://{addr}/health", timeout=5).status_code == 200
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=10) == 0


def test_port_in_use_fails():
    proc, addr = start_server()
    try:
        port = addr.rsplit(":", 1)[1]
        other = subprocess.run([BIN, "bootstrap", "--host", "127.0.0.1", "--port", port],
                               capture_output=True, text=True, timeout=10)
        assert other.returncode != 0
        assert "listening" not in other.stdout
    finally:
        stop_server(proc)
