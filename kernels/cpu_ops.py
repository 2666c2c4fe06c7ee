"""eyas's C++ CPU ops (`cpu_gemm.cpp`, `cpu_quant_gemm.cpp`, `cpu_int8_dot_gemm.cpp`, `cpu_attention.cpp`,
`cpu_norm.cpp`, `cpu_keyed_noise.cpp`), one library built with the system's C++ compiler on first use.

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
import shlex
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

SOURCES = tuple(Path(__file__).with_name(name) for name in ("cpu_gemm.cpp", "cpu_quant_gemm.cpp", "cpu_int8_dot_gemm.cpp",
                                                            "cpu_attention.cpp", "cpu_norm.cpp", "cpu_keyed_noise.cpp"))
HEADERS = tuple(Path(__file__).with_name(name) for name in ("block_epilogue.h",))
FLAGS = ("-O3", "-march=native", "-fopenmp", "-fPIC", "-std=c++20", "-w")


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
        library = Path(directory).expanduser() / f"eyas_cpu-{_build_key()}.so"
        if not _registered():  # a second library registering the same ops would abort the process
            if not library.exists():
                _compile(library)
            try:
                torch.ops.load_library(str(library))
            except OSError:  # a truncated or foreign file where the library should be: built again, once
                _compile(library, replace=True)
                try:
                    torch.ops.load_library(str(library))
                except OSError as e:
                    raise BuildError(f"could not load {library}: {e}") from e
            torch.library.register_fake("eyas_cpu::blocked_linear")(_blocked_linear_shape)
            torch.library.register_fake("eyas_cpu::quant_block_linear")(_quant_block_linear_shape)
            torch.library.register_fake("eyas_cpu::int8_dot_linear")(_int8_dot_linear_shape)
            torch.library.register_fake("eyas_cpu::paged_attention")(_paged_attention_shape)
            torch.library.register_fake("eyas_cpu::rms_norm")(_rms_norm_shape)
            torch.library.register_fake("eyas_cpu::keyed_uniforms")(_keyed_uniforms_shape)
        _loaded = library
        return library


def _registered() -> bool:
    try:
        torch.ops.eyas_cpu.blocked_linear
    except (AttributeError, RuntimeError):
        return False
    return True


def _blocked_linear_shape(x, w, out_features, bias=None, residual=None):
    return x.new_empty(x.shape[0], out_features)


def _quant_block_linear_shape(x, codes, scales, offsets, out_features, bias=None, residual=None):
    return x.new_empty(x.shape[0], out_features)


def _int8_dot_linear_shape(x, codes, scales, offsets, bits, out_features, bias=None, residual=None):
    return x.new_empty(x.shape[0], out_features)


def _rms_norm_shape(x, weight, eps):
    return torch.empty_like(x)


def _keyed_uniforms_shape(keys, token_ids):
    return keys.new_empty((keys.shape[0], token_ids.shape[-1]), dtype=torch.float32)


def _paged_attention_shape(q, k_cache, v_cache, context_slots, mask, scale):
    return torch.empty_like(q)


def _compiler() -> list[str]:
    if os.environ.get("CXX"):
        return shlex.split(os.environ["CXX"])  # "ccache g++" too
    found = shutil.which("c++") or shutil.which("g++")
    if found is None:
        raise BuildError("no C++ compiler found (set CXX, or install g++)")
    return [found]


def _compile(library: Path, replace: bool = False) -> None:
    """Build the library at `library` (objects, then linked against torch and torch's own OpenMP runtime),
    under a lock shared with other processes; `replace`: even where one exists."""
    compiler = _compiler()
    try:
        library.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.ExitStack() as stack:
            with contextlib.suppress(OSError):  # unlockable (NFS): build anyway, to a file of our own
                lock = stack.enter_context(open(library.with_suffix(".lock"), "a"))
                if fcntl is not None:
                    fcntl.flock(lock, fcntl.LOCK_EX)
            if library.exists() and not replace:  # another process built it while we waited
                return
            work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix=library.name + ".", dir=library.parent)))
            defines = [f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}",
                       *(f"-I{p}" for p in torch.utils.cpp_extension.include_paths())]
            objects = []
            for source in SOURCES:
                objects.append(work / f"{source.stem}.o")
                _run([*compiler, *FLAGS, *defines, "-c", str(source), "-o", str(objects[-1])], compiler)
            libraries = torch.utils.cpp_extension.library_paths()
            openmp = _torch_openmp()  # linked by path: one OpenMP runtime in the process, torch's
            partial = work / library.name
            _run([*compiler, "-shared", *map(str, objects), "-o", str(partial), *(f"-L{p}" for p in libraries),
                  "-lc10", "-ltorch_cpu", *([openmp] if openmp else ["-fopenmp"]),
                  *(f"-Wl,-rpath,{p}" for p in libraries)], compiler)
            umask = os.umask(0o022)
            os.umask(umask)
            os.chmod(partial, 0o755 & ~umask)  # readable by whoever shares the cache root, as a plain build is
            os.replace(partial, library)
    except OSError as e:
        raise BuildError(f"cannot build {library}: {e}") from e


def _run(command: list[str], compiler: list[str]) -> None:
    try:
        done = subprocess.run(command, capture_output=True, text=True)
    except OSError as e:
        raise BuildError(f"cannot run the C++ compiler {' '.join(compiler)}: {e}") from e
    if done.returncode != 0:
        raise BuildError(f"{Path(compiler[-1]).name} failed building eyas's CPU kernels: {done.stderr.strip()[-2000:]}")


def _torch_openmp() -> str | None:
    """The OpenMP runtime this process runs torch with (its own libgomp or libiomp5, under torch's lib
    directory first), or None where none is mapped (then the compiler's own is linked)."""
    found = set()
    with contextlib.suppress(OSError):
        with open("/proc/self/maps") as maps:
            for line in maps:
                parts = line.split()
                if len(parts) >= 6 and Path(parts[5]).name.startswith(("libgomp", "libiomp5", "libomp")):
                    found.add(parts[5])
    torch_lib = tuple(torch.utils.cpp_extension.library_paths())
    for path in sorted(found, key=lambda p: (not p.startswith(torch_lib), p)):
        if os.path.isfile(path):
            return path
    return None


@functools.cache
def _build_key() -> str:
    """What the library depends on: its sources, torch, the compiler and flags, the CPU it targets."""
    version = ""
    with contextlib.suppress(OSError, subprocess.SubprocessError, BuildError):
        version = " ".join(_compiler()) + subprocess.run([*_compiler(), "--version"], capture_output=True, text=True).stdout
    digest = hashlib.sha256()
    for part in (*(s.read_bytes() for s in (*SOURCES, *HEADERS)), torch.__version__.encode(), " ".join(FLAGS).encode(), version.encode(),
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
