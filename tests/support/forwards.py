"""One sequence through a model outside the engine."""

import torch

from eyas.engine.attention.dense import dense_batch, dense_positions


def dense_logits(model, ids: list[int]) -> torch.Tensor:
    """Every position's logits of `ids` as one dense prefill: [len(ids), vocab]."""
    t = len(ids)
    hidden, _ = model(torch.tensor(ids), dense_positions(1, t, "cpu"), dense_batch(1, t))
    return model.compute_logits(hidden)
