"""A kvbridge C decode (sglang26_helper decode) against Python prefill ranks
of SGLang's 2026 dialect that dispatch rooms to DP groups themselves
(load_balance_method other than follow_bootstrap_room: spec 3.5, 3.6), and
against a prefill whose DSA cache layers are split across CP ranks (spec
7.7), which kvbridge does not serve. Written from the spec."""

import os

import pytest
import requests
import zmq

from sglang26_peer import HELPER, Helper, dec, poll, recv_frames, refused_at_init

pytestmark = pytest.mark.skipif(
    not HELPER or not os.path.exists(HELPER), reason="KVBRIDGE_SGLANG26_HELPER not set"
)

LOCAL_IP = "127.0.0.1"


def register(boot, port, dp_rank=0, dp_size=1, cp_rank=0, cp_size=1, balance="round_robin",
             dsa=False):
    body = {
        "attn_tp_size": 1, "attn_tp_rank": 0,
        "attn_cp_size": cp_size, "attn_cp_rank": cp_rank,
        "attn_dp_size": dp_size, "attn_dp_rank": dp_rank,
        "pp_size": 1, "pp_rank": 0, "system_dp_size": 1, "system_dp_rank": 0,
        "rank_ip": LOCAL_IP, "rank_port": port, "page_size": 4, "kv_cache_dtype": "auto",
        "load_balance_method": balance, "enable_dsa_cache_layer_split": dsa,
        "prefill_http_port": None,
    }
    r = requests.put(f"http://{boot}/route", json=body, timeout=5)
    assert r.status_code == 200, r.text


@pytest.fixture
def decode():
    ctx = zmq.Context()
    h = Helper("decode", {"KVBRIDGE_SGLANG_DIALECT": "2026"})
    pulls = []

    def pull():
        s = ctx.socket(zmq.PULL)
        s.setsockopt(zmq.LINGER, 0)
        port = s.bind_to_random_port(f"tcp://{LOCAL_IP}")
        pulls.append(s)
        return s, port

    yield h, pull
    for s in pulls:
        s.close()
    h.close()
    ctx.term()


def test_rooms_follow_the_registered_dp_group(decode):
    h, pull = decode
    boot = h.info["boot"]
    (p0, port0), (p1, port1) = pull(), pull()
    register(boot, port0, dp_rank=0, dp_size=2)
    register(boot, port1, dp_rank=1, dp_size=2)
    # Room 8000 % 2 == 0, but the prefill dispatched it to DP group 1.
    room = 8000
    r = requests.post(f"http://{boot}/register_dp_rank", json={"bootstrap_room": room,
                                                                "dp_rank": 1}, timeout=5)
    assert r.status_code == 200
    h.cmd(f"recv {room} 1 0 2 5 6")
    assert h.line("recv", room) == "2"
    assert recv_frames(p1)[0] == b"None"  # KV-args
    assert recv_frames(p1)[0] == dec(room)  # transfer info to DP group 1
    assert not p0.poll(200), "DP group 0 got a message"

    # A room no prefill registered: the decode asks for a bounded time, then
    # fails the room with the reason; nothing is sent.
    room = 8002
    reason = refused_at_init(h, room, "1 0 1 7")
    assert reason == (
        f"prefill DP group of room {room} unknown at bootstrap server {boot} after 5 s "
        "(follow_bootstrap_room is false there: the prefill must POST /register_dp_rank)"
    ), reason
    assert not p0.poll(100) and not p1.poll(100)


def test_follow_bootstrap_room_picks_room_mod_dp(decode):
    h, pull = decode
    boot = h.info["boot"]
    (p0, port0), (p1, port1) = pull(), pull()
    register(boot, port0, dp_rank=0, dp_size=2, balance="follow_bootstrap_room")
    register(boot, port1, dp_rank=1, dp_size=2, balance="follow_bootstrap_room")
    room = 8101  # % 2 == 1
    h.cmd(f"recv {room} 1 0 1 5")
    assert h.line("recv", room) == "2"
    assert recv_frames(p1)[0] == b"None"
    assert recv_frames(p1)[0] == dec(room)
    assert not p0.poll(200)


def test_dsa_layer_split_is_refused(decode):
    h, pull = decode
    boot = h.info["boot"]
    (p0, port0), (p1, port1) = pull(), pull()
    register(boot, port0, cp_rank=0, cp_size=2, dsa=True)
    register(boot, port1, cp_rank=1, cp_size=2, dsa=True)
    room = 8201
    h.cmd(f"recv {room} 1 0 1 5")
    assert h.line("recv", room) == "0"
    status, safe, reason = poll(h, room, 1)
    assert status == 0, reason
    assert reason == (
        f"prefill at {boot} splits its DSA cache layers across 2 CP ranks "
        "(enable_dsa_cache_layer_split); kvbridge pulls every layer from CP rank 0"
    ), reason
    assert not p0.poll(200) and not p1.poll(100)


def test_cp2_prefill_status_ranks(decode):
    """Prefill TP 2 x CP 2 (no DSA split): only CP rank 0 of each TP rank
    transfers (spec 7.7); its status carries prefill_unique_rank
    tp * (pp * cp) + pp * cp + cp (spec 1), i.e. 0 and 2 here. A status
    from a CP rank 1 counts for nothing."""
    h, pull = decode
    boot = h.info["boot"]
    socks = {}
    for tp in range(2):
        for cp in range(2):
            s, port = pull()
            socks[(tp, cp)] = s
            r = requests.put(f"http://{boot}/route", json={
                "attn_tp_size": 2, "attn_tp_rank": tp, "attn_cp_size": 2, "attn_cp_rank": cp,
                "attn_dp_size": 1, "attn_dp_rank": 0, "pp_size": 1, "pp_rank": 0,
                "system_dp_size": 1, "system_dp_rank": 0, "rank_ip": LOCAL_IP,
                "rank_port": port, "page_size": 4, "kv_cache_dtype": "auto"}, timeout=5)
            assert r.status_code == 200, r.text
    room = 8301
    h.cmd(f"recv {room} 1 0 2 5 6")
    assert h.line("recv", room) == "2"
    for tp in range(2):  # non-MLA TP 2 -> TP 1: both TP ranks are real sources
        assert recv_frames(socks[(tp, 0)])[0] == b"None"
        assert recv_frames(socks[(tp, 0)])[0] == dec(room)
        assert not socks[(tp, 1)].poll(100), "a CP rank 1 was targeted"
    ctl_host, ctl_port = h.info["ctl"].rsplit(":", 1)
    push = zmq.Context.instance().socket(zmq.PUSH)
    push.setsockopt(zmq.LINGER, 0)
    push.connect(f"tcp://{ctl_host}:{ctl_port}")
    push.send_multipart([dec(room), b"4", b"0"])  # tp 0 cp 0
    push.send_multipart([dec(room), b"4", b"1"])  # tp 0 cp 1: no source
    assert poll(h, room, 0.3)[0] == 2
    push.send_multipart([dec(room), b"4", b"2"])  # tp 1 cp 0
    assert poll(h, room, 5) == (4, 1, "")
    push.close()


def test_status_during_resolution_is_ignored(decode):
    # Review 2, finding 9: while a receiver is still resolving its room (here
    # the decode waits for the prefill's POST /register_dp_rank), the room
    # has no sources yet; a status naming it is no source's and must not end
    # it (one Success would otherwise mark it Success for good, with no byte
    # written). Once resolved the room waits for its transfer as usual.
    import threading
    import time

    h, pull = decode
    boot = h.info["boot"]
    (p0, port0), (p1, port1) = pull(), pull()
    register(boot, port0, dp_rank=0, dp_size=2)
    register(boot, port1, dp_rank=1, dp_size=2)
    room = 8010
    ctx = zmq.Context.instance()
    push = ctx.socket(zmq.PUSH)
    push.setsockopt(zmq.LINGER, 0)
    push.connect(f"tcp://{h.info['ctl']}")

    def late():
        time.sleep(0.4)  # the decode is asking /query_dp_ranks by now
        push.send_multipart([dec(room), b"4", b"0"])  # Success, "from rank 0"
        time.sleep(0.4)
        r = requests.post(f"http://{boot}/register_dp_rank",
                          json={"bootstrap_room": room, "dp_rank": 1}, timeout=5)
        assert r.status_code == 200

    t = threading.Thread(target=late)
    t.start()
    h.cmd(f"recv {room} 1 0 2 5 6")
    status = h.line("recv", room)
    t.join()
    push.close()
    assert status == "2", status  # WaitingForInput, not Success
    assert recv_frames(p1)[0] == b"None"  # KV-args
    assert recv_frames(p1)[0] == dec(room)  # its transfer info
    assert poll(h, room, 0.3)[:2] == (2, 0)
