"""The attention-backend protocol.

A backend is bound to a model runner (`runner.attn_backend`). Before each forward the runner calls
`init_forward_metadata(batch)` on it, which prepares per-batch state on the backend itself; each
attention layer then calls `forward`, which stores the new K/V into the pool and attends over the
request's committed prefix plus the new tokens. Because the metadata lives on the backend, the
backend a runner is bound to decides how its forward runs.
"""

from typing import Protocol, runtime_checkable

import torch

from engine.forward_batch import ForwardBatch


@runtime_checkable
class AttentionBackend(Protocol):
    name: str

    def init_forward_metadata(self, batch: ForwardBatch) -> None: ...

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int,
                batch: ForwardBatch) -> torch.Tensor:
        """q: [N, Hq, D], k/v: [N, Hkv, D] for the new tokens -> attention output [N, Hq, D]."""
        ...
