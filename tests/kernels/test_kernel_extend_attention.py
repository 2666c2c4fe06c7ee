"""extend_attention against per-request dense attention in plain torch, with an explicit boolean mask."""

import itertools
import random

import pytest
import torch

from eyas.kernels.extend_attention import extend_attention

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
# reference in fp32 from the same (rounded) inputs; fp16 adds the rounding of probabilities and output
TOLERANCES = {torch.float32: dict(atol=1e-5, rtol=1e-5), torch.float16: dict(atol=2e-3, rtol=5e-3)}

# (prefix_len, extend_len) per request: prefill, decode-like, long prefix, block-crossing extends
MIXED = [(0, 13), (37, 1), (5, 70), (250, 53)]
PREFILL_AND_DECODE = [(0, 1), (1, 1), (0, 3), (64, 1)]
TREES = [(0, 1), (0, 9), (29, 16), (131, 5), (3, 66)]


def build_batch(lens, num_kv_heads, group, head_dim, page_size, dtype, seed=0, gap=0):
    """Random q and paged cache for requests of (prefix_len, extend_len); pages are handed out in shuffled order.

    `gap` unused q rows separate consecutive requests (they must stay untouched).
    """
    gen = torch.Generator().manual_seed(seed)
    rng = random.Random(seed)
    seq_lens = [p + e for p, e in lens]
    pages_needed = [-(-s // page_size) for s in seq_lens]
    num_pages = sum(pages_needed) + 3  # spare pages hold garbage that must never be read
    page_order = torch.randperm(num_pages, generator=gen).tolist()
    num_rows = len(lens) + 2
    rows = rng.sample(range(num_rows), len(lens))
    req_to_token = torch.full((num_rows, max(seq_lens) + 5), -1, dtype=torch.int64)
    next_page = 0
    for row, seq_len, count in zip(rows, seq_lens, pages_needed):
        pages = torch.tensor(page_order[next_page:next_page + count])
        next_page += count
        positions = torch.arange(seq_len)
        req_to_token[row, :seq_len] = pages[positions // page_size] * page_size + positions % page_size
    num_slots = num_pages * page_size
    k_cache = torch.randn(num_slots, num_kv_heads, head_dim, generator=gen).to(dtype)
    v_cache = torch.randn(num_slots, num_kv_heads, head_dim, generator=gen).to(dtype)
    extend_lens = [e for _, e in lens]
    starts = [sum(extend_lens[:b]) + b * gap for b in range(len(lens))]
    num_tokens = starts[-1] + extend_lens[-1] + gap if lens else 0
    q = torch.randn(num_tokens, num_kv_heads * group, head_dim, generator=gen).to(dtype)
    index = dict(
        req_rows=torch.tensor(rows, dtype=torch.int64),
        prefix_lens=torch.tensor([p for p, _ in lens], dtype=torch.int32),
        extend_lens=torch.tensor(extend_lens, dtype=torch.int32),
        extend_starts=torch.tensor(starts, dtype=torch.int64),
    )
    tensors = dict(q=q, k_cache=k_cache, v_cache=v_cache, req_to_token=req_to_token, **index)
    return {name: t.to(DEVICE) for name, t in tensors.items()}


def tree_mask(extend_len, rng):
    """[E, E] ancestor-or-self mask of a random tree whose node 0 is the root and parent[i] < i."""
    mask = torch.zeros(extend_len, extend_len, dtype=torch.bool)
    for node in range(extend_len):
        if node > 0:
            mask[node] = mask[rng.randrange(node)]
        mask[node, node] = True
    return mask


def pack_masks(masks):
    """Flat custom_mask and mask_offsets [B] from per-request [E, E] masks."""
    sizes = [m.numel() for m in masks]
    offsets = torch.tensor([sum(sizes[:b]) for b in range(len(masks))], dtype=torch.int64)
    flat = torch.cat([m.flatten() for m in masks]) if masks else torch.zeros(0, dtype=torch.bool)
    return flat.to(DEVICE), offsets.to(DEVICE)


def reference(batch, sm_scale, masks=None):
    """Dense fp32 attention per request; masks[b] is the [E, E] new-token mask (None = causal)."""
    q, k_cache, v_cache = batch["q"].float(), batch["k_cache"].float(), batch["v_cache"].float()
    group = q.shape[1] // k_cache.shape[1]
    out = torch.zeros_like(q)
    for b in range(batch["req_rows"].shape[0]):
        prefix, extend = int(batch["prefix_lens"][b]), int(batch["extend_lens"][b])
        start = int(batch["extend_starts"][b])
        slots = batch["req_to_token"][batch["req_rows"][b], :prefix + extend]
        keys = k_cache[slots].repeat_interleave(group, dim=1)  # [L, Hq, D]
        values = v_cache[slots].repeat_interleave(group, dim=1)
        queries = q[start:start + extend]  # [E, Hq, D]
        new_mask = torch.ones(extend, extend, dtype=torch.bool).tril() if masks is None else masks[b]
        visible = torch.cat([torch.ones(extend, prefix, dtype=torch.bool), new_mask.cpu()], dim=1).to(q.device)
        scores = torch.einsum("qhd,khd->hqk", queries, keys) * sm_scale  # [Hq, E, L]
        probs = scores.masked_fill(~visible, float("-inf")).softmax(dim=-1)
        out[start:start + extend] = torch.einsum("hqk,khd->qhd", probs, values)
    return out


def run_kernel(batch, sm_scale, masks=None, max_extend_len=None, out=None):
    if out is None:
        out = torch.full_like(batch["q"], float("nan"))
    custom_mask, mask_offsets = pack_masks(masks) if masks is not None else (None, None)
    if max_extend_len is None:
        max_extend_len = int(batch["extend_lens"].max()) if batch["extend_lens"].numel() else 0
    returned = extend_attention(
        batch["q"], batch["k_cache"], batch["v_cache"], batch["req_to_token"], batch["req_rows"],
        batch["prefix_lens"], batch["extend_lens"], batch["extend_starts"], out, sm_scale, max_extend_len,
        custom_mask=custom_mask, mask_offsets=mask_offsets,
    )
    assert returned is out
    return out


def own_rows(batch):
    """Row indices of q that belong to some request."""
    rows = [torch.arange(int(s), int(s) + int(e)) for s, e in zip(batch["extend_starts"], batch["extend_lens"])]
    return torch.cat(rows).to(DEVICE)


def check(batch, sm_scale, dtype, masks=None, **kwargs):
    out = run_kernel(batch, sm_scale, masks, **kwargs)
    rows = own_rows(batch)
    expected = reference(batch, sm_scale, masks)
    assert out.dtype == dtype
    torch.testing.assert_close(out[rows].float(), expected[rows], **TOLERANCES[dtype])
    return out, rows


def random_trees(lens, seed):
    rng = random.Random(seed)
    return [tree_mask(extend, rng) for _, extend in lens]


# ---- default run: a few representative cases (the interpreter is slow) ----

@pytest.mark.parametrize("dtype, head_dim, num_kv_heads, group, page_size", [
    (torch.float32, 64, 1, 1, 1),
    (torch.float16, 80, 1, 2, 16),
    (torch.float32, 128, 1, 4, 16),
    (torch.float16, 64, 2, 4, 1),
])
def test_causal_mixed_batch(dtype, head_dim, num_kv_heads, group, page_size):
    batch = build_batch(MIXED, num_kv_heads, group, head_dim, page_size, dtype, seed=head_dim + group)
    check(batch, head_dim ** -0.5, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_prefill_and_decode_like(dtype):
    batch = build_batch(PREFILL_AND_DECODE, 1, 2, 80, 16, dtype, seed=3)
    check(batch, 80 ** -0.5, dtype)


@pytest.mark.parametrize("dtype, head_dim, group, page_size", [
    (torch.float32, 80, 2, 16),
    (torch.float16, 64, 1, 1),
])
def test_tree_mask(dtype, head_dim, group, page_size):
    batch = build_batch(TREES, 1, group, head_dim, page_size, dtype, seed=11)
    check(batch, head_dim ** -0.5, dtype, masks=random_trees(TREES, seed=5))


@pytest.mark.parametrize("mask_dtype", [torch.bool, torch.uint8])
def test_custom_causal_mask_equals_causal_path(mask_dtype):
    lens = [(0, 5), (40, 70), (7, 1)]
    batch = build_batch(lens, 1, 2, 64, 16, torch.float32, seed=2)
    causal = run_kernel(batch, 0.125)
    masks = [torch.ones(e, e, dtype=mask_dtype).tril() for _, e in lens]
    custom = run_kernel(batch, 0.125, masks=masks)
    rows = own_rows(batch)
    torch.testing.assert_close(custom[rows], causal[rows], atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(custom[rows], reference(batch, 0.125), **TOLERANCES[torch.float32])


def test_writes_only_request_rows_and_tolerates_a_larger_grid():
    batch = build_batch([(3, 4), (0, 2), (20, 9)], 1, 1, 64, 1, torch.float32, seed=4, gap=3)
    out, rows = check(batch, 0.125, torch.float32, max_extend_len=100)
    untouched = torch.ones(out.shape[0], dtype=torch.bool, device=DEVICE)
    untouched[rows] = False
    assert untouched.any() and out[untouched].isnan().all()


def test_strided_q_and_out():
    batch = build_batch([(10, 6), (0, 17)], 1, 2, 64, 16, torch.float32, seed=6)
    expected = reference(batch, 0.125)
    # q and out as head-dim-contiguous views into wider buffers
    wide_q = torch.zeros(batch["q"].shape[0], batch["q"].shape[1], 96, device=DEVICE)
    wide_q[..., :64] = batch["q"]
    batch["q"] = wide_q[..., :64]
    wide_out = torch.zeros_like(wide_q)
    out = run_kernel(batch, 0.125, out=wide_out[..., :64])
    torch.testing.assert_close(out, expected, **TOLERANCES[torch.float32])
    assert (wide_out[..., 64:] == 0).all()


def test_empty_batch_leaves_out_alone():
    batch = build_batch([(2, 3)], 1, 1, 64, 1, torch.float32)
    for name in ("req_rows", "prefix_lens", "extend_lens", "extend_starts"):
        batch[name] = batch[name][:0]
    out = run_kernel(batch, 0.125, max_extend_len=0)
    assert out.isnan().all()


def _valid_args():
    batch = build_batch([(3, 4), (0, 2)], 2, 1, 64, 1, torch.float32)
    masks = [torch.ones(e, e, dtype=torch.bool).tril() for e in (4, 2)]
    custom_mask, mask_offsets = pack_masks(masks)
    return dict(batch, out=torch.empty_like(batch["q"]), sm_scale=0.125, max_extend_len=4,
                custom_mask=custom_mask, mask_offsets=mask_offsets)


INVALID = [
    ("q", lambda a: a["q"][0], "q must have shape"),
    ("q", lambda a: a["q"].double(), "q must be float16"),
    ("q", lambda a: a["q"].transpose(1, 2).contiguous().transpose(1, 2), "q must be contiguous in its last"),
    ("k_cache", lambda a: a["k_cache"][..., :32], "k_cache must have shape"),
    ("k_cache", lambda a: a["k_cache"].half(), "k_cache dtype"),
    ("v_cache", lambda a: a["v_cache"][:-1], "v_cache shape"),
    ("v_cache", lambda a: a["v_cache"].transpose(1, 2).contiguous().transpose(1, 2), "v_cache must be contiguous"),
    ("q", lambda a: a["q"][:, :1].contiguous().expand(-1, 3, -1).contiguous(), "multiple of k_cache heads"),
    ("out", lambda a: a["out"][:-1], "out must be"),
    ("out", lambda a: a["out"].half(), "out must be"),
    ("req_to_token", lambda a: a["req_to_token"].float(), "req_to_token must be"),
    ("req_to_token", lambda a: a["req_to_token"][0], "req_to_token must be"),
    ("req_to_token", lambda a: a["req_to_token"].t().contiguous().t(), "req_to_token must be contiguous"),
    ("req_rows", lambda a: a["req_rows"][None], "req_rows must have shape"),
    ("prefix_lens", lambda a: a["prefix_lens"][:1], "prefix_lens must have shape"),
    ("extend_lens", lambda a: a["extend_lens"].float(), "extend_lens must be int32 or int64"),
    ("extend_starts", lambda a: a["extend_starts"].repeat_interleave(2)[::2], "extend_starts must be contiguous"),
    ("max_extend_len", lambda a: 4.0, "max_extend_len"),
    ("max_extend_len", lambda a: -1, "max_extend_len"),
    ("mask_offsets", lambda a: None, "given together"),
    ("custom_mask", lambda a: a["custom_mask"].float(), "custom_mask must be a flat bool or uint8"),
    ("custom_mask", lambda a: a["custom_mask"].view(4, -1), "custom_mask must be a flat"),
    ("mask_offsets", lambda a: a["mask_offsets"][:1], "mask_offsets must have shape"),
]


@pytest.mark.parametrize("name, mutate, message", INVALID, ids=[f"{n}-{i}" for i, (n, _, _) in enumerate(INVALID)])
def test_validation_errors(name, mutate, message):
    args = _valid_args()
    args[name] = mutate(args)
    with pytest.raises(ValueError, match=message):
        extend_attention(**args)


def test_device_mismatch_is_rejected():
    args = _valid_args()
    args["prefix_lens"] = args["prefix_lens"].to("meta")
    with pytest.raises(ValueError, match="prefix_lens is on meta"):
        extend_attention(**args)


# ---- slow: the full cross product ----

SWEEP_LENS = [(0, 1), (0, 37), (1, 1), (63, 2), (17, 64), (100, 129), (300, 7), (211, 90)]


@pytest.mark.slow
@pytest.mark.parametrize("dtype, head_dim, group, page_size, tree", list(itertools.product(
    [torch.float32, torch.float16], [64, 80, 128], [1, 2, 4], [1, 16], [False, True])))
def test_sweep(dtype, head_dim, group, page_size, tree):
    seed = head_dim * 7 + group * 3 + page_size + tree
    batch = build_batch(SWEEP_LENS, 2, group, head_dim, page_size, dtype, seed=seed)
    masks = random_trees(SWEEP_LENS, seed) if tree else None
    check(batch, head_dim ** -0.5, dtype, masks=masks)
