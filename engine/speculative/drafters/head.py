"""DraftHead: a draft model's runner and the loops every drafter with a draft model runs on it.

Draft-extend (the head over verified rows: fills its KV and keeps each request's last output, the
state of its next first proposal), the chain loop (k autoregressive steps) and the EAGLE-2 tree loop
(dynamic expansion). EAGLE / EAGLE-3 heads pair each token with the target's feature one position
back; a standalone LM (`StandaloneDraftModel`) reads tokens only and ignores the features.

Draft-extend runs on `runner.attn_backend`, which the runtime state binds to its draft-extend backend
(`engine/speculative/bindings.py`); each draft step runs on its own backend of the state's
`MultiStepDraftBackend`.
"""

import torch

from eyas.engine.attention.multi_step import MultiStepDraftBackend
from eyas.engine.forward_batch import ForwardBatch
from eyas.engine.runner import ModelRunner
from eyas.engine.sampling import Sampler, SamplingBatch
from eyas.engine.speculative import rejection
from eyas.engine.speculative.candidate import Candidate
from eyas.engine.speculative.drafters.draft_state_buffers import DraftStateBuffers
from eyas.engine.speculative.tree import DraftTree, select_tree


class DraftHead:
    def __init__(self, runner: ModelRunner, req_to_token: torch.Tensor, buffers: DraftStateBuffers,
                 sampler: Sampler, draft_sampling: str, tree_score_temperature: float = 1.0,
                 verify: str = "reproducible"):
        self.runner = runner
        self.req_to_token = req_to_token
        self.buffers = buffers
        self.sampler = sampler
        self.draft_sampling = draft_sampling  # "greedy" | "sample"
        self.verify = verify  # the verify mode the drafts are for: "reproducible" | "rejection"
        self._identity_vocab: bool | None = None  # the draft's ids are the target's (known on first use)
        # trees rank nodes by cumulative log-softmax(logits / this): below 1 sharpens an under-confident head
        self.tree_score_temperature = tree_score_temperature
        self.draft_extend_backend = runner.attn_backend  # bound by bindings.bind_runtime_state

    @property
    def model(self):
        return self.runner.model

    def target_features(self, hidden: torch.Tensor, aux: list[torch.Tensor]) -> torch.Tensor:
        return self.model.target_features(hidden, aux)

    def _features_input(self, hidden: torch.Tensor) -> dict:
        """The previous step's hidden as a draft step's features; a standalone LM reads none."""
        return {} if self.model.kind == "lm" else {"features": hidden}

    def warmup_graph(self, graph, batch_size: int) -> None:
        """Compile `graph`'s draft-step forward (one token per request) for `batch_size` requests."""
        with torch.inference_mode():  # as the steps' features are
            hidden = torch.zeros(batch_size, self.model.config.hidden_size, dtype=self.buffers.hidden.dtype,
                                 device=self.req_to_token.device)
        graph.warmup(batch_size, 1, **self._features_input(hidden))

    def extend(self, rows: list[int], prefix_lens: list[int], tokens: list[list[int]],
               features: torch.Tensor | None = None) -> None:
        """Run the head over verified rows: request i's row p + j pairs token tokens[i][j] with the
        target feature of position p + j (p = prefix_lens[i]; a standalone LM reads no features). Fills
        the draft KV of those rows and keeps each request's last output for its next first proposal.
        Runs on `runner.attn_backend`."""
        batch = ForwardBatch.from_tails(rows, tokens, prefix_lens, self.req_to_token)
        inputs = {} if features is None else {"features": features}
        out = self.runner.forward(batch, **inputs)
        self.buffers.store(batch.req_rows, out.hidden[batch.last_token_indices], out.logits)  # logits: [B, Vd]

    def _target_ids(self, draft_columns: torch.Tensor | None) -> torch.Tensor | None:
        """Target ids of a draft distribution's columns ([S, w]; None: every column of the draft
        vocabulary, mapped by its [Vd] table, or None when draft ids are the target's)."""
        if draft_columns is not None:
            return self.model.draft_to_target(draft_columns)
        if self._identity_vocab is None:
            ids = self.model.draft_token_ids()
            self._identity_vocab = bool(torch.equal(ids, torch.arange(ids.shape[0], device=ids.device)))
        return None if self._identity_vocab else self.model.draft_token_ids()

    def _sampled_drafts(self, sampling: SamplingBatch, verify: str) -> bool:
        return self.draft_sampling == "sample" and self.verify == verify and not sampling.all_greedy

    def chain(self, rows: list[int], seq_lens: list[int], sampling: SamplingBatch, bonus: torch.Tensor,
              num_steps: int, decode_backend: MultiStepDraftBackend | None, graph=None) -> DraftTree:
        """Propose `num_steps` tokens (k >= 1) per request after its committed `seq_lens` tokens: the
        chains [bonus, d_1..d_k] (target ids). Greedy drafting takes the head's argmax; `draft_sampling:
        sample` lets sampled requests draw from the head's filtered distribution: for reproducible
        verification with the noise the target uses at the same output position (coupled draws: a head
        close to the target proposes the target's own sample), for rejection verification independently,
        keeping the distributions drawn from (`DraftTree.draft_probs`)."""
        row_t = torch.tensor(rows, dtype=torch.int64, device=self.req_to_token.device)
        hidden, logits = self.buffers.load(row_t)  # [B, H], [B, Vd]
        coupled = self._sampled_drafts(sampling, "reproducible")
        drawn = self._sampled_drafts(sampling, "rejection")
        columns = self.model.draft_token_ids() if coupled else None  # target ids of the draft vocabulary
        # a grammar's requests draft what it allows after the drafts before (rolled back when done)
        walks = sampling.grammar.draft_walks() if sampling.grammar is not None else None
        tokens, probs = [], []
        try:
            for step in range(num_steps):
                allowed = None
                if walks:
                    logits, allowed = self._grammar_masked(logits, walks)
                if coupled:
                    token = self.model.draft_to_target(self.sampler.sample(logits, sampling, offset=step,
                                                                           token_ids=columns)[:, 0])
                elif drawn:
                    draft_columns, (q, q_columns) = rejection.draw_drafts(logits, sampling, offset=step)
                    token = self.model.draft_to_target(draft_columns)
                    probs.append((q, self._target_ids(q_columns)))
                else:
                    token = self.model.draft_to_target(logits.argmax(dim=-1))
                tokens.append(token)
                if walks:
                    drafted = token.tolist()
                    for row, walk in walks.items():
                        walk.advance(drafted[row], allowed[row])
                if step == num_steps - 1:
                    break
                # draft row L + step pairs the proposal of this step with the previous step's hidden
                batch = ForwardBatch.from_tails(rows, token[:, None], [n + step for n in seq_lens], self.req_to_token)
                backend = decode_backend.backend_for_step(step)
                out = self.runner.forward(batch, attn_backend=backend, graph=graph, **self._features_input(hidden))
                hidden, logits = out.hidden, out.logits
        finally:
            for walk in (walks or {}).values():
                walk.close()
        draft_probs = rejection.DraftProbs(probs) if drawn else None
        return DraftTree.chain(bonus, torch.stack(tokens, dim=1), draft_probs)

    def _grammar_masked(self, logits: torch.Tensor, walks: dict) -> tuple[torch.Tensor, dict]:
        """The draft's logits [B, Vd] with what each walk's grammar disallows next at -inf (over the
        draft vocabulary's target ids); and each walk's mask over the target vocabulary (None: unmasked)."""
        allowed = {row: walk.mask() for row, walk in walks.items()}
        keep = torch.ones(logits.shape, dtype=torch.bool, device=logits.device)
        ids = self.model.draft_token_ids()
        for row, mask in allowed.items():
            if mask is not None:
                on_draft = mask.to(logits.device)[ids[:logits.shape[-1]]]
                if bool(on_draft.any()):  # a draft vocabulary with none of the allowed tokens drafts freely
                    keep[row] = on_draft
        return logits.masked_fill(~keep, float("-inf")), allowed

    def _frontier_paths(self, rows: list[int], frontier: torch.Tensor, cand_ids: torch.Tensor,
                        cand_parents: torch.Tensor) -> dict[int, list[list[int]]]:
        """Per request row: the target ids of each frontier node's path (frontier [B, w] candidate indices)."""
        index = torch.tensor(rows, device=frontier.device)
        to_target = self.model.draft_token_ids().tolist()
        ids, parents, nodes = cand_ids[index].tolist(), cand_parents[index].tolist(), frontier[index].tolist()
        return {row: [[to_target[t] for t in _candidate_path(ids[i], parents[i], node)] for node in nodes[i]]
                for i, row in enumerate(rows)}

    def _tree_grammar_masked(self, logits: torch.Tensor, grammar, paths: dict[int, list[list[int]]]) -> torch.Tensor:
        """logits [B * w, Vd] of w tree nodes per request, with what each grammar row's request allows after
        each node's path (paths: row -> w paths of target ids) at -inf, over the draft vocabulary."""
        width = logits.shape[0] // grammar.size
        keep = torch.ones(logits.shape, dtype=torch.bool, device=logits.device)
        ids = self.model.draft_token_ids()[:logits.shape[-1]]
        for row, matcher in zip(grammar.rows, grammar.grammars):
            on_draft = matcher.masks_after(paths[row]).to(logits.device)[:, ids]  # [w, Vd]
            allows = on_draft.any(dim=-1, keepdim=True)  # a node whose allowed tokens the draft lacks drafts freely
            keep[row * width:(row + 1) * width] = on_draft | ~allows
        return logits.masked_fill(~keep, float("-inf"))

    def tree(self, rows: list[int], seq_lens: list[int], sampling: SamplingBatch, bonus: torch.Tensor,
             shape: Candidate, decode_backend: MultiStepDraftBackend | None, graph=None) -> DraftTree:
        """EAGLE-2 dynamic expansion over `shape.num_steps` steps; returns each request's tree of
        `shape.num_draft_tokens` nodes rooted at its pending `bonus` token [B].

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
        device = self.req_to_token.device
        row_t = torch.tensor(rows, dtype=torch.int64, device=device)
        hidden, logits = self.buffers.load(row_t)  # the root's: [B, H], [B, Vd]
        b, k, num_steps = len(rows), shape.topk, shape.num_steps
        # rejection verification: deterministic children (the head's top-k), see `rejection.py`
        coupled = self._sampled_drafts(sampling, "reproducible")
        columns = self.model.draft_token_ids() if coupled else None
        prefix = torch.tensor(seq_lens, dtype=torch.int64, device=device)

        def children(node_logits: torch.Tensor, depth: int):  # [B * w, Vd] -> ids, log-probs: [B, w, k]
            width = node_logits.shape[0] // b
            logp = (node_logits.float() / self.tree_score_temperature).log_softmax(dim=-1)
            if coupled:
                offsets = torch.full((b, width), depth, dtype=torch.int64, device=device)
                ids = self.sampler.ranked(node_logits, sampling, offsets, k, token_ids=columns)
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
            logits = self._tree_grammar_masked(logits, grammar, {row: [[]] for row in grammar.rows})
        ids, logp = children(logits, 0)  # the root's children: depth 1
        cand_ids[:, :k], cand_scores[:, :k] = ids.view(b, k), logp.view(b, k)
        frontier = torch.arange(k, device=device).expand(b, k)  # candidate index of each frontier node
        frontier_hidden = hidden[:, None, :].expand(b, k, hidden.shape[-1])  # each one's parent's hidden
        ancestor_slots = torch.empty(b, k, 0, dtype=torch.int64, device=device)  # [B, k, s - 1] KV slots of each one's ancestors
        row_prefix = self.req_to_token[row_t, : max(seq_lens)].repeat_interleave(k, dim=0)  # [B * k, max L]
        node_rows = list(range(b * k))
        filled = k
        for step in range(1, num_steps):
            own = self.req_to_token[row_t[:, None], prefix[:, None] + (step - 1) * k + torch.arange(k, device=device)]
            path_slots = torch.cat([ancestor_slots, own[:, :, None]], dim=2)  # [B, k, s]
            table = _path_table(row_prefix, prefix.repeat_interleave(k), path_slots.view(b * k, step))
            batch = ForwardBatch.from_tails(node_rows, self.model.draft_to_target(cand_ids.gather(1, frontier)).view(b * k, 1),
                                            [n + step - 1 for n in seq_lens for _ in range(k)], table)
            out = self.runner.forward(batch, attn_backend=decode_backend.backend_for_step(step - 1), graph=graph,
                                      **self._features_input(frontier_hidden.reshape(b * k, -1)))
            step_hidden = out.hidden.view(b, k, -1)  # [B, k, H] the frontier's outputs
            node_logits = out.logits
            if grammar is not None:
                node_logits = self._tree_grammar_masked(node_logits, grammar,
                                                        self._frontier_paths(grammar.rows, frontier, cand_ids, cand_parents))
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
        tree.tokens[:, 1:] = self.model.draft_to_target(tree.tokens[:, 1:])
        return tree


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
