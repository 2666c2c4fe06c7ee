"""`graphs.mode=auto` on CPU: the engine's `BackgroundGraphs`, the process that compiles its packages, and how
the runners that load them are swapped into the live worker."""

import dataclasses
import importlib.util
import json
import logging
import os
import subprocess
import sys
from functools import partial

from eyas.containers.scope import ProviderScope
from eyas.engine.config.schema import Config
from eyas.engine.graphs.background import BackgroundGraphs
from eyas.engine.graphs.exported import package_dir
from eyas.engine.graphs.settings import GraphSettings
from eyas.engine.speculative.drafters.registry import PLAIN, needs_draft_model

COMPILER = "eyas.launch.compile_graphs"  # the module the compiling process runs (as a script: see start_compiler)
log = logging.getLogger("eyas.graphs")


def background_graphs(settings: GraphSettings, container, config: Config, max_batch_size: int,
                      batch_invariant: bool, graphs_per_query: bool) -> BackgroundGraphs | None:
    """None unless the graphs come in the background (`GraphSettings.background`), and for a target whose eager
    attention is batch-invariant (quantized activations, half precision) where graphs attend batched
    (`graphs_per_query` false: not float32 on a CPU): that rounds differently and would change its tokens at
    the swap, so it stays eager."""
    if not settings.background:
        return None
    if batch_invariant and not graphs_per_query:
        log.warning("graphs.mode=auto: running eager: the target attends batch-invariant (attention.batch_invariant, "
                    "on for quantized activations and half precision), which graphs do only in float32 on a CPU")
        return None
    return BackgroundGraphs(install=partial(install_runners, container, config.speculative.algorithm, max_batch_size),
                            start_compiler=partial(start_compiler, config),
                            packages_since=partial(packages_since, package_dir(config.graphs.cache_dir)))


def packages_since(directory, since: float) -> int:
    """Whole packages (`*.pt2`, written by a rename when complete) in `directory` modified since `since`."""
    try:
        return sum(1 for p in directory.glob("*.pt2") if not p.name.endswith(".partial.pt2")
                   and p.stat().st_mtime >= since)
    except OSError:  # a package replaced or removed while listed
        return 0


def install_runners(container, algorithm: str, max_batch_size: int) -> bool | None:
    """Swap runners that load the packages into the live worker; None (try again later) while a candidate's
    scope is open, whose exit restores the bindings it found."""
    if ProviderScope.open_for(container):
        return None
    worker = container.worker()
    if algorithm == PLAIN:
        return worker.install_graphs(container.decode_graph_later(), max_batch_size)
    speculative = container.speculative

    def runners_for(candidate):
        draft = speculative.draft_graph_later() if needs_draft_model(candidate.drafter or algorithm) else None
        return speculative.verify_graph_later(), draft

    return worker.install_graphs(runners_for, max_batch_size)


def start_compiler(config: Config) -> subprocess.Popen:
    """`python -m eyas.launch.compile_graphs` on this config with `graphs.mode=aot`, at a lower priority, its
    output in a log beside the packages; it outlives the engine if it must (its packages serve the next start)."""
    directory = package_dir(config.graphs.cache_dir)
    directory.mkdir(parents=True, exist_ok=True)
    values = dataclasses.asdict(config)
    values["graphs"].update(mode="aot", warmup=True)
    values["server"] = None
    name = f"compile-{os.getpid()}"
    (directory / f"{name}.json").write_text(json.dumps(values))
    with open(directory / f"{name}.log", "w") as log:
        # run as a file, not `-m`: `-m` imports the package (torch) first, and a second process waiting for
        # the first's lock would hold that memory the whole time
        script = importlib.util.find_spec(COMPILER).origin
        return subprocess.Popen([sys.executable, script, str(directory / f"{name}.json")], stdout=log,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
