"""A TokenSpeed decode (seed 004, written from PROTOCOL-TOKENSPEED.md in
tokenspeed_peer.py) against kvbridge's C prefill (ts_helper): TP1->TP1,
TP2->TP1, MLA, prefix skip, the first token, bad plans and bad transfer
infos (a clear Failed, nothing written, the rank keeps serving), a killed
prefill; every KV byte checked by the helper, every frame checked here."""

import os
import time

import pytest
import requests

from test_bootstrap import start_server, stop_server
from tokenspeed_peer import (
    FAILED,
    HELPER,
    SUCCESS,
    Decode,
    Helper,
    frag,
    plan_fragments,
)

pytestmark = pytest.mark.skipif(
    not HELPER or not os.path.exists(HELPER), reason="KVBRIDGE_TS_HELPER not set"
)


def start(tp=1, mla=False):
    h = Helper(tp, mla)
    return h, Decode(h)


def run(h, d, room, ranks, pages, prefix_pages=0, n=None, mode="all", token=77):
    n = n if n is not None else len(pages) + prefix_pages
    h.cmd(f"send {room} {ranks} {n} {prefix_pages} {mode} {token} " + " ".join(map(str, pages)))
    st = [h.line("status", room) for _ in ranks]
    kvbad = int(h.line("kvbad", room))
    dirty = int(h.line("dirty", room))
    return st, kvbad, dirty


def quiet(d):
    if d.pull.poll(300):
        raise AssertionError(f"unexpected extra message to a TokenSpeed decode: {d.pull.recv_multipart()}")


def test_parallel_info_in_tokenspeed_shape():
    for tp, mla in ((1, False), (2, False), (2, True)):
        h, d = start(tp, mla)
        try:
            info = d.parallel_info()
            assert int(info["prefill_tp_size"]) == tp and int(info["prefill_dp_size"]) == 1
            assert info["enable_mla_l1_5_cache"] is False
            n_kv = len(d.kv)
            item = 128 if (mla or tp == 2) else 256
            assert info["kv_item_lens"] == [item] * n_kv  # one per decode buffer
            assert info["kv_unit_lens"] == [1 if mla else 32] * n_kv  # MLA unit 1; MHA a head
        finally:
            d.close()
            h.close()


def test_tp1_to_tp1_token_and_aux_fallback():
    h, d = start()
    try:
        d.register(0)
        room, pages = 7001, [200, 3, 17, 90]
        d.transfer(0, room, pages)
        st, kvbad, dirty = run(h, d, room, "0", pages)
        assert st[0].split(" ")[1] == "4", st  # kvbridge's own poll: Success
        assert kvbad == 0 and dirty > 0
        assert d.status() == (room, SUCCESS, 0, 77, [78, 79])
        assert d.waiting == [(room, 0)]  # WaitingForInput came first (arms its time-out)
        quiet(d)
        # No explicit token: the first int32 of the sender's aux item.
        room = 7002
        d.transfer(0, room, [40, 41])
        st, kvbad, _ = run(h, d, room, "0", [40, 41], token=-1)
        assert kvbad == 0, st
        assert d.status() == (room, SUCCESS, 0, 1000 + room % 1000, [])
        quiet(d)
    finally:
        d.close()
        h.close()


def test_prefix_skip_sends_only_missing_pages():
    h, d = start()
    try:
        d.register(0)
        for room, mode in ((7101, "all"), (7102, "suffix")):
            missing = [60 + room % 10, 70 + room % 10, 80 + room % 10]
            d.transfer(0, room, missing, prefix=2 * d.page)  # 2 pages held: tokens
            st, kvbad, _ = run(h, d, room, "0", missing, prefix_pages=2, mode=mode)
            assert kvbad == 0, st
            assert d.status()[:2] == (room, SUCCESS)
        quiet(d)
    finally:
        d.close()
        h.close()


def literal_vs_token_rows(item_p, item_d, page, head_bytes, ptp):
    """Spec 7.6, TokenSpeed's plan for MHA TP ptp->1 at page size > 1: where
    each decode byte comes from under the literal reading (whole fragments,
    once per page) and under kvbridge's per-token reading, against the truth
    of token-major pools. Returns (literal wrong bytes, per-token wrong)."""
    frags = plan_fragments(item_p, item_d, head_bytes, ptp, False, 1)
    heads_d = item_d // page // head_bytes
    hl = heads_d // ptp

    def truth(o):  # decode byte o: token t, head h, byte k -> (rank, local offset)
        t, rest = divmod(o, heads_d * head_bytes)
        h, k = divmod(rest, head_bytes)
        return h // hl, (t * hl + h % hl) * head_bytes + k

    lit, tok = {}, {}
    for rank, fl in frags.items():
        for f in fl:
            for i in range(f["bytes_per_page"]):
                lit[f["dst_byte_offset"] + i] = (rank, f["src_byte_offset"] + i)
            for t in range(page):
                per = f["bytes_per_page"] // page
                for i in range(per):
                    o = t * (f["dst_page_stride_bytes"] // page) + f["dst_byte_offset"] // page + i
                    tok[o] = (rank, t * (f["src_page_stride_bytes"] // page) + f["src_byte_offset"] // page + i)
    wrong_lit = sum(lit.get(o) != truth(o) for o in range(item_d))
    wrong_tok = sum(tok.get(o) != truth(o) for o in range(item_d))
    return wrong_lit, wrong_tok


def test_tp2_to_tp1_plan_executed_per_token():
    h, d = start(tp=2)
    try:
        info = d.parallel_info()
        item_p = info["kv_item_lens"][0]
        frags = plan_fragments(item_p, d.item, info["kv_unit_lens"][0], 2, False, len(d.kv))
        assert sorted(frags) == [0, 1]
        # Which reading is right (spec 7.6): TokenSpeed's literal one puts
        # whole-token blocks where head slices belong; per token is exact.
        wrong_lit, wrong_tok = literal_vs_token_rows(item_p, d.item, d.page, 32, 2)
        assert wrong_lit > 0 and wrong_tok == 0, (wrong_lit, wrong_tok)
        for r in (0, 1):
            d.register(r)
        room, pages = 7201, [5, 6, 7, 30]
        for r in (0, 1):
            d.transfer(r, room, pages, plan=frags[r])
        st, kvbad, _ = run(h, d, room, "01", pages)
        assert all(s.split(" ")[1] == "4" for s in st), st
        assert kvbad == 0  # every byte in its head slice: kvbridge's reading
        got = d.wait_room(room, responses=2)
        assert got[0] == SUCCESS and got[1] == [0, 1], got
        quiet(d)
        # With a prefix too (the plan applies to the missing pages only).
        room, missing = 7202, [100, 101]
        for r in (0, 1):
            d.transfer(r, room, missing, prefix=d.page, plan=frags[r])
        st, kvbad, _ = run(h, d, room, "01", missing, prefix_pages=1, mode="suffix")
        assert kvbad == 0, st
        assert d.wait_room(room, responses=2)[0] == SUCCESS
    finally:
        d.close()
        h.close()


def test_mla_tp1_and_tp2_to_tp1():
    h, d = start(tp=1, mla=True)
    try:
        d.register(0)
        d.transfer(0, 7301, [9, 8, 7])  # identity plan
        _, kvbad, _ = run(h, d, 7301, "0", [9, 8, 7])
        assert kvbad == 0
        assert d.status()[:3] == (7301, SUCCESS, 0)
    finally:
        d.close()
        h.close()
    h, d = start(tp=2, mla=True)
    try:
        info = d.parallel_info()
        frags = plan_fragments(
            info["kv_item_lens"][0], d.item, info["kv_unit_lens"][0], 2, True, len(d.kv)
        )
        assert list(frags) == [0]  # replicated: rank 0 only; rank 1 hears nothing
        d.register(0)
        d.transfer(0, 7302, [11, 12], plan=frags[0])
        _, kvbad, _ = run(h, d, 7302, "0", [11, 12])
        assert kvbad == 0
        assert d.status()[:3] == (7302, SUCCESS, 0)
        quiet(d)
    finally:
        d.close()
        h.close()


def expect_failed(h, d, room, pages, text, ranks="0"):
    """The decode hears exactly one 5-frame Failed; the sender fails with a
    reason naming the problem; nothing was written. (A refusal of the
    transfer info is sent at once, one found at the first chunk then.)"""
    st, _, dirty = run(h, d, room, ranks, pages)
    r, value, sender, token, cands = d.status()
    assert (r, value, token, cands) == (room, FAILED, -1, []), (r, value)
    if text != "past the region":  # refused before any status: no WaitingForInput
        assert all(r != room for r, _ in d.waiting), d.waiting
    assert st[0].split(" ")[1] == "0" and text in st[0], st
    assert dirty == 0, st
    quiet(d)


def test_bad_plans_fail_the_room_and_write_nothing():
    h, d = start(tp=2)
    try:
        info = d.parallel_info()
        item_p = info["kv_item_lens"][0]
        good = plan_fragments(item_p, d.item, 32, 2, False, len(d.kv))[0]
        d.register(0)
        cases = [
            ("past its page", [dict(good[0], dst_byte_offset=200)] + good[1:], "outside its"),
            ("src rank", [dict(f, src_rank=1) for f in good], "src_rank 1"),
            ("buffer", good + [dict(good[0], buffer_index=9)], "buffer 9"),
            ("kind", [dict(good[0], buffer_kind="target_v")] + good[1:], "is a target_k buffer"),
            ("stride", [dict(f, src_page_stride_bytes=256) for f in good], "src_page_stride"),
            ("float", [dict(good[0], bytes_per_page=128.0)] + good[1:], "JSON integer"),
            ("empty", [], "non-empty"),
            ("overlap", good + [dict(good[0], dst_byte_offset=64)], "overlapping"),
            ("rows", [dict(good[0], bytes_per_page=126)] + good[1:], "token rows"),
            ("page_count", [dict(f, page_count=1) for f in good], "page_count"),
        ]
        for i, (what, plan, text) in enumerate(cases):
            room = 7400 + i
            d.transfer(0, room, [20 + i], plan=plan)
            expect_failed(h, d, room, [20 + i], text)
        # Version 2 of the plan: refused by the codec, the room still fails.
        room = 7420
        raw = [b"%d" % room, b"127.0.0.1", b"%d" % d.port, d.session.encode()]
        raw += [(45).to_bytes(8, "little"), b"1", b"1", b"0", b"0", b"", b"", b"", b"2", b"[]"]
        d.transfer(0, room, [], raw=raw)
        expect_failed(h, d, room, [45], "plan version")
        # Page indices: negative, repeated, past the decode's registered buffer.
        d.transfer(0, 7421, [3, -1], plan=good)
        expect_failed(h, d, 7421, [3, 4], "negative")
        d.transfer(0, 7422, [3, 3], plan=good)
        expect_failed(h, d, 7422, [3, 5], "repeats")
        d.transfer(0, 7423, [3, 256], plan=good)  # the pool has 256 pages: 0..255
        expect_failed(h, d, 7423, [3, 6], "past the region")
        # L1.5 (frame 8 = 1) is not supported: a Failed, not silence.
        d.transfer(0, 7424, [3], plan=good, l15=1)
        expect_failed(h, d, 7424, [3], "L1.5")
        # The rank keeps serving: the same decode, a good room.
        d.register(1)
        frags = plan_fragments(item_p, d.item, 32, 2, False, len(d.kv))
        for r in (0, 1):
            d.transfer(r, 7430, [50, 51], plan=frags[r])
        _, kvbad, _ = run(h, d, 7430, "01", [50, 51])
        assert kvbad == 0
        assert d.wait_room(7430, responses=2)[0] == SUCCESS
    finally:
        d.close()
        h.close()


def test_unregistered_session_hears_failed():
    h, d = start()
    try:
        d.transfer(0, 7501, [1, 2])  # no KV-args first
        expect_failed(h, d, 7501, [1, 2], "never its KV args")
        d.register(0, aux=b"\x01" * 8)  # frame 5 must be empty: not ours, dropped
        d.transfer(0, 7502, [1, 2])
        expect_failed(h, d, 7502, [1, 2], "never its KV args")
    finally:
        d.close()
        h.close()


def test_prefill_killed_is_failed_with_a_reason():
    h, d = start()
    try:
        d.register(0)
        d.transfer(0, 7601, [1, 2, 3])
        h.kill()  # the prefill process and its bootstrap server
        value, reason, _, _ = d.wait_room(7601, responses=1, timeout_s=15)
        assert value == FAILED
        assert reason == f"Losing connection with prefill instance (bootstrap_addr: {d.boot})"
    finally:
        d.close()
        h.close()


def test_prefill_rank_killed_while_its_bootstrap_server_lives():
    """No heartbeat can see it: the WaitingForInput kvbridge sent arms the
    decode's own time-out (spec 6.3), so the room still ends Failed."""
    proc, addr = start_server()
    h = Helper(1, boot=addr)
    d = Decode(h)
    try:
        d.register(0)
        d.transfer(0, 7701, [1, 2, 3])
        deadline = time.monotonic() + 10
        while not d.waiting and time.monotonic() < deadline:
            assert d.next_status(0.1) is None  # nothing but the WaitingForInput
        assert d.waiting == [(7701, 0)]
        h.kill()
        value, reason, _, _ = d.wait_room(7701, responses=1, timeout_s=15, waiting_timeout=2)
        assert value == FAILED
        assert reason.startswith("Request 7701 timed out after ") and reason.endswith(
            "s in TransferPoll.WaitingForInput"
        ), reason
        assert requests.get(f"http://{addr}/health").text == "OK"  # the server lives on
    finally:
        d.close()
        h.close()
        stop_server(proc)
