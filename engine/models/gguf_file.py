"""A GGUF file (llama.cpp's format) read as a Hugging Face checkpoint: its config, its tensors under
Hugging Face names, and the metadata its tokenizer is built from.

The header (metadata and tensor table) is read here, with the `gguf` package's format tables (ggml-org's
Python package): its own reader builds a numpy view per string of the tokenizer's arrays, 3 s for
SmolLM2's 98,000 strings at every start, where one pass over the bytes takes a tenth of that. Tensor
data stays memory-mapped. llama.cpp's converter reorders the rows of a Llama q / k projection for its RoPE
(pairs of halves interleaved); `tensor` undoes that, so every tensor comes back as transformers holds it.
Blocks of Q4_0, Q4_1 and Q8_0 are decoded here (their codes and scales are what the quantized layouts
load); other GGML types are dequantized by the `gguf` package.
"""

import struct
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


@dataclass
class TensorInfo:
    """One entry of the file's tensor table; `data` views the mapped file as the `gguf` package's reader
    does: float and integer types as their numpy dtype in numpy's dim order, block types as bytes [..., row bytes]."""
    name: str
    tensor_type: object  # gguf.GGMLQuantizationType
    shape: tuple[int, ...]  # GGUF's order: innermost dimension first
    data_offset: int  # from the start of the file
    n_bytes: int
    data: np.ndarray | None = None


# GGUF value type -> struct format of a scalar (8: string, 9: array)
SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
NUMPY_TYPES = {"F32": np.float32, "F16": np.float16, "F64": np.float64, "I8": np.int8, "I16": np.int16,
               "I32": np.int32, "I64": np.int64}
GGUF_MAGIC = b"GGUF"


class HeaderReader:
    """Reads a little-endian GGUF header (versions 2 and 3) from bytes; struct.error past their end."""

    def __init__(self, buffer):
        self.buffer = buffer
        self.at = 0

    def scalar(self, fmt: str):
        (value,) = struct.unpack_from("<" + fmt, self.buffer, self.at)
        self.at += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        size = self.scalar("Q")
        if self.at + size > len(self.buffer):
            raise struct.error(f"a string of {size} bytes runs past the end")
        self.at += size
        return bytes(self.buffer[self.at - size:self.at]).decode("utf-8", errors="replace")

    def value(self, kind: int):
        if kind == 8:
            return self.string()
        if kind == 9:
            item, count = self.scalar("I"), self.scalar("Q")
            if item == 8:
                return [self.string() for _ in range(count)]
            if item not in SCALARS:
                raise ValueError(f"array of value type {item}")
            fmt = SCALARS[item]
            values = struct.unpack_from(f"<{count}{fmt}", self.buffer, self.at)
            self.at += count * struct.calcsize(fmt)
            return list(values)
        if kind not in SCALARS:
            raise ValueError(f"value type {kind}")
        return self.scalar(SCALARS[kind])


def read_header(mapped: np.ndarray) -> tuple[dict, list[TensorInfo]]:
    """The metadata (key -> value: scalars, strings and lists as the `gguf` reader's `contents()` gives
    them) and the tensor table (data views included) of a mapped GGUF file."""
    gguf = _import_gguf()
    buffer = memoryview(mapped)
    if bytes(buffer[:4]) != GGUF_MAGIC:
        raise ValueError("GGUF magic invalid")
    reader = HeaderReader(buffer)
    reader.at = 4
    version = reader.scalar("I")
    if version not in (2, 3):
        raise ValueError(f"GGUF version {version} (big-endian, or not supported: 2 and 3 are)")
    tensor_count, kv_count = reader.scalar("Q"), reader.scalar("Q")
    fields = {}
    for _ in range(kv_count):
        key = reader.string()
        fields[key] = reader.value(reader.scalar("I"))
    table = []
    for _ in range(tensor_count):
        name = reader.string()
        dims = tuple(reader.scalar("Q") for _ in range(reader.scalar("I")))
        table.append((name, dims, gguf.GGMLQuantizationType(reader.scalar("I")), reader.scalar("Q")))
    alignment = int(fields.get("general.alignment", gguf.GGUF_DEFAULT_ALIGNMENT))
    start = -(-reader.at // alignment) * alignment
    tensors = []
    for name, dims, kind, offset in table:
        elements = int(np.prod(dims, dtype=np.int64))
        block, block_bytes = gguf.GGML_QUANT_SIZES[kind]
        info = TensorInfo(name, kind, dims, start + offset, elements * block_bytes // block)
        if info.data_offset + info.n_bytes <= len(mapped):
            numpy_dims = tuple(reversed(dims))
            if kind.name in NUMPY_TYPES:
                info.data = mapped[info.data_offset:info.data_offset + info.n_bytes].view(NUMPY_TYPES[kind.name])
            else:
                info.data = mapped[info.data_offset:info.data_offset + info.n_bytes]
                numpy_dims = gguf.quant_shape_to_byte_shape(numpy_dims, kind)
            info.data = info.data.reshape(numpy_dims)
        tensors.append(info)
    return fields, tensors


class GGUFFile:
    def __init__(self, path: str | Path):
        self.path = Path(path).expanduser()
        if not self.path.is_file():
            raise CheckpointError(f"model.path: GGUF file not found: {self.path}")
        try:
            mapped = np.memmap(self.path, mode="r")
            self._fields, tensors = read_header(mapped)
        except (ValueError, OSError, IndexError, KeyError, struct.error, UnicodeDecodeError) as e:  # short or foreign
            raise CheckpointError(f"model.path: cannot read {self.path} as GGUF ({type(e).__name__}: {e}); "
                                  f"a truncated download, or not a GGUF file?") from e
        self._tensors = {t.name: t for t in tensors}
        self._decoded: dict[str, Blocks] = {}
        end = max((t.data_offset + t.n_bytes for t in tensors), default=0)
        if end > self.path.stat().st_size:
            raise CheckpointError(f"model.path: {self.path} is truncated: its tensors end at byte {end}, "
                                  f"the file has {self.path.stat().st_size}")
        self.architecture = self.field("general.architecture")
        if self.architecture not in ARCHITECTURES:
            raise CheckpointError(f"model.path: {self.path} holds a {self.architecture!r} model; supported GGUF "
                                  f"architectures: {list(ARCHITECTURES)}")

    def field(self, key: str, default=None):
        return self._fields.get(key, default)

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
        """A Q4_0 / Q4_1 / Q8_0 matrix's codes and scales, rows in Hugging Face order (decoded once: the
        float tensors and the quantized layouts of one load share them)."""
        if gguf_name not in self._decoded:
            self._decoded[gguf_name] = self._decode_blocks(gguf_name)
        return self._decoded[gguf_name]

    def _decode_blocks(self, gguf_name: str) -> Blocks:
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
