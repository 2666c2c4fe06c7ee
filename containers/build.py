"""A composed config -> container -> Engine.

A config becomes a container once: `eyas.engine.config.prepare` resolves and validates it, here for
`build_container` and `engine_of`, and in the command lines (`launch/cli.py`, `launch/serve.py`),
which show its notices and hand the resolved config to `container_of`. The containers receive it as the
schema's dataclasses (`eyas.engine.config.schema`), checked already.
"""

from dependency_injector import providers
from dependency_injector.containers import DeclarativeContainer

from eyas.containers.engine_container import EngineContainer
from eyas.engine.config import prepare
from eyas.engine.config.schema import typed_config


def container_of(resolved: dict, kind: type[DeclarativeContainer] = EngineContainer):
    """A container of `kind` over a config `prepare` returned, given as the schema's dataclasses."""
    container = kind()
    container.config.override(providers.Object(typed_config(resolved)))
    return container


def build_container(config: dict) -> EngineContainer:
    """A composed plain config (resolved already or not) -> the engine's container."""
    resolved, _ = prepare(config)
    return container_of(resolved)


def engine_of(config: dict):
    """A composed plain config -> the `Engine` its container builds (holding the container)."""
    container = build_container(config)
    engine = container.engine()
    engine.container = container
    return engine
