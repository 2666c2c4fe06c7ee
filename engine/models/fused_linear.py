"""Linear projections fused for inference: q/k/v as one GEMM, gate/up as one, each in the weight layout
the GEMM runs fastest with on this machine.

A `FusedLinear` groups the `nn.Linear` modules that read the same input. Before `pack` (training) it
runs them one by one and concatenates; after `pack` (inference) it runs one GEMM over a single weight
tensor, and the member modules' parameters become views of that tensor, so the module tree and its
`state_dict` keep the checkpoint's names and values and nothing is stored twice.

Layouts: `"transposed"` keeps the weight as [in, out] and runs `x @ W` (`addmm` when a residual or a
bias is added); `"linear"` keeps [out, in] and runs `F.linear`; `"onednn"` (float32 on CPU) keeps it in
oneDNN's blocked layout and runs oneDNN's GEMM (`onednn_weights`); `"blocked"` (float32 on CPU) keeps it
in blocks of 16 output columns for eyas's own small-batch GEMM (`blocked_weights`). `measure_layout` times them for a
weight shape at a few row counts and returns the fastest. A compressed format (`"fp16"`, or a
`Quantization`: see `weight_formats`; `gguf`, `gguf_f32`: a GGUF file's own blocks, `gguf_block_weights`) stores the fused
weight in fewer bytes with its own kernel. With
a kernel of its own (`onednn`, `blocked` or compressed) the members' float weights are released (left as meta
tensors that keep their shape and dtype).

Exact rows: inside `exact_rows()` (the forwards of requests that ask for logprobs) every projection
computes each row as it would alone, whatever the other rows of the call, so a verify's positions are
computed bit for bit as one-token decodes of them. A kernel measured row-invariant here (`_row_invariant`:
oneDNN's over its reordered weight, the blocked GEMM; the compressed formats by construction) runs as usual; a dense
GEMM (MKL's, which blocks its sums differently by row count) runs one row per call.
"""

import contextlib
import contextvars
import time

import torch
from torch import nn
from torch.nn import functional as F

from eyas.engine.errors import ConfigError
from eyas.engine.models import layout_store
from eyas.engine.cpu_ops import cpu_ops_error
from eyas.engine.models.blocked_weights import BlockedWeights, blocked_available
from eyas.engine.models.gguf_block_weights import GgufBlockWeights, take_blocks
from eyas.engine.models.onednn_weights import OneDnnWeights, onednn_available
from eyas.engine.models.weight_formats import (GGUF_SCHEMES, Quantization, compressed_weights, fbgemm_available,
                                               fp16_fits)

LAYOUTS = ("transposed", "linear", "onednn", "blocked")
_OWN_KERNEL = {"onednn": OneDnnWeights, "blocked": BlockedWeights}  # float layouts with a kernel of their own

_EXACT_ROWS = contextvars.ContextVar("exact_rows", default=False)


@contextlib.contextmanager
def exact_rows(enabled: bool = True):
    """Projections compute each row as they would alone while this is entered (see the module docstring)."""
    token = _EXACT_ROWS.set(enabled)
    try:
        yield
    finally:
        _EXACT_ROWS.reset(token)


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
        if isinstance(layout, Quantization) or layout == "fp16" or layout in _OWN_KERNEL:
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
        elif layout in _OWN_KERNEL:
            self.kernel = _OWN_KERNEL[layout](weight, bias)
        else:
            self.kernel = compressed_weights(weight, bias, layout)
        self.layout = layout
        # compressed kernels compute each row on its own (weight_formats, gguf_block_weights); oneDNN's and the
        # blocked one are measured
        self.row_invariant = _row_invariant(self.kernel, weight.shape[1], weight.dtype) if layout in _OWN_KERNEL else True
        if release:
            for linear in self.linears:
                linear.weight = nn.Parameter(torch.empty_like(linear.weight, device="meta"), requires_grad=False)
                if has_bias:
                    linear.bias = nn.Parameter(torch.empty_like(linear.bias, device="meta"), requires_grad=False)

    def __call__(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        """x: [N, in] -> [N, out] (+ residual [N, out])."""
        if x.shape[0] > 1 and not self.row_invariant and self.layout is not None and not torch.compiler.is_compiling() \
                and _EXACT_ROWS.get():  # exact forwards run eager; a graph never reads the flag
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


# rows a row-invariance check compares: a tail of every width a blocked kernel may split rows into
_CHECKED_ROWS = (2, 3, 5, 8, 9, 17, 33)
_ROW_INVARIANT: dict[tuple, bool] = {}  # (kernel type, in_features, out_features, dtype) -> measured


def _row_invariant(kernel, in_features: int, dtype: torch.dtype) -> bool:
    """Whether `kernel` computes each row of x bit for bit as it does x's row alone, checked on random
    rows once per shape and process (a property of the kernel's blocking on this CPU, not of the weight)."""
    key = (type(kernel), in_features, kernel.out_features, dtype)
    if key not in _ROW_INVARIANT:
        generator = torch.Generator().manual_seed(0)
        x = torch.randn(max(_CHECKED_ROWS), in_features, generator=generator).to(dtype)
        with torch.inference_mode():
            alone = torch.cat([kernel(x[i:i + 1]) for i in range(x.shape[0])])
            _ROW_INVARIANT[key] = all(torch.equal(kernel(x[:m]), alone[:m]) for m in _CHECKED_ROWS)
    return _ROW_INVARIANT[key]


def _detached(tensor: torch.Tensor | None) -> torch.Tensor | None:
    return None if tensor is None else tensor.detach()


def measure_layout(in_features: int, out_features: int, dtype: torch.dtype, device: torch.device,
                   rows: tuple[int, ...] = (1, 4, 8), repeats: int = 20, model_bytes: int = 0) -> str:
    """The layout whose GEMM is fastest for this weight shape, timed here at the given row counts
    (decode and verify widths); a layout must beat `transposed` by 5% to be chosen. The calls cycle through copies of the weight that add up to `model_bytes` (the
    model's projections, capped), so a weight is timed read from where a forward finds it: cache for a
    model that fits in it, memory for one that does not."""
    if device.type != "cpu":
        return "linear"  # GPU GEMMs take either layout at full speed; keep the checkpoint's
    weight_bytes = in_features * out_features * torch.finfo(dtype).bits // 8
    copies = max(1, min(model_bytes, _MAX_MEASURED_BYTES) // weight_bytes)
    weights = [torch.randn(out_features, in_features, dtype=dtype, device=device) for _ in range(copies)]
    inputs = [torch.randn(m, in_features, dtype=dtype, device=device) for m in rows]
    kernels = {"transposed": [w.t().contiguous() for w in weights], "linear": weights}
    calls = {"transposed": torch.mm, "linear": lambda x, w: F.linear(x, w)}
    for name in _usable_layouts(dtype, device):
        if name in _OWN_KERNEL:
            kernels[name], calls[name] = [_OWN_KERNEL[name](w, None) for w in weights], lambda x, w: w(x)
    best = {}
    with torch.inference_mode():
        for name, call in calls.items():
            for x in inputs:  # warm up
                call(x, kernels[name][0])
        for _ in range(3):  # interleave rounds so a burst of load hits every layout alike
            for name, call in calls.items():
                start = time.perf_counter()
                for i in range(repeats):
                    for j, x in enumerate(inputs):
                        call(x, kernels[name][(i * len(inputs) + j) % copies])
                best[name] = min(best.get(name, float("inf")), time.perf_counter() - start)
    fastest = min(best, key=best.get)
    return fastest if best[fastest] < 0.95 * best["transposed"] else "transposed"


_MAX_MEASURED_BYTES = 256 << 20  # beyond most CPUs' last-level cache: a larger model's copies are read from memory
_MAX_MEASURED_NUMEL = 1 << 24  # larger weights run compute-bound GEMMs: either layout, no timing needed
# choices read or measured by this process; the measured ones are also kept on disk (layout_store), so
# every engine on this machine packs a shape alike and two engines over one checkpoint (plain and
# speculative, in one process or two) compute the same logits
_MEASURED: dict[str, str] = {}


def choose_layouts(shapes: dict[str, tuple[int, int]], weight_layout: str, dtype: torch.dtype,
                   device: torch.device, model_bytes: int = 0) -> dict[str, str]:
    """Layout per projection name (`shapes`: name -> (in_features, out_features)). `weight_layout` is
    `auto` (each distinct shape timed once per machine, the choice recorded by `layout_store`; a
    half-precision model on CPU gets `fp16` where fbgemm is built in: see `weight_formats.Fp16Weights`),
    or one of `LAYOUTS` for every projection. `model_bytes`: the bytes of the model's weights, for timing
    each shape where a forward reads it from."""
    if weight_layout == "auto" and dtype in (torch.bfloat16, torch.float16) and device.type == "cpu" \
            and fbgemm_available():
        return dict.fromkeys(shapes, "fp16")
    if weight_layout != "auto":
        if weight_layout not in LAYOUTS:
            raise ConfigError(f"model.weight_layout must be one of {['auto', *LAYOUTS]}, got {weight_layout!r}")
        if weight_layout == "onednn" and not onednn_available(dtype, device):
            raise ConfigError(f"model.weight_layout=onednn runs float32 weights on a CPU with oneDNN; this model is "
                              f"{str(dtype).removeprefix('torch.')} on {device.type}: set model.weight_layout=auto")
        if weight_layout == "blocked" and not blocked_available(dtype, device):
            why = cpu_ops_error() if device.type == "cpu" and dtype == torch.float32 else \
                f"this model is {str(dtype).removeprefix('torch.')} on {device.type}"
            raise ConfigError(f"model.weight_layout=blocked runs float32 weights on a CPU with eyas's own GEMM kernel; "
                              f"{why}: set model.weight_layout=auto")
        return {name: weight_layout for name in shapes}
    if device.type != "cpu":
        return dict.fromkeys(shapes, "linear")  # GPU GEMMs take either layout at full speed; keep the checkpoint's
    usable = _usable_layouts(dtype, device)
    keys = {name: record_key(shape, dtype, device, model_bytes) for name, shape in shapes.items()}
    timed = {name: shape for name, shape in shapes.items() if shape[0] * shape[1] <= _MAX_MEASURED_NUMEL}
    if any(keys[name] not in _MEASURED for name in timed):
        with layout_store.recorded_layouts() as recorded:
            for name, shape in timed.items():
                key = keys[name]
                if key not in _MEASURED:
                    if recorded.get(key) not in usable:
                        recorded[key] = measure_layout(*shape, dtype, device, model_bytes=model_bytes)
                    _MEASURED[key] = recorded[key]
    return {name: _MEASURED[keys[name]] if name in timed else "linear" for name in shapes}


def record_key(shape: tuple[int, int], dtype: torch.dtype, device: torch.device, model_bytes: int = 0) -> str:
    """The layout record's key of a shape timed against the layouts usable here (a choice made among fewer
    is made again where more can run)."""
    return layout_store.entry_key(shape, dtype, min(model_bytes, _MAX_MEASURED_BYTES), _usable_layouts(dtype, device))


def _usable_layouts(dtype: torch.dtype, device: torch.device) -> tuple[str, ...]:
    return ("transposed", "linear", *(name for name, usable in (("onednn", onednn_available), ("blocked", blocked_available))
                                      if usable(dtype, device)))
