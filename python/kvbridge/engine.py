"""TransferEngine: the seeds' MooncakeTransferEngine over kvb_engine_*."""

import ctypes
import threading
import time
import weakref

from . import _lib as L
from ._lib import InvalidArgument, KVBridgeError

__all__ = ["SharedMemory", "TransferEngine", "TransferHandle", "cuda_available", "mem_query"]


def _mem_type(v):
    if v not in L.MEM_TYPES:
        raise InvalidArgument(f"mem_type must be one of {sorted(L.MEM_TYPES)}, not {v!r}")
    return L.MEM_TYPES[v]


def cuda_available():
    """(True, "") when the CUDA driver is loaded (KVBRIDGE_CUDA_LIB or
    libcuda.so.1), else (False, why)."""
    why = ctypes.c_char_p()
    ok = L.lib().kvb_cuda_available(ctypes.byref(why))
    return bool(ok), (why.value or b"").decode()


def mem_query(ptr):
    """("host", -1) or ("cuda", device ordinal) for an address or a
    __cuda_array_interface__ object."""
    t, d = ctypes.c_int(), ctypes.c_int()
    st = L.lib().kvb_mem_query(L.as_ptr(ptr, "ptr"), ctypes.byref(t), ctypes.byref(d))
    if st != L.KVB_OK:
        raise KVBridgeError(st, "kvb_mem_query failed")
    return ("cuda" if t.value == L.MEM_CUDA else "host"), d.value


def _blocks(src_ptrs, dst_ptrs, lengths):
    src = L.ptr_list(src_ptrs, "src_ptrs")
    dst = L.ptr_list(dst_ptrs, "dst_ptrs")
    lens = L.int_list(lengths, "lengths")
    if not (len(src) == len(dst) == len(lens)):
        raise InvalidArgument(f"src_ptrs, dst_ptrs and lengths differ in length "
                              f"({len(src)}, {len(dst)}, {len(lens)})")
    if not src:
        raise InvalidArgument("a batch needs at least one block")
    arr = (L.Block * len(src))()
    for i, (s, d, n) in enumerate(zip(src, dst, lens)):
        arr[i].src, arr[i].dst, arr[i].len = s, d, n
    return arr, len(src)


def _notif_bytes(msg):
    if isinstance(msg, str):
        msg = msg.encode()
    if not isinstance(msg, (bytes, bytearray, memoryview)):
        raise InvalidArgument(f"msg must be bytes or str, got {type(msg).__name__}")
    msg = bytes(msg)
    if len(msg) > L.NOTIF_MAX_LEN:
        raise InvalidArgument(f"notification of {len(msg)} bytes: at most {L.NOTIF_MAX_LEN}")
    return msg


class TransferEngine(L.Closeable):
    """One kvbridge engine: registered memory and one-sided batched writes into
    memory peers registered, and one-sided reads out of it (the *_read
    methods).

    TransferEngine(host="127.0.0.1", port=0, transport="auto") listens on
    host:port (0 = ephemeral). transport: "auto", "tcp" or "shm".
    Thread-safe; close() (or the with-block's end) waits for calls in progress,
    closes the managers using this engine, then frees it."""

    def __init__(self, host="127.0.0.1", port=0, transport="auto", *, connect_timeout=None,
                 peer_timeout=None, copy_threads=None, serve_reads=None, name=None):
        host = L.as_str(host, "host")
        port = L.as_int(port, "port", 0, 65535)
        transport = L.as_str(transport, "transport")
        if transport not in L.TRANSPORTS:
            raise InvalidArgument(f"transport must be one of {sorted(L.TRANSPORTS)}, "
                                  f"got {transport!r}")
        p = L.EngineParams()
        self._host_b = host.encode()
        p.host = self._host_b
        p.port = port
        p.transport = L.TRANSPORTS[transport]
        p.field_mask = L.ENGINE_PARAM_HOST | L.ENGINE_PARAM_PORT | L.ENGINE_PARAM_TRANSPORT
        if connect_timeout is not None:
            p.connect_timeout_s = L.as_float(connect_timeout, "connect_timeout", 0.001)
            p.field_mask |= L.ENGINE_PARAM_CONNECT_TIMEOUT
        if peer_timeout is not None:
            p.peer_timeout_s = L.as_float(peer_timeout, "peer_timeout", 0.001)
            p.field_mask |= L.ENGINE_PARAM_PEER_TIMEOUT
        if copy_threads is not None:  # direct lane writers; 0 = lane off
            p.copy_threads = L.as_int(copy_threads, "copy_threads", 0, 64)
            p.field_mask |= L.ENGINE_PARAM_COPY_THREADS
        if serve_reads is not None:  # answer peers' read requests (default: yes)
            p.serve_reads = 1 if serve_reads else 0
            p.field_mask |= L.ENGINE_PARAM_SERVE_READS
        if name is not None:  # the sender name our notifications carry (default: session id)
            self._name_b = L.as_str(name, "name").encode()
            if not 1 <= len(self._name_b) <= L.NOTIF_NAME_MAX:
                raise InvalidArgument(f"name must be 1..{L.NOTIF_NAME_MAX} bytes")
            p.name = self._name_b
            p.field_mask |= L.ENGINE_PARAM_NAME
        self._guard = L.Guard("TransferEngine")
        self._h = None
        self._users = weakref.WeakSet()  # managers built on this engine
        self._users_lock = threading.Lock()
        lib = L.lib()
        h = ctypes.c_void_p()
        st = lib.kvb_engine_create(ctypes.byref(p), ctypes.byref(h))
        if st != L.KVB_OK:
            self._guard.closed = True
            L.raise_status(st, f"cannot create a transfer engine on {host}:{port} "
                               f"({L.status_string(st)}; see the log)")
        self._h = h.value
        self._session_id = L.text(lib.kvb_engine_session_id(self._h))
        self.transport = {v: k for k, v in L.TRANSPORTS.items()}.get(
            lib.kvb_engine_transport(self._h), "auto")
        L.track(self, 1)

    # ---- life
    def close(self):
        with self._users_lock:
            users = list(self._users)
        for m in users:
            m.close()
        if self._guard.close() and self._h is not None:
            L.lib().kvb_engine_destroy(self._h)
            self._h = None


    def _add_user(self, mgr):
        with self._users_lock:
            self._users.add(mgr)

    def _discard_user(self, mgr):
        with self._users_lock:
            self._users.discard(mgr)

    def _error(self, st, what):
        detail = L.text(L.lib().kvb_engine_last_error(self._h))
        return KVBridgeError(st, f"{what}: {detail or L.status_string(st)}")

    # ---- the seeds' methods
    def get_session_id(self):
        """"host:port" peers pass as session_id to reach this engine."""
        with self._guard:
            return self._session_id

    @property
    def session_id(self):
        return self.get_session_id()

    @property
    def last_error(self):
        """Detailed text of the engine's most recent error ("" if none)."""
        with self._guard:
            return L.text(L.lib().kvb_engine_last_error(self._h))

    def session_direct(self, session_id):
        """True when writes to session_id go straight into its mapped memory
        (direct lane), False through UCX, None before the first write."""
        sid = L.as_str(session_id, "session_id").encode()
        with self._guard:
            r = L.lib().kvb_engine_session_direct(self._h, sid)
        return None if r < 0 else bool(r)

    def register(self, ptr, length=None, mem_type="auto"):
        """Register [ptr, ptr+length); raises KVBridgeError (overlap, bad
        range, device memory without a CUDA driver) with the library's
        message. ptr: an address (host or CUDA device memory) or an object
        with __cuda_array_interface__ (a PyTorch CUDA tensor: length defaults
        to its size). mem_type: "auto" (the engine asks the CUDA driver),
        "host" or "cuda"."""
        c = L.cuda_array(ptr)
        if length is None and c is not None:
            length = c[1]
        ptr = L.as_ptr(ptr, "ptr")
        length = L.as_int(length, "length", 1, L.U64_MAX)
        mt = _mem_type(mem_type)
        with self._guard:
            st = L.lib().kvb_engine_register(self._h, ptr, length, mt)
            if st != L.KVB_OK:
                raise self._error(st, f"register {ptr:#x}+{length}")

    def batch_register(self, ptrs, lengths, mem_type="auto"):
        """Register several regions (as `register`), all or nothing."""
        ptrs = L.ptr_list(ptrs, "ptrs")
        mt = _mem_type(mem_type)
        lengths = L.int_list(lengths, "lengths", 1)
        if len(ptrs) != len(lengths):
            raise InvalidArgument(f"ptrs and lengths differ in length "
                                  f"({len(ptrs)} != {len(lengths)})")
        if not ptrs:
            return
        regs = (L.MemRegion * len(ptrs))()
        for i, (p, n) in enumerate(zip(ptrs, lengths)):
            regs[i].addr, regs[i].length, regs[i].mem_type = p, n, mt
        with self._guard:
            st = L.lib().kvb_engine_register_batch(self._h, regs, len(ptrs))
            if st != L.KVB_OK:
                raise self._error(st, f"batch_register of {len(ptrs)} regions")

    def unregister(self, ptr):
        """Unregister the region starting at ptr."""
        ptr = L.as_int(ptr, "ptr", 1, L.U64_MAX)
        with self._guard:
            st = L.lib().kvb_engine_unregister(self._h, ptr)
            if st != L.KVB_OK:
                raise self._error(st, f"unregister {ptr:#x}")

    def batch_unregister(self, ptrs):
        ptrs = L.int_list(ptrs, "ptrs", 1)
        if not ptrs:
            return
        arr = (ctypes.c_void_p * len(ptrs))(*ptrs)
        with self._guard:
            st = L.lib().kvb_engine_unregister_batch(self._h, arr, len(ptrs))
            if st != L.KVB_OK:
                raise self._error(st, f"batch_unregister of {len(ptrs)} regions")

    deregister = unregister  # the name in SGLang's MooncakeTransferEngine
    batch_deregister = batch_unregister

    def transfer_sync(self, session_id, src_ptr, dst_ptr, length, timeout=None):
        """One block; see batch_transfer_sync."""
        return self.batch_transfer_sync(session_id, [src_ptr], [dst_ptr], [length], timeout)

    def batch_transfer_sync(self, session_id, src_ptrs, dst_ptrs, lengths, timeout=None):
        """Write every block (src local → dst on the peer session_id) and wait
        until all bytes are in the peer's memory. Returns 0, or the negative
        kvb_status_t (-3 bounds, -6 time-out, -7 peer, ...) as the seeds'
        engine returns a negative code; the text is in `last_error`.
        timeout: seconds (None = no bound beyond the engine's peer time-out)."""
        return self._sync(session_id, src_ptrs, dst_ptrs, lengths, timeout, False)

    def transfer_sync_read(self, session_id, local_ptr, remote_ptr, length, timeout=None):
        """One block; see batch_transfer_sync_read."""
        return self.batch_transfer_sync_read(session_id, [local_ptr], [remote_ptr], [length],
                                             timeout)

    def batch_transfer_sync_read(self, session_id, local_ptrs, remote_ptrs, lengths,
                                 timeout=None):
        """One-sided read (kvb_engine_read): copy every block from remote_ptrs[i]
        (inside memory the peer session_id registered) into local_ptrs[i]
        (inside memory registered here) and wait. Returns 0 or the negative
        kvb_status_t, as batch_transfer_sync (-3: a range outside a
        registration, nothing read; -15: the target revoked the grant; -16:
        the target's read caps are full, retry later)."""
        return self._sync(session_id, remote_ptrs, local_ptrs, lengths, timeout, True)

    def _sync(self, session_id, src_ptrs, dst_ptrs, lengths, timeout, read):
        sid = L.as_str(session_id, "session_id").encode()
        arr, n = _blocks(src_ptrs, dst_ptrs, lengths)
        t = 0.0 if timeout is None else L.as_float(timeout, "timeout", 0.0)
        fn = L.lib().kvb_engine_read if read else L.lib().kvb_engine_write
        with self._guard:
            return int(fn(self._h, sid, arr, n, t))

    def read_pages(self, session_id, src_pages, dst_pages, fields, max_batch_size=0,
                   timeout=None):
        """Read a pages x fields grid (kvb_engine_read_pages): as write_pages
        with the bytes going the other way, src columns still ours: span (f,
        i) copies length bytes from the peer's dst_base + dst_pages[i] *
        dst_stride into src_base + src_pages[i] * src_stride here."""
        return self._pages(session_id, src_pages, dst_pages, fields, max_batch_size, timeout,
                           True)

    def write_pages(self, session_id, src_pages, dst_pages, fields, max_batch_size=0,
                    timeout=None):
        """Write a pages x fields grid (kvb_engine_write_pages): fields rows
        (src_base, src_stride, dst_base, dst_stride, length); span (f, i)
        copies length bytes from src_base + src_pages[i] * src_stride to the
        peer's dst_base + dst_pages[i] * dst_stride. Field-major batches of
        at most max_batch_size spans (0: one), each one transfer of strided
        blocks waited for (timeout seconds each, plus 1 ns per byte; None:
        no bound). Arrays: numpy int64/uint64 (read in place), buffers or
        sequences. ValueError for a bad grid (nothing sent). Returns 0, or
        the first failing batch's negative kvb_status_t (as
        batch_transfer_sync; the text is in `last_error`)."""
        return self._pages(session_id, src_pages, dst_pages, fields, max_batch_size, timeout,
                           False)

    def _pages(self, session_id, src_pages, dst_pages, fields, max_batch_size, timeout, read):
        session_id = L.as_str(session_id, "session_id")
        mbs = L.as_int(max_batch_size, "max_batch_size", 0, L.U64_MAX)
        t = 0.0 if timeout is None else L.as_float(timeout, "timeout", 0.0)
        sp, dp, fl = L.pages_grid(src_pages, dst_pages, fields)
        if sp.rows == 0 or fl.rows == 0:
            return 0
        fn = L.lib().kvb_engine_read_pages if read else L.lib().kvb_engine_write_pages
        with self._guard:
            return int(fn(self._h, session_id.encode(), sp.addr, dp.addr, sp.rows, fl.addr,
                          fl.rows, mbs, t))

    def batch_transfer_async(self, session_id, src_ptrs, dst_ptrs, lengths):
        """Queue the batch; returns a TransferHandle (wait/test/cancel).
        Errors known before any byte moves raise KVBridgeError."""
        return self._async(session_id, src_ptrs, dst_ptrs, lengths, False)

    def batch_transfer_async_read(self, session_id, local_ptrs, remote_ptrs, lengths):
        """Queue a one-sided read (as batch_transfer_sync_read); returns a
        TransferHandle. Once it reports an end, no byte of it lands any more."""
        return self._async(session_id, remote_ptrs, local_ptrs, lengths, True)

    def _async(self, session_id, src_ptrs, dst_ptrs, lengths, read):
        sid = L.as_str(session_id, "session_id").encode()
        arr, n = _blocks(src_ptrs, dst_ptrs, lengths)
        fn = L.lib().kvb_engine_read_async if read else L.lib().kvb_engine_write_async
        what = "batch_transfer_async_read from" if read else "batch_transfer_async to"
        with self._guard:
            x = ctypes.c_void_p()
            st = fn(self._h, sid, arr, n, ctypes.byref(x))
            if st != L.KVB_OK:
                raise self._error(st, f"{what} {session_id}")
            return TransferHandle(self, x.value, n)


    # ---- notifications (engine.h, "Notifications")
    def notify(self, session_id, msg, timeout=None):
        """Send msg (bytes or str, at most 64 KiB) to the engine at session_id
        as a notification, not tied to a transfer; returns once sent (within
        timeout s, default the connect time-out). Raises KVBridgeError."""
        sid = L.as_str(session_id, "session_id").encode()
        msg = _notif_bytes(msg)
        t = 0.0 if timeout is None else L.as_float(timeout, "timeout", 0.001)
        with self._guard:
            st = L.lib().kvb_engine_notify(self._h, sid, msg, len(msg), t)
            if st != L.KVB_OK:
                raise self._error(st, f"notification to {session_id}")

    def get_notifs(self, max_count=1024):
        """The notifications received and not yet taken, oldest first, as
        (sender name, bytes) pairs; [] when none. Never blocks."""
        n_max = L.as_int(max_count, "max_count", 1, 1 << 20)
        arr = (L.Notif * n_max)()
        n = ctypes.c_size_t()
        with self._guard:
            lib = L.lib()
            st = lib.kvb_engine_get_notifs(self._h, arr, n_max, ctypes.byref(n))
            if st != L.KVB_OK:
                raise self._error(st, "get_notifs")
            out = [(ctypes.string_at(arr[i].sender).decode("utf-8", "replace"),
                    ctypes.string_at(arr[i].msg, arr[i].len)) for i in range(n.value)]
            lib.kvb_notifs_free(arr, n.value)
        return out


class TransferHandle(L.Closeable):
    """An asynchronous batch. wait(timeout) → 0 or a negative status
    (-6 KVB_ERR_TIMEOUT while it is still running after timeout s)."""

    def __init__(self, engine, h, n):
        self._engine = engine  # keeps the engine object alive
        self._h = h
        self.num_blocks = n
        self._guard = L.Guard("TransferHandle")

    def test(self):
        """Current status: -11 (KVB_ERR_INPROGRESS) while running, then final."""
        with self._guard:
            return int(L.lib().kvb_xfer_test(self._h))

    def done(self):
        return self.test() != L.KVB_ERR_INPROGRESS

    def wait(self, timeout=None):
        """Wait up to timeout seconds (None = until the end). Returns 0 or the
        final negative status, or -6 if still running. Waits in slices so
        Ctrl-C is seen."""
        deadline = None if timeout is None else time.monotonic() + L.as_float(
            timeout, "timeout", 0.0)
        with self._guard:
            lib = L.lib()
            while True:
                left = 0.2 if deadline is None else min(0.2, deadline - time.monotonic())
                if left <= 0:
                    st = lib.kvb_xfer_test(self._h)
                    return L.KVB_ERR_TIMEOUT if st == L.KVB_ERR_INPROGRESS else int(st)
                st = lib.kvb_xfer_wait(self._h, max(left, 0.001))
                if st != L.KVB_ERR_TIMEOUT:
                    return int(st)
                if lib.kvb_xfer_test(self._h) != L.KVB_ERR_INPROGRESS:
                    return int(lib.kvb_xfer_test(self._h))

    def cancel(self):
        """No new block is issued; the handle ends -9 once issued ones settle."""
        with self._guard:
            L.lib().kvb_xfer_cancel(self._h)

    def expire(self):
        """Give the transfer up (kvb_xfer_expire): cancelled, and its
        connection failed should the peer not settle within the peer
        time-out, so it ends within about two of them."""
        with self._guard:
            L.lib().kvb_xfer_expire(self._h)

    @property
    def drained(self):
        """True once it ended and nothing of it can still land (False while
        running, and for a failure with bytes in flight to a peer that
        stopped answering: those may still be placed)."""
        with self._guard:
            return bool(L.lib().kvb_xfer_drained(self._h))

    @property
    def error(self):
        """The failure reason ("" while running or on success)."""
        with self._guard:
            return L.text(L.lib().kvb_xfer_error(self._h))

    def close(self):
        """Free the handle (a running transfer is cancelled, not awaited)."""
        if self._guard.close() and self._h is not None:
            L.lib().kvb_xfer_free(self._h)
            self._h = None



class SharedMemory(L.Closeable):
    """Host memory from kvb_mem_alloc: register it as a KV pool and writers
    on this host fill it directly (one copy, no CPU on this side).

    SharedMemory(nbytes): .ptr, .nbytes, .array(dtype) (a numpy view, valid
    until close()). Unregister it from every engine before close()."""

    def __init__(self, nbytes):
        nbytes = L.as_int(nbytes, "nbytes", 1, L.U64_MAX)
        self._guard = L.Guard("SharedMemory")
        self.ptr = None
        h = ctypes.c_void_p()
        st = L.lib().kvb_mem_alloc(nbytes, ctypes.byref(h))
        if st != L.KVB_OK:
            self._guard.closed = True
            L.raise_status(st, f"cannot allocate {nbytes} bytes of shared memory "
                               f"({L.status_string(st)})")
        self.ptr = h.value
        self.nbytes = nbytes
        L.track(self, 3)  # freed at exit after the engines that registered it

    def array(self, dtype="uint8"):
        np = L._numpy()
        if np is None:
            raise RuntimeError("SharedMemory.array() needs numpy")
        with self._guard:
            buf = (ctypes.c_uint8 * self.nbytes).from_address(self.ptr)
            return np.frombuffer(buf, dtype=np.uint8).view(dtype)

    def close(self):
        if self._guard.close() and self.ptr is not None:
            L.lib().kvb_mem_free(self.ptr)
            self.ptr = None
