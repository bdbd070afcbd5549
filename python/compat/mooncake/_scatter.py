"""Mooncake 0.3.14's scatter transfers with drain tickets, over kvbridge's
engine (the TransferEngine methods in engine.py call run()).

A scatter call names R ranges, each a local allocation [local_base,
+local_capacity) paired with a remote one, and per range fragments
(local_offset, remote_offset, length) inside both. All fragments become one
kvbridge transfer (one kvb_block_t each), so they share one completion and
one drain state:

- COMPLETED: every byte was placed (kvb_xfer_test OK).
- FAILED_DRAINED: it failed and nothing of it can still move: the engine
  proved it (kvb_xfer_drained: every message acknowledged or never sent, a
  cancel settled, the direct lane's copy threads done), or it failed before
  any byte was sent (a fragment outside the registrations, an unreachable
  peer).
- COMPLETION_UNKNOWN: it is still running, or it failed with bytes in flight
  to a peer that stopped answering (its session was closed): those may still
  be placed if the peer resumes, so the buffers must not be reused. Such a
  ticket stays COMPLETION_UNKNOWN; drain() cannot prove more later.
"""

import ctypes
import operator
import threading
import time
from enum import IntEnum

from kvbridge import _lib as L

# How long an operation given up (kvb_xfer_expire) is waited for: it ends
# within about two of the engine's peer time-outs (2 s by default), with
# slack.
SETTLE_S = 5.0


class ScatterTransferCompletionStatus(IntEnum):
    """0.3.14's scatter outcome names (their values are not in Mooncake's
    stub; these are kvbridge's)."""
    COMPLETED = 0
    FAILED_DRAINED = 1
    COMPLETION_UNKNOWN = 2


S = ScatterTransferCompletionStatus


class ScatterTransferTicket:
    """Keeps a scatter operation alive until it is drained (0.3.14). Made
    only by the scatter calls; hold it (and the buffers) while status is
    COMPLETION_UNKNOWN."""

    def __init__(self, *a, **k):
        raise TypeError("mooncake.engine.ScatterTransferTicket: No constructor defined!")

    @classmethod
    def _new(cls, xfer, deadline, st=L.KVB_OK, why=""):
        t = object.__new__(cls)
        t._lock = threading.Lock()
        t._x = xfer  # kvb_xfer_h until freed, else None
        # Threads inside a C call on _x with the lock released (drain's wait,
        # _release's settle): _x is freed only when none is (_free_unheld).
        t._holders = 0
        t._deadline = deadline
        # (status, drained, reason) once final; a ticket without a transfer
        # failed before any byte was sent.
        t._final = None if xfer else (st, True, why)
        return t

    def _collect(self):
        """The final (status, drained, reason), or None while running."""
        with self._lock:
            if self._final is None and self._x is not None:
                lib = L.lib()
                st = lib.kvb_xfer_test(self._x)
                if st != L.KVB_ERR_INPROGRESS:
                    self._final = (st, st == L.KVB_OK or bool(lib.kvb_xfer_drained(self._x)),
                                   L.text(lib.kvb_xfer_error(self._x)))
            self._free_unheld()
            return self._final

    def _free_unheld(self):
        """Free the handle once the final state is recorded and no thread is
        inside a call on it (lock held): a drain waiting in kvb_xfer_wait
        keeps it, and the last one out frees it."""
        if self._final is not None and self._x is not None and self._holders == 0:
            L.lib().kvb_xfer_free(self._x)
            self._x = None

    def _hold(self):
        """The handle, counted as in use until _unhold (lock held), or None."""
        if self._x is not None:
            self._holders += 1
        return self._x

    def _unhold(self):
        with self._lock:
            self._holders -= 1
            self._free_unheld()

    @property
    def status(self):
        """COMPLETED, FAILED_DRAINED, or COMPLETION_UNKNOWN (still running,
        or failed with bytes in flight to a stopped peer)."""
        f = self._collect()
        if f is None:
            return S.COMPLETION_UNKNOWN
        if f[0] == L.KVB_OK:
            return S.COMPLETED
        return S.FAILED_DRAINED if f[1] else S.COMPLETION_UNKNOWN

    @property
    def drained(self):
        """True once nothing of the operation can still touch the buffers."""
        f = self._collect()
        return f is not None and f[1]

    @property
    def error(self):
        """(kvbridge extra) Why it failed, "" while running or on success."""
        f = self._collect()
        return "" if f is None else f[2]

    def drain(self, timeout_ms, /):
        """Wait up to timeout_ms for the operation to end and return its
        status. One past its deadline (MC_TRANSFER_TIMEOUT + 1 ns per byte)
        is cancelled first, so it settles instead of running on."""
        try:
            ms = operator.index(timeout_ms)
        except TypeError:
            raise TypeError("drain: timeout_ms must be an int") from None
        if ms < 0:
            raise ValueError(f"drain: timeout_ms must be >= 0, got {ms}")
        with self._lock:
            x = self._hold() if self._final is None and ms > 0 else None
            if self._final is None and time.monotonic() > self._deadline:
                L.lib().kvb_xfer_cancel(self._x)
        if x is not None:
            try:
                L.lib().kvb_xfer_wait(x, ms / 1000.0)  # releases the GIL and the lock
            finally:
                self._unhold()
        return self.status

    def _settle(self):
        """The sync form's end: past the deadline the operation is given up
        (kvb_xfer_expire: cancelled, its connection failed should the peer
        not settle within the engine's peer time-out, as kvb_engine_write
        does), so the call returns within about the deadline plus
        SETTLE_S."""
        x = self._x
        lib = L.lib()
        left = self._deadline - time.monotonic()
        if x is None or lib.kvb_xfer_wait(x, max(left, 1e-3)) != L.KVB_ERR_TIMEOUT:
            return
        lib.kvb_xfer_expire(x)
        lib.kvb_xfer_wait(x, SETTLE_S)

    def _release(self):
        """Free the handle (a running operation is given up first and waited
        for, SETTLE_S): before the engine goes."""
        with self._lock:
            x = self._hold()
            if self._final is None:
                self._final = (L.KVB_ERR_CANCELED, False, "engine closed")
        if x is not None:
            try:
                lib = L.lib()
                if lib.kvb_xfer_test(x) == L.KVB_ERR_INPROGRESS:
                    lib.kvb_xfer_expire(x)
                    lib.kvb_xfer_wait(x, SETTLE_S)
            finally:
                self._unhold()  # frees it, or the last drain still waiting on it does

    def __del__(self):
        try:
            x = self._x
            if x is not None:
                L.lib().kvb_xfer_free(x)  # cancels a running one; the engine keeps it until it ends
        except Exception:
            pass

    def __repr__(self):
        return f"<ScatterTransferTicket {self.status.name}>"


def _ints(v, name):
    if isinstance(v, (str, bytes)):
        raise TypeError(f"{name}: expected a list of integers, not {type(v).__name__}")
    try:
        out = [operator.index(e) for e in v]
    except TypeError:
        raise TypeError(f"{name}: expected a list of integers") from None
    if any(e < 0 or e > L.U64_MAX for e in out):
        raise TypeError(f"{name}: values must be unsigned 64-bit integers")
    return out


def _nested(v, name):
    if isinstance(v, (str, bytes)):
        raise TypeError(f"{name}: expected a list of lists of integers")
    try:
        return [_ints(row, name) for row in v]
    except TypeError:
        raise TypeError(f"{name}: expected a list of lists of integers") from None


def blocks(read, local_bases, local_caps, remote_bases, remote_caps, local_offsets,
           remote_offsets, lengths):
    """The fragments as a kvb_block_t array, its count and bytes. A write's
    block copies local → remote (src local), a read's remote → local (src
    remote, dst local), as kvb_engine_write/_read take them. ValueError with
    Mooncake's texts for a malformed call; nothing is sent then."""
    lb, lc = _ints(local_bases, "local_base_addresses"), _ints(local_caps, "local_capacities")
    rb, rc = _ints(remote_bases, "remote_base_addresses"), _ints(remote_caps, "remote_capacities")
    lo, ro = _nested(local_offsets, "local_offsets"), _nested(remote_offsets, "remote_offsets")
    ln = _nested(lengths, "lengths")
    nr = len(lb)
    if not (len(lc) == len(rb) == len(rc) == nr and len(lo) == len(ro) == len(ln) == nr):
        raise ValueError("Scatter transfer range arrays have different sizes")
    out = []
    for r in range(nr):
        if not len(lo[r]) == len(ro[r]) == len(ln[r]):
            raise ValueError(f"Scatter transfer fragment arrays have different sizes at range {r}")
        if lb[r] + lc[r] > L.U64_MAX + 1:
            raise ValueError("Scatter transfer local allocation range overflows the address "
                             f"space at range {r}")
        if rb[r] + rc[r] > L.U64_MAX + 1:
            raise ValueError(f"invalid scatter transfer range {r}: the remote allocation "
                             "overflows the address space")
        for j, (a, b, n) in enumerate(zip(lo[r], ro[r], ln[r])):
            if n == 0 or a + n > lc[r] or b + n > rc[r]:
                raise ValueError(f"invalid scatter transfer fragment {j} of range {r}: "
                                 f"{n} bytes at local offset {a} (capacity {lc[r]}), remote "
                                 f"offset {b} (capacity {rc[r]})")
            loc, rem = lb[r] + a, rb[r] + b
            out.append((rem, loc, n) if read else (loc, rem, n))
    if not out:
        raise ValueError("scatter transfer is empty")
    arr = (L.Block * len(out))(*out)
    return arr, len(out), sum(n for _, _, n in out)


def run(eng, read, endpoint, args, timeout_s, sync):
    """Start the scatter operation on eng (a kvbridge.TransferEngine) and
    return its ticket; sync: wait for it (and settle it) first."""
    if not isinstance(endpoint, str) or "\0" in endpoint:
        raise TypeError("endpoint: expected a session id str (\"host:port\")")
    arr, n, total = blocks(read, *args)
    deadline = time.monotonic() + timeout_s + total * 1e-9
    lib = L.lib()
    x = ctypes.c_void_p()
    with eng._guard:
        start = lib.kvb_engine_read_async if read else lib.kvb_engine_write_async
        st = start(eng._h, endpoint.encode(), arr, n, ctypes.byref(x))
        why = "" if st == L.KVB_OK else (L.text(lib.kvb_engine_last_error(eng._h)) or
                                         L.status_string(st))
    t = ScatterTransferTicket._new(x.value if st == L.KVB_OK else None, deadline, st, why)
    if sync:
        t._settle()
    return t
