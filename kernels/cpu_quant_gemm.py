"""Small-batch GEMM over a GGUF file's Q4_0 / Q4_1 / Q8_0 blocks, decoded as they are read (`cpu_quant_gemm.cpp`).

Why: a decode step reads every weight once; at 4.5 to 8.5 bits a weight instead of 32 it reads 4 to 7x
fewer bytes than the float32 model. The codes are packed once into blocks of 16 output columns, as
`cpu_gemm` packs float32 weights, with their float16 scales (and Q4 offsets) per 32 input features;
the kernel decodes each weight to float32 exactly and sums in the order `cpu_gemm.blocked_linear` does,
so it computes the same bits as that kernel over the dequantized weights.
"""

import torch

BLOCK = 16  # output columns per packed block
GROUP = 32  # input features per scale


def pack_codes(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """codes [N, K] (0..15 for 4 bits, -128..127 for 8) -> [ceil(N / 16), K, 8] uint8 (byte j: column j low,
    column j + 8 high) or [ceil(N / 16), K, 16] int8; padding columns hold code 0."""
    n, k = codes.shape
    blocks = -(-n // BLOCK)
    padded = torch.zeros(blocks * BLOCK, k, dtype=torch.int32)
    padded[:n] = codes
    columns = padded.view(blocks, BLOCK, k).transpose(1, 2)  # [blocks, K, 16]
    if bits == 8:
        return columns.to(torch.int8).contiguous()
    return (columns[..., :8] | (columns[..., 8:] << 4)).to(torch.uint8).contiguous()


def pack_params(params: torch.Tensor) -> torch.Tensor:
    """Per-group scales or offsets [N, K / 32] -> [ceil(N / 16), K / 32, 16] float16; padding columns zero."""
    n, groups = params.shape
    blocks = -(-n // BLOCK)
    padded = torch.zeros(blocks * BLOCK, groups, dtype=torch.float16)
    padded[:n] = params
    return padded.view(blocks, BLOCK, groups).transpose(1, 2).contiguous()


def quant_block_linear(x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor, offsets: torch.Tensor | None,
                       out_features: int, bias: torch.Tensor | None = None,
                       residual: torch.Tensor | None = None) -> torch.Tensor:
    """x [M, K] float32 @ the packed weight -> [M, out_features] (+ bias [N]) (+ residual [M, N])."""
    return torch.ops.eyas_cpu.quant_block_linear(x.contiguous(), codes, scales, offsets, out_features, bias,
                                                 None if residual is None else residual.contiguous())
