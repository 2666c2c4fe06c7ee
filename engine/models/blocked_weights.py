"""Float32 weights in blocks of 16 output columns, multiplied by eyas's own CPU GEMM (`model.weight_layout=blocked`).

Why: a decode, verify or draft step multiplies a few rows by every weight, so it is bound by reading
the weights once, and every thread should read its share. MKL's one-row GEMV runs on one thread, its
GEMM of a few rows packs the weight again on every call, and oneDNN's falls well short of the memory
bandwidth here. `kernels/cpu_gemm.cpp` reads a weight packed once at load, splits its column blocks
across the threads and adds the bias and residual as it stores (`python -m eyas.bench layouts` times
it against the other layouts; README, Weights, has the figures and their host).

Each output is one FMA chain over the input features in order, so a row computes to the same bits in
any batch: verify rows equal decode rows, and exact forwards need no row loop. The kernel is compiled
for this CPU on first use with eyas's other C++ ops (`eyas.engine.cpu_ops`); where they cannot be built
the layout is unavailable and `auto` times the others.
"""

import torch

from eyas.engine.cpu_ops import cpu_ops_error
from eyas.kernels import cpu_gemm


def blocked_available(dtype: torch.dtype, device: torch.device) -> bool:
    """Whether the blocked layout runs here: float32 weights on a CPU, the kernel built (now, if first)."""
    return device.type == "cpu" and dtype == torch.float32 and cpu_ops_error() is None


class BlockedWeights:
    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None):
        # weight: [out, in] float32 -> [ceil(out / 16), in, 16]
        error = cpu_ops_error()
        if error is not None:
            raise RuntimeError(f"the blocked weight layout cannot run here: {error}")
        self.packed = cpu_gemm.pack(weight.detach())
        self.bias = None if bias is None else bias.detach().contiguous()
        self.out_features = weight.shape[0]

    def __call__(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        """x: [N, in] -> [N, out] (+ residual [N, out], added as the output is stored)."""
        return cpu_gemm.blocked_linear(x, self.packed, self.out_features, self.bias, residual)
