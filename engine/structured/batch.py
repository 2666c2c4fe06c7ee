"""The grammars of a batch's requests in one step: masks for every node a forward scores, drafts the
grammar rejects cut before verification, emitted tokens consumed after it."""

from dataclasses import dataclass, field

import torch

UNFILLED = -1  # as a draft tree's unfilled node (`eyas.engine.speculative.tree.UNFILLED`)


@dataclass
class GrammarBatch:
    """`rows`: the batch indices of the requests with a grammar; `grammars` their GrammarMatchers.
    `mask_drafts` (`speculative.mask_drafts`): the head drafts under the grammar's masks (chain steps and
    tree expansion) and verification drops drafts the grammar rejects; else the head drafts freely and
    the target's masked choice turns the bad drafts down."""

    size: int
    rows: list[int]
    grammars: list
    mask_drafts: bool = True
    _masks: torch.Tensor | None = field(default=None, repr=False)  # [P, n, V] bool: what each node allows next

    @classmethod
    def of_requests(cls, requests, mask_drafts: bool = True) -> "GrammarBatch | None":
        rows = [i for i, r in enumerate(requests) if r.grammar is not None]
        if not rows:
            return None
        return cls(len(requests), rows, [requests[i].grammar for i in rows], mask_drafts)

    def prepare(self, tokens: torch.Tensor | None = None, parents: torch.Tensor | None = None,
                fill_forced: bool = False) -> torch.Tensor | None:
        """Masks for the nodes of `tokens` [B, n] (None: one position per request, after its output;
        parents [B, n], None for chains). Returns the tokens with the drafts the grammar rejects (and
        their descendants) unfilled, when `mask_drafts`; else as they were. `fill_forced` (a chain of
        deterministic drafts, with `mask_drafts`): a chain's drafts from its first rejected or unfilled
        one on become the tokens the grammar forces there, which the target's masked choice will take
        (a node that could not have been accepted gets a draft that likely will)."""
        if tokens is None:
            self._masks = torch.stack([g.allowed() for g in self.grammars])[:, None]
            return None
        n = tokens.shape[1]
        host_tokens = tokens.tolist()
        host_parents = parents.tolist() if parents is not None else None
        fill_forced = fill_forced and self.mask_drafts and host_parents is None
        cut = tokens.clone()
        masks = []
        for row, grammar in zip(self.rows, self.grammars):
            chain_parents = list(range(-1, n - 1))
            if fill_forced:
                host_tokens[row] = grammar.forced_chain(host_tokens[row])
                cut[row] = torch.tensor(host_tokens[row], dtype=cut.dtype)
            valid, mask = grammar.walk(host_tokens[row], chain_parents if host_parents is None else host_parents[row])
            masks.append(mask)
            if self.mask_drafts:
                cut[row, torch.tensor([not v for v in valid])] = UNFILLED
        self._masks = torch.stack(masks)
        return cut if self.mask_drafts else tokens

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """logits [B * n, V] (n as prepared) with what the grammar disallows at each node at -inf (a node
        that allows nothing keeps its logits: it is past the grammar's end, never emitted)."""
        n, vocab = logits.shape[0] // self.size, logits.shape[-1]
        masks = self._masks
        if masks.shape[-1] < vocab:  # columns past the tokenizer's vocabulary
            masks = torch.cat([masks, masks.new_zeros(*masks.shape[:2], vocab - masks.shape[-1])], dim=-1)
        masks = masks | ~masks.any(dim=-1, keepdim=True)
        if len(self.rows) < self.size:  # requests without a grammar allow everything
            every = torch.ones(self.size, n, vocab, dtype=torch.bool)
            every[torch.tensor(self.rows)] = masks
            masks = every
        return logits.masked_fill(~masks.view(-1, vocab).to(logits.device), float("-inf"))

    def commit(self, tokens: list[list[int]]) -> None:
        """Each batch request's emitted tokens, consumed by its grammar."""
        for row, grammar in zip(self.rows, self.grammars):
            grammar.consume(tokens[row])

    def draft_walks(self) -> "dict[int, object] | None":
        """A DraftWalk per grammar row, for a chain's draft steps (None: drafts go unmasked)."""
        if not self.mask_drafts:
            return None
        return {row: grammar.draft_state() for row, grammar in zip(self.rows, self.grammars)}
