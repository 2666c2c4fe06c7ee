"""Where each running request keeps its draft state between iterations: the draft head's output at
its last committed row (the hidden state the next draft step reads, and the logits of its first
proposal), indexed by request-table row.

`ChainBuffers` is the topk=1 fast path: preallocated tensors, one row per request slot, gathered and
scattered in one op. `PerRequestDraftState` is the general path: a tensor pair per request, stacked
on load. Both hold the same values, so the two paths emit the same tokens.
"""

import torch


class ChainBuffers:
    def __init__(self, max_requests: int, hidden_size: int, vocab_size: int, dtype: torch.dtype, device: torch.device):
        self.hidden = torch.zeros(max_requests, hidden_size, dtype=dtype, device=device)  # [R, H]
        self.logits = torch.zeros(max_requests, vocab_size, dtype=torch.float32, device=device)  # [R, V]

    def store(self, rows: torch.Tensor, hidden: torch.Tensor, logits: torch.Tensor) -> None:
        self.hidden[rows] = hidden
        self.logits[rows] = logits

    def load(self, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.hidden[rows], self.logits[rows]


class PerRequestDraftState:
    def __init__(self):
        self._state: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def store(self, rows: torch.Tensor, hidden: torch.Tensor, logits: torch.Tensor) -> None:
        for i, row in enumerate(rows.tolist()):
            self._state[row] = (hidden[i].clone(), logits[i].clone())

    def load(self, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        pairs = [self._state[row] for row in rows.tolist()]
        return torch.stack([h for h, _ in pairs]), torch.stack([lg for _, lg in pairs])
