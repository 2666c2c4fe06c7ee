"""Token choice: greedy, or sampled under temperature, top-k and top-p with noise keyed by
(request seed, output position).

A sampled request's token at output position i is argmax_t p_i(t) / E(seed, i, t): p_i is the
filtered target distribution, E standard exponential noise from `keyed_random` (the exponential race,
i.e. Gumbel-max), so the token is drawn from p_i. Because the noise depends on nothing but the seed,
the position and the token id, a seeded request emits the same tokens alone or in any batch, in plain
decoding or when a verify forward scores its position at any depth, whatever drafted it.
"""

from dataclasses import dataclass

import torch

from engine import keyed_random
from engine.sampling_params import SamplingParams


CANDIDATES = 64  # columns first tried for a top-p row without top-k, before falling back to all


def filtered_sorted(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor,
                    top_p: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """logits: [R, C]; temperature (> 0), top_k (0 = off), top_p (1 = off): [R].

    Returns the filtered distribution (temperature, then top-k, then top-p over the top-k mass) as
    (probs [R, n], columns [R, n]) in descending order, cut after the longest row's support; or
    (probs [R, C], None) when no row filters. Only as many columns as the filters can keep are
    ranked: a top-k row needs its k best; a top-p row first tries its `CANDIDATES` best and falls back
    to a full sort when they hold less than top_p of the mass."""
    logits = logits.float() / temperature[:, None]
    num_columns = logits.shape[-1]
    unfiltered = (top_k <= 0) & (top_p >= 1.0)
    if bool(unfiltered.all()):
        return logits.softmax(dim=-1), None
    has_k = top_k > 0
    width = num_columns if bool(unfiltered.any()) else min(num_columns, max(int(top_k.max()), CANDIDATES))
    while True:
        values, columns = logits.topk(width, dim=-1)  # sorted, descending
        rank = torch.arange(width, device=logits.device)[None, :]
        values = values.masked_fill(has_k[:, None] & (rank >= top_k[:, None]), float("-inf"))
        # top-k rows normalise over their k best (all among the candidates); the others over every column
        log_norm = torch.where(has_k, values.logsumexp(dim=-1), logits.logsumexp(dim=-1))
        probs = (values - log_norm[:, None]).exp()
        mass_before = probs.cumsum(dim=-1) - probs
        if width == num_columns or bool(((mass_before[:, -1] >= top_p) | has_k).all()):
            break
        width = num_columns  # a top-p row's nucleus reaches past the candidates
    probs = probs.masked_fill((mass_before >= top_p[:, None]) & (rank > 0), 0.0)
    n = int((probs > 0).sum(dim=-1).max())
    probs = probs[:, :n]
    return probs / probs.sum(dim=-1, keepdim=True), columns[:, :n]


@dataclass
class SamplingBatch:
    """What choosing tokens for B requests needs, built once per step. Only the requests that sample
    (temperature > 0) get tensors: `rows` [S] are their indices in the batch; temperature, top_k,
    top_p [S]; words [S, 2] their seed words; positions [S] the output position of each one's next token."""

    size: int
    rows: torch.Tensor | None = None
    temperature: torch.Tensor | None = None
    top_k: torch.Tensor | None = None
    top_p: torch.Tensor | None = None
    words: torch.Tensor | None = None
    positions: torch.Tensor | None = None

    @classmethod
    def of(cls, params: list[SamplingParams], seed_words: list[tuple[int, int]], positions: list[int],
           device) -> "SamplingBatch":
        sampled = [i for i, p in enumerate(params) if not p.greedy]
        if not sampled:
            return cls(len(params))
        ps = [params[i] for i in sampled]

        def tensor(values, dtype):
            return torch.tensor(values, dtype=dtype, device=device)

        return cls(
            len(params), rows=tensor(sampled, torch.int64),
            temperature=tensor([p.temperature for p in ps], torch.float32),
            top_k=tensor([p.top_k for p in ps], torch.int64), top_p=tensor([p.top_p for p in ps], torch.float32),
            words=tensor([seed_words[i] for i in sampled], torch.int64),
            positions=tensor([positions[i] for i in sampled], torch.int64),
        )

    @classmethod
    def of_requests(cls, requests, device) -> "SamplingBatch":
        """For requests whose next token is the one after their current output."""
        return cls.of([r.params for r in requests], [r.seed_words for r in requests],
                      [len(r.output_ids) for r in requests], device)

    @property
    def all_greedy(self) -> bool:
        return self.rows is None


class Sampler:
    def sample(self, logits: torch.Tensor, batch: SamplingBatch, width: int = 1, offset: int = 0,
               token_ids: torch.Tensor | None = None, offsets: torch.Tensor | None = None) -> torch.Tensor:
        """logits: [B * width, C], request-major: row b * width + j scores request b's output position
        positions[b] + offset + j, or positions[b] + offsets[b, j] when `offsets` [B, width] is given
        (a draft tree's node depths). Returns the chosen column of each row as [B, width].

        Columns are token ids unless `token_ids` [C] names them (a draft vocabulary): the noise is
        keyed by token id, so a drafter sampling its own distribution over its own columns uses the
        same noise as the target does for the same token (coupled draws)."""
        tokens = logits.argmax(dim=-1).view(batch.size, width)
        if batch.all_greedy:
            return tokens
        rows = batch.rows
        if width > 1:
            rows = (rows[:, None] * width + torch.arange(width, device=rows.device)).flatten()
        probs, columns = filtered_sorted(logits[rows], *(t.repeat_interleave(width) for t in
                                                           (batch.temperature, batch.top_k, batch.top_p)))
        chosen = self._perturbed(probs, columns, batch, width, offset, offsets, token_ids, logits.shape[-1])
        chosen = chosen.argmax(dim=-1, keepdim=True)
        if columns is not None:
            chosen = columns.gather(-1, chosen)
        tokens[batch.rows] = chosen.view(-1, width)
        return tokens

    def ranked(self, logits: torch.Tensor, batch: SamplingBatch, offsets: torch.Tensor, k: int,
               token_ids: torch.Tensor | None = None) -> torch.Tensor:
        """The k distinct columns each row would choose first, best first: [B * width, k]. logits and
        offsets as in `sample`. A greedy row ranks by logit; a sampled row by p(t) / E(t) with the noise
        of its position, so its first column is `sample`'s choice and the others follow it in that race
        (columns outside its support come last). Draft trees propose these as a node's children."""
        width = offsets.shape[1]
        ranked = logits.topk(k, dim=-1).indices
        if batch.all_greedy:
            return ranked
        rows = (batch.rows[:, None] * width + torch.arange(width, device=logits.device)).flatten()
        probs, columns = filtered_sorted(logits[rows], *(t.repeat_interleave(width) for t in
                                                           (batch.temperature, batch.top_k, batch.top_p)))
        race = self._perturbed(probs, columns, batch, width, 0, offsets, token_ids, logits.shape[-1])
        if columns is not None:  # every column: the support's race values, -1 elsewhere
            race = torch.full((rows.shape[0], logits.shape[-1]), -1.0, device=logits.device).scatter_(1, columns, race)
        ranked[rows] = race.topk(k, dim=-1).indices
        return ranked

    @staticmethod
    def _perturbed(probs, columns, batch: SamplingBatch, width: int, offset: int, offsets, token_ids,
                   num_columns: int) -> torch.Tensor:
        """p(t) / E(seed, position, t) over each sampled row's support: [S * width, n]."""
        if offsets is None:
            positions = batch.positions[:, None] + offset + torch.arange(width, device=probs.device)  # [S, width]
        else:
            positions = batch.positions[:, None] + offsets[batch.rows]
        keys = keyed_random.row_keys(batch.words.repeat_interleave(width, dim=0), positions.flatten())
        if columns is None:  # no filter: every column
            ids = torch.arange(num_columns, device=probs.device) if token_ids is None else token_ids
        else:  # noise only over the support
            ids = columns if token_ids is None else token_ids[columns]
        return probs / keyed_random.exponentials(keys, ids)

