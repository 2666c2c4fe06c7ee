"""Load an EAGLE (1/2) or EAGLE-3 draft head in its published layout and fit it to its target."""

from pathlib import Path

import torch
from torch import nn

from eyas.engine.errors import CheckpointError, ConfigError
from eyas.engine.models.config import LLAMA, ModelConfig, load_model_config, read_json
from eyas.engine.models.eagle import EagleDraftModel
from eyas.engine.models.eagle3 import Eagle3DraftModel
from eyas.engine.models.llama import LlamaDecoderLayer, LlamaForCausalLM
from eyas.engine.models.standalone_draft import load_standalone_draft
from eyas.engine.models.loader import (assign_state, checkpoint_dir, meta_device, pack_for_inference, read_tensors,
                                  resolve_dtype)
from eyas.engine.models.weight_formats import (GGUF_SCHEMES, Quantization, check_quantization,
                                               resolve_head_quantization)

# heads are one Llama decoder layer whatever their target's family
EAGLE3_ARCHITECTURES = {"LlamaForCausalLMEagle3": LLAMA}
EAGLE_ARCHITECTURES = {"LlamaForCausalLM": LLAMA, "EagleForCausalLM": LLAMA, "LlamaForCausalLMEagle": LLAMA}
# draft.kind -> the model.heads field that names the draft trained for the target
DRAFT_MODELS = {"eagle": "eagle", "eagle3": "eagle3", "lm": "draft_lm"}
DRAFT_KINDS = tuple(DRAFT_MODELS)


def _check_fit(directory: Path, what: str, draft_value: int, target_value: int) -> None:
    if draft_value != target_value:
        raise CheckpointError(
            f"{directory}: the draft head's {what} is {draft_value} but the target's is {target_value}: "
            "this head was not trained for this target (set draft.path to a head trained for it, or decode "
            "without one: speculative=none draft=none)"
        )


def _build_eagle(directory: Path, raw: dict, config: ModelConfig, tensors: dict, target: LlamaForCausalLM):
    _check_fit(directory, "hidden_size", config.hidden_size, target.config.hidden_size)
    _check_fit(directory, "vocab_size", config.vocab_size, target.config.vocab_size)
    if "fc.weight" not in tensors:
        raise CheckpointError(f"{directory}: missing tensors ['fc.weight'] (not an EAGLE head?)")
    with meta_device():
        model = EagleDraftModel(config, fc_bias="fc.bias" in tensors)
        if "layers.0.input_layernorm.weight" in tensors:  # some exports keep it
            model.layers[0] = LlamaDecoderLayer(config, 0)
    return model


def _build_eagle3(directory: Path, raw: dict, config: ModelConfig, tensors: dict, target: LlamaForCausalLM):
    target_hidden = raw.get("target_hidden_size") or config.hidden_size
    _check_fit(directory, "target_hidden_size", target_hidden, target.config.hidden_size)
    _check_fit(directory, "vocab_size", config.vocab_size, target.config.vocab_size)
    if config.hidden_size != target.config.hidden_size and "embed_tokens.weight" not in tensors:
        raise CheckpointError(f"{directory}: hidden_size {config.hidden_size} differs from the target's "
                              f"{target.config.hidden_size} and the head ships no embed_tokens.weight")
    draft_vocab = raw.get("draft_vocab_size") or config.vocab_size
    aux = (raw.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    if aux is not None and (len(aux) != 3 or not all(0 <= i < target.config.num_hidden_layers for i in aux)):
        raise CheckpointError(f"{directory}: eagle_aux_hidden_state_layer_ids {aux} must be 3 target layer ids "
                              f"in [0, {target.config.num_hidden_layers})")
    if aux is None and target.config.num_hidden_layers < 3:  # the default (2, L // 2, L - 3) needs 3 layers
        raise CheckpointError(f"{directory}: a target of {target.config.num_hidden_layers} layers needs "
                              "eagle_config.eagle_aux_hidden_state_layer_ids (3 target layer ids) in the head's "
                              "config.json: the default (2, L // 2, L - 3) needs at least 3 layers")
    d2t = tensors.setdefault("d2t", torch.zeros(draft_vocab, dtype=torch.int64))
    if d2t.is_floating_point() or d2t.dtype == torch.bool or d2t.shape != (draft_vocab,):
        raise CheckpointError(f"{directory}: tensor 'd2t' has dtype {d2t.dtype} and shape {tuple(d2t.shape)}, "
                              f"expected an integer dtype and shape ({draft_vocab},)")
    target_ids = torch.arange(draft_vocab) + d2t
    if draft_vocab and not 0 <= int(target_ids.min()) <= int(target_ids.max()) < config.vocab_size:
        raise CheckpointError(f"{directory}: tensor 'd2t' maps draft ids to target ids outside [0, {config.vocab_size})")
    if "t2d" not in tensors:
        tensors["t2d"] = torch.zeros(config.vocab_size, dtype=torch.bool)
        tensors["t2d"][target_ids] = True
    with meta_device():
        return Eagle3DraftModel(config, target_hidden, draft_vocab, tuple(aux) if aux is not None else None)


def load_draft(path: str | Path, kind: str, target: LlamaForCausalLM, dtype: str = "auto",
               device: str | torch.device = "cpu", weight_layout: str = "auto",
               target_path: str | Path | None = None, quantization: str = "none",
               quantization_group_size: int = 128) -> nn.Module:
    """Load the draft model at `path`: an EAGLE / EAGLE-3 head (`kind` eagle | eagle3), with the target's
    shared modules attached, or a small LM with the target's tokenizer (`kind` lm). `quantization`
    stores the draft's own linear layers in int8, int4 or Q8_0 blocks (`auto`: q8_0 on a CPU that builds eyas's
    kernels; an EAGLE-1/2 head's lm_head is the target's)."""
    if kind not in DRAFT_KINDS:
        raise CheckpointError(f"draft.kind {kind!r} is not a draft model; allowed: {list(DRAFT_KINDS)}")
    check_quantization(quantization, quantization_group_size, torch.device(device), "draft")
    if quantization in GGUF_SCHEMES and kind != "lm":
        raise ConfigError(f"draft.quantization={quantization} keeps a GGUF file's quantized blocks; an {kind} head is "
                          f"not a GGUF file: set draft.quantization to one of none, int8, int4")
    if kind != "lm":
        quantization = resolve_head_quantization(quantization, torch.device(device))
    if kind == "lm":
        return load_standalone_draft(path, target, dtype, device, weight_layout, target_path, quantization,
                                     quantization_group_size)
    directory = checkpoint_dir(path)
    raw = read_json(directory / "config.json")
    archs = raw.get("architectures") or []
    is_eagle3 = bool(set(archs) & set(EAGLE3_ARCHITECTURES))
    if is_eagle3 != (kind == "eagle3"):
        raise CheckpointError(f"{directory}: architectures {archs} is {'an EAGLE-3' if is_eagle3 else 'not an EAGLE-3'} "
                              f"head, but draft.kind is {kind!r}")
    config = load_model_config(directory, EAGLE3_ARCHITECTURES if is_eagle3 else EAGLE_ARCHITECTURES)
    tensors = read_tensors(directory, allow_bin=True)
    build = _build_eagle3 if is_eagle3 else _build_eagle
    model = build(directory, raw, config, tensors, target)
    torch_dtype = target.lm_head.weight.dtype if dtype == "auto" else resolve_dtype(dtype, dtype)
    device = torch.device(device)
    own_embed = tensors.pop("embed_tokens.weight", None)
    if not is_eagle3:
        tensors.pop("lm_head.weight", None)  # EAGLE-1/2 heads use the target's lm_head
    assign_state(model, tensors, torch_dtype, device, str(directory))
    if own_embed is not None:
        model.embed_tokens = nn.Embedding.from_pretrained(own_embed.to(device=device, dtype=torch_dtype), freeze=True)
    else:
        model.embed_tokens = target.model.embed_tokens
    if not is_eagle3:
        model.share_target_lm_head(target)
    model.rotary.reset(device)
    model.eval().requires_grad_(False)
    pack_for_inference(model, weight_layout, device, Quantization(quantization, quantization_group_size), "draft",
                       runs_beside=target)
    return model
