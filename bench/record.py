"""The one output format of `python -m eyas.bench`: each subcommand writes `<out>/<name>.json`, a record of
the command that ran, the host it ran on, a flat table (one row per measured configuration) and the
subcommand's full results; `python -m eyas.engine.report <out>` turns records into report.md."""

import argparse
import json
import os
import platform
import shlex
import sys
from datetime import datetime, timezone
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import torch

FORMAT = 1  # the record's layout; `engine/report/benches.py` reads this version


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def host_facts() -> dict:
    """What a figure needs beside it to be read later: the machine, its threads, the software."""
    try:
        eyas_version = version("eyas")
    except PackageNotFoundError:
        eyas_version = "not installed"
    facts = {"cpu": cpu_name(), "cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(),
             "platform": platform.platform(), "python": platform.python_version(), "torch": torch.__version__,
             "eyas": eyas_version, "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}
    if torch.cuda.is_available():
        facts["gpu"] = torch.cuda.get_device_name()
    return facts


def add_out_argument(parser: argparse.ArgumentParser, name: str) -> None:
    parser.add_argument("--out", type=Path, default=Path("bench_out"),
                        help=f"the directory {name}.json (the record: command, host, table, results) and charts go to")


def write_record(out: Path, name: str, argv: list[str] | None, table: list[dict], results: dict) -> Path:
    """Write `out/<name>.json`; `table`'s rows are flat dicts of numbers and strings."""
    out.mkdir(parents=True, exist_ok=True)
    argv = sys.argv[1:] if argv is None else list(argv)
    record = {"format": FORMAT, "bench": name, "command": shlex.join(["python", "-m", "eyas.bench", name, *argv]),
              "host": host_facts(), "table": table, "results": results}
    path = out / f"{name}.json"
    path.write_text(json.dumps(record, indent=2, default=str))
    print(f"wrote {path}")
    return path


def scalars(row: dict) -> dict:
    """The row's numbers, strings and booleans: what a table cell holds."""
    return {k: v for k, v in row.items() if v is None or isinstance(v, (int, float, str, bool))}
