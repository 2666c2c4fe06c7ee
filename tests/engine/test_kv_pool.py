"""The paged KV pool's tensors: zero until written, each its own memory, aligned as torch's allocator aligns
(on a CPU they start as the kernel's zero pages, not as a fill)."""

import pytest
import torch

from eyas.engine.cache.kv_pool import PagedKVPool


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_a_pool_starts_zeroed_aligned_and_its_tensors_apart(dtype):
    pool = PagedKVPool(num_layers=3, num_pages=64, page_size=16, num_kv_heads=2, head_dim=64, dtype=dtype,
                       device=torch.device("cpu"))
    tensors = pool.k + pool.v
    assert all(t.shape == (64 * 16 + 1, 2, 64) and t.dtype == dtype and t.is_contiguous() for t in tensors)
    assert all(t.data_ptr() % 64 == 0 and not t.any() for t in tensors)
    pool.store(1, torch.tensor([5, -1]), torch.ones(2, 2, 64, dtype=dtype), torch.full((2, 2, 64), 2.0, dtype=dtype))
    assert pool.k[1][5].eq(1).all() and pool.v[1][5].eq(2).all() and pool.k[1][-1].eq(1).all()
    assert pool.k[1].count_nonzero() == 2 * 2 * 64  # slot 5 and the scratch row
    assert not any(t.any() for i, t in enumerate(tensors) if t is not pool.k[1] and t is not pool.v[1])
