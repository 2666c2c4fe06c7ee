"""A GGUF file (llama.cpp's format) read as a Hugging Face checkpoint: its config, its tensors under
Hugging Face names, and the metadata its tokenizer is built from.

The file is read with ggml-org's `gguf` package (memory-mapped). llama.cpp's converter reorders the
rows of a Llama q / k projection for its RoPE (pairs of halves interleaved); `tensor` undoes that, so
every tensor comes back as transformers holds it. Blocks of Q4_0, Q4_1 and Q8_0 are decoded here
(their codes and scales are what the quantized layouts load); other GGML types are dequantized by the
`gguf` package.
"""

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from eyas.engine.errors import CheckpointError

# GGUF architecture -> (Hugging Face architecture, model_type, whether q / k rows were permuted for RoPE)
ARCHITECTURES = {
    "llama": ("LlamaForCausalLM", "llama", True),
    "qwen2": ("Qwen2ForCausalLM", "qwen2", False),
    "qwen3": ("Qwen3ForCausalLM", "qwen3", False),
}
# per-layer GGUF name -> Hugging Face name under model.layers.N.
LAYER_TENSORS = {
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
}
GLOBAL_TENSORS = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
BLOCK_TYPES = ("Q4_0", "Q4_1", "Q8_0")  # decoded to codes and scales here: the quantized layouts load them
FLOAT_TYPES = ("F32", "F16", "BF16")


@dataclass
class Blocks:
    """A quantized [out, in] matrix in groups of 32 input features: w = scale * code + offset, with
    `codes` [out, in] (int32: 0..15 for Q4, -128..127 for Q8), `scale` and `offset` [out, in / 32]; Q4_0's offset is -8 * scale
    (float32, exact copies of the file's float16 values)."""
    kind: str  # one of BLOCK_TYPES
    codes: torch.Tensor
    scale: torch.Tensor
    offset: torch.Tensor

    def dequantize(self) -> torch.Tensor:
        out, fan_in = self.codes.shape
        groups = self.codes.view(out, fan_in // 32, 32).float()
        if self.kind == "Q4_0":  # as llama.cpp and gguf compute it: scale * (code - 8)
            return (self.scale[..., None] * (groups - 8)).view(out, fan_in)
        return (groups * self.scale[..., None] + self.offset[..., None]).view(out, fan_in)


def _import_gguf():
    try:
        import gguf
    except ImportError as e:
        raise CheckpointError("reading a .gguf checkpoint needs the `gguf` package (an eyas dependency): "
                              "pip install gguf") from e
    return gguf


class GGUFFile:
    def __init__(self, path: str | Path):
        self.path = Path(path).expanduser()
        if not self.path.is_file():
            raise CheckpointError(f"model.path: GGUF file not found: {self.path}")
        gguf = _import_gguf()
        try:
            self._reader = gguf.GGUFReader(str(self.path))
        except (ValueError, OSError, IndexError, KeyError) as e:  # the reader's errors for a short or foreign file
            raise CheckpointError(f"model.path: cannot read {self.path} as GGUF ({type(e).__name__}: {e}); "
                                  f"a truncated download, or not a GGUF file?") from e
        self._tensors = {t.name: t for t in self._reader.tensors}
        end = max((t.data_offset + t.n_bytes for t in self._reader.tensors), default=0)
        if end > self.path.stat().st_size:
            raise CheckpointError(f"model.path: {self.path} is truncated: its tensors end at byte {end}, "
                                  f"the file has {self.path.stat().st_size}")
        self.architecture = self.field("general.architecture")
        if self.architecture not in ARCHITECTURES:
            raise CheckpointError(f"model.path: {self.path} holds a {self.architecture!r} model; supported GGUF "
                                  f"architectures: {list(ARCHITECTURES)}")

    def field(self, key: str, default=None):
        field = self._reader.fields.get(key)
        return default if field is None else field.contents()

    def arch_field(self, key: str, default=None):
        return self.field(f"{self.architecture}.{key}", default)

    def hf_config(self) -> dict:
        """The file's hyperparameters as a Hugging Face `config.json`."""
        hf_arch, model_type, _ = ARCHITECTURES[self.architecture]
        missing = [k for k in ("block_count", "embedding_length", "feed_forward_length", "attention.head_count")
                   if self.arch_field(k) is None]
        if missing:
            raise CheckpointError(f"model.path: {self.path} lacks the metadata "
                                  f"{[f'{self.architecture}.{k}' for k in missing]}")
        hidden = self.arch_field("embedding_length")
        heads = self.arch_field("attention.head_count")
        tokens = self.field("tokenizer.ggml.tokens")
        config = {
            "architectures": [hf_arch], "model_type": model_type,
            "vocab_size": self.arch_field("vocab_size") or (len(tokens) if tokens else
                                                            self._tensors["token_embd.weight"].shape[1]),
            "hidden_size": hidden, "intermediate_size": self.arch_field("feed_forward_length"),
            "num_hidden_layers": self.arch_field("block_count"), "num_attention_heads": heads,
            "num_key_value_heads": self.arch_field("attention.head_count_kv") or heads,
            "head_dim": self.arch_field("attention.key_length") or hidden // heads,
            "max_position_embeddings": self.arch_field("context_length", 2048),
            "rms_norm_eps": self.arch_field("attention.layer_norm_rms_epsilon", 1e-6),
            "rope_theta": self.arch_field("rope.freq_base", 10000.0),
            "hidden_act": "silu", "torch_dtype": "float32",
            "tie_word_embeddings": "output.weight" not in self._tensors,
            "bos_token_id": self.field("tokenizer.ggml.bos_token_id"),
            "eos_token_id": self.field("tokenizer.ggml.eos_token_id"),
        }
        scaling = self.arch_field("rope.scaling.type")
        if scaling not in (None, "none"):
            if scaling != "linear":
                raise CheckpointError(f"model.path: {self.path}: rope scaling {scaling!r} is not supported; "
                                      f"allowed: ['none', 'linear']")
            config["rope_scaling"] = {"rope_type": "linear", "factor": self.arch_field("rope.scaling.factor")}
        if model_type == "qwen2":
            config["use_sliding_window"] = False
        return config

    def hf_names(self) -> dict[str, str]:
        """Hugging Face tensor name -> GGUF tensor name, for every tensor of the file."""
        names = {}
        for gguf_name in self._tensors:
            stem, _, suffix = gguf_name.rpartition(".")
            parts = stem.split(".")
            if parts[0] == "blk" and len(parts) == 3 and parts[2] in LAYER_TENSORS:
                hf = f"model.layers.{parts[1]}.{LAYER_TENSORS[parts[2]]}"
            elif stem in GLOBAL_TENSORS:
                hf = GLOBAL_TENSORS[stem]
            elif stem == "rope_freqs":  # llama3's RoPE scaling, as per-frequency factors with no metadata key
                raise CheckpointError(f"model.path: {self.path} scales RoPE by per-frequency factors (tensor "
                                      f"'rope_freqs.weight', Llama 3.1+): not supported from GGUF; load the "
                                      f"Hugging Face checkpoint instead (rope_scaling llama3 is supported there)")
            else:
                raise CheckpointError(f"model.path: {self.path}: unexpected tensor {gguf_name!r} for a "
                                      f"{self.architecture!r} model")
            names[f"{hf}.{suffix}"] = gguf_name
        return names

    def type_name(self, gguf_name: str) -> str:
        return self._tensors[gguf_name].tensor_type.name

    def _raw(self, gguf_name: str) -> tuple[np.ndarray, str]:
        info = self._tensors[gguf_name]
        return info.data, info.tensor_type.name

    def _unpermute(self, gguf_name: str, rows: torch.Tensor) -> torch.Tensor:
        """Undo llama.cpp's RoPE row order of a Llama q / k projection (rows [out, ...])."""
        if not ARCHITECTURES[self.architecture][2]:
            return rows
        kind = gguf_name.split(".")[-2]
        if kind not in ("attn_q", "attn_k"):
            return rows
        heads = self.arch_field("attention.head_count") if kind == "attn_q" else \
            (self.arch_field("attention.head_count_kv") or self.arch_field("attention.head_count"))
        shape = rows.shape
        return rows.reshape(heads, shape[0] // heads // 2, 2, *shape[1:]).transpose(1, 2).reshape(shape)

    def blocks(self, gguf_name: str) -> Blocks:
        """A Q4_0 / Q4_1 / Q8_0 matrix's codes and scales, rows in Hugging Face order."""
        data, kind = self._raw(gguf_name)
        if kind not in BLOCK_TYPES:
            raise ValueError(f"{gguf_name} is {kind}, not one of {BLOCK_TYPES}")
        rows = data.shape[0]
        raw = torch.from_numpy(np.array(data))  # [out, bytes per row] uint8, copied out of the map
        block_bytes = 34 if kind == "Q8_0" else (18 if kind == "Q4_0" else 20)
        blocks = raw.view(rows, -1, block_bytes)
        head = 4 if kind == "Q4_1" else 2
        halves = blocks[..., :head].contiguous().view(torch.float16).float()  # [out, groups, 1 or 2]
        scale = halves[..., 0]
        payload = blocks[..., head:]
        if kind == "Q8_0":
            codes = payload.contiguous().view(torch.int8).to(torch.int32)
            offset = torch.zeros_like(scale)
        else:  # byte j holds element j (low nibble) and element j + 16 (high nibble)
            codes = torch.cat((payload & 0x0F, payload >> 4), dim=-1).to(torch.int32)
            offset = halves[..., 1] if kind == "Q4_1" else -8 * scale
        codes = codes.reshape(rows, -1)
        return Blocks(kind, self._unpermute(gguf_name, codes), self._unpermute(gguf_name, scale),
                      self._unpermute(gguf_name, offset))

    def tensor(self, gguf_name: str) -> torch.Tensor:
        """The tensor dequantized to float32 (F16 / BF16 / F32 exactly), in Hugging Face's shape and row order."""
        data, kind = self._raw(gguf_name)
        if kind in BLOCK_TYPES:
            return self.blocks(gguf_name).dequantize()
        if kind == "F32":
            tensor = torch.from_numpy(np.array(data, dtype=np.float32))
        elif kind == "F16":
            tensor = torch.from_numpy(np.array(data, dtype=np.float16)).float()
        elif kind == "BF16":
            tensor = torch.from_numpy(np.array(data)).view(torch.bfloat16).float()
        else:
            gguf = _import_gguf()
            try:
                tensor = torch.from_numpy(np.array(gguf.quants.dequantize(data, self._tensors[gguf_name].tensor_type),
                                                   dtype=np.float32))
            except NotImplementedError as e:
                raise CheckpointError(f"model.path: {self.path}: tensor {gguf_name!r} has GGML type {kind}, "
                                      f"which cannot be dequantized here; supported: F32, F16, BF16, Q4_0, Q4_1, Q8_0 "
                                      f"and the types the gguf package dequantizes") from e
        shape = tuple(reversed([int(d) for d in self._tensors[gguf_name].shape]))  # GGUF lists dims innermost first
        return self._unpermute(gguf_name, tensor.reshape(shape))

    def quantized_blocks(self) -> dict[str, Blocks]:
        """Every Q4_0 / Q4_1 / Q8_0 matrix's blocks under its Hugging Face name."""
        return {hf: self.blocks(name) for hf, name in self.hf_names().items() if self.type_name(name) in BLOCK_TYPES}

    def tensors(self) -> dict[str, torch.Tensor]:
        """Every tensor under its Hugging Face name, dequantized to float32."""
        return {hf: self.tensor(name) for hf, name in self.hf_names().items()}
