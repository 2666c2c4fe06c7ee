"""The backend-binding contract: draft-extend runs on the draft-extend backend, read through the head
runner's `attn_backend`; each draft decode step on its own backend; nothing else rebinds them."""

import pytest
from support import build_engine, compose_config
from support.engines import PLAIN, engine_overrides

from eyas import ConfigError, SamplingParams
from eyas.engine.attention.torch_native import TorchNativeBackend
from eyas.engine.speculative import bindings
from eyas.engine.speculative.backend_factory import DraftBackendFactory
from eyas.engine.speculative.candidate import Candidate
from eyas.engine.speculative.state import SpecRuntimeState
from eyas.engine.speculative.verify_buffers import VerifyBuffers


class RecordingBackend(TorchNativeBackend):
    """Logs every forward it prepares: (backend, number of new tokens per request)."""

    log: list = []

    def init_forward_metadata(self, batch):
        RecordingBackend.log.append((self, tuple(batch.extend_lens)))
        super().init_forward_metadata(batch)


class DecodeOnlyBackend(TorchNativeBackend):
    name = "decode_only"
    supports_extend = False


def factory(num_steps=3, mode="prefill", draft_backend=None, classes=None):
    classes = classes or {"torch_native": TorchNativeBackend, "decode_only": DecodeOnlyBackend}
    return DraftBackendFactory(classes, head_dim=16, num_steps=num_steps, attention_mode=mode,
                               prefill_backend="torch_native", decode_backend="torch_native",
                               draft_attention_backend=draft_backend)


def test_factory_decode_backend_per_step_or_none():
    assert factory(num_steps=1).create_decode_backend() is None
    assert factory(num_steps=0).create_decode_backend() is None
    multi = factory(num_steps=4).create_decode_backend()
    assert multi.num_steps == 3 and len({id(b) for b in multi.backends}) == 3


def test_factory_extend_backend_by_mode_and_override():
    classes = {"torch_native": TorchNativeBackend, "recording": RecordingBackend, "decode_only": DecodeOnlyBackend}
    f = DraftBackendFactory(classes, 16, 3, "decode", prefill_backend="torch_native", decode_backend="recording")
    assert type(f.create_draft_extend_backend()) is RecordingBackend
    f = DraftBackendFactory(classes, 16, 3, "prefill", prefill_backend="torch_native", decode_backend="recording")
    assert type(f.create_draft_extend_backend()) is TorchNativeBackend
    f = DraftBackendFactory(classes, 16, 3, "prefill", "torch_native", "torch_native", draft_attention_backend="recording")
    assert type(f.create_draft_extend_backend()) is RecordingBackend
    assert factory(draft_backend="decode_only").create_draft_extend_backend() is None


@pytest.mark.parametrize("override,allowed", [("speculative.draft_attention_backend=flash", "torch_native, triton"),
                                              ("speculative.attention_mode=sideways", "prefill, decode")])
def test_the_config_refuses_unknown_names_before_any_factory_runs(override, allowed):
    with pytest.raises(ConfigError) as info:
        compose_config([override])
    assert override.split("=")[0] in str(info.value) and allowed in str(info.value)


@pytest.fixture
def eagle_engine(spec_pair):
    target, heads = spec_pair
    with build_engine(engine_overrides(target, "eagle", head=heads["eagle"])) as eng:
        yield eng


def test_draft_extend_backend_is_bound_to_the_runner(eagle_engine):
    worker = eagle_engine.worker
    head = worker.drafter.head
    assert head.draft_extend_backend is worker.state.draft_extend_backend is not None
    assert head.runner.attn_backend is head.draft_extend_backend
    assert head.runner.attn_backend not in worker.state.draft_decode_backend.backends


def state_from(f: DraftBackendFactory, num_steps=3) -> SpecRuntimeState:
    return SpecRuntimeState.create(Candidate(num_steps), f, TorchNativeBackend(16), VerifyBuffers(4, num_steps + 1, "cpu"))


def test_runner_keeps_its_backend_when_there_is_no_draft_extend_backend(eagle_engine):
    worker = eagle_engine.worker
    head = worker.drafter.head
    own, own_extend = head.runner.attn_backend, head.draft_extend_backend
    state = state_from(factory(draft_backend="decode_only"))
    assert state.draft_extend_backend is None
    assert worker.apply_runtime_state(state)
    assert head.runner.attn_backend is own and head.draft_extend_backend is own_extend
    assert worker.state is state


def test_apply_runtime_state_rebinds_the_runner_and_is_a_no_op_when_unchanged(eagle_engine):
    worker = eagle_engine.worker
    state = state_from(factory(num_steps=2), num_steps=2)
    assert worker.apply_runtime_state(state)
    head = worker.drafter.head
    assert head.runner.attn_backend is head.draft_extend_backend is state.draft_extend_backend
    assert worker.state is state and worker.state.candidate == Candidate(2)
    before = bindings.snapshot_bindings(worker)
    assert not worker.apply_runtime_state(state)
    assert all(before[name] is value for name, value in bindings.snapshot_bindings(worker).items())


def record_phases(engine, classes):
    """Rebind the draft worker's backends to recording ones; run; return who ran what."""
    worker = engine.worker
    live = worker.state
    f = DraftBackendFactory(classes, worker.drafter.head.model.config.head_dim, live.candidate.num_steps, "prefill",
                            "torch_native", "torch_native")
    worker.apply_runtime_state(SpecRuntimeState.create(live.candidate, f, live.verify_backend, live.verify_buffers))
    RecordingBackend.log = []
    engine.generate(prompt_token_ids=[[0, 5, 9, 14, 3], [0, 7]], sampling=SamplingParams(max_new_tokens=12, ignore_eos=True))
    return worker.drafter.head, worker.state, list(RecordingBackend.log)


def test_each_phase_runs_on_its_backend(eagle_engine):
    head, state, log = record_phases(eagle_engine, {"torch_native": RecordingBackend})
    extend_runs = [lens for backend, lens in log if backend is head.draft_extend_backend]
    step_backends = state.draft_decode_backend.backends
    assert extend_runs[0] == (5, 2)  # draft-extend over each prompt after prefill
    assert len(extend_runs) > 1 and all(max(lens) >= 1 for lens in extend_runs[1:])  # after every verify
    for i, backend in enumerate(step_backends):  # draft step i: one token per request, on its own backend
        runs = [lens for b, lens in log if b is backend]
        assert runs and all(lens == (1, 1) or lens == (1,) for lens in runs)
    assert {id(b) for b, _ in log} <= {id(head.draft_extend_backend), *map(id, step_backends)}


def test_a_lost_binding_is_caught(eagle_engine, monkeypatch):
    """The upstream regression: the assignment to the head runner's attn_backend dropped. Draft-extend
    then runs on the runner's own backend, which the recording shows."""

    real_assign = bindings._assign

    def lossy_assign(worker, values):
        real_assign(worker, {name: v for name, v in values.items() if name != "drafter.head.runner.attn_backend"})

    monkeypatch.setattr(bindings, "_assign", lossy_assign)
    head, _, log = record_phases(eagle_engine, {"torch_native": RecordingBackend})
    assert head.runner.attn_backend is not head.draft_extend_backend
    assert not any(backend is head.draft_extend_backend for backend, _ in log)


def test_bindings_snapshot_names_every_binding(eagle_engine):
    snap = bindings.snapshot_bindings(eagle_engine.worker)
    assert set(snap) == set(bindings.BINDINGS)
    assert snap["drafter.head.runner.attn_backend"] is snap["drafter.head.draft_extend_backend"]


def test_num_draft_tokens_must_match_num_steps_with_topk_1(spec_pair):
    target, heads = spec_pair
    overrides = engine_overrides(target, "eagle", head=heads["eagle"], nodes=6)
    with pytest.raises(ConfigError, match="num_draft_tokens must equal speculative.num_steps \\+ 1 = 4"):
        build_engine(overrides)


def test_draft_kind_must_match_algorithm(spec_pair):
    target, heads = spec_pair
    with pytest.raises(ConfigError, match="draft.kind"):
        build_engine([*PLAIN, f"model.path={target}", "speculative=eagle3", "draft=eagle", f"draft.path={heads['eagle']}"])


def test_drafters_compose_instead_of_inheriting():
    """Each drafter holds what it shares (a DraftHead, another drafter) and implements the protocol itself."""
    import inspect

    from eyas.engine.speculative.drafters import base, eagle, hybrid, ngram, standalone

    drafters = [eagle.EagleDrafter, ngram.NgramDrafter, standalone.StandaloneDrafter, hybrid.HybridDrafter]
    for cls in drafters:
        assert cls.__bases__ == (object,), cls
        for name in ("start", "prepare", "propose", "after_verify"):
            assert name in vars(cls), (cls, name)
            assert list(inspect.signature(getattr(cls, name)).parameters) == list(
                inspect.signature(getattr(base.Drafter, name)).parameters), (cls, name)
