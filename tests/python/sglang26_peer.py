"""Shared pieces of the 2026-dialect peer tests: the C helper
(tests/integration/sglang26/sglang26_helper.c) and the frame encodings of
PROTOCOL-SGLANG-2026.md section 4, written from the spec (not from SGLang's
code): ASCII decimals, native (little-endian) u64/i32 arrays, and the packed
list-of-lists: little-endian u32 count, u32 byte lengths, payloads."""

import os
import struct
import subprocess
import tempfile
import time

HELPER = os.environ.get("KVBRIDGE_SGLANG26_HELPER")


def dec(x):
    return str(x).encode("ascii")


def u64s(values):
    return b"".join(struct.pack("Q", v) for v in values)


def i32s(values):
    return struct.pack(f"={len(values)}i", *values)


def lol(fmt, lists):
    """Spec 4 "LoL": an empty outer list is an empty frame."""
    if not lists:
        return b""
    payloads = [b"".join(struct.pack("<" + fmt, x) for x in inner) for inner in lists]
    header = struct.pack("<I", len(lists)) + b"".join(struct.pack("<I", len(p)) for p in payloads)
    return header + b"".join(payloads)


class Helper:
    """One sglang26_helper process (or argv's: another helper of the same
    line protocol); lines in, key/value lines out."""

    def __init__(self, role, env=None, argv=None):
        full_env = dict(os.environ)
        for k, v in (env or {}).items():  # None: unset
            if v is None:
                full_env.pop(k, None)
            else:
                full_env[k] = v
        # stderr kept: a sanitizer report or a leak makes close() fail.
        self.err = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen(
            [HELPER, role] if argv is None else argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.err,
            text=True,
            env=full_env,
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

    def cmd(self, line):
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def line(self, key, room):
        out = self.proc.stdout.readline().strip()
        k, r, rest = (out.split(" ", 2) + ["", ""])[:3]
        assert k == key and int(r) == room, out
        return rest

    def close(self):
        """Stop the helper; it must exit 0 (no sanitizer report, no leak)."""
        self.proc.stdin.close()
        try:
            rc = self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            rc = "killed after 20 s"
        self.err.seek(0)
        text = self.err.read()
        self.err.close()
        assert rc == 0, f"helper exit {rc}: {text[-4000:]}"


def poll(h, room, secs):
    """The decode helper's poll: (status, pages_safe, failure reason)."""
    h.cmd(f"poll {room} {secs}")
    status, safe, reason = (h.line("poll", room).split(" ", 2) + ["", ""])[:3]
    return int(status), int(safe), reason


def refused_at_init(h, room, recv_args):
    """A receiver the decode helper fails before sending anything: its
    reason (the room is Failed, its pages safe)."""
    h.cmd(f"recv {room} {recv_args}")
    assert h.line("recv", room) == "0"
    status, safe, reason = poll(h, room, 1)
    assert status == 0 and safe == 1, reason
    return reason


def recv_frames(pull, timeout_s=10.0):
    if not pull.poll(int(timeout_s * 1000)):
        raise AssertionError("no message within %.1f s" % timeout_s)
    return pull.recv_multipart()
