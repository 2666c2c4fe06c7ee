"""StandaloneDrafter: a small causal LM with the target's tokenizer drafts (`speculative=standalone`).

It runs the head's chain and EAGLE-2 tree loops on the LM (through `StandaloneDraftModel`), with its
own paged KV pool addressed through the shared request-to-token table. Where an EAGLE head pairs each
token with the target's feature one position back, the LM reads tokens only: the pending bonus token
at L is fed to the LM itself, and its drafts sit one position later.

What the LM's KV holds is tracked per request (`computed`: positions holding the request's own
tokens). Before drafting, one catch-up forward feeds everything from there through the bonus (the
whole prompt after admission; after a verify, the tokens the LM had not seen). After verify the
KV is rolled back to the accepted prefix: positions past it are simply overwritten later.
"""

import torch

from eyas.engine.request import Request
from eyas.engine.runner import ForwardOutput
from eyas.engine.sampling import SamplingBatch
from eyas.engine.speculative.drafters.head import DraftHead
from eyas.engine.speculative.tree import DraftTree
from eyas.engine.speculative.verify import Verified


class StandaloneDrafter:
    @classmethod
    def from_parts(cls, parts) -> "StandaloneDrafter":
        return cls(parts.head())

    def __init__(self, head: DraftHead):
        self.head = head
        self.computed: dict[int, int] = {}  # request-table row -> positions of its draft KV that are current
        self._drafted: dict[int, list[int]] = {}  # row -> the chain it drafted this cycle

    def start(self, requests: list[Request], starts: list[int], out: ForwardOutput, first: list[int]) -> None:
        for request in requests:  # the first catch-up prefills the LM past the cached prefix (every chunk at once)
            self.computed[request.row] = request.prefill_start

    def prefill_chunk(self, requests: list[Request], starts: list[int], out: ForwardOutput) -> None:
        for request in requests:  # the LM reads tokens only: it catches up on the whole prompt when it first drafts
            self.computed[request.row] = request.prefill_start

    def kv_valid_len(self, request: Request) -> int:
        return min(self.computed.get(request.row, 0), request.num_computed)

    def prepare(self, requests: list[Request], state) -> None:
        """Nothing is held: the catch-up forward is part of drafting (it also yields the first proposal)."""

    def propose(self, requests: list[Request], sampling: SamplingBatch, bonus: torch.Tensor, state) -> DraftTree:
        candidate = state.candidate
        if candidate.num_steps == 0:
            return DraftTree.chain(bonus, torch.zeros(len(requests), 0, dtype=torch.int64, device=bonus.device))
        rows, after_bonus = self._catch_up(requests)
        if not candidate.is_chain:  # the tree's nodes go to columns past L: not positions
            return self.head.tree(rows, after_bonus, sampling, bonus, candidate, state.draft_decode_backend,
                                  graph=state.draft_graph)
        # feeds the bonus's k - 1 successors at L+1..L+k-1
        chain = self.head.chain(rows, after_bonus, sampling, bonus, candidate.num_steps, state.draft_decode_backend,
                                graph=state.draft_graph)
        for request, drafts in zip(requests, chain.tokens[:, 1:].tolist()):
            self.computed[request.row] = request.num_computed + candidate.num_steps
            self._drafted[request.row] = drafts
        return chain

    def after_verify(self, requests: list[Request], verified: Verified, state) -> None:
        for request, start, tokens in zip(requests, verified.prefix_lens, verified.emitted):
            # roll back to the accepted prefix of its own drafts: a structured request's chain may have
            # been refilled with tokens the grammar forces, whose positions the LM fed other tokens
            drafted = self._drafted.pop(request.row, None)
            agreed = len(tokens) - 1 if drafted is None else next(
                (j for j, (token, draft) in enumerate(zip(tokens[:-1], drafted)) if token != draft), len(tokens) - 1)
            self.computed[request.row] = min(self.computed[request.row], start + 1 + agreed)

    def release(self, request: Request) -> None:
        self.computed.pop(request.row, None)
        self._drafted.pop(request.row, None)

    def _catch_up(self, requests: list[Request]) -> tuple[list[int], list[int]]:
        """Feed each request's tokens from its current draft KV through its bonus (position L); keep the
        LM's output at the bonus for the first proposal. Returns (rows, L + 1 per request)."""
        rows = [r.row for r in requests]
        starts = [self.computed[r] for r in rows]
        self.head.extend(rows, starts, [r.all_ids[s:] for r, s in zip(requests, starts)])
        after_bonus = [r.num_computed + 1 for r in requests]
        for row, position in zip(rows, after_bonus):
            self.computed[row] = position
        return rows, after_bonus
