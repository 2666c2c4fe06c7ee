"""DraftTree: B draft trees of N nodes each, built by a drafter, read by verify and commit.

Node 0 of each tree is its root, the request's pending bonus token at position L; nodes 1..N-1 are
draft tokens, in depth order (a parent always has a lower index than its child). A node at depth d
sits at position L + d, and in the verify forward its KV goes to column L + j of the request's row
(j its index); attention lets each node see the committed prefix, its ancestors and itself.

A chain (topk = 1) is the tree whose node j has parent j - 1 (`DraftTree.chain`): verify and commit
take its fast path (causal attention, no mask, no tree walk, no KV move), and its parents and depths
are made only when asked for.
"""

from dataclasses import dataclass

import torch

from eyas.engine.speculative.rejection import DraftProbs

UNFILLED = -1  # the token of a node nothing filled (a hole in a chain, padding in a tree): never accepted
NO_PARENT = -1  # the root's parent


@dataclass
class DraftTree:
    tokens: torch.Tensor  # [B, N] target token ids; column 0 the root
    _parents: torch.Tensor | None = None  # [B, N] int64 node index of each node's parent, NO_PARENT at the root
    _depths: torch.Tensor | None = None  # [B, N] int64, 0 at the root
    is_chain: bool = False  # node j's parent is j - 1 (parents and depths then made on demand)
    # a chain's drafts drawn from the draft's distributions (rejection verification); None: deterministic drafts
    draft_probs: DraftProbs | None = None

    @classmethod
    def chain(cls, bonus: torch.Tensor, drafts: torch.Tensor, draft_probs: DraftProbs | None = None) -> "DraftTree":
        """bonus [B], drafts [B, w] (UNFILLED after a request's last draft) -> the chains [bonus, d_1..d_w]."""
        return cls(torch.cat([bonus[:, None].to(drafts.device), drafts], dim=1), is_chain=True,
                   draft_probs=draft_probs)

    @classmethod
    def ragged_chain(cls, bonus: torch.Tensor, chains: list[list[int]]) -> "DraftTree":
        """Chains of unequal lengths (a lookup drafter's proposals, some empty), as wide as the longest,
        UNFILLED after each one's last draft."""
        width = max(map(len, chains))
        drafts = [c + [UNFILLED] * (width - len(c)) for c in chains]  # [B, w]
        return cls.chain(bonus, torch.tensor(drafts, dtype=torch.int64).view(len(chains), width).to(bonus.device))

    @property
    def num_nodes(self) -> int:
        return self.tokens.shape[1]

    @property
    def parents(self) -> torch.Tensor:
        if self._parents is None:
            b, n = self.tokens.shape
            self._parents = (torch.arange(n, device=self.tokens.device) - 1).expand(b, n)
        return self._parents

    @property
    def depths(self) -> torch.Tensor:
        if self._depths is None:
            b, n = self.tokens.shape
            self._depths = torch.arange(n, device=self.tokens.device).expand(b, n)
        return self._depths

    def reach(self) -> torch.Tensor:
        """[B] the deepest filled node of each request's tree: the draft positions it proposed (a chain:
        its drafts). Every cycle counts its drafts this way, chain or tree."""
        filled = self.tokens >= 0
        if self.is_chain:  # holes only follow a request's last draft
            return filled[:, 1:].sum(dim=1)
        return torch.where(filled, self.depths, 0).amax(dim=1)

    def ancestor_mask(self) -> torch.Tensor:
        """[B, N, N] bool: entry [b, j, i] is True iff node i is node j or one of its ancestors."""
        return ancestor_mask(self.parents)

    def sibling_links(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(first_child, next_sibling), each [B, N] int64 with -1 for none: the layout of the tree-walk kernel."""
        b, n = self.parents.shape
        first_child = torch.full((b, n), -1, dtype=torch.int64, device=self.parents.device)
        next_sibling = torch.full((b, n), -1, dtype=torch.int64, device=self.parents.device)
        for j in range(n - 1, 0, -1):  # from the last node down: each parent ends with its first child
            parent = self.parents[:, j]
            next_sibling[:, j] = first_child.gather(1, parent[:, None])[:, 0]
            first_child.scatter_(1, parent[:, None], j)
        return first_child, next_sibling


def ancestor_mask(parents: torch.Tensor) -> torch.Tensor:
    """parents: [B, N] (-1 = root) -> [B, N, N] ancestor-or-self mask, by walking every node up one
    level at a time (as many rounds as the deepest node's depth)."""
    b, n = parents.shape
    mask = torch.eye(n, dtype=torch.bool, device=parents.device).repeat(b, 1, 1)
    up = parents  # [B, N] each node's ancestor at the current round, -1 once past the root
    while bool((up >= 0).any()):
        column = up.clamp(min=0)[:, :, None]
        mask.scatter_(2, column, mask.gather(2, column) | (up >= 0)[:, :, None])
        up = torch.where(up >= 0, parents.gather(1, up.clamp(min=0)), up)
    return mask


def select_tree(roots: torch.Tensor, tokens: torch.Tensor, parents: torch.Tensor, scores: torch.Tensor,
                depths: torch.Tensor, num_nodes: int) -> DraftTree:
    """Keep the root and the `num_nodes - 1` best candidates by cumulative draft log-probability.

    roots [B]; tokens, parents, scores, depths: [B, M] candidates laid out in depth order, parents
    indexing candidates (-1 = the root). A child's score never exceeds its parent's, and ties go to
    the earlier (shallower) candidate, so the kept set holds every kept node's ancestors."""
    order = scores.sort(dim=1, descending=True, stable=True).indices[:, : num_nodes - 1]
    kept = order.sort(dim=1).values  # [B, N-1] back in depth order
    b, m = tokens.shape
    node_of = torch.full((b, m), -1, dtype=torch.int64, device=tokens.device)  # candidate -> tree index
    node_of.scatter_(1, kept, torch.arange(1, num_nodes, device=tokens.device).expand(b, -1))
    cand_parent = parents.gather(1, kept)
    tree_parent = torch.where(cand_parent >= 0, node_of.gather(1, cand_parent.clamp(min=0)), 0)
    zero = torch.zeros(b, 1, dtype=torch.int64, device=tokens.device)
    return DraftTree(
        torch.cat([roots[:, None], tokens.gather(1, kept)], dim=1),
        torch.cat([zero + NO_PARENT, tree_parent], dim=1),
        torch.cat([zero, depths.gather(1, kept)], dim=1),
    )


def max_tree_nodes(topk: int, num_steps: int) -> int:
    """Nodes EAGLE-2 expansion can propose, the root counted: topk at the first step, topk^2 at each later one."""
    return 1 + topk + (num_steps - 1) * topk * topk


def graft(tree: DraftTree, branches: list[list[list[int]]], num_nodes: int) -> DraftTree:
    """Merge token branches into `tree` as paths from the root, sharing nodes where a branch follows
    existing ones, and pad every tree to `num_nodes` nodes with UNFILLED leaves under the root.
    branches[b]: request b's branches, best first; new nodes past `num_nodes` are dropped. New nodes
    are appended after the tree's, so parents still precede children. On the host (n-gram sizes)."""
    b, n = tree.tokens.shape
    tokens = torch.full((b, num_nodes), UNFILLED, dtype=torch.int64)
    parents = torch.zeros(b, num_nodes, dtype=torch.int64)
    depths = torch.ones(b, num_nodes, dtype=torch.int64)
    tokens[:, :n], parents[:, :n], depths[:, :n] = tree.tokens.cpu(), tree.parents.cpu(), tree.depths.cpu()
    for i, request_branches in enumerate(branches):
        if not request_branches:
            continue
        children = {(p, t): j for j, (p, t) in enumerate(zip(parents[i, 1:n].tolist(), tokens[i, 1:n].tolist()), 1)}
        filled = n
        for branch in request_branches:
            node = 0
            for depth, token in enumerate(branch, start=1):
                child = children.get((node, token))
                if child is None:
                    if filled == num_nodes:
                        break
                    child = children[(node, token)] = filled
                    tokens[i, child], parents[i, child], depths[i, child] = token, node, depth
                    filled += 1
                node = child
    device = tree.tokens.device
    return DraftTree(tokens.to(device), parents.to(device), depths.to(device))


def root_only(bonus: torch.Tensor) -> DraftTree:
    """bonus [B] -> trees of the root alone."""
    column = bonus[:, None]
    return DraftTree(column.clone(), torch.full_like(column, NO_PARENT), torch.zeros_like(column))
