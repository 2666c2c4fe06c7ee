"""Rotary position embedding with Llama's scaling variants (`default`, `linear`, `llama3`)."""

import math

import torch
from torch import nn

from engine.models.config import LlamaConfig


def rope_inv_freq(config: LlamaConfig) -> torch.Tensor:
    dim = config.head_dim
    inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    scaling = config.rope_scaling or {}
    rope_type = config.rope_type
    if rope_type == "linear":
        inv_freq = inv_freq / scaling["factor"]
    elif rope_type == "llama3":
        factor = scaling["factor"]
        low_freq_factor = scaling["low_freq_factor"]
        high_freq_factor = scaling["high_freq_factor"]
        old_context_len = scaling["original_max_position_embeddings"]
        low_freq_wavelen = old_context_len / low_freq_factor
        high_freq_wavelen = old_context_len / high_freq_factor
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
        smooth = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        is_medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
        inv_freq = torch.where(is_medium, smoothed, scaled)
    return inv_freq


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class RotaryEmbedding(nn.Module):
    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.config = config
        self.register_buffer("inv_freq", rope_inv_freq(config), persistent=False)

    def reset(self, device: torch.device) -> None:
        """Recompute the frequencies (after building the model on the meta device)."""
        self.inv_freq = rope_inv_freq(self.config).to(device)

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor):
        # positions: [N]; q: [N, Hq, D]; k: [N, Hkv, D]
        freqs = positions.float()[:, None] * self.inv_freq.float()[None, :]  # [N, D/2]
        emb = torch.cat((freqs, freqs), dim=-1)
        cos = emb.cos().to(q.dtype)[:, None, :]
        sin = emb.sin().to(q.dtype)[:, None, :]
        return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
