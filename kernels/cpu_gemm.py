"""Small-batch float32 GEMM on a CPU (`cpu_gemm.cpp`), built with the system's C++ compiler on first use.

Why: decode, verify and draft steps multiply a few rows by every weight, so they are bound by reading
the weights. MKL's sgemm packs its weight operand again on every call of more than one row, and its
one-row GEMV runs on one thread. This kernel reads a weight packed once into blocks of 16 output
columns (`pack`: [ceil(N / 16), K, 16]), splits the blocks across threads, and computes every output
as one FMA chain over k in order: a row gets the same bits alone or in any batch (row-invariant).

The op is `torch.ops.eyas_cpu.blocked_linear(x, w, out_features, bias, residual)`, registered from C++,
so a compiled graph (an AOTInductor package too) calls it without Python. `build(directory)` compiles it
once per machine into `directory` (keyed by the source, torch, the compiler and the CPU), under a lock,
and loads it; later processes load the library they find.
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

BLOCK = 16  # output columns per packed block
SOURCE = Path(__file__).with_name("cpu_gemm.cpp")
FLAGS = ("-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-std=c++20", "-w")


class BuildError(RuntimeError):
    """The kernel could not be compiled or loaded here (no compiler, a compiler error)."""


_BUILD_LOCK = threading.Lock()
_loaded: Path | None = None


def is_loaded() -> bool:
    return _loaded is not None


def build(directory: str | os.PathLike) -> Path:
    """Compile the kernel into `directory` unless a build for this machine is there, and load it once per
    process. Returns the library's path; raises BuildError naming the compiler's complaint."""
    global _loaded
    with _BUILD_LOCK:
        if _loaded is not None:
            return _loaded
        directory = Path(directory).expanduser()
        library = directory / f"cpu_gemm-{_build_key()}.so"
        if not library.exists():
            _compile(library)
        try:
            torch.ops.load_library(str(library))
        except OSError as e:
            raise BuildError(f"could not load {library}: {e}") from e
        torch.library.register_fake("eyas_cpu::blocked_linear")(_blocked_linear_shape)
        _loaded = library
        return library


def pack(weight: torch.Tensor) -> torch.Tensor:
    """weight [N, K] -> [ceil(N / BLOCK), K, BLOCK] float32, the padding columns zero."""
    n, k = weight.shape
    blocks = -(-n // BLOCK)
    padded = torch.zeros(blocks * BLOCK, k, dtype=torch.float32, device=weight.device)
    padded[:n] = weight
    return padded.view(blocks, BLOCK, k).transpose(1, 2).contiguous()


def blocked_linear(x: torch.Tensor, packed: torch.Tensor, out_features: int, bias: torch.Tensor | None = None,
                   residual: torch.Tensor | None = None) -> torch.Tensor:
    """x [M, K] @ the packed weight -> [M, out_features] (+ bias [N]) (+ residual [M, N])."""
    return torch.ops.eyas_cpu.blocked_linear(x.contiguous(), packed, out_features, bias,
                                             None if residual is None else residual.contiguous())


def _blocked_linear_shape(x, w, out_features, bias=None, residual=None):
    return x.new_empty(x.shape[0], out_features)


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
                   *(f"-I{p}" for p in torch.utils.cpp_extension.include_paths()), str(SOURCE), "-o", partial,
                   *(f"-L{p}" for p in torch.utils.cpp_extension.library_paths()), "-lc10", "-ltorch_cpu",
                   *(f"-Wl,-rpath,{p}" for p in torch.utils.cpp_extension.library_paths())]
        try:
            try:
                done = subprocess.run(command, capture_output=True, text=True)
            except OSError as e:
                raise BuildError(f"cannot run the C++ compiler {compiler}: {e}") from e
            if done.returncode != 0:
                raise BuildError(f"{Path(compiler).name} failed on {SOURCE.name}: {done.stderr.strip()[-2000:]}")
            os.replace(partial, library)
        finally:
            with contextlib.suppress(OSError):
                os.unlink(partial)


@functools.cache
def _build_key() -> str:
    """What the library depends on: its source, torch, the compiler and flags, the CPU it targets."""
    compiler = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++") or ""
    version = ""
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        version = subprocess.run([compiler, "--version"], capture_output=True, text=True).stdout
    digest = hashlib.sha256()
    for part in (SOURCE.read_bytes(), torch.__version__.encode(), " ".join(FLAGS).encode(), version.encode(),
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
