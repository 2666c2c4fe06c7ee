"""Linear projections fused for inference: q/k/v as one GEMM, gate/up as one, each in the weight layout
the GEMM runs fastest with on this machine.

A `FusedLinear` groups the `nn.Linear` modules that read the same input. Before `pack` (training) it
runs them one by one and concatenates; after `pack` (inference) it runs one GEMM over a single weight
tensor, and the member modules' parameters become views of that tensor, so the module tree and its
`state_dict` keep the checkpoint's names and values and nothing is stored twice.

Layouts: `"transposed"` keeps the weight as [in, out] and runs `x @ W` (`addmm` when a residual or a
bias is added); `"linear"` keeps [out, in] and runs `F.linear`; `"onednn"` (float32 on CPU) keeps it in
oneDNN's blocked layout and runs oneDNN's GEMM (`onednn_weights`); `"blocked"` (float32 on CPU) keeps it
in blocks of 16 output columns for eyas's own small-batch GEMM (`blocked_weights`). `layout_choice` picks
one per weight shape. A compressed format (`"fp16"`, or a `Quantization`: see `weight_formats`; `gguf`,
`gguf_f32`: a GGUF file's own blocks, `gguf_block_weights`) stores the fused weight in fewer bytes with its
own kernel. With a kernel of its own (`onednn`, `blocked` or compressed) the members' float weights are
released (left as meta tensors that keep their shape and dtype).

Exact rows: inside `row_invariance.exact_rows()` every projection computes each row as it would alone. A
kernel found row-invariant (`row_invariance.is_row_invariant`: oneDNN's over its reordered weight, the blocked
GEMM; the compressed formats by construction) runs as usual; a dense GEMM runs one row per call.
"""

import torch
from torch import nn
from torch.nn import functional as F

from eyas.engine.models.blocked_weights import BlockedWeights
from eyas.engine.models.gguf_block_weights import GgufBlockWeights, take_blocks
from eyas.engine.models.onednn_weights import OneDnnWeights
from eyas.engine.models.row_invariance import exact_rows_requested, is_row_invariant
from eyas.engine.models.weight_formats import GGUF_SCHEMES, Quantization, compressed_weights, fp16_fits

LAYOUTS = ("transposed", "linear", "onednn", "blocked")
OWN_KERNELS = {"onednn": OneDnnWeights, "blocked": BlockedWeights}  # float layouts with a kernel of their own


class FusedLinear:
    def __init__(self, linears: list[nn.Linear]):
        self.linears = linears
        self.weight: torch.Tensor | None = None  # packed: [in, out] (transposed) or [out, in] (linear)
        self.bias: torch.Tensor | None = None  # packed: [out]
        self.layout: str | Quantization | None = None
        self.kernel = None  # onednn's, blocked or a compressed format's weights and kernel: x [N, in] -> [N, out]
        self.row_invariant = False  # the packed GEMM computes a row alike at any row count (see exact rows)

    @property
    def out_features(self) -> int:
        return sum(linear.out_features for linear in self.linears)

    def pack(self, layout: "str | Quantization", release: bool = True) -> None:
        """Fuse the member weights into one tensor in `layout`; the members' parameters become views of it.
        A layout with its own kernel (onednn, blocked, compressed) keeps its own copy and releases the members'
        weights unless `release` is false (a tied lm_head's weight is the embedding's)."""
        if isinstance(layout, Quantization) and layout.scheme in GGUF_SCHEMES:
            blocks = take_blocks(self.linears, int8_activations=layout.scheme == "gguf")
            if blocks is None:  # not stored in blocks the kernel reads: dequantized, in the float layout
                return self.pack(layout.fallback, release)
            return self._pack_with_kernel(layout, release, blocks)
        if isinstance(layout, Quantization) or layout == "fp16" or layout in OWN_KERNELS:
            return self._pack_with_kernel(layout, release)
        if layout not in LAYOUTS:
            raise ValueError(f"weight layout must be one of {list(LAYOUTS)}, got {layout!r}")
        if layout == "linear" and len(self.linears) == 1:  # already in place (a tied lm_head stays tied)
            linear = self.linears[0]
            self.weight, self.bias, self.layout = linear.weight.detach(), _detached(linear.bias), layout
            return
        with torch.no_grad():
            weight = torch.cat([linear.weight for linear in self.linears], dim=0)  # [out, in]
            if layout == "transposed":
                weight = weight.t().contiguous()  # [in, out]
            has_bias = self.linears[0].bias is not None
            bias = torch.cat([linear.bias for linear in self.linears]) if has_bias else None
        start = 0
        for linear in self.linears:
            end = start + linear.out_features
            view = weight[:, start:end].t() if layout == "transposed" else weight[start:end]
            linear.weight = nn.Parameter(view, requires_grad=False)
            if bias is not None:
                linear.bias = nn.Parameter(bias[start:end], requires_grad=False)
            start = end
        self.weight, self.bias, self.layout = weight, bias, layout

    def _pack_with_kernel(self, layout: "str | Quantization", release: bool, blocks=None) -> None:
        with torch.no_grad():
            weight = torch.cat([linear.weight for linear in self.linears], dim=0)  # [out, in]
            has_bias = self.linears[0].bias is not None
            bias = torch.cat([linear.bias for linear in self.linears]) if has_bias else None
        if layout == "fp16" and not fp16_fits(weight):
            return self.pack("linear")  # a weight beyond float16's range keeps the dense kernel
        if blocks is not None:
            self.kernel = GgufBlockWeights(blocks, bias, int8_activations=layout.scheme == "gguf")
        elif layout in OWN_KERNELS:
            self.kernel = OWN_KERNELS[layout](weight, bias)
        else:
            self.kernel = compressed_weights(weight, bias, layout)
        self.layout = layout
        # compressed kernels compute each row on its own (weight_formats, gguf_block_weights); oneDNN's and the
        # blocked one are measured
        self.row_invariant = is_row_invariant(self.kernel, weight.shape[1], weight.dtype) if layout in OWN_KERNELS \
            else True
        if release:
            for linear in self.linears:
                linear.weight = nn.Parameter(torch.empty_like(linear.weight, device="meta"), requires_grad=False)
                if has_bias:
                    linear.bias = nn.Parameter(torch.empty_like(linear.bias, device="meta"), requires_grad=False)

    def __call__(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        """x: [N, in] -> [N, out] (+ residual [N, out])."""
        if x.shape[0] > 1 and not self.row_invariant and self.layout is not None and not torch.compiler.is_compiling() \
                and exact_rows_requested():  # exact forwards run eager; a graph never reads the flag
            rows = [self._gemm(x[i:i + 1], None if residual is None else residual[i:i + 1]) for i in range(x.shape[0])]
            return torch.cat(rows)
        return self._gemm(x, residual)

    def _gemm(self, x: torch.Tensor, residual: torch.Tensor | None) -> torch.Tensor:
        if isinstance(self.kernel, (OneDnnWeights, BlockedWeights, GgufBlockWeights)):
            return self.kernel(x, residual)
        if self.kernel is not None:
            out = self.kernel(x)
            return out if residual is None else out.add_(residual)
        if self.weight is None:  # not packed: the member modules, so training reaches their parameters
            out = self.linears[0](x) if len(self.linears) == 1 else torch.cat([m(x) for m in self.linears], dim=-1)
            return out if residual is None else residual + out
        if self.layout == "transposed":
            if residual is None:
                return torch.mm(x, self.weight) if self.bias is None else torch.addmm(self.bias, x, self.weight)
            out = torch.addmm(residual, x, self.weight)
            return out if self.bias is None else out.add_(self.bias)
        if residual is None:
            return F.linear(x, self.weight, self.bias)
        out = torch.addmm(residual, x, self.weight.t())  # the GEMM F.linear runs, with the residual added in it
        return out if self.bias is None else out.add_(self.bias)


def _detached(tensor: torch.Tensor | None) -> torch.Tensor | None:
    return None if tensor is None else tensor.detach()
