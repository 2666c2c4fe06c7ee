"""DraftHead: a draft model's runner and the loops every drafter with a draft model runs on it.

Draft-extend (the head over verified rows: fills its KV and keeps each request's last output, the
state of its next first proposal) and the chain loop (k autoregressive steps). The EAGLE-2 tree loop
runs on the head from `tree_expansion.py`; both loops mask the head's logits with a request's grammar
through `draft_grammar.py`. EAGLE / EAGLE-3 heads pair each token with the target's feature one
position back; a standalone LM (`StandaloneDraftModel`) reads tokens only and ignores the features.

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
from eyas.engine.speculative.drafters.draft_grammar import mask_chain_step
from eyas.engine.speculative.drafters.draft_state_buffers import DraftStateBuffers
from eyas.engine.speculative.drafters.tree_expansion import expand_tree
from eyas.engine.speculative.tree import DraftTree


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

    def unprojected_features(self, out, keep: torch.Tensor) -> torch.Tensor:
        """What `target_features` computes from, at the rows `keep` of a forward's output `out`, as one
        tensor: an EAGLE-3 head's three target layers ([N, 3H], projected by its `fc`), another head's final
        hidden state. Held work keeps these, so a tier that sits at 0 steps never projects them and a
        catch-up projects them in one GEMM. A `keep` of every row in order (a cycle that drafted nothing)
        takes them without a gather."""
        every_row = keep.shape[0] == out.hidden.shape[0]  # `keep` is increasing: all rows means each in order
        if self.model.kind == "eagle3":
            features = torch.cat(out.aux_hidden, dim=-1)  # a new tensor: no buffer of the forward's is held
            return features if every_row else features[keep]
        return out.hidden.clone() if every_row else out.hidden[keep]

    def project_features(self, unprojected: torch.Tensor) -> torch.Tensor:
        """`target_features` of what `unprojected_features` kept."""
        return self.model.target_features(unprojected, [unprojected] if self.model.kind == "eagle3" else [])

    def features_input(self, hidden: torch.Tensor) -> dict:
        """The previous step's hidden as a draft step's features; a standalone LM reads none."""
        return {} if self.model.kind == "lm" else {"features": hidden}

    def warmup_graph(self, graph, batch_size: int) -> None:
        """Compile `graph`'s draft-step forward (one token per request) for `batch_size` requests."""
        with torch.inference_mode():  # as the steps' features are
            hidden = torch.zeros(batch_size, self.model.config.hidden_size, dtype=self.buffers.hidden.dtype,
                                 device=self.req_to_token.device)
        graph.warmup(batch_size, 1, **self.features_input(hidden))

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

    def sampled_drafts(self, sampling: SamplingBatch, verify: str) -> bool:
        """Whether this batch's sampled requests draw their drafts from the head, for `verify` verification."""
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
        coupled = self.sampled_drafts(sampling, "reproducible")
        drawn = self.sampled_drafts(sampling, "rejection")
        columns = self.model.draft_token_ids() if coupled else None  # target ids of the draft vocabulary
        # a grammar's requests draft what it allows after the drafts before (rolled back when done)
        walks = sampling.grammar.draft_walks() if sampling.grammar is not None else None
        tokens, probs = [], []
        try:
            for step in range(num_steps):
                allowed = None
                if walks:
                    logits, allowed = mask_chain_step(logits, walks, self.model.draft_token_ids())
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
                out = self.runner.forward(batch, attn_backend=backend, graph=graph, **self.features_input(hidden))
                hidden, logits = out.hidden, out.logits
        finally:
            for walk in (walks or {}).values():
                walk.close()
        draft_probs = rejection.DraftProbs(probs) if drawn else None
        return DraftTree.chain(bonus, torch.stack(tokens, dim=1), draft_probs)

    def tree(self, rows: list[int], seq_lens: list[int], sampling: SamplingBatch, bonus: torch.Tensor,
             shape: Candidate, decode_backend: MultiStepDraftBackend | None, graph=None) -> DraftTree:
        """EAGLE-2 dynamic expansion over `shape.num_steps` steps; returns each request's tree of
        `shape.num_draft_tokens` nodes rooted at its pending `bonus` token [B] (`tree_expansion.py`)."""
        return expand_tree(self, rows, seq_lens, sampling, bonus, shape, decode_backend, graph=graph)
