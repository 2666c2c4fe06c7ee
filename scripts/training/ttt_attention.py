"""Attention for EAGLE-3's training-time test: the draft unrolled over several steps in parallel.

Chain j (rooted at sequence position j) at step s has rope position j + s. Like the draft at
inference, it attends to the step-0 rows 0..j (computed from true target features) and to its own
rows of steps 1..s (computed from its own earlier outputs): a causal block plus a diagonal per step.
"""

from dataclasses import dataclass

import torch


@dataclass
class TTTBatch:
    batch_size: int
    seq_len: int
    step: int
    attn_backend: "TTTAttention"

    @property
    def max_position(self) -> int:
        return self.seq_len - 1 + self.step  # chain j at step s has rope position j + s


class TTTAttention:
    name = "ttt"

    def __init__(self):
        self.cache: list[tuple[torch.Tensor, torch.Tensor]] = []

    def init_forward_metadata(self, batch: TTTBatch) -> None:
        if batch.step == 0:
            self.cache = []

    def forward(self, q, k, v, layer_id: int, batch: TTTBatch) -> torch.Tensor:
        b, t = batch.batch_size, batch.seq_len
        q = q.view(b, t, *q.shape[1:]).transpose(1, 2)  # [B, Hq, T, D]
        k = k.view(b, t, *k.shape[1:]).transpose(1, 2)  # [B, Hkv, T, D]
        v = v.view(b, t, *v.shape[1:]).transpose(1, 2)
        group = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
        self.cache.append((k, v))
        scale = q.shape[-1] ** -0.5
        k0, v0 = self.cache[0]
        causal = torch.ones(t, t, dtype=torch.bool, device=q.device).tril()
        scores = (q @ k0.transpose(-1, -2) * scale).masked_fill(~causal, float("-inf"))  # [B, H, T, T]
        diag = [(q * ks).sum(-1, keepdim=True) * scale for ks, _ in self.cache[1:]]  # each [B, H, T, 1]
        probs = torch.cat([scores, *diag], dim=-1).softmax(dim=-1)
        out = probs[..., :t] @ v0
        for i, (_, vs) in enumerate(self.cache[1:]):
            out = out + probs[..., t + i:t + i + 1] * vs
        return out.transpose(1, 2).reshape(b * t, q.shape[1], q.shape[-1])
