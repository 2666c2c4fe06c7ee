"""The tiny random checkpoints the tests run on, and the session's directories that fixtures fill once."""

import json
import os
import shutil
from pathlib import Path

# name -> write_llama kwargs. `gqa` and `tied_llama3` are the oracle pair of the foundation tests.
CHECKPOINTS = {
    "gqa": dict(num_heads=4, num_kv_heads=2, tie=False, rope_theta=500000.0, seed=1),
    "tied_llama3": dict(
        num_heads=4, num_kv_heads=4, tie=True, seed=2,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                      "original_max_position_embeddings": 64},
    ),
    "linear_bias": dict(num_heads=4, num_kv_heads=1, attention_bias=True, seed=3,
                        rope_scaling={"rope_type": "linear", "factor": 2.0}),
    # layers add little to the residual stream: the next token depends mostly on the current one,
    # so heads trained for seconds agree with the target often (ragged acceptance)
    "bigram": dict(num_layers=4, num_heads=4, num_kv_heads=2, residual_scale=0.003, init_std=0.3, seed=3),
    # the other families, each with what sets it apart: Qwen2's q/k/v biases and tied head, Qwen3's
    # per-head q/k norms and a head_dim unrelated to hidden_size / heads, Mistral's sliding window
    "qwen2": dict(family="qwen2", num_heads=4, num_kv_heads=2, tie=True, rope_theta=1000000.0, seed=4),
    "qwen3": dict(family="qwen3", num_heads=4, num_kv_heads=2, head_dim=24, seed=5),
    "mistral": dict(family="mistral", num_heads=4, num_kv_heads=1, head_dim=40, sliding_window=4096, seed=6),
    "qwen3_bigram": dict(family="qwen3", num_layers=4, num_heads=4, num_kv_heads=2, head_dim=24,
                         residual_scale=0.003, init_std=0.3, seed=7),
}


def fixture_dir(tmp_path_factory, name: str, build) -> Path:
    """A directory that `build(path)` fills once per session; with EYAS_TEST_CACHE_DIR set, once for
    every session that shares that directory (the mutation runs build their fixtures once)."""
    shared = os.environ.get("EYAS_TEST_CACHE_DIR")
    if not shared:
        path = tmp_path_factory.mktemp(name)
        build(path)
        return path
    path = Path(shared) / name
    if not (path / ".complete").is_file():
        shutil.rmtree(path, ignore_errors=True)
        path.mkdir(parents=True)
        build(path)
        (path / ".complete").touch()
    return path


def copy_checkpoint(src, dst):
    shutil.copytree(src, dst)
    return dst


def edit_config(path, **changes):
    """Set the given config.json fields; a None value removes the field."""
    config = json.loads((path / "config.json").read_text())
    config.update(changes)
    for key in [k for k, v in changes.items() if v is None]:
        config.pop(key)
    (path / "config.json").write_text(json.dumps(config))
