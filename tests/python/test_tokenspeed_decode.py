"""kvbridge's C decode (sglang26_helper decode) facing a TokenSpeed prefill
written here from PROTOCOL-TOKENSPEED.md (not TokenSpeed's code): a
TokenSpeed-shaped bootstrap server (spec 3), a prefill rank that registers
with TokenSpeed's PUT, checks every frame kvbridge's decode sends it (8-frame
KV-args, 12-frame transfer infos with int64 pages past the prefix, nothing
else, no abort), writes the KV bytes through the Mooncake drop-in engine as
TokenSpeed's prefill does, and answers 5-frame statuses. The decode learns
the dialect from the server's answer (no setting). Loads libkvbridge into
this interpreter (the drop-in): label nosan."""

import json
import os
import struct
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

import numpy as np
import pytest
import zmq

from sglang26_peer import HELPER, Helper, dec, u64s
from tokenspeed_peer import i64s, pat

HERE = os.path.dirname(os.path.abspath(__file__))
COMPAT = os.path.join(os.path.dirname(os.path.dirname(HERE)), "python", "compat")
if COMPAT not in sys.path:
    sys.path.insert(0, COMPAT)

pytestmark = pytest.mark.skipif(
    not HELPER or not os.path.exists(HELPER) or not os.environ.get("KVBRIDGE_LIB"),
    reason="KVBRIDGE_SGLANG26_HELPER / KVBRIDGE_LIB not set",
)

IP = "127.0.0.1"


class TSBootstrap(ThreadingHTTPServer):
    """Spec 3: PUT/GET /route and /health as TokenSpeed's server answers."""

    daemon_threads = True

    def __init__(self):
        super().__init__((IP, 0), TSHandler)
        self.table, self.world, self.dp, self.lens = {}, None, None, {}
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def addr(self):
        return f"{IP}:{self.server_address[1]}"


class TSHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as aiohttp

    def log_message(self, *a):
        pass

    def reply(self, code, body, ctype="text/plain"):
        data = body.encode()
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_PUT(self):
        s = self.server
        d = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        s.world = s.world or d["world_size"]
        s.dp = s.dp or d["dp_size"]
        tp_per_dp = d["world_size"] // d["dp_size"]
        rank = int(d["engine_rank"])
        if d["role"] == "Prefill":
            s.table[(rank // tp_per_dp, rank % tp_per_dp)] = {
                "rank_ip": d["rank_ip"],
                "rank_port": int(d["rank_port"]),
            }
        s.lens = {k: d[k] for k in ("kv_item_lens", "kv_unit_lens") if k in d}
        s.l15 = bool(d["enable_mla_l1_5_cache"])
        self.reply(200, "OK")

    def do_GET(self):
        u = urlparse(self.path)
        if u.path == "/health":
            return self.reply(200, "OK")
        q = {k: v[0] for k, v in parse_qs(u.query).items()}
        if not q.get("engine_rank") or not q.get("target_dp_group"):
            return self.reply(400, "Missing inputs for bootstrap server.")
        s = self.server
        if q["engine_rank"] == "-1" and q["target_dp_group"] == "-1":
            info = {
                "prefill_tp_size": s.world,
                "prefill_dp_size": s.dp,
                "enable_mla_l1_5_cache": s.l15,
            }
            info.update(s.lens)
            return self.reply(200, json.dumps(info), "application/json")
        entry = s.table.get((int(q["target_dp_group"]), int(q["engine_rank"])))
        if entry is None:
            return self.reply(500, "KeyError")
        self.reply(200, json.dumps(entry), "application/json")


class Prefill:
    """One TokenSpeed prefill rank: PULL socket, its PUT, a drop-in engine."""

    def __init__(self, ctx, boot, rank, world=1, item=256, n_kv=4, pages=32):
        from mooncake.engine import TransferEngine

        self.pull = ctx.socket(zmq.PULL)
        self.pull.setsockopt(zmq.LINGER, 0)
        self.port = self.pull.bind_to_random_port(f"tcp://{IP}")
        self.push = {}
        self.ctx = ctx
        self.item, self.n_kv = item, n_kv
        self.eng = TransferEngine()
        assert self.eng.initialize(IP, "P2PHANDSHAKE", "rdma", "") == 0
        self.src = np.zeros(item * pages, np.uint8)
        assert self.eng.register_memory(self.src.ctypes.data, self.src.nbytes) == 0
        body = {  # spec 3.1 (PF:1068-1080)
            "role": "Prefill",
            "world_size": world,
            "dp_size": 1,
            "rank_ip": IP,
            "rank_port": self.port,
            "engine_rank": rank,
            "enable_mla_l1_5_cache": False,
            "kv_item_lens": [item] * n_kv,
            "kv_unit_lens": [32] * n_kv,
            "state_item_lens": [],
            "state_unit_lens": [],
        }
        import requests

        assert requests.put(f"http://{boot}/route", json=body, timeout=5).status_code == 200

    def recv(self, timeout_s=10.0):
        assert self.pull.poll(int(timeout_s * 1000)), "nothing from the decode"
        return self.pull.recv_multipart()

    def write(self, session, kv, room, dst_pages, first_page):
        """The missing pages' bytes, one block per buffer and page."""
        srcs, dsts, lens = [], [], []
        for b in range(self.n_kv):
            for j, p in enumerate(dst_pages):
                off = (b * len(dst_pages) + j) * self.item
                self.src[off : off + self.item] = [
                    pat(room, b, first_page + j, k) for k in range(self.item)
                ]
                srcs.append(self.src.ctypes.data + off)
                dsts.append(kv[b] + p * self.item)
                lens.append(self.item)
        assert self.eng.batch_transfer_sync_write(session, srcs, dsts, lens) == 0

    def write_plan(self, session, kv, room, dst_pages, first_page, frags, rank, tp, page=4, hb=32):
        """Spec 7.5, as TokenSpeed's prefill executes a plan: every fragment of
        a buffer, literally, once per page pair. This rank's items hold its
        heads' slice (token-major rows) of the TP 1 pattern."""
        hl = self.item // page // hb
        heads = hl * tp
        srcs, dsts, lens = [], [], []
        for j, p in enumerate(dst_pages):
            for b in range(self.n_kv):
                off = (b * len(dst_pages) + j) * self.item
                for t in range(page):
                    for h in range(hl):
                        for x in range(hb):
                            g = (t * heads + rank * hl + h) * hb + x
                            self.src[off + (t * hl + h) * hb + x] = pat(room, b, first_page + j, g)
                for f in frags:
                    if f["buffer_index"] == b:
                        srcs.append(self.src.ctypes.data + off + f["src_byte_offset"])
                        dsts.append(kv[b] + p * f["dst_page_stride_bytes"] + f["dst_byte_offset"])
                        lens.append(f["bytes_per_page"])
        assert self.eng.batch_transfer_sync_write(session, srcs, dsts, lens) == 0

    def status(self, host, port, frames):
        ep = f"tcp://{host}:{port}"
        if ep not in self.push:
            s = self.ctx.socket(zmq.PUSH)
            s.setsockopt(zmq.LINGER, 0)
            s.connect(ep)
            self.push[ep] = s
        self.push[ep].send_multipart(frames)


@pytest.fixture
def ts():
    ctx = zmq.Context()
    boot = TSBootstrap()
    made = []

    def start(world=1):
        pre = [Prefill(ctx, boot.addr, r, world, item=256 // world) for r in range(world)]
        h = Helper(None, argv=[HELPER, "decode", f"boot={boot.addr}"])
        made.append(h)
        return h, pre

    yield start
    for h in made:
        h.close()
    boot.shutdown()
    ctx.destroy(linger=0)


def test_kvbridge_decode_speaks_tokenspeed(ts):
    h, (p,) = ts()
    kv = [int(x) for x in h.info["kv"].split(",")]
    host, port = h.info["ctl"].rsplit(":", 1)
    sid = h.info["session"]
    page = 4
    # 1. No prefix: KV-args once, then the transfer info.
    room, pages = 8001, [30, 31, 32]
    h.cmd(f"recv {room} 5 0 {len(pages)} " + " ".join(map(str, pages)))
    assert h.line("recv", room) in ("1", "2")  # Bootstrapping / WaitingForInput
    assert p.recv() == [b"None", host.encode(), port.encode(), sid.encode(), u64s(kv), b"", b"", b"0"]
    assert p.recv() == [
        dec(room), host.encode(), port.encode(), sid.encode(), i64s(pages),
        b"5", b"1", b"0", b"0", b"", b"", b"",
    ]
    p.write(sid, kv, room, pages, 0)
    p.status(host, port, [dec(room), b"3", b"0", b"-1", b""])  # WaitingForInput: no effect
    p.status(host, port, [dec(room), b"5", b"0", b"77", struct.pack("2i", 1, 2)])
    h.cmd(f"poll {room} 10")
    assert h.line("poll", room).split(" ")[0] == "4"  # Success
    h.cmd(f"check {room} 0 " + " ".join(map(str, pages)))
    assert h.line("check", room) == "0"
    h.cmd(f"token {room}")  # the first token and candidates of its Success
    assert h.line("token", room) == "1 77 1,2"
    # 2. A prefix of 2 pages: only the missing pages go on the wire (int64).
    room, pages = 8002, [40, 41, 42, 43, 44]
    h.cmd(f"recv {room} 6 {2 * page} {len(pages)} " + " ".join(map(str, pages)))
    h.line("recv", room)
    f = p.recv()  # no second KV-args: once per prefill rank
    assert f[0] == dec(room) and f[4] == i64s(pages[2:]) and f[7] == dec(2 * page), f
    assert len(f) == 12
    p.write(sid, kv, room, pages[2:], 2)
    p.status(host, port, [dec(room), b"5", b"0", b"-1", b""])
    h.cmd(f"poll {room} 10")
    assert h.line("poll", room).split(" ")[0] == "4"
    h.cmd(f"check {room} 2 " + " ".join(map(str, pages[2:])))
    assert h.line("check", room) == "0"
    h.cmd(f"token {room}")
    assert h.line("token", room) == "0 -1"  # -1: no token known
    # 3. Failed from the prefill; an abort sends a TokenSpeed prefill nothing.
    room = 8003
    h.cmd(f"recv {room} 7 0 1 50")
    h.line("recv", room)
    assert len(p.recv()) == 12
    p.status(host, port, [dec(room), b"0", b"0", b"-1", b""])
    h.cmd(f"poll {room} 10")
    st, _, reason = (h.line("poll", room).split(" ", 2) + [""])[:3]
    assert st == "0" and "prefill" in reason, reason
    room = 8004
    h.cmd(f"recv {room} 8 0 1 51")
    h.line("recv", room)
    assert len(p.recv()) == 12
    h.cmd(f"abort {room}")
    assert h.proc.stdout.readline().strip() == f"aborted {room}"
    assert not p.pull.poll(500), "a message after the abort: TokenSpeed has none"


def test_tp2_prefill_gets_a_plan_of_token_rows(ts):
    """Another TP size: kvbridge's decode sends each source rank a plan
    (frames 12-13) that TokenSpeed's literal execution gets right: at page
    size 4, one fragment per token row and buffer (spec 7.6, second half)."""
    h, pre = ts(world=2)
    kv = [int(x) for x in h.info["kv"].split(",")]
    host, port = h.info["ctl"].rsplit(":", 1)
    sid = h.info["session"]
    room, pages = 8101, [60, 61, 62]
    h.cmd(f"recv {room} 3 0 {len(pages)} " + " ".join(map(str, pages)))
    h.line("recv", room)
    for k, p in enumerate(pre):
        assert p.recv()[0] == b"None"
        f = p.recv()
        assert len(f) == 14 and f[:12] == [
            dec(room), host.encode(), port.encode(), sid.encode(), i64s(pages),
            b"3", b"1", b"0", b"0", b"", b"", b"",
        ], f
        assert f[12] == b"1"
        frags = json.loads(f[13])
        want = [
            {
                "buffer_index": b,
                "buffer_kind": "target_k" if b < 2 else "target_v",
                "src_rank": k,
                "dst_rank": 0,
                "src_page_stride_bytes": 128,
                "dst_page_stride_bytes": 256,
                "src_byte_offset": t * 32,
                "dst_byte_offset": t * 64 + k * 32,
                "bytes_per_page": 32,
                "page_count": None,
            }
            for b in range(4)
            for t in range(4)
        ]
        key = lambda x: (x["buffer_index"], x["src_byte_offset"])  # noqa: E731
        assert sorted(frags, key=key) == want
        assert list(frags[0]) == list(want[0])  # TokenSpeed's key order
        p.write_plan(sid, kv, room, pages, 0, frags, k, 2)
        p.status(host, port, [dec(room), b"5", dec(k), b"9", b""])
    h.cmd(f"poll {room} 10")
    assert h.line("poll", room).split(" ")[0] == "4"
    h.cmd(f"check {room} 0 " + " ".join(map(str, pages)))
    assert h.line("check", room) == "0"


def test_tokenspeed_prefill_on_kvbridges_bootstrap_server():
    """A TokenSpeed prefill registered with kvbridge's server: the union
    answer's shape is seed 001's, so the server says which dialect those
    ranks speak ("kvbridge_peer_dialect"); kvbridge's decode speaks TokenSpeed
    to them (an 18-frame KV-args would kill their control thread)."""
    ctx = zmq.Context()
    h = Helper(None, argv=[HELPER, "decode"])  # its own (kvbridge) bootstrap server
    try:
        p = Prefill(ctx, h.info["boot"], 0)
        kv = [int(x) for x in h.info["kv"].split(",")]
        host, port = h.info["ctl"].rsplit(":", 1)
        sid = h.info["session"]
        room, pages = 8201, [70, 71]
        h.cmd(f"recv {room} 2 0 {len(pages)} " + " ".join(map(str, pages)))
        h.line("recv", room)
        f = p.recv()
        assert len(f) == 8 and f[0] == b"None" and f[5] == b"", f
        f = p.recv()
        assert len(f) == 12 and f[4] == i64s(pages), f
        p.write(sid, kv, room, pages, 0)
        p.status(host, port, [dec(room), b"5", b"0", b"11", b""])
        h.cmd(f"poll {room} 10")
        assert h.line("poll", room).split(" ")[0] == "4"
        h.cmd(f"check {room} 0 " + " ".join(map(str, pages)))
        assert h.line("check", room) == "0"
    finally:
        h.close()
        ctx.destroy(linger=0)
