#!/usr/bin/env python3
"""kvbridge's NIXL plug-in (libplugin_KVBRIDGE.so) driven by NIXL's own
Python agent (the PyPI wheel scripts/interop-nixl.sh installs), two
processes: this one is the initiator ("decode"); a child started with
--target is the target ("prefill"), each with its own nixl_agent and
backend KVBRIDGE. They exchange agent metadata and commands over a socket
pair (JSON lines). Cases (argv[1]):

  write_read   WRITE then READ of many descriptors of mixed sizes, each with
               a notification; the target compares every byte of its memory
               the moment the WRITE's notification arrives, the initiator
               every byte the READ brought; the READ's notification reaches
               the target tagged with the initiator's agent name
  notif        notifications alone, both ways (send_notif), order kept
  local        one agent, loopback WRITE and READ (prep_xfer_dlist with its
               own name) and a notification to itself
  bounds       a descriptor outside registered memory is refused, nothing
               written
  kill         the target is killed (SIGKILL) while a READ runs: the
               transfer ends in an error state within a bound (timings
               printed)
  socket_md    metadata exchanged through NIXL's own listener thread, then
               a WRITE with a notification (one process, two agents)
  params       backend parameters: a bad port or transport refuses the
               backend (NIXL reports its init error), good ones create it
  release      release_xfer_handle of a running READ, and of one whose
               target is SIGSTOPped mid-READ: refused while the cancel cannot
               settle (the request then reads ERR) or accepted; no byte lands
               after the release returned, also once the target resumes
  vram         VRAM_SEG against the CUDA driver-API test double (the file
               KVBRIDGE_CUDA_DOUBLE names, loaded by kvbridge through
               KVBRIDGE_CUDA_LIB in both processes; plumbing only, never a
               GPU): the target's memory is "device" memory of the double
               registered as VRAM (device 0); WRITE DRAM->VRAM, READ
               VRAM->DRAM, WRITE and READ VRAM->VRAM, many descriptors, every
               device byte read back through the double (cuMemcpyDtoH), and
               the double's counters show the CUDA lane moved them; device
               0's memory offered as device 1 is refused
  vram_vmm     vram with the target's memory VMM memory (2 MiB cuMemCreate
               handles mapped back to back, as PyTorch's expandable
               segments): the initiator imports each handle's fd and maps it
  vram_refused VRAM registration with KVBRIDGE_CUDA_LIB naming a missing file
               and a file that is no library: NIXL raises an error naming
               the cause, the process keeps serving DRAM

Every process ends with os._exit (the 1.5.1 wheel can crash at interpreter
exit). Exit 0 on success; a failure prints what differed."""
import base64
import ctypes
import json
import os
import signal
import socket
import subprocess
import sys
import time

import numpy as np
from nixl._api import nixl_agent, nixl_agent_config

BACKEND = "KVBRIDGE"


def pattern(n, seed):
    i = np.arange(n, dtype=np.uint64)
    return (((i * np.uint64(2654435761)) >> np.uint64(13)) + np.uint64(seed)).astype(np.uint8)


def make_agent(name, params=None):
    a = nixl_agent(name, nixl_agent_config(backends=[], capture_telemetry=True))
    a.create_backend(BACKEND, params or {})
    return a


def register(a, buf):
    return a.register_memory([(buf.ctypes.data, buf.nbytes, 0, "")], "DRAM", backends=[BACKEND])


def state(a, h):
    """check_xfer_state, with the error statuses it raises as "ERR:<name>"."""
    try:
        return a.check_xfer_state(h)
    except Exception as e:  # nixl raises one exception class per NIXL_ERR_*
        return "ERR:" + type(e).__name__


def wait_state(a, h, bound):
    t0 = time.monotonic()
    while True:
        st = state(a, h)
        if st != "PROC" or time.monotonic() - t0 > bound:
            return st, time.monotonic() - t0
        time.sleep(0.0005)


def fail(msg):
    print("FAIL:", msg, flush=True)
    os._exit(1)


class Link:
    def __init__(self, sock):
        self.f = sock.makefile("rw", buffering=1)

    def send(self, **kw):
        self.f.write(json.dumps(kw) + "\n")
        self.f.flush()

    def recv(self):
        line = self.f.readline()
        if not line:
            fail("peer process went away")
        return json.loads(line)


# ---- "device" memory: the CUDA driver-API test double (cases vram*) ----

CUDA = None  # ctypes handle of the double: the same instance kvbridge dlopens
VMM_PART = 2 << 20  # case vram_vmm: the target's memory in 2 MiB cuMemCreate handles
OWN = {"copies": 0, "bytes": 0}  # the double's counters that this script's own copies moved


def cuda_double():
    """Loads the double (KVBRIDGE_CUDA_DOUBLE) and points kvbridge at it
    (KVBRIDGE_CUDA_LIB, inherited by the target process); before any agent."""
    global CUDA
    path = os.environ.get("KVBRIDGE_CUDA_DOUBLE", "")
    if not os.path.isfile(path):
        fail(f"KVBRIDGE_CUDA_DOUBLE ({path!r}) names no file: build kvb_cuda_double")
    os.environ["KVBRIDGE_CUDA_LIB"] = path
    CUDA = ctypes.CDLL(path)
    return CUDA


class Device:
    """size bytes of the double's device memory on device 0, its address
    PROT_NONE to host code (only the driver reaches the bytes): cuMemAlloc,
    or with vmm_part VMM memory as PyTorch's expandable segments make it
    (cuMemCreate handles of vmm_part bytes asking for POSIX file
    descriptors, mapped back to back in one reservation, read-write)."""

    def __init__(self, size, vmm_part=0):
        self.size = size
        ctx, d, p = ctypes.c_void_p(), ctypes.c_int(), ctypes.c_ulonglong()
        self.ok(CUDA.cuInit(0), "cuInit")
        self.ok(CUDA.cuDeviceGet(ctypes.byref(d), 0), "cuDeviceGet")
        self.ok(CUDA.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), d), "cuDevicePrimaryCtxRetain")
        self.ok(CUDA.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
        if not vmm_part:
            self.ok(CUDA.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(size)), "cuMemAlloc")
            self.ptr = p.value
            return
        u64, sz = ctypes.c_ulonglong, ctypes.c_size_t

        class Prop(ctypes.Structure):  # CUmemAllocationProp
            _fields_ = [("type", ctypes.c_int), ("handle_types", ctypes.c_int),
                        ("location", ctypes.c_int * 2), ("win32", ctypes.c_void_p),
                        ("flags", ctypes.c_ubyte * 8)]

        class Access(ctypes.Structure):  # CUmemAccessDesc
            _fields_ = [("location", ctypes.c_int * 2), ("flags", ctypes.c_int)]

        prop = Prop(1, 1, (ctypes.c_int * 2)(1, 0))  # pinned, POSIX fd, device 0
        acc = Access((ctypes.c_int * 2)(1, 0), 3)  # read-write on device 0
        self.ok(CUDA.cuMemAddressReserve(ctypes.byref(p), sz(size), sz(0), u64(0), u64(0)),
                "cuMemAddressReserve")
        self.ptr = p.value
        for off in range(0, size, vmm_part):
            h = u64()
            self.ok(CUDA.cuMemCreate(ctypes.byref(h), sz(vmm_part), ctypes.byref(prop), u64(0)),
                    "cuMemCreate")
            self.ok(CUDA.cuMemMap(u64(self.ptr + off), sz(vmm_part), sz(0), h, u64(0)),
                    "cuMemMap")
            self.ok(CUDA.cuMemRelease(h), "cuMemRelease")
        self.ok(CUDA.cuMemSetAccess(u64(self.ptr), sz(size), ctypes.byref(acc), sz(1)),
                "cuMemSetAccess")

    @staticmethod
    def ok(r, what):
        if r != 0:
            fail(f"{what}: CUDA error {r}")

    def upload(self, a):
        OWN["copies"] += 1
        OWN["bytes"] += self.size
        self.ok(CUDA.cuMemcpyHtoD_v2(ctypes.c_ulonglong(self.ptr), ctypes.c_void_p(a.ctypes.data),
                                     ctypes.c_size_t(self.size)), "cuMemcpyHtoD")

    def download(self):
        OWN["copies"] += 1
        OWN["bytes"] += self.size
        h = np.empty(self.size, dtype=np.uint8)
        self.ok(CUDA.cuMemcpyDtoH_v2(ctypes.c_void_p(h.ctypes.data), ctypes.c_ulonglong(self.ptr),
                                     ctypes.c_size_t(self.size)), "cuMemcpyDtoH")
        return h


STATS = ("copies", "copies_2d", "copies_batch", "syncs", "ipc_opens", "ipc_closes", "bytes",
         "vmm_exports", "vmm_imports", "vmm_maps", "vmm_unmaps", "pinned_bytes", "pinned_peak")


def cuda_stats():
    """kvb_cuda_double_stats (tests/cuda/cuda_double.h) as a dict, less what
    this script's own uploads and downloads counted: what kvbridge did."""
    if CUDA is None:
        return {}
    out = (ctypes.c_uint64 * len(STATS))()
    CUDA.kvb_cuda_double_stats(out)
    st = dict(zip(STATS, (int(v) for v in out)))
    return {k: v - OWN.get(k, 0) for k, v in st.items()}


# ---- target (child) ----

def target_main(fd, size, params, mem):
    link = Link(socket.socket(fileno=fd))
    if mem != "DRAM":
        cuda_double()
    a = make_agent("prefill", params)
    if mem != "DRAM":  # device memory of the CUDA double (cases vram*)
        dev = Device(size, VMM_PART if mem == "VMM" else 0)
        dev.upload(pattern(size, 1))
        a.register_memory([(dev.ptr, size, 0, "")], "VRAM", backends=[BACKEND])
        addr, current = dev.ptr, dev.download
    else:
        buf = pattern(size, 1)
        register(a, buf)
        addr, current = buf.ctypes.data, lambda: buf
    link.send(meta=base64.b64encode(a.get_agent_metadata()).decode(), addr=addr,
              pid=os.getpid())
    got = []
    while True:
        c = link.recv()
        if c["cmd"] == "wait_notif":  # bytes must all be there when it arrives
            t_end = time.monotonic() + c.get("bound", 20)
            hit = None
            want = pattern(size, c["seed"])
            step = 1021  # a sample read within microseconds of the arrival, then every byte
            sample = want[::step].copy()
            link.send(watching=True)
            while hit is None and time.monotonic() < t_end:
                for agent, msgs in a.get_new_notifs().items():
                    for m in msgs:
                        if m != c["msg"].encode() or hit is not None:
                            got.append((agent, m))
                            continue
                        now = current()
                        early = int(np.count_nonzero(now[::step] != sample))
                        hit = dict(agent=agent, early=early,
                                   mismatched=int(np.count_nonzero(now != want)))
                if hit is None:
                    time.sleep(0.0005)
            link.send(hit=hit)
        elif c["cmd"] == "notifs":
            t_end = time.monotonic() + c.get("bound", 5)
            while len(got) < c["want"] and time.monotonic() < t_end:
                for agent, msgs in a.get_new_notifs().items():
                    got.extend((agent, m) for m in msgs)
                time.sleep(0.001)
            link.send(notifs=[[g, m.decode()] for g, m in got])
            got = []
        elif c["cmd"] == "add_remote":
            name = a.add_remote_agent(base64.b64decode(c["meta"]))
            link.send(name=name.decode() if isinstance(name, bytes) else name)
        elif c["cmd"] == "send_notif":
            a.send_notif(c["agent"], c["msg"].encode())
            link.send(ok=True)
        elif c["cmd"] == "bytes":
            link.send(mismatched=int(np.count_nonzero(current() != pattern(size, c["seed"]))))
        elif c["cmd"] == "cuda_stats":
            link.send(stats=cuda_stats())
        elif c["cmd"] == "exit":
            link.send(ok=True)
            os._exit(0)


def start_target(size, params=None, mem="DRAM"):
    parent, child = socket.socketpair()
    p = subprocess.Popen([sys.executable, __file__, "--target", str(child.fileno()), str(size),
                          json.dumps(params or {}), mem], pass_fds=[child.fileno()])
    child.close()
    link = Link(parent)
    hello = link.recv()
    return p, link, hello


# ---- initiator cases ----

def mixed_descs(base, total):
    """Descriptors covering [base, base + total) in a shuffled order: the
    first half in 1 MiB and 32 KiB pieces, the rest in 4 KiB and 40 B ones
    (thousands of descriptors)."""
    out, off, k = [], 0, 0
    while off < total:
        sizes = [1 << 20, 32768] if off < total // 2 else [4096, 40]
        n = min(sizes[k % 2], total - off)
        out.append((off, n))
        off += n
        k += 1
    order = np.random.default_rng(7).permutation(len(out))
    return [(base + out[i][0], out[i][1], 0) for i in order], [out[i] for i in order]


def case_write_read():
    size = 64 << 20
    p, link, hello = start_target(size)
    a = make_agent("decode")
    name = a.add_remote_agent(base64.b64decode(hello["meta"]))
    link.send(cmd="add_remote", meta=base64.b64encode(a.get_agent_metadata()).decode())
    link.recv()
    src = pattern(size, 2)
    register(a, src)
    local, _ = mixed_descs(src.ctypes.data, size)
    remote, _ = mixed_descs(hello["addr"], size)
    print(f"write_read: {len(local)} descriptors, {size >> 20} MiB", flush=True)
    h = a.initialize_xfer("WRITE", a.get_xfer_descs(local, "DRAM"),
                          a.get_xfer_descs(remote, "DRAM"), name, b"write-done:1")
    link.send(cmd="wait_notif", msg="write-done:1", seed=2)  # watching before the post
    link.recv()
    if a.transfer(h) not in ("PROC", "DONE"):
        fail("WRITE not posted")
    st, took = wait_state(a, h, 30)
    hit = link.recv()["hit"]
    print(f"  WRITE {st} after {took:.3f} s; target saw the notification from {hit and hit['agent']}"
          f" with {hit and hit['early']} of {size // 1021 + 1} sampled bytes not yet in place",
          flush=True)
    if st != "DONE" or hit is None or hit["early"] != 0 or hit["mismatched"] != 0 or \
            hit["agent"] != "decode":
        fail(f"WRITE: state {st}, notification {hit}")
    # repost the same handle (DONE -> post again): the same bytes, a second notification
    if a.transfer(h) not in ("PROC", "DONE"):
        fail("WRITE repost refused")
    link.send(cmd="wait_notif", msg="write-done:1", seed=2)
    link.recv()
    if wait_state(a, h, 30)[0] != "DONE" or link.recv()["hit"] is None:
        fail("reposted WRITE")
    a.release_xfer_handle(h)
    # READ what the WRITE placed (seed 2) back into a zeroed buffer
    dst = np.zeros(size, dtype=np.uint8)
    register(a, dst)
    local, _ = mixed_descs(dst.ctypes.data, size)
    h = a.initialize_xfer("READ", a.get_xfer_descs(local, "DRAM"),
                          a.get_xfer_descs(remote, "DRAM"), name, b"read-done:1")
    a.transfer(h)
    st, took = wait_state(a, h, 30)
    bad = int(np.count_nonzero(dst != pattern(size, 2)))
    print(f"  READ {st} after {took:.3f} s, {bad} bytes differ", flush=True)
    if st != "DONE" or bad != 0:
        fail("READ bytes")
    tel = a.get_xfer_telemetry(h)
    print(f"  telemetry: {tel.totalBytes} bytes, {tel.descCount} descriptors", flush=True)
    if tel.totalBytes != size:
        fail("telemetry bytes")
    link.send(cmd="notifs", want=1)
    n = link.recv()["notifs"]
    if n != [["decode", "read-done:1"]]:
        fail(f"READ notification at the target: {n}")
    a.release_xfer_handle(h)
    link.send(cmd="exit")
    link.recv()
    print("ok: write_read", flush=True)


def case_notif():
    p, link, hello = start_target(4096)
    a = make_agent("decode")
    name = a.add_remote_agent(base64.b64decode(hello["meta"]))
    link.send(cmd="add_remote", meta=base64.b64encode(a.get_agent_metadata()).decode())
    link.recv()
    msgs = [f"HB:req{i},req{i + 1}" for i in range(50)] + ["", "x" * 60000]
    for m in msgs:
        a.send_notif(name, m.encode())
    link.send(cmd="notifs", want=len(msgs))
    got = link.recv()["notifs"]
    if got != [["decode", m] for m in msgs]:
        fail(f"notifications at the target: {len(got)} of {len(msgs)}, first {got[:2]}")
    link.send(cmd="send_notif", agent="decode", msg="from-prefill")
    link.recv()
    t_end, back = time.monotonic() + 5, {}
    while not back and time.monotonic() < t_end:
        back = a.get_new_notifs()
        time.sleep(0.001)
    if back != {"prefill": [b"from-prefill"]}:
        fail(f"notification at the initiator: {back}")
    link.send(cmd="exit")
    link.recv()
    print("ok: notif", flush=True)


def case_local():
    a = make_agent("solo")
    size = 4 << 20
    src, dst = pattern(size, 3), np.zeros(size, dtype=np.uint8)
    register(a, src)
    register(a, dst)
    ls, _ = mixed_descs(src.ctypes.data, size)
    ld, _ = mixed_descs(dst.ctypes.data, size)
    h = a.initialize_xfer("WRITE", a.get_xfer_descs(ls, "DRAM"), a.get_xfer_descs(ld, "DRAM"),
                          "solo", b"self-write")
    a.transfer(h)
    if wait_state(a, h, 30)[0] != "DONE" or not np.array_equal(src, dst):
        fail("loopback WRITE")
    a.release_xfer_handle(h)
    back = np.zeros(size, dtype=np.uint8)
    register(a, back)
    lb, _ = mixed_descs(back.ctypes.data, size)
    h = a.initialize_xfer("READ", a.get_xfer_descs(lb, "DRAM"), a.get_xfer_descs(ld, "DRAM"),
                          "solo")
    a.transfer(h)
    if wait_state(a, h, 30)[0] != "DONE" or not np.array_equal(back, src):
        fail("loopback READ")
    a.release_xfer_handle(h)
    t_end, n = time.monotonic() + 5, {}
    while not n and time.monotonic() < t_end:
        n = a.get_new_notifs()
    if n != {"solo": [b"self-write"]}:
        fail(f"self notification: {n}")
    print("ok: local", flush=True)


def case_bounds():
    size = 1 << 20
    p, link, hello = start_target(size)
    a = make_agent("decode")
    name = a.add_remote_agent(base64.b64decode(hello["meta"]))
    src = pattern(size, 4)
    register(a, src)
    # the last descriptor runs 4 KiB past the target's registration
    local = [(src.ctypes.data, 8192, 0)]
    remote = [(hello["addr"] + size - 4096, 8192, 0)]
    refused = False
    try:
        h = a.initialize_xfer("WRITE", a.get_xfer_descs(local, "DRAM"),
                              a.get_xfer_descs(remote, "DRAM"), name)
        st = a.transfer(h)
        refused = st.startswith("ERR") or wait_state(a, h, 10)[0].startswith("ERR")
    except Exception as e:  # NIXL refuses it before the backend sees it
        print(f"  refused: {type(e).__name__}: {e}", flush=True)
        refused = True
    link.send(cmd="bytes", seed=1)
    bad = link.recv()["mismatched"]
    if not refused or bad != 0:
        fail(f"out-of-bounds descriptor: refused {refused}, {bad} target bytes changed")
    link.send(cmd="exit")
    link.recv()
    print("ok: bounds", flush=True)


def case_kill():
    size = 256 << 20
    params = {"transport": "tcp"}  # slow enough to be killed in the middle
    for attempt in range(3):
        p, link, hello = start_target(size, params)
        a = make_agent(f"decode{attempt}", params)
        name = a.add_remote_agent(base64.b64decode(hello["meta"]))
        dst = np.zeros(size, dtype=np.uint8)
        register(a, dst)
        n = size // (1 << 20)
        local = [(dst.ctypes.data + i * (1 << 20), 1 << 20, 0) for i in range(n)]
        remote = [(hello["addr"] + i * (1 << 20), 1 << 20, 0) for i in range(n)]
        h = a.initialize_xfer("READ", a.get_xfer_descs(local, "DRAM"),
                              a.get_xfer_descs(remote, "DRAM"), name)
        t0 = time.monotonic()
        a.transfer(h)
        while not dst[::65536].any() and time.monotonic() - t0 < 5:  # bytes are arriving
            time.sleep(0.0002)
        st0 = state(a, h)
        os.kill(hello["pid"], signal.SIGKILL)
        t_kill = time.monotonic()
        p.wait()
        if st0 != "PROC":
            print(f"  attempt {attempt}: READ was {st0} before the kill; again", flush=True)
            continue
        st = wait_state(a, h, 30)[0]
        took = time.monotonic() - t_kill
        moved = int(np.count_nonzero(dst))
        print(f"  READ posted, PROC at {t_kill - t0:.3f} s, target killed; state {st} "
              f"{took:.3f} s after the kill ({moved} of {size} bytes had landed)", flush=True)
        if not st.startswith("ERR") or took > 10:
            fail(f"killed target: state {st} after {took:.3f} s")
        # the handle is final: release succeeds, and nothing lands afterwards
        a.release_xfer_handle(h)
        after = int(np.count_nonzero(dst))
        time.sleep(0.5)
        if int(np.count_nonzero(dst)) != after:
            fail("bytes landed after the READ was reported ended")
        print("ok: kill", flush=True)
        return
    fail("the READ always finished before the kill")


def case_release():
    size = 256 << 20
    params = {"transport": "tcp"}
    p, link, hello = start_target(size, params)
    a = make_agent("decode", params)
    name = a.add_remote_agent(base64.b64decode(hello["meta"]))
    dst = np.zeros(size, dtype=np.uint8)
    register(a, dst)
    n = size // (1 << 20)
    local = [(dst.ctypes.data + i * (1 << 20), 1 << 20, 0) for i in range(n)]
    remote = [(hello["addr"] + i * (1 << 20), 1 << 20, 0) for i in range(n)]
    h = a.initialize_xfer("READ", a.get_xfer_descs(local, "DRAM"),
                          a.get_xfer_descs(remote, "DRAM"), name, b"never")
    a.transfer(h)
    st0 = state(a, h)
    t0 = time.monotonic()
    released, tries = False, 0
    while not released and tries < 1000:
        tries += 1
        try:
            a.release_xfer_handle(h)
            released = True
        except Exception as e:
            if tries == 1:
                print(f"  release refused while settling: {type(e).__name__}", flush=True)
            time.sleep(0.001)
    took = time.monotonic() - t0
    after = int(np.count_nonzero(dst))
    time.sleep(0.5)
    late = int(np.count_nonzero(dst)) - after
    print(f"  READ {st0} when released; released after {tries} call(s), {took:.3f} s; "
          f"{after} bytes had landed, {late} after the release", flush=True)
    if not released or late != 0:
        fail("release of a running READ")
    link.send(cmd="notifs", want=1, bound=1)
    if link.recv()["notifs"]:
        fail("a cancelled READ sent its notification")
    link.send(cmd="exit")
    link.recv()
    release_stopped(size, params)
    print("ok: release", flush=True)


def release_stopped(size, params):
    """release_xfer_handle of a READ whose target is SIGSTOPped while its
    answers stream in: refused while the cancel cannot settle (NIXL then
    reports the request failed) or accepted once it did; either way no byte
    lands after the release returned, also when the target resumes."""
    p, link, hello = start_target(size, params)
    a = make_agent("decode-stopped", params)
    name = a.add_remote_agent(base64.b64decode(hello["meta"]))
    dst = np.zeros(size, dtype=np.uint8)
    register(a, dst)
    n = size // (1 << 20)
    local = [(dst.ctypes.data + i * (1 << 20), 1 << 20, 0) for i in range(n)]
    remote = [(hello["addr"] + i * (1 << 20), 1 << 20, 0) for i in range(n)]
    h = a.initialize_xfer("READ", a.get_xfer_descs(local, "DRAM"),
                          a.get_xfer_descs(remote, "DRAM"), name)
    t0 = time.monotonic()
    a.transfer(h)
    while not dst[::65536].any() and time.monotonic() - t0 < 5:
        time.sleep(0.0002)
    os.kill(hello["pid"], signal.SIGSTOP)
    st0 = state(a, h)
    t_stop = time.monotonic()
    refusals, released, after_refusal = 0, False, None
    while not released and time.monotonic() - t_stop < 15:
        try:
            a.release_xfer_handle(h)
            released = True
        except Exception:
            refusals += 1
            after_refusal = after_refusal or state(a, h)
            time.sleep(0.01)
    took = time.monotonic() - t_stop
    landed = int(np.count_nonzero(dst))
    os.kill(hello["pid"], signal.SIGCONT)
    time.sleep(1.0)
    late = int(np.count_nonzero(dst)) - landed
    print(f"  target stopped with the READ {st0}: release refused {refusals} time(s) "
          f"(state then {after_refusal}), released {took:.3f} s after the stop; "
          f"{landed} bytes had landed, {late} after the release (target resumed)", flush=True)
    if not released or late != 0 or (refusals and not str(after_refusal).startswith("ERR")):
        fail("release of a READ from a stopped target")
    link.send(cmd="exit")
    link.recv()


def case_params():
    a = nixl_agent("params", nixl_agent_config(backends=[]))
    for prm, ok in (({"port": "70000"}, False), ({"transport": "rdma"}, False),
                    ({"port": "x"}, False), ({"port": "0", "transport": "tcp"}, True)):
        try:
            a.create_backend(BACKEND, prm)
            created = True
        except Exception:  # nixlBackendError: the engine set initErr
            created = False
        print(f"  create_backend({prm}): {'created' if created else 'refused'}", flush=True)
        if created != ok:
            fail(f"backend parameters {prm}")
    print("ok: params", flush=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def case_socket_md():
    """Metadata through NIXL's own listener (fetch_remote_metadata /
    send_local_metadata, as NIXL's remoteMDFromSocket test): the backend's
    connection info and public data travel in NIXL's blobs, then a WRITE
    with a notification."""
    pt, pi = free_port(), free_port()
    t = nixl_agent("target", nixl_agent_config(enable_listen_thread=True, listen_port=pt,
                                               backends=[]))
    t.create_backend(BACKEND, {})
    i = nixl_agent("init", nixl_agent_config(enable_listen_thread=True, listen_port=pi,
                                             backends=[]))
    i.create_backend(BACKEND, {})
    size = 4 << 20
    tb, ib = np.zeros(size, dtype=np.uint8), pattern(size, 5)
    register(t, tb)
    register(i, ib)
    i.fetch_remote_metadata("target", "127.0.0.1", pt)
    i.send_local_metadata("127.0.0.1", pt)
    t0 = time.monotonic()
    while not i.check_remote_metadata("target") and time.monotonic() - t0 < 10:
        time.sleep(0.01)
    if not i.check_remote_metadata("target"):
        fail("metadata did not arrive through NIXL's listener")
    ld, _ = mixed_descs(ib.ctypes.data, size)
    rd, _ = mixed_descs(tb.ctypes.data, size)
    h = i.initialize_xfer("WRITE", i.get_xfer_descs(ld, "DRAM"), i.get_xfer_descs(rd, "DRAM"),
                          "target", b"via-socket")
    i.transfer(h)
    st = wait_state(i, h, 30)[0]
    n, t1 = {}, time.monotonic()
    while not n and time.monotonic() - t1 < 10:
        n = t.get_new_notifs()
    if st != "DONE" or not np.array_equal(ib, tb) or n != {"init": [b"via-socket"]}:
        fail(f"WRITE after socket metadata: {st}, notifications {n}")
    print("ok: socket_md", flush=True)

def vram_xfer(a, name, link, op, local, remote, msg, seed):
    """One WRITE or READ between this agent's (local: (descs, "DRAM"|"VRAM"))
    and the target's device memory; a WRITE's bytes are checked at the target
    the moment its notification arrives. Returns the final state."""
    h = a.initialize_xfer(op, a.get_xfer_descs(*local), a.get_xfer_descs(remote, "VRAM"), name,
                          msg.encode())
    if op == "WRITE":
        link.send(cmd="wait_notif", msg=msg, seed=seed)
        link.recv()
    if a.transfer(h) not in ("PROC", "DONE"):
        fail(f"{op} {local[1]}->VRAM not posted")
    st, took = wait_state(a, h, 30)
    hit = link.recv()["hit"] if op == "WRITE" else None
    print(f"  {op} {local[1]} {'->' if op == 'WRITE' else '<-'} VRAM: {st} after {took:.3f} s"
          + (f"; target's device bytes at the notification: {hit}" if op == "WRITE" else ""),
          flush=True)
    if st != "DONE" or (op == "WRITE" and (hit is None or hit["mismatched"] != 0 or
                                           hit["early"] != 0 or hit["agent"] != "decode")):
        fail(f"{op} {local[1]} with the target's VRAM: state {st}, notification {hit}")
    a.release_xfer_handle(h)


def delta(after, before):
    return {k: after[k] - before.get(k, 0) for k in after if after[k] != before.get(k, 0)}


def case_vram(target_mem="VRAM"):
    cuda_double()
    tr = os.environ.get("KVBRIDGE_TRANSPORT", "auto")
    size = 16 << 20
    p, link, hello = start_target(size, mem=target_mem)
    a = make_agent("decode")
    name = a.add_remote_agent(base64.b64decode(hello["meta"]))
    link.send(cmd="add_remote", meta=base64.b64encode(a.get_agent_metadata()).decode())
    link.recv()
    link.send(cmd="cuda_stats")
    t0, i0 = link.recv()["stats"], cuda_stats()
    remote, _ = mixed_descs(hello["addr"], size)
    how = "cuMemAlloc" if target_mem == "VRAM" else f"VMM, {size // VMM_PART} cuMemCreate handles"
    print(f"vram ({tr}): {len(remote)} descriptors, {size >> 20} MiB of the target's device "
          f"memory (the CUDA double's {how}, registered as VRAM device 0)", flush=True)
    # DRAM -> VRAM, and back VRAM -> DRAM into zeroed host memory
    src, back = pattern(size, 2), np.zeros(size, dtype=np.uint8)
    register(a, src)
    register(a, back)
    vram_xfer(a, name, link, "WRITE", (mixed_descs(src.ctypes.data, size)[0], "DRAM"), remote,
              "vram-write:dram", 2)
    vram_xfer(a, name, link, "READ", (mixed_descs(back.ctypes.data, size)[0], "DRAM"), remote,
              "vram-read:dram", 2)
    bad = int(np.count_nonzero(back != pattern(size, 2)))
    if bad:
        fail(f"READ VRAM -> DRAM: {bad} bytes differ")
    # VRAM -> VRAM both ways: this side's memory from the double as well
    dsrc, dback = Device(size), Device(size)
    dsrc.upload(pattern(size, 3))
    dback.upload(np.zeros(size, dtype=np.uint8))
    try:  # the wrong device id for the allocation (it is device 0's): refused
        a.register_memory([(dsrc.ptr, size, 1, "")], "VRAM", backends=[BACKEND])
        fail("device 0's memory registered as VRAM of device 1")
    except Exception as e:  # noqa: BLE001 - the class is NIXL's status
        print(f"  device 0's memory as VRAM device 1: {type(e).__name__}", flush=True)
    for d in (dsrc, dback):
        a.register_memory([(d.ptr, size, 0, "")], "VRAM", backends=[BACKEND])
    vram_xfer(a, name, link, "WRITE", (mixed_descs(dsrc.ptr, size)[0], "VRAM"), remote,
              "vram-write:vram", 3)
    vram_xfer(a, name, link, "READ", (mixed_descs(dback.ptr, size)[0], "VRAM"), remote,
              "vram-read:vram", 3)
    bad = int(np.count_nonzero(dback.download() != pattern(size, 3)))
    if bad:
        fail(f"READ VRAM -> VRAM: {bad} bytes differ")
    link.send(cmd="cuda_stats")
    td, idelta = delta(link.recv()["stats"], t0), delta(cuda_stats(), i0)
    print(f"  the double's counters during the transfers: initiator {idelta}; target {td} "
          f"(before them: {t0.get('vmm_exports')} VMM exports)", flush=True)
    # each of the 4 transfers' bytes pass through a driver copy exactly once
    if tr == "tcp":  # staged: the target's driver places and gathers all 4,
        # this side's the 2 with its own VRAM (stages the source, places the answer)
        lane = (td.get("bytes") == 4 * size and idelta.get("bytes") == 2 * size
                and not idelta.get("ipc_opens"))
    elif target_mem == "VMM":  # the target's handles exported as fds (at registration),
        parts = size // VMM_PART  # imported and mapped here
        lane = (t0.get("vmm_exports") == parts and idelta.get("vmm_imports") == parts and
                idelta.get("vmm_maps") == parts and not idelta.get("ipc_opens") and
                idelta.get("bytes") == 4 * size and not td.get("bytes"))
    else:  # this side opens the target's allocation (IPC) and its driver copies all
        lane = (idelta.get("ipc_opens", 0) > 0 and idelta.get("bytes") == 4 * size
                and not td.get("bytes"))
    if not lane:
        fail(f"the CUDA lane expected for transport {tr}, target memory {target_mem}, "
             "was not taken")
    link.send(cmd="exit")
    link.recv()
    print("ok: vram" + ("" if target_mem == "VRAM" else "_vmm"), flush=True)


def refused_main(lib):
    """One process whose kvbridge finds no usable driver at KVBRIDGE_CUDA_LIB."""
    os.environ["KVBRIDGE_CUDA_LIB"] = lib
    a = make_agent("refused")
    size = 1 << 20
    fake = np.zeros(size, dtype=np.uint8)  # what a caller believes is device memory
    try:
        a.register_memory([(fake.ctypes.data, size, 0, "")], "VRAM", backends=[BACKEND])
        fail("VRAM registered with no usable CUDA driver")
    except Exception as e:  # noqa: BLE001 - the class is NIXL's status
        print(f"  register_memory VRAM: {type(e).__name__}: {e}", flush=True)
    src, dst = pattern(size, 6), np.zeros(size, dtype=np.uint8)  # still serving DRAM
    register(a, src)
    register(a, dst)
    h = a.initialize_xfer("WRITE", a.get_xfer_descs([(src.ctypes.data, size, 0)], "DRAM"),
                          a.get_xfer_descs([(dst.ctypes.data, size, 0)], "DRAM"), "refused")
    a.transfer(h)
    if wait_state(a, h, 30)[0] != "DONE" or not np.array_equal(src, dst):
        fail("DRAM after the refused VRAM registration")
    print("  a DRAM WRITE afterwards: DONE, bytes equal", flush=True)
    print("refused-ok", flush=True)
    os._exit(0)


def case_vram_refused():
    for lib in ("/nonexistent/libcuda-missing.so.1", os.path.abspath(__file__)):
        r = subprocess.run([sys.executable, __file__, "--refused", lib], capture_output=True,
                           text=True, timeout=60)
        errs = [ln for ln in r.stderr.splitlines() if "kvbridge" in ln or "rror" in ln]
        print(f"KVBRIDGE_CUDA_LIB={lib}: exit {r.returncode}", flush=True)
        for ln in r.stdout.splitlines() + errs[:4]:
            print("  " + ln.strip(), flush=True)
        if r.returncode != 0 or "refused-ok" not in r.stdout:
            fail(f"KVBRIDGE_CUDA_LIB={lib}: the process did not refuse cleanly")
        if not any(lib in ln for ln in errs):
            fail(f"KVBRIDGE_CUDA_LIB={lib}: no error names the driver file")
    print("ok: vram_refused", flush=True)


CASES = {"params": case_params, "socket_md": case_socket_md, "write_read": case_write_read,
         "notif": case_notif, "local": case_local, "bounds": case_bounds, "kill": case_kill,
         "release": case_release, "vram": case_vram, "vram_vmm": lambda: case_vram("VMM"),
         "vram_refused": case_vram_refused}

if __name__ == "__main__":
    if sys.argv[1] == "--target":
        target_main(int(sys.argv[2]), int(sys.argv[3]), json.loads(sys.argv[4]), sys.argv[5])
    if sys.argv[1] == "--refused":
        refused_main(sys.argv[2])
    try:
        CASES[sys.argv[1]]()
    except SystemExit:
        raise
    except BaseException as e:  # noqa: BLE001 - report and exit without interpreter teardown
        import traceback
        traceback.print_exc()
        fail(f"{type(e).__name__}: {e}")
    sys.stdout.flush()
    os._exit(0)
