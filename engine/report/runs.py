"""The runs under a run or multirun directory: each `outputs.json` with the overrides that made it."""

import json
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from eyas.engine.errors import ConfigError


@dataclass
class Run:
    directory: Path  # relative to the report's root
    overrides: dict[str, str]  # key -> value as given on the command line
    metrics: dict = field(default_factory=dict)
    error: str | None = None  # the run failed before it generated: the error it raised

    @property
    def tokens_per_s(self) -> float | None:
        return self.metrics.get("tokens_per_s")

    @property
    def tau(self) -> float | None:
        return self.metrics.get("mean_accept_length")

    @property
    def acceptance(self) -> list[float]:
        return self.metrics.get("accept_rate_per_position") or []

    @property
    def failure(self) -> str:
        """'' for a clean run; else the error, or how many requests failed."""
        if self.error:
            return self.error
        failed = self.metrics.get("num_failed", 0)
        return f"{failed} of {self.metrics.get('num_requests', '?')} requests failed" if failed else ""


def _overrides(run_dir: Path, data: dict) -> dict[str, str]:
    saved = run_dir / ".hydra" / "overrides.yaml"
    items = yaml.safe_load(saved.read_text()) if saved.is_file() else data.get("overrides", [])
    out = {}
    for item in items or []:
        key, _, value = str(item).partition("=")
        out[key.lstrip("+~")] = value
    return out


def _order(path: Path) -> tuple:
    # multirun jobs are numbered directories: 2 before 10
    return tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in path.parts)


def collect_runs(root: str | Path) -> list[Run]:
    root = Path(root).expanduser()
    if not root.is_dir():
        raise ConfigError(f"report: no such directory: {root}")
    runs = []
    for path in sorted(root.rglob("outputs.json"), key=lambda p: _order(p.relative_to(root))):
        try:
            data = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise ConfigError(f"report: cannot read {path}: {e}") from e
        runs.append(Run(path.parent.relative_to(root), _overrides(path.parent, data), data.get("metrics", {}),
                        data.get("error")))
    if not runs:
        raise ConfigError(f"report: no outputs.json under {root} (point it at a run or multirun directory)")
    return runs


def swept_keys(runs: list[Run]) -> list[str]:
    """Override keys whose value differs between runs, in the order they were given."""
    keys = list(dict.fromkeys(k for run in runs for k in run.overrides))
    return [k for k in keys if len({run.overrides.get(k) for run in runs}) > 1]
