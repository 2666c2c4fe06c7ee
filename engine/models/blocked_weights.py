"""Float32 weights in blocks of 16 output columns, multiplied by eyas's own CPU GEMM (`model.weight_layout=blocked`).

Why: a decode, verify or draft step multiplies a few rows by every weight, so it is bound by reading
the weights once, and every thread should read its share. MKL's one-row GEMV runs on one thread, its
GEMM of a few rows packs the weight again on every call, and oneDNN's reaches about half the memory
bandwidth here. `kernels/cpu_gemm.cpp` reads a weight packed once at load, splits its column blocks
across the threads and adds the bias and residual as it stores. Measured on the shipped target's 49
projections (42 MB of float32 read from memory, 2-core AMD EPYC with AVX2): 1 row 3.3 -> 2.0 ms, 8 rows
6.4 -> 3.0 ms, 16 rows 6.5 -> 4.0 ms against MKL over `transposed` weights.

Each output is one FMA chain over the input features in order, so a row computes to the same bits in
any batch: verify rows equal decode rows, and exact forwards need no row loop. The kernel is compiled
for this CPU on first use (`kernels.cpu_gemm.build`, ~10 s, kept in the cache root's `kernels/`, or
under the temp dir where the cache root cannot be written);
where it cannot be built the layout is unavailable and `auto` times the others.
"""

import getpass
import logging
import os
import tempfile
import warnings
from pathlib import Path

import torch

from engine.models import layout_store
from kernels import cpu_gemm

log = logging.getLogger("eyas.models")
_UNAVAILABLE: list[str] = []  # why the kernel could not be built here (once per process)


def blocked_available(dtype: torch.dtype, device: torch.device) -> bool:
    """Whether the blocked layout runs here: float32 weights on a CPU, the kernel built (now, if first)."""
    if device.type != "cpu" or dtype != torch.float32:
        return False
    return kernel_error() is None


def kernel_error() -> str | None:
    """Why the kernel cannot run here, or None once it is built and loaded."""
    if cpu_gemm.is_loaded():
        return None
    if _UNAVAILABLE:
        return _UNAVAILABLE[0]
    directory = _build_directory()
    log.info("building eyas's CPU GEMM kernel for this machine (once; kept in %s)", directory)
    try:
        cpu_gemm.build(directory)
    except cpu_gemm.BuildError as e:
        _UNAVAILABLE.append(str(e))
        warnings.warn(f"model.weight_layout=blocked is unavailable here: {e}", stacklevel=3)
        return _UNAVAILABLE[0]
    return None


class BlockedWeights:
    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None):
        # weight: [out, in] float32 -> [ceil(out / 16), in, 16]
        error = kernel_error()
        if error is not None:
            raise RuntimeError(f"the blocked weight layout cannot run here: {error}")
        self.packed = cpu_gemm.pack(weight.detach())
        self.bias = None if bias is None else bias.detach().contiguous()
        self.out_features = weight.shape[0]

    def __call__(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        """x: [N, in] -> [N, out] (+ residual [N, out], added as the output is stored)."""
        return cpu_gemm.blocked_linear(x, self.packed, self.out_features, self.bias, residual)


def _build_directory() -> Path:
    """The cache root's `kernels/`, or a directory of this user's under the temp dir where that cannot be written."""
    directory = layout_store.cache_root() / "kernels"
    try:
        directory.mkdir(parents=True, exist_ok=True)
        if os.access(directory, os.W_OK):
            return directory
    except OSError:
        pass
    return Path(tempfile.gettempdir()) / f"eyas-kernels-{getpass.getuser()}"
