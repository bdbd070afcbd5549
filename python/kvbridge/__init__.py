"""kvbridge: Python bindings (ctypes over libkvbridge.so) named like SGLang's
Mooncake connector (seed 001), so a connector author can switch with little
change. See docs/python.md for the mapping.

    from kvbridge import (KVArgs, KVManager, KVSender, KVReceiver, KVPoll,
                          KVBootstrapServer, KVTransferError, TransferEngine)

The library is found through KVBRIDGE_LIB, next to this package, in the
directory recorded by `pip install ./python` (the installed C library), in
the source tree's build/, or on the system library path; it is loaded on
first use. Every C call releases the GIL. compat_path() names the folder of
drop-in modules (mooncake/) to put on PYTHONPATH, when this copy has one.
"""

from ._lib import (
    InvalidArgument,
    KVBridgeError,
    compat_path,
    library_path,
    load_library,
)
from .bootstrap import KVBootstrapServer
from .conn import (
    DisaggregationMode,
    KVArgs,
    KVManager,
    KVPoll,
    KVReceiver,
    KVSender,
    KVTransferError,
    Timeline,
    TimelineEvent,
    metrics_addr,
    metrics_text,
    poll_many,
)
from .engine import SharedMemory, TransferEngine, TransferHandle, cuda_available, mem_query

__version__ = "0.1.0"

__all__ = [
    "DisaggregationMode",
    "InvalidArgument",
    "KVArgs",
    "KVBootstrapServer",
    "KVBridgeError",
    "KVManager",
    "KVPoll",
    "KVReceiver",
    "KVSender",
    "KVTransferError",
    "SharedMemory",
    "Timeline",
    "TimelineEvent",
    "TransferEngine",
    "TransferHandle",
    "compat_path",
    "cuda_available",
    "library_path",
    "load_library",
    "mem_query",
    "metrics_addr",
    "metrics_text",
    "poll_many",
    "set_log_level",
    "version",
]

_LEVELS = {"error": 0, "warn": 1, "warning": 1, "info": 2, "debug": 3}


def set_log_level(level):
    """Library log level: "error", "warn", "info" or "debug" (default from
    KVBRIDGE_LOG, else warn). Lines go to stderr."""
    if not isinstance(level, str) or level.lower() not in _LEVELS:
        raise InvalidArgument(f"level must be one of {sorted(_LEVELS)}, got {level!r}")
    from . import _lib
    _lib.lib().kvb_log_set_level(_LEVELS[level.lower()])


def version():
    """The C library's version string."""
    from . import _lib
    return _lib.text(_lib.lib().kvb_version())
