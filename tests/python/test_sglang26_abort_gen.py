"""ABORT with SGLang 0.5.23's generation frame (after the spec's commit; its
deferred decode KV release is on by default there): AbortNotification.to_zmq
appends str(generation) as frame 4 and the decode counts only an ABORT_ACK
whose frame 3 echoes it (AbortAck.to_zmq: tag, room, prefill_unique_rank,
generation). A Python decode against a kvbridge C prefill (sglang26_helper),
as test_sglang26_prefill.py; found by make check-interop, where SGLang's real
connector runs."""

import pytest

from sglang26_peer import HELPER, dec
from test_sglang26_prefill import LOCAL_IP, peer, recv_frames, register, report, transfer_info  # noqa: F401

pytestmark = pytest.mark.skipif(
    not HELPER or not __import__("os").path.exists(HELPER),
    reason="KVBRIDGE_SGLANG26_HELPER not set",
)


def abort(p, room, generation):
    p.push.send_multipart([b"ABORT", dec(room), LOCAL_IP.encode("ascii"), dec(p.port), generation])


def test_abort_generation_is_echoed(peer):  # noqa: F811
    p = peer
    register(p)
    room, pages = 5201, [60, 61, 62, 63]
    transfer_info(p, room, pages, 3)
    abort(p, room, b"7")
    assert recv_frames(p.pull) == [b"ABORT_ACK", dec(room), b"0", b"7"]
    p.helper.cmd(f"send {room} 1 3 {len(pages)} 0 all " + " ".join(map(str, pages)))
    status, kvbad, _ = report(p, room)
    assert status.startswith("0 ") and "Aborted by the decode instance" in status, status
    assert kvbad > 0  # nothing was written
    assert not p.pull.poll(300), "unexpected message after the ACK"

    # A room the prefill never saw, and a room already over: at once, echoed.
    abort(p, 5202, b"8")
    assert recv_frames(p.pull) == [b"ABORT_ACK", b"5202", b"0", b"8"]
    room = 5203
    transfer_info(p, room, [70, 71], 4)
    p.helper.cmd(f"send {room} 1 4 2 0 all 70 71")
    assert recv_frames(p.pull) == [dec(room), b"4", b"0"]
    assert report(p, room)[0].split(" ")[0] == "4"
    abort(p, room, b"9")
    assert recv_frames(p.pull) == [b"ABORT_ACK", dec(room), b"0", b"9"]

    # A malformed generation: no ACK; the prefill keeps serving.
    abort(p, 5204, b"x")
    assert not p.pull.poll(300), "a malformed ABORT was answered"
    abort(p, 5205, b"10")
    assert recv_frames(p.pull) == [b"ABORT_ACK", b"5205", b"0", b"10"]
