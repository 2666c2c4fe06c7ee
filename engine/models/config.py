"""The fields of a Hugging Face Llama `config.json` that the engine uses, validated."""

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch

from engine.errors import CheckpointError

SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM",)
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


@dataclass(frozen=True)
class LlamaConfig:
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
    attention_bias: bool = False
    mlp_bias: bool = False
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


def load_llama_config(checkpoint_dir: Path, architectures: tuple[str, ...] = SUPPORTED_ARCHITECTURES) -> LlamaConfig:
    """Parse `config.json` (plus `generation_config.json` eos ids when present)."""
    path = checkpoint_dir / "config.json"
    raw = read_json(path)
    archs = raw.get("architectures") or ["LlamaForCausalLM"]
    if raw.get("model_type", "llama") != "llama" or not set(archs) & set(architectures):
        raise CheckpointError(
            f"{path}: unsupported architecture {archs} (model_type={raw.get('model_type')!r}); "
            f"supported: {list(architectures)} with model_type 'llama'"
        )
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
    return LlamaConfig(
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
        attention_bias=raw.get("attention_bias", False),
        mlp_bias=raw.get("mlp_bias", False),
        tie_word_embeddings=raw.get("tie_word_embeddings", False),
        torch_dtype=dtype,
        eos_token_ids=eos,
        bos_token_id=raw.get("bos_token_id"),
        extra=raw,
    )
