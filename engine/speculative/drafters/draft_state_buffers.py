"""Where each running request keeps its draft state between iterations: the draft head's output at
its last committed row (the hidden state the next draft step reads, and the logits of its first
proposal), in preallocated tensors with one row per request slot, gathered and scattered in one op.
Chains and trees start from the same state: a tree's root is that row.
"""

import torch


class DraftStateBuffers:
    def __init__(self, max_requests: int, hidden_size: int, vocab_size: int, dtype: torch.dtype, device: torch.device):
        self.hidden = torch.zeros(max_requests, hidden_size, dtype=dtype, device=device)  # [R, H]
        self.logits = torch.zeros(max_requests, vocab_size, dtype=torch.float32, device=device)  # [R, V]

    def store(self, rows: torch.Tensor, hidden: torch.Tensor, logits: torch.Tensor) -> None:
        self.hidden[rows] = hidden
        self.logits[rows] = logits

    def load(self, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.hidden[rows], self.logits[rows]
