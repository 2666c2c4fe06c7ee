"""Cache roots for processes the tests start (eyas's own cache root is `engine/cache_root.py`)."""

import shutil
from pathlib import Path


def cache_root_with_cpu_kernels(root: Path) -> Path:
    """A fresh cache root holding the CPU kernels this test run built, so a process started on it loads them
    instead of compiling them again (what it records is its own)."""
    from eyas.engine.cpu_ops import cpu_ops_error
    from eyas.kernels import cpu_ops

    assert cpu_ops_error() is None
    (root / "kernels").mkdir(parents=True, exist_ok=True)
    shutil.copy2(cpu_ops.loaded_library(), root / "kernels")
    return root
