"""Loading libkvbridge.so, its prototypes, errors and argument checks.

The library is looked up, in order: the path in KVBRIDGE_LIB; a
libkvbridge.so next to this package; the installed library whose directory
`pip install ./python` recorded in _installed.py (setup.py: KVBRIDGE_LIBDIR or
pkg-config's libdir of kvbridge); build/libkvbridge.so of the source tree this
package sits in (python/kvbridge → ../../build); the system library path
(ctypes.util.find_library, then the bare sonames). It is loaded once, on first
use, with ctypes.CDLL: every foreign call releases the GIL.
"""

import atexit
import ctypes
import ctypes.util
import operator
import os
import threading
import weakref

__all__ = []

# ---------------------------------------------------------------- statuses

KVB_OK = 0
KVB_ERR_INVALID = -1
KVB_ERR_NOMEM = -2
KVB_ERR_BOUNDS = -3
KVB_ERR_OVERLAP = -4
KVB_ERR_NOT_FOUND = -5
KVB_ERR_TIMEOUT = -6
KVB_ERR_PEER = -7
KVB_ERR_PROTO = -8
KVB_ERR_CANCELED = -9
KVB_ERR_IO = -10
KVB_ERR_INPROGRESS = -11
KVB_ERR_AUTH = -12
KVB_ERR_STATE = -13
KVB_ERR_UNSUPPORTED = -14
KVB_ERR_FENCED = -15
KVB_ERR_UNSETTLED = -16
KVB_ERR_BUSY = -17

STATUS_NAMES = {
    KVB_OK: "KVB_OK",
    KVB_ERR_INVALID: "KVB_ERR_INVALID",
    KVB_ERR_NOMEM: "KVB_ERR_NOMEM",
    KVB_ERR_BOUNDS: "KVB_ERR_BOUNDS",
    KVB_ERR_OVERLAP: "KVB_ERR_OVERLAP",
    KVB_ERR_NOT_FOUND: "KVB_ERR_NOT_FOUND",
    KVB_ERR_TIMEOUT: "KVB_ERR_TIMEOUT",
    KVB_ERR_PEER: "KVB_ERR_PEER",
    KVB_ERR_PROTO: "KVB_ERR_PROTO",
    KVB_ERR_CANCELED: "KVB_ERR_CANCELED",
    KVB_ERR_IO: "KVB_ERR_IO",
    KVB_ERR_INPROGRESS: "KVB_ERR_INPROGRESS",
    KVB_ERR_AUTH: "KVB_ERR_AUTH",
    KVB_ERR_STATE: "KVB_ERR_STATE",
    KVB_ERR_UNSUPPORTED: "KVB_ERR_UNSUPPORTED",
    KVB_ERR_FENCED: "KVB_ERR_FENCED",
    KVB_ERR_UNSETTLED: "KVB_ERR_UNSETTLED",
    KVB_ERR_BUSY: "KVB_ERR_BUSY",
}


class KVBridgeError(RuntimeError):
    """A kvbridge C call failed. `status` is the negative kvb_status_t, `message`
    the library's detailed text (kvb_*_last_error) when it gave one."""

    def __init__(self, status, message):
        self.status = int(status)
        self.message = message
        super().__init__(f"{message} [{STATUS_NAMES.get(self.status, self.status)}]")


class InvalidArgument(ValueError, TypeError):
    """A bad argument caught before any C call: wrong type, out of range,
    inconsistent lengths. A ValueError (and a TypeError, for wrong types)."""


# ---------------------------------------------------------------- structs

c_u64_p = ctypes.POINTER(ctypes.c_uint64)
c_i32_p = ctypes.POINTER(ctypes.c_int32)


class EngineParams(ctypes.Structure):
    _fields_ = [
        ("field_mask", ctypes.c_uint64),
        ("host", ctypes.c_char_p),
        ("port", ctypes.c_uint16),
        ("transport", ctypes.c_int),
        ("connect_timeout_s", ctypes.c_double),
        ("peer_timeout_s", ctypes.c_double),
        ("am_chunk_bytes", ctypes.c_size_t),
        ("secret", ctypes.c_char_p),
        ("copy_threads", ctypes.c_uint),
        ("serve_reads", ctypes.c_int),
        ("reads_need_grant", ctypes.c_int),
        ("name", ctypes.c_char_p),
    ]


ENGINE_PARAM_HOST = 1 << 0
ENGINE_PARAM_PORT = 1 << 1
ENGINE_PARAM_TRANSPORT = 1 << 2
ENGINE_PARAM_CONNECT_TIMEOUT = 1 << 3
ENGINE_PARAM_PEER_TIMEOUT = 1 << 4
ENGINE_PARAM_AM_CHUNK = 1 << 5
ENGINE_PARAM_SECRET = 1 << 6
ENGINE_PARAM_COPY_THREADS = 1 << 7
ENGINE_PARAM_SERVE_READS = 1 << 8
ENGINE_PARAM_READS_NEED_GRANT = 1 << 9
ENGINE_PARAM_NAME = 1 << 10
NOTIF_MAX_LEN = 65536  # KVB_NOTIF_MAX_LEN
NOTIF_NAME_MAX = 255  # KVB_NOTIF_NAME_MAX


class Notif(ctypes.Structure):  # kvb_notif_t
    _fields_ = [("sender", ctypes.c_void_p), ("msg", ctypes.c_void_p), ("len", ctypes.c_size_t)]

TRANSPORTS = {"auto": 0, "tcp": 1, "shm": 2}


class MemRegion(ctypes.Structure):
    _fields_ = [("addr", ctypes.c_void_p), ("length", ctypes.c_size_t), ("mem_type", ctypes.c_int)]


class MemRegionEx(ctypes.Structure):
    """kvb_mem_region_ex_t (engine.h)."""
    _fields_ = [("field_mask", ctypes.c_uint64), ("addr", ctypes.c_void_p),
                ("length", ctypes.c_size_t), ("mem_type", ctypes.c_int), ("device", ctypes.c_int),
                ("local_only", ctypes.c_int)]


MEM_REGION_FIELD_DEVICE = 1 << 0
MEM_REGION_FIELD_LOCAL_ONLY = 1 << 1

MEM_HOST, MEM_CUDA, MEM_AUTO = 0, 1, 2
MEM_EXPORT_LEN = 64  # KVB_MEM_EXPORT_LEN
MEM_TYPES = {"host": MEM_HOST, "cuda": MEM_CUDA, "auto": MEM_AUTO}


class Block(ctypes.Structure):
    _fields_ = [("src", ctypes.c_uint64), ("dst", ctypes.c_uint64), ("len", ctypes.c_uint64)]


class KVArgsC(ctypes.Structure):
    _fields_ = [
        ("kv_data_ptrs", c_u64_p),
        ("kv_data_lens", c_u64_p),
        ("num_kv", ctypes.c_uint32),
        ("kv_item_len", ctypes.c_uint64),
        ("aux_data_ptrs", c_u64_p),
        ("aux_data_lens", c_u64_p),
        ("aux_item_lens", c_u64_p),
        ("num_aux", ctypes.c_uint32),
        ("state_data_ptrs", c_u64_p),
        ("state_data_lens", c_u64_p),
        ("state_item_lens", c_u64_p),
        ("num_state", ctypes.c_uint32),
        ("page_size", ctypes.c_uint32),
        ("kv_head_num", ctypes.c_uint32),
        ("engine_rank", ctypes.c_int32),
        ("prefill_start_layer", ctypes.c_uint32),
        ("num_layers_total", ctypes.c_uint32),
        ("kv_order", ctypes.c_uint32),
    ]


MANAGER_PARAM_BOOTSTRAP_ADDR = 1 << 0
MANAGER_PARAM_HOST = 1 << 1
MANAGER_PARAM_BOOTSTRAP_TIMEOUT = 1 << 2
MANAGER_PARAM_WAITING_TIMEOUT = 1 << 3
MANAGER_PARAM_HEARTBEAT = 1 << 4
MANAGER_PARAM_THREADS = 1 << 5
MANAGER_PARAM_ROOM_TTL = 1 << 6
MANAGER_PARAM_BOOTSTRAP_TOKEN = 1 << 7
MANAGER_PARAM_CURVE = 1 << 8
MANAGER_PARAM_BOOTSTRAP_REFRESH = 1 << 9
MANAGER_PARAM_SGLANG_DIALECT = 1 << 16
MANAGER_PARAM_KV_CACHE_DTYPE = 1 << 18
MANAGER_PARAM_DRAFT_LAYERS = 1 << 20
MANAGER_PARAM_CACHEPD_CONTRACT = 1 << 21
MANAGER_PARAM_INTEGRITY = 1 << 22
MANAGER_PARAM_SGLANG_KV_CHECKSUM = 1 << 27


class ManagerParams(ctypes.Structure):
    _fields_ = [
        ("field_mask", ctypes.c_uint64),
        ("mode", ctypes.c_int),
        ("kv_args", ctypes.POINTER(KVArgsC)),
        ("engine", ctypes.c_void_p),
        ("attn_tp_size", ctypes.c_int32),
        ("attn_tp_rank", ctypes.c_int32),
        ("attn_dp_size", ctypes.c_int32),
        ("attn_dp_rank", ctypes.c_int32),
        ("pp_size", ctypes.c_int32),
        ("pp_rank", ctypes.c_int32),
        ("system_dp_size", ctypes.c_int32),
        ("system_dp_rank", ctypes.c_int32),
        ("is_mla", ctypes.c_int),
        ("bootstrap_addr", ctypes.c_char_p),
        ("host", ctypes.c_char_p),
        ("bootstrap_timeout_s", ctypes.c_double),
        ("waiting_timeout_s", ctypes.c_double),
        ("heartbeat_interval_s", ctypes.c_double),
        ("heartbeat_max_failures", ctypes.c_int),
        ("transfer_threads", ctypes.c_int),
        ("transfer_queues", ctypes.c_int),
        ("room_ttl_s", ctypes.c_double),
        ("bootstrap_token", ctypes.c_char_p),
        ("curve_secret_key", ctypes.c_char_p),
        ("curve_client_secret_key", ctypes.c_char_p),
        ("curve_allowed_clients", ctypes.c_char_p),
        ("bootstrap_refresh_s", ctypes.c_double),
        ("sglang_dialect", ctypes.c_int),
        ("kv_cache_dtype", ctypes.c_char_p),
        ("draft_layers", ctypes.c_uint32),
        ("cachepd_contract", ctypes.c_char_p),
        ("integrity", ctypes.c_int),
        ("sglang_kv_checksum_aux", ctypes.c_int32),
    ]


class ManagerStats(ctypes.Structure):
    _fields_ = [
        ("bad_messages", ctypes.c_uint64),
        ("rooms", ctypes.c_uint64),
        ("transfers_failed", ctypes.c_uint64),
        ("registrations", ctypes.c_uint64),
        ("registrations_evicted", ctypes.c_uint64),
        ("registrations_refused", ctypes.c_uint64),
    ]


class ManagerLimits(ctypes.Structure):
    """kvb_manager_limits_t (include/kvbridge/conn.h); field_mask: every group."""
    _fields_ = [
        ("field_mask", ctypes.c_uint64),
        ("registrations_impostor", ctypes.c_uint64),
        ("registration_bytes", ctypes.c_uint64),
        ("registrations_too_big", ctypes.c_uint64),
        ("wire_rooms", ctypes.c_uint64),
        ("wire_room_bytes", ctypes.c_uint64),
        ("wire_rooms_refused", ctypes.c_uint64),
        ("wire_rooms_evicted", ctypes.c_uint64),
        ("push_sockets", ctypes.c_uint64),
        ("push_sockets_evicted", ctypes.c_uint64),
    ]


MANAGER_LIMITS_ALL = (1 << 4) - 1


class ManagerTraffic(ctypes.Structure):
    """kvb_manager_traffic_t (include/kvbridge/conn.h); field_mask: every group."""
    _fields_ = [
        ("field_mask", ctypes.c_uint64),
        ("control_sent", ctypes.c_uint64),
        ("control_send_failed", ctypes.c_uint64),
        ("control_received", ctypes.c_uint64),
        ("bootstrap_requests", ctypes.c_uint64),
        ("bootstrap_failed", ctypes.c_uint64),
        ("heartbeat_requests", ctypes.c_uint64),
        ("heartbeat_failed", ctypes.c_uint64),
        ("integrity_sent", ctypes.c_uint64),
        ("integrity_checked", ctypes.c_uint64),
        ("integrity_mismatches", ctypes.c_uint64),
        ("integrity_unchecked", ctypes.c_uint64),
    ]


MANAGER_TRAFFIC_ALL = (1 << 4) - 1

RECV_INIT_STATE = 1 << 0
RECV_INIT_PREFIX = 1 << 1
RECV_INIT_MASK = 1 << 2
RECV_INIT_PROMPT = 1 << 3


class ReceiverInit(ctypes.Structure):
    _fields_ = [
        ("field_mask", ctypes.c_uint64),
        ("state_indices", c_i32_p),
        ("num_state_indices", ctypes.c_size_t),
        ("prefix_tokens", ctypes.c_uint64),
        ("page_mask", ctypes.POINTER(ctypes.c_uint8)),
        ("prompt_tokens", ctypes.c_uint64),
    ]


BOOT_PARAM_HOST = 1 << 0
BOOT_PARAM_PORT = 1 << 1
BOOT_PARAM_TOKEN = 1 << 2
BOOT_PARAM_AUTH_READS = 1 << 3
BOOT_PARAM_THREADS = 1 << 4
BOOT_PARAM_CONN_TIMEOUT = 1 << 5


class BootstrapServerParams(ctypes.Structure):
    _fields_ = [
        ("field_mask", ctypes.c_uint64),
        ("host", ctypes.c_char_p),
        ("port", ctypes.c_uint16),
        ("token", ctypes.c_char_p),
        ("auth_reads", ctypes.c_int),
        ("threads", ctypes.c_uint),
        ("conn_timeout_s", ctypes.c_double),
    ]


# ---------------------------------------------------------------- loading

_P = ctypes.c_void_p
_S = ctypes.c_int  # kvb_status_t
TIMELINE_DETAIL = 64  # KVB_TIMELINE_DETAIL (conn.h)


class TimelineEvent(ctypes.Structure):
    """kvb_timeline_event_t (conn.h)."""
    _fields_ = [("event", ctypes.c_int), ("t_s", ctypes.c_double), ("value", ctypes.c_int64),
                ("detail", ctypes.c_char * TIMELINE_DETAIL)]


class Timeline(ctypes.Structure):
    """kvb_timeline_t (conn.h): a snapshot the caller frees."""
    _fields_ = [("field_mask", ctypes.c_uint64), ("room", ctypes.c_uint64),
                ("age_s", ctypes.c_double), ("dropped", ctypes.c_uint64), ("n", ctypes.c_size_t),
                ("events", ctypes.POINTER(TimelineEvent))]


class Metrics(ctypes.Structure):
    """kvb_metrics_t (metrics.h): a snapshot the caller frees."""
    _fields_ = [("field_mask", ctypes.c_uint64), ("text", ctypes.c_char_p),
                ("len", ctypes.c_size_t)]


_PROTOTYPES = {
    "kvb_status_string": (ctypes.c_char_p, [_S]),
    "kvb_version": (ctypes.c_char_p, []),
    "kvb_log_set_level": (None, [ctypes.c_int]),
    "kvb_log_get_level": (ctypes.c_int, []),
    # engine
    "kvb_engine_create": (_S, [ctypes.POINTER(EngineParams), ctypes.POINTER(_P)]),
    "kvb_engine_destroy": (None, [_P]),
    "kvb_engine_session_id": (ctypes.c_char_p, [_P]),
    "kvb_engine_transport": (ctypes.c_int, [_P]),
    "kvb_engine_last_error": (ctypes.c_char_p, [_P]),
    "kvb_engine_register": (_S, [_P, _P, ctypes.c_size_t, ctypes.c_int]),
    "kvb_engine_register_batch": (_S, [_P, ctypes.POINTER(MemRegion), ctypes.c_size_t]),
    "kvb_engine_register_ex": (_S, [_P, ctypes.POINTER(MemRegionEx), ctypes.c_size_t,
                                    ctypes.c_size_t]),
    "kvb_engine_close_session": (_S, [_P, ctypes.c_char_p]),
    "kvb_mem_query": (_S, [_P, ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_int)]),
    "kvb_cuda_available": (ctypes.c_int, [ctypes.POINTER(ctypes.c_char_p)]),
    "kvb_engine_unregister": (_S, [_P, _P]),
    "kvb_engine_unregister_batch": (_S, [_P, ctypes.POINTER(_P), ctypes.c_size_t]),
    "kvb_engine_write": (_S, [_P, ctypes.c_char_p, ctypes.POINTER(Block), ctypes.c_size_t,
                              ctypes.c_double]),
    "kvb_engine_write_async": (_S, [_P, ctypes.c_char_p, ctypes.POINTER(Block), ctypes.c_size_t,
                                    ctypes.POINTER(_P)]),
    "kvb_pages_check": (_S, [_P, _P, ctypes.c_size_t, _P, ctypes.c_size_t,
                             ctypes.POINTER(ctypes.c_char_p)]),
    "kvb_engine_write_pages": (_S, [_P, ctypes.c_char_p, _P, _P, ctypes.c_size_t, _P,
                                    ctypes.c_size_t, ctypes.c_size_t, ctypes.c_double]),
    "kvb_engine_read": (_S, [_P, ctypes.c_char_p, ctypes.POINTER(Block), ctypes.c_size_t,
                             ctypes.c_double]),
    "kvb_engine_read_async": (_S, [_P, ctypes.c_char_p, ctypes.POINTER(Block), ctypes.c_size_t,
                                   ctypes.POINTER(_P)]),
    "kvb_engine_read_pages": (_S, [_P, ctypes.c_char_p, _P, _P, ctypes.c_size_t, _P,
                                   ctypes.c_size_t, ctypes.c_size_t, ctypes.c_double]),
    "kvb_xfer_test": (_S, [_P]),
    "kvb_xfer_wait": (_S, [_P, ctypes.c_double]),
    "kvb_xfer_cancel": (_S, [_P]),
    "kvb_xfer_expire": (_S, [_P]),
    "kvb_xfer_error": (ctypes.c_char_p, [_P]),
    "kvb_xfer_drained": (ctypes.c_int, [_P]),
    "kvb_xfer_free": (None, [_P]),
    "kvb_engine_session_direct": (ctypes.c_int, [_P, ctypes.c_char_p]),
    "kvb_engine_notify": (_S, [_P, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t,
                               ctypes.c_double]),
    "kvb_engine_get_notifs": (_S, [_P, ctypes.POINTER(Notif), ctypes.c_size_t,
                                   ctypes.POINTER(ctypes.c_size_t)]),
    "kvb_notifs_free": (None, [ctypes.POINTER(Notif), ctypes.c_size_t]),
    "kvb_engine_peer_regions": (_S, [_P, ctypes.c_char_p, ctypes.c_double,
                                     ctypes.POINTER(ctypes.c_uint64),
                                     ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t,
                                     ctypes.POINTER(ctypes.c_size_t)]),
    "kvb_mem_alloc": (_S, [ctypes.c_size_t, ctypes.POINTER(_P)]),
    "kvb_mem_free": (_S, [_P]),
    "kvb_mem_export": (_S, [_P, ctypes.c_char_p]),
    "kvb_mem_import": (_S, [ctypes.c_char_p, ctypes.POINTER(_P), ctypes.POINTER(ctypes.c_size_t)]),
    "kvb_mem_unimport": (_S, [_P]),
    # bootstrap server
    "kvb_bootstrap_server_start": (_S, [ctypes.POINTER(BootstrapServerParams), ctypes.POINTER(_P)]),
    "kvb_bootstrap_server_stop": (None, [_P]),
    "kvb_bootstrap_server_port": (ctypes.c_uint16, [_P]),
    "kvb_bootstrap_server_address": (ctypes.c_char_p, [_P]),
    "kvb_bootstrap_server_num_ranks": (ctypes.c_size_t, [_P]),
    # connector
    "kvb_poll_string": (ctypes.c_char_p, [ctypes.c_int]),
    "kvb_manager_create": (_S, [ctypes.POINTER(ManagerParams), ctypes.POINTER(_P)]),
    "kvb_manager_destroy": (None, [_P]),
    "kvb_manager_last_error": (ctypes.c_char_p, [_P]),
    "kvb_manager_endpoint": (ctypes.c_char_p, [_P]),
    "kvb_manager_stats": (None, [_P, ctypes.POINTER(ManagerStats)]),
    "kvb_manager_limits": (None, [_P, ctypes.POINTER(ManagerLimits)]),
    "kvb_manager_traffic": (None, [_P, ctypes.POINTER(ManagerTraffic)]),
    "kvb_manager_sglang_kv_checksum": (ctypes.c_int, [_P, ctypes.POINTER(ctypes.c_int32),
                                                      ctypes.c_size_t,
                                                      ctypes.POINTER(ctypes.c_uint64)]),
    "kvb_sender_create": (_S, [_P, ctypes.c_char_p, ctypes.c_uint64, ctypes.POINTER(_P)]),
    "kvb_sender_init": (_S, [_P, ctypes.c_uint64, ctypes.c_int64]),
    "kvb_sender_send": (_S, [_P, c_i32_p, ctypes.c_size_t]),
    "kvb_sender_send_layers": (_S, [_P, c_i32_p, ctypes.c_size_t, ctypes.c_uint32,
                                    ctypes.c_uint32]),
    "kvb_sender_num_layers": (ctypes.c_uint32, [_P]),
    "kvb_sender_set_state_indices": (_S, [_P, c_i32_p, ctypes.c_size_t]),
    "kvb_sender_set_first_token": (_S, [_P, ctypes.c_int64, c_i32_p, ctypes.c_size_t]),
    "kvb_sender_set_cached_tokens": (_S, [_P, ctypes.c_uint64]),
    "kvb_sender_set_first_logprob": (_S, [_P, ctypes.c_double]),
    "kvb_sender_poll": (ctypes.c_int, [_P]),
    "kvb_sender_poll_many": (ctypes.c_int, [ctypes.POINTER(_P), ctypes.c_size_t,
                                            ctypes.POINTER(ctypes.c_int)]),
    "kvb_receiver_poll_many": (ctypes.c_int, [ctypes.POINTER(_P), ctypes.c_size_t,
                                              ctypes.POINTER(ctypes.c_int)]),
    "kvb_manager_event_fd": (ctypes.c_int, [_P, ctypes.POINTER(ctypes.c_int)]),
    "kvb_manager_changed": (ctypes.c_int, [_P, ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t,
                                           ctypes.POINTER(ctypes.c_size_t)]),
    "kvb_sender_abort": (None, [_P]),
    "kvb_sender_failure": (None, [_P, ctypes.c_char_p, ctypes.c_size_t]),
    "kvb_sender_destroy": (None, [_P]),
    "kvb_receiver_create": (_S, [_P, ctypes.c_char_p, ctypes.c_uint64, ctypes.c_int32,
                                 ctypes.POINTER(_P)]),
    "kvb_receiver_init": (_S, [_P, c_i32_p, ctypes.c_size_t, ctypes.c_int64,
                               ctypes.POINTER(ReceiverInit)]),
    "kvb_receiver_poll": (ctypes.c_int, [_P]),
    "kvb_receiver_abort": (None, [_P]),
    "kvb_receiver_failure": (None, [_P, ctypes.c_char_p, ctypes.c_size_t]),
    "kvb_receiver_pages_safe": (ctypes.c_int, [_P]),
    "kvb_receiver_first_token": (ctypes.c_int, [_P, ctypes.POINTER(ctypes.c_int64), c_i32_p,
                                                ctypes.c_size_t, ctypes.POINTER(ctypes.c_size_t)]),
    "kvb_receiver_cached_tokens": (ctypes.c_int, [_P, ctypes.POINTER(ctypes.c_uint64)]),
    "kvb_receiver_first_logprob": (ctypes.c_int, [_P, ctypes.POINTER(ctypes.c_double)]),
    "kvb_receiver_destroy": (None, [_P]),
    # timelines and metrics (docs/observe.md)
    "kvb_event_name": (ctypes.c_char_p, [ctypes.c_int]),
    "kvb_sender_timeline": (_S, [_P, ctypes.POINTER(ctypes.POINTER(Timeline))]),
    "kvb_receiver_timeline": (_S, [_P, ctypes.POINTER(ctypes.POINTER(Timeline))]),
    "kvb_timeline_free": (None, [ctypes.POINTER(Timeline)]),
    "kvb_metrics_snapshot": (_S, [ctypes.POINTER(ctypes.POINTER(Metrics))]),
    "kvb_metrics_free": (None, [ctypes.POINTER(Metrics)]),
    "kvb_metrics_addr": (ctypes.c_char_p, []),
}

_lock = threading.Lock()
_lib = None
_lib_path = None


SONAME = "libkvbridge.so.0"  # SOVERSION in CMakeLists.txt


def _installed_libdir():
    """The libdir recorded when this package was pip-installed, or None (a
    source checkout has no _installed.py)."""
    try:
        from ._installed import LIBDIR
    except ImportError:
        return None
    return LIBDIR


def _candidates():
    env = os.environ.get("KVBRIDGE_LIB")
    if env:
        return [env], True
    here = os.path.dirname(os.path.abspath(__file__))
    out = [os.path.join(here, "libkvbridge.so")]
    libdir = _installed_libdir()
    if libdir:
        # The soname: a runtime-only install has no libkvbridge.so link.
        out.append(os.path.join(libdir, SONAME))
    tree = os.path.join(os.path.dirname(os.path.dirname(here)), "build", "libkvbridge.so")
    out.append(tree)
    found = ctypes.util.find_library("kvbridge")
    if found:
        out.append(found)
    out += [SONAME, "libkvbridge.so"]
    return out, False


def compat_path():
    """The folder holding the drop-in modules (compat/, e.g. mooncake/) to put
    on PYTHONPATH, or None when this copy has none: kvbridge/compat in an
    installed package, python/compat in a source checkout."""
    here = os.path.dirname(os.path.abspath(__file__))
    for d in (os.path.join(here, "compat"), os.path.join(os.path.dirname(here), "compat")):
        if os.path.isdir(d):
            return d
    return None


def load_library(path=None):
    """Load libkvbridge.so (once per process) and return the ctypes handle.
    `path` overrides the search; a different path after loading is an error."""
    global _lib, _lib_path
    with _lock:
        if _lib is not None:
            if path is not None and os.path.abspath(path) != os.path.abspath(_lib_path):
                raise RuntimeError(f"kvbridge: library already loaded from {_lib_path}")
            return _lib
        if path is not None:
            cands, explicit = [path], True
        else:
            cands, explicit = _candidates()
        errors = []
        for c in cands:
            # A bare soname goes to the dynamic loader; a path must exist.
            if os.sep in c and not os.path.exists(c):
                if explicit:
                    errors.append(f"{c}: no such file")
                continue
            try:
                lib = ctypes.CDLL(c)
            except OSError as e:
                errors.append(f"{c}: {e}")
                continue
            try:
                for name, (res, args) in _PROTOTYPES.items():
                    fn = getattr(lib, name)
                    fn.restype = res
                    fn.argtypes = args
            except AttributeError as e:
                errors.append(f"{c}: not a compatible libkvbridge ({e})")
                continue
            _lib, _lib_path = lib, c
            return lib
        how = ("KVBRIDGE_LIB" if explicit else
               "search (package dir, installed libdir, source build/, system path)")
        raise OSError(f"kvbridge: cannot load libkvbridge.so via {how}: " + "; ".join(errors))


def lib():
    return _lib if _lib is not None else load_library()


def library_path():
    """The path the library was loaded from (loads it if needed)."""
    lib()
    return _lib_path


def text(b):
    return b.decode("utf-8", "replace") if b else ""


def status_string(st):
    return text(lib().kvb_status_string(int(st)))


def raise_status(st, detail=""):
    """Raise KVBridgeError for a failed status with the best message we have."""
    msg = detail or status_string(st)
    raise KVBridgeError(st, msg)


# ---------------------------------------------------------------- guards

class Guard:
    """Life of one C handle shared by threads: calls enter/leave it, close()
    marks it closed (later calls raise RuntimeError) and waits until the calls
    in progress have left, so the handle is never freed under a running call.
    No Python lock is held while C runs."""

    def __init__(self, what):
        self.what = what
        self._cv = threading.Condition(threading.Lock())
        self._users = 0
        self.closed = False

    def __enter__(self):
        with self._cv:
            if self.closed:
                raise RuntimeError(f"{self.what} is closed")
            self._users += 1
        return self

    def __exit__(self, *exc):
        with self._cv:
            self._users -= 1
            if self._users == 0:
                self._cv.notify_all()
        return False

    def close(self):
        """True for the caller that closed it (it then frees the handle)."""
        with self._cv:
            if self.closed:
                return False
            self.closed = True
            while self._users:
                self._cv.wait(0.1)
        return True



class Closeable:
    """Context-manager and finaliser plumbing shared by the handle classes:
    `with obj:` closes on exit, garbage collection closes quietly. Subclasses
    define close() (for rooms: clear()) and set self._guard."""

    @property
    def closed(self):
        return self._guard.closed

    def _finish(self):
        self.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._finish()
        return False

    def __del__(self):
        try:
            self._finish()
        except Exception:
            pass

_live = weakref.WeakKeyDictionary()
_live_lock = threading.Lock()


def track(obj, order):
    """Remember an open object; at exit (before modules are torn down) open
    objects are closed by order: managers (0), engines (1), servers (2),
    shared memory (3)."""
    with _live_lock:
        _live[obj] = order


@atexit.register
def _close_all():
    with _live_lock:
        objs = sorted(_live.items(), key=lambda kv: kv[1])
    for o, _ in objs:
        try:
            o.close()
        except Exception:
            pass


# ---------------------------------------------------------------- arguments

U64_MAX = (1 << 64) - 1


def as_int(v, name, lo=None, hi=None):
    if isinstance(v, bool):
        raise InvalidArgument(f"{name} must be an integer, not bool")
    try:
        i = operator.index(v)
    except TypeError:
        raise InvalidArgument(f"{name} must be an integer, not {type(v).__name__}") from None
    if lo is not None and i < lo:
        raise InvalidArgument(f"{name} must be >= {lo}, got {i}")
    if hi is not None and i > hi:
        raise InvalidArgument(f"{name} must be <= {hi}, got {i}")
    return i


def as_float(v, name, lo=None):
    if isinstance(v, bool) or not isinstance(v, (int, float)) and not hasattr(v, "__float__"):
        raise InvalidArgument(f"{name} must be a number, not {type(v).__name__}")
    f = float(v)
    if f != f:
        raise InvalidArgument(f"{name} must not be NaN")
    if lo is not None and f < lo:
        raise InvalidArgument(f"{name} must be >= {lo}, got {f}")
    return f


def as_str(v, name, allow_none=False):
    if v is None and allow_none:
        return None
    if not isinstance(v, str):
        raise InvalidArgument(f"{name} must be a str, not {type(v).__name__}")
    if "\0" in v:
        raise InvalidArgument(f"{name} must not contain NUL")
    return v


def cuda_array(v):
    """(pointer, bytes) of an object with __cuda_array_interface__ (a PyTorch
    CUDA tensor, a CuPy or Numba array), or None for anything else. Only
    C-contiguous memory has one range to register or write."""
    cai = getattr(v, "__cuda_array_interface__", None)
    if cai is None:
        return None
    try:
        ptr = int(cai["data"][0])
        shape = tuple(int(x) for x in cai["shape"])
        itemsize = int(cai["typestr"][2:])
    except (KeyError, TypeError, ValueError, IndexError):
        raise InvalidArgument(f"malformed __cuda_array_interface__ of {type(v).__name__}") \
            from None
    n = itemsize
    for x in shape:
        n *= x
    strides = cai.get("strides")
    if strides is not None:
        want, expect = tuple(int(x) for x in strides), []
        step = itemsize
        for x in reversed(shape):
            expect.insert(0, step)
            step *= x
        if n > 0 and any(a != b for a, b, d in zip(want, expect, shape) if d > 1):
            raise InvalidArgument(f"{type(v).__name__} is not C-contiguous device memory")
    return ptr, n


def as_ptr(v, name):
    """A raw address (int; device pointers included) or the start of an
    object with __cuda_array_interface__."""
    c = cuda_array(v)
    return as_int(v, name, 1, U64_MAX) if c is None else as_int(c[0], name, 1, U64_MAX)


def _items(v, name, what):
    if v is None:
        return []
    if isinstance(v, (str, bytes)):
        raise InvalidArgument(f"{name} must be a sequence of {what}")
    try:
        return list(v)
    except TypeError:
        raise InvalidArgument(f"{name} must be a sequence of {what}, "
                              f"not {type(v).__name__}") from None


def ptr_list(v, name):
    """int_list for addresses: each item an int or a __cuda_array_interface__ object."""
    return [as_ptr(x, f"{name}[{i}]") for i, x in enumerate(_items(v, name, "addresses"))]


def int_list(v, name, lo=0, hi=U64_MAX):
    return [as_int(x, f"{name}[{i}]", lo, hi)
            for i, x in enumerate(_items(v, name, "integers"))]


def u64_array(values):
    return (ctypes.c_uint64 * max(len(values), 1))(*values)


_INT4_FORMATS = {"i", "I", "l", "L"}


def index_array(obj, name, allow_none=False):
    """Page indices as a ctypes int32 array (a copy) and its length.

    Accepts numpy integer arrays (int32 as the seeds pass them; other integer
    dtypes are converted when every value fits), any 1-D buffer with 4-byte
    integer items, or a sequence of ints. Values must be in [0, 2**31)."""
    if obj is None:
        if allow_none:
            return None, 0
        raise InvalidArgument(f"{name} is required")
    if isinstance(obj, (str, bytes, bytearray, float)) or isinstance(obj, bool):
        raise InvalidArgument(f"{name} must be an int32 index array, not {type(obj).__name__}")
    np = _numpy()
    if np is not None and isinstance(obj, np.ndarray):
        if obj.dtype.kind not in "iu":
            raise InvalidArgument(f"{name} must have an integer dtype, not {obj.dtype}")
        if obj.ndim != 1:
            raise InvalidArgument(f"{name} must be 1-D, got shape {obj.shape}")
        if obj.size and (int(obj.min()) < 0 or int(obj.max()) > 0x7FFFFFFF):
            raise InvalidArgument(f"{name} values must be in [0, 2**31)")
        a = np.ascontiguousarray(obj, dtype=np.int32)
        n = int(a.shape[0])
        arr = (ctypes.c_int32 * max(n, 1))()
        if n:
            ctypes.memmove(arr, a.ctypes.data, n * 4)
        return arr, n
    mv = None
    try:
        mv = memoryview(obj)
    except TypeError:
        pass
    if mv is not None:
        with mv:
            fmt = mv.format.lstrip("@=<>!")
            if mv.itemsize != 4 or fmt not in _INT4_FORMATS:
                raise InvalidArgument(f"{name}: buffer items must be 4-byte integers "
                                      f"(format {mv.format!r}, itemsize {mv.itemsize})")
            if mv.ndim > 1:
                raise InvalidArgument(f"{name} must be 1-D, got shape {mv.shape}")
            if mv.format[:1] in "<>!" and mv.format[:1] != ("<" if _little() else ">"):
                raise InvalidArgument(f"{name}: non-native byte order")
            n = mv.nbytes // 4
            arr = (ctypes.c_int32 * max(n, 1)).from_buffer_copy(mv.tobytes() or b"\0\0\0\0")
        if fmt in ("I", "L"):
            vals = [x for x in arr[:n] if x < 0]
            if vals:
                raise InvalidArgument(f"{name} values must be in [0, 2**31)")
        elif n and min(arr[:n]) < 0:
            raise InvalidArgument(f"{name} values must be in [0, 2**31)")
        return arr, n
    vals = int_list(obj, name, 0, 0x7FFFFFFF)
    return (ctypes.c_int32 * max(len(vals), 1))(*vals), len(vals)


_INT8_FORMATS = {"q", "Q", "l", "L"}


class I64Array:
    """An 8-byte integer array as C reads it: .addr (its data, not copied
    when the caller's object is contiguous numpy or a buffer), .rows, .cols
    (None for 1-D), .unsigned, .array (a numpy view, or None without numpy).
    Holds the object alive while referenced."""
    __slots__ = ("keep", "addr", "rows", "cols", "unsigned", "array")


def i64_array(obj, name, cols=None):
    """obj (a numpy array, any buffer-protocol object, or a sequence of ints /
    of rows) as an I64Array: 1-D when cols is None, else C-contiguous
    [rows, cols]. Numpy arrays and buffers are read in place (their data
    pointer), never copied into lists; a sequence is converted once, in C.
    ValueError (Mooncake's texts) for another item size or dtype, shape,
    layout or byte order, or sequence values outside the int64/uint64
    range."""
    if isinstance(obj, (str, bytes, bytearray)) or isinstance(obj, (bool, int, float)):
        raise ValueError(f"{name} must be an array of 8-byte integers, "
                         f"not {type(obj).__name__}")
    np = _numpy()
    shape_err = (f"{name} must be a one-dimensional array" if cols is None
                 else f"{name} must be a [rows, {cols}] array")
    layout_err = f"{name} must be contiguous" if cols is None else f"{name} must be C-contiguous"
    item_err = f"{name} must hold 8-byte integers (uint64/int64)"
    mv = None
    if np is None or not isinstance(obj, np.ndarray):
        try:
            mv = memoryview(obj)
        except TypeError:
            mv = None
    if np is not None:
        if isinstance(obj, np.ndarray):
            a = obj
        elif mv is not None:
            fmt = mv.format.lstrip("@=")
            if mv.itemsize != 8 or fmt not in _INT8_FORMATS:
                raise ValueError(f"{item_err}, got format {mv.format!r}")
            a = np.asarray(mv)
        else:
            try:
                a = np.asarray(obj)
            except (ValueError, TypeError) as e:
                raise ValueError(f"{name}: {e}") from None
            if a.size == 0 and a.dtype.kind == "f":  # [] → float64 in numpy
                a = a.astype(np.int64)
            if a.dtype.kind in "iu" and a.dtype.itemsize < 8:
                a = a.astype(np.int64)
        if a.dtype.kind not in "iu" or a.dtype.itemsize != 8:
            raise ValueError(f"{item_err}, got {a.dtype}")
        if not a.dtype.isnative:
            raise ValueError(f"{name}: non-native byte order")
        if (cols is None and a.ndim != 1) or (cols is not None and (a.ndim != 2 or
                                                                    a.shape[1] != cols)):
            raise ValueError(f"{shape_err}, got shape {a.shape}")
        if not a.flags.c_contiguous:
            raise ValueError(layout_err)
        r = I64Array()
        r.keep, r.array, r.addr = a, a, a.ctypes.data
        r.rows, r.cols, r.unsigned = int(a.shape[0]), cols, a.dtype.kind == "u"
        return r
    # Without numpy: a buffer (read in place when writable, else copied
    # once) or a sequence (converted by ctypes, in C).
    r = I64Array()
    r.cols, r.array = cols, None
    if mv is not None:
        fmt = mv.format.lstrip("@=")
        if mv.itemsize != 8 or fmt not in _INT8_FORMATS:
            raise ValueError(f"{item_err}, got format {mv.format!r}")
        if (cols is None and mv.ndim != 1) or (cols is not None and (
                mv.ndim != 2 or mv.shape[1] != cols)):
            raise ValueError(f"{shape_err}, got shape {mv.shape}")
        if not mv.c_contiguous:
            raise ValueError(layout_err)
        n = mv.nbytes // 8
        if mv.readonly:
            buf = (ctypes.c_int64 * max(n, 1)).from_buffer_copy(mv.tobytes() or bytes(8))
        else:
            buf = (ctypes.c_int64 * max(n, 1)).from_buffer(mv.cast("B")) if n else \
                (ctypes.c_int64 * 1)()
        r.keep, r.addr = (mv, buf), ctypes.addressof(buf)
        r.rows, r.unsigned = int(mv.shape[0]) if mv.ndim else 0, fmt in ("Q", "L")
        return r
    try:
        rows = list(obj)
    except TypeError:
        raise ValueError(f"{name} must be an array of 8-byte integers, "
                         f"not {type(obj).__name__}") from None
    if cols is not None:
        flat = []
        for row in rows:
            row = list(row)
            if len(row) != cols:
                raise ValueError(f"{shape_err}, got a row of {len(row)}")
            flat.extend(row)
    else:
        flat = rows
    if flat and (min(flat) < -(1 << 63) or max(flat) > U64_MAX):
        raise ValueError(f"{name}: values must fit 8-byte integers")
    buf = (ctypes.c_int64 * max(len(flat), 1))()
    buf[:len(flat)] = [v - (1 << 64) if v >= (1 << 63) else v for v in flat] \
        if flat and max(flat) >= (1 << 63) else flat
    r.keep, r.addr, r.rows, r.unsigned = buf, ctypes.addressof(buf), len(rows), False
    return r


def pages_grid(src_pages, dst_pages, fields):
    """The arguments of a pages x fields write (kvb_engine_write_pages) as
    I64Arrays (src, dst, fields), checked as Mooncake's
    batch_transfer_sync_write_pages checks them: ValueError on shape, type
    or layout; on values (negative pages, a row without a positive length or
    with a negative stride, an overflowing address) unless the grid is empty
    (N x F == 0, which moves nothing)."""
    sp = i64_array(src_pages, "src_pages")
    dp = i64_array(dst_pages, "dst_pages")
    fl = i64_array(fields, "fields", cols=5)
    if sp.rows != dp.rows:
        raise ValueError("src_pages and dst_pages must have the same length")
    if sp.rows and fl.rows:
        why = ctypes.c_char_p()
        if lib().kvb_pages_check(sp.addr, dp.addr, sp.rows, fl.addr, fl.rows,
                                 ctypes.byref(why)) != KVB_OK:
            raise ValueError(text(why.value))
    return sp, dp, fl


def _little():
    import sys
    return sys.byteorder == "little"


_np = False


def _numpy():
    global _np
    if _np is False:
        try:
            import numpy
            _np = numpy
        except ImportError:
            _np = None
    return _np
