"""A TokenSpeed-dialect DECODE rank written from PROTOCOL-TOKENSPEED.md
(sections 3, 4, 6.2 and 7; not from TokenSpeed's code), for the tests
against kvbridge's C prefill (tests/integration/tokenspeed/ts_helper.c).

It asks the bootstrap server as TokenSpeed does (no target_pp_rank), plans
the transfer itself (spec 7.2-7.4: rank intervals over the whole item, the
identity plan, the "replicated" rule for equal items), registers 8-frame
KV-args, sends 12- or 14-frame transfer infos with int64 page indices, and
checks every message it gets back: exactly 5 frames, status 5 or 0, the
sender's TP rank, the first token and the int32 candidates. Its only
liveness check is TokenSpeed's: GET /health on the bootstrap server.
"""

import json
import os
import struct
import time

import requests
import zmq

import sglang26_peer
from sglang26_peer import dec, u64s

HELPER = os.environ.get("KVBRIDGE_TS_HELPER")
LOCAL_IP = "127.0.0.1"
FAILED, BOOTSTRAPPED, WAITING, SUCCESS = 0, 2, 3, 5


def pat(room, buf, page, k):
    """kvbh_pat (tests/harness/kvb_cluster.c): byte k of request page `page`
    of KV buffer buf of room, as the C helpers fill and check them."""
    m64 = (1 << 64) - 1
    x = ((room * 0x9E3779B97F4A7C15) & m64) ^ (buf << 48) ^ (page << 24) ^ (k >> 3)
    x &= m64
    x ^= x >> 31
    x = (x * 0xBF58476D1CE4E5B9) & m64
    x ^= x >> 29
    return (x >> (8 * (k & 7))) & 0xFF


def i64s(values):
    return struct.pack(f"={len(values)}q", *values)


class Helper(sglang26_peer.Helper):
    """One ts_helper process (the 2026 helper's line protocol)."""

    def __init__(self, tp, mla=False, boot=None, draft=0):
        argv = [HELPER, "prefill", str(tp)] + (["mla"] if mla else [])
        argv += [f"draft={draft}"] if draft else []
        super().__init__(None, argv=argv + ([f"boot={boot}"] if boot else []))

    def kill(self):
        self.proc.kill()
        self.proc.wait()

    def close(self):
        """Must exit 0 (no sanitizer report, no leak) unless killed."""
        if self.proc.poll() is None:
            super().close()
        else:
            self.err.close()


def buffer_kind(b, n_kv, mla, draft=0):
    """Spec 7.2 / 8.5: K of the target layers, V of them, then the draft
    pool's K and V (MLA: target latents, then draft latents, all "_k")."""
    if mla:
        return "target_k" if b < n_kv - draft else "draft_k"
    target = n_kv // 2 - draft
    if b < 2 * target:
        return "target_k" if b < target else "target_v"
    return "draft_k" if b < 2 * target + draft else "draft_v"


def plan_fragments(item_p, item_d, unit, ptp, mla, n_kv, draft=0, identity=True):
    """Spec 7.2-7.3 for one decode rank (TP 1 here): per prefill rank, the
    fragments TokenSpeed's decode would send, or None for the identity plan
    (identity=False: the explicit fragments even then). Units cover the
    whole item (page_size x heads): TokenSpeed's reading."""
    n_p, n_d = item_p // unit, item_d // unit
    if n_p * ptp == n_d and ptp == 1 and identity:
        return None  # identity: no frames 12-13
    frags = {}
    for b in range(n_kv):
        kind = buffer_kind(b, n_kv, mla, draft)
        if n_p * ptp == n_d:  # kv_head axis, rank k holds [k*S/ptp, (k+1)*S/ptp)
            size = n_d // ptp
            for k in range(ptp):
                frags.setdefault(k, []).append(
                    frag(b, kind, k, item_p, item_d, 0, k * size * unit, size * unit)
                )
        elif item_p == item_d:  # replicated: one source, (0 * ptp) // 1 = 0
            frags.setdefault(0, []).append(frag(b, kind, 0, item_p, item_d, 0, 0, item_d))
        else:
            raise ValueError("unsupported heterogeneous TP buffer layout")
    return frags


def frag(b, kind, src, sstride, dstride, soff, doff, nbytes):
    return {
        "buffer_index": b,
        "buffer_kind": kind,
        "src_rank": src,
        "dst_rank": 0,
        "src_page_stride_bytes": sstride,
        "dst_page_stride_bytes": dstride,
        "src_byte_offset": soff,
        "dst_byte_offset": doff,
        "bytes_per_page": nbytes,
        "page_count": None,
    }


def encode_plan(frags):
    return json.dumps(frags, separators=(",", ":")).encode()


class Decode:
    """The decode rank: one PULL socket, PUSH sockets per prefill rank."""

    def __init__(self, helper):
        h = helper
        self.boot = h.info["boot"]
        self.session = h.info["session"]
        self.kv = [int(x) for x in h.info["kv"].split(",")]
        self.item = int(h.info["item_len"])
        self.page = int(h.info["page"])
        self.ctx = zmq.Context()
        self.pull = self.ctx.socket(zmq.PULL)
        self.pull.setsockopt(zmq.LINGER, 0)
        self.port = self.pull.bind_to_random_port(f"tcp://{LOCAL_IP}")
        self.push = {}
        self.http = requests.Session()
        self.waiting = []  # (room, sender) of each WaitingForInput (3), in order
        self.waiting_at = {}  # room -> when its first WaitingForInput came

    def close(self):
        for s in self.push.values():
            s.close()
        self.pull.close()
        self.ctx.term()

    def parallel_info(self):
        r = requests.get(f"http://{self.boot}/route?engine_rank=-1&target_dp_group=-1")
        assert r.status_code == 200, r.text
        return r.json()

    def rank(self, tp, dp=0):
        r = requests.get(
            f"http://{self.boot}/route?engine_rank={tp}&target_dp_group={dp}", timeout=5
        )
        assert r.status_code == 200, r.text
        return r.json()

    def sock(self, tp):
        if tp not in self.push:
            info = self.rank(tp)
            s = self.ctx.socket(zmq.PUSH)
            s.setsockopt(zmq.LINGER, 0)
            s.connect(f"tcp://{info['rank_ip']}:{int(info['rank_port'])}")
            self.push[tp] = s
        return self.push[tp]

    def register(self, tp, kv=None, aux=b""):
        """Spec 4.2: 8 frames."""
        self.sock(tp).send_multipart(
            [
                b"None",
                LOCAL_IP.encode(),
                dec(self.port),
                self.session.encode(),
                u64s(self.kv if kv is None else kv),
                aux,
                b"",
                b"0",
            ]
        )

    def transfer(self, tp, room, pages, prefix=0, required=1, plan=None, l15=0, raw=None):
        """Spec 4.3: 12 frames, 14 with a plan."""
        frames = [
            dec(room),
            LOCAL_IP.encode(),
            dec(self.port),
            self.session.encode(),
            i64s(pages),
            dec(room % 32),
            dec(required),
            dec(prefix),
            dec(l15),
            b"",
            b"",
            b"",
        ]
        if plan is not None:
            frames += [b"1", plan if isinstance(plan, bytes) else encode_plan(plan)]
        self.sock(tp).send_multipart(raw if raw is not None else frames)

    def status(self, timeout_s=10.0):
        """Spec 4.4: every message must be exactly 5 frames. A WaitingForInput
        (3: it arms TokenSpeed's time-out, spec 6.3) is recorded and skipped;
        the next must be the end, 5 or 0."""
        got = self.next_status(timeout_s)
        assert got is not None, "no status within %.1f s" % timeout_s
        return got

    def next_status(self, timeout_s):
        """The next terminal status within timeout_s, or None."""
        deadline = time.monotonic() + timeout_s
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not self.pull.poll(int(left * 1000) + 1):
                return None
            f = self.pull.recv_multipart()
            assert len(f) == 5, f"status of {len(f)} frames: {f}"
            room, value, sender, token = (int(x) for x in f[:4])
            assert len(f[4]) % 4 == 0
            cands = list(struct.unpack(f"={len(f[4]) // 4}i", f[4]))
            if value == WAITING:
                assert (token, cands) == (-1, []) and (room, sender) not in self.waiting, f
                self.waiting.append((room, sender))
                self.waiting_at.setdefault(room, time.monotonic())
                continue
            assert value in (SUCCESS, FAILED), f"status value {value} (TokenSpeed: 5 or 0)"
            return room, value, sender, token, cands

    def wait_room(self, room, responses, timeout_s=10.0, waiting_timeout=300.0):
        """Success once `responses` distinct senders said 5; Failed on a 0;
        a lost bootstrap server (GET /health, spec 6.2) fails it too, and so
        does waiting_timeout after a WaitingForInput (spec 6.3)."""
        senders, token, cands = set(), -1, []
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            got = self.next_status(0.2)
            if got is not None:
                r, value, sender, tok, c = got
                assert r == room, (r, room)
                if value == FAILED:
                    return FAILED, "Failed to get kvcache from prefill instance, it might be dead", -1, []
                senders.add(sender)
                if token == -1:
                    token, cands = tok, c
                if len(senders) >= responses:
                    return SUCCESS, sorted(senders), token, cands
                continue
            since = self.waiting_at.get(room)
            if since is not None and time.monotonic() - since >= waiting_timeout:
                elapsed = time.monotonic() - since
                return FAILED, f"Request {room} timed out after {elapsed:.1f}s in TransferPoll.WaitingForInput", -1, []
            try:
                ok = self.http.get(f"http://{self.boot}/health", timeout=(2, 3)).status_code == 200
            except requests.RequestException:
                ok = False
            if not ok:
                return FAILED, f"Losing connection with prefill instance (bootstrap_addr: {self.boot})", -1, []
        raise AssertionError("room %d: neither Success nor Failed in %.1f s" % (room, timeout_s))
