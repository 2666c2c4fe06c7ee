"""The torch_native backend against attention written out by hand, over a paged pool with ragged requests."""

import pytest
import torch
from support.references import naive_attention

from eyas.engine.attention.torch_native import TorchNativeBackend
from eyas.engine.cache.kv_pool import PagedKVPool
from eyas.engine.cpu_ops import cpu_ops_error
from eyas.engine.forward_batch import ForwardBatch


@pytest.mark.parametrize("batch_invariant", [False, True])
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("num_heads,num_kv_heads,head_dim", [(4, 4, 16), (4, 2, 80), (8, 2, 32)])
def test_extend_over_paged_prefix_matches_naive(page_size, num_heads, num_kv_heads, head_dim, batch_invariant):
    """Batched, and batch-invariant: a prefill in one causal call, a request past a prefix query by query
    (in eyas's paged attention op where it reads the pool, float32 on a CPU)."""
    torch.manual_seed(0)
    num_pages, max_ctx = 256 // page_size, 128
    pool = PagedKVPool(1, num_pages, page_size, num_kv_heads, head_dim, torch.float32, torch.device("cpu"))
    # scattered pages: each request owns a random set of slots
    slots = torch.randperm(num_pages * page_size)
    prefix_lens, extend_lens = [0, 13, 1, 40], [7, 1, 20, 3]
    table = torch.full((4, max_ctx), -1, dtype=torch.int64)
    start = 0
    for r, total in enumerate(p + e for p, e in zip(prefix_lens, extend_lens)):
        table[r, :total] = slots[start:start + total]
        start += total
    full_k = [torch.randn(p + e, num_kv_heads, head_dim) for p, e in zip(prefix_lens, extend_lens)]
    full_v = [torch.randn(p + e, num_kv_heads, head_dim) for p, e in zip(prefix_lens, extend_lens)]
    for r, p in enumerate(prefix_lens):  # committed prefix already in the pool
        pool.store(0, table[r, :p], full_k[r][:p], full_v[r][:p])
    batch = ForwardBatch.from_tails([0, 1, 2, 3], [[5] * e for e in extend_lens], prefix_lens, table)
    batch.kv_pool = pool
    q = torch.randn(sum(extend_lens), num_heads, head_dim)
    k = torch.cat([full_k[r][p:] for r, p in enumerate(prefix_lens)])
    v = torch.cat([full_v[r][p:] for r, p in enumerate(prefix_lens)])
    backend = TorchNativeBackend(head_dim, batch_invariant=batch_invariant)
    backend.init_forward_metadata(batch)
    if batch_invariant and cpu_ops_error() is None:  # the requests past a prefix attend in the paged op
        assert [p is not None for p in backend.metadata.paged] == [p > 0 for p in prefix_lens]
    out = backend.forward(q, k, v, 0, batch)
    offset = 0
    for r, (p, e) in enumerate(zip(prefix_lens, extend_lens)):
        expected = naive_attention(q[offset:offset + e], full_k[r], full_v[r], range(p, p + e), head_dim ** -0.5)
        torch.testing.assert_close(out[offset:offset + e], expected, atol=1e-5, rtol=1e-5)
        offset += e
    # the new tokens' KV landed in their slots
    torch.testing.assert_close(pool.k[0][table[3, 40:43]], full_k[3][40:])


def test_store_skips_padded_slots():
    pool = PagedKVPool(1, 2, 4, 1, 2, torch.float32, torch.device("cpu"))
    pool.store(0, torch.tensor([3, -1, 5]), torch.ones(3, 1, 2), torch.ones(3, 1, 2))
    assert pool.k[0][:pool.num_slots, 0, 0].tolist() == [0, 0, 0, 1, 0, 1, 0, 0]
