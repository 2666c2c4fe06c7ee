"""The installed package holds every subpackage of the source tree (a non-editable install copies only
the packages pyproject.toml lists)."""

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_every_source_package_is_listed_in_pyproject():
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {str(init.parent.relative_to(ROOT)).replace("/", ".")
             for top in ("engine", "containers", "launch", "kernels") for init in (ROOT / top).rglob("__init__.py")}
    assert found - listed == set(), f"packages missing from pyproject.toml: {sorted(found - listed)}"
    assert listed - found <= {"engine.conf"}  # the config tree, installed from conf/
