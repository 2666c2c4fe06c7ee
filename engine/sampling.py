"""Token choice: greedy, or sampled under temperature, top-k and top-p with noise keyed by
(request seed, output position).

A sampled request's token at output position i is argmax_t p_i(t) / E(seed, i, t): p_i is the
filtered target distribution, E standard exponential noise from `keyed_random` (the exponential race,
i.e. Gumbel-max), so the token is drawn from p_i. Because the noise depends on nothing but the seed,
the position and the token id, a seeded request emits the same tokens alone or in any batch, in plain
decoding or when a verify forward scores its position at any depth, whatever drafted it.
"""

from dataclasses import dataclass, field

import torch

from eyas.engine import keyed_random, logprobs
from eyas.engine.logits_processing import LogitsProcessing
from eyas.engine.sampling_params import SamplingParams
from eyas.engine.structured.batch import GrammarBatch


STREAMS = (keyed_random.DRAFT_STREAM, keyed_random.ACCEPT_STREAM, keyed_random.RESIDUAL_STREAM)
STREAM_IDS = torch.tensor(STREAMS, dtype=torch.int64)
CANDIDATES = 64  # columns first tried for a top-p row without top-k, before falling back to all
HOST_HASH_POSITIONS = 64  # a step's keys for up to this many positions are hashed on the host
SMALL_VOCABULARY = 8192  # up to this many columns, every row takes the all-columns filter at once
NUCLEUS_BUCKETS, BUCKET_WIDTH = 64, 0.25  # the all-columns top-p: buckets of log-probability below the row's max


def filtered_sorted(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor,
                    top_p: torch.Tensor, min_p: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """logits: [R, C]; temperature (> 0), top_k (0 = off), top_p (1 = off), min_p (0 = off): [R].

    Returns the filtered distribution (temperature, then min-p: columns below min_p x the best column's
    probability dropped, then top-k, then top-p over the top-k mass) as
    (probs [R, n], columns [R, n]) in descending order, cut after the longest row's support, when every
    row's support lies among its `CANDIDATES` best columns (or its top-k); else (an unfiltered row in
    the batch, a nucleus past the candidates, a vocabulary of at most `SMALL_VOCABULARY` columns),
    (probs [R, C], None) over every column, zero outside each row's support (`filtered_all_columns`: no
    sort). The two agree up to float rounding of the mass before a column at the nucleus's edge."""
    logits = logits.float() / temperature[:, None]
    if min_p is not None and bool((min_p > 0).any()):  # p < min_p x p_max  <=>  logit < max + log(min_p)
        floor = logits.amax(dim=-1, keepdim=True) + min_p.log()[:, None]
        logits = logits.masked_fill(logits < floor, float("-inf"))
    num_columns = logits.shape[-1]
    unfiltered = (top_k <= 0) & (top_p >= 1.0)
    if bool(unfiltered.all()):
        return logits.softmax(dim=-1), None
    has_k = top_k > 0
    width = min(num_columns, max(int(top_k.max()), CANDIDATES))  # a top_k past the vocabulary: every column
    if bool(unfiltered.any()) or width == num_columns or num_columns <= SMALL_VOCABULARY:
        return filtered_all_columns(logits, top_k, top_p), None
    values, columns = logits.topk(width, dim=-1)  # sorted, descending
    rank = torch.arange(width, device=logits.device)[None, :]
    values = values.masked_fill(has_k[:, None] & (rank >= top_k[:, None]), float("-inf"))
    # top-k rows normalise over their k best (all among the candidates); the others over every column
    log_norm = torch.where(has_k, values.logsumexp(dim=-1), logits.logsumexp(dim=-1))
    probs = (values - log_norm[:, None]).exp()
    mass_before = probs.cumsum(dim=-1) - probs
    if not bool(((mass_before[:, -1] >= top_p) | has_k).all()):
        return filtered_all_columns(logits, top_k, top_p), None  # a nucleus reaches past the candidates
    probs = probs.masked_fill((mass_before >= top_p[:, None]) & (rank > 0), 0.0)
    n = int((probs > 0).sum(dim=-1).max())
    probs = probs[:, :n]
    return probs / probs.sum(dim=-1, keepdim=True), columns[:, :n]


def filtered_all_columns(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """The filtered distribution of tempered logits [R, C] over every column, without sorting a row.

    Top-k keeps each row's k best columns by rank (ties at the k-th value cut as a sort would). Top-p
    buckets each column by its log-probability below the row's best (`BUCKET_WIDTH` nats per bucket):
    buckets above the one where the cumulative mass reaches top_p are kept whole, buckets below it
    dropped, and only that bucket's columns are ranked to find where the nucleus ends (a column is kept
    iff the mass ranked before it is below top_p)."""
    rows, num_columns = logits.shape
    has_k = (top_k > 0) & (top_k < num_columns)
    if bool(has_k.any()):  # exactly the k best by rank, as the candidate path (ties at the k-th value cut)
        kmax = int(top_k[has_k].max())
        best = logits.topk(kmax, dim=-1).indices
        ranked = torch.arange(kmax, device=logits.device)[None, :] < top_k[:, None]
        kept = torch.zeros(logits.shape, dtype=torch.bool, device=logits.device).scatter_(1, best, ranked)
        logits = logits.masked_fill(has_k[:, None] & ~kept, float("-inf"))
    probs = logits.softmax(dim=-1)
    has_p = top_p < 1.0
    if not bool(has_p.any()):
        return probs
    below_best = logits.amax(dim=-1, keepdim=True) - logits  # >= 0; inf for a column top-k dropped
    bucket = (below_best * (1.0 / BUCKET_WIDTH)).clamp_(max=NUCLEUS_BUCKETS - 1).long()
    mass = torch.zeros(rows, NUCLEUS_BUCKETS, device=logits.device).scatter_add_(1, bucket, probs)
    cumulative = mass.cumsum(dim=1)
    crossing = (cumulative < top_p[:, None]).sum(dim=1, keepdim=True).clamp_(max=NUCLEUS_BUCKETS - 1)  # [R, 1]
    above = cumulative.gather(1, crossing) - mass.gather(1, crossing)  # mass of the buckets kept whole
    # rows without top-p, and columns top-k dropped (probability 0), rank nothing
    in_crossing = (bucket == crossing) & has_p[:, None] & (probs > 0)
    width = max(int(in_crossing.sum(dim=1).max()), 1)
    values, columns = torch.where(in_crossing, probs, -1.0).topk(width, dim=-1)  # the crossing bucket, ranked
    values = values.clamp(min=0.0)
    ranked_before = above + values.cumsum(dim=-1) - values
    # the first ranked column always (a top_p that rounds to 0 in float32 still keeps the best column)
    first = torch.arange(width, device=logits.device)[None, :] == 0
    ranked_in = torch.zeros_like(in_crossing).scatter_(
        1, columns, (values > 0) & ((ranked_before < top_p[:, None]) | (first & (crossing == 0))))
    kept = torch.where(has_p[:, None], probs * ((bucket < crossing) | ranked_in), probs)
    return kept / kept.sum(dim=-1, keepdim=True)


def filtered_dense(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor,
                   top_p: torch.Tensor, min_p: torch.Tensor | None = None) -> torch.Tensor:
    """`filtered_sorted`'s distribution over every column: [R, C], zero outside each row's support."""
    probs, columns = filtered_sorted(logits, temperature, top_k, top_p, min_p)
    if columns is None:
        return probs
    return torch.zeros(logits.shape, dtype=probs.dtype, device=probs.device).scatter_(1, columns, probs)


def inverse_cdf(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """probs: [R, C] non-negative weights (each row's sum > 0); u: [R] uniforms in (0, 1) -> [R] the
    column whose cumulative-weight interval (lo, hi] holds v = u x the row's total: the first column with
    cdf >= v, always one of positive weight (v > 0, and v <= the total even where u x total rounds up)."""
    cdf = probs.cumsum(dim=-1)
    chosen = torch.searchsorted(cdf, (u * cdf[:, -1])[:, None])[:, 0]
    return chosen.clamp(max=probs.shape[-1] - 1)


@dataclass
class SamplingBatch:
    """What choosing tokens for B requests needs, built once per step. Only the requests that sample
    (temperature > 0) get tensors: `rows` [S] are their indices in the batch; temperature, top_k,
    top_p, min_p [S]; words [S, 2] their seed words; positions [S] the output position of each one's
    next token. `processing`: the logit bias and penalties of the requests (greedy or not) that set
    them, applied to the target's logits before any choice (None: no request does); `grammar`: the
    structured-output requests' grammars, masking after that.

    The noise keys of positions positions[s] .. positions[s] + horizon - 1, and the named streams'
    uniforms there, are computed once per step, on first use, for every call of the step to read:
    the drafter's steps and the verifier's positions (`horizon`: the positions a step reads; a call
    past it computes a wider window)."""

    size: int
    rows: torch.Tensor | None = None
    temperature: torch.Tensor | None = None
    top_k: torch.Tensor | None = None
    top_p: torch.Tensor | None = None
    min_p: torch.Tensor | None = None
    words: torch.Tensor | None = None
    positions: torch.Tensor | None = None
    horizon: int = 1
    host_words: list | None = field(default=None, repr=False)  # words and positions as host ints
    host_positions: list | None = field(default=None, repr=False)
    processing: LogitsProcessing | None = None
    grammar: GrammarBatch | None = None
    _keys: torch.Tensor | None = field(default=None, repr=False)  # [S, horizon, 2]
    _streams: torch.Tensor | None = field(default=None, repr=False)  # [S, horizon, len(STREAMS)]

    @classmethod
    def of(cls, params: list[SamplingParams], seed_words: list[tuple[int, int]], positions: list[int],
           device, horizon: int = 1) -> "SamplingBatch":
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
            min_p=tensor([p.min_p for p in ps], torch.float32),
            words=tensor([seed_words[i] for i in sampled], torch.int64),
            positions=tensor([positions[i] for i in sampled], torch.int64), horizon=horizon,
            host_words=[tuple(seed_words[i]) for i in sampled], host_positions=[positions[i] for i in sampled],
        )

    @classmethod
    def of_requests(cls, requests, device, horizon: int = 1, mask_drafts: bool = True) -> "SamplingBatch":
        """For requests whose next token is the one after their current output. `mask_drafts`: drafts
        follow the requests' grammars (`GrammarBatch`)."""
        batch = cls.of([r.params for r in requests], [r.seed_words for r in requests],
                       [len(r.output_ids) for r in requests], device, horizon)
        batch.processing = LogitsProcessing.of_requests(requests)
        batch.grammar = GrammarBatch.of_requests(requests, mask_drafts)
        return batch

    def processed(self, logits: torch.Tensor, tokens: torch.Tensor | None = None,
                  ancestors: torch.Tensor | None = None) -> torch.Tensor:
        """The target's logits [B * n, V] after the requests' logit bias and penalties (`LogitsProcessing.apply`)."""
        return logits if self.processing is None else self.processing.apply(logits, tokens, ancestors)

    @property
    def all_greedy(self) -> bool:
        return self.rows is None

    def _window(self, needed: int) -> None:
        """Keys and stream uniforms of the first max(horizon, needed) positions of every sampled request."""
        if self._keys is not None and self._keys.shape[1] >= needed:
            return
        self.horizon = max(self.horizon, needed)
        s, h = self.rows.shape[0], self.horizon
        device = self.positions.device
        if s * h <= HOST_HASH_POSITIONS and self.host_words is not None:  # a few: hashed on the host
            keys = [keyed_random.row_keys_host(w, p + j) for w, p in zip(self.host_words, self.host_positions)
                    for j in range(h)]
            bits = [keyed_random.hash_host(key, stream) for key in keys for stream in STREAMS]
            self._keys = torch.tensor(keys, dtype=torch.int64, device=device).view(s, h, 2)
            streams = keyed_random.to_uniforms(torch.tensor(bits, dtype=torch.int64, device=device))
            self._streams = streams.view(s, h, len(STREAMS))
            return
        positions = (self.positions[:, None] + torch.arange(h, device=device)).flatten()
        keys = keyed_random.row_keys(self.words.repeat_interleave(h, dim=0), positions)
        self._keys = keys.view(s, h, 2)
        self._streams = keyed_random.uniforms(keys, STREAM_IDS.to(device)).view(s, h, len(STREAMS))

    def _read(self, table: str, width: int, offset: int, offsets: torch.Tensor | None) -> torch.Tensor:
        """Rows of the "keys" or "streams" window [S, horizon, ...], request-major: [S * width, ...]."""
        depth = None if offsets is None else offsets[self.rows]  # [S, width]
        self._window(offset + width if depth is None else int(depth.max()) + 1)
        window = self._keys if table == "keys" else self._streams
        if depth is None:
            return window[:, offset:offset + width].flatten(0, 1)
        index = depth.view(*depth.shape, 1).expand(*depth.shape, window.shape[2])
        return window.gather(1, index).flatten(0, 1)

    def keys(self, width: int = 1, offset: int = 0, offsets: torch.Tensor | None = None) -> torch.Tensor:
        """Noise keys [S * width, 2] of the sampled requests' positions, request-major: row s * width + j
        is position positions[s] + offset + j, or positions[s] + offsets[rows[s], j] with `offsets` [B, width]."""
        return self._read("keys", width, offset, offsets)

    def uniforms(self, stream: int, width: int = 1, offset: int = 0,
                 offsets: torch.Tensor | None = None) -> torch.Tensor:
        """The named stream's uniforms [S * width] at the positions `keys` names."""
        return self._read("streams", width, offset, offsets)[:, STREAMS.index(stream)]

    def filters(self, width: int = 1) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """(temperature, top_k, top_p, min_p) of the sampled requests, each repeated `width` times: [S * width]."""
        return tuple(t.repeat_interleave(width) for t in (self.temperature, self.top_k, self.top_p, self.min_p))


class Sampler:
    def next_tokens(self, logits: torch.Tensor, requests, sampling: SamplingBatch) -> list[int]:
        """The token after each request's output so far, from logits [B, V] of that position: the logits
        processed (bias, penalties, grammar), the token chosen, its logprobs recorded for requests that
        ask, and it is consumed by the request's grammar."""
        processed = logits = sampling.processed(logits)
        if sampling.grammar is not None:
            sampling.grammar.prepare()
            logits = sampling.grammar.apply(logits)
        tokens = self.sample(logits, sampling)[:, 0].tolist()
        logprobs.record(requests, processed, [[i] for i in range(len(requests))], [[t] for t in tokens])
        if sampling.grammar is not None:
            sampling.grammar.commit([[t] for t in tokens])
        return tokens

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
        probs, columns = filtered_sorted(logits[rows], *batch.filters(width))
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
        probs, columns = filtered_sorted(logits[rows], *batch.filters(width))
        race = self._perturbed(probs, columns, batch, width, 0, offsets, token_ids, logits.shape[-1])
        if columns is not None:  # every column: the support's race values, -1 elsewhere
            race = torch.full((rows.shape[0], logits.shape[-1]), -1.0, device=logits.device).scatter_(1, columns, race)
        ranked[rows] = race.topk(k, dim=-1).indices
        return ranked

    @staticmethod
    def _perturbed(probs, columns, batch: SamplingBatch, width: int, offset: int, offsets, token_ids,
                   num_columns: int) -> torch.Tensor:
        """p(t) / E(seed, position, t) over each sampled row's support: [S * width, n]."""
        keys = batch.keys(width, offset, offsets)
        if columns is None:  # no filter: every column
            ids = torch.arange(num_columns, device=probs.device) if token_ids is None else token_ids
        else:  # noise only over the support
            ids = columns if token_ids is None else token_ids[columns]
        return probs / keyed_random.exponentials(keys, ids)

