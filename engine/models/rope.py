"""Rotary position embedding with Llama's scaling variants (`default`, `linear`, `llama3`)."""

import math

import torch
from torch import nn

from eyas.engine.models.config import ModelConfig


def rope_inv_freq(config: ModelConfig) -> torch.Tensor:
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


def _sin_sign(head_dim: int) -> torch.Tensor:
    half = head_dim // 2
    return torch.cat((-torch.ones(half), torch.ones(half)))  # [D]


class RopeTables:
    """cos / sin of one forward's positions, computed once and applied in every layer.

    Llama's `rotate_half(x) * sin` equals `roll(x, D/2) * signed_sin` with the first half of `sin` negated:
    one roll instead of two slices, a negation and a cat, with the same products and sums."""

    def __init__(self, cos: torch.Tensor, signed_sin: torch.Tensor):
        self.cos = cos  # [N, 1, D]
        self.signed_sin = signed_sin  # [N, 1, D]

    def apply(self, x: torch.Tensor) -> torch.Tensor:
        # x: [N, H, D] (q and k heads side by side) -> rotated, [N, H, D]
        return x * self.cos + torch.roll(x, x.shape[-1] // 2, dims=-1) * self.signed_sin


class RotaryEmbedding(nn.Module):
    """cos / sin for positions 0..P-1 are computed once (P grows in powers of two as longer sequences
    arrive) and each forward looks its positions up: two index ops instead of computing them anew.
    Each entry is computed exactly as it would be for that position alone."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        with torch.device("cpu"):  # a model built on meta computes them here all the same: meta math is slow
            self.register_buffer("inv_freq", rope_inv_freq(config), persistent=False)
            self.register_buffer("sin_sign", _sin_sign(config.head_dim), persistent=False)
        self._cache: dict[torch.dtype, tuple[torch.Tensor, torch.Tensor]] = {}  # dtype -> cos, signed sin [P, 1, D]

    def reset(self, device: torch.device) -> None:
        """Recompute the frequencies (after building the model on the meta device)."""
        self.inv_freq = rope_inv_freq(self.config).to(device)
        self.sin_sign = _sin_sign(self.config.head_dim).to(device)
        self._cache.clear()

    def tables(self, positions: torch.Tensor, dtype: torch.dtype, max_position: int | None = None) -> RopeTables:
        """RoPE tables for `positions` [N]; `max_position` (an upper bound of the positions, known on the
        host) lets them come from the cache, else they are computed directly."""
        if max_position is None:
            return RopeTables(*self._compute(positions, dtype))
        cos, signed_sin = self._cache.get(dtype, (None, None))
        if cos is None or cos.shape[0] <= max_position:
            size = max(64, 1 << max_position.bit_length())
            cos, signed_sin = self._cache[dtype] = self._compute(torch.arange(size, device=positions.device), dtype)
        return RopeTables(cos.index_select(0, positions), signed_sin.index_select(0, positions))

    def _compute(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions.float()[:, None] * self.inv_freq.float()[None, :]  # [N, D/2]
        emb = torch.cat((freqs, freqs), dim=-1)[:, None, :]  # [N, 1, D]
        return emb.cos().to(dtype), emb.sin().to(dtype) * self.sin_sign.to(dtype)
