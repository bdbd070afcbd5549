"""What TokenSpeed's PD connector imports that cannot run here, stubbed for
the interop drivers (tokenspeed_receiver.py, tokenspeed_prefill.py; run by
scripts/interop-tokenspeed.sh). Everything else of TokenSpeed's connector
runs unmodified from its tree at e41aa8b1609a.

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
import sys
import types


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
