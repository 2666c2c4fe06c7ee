"""BackgroundGraphs: `graphs.mode=auto` on CPU. The engine starts eager at once; another process compiles the
AOTInductor packages of every graph the configuration can run, and at a step boundary after it ends the
runners that load them are swapped in.

Why a process: compiling runs Python for minutes (tracing, inductor's code generation), which in the
engine's own process would hold the GIL between its steps; a process at a lower priority leaves decoding
its cores. The packages are keyed by torch, the model's structure and shapes and eyas's code
(`exported.py`), so the process that compiles them and the engine that loads them agree without talking;
a start that finds them all on disk swaps them in before its first step.

`install` swaps the runners in (the workers' `install_graphs`, a rebinding of their runtime states) and
says whether it did (None: not now, asked again at a later step); it loads packages only, never compiles.
`start_compiler` starts the process and returns it (a `subprocess.Popen`); `packages_since` counts the
packages written since a time, the compile's progress (logged as it grows, and in the metrics).
"""

import logging
import time
from collections.abc import Callable

from eyas.engine.graphs.tensor_places import NotExportable

log = logging.getLogger("eyas.graphs")

STATES = ("eager", "compiling", "graphs", "failed")  # `state`: eager until started; graphs once swapped in


class BackgroundGraphs:
    def __init__(self, install: Callable[[], bool | None], start_compiler: Callable[[], object], poll_interval_s: float = 0.5,
                 packages_since: Callable[[float], int] = lambda since: 0):
        self.install = install
        self.start_compiler = start_compiler
        self.packages_since = packages_since  # packages written since a time.time(): the compile's progress
        self.packages_written = 0
        self._started_wall = 0.0
        self.poll_interval_s = poll_interval_s  # a step checks the process at most this often
        self.state = "eager"
        self.compiler = None  # the compiling process, while it runs
        self.started_at: float | None = None
        self.compile_s = 0.0  # how long the process ran
        self.exit_code: int | None = None
        self.swapped_at_step: int | None = None  # the engine step before which the runners were swapped in
        self._steps = 0
        self._next_poll = 0.0

    def start(self) -> None:
        """Swap in packages an earlier run left, or start compiling them (unless a forward cannot be exported:
        then the engine stays eager)."""
        try:
            installed = self.install()
        except NotExportable as exc:
            log.warning("graphs.mode=auto: running eager: %s cannot be exported", exc)
            return
        if installed:
            self._swapped("loaded from an earlier run")
            return
        self._started_wall = time.time()
        self.compiler = self.start_compiler()
        self.started_at = time.perf_counter()
        self.state = "compiling"
        log.warning("graphs.mode=auto: running eager while a background process compiles the graphs (%s)",
                    " ".join(map(str, self.compiler.args[-3:])))

    def poll(self) -> None:
        """At a step boundary: once the process has ended, swap the runners in (or stay eager if it failed)."""
        self._steps += 1
        if self.state != "compiling" or time.perf_counter() < self._next_poll:
            return
        self._next_poll = time.perf_counter() + self.poll_interval_s
        if self.compiler is not None:
            self._progress()
            self.exit_code = self.compiler.poll()
            if self.exit_code is None:
                return
            self.compile_s = time.perf_counter() - self.started_at
            self.compiler = None
        try:
            installed = self.install() if self.exit_code == 0 else False
        except NotExportable:
            installed = False
        if installed:
            self._swapped(f"compiled in {self.compile_s:.0f} s")
        elif installed is not None:
            self.state = "failed"
            log.warning("graphs.mode=auto: the background compile %s after %.0f s; running eager",
                        f"exited with {self.exit_code}" if self.exit_code else "left packages that do not load",
                        self.compile_s)

    def _progress(self) -> None:
        written = self.packages_since(self._started_wall)
        if written > self.packages_written:
            self.packages_written = written
            log.info("graphs.mode=auto: %d graph package%s compiled in the background so far (%.0f s)", written,
                     "" if written == 1 else "s", time.perf_counter() - self.started_at)

    def _swapped(self, how: str) -> None:
        self.state = "graphs"
        self.swapped_at_step = self._steps
        log.warning("graphs.mode=auto: graph runners swapped in (%s)", how)

    def stats(self) -> dict:
        running = self.compiler is not None
        return {"graphs_state": self.state,
                "graphs_compile_s": time.perf_counter() - self.started_at if running else self.compile_s,
                "graphs_packages_compiled": self.packages_written}

    def close(self) -> None:
        """The engine is closing: a compile still running goes on, so that the next start loads its packages."""
        if self.compiler is not None and self.compiler.poll() is None:
            log.warning("graphs.mode=auto: the background compile (pid %s) goes on after this run; the next start "
                        "loads its packages", self.compiler.pid)
