"""The shipped pair: the default config runs it, and speculation on it is lossless."""

import json

import pytest
from rich.console import Console
from support import build_engine, compose_config
from support.engines import engine_overrides

from eyas import SamplingParams
from eyas.engine.assets import asset_path, heldout_files
from eyas.launch.cli import run

# the prompts GOLDEN_TAU was recorded on, for the shipped code model
GOLDEN_PROMPTS = ["def fibonacci(n):\n", "import os\nimport sys\n\n", "class Stack:\n    def __init__(self):\n",
                  "    for i, line in enumerate(lines):\n"]
PARAMS = SamplingParams(max_new_tokens=40, ignore_eos=True)
# tau of the shipped heads on GOLDEN_PROMPTS x PARAMS (greedy, deterministic). A change in how drafts are made
# (features, positions, KV, the draft loop) that costs acceptance shows here even while output stays
# lossless. Re-record only when the heads are retrained.
GOLDEN_TAU = {("eagle", 1): 1.798, ("eagle", 2): 2.477, ("eagle", 3): 2.780, ("eagle", 5): 3.553,
              ("eagle3", 1): 1.646, ("eagle3", 2): 2.107, ("eagle3", 3): 2.388, ("eagle3", 5): 2.780}


def test_default_run_completes_a_python_prompt_and_prints_tau(tmp_path):
    console = Console(record=True, width=200)
    result = run(compose_config(["sampling.max_new_tokens=24"]), tmp_path, console)
    printed = console.export_text()
    assert "def fibonacci(n):" in printed and "tau " in printed
    assert result["metrics"]["mean_accept_length"] > 1.0
    assert len(result["outputs"][0]["token_ids"]) >= 1


@pytest.mark.parametrize("kind", ["eagle", "eagle3"])
@pytest.mark.parametrize("num_steps", [1, 2, 3, 5])
@pytest.mark.parametrize("page_size", [1, 16])
def test_shipped_pair_is_lossless_at_its_recorded_acceptance(plain_reference, kind, num_steps, page_size):
    with build_engine(engine_overrides(None, kind, f"cache.page_size={page_size}", num_steps=num_steps)) as eng:
        outs = eng.generate(GOLDEN_PROMPTS, PARAMS)
        tau = eng.metrics()["mean_accept_length"]
        assert eng.scheduler.kv.all_free()
    assert [o.token_ids for o in outs] == plain_reference(None, GOLDEN_PROMPTS, PARAMS)
    assert tau == pytest.approx(GOLDEN_TAU[kind, num_steps], abs=0.05)


def test_shipped_heads_use_the_published_layouts():
    from safetensors import safe_open

    e3 = json.loads(open(f"{asset_path('eagle3')}/config.json").read())
    assert e3["architectures"] == ["LlamaForCausalLMEagle3"] and e3["draft_vocab_size"] < e3["vocab_size"]
    with safe_open(f"{asset_path('eagle3')}/model.safetensors", "pt") as f:
        keys = set(f.keys())
    assert {"fc.weight", "norm.weight", "lm_head.weight", "d2t", "t2d", "midlayer.hidden_norm.weight"} <= keys
    with safe_open(f"{asset_path('eagle')}/model.safetensors", "pt") as f:
        keys = set(f.keys())
    assert {"fc.weight", "fc.bias", "layers.0.self_attn.q_proj.weight"} <= keys
    assert not any(k.startswith(("embed_tokens", "lm_head", "layers.0.input_layernorm")) for k in keys)
    assert len(heldout_files()) >= 20
