"""EagleDraftWorker: the EAGLE / EAGLE-3 drafter. The draft head's runner, its attention backends,
the draft loop (chain and EAGLE-2 tree) and draft-extend, behind the drafter interface the
speculative worker drives (see `engine/speculative/worker.py`)."""

import torch

from engine.forward_batch import ForwardBatch
from engine.request import Request
from engine.runner import ForwardOutput, ModelRunner
from engine.sampling import Sampler, SamplingBatch
from engine.speculative.chain_buffers import ChainBuffers
from engine.speculative.deferred_extend import DeferredExtend
from engine.speculative.tree import DraftTree, select_tree


class EagleDraftWorker:
    """Its step count and backends (`num_steps`, `draft_decode_backend`, `draft_extend_backend`, and
    `draft_runner.attn_backend`) are bound from a `SpecRuntimeState` by `bindings.bind_runtime_state`."""


    def __init__(self, draft_runner: ModelRunner, req_to_token: torch.Tensor, buffers: ChainBuffers,
                 sampler: Sampler, draft_sampling: str, tree_score_temperature: float = 1.0):
        self.draft_runner = draft_runner
        self.sampler = sampler
        self.req_to_token = req_to_token
        self.buffers = buffers
        self.draft_sampling = draft_sampling  # "greedy" | "sample"
        self.deferred = DeferredExtend()
        # trees rank nodes by cumulative log-softmax(logits / this): below 1 sharpens an under-confident head
        self.tree_score_temperature = tree_score_temperature
        self.num_steps = 0
        self.draft_decode_backend = None
        self.draft_extend_backend = None

    # --- the drafter interface ---

    def start(self, requests: list[Request], out: ForwardOutput, first: list[int]) -> None:
        """After the target's prefill of `requests` (out: its forward, first: each one's first token):
        draft-extend over each prompt shifted by one, so the head can propose the token after `first`."""
        rows = [r.row for r in requests]
        features = self.target_features(out.hidden, out.aux_hidden)
        shifted = [r.all_ids[1:] + [t] for r, t in zip(requests, first)]
        self.deferred.drop(rows)
        self.forward_draft_extend(rows, [0] * len(requests), shifted, features)

    def propose(self, requests: list[Request], sampling: SamplingBatch) -> torch.Tensor:
        """A chain of `num_steps` drafts per request: [B, k] target ids."""
        rows, seq_lens = [r.row for r in requests], [r.num_computed for r in requests]
        if self.num_steps == 0:
            return torch.zeros(len(rows), 0, dtype=torch.int64)
        self.catch_up(rows)
        return self.draft(rows, seq_lens, sampling)

    def propose_tree(self, requests: list[Request], sampling: SamplingBatch, bonus: torch.Tensor, topk: int,
                     num_nodes: int) -> DraftTree:
        rows = [r.row for r in requests]
        self.catch_up(rows)
        return self.draft_tree(rows, [r.num_computed for r in requests], sampling, bonus, topk, num_nodes)

    def prepare(self, requests: list[Request]) -> None:
        """Before a cycle in which the head drafts: catch up on the work held while it sat out, so the
        worker times that apart (a cost of switching back, not of the cycle's step count)."""
        rows = [r.row for r in requests]
        if self.head_drafts_now() and self.deferred.sat_out(rows):
            self.catch_up(rows)

    def head_drafts_now(self) -> bool:
        """Whether the bound runtime state drafts with the head (at least on some cycles)."""
        return self.num_steps > 0

    def catch_up(self, rows: list[int]) -> None:
        """Back from cycles the head sat out (0 steps, or another drafter drafting): one draft-extend over
        the work held for these rows brings the draft KV up to date before the head drafts."""
        held = self.deferred.take(rows)
        if held is not None:
            self.forward_draft_extend(*held)

    def after_verify(self, requests: list[Request], prefix_lens: list[int], emitted: list[list[int]],
                     out: ForwardOutput, keep: torch.Tensor) -> None:
        """Draft-extend over the verified rows: request i's emitted tokens from position prefix_lens[i],
        each with the target feature of the verify row it was chosen at (`keep`: those rows of `out`,
        packed). At 0 steps the work is held until drafting resumes (`catch_up`)."""
        features = self.target_features(out.hidden[keep], [a[keep] for a in out.aux_hidden])
        rows = [r.row for r in requests]
        if self.num_steps > 0:
            self.forward_draft_extend(rows, prefix_lens, emitted, features)
        else:
            self.deferred.hold(rows, prefix_lens, emitted, features)

    # --- the head ---

    @property
    def model(self):
        return self.draft_runner.model

    def target_features(self, hidden: torch.Tensor, aux: list[torch.Tensor]) -> torch.Tensor:
        return self.model.target_features(hidden, aux)

    def forward_draft_extend(self, rows: list[int], prefix_lens: list[int], tokens: list[list[int]],
                             features: torch.Tensor) -> None:
        """Run the head over verified rows: request i's row p + j pairs token tokens[i][j] with the
        target feature of position p + j (p = prefix_lens[i]). Fills the draft KV of those rows and
        keeps each request's last output for its next first proposal. Runs on `draft_runner.attn_backend`."""
        batch = ForwardBatch.from_tails(rows, tokens, prefix_lens, self.req_to_token)
        out = self.draft_runner.forward(batch, features=features)
        self.buffers.store(batch.req_rows, out.hidden[batch.last_token_indices], out.logits)  # logits: [B, Vd]

    def draft(self, rows: list[int], seq_lens: list[int], sampling: SamplingBatch) -> torch.Tensor:
        """Propose `num_steps` tokens per request after its committed `seq_lens` tokens: drafts [B, k]
        (target ids). Greedy drafting takes the head's argmax; `draft_sampling: sample` lets sampled
        requests draw from the head's filtered distribution with the noise the target's verification
        uses at the same output position (coupled draws: a draft head close to the target proposes
        the target's own sample)."""
        row_t = torch.tensor(rows, dtype=torch.int64, device=self.req_to_token.device)
        hidden, logits = self.buffers.load(row_t)  # [B, H], [B, Vd]
        coupled = self.draft_sampling == "sample" and not sampling.all_greedy
        columns = self.model.draft_token_ids() if coupled else None  # target ids of the draft vocabulary
        tokens = []
        for step in range(self.num_steps):
            if coupled:
                token = self.model.draft_to_target(self.sampler.sample(logits, sampling, offset=step,
                                                                       token_ids=columns)[:, 0])
            else:
                token = self.model.draft_to_target(logits.argmax(dim=-1))
            tokens.append(token)
            if step == self.num_steps - 1:
                break
            # draft row L + step pairs the proposal of this step with the previous step's hidden
            batch = ForwardBatch.from_tails(rows, token[:, None], [n + step for n in seq_lens], self.req_to_token)
            backend = self.draft_decode_backend.backend_for_step(step)
            out = self.draft_runner.forward(batch, attn_backend=backend, features=hidden)
            hidden, logits = out.hidden, out.logits
        return torch.stack(tokens, dim=1)

    def draft_tree(self, rows: list[int], seq_lens: list[int], sampling: SamplingBatch, bonus: torch.Tensor,
                   topk: int, num_nodes: int) -> DraftTree:
        """EAGLE-2 dynamic expansion over `num_steps` steps; returns each request's tree of `num_nodes`
        nodes rooted at its pending `bonus` token [B].

        Step 1 takes the root's `topk` best children; each later step runs the head over the frontier
        (the `topk` best nodes of the previous step, by cumulative draft log-probability) and proposes
        `topk` children for each. Every proposed node is a candidate; the tree keeps the root and the
        best `num_nodes - 1` candidates. Scores are log-probabilities of the head's logits divided by
        `tree_score_temperature` (1: EAGLE-2's own). Children are the head's `topk` best tokens, or, for sampled
        requests with `draft_sampling: sample`, its first `topk` in the race the verification's noise
        runs at that depth (the first of them is the chain's coupled draw).

        Each later step's forward runs the frontier alone, one query per node: node j of step s is written
        at column L + (s - 1) * topk + j (L = seq_lens), sits at position L + s - 1 and reads the committed
        prefix, its ancestors' columns and its own, through a table of one row per node (`_path_table`)."""
        device = self.req_to_token.device
        row_t = torch.tensor(rows, dtype=torch.int64, device=device)
        hidden, logits = self.buffers.load(row_t)  # the root's: [B, H], [B, Vd]
        b, k = len(rows), topk
        coupled = self.draft_sampling == "sample" and not sampling.all_greedy
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
        num_candidates = k + (self.num_steps - 1) * k * k
        cand_ids = torch.empty(b, num_candidates, dtype=torch.int64, device=device)  # draft ids
        cand_scores = torch.empty(b, num_candidates, dtype=torch.float32, device=device)
        cand_parents = torch.full((b, num_candidates), -1, dtype=torch.int64, device=device)
        cand_depths = torch.ones(b, num_candidates, dtype=torch.int64, device=device)
        ids, logp = children(logits, 0)  # the root's children: depth 1
        cand_ids[:, :k], cand_scores[:, :k] = ids.view(b, k), logp.view(b, k)
        frontier = torch.arange(k, device=device).expand(b, k)  # candidate index of each frontier node
        frontier_hidden = hidden[:, None, :].expand(b, k, hidden.shape[-1])  # each one's parent's hidden
        ancestor_slots = torch.empty(b, k, 0, dtype=torch.int64, device=device)  # [B, k, s - 1] KV slots of each one's ancestors
        row_prefix = self.req_to_token[row_t, : max(seq_lens)].repeat_interleave(k, dim=0)  # [B * k, max L]
        node_rows = list(range(b * k))
        filled = k
        for step in range(1, self.num_steps):
            own = self.req_to_token[row_t[:, None], prefix[:, None] + (step - 1) * k + torch.arange(k, device=device)]
            path_slots = torch.cat([ancestor_slots, own[:, :, None]], dim=2)  # [B, k, s]
            table = _path_table(row_prefix, prefix.repeat_interleave(k), path_slots.view(b * k, step))
            batch = ForwardBatch.from_tails(node_rows, self.model.draft_to_target(cand_ids.gather(1, frontier)).view(b * k, 1),
                                            [n + step - 1 for n in seq_lens for _ in range(k)], table)
            out = self.draft_runner.forward(batch, attn_backend=self.draft_decode_backend.backend_for_step(step - 1),
                                            features=frontier_hidden.reshape(b * k, -1))
            step_hidden = out.hidden.view(b, k, -1)  # [B, k, H] the frontier's outputs
            ids, logp = children(out.logits, step)  # [B, k, k]
            scores = (cand_scores.gather(1, frontier)[:, :, None] + logp).view(b, k * k)
            new = slice(filled, filled + k * k)
            cand_ids[:, new], cand_scores[:, new] = ids.view(b, k * k), scores
            cand_parents[:, new] = frontier.repeat_interleave(k, dim=1)
            cand_depths[:, new] = step + 1
            if step == self.num_steps - 1:
                break
            best = scores.topk(k, dim=1).indices  # [B, k] of the k*k new candidates
            parent = (best // k)[:, :, None]  # [B, k, 1] the frontier node each one extends
            frontier = filled + best
            frontier_hidden = step_hidden.gather(1, parent.expand(b, k, step_hidden.shape[-1]))
            ancestor_slots = path_slots.gather(1, parent.expand(b, k, step))
            filled += k * k
        tree = select_tree(bonus, cand_ids, cand_parents, cand_scores, cand_depths, num_nodes)
        tree.tokens[:, 1:] = self.model.draft_to_target(tree.tokens[:, 1:])
        return tree


def _path_table(row_prefix: torch.Tensor, prefix_lens: torch.Tensor, path_slots: torch.Tensor) -> torch.Tensor:
    """A request-to-token table with one row per tree node: its request's committed slots (row_prefix
    [M, max L], the first prefix_lens [M] of them), then the slots of its path from depth 1 down to itself
    (path_slots [M, s]). Node m's KV reads are row m's first prefix_lens[m] + s entries."""
    m, s = path_slots.shape
    table = torch.cat([row_prefix, path_slots.new_zeros(m, s)], dim=1)
    table.scatter_(1, prefix_lens[:, None] + torch.arange(s, device=table.device), path_slots)
    return table
