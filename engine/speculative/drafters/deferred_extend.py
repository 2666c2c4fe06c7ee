"""Draft-extend work held back while the step count is 0.

At 0 steps nothing is drafted, so running the draft head over each verified token would only keep
its KV current at the cost of a draft forward per iteration. Instead the verified tokens and their
target features are held per request row; before the next iteration that drafts, one draft-extend
over everything held brings the draft KV (and the first proposal) up to date. The draft head sees
the same tokens and features at the same positions either way.

Work is held for one of two reasons: the head *sat out* (0 steps, or another drafter drafting: a
different runtime state, so catching up is a cost of switching back), or the hybrid rule skipped
the head for a cycle of its own (catching up is part of that rule's running cost).
"""

from dataclasses import dataclass, field

import torch


@dataclass
class _Held:
    start: int  # position of the first held token
    tokens: list[int] = field(default_factory=list)
    # (features [M, F] of one cycle, first row, end row): the row's chunks, sliced when taken (F: the drafter's choice)
    features: list[tuple[torch.Tensor, int, int]] = field(default_factory=list)
    sat_out: bool = False  # some of it was held while the head sat out


class DeferredExtend:
    def __init__(self):
        self._held: dict[int, _Held] = {}  # request-table row -> held work

    def __len__(self) -> int:
        return len(self._held)

    def drop(self, rows: list[int]) -> None:
        """Forget rows (a new request starts in them)."""
        for row in rows:
            self._held.pop(row, None)

    def hold(self, rows: list[int], prefix_lens: list[int], tokens: list[list[int]], features: torch.Tensor,
             sat_out: bool = True) -> None:
        """features: [sum(len(t) for t in tokens), F], packed in request order. sat_out: held because the
        head sat out (False: skipped by the hybrid rule)."""
        offset = 0
        for row, start, toks in zip(rows, prefix_lens, tokens):
            held = self._held.setdefault(row, _Held(start))
            held.tokens.extend(toks)
            held.features.append((features, offset, offset + len(toks)))
            held.sat_out = held.sat_out or sat_out
            offset += len(toks)

    def start_of(self, row: int, default: int) -> int:
        """The first position of the row's held work (`default` when it holds none)."""
        held = self._held.get(row)
        return default if held is None else min(held.start, default)

    def sat_out(self, rows: list[int]) -> bool:
        """Whether any of these rows holds work from cycles the head sat out."""
        return any(self._held[row].sat_out for row in rows if row in self._held)

    def take(self, rows: list[int]):
        """(rows, prefix_lens, tokens, features) of the held work of these rows, removed; None if none."""
        held = [(row, self._held.pop(row)) for row in rows if row in self._held]
        if not held:
            return None
        return ([row for row, _ in held], [h.start for _, h in held], [h.tokens for _, h in held],
                torch.cat([f[a:b] for _, h in held for f, a, b in h.features]))
