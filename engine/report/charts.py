"""A report's charts: tokens/s and tau against each swept key, and acceptance by draft position."""

import re
from pathlib import Path

from eyas.engine.report.figures import as_numbers, pyplot, save
from eyas.engine.report.runs import Run


def _label(run: Run, keys: list[str]) -> str:
    return ", ".join(f"{k}={run.overrides.get(k, '-')}" for k in keys) or str(run.directory)


def metric_by_key(runs: list[Run], key: str, others: list[str], path: Path) -> Path:
    """tokens/s and tau against `key`; runs that differ in the `others` swept keys are separate series."""
    plt = pyplot()
    ok = [r for r in runs if r.tokens_per_s is not None]
    values = list(dict.fromkeys(r.overrides.get(key, "-") for r in ok))
    numbers = as_numbers(values)
    if numbers is not None:
        values = [v for _, v in sorted(zip(numbers, values))]
    position = {v: (float(v) if numbers is not None else i) for i, v in enumerate(values)}
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    series = {}
    for run in ok:
        series.setdefault(_label(run, others), []).append(run)
    for (ax, name, metric) in ((axes[0], "tokens/s", lambda r: r.tokens_per_s), (axes[1], "tau", lambda r: r.tau)):
        for i, (label, members) in enumerate(series.items()):
            members = sorted(members, key=lambda r: position[r.overrides.get(key, "-")])
            points = [(position[r.overrides.get(key, "-")], metric(r)) for r in members if metric(r) is not None]
            if points:
                ax.plot(*zip(*points), marker="o", color=f"C{i % 10}", label=label if others else None)
        ax.set_xlabel(key)
        ax.set_ylabel(name)
        ax.grid(alpha=0.3)
        if numbers is None:
            ax.set_xticks(range(len(values)), values)
        elif all(n == int(n) for n in numbers):
            ax.set_xticks(sorted(set(numbers)))
    if others and len(series) > 1:
        axes[0].legend(fontsize=7)
    fig.suptitle(f"{key}: {len(ok)} runs", fontsize=10)
    return save(fig, path)


def acceptance_by_position(runs: list[Run], keys: list[str], path: Path) -> Path | None:
    """Per-position acceptance (accepted at draft position i / verify cycles), one line per run."""
    spec = [r for r in runs if r.acceptance]
    if not spec:
        return None
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    for i, run in enumerate(spec):
        ax.plot(range(1, len(run.acceptance) + 1), run.acceptance, marker="o", color=f"C{i % 10}",
                label=_label(run, keys))
    ax.set_xlabel("draft position")
    ax.set_ylabel("acceptance (accepted / cycles)")
    ax.set_ylim(0, 1.02)
    ax.grid(alpha=0.3)
    if len(spec) <= 12:
        ax.legend(fontsize=7)
    return save(fig, path)


def chart_name(key: str) -> str:
    return "by_" + re.sub(r"[^A-Za-z0-9_-]+", "_", key) + ".png"
