"""`python .../eyas/launch/compile_graphs.py DIR/compile-<pid>.json`: the process `graphs.mode=auto` starts. It
builds the engine of a resolved config (`graphs.mode=aot`, `graphs.warmup=true`), which compiles the package
of every graph the config can run into the package directory `DIR` the config file lies in, and exits; the
engine that started it loads them.

It runs at the lowest priority (below the engine it serves), and one at a time per package directory: a
second waits for the first before it imports anything large, then finds the packages on disk and loads them
instead of compiling.
"""

import fcntl
import json
import os
import sys
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print(f"usage: python {__file__} DIR/compile-<pid>.json", file=sys.stderr)
        return 2
    path = Path(argv[0])
    os.nice(19)  # the lowest priority: the engine it serves decodes first
    start = time.perf_counter()
    with open(path.parent / "compile.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the process ends, however it ends
        from eyas.containers.build import container_of  # torch and the engine: only once it is this one's turn

        container_of(json.loads(path.read_text())).engine()  # graphs.warmup: every package compiled (or found) now
    path.unlink(missing_ok=True)
    print(f"graphs compiled in {time.perf_counter() - start:.1f} s into {path.parent}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
