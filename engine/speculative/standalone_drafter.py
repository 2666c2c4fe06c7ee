"""StandaloneDrafter: a small causal LM with the target's tokenizer drafts (`speculative=standalone`).

It runs the draft worker's chain and EAGLE-2 tree loops on the LM (through `StandaloneDraftModel`),
with its own paged KV pool addressed through the shared request-to-token table. Where an EAGLE head
pairs each token with the target's feature one position back, the LM reads tokens only: the
pending bonus token at L is fed to the LM itself, and its drafts sit one position later.

What the LM's KV holds is tracked per request (`computed`: positions holding the request's own
tokens). Before drafting, one catch-up forward feeds everything from there through the bonus (the
whole prompt after admission; after a verify, the tokens the LM had not seen). After verify the
KV is rolled back to the accepted prefix: positions past it are simply overwritten later.
"""

import torch

from engine.forward_batch import ForwardBatch
from engine.request import Request
from engine.runner import ForwardOutput
from engine.sampling import SamplingBatch
from engine.speculative.draft_worker import EagleDraftWorker
from engine.speculative.tree import DraftTree


class StandaloneDrafter(EagleDraftWorker):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.computed: dict[int, int] = {}  # request-table row -> positions of its draft KV that are current

    def start(self, requests: list[Request], out: ForwardOutput, first: list[int]) -> None:
        for request in requests:  # the first catch-up prefills the LM
            self.computed[request.row] = 0

    def propose(self, requests: list[Request], sampling: SamplingBatch) -> torch.Tensor:
        if self.num_steps == 0:
            return torch.zeros(len(requests), 0, dtype=torch.int64)
        rows, after_bonus = self._catch_up(requests)
        drafts = self.draft(rows, after_bonus, sampling)  # feeds the bonus's k - 1 successors at L+1..L+k-1
        for request in requests:
            self.computed[request.row] = request.num_computed + self.num_steps
        return drafts

    def propose_tree(self, requests: list[Request], sampling: SamplingBatch, bonus: torch.Tensor, topk: int,
                     num_nodes: int) -> DraftTree:
        rows, after_bonus = self._catch_up(requests)  # the tree's nodes go to columns past L: not positions
        return self.draft_tree(rows, after_bonus, sampling, bonus, topk, num_nodes)

    def after_verify(self, requests: list[Request], prefix_lens: list[int], emitted: list[list[int]],
                     out: ForwardOutput, keep: torch.Tensor) -> None:
        for request, start, tokens in zip(requests, prefix_lens, emitted):  # roll back to the accepted prefix
            self.computed[request.row] = min(self.computed[request.row], start + len(tokens))

    def _catch_up(self, requests: list[Request]) -> tuple[list[int], list[int]]:
        """Feed each request's tokens from its current draft KV through its bonus (position L); keep the
        LM's output at the bonus for the first proposal. Returns (rows, L + 1 per request)."""
        rows = [r.row for r in requests]
        starts = [self.computed[r] for r in rows]
        batch = ForwardBatch.from_tails(rows, [r.all_ids[s:] for r, s in zip(requests, starts)], starts,
                                        self.req_to_token)
        out = self.draft_runner.forward(batch)
        self.buffers.store(batch.req_rows, out.hidden[batch.last_token_indices], out.logits)
        after_bonus = [r.num_computed + 1 for r in requests]
        for row, position in zip(rows, after_bonus):
            self.computed[row] = position
        return rows, after_bonus
