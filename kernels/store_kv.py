"""Store K and V of new tokens into one layer's paged KV cache.

`k_cache[slots[i]] = k[i]` and `v_cache[slots[i]] = v[i]` for every token `i`, cast to the cache's
dtype. The slot `-1` marks a padded token and is skipped (so is any slot outside the cache).
"""

import torch
import triton
import triton.language as tl

from eyas.kernels.checks import require
from eyas.kernels.tuning import launch_configs

_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


@triton.autotune(
    configs=launch_configs(
        triton.Config({}, num_warps=4),
        [triton.Config({}, num_warps=w) for w in (1, 2, 4, 8)],
    ),
    key=["BLOCK_H", "BLOCK_D"],
)
@triton.jit
def _store_kv_kernel(
    k_cache_ptr, v_cache_ptr, k_ptr, v_ptr, slots_ptr,
    num_slots, num_kv_heads, head_dim,
    stride_kc_slot, stride_kc_head, stride_vc_slot, stride_vc_head,
    stride_k_token, stride_k_head, stride_v_token, stride_v_head,
    BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
):
    # one program per token, all its heads: [BLOCK_H, BLOCK_D]
    token = tl.program_id(0).to(tl.int64)
    slot = tl.load(slots_ptr + token).to(tl.int64)
    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_D)
    # a padded or out-of-range slot masks every head: nothing is read or written
    num_heads = tl.where((slot >= 0) & (slot < num_slots), num_kv_heads, 0)
    mask = (offs_h[:, None] < num_heads) & (offs_d[None, :] < head_dim)

    k = tl.load(k_ptr + token * stride_k_token + offs_h[:, None] * stride_k_head + offs_d[None, :], mask=mask)
    v = tl.load(v_ptr + token * stride_v_token + offs_h[:, None] * stride_v_head + offs_d[None, :], mask=mask)
    k_dst = k_cache_ptr + slot * stride_kc_slot + offs_h[:, None] * stride_kc_head + offs_d[None, :]
    v_dst = v_cache_ptr + slot * stride_vc_slot + offs_h[:, None] * stride_vc_head + offs_d[None, :]
    tl.store(k_dst, k.to(k_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(v_dst, v.to(v_cache_ptr.dtype.element_ty), mask=mask)


def store_kv(k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
             slots: torch.Tensor) -> None:
    """Write `k`, `v` into the caches at `slots`, in place.

    k_cache, v_cache: [S, Hkv, D] float16/bfloat16/float32, last dim contiguous.
    k, v:             [N, Hkv, D] float16/bfloat16/float32 (any of them; cast to the cache dtype),
                      last dim contiguous.
    slots:            [N] int64; `-1` skips the token (padding).
    All on one device.
    """
    require(k_cache.dim() == 3, f"k_cache must be [S, Hkv, D], got shape {tuple(k_cache.shape)}")
    require(v_cache.shape == k_cache.shape,
             f"v_cache shape {tuple(v_cache.shape)} must equal k_cache shape {tuple(k_cache.shape)}")
    num_slots, num_kv_heads, head_dim = k_cache.shape
    require(k.dim() == 3 and k.shape[1:] == (num_kv_heads, head_dim),
             f"k must be [N, {num_kv_heads}, {head_dim}] to match the cache, got shape {tuple(k.shape)}")
    require(v.shape == k.shape, f"v shape {tuple(v.shape)} must equal k shape {tuple(k.shape)}")
    require(slots.dim() == 1 and slots.shape[0] == k.shape[0],
             f"slots must be [N] with N = {k.shape[0]}, got shape {tuple(slots.shape)}")
    require(slots.dtype == torch.int64, f"slots must be int64, got {slots.dtype}")
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache), ("k", k), ("v", v)):
        require(t.dtype in _DTYPES, f"{name} must be float16, bfloat16 or float32, got {t.dtype}")
        require(t.stride(-1) == 1, f"{name} must be contiguous in its last dim, got strides {t.stride()}")
    for name, t in (("v_cache", v_cache), ("k", k), ("v", v), ("slots", slots)):
        require(t.device == k_cache.device, f"{name} is on {t.device}, k_cache on {k_cache.device}")
    num_tokens = k.shape[0]
    if num_tokens == 0:
        return

    _store_kv_kernel[(num_tokens,)](
        k_cache, v_cache, k, v, slots,
        num_slots, num_kv_heads, head_dim,
        k_cache.stride(0), k_cache.stride(1), v_cache.stride(0), v_cache.stride(1),
        k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        BLOCK_H=triton.next_power_of_2(num_kv_heads), BLOCK_D=triton.next_power_of_2(head_dim),
    )
