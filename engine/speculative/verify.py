"""Verification of a drafted chain against the target, for one verify forward.

Greedy: the longest prefix of drafts that equals the target's argmax, plus the target's next argmax.
Sampling: standard speculative rejection sampling, which emits tokens distributed exactly as the
target's (filtered) distribution: accept draft d with probability min(1, p(d) / q(d)); at the first
rejection, sample from normalize(max(p - q, 0)); if every draft is accepted, sample the bonus from p.
A greedy draft is the point mass q = onehot(d): accept with probability p(d), resample from p without d.
"""

import torch


def verify_greedy(target_logits: torch.Tensor, draft_tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """target_logits: [B, k+1, V]; draft_tokens: [B, k] -> (accept_lens [B] in 1..k+1, tokens [B, k+1]).

    Request b emits tokens[b, :accept_lens[b]]: the accepted drafts (equal to the target's argmax
    there) followed by the target's own next token."""
    target_tokens = target_logits.argmax(dim=-1)  # [B, k+1]
    matches = (draft_tokens == target_tokens[:, :-1]).int()  # [B, k]
    accepted = matches.cumprod(dim=1).sum(dim=1)  # [B]
    return accepted + 1, target_tokens


def verify_sampled_row(target_probs: torch.Tensor, draft_tokens: list[int], draft_probs: torch.Tensor | None,
                       generator: torch.Generator | None) -> list[int]:
    """One request. target_probs: [k+1, V]; draft_probs: [k, V], or None for a greedy draft.
    Returns the emitted tokens (accepted drafts, then one corrected or bonus token)."""
    emitted = []
    for i, token in enumerate(draft_tokens):
        p = target_probs[i]
        q_token = 1.0 if draft_probs is None else float(draft_probs[i, token])
        u = float(torch.rand((), generator=generator, device=p.device))
        if u * q_token < float(p[token]):  # u < p/q without dividing by a zero q
            emitted.append(token)
            continue
        if draft_probs is None:
            residual = p.clone()
            residual[token] = 0.0
        else:
            residual = (p - draft_probs[i]).clamp_(min=0.0)
        if float(residual.sum()) <= 0.0:  # p <= q everywhere: only possible when p == q, so p itself
            residual = p
        emitted.append(int(torch.multinomial(residual, 1, generator=generator)))
        return emitted
    emitted.append(int(torch.multinomial(target_probs[len(draft_tokens)], 1, generator=generator)))
    return emitted
