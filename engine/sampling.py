"""Token sampling: greedy, temperature, top-k, top-p, one generator per request.

A request's draws come only from its own generator, so a seeded request emits the same tokens
alone or inside any batch.
"""

import torch

from engine.sampling_params import SamplingParams


def filtered_probs(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor,
                   top_p: torch.Tensor) -> torch.Tensor:
    """logits: [B, V]; temperature (> 0), top_k (0 = off), top_p (1 = off): [B] -> probabilities [B, V]."""
    logits = logits.float() / temperature[:, None]
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    rank = torch.arange(logits.shape[-1], device=logits.device)[None, :]
    k = torch.where(top_k > 0, top_k, logits.shape[-1])
    sorted_logits = sorted_logits.masked_fill(rank >= k[:, None], float("-inf"))
    sorted_probs = sorted_logits.softmax(dim=-1)
    mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
    sorted_probs = sorted_probs.masked_fill((mass_before >= top_p[:, None]) & (rank > 0), 0.0)
    sorted_probs = sorted_probs / sorted_probs.sum(dim=-1, keepdim=True)
    return torch.zeros_like(sorted_probs).scatter_(-1, order, sorted_probs)


def params_tensors(params: list[SamplingParams], device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    temperature = torch.tensor([max(p.temperature, 1e-6) for p in params], dtype=torch.float32, device=device)
    top_k = torch.tensor([p.top_k for p in params], dtype=torch.int64, device=device)
    top_p = torch.tensor([p.top_p for p in params], dtype=torch.float32, device=device)
    return temperature, top_k, top_p


class Sampler:
    def sample(self, logits: torch.Tensor, params: list[SamplingParams],
               generators: list[torch.Generator | None]) -> list[int]:
        """logits: [B, V] -> one token id per row."""
        tokens = logits.argmax(dim=-1).tolist()
        sampled = [i for i, p in enumerate(params) if not p.greedy]
        if sampled:
            rows = torch.tensor(sampled, device=logits.device)
            probs = filtered_probs(logits[rows], *params_tensors([params[i] for i in sampled], logits.device))
            for j, i in enumerate(sampled):
                tokens[i] = int(torch.multinomial(probs[j], 1, generator=generators[i]))
        return tokens
