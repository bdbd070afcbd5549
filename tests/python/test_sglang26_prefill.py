"""A Python DECODE rank speaking SGLang's 2026 dialect (written from
PROTOCOL-SGLANG-2026.md sections 4-7, not from SGLang's code) against a
kvbridge C prefill rank (sglang26_helper prefill).

It registers with the 18-frame KV-args, sends 10-frame transfer infos and a
4-frame ABORT, and checks every frame the prefill sends back on its own PULL
socket: the 3-frame status, the 3-frame ABORT_ACK (only once no write of the
room can land), and that nothing else arrives. The helper reports what
landed in the decode memory this peer names as its own.
"""

import pytest
import requests
import zmq

from sglang26_peer import HELPER, Helper, dec, i32s, lol, recv_frames, u64s

pytestmark = pytest.mark.skipif(
    not HELPER or not __import__("os").path.exists(HELPER),
    reason="KVBRIDGE_SGLANG26_HELPER not set",
)

LOCAL_IP = "127.0.0.1"


def open_peer(h):
    """The Python decode against helper h (sglang26_helper prefill ...)."""
    boot = h.info["boot"]
    http = requests.Session()
    # The seed-001 look-up (the dialect of kvbridge's bootstrap server today;
    # the 2026 look-up is the bootstrap helper's part).
    r = http.get(f"http://{boot}/route?engine_rank=0&target_dp_group=0&target_pp_rank=0")
    assert r.status_code == 200, r.text
    rank = r.json()
    ctx = zmq.Context()
    pull = ctx.socket(zmq.PULL)
    pull.setsockopt(zmq.LINGER, 0)
    port = pull.bind_to_random_port(f"tcp://{LOCAL_IP}")
    push = ctx.socket(zmq.PUSH)
    push.setsockopt(zmq.LINGER, 0)
    push.connect(f"tcp://{rank['rank_ip']}:{int(rank['rank_port'])}")
    p = type("Peer", (), {})()
    p.helper, p.pull, p.push, p.port = h, pull, push, port
    p.session = h.info["session"]
    p.kv = [int(x) for x in h.info["kv"].split(",")]
    p.aux = int(h.info["aux"])
    p.item_len = int(h.info["item_len"])
    p.page = int(h.info["page"])
    p.ctx = ctx
    return p


def close_peer(p):
    p.push.close()
    p.pull.close()
    p.ctx.term()
    p.helper.close()


@pytest.fixture
def peer():
    p = open_peer(Helper("prefill"))
    yield p
    close_peer(p)


def register(p, item_len=None, dcp=(1, 0), ext=()):
    """Spec 5.2: the plain-MHA registration SGLang sends, 18 frames."""
    frames = [
        b"None",
        LOCAL_IP.encode("ascii"),
        dec(p.port),
        p.session.encode("ascii"),
        u64s(p.kv),
        u64s([p.aux]),
        lol("Q", []),  # no state components: empty frame
        dec(0),  # dst_tp_rank
        dec(1),  # dst_attn_tp_size
        dec(p.item_len if item_len is None else item_len),
        b"",
        b"",
        b"",
        b"",
        b"",  # no staging ring
        b"",
        dec(dcp[0]),
        dec(dcp[1]),
    ]
    assert len(frames) == 18
    p.push.send_multipart(frames + list(ext))


def transfer_info(p, room, pages, aux_index, prefix_tokens=0, device=b"", ext=()):
    """Spec 5.3: 10 frames, the suffix pages only, prefix in tokens; ext:
    frames after frame 9 (a kvbridge decode's marker and extensions)."""
    frames = [
        dec(room),
        LOCAL_IP.encode("ascii"),
        dec(p.port),
        p.session.encode("ascii"),
        i32s(pages),
        dec(aux_index),
        lol("i", []),
        dec(1),  # required_dst_info_num
        dec(prefix_tokens),
        device,
    ]
    p.push.send_multipart(frames + list(ext))


def check_status(frames, room, value):
    # Spec 5.4: exactly 3 frames, room / status / prefill_unique_rank.
    assert frames == [dec(room), dec(value), b"0"], frames


def report(p, room):
    status = p.helper.line("status", room)
    kvbad = int(p.helper.line("kvbad", room))
    auxbad = int(p.helper.line("auxbad", room))
    return status, kvbad, auxbad


def test_tp1_to_tp1_with_prefix(peer):
    p = peer
    register(p)
    # 1. No prefix: every page, then the status.
    room, pages = 5001, [200, 3, 17, 90, 91, 92]
    transfer_info(p, room, pages, 7)
    p.helper.cmd(f"send {room} 2 7 {len(pages)} 0 all " + " ".join(map(str, pages)))
    check_status(recv_frames(p.pull), room, 4)
    status, kvbad, auxbad = report(p, room)
    assert status.split(" ")[0] == "4", status
    assert (kvbad, auxbad) == (0, 0)
    assert not p.pull.poll(200), "unexpected extra message"

    # 2. A prefix of 2 pages (8 tokens): the decode pre-allocates the suffix
    #    only; the kvbridge sender is given the whole request and skips the
    #    prefix pages.
    room, suffix = 5002, [30, 31, 40]
    transfer_info(p, room, suffix, 11, prefix_tokens=2 * p.page)
    p.helper.cmd(f"send {room} 4 11 5 2 all " + " ".join(map(str, suffix)))
    check_status(recv_frames(p.pull), room, 4)
    status, kvbad, auxbad = report(p, room)
    assert status.split(" ")[0] == "4", status
    assert (kvbad, auxbad) == (0, 0)

    # 3. The same, with a sender given only the suffix (SGLang's scheduler
    #    starts at the decode's prefix).
    room, suffix = 5003, [50, 51, 52]
    transfer_info(p, room, suffix, 12, prefix_tokens=2 * p.page)
    p.helper.cmd(f"send {room} 5 12 5 2 suffix " + " ".join(map(str, suffix)))
    check_status(recv_frames(p.pull), room, 4)
    status, kvbad, auxbad = report(p, room)
    assert status.split(" ")[0] == "4", status
    assert (kvbad, auxbad) == (0, 0)
    assert not p.pull.poll(200), "unexpected extra message"


def test_abort_gets_a_drained_ack(peer):
    p = peer
    register(p)
    room, pages = 5101, [60, 61, 62, 63]
    transfer_info(p, room, pages, 3)
    # Spec 5.6: ABORT, room, decode ip, decode PULL port.
    p.push.send_multipart([b"ABORT", dec(room), LOCAL_IP.encode("ascii"), dec(p.port)])
    # kvbridge answers the 3-frame ACK (no write of the room can land: none
    # was issued), and never a Failed status to the decode that asked.
    assert recv_frames(p.pull) == [b"ABORT_ACK", dec(room), b"0"]
    p.helper.cmd(f"send {room} 1 3 {len(pages)} 0 all " + " ".join(map(str, pages)))
    status, kvbad, auxbad = report(p, room)
    assert status.startswith("0 "), status
    assert "Aborted by the decode instance" in status, status
    assert kvbad > 0  # nothing was written
    assert not p.pull.poll(300), "unexpected message after the ACK"

    # An ABORT for a room the prefill never saw: acknowledged at once.
    p.push.send_multipart([b"ABORT", dec(5102), LOCAL_IP.encode("ascii"), dec(p.port)])
    assert recv_frames(p.pull) == [b"ABORT_ACK", b"5102", b"0"]

    # An ABORT after Success (the sender is gone): acknowledged at once, no
    # status follows.
    room, pages = 5103, [70, 71]
    transfer_info(p, room, pages, 4)
    p.helper.cmd(f"send {room} 1 4 2 0 all 70 71")
    check_status(recv_frames(p.pull), room, 4)
    assert report(p, room)[0].split(" ")[0] == "4"
    p.push.send_multipart([b"ABORT", dec(room), LOCAL_IP.encode("ascii"), dec(p.port)])
    assert recv_frames(p.pull) == [b"ABORT_ACK", dec(room), b"0"]
    assert not p.pull.poll(300), "unexpected message after the ACK"


def test_refused_fields_fail_the_room_with_a_reason(peer):
    p = peer
    # DCP size 2: kvbridge cannot relayout; the room fails with the reason
    # and the decode is told with a Failed status (3 frames).
    register(p, dcp=(2, 0))
    room = 5201
    transfer_info(p, room, [80, 81], 5)
    p.helper.cmd(f"send {room} 1 5 2 0 all 80 81")
    check_status(recv_frames(p.pull), room, 0)
    status, _, _ = report(p, room)
    assert status.startswith("0 ") and "DCP size 2" in status, status

    # KV item length differing at the same TP size: page size or dtype.
    register(p, item_len=p.item_len * 2)
    room = 5202
    transfer_info(p, room, [82, 83], 5)
    p.helper.cmd(f"send {room} 1 5 2 0 all 82 83")
    check_status(recv_frames(p.pull), room, 0)
    status, _, _ = report(p, room)
    assert "page size or the KV cache dtype differ" in status, status

    # A prefix that is not a whole number of pages.
    register(p)
    room = 5203
    transfer_info(p, room, [84], 5, prefix_tokens=p.page + 1)
    check_status(recv_frames(p.pull), room, 0)  # told at once: no sender needed
    p.helper.cmd(f"send {room} 1 5 2 1 all 84")
    status, _, _ = report(p, room)
    assert "not a multiple of the page size" in status, status

    # HiSparse device pages (frame 9) are refused.
    room = 5204
    transfer_info(p, room, [85], 5, device=i32s([1]))
    check_status(recv_frames(p.pull), room, 0)
    p.helper.cmd(f"send {room} 1 5 1 0 all 85")
    status, _, _ = report(p, room)
    assert "HiSparse" in status, status

    # A malformed 2026 transfer info (frame 7 zero) fails the room it names
    # with the codec's reason.
    room = 5206
    transfer_info(p, room, [88], 5)
    bad = [dec(room), LOCAL_IP.encode(), dec(p.port), p.session.encode(), i32s([88]), b"5",
           b"", b"0", b"0", b""]
    p.push.send_multipart(bad)
    p.helper.cmd(f"send {room} 1 5 1 0 all 88")
    check_status(recv_frames(p.pull), room, 0)  # once the sender sees it
    status, _, _ = report(p, room)
    assert (
        "Malformed control message for room 5206: transfer info (2026) frame 7 "
        '(required_dst_info_num): "0" out of range 1..2147483647' in status
    ), status

    # Staging messages are ignored (never crash, nothing sent back), and the
    # rank keeps serving.
    p.push.send_multipart([b"WATERMARK", b"1", b"4096", p.session.encode("ascii")])
    p.push.send_multipart([b"STAGING_RSP", b"1", b"0", b"0", b"0", b"64", p.session.encode()])
    room = 5205
    transfer_info(p, room, [86, 87], 6)
    p.helper.cmd(f"send {room} 1 6 2 0 all 86 87")
    check_status(recv_frames(p.pull), room, 4)
    status, kvbad, auxbad = report(p, room)
    assert status.split(" ")[0] == "4" and (kvbad, auxbad) == (0, 0), status


def test_unmarked_extension_is_refused(peer):
    """An extension frame without the marker is no 2026 frame: the transfer
    info is refused with the codec's reason and the room it names fails
    (nothing is written, the decode is told); the rank keeps serving."""
    p = peer
    register(p)
    room = 5401
    transfer_info(p, room, [94, 95], 8)
    transfer_info(p, room, [94, 95], 8, ext=[b"epoch=1"])
    p.helper.cmd(f"send {room} 1 8 2 0 all 94 95")
    check_status(recv_frames(p.pull), room, 0)
    status, kvbad, _ = report(p, room)
    assert (
        'transfer info (2026): 11 frames before any "kvbridge-ext/1" marker, at most 10'
        in status
    ), status
    assert kvbad > 0
    room = 5402
    transfer_info(p, room, [96], 9, ext=[MARKER, b"zz_future=1"])  # unknown keys pass
    p.helper.cmd(f"send {room} 1 9 1 0 all 96")
    check_status(recv_frames(p.pull), room, 4)
    status, kvbad, auxbad = report(p, room)
    assert status.split(" ")[0] == "4" and (kvbad, auxbad) == (0, 0), status
    assert not p.pull.poll(200), "unexpected extra message"


MARKER = b"kvbridge-ext/1"


def test_epoch_extension_is_stamped(peer):
    """A kvbridge decode's writer grant travels after frame 9 and the
    kvbridge-ext/1 marker (epoch=); the prefill stamps it on the room's
    writes. The helper's decode engine never granted this epoch, so its
    target refuses the writes: proof the 2026 path honours the grant
    (without it the same room succeeds)."""
    p = peer
    register(p)
    room = 5301
    transfer_info(p, room, [90, 91], 8, ext=[MARKER, b"epoch=12345"])
    p.helper.cmd(f"send {room} 1 8 2 0 all 90 91")
    check_status(recv_frames(p.pull), room, 0)
    status, kvbad, _ = report(p, room)
    assert status.startswith("0 ") and "fenced" in status, status
    assert kvbad > 0
    register(p)  # a failed session re-registers (spec 5.2)
    room = 5302
    transfer_info(p, room, [92, 93], 9)
    p.helper.cmd(f"send {room} 1 9 2 0 all 92 93")
    check_status(recv_frames(p.pull), room, 4)
    status, kvbad, auxbad = report(p, room)
    assert status.split(" ")[0] == "4" and (kvbad, auxbad) == (0, 0), status


@pytest.mark.parametrize("bad", [b"kv_layout=", b"kv_layout=4", b"kv_layout=04,nhd",
                                 b"kv_layout=0,nhd", b"kv_layout=4,NHD", b"kv_layout=4,hnd,",
                                 b"kv_layout=2147483648,nhd", b"kv_layout=-4,hnd"])
def test_kv_layout_extension(peer, bad):
    """A kvbridge decode's page size and order (kv_layout=, docs/planner.md):
    a malformed value drops the registration (the room then fails: no KV
    args), and the rank keeps serving; a well-formed one is taken (here this
    prefill's own page size, NHD: the room moves its bytes)."""
    p = peer
    register(p, ext=[MARKER, bad])
    room = 5501
    transfer_info(p, room, [70], 8)
    p.helper.cmd(f"send {room} 1 8 1 0 all 70")
    check_status(recv_frames(p.pull), room, 0)
    status, _, _ = report(p, room)
    assert "never its KV args" in status, status
    register(p, ext=[MARKER, b"kv_layout=%d,nhd" % p.page])
    room = 5502
    transfer_info(p, room, [71], 9)
    p.helper.cmd(f"send {room} 1 9 1 0 all 71")
    check_status(recv_frames(p.pull), room, 4)
    status, kvbad, auxbad = report(p, room)
    assert status.split(" ")[0] == "4" and (kvbad, auxbad) == (0, 0), status
