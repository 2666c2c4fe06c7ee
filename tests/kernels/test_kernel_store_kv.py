"""KV store kernel against plain-torch indexing: the stored values are exactly the inputs cast to the
cache dtype (tolerance 0), padded slots (-1) and every other slot stay untouched."""

import itertools

import pytest
import torch
from support.kernel_device import on_device

from eyas.kernels import store_kv as store_kv_module

store_kv = on_device(store_kv_module.store_kv)


def param_id(value):
    return str(value).removeprefix("torch.") if isinstance(value, torch.dtype) else None


def reference(k_cache, v_cache, k, v, slots):
    k_cache, v_cache = k_cache.clone(), v_cache.clone()
    keep = slots >= 0
    k_cache[slots[keep]] = k[keep].to(k_cache.dtype)
    v_cache[slots[keep]] = v[keep].to(v_cache.dtype)
    return k_cache, v_cache


def run_case(cache_dtype, input_dtype, head_dim, num_kv_heads, num_tokens, num_padded, seed=0):
    gen = torch.Generator().manual_seed(seed)
    num_slots = 2 * num_tokens + 5
    k_cache, v_cache = torch.randn(2, num_slots, num_kv_heads, head_dim, generator=gen).to(cache_dtype)
    # k, v as views of a packed [N, 3, Hkv, D] projection: token stride larger than Hkv * D
    qkv = torch.randn(num_tokens, 3, num_kv_heads, head_dim, generator=gen).to(input_dtype)
    k, v = qkv[:, 1], qkv[:, 2]
    slots = torch.randperm(num_slots, generator=gen)[:num_tokens]
    slots[torch.randperm(num_tokens, generator=gen)[:num_padded]] = -1
    expected_k, expected_v = reference(k_cache, v_cache, k, v, slots)
    store_kv(k_cache, v_cache, k, v, slots)
    torch.testing.assert_close(k_cache, expected_k, atol=0, rtol=0)
    torch.testing.assert_close(v_cache, expected_v, atol=0, rtol=0)


# (cache dtype, input dtype, head_dim, Hkv, N, padded)
CASES = [
    (torch.float32, torch.float32, 64, 1, 13, 3),
    (torch.float16, torch.float32, 80, 2, 7, 2),
    (torch.float16, torch.float16, 128, 3, 5, 0),
    (torch.float32, torch.float16, 80, 1, 4, 4),
]


@pytest.mark.parametrize("cache_dtype,input_dtype,head_dim,num_kv_heads,num_tokens,num_padded", CASES, ids=param_id)
def test_matches_reference(cache_dtype, input_dtype, head_dim, num_kv_heads, num_tokens, num_padded):
    run_case(cache_dtype, input_dtype, head_dim, num_kv_heads, num_tokens, num_padded)


@pytest.mark.slow
@pytest.mark.parametrize("cache_dtype,input_dtype,head_dim,num_kv_heads", list(itertools.product(
    [torch.float32, torch.float16], [torch.float32, torch.float16], [64, 80, 128], [1, 2, 4, 5])), ids=param_id)
def test_sweep(cache_dtype, input_dtype, head_dim, num_kv_heads):
    run_case(cache_dtype, input_dtype, head_dim, num_kv_heads, 33, 9, seed=head_dim + num_kv_heads)


def test_contiguous_slice_of_cache_and_empty_batch():
    gen = torch.Generator().manual_seed(3)
    pool = torch.zeros(2, 10, 2, 64)  # [K/V, S, Hkv, D], one layer's K and V in one tensor
    k, v = torch.randn(2, 3, 2, 64, generator=gen)
    slots = torch.tensor([9, -1, 0])
    store_kv(pool[0], pool[1], k, v, slots)
    assert torch.equal(pool[0, 9], k[0]) and torch.equal(pool[1, 0], v[2])
    assert pool[:, 1:9].abs().sum() == 0
    store_kv(pool[0], pool[1], k[:0], v[:0], slots[:0])  # no tokens: nothing to do


def valid_args():
    return dict(k_cache=torch.zeros(8, 2, 64), v_cache=torch.zeros(8, 2, 64), k=torch.randn(3, 2, 64),
                v=torch.randn(3, 2, 64), slots=torch.tensor([0, -1, 5]))


def bad(**overrides):
    return overrides


@pytest.mark.parametrize("overrides,match", [
    (bad(k_cache=torch.zeros(8, 128)), "k_cache must be"),
    (bad(v_cache=torch.zeros(8, 1, 64)), "v_cache shape"),
    (bad(k=torch.randn(3, 2, 80)), "k must be"),
    (bad(v=torch.randn(4, 2, 64)), "v shape"),
    (bad(slots=torch.tensor([0, 1])), "slots must be"),
    (bad(slots=torch.tensor([0, 1, 2], dtype=torch.int32)), "slots must be int64"),
    (bad(k=torch.randn(3, 64, 2).transpose(1, 2)), "k must be contiguous in its last dim"),
    (bad(k_cache=torch.zeros(8, 2, 64, dtype=torch.int32), v_cache=torch.zeros(8, 2, 64, dtype=torch.int32)),
     "k_cache must be float16"),
])
def test_rejects_bad_arguments(overrides, match):
    with pytest.raises(ValueError, match=match):
        store_kv(**{**valid_args(), **overrides})
