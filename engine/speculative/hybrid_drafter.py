"""HybridDrafter: an EAGLE / EAGLE-3 head and n-gram lookup in one drafter (`speculative=hybrid`).

The n-gram continuations (prompt lookup over each request's own tokens) are scored by the length
of the suffix they matched. When every request of the batch matched at least `ngram_trust` tokens
(text that repeats), the n-gram continuations are the whole proposal and the head does not run
that cycle; its draft-extend is held and caught up in one forward before it next drafts (as at 0
steps). Otherwise the head drafts: with topk = 1 its chain; with topk > 1 its EAGLE-2 tree, with
the `topk` n-gram continuations grafted onto it under the same `num_draft_tokens` budget (the
head's tree gets what the branches leave, at least the root and one node; branches share nodes
where they agree with the head).

It also serves adaptive speculation when a tier lists other drafters: `mode` (bound from each
runtime state) is "hybrid" for the rule above, "ngram" for n-gram lookup alone (the head sits out and
its draft-extend is held, as above), or "head" for the head alone (the configured EAGLE / EAGLE-3
drafter). Both keep their state current in every mode: the n-gram index sees every verified token,
and the head catches up before it next drafts.
"""

import torch

from engine.request import Request
from engine.runner import ForwardOutput
from engine.sampling import SamplingBatch
from engine.speculative.draft_worker import EagleDraftWorker
from engine.speculative.ngram_drafter import NgramDrafter
from engine.speculative.tree import DraftTree, graft, max_tree_nodes, root_only

MODES = ("head", "ngram", "hybrid")


class HybridDrafter(EagleDraftWorker):
    def __init__(self, *args, ngram: NgramDrafter, ngram_trust: int, mode: str = "hybrid", **kwargs):
        super().__init__(*args, **kwargs)
        if mode not in MODES:
            raise ValueError(f"hybrid drafter mode must be one of {MODES}, got {mode!r}")
        self.ngram = ngram
        self.ngram_trust = ngram_trust
        self.configured_mode = mode  # a runtime state of the configured drafter binds this one
        self.mode = mode
        self._head_ran = True  # whether the last proposal ran the head

    def start(self, requests: list[Request], out: ForwardOutput, first: list[int]) -> None:
        super().start(requests, out, first)
        self.ngram.start(requests, out, first)

    def propose(self, requests: list[Request], sampling: SamplingBatch) -> torch.Tensor:
        """topk = 1: the n-gram chain when every request's match is trusted (always in mode "ngram"),
        else the head's chain."""
        self.ngram.num_steps = self.num_steps
        self._head_ran = self._head_drafts(requests)
        if not self._head_ran:
            return self.ngram.propose(requests, sampling)
        return super().propose(requests, sampling)

    def head_drafts_now(self) -> bool:
        return self.num_steps > 0 and self.mode != "ngram"

    def _head_drafts(self, requests: list[Request]) -> bool:
        if self.num_steps == 0 or self.mode == "ngram":
            return False
        return self.mode == "head" or not self._trusted(requests)

    def _trusted(self, requests: list[Request]) -> bool:
        return all(n >= self.ngram_trust for n in self.ngram.longest_matches(requests))

    def propose_tree(self, requests: list[Request], sampling: SamplingBatch, bonus: torch.Tensor, topk: int,
                     num_nodes: int) -> DraftTree:
        self.ngram.num_steps = self.num_steps
        self._head_ran = self._head_drafts(requests)
        if self.mode == "head":
            return super().propose_tree(requests, sampling, bonus, topk, num_nodes)
        branches = self.ngram.branches(requests, topk)  # per request, best first
        grafted = [len({tuple(p[:d]) for p in b for d in range(1, len(p) + 1)}) for b in branches]  # trie nodes
        if not self._head_ran:
            return graft(root_only(bonus), branches, min(num_nodes, 1 + max(grafted)))
        rows = [r.row for r in requests]
        self.catch_up(rows)  # the head sat out earlier cycles: bring its KV up to date first
        head_nodes = max(2, min(max_tree_nodes(topk, self.num_steps), num_nodes - max(grafted)))
        tree = self.draft_tree(rows, [r.num_computed for r in requests], sampling, bonus, topk, head_nodes)
        return graft(tree, branches, min(num_nodes, head_nodes + max(grafted)))

    def after_verify(self, requests: list[Request], prefix_lens: list[int], emitted: list[list[int]],
                     out: ForwardOutput, keep: torch.Tensor) -> None:
        self.ngram.after_verify(requests, prefix_lens, emitted, out, keep)
        features = self.target_features(out.hidden[keep], [a[keep] for a in out.aux_hidden])
        rows = [r.row for r in requests]
        if self._head_ran:
            self.forward_draft_extend(rows, prefix_lens, emitted, features)
        else:
            self.deferred.hold(rows, prefix_lens, emitted, features, sat_out=not self.head_drafts_now())
