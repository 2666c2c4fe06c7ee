"""Verification of a drafted chain against the target, for one verify forward.

The target's token at each verified position is chosen by the `Sampler`: its argmax (greedy), or its
keyed sample y_i = argmax_t p_i(t) / E(seed, i, t). A draft is accepted iff it equals that token, and
the first mismatch emits the target's token there, so the emitted tokens are exactly those plain
decoding would choose at those positions: for greedy requests the argmax, for sampled ones a draw
from the target's filtered distribution with the same noise. This is "draw y_i from p_i, descend iff
the draft is y_i", exact for any drafter.
"""

import torch


def accept_lengths(drafts: torch.Tensor, target_tokens: torch.Tensor) -> torch.Tensor:
    """drafts: [B, k]; target_tokens: [B, k+1] -> accept_lens [B] in 1..k+1.

    Request b emits target_tokens[b, :accept_lens[b]]: the accepted drafts (equal to the target's
    tokens there) followed by the target's own token at the first mismatch (or the bonus)."""
    matches = (drafts == target_tokens[:, :-1]).int()  # [B, k]
    return matches.cumprod(dim=1).sum(dim=1) + 1


def walk_tree(tree, target_tokens: torch.Tensor, use_kernel: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """tree: a DraftTree [B, N]; target_tokens: [B, N], the target's choice after each node.

    From the root, descend to the child whose token equals the target's choice at the current node
    (siblings hold distinct tokens, so at most one does) until none does. Returns (accept_lens [B]
    int64: path nodes, root included = tokens emitted, and path [B, N] int64: the path's node indices
    from the root, padded with -1). Request b emits target_tokens[b, path[b, i]] for i < accept_lens[b].
    `use_kernel`: walk with the Triton kernel (on CUDA, no host sync); the same result either way."""
    if use_kernel:
        from kernels.verify_greedy import verify_greedy

        b, n = tree.tokens.shape
        first_child, next_sibling = tree.sibling_links()
        accept_lens = torch.empty(b, dtype=torch.int32, device=tree.tokens.device)
        path = torch.empty(b, n, dtype=torch.int32, device=tree.tokens.device)
        emitted = torch.empty(b, n, dtype=torch.int64, device=tree.tokens.device)
        verify_greedy(tree.tokens.contiguous(), first_child, next_sibling, target_tokens.contiguous(),
                      accept_lens, path, emitted)
        return accept_lens.long(), path.long()
    parent = tree.parents.clamp(min=0)
    # a node is on the path iff its parent is and its token is the target's choice at its parent
    match = tree.tokens == target_tokens.gather(1, parent)
    on_path = torch.zeros_like(match)
    on_path[:, 0] = True
    for depth in range(1, int(tree.depths.max()) + 1):
        on_path |= (tree.depths == depth) & match & on_path.gather(1, parent)
    n = tree.tokens.shape[1]
    index = torch.arange(n, device=on_path.device).expand_as(on_path)
    path = torch.where(on_path, index, n).sort(dim=1).values  # depth order = index order
    return on_path.sum(dim=1), path.masked_fill(path == n, -1)
