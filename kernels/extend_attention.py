"""Extend/verify attention over the paged KV cache.

For each request `b` of a batch, its `extend_lens[b]` new queries (packed in `q` from row
`extend_starts[b]`) attend to the request's KV positions `0 .. prefix_lens[b] + extend_lens[b] - 1`,
read from `k_cache`/`v_cache` through the slots `req_to_token[req_rows[b]]`. The new tokens' K/V are
already stored in the cache, so prefix and new tokens are read the same way.

Query `j` of request `b` sits at position `prefix_lens[b] + j`. It sees every prefix position and,
among the new tokens, either those up to itself (causal: prefill, extend, chain verify) or those a
custom mask allows (tree verify: ancestors and itself). One online-softmax pass, accumulated in fp32.
"""

import torch
import triton
import triton.language as tl

from eyas.kernels.tuning import launch_configs

LOG2_E = 1.4426950408889634
SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
INDEX_DTYPES = (torch.int32, torch.int64)

_DEFAULT_CONFIG = triton.Config({"BLOCK_M": 64, "BLOCK_N": 64}, num_warps=4, num_stages=2)
_SEARCH_CONFIGS = [
    triton.Config({"BLOCK_M": block_m, "BLOCK_N": block_n}, num_warps=warps, num_stages=stages)
    for block_m in (32, 64, 128)
    for block_n in (32, 64)
    for warps in (4, 8)
    for stages in (1, 2, 3)
]


@triton.jit
def _softmax_accumulate(scores, visible, values, acc, row_max, row_sum, DOT_PRECISION: tl.constexpr):
    # scores: [BLOCK_M, BLOCK_N] fp32 logits in log2 units; values: [BLOCK_N, BLOCK_D]; acc: [BLOCK_M, BLOCK_D]
    # row_max starts finite, so hidden entries (-inf) give exactly 0 and never a NaN
    scores = tl.where(visible, scores, float("-inf"))
    new_max = tl.maximum(row_max, tl.max(scores, 1))
    probs = tl.exp2(scores - new_max[:, None])
    rescale = tl.exp2(row_max - new_max)
    row_sum = row_sum * rescale + tl.sum(probs, 1)
    acc = acc * rescale[:, None] + tl.dot(probs.to(values.dtype), values, input_precision=DOT_PRECISION)
    return acc, new_max, row_sum


@triton.autotune(configs=launch_configs(_DEFAULT_CONFIG, _SEARCH_CONFIGS),
                 key=["head_dim", "KV_GROUP", "HAS_CUSTOM_MASK"])
@triton.jit
def _extend_attn_kernel(
    Q, KCache, VCache, Out, ReqToToken, ReqRows, PrefixLens, ExtendLens, ExtendStarts, CustomMask, MaskOffsets,
    sm_scale_log2,
    stride_q_tok, stride_q_head, stride_k_slot, stride_k_head, stride_v_slot, stride_v_head,
    stride_o_tok, stride_o_head, stride_table_row,
    head_dim,
    KV_GROUP: tl.constexpr, HAS_CUSTOM_MASK: tl.constexpr, DOT_PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):
    req = tl.program_id(0)
    m_start = tl.program_id(1) * BLOCK_M
    head = tl.program_id(2)
    kv_head = head // KV_GROUP

    extend_len = tl.load(ExtendLens + req)
    if m_start >= extend_len:  # the grid covers the longest request
        return
    prefix_len = tl.load(PrefixLens + req)
    seq_len = prefix_len + extend_len
    q_start = tl.load(ExtendStarts + req)
    table_row = ReqToToken + tl.load(ReqRows + req).to(tl.int64) * stride_table_row

    offs_m = m_start + tl.arange(0, BLOCK_M)  # index among the request's new tokens
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    m_valid = offs_m < extend_len
    d_valid = offs_d < head_dim

    q_rows = (q_start + offs_m).to(tl.int64)
    q = tl.load(Q + q_rows[:, None] * stride_q_tok + head * stride_q_head + offs_d[None, :],
                mask=m_valid[:, None] & d_valid[None, :], other=0.0)  # [BLOCK_M, BLOCK_D]

    if HAS_CUSTOM_MASK:
        kv_end = seq_len
        mask_base = CustomMask + tl.load(MaskOffsets + req).to(tl.int64)
    else:
        # the last query of this block sits at prefix_len + m_start + BLOCK_M - 1
        kv_end = tl.minimum(seq_len, prefix_len + m_start + BLOCK_M)

    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    row_max = tl.full([BLOCK_M], -1.0e30, dtype=tl.float32)
    row_sum = tl.zeros([BLOCK_M], dtype=tl.float32)
    for n_start in range(0, kv_end, BLOCK_N):
        positions = n_start + offs_n  # [BLOCK_N] KV positions of the request
        n_valid = positions < kv_end
        slots = tl.load(table_row + positions, mask=n_valid, other=0).to(tl.int64)
        kv_mask = n_valid[:, None] & d_valid[None, :]
        keys = tl.load(KCache + slots[:, None] * stride_k_slot + kv_head * stride_k_head + offs_d[None, :],
                       mask=kv_mask, other=0.0)  # [BLOCK_N, BLOCK_D]
        values = tl.load(VCache + slots[:, None] * stride_v_slot + kv_head * stride_v_head + offs_d[None, :],
                         mask=kv_mask, other=0.0)
        scores = tl.dot(q, tl.trans(keys), input_precision=DOT_PRECISION) * sm_scale_log2  # [BLOCK_M, BLOCK_N]

        new_idx = positions - prefix_len  # < 0 on the prefix, which every query sees
        if HAS_CUSTOM_MASK:
            # custom_mask block of this request: [extend_len, extend_len] row-major, query-major
            in_new = (new_idx >= 0) & n_valid
            allowed = tl.load(mask_base + offs_m[:, None] * extend_len + new_idx[None, :],
                              mask=m_valid[:, None] & in_new[None, :], other=0)
            visible = (new_idx < 0)[None, :] | (allowed != 0)
        else:
            visible = new_idx[None, :] <= offs_m[:, None]
        visible = visible & n_valid[None, :]
        acc, row_max, row_sum = _softmax_accumulate(scores, visible, values, acc, row_max, row_sum,
                                                        DOT_PRECISION)

    # a query that sees nothing (only possible with a custom mask and no prefix) gets zeros
    acc = acc / tl.where(row_sum > 0, row_sum, 1.0)[:, None]
    tl.store(Out + q_rows[:, None] * stride_o_tok + head * stride_o_head + offs_d[None, :],
             acc.to(Out.dtype.element_ty), mask=m_valid[:, None] & d_valid[None, :])


def _check_index(name: str, tensor: torch.Tensor, batch_size: int, device: torch.device) -> None:
    if tensor.dim() != 1 or tensor.shape[0] != batch_size:
        raise ValueError(f"{name} must have shape [B] = [{batch_size}], got {list(tensor.shape)}")
    if tensor.dtype not in INDEX_DTYPES:
        raise ValueError(f"{name} must be int32 or int64, got {tensor.dtype}")
    if tensor.device != device:
        raise ValueError(f"{name} is on {tensor.device}, expected {device} (the device of q)")
    if not tensor.is_contiguous():
        raise ValueError(f"{name} must be contiguous")


def _check_inputs(q, k_cache, v_cache, req_to_token, req_rows, prefix_lens, extend_lens, extend_starts, out,
                  max_extend_len, custom_mask, mask_offsets) -> None:
    if q.dim() != 3:
        raise ValueError(f"q must have shape [N, Hq, D], got {list(q.shape)}")
    if q.dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"q must be float16, bfloat16 or float32, got {q.dtype}")
    num_heads, head_dim = q.shape[1], q.shape[2]
    device = q.device
    for name, cache in (("k_cache", k_cache), ("v_cache", v_cache)):
        if cache.dim() != 3 or cache.shape[2] != head_dim:
            raise ValueError(f"{name} must have shape [S, Hkv, D] with D = {head_dim}, got {list(cache.shape)}")
        if cache.dtype != q.dtype:
            raise ValueError(f"{name} dtype {cache.dtype} differs from q dtype {q.dtype}")
        if cache.device != device:
            raise ValueError(f"{name} is on {cache.device}, expected {device} (the device of q)")
        if cache.stride(2) != 1:
            raise ValueError(f"{name} must be contiguous in its last (head dim) dimension")
    if v_cache.shape != k_cache.shape:
        raise ValueError(f"v_cache shape {list(v_cache.shape)} differs from k_cache shape {list(k_cache.shape)}")
    num_kv_heads = k_cache.shape[1]
    if num_kv_heads == 0 or num_heads % num_kv_heads != 0:
        raise ValueError(f"q heads ({num_heads}) must be a multiple of k_cache heads ({num_kv_heads})")
    if q.stride(2) != 1:
        raise ValueError("q must be contiguous in its last (head dim) dimension")
    if out.shape != q.shape or out.dtype != q.dtype or out.device != device:
        raise ValueError(f"out must be a {q.dtype} tensor of shape {list(q.shape)} on {device}, "
                         f"got {out.dtype} {list(out.shape)} on {out.device}")
    if out.stride(2) != 1:
        raise ValueError("out must be contiguous in its last (head dim) dimension")
    if req_to_token.dim() != 2 or req_to_token.dtype not in INDEX_DTYPES:
        raise ValueError(f"req_to_token must be a 2-D int32/int64 tensor [R, C], "
                         f"got {req_to_token.dtype} {list(req_to_token.shape)}")
    if req_to_token.device != device:
        raise ValueError(f"req_to_token is on {req_to_token.device}, expected {device} (the device of q)")
    if req_to_token.stride(1) != 1:
        raise ValueError("req_to_token must be contiguous in its last (position) dimension")
    if req_rows.dim() != 1:
        raise ValueError(f"req_rows must have shape [B], got {list(req_rows.shape)}")
    batch_size = req_rows.shape[0]
    for name, tensor in (("req_rows", req_rows), ("prefix_lens", prefix_lens), ("extend_lens", extend_lens),
                         ("extend_starts", extend_starts)):
        _check_index(name, tensor, batch_size, device)
    if not isinstance(max_extend_len, int) or max_extend_len < 0:
        raise ValueError(f"max_extend_len must be a non-negative int, got {max_extend_len!r}")
    if (custom_mask is None) != (mask_offsets is None):
        raise ValueError("custom_mask and mask_offsets must be given together")
    if custom_mask is not None:
        if custom_mask.dim() != 1 or custom_mask.dtype not in (torch.bool, torch.uint8):
            raise ValueError(f"custom_mask must be a flat bool or uint8 tensor, "
                             f"got {custom_mask.dtype} {list(custom_mask.shape)}")
        if custom_mask.device != device:
            raise ValueError(f"custom_mask is on {custom_mask.device}, expected {device} (the device of q)")
        if not custom_mask.is_contiguous():
            raise ValueError("custom_mask must be contiguous")
        _check_index("mask_offsets", mask_offsets, batch_size, device)


def extend_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    req_to_token: torch.Tensor,
    req_rows: torch.Tensor,
    prefix_lens: torch.Tensor,
    extend_lens: torch.Tensor,
    extend_starts: torch.Tensor,
    out: torch.Tensor,
    sm_scale: float,
    max_extend_len: int,
    custom_mask: torch.Tensor | None = None,
    mask_offsets: torch.Tensor | None = None,
) -> torch.Tensor:
    """Attention of the new tokens of B requests over their paged KV; writes and returns `out`.

    q: [N, Hq, D] new tokens of all requests, packed; request b owns rows
       extend_starts[b] .. extend_starts[b] + extend_lens[b] - 1.
    k_cache, v_cache: [S, Hkv, D] one layer's cache over token slots, same dtype as q; Hq % Hkv == 0,
       query head h reads kv head h // (Hq // Hkv). The new tokens' K/V must already be stored.
    req_to_token: [R, C] int64 (or int32) slot of (request row, position); every position below
       prefix_lens[b] + extend_lens[b] of row req_rows[b] must hold a valid slot.
    req_rows, prefix_lens, extend_lens, extend_starts: [B] int32/int64, contiguous, on q's device.
    out: [N, Hq, D] caller-owned output, dtype of q.
    sm_scale: softmax scale (usually D ** -0.5).
    max_extend_len: python int >= every extend_lens[b] (sizes the grid; not checked, to avoid a sync).
    custom_mask: optional flat bool/uint8 tensor; request b's [extend_len, extend_len] block starts at
       mask_offsets[b] ([B] int) and is row-major: entry [j, i] lets query j see new token i. Every query
       always sees the whole prefix. Without it the new tokens attend causally.
    A query that sees no position at all (custom mask row of zeros, empty prefix) gets zeros.
    """
    _check_inputs(q, k_cache, v_cache, req_to_token, req_rows, prefix_lens, extend_lens, extend_starts, out,
                  max_extend_len, custom_mask, mask_offsets)
    batch_size, num_heads, head_dim = req_rows.shape[0], q.shape[1], q.shape[2]
    if batch_size == 0 or max_extend_len == 0 or q.shape[0] == 0:
        return out
    has_custom_mask = custom_mask is not None
    if has_custom_mask:
        if custom_mask.dtype == torch.bool:
            custom_mask = custom_mask.view(torch.uint8)  # same bytes; read as 0/1
    else:
        custom_mask, mask_offsets = extend_lens, extend_lens  # never read

    def grid(meta):
        return batch_size, triton.cdiv(max_extend_len, meta["BLOCK_M"]), num_heads

    _extend_attn_kernel[grid](
        q, k_cache, v_cache, out, req_to_token, req_rows, prefix_lens, extend_lens, extend_starts,
        custom_mask, mask_offsets,
        sm_scale * LOG2_E,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), v_cache.stride(0), v_cache.stride(1),
        out.stride(0), out.stride(1), req_to_token.stride(0),
        head_dim,
        KV_GROUP=num_heads // k_cache.shape[1],
        HAS_CUSTOM_MASK=has_custom_mask,
        # fp32 callers (tests, references) get full-precision products; half types are exact either way
        DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        BLOCK_D=max(16, triton.next_power_of_2(head_dim)),
    )
    return out
