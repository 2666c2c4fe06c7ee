"""What the package installs: every source package, all under the one import name `eyas`, beside
Hugging Face's `kernels` (which transformers imports) without either shadowing the other."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib
from support.source_tree import CODE_FOLDERS, ROOT


def test_every_source_package_is_listed_in_pyproject():
    """A non-editable install copies only the packages pyproject.toml lists."""
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(["eyas", *source.parent.relative_to(ROOT).parts])
             for top in CODE_FOLDERS for source in (ROOT / top).rglob("*.py")}
    assert found - listed == set(), f"packages missing from pyproject.toml: {sorted(found - listed)}"
    assert listed - found == {"eyas", "eyas.conf"}  # the root's __init__, and the config tree


def test_a_checkout_root_holds_no_top_level_package():
    """`python -m` puts the working directory first on sys.path: from a checkout's root, a folder with an
    `__init__.py` (or a module) named like another distribution's package would be imported instead of it."""
    shadowing = [p.name for p in ROOT.iterdir() if (p / "__init__.py").is_file() or p.suffix == ".py" and p.stem
                 not in ("__init__", "__main__")]
    assert shadowing == []


# Run in the fresh environment, from the directory it is started in: where each name comes from.
PROBE = """
import json
import eyas, eyas.engine.engine, eyas.launch.cli, eyas.kernels.cpu_ops
import kernels, transformers
from kernels import get_kernel
from eyas.launch.compose import config_dir
from pathlib import Path
print(json.dumps({
    "eyas": eyas.__file__, "engine": eyas.engine.engine.__file__, "cpu_ops": eyas.kernels.cpu_ops.__file__,
    "kernels": kernels.__file__, "get_kernel": get_kernel.__module__, "transformers": transformers.__version__,
    "config": (Path(config_dir()) / "config.yaml").is_file(),
}))
"""


@pytest.mark.slow  # builds a wheel in a new environment: about 20 s (.ci/run runs it)
def test_a_fresh_environment_imports_eyas_and_huggingface_kernels_side_by_side(tmp_path):
    """A non-editable install into a new virtual environment (the machine's packages visible beneath it,
    with transformers and Hugging Face's `kernels` among them), imported from the checkout's root and
    from elsewhere: eyas's modules come from the installed `eyas`, `kernels` from Hugging Face."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    install = subprocess.run([python, "-m", "pip", "install", "-q", "--no-deps",
                              "--force-reinstall", str(ROOT)], capture_output=True, text=True, env=env,
                             cwd=tmp_path, timeout=900)
    assert install.returncode == 0, install.stderr[-3000:]
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    for cwd in (ROOT, tmp_path):
        done = subprocess.run([python, "-c", PROBE], capture_output=True, text=True, env=env, cwd=cwd, timeout=300)
        assert done.returncode == 0, f"from {cwd}:\n{done.stderr[-3000:]}"
        found = json.loads(done.stdout.strip().splitlines()[-1])
        for name in ("eyas", "engine", "cpu_ops"):
            assert found[name].startswith(site + "/eyas/"), (cwd, name, found[name])
        assert "/eyas/" not in found["kernels"] and found["get_kernel"].startswith("kernels"), (cwd, found)
        assert found["config"], cwd
    (record,) = Path(site).glob("eyas-*.dist-info/RECORD")
    tops = {Path(line.split(",")[0]).parts[0] for line in record.read_text().splitlines()}
    assert tops <= {"eyas", record.parent.name, ".."}, f"installed outside `eyas`: {sorted(tops)}"  # ..: bin/
