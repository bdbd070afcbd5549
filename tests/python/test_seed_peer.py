"""A Python peer speaking seed 001's dialect exactly, as a DECODE rank,
against a kvbridge C prefill rank.

The frames are built the way seed 001's Python builds them
(str(x).encode("ascii"), struct.pack("Q", ptr) per pointer, int32 page
indices packed natively), the bootstrap server is queried as the seed does
(parallel info, then the rank address), and the C prefill's replies (status
and inline AUX_DATA) are checked frame by frame on our own PULL socket.

The C side is tests/integration/conn_fault/seed_prefill_helper (path in
KVBRIDGE_SEED_HELPER): a bootstrap server, one prefill rank with a known byte
pattern, and decode-side registered memory whose session id and pointers this
peer presents as its own (Python owns no registered memory); the helper
reports what landed there.
"""

import os
import socket
import struct
import subprocess
import time

import pytest
import requests
import zmq

HELPER = os.environ.get("KVBRIDGE_SEED_HELPER")

pytestmark = pytest.mark.skipif(
    not HELPER or not os.path.exists(HELPER), reason="KVBRIDGE_SEED_HELPER not set"
)


class Helper:
    def __init__(self):
        self.proc = subprocess.Popen(
            [HELPER],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        self.info = {}
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            assert line, "helper exited early"
            line = line.strip()
            if line == "ready":
                break
            key, _, value = line.partition(" ")
            self.info[key] = value
        else:
            raise AssertionError("helper never ready")

    def send(self, room, src_aux, dst_aux, dst_pages):
        pages = " ".join(str(p) for p in dst_pages)
        self.proc.stdin.write(f"send {room} {src_aux} {dst_aux} {len(dst_pages)} {pages}\n")
        self.proc.stdin.flush()

    def report(self, room):
        out = {}
        for _ in range(4):
            line = self.proc.stdout.readline().strip()
            key, r, rest = (line.split(" ", 2) + [""])[:3]
            assert int(r) == room, line
            out[key] = rest
        return out

    def close(self):
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def helper():
    h = Helper()
    yield h
    h.close()


def recv_frames(pull, timeout_s=10.0):
    if not pull.poll(int(timeout_s * 1000)):
        raise AssertionError("no message from the prefill")
    return pull.recv_multipart()


def test_seed001_decode_peer(helper):
    boot = helper.info["boot"]
    session_id = helper.info["session"]
    kv_ptrs = [int(x) for x in helper.info["kv"].split(",")]
    aux_ptr = int(helper.info["aux"])
    unreg_aux_ptr = int(helper.info["unreg_aux"])
    item_len = int(helper.info["item_len"])

    # Seed 001 _get_prefill_parallel_info_from_server / _get_bootstrap_info_from_server.
    http = requests.Session()
    r = http.get(f"http://{boot}/route?engine_rank=-1&target_dp_group=-1&target_pp_rank=-1")
    assert r.status_code == 200
    info = r.json()
    assert info["prefill_attn_tp_size"] == 1
    assert info["prefill_dp_size"] == 1
    assert info["prefill_pp_size"] == 1
    r = http.get(f"http://{boot}/route?engine_rank=0&target_dp_group=0&target_pp_rank=0")
    assert r.status_code == 200
    rank = r.json()
    rank_ip, rank_port = rank["rank_ip"], int(rank["rank_port"])
    assert http.get(f"http://{boot}/health").status_code == 200

    ctx = zmq.Context()
    pull = ctx.socket(zmq.PULL)
    pull.setsockopt(zmq.LINGER, 0)
    local_ip = "127.0.0.1"
    rank_port_local = pull.bind_to_random_port(f"tcp://{local_ip}")
    push = ctx.socket(zmq.PUSH)
    push.setsockopt(zmq.LINGER, 0)
    push.connect(f"tcp://{rank_ip}:{rank_port}")

    def register(aux):
        # Seed 001 KVReceiver._register_kv_args.
        packed_kv_data_ptrs = b"".join(struct.pack("Q", ptr) for ptr in kv_ptrs)
        packed_aux_data_ptrs = b"".join(struct.pack("Q", ptr) for ptr in [aux])
        dst_tp_rank = str(0).encode("ascii")
        dst_attn_tp_size = str(1).encode("ascii")
        dst_kv_item_len = str(item_len).encode("ascii")
        push.send_multipart(
            [
                "None".encode("ascii"),
                local_ip.encode("ascii"),
                str(rank_port_local).encode("ascii"),
                session_id.encode("ascii"),
                packed_kv_data_ptrs,
                packed_aux_data_ptrs,
                dst_tp_rank,
                dst_attn_tp_size,
                dst_kv_item_len,
            ]
        )

    def transfer_info(room, pages, aux_index, dummy=False):
        # Seed 001 KVReceiver.init: kv_indices is an int32 numpy array -> tobytes().
        kv_bytes = struct.pack(f"={len(pages)}i", *pages)
        push.send_multipart(
            [
                str(room).encode("ascii"),
                local_ip.encode("ascii"),
                str(rank_port_local).encode("ascii"),
                session_id.encode("ascii"),
                kv_bytes if not dummy else b"",
                str(aux_index).encode("ascii") if not dummy else b"",
                str(1).encode("ascii"),
            ]
        )

    def check_status(frames, room):
        # Seed 001 decode: bootstrap_room, status, prefill_rank = msg; int() each.
        assert len(frames) == 3, frames
        assert frames[0] == str(room).encode("ascii")
        assert frames[1] == b"4"  # KVPoll.Success
        assert frames[2] == b"0"  # attn_tp_rank * pp_size + pp_rank
        assert all(f.decode("ascii").isdigit() for f in frames)

    try:
        # 1. Registered aux memory: KV and aux through the data plane.
        register(aux_ptr)
        room, pages, dst_aux = 4242, [200, 3, 17, 90, 91, 92, 5], 7
        transfer_info(room, pages, dst_aux)
        helper.send(room, 2, dst_aux, pages)
        check_status(recv_frames(pull), room)
        rep = helper.report(room)
        assert rep["status"].split(" ")[0] == "4", rep
        assert rep["kvbad"] == "0", rep
        assert rep["auxbad"] == "0", rep
        assert not pull.poll(200), "unexpected extra message"

        # 2. Aux memory the data plane cannot reach: seed-001 inline AUX_DATA,
        #    then the status, on the same channel.
        register(unreg_aux_ptr)
        room, pages, dst_aux = 4243, [30, 31, 40, 41, 50], 11
        transfer_info(room, pages, dst_aux)
        helper.send(room, 4, dst_aux, pages)
        frames = recv_frames(pull)
        rep = helper.report(room)
        expected_aux = bytes.fromhex(rep["auxhex"])
        assert len(frames) == 6, frames
        assert frames[0] == b"AUX_DATA"
        assert frames[1] == str(room).encode("ascii")
        assert frames[2] == b"0"  # aux buffer index
        assert frames[3] == str(dst_aux).encode("ascii")
        (length,) = struct.unpack(">I", frames[4])
        assert length == len(frames[5]) == len(expected_aux)
        assert frames[5] == expected_aux
        check_status(recv_frames(pull), room)
        assert rep["status"].split(" ")[0] == "4", rep
        assert rep["kvbad"] == "0", rep

        # 3. A dummy rank (frames 4 and 5 empty): the prefill completes the room
        #    without writing anything.
        register(aux_ptr)
        room = 4244
        transfer_info(room, [], 0, dummy=True)
        helper.send(room, 1, 0, [60, 61])
        rep = helper.report(room)
        assert rep["status"].split(" ")[0] == "4", rep
        assert rep["kvbad"] != "0"  # nothing was written to the pages
    finally:
        push.close()
        pull.close()
        ctx.term()
