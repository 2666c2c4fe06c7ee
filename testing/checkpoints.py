"""Tiny random Hugging Face checkpoints (Llama, Mistral, Qwen2, Qwen3) and tokenizers, written with `transformers` (the oracle)."""

from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

CORPUS = [
    "def add(a, b):\n    return a + b\n",
    "import os\nimport sys\nprint(os.getcwd())\n",
    "class Point:\n    def __init__(self, x, y):\n        self.x = x\n        self.y = y\n",
    "for i in range(10):\n    if i % 2 == 0:\n        print(i)\n",
    "The quick brown fox jumps over the lazy dog. " * 3,
]


def write_tokenizer(directory: Path, vocab_size: int) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(CORPUS, trainer)
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 0)])
    tok.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text('{"bos_token": "<s>", "eos_token": "</s>"}')
    return tok


# family -> transformers (config class, model class) names; all take Llama's config fields
FAMILIES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM"),
    "mistral": ("MistralConfig", "MistralForCausalLM"),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM"),
}


def write_llama(directory: Path, *, family="llama", vocab_size=320, hidden_size=64, intermediate_size=128,
                num_layers=2, num_heads=4, num_kv_heads=2, head_dim=None, tie=False, rope_theta=10000.0,
                rope_scaling=None, attention_bias=False, init_std=0.25, seed=0, max_position_embeddings=512,
                with_tokenizer=True, dtype=torch.float32, max_shard_size=None, residual_scale=1.0,
                **family_fields) -> Path:
    """Write a random decoder of `family` (a key of FAMILIES) with `transformers`; wide init keeps greedy
    output varied. `residual_scale` < 1 shrinks what the layers add to the residual stream, so the next
    token depends mostly on the current one (a draft head that reads only the token then agrees often).
    `family_fields` go to the config as they are (`sliding_window`, `use_sliding_window`, ...)."""
    import transformers

    config_name, model_name = FAMILIES[family]
    directory.mkdir(parents=True, exist_ok=True)
    if with_tokenizer:
        write_tokenizer(directory, vocab_size)
    fields = dict(
        vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=intermediate_size,
        num_hidden_layers=num_layers, num_attention_heads=num_heads, num_key_value_heads=num_kv_heads,
        max_position_embeddings=max_position_embeddings, rope_theta=rope_theta, rope_scaling=rope_scaling,
        tie_word_embeddings=tie, initializer_range=init_std, bos_token_id=0, eos_token_id=1, pad_token_id=None,
        **family_fields,
    )
    if family in ("llama", "qwen3"):
        fields["attention_bias"] = attention_bias
    if head_dim is not None:
        fields["head_dim"] = head_dim
    config = getattr(transformers, config_name)(**fields)
    torch.manual_seed(seed)
    model = getattr(transformers, model_name)(config).to(dtype)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("o_proj.weight", "down_proj.weight")):
                p.mul_(residual_scale)
            if name.endswith(("q_norm.weight", "k_norm.weight", ".bias")):  # transformers starts them at 1 / 0
                p.normal_(1.0 if name.endswith("norm.weight") else 0.0, init_std)
    kwargs = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.save_pretrained(directory, safe_serialization=True, **kwargs)
    return directory


def _save(directory: Path, config: dict, tensors: dict, fmt: str) -> Path:
    import json

    from safetensors.torch import save_file

    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config, indent=2))
    tensors = {k: v.contiguous() for k, v in tensors.items()}
    if fmt == "bin":
        torch.save(tensors, directory / "pytorch_model.bin")
    else:
        save_file(tensors, str(directory / "model.safetensors"))
    return directory


def _target_config(target_dir: Path) -> dict:
    import json

    return json.loads((target_dir / "config.json").read_text())


def _attention_mlp(prefix: str, h: int, heads: int, kv_heads: int, head_dim: int, inter: int, attn_in: int,
                   std: float, g: torch.Generator) -> dict:
    def rand(*shape):
        return torch.randn(*shape, generator=g) * std

    return {
        f"{prefix}.self_attn.q_proj.weight": rand(heads * head_dim, attn_in),
        f"{prefix}.self_attn.k_proj.weight": rand(kv_heads * head_dim, attn_in),
        f"{prefix}.self_attn.v_proj.weight": rand(kv_heads * head_dim, attn_in),
        f"{prefix}.self_attn.o_proj.weight": rand(h, heads * head_dim),
        f"{prefix}.mlp.gate_proj.weight": rand(inter, h),
        f"{prefix}.mlp.up_proj.weight": rand(inter, h),
        f"{prefix}.mlp.down_proj.weight": rand(h, inter),
        f"{prefix}.post_attention_layernorm.weight": torch.ones(h),
    }


def write_eagle_head(directory: Path, target_dir: Path, *, seed=0, fmt="bin", token_only=False, std=0.1,
                     hidden_size=None, vocab_size=None) -> Path:
    """An EAGLE-1/2 head in the published layout (e.g. EAGLE-LLaMA3-Instruct-8B): `fc.weight`,
    `fc.bias`, `layers.0.*` without `input_layernorm`, a LlamaForCausalLM config.json.
    `token_only`: fc passes the token embedding through and the layer adds nothing, so the head
    proposes argmax lm_head(embedding(token)): the successor of a target whose layers add little."""
    t = _target_config(target_dir)
    h = hidden_size or t["hidden_size"]
    heads, kv_heads = t["num_attention_heads"], t["num_key_value_heads"]
    head_dim, inter = h // heads, t["intermediate_size"]
    g = torch.Generator().manual_seed(seed)
    tensors = _attention_mlp("layers.0", h, heads, kv_heads, head_dim, inter, h, std, g)
    tensors["fc.weight"] = torch.randn(h, 2 * h, generator=g) * std
    tensors["fc.bias"] = torch.zeros(h)
    if token_only:
        tensors["fc.weight"] = torch.cat([torch.eye(h), torch.zeros(h, h)], dim=1)
        tensors["layers.0.self_attn.o_proj.weight"].zero_()
        tensors["layers.0.mlp.down_proj.weight"].zero_()
    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "bias": True,
        "hidden_size": h, "intermediate_size": inter, "num_attention_heads": heads,
        "num_key_value_heads": kv_heads, "num_hidden_layers": 1, "vocab_size": vocab_size or t["vocab_size"],
        "max_position_embeddings": t["max_position_embeddings"], "rms_norm_eps": t["rms_norm_eps"],
        "rope_theta": t.get("rope_parameters", {}).get("rope_theta", t.get("rope_theta", 10000.0)),
        "torch_dtype": "float32", "hidden_act": "silu",
    }
    return _save(directory, config, tensors, fmt)


def write_eagle3_head(directory: Path, target_dir: Path, *, draft_vocab_size=None, seed=0, fmt="bin", std=0.1,
                      aux_layer_ids=None, target_hidden_size=None, vocab_size=None) -> Path:
    """An EAGLE-3 head in the published layout (e.g. EAGLE3-LLaMA3.1-Instruct-8B): architecture
    LlamaForCausalLMEagle3, `fc` over 3 target hidden states, `midlayer.*` (attention over 2H),
    `norm`, `lm_head` over `draft_vocab_size` tokens, `d2t` / `t2d`."""
    t = _target_config(target_dir)
    h, vocab = t["hidden_size"], vocab_size or t["vocab_size"]
    draft_vocab = draft_vocab_size or vocab
    heads, kv_heads = t["num_attention_heads"], t["num_key_value_heads"]
    head_dim, inter = h // heads, t["intermediate_size"]
    g = torch.Generator().manual_seed(seed)
    tensors = _attention_mlp("midlayer", h, heads, kv_heads, head_dim, inter, 2 * h, std, g)
    tensors["midlayer.input_layernorm.weight"] = torch.ones(h)
    tensors["midlayer.hidden_norm.weight"] = torch.ones(h)
    tensors["fc.weight"] = torch.randn(h, 3 * (target_hidden_size or h), generator=g) * std
    tensors["norm.weight"] = torch.ones(h)
    tensors["lm_head.weight"] = torch.randn(draft_vocab, h, generator=g)
    draft_ids = torch.sort(torch.randperm(vocab, generator=g)[:draft_vocab]).values  # the tokens the head can propose
    tensors["d2t"] = draft_ids - torch.arange(draft_vocab)
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[draft_ids] = True
    tensors["t2d"] = t2d
    config = {
        "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": h,
        "intermediate_size": inter, "num_attention_heads": heads, "num_key_value_heads": kv_heads,
        "num_hidden_layers": 1, "vocab_size": vocab, "draft_vocab_size": draft_vocab,
        "max_position_embeddings": t["max_position_embeddings"], "rms_norm_eps": t["rms_norm_eps"],
        "rope_theta": t.get("rope_parameters", {}).get("rope_theta", t.get("rope_theta", 10000.0)),
        "torch_dtype": "float32", "hidden_act": "silu", "tie_word_embeddings": False,
    }
    if target_hidden_size:
        config["target_hidden_size"] = target_hidden_size
    if aux_layer_ids is not None:
        config["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": list(aux_layer_ids)}
    return _save(directory, config, tensors, fmt)
