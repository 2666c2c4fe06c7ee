"""Decode attention over a paged KV cache: one query token per request, split-K.

Request `b` attends with its query `q[b]` to KV positions `0 .. seq_lens[b] - 1` of its row
`req_rows[b]` of the request-to-token table; query head `h` reads KV head `h // (Hq // Hkv)` (GQA).

Stage 1 cuts each sequence into `num_kv_splits` chunks; one program per (request, KV head, chunk)
computes, for every query head of the group, the chunk's softmax-weighted sum of V and its
log-sum-exp, into float32 workspace buffers. Stage 2 merges the chunks of each (request, head)
into `out`. A request with `seq_len == 0` gets a zero output.
"""

import math
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from eyas.kernels.checks import require
from eyas.kernels.tuning import launch_configs

_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_INDEX_DTYPES = (torch.int32, torch.int64)
_LOG2E = 1.4426950408889634


class DecodeWorkspace(NamedTuple):
    """Per-chunk partial results; the batch dim may exceed the batch (allocated once for the largest)."""

    partial_out: torch.Tensor  # [B, Hq, num_kv_splits, D] float32, normalised within the chunk
    partial_lse: torch.Tensor  # [B, Hq, num_kv_splits] float32, natural log; -inf for an empty chunk


def decode_workspace(batch: int, num_heads: int, num_kv_splits: int, head_dim: int,
                     device: torch.device | str) -> DecodeWorkspace:
    """Allocate the workspace for batches of up to `batch` requests with `num_heads` query heads."""
    return DecodeWorkspace(
        torch.empty(batch, num_heads, num_kv_splits, head_dim, dtype=torch.float32, device=device),
        torch.empty(batch, num_heads, num_kv_splits, dtype=torch.float32, device=device),
    )


@triton.autotune(
    configs=launch_configs(
        triton.Config({"BLOCK_N": 64}, num_warps=4, num_stages=2),
        [triton.Config({"BLOCK_N": n}, num_warps=w, num_stages=s)
         for n in (32, 64, 128) for w in (2, 4, 8) for s in (1, 2, 3)],
    ),
    key=["BLOCK_H", "BLOCK_D", "kv_group_size"],
)
@triton.jit
def _decode_partial_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, req_to_token_ptr, req_rows_ptr, seq_lens_ptr,
    partial_out_ptr, partial_lse_ptr,
    sm_scale_log2, num_kv_splits, head_dim, kv_group_size,
    stride_q_batch, stride_q_head,
    stride_k_slot, stride_k_head, stride_v_slot, stride_v_head,
    stride_table_row,
    stride_po_batch, stride_po_head, stride_po_split,
    stride_lse_batch, stride_lse_head,
    DOT_PRECISION: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
):
    batch = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)

    row = tl.load(req_rows_ptr + batch).to(tl.int64)
    seq_len = tl.load(seq_lens_ptr + batch).to(tl.int32)
    split_len = tl.cdiv(seq_len, num_kv_splits)
    start = split * split_len
    end = tl.minimum(start + split_len, seq_len)

    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_D)
    offs_n = tl.arange(0, BLOCK_N)
    head = kv_head * kv_group_size + offs_h  # [BLOCK_H] query heads of this KV head
    mask_h = offs_h < kv_group_size
    mask_d = offs_d < head_dim

    q = tl.load(q_ptr + batch * stride_q_batch + head[:, None] * stride_q_head + offs_d[None, :],
                mask=mask_h[:, None] & mask_d[None, :], other=0.0)  # [BLOCK_H, BLOCK_D]

    # running max (base 2; finite so a fully masked block cannot make inf - inf), sum, weighted V
    m = tl.full([BLOCK_H], -1.0e30, dtype=tl.float32)
    l = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_D], dtype=tl.float32)
    for block_start in range(start, end, BLOCK_N):
        pos = block_start + offs_n  # [BLOCK_N]
        slot = tl.load(req_to_token_ptr + row * stride_table_row + pos, mask=pos < end, other=-1).to(tl.int64)
        valid = (pos < end) & (slot >= 0)  # an unset slot is never read
        kv_mask = valid[:, None] & mask_d[None, :]
        k = tl.load(k_cache_ptr + slot[:, None] * stride_k_slot + kv_head * stride_k_head + offs_d[None, :],
                    mask=kv_mask, other=0.0).to(q.dtype)  # [BLOCK_N, BLOCK_D]
        scores = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * sm_scale_log2  # [BLOCK_H, BLOCK_N]
        scores = tl.where(valid[None, :], scores, float("-inf"))

        m_new = tl.maximum(m, tl.max(scores, 1))
        alpha = tl.exp2(m - m_new)
        p = tl.exp2(scores - m_new[:, None])
        v = tl.load(v_cache_ptr + slot[:, None] * stride_v_slot + kv_head * stride_v_head + offs_d[None, :],
                    mask=kv_mask, other=0.0).to(q.dtype)  # [BLOCK_N, BLOCK_D]
        acc = acc * alpha[:, None] + tl.dot(p.to(q.dtype), v, input_precision=DOT_PRECISION)
        l = l * alpha + tl.sum(p, 1)
        m = m_new

    nonempty = l > 0
    l_safe = tl.where(nonempty, l, 1.0)
    lse = tl.where(nonempty, (m + tl.log2(l_safe)) * 0.6931471805599453, float("-inf"))  # * ln 2: natural log
    out_offs = batch * stride_po_batch + head[:, None] * stride_po_head + split * stride_po_split + offs_d[None, :]
    tl.store(partial_out_ptr + out_offs, acc / l_safe[:, None], mask=mask_h[:, None] & mask_d[None, :])
    tl.store(partial_lse_ptr + batch * stride_lse_batch + head * stride_lse_head + split, lse, mask=mask_h)


@triton.autotune(
    configs=launch_configs(
        triton.Config({}, num_warps=4),
        [triton.Config({}, num_warps=w) for w in (1, 2, 4, 8)],
    ),
    key=["BLOCK_S", "BLOCK_D"],
)
@triton.jit
def _decode_merge_kernel(
    partial_out_ptr, partial_lse_ptr, out_ptr,
    num_kv_splits, head_dim,
    stride_po_batch, stride_po_head, stride_po_split,
    stride_lse_batch, stride_lse_head,
    stride_out_batch, stride_out_head,
    BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr,
):
    batch = tl.program_id(0)
    head = tl.program_id(1)
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_D)
    mask_s = offs_s < num_kv_splits
    mask_d = offs_d < head_dim

    lse = tl.load(partial_lse_ptr + batch * stride_lse_batch + head * stride_lse_head + offs_s,
                  mask=mask_s, other=float("-inf"))  # [BLOCK_S]
    lse_max = tl.max(lse, 0)
    lse_max = tl.where(lse_max == float("-inf"), 0.0, lse_max)  # every chunk empty: all weights 0
    weight = tl.exp(lse - lse_max)  # [BLOCK_S], 0 for empty chunks
    parts = tl.load(partial_out_ptr + batch * stride_po_batch + head * stride_po_head
                    + offs_s[:, None] * stride_po_split + offs_d[None, :],
                    mask=mask_s[:, None] & mask_d[None, :], other=0.0)  # [BLOCK_S, BLOCK_D]
    total = tl.sum(weight, 0)
    merged = tl.sum(parts * weight[:, None], 0) / tl.where(total > 0, total, 1.0)  # [BLOCK_D]
    tl.store(out_ptr + batch * stride_out_batch + head * stride_out_head + offs_d,
             merged.to(out_ptr.dtype.element_ty), mask=mask_d)


def decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, req_to_token: torch.Tensor,
                     req_rows: torch.Tensor, seq_lens: torch.Tensor, out: torch.Tensor, sm_scale: float,
                     num_kv_splits: int = 8, workspace: DecodeWorkspace | None = None) -> torch.Tensor:
    """Attention of one query token per request over its paged KV; writes and returns `out`.

    q:            [B, Hq, D] float16/bfloat16/float32, last dim contiguous.
    k_cache, v_cache: [S, Hkv, D] (Hq % Hkv == 0), last dim contiguous; any float dtype, read as q's.
    req_to_token: [R, C] int32/int64, last dim contiguous: (row, position) -> slot.
    req_rows:     [B] int32/int64, the table row of each request.
    seq_lens:     [B] int32/int64, KV length of each request (positions 0 .. seq_len - 1 must be set;
                  0 gives a zero output).
    out:          [B, Hq, D], q's dtype, last dim contiguous.
    num_kv_splits: chunks per sequence (stage 1 parallelism); more chunks than tokens is allowed.
    workspace:    from `decode_workspace(>= B, Hq, num_kv_splits, D, device)`; allocated when None.
    Scores are accumulated in float32.
    """
    require(q.dim() == 3, f"q must be [B, Hq, D], got shape {tuple(q.shape)}")
    batch, num_heads, head_dim = q.shape
    require(k_cache.dim() == 3 and k_cache.shape[2] == head_dim,
             f"k_cache must be [S, Hkv, {head_dim}], got shape {tuple(k_cache.shape)}")
    require(v_cache.shape == k_cache.shape,
             f"v_cache shape {tuple(v_cache.shape)} must equal k_cache shape {tuple(k_cache.shape)}")
    num_kv_heads = k_cache.shape[1]
    require(num_kv_heads > 0 and num_heads % num_kv_heads == 0,
             f"q heads ({num_heads}) must be a multiple of the k_cache heads ({num_kv_heads})")
    require(req_to_token.dim() == 2, f"req_to_token must be [R, C], got shape {tuple(req_to_token.shape)}")
    require(req_rows.shape == (batch,), f"req_rows must be [{batch}], got shape {tuple(req_rows.shape)}")
    require(seq_lens.shape == (batch,), f"seq_lens must be [{batch}], got shape {tuple(seq_lens.shape)}")
    require(out.shape == q.shape, f"out must be {tuple(q.shape)} like q, got shape {tuple(out.shape)}")
    require(out.dtype == q.dtype, f"out must have q's dtype {q.dtype}, got {out.dtype}")
    require(isinstance(num_kv_splits, int) and num_kv_splits >= 1,
             f"num_kv_splits must be a positive int, got {num_kv_splits!r}")
    require(isinstance(sm_scale, (int, float)) and math.isfinite(sm_scale),
             f"sm_scale must be a finite float, got {sm_scale!r}")
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        require(t.dtype in _DTYPES, f"{name} must be float16, bfloat16 or float32, got {t.dtype}")
    for name, t in (("req_to_token", req_to_token), ("req_rows", req_rows), ("seq_lens", seq_lens)):
        require(t.dtype in _INDEX_DTYPES, f"{name} must be int32 or int64, got {t.dtype}")
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache), ("req_to_token", req_to_token),
                    ("out", out)):
        require(t.stride(-1) == 1, f"{name} must be contiguous in its last dim, got strides {t.stride()}")
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache), ("req_to_token", req_to_token),
                    ("req_rows", req_rows), ("seq_lens", seq_lens), ("out", out)):
        require(t.device == q.device, f"{name} is on {t.device}, q on {q.device}")

    if workspace is None:
        workspace = decode_workspace(batch, num_heads, num_kv_splits, head_dim, q.device)
    partial_out, partial_lse = workspace
    require(partial_out.dim() == 4 and partial_out.shape[0] >= batch
             and partial_out.shape[1:] == (num_heads, num_kv_splits, head_dim),
             f"workspace.partial_out must be [>={batch}, {num_heads}, {num_kv_splits}, {head_dim}], "
             f"got shape {tuple(partial_out.shape)}")
    require(partial_lse.shape == partial_out.shape[:3],
             f"workspace.partial_lse must be {tuple(partial_out.shape[:3])}, got shape {tuple(partial_lse.shape)}")
    for name, t in (("workspace.partial_out", partial_out), ("workspace.partial_lse", partial_lse)):
        require(t.dtype == torch.float32, f"{name} must be float32, got {t.dtype}")
        require(t.stride(-1) == 1, f"{name} must be contiguous in its last dim, got strides {t.stride()}")
        require(t.device == q.device, f"{name} is on {t.device}, q on {q.device}")
    if batch == 0:
        return out

    kv_group_size = num_heads // num_kv_heads
    block_d = triton.next_power_of_2(head_dim)
    # tl.dot needs 16 rows; fp32 scores use exact fp32 products, not tf32
    block_h = max(16, triton.next_power_of_2(kv_group_size))
    dot_precision = "ieee" if q.dtype == torch.float32 else "tf32"
    _decode_partial_kernel[(batch, num_kv_heads, num_kv_splits)](
        q, k_cache, v_cache, req_to_token, req_rows, seq_lens,
        partial_out, partial_lse,
        sm_scale * _LOG2E, num_kv_splits, head_dim, kv_group_size,
        q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), v_cache.stride(0), v_cache.stride(1),
        req_to_token.stride(0),
        partial_out.stride(0), partial_out.stride(1), partial_out.stride(2),
        partial_lse.stride(0), partial_lse.stride(1),
        DOT_PRECISION=dot_precision, BLOCK_H=block_h, BLOCK_D=block_d,
    )
    _decode_merge_kernel[(batch, num_heads)](
        partial_out, partial_lse, out,
        num_kv_splits, head_dim,
        partial_out.stride(0), partial_out.stride(1), partial_out.stride(2),
        partial_lse.stride(0), partial_lse.stride(1),
        out.stride(0), out.stride(1),
        BLOCK_S=triton.next_power_of_2(num_kv_splits), BLOCK_D=block_d,
    )
    return out
