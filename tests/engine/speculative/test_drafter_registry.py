"""The drafter registry is the one list of drafters: the schema, the config groups and the containers follow it."""

import inspect
from pathlib import Path

import pytest
from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf
from support import build_engine, compose_config

from eyas.engine.config import schema
from eyas.engine.speculative.drafters.base import Drafter
from eyas.engine.speculative.drafters.hybrid import MODES
from eyas.engine.speculative.drafters.registry import ALGORITHMS, DRAFT_MODELS, DRAFTERS, LOOKUPS, PLAIN, drafter_class
from eyas.launch import schema as launch_schema
from eyas.launch.compose import config_dir

PROTOCOL = [name for name, _ in inspect.getmembers(Drafter, inspect.isfunction) if not name.startswith("_")]


@pytest.mark.parametrize("name", list(DRAFTERS))
def test_every_row_builds_a_class_that_follows_the_drafter_protocol(name):
    cls = drafter_class(name)
    assert callable(getattr(cls, "from_parts", None)), f"{cls.__name__} has no from_parts"
    missing = [method for method in PROTOCOL if not callable(getattr(cls, method, None))]
    assert not missing, f"{cls.__name__} lacks {missing}"


def test_the_schema_and_the_hybrid_take_their_names_from_the_registry():
    assert [e.value for e in schema.SpeculativeAlgorithm] == list(ALGORITHMS) == [PLAIN, *DRAFTERS]
    assert [e.value for e in schema.HybridLookup] == list(LOOKUPS)
    assert [e.value for e in schema.DraftKind] == [PLAIN, *DRAFT_MODELS]
    assert set(MODES) == {"head", "hybrid", *LOOKUPS}


def test_every_config_file_of_a_drafter_group_names_a_registry_row():
    for group, key in (("speculative", "algorithm"), ("draft", "kind")):
        for path in sorted((Path(config_dir()) / group).glob("*.yaml")):
            assert path.stem in ALGORITHMS, f"{group}/{path.name} is no drafter of the registry"
            value = OmegaConf.load(path)[key]
            allowed = [path.stem] if group == "speculative" else (
                list(DRAFTERS[path.stem].draft_kinds) if path.stem in DRAFTERS else [PLAIN])
            assert value in allowed, f"{group}/{path.name}: {key}={value}, the registry says {allowed}"


def test_a_drafter_without_config_files_gets_its_groups_from_its_row(monkeypatch, tmp_path):
    """`register_schemas` stores speculative/<name> and draft/<name> for a row with no yaml of its own."""
    monkeypatch.setattr(launch_schema, "CONF_DIR", tmp_path)  # as if no drafter shipped a config file
    repo = ConfigStore.instance().repo
    before = {group: dict(repo.get(group, {})) for group in ("speculative", "draft")}
    try:
        launch_schema.register_schemas()
        store = ConfigStore.instance()
        for name, row in DRAFTERS.items():
            spec = OmegaConf.structured(store.load(f"speculative/{name}.yaml").node)
            assert (spec.algorithm.value, spec.num_steps) == (name, row.default_steps)
            draft = store.load(f"draft/{name}.yaml").node
            kind = row.draft_kinds[0]
            assert draft.kind.value == kind
            expected = None if kind == PLAIN else f"${{model.heads.{DRAFT_MODELS[kind]}}}"
            assert OmegaConf.to_container(draft)["path"] == expected
    finally:
        for group, options in before.items():
            if options:
                repo[group] = options
            else:
                repo.pop(group, None)


@pytest.mark.parametrize("name", [name for name, row in DRAFTERS.items() if not row.draft_model])
def test_a_drafter_without_a_draft_model_loads_none(name):
    assert compose_config([f"speculative={name}"])["draft"]["kind"] == PLAIN
    with build_engine([f"speculative={name}", "adaptive=off"]) as eng:
        assert isinstance(eng.worker.drafter, drafter_class(name))
        assert eng.worker.state.draft_extend_backend is None  # no draft backends
        assert not eng.container.speculative.draft_model.built
