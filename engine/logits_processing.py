"""Logit bias and repetition, frequency and presence penalties: the target's logits at a position
processed exactly as plain decoding processes them there, for every node a verify scores.

Plain decoding scores one position per request, after the request's output so far. A verify scores
every node of a draft tree; the output before the position a node's logits predict is the committed
output (its last token the tree's root) followed by the drafts on the node's path: its ancestors after
the root, and the node itself. So the penalties there count those drafts too, and the choice at each
accepted node, and its log-probabilities, equal plain decoding's at that position.
"""

from dataclasses import dataclass

import torch

from eyas.engine.sampling_params import SamplingParams


@dataclass
class LogitsProcessing:
    """The requests of a batch of `size` that set a logit bias or a penalty: their batch `rows`,
    params, prompt ids and output ids so far (host lists, made into tensors when applied)."""

    size: int
    rows: list[int]
    params: list[SamplingParams]
    prompts: list[list[int]]
    outputs: list[list[int]]

    @classmethod
    def of_requests(cls, requests) -> "LogitsProcessing | None":
        rows = [i for i, r in enumerate(requests) if r.params.processes_logits]
        if not rows:
            return None
        chosen = [requests[i] for i in rows]
        return cls(len(requests), rows, [r.params for r in chosen], [r.prompt_ids for r in chosen],
                   [r.output_ids for r in chosen])

    def apply(self, logits: torch.Tensor, tokens: torch.Tensor | None = None,
              ancestors: torch.Tensor | None = None) -> torch.Tensor:
        """logits: [B * n, V] request-major (n nodes per request, node 0 scoring the position after the
        output so far); tokens: [B, n] the nodes' tokens (column 0 the root, -1 unfilled) when n > 1;
        ancestors: [B, n, n] (entry [b, j, i]: node i is node j or its ancestor), None for a chain.
        Returns processed logits (a new tensor; rows of other requests unchanged)."""
        n, vocab = logits.shape[0] // self.size, logits.shape[-1]
        device = logits.device
        rows = torch.tensor(self.rows, dtype=torch.int64, device=device)
        chosen = logits.view(self.size, n, vocab)[rows].float()  # [P, n, V]
        if any(p.logit_bias for p in self.params):
            chosen += self._bias(vocab, device)[:, None]
        if any(p.penalized for p in self.params):
            counts = self._counts(vocab, device, n, None if tokens is None else tokens[rows],
                                  None if ancestors is None else ancestors[rows])
            chosen = self._penalize(chosen, counts, vocab, device)
        out = logits.clone()
        out.view(self.size, n, vocab)[rows] = chosen.to(logits.dtype)
        return out

    def _bias(self, vocab: int, device) -> torch.Tensor:
        bias = torch.zeros(len(self.rows), vocab, device=device)
        for i, p in enumerate(self.params):
            if p.logit_bias:
                ids = torch.tensor(list(p.logit_bias), dtype=torch.int64, device=device)
                bias[i, ids] = torch.tensor(list(p.logit_bias.values()), dtype=torch.float32, device=device)
        return bias

    def _counts(self, vocab: int, device, n: int, tokens: torch.Tensor | None,
                ancestors: torch.Tensor | None) -> torch.Tensor:
        """[P, n, V] each token's count in the output before the position each node's logits score."""
        counts = torch.zeros(len(self.rows), vocab, device=device)
        which = [i for i, out in enumerate(self.outputs) for _ in out]
        if which:
            ids = torch.tensor([t for out in self.outputs for t in out], dtype=torch.int64, device=device)
            counts.index_put_((torch.tensor(which, device=device), ids), torch.ones(len(which), device=device),
                              accumulate=True)
        if n == 1 or tokens is None:
            return counts[:, None].expand(-1, n, -1)
        tokens = tokens.to(device)
        drafted = (tokens >= 0) & (torch.arange(n, device=device) > 0)  # the root is already in the output
        onehot = torch.zeros(*tokens.shape, vocab, device=device).scatter_(2, tokens.clamp(min=0)[..., None],
                                                                           drafted[..., None].float())
        if ancestors is None:  # a chain: node j's path is nodes 0..j
            path = torch.ones(n, n, device=device).tril().expand(tokens.shape[0], n, n)
        else:
            path = ancestors.to(device).float()
        return counts[:, None] + path @ onehot

    def _penalize(self, logits: torch.Tensor, counts: torch.Tensor, vocab: int, device) -> torch.Tensor:
        def column(name):
            return torch.tensor([getattr(p, name) for p in self.params], device=device)[:, None, None]

        repetition = column("repetition_penalty")
        if bool((repetition != 1).any()):  # over the prompt and the output so far
            seen = torch.zeros(len(self.rows), vocab, dtype=torch.bool, device=device)
            for i, (p, prompt) in enumerate(zip(self.params, self.prompts)):
                if p.repetition_penalty != 1:
                    seen[i, torch.tensor(prompt, dtype=torch.int64, device=device)] = True
            seen = seen[:, None] | (counts > 0)
            scaled = torch.where(logits > 0, logits / repetition, logits * repetition)
            logits = torch.where(seen, scaled, logits)
        return logits - column("frequency_penalty") * counts - column("presence_penalty") * (counts > 0)
