"""Plain decoding: one target forward over every running request's uncomputed tokens, one new token each.

A request just admitted extends its prompt (past its cached prefix; a chunk of it when the scheduler
chunks a long one, and then it samples nothing this step); the others extend their last token. All
ride in the same forward.
"""

import logging

import torch

from eyas.engine.forward_batch import ForwardBatch, wants_exact
from eyas.engine.graphs.exported import PackageMissing
from eyas.engine.phase_clock import PhaseClock, PhaseListener
from eyas.engine.request import Request
from eyas.engine.runner import ModelRunner
from eyas.engine.sampling import Sampler, SamplingBatch
from eyas.engine.shared_prefill import Siblings

log = logging.getLogger("eyas.graphs")


class DecodeWorker:
    def __init__(self, runner: ModelRunner, req_to_token: torch.Tensor, sampler: Sampler, graph=None,
                 exact_logprobs: bool = True):
        self.runner = runner
        self.exact_logprobs = exact_logprobs  # logprobs requests' forwards run `exact` (ForwardBatch.exact)
        self.graph = graph  # the decode GraphRunner (one new token per request); None: eager
        self.req_to_token = req_to_token
        self.sampler = sampler
        self.phase_listeners: list[PhaseListener] = []  # hear each step's phases (a benchmark's timer)

    @torch.inference_mode()  # every tensor of a step is an inference tensor (graph runners see one kind)
    def step(self, requests: list[Request]) -> list[list[int]]:
        """Return the new tokens of each request (here exactly one)."""
        # a prompt's n samples run its forward once (`shared_prefill`)
        siblings = Siblings.of(requests, [not r.output_ids and r.chunk_end is None for r in requests])
        computed = [requests[i] for i in siblings.computed]
        batch = ForwardBatch.from_tails(
            [r.row for r in computed], [r.step_ids for r in computed],
            [r.num_computed for r in computed], self.req_to_token,
        )
        batch.exact = self.exact_logprobs and wants_exact(requests)
        clock = PhaseClock(self.req_to_token.device, sync=False, listeners=self.phase_listeners)
        output = self.runner.forward(batch, graph=self.graph)
        # a forward whose requests all extend by one token is a decode step; one that prefills is not
        clock.lap("decode" if max(batch.extend_lens) == 1 else "prefill")
        if siblings.shared:
            siblings.copy_kv(requests, self.runner.kv_pool, self.req_to_token)
            output = siblings.expand(output, batch.extend_lens)
        done = [i for i, r in enumerate(requests) if r.chunk_end is None]  # the others prefilled a chunk
        for request in requests:
            request.num_computed = request.chunk_end or request.seq_len
        sampled = [requests[i] for i in done]
        for request in sampled:
            request.prefilled = True
        logits = output.logits if len(done) == len(requests) else output.logits[done]
        tokens = self.sampler.next_tokens(logits, sampled, SamplingBatch.of_requests(sampled, logits.device)) \
            if sampled else []
        clock.lap("sample")
        emitted = [[] for _ in requests]
        for i, token in zip(done, tokens):
            emitted[i] = [token]
        return emitted

    def warmup_graphs(self, max_batch_size: int) -> None:
        """Compile every graph plain decoding can run with batches up to `max_batch_size`."""
        if self.graph is not None:
            self._warm(self.graph, max_batch_size)

    def install_graphs(self, graph, max_batch_size: int) -> bool:
        """Between steps: `graph` becomes the decode runner once it has loaded every package it runs
        (`graphs.mode=auto`); False, and eager as before, when one is missing."""
        try:
            self._warm(graph, max_batch_size)
        except PackageMissing as exc:
            log.info("graphs.mode=auto: decoding stays eager: %s", exc)
            return False
        self.graph = graph
        return True

    @staticmethod
    def _warm(graph, max_batch_size: int) -> None:
        for batch_size in sorted({1, min(2, max_batch_size)}):
            graph.warmup(batch_size, 1)

    def cacheable_len(self, request: Request) -> int:
        """Leading positions of the request whose KV is final (the prefix cache may keep them)."""
        return request.num_computed

    def release(self, request: Request) -> None:
        """The request gave its row back: nothing is kept per row."""

    def stats(self) -> dict:
        return {}
