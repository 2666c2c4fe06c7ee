"""Launch configurations of the kernels.

Each kernel has one default configuration. With `EYAS_TRITON_AUTOTUNE=1` its `@triton.autotune`
searches a list instead; tests and the interpreter leave it off so every launch uses the default.
"""

import os

import triton

AUTOTUNE_ENV = "EYAS_TRITON_AUTOTUNE"


def autotune_enabled() -> bool:
    return os.environ.get(AUTOTUNE_ENV, "0") == "1"


def launch_configs(default: triton.Config, search: list[triton.Config]) -> list[triton.Config]:
    """The configs `@triton.autotune` chooses from: `search` when autotuning is on, else `[default]`."""
    return search if autotune_enabled() else [default]
