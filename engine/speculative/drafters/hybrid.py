"""HybridDrafter: an EAGLE / EAGLE-3 head and lookup drafters in one drafter (`speculative=hybrid`).

It holds an `EagleDrafter` and the lookup drafters (`registry.LOOKUPS`: n-gram lookup, suffix decoding)
that some candidate or its rule drafts with, and drafts in one of these modes, the candidate's drafter
(`state.candidate.drafter`) or, for the configured drafter's candidates, `configured_mode`:
- "hybrid": the lookup's continuations (`hybrid_lookup`: n-gram lookup over each request's own
  tokens, or suffix decoding over every recent request's) are scored by the length of the suffix
  they matched. When every request of the batch matched at least
  `ngram_trust` tokens (text that repeats), they are the whole proposal and the head does not run
  that cycle; its draft-extend is held and caught up in one forward before it next drafts. Otherwise
  the head drafts: with topk = 1 its chain; with topk > 1 its EAGLE-2 tree, with the `topk` lookup
  continuations grafted onto it under the same `num_draft_tokens` budget (the head's tree gets what
  the branches leave, at least the root and one node; branches share nodes where they agree).
- a lookup's name ("ngram", "suffix"): that lookup drafts alone, as it would configured (the head
  sits out, its draft-extend held as above).
- "head": the head alone (the configured EAGLE / EAGLE-3 drafter, when adaptive tiers list other
  drafters beside its own candidates).
In every mode all keep their state current: the indexes see every verified token, and the head
catches up before it next drafts, so any can take over at any cycle.
"""

import torch

from eyas.engine.request import Request
from eyas.engine.runner import ForwardOutput
from eyas.engine.sampling import SamplingBatch
from eyas.engine.speculative.candidate import Candidate
from eyas.engine.speculative.drafters.eagle import EagleDrafter
from eyas.engine.speculative.drafters.registry import HOST, LOOKUPS
from eyas.engine.speculative.tree import DraftTree, graft, max_tree_nodes, root_only
from eyas.engine.speculative.verify import Verified

MODES = ("head", *LOOKUPS, HOST)  # a lookup's mode: it drafts alone, the head sits out


class HybridDrafter:
    def __init__(self, eagle: EagleDrafter, lookups: dict, ngram_trust: int, configured_mode: str = HOST,
                 hybrid_lookup: str = "ngram"):
        if configured_mode not in MODES:
            raise ValueError(f"hybrid drafter mode must be one of {MODES}, got {configured_mode!r}")
        if hybrid_lookup not in LOOKUPS:
            raise ValueError(f"the hybrid rule's lookup must be one of {LOOKUPS}, got {hybrid_lookup!r}")
        self.eagle = eagle
        # the lookups some candidate drafts with, by name (each kept current costs every cycle)
        self.lookups = dict(lookups)
        self.lookup = self.lookups.get(hybrid_lookup)  # the hybrid rule's (None when no candidate runs the rule)
        if configured_mode == HOST and self.lookup is None:
            raise ValueError(f"the hybrid rule drafts with its {hybrid_lookup} lookup, which was not given")
        self.ngram_trust = ngram_trust
        self.configured_mode = configured_mode  # the mode of the configured drafter's candidates
        self._head_ran = True  # whether the last proposal ran the head

    @classmethod
    def from_parts(cls, parts) -> "HybridDrafter":
        """The head's drafter and every lookup in use; the configured drafter's candidates draft as the
        hybrid rule (`speculative=hybrid`) or as the head alone (another drafter hosts the tiers' lookups)."""
        lookups = {name: parts.drafter(name) for name in sorted(parts.lookups)}
        return cls(parts.drafter("eagle"), lookups, parts.spec.ngram_trust,
                   configured_mode=HOST if parts.algorithm == HOST else "head",
                   hybrid_lookup=parts.spec.hybrid_lookup)

    @property
    def head(self):
        return self.eagle.head

    def mode(self, candidate: Candidate) -> str:
        return candidate.drafter or self.configured_mode

    def start(self, requests: list[Request], starts: list[int], out: ForwardOutput, first: list[int]) -> None:
        self.eagle.start(requests, starts, out, first)
        for lookup in self.lookups.values():
            lookup.start(requests, starts, out, first)

    def prefill_chunk(self, requests: list[Request], starts: list[int], out: ForwardOutput) -> None:
        self.eagle.prefill_chunk(requests, starts, out)  # the n-gram index starts on the whole prompt

    def kv_valid_len(self, request: Request) -> int:
        return self.eagle.kv_valid_len(request)

    def prepare(self, requests: list[Request], state) -> None:
        if self.mode(state.candidate) not in LOOKUPS:
            self.eagle.prepare(requests, state)

    def propose(self, requests: list[Request], sampling: SamplingBatch, bonus: torch.Tensor, state) -> DraftTree:
        candidate = state.candidate
        mode = self.mode(candidate)
        self._head_ran = self._head_drafts(requests, candidate, mode)
        if mode == "head" or (candidate.is_chain and self._head_ran):
            return self.eagle.propose(requests, sampling, bonus, state)
        if mode in LOOKUPS:  # a lookup drafts alone
            return self.lookups[mode].propose(requests, sampling, bonus, state)
        if candidate.is_chain:  # every request's match is trusted
            return self.lookup.propose(requests, sampling, bonus, state)
        branches = self.lookup.branches(requests, candidate.topk, candidate.num_steps)  # per request, best first
        grafted = [len({tuple(p[:d]) for p in b for d in range(1, len(p) + 1)}) for b in branches]  # trie nodes
        num_nodes = candidate.num_draft_tokens
        if not self._head_ran:
            return graft(root_only(bonus), branches, min(num_nodes, 1 + max(grafted)))
        rows = [r.row for r in requests]
        self.eagle.catch_up(rows)  # the head sat out earlier cycles: bring its KV up to date first
        head_nodes = max(2, min(max_tree_nodes(candidate.topk, candidate.num_steps), num_nodes - max(grafted)))
        shape = Candidate(candidate.num_steps, candidate.topk, head_nodes)
        tree = self.head.tree(rows, [r.num_computed for r in requests], sampling, bonus, shape,
                              state.draft_decode_backend, graph=state.draft_graph)
        return graft(tree, branches, min(num_nodes, head_nodes + max(grafted)))

    def after_verify(self, requests: list[Request], verified: Verified, state) -> None:
        for lookup in self.lookups.values():
            lookup.after_verify(requests, verified, state)
        if self._head_ran:
            self.eagle.extend_verified(requests, verified)
        else:
            # the head sat out (0 steps, or n-gram lookup alone), or the hybrid rule skipped it this cycle
            sat_out = state.candidate.num_steps == 0 or self.mode(state.candidate) in LOOKUPS
            self.eagle.hold(requests, verified, sat_out=sat_out)

    def release(self, request: Request) -> None:
        self.eagle.release(request)
        for lookup in self.lookups.values():
            lookup.release(request)

    def _head_drafts(self, requests: list[Request], candidate: Candidate, mode: str) -> bool:
        if candidate.num_steps == 0 or mode in LOOKUPS:
            return False
        return mode == "head" or not self._trusted(requests)

    def _trusted(self, requests: list[Request]) -> bool:
        return all(n >= self.ngram_trust for n in self.lookup.longest_matches(requests))
