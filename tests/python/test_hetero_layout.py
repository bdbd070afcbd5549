"""A kvbridge prefill and a kvbridge decode of different page sizes and page
orders (issue 35, section 1; docs/planner.md).

The decode tells the prefill its page size and order in its registration
("kv_layout=" after the kvbridge-ext/1 marker, KVArgs.page_size and
KVArgs.kv_layout); the prefill's planner pairs token rows, not pages. Every
token row of the request must arrive at its decode page and row, head by
head, in the decode's order; rows below the decode's prefix and every page
not the request's stay as they were. The connector's API gives pages, not a
token count: the rows of the prefill's last page past the request's tokens
are sent too where the decode's last page has room for them (as with equal
page sizes, whose last page is sent whole), and never past it."""
import os
import sys
import time

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "python"))

import kvbridge as kb  # noqa: E402
from kvb_testutil import poll_until  # noqa: E402

LAYERS, HEADS, HEAD_BYTES = 2, 2, 8
PREFILL_PAGE, PREFILL_POOL, DECODE_POOL = 4, 16, 24
TOKENS = 21  # 6 prefill pages, the last one part-filled
SRC_PAGES = [9, 2, 14, 5, 6, 11]


def value(buf, tok, head):
    """Bytes of (buffer, token, head): a pattern no other row shares."""
    b = np.arange(HEAD_BYTES, dtype=np.uint32)
    return ((buf * 7 + tok * 13 + head * 5 + b * 3 + 1) % 251).astype(np.uint8)


def pool(page, order, pages):
    shape = (pages, page, HEADS, HEAD_BYTES) if order == "nhd" else (pages, HEADS, page,
                                                                       HEAD_BYTES)
    return [np.zeros(shape, np.uint8) for _ in range(2 * LAYERS)]


def row(buf, order, q, r, h):
    return buf[q, r, h] if order == "nhd" else buf[q, h, r]


def args(bufs, page, order):
    return kb.KVArgs(kv_data_ptrs=[b.ctypes.data for b in bufs],
                     kv_data_lens=[b.nbytes for b in bufs],
                     kv_item_lens=[page * HEADS * HEAD_BYTES] * len(bufs), page_size=page,
                     kv_layout=order, kv_head_num=HEADS, engine_rank=0)


def transfer(src, dst, dpage, dorder, dst_pages, prefix, dialect, integrity=None, counts=None):
    """One room from the prefill's SRC_PAGES (two chunks) into dst_pages;
    the receiver's final state and its failure reason ("" on success).
    integrity: both managers' KVManager(integrity=...); counts: a dict that
    gets the prefill's and the decode's integrity counters."""
    with kb.KVBootstrapServer("127.0.0.1", 0) as server:
        kw = {"sglang_dialect": dialect}
        if integrity is not None:
            kw["integrity"] = integrity
        pm = kb.KVManager(args(src, PREFILL_PAGE, "nhd"), "prefill", server.address, **kw)
        dm = kb.KVManager(args(dst, dpage, dorder), "decode", **kw)
        try:
            rc = kb.KVReceiver(dm, server.address, 35)
            s = kb.KVSender(pm, server.address, 35)
            rc.init(np.asarray(dst_pages, np.int32), prefix_tokens=prefix)
            if poll_until(s, 10, (kb.KVPoll.WaitingForInput, kb.KVPoll.Failed)) == \
                    kb.KVPoll.WaitingForInput:
                s.init(len(SRC_PAGES))
                s.send(np.asarray(SRC_PAGES[:4], np.int32))  # two chunks
                s.send(np.asarray(SRC_PAGES[4:], np.int32))
            st = poll_until(rc, 10)
            reason = ""
            for obj in (rc, s):  # the decode's reason, then the prefill's
                if obj.poll() == kb.KVPoll.Failed:
                    try:
                        obj.failure_exception()
                    except kb.KVTransferError as e:
                        reason += str(e) + "; "
            if counts is not None:
                # the prefill counts its digest once its status send returned,
                # which may be after the decode acted on it: a bounded wait
                poll_until(s, 10)
                deadline = time.monotonic() + 5
                while pm.traffic()["integrity_sent"] == 0 and time.monotonic() < deadline:
                    time.sleep(0.001)
                counts.update({k: v for k, v in pm.traffic().items() if k.startswith("integrity")})
                counts.update({"decode_" + k: v for k, v in dm.traffic().items()
                               if k.startswith("integrity")})
            return st, reason
        finally:
            pm.close()
            dm.close()


# (decode page size, decode order, decode prefix): the 2026 dialect lists
# the decode's pages after its prefix (a multiple of both page sizes)
LAYOUTS = [(8, "hnd", 0), (8, "hnd", 8), (3, "nhd", 0), (3, "nhd", 12), (2, "hnd", 4),
           (4, "hnd", 0), (16, "nhd", 0), (16, "hnd", 16)]


@pytest.mark.parametrize("dpage,dorder,prefix", LAYOUTS)
def test_rows_land_across_page_sizes_and_orders(dpage, dorder, prefix, integrity=None):
    dialect = 2026
    src = pool(PREFILL_PAGE, "nhd", PREFILL_POOL)
    for b in src:
        b[:] = 0xEE  # not the request's: must never arrive
    for k, b in enumerate(src):
        for i, q in enumerate(SRC_PAGES):
            for r in range(PREFILL_PAGE):
                for h in range(HEADS):
                    row(b, "nhd", q, r, h)[:] = value(k, i * PREFILL_PAGE + r, h)
    dst = pool(dpage, dorder, DECODE_POOL)
    n_dst = -(-TOKENS // dpage)
    dst_pages = list(range(DECODE_POOL - 1, DECODE_POOL - 1 - n_dst, -1))  # descending
    counts = {} if integrity else None
    st, reason = transfer(src, dst, dpage, dorder, dst_pages, prefix, dialect, integrity, counts)
    assert st == kb.KVPoll.Success, reason
    sent_end = min(len(SRC_PAGES) * PREFILL_PAGE, n_dst * dpage)
    for k, b in enumerate(dst):
        want = np.zeros_like(b)
        for t in range(prefix, sent_end):
            q, r = dst_pages[t // dpage], t % dpage
            for h in range(HEADS):
                row(want, dorder, q, r, h)[:] = value(k, t, h)
        bad = np.argwhere(b != want)
        assert bad.size == 0, f"buffer {k}: {len(bad)} wrong bytes, first at {bad[0].tolist()}"
    return counts


@pytest.mark.parametrize("dpage,dorder,prefix", LAYOUTS)
def test_integrity_checks_every_layout(dpage, dorder, prefix):
    """With integrity check on both sides (docs/integrity.md), a room whose
    decode pages are written in parts (another page size, HND order, a
    prefix, the last page part-filled) is checked, not counted unchecked:
    each page's share is one strided pattern (wire version 2 where a page
    is written in part), and the room ends Success with the same bytes."""
    c = test_rows_land_across_page_sizes_and_orders(dpage, dorder, prefix, integrity="check")
    assert c["integrity_sent"] == 1, c
    assert (c["decode_integrity_checked"], c["decode_integrity_mismatches"],
            c["decode_integrity_unchecked"]) == (1, 0, 0), c


def test_2026_prefix_off_the_prefill_page_refused():
    """2026 lists the decode's pages after its prefix: a prefix of 3 tokens
    (the decode's page) is no prefill page boundary (4): the room fails
    with the reason and nothing lands."""
    src, dst = pool(PREFILL_PAGE, "nhd", PREFILL_POOL), pool(3, "nhd", DECODE_POOL)
    for b in src:
        b[:] = 0xEE
    st, reason = transfer(src, dst, 3, "nhd", [5, 6, 7, 8, 9, 10], 3, 2026)
    assert st == kb.KVPoll.Failed
    assert "prefix of 3 tokens is not a multiple of the page size 4" in reason, reason
    assert not any(b.any() for b in dst)


def test_seed001_bootstrap_cannot_pair_page_sizes():
    """A seed-001 bootstrap answer does not say the prefill's page size: the
    decode cannot route to a prefill of another page size, and says so;
    nothing lands."""
    src, dst = pool(PREFILL_PAGE, "nhd", PREFILL_POOL), pool(8, "hnd", DECODE_POOL)
    st, reason = transfer(src, dst, 8, "hnd", [5, 6, 7], 0, 2025)
    assert st == kb.KVPoll.Failed
    assert "2026 dialect only" in reason, reason
    assert not any(b.any() for b in dst)


@pytest.mark.parametrize("version,dpage,dorder,want", [
    (1, 8, "nhd", "Page size mismatch"), (1, 4, "hnd", "Page order mismatch"),
    (0, 4, "hnd", "Page order mismatch")])
def test_prefill_that_cannot_map_layouts_refused(version, dpage, dorder, want):
    """A prefill whose bootstrap entry says "kvbridge": 1 (an older kvbridge,
    which ignores kv_layout=) or nothing (SGLang's) would write its own page
    size or NHD order into this decode's pages: the room fails naming the
    mismatch and who the prefill is, before anything is sent to it (the
    entry points at a port nobody listens on). Version 2 (today's prefill)
    is not refused for it."""
    from test_bootstrap_2026 import put_2026, register
    dst = pool(dpage, dorder, DECODE_POOL)
    with kb.KVBootstrapServer("127.0.0.1", 0) as server:
        body = dict(put_2026(0, 1, attn_tp_size=1), page_size=PREFILL_PAGE)
        if version:
            body["kvbridge"] = version
        register(server.address, body)
        dm = kb.KVManager(args(dst, dpage, dorder), "decode", sglang_dialect=2026)
        try:
            rc = kb.KVReceiver(dm, server.address, 36)
            assert poll_until(rc, 10) == kb.KVPoll.Failed
            with pytest.raises(kb.KVTransferError) as e:
                rc.failure_exception()
            assert want in str(e.value), str(e.value)
            who = "version 1, which ignores kv_layout=" if version else "not registered as kvbridge"
            assert who in str(e.value), str(e.value)
        finally:
            dm.close()
    assert not any(b.any() for b in dst)
    # version 2: the layouts are not what refuses it (the port is dead)
    with kb.KVBootstrapServer("127.0.0.1", 0) as server:
        register(server.address, dict(put_2026(0, 1, attn_tp_size=1), page_size=PREFILL_PAGE,
                                      kvbridge=2))
        dm = kb.KVManager(args(dst, dpage, dorder), "decode", sglang_dialect=2026)
        try:
            rc = kb.KVReceiver(dm, server.address, 37)
            st = poll_until(rc, 10, (kb.KVPoll.Failed, kb.KVPoll.WaitingForInput))
            if st == kb.KVPoll.Failed:
                with pytest.raises(kb.KVTransferError) as e:
                    rc.failure_exception()
                assert "mismatch" not in str(e.value), str(e.value)
        finally:
            dm.close()


def test_bad_kv_layout_refused():
    bufs = pool(4, "nhd", 4)
    with pytest.raises(kb.InvalidArgument, match="kv_layout"):
        kb.KVManager(args(bufs, 4, "hdn"), "decode")
