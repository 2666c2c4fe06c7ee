"""Qwen2, Qwen3 and Mistral targets (their greedy output and logits against transformers' are in
tests/e2e/test_oracle.py): config fields are read as transformers reads them, what the engine cannot
honour is refused, the Triton backend runs them, and EAGLE heads over a Qwen3 target are lossless."""

import pytest
from support import build_engine
from support.checkpoints import copy_checkpoint, edit_config
from support.engines import PLAIN, engine_overrides
from support.oracle import ORACLE_PROMPTS, hf_greedy, hf_model

from eyas import CheckpointError, ConfigError, SamplingParams
from eyas.engine.models.config import load_model_config
from eyas.engine.models.loader import load_model
from eyas.testing.checkpoints import write_llama

FAMILY_CHECKPOINTS = ["qwen2", "qwen3", "mistral"]


@pytest.mark.slow
@pytest.mark.parametrize("name", FAMILY_CHECKPOINTS)
def test_triton_backend_equals_transformers(checkpoint, name):
    path = checkpoint(name)
    with build_engine([*PLAIN, f"model.path={path}", "attention=triton", "cache.page_size=16"]) as eng:
        outs = eng.generate(ORACLE_PROMPTS[:3], SamplingParams(max_new_tokens=16, ignore_eos=True))
    model = hf_model(path)
    for out in outs:
        assert out.token_ids == hf_greedy(model, out.prompt_token_ids, 16)


def test_family_fields_are_read_as_transformers_reads_them(checkpoint):
    qwen2, qwen3, mistral = (load_model_config(checkpoint(n)) for n in FAMILY_CHECKPOINTS)
    assert (qwen2.architecture, qwen2.qkv_bias, qwen2.o_bias, qwen2.qk_norm, qwen2.tie_word_embeddings) == \
        ("Qwen2ForCausalLM", True, False, False, True)
    assert (qwen3.qk_norm, qwen3.head_dim, qwen3.hidden_size // qwen3.num_attention_heads) == (True, 24, 16)
    assert (mistral.qkv_bias, mistral.head_dim, mistral.sliding_window) == (False, 40, 4096)
    model = load_model(checkpoint("qwen3"))
    attn = model.model.layers[0].self_attn
    assert attn.q_norm.weight.shape == (24,) and attn.q_proj.weight.shape == (4 * 24, 64)
    assert model.model.layers[0].self_attn.q_proj.bias is None
    qwen2_attn = load_model(checkpoint("qwen2")).model.layers[0].self_attn
    assert qwen2_attn.q_proj.bias is not None and qwen2_attn.o_proj.bias is None


def _copy_with(src, dst, **changes):
    edit_config(copy_checkpoint(src, dst), **changes)
    return dst


def test_qwen_sliding_window_counts_only_when_enabled_on_some_layer(checkpoint, tmp_path):
    src = checkpoint("qwen2")
    off = _copy_with(src, tmp_path / "off", use_sliding_window=False, sliding_window=32)
    assert load_model_config(off).sliding_window is None
    on = _copy_with(src, tmp_path / "on", use_sliding_window=True, sliding_window=32,
                    layer_types=["full_attention", "sliding_attention"])
    assert load_model_config(on).sliding_window == 32
    all_full = _copy_with(src, tmp_path / "all_full", use_sliding_window=True, sliding_window=32,
                          layer_types=["full_attention", "full_attention"])
    assert load_model_config(all_full).sliding_window is None
    below = _copy_with(src, tmp_path / "below", use_sliding_window=True, sliding_window=32, layer_types=None,
                       max_window_layers=2)  # layers from index 2 slide: none of the 2
    assert load_model_config(below).sliding_window is None
    above = _copy_with(src, tmp_path / "above", use_sliding_window=True, sliding_window=32, layer_types=None,
                       max_window_layers=1)
    assert load_model_config(above).sliding_window == 32


def test_sliding_window_bounds_the_context_and_a_longer_one_is_refused(tmp_path):
    path = write_llama(tmp_path / "m", family="mistral", sliding_window=24, max_position_embeddings=512, seed=8)
    model = load_model(path)
    with build_engine([*PLAIN, f"model.path={path}"]) as eng:
        assert eng.scheduler.kv.max_context_len == 24
        out = eng.generate(prompt_token_ids=[[0, 5, 9, 11]], sampling=SamplingParams(max_new_tokens=100, ignore_eos=True))
        assert len(out[0].token_ids) == 24 - 4  # the window holds the whole sequence: exact attention
    hf = hf_model(path)
    assert out[0].token_ids == hf_greedy(hf, [0, 5, 9, 11], 20)
    with build_engine([*PLAIN, f"model.path={path}", "cache.max_context_len=16"]) as eng:
        assert eng.scheduler.kv.max_context_len == 16
    with pytest.raises(ConfigError, match=r"cache.max_context_len = 64 exceeds the model's sliding_window \(24.*"
                                          r"MistralForCausalLM.*allowed: 2..24"):
        build_engine([*PLAIN, f"model.path={path}", "cache.max_context_len=64"])
    assert model.config.sliding_window == 24


@pytest.mark.parametrize("changes,match", [
    (dict(model_type="llama"), r"unsupported architecture \['Qwen3ForCausalLM'\] \(model_type='llama'\)"),
    (dict(architectures=["Qwen3MoeForCausalLM"], model_type="qwen3_moe"), "supported: LlamaForCausalLM.*Qwen3ForCausalLM"),
    (dict(hidden_act="gelu"), r"hidden_act 'gelu' is not supported; allowed: \['silu'\]"),
])
def test_what_the_engine_cannot_run_is_refused(checkpoint, tmp_path, changes, match):
    path = _copy_with(checkpoint("qwen3"), tmp_path / "c", **changes)
    with pytest.raises(CheckpointError, match=match):
        load_model(path)


def test_architecture_from_model_type_when_the_list_is_missing(checkpoint, tmp_path):
    path = _copy_with(checkpoint("qwen3"), tmp_path / "c", architectures=None)
    assert load_model_config(path).architecture == "Qwen3ForCausalLM"


def test_missing_qk_norm_is_named(checkpoint, tmp_path):
    from safetensors.torch import load_file, save_file

    path = _copy_with(checkpoint("qwen3"), tmp_path / "c")
    tensors = load_file(path / "model.safetensors")
    tensors.pop("model.layers.1.self_attn.k_norm.weight")
    save_file(tensors, path / "model.safetensors")
    with pytest.raises(CheckpointError, match=r"missing tensors \['model.layers.1.self_attn.k_norm.weight'\]"):
        load_model(path)


@pytest.mark.slow  # trains a second pair of heads
@pytest.mark.parametrize("kind", ["eagle", "eagle3"])
@pytest.mark.parametrize("page_size", [1, 16])
def test_heads_over_a_qwen3_target_are_lossless(qwen3_spec_pair, plain_reference, kind, page_size):
    target, heads = qwen3_spec_pair
    params = SamplingParams(max_new_tokens=28, ignore_eos=True)
    with build_engine(engine_overrides(target, kind, f"cache.page_size={page_size}", head=heads[kind])) as eng:
        outs = eng.generate(ORACLE_PROMPTS, params)
        metrics = eng.metrics()
        assert eng.scheduler.kv.all_free()
    assert [o.token_ids for o in outs] == plain_reference(target, ORACLE_PROMPTS, params)
    assert 0 < metrics["draft_accept_rate"] < 1  # ragged acceptance: drafts are accepted and rejected
    assert metrics["mean_accept_length"] >= 1.5


@pytest.mark.slow  # the same heads
def test_seeded_sampling_over_a_qwen3_target_equals_plain(qwen3_spec_pair, plain_reference):
    target, heads = qwen3_spec_pair
    params = [SamplingParams(max_new_tokens=24, temperature=0.8, top_p=0.95, seed=100 + i, ignore_eos=True)
              for i in range(len(ORACLE_PROMPTS))]
    with build_engine(engine_overrides(target, "eagle3", head=heads["eagle3"], num_steps=4)) as eng:
        spec = [o.token_ids for o in eng.generate(ORACLE_PROMPTS, params)]
    assert spec == plain_reference(target, ORACLE_PROMPTS, params)
