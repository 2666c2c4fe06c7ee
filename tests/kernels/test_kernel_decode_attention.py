"""Decode attention kernel against a plain-torch reference on a shuffled paged cache.

Tolerances: float32 inputs atol = rtol = 1e-5; float16 inputs atol = rtol = 2e-3 against the
reference computed in float32 from the same float16 values.
"""

import itertools

import pytest
import torch
from support.kernel_device import on_device

from eyas.kernels import decode_attention as decode_module
from eyas.kernels.decode_attention import decode_workspace

decode_attention = on_device(decode_module.decode_attention)

def param_id(value):
    if isinstance(value, torch.dtype):
        return str(value).removeprefix("torch.")
    if isinstance(value, list):
        return "lens" + "_".join(map(str, value))
    return None


TOLERANCES = {torch.float32: dict(atol=1e-5, rtol=1e-5), torch.float16: dict(atol=2e-3, rtol=2e-3)}


def paged_table(seq_lens, rows, page_size, num_rows, generator):
    """req_to_token [num_rows, C] with each request's pages drawn in shuffled order; returns (table, num_slots)."""
    pages_per_req = [-(-n // page_size) for n in seq_lens]
    num_pages = sum(pages_per_req) + 3  # spare pages nobody owns
    order = torch.randperm(num_pages, generator=generator)
    context = max(max(seq_lens), 1) + page_size
    table = torch.full((num_rows, context), -1, dtype=torch.int64)
    used = 0
    for row, seq_len, num_pages_req in zip(rows, seq_lens, pages_per_req):
        pages = order[used:used + num_pages_req]
        used += num_pages_req
        slots = (pages[:, None] * page_size + torch.arange(page_size)[None, :]).flatten()
        table[row, :seq_len] = slots[:seq_len]
    return table, num_pages * page_size


def reference(q, k_cache, v_cache, table, rows, seq_lens, sm_scale):
    """[B, Hq, D] float32: softmax(q k^T * scale) v per request over its first seq_len positions."""
    batch, num_heads, head_dim = q.shape
    group = num_heads // k_cache.shape[1]
    out = torch.zeros(batch, num_heads, head_dim)
    for b in range(batch):
        slots = table[rows[b], :seq_lens[b]]
        if len(slots) == 0:
            continue
        keys = k_cache[slots].float().repeat_interleave(group, dim=1)  # [N, Hq, D]
        values = v_cache[slots].float().repeat_interleave(group, dim=1)
        scores = torch.einsum("hd,nhd->hn", q[b].float(), keys) * sm_scale
        out[b] = torch.einsum("hn,nhd->hd", scores.softmax(-1), values)
    return out


def run_case(dtype, head_dim, group, num_kv_heads, page_size, seq_lens, num_kv_splits, seed=0):
    gen = torch.Generator().manual_seed(seed)
    batch, num_heads = len(seq_lens), num_kv_heads * group
    num_rows = batch + 2
    rows = torch.randperm(num_rows, generator=gen)[:batch]
    table, num_slots = paged_table(seq_lens, rows.tolist(), page_size, num_rows, gen)
    q = torch.randn(batch, num_heads, head_dim, generator=gen).to(dtype)
    k_cache = torch.randn(num_slots, num_kv_heads, head_dim, generator=gen).to(dtype)
    v_cache = torch.randn(num_slots, num_kv_heads, head_dim, generator=gen).to(dtype)
    lens = torch.tensor(seq_lens, dtype=torch.int32)
    out = torch.full_like(q, float("nan"))
    sm_scale = head_dim ** -0.5
    decode_attention(q, k_cache, v_cache, table, rows, lens, out, sm_scale, num_kv_splits=num_kv_splits)
    expected = reference(q, k_cache, v_cache, table, rows, seq_lens, sm_scale)
    torch.testing.assert_close(out.float(), expected, **TOLERANCES[dtype])


# (dtype, head_dim, GQA group, Hkv, page_size, seq_lens, num_kv_splits): each axis value appears at least once
CASES = [
    (torch.float32, 64, 1, 2, 1, [1, 13, 300], 4),
    (torch.float16, 80, 2, 1, 16, [300, 1, 77], 8),
    (torch.float32, 128, 4, 1, 16, [129, 64], 3),
    (torch.float16, 64, 4, 2, 1, [5, 17], 16),  # more splits than tokens
    (torch.float32, 80, 2, 1, 16, [333], 1),
    (torch.float16, 128, 1, 1, 1, [2, 31, 100], 2),
]


@pytest.mark.parametrize("dtype,head_dim,group,num_kv_heads,page_size,seq_lens,num_kv_splits", CASES, ids=param_id)
def test_matches_reference(dtype, head_dim, group, num_kv_heads, page_size, seq_lens, num_kv_splits):
    run_case(dtype, head_dim, group, num_kv_heads, page_size, seq_lens, num_kv_splits)


@pytest.mark.slow
@pytest.mark.parametrize("dtype,head_dim,group,page_size,num_kv_splits", list(itertools.product(
    [torch.float32, torch.float16], [64, 80, 128], [1, 2, 4], [1, 16], [1, 5, 32])), ids=param_id)
def test_sweep(dtype, head_dim, group, page_size, num_kv_splits):
    run_case(dtype, head_dim, group, 2, page_size, [1, 2, 17, 64, 129, 300, 333], num_kv_splits, seed=head_dim + group)


def test_empty_sequence_gives_zeros_and_others_unaffected():
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(2, 2, 64, generator=gen)
    k_cache, v_cache = torch.randn(2, 32, 1, 64, generator=gen)
    table = torch.full((2, 40), -1, dtype=torch.int64)
    table[1, :20] = torch.randperm(32, generator=gen)[:20]
    rows, lens = torch.tensor([0, 1]), torch.tensor([0, 20])
    out = torch.full_like(q, float("nan"))
    decode_attention(q, k_cache, v_cache, table, rows, lens, out, 0.125, num_kv_splits=4)
    assert torch.equal(out[0], torch.zeros(2, 64))
    torch.testing.assert_close(out, reference(q, k_cache, v_cache, table, rows, lens.tolist(), 0.125),
                               **TOLERANCES[torch.float32])


def test_reused_workspace_strided_q_and_int64_lengths():
    gen = torch.Generator().manual_seed(2)
    num_kv_heads, group, head_dim, num_kv_splits = 1, 2, 80, 4
    workspace = decode_workspace(4, num_kv_heads * group, num_kv_splits, head_dim, "cpu")
    for seq_lens in ([7, 40, 1], [50]):
        batch = len(seq_lens)
        rows = torch.arange(batch)
        table, num_slots = paged_table(seq_lens, rows.tolist(), 16, batch, gen)
        qkv = torch.randn(batch, 3 * group, head_dim, generator=gen)
        q = qkv[:, :group]  # a view with the packed projection's batch stride
        k_cache, v_cache = torch.randn(2, num_slots, num_kv_heads, head_dim, generator=gen)
        out = torch.empty(batch, group, head_dim)
        decode_attention(q, k_cache, v_cache, table, rows, torch.tensor(seq_lens), out, 0.1,
                         num_kv_splits=num_kv_splits, workspace=workspace)
        torch.testing.assert_close(out, reference(q, k_cache, v_cache, table, rows, seq_lens, 0.1),
                                   **TOLERANCES[torch.float32])


def valid_args():
    q = torch.randn(2, 4, 64)
    return dict(q=q, k_cache=torch.randn(16, 2, 64), v_cache=torch.randn(16, 2, 64),
                req_to_token=torch.zeros(3, 8, dtype=torch.int64), req_rows=torch.tensor([0, 1]),
                seq_lens=torch.tensor([1, 2]), out=torch.empty_like(q), sm_scale=0.125)


def bad(**overrides):
    return overrides


@pytest.mark.parametrize("overrides,match", [
    (bad(q=torch.randn(2, 4)), "q must be"),
    (bad(k_cache=torch.randn(16, 3, 64), v_cache=torch.randn(16, 3, 64)), "multiple of the k_cache heads"),
    (bad(k_cache=torch.randn(16, 2, 80)), "k_cache must be"),
    (bad(v_cache=torch.randn(8, 2, 64)), "v_cache shape"),
    (bad(k_cache=torch.randn(16, 2, 64, dtype=torch.float64)), "k_cache must be float16"),
    (bad(req_to_token=torch.zeros(3, 8)), "req_to_token must be int32 or int64"),
    (bad(req_to_token=torch.zeros(8, 3, dtype=torch.int64).t()), "req_to_token must be contiguous"),
    (bad(req_rows=torch.tensor([0, 1, 2])), "req_rows must be"),
    (bad(seq_lens=torch.tensor([1.0, 2.0])), "seq_lens must be int32 or int64"),
    (bad(out=torch.empty(2, 4, 64, dtype=torch.float16)), "out must have q's dtype"),
    (bad(out=torch.empty(2, 4, 32)), "out must be"),
    (bad(q=torch.randn(2, 64, 4).transpose(1, 2), out=torch.empty(2, 4, 64)), "q must be contiguous in its last dim"),
    (bad(sm_scale=float("nan")), "sm_scale"),
    (bad(num_kv_splits=0), "num_kv_splits"),
    (bad(workspace=decode_workspace(2, 4, 3, 64, "cpu")), "workspace.partial_out"),  # splits differ from 8
    (bad(workspace=decode_workspace(1, 4, 8, 64, "cpu")), "workspace.partial_out"),  # batch too small
])
def test_rejects_bad_arguments(overrides, match):
    with pytest.raises(ValueError, match=match):
        decode_attention(**{**valid_args(), **overrides})
