import os
import shutil
from pathlib import Path

import torch

# Triton kernels run in the interpreter on CPU; read when a kernel is defined, so before any import of them
if not os.environ.get("TRITON_INTERPRET"):
    os.environ["TRITON_INTERPRET"] = "0" if torch.cuda.is_available() else "1"

# measured weight layouts are kept per test run (every engine and server of the run packs alike), not
# read from the user's cache
if not os.environ.get("EYAS_CACHE_DIR"):
    import atexit
    import tempfile
    os.environ["EYAS_CACHE_DIR"] = tempfile.mkdtemp(prefix="eyas-test-cache-")
    atexit.register(shutil.rmtree, os.environ["EYAS_CACHE_DIR"], ignore_errors=True)

# the default graphs.mode (auto) compiles graph packages in a background process; the tests' engines, CLI and
# README commands run eager unless a test names a graphs mode (the graph tests do)
os.environ.setdefault("EYAS_GRAPHS_MODE", "eager")

import pytest
from support.checkpoints import CHECKPOINTS, fixture_dir
from support.engines import PlainReference
from support.trained_heads import train_heads

from eyas.testing.checkpoints import write_llama

# GGUF files and the cache root their metadata directories are built in (modules use it with usefixtures);
# the graph packages the graph tests share
pytest_plugins = ["support.gguf_fixtures", "support.packages"]


@pytest.fixture(scope="session")
def checkpoint(tmp_path_factory):
    """checkpoint(name) -> directory of a tiny random HF Llama, written once per session."""
    cache = {}

    def get(name: str) -> Path:
        if name not in cache:
            cache[name] = fixture_dir(tmp_path_factory, name, lambda path: write_llama(path, **CHECKPOINTS[name]))
        return cache[name]

    return get


@pytest.fixture(scope="session")
def gqa_checkpoint(checkpoint) -> Path:
    return checkpoint("gqa")


@pytest.fixture(scope="session")
def spec_pair(checkpoint, tmp_path_factory):
    """(target, {"eagle": head, "eagle3": head}) in the published head layouts, both trained for a few
    seconds on the target's samples, so drafts are accepted at every depth (tau about 2.9 and 2.4 at k = 3)."""
    target = checkpoint("bigram")
    trained = fixture_dir(tmp_path_factory, "trained_heads",
                          lambda path: train_heads(target, path / "eagle", path / "eagle3"))
    return target, {"eagle": trained / "eagle", "eagle3": trained / "eagle3"}


@pytest.fixture(scope="session")
def qwen3_spec_pair(checkpoint, tmp_path_factory):
    """`spec_pair` over a Qwen3 target: heads in the published (Llama-layer) layouts, trained alike."""
    target = checkpoint("qwen3_bigram")
    trained = fixture_dir(tmp_path_factory, "qwen3_trained_heads",
                          lambda path: train_heads(target, path / "eagle", path / "eagle3"))
    return target, {"eagle": trained / "eagle", "eagle3": trained / "eagle3"}


@pytest.fixture(scope="session")
def plain_reference() -> PlainReference:
    return PlainReference()
