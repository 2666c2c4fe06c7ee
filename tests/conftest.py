import os
import random
import shutil
import sys
from pathlib import Path

import torch

# Triton kernels run in the interpreter on CPU; read when a kernel is defined, so before any import of them
if not os.environ.get("TRITON_INTERPRET"):
    os.environ["TRITON_INTERPRET"] = "0" if torch.cuda.is_available() else "1"

import pytest  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))  # tests/checkpoints.py

from checkpoints import write_llama  # noqa: E402
from engine import SamplingParams, build_engine  # noqa: E402
from trained_heads import train_heads  # noqa: E402

PLAIN = ["speculative=none", "draft=none"]  # the default config speculates with the shipped heads

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


def plain_token_ids(target, prompts, params) -> list[list[int]]:
    """Plain greedy decoding of `prompts` on `target`: the reference speculative runs must equal."""
    with build_engine([*PLAIN, f"model.path={target}"]) as eng:
        return [o.token_ids for o in eng.generate(prompts, params)]


def random_requests_match_plain(target, overrides: list[str], count: int, seed: int, vocab: int = 320) -> None:
    """`count` random requests (prompts, lengths, greedy or seeded sampling) through an engine built
    from `overrides`: every KV page and table entry is free afterwards, and every output equals plain
    decoding's."""
    rng = random.Random(seed)
    prompts = [[0] + [rng.randrange(2, vocab) for _ in range(rng.randrange(1, 40))] for _ in range(count)]
    params = [SamplingParams(max_new_tokens=rng.randrange(1, 24), temperature=rng.choice([0.0, 0.8]), seed=i,
                             ignore_eos=rng.random() < 0.7) for i in range(count)]
    with build_engine(overrides) as eng:
        outs = eng.generate(prompt_token_ids=prompts, sampling=params)
        kv = eng.scheduler.kv
        assert kv.all_free() and (kv.table.table == -1).all()
    with build_engine([*PLAIN, f"model.path={target}"]) as eng:
        expected = eng.generate(prompt_token_ids=prompts, sampling=params)
    assert [o.token_ids for o in outs] == [o.token_ids for o in expected]


def spec_overrides(target, head, kind, num_steps, *extra):
    return [f"model.path={target}", f"draft={kind}", f"draft.path={head}", f"speculative={kind}", "adaptive=off",
            f"speculative.num_steps={num_steps}", f"speculative.num_draft_tokens={num_steps + 1}", *extra]
