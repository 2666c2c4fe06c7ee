"""Attention in plain torch: gathers each request's paged KV into a padded batch and runs SDPA.

Runs on CPU and CUDA. Extend (prefill, verify, draft-extend) and decode are one code path: a decode
is an extend by one token. The mask lets query `j` of a request see KV index `i` when
`i <= prefix_len + j` and `i < seq_len`, so padding is never read.
"""

from dataclasses import dataclass

import torch
from torch.nn import functional as F

from engine.forward_batch import ForwardBatch


@dataclass
class TorchNativeMetadata:
    kv_slots: torch.Tensor  # [B, max_kv] slots of every request's KV (padding clamped to 0, masked)
    mask: torch.Tensor  # [B, 1, max_q, max_kv] True = attend
    dest: torch.Tensor  # [N] row of each packed query in the padded [B * max_q] layout
    max_q: int


class TorchNativeBackend:
    name = "torch_native"

    def __init__(self, head_dim: int):
        self.scale = head_dim ** -0.5
        self.metadata: TorchNativeMetadata | None = None

    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        device = batch.input_ids.device
        extend = torch.tensor(batch.extend_lens, dtype=torch.int64, device=device)
        prefix = torch.tensor(batch.prefix_lens, dtype=torch.int64, device=device)
        seq = prefix + extend
        b, max_q, max_kv = batch.batch_size, max(batch.extend_lens), max(batch.seq_lens)
        kv_slots = batch.req_to_token[batch.req_rows, :max_kv].clamp(min=0)
        kv_idx = torch.arange(max_kv, device=device)
        q_idx = prefix[:, None] + torch.arange(max_q, device=device)[None, :]  # [B, max_q]
        mask = (kv_idx[None, None, :] <= q_idx[:, :, None]) & (kv_idx[None, None, :] < seq[:, None, None])
        starts = extend.cumsum(0) - extend
        req_of_token = torch.repeat_interleave(torch.arange(b, device=device), extend)
        offset = torch.arange(int(extend.sum()), device=device) - starts[req_of_token]
        self.metadata = TorchNativeMetadata(kv_slots, mask[:, None], req_of_token * max_q + offset, max_q)

    def forward(self, q, k, v, layer_id: int, batch: ForwardBatch) -> torch.Tensor:
        pool = batch.kv_pool
        pool.store(layer_id, batch.out_cache_loc, k, v)
        meta = self.metadata
        b, n, num_heads, head_dim = batch.batch_size, q.shape[0], q.shape[1], q.shape[2]
        q_pad = q.new_zeros(b * meta.max_q, num_heads, head_dim)
        q_pad[meta.dest] = q
        q_pad = q_pad.view(b, meta.max_q, num_heads, head_dim).transpose(1, 2)  # [B, Hq, max_q, D]
        keys = pool.k[layer_id][meta.kv_slots].transpose(1, 2).to(q.dtype)  # [B, Hkv, max_kv, D]
        values = pool.v[layer_id][meta.kv_slots].transpose(1, 2).to(q.dtype)
        out = F.scaled_dot_product_attention(q_pad, keys, values, attn_mask=meta.mask, scale=self.scale,
                                             enable_gqa=keys.shape[1] != num_heads)
        out = out.transpose(1, 2).reshape(b * meta.max_q, num_heads, head_dim)
        return out[meta.dest].view(n, num_heads, head_dim)
