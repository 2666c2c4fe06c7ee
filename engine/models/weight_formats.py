"""Weights stored in fewer bytes than the model's dtype, each with the PyTorch CPU kernel that reads them.

At real model sizes a decode step is bound by the bytes of weight it reads, so these are what make a
CPU decode fast. Each kernel takes `x` [N, in] in the model's dtype and returns [N, out] in it, and
is row-invariant: a row's output does not depend on the other rows of the call, so a verify over
k + 1 tokens computes each position exactly as a one-token decode does (speculation stays lossless
against plain decoding of the same quantized model).

- `Int8Weights` (`model.quantization=int8`): per-output-channel symmetric int8 weights; activations
  quantized per token at run time (7-bit, zero point at mid-range); int32 accumulation in fbgemm's
  s8 GEMM (`quantized::linear_dynamic`), as CTranslate2's int8 runs. fbgemm quantizes its input per
  tensor, so each row is first scaled to absolute maximum 1 and two constant columns (+1, -1, against
  zero weights) pin the tensor's range: every row then gets the same fixed quantization, and the row's
  scale multiplies the output back. The 7-bit range is what keeps fbgemm's u8 x s8 pair sums inside
  int16 on CPUs without VNNI (8 bits saturate there).
- `Int4Weights` (`model.quantization=int4`): 4-bit weights in groups of `group_size` input features,
  each group with a bf16 scale and zero point; aten's `_weight_int4pack_mm_for_cpu`, which takes bf16
  activations (the input is rounded to bf16 for this GEMM).
- `model.quantization=gguf` / `gguf_f32` keep a GGUF file's Q4_0 / Q4_1 / Q8_0 blocks as the file stores
  them (`gguf_block_weights`): no second rounding; int8 activations as llama.cpp's, or float32 ones (the
  dequantized model's bits).
- `model.quantization=q8_0` / `draft.quantization=q8_0` round any checkpoint's projections into Q8_0 blocks
  (`gguf_block_weights.round_to_q8_0`: int8 codes per group of 32 input features, a float16 scale of the
  group's absolute maximum / 127, as llama.cpp's Q8_0) and run them as `gguf` runs a file's Q8_0: a
  quarter of float32's bytes, for a draft head read every draft step or a checkpoint that is no GGUF file.
- `Fp16Weights` (the `auto` weight layout of a bfloat16 or float16 model on CPU): the weights held in
  float16, fbgemm's fp16 GEMM with float32 activations and accumulation (its row counts padded so that
  it is row-invariant too). CPUs without native bf16 dot
  products (AVX2) run a bf16 GEMM of more than one row compute-bound, converting every weight once
  per row; fbgemm converts each weight once per call. A bf16 weight is exact in float16 within
  float16's normal range (bf16 carries 8 significant bits, float16 11); below 2**-14 it keeps an
  absolute error under 2**-25, and a weight beyond float16's range keeps the dense bf16 kernel.
"""

import warnings
from dataclasses import dataclass

import torch

from eyas.engine.cpu_ops import cpu_ops_error
from eyas.engine.errors import ConfigError
from eyas.engine.models.packed_ops import register_packed

# model.quantization: auto (a GGUF file's own blocks, gguf, where eyas's CPU kernels run; none for anything
# else), none, int8 (per-channel int8 weights, activations quantized per token: fbgemm), int4 (4-bit weights
# in groups of quantization_group_size input features: aten int4pack), gguf (a GGUF file's own Q4_0 / Q4_1 /
# Q8_0 blocks, int8 activations as llama.cpp's: eyas's CPU kernel), gguf_f32 (the same blocks with float32
# activations: the dequantized model's logits, bit for bit), q8_0 (any checkpoint's weights rounded here into
# llama.cpp's Q8_0 blocks, int8 per group of 32 input features with a float16 scale, run as gguf runs them)
SCHEMES = ("auto", "none", "int8", "int4", "gguf", "gguf_f32", "q8_0")
GGUF_SCHEMES = ("gguf", "gguf_f32")  # a GGUF file's own blocks: int8 or float32 activations
INT4_GROUP_SIZES = (32, 64, 128, 256)
FP16_MAX = 65504.0


@dataclass(frozen=True)
class Quantization:
    """What `FusedLinear.pack` stores a projection as: `scheme` one of SCHEMES; `group_size` for int4;
    `fallback` for gguf: the float layout of a projection the file does not store in blocks its kernel reads."""
    scheme: str
    group_size: int = 128
    fallback: str = "linear"


def fbgemm_available() -> bool:
    return "fbgemm" in torch.backends.quantized.supported_engines


def resolve_quantization(scheme: str, gguf_file: bool, device: torch.device) -> str:
    """`auto` -> the scheme a checkpoint runs in: a GGUF file keeps its own blocks (gguf) on a CPU that
    builds eyas's kernels; anything else (a Hugging Face directory, a GPU) is none. Others pass through."""
    if scheme != "auto":
        return scheme
    return "gguf" if gguf_file and device.type == "cpu" and cpu_ops_error() is None else "none"


def resolve_head_quantization(scheme: str, device: torch.device) -> str:
    """`auto` for an EAGLE head (no GGUF file) -> q8_0 on a CPU that builds eyas's kernels (a head is read at
    every draft step: a quarter of float32's bytes, its acceptance unchanged on SmolLM2), else none."""
    if scheme != "auto":
        return scheme
    return "q8_0" if torch.device(device).type == "cpu" and cpu_ops_error() is None else "none"


def check_quantization(scheme: str, group_size: int, device: torch.device, field: str = "model") -> None:
    """Raise a ConfigError naming `{field}.quantization` / `{field}.quantization_group_size` when the
    setting cannot run here."""
    if scheme not in SCHEMES:
        raise ConfigError(f"{field}.quantization must be one of {list(SCHEMES)}, got {scheme!r}")
    if scheme in ("auto", "none"):
        return
    if device.type != "cpu":
        raise ConfigError(f"{field}.quantization={scheme} runs on CPU only (its kernels are PyTorch's CPU "
                          f"kernels); device is {device.type}: set {field}.quantization=none")
    if scheme in GGUF_SCHEMES or scheme == "q8_0":
        error = cpu_ops_error()
        if error is not None:
            raise ConfigError(f"{field}.quantization={scheme} runs on eyas's C++ CPU kernels, which cannot be built "
                              f"here ({error}): set {field}.quantization=none")
    if scheme == "int8" and not fbgemm_available():
        raise ConfigError(f"{field}.quantization=int8 needs PyTorch's fbgemm engine, which this build lacks "
                          f"(engines: {torch.backends.quantized.supported_engines})")
    if scheme == "int4" and group_size not in INT4_GROUP_SIZES:
        raise ConfigError(f"{field}.quantization_group_size must be one of {list(INT4_GROUP_SIZES)} for int4, "
                          f"got {group_size!r}")


def check_int4_shapes(shapes: dict[str, tuple[int, int]], group_size: int, field: str = "model") -> None:
    """Every projection (name -> (in, out)) must split into whole groups and pack in rows of 16."""
    for name, (fan_in, fan_out) in shapes.items():
        if fan_in % group_size:
            divisors = [g for g in INT4_GROUP_SIZES if all(s[0] % g == 0 for s in shapes.values())]
            raise ConfigError(f"{field}.quantization_group_size={group_size} does not divide the {name} projection's "
                              f"{fan_in} input features; group sizes that fit this model: {divisors or 'none'}")
        if fan_out % 16:
            raise ConfigError(f"{field}.quantization=int4 needs every projection's output width to be a multiple "
                              f"of 16; the {name} projection's is {fan_out} (use {field}.quantization=int8)")


class Int8Weights:
    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None):
        # weight: [out, in] float -> per-channel int8 packed for fbgemm, with two zero input columns
        out_features, in_features = weight.shape
        weight = weight.float()
        scale = (weight.abs().amax(dim=1) / 127).clamp_(min=1e-12)  # [out]
        padded = torch.cat((weight, weight.new_zeros(out_features, 2)), dim=1)
        with warnings.catch_warnings():  # quantized tensors are deprecated; fbgemm's prepack still takes one
            warnings.simplefilter("ignore", UserWarning)
            qweight = torch.quantize_per_channel(padded, scale.double(), torch.zeros(out_features, dtype=torch.long),
                                                 0, torch.qint8)
        self.packed = torch.ops.quantized.linear_prepack(qweight, None)
        self.handle = register_packed(self, self.packed)
        self.bias = None if bias is None else bias.float()
        self.pins = torch.tensor([[1.0, -1.0]])  # [1, 2]: the row range every call quantizes against
        self.out_features = out_features

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        dtype, x = x.dtype, x.float()
        row_max = x.abs().amax(dim=1, keepdim=True).clamp_(min=1e-30)  # [N, 1]
        pinned = torch.cat((x / row_max, self.pins.expand(x.shape[0], 2)), dim=1)  # [N, in + 2]
        if torch.compiler.is_compiling():
            out = torch.ops.eyas.fbgemm_int8_linear(pinned, self.handle, self.out_features)
        else:
            out = torch.ops.quantized.linear_dynamic(pinned, self.packed, True)  # 7-bit activations
        out = out * row_max
        if self.bias is not None:
            out = out.add_(self.bias)
        return out if dtype == torch.float32 else out.to(dtype)


class Int4Weights:
    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, group_size: int):
        # weight: [out, in] -> 4-bit codes packed by aten, asymmetric per group of `group_size` inputs
        out_features, in_features = weight.shape
        groups = weight.float().view(out_features, in_features // group_size, group_size)
        low, high = groups.amin(dim=-1, keepdim=True), groups.amax(dim=-1, keepdim=True)
        scale = ((high - low) / 15).clamp_(min=1e-12)
        codes = torch.round((groups - low) / scale).clamp_(0, 15).to(torch.int32).view(out_features, in_features)
        zero = low + 8 * scale  # aten's convention: w = (code - 8) * scale + zero
        # [in / group, out, 2]: (scale, zero) per group and output channel
        self.scales_and_zeros = torch.stack((scale, zero), dim=-1).view(out_features, -1, 2).transpose(0, 1) \
            .contiguous().to(torch.bfloat16)
        self.packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes, 1)
        self.bias = bias
        self.group_size = group_size

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.ops.aten._weight_int4pack_mm_for_cpu(x.to(torch.bfloat16), self.packed, self.group_size,
                                                          self.scales_and_zeros).to(x.dtype)
        return out if self.bias is None else out.add_(self.bias)


class Fp16Weights:
    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None):
        # weight: [out, in] half precision -> fbgemm's packed float16 layout (bias added in the GEMM)
        self.packed = torch.ops.quantized.linear_prepack_fp16(weight.float(), None if bias is None else bias.float())
        self.handle = register_packed(self, self.packed)
        self.out_features = weight.shape[0]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if torch.compiler.is_compiling():
            out = torch.ops.eyas.fbgemm_fp16_linear(x.float(), self.handle, self.out_features)
        else:
            rows, inputs = x.shape[0], x.float()
            padded = _row_invariant_count(rows)
            if padded != rows:
                inputs = torch.cat((inputs, inputs.new_zeros(padded - rows, inputs.shape[1])))
            out = torch.ops.quantized.linear_dynamic_fp16(inputs, self.packed)[:rows]
        return out if x.dtype == torch.float32 else out.to(x.dtype)


def _row_invariant_count(rows: int) -> int:
    """The row count to run fbgemm's float16 GEMM at so that each row's bits match a lone row's:
    its micro-kernels for remainder blocks of 1 or 2 rows (in calls of 1, 2, 6k + 1 or 6k + 2 rows)
    sum in another order, so such calls get zero rows added (measured on 1..300 rows; a decode's 3
    rows read the weights once, as 1 does)."""
    if rows <= 2:
        return 3
    return rows + 6 - rows % 6 if rows > 6 and rows % 6 in (1, 2) else rows


def fp16_fits(weight: torch.Tensor) -> bool:
    """Whether fbgemm's float16 weights can hold `weight` (a bf16 weight beyond float16's range cannot)."""
    return fbgemm_available() and weight.device.type == "cpu" and bool(weight.abs().max() <= FP16_MAX)


def compressed_weights(weight: torch.Tensor, bias: torch.Tensor | None, fmt: "Quantization | str"):
    """The kernel object for `weight` [out, in] stored as `fmt` (a Quantization, or "fp16")."""
    if fmt == "fp16":
        return Fp16Weights(weight, bias)
    if fmt.scheme == "int8":
        return Int8Weights(weight, bias)
    if fmt.scheme == "int4":
        return Int4Weights(weight, bias, fmt.group_size)
    raise ValueError(f"no compressed format {fmt!r}")

