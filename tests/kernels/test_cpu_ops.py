"""eyas's C++ CPU kernels are built once per machine, shared through the cache root, rebuilt when what is
there cannot be loaded, and missed gracefully where nothing can build them."""

import os
import stat
import subprocess
import sys

import pytest

from eyas.kernels import cpu_ops

BUILD_AND_REPORT = """
import os, stat
from eyas.engine.cpu_ops import cpu_ops_error
from eyas.kernels import cpu_ops
print("error:", cpu_ops_error())
print("library:", cpu_ops.loaded_library())
print("mode:", oct(stat.S_IMODE(os.stat(cpu_ops.loaded_library()).st_mode)))
"""


def run(script: str, env: dict) -> list[str]:
    done = subprocess.run([sys.executable, "-c", script], env={**os.environ, **env}, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.splitlines()


@pytest.mark.slow  # builds the C++ library again: about 20 s
def test_a_library_that_cannot_be_loaded_is_built_again_readable_by_all(tmp_path):
    kernels = tmp_path / "kernels"
    kernels.mkdir()
    library = kernels / f"eyas_cpu-{cpu_ops._build_key()}.so"
    library.write_bytes(b"not a shared library")  # a truncated write, another machine's file, ...
    lines = run(BUILD_AND_REPORT, {"EYAS_CACHE_DIR": str(tmp_path)})
    assert lines[0] == "error: None" and lines[1] == f"library: {library}"
    umask = os.umask(0o022)
    os.umask(umask)
    assert lines[2] == f"mode: {oct(0o755 & ~umask)}"  # another user sharing the cache root can load it
    assert library.read_bytes()[:4] == b"\x7fELF" and not list(kernels.glob("*.partial*"))
    assert stat.S_IMODE(library.stat().st_mode) == 0o755 & ~umask


def test_without_a_compiler_the_layout_is_refused_and_auto_takes_another(tmp_path, gqa_checkpoint):
    """A machine that cannot build the kernel: `blocked` is a config error saying why, `auto` warns once and
    packs the layouts that run."""
    script = f"""
import warnings
from eyas import ConfigError, SamplingParams, build_engine
from eyas.engine.models.fused_linear import FusedLinear
base = ["model=tiny", "speculative=none", "draft=none", "model.path={gqa_checkpoint}"]
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    with build_engine(base) as eng:
        layouts = {{v.layout for m in eng.worker.runner.model.modules() for v in vars(m).values()
                   if isinstance(v, FusedLinear)}}
        out = eng.generate(prompt_token_ids=[[5, 9, 2]], sampling=SamplingParams(max_new_tokens=4, ignore_eos=True))
print("layouts:", sorted(layouts), len(out[0].token_ids))
print("warned:", any("CPU kernels are unavailable here" in str(w.message) for w in caught))
try:
    build_engine([*base, "model.weight_layout=blocked"])
except ConfigError as e:
    print("refused:", e)
"""
    env = {**os.environ, "EYAS_CACHE_DIR": str(tmp_path), "CXX": str(tmp_path / "no-such-compiler")}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("layouts:") and "blocked" not in lines[0] and lines[0].endswith(" 4")
    assert lines[1] == "warned: True"
    assert lines[2].startswith("refused: model.weight_layout=blocked runs float32 weights") and "no-such-compiler" in lines[2]
