"""The scoped override and runtime-state switching: candidates are built without touching the live
worker, a scope restores everything it touched however it is left, and switching rebinds every
binding (draft_runner.attn_backend included) through the one binding function."""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support import compose_config
from support.engines import engine_overrides

from eyas.containers.adaptive import build_adaptive_runtime_state, build_candidate_states, speculative_scope
from eyas.containers.build import build_container
from eyas.engine.attention.torch_native import TorchNativeBackend
from eyas.engine.speculative.backend_factory import DraftBackendFactory
from eyas.engine.speculative.bindings import binding_names, snapshot_bindings
from eyas.engine.speculative.candidate import Candidate
from eyas.engine.speculative.drafters.hybrid import HybridDrafter
from eyas.engine.speculative.state import SpecRuntimeState
from eyas.engine.speculative.verify_buffers import VerifyBuffers

CANDIDATES = [Candidate(k) for k in (0, 1, 2, 3, 5)]
TREES = [Candidate(3, 2, 6), Candidate(2, 4, 8), Candidate(5, 4, 16)]
OTHERS = [Candidate(4, drafter="ngram"), Candidate(3, 2, 6, drafter="ngram"), Candidate(2, drafter="hybrid"),
          Candidate(2, 2, 8, drafter="hybrid")]
OTHER_TIERS = ("adaptive.tiers=[{batch_size:8,candidates:[0,1,2,3,5,{drafter:ngram,num_steps:4},"
               "{drafter:ngram,num_steps:3,topk:2,num_draft_tokens:6},{drafter:hybrid,num_steps:2},"
               "{drafter:hybrid,num_steps:2,topk:2,num_draft_tokens:8}]}]")


class Injected(Exception):
    pass


class NoExtendBackend(TorchNativeBackend):
    supports_extend = False


@pytest.fixture(scope="module")
def container(spec_pair):
    target, heads = spec_pair
    c = build_container(compose_config(engine_overrides(target, "eagle3", head=heads["eagle3"])))
    c.spec_worker()
    return c


@pytest.fixture(scope="module")
def other_drafters_container(spec_pair):
    """EAGLE-3 configured, with tiers that list other drafters: the worker drafts with the hybrid drafter."""
    target, heads = spec_pair
    c = build_container(compose_config(engine_overrides(target, "eagle3", "adaptive=throughput", OTHER_TIERS,
                                                        head=heads["eagle3"])))
    c.spec_worker()
    return c


def same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(a[k] is b[k] for k in a)


def no_extend_state(worker) -> SpecRuntimeState:
    f = DraftBackendFactory({"torch_native": TorchNativeBackend, "none": NoExtendBackend}, 16, 2, "prefill",
                            "torch_native", "torch_native", draft_attention_backend="none")
    return SpecRuntimeState.create(Candidate(2), f, TorchNativeBackend(16), VerifyBuffers(4, 3, "cpu"))


def assert_consistent(worker):
    """Every live binding is the active state's (a None draft-extend backend keeps the live one)."""
    state, head = worker.state, worker.drafter.head
    assert head.runner.attn_backend is head.draft_extend_backend
    if state.draft_extend_backend is not None:
        assert head.draft_extend_backend is state.draft_extend_backend


def test_building_every_candidate_leaves_the_live_bindings_alone(container):
    worker = container.spec_worker()
    before = snapshot_bindings(worker)
    states = build_candidate_states(container, CANDIDATES)
    assert same(snapshot_bindings(worker), before)
    assert worker.drafter.head.runner.attn_backend is before["drafter.head.runner.attn_backend"]
    assert states[Candidate(3)] is worker.state
    for candidate, state in states.items():
        k = candidate.num_steps
        assert state.candidate == candidate == Candidate(k, 1, k + 1) and state.verify_buffers.num_draft_tokens == k + 1
        assert (state.draft_decode_backend is None) == (k <= 1)
        if k > 1:
            assert state.draft_decode_backend.num_steps == k - 1
    others = [s for c, s in states.items() if c != Candidate(3)]
    assert len({id(s.draft_extend_backend) for s in others}) == len(others)  # each candidate its own
    assert container.speculative.candidate() == Candidate(3) and not container.speculative.candidate.overridden


def test_tree_candidates_are_built_with_their_shape_and_leave_the_live_bindings_alone(container):
    worker = container.spec_worker()
    before = snapshot_bindings(worker)
    states = build_candidate_states(container, [Candidate(1), Candidate(3), *TREES])
    assert same(snapshot_bindings(worker), before) and states[Candidate(3)] is worker.state
    for tree in TREES:
        state = states[tree]
        assert state.candidate == tree and state.verify_buffers.num_draft_tokens == tree.num_draft_tokens
        assert state.draft_decode_backend.num_steps == tree.num_steps - 1
    spec = container.speculative
    assert spec.candidate() == Candidate(3, 1, 4) and not spec.candidate.overridden


def test_apply_runtime_state_sets_the_runner_backend(container):
    worker = container.spec_worker()
    live = worker.state
    state = build_adaptive_runtime_state(container, Candidate(5))
    assert worker.apply_runtime_state(state)
    assert worker.drafter.head.runner.attn_backend is state.draft_extend_backend
    assert_consistent(worker)
    worker.apply_runtime_state(live)
    assert worker.drafter.head.runner.attn_backend is live.draft_extend_backend


def test_an_exception_inside_the_scope_restores_everything(container):
    worker = container.spec_worker()
    before = snapshot_bindings(worker)
    assert not container.acceptance_model.built
    with pytest.raises(Injected):
        with speculative_scope(container, Candidate(5)):
            assert container.speculative.candidate() == Candidate(5)
            worker.apply_runtime_state(container.speculative.runtime_state())  # a builder that binds the live worker
            container.acceptance_model()
            assert worker.drafter.head.runner.attn_backend is not before["drafter.head.runner.attn_backend"]
            raise Injected
    assert same(snapshot_bindings(worker), before)
    assert container.speculative.candidate() == Candidate(3) and not container.speculative.candidate.overridden
    assert not container.acceptance_model.built


def test_nested_scopes_restore_in_either_order(container):
    worker = container.spec_worker()
    candidate = container.speculative.candidate

    def num_steps():
        return candidate().num_steps

    before = snapshot_bindings(worker)
    with speculative_scope(container, Candidate(1)):
        worker.apply_runtime_state(container.speculative.runtime_state())
        middle = snapshot_bindings(worker)
        with speculative_scope(container, Candidate(5)):
            assert num_steps() == 5
            worker.apply_runtime_state(container.speculative.runtime_state())
        assert num_steps() == 1 and same(snapshot_bindings(worker), middle)
    assert num_steps() == 3 and same(snapshot_bindings(worker), before)

    outer, inner = speculative_scope(container, Candidate(1)), speculative_scope(container, Candidate(5))
    outer.__enter__()
    inner.__enter__()
    worker.apply_runtime_state(container.speculative.runtime_state())
    outer.__exit__(None, None, None)  # leaves the inner scope too
    assert num_steps() == 3 and not candidate.overridden and same(snapshot_bindings(worker), before)
    inner.__exit__(None, None, None)  # already left: nothing to do
    assert num_steps() == 3 and same(snapshot_bindings(worker), before)


def test_scope_pops_to_its_own_depth_not_the_top(container):
    """An override pushed by someone else inside the scope goes too (dependency-injector's own
    `with provider.override()` would pop only the top entry)."""
    candidate = container.speculative.candidate
    with speculative_scope(container, Candidate(5)):
        candidate.override(Candidate(7))
        assert len(candidate.overridden) == 2
    assert not candidate.overridden and candidate() == Candidate(3)


# -- property: random build / apply / nested scopes / exceptions ------------------------------------

op = st.one_of(
    st.tuples(st.just("build"), st.sampled_from(CANDIDATES + TREES + OTHERS),
              st.sampled_from([None, "raise", "rogue", "rogue_raise"])),
    st.tuples(st.just("apply"), st.integers(0, 50)),
    st.tuples(st.just("enter"), st.sampled_from(CANDIDATES + TREES + OTHERS)),
    st.tuples(st.just("exit"), st.integers(0, 50)),
    st.tuples(st.just("touch")),
)


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=st.lists(op, max_size=14))
def test_random_sequences_keep_bindings_equal_to_the_active_state(other_drafters_container, ops):
    container = other_drafters_container
    worker = container.spec_worker()
    assert isinstance(worker.drafter, HybridDrafter) and worker.drafter.configured_mode == "head"
    configured = container.speculative.candidate()
    pool = [worker.state, no_extend_state(worker)]
    model = snapshot_bindings(worker)  # what the live bindings must be
    built = container.acceptance_model.built
    scopes = []  # open scopes, oldest first: (scope, k, model at entry, built at entry)

    def expect_apply(state):
        extend = state.draft_extend_backend
        model["state"] = state
        if extend is not None:
            model["drafter.head.draft_extend_backend"] = model["drafter.head.runner.attn_backend"] = extend

    try:
        for o in ops:
            if o[0] == "build":
                _, k, fault = o
                entry_model, entry_built = dict(model), built
                try:
                    with speculative_scope(container, k):
                        if fault in ("rogue", "rogue_raise"):
                            worker.apply_runtime_state(pool[-1])
                        state = container.speculative.runtime_state()
                        if fault in ("raise", "rogue_raise"):
                            raise Injected
                    assert state.candidate == k
                    if k.drafter == "ngram":  # no draft model runs: no draft backends
                        assert state.draft_decode_backend is None and state.draft_extend_backend is None
                    pool.append(state)
                except Injected:
                    pass
                model, built = entry_model, entry_built
            elif o[0] == "apply":
                state = pool[o[1] % len(pool)]
                worker.apply_runtime_state(state)
                expect_apply(state)
            elif o[0] == "enter":
                scope = speculative_scope(container, o[1]).__enter__()
                scopes.append((scope, o[1], dict(model), built))
            elif o[0] == "exit" and scopes:
                i = o[1] % len(scopes)
                scopes[i][0].__exit__(None, None, None)
                _, _, model, entry_built = scopes[i]
                built = built and entry_built
                model = dict(model)
                del scopes[i:]
            elif o[0] == "touch":
                container.acceptance_model()
                built = True
            assert same(snapshot_bindings(worker), {name: model[name] for name in binding_names(worker)})
            assert_consistent(worker)
            spec = container.speculative
            assert spec.candidate() == (scopes[-1][1] if scopes else configured)
            assert len(spec.candidate.overridden) == len(scopes)
            assert container.acceptance_model.built == built
    finally:
        for scope, *_ in reversed(scopes):
            scope.__exit__(None, None, None)
        worker.apply_runtime_state(pool[0])
        container.acceptance_model.reset()
