"""Plain decoding: one target forward over every running request's uncomputed tokens, one new token each.

A request just admitted extends its whole prompt; the others extend their last token. Both ride in
the same forward.
"""

import torch

from engine.forward_batch import ForwardBatch
from engine.request import Request
from engine.runner import ModelRunner
from engine.sampling import Sampler, SamplingBatch


class DecodeWorker:
    def __init__(self, runner: ModelRunner, req_to_token: torch.Tensor, sampler: Sampler):
        self.runner = runner
        self.req_to_token = req_to_token
        self.sampler = sampler

    def step(self, requests: list[Request]) -> list[list[int]]:
        """Return the new tokens of each request (here exactly one)."""
        batch = ForwardBatch.from_tails(
            [r.row for r in requests], [r.uncomputed_ids for r in requests],
            [r.num_computed for r in requests], self.req_to_token,
        )
        output = self.runner.forward(batch)
        for request in requests:
            request.num_computed = request.seq_len
        sampling = SamplingBatch.of_requests(requests, output.logits.device)
        return self.sampler.sample(output.logits, sampling).tolist()

    def stats(self) -> dict:
        return {}
