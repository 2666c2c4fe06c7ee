"""graphs.mode=auto: the engine starts eager, a background process compiles the packages, and the runners
that load them are swapped in at a step boundary, as a rebinding; a start that finds the packages loads them
before its first step, a package that does not load is removed (to be compiled again), and a model that
cannot be exported stays eager without starting a process.

The compiling process is stood in for here (`FakeCompiler`): the packages come from an aot engine of the
same config, as the process would write them. The process itself runs in the slow CLI test.
"""

import functools
import importlib.util
import logging
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support import build_engine, cli_on_tiny
from support.engines import PROMPTS, engine_overrides
from support.packages import aot, packages

from eyas import SamplingParams
from eyas.containers import background_graphs
from eyas.engine.graphs.background import BackgroundGraphs
from eyas.engine.graphs.tensor_places import NotExportable

GREEDY = SamplingParams(max_new_tokens=24, ignore_eos=True)
SAMPLED = SamplingParams(max_new_tokens=24, ignore_eos=True, temperature=0.8, top_p=0.9, seed=7)
PARAMS = [GREEDY if i % 2 == 0 else SAMPLED for i in range(len(PROMPTS))]


class FakeCompiler:
    """The compiling process: still running until `code` is set."""

    pid = 0
    args = ["python", "-m", background_graphs.COMPILER, "config.json"]

    def __init__(self):
        self.code = None

    def poll(self):
        return self.code


@pytest.fixture
def compilers(monkeypatch) -> list[FakeCompiler]:
    """The compiling processes the engines start (none starts a real one)."""
    started = []

    def start(config):
        started.append(FakeCompiler())
        return started[-1]

    monkeypatch.setattr(background_graphs, "start_compiler", start)
    return started


def auto(cache) -> list[str]:
    return ["graphs.mode=auto", f"graphs.cache_dir={cache}"]


def compiled(overrides: list[str], cache) -> None:
    """The packages of a config, as the background process compiles them (an aot engine's warmup)."""
    build_engine([*overrides, *aot(cache)]).close()


def run_swapping(eng, compiler: FakeCompiler, packages_from, cache, prompts, params, eager_steps: int = 3):
    """Outputs of `prompts`, the packages landing and the process ending after `eager_steps` steps."""
    eng.graphs.poll_interval_s = 0
    requests = eng.submit(prompts, params)
    for _ in range(eager_steps):
        eng.step()
    assert eng.graphs.state == "compiling" and eng.has_work()
    shutil.copytree(packages_from / "eyas-aot", cache / "eyas-aot", dirs_exist_ok=True)
    compiler.code = 0
    while eng.has_work():
        eng.step()
    assert eng.graphs.state == "graphs" and eng.graphs.swapped_at_step == eager_steps + 1
    return [eng.output(r).token_ids for r in requests]


def test_a_swap_between_two_steps_of_a_running_batch_keeps_plain_decodings_tokens(
        gqa_checkpoint, plain_reference, aot_cache, compilers, tmp_path):
    plain = engine_overrides(gqa_checkpoint, "none")
    compiled(plain, aot_cache)
    with build_engine([*plain, *auto(tmp_path)]) as eng:
        assert eng.graphs.state == "compiling" and len(compilers) == 1 and eng.worker.graph is None
        outs = run_swapping(eng, compilers[0], aot_cache, tmp_path, PROMPTS, PARAMS)
        assert eng.worker.graph.num_runs > 0 and eng.scheduler.kv.all_free()
        assert eng.metrics()["graphs_state"] == "graphs"
    assert outs == plain_reference(gqa_checkpoint, PROMPTS, PARAMS)


@pytest.mark.slow  # the target's and the head's packages of a speculative config: about 90 s cold
def test_a_swap_mid_run_rebinds_every_candidates_state_and_stays_lossless(spec_pair, plain_reference, aot_cache,
                                                                         compilers, tmp_path):
    target, heads = spec_pair
    spec = engine_overrides(target, "eagle3", head=heads["eagle3"], num_steps=None)  # adaptive tiers
    compiled(spec, aot_cache)
    with build_engine([*spec, *auto(tmp_path)]) as eng:
        worker = eng.worker
        before = dict(worker.candidate_states)
        assert len(before) > 1 and all(s.verify_graph is None for s in before.values())
        outs = run_swapping(eng, compilers[0], aot_cache, tmp_path, PROMPTS, PARAMS)
        after = worker.candidate_states
        assert set(after) == set(before) and all(after[c] is not before[c] for c in before)
        assert all(s.verify_graph is not None for s in after.values())
        assert worker.state is after[worker.state.candidate]  # the live state is a swapped one
        assert any(s.verify_graph.num_runs > 0 for s in after.values())
        head = worker.drafter.head  # the contract: the head runner's backend is the draft-extend backend
        assert head.runner.attn_backend is head.draft_extend_backend
        assert worker.state.draft_extend_backend in (None, head.draft_extend_backend)
    assert outs == plain_reference(target, PROMPTS, PARAMS)


def test_a_second_start_loads_the_packages_before_its_first_step(gqa_checkpoint, plain_reference, aot_cache,
                                                                 compilers):
    plain = engine_overrides(gqa_checkpoint, "none")
    compiled(plain, aot_cache)
    written = packages(aot_cache)
    with build_engine([*plain, *auto(aot_cache)]) as eng:
        assert eng.graphs.state == "graphs" and not compilers and eng.worker.graph is not None
        outs = eng.generate(PROMPTS, PARAMS)
        assert eng.worker.graph.num_runs > 0
    assert packages(aot_cache) == written
    assert [o.token_ids for o in outs] == plain_reference(gqa_checkpoint, PROMPTS, PARAMS)


def test_a_package_that_does_not_load_is_removed_and_compiled_again(gqa_checkpoint, aot_cache, compilers, tmp_path):
    plain = engine_overrides(gqa_checkpoint, "none")
    compiled(plain, aot_cache)
    shutil.copytree(aot_cache / "eyas-aot", tmp_path / "eyas-aot")
    cut = sorted((tmp_path / "eyas-aot").glob("*.pt2"))  # every package of the shared cache, cut short
    for package in cut:
        package.write_bytes(package.read_bytes()[:1000])
    with build_engine([*plain, *auto(tmp_path)]) as eng:
        assert eng.graphs.state == "compiling" and len(compilers) == 1 and eng.worker.graph is None
    assert any(not package.exists() for package in cut)  # the first one the engine needed


def test_a_target_that_cannot_be_exported_stays_eager_and_starts_no_process(gqa_checkpoint, compilers, tmp_path):
    quantized = engine_overrides(gqa_checkpoint, "none", "model.quantization=int8", "attention.batch_invariant=false")
    with build_engine([*quantized, *auto(tmp_path)]) as eng:
        assert eng.graphs.state == "eager" and not compilers and eng.worker.graph is None
        eng.generate(PROMPTS[:1], GREEDY)


def test_a_target_that_attends_batch_invariant_stays_eager(gqa_checkpoint, compilers, tmp_path):
    """Half precision attends one query per call eager; its graphs attend batched (eyas's paged op reads
    float32 pools), which would change its tokens at the swap."""
    with build_engine([*engine_overrides(gqa_checkpoint, "none", "model.dtype=float16"), *auto(tmp_path)]) as eng:
        assert eng.graphs is None and not compilers and eng.worker.graph is None
        assert eng.worker.runner.attn_backend.batch_invariant


def test_the_swap_waits_while_a_candidates_scope_is_open_and_a_failed_compile_leaves_it_eager():
    answers = [False, None, True]
    graphs = BackgroundGraphs(install=lambda: answers.pop(0), start_compiler=FakeCompiler, poll_interval_s=0)
    graphs.start()
    graphs.poll()
    assert graphs.state == "compiling"
    graphs.compiler.code = 0
    graphs.poll()  # install said "not now" (a scope is open)
    assert graphs.state == "compiling" and graphs.stats()["graphs_state"] == "compiling"
    graphs.poll()
    assert graphs.state == "graphs" and graphs.swapped_at_step == 3
    failed = BackgroundGraphs(install=lambda: False, start_compiler=FakeCompiler, poll_interval_s=0)
    failed.start()
    failed.compiler.code = 1
    failed.poll()
    assert failed.state == "failed"

    def not_exportable():
        raise NotExportable("a packed kernel")

    eager = BackgroundGraphs(install=not_exportable, start_compiler=pytest.fail)
    eager.start()
    assert eager.state == "eager" and eager.compiler is None


@pytest.mark.slow  # compiles the tiny pair's packages in a real background process: a few minutes
def test_the_command_line_compiles_in_the_background_and_a_second_start_loads(tmp_path):
    command = [sys.executable, "-m", "eyas", *cli_on_tiny([*auto(tmp_path / "cache"), "sampling.max_new_tokens=8"])]
    first = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert first.returncode == 0 and "running eager while a background process compiles" in first.stdout + first.stderr
    lock = tmp_path / "cache" / "eyas-aot" / "compile.lock"
    deadline = time.monotonic() + 900
    while not list(lock.parent.glob("compile-*.log")) or not any(
            "graphs compiled in" in log.read_text() for log in lock.parent.glob("compile-*.log")):
        assert time.monotonic() < deadline, "the background compile did not end"
        time.sleep(2)
    second = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert second.returncode == 0 and "swapped in (loaded from an earlier run)" in second.stdout + second.stderr
    assert "graphs graphs" in second.stdout  # the summary line


def test_a_batch_invariant_targets_verify_runner_leaves_trees_to_eager():
    """A graph's tree nodes sit at their columns, not where the accepted path's decodes read them: the
    verify runner of a target that attends batch-invariant takes chains only."""
    from types import SimpleNamespace

    from eyas.engine.graphs.graph_runner import GraphRunner
    from eyas.engine.graphs.settings import GraphSettings

    settings = GraphSettings("aot", (1, 2, 4), (256,), None, background=True)
    chain = SimpleNamespace(batch_size=2, extend_lens=[4, 4], seq_lens=[9, 12], custom_mask=None)
    tree = SimpleNamespace(batch_size=2, extend_lens=[4, 4], seq_lens=[9, 12], custom_mask=object())
    both = GraphRunner(None, None, None, settings, "verify")
    chains = GraphRunner(None, None, None, settings, "verify", chains_only=True)
    assert both.fits(chain) and both.fits(tree)
    assert chains.fits(chain) and not chains.fits(tree)


@pytest.mark.skipif(not Path("/proc/self/autogroup").is_file(), reason="the kernel schedules no autogroups")
def test_the_compiling_process_lowers_its_sessions_autogroup_as_well_as_its_nice():
    """The compiler runs in a session of its own; Linux shares a CPU between sessions' autogroups as equals,
    whatever their tasks' nice, so a nice-19 compiler alone took half of each core from the engine. It
    lowers its autogroup too (what it starts, the C++ compiler's processes included, inherits both)."""
    code = ("import os, runpy; ns = runpy.run_path(%r); ns['lowest_priority']();"
            "print(os.getpriority(os.PRIO_PROCESS, 0), open('/proc/self/autogroup').read())"
            % importlib.util.find_spec(background_graphs.COMPILER).origin)
    ran = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         start_new_session=True)  # as start_compiler starts it
    assert ran.returncode == 0, ran.stderr
    nice, autogroup = ran.stdout.split(maxsplit=1)
    assert nice == "19" and autogroup.split()[-1] == "19", ran.stdout


def test_the_compiles_progress_is_logged_and_counted_as_its_packages_land(tmp_path, caplog):
    """The packages the background process has written so far are its progress: logged as they grow, in
    the engine's metrics (`graphs_packages_compiled`) and the server's `/metrics`; counted from the package
    directory (whole packages only, written since the compile started)."""
    directory = tmp_path / "eyas-aot"
    directory.mkdir()
    old = directory / "old.pt2"
    old.write_bytes(b"x")
    os.utime(old, (1, 1))  # an earlier run's package
    graphs = BackgroundGraphs(install=lambda: False, start_compiler=FakeCompiler, poll_interval_s=0,
                              packages_since=functools.partial(background_graphs.packages_since, directory))
    with caplog.at_level(logging.INFO, logger="eyas.graphs"):
        graphs.start()
        graphs.poll()
        assert graphs.stats()["graphs_packages_compiled"] == 0
        (directory / "a.pt2").write_bytes(b"x")
        (directory / "b.123.partial.pt2").write_bytes(b"x")  # being written
        graphs.poll()
        assert graphs.stats()["graphs_packages_compiled"] == 1
        (directory / "b.pt2").write_bytes(b"x")
        graphs.poll()
    assert graphs.stats()["graphs_packages_compiled"] == 2 and graphs.state == "compiling"
    assert "1 graph package compiled in the background so far" in caplog.text
    assert "2 graph packages compiled in the background so far" in caplog.text
