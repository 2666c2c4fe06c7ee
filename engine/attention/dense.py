"""Causal attention over whole sequences held in the batch, with no KV cache: training and scoring.

The packed tokens are `batch_size` sequences of `seq_len` tokens each (`N = batch_size * seq_len`).
"""

from dataclasses import dataclass

import torch
from torch.nn import functional as F


@dataclass
class DenseBatch:
    batch_size: int
    seq_len: int
    attn_backend: object = None

    @property
    def max_position(self) -> int:
        return self.seq_len - 1


class DenseCausalBackend:
    name = "dense_causal"

    def init_forward_metadata(self, batch: DenseBatch) -> None:
        pass

    def forward(self, q, k, v, layer_id: int, batch: DenseBatch) -> torch.Tensor:
        b, t = batch.batch_size, batch.seq_len
        q = q.view(b, t, *q.shape[1:]).transpose(1, 2)  # [B, Hq, T, D]
        k = k.view(b, t, *k.shape[1:]).transpose(1, 2)
        v = v.view(b, t, *v.shape[1:]).transpose(1, 2)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=k.shape[1] != q.shape[1])
        return out.transpose(1, 2).reshape(b * t, *out.shape[1:2], out.shape[-1])


def dense_batch(batch_size: int, seq_len: int) -> DenseBatch:
    return DenseBatch(batch_size, seq_len, DenseCausalBackend())


def dense_positions(batch_size: int, seq_len: int, device) -> torch.Tensor:
    return torch.arange(seq_len, device=device).repeat(batch_size)  # [B * T]
