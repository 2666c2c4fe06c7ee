"""`report.md` and its charts for a run or multirun directory, and the benchmark records under it."""

from pathlib import Path

import yaml

from eyas.engine.errors import ConfigError
from eyas.engine.report.benches import BenchRecord, collect_benches, host_line
from eyas.engine.report.charts import acceptance_by_position, chart_name, metric_by_key
from eyas.engine.report.runs import Run, collect_runs, swept_keys


def _cell(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.2f}" if abs(value) < 1000 else f"{value:.0f}"
    return str(value).replace("|", "\\|").replace("\n", " ")


def table(runs: list[Run], keys: list[str]) -> list[str]:
    header = ["run", *keys, "tokens/s", "tau", "acceptance by position", "failures"]
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    for run in runs:
        acceptance = " ".join(f"{a:.2f}" for a in run.acceptance) or "-"
        cells = [str(run.directory) or ".", *(run.overrides.get(k, "-") for k in keys), run.tokens_per_s, run.tau,
                 acceptance, run.failure or "-"]
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return lines


def best_section(root: Path) -> list[str]:
    """An Optuna sweep's best trial, from its `optimization_results.yaml`."""
    path = root / "optimization_results.yaml"
    if not path.is_file():
        return []
    results = yaml.safe_load(path.read_text()) or {}
    if "best_params" not in results:
        return []
    overrides = " ".join(f"{k}={v}" for k, v in results["best_params"].items())
    return ["## Best trial", "", f"objective {_cell(results.get('best_value'))} with `{overrides}`", ""]


def bench_section(record: BenchRecord) -> list[str]:
    """One benchmark record: its command (the heading), its host, its table."""
    columns = list(dict.fromkeys(k for row in record.table for k in row))
    lines = [f"## {record.command}", "", f"`{record.path}`: {host_line(record.host)}", "",
             "| " + " | ".join(columns) + " |", "|" + " --- |" * len(columns)]
    lines += ["| " + " | ".join(_cell(row.get(k)) for k in columns) + " |" for row in record.table]
    return lines + [""]


def runs_section(root: Path, runs: list[Run], charts: bool) -> list[str]:
    keys = swept_keys(runs)
    lines = [f"{len(runs)} run(s); swept: {', '.join(keys) or 'nothing'}", ""]
    lines += best_section(root)
    lines += ["## Runs", "", *table(runs, keys), ""]
    if charts:
        images = [metric_by_key(runs, key, [k for k in keys if k != key], root / chart_name(key)) for key in keys]
        images.append(acceptance_by_position(runs, keys, root / "acceptance_by_position.png"))
        images = [image for image in images if image is not None]
        if images:
            lines += ["## Charts", ""] + [f"![{image.stem}]({image.name})" for image in images] + [""]
    return lines


def write_report(root: str | Path, charts: bool = True) -> Path:
    """Write `root/report.md` (and its PNG charts beside it unless `charts` is False); returns its path."""
    root = Path(root).expanduser()
    if not root.is_dir():
        raise ConfigError(f"report: no such directory: {root}")
    benches = collect_benches(root)
    has_runs = next(root.rglob("outputs.json"), None) is not None
    if not has_runs and not benches:
        raise ConfigError(f"report: no outputs.json and no benchmark record under {root} (point it at a run, "
                          "a multirun or a `python -m eyas.bench --out` directory)")
    runs = collect_runs(root) if has_runs else []
    lines = [f"# Report: {root}", ""]
    if runs:
        lines += runs_section(root, runs, charts)
    for record in benches:
        lines += bench_section(record)
    path = root / "report.md"
    path.write_text("\n".join(lines))
    return path
