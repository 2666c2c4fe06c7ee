"""EagleDraftWorker: the draft head's runner, its attention backends, the draft loop and draft-extend."""

import torch

from engine.forward_batch import ForwardBatch
from engine.runner import ModelRunner
from engine.sampling import Sampler, SamplingBatch
from engine.speculative.chain_buffers import ChainBuffers


class EagleDraftWorker:
    """Its step count and backends (`num_steps`, `draft_decode_backend`, `draft_extend_backend`, and
    `draft_runner.attn_backend`) are bound from a `SpecRuntimeState` by `bindings.bind_runtime_state`."""

    def __init__(self, draft_runner: ModelRunner, req_to_token: torch.Tensor, buffers: ChainBuffers,
                 sampler: Sampler, draft_sampling: str):
        self.draft_runner = draft_runner
        self.sampler = sampler
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
