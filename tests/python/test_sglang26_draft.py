"""Draft-model (speculative decoding) KV buffers from kvbridge's C prefill
(sglang26_helper prefill draft=N: params draft_layers) to a Python decode
speaking SGLang's 2026 dialect (written from PROTOCOL-SGLANG-2026.md).

SGLang's decode appends its draft pool's buffers after the target's in
KV-args frame 4 (spec 5.2, DEC:448-480): K target, V target, K draft, V
draft. The wire carries no draft count (SGLang's own prefill guesses it
from Ld % Ls, spec 7.2); kvbridge's prefill takes the draft layers it was
given and refuses a decode whose buffers do not add up, with a reason and
nothing written, and keeps serving."""

from test_sglang26_prefill import (
    HELPER,
    Helper,
    check_status,
    close_peer,
    open_peer,
    pytestmark,  # noqa: F401 (skips without the helper)
    recv_frames,
    register,
    report,
    transfer_info,
)

LAYERS = 2  # KVBH_CHILD_GEOM's target layers


def send(p, room, pages, aux):
    transfer_info(p, room, pages, aux)
    p.helper.cmd(f"send {room} 1 {aux} {len(pages)} 0 all " + " ".join(map(str, pages)))


def dirty(p, room, pages):
    p.helper.cmd(f"dirty {room} " + " ".join(map(str, pages)))
    return int(p.helper.line("dirty", room))


def refused(p, room, pages, text):
    send(p, room, pages, 3)
    check_status(recv_frames(p.pull), room, 0)
    status, _, _ = report(p, room)
    assert status.startswith("0 ") and text in status, status
    assert dirty(p, room, pages) == 0, status  # nothing written
    assert not p.pull.poll(200), "unexpected extra message"


def test_draft_kv_to_a_2026_decode():
    p = open_peer(Helper(None, argv=[HELPER, "prefill", "draft=1"]))
    try:
        assert len(p.kv) == 2 * (LAYERS + 1)  # K, V target; K, V draft
        register(p)
        room, pages = 5601, [12, 3, 77, 40, 41]
        send(p, room, pages, 5)
        check_status(recv_frames(p.pull), room, 4)
        status, kvbad, auxbad = report(p, room)
        assert status.split(" ")[0] == "4", status
        assert (kvbad, auxbad) == (0, 0)  # every byte of all 6 buffers
        assert not p.pull.poll(200), "unexpected extra message"
    finally:
        close_peer(p)


def test_draft_layouts_that_do_not_add_up_are_refused():
    p = open_peer(Helper(None, argv=[HELPER, "prefill", "draft=1"]))
    try:
        kv = p.kv
        # Two draft layers at the decode (another draft model).
        p.kv = kv[:4] + [kv[4], kv[4] + 64, kv[5], kv[5] + 64]
        register(p)
        refused(p, 5701, [20, 21], "the decode's 2 draft layers do not match (draft_layers)")
        # No draft buffers at the decode (a non-speculative pool).
        p.kv = kv[:4]
        register(p)
        refused(
            p,
            5702,
            [22],
            f"registered KV buffers for {LAYERS} layers, this prefill's model has {LAYERS} "
            "target + 1 draft layers: kvbridge pairs layers by position",
        )
        # The prefill keeps serving the decode once its layout fits.
        p.kv = kv
        register(p)
        send(p, 5703, [23, 24], 6)
        check_status(recv_frames(p.pull), 5703, 4)
        status, kvbad, auxbad = report(p, 5703)
        assert (kvbad, auxbad) == (0, 0), status
    finally:
        close_peer(p)
