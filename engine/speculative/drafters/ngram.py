"""NgramDrafter: prompt lookup. Each request drafts the continuation of an earlier occurrence of its
own current suffix (prompt + output); no draft model runs.

A chain proposes the best continuation, up to `num_steps` tokens, and a request without a match
proposes none; the batch's chains are as wide as its longest proposal (a batch where none matches
verifies the bonus alone: a plain decoding step). A tree (topk > 1) merges the `topk` best distinct
continuations into one trie of at most `num_draft_tokens - 1` nodes under the root. Places no
continuation fills hold UNFILLED, which the target's choice never equals: never accepted.
"""

import time

import torch

from eyas.engine.request import Request
from eyas.engine.runner import ForwardOutput
from eyas.engine.sampling import SamplingBatch
from eyas.engine.speculative.drafters.ngram_index import NgramIndex
from eyas.engine.speculative.tree import DraftTree, graft, root_only
from eyas.engine.speculative.verify import Verified


class NgramDrafter:
    head = None  # no draft model

    @classmethod
    def from_parts(cls, parts) -> "NgramDrafter":
        return cls(parts.spec.ngram_min_match, parts.spec.ngram_max_match, parts.max_branches)

    def __init__(self, min_match: int, max_match: int, max_branches: int):
        self.min_match, self.max_match, self.max_branches = min_match, max_match, max_branches
        self.indexes: dict[int, NgramIndex] = {}  # request-table row -> its tokens' index
        self.lookup_seconds = 0.0  # host time spent in lookups and index updates, over `lookup_steps` steps
        self.lookup_steps = 0

    def start(self, requests: list[Request], starts: list[int], out: ForwardOutput, first: list[int]) -> None:
        for request, token in zip(requests, first):
            self.indexes[request.row] = NgramIndex(request.all_ids + [token], self.min_match, self.max_match,
                                                   self.max_branches)

    def prefill_chunk(self, requests: list[Request], starts: list[int], out: ForwardOutput) -> None:
        """The index starts on the whole prompt (`start`)."""

    def kv_valid_len(self, request: Request) -> int:
        return request.num_computed  # no draft KV: the target's alone counts

    def prepare(self, requests: list[Request], state) -> None:
        """Nothing is held back: the index sees every verified token as it comes."""

    def propose(self, requests: list[Request], sampling: SamplingBatch, bonus: torch.Tensor, state) -> DraftTree:
        candidate = state.candidate
        if not candidate.is_chain:  # each request's continuations merged into a trie under its root, best first
            return graft(root_only(bonus), self.branches(requests, candidate.topk, candidate.num_steps),
                         candidate.num_draft_tokens)
        chains = [b[0] if b else [] for b in self.branches(requests, 1, candidate.num_steps)]
        return DraftTree.ragged_chain(bonus, chains)

    def branches(self, requests: list[Request], count: int, max_tokens: int) -> list[list[list[int]]]:
        """Up to `count` distinct continuations of at most `max_tokens` tokens per request, best first."""
        start = time.perf_counter()
        found = [self.indexes[r.row].propose(max_tokens)[:count] if max_tokens > 0 else [] for r in requests]
        self.lookup_seconds += time.perf_counter() - start
        self.lookup_steps += 1
        return found

    def longest_matches(self, requests: list[Request]) -> list[int]:
        """Per request, the length of the longest suffix that occurred before (0: none)."""
        return [max((n for n, _ in self.indexes[r.row].matches(1)), default=0) for r in requests]

    def release(self, request: Request) -> None:
        self.indexes.pop(request.row, None)

    def after_verify(self, requests: list[Request], verified: Verified, state) -> None:
        start = time.perf_counter()
        for request, tokens in zip(requests, verified.emitted):
            self.indexes[request.row].extend(tokens)
        self.lookup_seconds += time.perf_counter() - start
