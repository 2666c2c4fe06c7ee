"""Attention inside a graph: static structure, sizes from the inputs' shapes, no host metadata.

Each layer writes the new tokens' K/V into its own pool tensor in place (`index_copy_` by slot), then
attends every request's context by slot ([B, C] slots from the request-to-token table) under the mask
the forward built once for all layers. A float32 pool on a CPU is read in place by eyas's paged
attention op (`kernels/cpu_attention.py`); otherwise the context is gathered by slot and SDPA runs over
it, the compiler fusing the gathers and the mask into its own kernels.

eyas's op computes a query alike whatever the batch, the context length past its own and its other queries,
so where it serves, a chain's graph computes the bits a batch-invariant eager forward computes
(`attends_per_query`). A tree's nodes sit at their columns, not where a decode of the accepted path sees
them, so a tree verify does not.
"""

import torch
from torch.nn import functional as F

from eyas.engine.cpu_ops import paged_attention_runs
from eyas.kernels.cpu_attention import paged_attention


def paged_kernel_runs(kv_pool) -> bool:
    """Whether eyas's paged attention op serves this pool: float32 on a CPU, the C++ ops built here."""
    return attends_per_query(kv_pool.k[0].device, kv_pool.k[0].dtype)


def attends_per_query(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether graphs attend a pool of `dtype` on `device` one query at a time, as batch-invariant eager
    attention does: where eyas's paged attention op serves it."""
    return paged_attention_runs(device, dtype)


class GraphAttention:
    name = "graph"

    def __init__(self, head_dim: int, paged_kernel: bool = False):
        self.scale = head_dim ** -0.5
        self.paged_kernel = paged_kernel  # eyas's op reads the pool in place (paged_kernel_runs)

    def forward(self, q, k, v, layer_id: int, batch) -> torch.Tensor:
        # q: [T, Hq, D]; k, v: [T, Hkv, D] -> [T, Hq, D], T = B * w tokens, w per request
        k_cache, v_cache = batch.kv_pool.k[layer_id], batch.kv_pool.v[layer_id]
        k_cache.index_copy_(0, batch.out_cache_loc, k.to(k_cache.dtype))
        v_cache.index_copy_(0, batch.out_cache_loc, v.to(v_cache.dtype))
        b, context = batch.context_slots.shape
        if self.paged_kernel and q.dtype == torch.float32:
            t, num_heads, head_dim = q.shape
            out = paged_attention(q.view(b, t // b, num_heads, head_dim), k_cache, v_cache, batch.context_slots,
                                  batch.mask, self.scale)  # [B, w, Hq, D]
            return out.view(t, num_heads, head_dim)
        slots = batch.context_slots.reshape(-1)
        keys = k_cache.index_select(0, slots).view(b, context, *k_cache.shape[1:]).to(q.dtype)
        values = v_cache.index_select(0, slots).view(b, context, *v_cache.shape[1:]).to(q.dtype)
        t, num_heads, head_dim = q.shape
        queries = q.view(b, t // b, num_heads, head_dim).transpose(1, 2)  # [B, Hq, w, D]
        out = F.scaled_dot_product_attention(queries, keys.transpose(1, 2), values.transpose(1, 2),
                                             attn_mask=batch.mask, scale=self.scale,
                                             enable_gqa=keys.shape[2] != num_heads)  # [B, Hq, w, D]
        return out.transpose(1, 2).reshape(t, num_heads, head_dim)
