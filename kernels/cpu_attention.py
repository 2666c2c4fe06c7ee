"""Attention over a KV pool read by slot, on a CPU (`cpu_attention.cpp`, built with the other C++ ops:
`cpu_ops`), for the few queries per request of a decode, verify or draft step inside a graph.

Why: gathering each request's context out of the pool ([B, C] slots) and running SDPA over the copy
writes and reads every key and value twice. The op reads each (request, KV head)'s keys and values once,
for every query and head of its group, in a fixed order per query (batch-invariant). Measured here
(2-core AMD EPYC, one layer, 4 query heads over 2 KV heads of 64, 160-200 columns in page-like runs):
batch 1 decode 12 vs 60 us for gather + SDPA, batch 8 56 vs 229 us, batch 8 x 4 queries 210 vs 317 us;
one request of 17 queries 114 vs 95 us (SDPA's blocked GEMMs win there). In a compiled plain decode
step: 1.07x at batch 1, 1.06x at batch 8, the same tokens.
"""

import torch


def paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, context_slots: torch.Tensor,
                    mask: torch.Tensor, scale: float) -> torch.Tensor:
    """q [B, w, Hq, D], pool k/v [S, Hkv, D], context_slots [B, C] (all in [0, S)), mask [B, w, C] additive
    (0 / -inf) -> [B, w, Hq, D]."""
    return torch.ops.eyas_cpu.paged_attention(q.contiguous(), k_cache, v_cache, context_slots.contiguous(),
                                              mask.contiguous(), scale)
