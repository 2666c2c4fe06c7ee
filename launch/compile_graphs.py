"""`python -m eyas.launch.compile_graphs CONFIG.json`: the process `graphs.mode=auto` starts. It builds the
engine of a resolved config (`graphs.mode=aot`, `graphs.warmup=true`), which compiles the package of every
graph the config can run into the cache directory, and exits; the engine that started it loads them.

It runs at the lowest priority (below the engine it serves), and one at a time per cache directory: a second
waits for the first, then finds its packages on disk and loads them instead of compiling.
"""

import fcntl
import json
import os
import sys
import time
from pathlib import Path

from eyas.containers.build import container_of
from eyas.engine.graphs.exported import package_dir


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m eyas.launch.compile_graphs CONFIG.json", file=sys.stderr)
        return 2
    path = Path(argv[0])
    config = json.loads(path.read_text())
    os.nice(19)  # the lowest priority: the engine it serves decodes first
    directory = package_dir(config["graphs"]["cache_dir"])
    directory.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    with open(directory / "compile.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the process ends, however it ends
        container_of(config).engine()  # graphs.warmup: every package compiled (or found) now
    path.unlink(missing_ok=True)
    print(f"graphs compiled in {time.perf_counter() - start:.1f} s into {directory}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
