"""The graphs' paged attention on a CPU (kernels/cpu_attention.cpp) against SDPA over a gathered context."""

import math

import pytest
import torch
from torch.nn import functional as F

from eyas.engine.cpu_ops import cpu_ops_error
from eyas.kernels.cpu_attention import paged_attention


@pytest.fixture(scope="module", autouse=True)
def built():
    assert cpu_ops_error() is None  # built (or found) in the test run's cache root


def causal_mask(lens: torch.Tensor, width: int, context: int) -> torch.Tensor:
    """[B, 1, w, C] additive: the request's w new tokens end at its length; each sees its columns up to itself."""
    positions = lens[:, None] - width + torch.arange(width)
    visible = torch.arange(context)[None, None, :] <= positions[:, :, None]
    return torch.where(visible, 0.0, float("-inf"))[:, None]


def reference(q, k_cache, v_cache, slots, mask, scale):
    keys, values = k_cache[slots].double(), v_cache[slots].double()  # [B, C, Hkv, D]
    out = F.scaled_dot_product_attention(q.double().transpose(1, 2), keys.transpose(1, 2), values.transpose(1, 2),
                                         attn_mask=mask.double(), scale=scale, enable_gqa=True)
    return out.transpose(1, 2).float()


@pytest.mark.parametrize("batch,width,context", [(1, 1, 1), (1, 1, 37), (3, 5, 64), (8, 1, 160), (2, 9, 9), (2, 4, 13)])
@pytest.mark.parametrize("heads,kv_heads,head_dim", [(4, 2, 64), (6, 6, 80), (3, 1, 13)])
def test_paged_attention_equals_sdpa_over_the_gathered_context(batch, width, context, heads, kv_heads, head_dim):
    generator = torch.Generator().manual_seed(batch * 100 + width * 10 + context + head_dim)
    slots_in_pool = 300
    k_cache = torch.randn(slots_in_pool, kv_heads, head_dim, generator=generator)
    v_cache = torch.randn(slots_in_pool, kv_heads, head_dim, generator=generator)
    q = torch.randn(batch, width, heads, head_dim, generator=generator) * 3
    slots = torch.randint(0, slots_in_pool, (batch, context), generator=generator)  # scattered, repeats allowed
    lens = torch.randint(width, context + 1, (batch,), generator=generator)  # ragged: padding columns masked
    mask = causal_mask(lens, width, context)
    scale = 1 / math.sqrt(head_dim)
    out = paged_attention(q, k_cache, v_cache, slots, mask, scale)
    torch.testing.assert_close(out, reference(q, k_cache, v_cache, slots, mask, scale), atol=2e-6, rtol=2e-5)


def test_a_tree_mask_and_a_query_that_sees_nothing():
    generator = torch.Generator().manual_seed(7)
    k_cache, v_cache = torch.randn(50, 2, 16, generator=generator), torch.randn(50, 2, 16, generator=generator)
    q = torch.randn(2, 4, 4, 16, generator=generator)
    slots = torch.randint(0, 50, (2, 10), generator=generator)
    visible = torch.rand(2, 4, 10, generator=generator) < 0.5
    visible[1, 2] = False  # sees no column: a zero output, as the graph's padding rows give
    mask = torch.where(visible, 0.0, float("-inf"))
    out = paged_attention(q, k_cache, v_cache, slots, mask, 0.25)
    assert torch.equal(out[1, 2], torch.zeros(4, 16))
    rows = visible.any(-1)
    expected = reference(q, k_cache, v_cache, slots, mask[:, None], 0.25)
    torch.testing.assert_close(out[rows], expected[rows], atol=2e-6, rtol=2e-5)


def test_masked_columns_weigh_exactly_nothing():
    # a padding column may read any slot (the scratch row holds whatever was written there last)
    generator = torch.Generator().manual_seed(5)
    k_cache, v_cache = torch.randn(30, 2, 16, generator=generator), torch.randn(30, 2, 16, generator=generator)
    k_cache[29], v_cache[29] = float("inf"), float("nan")
    q = torch.randn(1, 2, 4, 16, generator=generator)
    slots = torch.tensor([[0, 1, 2, 3, 4, 5, 6, 7, 8, 29, 29, 29]])  # 9 columns of its own, then padding
    mask = causal_mask(torch.tensor([9]), 2, 12)
    out = paged_attention(q, k_cache, v_cache, slots, mask, 0.25)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, reference(q, k_cache, v_cache, slots[:, :9], mask[..., :9], 0.25), atol=2e-6, rtol=2e-5)


def test_a_request_computes_alike_alone_and_in_any_batch():
    # each query row's scores, softmax and sum run in a fixed order whatever else the call holds
    generator = torch.Generator().manual_seed(3)
    k_cache, v_cache = torch.randn(400, 2, 64, generator=generator), torch.randn(400, 2, 64, generator=generator)
    q = torch.randn(5, 6, 4, 64, generator=generator)
    slots = torch.randint(0, 400, (5, 90), generator=generator)
    lens = [90, 40, 17, 66, 6]
    mask = causal_mask(torch.tensor(lens), 6, 90)
    batched = paged_attention(q, k_cache, v_cache, slots, mask, 0.125)
    for b in range(5):
        assert torch.equal(paged_attention(q[b:b + 1], k_cache, v_cache, slots[b:b + 1], mask[b:b + 1], 0.125),
                           batched[b:b + 1]), b
        # alone, its context only as long as itself (a batch's context is its longest request's)
        own = lens[b]
        assert torch.equal(paged_attention(q[b:b + 1], k_cache, v_cache, slots[b:b + 1, :own].contiguous(),
                                           mask[b:b + 1, ..., :own].contiguous(), 0.125), batched[b:b + 1]), b
        for i in range(6):  # one query of the request alone, its mask row kept
            alone = paged_attention(q[b:b + 1, i:i + 1].contiguous(), k_cache, v_cache, slots[b:b + 1],
                                    mask[b:b + 1, :, i:i + 1].contiguous(), 0.125)
            assert torch.equal(alone[0, 0], batched[b, i]), (b, i)


def test_the_op_checks_its_operands():
    k_cache = torch.randn(20, 2, 8)
    q, slots, mask = torch.randn(1, 1, 4, 8), torch.zeros(1, 5, dtype=torch.int64), torch.zeros(1, 1, 1, 5)
    with pytest.raises(RuntimeError, match="outside the pool"):
        paged_attention(q, k_cache, k_cache, torch.full((1, 5), 20), mask, 1.0)
    with pytest.raises(RuntimeError, match="q must be"):
        paged_attention(q.double(), k_cache, k_cache, slots, mask, 1.0)
    with pytest.raises(RuntimeError, match="Hq a multiple of Hkv"):
        paged_attention(torch.randn(1, 1, 3, 8), k_cache, k_cache, slots, mask, 1.0)
    with pytest.raises(RuntimeError, match="mask must be"):
        paged_attention(q, k_cache, k_cache, slots, torch.zeros(1, 1, 1, 4), 1.0)
    with pytest.raises(RuntimeError, match="mask must be"):  # as many numbers, the wrong shape
        paged_attention(torch.randn(1, 5, 4, 8), k_cache, k_cache, slots, torch.zeros(1, 25), 1.0)
