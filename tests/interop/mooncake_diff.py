"""Differential test: one call sequence (bad calls included) through
Mooncake's real `mooncake.engine` and through kvbridge's drop-in
(python/compat/mooncake); the values must agree, except the differences
listed in EXPECTED (each one a documented limit of the drop-in).

Not part of `make check` (needs PyPI): scripts/mooncake_diff.sh makes a venv
under build/, installs pinned releases and runs

    python mooncake_diff.py real real.json       # PYTHONPATH without python/compat
    python mooncake_diff.py dropin dropin.json   # PYTHONPATH=python/compat
    python mooncake_diff.py compare real.json dropin.json

`real` / `dropin` write one JSON object {step: value} to the file named
(not stdout: UCX logs its errors there); every step runs
between two processes of the same implementation (this file as `target`),
over the TCP protocol on 127.0.0.1, and the target's bytes are compared by
digest. Calls whose Mooncake behaviour is undefined (freed or unknown batch
ids: Mooncake dereferences them as pointers) are not made.
"""

import hashlib
import json
import subprocess
import sys
import threading
import time

import numpy as np

HOST = "127.0.0.1"
SIZES = [1 << 20, 256 << 10]

# step → why the drop-in differs (docs/python.md, "Mooncake drop-in").
EXPECTED = {
    "sync_write_unregistered_source":
        "kvbridge writes only from memory registered with the engine; Mooncake's TCP "
        "transport reads any local address",
    "read_ops": "kvbridge's engine only writes: NotImplementedError",
    "notify": "no notification channel: NotImplementedError",
    "get_first_buffer_address": "kvbridge does not expose a peer's registrations",
    "type_target_none": "Mooncake turns None into a null char* (std::logic_error → "
                        "RuntimeError); the drop-in raises TypeError",
}


def target(which):
    from mooncake.engine import TransferEngine
    e = TransferEngine()
    rc = e.initialize(HOST, "P2PHANDSHAKE", "tcp", "")
    bufs = [np.zeros(n, np.uint8) for n in SIZES]
    regs = [e.register_memory(bufs[0].ctypes.data, bufs[0].nbytes),
            e.batch_register_memory([bufs[1].ctypes.data], [bufs[1].nbytes])]
    print(json.dumps({"rc": rc, "port": e.get_rpc_port(), "regs": regs,
                      "addrs": [b.ctypes.data for b in bufs]}), flush=True)
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["op"] == "digest":
            rep = [hashlib.sha256(b.tobytes()).hexdigest() for b in bufs]
        elif cmd["op"] == "unregister":
            rep = e.unregister_memory(bufs[cmd["i"]].ctypes.data)
        else:
            break
        print(json.dumps(rep), flush=True)


class Child:
    def __init__(self, which):
        self.p = subprocess.Popen([sys.executable, __file__, "target", which],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.hello = self.read(60)
        self.sid = f"{HOST}:{self.hello['port']}"
        self.addrs = self.hello["addrs"]

    def read(self, timeout):
        box = []
        t = threading.Thread(target=lambda: box.append(self.p.stdout.readline()), daemon=True)
        t.start()
        t.join(timeout)
        if not box or not box[0]:
            raise RuntimeError("target said nothing")
        return json.loads(box[0])

    def call(self, op, **kw):
        self.p.stdin.write(json.dumps(dict(op=op, **kw)) + "\n")
        self.p.stdin.flush()
        return self.read(60)

    def kill(self):
        if self.p.poll() is None:
            self.p.kill()
        self.p.wait(10)


def attempt(f):
    try:
        return f()
    except NotImplementedError:
        return "NotImplementedError"
    except Exception as e:  # pybind11's TypeError and the like
        return type(e).__name__


def run(which, path):
    import mooncake.engine as me
    from mooncake.engine import TransferEngine, TransferOpcode
    out = {}
    out["module"] = "dropin" if getattr(__import__("mooncake"), "KVBRIDGE_DROP_IN", False) \
        else "real"
    out["opcodes"] = [int(TransferOpcode.Read), int(TransferOpcode.Write), int(me.Write)]
    t = Child(which)
    out["target_hello"] = [t.hello["rc"], t.hello["regs"],
                           15000 <= t.hello["port"] <= 17000]
    e = TransferEngine()
    out["initialize"] = e.initialize(HOST, "P2PHANDSHAKE", "tcp", "")
    out["rpc_port_in_range"] = 15000 <= e.get_rpc_port() <= 17000
    src = np.random.default_rng(5).integers(0, 256, 2 << 20, dtype=np.uint8)
    s0 = src.ctypes.data
    a0, a1 = t.addrs
    other = np.zeros(1 << 16, np.uint8)  # zeros: what reaches the target changes nothing
    o0 = other.ctypes.data
    out["register"] = e.register_memory(s0, src.nbytes)
    out["register_double"] = e.register_memory(s0, src.nbytes)
    out["register_overlap"] = e.register_memory(s0 + 4096, 4096)
    out["register_zero"] = e.register_memory(o0, 0)
    out["unregister_unknown"] = e.unregister_memory(o0)
    out["batch_register_overlap"] = e.batch_register_memory([o0, o0 + 100], [4096, 100])
    out["register_after_failed_batch"] = e.register_memory(o0, 4096)
    out["batch_unregister_partly_unknown"] = e.batch_unregister_memory([o0, o0 + 1])
    out["unregister_after_batch"] = e.unregister_memory(o0)
    out["sync_write"] = e.transfer_sync_write(t.sid, s0 + 3, a0 + 10, 5000)
    n = 2000
    out["batch_sync_write"] = e.batch_transfer_sync_write(
        t.sid, [s0 + 7 * i for i in range(n)], [a0 + 100_000 + 300 * i for i in range(n)],
        [200] * n)
    out["batch_sync_write_mismatch"] = e.batch_transfer_sync_write(t.sid, [s0, s0], [a0], [1, 1])
    out["batch_async_write_mismatch"] = e.batch_transfer_async_write(t.sid, [s0], [a0], [1, 1])
    out["sync_write_unknown_target"] = e.transfer_sync_write(f"{HOST}:1", s0, a0, 16)
    out["async_write_unknown_target"] = e.batch_transfer_async_write(f"{HOST}:1", [s0], [a0],
                                                                     [16])
    out["sync_write_outside_target"] = e.transfer_sync_write(t.sid, s0, a0 + SIZES[0] - 10, 11)
    out["sync_write_unregistered_source"] = e.transfer_sync_write(t.sid, o0, a1 + 60_000, 16)
    ids = [e.batch_transfer_async_write(t.sid, [s0 + 1_000_000 + k * 1000],
                                        [a1 + k * 1000], [1000]) for k in range(3)]
    out["async_ids_nonzero"] = [i != 0 for i in ids]
    out["get_batch_transfer_status"] = e.get_batch_transfer_status(ids)
    bid = e.transfer_submit_write(t.sid, s0 + 1_500_000, a1 + 10_000, 20_000)
    out["submit_id_nonzero"] = bid != 0
    st, t0 = 0, time.monotonic()
    while st == 0 and time.monotonic() - t0 < 30:
        st = e.transfer_check_status(bid)
    out["transfer_check_status"] = st
    out["transfer_sync_opcode"] = e.transfer_sync(t.sid, s0 + 11, a1 + 40_000, 999,
                                                  TransferOpcode.Write)
    out["batch_transfer_sync_opcode"] = e.batch_transfer_sync(
        t.sid, [s0 + 13], [a1 + 50_000], [777], TransferOpcode.Write)
    bid = e.batch_transfer_async(t.sid, [s0 + 17], [a1 + 70_000], [555], TransferOpcode.Write)
    out["batch_transfer_async_opcode"] = [bid != 0, e.get_batch_transfer_status([bid])]
    out["empty_batch"] = e.batch_transfer_sync_write(t.sid, [], [], [])
    out["type_float"] = attempt(lambda: e.batch_transfer_sync_write(t.sid, [1.5], [a0], [1]))
    out["type_negative"] = attempt(lambda: e.batch_transfer_sync_write(t.sid, [-1], [a0], [1]))
    out["type_target_none"] = attempt(lambda: e.transfer_sync_write(None, s0, a0, 1))
    out["send_probe"] = [e.send_probe(t.sid), e.send_probe(f"{HOST}:1")]
    mb = e.allocate_managed_buffer(4096)
    out["managed"] = [mb != 0, e.write_bytes_to_buffer(mb, b"abcdef", 6),
                      e.read_bytes_from_buffer(mb, 6).decode(), e.free_managed_buffer(mb, 4096)]
    out["digests"] = t.call("digest")
    out["read_ops"] = [
        attempt(lambda: e.transfer_sync_read(t.sid, s0, a0 + 500_000, 16)),
        attempt(lambda: e.batch_transfer_sync_read(t.sid, [s0], [a0 + 500_000], [16]))]
    from mooncake.engine import TransferNotify
    out["notify"] = attempt(lambda: e.transfer_sync(t.sid, s0, a0 + 500_000, 16, TransferOpcode.Write,
                                                    TransferNotify("n", "m")))
    out["get_first_buffer_address"] = attempt(lambda: e.get_first_buffer_address(t.sid) != 0)
    out["target_unregister"] = [t.call("unregister", i=1), t.call("unregister", i=1)]
    out["write_after_target_unregister"] = e.transfer_sync_write(t.sid, s0, a1, 16)
    t.kill()
    t0 = time.monotonic()
    out["write_killed_target"] = e.transfer_sync_write(t.sid, s0, a0, 4096)
    out["killed_within_10s"] = time.monotonic() - t0 < 10
    out["unregister"] = e.unregister_memory(s0)
    with open(path, "w") as f:
        json.dump(out, f)


def compare(a_path, b_path):
    a, b = (json.load(open(p)) for p in (a_path, b_path))
    bad = 0
    for k in a:
        if k == "module":
            continue
        same = a.get(k) == b.get(k)
        tag = "same" if same else ("expected" if k in EXPECTED else "DIFF")
        bad += tag == "DIFF"
        print(f"{tag:8} {k}: {a.get(k)!r} | {b.get(k)!r}" +
              (f"  ({EXPECTED[k]})" if tag == "expected" else ""))
    print(f"{len(a) - 1 - bad} passed, {bad} failed")
    return 1 if bad else 0


if __name__ == "__main__":
    if sys.argv[1] == "target":
        target(sys.argv[2])
    elif sys.argv[1] == "compare":
        sys.exit(compare(sys.argv[2], sys.argv[3]))
    else:
        run(sys.argv[1], sys.argv[2])
