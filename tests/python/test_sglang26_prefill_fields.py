"""More 2026 registration fields against kvbridge's C prefill
(sglang26_helper prefill), from the spec: a decode whose KV buffers cover
another number of layers than the prefill's model (SGLang appends
draft-model KV buffers, spec 5.2 frame 4 / 7.2) to a prefill declaring no
draft layers (params draft_layers; test_sglang26_draft.py) is refused with a
reason instead of having its V halves written into the wrong buffers."""

from sglang26_peer import dec, u64s
from test_sglang26_prefill import (  # noqa: F401 (peer is a fixture)
    LOCAL_IP,
    check_status,
    lol,
    peer,
    recv_frames,
    report,
    transfer_info,
)


def test_draft_kv_buffers_are_refused(peer):
    p = peer
    kv = p.kv + [p.kv[0] + 64, p.kv[1] + 64]  # one more layer: K and V appended
    frames = [b"None", LOCAL_IP.encode(), dec(p.port), p.session.encode(), u64s(kv),
              u64s([p.aux]), lol("Q", []), b"0", b"1", dec(p.item_len), b"", b"", b"", b"",
              b"", b"", b"1", b"0"]
    p.push.send_multipart(frames)
    room = 5501
    transfer_info(p, room, [10, 11], 3)
    p.helper.cmd(f"send {room} 1 3 2 0 all 10 11")
    check_status(recv_frames(p.pull), room, 0)
    status, kvbad, _ = report(p, room)
    layers = len(p.kv) // 2
    assert status.startswith("0 "), status
    assert (
        f"registered KV buffers for {layers + 1} layers, this prefill's model has {layers} "
        "target + 0 draft layers: kvbridge pairs target and draft-model layers by position "
        "and the decode's 1 draft layers do not match (draft_layers)" in status
    ), status
    assert kvbad > 0  # nothing written
