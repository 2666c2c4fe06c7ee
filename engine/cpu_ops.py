"""Whether eyas's C++ CPU ops (`kernels/cpu_ops.py`: the blocked GEMMs, paged attention) run here.

They are compiled for this CPU the first time a model could use them (about 18 s, kept in the cache
root's `kernels/`, or in a private temporary directory where the cache root cannot be written). Where they cannot be
built (no compiler), what uses them is unavailable, with one warning saying why, and the others run.
"""

import logging
import os
import tempfile
import warnings
from pathlib import Path

import torch

from eyas.engine.cache_root import cache_root
from eyas.kernels import cpu_ops

log = logging.getLogger("eyas")
_UNAVAILABLE: list[str] = []  # why the ops could not be built here (once per process)


def paged_attention_runs(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether eyas's paged attention op serves a KV pool of `dtype` on `device`: float32 on a CPU, the ops
    built here. It attends each query alike in any batch, so what it serves is batch-invariant."""
    return torch.device(device).type == "cpu" and dtype == torch.float32 and cpu_ops_error() is None


def cpu_ops_error() -> str | None:
    """Why the ops cannot run here, or None once they are built and loaded (built now, if first)."""
    if cpu_ops.is_loaded():
        return None
    if _UNAVAILABLE:
        return _UNAVAILABLE[0]
    directory = _build_directory()
    log.info("building eyas's CPU kernels for this machine (once; kept in %s)", directory)
    try:
        cpu_ops.build(directory)
    except cpu_ops.BuildError as e:
        _UNAVAILABLE.append(str(e))
        warnings.warn(f"eyas's CPU kernels are unavailable here (model.weight_layout=blocked and the graphs' paged "
                      f"attention): {e}", stacklevel=3)
        return _UNAVAILABLE[0]
    return None


def _build_directory() -> Path:
    """The cache root's `kernels/`, or a fresh private directory where that cannot be written (built again
    by each such process: a shared path under the temp dir could hold another user's library)."""
    directory = cache_root() / "kernels"
    try:
        directory.mkdir(parents=True, exist_ok=True)
        if os.access(directory, os.W_OK):
            return directory
    except OSError:
        pass
    return Path(tempfile.mkdtemp(prefix="eyas-kernels-"))
