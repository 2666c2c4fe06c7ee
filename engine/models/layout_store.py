"""Measured weight layouts kept on disk, so every process on a machine packs a weight shape alike.

`model.weight_layout=auto` times the layouts of each weight shape (`layout_choice.measure_layout`).
Timings near a tie flip from run to run, and two processes that chose different kernels for one shape
compute logits that differ in their last bits: a plain server and a speculative one would no longer
agree on logprobs, nor on greedy text at a near tie. So the first process to time a shape on this
machine records its choice, and every later one packs by it.

The record: `weight_layouts.json` in the cache root (`$EYAS_CACHE_DIR`, else `$XDG_CACHE_HOME/eyas`,
else `~/.cache/eyas`), one entry per machine (CPU model and capability, torch's version, threads),
weight shape, dtype, bytes timed and the layouts timed against each other. It is read and written under an exclusive lock and replaced
whole, so two processes starting together time a shape once. A choice is kept as it was timed (on a
machine busy at the time, too): delete the file to time again. Where the cache root cannot be locked
or written, the record is read as it is and new choices stay with the process, with a warning.
"""

import contextlib
import functools
import json
import os
import platform
import tempfile
import warnings
from pathlib import Path

import torch

from eyas.engine.cache_root import cache_root

try:
    import fcntl
except ImportError:  # no advisory locks here: concurrent first runs may each time a shape
    fcntl = None

FILE_NAME = "weight_layouts.json"


def machine() -> str:
    """What a timing depends on besides the shape: the CPU, the kernels torch dispatches to, its threads."""
    return (f"{_cpu_model()}|{torch.backends.cpu.get_cpu_capability()}|torch {torch.__version__}"
            f"|{torch.get_num_threads()} threads")


@functools.cache
def _cpu_model() -> str:
    with contextlib.suppress(OSError):
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def entry_key(shape: tuple[int, int], dtype: torch.dtype, measured_bytes: int, layouts: tuple[str, ...]) -> str:
    """layouts: those timed against each other."""
    return (f"{machine()}|{shape[0]}x{shape[1]}|{str(dtype).removeprefix('torch.')}|{measured_bytes} bytes"
            f"|{','.join(layouts)}")


@contextlib.contextmanager
def recorded_layouts():
    """The recorded choices as a dict (entry key -> layout), held under the lock; what the caller adds
    is written back on exit. Where the cache root cannot be locked or written, the record is read as it
    is (if at all) and the choices added stay with this process, with a warning."""
    path = cache_root() / FILE_NAME
    with contextlib.ExitStack() as stack:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            lock = stack.enter_context(open(path.with_name(FILE_NAME + ".lock"), "a"))
            if fcntl is not None:
                fcntl.flock(lock, fcntl.LOCK_EX)
        except OSError as e:
            _unkept(e)
            choices = _read(path)
            yield choices
            return
        choices = _read(path)
        before = dict(choices)
        yield choices
        if choices != before:
            try:
                _write(path, choices)
            except OSError as e:
                _unkept(e)


def _write(path: Path, choices: dict[str, str]) -> None:
    descriptor, partial = tempfile.mkstemp(prefix=FILE_NAME + ".", suffix=".partial", dir=path.parent)
    try:
        with os.fdopen(descriptor, "w") as out:
            json.dump(choices, out, indent=0, sort_keys=True)
        os.chmod(partial, 0o644)  # as a file written plainly (mkstemp's is private)
        os.replace(partial, path)  # whole or absent: a reader never sees half a file
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(partial)
        raise


def _unkept(error: OSError) -> None:
    warnings.warn(f"weight layouts are not kept across processes ({error}); set EYAS_CACHE_DIR to a writable "
                  f"directory so every process packs a shape alike", stacklevel=4)


def _read(path: Path) -> dict[str, str]:
    try:
        choices = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:
        warnings.warn(f"{path} is unreadable ({e}); the weight layouts will be timed again", stacklevel=5)
        return {}
    if not isinstance(choices, dict):
        warnings.warn(f"{path} holds no table of layouts; the weight layouts will be timed again", stacklevel=5)
        return {}
    return {k: v for k, v in choices.items() if isinstance(k, str) and isinstance(v, str)}
