"""Draft-model (speculative decoding) KV buffers from kvbridge's C prefill
(ts_helper draft=N: params draft_layers on every rank) to a TokenSpeed
decode written from PROTOCOL-TOKENSPEED.md (tokenspeed_peer.py). Spec 8.5:
the draft pool's buffers follow the target's (K target, V target, K draft,
V draft) and the plan labels them target_k/target_v/draft_k/draft_v (7.2).
Every KV byte of every buffer, draft ones included, is checked by the
helper; a plan whose kinds do not fit the layout, and a decode without the
draft buffers, fail with a reason and nothing written."""

import os

import pytest

from test_tokenspeed_prefill import expect_failed, quiet, run
from tokenspeed_peer import HELPER, SUCCESS, Decode, Helper, buffer_kind, plan_fragments

pytestmark = pytest.mark.skipif(
    not HELPER or not os.path.exists(HELPER), reason="KVBRIDGE_TS_HELPER not set"
)

LAYERS = 2  # KVBH_CHILD_GEOM's target layers


def start(tp, draft, mla=False):
    h = Helper(tp, mla, draft=draft)
    return h, Decode(h)


def planned_room(h, d, room, pages, frags):
    """Every rank the plan names registers and gets its fragments; all
    bytes must land and the decode hear Success from each."""
    for r in frags:
        d.register(r)
        d.transfer(r, room, pages, plan=frags[r])
    st, kvbad, _ = run(h, d, room, "".join(map(str, frags)), pages)
    assert all(s.split(" ")[1] == "4" for s in st), st
    assert kvbad == 0, st  # every head slice of every target and draft buffer
    got = d.wait_room(room, responses=len(frags))
    assert got[0] == SUCCESS, got
    quiet(d)


def test_kinds_follow_the_appended_layout():
    assert [buffer_kind(b, 8, False, 2) for b in range(8)] == [
        "target_k", "target_k", "target_v", "target_v",
        "draft_k", "draft_k", "draft_v", "draft_v",
    ]
    assert [buffer_kind(b, 3, True, 1) for b in range(3)] == ["target_k", "target_k", "draft_k"]


def test_tp1_to_tp1_draft_identity_and_explicit_plan():
    h, d = start(1, 1)
    try:
        assert len(d.kv) == 2 * (LAYERS + 1)
        info = d.parallel_info()
        assert info["kv_item_lens"] == [d.item] * len(d.kv)  # one per buffer, draft too
        d.register(0)
        d.transfer(0, 8001, [4, 9, 2])  # identity plan: every buffer by position
        st, kvbad, dirty = run(h, d, 8001, "0", [4, 9, 2])
        assert st[0].split(" ")[1] == "4" and kvbad == 0 and dirty > 0, st
        assert d.status()[:3] == (8001, SUCCESS, 0)
        # The explicit plan a TokenSpeed decode sends, draft kinds included.
        frags = plan_fragments(d.item, d.item, 32, 1, False, len(d.kv), draft=1, identity=False)
        assert [f["buffer_kind"] for f in frags[0]][-2:] == ["draft_k", "draft_v"]
        d.transfer(0, 8002, [30, 31], plan=frags[0])
        st, kvbad, _ = run(h, d, 8002, "0", [30, 31])
        assert kvbad == 0, st
        assert d.status()[:3] == (8002, SUCCESS, 0)
        quiet(d)
    finally:
        d.close()
        h.close()


def test_tp2_to_tp1_draft_plan():
    h, d = start(2, 2)
    try:
        info = d.parallel_info()
        frags = plan_fragments(
            info["kv_item_lens"][0], d.item, info["kv_unit_lens"][0], 2, False, len(d.kv), draft=2
        )
        kinds = [f["buffer_kind"] for f in frags[0]]
        assert kinds.count("draft_k") == 2 and kinds.count("draft_v") == 2, kinds
        planned_room(h, d, 8101, [7, 1, 40, 41], frags)
    finally:
        d.close()
        h.close()


def test_mla_tp2_to_tp1_draft():
    h, d = start(2, 1, mla=True)
    try:
        info = d.parallel_info()
        frags = plan_fragments(
            info["kv_item_lens"][0], d.item, info["kv_unit_lens"][0], 2, True, len(d.kv), draft=1
        )
        assert [f["buffer_kind"] for f in frags[0]] == ["target_k", "target_k", "draft_k"]
        planned_room(h, d, 8201, [11, 12], {0: frags[0]})  # replicated: rank 0 only
    finally:
        d.close()
        h.close()


def test_kinds_against_the_layout_and_missing_draft_buffers():
    h, d = start(2, 1)
    try:
        info = d.parallel_info()
        item_p, n = info["kv_item_lens"][0], len(d.kv)
        good = plan_fragments(item_p, d.item, 32, 2, False, n, draft=1)[0]
        d.register(0)
        # The "index < half" reading: buffer 2 (target V of layer 0) as a K.
        halves = [dict(f, buffer_kind="target_k" if f["buffer_index"] < n // 2 else "target_v")
                  for f in good]
        d.transfer(0, 8301, [20], plan=halves)
        expect_failed(h, d, 8301, [20], "buffer 2 is a target_v buffer here (2 target + 1 draft "
                      "layers), the plan says target_k")
        # A draft buffer labelled as the target's.
        wrong = [dict(f, buffer_kind="target_v") if f["buffer_kind"] == "draft_v" else f
                 for f in good]
        d.transfer(0, 8302, [21], plan=wrong)
        expect_failed(h, d, 8302, [21], "buffer 5 is a draft_v buffer here")
        # A decode without the draft model's buffers (a non-speculative pool).
        d.register(0, kv=d.kv[:2 * LAYERS])
        d.transfer(0, 8303, [22], plan=good)
        expect_failed(h, d, 8303, [22], "registered 4 KV buffers, this prefill has 6 (2 target + 1 "
                      "draft layers")
        # The rank keeps serving a decode with the right layout.
        planned_room(h, d, 8304, [23], plan_fragments(item_p, d.item, 32, 2, False, n, draft=1))
    finally:
        d.close()
        h.close()
