"""TokenSpeed 0.1.1 (PyPI) on kvbridge's `mooncake.engine` drop-in: what the
driver (tokenspeed011_pd.py, run by scripts/interop-tokenspeed011.sh) needs
besides TokenSpeed itself.

- install(): the few imports of TokenSpeed 0.1.1's PD connector that cannot
  run without a GPU stack, stubbed. Everything else of the connector
  (tokenspeed/runtime/pd/{base,mooncake}/*, cache_protocol.py,
  transfer_plan.py, topology.py, utils.py and the cache recipes' plan.py,
  spec.py, transfer.py, cache_runtime.py, virtual_blocks.py) runs
  unmodified from the installed wheel. Stubbed, and why:
    torch, torch.distributed, torch.cuda, tokenspeed_kernel.platform
        PyTorch: pd/utils.py imports it at the top; the connector's paths
        used here never touch a tensor. torch.cuda.is_available() is False,
        so the prefill's pack path (PrefillPackScratch) takes its own CPU
        fallback: one span per row; or, for the *_pack cases, the pack
        runs on the host (_host_pack: torch.empty, a stream and
        tokenspeed_kernel's memcpy_2d_async in host memory)
    tokenspeed.runtime.layers.logits_processor
        GPU layers (triton, tokenspeed_kernel); pd/utils.py imports one name
    tokenspeed.runtime.utils (+ .common)
        its __init__ star-imports common.py (torch, PIL, starlette,
        tokenspeed_kernel...): get_colorful_logger only; network.py and
        env.py's consumers stay real (network.py is the real file)
    tokenspeed.runtime.utils.env
        imports server_args -> tokenspeed_kernel: the PD variables, read
        from the environment with 0.1.1's names, types and defaults
        (tokenspeed/runtime/utils/env.py:306-340)
    tokenspeed.runtime.metrics.collector
        prometheus and tokenspeed_kernel (metrics are off)
  and one class the executor would provide: HostStepCounter, StepCounter
  (pd/utils.py:364) with host integers instead of its CUDA tensors (the
  forward records a step after each layer it produced).
- the model geometry (MHA and MLA), built by TokenSpeed's own
  spec.group / plan.pack / CacheLayout.bind / CacheTransferContract, with
  the field declarations of the ordinary recipe
  (recipes/ordinary.py:_mha_layer_fields, _mla_layer_fields) and the
  transfer schema entries of recipes/transfer.py written out by hand (both
  need torch dtypes and model configs);
- the KV content: a seeded global image per (room, slot, field), the
  prefill ranks' head slices of it, and the decode's expected arena
  computed independently of TokenSpeed's planner (own page-offset
  arithmetic, own head split).
"""

import hashlib
import logging
import os
import sys
import types

import numpy as np

HOST = "127.0.0.1"
SEED = 20261006  # TokenSpeed 0.1.1's release date

ELT = {"bfloat16": 2, "float16": 2, "uint8": 1, "float32": 4}


class _Env:
    """EnvField.get / get_set_value_or / is_set (utils/env.py:145-186)."""

    def __init__(self, name, default, kind):
        self.name, self.default, self.kind = name, default, kind

    def get(self):
        v = os.environ.get(self.name)
        if v is None:
            return self.default
        if self.kind is bool:
            return v.lower() in ("1", "true", "yes", "y", "on")
        try:
            return self.kind(v)
        except ValueError:
            return self.default

    def is_set(self):
        return self.name in os.environ

    def get_set_value_or(self, or_value):
        return self.get() if self.is_set() else or_value


ENVS = {  # 0.1.1's utils/env.py: name -> (default, type)
    "TOKENSPEED_DISAGGREGATION_FAILED_SESSION_TTL": (30, int),
    "TOKENSPEED_DISAGGREGATION_HEARTBEAT_INTERVAL": (5.0, float),
    "TOKENSPEED_DISAGGREGATION_HEARTBEAT_MAX_FAILURE": (2, int),
    "TOKENSPEED_DISAGGREGATION_QUEUE_SIZE": (4, int),
    "TOKENSPEED_DISAGGREGATION_THREAD_POOL_SIZE": (-1, int),
    "TOKENSPEED_DISAGGREGATION_BOOTSTRAP_TIMEOUT": (120, int),
    "TOKENSPEED_DISAGGREGATION_WAITING_TIMEOUT": (300, int),
    "TOKENSPEED_PD_LAYERWISE_DEBUG": (False, bool),
    "TOKENSPEED_PD_PREFILL_METADATA_TIMEOUT": (5.0, float),
    "TOKENSPEED_HOST_IP": ("", str),
    "TOKENSPEED_CI_SMALL_KV_SIZE": (-1, int),
}


def install(host_pack=False):
    """Stub what cannot run here (module docstring); import nothing else.
    host_pack: the prefill's 2-D pack (pack.py:PrefillPackScratch) runs on
    the host instead of falling back (_host_pack)."""

    def mod(name, **attrs):
        m = types.ModuleType(name)
        m.__dict__.update(attrs)
        sys.modules[name] = m
        return m

    import tokenspeed.runtime  # noqa: F401  (the real namespace packages)

    ts_root = os.path.dirname(list(sys.modules["tokenspeed.runtime"].__path__)[0])

    def get_colorful_logger(name):
        log = logging.getLogger(name)
        log.warning_once = log.warning  # TokenSpeed's logger has *_once variants
        log.info_once = log.info
        return log

    torch = mod("torch")
    torch.distributed = mod("torch.distributed")
    torch.cuda = mod("torch.cuda", is_available=lambda: host_pack)
    platform = types.SimpleNamespace(is_nvidia=host_pack)
    mod("tokenspeed_kernel")
    mod("tokenspeed_kernel.platform", current_platform=lambda: platform)
    if host_pack:
        _host_pack(mod, torch)
    mod("tokenspeed.runtime.layers.logits_processor", LogitsProcessorOutput=object)
    utils = mod("tokenspeed.runtime.utils", get_colorful_logger=get_colorful_logger)
    utils.__path__ = [os.path.join(ts_root, "runtime", "utils")]  # network.py stays real
    mod("tokenspeed.runtime.utils.common", get_colorful_logger=get_colorful_logger)
    envs = types.SimpleNamespace(**{k: _Env(k, d, t) for k, (d, t) in ENVS.items()})
    mod("tokenspeed.runtime.utils.env", envs=envs)
    mod("tokenspeed.runtime.metrics")
    mod("tokenspeed.runtime.metrics.collector", KVTransferMetrics=object)


class _HostTensor:
    """torch.empty(n, dtype=torch.uint8, device=...) in host memory."""

    def __init__(self, n):
        self.buf = np.zeros(n, np.uint8)

    def data_ptr(self):
        return self.buf.ctypes.data


def _host_pack(mod, torch):
    """What PrefillPackScratch (pack.py:155-241) uses on an NVIDIA GPU, on
    the host: a scratch "device" buffer from torch.empty, a stream, and
    tokenspeed_kernel's memcpy_2d_async as a row-by-row memmove. The
    scratch is then registered with the drop-in engine, written from, and
    unregistered when a larger one replaces it, exactly as on a GPU."""
    import ctypes

    torch.uint8 = "uint8"
    torch.device = lambda *a, **k: ("device",) + a
    torch.empty = lambda n, dtype=None, device=None: _HostTensor(n)
    torch.cuda.Stream = lambda device=None: types.SimpleNamespace(
        cuda_stream=0, synchronize=lambda: None)

    def memcpy_2d_async(*, dst, dst_pitch, src, src_pitch, width, height, stream_ptr):
        for row in range(height):
            ctypes.memmove(dst + row * dst_pitch, src + row * src_pitch, width)

    mod("tokenspeed_kernel.ops")
    mod("tokenspeed_kernel.ops.copy")
    mod("tokenspeed_kernel.ops.copy.cuda", memcpy_2d_async=memcpy_2d_async)


def host_step_counter():
    """StepCounter (pd/utils.py:364) with host integers for its CUDA tensors:
    record_cache() after each produced layer; the transfer thread reads
    query_ready_cache_step()."""
    from tokenspeed.runtime.pd.utils import StepCounter

    class HostStepCounter(StepCounter):
        def __init__(self):  # no tensors
            self.cache_step = 0
            self.aux_step = 0
            self._ready_cache = 0
            self._ready_aux = 0

        def record_cache(self):
            self._ready_cache = (self._ready_cache + 1) % self.COUNT_NUM_MAX

        def record_aux(self):
            self._ready_aux = (self._ready_aux + 1) % self.COUNT_NUM_MAX

        def query_ready_cache_step(self):
            return self._ready_cache

        def query_ready_aux_step(self):
            return self._ready_aux

    return HostStepCounter()


# ------------------------------------------------------------------ models

class Model:
    """A model's cache geometry: MHA (K and V per layer, heads split by TP)
    or MLA (one latent field per layer, replicated)."""

    def __init__(self, kind, layers, heads=8, head_dim=64, latent=576, pg=16,
                 dtype="bfloat16"):
        self.kind, self.layers, self.heads, self.head_dim = kind, layers, heads, head_dim
        self.latent, self.pg, self.dtype = latent, pg, dtype
        self.elt = ELT[dtype]

    def field_names(self):
        return ("k", "v") if self.kind == "mha" else ("latent_kv",)

    def field_ids(self):
        return [f"layer.{l}.{n}" for l in range(self.layers) for n in self.field_names()]

    def split(self):
        """True when TP splits the field (MHA heads); MLA is replicated."""
        return self.kind == "mha"

    def row_shape(self, tp):
        """(parts, bytes per part) of one token row on a rank of TP size tp:
        MHA: local heads x head bytes; MLA: one latent row."""
        if self.kind == "mha":
            return max(self.heads // tp, 1), self.head_dim * self.elt
        return 1, self.latent * self.elt

    def contract(self, tp, num_lcm_blocks):
        """TokenSpeed's own contract for a rank of TP size tp."""
        from tokenspeed.runtime.layers.attention.kv_cache.recipes import plan as P
        from tokenspeed.runtime.layers.attention.kv_cache.recipes import spec as S
        from tokenspeed.runtime.layers.attention.kv_cache.recipes.transfer import (
            CacheFieldPartition, CacheFieldTransferSpec, CacheTransferSchema)
        from tokenspeed.runtime.pd.cache_protocol import CacheTransferContract

        def fields_for_layer(layer_id, group_id, occurrence):
            if self.kind == "mha":  # ordinary.py:_mha_layer_fields, no mxfp8
                shape = (self.pg, max(self.heads // tp, 1), self.head_dim)
                return (P.CacheFieldSpec(f"layer.{layer_id}.k", f"unit.{occurrence}.k",
                                         shape, self.dtype),
                        P.CacheFieldSpec(f"layer.{layer_id}.v", f"unit.{occurrence}.v",
                                         shape, self.dtype))
            # ordinary.py:_mla_layer_fields, unquantized: one latent plane
            return (P.CacheFieldSpec(f"layer.{layer_id}.latent_kv", f"slot.{occurrence}",
                                     (self.pg, 1, self.latent), self.dtype),)

        groups = S.group(layer_types=["full_attention"] * self.layers,
                         group_ids=["full_attention"] * self.layers,
                         sliding_window_tokens=None, prefix_granularity=self.pg,
                         fields_for_layer=fields_for_layer,
                         pd_disaggregation_enabled=True)
        # the ordinary recipe: one block per parent, alignment 1, any padding
        layout = P.pack(groups, prefix_granularity=self.pg,
                        cache_blocks_per_lcm_block={"full_attention": 1},
                        alignment=1, max_padding_fraction=float("inf"))
        plan = layout.bind(num_lcm_blocks)
        # transfer.py: K/V split on axis 1 over num_key_value_heads; MLA none
        schema = CacheTransferSchema(fields=tuple(
            CacheFieldTransferSpec(fid, CacheFieldPartition(axis=1, global_extent=self.heads))
            for fid in self.field_ids()) if self.kind == "mha" else ())
        return CacheTransferContract(plan=plan, group_specs=tuple(s for s, _ in groups),
                                     transfer_schema=schema)


MODELS = {
    "mha": lambda: Model("mha", layers=4, heads=8, head_dim=64),
    "mla": lambda: Model("mla", layers=3, latent=576),
}


def page_offset(plan_json, field_id, page):
    """The byte offset of page `page` of field_id in an arena, from the
    contract's numbers (spec section 6), not TokenSpeed's code."""
    f = next(x for x in plan_json["fields"] if x["field_id"] == field_id)
    pl = next(x for x in plan_json["planes"] if x["plane_id"] == f["plane_id"])
    return (pl["arena_offset_bytes"] + pl["bytes_per_lcm_block"] - f["page_stride_bytes"]
            + page * f["page_stride_bytes"] + f["field_offset_bytes"])


def _rng(*key):
    h = hashlib.sha256(repr((SEED,) + key).encode()).digest()
    return np.random.default_rng(int.from_bytes(h[:8], "little"))


def global_page(model, room, slot, field_id):
    """The whole model's bytes of one page: [pg, parts, part bytes] uint8
    (MHA: all heads; MLA: the latent row)."""
    parts, width = model.row_shape(1)
    return _rng("page", room, slot, field_id).integers(
        0, 256, (model.pg, parts, width), dtype=np.uint8)


def rank_slice(model, page, tp, rank):
    """A rank's part of a global page (its heads; MLA: all of it)."""
    if not model.split():
        return page
    n = page.shape[1] // tp
    return page[:, rank * n:(rank + 1) * n, :]


def fill_noise(arena, *key):
    arena[:] = _rng("noise", *key).integers(0, 256, arena.size, dtype=np.uint8)


# ------------------------------------------------------------------ cases

class Room:
    """One request: prompt and prefix lengths, the prefill's and the
    decode's block table rows (distinct pages), the first token."""

    def __init__(self, room, prompt_len, prefix_len, p_row, d_row, chunks):
        self.room, self.prompt_len, self.prefix_len = room, prompt_len, prefix_len
        self.p_row, self.d_row = p_row, d_row
        self.chunks = chunks  # prefill chunk boundaries (layerwise)
        self.token = 1000 + room % 1000


class Case:
    def __init__(self, name, model, ptp, dtp, layerwise, rooms, p_blocks=64, d_blocks=96,
                 host_pack=False, fail=False):
        self.name, self.model, self.ptp, self.dtp = name, MODELS[model](), ptp, dtp
        self.host_pack, self.fail = host_pack, fail
        self.layerwise, self.p_blocks, self.d_blocks = layerwise, p_blocks, d_blocks
        pg = self.model.pg
        rng = _rng("rooms", name)
        self.rooms = []
        p_free = list(rng.permutation(np.arange(1, p_blocks + 1)))
        d_free = list(rng.permutation(np.arange(1, d_blocks + 1)))
        for k, (prompt, prefix, chunks) in enumerate(rooms):
            slots = -(-prompt // pg)
            p_row = [int(p_free.pop()) for _ in range(slots)]
            d_row = [int(d_free.pop()) for _ in range(slots)]
            self.rooms.append(Room(4242 + 17 * k, prompt, prefix * pg, p_row, d_row,
                                   chunks))


def _r(prompt, prefix_pages=0, chunks=None):
    return (prompt, prefix_pages, chunks or [prompt])


CASES = {
    # TP1 -> TP1, the final (one transfer after the forward) path: one pages
    # call per destination and group
    "tp1": lambda: Case("tp1", "mha", 1, 1, False, [_r(40), _r(16), _r(75, 2)]),
    # TP1 -> TP1, layerwise (TokenSpeed's default): a pages call per layer
    # and chunk, sent as the forward produces the layers
    "tp1_layerwise": lambda: Case("tp1_layerwise", "mha", 1, 1, True,
                                  [_r(40, 0, [32, 40]), _r(100, 1, [48, 80, 100]),
                                   _r(7)]),
    # TP2 -> TP1: strided destination rows, per-row spans through
    # batch_transfer_sync_write from both prefill ranks
    "tp2": lambda: Case("tp2", "mha", 2, 1, False, [_r(40), _r(33, 1)]),
    "tp2_layerwise": lambda: Case("tp2_layerwise", "mha", 2, 1, True,
                                  [_r(64, 0, [32, 64]), _r(20)]),
    # TP1 -> TP2: contiguous destination rows from strided sources (the
    # pack path; without CUDA TokenSpeed falls back to per-row spans)
    "tp1_tp2": lambda: Case("tp1_tp2", "mha", 1, 2, False, [_r(40), _r(50, 1)]),
    # the same with the pack on the host: packed spans written from a
    # scratch TokenSpeed registers (and re-registers larger, unregistering
    # the old one) on the drop-in engine
    "tp1_tp2_pack": lambda: Case("tp1_tp2_pack", "mha", 1, 2, False,
                                 [_r(20), _r(50, 1), _r(90)], host_pack=True),
    # MLA (replicated latent): TP1 -> TP1, and TP2 -> TP1 where one prefill
    # rank sends and the other is a dummy (rendezvous only)
    "mla": lambda: Case("mla", "mla", 1, 1, True, [_r(40, 0, [16, 40]), _r(70, 2)]),
    "mla_tp2": lambda: Case("mla_tp2", "mla", 2, 1, False, [_r(40), _r(19)]),
    # the decode unregisters its arena before the prefill writes: the
    # drop-in refuses every write (-1), TokenSpeed fails the rooms on both
    # sides with its reasons, and not one decode byte changes
    "write_refused": lambda: Case("write_refused", "mha", 2, 1, False,
                                  [_r(40), _r(24)], fail=True),
}
