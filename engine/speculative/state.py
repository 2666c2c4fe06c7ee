"""SpecRuntimeState: everything a speculative iteration runs on that depends on the step count (and tree
shape, and drafter).

One state per candidate (step count, tree shape or other drafter) is built ahead of time (by the
containers); switching the live worker from one to another is a rebinding of these objects, never a
rebuild. Eager execution only:
the engine captures no CUDA graphs, so a state carries no graph runners.
"""

from dataclasses import dataclass

from engine.attention.multi_step import MultiStepDraftBackend
from engine.speculative.backend_factory import DraftBackendFactory
from engine.speculative.candidate import Candidate, DrafterCandidate, configured_candidate
from engine.speculative.verify_buffers import VerifyBuffers


@dataclass(frozen=True, eq=False)
class SpecRuntimeState:
    num_steps: int
    num_draft_tokens: int  # counts the bonus token: num_steps + 1 for a chain (topk 1), the tree's nodes otherwise
    topk: int  # 1: chain drafting; more: EAGLE-2 trees with topk children per expanded node
    draft_decode_backend: MultiStepDraftBackend | None  # None when num_steps <= 1
    draft_extend_backend: object | None  # None: the draft runner keeps the backend it has
    verify_backend: object  # the target backend of the verify forward
    verify_buffers: VerifyBuffers
    drafter: str | None = None  # None: the configured drafter; else another one (`candidate.OTHER_DRAFTERS`)

    @property
    def candidate(self) -> Candidate:
        """What adaptive speculation calls this state: its step count (a chain) or its tree shape, and
        its drafter when that is not the configured one."""
        shape = configured_candidate(self.num_steps, self.topk, self.num_draft_tokens)
        return shape if self.drafter is None else DrafterCandidate(self.drafter, shape)

    @classmethod
    def create(cls, num_steps: int, backend_factory: DraftBackendFactory | None, verify_backend,
               verify_buffers: VerifyBuffers, topk: int = 1, num_draft_tokens: int | None = None,
               drafter: str | None = None) -> "SpecRuntimeState":
        """backend_factory: None for a drafter without a draft model (no draft backends)."""
        steps = [verify_buffers.num_steps] + ([backend_factory.num_steps] if backend_factory is not None else [])
        if any(n != num_steps for n in steps):
            raise ValueError(f"runtime state for num_steps={num_steps} built from parts for {steps} steps")
        nodes = num_steps + 1 if topk == 1 or num_draft_tokens is None else num_draft_tokens
        if backend_factory is None:
            return cls(num_steps, nodes, topk, None, None, verify_backend, verify_buffers, drafter)
        return cls(num_steps, nodes, topk, backend_factory.create_decode_backend(),
                   backend_factory.create_draft_extend_backend(), verify_backend, verify_buffers, drafter)
