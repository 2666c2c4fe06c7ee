"""Float weights in oneDNN's blocked layout, multiplied by oneDNN's GEMM (`model.weight_layout=onednn`).

Why: for a call of more than one row MKL's sgemm packs its weight operand again on every call, so a
decode of 8 requests or a verify of k + 1 tokens reads each weight and writes it back before using it.
oneDNN takes the weight reordered once, when the model loads (`_reorder_linear_weight`), and reads it
once per call. Measured on the shipped target's 85 projections (42 MB of float32, out of a 32 MB L3,
2-core AMD EPYC): 1 row 3.6 -> 2.5 ms, 8 rows 7.2 -> 2.5 ms, 48 rows 15 -> 7 ms.

The reordered tensor is opaque (`torch._mkldnn` layout): no view of it is a dense weight, so the
members' float weights are released as the compressed formats release theirs. Compiled graphs take
it as an input and call oneDNN through the op `eyas::onednn_linear` (`packed_ops`).
"""

import torch

from eyas.engine.models.packed_ops import onednn_linear


def onednn_available(dtype: torch.dtype, device: torch.device) -> bool:
    return device.type == "cpu" and dtype == torch.float32 and torch.backends.mkldnn.is_available()


class OneDnnWeights:
    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None):
        # weight: [out, in] float32 -> oneDNN's blocked layout (chosen for any row count)
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight.contiguous(), None)
        self.bias = None if bias is None else bias.contiguous()
        self.out_features = weight.shape[0]

    def __call__(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        """x: [N, in] -> [N, out] (+ residual [N, out], added in the GEMM's epilogue)."""
        if torch.compiler.is_compiling():  # the compiler fuses the adds into its own kernels
            out = onednn_linear(x, self.packed, self.out_features)
            out = out if self.bias is None else out + self.bias
            return out if residual is None else out + residual
        if residual is None:
            return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [None], "")
        return torch.ops.mkldnn._linear_pointwise.binary(x, residual.contiguous(), self.packed, self.bias, "add")
