"""SuffixDrafter: suffix decoding (`speculative=suffix`). Each request drafts what followed the
longest earlier occurrence of its current suffix in any stream the index holds: its own tokens, the
running requests' and those of recent finished requests (prompts and outputs, `SuffixIndex`). No
draft model runs.

A request that repeats what an earlier one wrote (an agent re-planning, a file edited again, the
same question asked twice) drafts long runs from it. The proposal follows the occurrences of the
longest match: a chain (topk 1) takes the most frequent continuation token by token; a tree (topk >
1) keeps the `num_draft_tokens - 1` continuation nodes reached by the most occurrences, at most topk
children each. Either stops where fewer than `min_token_prob` of the occurrences agree, and drafts
at most `max_spec_factor` x the match length (a long match earns a deep draft, a one-token match a
short one), up to `num_steps`. A request with no match proposes nothing; the batch's chains are as
wide as its longest proposal, and places nothing fills hold UNFILLED (never accepted).
"""

import time

import torch

from eyas.engine.request import Request
from eyas.engine.runner import ForwardOutput
from eyas.engine.sampling import SamplingBatch
from eyas.engine.speculative.drafters.suffix_index import SuffixIndex
from eyas.engine.speculative.tree import DraftTree, graft, root_only
from eyas.engine.speculative.verify import Verified

MAX_OCCURRENCES = 64  # newest occurrences of a key the index examines per lookup


class SuffixDrafter:
    head = None  # no draft model

    @classmethod
    def from_parts(cls, parts) -> "SuffixDrafter":
        spec = parts.spec  # the index keys on the n-gram lengths ngram_min_match..ngram_max_match
        index = SuffixIndex(range(spec.ngram_min_match, spec.ngram_max_match + 1), spec.suffix_max_match,
                            spec.suffix_max_tokens, max_occurrences=MAX_OCCURRENCES)
        return cls(index, spec.suffix_max_spec_factor, spec.suffix_min_token_prob)

    def __init__(self, index: SuffixIndex, max_spec_factor: float, min_token_prob: float):
        self.index = index
        self.max_spec_factor = max_spec_factor
        self.min_token_prob = min_token_prob
        self.streams: dict[int, int] = {}  # request-table row -> the stream of the request running there
        self.lookup_seconds = 0.0  # host time spent in lookups and index updates, over `lookup_steps` steps
        self.lookup_steps = 0

    def start(self, requests: list[Request], starts: list[int], out: ForwardOutput, first: list[int]) -> None:
        for request, token in zip(requests, first):
            self.release(request)  # (a row is released before it is reused: none is held here)
            self.streams[request.row] = self.index.open(request.all_ids + [token])

    def release(self, request: Request) -> None:
        """The request ended or was preempted: its stream stays, as a finished one, until memory asks for
        its room (a preempted request opens a new one when it comes back)."""
        sid = self.streams.pop(request.row, None)
        if sid is not None:
            self.index.finish(sid)

    def prefill_chunk(self, requests: list[Request], starts: list[int], out: ForwardOutput) -> None:
        """The stream starts on the whole prompt (`start`)."""

    def kv_valid_len(self, request: Request) -> int:
        return request.num_computed  # no draft KV: the target's alone counts

    def prepare(self, requests: list[Request], state) -> None:
        """Nothing is held back: the index sees every verified token as it comes."""

    def propose(self, requests: list[Request], sampling: SamplingBatch, bonus: torch.Tensor, state) -> DraftTree:
        candidate = state.candidate
        if not candidate.is_chain:  # one path per node kept: the tree is as large as the largest proposal
            paths = self.branches(requests, candidate.topk, candidate.num_steps, candidate.num_draft_tokens - 1)
            return graft(root_only(bonus), paths, 1 + max(map(len, paths)))
        chains = [b[-1] if b else [] for b in self.branches(requests, 1, candidate.num_steps, candidate.num_steps)]
        return DraftTree.ragged_chain(bonus, chains)

    def branches(self, requests: list[Request], count: int, max_tokens: int,
                 max_nodes: int | None = None) -> list[list[list[int]]]:
        """Per request, the root-to-node paths of its proposal, best first: at most `count` children per
        node, `max_tokens` deep and `max_nodes` nodes (default: count x max_tokens)."""
        start = time.perf_counter()
        nodes = count * max_tokens if max_nodes is None else max_nodes
        found = [self.index.continuations(self.streams[r.row], max_tokens, count, nodes, self.min_token_prob,
                                          self.max_spec_factor)[1] if max_tokens > 0 else [] for r in requests]
        self.lookup_seconds += time.perf_counter() - start
        self.lookup_steps += 1
        return found

    def longest_matches(self, requests: list[Request]) -> list[int]:
        """Per request, the length of the longest earlier match of its suffix (0: none)."""
        return [self.index.match(self.streams[r.row])[0] for r in requests]

    def after_verify(self, requests: list[Request], verified: Verified, state) -> None:
        start = time.perf_counter()
        for request, tokens in zip(requests, verified.emitted):
            self.index.extend(self.streams[request.row], tokens)
        self.lookup_seconds += time.perf_counter() - start
