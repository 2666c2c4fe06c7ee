"""EAGLE-2 dynamic tree expansion on a draft head: grow a pool of candidates step by step from each
request's last draft output, then keep the best of them as the verify tree (`select_tree`).

Each step after the first runs the head over the frontier alone, one query per node, reading the
committed prefix and the node's own ancestors through a request-to-token table of one row per node
(`_path_table`), so every node attends to its true ancestors. Under a grammar, each node's children
are what its request's grammar allows after the node's path (`draft_grammar.mask_tree_nodes`).
"""

import torch

from eyas.engine.attention.multi_step import MultiStepDraftBackend
from eyas.engine.forward_batch import ForwardBatch
from eyas.engine.sampling import SamplingBatch
from eyas.engine.speculative.candidate import Candidate
from eyas.engine.speculative.drafters.draft_grammar import mask_tree_nodes
from eyas.engine.speculative.tree import DraftTree, select_tree


def expand_tree(head, rows: list[int], seq_lens: list[int], sampling: SamplingBatch, bonus: torch.Tensor,
                shape: Candidate, decode_backend: MultiStepDraftBackend | None, graph=None) -> DraftTree:
    """EAGLE-2 dynamic expansion on `head` (a `DraftHead`) over `shape.num_steps` steps; returns each
    request's tree of `shape.num_draft_tokens` nodes rooted at its pending `bonus` token [B].

    Step 1 takes the root's `topk` best children; each later step runs the head over the frontier
    (the `topk` best nodes of the previous step, by cumulative draft log-probability) and proposes
    `topk` children for each. Every proposed node is a candidate; the tree keeps the root and the
    best `num_nodes - 1` candidates. Scores are log-probabilities of the head's logits divided by
    `tree_score_temperature` (1: EAGLE-2's own). Children are the head's `topk` best tokens, or, for sampled
    requests with `draft_sampling: sample` and reproducible verification, its first `topk` in the race
    the verification's noise runs at that depth (the first of them is the chain's coupled draw).

    Each later step's forward runs the frontier alone, one query per node: node j of step s is written
    at column L + (s - 1) * topk + j (L = seq_lens), sits at position L + s - 1 and reads the committed
    prefix, its ancestors' columns and its own, through a table of one row per node (`_path_table`)."""
    model, req_to_token = head.model, head.req_to_token
    device = req_to_token.device
    row_t = torch.tensor(rows, dtype=torch.int64, device=device)
    hidden, logits = head.buffers.load(row_t)  # the root's: [B, H], [B, Vd]
    b, k, num_steps = len(rows), shape.topk, shape.num_steps
    # rejection verification: deterministic children (the head's top-k), see `rejection.py`
    coupled = head.sampled_drafts(sampling, "reproducible")
    columns = model.draft_token_ids() if coupled else None
    prefix = torch.tensor(seq_lens, dtype=torch.int64, device=device)

    def children(node_logits: torch.Tensor, depth: int):  # [B * w, Vd] -> ids, log-probs: [B, w, k]
        width = node_logits.shape[0] // b
        logp = (node_logits.float() / head.tree_score_temperature).log_softmax(dim=-1)
        if coupled:
            offsets = torch.full((b, width), depth, dtype=torch.int64, device=device)
            ids = head.sampler.ranked(node_logits, sampling, offsets, k, token_ids=columns)
        else:
            ids = logp.topk(k, dim=-1).indices
        return ids.view(b, width, k), logp.gather(1, ids).view(b, width, k)

    # candidates, in depth order: the root's k children, then k*k per later step
    num_candidates = k + (num_steps - 1) * k * k
    cand_ids = torch.empty(b, num_candidates, dtype=torch.int64, device=device)  # draft ids
    cand_scores = torch.empty(b, num_candidates, dtype=torch.float32, device=device)
    cand_parents = torch.full((b, num_candidates), -1, dtype=torch.int64, device=device)
    cand_depths = torch.ones(b, num_candidates, dtype=torch.int64, device=device)
    grammar = sampling.grammar if sampling.grammar is not None and sampling.grammar.mask_drafts else None
    if grammar is not None:  # each node's children are what its request's grammar allows after its path
        logits = mask_tree_nodes(logits, grammar, {row: [[]] for row in grammar.rows}, model.draft_token_ids())
    ids, logp = children(logits, 0)  # the root's children: depth 1
    cand_ids[:, :k], cand_scores[:, :k] = ids.view(b, k), logp.view(b, k)
    frontier = torch.arange(k, device=device).expand(b, k)  # candidate index of each frontier node
    frontier_hidden = hidden[:, None, :].expand(b, k, hidden.shape[-1])  # each one's parent's hidden
    ancestor_slots = torch.empty(b, k, 0, dtype=torch.int64, device=device)  # [B, k, s - 1] its ancestors' KV slots
    row_prefix = req_to_token[row_t, : max(seq_lens)].repeat_interleave(k, dim=0)  # [B * k, max L]
    node_rows = list(range(b * k))
    filled = k
    for step in range(1, num_steps):
        own = req_to_token[row_t[:, None], prefix[:, None] + (step - 1) * k + torch.arange(k, device=device)]
        path_slots = torch.cat([ancestor_slots, own[:, :, None]], dim=2)  # [B, k, s]
        table = _path_table(row_prefix, prefix.repeat_interleave(k), path_slots.view(b * k, step))
        batch = ForwardBatch.from_tails(node_rows, model.draft_to_target(cand_ids.gather(1, frontier)).view(b * k, 1),
                                        [n + step - 1 for n in seq_lens for _ in range(k)], table)
        out = head.runner.forward(batch, attn_backend=decode_backend.backend_for_step(step - 1), graph=graph,
                                  **head.features_input(frontier_hidden.reshape(b * k, -1)))
        step_hidden = out.hidden.view(b, k, -1)  # [B, k, H] the frontier's outputs
        node_logits = out.logits
        if grammar is not None:
            draft_token_ids = model.draft_token_ids()
            paths = _frontier_paths(grammar.rows, frontier, cand_ids, cand_parents, draft_token_ids)
            node_logits = mask_tree_nodes(node_logits, grammar, paths, draft_token_ids)
        ids, logp = children(node_logits, step)  # [B, k, k]
        scores = (cand_scores.gather(1, frontier)[:, :, None] + logp).view(b, k * k)
        new = slice(filled, filled + k * k)
        cand_ids[:, new], cand_scores[:, new] = ids.view(b, k * k), scores
        cand_parents[:, new] = frontier.repeat_interleave(k, dim=1)
        cand_depths[:, new] = step + 1
        if step == num_steps - 1:
            break
        best = scores.topk(k, dim=1).indices  # [B, k] of the k*k new candidates
        parent = (best // k)[:, :, None]  # [B, k, 1] the frontier node each one extends
        frontier = filled + best
        frontier_hidden = step_hidden.gather(1, parent.expand(b, k, step_hidden.shape[-1]))
        ancestor_slots = path_slots.gather(1, parent.expand(b, k, step))
        filled += k * k
    tree = select_tree(bonus, cand_ids, cand_parents, cand_scores, cand_depths, shape.num_draft_tokens)
    tree.tokens[:, 1:] = model.draft_to_target(tree.tokens[:, 1:])
    return tree


def _frontier_paths(rows: list[int], frontier: torch.Tensor, cand_ids: torch.Tensor, cand_parents: torch.Tensor,
                    draft_token_ids: torch.Tensor) -> dict[int, list[list[int]]]:
    """Per request row: the target ids of each frontier node's path (frontier [B, w] candidate indices)."""
    index = torch.tensor(rows, device=frontier.device)
    to_target = draft_token_ids.tolist()
    ids, parents, nodes = cand_ids[index].tolist(), cand_parents[index].tolist(), frontier[index].tolist()
    return {row: [[to_target[t] for t in _candidate_path(ids[i], parents[i], node)] for node in nodes[i]]
            for i, row in enumerate(rows)}


def _candidate_path(ids: list[int], parents: list[int], node: int) -> list[int]:
    """The draft ids from the root's child down to candidate `node` (parents: -1 below the root)."""
    path = []
    while node >= 0:
        path.append(ids[node])
        node = parents[node]
    return path[::-1]


def _path_table(row_prefix: torch.Tensor, prefix_lens: torch.Tensor, path_slots: torch.Tensor) -> torch.Tensor:
    """A request-to-token table with one row per tree node: its request's committed slots (row_prefix
    [M, max L], the first prefix_lens [M] of them), then the slots of its path from depth 1 down to itself
    (path_slots [M, s]). Node m's KV reads are row m's first prefix_lens[m] + s entries."""
    m, s = path_slots.shape
    table = torch.cat([row_prefix, path_slots.new_zeros(m, s)], dim=1)
    table.scatter_(1, prefix_lens[:, None] + torch.arange(s, device=table.device), path_slots)
    return table
