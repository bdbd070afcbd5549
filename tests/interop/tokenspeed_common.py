"""Shared by the TokenSpeed interop drivers (tokenspeed_receiver.py,
tokenspeed_prefill.py; run by scripts/interop-tokenspeed.sh): a line-driven
kvbridge helper process, the drivers' main, and what TokenSpeed's PD
connector imports that cannot run here, stubbed (install()). Everything else
of TokenSpeed's connector runs unmodified from its tree at e41aa8b1609a.

Stubbed, and why:
  torch, torch.distributed            PyTorch: pd/utils.py imports it at the
                                      top; the connector's code paths used
                                      here never call it (poll_and_all_reduce
                                      and MetadataBuffers are the executor's)
  tokenspeed.runtime.layers.logits_processor
                                      GPU layers (triton, tokenspeed_kernel);
                                      pd/utils.py imports one class name
  tokenspeed.runtime.utils (+ .common) its __init__ imports torch, triton,
                                      fastapi, PIL...: get_colorful_logger
                                      only (network.py stays real)
  tokenspeed.runtime.utils.env        imports server_args -> tokenspeed_kernel:
                                      the PD variables of spec 6.1, read from
                                      the environment with TokenSpeed's defaults
  tokenspeed.runtime.metrics.collector prometheus metrics (off)
pd/utils.py itself is the real file.
"""

import logging
import os
import subprocess
import sys
import traceback
import types


class LineProc:
    """A helper (ts_helper, sglang26_helper) driven by lines: "key value"
    lines up to "ready" fill info; ask() sends a command and returns the rest
    of its answer line."""

    def __init__(self, argv):
        self.proc = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        self.info = {}
        for _ in range(64):
            line = self.proc.stdout.readline().strip()
            assert line, "helper exited early"
            if line == "ready":
                break
            k, _, v = line.partition(" ")
            self.info[k] = v

    def cmd(self, line, answers):
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        return [self.proc.stdout.readline().strip() for _ in range(answers)]

    def ask(self, line, key):
        out = self.cmd(line, 1)[0]
        assert out.startswith(key + " "), out
        return out.split(" ", 2)[2] if out.count(" ") >= 2 else ""

    def kill(self):
        self.proc.kill()
        self.proc.wait()

    def close(self):
        self.proc.stdin.close()
        assert self.proc.wait(timeout=20) == 0


def manager_args(bufs, item, layers, mla, unit, rank=0, world=1, port=0):
    """TokenSpeed's KVManagerArgs and KVArgs for a rank whose KV pool is the
    ctypes buffers bufs (items of `item` bytes; K then V of each layer, or
    one latent buffer per layer for MLA). is_mla_backend stays False: its
    engine hard-codes that (EL:522), so every model takes the generic
    planner."""
    import ctypes

    from tokenspeed.runtime.pd.mooncake.entities import KVArgs, KVManagerArgs

    offsets = [[l] for l in range(layers)] if mla else [[l, layers + l] for l in range(layers)]
    kv_args = KVArgs(
        engine_rank=rank,
        kv_data_ptrs=[ctypes.addressof(b) for b in bufs],
        kv_data_lens=[len(b) for b in bufs],
        kv_item_lens=[item] * len(bufs),
        offsets=offsets,
        aux_data_ptrs=[],
        aux_data_lens=[],
        aux_item_lens=[],
        ib_device=None,
        gpu_id=0,
        target_layer_num=layers,
        draft_layer_num=0,
        kv_unit_lens=[unit] * len(bufs),
    )
    args = KVManagerArgs(
        bootstrap_port=port,
        dist_init_addr=None,
        world_size=world,
        dp_size=1,
        attn_tp_rank=rank,
        attn_dp_rank=0,
        is_mla_backend=False,
        draft_is_mla_backend=False,
        enable_metrics=False,
        enable_dp_attention=False,
        enable_mla_l1_5_cache=False,
        served_model_name="m",
        app_key="k",
        metrics_reporters="",
    )
    return args, kv_args


def failure_text(conn):
    """The KVTransferError text of a failed TokenSpeed sender or receiver."""
    try:
        conn.failure_exception()
    except Exception as e:  # KVTransferError
        return str(e)
    raise AssertionError("failure_exception() did not raise")


def main(run_case):
    """Install the stubs, run argv[1]; exit 0/1 at once (TokenSpeed's
    threads never end)."""
    logging.basicConfig(level=os.environ.get("TS_LOGLEVEL", "WARNING"))
    install()
    # --record (scripts/interop-tokenspeed.sh): what TokenSpeed's code sends
    # and reads; no-op without KVB_RECORD_DIR
    import interop_record

    interop_record.install(sys.argv[1])
    try:
        run_case(sys.argv[1])
    except BaseException:
        traceback.print_exc()
        sys.stdout.flush()
        os._exit(1)
    sys.stdout.flush()
    os._exit(0)


class _Env:
    """EnvField's get / get_set_value_or (utils/env.py)."""

    def __init__(self, name, default, kind):
        self.name, self.default, self.kind = name, default, kind

    def get(self):
        v = os.environ.get(self.name)
        if v is None:
            return self.default
        if self.kind is bool:
            return v.lower() in ("1", "true", "yes")
        try:
            return self.kind(v)
        except ValueError:
            return self.default

    def get_set_value_or(self, or_value):
        return self.get() if self.name in os.environ else or_value


ENVS = {  # spec 6.1: name -> (default, type)
    "TOKENSPEED_DISAGGREGATION_HEARTBEAT_INTERVAL": (5.0, float),
    "TOKENSPEED_DISAGGREGATION_HEARTBEAT_MAX_FAILURE": (2, int),
    "TOKENSPEED_DISAGGREGATION_FAILED_SESSION_TTL": (30.0, float),
    "TOKENSPEED_DISAGGREGATION_THREAD_POOL_SIZE": (None, int),
    "TOKENSPEED_DISAGGREGATION_QUEUE_SIZE": (4, int),
    "TOKENSPEED_DISAGGREGATION_BOOTSTRAP_TIMEOUT": (120, int),
    "TOKENSPEED_DISAGGREGATION_WAITING_TIMEOUT": (300, int),
    "TOKENSPEED_PD_PREFILL_METADATA_TIMEOUT": (5.0, float),
    "TOKENSPEED_PD_LAYERWISE_DEBUG": (False, bool),
    "TOKENSPEED_HOST_IP": ("", str),
}


def install():
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
    mod("tokenspeed.runtime.layers")
    mod("tokenspeed.runtime.layers.logits_processor", LogitsProcessorOutput=object)
    utils = mod("tokenspeed.runtime.utils", get_colorful_logger=get_colorful_logger)
    utils.__path__ = [os.path.join(ts_root, "runtime", "utils")]  # network.py stays real
    mod("tokenspeed.runtime.utils.common")
    envs = types.SimpleNamespace(**{k: _Env(k, d, t) for k, (d, t) in ENVS.items()})
    mod("tokenspeed.runtime.utils.env", envs=envs)
    mod("tokenspeed.runtime.metrics")
    mod("tokenspeed.runtime.metrics.collector", KVTransferMetrics=object)
