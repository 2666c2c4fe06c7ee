"""The records `python -m eyas.bench` writes (`<out>/<subcommand>.json`): each one's command, host and table."""

import json
from dataclasses import dataclass
from pathlib import Path

from eyas.engine.errors import ConfigError

FORMAT = 1  # the record layout this module reads (`bench/record.py` writes it)


@dataclass
class BenchRecord:
    path: Path  # relative to the report's root
    bench: str
    command: str
    host: dict
    table: list[dict]


def is_record(data) -> bool:
    return isinstance(data, dict) and {"bench", "command", "host", "table"} <= set(data)


def collect_benches(root: Path) -> list[BenchRecord]:
    records = []
    for path in sorted(root.rglob("*.json")):
        try:
            data = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError, UnicodeDecodeError):
            continue  # not a record: any other JSON a run left
        if not is_record(data):
            continue
        if data.get("format") != FORMAT:
            raise ConfigError(f"report: {path} is a bench record of format {data.get('format')!r}; this eyas reads "
                              f"format {FORMAT} (rerun the benchmark with this eyas)")
        records.append(BenchRecord(path.relative_to(root), data["bench"], data["command"], data["host"], data["table"]))
    return records


def host_line(host: dict) -> str:
    parts = [host.get("cpu", "?"), f"{host.get('cpus', '?')} CPUs", f"{host.get('torch_threads', '?')} torch threads"]
    if host.get("gpu"):
        parts.append(host["gpu"])
    parts += [f"torch {host.get('torch', '?')}", f"eyas {host.get('eyas', '?')}", host.get("date", "")]
    return ", ".join(p for p in parts if p)
