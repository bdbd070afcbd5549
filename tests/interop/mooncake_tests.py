"""Mooncake's own transfer-engine tests, unmodified, on a mooncake.engine
(scripts/interop-mooncake-tests.sh runs this; docs/testing.md).

Usage: mooncake_tests.py MOONCAKE_SRC OUT_DIR [dropin|real]

Runs, from Mooncake's source tree (nothing of it is copied anywhere), with
the Python interpreter and environment this driver was started with (the
shell script puts kvbridge's drop-in first on PYTHONPATH, or runs Mooncake's
real wheel from a venv):

- mooncake-wheel/tests/transfer_engine_target.py (one case: it serves until
  the initiator is done) and transfer_engine_initiator_test.py (its six
  unittest cases, in one process as Mooncake runs the file) with the P2PHANDSHAKE metadata mode over TCP, as
  Mooncake's CI runs them (scripts/run_tests.sh: MC_FORCE_TCP) but without a
  metadata server: the target's RPC port is pinned to two ports with
  MC_MIN_RPC_PORT / MC_MAX_RPC_PORT (Mooncake takes its TCP data port from
  that range too) and read back so the initiator can name it. Twice: both sides named by
  address as the files' defaults do ("127.0.0.1:PORT"), then by host name
  ("localhost:PORT"), which Mooncake accepts;
- mooncake-wheel/tests/test_import_structure.py (three unittest cases);
- mooncake-transfer-engine/tests/rpc_communicator_test.py as Mooncake's CI
  runs it (a server, then a client for 10 s): two cases, the server serving
  and the client's sends succeeding (bandwidth printed, no error; on the
  drop-in the RPC helpers run on kvbridge's engine notifications).

Each case ends PASS or FAIL, or, on the drop-in, as this file expects it
(EXPECT_DROPIN): N/A (needs Mooncake Store, which kvbridge does not
provide: the failure must be that import). Exit status 1 when a case ends
otherwise than expected (an applicable case failing, an N/A case failing
for another reason, or passing: then the expectation is stale), else 0.
"""

import os
import re
import socket
import subprocess
import sys
import time

FILES = {
    "target": "transfer_engine_target.py",
    "initiator": "transfer_engine_initiator_test.py",
    "imports": "test_import_structure.py",
    "rpc": "rpc_communicator_test.py",
}

INITIATOR_CASES = [
    "test_random_write_circle_times", "test_batch_write_read", "test_async_batch_write_read",
    "test_async_submit_to_unknown_peer_returns_zero", "test_send_probe_reachable_peer",
    "test_send_probe_unknown_peer",
]
IMPORT_CASES = ["test_new_import_structure", "test_direct_import",
                "test_top_level_buffer_pool_alias"]

# On the drop-in: case -> (outcome, what its failure must show). Every other
# case must pass.
EXPECT_DROPIN = {
    "test_import_structure.test_new_import_structure":
        ("N/A", "No module named 'mooncake.store'",
         "needs Mooncake Store (mooncake.store), which kvbridge does not provide"),
}


def find(src, name):
    """The path of Mooncake's test file name under src (they have moved
    between releases: found by name under a tests folder)."""
    hits = []
    for d, dirs, files in os.walk(src):
        dirs[:] = [x for x in dirs if not x.startswith(".") and x != "build"]
        if name in files and os.path.basename(d) == "tests":
            hits.append(os.path.join(d, name))
    if not hits:
        raise SystemExit(f"mooncake_tests: {name} not found under {src}")
    return sorted(hits, key=len)[0]


def is_free(port):
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", port))
        return True
    except OSError:
        return False
    finally:
        s.close()


def free_port(lo=15000, hi=17000):
    """A port p of Mooncake's default RPC range with p and p + 1 free now."""
    for p in range(lo + os.getpid() % 997, hi - 1):
        if is_free(p) and is_free(p + 1):
            return p
    raise SystemExit(f"mooncake_tests: no two free ports in [{lo}, {hi})")


def listening(port):
    s = socket.socket()
    s.settimeout(0.5)
    try:
        return s.connect_ex(("127.0.0.1", port)) == 0
    finally:
        s.close()


def unittest_failures(log, cases):
    """{case: passed?} from a `python file.py -v` log: a case passed when
    the run got to unittest's summary ("Ran N tests") and the case is not
    listed as FAIL, ERROR or skipped (the lines of the report unittest
    prints last, which the test's and the engine's own output cannot
    interleave)."""
    if not re.search(r"^Ran \d+ tests? in", log, re.M):
        return {c: False for c in cases}
    bad = set(re.findall(r"^(?:FAIL|ERROR): (test_\w+) ", log, re.M))
    bad |= set(re.findall(r"^(test_\w+) \(.*\.\.\. skipped", log, re.M))
    ran = set(re.findall(r"^(test_\w+) \(", log, re.M))
    return {c: c in ran and c not in bad for c in cases}


class Run:
    def __init__(self, src, out, mode):
        self.src, self.out, self.mode = src, out, mode
        self.results = []  # (case, outcome, note)
        self.env = dict(os.environ, MC_METADATA_SERVER="P2PHANDSHAKE", PROTOCOL="tcp",
                        MC_FORCE_TCP="1", PYTHONUNBUFFERED="1")

    def log(self, name):
        return os.path.join(self.out, name + ".log")

    def text(self, name):
        with open(self.log(name)) as f:
            return f.read()

    def judge(self, case, passed, text):
        """Record case's outcome against what is expected of it."""
        want = EXPECT_DROPIN.get(case) if self.mode == "dropin" else None
        if want is None:
            self.results.append((case, "PASS" if passed else "FAIL", ""))
        elif passed:
            self.results.append((case, "FAIL", f"expected {want[0]} but it passed: "
                                               "update EXPECT_DROPIN and the docs"))
        elif want[1] in text:
            self.results.append((case, want[0], want[2]))
        else:
            self.results.append((case, "FAIL", f"expected {want[0]} ({want[1]!r}), "
                                               "failed otherwise"))

    def run_py(self, path, args, env, timeout, name):
        with open(self.log(name), "w") as f:
            try:
                p = subprocess.run([sys.executable, os.path.basename(path)] + args,
                                   cwd=os.path.dirname(path), env=env, stdout=f,
                                   stderr=subprocess.STDOUT, timeout=timeout)
                rc = p.returncode
            except subprocess.TimeoutExpired:
                rc = "timeout"
        return rc, self.text(name)

    def target_port(self, tname, ports):
        """The target's RPC (handshake) port, of ports: the one Mooncake's
        engine logs ("P2P handshake, listening on host:PORT"; its TCP data
        port takes the other), else the one listening (the drop-in takes
        one port)."""
        m = re.search(r"P2P handshake, listening on \S+:(\d+)", self.text(tname))
        if m:
            return int(m.group(1))
        up = [p for p in ports if listening(p)]
        return up[0] if len(up) == 1 else ports[0]

    def transfer(self, host):
        """The target and the initiator, both sides named host:PORT. The
        target's ports are pinned to [p, p + 1] (MC_MIN/MAX_RPC_PORT): its
        RPC port, and Mooncake's TCP data port, which comes from that range
        too."""
        lo = free_port()
        tenv = dict(self.env, TARGET_SERVER_NAME=f"{host}:{lo}",
                    MC_MIN_RPC_PORT=str(lo), MC_MAX_RPC_PORT=str(lo + 1))
        tname = f"target[{host}]"
        tlog = open(self.log(tname), "w")
        tpath = find(self.src, FILES["target"])
        target = subprocess.Popen([sys.executable, os.path.basename(tpath)],
                                  cwd=os.path.dirname(tpath), env=tenv, stdout=tlog,
                                  stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and target.poll() is None:
                if "server ready" in self.text(tname):
                    break
                time.sleep(0.1)
            port = self.target_port(tname, [lo, lo + 1])
            ienv = dict(self.env, TARGET_SERVER_NAME=f"{host}:{port}",
                        INITIATOR_SERVER_NAME=f"{host}:12347")
            self.cases(f"transfer_engine_initiator_test[{host}]", FILES["initiator"],
                       INITIATOR_CASES, ienv)
            alive = target.poll() is None
        finally:
            target.kill()
            target.wait()
            tlog.close()
        tl = self.text(tname)
        self.judge(f"transfer_engine_target[{host}].serves", alive and "server ready" in tl, tl)

    def cases(self, module, name, cases, env):
        """Mooncake's file name run as Mooncake runs it (`python file.py`,
        unittest.main, all its cases in one process), -v for the case list."""
        rc, log = self.run_py(find(self.src, name), ["-v"], env, 300, module)
        passed = unittest_failures(log, cases)
        for c in cases:
            self.judge(f"{module}.{c}", passed[c] and rc in (0, 1), log)

    def imports(self):
        self.cases("test_import_structure", FILES["imports"], IMPORT_CASES, self.env)

    def rpc(self):
        path = find(self.src, FILES["rpc"])
        port = free_port(9004, 15000)  # Mooncake's CI uses 9004
        slog = open(self.log("rpc-server"), "w")
        server = subprocess.Popen([sys.executable, os.path.basename(path), "server", "--url",
                                   f"127.0.0.1:{port}", "--data-size", "1"],
                                  cwd=os.path.dirname(path), env=self.env, stdout=slog,
                                  stderr=subprocess.STDOUT)
        try:
            time.sleep(5)  # Mooncake's CI waits 5 s too
            serving = server.poll() is None and listening(port)
            rc, clog = self.run_py(path, ["client", "--url", f"127.0.0.1:{port}", "--threads",
                                          "2", "--data-size", "1"], self.env, 10, "rpc-client")
            serving = serving and server.poll() is None
        finally:
            server.kill()
            server.wait()
            slog.close()
        self.judge("rpc_communicator_test.server", serving,
                   self.text("rpc-server"))
        sent = rc == "timeout" and "bandwidth:" in clog and not re.search(
            r"^(Warning|Error)", clog, re.M)
        self.judge("rpc_communicator_test.client", sent, clog)

    def report(self):
        for case, outcome, note in self.results:
            print(f"{outcome:8} {case}" + (f"  ({note})" if note else ""))
        applicable = [r for r in self.results if r[1] != "N/A"]
        passed = sum(r[1] == "PASS" for r in self.results)
        na = [r[0] for r in self.results if r[1] == "N/A"]
        print(f"mooncake tests ({self.mode}): {passed}/{len(applicable)} applicable cases pass"
              f"; not applicable: {len(na)} ({', '.join(na) or 'none'})")
        return 1 if any(r[1] == "FAIL" for r in self.results) else 0


def main():
    if len(sys.argv) != 4 or sys.argv[3] not in ("dropin", "real"):
        raise SystemExit(__doc__)
    src, out, mode = sys.argv[1:]
    os.makedirs(out, exist_ok=True)
    r = Run(os.path.abspath(src), os.path.abspath(out), mode)
    r.transfer("127.0.0.1")
    r.transfer("localhost")
    r.imports()
    r.rpc()
    sys.exit(r.report())


if __name__ == "__main__":
    main()
