"""eyas's C++ CPU ops (`cpu_gemm.cpp`, `cpu_attention.cpp`), one library built with the system's C++
compiler on first use.

The ops are registered from C++ (`torch.ops.eyas_cpu.*`), so a compiled graph (an AOTInductor package
too) calls them without Python. `build(directory)` compiles them once per machine into `directory`
(keyed by the sources, torch, the compiler and the CPU: `-march=native`), under a lock, and loads the
library; later processes load the library they find.
"""

import contextlib
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import sysconfig
import tempfile
import threading
from pathlib import Path

import torch
import torch.utils.cpp_extension

try:
    import fcntl
except ImportError:  # no advisory locks: two first runs may both compile (each writes its own file)
    fcntl = None

SOURCES = tuple(Path(__file__).with_name(name) for name in ("cpu_gemm.cpp", "cpu_attention.cpp"))
FLAGS = ("-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-std=c++20", "-w")


class BuildError(RuntimeError):
    """The ops could not be compiled or loaded here (no compiler, a compiler error)."""


_BUILD_LOCK = threading.Lock()
_loaded: Path | None = None


def is_loaded() -> bool:
    return _loaded is not None


def loaded_library() -> Path | None:
    """The library this process loaded (None before `build`)."""
    return _loaded


def build(directory: str | os.PathLike) -> Path:
    """Compile the ops into `directory` unless a build for this machine is there, and load them once per
    process. Returns the library's path; raises BuildError naming the compiler's complaint."""
    global _loaded
    with _BUILD_LOCK:
        if _loaded is not None:
            return _loaded
        directory = Path(directory).expanduser()
        library = directory / f"eyas_cpu-{_build_key()}.so"
        if not library.exists():
            _compile(library)
        try:
            torch.ops.load_library(str(library))
        except OSError as e:
            raise BuildError(f"could not load {library}: {e}") from e
        torch.library.register_fake("eyas_cpu::blocked_linear")(_blocked_linear_shape)
        torch.library.register_fake("eyas_cpu::paged_attention")(_paged_attention_shape)
        _loaded = library
        return library


def _blocked_linear_shape(x, w, out_features, bias=None, residual=None):
    return x.new_empty(x.shape[0], out_features)


def _paged_attention_shape(q, k_cache, v_cache, context_slots, mask, scale):
    return torch.empty_like(q)


def _compile(library: Path) -> None:
    compiler = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")
    if compiler is None:
        raise BuildError("no C++ compiler found (set CXX, or install g++)")
    try:
        library.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise BuildError(f"cannot create {library.parent}: {e}") from e
    with contextlib.ExitStack() as stack:
        with contextlib.suppress(OSError):  # unlockable (NFS): build anyway, to a file of our own
            lock = stack.enter_context(open(library.with_suffix(".lock"), "a"))
            if fcntl is not None:
                fcntl.flock(lock, fcntl.LOCK_EX)
        if library.exists():  # another process built it while we waited
            return
        descriptor, partial = tempfile.mkstemp(prefix=library.name + ".", suffix=".partial", dir=library.parent)
        os.close(descriptor)
        command = [compiler, *FLAGS, f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}",
                   *(f"-I{p}" for p in torch.utils.cpp_extension.include_paths()), *map(str, SOURCES), "-o", partial,
                   *(f"-L{p}" for p in torch.utils.cpp_extension.library_paths()), "-lc10", "-ltorch_cpu",
                   *(f"-Wl,-rpath,{p}" for p in torch.utils.cpp_extension.library_paths())]
        try:
            try:
                done = subprocess.run(command, capture_output=True, text=True)
            except OSError as e:
                raise BuildError(f"cannot run the C++ compiler {compiler}: {e}") from e
            if done.returncode != 0:
                raise BuildError(f"{Path(compiler).name} failed on {', '.join(s.name for s in SOURCES)}: "
                                 f"{done.stderr.strip()[-2000:]}")
            os.replace(partial, library)
        finally:
            with contextlib.suppress(OSError):
                os.unlink(partial)


@functools.cache
def _build_key() -> str:
    """What the library depends on: its sources, torch, the compiler and flags, the CPU it targets."""
    compiler = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++") or ""
    version = ""
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        version = subprocess.run([compiler, "--version"], capture_output=True, text=True).stdout
    digest = hashlib.sha256()
    for part in (*(s.read_bytes() for s in SOURCES), torch.__version__.encode(), " ".join(FLAGS).encode(), version.encode(),
                 _cpu_flags().encode(), platform.machine().encode(), sysconfig.get_platform().encode()):
        digest.update(part)
        digest.update(b"\0")
    return digest.hexdigest()[:16]


def _cpu_flags() -> str:
    """The CPU's model and feature flags (-march=native compiles for them)."""
    lines = []
    with contextlib.suppress(OSError):
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith(("model name", "flags", "Features", "CPU part")):
                    lines.append(line.strip())
                elif not line.strip() and lines:
                    break
    return "\n".join(lines) or platform.processor()
