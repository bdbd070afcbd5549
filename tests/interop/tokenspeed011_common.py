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
- the model geometry (MHA and MLA; and HybridModel, the CachePD golden's
  hybrid model with state groups, built by TokenSpeed's recipe pipeline and
  build_cache_transfer_schema), built by TokenSpeed's own
  spec.group / plan.pack / CacheLayout.bind / CacheTransferContract, with
  the field declarations of the ordinary recipe
  (recipes/ordinary.py:_mha_layer_fields, _mla_layer_fields) and the
  transfer schema entries of recipes/transfer.py written out by hand (both
  need torch dtypes and model configs);
- the KV content: a seeded global image per (room, slot, field), the
  prefill ranks' head slices of it, and the decode's expected arena
  computed independently of TokenSpeed's planner (own page-offset
  arithmetic, own head split); hybrid: a seeded global image per (room,
  state field) and each rank's rows of it (own split of the partition's
  parts).
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


    def kv_fields(self):
        """The history fields (every field of these models)."""
        return self.field_ids()

    def state_fields(self):
        return []


class HybridModel:
    """The CachePD golden's hybrid model (tests/interop/cachepd_record.py
    MODELS["hybrid"], Qwen3.5's gated delta net shape at toy sizes): layer
    types linear_attention x 3 + full_attention, group ids from TokenSpeed's
    split_recurrent_state_groups (linear_attention_0..2: family state,
    latest_snapshot, one group per state position; full_attention), prefix
    granularity (page) 128. Fields as the golden's gdn_fields declares them
    (qwen35.py's, written out: the recipe needs torch and a model config):
    layer.3.k / layer.3.v [128, 2 KV heads // tp, 32] bfloat16; per linear
    layer l, layer.l.ssm [4 value heads // tp, 16, 16] float32 and
    layer.l.conv [128 // tp, 3] bfloat16 (conv dim 2 x 2 x 16 + 4 x 16, kernel
    4, page stride not exact). The transfer schema is TokenSpeed's
    build_cache_transfer_schema over a model config carrying the linear
    attention's sizes: K/V split on axis 1 over the 2 KV heads, ssm on axis 0
    over the 4 value heads, conv on axis 0 in parts 32, 32, 64, each split by
    TP (spec 7.3)."""

    kind = "hybrid"
    LAYER_TYPES = ("linear_attention",) * 3 + ("full_attention",)

    def __init__(self):
        self.layers, self.pg, self.heads, self.head_dim = 4, 128, 2, 32
        self.dtype, self.elt = "bfloat16", 2
        self.kh, self.vh, self.kd, self.vd, self.kernel = 2, 4, 16, 16, 4
        self.conv_dim = 2 * self.kh * self.kd + self.vh * self.vd

    def kv_layers(self):
        return [l for l, t in enumerate(self.LAYER_TYPES) if t == "full_attention"]

    def kv_fields(self):
        """kvbridge's KV buffer order: K of the full-attention layers, then V."""
        return ([f"layer.{l}.k" for l in self.kv_layers()] +
                [f"layer.{l}.v" for l in self.kv_layers()])

    def state_fields(self):
        """kvbridge's state buffer order: (layer, field name) ascending."""
        return [f"layer.{l}.{n}" for l, t in enumerate(self.LAYER_TYPES)
                if t == "linear_attention" for n in ("conv", "ssm")]

    def field_ids(self):
        """Every field, in the order of TokenSpeed's plan (what a prefill
        rank publishes as its stage's fields)."""
        return [f.field_id for f in self.contract(1, 1).plan.fields]

    def split(self):
        return True  # K/V heads split by TP

    def row_shape(self, tp):
        return max(self.heads // tp, 1), self.head_dim * self.elt

    def state_geometry(self, field_id):
        """(global rows on the partition axis 0, bytes per row, parts)."""
        if field_id.endswith(".conv"):
            kw = self.kh * self.kd
            return self.conv_dim, (self.kernel - 1) * 2, (kw, kw, self.vh * self.vd)
        return self.vh, self.vd * self.kd * 4, (self.vh,)

    def state_rows(self, field_id, tp, rank):
        """The global rows rank `rank` of TP size tp holds, in its local
        order (spec 7.3: each part split evenly, the parts' slices side by
        side), computed here from the geometry, not TokenSpeed's planner."""
        rows, off = [], 0
        for extent in self.state_geometry(field_id)[2]:
            e = extent // tp
            rows += range(off + rank * e, off + (rank + 1) * e)
            off += extent
        return np.asarray(rows)

    def contract(self, tp, num_lcm_blocks):
        """TokenSpeed's recipe pipeline for TP size tp, as cachepd_record.py
        runs it for the golden (spec.group, plan.pack with TokenSpeed's own
        packing, alignment 256, padding 1.0, bind, build_cache_transfer_schema)."""
        from tokenspeed.runtime.layers.attention.kv_cache.recipes import plan as P
        from tokenspeed.runtime.layers.attention.kv_cache.recipes import spec as S
        from tokenspeed.runtime.layers.attention.kv_cache.recipes.transfer import (
            build_cache_transfer_schema)
        from tokenspeed.runtime.pd.cache_protocol import CacheTransferContract

        pg, kh, vh, kd, vd = self.pg, self.kh, self.vh, self.kd, self.vd

        def fields_for_layer(layer, gid, occ):
            if gid.startswith("linear_attention"):
                return (P.CacheFieldSpec(f"layer.{layer}.ssm", f"unit.{occ}.a",
                                         (vh // tp, vd, kd), "float32"),
                        P.CacheFieldSpec(f"layer.{layer}.conv", f"unit.{occ}.b",
                                         (self.conv_dim // tp, self.kernel - 1), "bfloat16",
                                         exact_page_stride=False))
            shape = (pg, max(self.heads // tp, 1), self.head_dim)
            return (P.CacheFieldSpec(f"layer.{layer}.k", f"unit.{occ}.a", shape, self.dtype),
                    P.CacheFieldSpec(f"layer.{layer}.v", f"unit.{occ}.b", shape, self.dtype))

        groups = S.group(layer_types=self.LAYER_TYPES,
                         group_ids=S.split_recurrent_state_groups(self.LAYER_TYPES),
                         sliding_window_tokens=None, prefix_granularity=pg,
                         fields_for_layer=fields_for_layer, pd_disaggregation_enabled=True)
        layout = P.pack(groups, prefix_granularity=pg, cache_blocks_per_lcm_block=None,
                        alignment=256, max_padding_fraction=1.0)
        plan = layout.bind(num_lcm_blocks)
        cfg = types.SimpleNamespace(
            num_key_value_heads=self.heads, num_attention_layers=self.layers,
            hf_text_config=types.SimpleNamespace(
                linear_num_key_heads=kh, linear_num_value_heads=vh,
                linear_key_head_dim=kd, linear_value_head_dim=vd))
        return CacheTransferContract(plan=plan, group_specs=tuple(s for s, _ in groups),
                                     transfer_schema=build_cache_transfer_schema(
                                         plan, model_config=cfg))


MODELS = {
    "mha": lambda: Model("mha", layers=4, heads=8, head_dim=64),
    "mla": lambda: Model("mla", layers=3, latent=576),
    "hybrid": HybridModel,
}


def page_offset(plan_json, field_id, page):
    """The byte offset of page `page` of field_id in an arena, from the
    contract's numbers (spec section 6), not TokenSpeed's code."""
    f = next(x for x in plan_json["fields"] if x["field_id"] == field_id)
    pl = next(x for x in plan_json["planes"] if x["plane_id"] == f["plane_id"])
    return (pl["arena_offset_bytes"] + pl["bytes_per_lcm_block"] - f["page_stride_bytes"]
            + page * f["page_stride_bytes"] + f["field_offset_bytes"])


def group_of(plan_json, field_id):
    return next(x["group_id"] for x in plan_json["fields"] if x["field_id"] == field_id)


def _rng(*key):
    h = hashlib.sha256(repr((SEED,) + key).encode()).digest()
    return np.random.default_rng(int.from_bytes(h[:8], "little"))


def global_page(model, room, slot, field_id):
    """The whole model's bytes of one page: [pg, parts, part bytes] uint8
    (MHA: all heads; MLA: the latent row)."""
    parts, width = model.row_shape(1)
    return _rng("page", room, slot, field_id).integers(
        0, 256, (model.pg, parts, width), dtype=np.uint8)


def global_state(model, room, field_id):
    """The whole model's bytes of one state field's latest snapshot: [global
    rows, bytes per row] uint8 (rows on the partition axis, row-major)."""
    rows, width, _ = model.state_geometry(field_id)
    return _rng("state", room, field_id).integers(0, 256, (rows, width), dtype=np.uint8)


def state_slice(model, state, field_id, tp, rank):
    """A rank's part of a global state field, in its local row order."""
    return state[model.state_rows(field_id, tp, rank)]


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
    decode's block table rows (distinct pages), the first token. Hybrid:
    p_state / d_state, per state group one block per logical slot in the
    prefill's / decode's TokenSpeed arena (the latest snapshot, slot
    (prompt_len - 1) // page, is the one moved), and kvb_slot, the state slot
    of a kvbridge decode (TokenSpeed block kvb_slot + 1 of every state group)."""

    def __init__(self, room, prompt_len, prefix_len, p_row, d_row, chunks, p_state=None,
                 d_state=None, kvb_slot=None):
        self.room, self.prompt_len, self.prefix_len = room, prompt_len, prefix_len
        self.p_row, self.d_row = p_row, d_row
        self.chunks = chunks  # prefill chunk boundaries (layerwise)
        self.token = 1000 + room % 1000
        self.p_state, self.d_state, self.kvb_slot = p_state or {}, d_state or {}, kvb_slot

    def snapshot_slot(self, pg):
        return (self.prompt_len - 1) // pg


class BlockAlloc:
    """Block ids of a TokenSpeed arena laid out by contract, drawn at random
    so that no two groups' blocks share bytes: block v of a group packed K
    per LCM parent lives in parent 1 + (v - 1) // K (spec 6), and the hybrid
    model's state groups share their planes with each other and with the
    history group, so each group takes whole parents of its own."""

    def __init__(self, contract, rng):
        import json

        plan = json.loads(contract.to_wire_bytes())["plan"]
        self.k = {g["group_id"]: g["cache_blocks_per_lcm_block"] for g in plan["groups"]}
        self.parents = [int(x) for x in rng.permutation(np.arange(1, plan["num_lcm_blocks"] + 1))]
        self.rng, self.free = rng, {g: [] for g in self.k}

    def take(self, group):
        if not self.free[group]:
            k, parent = self.k[group], self.parents.pop()
            self.free[group] = [int(x) for x in
                                self.rng.permutation(np.arange(k)) + (parent - 1) * k + 1]
        return self.free[group].pop()


class Case:
    def __init__(self, name, model, ptp, dtp, layerwise, rooms, p_blocks=64, d_blocks=96,
                 host_pack=False, fail=False):
        self.name, self.model, self.ptp, self.dtp = name, MODELS[model](), ptp, dtp
        self.host_pack, self.fail = host_pack, fail
        self.layerwise, self.p_blocks, self.d_blocks = layerwise, p_blocks, d_blocks
        self._specs = rooms
        if not self.model.state_fields():
            self.rooms = self._rooms()
        # else on first use (__getattr__): the allocation needs TokenSpeed's
        # contracts, and nothing of TokenSpeed is imported before install()

    def __getattr__(self, name):
        if name != "rooms" or "_specs" not in self.__dict__:
            raise AttributeError(name)
        self.rooms = self._rooms()
        return self.rooms

    def _rooms(self):
        pg = self.model.pg
        rng = _rng("rooms", self.name)
        rooms = []
        hybrid = bool(self.model.state_fields())
        if hybrid:
            p_alloc = BlockAlloc(self.model.contract(self.ptp, self.p_blocks), rng)
            d_alloc = BlockAlloc(self.model.contract(self.dtp, self.d_blocks), rng)
            states = [g for g in p_alloc.k if g != "full_attention"]
        else:
            p_free = list(rng.permutation(np.arange(1, self.p_blocks + 1)))
            d_free = list(rng.permutation(np.arange(1, self.d_blocks + 1)))
        for k, (prompt, prefix, chunks) in enumerate(self._specs):
            slots = -(-prompt // pg)
            if not hybrid:
                p_row = [int(p_free.pop()) for _ in range(slots)]
                d_row = [int(d_free.pop()) for _ in range(slots)]
                rooms.append(Room(4242 + 17 * k, prompt, prefix * pg, p_row, d_row, chunks))
                continue
            p_row = [p_alloc.take("full_attention") for _ in range(slots)]
            d_row = [d_alloc.take("full_attention") for _ in range(slots)]
            p_state = {g: [p_alloc.take(g) for _ in range(slots)] for g in states}
            d_state = {g: [d_alloc.take(g) for _ in range(slots)] for g in states}
            rooms.append(Room(4242 + 17 * k, prompt, prefix * pg, p_row, d_row, chunks,
                              p_state, d_state, kvb_slot=5 + 7 * k))
        return rooms


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
    # the hybrid model with a state group (the CachePD golden's hybrid_tp2_tp1):
    # K/V pages of the full-attention layer from the prompt's suffix, and each
    # state group's latest snapshot (one block per group, every field split
    # by TP, conv in three parts). Prompts of 300 (3 pages, snapshot slot 2),
    # 130 with a 1-page prefix (1 page, slot 1) and 128 (1 page, slot 0)
    "hybrid": lambda: Case("hybrid", "hybrid", 1, 1, False,
                           [_r(300), _r(130, 1), _r(128)], p_blocks=40, d_blocks=60),
    "hybrid_tp2": lambda: Case("hybrid_tp2", "hybrid", 2, 1, False,
                               [_r(300), _r(130, 1), _r(128)], p_blocks=40, d_blocks=60),
    "hybrid_tp2_layerwise": lambda: Case("hybrid_tp2_layerwise", "hybrid", 2, 1, True,
                                         [_r(300, 0, [128, 256, 300]), _r(130, 1)],
                                         p_blocks=40, d_blocks=60),
    # the decode unregisters its arena before the prefill writes: the
    # drop-in refuses every write (-1), TokenSpeed fails the rooms on both
    # sides with its reasons, and not one decode byte changes
    "write_refused": lambda: Case("write_refused", "mha", 2, 1, False,
                                  [_r(40), _r(24)], fail=True),
}
