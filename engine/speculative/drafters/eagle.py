"""EagleDrafter: an EAGLE / EAGLE-3 head drafts chains and EAGLE-2 trees (`speculative=eagle|eagle3`).

After the target's prefill the head runs draft-extend over each prompt shifted by one (token t_{j+1}
with the target's feature f_j), so it can propose the token after the first sampled one. Each cycle it
drafts from its last output, and after verify it runs draft-extend over the accepted path. At 0 steps
(plain decoding through the verify path) that draft-extend is held (`DeferredExtend`), its target
features unprojected, and caught up in one forward before the head next drafts.
"""

import torch

from eyas.engine.request import Request
from eyas.engine.runner import ForwardOutput
from eyas.engine.sampling import SamplingBatch
from eyas.engine.speculative.drafters.deferred_extend import DeferredExtend
from eyas.engine.speculative.drafters.head import DraftHead
from eyas.engine.speculative.tree import DraftTree
from eyas.engine.speculative.verify import Verified


class EagleDrafter:
    @classmethod
    def from_parts(cls, parts) -> "EagleDrafter":
        return cls(parts.head())

    def __init__(self, head: DraftHead):
        self.head = head
        self.deferred = DeferredExtend()

    def start(self, requests: list[Request], starts: list[int], out: ForwardOutput, first: list[int]) -> None:
        rows = [r.row for r in requests]
        features = self.head.target_features(out.hidden, out.aux_hidden)
        shifted = [r.all_ids[s + 1:] + [t] for r, s, t in zip(requests, starts, first)]
        self.deferred.drop(rows)
        self.head.extend(rows, starts, shifted, features)

    def prefill_chunk(self, requests: list[Request], starts: list[int], out: ForwardOutput) -> None:
        """Draft-extend over the chunk: each position with the prompt token after it."""
        rows = [r.row for r in requests]
        features = self.head.target_features(out.hidden, out.aux_hidden)
        self.deferred.drop(rows)
        self.head.extend(rows, starts, [r.all_ids[s + 1:r.num_computed + 1] for r, s in zip(requests, starts)], features)

    def kv_valid_len(self, request: Request) -> int:
        """Held draft-extend work leaves the draft KV behind from its first position."""
        return self.deferred.start_of(request.row, request.num_computed)

    def prepare(self, requests: list[Request], state) -> None:
        """Back from cycles the head sat out: catch up now, so the worker times it apart (a cost of
        switching back, not of the cycle's candidate)."""
        rows = [r.row for r in requests]
        if state.candidate.num_steps > 0 and self.deferred.sat_out(rows):
            self.catch_up(rows)

    def propose(self, requests: list[Request], sampling: SamplingBatch, bonus: torch.Tensor, state) -> DraftTree:
        candidate = state.candidate
        if candidate.num_steps == 0:
            return DraftTree.chain(bonus, torch.zeros(len(requests), 0, dtype=torch.int64, device=bonus.device))
        rows, seq_lens = [r.row for r in requests], [r.num_computed for r in requests]
        self.catch_up(rows)
        if candidate.is_chain:
            return self.head.chain(rows, seq_lens, sampling, bonus, candidate.num_steps, state.draft_decode_backend,
                                   graph=state.draft_graph)
        return self.head.tree(rows, seq_lens, sampling, bonus, candidate, state.draft_decode_backend,
                              graph=state.draft_graph)

    def after_verify(self, requests: list[Request], verified: Verified, state) -> None:
        if state.candidate.num_steps > 0:
            self.extend_verified(requests, verified)
        else:
            self.hold(requests, verified, sat_out=True)

    def release(self, request: Request) -> None:
        self.deferred.drop([request.row])  # held draft-extend work for KV the row no longer has

    def catch_up(self, rows: list[int]) -> None:
        """One draft-extend over the work held for these rows brings the draft KV up to date."""
        held = self.deferred.take(rows)
        if held is not None:
            rows, starts, tokens, unprojected = held
            self.head.extend(rows, starts, tokens, self.head.project_features(unprojected))

    def extend_verified(self, requests: list[Request], verified: Verified) -> None:
        """Draft-extend over the accepted path: request i's emitted tokens from its prefix length, each with
        the target feature of the verify node it was chosen at."""
        self.head.extend([r.row for r in requests], verified.prefix_lens, verified.emitted, self._features(verified))

    def hold(self, requests: list[Request], verified: Verified, sat_out: bool) -> None:
        """Hold that draft-extend until the head next drafts (sat_out: the head sat the cycle out, rather
        than a rule of the drafter's skipping it)."""
        self.deferred.hold([r.row for r in requests], verified.prefix_lens, verified.emitted,
                           self.head.unprojected_features(verified.out, verified.keep), sat_out=sat_out)

    def _features(self, verified: Verified) -> torch.Tensor:
        out, keep = verified.out, verified.keep
        return self.head.target_features(out.hidden[keep], [a[keep] for a in out.aux_hidden])
