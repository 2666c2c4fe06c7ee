"""Reports of runs and sweeps: `python -m eyas.engine.report DIR` reads every run's `outputs.json` under DIR
and writes `DIR/report.md` (a table of the swept keys, tokens/s, tau, per-position acceptance and
failures) and PNG charts (tokens/s and tau against each swept key, acceptance by position)."""

from eyas.engine.report.runs import Run, collect_runs, swept_keys
from eyas.engine.report.write import write_report

__all__ = ["Run", "collect_runs", "swept_keys", "write_report"]
