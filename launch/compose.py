"""Hydra -> plain dict: compose `conf/` with overrides exactly as the CLI does.

The result is as composed; `eyas.engine.config.prepare` resolves and validates it where it is built.
"""


from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from eyas.engine.assets import asset_path
from eyas.engine.config.schema import Config
from eyas.engine.errors import ConfigError
from eyas.launch.schema import CONF_DIR, register_schemas


def config_dir() -> str:
    """The config tree `conf/`: beside this package's folder in a source checkout and when installed
    (as `eyas/conf`)."""
    return str(CONF_DIR)


def unless_set(other, default):
    """`${unless_set:${prompts_file},"text"}`: the default while `other` is unset, else None."""
    return default if other is None else None


def register_resolvers() -> None:
    """`${asset:target}` in a config names a model shipped inside the package; `unless_set` gives a
    default that another key replaces."""
    if not OmegaConf.has_resolver("asset"):
        OmegaConf.register_new_resolver("asset", asset_path)
    if not OmegaConf.has_resolver("unless_set"):
        OmegaConf.register_new_resolver("unless_set", unless_set)


def to_plain(cfg: DictConfig) -> dict:
    """A composed DictConfig -> plain dict (enums as strings, no `hydra` node)."""
    try:
        config = OmegaConf.to_container(cfg, resolve=True, enum_to_str=True, throw_on_missing=True)
    except OmegaConfBaseException as e:
        raise ConfigError(f"invalid configuration: {e}") from e
    config.pop("hydra", None)
    return config


def typed_config(config: dict) -> dict:
    """A plain config dict (composed elsewhere, or written by hand) checked against the schema, as composing
    checks it: an unknown key, a value of the wrong type or outside a field's choices is a ConfigError."""
    register_schemas()
    register_resolvers()
    try:
        cfg = OmegaConf.merge(OmegaConf.structured(Config), config)
    except OmegaConfBaseException as e:
        raise ConfigError(f"invalid configuration: {e}") from e
    return to_plain(cfg)


def with_group(overrides, group: str, option: str) -> list[str]:
    """`overrides` with `group=option` first, unless they choose an option of `group` themselves
    (`with_group(args, "model", "tiny")`: the tiny shipped pair unless the command names a model)."""
    overrides = list(overrides)
    chosen = any(o.lstrip("+~").startswith(f"{group}=") for o in overrides)
    return overrides if chosen else [f"{group}={option}", *overrides]


def compose_config(overrides: list[str] | tuple[str, ...] = (), config_name: str = "config") -> dict:
    """`config_name`: "config" (the engine) or "serve" (the server: adds the `server` group)."""
    register_schemas()
    register_resolvers()
    if GlobalHydra.instance().is_initialized():
        GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=config_dir(), version_base="1.3"):
            cfg = compose(config_name=config_name, overrides=list(overrides))
    except (HydraException, OmegaConfBaseException) as e:
        cause = f"\n{e.__cause__}" if e.__cause__ is not None else ""
        raise ConfigError(f"invalid configuration: {e}{cause}") from e
    return to_plain(cfg)
