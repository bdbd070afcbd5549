"""A kvbridge decode (Python bindings, integrity="check",
sglang_kv_checksum_aux=1) against a Python prefill rank speaking SGLang's
2026 dialect with SGLang 0.5.23's --disaggregation-enable-kv-checksum, the
checksum written from SGLang's definition (docs/integrity.md, "With SGLang's
own checksum"): zlib's Adler-32 of every KV buffer's items, buffer by
buffer, in the request's page order past the decode's prefix; the row
(digest, layout signature, six zero words) sent as AUX_DATA into the
decode's second aux buffer before the Success status.

The peer shares the decode's process, so "its writes" are copies into the
decode's pages before its status (what an engine write does before SGLang
sends the status). SGLang's real code against kvbridge, both ways:
tests/interop (make check-interop, the ck_ cases).
"""

import struct
import time
import zlib

import numpy as np
import pytest
import requests
import zmq

import kvbridge
from kvbridge import KVPoll

PAGE, ITEM, PAGES, N_KV, SLOTS = 16, 256, 16, 4, 8
SIG = 0x21D7BF9CB78DF17B  # any non-zero layout signature: kvbridge reports it, compares the digest


def src_pages(n):
    return [np.random.default_rng(100 + b).integers(0, 256, n * ITEM, dtype=np.uint8)
            for b in range(N_KV)]


class Peer:
    """One SGLang 2026 prefill rank: registered at the bootstrap server
    without the "kvbridge" key (so no kvbridge digest, no writer grant)."""

    def __init__(self, ctx, boot, tp_rank=0, tp_size=1):
        self.pull = ctx.socket(zmq.PULL)
        self.pull.setsockopt(zmq.LINGER, 0)
        self.port = self.pull.bind_to_random_port("tcp://127.0.0.1")
        self.push = None
        body = {"role": "Prefill", "attn_tp_size": tp_size, "attn_tp_rank": tp_rank,
                "attn_cp_size": 1, "attn_cp_rank": 0, "attn_dp_size": 1, "attn_dp_rank": 0,
                "pp_size": 1, "pp_rank": 0, "system_dp_size": 1, "system_dp_rank": 0,
                "rank_ip": "127.0.0.1", "rank_port": self.port, "page_size": PAGE,
                "kv_cache_dtype": None, "load_balance_method": "follow_bootstrap_room",
                "enable_dsa_cache_layer_split": False, "prefill_http_port": None}
        r = requests.put(f"http://{boot}/route", json=body, timeout=5)
        assert r.status_code == 200, r.text
        self.ctx = ctx

    def transfer_info(self, room):
        """Skip the KV args; the 10-frame transfer info of room: (pages, aux slot)."""
        end = time.monotonic() + 10
        while time.monotonic() < end:
            assert self.pull.poll(int((end - time.monotonic()) * 1000) + 1), "no transfer info"
            f = self.pull.recv_multipart()
            if f[0] == str(room).encode():
                n = len(f[4]) // 4
                return list(struct.unpack(f"={n}i", f[4])), int(f[5])
        raise AssertionError("no transfer info")

    def send(self, dec_mgr, room, slot, row=None, rank=0):
        """AUX_DATA of the checksum row (when given), then Success."""
        if self.push is None or self.push_to != dec_mgr.endpoint:
            self.push = self.ctx.socket(zmq.PUSH)
            self.push.setsockopt(zmq.LINGER, 0)
            self.push.connect("tcp://" + dec_mgr.endpoint)
            self.push_to = dec_mgr.endpoint
        if row is not None:
            self.push.send_multipart([b"AUX_DATA", str(room).encode(), b"1", str(slot).encode(),
                                      struct.pack(">I", len(row)), row])
        self.push.send_multipart([str(room).encode(), b"4", str(rank).encode()])


def sgl_row(src, pages_in_src):
    """SGLang's row over the prefill's source items (independent of kvbridge)."""
    a = 1
    for b in range(N_KV):
        for p in pages_in_src:
            a = zlib.adler32(src[b][p * ITEM:(p + 1) * ITEM].tobytes(), a)
    return struct.pack("<8Q", a, SIG, 0, 0, 0, 0, 0, 0)


@pytest.fixture
def env():
    ctx = zmq.Context()
    srv = kvbridge.KVBootstrapServer("127.0.0.1", 0)
    made = []

    def decode(**kw):
        kv = [np.zeros(PAGES * ITEM, np.uint8) for _ in range(N_KV)]
        aux = [np.zeros(SLOTS * 64, np.uint8), np.zeros(SLOTS * 64, np.uint8)]
        args = kvbridge.KVArgs(kv_data_ptrs=[a.ctypes.data for a in kv],
                               kv_data_lens=[a.nbytes for a in kv], kv_item_lens=[ITEM] * N_KV,
                               aux_data_ptrs=[a.ctypes.data for a in aux],
                               aux_data_lens=[a.nbytes for a in aux], aux_item_lens=[64, 64],
                               page_size=PAGE, kv_head_num=2, engine_rank=0)
        m = kvbridge.KVManager(args, "decode", host="127.0.0.1", **kw)
        made.append(m)
        return m, kv, aux

    yield ctx, srv.address, decode
    for m in made:
        m.close()
    srv.close()
    ctx.destroy(linger=0)


def wait(recv):
    end = time.monotonic() + 10
    while recv.poll() not in (KVPoll.Success, KVPoll.Failed) and time.monotonic() < end:
        time.sleep(0.01)
    return recv.poll()


def run_room(peers, boot, mgr, kv, room, dst, prefix_pages=0, flip=None, row=True):
    """One room: dst pages (the first prefix_pages held already); the peer
    writes its source pages 0.. into the suffix, flip=(buffer, byte) changes
    one byte of what lands after the digest. peers: the prefill instance's
    ranks (the decode keeps its route to them)."""
    src = src_pages(len(dst))
    recv = kvbridge.KVReceiver(mgr, boot, room)
    recv.init(np.array(dst, np.int32), 3, prefix_tokens=prefix_pages * PAGE)
    pages, slot = peers[0].transfer_info(room)
    assert pages == dst[prefix_pages:] and slot == 3
    for p in peers[1:]:
        p.transfer_info(room)
    suffix = list(range(prefix_pages, len(dst)))
    for b in range(N_KV):
        for i, p in zip(suffix, pages):
            kv[b][p * ITEM:(p + 1) * ITEM] = src[b][i * ITEM:(i + 1) * ITEM]
    if flip is not None:
        b, off = flip
        kv[b][pages[0] * ITEM + off] ^= 0x01
    for r, p in enumerate(peers):
        p.send(mgr, room, slot, sgl_row(src, suffix) if row and r == 0 else None, rank=r)
    return wait(recv), recv


def counters(mgr):
    t = mgr.traffic()
    return t["integrity_checked"], t["integrity_mismatches"], t["integrity_unchecked"]


def test_digest_matches_and_flipped_byte_fails_the_room(env):
    ctx, boot, decode = env
    peers = [Peer(ctx, boot)]
    mgr, kv, aux = decode(integrity="check", sglang_kv_checksum_aux=1)
    st, recv = run_room(peers, boot, mgr, kv, 9001, [5, 1, 12, 7])
    assert st == KVPoll.Success, recv.failure_reason()
    assert counters(mgr) == (1, 0, 0)
    assert bytes(aux[1][3 * 64:4 * 64])[:16] == sgl_row(src_pages(4), range(4))[:16]

    st, recv = run_room(peers, boot, mgr, kv, 9002, [2, 3, 9], flip=(2, 77))
    assert st == KVPoll.Failed
    reason = recv.failure_reason()
    assert reason.startswith("SGLang KV checksum mismatch: the prefill's Adler-32 0x"), reason
    assert f"layout signature {SIG:#x}, aux buffer 1 slot 3" in reason, reason
    assert "over this decode's 3 pages of 4 KV buffers" in reason, reason
    assert counters(mgr) == (2, 1, 0)


def test_prefix_pages_are_outside_the_digest(env):
    # SGLang digests [decode prefix, end): the pages the prefill sent.
    ctx, boot, decode = env
    peers = [Peer(ctx, boot)]
    mgr, kv, _ = decode(integrity="check", sglang_kv_checksum_aux=1)
    for p in (4, 6):  # the prefix pages hold the decode's own bytes
        for b in range(N_KV):
            kv[b][p * ITEM:(p + 1) * ITEM] = 0xAB
    st, recv = run_room(peers, boot, mgr, kv, 9003, [4, 6, 8, 10], prefix_pages=2)
    assert st == KVPoll.Success, recv.failure_reason()
    assert counters(mgr) == (1, 0, 0)


def test_nothing_to_check_is_counted_unchecked(env):
    ctx, boot, decode = env
    peers = [Peer(ctx, boot)]
    # The prefill's checksum is off (its row stays zero): Success, unchecked.
    mgr, kv, _ = decode(integrity="check", sglang_kv_checksum_aux=1)
    st, _ = run_room(peers, boot, mgr, kv, 9004, [1, 2], row=False)
    assert st == KVPoll.Success
    assert counters(mgr) == (0, 0, 1)
    # Not asked for (no sglang_kv_checksum_aux): a flipped byte lands unseen.
    mgr2, kv2, _ = decode(integrity="check")
    st, _ = run_room(peers, boot, mgr2, kv2, 9005, [1, 2], flip=(0, 5))
    assert st == KVPoll.Success
    assert counters(mgr2) == (0, 0, 1)


def test_two_prefill_ranks_are_not_compared(env):
    # TP2 prefill -> TP1 decode: each rank digests its own head slices, so one
    # row cannot describe the decode's pages (SGLang skips by its layout
    # signature): unchecked, even with a wrong byte.
    ctx, boot, decode = env
    peers = [Peer(ctx, boot, r, 2) for r in range(2)]
    mgr, kv, _ = decode(integrity="check", sglang_kv_checksum_aux=1)
    st, _ = run_room(peers, boot, mgr, kv, 9006, [3, 4], flip=(1, 9))
    assert st == KVPoll.Success
    assert counters(mgr) == (0, 0, 1)


def test_parameter_and_helper(env):
    ctx, boot, decode = env
    for bad in (2, 7):
        with pytest.raises(kvbridge.KVBridgeError, match=f"sglang_kv_checksum_aux {bad}: this "
                                                         "manager registered 2 aux buffer"):
            decode(sglang_kv_checksum_aux=bad)
    with pytest.raises(kvbridge.InvalidArgument):
        decode(sglang_kv_checksum_aux=-2)
    mgr, kv, _ = decode()
    src = src_pages(PAGES)
    for b in range(N_KV):
        kv[b][:] = src[b]
    want = struct.unpack("<Q", sgl_row(src, [9, 0, 15])[:8])[0]
    assert mgr.sglang_kv_checksum([9, 0, 15]) == want
    assert mgr.sglang_kv_checksum([]) == 1  # Adler-32 of nothing, as SGLang's kernel answers
    with pytest.raises(kvbridge.KVBridgeError, match="page index 16 .* outside the KV pool of 16"):
        mgr.sglang_kv_checksum([3, 16])
