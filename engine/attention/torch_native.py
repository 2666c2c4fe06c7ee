"""Attention in plain torch: reads each request's paged KV and runs SDPA.

Runs on CPU and CUDA. Extend (prefill, verify, draft-extend) and decode are one code path: a decode
is an extend by one token. The mask lets query `j` of a request see KV index `i` when
`i <= prefix_len + j` and `i < seq_len`, so padding is never read.

Batch-invariant mode (`batch_invariant`, or a forward marked `exact`): a prompt without a prefix prefills in
one causal call (outside an exact forward); every other query attends on its own, all of a request's queries in one call of eyas's
paged attention op where it reads the pool (float32 on a CPU: a fixed order per query whatever the other
queries and the context length), otherwise one SDPA call per query.

Everything that depends only on the batch (KV gather indices, mask, padding layout) is computed once
per forward in `init_forward_metadata` and shared by all layers. Per layer, the KV of a lone request
whose slots form one ascending contiguous run (the allocator hands pages out so) is read as a view
(no copy) and its new KV is stored with one copy; otherwise one `index_select` over precomputed flat
indices gathers it. The mask is additive (0 / -inf), made once, so SDPA does not convert it in every
layer. Requests that all extend by the same number of tokens (decode, chain verify) need no padding:
their packed queries already form the [B, q_len] grid.
"""

from dataclasses import dataclass

import torch
from torch.nn import functional as F

from eyas.engine.cpu_ops import paged_attention_runs
from eyas.engine.forward_batch import ForwardBatch
from eyas.kernels.cpu_attention import paged_attention


@dataclass
class TorchNativeMetadata:
    max_q: int
    max_kv: int
    kv_range: tuple[int, int] | None  # (first slot, seq_len): a lone request's KV is pool[first:first + seq_len]
    kv_index: torch.Tensor | None  # [B * max_kv] slots of every request's KV (padding clamped to 0, masked)
    mask: torch.Tensor | None  # [B, 1, max_q, max_kv] True = attend; None: every query sees all max_kv
    dest: torch.Tensor | None  # [N] row of each packed query in the padded [B * max_q] layout; None: no padding
    causal_offset: int | None = None  # a lone request: query j sees keys 0..offset + j (no `mask` tensor)
    additive_mask: torch.Tensor | None = None  # the mask as 0 / -inf in the queries' dtype, made by the first layer

    def mask_for(self, dtype: torch.dtype, device: torch.device) -> torch.Tensor | None:
        if self.mask is None and self.causal_offset is None:
            return None
        if self.additive_mask is None or self.additive_mask.dtype != dtype:
            if self.mask is not None:
                additive = torch.zeros(self.mask.shape, dtype=dtype, device=device).masked_fill_(~self.mask, float("-inf"))
            else:  # -inf strictly above the diagonal shifted right by the offset
                additive = torch.full((1, 1, self.max_q, self.max_kv), float("-inf"), dtype=dtype, device=device)
                additive.triu_(self.causal_offset + 1)
            self.additive_mask = additive
        return self.additive_mask


@dataclass
class InvariantMetadata:
    """Batch-invariant mode: each request's KV gathered on its own, each query attended on its own."""
    slots: list[torch.Tensor]  # per request: [seq_len] KV slots of its positions
    runs: list[tuple[int, int] | None]  # per request: (first slot, seq_len) when its slots are one run (read as a view)
    keys_of: list[list[torch.Tensor] | None]  # per request: a tree's [keys] positions per node; None: a chain's
    # per request whose queries attend one by one, where eyas's paged attention op serves the pool: its
    # context slots [1, C] and additive mask [1, w, C] (query j sees the columns it would see alone)
    paged: list[tuple[torch.Tensor, torch.Tensor] | None]


class TorchNativeBackend:
    name = "torch_native"

    def __init__(self, head_dim: int, batch_invariant: bool = False):
        self.scale = head_dim ** -0.5
        # every query of a decode or a verify attends in a call of its own, over exactly the keys it
        # sees, so its output does not depend on the batch or on the other queries of its request; on
        # for every forward here, or for those marked `exact` (ForwardBatch.exact)
        self.batch_invariant = batch_invariant
        self.metadata: TorchNativeMetadata | InvariantMetadata | None = None

    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        if self.batch_invariant or batch.exact:
            self.metadata = _invariant_metadata(batch, paged=paged_attention_runs(batch.kv_pool.k[0].device, batch.kv_pool.k[0].dtype))
            return
        device = batch.input_ids.device
        prefix_lens, extend_lens = batch.prefix_lens, batch.extend_lens
        seq_lens = [p + e for p, e in zip(prefix_lens, extend_lens)]
        b, max_q, max_kv = len(extend_lens), max(extend_lens), max(seq_lens)
        uniform = min(extend_lens) == max_q
        kv_range = None
        if b == 1 and batch.rows is not None:
            kv_range = _contiguous_run(batch.req_to_token[batch.rows[0], :max_kv])
        kv_index = None
        if kv_range is None:
            kv_index = batch.req_to_token[batch.req_rows, :max_kv].clamp(min=0).flatten()  # [B * max_kv]
        causal_offset = None
        if batch.custom_mask is not None:  # tree attention: the whole prefix, then the nodes' own mask
            mask = _tree_mask(batch, prefix_lens, extend_lens, max_kv, device)
        elif max_q == 1 and min(seq_lens) == max_kv:
            mask = None  # decode over equal lengths: every key is visible to its query
        elif b == 1:
            mask, causal_offset = None, prefix_lens[0]  # query j sees keys 0..prefix + j: made in `mask_for`
        else:
            prefix = torch.tensor(prefix_lens, dtype=torch.int64, device=device)
            seq = torch.tensor(seq_lens, dtype=torch.int64, device=device)
            kv_idx = torch.arange(max_kv, device=device)
            q_idx = prefix[:, None] + torch.arange(max_q, device=device)[None, :]  # [B, max_q]
            mask = ((kv_idx[None, None, :] <= q_idx[:, :, None]) & (kv_idx[None, None, :] < seq[:, None, None]))[:, None]
        dest = None if uniform else _padded_rows(extend_lens, max_q, device)
        self.metadata = TorchNativeMetadata(max_q, max_kv, kv_range, kv_index, mask, dest, causal_offset)

    def forward(self, q, k, v, layer_id: int, batch: ForwardBatch) -> torch.Tensor:
        # q: [N, Hq, D]; k, v: [N, Hkv, D] -> [N, Hq, D]
        if isinstance(self.metadata, InvariantMetadata):
            return self._forward_invariant(q, k, v, layer_id, batch)
        pool = batch.kv_pool
        meta = self.metadata
        if meta.kv_range is not None:  # the new tokens' slots end the request's contiguous run
            first, length = meta.kv_range
            pool.store_run(layer_id, first + length - q.shape[0], k, v)
        else:
            pool.store(layer_id, batch.out_cache_loc, k, v)
        b, n, num_heads, head_dim = batch.batch_size, q.shape[0], q.shape[1], q.shape[2]
        if meta.dest is None:
            q_pad = q.view(b, meta.max_q, num_heads, head_dim)
        else:
            q_pad = q.new_zeros(b * meta.max_q, num_heads, head_dim)
            q_pad[meta.dest] = q
            q_pad = q_pad.view(b, meta.max_q, num_heads, head_dim)
        keys, values = pool.k[layer_id], pool.v[layer_id]
        if meta.kv_range is not None:
            first, length = meta.kv_range
            keys, values = keys[first:first + length].unsqueeze(0), values[first:first + length].unsqueeze(0)
        else:
            keys = keys.index_select(0, meta.kv_index).view(b, meta.max_kv, *keys.shape[1:])
            values = values.index_select(0, meta.kv_index).view(b, meta.max_kv, *values.shape[1:])
        if keys.dtype != q.dtype:
            keys, values = keys.to(q.dtype), values.to(q.dtype)
        out = F.scaled_dot_product_attention(q_pad.transpose(1, 2), keys.transpose(1, 2), values.transpose(1, 2),
                                             attn_mask=meta.mask_for(q.dtype, q.device), scale=self.scale,
                                             enable_gqa=keys.shape[2] != num_heads)  # [B, Hq, max_q, D]
        out = out.transpose(1, 2)
        if meta.dest is None:
            return out.reshape(n, num_heads, head_dim)
        return out.reshape(b * meta.max_q, num_heads, head_dim)[meta.dest]


    def _forward_invariant(self, q, k, v, layer_id: int, batch: ForwardBatch) -> torch.Tensor:
        # a prefill (no prefix) runs causally in one call per request: every run prefills a prompt alike;
        # a decode or a verify runs one call per query, [1, Hq, 1, D] against [1, Hkv, keys, D]. An exact
        # forward runs every query so, a prefill's too: a position's output then does not depend on where
        # its prompt's prefill was split (by the prefix cache, by chunking) either
        pool, meta = batch.kv_pool, self.metadata
        pool.store(layer_id, batch.out_cache_loc, k, v)
        out, start, gqa = torch.empty_like(q), 0, k.shape[1] != q.shape[1]
        for slots, run, keys_of, paged, prefix, extend in zip(meta.slots, meta.runs, meta.keys_of, meta.paged,
                                                              batch.prefix_lens, batch.extend_lens):
            if paged is not None and q.dtype == torch.float32:  # every query of the request in one call, each alone
                context, mask = paged
                queries = q[start:start + extend].view(context.shape[0], mask.shape[1], *q.shape[1:])  # [B, w, Hq, D]
                out[start:start + extend] = paged_attention(queries, pool.k[layer_id], pool.v[layer_id], context, mask,
                                                            self.scale).view(extend, *q.shape[1:])
                start += extend
                continue
            if run is not None:  # the same values and strides as the gather, without the copy
                keys, values = pool.k[layer_id][run[0]:run[0] + run[1]], pool.v[layer_id][run[0]:run[0] + run[1]]
            else:
                keys, values = pool.k[layer_id].index_select(0, slots), pool.v[layer_id].index_select(0, slots)
            if keys.dtype != q.dtype:
                keys, values = keys.to(q.dtype), values.to(q.dtype)
            if prefix == 0 and not batch.exact:
                out[start:start + extend] = F.scaled_dot_product_attention(
                    q[start:start + extend].transpose(0, 1)[None], keys.transpose(0, 1)[None],
                    values.transpose(0, 1)[None], is_causal=True, scale=self.scale, enable_gqa=gqa)[0].transpose(0, 1)
            else:
                for j in range(extend):
                    if keys_of is None:
                        seen_k, seen_v = keys[:prefix + j + 1], values[:prefix + j + 1]
                    else:
                        seen_k, seen_v = keys.index_select(0, keys_of[j]), values.index_select(0, keys_of[j])
                    out[start + j] = F.scaled_dot_product_attention(
                        q[start + j][None, :, None], seen_k.transpose(0, 1)[None], seen_v.transpose(0, 1)[None],
                        scale=self.scale, enable_gqa=gqa)[0, :, 0]
            start += extend
        return out


def _invariant_metadata(batch: ForwardBatch, paged: bool = False) -> InvariantMetadata:
    rows = batch.rows if batch.rows is not None else batch.req_rows.tolist()
    slots = [batch.req_to_token[row, :p + e].clamp(min=0) for row, p, e in zip(rows, batch.prefix_lens, batch.extend_lens)]
    keys_of: list[list[torch.Tensor] | None] = [None] * len(rows)
    if batch.custom_mask is not None:  # a tree: node j sees the prefix, then its ancestors and itself in order
        n = batch.extend_lens[0]
        blocks = batch.custom_mask.view(len(rows), n, n).bool()
        for i, prefix in enumerate(batch.prefix_lens):
            ancestors = [torch.nonzero(blocks[i, j]).flatten() + prefix for j in range(n)]
            keys_of[i] = [torch.cat((torch.arange(prefix, device=a.device), a)) for a in ancestors]
    one_by_one = [prefix > 0 or batch.exact for prefix in batch.prefix_lens]
    paged_args = [_paged_args(s, p, e, k) if paged and alone else None
                  for s, p, e, k, alone in zip(slots, batch.prefix_lens, batch.extend_lens, keys_of, one_by_one)]
    return InvariantMetadata(slots, [_contiguous_run(s) for s in slots], keys_of, paged_args)


def _paged_args(slots: torch.Tensor, prefix: int, extend: int,
                keys_of: list[torch.Tensor] | None) -> tuple[torch.Tensor, torch.Tensor]:
    """A request's queries as the paged op takes them: context slots [B, C] and additive mask [B, w, C].
    A chain is one row (B = 1, w = extend) whose query j sees columns 0 .. prefix + j; a tree gives each
    node a row of its own (B = extend, w = 1) holding exactly its keys in order, padded at the end: the
    columns it sees are then those its one-token decode sees, in the same places."""
    if keys_of is None:
        mask = torch.full((extend, slots.shape[0]), float("-inf"), device=slots.device).triu_(prefix + 1)
        return slots[None].long().contiguous(), mask[None]
    width = max(keys.shape[0] for keys in keys_of)
    context = torch.zeros(extend, width, dtype=torch.int64, device=slots.device)
    mask = torch.full((extend, 1, width), float("-inf"), device=slots.device)
    for j, keys in enumerate(keys_of):
        context[j, :keys.shape[0]] = slots[keys]
        mask[j, 0, :keys.shape[0]] = 0.0
    return context, mask


def _contiguous_run(slots: torch.Tensor) -> tuple[int, int] | None:
    """(first, length) when `slots` [L] are exactly first, first + 1, ..., first + L - 1; None otherwise."""
    length = slots.shape[0]
    first, last = int(slots[0]), int(slots[length - 1])
    if first < 0 or last - first != length - 1:
        return None
    if not torch.equal(slots, torch.arange(first, first + length, dtype=slots.dtype, device=slots.device)):
        return None
    return first, length


def _tree_mask(batch: ForwardBatch, prefix_lens: list[int], extend_lens: list[int], max_kv: int,
               device) -> torch.Tensor:
    """[B, 1, n, max_kv] bool of a tree batch (every request extends by the same n tokens)."""
    n = extend_lens[0]
    if any(e != n for e in extend_lens):
        raise ValueError(f"a tree batch extends every request by the same number of tokens, got {extend_lens}")
    b = len(extend_lens)
    blocks = batch.custom_mask.view(b, n, n).bool()
    prefix = torch.tensor(prefix_lens, dtype=torch.int64, device=device)
    kv_idx = torch.arange(max_kv, device=device)
    mask = (kv_idx[None, None, :] < prefix[:, None, None]).expand(b, n, max_kv).clone()  # [B, n, max_kv]
    columns = (prefix[:, None] + torch.arange(n, device=device)).clamp(max=max_kv - 1)  # [B, n] the nodes' columns
    mask.scatter_(2, columns[:, None, :].expand(b, n, n), blocks)
    return mask[:, None]


def _padded_rows(extend_lens: list[int], max_q: int, device) -> torch.Tensor:
    # [N] position of each packed query in the [B * max_q] padded layout
    rows = [i * max_q + j for i, e in enumerate(extend_lens) for j in range(e)]
    return torch.tensor(rows, dtype=torch.int64, device=device)
