"""Preallocated tensors of a verify forward of up to N nodes per request: the logits rows to read
(every node's), so a verify allocates no index tensor."""

import torch


class VerifyBuffers:
    def __init__(self, max_requests: int, num_draft_tokens: int, device: torch.device):
        self.num_draft_tokens = num_draft_tokens
        self.logits_indices = torch.arange(max_requests * num_draft_tokens, device=device)  # [R * N]

    def indices(self, batch_size: int, width: int) -> torch.Tensor:
        """Every row of a verify of `batch_size` requests of `width` nodes each (width <= N)."""
        return self.logits_indices[: batch_size * width]
