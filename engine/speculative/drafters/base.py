"""The drafter protocol: the calls the speculative worker makes, in the order it makes them.

Each call gets the worker's live `SpecRuntimeState` (`state`): its candidate (drafter, step count,
tree shape) and the draft-side backends built for it. A drafter keeps no copy of them; what a runtime
state binds on a drafter's objects (the draft-extend backend of its head, read through the head's
runner) is bound by `engine/speculative/bindings.py` alone.
"""

from typing import Protocol

import torch

from eyas.engine.request import Request
from eyas.engine.runner import ForwardOutput
from eyas.engine.sampling import SamplingBatch
from eyas.engine.speculative.drafters.head import DraftHead
from eyas.engine.speculative.tree import DraftTree
from eyas.engine.speculative.verify import Verified


class Drafter(Protocol):
    head: DraftHead | None  # the draft model's runner and loops; None for a drafter without a draft model

    def start(self, requests: list[Request], starts: list[int], out: ForwardOutput, first: list[int]) -> None:
        """After the target's prefill of `requests` (out: its forward over each one's tokens from position
        starts[i], the end of its cached prefix; first: each one's first token)."""

    def prefill_chunk(self, requests: list[Request], starts: list[int], out: ForwardOutput) -> None:
        """After the target's forward over a chunk of each request's prompt, positions starts[i] up to its
        `num_computed` (more of the prompt follows; nothing was sampled)."""

    def kv_valid_len(self, request: Request) -> int:
        """Leading positions of the request whose draft KV is what a fresh start would compute (the prefix
        cache keeps no more)."""

    def prepare(self, requests: list[Request], state) -> None:
        """Before drafting: catch up on work held while the head sat out (timed as its own phase)."""

    def propose(self, requests: list[Request], sampling: SamplingBatch, bonus: torch.Tensor, state) -> DraftTree:
        """Each request's draft tree rooted at its pending `bonus` token [B]: a chain (`DraftTree.chain`,
        at most `state.candidate.num_steps` drafts) when the candidate's topk is 1, else a tree of at most
        `num_draft_tokens` nodes."""

    def after_verify(self, requests: list[Request], verified: Verified, state) -> None:
        """After verify and commit: see the verified path (draft-extend, index update, rollback)."""

    def release(self, request: Request) -> None:
        """The request gave its row back (ended or preempted; `request.row` is still its row): let go of
        what was kept for it there."""
