"""Verification: one target forward over every request's draft tree, and the one accept rule.

The target's token at each verified node is chosen by the `Sampler`: its argmax (greedy), or its
keyed sample y = argmax_t p(t) / E(seed, position, t). From the root, verification descends to the
child whose token equals the target's choice at the current node, until none does; the path's
tokens after the root are the accepted drafts and the target's choice at the path's last node is
emitted after them. So the emitted tokens are exactly those plain decoding would choose at those
positions: for greedy requests the argmax, for sampled ones a draw from the target's filtered
distribution with the same noise. This is "draw y from p, descend iff y is a child", exact for any
drafter. A chain (the one-child tree) takes the fast path: causal attention and a prefix match.

That is `verify: reproducible`, sampled output equal to plain decoding's. `verify: rejection` verifies
sampled requests by speculative rejection sampling instead (`rejection.py`): more drafts accepted, the
output still distributed as plain decoding's but not the same draws.
"""

from dataclasses import dataclass, replace

import torch

from eyas.engine import logprobs
from eyas.engine.forward_batch import ForwardBatch, wants_exact
from eyas.engine.request import Request
from eyas.engine.runner import ForwardOutput, ModelRunner
from eyas.engine.sampling import Sampler, SamplingBatch
from eyas.engine.speculative import rejection
from eyas.engine.speculative.tree import DraftTree


@dataclass
class Verified:
    """The outcome of one verify forward, for B requests of N nodes each."""

    prefix_lens: list[int]  # committed length L of each request before the cycle
    emitted: list[list[int]]  # per request: the accepted drafts, then the target's token
    path: torch.Tensor  # [B, N] int64 the accepted path's node indices from the root (a chain: 0, 1, ...)
    on_path: torch.Tensor  # [B, N] bool: path[b, i] is a node of the path (i < len(emitted[b]))
    keep: torch.Tensor  # [sum(len(e))] rows of `out` of the path's nodes, packed in request order
    out: ForwardOutput  # the verify forward (hidden states of every node: the draft-extend features)
    reach: list[int]  # per request: the draft positions it proposed (`DraftTree.reach`)


class TargetVerifier:
    def __init__(self, target_runner: ModelRunner, req_to_token: torch.Tensor, sampler: Sampler,
                 mode: str = "reproducible", exact_logprobs: bool = True):
        self.target_runner = target_runner
        self.exact_logprobs = exact_logprobs
        self.req_to_token = req_to_token
        self.sampler = sampler
        self.mode = mode  # "reproducible" | "rejection"
        self._one_node: dict = {}  # (B, device) -> a zero-step cycle's path, on_path and keep

    def verify(self, requests: list[Request], tree: DraftTree, sampling: SamplingBatch, state) -> Verified:
        """One target forward over `tree` ([B, N] nodes after each request's committed tokens) on the
        state's verify backend; the accepted path of each request (and the logprobs of its emitted
        tokens, for requests that ask: `logprobs.record`)."""
        rows, prefix_lens = [r.row for r in requests], [r.num_computed for r in requests]
        grammar, proposed = sampling.grammar, tree
        if grammar is not None:  # drafts a grammar rejects are cut before the forward (a chain's refilled
            # with the tokens it forces, where the drafts are deterministic: a drawn draft's q is the head's)
            tree = replace(tree, tokens=grammar.prepare(tree.tokens, None if tree.is_chain else tree.parents,
                                                        fill_forced=tree.draft_probs is None))
        b, n = tree.tokens.shape
        tokens = tree.tokens.clamp(min=0)  # the target reads some token at an unfilled node; it is never accepted
        if tree.is_chain:
            batch = ForwardBatch.from_tails(rows, tokens, prefix_lens, self.req_to_token)
        else:
            prefix = torch.tensor(prefix_lens, dtype=torch.int64, device=tokens.device)
            batch = ForwardBatch.for_tree(rows, tokens, prefix_lens, prefix[:, None] + tree.depths,
                                          tree.ancestor_mask(), self.req_to_token)
        batch.exact = self.exact_logprobs and wants_exact(requests)
        out = self.target_runner.forward(batch, logits_indices=state.verify_buffers.indices(b, n),
                                         attn_backend=state.verify_backend, graph=state.verify_graph)
        # each node's logits processed as plain decoding would at its position (drafts on its path counted)
        processed = logits = sampling.processed(out.logits, tree.tokens, None if tree.is_chain else tree.ancestor_mask())
        if grammar is not None:
            logits = grammar.apply(logits)
        if n == 1 and grammar is None:  # nothing drafted: plain decoding's draw, in either verify mode
            verified = self._undrafted(prefix_lens, out, self.sampler.sample(logits, sampling))
        else:
            accept_lens, path, chosen = self.accept(logits, tree, sampling)
            reach = torch.maximum(proposed.reach(), tree.reach())  # the drafter's positions and any the grammar filled
            verified = self._verified(prefix_lens, tree, out, accept_lens, path, chosen, reach.tolist())
        if grammar is not None:
            grammar.commit(verified.emitted)
        if any(r.params.logprobs is not None for r in requests):
            path = verified.path
            rows = (torch.arange(b, device=path.device)[:, None] * n + path).tolist()
            logprobs.record(requests, processed, [row[:len(e)] for row, e in zip(rows, verified.emitted)],
                            verified.emitted)
        return verified

    def accept(self, logits: torch.Tensor, tree: DraftTree, sampling: SamplingBatch
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The accept rule over the verify forward's logits [B * N, V]: (accept_lens [B], path [B, N],
        chosen [B, N]); request b emits chosen[b, :accept_lens[b]], chosen at the nodes path[b, :accept_lens[b]]."""
        b, n = tree.tokens.shape
        drafts = tree.tokens[:, 1:].to(logits.device)
        chain_path = torch.arange(n, device=logits.device).expand(b, n)
        if self.mode == "rejection" and not sampling.all_greedy:
            if tree.is_chain:
                accept_lens, chosen = rejection.verify_chain(logits, drafts, sampling, tree.draft_probs)
                return accept_lens, chain_path, chosen
            target = rejection.tree_choices(logits, sampling, tree.depths)
        else:
            offsets = None if tree.is_chain else tree.depths  # a chain's node j sits at depth j
            target = self.sampler.sample(logits, sampling, width=n, offsets=offsets)  # [B, N] the target's choices
            if tree.is_chain:
                return accept_lengths(drafts, target), chain_path, target
        accept_lens, path = walk_tree(tree, target, use_kernel=target.device.type == "cuda")
        return accept_lens, path, target.gather(1, path.clamp(min=0))

    def _undrafted(self, prefix_lens: list[int], out: ForwardOutput, chosen: torch.Tensor) -> Verified:
        """A cycle at 0 steps (plain decoding through the verify path): each request emits the target's
        choice [B, 1] at its one node, as `accept` and `_verified` would find (the sampler's draw, as plain
        decoding's: with no draft to test, rejection sampling draws from p too), without their work."""
        b, device = chosen.shape[0], chosen.device
        path = self._one_node.get((b, device))
        if path is None:  # one node per request: the same read-only (path, on_path, keep) every cycle
            path = self._one_node[(b, device)] = (torch.zeros(b, 1, dtype=torch.int64, device=device),
                                                  torch.ones(b, 1, dtype=torch.bool, device=device),
                                                  torch.arange(b, device=device))
        return Verified(list(prefix_lens), chosen.tolist(), *path, out, [0] * b)

    @staticmethod
    def _verified(prefix_lens: list[int], tree: DraftTree, out: ForwardOutput, accept_lens: torch.Tensor,
                  path: torch.Tensor, chosen: torch.Tensor, reach: list[int]) -> Verified:
        b, n = path.shape
        on_path = torch.arange(n, device=path.device) < accept_lens[:, None]  # [B, N]
        keep = (torch.arange(b, device=path.device)[:, None] * n + path)[on_path]
        emitted = [row[:m] for row, m in zip(chosen.tolist(), accept_lens.tolist())]
        return Verified(list(prefix_lens), emitted, path, on_path, keep, out, reach)


def accept_lengths(drafts: torch.Tensor, target_tokens: torch.Tensor) -> torch.Tensor:
    """drafts: [B, k]; target_tokens: [B, k+1] -> accept_lens [B] in 1..k+1.

    Request b emits target_tokens[b, :accept_lens[b]]: the accepted drafts (equal to the target's
    tokens there) followed by the target's own token at the first mismatch (or the bonus)."""
    matches = (drafts == target_tokens[:, :-1]).int()  # [B, k]
    return matches.cumprod(dim=1).sum(dim=1) + 1


def walk_tree(tree: DraftTree, target_tokens: torch.Tensor, use_kernel: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """tree: a DraftTree [B, N]; target_tokens: [B, N], the target's choice after each node.

    From the root, descend to the child whose token equals the target's choice at the current node
    (siblings hold distinct tokens, so at most one does) until none does. Returns (accept_lens [B]
    int64: path nodes, root included = tokens emitted, and path [B, N] int64: the path's node indices
    from the root, padded with -1). Request b emits target_tokens[b, path[b, i]] for i < accept_lens[b].
    `use_kernel`: walk with the Triton kernel (on CUDA, no host sync); the same result either way."""
    if use_kernel:
        from eyas.kernels.verify_greedy import verify_greedy

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
