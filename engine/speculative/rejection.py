"""Rejection-sampling verification (`speculative.verify=rejection`) for sampled requests.

A chain's drafts are drawn from the draft's own filtered distribution q (same temperature, top-k and
top-p as the target's), and the target accepts draft x at a position with probability min(1, p(x) / q(x));
at the first rejection it draws its own token from the residual norm(max(0, p - q)), and after the last
accepted draft from p. Each emitted token then follows p exactly, and a draft is accepted with
probability 1 - TV(p, q), the most any rule gets from one draft. A deterministic draft (n-gram lookup,
`draft_sampling: greedy`) is the case q = a point mass at x: accept with probability p(x), on rejection
draw from p without x.

A tree's children are deterministic (the draft's top-k), so testing siblings in turn, each accepted with
probability p(c) over the mass the siblings before it left, is the same as drawing y from p at the node
and descending iff y is a child: each node draws y from p, and verify walks the tree as for greedy.

Randomness is keyed by (seed, output position) as the reproducible mode's is, from three named streams
(`keyed_random`: the draft's draw, the accept test, the target's draw), each used once per position
that ends up emitted, so seeded output repeats for a given configuration; unlike the reproducible mode
it depends on what was drafted. Greedy requests are verified by argmax match in both modes. A cycle that
drafted nothing (0 steps) draws its token as plain decoding does, from the sampler's own stream for
that position: a draw from p either way, and plain decoding's token.
"""

from dataclasses import dataclass

import torch

from eyas.engine.keyed_random import ACCEPT_STREAM, DRAFT_STREAM, RESIDUAL_STREAM
from eyas.engine.sampling import SamplingBatch, filtered_dense, filtered_sorted, inverse_cdf


@dataclass
class DraftProbs:
    """The distributions a chain's drafts were drawn from, for the sampled requests only: per draft
    step, q [S, w] over w columns and their target ids, [S, w] (the best columns of each row), [w]
    (every column of a reduced draft vocabulary) or None (every column, draft ids = target ids)."""

    steps: list[tuple[torch.Tensor, torch.Tensor | None]]

    def dense(self, vocab_size: int) -> torch.Tensor:
        """q over the target's vocabulary: [S, k, V]."""
        q0 = self.steps[0][0]
        out = torch.zeros(q0.shape[0], len(self.steps), vocab_size, dtype=q0.dtype, device=q0.device)
        for j, (q, ids) in enumerate(self.steps):
            if ids is None:
                out[:, j, :q.shape[-1]] = q
            elif ids.dim() == 1:
                out[:, j].index_copy_(1, ids, q)
            else:
                out[:, j].scatter_(1, ids, q)
        return out


def draw_drafts(logits: torch.Tensor, sampling: SamplingBatch, offset: int
                ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor] | None]:
    """logits: [B, Vd] the draft's scores for output position positions + offset. Returns (columns [B]: the
    argmax for greedy requests, a draw from the draft's filtered distribution q for sampled ones; (q [S, w],
    its draft columns [S, w], or None: every column) of the sampled ones, or None)."""
    columns = logits.argmax(dim=-1)
    if sampling.all_greedy:
        return columns, None
    q, q_columns = filtered_sorted(logits[sampling.rows], *sampling.filters())
    drawn = inverse_cdf(q, sampling.uniforms(DRAFT_STREAM, 1, offset))
    columns[sampling.rows] = drawn if q_columns is None else q_columns.gather(1, drawn[:, None])[:, 0]
    return columns, (q, q_columns)


def verify_chain(logits: torch.Tensor, drafts: torch.Tensor, sampling: SamplingBatch,
                 draft_probs: DraftProbs | None) -> tuple[torch.Tensor, torch.Tensor]:
    """logits: [B * n, V] the verify forward's, request-major; drafts: [B, k] target ids (k = n - 1, -1 =
    unfilled); draft_probs: the q of sampled drafts (None: every draft is deterministic).

    Returns (accept_lens [B] in 1..n, chosen [B, n]): request b emits chosen[b, :accept_lens[b]]."""
    b, k = drafts.shape
    n, vocab = k + 1, logits.shape[-1]
    chosen = logits.argmax(dim=-1).view(b, n)
    accept_lens = (drafts == chosen[:, :-1]).int().cumprod(dim=1).sum(dim=1) + 1
    if sampling.all_greedy:
        return accept_lens, chosen
    rows = sampling.rows
    s = rows.shape[0]
    p = filtered_dense(logits.view(b, n, vocab)[rows].view(s * n, vocab), *sampling.filters(n)).view(s, n, vocab)
    x = drafts[rows]  # [S, k]
    filled = x >= 0
    index = x.clamp(min=0)[..., None]
    px = p[:, :k].gather(-1, index)[..., 0]
    q = None if draft_probs is None else draft_probs.dense(vocab)
    qx = torch.ones_like(px) if q is None else q.gather(-1, index)[..., 0]
    u_accept = sampling.uniforms(ACCEPT_STREAM, n).view(s, n)[:, :k]
    accepted = filled & (u_accept * qx < px)  # u < p / q, q(x) > 0 for a drawn x
    m = accepted.int().cumprod(dim=1).sum(dim=1)  # [S] accepted drafts
    at = torch.arange(s, device=logits.device)
    p_m = p[at, m]  # [S, V] the target's distribution where it draws its own token
    if k == 0:
        residual = p_m
    else:
        last = m.clamp(max=k - 1)
        x_m = x.gather(1, last[:, None])[:, 0]
        rejected = (m < k) & (x_m >= 0)  # a draft was turned down there (not a hole, not the bonus)
        if q is None:  # a point mass at the draft
            removed = torch.zeros_like(p_m).scatter_(1, x_m.clamp(min=0)[:, None], 1.0)
        else:
            removed = q[at, last]
        residual = (p_m - removed * rejected[:, None]).clamp(min=0)
        # p and q equal to the last bit leave nothing: then any draw from p is exact (the rejection had
        # probability zero up to rounding)
        residual = torch.where((residual.sum(dim=-1) > 0)[:, None], residual, p_m)
    u_draw = sampling.uniforms(RESIDUAL_STREAM, n).view(s, n)[at, m]
    row_chosen = torch.cat([x.clamp(min=0), x.new_zeros(s, 1)], dim=1)
    row_chosen[at, m] = inverse_cdf(residual, u_draw)
    chosen[rows] = row_chosen
    accept_lens[rows] = m + 1
    return accept_lens, chosen


def tree_choices(logits: torch.Tensor, sampling: SamplingBatch, depths: torch.Tensor) -> torch.Tensor:
    """logits: [B * N, V] the verify forward's over trees of deterministic children; depths: [B, N].
    Returns the target's token at each node [B, N]: the argmax for greedy requests, a draw from p for
    sampled ones (nodes of one depth share the position's uniform: only one of them is on the path)."""
    b, n = depths.shape
    chosen = logits.argmax(dim=-1).view(b, n)
    if sampling.all_greedy:
        return chosen
    rows = (sampling.rows[:, None] * n + torch.arange(n, device=logits.device)).flatten()
    probs, columns = filtered_sorted(logits[rows], *sampling.filters(n))
    u = sampling.uniforms(RESIDUAL_STREAM, n, offsets=depths)
    drawn = inverse_cdf(probs, u)
    if columns is not None:
        drawn = columns.gather(1, drawn[:, None])[:, 0]
    chosen[sampling.rows] = drawn.view(-1, n)
    return chosen
