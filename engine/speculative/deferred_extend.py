"""Draft-extend work held back while the step count is 0.

At 0 steps nothing is drafted, so running the draft head over each verified token would only keep
its KV current at the cost of a draft forward per iteration. Instead the verified tokens and their
target features are held per request row; before the next iteration that drafts, one draft-extend
over everything held brings the draft KV (and the first proposal) up to date. The draft head sees
the same tokens and features at the same positions either way.
"""

from dataclasses import dataclass, field

import torch


@dataclass
class _Held:
    start: int  # position of the first held token
    tokens: list[int] = field(default_factory=list)
    features: list[torch.Tensor] = field(default_factory=list)  # [n_i, H] chunks


class DeferredExtend:
    def __init__(self):
        self._held: dict[int, _Held] = {}  # request-table row -> held work

    def __len__(self) -> int:
        return len(self._held)

    def drop(self, rows: list[int]) -> None:
        """Forget rows (a new request starts in them)."""
        for row in rows:
            self._held.pop(row, None)

    def hold(self, rows: list[int], prefix_lens: list[int], tokens: list[list[int]], features: torch.Tensor) -> None:
        """features: [sum(len(t) for t in tokens), H], packed in request order."""
        offset = 0
        for row, start, toks in zip(rows, prefix_lens, tokens):
            held = self._held.setdefault(row, _Held(start))
            held.tokens.extend(toks)
            held.features.append(features[offset:offset + len(toks)])
            offset += len(toks)

    def take(self, rows: list[int]):
        """(rows, prefix_lens, tokens, features) of the held work of these rows, removed; None if none."""
        held = [(row, self._held.pop(row)) for row in rows if row in self._held]
        if not held:
            return None
        return ([row for row, _ in held], [h.start for _, h in held], [h.tokens for _, h in held],
                torch.cat([f for _, h in held for f in h.features]))
