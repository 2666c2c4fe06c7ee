"""`python -m eyas.engine.report DIR [--no-charts]`: report.md and PNG charts for a run or multirun directory."""

import argparse
import sys

from eyas.engine.errors import EyasError
from eyas.engine.report.write import write_report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m eyas.engine.report", description=__doc__.split(":", 1)[1].strip())
    parser.add_argument("directory", help="a run or multirun directory (its runs' outputs.json are read)")
    parser.add_argument("--no-charts", action="store_true", help="write report.md only (no matplotlib needed)")
    args = parser.parse_args(argv)
    try:
        path = write_report(args.directory, charts=not args.no_charts)
    except EyasError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    charts = sorted(p.name for p in path.parent.glob("*.png"))
    print(f"wrote {path}" + (f" and {len(charts)} chart(s): {', '.join(charts)}" if charts else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
