"""Mooncake's RPC helpers (RpcInterface, ReceivedData, ReceivedTensor,
create_rpc_client/server; mooncake-transfer-engine's rpc_interface.cpp) on
kvbridge's engine notifications (kvb_engine_notify / kvb_engine_get_notifs,
docs/engine.md "Notifications").

Mooncake sends each message as one coro_rpc call and send_data returns 0
once the server ran its handler, -1 otherwise. Here a message goes as
notifications of at most 64 KiB each (a 32-byte header: magic, kind,
message id, offset, total length; the parts of one message may interleave
with others' and are put together by (sender, id)), and the server answers
the complete message with an acknowledgement notification to the sender's
session id; send_data returns 0 once that came, -1 when a part could not
be sent or no answer came within timeout_seconds. A kvbridge drop-in talks
to a kvbridge drop-in only (so does its TransferEngine): the wire is not
coro_rpc. Every part is hostile: a wrong header, a message over
_MAX_MESSAGE, parts past the total or overlapping are dropped (logged);
partial messages are bounded in bytes (_MAX_PENDING) and age
(timeout_seconds)."""

import ctypes
import logging
import os
import queue
import random
import struct
import threading
import time
import weakref

log = logging.getLogger("mooncake.engine")

_MAGIC = b"KVBR"
_HDR = struct.Struct("<4sBBHQQQ")  # magic, kind, flags, zero, id, offset, total
_PART, _ACK = 1, 2
_NOTIF_MAX = 64 << 10
_CHUNK = _NOTIF_MAX - _HDR.size
_MAX_MESSAGE = 256 << 20  # one message, bytes
_MAX_PENDING = 512 << 20  # partial messages held, bytes in all
_TENSOR_META = 4 + 4 + 4 * 8  # Mooncake's TENSOR_METADATA_SIZE
_DTYPES = {1: "float16", 2: "float32", 3: "float64", 4: "int8", 5: "int16", 6: "int32",
           7: "int64", 8: "uint8", 9: "bool"}
_DTYPE_IDS = {v: k for k, v in _DTYPES.items()}
_ACKS_QUEUED = 4096  # answers waiting to be sent; past it one is dropped (the sender times out)


def _no_constructor(name):
    raise TypeError(f"mooncake.engine.{name}: No constructor defined!")


class ReceivedData:
    """A received message (Mooncake binds it without a constructor; its data
    callback gets a dict {"source": str, "data": bytes})."""

    def __init__(self, *a, **k):
        _no_constructor("ReceivedData")

    @classmethod
    def _make(cls, source, data):
        self = object.__new__(cls)
        self._source, self._data = source, bytes(data)
        return self

    @property
    def source_address(self):
        return self._source

    @property
    def data_size(self):
        return len(self._data)

    def get_bytes(self):
        return self._data

    def get_memory_view(self):
        return memoryview(self._data)


class ReceivedTensor:
    """What the tensor callback gets: the raw message (metadata header and
    data, as Mooncake passes it), its shape and dtype name."""

    def __init__(self, *a, **k):
        _no_constructor("ReceivedTensor")

    @classmethod
    def _make(cls, source, data, shape, dtype):
        self = object.__new__(cls)
        self._source, self._data, self._shape, self._dtype = source, bytes(data), shape, dtype
        return self

    @property
    def source_address(self):
        return self._source

    @property
    def shape(self):
        return list(self._shape)

    @property
    def dtype(self):
        return self._dtype

    @property
    def total_bytes(self):
        return 0  # Mooncake leaves it 0 on the receiving side

    def get_data_size(self):
        return len(self._data)

    def get_data_as_bytes(self):
        return self._data

    def get_memory_view(self):
        return memoryview(self._data)


def _tensor_info(data):
    """(shape, dtype name) when data looks like a tensor message by
    Mooncake's rule (handleIncomingData: dtype id 1..9 and ndim <= 4 in its
    first 8 bytes, at least 40 bytes), else None."""
    if len(data) < _TENSOR_META:
        return None
    dtype, ndim = struct.unpack_from("<II", data, 0)
    if not (0 < dtype <= 9 and ndim <= 4):
        return None
    shape = []
    for d in struct.unpack_from("<4q", data, 8)[:ndim]:
        if d >= 1 << 48:
            return None
        if d > 0:
            shape.append(d)
    return shape, _DTYPES[dtype]


def _parse_listen(addr):
    """("host", port) of "host:port" / "[v6]:port"; ValueError otherwise."""
    if addr.startswith("["):
        host, _, port = addr[1:].partition("]:")
    else:
        host, _, port = addr.rpartition(":")
    return host or "0.0.0.0", int(port)


class RpcInterface:
    """Mooncake's RpcInterface (alias CoroRPCInterface) on a kvbridge engine
    of its own: a server listens on initialize's listen_address, a client
    on MC_TCP_BIND_ADDRESS (default 127.0.0.1) at a free port, where
    servers send their acknowledgements (a client on another host than its
    server needs MC_TCP_BIND_ADDRESS set to an address the server reaches)."""

    def __init__(self):
        self._eng = None
        self._timeout = 30.0
        self._started = False
        self._stop = threading.Event()
        self._served = threading.Event()
        self._thread = None
        self._cv = threading.Condition()
        self._waiting = set()  # ids of this interface's messages awaiting their answer
        self._acks = set()  # ... and those answered
        self._answers = queue.Queue(_ACKS_QUEUED)  # (sender, id) to answer
        self._parts = {}  # (sender, id) -> [bytearray, received, first seen]
        self._pending = 0
        self._data_cb = None
        self._tensor_cb = None

    # ---------------------------------------------------------- life
    def initialize(self, listen_address="", thread_count=0, timeout_seconds=30, pool_size=100):
        import kvbridge
        if self._eng is not None:
            log.error("mooncake.engine (kvbridge): RpcInterface.initialize() called twice")
            return False
        self._timeout = float(max(1, int(timeout_seconds)))
        try:
            if listen_address:
                host, port = _parse_listen(listen_address)
            else:
                host, port = os.environ.get("MC_TCP_BIND_ADDRESS") or "127.0.0.1", 0
            self._eng = kvbridge.TransferEngine(host, port, serve_reads=False)
        except (ValueError, OSError, kvbridge.KVBridgeError) as e:
            log.error("mooncake.engine (kvbridge): RpcInterface on %r: %s", listen_address, e)
            return False
        self._server = bool(listen_address)
        # The threads hold the interface weakly: dropping it closes it.
        ref = weakref.ref(self)
        self._thread = threading.Thread(target=_receive_loop, args=(ref,), name="mooncake-rpc",
                                        daemon=True)
        self._thread.start()
        threading.Thread(target=_answer_loop, args=(ref, self._answers, self._stop),
                         name="mooncake-rpc-answers", daemon=True).start()
        return True

    def initialize_client(self, pool_size=100, timeout_seconds=30):
        return self.initialize("", 0, timeout_seconds, pool_size)

    def initialize_server(self, listen_address, thread_count=8, timeout_seconds=30):
        return self.initialize(listen_address, thread_count, timeout_seconds, 100)

    def start_server_async(self):
        if self._eng is None or not self._server:
            return False
        self._started = True
        return True

    def start_server(self):
        """Serve until stop_server() (Mooncake's blocking start)."""
        if not self.start_server_async():
            return False
        self._served.wait()
        return True

    def stop_server(self):
        self._started = False
        self._served.set()

    def close(self):
        """(kvbridge extra) Stop the receiver and close the engine."""
        self.stop_server()
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(5)
        eng, self._eng = self._eng, None
        if eng is not None:
            eng.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    # ---------------------------------------------------------- sending
    def send_data(self, target_address, data):
        """0 once the server at target_address ("host:port") took the whole
        message, -1 otherwise (not initialized, unreachable, no answer
        within timeout_seconds)."""
        if self._eng is None:
            return -1
        try:
            payload = memoryview(data).tobytes()  # bytes-like only (not an int's zeros)
        except TypeError:
            log.error("mooncake.engine (kvbridge): send_data: data must be bytes-like")
            return -1
        return self._send(target_address, payload)

    def send_tensor(self, target_address, tensor):
        """A host tensor (data_ptr, numel, element_size, shape, dtype) as
        Mooncake frames it: 40 bytes of metadata (dtype id, ndim, 4 dims),
        then its bytes. 0 / -1 as send_data."""
        if self._eng is None:
            return -1
        for a in ("data_ptr", "numel", "element_size", "shape", "dtype"):
            if not hasattr(tensor, a):
                log.error("mooncake.engine (kvbridge): send_tensor: not a tensor (no %s)", a)
                return -1
        if getattr(tensor, "is_cuda", False):
            log.error("mooncake.engine (kvbridge): send_tensor: device tensors are not sent")
            return -1
        shape = [int(d) for d in tuple(tensor.shape)]
        name = str(tensor.dtype).rsplit(".", 1)[-1]
        if len(shape) > 4 or name not in _DTYPE_IDS:
            log.error("mooncake.engine (kvbridge): send_tensor: %s of %d dims not supported",
                      name, len(shape))
            return -1
        n = int(tensor.numel()) * int(tensor.element_size())
        meta = struct.pack("<II4q", _DTYPE_IDS[name], len(shape), *(shape + [0] * (4 - len(shape))))
        return self._send(target_address, meta + ctypes.string_at(int(tensor.data_ptr()), n))

    def send_data_async(self, target_address, data, loop):
        return self._future(loop, lambda: self.send_data(target_address, data), "Send data")

    def send_tensor_async(self, target_address, tensor, loop):
        return self._future(loop, lambda: self.send_tensor(target_address, tensor),
                            "Send tensor")

    def _future(self, loop, call, what):
        fut = loop.create_future()
        if self._eng is None:
            fut.set_exception(RuntimeError("Communicator not initialized"))
            return fut

        def run():
            rc = call()
            if rc >= 0:
                loop.call_soon_threadsafe(fut.set_result, rc)
            else:
                loop.call_soon_threadsafe(fut.set_exception, RuntimeError(f"{what} failed"))
        threading.Thread(target=run, daemon=True).start()
        return fut

    def _send(self, target, payload):
        import kvbridge
        mid = random.getrandbits(64) or 1
        with self._cv:
            self._waiting.add(mid)
        total = len(payload)
        deadline = time.monotonic() + self._timeout
        try:
            for off in range(0, max(total, 1), _CHUNK):
                part = _HDR.pack(_MAGIC, _PART, 0, 0, mid, off, total) + payload[off:off + _CHUNK]
                self._eng.notify(target, part, timeout=max(deadline - time.monotonic(), 0.001))
        except (kvbridge.KVBridgeError, RuntimeError) as e:
            log.error("mooncake.engine (kvbridge): send to %s failed: %s", target, e)
            with self._cv:
                self._waiting.discard(mid)
            return -1
        with self._cv:
            try:
                while mid not in self._acks:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        log.error("mooncake.engine (kvbridge): %s did not answer within %g s",
                                  target, self._timeout)
                        return -1
                    self._cv.wait(left)
            finally:
                self._waiting.discard(mid)
                self._acks.discard(mid)
        return 0

    # ---------------------------------------------------------- receiving
    def set_data_receive_callback(self, callback):
        self._data_cb = callback

    def set_tensor_receive_callback(self, callback):
        self._tensor_cb = callback

    def _poll(self):
        """Take and handle what arrived; False when nothing did (or closed)."""
        eng = self._eng
        try:
            got = eng.get_notifs(1024) if eng is not None else []
        except RuntimeError:  # closed meanwhile
            return False
        for sender, msg in got:
            self._on_notif(sender, msg)
        self._expire()
        return bool(got)

    def _on_notif(self, sender, msg):
        if len(msg) < _HDR.size:
            return self._drop(sender, "shorter than its header")
        magic, kind, _, _, mid, off, total = _HDR.unpack_from(msg)
        if magic != _MAGIC:
            return self._drop(sender, "not an RPC message")
        if kind == _ACK:
            with self._cv:
                if mid in self._waiting:  # else late or never asked: nothing to keep
                    self._acks.add(mid)
                    self._cv.notify_all()
            return None
        if kind != _PART or not self._started:
            return self._drop(sender, "unknown kind" if kind != _PART else "server not started")
        body = msg[_HDR.size:]
        if total > _MAX_MESSAGE or off + len(body) > total or (len(body) == 0 and total > 0):
            return self._drop(sender, f"part [{off}, +{len(body)}) of a {total}-byte message")
        key = (sender, mid)
        entry = self._parts.get(key)
        if entry is None:
            if self._pending + total > _MAX_PENDING:
                return self._drop(sender, "too many bytes of partial messages held")
            entry = self._parts[key] = [bytearray(total), 0, time.monotonic()]
            self._pending += total
        entry[0][off:off + len(body)] = body
        entry[1] += len(body)
        if entry[1] < total:
            return None
        del self._parts[key]
        self._pending -= total
        self._deliver(sender, bytes(entry[0]))
        try:  # by another thread: a sender name nobody answers at must not stall receiving
            self._answers.put_nowait((sender, mid))
        except queue.Full:
            self._drop(sender, "answer queue full (the sender times out)")
        return None

    def _deliver(self, sender, data):
        """Mooncake's handleIncomingData: tensor-looking data to the tensor
        callback, the rest to the data callback as {"source", "data"}."""
        info = _tensor_info(data)
        try:
            if info is not None:
                if self._tensor_cb is not None:
                    self._tensor_cb(ReceivedTensor._make(sender, data, *info))
            elif self._data_cb is not None:
                self._data_cb({"source": sender, "data": data})
        except Exception as e:  # a callback's error must not stop the receiver
            log.error("mooncake.engine (kvbridge): Error in receive callback: %s", e)

    def _expire(self):
        if not self._parts:
            return
        old = time.monotonic() - self._timeout
        for key in [k for k, e in self._parts.items() if e[2] < old]:
            self._pending -= len(self._parts.pop(key)[0])
            self._drop(key[0], "message incomplete after timeout_seconds")

    @staticmethod
    def _drop(sender, why):
        log.warning("mooncake.engine (kvbridge): RPC message from %s dropped: %s", sender, why)


def _receive_loop(ref):
    """The receiver: polls the engine's notifications, 0.5 ms apart while
    they come, backing off to 10 ms when idle."""
    idle = 0.0005
    while True:
        self = ref()
        if self is None or self._stop.is_set():
            return
        busy = self._poll()
        del self
        idle = 0.0005 if busy else min(idle * 2, 0.01)
        if not busy:
            time.sleep(idle)


def _answer_loop(ref, answers, stop):
    """Sends the answers the receiver queued."""
    while not stop.is_set():
        try:
            sender, mid = answers.get(timeout=0.2)
        except queue.Empty:
            continue
        self = ref()
        eng = self._eng if self is not None else None
        timeout = self._timeout if self is not None else 1.0
        del self
        if eng is None:
            return
        try:
            eng.notify(sender, _HDR.pack(_MAGIC, _ACK, 0, 0, mid, 0, 0), timeout=timeout)
        except Exception as e:  # the sender went away: it times out
            log.warning("mooncake.engine (kvbridge): answer to %s not sent: %s", sender, e)


CoroRPCInterface = RpcInterface


def create_rpc_client(local_rank=0, world_size=1):
    """An RpcInterface initialized as a client (Mooncake: pool 10, 30 s)."""
    r = RpcInterface()
    r.initialize("", 0, 30, 10)
    return r


def create_rpc_server(local_rank=0, world_size=1):
    """An RpcInterface initialized as a server on 0.0.0.0:8080, as Mooncake."""
    r = RpcInterface()
    r.initialize("0.0.0.0:8080", 0, 30, 10)
    return r
