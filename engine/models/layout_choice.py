"""The weight layout each fused projection is packed in (`FusedLinear.pack`), chosen once per machine.

`model.weight_layout` names one of `fused_linear.LAYOUTS` for every projection, or is `auto`: a
half-precision model on CPU gets `fp16` where fbgemm is built in, a model on a GPU keeps the checkpoint's
`linear`, and a float32 model on CPU gets, per distinct weight shape, the layout whose GEMM ran fastest
when timed here (`measure_layout`) among those usable here. Timings near a tie flip from run to run, and
two processes that packed one shape in different layouts compute logits that differ in their last bits,
so a shape's choice is recorded on disk (`layout_store`) and every later engine on this machine packs by it.
"""

import time

import torch
from torch.nn import functional as F

from eyas.engine.cpu_ops import cpu_ops_error
from eyas.engine.errors import ConfigError
from eyas.engine.models import layout_store
from eyas.engine.models.blocked_weights import blocked_available
from eyas.engine.models.fused_linear import LAYOUTS, OWN_KERNELS
from eyas.engine.models.onednn_weights import onednn_available
from eyas.engine.models.weight_formats import fbgemm_available

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
    usable = usable_layouts(dtype, device)
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


def measure_layout(in_features: int, out_features: int, dtype: torch.dtype, device: torch.device,
                   rows: tuple[int, ...] = (1, 4, 8), repeats: int = 20, model_bytes: int = 0) -> str:
    """The layout whose GEMM is fastest for this weight shape, timed here at the given row counts
    (decode and verify widths); a layout must beat `transposed` by 5% to be chosen. The calls cycle
    through copies of the weight that add up to `model_bytes` (the model's projections, capped), so a
    weight is timed read from where a forward finds it: cache for a model that fits in it, memory for one
    that does not."""
    if device.type != "cpu":
        return "linear"  # GPU GEMMs take either layout at full speed; keep the checkpoint's
    weight_bytes = in_features * out_features * torch.finfo(dtype).bits // 8
    copies = max(1, min(model_bytes, _MAX_MEASURED_BYTES) // weight_bytes)
    weights = [torch.randn(out_features, in_features, dtype=dtype, device=device) for _ in range(copies)]
    inputs = [torch.randn(m, in_features, dtype=dtype, device=device) for m in rows]
    kernels = {"transposed": [w.t().contiguous() for w in weights], "linear": weights}
    calls = {"transposed": torch.mm, "linear": lambda x, w: F.linear(x, w)}
    for name in usable_layouts(dtype, device):
        if name in OWN_KERNELS:
            kernels[name], calls[name] = [OWN_KERNELS[name](w, None) for w in weights], lambda x, w: w(x)
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


def record_key(shape: tuple[int, int], dtype: torch.dtype, device: torch.device, model_bytes: int = 0) -> str:
    """The layout record's key of a shape timed against the layouts usable here (a choice made among fewer
    is made again where more can run)."""
    return layout_store.entry_key(shape, dtype, min(model_bytes, _MAX_MEASURED_BYTES), usable_layouts(dtype, device))


def usable_layouts(dtype: torch.dtype, device: torch.device) -> tuple[str, ...]:
    """The layouts a `dtype` model on `device` can be packed in, in `LAYOUTS`' order."""
    own_kernels = (("onednn", onednn_available), ("blocked", blocked_available))
    return ("transposed", "linear", *(name for name, available in own_kernels if available(dtype, device)))
