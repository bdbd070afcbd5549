"""kvbridge's C decode with draft-model layers (sglang26_helper decode
draft=1: params draft_layers) facing a TokenSpeed prefill written from
PROTOCOL-TOKENSPEED.md (test_tokenspeed_decode.py's, through the Mooncake
drop-in): its KV-args list the draft K and V after the target's (spec 8.5)
and, with another TP size, the plan it sends labels them draft_k / draft_v
(spec 7.2) with the same token-row fragments as the target's. Every byte of
every buffer is checked. Loads libkvbridge (the drop-in): label nosan."""

import json

import zmq

from sglang26_peer import HELPER, Helper, dec, u64s
from test_tokenspeed_decode import TSBootstrap, Prefill, pytestmark  # noqa: F401
from tokenspeed_peer import buffer_kind, i64s

N_KV = 6  # KVBH_CHILD_GEOM: 2 target layers (K, V) + 1 draft layer (K, V)


def start(world):
    ctx, boot = zmq.Context(), TSBootstrap()
    pre = [Prefill(ctx, boot.addr, r, world, item=256 // world, n_kv=N_KV) for r in range(world)]
    h = Helper(None, argv=[HELPER, "decode", f"boot={boot.addr}", "draft=1"])
    return ctx, boot, pre, h


def stop(ctx, boot, h):
    h.close()
    boot.shutdown()
    ctx.destroy(linger=0)


def test_draft_buffers_tp1_and_tp2_prefill():
    for world in (1, 2):
        ctx, boot, pre, h = start(world)
        try:
            kv = [int(x) for x in h.info["kv"].split(",")]
            assert len(kv) == N_KV
            host, port = h.info["ctl"].rsplit(":", 1)
            sid = h.info["session"]
            room, pages = 8501 + world, [60, 61, 62]
            h.cmd(f"recv {room} 3 0 {len(pages)} " + " ".join(map(str, pages)))
            h.line("recv", room)
            for k, p in enumerate(pre):
                reg = p.recv()
                assert reg[0] == b"None" and reg[4] == u64s(kv), reg  # draft buffers appended
                f = p.recv()
                assert f[0] == dec(room) and f[4] == i64s(pages), f
                if world == 1:
                    assert len(f) == 12  # identity: no plan
                    p.write(sid, kv, room, pages, 0)
                else:
                    assert len(f) == 14 and f[12] == b"1", f
                    frags = json.loads(f[13])
                    kinds = {x["buffer_index"]: x["buffer_kind"] for x in frags}
                    assert kinds == {b: buffer_kind(b, N_KV, False, 1) for b in range(N_KV)}
                    assert kinds[4] == "draft_k" and kinds[5] == "draft_v"
                    for b in range(N_KV):  # one fragment per token row, as the target's
                        assert sum(x["buffer_index"] == b for x in frags) == 4, frags
                    p.write_plan(sid, kv, room, pages, 0, frags, k, 2)
                p.status(host, port, [dec(room), b"5", dec(k), b"9", b""])
            h.cmd(f"poll {room} 10")
            assert h.line("poll", room).split(" ")[0] == "4"
            h.cmd(f"check {room} 0 " + " ".join(map(str, pages)))
            assert h.line("check", room) == "0"  # all 6 buffers, draft included
        finally:
            stop(ctx, boot, h)
