"""The speculative worker's bookkeeping on its own: acceptance counters and held draft-extend work."""

import torch

from eyas.engine.speculative.drafters.deferred_extend import DeferredExtend
from eyas.engine.spec_metrics import SpecCounters


def test_counters_report_exact_figures():
    counters = SpecCounters()
    assert counters.as_dict() == {"mean_accept_length": 0.0, "accept_rate_per_position": [],
                                  "draft_accept_rate": 0.0, "num_verify_cycles": 0}
    for num_drafts, accept_len in [(3, 1), (3, 4), (3, 2), (5, 3)]:  # k may change between cycles
        counters.record(num_drafts, accept_len)
    assert counters.as_dict() == {
        "mean_accept_length": 10 / 4,
        "accept_rate_per_position": [3 / 4, 2 / 4, 1 / 4, 0.0, 0.0],
        "draft_accept_rate": 6 / 14,
        "num_verify_cycles": 4,
    }
    single = SpecCounters()
    single.record(2, 3)
    assert single.as_dict()["accept_rate_per_position"] == [1.0, 1.0]


def test_held_work_is_replayed_once_per_row_and_forgotten_when_the_row_is_reused():
    held = DeferredExtend()
    f = torch.arange(12.0).view(6, 2)
    held.hold([4, 7], [10, 3], [[1, 2], [5]], f[:3])
    held.hold([4, 7], [12, 4], [[3], [6, 8]], f[3:])
    held.drop([9])  # a row holding nothing
    assert len(held) == 2
    rows, starts, tokens, features = held.take([7, 4])
    assert rows == [7, 4] and starts == [3, 10] and tokens == [[5, 6, 8], [1, 2, 3]]
    assert torch.equal(features, torch.cat([f[2:3], f[4:6], f[0:2], f[3:4]]))
    assert held.take([4, 7]) is None and len(held) == 0
    held.hold([4, 7], [0, 0], [[1], [2]], f[:2])
    held.drop([4])  # a new request starts in row 4: its old work must never be replayed there
    rows, starts, tokens, _ = held.take([4, 7])
    assert rows == [7] and tokens == [[2]]


def test_held_work_says_whether_the_head_sat_out_any_of_it():
    held = DeferredExtend()
    f = torch.zeros(3, 2)
    held.hold([4], [0], [[1]], f[:1], sat_out=False)  # skipped by the hybrid rule
    held.hold([7], [0], [[2]], f[1:2])
    assert not held.sat_out([4]) and held.sat_out([7]) and held.sat_out([4, 7]) and not held.sat_out([9])
    held.hold([4], [1], [[3]], f[2:])  # then the head sat out in row 4 too
    assert held.sat_out([4])
    held.take([4, 7])
    assert not held.sat_out([4, 7])


def test_runtime_state_parts_must_agree_and_the_state_is_frozen():
    import dataclasses

    import pytest

    from eyas.engine.attention.torch_native import TorchNativeBackend
    from eyas.engine.speculative.backend_factory import DraftBackendFactory
    from eyas.engine.speculative.candidate import Candidate
    from eyas.engine.speculative.state import SpecRuntimeState
    from eyas.engine.speculative.verify_buffers import VerifyBuffers

    def factory(num_steps):
        return DraftBackendFactory({"torch_native": TorchNativeBackend}, 16, num_steps, "prefill",
                                   "torch_native", "torch_native")

    state = SpecRuntimeState.create(Candidate(3), factory(3), TorchNativeBackend(16), VerifyBuffers(4, 4, "cpu"))
    assert state.candidate == Candidate(3) and state.candidate.num_draft_tokens == 4
    assert len(state.draft_decode_backend.backends) == 2 and state.draft_extend_backend is not None
    with pytest.raises(dataclasses.FrozenInstanceError):
        state.candidate = Candidate(5)
    with pytest.raises(dataclasses.FrozenInstanceError):
        state.candidate.num_steps = 5
    tree = SpecRuntimeState.create(Candidate(3, 2, 6), factory(3), TorchNativeBackend(16), VerifyBuffers(4, 8, "cpu"))
    assert tree.candidate.num_draft_tokens == 6  # buffers for more nodes than the candidate verifies serve it
    # draft backends for another step count, or verify buffers for fewer nodes than the candidate verifies
    for steps_factory, nodes_buffers, message in ((2, 4, "draft backends for 2 steps"),
                                                  (3, 3, "verify buffers for 3 nodes")):
        with pytest.raises(ValueError, match=message):
            SpecRuntimeState.create(Candidate(3), factory(steps_factory), TorchNativeBackend(16),
                                    VerifyBuffers(4, nodes_buffers, "cpu"))
    with pytest.raises(ValueError, match="verify buffers for 4 nodes"):
        SpecRuntimeState.create(Candidate(3, 2, 6), factory(3), TorchNativeBackend(16), VerifyBuffers(4, 4, "cpu"))
