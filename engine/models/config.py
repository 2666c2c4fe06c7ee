"""The fields of a Hugging Face decoder `config.json` that the engine uses, validated.

Llama, Mistral, Qwen2 and Qwen3 share one decoder (`engine/models/llama.py`); a `Family` says what sets
each apart: which projections carry a bias, whether q and k are RMS-normed per head before RoPE, and
where sliding-window attention can come from.
"""

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from eyas.engine.errors import CheckpointError


@dataclass(frozen=True)
class Family:
    model_type: str
    # config.json -> (qkv_bias, o_bias, mlp_bias)
    biases: Callable[[dict], tuple[bool, bool, bool]]
    qk_norm: bool = False
    # config.json -> the window some layer attends within, or None when every layer attends over all
    sliding_window: Callable[[dict], int | None] = lambda raw: None


def _llama_biases(raw: dict) -> tuple[bool, bool, bool]:
    bias = bool(raw.get("attention_bias", False))
    return bias, bias, bool(raw.get("mlp_bias", False))


def _qwen_window(raw: dict) -> int | None:
    """Qwen2 / Qwen3: layers from `max_window_layers` on (or those `layer_types` marks) slide, and only
    when `use_sliding_window` is set."""
    window = raw.get("sliding_window")
    if not raw.get("use_sliding_window") or not window:
        return None
    layer_types = raw.get("layer_types")
    if layer_types is None:
        sliding = raw.get("num_hidden_layers", 0) > raw.get("max_window_layers", 28)  # transformers' default
    else:
        sliding = "sliding_attention" in layer_types
    return window if sliding else None


LLAMA = Family("llama", _llama_biases)
FAMILIES = {
    "LlamaForCausalLM": LLAMA,
    "MistralForCausalLM": Family("mistral", lambda raw: (False, False, False),
                                 sliding_window=lambda raw: raw.get("sliding_window") or None),
    "Qwen2ForCausalLM": Family("qwen2", lambda raw: (True, False, False), sliding_window=_qwen_window),
    "Qwen3ForCausalLM": Family("qwen3", lambda raw: _llama_biases(raw)[:2] + (False,), qk_norm=True,
                               sliding_window=_qwen_window),
}
SUPPORTED_ARCHITECTURES = tuple(FAMILIES)
SUPPORTED_ACTIVATIONS = ("silu",)
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    max_position_embeddings: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None
    architecture: str = "LlamaForCausalLM"
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False  # Qwen3: per-head RMSNorm of q and k before RoPE
    sliding_window: int | None = None  # some layers attend only to the last `sliding_window` positions
    tie_word_embeddings: bool = False
    torch_dtype: str = "float32"
    eos_token_ids: tuple[int, ...] = ()
    bos_token_id: int | None = None
    extra: dict = field(default_factory=dict, compare=False, repr=False)

    @property
    def rope_type(self) -> str:
        if not self.rope_scaling:
            return "default"
        return self.rope_scaling.get("rope_type", self.rope_scaling.get("type", "default"))


def _eos_ids(value) -> tuple[int, ...]:
    if value is None:
        return ()
    if isinstance(value, int):
        return (value,)
    return tuple(int(v) for v in value)


def _rope(raw: dict) -> tuple[float, dict | None]:
    """(rope_theta, rope_scaling) from either layout: `rope_theta` + `rope_scaling`, or the newer
    `rope_parameters` that holds both."""
    params = raw.get("rope_parameters")
    if params:
        theta = params.get("rope_theta", raw.get("rope_theta", 10000.0))
        scaling = {k: v for k, v in params.items() if k != "rope_theta"}
        return theta, (scaling if scaling.get("rope_type", "default") != "default" else None)
    return raw.get("rope_theta", 10000.0), raw.get("rope_scaling")


def read_json(path: Path) -> dict:
    if not path.is_file():
        raise CheckpointError(f"missing file: {path}")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{path} is not valid JSON: {e}") from e


def _architecture(path: Path, raw: dict, families: dict[str, Family]) -> str:
    """The first of `architectures` that `families` knows (by `model_type` when the list is absent);
    its `model_type` must agree."""
    archs = raw.get("architectures")
    model_type = raw.get("model_type")
    if not archs:
        archs = [name for name, family in families.items() if family.model_type == (model_type or "llama")][:1]
    known = [name for name in archs if name in families]
    if not known or (model_type is not None and families[known[0]].model_type != model_type):
        supported = [f"{name} (model_type {family.model_type!r})" for name, family in families.items()]
        raise CheckpointError(f"{path}: unsupported architecture {archs} (model_type={model_type!r}); "
                              f"supported: {', '.join(supported)}")
    return known[0]


def load_model_config(checkpoint_dir: Path, families: dict[str, Family] = FAMILIES) -> ModelConfig:
    """Parse `config.json` (plus `generation_config.json` eos ids when present)."""
    path = checkpoint_dir / "config.json"
    raw = read_json(path)
    architecture = _architecture(path, raw, families)
    family = families[architecture]
    activation = raw.get("hidden_act", "silu")
    if activation not in SUPPORTED_ACTIVATIONS:
        raise CheckpointError(f"{path}: hidden_act {activation!r} is not supported; allowed: {list(SUPPORTED_ACTIVATIONS)}")
    required = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")
    missing = [k for k in required if k not in raw]
    if missing:
        raise CheckpointError(f"{path}: missing fields {missing}")
    num_heads = raw["num_attention_heads"]
    num_kv_heads = raw.get("num_key_value_heads") or num_heads
    if num_heads % num_kv_heads:
        raise CheckpointError(
            f"{path}: num_attention_heads ({num_heads}) must be a multiple of num_key_value_heads ({num_kv_heads})"
        )
    head_dim = raw.get("head_dim") or raw["hidden_size"] // num_heads
    rope_theta, rope_scaling = _rope(raw)
    if rope_scaling:
        rope_type = rope_scaling.get("rope_type", rope_scaling.get("type", "default"))
        if rope_type not in SUPPORTED_ROPE_TYPES:
            raise CheckpointError(
                f"{path}: rope_scaling.rope_type {rope_type!r} is not supported; allowed: {list(SUPPORTED_ROPE_TYPES)}"
            )
    dtype = raw.get("torch_dtype") or raw.get("dtype") or "float32"
    if dtype not in DTYPES:
        raise CheckpointError(f"{path}: torch_dtype {dtype!r} is not supported; allowed: {list(DTYPES)}")
    eos = _eos_ids(raw.get("eos_token_id"))
    gen_path = checkpoint_dir / "generation_config.json"
    if gen_path.is_file():
        eos = tuple(dict.fromkeys(eos + _eos_ids(read_json(gen_path).get("eos_token_id"))))
    qkv_bias, o_bias, mlp_bias = family.biases(raw)
    return ModelConfig(
        vocab_size=raw["vocab_size"],
        hidden_size=raw["hidden_size"],
        intermediate_size=raw["intermediate_size"],
        num_hidden_layers=raw["num_hidden_layers"],
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        head_dim=head_dim,
        max_position_embeddings=raw.get("max_position_embeddings", 2048),
        rms_norm_eps=raw.get("rms_norm_eps", 1e-6),
        rope_theta=rope_theta,
        rope_scaling=rope_scaling,
        architecture=architecture,
        qkv_bias=qkv_bias,
        o_bias=o_bias,
        mlp_bias=mlp_bias,
        qk_norm=family.qk_norm,
        sliding_window=family.sliding_window(raw),
        tie_word_embeddings=raw.get("tie_word_embeddings", False),
        torch_dtype=dtype,
        eos_token_ids=eos,
        bos_token_id=raw.get("bos_token_id"),
        extra=raw,
    )
