"""The forward a graph runs: a model over B requests of w new tokens each, all inputs tensors.

    tokens, positions, out_cache_loc: [B, w]   the new tokens, their RoPE positions, their KV slots
    context_slots: [B, C]                      the KV slots of each request's positions 0..C-1
    prefix_lens: [B], node_mask: [B, w, w]     a tree only: committed lengths, and which nodes each node sees

Slot -1 (padding, or a column past a request's pages) reads and writes the pool's scratch row. Chain
and decode attention is causal by position (query at position p sees columns 0..p); a tree's node j,
written at column prefix + j, sees the whole prefix and the nodes `node_mask` allows.
"""

from dataclasses import dataclass, field

import torch

from eyas.engine.graphs.graph_attention import GraphAttention


@dataclass
class GraphBatch:
    """What a model's forward reads from its batch, inside a graph."""

    out_cache_loc: torch.Tensor  # [T]
    context_slots: torch.Tensor  # [B, C]
    mask: torch.Tensor  # [B, 1, w, C] additive (0 / -inf)
    max_position: int  # the RoPE cache's bound: tables come from the cache eager forwards use
    kv_pool: object = field(repr=False)
    attn_backend: GraphAttention = field(repr=False)


def attention_mask(positions: torch.Tensor, context: int, dtype: torch.dtype, prefix_lens: torch.Tensor | None = None,
                   node_mask: torch.Tensor | None = None) -> torch.Tensor:
    """[B, 1, w, C] additive mask: causal by position, or a tree's (prefix, then `node_mask` [B, w, w])."""
    b, w = positions.shape
    columns = torch.arange(context, device=positions.device)
    if node_mask is None:
        visible = columns[None, None, :] <= positions[:, :, None]  # [B, w, C]
    else:
        relative = columns[None, :] - prefix_lens[:, None]  # [B, C]: node index of each column past the prefix
        in_tree = (relative >= 0) & (relative < w)
        seen = node_mask.gather(2, relative.clamp(0, w - 1)[:, None, :].expand(b, w, context))
        visible = (relative < 0)[:, None, :] | (in_tree[:, None, :] & seen)
    blocked = torch.full((), float("-inf"), dtype=dtype, device=positions.device)
    return torch.where(visible, torch.zeros((), dtype=dtype, device=positions.device), blocked)[:, None]


def graph_forward(model, kv_pool, attention: GraphAttention, max_position: int, capture_layers: tuple[int, ...],
                  tokens, positions, out_cache_loc, context_slots, prefix_lens=None, node_mask=None, **model_inputs):
    """-> (hidden [T, H], aux: per captured layer [T, H])."""
    scratch = kv_pool.k[0].shape[0] - 1  # the scratch row of slot -1 (the pool's size is symbolic in a package)
    out_cache_loc = torch.where(out_cache_loc < 0, scratch, out_cache_loc).reshape(-1)
    context_slots = torch.where(context_slots < 0, scratch, context_slots)
    dtype = kv_pool.k[0].dtype
    mask = attention_mask(positions, context_slots.shape[1], dtype, prefix_lens, node_mask)
    batch = GraphBatch(out_cache_loc, context_slots, mask, max_position, kv_pool, attention)
    if capture_layers:
        model_inputs["aux_layer_ids"] = capture_layers
    return model(tokens.reshape(-1), positions.reshape(-1), batch, **model_inputs)
