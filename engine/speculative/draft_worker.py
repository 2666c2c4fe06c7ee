"""EagleDraftWorker: the draft head's runner, its attention backends, the draft loop and draft-extend."""

import torch

from engine.forward_batch import ForwardBatch
from engine.runner import ModelRunner
from engine.sampling import filtered_probs, params_tensors
from engine.sampling_params import SamplingParams
from engine.speculative.chain_buffers import ChainBuffers


class EagleDraftWorker:
    """Its step count and backends (`num_steps`, `draft_decode_backend`, `draft_extend_backend`, and
    `draft_runner.attn_backend`) are bound from a `SpecRuntimeState` by `bindings.bind_runtime_state`."""

    def __init__(self, draft_runner: ModelRunner, req_to_token: torch.Tensor, buffers: ChainBuffers,
                 draft_sampling: str):
        self.draft_runner = draft_runner
        self.req_to_token = req_to_token
        self.buffers = buffers
        self.draft_sampling = draft_sampling  # "greedy" | "sample"
        self.num_steps = 0
        self.draft_decode_backend = None
        self.draft_extend_backend = None

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

    def draft(self, rows: list[int], seq_lens: list[int], params: list[SamplingParams],
              generators: list) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Propose `num_steps` tokens per request after its committed `seq_lens` tokens.
        Returns drafts [B, k] (target ids) and, when drafts are sampled, their distributions q [B, k, V]
        over the target vocabulary."""
        row_t = torch.tensor(rows, dtype=torch.int64, device=self.req_to_token.device)
        hidden, logits = self.buffers.load(row_t)  # [B, H], [B, Vd]
        sample = self.draft_sampling == "sample" and any(not p.greedy for p in params)
        tokens, probs = [], []
        for step in range(self.num_steps):
            token, q = self._select(logits, params, generators) if sample else (self._greedy(logits), None)
            tokens.append(token)
            probs.append(q)
            if step == self.num_steps - 1:
                break
            # draft row L + step pairs the proposal of this step with the previous step's hidden
            batch = ForwardBatch.from_tails(rows, token[:, None], [n + step for n in seq_lens], self.req_to_token)
            backend = self.draft_decode_backend.backend_for_step(step)
            out = self.draft_runner.forward(batch, attn_backend=backend, features=hidden)
            hidden, logits = out.hidden, out.logits
        drafts = torch.stack(tokens, dim=1)
        return drafts, (torch.stack(probs, dim=1) if sample else None)

    def _greedy(self, logits: torch.Tensor) -> torch.Tensor:
        # [B, Vd] draft-vocab logits -> [B] target ids of their argmax
        return self.model.draft_to_target(logits.argmax(dim=-1))

    def _select(self, logits: torch.Tensor, params: list[SamplingParams], generators: list):
        """Sampled drafts: [B] target ids and q [B, V] over the target vocabulary; requests at
        temperature 0 keep the argmax with a point-mass q."""
        draft_probs = filtered_probs(logits, *params_tensors(params, logits.device))  # [B, Vd]
        draft_ids = logits.argmax(dim=-1)
        for i, p in enumerate(params):
            if p.greedy:
                draft_probs[i] = torch.nn.functional.one_hot(draft_ids[i], logits.shape[-1]).float()
            else:
                draft_ids[i] = torch.multinomial(draft_probs[i], 1, generator=generators[i])[0]
        probs = draft_probs.new_zeros(logits.shape[0], self.model.config.vocab_size)
        probs[:, self.model.draft_token_ids()] = draft_probs
        return self.model.draft_to_target(draft_ids), probs
