"""kvbridge's stand-in for the `mooncake` package: only `mooncake.engine`.

Put python/compat on PYTHONPATH (it is never installed by default, so it
cannot shadow a real Mooncake) and `from mooncake.engine import
TransferEngine` gives SGLang's Mooncake backend, vLLM's MooncakeConnector and
TokenSpeed a transfer engine backed by kvbridge's C engine. Other Mooncake
modules (mooncake.store, mooncake.pg, mooncake.allocator, ...) are not
provided. See docs/python.md, "Mooncake drop-in".
"""

KVBRIDGE_DROP_IN = True  # lets a program tell this package from the real Mooncake

# Mooncake's top-level exports: its buffer pools come from mooncake.store and
# are None in a Mooncake built without the store, as here.
BufferPool = None
RegisteredBufferPool = BufferPool

__all__ = ["BufferPool", "RegisteredBufferPool"]
