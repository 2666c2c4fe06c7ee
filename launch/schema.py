"""The schema registered with Hydra: the config tree composes against `eyas.engine.config.schema`'s
dataclasses, so unknown keys and wrong types fail at composition, and enum fields list their allowed
values in Hydra's own error message. A drafter that ships no config files gets its groups from its row."""

from pathlib import Path

from hydra.core.config_store import ConfigStore

from eyas.engine.config.schema import Config, DraftConfig, SpeculativeConfig
from eyas.engine.speculative.drafters.registry import DRAFT_MODELS, DRAFTERS, PLAIN

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"  # beside this package's folder, and installed as eyas/conf


def register_schemas() -> None:
    store = ConfigStore.instance()
    store.store(name="config_schema", node=Config)
    for name, row in DRAFTERS.items():  # a drafter's groups where it ships no config file for them
        if not (CONF_DIR / "speculative" / f"{name}.yaml").is_file():
            store.store(group="speculative", name=name, node=SpeculativeConfig(name, row.default_steps))
        if not (CONF_DIR / "draft" / f"{name}.yaml").is_file():
            store.store(group="draft", name=name, node=_default_draft(row.draft_kinds[0]))


def _default_draft(kind: str) -> DraftConfig:
    """A drafter's draft group: its draft model kind, at the path the model names for it (model.heads)."""
    return DraftConfig(kind, None if kind == PLAIN else f"${{model.heads.{DRAFT_MODELS[kind]}}}")
