"""SpecRuntimeState: everything a speculative iteration runs on that depends on its candidate (drafter,
step count, tree shape).

One state per candidate is built ahead of time (by the containers, each under a `ProviderScope`);
switching the live worker from one to another is a rebinding (`bindings.bind_runtime_state`), never a
rebuild. The worker and its drafter read the live state; nothing copies its fields. A state's graph
runners (None when graphs are off) run its verify forwards (`verify_graph`) and its draft model's step
forwards (`draft_graph`); runners of one model share their compiled graphs, so a runner per state
costs no compile of its own.
"""

from dataclasses import dataclass

from eyas.engine.attention.multi_step import MultiStepDraftBackend
from eyas.engine.graphs.graph_runner import GraphRunner
from eyas.engine.speculative.backend_factory import DraftBackendFactory
from eyas.engine.speculative.candidate import Candidate
from eyas.engine.speculative.verify_buffers import VerifyBuffers


@dataclass(frozen=True, eq=False)
class SpecRuntimeState:
    candidate: Candidate
    draft_decode_backend: MultiStepDraftBackend | None  # one backend per draft step; None when num_steps <= 1
    draft_extend_backend: object | None  # None: the head's runner keeps the backend it has
    verify_backend: object  # the target backend of the verify forward
    verify_buffers: VerifyBuffers
    verify_graph: GraphRunner | None = None  # the verify forward as a graph; None: eager
    draft_graph: GraphRunner | None = None  # the draft model's step forwards as a graph; None: eager

    @classmethod
    def create(cls, candidate: Candidate, backend_factory: DraftBackendFactory | None, verify_backend,
               verify_buffers: VerifyBuffers, verify_graph: GraphRunner | None = None,
               draft_graph: GraphRunner | None = None) -> "SpecRuntimeState":
        """backend_factory: None for a drafter without a draft model (no draft backends)."""
        if backend_factory is not None and backend_factory.num_steps != candidate.num_steps:
            raise ValueError(f"runtime state for {candidate} built with draft backends for "
                             f"{backend_factory.num_steps} steps")
        if verify_buffers.num_draft_tokens < candidate.num_draft_tokens:
            raise ValueError(f"runtime state for {candidate} built with verify buffers for "
                             f"{verify_buffers.num_draft_tokens} nodes")
        if backend_factory is None:
            return cls(candidate, None, None, verify_backend, verify_buffers, verify_graph)
        return cls(candidate, backend_factory.create_decode_backend(), backend_factory.create_draft_extend_backend(),
                   verify_backend, verify_buffers, verify_graph, draft_graph)
