"""Graph packages (`graphs.mode=aot`) as the graph tests share them."""

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def aot_cache(tmp_path_factory) -> Path:
    """One package cache for the run: the tests after the first load what it compiled."""
    return tmp_path_factory.mktemp("aot_cache")


def aot(cache) -> list[str]:
    return ["graphs.mode=aot", f"graphs.cache_dir={cache}"]


def packages(cache) -> set[str]:
    return {p.name for p in Path(cache).rglob("*.pt2")}
