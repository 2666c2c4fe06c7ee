"""Public entry: config (overrides or a composed dict) -> container -> Engine."""

from containers.compose import compose_config
from containers.engine_container import EngineContainer
from containers.validation import validate_config


def build_container(config: dict) -> EngineContainer:
    container = EngineContainer()
    container.config.from_dict(validate_config(config))
    return container


def build_engine(overrides: list[str] | tuple[str, ...] = (), config: dict | None = None):
    """Compose `conf/` with Hydra-style `overrides` (as the CLI does), or take an already composed
    plain `config` dict, and build the engine."""
    if config is None:
        config = compose_config(overrides)
    elif overrides:
        raise TypeError("build_engine takes `overrides` or `config`, not both")
    container = build_container(config)
    engine = container.engine()
    engine.container = container
    return engine
