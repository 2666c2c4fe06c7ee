"""eyas: a speculative-decoding inference engine for Llama-family models."""

from engine.errors import CheckpointError, ConfigError, EyasError, RequestError
from engine.outputs import RequestOutput
from engine.sampling_params import SamplingParams


def build_engine(overrides=(), config: dict | None = None):
    """Build an `Engine` from Hydra-style overrides of `conf/` (as the CLI composes it) or from a
    composed plain config dict. `eng.generate(...)`, `eng.metrics()`, `eng.close()`."""
    from containers.build import build_engine as _build  # containers import engine: resolve at call time

    return _build(overrides, config)


__all__ = ["build_engine", "SamplingParams", "RequestOutput", "EyasError", "ConfigError", "CheckpointError",
           "RequestError"]
