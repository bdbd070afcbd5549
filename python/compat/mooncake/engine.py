"""`mooncake.engine` drop-in: Mooncake's Python TransferEngine API over
kvbridge's engine (python/kvbridge, ctypes over libkvbridge.so).

Same names, argument orders, defaults and return conventions as Mooncake's
pybind module (mooncake-integration/transfer_engine/transfer_engine_py.cpp):
0 / -1 from the synchronous calls (never an exception for a failed
transfer), batch id 0 = failure, get_batch_transfer_status blocking until
all done (0) or one failed or passed its deadline (-1), transfer_check_status
1 done / 0 running / -1 failed / -2 past its deadline. One addition: a call
says a transfer failed, timed out or was freed only once nothing of it can
land any more on either side; where kvbridge cannot prove that (the peer
stopped answering with bytes in flight) it returns -3 instead (UNSETTLED)
and keeps the batch id valid (docs/python.md, "What failed, timed out and
freed mean"). A batch past its deadline is given up (kvb_xfer_expire) and
reported only once it ended. Peers are addressed by
the session id "ip:port" built from initialize()'s host and get_rpc_port();
remote addresses are raw virtual addresses inside memory the peer
registered. A write that returns 0 (or whose batch reports done) has every
byte in the target's memory; a read (the *_read calls, the READ opcode:
kvbridge's one-sided reads, kvb_engine_read*) that does has every byte in
the local buffers, and once a read's batch reports an end (done or failed)
no byte of it lands any more.

Mooncake 0.3.14's surface: batch_transfer_sync_write_pages and
batch_transfer_sync_read_pages (one C call each: kvb_engine_write_pages /
kvb_engine_read_pages turn the page grid into strided blocks; a read's
src_* columns stay local and dst_* remote, the bytes going dst -> src), the
*_arrays calls (numpy arrays read in place), nic_hint on every transfer
call is accepted; register_memory(..., remote_accessible=False) registers
a local-only region peers never see; the scatter calls return drain
tickets whose status says what kvbridge's engine can prove (_scatter.py);
SharedSegment on kvb_mem_alloc memory (_segment.py).

Differences, all explicit (docs/python.md, "Mooncake drop-in"):
- Raise NotImplementedError: the Mooncake Store hooks (get_engine,
  get_engine_ptr) and the CUDA-stream calls (*_on_cuda; SUPPORT_CUDA is
  False).
- Notifications (transfer_sync/batch_transfer_sync with a notify,
  get_notifies) ride kvbridge's engine notifications: drop-in to drop-in,
  delivered after the transfer's bytes.
- The RPC helpers (RpcInterface, ...) run on kvbridge's engine notifications
  (_rpc.py): a drop-in talks to a drop-in, not to coro_rpc.
- get_first_buffer_address answers the lowest-addressed region of the
  segment (kvbridge's handshake carries the table sorted by address);
  Mooncake's is the oldest registration still held.
- Only host memory: a write's source (a read's destination) must lie inside
  memory registered with this engine, the other side inside memory the peer
  registered.
- Only the P2PHANDSHAKE metadata mode; other metadata servers and device
  fabrics (nvlink, hip, musa, ascend, xgmi) make initialize() return -1.
"""

import ctypes
import ipaddress
import operator
import itertools
import logging
import os
import random
import re
import socket
import sys
import threading
import time
import weakref
from enum import IntEnum


def _import_kvbridge():
    """kvbridge from sys.path, else from the source tree this folder sits in
    (python/compat/mooncake → python/kvbridge)."""
    try:
        import kvbridge
        return kvbridge
    except ImportError:
        tree = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        if not os.path.isdir(os.path.join(tree, "kvbridge")):
            raise
        sys.path.append(tree)
        import kvbridge
        return kvbridge


kvbridge = _import_kvbridge()
from kvbridge import _lib as L  # noqa: E402  (the C prototypes and statuses)
from . import _rpc, _scatter, _segment  # noqa: E402

__all__ = [
    "InnerTransferEngine", "Read", "SUPPORT_CUDA", "SUPPORT_EFA", "SUPPORT_HIP",
    "SUPPORT_INTRA_NVLINK", "SUPPORT_MNNVL", "SUPPORT_MULTI_PROTOCOL", "SUPPORT_MUSA",
    "ScatterTransferCompletionStatus", "ScatterTransferTicket", "SharedSegment",
    "TransferEngine", "TransferNotify", "TransferOpcode", "Write",
]

log = logging.getLogger("mooncake.engine")

SUPPORT_CUDA = False
SUPPORT_EFA = False
SUPPORT_HIP = False
SUPPORT_MNNVL = False
SUPPORT_MUSA = False
SUPPORT_INTRA_NVLINK = False
SUPPORT_MULTI_PROTOCOL = False  # 0.3.14: one engine, one protocol (kvbridge picks the lane)

P2PHANDSHAKE = "P2PHANDSHAKE"

# Mooncake's error codes (mooncake-transfer-engine/include/error.h) that the
# memory calls return.
ERR_INVALID_ARGUMENT = -1
ERR_ADDRESS_NOT_REGISTERED = -3
ERR_ADDRESS_OVERLAPPED = -7
ERR_SOCKET = -102
ERR_MEMORY = -302
ERR_NOT_IMPLEMENTED = -303

_MEM_ERRORS = {
    L.KVB_ERR_INVALID: ERR_INVALID_ARGUMENT,
    L.KVB_ERR_OVERLAP: ERR_ADDRESS_OVERLAPPED,
    L.KVB_ERR_NOT_FOUND: ERR_ADDRESS_NOT_REGISTERED,
    L.KVB_ERR_NOMEM: ERR_MEMORY,
    L.KVB_ERR_UNSUPPORTED: ERR_NOT_IMPLEMENTED,
}

# Protocols naming device-memory fabrics kvbridge does not drive.
_DEVICE_PROTOCOLS = {"nvlink", "nvlink_intra", "hip", "musa", "ascend", "xgmi", "ubshmem"}


class TransferOpcode(IntEnum):
    """Mooncake's enum values: Read = 0, Write = 1."""
    Read = 0
    Write = 1


Read = TransferOpcode.Read
Write = TransferOpcode.Write


class TransferNotify:
    """A notification (name, msg), as Mooncake's: sent with transfer_sync /
    batch_transfer_sync once the transfer succeeded (kvbridge's engine
    notifications: delivered after every byte of it is visible at the
    target), read at the target with get_notifies()."""

    def __init__(self, name="", msg=""):
        self.name = name
        self.msg = msg

    def __repr__(self):
        return f"TransferNotify(name={self.name!r}, msg={self.msg!r})"


class InnerTransferEngine:
    """Mooncake's opaque C++ engine handle (for Mooncake Store). Not provided."""

    def __init__(self, *a, **k):
        raise TypeError("mooncake.engine.InnerTransferEngine: No constructor defined!")


# Mooncake's RPC helpers on kvbridge's engine notifications: _rpc.py.
RpcInterface = _rpc.RpcInterface
CoroRPCInterface = RpcInterface
ReceivedData = _rpc.ReceivedData
ReceivedTensor = _rpc.ReceivedTensor
create_rpc_client = _rpc.create_rpc_client
create_rpc_server = _rpc.create_rpc_server


# Scatter transfers with drain tickets (0.3.14): python/compat/mooncake/_scatter.py.
ScatterTransferCompletionStatus = _scatter.ScatterTransferCompletionStatus
ScatterTransferTicket = _scatter.ScatterTransferTicket


# SharedSegment (0.3.14): python/compat/mooncake/_segment.py.
SharedSegment = _segment.SharedSegment


# ------------------------------------------------------------------ helpers

def _atoi(s):
    """C atoi: leading optional sign and digits, 0 if none."""
    m = re.match(r"\s*([+-]?\d+)", s or "")
    return int(m.group(1)) if m else 0


def _transfer_timeout_s():
    """MC_TRANSFER_TIMEOUT in seconds (at least 5), default 30, as Mooncake
    reads it at construction."""
    v = os.environ.get("MC_TRANSFER_TIMEOUT")
    return float(max(5, _atoi(v))) if v is not None else 30.0


def _port_range():
    """[MC_MIN_RPC_PORT, MC_MAX_RPC_PORT] (Mooncake's typo'd MC_*_PRC_PORT
    too), default [15000, 17000]; an invalid range falls back to it, by
    Mooncake's rule (ValidatePortRange): both ends in [1024, 65535] outside
    the ephemeral [32768, 60999], lo <= hi (lo == hi: that one port)."""
    lo = os.environ.get("MC_MIN_RPC_PORT") or os.environ.get("MC_MIN_PRC_PORT")
    hi = os.environ.get("MC_MAX_RPC_PORT") or os.environ.get("MC_MAX_PRC_PORT")
    lo = _atoi(lo) if lo else 15000
    hi = _atoi(hi) if hi else 17000

    def ok(p):
        return 1024 <= p <= 65535 and not 32768 <= p <= 60999
    if not (ok(lo) and ok(hi) and lo <= hi):
        return 15000, 17000
    return lo, hi


def _parse_host(local_hostname):
    """The address part of initialize()'s local_hostname: "ip", "ip:port",
    "[v6]:port", a bare IPv6 address or Ascend's "ip:port:npu_N"."""
    h = local_hostname.strip()
    if h.startswith("["):
        end = h.find("]")
        return h[1:end] if end > 0 else h
    if h.count(":") >= 2:
        try:
            ipaddress.IPv6Address(h)
            return h
        except ValueError:
            return h.split(":", 1)[0]
    return h.split(":", 1)[0]


def _listen_addrs(host):
    """The addresses the engine would listen on for host (a numeric address
    or a name, resolved as kvb_engine_create does: getaddrinfo, passive,
    in its order). socket.gaierror when it does not resolve."""
    return [(fam, addr) for fam, _, _, _, addr in
            socket.getaddrinfo(host, 0, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)]


def _port_free(addrs, port):
    """Can one of addrs (from _listen_addrs) be bound on port now?"""
    for family, addr in addrs:
        s = socket.socket(family, socket.SOCK_STREAM)
        try:
            s.bind((addr[0], port) + tuple(addr[2:]))
            return True
        except OSError:
            continue
        finally:
            s.close()
    return False


def _u64_column(values, name, flat, col, n):
    """Store values (a list/sequence of ints or a numpy integer array) into
    column col of flat, a ctypes uint64 array of n rows × 3. No per-element
    Python loop: ctypes slice assignment (type-checked in C) or numpy."""
    np = L._numpy()
    if np is not None and isinstance(values, np.ndarray):
        if values.dtype.kind not in "iu" or values.ndim != 1:
            raise TypeError(f"{name}: expected a 1-D integer array, got {values.dtype} "
                            f"of shape {values.shape}")
        if values.dtype.kind == "i" and n and int(values.min()) < 0:
            raise TypeError(f"{name}: negative value")
        np.ctypeslib.as_array(flat).reshape(n, 3)[:, col] = values
        return
    flat[col::3] = values
    if n and (min(values) < 0 or max(values) > L.U64_MAX):
        raise TypeError(f"{name}: values must be in [0, 2**64)")


def _as_list(v, name):
    """A list, tuple or numpy array as is; another iterable as a list."""
    np = L._numpy()
    if isinstance(v, (list, tuple)) or (np is not None and isinstance(v, np.ndarray)):
        return v
    if isinstance(v, (str, bytes)):
        raise TypeError(f"{name}: expected a list of integers, not {type(v).__name__}")
    try:
        return list(v)
    except TypeError:
        raise TypeError(f"{name}: expected a list of integers, "
                        f"not {type(v).__name__}") from None


def _blocks(buffers, peer_addresses, lengths, read=False):
    """kvb_block_t array of the three lists (built in one go), its count and
    total bytes; None for the count when the lists differ in length.
    TypeError for values that are not unsigned integers (as pybind11 does).
    read: the peer's addresses are the blocks' src (kvb_engine_read)."""
    local, remote = (1, 0) if read else (0, 1)
    src = _as_list(buffers, "buffers")
    dst = _as_list(peer_addresses, "peer_buffer_addresses")
    lens = _as_list(lengths, "lengths")
    n = len(src)
    if len(dst) != n or len(lens) != n:
        return None, None, 0
    flat = (ctypes.c_uint64 * max(3 * n, 3))()
    if n:
        _u64_column(src, "buffers", flat, local, n)
        _u64_column(dst, "peer_buffer_addresses", flat, remote, n)
        _u64_column(lens, "lengths", flat, 2, n)
    total = int(lens.sum()) if hasattr(lens, "sum") else sum(lens)
    return ctypes.cast(flat, ctypes.POINTER(L.Block)), n, total


def _array_blocks(buffers, peer_addresses, lengths, read=False):
    """As _blocks, for the *_arrays calls: three 1-D contiguous arrays of
    8-byte integers (numpy or any buffer), read in place (no lists).
    ValueError (Mooncake's texts) for anything else, different lengths or
    negative values."""
    at = (1, 0, 2) if read else (0, 1, 2)  # the block column of each array
    cols = [L.i64_array(v, n) for v, n in ((buffers, "buffers"),
                                            (peer_addresses, "peer_buffer_addresses"),
                                            (lengths, "lengths"))]
    n = cols[0].rows
    if cols[1].rows != n or cols[2].rows != n:
        raise ValueError("buffers, peer_buffer_addresses and lengths must have the same length")
    flat = (ctypes.c_uint64 * max(3 * n, 3))()
    if n == 0:
        return ctypes.cast(flat, ctypes.POINTER(L.Block)), 0, 0
    np = L._numpy()
    total = 0
    if np is not None:
        out = np.ctypeslib.as_array(flat).reshape(-1, 3)
        for k, (c, name) in enumerate(zip(cols, ("buffers", "peer_buffer_addresses",
                                                 "lengths"))):
            a = c.array
            if not c.unsigned and int(a.min()) < 0:
                raise ValueError(f"{name} must not contain negative values")
            out[:n, at[k]] = a.view(np.uint64)
        total = int(out[:n, 2].sum(dtype=np.float64))
    else:
        for k, (c, name) in enumerate(zip(cols, ("buffers", "peer_buffer_addresses",
                                                 "lengths"))):
            vals = (ctypes.c_int64 * n).from_address(c.addr)
            if not c.unsigned and min(vals) < 0:
                raise ValueError(f"{name} must not contain negative values")
            flat[at[k]::3] = (ctypes.c_uint64 * n).from_address(c.addr)
        total = sum(flat[2::3])
    return ctypes.cast(flat, ctypes.POINTER(L.Block)), n, total


def _check_str(v, name):
    if not isinstance(v, str):
        raise TypeError(f"{name}: expected str, not {type(v).__name__}")
    if "\0" in v:
        raise ValueError(f"{name} must not contain NUL")
    return v


def _addr(v, name):
    if isinstance(v, bool) or not isinstance(v, int):
        try:
            v = operator.index(v)
        except TypeError:
            raise TypeError(f"{name}: expected int, not {type(v).__name__}") from None
    if v < 0 or v > L.U64_MAX:
        raise TypeError(f"{name}: {v} is not an unsigned 64-bit integer")
    return v


_cuda = False  # libcuda's cuPointerGetAttribute, None if the process has none


def _device_pointer(addr):
    """True when the CUDA driver this process already loaded (never loaded
    here) says addr is device memory that is not managed."""
    global _cuda
    if _cuda is False:
        try:
            lib = ctypes.CDLL("libcuda.so.1", mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
            f = lib.cuPointerGetAttribute
            f.restype = ctypes.c_int
            f.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint64]
            _cuda = f
        except (OSError, AttributeError):
            _cuda = None
    if _cuda is None:
        return False
    kind, managed = ctypes.c_uint(0), ctypes.c_int(0)
    if _cuda(ctypes.byref(kind), 2, addr) != 0:  # CU_POINTER_ATTRIBUTE_MEMORY_TYPE
        return False  # not a pointer CUDA knows: host memory
    if _cuda(ctypes.byref(managed), 8, addr) == 0 and managed.value:  # IS_MANAGED
        return False
    return kind.value == 2  # CU_MEMORYTYPE_DEVICE


# What the drop-in's batch calls return beyond Mooncake's numbers: the batch
# failed or timed out and is NOT settled: its peer stopped answering with
# bytes of it in flight, which may still be placed (at the peer for a write,
# here for a read). Its id stays valid; do not reuse its buffers.
UNSETTLED = -3


class _Batch:
    """One asynchronous batch: the kvbridge handle, its deadline, whether it
    was expired (given up past the deadline: kvb_xfer_expire)."""
    __slots__ = ("xfer", "deadline", "expired")

    def __init__(self, xfer, deadline):
        self.xfer = xfer
        self.deadline = deadline
        self.expired = False

    def test(self, now):
        """The kvbridge status (KVB_ERR_INPROGRESS while running); past the
        deadline the batch is expired first: cancelled and, should its peer
        not settle within the engine's peer time-out, its connection failed,
        so it ends within about two peer time-outs (non-blocking)."""
        lib = L.lib()
        st = lib.kvb_xfer_test(self.xfer)
        if st == L.KVB_ERR_INPROGRESS and now > self.deadline and not self.expired:
            lib.kvb_xfer_expire(self.xfer)
            self.expired = True
        return st

    def settled(self):
        """Final and nothing of it can still move (kvb_xfer_drained)."""
        return bool(L.lib().kvb_xfer_drained(self.xfer))

    def finish(self):
        """Expire the batch and wait for its end (bounded: the peer time-out
        twice, plus slack): its kvbridge status (INPROGRESS only if even a
        failed connection did not end it)."""
        self.test(float("inf"))
        return L.lib().kvb_xfer_wait(self.xfer, 2 * _PEER_TIMEOUT_S + 1.0)


def _peer_timeout_s():
    try:
        v = float(os.environ.get("KVBRIDGE_PEER_TIMEOUT", "2"))
    except ValueError:
        v = 2.0
    return v if v > 0 else 2.0


# The engine's peer time-out (kvbridge's default, KVBRIDGE_PEER_TIMEOUT):
# what an expired batch may take to end after its deadline, twice.
_PEER_TIMEOUT_S = _peer_timeout_s()


# Mooncake's notification (name, msg) in one kvbridge engine notification:
# magic, the name's length (4 bytes, little-endian), the name, the message.
_NOTIFY_MAGIC = b"MCN1"


def _notify_payload(method, notify):
    """notify (a TransferNotify or None) as the bytes to send, or None."""
    if notify is None:
        return None
    name, msg = getattr(notify, "name", None), getattr(notify, "msg", None)
    if not isinstance(name, str) or not isinstance(msg, str):
        raise TypeError(f"{method}: notify must be a TransferNotify(name: str, msg: str)")
    nb, mb = name.encode(), msg.encode()
    out = _NOTIFY_MAGIC + len(nb).to_bytes(4, "little") + nb + mb
    if len(out) > L.NOTIF_MAX_LEN:
        raise ValueError(f"{method}: notify name and msg exceed {L.NOTIF_MAX_LEN - 8} bytes")
    return out


def _notify_parse(sender, raw):
    """A received notification as a TransferNotify; a peer's bytes are
    hostile: anything not in our frame is the sender's name and the text."""
    if raw[:4] == _NOTIFY_MAGIC and len(raw) >= 8:
        n = int.from_bytes(raw[4:8], "little")
        if 8 + n <= len(raw):
            return TransferNotify(raw[8:8 + n].decode("utf-8", "replace"),
                                  raw[8 + n:].decode("utf-8", "replace"))
    return TransferNotify(sender, raw.decode("utf-8", "replace"))


# ------------------------------------------------------------------ engine

class TransferEngine:
    """Mooncake's TransferEngine over a kvbridge engine. Thread-safe, like
    Mooncake's (SGLang drives one engine from a pool of transfer threads);
    every C call releases the GIL."""

    def __init__(self):
        self._timeout_s = _transfer_timeout_s()
        self._eng = None  # kvbridge.TransferEngine once initialized
        self._names = ()  # the names this engine's segment goes by (initialize)
        self._lock = threading.Lock()
        self._batches = {}  # batch id → _Batch
        self._ids = itertools.count(1)
        self._managed = {}  # managed buffer address → kvbridge.SharedMemory
        self._tickets = weakref.WeakSet()  # scatter tickets, released before the engine

    TransferOpcode = TransferOpcode

    # ---------------------------------------------------------- life
    def initialize(self, local_hostname, metadata_server, protocol, device_name):
        """Start the engine: 0, or -1 (logged) when it cannot. Listens on the
        host of local_hostname at a random free port of [MC_MIN_RPC_PORT,
        MC_MAX_RPC_PORT] (15000-17000), as Mooncake's P2P mode does."""
        _check_str(metadata_server, "metadata_server")
        if metadata_server != P2PHANDSHAKE:
            log.error("mooncake.engine (kvbridge): metadata server %r is not supported; "
                      "use \"P2PHANDSHAKE\"", metadata_server)
            return -1
        return self.initialize_ext(local_hostname, P2PHANDSHAKE, protocol, device_name, "")

    def initialize_ext(self, local_hostname, metadata_server, protocol, device_name,
                       metadata_type):
        _check_str(local_hostname, "local_hostname")
        _check_str(metadata_server, "metadata_server")
        _check_str(protocol, "protocol")
        _check_str(device_name or "", "device_name")
        if metadata_server != P2PHANDSHAKE:
            log.error("mooncake.engine (kvbridge): metadata server %r (%s) is not supported; "
                      "use \"P2PHANDSHAKE\"", metadata_server, metadata_type)
            return -1
        proto = protocol.lower()
        if proto in _DEVICE_PROTOCOLS:
            log.error("mooncake.engine (kvbridge): protocol %r moves device memory; kvbridge "
                      "moves host memory only (use \"rdma\" or \"tcp\")", protocol)
            return -1
        with self._lock:
            if self._eng is not None:
                log.error("mooncake.engine (kvbridge): initialize() called twice")
                return -1
        if proto == "tcp" or os.environ.get("MC_FORCE_TCP") is not None:  # set = on, as Mooncake
            transport = "tcp"
        else:  # rdma, efa, cxi, barex, "": UCX picks the fastest lane
            transport = os.environ.get("KVBRIDGE_TRANSPORT", "auto")
            if transport not in L.TRANSPORTS:
                transport = "auto"
        host = _parse_host(local_hostname) or "127.0.0.1"
        eng = self._create(host, transport)
        if eng is None:
            return -1
        sid = eng.get_session_id()
        port = sid.rsplit(":", 1)[1]
        with self._lock:
            raced = self._eng is not None
            if not raced:
                self._eng = eng
                # Mooncake names its own segment host:port with the host as
                # given ("localhost:15123"); kvbridge's session id is numeric.
                self._names = (sid, f"{host}:{port}", f"[{host}]:{port}")
        if raced:  # another thread's initialize() won
            eng.close()
            log.error("mooncake.engine (kvbridge): initialize() called twice")
            return -1
        log.info("mooncake.engine (kvbridge): %s (%s) listening, protocol %r → %s",
                 eng.get_session_id(), kvbridge.library_path(), protocol, eng.transport)
        return 0

    def _create(self, host, transport):
        try:
            addrs = _listen_addrs(host)
        except (socket.gaierror, UnicodeError) as e:
            log.error("mooncake.engine (kvbridge): cannot start an engine: local host %r does "
                      "not resolve to an address: %s", host, getattr(e, "strerror", None) or e)
            return None
        lo, hi = _port_range()
        rng = random.SystemRandom()
        last, failures = None, 0
        for _ in range(128):
            port = rng.randint(lo, hi)
            if not _port_free(addrs, port):
                continue
            try:
                return kvbridge.TransferEngine(host, port, transport)
            except kvbridge.KVBridgeError as e:  # lost a race for the port?
                last, failures = e, failures + 1
                if failures >= 3:
                    break
            except (ValueError, OSError) as e:
                last = e
                break
        log.error("mooncake.engine (kvbridge): cannot start an engine on %s, port in "
                  "[%d, %d]: %s", host, lo, hi, last or "every port tried was busy")
        return None

    def close(self):
        """(kvbridge extra) Free the batches still held, the managed buffers
        and the engine now instead of at garbage collection."""
        with self._lock:
            batches, self._batches = list(self._batches.values()), {}
            managed, self._managed = list(self._managed.values()), {}
            tickets, self._tickets = list(self._tickets), weakref.WeakSet()
            eng, self._eng = self._eng, None
        for b in batches:  # the engine's end (below) ends what still runs
            L.lib().kvb_xfer_free(b.xfer)
        for t in tickets:
            t._release()
        if eng is not None:
            for m in managed:
                try:
                    eng.unregister(m.ptr)
                except Exception:
                    pass
            eng.close()
        for m in managed:
            m.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def _engine(self, what):
        eng = self._eng
        if eng is None:
            log.error("mooncake.engine (kvbridge): %s before initialize()", what)
        return eng

    def get_rpc_port(self):
        """The port of this engine's listener: peers use "ip:port"."""
        eng = self._eng
        if eng is None:
            raise RuntimeError("mooncake.engine (kvbridge): get_rpc_port() before initialize()")
        return int(eng.get_session_id().rsplit(":", 1)[1])

    # ---------------------------------------------------------- memory
    def register_memory(self, buffer_addr, capacity, location="*", remote_accessible=True):
        """0, or Mooncake's code: -1 invalid (zero length; device memory
        with remote_accessible=False), -7 overlapping a registered region,
        -303 device memory. remote_accessible=False (0.3.14): a local-only
        region (kvb_mem_region_ex_t.local_only): a source of this engine's
        transfers that peers never see (not in the table the handshake
        sends), so no peer can write into it or read from it."""
        if not isinstance(remote_accessible, (bool, int)):
            raise TypeError("remote_accessible: expected bool, not "
                            f"{type(remote_accessible).__name__}")
        buffer_addr = _addr(buffer_addr, "buffer_addr")
        capacity = _addr(capacity, "capacity")
        mem = self._mem_type(location, buffer_addr)
        eng = self._engine("register_memory")
        if eng is None:
            return -1
        with eng._guard:
            if remote_accessible:
                st = L.lib().kvb_engine_register(eng._h, buffer_addr, capacity, mem)
            else:
                r = L.MemRegionEx(L.MEM_REGION_FIELD_LOCAL_ONLY, buffer_addr, capacity, mem, -1, 1)
                st = L.lib().kvb_engine_register_ex(eng._h, ctypes.byref(r), 1,
                                                    ctypes.sizeof(r))
        return self._mem_result(eng, st, f"register_memory({buffer_addr:#x}, {capacity})")

    def unregister_memory(self, buffer_addr):
        """0, or -3 when no region starts at buffer_addr."""
        buffer_addr = _addr(buffer_addr, "buffer_addr")
        eng = self._engine("unregister_memory")
        if eng is None:
            return -1
        with eng._guard:
            st = L.lib().kvb_engine_unregister(eng._h, buffer_addr)
        return self._mem_result(eng, st, f"unregister_memory({buffer_addr:#x})")

    def batch_register_memory(self, buffer_addresses, capacities, location="*"):
        """All or nothing; 0 or Mooncake's code (-1 lists of different
        lengths or a zero capacity, -7 overlap)."""
        addrs = [_addr(a, "buffer_addresses") for a in buffer_addresses]
        caps = [_addr(c, "capacities") for c in capacities]
        mem = max([self._mem_type(location, a) for a in addrs] or [0])
        eng = self._engine("batch_register_memory")
        if eng is None:
            return -1
        if len(addrs) != len(caps):
            log.error("mooncake.engine (kvbridge): batch_register_memory: %d addresses, "
                      "%d capacities", len(addrs), len(caps))
            return ERR_INVALID_ARGUMENT
        if not addrs:
            return 0
        regs = (L.MemRegion * len(addrs))()
        for r, a, c in zip(regs, addrs, caps):
            r.addr, r.length, r.mem_type = a, c, mem
        with eng._guard:
            st = L.lib().kvb_engine_register_batch(eng._h, regs, len(addrs))
        return self._mem_result(eng, st, f"batch_register_memory of {len(addrs)} regions")

    def batch_unregister_memory(self, buffer_addresses):
        """Unregisters every address it can; 0 or -3 if one was unknown."""
        addrs = [_addr(a, "buffer_addresses") for a in buffer_addresses]
        eng = self._engine("batch_unregister_memory")
        if eng is None:
            return -1
        if not addrs:
            return 0
        arr = (ctypes.c_void_p * len(addrs))(*addrs)
        with eng._guard:
            st = L.lib().kvb_engine_unregister_batch(eng._h, arr, len(addrs))
        return self._mem_result(eng, st, f"batch_unregister_memory of {len(addrs)} regions")

    @staticmethod
    def _mem_type(location, addr):
        """KVB_MEM_HOST (0) or KVB_MEM_CUDA (1, which host-only builds answer
        KVB_ERR_UNSUPPORTED → -303): "cpu:N" is host, "cuda:N" (or any other
        device name) is not, "*" asks the CUDA driver when the process has
        one loaded (a GPU tensor's data_ptr() must not be taken for host
        memory: the engine would memcpy into it)."""
        _check_str(location, "location")
        loc = location.lower()
        if loc.startswith("cpu"):
            return 0
        if loc in ("*", ""):
            return 1 if _device_pointer(addr) else 0
        return 1

    @staticmethod
    def _mem_result(eng, st, what):
        if st == L.KVB_OK:
            return 0
        log.warning("mooncake.engine (kvbridge): %s failed: %s", what,
                    L.text(L.lib().kvb_engine_last_error(eng._h)) or L.status_string(st))
        return _MEM_ERRORS.get(st, -1)

    # ---------------------------------------------------------- sync writes
    def transfer_sync_write(self, target_hostname, buffer, peer_buffer_address, length,
                            transport_hint="", nic_hint=""):
        """Write length bytes from local buffer to peer_buffer_address of the
        engine at target_hostname ("ip:port"); 0 once they are in its memory,
        else -1 (bounds, unreachable or dead peer, MC_TRANSFER_TIMEOUT)."""
        return self._sync("transfer_sync_write", target_hostname, [buffer],
                          [peer_buffer_address], [length], transport_hint, nic_hint)

    def batch_transfer_sync_write(self, target_hostname, buffers, peer_buffer_addresses,
                                  lengths, transport_hint="", nic_hint=""):
        """Write every block; 0 once all bytes are in the peer's memory, -1
        otherwise (also for lists of different lengths). The hot path."""
        return self._sync("batch_transfer_sync_write", target_hostname, buffers,
                          peer_buffer_addresses, lengths, transport_hint, nic_hint)

    def transfer_sync(self, target_hostname, buffer, peer_buffer_address, length, opcode,
                      notify=None, transport_hint="", nic_hint=""):
        read = self._opcode("transfer_sync", opcode)
        payload = _notify_payload("transfer_sync", notify)
        rc = self._sync("transfer_sync", target_hostname, [buffer], [peer_buffer_address],
                        [length], transport_hint, nic_hint, read=read)
        return self._notify_after("transfer_sync", target_hostname, rc, payload)

    def batch_transfer_sync(self, target_hostname, buffers, peer_buffer_addresses, lengths,
                            opcode, notify=None, transport_hint="", nic_hint=""):
        read = self._opcode("batch_transfer_sync", opcode)
        payload = _notify_payload("batch_transfer_sync", notify)
        rc = self._sync("batch_transfer_sync", target_hostname, buffers,
                        peer_buffer_addresses, lengths, transport_hint, nic_hint, read=read)
        return self._notify_after("batch_transfer_sync", target_hostname, rc, payload)

    def _notify_after(self, what, target, rc, payload):
        """The notification of a transfer that succeeded (rc 0: every byte
        is at the target, so the notification follows them); -1 when it
        could not be sent. None sent for a failed transfer, as Mooncake."""
        if rc != 0 or payload is None:
            return rc
        try:
            self._eng.notify(target, payload, self._timeout_s)
        except kvbridge.KVBridgeError as e:
            log.warning("mooncake.engine (kvbridge): %s: the notification to %s failed: %s",
                        what, target, e)
            return -1
        return 0

    # ---------------------------------------------------------- sync reads
    def transfer_sync_read(self, target_hostname, buffer, peer_buffer_address, length,
                           transport_hint="", nic_hint=""):
        """Read length bytes from peer_buffer_address of the engine at
        target_hostname into local buffer (a one-sided read: nothing runs on
        the peer's side); 0 once they are here, else -1 (bounds, a revoked
        grant, unreachable or dead peer, MC_TRANSFER_TIMEOUT)."""
        return self._sync("transfer_sync_read", target_hostname, [buffer],
                          [peer_buffer_address], [length], transport_hint, nic_hint, read=True)

    def batch_transfer_sync_read(self, target_hostname, buffers, peer_buffer_addresses,
                                 lengths, transport_hint="", nic_hint=""):
        """Read every block (peer_buffer_addresses[i] -> buffers[i]); 0 once
        all bytes are here, -1 otherwise."""
        return self._sync("batch_transfer_sync_read", target_hostname, buffers,
                          peer_buffer_addresses, lengths, transport_hint, nic_hint, read=True)

    def batch_transfer_sync_read_arrays(self, target_hostname, buffers, peer_buffer_addresses,
                                        lengths, transport_hint="", nic_hint=""):
        """(0.3.14) batch_transfer_sync_read with arrays (as
        batch_transfer_sync_write_arrays)."""
        return self._sync("batch_transfer_sync_read_arrays", target_hostname, buffers,
                          peer_buffer_addresses, lengths, transport_hint, nic_hint,
                          arrays=True, read=True)

    def _sync(self, what, target, buffers, peers, lengths, hint, nic_hint, arrays=False,
              read=False):
        _check_str(target, "target_hostname")
        _check_str(hint, "transport_hint")  # honoured by Mooncake's TENT only
        _check_str(nic_hint, "nic_hint")  # UCX picks the devices (UCX_NET_DEVICES)
        if arrays:
            blocks, n, total = _array_blocks(buffers, peers, lengths, read)
        else:
            blocks, n, total = _blocks(buffers, peers, lengths, read)
        eng = self._engine(what)
        if eng is None:
            return -1
        if n is None:
            log.error("mooncake.engine (kvbridge): %s: buffers, peer_buffer_addresses and "
                      "lengths have different size", what)
            return -1
        if n == 0:
            return 0
        timeout = self._timeout_s + total * 1e-9  # Mooncake: timeout + 1 ns per byte
        fn = L.lib().kvb_engine_read if read else L.lib().kvb_engine_write
        with eng._guard:
            st = fn(eng._h, target.encode(), blocks, n, timeout)
            if st == L.KVB_OK:
                return 0
            log.warning("mooncake.engine (kvbridge): %s with %s (%d blocks, %d bytes) failed: %s",
                        what, target, n, total,
                        L.text(L.lib().kvb_engine_last_error(eng._h)) or L.status_string(st))
        return UNSETTLED if st == L.KVB_ERR_UNSETTLED else -1

    def batch_transfer_sync_write_arrays(self, target_hostname, buffers, peer_buffer_addresses,
                                         lengths, transport_hint="", nic_hint=""):
        """(0.3.14) batch_transfer_sync_write with three 1-D contiguous arrays
        of 8-byte integers (numpy uint64/int64, any buffer; read in place,
        never turned into lists). ValueError for another shape, layout or
        item size, different lengths or negative values; then 0 / -1 as
        batch_transfer_sync_write."""
        return self._sync("batch_transfer_sync_write_arrays", target_hostname, buffers,
                          peer_buffer_addresses, lengths, transport_hint, nic_hint,
                          arrays=True)

    def batch_transfer_sync_write_pages(self, target_hostname, src_pages, dst_pages, fields,
                                       max_batch_size=0, transport_hint="", nic_hint=""):
        """(0.3.14, TokenSpeed) Write a pages x fields grid and wait: fields is
        a C-contiguous [F, 5] array of 8-byte integers, rows (src_base,
        src_stride, dst_base, dst_stride, length); span (f, i) copies length
        bytes from local src_base + src_pages[i] * src_stride to the peer's
        dst_base + dst_pages[i] * dst_stride. One C call
        (kvb_engine_write_pages): the grid becomes strided blocks there,
        field-major, in batches of at most max_batch_size spans (0: one
        batch), each waited for (MC_TRANSFER_TIMEOUT + 1 ns per byte).
        ValueError for bad arguments (shape, item size, layout, different
        page counts, negative pages, a row without a positive length or
        with a negative stride, an overflowing address), nothing sent; an
        empty grid (N x F == 0) returns 0 once the shapes are right. Then 0
        once every byte is in the peer's memory, -1 otherwise (the first
        failing batch; later ones are not sent)."""
        return self._pages("batch_transfer_sync_write_pages", target_hostname, src_pages,
                           dst_pages, fields, max_batch_size, transport_hint, nic_hint, False)

    def batch_transfer_sync_read_pages(self, target_hostname, src_pages, dst_pages, fields,
                                      max_batch_size=0, transport_hint="", nic_hint=""):
        """(0.3.14) Read a pages x fields grid and wait: as
        batch_transfer_sync_write_pages with the bytes going the other way
        (kvb_engine_read_pages): the src_* columns and src_pages stay local,
        dst_* remote; span (f, i) copies length bytes from the peer's
        dst_base + dst_pages[i] * dst_stride into local src_base +
        src_pages[i] * src_stride. Same errors and return codes."""
        return self._pages("batch_transfer_sync_read_pages", target_hostname, src_pages,
                           dst_pages, fields, max_batch_size, transport_hint, nic_hint, True)

    def _pages(self, what, target_hostname, src_pages, dst_pages, fields, max_batch_size,
               transport_hint, nic_hint, read):
        _check_str(target_hostname, "target_hostname")
        _check_str(transport_hint, "transport_hint")
        _check_str(nic_hint, "nic_hint")
        try:
            mbs = operator.index(max_batch_size)
        except TypeError:
            raise TypeError(f"{what}: max_batch_size must be an int") from None
        if mbs < 0 or mbs > L.U64_MAX:
            raise ValueError(f"{what}: max_batch_size must be >= 0, got {mbs}")
        try:
            sp, dp, fl = L.pages_grid(src_pages, dst_pages, fields)
        except ValueError as e:
            raise ValueError(f"{what}: {e}") from None
        if sp.rows == 0 or fl.rows == 0:
            return 0
        eng = self._engine(what)
        if eng is None:
            return -1
        fn = L.lib().kvb_engine_read_pages if read else L.lib().kvb_engine_write_pages
        with eng._guard:
            st = fn(eng._h, target_hostname.encode(), sp.addr, dp.addr, sp.rows, fl.addr,
                    fl.rows, mbs, self._timeout_s)
            if st == L.KVB_OK:
                return 0
            log.warning("mooncake.engine (kvbridge): %s with %s (%d pages x %d fields) failed: %s",
                        what, target_hostname, sp.rows, fl.rows,
                        L.text(L.lib().kvb_engine_last_error(eng._h)) or L.status_string(st))
        return -1

    # ---------------------------------------------------------- async writes
    def batch_transfer_async_write(self, target_hostname, buffers, peer_buffer_addresses,
                                   lengths, transport_hint="", nic_hint=""):
        """Queue the batch; its id (≥ 1), or 0 when it could not be queued
        (bounds, unreachable peer, lists of different lengths)."""
        return self._submit("batch_transfer_async_write", target_hostname, buffers,
                            peer_buffer_addresses, lengths, transport_hint, nic_hint)

    def batch_transfer_async(self, target_hostname, buffers, peer_buffer_addresses, lengths,
                             opcode, transport_hint="", nic_hint=""):
        read = self._opcode("batch_transfer_async", opcode)
        return self._submit("batch_transfer_async", target_hostname, buffers,
                            peer_buffer_addresses, lengths, transport_hint, nic_hint, read=read)

    def batch_transfer_async_read(self, target_hostname, buffers, peer_buffer_addresses,
                                  lengths, transport_hint="", nic_hint=""):
        """Queue a one-sided read (peer_buffer_addresses[i] -> buffers[i]);
        its id (>= 1), or 0 when it could not be queued. Once its status
        reports an end, no byte of it lands any more."""
        return self._submit("batch_transfer_async_read", target_hostname, buffers,
                            peer_buffer_addresses, lengths, transport_hint, nic_hint, read=True)

    def batch_transfer_async_read_arrays(self, target_hostname, buffers,
                                         peer_buffer_addresses, lengths, transport_hint="",
                                         nic_hint=""):
        """(0.3.14) batch_transfer_async_read with arrays: batch id, or 0."""
        return self._submit("batch_transfer_async_read_arrays", target_hostname, buffers,
                            peer_buffer_addresses, lengths, transport_hint, nic_hint,
                            arrays=True, read=True)

    def transfer_submit_write(self, target_hostname, buffer, peer_buffer_address, length,
                              transport_hint="", nic_hint=""):
        """One block, asynchronously: batch id or 0; poll transfer_check_status."""
        return self._submit("transfer_submit_write", target_hostname, [buffer],
                            [peer_buffer_address], [length], transport_hint, nic_hint)

    def _submit(self, what, target, buffers, peers, lengths, hint, nic_hint, arrays=False,
                read=False):
        _check_str(target, "target_hostname")
        _check_str(hint, "transport_hint")
        _check_str(nic_hint, "nic_hint")
        if arrays:
            blocks, n, total = _array_blocks(buffers, peers, lengths, read)
        else:
            blocks, n, total = _blocks(buffers, peers, lengths, read)
        eng = self._engine(what)
        if eng is None:
            return 0
        if n is None:
            log.error("mooncake.engine (kvbridge): %s: buffers, peer_buffer_addresses and "
                      "lengths have different size", what)
            return 0
        deadline = time.monotonic() + self._timeout_s + total * 1e-9
        x = ctypes.c_void_p()
        with eng._guard:
            # An empty batch still gets a handle: kvbridge completes it at once.
            fn = L.lib().kvb_engine_read_async if read else L.lib().kvb_engine_write_async
            st = fn(eng._h, target.encode(), blocks, n, ctypes.byref(x))
            if st != L.KVB_OK:
                log.warning("mooncake.engine (kvbridge): %s with %s (%d blocks) failed: %s",
                            what, target, n,
                            L.text(L.lib().kvb_engine_last_error(eng._h)) or
                            L.status_string(st))
                return 0
        with self._lock:
            bid = next(self._ids)
            self._batches[bid] = _Batch(x.value, deadline)
        return bid

    def batch_transfer_async_write_arrays(self, target_hostname, buffers,
                                          peer_buffer_addresses, lengths, transport_hint="",
                                          nic_hint=""):
        """(0.3.14) batch_transfer_async_write with arrays (as
        batch_transfer_sync_write_arrays): batch id, or 0."""
        return self._submit("batch_transfer_async_write_arrays", target_hostname, buffers,
                            peer_buffer_addresses, lengths, transport_hint, nic_hint,
                            arrays=True)

    def transfer_check_status(self, batch_id):
        """Non-blocking. 1 done (id freed); 0 running, also while a batch past
        its deadline is being given up (at most about two peer time-outs
        more); -1 failed and settled (nothing of it lands any more; id
        freed); -2 past its deadline and settled (nothing lands any more;
        the id is kept, as Mooncake: later calls say -2 again, free it with
        batch_transfer_free); -3 (kvbridge) failed or timed out and NOT
        settled: bytes of it may still land (the id is kept; later calls
        say -3 again; do not reuse its buffers); -1 for an unknown id."""
        with self._lock:
            b = self._batches.get(batch_id)
            if b is None:
                log.error("mooncake.engine (kvbridge): transfer_check_status: unknown batch "
                          "id %r", batch_id)
                return -1
            st = b.test(time.monotonic())
            if st == L.KVB_ERR_INPROGRESS:
                return 0
            code = self._end_code(b, st)
            if code in (1, -1):
                del self._batches[batch_id]
        if code in (1, -1):
            self._report(b, st, batch_id)
            L.lib().kvb_xfer_free(b.xfer)
        return code

    @staticmethod
    def _end_code(b, st):
        """A final batch's code: 1 done, -1 failed, -2 timed out (both
        settled), UNSETTLED."""
        if st == L.KVB_OK:
            return 1
        if not b.settled():
            return UNSETTLED
        return -2 if b.expired else -1

    def get_batch_transfer_status(self, batch_ids):
        """Block until every batch is done (0, ids freed) or one failed or
        passed its deadline; then every batch still running is given up
        (expired) and waited for, at most about two peer time-outs: -1 when
        all of them settled (nothing of any lands any more; every id freed,
        as Mooncake), -3 (kvbridge) when one did not (bytes of it may still
        land): the ids of the unsettled batches stay valid (batch_transfer_poll,
        batch_transfer_free), the others are freed."""
        ids = list(batch_ids)
        with self._lock:
            owned = [(i, self._batches.pop(i, None)) for i in ids]
        failed = any(b is None for _, b in owned)
        if failed:
            log.error("mooncake.engine (kvbridge): get_batch_transfer_status: unknown batch "
                      "id(s) %s", [i for i, b in owned if b is None])
        pending = [(i, b) for i, b in owned if b is not None]
        lib = L.lib()
        while pending and not failed:
            still = []
            for i, b in pending:
                st = lib.kvb_xfer_test(b.xfer)
                if st == L.KVB_ERR_INPROGRESS:
                    still.append((i, b))
                    if time.monotonic() > b.deadline:
                        log.warning("mooncake.engine (kvbridge): batch %d timed out", i)
                        failed = True
                    continue
                if st != L.KVB_OK:
                    self._report(b, st, i)
                    failed = True
                    if not b.settled():
                        still.append((i, b))  # kept: its id stays valid
                        continue
                lib.kvb_xfer_free(b.xfer)
            pending = still
            if pending and not failed:
                # Sleep until the first unfinished batch ends; the others are
                # re-checked at least every 50 ms (Mooncake spins instead).
                left = pending[0][1].deadline - time.monotonic()
                lib.kvb_xfer_wait(pending[0][1].xfer, max(min(left, 0.05), 0.001))
        kept = self._settle(pending)
        return UNSETTLED if kept else -1 if failed else 0

    def _settle(self, pending, keep=True):
        """Give up the (id, batch) pairs and wait for their ends; free the
        settled ones, and the others too unless keep (then they stay under
        their ids). The ids of those that did not settle."""
        for _, b in pending:
            b.test(float("inf"))
        kept = []
        for i, b in pending:
            if b.finish() == L.KVB_ERR_INPROGRESS or not b.settled():
                log.error("mooncake.engine (kvbridge): batch %d did not settle: bytes of it "
                          "may still land (%s)%s", i,
                          L.text(L.lib().kvb_xfer_error(b.xfer)) or "still running",
                          "; its id stays valid" if keep else "")
                kept.append((i, b))
                if keep:
                    continue
            L.lib().kvb_xfer_free(b.xfer)
        if kept and keep:
            with self._lock:
                self._batches.update(kept)
        return [i for i, _ in kept]

    def batch_transfer_poll(self, batch_ids):
        """(Not yet in Mooncake's release) Non-blocking, idempotent: per id 0
        done, 1 in flight (also while being given up past its deadline), -1
        failed and settled or unknown, -3 failed and not settled. Ids are not
        freed."""
        out = []
        now = time.monotonic()
        with self._lock:
            for i in batch_ids:
                b = self._batches.get(i)
                st = L.KVB_ERR_INVALID if b is None else b.test(now)
                out.append(1 if st == L.KVB_ERR_INPROGRESS else 0 if st == L.KVB_OK else
                           -1 if b is None or b.settled() else UNSETTLED)
        return out

    def batch_transfer_free(self, batch_ids):
        """(Not yet in Mooncake's release) Free ids (unknown ones are
        ignored). Running ones are given up (expired) and waited for first,
        at most about two peer time-outs. 0 when every batch freed had
        settled; -3 when one had not: it is freed all the same (the caller
        asked), but bytes of it may still land (do not reuse its buffers
        before its peer is known dead)."""
        with self._lock:
            owned = [(i, self._batches.pop(i)) for i in batch_ids if i in self._batches]
        return UNSETTLED if self._settle(owned, keep=False) else 0

    @staticmethod
    def _report(b, st, bid):
        if st != L.KVB_OK:
            log.warning("mooncake.engine (kvbridge): batch %d failed: %s", bid,
                        L.text(L.lib().kvb_xfer_error(b.xfer)) or L.status_string(st))

    # ---------------------------------------------------------- helpers of Mooncake
    def allocate_managed_buffer(self, length):
        """Host memory of length bytes registered with this engine (kvbridge
        shared memory: same-host writers fill it directly); 0 on failure."""
        length = _addr(length, "length")
        eng = self._engine("allocate_managed_buffer")
        if eng is None or length == 0:
            return 0
        try:
            m = kvbridge.SharedMemory(length)
        except Exception as e:
            log.warning("mooncake.engine (kvbridge): allocate_managed_buffer(%d): %s", length, e)
            return 0
        if self.register_memory(m.ptr, length) != 0:
            m.close()
            return 0
        with self._lock:
            self._managed[m.ptr] = m
        return m.ptr

    def free_managed_buffer(self, buffer_addr, length):
        """Unregister and free a buffer of allocate_managed_buffer; 0."""
        buffer_addr = _addr(buffer_addr, "buffer_addr")
        with self._lock:
            m = self._managed.pop(buffer_addr, None)
        if m is None:
            log.error("mooncake.engine (kvbridge): free_managed_buffer: %#x was not "
                      "allocated by allocate_managed_buffer", buffer_addr)
            return -1
        self.unregister_memory(buffer_addr)
        m.close()
        return 0

    def write_bytes_to_buffer(self, dest_address, src, length):
        """memcpy of length bytes of src to dest_address; 0."""
        dest_address = _addr(dest_address, "dest_address")
        length = _addr(length, "length")
        if isinstance(src, str):
            src = src.encode()
        data = bytes(src)
        if length > len(data):
            raise ValueError(f"write_bytes_to_buffer: length {length} > len(src) {len(data)}")
        ctypes.memmove(dest_address, data, length)
        return 0

    def read_bytes_from_buffer(self, source_address, length):
        """length bytes at source_address, as bytes."""
        return ctypes.string_at(_addr(source_address, "source_address"),
                                _addr(length, "length"))

    def get_local_topology(self, device_name=None):
        """Mooncake's HCA topology JSON; kvbridge's UCX picks devices itself: "{}"."""
        return "{}"

    def warmup_efa_segment(self, segment_name):
        return 0

    def send_probe(self, peer_server_name):
        """0 when the engine at peer_server_name ("ip:port") answers a
        handshake within MC_HANDSHAKE_CONNECT_TIMEOUT s (default 5), else
        -102 (Mooncake's ERR_SOCKET; -1 before initialize()).
        (An empty write: kvbridge connects, or reuses the live connection,
        and moves no byte.)"""
        _check_str(peer_server_name, "peer_server_name")
        eng = self._engine("send_probe")
        if eng is None:
            return -1
        timeout = float(_atoi(os.environ.get("MC_HANDSHAKE_CONNECT_TIMEOUT")) or 5)
        probe = (L.Block * 1)()  # one zero-length block
        with eng._guard:
            st = L.lib().kvb_engine_write(eng._h, peer_server_name.encode(), probe, 1, timeout)
            if st != L.KVB_OK:
                log.info("mooncake.engine (kvbridge): send_probe(%s): %s", peer_server_name,
                         L.text(L.lib().kvb_engine_last_error(eng._h)) or L.status_string(st))
        return 0 if st == L.KVB_OK else ERR_SOCKET

    # ---------------------------------------------------------- not provided
    def _not_implemented(self, method, why):
        raise NotImplementedError(f"mooncake.engine.TransferEngine.{method}: {why} "
                                  f"(kvbridge's mooncake.engine drop-in)")

    @staticmethod
    def _opcode(method, opcode):
        """True for READ (a one-sided read), False for WRITE."""
        try:
            op = int(opcode)
        except (TypeError, ValueError):
            raise TypeError(f"{method}: opcode must be a TransferOpcode") from None
        if op not in (TransferOpcode.Read, TransferOpcode.Write):
            raise ValueError(f"{method}: unknown opcode {opcode!r}")
        return op == TransferOpcode.Read

    # ---------------------------------------------------------- scatter (0.3.14)
    def _scatter(self, what, read, endpoint, args, sync):
        eng = self._eng
        if eng is None:
            raise RuntimeError(f"mooncake.engine (kvbridge): {what} before initialize()")
        t = _scatter.run(eng, read, endpoint, args, self._timeout_s, sync)
        with self._lock:
            self._tickets.add(t)
        return t

    def submit_scatter_write(self, endpoint, local_base_addresses, local_capacities,
                             remote_base_addresses, remote_capacities, local_offsets,
                             remote_offsets, lengths):
        """(0.3.14) Start writing the fragments (range r's fragment j: lengths[r][j]
        bytes from local_base_addresses[r] + local_offsets[r][j] to
        remote_base_addresses[r] + remote_offsets[r][j], offsets bounded by
        the capacities) as one kvbridge transfer; returns its
        ScatterTransferTicket at once (_scatter.py says what each status
        proves). ValueError / TypeError for a malformed call, nothing sent;
        a fragment outside the registrations or an unreachable peer gives a
        FAILED_DRAINED ticket (nothing was sent)."""
        return self._scatter("submit_scatter_write", False, endpoint,
                             (local_base_addresses, local_capacities, remote_base_addresses,
                              remote_capacities, local_offsets, remote_offsets, lengths), False)

    def submit_scatter_read(self, endpoint, local_base_addresses, local_capacities,
                            remote_base_addresses, remote_capacities, local_offsets,
                            remote_offsets, lengths):
        """(0.3.14) As submit_scatter_write, reading: lengths[r][j] bytes from
        the peer's remote_base_addresses[r] + remote_offsets[r][j] into
        local_base_addresses[r] + local_offsets[r][j] (kvb_engine_read)."""
        return self._scatter("submit_scatter_read", True, endpoint,
                             (local_base_addresses, local_capacities, remote_base_addresses,
                              remote_capacities, local_offsets, remote_offsets, lengths), False)

    def scatter_transfer_sync_write_with_ticket(self, endpoint, local_base_addresses,
                                                local_capacities, remote_base_addresses,
                                                remote_capacities, local_offsets,
                                                remote_offsets, lengths):
        """(0.3.14) submit_scatter_write, then wait until it ends or passes its
        deadline (MC_TRANSFER_TIMEOUT + 1 ns per byte); past it the
        operation is cancelled and given 5 s to settle, and a peer that does
        not settle is declared lost (its session closed, as
        batch_transfer_sync_write does): the ticket then says
        COMPLETION_UNKNOWN when bytes were in flight. Returns the ticket."""
        return self._scatter("scatter_transfer_sync_write_with_ticket", False, endpoint,
                             (local_base_addresses, local_capacities, remote_base_addresses,
                              remote_capacities, local_offsets, remote_offsets, lengths), True)

    def scatter_transfer_sync_read_with_ticket(self, endpoint, local_base_addresses,
                                               local_capacities, remote_base_addresses,
                                               remote_capacities, local_offsets,
                                               remote_offsets, lengths):
        """(0.3.14) As scatter_transfer_sync_write_with_ticket, reading (as
        submit_scatter_read)."""
        return self._scatter("scatter_transfer_sync_read_with_ticket", True, endpoint,
                             (local_base_addresses, local_capacities, remote_base_addresses,
                              remote_capacities, local_offsets, remote_offsets, lengths), True)

    def get_notifies(self):
        """The notifications received and not yet taken, oldest first, as
        TransferNotify(name, msg) (the sender's name and message); [] when
        none or before initialize(). Never blocks. A plain kvbridge engine
        notification (not a Mooncake one) comes with the sending engine's
        name and its bytes as text."""
        eng = self._eng
        if eng is None:
            return []
        return [_notify_parse(sender, raw) for sender, raw in eng.get_notifs()]

    def get_first_buffer_address(self, segment_name):
        """The address of the first region the engine segment_name registered
        for peers, 0 when it registered none or cannot be reached (logged), as
        Mooncake. segment_name: a peer's "host:port" (a host name too), or
        this engine's own (its session id, or initialize()'s host with
        get_rpc_port(), as Mooncake names it): its own table, no connection.
        A peer's table is the one its handshake sent (kvb_engine_peer_regions:
        connecting first, within MC_HANDSHAKE_CONNECT_TIMEOUT s, default 5; a
        registration it made since is seen). "First" is the lowest address:
        the handshake carries the table sorted by address, where Mooncake
        answers the oldest registration still held; the same for an engine
        with one region."""
        _check_str(segment_name, "segment_name")
        eng = self._engine("get_first_buffer_address")
        if eng is None:
            return 0
        sid = eng.get_session_id() if segment_name in self._names else segment_name
        timeout = float(_atoi(os.environ.get("MC_HANDSHAKE_CONNECT_TIMEOUT")) or 5)
        addr, n = ctypes.c_uint64(0), ctypes.c_size_t(0)
        with eng._guard:
            st = L.lib().kvb_engine_peer_regions(eng._h, sid.encode(), timeout,
                                                 ctypes.byref(addr), None, 1, ctypes.byref(n))
            if st != L.KVB_OK:
                log.warning("mooncake.engine (kvbridge): get_first_buffer_address(%s): %s",
                            segment_name, L.text(L.lib().kvb_engine_last_error(eng._h)) or
                            L.status_string(st))
                return 0
        return addr.value if n.value else 0

    def get_engine(self):
        self._not_implemented("get_engine", "a Mooncake Store hook; there is no C++ "
                                            "Mooncake engine to share")

    def get_engine_ptr(self):
        self._not_implemented("get_engine_ptr", "a Mooncake Store hook; there is no C++ "
                                                "Mooncake engine to share")

    def _no_cuda(self, method):
        self._not_implemented(method, "a CUDA-build call and this build has no CUDA "
                                      "(SUPPORT_CUDA is False)")

    def transfer_write_on_cuda(self, target_hostname, buffer, peer_buffer_address, length,
                               stream_ptr=0, transport_hint="", nic_hint=""):
        self._no_cuda("transfer_write_on_cuda")

    def transfer_read_on_cuda(self, target_hostname, buffer, peer_buffer_address, length,
                              stream_ptr=0, transport_hint="", nic_hint=""):
        self._no_cuda("transfer_read_on_cuda")

    def batch_transfer_write_on_cuda(self, target_hostname, buffers, peer_buffer_addresses,
                                     lengths, stream_ptr=0, transport_hint="", nic_hint=""):
        self._no_cuda("batch_transfer_write_on_cuda")

    def batch_transfer_read_on_cuda(self, target_hostname, buffers, peer_buffer_addresses,
                                    lengths, stream_ptr=0, transport_hint="", nic_hint=""):
        self._no_cuda("batch_transfer_read_on_cuda")
