"""eyas's entry points as the tests call them: on the tiny model shipped inside the package unless the
overrides choose a model group (the package's default, SmolLM2, is fetched once from the package index;
most tests run offline on the tiny pair and on fixtures written over its config)."""

import json
import subprocess
import sys

from eyas import build_engine as build_engine_of
from eyas.launch.compose import compose_config as compose_config_of
from eyas.launch.compose import with_group


def on_tiny(overrides) -> list[str]:
    return with_group(overrides, "model", "tiny")


def cli_on_tiny(args) -> list[str]:
    """A command line's arguments on the tiny model (last: after Hydra's flags such as -m and -cd)."""
    args = list(args)
    return args if on_tiny(args) == args else [*args, "model=tiny"]


def run_cli(*args, cwd, module="eyas"):
    """`python -m <module> args...` in a subprocess, as a user runs it (the installed package); eyas's
    own run on the tiny model unless `args` choose a model group."""
    if module == "eyas":
        args = cli_on_tiny(args)
    return subprocess.run([sys.executable, "-m", module, *args], cwd=cwd, capture_output=True, text=True, timeout=600)


def compose_config(overrides=(), config_name: str = "config") -> dict:
    return compose_config_of(on_tiny(overrides), config_name)


def build_engine(overrides=(), config: dict | None = None):
    return build_engine_of(overrides, config) if config is not None else build_engine_of(on_tiny(overrides))


def assert_cli_run_equals_plain(algorithm: str, tmp_path) -> None:
    """`python -m eyas speculative=<algorithm>` alone runs, speculates, and prints plain decoding's text."""
    proc = run_cli(f"speculative={algorithm}", "sampling.max_new_tokens=32", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "tau" in proc.stdout
    plain = run_cli("speculative=none", "sampling.max_new_tokens=32", cwd=tmp_path)
    outputs = sorted(tmp_path.glob("outputs/*/*/outputs.json"))
    texts = [json.loads(p.read_text())["outputs"][0]["text"] for p in outputs]
    assert plain.returncode == 0 and len(texts) == 2 and texts[0] == texts[1]
