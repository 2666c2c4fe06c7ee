"""eyas: a speculative-decoding inference engine for Llama-family models.

The library's entry point: `build_engine` composes `conf/` (or takes a composed config) and builds an
`Engine` through the containers; `eng.generate(...)`, `eng.metrics()`, `eng.close()`.
"""

from eyas.containers.build import engine_of
from eyas.engine.errors import CheckpointError, ConfigError, EyasError, RequestError
from eyas.engine.outputs import RequestOutput
from eyas.engine.sampling_params import SamplingParams
from eyas.launch.compose import compose_config, typed_config


def build_engine(overrides: list[str] | tuple[str, ...] = (), config: dict | None = None):
    """Build an `Engine` from Hydra-style `overrides` of `conf/` (as the command line composes it) or
    from an already composed plain `config` dict (checked against the same schema)."""
    if config is None:
        config = compose_config(overrides)
    elif overrides:
        raise TypeError("build_engine takes `overrides` or `config`, not both")
    else:
        config = typed_config(config)
    return engine_of(config)


__all__ = ["build_engine", "SamplingParams", "RequestOutput", "EyasError", "ConfigError", "CheckpointError",
           "RequestError"]
