"""Preallocated tensors of the topk=1 verify forward for one step count k: the chain rows
[bonus, d_1..d_w] (w <= k) of every request slot and the logits rows to read (all of them)."""

import torch


class VerifyBuffers:
    def __init__(self, max_requests: int, num_steps: int, device: torch.device):
        self.num_steps = num_steps
        width = num_steps + 1
        self.chain = torch.zeros(max_requests, width, dtype=torch.int64, device=device)  # [R, k+1]
        self.logits_indices = torch.arange(max_requests * width, device=device)  # [R * (k+1)]

    def fill_chain(self, bonus: torch.Tensor, drafts: torch.Tensor) -> torch.Tensor:
        """bonus [B], drafts [B, w] (w <= k) -> the verify chain [B, w+1] (a view of the buffer)."""
        chain = self.chain[: bonus.shape[0], : drafts.shape[1] + 1]
        chain[:, 0] = bonus
        chain[:, 1:] = drafts
        return chain

    def indices(self, batch_size: int, width: int | None = None) -> torch.Tensor:
        """Every row of a verify of `batch_size` chains of `width` drafts (default k) and their bonus."""
        return self.logits_indices[: batch_size * ((self.num_steps if width is None else width) + 1)]
