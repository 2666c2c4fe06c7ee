"""Graph runners (graphs.mode=compile): compiled forwards give the eager engine's tokens, each runtime
state holds its own verify runner built under the candidate scope, and what a graph cannot run (a
prefill, a batch past the largest bucket, a context past the last bucket) runs eager.

Every lossless test runs with graphs too: `EYAS_TEST_GRAPHS=compile python -m pytest tests/e2e/test_spec_lossless.py`.
"""

import subprocess
import sys

import pytest
from support import build_engine, compose_config
from support.engines import PROMPTS, engine_overrides

from eyas import SamplingParams
from eyas.containers.adaptive import build_candidate_states
from eyas.containers.build import build_container
from eyas.engine.errors import ConfigError
from eyas.engine.graphs.settings import graph_settings, validate_graphs
from eyas.engine.speculative.bindings import snapshot_bindings
from eyas.engine.speculative.candidate import Candidate

COMPILE = "graphs.mode=compile"
GREEDY = SamplingParams(max_new_tokens=12, ignore_eos=True)
SAMPLED = SamplingParams(max_new_tokens=12, ignore_eos=True, temperature=0.8, top_p=0.9, seed=7)


@pytest.mark.slow  # compiles the decode graphs; aot's are compiled by default
@pytest.mark.parametrize("prompts", [PROMPTS[:1], PROMPTS], ids=["one", "ragged-batch"])
def test_compiled_plain_decoding_equals_eager(gqa_checkpoint, plain_reference, prompts):
    params = [GREEDY if i % 2 == 0 else SAMPLED for i in range(len(prompts))]
    with build_engine(engine_overrides(gqa_checkpoint, "none", COMPILE)) as eng:
        outs = eng.generate(prompts, params)
        assert eng.worker.graph.num_runs > 0 and eng.scheduler.kv.all_free()
    assert [o.token_ids for o in outs] == plain_reference(gqa_checkpoint, prompts, params)


@pytest.mark.slow  # compiles the target's verify and the head's step graphs: about 45 s cold (the runners'
# bindings per state are checked by default, and aot decoding compiles)
@pytest.mark.parametrize("shape", [dict(num_steps=3), dict(num_steps=3, topk=2)],
                         ids=["chain", "tree"])
def test_compiled_verify_is_lossless(spec_pair, plain_reference, shape):
    target, heads = spec_pair
    with build_engine(engine_overrides(target, "eagle3", COMPILE, head=heads["eagle3"], **shape)) as eng:
        outs = eng.generate(PROMPTS, GREEDY)
        state = eng.worker.state
        assert state.verify_graph.num_runs > 0 and state.draft_graph.num_runs > 0
    assert [o.token_ids for o in outs] == plain_reference(target, PROMPTS, GREEDY)


@pytest.mark.slow
def test_warmup_compiles_at_start_exactly_the_shapes_the_config_runs(spec_pair):
    target, heads = spec_pair
    overrides = engine_overrides(target, "eagle3", COMPILE, head=heads["eagle3"], num_steps=None)  # adaptive chains
    with build_engine(overrides) as eng:
        state = eng.worker.state
        # verify: one request or several, of several tokens (k >= 1) and of one (the batch-8 tier's k = 0)
        assert state.verify_graph.forward(False).shapes_seen == {(True, False), (False, False), (True, True), (False, True)}
        assert not state.verify_graph.forward(True).shapes_seen  # no tree candidate: no tree graph
        assert state.draft_graph.forward(False).shapes_seen == {(True, True), (False, True)}  # draft steps: one token
        assert eng.worker.counters.num_verify_cycles == 0  # nothing ran: warmup touched only scratch rows
    with build_engine([*overrides, "graphs.warmup=false"]) as eng:
        assert not eng.worker.state.verify_graph.forward(False).shapes_seen


def test_a_prefill_of_equal_prompts_runs_eager(gqa_checkpoint):
    with build_engine(engine_overrides(gqa_checkpoint, "none", COMPILE)) as eng:
        eng.generate(prompt_token_ids=[[0, 5, 6, 7]] * 2, sampling=SamplingParams(max_new_tokens=1))  # the prefill only
        assert eng.worker.graph.num_runs == 0


def test_what_a_graph_cannot_run_runs_eager(gqa_checkpoint, plain_reference):
    overrides = engine_overrides(gqa_checkpoint, "none", COMPILE, "graphs.batch_sizes=[2]", "graphs.max_context=[8]")
    with build_engine(overrides) as eng:
        graph = eng.worker.graph
        # three requests: past the largest bucket, every step eager
        outs = eng.generate(PROMPTS[:3], GREEDY)
        assert graph.num_runs == 0
        # one short request: graphed until its context passes 8 tokens, eager after
        eng.generate(["x"], SamplingParams(max_new_tokens=12, ignore_eos=True))
        assert 0 < graph.num_runs < 11
    assert [o.token_ids for o in outs] == plain_reference(gqa_checkpoint, PROMPTS[:3], GREEDY)


@pytest.mark.slow
def test_logprobs_requests_run_exact_and_eager_beside_graphed_ones(spec_pair):
    """A forward that carries a logprobs request runs eager and exact (`ForwardBatch.exact`) under a
    compiled engine too: its logprobs equal the compiled plain engine's bit for bit."""
    target, heads = spec_pair
    params = SamplingParams(max_new_tokens=12, ignore_eos=True, logprobs=2)
    runs = []
    for algorithm in ("none", "eagle3"):
        with build_engine(engine_overrides(target, algorithm, COMPILE, head=heads.get(algorithm))) as eng:
            runs.append(eng.generate(PROMPTS[:2], params))
            graphed = eng.worker.graph if algorithm == "none" else eng.worker.state.verify_graph
            assert graphed.num_runs == 0  # every forward carried a logprobs request
            eng.generate(PROMPTS[:2], GREEDY)
            assert graphed.num_runs > 0
    assert [(o.token_ids, o.logprobs) for o in runs[0]] == [(o.token_ids, o.logprobs) for o in runs[1]]


def test_every_candidate_state_holds_its_own_verify_runner_built_in_scope(spec_pair):
    target, heads = spec_pair
    container = build_container(compose_config(engine_overrides(target, "eagle3", COMPILE, head=heads["eagle3"])))
    worker = container.spec_worker()
    before = snapshot_bindings(worker)
    states = build_candidate_states(container, [Candidate(k) for k in (1, 2, 5)] + [Candidate(3, 2, 6)])
    assert all(a is b for a, b in zip(snapshot_bindings(worker).values(), before.values()))
    runners = [s.verify_graph for s in states.values()]
    assert all(r is not None for r in runners) and len({id(r) for r in runners}) == len(runners)
    draft_runners = {id(s.draft_graph) for s in states.values() if s.draft_graph is not None}
    assert len(draft_runners) == len(states)
    assert worker.state.verify_graph is states[Candidate(3)].verify_graph
    # runners of one target share its compiled graphs: one per structure, whatever the candidate
    assert len({id(r.forward(False)) for r in runners}) == 1 and runners[0].forward(True) is not runners[0].forward(False)
    worker.apply_runtime_state(states[Candidate(5)])
    assert worker.state.verify_graph is states[Candidate(5)].verify_graph


def test_eager_builds_no_runner(gqa_checkpoint, spec_pair):
    with build_engine(engine_overrides(gqa_checkpoint, "none")) as eng:
        assert eng.worker.graph is None
    target, heads = spec_pair
    with build_engine(engine_overrides(target, "eagle3", head=heads["eagle3"])) as eng:
        assert eng.worker.state.verify_graph is None and eng.worker.state.draft_graph is None


@pytest.mark.parametrize("field, value, message", [
    ("mode", "cuda_graphs", "graphs.mode must be one of ['auto', 'aot', 'compile', 'eager']"),
    ("batch_sizes", [0, 2], "graphs.batch_sizes must be a non-empty list of integers >= 1"),
    ("max_context", [], "graphs.max_context must be a non-empty list of integers >= 1"),
    ("cache_dir", "", "graphs.cache_dir must be a directory path or null"),
])
def test_settings_errors_name_the_field(field, value, message):
    graphs = {"mode": "compile", "batch_sizes": [1, 8], "max_context": [256], "cache_dir": None, field: value}
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        validate_graphs(graphs)


def test_auto_compiles_ahead_of_time_on_cpu_only():
    def settings(device_type):
        return graph_settings("auto", [8, 1, 2], [512], None, device_type)

    assert settings("cpu").mode == "aot" and settings("cuda").mode == "eager"
    assert settings("cpu").batch_sizes == (1, 2, 8)


def test_cli_refuses_an_unknown_mode_naming_the_field():
    result = subprocess.run([sys.executable, "-m", "eyas", "speculative=none", "graphs.mode=fast"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode != 0
    assert "graphs.mode" in result.stderr and "fast" in result.stderr
