"""Small-batch float32 GEMM on a CPU (`cpu_gemm.cpp`, built with the other C++ ops: `cpu_ops`).

Why: decode, verify and draft steps multiply a few rows by every weight, so they are bound by reading
the weights. MKL's sgemm packs its weight operand again on every call of more than one row, and its
one-row GEMV runs on one thread. This kernel reads a weight packed once into blocks of 16 output
columns (`pack`: [ceil(N / 16), K, 16]), splits the blocks across threads, and computes every output
as one FMA chain over k in order: a row gets the same bits alone or in any batch (row-invariant).
"""

import torch

BLOCK = 16  # output columns per packed block


def pack(weight: torch.Tensor) -> torch.Tensor:
    """weight [N, K] -> [ceil(N / BLOCK), K, BLOCK] float32, the padding columns zero."""
    n, k = weight.shape
    blocks = -(-n // BLOCK)
    padded = torch.zeros(blocks * BLOCK, k, dtype=torch.float32, device=weight.device)
    padded[:n] = weight
    return padded.view(blocks, BLOCK, k).transpose(1, 2).contiguous()


def blocked_linear(x: torch.Tensor, packed: torch.Tensor, out_features: int, bias: torch.Tensor | None = None,
                   residual: torch.Tensor | None = None) -> torch.Tensor:
    """x [M, K] @ the packed weight -> [M, out_features] (+ bias [N]) (+ residual [M, N])."""
    return torch.ops.eyas_cpu.blocked_linear(x.contiguous(), packed, out_features, bias,
                                             None if residual is None else residual.contiguous())
