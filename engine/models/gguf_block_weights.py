"""A GGUF file's Q4_0 / Q4_1 / Q8_0 weights kept as the file holds them (`model.quantization=gguf` or
`gguf_f32`), and any checkpoint's weights rounded into Q8_0 blocks (`quantization=q8_0`).

Why: the file's blocks are the model its users run (llama.cpp reads them as they are); re-quantizing
them into another 4-bit format would round every weight a second time, and dequantizing them to
float32 makes a decode step read 6 to 7x more bytes. Both kernels read the codes with their float16
scales (4.5 to 8.5 bits a weight) and compute a row alike alone or in any batch:

- `gguf` (`kernels/cpu_int8_dot_gemm.cpp`): each row of x is quantized to int8 per group of 32, as
  llama.cpp multiplies these types, and a group is one integer dot product (AVX-512 VNNI).
- `gguf_f32` (`kernels/cpu_quant_gemm.cpp`): each weight is decoded to float32 exactly and summed as
  the blocked float32 GEMM sums: the same bits as `model.quantization=none` with
  `model.weight_layout=blocked` on the same file, at float32's compute.

A projection whose members are stored in another type (or mix 4- and 8-bit blocks) is dequantized and
takes the float layout the model would take otherwise.

The loader hands each `nn.Linear` its file blocks (`attach`), `FusedLinear.pack` packs a group's
blocks as one weight (`from_linears`) and releases them.
"""

import torch
from torch import nn

from eyas.engine.models.gguf_file import Blocks
from eyas.kernels import cpu_int8_dot_gemm, cpu_quant_gemm

ATTRIBUTE = "gguf_blocks"  # where an nn.Linear holds its file blocks until it is packed


def attach(linear: nn.Linear, blocks: Blocks) -> None:
    setattr(linear, ATTRIBUTE, blocks)


def round_to_q8_0(weight: torch.Tensor) -> Blocks:
    """weight [out, in] (in a multiple of 32) as llama.cpp's Q8_0 rounds it: per group of 32 input features a
    float16 scale d = max|w| / 127 and codes round(w / d) in [-127, 127] (an all-zero group: d = 0)."""
    out, fan_in = weight.shape
    groups = weight.detach().float().reshape(out, fan_in // 32, 32)
    scale = (groups.abs().amax(dim=-1) / 127).half().float()  # [out, in / 32], exact float16 values
    inverse = torch.where(scale > 0, 1 / scale, torch.zeros_like(scale))
    codes = (groups * inverse[..., None]).round().clamp(-127, 127).to(torch.int32).reshape(out, fan_in)
    return Blocks("Q8_0", codes, scale, torch.zeros_like(scale))


def attach_rounded_q8_0(model: nn.Module) -> None:
    """Hand every projection whose input splits into groups of 32 its weight rounded to Q8_0 blocks
    (`quantization=q8_0`); the rest keep the float layout."""
    for module in model.modules():
        if isinstance(module, nn.Linear) and module.in_features % 32 == 0 and module.weight.device.type != "meta":
            attach(module, round_to_q8_0(module.weight))


def offsets(blocks: Blocks, int8_activations: bool) -> torch.Tensor:
    """The per-group offsets the kernel adds: Q8_0 has none, but its codes are stored plus 128 for the
    integer dot product, which -128 * scale takes back."""
    return -128 * blocks.scale if int8_activations and blocks.kind == "Q8_0" else blocks.offset


def take_blocks(linears: list[nn.Linear], int8_activations: bool) -> list[Blocks] | None:
    """The members' file blocks, removed from them, when all have blocks of one width that the kernel
    holds exactly (float16 offsets); None otherwise."""
    blocks = [getattr(linear, ATTRIBUTE, None) for linear in linears]
    for linear in linears:
        if hasattr(linear, ATTRIBUTE):
            delattr(linear, ATTRIBUTE)
    if any(b is None for b in blocks) or len({b.kind == "Q8_0" for b in blocks}) != 1:
        return None
    if any(not torch.equal(offsets(b, int8_activations).half().float(), offsets(b, int8_activations))
           for b in blocks):  # Q4_0's -8 * scale (Q8_0's -128 * scale) beyond float16
        return None
    return blocks


class GgufBlockWeights:
    def __init__(self, blocks: list[Blocks], bias: torch.Tensor | None, int8_activations: bool):
        # blocks: the fused members' [out_i, in] blocks, stacked along the outputs
        self.bits = 8 if blocks[0].kind == "Q8_0" else 4
        self.int8_activations = int8_activations
        codes = torch.cat([b.codes for b in blocks])
        packer = cpu_int8_dot_gemm if int8_activations else cpu_quant_gemm
        self.codes = packer.pack_codes(codes, self.bits)
        self.scales = cpu_quant_gemm.pack_params(torch.cat([b.scale for b in blocks]))
        self.offsets = None if self.bits == 8 and not int8_activations else \
            cpu_quant_gemm.pack_params(torch.cat([offsets(b, int8_activations) for b in blocks]))
        self.bias = None if bias is None else bias.detach().float().contiguous()
        self.out_features = codes.shape[0]

    def __call__(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        """x: [N, in] -> [N, out] (+ residual [N, out]); a half-precision x is computed in float32."""
        if x.dtype == torch.float32 and (residual is None or residual.dtype == torch.float32):
            return self._gemm(x, residual)
        out = self._gemm(x.float(), None).to(x.dtype)
        return out if residual is None else out.add_(residual)

    def _gemm(self, x: torch.Tensor, residual: torch.Tensor | None) -> torch.Tensor:
        if self.int8_activations:
            return cpu_int8_dot_gemm.int8_dot_linear(x, self.codes, self.scales, self.offsets, self.bits,
                                                     self.out_features, self.bias, residual)
        return cpu_quant_gemm.quant_block_linear(x, self.codes, self.scales, self.offsets, self.out_features,
                                                 self.bias, residual)
