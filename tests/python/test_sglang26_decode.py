"""Python PREFILL ranks speaking SGLang's 2026 dialect (written from
PROTOCOL-SGLANG-2026.md sections 4-7, not from SGLang's code) against a
kvbridge C decode rank configured for it (KVBRIDGE_SGLANG_DIALECT=2026,
sglang26_helper decode).

The peers register with kvbridge's bootstrap server (the union body of spec
11.1, which both dialects' servers accept), receive the decode's 18-frame
KV-args and 10-frame transfer infos on their PULL sockets, check every byte,
and answer with 3-frame statuses and ABORT_ACKs. The decode's poll, reason
and pages_safe are read back from the helper.

A peer registered with "kvbridge": 2 (as a kvbridge prefill does) gets
kvbridge's extension frames after the kvbridge-ext/1 marker; any other gets
exactly its dialect's frames (docs/protocol-frames.md, "Extension frames").
"""

import os
import re

import pytest
import requests
import zmq

from sglang26_peer import HELPER, Helper, dec, i32s, poll, recv_frames, refused_at_init, u64s

pytestmark = pytest.mark.skipif(
    not HELPER or not os.path.exists(HELPER), reason="KVBRIDGE_SGLANG26_HELPER not set"
)

LOCAL_IP = "127.0.0.1"
MARKER = b"kvbridge-ext/1"


class Prefill:
    """One prefill rank: a PULL socket registered at the bootstrap server."""

    def __init__(self, ctx, boot, tp_rank, tp_size, kvbridge, page_size=4):
        self.pull = ctx.socket(zmq.PULL)
        self.pull.setsockopt(zmq.LINGER, 0)
        self.port = self.pull.bind_to_random_port(f"tcp://{LOCAL_IP}")
        body = {
            "role": "Prefill",
            "attn_tp_size": tp_size,
            "attn_tp_rank": tp_rank,
            "attn_cp_size": 1,
            "attn_cp_rank": 0,
            "attn_dp_size": 1,
            "attn_dp_rank": 0,
            "pp_size": 1,
            "pp_rank": 0,
            "system_dp_size": 1,
            "system_dp_rank": 0,
            "rank_ip": LOCAL_IP,
            "rank_port": self.port,
            "page_size": page_size,
            "kv_cache_dtype": "auto",
            "load_balance_method": "follow_bootstrap_room",
            "enable_dsa_cache_layer_split": False,
            "prefill_http_port": None,
        }
        if kvbridge:
            body["kvbridge"] = 2  # KVB_BOOTSTRAP_KVBRIDGE_VERSION
        r = requests.put(f"http://{boot}/route", json=body, timeout=5)
        assert r.status_code == 200, r.text


@pytest.fixture
def env():
    ctx = zmq.Context()
    made = []

    def start(tp_size=1, kvbridge=True, role="decode", dialect="2026", page_size=4):
        h = Helper(role, {"KVBRIDGE_SGLANG_DIALECT": dialect})
        made.append(h)
        ranks = [Prefill(ctx, h.info["boot"], t, tp_size, kvbridge, page_size)
                 for t in range(tp_size)]
        ctl_host, ctl_port = h.info["ctl"].rsplit(":", 1)
        push = ctx.socket(zmq.PUSH)
        push.setsockopt(zmq.LINGER, 0)
        push.connect(f"tcp://{ctl_host}:{ctl_port}")
        return h, ranks, push

    yield start
    for h in made:
        h.close()
    ctx.destroy(linger=0)


def expected_kv_args(h, ext):
    kv = [int(x) for x in h.info["kv"].split(",")]
    host, port = h.info["ctl"].rsplit(":", 1)
    frames = [
        b"None",
        host.encode(),
        port.encode(),
        h.info["session"].encode(),
        u64s(kv),
        u64s([int(h.info["aux"])]),
        b"",  # no state components
        b"0",  # dst_tp_rank
        b"1",  # dst_attn_tp_size
        h.info["item_len"].encode(),
        b"",
        b"",
        b"",
        b"",
        b"",  # kvbridge never advertises a staging ring
        b"",
        b"1",  # DCP size
        b"0",  # DCP rank
    ]
    if ext:  # kvbridge's extensions after frame 17: its page size and order, buffer lengths
        frames += [MARKER, b"kv_layout=%s,nhd" % h.info["page"].encode(),
                   b"kv_lens=" + u64s([int(h.info["buf_len"])] * len(kv))]
    return frames


def abort_frames(p, h, room):
    """The 2026 ABORT the decode sends for room; returns its generation."""
    host, port = h.info["ctl"].rsplit(":", 1)
    frames = recv_frames(p.pull)
    assert frames[:4] == [b"ABORT", dec(room), host.encode(), port.encode()], frames
    assert len(frames) == 5 and re.fullmatch(rb"[1-9][0-9]*", frames[4]), frames
    return int(frames[4])


def check_transfer(frames, h, room, pages, aux, prefix, ext, required=1):
    host, port = h.info["ctl"].rsplit(":", 1)
    fixed = [
        dec(room),
        host.encode(),
        port.encode(),
        h.info["session"].encode(),
        i32s(pages),
        dec(aux),
        b"",  # no state indices
        dec(required),
        dec(prefix),
        b"",  # no HiSparse device pages
    ]
    assert frames[:10] == fixed, frames
    if ext:
        assert len(frames) == 12 and frames[10] == MARKER, frames
        m = re.fullmatch(rb"epoch=([1-9][0-9]*)", frames[11])
        assert m, frames[11]
        return int(m.group(1))
    assert len(frames) == 10, frames
    return None



def test_tp1_success_and_abort(env):
    h, (p,), push = env()
    # Request of 5 pages, the first 2 (8 tokens) already on the decode.
    room, pages = 7001, [20, 21, 22, 23, 24]
    h.cmd(f"recv {room} 3 8 {len(pages)} " + " ".join(map(str, pages)))
    assert h.line("recv", room) == "2"  # WaitingForInput
    assert recv_frames(p.pull) == expected_kv_args(h, True)
    epoch = check_transfer(recv_frames(p.pull), h, room, pages[2:], 3, 8, True)
    assert epoch >= 1
    push.send_multipart([dec(room), b"4", b"0"])  # spec 5.4
    assert poll(h, room, 5) == (4, 1, "")

    # Abort: ABORT to the source with a generation (frame 4, SGLang 0.5.23;
    # the spec's prefill reads frames 0-3). The source holds the room's
    # writer grant (epoch=): the decode revokes it, and once nothing
    # admitted under it is still landing (here: nothing was written) the
    # room is Failed with its pages safe, whatever the source says.
    room, pages = 7002, [30, 31]
    h.cmd(f"recv {room} 4 0 2 30 31")
    assert h.line("recv", room) == "2"
    epoch2 = check_transfer(recv_frames(p.pull), h, room, pages, 4, 0, True)  # KV-args once
    assert epoch2 > epoch  # a grant per room
    h.cmd(f"abort {room}")
    assert h.line("aborted", room) == ""
    abort_frames(p, h, room)
    status, safe, reason = poll(h, room, 5)
    assert (status, safe) == (0, 1)
    assert reason == "Aborted by AbortReq.", reason
    assert not p.pull.poll(200), "unexpected extra message"

    # A Failed status fails the room with the seeds' reason.
    room = 7003
    h.cmd(f"recv {room} 5 0 1 40")
    assert h.line("recv", room) == "2"
    check_transfer(recv_frames(p.pull), h, room, [40], 5, 0, True)
    push.send_multipart([dec(room), b"0", b"0"])
    status, safe, reason = poll(h, room, 5)
    assert status == 0 and safe == 1
    assert reason == "Failed to get kvcache from prefill instance, it might be dead", reason

    # Staging traffic from a prefill is ignored; the decode keeps serving.
    push.send_multipart([b"STAGING_REQ", b"7004", b"0", b"1", h.info["session"].encode()])
    push.send_multipart([b"CHUNK_READY", b"7004", b"0", b"0", b"1", b"s", b"0"])
    room = 7004
    h.cmd(f"recv {room} 6 0 1 41")
    assert h.line("recv", room) == "2"
    # After a Failed, a kvbridge prefill (this one says "kvbridge") gets the
    # KV args again with the next receiver: it may have dropped them
    # (review 2.6).
    assert recv_frames(p.pull) == expected_kv_args(h, True)
    check_transfer(recv_frames(p.pull), h, room, [41], 6, 0, True)
    push.send_multipart([dec(room), b"4", b"0"])
    assert poll(h, room, 5) == (4, 1, "")


def test_bare_2026_frames_without_extensions(env):
    # The default dialect (KVBRIDGE_SGLANG_DIALECT unset) is 2026: the
    # bootstrap server answered the 2026 query, so ZeroMQ speaks 2026 too.
    # The prefill did not register as kvbridge: no marker, no extension.
    h, (p,), push = env(kvbridge=False, dialect=None)
    room = 7101
    h.cmd(f"recv {room} 1 0 3 5 6 7")
    assert h.line("recv", room) == "2"
    frames = recv_frames(p.pull)
    assert len(frames) == 18
    assert frames == expected_kv_args(h, False)
    assert check_transfer(recv_frames(p.pull), h, room, [5, 6, 7], 1, 0, False) is None
    push.send_multipart([dec(room), b"4", b"0"])
    assert poll(h, room, 5) == (4, 1, "")

    # Abort of a room whose source got no writer grant (no "kvbridge" in its
    # look-up): poll() holds it (Transferring, pages unsafe) until the
    # source confirms no write can land: a 3-frame ACK, or a 4-frame one
    # echoing the generation. A 2-frame ACK (SGLang's default, sent at once)
    # confirms nothing.
    room = 7102
    h.cmd(f"recv {room} 4 0 2 30 31")
    assert h.line("recv", room) == "2"
    assert check_transfer(recv_frames(p.pull), h, room, [30, 31], 4, 0, False) is None
    h.cmd(f"abort {room}")
    assert h.line("aborted", room) == ""
    gen = abort_frames(p, h, room)
    assert poll(h, room, 0.3)[:2] == (3, 0)  # Transferring: the fence is open
    push.send_multipart([b"ABORT_ACK", dec(room)])
    assert poll(h, room, 0.3)[:2] == (3, 0)
    push.send_multipart([b"ABORT_ACK", dec(room), b"5"])  # rank 5 is no source: ignored
    assert poll(h, room, 0.3)[:2] == (3, 0)
    push.send_multipart([b"ABORT_ACK", dec(room), b"0", dec(gen + 7)])  # another generation
    assert poll(h, room, 0.3)[:2] == (3, 0)
    push.send_multipart([b"ABORT_ACK", dec(room), b"0", dec(gen)])
    status, safe, reason = poll(h, room, 5)
    assert (status, safe) == (0, 1)
    assert reason == "Aborted by AbortReq.", reason


def test_tp2_prefill_to_tp1_decode(env):
    h, ranks, push = env(tp_size=2)
    room, pages = 7201, [8, 9, 10]
    h.cmd(f"recv {room} 2 0 3 8 9 10")
    assert h.line("recv", room) == "2"
    # Non-MLA, prefill TP 2 > decode TP 1: both prefill ranks are real
    # sources, each told required_dst_info_num 1 (spec 10.1).
    for p in ranks:
        assert recv_frames(p.pull) == expected_kv_args(h, True)
        check_transfer(recv_frames(p.pull), h, room, pages, 2, 0, True)
    push.send_multipart([dec(room), b"4", b"0"])
    assert poll(h, room, 0.3)[0] == 2  # one of two sources answered
    push.send_multipart([dec(room), b"4", b"1"])  # prefill_unique_rank of tp 1
    assert poll(h, room, 5) == (4, 1, "")


def test_tp2_mla_prefill_to_tp1_decode_dummy(env):
    h, ranks, push = env(tp_size=2, role="decode-mla")
    room, pages = 7301, [11, 12]
    h.cmd(f"recv {room} 1 0 2 11 12")
    assert h.line("recv", room) == "2"
    # MLA, prefill TP 2 > decode TP 1: prefill rank 0 is the real source,
    # rank 1 a dummy (spec 10.1): frames 4, 5, 6 and 9 empty, no epoch.
    for p in ranks:
        assert recv_frames(p.pull) == expected_kv_args(h, True)
    check_transfer(recv_frames(ranks[0].pull), h, room, pages, 1, 0, True)
    host, port = h.info["ctl"].rsplit(":", 1)
    assert recv_frames(ranks[1].pull) == [
        dec(room),
        host.encode(),
        port.encode(),
        h.info["session"].encode(),
        b"",
        b"",
        b"",
        b"1",
        b"0",
        b"",
    ]
    push.send_multipart([dec(room), b"4", b"0"])  # the dummy sends nothing
    assert poll(h, room, 5) == (4, 1, "")
    assert not ranks[1].pull.poll(200)


def test_seed001_dialect_when_configured(env):
    """KVBRIDGE_SGLANG_DIALECT=2025: the seed-001 layouts (PROTOCOL.md), to a
    kvbridge prefill with kvbridge's extensions after frames 8 / 6 and the
    marker, and the abort as a dummy transfer info with abort=1 (seed 001
    has no ABORT)."""
    h, (p,), push = env(dialect="2025")
    room = 7401
    h.cmd(f"recv {room} 2 0 2 3 4")
    assert h.line("recv", room) == "2"
    frames = recv_frames(p.pull)
    v26 = expected_kv_args(h, True)
    assert frames == v26[:6] + [b"0", b"1", v26[9], MARKER, v26[19], v26[20]], frames  # 9 + ext
    host, port = h.info["ctl"].rsplit(":", 1)
    frames = recv_frames(p.pull)
    assert frames[:7] == [dec(room), host.encode(), port.encode(), h.info["session"].encode(),
                          i32s([3, 4]), b"2", b"1"], frames
    assert len(frames) == 9 and frames[7] == MARKER, frames
    assert re.fullmatch(rb"epoch=[1-9][0-9]*", frames[8]), frames
    h.cmd(f"abort {room}")
    assert h.line("aborted", room) == ""
    assert recv_frames(p.pull) == [dec(room), host.encode(), port.encode(),
                                   h.info["session"].encode(), b"", b"", b"1", MARKER,
                                   b"abort=1"]
    push.send_multipart([dec(room), b"0", b"0"])  # seed 001: the Failed status confirms
    status, safe, reason = poll(h, room, 5)
    assert (status, safe, reason) == (0, 1, "Aborted by AbortReq."), reason


def test_seed001_plain_prefill_gets_plain_frames(env):
    """A seed-001 prefill that did not register as kvbridge (SGLang 0.5.2rc2)
    gets exactly 9 / 7 frames: no marker, no kv_lens=, no epoch=, and no
    abort (seed 001 has none): an aborted room waits for that prefill's
    status. What those frames cannot say (a decode prefix, state indices, a
    page mask with holes) fails the room with the reason, nothing sent."""
    h, (p,), push = env(dialect="2025", kvbridge=False)
    room = 7501
    h.cmd(f"recv {room} 2 0 2 3 4")
    assert h.line("recv", room) == "2"
    v26 = expected_kv_args(h, False)
    assert recv_frames(p.pull) == v26[:6] + [b"0", b"1", v26[9]]
    host, port = h.info["ctl"].rsplit(":", 1)
    assert recv_frames(p.pull) == [dec(room), host.encode(), port.encode(),
                                   h.info["session"].encode(), i32s([3, 4]), b"2", b"1"]
    h.cmd(f"abort {room}")
    assert h.line("aborted", room) == ""
    assert not p.pull.poll(300), "an abort reached a seed-001 prefill"
    assert poll(h, room, 0.3)[:2] == (3, 0)  # the fence waits for the prefill
    push.send_multipart([dec(room), b"4", b"0"])  # its Success ends the writes
    status, safe, reason = poll(h, room, 5)
    assert (status, safe, reason) == (0, 1, "Aborted by AbortReq."), reason

    room = 7502  # 8 prefix tokens: 2 pages of 4
    reason = refused_at_init(h, room, "3 8 3 5 6 7")
    assert reason == (
        f"room {room}: a decode prefix (kvbridge's extension) has no form in seed 001's "
        f"transfer info without kvbridge extensions, and prefill {LOCAL_IP}:{p.port} did not "
        "register as kvbridge; nothing was sent"
    ), reason
    assert not p.pull.poll(300), "a transfer info was sent"


def test_page_size_mismatch_refused_unless_kvbridge(env):
    """A prefill of another page size (8; this decode's is 4) that did not
    register as kvbridge cannot be told this decode's page size (kv_layout=
    travels only to kvbridge ranks): the room fails naming both sizes, and
    no KV args reach it. One that registered as kvbridge gets the KV args
    with "kv_layout=4,nhd" (it maps rows, docs/planner.md)."""
    h, (p,), push = env(kvbridge=False, page_size=8)
    room = 7601
    h.cmd(f"recv {room} 1 0 1 5")
    h.line("recv", room)
    status, safe, reason = poll(h, room, 5)
    assert (status, safe) == (0, 1), reason
    assert "Page size mismatch" in reason and "page_size 8, this decode 4" in reason, reason
    assert not p.pull.poll(300)  # nothing sent to it

    h, (p,), push = env(kvbridge=True, page_size=8)
    room = 7602
    h.cmd(f"recv {room} 1 0 1 5")
    assert h.line("recv", room) == "2"
    frames = recv_frames(p.pull)
    assert frames == expected_kv_args(h, True), frames
    assert b"kv_layout=4,nhd" in frames
    check_transfer(recv_frames(p.pull), h, room, [5], 1, 0, True)
    push.send_multipart([dec(room), b"4", b"0"])
    assert poll(h, room, 5) == (4, 1, "")
