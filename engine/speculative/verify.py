"""Verification of a drafted chain against the target, for one verify forward.

The target's token at each verified position is chosen by the `Sampler`: its argmax (greedy), or its
keyed sample y_i = argmax_t p_i(t) / E(seed, i, t). A draft is accepted iff it equals that token, and
the first mismatch emits the target's token there, so the emitted tokens are exactly those plain
decoding would choose at those positions: for greedy requests the argmax, for sampled ones a draw
from the target's filtered distribution with the same noise. This is "draw y_i from p_i, descend iff
the draft is y_i", exact for any drafter.
"""

import torch


def accept_lengths(drafts: torch.Tensor, target_tokens: torch.Tensor) -> torch.Tensor:
    """drafts: [B, k]; target_tokens: [B, k+1] -> accept_lens [B] in 1..k+1.

    Request b emits target_tokens[b, :accept_lens[b]]: the accepted drafts (equal to the target's
    tokens there) followed by the target's own token at the first mismatch (or the bonus)."""
    matches = (drafts == target_tokens[:, :-1]).int()  # [B, k]
    return matches.cumprod(dim=1).sum(dim=1) + 1
