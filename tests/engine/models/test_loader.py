"""Checkpoint loading: layouts that work, and clear errors for those that cannot."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file
from support import build_engine
from support.checkpoints import copy_checkpoint, edit_config
from support.engines import PLAIN, engine_overrides

from eyas import CheckpointError, ConfigError, SamplingParams
from eyas.engine.models.loader import load_model
from eyas.testing.checkpoints import write_llama


def edit_tensors(path, fn):
    tensors = load_file(path / "model.safetensors")
    fn(tensors)
    save_file(tensors, path / "model.safetensors")


def test_sharded_checkpoint_equals_single(tmp_path):
    single = write_llama(tmp_path / "single", seed=5)
    sharded = write_llama(tmp_path / "sharded", seed=5, max_shard_size="100KB")
    assert (sharded / "model.safetensors.index.json").is_file()
    assert not (sharded / "model.safetensors").exists()
    a, b = load_model(single, weight_layout="linear"), load_model(sharded, weight_layout="linear")  # dense: read back
    for (name, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items()):
        assert torch.equal(x, y), name


def test_dtype_comes_from_config(tmp_path):
    path = write_llama(tmp_path / "bf16", dtype=torch.bfloat16, with_tokenizer=False)
    edit_config(path, dtype="bfloat16", torch_dtype="bfloat16")
    assert load_model(path).lm_head.weight.dtype == torch.bfloat16
    assert load_model(path, dtype="float32").lm_head.weight.dtype == torch.float32


def test_tied_head_shares_embedding(checkpoint):
    model = load_model(checkpoint("tied_llama3"))
    assert model.lm_head.weight is model.model.embed_tokens.weight


def test_missing_directory():
    with pytest.raises(CheckpointError, match="checkpoint directory not found"):
        load_model("/no/such/checkpoint")


def test_missing_config(gqa_checkpoint, tmp_path):
    path = copy_checkpoint(gqa_checkpoint, tmp_path / "c")
    (path / "config.json").unlink()
    with pytest.raises(CheckpointError, match="missing file: .*config.json"):
        load_model(path)


def test_missing_weights(gqa_checkpoint, tmp_path):
    path = copy_checkpoint(gqa_checkpoint, tmp_path / "c")
    (path / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match="model.safetensors"):
        load_model(path)


def test_missing_shard(tmp_path):
    path = write_llama(tmp_path / "sharded", max_shard_size="100KB", with_tokenizer=False)
    shard = json.loads((path / "model.safetensors.index.json").read_text())["weight_map"]["lm_head.weight"]
    (path / shard).unlink()
    with pytest.raises(CheckpointError, match="missing shard files"):
        load_model(path)


def test_unsupported_architecture(gqa_checkpoint, tmp_path):
    path = copy_checkpoint(gqa_checkpoint, tmp_path / "c")
    edit_config(path, architectures=["GPT2LMHeadModel"], model_type="gpt2")
    with pytest.raises(CheckpointError, match="unsupported architecture.*LlamaForCausalLM"):
        load_model(path)


def test_unsupported_rope_type(gqa_checkpoint, tmp_path):
    path = copy_checkpoint(gqa_checkpoint, tmp_path / "c")
    edit_config(path, rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0})
    with pytest.raises(CheckpointError, match="rope_type 'yarn'.*allowed"):
        load_model(path)


def test_wrong_shape_names_tensor(gqa_checkpoint, tmp_path):
    path = copy_checkpoint(gqa_checkpoint, tmp_path / "c")
    name = "model.layers.1.mlp.up_proj.weight"
    edit_tensors(path, lambda t: t.__setitem__(name, t[name][:, :10].contiguous()))
    with pytest.raises(CheckpointError, match=f"'{name}' has shape"):
        load_model(path)


def test_missing_tensor_names_it(gqa_checkpoint, tmp_path):
    path = copy_checkpoint(gqa_checkpoint, tmp_path / "c")
    edit_tensors(path, lambda t: t.pop("model.layers.0.self_attn.k_proj.weight"))
    with pytest.raises(CheckpointError, match="missing tensors.*model.layers.0.self_attn.k_proj.weight"):
        load_model(path)


def test_untied_checkpoint_without_head(gqa_checkpoint, tmp_path):
    path = copy_checkpoint(gqa_checkpoint, tmp_path / "c")
    edit_tensors(path, lambda t: t.pop("lm_head.weight"))
    with pytest.raises(CheckpointError, match="lm_head.weight"):
        load_model(path)


def test_without_tokenizer_token_ids_work_and_text_fails_clearly(tmp_path):
    path = write_llama(tmp_path / "notok", with_tokenizer=False)
    with build_engine([*PLAIN, f"model.path={path}"]) as eng:
        out = eng.generate(prompt_token_ids=[[0, 5, 6]], sampling=SamplingParams(max_new_tokens=3, ignore_eos=True))
        assert len(out[0].token_ids) == 3
        with pytest.raises(ConfigError, match="tokenizer.json"):
            eng.generate(["hello"])


def test_eos_ids_from_generation_config(gqa_checkpoint, tmp_path):
    path = copy_checkpoint(gqa_checkpoint, tmp_path / "c")
    (path / "generation_config.json").write_text(json.dumps({"eos_token_id": [1, 7]}))
    from eyas.engine.models.config import load_model_config

    assert load_model_config(path).eos_token_ids == (1, 7)


def test_published_head_layouts_load(spec_pair, tmp_path):
    from eyas.engine.models.draft_loader import load_draft
    from eyas.testing.checkpoints import write_eagle3_head, write_eagle_head

    target_dir, _ = spec_pair
    target = load_model(target_dir)
    eagle = load_draft(write_eagle_head(tmp_path / "e", target_dir, fmt="bin"), "eagle", target)
    assert eagle.fc.bias is not None and eagle.lm_head is target.lm_head and eagle.embed_tokens is target.model.embed_tokens
    eagle3 = load_draft(write_eagle3_head(tmp_path / "e3", target_dir, draft_vocab_size=100, fmt="safetensors",
                                          aux_layer_ids=(0, 1, 3)), "eagle3", target)
    assert eagle3.draft_vocab_size == 100 and eagle3.target_aux_layer_ids(target.config.num_hidden_layers) == (0, 1, 3)
    assert int(eagle3.t2d.sum()) == 100 and eagle3.d2t.dtype == torch.int64


@pytest.mark.parametrize("kind,change,field", [
    ("eagle", dict(hidden_size=32), "hidden_size"),
    ("eagle", dict(vocab_size=999), "vocab_size"),
    ("eagle3", dict(target_hidden_size=48), "target_hidden_size"),
    ("eagle3", dict(vocab_size=999), "vocab_size"),
])
def test_head_that_does_not_fit_the_target_fails_at_build(spec_pair, tmp_path, kind, change, field):

    from eyas.testing.checkpoints import write_eagle3_head, write_eagle_head

    target_dir, _ = spec_pair
    writer = write_eagle_head if kind == "eagle" else write_eagle3_head
    head = writer(tmp_path / "head", target_dir, **change)
    with pytest.raises(CheckpointError, match=f"{field} is .* but the target's is"):
        build_engine(engine_overrides(target_dir, kind, head=head, num_steps=2))


def test_head_of_the_wrong_kind_fails(spec_pair):

    target_dir, heads = spec_pair
    overrides = engine_overrides(target_dir, "eagle3", head=heads["eagle"], num_steps=2)
    with pytest.raises(CheckpointError, match="not an EAGLE-3 head"):
        build_engine(overrides)


def truncate(file, keep: float = 0.5):
    data = file.read_bytes()
    file.write_bytes(data[:int(len(data) * keep)])


@pytest.mark.parametrize("keep", [0.5, 0.0001])
def test_truncated_weights_name_the_file(gqa_checkpoint, tmp_path, keep):
    path = copy_checkpoint(gqa_checkpoint, tmp_path / "c")
    truncate(path / "model.safetensors", keep)
    with pytest.raises(CheckpointError, match=r"cannot read .*c/model.safetensors: .*truncated"):
        load_model(path)


def test_truncated_shard_names_the_shard(tmp_path):
    path = write_llama(tmp_path / "sharded", max_shard_size="100KB", with_tokenizer=False)
    shard = sorted(path.glob("model-*.safetensors"))[-1]
    truncate(shard)
    with pytest.raises(CheckpointError, match=f"cannot read .*{shard.name}"):
        load_model(path)


def test_wrong_dtype_names_the_tensor(gqa_checkpoint, tmp_path):
    path = copy_checkpoint(gqa_checkpoint, tmp_path / "c")
    name = "model.layers.0.mlp.gate_proj.weight"
    edit_tensors(path, lambda t: t.__setitem__(name, t[name].to(torch.int32)))
    with pytest.raises(CheckpointError, match=f"'{name}' has dtype torch.int32, expected a floating-point dtype"):
        load_model(path)


def test_broken_engine_build_names_the_checkpoint(gqa_checkpoint, tmp_path):
    path = copy_checkpoint(gqa_checkpoint, tmp_path / "c")
    truncate(path / "model.safetensors")
    with pytest.raises(CheckpointError, match="model.safetensors"):
        build_engine([*PLAIN, f"model.path={path}"])


@pytest.mark.parametrize("fmt", ["bin", "safetensors"])
def test_truncated_head_names_the_file(spec_pair, tmp_path, fmt):
    from eyas.engine.models.draft_loader import load_draft
    from eyas.testing.checkpoints import write_eagle3_head

    target_dir, _ = spec_pair
    head = write_eagle3_head(tmp_path / "e3", target_dir, fmt=fmt)
    file = head / ("pytorch_model.bin" if fmt == "bin" else "model.safetensors")
    truncate(file)
    with pytest.raises(CheckpointError, match=f"cannot read .*{file.name}"):
        load_draft(head, "eagle3", load_model(target_dir))


@pytest.mark.parametrize("edit,match", [
    (lambda t: t.pop("midlayer.hidden_norm.weight"), r"missing tensors \['midlayer.hidden_norm.weight'\]"),
    (lambda t: t.__setitem__("fc.weight", t["fc.weight"][:, :8].contiguous()), r"'fc.weight' has shape"),
    (lambda t: t.__setitem__("d2t", t["d2t"].float()), r"'d2t' has dtype torch.float32 and shape \(100,\), expected an integer dtype"),
    (lambda t: t.__setitem__("d2t", t["d2t"] + 1000), r"'d2t' maps draft ids to target ids outside \[0, 320\)"),
    (lambda t: t.__setitem__("t2d", t["t2d"].long()), r"'t2d' has dtype torch.int64, expected a bool dtype"),
])
def test_broken_head_tensors_are_named(spec_pair, tmp_path, edit, match):
    from eyas.engine.models.draft_loader import load_draft
    from eyas.testing.checkpoints import write_eagle3_head

    target_dir, _ = spec_pair
    head = write_eagle3_head(tmp_path / "e3", target_dir, fmt="safetensors", draft_vocab_size=100)
    edit_tensors(head, edit)
    with pytest.raises(CheckpointError, match=match):
        load_draft(head, "eagle3", load_model(target_dir))


@pytest.mark.parametrize("aux,message", [
    (None, "a target of 2 layers needs eagle_config.eagle_aux_hidden_state_layer_ids"),
    ((0, 1, 5), r"eagle_aux_hidden_state_layer_ids \[0, 1, 5\] must be 3 target layer ids in \[0, 2\)"),
])
def test_eagle3_head_on_a_shallow_target_names_its_aux_layers(tmp_path, aux, message):
    from eyas.testing.checkpoints import write_eagle3_head

    target = write_llama(tmp_path / "t", num_layers=2, with_tokenizer=False)
    head = write_eagle3_head(tmp_path / "e3", target, aux_layer_ids=aux)
    with pytest.raises(CheckpointError, match=message):
        build_engine([f"model.path={target}", "speculative=eagle3", "draft=eagle3", f"draft.path={head}",
                      "adaptive=off"])


def test_models_build_without_initialising_and_leave_other_threads_alone():
    """A model is built on meta without initialising its weights (initialising meta tensors imports
    Dynamo: a second of every start), while a module another thread builds meanwhile is initialised."""
    import subprocess
    import sys
    import threading

    from torch import nn

    from eyas.engine.models.loader import meta_device

    script = "import sys; from eyas import build_engine; build_engine(['model=tiny']); print('torch._dynamo' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert done.stdout.split()[-1] == "False", done.stdout + done.stderr
    inside, started, built = threading.Event(), threading.Event(), []

    def other_thread():
        inside.wait()
        built.append(nn.Linear(8, 8))
        started.set()
    thread = threading.Thread(target=other_thread)
    thread.start()
    with meta_device():
        skipped = nn.Linear(8, 8)
        inside.set()
        started.wait(timeout=30)
    thread.join()
    assert skipped.weight.is_meta and bool(built[0].weight.abs().sum() > 0)
