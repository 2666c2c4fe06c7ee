"""Public entry: config (overrides or a composed dict) -> container -> Engine.

A config becomes a container once: `engine.config.prepare` resolves and validates it, here for
`build_container` and `build_engine`, and in the command lines (`launch/cli.py`, `launch/serve_cli.py`),
which show its notices and hand the resolved config to `container_of`.
"""

from dependency_injector.containers import DeclarativeContainer

from containers.engine_container import EngineContainer
from engine.config import prepare
from launch.compose import compose_config


def container_of(resolved: dict, kind: type[DeclarativeContainer] = EngineContainer):
    """A container of `kind` over a config `prepare` returned."""
    container = kind()
    container.config.from_dict(resolved)
    return container


def build_container(config: dict) -> EngineContainer:
    """A composed plain config (resolved already or not) -> the engine's container."""
    resolved, _ = prepare(config)
    return container_of(resolved)


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
