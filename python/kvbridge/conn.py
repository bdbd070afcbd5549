"""The connector with seed 001's names: KVPoll, KVTransferError, KVArgs,
KVManager, KVSender, KVReceiver (MooncakeKVManager/-Sender/-Receiver)."""

import ctypes
import enum
import os
import threading
import weakref

from . import _lib as L
from ._lib import InvalidArgument, KVBridgeError
from .engine import TransferEngine

__all__ = ["KVPoll", "KVTransferError", "KVArgs", "KVManager", "KVSender", "KVReceiver",
           "DisaggregationMode", "poll_many"]

_UNKNOWN_REASON = "Failed due to an unknown reason from another rank"


class KVPoll(enum.IntEnum):
    """The seeds' KVPoll values (compare equal to the seeds' ints)."""
    Failed = 0
    Bootstrapping = 1
    WaitingForInput = 2
    Transferring = 3
    Success = 4


class DisaggregationMode(enum.Enum):
    """SGLang's DisaggregationMode; KVManager also takes "prefill"/"decode"."""
    NULL = "null"
    PREFILL = "prefill"
    DECODE = "decode"


class KVTransferError(Exception):
    """Seed 001's KVTransferError(bootstrap_room, failure_reason)."""

    def __init__(self, bootstrap_room, failure_reason):
        super().__init__(failure_reason)
        self.bootstrap_room = bootstrap_room
        self.failure_reason = failure_reason

    def __str__(self):
        return f"KVTransferError(bootstrap_room={self.bootstrap_room}): {self.failure_reason}"


class KVArgs:
    """A rank's KV arguments with the seeds' field names, assigned as plain
    lists / ints. Buffers are host memory addresses (ints) that must stay
    alive and unmoved until the manager is closed.

    kv_data_ptrs order: MHA → K of each local layer, then V of the same
    layers; MLA → one latent buffer per layer. kv_item_lens: one per buffer,
    all equal (bytes of one page of one layer buffer on this rank).
    Optional kvbridge fields: prefill_start_layer (first model layer of this
    prefill PP stage; default pp_rank × local layers), num_layers_total
    (default local layers × pp_size). Other seed fields (gpu_id, ib_device,
    ...) may be set and are ignored."""

    def __init__(self, **fields):
        self.kv_data_ptrs = []
        self.kv_data_lens = []
        self.kv_item_lens = []
        self.aux_data_ptrs = []
        self.aux_data_lens = []
        self.aux_item_lens = []
        self.state_data_ptrs = []
        self.state_data_lens = []
        self.state_item_lens = []
        self.page_size = 1
        self.kv_layout = "nhd"  # page order: "nhd" (page, token, head, dim) or "hnd"
        self.kv_head_num = None
        self.engine_rank = None
        self.prefill_start_layer = None
        self.num_layers_total = None
        for k, v in fields.items():
            setattr(self, k, v)

    def __repr__(self):
        return (f"KVArgs(num_kv={len(self.kv_data_ptrs or [])}, "
                f"kv_item_lens={list(self.kv_item_lens or [])[:1]}..., "
                f"page_size={self.page_size}, kv_head_num={self.kv_head_num})")


def _kv_order(layout):
    """KVArgs.kv_layout ("nhd" / "hnd", any case; None = "nhd") as kvb_plan_order_t."""
    text = "nhd" if layout is None else layout
    if not isinstance(text, str) or text.lower() not in ("nhd", "hnd"):
        raise InvalidArgument(f"KVArgs.kv_layout must be 'nhd' or 'hnd', not {layout!r}")
    return 0 if text.lower() == "nhd" else 1


def _parse_mode(mode):
    m = getattr(mode, "value", mode)
    if isinstance(m, str) and m.lower() in ("prefill", "decode"):
        return 0 if m.lower() == "prefill" else 1
    name = getattr(mode, "name", None)
    if isinstance(name, str) and name.lower() in ("prefill", "decode"):
        return 0 if name.lower() == "prefill" else 1
    raise InvalidArgument(f"mode must be 'prefill' or 'decode', got {mode!r}")


def _env_num(names, default, conv):
    for n in names:
        v = os.environ.get(n)
        if v:
            try:
                return conv(v)
            except ValueError:
                pass
    return default


def _args_struct(args, is_mla, pp_rank, pp_size):
    """Validate a KVArgs and build kvb_kv_args_t (plus the arrays it points to)."""
    if args is None:
        raise InvalidArgument("args (a KVArgs) is required")
    keep = []

    def lst(name, lo=0):
        return L.int_list(getattr(args, name, None), f"KVArgs.{name}", lo)

    # addresses: host or CUDA device memory (the engine tells them apart), as
    # ints or objects with __cuda_array_interface__ (PyTorch CUDA tensors)
    kv_ptrs, kv_lens = L.ptr_list(args.kv_data_ptrs, "KVArgs.kv_data_ptrs"), lst("kv_data_lens", 1)
    if not kv_ptrs:
        raise InvalidArgument("KVArgs.kv_data_ptrs is empty")
    if len(kv_ptrs) != len(kv_lens):
        raise InvalidArgument(f"KVArgs.kv_data_ptrs and kv_data_lens differ in length "
                              f"({len(kv_ptrs)} != {len(kv_lens)})")
    items = getattr(args, "kv_item_lens", None)
    if isinstance(items, int) and not isinstance(items, bool):
        items = [items]
    items = L.int_list(items, "KVArgs.kv_item_lens", 1)
    if not items:
        raise InvalidArgument("KVArgs.kv_item_lens is empty")
    if len(set(items)) != 1:
        raise InvalidArgument(f"KVArgs.kv_item_lens must all be equal (kvbridge takes one item "
                              f"length per rank), got {sorted(set(items))}")
    if len(items) not in (1, len(kv_ptrs)):
        raise InvalidArgument(f"KVArgs.kv_item_lens has {len(items)} entries for "
                              f"{len(kv_ptrs)} buffers")
    groups = {}
    for g in ("aux", "state"):
        p, n, i = (L.ptr_list(getattr(args, f"{g}_data_ptrs", None), f"KVArgs.{g}_data_ptrs"),
                   lst(f"{g}_data_lens", 1), lst(f"{g}_item_lens", 1))
        if not (len(p) == len(n) == len(i)):
            raise InvalidArgument(f"KVArgs.{g}_data_ptrs, {g}_data_lens and {g}_item_lens "
                                  f"differ in length ({len(p)}, {len(n)}, {len(i)})")
        groups[g] = (p, n, i)
    page_size = L.as_int(getattr(args, "page_size", 1), "KVArgs.page_size", 1, 0xFFFFFFFF)
    heads = getattr(args, "kv_head_num", None)
    if heads is None:
        if not is_mla:
            raise InvalidArgument("KVArgs.kv_head_num is required for MHA (KV heads on this rank)")
        heads = 1
    heads = L.as_int(heads, "KVArgs.kv_head_num", 1, 0xFFFFFFFF)
    a = L.KVArgsC()

    def arr(vals):
        c = L.u64_array(vals)
        keep.append(c)
        return ctypes.cast(c, L.c_u64_p)

    a.kv_data_ptrs, a.kv_data_lens, a.num_kv = arr(kv_ptrs), arr(kv_lens), len(kv_ptrs)
    a.kv_item_len = items[0]
    p, n, i = groups["aux"]
    a.aux_data_ptrs, a.aux_data_lens, a.aux_item_lens, a.num_aux = arr(p), arr(n), arr(i), len(p)
    p, n, i = groups["state"]
    a.state_data_ptrs, a.state_data_lens, a.state_item_lens, a.num_state = (arr(p), arr(n),
                                                                            arr(i), len(p))
    a.page_size = page_size
    a.kv_order = _kv_order(getattr(args, "kv_layout", "nhd"))
    a.kv_head_num = heads
    local_layers = len(kv_ptrs) if is_mla else len(kv_ptrs) // 2
    start = getattr(args, "prefill_start_layer", None)
    a.prefill_start_layer = (pp_rank * local_layers if start is None else
                             L.as_int(start, "KVArgs.prefill_start_layer", 0, 0xFFFFFFFF))
    total = getattr(args, "num_layers_total", None)
    a.num_layers_total = 0 if total is None else L.as_int(total, "KVArgs.num_layers_total", 0,
                                                          0xFFFFFFFF)
    return a, keep


def _auth_params(p, token, server_key, client_key, allowed):
    """Optional authentication fields (docs/security.md); returns the byte
    strings p points at, which the caller keeps alive."""
    keep = []

    def enc(v, name):
        b = L.as_str(v, name, allow_none=True)
        if b is None:
            return None
        keep.append(b.encode())
        return keep[-1]

    if token is not None:
        p.bootstrap_token = enc(token, "bootstrap_token")
        p.field_mask |= L.MANAGER_PARAM_BOOTSTRAP_TOKEN
    if server_key is not None or client_key is not None or allowed is not None:
        p.curve_secret_key = enc(server_key, "curve_secret_key")
        p.curve_client_secret_key = enc(client_key, "curve_client_secret_key")
        p.curve_allowed_clients = enc(allowed, "curve_allowed_clients")
        p.field_mask |= L.MANAGER_PARAM_CURVE
    return keep


class KVManager(L.Closeable):
    """A rank's KV manager (seed MooncakeKVManager): registers the KVArgs
    buffers with the engine, runs the control socket and the transfer
    (prefill) or heartbeat (decode) threads; a prefill manager registers with
    the bootstrap server at bootstrap_addr ("host:port").

    A manager owns the TransferEngine it creates (host, transport); pass
    engine= to share one, which must then outlive the manager (closing the
    engine closes its managers first). close() closes this manager's live
    senders and receivers first. Thread-safe."""

    def __init__(self, args, mode, bootstrap_addr=None, attn_tp_size=1, attn_tp_rank=0,
                 attn_dp_size=1, attn_dp_rank=0, pp_size=1, pp_rank=0, is_mla=False,
                 host="127.0.0.1", transport="auto", *, engine=None, system_dp_size=1,
                 system_dp_rank=0, bootstrap_timeout=None, waiting_timeout=None,
                 heartbeat_interval=None, heartbeat_max_failures=None, transfer_threads=None,
                 transfer_queues=None, room_ttl=None, bootstrap_refresh=None,
                 bootstrap_token=None, curve_secret_key=None, curve_client_secret_key=None,
                 curve_allowed_clients=None, sglang_dialect=None, kv_cache_dtype=None,
                 draft_layers=None, cachepd_contract=None, integrity=None,
                 sglang_kv_checksum_aux=None):
        self._guard = L.Guard("KVManager")
        self._guard.closed = True  # until created
        self._h = None
        self._engine = None
        self._owns_engine = False
        self._children = weakref.WeakSet()
        self._children_lock = threading.Lock()
        mode_c = _parse_mode(mode)
        self.mode = "prefill" if mode_c == 0 else "decode"
        p = L.ManagerParams()
        p.mode = mode_c
        ints = dict(attn_tp_size=attn_tp_size, attn_tp_rank=attn_tp_rank,
                    attn_dp_size=attn_dp_size, attn_dp_rank=attn_dp_rank, pp_size=pp_size,
                    pp_rank=pp_rank, system_dp_size=system_dp_size,
                    system_dp_rank=system_dp_rank)
        for k, v in ints.items():
            setattr(p, k, L.as_int(v, k, 0 if k.endswith("rank") else 1, 0x7FFFFFFF))
        for s, r in (("attn_tp_size", "attn_tp_rank"), ("attn_dp_size", "attn_dp_rank"),
                     ("pp_size", "pp_rank"), ("system_dp_size", "system_dp_rank")):
            if getattr(p, r) >= getattr(p, s):
                raise InvalidArgument(f"{r}={getattr(p, r)} out of range for {s}={getattr(p, s)}")
        if not isinstance(is_mla, (bool, int)):
            raise InvalidArgument(f"is_mla must be a bool, not {type(is_mla).__name__}")
        p.is_mla = 1 if is_mla else 0
        self.is_mla = bool(is_mla)
        host = L.as_str(host, "host")
        self._host_b = host.encode()
        p.host = self._host_b
        p.field_mask |= L.MANAGER_PARAM_HOST
        self.bootstrap_addr = L.as_str(bootstrap_addr, "bootstrap_addr", allow_none=True)
        if self.bootstrap_addr is not None:
            self._boot_b = self.bootstrap_addr.encode()
            p.bootstrap_addr = self._boot_b
            p.field_mask |= L.MANAGER_PARAM_BOOTSTRAP_ADDR
        elif mode_c == 0:
            raise InvalidArgument("a prefill KVManager needs bootstrap_addr ('host:port')")
        for name, val, low, bit in (
                ("bootstrap_timeout", bootstrap_timeout, 0.001, L.MANAGER_PARAM_BOOTSTRAP_TIMEOUT),
                ("waiting_timeout", waiting_timeout, 0.001, L.MANAGER_PARAM_WAITING_TIMEOUT),
                ("room_ttl", room_ttl, 0.001, L.MANAGER_PARAM_ROOM_TTL),
                ("bootstrap_refresh", bootstrap_refresh, 0.0, L.MANAGER_PARAM_BOOTSTRAP_REFRESH)):
            if val is not None:  # seconds; the C field is the name + "_s"
                setattr(p, name + "_s", L.as_float(val, name, low))
                p.field_mask |= bit
        if heartbeat_interval is not None or heartbeat_max_failures is not None:
            env = ("KVBRIDGE_HEARTBEAT_INTERVAL", "SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL")
            p.heartbeat_interval_s = (
                L.as_float(heartbeat_interval, "heartbeat_interval", 0.0)
                if heartbeat_interval is not None else _env_num(env, 5.0, float))
            env = ("KVBRIDGE_HEARTBEAT_MAX_FAILURE", "SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE")
            p.heartbeat_max_failures = (
                L.as_int(heartbeat_max_failures, "heartbeat_max_failures", 1, 1000000)
                if heartbeat_max_failures is not None else _env_num(env, 2, int))
            p.field_mask |= L.MANAGER_PARAM_HEARTBEAT
        if transfer_threads is not None or transfer_queues is not None:
            cpus = os.cpu_count() or 1
            dflt = min(max(4, int(0.75 * cpus) // 8), 12)
            env = ("KVBRIDGE_THREAD_POOL_SIZE", "SGLANG_DISAGGREGATION_THREAD_POOL_SIZE")
            p.transfer_threads = (L.as_int(transfer_threads, "transfer_threads", 1, 1024)
                                  if transfer_threads is not None else _env_num(env, dflt, int))
            env = ("KVBRIDGE_QUEUE_SIZE", "SGLANG_DISAGGREGATION_QUEUE_SIZE")
            p.transfer_queues = (L.as_int(transfer_queues, "transfer_queues", 1, 1024)
                                 if transfer_queues is not None else _env_num(env, 4, int))
            p.field_mask |= L.MANAGER_PARAM_THREADS
        if sglang_dialect is not None:  # bootstrap dialect: 2025 or 2026 (docs/bootstrap.md)
            if sglang_dialect not in (2025, 2026) or isinstance(sglang_dialect, bool):
                raise InvalidArgument(f"sglang_dialect must be 2025 or 2026, not {sglang_dialect!r}")
            p.sglang_dialect = sglang_dialect
            p.field_mask |= L.MANAGER_PARAM_SGLANG_DIALECT
        if kv_cache_dtype is not None:  # e.g. SGLang's --kv-cache-dtype; checked by the C side
            self._dtype_b = L.as_str(kv_cache_dtype, "kv_cache_dtype").encode()
            p.kv_cache_dtype = self._dtype_b
            p.field_mask |= L.MANAGER_PARAM_KV_CACHE_DTYPE
        if draft_layers is not None:  # speculative decoding: docs/python.md
            p.draft_layers = L.as_int(draft_layers, "draft_layers", 0, 0xFFFF)
            p.field_mask |= L.MANAGER_PARAM_DRAFT_LAYERS
        if cachepd_contract is not None:  # TokenSpeed's contract of the model: docs/python.md
            if isinstance(cachepd_contract, (bytes, bytearray)):
                cachepd_contract = bytes(cachepd_contract).decode("latin-1")
            text = L.as_str(cachepd_contract, "cachepd_contract")
            if not text.isascii():
                raise InvalidArgument("cachepd_contract must be ASCII JSON text (as "
                                      "TokenSpeed's to_wire_bytes writes it)")
            self._cpd_b = text.encode("ascii")
            p.cachepd_contract = self._cpd_b
            p.field_mask |= L.MANAGER_PARAM_CACHEPD_CONTRACT
        if integrity is not None:  # "off" | "check": docs/integrity.md
            if integrity not in ("off", "check"):
                raise InvalidArgument(f"integrity must be 'off' or 'check', not {integrity!r}")
            p.integrity = 1 if integrity == "check" else 0
            p.field_mask |= L.MANAGER_PARAM_INTEGRITY
        if sglang_kv_checksum_aux is not None:  # docs/integrity.md, "With SGLang's own checksum"
            p.sglang_kv_checksum_aux = L.as_int(sglang_kv_checksum_aux, "sglang_kv_checksum_aux",
                                                -1, 0x7FFFFFFF)
            p.field_mask |= L.MANAGER_PARAM_SGLANG_KV_CHECKSUM
        self._auth_b = _auth_params(p, bootstrap_token, curve_secret_key,
                                    curve_client_secret_key, curve_allowed_clients)
        cargs, self._keep = _args_struct(args, self.is_mla, p.pp_rank, p.pp_size)
        er = getattr(args, "engine_rank", None)
        cargs.engine_rank = (p.attn_tp_rank if er is None else
                             L.as_int(er, "KVArgs.engine_rank", 0, 0x7FFFFFFF))
        p.kv_args = ctypes.pointer(cargs)
        self.kv_args = args
        if engine is None:
            # Its own engine only carries PD's writes: it answers no reads.
            engine = TransferEngine(host, 0, transport, serve_reads=False)
            self._owns_engine = True
        elif not isinstance(engine, TransferEngine):
            raise InvalidArgument(f"engine must be a TransferEngine, not {type(engine).__name__}")
        self._engine = engine
        try:
            h = ctypes.c_void_p()
            with engine._guard:
                p.engine = engine._h
                st = L.lib().kvb_manager_create(ctypes.byref(p), ctypes.byref(h))
                if st != L.KVB_OK:
                    why = L.text(L.lib().kvb_manager_last_error(None))
                    if not why and mode_c == 0 and st in (L.KVB_ERR_PEER, L.KVB_ERR_TIMEOUT,
                                                          L.KVB_ERR_PROTO, L.KVB_ERR_AUTH):
                        # the library logs this one but keeps no text for it
                        why = (f"registration with bootstrap server {self.bootstrap_addr} "
                               f"failed: {L.status_string(st)} (details in the log)")
                    raise KVBridgeError(st, f"cannot create the {self.mode} KVManager: "
                                            f"{why or L.status_string(st)}")
                self._h = h.value
                engine._add_user(self)
        except BaseException:
            if self._owns_engine:
                engine.close()
            self._engine = None
            raise
        self._guard.closed = False
        self._endpoint = L.text(L.lib().kvb_manager_endpoint(self._h))
        L.track(self, 0)

    # ---- life
    def close(self):
        """Close live senders/receivers, stop the manager, unregister its
        buffers, and close the engine if this manager created it."""
        if not self._guard.close() or self._h is None:
            return
        with self._children_lock:
            kids = list(self._children)
        for k in kids:
            k.clear()
        L.lib().kvb_manager_destroy(self._h)
        self._h = None
        eng, self._engine = self._engine, None
        if eng is not None:
            eng._discard_user(self)
            if self._owns_engine:
                eng.close()


    def _add_child(self, c):
        with self._children_lock:
            self._children.add(c)

    def _discard_child(self, c):
        with self._children_lock:
            self._children.discard(c)

    def _error(self, st, what):
        detail = L.text(L.lib().kvb_manager_last_error(self._h))
        return KVBridgeError(st, f"{what}: {detail or L.status_string(st)}")

    # ---- queries
    @property
    def engine(self):
        with self._guard:
            return self._engine

    def get_session_id(self):
        """The engine's session id ("host:port") peers write to."""
        with self._guard:
            return self._engine.get_session_id()

    @property
    def endpoint(self):
        """"ip:port" of the control socket (the seeds' local_ip:rank_port)."""
        with self._guard:
            return self._endpoint

    @property
    def rank_port(self):
        return int(self.endpoint.rsplit(":", 1)[1])

    @property
    def last_error(self):
        with self._guard:
            return L.text(L.lib().kvb_manager_last_error(self._h))

    def stats(self):
        """{"bad_messages", "rooms", "transfers_failed", "registrations",
        "registrations_evicted", "registrations_refused"} counters."""
        with self._guard:
            s = L.ManagerStats()
            L.lib().kvb_manager_stats(self._h, ctypes.byref(s))
            return {k: getattr(s, k) for k, _ in L.ManagerStats._fields_}

    def limits(self):
        """Counters of the caps on what peers can make this rank hold
        (docs/security.md): {"registrations_impostor", "registration_bytes",
        "registrations_too_big", "wire_rooms", "wire_room_bytes",
        "wire_rooms_refused", "wire_rooms_evicted", "push_sockets",
        "push_sockets_evicted"}."""
        with self._guard:
            s = L.ManagerLimits(field_mask=L.MANAGER_LIMITS_ALL)
            L.lib().kvb_manager_limits(self._h, ctypes.byref(s))
            return {k: getattr(s, k) for k, _ in L.ManagerLimits._fields_ if k != "field_mask"}

    def event_fd(self):
        """A file descriptor (eventfd, owned by the manager: do not close it)
        that turns readable when one of this manager's rooms may poll
        differently. Wait on it (select/poll/asyncio add_reader), read 8
        bytes to reset it, then poll_many() the rooms (or only those
        changed() names). It is also written once a second while a room's
        time-out has passed."""
        with self._guard:
            fd = ctypes.c_int(-1)
            st = L.lib().kvb_manager_event_fd(self._h, ctypes.byref(fd))
            if st != 0:
                raise KVBridgeError(st, L.text(L.lib().kvb_manager_last_error(self._h)))
            return fd.value

    def changed(self, cap=4096):
        """Ids (ints) of this manager's rooms whose poll answer may have
        changed since they were last returned here, oldest first, each once
        (kvb_manager_changed); all of them, fetched cap at a time. Read the
        event_fd first, then poll_many() only the rooms named here. Rooms
        whose time-out passed are listed too (the manager's once-a-second
        sweep), so no periodic pass over every room is needed; a new handle's
        own first state is not: poll it once. An id can name a room you hold
        no handle for: ignore it."""
        if cap < 1:
            raise InvalidArgument("cap must be at least 1")
        buf = (ctypes.c_uint64 * cap)()
        n = ctypes.c_size_t(0)
        out = []
        with self._guard:
            while True:
                st = L.lib().kvb_manager_changed(self._h, buf, cap, ctypes.byref(n))
                if st != 0:
                    raise KVBridgeError(st, L.text(L.lib().kvb_manager_last_error(self._h)))
                out.extend(buf[:n.value])
                if n.value < cap:
                    return out

    def traffic(self):
        """Monotonic traffic counters: {"control_sent", "control_send_failed",
        "control_received", "bootstrap_requests", "bootstrap_failed",
        "heartbeat_requests", "heartbeat_failed", "integrity_sent",
        "integrity_checked", "integrity_mismatches", "integrity_unchecked"}
        (kvb_manager_traffic; integrity: docs/integrity.md)."""
        with self._guard:
            s = L.ManagerTraffic(field_mask=L.MANAGER_TRAFFIC_ALL)
            L.lib().kvb_manager_traffic(self._h, ctypes.byref(s))
            return {k: getattr(s, k) for k, _ in L.ManagerTraffic._fields_ if k != "field_mask"}

    def sglang_kv_checksum(self, kv_indices):
        """SGLang 0.5.23's KV checksum (--disaggregation-enable-kv-checksum)
        of this rank's host KV at pages kv_indices: one Adler-32 over every KV
        buffer in registration order, the pages in the order given
        (kvb_manager_sglang_kv_checksum). A prefill fills its kv_checksum aux
        row with it and SGLang's layout signature before the last chunk."""
        arr, n = L.index_array(kv_indices, "kv_indices")
        with self._guard:
            d = ctypes.c_uint64()
            st = L.lib().kvb_manager_sglang_kv_checksum(self._h, arr, n, ctypes.byref(d))
            if st != L.KVB_OK:
                raise self._error(st, "KVManager.sglang_kv_checksum")
            return d.value


class TimelineEvent(tuple):
    """(event, seconds since the room was created, detail); .value: the
    event's value (a kvb_poll_t status, a count, or 0)."""

    def __new__(cls, event, t, detail, value=0):
        self = super().__new__(cls, (event, t, detail))
        self.value = value
        return self

    event = property(lambda self: self[0])
    t = property(lambda self: self[1])
    detail = property(lambda self: self[2])


class Timeline(list):
    """A room's timeline: TimelineEvent items; .age, .dropped, .room."""

    age = 0.0
    dropped = 0
    room = 0


def _timeline(kind, call):
    lib = L.lib()
    p = ctypes.POINTER(L.Timeline)()
    st = call(lambda h: getattr(lib, f"kvb_{kind}_timeline")(h, ctypes.byref(p)))
    if st != 0:
        L.raise_status(st, f"kvb_{kind}_timeline failed")
    try:
        tl = p.contents
        out = Timeline(TimelineEvent(L.text(lib.kvb_event_name(e.event)), e.t_s,
                                     L.text(e.detail), e.value)
                       for e in (tl.events[i] for i in range(tl.n)))
        out.age, out.dropped, out.room = tl.age_s, tl.dropped, tl.room
        return out
    finally:
        lib.kvb_timeline_free(p)


def metrics_text():
    """The process's metrics in Prometheus text format (a snapshot;
    docs/observe.md)."""
    lib = L.lib()
    p = ctypes.POINTER(L.Metrics)()
    st = lib.kvb_metrics_snapshot(ctypes.byref(p))
    if st != 0:
        L.raise_status(st, "kvb_metrics_snapshot failed")
    try:
        return ctypes.string_at(p.contents.text, p.contents.len).decode()
    finally:
        lib.kvb_metrics_free(p)


def metrics_addr():
    """"host:port" the /metrics listener serves on (KVBRIDGE_METRICS_ADDR),
    or None."""
    v = L.lib().kvb_metrics_addr()
    return L.text(v) if v else None


class _Room(L.Closeable):
    """Shared parts of KVSender and KVReceiver: the C handle behind a lock
    (the C objects may not be used by two threads at once), the cached
    conclusion, clear() and failure_exception()."""

    _kind = ""

    def _setup(self, mgr, bootstrap_addr, bootstrap_room):
        self._lock = threading.Lock()
        self._h = None
        self._concluded = None
        self._reason = None
        if not isinstance(mgr, KVManager):
            raise InvalidArgument(f"mgr must be a KVManager, not {type(mgr).__name__}")
        self.kv_mgr = mgr
        self.bootstrap_addr = L.as_str(bootstrap_addr, "bootstrap_addr")
        if bootstrap_room is None:
            raise InvalidArgument("bootstrap_room is required")
        self.bootstrap_room = L.as_int(bootstrap_room, "bootstrap_room", 0, L.U64_MAX)

    def _created(self, h):
        self._h = h
        self.kv_mgr._add_child(self)

    def _call(self, fn):
        with self._lock:
            if self._h is None:
                raise RuntimeError(f"{type(self).__name__} of room {self.bootstrap_room} "
                                   f"is cleared")
            return fn(self._h)

    def poll(self):
        """KVPoll of the room. After clear(), the conclusion polled before
        (Success/Failed), or Failed."""
        with self._lock:
            if self._h is None:
                return self._concluded if self._concluded is not None else KVPoll.Failed
            st = KVPoll(getattr(L.lib(), f"kvb_{self._kind}_poll")(self._h))
            if st in (KVPoll.Success, KVPoll.Failed):
                self._concluded = st
            return st

    def abort(self):
        """Fail the room "Aborted by AbortReq." (seed abort)."""
        self._call(getattr(L.lib(), f"kvb_{self._kind}_abort"))

    def clear(self):
        """Forget the room and free the C object (seed clear). Idempotent."""
        with self._lock:
            h, self._h = self._h, None
            if h is not None:
                getattr(L.lib(), f"kvb_{self._kind}_destroy")(h)
        self.kv_mgr._discard_child(self)

    close = clear

    def failure_reason(self):
        """The recorded failure reason (consumed, as the seeds pop it)."""
        with self._lock:
            if self._h is not None:
                buf = ctypes.create_string_buffer(2048)
                getattr(L.lib(), f"kvb_{self._kind}_failure")(self._h, buf, len(buf))
                self._reason = L.text(buf.value) or self._reason
            return self._reason or _UNKNOWN_REASON

    def timeline(self):
        """The room's timeline (docs/observe.md): a list of (event, seconds
        since the room was created, detail), oldest first, each also with
        .value (the event's status or count). The list's .age is the room's
        age when read (with the last event: how long it has been in that
        stage), .dropped the events the room's ring did not keep. A snapshot;
        empty with KVBRIDGE_TIMELINE=0."""
        return _timeline(self._kind, self._call)

    def failure_exception(self):
        """Raise KVTransferError(bootstrap_room, reason) and clear the room
        (seed failure_exception)."""
        reason = self.failure_reason()
        if self._concluded is None:
            self._concluded = KVPoll.Failed
        self.clear()
        raise KVTransferError(self.bootstrap_room, reason)

    @property
    def closed(self):
        return getattr(self, "_h", None) is None

    def _finish(self):
        self.clear()


class KVSender(_Room):
    """Prefill side of one room (seed MooncakeKVSender). Bootstrapping until
    every decode rank that needs this rank sent its transfer info, then
    WaitingForInput: call init(num_kv_indices, aux_index) and send() chunks.
    dest_tp_ranks and pp_rank are accepted for the seed's signature only."""

    _kind = "sender"

    def __init__(self, mgr, bootstrap_addr, bootstrap_room, dest_tp_ranks=None, pp_rank=None):
        self._setup(mgr, bootstrap_addr, bootstrap_room)
        self.num_kv_indices = None
        self.aux_index = None
        self.curr_idx = 0
        h = ctypes.c_void_p()
        with mgr._guard:
            st = L.lib().kvb_sender_create(mgr._h, self.bootstrap_addr.encode(),
                                           self.bootstrap_room, ctypes.byref(h))
            if st != L.KVB_OK:
                raise mgr._error(st, f"KVSender for room {self.bootstrap_room}")
            self._created(h.value)

    def init(self, num_kv_indices, aux_index=None):
        """The request has num_kv_indices pages; aux_index is its aux slot
        (required when the manager has aux buffers: KVBridgeError otherwise)."""
        n = L.as_int(num_kv_indices, "num_kv_indices", 1, L.U64_MAX)
        aux = -1 if aux_index is None else L.as_int(aux_index, "aux_index", 0, 0x7FFFFFFF)

        def f(h):
            st = L.lib().kvb_sender_init(h, n, aux)
            if st != L.KVB_OK:
                raise self.kv_mgr._error(st, f"KVSender.init of room {self.bootstrap_room}")
        self._call(f)
        self.num_kv_indices, self.aux_index = n, aux_index

    def send(self, kv_indices, state_indices=None):
        """Queue the next chunk: prefill page indices of the next len(kv_indices)
        pages. The chunk reaching num_kv_indices is the last (carries aux, and
        state: state_indices are this request's prefill state slots, one per
        state index the decode passed; give them with any chunk up to the
        last). Raises KVBridgeError when the room is not WaitingForInput yet or
        the chunk runs past num_kv_indices. Chunks of a failed room are
        dropped."""
        arr, n = L.index_array(kv_indices, "kv_indices")
        sarr, sn = (None, 0) if state_indices is None else \
            L.index_array(state_indices, "state_indices")

        def f(h):
            if sarr is not None:
                st = L.lib().kvb_sender_set_state_indices(h, sarr, sn)
                if st != L.KVB_OK:
                    raise self.kv_mgr._error(st, f"KVSender.send (state) of room "
                                                 f"{self.bootstrap_room}")
            st = L.lib().kvb_sender_send(h, arr, n)
            if st != L.KVB_OK:
                raise self.kv_mgr._error(st, f"KVSender.send of room {self.bootstrap_room}")
        self._call(f)
        self.curr_idx += n

    def num_layers(self):
        """This rank's target layers: the range send_layers counts in."""
        return self._call(lambda h: L.lib().kvb_sender_num_layers(h))

    def send_layers(self, kv_indices, layer_begin, layer_end, state_indices=None):
        """Layerwise send (kvb_sender_send_layers): queue layers
        [layer_begin, layer_end) of the next chunk's pages as the forward
        produces them; the pieces of a chunk start at 0, follow each other and
        carry the same kv_indices; the piece ending at num_layers() completes
        the chunk (and, on the last chunk, carries aux and state). The decode
        sees only writes until Success, after the last piece."""
        arr, n = L.index_array(kv_indices, "kv_indices")
        lb = L.as_int(layer_begin, "layer_begin", 0, 0xFFFFFFFF)
        le = L.as_int(layer_end, "layer_end", 0, 0xFFFFFFFF)
        sarr, sn = (None, 0) if state_indices is None else \
            L.index_array(state_indices, "state_indices")

        def f(h):
            if sarr is not None:
                st = L.lib().kvb_sender_set_state_indices(h, sarr, sn)
                if st != L.KVB_OK:
                    raise self.kv_mgr._error(st, f"KVSender.send_layers (state) of room "
                                                 f"{self.bootstrap_room}")
            st = L.lib().kvb_sender_send_layers(h, arr, n, lb, le)
            if st != L.KVB_OK:
                raise self.kv_mgr._error(st, f"KVSender.send_layers of room "
                                             f"{self.bootstrap_room}")
            return le == L.lib().kvb_sender_num_layers(h)
        if self._call(f):
            self.curr_idx += n

    def set_first_token(self, token, spec_candidate_ids=None):
        """TokenSpeed decodes: the first output token (and speculative
        candidate token ids) sent in this room's Success status
        (kvb_sender_set_first_token). Call before the last chunk."""
        tok = L.as_int(token, "token", -1, (1 << 63) - 1)
        carr, cn = (None, 0) if spec_candidate_ids is None else \
            L.index_array(spec_candidate_ids, "spec_candidate_ids")

        def f(h):
            st = L.lib().kvb_sender_set_first_token(h, tok, carr, cn)
            if st != L.KVB_OK:
                raise self.kv_mgr._error(st, f"KVSender.set_first_token of room "
                                             f"{self.bootstrap_room}")
        self._call(f)

    def set_prefill_info(self, cached_tokens=None, logprob=None):
        """TokenSpeed 0.1.1 (CachePD) decodes: what else this room's Success
        status carries: this prefill's prefix-cache hit in tokens
        (kvb_sender_set_cached_tokens) and the first token's logprob
        (kvb_sender_set_first_logprob). None leaves either unset. Call before
        the last chunk."""
        cached = None if cached_tokens is None else \
            L.as_int(cached_tokens, "cached_tokens", 0, (1 << 63) - 1)
        lp = None if logprob is None else float(logprob)
        if lp is not None and lp != lp:
            raise L.InvalidArgument("logprob must be a number, not NaN")

        def check(st, name):
            if st != L.KVB_OK:
                raise self.kv_mgr._error(st, f"KVSender.set_prefill_info ({name}) of room "
                                             f"{self.bootstrap_room}")

        def f(h):
            if cached is not None:
                check(L.lib().kvb_sender_set_cached_tokens(h, cached), "cached_tokens")
            if lp is not None:
                check(L.lib().kvb_sender_set_first_logprob(h, lp), "logprob")
        self._call(f)


def _page_mask(mask, n):
    if mask is None:
        return None
    np = L._numpy()
    if np is not None and isinstance(mask, np.ndarray):
        if mask.ndim != 1 or mask.dtype.kind not in "biu":
            raise InvalidArgument("page_mask must be a 1-D bool/integer array")
        vals = (np.ascontiguousarray(mask) != 0).astype(np.uint8).tobytes()
    elif isinstance(mask, (bytes, bytearray, memoryview)):
        vals = bytes(1 if b else 0 for b in bytes(mask))
    else:
        try:
            vals = bytes(1 if bool(b) else 0 for b in mask)
        except TypeError:
            raise InvalidArgument(f"page_mask must be a sequence of bools, "
                                  f"not {type(mask).__name__}") from None
    if len(vals) != n:
        raise InvalidArgument(f"page_mask has {len(vals)} entries for {n} indices")
    return (ctypes.c_uint8 * max(n, 1)).from_buffer_copy(vals or b"\0")


class KVReceiver(_Room):
    """Decode side of one room (seed MooncakeKVReceiver): looks up the
    prefill ranks via the bootstrap server (failures show as poll() == Failed
    with the seeds' reason, as in the seed), init() sends the destination
    pages. data_parallel_rank None routes by room % prefill DP size."""

    _kind = "receiver"

    def __init__(self, mgr, bootstrap_addr, bootstrap_room=None, data_parallel_rank=None):
        self._setup(mgr, bootstrap_addr, bootstrap_room)
        dp = -1 if data_parallel_rank is None else L.as_int(
            data_parallel_rank, "data_parallel_rank", 0, 0x7FFFFFFF)
        self.data_parallel_rank = data_parallel_rank
        h = ctypes.c_void_p()
        with mgr._guard:
            st = L.lib().kvb_receiver_create(mgr._h, self.bootstrap_addr.encode(),
                                             self.bootstrap_room, dp, ctypes.byref(h))
            if st != L.KVB_OK:
                raise mgr._error(st, f"KVReceiver for room {self.bootstrap_room}")
            self._created(h.value)

    def init(self, kv_indices, aux_index=None, state_indices=None, prefix_tokens=0,
             page_mask=None, prompt_tokens=None):
        """Send the pre-allocated decode page indices (and aux slot) to the
        sources; status → WaitingForInput. aux_index may be left out only
        when the manager has no aux buffers (KVBridgeError otherwise, and
        nothing is sent). kvbridge extras: state_indices,
        prefix_tokens (tokens already on the decode, a page multiple),
        page_mask (one bool per index: False = page already present),
        prompt_tokens (the prompt's exact length, which a TokenSpeed 0.1.1
        CachePD prefill needs; default: every page full)."""
        arr, n = L.index_array(kv_indices, "kv_indices")
        aux = -1 if aux_index is None else L.as_int(aux_index, "aux_index", 0, 0x7FFFFFFF)
        ex = L.ReceiverInit()
        keep = []
        if state_indices is not None:
            sarr, sn = L.index_array(state_indices, "state_indices")
            keep.append(sarr)
            ex.state_indices = ctypes.cast(sarr, L.c_i32_p)
            ex.num_state_indices = sn
            ex.field_mask |= L.RECV_INIT_STATE
        prefix = L.as_int(prefix_tokens, "prefix_tokens", 0, L.U64_MAX)
        if prefix:
            ex.prefix_tokens = prefix
            ex.field_mask |= L.RECV_INIT_PREFIX
        m = _page_mask(page_mask, n)
        if m is not None:
            keep.append(m)
            ex.page_mask = ctypes.cast(m, ctypes.POINTER(ctypes.c_uint8))
            ex.field_mask |= L.RECV_INIT_MASK
        if prompt_tokens is not None:
            ex.prompt_tokens = L.as_int(prompt_tokens, "prompt_tokens", 1, L.U64_MAX)
            ex.field_mask |= L.RECV_INIT_PROMPT

        def f(h):
            st = L.lib().kvb_receiver_init(h, arr, n, aux,
                                           ctypes.byref(ex) if ex.field_mask else None)
            if st != L.KVB_OK:
                raise self.kv_mgr._error(st, f"KVReceiver.init of room {self.bootstrap_room}")
        self._call(f)
        self.kv_indices_len = n

    def pages_safe(self):
        """True when nothing can land in this room's pages any more (Success,
        or Failed with every source quiescent); False while it runs or while
        a source may still write them (re-checked on each call). poll()
        already holds a failed room as Transferring until then, up to
        KVBRIDGE_ABORT_ACK_TIMEOUT (docs/engine.md, "The writer fence").
        Ask before clear()."""
        return bool(self._call(lambda h: L.lib().kvb_receiver_pages_safe(h)))

    def first_token(self):
        """(token, spec_candidate_ids) a TokenSpeed prefill's Success carried,
        or None before it (or from another dialect)."""
        tok = ctypes.c_int64(-1)
        n = ctypes.c_size_t(0)
        cands = (ctypes.c_int32 * 4096)()
        known = self._call(lambda h: L.lib().kvb_receiver_first_token(
            h, ctypes.byref(tok), cands, 4096, ctypes.byref(n)))
        return (tok.value, list(cands[: n.value])) if known else None

    def prefill_info(self):
        """(cached_tokens, logprob) a TokenSpeed 0.1.1 (CachePD) prefill's
        Success carried, the twin of KVSender.set_prefill_info: its prefix-cache
        hit in tokens (the largest among the room's sources) and the first
        token's logprob (None when not sent); None before a Success said
        either (or from another dialect)."""
        cached = ctypes.c_uint64(0)
        lp = ctypes.c_double(0)
        has_c = self._call(lambda h: L.lib().kvb_receiver_cached_tokens(h, ctypes.byref(cached)))
        has_l = self._call(lambda h: L.lib().kvb_receiver_first_logprob(h, ctypes.byref(lp)))
        if not has_c and not has_l:
            return None
        return (cached.value, lp.value if has_l else None)


def poll_many(rooms):
    """KVPoll of every KVSender or KVReceiver in rooms (one kind only), in
    one C call (kvb_sender_poll_many / kvb_receiver_poll_many: one lock round
    trip per manager instead of one per room). Same answers as calling
    poll() on each; cleared rooms answer their conclusion (or Failed)."""
    rooms = list(rooms)
    if not rooms:
        return []
    kind = type(rooms[0])
    if kind not in (KVSender, KVReceiver) or any(type(r) is not kind for r in rooms):
        raise InvalidArgument("poll_many takes KVSender objects or KVReceiver objects, "
                              "not a mix")
    # Each room's lock is held for the call (the C objects may not be used by
    # two threads at once); taken in one global order so that two threads
    # polling overlapping lists cannot deadlock.
    uniq = {id(r): r for r in rooms}
    locked = sorted(uniq.values(), key=id)
    for r in locked:
        r._lock.acquire()
    try:
        live = [r for r in rooms if r._h is not None]
        out = {}
        if live:
            hs = (ctypes.c_void_p * len(live))(*[r._h for r in live])
            st = (ctypes.c_int * len(live))()
            fn = getattr(L.lib(), f"kvb_{kind._kind}_poll_many")
            rc = fn(hs, len(live), st)
            if rc != 0:
                raise KVBridgeError(rc, f"kvb_{kind._kind}_poll_many failed")
            for r, v in zip(live, st):
                p = KVPoll(v)
                if p in (KVPoll.Success, KVPoll.Failed):
                    r._concluded = p
                out[id(r)] = p
        return [out[id(r)] if id(r) in out else
                (r._concluded if r._concluded is not None else KVPoll.Failed) for r in rooms]
    finally:
        for r in reversed(locked):
            r._lock.release()
