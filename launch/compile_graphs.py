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


def lowest_priority() -> None:
    """Nice 19 for this process and everything it starts (inductor's workers, the C++ compiler). It runs in a
    session of its own (it outlives the engine), and Linux's autogroup scheduling shares the CPU between
    sessions as equals whatever their tasks' nice: a nice process of another session took half of each core
    from the engine's threads, which wait for each other at every parallel op. So its session's autogroup is
    lowered too, where the kernel has one."""
    os.nice(19)
    try:
        Path("/proc/self/autogroup").write_text("19")
    except OSError:  # no autogroup scheduling (kernel option, not Linux)
        pass


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print(f"usage: python {__file__} DIR/compile-<pid>.json", file=sys.stderr)
        return 2
    path = Path(argv[0])
    lowest_priority()  # the engine it serves decodes first
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
