"""Small-batch GEMM over a GGUF file's Q4_0 / Q4_1 / Q8_0 blocks with int8 activations (`cpu_int8_dot_gemm.cpp`).

Why: a decode step that decodes every 4-bit weight to float32 and multiplies in float32 spends more time
computing than reading (measured here: the float kernel reaches about 15 GB/s of 30-48), and a verify of
k + 1 rows multiplies that compute by k + 1. Quantizing each row of x per group of 32 to int8 (as
llama.cpp's Q8 activations) turns a group into one integer dot product, 64 multiply-adds an AVX-512 VNNI
instruction (AVX2: byte-pair sums, a few instructions more); the weights stay exactly the file's. A
portable loop computes the same bits elsewhere, slowly.
"""

import torch

BLOCK = 16  # output columns per packed block
GROUP = 32  # input features per scale


def pack_codes(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """codes [N, K] (0..15 for 4 bits, -128..127 for 8) -> [ceil(N / 16), K / 32, 256 or 512] uint8 in the
    kernel's rows of [16 columns, 4 inputs] (8-bit codes stored plus 128); padding columns hold code 0."""
    n, k = codes.shape
    blocks, groups = -(-n // BLOCK), k // GROUP
    padded = torch.zeros(blocks * BLOCK, k, dtype=torch.int32)
    padded[:n] = codes if bits == 4 else codes + 128
    if bits == 4:  # k = g * 32 + p * 8 + half * 4 + t; the low nibble holds half 0
        c = padded.view(blocks, BLOCK, groups, 4, 2, 4)
        rows = c[:, :, :, :, 0] | (c[:, :, :, :, 1] << 4)  # [blocks, 16, G, 4, 4]
    else:  # k = g * 32 + p * 4 + t
        rows = padded.view(blocks, BLOCK, groups, 8, 4)
    return rows.permute(0, 2, 3, 1, 4).to(torch.uint8).reshape(blocks, groups, -1).contiguous()


def int8_dot_linear(x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor, offsets: torch.Tensor, bits: int,
                    out_features: int, bias: torch.Tensor | None = None,
                    residual: torch.Tensor | None = None) -> torch.Tensor:
    """x [M, K] float32 @ the packed weight -> [M, out_features] (+ bias [N]) (+ residual [M, N])."""
    return torch.ops.eyas_cpu.int8_dot_linear(x.contiguous(), codes, scales, offsets, bits, out_features, bias,
                                              None if residual is None else residual.contiguous())


def reference(x: torch.Tensor, codes: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor) -> torch.Tensor:
    """What the kernel computes, in float64 from unpacked codes [N, K], scales and offsets [N, K / 32]:
    x [M, K] -> [M, N] (a check, not a kernel: the kernel's fused steps round once where this rounds at the end)."""
    m, k = x.shape
    groups = x.view(m, k // GROUP, GROUP)
    dx = groups.abs().amax(dim=-1) / 127  # [M, G]
    xq = torch.round(groups * torch.where(dx > 0, 1 / dx, torch.zeros_like(dx))[..., None])  # [M, G, 32]
    dot = torch.einsum("mgk,ngk->mng", xq.double(), codes.view(-1, k // GROUP, GROUP).double())  # [M, N, G]
    total = dot * (scale.double()[None] * dx.double()[:, None]) + offset.double()[None] * (dx * xq.sum(-1)).double()[:, None]
    return total.sum(-1).float()
