"""What the interop suite stubs so that SGLang's real Mooncake PD connector
(sglang/srt/disaggregation/mooncake/conn.py and the common/ base classes it
builds on) runs in a plain process without a GPU, a model or a launched
SGLang server. Nothing of SGLang's source is modified: install() replaces
attributes of sglang.srt.runtime_context BEFORE the connector modules are
imported, so their `from sglang.srt.runtime_context import get_parallel`
binds to these values.

Stubbed (and why):

- runtime_context.get_parallel/get_serving/get_disagg/get_device/get_memory/
  get_schedule/get_spec/get_observability/get_exec, linear_attn_tp_size,
  max_prefill_buffer_tokens: in SGLang these read the ServerArgs that a
  launched server publishes (ServerArgs needs a model config and a device).
  Here they are fixed namespaces describing one TP1/DP1/PP1/CP1 rank, no
  speculative decoding, no staging, "early" decode allocation, no tracing,
  device "cpu" (a prefill rank of the tp2_ cases: TP2, its TP rank). Every attribute the connector reads is listed; an unknown one
  raises AttributeError (so a new SGLang read shows up as an error, not as a
  silent default).
- the `server_args` argument of MooncakeKVManager: a namespace with
  enable_pd_role_switch=False (the only field the connector reads).

Not stubbed: the connector classes, their threads, ZeroMQ sockets, HTTP
bootstrap client and server (aiohttp), SGLang's environment knobs (envs.*),
SGLang's MooncakeTransferEngine wrapper and init_mooncake_transfer_engine(),
and `mooncake.engine` (kvbridge's drop-in, python/compat, first on PYTHONPATH).
KV/aux buffers are host memory (numpy) instead of GPU tensors: kvbridge moves
host memory only.
"""

import types


class Bag(types.SimpleNamespace):
    """A namespace that names the missing attribute instead of guessing one."""

    def __getattr__(self, name):
        raise AttributeError(f"interop stub {self._name!r} has no {name!r}: add it to sglang_stubs.py")


def _bag(name, **fields):
    b = Bag(**fields)
    object.__setattr__(b, "_name", name)
    return b


def make(bootstrap_port=0, host="127.0.0.1", mode="null", tp_rank=0, tp_size=1):
    parallel = _bag(
        "parallel",
        dist_init_addr=None,
        nnodes=1,
        dp_size=1,
        num_dp_ranks=1,
        pp_size=1,
        pp_group=None,
        world_group=None,
        attn_tp_size=tp_size,
        attn_tp_rank=tp_rank,
        attn_cp_size=1,
        attn_cp_rank=0,
        attn_dcp_size=1,
        attn_dcp_rank=0,
        attn_dp_size=1,
        attn_dp_rank=0,
        tp_size=tp_size,
        tp_rank=tp_rank,
        enable_cp_tp_group_sharing=False,
        enable_dsa_cache_layer_split=False,
        enable_kv_cache_sharding=False,
        load_balance_method="round_robin",
    )
    return {
        "parallel": parallel,
        "serving": _bag("serving", host=host, port=None),
        "disagg": _bag(
            "disagg",
            disaggregation_mode=mode,
            disaggregation_bootstrap_port=bootstrap_port,
            disaggregation_decode_allocation_policy="early",
            disaggregation_transfer_backend="mooncake",
            disaggregation_ib_device=None,
            encoder_only=False,
            language_only=False,
        ),
        "device": _bag("device", device="cpu"),
        "memory": _bag("memory", enable_unified_memory=False, enable_hierarchical_cache=False),
        "schedule": _bag(
            "schedule",
            chunked_prefill_size=8192,
            max_prefill_tokens=16384,
            enable_dynamic_chunking=False,
        ),
        "spec": _bag("spec", speculative_algorithm=None, speculative_num_draft_tokens=None),
        "observability": _bag("observability", enable_trace=False),
    }


def install(bootstrap_port=0, host="127.0.0.1", mode="null", tp_rank=0, tp_size=1):
    """Patch sglang.srt.runtime_context; call before importing the connector."""
    import sglang.srt.runtime_context as rc

    ctx = make(bootstrap_port, host, mode, tp_rank, tp_size)
    for name, bag in ctx.items():
        setattr(rc, "get_" + name, lambda bag=bag: bag)
    rc.linear_attn_tp_size = lambda: 1
    rc.max_prefill_buffer_tokens = lambda: ctx["schedule"].chunked_prefill_size
    return ctx


def server_args():
    return _bag("server_args", enable_pd_role_switch=False)
