"""Greedy verification of a draft tree on the device, without a host sync.

Each request's tree has `T` nodes in first-child / next-sibling layout: node 0 is the root (the last
verified token), nodes 1 .. T-1 are draft tokens. Starting at the root, the walk moves to the first
child (first child, then its siblings in order) whose candidate token equals the target's argmax at
the current node, and stops when no child matches. The emitted tokens are the target's argmax at
every node of the path: the accepted drafts followed by the bonus token.
"""

import torch
import triton
import triton.language as tl

from eyas.kernels.checks import require
from eyas.kernels.tuning import launch_configs


@triton.autotune(
    configs=launch_configs(
        triton.Config({}, num_warps=1),
        [triton.Config({}, num_warps=w) for w in (1, 2, 4)],
    ),
    key=["BLOCK_T"],
)
@triton.jit
def _verify_greedy_kernel(
    candidates_ptr, next_token_ptr, next_sibling_ptr, target_predict_ptr,
    accept_lens_ptr, accept_index_ptr, emitted_ptr,
    num_nodes,
    stride_candidates, stride_next_token, stride_next_sibling, stride_target,
    stride_accept_index, stride_emitted,
    BLOCK_T: tl.constexpr,
):
    # one program per request; the walk is sequential, the path is kept in registers
    batch = tl.program_id(0).to(tl.int64)
    candidates_ptr += batch * stride_candidates
    next_token_ptr += batch * stride_next_token
    next_sibling_ptr += batch * stride_next_sibling
    target_predict_ptr += batch * stride_target

    offs = tl.arange(0, BLOCK_T)
    path = tl.where(offs == 0, 0, -1).to(tl.int64)  # [BLOCK_T] accepted node indices, root first
    node = tl.zeros([], dtype=tl.int64)  # the last accepted node
    child = tl.load(next_token_ptr).to(tl.int64)  # the child of `node` to examine next, -1 none
    num_accepted = tl.full([], 1, dtype=tl.int32)  # path length, root included
    # every non-root node is examined at most once, so T - 1 steps end the walk
    for _ in range(1, num_nodes):
        has_child = (child >= 0) & (child < num_nodes)
        candidate = tl.load(candidates_ptr + child, mask=has_child, other=-1)
        wanted = tl.load(target_predict_ptr + node)
        hit = has_child & (candidate == wanted)
        path = tl.where(offs == tl.where(hit, num_accepted, -1), child, path)
        num_accepted += hit.to(tl.int32)
        grandchild = tl.load(next_token_ptr + child, mask=hit, other=-1).to(tl.int64)
        sibling = tl.load(next_sibling_ptr + child, mask=has_child, other=-1).to(tl.int64)
        node = tl.where(hit, child, node)
        child = tl.where(hit, grandchild, sibling)

    in_row = offs < num_nodes
    emitted = tl.load(target_predict_ptr + path, mask=path >= 0, other=-1)
    tl.store(accept_index_ptr + batch * stride_accept_index + offs, path.to(tl.int32), mask=in_row)
    tl.store(emitted_ptr + batch * stride_emitted + offs, emitted, mask=in_row)
    tl.store(accept_lens_ptr + batch, num_accepted)


def chain_layout(batch: int, num_drafts: int, device: torch.device | str) -> tuple[torch.Tensor, torch.Tensor]:
    """(next_token, next_sibling), each [batch, num_drafts + 1] int64, of a chain: node i's child is i + 1."""
    num_nodes = num_drafts + 1
    next_token = torch.arange(1, num_nodes + 1, dtype=torch.int64, device=device)
    next_token[-1] = -1
    next_token = next_token.expand(batch, num_nodes).contiguous()
    next_sibling = torch.full((batch, num_nodes), -1, dtype=torch.int64, device=device)
    return next_token, next_sibling


def verify_greedy(candidates: torch.Tensor, next_token: torch.Tensor, next_sibling: torch.Tensor,
                  target_predict: torch.Tensor, accept_lens: torch.Tensor, accept_index: torch.Tensor,
                  emitted: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Walk each request's tree; write and return (accept_lens, accept_index, emitted).

    candidates:     [B, T] int64, the token of each node (node 0 the root).
    next_token:     [B, T] int64, first child of each node, -1 none.
    next_sibling:   [B, T] int64, next sibling of each node, -1 none.
    target_predict: [B, T] int64, the target's argmax after each node.
    accept_lens:    [B] int32 out, accepted drafts + 1 (tokens emitted, bonus included).
    accept_index:   [B, T] int32 out, path node indices from 0, padded with -1.
    emitted:        [B, T] int64 out, target_predict at the path nodes, padded with -1.
    All on one device, last dim contiguous. Child and sibling links outside [0, T) end a walk.
    """
    require(candidates.dim() == 2 and candidates.shape[1] >= 1,
             f"candidates must be [B, T] with T >= 1, got shape {tuple(candidates.shape)}")
    batch, num_nodes = candidates.shape
    inputs = (("candidates", candidates), ("next_token", next_token), ("next_sibling", next_sibling),
              ("target_predict", target_predict))
    outputs = (("accept_index", accept_index, torch.int32), ("emitted", emitted, torch.int64))
    for name, t in inputs:
        require(t.shape == (batch, num_nodes), f"{name} must be [{batch}, {num_nodes}], got shape {tuple(t.shape)}")
        require(t.dtype == torch.int64, f"{name} must be int64, got {t.dtype}")
    require(accept_lens.shape == (batch,), f"accept_lens must be [{batch}], got shape {tuple(accept_lens.shape)}")
    require(accept_lens.dtype == torch.int32, f"accept_lens must be int32, got {accept_lens.dtype}")
    for name, t, dtype in outputs:
        require(t.shape == (batch, num_nodes), f"{name} must be [{batch}, {num_nodes}], got shape {tuple(t.shape)}")
        require(t.dtype == dtype, f"{name} must be {dtype}, got {t.dtype}")
    for name, t in (*inputs, ("accept_lens", accept_lens), *((n, t) for n, t, _ in outputs)):
        require(t.stride(-1) == 1, f"{name} must be contiguous in its last dim, got strides {t.stride()}")
        require(t.device == candidates.device, f"{name} is on {t.device}, candidates on {candidates.device}")
    if batch == 0:
        return accept_lens, accept_index, emitted

    _verify_greedy_kernel[(batch,)](
        candidates, next_token, next_sibling, target_predict,
        accept_lens, accept_index, emitted,
        num_nodes,
        candidates.stride(0), next_token.stride(0), next_sibling.stride(0), target_predict.stride(0),
        accept_index.stride(0), emitted.stride(0),
        BLOCK_T=triton.next_power_of_2(num_nodes),
    )
    return accept_lens, accept_index, emitted
